/*
 * gmn_reduce: NCCL's element types and reduction operators on the host.
 *
 * The order is fixed: out = in[0] op in[1] op ... op in[n-1], rank by rank,
 * so a result depends only on the inputs, never on timing or the seed.
 * Arithmetic (stated once, also in the README):
 *   - float, double: in the type itself;
 *   - half (fp16) and bfloat16: each input widened to fp32 exactly, the
 *     reduction in fp32, the result rounded ONCE to the type (round to
 *     nearest, ties to even; NaN stays a quiet NaN, overflow gives inf);
 *   - integers: sum and prod wrap modulo 2^bits (computed unsigned);
 *   - avg: the sum (as above) divided by n: in fp32 for the 16-bit types and
 *     fp32, in double for double, and integer division (toward zero) for the
 *     integer types; then rounded once.
 * fp8 types are not modelled (gmn_dtype_size returns 0: the call is refused).
 */
#include "gmn.h"

#include <math.h>
#include <string.h>

size_t gmn_dtype_size(int t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

const char *gmn_dtype_name(int t)
{
    static const char *const names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                        "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
    return t >= 0 && t < (int)(sizeof names / sizeof names[0]) ? names[t] : "unknown type";
}

const char *gmn_op_name(int op)
{
    static const char *const names[] = {"sum", "prod", "max", "min", "avg"};
    return op >= 0 && op < 5 ? names[op] : "unknown op";
}

static float bf16_to_f(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t f_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float h_to_f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) { /* zero or subnormal: m * 2^-24 exactly */
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
    else
        x = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t f_to_h(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return sign | 0x7e00u;
    if (ax >= 0x477ff000u) /* >= 65520 rounds to inf (and inf) */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half; a * 2^24 is exact */
        float a;
        memcpy(&a, &ax, 4);
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    uint32_t m = ax - 0x38000000u; /* rebias 127 -> 15 */
    return sign | (uint16_t)((m + 0x0fffu + ((m >> 13) & 1u)) >> 13);
}

static double fop(int op, double a, double b)
{
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return a > b || isnan(a) ? a : b;
    case ncclMin: return a < b || isnan(a) ? a : b;
    default: return a + b; /* sum, avg */
    }
}

static float fop32(int op, float a, float b)
{
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return a > b || isnan(a) ? a : b;
    case ncclMin: return a < b || isnan(a) ? a : b;
    default: return a + b;
    }
}

/* Input r's elements [i, i + m) widened to fp32. */
static void load_f32(int dtype, const void *in, size_t i, size_t m, float *out)
{
    if (dtype == ncclFloat32) {
        memcpy(out, (const float *)in + i, m * sizeof(float));
    } else if (dtype == ncclFloat16) {
        for (size_t k = 0; k < m; k++)
            out[k] = h_to_f(((const uint16_t *)in)[i + k]);
    } else {
        for (size_t k = 0; k < m; k++)
            out[k] = bf16_to_f(((const uint16_t *)in)[i + k]);
    }
}

/* acc = acc op v, elementwise; one loop per op so the loops vectorize. */
static void combine_f32(int op, float *acc, const float *v, size_t m)
{
    switch (op) {
    case ncclProd:
        for (size_t k = 0; k < m; k++)
            acc[k] = acc[k] * v[k];
        break;
    case ncclMax:
        for (size_t k = 0; k < m; k++)
            acc[k] = fop32(ncclMax, acc[k], v[k]);
        break;
    case ncclMin:
        for (size_t k = 0; k < m; k++)
            acc[k] = fop32(ncclMin, acc[k], v[k]);
        break;
    default:
        for (size_t k = 0; k < m; k++)
            acc[k] = acc[k] + v[k];
        break;
    }
}

/* The 16-bit float types and fp32: the fp32 path, in blocks of GMN_BLOCK
 * elements (each element still reduced in rank order). */
#define GMN_BLOCK 1024
static void reduce_f32(int dtype, int op, int n, const void *const *in, void *out, size_t count)
{
    float acc[GMN_BLOCK], v[GMN_BLOCK];
    for (size_t i = 0; i < count; i += GMN_BLOCK) {
        size_t m = count - i < GMN_BLOCK ? count - i : GMN_BLOCK;
        load_f32(dtype, in[0], i, m, acc);
        for (int r = 1; r < n; r++) {
            load_f32(dtype, in[r], i, m, v);
            combine_f32(op, acc, v, m);
        }
        if (op == ncclAvg)
            for (size_t k = 0; k < m; k++)
                acc[k] = acc[k] / (float)n;
        if (dtype == ncclFloat32)
            memcpy((float *)out + i, acc, m * sizeof(float));
        else if (dtype == ncclFloat16)
            for (size_t k = 0; k < m; k++)
                ((uint16_t *)out)[i + k] = f_to_h(acc[k]);
        else
            for (size_t k = 0; k < m; k++)
                ((uint16_t *)out)[i + k] = f_to_bf16(acc[k]);
    }
}

static void reduce_f64(int op, int n, const void *const *in, void *out, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        double acc = ((const double *)in[0])[i];
        for (int r = 1; r < n; r++)
            acc = fop(op, acc, ((const double *)in[r])[i]);
        ((double *)out)[i] = op == ncclAvg ? acc / (double)n : acc;
    }
}

#define REDUCE_INT(T, UT)                                                                       \
    for (size_t i = 0; i < count; i++) {                                                        \
        T acc = ((const T *)in[0])[i];                                                          \
        for (int r = 1; r < n; r++) {                                                           \
            T v = ((const T *)in[r])[i];                                                        \
            if (op == ncclProd)                                                                 \
                acc = (T)((UT)acc * (UT)v);                                                     \
            else if (op == ncclMax)                                                             \
                acc = v > acc ? v : acc;                                                        \
            else if (op == ncclMin)                                                             \
                acc = v < acc ? v : acc;                                                        \
            else                                                                                \
                acc = (T)((UT)acc + (UT)v);                                                     \
        }                                                                                       \
        ((T *)out)[i] = op == ncclAvg ? (T)(acc / (__typeof__(acc + 0))n) : acc;                 \
    }

void gmn_reduce(int dtype, int op, int n, const void *const *in, void *out, size_t count)
{
    switch (dtype) {
    case ncclFloat32: case ncclFloat16: case ncclBfloat16:
        reduce_f32(dtype, op, n, in, out, count);
        break;
    case ncclFloat64:
        reduce_f64(op, n, in, out, count);
        break;
    case ncclInt8: REDUCE_INT(int8_t, uint8_t) break;
    case ncclUint8: REDUCE_INT(uint8_t, uint8_t) break;
    case ncclInt32: REDUCE_INT(int32_t, uint32_t) break;
    case ncclUint32: REDUCE_INT(uint32_t, uint32_t) break;
    case ncclInt64: REDUCE_INT(int64_t, uint64_t) break;
    case ncclUint64: REDUCE_INT(uint64_t, uint64_t) break;
    default: break;
    }
}
