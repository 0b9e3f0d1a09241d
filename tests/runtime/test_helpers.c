/*
 * test_helpers: the public helpers of mfsdp.h (mf_helpers.c) through the
 * public API only, on the local backend (cmocka, one thread per rank, the
 * ranks taken with config.rank = -1) and on the mpi backend (`--mpi`, one
 * process per rank under mpirun).
 *
 *   test_helpers SCHEDULE...          local backend, every schedule
 *   test_helpers --mpi SCHEDULE       this process is one MPI rank
 *
 * Every expected value comes from an independent formula over the whole
 * tensor, never from the shard layout: a full tensor scattered and gathered
 * back is itself; with every rank and microbatch writing g(k, i) into
 * grad_local, the delivered gradient is f * g with f = M (avg) or world * M
 * (sum), so the global norm is f * sqrt(sum over k, i of g(k, i)^2) however
 * the shards are laid out and replicated.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mfsdp.h"
#ifdef MFSDP_HAVE_MPI
#include "mfsdp_mpi.h"
#endif

#define FAIL(...)                                                                   \
    do {                                                                            \
        snprintf(msg, len, __VA_ARGS__);                                            \
        return 1;                                                                   \
    } while (0)
#define OK(call)                                                                    \
    do {                                                                            \
        mfsdp_result r_ = (call);                                                   \
        if (r_ != MFSDP_OK)                                                         \
            FAIL("%s: %s: %s", #call, mfsdp_result_string(r_), mfsdp_last_error(rt)); \
    } while (0)

/* The full tensors: exactly representable in bf16 and fp16. */
static float full_value(int k, int64_t i)
{
    return (float)((k * 5 + i) % 64) * 0.5f;
}

/* The gradient every rank writes every microbatch: multiples of 1/8. */
static float grad_value(int k, int64_t i)
{
    return (float)((k * 7 + i * 3) % 11 - 5) * 0.125f;
}

static int check_conversions(char *msg, size_t len)
{
    /* Hand-worked: 1 + 2^-8 ties to even (down), 1 + 3*2^-8 ties up. */
    static const struct { float f; uint16_t bf16, fp16; } table[] = {
        {1.0f, 0x3f80, 0x3c00},
        {1.00390625f, 0x3f80, 0x3c04},    /* 1 + 2^-8 */
        {1.01171875f, 0x3f82, 0x3c0c},    /* 1 + 3*2^-8 */
        {-2.5f, 0xc020, 0xc100},
        {65520.0f, 0x4780, 0x7c00},       /* fp16 overflow rounds to infinity */
        {5.9604644775390625e-8f, 0x3380, 0x0001}, /* 2^-24: the smallest fp16 subnormal */
    };
    for (size_t t = 0; t < sizeof table / sizeof table[0]; t++) {
        if (mfsdp_f32_to_bf16(table[t].f) != table[t].bf16 ||
            mfsdp_f32_to_fp16(table[t].f) != table[t].fp16)
            FAIL("conversion of %.9g: bf16 %04x fp16 %04x, want %04x %04x", table[t].f,
                 mfsdp_f32_to_bf16(table[t].f), mfsdp_f32_to_fp16(table[t].f), table[t].bf16,
                 table[t].fp16);
    }
    if (mfsdp_bf16_to_f32(0x3f82) != 1.015625f || mfsdp_fp16_to_f32(0x3c0c) != 1.01171875f ||
        !isnan(mfsdp_bf16_to_f32(mfsdp_f32_to_bf16(NAN))))
        FAIL("conversion back to fp32");
    uint16_t h[2];
    float f[2] = {1.0f, -2.5f}, back[2];
    if (mfsdp_convert(h, MFSDP_FP16, f, MFSDP_FP32, 2) != MFSDP_OK || h[0] != 0x3c00 ||
        h[1] != 0xc100 || mfsdp_convert(back, MFSDP_FP32, h, MFSDP_FP16, 2) != MFSDP_OK ||
        back[1] != -2.5f)
        FAIL("mfsdp_convert fp32 <-> fp16");
    if (mfsdp_convert(h, (mfsdp_dtype)7, f, MFSDP_FP32, 2) != MFSDP_ERR_INVALID_ARGUMENT)
        FAIL("mfsdp_convert accepted dtype 7");
    return 0;
}

/* Scatter a full tensor (fp32 and bf16 input), gather it back to all ranks
 * and to the last rank (fp16 output). */
static int check_scatter_gather(mfsdp_runtime *rt, char *msg, size_t len)
{
    int64_t world = mfsdp_world_size(rt), me = mfsdp_rank(rt);
    for (int k = 0; k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(rt, k, &v));
        float *full = malloc((size_t)v.numel * 4), *back = malloc((size_t)v.numel * 4);
        uint16_t *half = malloc((size_t)v.numel * 2);
        if (!full || !back || !half)
            FAIL("out of memory");
        for (int64_t i = 0; i < v.numel; i++) {
            full[i] = full_value(k, i);
            half[i] = mfsdp_f32_to_bf16(full[i]);
        }
        int bad = 0;
        mfsdp_result r = mfsdp_main_weight_scatter(rt, k, (k & 1) ? (void *)half : (void *)full,
                                                   (k & 1) ? MFSDP_BF16 : MFSDP_FP32);
        for (int64_t i = 0; r == MFSDP_OK && i < v.shard_count; i++)
            bad |= ((float *)v.main_weight)[i] != full_value(k, v.shard_offset + i);
        if (r == MFSDP_OK)
            r = mfsdp_main_weight_gather(rt, k, back, MFSDP_FP32, MFSDP_ALL_RANKS);
        for (int64_t i = 0; r == MFSDP_OK && i < v.numel; i++)
            bad |= back[i] != full[i];
        memset(half, 0xff, (size_t)v.numel * 2);
        if (r == MFSDP_OK)
            r = mfsdp_main_weight_gather(rt, k, me == world - 1 ? half : NULL, MFSDP_FP16,
                                         world - 1);
        for (int64_t i = 0; r == MFSDP_OK && me == world - 1 && i < v.numel; i++)
            bad |= mfsdp_fp16_to_f32(half[i]) != full[i];
        free(full);
        free(back);
        free(half);
        if (r != MFSDP_OK)
            FAIL("%s: scatter/gather: %s", v.name, mfsdp_last_error(rt));
        if (bad)
            FAIL("%s: gathered tensor differs from the scattered one", v.name);
    }
    return 0;
}

static int check_allreduce(mfsdp_runtime *rt, char *msg, size_t len)
{
    int64_t world = mfsdp_world_size(rt), me = mfsdp_rank(rt);
    double v[3] = {(double)(me + 1), (double)(me + 1), 0.5};
    OK(mfsdp_allreduce(rt, v, 3, MFSDP_REDUCE_SUM));
    if (v[0] != (double)(world * (world + 1) / 2) || v[2] != 0.5 * (double)world)
        FAIL("allreduce sum: %g %g, want %g %g", v[0], v[2], (double)(world * (world + 1) / 2),
             0.5 * (double)world);
    double mx = (double)me, mn = (double)me;
    OK(mfsdp_allreduce(rt, &mx, 1, MFSDP_REDUCE_MAX));
    OK(mfsdp_allreduce(rt, &mn, 1, MFSDP_REDUCE_MIN));
    if (mx != (double)(world - 1) || mn != 0.0)
        FAIL("allreduce max %g min %g", mx, mn);
    if (mfsdp_allreduce(rt, v, 1, (mfsdp_reduce_op)9) != MFSDP_ERR_INVALID_ARGUMENT)
        FAIL("allreduce accepted op 9");
    return 0;
}

/* One step with grad_local = grad_value everywhere; on the way, helpers
 * refused inside a step. */
static int run_step(mfsdp_runtime *rt, const mfsdp_schedule *sh, char *msg, size_t len)
{
    int units = mfsdp_schedule_num_units(sh), nt = mfsdp_num_tensors(rt);
    int64_t M = mfsdp_schedule_microbatches(sh);
    double norm = 0;
    float one = 1.0f;
    OK(mfsdp_step_begin(rt));
    if (mfsdp_main_weight_scatter(rt, 0, &one, MFSDP_FP32) != MFSDP_ERR_INVALID_USAGE ||
        !strstr(mfsdp_last_error(rt), "inside a step"))
        FAIL("scatter inside a step: %s", mfsdp_last_error(rt));
    if (mfsdp_grad_norm(rt, &norm) != MFSDP_ERR_INVALID_USAGE)
        FAIL("grad_norm inside a step was accepted");
    if (mfsdp_grad_clip(rt, 1.0, &norm) != MFSDP_ERR_INVALID_USAGE)
        FAIL("grad_clip inside a step was accepted");
    /* The gathers and the all-reduce are accepted inside a step
     * (docs/runtime.md §4 and docs/runtime.md §12: they touch no buffer the
     * step writes). */
    double ones = 1;
    OK(mfsdp_allreduce(rt, &ones, 1, MFSDP_REDUCE_SUM));
    if (ones != (double)mfsdp_world_size(rt))
        FAIL("allreduce inside a step: %g, expected %lld", ones, (long long)mfsdp_world_size(rt));
    mfsdp_tensor_view v0;
    OK(mfsdp_tensor_view_get(rt, 0, &v0));
    float *whole = malloc(sizeof *whole * (size_t)v0.numel);
    if (!whole)
        FAIL("out of memory");
    mfsdp_result gr = mfsdp_main_weight_gather(rt, 0, whole, MFSDP_FP32, MFSDP_ALL_RANKS);
    free(whole);
    OK(gr);
    for (int64_t m = 0; m < M; m++) {
        for (int u = 0; u < units; u++) {
            OK(mfsdp_forward_pre(rt, u, m));
            OK(mfsdp_forward_post(rt, u, m));
        }
        for (int u = units - 1; u >= 0; u--) {
            OK(mfsdp_backward_pre(rt, u, m));
            for (int k = 0; k < nt; k++) {
                mfsdp_tensor_view v;
                OK(mfsdp_tensor_view_get(rt, k, &v));
                for (int64_t i = 0; v.unit == u && i < v.numel; i++) {
                    float g = grad_value(k, i);
                    if (v.grad_local_dtype == MFSDP_FP32)
                        ((float *)v.grad_local)[i] = g;
                    else
                        mfsdp_convert((uint16_t *)v.grad_local + i, v.grad_local_dtype, &g,
                                      MFSDP_FP32, 1);
                }
            }
            OK(mfsdp_backward_post(rt, u, m));
        }
    }
    OK(mfsdp_step_end(rt));
    return 0;
}

static int check_grad_norm(mfsdp_runtime *rt, const mfsdp_schedule *sh, char *msg, size_t len)
{
    double norm = 0, after = 0, clipped = 0;
    if (mfsdp_grad_norm(rt, &norm) != MFSDP_ERR_INVALID_USAGE ||
        !strstr(mfsdp_last_error(rt), "before the first mfsdp_step_end"))
        FAIL("grad_norm before any step: %s", mfsdp_last_error(rt));
    if (run_step(rt, sh, msg, len))
        return 1;
    double sumsq = 0;
    int low = 0;
    for (int k = 0; k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(rt, k, &v));
        low |= v.grad_dtype != MFSDP_FP32;
        for (int64_t i = 0; i < v.numel; i++)
            sumsq += (double)grad_value(k, i) * grad_value(k, i);
    }
    double f = (double)mfsdp_schedule_microbatches(sh) *
               (mfsdp_schedule_reduce_is_avg(sh) ? 1.0 : (double)mfsdp_world_size(rt));
    double want = f * sqrt(sumsq), tol = low ? 1e-2 : 1e-6;
    OK(mfsdp_grad_norm(rt, &norm));
    if (fabs(norm - want) > tol * want)
        FAIL("grad norm %.9g, want %.9g", norm, want);
    OK(mfsdp_grad_clip(rt, norm / 2, &clipped));
    OK(mfsdp_grad_norm(rt, &after));
    if (clipped != norm || fabs(after - norm / 2) > tol * norm)
        FAIL("clip to %.9g: norm before %.9g (want %.9g), after %.9g", norm / 2, clipped, norm, after);
    OK(mfsdp_grad_clip(rt, after * 4, &clipped));   /* below the limit: unchanged */
    OK(mfsdp_grad_norm(rt, &norm));
    if (norm != after)
        FAIL("clip below the limit changed the norm %.9g -> %.9g", after, norm);
    return 0;
}

/* Everything one rank checks; 0 when all passed, else 1 with msg. */
static int rank_checks(mfsdp_runtime *rt, const mfsdp_schedule *sh, char *msg, size_t len)
{
    int units = mfsdp_schedule_num_units(sh);
    for (int u = 0; u < units; u++)
        if (mfsdp_unit_find(rt, mfsdp_schedule_unit_name(sh, u)) != u ||
            mfsdp_schedule_unit_find(sh, mfsdp_schedule_unit_name(sh, u)) != u)
            FAIL("mfsdp_unit_find(%s) != %d", mfsdp_schedule_unit_name(sh, u), u);
    if (mfsdp_unit_find(rt, "no.such.unit") != -1 || mfsdp_unit_find(rt, NULL) != -1)
        FAIL("mfsdp_unit_find found a unit that does not exist");
    return check_conversions(msg, len) || check_scatter_gather(rt, msg, len) ||
           check_allreduce(rt, msg, len) || check_grad_norm(rt, sh, msg, len);
}

/* ---- local backend ---- */

typedef struct job {
    const mfsdp_schedule *sh;
    mfsdp_local_group *g;
    int64_t rank;
    int failed;
    char msg[1024];
} job;

static void *local_rank(void *p)
{
    job *j = p;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = j->g;     /* rank stays -1: the group hands out ranks */
    cfg.timeout_ms = 60000;
    mfsdp_runtime *rt = NULL;
    j->failed = 1;
    if (mfsdp_create(j->sh, &cfg, &rt) != MFSDP_OK) {
        snprintf(j->msg, sizeof j->msg, "create: %s", mfsdp_last_error(NULL));
        return NULL;
    }
    j->rank = mfsdp_rank(rt);
    j->failed = rank_checks(rt, j->sh, j->msg, sizeof j->msg);
    mfsdp_destroy(rt);
    return NULL;
}

static const char *const *g_paths;
static int g_npaths;

static void test_local(void **state)
{
    (void)state;
    for (int p = 0; p < g_npaths; p++) {
        mfsdp_schedule *sh = NULL;
        assert_int_equal(mfsdp_schedule_load(g_paths[p], &sh), MFSDP_OK);
        int64_t world = mfsdp_schedule_world_size(sh);
        mfsdp_local_group *g = NULL;
        assert_int_equal(mfsdp_local_group_create(world, &g), MFSDP_OK);
        job *jobs = calloc((size_t)world, sizeof *jobs);
        pthread_t *th = calloc((size_t)world, sizeof *th);
        assert_non_null(jobs);
        assert_non_null(th);
        for (int64_t r = 0; r < world; r++) {
            jobs[r] = (job){.sh = sh, .g = g, .rank = -1};
            assert_int_equal(pthread_create(&th[r], NULL, local_rank, &jobs[r]), 0);
        }
        unsigned long long seen = 0;
        for (int64_t r = 0; r < world; r++) {
            pthread_join(th[r], NULL);
            if (jobs[r].failed)
                fail_msg("%s: rank %lld: %s", g_paths[p], (long long)jobs[r].rank, jobs[r].msg);
            seen |= 1ull << jobs[r].rank;
        }
        /* rank -1 handed every thread a distinct rank of the group */
        assert_int_equal(seen, world >= 64 ? ~0ull : (1ull << world) - 1);
        free(jobs);
        free(th);
        mfsdp_local_group_destroy(g);
        mfsdp_schedule_free(sh);
    }
}

/* A rank that never calls a collective helper: the others time out naming it. */
typedef struct skip_job {
    const mfsdp_schedule *sh;
    mfsdp_local_group *g;
    int64_t rank;
    mfsdp_result r;
    char msg[1024];
} skip_job;

static void *skip_rank(void *p)
{
    skip_job *j = p;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = j->g;
    cfg.rank = j->rank;
    cfg.timeout_ms = 300;
    mfsdp_runtime *rt = NULL;
    j->r = mfsdp_create(j->sh, &cfg, &rt);
    if (j->r == MFSDP_OK && j->rank != 1) {
        double x = 1;
        j->r = mfsdp_allreduce(rt, &x, 1, MFSDP_REDUCE_SUM);
        snprintf(j->msg, sizeof j->msg, "%s", mfsdp_last_error(rt));
    }
    mfsdp_destroy(rt);
    return NULL;
}

/* Runs fn on one thread per rank of the first schedule's world, in one local
 * group, and joins them. Returns the jobs (the caller frees them and *sh) with
 * *world set; skips the test when the world has one rank. */
static skip_job *run_each_rank(void *(*fn)(void *), mfsdp_schedule **sh, int64_t *world)
{
    assert_int_equal(mfsdp_schedule_load(g_paths[0], sh), MFSDP_OK);
    *world = mfsdp_schedule_world_size(*sh);
    if (*world < 2) {
        mfsdp_schedule_free(*sh);
        skip();
    }
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(*world, &g), MFSDP_OK);
    skip_job *jobs = calloc((size_t)*world, sizeof *jobs);
    pthread_t *th = calloc((size_t)*world, sizeof *th);
    assert_non_null(jobs);
    assert_non_null(th);
    for (int64_t r = 0; r < *world; r++) {
        jobs[r] = (skip_job){.sh = *sh, .g = g, .rank = r};
        assert_int_equal(pthread_create(&th[r], NULL, fn, &jobs[r]), 0);
    }
    for (int64_t r = 0; r < *world; r++)
        pthread_join(th[r], NULL);
    free(th);
    mfsdp_local_group_destroy(g);
    return jobs;
}

static void test_local_missing_rank(void **state)
{
    (void)state;
    mfsdp_schedule *sh = NULL;
    int64_t world = 0;
    skip_job *jobs = run_each_rank(skip_rank, &sh, &world);
    for (int64_t r = 0; r < world; r++) {
        if (r == 1)
            continue;
        assert_true(jobs[r].r == MFSDP_ERR_TIMEOUT || jobs[r].r == MFSDP_ERR_ABORTED);
        if (!strstr(jobs[r].msg, "mfsdp_allreduce") || !strstr(jobs[r].msg, "missing ranks: 1"))
            fail_msg("rank %lld: %s", (long long)r, jobs[r].msg);
    }
    free(jobs);
    mfsdp_schedule_free(sh);
}

/* Rank 1 calls a hook out of order mid-step and gives up; every other rank's
 * error names rank 1's own message (the root cause), not a timeout. */
/* Two steps of hooks; rank 1 calls step_end instead of its first
 * backward_post (refused) and gives up. Returns the first failure. */
static mfsdp_result bail_steps(const mfsdp_schedule *sh, const mfsdp_config *cfg, int64_t rank,
                               char *msg, size_t len)
{
    mfsdp_runtime *rt = NULL;
    mfsdp_result r = mfsdp_create(sh, cfg, &rt);
    int units = mfsdp_schedule_num_units(sh);
    int64_t M = mfsdp_schedule_microbatches(sh);
    for (int step = 0; step < 2 && r == MFSDP_OK; step++) {
        r = mfsdp_step_begin(rt);
        for (int64_t m = 0; m < M && r == MFSDP_OK; m++) {
            for (int u = 0; u < units && r == MFSDP_OK; u++) {
                r = mfsdp_forward_pre(rt, u, m);
                if (r == MFSDP_OK)
                    r = mfsdp_forward_post(rt, u, m);
            }
            for (int u = units - 1; u >= 0 && r == MFSDP_OK; u--) {
                r = mfsdp_backward_pre(rt, u, m);
                if (r == MFSDP_OK && rank == 1)
                    r = mfsdp_step_end(rt);   /* skipped backward_post: refused */
                if (r == MFSDP_OK)
                    r = mfsdp_backward_post(rt, u, m);
            }
        }
        if (r == MFSDP_OK)
            r = mfsdp_step_end(rt);
    }
    snprintf(msg, len, "%s", mfsdp_last_error(rt));
    mfsdp_destroy(rt);
    return r;
}

/* A survivor's error must carry rank 1's own message. */
static int names_root_cause(mfsdp_result r, const char *msg)
{
    return r == MFSDP_ERR_ABORTED && strstr(msg, "rank 1 was destroyed with ") &&
           strstr(msg, "its error: mfsdp_step_end() called out of order");
}

static void *bail_rank(void *p)
{
    skip_job *j = p;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = j->g;
    cfg.rank = j->rank;
    cfg.timeout_ms = 30000;
    j->r = bail_steps(j->sh, &cfg, j->rank, j->msg, sizeof j->msg);
    return NULL;
}

static void test_local_root_cause(void **state)
{
    (void)state;
    mfsdp_schedule *sh = NULL;
    int64_t world = 0;
    skip_job *jobs = run_each_rank(bail_rank, &sh, &world);
    assert_int_equal(jobs[1].r, MFSDP_ERR_INVALID_USAGE);
    for (int64_t r = 0; r < world; r++) {
        if (r == 1)
            continue;
        print_message("rank %lld: %s\n", (long long)r, jobs[r].msg);
        if (!names_root_cause(jobs[r].r, jobs[r].msg))
            fail_msg("rank %lld: %s: %s", (long long)r, mfsdp_result_string(jobs[r].r), jobs[r].msg);
    }
    free(jobs);
    mfsdp_schedule_free(sh);
}

/* ---- mpi backend ---- */

/* --mpi-bail: rank 1 gives up mid-step; every other rank's error names
 * rank 1's own message (sent over the runtime's error channel), well before
 * the 30 s timeout. */
static int run_mpi_bail(const char *path, int *argc, char ***argv)
{
#ifdef MFSDP_HAVE_MPI
    int provided = 0, me = 0, rc = 0;
    char msg[1024] = "";
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm comm = MPI_COMM_WORLD;
    mfsdp_schedule *sh = NULL;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_mpi(&cfg, &comm);
    cfg.timeout_ms = 30000;
    if (mfsdp_schedule_load(path, &sh) != MFSDP_OK) {
        fprintf(stderr, "test_helpers: %s\n", mfsdp_last_error(NULL));
        rc = 1;
    } else {
        mfsdp_result r = bail_steps(sh, &cfg, me, msg, sizeof msg);
        rc = me == 1 ? r != MFSDP_ERR_INVALID_USAGE : !names_root_cause(r, msg);
        fprintf(rc ? stderr : stdout, "test_helpers: rank %d: %s: %s\n", me, mfsdp_result_string(r),
                msg);
    }
    mfsdp_schedule_free(sh);
    int any = 0;
    MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (me == 0 && !any)
        printf("test_helpers: mpi: every survivor named rank 1's error\n");
    MPI_Finalize();
    return any;
#else
    (void)path;
    (void)argc;
    (void)argv;
    return 77;
#endif
}

static int run_mpi(const char *path, int *argc, char ***argv)
{
#ifdef MFSDP_HAVE_MPI
    int provided = 0, me = 0, rc = 1;
    char msg[1024] = "";
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm comm = MPI_COMM_WORLD;
    mfsdp_schedule *sh = NULL;
    mfsdp_runtime *rt = NULL;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_mpi(&cfg, &comm);
    cfg.timeout_ms = 60000;
    if (mfsdp_schedule_load(path, &sh) != MFSDP_OK || mfsdp_create(sh, &cfg, &rt) != MFSDP_OK)
        snprintf(msg, sizeof msg, "%s", mfsdp_last_error(NULL));
    else
        rc = rank_checks(rt, sh, msg, sizeof msg);
    mfsdp_destroy(rt);
    mfsdp_schedule_free(sh);
    int any = 0;
    MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rc)
        fprintf(stderr, "test_helpers: rank %d: %s\n", me, msg);
    else if (me == 0 && !any)
        printf("test_helpers: mpi: all helper checks passed on %s\n", path);
    MPI_Finalize();
    return any;
#else
    (void)path;
    (void)argc;
    (void)argv;
    fprintf(stderr, "test_helpers: built without MPI\n");
    return 77;
#endif
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "--mpi"))
        return run_mpi(argv[2], &argc, &argv);
    if (argc >= 3 && !strcmp(argv[1], "--mpi-bail"))
        return run_mpi_bail(argv[2], &argc, &argv);
    if (argc < 2) {
        fprintf(stderr, "usage: test_helpers SCHEDULE... | test_helpers --mpi SCHEDULE\n");
        return 2;
    }
    g_paths = (const char *const *)argv + 1;
    g_npaths = argc - 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local),
        cmocka_unit_test(test_local_missing_rank),
        cmocka_unit_test(test_local_root_cause),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
