/*
 * test_offload_device: MFSDP_FLAG_OFFLOAD_MAIN on a GPU (engine/mf_offload.c,
 * the backends' alloc_host: cudaHostAlloc mapped | portable), through
 * cuda-local thread-ranks in host-compute mode (managed arena):
 *   - where the buffers live: main_weight and grad views are pinned host
 *     memory (cudaPointerGetAttributes: cudaMemoryTypeHost, device pointer
 *     equal to the host one), weight and grad_local are not; the figures
 *     (offload active, host bytes = the layout's, the arena = the plan);
 *   - the oracle (mf_check) passes with the flag for several modes x meshes
 *     x M, and every rank's master weights after three steps are bit for bit
 *     those of the same run without the flag (the casts then read the master
 *     weights from host memory through unified addressing, the gradient
 *     comes back through the mirror copied at step_end).
 *   - NCCL, a world of one: refused with MFSDP_NCCL_GRAPHS, accepted without.
 * Needs a GPU: exits 77 (skip) only when there is no device (gpu_presence.h).
 * The same checks run on the CPU through a fake host block in
 * tests/runtime/test_offload.c.
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
#include "mfsdp_nccl.h"
#include "mf_offload.h"
#include "rt_testlib.h"

static int oracle(const mfsdp_schedule *sh, uint32_t flags, mf_check_outcome *outs)
{
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.backend = MFSDP_BACKEND_CUDA_LOCAL; /* backend_config NULL: host compute */
    cfg.timeout_ms = 60000;
    cfg.flags = flags;
    mf_check_opts o = {.steps = 3, .stop_rank = -1, .stop_step = -1, .out = NULL};
    return mf_check_local(sh, NULL, &cfg, &o, outs);
}

static enum cudaMemoryType memory_type(const void *p, const void **dev)
{
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    assert_int_equal(cudaPointerGetAttributes(&a, p), cudaSuccess);
    if (dev)
        *dev = a.devicePointer;
    return a.type;
}

static void test_placement(void **state)
{
    (void)state;
    mf_tb_spec spec;
    rt_model_spec(&spec, "zero3", &rt_meshes[0], 1, MF_REDUCE_AVG);   /* 1x1 */
    mfsdp_schedule *sh = rt_build(&spec);
    int64_t *off = calloc((size_t)sh->s->nbuffers, sizeof *off);
    int64_t total = mf_offload_layout(sh->s, off, NULL, NULL);
    free(off);
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(1, &g), MFSDP_OK);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.backend = MFSDP_BACKEND_CUDA_LOCAL;
    cfg.local_group = g;
    cfg.flags = MFSDP_FLAG_OFFLOAD_MAIN;
    mfsdp_runtime *rt = NULL;
    if (mfsdp_create(sh, &cfg, &rt) != MFSDP_OK)
        fail_msg("create: %s", mfsdp_last_error(NULL));
    assert_int_equal(mfsdp_offload_active(rt), 1);
    assert_int_equal(mfsdp_offload_host_bytes(rt), total);
    assert_int_equal(mfsdp_allocated_bytes(rt), mfsdp_schedule_peak_bytes(sh));
    assert_non_null(strstr(mfsdp_offload_status(rt), "on the cuda-local backend"));
    int held = 0;
    for (int i = 0; i < mfsdp_num_tensors(rt); i++) {
        mfsdp_tensor_view v;
        assert_int_equal(mfsdp_tensor_view_get(rt, i, &v), MFSDP_OK);
        if (!v.shard_count)
            continue;
        const void *dev = NULL;
        assert_int_equal(memory_type(v.main_weight, &dev), cudaMemoryTypeHost);
        assert_ptr_equal(dev, v.main_weight);
        assert_int_equal(memory_type(v.grad, &dev), cudaMemoryTypeHost);
        assert_ptr_equal(dev, v.grad);
        assert_int_not_equal(memory_type(v.weight, NULL), cudaMemoryTypeHost);
        assert_int_not_equal(memory_type(v.grad_local, NULL), cudaMemoryTypeHost);
        held++;
    }
    assert_true(held > 0);
    mfsdp_destroy(rt);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

static void test_bit_identical(void **state)
{
    (void)state;
    static const char *const modes[] = {"zero3", "hfsdp", "ddp", "hsdp_nosync"};
    static const int meshes[] = {0, 2, 3};   /* 1x1, 2x2, 2x4 */
    for (size_t k = 0; k < sizeof modes / sizeof *modes; k++)
        for (size_t j = 0; j < sizeof meshes / sizeof *meshes; j++)
            for (int64_t M = 1; M <= 3; M += 2) {
                mf_tb_spec spec;
                rt_model_spec(&spec, modes[k], &rt_meshes[meshes[j]], M, MF_REDUCE_AVG);
                mfsdp_schedule *sh = rt_build(&spec);
                int64_t world = mfsdp_schedule_world_size(sh);
                mf_check_outcome *a = calloc((size_t)world, sizeof *a), *b = calloc((size_t)world, sizeof *b);
                assert_true(a && b);
                if (oracle(sh, 0, a) != 0)
                    fail_msg("%s %s M=%lld: %s", modes[k], rt_meshes[meshes[j]].name, (long long)M, a[0].msg);
                if (oracle(sh, MFSDP_FLAG_OFFLOAD_MAIN, b) != 0)
                    fail_msg("offload: %s %s M=%lld: %s", modes[k], rt_meshes[meshes[j]].name, (long long)M,
                             b[0].msg);
                for (int64_t r = 0; r < world; r++)
                    if (a[r].digest != b[r].digest)
                        fail_msg("%s %s M=%lld rank %lld: master weights differ with the flag", modes[k],
                                 rt_meshes[meshes[j]].name, (long long)M, (long long)r);
                free(a);
                free(b);
                mfsdp_schedule_free(sh);
            }
}

/* NCCL, a world of one: with MFSDP_NCCL_GRAPHS the flag is refused (a
 * captured step_end cannot wait and copy to the host); without, accepted. */
static void test_nccl_graphs_refused(void **state)
{
    (void)state;
    const char *ok = getenv("MFSDP_GPU_NCCL_OK");   /* the device check: 0 with its NCCL stub */
    if (!mfsdp_backend_available(MFSDP_BACKEND_NCCL) || (ok && strcmp(ok, "0") == 0))
        skip();
    mf_tb_spec spec;
    rt_model_spec(&spec, "zero3", &rt_meshes[0], 1, MF_REDUCE_AVG);   /* 1x1 */
    mfsdp_schedule *sh = rt_build(&spec);
    for (int graphs = 0; graphs < 2; graphs++) {
        mfsdp_nccl_config nc;
        mfsdp_nccl_config_init(&nc);
        if (graphs)
            nc.flags |= MFSDP_NCCL_GRAPHS;
        mfsdp_config cfg;
        mfsdp_config_init(&cfg);
        mfsdp_config_set_nccl(&cfg, &nc);
        cfg.rank = 0;
        cfg.flags = MFSDP_FLAG_OFFLOAD_MAIN;
        mfsdp_runtime *rt = NULL;
        mfsdp_result r = mfsdp_create(sh, &cfg, &rt);
        if (graphs) {
            assert_int_equal(r, MFSDP_ERR_UNSUPPORTED);
            assert_non_null(strstr(mfsdp_last_error(NULL), "not with MFSDP_NCCL_GRAPHS"));
        } else {
            if (r != MFSDP_OK && strstr(mfsdp_last_error(NULL), "NCCL is not installed")) {
                mfsdp_schedule_free(sh);   /* the device check's NCCL stub */
                skip();
            }
            if (r != MFSDP_OK)
                fail_msg("create: %s", mfsdp_last_error(NULL));
            assert_int_equal(mfsdp_offload_active(rt), 1);
            assert_non_null(strstr(mfsdp_offload_status(rt), "on the nccl backend"));
        }
        mfsdp_destroy(rt);
    }
    mfsdp_schedule_free(sh);
}

int main(void)
{
    int presence = gpu_presence();
    if (presence != GPU_PRESENT)
        return presence;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_nccl_graphs_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
