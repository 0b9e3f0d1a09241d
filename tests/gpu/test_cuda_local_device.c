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
 * test_host_compute_managed_access: host-compute cuda-local is created only
 * on a device with concurrentManagedAccess (refused, naming it, without:
 * run on the CPU model with GM_NO_CONCURRENT_MANAGED=1).
 * test_close_race: a rank that closes while its peers are slow to enqueue
 * their waits on its events (this file's cudaStreamWaitEvent, which the
 * statically linked backend calls, sleeps on the slow ranks' threads): no
 * peer may wait on an event the closing rank destroyed (the CPU model of
 * CUDA reports such a wait; a GPU may fault or ignore it).
 * Needs a GPU: exits 77 (skip) only when the CUDA runtime reports no device.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "gpu_presence.h"
#include "cuda_ops.h"
#include "mfsdp_nccl.h"

/* Microseconds this thread sleeps before each cudaStreamWaitEvent. */
static _Thread_local int wait_delay_us;

/* Interposes CUDA's: the backend (linked into this binary) calls this one. */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    static cudaError_t (*real)(cudaStream_t, cudaEvent_t, unsigned int);
    if (!real)
        real = (cudaError_t(*)(cudaStream_t, cudaEvent_t, unsigned int))dlsym(RTLD_NEXT, "cudaStreamWaitEvent");
    if (!real)
        return cudaErrorUnknown;
    if (wait_delay_us) {
        struct timespec ts = {0, (long)wait_delay_us * 1000L};
        nanosleep(&ts, NULL);
    }
    return real(stream, event, flags);
}

/* What a thread-rank runs: the schedule, and the delay of every rank but 0. */
typedef struct case_arg {
    const mfsdp_schedule *sh;
    int steps;
    int peer_delay_us;
} case_arg;

static bool rank_main(void *arg, mfsdp_local_group *g, int64_t rank, char *err, size_t errlen)
{
    const case_arg *a = arg;
    const mfsdp_schedule *sh = a->sh;
    wait_delay_us = rank ? a->peer_delay_us : 0;
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
        ok = tc_open(&tr, rt, sh, rank, &cuda_ops, &ctx) && tc_train(&tr, a->steps);
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
            case_arg a = {.sh = sh, .steps = 2, .peer_delay_us = 0};
            bool ok = tc_run_thread_ranks(sh, rank_main, &a, err, sizeof err);
            mfsdp_schedule_free(sh);
            if (!ok)
                fail_msg("%s on %s, M=3: %s", tc_local_modes[i], tc_local_meshes[k].name, err);
        }
}

/* Rank 0 trains one step and destroys its runtime at once; ranks 1..3 sleep
 * 10 ms before every cudaStreamWaitEvent, so their waits on rank 0's `done`
 * events of the last collective come after rank 0 closed. Two rounds. */
static void test_close_race(void **state)
{
    (void)state;
    char err[512];
    mf_tb_spec spec;
    rt_model_spec(&spec, "zero3", &tc_local_meshes[0], 1, MF_REDUCE_AVG);
    mfsdp_schedule *sh = rt_build(&spec);
    for (int round = 0; round < 2; round++) {
        case_arg a = {.sh = sh, .steps = 1, .peer_delay_us = 10000};
        if (!tc_run_thread_ranks(sh, rank_main, &a, err, sizeof err))
            fail_msg("zero3 on %s, M=1, round %d (rank 0 closes first): %s", tc_local_meshes[0].name, round, err);
    }
    mfsdp_schedule_free(sh);
}

/* Host-compute cuda-local (backend_config NULL) needs concurrentManagedAccess:
 * created when the device has it, refused naming it when not (the CPU model
 * with GM_NO_CONCURRENT_MANAGED=1). */
static void test_host_compute_managed_access(void **state)
{
    (void)state;
    int dev = 0, concurrent = 0;
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev), cudaSuccess);
    static const rt_mesh one = {"1x1", 2, {1, 1}};
    mf_tb_spec spec;
    rt_model_spec(&spec, "zero3", &one, 1, MF_REDUCE_AVG);
    mfsdp_schedule *sh = rt_build(&spec);
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(1, &g), MFSDP_OK);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_cuda_local(&cfg, g, NULL);
    cfg.rank = 0;
    mfsdp_runtime *rt = NULL;
    mfsdp_result r = mfsdp_create(sh, &cfg, &rt);
    if (concurrent) {
        if (r != MFSDP_OK)
            fail_msg("host compute, concurrentManagedAccess 1: create: %s", mfsdp_last_error(NULL));
        mfsdp_destroy(rt);
    } else {
        assert_int_equal(r, MFSDP_ERR_UNSUPPORTED);
        assert_non_null(strstr(mfsdp_last_error(NULL), "has no concurrentManagedAccess"));
    }
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

int main(void)
{
    int presence = gpu_presence();
    if (presence != GPU_PRESENT)
        return presence;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_host_compute_managed_access),
                                       cmocka_unit_test(test_close_race), cmocka_unit_test(test_modes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
