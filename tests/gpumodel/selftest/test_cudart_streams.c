/*
 * test_cudart_streams: the model's streams and events -- ordering through
 * events across streams under the seeded perturbation (CTest runs this file
 * under several GM_SEED values), a missing wait shown as a stale value, the
 * legacy default stream's implicit synchronization against blocking streams
 * and none against non-blocking ones, cudaStreamPerThread, queries, elapsed
 * times, and stale handles reported as violations.
 */
#include <pthread.h>
#include <string.h>

#include "test_cudart_util.h"

#define N 200

/* A writes i, records e; B waits e and reads, records r; A waits r before
 * its next write: B must see i every time. */
static void test_events_order_across_streams(void **state)
{
    (void)state;
    cudaStream_t a, b;
    cudaEvent_t e, r;
    TC_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    TC_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    TC_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    TC_OK(cudaEventCreateWithFlags(&r, cudaEventDisableTiming));
    static int x, seen[N];
    for (int i = 0; i < N; i++) {
        TC_OK(cudaStreamWaitEvent(a, r, 0));
        TC_OK(tc_write(a, &x, i + 1, gm_delay_us((uint64_t)i)));
        TC_OK(cudaEventRecord(e, a));
        TC_OK(cudaStreamWaitEvent(b, e, 0));
        TC_OK(tc_copy(b, &seen[i], &x, 0, gm_delay_us((uint64_t)i + N)));
        TC_OK(cudaEventRecord(r, b));
    }
    TC_OK(cudaDeviceSynchronize());
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], i + 1);
    TC_OK(cudaEventDestroy(e));
    TC_OK(cudaEventDestroy(r));
    TC_OK(cudaStreamDestroy(a));
    TC_OK(cudaStreamDestroy(b));
}

/* The same without the wait: B runs ahead of A's writes (held by a gate). */
static void test_missing_wait_shows(void **state)
{
    (void)state;
    cudaStream_t a, b;
    TC_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    TC_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    static int x, seen[32], gate;
    for (int i = 0; i < 32; i++) {
        TC_OK(tc_write_gated(a, &x, i + 1, &gate));
        TC_OK(tc_copy(b, &seen[i], &x, 0, 0));
    }
    TC_OK(cudaStreamSynchronize(b));
    tc_release(&gate);
    TC_OK(cudaDeviceSynchronize());
    for (int i = 0; i < 32; i++)
        assert_int_equal(seen[i], 0);
    TC_OK(cudaStreamDestroy(a));
    TC_OK(cudaStreamDestroy(b));
}

static void test_legacy_implicit_sync(void **state)
{
    (void)state;
    cudaStream_t blk, nb;
    TC_OK(cudaStreamCreate(&blk));
    TC_OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    static int x, y, z, w, sx, sy, sz, sw, sp, gate1, gate2;
    /* legacy waits for a blocking stream's earlier work ... */
    TC_OK(tc_write(blk, &x, 1, 20000));
    TC_OK(tc_copy(0, &sx, &x, 0, 0));
    /* ... but not for a non-blocking stream's */
    TC_OK(tc_write_gated(nb, &y, 1, &gate1));
    TC_OK(tc_copy(cudaStreamLegacy, &sy, &y, 0, 0));
    TC_OK(cudaStreamSynchronize(0));
    assert_int_equal(tc_load(&sx), 1);
    assert_int_equal(tc_load(&sy), 0);
    tc_release(&gate1);
    TC_OK(cudaStreamSynchronize(nb));
    /* a blocking stream waits for earlier legacy work, a non-blocking does not */
    TC_OK(tc_write(0, &z, 1, 20000));
    TC_OK(tc_copy(blk, &sz, &z, 0, 0));
    TC_OK(tc_write_gated(0, &w, 1, &gate2));
    TC_OK(tc_copy(nb, &sw, &w, 0, 0));
    TC_OK(cudaStreamSynchronize(nb));
    assert_int_equal(tc_load(&sw), 0);
    tc_release(&gate2);
    /* the per-thread default stream is blocking with respect to legacy */
    static int v;
    TC_OK(tc_write(0, &v, 7, 20000));
    TC_OK(tc_copy(cudaStreamPerThread, &sp, &v, 0, 0));
    TC_OK(cudaDeviceSynchronize());
    assert_int_equal(sz, 1);
    assert_int_equal(sp, 7);
    TC_OK(cudaStreamDestroy(blk));
    TC_OK(cudaStreamDestroy(nb));
}

/* cudaStreamSynchronize(0) waits for the blocking streams' earlier work. */
static void test_legacy_sync_waits_blocking(void **state)
{
    (void)state;
    cudaStream_t blk;
    TC_OK(cudaStreamCreate(&blk));
    static int x;
    TC_OK(tc_write(blk, &x, 3, 20000));
    TC_OK(cudaStreamSynchronize(0));
    assert_int_equal(tc_load(&x), 3);
    TC_OK(cudaStreamDestroy(blk));
}

static pthread_t worker_of_item;

static cudaError_t note_thread(void *a, char *err, size_t len)
{
    (void)a, (void)err, (void)len;
    worker_of_item = pthread_self();
    return cudaSuccess;
}

static int released;

static cudaError_t wait_release(void *a, char *err, size_t len)
{
    (void)err, (void)len;
    for (int i = 0; i < 2000 && !__atomic_load_n(&released, __ATOMIC_SEQ_CST); i++)
        usleep(1000);
    *(int *)a = __atomic_load_n(&released, __ATOMIC_SEQ_CST);
    return cudaSuccess;
}

/* Work runs on the stream's worker, after the call returned. */
static void test_not_executed_at_call(void **state)
{
    (void)state;
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    static int saw_release;
    TC_OK(gm_enqueue(s, "wait_release", wait_release, &saw_release, NULL));
    __atomic_store_n(&released, 1, __ATOMIC_SEQ_CST);
    TC_OK(gm_enqueue(s, "note_thread", note_thread, NULL, NULL));
    TC_OK(cudaStreamSynchronize(s));
    assert_int_equal(saw_release, 1);
    assert_false(pthread_equal(worker_of_item, pthread_self()));
    TC_OK(cudaStreamDestroy(s));
}

static void test_query_sync_elapsed(void **state)
{
    (void)state;
    cudaStream_t s;
    cudaEvent_t e1, e2, nt, never;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TC_OK(cudaEventCreate(&e1));
    TC_OK(cudaEventCreate(&e2));
    TC_OK(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
    TC_OK(cudaEventCreate(&never));
    static int x, gate;
    TC_OK(cudaEventRecord(e1, s));
    TC_OK(tc_write_gated(s, &x, 1, &gate));
    TC_OK(cudaEventRecord(e2, s));
    TC_OK(cudaEventRecord(nt, s));
    assert_int_equal(cudaEventQuery(e2), cudaErrorNotReady);
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    float ms = -1;
    assert_int_equal(cudaEventElapsedTime(&ms, e1, e2), cudaErrorNotReady);
    assert_int_equal(cudaGetLastError(), cudaErrorNotReady);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    usleep(30000);
    tc_release(&gate);
    TC_OK(cudaEventSynchronize(e2));
    TC_OK(cudaEventQuery(e2));
    TC_OK(cudaStreamSynchronize(s));
    TC_OK(cudaStreamQuery(s));
    TC_OK(cudaEventElapsedTime(&ms, e1, e2));
    assert_true(ms >= 25.0f && ms < 5000.0f);
    assert_int_equal(cudaEventElapsedTime(&ms, e1, nt), cudaErrorInvalidResourceHandle);
    /* never recorded: complete for a query, a no-op for a wait, no time */
    TC_OK(cudaEventQuery(never));
    TC_OK(cudaStreamWaitEvent(s, never, 0));
    assert_int_equal(cudaEventElapsedTime(&ms, never, e2), cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    cudaEvent_t all[] = {e1, e2, nt, never};
    for (int i = 0; i < 4; i++)
        TC_OK(cudaEventDestroy(all[i]));
    TC_OK(cudaStreamDestroy(s));
}

/* An event destroyed while a wait on it is pending still orders the wait. */
static void test_destroy_with_pending_wait(void **state)
{
    (void)state;
    cudaStream_t a, b;
    cudaEvent_t e;
    TC_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    TC_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    TC_OK(cudaEventCreate(&e));
    static int x, seen;
    TC_OK(tc_write(a, &x, 9, 20000));
    TC_OK(cudaEventRecord(e, a));
    TC_OK(cudaStreamWaitEvent(b, e, 0));
    TC_OK(cudaEventDestroy(e));
    TC_OK(tc_copy(b, &seen, &x, 0, 0));
    TC_OK(cudaStreamSynchronize(b));
    assert_int_equal(seen, 9);
    TC_OK(cudaStreamDestroy(a));
    TC_OK(cudaStreamDestroy(b));
}

static void test_stale_handles(void **state)
{
    (void)state;
    cudaStream_t s;
    cudaEvent_t e;
    TC_OK(cudaStreamCreate(&s));
    TC_OK(cudaEventCreate(&e));
    TC_OK(cudaEventDestroy(e));
    TC_VIOLATIONS(0);
    assert_int_equal(cudaEventQuery(e), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventRecord(e, s), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamWaitEvent(s, e, 0), cudaErrorInvalidResourceHandle);
    TC_VIOLATIONS(3);
    TC_OK(cudaStreamDestroy(s));
    static int x;
    assert_int_equal(tc_write(s, &x, 1, 0), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    TC_VIOLATIONS(2);
    int local;
    assert_int_equal(cudaEventQuery((cudaEvent_t)&local), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamQuery((cudaStream_t)&local), cudaErrorInvalidResourceHandle);
    TC_VIOLATIONS(2);
    (void)cudaGetLastError();
}

static void host_fn(void *p)
{
    __atomic_store_n((int *)p, 1, __ATOMIC_SEQ_CST);
}

/* cudaLaunchHostFunc: stream work, ordered after the stream's earlier work. */
static void test_host_func(void **state)
{
    (void)state;
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    static int gate, ran;
    TC_OK(tc_write_gated(s, &gate, 1, &gate));
    TC_OK(cudaLaunchHostFunc(s, host_fn, &ran));
    usleep(10000);
    assert_int_equal(tc_load(&ran), 0);
    tc_release(&gate);
    TC_OK(cudaStreamSynchronize(s));
    assert_int_equal(ran, 1);
    TC_OK(cudaStreamDestroy(s));
}

static void test_device(void **state)
{
    (void)state;
    int n = 0, dev = -1, least = 1, greatest = 1, v = 0, prio = 1;
    TC_OK(cudaGetDeviceCount(&n));
    assert_int_equal(n, 1);
    TC_OK(cudaGetDevice(&dev));
    assert_int_equal(dev, 0);
    assert_int_equal(cudaSetDevice(1), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    struct cudaDeviceProp p;
    TC_OK(cudaGetDeviceProperties(&p, 0));
    assert_int_equal(p.multiProcessorCount, 132);
    assert_int_equal(p.major * 10 + p.minor, 90);
    assert_true(p.totalGlobalMem == (size_t)80 << 30);
    assert_int_equal(p.unifiedAddressing, 1);
    assert_int_equal(p.concurrentManagedAccess, 1);
    assert_int_equal(p.canMapHostMemory, 1);
    size_t free_b = 0, total_b = 0;
    void *d;
    TC_OK(cudaMalloc(&d, 1 << 20));
    TC_OK(cudaMemGetInfo(&free_b, &total_b));
    assert_true(total_b == p.totalGlobalMem && free_b <= total_b - (1 << 20));
    TC_OK(cudaFree(d));
    TC_OK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
    assert_int_equal(v, 132);
    TC_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    assert_true(greatest < least);
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest - 10));
    TC_OK(cudaStreamGetPriority(s, &prio));
    assert_int_equal(prio, greatest);
    TC_OK(cudaStreamDestroy(s));
    assert_string_equal(cudaGetErrorName(cudaErrorStreamCaptureUnjoined), "cudaErrorStreamCaptureUnjoined");
    assert_string_equal(cudaGetErrorString(cudaErrorNotReady), "device not ready");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_order_across_streams),
        cmocka_unit_test(test_missing_wait_shows),
        cmocka_unit_test(test_legacy_implicit_sync),
        cmocka_unit_test(test_legacy_sync_waits_blocking),
        cmocka_unit_test(test_not_executed_at_call),
        cmocka_unit_test(test_query_sync_elapsed),
        cmocka_unit_test(test_destroy_with_pending_wait),
        cmocka_unit_test(test_stale_handles),
        cmocka_unit_test(test_host_func),
        cmocka_unit_test(test_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
