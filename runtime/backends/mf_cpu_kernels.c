/*
 * mf_cpu_kernels: the elementwise kernels of the CPU backends: dtype
 * conversion (fp32 <-> bf16/fp16, round to nearest even), add, reduce and
 * divide. bf16 and fp16 are computed in fp32 and rounded once per kernel, so
 * a reduction over n ranks rounds once, not n-1 times.
 *
 * Invariants: kernels never allocate; reductions sum in source order so all
 * ranks computing the same reduction get identical bits (replicas stay
 * bitwise equal).
 */
#include <string.h>

#include "mf_backend.h"

uint16_t mf_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);          /* quiet NaN, keep sign */
    uint32_t bias = 0x7fffu + ((x >> 16) & 1u);        /* ties to even */
    return (uint16_t)((x + bias) >> 16);
}

float mf_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t mf_f32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)                               /* NaN: quiet, keep payload top */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u)                              /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {                             /* below 2^-14: subnormal or zero */
        if (ax <= 0x33000000u)                          /* <= 2^-25 rounds to (even) zero */
            return (uint16_t)sign;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(ax >> 23);              /* 14..24 */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - 0x38000000u;                      /* rebias 127 -> 15 */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

float mf_fp16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mant = (uint32_t)h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        float v = (float)mant * 5.9604644775390625e-8f; /* mant * 2^-24, exact */
        return sign ? -v : v;
    }
    if (exp == 31)
        x = sign | 0x7f800000u | (mant << 13);
    else
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

float mf_cpu_load(const void *p, mf_dtype d, int64_t i)
{
    switch (d) {
    case MF_BF16:
        return mf_bf16_to_f32(((const uint16_t *)p)[i]);
    case MF_FP16:
        return mf_fp16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

void mf_cpu_store(void *p, mf_dtype d, int64_t i, float v)
{
    switch (d) {
    case MF_BF16:
        ((uint16_t *)p)[i] = mf_f32_to_bf16(v);
        break;
    case MF_FP16:
        ((uint16_t *)p)[i] = mf_f32_to_fp16(v);
        break;
    default:
        ((float *)p)[i] = v;
        break;
    }
}

void mf_cpu_convert(void *dst, mf_dtype dd, const void *src, mf_dtype sd, int64_t n)
{
    if (n <= 0)
        return;
    if (dd == sd) {
        if (dst != src)
            memmove(dst, src, (size_t)n * mf_dtype_size(dd));
        return;
    }
    if (sd == MF_FP32) {
        const float *s = src;
        uint16_t *o = dst;
        if (dd == MF_BF16)
            for (int64_t i = 0; i < n; i++)
                o[i] = mf_f32_to_bf16(s[i]);
        else
            for (int64_t i = 0; i < n; i++)
                o[i] = mf_f32_to_fp16(s[i]);
        return;
    }
    if (dd == MF_FP32) {
        const uint16_t *s = src;
        float *o = dst;
        if (sd == MF_BF16)
            for (int64_t i = 0; i < n; i++)
                o[i] = mf_bf16_to_f32(s[i]);
        else
            for (int64_t i = 0; i < n; i++)
                o[i] = mf_fp16_to_f32(s[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++)                     /* bf16 <-> fp16 through fp32 */
        mf_cpu_store(dst, dd, i, mf_cpu_load(src, sd, i));
}

void mf_cpu_add(void *dst, mf_dtype dd, const void *src, mf_dtype sd, int64_t n)
{
    if (dd == MF_FP32 && sd == MF_FP32) {
        float *o = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++)
            o[i] += s[i];
        return;
    }
    for (int64_t i = 0; i < n; i++)
        mf_cpu_store(dst, dd, i, mf_cpu_load(dst, dd, i) + mf_cpu_load(src, sd, i));
}

/* 1 / divisor when that is exact (divisor a power of two), else 0. Then
 * x * inverse is x / divisor bit for bit: both round the same real number
 * (x * 2^-k) once, subnormals and NaNs included; a multiply costs a fraction
 * of a divide, which made the average of an all-reduce compute-bound. */
static float exact_inverse(int64_t divisor)
{
    if (divisor <= 1 || divisor > ((int64_t)1 << 62) || (divisor & (divisor - 1)) != 0)
        return 0.0f;
    return 1.0f / (float)divisor;
}

/* Block size of the fp32 accumulator used by reduce (on the stack). */
#define MF_REDUCE_BLOCK 512

/* acc[i] = (sum over k < nsrc of srcs[k][at + i]) / divisor, i < len <=
 * MF_REDUCE_BLOCK, summed in fp32 in k order: the one arithmetic of
 * mf_cpu_reduce and mf_cpu_reduce_out (inv: exact_inverse(divisor)). */
static void reduce_block(float *acc, const void *const *srcs, int nsrc, int64_t at, int64_t len,
                         mf_dtype d, int64_t divisor, float inv)
{
    float div = (float)divisor;
    if (d == MF_FP32) {
        const float *s0 = (const float *)srcs[0] + at;
        for (int64_t i = 0; i < len; i++)
            acc[i] = s0[i];
        for (int k = 1; k < nsrc; k++) {
            const float *sk = (const float *)srcs[k] + at;
            for (int64_t i = 0; i < len; i++)
                acc[i] += sk[i];
        }
    } else {
        for (int64_t i = 0; i < len; i++)
            acc[i] = mf_cpu_load(srcs[0], d, at + i);
        for (int k = 1; k < nsrc; k++)
            for (int64_t i = 0; i < len; i++)
                acc[i] += mf_cpu_load(srcs[k], d, at + i);
    }
    if (inv != 0.0f)
        for (int64_t i = 0; i < len; i++)
            acc[i] *= inv;
    else if (divisor > 1)
        for (int64_t i = 0; i < len; i++)
            acc[i] /= div;
}

void mf_cpu_reduce(void *dst, const void *const *srcs, int nsrc, int64_t off, int64_t n,
                   mf_dtype d, int64_t divisor)
{
    float acc[MF_REDUCE_BLOCK];
    float inv = exact_inverse(divisor);
    for (int64_t b = 0; b < n; b += MF_REDUCE_BLOCK) {
        int64_t len = n - b < MF_REDUCE_BLOCK ? n - b : MF_REDUCE_BLOCK;
        reduce_block(acc, srcs, nsrc, off + b, len, d, divisor, inv);
        if (d == MF_FP32)
            memcpy((float *)dst + b, acc, (size_t)len * sizeof(float));
        else
            for (int64_t i = 0; i < len; i++)
                mf_cpu_store(dst, d, b + i, acc[i]);
    }
}

void mf_cpu_reduce_out(void *const *dsts, int ndst, const void *const *srcs, int nsrc,
                       int64_t off, int64_t n, mf_dtype d, int64_t divisor)
{
    float acc[MF_REDUCE_BLOCK];
    uint16_t half[MF_REDUCE_BLOCK];
    float inv = exact_inverse(divisor);
    size_t es = mf_dtype_size(d);
    for (int64_t b = 0; b < n; b += MF_REDUCE_BLOCK) {
        int64_t len = n - b < MF_REDUCE_BLOCK ? n - b : MF_REDUCE_BLOCK;
        reduce_block(acc, srcs, nsrc, off + b, len, d, divisor, inv);
        const void *out = acc;
        if (d != MF_FP32) {
            for (int64_t i = 0; i < len; i++)
                mf_cpu_store(half, d, i, acc[i]);
            out = half;
        }
        for (int j = 0; j < ndst; j++)
            mf_cpu_stream_copy((char *)dsts[j] + (size_t)(off + b) * es, out, (size_t)len * es);
    }
    mf_cpu_stream_fence();
}

void mf_cpu_divide(void *p, mf_dtype d, int64_t n, int64_t divisor)
{
    if (divisor <= 1)
        return;
    float div = (float)divisor, inv = exact_inverse(divisor);
    if (d == MF_FP32) {                                 /* one vectorizable pass */
        float *f = p;
        if (inv != 0.0f)
            for (int64_t i = 0; i < n; i++)
                f[i] *= inv;
        else
            for (int64_t i = 0; i < n; i++)
                f[i] /= div;
        return;
    }
    for (int64_t i = 0; i < n; i++)
        mf_cpu_store(p, d, i, mf_cpu_load(p, d, i) / div);
}
