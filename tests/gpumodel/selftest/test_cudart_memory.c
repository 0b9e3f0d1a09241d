/*
 * test_cudart_memory: the model's memory -- poisoned fresh memory, range
 * checks (out of range, freed, overlapping, device memory as a host operand),
 * CUDA's host synchronization of copies and fills (staged pageable sources,
 * pageable destinations waited for, pinned ones not, cudaMemset asynchronous),
 * cudaFree synchronizing, pinned/mapped/managed memory and pointer attributes.
 * Run with GM_NO_CONCURRENT_MANAGED=1 (set in main) to see that knob.
 */
#include <string.h>

#include "test_cudart_util.h"

static void test_poison(void **state)
{
    (void)state;
    float *d, *m, *h, out[64];
    TC_OK(cudaMalloc((void **)&d, sizeof out));
    TC_OK(cudaMallocManaged((void **)&m, sizeof out, cudaMemAttachGlobal));
    TC_OK(cudaHostAlloc((void **)&h, sizeof out, cudaHostAllocDefault));
    assert_int_equal((uintptr_t)d % 256, 0);
    TC_OK(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++) {
        assert_true(out[i] != out[i]); /* NaN: not zeroed */
        assert_true(m[i] != m[i] && h[i] != h[i]);
    }
    TC_OK(cudaFree(d));
    TC_OK(cudaFree(m));
    TC_OK(cudaFreeHost(h));
    void *z = (void *)1;
    TC_OK(cudaMalloc(&z, 0));
    assert_null(z);
    assert_int_equal(cudaMalloc(&z, (size_t)81 << 30), cudaErrorMemoryAllocation); /* over 80 GiB */
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
}

static void test_range_checks(void **state)
{
    (void)state;
    char *d, *d2, host[512] = {0};
    TC_OK(cudaMalloc((void **)&d, 256));
    TC_OK(cudaMalloc((void **)&d2, 256));
    TC_VIOLATIONS(0);
    assert_int_equal(cudaMemcpy(d, host, 257, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(d + 1, host, 256, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemset(d + 200, 0, 57), cudaErrorInvalidValue);
    assert_int_equal(cudaMemsetAsync(host, 0, 8, 0), cudaErrorInvalidValue); /* pageable as device */
    assert_int_equal(cudaMemcpy(d, d2, 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue); /* d2 as host */
    assert_int_equal(cudaMemcpy(d + 8, d, 16, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue); /* overlap */
    TC_VIOLATIONS(6);
    TC_OK(cudaMemcpy(d + 16, d, 16, cudaMemcpyDeviceToDevice));
    TC_OK(cudaMemcpy(host, d, 256, cudaMemcpyDefault));
    TC_OK(cudaFree(d));
    assert_int_equal(cudaMemcpy(host, d, 8, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(host, d, 8, cudaMemcpyDefault), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(d), cudaErrorInvalidValue);       /* double free */
    assert_int_equal(cudaFree(d2 + 16), cudaErrorInvalidValue); /* interior */
    assert_int_equal(cudaFree(host), cudaErrorInvalidValue);    /* never allocated */
    assert_int_equal(cudaFreeHost(d2), cudaErrorInvalidValue);  /* wrong kind */
    TC_VIOLATIONS(6);
    char err[512];
    TC_OK(gm_check_range(d2 + 8, 248, "probe", err, sizeof err));
    assert_int_equal(gm_check_range(d2 + 8, 249, "probe", err, sizeof err), cudaErrorInvalidValue);
    assert_non_null(strstr(err, "past the end"));
    assert_int_equal(gm_check_range(d, 1, "probe", err, sizeof err), cudaErrorIllegalAddress);
    assert_non_null(strstr(err, "freed"));
    assert_int_equal(gm_check_range(host, 1, "probe", err, sizeof err), cudaErrorInvalidValue);
    TC_OK(cudaFree(d2));
    (void)cudaGetLastError();
}

/* A pageable source is staged at the call: a later host write does not reach
 * the device. A pageable destination is complete when the async call returns. */
static void test_pageable_semantics(void **state)
{
    (void)state;
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d, h = 1, back = 0;
    TC_OK(cudaMalloc((void **)&d, sizeof(int)));
    static int gate;
    TC_OK(tc_write(s, &gate, 1, 20000));
    TC_OK(cudaMemcpyAsync(d, &h, sizeof h, cudaMemcpyHostToDevice, s));
    h = 2;
    TC_OK(cudaStreamSynchronize(s));
    TC_OK(cudaMemcpy(&back, d, sizeof back, cudaMemcpyDeviceToHost));
    assert_int_equal(back, 1);
    back = 0;
    h = 5;
    TC_OK(tc_write(s, &gate, 2, 20000));
    TC_OK(cudaMemcpyAsync(d, &h, sizeof h, cudaMemcpyHostToDevice, s));
    h = 6;
    TC_OK(cudaMemcpyAsync(&back, d, sizeof back, cudaMemcpyDeviceToHost, s));
    assert_int_equal(back, 5); /* no sync: a pageable destination was waited for */
    TC_OK(cudaFree(d));
    TC_OK(cudaStreamDestroy(s));
}

/* A pinned destination is not waited for; cudaMemset and a device-to-device
 * cudaMemcpy return before the work ran. */
static void test_async_returns_early(void **state)
{
    (void)state;
    cudaStream_t s;
    TC_OK(cudaStreamCreate(&s)); /* blocking: legacy work waits for it */
    int *d, *pinned;
    TC_OK(cudaMalloc((void **)&d, 2 * sizeof(int)));
    TC_OK(cudaMallocHost((void **)&pinned, sizeof(int)));
    *pinned = -7;
    static int gate;
    TC_OK(tc_write_gated(s, d, 42, &gate)); /* a host write into device memory, held */
    TC_OK(cudaMemcpyAsync(pinned, d, sizeof(int), cudaMemcpyDeviceToHost, s));
    assert_int_equal(tc_load(pinned), -7);
    TC_OK(cudaMemset(d + 1, 0, sizeof(int)));
    TC_OK(cudaMemcpy(d, d + 1, sizeof(int), cudaMemcpyDeviceToDevice));
    assert_int_equal(cudaStreamQuery(0), cudaErrorNotReady);
    tc_release(&gate);
    TC_OK(cudaStreamSynchronize(s));
    assert_int_equal(tc_load(pinned), 42);
    int back = -1;
    TC_OK(cudaMemcpy(&back, d, sizeof back, cudaMemcpyDeviceToHost));
    assert_int_equal(back, 0);
    TC_OK(cudaFree(d));
    TC_OK(cudaFreeHost(pinned));
    TC_OK(cudaStreamDestroy(s));
    (void)cudaGetLastError();
}

/* cudaFree waits for the device's pending work. */
static void test_free_synchronizes(void **state)
{
    (void)state;
    cudaStream_t s;
    TC_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *d;
    TC_OK(cudaMalloc(&d, 64));
    static int flag;
    TC_OK(tc_write(s, &flag, 1, 30000));
    TC_OK(cudaFree(d));
    assert_int_equal(tc_load(&flag), 1);
    TC_OK(cudaStreamDestroy(s));
}

static void test_pinned_mapped_managed(void **state)
{
    (void)state;
    int *h, *dp, *d, *m, pageable = 3;
    TC_OK(cudaHostAlloc((void **)&h, 64, cudaHostAllocMapped | cudaHostAllocPortable));
    TC_OK(cudaHostGetDevicePointer((void **)&dp, h, 0));
    assert_ptr_equal(dp, h);
    TC_OK(cudaMalloc((void **)&d, 64));
    TC_OK(cudaMallocManaged((void **)&m, 64, cudaMemAttachGlobal));
    struct cudaPointerAttributes a;
    TC_OK(cudaPointerGetAttributes(&a, h + 1));
    assert_int_equal(a.type, cudaMemoryTypeHost);
    assert_ptr_equal(a.hostPointer, h + 1);
    TC_OK(cudaPointerGetAttributes(&a, d));
    assert_int_equal(a.type, cudaMemoryTypeDevice);
    assert_null(a.hostPointer);
    assert_int_equal(a.device, 0);
    TC_OK(cudaPointerGetAttributes(&a, m));
    assert_int_equal(a.type, cudaMemoryTypeManaged);
    TC_OK(cudaPointerGetAttributes(&a, &pageable));
    assert_int_equal(a.type, cudaMemoryTypeUnregistered);
    assert_int_equal(cudaHostGetDevicePointer((void **)&dp, &pageable, 0), cudaErrorInvalidValue);
    assert_int_equal(cudaHostGetDevicePointer((void **)&dp, d, 0), cudaErrorInvalidValue);
    TC_VIOLATIONS(2);
    /* the device reads mapped memory; the host reads managed memory */
    for (int i = 0; i < 16; i++)
        h[i] = i * 3;
    TC_OK(cudaMemcpy(m, dp, 64, cudaMemcpyDeviceToDevice));
    TC_OK(cudaDeviceSynchronize());
    for (int i = 0; i < 16; i++)
        assert_int_equal(m[i], i * 3);
    struct cudaDeviceProp p;
    TC_OK(cudaGetDeviceProperties(&p, 0));
    assert_int_equal(p.concurrentManagedAccess, 0); /* GM_NO_CONCURRENT_MANAGED=1 */
    TC_OK(cudaFreeHost(h));
    TC_OK(cudaFree(d));
    TC_OK(cudaFree(m));
    (void)cudaGetLastError();
}

static void test_nccl_memory(void **state)
{
    (void)state;
    void *p;
    TC_OK(gm_alloc_nccl(&p, 1024));
    char err[256];
    TC_OK(gm_check_range(p, 1024, "nccl", err, sizeof err));
    assert_int_equal(cudaFree(p), cudaErrorInvalidValue); /* ncclMemFree's */
    TC_VIOLATIONS(1);
    TC_OK(gm_free_nccl(p));
    assert_int_equal(gm_check_range(p, 1, "nccl", err, sizeof err), cudaErrorIllegalAddress);
    (void)cudaGetLastError();
}

int main(void)
{
    setenv("GM_NO_CONCURRENT_MANAGED", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poison),
        cmocka_unit_test(test_range_checks),
        cmocka_unit_test(test_pageable_semantics),
        cmocka_unit_test(test_async_returns_early),
        cmocka_unit_test(test_free_synchronizes),
        cmocka_unit_test(test_pinned_mapped_managed),
        cmocka_unit_test(test_nccl_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
