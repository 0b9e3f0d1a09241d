#!/usr/bin/env bash
# A NUL byte is refused the same way by every mfsdpc command that reads a
# spec (issue 25, D2; grammar/mf_lexer.l): in a comment, inside a "name" and
# between tokens, check, compile, explain, simulate and plan all exit 1 with
# the same located error; the same specs without the NUL pass every command.
#
#   cli_nul.sh MFSDPC SPEC AUTO_SPEC WORKDIR
# SPEC: a spec every command accepts; AUTO_SPEC: one with `layout auto` units
# that plan accepts with --memory 4MiB. Both start with a comment line.
set -u
mfsdpc=$1 spec=$2 auto=$3 work=$4
. "$(dirname "$0")/cli_lib.sh"
cli_begin "$work"

# nul_at WHERE IN OUT: writes IN with one NUL byte put WHERE (comment: after
# the first '#'; token: right after the first ';'); prints its line:col
nul_at() {
  python3 - "$@" <<'PY'
import sys
where, src, dst = sys.argv[1:4]
s = open(src, 'rb').read()
i = s.index(b'#' if where == 'comment' else b';') + 1
open(dst, 'wb').write(s[:i] + b'\0' + s[i:])
line = s[:i].count(b'\n') + 1
col = i - (s.rfind(b'\n', 0, i) + 1) + 1
print('%d:%d' % (line, col))
PY
}

run_all() {  # run_all FILE AUTO_FILE WANT_RC PATTERN [AUTO_PATTERN]
  local f=$1 a=$2 want=$3 c pat
  for c in "check $f" "compile $f -o out.yaml" "explain $f" "simulate $f" "plan $a --memory 4MiB"; do
    pat=$4; [ "${c%% *}" = plan ] && pat=${5:-$4}
    # shellcheck disable=SC2086
    expect "$want" "$pat" "$mfsdpc" $c
  done
}

cp "$spec" clean.mfsdp; cp "$auto" clean_auto.mfsdp
run_all clean.mfsdp clean_auto.mfsdp 0 ""
for where in comment token; do
  at=$(nul_at "$where" "$spec" "$where.mfsdp")
  at_auto=$(nul_at "$where" "$auto" "${where}_auto.mfsdp")
  run_all "$where.mfsdp" "${where}_auto.mfsdp" 1 ":$at: error: stray '\\\\x00' in" \
    ":$at_auto: error: stray '\\\\x00' in"
done
# inside a name: the lexer's string rule
printf 'unit "a\0b" layout zero3 {}\n' >name.mfsdp; cat "$spec" >>name.mfsdp
printf 'unit "a\0b" layout zero3 {}\n' >name_auto.mfsdp; cat "$auto" >>name_auto.mfsdp
run_all name.mfsdp name_auto.mfsdp 1 ":1:8: error: control character \\\\x00 in a string"

cli_end
