/*
 * The alpha-beta cost model (mf_cost.h): defaults per axis, the ring
 * formulas, the launch term, local ops, and command-line overrides.
 */
#include <math.h>
#include <string.h>

#include "plan_testlib.h"

static mf_mesh mesh2(void)
{
    mf_mesh m = {.naxes = 2, .world = 32};
    m.axes[0].name = "dp_outer";
    m.axes[0].size = 4;
    m.axes[1].name = "dp_inner";
    m.axes[1].size = 8;
    return m;
}

static void near(double got, double want)
{
    if (fabs(got - want) > 1e-12 + 1e-9 * fabs(want))
        fail_msg("got %.12g, want %.12g", got, want);
}

static void test_defaults(void **state)
{
    (void)state;
    mf_mesh m = mesh2();
    mf_cost_model cm;
    mf_cost_defaults(&cm, &m);
    near(cm.axis[1].alpha, 2e-6);
    near(cm.axis[1].beta, 360e9);
    near(cm.axis[0].alpha, 8e-6);
    near(cm.axis[0].beta, 45e9);
    near(cm.launch, 5e-6);
    near(cm.local_bw, 3e12);
    /* a 1-D mesh: its only axis is the inner one */
    mf_mesh one = {.naxes = 1, .world = 8};
    mf_cost_defaults(&cm, &one);
    near(cm.axis[0].beta, 360e9);
}

static void test_ring_formulas(void **state)
{
    (void)state;
    mf_mesh m = mesh2();
    mf_cost_model cm;
    mf_cost_defaults(&cm, &m);
    int64_t c = 1 << 20;
    near(mf_cost_op(&cm, &m, MF_OP_ALL_GATHER, 1, c, MF_BF16), 5e-6 + 7 * (2e-6 + c * 2.0 / 360e9));
    near(mf_cost_op(&cm, &m, MF_OP_REDUCE_SCATTER, 0, c, MF_FP32), 5e-6 + 3 * (8e-6 + c * 4.0 / 45e9));
    near(mf_cost_op(&cm, &m, MF_OP_ALL_REDUCE, 0, c, MF_FP32), 5e-6 + 6 * (8e-6 + c / 4.0 * 4.0 / 45e9));
    near(mf_cost_op(&cm, &m, MF_OP_CAST, -1, c, MF_BF16), 2.0 * c * 2 / 3e12);
    near(mf_cost_op(&cm, &m, MF_OP_SLICE, 0, c, MF_FP32), 2.0 * c * 4 / 3e12);
    near(mf_cost_op(&cm, &m, MF_OP_ACCUMULATE, -1, c, MF_FP32), 3.0 * c * 4 / 3e12);
    near(mf_cost_op(&cm, &m, MF_OP_RECORD, -1, 0, MF_FP32), 0);
    /* an axis of size 1 costs the launch only */
    mf_mesh m1 = m;
    m1.axes[0].size = 1;
    near(mf_cost_op(&cm, &m1, MF_OP_ALL_REDUCE, 0, c, MF_FP32), 5e-6);
    /* the ring time per byte matches mf_schedule_collective_bytes */
    cm.launch = 0;
    cm.axis[0].alpha = 0;
    near(mf_cost_op(&cm, &m, MF_OP_ALL_REDUCE, 0, c, MF_FP32),
         (double)mf_schedule_collective_bytes(MF_OP_ALL_REDUCE, 4, c, MF_FP32) / 45e9);
}

static void test_options(void **state)
{
    (void)state;
    mf_mesh m = mesh2();
    mf_cost_model cm;
    mf_cost_defaults(&cm, &m);
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--inner-bw=100"), 1);
    near(cm.axis[1].beta, 100e9);
    near(cm.axis[0].beta, 45e9);
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--outer-bw=25"), 1);
    near(cm.axis[0].beta, 25e9);
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--inner-lat=1.5"), 1);
    near(cm.axis[1].alpha, 1.5e-6);
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--outer-lat=20"), 1);
    near(cm.axis[0].alpha, 20e-6);
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--axis-bw=dp_outer:12.5"), 1);
    near(cm.axis[0].beta, 12.5e9);
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--axis-lat=dp_inner:0"), 1);
    near(cm.axis[1].alpha, 0);
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--local-bw=1000"), 1);
    near(cm.local_bw, 1e12);
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--launch-lat=7"), 1);
    near(cm.launch, 7e-6);
    /* malformed values and unknown axes */
    const char *bad[] = {"--inner-bw=", "--inner-bw=0", "--inner-bw=-3", "--inner-bw=fast", "--outer-lat=-1",
                         "--axis-bw=dp_middle:5", "--axis-bw=dp_inner", "--axis-lat=dp_inner:x",
                         "--launch-lat=nan", "--local-bw=1e400"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (mf_cost_parse_option(&cm, &m, bad[i]) != -1)
            fail_msg("'%s' was accepted", bad[i]);
        assert_true(mf_cost_is_option(bad[i])); /* recognized as a cost option, value rejected */
    }
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--format=yaml"), 0);
    assert_int_equal(mf_cost_parse_option(&cm, &m, "--inner-bw"), 0);
    assert_true(mf_cost_is_option("--outer-bw=3"));
    assert_false(mf_cost_is_option("--outer-bw"));
    assert_false(mf_cost_is_option("--format=text"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_ring_formulas),
        cmocka_unit_test(test_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
