/*
 * test_programs: the short-step and evaluation programs of compiled
 * schedules (docs/runtime.md §4.3), through the public API only, on the
 * local backend (one thread per rank) and on the mpi backend (`--mpi`, one
 * process per rank under mpirun).
 *
 *   test_programs SCHEDULE...          local backend, every schedule
 *   test_programs --mpi SCHEDULE       this process is one MPI rank
 *   test_programs --mpi-recreate SCHEDULE   the same after a runtime destroyed
 *                                      half-way through a step (and a refused
 *                                      hook) in the same processes
 *
 * Each rank runs: an evaluation pass; a full step; two passes; a short step
 * of 1 microbatch; a short step of M-1; a full step; a pass; a full step.
 * After every step the optimizer writes the next version of the weights.
 * Expected values are formulas over the whole tensor, never the shard
 * layout: every weight the trainer reads (training or evaluation) is w(k, i,
 * version) cast to the weight dtype; the delivered gradient of a step of m
 * microbatches is sum over ranks r and microbatches j < m of g(r, j, k, i),
 * divided by the world under `reduce avg`.
 */
#include <math.h>
#include <stdbool.h>
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

#define FAIL(...)                                \
    do {                                         \
        snprintf(r->msg, sizeof r->msg, __VA_ARGS__); \
        return 1;                                \
    } while (0)
#define OK(call)                                                                              \
    do {                                                                                      \
        mfsdp_result r_ = (call);                                                             \
        if (r_ != MFSDP_OK)                                                                   \
            FAIL("%s: %s: %s", #call, mfsdp_result_string(r_), mfsdp_last_error(r->rt));      \
    } while (0)

/* Weights exactly representable in bf16 and fp16 (at most 7 significant bits). */
static float weight_value(int k, int64_t i, int version)
{
    return (float)((k * 5 + i) % 32) * 0.5f + (float)version * 0.25f;
}

/* What rank `rank` writes into grad_local in microbatch j: multiples of 1/8. */
static float grad_value(int64_t rank, int64_t j, int k, int64_t i)
{
    return (float)((k * 7 + i * 3 + rank * 5 + j * 2) % 11 - 5) * 0.125f;
}

typedef struct rank_run {
    const mfsdp_schedule *sh;
    mfsdp_config cfg;
    mfsdp_runtime *rt;
    int64_t world, M;
    int version;             /* of the weights in main_weight now */
    float *scratch;          /* numel of the largest tensor */
    char msg[1024];
    int rc;
} rank_run;

static int to_float(rank_run *r, const void *src, mfsdp_dtype d, int64_t n)
{
    OK(mfsdp_convert(r->scratch, MFSDP_FP32, src, d, (size_t)n));
    return 0;
}

/* Every tensor of unit u holds this version's weights, cast. */
static int check_weights(rank_run *r, int u, const char *where)
{
    for (int k = 0; k < mfsdp_num_tensors(r->rt); k++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(r->rt, k, &v));
        if (v.unit != u)
            continue;
        if (to_float(r, v.weight, v.weight_dtype, v.numel))
            return 1;
        for (int64_t i = 0; i < v.numel; i++)
            if (r->scratch[i] != weight_value(k, i, r->version))
                FAIL("rank %lld, %s: %s[%lld] = %g, expected %g (weights of version %d)",
                     (long long)mfsdp_rank(r->rt), where, v.name, (long long)i, (double)r->scratch[i],
                     (double)weight_value(k, i, r->version), r->version);
    }
    return 0;
}

static int write_grads(rank_run *r, int u, int64_t j)
{
    int64_t rank = mfsdp_rank(r->rt);
    for (int k = 0; k < mfsdp_num_tensors(r->rt); k++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(r->rt, k, &v));
        if (v.unit != u)
            continue;
        for (int64_t i = 0; i < v.numel; i++)
            r->scratch[i] = grad_value(rank, j, k, i);
        OK(mfsdp_convert(v.grad_local, v.grad_local_dtype, r->scratch, MFSDP_FP32, (size_t)v.numel));
    }
    return 0;
}

/* The delivered gradient of a step of m microbatches; then the optimizer
 * writes the next version of the weights. */
static int check_grads_and_update(rank_run *r, int64_t m, const char *what)
{
    bool avg = mfsdp_schedule_reduce_is_avg(r->sh);
    for (int k = 0; k < mfsdp_num_tensors(r->rt); k++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(r->rt, k, &v));
        if (v.shard_count == 0)
            continue;
        if (to_float(r, v.grad, v.grad_dtype, v.shard_count))
            return 1;
        double tol = v.grad_dtype == MFSDP_FP32 ? 1e-5 : 2e-2;
        for (int64_t i = 0; i < v.shard_count; i++) {
            double want = 0;
            for (int64_t rk = 0; rk < r->world; rk++)
                for (int64_t j = 0; j < m; j++)
                    want += grad_value(rk, j, k, v.shard_offset + i);
            if (avg)
                want /= (double)r->world;
            if (fabs(r->scratch[i] - want) > tol * (1 + fabs(want)))
                FAIL("rank %lld, %s of %lld microbatches: %s grad[%lld] = %g, expected %g",
                     (long long)mfsdp_rank(r->rt), what, (long long)m, v.name,
                     (long long)(v.shard_offset + i), (double)r->scratch[i], want);
        }
    }
    r->version++;
    for (int k = 0; k < mfsdp_num_tensors(r->rt); k++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(r->rt, k, &v));
        for (int64_t i = 0; i < v.shard_count; i++)
            r->scratch[i] = weight_value(k, v.shard_offset + i, r->version);
        OK(mfsdp_convert(v.main_weight, v.main_weight_dtype, r->scratch, MFSDP_FP32, (size_t)v.shard_count));
    }
    return 0;
}

static int eval_pass(rank_run *r)
{
    int U = mfsdp_schedule_num_units(r->sh);
    for (int u = 0; u < U; u++) {
        OK(mfsdp_eval_forward_pre(r->rt, u));
        if (check_weights(r, u, "evaluation pass"))
            return 1;
        OK(mfsdp_eval_forward_post(r->rt, u));
    }
    return 0;
}

/* A step of m <= M microbatches (m < M: a short step). */
static int step(rank_run *r, int64_t m)
{
    int U = mfsdp_schedule_num_units(r->sh);
    const char *what = m < r->M ? "a short step" : "a full step";
    OK(mfsdp_step_begin(r->rt));
    for (int64_t j = 0; j < m; j++) {
        for (int u = 0; u < U; u++) {
            OK(mfsdp_forward_pre(r->rt, u, j));
            if (check_weights(r, u, what))
                return 1;
            OK(mfsdp_forward_post(r->rt, u, j));
        }
        for (int u = U - 1; u >= 0; u--) {
            OK(mfsdp_backward_pre(r->rt, u, j));
            if (write_grads(r, u, j))
                return 1;
            OK(mfsdp_backward_post(r->rt, u, j));
        }
    }
    OK(mfsdp_step_end(r->rt));
    return check_grads_and_update(r, m, what);
}

static int run_rank(rank_run *r)
{
    OK(mfsdp_create(r->sh, &r->cfg, &r->rt));
    r->world = mfsdp_world_size(r->rt);
    r->M = mfsdp_schedule_microbatches(r->sh);
    int64_t most = 1;
    for (int k = 0; k < mfsdp_num_tensors(r->rt); k++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(r->rt, k, &v));
        if (v.numel > most)
            most = v.numel;
    }
    r->scratch = malloc(sizeof *r->scratch * (size_t)most);
    if (!r->scratch)
        FAIL("out of memory");
    r->version = -1;
    if (check_grads_and_update(r, 0, "(initial weights)")) /* writes version 0; no grad to check */
        return 1;
    int rc = eval_pass(r) || step(r, r->M) || eval_pass(r) || eval_pass(r);
    if (!rc && r->M >= 2)
        rc = step(r, 1);
    if (!rc && r->M >= 3)
        rc = step(r, r->M - 1);
    if (!rc)
        rc = step(r, r->M) || eval_pass(r) || step(r, r->M);
    return rc;
}

static void finish_rank(rank_run *r)
{
    mfsdp_destroy(r->rt);
    free(r->scratch);
}

static void *local_rank(void *arg)
{
    rank_run *r = arg;
    r->rc = run_rank(r);
    finish_rank(r);
    return NULL;
}

static void run_local(const char *path)
{
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(path, &sh) != MFSDP_OK)
        fail_msg("%s", mfsdp_last_error(NULL));
    int64_t world = mfsdp_schedule_world_size(sh);
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(world, &g), MFSDP_OK);
    rank_run *runs = calloc((size_t)world, sizeof *runs);
    pthread_t *th = calloc((size_t)world, sizeof *th);
    assert_non_null(runs);
    assert_non_null(th);
    for (int64_t k = 0; k < world; k++) {
        runs[k].sh = sh;
        mfsdp_config_init(&runs[k].cfg);
        runs[k].cfg.local_group = g;
        runs[k].cfg.timeout_ms = 60000;
        assert_int_equal(pthread_create(&th[k], NULL, local_rank, &runs[k]), 0);
    }
    for (int64_t k = 0; k < world; k++)
        pthread_join(th[k], NULL);
    for (int64_t k = 0; k < world; k++)
        if (runs[k].rc)
            fail_msg("%s: %s", path, runs[k].msg);
    free(runs);
    free(th);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

static char **paths;
static int npaths;

static void test_programs_local(void **state)
{
    (void)state;
    for (int i = 0; i < npaths; i++)
        run_local(paths[i]);
}

#ifdef MFSDP_HAVE_MPI
/* A runtime given up half-way through a step, after a hook the trace check
 * refused: destroy must not hang or crash, and the next create must work. */
static int abandon_mid_step(rank_run *r, MPI_Comm comm)
{
    OK(mfsdp_create(r->sh, &r->cfg, &r->rt));
    OK(mfsdp_step_begin(r->rt));
    OK(mfsdp_forward_pre(r->rt, 0, 0));
    if (mfsdp_backward_pre(r->rt, 0, 0) != MFSDP_ERR_INVALID_USAGE)
        FAIL("a backward_pre inside a forward window was not refused");
    /* every rank inside the step before any gives up (the prefetch of unit 1
     * may still be in flight: destroy aborts it) */
    MPI_Barrier(comm);
    mfsdp_destroy(r->rt);
    r->rt = NULL;
    return 0;
}
#endif

static int run_mpi(const char *path, bool recreate, int *argc, char ***argv)
{
#ifdef MFSDP_HAVE_MPI
    int provided;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm comm = MPI_COMM_WORLD;
    rank_run r = {0};
    if (mfsdp_schedule_load(path, (mfsdp_schedule **)&r.sh) != MFSDP_OK) {
        fprintf(stderr, "%s\n", mfsdp_last_error(NULL));
        MPI_Abort(comm, 2);
    }
    mfsdp_config_init(&r.cfg);
    mfsdp_config_set_mpi(&r.cfg, &comm);
    r.cfg.timeout_ms = 60000;
    r.rc = recreate ? abandon_mid_step(&r, comm) : 0;
    if (!r.rc)
        r.rc = run_rank(&r);
    if (r.rc)
        fprintf(stderr, "FAILED: %s\n", r.msg);
    finish_rank(&r);
    int mine = r.rc, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm);
    int rank;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0)
        printf("%s\n", any ? "0 passed, 1 failed" : "1 passed, 0 failed");
    mfsdp_schedule_free((mfsdp_schedule *)r.sh);
    MPI_Finalize();
    return any ? 1 : 0;
#else
    (void)path;
    (void)recreate;
    (void)argc;
    (void)argv;
    fprintf(stderr, "built without MPI\n");
    return 77;
#endif
}

int main(int argc, char **argv)
{
    if (argc >= 3 && (!strcmp(argv[1], "--mpi") || !strcmp(argv[1], "--mpi-recreate")))
        return run_mpi(argv[2], !strcmp(argv[1], "--mpi-recreate"), &argc, &argv);
    paths = argv + 1;
    npaths = argc - 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_programs_local)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
