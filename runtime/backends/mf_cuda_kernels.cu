/*
 * mf_cuda_kernels: the elementwise device kernels behind mf_cuda_kernels.h
 * (cast, accumulate, scale, multi-rank reduce, test pattern), plus the host
 * references of the dtype conversions.
 *
 * One templated kernel, combine<S, D>, covers every op: it reads k sources of
 * dtype S and optionally the first destination, sums in fp32 in source order,
 * scales, rounds once to D (round to nearest even) and writes every
 * destination. Work is split into chunks of 8 elements; when all operands are
 * 16-byte aligned each chunk moves with 16-byte vector loads and stores (two
 * for fp32), otherwise element by element. A grid-stride loop over chunks
 * keeps the grid bounded (no host query of the device), and the ragged tail
 * (n mod 8 elements) is done by the first threads. The launch never blocks the
 * host and allocates nothing, so it can be captured into a CUDA graph; each
 * call returns its own launch's result (cudaLaunchKernel), never a last error
 * left behind by an earlier call on the thread.
 */
#include "mf_cuda_kernels.h"
#include "mf_pattern.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <string.h>

namespace {

constexpr int kVec = 8;          /* elements per chunk */
constexpr int kThreads = 256;    /* threads per block */
constexpr int64_t kMaxBlocks = 2048; /* grid-stride cap: ~8 blocks per SM on H100/H200 */

struct operands {
    const void *src[MF_CUDA_MAX_OPERANDS];
    void *dst[MF_CUDA_MAX_OPERANDS];
    int nsrc, ndst;
};

/* Element codecs: raw storage type <-> fp32. */
template <int T> struct codec;
template <> struct codec<MF_FP32> {
    typedef float raw;
    static __device__ __forceinline__ float load(raw v) { return v; }
    static __device__ __forceinline__ raw store(float f) { return f; }
};
template <> struct codec<MF_BF16> {
    typedef unsigned short raw;
    static __device__ __forceinline__ float load(raw v) { return __uint_as_float((unsigned)v << 16); }
    static __device__ __forceinline__ raw store(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};
template <> struct codec<MF_FP16> {
    typedef unsigned short raw;
    static __device__ __forceinline__ float load(raw v) { return __half2float(__ushort_as_half(v)); }
    static __device__ __forceinline__ raw store(float f) { return __half_as_ushort(__float2half_rn(f)); }
};

/* 8 elements with 16-byte accesses: fp32 as two float4, 16-bit as one uint4. */
template <int T> __device__ __forceinline__ void load8(const void *p, int64_t chunk, float out[kVec])
{
    typedef typename codec<T>::raw raw;
    if (sizeof(raw) == 4) {
        const float4 *q = reinterpret_cast<const float4 *>(p) + 2 * chunk;
        float4 a = q[0], b = q[1];
        out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
        out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    } else {
        uint4 v = reinterpret_cast<const uint4 *>(p)[chunk];
        unsigned w[4] = {v.x, v.y, v.z, v.w};
        for (int i = 0; i < 4; i++) {
            out[2 * i] = codec<T>::load((raw)(w[i] & 0xffffu));
            out[2 * i + 1] = codec<T>::load((raw)(w[i] >> 16));
        }
    }
}

template <int T> __device__ __forceinline__ void store8(void *p, int64_t chunk, const float in[kVec])
{
    typedef typename codec<T>::raw raw;
    if (sizeof(raw) == 4) {
        float4 *q = reinterpret_cast<float4 *>(p) + 2 * chunk;
        q[0] = make_float4(in[0], in[1], in[2], in[3]);
        q[1] = make_float4(in[4], in[5], in[6], in[7]);
    } else {
        unsigned w[4];
        for (int i = 0; i < 4; i++)
            w[i] = (unsigned)codec<T>::store(in[2 * i]) | ((unsigned)codec<T>::store(in[2 * i + 1]) << 16);
        reinterpret_cast<uint4 *>(p)[chunk] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

template <int T> __device__ __forceinline__ float load1(const void *p, int64_t i)
{
    return codec<T>::load(reinterpret_cast<const typename codec<T>::raw *>(p)[i]);
}

template <int T> __device__ __forceinline__ void store1(void *p, int64_t i, float v)
{
    reinterpret_cast<typename codec<T>::raw *>(p)[i] = codec<T>::store(v);
}

template <int S, int D>
__global__ void __launch_bounds__(kThreads)
combine_kernel(operands ops, int64_t n, float scale, bool divide, bool add_dst, bool vec)
{
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t chunks = vec ? n / kVec : 0;
    for (int64_t c = tid; c < chunks; c += stride) {
        float acc[kVec], v[kVec];
        load8<S>(ops.src[0], c, acc);
        for (int k = 1; k < ops.nsrc; k++) {
            load8<S>(ops.src[k], c, v);
            for (int e = 0; e < kVec; e++)
                acc[e] = __fadd_rn(acc[e], v[e]);
        }
        if (divide)
            for (int e = 0; e < kVec; e++)
                acc[e] = __fdiv_rn(acc[e], scale);
        else
            for (int e = 0; e < kVec; e++)
                acc[e] = __fmul_rn(acc[e], scale);
        if (add_dst) {
            load8<D>(ops.dst[0], c, v);
            for (int e = 0; e < kVec; e++)
                acc[e] = __fadd_rn(v[e], acc[e]);
        }
        for (int j = 0; j < ops.ndst; j++)
            store8<D>(ops.dst[j], c, acc);
    }
    /* Scalar elements: the tail after the chunks, or everything when unaligned. */
    for (int64_t i = chunks * kVec + tid; i < n; i += stride) {
        float acc = load1<S>(ops.src[0], i);
        for (int k = 1; k < ops.nsrc; k++)
            acc = __fadd_rn(acc, load1<S>(ops.src[k], i));
        acc = divide ? __fdiv_rn(acc, scale) : __fmul_rn(acc, scale);
        if (add_dst)
            acc = __fadd_rn(load1<D>(ops.dst[0], i), acc);
        for (int j = 0; j < ops.ndst; j++)
            store1<D>(ops.dst[j], i, acc);
    }
}

template <int T> __global__ void __launch_bounds__(kThreads) fill_kernel(void *buf, int64_t n, uint32_t seed)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        store1<T>(buf, i, mf_pattern(seed, i));
}

/* The device's nanosecond global timer into v. A macro so that a host build
 * of this file (the CPU model's kernels, tests/gpumodel/kernels) can define
 * it first as a host clock. */
#ifndef MF_GLOBALTIMER
#define MF_GLOBALTIMER(v) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v))
#endif

/* One thread spinning on the global timer for ns nanoseconds, at most
 * ns + kSpinSlack timer reads: a read takes well over a nanosecond, so the
 * cap never ends a spin on a timer that advances, and one that does not
 * (a frozen or virtualized timer) costs a bounded loop instead of a hang. */
constexpr long long kSpinSlack = 1024;
__global__ void spin_kernel(int64_t ns)
{
    unsigned long long t0, t;
    MF_GLOBALTIMER(t0);
    long long cap = (long long)ns + kSpinSlack;
    for (long long iter = 0; iter < cap; iter++) {
        MF_GLOBALTIMER(t);
        if ((int64_t)(t - t0) >= ns)
            break;
    }
}

unsigned grid_for(int64_t work)
{
    int64_t blocks = (work + kThreads - 1) / kThreads;
    if (blocks < 1)
        blocks = 1;
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

/* Launches fn and returns the launch's own result. Not cudaGetLastError():
 * that also returns whatever an earlier call on this thread left behind (a
 * cudaErrorNotReady from an event or stream query, for one). A failed launch
 * is cleared from the last-error state: it is returned here. */
cudaError_t launch(const void *fn, unsigned grid, void **args, cudaStream_t s)
{
    cudaError_t e = cudaLaunchKernel(fn, dim3(grid), dim3(kThreads), args, 0, s);
    if (e != cudaSuccess)
        (void)cudaGetLastError();
    return e;
}

template <int S, int D>
cudaError_t launch_combine(operands ops, int64_t n, float scale, bool divide, bool add_dst, bool vec,
                           cudaStream_t s)
{
    int64_t work = vec ? n / kVec + n % kVec : n;
    void *args[] = {&ops, &n, &scale, &divide, &add_dst, &vec};
    return launch(reinterpret_cast<const void *>(&combine_kernel<S, D>), grid_for(work), args, s);
}

template <int S>
cudaError_t dispatch_dst(mf_dtype dt, const operands &ops, int64_t n, float scale, bool divide, bool add_dst,
                         bool vec, cudaStream_t s)
{
    switch (dt) {
    case MF_FP32: return launch_combine<S, MF_FP32>(ops, n, scale, divide, add_dst, vec, s);
    case MF_BF16: return launch_combine<S, MF_BF16>(ops, n, scale, divide, add_dst, vec, s);
    case MF_FP16: return launch_combine<S, MF_FP16>(ops, n, scale, divide, add_dst, vec, s);
    default: return cudaErrorInvalidValue;
    }
}

bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

bool dtype_ok(mf_dtype t)
{
    return t == MF_FP32 || t == MF_BF16 || t == MF_FP16;
}

size_t dtype_bytes(mf_dtype t)
{
    return t == MF_FP32 ? 4 : 2;
}

} // namespace

extern "C" {

cudaError_t mf_cuda_combine(void *const *dsts, int ndst, mf_dtype dt,
                            const void *const *srcs, int nsrc, mf_dtype st,
                            int64_t n, float scale, mf_cuda_scaling how, bool add_dst,
                            cudaStream_t stream)
{
    if (n < 0 || !dtype_ok(dt) || !dtype_ok(st) || ndst < 1 || ndst > MF_CUDA_MAX_OPERANDS ||
        nsrc < 1 || nsrc > MF_CUDA_MAX_OPERANDS || !dsts || !srcs || (how != MF_CUDA_MUL && how != MF_CUDA_DIV))
        return cudaErrorInvalidValue;
    operands ops;
    memset(&ops, 0, sizeof ops);
    ops.nsrc = nsrc;
    ops.ndst = ndst;
    bool vec = true;
    for (int j = 0; j < ndst; j++) {
        if (!dsts[j])
            return cudaErrorInvalidValue;
        ops.dst[j] = dsts[j];
        vec = vec && aligned16(dsts[j]);
    }
    for (int k = 0; k < nsrc; k++) {
        if (!srcs[k])
            return cudaErrorInvalidValue;
        ops.src[k] = srcs[k];
        vec = vec && aligned16(srcs[k]);
    }
    if (n == 0)
        return cudaSuccess;
    bool divide = how == MF_CUDA_DIV;
    if (scale == 1.0f) { /* x * 1 == x / 1 == x: one instantiation path, no extra op */
        divide = false;
    }
    switch (st) {
    case MF_FP32: return dispatch_dst<MF_FP32>(dt, ops, n, scale, divide, add_dst, vec, stream);
    case MF_BF16: return dispatch_dst<MF_BF16>(dt, ops, n, scale, divide, add_dst, vec, stream);
    case MF_FP16: return dispatch_dst<MF_FP16>(dt, ops, n, scale, divide, add_dst, vec, stream);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t mf_cuda_copy(void *dst, const void *src, size_t bytes, cudaStream_t stream)
{
    if (bytes == 0 || dst == src)
        return cudaSuccess;
    if (!dst || !src)
        return cudaErrorInvalidValue;
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
}

cudaError_t mf_cuda_cast(void *dst, mf_dtype dt, const void *src, mf_dtype st,
                         int64_t n, cudaStream_t stream)
{
    if (dt == st && dtype_ok(dt) && n >= 0)
        return mf_cuda_copy(dst, src, (size_t)n * dtype_bytes(dt), stream);
    void *d[1] = {dst};
    const void *s[1] = {src};
    return mf_cuda_combine(d, 1, dt, s, 1, st, n, 1.0f, MF_CUDA_MUL, false, stream);
}

cudaError_t mf_cuda_accumulate(void *dst, mf_dtype dt, const void *src, mf_dtype st,
                               int64_t n, bool overwrite, cudaStream_t stream)
{
    if (overwrite)
        return mf_cuda_cast(dst, dt, src, st, n, stream);
    void *d[1] = {dst};
    const void *s[1] = {src};
    return mf_cuda_combine(d, 1, dt, s, 1, st, n, 1.0f, MF_CUDA_MUL, true, stream);
}

cudaError_t mf_cuda_scale(void *buf, mf_dtype t, int64_t n, float alpha, cudaStream_t stream)
{
    void *d[1] = {buf};
    const void *s[1] = {buf};
    return mf_cuda_combine(d, 1, t, s, 1, t, n, alpha, MF_CUDA_MUL, false, stream);
}

cudaError_t mf_cuda_fill_pattern(void *buf, mf_dtype t, int64_t n, uint32_t seed, cudaStream_t stream)
{
    if (n < 0 || !buf || !dtype_ok(t))
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    void *args[] = {&buf, &n, &seed};
    const void *fn = t == MF_FP32   ? reinterpret_cast<const void *>(&fill_kernel<MF_FP32>)
                     : t == MF_BF16 ? reinterpret_cast<const void *>(&fill_kernel<MF_BF16>)
                                    : reinterpret_cast<const void *>(&fill_kernel<MF_FP16>);
    return launch(fn, grid_for(n), args, stream);
}

cudaError_t mf_cuda_spin(int64_t ns, cudaStream_t stream)
{
    if (ns < 0)
        return cudaErrorInvalidValue;
    void *args[] = {&ns};
    cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void *>(&spin_kernel), dim3(1), dim3(1), args, 0, stream);
    if (e != cudaSuccess)
        (void)cudaGetLastError();
    return e;
}

float mf_cuda_pattern(uint32_t seed, int64_t i)
{
    return mf_pattern(seed, i);
}

/* ---- host references ---- */

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t mf_cuda_host_to_bf16(float f)
{
    uint32_t x = bits_of(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN, sign kept */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

uint16_t mf_cuda_host_to_fp16(float f)
{
    uint32_t x = bits_of(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* >= halfway between 65504 and 65536: rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half, m * 2^-24 */
        float m = rintf(float_of(ax) * 16777216.0f); /* exact scaling, RNE */
        return (uint16_t)(sign | (uint16_t)m);       /* m == 1024 is the least normal */
    }
    uint32_t e = (ax >> 23) - 127 + 15, mant = ax & 0x7fffffu;
    uint32_t h = (e << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the correct next binade */
    return (uint16_t)(sign | h);
}

float mf_cuda_host_from_bf16(uint16_t b)
{
    return float_of((uint32_t)b << 16);
}

float mf_cuda_host_from_fp16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0)
        return sign ? -ldexpf((float)m, -24) : ldexpf((float)m, -24);
    if (e == 31)
        return float_of(sign | 0x7f800000u | (m << 13));
    return float_of(sign | ((e - 15 + 127) << 23) | (m << 13));
}

} // extern "C"
