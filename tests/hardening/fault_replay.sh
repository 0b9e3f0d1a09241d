#!/usr/bin/env bash
# The fault campaign of issue 25 (D4), kept small for every CI run:
# `mfsdp-replay --backend mpi` under mpirun -np 4 with Open MPI's
# orte_abort_on_non_zero_status 0 (mpirun does not kill the job, the ranks
# are on their own), one rank SIGKILLed or SIGSTOPped at a random point of
# the replay. Every surviving rank must exit non-zero within the timeout + 2 s
# of the fault, naming the faulty rank on its standard error, and nobody may
# print "verified" for a run a rank left before the end. A stopped rank, once
# continued, must exit non-zero as well.
#
# Each rank runs under a small wrapper that records its pid, its exit status
# and the time it exited, and exits with that status (a wrapper exiting 0
# without MPI_Finalize would make mpirun kill the job). mpirun itself may wait
# for ever for a killed rank: it is killed at the end of each trial.
#
#   fault_replay.sh MPIEXEC MFSDPC MFSDP_REPLAY SPEC.mfsdp [KILL_TRIALS STOP_TRIALS]
# SPEC is compiled first; its mesh must have 4 ranks.
set -u
mpiexec=$1 mfsdpc=$2 replay=$3 spec=$4 kills=${5:-3} stops=${6:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
T=1500 steps=100000 np=4
bound_ms=$((T + 2000))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sched=$work/schedule.yaml
"$mfsdpc" compile "$spec" -o "$sched" || { echo "FAIL: cannot compile $spec"; exit 1; }
fails=0 trials=0 late=0

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# start DIR: launches the job in the background (mpirun's pid in $job)
start() {
  local d=$1
  rm -rf "$d" && mkdir -p "$d"
  "$mpiexec" --oversubscribe --mca orte_abort_on_non_zero_status 0 -np $np \
    bash -c 'r=$OMPI_COMM_WORLD_RANK d=$1; shift
             "$@" >"$d/out.$r" 2>"$d/err.$r" & echo $! >"$d/pid.$r"
             wait $!; rc=$?; echo "$rc $(( $(date +%s%N) / 1000000 ))" >"$d/rc.$r"; exit $rc' \
    wrapper "$d" "$replay" "$sched" --backend mpi --steps $steps --timeout-ms $T \
    >"$d/mpirun.out" 2>&1 &
  job=$!
}

# wait_for PATTERN FILE LIMIT_MS: true once FILE matches PATTERN
wait_for() {
  local end=$(( $(now_ms) + $3 ))
  while [ "$(now_ms)" -lt $end ]; do
    grep -qs -- "$1" "$2" && return 0
    sleep 0.05
  done
  return 1
}

# wait_rcs DIR LIMIT_MS RANKS...: true once every rank's rc file exists
wait_rcs() {
  local d=$1 end=$(( $(now_ms) + $2 )) r all; shift 2
  while [ "$(now_ms)" -lt $end ]; do
    all=1
    for r in "$@"; do [ -s "$d/rc.$r" ] || all=0; done
    [ $all = 1 ] && return 0
    sleep 0.05
  done
  return 1
}

finish_job() { kill "$job" 2>/dev/null; wait "$job" 2>/dev/null; }
fail() { fails=$((fails + 1)); echo "FAIL: $*"; for f in "$d"/out.* "$d"/err.*; do
  [ -f "$f" ] && tail -n 4 "$f" | sed "s|^|    $(basename "$f") |"; done; }

# ---- no fault: the campaign's baseline, and the replay's speed ----
d=$work/probe
steps=60
t0=$(now_ms); start "$d"
if wait_rcs "$d" 60000 0 1 2 3 && grep -q '^verified: 4 ranks, 60 steps' "$d/out.0" &&
   [ "$(cat "$d"/rc.* | cut -d' ' -f1 | sort -u)" = 0 ]; then
  echo "ok: no fault: verified, every rank exit 0 ($(( $(now_ms) - t0 )) ms)"
else fail "no fault: not verified"; fi
finish_job
steps=100000   # the faulty runs would go on for minutes: every fault lands inside

# trial KIND: one rank (random) gets SIGKILL or SIGSTOP at a random point
trial() {
  local kind=$1 v=$((RANDOM % np)) delay=$((RANDOM % 1500)) r ok=1 t_fault t_exit rc slowest=0
  d=$work/$kind.$trials
  trials=$((trials + 1))
  start "$d"
  if ! wait_for '^step 1:' "$d/out.0" 60000; then fail "$kind: the replay never started"; finish_job; return; fi
  sleep "$(printf '0.%03d' "$delay")"
  if grep -qs '^verified:' "$d/out.0" || [ -s "$d/rc.$v" ]; then
    late=$((late + 1)); echo "late: $kind: the run ended before the fault"; finish_job; return
  fi
  local sig=KILL; [ "$kind" = stop ] && sig=STOP
  kill -s $sig "$(cat "$d/pid.$v")"; t_fault=$(now_ms)
  local survivors=()
  for r in $(seq 0 $((np - 1))); do [ "$r" = "$v" ] || survivors+=("$r"); done
  wait_rcs "$d" $((bound_ms + 3000)) "${survivors[@]}"
  [ "$kind" = stop ] && kill -s CONT "$(cat "$d/pid.$v")"
  for r in "${survivors[@]}"; do
    if [ ! -s "$d/rc.$r" ]; then fail "$kind rank $v after ${delay} ms: rank $r still running $((bound_ms + 3000)) ms later"; ok=0; continue; fi
    read -r rc t_exit <"$d/rc.$r"
    if [ "$rc" = 0 ]; then fail "$kind rank $v: survivor rank $r exited 0"; ok=0; fi
    [ $((t_exit - t_fault)) -gt $slowest ] && slowest=$((t_exit - t_fault))
    if [ $((t_exit - t_fault)) -gt $bound_ms ]; then
      fail "$kind rank $v: rank $r exited $((t_exit - t_fault)) ms after the fault (bound $bound_ms)"; ok=0; fi
    if ! grep -Eq "ranks? ([0-9]+, )*$v(,| did not reach)" "$d/err.$r"; then
      fail "$kind rank $v: rank $r's error does not name rank $v"; ok=0; fi
  done
  if [ "$kind" = stop ]; then
    if ! wait_rcs "$d" $((bound_ms + 3000)) "$v"; then fail "stop rank $v: still running after SIGCONT"; ok=0
    else read -r rc t_exit <"$d/rc.$v"; [ "$rc" != 0 ] || { fail "stop rank $v: exited 0 after SIGCONT"; ok=0; }; fi
  fi
  if grep -qs '^verified:' "$d/out.0"; then fail "$kind rank $v: verified after a fault"; ok=0; fi
  [ $ok = 1 ] && echo "ok: $kind rank $v ${delay} ms into the replay: every survivor exit non-zero naming it, the last $slowest ms after the fault (bound $bound_ms): $(head -n 1 "$d/err.${survivors[0]}")"
  finish_job
}

for _ in $(seq "$kills"); do trial kill; done
for _ in $(seq "$stops"); do trial stop; done
echo "$trials fault trials ($late ended before the fault), $fails failed"
[ $fails = 0 ] && [ $late -lt $trials ]
