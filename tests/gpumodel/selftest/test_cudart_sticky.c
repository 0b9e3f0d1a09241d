/*
 * test_cudart_sticky: a fault in device work is sticky, as in CUDA -- here a
 * graph's copy node whose source was freed after capture: the run-time range
 * check faults (cudaErrorIllegalAddress), the synchronization returns it,
 * later calls return it, cudaGetLastError does not clear it, and later work
 * does not run.
 */
#include "test_cudart_util.h"

static void test_fault_is_sticky(void **state)
{
    (void)state;
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *src, *dst;
    TC_OK(cudaMalloc((void **)&src, 64));
    TC_OK(cudaMalloc((void **)&dst, 64));
    cudaGraph_t g;
    cudaGraphExec_t x;
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TC_OK(cudaMemcpyAsync(dst, src, 64, cudaMemcpyDeviceToDevice, s));
    TC_OK(cudaStreamEndCapture(s, &g));
    TC_OK(cudaGraphInstantiate(&x, g, 0));
    TC_OK(cudaFree(src));
    TC_VIOLATIONS(0);
    TC_OK(cudaGraphLaunch(x, s));
    static int after;
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
    TC_VIOLATIONS(1);
    assert_int_equal(tc_write(s, &after, 1, 0), cudaErrorIllegalAddress);
    assert_int_equal(cudaGetLastError(), cudaErrorIllegalAddress);
    assert_int_equal(cudaGetLastError(), cudaErrorIllegalAddress);
    void *p;
    assert_int_equal(cudaMalloc(&p, 64), cudaErrorIllegalAddress);
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    assert_int_equal(after, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fault_is_sticky)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
