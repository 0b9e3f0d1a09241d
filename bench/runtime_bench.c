/*
 * runtime_bench: what libmfsdp costs on CPUs. Not a test; prints tables.
 *
 *   mfsdp-runtime-bench [--quick]            host overhead + local backend
 *   mpirun -np N mfsdp-runtime-bench --mpi   MPI backend vs raw MPI calls
 *
 * 1. Host overhead per replayed op: a schedule of many tiny ops (8 units of
 *    4 64-element tensors, HFSDP, M = 4) on one rank and on 2 x 4 thread-ranks,
 *    in the worker model (stream threads) and the synchronous model; time per
 *    step / ops issued per step.
 * Every figure is the fastest of several steps (of the slowest rank), and
 * every reference (memcpy, raw MPI) is taken the same way in the same run:
 * the machine's other load only adds time, so the fastest step is the one
 * least disturbed by it. Each row prints its goal (docs/performance.md).
 * 2. Local collectives: schedules whose only work is K back-to-back
 *    all-gathers, reduce-scatters or all-reduces of S bytes on N
 *    thread-ranks; algorithm bandwidth S / t next to one thread's memcpy of
 *    S bytes.
 * 3. MPI: the same single-collective schedules on the MPI backend against
 *    the same MPI calls made directly (blocking MPI_Allgather etc. and the
 *    nonblocking ones with MPI_Wait), on MPI_COMM_WORLD, from touched buffers;
 *    reductions sum (what the raw calls do), and the default mode also runs
 *    with `avg` (its extra pass shown on its own). The all-reduce goes from
 *    one buffer into another, as every mfsdpc schedule has it.
 * Schedules come from the runtime tests' builder (tests/runtime), so the
 * bench needs no compiler.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mf_opts.h"
#include "mf_rt.h"
#include "mf_test_builder.h"

#ifdef MFSDP_HAVE_MPI
#include <mpi.h>
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static mfsdp_schedule *wrap(mf_schedule *s)
{
    char err[256];
    mfsdp_schedule *h = NULL;
    if (!s || mf_rt_schedule_wrap(s, &h, err, sizeof err) != MFSDP_OK) {
        fprintf(stderr, "runtime_bench: cannot build a schedule: %s\n", s ? err : "builder failed");
        exit(2);
    }
    return h;
}

/* Many tiny ops: 8 units of four 64-element tensors. */
static mfsdp_schedule *tiny_schedule(int64_t outer, int64_t inner)
{
    mf_tb_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.naxes = 2;
    spec.sizes[0] = outer;
    spec.sizes[1] = inner;
    spec.microbatches = 4;
    spec.reduce = MF_REDUCE_AVG;
    spec.nlayouts = 1;
    mf_tb_mode("hfsdp", 2, &spec.layouts[0]);
    spec.nunits = MF_TB_MAX_UNITS;
    static char names[MF_TB_MAX_UNITS][16];
    for (int u = 0; u < spec.nunits; u++) {
        snprintf(names[u], sizeof names[u], "u%d", u);
        spec.units[u].name = names[u];
        spec.units[u].ntensors = 4;
        for (int t = 0; t < 4; t++)
            spec.units[u].tensors[t] = (mf_tb_tensor){t == 0 ? "a" : t == 1 ? "b" : t == 2 ? "c" : "d", 64, 0};
    }
    char err[256];
    return wrap(mf_tb_build(&spec, err, sizeof err));
}

/* One bucket of `elems` elements on a 1-D mesh of n ranks whose step_begin
 * runs `reps` collectives of one kind on the inner stream, then compute
 * waits for them. */
static mfsdp_schedule *collective_schedule(int64_t n, int64_t elems, mf_opkind kind, int reps,
                                           mf_reduce reduce)
{
    mf_tb_spec spec;
    mf_tb_spec_1d(&spec, n, reduce);
    spec.layouts[0] = (mf_tb_layout){{MF_FP32, MF_FP32, MF_FP32}, {"F", "F", "F"}};
    spec.units[0] = (mf_tb_unit){"u", false, 1, {{"t", elems, 0}}};
    char err[256];
    mf_schedule *s = mf_tb_build(&spec, err, sizeof err);
    if (!s) {
        fprintf(stderr, "runtime_bench: %s\n", err);
        exit(2);
    }
    int w = -1, full = -1, local = -1, grad = -1;
    for (int i = 0; i < s->nbuffers; i++)
        switch (s->buffers[i].kind) {
        case MF_BUF_WEIGHT: w = i; break;
        case MF_BUF_WEIGHT_FULL: full = i; break;
        case MF_BUF_GRAD_LOCAL: local = i; break;
        case MF_BUF_GRAD: grad = i; break;
        default: break;
        }
    int64_t L = s->buckets[0].length;
    mf_op *ops = mf_arena_array(s->arena, (size_t)reps + 2, sizeof *ops);
    for (int r = 0; r < reps; r++) {
        mf_op *op = &ops[r];
        *op = (mf_op){.id = r, .phase = MF_PHASE_STEP_BEGIN, .unit = -1, .when = MF_WHEN_EVERY,
                      .stream = MF_STREAM_INNER, .kind = kind, .bucket = 0, .axis = 0,
                      .dtype = MF_FP32, .event = -1};
        if (kind == MF_OP_ALL_GATHER) {
            op->count = L / n;
            op->src = w;
            op->dst = full;
        } else if (kind == MF_OP_REDUCE_SCATTER) {
            op->count = L / n;
            op->src = local;
            op->dst = grad;
        } else {
            /* two buffers, as mfsdpc emits it (grad -> grad_final; never in
             * place): Open MPI 4.1's libnbc runs an in-place all-reduce as a
             * binomial reduce + bcast, a two-buffer one as its ring or
             * reduce-scatter + all-gather, so the shape decides the speed */
            op->count = L;
            op->src = local;
            op->dst = full;
        }
    }
    mf_tb_step_begin_fence(ops, reps);
    s->ops = ops;
    s->nops = reps + 2;
    s->nevents = 1;
    mf_schedule_summarize(s);
    return wrap(s);
}

/* ---- running a schedule on thread-ranks ---- */

typedef struct job {
    const mfsdp_schedule *sh;
    mfsdp_config cfg;
    int steps, warmup;
    double seconds;         /* measured steps */
    double best;            /* the fastest measured step */
    int64_t ops;            /* ops issued per step */
    int failed;
} job;

static int run_hooks(mfsdp_runtime *rt, const mfsdp_schedule *sh)
{
    int U = mfsdp_schedule_num_units(sh);
    int64_t M = mfsdp_schedule_microbatches(sh);
    if (mfsdp_step_begin(rt) != MFSDP_OK)
        return -1;
    for (int64_t m = 0; m < M; m++) {
        for (int u = 0; u < U; u++)
            if (mfsdp_forward_pre(rt, u, m) || mfsdp_forward_post(rt, u, m))
                return -1;
        for (int u = U - 1; u >= 0; u--)
            if (mfsdp_backward_pre(rt, u, m) || mfsdp_backward_post(rt, u, m))
                return -1;
    }
    return mfsdp_step_end(rt) == MFSDP_OK ? 0 : -1;
}

static void *job_main(void *p)
{
    job *j = p;
    mfsdp_runtime *rt = NULL;
    j->failed = 1;
    if (mfsdp_create(j->sh, &j->cfg, &rt) != MFSDP_OK) {
        fprintf(stderr, "runtime_bench: %s\n", mfsdp_last_error(NULL));
        return NULL;
    }
    for (int s = 0; s < j->warmup; s++)
        if (run_hooks(rt, j->sh) != 0)
            goto done;
    mfsdp_stats a, b;
    mfsdp_get_stats(rt, &a);
    double t0 = now_s();
    j->best = 1e30;
    for (int s = 0; s < j->steps; s++) {
        double ts = now_s();
        if (run_hooks(rt, j->sh) != 0)
            goto done;
        ts = now_s() - ts;
        if (ts < j->best)
            j->best = ts;
    }
    j->seconds = now_s() - t0;
    mfsdp_get_stats(rt, &b);
    j->ops = (b.ops - a.ops) / j->steps;
    j->failed = 0;
done:
    if (j->failed)
        fprintf(stderr, "runtime_bench: %s\n", mfsdp_last_error(rt));
    mfsdp_destroy(rt);
    return NULL;
}

/* Seconds per step on the local backend: the slowest rank's fastest step
 * (the machine's other load only ever adds time, so the fastest of several
 * steps is the figure least disturbed by it). */
static double run_local(const mfsdp_schedule *sh, int steps, uint32_t flags, int64_t *ops)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    mfsdp_local_group *g;
    if (mfsdp_local_group_create(world, &g) != MFSDP_OK)
        exit(2);
    job *jobs = calloc((size_t)world, sizeof *jobs);
    pthread_t *th = calloc((size_t)world, sizeof *th);
    if (!jobs || !th)
        exit(2);
    for (int64_t r = 0; r < world; r++) {
        jobs[r].sh = sh;
        mfsdp_config_init(&jobs[r].cfg);
        jobs[r].cfg.local_group = g;
        jobs[r].cfg.rank = r;
        jobs[r].cfg.flags = flags;
        jobs[r].steps = steps;
        jobs[r].warmup = 2;
        pthread_create(&th[r], NULL, job_main, &jobs[r]);
    }
    double worst = 0;
    for (int64_t r = 0; r < world; r++) {
        pthread_join(th[r], NULL);
        if (jobs[r].failed)
            exit(1);
        if (jobs[r].best > worst)
            worst = jobs[r].best;
    }
    *ops = jobs[0].ops;
    free(jobs);
    free(th);
    mfsdp_local_group_destroy(g);
    return worst;
}

/* One row of issue 18's goal table: appended to the file named by
 * MFSDP_BENCH_SUMMARY (bench/run collects the rows of all its runs and
 * prints them last), tab-separated: figure, value, reference, goal, met. */
static void summary(const char *figure, double value, const char *reference, const char *goal,
                    int met)
{
    const char *path = getenv("MFSDP_BENCH_SUMMARY");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (!f)
        return;
    fprintf(f, "%s\t%.2f\t%s\t%s\t%s\n", figure, value, reference, goal, met ? "yes" : "no");
    fclose(f);
}

static void bench_overhead(int quick)
{
    printf("\n1. host overhead per replayed op (8 units x 4 tensors of 64 elements, HFSDP, M = 4)\n");
    printf("   fastest step of the slowest rank; goal: us/op with stream threads\n");
    printf("%-8s %-12s %10s %14s %14s %8s\n", "mesh", "model", "ops/step", "us/step", "us/op", "goal");
    int64_t meshes[2][2] = {{1, 1}, {2, 4}};
    for (int k = 0; k < 2; k++) {
        double per_op[2] = {0, 0};   /* streams, synchronous */
        for (int sync = 0; sync < 2; sync++) {
            mfsdp_schedule *sh = tiny_schedule(meshes[k][0], meshes[k][1]);
            int64_t ops = 0;
            double t = run_local(sh, quick ? 20 : 200, sync ? MFSDP_FLAG_SYNCHRONOUS : 0, &ops);
            char mesh[16];
            snprintf(mesh, sizeof mesh, "%lldx%lld", (long long)meshes[k][0], (long long)meshes[k][1]);
            char goal[16] = "";
            if (!sync)
                snprintf(goal, sizeof goal, "<= %d", k == 0 ? 1 : 3);
            printf("%-8s %-12s %10lld %14.1f %14.2f %8s\n", mesh, sync ? "synchronous" : "streams",
                   (long long)ops, t * 1e6, t * 1e6 / (double)ops, goal);
            per_op[sync] = t * 1e6 / (double)ops;
            mfsdp_schedule_free(sh);
        }
        char figure[96], ref[64];
        snprintf(figure, sizeof figure, "host overhead per op (us), stream threads, %lld x %lld",
                 (long long)meshes[k][0], (long long)meshes[k][1]);
        snprintf(ref, sizeof ref, "synchronous model %.2f us", per_op[1]);
        summary(figure, per_op[0], ref, k == 0 ? "<= 1" : "<= 3", per_op[0] <= (k == 0 ? 1.0 : 3.0));
    }
}

static volatile char bench_sink;

typedef struct copier {
    char *a, *b;
    size_t bytes;
    int batches;
    double best;            /* seconds of the fastest batch of 10 copies */
    pthread_barrier_t *start;
} copier;

static void *copier_main(void *p)
{
    copier *c = p;
    if (c->start)
        pthread_barrier_wait(c->start);
    c->best = 1e30;
    for (int k = 0; k < c->batches; k++) {
        double t0 = now_s();
        for (int i = 0; i < 10; i++) {
            memcpy(c->b, c->a, c->bytes);
            c->a[(size_t)(k * 10 + i) % c->bytes] = c->b[((size_t)i * 7919) % c->bytes]; /* used */
        }
        t0 = now_s() - t0;
        if (t0 < c->best)
            c->best = t0;
    }
    bench_sink = c->b[c->bytes / 2];
    return NULL;
}

/* GB/s of memcpy of `bytes` by one thread (threads = 1) or, per thread, by
 * `threads` threads copying their own buffers at once: the fastest batch of
 * 10 copies (the collectives' unit of timing is a step of 10). */
static double memcpy_gbs(size_t bytes, int threads)
{
    copier c[2];
    pthread_t th[2];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    int batches = (int)(((size_t)1 << 30) / bytes / 10) + 3;
    for (int t = 0; t < threads; t++) {
        /* allocated like the runtime's buffers (huge pages from 2 MiB): the
           reference moves bytes through the same kind of memory */
        c[t] = (copier){mf_base_aligned_zalloc(256, bytes), mf_base_aligned_zalloc(256, bytes), bytes,
                        batches, 0, threads > 1 ? &start : NULL};
        if (!c[t].a || !c[t].b)
            exit(2);
        memset(c[t].a, 1, bytes);
        memset(c[t].b, 2, bytes);
    }
    for (int t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, copier_main, &c[t]);
    double worst = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        if (c[t].best > worst)
            worst = c[t].best;
        mf_base_free(c[t].a);
        mf_base_free(c[t].b);
    }
    pthread_barrier_destroy(&start);
    return (double)bytes * 10 / worst / 1e9;
}

static const char *kind_name(mf_opkind k)
{
    return k == MF_OP_ALL_GATHER ? "all_gather" : k == MF_OP_REDUCE_SCATTER ? "reduce_scatter" : "all_reduce";
}

static void bench_local_collectives(int quick)
{
    printf("\n2. local backend collectives (fp32, 10 back-to-back per step) vs one thread's memcpy\n");
    printf("   fastest step of the slowest rank, memcpy: fastest batch of 10 copies (same run);\n"
           "   ratio = algbw / memcpy; goal at 67 MB on 2 ranks; ceiling (2 ranks) = what two\n"
           "   threads copying at once each get / one thread alone. A memcpy of S bytes moves\n"
           "   2 S; from 8 MiB the 2-rank all_reduce moves 4 S (so by traffic its ratio is at\n"
           "   most the ceiling) and the all_gather 3 S (at most 4/3 of it): the least each can\n"
           "   move\n");
    printf("%-15s %6s %10s %12s %12s %12s %7s %7s %7s\n", "collective", "ranks", "MB", "us/op",
           "algbw GB/s", "memcpy GB/s", "ratio", "ceiling", "goal");
    int64_t sizes[] = {1 << 14, 1 << 20, 1 << 24};
    int64_t ranks[] = {2, 4, 8};
    mf_opkind kinds[] = {MF_OP_ALL_GATHER, MF_OP_REDUCE_SCATTER, MF_OP_ALL_REDUCE};
    for (int si = 0; si < 3; si++) {
        if (quick && si == 2)
            break;
        double mc = memcpy_gbs((size_t)sizes[si] * 4, 1);
        double mc2 = memcpy_gbs((size_t)sizes[si] * 4, 2);
        printf("memcpy of %.2f MB: one thread %.2f GB/s; two threads at once %.2f GB/s each\n",
               (double)sizes[si] * 4 / 1e6, mc, mc2);
        for (int ki = 0; ki < 3; ki++)
            for (int ri = 0; ri < 3; ri++) {
                mfsdp_schedule *sh = collective_schedule(ranks[ri], sizes[si], kinds[ki], 10, MF_REDUCE_AVG);
                int64_t ops;
                int steps = sizes[si] >= (1 << 24) ? 4 : quick ? 5 : 20;
                double t = run_local(sh, steps, 0, &ops) / 10;
                double bytes = (double)sh->s->buckets[0].length * 4;
                const char *goal = "";
                if (si == 2 && ri == 0)
                    goal = kinds[ki] == MF_OP_ALL_REDUCE ? ">= 0.5" : kinds[ki] == MF_OP_ALL_GATHER ? ">= 0.8" : "";
                char ceil[16] = "";
                if (ranks[ri] == 2)
                    snprintf(ceil, sizeof ceil, "%.2f", mc2 / mc);
                printf("%-15s %6lld %10.2f %12.1f %12.2f %12.2f %7.2f %7s %7s\n", kind_name(kinds[ki]),
                       (long long)ranks[ri], bytes / 1e6, t * 1e6, bytes / t / 1e9, mc,
                       bytes / t / 1e9 / mc, ceil, goal);
                if (*goal) {
                    char figure[96], ref[96];
                    double ratio = bytes / t / 1e9 / mc, want = kinds[ki] == MF_OP_ALL_REDUCE ? 0.5 : 0.8;
                    snprintf(figure, sizeof figure, "local %s %.0f MB, 2 thread-ranks / memcpy",
                             kind_name(kinds[ki]), bytes / 1e6);
                    snprintf(ref, sizeof ref, "memcpy %.2f GB/s; two at once: %.2f of it", mc, mc2 / mc);
                    summary(figure, ratio, ref, goal, ratio >= want);
                }
                mfsdp_schedule_free(sh);
            }
    }
}

#ifdef MFSDP_HAVE_MPI
/* Ten raw MPI collectives of one kind, blocking or nonblocking + MPI_Wait;
 * called the way the backend calls them for the bench's schedule (the
 * all-reduce from src into dst, like mfsdpc's grad -> grad_final). */
static void raw_batch(mf_opkind kind, int nb, float *src, float *dst, int n)
{
    for (int r = 0; r < 10; r++) {
        MPI_Request req;
        if (kind == MF_OP_ALL_GATHER) {
            if (nb)
                MPI_Iallgather(src, n, MPI_FLOAT, dst, n, MPI_FLOAT, MPI_COMM_WORLD, &req);
            else
                MPI_Allgather(src, n, MPI_FLOAT, dst, n, MPI_FLOAT, MPI_COMM_WORLD);
        } else if (kind == MF_OP_REDUCE_SCATTER) {
            if (nb)
                MPI_Ireduce_scatter_block(src, dst, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
            else
                MPI_Reduce_scatter_block(src, dst, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else {
            if (nb)
                MPI_Iallreduce(src, dst, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
            else
                MPI_Allreduce(src, dst, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        if (nb)
            MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
}

static mfsdp_runtime *mpi_runtime(const mfsdp_schedule *sh, int rank, int blocking)
{
    static MPI_Comm comm;
    comm = MPI_COMM_WORLD;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.backend = MFSDP_BACKEND_MPI;
    cfg.mpi_comm = &comm;
    cfg.rank = rank;
    if (blocking)
        setenv("MFSDP_MPI_BLOCKING", "1", 1);
    mfsdp_runtime *rt = NULL;
    mfsdp_result r = mfsdp_create(sh, &cfg, &rt);
    unsetenv("MFSDP_MPI_BLOCKING");
    if (r != MFSDP_OK) {
        fprintf(stderr, "runtime_bench: %s\n", mfsdp_last_error(NULL));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return rt;
}

/* Each raw variant has buffers of its own, as each runtime has its arena: a
 * variant that ran on the buffers its predecessor had just used would find
 * them in cache (sharing them, nonblocking raw MPI measured 2-3 % faster
 * than blocking raw MPI right before it at 0.26 MB on 8 processes, and as
 * fast with buffers of its own). Allocated like the runtime's buffers (huge
 * pages from 2 MiB). */
static void raw_buffers(int64_t L, float *src[2], float *dst[2])
{
    for (int b = 0; b < 2; b++) {
        src[b] = mf_base_aligned_zalloc(256, (size_t)L * 4);
        dst[b] = mf_base_aligned_zalloc(256, (size_t)L * 4);
        if (!src[b] || !dst[b])
            MPI_Abort(MPI_COMM_WORLD, 2);
        /* touched, like the runtime's buffers (calloc's untouched pages
         * all read the one zero page, which is always in cache) */
        for (int64_t i = 0; i < L; i++) {
            src[b][i] = (float)(i % 7);
            dst[b][i] = 1.0f;
        }
    }
}

/* One row's variants: the runtimes (mfsdp, mf-block, mf-avg or NULL) on
 * their schedules, and the raw calls on their buffers. */
typedef struct mpi_row {
    mf_opkind kind;
    const mfsdp_schedule *sh, *sha;
    mfsdp_runtime *rt[3];
    float *src[2], *dst[2];
    int n;                  /* elements per rank of a raw call */
    int nv;                 /* variants: 4, or 5 with mf-avg */
} mpi_row;

/* Runs the row's variants in turns for steps (+2 warm-up) steps, in a new
 * order each step; best[v]: variant v's fastest step, every rank's, then
 * the slowest rank (mfsdp, mf-block, MPI, MPI_I*, mf-avg). */
static void mpi_interleave(const mpi_row *row, int steps, double best[5])
{
    int order[5] = {0, 1, 2, 3, 4};
    uint32_t seed = 12345;   /* the same on every rank: the same order everywhere */
    for (int v = 0; v < 5; v++)
        best[v] = 1e30;
    for (int step = 0; step < steps + 2; step++) {
        /* A new order each step: a variant inherits the skew between ranks
         * its predecessor left (mf-avg's last pass ends unevenly), so none
         * follows the same one every step. */
        for (int i = row->nv - 1; i > 0; i--) {
            seed = seed * 1664525u + 1013904223u;
            int j = (int)((seed >> 16) % (uint32_t)(i + 1)), x = order[i];
            order[i] = order[j];
            order[j] = x;
        }
        for (int k = 0; k < row->nv; k++) {   /* no barrier: the collectives keep ranks in step */
            int v = order[k];
            double t0 = now_s();
            if (v < 2 || v == 4) {
                mfsdp_runtime *x = row->rt[v == 4 ? 2 : v];
                if (run_hooks(x, v == 4 ? row->sha : row->sh) != 0) {
                    fprintf(stderr, "runtime_bench: %s\n", mfsdp_last_error(x));
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            } else {
                raw_batch(row->kind, v == 3, row->src[v - 2], row->dst[v - 2], row->n);
            }
            double t = (now_s() - t0) / 10;
            if (step >= 2 && t < best[v])
                best[v] = t;
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, best, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
}

/* Rank 0 prints the row (and its summary line when `summarize`). */
static void mpi_row_print(const mpi_row *row, int64_t L, int world, const double best[5], bool summarize)
{
    double raw = best[2] < best[3] ? best[2] : best[3];
    double goal = L * 4 <= 4096 ? 1.10 : 1.05;
    char avg[16] = "-";
    if (row->nv > 4)
        snprintf(avg, sizeof avg, "%.1f", best[4] * 1e6);
    printf("%-15s %9.3f %11.1f %11.1f %11.1f %11.1f %11s %7.2f %7.2f %7.2f\n", kind_name(row->kind),
           (double)L * 4 / 1e6, best[0] * 1e6, best[1] * 1e6, best[2] * 1e6, best[3] * 1e6, avg, best[0] / raw,
           best[1] / raw, goal);
    if (!summarize)
        return;
    char figure[96], ref[96];
    snprintf(figure, sizeof figure, "MPI / best raw MPI, %s %.3f MB, %d procs", kind_name(row->kind),
             (double)L * 4 / 1e6, world);
    snprintf(ref, sizeof ref, "raw %.1f us; mfsdp %.1f us; blocking mode %.2f", raw * 1e6, best[0] * 1e6,
             best[1] / raw);
    char g[16];
    snprintf(g, sizeof g, "<= %.2f", goal);
    summary(figure, best[0] / raw, ref, g, best[0] / raw <= goal);
}

/* One row of bench_mpi: a collective of one kind and size (index si). */
static void bench_mpi_row(int quick, int rank, int world, int si, int64_t size, mf_opkind kind)
{
    mfsdp_schedule *sh = collective_schedule(world, size, kind, 10, MF_REDUCE_SUM);
    int nv = kind == MF_OP_ALL_GATHER ? 4 : 5;   /* avg: reductions only */
    mfsdp_schedule *sha = nv > 4 ? collective_schedule(world, size, kind, 10, MF_REDUCE_AVG) : NULL;
    int64_t L = sh->s->buckets[0].length, n = kind == MF_OP_ALL_REDUCE ? L : L / world;
    /* The fastest of few steps of oversubscribed processes moves by 10-20 % between
       runs, and raw MPI's figure, the better of two variants' fastest, gains from
       the extra draw: the 4 KB and 0.26 MB rows take 200 steps (a few seconds), the
       16.8 MB all-reduce (a goal row) 64 (about a minute on 8 processes), the other
       16.8 MB rows 16 (the bench's time). */
    int steps = quick ? 5 : si < 2 ? 200 : kind == MF_OP_ALL_REDUCE ? 64 : 16;
    mpi_row row = {.kind = kind, .sh = sh, .sha = sha, .n = (int)n, .nv = nv,
                   .rt = {mpi_runtime(sh, rank, 0), mpi_runtime(sh, rank, 1), sha ? mpi_runtime(sha, rank, 0) : NULL}};
    raw_buffers(L, row.src, row.dst);
    double best[5];
    mpi_interleave(&row, steps, best);
    for (int i = 0; i < 3; i++)
        if (row.rt[i])
            mfsdp_destroy(row.rt[i]);
    for (int b = 0; b < 2; b++) {
        mf_base_free(row.src[b]);
        mf_base_free(row.dst[b]);
    }
    if (rank == 0)
        mpi_row_print(&row, L, world, best, si == 0 || kind == MF_OP_ALL_REDUCE);
    mfsdp_schedule_free(sh);
    if (sha)
        mfsdp_schedule_free(sha);
}

/* The MPI backend running a single-collective schedule (default and
 * MFSDP_MPI_BLOCKING=1) vs the same MPI calls, blocking and nonblocking.
 * The schedule sums (what the raw calls do); the default mode also runs the
 * same schedule with `avg` (column mf-avg: the sum, then one pass dividing
 * the result). The variants take turns step by step (a step: 10
 * collectives), in a new order each step, so the machine's load falls on all
 * of them alike; each keeps its fastest step (every rank's, then the slowest
 * rank). */
static void bench_mpi(int quick, const char *only)
{
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank == 0) {
        printf("\n3. MPI backend vs raw MPI on %d processes (fp32 sum, 10 back-to-back per step), us\n"
               "   per collective, fastest of interleaved steps; all_reduce from one buffer into\n"
               "   another (as mfsdpc emits it), raw MPI called the same way; ratio = mfsdp /\n"
               "   best of blocking (MPI) and nonblocking + MPI_Wait (MPI_I*) raw MPI, for the\n"
               "   default (nonblocking, bounded) and MFSDP_MPI_BLOCKING=1 (r-block); mf-avg: the\n"
               "   default mode with reduce avg (the sum, then a pass dividing the result)\n",
               world);
        printf("%-15s %9s %11s %11s %11s %11s %11s %7s %7s %7s\n", "collective", "MB", "mfsdp",
               "mf-block", "MPI", "MPI_I*", "mf-avg", "ratio", "r-block", "goal");
    }
    int64_t sizes[] = {1 << 10, 1 << 16, 1 << 22};
    mf_opkind kinds[] = {MF_OP_ALL_GATHER, MF_OP_REDUCE_SCATTER, MF_OP_ALL_REDUCE};
    for (int si = 0; si < 3; si++) {
        if (quick && si == 2)
            break;
        for (int ki = 0; ki < 3; ki++)
            if (!*only || strcmp(only, kind_name(kinds[ki])) == 0)
                bench_mpi_row(quick, rank, world, si, sizes[si], kinds[ki]);
    }
}
#endif

int main(int argc, char **argv)
{
    int quick = 0, mpi = 0;
    const char *only = "";
    enum { O_QUICK, O_MPI, O_ONLY };
    static const mf_opt opts[] = {{"--quick", NULL, NULL, O_QUICK}, {"--mpi", NULL, NULL, O_MPI},
                                  {"--only", NULL, "a value", O_ONLY}};
    mf_opts p;
    mf_opts_init(&p, "mfsdp-runtime-bench", argc, argv, opts, 3, NULL);
    p.quiet = true; /* any mistake: the usage */
    int id;
    const char *v;
    while ((id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == O_QUICK)
            quick = 1;
        else if (id == O_MPI)
            mpi = 1;
        else if (id == O_ONLY)
            only = v;
        else {
            fprintf(stderr, "usage: mfsdp-runtime-bench [--quick] [--mpi] [--only overhead|local|all_gather|reduce_scatter|all_reduce]\n");
            return 2;
        }
    }
    if (mpi) {
#ifdef MFSDP_HAVE_MPI
        int provided;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        bench_mpi(quick, only);
        MPI_Finalize();
        return 0;
#else
        fprintf(stderr, "mfsdp-runtime-bench: built without MPI\n");
        return 2;
#endif
    }
    printf("libmfsdp %s runtime benchmark (CPU backends)\n", mfsdp_version());
    if (strcmp(only, "local") != 0)
        bench_overhead(quick);
    if (strcmp(only, "overhead") != 0)
        bench_local_collectives(quick);
    return 0;
}
