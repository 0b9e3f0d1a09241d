/*
 * test_cudart_knobs: the model's fault knob and device knob, each in a child
 * process started with the knob set (the model reads its environment once):
 * GM_DROP_WAIT=2 drops the second cudaStreamWaitEvent (of the process, or of
 * each thread with GM_DROP_WAIT_PER_THREAD=1), and the consumer it
 * ordered reads a stale value while the first and third stay ordered;
 * GM_NO_DEVICE=1 makes cudaGetDeviceCount and the rest say
 * cudaErrorNoDevice; GM_DEVICES=2 gives two devices, a current one per thread;
 * and a child forked after the model started gets a working model of its own.
 */
#include <string.h>
#include <pthread.h>
#include <sys/wait.h>

#include "test_cudart_util.h"

static int run_child(const char *name, const char *value, int (*body)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv(name, value, 1);
        _exit(body());
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

static int drop_wait_body(void)
{
    cudaStream_t a, b;
    cudaEvent_t e;
    static int x, seen[3];
    if (cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) || cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) ||
        cudaEventCreate(&e))
        return 10;
    for (int k = 0; k < 3; k++) {
        tc_write(a, &x, k + 1, 30000);
        cudaEventRecord(e, a);
        cudaStreamWaitEvent(b, e, 0);
        tc_copy(b, &seen[k], &x, 0, 0);
        if (cudaStreamSynchronize(b) != cudaSuccess)
            return 11;
        cudaStreamSynchronize(a);
    }
    /* 0: as expected (only the second stale) */
    return seen[0] == 1 && seen[1] == 1 && seen[2] == 3 ? 0 : 20 + seen[1];
}

static void *drop_wait_thread(void *p)
{
    *(int *)p = drop_wait_body();
    return NULL;
}

/* The main thread waits once, then another thread runs drop_wait_body. */
static int drop_wait_two_threads(void)
{
    cudaStream_t s;
    cudaEvent_t never;
    if (cudaStreamCreate(&s) || cudaEventCreate(&never) || cudaStreamWaitEvent(s, never, 0))
        return 10;
    int rc = -1;
    pthread_t th;
    pthread_create(&th, NULL, drop_wait_thread, &rc);
    pthread_join(th, NULL);
    return rc;
}

static int drop_wait_per_thread(void)
{
    setenv("GM_DROP_WAIT_PER_THREAD", "1", 1); /* before the model starts */
    return drop_wait_two_threads();
}

static void test_drop_wait(void **state)
{
    (void)state;
    assert_int_equal(run_child("GM_DROP_WAIT", "2", drop_wait_body), 0);
    assert_int_equal(run_child("GM_DROP_WAIT", "0", drop_wait_body), 22); /* all ordered: seen[1] == 2 */
    /* counted per process, the thread's first wait is the second: seen[0] stale */
    assert_int_equal(run_child("GM_DROP_WAIT", "2", drop_wait_two_threads), 22);
    assert_int_equal(run_child("GM_DROP_WAIT", "2", drop_wait_per_thread), 0);
}

static int no_device_body(void)
{
    int n = 5;
    void *p;
    cudaStream_t s;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceCount(&n) != cudaErrorNoDevice || n != 0)
        return 1;
    if (cudaMalloc(&p, 8) != cudaErrorNoDevice || cudaStreamCreate(&s) != cudaErrorNoDevice)
        return 2;
    if (cudaGetDeviceProperties(&prop, 0) != cudaErrorNoDevice || cudaSetDevice(0) != cudaErrorNoDevice)
        return 3;
    return 0;
}

static void *other_thread_device(void *p)
{
    int d = -1;
    cudaGetDevice(&d);
    *(int *)p = d;
    return NULL;
}

static int two_devices_body(void)
{
    int n = 0, d = -1, other = -1;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n != 2)
        return 1;
    if (cudaSetDevice(1) != cudaSuccess || cudaGetDevice(&d) != cudaSuccess || d != 1)
        return 2;
    pthread_t th;
    pthread_create(&th, NULL, other_thread_device, &other);
    pthread_join(th, NULL);
    if (other != 0)
        return 3; /* the current device is per host thread */
    void *p;
    struct cudaPointerAttributes a;
    if (cudaMalloc(&p, 8) || cudaPointerGetAttributes(&a, p) || a.device != 1)
        return 4;
    return cudaSetDevice(2) == cudaErrorInvalidDevice ? 0 : 5;
}

static void test_device_knobs(void **state)
{
    (void)state;
    assert_int_equal(run_child("GM_NO_DEVICE", "1", no_device_body), 0);
    assert_int_equal(run_child("GM_DEVICES", "2", two_devices_body), 0);
    assert_int_equal(run_child("GM_DEVICES", "1", two_devices_body), 1);
}

/* A child forked after the model started works on its own (no hang). */
static void test_fork_after_init(void **state)
{
    (void)state;
    cudaStream_t s;
    static int x, gate;
    TC_OK(cudaStreamCreate(&s));
    TC_OK(tc_write_gated(s, &x, 1, &gate)); /* pending in the parent at the fork */
    pid_t pid = fork();
    if (pid == 0) {
        int *d, h = 5, back = 0;
        cudaStream_t cs;
        if (cudaMalloc((void **)&d, sizeof h) || cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice) ||
            cudaStreamCreate(&cs) || cudaMemcpyAsync(&back, d, sizeof h, cudaMemcpyDeviceToHost, cs) ||
            cudaDeviceSynchronize())
            _exit(1);
        _exit(back == 5 ? 0 : 2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    tc_release(&gate);
    TC_OK(cudaStreamSynchronize(s));
    assert_int_equal(x, 1);
    TC_OK(cudaStreamDestroy(s));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drop_wait),
        cmocka_unit_test(test_device_knobs),
        cmocka_unit_test(test_fork_after_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
