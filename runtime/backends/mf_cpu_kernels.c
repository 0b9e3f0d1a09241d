/*
 * mf_cpu_kernels: the elementwise kernels of the CPU backends: add, reduce
 * and divide (dtype conversion is core/mf_dtype.c). bf16 and fp16 are
 * computed in fp32 and rounded once per kernel, so a reduction over n ranks
 * rounds once, not n-1 times.
 *
 * Invariants: kernels never allocate; reductions sum in source order so all
 * ranks computing the same reduction get identical bits (replicas stay
 * bitwise equal).
 */
#include "mf_cpu_kernels.h"

#include <string.h>

#include "mf_dtype.h"
#include "mf_nt_copy.h"

void mf_cpu_kernels_add(void *dst, mf_dtype dd, const void *src, mf_dtype sd, int64_t n)
{
    if (dd == MF_FP32 && sd == MF_FP32) {
        float *o = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++)
            o[i] += s[i];
        return;
    }
    for (int64_t i = 0; i < n; i++)
        mf_dtype_store(dst, dd, i, mf_dtype_load(dst, dd, i) + mf_dtype_load(src, sd, i));
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
 * mf_cpu_kernels_reduce and mf_cpu_kernels_reduce_out (inv: exact_inverse(divisor)). */
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
            acc[i] = mf_dtype_load(srcs[0], d, at + i);
        for (int k = 1; k < nsrc; k++)
            for (int64_t i = 0; i < len; i++)
                acc[i] += mf_dtype_load(srcs[k], d, at + i);
    }
    if (inv != 0.0f)
        for (int64_t i = 0; i < len; i++)
            acc[i] *= inv;
    else if (divisor > 1)
        for (int64_t i = 0; i < len; i++)
            acc[i] /= div;
}

void mf_cpu_kernels_reduce(void *dst, const void *const *srcs, int nsrc, int64_t off, int64_t n,
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
                mf_dtype_store(dst, d, b + i, acc[i]);
    }
}

void mf_cpu_kernels_reduce_out(void *const *dsts, int ndst, const void *const *srcs, int nsrc,
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
                mf_dtype_store(half, d, i, acc[i]);
            out = half;
        }
        for (int j = 0; j < ndst; j++)
            mf_nt_copy((char *)dsts[j] + (size_t)(off + b) * es, out, (size_t)len * es);
    }
    mf_nt_copy_fence();
}

void mf_cpu_kernels_divide(void *p, mf_dtype d, int64_t n, int64_t divisor)
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
        mf_dtype_store(p, d, i, mf_dtype_load(p, d, i) / div);
}
