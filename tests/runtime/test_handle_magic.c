/*
 * Handles carry a magic (issue 25): mfsdp_create sets it, mfsdp_destroy clears
 * it before freeing, so a call on a destroyed handle -- where its memory is
 * still mapped, as here (a freed heap block; ASan's quarantine keeps it) --
 * returns MFSDP_ERR_INVALID_USAGE naming the call instead of reading freed
 * state (it was a heap use-after-free), and a second destroy does nothing.
 * The same for a handle never made by mfsdp_create.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "mfsdp_ckpt.h"
#include "rt_testlib.h"

static const rt_mesh mesh_1x1 = {"1x1", 2, {1, 1}};

/* The call was refused as misuse, the message naming it. */
static void refused(mfsdp_result r, const char *fn)
{
    assert_int_equal(r, MFSDP_ERR_INVALID_USAGE);
    const char *msg = mfsdp_last_error(NULL);
    if (!strstr(msg, fn) || !strstr(msg, "not a live runtime"))
        fail_msg("%s: unexpected message: %s", fn, msg);
}

/* Every entry point taking a runtime, on a handle that is not live. */
static void every_entry_refuses(mfsdp_runtime *rt)
{
    mfsdp_tensor_view v;
    mfsdp_stats st;
    double x[2] = {1, 2}, norm = 0;
    float w[4] = {0};
    refused(mfsdp_step_begin(rt), "mfsdp_step_begin");
    refused(mfsdp_forward_pre(rt, 0, 0), "mfsdp_forward_pre");
    refused(mfsdp_forward_post(rt, 0, 0), "mfsdp_forward_post");
    refused(mfsdp_backward_pre(rt, 0, 0), "mfsdp_backward_pre");
    refused(mfsdp_backward_post(rt, 0, 0), "mfsdp_backward_post");
    refused(mfsdp_step_end(rt), "mfsdp_step_end");
    refused(mfsdp_synchronize(rt), "mfsdp_synchronize");
    refused(mfsdp_tensor_view_get(rt, 0, &v), "mfsdp_tensor_view_get");
    refused(mfsdp_get_stats(rt, &st), "mfsdp_get_stats");
    refused(mfsdp_allreduce(rt, x, 2, MFSDP_REDUCE_SUM), "mfsdp_allreduce");
    refused(mfsdp_grad_norm(rt, &norm), "mfsdp_grad_norm");
    refused(mfsdp_grad_clip(rt, 1.0, &norm), "mfsdp_grad_clip");
    refused(mfsdp_main_weight_scatter(rt, 0, w, MFSDP_FP32), "mfsdp_main_weight_scatter");
    refused(mfsdp_main_weight_gather(rt, 0, w, MFSDP_FP32, MFSDP_ALL_RANKS), "mfsdp_main_weight_gather");
    refused(mfsdp_ckpt_save(rt, "/nonexistent/ckpt", NULL), "mfsdp_ckpt_save");
    assert_int_equal(mfsdp_rank(rt), -1);
    assert_int_equal(mfsdp_world_size(rt), 0);
    assert_int_equal(mfsdp_coord(rt, 0), -1);
    assert_int_equal(mfsdp_num_tensors(rt), 0);
    assert_int_equal(mfsdp_tensor_find(rt, "w0"), -1);
    assert_int_equal(mfsdp_unit_find(rt, "u0"), -1);
    assert_int_equal(mfsdp_allocated_bytes(rt), 0);
    assert_ptr_equal(mfsdp_last_error(rt), mfsdp_last_error(NULL));
    mfsdp_destroy(rt);   /* a second destroy: nothing (it was a double free) */
}

static void test_destroyed_handle(void **state)
{
    (void)state;
    mf_tb_spec spec;
    rt_model_spec(&spec, "hfsdp", &mesh_1x1, 1, MF_REDUCE_AVG);
    mfsdp_schedule *sh = rt_build(&spec);
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(1, &g), MFSDP_OK);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = g;
    cfg.rank = 0;
    cfg.timeout_ms = 10000;
    mfsdp_runtime *rt = NULL;
    assert_int_equal(mfsdp_create(sh, &cfg, &rt), MFSDP_OK);
    /* Live: the same calls work (so the refusals below are the magic's). */
    assert_int_equal(mfsdp_rank(rt), 0);
    assert_true(mfsdp_num_tensors(rt) > 0);
    assert_int_equal(mfsdp_step_begin(rt), MFSDP_OK);
    mfsdp_destroy(rt);
    every_entry_refuses(rt);
    /* A NULL runtime stays an invalid argument. */
    assert_int_equal(mfsdp_step_begin(NULL), MFSDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(mfsdp_synchronize(NULL), MFSDP_ERR_INVALID_ARGUMENT);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

static void test_never_created_handle(void **state)
{
    (void)state;
    static mf_rt zeroed;   /* mapped, never made by mfsdp_create */
    every_entry_refuses(&zeroed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_destroyed_handle),
        cmocka_unit_test(test_never_created_handle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
