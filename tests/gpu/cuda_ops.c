/*
 * cuda_ops: trainer_check's memory operations on a CUDA stream (cuda_ops.h).
 */
#include "cuda_ops.h"

#include <stdio.h>

#include "mf_cuda_kernels.h"

static bool ok(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        fprintf(stderr, "cuda_ops: %s: %s\n", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

static cudaStream_t stream_of(void *ctx)
{
    return ((cuda_stream_ctx *)ctx)->stream;
}

static bool fill(void *ctx, void *buf, mfsdp_dtype t, int64_t n, uint32_t seed)
{
    return ok(mf_cuda_fill_pattern(buf, (mf_dtype)t, n, seed, stream_of(ctx)), "fill");
}

static bool copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    return ok(mf_cuda_copy(dst, src, bytes, stream_of(ctx)), "copy");
}

static bool write_from_host(void *ctx, void *dst, const void *host, size_t bytes)
{
    return ok(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_of(ctx)), "write") &&
           ok(cudaStreamSynchronize(stream_of(ctx)), "write: synchronize");
}

static bool read_to_host(void *ctx, void *host, const void *src, size_t bytes)
{
    return ok(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_of(ctx)), "read") &&
           ok(cudaStreamSynchronize(stream_of(ctx)), "read: synchronize");
}

static void *alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    return ok(cudaMalloc(&p, bytes), "cudaMalloc") ? p : NULL;
}

static void release(void *ctx, void *p)
{
    (void)ctx;
    (void)ok(cudaFree(p), "cudaFree");
}

const tc_ops cuda_ops = {.fill = fill, .copy = copy, .write = write_from_host, .read = read_to_host, .alloc = alloc,
                         .release = release};
