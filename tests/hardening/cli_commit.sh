#!/usr/bin/env bash
# Every output of one mfsdpc command is committed together or not at all
# (issue 25, D1 and D3; planner/cli/mf_outputs.h):
#  - a command that fails on one output replaces none of the others
#    (simulate --trace OK --svg unwritable; simulate --svg OK --trace
#    unwritable; plan --svg OK -o unwritable), exit 2, no temporary left;
#  - SIGTERM or SIGINT while a temporary exists (compile -o, simulate --trace
#    --svg, plan --svg -o; held there by an fsync that sleeps, slow_fsync.so)
#    removes every temporary, keeps the old outputs and ends by the signal.
#
#   cli_commit.sh MFSDPC SLOW_FSYNC_SO SPEC AUTO_SPEC WORKDIR
set -u
mfsdpc=$1 shim=$2 spec=$3 auto=$4 work=$5
. "$(dirname "$0")/cli_lib.sh"
cli_begin "$work"
cp "$spec" in.mfsdp
cp "$auto" auto.mfsdp
reset_d() { rm -rf d && mkdir d && for f in t.json t.svg out.yaml front.svg p.mfsdp; do echo "old $f" >"d/$f"; done; }
snapshot() { (cd d && ls -A | sort | tr '\n' ' '; cat -- * | cksum); }

# unchanged RC PATTERN CMD...: exit status RC, stderr matching PATTERN, d/ as before
unchanged() {
  local want=$1 pat=$2; shift 2
  reset_d; local before; before=$(snapshot)
  ran=$((ran + 1))
  "$@" >out.txt 2>err.txt
  local rc=$?
  if [ "$rc" != "$want" ] || ! grep -Eq -- "$pat" err.txt || [ "$(snapshot)" != "$before" ]; then
    fail "$* -> rc $rc (want $want); d/ now: $(cd d && ls -A | tr '\n' ' '); stderr: $(head -c 300 err.txt)"
  else echo "ok: $* -> $rc, d/ untouched: $(head -n 1 err.txt)"; fi
}

# D1: one output fails, the other is not replaced
unchanged 2 "missing/t.svg" "$mfsdpc" simulate in.mfsdp --trace d/t.json --svg missing/t.svg
unchanged 2 "missing/t.json" "$mfsdpc" simulate in.mfsdp --svg d/t.svg --trace missing/t.json
unchanged 2 "missing/p.mfsdp" "$mfsdpc" plan auto.mfsdp --memory 4MiB --svg d/front.svg -o missing/p.mfsdp
unchanged 2 "d/t.json" bash -c "ulimit -f 2; exec \"\$0\" simulate in.mfsdp --svg d/t.svg --trace d/t.json" "$mfsdpc"
# a failing command writes nothing: nothing fits the budget
unchanged 1 "no plan fits" "$mfsdpc" plan auto.mfsdp --memory 1KiB --svg d/front.svg -o d/p.mfsdp

# the same commands succeed and write every output (so the cases above fail
# for the reason they name)
reset_d
if "$mfsdpc" simulate in.mfsdp --trace d/t.json --svg d/t.svg >/dev/null &&
   grep -q traceEvents d/t.json && grep -q '<svg' d/t.svg &&
   "$mfsdpc" plan auto.mfsdp --memory 4MiB --svg d/front.svg -o d/p.mfsdp >/dev/null &&
   grep -q '<svg' d/front.svg && grep -q '^mesh' d/p.mfsdp; then echo "ok: the outputs are written when nothing fails"
else fail "a plain simulate/plan did not write its outputs"; fi

# D3: a signal while the temporaries exist
signalled() {
  local sig=$1; shift
  reset_d; local before; before=$(snapshot)
  ran=$((ran + 1))
  LD_PRELOAD=$shim MFSDP_SLOW_FSYNC_MS=4000 ASAN_OPTIONS=verify_asan_link_order=0:${ASAN_OPTIONS:-} \
    "$@" >out.txt 2>err.txt &
  local pid=$! n=0
  while [ $n -lt 200 ] && ! ls d | grep -q '\.tmp\.'; do sleep 0.05; n=$((n + 1)); done
  if ! ls d | grep -q '\.tmp\.'; then fail "$*: no temporary appeared"; kill "$pid"; wait "$pid"; return; fi
  kill -s "$sig" "$pid"
  wait "$pid"
  local rc=$? want=$((128 + $(kill -l "$sig")))
  if [ "$rc" != "$want" ] || [ "$(snapshot)" != "$before" ]; then
    fail "SIG$sig during $* -> rc $rc (want $want); d/ now: $(cd d && ls -A | tr '\n' ' ')"
  else echo "ok: SIG$sig during $*: ended by the signal, no temporary, old outputs kept"; fi
}
signalled TERM "$mfsdpc" compile in.mfsdp -o d/out.yaml
signalled INT "$mfsdpc" compile in.mfsdp -o d/out.yaml
signalled TERM "$mfsdpc" simulate in.mfsdp --trace d/t.json --svg d/t.svg
signalled TERM "$mfsdpc" plan auto.mfsdp --memory 4MiB --svg d/front.svg -o d/p.mfsdp

cli_end
