/*
 * test_check_tie: the check mode names the weight a trainer read outside its
 * windows, not only the gradient the NaN reached. The model is an LM in
 * miniature on one rank: unit 0 "embed" (tensor "embed.weight"), unit 1
 * "norm" (tensor "norm.weight"); the "head" runs in unit 1's backward and
 * reads the embedding's weight there (a tie the spec does not declare), so
 * norm's gradient is computed from it. backward_post(unit 1) must name
 * "embed.weight" and say what to do, for fp32 weights:
 *   - embed sharded (Flat): the tie needs the tied layout;
 *   - embed replicated on every axis (the tied layout): the check mode holds
 *     it to its unit's windows all the same, check the model untied.
 * Without the check mode the same trainer runs through (silently wrong).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "rt_testlib.h"

enum { EMBED = 0, NORM = 1 };

/* The two-unit schedule on one rank; the embedding's layout places its weight as embed_weight ("F" or "R"). */
static mfsdp_schedule *two_units(const char *embed_weight)
{
    mf_tb_spec spec = {.naxes = 1, .sizes = {1}, .microbatches = 1, .reduce = MF_REDUCE_AVG, .nlayouts = 2, .nunits = 2};
    for (int l = 0; l < 2; l++)
        spec.layouts[l] = (mf_tb_layout){.dtype = {MF_FP32, MF_FP32, MF_FP32},
                                         .place = {l == 0 ? embed_weight : "F", "F", "F"}};
    spec.units[EMBED] = (mf_tb_unit){.name = "embed", .ntensors = 1, .tensors = {{"weight", 6, 0}}};
    spec.units[NORM] = (mf_tb_unit){.name = "norm", .ntensors = 1, .tensors = {{"weight", 4, 1}}};
    return rt_build(&spec);
}

static float *weight_of(mfsdp_runtime *rt, const char *name, float **grad_local)
{
    mfsdp_tensor_view v;
    assert_int_equal(mfsdp_tensor_view_get(rt, mfsdp_tensor_find(rt, name), &v), MFSDP_OK);
    *grad_local = v.grad_local;
    return v.weight;
}

#define HOOK(call)                                                     \
    do {                                                               \
        if ((r = (call)) != MFSDP_OK) {                                \
            snprintf(msg, msglen, "%s", mfsdp_last_error(rt));         \
            goto done;                                                 \
        }                                                              \
    } while (0)

/* One step; the head reads embed.weight in norm's backward. The first
 * failing hook's result, its message in msg. */
static mfsdp_result tied_step(const char *embed_weight, uint32_t flags, char *msg, size_t msglen)
{
    mfsdp_schedule *sh = two_units(embed_weight);
    mfsdp_local_group *g;
    assert_int_equal(mfsdp_local_group_create(1, &g), MFSDP_OK);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = g;
    cfg.flags = flags;
    mfsdp_runtime *rt;
    assert_int_equal(mfsdp_create(sh, &cfg, &rt), MFSDP_OK);
    float *eg, *ng, *ew = weight_of(rt, "embed.weight", &eg), *nw = weight_of(rt, "norm.weight", &ng);
    mfsdp_result r = MFSDP_OK;
    msg[0] = '\0';
    HOOK(mfsdp_step_begin(rt));
    HOOK(mfsdp_forward_pre(rt, EMBED, 0));
    HOOK(mfsdp_forward_post(rt, EMBED, 0));
    HOOK(mfsdp_forward_pre(rt, NORM, 0));
    HOOK(mfsdp_forward_post(rt, NORM, 0));
    HOOK(mfsdp_backward_pre(rt, NORM, 0));
    for (int i = 0; i < 4; i++)
        ng[i] = nw[i] * ew[i]; /* the head: the embedding's weight, outside its unit's windows */
    HOOK(mfsdp_backward_post(rt, NORM, 0));
    HOOK(mfsdp_backward_pre(rt, EMBED, 0));
    for (int i = 0; i < 6; i++)
        eg[i] = ew[i];
    HOOK(mfsdp_backward_post(rt, EMBED, 0));
    HOOK(mfsdp_step_end(rt));
done:
    mfsdp_destroy(rt);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
    return r;
}

static void expect_named(const char *embed_weight, const char *hint)
{
    char msg[1024];
    assert_int_equal(tied_step(embed_weight, 0, msg, sizeof msg), MFSDP_OK); /* silent without it */
    assert_int_equal(tied_step(embed_weight, MFSDP_FLAG_CHECK, msg, sizeof msg), MFSDP_ERR_INVALID_USAGE);
    print_message("%s\n", msg);
    const char *want[] = {
        "check mode: mfsdp_backward_post(unit 1 \"norm\", microbatch 0): grad_local of tensor \"norm.weight\"",
        "is a NaN made from the check pattern of the weight of tensor \"embed.weight\" (unit 0 \"embed\")",
        hint,
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        if (!strstr(msg, want[k]))
            fail_msg("want \"%s\" in: %s", want[k], msg);
}

static void test_sharded_tie_is_named(void **state)
{
    (void)state;
    expect_named("F", "a weight that another unit reads (a tie, e.g. an LM head reading the embedding) needs the "
                      "tied layout");
}

static void test_replicated_tie_is_named(void **state)
{
    (void)state;
    expect_named("R", "that weight is replicated on every axis (the tied layout), but the check mode holds every "
                      "weight to its own unit's windows");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded_tie_is_named),
        cmocka_unit_test(test_replicated_tie_is_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
