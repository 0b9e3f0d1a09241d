/*
 * cuda-local driven like a CUDA trainer: several thread-ranks on one GPU, each
 * with its own compute stream, grad_local written by a kernel on that stream
 * with values distinct per rank, microbatch and element, hooks that never
 * block on the device (only the rendezvous of collectives blocks the host), so
 * every cross-stream and cross-rank dependency rests on CUDA events alone.
 * The trainer and its checks are trainer_check's (every mode on every mesh of
 * tc_local_meshes, two steps, each checked): each rank's delivered gradient
 * shard equals (1/N if avg) * sum over ranks and microbatches of the local
 * gradients, and every unsharded weight, copied on the compute stream inside
 * its unit's forward and backward windows, the cast main_weight, bit for bit.
 * test_trainer_check_local replays the same on the CPU local backend.
 * Needs a GPU: exits 77 (skip) only when the CUDA runtime reports no device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "gpu_presence.h"
#include "cuda_ops.h"
#include "mfsdp_nccl.h"

static bool rank_main(void *arg, mfsdp_local_group *g, int64_t rank, char *err, size_t errlen)
{
    const mfsdp_schedule *sh = arg;
    cuda_stream_ctx ctx = {NULL};
    cudaError_t e = cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "rank %lld: cudaStreamCreateWithFlags: %s", (long long)rank, cudaGetErrorString(e));
        return false;
    }
    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    nc.compute_stream = ctx.stream;
    nc.watchdog_poll_ms = 0;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_cuda_local(&cfg, g, &nc);
    cfg.rank = rank;
    cfg.timeout_ms = 60000;
    mfsdp_runtime *rt = NULL;
    mfsdp_result r = mfsdp_create(sh, &cfg, &rt);
    bool ok = r == MFSDP_OK;
    if (!ok) {
        snprintf(err, errlen, "rank %lld: create: %s: %s", (long long)rank, mfsdp_result_string(r),
                 mfsdp_last_error(NULL));
    } else {
        tc_trainer tr;
        ok = tc_open(&tr, rt, sh, rank, &cuda_ops, &ctx) && tc_train(&tr, 2);
        snprintf(err, errlen, "%s", tr.err);
        tc_close(&tr);
    }
    mfsdp_destroy(rt);
    cudaStreamDestroy(ctx.stream);
    return ok;
}

static void test_modes(void **state)
{
    (void)state;
    char err[512];
    for (int k = 0; k < tc_local_nmeshes; k++)
        for (int i = 0; i < tc_local_nmodes; i++) {
            mf_tb_spec spec;
            rt_model_spec(&spec, tc_local_modes[i], &tc_local_meshes[k], 3, tc_local_reduce(i));
            mfsdp_schedule *sh = rt_build(&spec);
            bool ok = tc_run_thread_ranks(sh, rank_main, sh, err, sizeof err);
            mfsdp_schedule_free(sh);
            if (!ok)
                fail_msg("%s on %s: %s", tc_local_modes[i], tc_local_meshes[k].name, err);
        }
}

int main(void)
{
    int presence = gpu_presence();
    if (presence != GPU_PRESENT)
        return presence;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_modes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
