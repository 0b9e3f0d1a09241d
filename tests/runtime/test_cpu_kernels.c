/*
 * The CPU kernels: add, reduce (sum order, avg), divide; the streaming copy
 * and the streaming reduce (the same bits as memcpy and mf_cpu_kernels_reduce). The
 * conversions they use are tested in tests/core/test_dtype.c.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "../core/float_bits.h"
#include "mf_backend.h"
#include "mf_cpu_kernels.h"
#include "mf_nt_copy.h"

static void test_add_divide(void **state)
{
    (void)state;
    float a[5] = {1.0f, -2.5f, 3.0f, 1e-3f, 65504.0f};
    uint16_t h[5];
    mf_dtype_convert(h, MF_FP16, a, MF_FP32, 5);
    /* add: dst += src with mixed dtypes. */
    float acc[5] = {1, 1, 1, 1, 1};
    mf_cpu_kernels_add(acc, MF_FP32, h, MF_FP16, 5);
    assert_true(acc[0] == 2.0f && acc[1] == -1.5f);
    uint16_t hb2[2] = {mf_dtype_f32_to_bf16(1.0f), mf_dtype_f32_to_bf16(2.0f)};
    float one[2] = {0x1p-9f, 0.5f};
    mf_cpu_kernels_add(hb2, MF_BF16, one, MF_FP32, 2);
    assert_int_equal(hb2[0], mf_dtype_f32_to_bf16(1.0f));          /* 1 + 2^-9 rounds back to 1 */
    assert_int_equal(hb2[1], mf_dtype_f32_to_bf16(2.5f));
    float d[3] = {3, 6, 9};
    mf_cpu_kernels_divide(d, MF_FP32, 3, 3);
    assert_true(d[0] == 1 && d[1] == 2 && d[2] == 3);
}

/* Sums in source order in fp32 (identical bits on every rank), then avg. */
static void test_reduce(void **state)
{
    (void)state;
    enum { N = 1500 };   /* more than one accumulator block */
    static float s0[2 * N], s1[2 * N], s2[2 * N], out[N];
    for (int i = 0; i < 2 * N; i++) {
        s0[i] = (float)i;
        s1[i] = 1.0f;
        s2[i] = -0.5f * (float)i;
    }
    const void *srcs[3] = {s0, s1, s2};
    mf_cpu_kernels_reduce(out, srcs, 3, N, N, MF_FP32, 1);
    for (int i = 0; i < N; i++)
        assert_true(out[i] == ((float)(N + i) + 1.0f) + -0.5f * (float)(N + i));
    mf_cpu_kernels_reduce(out, srcs, 3, 0, N, MF_FP32, 3);
    assert_true(out[3] == ((3.0f + 1.0f) - 1.5f) / 3.0f);
    /* Order matters in fp32: 1e8 + 1 - 1e8 = 0, and that is what we want
     * (the same order everywhere). */
    float big[1] = {1e8f}, small[1] = {1.0f}, neg[1] = {-1e8f}, r[1];
    const void *o[3] = {big, small, neg};
    mf_cpu_kernels_reduce(r, o, 3, 0, 1, MF_FP32, 1);
    assert_true(r[0] == 0.0f);
    /* bf16 reduces through fp32 and rounds once: 1 + 3 * 2^-9 rounds to
     * 1 + 2^-7, while adding 2^-9 three times in bf16 would stay at 1. */
    uint16_t b0[1] = {mf_dtype_f32_to_bf16(1.0f)}, bq[1] = {mf_dtype_f32_to_bf16(0x1p-9f)}, rb[1];
    const void *ob[4] = {b0, bq, bq, bq};
    mf_cpu_kernels_reduce(rb, ob, 4, 0, 1, MF_BF16, 1);
    assert_int_equal(rb[0], mf_dtype_f32_to_bf16(1.0f + 0x1p-7f));
    assert_int_equal(f_bits(mf_dtype_bf16_to_f32(rb[0])), f_bits(1.0f + 0x1p-7f));
}

/* A power-of-two divisor is applied as a multiply by its inverse: the result
 * must equal a true division bit for bit, on every kind of float (normal,
 * subnormal results, zero, infinity, NaN), fp32 and bf16. */
static void test_average_power_of_two(void **state)
{
    (void)state;
    enum { N = 4096 };
    static float x[N], out[N];
    uint32_t r = 12345u;
    for (int i = 0; i < N; i++) {
        r = r * 1664525u + 1013904223u;          /* any bit pattern */
        x[i] = bits_f(i % 8 == 0 ? (r & 0x807fffffu) | 0x00800000u : r);   /* some tiny ones */
    }
    x[0] = 0.0f;
    x[1] = -INFINITY;
    x[2] = bits_f(0x7fc00001u);
    x[3] = bits_f(0x00000001u);
    x[4] = 3.0f * 0x1p-126f;
    const int64_t divisors[] = {2, 4, 8, 1024, 3, 6};
    for (size_t k = 0; k < sizeof divisors / sizeof *divisors; k++) {
        volatile float dv = (float)divisors[k];  /* a real division, not one the compiler rewrote */
        const void *srcs[1] = {x};
        mf_cpu_kernels_reduce(out, srcs, 1, 0, N, MF_FP32, divisors[k]);
        for (int i = 0; i < N; i++) {
            float want = x[i] / dv;
            if (f_bits(out[i]) != f_bits(want) && !(isnan(want) && isnan(out[i])))
                fail_msg("reduce avg over %lld of %a: got %a, want %a", (long long)divisors[k],
                         (double)x[i], (double)out[i], (double)want);
        }
        memcpy(out, x, sizeof out);
        mf_cpu_kernels_divide(out, MF_FP32, N, divisors[k]);
        for (int i = 0; i < N; i++) {
            float want = x[i] / dv;
            if (f_bits(out[i]) != f_bits(want) && !(isnan(want) && isnan(out[i])))
                fail_msg("divide by %lld of %a: got %a, want %a", (long long)divisors[k],
                         (double)x[i], (double)out[i], (double)want);
        }
        uint16_t hb[64], rb[64];
        for (int i = 0; i < 64; i++)
            hb[i] = (uint16_t)(f_bits(x[i + 5]) >> 16);
        const void *sb[1] = {hb};
        mf_cpu_kernels_reduce(rb, sb, 1, 0, 64, MF_BF16, divisors[k]);
        for (int i = 0; i < 64; i++) {
            uint16_t want = mf_dtype_f32_to_bf16(mf_dtype_bf16_to_f32(hb[i]) / dv);
            if (rb[i] != want && !(isnan(mf_dtype_bf16_to_f32(want)) && isnan(mf_dtype_bf16_to_f32(rb[i]))))
                fail_msg("bf16 reduce avg over %lld of 0x%04x: got 0x%04x, want 0x%04x",
                         (long long)divisors[k], hb[i], rb[i], want);
        }
    }
}

/* mf_nt_copy writes exactly memcpy's bytes: every length around the
 * 16- and 64-byte steps, every misalignment of source and destination, and
 * nothing outside [dst, dst + len). */
static void test_stream_copy(void **state)
{
    (void)state;
    static unsigned char src[512], dst[512 + 64];
    for (int i = 0; i < (int)sizeof src; i++)
        src[i] = (unsigned char)(i * 37 + 11);
    for (int len = 0; len <= 300; len += len < 140 ? 1 : 23)
        for (int da = 0; da < 16; da++)
            for (int sa = 0; sa < 16; sa += 5) {
                memset(dst, 0xa5, sizeof dst);
                mf_nt_copy(dst + 16 + da, src + sa, (size_t)len);
                mf_nt_copy_fence();
                for (int i = 0; i < (int)sizeof dst; i++) {
                    int k = i - 16 - da;
                    unsigned char want = k >= 0 && k < len ? src[sa + k] : 0xa5;
                    if (dst[i] != want)
                        fail_msg("stream copy of %d bytes, dst+%d, src+%d: byte %d is 0x%02x, "
                                 "want 0x%02x", len, da, sa, i, dst[i], want);
                }
            }
}

/* mf_cpu_kernels_reduce_out gives every destination the bits mf_cpu_kernels_reduce gives one
 * (fp32, bf16, fp16; sum, exact and inexact averages; odd lengths across the
 * accumulator's blocks; odd offsets and destinations off every alignment),
 * writes nothing outside [off, off + n), and reduces in place (a destination
 * that is a source). */
static void test_reduce_out(void **state)
{
    (void)state;
    enum { CAP = 3000, PAD = 8 };
    static unsigned char src_mem[3][CAP * 4 + 64], dst_mem[3][CAP * 4 + 64 + 2 * PAD];
    static unsigned char want[CAP * 4];
    const mf_dtype dts[3] = {MF_FP32, MF_BF16, MF_FP16};
    const int64_t lens[] = {1, 7, 511, 512, 513, 1237};
    const int64_t offs[] = {0, 3, 1029};
    const int64_t divisors[] = {1, 2, 3};
    uint32_t rng = 777u;
    for (int t = 0; t < 3; t++) {
        mf_dtype d = dts[t];
        size_t es = d == MF_FP32 ? 4 : 2;
        for (int nsrc = 1; nsrc <= 3; nsrc++)
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
                for (size_t oi = 0; oi < sizeof offs / sizeof *offs; oi++)
                    for (size_t vi = 0; vi < sizeof divisors / sizeof *divisors; vi++)
                        for (int inplace = 0; inplace < 2; inplace++) {
                            int64_t n = lens[li], off = offs[oi];
                            int mis = (int)(li + oi) % 3;   /* dst/src misaligned by mis elements */
                            const void *srcs[3];
                            void *dsts[3];
                            for (int k = 0; k < nsrc; k++) {
                                unsigned char *p = src_mem[k] + (size_t)(k + mis) * es;
                                for (int64_t i = 0; i < off + n; i++) {
                                    rng = rng * 1664525u + 1013904223u;
                                    float v = (float)(int32_t)(rng >> 8) * 0x1p-20f;
                                    mf_dtype_store(p, d, i, v);
                                }
                                srcs[k] = p;
                            }
                            mf_cpu_kernels_reduce(want, srcs, nsrc, off, n, d, divisors[vi]);
                            int ndst = nsrc;
                            for (int j = 0; j < ndst; j++) {
                                unsigned char *base = dst_mem[j] + PAD + (size_t)(j + 2 * mis) * es;
                                if (inplace) {
                                    /* the destination is the source: the
                                     * reduction must read it before writing */
                                    dsts[j] = (void *)srcs[j];
                                } else {
                                    memset(dst_mem[j], 0x5a, sizeof dst_mem[j]);
                                    dsts[j] = base;
                                }
                            }
                            unsigned char before[3][2 * 4];   /* the elements around the range */
                            for (int j = 0; j < ndst; j++) {
                                unsigned char *p = dsts[j];
                                memcpy(before[j], p + (off ? off - 1 : 0) * (int64_t)es, es);
                                memcpy(before[j] + 4, p + (off + n) * (int64_t)es, es);
                            }
                            mf_cpu_kernels_reduce_out(dsts, ndst, srcs, nsrc, off, n, d, divisors[vi]);
                            for (int j = 0; j < ndst; j++) {
                                unsigned char *p = dsts[j];
                                if (memcmp(p + off * (int64_t)es, want, (size_t)n * es) != 0)
                                    fail_msg("reduce_out %s nsrc %d n %lld off %lld div %lld "
                                             "in place %d: destination %d differs from "
                                             "mf_cpu_kernels_reduce", mf_dtype_name(d), nsrc,
                                             (long long)n, (long long)off,
                                             (long long)divisors[vi], inplace, j);
                                if (off)
                                    assert_memory_equal(p + (off - 1) * (int64_t)es, before[j], es);
                                assert_memory_equal(p + (off + n) * (int64_t)es, before[j] + 4, es);
                            }
                        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_divide),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_average_power_of_two),
        cmocka_unit_test(test_stream_copy),
        cmocka_unit_test(test_reduce_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
