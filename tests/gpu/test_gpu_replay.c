/*
 * The docs/design.md §4.1 oracle (mf_check) through the GPU backends, on builder
 * schedules independent of the planner:
 *   - cuda-local: every mode of docs/semantics.md §4.5 x meshes {1x1, 1x4, 2x2, 2x4, 4x2,
 *     3x2, 2x2x2} x M in {1, 3}, thread-ranks on one GPU, two steps each:
 *     device buffers, casts, accumulation, events and the three streams with
 *     many ranks;
 *   - nccl: every mode on a 1x1 mesh through a real NCCL communicator;
 *   - a rank that stops calling hooks: the others fail with a timeout or an
 *     abort within the timeout instead of hanging.
 * Needs a GPU: exits 77 (skip) only when there is no device (gpu_presence.h).
 * MFSDP_GPU_QUICK=1 limits cuda-local to the meshes 1x1, 2x2 and 2x4.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "gpu_presence.h"
#include "rt_testlib.h"

static int check_cuda_local(const mfsdp_schedule *sh, const mf_check_opts *o, int64_t timeout_ms,
                            mf_check_outcome *outs)
{
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.backend = MFSDP_BACKEND_CUDA_LOCAL; /* backend_config NULL: host compute */
    cfg.timeout_ms = timeout_ms;
    return mf_check_local(sh, NULL, &cfg, o, outs);
}

/* MFSDP_GPU_QUICK=1 (the device check's time box): meshes 1x1, 2x2 and 2x4 only. */
static bool skip_mesh(const char *name)
{
    const char *q = getenv("MFSDP_GPU_QUICK");
    if (!q || strcmp(q, "1") != 0)
        return false;
    return strcmp(name, "1x1") != 0 && strcmp(name, "2x2") != 0 && strcmp(name, "2x4") != 0;
}

static void run_mode(const char *mode, mf_reduce reduce)
{
    for (int k = 0; k < rt_nmeshes; k++)
        for (int64_t M = 1; M <= 3 && !skip_mesh(rt_meshes[k].name); M += 2) {
            mf_tb_spec spec;
            rt_model_spec(&spec, mode, &rt_meshes[k], M, reduce);
            mfsdp_schedule *sh = rt_build(&spec);
            int64_t world = mfsdp_schedule_world_size(sh);
            mf_check_outcome *outs = calloc((size_t)world, sizeof *outs);
            assert_non_null(outs);
            mf_check_opts o = {.steps = 2, .stop_rank = -1, .stop_step = -1, .out = NULL};
            int rc = check_cuda_local(sh, &o, 60000, outs);
            if (rc != 0)
                fail_msg("cuda-local: %s on %s, M=%lld: %s", mode, rt_meshes[k].name, (long long)M, outs[0].msg);
            free(outs);
            mfsdp_schedule_free(sh);
        }
}

#define MODE_TEST(name, reduce)           \
    static void test_##name(void **state) \
    {                                     \
        (void)state;                      \
        run_mode(#name, reduce);          \
    }
MODE_TEST(ddp, MF_REDUCE_AVG)
MODE_TEST(zero1, MF_REDUCE_AVG)
MODE_TEST(zero2, MF_REDUCE_SUM)
MODE_TEST(zero3, MF_REDUCE_AVG)
MODE_TEST(hsdp, MF_REDUCE_AVG)
MODE_TEST(hfsdp, MF_REDUCE_AVG)
MODE_TEST(hsdp_nosync, MF_REDUCE_SUM)
MODE_TEST(fsdp2d, MF_REDUCE_AVG)
MODE_TEST(zero2_inner_zero1_outer, MF_REDUCE_AVG)

/* The check's exchange for a world of one: a buffer of the check's own
 * exchange size (mf_check_xchg_bytes), never a guessed constant. */
typedef struct one_xchg {
    uint8_t *buf;
    size_t cap;
} one_xchg;

static const void *one_allgather(void *ctx, int64_t rank, const void *mine, size_t bytes, bool failing)
{
    one_xchg *x = ctx;
    (void)rank;
    (void)failing;
    if (bytes > x->cap)
        return NULL;
    memcpy(x->buf, mine, bytes);
    return x->buf;
}

/* Every mode on a 1x1 mesh through NCCL (its own communicator of one rank). */
static void test_nccl_one_rank(void **state)
{
    (void)state;
    static const rt_mesh one = {"1x1", 2, {1, 1}};
    for (int i = 0; i < mf_tb_nmodes; i++)
        for (int64_t M = 1; M <= 3; M += 2) {
            mf_tb_spec spec;
            rt_model_spec(&spec, mf_tb_modes[i], &one, M, MF_REDUCE_AVG);
            mfsdp_schedule *sh = rt_build(&spec);
            one_xchg ox = {.cap = mf_check_xchg_bytes(sh)};
            ox.buf = malloc(ox.cap);
            assert_non_null(ox.buf);
            mfsdp_config cfg;
            mfsdp_config_init(&cfg);
            cfg.backend = MFSDP_BACKEND_NCCL;
            cfg.rank = 0;
            cfg.timeout_ms = 60000;
            mf_check_xchg x = {one_allgather, NULL, &ox};
            mf_check_opts o = {.steps = 2, .stop_rank = -1, .stop_step = -1, .out = NULL};
            mf_check_outcome out;
            int rc = mf_check_rank(sh, &cfg, &x, &o, &out);
            free(ox.buf);
            if (rc != 0)
                fail_msg("nccl: %s on 1x1, M=%lld: %s %s", mf_tb_modes[i], (long long)M, out.msg, out.own);
            mfsdp_schedule_free(sh);
        }
}

/* Rank 3 of a 2x4 HFSDP mesh stops calling hooks in step 2: the survivors
 * return an error (timeout or abort) instead of hanging. */
static void test_dead_rank(void **state)
{
    (void)state;
    static const rt_mesh m = {"2x4", 2, {2, 4}};
    mf_tb_spec spec;
    rt_model_spec(&spec, "hfsdp", &m, 2, MF_REDUCE_AVG);
    mfsdp_schedule *sh = rt_build(&spec);
    mf_check_outcome outs[8];
    mf_check_opts o = {.steps = 3, .stop_rank = 3, .stop_step = 2, .out = NULL};
    int rc = check_cuda_local(sh, &o, 3000, outs);
    assert_int_not_equal(rc, 0);
    int failed = 0;
    for (int r = 0; r < 8; r++)
        if (r != 3 && (outs[r].error == MFSDP_ERR_TIMEOUT || outs[r].error == MFSDP_ERR_ABORTED))
            failed++;
    assert_true(failed > 0);
    mfsdp_schedule_free(sh);
}

int main(void)
{
    int presence = gpu_presence();
    if (presence != GPU_PRESENT)
        return presence;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ddp),   cmocka_unit_test(test_zero1),
        cmocka_unit_test(test_zero2), cmocka_unit_test(test_zero3),
        cmocka_unit_test(test_hsdp),  cmocka_unit_test(test_hfsdp),
        cmocka_unit_test(test_hsdp_nosync), cmocka_unit_test(test_fsdp2d),
        cmocka_unit_test(test_zero2_inner_zero1_outer), cmocka_unit_test(test_nccl_one_rank),
        cmocka_unit_test(test_dead_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
