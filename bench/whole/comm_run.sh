#!/bin/sh
# bench/whole/comm_run.sh [BUILD_DIR] [--reps N]: a whole bucket's collectives,
# padded vs prefix form, next to a Flat bucket of the same tensors, on 4 MPI
# ranks (docs/performance.md, "Whole: collectives"). Prints a table.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-bench}
[ $# -gt 0 ] && shift
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
fi
cmake --build "$build" --target mfsdp-whole-comm-bench -j2 >/dev/null
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np 4 "$build/bench/whole/mfsdp-whole-comm-bench" "$@"
