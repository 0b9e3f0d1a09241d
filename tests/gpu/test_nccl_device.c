/*
 * The NCCL backend driven the way a CUDA trainer drives it: device buffers
 * (ncclMemAlloc pool registered with the communicators), the trainer's own
 * compute stream, grad_local written by a kernel on that stream, hooks that
 * never block the host, blocking communicators (the default) and the watchdog
 * thread.
 * A 1x1 mesh (one GPU, real NCCL communicators of one rank), the trainer and
 * checks of trainer_check (test_trainer_check_local replays them on the CPU):
 *   - eager steps: the delivered gradient equals the sum of the microbatches'
 *     local gradients and every unsharded weight, copied on the compute
 *     stream inside its unit's windows, equals the cast main_weight, bit for
 *     bit;
 *   - CUDA graph mode: one step captured as three graphs (first, middle and
 *     last microbatch) and replayed twice gives the same bits, so nothing of
 *     the last microbatch (the outer reduction, step_end) is dropped; the
 *     middle graph replays microbatch 1's gradient fills for 1..M-2, and the
 *     expected sums say so (trainer_check's `positions`); every failure
 *     names the mode, M and the phase;
 *   - a capture in cudaStreamCaptureModeGlobal that starts right after eager
 *     steps (the watchdog still holds their tracking events) and waits 3
 *     watchdog periods before its first hook is not invalidated: the
 *     watchdog's thread queries in relaxed capture mode;
 *   - out-of-order hooks are refused; a NULL stream query gives NULL.
 * Needs a GPU: exits 77 (skip) only when the CUDA runtime reports no device.
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

#include "gpu_presence.h"
#include "cuda_ops.h"
#include "mfsdp_nccl.h"

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

/* trainer_check's context: the compute stream (cuda_ops), and with `graphs`
 * each microbatch position captured into g[pos] instead of run. */
typedef struct capture_ctx {
    cuda_stream_ctx cuda;       /* first: cuda_ops's context */
    bool graphs;
    int64_t M;
    cudaGraph_t g[3];           /* first, middle and last microbatch */
} capture_ctx;

static bool capture_begin(void *p, int64_t m)
{
    capture_ctx *c = p;
    if (!c->graphs)
        return true;
    cudaError_t e = cudaStreamBeginCapture(c->cuda.stream, capture_mode);
    if (e != cudaSuccess) {
        fprintf(stderr, "capture of microbatch %lld: %s\n", (long long)m, cudaGetErrorString(e));
        return false;
    }
    if (capture_delay_ms) {
        struct timespec ts = {0, (long)capture_delay_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

static bool capture_end(void *p, int64_t m)
{
    capture_ctx *c = p;
    if (!c->graphs)
        return true;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->cuda.stream, &graph);
    if (e != cudaSuccess) {
        fprintf(stderr, "capture of microbatch %lld: %s\n", (long long)m, cudaGetErrorString(e));
        return false;
    }
    int pos = m == 0 ? 0 : m == c->M - 1 ? 2 : 1;
    if (c->g[pos]) /* microbatches 2..M-2 repeat the middle graph */
        return cudaGraphDestroy(graph) == cudaSuccess;
    c->g[pos] = graph;
    return true;
}

static tc_ops capture_ops;

/* A trainer on rt (one rank) with the compute stream; fails the test on error. */
static void open_trainer(tc_trainer *tr, capture_ctx *c, mfsdp_runtime *rt, const mfsdp_schedule *sh, bool graphs)
{
    capture_ops = cuda_ops;
    capture_ops.microbatch_begin = capture_begin;
    capture_ops.microbatch_end = capture_end;
    *c = (capture_ctx){.cuda = {compute}, .graphs = graphs, .M = mfsdp_schedule_microbatches(sh)};
    if (!tc_open(tr, rt, sh, 0, &capture_ops, c))
        fail_msg("%s", tr->err);
}

static void launch_graphs(capture_ctx *c, cudaGraphExec_t ge[3])
{
    CK(cudaGraphLaunch(ge[0], compute));
    for (int64_t m = 1; m < c->M - 1; m++)
        CK(cudaGraphLaunch(ge[1], compute));
    CK(cudaGraphLaunch(ge[2], compute));
    CK(cudaStreamSynchronize(compute)); /* joined: compute covers every stream */
}

static void destroy_graphs(capture_ctx *c, cudaGraphExec_t ge[3])
{
    for (int p = 0; p < 3; p++) {
        if (ge[p])
            CK(cudaGraphExecDestroy(ge[p]));
        if (c->g[p])
            CK(cudaGraphDestroy(c->g[p]));
    }
}

static void test_eager(void **state)
{
    (void)state;
    static const rt_mesh one = {"1x1", 2, {1, 1}};
    for (int k = 0; k < tc_nccl_nmodes; k++) {
        mf_tb_spec spec;
        rt_model_spec(&spec, tc_nccl_modes[k], &one, 3, MF_REDUCE_AVG);
        mfsdp_schedule *sh = rt_build(&spec);
        mfsdp_runtime *rt = make_runtime(sh, 0);
        tc_trainer tr;
        capture_ctx c;
        open_trainer(&tr, &c, rt, sh, false);
        if (!tc_train(&tr, 2))
            fail_msg("eager, %s on 1x1, M=3: %s", tc_nccl_modes[k], tr.err);
        /* a hook out of order is refused and changes nothing */
        assert_int_equal(mfsdp_forward_pre(rt, 0, 0), MFSDP_ERR_INVALID_USAGE);
        OK(mfsdp_step_begin(rt));
        tc_close(&tr);
        mfsdp_destroy(rt);
        mfsdp_schedule_free(sh);
    }
}

/* A failed step of a graph case, named by mode, M and what ran. */
#define TC_AT(call, M, what)                                                                       \
    do {                                                                                           \
        if (!(call))                                                                               \
            fail_msg("graphs, hfsdp on 1x1, M=%lld, %s: %s", (long long)(M), (what), tr.err);      \
    } while (0)

/* One step captured as graphs per position and replayed twice. The middle
 * graph, captured at microbatch 1, replays for microbatches 1..M-2 with
 * microbatch 1's gradient fills: tr.positions makes the expected sums say
 * so (for M = 4 the second middle launch is not microbatch 2's fill). */
static void test_graphs(void **state)
{
    (void)state;
    static const rt_mesh one = {"1x1", 2, {1, 1}};
    for (int64_t M = TC_GRAPH_MIN_M; M <= TC_GRAPH_MAX_M; M++) {
        mf_tb_spec spec;
        rt_model_spec(&spec, "hfsdp", &one, M, MF_REDUCE_AVG);
        mfsdp_schedule *sh = rt_build(&spec);
        mfsdp_runtime *rt = make_runtime(sh, MFSDP_NCCL_GRAPHS);
        tc_trainer tr;
        capture_ctx c;
        open_trainer(&tr, &c, rt, sh, true);
        tr.positions = true;
        TC_AT(tc_step(&tr), M, "capture"); /* nothing runs yet */
        cudaGraphExec_t ge[3] = {NULL, NULL, NULL};
        for (int p = 0; p < 3; p++)
            if (c.g[p])
                CK(cudaGraphInstantiate(&ge[p], c.g[p], 0));
        for (int rep = 0; rep < 2; rep++) {
            TC_AT(tc_poison_grads(&tr), M, rep ? "replay 2" : "replay 1");
            launch_graphs(&c, ge);
            TC_AT(tc_verify(&tr), M, rep ? "replay 2" : "replay 1");
        }
        destroy_graphs(&c, ge);
        tc_close(&tr);
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
    tc_trainer tr;
    capture_ctx c;
    open_trainer(&tr, &c, rt, sh, false);
    TC_AT(tc_train(&tr, 1), 2, "global capture mode: eager step"); /* the watchdog tracks its collectives */
    c.graphs = true;
    tr.positions = true;
    capture_mode = cudaStreamCaptureModeGlobal;
    capture_delay_ms = 60; /* 3 watchdog periods */
    bool captured = tc_step(&tr);
    capture_mode = cudaStreamCaptureModeThreadLocal;
    capture_delay_ms = 0;
    TC_AT(captured, 2, "global capture mode: capture");
    assert_null(c.g[1]); /* M = 2: first and last only */
    cudaGraphExec_t ge[3] = {NULL, NULL, NULL};
    CK(cudaGraphInstantiate(&ge[0], c.g[0], 0));
    CK(cudaGraphInstantiate(&ge[2], c.g[2], 0));
    TC_AT(tc_poison_grads(&tr), 2, "global capture mode: replay");
    launch_graphs(&c, ge);
    TC_AT(tc_verify(&tr), 2, "global capture mode: replay");
    destroy_graphs(&c, ge);
    tc_close(&tr);
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
    int presence = gpu_presence();
    if (presence != GPU_PRESENT)
        return presence;
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
