/*
 * test_mpi_rh: the MPI backend's own small reduce-scatter (recursive
 * halving over point-to-point, rh_reduce_scatter in runtime/backends/mf_backend_mpi.c)
 * under mpirun on a power-of-2 number of ranks, and the bits of its small
 * all-reduce (libnbc's; a recursive-doubling one measured slower and would
 * change them unless it pairs ranks alike). Hand-built schedules: a
 * reduce-scatter of grad_local into grad at 256 elements per rank (small:
 * one round) and at 16 MiB of blocks in all plus 4352 elements per rank
 * (large: rounds of rh_chunk elements, the last one short); an all-reduce of
 * grad_local into weight_full, then one in place. Each runs twice (the
 * scratch is reused).
 * Inputs are non-integer values whose sums round, so the order of the
 * additions shows in the bits; the oracle is Open MPI's own
 * MPI_Ireduce_scatter_block / MPI_Iallreduce (libnbc, what the backend ran
 * before) on the same inputs, which must match bit for bit, in fp32 and in
 * bf16 (whose sum op, like the backend's, adds in fp32 and rounds once).
 *
 *   test_mpi_rh            every rank compares its blocks with the oracle's
 *   test_mpi_rh --stop R   rank R never runs the step: every other rank
 *                          must fail with MFSDP_ERR_TIMEOUT or ABORTED
 *                          within the 1 s timeout (no hang)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mf_rt.h"
#include "mf_test_builder.h"
#include "mfsdp.h"
#include "mfsdp_mpi.h"

#define SMALL_PER_RANK 256

/* Elements per rank of the large reduce-scatter: its blocks take 16 MiB in
 * all (where rh_reduce_scatter takes large ones back from libnbc), plus 17
 * times the small count (no padding), so its last round is short. */
static int64_t large_per_rank(int64_t g, mf_dtype dt)
{
    return ((int64_t)16 << 20) / (g * (int64_t)mf_dtype_size(dt)) + 17 * SMALL_PER_RANK;
}

static mfsdp_schedule *rs_schedule(int64_t g, mf_dtype dt, mf_opkind kind, int64_t per_rank)
{
    mf_tb_spec spec;
    mf_tb_spec_1d(&spec, g, MF_REDUCE_SUM);
    spec.layouts[0] = (mf_tb_layout){{dt, dt, MF_FP32}, {"F", "F", "F"}};
    spec.units[0] = (mf_tb_unit){"u", false, 1, {{"t", per_rank * g, 0}}};
    char err[256];
    mf_schedule *s = mf_tb_build(&spec, err, sizeof err);
    if (!s || s->buckets[0].length != per_rank * g) {
        fprintf(stderr, "test_mpi_rh: cannot build the schedule: %s\n",
                s ? "the bucket is padded" : err);
        return NULL;
    }
    int local = -1, grad = -1, full = -1;
    for (int i = 0; i < s->nbuffers; i++) {
        if (s->buffers[i].kind == MF_BUF_GRAD_LOCAL)
            local = i;
        if (s->buffers[i].kind == MF_BUF_GRAD)
            grad = i;
        if (s->buffers[i].kind == MF_BUF_WEIGHT_FULL)
            full = i;
    }
    int nc = kind == MF_OP_ALL_REDUCE ? 2 : 1;   /* collectives (never an in-place reduce-scatter) */
    mf_op *ops = mf_arena_array(s->arena, (size_t)nc + 2, sizeof *ops);
    for (int k = 0; k < nc; k++)
        ops[k] = (mf_op){.id = k, .phase = MF_PHASE_STEP_BEGIN, .unit = -1, .when = MF_WHEN_EVERY,
                         .stream = MF_STREAM_INNER, .kind = kind, .bucket = 0, .axis = 0,
                         .dtype = dt, .event = -1, .src = local,
                         .count = kind == MF_OP_ALL_REDUCE ? per_rank * g : per_rank,
                         .dst = kind == MF_OP_REDUCE_SCATTER ? grad : k == 0 ? full : local};
    mf_tb_step_begin_fence(ops, nc);
    s->ops = ops;
    s->nops = nc + 2;
    s->nevents = 1;
    mf_schedule_summarize(s);
    mfsdp_schedule *h = NULL;
    if (mf_rt_schedule_wrap(s, &h, err, sizeof err) != MFSDP_OK) {
        fprintf(stderr, "test_mpi_rh: %s\n", err);
        return NULL;
    }
    return h;
}

static mfsdp_result run_step(mfsdp_runtime *rt)
{
    mfsdp_result r = mfsdp_step_begin(rt);
    if (r == MFSDP_OK)
        r = mfsdp_forward_pre(rt, 0, 0);
    if (r == MFSDP_OK)
        r = mfsdp_forward_post(rt, 0, 0);
    if (r == MFSDP_OK)
        r = mfsdp_backward_pre(rt, 0, 0);
    if (r == MFSDP_OK)
        r = mfsdp_backward_post(rt, 0, 0);
    if (r == MFSDP_OK)
        r = mfsdp_step_end(rt);
    return r;
}

/* The bf16 sum as the backend defines it: add in fp32, round once. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    (void)dt;
    for (int i = 0; i < *len; i++)
        b[i] = mf_dtype_f32_to_bf16(mf_dtype_bf16_to_f32(a[i]) + mf_dtype_bf16_to_f32(b[i]));
}

/* Rank r's element i: a value of mixed magnitude whose sums round. */
static float input(int r, int64_t i)
{
    unsigned h = (unsigned)(i * 2654435761u) ^ (unsigned)(r * 40503u + 17u);
    return (float)(h % 100003u) / 997.0f * (float)(1 + (h >> 20) % 7) - 50.0f;
}

/* Fills grad_local, computes the oracle with MPI_Ireduce_scatter_block
 * (MPI_Iallreduce), runs the step, compares grad (weight_full and the
 * in-place grad_local) with it. */
static int check(mfsdp_runtime *rt, int me, int g, mf_dtype dt, mf_opkind kind, int64_t per_rank,
                 MPI_Op bsum)
{
    mfsdp_tensor_view v;
    size_t es = dt == MF_FP32 ? 4 : 2;
    if (mfsdp_tensor_view_get(rt, 0, &v) != MFSDP_OK || v.numel != per_rank * g ||
        v.shard_count != per_rank) {
        fprintf(stderr, "rank %d: unexpected tensor view\n", me);
        return 1;
    }
    char *local = v.grad_local;
    size_t out = kind == MF_OP_ALL_REDUCE ? (size_t)v.numel * es : (size_t)per_rank * es;
    char *in = malloc((size_t)v.numel * es), *want = malloc(out);
    if (!in || !want)
        return 1;
    for (int64_t i = 0; i < v.numel; i++) {
        float x = input(me, i);
        if (dt == MF_FP32)
            memcpy(in + i * 4, &x, 4);
        else {
            uint16_t b = mf_dtype_f32_to_bf16(x);
            memcpy(in + i * 2, &b, 2);
        }
    }
    memcpy(local, in, (size_t)v.numel * es);
    MPI_Request req;
    MPI_Datatype type = dt == MF_FP32 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op op = dt == MF_FP32 ? MPI_SUM : bsum;
    if (kind == MF_OP_ALL_REDUCE)
        MPI_Iallreduce(in, want, (int)v.numel, type, op, MPI_COMM_WORLD, &req);
    else
        MPI_Ireduce_scatter_block(in, want, (int)per_rank, type, op, MPI_COMM_WORLD, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    int bad = 0;
    mfsdp_result r = run_step(rt);
    if (r != MFSDP_OK) {
        fprintf(stderr, "rank %d: %s\n", me, mfsdp_last_error(rt));
        bad = 1;
    } else if (kind == MF_OP_REDUCE_SCATTER ? memcmp(v.grad, want, out) != 0
                                            : memcmp(v.weight, want, out) || memcmp(local, want, out)) {
        fprintf(stderr, "rank %d: %s %s of %lld elements per rank differs from libnbc's\n", me,
                dt == MF_FP32 ? "fp32" : "bf16", mf_opkind_name(kind), (long long)per_rank);
        bad = 1;
    }
    free(in);
    free(want);
    return bad;
}

static int run_dtype(int me, int g, mf_dtype dt, mf_opkind kind, int64_t per_rank, int stop,
                     MPI_Op bsum)
{
    mfsdp_schedule *sh = rs_schedule(g, dt, kind, per_rank);
    MPI_Comm comm = MPI_COMM_WORLD;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_mpi(&cfg, &comm);
    cfg.timeout_ms = stop >= 0 ? 1000 : 120000;
    mfsdp_runtime *rt = NULL;
    int bad = !sh || mfsdp_create(sh, &cfg, &rt) != MFSDP_OK;
    if (bad)
        fprintf(stderr, "rank %d: setup failed: %s\n", me, mfsdp_last_error(NULL));
    else if (stop < 0)
        bad = check(rt, me, g, dt, kind, per_rank, bsum) ||
              check(rt, me, g, dt, kind, per_rank, bsum);   /* reused */
    else if (me != stop) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        mfsdp_result r = run_step(rt);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        bad = !(r == MFSDP_ERR_TIMEOUT || r == MFSDP_ERR_ABORTED) || s > 30;
        fprintf(stderr, "rank %d: %s after %.1f s: %s\n", me, bad ? "WRONG" : "failed as expected",
                s, mfsdp_last_error(rt));
    }
    if (stop >= 0)
        MPI_Barrier(MPI_COMM_WORLD);   /* the stopped rank waits for the survivors */
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    mfsdp_destroy(rt);
    mfsdp_schedule_free(sh);
    return any;
}

int main(int argc, char **argv)
{
    int provided, me, g;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &g);
    int stop = argc == 3 && !strcmp(argv[1], "--stop") ? atoi(argv[2]) : -1;
    MPI_Op bsum;
    MPI_Op_create(bf16_sum, 1, &bsum);
    int any = (g & (g - 1)) != 0 || g < 2;
    if (any && me == 0)
        fprintf(stderr, "test_mpi_rh: needs a power-of-2 number of ranks (have %d)\n", g);
    /* the small and the large reduce-scatter, the small all-reduce */
    mf_opkind kinds[3] = {MF_OP_REDUCE_SCATTER, MF_OP_REDUCE_SCATTER, MF_OP_ALL_REDUCE};
    for (int k = 0; k < 3 && !any; k++) {
        mf_dtype dts[2] = {MF_FP32, MF_BF16};
        for (int i = 0; i < (stop < 0 ? 2 : 1) && !any; i++)
            any = run_dtype(me, g, dts[i], kinds[k], k == 1 ? large_per_rank(g, dts[i]) : SMALL_PER_RANK,
                            stop, bsum);
    }
    MPI_Op_free(&bsum);
    if (me == 0 && !any)
        printf("test_mpi_rh: %s\n", stop >= 0 ? "every survivor failed, none hung"
                                              : "fp32 and bf16 reduce-scatters (small and large) "
                                                "and all-reduces match libnbc's bit for bit");
    MPI_Finalize();
    return any;
}
