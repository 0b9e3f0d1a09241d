#!/bin/sh
# memory_report.sh YAML CMD...: runs CMD (mfsdp-replay or mfsdp-mlp on the
# schedule YAML) and passes only when it exits 0 and reports, on its
# "memory: allocated A bytes per rank (one arena), the schedule's peak P
# bytes" line, A = P = the summary's allocated_bytes read from the file.
yaml=$1
shift
want=$(sed -n 's/^  allocated_bytes: \([0-9][0-9]*\)$/\1/p' "$yaml")
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
  echo "memory_report.sh: exit status $rc" >&2
  exit 1
fi
got=$(printf '%s\n' "$out" |
      sed -n "s/^memory: allocated \([0-9][0-9]*\) bytes per rank (one arena), the schedule's peak \([0-9][0-9]*\) bytes$/\1 \2/p")
if [ -z "$want" ] || [ "$got" != "$want $want" ]; then
  echo "memory_report.sh: summary allocated_bytes '$want', the run reported '$got'" >&2
  exit 1
fi
exit 0
