#!/usr/bin/env bash
# One long libFuzzer campaign per target, in parallel, at the lowest CPU
# priority, in fork mode (a crash, timeout or OOM is saved as an artifact and
# the campaign goes on). Used once for the figures in docs/reliability.md.
#
#   bash tests/fuzz/long-run.sh BUILD_DIR OUT_DIR SECONDS [TARGET...]
#
# BUILD_DIR is a build of the `fuzz` preset (clang, MFSDP_FUZZ=ON). For each
# target OUT_DIR gets corpus/<t>/ (what the campaign found), <t>.log (the
# libFuzzer log) and <t>-crash-*/timeout-*/oom-* artifacts. Afterwards
# summarize with: grep -h 'DONE\|^#[0-9]*: cov' OUT_DIR/<t>.log | tail -1
set -euo pipefail
build=${1:?usage: long-run.sh BUILD_DIR OUT_DIR SECONDS [TARGET...]}
out=${2:?}
secs=${3:?}
shift 3
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_frontend fuzz_planner fuzz_load fuzz_roundtrip fuzz_safetensors)
src=$(cd "$(dirname "$0")/../.." && pwd)
fz=$src/tests/fuzz
spec_seeds=("$src/schedules" "$src/tests/grammar/valid" "$src/tests/grammar/invalid" "$fz/regressions/frontend"
            "$fz/regressions/planner")
yaml_seeds=("$fz/seeds/schedules" "$fz/regressions/load" "$fz/regressions/roundtrip")
mkdir -p "$out"
for t in "${targets[@]}"; do
  case $t in
    fuzz_frontend|fuzz_planner) seeds=("${spec_seeds[@]}"); dict=frontend.dict; maxlen=16384 ;;
    fuzz_load|fuzz_roundtrip) seeds=("${yaml_seeds[@]}" "$src/schedules"); dict=schedule.dict; maxlen=65536 ;;
    fuzz_safetensors) seeds=("$fz/seeds/safetensors"); dict=safetensors.dict; maxlen=8192 ;;
    *) echo "long-run.sh: unknown target $t" >&2; exit 2 ;;
  esac
  mkdir -p "$out/corpus/$t"
  ( cd "$out" && ASAN_OPTIONS=detect_leaks=1 nice -n 19 "$build/tests/fuzz/$t" \
      -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
      -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -max_len=$maxlen \
      -dict="$fz/$dict" -print_final_stats=1 -artifact_prefix="$out/$t-" \
      "$out/corpus/$t" "${seeds[@]}" >"$out/$t.log" 2>&1 ) &
  echo "$t: pid $! log $out/$t.log"
done
wait
