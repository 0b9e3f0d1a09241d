#!/bin/bash
# mfsdp-ckpt import/export options (runtime/tools/mfsdp_ckpt_hf.c): every
# bad option is a usage error (exit 2) with the message written here, and
# nothing is created; the accepted spellings parse.
#
#     hf_options.sh MFSDP_CKPT
set -u
CKPT=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# usage_error WANT_FIRST_LINE ARGS...: exit 2, stderr's first line WANT
# (empty: no message before the usage text), no output directory.
usage_error() {
  local want=$1; shift
  local err
  err=$("$CKPT" "$@" 2>&1 >/dev/null)
  local rc=$?
  [ $rc -eq 2 ] || fail "$*: exit $rc, want 2"
  local first=${err%%$'\n'*}
  if [ -n "$want" ]; then
    [ "$first" = "$want" ] || fail "$*: '$first', want '$want'"
  else
    [ "$first" = "usage: mfsdp-ckpt COMMAND ARGS" ] || fail "$*: '$first', want the usage text alone"
  fi
  [ ! -e "$WORK/out" ] || fail "$*: left $WORK/out"
}

E="mfsdp-ckpt: error: bad option"
D="$WORK/no-checkpoint"
usage_error "$E --dtype fp8" export "$D" "$WORK/out" --dtype fp8
usage_error "$E --max-file-bytes 0" export "$D" "$WORK/out" --max-file-bytes 0
usage_error "$E --map no-equals" export "$D" "$WORK/out" --map no-equals
usage_error "$E --tie =SOURCE" export "$D" "$WORK/out" --tie =SOURCE
usage_error "$E --tie NAME=" export "$D" "$WORK/out" --map a=b --tie NAME=
usage_error "$E --frobnicate 1" export "$D" "$WORK/out" --frobnicate 1
usage_error "$E -x 1" export "$D" "$WORK/out" -x 1
usage_error "$E extra words" export "$D" "$WORK/out" extra words
usage_error "$E -- x" export "$D" "$WORK/out" -- x
usage_error "$E --dtype bf16" import "$WORK/hf" "$WORK/s.yaml" "$WORK/out" --dtype bf16
usage_error "$E --max-file-bytes 9" import "$WORK/hf" "$WORK/s.yaml" "$WORK/out" --max-file-bytes 9
usage_error "" export "$D" "$WORK/out" --dtype
usage_error "" export "$D" "$WORK/out" --map a=b --tie
usage_error "" export "$D" "$WORK/out" extra
usage_error "" export "$D" "$WORK/out" --
usage_error "" import "$WORK/hf" "$WORK/s.yaml"

# Accepted options reach the command: here it refuses the missing input
# (exit 1), past the option parser.
err=$("$CKPT" export "$D" "$WORK/out" --dtype bf16 --map model.= --tie a=b --max-file-bytes 5000 2>&1)
[ $? -eq 1 ] || fail "good export options: not past the parser: $err"
err=$("$CKPT" import "$WORK/hf" "$WORK/s.yaml" "$WORK/out" --map model.= --tie a=b 2>&1)
[ $? -eq 1 ] || fail "good import options: not past the parser: $err"
echo "ok: import/export options: bad ones refused with their message (exit 2), good ones parsed"
