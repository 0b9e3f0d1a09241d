/*
 * test_check_mode: MFSDP_FLAG_CHECK (mf_debug.c) catches each trainer
 * mistake that is silent without it, with a message naming the hook, the
 * tensor and the first bad element; a correct trainer is unaffected.
 *
 *   test_check_mode SCHEDULE    (tiny_1x1.yaml: one rank, units fc0 and fc1,
 *                                tensors <unit>.weight and <unit>.bias)
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mfsdp.h"

static const char *g_path;

typedef enum mistake {
    NONE,
    GRAD_INTO_WEIGHT,   /* the gradient of fc1.weight written into its weight */
    OTHER_UNIT_GRAD,    /* fc0's grad_local written during fc1's backward */
    ADD_INTO,           /* grad_local += g instead of = g */
    PARTIAL,            /* only the first half of fc1.bias's grad_local written */
    READ_BEFORE,        /* fc0.weight read before forward_pre(fc0), used as a gradient */
    READ_AFTER,         /* fc0.weight read after forward_post(fc0) */
} mistake;

typedef struct outcome {
    mfsdp_result r;     /* the first failing hook's result, or MFSDP_OK */
    char msg[1024];
    float read;         /* the value READ_BEFORE / READ_AFTER saw */
    int delivered_ok;   /* NONE: the delivered gradient equals what was written */
} outcome;

static float gval(int k, int64_t i)
{
    return 0.25f * (float)(k + 1) + (float)i;
}

static void write_grad(mfsdp_runtime *rt, int unit, mistake mk, float extra)
{
    for (int k = 0; k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, k, &v);
        float *gl = v.grad_local, *w = v.weight;
        if (v.unit != unit && !(mk == OTHER_UNIT_GRAD && unit == 1))
            continue;
        int64_t n = mk == PARTIAL && !strcmp(v.name, "fc1.bias") ? v.numel / 2 : v.numel;
        for (int64_t i = 0; i < n; i++) {
            if (mk == GRAD_INTO_WEIGHT && !strcmp(v.name, "fc1.weight"))
                w[i] = gval(k, i);
            else if (mk == ADD_INTO)
                gl[i] += gval(k, i);
            else
                gl[i] = gval(k, i) + (i == 0 ? extra : 0.0f);
        }
    }
}

#define HOOK(call)                                                                  \
    do {                                                                            \
        if ((o->r = (call)) != MFSDP_OK) {                                          \
            snprintf(o->msg, sizeof o->msg, "%s", mfsdp_last_error(rt));            \
            goto done;                                                              \
        }                                                                           \
    } while (0)

/* One rank of the tiny schedule on the local backend: the schedule, its
 * group and the runtime, opened by one_rank_open (flags; timeout_ms > 0
 * replaces the default) and freed by one_rank_close. */
typedef struct one_rank {
    mfsdp_schedule *sh;
    mfsdp_local_group *g;
    mfsdp_runtime *rt;
} one_rank;

static void one_rank_open(one_rank *o, uint32_t flags, int64_t timeout_ms)
{
    memset(o, 0, sizeof *o);
    assert_int_equal(mfsdp_schedule_load(g_path, &o->sh), MFSDP_OK);
    assert_int_equal(mfsdp_local_group_create(1, &o->g), MFSDP_OK);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = o->g;
    cfg.rank = 0;
    cfg.flags = flags;
    if (timeout_ms > 0)
        cfg.timeout_ms = timeout_ms;
    assert_int_equal(mfsdp_create(o->sh, &cfg, &o->rt), MFSDP_OK);
}

static void one_rank_close(one_rank *o)
{
    mfsdp_destroy(o->rt);
    mfsdp_local_group_destroy(o->g);
    mfsdp_schedule_free(o->sh);
}

static void run(mistake mk, uint32_t flags, outcome *o)
{
    memset(o, 0, sizeof *o);
    one_rank one;
    one_rank_open(&one, flags, 10000);
    mfsdp_runtime *rt = one.rt;
    mfsdp_tensor_view w0;
    assert_int_equal(mfsdp_tensor_view_get(rt, mfsdp_tensor_find(rt, "fc0.weight"), &w0), MFSDP_OK);
    for (int k = 0; k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, k, &v);
        for (int64_t i = 0; i < v.shard_count; i++)   /* the initial weights, before step_begin */
            ((float *)v.main_weight)[i] = 1.0f;
    }
    HOOK(mfsdp_step_begin(rt));
    if (mk == READ_BEFORE)
        o->read = ((float *)w0.weight)[0];
    HOOK(mfsdp_forward_pre(rt, 0, 0));
    HOOK(mfsdp_forward_post(rt, 0, 0));
    if (mk == READ_AFTER)
        o->read = ((float *)w0.weight)[0];
    HOOK(mfsdp_forward_pre(rt, 1, 0));
    HOOK(mfsdp_forward_post(rt, 1, 0));
    HOOK(mfsdp_backward_pre(rt, 1, 0));
    write_grad(rt, 1, mk, 0.0f);
    HOOK(mfsdp_backward_post(rt, 1, 0));
    HOOK(mfsdp_backward_pre(rt, 0, 0));
    write_grad(rt, 0, mk == OTHER_UNIT_GRAD ? NONE : mk, mk == READ_BEFORE ? o->read : 0.0f);
    HOOK(mfsdp_backward_post(rt, 0, 0));
    HOOK(mfsdp_step_end(rt));
    o->delivered_ok = 1;
    for (int k = 0; k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, k, &v);
        for (int64_t i = 0; i < v.shard_count; i++)
            o->delivered_ok &= ((float *)v.grad)[i] == gval(k, v.shard_offset + i);
    }
done:
    one_rank_close(&one);
}

static void expect(mistake mk, const char *a, const char *b)
{
    outcome o;
    run(mk, 0, &o);             /* silent without the check mode */
    assert_int_equal(o.r, MFSDP_OK);
    run(mk, MFSDP_FLAG_CHECK, &o);
    print_message("%s\n", o.msg);
    assert_int_equal(o.r, MFSDP_ERR_INVALID_USAGE);
    if (!strstr(o.msg, a) || !strstr(o.msg, b))
        fail_msg("want \"%s\" and \"%s\" in: %s", a, b, o.msg);
}

static void test_correct_trainer(void **state)
{
    (void)state;
    outcome o;
    run(NONE, MFSDP_FLAG_CHECK, &o);
    assert_int_equal(o.r, MFSDP_OK);
    assert_true(o.delivered_ok);
}

static void test_grad_into_weight(void **state)
{
    (void)state;
    expect(GRAD_INTO_WEIGHT, "mfsdp_backward_post(unit 1 \"fc1\", microbatch 0): weight of tensor "
           "\"fc1.weight\" (unit 1 \"fc1\"), element 0 of 8",
           "wrote into the weight since mfsdp_backward_pre(unit 1");
}

static void test_other_units_grad_local(void **state)
{
    (void)state;
    expect(OTHER_UNIT_GRAD, "mfsdp_backward_pre(unit 0 \"fc0\", microbatch 0): grad_local of tensor "
           "\"fc0.weight\"", "wrote into it outside its window (it was filled with the check "
           "pattern after mfsdp_");
}

static void test_add_into_grad_local(void **state)
{
    (void)state;
    expect(ADD_INTO, "grad_local of tensor \"fc1.weight\" (unit 1 \"fc1\"), element 0 of 8",
           "added into instead of overwritten");
}

static void test_partial_grad_local(void **state)
{
    (void)state;
    expect(PARTIAL, "grad_local of tensor \"fc1.bias\" (unit 1 \"fc1\"), element 1 of 2",
           "was not written this microbatch");
}

static void test_read_weight_outside_window(void **state)
{
    (void)state;
    outcome o;
    run(READ_AFTER, 0, &o);
    assert_true(o.read == 1.0f);        /* without the check mode: a stale value, silently */
    run(READ_AFTER, MFSDP_FLAG_CHECK, &o);
    assert_int_equal(o.r, MFSDP_OK);
    assert_true(isnan(o.read));         /* with it: NaN */
    /* Used in a gradient, the NaN is caught at backward_post. */
    expect(READ_BEFORE, "mfsdp_backward_post(unit 0 \"fc0\", microbatch 0): grad_local of tensor "
           "\"fc0.weight\"", "computed from a buffer read outside its window");
}

static void test_refused_hook_can_be_retried(void **state)
{
    (void)state;
    one_rank one;
    assert_int_equal(setenv("MFSDP_CHECK", "1", 1), 0);   /* the environment, no flag */
    one_rank_open(&one, 0, 0);
    unsetenv("MFSDP_CHECK");
    mfsdp_runtime *rt = one.rt;
    assert_int_equal(mfsdp_step_begin(rt), MFSDP_OK);
    for (int u = 0; u < 2; u++) {
        assert_int_equal(mfsdp_forward_pre(rt, u, 0), MFSDP_OK);
        assert_int_equal(mfsdp_forward_post(rt, u, 0), MFSDP_OK);
    }
    assert_int_equal(mfsdp_backward_pre(rt, 1, 0), MFSDP_OK);
    write_grad(rt, 1, PARTIAL, 0.0f);
    assert_int_equal(mfsdp_backward_post(rt, 1, 0), MFSDP_ERR_INVALID_USAGE);
    assert_non_null(strstr(mfsdp_last_error(rt), "fc1.bias"));
    write_grad(rt, 1, NONE, 0.0f);     /* fixed: the same hook now succeeds */
    assert_int_equal(mfsdp_backward_post(rt, 1, 0), MFSDP_OK);
    assert_int_equal(mfsdp_backward_pre(rt, 0, 0), MFSDP_OK);
    write_grad(rt, 0, NONE, 0.0f);
    assert_int_equal(mfsdp_backward_post(rt, 0, 0), MFSDP_OK);
    assert_int_equal(mfsdp_step_end(rt), MFSDP_OK);
    one_rank_close(&one);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_check_mode tiny_1x1.yaml\n");
        return 2;
    }
    g_path = argv[1];
    unsetenv("MFSDP_CHECK");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_correct_trainer),
        cmocka_unit_test(test_grad_into_weight),
        cmocka_unit_test(test_other_units_grad_local),
        cmocka_unit_test(test_add_into_grad_local),
        cmocka_unit_test(test_partial_grad_local),
        cmocka_unit_test(test_read_weight_outside_window),
        cmocka_unit_test(test_refused_hook_can_be_retried),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
