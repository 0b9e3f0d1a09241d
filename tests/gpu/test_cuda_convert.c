/*
 * Host references of the device dtype conversions (runtime/backends/mf_cuda_kernels.cu):
 * round to nearest even at ties, overflow to infinity, subnormals, NaN, and
 * exact round trips of every 16-bit pattern. Needs no GPU (no CUDA call is
 * made), so it runs wherever the CUDA backend is built; the device kernels
 * are checked against these references in test_cuda_kernels.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <cmocka.h>

#include "mf_cuda_kernels.h"

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_bf16_rounding(void **state)
{
    (void)state;
    assert_int_equal(mf_cuda_host_to_bf16(1.0f), 0x3f80);
    assert_int_equal(mf_cuda_host_to_bf16(-2.0f), 0xc000);
    /* exactly halfway: ties go to the even mantissa */
    assert_int_equal(mf_cuda_host_to_bf16(f_of(0x3f808000u)), 0x3f80);
    assert_int_equal(mf_cuda_host_to_bf16(f_of(0x3f818000u)), 0x3f82);
    /* just above / below halfway */
    assert_int_equal(mf_cuda_host_to_bf16(f_of(0x3f808001u)), 0x3f81);
    assert_int_equal(mf_cuda_host_to_bf16(f_of(0x3f817fffu)), 0x3f81);
    /* the largest float rounds to infinity */
    assert_int_equal(mf_cuda_host_to_bf16(f_of(0x7f7fffffu)), 0x7f80);
    assert_int_equal(mf_cuda_host_to_bf16(INFINITY), 0x7f80);
    /* NaN stays NaN (never becomes infinity by the rounding carry) */
    uint16_t n = mf_cuda_host_to_bf16(f_of(0x7fffffffu));
    assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    n = mf_cuda_host_to_bf16(f_of(0x7f800001u));
    assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
}

static void test_fp16_rounding(void **state)
{
    (void)state;
    assert_int_equal(mf_cuda_host_to_fp16(1.0f), 0x3c00);
    assert_int_equal(mf_cuda_host_to_fp16(-0.0f), 0x8000);
    assert_int_equal(mf_cuda_host_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(mf_cuda_host_to_fp16(65519.99f), 0x7bff);
    assert_int_equal(mf_cuda_host_to_fp16(65520.0f), 0x7c00); /* tie, odd mantissa: up to inf */
    assert_int_equal(mf_cuda_host_to_fp16(-1e6f), 0xfc00);
    /* ties at 1 + 2^-11: even stays, odd goes up */
    assert_int_equal(mf_cuda_host_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    assert_int_equal(mf_cuda_host_to_fp16(1.0f + 3.0f * ldexpf(1.0f, -11)), 0x3c02);
    /* subnormals: 2^-24 is the least; 2^-25 ties to 0; 3*2^-25 ties to 2 */
    assert_int_equal(mf_cuda_host_to_fp16(ldexpf(1.0f, -24)), 0x0001);
    assert_int_equal(mf_cuda_host_to_fp16(ldexpf(1.0f, -25)), 0x0000);
    assert_int_equal(mf_cuda_host_to_fp16(3.0f * ldexpf(1.0f, -25)), 0x0002);
    assert_int_equal(mf_cuda_host_to_fp16(ldexpf(1.0f, -30)), 0x0000);
    /* the largest subnormal rounds up into the least normal */
    assert_int_equal(mf_cuda_host_to_fp16(ldexpf(1.0f, -14) - ldexpf(1.0f, -26)), 0x0400);
    assert_int_equal(mf_cuda_host_to_fp16(ldexpf(1.0f, -14)), 0x0400);
    uint16_t n = mf_cuda_host_to_fp16(NAN);
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
}

/* Every finite 16-bit value converts to fp32 exactly and back to itself. */
static void test_round_trips(void **state)
{
    (void)state;
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t h = (uint16_t)b;
        if ((h & 0x7f80) != 0x7f80)
            assert_int_equal(mf_cuda_host_to_bf16(mf_cuda_host_from_bf16(h)), h);
        if ((h & 0x7c00) != 0x7c00)
            assert_int_equal(mf_cuda_host_to_fp16(mf_cuda_host_from_fp16(h)), h);
    }
    assert_true(isinf(mf_cuda_host_from_fp16(0x7c00)));
    assert_true(isnan(mf_cuda_host_from_fp16(0x7e00)));
    assert_true(mf_cuda_host_from_fp16(0x0001) == ldexpf(1.0f, -24));
    assert_true(mf_cuda_host_from_fp16(0x8001) == -ldexpf(1.0f, -24));
}

/* Rounding is to the nearest representable value: no other 16-bit value is
 * closer (checked on a spread of fp32 inputs). */
static void test_nearest(void **state)
{
    (void)state;
    uint32_t x = 12345u;
    for (int i = 0; i < 200000; i++) {
        x = x * 1664525u + 1013904223u;
        float f = ldexpf((float)(x >> 8) / 16777216.0f, (int)(x % 40) - 20);
        if (x & 1)
            f = -f;
        float b = mf_cuda_host_from_bf16(mf_cuda_host_to_bf16(f));
        float h = mf_cuda_host_from_fp16(mf_cuda_host_to_fp16(f));
        /* neighbours of the result are no closer */
        uint16_t bb = mf_cuda_host_to_bf16(f), hb = mf_cuda_host_to_fp16(f);
        float bn[2] = {mf_cuda_host_from_bf16((uint16_t)(bb + 1)), mf_cuda_host_from_bf16((uint16_t)(bb - 1))};
        float hn[2] = {mf_cuda_host_from_fp16((uint16_t)(hb + 1)), mf_cuda_host_from_fp16((uint16_t)(hb - 1))};
        for (int k = 0; k < 2; k++) {
            if (isfinite(bn[k]))
                assert_true(fabs((double)bn[k] - f) >= fabs((double)b - f));
            if (isfinite(hn[k]) && fabsf(f) < 65504.0f)
                assert_true(fabs((double)hn[k] - f) >= fabs((double)h - f));
        }
    }
}

static void test_pattern(void **state)
{
    (void)state;
    int distinct = 0;
    for (int64_t i = 0; i < 4096; i++) {
        float v = mf_cuda_pattern(7, i);
        assert_true(v >= -8.0f && v < 8.0f);
        assert_true(v * 64.0f == floorf(v * 64.0f)); /* multiple of 1/64 */
        distinct += v != mf_cuda_pattern(8, i);
    }
    assert_true(distinct > 4000); /* per-seed data differs almost everywhere */
    assert_true(mf_cuda_pattern(7, 0) != mf_cuda_pattern(7, 1) || mf_cuda_pattern(7, 1) != mf_cuda_pattern(7, 2));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_fp16_rounding),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_nearest),
        cmocka_unit_test(test_pattern),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
