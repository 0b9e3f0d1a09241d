#!/usr/bin/env bash
# crash.sh BACKEND TRAINER CKPT SCHEDULE TRIALS [SEED]: SIGKILL during a save.
# A committed checkpoint P exists; each trial resumes from P, trains a step and
# saves NEW while one rank (random) kills its own process at a random moment
# in [0, span] after the save starts; span starts at 1.2 x a measured save
# time and shrinks by a fifth after each kill that came too late (the save
# had committed), since a loaded machine makes saves slower or faster. After every trial: P still verifies
# and loads; NEW either does not exist (then every load of NEW or of its
# temporary directory is refused, with a clear message) or is complete and
# verifies. At least a fifth of the trials must have landed inside a save
# (a temporary directory left behind), or the test proves nothing.
backend=$1 TRAINER=$2 CKPT=$3 sched=$4 trials=$5 seed=${6:-7}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
world=$(world_of "$sched")
run_trainer "$backend" "$sched" --steps 1 --save "$WORK/P" >/dev/null || fail "first save"
t=$(run_trainer "$backend" "$sched" --load "$WORK/P" --steps 1 --save "$WORK/probe" | sed -n 's/^save_us=//p')
[ -n "$t" ] || fail "no save time"
rm -rf "$WORK/probe"
span=$((t * 12 / 10 + 1))
torn=0 done=0 before=0
RANDOM=$seed
for i in $(seq 1 "$trials"); do
  us=$(((RANDOM * 32768 + RANDOM) % span))
  rank=$((RANDOM % world))
  run_trainer "$backend" "$sched" --load "$WORK/P" --steps 1 --save "$WORK/NEW" --kill-after-us "$us" \
    --kill-rank "$rank" >/dev/null 2>&1
  "$CKPT" verify "$WORK/P" >/dev/null || fail "trial $i: the previous checkpoint no longer verifies"
  if [ -d "$WORK/NEW" ]; then
    "$CKPT" verify "$WORK/NEW" >/dev/null || fail "trial $i: a committed checkpoint does not verify"
    done=$((done + 1))
    span=$((span * 4 / 5 + 50))
  else
    tmp=$(ls -d "$WORK"/NEW.tmp-* 2>/dev/null | head -1)
    if [ -n "$tmp" ]; then
      torn=$((torn + 1))
      out=$("$CKPT" verify "$tmp" 2>&1) && fail "trial $i: a torn checkpoint verified"
      echo "$out" | grep -q "not a committed checkpoint" || fail "trial $i: unclear message: $out"
    else
      before=$((before + 1))
    fi
    out=$("$CKPT" verify "$WORK/NEW" 2>&1) && fail "trial $i: verify of a missing checkpoint passed"
    echo "$out" | grep -q "no such checkpoint directory" || fail "trial $i: unclear message: $out"
  fi
  rm -rf "$WORK"/NEW "$WORK"/NEW.tmp-*
done
run_trainer "$backend" "$sched" --load "$WORK/P" --steps 0 >/dev/null || fail "the previous checkpoint does not load"
echo "trials: $trials ($backend, save ~${t} us): killed inside the save $torn, before it $before, after the commit $done"
[ $((torn * 5)) -ge "$trials" ] || fail "only $torn of $trials kills landed inside a save"
echo "$trials passed, 0 failed"
