#!/usr/bin/env bash
# device-check.sh: everything mfsdp checks and measures on a machine with one
# GPU, in one run of at most 6 minutes (budget 360 s; pass the device tool
# timeout_s 450: docs/gpu.md). Four ways to run it:
#
#   bash tests/gpu/device-check.sh --pack BUILD DIR
#       HERE (a machine with the toolchain, no GPU needed): copy a CUDA build
#       (nvcc, sm_80 + sm_90) into DIR with the runtime libraries the image may
#       lack (libcudart, libyaml, libjansson, libcmocka) and stubs for NCCL
#       (the real one is 218 MB: the device's own is used, found by find_nccl)
#       and MPI (never used on one GPU; Open MPI's libraries need a newer
#       glibc than the image's). glibc, libstdc++, libgcc_s and the driver
#       come from the image. Refuses a tree over 64 MiB or one that needs a
#       glibc newer than GLIBC_FLOOR (or libstdc++ newer than GLIBCXX_FLOOR).
#       tests/gpu/pack-in-bullseye.sh DIR builds in a Debian 11 root and runs
#       --pack there: the tree to carry (this host's glibc is over the floor).
#   bash DIR/device-check.sh --prebuilt DIR
#       ON THE DEVICE: runs the stages below from DIR, builds nothing; needs
#       bash, coreutils, tar and the NVIDIA driver (CUDA 13: driver 580 or newer).
#   bash tests/gpu/device-check.sh --rehearse BUILD|PACKED
#       HERE: --pack BUILD (or a tree packed already), then runs it the way the device tool
#       will: a fresh copy of the tree, no network (unshare -n), a bare
#       environment, $OUT a fresh folder that must end with at most 8 files
#       (summary.txt + logs.tar.gz), each within the tool's limits. Without a
#       GPU it wants exit 77 and every stage named; prints the tree's size and
#       the glibc it needs. CTest: device_check_rehearsal.
#   bash tests/gpu/device-check.sh
#       self-building, for an ordinary GPU machine: checks CMake (>= 3.25),
#       nvcc, NCCL, flex, bison, pkg-config, libyaml, cmocka (apt when root and
#       online, else .deb files from --fetch-debs D); stops with the list of
#       what is missing (exit 2); builds for this GPU's architecture, packs
#       into $BUILD/prebuilt and runs that.
#
# Stages (each time-boxed; a stage that would pass the budget is skipped;
# $OUT/summary.txt is written line by line, so a cut run still reports; every
# log goes into $OUT/logs.tar.gz at the end of each stage and at exit, nothing
# else is written under $OUT). Diagnosable in one pass: the probe records
# NCCL's version, the HBM peak and where it came from, and `nvidia-smi -q`;
# NCCL_DEBUG=WARN puts NCCL's warnings into each log; every binary runs with
# a crash reporter preloaded (lib/libmfsdp_crash.so, built by --pack: on a
# fatal signal a backtrace with function names from the binary's symbol
# table, then addr2line or gdb where the image has them; the binaries keep
# their compressed debug information); a failed check's summary line carries
# the test's own last message (mode, mesh and M):
#   0. probe: the device, the driver, NCCL (the device's or the stub); a CUDA
#      error other than "no device" is a FAIL, not a skip;
#   1. kernels bit-exact vs host references, an event polled before a launch
#      (+ the tests that need no GPU);
#   2. the replay oracle through cuda-local (modes x {1x1, 2x2, 2x4}) and
#      NCCL on 1x1, a CUDA trainer's path with graphs, thread-ranks on one
#      GPU, a checkpoint round trip on device buffers, mfsdp-replay on the
#      example schedules;
#   3. overlap observed: 1-rank device trainers (real NCCL world of one, and
#      cuda-local), a spin kernel per unit, per-op CUDA event timestamps on all
#      three streams -> step / exposed / hidden / overlap, next to `mfsdpc
#      simulate` of the same schedule, and Chrome traces;
#   4. ordering stress: a spin kernel on one stream at a time changes no bit;
#   5. kernel bandwidth vs cudaMemcpyAsync and vs the HBM peak (the device's,
#      see probe), 64 KiB..1 GiB (past the H100's 50 MB L2);
#   6. host us per hook and per op, eager and as CUDA graphs; device time per
#      step eager vs graphs.
# At the end one table: each figure next to its reference from the same run.
# Exit status: 0 every stage passed, 1 a stage failed or timed out, 2 usage or
# missing prerequisites, 77 no GPU (nothing failed).
set -u
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
MAX_PACK_MIB=64
# The oldest glibc the packed tree must load on: 2.31 (Debian 11, Ubuntu
# 20.04). A binary linked on a glibc >= 2.34 host needs GLIBC_2.34
# (__libc_start_main, pthread_* moved into libc), so a tree for the device is
# built in a Debian 11 root: tests/gpu/pack-in-bullseye.sh.
# MFSDP_GLIBC_FLOOR=here (and MFSDP_GLIBCXX_FLOOR=here): this machine's own,
# for a tree that runs where it was built.
GLIBC_FLOOR=${MFSDP_GLIBC_FLOOR:-2.31}
GLIBCXX_FLOOR=${MFSDP_GLIBCXX_FLOOR:-3.4.28}  # GCC 10's libstdc++ (Debian 11, Ubuntu 20.04)
HBM_PEAK_GBS=${MFSDP_HBM_PEAK_GBS:-}         # empty: the device's (mfsdp-gpu-bench probe)
OUT_MAX_FILES=8

die() { echo "device-check: $*" >&2; exit 2; }

# ---------------------------------------------------------------- pack ----
# Libraries never carried: glibc's, the loader, the C++ runtime (every image
# with CUDA has it; the binaries need no versioned symbol of it: checked by
# the floor), the driver's.
is_image_lib() {
    case "$(basename "$1")" in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*|libutil.so*) return 0;;
        libstdc++.so*|libgcc_s.so*) return 0;;
        libcuda.so*|libnvidia*|linux-vdso*) return 0;;
    esac
    return 1
}

# highest_version PREFIX FILE...: the highest PREFIX_x.y[.z] symbol version
# the files need (empty when none).
highest_version() {
    local p=$1
    shift
    # the version needs (.gnu.version_r) as readelf prints them: the same in
    # every binutils (objdump -T's column gained parentheses in 2.37)
    for f in "$@"; do readelf -V --wide "$f" 2>/dev/null; done | grep -o "Name: ${p}_[0-9][0-9.]*" |
        sed "s/^Name: ${p}_//" | sort -uV | tail -1
}
# version_le A B: A <= B (versions; empty A is <= anything).
version_le() { [ -z "$1" ] || [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }

# The glibc and the libstdc++ (its highest GLIBCXX_ version) of this machine.
glibc_here() { ldd --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*$'; }
glibcxx_here() {
    local l
    l=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
    [ -n "$l" ] && highest_version GLIBCXX "$l"
}
[ "$GLIBC_FLOOR" = here ] && GLIBC_FLOOR=$(glibc_here)
[ "$GLIBCXX_FLOOR" = here ] && GLIBCXX_FLOOR=$(glibcxx_here)

# make_stub SONAME REGEX DIR WHY: a library named SONAME that defines every
# symbol matching REGEX the binaries import: functions return 2 (NCCL's
# ncclSystemError; MPI's MPI_ERR_COUNT, never success), data is a zeroed block,
# the string functions of NCCL say WHY.
make_stub() {
    local soname=$1 re=$2 dir=$3 why=$4
    local src
    src=$(mktemp "${TMPDIR:-/tmp}/mfsdp-stub.XXXXXX.c") || die "cannot create a temporary file"
    {
        echo "/* generated by device-check.sh --pack: $why */"
        echo "static const char why[] = \"$why\";"
        for b in "$dir"/../bin/*; do objdump -T "$b" 2>/dev/null; done |
            awk -v re="$re" '/\*UND\*/ && $NF ~ re {print (/ DO / ? "O " : "F ") $NF}' |
            sort -u | while read -r kind s; do
                case $kind:$s in
                    F:ncclGetErrorString|F:ncclGetLastError) echo "const char *$s(void) { return why; }";;
                    F:*) echo "int $s(void) { return 2; }";;
                    O:*) echo "char ${s}[4096] __attribute__((aligned(64)));";;
                esac
            done
    } >"$src"
    cc -shared -fPIC -O1 -Wl,-soname,"$soname" -o "$dir/$soname" "$src" || { rm -f "$src"; die "cannot build the $soname stub"; }
    rm -f "$src"
}

# make_crash_lib DIR: DIR/libmfsdp_crash.so, preloaded into every binary of
# the run: on SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT it writes to stderr
# "mfsdp crash report", the signal, the fault address, the backtrace
# (backtrace_symbols_fd: module(+offset)) and each frame of the executable
# named from its .symtab (function+offset, no tool needed), then hands the
# signal to the program's own handler (cmocka's, installed with signal(),
# which this library interposes) or dies of it. Async-signal-safe calls
# only, after a backtrace() at load (libgcc_s loaded then).
make_crash_lib() {
    local dir=$1 src
    src=$(mktemp "${TMPDIR:-/tmp}/mfsdp-crash.XXXXXX.c") || die "cannot create a temporary file"
    cat >"$src" <<'CRASH_EOF'
/* generated by device-check.sh --pack: the device check's crash reporter (LD_PRELOAD) */
#define _GNU_SOURCE
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
static const char *const names[] = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"};
static sighandler_t chained[5];
static unsigned long exe_base;

static int which(int sig)
{
    for (int i = 0; i < 5; i++)
        if (sigs[i] == sig)
            return i;
    return -1;
}
static void put(const char *s) { ssize_t r = write(2, s, strlen(s)); (void)r; }
static void hex(unsigned long v)
{
    char b[24];
    int i = 23;
    b[i] = 0;
    do b[--i] = "0123456789abcdef"[v & 15]; while ((v >>= 4) && i > 3);
    b[--i] = 'x', b[--i] = '0';
    put(b + i);
}
/* The function of the executable's .symtab at vma, or NULL. */
static const char *symbol(const unsigned char *e, size_t len, unsigned long vma, unsigned long *off)
{
    const Elf64_Ehdr *eh = (const void *)e;
    if (len < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) ||
        eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > len)
        return NULL;
    const Elf64_Shdr *sh = (const void *)(e + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum)
            continue;
        const Elf64_Shdr *st = &sh[sh[i].sh_link];
        if (sh[i].sh_offset + sh[i].sh_size > len || st->sh_offset + st->sh_size > len)
            return NULL;
        const Elf64_Sym *y = (const void *)(e + sh[i].sh_offset);
        for (size_t k = 0; k < sh[i].sh_size / sizeof *y; k++)
            if (ELF64_ST_TYPE(y[k].st_info) == STT_FUNC && y[k].st_value <= vma &&
                vma < y[k].st_value + (y[k].st_size ? y[k].st_size : 1) && y[k].st_name < st->sh_size) {
                *off = vma - y[k].st_value;
                return (const char *)(e + st->sh_offset + y[k].st_name);
            }
    }
    return NULL;
}
static void report(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    int w = which(sig);
    put("\nmfsdp crash report: ");
    put(w >= 0 ? names[w] : "signal");
    put(", fault address ");
    hex((unsigned long)si->si_addr);
    put("\nbacktrace (module(+offset)[address]):\n");
    void *fr[64];
    int n = backtrace(fr, 64);
    backtrace_symbols_fd(fr, n, 2);
    int fd = open("/proc/self/exe", O_RDONLY);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0) {
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            put("frames of the executable (.symtab):\n");
            for (int i = 0; i < n; i++) {
                unsigned long off = 0, vma = (unsigned long)fr[i] - exe_base;
                const char *f = symbol(m, (size_t)sb.st_size, vma, &off);
                if (!f)
                    continue;
                put("  ");
                put(f);
                put("+");
                hex(off);
                put(" (exe+");
                hex(vma);
                put(")\n");
            }
        }
    }
    put("end of crash report\n");
    if (w >= 0 && chained[w] != SIG_DFL && chained[w] != SIG_IGN && chained[w] != SIG_ERR && chained[w]) {
        chained[w](sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
}
/* The program's own handlers of the crash signals are chained after the report. */
sighandler_t signal(int sig, sighandler_t h)
{
    int w = which(sig);
    if (w >= 0) { /* the report stays installed; h runs after it (SIG_DFL, SIG_IGN: death) */
        sighandler_t old = chained[w] ? chained[w] : SIG_DFL;
        chained[w] = h;
        return old;
    }
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, &old))
        return SIG_ERR;
    return old.sa_handler;
}
static int first(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size, (void)data;
    exe_base = info->dlpi_addr; /* the first object is the executable */
    return 1;
}
__attribute__((constructor)) static void install(void)
{
    void *fr[2];
    backtrace(fr, 2);
    dl_iterate_phdr(first, NULL);
    static char stack[65536];
    stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack};
    sigaltstack(&ss, NULL);
    for (int i = 0; i < 5; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = report;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}
CRASH_EOF
    cc -shared -fPIC -O1 -o "$dir/libmfsdp_crash.so" "$src" || { rm -f "$src"; die "cannot build the crash reporter"; }
    rm -f "$src"
}

pack() {
    local build=$1 dir=$2
    [ -x "$build/tests/gpu/mfsdp-gpu-bench" ] || die "$build has no tests/gpu/mfsdp-gpu-bench: not a CUDA build of mfsdp"
    local root
    root=$(cd "$(dirname "$SELF")/../.." && pwd)
    [ -d "$root/tests/gpu" ] || die "--pack runs from the repository (tests/gpu/device-check.sh)"
    rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/nccl-stub" "$dir/data/schedules" || die "cannot create $dir"
    local bins=("$build/planner/mfsdpc" "$build/runtime/mfsdp-replay" "$build/tests/gpu/mfsdp-gpu-bench")
    for t in "$build"/tests/gpu/test_*; do [ -x "$t" ] && [ -f "$t" ] && bins+=("$t"); done
    for b in "${bins[@]}"; do
        [ -x "$b" ] || die "missing $b"
        cp "$b" "$dir/bin/" || die "cannot copy $b"
        # symbols and debug information stay (compressed) for crash reports;
        # stripped of debug information only when the tree would be too big
        objcopy --compress-debug-sections=zlib "$dir/bin/$(basename "$b")" 2>/dev/null ||
            strip --strip-debug "$dir/bin/$(basename "$b")" 2>/dev/null || true
    done
    # Runtime libraries: what ldd resolves for the binaries themselves, except
    # the image's; NCCL and MPI are replaced by stubs below.
    local libs mpi=0
    libs=$(for b in "$dir"/bin/*; do ldd "$b" 2>/dev/null; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
    for l in $libs; do
        is_image_lib "$l" && continue
        case "$(basename "$l")" in
            libnccl.so*) continue;;
            libmpi.so*) mpi=1; continue;;
            libopen-rte.so*|libopen-pal.so*|libhwloc.so*|libevent*|libudev.so*|libz.so*)
                # Open MPI's own dependencies: not needed once libmpi is a stub
                # (unless a binary needs one directly, checked below)
                continue;;
        esac
        cp -L "$l" "$dir/lib/$(basename "$l")" || die "cannot copy $l"
    done
    make_crash_lib "$dir/lib"
    make_stub libnccl.so.2 '^nccl' "$dir/nccl-stub" \
        "NCCL is not installed on this machine (libnccl.so.2 is the device check's stub; set NCCL_ROOT)"
    [ $mpi = 1 ] && make_stub libmpi.so.40 '^(MPI_|PMPI_|ompi_)' "$dir/lib" \
        "the device check's MPI stub: the MPI backend is not used on one GPU"
    # Every library a binary needs directly must resolve inside the tree or
    # from the image's own set.
    local need
    for b in "$dir"/bin/*; do
        for need in $(readelf -d "$b" 2>/dev/null | awk '/NEEDED/ {gsub(/[][]/, "", $5); print $5}'); do
            [ -e "$dir/lib/$need" ] || [ -e "$dir/nccl-stub/$need" ] || is_image_lib "$need" ||
                die "$(basename "$b") needs $need, which is neither packed nor the image's"
        done
    done
    cp "$root"/schedules/*.yaml "$dir/data/schedules/" 2>/dev/null || true
    cp "$root"/tests/gpu/*.mfsdp "$dir/data/" || die "cannot copy tests/gpu/*.mfsdp"
    cp "$root"/tests/ckpt/specs/hsdp_4x2.mfsdp "$dir/data/" || die "cannot copy tests/ckpt/specs/hsdp_4x2.mfsdp"
    cp "$SELF" "$dir/device-check.sh"
    local archs nvcc_v gencode
    archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
    nvcc_v=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")/\1/p' "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1)
    gencode=$(grep -rho 'arch=compute_[0-9]*,code=\[[a-z_0-9,]*\]' "$build/runtime/CMakeFiles" "$build/build.ninja" 2>/dev/null | sort -u | tr '\n' ' ')
    case "$gencode" in *sm_90*) ;; *) die "$build has no sm_90 device code (nvcc flags: ${gencode:-none}); configure with -DCMAKE_CUDA_ARCHITECTURES=\"80;90\"";; esac
    local kib glibc glibcxx debug="compressed debug information and symbols"
    kib=$(du -sk "$dir" | cut -f1)
    if [ "$kib" -gt $((MAX_PACK_MIB * 1024 - 12 * 1024)) ]; then
        strip --strip-debug "$dir"/bin/* 2>/dev/null
        debug="symbols only (debug information stripped: the tree was $((kib / 1024)) MiB)"
        kib=$(du -sk "$dir" | cut -f1)
    fi
    glibc=$(highest_version GLIBC "$dir"/bin/* "$dir"/lib/* "$dir"/nccl-stub/*.so*)
    glibcxx=$(highest_version GLIBCXX "$dir"/bin/* "$dir"/lib/*)
    {
        echo "mfsdp device-check prebuilt tree"
        echo "packed: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n) from $build"
        echo "commit: ${MFSDP_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
        echo "CUDA architectures: ${archs:-?} (nvcc ${nvcc_v:-?}: $gencode)"
        echo "carried libraries: $(ls "$dir/lib" | tr '\n' ' ')"
        echo "binaries: $debug; crash reporter lib/libmfsdp_crash.so (preloaded)"
        echo "glibc needed: ${glibc:-none} (floor $GLIBC_FLOOR); libstdc++ needed: ${glibcxx:+GLIBCXX_}${glibcxx:-no versioned symbol} (floor GLIBCXX_$GLIBCXX_FLOOR, the image's)"
        echo "needs on the device: glibc ${glibc:-any} or newer, libstdc++.so.6, an NVIDIA driver for CUDA 13 (580 or newer)"
        echo "size: $((kib / 1024)) MiB ($kib KiB)"
    } >"$dir/MANIFEST"
    cat "$dir/MANIFEST"
    if [ "$kib" -gt $((MAX_PACK_MIB * 1024)) ]; then
        echo "device-check: $dir is $((kib / 1024)) MiB, over the ${MAX_PACK_MIB} MiB that can be carried" >&2
        exit 1
    fi
    if ! version_le "$glibc" "$GLIBC_FLOOR" || ! version_le "$glibcxx" "$GLIBCXX_FLOOR"; then
        echo "device-check: the packed tree needs GLIBC_$glibc${glibcxx:+ / GLIBCXX_$glibcxx}, over the floor" \
             "GLIBC_$GLIBC_FLOOR / GLIBCXX_$GLIBCXX_FLOOR; the files that do:" >&2
        for f in "$dir"/bin/* "$dir"/lib/* "$dir"/nccl-stub/*.so*; do
            local v x
            v=$(highest_version GLIBC "$f")
            x=$(highest_version GLIBCXX "$f")
            version_le "$v" "$GLIBC_FLOOR" && version_le "$x" "$GLIBCXX_FLOOR" || echo "  $f: GLIBC_$v ${x:+GLIBCXX_$x}" >&2
        done
        exit 1
    fi
}

# --------------------------------------------------------------- stages ----
OUT=${OUT:-$PWD/device-check-out}
# Seconds for everything: 360, so the device tool's timeout_s 450 leaves 90 s
# for the machine to untar, start bash and bring the files back (its per-call
# limit is 600 s; the session's device time is 15 minutes in all).
BUDGET=${MFSDP_CHECK_BUDGET_S:-360}
START=$(date +%s)
FAILED=0
NOGPU=0

say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
# stage NAME SECONDS: true when the stage may run (budget left for it). The
# logs so far go into $OUT/logs.tar.gz first: a run cut during a stage still
# brings back every earlier stage's logs.
stage() {
    save_logs
    if [ "$(left)" -lt "$2" ]; then
        say "[SKIP] $1: only $(left) s of the ${BUDGET} s budget left"
        FAILED=1
        return 1
    fi
    say "== $1 (t=$(elapsed) s)"
}
# save_logs: every log so far into $OUT/logs.tar.gz (replaced whole).
save_logs() {
    [ -n "${LOGS:-}" ] && [ -d "$LOGS" ] || return 0
    tar -czf "$OUT/logs.tar.gz.part" -C "$LOGS" . 2>/dev/null && mv -f "$OUT/logs.tar.gz.part" "$OUT/logs.tar.gz" ||
        { rm -f "$OUT/logs.tar.gz.part"; echo "device-check: cannot write $OUT/logs.tar.gz" >&2; }
}
# run LIMIT LOG CMD...: time-boxed (never past the budget), output to LOG,
# with the crash reporter preloaded. LAST_MSG: the command's last line that
# reads as a failure (a test's fail message names its mode, mesh and M), for
# verdict; a crash's frames are symbolized into LOG (symbolize).
LAST_MSG=""
run() {
    local limit=$1 log=$2 l from rc
    shift 2
    l=$(( $(left) - 3 ))
    [ "$l" -lt "$limit" ] && limit=$l
    [ "$limit" -lt 3 ] && limit=3
    echo "### $* (limit ${limit} s)" >>"$log"
    from=$(wc -l <"$log")
    local pre=()
    [ -n "${CRASH_LIB:-}" ] && pre=(env "LD_PRELOAD=$CRASH_LIB${LD_PRELOAD:+:$LD_PRELOAD}")
    timeout --kill-after=5 "$limit" "${pre[@]}" "$@" >>"$log" 2>&1 </dev/null
    rc=$?
    LAST_MSG=""
    if [ $rc != 0 ] && [ $rc != 77 ]; then
        LAST_MSG=$(tail -n +"$((from + 1))" "$log" |
            grep -E 'FAIL|ERROR|[Ee]rror|failed|[Mm]ismatch|timed out|crash report|M=|, M ' | grep -v '^###' |
            grep -v '^\[  FAILED  \] [0-9]* test' | tail -2 | tr '\n' ' ' | cut -c1-400)
        if grep -q 'mfsdp crash report' <(tail -n +"$((from + 1))" "$log"); then
            # the signal and the innermost frames of the executable, then the frames' lines into the log
            LAST_MSG="crashed: $(tail -n +"$((from + 1))" "$log" | sed -n 's/^mfsdp crash report: //p' | head -1); in $(
                tail -n +"$((from + 1))" "$log" | sed -n '/^frames of the executable/,/^end of crash report/s/^  \([^ ]*\) (exe.*/\1/p' |
                head -5 | tr '\n' ' ' | sed 's/ $//; s/ / < /g'); ${LAST_MSG}"
            symbolize "$log" "$from"
        fi
    fi
    return $rc
}
# symbolize LOG FROM: the crash report's module(+offset) frames after line
# FROM of LOG, through addr2line (file:line, inlined frames) or gdb where the
# image has them; appended to LOG. Without either the report's own .symtab
# names stand, and the offsets can be read here with the packed binaries.
symbolize() {
    local log=$1 from=$2 mod off
    {
        echo "symbolized crash frames ($(command -v addr2line || command -v gdb || echo 'no addr2line or gdb on this machine: see the .symtab names above')):"
        tail -n +"$((from + 1))" "$log" | sed -n 's/^\(\/[^ (]*\)(+\(0x[0-9a-f]*\)).*/\1 \2/p' | head -40 |
            while read -r mod off; do
                if command -v addr2line >/dev/null; then
                    echo "  $(basename "$mod")+$off: $(timeout 10 addr2line -f -C -i -p -e "$mod" "$off" 2>&1 | tr '\n' ' ')"
                elif command -v gdb >/dev/null; then
                    echo "  $(basename "$mod")+$off: $(timeout 20 gdb -batch -ex "info line *$off" "$mod" 2>&1 | tail -1)"
                fi
            done
    } >>"$log" 2>&1
}
# verdict NAME RC [DETAIL]: one summary line per check; a failure carries
# run's LAST_MSG.
verdict() {
    local why=${3:-}
    [ "$2" != 0 ] && [ "$2" != 77 ] && [ -n "$LAST_MSG" ] && why="${why:+$why; }$LAST_MSG"
    case $2 in
        0) say "  [PASS] $1${3:+: $3}";;
        77) say "  [SKIP] $1: needs a GPU";;
        124|137) say "  [TIMEOUT] $1${why:+: $why}"; FAILED=1;;
        *) say "  [FAIL] $1 (exit $2)${why:+: $why}"; FAILED=1;;
    esac
    LAST_MSG=""
}
# row WHAT VALUE REFERENCE: one line of the final table (tab-separated).
row() { printf '%s\t%s\t%s\n' "$1" "${2:-n/a}" "${3:-}" >>"$LOGS/table.tsv"; }
# overlap_in FILE: the first "overlap N%" of an mfsdpc simulate or
# mfsdp-gpu-bench overlap output, as "N%" (empty if none).
overlap_in() { grep -o 'overlap [0-9.]*%' "$1" | head -1 | grep -o '[0-9.]*%'; }
# ratio A B: A / B as a percentage, or empty.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b + 0 > 0) printf "%.0f%%", 100 * a / b }'; }

# NCCL wherever this machine has it: NCCL_ROOT, the pip wheel of any python3
# (`import nvidia.nccl`: a venv, pyenv, conda or a site-packages wheel), the
# loader's cache, the usual prefixes. Prints "DIR<TAB>how found".
NVIDIA_PATHS='
import importlib
for name in ("nvidia.nccl", "nvidia"):
    try:
        m = importlib.import_module(name)
    except Exception:
        continue
    print("\n".join(getattr(m, "__path__", [])))
    break
'
find_nccl() {
    local d py
    for d in "${NCCL_ROOT:-}/lib" "${NCCL_ROOT:-}/lib64"; do
        [ -n "${NCCL_ROOT:-}" ] && [ -f "$d/libnccl.so.2" ] && { printf '%s\tNCCL_ROOT\n' "$d"; return; }
    done
    for py in python3 /opt/conda/bin/python3 /usr/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        # nvidia.nccl's folders, else those of the nvidia namespace (a wheel
        # may keep its libraries elsewhere under it, e.g. nvidia/cu13/lib)
        d=$(timeout 20 "$py" -c "$NVIDIA_PATHS" 2>/dev/null |
            while read -r p; do find "$p" -maxdepth 4 -name 'libnccl.so.2' 2>/dev/null; done | head -1)
        [ -n "$d" ] && { printf '%s\t%s nvidia.nccl\n' "$(dirname "$d")" "$(command -v "$py")"; return; }
    done
    d=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}')
    [ -n "$d" ] && { printf '%s\tldconfig\n' "$(dirname "$d")"; return; }
    for d in /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
             /usr/local/lib /usr/lib64 /usr/local/cuda-*/lib /usr/local/cuda-*/lib64 /opt/conda/lib; do
        [ -f "$d/libnccl.so.2" ] && { printf '%s\t%s\n' "$d" "$d"; return; }
    done
}

# At exit: the table, then every log into $OUT/logs.tar.gz (the only file
# beside summary.txt), and the work folder removed.
finish() {
    local rc=$?
    if [ -s "$LOGS/table.tsv" ]; then
        say "measured (each figure next to its reference from this run):"
        awk -F'\t' '{ printf "  %-58s %-22s %s\n", $1, $2, $3 }' "$LOGS/table.tsv" | tee -a "$SUMMARY" >/dev/null
    fi
    save_logs
    rm -rf "$LOGS" "$WORK"
    exit $rc
}

run_prebuilt() {
    local P=$1
    P=$(cd "$P" 2>/dev/null && pwd) || die "no directory $1"
    [ -x "$P/bin/mfsdp-gpu-bench" ] || die "$P is not a tree made by --pack (no bin/mfsdp-gpu-bench)"
    mkdir -p "$OUT" || die "cannot create $OUT"
    SUMMARY=$OUT/summary.txt
    [ "${KEEP_SUMMARY:-0}" = 1 ] || : >"$SUMMARY" # self-build: keep its prerequisites and build lines
    LOGS=$(mktemp -d "${TMPDIR:-/tmp}/mfsdp-check-logs.XXXXXX") || die "cannot create a log folder"
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/mfsdp-check-work.XXXXXX") || die "cannot create a work folder"
    trap finish EXIT
    local B=$P/bin D=$P/data W=$WORK L=$LOGS
    CRASH_LIB=""
    [ -f "$P/lib/libmfsdp_crash.so" ] && CRASH_LIB=$P/lib/libmfsdp_crash.so
    export NCCL_DEBUG=${NCCL_DEBUG:-WARN}   # NCCL's warnings into each log
    say "mfsdp device check, $(date -u '+%Y-%m-%d %H:%M UTC'), prebuilt tree $P, budget ${BUDGET} s"
    sed 's/^/  /' "$P/MANIFEST" | tee -a "$SUMMARY" >/dev/null

    # ---- 0. probe ----
    stage "0. probe" 10
    local nccl="" nccl_dir="" rc
    NCCL_OK=0
    [ "${MFSDP_CHECK_NCCL_STUB:-0}" = 1 ] || nccl=$(find_nccl)
    nccl_dir=$(printf '%s' "$nccl" | cut -f1)
    if [ -n "$nccl_dir" ]; then
        export LD_LIBRARY_PATH="$P/lib:$nccl_dir:${LD_LIBRARY_PATH:-}"
        say "  nccl: $nccl_dir/libnccl.so.2 (found by $(printf '%s' "$nccl" | cut -f2))"
        NCCL_OK=1
    else
        export LD_LIBRARY_PATH="$P/lib:$P/nccl-stub:${LD_LIBRARY_PATH:-}"
        say "  nccl: none found on this machine (set NCCL_ROOT; MFSDP_CHECK_NCCL_STUB=${MFSDP_CHECK_NCCL_STUB:-0}): the stub; the NCCL checks are skipped, the rest runs on cuda-local"
    fi
    say "  glibc here: $(glibc_here || echo unknown)"
    if command -v nvidia-smi >/dev/null; then
        say "  nvidia-smi: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -1)"
        timeout 20 nvidia-smi -q >"$L/nvidia-smi-q.txt" 2>&1
        say "  nvidia-smi -q: $(wc -l <"$L/nvidia-smi-q.txt") lines in nvidia-smi-q.txt"
    else
        say "  nvidia-smi: not on this machine"
    fi
    say "  NCCL_DEBUG=$NCCL_DEBUG; crash reporter: ${CRASH_LIB:-none (a tree packed before it)}"
    run 30 "$L/probe.log" "$B/mfsdp-gpu-bench" probe
    rc=$?
    if [ $rc = 0 ]; then
        local peak_line
        say "  $(grep '^nccl version:' "$L/probe.log" | tail -1)"
        peak_line=$(grep '^hbm peak:' "$L/probe.log" | tail -1)
        if [ -z "$HBM_PEAK_GBS" ]; then
            HBM_PEAK_GBS=$(printf '%s' "$peak_line" | sed -n 's/^hbm peak: \([0-9]*\) GB\/s.*/\1/p')
            [ "${HBM_PEAK_GBS:-0}" -gt 0 ] 2>/dev/null || HBM_PEAK_GBS=""
            say "  ${peak_line:-hbm peak: not reported}"
        else
            say "  hbm peak: $HBM_PEAK_GBS GB/s (MFSDP_HBM_PEAK_GBS; the device says: ${peak_line#hbm peak: })"
        fi
        say "  [PASS] device: $(grep -v '^###' "$L/probe.log" | tail -1)"
    elif [ $rc = 77 ]; then
        say "  [SKIP] $(grep -v '^###' "$L/probe.log" | tail -1): every device stage is skipped"
        NOGPU=1
    else
        verdict "probe: the driver or the CUDA runtime fails (not a missing device)" $rc "$(grep -v '^###' "$L/probe.log" | tail -1)"
        NOGPU=1
    fi

    # ---- 1. kernels + the tests that need no GPU ----
    if stage "1. kernels (bit-exact vs host references) and the GPU tests that need no device" 20; then
        for t in test_gpu_plan test_gpu_guard test_gpu_errors test_cuda_convert test_trainer_check_local; do
            [ -x "$B/$t" ] || continue
            run 60 "$L/stage1.log" "$B/$t"
            verdict "$t" $?
        done
        run 60 "$L/stage1.log" "$B/test_cuda_kernels"
        rc=$?
        verdict "test_cuda_kernels (every dtype pair, aligned and not, graph capture, an event polled before a launch)" $rc
        if [ $rc != 77 ]; then
            grep -q '\[       OK \] test_poll_before_launch' "$L/stage1.log" && row "event polled while pending, then launches" "PASS" \
                "the first device run's stale cudaErrorNotReady" ||
                row "event polled while pending, then launches" "FAIL" "the first device run's stale cudaErrorNotReady"
        fi
    fi

    # ---- 2. replay oracle ----
    if stage "2. replay oracle (cuda-local, NCCL 1x1), device trainers, checkpoint, mfsdp-replay" 60; then
        if [ $NOGPU = 1 ]; then
            say "  [SKIP] test_gpu_replay, test_nccl_device, test_cuda_local_device, test_offload_device, test_whole_device, test_ckpt_gpu, mfsdp-replay: need a GPU"
        else
            run 90 "$L/stage2.log" env MFSDP_GPU_QUICK=1 "$B/test_gpu_replay"
            verdict "test_gpu_replay (modes x {1x1, 2x2, 2x4} x M {1, 3} on cuda-local; every mode on NCCL 1x1)" $?
            if [ "$NCCL_OK" = 1 ]; then
                run 60 "$L/stage2.log" "$B/test_nccl_device"
                verdict "test_nccl_device (NCCL 1x1: eager, CUDA graphs, global capture mode)" $?
            else
                say "  [SKIP] test_nccl_device: no NCCL on this machine"
            fi
            run 60 "$L/stage2.log" "$B/test_cuda_local_device"
            verdict "test_cuda_local_device (thread-ranks on one GPU, every mode on 1x4, 2x2, 2x4, 2x2x2)" $?
            run 60 "$L/stage2.log" env MFSDP_GPU_NCCL_OK="$NCCL_OK" "$B/test_offload_device"
            verdict "test_offload_device (MFSDP_FLAG_OFFLOAD_MAIN on cuda-local: main_weight and the gradient mirror in pinned host memory, master weights bit-identical to a run without it)" $?
            run 60 "$L/stage2.log" "$B/test_whole_device"
            verdict "test_whole_device (a whole bucket's reduce_scatter, all_gather and all_reduce on cuda-local 1-D x4 and 2x2: the prefix form bit for bit the padded form, padding zero)" $?
            local t0 t1
            t0=$(date +%s%N)
            run 20 "$L/stage2.log" "$B/mfsdpc" compile "$D/hsdp_4x2.mfsdp" -o "$W/hsdp_4x2.yaml" &&
                run 60 "$L/stage2.log" "$B/test_ckpt_gpu" "$W/hsdp_4x2.yaml" "$W"
            rc=$?
            t1=$(date +%s%N)
            verdict "test_ckpt_gpu (checkpoint save + load, Hugging Face export + import on cuda-local 4 x 2 HSDP: device buffers through the stage hook, bit for bit)" $rc
            row "checkpoint save+load+HF round trip, device buffers" \
                "$([ $rc = 0 ] && echo PASS || echo FAIL), $(( (t1 - t0) / 1000000 )) ms" "cuda-local 4x2 HSDP, wall time"
            local y name heavy=""
            for y in "$D"/schedules/*.yaml; do
                [ -f "$y" ] || continue
                name=$(basename "$y" .yaml)
                case $name in
                    llama3_8b_hfsdp) say "  [SKIP] $name: 32 ranks x 8B parameters do not fit one GPU"; continue;;
                    deepseek_moe) heavy=$y; continue;; # 8 ranks x 410 MB of managed memory: last, if time is left
                esac
                [ "$(left)" -lt 150 ] && { say "  [SKIP] mfsdp-replay $name: time budget"; continue; }
                run 30 "$L/stage2.log" "$B/mfsdp-replay" "$y" --backend cuda-local --steps 2 --timeout-ms 25000 --quiet
                verdict "mfsdp-replay $name --backend cuda-local" $?
            done
            if [ "$NCCL_OK" = 1 ]; then
                run 20 "$L/stage2.log" "$B/mfsdpc" compile "$D/hfsdp_1x1.mfsdp" -o "$W/hfsdp_1x1.yaml" &&
                    run 40 "$L/stage2.log" "$B/mfsdp-replay" "$W/hfsdp_1x1.yaml" --backend nccl --steps 3 --timeout-ms 30000 --quiet
                verdict "mfsdp-replay hfsdp_1x1 --backend nccl" $?
                # A Whole schedule (ragged shards, mfsdp-schedule/7): each whole
                # collective one nested ncclGroupStart/End in the chunked form, the only
                # one a ragged bucket has (MFSDP_WHOLE_COLLECTIVES=padded is refused).
                local form
                if run 20 "$L/stage2.log" "$B/mfsdpc" compile "$D/whole_1x1.mfsdp" -o "$W/whole_1x1.yaml"; then
                    for form in prefix; do
                        run 40 "$L/stage2.log" env MFSDP_WHOLE_COLLECTIVES=$form "$B/mfsdp-replay" "$W/whole_1x1.yaml" \
                            --backend nccl --steps 3 --timeout-ms 30000 --quiet
                        verdict "mfsdp-replay whole_1x1 --backend nccl, MFSDP_WHOLE_COLLECTIVES=$form" $?
                    done
                else
                    verdict "mfsdpc compile whole_1x1" 1
                fi
            else
                say "  [SKIP] mfsdp-replay --backend nccl: no NCCL on this machine"
            fi
            if [ -n "$heavy" ]; then
                if [ "$(left)" -ge 200 ]; then
                    run 60 "$L/stage2.log" "$B/mfsdp-replay" "$heavy" --backend cuda-local --steps 1 --timeout-ms 50000 --quiet
                    verdict "mfsdp-replay deepseek_moe --backend cuda-local (1 step: 8 ranks x 410 MB managed)" $?
                else
                    say "  [SKIP] mfsdp-replay deepseek_moe: needs 200 s of budget, $(left) s left"
                fi
            fi
        fi
    fi

    # The 1-rank llama-shaped schedule of stages 3, 4 and 6.
    local LLAMA=$W/llama_1x1.yaml
    run 20 "$L/compile.log" "$B/mfsdpc" compile "$D/llama_1x1.mfsdp" -o "$LLAMA"
    verdict "mfsdpc compile llama_1x1" $?

    # ---- 3. overlap observed vs simulated ----
    if stage "3. overlap: measured on the device vs mfsdpc simulate" 30; then
        local U=${MFSDP_CHECK_UNIT_US:-200} sim be flag what
        run 30 "$L/simulate.txt" "$B/mfsdpc" simulate "$LLAMA" --unit-time-us "$U" --host-async \
            --trace "$L/simulate-trace.json"
        verdict "mfsdpc simulate --unit-time-us $U --host-async" $?
        sim=$(overlap_in "$L/simulate.txt")
        row "overlap simulated (mfsdpc simulate, ${U} us per unit)" "${sim:-n/a}" "the model the measured rows are read against"
        sed -n '/^step time/,/^communication/p' "$L/simulate.txt" | sed 's/^/    /' | tee -a "$SUMMARY" >/dev/null
        if [ $NOGPU = 1 ]; then
            say "  [SKIP] measured overlap: needs a GPU"
        else
            for be in nccl local; do
                if [ $be = nccl ] && [ "$NCCL_OK" != 1 ]; then
                    say "  [SKIP] measured overlap on NCCL: no NCCL on this machine"
                    continue
                fi
                flag=() what='NCCL world of one'
                [ $be = local ] && flag=(--local) what='cuda-local 1 rank'
                run 45 "$L/overlap-$be.txt" "$B/mfsdp-gpu-bench" "${flag[@]}" overlap "$LLAMA" \
                    --unit-us "$U" --trace "$L/overlap-trace-$be.json"
                verdict "measured overlap, $what device trainer" $?
                sed -n '/^measured/,/^  overlap/p' "$L/overlap-$be.txt" | sed 's/^/    /' | tee -a "$SUMMARY" >/dev/null
                row "inner/outer overlap, $what" "$(overlap_in "$L/overlap-$be.txt")" "simulated: ${sim:-n/a}"
            done
        fi
        # Four thread-ranks on this GPU (2 x 2 HFSDP): collectives that move data
        # between ranks, all ranks' compute at once.
        local L22=$W/llama_2x2.yaml sim22
        if run 20 "$L/compile-2x2.log" "$B/mfsdpc" compile "$D/llama_2x2.mfsdp" -o "$L22"; then
            run 30 "$L/simulate-2x2.txt" "$B/mfsdpc" simulate "$L22" --unit-time-us "$U" --host-async
            verdict "mfsdpc simulate llama_2x2 --unit-time-us $U --host-async" $?
            sim22=$(overlap_in "$L/simulate-2x2.txt")
            if [ $NOGPU = 1 ]; then
                say "  [SKIP] measured overlap on 4 thread-ranks: needs a GPU"
            else
                run 45 "$L/overlap-local-2x2.txt" "$B/mfsdp-gpu-bench" --local overlap "$L22" \
                    --unit-us "$U" --trace "$L/overlap-trace-local-2x2.json"
                verdict "measured overlap, cuda-local 4 thread-ranks (2 x 2 HFSDP)" $?
                sed -n '/^measured/,/^  every rank/p' "$L/overlap-local-2x2.txt" | sed 's/^/    /' |
                    tee -a "$SUMMARY" >/dev/null
                row "inner/outer overlap, cuda-local 4 thread-ranks (2x2), rank 0" \
                    "$(overlap_in "$L/overlap-local-2x2.txt")" \
                    "simulated (default links): ${sim22:-n/a}; every rank: $(sed -n 's/^  every rank: //p' "$L/overlap-local-2x2.txt")"
            fi
        else
            verdict "mfsdpc compile llama_2x2" 1
        fi
    fi

    # ---- 4. ordering stress ----
    if stage "4. ordering stress (spin kernel on one stream at a time)" 20; then
        run 45 "$L/stress.txt" "$B/mfsdp-gpu-bench" --local stress "$LLAMA"
        verdict "mfsdp-gpu-bench --local stress (cuda-local)" $?
        if [ "$NCCL_OK" = 1 ]; then
            run 45 "$L/stress.txt" "$B/mfsdp-gpu-bench" stress "$LLAMA"
            verdict "mfsdp-gpu-bench stress (NCCL)" $?
        fi
        grep 'spin on' "$L/stress.txt" | sed 's/^/  /' | tee -a "$SUMMARY" >/dev/null
    fi

    # ---- 5. bandwidth ----
    if stage "5. kernel bandwidth vs cudaMemcpyAsync and the HBM peak (64 KiB .. 1 GiB)" 20; then
        run 45 "$L/bandwidth.txt" "$B/mfsdp-gpu-bench" sweep --mib 1024
        verdict "mfsdp-gpu-bench sweep" $?
        grep -E '^ +[0-9]+ KiB|per operand' "$L/bandwidth.txt" | sed 's/^/  /' | tee -a "$SUMMARY" >/dev/null
        # the largest aligned size: memcpy, cast->bf16, acc f32 (GB/s)
        local big mc cast acc
        big=$(grep -E '^ +[0-9]+ KiB +yes' "$L/bandwidth.txt" | tail -1)
        if [ -n "$big" ]; then
            read -r mc cast acc <<<"$(echo "$big" | awk '{print $(NF-2), $(NF-1), $NF}')"
            local peak_txt="the HBM peak is unknown"
            [ -n "$HBM_PEAK_GBS" ] && peak_txt="$(ratio "$mc" "$HBM_PEAK_GBS") of the ${HBM_PEAK_GBS} GB/s HBM peak"
            row "cudaMemcpyAsync D2D, $(echo "$big" | awk '{print $1, $2}') per operand" "$mc GB/s" "$peak_txt"
            row "cast fp32->bf16 kernel" "$cast GB/s" \
                "$(ratio "$cast" "$mc") of memcpy, $(ratio "$cast" "$HBM_PEAK_GBS") of HBM peak ${HBM_PEAK_GBS:-unknown} GB/s"
            row "accumulate fp32 kernel" "$acc GB/s" \
                "$(ratio "$acc" "$mc") of memcpy, $(ratio "$acc" "$HBM_PEAK_GBS") of HBM peak ${HBM_PEAK_GBS:-unknown} GB/s"
        fi
    fi

    # ---- 6. host time per hook and per op ----
    if stage "6. host time per hook/op, eager and CUDA graphs" 20; then
        if [ "$NCCL_OK" = 1 ]; then
            run 60 "$L/hooks.txt" "$B/mfsdp-gpu-bench" hooks "$LLAMA" --steps 10 --graphs
            verdict "mfsdp-gpu-bench hooks --graphs (NCCL: eager on a runtime without MFSDP_NCCL_GRAPHS, then graphs on one with it)" $?
        else
            run 60 "$L/hooks.txt" "$B/mfsdp-gpu-bench" --local hooks "$LLAMA" --steps 10
            verdict "mfsdp-gpu-bench --local hooks (no NCCL here: cuda-local, no graphs)" $?
        fi
        sed -n '/^hooks:/,$p' "$L/hooks.txt" | sed 's/^/  /' | tee -a "$SUMMARY" >/dev/null
        local he hg de dg
        he=$(sed -n 's/.*host time per step (eager, hooks + fills): \([0-9.]*\) us.*/\1/p' "$L/hooks.txt")
        hg=$(sed -n 's/.*host time per step (3 CUDA graphs): \([0-9.]*\) us.*/\1/p' "$L/hooks.txt")
        de=$(sed -n 's/.*device time per step (eager): median \([0-9.]*\) ms.*/\1/p' "$L/hooks.txt")
        dg=$(sed -n 's/.*device time per step (3 CUDA graphs): median \([0-9.]*\) ms.*/\1/p' "$L/hooks.txt")
        [ -n "$he$hg" ] && row "host us per step, CUDA graphs" "${hg:-n/a} us" "eager: ${he:-n/a} us ($(ratio "$hg" "$he"))"
        [ -n "$de$dg" ] && row "device ms per step, CUDA graphs" "${dg:-n/a} ms" "eager: ${de:-n/a} ms ($(ratio "$dg" "$de"))"
        local per_op
        per_op=$(sed -n 's/.*host time in hooks per op (eager): \([0-9.]*\) us.*/\1/p' "$L/hooks.txt")
        [ -n "$per_op" ] && row "host us in hooks per op, eager" "$per_op us" "$(grep -o '([0-9]* ops per step)' "$L/hooks.txt" | head -1)"
    fi

    if [ $FAILED = 1 ]; then
        say "done in $(elapsed) s: some check failed, timed out or was cut (logs: $OUT/logs.tar.gz)"
        exit 1
    elif [ $NOGPU = 1 ]; then
        say "done in $(elapsed) s: no GPU here; the checks that need none passed, the device stages were skipped"
        exit 77
    fi
    say "done in $(elapsed) s: every stage passed"
    exit 0
}

# ------------------------------------------------------------ rehearsal ----
# rehearse BUILD: pack, then run the packed tree as the device tool will (see
# the top); checks what comes back. Exit 0 when the rehearsal holds (the run
# itself exited 77 without a GPU, or 0 with one), else 1.
#
# MFSDP_REHEARSE_ROOT=DIR: the run is chrooted into DIR, a root with an older
# glibc (pack-in-bullseye.sh's Debian 11): the tree is seen to load there.
rehearse() {
    local src=$1 T jail=${MFSDP_REHEARSE_ROOT:-} in
    if [ -n "$jail" ]; then
        [ -x "$jail/bin/bash" ] && [ -d "$jail/tmp" ] || die "MFSDP_REHEARSE_ROOT=$jail is not a root (no bin/bash, tmp)"
        [ "$(id -u)" = 0 ] || die "MFSDP_REHEARSE_ROOT needs root (chroot)"
        jail=$(cd "$jail" && pwd)
        T=$(mktemp -d "$jail/tmp/mfsdp-rehearse.XXXXXX") || die "cannot create a temporary folder in $jail/tmp"
        in=${T#"$jail"}   # T as the run sees it
    else
        T=$(mktemp -d "${TMPDIR:-/tmp}/mfsdp-rehearse.XXXXXX") || die "cannot create a temporary folder"
        in=$T
    fi
    # shellcheck disable=SC2064
    trap "rm -rf '$T'" EXIT
    fail() { echo "device-check --rehearse: $*" >&2; [ -f "$T/out/summary.txt" ] && sed 's/^/  | /' "$T/out/summary.txt" >&2; exit 1; }
    if [ -f "$src/MANIFEST" ] && [ -x "$src/bin/mfsdp-gpu-bench" ]; then
        cp -a "$src" "$T/pack" || fail "cannot copy $src"   # packed already (pack-in-bullseye.sh)
    else
        (pack "$src" "$T/pack") >"$T/pack.log" 2>&1 || { cat "$T/pack.log" >&2; fail "--pack failed"; }
    fi
    local f
    for f in bin/mfsdp-gpu-bench bin/mfsdpc bin/mfsdp-replay bin/test_cuda_kernels bin/test_gpu_guard \
             bin/test_trainer_check_local nccl-stub/libnccl.so.2 data/llama_1x1.mfsdp device-check.sh MANIFEST; do
        [ -e "$T/pack/$f" ] || fail "the packed tree has no $f"
    done
    for f in libcudart.so libyaml libcmocka; do compgen -G "$T/pack/lib/$f*" >/dev/null || fail "$f is not carried"; done
    for f in libc.so libstdc++ libgcc_s libevent libnccl.so; do
        compgen -G "$T/pack/lib/$f*" >/dev/null && fail "$f must not be carried (the image's, or a stub)"
    done
    nm -D --defined-only "$T/pack/nccl-stub/libnccl.so.2" | grep -q ' ncclCommSplit$' || fail "the NCCL stub lacks ncclCommSplit"
    local kib glibc glibcxx
    kib=$(du -sk "$T/pack" | cut -f1)
    glibc=$(highest_version GLIBC "$T"/pack/bin/* "$T"/pack/lib/* "$T"/pack/nccl-stub/*.so*)
    glibcxx=$(highest_version GLIBCXX "$T"/pack/bin/* "$T"/pack/lib/*)
    [ "$kib" -le $((MAX_PACK_MIB * 1024)) ] || fail "the packed tree is $kib KiB, over $MAX_PACK_MIB MiB"
    # The device tool sends the checkout with the carried tree: 64 MiB together.
    local root repo_kib=0
    root=$(cd "$(dirname "$SELF")/../.." && pwd)
    if git -C "$root" rev-parse >/dev/null 2>&1; then
        repo_kib=$(cd "$root" && git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
        [ $((kib + repo_kib)) -le $((MAX_PACK_MIB * 1024)) ] ||
            fail "the checkout ($repo_kib KiB) and the packed tree ($kib KiB) are over the $MAX_PACK_MIB MiB that travel"
    fi
    version_le "$glibc" "$GLIBC_FLOOR" || fail "the packed tree needs GLIBC_$glibc, over the floor $GLIBC_FLOOR"
    version_le "$glibcxx" "$GLIBCXX_FLOOR" || fail "the packed tree needs GLIBCXX_$glibcxx, over the floor $GLIBCXX_FLOOR"
    # What travels: a copy of the tree (the device tool copies the checkout
    # and the carried paths); nothing of this machine's build is reachable.
    mkdir -p "$T/device/repo" "$T/out" || fail "cannot lay out the rehearsal"
    cp -a "$T/pack" "$T/device/repo/pack" || fail "cannot copy the packed tree"
    # Where NCCL would come from on the device: a pip wheel's layout found
    # through python3 (here the stub stands in for the real library, so the
    # NCCL checks are exercised up to loading it).
    local py=""
    if command -v python3 >/dev/null; then
        mkdir -p "$T/device/site/nvidia/nccl/lib" && : >"$T/device/site/nvidia/__init__.py" &&
            : >"$T/device/site/nvidia/nccl/__init__.py" &&
            cp "$T/pack/nccl-stub/libnccl.so.2" "$T/device/site/nvidia/nccl/lib/" && py=$in/device/site
    fi
    local net=(-n)
    unshare -n true 2>/dev/null || { net=(); echo "device-check --rehearse: unshare -n is not allowed here: the network stays on" >&2; }
    local run=(env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$in/device"
               TMPDIR="$in/device" OUT="$in/out" ${py:+PYTHONPATH="$py"}
               MFSDP_CHECK_BUDGET_S="${MFSDP_CHECK_BUDGET_S:-360}"
               bash -c 'cd "$1" && exec bash pack/device-check.sh --prebuilt pack' run "$in/device/repo")
    if [ -n "$jail" ]; then
        # shellcheck disable=SC2016
        run=(unshare -m --propagation private "${net[@]}" bash -c \
             'mount --bind /proc "$1/proc" && mount --bind /dev "$1/dev" && j=$1 && shift && exec chroot "$j" "$@"' \
             jail "$jail" "${run[@]}")
    elif [ ${#net[@]} -gt 0 ]; then
        run=(unshare -n "${run[@]}")
    fi
    local t0 rc
    t0=$(date +%s)
    timeout 450 "${run[@]}" >"$T/run.log" 2>&1   # the timeout_s to give the device tool
    rc=$?
    local secs=$(( $(date +%s) - t0 ))
    local S=$T/out/summary.txt
    [ -f "$S" ] || { cat "$T/run.log" >&2; fail "no summary.txt came back (exit $rc)"; }
    # What comes back: at most 8 plain files, 16 MiB each, 64 MiB together,
    # at most 2 folders down, names of letters, digits, '.', '_', '-'.
    local n bytes bad
    n=$(find "$T/out" -mindepth 1 -not -type d | wc -l)
    [ "$n" -le $OUT_MAX_FILES ] || fail "\$OUT holds $n files (the device tool brings back $OUT_MAX_FILES): $(cd "$T/out" && find . -not -type d | tr '\n' ' ')"
    bad=$(cd "$T/out" && find . -mindepth 1 \( -not -type f -not -type d \) -o -mindepth 3 -type f -o -size +16M |
          head -3; cd "$T/out" && find . -mindepth 1 | sed 's|^\./||' | tr '/' '\n' | grep -v '^[A-Za-z0-9._-]*$' | head -3)
    [ -z "$bad" ] || fail "\$OUT holds what the device tool does not bring back: $bad"
    bytes=$(du -sb "$T/out" | cut -f1)
    [ "$bytes" -le $((64 * 1024 * 1024)) ] || fail "\$OUT holds $bytes bytes, over 64 MiB"
    [ -f "$T/out/logs.tar.gz" ] || fail "no logs.tar.gz"
    tar -tzf "$T/out/logs.tar.gz" | grep -q 'probe.log' || fail "logs.tar.gz lacks probe.log"
    grep -q 'NCCL_DEBUG=WARN; crash reporter: .*libmfsdp_crash.so' "$S" || fail "the run did not preload the crash reporter"
    [ -f "$T/pack/lib/libmfsdp_crash.so" ] || fail "the packed tree has no lib/libmfsdp_crash.so"
    for f in "0. probe" "1. kernels" "2. replay oracle" "3. overlap" "4. ordering stress" "5. kernel bandwidth" \
             "6. host time" "done in"; do
        grep -q "$f" "$S" || fail "the summary has no '$f'"
    done
    grep -q '\[FAIL\]\|\[TIMEOUT\]' "$S" && fail "a check failed"
    grep -q '^measured (each figure next to its reference' "$S" || fail "the summary has no table of figures"
    if [ -n "$py" ]; then
        grep -q "nccl: $py/nvidia/nccl/lib/libnccl.so.2 (found by .*nvidia.nccl)" "$S" ||
            fail "find_nccl did not find the wheel's libnccl.so.2 through python3"
    fi
    case $rc in
        77) for f in test_gpu_guard test_gpu_errors test_gpu_plan test_cuda_convert test_trainer_check_local \
                     "mfsdpc simulate --unit" "mfsdpc simulate llama_2x2"; do
                grep -q "\[PASS\] $f" "$S" || fail "'$f' did not pass"
            done
            grep -q "no NVIDIA driver library\|the runtime counts none" "$S" || fail "the probe did not say why it skipped";;
        0) ;;
        *) cat "$T/run.log" >&2; fail "--prebuilt exited $rc (want 77 without a GPU, 0 with one)";;
    esac
    local where
    where="on this machine's glibc $(glibc_here)"
    if [ -n "$jail" ]; then
        local jg
        jg=$(chroot "$jail" ldd --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*$')
        grep -q "glibc here: $jg\$" "$S" || fail "the run did not report the root's glibc ($jg)"
        where="chrooted in $jail, on its glibc $jg"
    fi
    echo "device-check --rehearse: passed: the run exited $rc in $secs s (budget ${MFSDP_CHECK_BUDGET_S:-360} s)" \
         "$([ ${#net[@]} -gt 0 ] && echo 'without network' || echo 'WITH network (unshare unavailable)')," \
         "$where; $n files came back ($bytes bytes)"
    echo "  packed tree: $((kib / 1024)) MiB ($kib KiB); with the checkout $(( (kib + repo_kib) / 1024 )) MiB (limit $MAX_PACK_MIB MiB)"
    echo "  glibc needed: GLIBC_${glibc:-none} (floor GLIBC_$GLIBC_FLOOR); libstdc++: ${glibcxx:+GLIBCXX_}${glibcxx:-no versioned symbol} (floor GLIBCXX_$GLIBCXX_FLOOR)"
    echo "  carried: $(ls "$T/pack/lib" | tr '\n' ' ')"
    echo "  $(grep '^commit:' "$T/pack/MANIFEST"); $(grep '^packed:' "$T/pack/MANIFEST")"
    echo "  the run's summary.txt:"
    sed 's/^/  | /' "$S"
}

# ----------------------------------------------------------- self-build ----
self_build() {
    local ROOT
    ROOT=$(cd "$(dirname "$SELF")/../.." && pwd)
    mkdir -p "$OUT" || die "cannot create $OUT"
    SUMMARY=$OUT/summary.txt
    : >"$SUMMARY"
    BUDGET=$((BUDGET + 330)) # the prerequisites and the build's time boxes come first
    local BUILD=${MFSDP_BUILD_DIR:-$ROOT/build-device} DEPS=${MFSDP_DEPS_PREFIX:-/tmp/mfsdp-device-deps}
    local DEBS=${MFSDP_DEBS:-$ROOT/.gpu-debs} MISSING=""
    say "mfsdp device check (self-building), $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    stage "prerequisites" 10 || exit 1
    if command -v cmake >/dev/null; then
        local v
        v=$(cmake --version | head -1 | grep -o '[0-9][0-9.]*' | head -1)
        if [ "$(printf '%s\n3.25\n' "$v" | sort -V | head -1)" != 3.25 ]; then
            MISSING="$MISSING cmake>=3.25(have-$v)"
        fi
    else
        MISSING="$MISSING cmake>=3.25"
    fi
    local NVCC
    NVCC=$(command -v nvcc || true)
    [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
    [ -z "$NVCC" ] && MISSING="$MISSING nvcc"
    local CC_ARCH=""
    command -v nvidia-smi >/dev/null &&
        CC_ARCH=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    local ARCHS="80;90"
    [ -n "$CC_ARCH" ] && [ "$CC_ARCH" != 80 ] && [ "$CC_ARCH" != 90 ] && ARCHS="80;90;$CC_ARCH"
    local NCCL_PREFIX="" d
    for d in "${NCCL_ROOT:-}" /usr/local/cuda /usr /usr/local; do
        if [ -n "$d" ] && [ -f "$d/include/nccl.h" ]; then NCCL_PREFIX=$d; break; fi
    done
    if [ -z "$NCCL_PREFIX" ]; then # a pip wheel keeps include/ beside lib/
        d=$(dirname "$(find_nccl | cut -f1)")
        [ -f "$d/include/nccl.h" ] && NCCL_PREFIX=$d
    fi
    [ -z "$NCCL_PREFIX" ] && MISSING="$MISSING nccl(include/nccl.h;set-NCCL_ROOT)"
    have_build_deps() {
        command -v flex >/dev/null && command -v bison >/dev/null && command -v pkg-config >/dev/null &&
            pkg-config --exists yaml-0.1 cmocka 2>/dev/null
    }
    if ! have_build_deps && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "  build dependencies: trying apt-get (60 s limit; this machine may be offline)"
        timeout 60 apt-get install -y --no-install-recommends flex bison m4 pkgconf libyaml-dev libcmocka-dev \
            >>"$OUT/build.log" 2>&1 || say "  apt-get failed (see build.log)"
    fi
    if ! have_build_deps && ls "$DEBS"/*.deb >/dev/null 2>&1; then
        say "  build dependencies: unpacking $(ls "$DEBS"/*.deb | wc -l) packages from $DEBS into $DEPS/root"
        local R=$DEPS/root pc f
        mkdir -p "$R"
        for f in "$DEBS"/*.deb; do dpkg-deb -x "$f" "$R" || say "  cannot unpack $f"; done
        for pc in "$R"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$R"/usr/share/pkgconfig/*.pc; do
            [ -f "$pc" ] && sed -i -e "s|=/usr\\b|=$R/usr|g" -e "s|-L/usr/|-L$R/usr/|g" -e "s|-I/usr/|-I$R/usr/|g" "$pc"
        done
        [ -e "$R/usr/bin/pkg-config" ] || ln -sf pkgconf "$R/usr/bin/pkg-config"
        export PATH="$R/usr/bin:$PATH"
        export PKG_CONFIG_PATH="$R/usr/lib/x86_64-linux-gnu/pkgconfig:$R/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
        export LD_LIBRARY_PATH="$R/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
        export M4="$R/usr/bin/m4" BISON_PKGDATADIR="$R/usr/share/bison"
        export CMAKE_PREFIX_PATH="$R/usr:${CMAKE_PREFIX_PATH:-}"
    fi
    command -v flex >/dev/null || MISSING="$MISSING flex"
    command -v bison >/dev/null || MISSING="$MISSING bison"
    if command -v pkg-config >/dev/null; then
        pkg-config --exists yaml-0.1 || MISSING="$MISSING libyaml-dev"
        pkg-config --exists cmocka || MISSING="$MISSING libcmocka-dev"
    else
        MISSING="$MISSING pkg-config libyaml-dev libcmocka-dev"
    fi
    if [ -n "$MISSING" ]; then
        say "[FAIL] missing:$MISSING"
        say "  Without network: bash tests/gpu/device-check.sh --fetch-debs .gpu-debs on a machine with apt,"
        say "  or build elsewhere: device-check.sh --pack BUILD DIR there, device-check.sh --prebuilt DIR here."
        exit 2
    fi
    say "[PASS] prerequisites: cmake $(cmake --version | head -1 | grep -o '[0-9][0-9.]*' | head -1), $("$NVCC" --version | tail -1), CUDA architectures $ARCHS (t=$(elapsed) s)"
    stage "build" 60 || exit 1
    local args=(-S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMFSDP_WERROR=OFF -DMFSDP_WITH_MPI=OFF
                "-DCMAKE_C_FLAGS_RELEASE=-O3 -DNDEBUG -g" "-DCMAKE_CXX_FLAGS_RELEASE=-O3 -DNDEBUG -g"
                -DMFSDP_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS"
                -DNCCL_ROOT="$NCCL_PREFIX")
    [ ! -f "$BUILD/CMakeCache.txt" ] && command -v ninja >/dev/null && args+=(-G Ninja) # keep an existing tree's
    if run 90 "$OUT/build.log" cmake "${args[@]}" && grep -q "NCCL/CUDA backend ON" "$OUT/build.log" &&
       run 240 "$OUT/build.log" cmake --build "$BUILD" -j "$(nproc)"; then
        say "[PASS] build: $(grep -c 'warning:' "$OUT/build.log") compiler warnings (t=$(elapsed) s)"
    else
        say "[FAIL] build (see $OUT/build.log); last lines:"
        tail -15 "$OUT/build.log" | sed 's/^/  /' | tee -a "$SUMMARY" >/dev/null
        exit 1
    fi
    # Built here to run here: the floors are this machine's own glibc and libstdc++.
    [ -n "${MFSDP_GLIBC_FLOOR:-}" ] || GLIBC_FLOOR=$(glibc_here)
    [ -n "${MFSDP_GLIBCXX_FLOOR:-}" ] || GLIBCXX_FLOOR=$(glibcxx_here)
    (pack "$BUILD" "$BUILD/prebuilt") >>"$OUT/build.log" 2>&1 || { say "[FAIL] pack (see build.log)"; exit 1; }
    KEEP_SUMMARY=1 run_prebuilt "$BUILD/prebuilt"
}

case "${1:-}" in
    --pack)
        [ $# = 3 ] || die "usage: device-check.sh --pack BUILD DIR"
        pack "$2" "$3"
        ;;
    --prebuilt)
        [ $# = 2 ] || die "usage: device-check.sh --prebuilt DIR"
        run_prebuilt "$2"
        ;;
    --rehearse)
        [ $# = 2 ] || die "usage: device-check.sh --rehearse BUILD|PACKED"
        rehearse "$2"
        ;;
    --fetch-debs)
        dir=${2:-.gpu-debs}
        mkdir -p "$dir" && cd "$dir" || exit 2
        apt-get download flex libfl2 libfl-dev bison m4 libyaml-0-2 libyaml-dev libcmocka0 libcmocka-dev pkgconf \
            pkgconf-bin libpkgconf3 || die "apt-get download failed"
        echo "device-check: $(ls ./*.deb | wc -l) packages in $dir; carry that folder to the GPU machine"
        ;;
    "")
        self_build
        ;;
    *)
        die "unknown argument '$1' (usage: device-check.sh [--pack BUILD DIR | --prebuilt DIR | --rehearse BUILD|PACKED | --fetch-debs D])"
        ;;
esac
