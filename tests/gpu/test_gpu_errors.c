/*
 * Error handling of the GPU backends that needs no GPU: the mapping of CUDA
 * and NCCL results onto mfsdp_result, NCCL's data types, the message format,
 * and mfsdp_create refusing bad GPU configurations with a clear message,
 * before any device work and without leaking (checked with the runtime's
 * allocation counter). On a machine without a device, creating an NCCL
 * runtime fails cleanly with MFSDP_ERR_BACKEND naming the missing device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "mf_cuda.h"
#include "mfsdp_nccl.h"
#include "rt_testlib.h"

static void test_map_cuda(void **state)
{
    (void)state;
    assert_int_equal(mf_cuda_map_error(cudaSuccess), MFSDP_OK);
    assert_int_equal(mf_cuda_map_error(cudaErrorMemoryAllocation), MFSDP_ERR_OUT_OF_MEMORY);
    assert_int_equal(mf_cuda_map_error(cudaErrorInvalidValue), MFSDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(mf_cuda_map_error(cudaErrorInvalidDevice), MFSDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(mf_cuda_map_error(cudaErrorNoDevice), MFSDP_ERR_BACKEND);
    assert_int_equal(mf_cuda_map_error(cudaErrorLaunchFailure), MFSDP_ERR_BACKEND);
    assert_int_equal(mf_cuda_map_error(cudaErrorIllegalAddress), MFSDP_ERR_BACKEND);
    char msg[256];
    assert_int_equal(mf_cuda_fail(cudaErrorMemoryAllocation, msg, sizeof msg, "op %d", 7), MFSDP_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(msg, "op 7: cudaErrorMemoryAllocation ("));
}

static void test_map_nccl(void **state)
{
    (void)state;
    assert_int_equal(mf_cuda_nccl_map_error(ncclSuccess), MFSDP_OK);
    assert_int_equal(mf_cuda_nccl_map_error(ncclRemoteError), MFSDP_ERR_ABORTED);
    assert_int_equal(mf_cuda_nccl_map_error(ncclInProgress), MFSDP_ERR_TIMEOUT);
    assert_int_equal(mf_cuda_nccl_map_error(ncclInvalidArgument), MFSDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(mf_cuda_nccl_map_error(ncclUnhandledCudaError), MFSDP_ERR_BACKEND);
    assert_int_equal(mf_cuda_nccl_map_error(ncclSystemError), MFSDP_ERR_BACKEND);
    assert_int_equal(mf_cuda_nccl_map_error(ncclInternalError), MFSDP_ERR_BACKEND);
    assert_int_equal(mf_cuda_nccl_map_error(ncclInvalidUsage), MFSDP_ERR_BACKEND);
    assert_int_equal(mf_cuda_nccl_dtype(MF_FP32), ncclFloat32);
    assert_int_equal(mf_cuda_nccl_dtype(MF_BF16), ncclBfloat16);
    assert_int_equal(mf_cuda_nccl_dtype(MF_FP16), ncclFloat16);
}

static void test_config_defaults(void **state)
{
    (void)state;
    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    assert_int_equal(nc.device, -1);
    assert_null(nc.world_comm);
    assert_false(nc.flags & MFSDP_NCCL_NONBLOCKING); /* blocking by default */
    assert_true(nc.watchdog_poll_ms > 0);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_nccl(&cfg, &nc);
    assert_int_equal(cfg.backend, MFSDP_BACKEND_NCCL);
    assert_ptr_equal(cfg.backend_config, &nc);
    assert_true(mfsdp_backend_available(MFSDP_BACKEND_NCCL));
    assert_true(mfsdp_backend_available(MFSDP_BACKEND_CUDA_LOCAL));
}

/* mfsdp_create must fail with `want` and a message containing `needle`. */
static void expect_create_fails(const mfsdp_schedule *sh, const mfsdp_config *cfg, mfsdp_result want,
                                const char *needle)
{
    int64_t live = mf_base_alloc_live();
    mfsdp_runtime *rt = (mfsdp_runtime *)1;
    mfsdp_result r = mfsdp_create(sh, cfg, &rt);
    if (r != want || !strstr(mfsdp_last_error(NULL), needle))
        fail_msg("create gave %s: %s (want %s, a message with '%s')", mfsdp_result_string(r),
                 mfsdp_last_error(NULL), mfsdp_result_string(want), needle);
    assert_null(rt);
    assert_int_equal(mf_base_alloc_live(), live);
}

static void test_create_refusals(void **state)
{
    (void)state;
    static const rt_mesh m22 = {"2x2", 2, {2, 2}}, m11 = {"1x1", 2, {1, 1}};
    mf_tb_spec spec;
    rt_model_spec(&spec, "hfsdp", &m22, 2, MF_REDUCE_AVG);
    mfsdp_schedule *sh4 = rt_build(&spec);
    rt_model_spec(&spec, "hfsdp", &m11, 2, MF_REDUCE_AVG);
    mfsdp_schedule *sh1 = rt_build(&spec);

    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.backend = MFSDP_BACKEND_NCCL; /* NULL backend_config: a world of one */
    cfg.rank = 0;
    expect_create_fails(sh4, &cfg, MFSDP_ERR_INVALID_ARGUMENT, "pass world_comm or a unique id");

    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    mfsdp_config_set_nccl(&cfg, &nc);
    nc.flags |= MFSDP_NCCL_HOST_COMPUTE | MFSDP_NCCL_GRAPHS;
    expect_create_fails(sh1, &cfg, MFSDP_ERR_INVALID_ARGUMENT, "MFSDP_NCCL_GRAPHS needs a device trainer");

    mfsdp_nccl_config_init(&nc);
    nc.flags |= 1u << 20;
    expect_create_fails(sh1, &cfg, MFSDP_ERR_INVALID_ARGUMENT, "unknown mfsdp_nccl_config flags 0x100000");

    mfsdp_nccl_config_init(&nc);
    nc.watchdog_poll_ms = -5;
    expect_create_fails(sh1, &cfg, MFSDP_ERR_INVALID_ARGUMENT, "watchdog_poll_ms is -5");

    mfsdp_nccl_config_init(&nc);
    nc.has_unique_id = 1;
    cfg.rank = -1;
    expect_create_fails(sh4, &cfg, MFSDP_ERR_INVALID_ARGUMENT, "cfg->rank must be this rank in [0, 4)");

    /* cuda-local: no graphs, and no NCCL communicators */
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(1, &g), MFSDP_OK);
    mfsdp_nccl_config_init(&nc);
    nc.flags |= MFSDP_NCCL_GRAPHS;
    mfsdp_config_set_cuda_local(&cfg, g, &nc);
    cfg.rank = 0;
    expect_create_fails(sh1, &cfg, MFSDP_ERR_UNSUPPORTED, "cuda-local: CUDA graph mode");
    mfsdp_nccl_config_init(&nc);
    nc.has_unique_id = 1;
    expect_create_fails(sh1, &cfg, MFSDP_ERR_INVALID_ARGUMENT, "world_comm and unique_id are for the NCCL");

    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        /* no GPU here: a valid configuration fails cleanly, naming it */
        mfsdp_config_set_cuda_local(&cfg, g, NULL);
        expect_create_fails(sh1, &cfg, MFSDP_ERR_BACKEND, "no usable CUDA device");
        mfsdp_config_init(&cfg);
        cfg.backend = MFSDP_BACKEND_NCCL;
        cfg.rank = 0;
        expect_create_fails(sh1, &cfg, MFSDP_ERR_BACKEND, "no usable CUDA device");
    }
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh1);
    mfsdp_schedule_free(sh4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_cuda),
        cmocka_unit_test(test_map_nccl),
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_create_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
