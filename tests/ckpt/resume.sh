#!/usr/bin/env bash
# resume.sh BACKEND TRAINER SCHEDULE...: for each schedule, training 2N steps
# straight must equal training N, saving, and resuming in a fresh process for
# N more, bit for bit (master weights and both Adam moments).
backend=$1 TRAINER=$2
shift 2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
n=0
for sched in "$@"; do
  name=$(basename "$sched" .yaml)
  run_trainer "$backend" "$sched" --steps 4 --dump "$WORK/$name.straight" || fail "$name: straight run"
  run_trainer "$backend" "$sched" --steps 2 --save "$WORK/$name.ckpt" || fail "$name: save"
  run_trainer "$backend" "$sched" --steps 2 --load "$WORK/$name.ckpt" --dump "$WORK/$name.resumed" ||
    fail "$name: resume"
  cmp "$WORK/$name.straight" "$WORK/$name.resumed" || fail "$name: resumed run differs from the straight run"
  [ "$(stat -c %s "$WORK/$name.straight")" -gt 0 ] || fail "$name: empty dump"
  echo "ok: $name ($backend): 2+2 steps with a checkpoint == 4 steps, bit for bit"
  n=$((n + 1))
done
echo "$n passed, 0 failed"
