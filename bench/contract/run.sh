#!/bin/sh
# bench/contract/run.sh [BUILD_DIR]: the loop contract's costs: the trace check
# per hook next to the whole hook, and verify on load next to the load, on
# the compiled examples (docs/performance.md, "The loop contract").
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-bench}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
fi
cmake --build "$build" --target mfsdp-contract-bench mfsdpc -j2 >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# one rank, tiny tensors: a hook's cost is the replay loop, not data movement
"$build/planner/mfsdpc" compile "$root/tests/runtime/specs/tiny_1x1.mfsdp" -o "$tmp/tiny_1x1.yaml"
"$build/planner/mfsdpc" compile "$root/schedules/llama3_8b_hfsdp.mfsdp" -o "$tmp/llama.yaml"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/bench/contract/mfsdp-contract-bench" "$tmp/tiny_1x1.yaml" "$tmp/llama.yaml"
