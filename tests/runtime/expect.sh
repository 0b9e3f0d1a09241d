#!/bin/sh
# expect.sh CODE REGEX CMD...: runs CMD and passes only when it exits with
# CODE and its output (stdout + stderr) matches the extended regex REGEX.
code=$1
regex=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$code" ]; then
  echo "expect.sh: exit status $rc, expected $code" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$regex"; then
  echo "expect.sh: output does not match /$regex/" >&2
  exit 1
fi
exit 0
