/*
 * Every mode of docs/semantics.md §4.5 x meshes {1x1, 1x4, 2x2, 2x4, 4x2, 3x2, 2x2x2} x
 * M in {1, 3}, on the local backend, with builder schedules (independent of
 * the planner) and the docs/design.md §4.1 oracle on every rank for two steps: unsharded
 * weights equal the cast main_weight (padding included), the delivered
 * gradient equals the reduction of every rank's local gradients.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "rt_testlib.h"

static void run_mode(const char *mode, mf_reduce reduce)
{
    for (int k = 0; k < rt_nmeshes; k++)
        for (int64_t M = 1; M <= 3; M += 2) {
            mf_tb_spec spec;
            rt_model_spec(&spec, mode, &rt_meshes[k], M, reduce);
            mfsdp_schedule *sh = rt_build(&spec);
            char msg[1024];
            int rc = rt_check_local(sh, 2, 0, msg, sizeof msg);
            mfsdp_schedule_free(sh);
            if (rc != 0)
                fail_msg("%s on %s, M=%lld: %s", mode, rt_meshes[k].name, (long long)M, msg);
        }
}

#define MODE_TEST(name, reduce)                         \
    static void test_##name(void **state)               \
    {                                                   \
        (void)state;                                    \
        run_mode(#name, reduce);                        \
    }
MODE_TEST(ddp, MF_REDUCE_AVG)
MODE_TEST(zero1, MF_REDUCE_AVG)
MODE_TEST(zero2, MF_REDUCE_SUM)
MODE_TEST(zero3, MF_REDUCE_AVG)
MODE_TEST(hsdp, MF_REDUCE_AVG)
MODE_TEST(hfsdp, MF_REDUCE_AVG)
MODE_TEST(hsdp_nosync, MF_REDUCE_SUM)
MODE_TEST(fsdp2d, MF_REDUCE_AVG)
MODE_TEST(zero2_inner_zero1_outer, MF_REDUCE_AVG)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ddp),   cmocka_unit_test(test_zero1),
        cmocka_unit_test(test_zero2), cmocka_unit_test(test_zero3),
        cmocka_unit_test(test_hsdp),  cmocka_unit_test(test_hfsdp),
        cmocka_unit_test(test_hsdp_nosync), cmocka_unit_test(test_fsdp2d),
        cmocka_unit_test(test_zero2_inner_zero1_outer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
