#!/usr/bin/env bash
# xfsz.sh TRAINER CKPT SCHEDDIR: a file-size limit (ulimit -f) while the C
# tools write (issue 39). mfsdp-ckpt reshard and export, and ckpt-trainer's
# save through the library, used to die of SIGXFSZ and leave OUT.tmp-*
# behind; now each fails with exit status 1 and a message saying "file too
# large" and naming the file, and leaves no temporary and no output. Without
# the limit the same commands succeed (so the limit is what failed them).
TRAINER=$1 CKPT=$2 S=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
run_trainer local "$S/hfsdp_2x4.yaml" --steps 1 --save "$WORK/a" >/dev/null || fail "training"
# no_residue DIR NAME: nothing named NAME or NAME.tmp* or .NAME.tmp* left in DIR
no_residue() {
  local left
  left=$(ls -A "$1" | grep -E "^\.?$2(\.tmp|$)" || true)
  [ -z "$left" ] || fail "left behind in $1: $left"
}
# limited WHAT CMD...: CMD under a 4 KiB file-size limit (every file here is
# bigger but the manifest) must fail cleanly
limited() {
  local what=$1 rc
  shift
  (ulimit -f 4; exec "$@") >"$WORK/out" 2>&1
  rc=$?
  [ "$rc" = 1 ] || fail "$what under ulimit -f: exit status $rc (want 1): $(head -c 600 "$WORK/out")"
  grep -qi "file too large" "$WORK/out" || fail "$what: no 'file too large' in: $(head -c 600 "$WORK/out")"
  echo "ok: $what: $(grep -i 'file too large' "$WORK/out" | head -1 | head -c 300)"
}
limited "mfsdp-ckpt reshard" "$CKPT" reshard "$WORK/a" "$S/zero3_1x8.yaml" "$WORK/out1"
no_residue "$WORK" out1
limited "mfsdp-ckpt export" "$CKPT" export "$WORK/a" "$WORK/hf1"
no_residue "$WORK" hf1
limited "ckpt-trainer --save" "$TRAINER" --schedule "$S/hfsdp_2x4.yaml" --load "$WORK/a" --save "$WORK/b"
no_residue "$WORK" b
# the same without the limit succeed
"$CKPT" reshard "$WORK/a" "$S/zero3_1x8.yaml" "$WORK/out1" >/dev/null || fail "reshard without the limit"
"$CKPT" export "$WORK/a" "$WORK/hf1" >/dev/null || fail "export without the limit"
echo "ok: without the limit both succeed"
echo "4 passed, 0 failed"
