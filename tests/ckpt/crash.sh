#!/usr/bin/env bash
# crash.sh BACKEND TRAINER CKPT SCHEDULE TRIALS [SEED]: SIGKILL during a save.
# A committed checkpoint P exists; each trial resumes from P, trains a step and
# saves NEW while one rank (random) kills its own process at a random moment
# in [0, span] after the save starts. A save's duration varies several-fold on
# a loaded machine, so span follows the outcomes: it starts at 1.2 x the
# fastest of three measured saves, shrinks to 3/5 after a kill that came too
# late (the save had committed), grows by a tenth after one inside the save
# and by half after one before the save wrote anything. It settles where
# about one kill in six comes too late (the save fills 1/1.2 of span), so the
# kills cover the whole save. After every trial: P still verifies and loads;
# NEW either does not exist (then every load of NEW or of its temporary
# directory is refused, with a clear message) or is complete and verifies.
# At least a fifth of TRIALS kills must land inside a save (a temporary
# directory left behind), or the test proves nothing: after TRIALS trials it
# runs more, up to 3 x TRIALS, until that many have, and fails if they still
# have not.
backend=$1 TRAINER=$2 CKPT=$3 sched=$4 trials=$5 seed=${6:-7}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
world=$(world_of "$sched")
run_trainer "$backend" "$sched" --steps 1 --save "$WORK/P" >/dev/null || fail "first save"
t=
for probe in 1 2 3; do
  u=$(run_trainer "$backend" "$sched" --load "$WORK/P" --steps 1 --save "$WORK/probe" | sed -n 's/^save_us=//p')
  [ -n "$u" ] || fail "no save time"
  rm -rf "$WORK/probe"
  if [ -z "$t" ] || [ "$u" -lt "$t" ]; then t=$u; fi
done
span=$((t * 12 / 10 + 1))
need=$(((trials + 4) / 5))
torn=0 done=0 before=0
RANDOM=$seed
i=0
while [ "$i" -lt "$trials" ] || { [ "$torn" -lt "$need" ] && [ "$i" -lt $((3 * trials)) ]; }; do
  i=$((i + 1))
  us=$(((RANDOM * 32768 + RANDOM) % span))
  rank=$((RANDOM % world))
  run_trainer "$backend" "$sched" --load "$WORK/P" --steps 1 --save "$WORK/NEW" --kill-after-us "$us" \
    --kill-rank "$rank" >/dev/null 2>&1
  "$CKPT" verify "$WORK/P" >/dev/null || fail "trial $i: the previous checkpoint no longer verifies"
  if [ -d "$WORK/NEW" ]; then
    "$CKPT" verify "$WORK/NEW" >/dev/null || fail "trial $i: a committed checkpoint does not verify"
    done=$((done + 1))
    span=$((span * 3 / 5 + 50))
  else
    tmp=$(ls -d "$WORK"/NEW.tmp-* 2>/dev/null | head -1)
    if [ -n "$tmp" ]; then
      torn=$((torn + 1))
      span=$((span * 11 / 10 + 1))
      out=$("$CKPT" verify "$tmp" 2>&1) && fail "trial $i: a torn checkpoint verified"
      echo "$out" | grep -q "not a committed checkpoint" || fail "trial $i: unclear message: $out"
    else
      before=$((before + 1))
      span=$((span * 3 / 2 + 50))
    fi
    out=$("$CKPT" verify "$WORK/NEW" 2>&1) && fail "trial $i: verify of a missing checkpoint passed"
    echo "$out" | grep -q "no such checkpoint directory" || fail "trial $i: unclear message: $out"
  fi
  rm -rf "$WORK"/NEW "$WORK"/NEW.tmp-*
done
run_trainer "$backend" "$sched" --load "$WORK/P" --steps 0 >/dev/null || fail "the previous checkpoint does not load"
echo "trials: $i ($backend, fastest probe save ${t} us, last span ${span} us): killed inside the save $torn, before it $before, after the commit $done"
[ "$torn" -ge "$need" ] || fail "only $torn of $i kills landed inside a save (needed $need)"
echo "$i passed, 0 failed"
