/*
 * core/mf_dtype: fp32 <-> bf16/fp16 conversions against hand-written bit
 * patterns (round to nearest even, ties, subnormals, overflow, NaN),
 * exhaustively where the domain is small, against the compiler's _Float16
 * on random inputs; the element load/store and the buffer conversion.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "float_bits.h"
#include "mf_dtype.h"

/* Exact values, both ways, written out by hand. */
static void test_known_patterns(void **state)
{
    (void)state;
    assert_int_equal(mf_dtype_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(mf_dtype_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(mf_dtype_f32_to_bf16(0.0f), 0x0000);
    assert_int_equal(mf_dtype_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(f_bits(mf_dtype_bf16_to_f32(0x3f80)), 0x3f800000u);
    assert_int_equal(f_bits(mf_dtype_bf16_to_f32(0x0001)), 0x00010000u);   /* bf16 subnormal */
    assert_int_equal(mf_dtype_f32_to_fp16(1.0f), 0x3c00);
    assert_int_equal(mf_dtype_f32_to_fp16(-2.0f), 0xc000);
    assert_int_equal(mf_dtype_f32_to_fp16(0.5f), 0x3800);
    assert_int_equal(mf_dtype_f32_to_fp16(INFINITY), 0x7c00);
    assert_int_equal(mf_dtype_f32_to_fp16(-INFINITY), 0xfc00);
    assert_int_equal(mf_dtype_f32_to_fp16(1e6f), 0x7c00);                  /* overflow */
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0x3c00)), 0x3f800000u);
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0x7bff)), f_bits(65504.0f));
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0x7c00)), 0x7f800000u);
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0xfc00)), 0xff800000u);
    /* fp16 subnormals: mant * 2^-24, exact in fp32. */
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0x0001)), 0x33800000u);   /* 2^-24 */
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0x0200)), 0x38000000u);   /* 2^-15 */
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0x03ff)), 0x387fc000u);   /* largest */
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0x8001)), 0xb3800000u);
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0x8000)), 0x80000000u);   /* -0 */
    assert_int_equal(mf_dtype_f32_to_fp16(bits_f(0x387fc000u)), 0x03ff);
    /* NaN stays NaN, quiet, its sign kept. */
    assert_int_equal(mf_dtype_f32_to_bf16(bits_f(0x7fc00000u)), 0x7fc0);
    assert_int_equal(mf_dtype_f32_to_bf16(bits_f(0xff800001u)), 0xffc0);
    assert_int_equal(mf_dtype_f32_to_fp16(bits_f(0x7fc00000u)), 0x7e00);
    assert_int_equal(mf_dtype_f32_to_fp16(bits_f(0xff800001u)), 0xfe00);
    assert_int_equal(f_bits(mf_dtype_fp16_to_f32(0x7e00)), 0x7fc00000u);
}

/* Every finite half and bfloat16 survives the trip through fp32. */
static void test_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t x = (uint16_t)h;
        bool bf_nan = (x & 0x7f80) == 0x7f80 && (x & 0x7f);
        bool fp_nan = (x & 0x7c00) == 0x7c00 && (x & 0x3ff);
        if (!bf_nan)
            assert_int_equal(mf_dtype_f32_to_bf16(mf_dtype_bf16_to_f32(x)), x);
        else
            assert_true(isnan(mf_dtype_bf16_to_f32(x)) &&
                        isnan(mf_dtype_bf16_to_f32(mf_dtype_f32_to_bf16(mf_dtype_bf16_to_f32(x)))));
        if (!fp_nan)
            assert_int_equal(mf_dtype_f32_to_fp16(mf_dtype_fp16_to_f32(x)), x);
        else
            assert_true(isnan(mf_dtype_fp16_to_f32(x)));
    }
}

/* Ties go to even; one ulp above a tie goes up. */
static void test_bf16_rounding(void **state)
{
    (void)state;
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even is 1. */
    assert_int_equal(mf_dtype_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* (1 + 2^-7) + 2^-8 is halfway; even is 1 + 2^-6. */
    assert_int_equal(mf_dtype_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82);
    assert_int_equal(mf_dtype_f32_to_bf16(bits_f(0x3f808001)), 0x3f81);
    /* The largest finite fp32 rounds to infinity in bf16. */
    assert_int_equal(mf_dtype_f32_to_bf16(bits_f(0x7f7fffff)), 0x7f80);
    assert_int_equal(mf_dtype_f32_to_bf16(-INFINITY), 0xff80);
    uint16_t n = mf_dtype_f32_to_bf16(bits_f(0x7f800001));   /* signalling NaN stays NaN */
    assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f));
}

static void test_fp16_rounding(void **state)
{
    (void)state;
    assert_int_equal(mf_dtype_f32_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(mf_dtype_f32_to_fp16(65519.0f), 0x7bff);      /* below the tie */
    assert_int_equal(mf_dtype_f32_to_fp16(65520.0f), 0x7c00);      /* tie to even: infinity */
    assert_int_equal(mf_dtype_f32_to_fp16(0x1p-24f), 0x0001);      /* smallest subnormal */
    assert_int_equal(mf_dtype_f32_to_fp16(0x1p-25f), 0x0000);      /* tie with zero: even */
    assert_int_equal(mf_dtype_f32_to_fp16(0x1.8p-25f), 0x0001);
    assert_int_equal(mf_dtype_f32_to_fp16(0x1.8p-24f), 0x0002);    /* 1.5 ulp: tie to even 2 */
    assert_int_equal(mf_dtype_f32_to_fp16(0x1p-14f), 0x0400);      /* smallest normal */
    assert_int_equal(mf_dtype_f32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(mf_dtype_f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(mf_dtype_f32_to_fp16(1.0f + 0x1p-10f + 0x1p-11f), 0x3c02);
}

#if defined(__FLT16_MAX__)
/* Against the compiler's conversion on many random fp32 bit patterns. */
static void test_fp16_vs_compiler(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 2000000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint32_t u = (uint32_t)x;
        if (i & 1)   /* bias half of them into fp16's range */
            u = (u & 0x807fffffu) | ((uint32_t)(100 + (x >> 40) % 50) << 23);
        float f = bits_f(u);
        if (isnan(f))
            continue;
        _Float16 h = (_Float16)f;
        uint16_t want;
        memcpy(&want, &h, 2);
        if (mf_dtype_f32_to_fp16(f) != want)
            fail_msg("fp16 of %a (0x%08x): got 0x%04x, compiler 0x%04x", (double)f, u,
                     mf_dtype_f32_to_fp16(f), want);
    }
}
#endif

static void test_convert(void **state)
{
    (void)state;
    float a[5] = {1.0f, -2.5f, 3.0f, 1e-3f, 65504.0f};
    uint16_t h[5], b[5];
    float back[5];
    mf_dtype_convert(h, MF_FP16, a, MF_FP32, 5);
    mf_dtype_convert(b, MF_BF16, a, MF_FP32, 5);
    mf_dtype_convert(back, MF_FP32, h, MF_FP16, 5);
    assert_true(back[1] == -2.5f && back[4] == 65504.0f);
    mf_dtype_convert(back, MF_FP32, b, MF_BF16, 5);
    assert_true(back[2] == 3.0f);
    /* bf16 -> fp16 goes through fp32. */
    uint16_t hb[5];
    mf_dtype_convert(hb, MF_FP16, b, MF_BF16, 5);
    assert_int_equal(hb[2], h[2]);
    const uint16_t want_h[5] = {0x3c00, 0xc100, 0x4200, 0x1419, 0x7bff};
    const uint16_t want_b[5] = {0x3f80, 0xc020, 0x4040, 0x3a83, 0x4780};
    assert_memory_equal(h, want_h, sizeof h);
    assert_memory_equal(b, want_b, sizeof b);
    /* fp16 -> bf16: 65504 is 0x477fe000 in fp32, rounds up to 0x4780. */
    uint16_t bh[5];
    mf_dtype_convert(bh, MF_BF16, h, MF_FP16, 5);
    assert_int_equal(bh[4], 0x4780);
    /* The same dtype is a memmove (in place allowed); n <= 0 touches nothing. */
    uint16_t same[4] = {1, 2, 3, 4};
    mf_dtype_convert(same + 1, MF_BF16, same, MF_BF16, 3);
    assert_true(same[0] == 1 && same[1] == 1 && same[2] == 2 && same[3] == 3);
    mf_dtype_convert(same, MF_BF16, same, MF_BF16, 4);
    assert_true(same[3] == 3);
    mf_dtype_convert(h, MF_FP16, a, MF_FP32, 0);
    mf_dtype_convert(h, MF_FP16, a, MF_FP32, -1);
    assert_memory_equal(h, want_h, sizeof h);
}

/* Element access: load widens exactly, store rounds like the conversions. */
static void test_load_store(void **state)
{
    (void)state;
    uint16_t hb[2] = {0, 0};
    float f[2] = {0, 0};
    mf_dtype_store(hb, MF_BF16, 1, 1.0f + 0x1p-8f);            /* tie: even, 1.0 */
    assert_int_equal(hb[1], 0x3f80);
    assert_int_equal(hb[0], 0);
    mf_dtype_store(hb, MF_FP16, 0, 0x1.8p-24f);                /* 1.5 ulp: even, 2 */
    assert_int_equal(hb[0], 0x0002);
    assert_int_equal(f_bits(mf_dtype_load(hb, MF_FP16, 0)), 0x34000000u);   /* 2^-23 */
    assert_int_equal(f_bits(mf_dtype_load(hb, MF_BF16, 1)), 0x3f800000u);
    mf_dtype_store(f, MF_FP32, 1, -3.25f);
    assert_true(f[1] == -3.25f && mf_dtype_load(f, MF_FP32, 1) == -3.25f && f[0] == 0.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_patterns),
        cmocka_unit_test(test_roundtrip_exhaustive),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_fp16_rounding),
#if defined(__FLT16_MAX__)
        cmocka_unit_test(test_fp16_vs_compiler),
#endif
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_load_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
