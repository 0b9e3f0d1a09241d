#!/usr/bin/env bash
# device-check.sh: everything mfsdp checks on a machine with one GPU, in one
# run of under 8 minutes. Run from the repository root:
#
#   bash tests/gpu/device-check.sh                 # build, test, replay, bench
#   bash tests/gpu/device-check.sh --fetch-debs D  # on a machine WITH apt access:
#                                                  # download the build's Debian
#                                                  # packages into D
#
# Stages (each bounded by `timeout`, skipped when the time budget is spent):
#   1. prerequisites: nvcc, a GPU, NCCL (system, $NCCL_ROOT, or the pip wheel
#      nvidia-nccl-cu13), cmake, and flex, bison, m4, pkg-config, libyaml and
#      cmocka -- from the system, else installed with apt (short timeout: the
#      machine may be offline), else unpacked without root from the .deb files
#      in $MFSDP_DEBS (default ./.gpu-debs; make them with --fetch-debs);
#      missing ones stop the script with a list and exit status 2;
#   2. build (Release, CUDA for this GPU's architecture; warnings counted);
#   3. ctest -L gpu: kernels bit-exact vs host references, the oracle through
#      the one-GPU thread-rank backend (every mode x mesh) and NCCL (1x1),
#      a CUDA trainer's path with CUDA graphs;
#   4. mfsdp-replay --backend cuda-local on every example schedule
#      (schedules/*.yaml; llama3_8b_hfsdp is skipped: 32 ranks of 8B
#      parameters do not fit one GPU) and --backend nccl on a 1x1 HFSDP mesh;
#   5. mfsdp-mlp on the GPU (when the example exists and has a GPU backend);
#   6. mfsdp-gpu-bench: kernel bandwidth vs cudaMemcpy, host time per hook and
#      device time per step (eager and CUDA graphs) on a llama-shaped 1x1 model.
# Writes $OUT/summary.txt (OUT defaults to ./device-check-out) plus logs.
# Exit status: 0 every stage passed, 1 a stage failed, 2 prerequisites missing.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

DEB_PACKAGES="flex libfl2 libfl-dev bison m4 libyaml-0-2 libyaml-dev libcmocka0 libcmocka-dev pkgconf pkgconf-bin libpkgconf3"

if [ "${1:-}" = "--fetch-debs" ]; then
    dir=${2:-.gpu-debs}
    mkdir -p "$dir" && cd "$dir" || exit 2
    apt-get download $DEB_PACKAGES || { echo "device-check: apt-get download failed" >&2; exit 2; }
    echo "device-check: $(ls ./*.deb | wc -l) packages in $dir; carry that folder to the GPU machine"
    exit 0
fi

OUT=${OUT:-$ROOT/device-check-out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
BUILD=${MFSDP_BUILD_DIR:-$ROOT/build-device}
DEPS=${MFSDP_DEPS_PREFIX:-/tmp/mfsdp-device-deps}
DEBS=${MFSDP_DEBS:-$ROOT/.gpu-debs}
BUDGET=${MFSDP_CHECK_BUDGET_S:-460}   # seconds for everything (limit: 8 minutes)
START=$(date +%s)
STATUS=0
: >"$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
# stage NAME SECONDS: true when the stage may run (enough budget left).
stage() {
    local name=$1 need=$2
    if [ "$(left)" -lt "$need" ]; then
        say "[SKIP] $name: only $(left) s of the ${BUDGET} s budget left"
        STATUS=1
        return 1
    fi
    say "== $name (t=$(elapsed) s)"
    return 0
}
# run LIMIT LOG CMD...: runs with a time limit (never past the budget),
# appends to LOG; returns its status.
run() {
    local limit=$1 log=$2 l
    shift 2
    l=$(( $(left) - 5 ))
    [ "$l" -lt "$limit" ] && limit=$l
    [ "$limit" -lt 5 ] && limit=5
    timeout --kill-after=5 "$limit" "$@" >>"$log" 2>&1
}

say "mfsdp device check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

# ---- 1. prerequisites ----
stage "prerequisites" 10
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
MISSING=""
[ -z "$NVCC" ] && MISSING="$MISSING nvcc"
command -v cmake >/dev/null || MISSING="$MISSING cmake"
CC_ARCH=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -1)"
    CC_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
elif [ "${MFSDP_CHECK_NO_GPU_OK:-0}" = 1 ]; then
    say "gpu: none visible (MFSDP_CHECK_NO_GPU_OK=1: going on; the GPU stages will fail or skip)"
else
    say "gpu: none visible (nvidia-smi missing or failing); set MFSDP_CHECK_NO_GPU_OK=1 to build anyway"
    MISSING="$MISSING gpu"
fi
[ -n "$NVCC" ] && say "nvcc: $("$NVCC" --version | tail -1)"
CUDA_ARCHS=${CC_ARCH:-90}

# NCCL: system, $NCCL_ROOT, else the pip wheel (nvidia-nccl-cu13), exposed as a prefix.
NCCL_PREFIX=""
for d in "${NCCL_ROOT:-}" /usr/local/cuda /usr /usr/local; do
    if [ -n "$d" ] && [ -f "$d/include/nccl.h" ] &&
       { compgen -G "$d/lib*/libnccl.so*" >/dev/null || compgen -G "$d/lib/*/libnccl.so*" >/dev/null; }; then
        NCCL_PREFIX=$d
        break
    fi
done
if [ -z "$NCCL_PREFIX" ]; then
    wheel=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null \
            || python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
    if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then
        NCCL_PREFIX=$DEPS/nccl
        mkdir -p "$NCCL_PREFIX/include" "$NCCL_PREFIX/lib"
        ln -sf "$wheel/include/nccl.h" "$NCCL_PREFIX/include/nccl.h"
        for f in "$wheel"/lib/libnccl.so*; do ln -sf "$f" "$NCCL_PREFIX/lib/$(basename "$f")"; done
        [ -e "$NCCL_PREFIX/lib/libnccl.so" ] || ln -sf "$(ls "$wheel"/lib/libnccl.so* | head -1)" "$NCCL_PREFIX/lib/libnccl.so"
        say "nccl: the pip wheel at $wheel"
    fi
fi
if [ -z "$NCCL_PREFIX" ]; then
    MISSING="$MISSING nccl"
else
    say "nccl: $(grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH)' "$NCCL_PREFIX/include/nccl.h" | awk '{printf "%s.", $3}' | sed 's/\.$//') in $NCCL_PREFIX"
    export LD_LIBRARY_PATH="$NCCL_PREFIX/lib:${LD_LIBRARY_PATH:-}"
fi

have_build_deps() {
    command -v flex >/dev/null && command -v bison >/dev/null && command -v pkg-config >/dev/null &&
        pkg-config --exists yaml-0.1 cmocka 2>/dev/null
}
if ! have_build_deps && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "build dependencies: trying apt-get (60 s limit; this machine may be offline)"
    timeout 60 apt-get install -y --no-install-recommends flex bison m4 pkgconf libyaml-dev libcmocka-dev \
        >>"$OUT/build.log" 2>&1 || say "  apt-get failed (see build.log)"
fi
if ! have_build_deps && ls "$DEBS"/*.deb >/dev/null 2>&1; then
    say "build dependencies: unpacking $(ls "$DEBS"/*.deb | wc -l) packages from $DEBS into $DEPS/root"
    mkdir -p "$DEPS/root"
    for f in "$DEBS"/*.deb; do dpkg-deb -x "$f" "$DEPS/root" || say "  cannot unpack $f"; done
    R=$DEPS/root
    for pc in "$R"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$R"/usr/share/pkgconfig/*.pc; do
        [ -f "$pc" ] && sed -i -e "s|=/usr\\b|=$R/usr|g" -e "s|-L/usr/|-L$R/usr/|g" -e "s|-I/usr/|-I$R/usr/|g" "$pc"
    done
    [ -e "$R/usr/bin/pkg-config" ] || ln -sf pkgconf "$R/usr/bin/pkg-config"
    export PATH="$R/usr/bin:$PATH"
    export PKG_CONFIG_PATH="$R/usr/lib/x86_64-linux-gnu/pkgconfig:$R/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
    export LD_LIBRARY_PATH="$R/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
    export M4="$R/usr/bin/m4" BISON_PKGDATADIR="$R/usr/share/bison"
    export CMAKE_PREFIX_PATH="$R/usr:${CMAKE_PREFIX_PATH:-}"
fi
command -v flex >/dev/null || MISSING="$MISSING flex"
command -v bison >/dev/null || MISSING="$MISSING bison"
command -v pkg-config >/dev/null || MISSING="$MISSING pkg-config"
command -v pkg-config >/dev/null && { pkg-config --exists yaml-0.1 || MISSING="$MISSING libyaml-dev"; }
command -v pkg-config >/dev/null && { pkg-config --exists cmocka || MISSING="$MISSING libcmocka-dev"; }
if [ -n "$MISSING" ]; then
    say "[FAIL] prerequisites missing:$MISSING"
    case "$MISSING" in *flex*|*bison*|*pkg-config*|*libyaml*|*cmocka*)
        say "  apt could not install the build dependencies. On a machine with apt access run"
        say "    bash tests/gpu/device-check.sh --fetch-debs .gpu-debs"
        say "  and bring .gpu-debs (or set MFSDP_DEBS) here.";;
    esac
    case "$MISSING" in *nccl*) say "  NCCL: set NCCL_ROOT to a prefix with include/nccl.h and lib/libnccl.so*.";; esac
    exit 2
fi
say "[PASS] prerequisites (t=$(elapsed) s)"

# ---- 2. build ----
if stage "build" 60; then
    # Release (optimized host code: the hook timings are the product's). Not
    # -Werror: at -O2 gcc adds maybe-uninitialized warnings CI (-O0) does not
    # see; they are counted below and kept in build.log.
    CMAKE_ARGS=(-S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMFSDP_WERROR=OFF -DMFSDP_WITH_MPI=OFF
                -DMFSDP_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS"
                -DNCCL_ROOT="$NCCL_PREFIX")
    command -v ninja >/dev/null && CMAKE_ARGS+=(-G Ninja)
    if run 90 "$OUT/build.log" cmake "${CMAKE_ARGS[@]}" &&
       grep -q "NCCL/CUDA backend ON" "$OUT/build.log" &&
       run 240 "$OUT/build.log" cmake --build "$BUILD" -j "$(nproc)"; then
        say "[PASS] build: CUDA architecture sm_$CUDA_ARCHS, $(grep -c 'warning:' "$OUT/build.log") compiler warnings (t=$(elapsed) s)"
    else
        grep -q "NCCL/CUDA backend ON" "$OUT/build.log" || say "  CMake did not enable the CUDA/NCCL backend"
        say "[FAIL] build (see build.log; last lines:)"
        tail -15 "$OUT/build.log" | sed 's/^/  /' | tee -a "$SUMMARY" >/dev/null
        exit 1
    fi
fi
MFSDPC=$BUILD/planner/mfsdpc
REPLAY=$BUILD/runtime/mfsdp-replay
BENCH=$BUILD/tests/gpu/mfsdp-gpu-bench

# ---- 3. GPU tests ----
if stage "ctest -L gpu" 60; then
    if run 180 "$OUT/ctest.log" \
           ctest --test-dir "$BUILD" -L gpu --output-on-failure -j 4; then
        say "[PASS] ctest -L gpu: $(grep -E 'tests passed' "$OUT/ctest.log" | tail -1)"
    else
        say "[FAIL] ctest -L gpu: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
        grep -E '\*\*\*(Failed|Timeout)|Skipped' "$OUT/ctest.log" | sed 's/^/  /' | tee -a "$SUMMARY" >/dev/null
        STATUS=1
    fi
    grep -q "Skipped" "$OUT/ctest.log" && say "  note: some GPU tests were skipped (no device visible?)"
fi

# ---- 4. replays ----
if stage "mfsdp-replay" 30; then
    : >"$OUT/replay.log"
    for y in "$ROOT"/schedules/*.yaml; do
        name=$(basename "$y" .yaml)
        if [ "$name" = llama3_8b_hfsdp ]; then
            say "  [SKIP] $name: 32 ranks x 8B parameters do not fit one GPU"
            continue
        fi
        [ "$(left)" -lt 40 ] && { say "  [SKIP] $name: time budget"; STATUS=1; continue; }
        t0=$(date +%s)
        echo "### $name --backend cuda-local" >>"$OUT/replay.log"
        if run 60 "$OUT/replay.log" "$REPLAY" "$y" --backend cuda-local --steps 2 --timeout-ms 30000 --quiet; then
            say "  [PASS] $name: cuda-local, $(grep -o 'verified: .*' "$OUT/replay.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
        else
            say "  [FAIL] $name: cuda-local: $(grep -E 'FAILED|error' "$OUT/replay.log" | tail -1)"
            STATUS=1
        fi
    done
    echo "### hfsdp_1x1 --backend nccl" >>"$OUT/replay.log"
    if run 30 "$OUT/replay.log" "$MFSDPC" compile "$ROOT/tests/gpu/hfsdp_1x1.mfsdp" -o "$BUILD/hfsdp_1x1.yaml" &&
       run 60 "$OUT/replay.log" "$REPLAY" "$BUILD/hfsdp_1x1.yaml" --backend nccl --steps 3 --timeout-ms 30000 --quiet; then
        say "  [PASS] hfsdp_1x1: nccl, $(grep -o 'verified: .*' "$OUT/replay.log" | tail -1)"
    else
        say "  [FAIL] hfsdp_1x1: nccl: $(grep -E 'FAILED|error' "$OUT/replay.log" | tail -1)"
        STATUS=1
    fi
fi

# ---- 5. mfsdp-mlp ----
MLP=$(find "$BUILD" -name mfsdp-mlp -type f -perm -u+x 2>/dev/null | head -1)
if [ -z "$MLP" ]; then
    say "[SKIP] mfsdp-mlp: not built (examples/ has no mfsdp-mlp yet)"
elif ! "$MLP" --help 2>&1 | grep -q "cuda-local"; then
    say "[SKIP] mfsdp-mlp: it has no GPU backend option (--backend cuda-local) yet"
elif stage "mfsdp-mlp" 30; then
    if run 60 "$OUT/replay.log" "$MLP" --backend cuda-local; then
        say "[PASS] mfsdp-mlp --backend cuda-local: $(tail -1 "$OUT/replay.log")"
    else
        say "[FAIL] mfsdp-mlp --backend cuda-local (see replay.log)"
        STATUS=1
    fi
fi

# ---- 6. bench ----
if stage "mfsdp-gpu-bench" 30; then
    : >"$OUT/bench.txt"
    if run 90 "$OUT/bench.txt" "$BENCH" kernels --mib 1024; then
        say "[PASS] kernel bandwidth:"
        sed -n '/^kernel bandwidth/,$p' "$OUT/bench.txt" | sed 's/^/  /' | tee -a "$SUMMARY" >/dev/null
    else
        say "[FAIL] mfsdp-gpu-bench kernels (see bench.txt)"
        STATUS=1
    fi
    if run 30 "$OUT/bench.txt" "$MFSDPC" compile "$ROOT/tests/gpu/llama_1x1.mfsdp" -o "$BUILD/llama_1x1.yaml" &&
       run 120 "$OUT/bench.txt" "$BENCH" hooks "$BUILD/llama_1x1.yaml" --steps 10 --graphs; then
        say "[PASS] host time per hook (NCCL, 1 rank, device trainer):"
        sed -n '/^hooks:/,$p' "$OUT/bench.txt" | sed 's/^/  /' | tee -a "$SUMMARY" >/dev/null
    else
        say "[FAIL] mfsdp-gpu-bench hooks (see bench.txt)"
        STATUS=1
    fi
fi

say "done in $(elapsed) s: $([ $STATUS = 0 ] && echo 'every stage passed' || echo 'some stage failed or was skipped')"
exit $STATUS
