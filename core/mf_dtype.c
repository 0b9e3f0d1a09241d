/*
 * mf_dtype: fp32 <-> bf16/fp16 conversions (see the header). The fp32
 * side's bits are read and written through memcpy, never by type punning.
 */
#include "mf_dtype.h"

#include <string.h>

uint16_t mf_dtype_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);          /* quiet NaN, keep sign */
    uint32_t bias = 0x7fffu + ((x >> 16) & 1u);        /* ties to even */
    return (uint16_t)((x + bias) >> 16);
}

float mf_dtype_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t mf_dtype_f32_to_fp16(float f)
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

float mf_dtype_fp16_to_f32(uint16_t h)
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

float mf_dtype_load(const void *p, mf_dtype d, int64_t i)
{
    switch (d) {
    case MF_BF16:
        return mf_dtype_bf16_to_f32(((const uint16_t *)p)[i]);
    case MF_FP16:
        return mf_dtype_fp16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

void mf_dtype_store(void *p, mf_dtype d, int64_t i, float v)
{
    switch (d) {
    case MF_BF16:
        ((uint16_t *)p)[i] = mf_dtype_f32_to_bf16(v);
        break;
    case MF_FP16:
        ((uint16_t *)p)[i] = mf_dtype_f32_to_fp16(v);
        break;
    default:
        ((float *)p)[i] = v;
        break;
    }
}

void mf_dtype_convert(void *dst, mf_dtype dd, const void *src, mf_dtype sd, int64_t n)
{
    const float *sf = src;
    const uint16_t *sh = src;
    float *of = dst;
    uint16_t *oh = dst;
    if (n <= 0)
        return;
    if (dd == sd) {
        if (dst != src)
            memmove(dst, src, (size_t)n * mf_dtype_size(dd));
    } else if (sd == MF_FP32 && dd == MF_BF16) {       /* one direct loop per pair: vectorizable */
        for (int64_t i = 0; i < n; i++)
            oh[i] = mf_dtype_f32_to_bf16(sf[i]);
    } else if (sd == MF_FP32) {
        for (int64_t i = 0; i < n; i++)
            oh[i] = mf_dtype_f32_to_fp16(sf[i]);
    } else if (dd == MF_FP32 && sd == MF_BF16) {
        for (int64_t i = 0; i < n; i++)
            of[i] = mf_dtype_bf16_to_f32(sh[i]);
    } else if (dd == MF_FP32) {
        for (int64_t i = 0; i < n; i++)
            of[i] = mf_dtype_fp16_to_f32(sh[i]);
    } else {
        for (int64_t i = 0; i < n; i++)                 /* bf16 <-> fp16 through fp32 */
            mf_dtype_store(dst, dd, i, mf_dtype_load(src, sd, i));
    }
}
