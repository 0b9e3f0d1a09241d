/*
 * test_cudart_graphs: stream capture and graphs in the model -- nothing runs
 * during capture, a fork/join through events becomes DAG edges (the order of
 * unordered branches varies from launch to launch, the edges never break),
 * an unjoined fork, prohibited calls invalidating captures by capture mode,
 * the legacy stream during a blocking stream's capture, instantiate/launch
 * ordered after earlier work, launches of one instance serialized, and
 * cudaGraphExecUpdate, and independent branches running concurrently (a
 * node blocking until the other branch's node ran completes). CTest runs it
 * under several GM_SEED values.
 */
#include <pthread.h>
#include <string.h>

#include "test_cudart_util.h"

static cudaGraphExec_t instantiate(cudaGraph_t g)
{
    cudaGraphExec_t x = NULL;
    TC_OK(cudaGraphInstantiate(&x, g, 0));
    return x;
}

static void test_capture_then_launch(void **state)
{
    (void)state;
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    static int log[64], logn;
    logn = 0;
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enum cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    TC_OK(cudaStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL));
    assert_int_equal(st, cudaStreamCaptureStatusActive);
    assert_true(id != 0);
    for (int k = 1; k <= 3; k++)
        TC_OK(tc_log(s, log, &logn, k, 0));
    usleep(20000);
    assert_int_equal(tc_load(&logn), 0); /* captured, not run */
    cudaGraph_t g;
    TC_OK(cudaStreamEndCapture(s, &g));
    TC_OK(cudaStreamIsCapturing(s, &st));
    assert_int_equal(st, cudaStreamCaptureStatusNone);
    cudaGraphExec_t x = instantiate(g);
    TC_OK(cudaGraphDestroy(g)); /* the instance keeps the work */
    TC_OK(cudaGraphLaunch(x, s));
    TC_OK(cudaGraphLaunch(x, s));
    TC_OK(cudaStreamSynchronize(s));
    assert_int_equal(logn, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(log[i], i % 3 + 1);
    TC_OK(cudaGraphExecDestroy(x));
    TC_OK(cudaStreamDestroy(s));
}

/* a; fork to t: b1 on s, b2 on t; join; c. */
static void test_fork_join_dag(void **state)
{
    (void)state;
    cudaStream_t s, t;
    cudaEvent_t fork, join;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TC_OK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    TC_OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    TC_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    static int log[4], logn;
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    TC_OK(tc_log(s, log, &logn, 1, 0));
    TC_OK(cudaEventRecord(fork, s));
    TC_OK(cudaStreamWaitEvent(t, fork, 0));
    assert_int_equal(cudaEventQuery(fork), cudaErrorCapturedEvent);
    TC_VIOLATIONS(1);
    (void)cudaGetLastError();
    TC_OK(tc_log(s, log, &logn, 2, 0));
    TC_OK(tc_log(t, log, &logn, 3, 0));
    TC_OK(cudaEventRecord(join, t));
    TC_OK(cudaStreamWaitEvent(s, join, 0));
    TC_OK(tc_log(s, log, &logn, 4, 0));
    cudaGraph_t g;
    TC_OK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t x = instantiate(g);
    int orders[2] = {0, 0};
    for (int launch = 0; launch < 40; launch++) {
        logn = 0;
        TC_OK(cudaGraphLaunch(x, s));
        TC_OK(cudaStreamSynchronize(s));
        assert_int_equal(logn, 4);
        assert_int_equal(log[0], 1);
        assert_int_equal(log[3], 4);
        assert_true((log[1] == 2 && log[2] == 3) || (log[1] == 3 && log[2] == 2));
        orders[log[1] == 3]++;
    }
    /* the unordered branches ran both ways: a missing edge would show */
    assert_true(orders[0] > 0 && orders[1] > 0);
    TC_OK(cudaGraphExecDestroy(x));
    TC_OK(cudaGraphDestroy(g));
    TC_OK(cudaEventDestroy(fork));
    TC_OK(cudaEventDestroy(join));
    TC_OK(cudaStreamDestroy(s));
    TC_OK(cudaStreamDestroy(t));
}

static void test_unjoined_fork(void **state)
{
    (void)state;
    cudaStream_t s, t;
    cudaEvent_t fork;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TC_OK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    TC_OK(cudaEventCreate(&fork));
    static int log[4], logn;
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TC_OK(tc_log(s, log, &logn, 1, 0));
    TC_OK(cudaEventRecord(fork, s));
    TC_OK(cudaStreamWaitEvent(t, fork, 0));
    TC_OK(tc_log(t, log, &logn, 2, 0));
    cudaGraph_t g = (cudaGraph_t)&g;
    assert_int_equal(cudaStreamEndCapture(t, &g), cudaErrorStreamCaptureUnmatched);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureUnjoined);
    assert_null(g);
    TC_VIOLATIONS(1);
    enum cudaStreamCaptureStatus st;
    TC_OK(cudaStreamIsCapturing(t, &st));
    assert_int_equal(st, cudaStreamCaptureStatusNone);
    assert_int_equal(logn, 0);
    (void)cudaGetLastError();
    TC_OK(cudaEventDestroy(fork));
    TC_OK(cudaStreamDestroy(s));
    TC_OK(cudaStreamDestroy(t));
}

static cudaError_t other_malloc_result;

static void *other_thread_malloc(void *p)
{
    (void)p;
    void *d = NULL;
    other_malloc_result = cudaMalloc(&d, 64);
    if (d)
        cudaFree(d);
    return NULL;
}

static cudaError_t malloc_in_other_thread(void)
{
    pthread_t th;
    pthread_create(&th, NULL, other_thread_malloc, NULL);
    pthread_join(th, NULL);
    return other_malloc_result;
}

static cudaEvent_t query_event;
static cudaError_t query_results[2];

/* A watchdog's query: first in the thread's default (global) mode, then
 * relaxed, as runtime/backends/mf_cuda_guard.c's watchdog sets. */
static void *other_thread_queries(void *p)
{
    (void)p;
    query_results[0] = cudaEventQuery(query_event);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    query_results[1] = cudaEventQuery(query_event);
    return NULL;
}

static cudaError_t end_capture(cudaStream_t s)
{
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (g)
        cudaGraphDestroy(g);
    return e;
}

static void test_prohibited_calls(void **state)
{
    (void)state;
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *d = NULL;
    /* global: this thread's cudaMalloc is refused and invalidates */
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    assert_int_equal(cudaMalloc(&d, 64), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(end_capture(s), cudaErrorStreamCaptureInvalidated);
    TC_VIOLATIONS(1);
    /* global: another thread's too */
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    assert_int_equal(malloc_in_other_thread(), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(end_capture(s), cudaErrorStreamCaptureInvalidated);
    TC_VIOLATIONS(1);
    /* thread-local: another thread may, this one may not synchronize */
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    TC_OK(malloc_in_other_thread());
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(end_capture(s), cudaErrorStreamCaptureInvalidated);
    TC_VIOLATIONS(1);
    /* global: another thread's event query too, unless that thread is relaxed */
    TC_OK(cudaEventCreate(&query_event));
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    pthread_t th;
    pthread_create(&th, NULL, other_thread_queries, NULL);
    pthread_join(th, NULL);
    assert_int_equal(query_results[0], cudaErrorStreamCaptureUnsupported);
    assert_int_equal(query_results[1], cudaSuccess);
    assert_int_equal(end_capture(s), cudaErrorStreamCaptureInvalidated);
    TC_VIOLATIONS(1);
    TC_OK(cudaEventDestroy(query_event));
    /* cudaDeviceSynchronize encompasses the capture, even a relaxed one */
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(end_capture(s), cudaErrorStreamCaptureInvalidated);
    TC_VIOLATIONS(1);
    /* relaxed: cudaMalloc is fine */
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    TC_OK(cudaMalloc(&d, 64));
    TC_OK(cudaFree(d));
    TC_OK(end_capture(s));
    /* a thread that exchanged its mode to relaxed may call it during a global capture */
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    TC_OK(cudaThreadExchangeStreamCaptureMode(&mode));
    assert_int_equal(mode, cudaStreamCaptureModeGlobal);
    TC_OK(cudaMalloc(&d, 64));
    TC_OK(cudaThreadExchangeStreamCaptureMode(&mode));
    assert_int_equal(mode, cudaStreamCaptureModeRelaxed);
    TC_OK(end_capture(s));
    TC_OK(cudaFree(d));
    TC_VIOLATIONS(0);
    (void)cudaGetLastError();
    TC_OK(cudaStreamDestroy(s));
}

/* Legacy-stream work while a blocking stream captures. */
static void test_legacy_during_capture(void **state)
{
    (void)state;
    cudaStream_t blk, nb;
    TC_OK(cudaStreamCreate(&blk));
    TC_OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    static int x;
    TC_OK(cudaStreamBeginCapture(nb, cudaStreamCaptureModeRelaxed));
    TC_OK(tc_write(0, &x, 1, 0)); /* a non-blocking capture does not mind */
    TC_OK(end_capture(nb));
    TC_OK(cudaStreamBeginCapture(blk, cudaStreamCaptureModeRelaxed));
    assert_int_equal(tc_write(0, &x, 2, 0), cudaErrorStreamCaptureImplicit);
    assert_int_equal(end_capture(blk), cudaErrorStreamCaptureInvalidated);
    TC_VIOLATIONS(1);
    assert_int_equal(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    TC_VIOLATIONS(1);
    TC_OK(cudaDeviceSynchronize());
    assert_int_equal(x, 1);
    (void)cudaGetLastError();
    TC_OK(cudaStreamDestroy(blk));
    TC_OK(cudaStreamDestroy(nb));
}

/* A launch follows earlier work of its stream; launches of one instance on
 * two streams do not overlap. */
static void test_launch_ordering(void **state)
{
    (void)state;
    cudaStream_t a, b;
    TC_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    TC_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    static int x, y;
    TC_OK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    TC_OK(tc_copy(a, &y, &x, 10, 0));
    cudaGraph_t g1;
    TC_OK(cudaStreamEndCapture(a, &g1));
    cudaGraphExec_t x1 = instantiate(g1);
    TC_OK(tc_write(a, &x, 5, 20000));
    TC_OK(cudaGraphLaunch(x1, a));
    TC_OK(cudaStreamSynchronize(a));
    assert_int_equal(y, 15);
    static int counter;
    TC_OK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    TC_OK(tc_copy(a, &counter, &counter, 1, 10000)); /* reads, sleeps, writes: a race if overlapped */
    cudaGraph_t g2;
    TC_OK(cudaStreamEndCapture(a, &g2));
    cudaGraphExec_t x2 = instantiate(g2);
    TC_OK(cudaGraphLaunch(x2, a));
    TC_OK(cudaGraphLaunch(x2, b));
    TC_OK(cudaDeviceSynchronize());
    assert_int_equal(counter, 2);
    cudaGraphExec_t xs[] = {x1, x2};
    cudaGraph_t gs[] = {g1, g2};
    for (int i = 0; i < 2; i++) {
        TC_OK(cudaGraphExecDestroy(xs[i]));
        TC_OK(cudaGraphDestroy(gs[i]));
    }
    TC_OK(cudaStreamDestroy(a));
    TC_OK(cudaStreamDestroy(b));
}

static cudaGraph_t capture_copy(cudaStream_t s, int *dst, const int *src, int extra)
{
    cudaGraph_t g;
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TC_OK(cudaMemcpyAsync(dst, src, sizeof(int), cudaMemcpyDeviceToDevice, s));
    if (extra)
        TC_OK(cudaMemsetAsync(dst, 0, sizeof(int), s));
    TC_OK(cudaStreamEndCapture(s, &g));
    return g;
}

static void test_exec_update(void **state)
{
    (void)state;
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d, h[3] = {11, 22, 0};
    TC_OK(cudaMalloc((void **)&d, 3 * sizeof(int)));
    TC_OK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    TC_OK(cudaDeviceSynchronize()); /* a pageable source: cudaMemcpy returned once staged */
    cudaGraph_t g1 = capture_copy(s, d + 2, d, 0), g2 = capture_copy(s, d + 2, d + 1, 0);
    cudaGraph_t g3 = capture_copy(s, d + 2, d, 1);
    cudaGraphExec_t x = instantiate(g1);
    TC_OK(cudaGraphLaunch(x, s));
    TC_OK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s));
    assert_int_equal(h[2], 11);
    cudaGraphExecUpdateResultInfo info;
    TC_OK(cudaGraphExecUpdate(x, g2, &info));
    assert_int_equal(info.result, cudaGraphExecUpdateSuccess);
    TC_OK(cudaGraphLaunch(x, s));
    TC_OK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s));
    assert_int_equal(h[2], 22);
    assert_int_equal(cudaGraphExecUpdate(x, g3, &info), cudaErrorGraphExecUpdateFailure);
    assert_int_equal(info.result, cudaGraphExecUpdateErrorTopologyChanged);
    (void)cudaGetLastError();
    cudaGraph_t gs[] = {g1, g2, g3};
    for (int i = 0; i < 3; i++)
        TC_OK(cudaGraphDestroy(gs[i]));
    TC_OK(cudaGraphExecDestroy(x));
    TC_OK(cudaFree(d));
    TC_OK(cudaStreamDestroy(s));
}

/* Two independent branches where A blocks until B of the same launch has run
 * (as a collective blocks until the peer rank reaches it): the launch must run
 * them concurrently, whatever order the seed draws. The wait is bounded: a
 * timeout is counted, not hung on. */
typedef struct tc_meet {
    int a_runs, b_runs, timeouts, c_bad;
} tc_meet;

static cudaError_t meet_a(void *p, char *err, size_t len)
{
    (void)err, (void)len;
    tc_meet *m = p;
    int mine = __atomic_add_fetch(&m->a_runs, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; tc_load(&m->b_runs) < mine; i++) {
        if (i == 3000) { /* 3 s */
            __atomic_add_fetch(&m->timeouts, 1, __ATOMIC_SEQ_CST);
            break;
        }
        usleep(1000);
    }
    return cudaSuccess;
}

static cudaError_t meet_b(void *p, char *err, size_t len)
{
    (void)err, (void)len;
    tc_meet *m = p;
    __atomic_add_fetch(&m->b_runs, 1, __ATOMIC_SEQ_CST);
    return cudaSuccess;
}

/* After the join: both branches of this launch finished. */
static cudaError_t meet_c(void *p, char *err, size_t len)
{
    (void)err, (void)len;
    tc_meet *m = p;
    if (tc_load(&m->a_runs) != tc_load(&m->b_runs))
        __atomic_add_fetch(&m->c_bad, 1, __ATOMIC_SEQ_CST);
    return cudaSuccess;
}

static void test_branches_concurrent(void **state)
{
    (void)state;
    cudaStream_t s, t;
    cudaEvent_t fork, join;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TC_OK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    TC_OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    TC_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    static tc_meet m;
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TC_OK(cudaEventRecord(fork, s));
    TC_OK(cudaStreamWaitEvent(t, fork, 0));
    TC_OK(gm_enqueue(s, "meet_a", meet_a, &m, NULL));
    TC_OK(gm_enqueue(t, "meet_b", meet_b, &m, NULL));
    TC_OK(cudaEventRecord(join, t));
    TC_OK(cudaStreamWaitEvent(s, join, 0));
    TC_OK(gm_enqueue(s, "meet_c", meet_c, &m, NULL));
    cudaGraph_t g;
    TC_OK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t x = instantiate(g);
    for (int k = 0; k < 8; k++) /* each launch draws its own order */
        TC_OK(cudaGraphLaunch(x, s));
    TC_OK(cudaStreamSynchronize(s));
    assert_int_equal(tc_load(&m.timeouts), 0);
    assert_int_equal(tc_load(&m.c_bad), 0);
    assert_int_equal(m.a_runs, 8);
    assert_int_equal(m.b_runs, 8);
    TC_OK(cudaGraphExecDestroy(x));
    TC_OK(cudaGraphDestroy(g));
    TC_OK(cudaEventDestroy(fork));
    TC_OK(cudaEventDestroy(join));
    TC_OK(cudaStreamDestroy(s));
    TC_OK(cudaStreamDestroy(t));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_then_launch),
        cmocka_unit_test(test_fork_join_dag),
        cmocka_unit_test(test_unjoined_fork),
        cmocka_unit_test(test_prohibited_calls),
        cmocka_unit_test(test_legacy_during_capture),
        cmocka_unit_test(test_launch_ordering),
        cmocka_unit_test(test_exec_update),
        cmocka_unit_test(test_branches_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
