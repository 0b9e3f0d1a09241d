/*
 * mfsdp-gpu-bench: the numbers tests/gpu/device-check.sh records (not a test:
 * timings are never asserted).
 *
 *   mfsdp-gpu-bench kernels [--mib N]
 *       device bandwidth of the runtime's kernels (cast fp32->bf16, accumulate
 *       fp32+=fp32 and fp32+=bf16, the 4-way reduce of the one-GPU backend)
 *       against cudaMemcpyAsync device-to-device, counting bytes read plus
 *       bytes written; median of 20 timed runs after 3 warm-ups (CUDA events).
 *   mfsdp-gpu-bench sweep [--mib N]
 *       the same for 64 KiB ... N MiB per operand (default 1024: past any
 *       L2, the H100's 50 MB included; x4 steps; capped by free memory),
 *       16-byte aligned and misaligned by 4 bytes: cudaMemcpyAsync, cast
 *       fp32->bf16, accumulate fp32 += fp32 (median of 11 batches of 10
 *       launches); the HBM peak it is read against (see probe).
 *   mfsdp-gpu-bench hooks SCHEDULE.yaml [--steps S] [--graphs]
 *       a 1-rank schedule on the NCCL backend driven like a CUDA trainer
 *       (device buffers, its own compute stream, grad_local written by a
 *       kernel): host time of every hook call by phase (median, p99, max, in
 *       microseconds), host time per op and per step, the device time of a
 *       step (a runtime without MFSDP_NCCL_GRAPHS), and with --graphs the
 *       host and device time of a step replayed as three CUDA graphs (a
 *       second runtime, with the flag).
 *   mfsdp-gpu-bench stress SCHEDULE.yaml
 *       ordering stress: the same 1-rank device trainer runs two steps from
 *       the same state four times: plainly, then with a 20 us spin kernel
 *       enqueued on the compute, the inner, then the outer stream before every
 *       hook. Every unsharded weight and delivered gradient must be bit-equal
 *       to the plain run's: a missing event edge shows up as a difference.
 *   mfsdp-gpu-bench overlap SCHEDULE.yaml [--unit-us U] [--trace FILE.json]
 *       overlap as observed: one step of a device trainer whose compute is
 *       a spin kernel of U us per unit forward (2U backward), every op timed
 *       with CUDA events on its stream (MFSDP_NCCL_TIMELINE): step time,
 *       compute idle, per-stream busy / exposed / hidden and overlap, the
 *       figures `mfsdpc simulate --unit-time-us U --host-async` predicts;
 *       exposed = communication busy while compute is idle. With --local the
 *       schedule may have any number of ranks: each runs as a thread-rank on
 *       this GPU, all at once; rank 0's figures, then every rank's overlap.
 *       Chrome trace, one process per rank.
 *   mfsdp-gpu-bench probe
 *       the device: name, compute capability, memory, driver and runtime,
 *       NCCL's version, and the HBM peak: from the device
 *       (cudaDevAttrMemoryClockRate x cudaDevAttrGlobalMemoryBusWidth x 2,
 *       double data rate), else by name (H100 3350, H200 4800 GB/s), else
 *       unknown; the line says which.
 *
 * hooks, stress and overlap run on NCCL (a world of one); with --local on the
 * one-GPU thread-rank backend (cuda-local; a group of one except for
 * overlap; no graphs).
 *
 * Exit status: 0, 1 on a failure (stress: a difference), 2 on a usage error,
 * 77 without a GPU.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_presence.h"
#include "mf_cuda_kernels.h"
#include "mf_opts.h"
#include "mfsdp_nccl.h"

/* What the bench is doing (subcommand, mode, M, the stream spun on, ...):
 * every failure message names it. */
static char bench_ctx[256] = "starting";

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "mfsdp-gpu-bench: %s: %s:%d: %s: %s\n", bench_ctx, __FILE__, __LINE__, \
                    #x, cudaGetErrorString(e_));                                                \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

#define MF(x)                                                                                   \
    do {                                                                                        \
        mfsdp_result r_ = (x);                                                                  \
        if (r_ != MFSDP_OK) {                                                                   \
            fprintf(stderr, "mfsdp-gpu-bench: %s: %s: %s: %s\n", bench_ctx, #x,                   \
                    mfsdp_result_string(r_), mfsdp_last_error(rt));                             \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- kernels ---- */

typedef enum { K_MEMCPY, K_CAST, K_ACC32, K_ACC16, K_REDUCE4 } kernel;

static void launch(kernel k, void **buf, int64_t n, cudaStream_t s)
{
    switch (k) {
    case K_MEMCPY: CK(mf_cuda_copy(buf[1], buf[0], (size_t)n * 4, s)); break;
    case K_CAST: CK(mf_cuda_cast(buf[5], MF_BF16, buf[0], MF_FP32, n, s)); break;
    case K_ACC32: CK(mf_cuda_accumulate(buf[1], MF_FP32, buf[0], MF_FP32, n, false, s)); break;
    case K_ACC16: CK(mf_cuda_accumulate(buf[1], MF_FP32, buf[5], MF_BF16, n, false, s)); break;
    case K_REDUCE4: {
        const void *src[4] = {buf[0], buf[2], buf[3], buf[4]};
        void *dst[1] = {buf[1]};
        CK(mf_cuda_combine(dst, 1, MF_FP32, src, 4, MF_FP32, n, 4.0f, MF_CUDA_DIV, false, s));
        break;
    }
    }
}

static int run_kernels(int64_t mib)
{
    int64_t n = mib * 1024 * 1024 / 4; /* fp32 elements */
    void *buf[6];
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 5; i++) {
        CK(cudaMalloc(&buf[i], (size_t)n * 4));
        CK(mf_cuda_fill_pattern(buf[i], MF_FP32, n, (uint32_t)i + 1, s)); /* never time zeros */
    }
    CK(cudaMalloc(&buf[5], (size_t)n * 2));
    CK(mf_cuda_fill_pattern(buf[5], MF_BF16, n, 9, s));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    static const struct {
        kernel k;
        const char *name;
        double bytes_per_elem; /* read + written */
    } ks[] = {
        {K_MEMCPY, "cudaMemcpyAsync D2D fp32", 8},
        {K_CAST, "cast fp32->bf16", 6},
        {K_ACC32, "accumulate fp32 += fp32", 12},
        {K_ACC16, "accumulate fp32 += bf16", 10},
        {K_REDUCE4, "reduce 4 x fp32 -> fp32 (avg)", 20},
    };
    double memcpy_gbs = 0;
    printf("kernel bandwidth, %lld MiB fp32 per operand (bytes read + written, median of 20)\n", (long long)mib);
    printf("  %-32s %10s %10s %8s\n", "kernel", "ms", "GB/s", "vs copy");
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        float ms[20];
        for (int w = 0; w < 3; w++)
            launch(ks[i].k, buf, n, s);
        for (int r = 0; r < 20; r++) {
            CK(cudaEventRecord(a, s));
            launch(ks[i].k, buf, n, s);
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            CK(cudaEventElapsedTime(&ms[r], a, b));
        }
        qsort(ms, 20, sizeof ms[0], cmp_f);
        double med = ms[10];
        double gbs = ks[i].bytes_per_elem * (double)n / (med * 1e-3) / 1e9;
        if (ks[i].k == K_MEMCPY)
            memcpy_gbs = gbs;
        printf("  %-32s %10.3f %10.1f %7.0f%%\n", ks[i].name, med, gbs, 100.0 * gbs / memcpy_gbs);
    }
    for (int i = 0; i < 6; i++)
        CK(cudaFree(buf[i]));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaStreamDestroy(s));
    return 0;
}

/* ---- backend ---- */

/* --local: the one-GPU thread-rank backend (cuda-local, a group of one)
 * instead of NCCL; for a device without NCCL. No CUDA graphs there. */
static bool use_local;
static mfsdp_local_group *group;

static const char *backend_name(void)
{
    return use_local ? "cuda-local" : "NCCL";
}

/* The cuda-local group of `world` thread-ranks, made on first use (before
 * the threads start when there are several). */
static mfsdp_local_group *local_group(int64_t world)
{
    if (!group && mfsdp_local_group_create(world, &group) != MFSDP_OK) {
        fprintf(stderr, "mfsdp-gpu-bench: cannot create a local group of %lld\n", (long long)world);
        exit(1);
    }
    return group;
}

/* The backend of cfg: NCCL, or with --local cuda-local. */
static void select_backend(mfsdp_config *cfg, mfsdp_nccl_config *nc, int64_t world)
{
    if (use_local)
        mfsdp_config_set_cuda_local(cfg, local_group(world), nc);
    else
        mfsdp_config_set_nccl(cfg, nc);
}

/* Rank `rank`'s runtime on sh, driven from its own non-blocking compute
 * stream, with the NCCL flags given. */
static void open_rank(const mfsdp_schedule *sh, int64_t rank, unsigned flags, int timeout_ms, mfsdp_runtime **rt_out,
                      cudaStream_t *compute, int64_t *create_ns)
{
    mfsdp_runtime *rt = NULL;
    CK(cudaStreamCreateWithFlags(compute, cudaStreamNonBlocking));
    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    nc.compute_stream = *compute;
    nc.flags |= flags;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    select_backend(&cfg, &nc, mfsdp_schedule_world_size(sh));
    cfg.rank = rank;
    if (timeout_ms)
        cfg.timeout_ms = timeout_ms;
    int64_t t0 = now_ns();
    MF(mfsdp_create(sh, &cfg, &rt));
    if (create_ns)
        *create_ns = now_ns() - t0;
    *rt_out = rt;
}

/* SCHEDULE, loaded; `what` names the subcommand in the error. Returns 0, or
 * 2 when it has more ranks than the subcommand runs: one, or with --local
 * and `many` every rank as a thread-rank on this GPU. */
static int load_schedule(const char *path, const char *what, bool many, mfsdp_schedule **sh_out)
{
    mfsdp_runtime *rt = NULL; /* for MF's message */
    mfsdp_schedule *sh = NULL;
    MF(mfsdp_schedule_load(path, &sh));
    int64_t world = mfsdp_schedule_world_size(sh);
    if (world != 1 && !(many && use_local)) {
        fprintf(stderr, "mfsdp-gpu-bench: %s needs a 1-rank schedule%s (%s has %lld ranks)\n", what,
                many ? " on NCCL (with --local: any, as thread-ranks on this GPU)" : "", path, (long long)world);
        mfsdp_schedule_free(sh);
        return 2;
    }
    *sh_out = sh;
    return 0;
}

/* A 1-rank runtime on SCHEDULE (open_rank). Returns 0, or 2 when the
 * schedule has more than one rank. The runtime and schedule live until exit
 * (the bench runs one subcommand). */
static int open_one_rank(const char *path, const char *what, unsigned flags, int timeout_ms,
                         mfsdp_schedule **sh_out, mfsdp_runtime **rt_out, cudaStream_t *compute,
                         int64_t *create_ns)
{
    int rc = load_schedule(path, what, false, sh_out);
    if (rc == 0)
        open_rank(*sh_out, 0, flags, timeout_ms, rt_out, compute, create_ns);
    return rc;
}

/* ---- the HBM peak ---- */

/* The device's memory bandwidth peak in GB/s and where it came from: the
 * memory clock (kHz) x the bus width (bits) x 2 (double data rate) / 8, as
 * the device reports them; else by name (H100 SXM 3350, H200 4800); else 0. */
static double hbm_peak_gbs(int dev, const char **source)
{
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess && khz > 0 && bits > 0) {
        *source = "from the device: memory clock x bus width x 2";
        return (double)khz * 1e3 * (double)bits * 2.0 / 8.0 / 1e9;
    }
    (void)cudaGetLastError();
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, dev));
    if (strstr(p.name, "H200")) {
        *source = "by name: H200";
        return 4800;
    }
    if (strstr(p.name, "H100")) {
        *source = "by name: H100 (SXM)";
        return 3350;
    }
    *source = "unknown: the device reports no memory clock and the name is not known";
    return 0;
}

/* ---- sweep ---- */

static float time_batch(kernel k, void **buf, int64_t n, cudaStream_t s, cudaEvent_t a, cudaEvent_t b)
{
    float ms[11];
    for (int r = 0; r < 11; r++) {
        CK(cudaEventRecord(a, s));
        for (int i = 0; i < 10; i++)
            launch(k, buf, n, s);
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms[r], a, b));
    }
    qsort(ms, 11, sizeof ms[0], cmp_f);
    return ms[5] / 10;
}

static int run_sweep(int64_t max_mib)
{
    /* the largest size: max_mib, at most an eighth of the free memory (six
     * operands), rounded down to a size of the x4 ladder from 64 KiB */
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    int64_t top = 64 * 1024;
    while (top * 4 <= max_mib * 1024 * 1024 && top * 4 <= (int64_t)(free_b / 8))
        top *= 4;
    const int64_t max_n = top / 4 + 16;
    void *base[6], *buf[6];
    cudaStream_t s;
    cudaEvent_t a, b;
    int dev = 0;
    CK(cudaGetDevice(&dev));
    const char *src = "";
    double peak = hbm_peak_gbs(dev, &src);
    printf("hbm peak: %.0f GB/s (%s)\n", peak, src);
    snprintf(bench_ctx, sizeof bench_ctx, "sweep, up to %lld MiB per operand", (long long)(top >> 20));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 6; i++) {
        CK(cudaMalloc(&base[i], (size_t)max_n * 4));
        CK(mf_cuda_fill_pattern(base[i], i == 5 ? MF_BF16 : MF_FP32, max_n, (uint32_t)i + 1, s));
    }
    printf("kernel bandwidth sweep (GB/s, bytes read + written, median of 11 x 10 launches)\n");
    printf("  %10s %9s %12s %12s %12s\n", "per operand", "aligned", "memcpy", "cast->bf16", "acc f32");
    for (int64_t bytes = 64 * 1024; bytes <= top; bytes *= 4)
        for (int mis = 0; mis <= 1; mis++) {
            int64_t n = bytes / 4;
            for (int i = 0; i < 6; i++)
                buf[i] = (char *)base[i] + (mis ? 4 : 0);
            double t_copy = time_batch(K_MEMCPY, buf, n, s, a, b), t_cast = time_batch(K_CAST, buf, n, s, a, b),
                   t_acc = time_batch(K_ACC32, buf, n, s, a, b);
            printf("  %7lld KiB %9s %12.1f %12.1f %12.1f\n", (long long)(bytes / 1024), mis ? "no (+4 B)" : "yes",
                   8.0 * (double)n / (t_copy * 1e6), 6.0 * (double)n / (t_cast * 1e6),
                   12.0 * (double)n / (t_acc * 1e6));
        }
    for (int i = 0; i < 6; i++)
        CK(cudaFree(base[i]));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaStreamDestroy(s));
    return 0;
}

/* ---- probe ---- */

static int run_probe(void)
{
    snprintf(bench_ctx, sizeof bench_ctx, "probe");
    int dev = 0, drv = 0, rtv = 0, nccl = 0;
    struct cudaDeviceProp p;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&p, dev));
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rtv));
    const char *src = "";
    double peak = hbm_peak_gbs(dev, &src);
    ncclResult_t nr = ncclGetVersion(&nccl);
    if (nr == ncclSuccess)
        printf("nccl version: %d.%d.%d (%d)\n", nccl / 10000, nccl / 100 % 100, nccl % 100, nccl);
    else
        printf("nccl version: unavailable (%s)\n", ncclGetErrorString(nr));
    printf("hbm peak: %.0f GB/s (%s)\n", peak, src);
    printf("%s, sm_%d%d, %.0f MiB, %d SMs, driver CUDA %d.%d, runtime %d.%d\n", p.name, p.major, p.minor,
           (double)p.totalGlobalMem / 1048576.0, p.multiProcessorCount, drv / 1000, drv % 1000 / 10, rtv / 1000,
           rtv % 1000 / 10);
    return 0;
}

/* ---- hooks ---- */

typedef struct samples {
    int64_t *ns;
    int n, cap;
} samples;

static void add(samples *s, int64_t ns)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->ns = realloc(s->ns, (size_t)s->cap * sizeof *s->ns);
        if (!s->ns) {
            fprintf(stderr, "mfsdp-gpu-bench: out of memory\n");
            exit(1);
        }
    }
    s->ns[s->n++] = ns;
}

/* The same step captured as three CUDA graphs (first, middle, last
 * microbatch) and replayed: host time of the launches, device time per step. */
static void hooks_graphs(mfsdp_runtime *rt, const mfsdp_tensor_view *views, int T, int U, int64_t M, int64_t steps,
                         cudaStream_t compute, cudaEvent_t a, cudaEvent_t b, float *step_ms)
{
    /* Capture one step as three graphs (first, middle, last microbatch). */
    cudaGraph_t g[3] = {NULL, NULL, NULL};
    for (int64_t m = 0; m < M; m++) {
        int pos = m == 0 ? 0 : m == M - 1 ? 2 : 1;
        CK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
        if (m == 0)
            MF(mfsdp_step_begin(rt));
        for (int u = 0; u < U; u++) {
            MF(mfsdp_forward_pre(rt, u, m));
            MF(mfsdp_forward_post(rt, u, m));
        }
        for (int u = U - 1; u >= 0; u--) {
            MF(mfsdp_backward_pre(rt, u, m));
            for (int i = 0; i < T; i++)
                if (views[i].unit == u)
                    CK(mf_cuda_fill_pattern(views[i].grad_local, (mf_dtype)views[i].grad_local_dtype,
                                            views[i].numel, (uint32_t)(100 * m + i), compute));
            MF(mfsdp_backward_post(rt, u, m));
        }
        if (m == M - 1)
            MF(mfsdp_step_end(rt));
        cudaGraph_t graph;
        CK(cudaStreamEndCapture(compute, &graph));
        if (g[pos])
            CK(cudaGraphDestroy(graph));
        else
            g[pos] = graph;
    }
    cudaGraphExec_t ge[3] = {NULL, NULL, NULL};
    for (int p = 0; p < 3; p++)
        if (g[p])
            CK(cudaGraphInstantiate(&ge[p], g[p], 0));
    int64_t graph_host_ns = 0;
    for (int64_t s = 0; s <= steps; s++) {
        CK(cudaEventRecord(a, compute));
        int64_t g0 = now_ns();
        CK(cudaGraphLaunch(ge[0], compute));
        for (int64_t m = 1; m < M - 1; m++)
            CK(cudaGraphLaunch(ge[1], compute));
        if (M > 1)
            CK(cudaGraphLaunch(ge[2], compute));
        if (s > 0)
            graph_host_ns += now_ns() - g0;
        CK(cudaEventRecord(b, compute));
        CK(cudaEventSynchronize(b));
        if (s > 0)
            CK(cudaEventElapsedTime(&step_ms[s - 1], a, b));
    }
    qsort(step_ms, (size_t)steps, sizeof *step_ms, cmp_f);
    printf("  host time per step (3 CUDA graphs): %.1f us (graph launches only)\n",
           (double)graph_host_ns / 1e3 / (double)steps);
    printf("  device time per step (3 CUDA graphs): median %.3f ms\n", (double)step_ms[steps / 2]);
    for (int p = 0; p < 3; p++) {
        if (ge[p])
            CK(cudaGraphExecDestroy(ge[p]));
        if (g[p])
            CK(cudaGraphDestroy(g[p]));
    }
}

/* Every tensor's view into views, its main_weight shard filled (pattern 7 + i) on compute. */
static void hooks_views(mfsdp_runtime *rt, mfsdp_tensor_view *views, int T, cudaStream_t compute)
{
    for (int i = 0; i < T; i++) {
        MF(mfsdp_tensor_view_get(rt, i, &views[i]));
        if (views[i].shard_count)
            CK(mf_cuda_fill_pattern(views[i].main_weight, (mf_dtype)views[i].main_weight_dtype,
                                    views[i].shard_count, 7 + (uint32_t)i, compute));
    }
    CK(cudaStreamSynchronize(compute));
}

static int run_hooks(const char *path, int64_t steps, bool graphs)
{
    mfsdp_runtime *rt = NULL;
    mfsdp_schedule *sh = NULL;
    cudaStream_t compute;
    int64_t create_ns = 0;
    /* eager steps on a runtime without MFSDP_NCCL_GRAPHS (what an eager
     * trainer runs); the graphs below on a second runtime with it */
    int rc = open_one_rank(path, "hooks", 0, 0, &sh, &rt, &compute, &create_ns);
    if (rc)
        return rc;
    int64_t host_step_ns = 0; /* summed over the timed steps */
    mfsdp_stats st0, st1;
    int U = mfsdp_schedule_num_units(sh), T = mfsdp_num_tensors(rt);
    int64_t M = mfsdp_schedule_microbatches(sh);
    snprintf(bench_ctx, sizeof bench_ctx, "hooks, eager, %s on %s, M=%lld", path, backend_name(), (long long)M);
    mfsdp_tensor_view *views = calloc((size_t)(T ? T : 1), sizeof *views);
    if (!views)
        return 1;
    hooks_views(rt, views, T, compute);

    samples t[6];
    memset(t, 0, sizeof t);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float *step_ms = calloc((size_t)steps, sizeof *step_ms);
    if (!step_ms)
        return 1;
#define HOOK(ph, call)                           \
    do {                                         \
        int64_t h0 = now_ns();                   \
        MF(call);                                \
        if (s > 0)                               \
            add(&t[ph], now_ns() - h0);          \
    } while (0)
    for (int64_t s = 0; s <= steps; s++) { /* step 0 warms up */
        if (s == 1)
            MF(mfsdp_get_stats(rt, &st0));
        CK(cudaEventRecord(a, compute));
        int64_t hs0 = now_ns();
        HOOK(0, mfsdp_step_begin(rt));
        for (int64_t m = 0; m < M; m++) {
            for (int u = 0; u < U; u++) {
                HOOK(1, mfsdp_forward_pre(rt, u, m));
                HOOK(2, mfsdp_forward_post(rt, u, m));
            }
            for (int u = U - 1; u >= 0; u--) {
                HOOK(3, mfsdp_backward_pre(rt, u, m));
                for (int i = 0; i < T; i++)
                    if (views[i].unit == u)
                        CK(mf_cuda_fill_pattern(views[i].grad_local, (mf_dtype)views[i].grad_local_dtype,
                                                views[i].numel, (uint32_t)(100 * m + i), compute));
                HOOK(4, mfsdp_backward_post(rt, u, m));
            }
        }
        HOOK(5, mfsdp_step_end(rt));
        if (s > 0)
            host_step_ns += now_ns() - hs0; /* includes the trainer's own fill launches */
        CK(cudaEventRecord(b, compute));
        MF(mfsdp_synchronize(rt));
        if (s > 0)
            CK(cudaEventElapsedTime(&step_ms[s - 1], a, b));
    }
#undef HOOK
    static const char *const names[6] = {"step_begin",   "forward_pre",   "forward_post",
                                         "backward_pre", "backward_post", "step_end"};
    printf("hooks: %s, %d units, %lld microbatches, %lld steps on %s (1 rank), create %.1f ms\n", path, U,
           (long long)M, (long long)steps, backend_name(), (double)create_ns / 1e6);
    printf("  %-14s %8s %10s %10s %10s   (host time per call, us)\n", "hook", "calls", "median", "p99", "max");
    for (int ph = 0; ph < 6; ph++) {
        if (!t[ph].n)
            continue;
        qsort(t[ph].ns, (size_t)t[ph].n, sizeof(int64_t), cmp_i64);
        int64_t med = t[ph].ns[t[ph].n / 2], p99 = t[ph].ns[(t[ph].n * 99) / 100], mx = t[ph].ns[t[ph].n - 1];
        printf("  %-14s %8d %10.2f %10.2f %10.2f\n", names[ph], t[ph].n, (double)med / 1e3, (double)p99 / 1e3,
               (double)mx / 1e3);
    }
    MF(mfsdp_get_stats(rt, &st1));
    int64_t hook_ns = 0, ops = st1.ops - st0.ops;
    for (int ph = 0; ph < 6; ph++)
        for (int i = 0; i < t[ph].n; i++)
            hook_ns += t[ph].ns[i];
    printf("  host time in hooks per op (eager): %.2f us (%lld ops per step)\n",
           ops ? (double)hook_ns / 1e3 / (double)ops : 0.0, (long long)(ops / steps));
    printf("  host time per step (eager, hooks + fills): %.1f us\n", (double)host_step_ns / 1e3 / (double)steps);
    qsort(step_ms, (size_t)steps, sizeof *step_ms, cmp_f);
    printf("  device time per step (eager): median %.3f ms\n", (double)step_ms[steps / 2]);

    if (graphs) {
        snprintf(bench_ctx, sizeof bench_ctx, "hooks, CUDA graphs, %s on %s, M=%lld", path, backend_name(),
                 (long long)M);
        mfsdp_destroy(rt);
        CK(cudaStreamDestroy(compute));
        open_rank(sh, 0, MFSDP_NCCL_GRAPHS, 0, &rt, &compute, NULL);
        hooks_views(rt, views, T, compute);
        hooks_graphs(rt, views, T, U, M, steps, compute, a, b, step_ms);
    }
    for (int ph = 0; ph < 6; ph++)
        free(t[ph].ns);
    free(step_ms);
    free(views);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    mfsdp_destroy(rt);
    mfsdp_schedule_free(sh);
    CK(cudaStreamDestroy(compute));
    return 0;
}

/* ---- stress ---- */

/* Two steps from the same state; before every hook a spin kernel on stream
 * `spin` (-1: none). Appends every unsharded weight and delivered gradient to
 * out (host bytes). */
static size_t stress_run(mfsdp_runtime *rt, const mfsdp_tensor_view *v, int T, int U, int64_t M, int spin,
                         cudaStream_t compute, unsigned char *out)
{
    cudaStream_t ss = spin >= 0 ? mfsdp_nccl_stream(rt, spin) : NULL;
#define SPIN()                                  \
    do {                                        \
        if (ss)                                 \
            CK(mf_cuda_spin(20000, ss));        \
    } while (0)
    for (int i = 0; i < T; i++)
        if (v[i].shard_count)
            CK(mf_cuda_fill_pattern(v[i].main_weight, (mf_dtype)v[i].main_weight_dtype, v[i].shard_count,
                                    7 + (uint32_t)i, compute));
    size_t at = 0;
    for (int step = 0; step < 2; step++) {
        SPIN();
        MF(mfsdp_step_begin(rt));
        for (int64_t m = 0; m < M; m++) {
            for (int u = 0; u < U; u++) {
                SPIN();
                MF(mfsdp_forward_pre(rt, u, m));
                SPIN();
                MF(mfsdp_forward_post(rt, u, m));
            }
            for (int u = U - 1; u >= 0; u--) {
                SPIN();
                MF(mfsdp_backward_pre(rt, u, m));
                for (int i = 0; i < T; i++)
                    if (v[i].unit == u)
                        CK(mf_cuda_fill_pattern(v[i].grad_local, (mf_dtype)v[i].grad_local_dtype, v[i].numel,
                                                (uint32_t)(1000 * step + 100 * m + i), compute));
                SPIN();
                MF(mfsdp_backward_post(rt, u, m));
            }
        }
        SPIN();
        MF(mfsdp_step_end(rt));
        MF(mfsdp_synchronize(rt));
        for (int i = 0; i < T; i++) {
            size_t wb = (size_t)v[i].numel * (v[i].weight_dtype == MFSDP_FP32 ? 4 : 2);
            size_t gb = (size_t)v[i].shard_count * (v[i].grad_dtype == MFSDP_FP32 ? 4 : 2);
            CK(cudaMemcpy(out + at, v[i].grad, gb, cudaMemcpyDeviceToHost));
            at += gb;
            if (v[i].weight) {
                CK(cudaMemcpy(out + at, v[i].weight, wb, cudaMemcpyDeviceToHost));
                at += wb;
            }
        }
    }
#undef SPIN
    return at;
}

static int run_stress(const char *path)
{
    mfsdp_runtime *rt = NULL;
    mfsdp_schedule *sh = NULL;
    cudaStream_t compute;
    int rc = open_one_rank(path, "stress", 0, 60000, &sh, &rt, &compute, NULL);
    if (rc)
        return rc;
    int U = mfsdp_schedule_num_units(sh), T = mfsdp_num_tensors(rt);
    int64_t M = mfsdp_schedule_microbatches(sh);
    mfsdp_tensor_view *v = calloc((size_t)(T ? T : 1), sizeof *v);
    size_t cap = 0;
    for (int i = 0; v && i < T; i++) {
        MF(mfsdp_tensor_view_get(rt, i, &v[i]));
        cap += 2 * ((size_t)v[i].numel * 4 + (size_t)v[i].shard_count * 4);
    }
    unsigned char *ref = malloc(cap ? cap : 1), *got = malloc(cap ? cap : 1);
    if (!v || !ref || !got)
        return 1;
    static const char *const sname[3] = {"compute", "inner", "outer"};
    snprintf(bench_ctx, sizeof bench_ctx, "stress, %s on %s, M=%lld, no spin", path, backend_name(), (long long)M);
    size_t n = stress_run(rt, v, T, U, M, -1, compute, ref);
    int bad = 0;
    printf("ordering stress: %s on %s, %d units, M=%lld, %zu result bytes per run\n", path, backend_name(), U,
           (long long)M, n);
    for (int st = 0; st < 3; st++) {
        snprintf(bench_ctx, sizeof bench_ctx, "stress, %s on %s, M=%lld, spin on the %s stream", path,
                 backend_name(), (long long)M, sname[st]);
        size_t m = stress_run(rt, v, T, U, M, st, compute, got);
        size_t diff = 0;
        for (size_t k = 0; k < n && k < m; k++)
            diff += ref[k] != got[k];
        printf("  spin on the %-7s stream before every hook: %s (%zu of %zu bytes differ)\n", sname[st],
               diff || m != n ? "DIFFERENT" : "bit-equal", diff, n);
        bad += diff || m != n;
    }
    free(ref);
    free(got);
    free(v);
    mfsdp_destroy(rt);
    mfsdp_schedule_free(sh);
    CK(cudaStreamDestroy(compute));
    return bad ? 1 : 0;
}

/* ---- overlap ---- */

typedef struct span {
    double a, b;
} span;

static int cmp_span(const void *x, const void *y)
{
    double p = ((const span *)x)->a, q = ((const span *)y)->a;
    return p < q ? -1 : p > q;
}

/* Sorts and merges in place; returns the count. */
static int merge(span *v, int n)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_span);
    int k = 0;
    for (int i = 1; i < n; i++) {
        if (v[i].a <= v[k].b) {
            if (v[i].b > v[k].b)
                v[k].b = v[i].b;
        } else {
            v[++k] = v[i];
        }
    }
    return k + 1;
}

static double length(const span *v, int n)
{
    double t = 0;
    for (int i = 0; i < n; i++)
        t += v[i].b - v[i].a;
    return t;
}

/* Length of the intersection of two merged lists. */
static double common(const span *x, int nx, const span *y, int ny)
{
    double t = 0;
    for (int i = 0, j = 0; i < nx && j < ny;) {
        double a = x[i].a > y[j].a ? x[i].a : y[j].a, b = x[i].b < y[j].b ? x[i].b : y[j].b;
        if (b > a)
            t += b - a;
        if (x[i].b < y[j].b)
            i++;
        else
            j++;
    }
    return t;
}

static void fmt_us(double us, char *buf, size_t n)
{
    if (us >= 1000)
        snprintf(buf, n, "%.3f ms", us / 1000);
    else
        snprintf(buf, n, "%.3f us", us);
}

static const char *const stream_names[3] = {"compute", "inner", "outer"};

/* The figures of `mfsdpc simulate` for one rank's measured intervals:
 * compute = the spins plus compute-stream ops; exposed = a stream's busy time
 * while compute idles. */
typedef struct overlap {
    double first;               /* the first start (the rank's step begins) */
    double step, busy[3], exposed[3], hidden[3];
} overlap;

/* Returns 0, or 1 when out of memory. */
static int overlap_of(const span *sp, int nspin, const mfsdp_nccl_op_time *ops, int nops, overlap *o)
{
    span *lists[3] = {NULL, NULL, NULL};
    int n[3] = {0, 0, 0};
    for (int s = 0; s < 3; s++) {
        lists[s] = calloc((size_t)(nops + nspin + 1), sizeof(span));
        if (!lists[s]) {
            for (int k = 0; k < s; k++)
                free(lists[k]);
            return 1;
        }
    }
    double t0 = 1e300, t1 = -1e300;
    for (int i = 0; i < nspin; i++)
        lists[0][n[0]++] = sp[i];
    for (int i = 0; i < nops; i++)
        lists[ops[i].stream][n[ops[i].stream]++] = (span){ops[i].start_us, ops[i].end_us};
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < n[s]; i++) {
            t0 = lists[s][i].a < t0 ? lists[s][i].a : t0;
            t1 = lists[s][i].b > t1 ? lists[s][i].b : t1;
        }
    for (int s = 0; s < 3; s++)
        n[s] = merge(lists[s], n[s]);
    *o = (overlap){.first = t0, .step = t1 - t0};
    for (int s = 0; s < 3; s++) {
        o->busy[s] = length(lists[s], n[s]);
        o->exposed[s] = s ? o->busy[s] - common(lists[s], n[s], lists[0], n[0]) : 0;
        o->hidden[s] = o->busy[s] - o->exposed[s];
    }
    for (int s = 0; s < 3; s++)
        free(lists[s]);
    return 0;
}

/* hidden / busy of the communication streams, in percent. */
static double overlap_pct(const overlap *o)
{
    double cb = o->busy[1] + o->busy[2];
    return cb > 0 ? 100 * (o->hidden[1] + o->hidden[2]) / cb : 100.0;
}

static void print_overlap(const overlap *o)
{
    char b1[32], b2[32], b3[32];
    fmt_us(o->step, b1, sizeof b1);
    printf("  step time          %s\n", b1);
    fmt_us(o->busy[0], b1, sizeof b1);
    printf("  compute            %s (%.1f%% of the step)\n", b1, 100 * o->busy[0] / o->step);
    fmt_us(o->step - o->busy[0], b1, sizeof b1);
    printf("  compute idle       %s\n", b1);
    printf("  %-10s %14s %14s %14s\n", "stream", "busy", "exposed", "hidden");
    for (int s = 1; s < 3; s++) {
        fmt_us(o->busy[s], b1, sizeof b1);
        fmt_us(o->exposed[s], b2, sizeof b2);
        fmt_us(o->hidden[s], b3, sizeof b3);
        printf("  %-10s %14s %14s %14s\n", stream_names[s], b1, b2, b3);
    }
    fmt_us(o->busy[1] + o->busy[2], b1, sizeof b1);
    fmt_us(o->exposed[1] + o->exposed[2], b2, sizeof b2);
    printf("  overlap %.1f%% (hidden / busy; communication busy %s, exposed %s)\n", overlap_pct(o), b1, b2);
}

/* One rank of the overlap measurement (a thread-rank with --local). */
typedef struct overlap_rank {
    const mfsdp_schedule *sh;
    int64_t rank, unit_us;
    cudaEvent_t epoch;          /* recorded before any rank starts */
    double offset_us;           /* this rank's step origin since the epoch (aligns the trace) */
    span *sp;                   /* the measured step's spins, since the rank's step origin */
    int nspin;
    mfsdp_nccl_op_time *ops;    /* the measured step's ops, since the rank's step origin */
    int nops;
} overlap_rank;

/* Two steps (step 0 warms up) of rank ->rank's device trainer whose compute
 * is a spin kernel of unit_us per unit forward and 2 * unit_us backward;
 * every op timed on the device (MFSDP_NCCL_TIMELINE). Any failure exits. */
static void *overlap_rank_main(void *arg)
{
    overlap_rank *w = arg;
    mfsdp_runtime *rt = NULL;
    cudaStream_t compute;
    open_rank(w->sh, w->rank, MFSDP_NCCL_TIMELINE, 60000, &rt, &compute, NULL);
    int U = mfsdp_schedule_num_units(w->sh);
    int64_t M = mfsdp_schedule_microbatches(w->sh);
    int nspin = (int)(2 * U * M), cap = 0;
    cudaEvent_t origin, *ev = calloc((size_t)nspin * 2, sizeof *ev);
    span *sp = calloc((size_t)nspin, sizeof *sp);
    if (!ev || !sp) {
        fprintf(stderr, "mfsdp-gpu-bench: out of memory\n");
        exit(1);
    }
    CK(cudaEventCreate(&origin));
    for (int i = 0; i < 2 * nspin; i++)
        CK(cudaEventCreate(&ev[i]));
    mfsdp_nccl_op_time *ops = NULL;
    int nops = 0;
    for (int step = 0; step < 2; step++) {
        int k = 0;
        CK(cudaEventRecord(origin, compute));
        MF(mfsdp_step_begin(rt));
        for (int64_t m = 0; m < M; m++) {
            for (int u = 0; u < U; u++) {
                MF(mfsdp_forward_pre(rt, u, m));
                CK(cudaEventRecord(ev[2 * k], compute));
                CK(mf_cuda_spin(w->unit_us * 1000, compute));
                CK(cudaEventRecord(ev[2 * k++ + 1], compute));
                MF(mfsdp_forward_post(rt, u, m));
            }
            for (int u = U - 1; u >= 0; u--) {
                MF(mfsdp_backward_pre(rt, u, m));
                CK(cudaEventRecord(ev[2 * k], compute));
                CK(mf_cuda_spin(2 * w->unit_us * 1000, compute));
                CK(cudaEventRecord(ev[2 * k++ + 1], compute));
                MF(mfsdp_backward_post(rt, u, m));
            }
        }
        MF(mfsdp_step_end(rt));
        MF(mfsdp_synchronize(rt));
        if (!ops) {
            mfsdp_stats st;
            MF(mfsdp_get_stats(rt, &st));
            cap = (int)st.ops + 16;
            ops = calloc((size_t)cap, sizeof *ops);
            if (!ops) {
                fprintf(stderr, "mfsdp-gpu-bench: out of memory\n");
                exit(1);
            }
        }
        nops = mfsdp_nccl_timeline(rt, origin, ops, cap);
        if (nops < 0) {
            fprintf(stderr, "mfsdp-gpu-bench: rank %lld: mfsdp_nccl_timeline failed\n", (long long)w->rank);
            exit(1);
        }
    }
    for (int i = 0; i < nspin; i++) {
        float a, b;
        CK(cudaEventElapsedTime(&a, origin, ev[2 * i]));
        CK(cudaEventElapsedTime(&b, origin, ev[2 * i + 1]));
        sp[i] = (span){1e3 * a, 1e3 * b};
    }
    float off;
    CK(cudaEventElapsedTime(&off, w->epoch, origin));
    w->offset_us = 1e3 * off;
    CK(cudaEventDestroy(origin));
    for (int i = 0; i < 2 * nspin; i++)
        CK(cudaEventDestroy(ev[i]));
    free(ev);
    mfsdp_destroy(rt);
    CK(cudaStreamDestroy(compute));
    w->sp = sp;
    w->nspin = nspin;
    w->ops = ops;
    w->nops = nops;
    return NULL;
}

/* Chrome trace JSON (ui.perfetto.dev): one process per rank, one track per
 * stream, times since t0 (since the epoch). */
static int write_trace(const char *trace, const overlap_rank *w, int64_t world, double t0)
{
    FILE *f = fopen(trace, "w");
    if (!f) {
        fprintf(stderr, "mfsdp-gpu-bench: cannot write %s\n", trace);
        return 1;
    }
    fprintf(f, "{\"traceEvents\": [\n");
    const char *sep = "";
    for (int64_t r = 0; r < world; r++) {
        fprintf(f, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %lld, \"args\": {\"name\": \"rank %lld\"}}",
                sep, (long long)r, (long long)r);
        sep = ",\n";
        for (int s = 0; s < 3; s++)
            fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %lld, \"tid\": %d, \"args\": "
                       "{\"name\": \"%s\"}}", (long long)r, s, stream_names[s]);
        for (int i = 0; i < w[r].nspin; i++)
            fprintf(f, ",\n{\"name\": \"compute (spin)\", \"ph\": \"X\", \"pid\": %lld, \"tid\": 0, \"ts\": %.3f, "
                       "\"dur\": %.3f}", (long long)r, w[r].sp[i].a + w[r].offset_us - t0, w[r].sp[i].b - w[r].sp[i].a);
        for (int i = 0; i < w[r].nops; i++) {
            const mfsdp_nccl_op_time *o = &w[r].ops[i];
            fprintf(f, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %lld, \"tid\": %d, \"ts\": %.3f, \"dur\": "
                       "%.3f, \"args\": {\"op\": %d, \"ops\": %d, \"microbatch\": %lld}}",
                    o->name, (long long)r, o->stream, o->start_us + w[r].offset_us - t0, o->end_us - o->start_us, o->op, o->nops,
                    (long long)o->microbatch);
        }
    }
    fprintf(f, "\n]}\n");
    return fclose(f) == 0 ? 0 : 1;
}

/* One measured step of every rank of SCHEDULE: a 1-rank schedule on NCCL
 * (a world of one) or cuda-local, any schedule with --local as thread-ranks
 * on this GPU, all at once. Prints rank 0's figures in the form of
 * `mfsdpc simulate`, every rank's overlap, and writes a Chrome trace. */
static int run_overlap(const char *path, int64_t unit_us, const char *trace)
{
    mfsdp_schedule *sh = NULL;
    int rc = load_schedule(path, "overlap", true, &sh);
    if (rc)
        return rc;
    int64_t world = mfsdp_schedule_world_size(sh);
    snprintf(bench_ctx, sizeof bench_ctx, "overlap, %s on %s, %lld ranks, M=%lld, %lld us per unit", path,
             backend_name(), (long long)world, (long long)mfsdp_schedule_microbatches(sh), (long long)unit_us);
    overlap_rank *w = calloc((size_t)world, sizeof *w);
    pthread_t *th = calloc((size_t)world, sizeof *th);
    overlap *o = calloc((size_t)world, sizeof *o);
    if (!w || !th || !o) {
        fprintf(stderr, "mfsdp-gpu-bench: out of memory\n");
        return 1;
    }
    cudaStream_t es;
    cudaEvent_t epoch;
    CK(cudaStreamCreateWithFlags(&es, cudaStreamNonBlocking));
    CK(cudaEventCreate(&epoch));
    CK(cudaEventRecord(epoch, es));
    CK(cudaEventSynchronize(epoch));
    for (int64_t r = 0; r < world; r++)
        w[r] = (overlap_rank){.sh = sh, .rank = r, .unit_us = unit_us, .epoch = epoch};
    if (use_local)
        local_group(world);
    if (world == 1) {
        overlap_rank_main(&w[0]);
    } else {
        for (int64_t r = 0; r < world; r++)
            if (pthread_create(&th[r], NULL, overlap_rank_main, &w[r]) != 0) {
                fprintf(stderr, "mfsdp-gpu-bench: cannot start thread-rank %lld\n", (long long)r);
                exit(1);
            }
        for (int64_t r = 0; r < world; r++)
            pthread_join(th[r], NULL);
    }
    double t0 = 1e300;
    for (int64_t r = 0; r < world; r++) {
        if (overlap_of(w[r].sp, w[r].nspin, w[r].ops, w[r].nops, &o[r]) != 0) {
            fprintf(stderr, "mfsdp-gpu-bench: out of memory\n");
            return 1;
        }
        t0 = o[r].first + w[r].offset_us < t0 ? o[r].first + w[r].offset_us : t0;
    }
    printf("measured on the device: %s, %lld rank%s (%s%s), compute = spin kernel of %lld us forward, %lld us "
           "backward per unit and microbatch; %d timed ops on rank 0\n",
           path, (long long)world, world > 1 ? "s" : "", backend_name(), world > 1 ? " thread-ranks on one GPU" : "",
           (long long)unit_us, (long long)(2 * unit_us), w[0].nops);
    print_overlap(&o[0]);
    if (world > 1) {
        double lo = 1e300, hi = -1e300;
        printf("  every rank:");
        for (int64_t r = 0; r < world; r++) {
            double v = overlap_pct(&o[r]);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            printf(" %.1f%%", v);
        }
        printf(" (min %.1f%%, max %.1f%%)\n", lo, hi);
    }
    if (trace && write_trace(trace, w, world, t0) != 0)
        return 1;
    for (int64_t r = 0; r < world; r++) {
        free(w[r].sp);
        free(w[r].ops);
    }
    free(w);
    free(th);
    free(o);
    CK(cudaEventDestroy(epoch));
    CK(cudaStreamDestroy(es));
    mfsdp_schedule_free(sh);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mfsdp-gpu-bench [--local] COMMAND ...  (--local: cuda-local instead of NCCL; no --graphs)\n"
               "       mfsdp-gpu-bench kernels [--mib N]\n"
               "       mfsdp-gpu-bench sweep [--mib N]\n"
               "       mfsdp-gpu-bench hooks SCHEDULE.yaml [--steps S] [--graphs]\n"
               "       mfsdp-gpu-bench stress SCHEDULE.yaml\n"
               "       mfsdp-gpu-bench overlap SCHEDULE.yaml [--unit-us U] [--trace FILE.json]\n"
               "       mfsdp-gpu-bench probe\n");
}

/* The command line, parsed in full before anything touches the GPU: an
 * option the command does not take, a bad number or a missing operand is a
 * usage error (exit 2) on any machine. */
enum { OPT_LOCAL, OPT_MIB, OPT_UNIT_US, OPT_TRACE, OPT_STEPS, OPT_GRAPHS, OPT_COUNT };

static const mf_opt bench_opts[] = {
    {"--local", NULL, NULL, OPT_LOCAL},       {"--mib", NULL, "N", OPT_MIB},
    {"--unit-us", NULL, "U", OPT_UNIT_US},    {"--trace", NULL, "FILE.json", OPT_TRACE},
    {"--steps", NULL, "S", OPT_STEPS},        {"--graphs", NULL, NULL, OPT_GRAPHS},
};

typedef struct bench_args {
    const char *command, *schedule, *trace;
    int64_t mib, unit_us, steps;
    bool graphs;
    unsigned given;         /* 1u << OPT_* of the options given */
} bench_args;

/* A positive integer, the whole of s. */
static bool positive(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 1)
        return false;
    *out = v;
    return true;
}

static bool parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.mib = 1024, .unit_us = 200, .steps = 10};
    mf_opts p;
    mf_opts_init(&p, "mfsdp-gpu-bench", argc, argv, bench_opts,
                 (int)(sizeof bench_opts / sizeof bench_opts[0]), NULL);
    const char *v;
    int id;
    while ((id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == MF_OPTS_OPERAND && !a->command)
            a->command = v;
        else if (id == MF_OPTS_OPERAND && !a->schedule)
            a->schedule = v;
        else if (id < 0)
            return false;
        else if ((id == OPT_MIB && !positive(v, &a->mib)) || (id == OPT_UNIT_US && !positive(v, &a->unit_us)) ||
                 (id == OPT_STEPS && !positive(v, &a->steps)))
            return false;
        else {
            a->given |= 1u << id;
            a->trace = id == OPT_TRACE ? v : a->trace;
            a->graphs = a->graphs || id == OPT_GRAPHS;
            use_local = use_local || id == OPT_LOCAL;
        }
    }
    return a->command != NULL;
}

/* Each command: whether it takes a schedule, and the options it takes. */
static const struct {
    const char *name;
    bool schedule;
    unsigned opts;
} bench_commands[] = {
    {"kernels", false, 1u << OPT_MIB},
    {"probe", false, 0},
    {"sweep", false, 1u << OPT_MIB},
    {"stress", true, 0},
    {"overlap", true, 1u << OPT_UNIT_US | 1u << OPT_TRACE},
    {"hooks", true, 1u << OPT_STEPS | 1u << OPT_GRAPHS},
};

static bool args_fit(const bench_args *a)
{
    for (size_t i = 0; i < sizeof bench_commands / sizeof bench_commands[0]; i++)
        if (!strcmp(a->command, bench_commands[i].name))
            return (a->schedule != NULL) == bench_commands[i].schedule &&
                   !(a->given & ~(bench_commands[i].opts | 1u << OPT_LOCAL)) &&
                   !(a->graphs && use_local); /* cuda-local has no graph mode */
    return false;
}

static int dispatch(const bench_args *a)
{
    int presence = gpu_presence();
    if (presence != GPU_PRESENT)
        return presence;
    if (!strcmp(a->command, "kernels"))
        return run_kernels(a->mib);
    if (!strcmp(a->command, "probe"))
        return run_probe();
    if (!strcmp(a->command, "sweep"))
        return run_sweep(a->mib);
    if (!strcmp(a->command, "stress"))
        return run_stress(a->schedule);
    if (!strcmp(a->command, "overlap"))
        return run_overlap(a->schedule, a->unit_us, a->trace);
    return run_hooks(a->schedule, a->steps, a->graphs);
}

int main(int argc, char **argv)
{
    bench_args a;
    if (!parse_args(argc, argv, &a) || !args_fit(&a)) {
        usage(stderr);
        return 2;
    }
    int rc = dispatch(&a);
    if (group)
        mfsdp_local_group_destroy(group);
    return rc;
}
