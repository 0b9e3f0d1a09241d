/*
 * The local backend's large collectives (mf_backend_local.c: from
 * MF_LOCAL_STREAM_MIN = 8 MiB per destination, a push all-gather and an
 * all-reduce that write the destinations with streaming stores), checked by
 * the docs/design.md §4.1 oracle on every rank: ddp (all-reduce of fp32 and
 * of bf16 gradients) and zero3 (all-gather of bf16 weights, reduce-scatter)
 * on 2 and 3 thread-ranks, with an odd element count (chunks that start off
 * every alignment), sum and avg. The small collectives (below the threshold)
 * are every other runtime test's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "rt_testlib.h"

/* 4.4 M elements: 8.8 MB in bf16, 17.6 MB in fp32, both above the 8 MiB
 * threshold; odd, so the chunks of 2 and 3 members are misaligned. */
#define BIG 4400011

static void run_large(const char *mode, int64_t ranks, mf_dtype grad, mf_reduce reduce)
{
    mf_tb_spec spec;
    mf_tb_spec_1d(&spec, ranks, reduce);
    assert_true(mf_tb_mode(mode, 1, &spec.layouts[0]));
    spec.layouts[0].dtype[MF_ROLE_GRAD] = grad;
    spec.units[0] = (mf_tb_unit){"big", false, 2, {{"w", BIG, 0}, {"b", 3, 0}}};
    mfsdp_schedule *sh = rt_build(&spec);
    char msg[1024];
    int rc = rt_check_local(sh, 2, 0, msg, sizeof msg);
    mfsdp_schedule_free(sh);
    if (rc != 0)
        fail_msg("%s on %lld ranks, grad %s: %s", mode, (long long)ranks, mf_dtype_name(grad), msg);
}

static void test_all_reduce(void **state)
{
    (void)state;
    run_large("ddp", 2, MF_FP32, MF_REDUCE_AVG);
    run_large("ddp", 3, MF_FP32, MF_REDUCE_SUM);
    run_large("ddp", 2, MF_BF16, MF_REDUCE_SUM);
    run_large("ddp", 3, MF_BF16, MF_REDUCE_AVG);
}

static void test_all_gather(void **state)
{
    (void)state;
    run_large("zero3", 2, MF_FP32, MF_REDUCE_AVG);
    run_large("zero3", 3, MF_FP32, MF_REDUCE_SUM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_all_gather),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
