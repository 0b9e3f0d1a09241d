/*
 * test_stress: the stress mode (MFSDP_STRESS_SEED, runtime/engine/mf_stress.c) over
 * every mode of the builder on two meshes and over the compiled example
 * schedules: with every stream thread delayed at random before each op, the
 * oracle still verifies every step and the master weights after the run are
 * bit-identical to the synchronous mode's, on every rank. And the other way
 * round: the zero3 example with one of the waits the buffer assignment added
 * for grad_local's reuse removed fails the oracle in stress mode.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_passes.h"
#include "mf_pipeline.h"
#include "rt_testlib.h"

#ifndef MFSDP_SOURCE_DIR
#error "MFSDP_SOURCE_DIR must be defined"
#endif

/* Runs the oracle; fills digests[world]; returns rc. */
static int run(const mfsdp_schedule *sh, uint32_t flags, const char *seed, uint64_t *digests, char *msg,
               size_t len)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    mf_check_outcome *outs = calloc((size_t)world, sizeof *outs);
    assert_non_null(outs);
    if (seed)
        setenv("MFSDP_STRESS_SEED", seed, 1);
    else
        unsetenv("MFSDP_STRESS_SEED");
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.timeout_ms = 120000;
    cfg.flags = flags;
    mf_check_opts o = {.steps = 2, .stop_rank = -1, .stop_step = -1, .out = NULL};
    int rc = mf_check_local(sh, NULL, &cfg, &o, outs);
    unsetenv("MFSDP_STRESS_SEED");
    snprintf(msg, len, "%s", outs[0].msg);
    for (int64_t r = 0; r < world; r++)
        digests[r] = outs[r].digest;
    free(outs);
    return rc;
}

static void same_as_sync(const char *what, const mfsdp_schedule *sh, const char *seed)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    uint64_t *a = calloc((size_t)world, sizeof *a), *b = calloc((size_t)world, sizeof *b);
    char msg[1024];
    if (run(sh, MFSDP_FLAG_SYNCHRONOUS, NULL, a, msg, sizeof msg) != 0)
        fail_msg("%s synchronous: %s", what, msg);
    if (run(sh, 0, seed, b, msg, sizeof msg) != 0)
        fail_msg("%s stress (seed %s): %s", what, seed, msg);
    for (int64_t r = 0; r < world; r++)
        if (a[r] != b[r])
            fail_msg("%s: rank %lld's master weights differ between the synchronous and the stress run "
                     "(seed %s)", what, (long long)r, seed);
    free(a);
    free(b);
}

static void test_builder_modes(void **state)
{
    (void)state;
    const rt_mesh meshes[] = {{"2x2", 2, {2, 2}}, {"1x4", 2, {1, 4}}};
    for (int i = 0; i < mf_tb_nmodes; i++)
        for (size_t m = 0; m < sizeof meshes / sizeof meshes[0]; m++) {
            mf_tb_spec spec;
            rt_model_spec(&spec, mf_tb_modes[i], &meshes[m], 3, MF_REDUCE_AVG);
            mfsdp_schedule *sh = rt_build(&spec);
            char what[128];
            snprintf(what, sizeof what, "%s on %s, M = 3", mf_tb_modes[i], meshes[m].name);
            same_as_sync(what, sh, "7");
            mfsdp_schedule_free(sh);
        }
}

static void test_examples(void **state)
{
    (void)state;
    const char *names[] = {"ddp", "fsdp2d", "hfsdp", "hsdp", "hsdp_nosync", "mesh3d_hfsdp",
                           "zero1", "zero2", "zero2_inner_zero1_outer", "zero3"};
    const char *seeds[] = {"1", "42"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/schedules/%s.yaml", MFSDP_SOURCE_DIR, names[i]);
        mfsdp_schedule *sh = NULL;
        if (mfsdp_schedule_load(path, &sh) != MFSDP_OK)
            fail_msg("%s: %s", path, mfsdp_last_error(NULL));
        for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++)
            same_as_sync(names[i], sh, seeds[k]);
        mfsdp_schedule_free(sh);
    }
}

static mf_schedule *compile_to(const char *text, mf_stage stage, bool lower)
{
    mf_compile_options opt = {.stop_after = stage, .verify = stage >= MF_STAGE_VERIFY, .diag_out = stderr};
    mf_compilation c;
    if (mf_pipeline_compile_buffer("zero3.mfsdp", text, strlen(text), &opt, &c) != 0)
        fail_msg("zero3.mfsdp does not compile");
    if (lower) {
        mf_diag d;
        mf_diag_init(&d, &c.src, stderr);
        assert_true(mf_lower_run(c.plan, &d));
        mf_diag_finish(&d);
    }
    mf_schedule *s = c.plan->sched;
    c.plan->sched = NULL;
    mf_compilation_free(&c);
    return s;
}

static bool same_op(const mf_op *a, const mf_op *b)
{
    return a->phase == b->phase && a->unit == b->unit && a->when == b->when && a->stream == b->stream &&
           a->kind == b->kind && a->src == b->src && a->dst == b->dst && a->event == b->event;
}

static void test_missing_reuse_wait_fails(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/schedules/zero3.mfsdp", MFSDP_SOURCE_DIR);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    mf_schedule *orig = compile_to(text, MF_STAGE_TRANSITIONS, true);
    mf_schedule *s = compile_to(text, MF_STAGE_VERIFY, false);
    /* the first compute wait the assignment added (grad_local's reuse) */
    int i = 0, drop = -1;
    for (int j = 0; j < s->nops && drop < 0; j++) {
        if (i < orig->nops && same_op(&s->ops[j], &orig->ops[i])) {
            i++;
            continue;
        }
        if (s->ops[j].kind == MF_OP_WAIT && s->ops[j].stream == MF_STREAM_COMPUTE &&
            s->ops[j].phase == MF_PHASE_BACKWARD_PRE)
            drop = j;
    }
    mf_schedule_free(orig);
    assert_true(drop >= 0);
    for (int j = drop; j + 1 < s->nops; j++) {
        s->ops[j] = s->ops[j + 1];
        s->ops[j].id = j;
    }
    s->nops--;
    mfsdp_schedule *sh = NULL;
    char err[256];
    assert_int_equal(mf_rt_schedule_wrap(s, &sh, err, sizeof err), MFSDP_OK);
    int64_t world = mfsdp_schedule_world_size(sh);
    uint64_t *d = calloc((size_t)world, sizeof *d);
    char msg[1024];
    int rc = run(sh, 0, "1", d, msg, sizeof msg);
    if (rc != 1 || !strstr(msg, "delivered gradient expected"))
        fail_msg("zero3 without the reuse wait op %d in stress mode: rc %d: %s", drop, rc, msg);
    free(d);
    mfsdp_schedule_free(sh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder_modes),
        cmocka_unit_test(test_examples),
        cmocka_unit_test(test_missing_reuse_wait_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
