/*
 * The NCCL backend driven the way a CUDA trainer drives it: device buffers
 * (ncclMemAlloc pool registered with the communicators), the trainer's own
 * compute stream, grad_local written by a kernel on that stream, hooks that
 * never block the host, blocking communicators (the default) and the watchdog
 * thread.
 * A 1x1 mesh (one GPU, real NCCL communicators of one rank):
 *   - eager steps: the delivered gradient equals the fp32 sum of the
 *     microbatches' local gradients and every unsharded weight equals the cast
 *     main_weight, bit for bit;
 *   - CUDA graph mode: one step captured as three graphs (first, middle and
 *     last microbatch) and replayed twice gives the same bits, so nothing of
 *     the last microbatch (the outer reduction, step_end) is dropped;
 *   - a capture in cudaStreamCaptureModeGlobal that starts right after eager
 *     steps (the watchdog still holds their tracking events) and waits 3
 *     watchdog periods before its first hook is not invalidated: the
 *     watchdog's thread queries in relaxed capture mode;
 *   - out-of-order hooks are refused; a NULL stream query gives NULL.
 * Needs a GPU: exits 77 (skip) when cudaGetDeviceCount reports none.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "mf_cuda_kernels.h"
#include "mfsdp_nccl.h"
#include "rt_testlib.h"

#define CK(x) assert_int_equal((int)(x), (int)cudaSuccess)
#define OK(x) assert_int_equal((int)(x), (int)MFSDP_OK)

static cudaStream_t compute;
static enum cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeThreadLocal;
static int capture_delay_ms; /* between cudaStreamBeginCapture and the first hook */

static mfsdp_runtime *make_runtime(const mfsdp_schedule *sh, uint32_t extra_flags)
{
    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    nc.compute_stream = compute;
    nc.flags |= extra_flags;
    nc.watchdog_poll_ms = 20;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_nccl(&cfg, &nc);
    cfg.rank = 0;
    cfg.timeout_ms = 60000;
    mfsdp_runtime *rt = NULL;
    mfsdp_result r = mfsdp_create(sh, &cfg, &rt);
    if (r != MFSDP_OK)
        fail_msg("create: %s: %s", mfsdp_result_string(r), mfsdp_last_error(NULL));
    assert_ptr_equal(mfsdp_nccl_stream(rt, MFSDP_STREAM_COMPUTE), compute);
    assert_non_null(mfsdp_nccl_stream(rt, MFSDP_STREAM_INNER));
    assert_true(mfsdp_nccl_stream(rt, MFSDP_STREAM_INNER) != mfsdp_nccl_stream(rt, MFSDP_STREAM_OUTER));
    return rt;
}

/* main_weight shard of every tensor: fp32 pattern (seed 7) at tensor-local index. */
static void init_main_weight(mfsdp_runtime *rt)
{
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(rt, t, &v));
        if (!v.shard_count)
            continue;
        assert_int_equal(v.main_weight_dtype, MFSDP_FP32);
        float *h = malloc((size_t)v.shard_count * sizeof *h);
        assert_non_null(h);
        for (int64_t i = 0; i < v.shard_count; i++)
            h[i] = mf_cuda_pattern(7 + (uint32_t)t, v.shard_offset + i);
        CK(cudaMemcpy(v.main_weight, h, (size_t)v.shard_count * sizeof *h, cudaMemcpyHostToDevice));
        free(h);
    }
    CK(cudaDeviceSynchronize());
}

static uint32_t grad_seed(int64_t m, int t)
{
    return 1000u + 100u * (uint32_t)m + (uint32_t)t;
}

/* One step's hooks; grad_local written on the compute stream. With `graphs`
 * each microbatch position is captured into g[pos] instead of run. */
static void step(mfsdp_runtime *rt, const mfsdp_schedule *sh, bool graphs, cudaGraph_t g[3])
{
    int U = mfsdp_schedule_num_units(sh);
    int64_t M = mfsdp_schedule_microbatches(sh);
    int T = mfsdp_num_tensors(rt);
    for (int64_t m = 0; m < M; m++) {
        int pos = m == 0 ? 0 : m == M - 1 ? 2 : 1;
        bool capture = graphs; /* every microbatch: the hooks must see each one */
        if (capture) {
            CK(cudaStreamBeginCapture(compute, capture_mode));
            if (capture_delay_ms) {
                struct timespec ts = {0, (long)capture_delay_ms * 1000000L};
                nanosleep(&ts, NULL);
            }
        }
        if (m == 0)
            OK(mfsdp_step_begin(rt));
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
                    CK(mf_cuda_fill_pattern(v.grad_local, (mf_dtype)v.grad_local_dtype, v.numel, grad_seed(m, t),
                                            compute));
            }
            OK(mfsdp_backward_post(rt, u, m));
        }
        if (m == M - 1)
            OK(mfsdp_step_end(rt));
        if (capture) {
            cudaGraph_t graph = NULL;
            cudaError_t e = cudaStreamEndCapture(compute, &graph);
            if (e != cudaSuccess)
                fail_msg("capture of microbatch %lld: %s", (long long)m, cudaGetErrorString(e));
            if (g[pos]) /* microbatches 2..M-2 repeat the middle graph */
                CK(cudaGraphDestroy(graph));
            else
                g[pos] = graph;
        }
    }
}

/* Delivered gradient == fp32 sum of the microbatches' local gradients (one
 * rank: avg and sum agree), and unsharded weights == cast main_weight. */
static void verify(mfsdp_runtime *rt, const mfsdp_schedule *sh)
{
    OK(mfsdp_synchronize(rt));
    int64_t M = mfsdp_schedule_microbatches(sh);
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(rt, t, &v));
        assert_int_equal(v.grad_dtype, MFSDP_FP32);
        assert_int_equal(v.shard_count, v.numel); /* one rank holds everything */
        float *got = malloc((size_t)v.numel * sizeof *got);
        assert_non_null(got);
        CK(cudaMemcpy(got, v.grad, (size_t)v.numel * sizeof *got, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < v.numel; i++) {
            float want = 0;
            for (int64_t m = 0; m < M; m++) {
                float local = mf_cuda_pattern(grad_seed(m, t), i);
                if (v.grad_local_dtype == MFSDP_BF16)
                    local = mf_cuda_host_from_bf16(mf_cuda_host_to_bf16(local));
                want = m == 0 ? local : want + local;
            }
            if (got[i] != want)
                fail_msg("%s: gradient element %lld is %g, want %g", v.name, (long long)i, (double)got[i],
                         (double)want);
        }
        free(got);
        size_t es = mfsdp_dtype_size(v.weight_dtype);
        unsigned char *w = malloc((size_t)v.numel * es);
        assert_non_null(w);
        CK(cudaMemcpy(w, v.weight, (size_t)v.numel * es, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < v.numel; i++) {
            float mw = mf_cuda_pattern(7 + (uint32_t)t, i);
            bool same = v.weight_dtype == MFSDP_FP32 ? ((float *)w)[i] == mw
                        : v.weight_dtype == MFSDP_BF16 ? ((uint16_t *)w)[i] == mf_cuda_host_to_bf16(mw)
                                                       : ((uint16_t *)w)[i] == mf_cuda_host_to_fp16(mw);
            if (!same)
                fail_msg("%s: weight element %lld differs from the cast main_weight", v.name, (long long)i);
        }
        free(w);
    }
}

static void zero_grads(mfsdp_runtime *rt)
{
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        OK(mfsdp_tensor_view_get(rt, t, &v));
        CK(cudaMemsetAsync(v.grad, 0xff, (size_t)v.shard_count * mfsdp_dtype_size(v.grad_dtype), compute));
    }
    CK(cudaStreamSynchronize(compute));
}

static void test_eager(void **state)
{
    (void)state;
    static const rt_mesh one = {"1x1", 2, {1, 1}};
    static const char *const modes[] = {"hfsdp", "zero3", "ddp", "hsdp_nosync"};
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        mf_tb_spec spec;
        rt_model_spec(&spec, modes[k], &one, 3, MF_REDUCE_AVG);
        mfsdp_schedule *sh = rt_build(&spec);
        mfsdp_runtime *rt = make_runtime(sh, 0);
        init_main_weight(rt);
        for (int s = 0; s < 2; s++) {
            zero_grads(rt);
            step(rt, sh, false, NULL);
            verify(rt, sh);
        }
        /* a hook out of order is refused and changes nothing */
        assert_int_equal(mfsdp_forward_pre(rt, 0, 0), MFSDP_ERR_INVALID_USAGE);
        OK(mfsdp_step_begin(rt));
        mfsdp_destroy(rt);
        mfsdp_schedule_free(sh);
    }
}

static void test_graphs(void **state)
{
    (void)state;
    static const rt_mesh one = {"1x1", 2, {1, 1}};
    for (int64_t M = 2; M <= 4; M++) {
        mf_tb_spec spec;
        rt_model_spec(&spec, "hfsdp", &one, M, MF_REDUCE_AVG);
        mfsdp_schedule *sh = rt_build(&spec);
        mfsdp_runtime *rt = make_runtime(sh, MFSDP_NCCL_GRAPHS);
        init_main_weight(rt);
        cudaGraph_t g[3] = {NULL, NULL, NULL};
        step(rt, sh, true, g); /* capture: nothing runs yet */
        cudaGraphExec_t ge[3] = {NULL, NULL, NULL};
        for (int p = 0; p < 3; p++)
            if (g[p])
                CK(cudaGraphInstantiate(&ge[p], g[p], 0));
        for (int rep = 0; rep < 2; rep++) {
            zero_grads(rt);
            CK(cudaGraphLaunch(ge[0], compute));
            for (int64_t m = 1; m < M - 1; m++)
                CK(cudaGraphLaunch(ge[1], compute));
            CK(cudaGraphLaunch(ge[2], compute));
            CK(cudaStreamSynchronize(compute)); /* joined: compute covers every stream */
            verify(rt, sh);
        }
        for (int p = 0; p < 3; p++) {
            if (ge[p])
                CK(cudaGraphExecDestroy(ge[p]));
            if (g[p])
                CK(cudaGraphDestroy(g[p]));
        }
        mfsdp_destroy(rt);
        mfsdp_schedule_free(sh);
    }
}

static void test_graphs_global_mode(void **state)
{
    (void)state;
    static const rt_mesh one = {"1x1", 2, {1, 1}};
    mf_tb_spec spec;
    rt_model_spec(&spec, "hfsdp", &one, 2, MF_REDUCE_AVG);
    mfsdp_schedule *sh = rt_build(&spec);
    mfsdp_runtime *rt = make_runtime(sh, MFSDP_NCCL_GRAPHS);
    init_main_weight(rt);
    zero_grads(rt);
    step(rt, sh, false, NULL); /* eager: the watchdog tracks its collectives */
    OK(mfsdp_synchronize(rt));
    verify(rt, sh);
    capture_mode = cudaStreamCaptureModeGlobal;
    capture_delay_ms = 60; /* 3 watchdog periods */
    cudaGraph_t g[3] = {NULL, NULL, NULL};
    step(rt, sh, true, g);
    capture_mode = cudaStreamCaptureModeThreadLocal;
    capture_delay_ms = 0;
    cudaGraphExec_t ge[3] = {NULL, NULL, NULL};
    zero_grads(rt);
    for (int p = 0; p < 3; p += 2) {
        CK(cudaGraphInstantiate(&ge[p], g[p], 0));
        CK(cudaGraphLaunch(ge[p], compute));
    }
    CK(cudaStreamSynchronize(compute));
    verify(rt, sh);
    for (int p = 0; p < 3; p += 2) {
        CK(cudaGraphExecDestroy(ge[p]));
        CK(cudaGraphDestroy(g[p]));
    }
    mfsdp_destroy(rt);
    mfsdp_schedule_free(sh);
}

static void test_queries(void **state)
{
    (void)state;
    assert_null(mfsdp_nccl_stream(NULL, MFSDP_STREAM_INNER));
    assert_int_equal(mfsdp_nccl_device(NULL), -1);
    assert_true(mfsdp_backend_available(MFSDP_BACKEND_NCCL));
    assert_true(mfsdp_backend_available(MFSDP_BACKEND_CUDA_LOCAL));
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    if (cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) != cudaSuccess)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queries),
        cmocka_unit_test(test_eager),
        cmocka_unit_test(test_graphs),
        cmocka_unit_test(test_graphs_global_mode),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cudaStreamDestroy(compute);
    return rc;
}
