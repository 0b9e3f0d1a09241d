/*
 * test_cudart_kernels: kernel launches in the model through a fake kernel
 * registered as nvcc's host stubs register one (__cudaRegisterFatBinary,
 * __cudaRegisterFunction with a mangled device name) and modelled by
 * gm_kernels_add: the key from the demangled name, parameters copied at the
 * launch, the run on the stream's worker after the call, operand ranges
 * checked, unknown and unmodelled kernels and bad configurations refused, the
 * <<<>>> path (__cudaPushCallConfiguration / Pop / __cudaGetKernel /
 * __cudaLaunchKernel), and a kernel node's parameters updated in a graph.
 */
#include <string.h>

#include "test_cudart_util.h"

void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFunction(void **handle, const char *hostFun, char *deviceFun, const char *deviceName,
                            int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t smem, struct CUstream_st *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *smem, void *stream);
cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *hostFun);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t smem,
                               cudaStream_t s);

/* void ns::scale_kernel<2>(float*, float const*, long): dst = 2 * src. */
static char scale_name[] = "_ZN2ns12scale_kernelILi2EEEvPfPKfl";
static char missing_name[] = "_Z14missing_kernelPf";
static void scale_stub(void) {}
static void missing_stub(void) {}
static void unregistered_stub(void) {}

static int host_returned, run_saw_return;

static void scale_run(void **args, dim3 grid, dim3 block)
{
    (void)grid, (void)block;
    float *dst = *(float **)args[0];
    const float *src = *(const float **)args[1];
    long n = *(long *)args[2];
    run_saw_return = __atomic_load_n(&host_returned, __ATOMIC_SEQ_CST);
    for (long i = 0; i < n; i++)
        dst[i] = 2.0f * src[i];
}

static int scale_ranges(void **args, gm_range *out, int cap)
{
    long n = *(long *)args[2];
    if (cap >= 2) {
        out[0] = (gm_range){*(float **)args[0], (size_t)n * sizeof(float), 1};
        out[1] = (gm_range){*(const float **)args[1], (size_t)n * sizeof(float), 0};
    }
    return 2;
}

static const gm_kernel scale_model = {
    .key = "scale_kernel<2>", .run = scale_run, .ranges = scale_ranges, .nargs = 3,
    .arg_size = {sizeof(float *), sizeof(const float *), sizeof(long)}};

static int setup(void **state)
{
    (void)state;
    static char fatbin[16];
    void **h = __cudaRegisterFatBinary(fatbin);
    __cudaRegisterFunction(h, (const char *)scale_stub, scale_name, scale_name, -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFunction(h, (const char *)missing_stub, missing_name, missing_name, -1, NULL, NULL, NULL, NULL,
                           NULL);
    gm_kernels_add(&scale_model);
    return 0;
}

static void test_launch(void **state)
{
    (void)state;
    enum { n = 1000 };
    float *src, *dst, h[n];
    TC_OK(cudaMalloc((void **)&src, n * sizeof(float)));
    TC_OK(cudaMalloc((void **)&dst, n * sizeof(float)));
    for (int i = 0; i < n; i++)
        h[i] = (float)i * 0.5f;
    TC_OK(cudaMemcpy(src, h, sizeof h, cudaMemcpyHostToDevice));
    TC_OK(cudaDeviceSynchronize()); /* a pageable source: cudaMemcpy returned once staged */
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    /* the stream is held until the launch returned: a launch run at the call
     * would see host_returned == 0 */
    static int dummy;
    __atomic_store_n(&host_returned, 0, __ATOMIC_SEQ_CST);
    TC_OK(tc_write_gated(s, &dummy, 1, &host_returned));
    long count = n;
    float *d = dst;
    void *args[] = {&d, &src, &count};
    TC_OK(cudaLaunchKernel((const void *)scale_stub, dim3_of(4), dim3_of(256), args, 0, s));
    __atomic_store_n(&host_returned, 1, __ATOMIC_SEQ_CST);
    count = 0, d = NULL; /* the launch copied its parameters */
    TC_OK(cudaStreamSynchronize(s));
    assert_int_equal(run_saw_return, 1);
    TC_OK(cudaMemcpy(h, dst, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        assert_true(h[i] == (float)i);
    TC_OK(cudaFree(src));
    TC_OK(cudaFree(dst));
    TC_OK(cudaStreamDestroy(s));
}

static void test_refusals(void **state)
{
    (void)state;
    float *src, *dst;
    TC_OK(cudaMalloc((void **)&src, 64 * sizeof(float)));
    TC_OK(cudaMalloc((void **)&dst, 64 * sizeof(float)));
    long count = 65;
    void *args[] = {&dst, &src, &count};
    assert_int_equal(cudaLaunchKernel((const void *)scale_stub, dim3_of(1), dim3_of(64), args, 0, 0),
                     cudaErrorInvalidValue); /* runs past both buffers */
    TC_VIOLATIONS(1);
    count = 64;
    assert_int_equal(cudaLaunchKernel((const void *)scale_stub, dim3_of(1), dim3_of(1025), args, 0, 0),
                     cudaErrorInvalidConfiguration);
    assert_int_equal(cudaLaunchKernel((const void *)scale_stub, dim3_of(0), dim3_of(64), args, 0, 0),
                     cudaErrorInvalidConfiguration);
    assert_int_equal(cudaLaunchKernel((const void *)unregistered_stub, dim3_of(1), dim3_of(64), args, 0, 0),
                     cudaErrorInvalidDeviceFunction);
    assert_int_equal(cudaLaunchKernel((const void *)missing_stub, dim3_of(1), dim3_of(64), args, 0, 0),
                     cudaErrorInvalidDeviceFunction);
    TC_VIOLATIONS(4);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
    TC_OK(cudaFree(src));
    assert_int_equal(cudaLaunchKernel((const void *)scale_stub, dim3_of(1), dim3_of(64), args, 0, 0),
                     cudaErrorInvalidValue); /* freed operand */
    TC_VIOLATIONS(1);
    (void)cudaGetLastError();
    TC_OK(cudaFree(dst));
}

/* What nvcc's <<<grid, block, smem, stream>>> compiles to. */
static void test_triple_chevron_path(void **state)
{
    (void)state;
    float *src, *dst, h[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    TC_OK(cudaMalloc((void **)&src, sizeof h));
    TC_OK(cudaMalloc((void **)&dst, sizeof h));
    TC_OK(cudaMemcpy(src, h, sizeof h, cudaMemcpyHostToDevice));
    cudaStream_t s;
    TC_OK(cudaStreamCreate(&s));
    assert_int_equal(__cudaPushCallConfiguration(dim3_of(2), dim3_of(32), 0, (struct CUstream_st *)s), 0);
    dim3 grid, block;
    size_t smem;
    cudaStream_t popped;
    TC_OK(__cudaPopCallConfiguration(&grid, &block, &smem, &popped));
    assert_int_equal(grid.x, 2);
    assert_int_equal(block.x, 32);
    assert_ptr_equal(popped, s);
    cudaKernel_t k;
    TC_OK(__cudaGetKernel(&k, (const void *)scale_stub));
    long n = 8;
    void *args[] = {&dst, &src, &n};
    TC_OK(__cudaLaunchKernel(k, grid, block, args, smem, popped));
    TC_OK(cudaMemcpy(h, dst, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 8; i++)
        assert_true(h[i] == 2.0f * (float)(i + 1));
    TC_OK(cudaFree(src));
    TC_OK(cudaFree(dst));
    TC_OK(cudaStreamDestroy(s));
}

static cudaGraph_t capture_scale(cudaStream_t s, float *dst, float *src, long n)
{
    cudaGraph_t g;
    void *args[] = {&dst, &src, &n};
    TC_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TC_OK(cudaLaunchKernel((const void *)scale_stub, dim3_of(1), dim3_of(32), args, 0, s));
    TC_OK(cudaStreamEndCapture(s, &g));
    return g;
}

static void test_kernel_graph_update(void **state)
{
    (void)state;
    float *a, *b, *dst, h[4] = {1, 2, 3, 4}, out[4];
    TC_OK(cudaMalloc((void **)&a, sizeof h));
    TC_OK(cudaMalloc((void **)&b, sizeof h));
    TC_OK(cudaMalloc((void **)&dst, sizeof h));
    TC_OK(cudaMemcpy(a, h, sizeof h, cudaMemcpyHostToDevice));
    for (int i = 0; i < 4; i++)
        h[i] *= 10;
    TC_OK(cudaMemcpy(b, h, sizeof h, cudaMemcpyHostToDevice));
    TC_OK(cudaDeviceSynchronize());
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t ga = capture_scale(s, dst, a, 4), gb = capture_scale(s, dst, b, 4);
    cudaGraphExec_t x;
    TC_OK(cudaGraphInstantiate(&x, ga, 0));
    TC_OK(cudaGraphLaunch(x, s));
    TC_OK(cudaMemcpyAsync(out, dst, sizeof out, cudaMemcpyDeviceToHost, s));
    assert_true(out[3] == 8.0f);
    TC_OK(cudaGraphExecUpdate(x, gb, NULL));
    TC_OK(cudaGraphLaunch(x, s));
    TC_OK(cudaMemcpyAsync(out, dst, sizeof out, cudaMemcpyDeviceToHost, s));
    assert_true(out[3] == 80.0f);
    TC_OK(cudaGraphExecDestroy(x));
    TC_OK(cudaGraphDestroy(ga));
    TC_OK(cudaGraphDestroy(gb));
    TC_OK(cudaFree(a));
    TC_OK(cudaFree(b));
    TC_OK(cudaFree(dst));
    TC_OK(cudaStreamDestroy(s));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_triple_chevron_path),
        cmocka_unit_test(test_kernel_graph_update),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
