/*
 * cuda-local driven like a CUDA trainer: several thread-ranks on one GPU, each
 * with its own compute stream, grad_local written by a kernel on that stream
 * with values distinct per rank, microbatch and element, hooks that never
 * block on the device (only the rendezvous of collectives blocks the host), so
 * every cross-stream and cross-rank dependency rests on CUDA events alone.
 * After two steps (no optimizer) each rank's delivered gradient shard must
 * equal (1/N) * sum over ranks and microbatches of the local gradients, and
 * every unsharded weight the cast main_weight, bit for bit: the values are
 * multiples of 1/64 and the meshes powers of two, so every sum and average is
 * exact in fp32 whatever the order.
 * Needs a GPU: exits 77 (skip) when cudaGetDeviceCount reports none.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_cuda_kernels.h"
#include "mfsdp_nccl.h"
#include "rt_testlib.h"

typedef struct rank_arg {
    const mfsdp_schedule *sh;
    mfsdp_local_group *g;
    int64_t rank;
    char err[512];              /* first problem, "" when none */
} rank_arg;

static uint32_t grad_seed(int64_t rank, int64_t m, int t)
{
    return 5000u + 1000u * (uint32_t)rank + 100u * (uint32_t)m + (uint32_t)t;
}

#define FAIL(...)                                                     \
    do {                                                              \
        if (!a->err[0])                                               \
            snprintf(a->err, sizeof a->err, __VA_ARGS__);             \
        goto done;                                                    \
    } while (0)
#define CK(x)                                                         \
    do {                                                              \
        cudaError_t e_ = (x);                                         \
        if (e_ != cudaSuccess)                                        \
            FAIL("rank %lld: %s: %s", (long long)a->rank, #x, cudaGetErrorString(e_)); \
    } while (0)
#define OK(x)                                                         \
    do {                                                              \
        mfsdp_result r_ = (x);                                        \
        if (r_ != MFSDP_OK)                                           \
            FAIL("rank %lld: %s: %s: %s", (long long)a->rank, #x, mfsdp_result_string(r_), \
                 rt ? mfsdp_last_error(rt) : mfsdp_last_error(NULL)); \
    } while (0)

static void *rank_main(void *p)
{
    rank_arg *a = p;
    const mfsdp_schedule *sh = a->sh;
    mfsdp_runtime *rt = NULL;
    cudaStream_t compute = NULL;
    float *host = NULL;
    int64_t N = mfsdp_schedule_world_size(sh), M = mfsdp_schedule_microbatches(sh);
    int U = mfsdp_schedule_num_units(sh);
    CK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    nc.compute_stream = compute;
    nc.watchdog_poll_ms = 0;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_cuda_local(&cfg, a->g, &nc);
    cfg.rank = a->rank;
    cfg.timeout_ms = 60000;
    OK(mfsdp_create(sh, &cfg, &rt));
    int T = mfsdp_num_tensors(rt);
    /* main_weight at tensor index i is pattern(7 + t, i) on every rank */
    for (int t = 0; t < T; t++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(rt, t, &v));
        if (!v.shard_count)
            continue;
        host = realloc(host, (size_t)v.shard_count * sizeof *host);
        if (!host)
            FAIL("out of memory");
        for (int64_t i = 0; i < v.shard_count; i++)
            host[i] = mf_cuda_pattern(7 + (uint32_t)t, v.shard_offset + i);
        CK(cudaMemcpyAsync(v.main_weight, host, (size_t)v.shard_count * sizeof *host, cudaMemcpyHostToDevice,
                           compute));
        CK(cudaStreamSynchronize(compute));
    }
    for (int step = 0; step < 2; step++) {
        OK(mfsdp_step_begin(rt));
        for (int64_t m = 0; m < M; m++) {
            for (int u = 0; u < U; u++) {
                OK(mfsdp_forward_pre(rt, u, m));
                OK(mfsdp_forward_post(rt, u, m));
            }
            for (int u = U - 1; u >= 0; u--) {
                OK(mfsdp_backward_pre(rt, u, m));
                for (int t = 0; t < T; t++) {
                    mfsdp_tensor_view v;
                    OK(mfsdp_tensor_view_get(rt, t, &v));
                    if (v.unit == u)
                        CK(mf_cuda_fill_pattern(v.grad_local, (mf_dtype)v.grad_local_dtype, v.numel,
                                                grad_seed(a->rank, m, t), compute));
                }
                OK(mfsdp_backward_post(rt, u, m));
            }
        }
        OK(mfsdp_step_end(rt));
    }
    OK(mfsdp_synchronize(rt));
    for (int t = 0; t < T; t++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(rt, t, &v));
        if (v.shard_count) {
            host = realloc(host, (size_t)v.shard_count * sizeof *host);
            if (!host)
                FAIL("out of memory");
            CK(cudaMemcpy(host, v.grad, (size_t)v.shard_count * sizeof *host, cudaMemcpyDeviceToHost));
            for (int64_t i = 0; i < v.shard_count && !a->err[0]; i++) {
                double want = 0;
                for (int64_t r = 0; r < N; r++)
                    for (int64_t m = 0; m < M; m++)
                        want += mf_cuda_pattern(grad_seed(r, m, t), v.shard_offset + i);
                if (mfsdp_schedule_reduce_is_avg(sh))
                    want /= (double)N;
                if ((double)host[i] != want)
                    FAIL("rank %lld: %s: gradient element %lld is %g, want %g", (long long)a->rank, v.name,
                         (long long)(v.shard_offset + i), (double)host[i], want);
            }
        }
        size_t es = mfsdp_dtype_size(v.weight_dtype);
        unsigned char *w = malloc((size_t)v.numel * es);
        if (!w)
            FAIL("out of memory");
        cudaError_t e = cudaMemcpy(w, v.weight, (size_t)v.numel * es, cudaMemcpyDeviceToHost);
        for (int64_t i = 0; i < v.numel && e == cudaSuccess && !a->err[0]; i++) {
            float mw = mf_cuda_pattern(7 + (uint32_t)t, i);
            bool same = v.weight_dtype == MFSDP_FP32 ? ((float *)w)[i] == mw
                                                     : ((uint16_t *)w)[i] == (v.weight_dtype == MFSDP_BF16
                                                                                 ? mf_cuda_host_to_bf16(mw)
                                                                                 : mf_cuda_host_to_fp16(mw));
            if (!same)
                snprintf(a->err, sizeof a->err, "rank %lld: %s: weight element %lld is not the cast main_weight",
                         (long long)a->rank, v.name, (long long)i);
        }
        free(w);
        CK(e);
    }
done:
    free(host);
    mfsdp_destroy(rt);
    if (compute)
        cudaStreamDestroy(compute);
    return NULL;
}

static void run(const char *mode, const rt_mesh *mesh, mf_reduce reduce)
{
    mf_tb_spec spec;
    rt_model_spec(&spec, mode, mesh, 3, reduce);
    mfsdp_schedule *sh = rt_build(&spec);
    int64_t N = mfsdp_schedule_world_size(sh);
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(N, &g), MFSDP_OK);
    rank_arg *args = calloc((size_t)N, sizeof *args);
    pthread_t *th = calloc((size_t)N, sizeof *th);
    assert_non_null(args);
    assert_non_null(th);
    for (int64_t r = 0; r < N; r++) {
        args[r] = (rank_arg){.sh = sh, .g = g, .rank = r};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int64_t r = 0; r < N; r++)
        pthread_join(th[r], NULL);
    for (int64_t r = 0; r < N; r++)
        if (args[r].err[0])
            fail_msg("%s on %s: %s", mode, mesh->name, args[r].err);
    free(args);
    free(th);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

static void test_modes(void **state)
{
    (void)state;
    static const rt_mesh meshes[] = {{"1x4", 2, {1, 4}}, {"2x2", 2, {2, 2}}, {"2x4", 2, {2, 4}},
                                     {"2x2x2", 3, {2, 2, 2}}};
    static const char *const modes[] = {"ddp", "zero1", "zero3", "hsdp", "hfsdp", "fsdp2d",
                                        "zero2_inner_zero1_outer", "hsdp_nosync"};
    for (size_t k = 0; k < sizeof meshes / sizeof meshes[0]; k++)
        for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
            run(modes[i], &meshes[k], i % 2 ? MF_REDUCE_SUM : MF_REDUCE_AVG);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_modes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
