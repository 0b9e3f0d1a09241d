/*
 * planner/plan/mf_plan_tbound.c: the step-time bound from the planned buckets
 * (docs/plan.md §3, "The planned time bound").
 *
 *   - By hand, one unit in one bucket, one microbatch, host-synchronous
 *     issue: nothing can overlap, so the bound is the serial sum
 *         T1 + T2 + fwd + (T2 again when the weight is resharded after
 *         forward) + bwd + T3 + T4
 *     (T_i: the seconds of the bucket's transition i, fwd/bwd: the unit's
 *     compute, as the transition pass and the search model them), times the
 *     module's documented safety factor 1 - 1e-9. On 1 axis (zero3, which
 *     re-gathers; ddp, which does not) and on 2 axes (hsdp, hfsdp). This is
 *     also the simulated step time: the bound is tight there.
 *   - By hand, two units in two buckets, one microbatch, on one axis (every
 *     step on the one communication stream), zero2 (no T2: the weight stays
 *     replicated), compute shorter than the transfers: both T1s are issued
 *     at step_begin and queue, so the forward ends at
 *         f = max(T1(0) + fwd(0), T1(0) + T1(1)) + fwd(1),
 *     backward(1) at e1 = f + bwd(1), backward(0) at e0 = e1 + bwd(0), and
 *     the stream then runs bucket 1's T3 and T4, then bucket 0's:
 *         max(e0 + T34(0), e1 + T34(1) + T34(0))
 *     (times the factor), again equal to the simulated step time.
 *   - Tight over two microbatches (ddp then zero2 on 1 axis, ddp then
 *     zero1 on 2 axes): the bound equals the simulated step time.
 *   - Not tight: hfsdp3 and zero2 on 3 axes, two microbatches, prefetch 2:
 *     the bound drops the waits that connect one stream's ops to the
 *     other's, and sits strictly below the simulated step time (11 % when
 *     written), above the compute alone.
 *   - The property the search relies on: on every candidate (every built-in
 *     layout that fits, reshard on and off, prefetch 1..3, the bucket ladder)
 *     of `layout auto` specs on a 1-, 2- and 3-axis mesh, the bound is at
 *     most the simulated step time of the schedule the search then builds.
 *     (The cases above also check that the bound the search records for a
 *     candidate is the module's.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mf_pipeline.h"
#include "mf_plan_search.h"

static const double SAFETY = 1 - 1e-9; /* mf_plan_tbound.c scales its bound by it */

/* One spec compiled up to its transitions, and the search over it. */
typedef struct tb_case {
    mf_compilation c;
    mf_plan_search ps;
} tb_case;

/* unit_time: each unit's forward seconds (backward twice that). */
static void open_case(tb_case *k, const char *text, double unit_time)
{
    mf_compile_options copt = {.stop_after = MF_STAGE_TRANSITIONS};
    int rc = mf_pipeline_compile_buffer("tbound.mfsdp", text, strlen(text), &copt, &k->c);
    if (rc != 0)
        fail_msg("spec does not compile:\n%s", text);
    mf_ps_options opt = {0};
    mf_sim_config_defaults(&opt.sim, &k->c.spec->mesh);
    opt.sim.unit_time = unit_time;
    assert_int_equal(mf_plan_search_init(&k->ps, k->c.spec, k->c.ast, &opt), 0);
    assert_non_null(k->c.plan);
    assert_non_null(k->c.plan->trans);
}

static void close_case(tb_case *k)
{
    mf_plan_search_free(&k->ps);
    mf_compilation_free(&k->c);
}

static double tr(const tb_case *k, int b, int t)
{
    const mf_transition *x = &k->c.plan->trans[b][t];
    return x->nsteps > 0 ? x->cost : 0;
}

/* The module's bound for the compiled plan at prefetch pf. */
static double bound_of(const tb_case *k, int pf)
{
    double out = -1;
    assert_int_equal(mf_plan_search_planned_time_bounds(&k->ps, k->c.plan, &pf, 1, &out), 0);
    return out;
}

/* The one candidate of a spec that fixes everything: its simulated step
 * time, and in *lb the bound the search recorded for it (checked to be the
 * module's for the spec's prefetch). */
static double evaluated_step(tb_case *k, double *lb)
{
    assert_int_equal((int)k->ps.ncandidates, 1);
    int ch[4] = {0}; /* the one choice of every group */
    assert_true(k->ps.ngroups <= 4);
    mf_ps_point pt = {.choice = ch};
    assert_int_equal(mf_plan_search_evaluate(&k->ps, k->ps.prefetch[0], k->ps.bucket[0], ch, &pt), 0);
    *lb = pt.lb_planned_time;
    if (*lb != bound_of(k, k->ps.prefetch[0]))
        fail_msg("the search recorded %.12g, the module returns %.12g", *lb, bound_of(k, k->ps.prefetch[0]));
    return pt.step_time;
}

static void assert_close(double got, double want, const char *what)
{
    double tol = 1e-12 + 1e-12 * (want < 0 ? -want : want);
    if (got - want > tol || want - got > tol)
        fail_msg("%s: %.12g, expected %.12g", what, got, want);
}

/* want: the hand-computed step time; the bound is it times the factor, and
 * so is the simulation (tight). Closes the case. */
static void assert_tight(tb_case *k, double want)
{
    double lb, step = evaluated_step(k, &lb);
    assert_close(lb, want * SAFETY, "the bound");
    assert_close(step, want, "the simulated step time (tight)");
    close_case(k);
}

static void one_unit(const char *mesh, const char *layout, bool reshard_regathers)
{
    char text[512];
    snprintf(text, sizeof text,
             "%s\nmicrobatches 1;\nprefetch 1;\nbucket_size 64MiB;\n"
             "unit \"u\" layout %s {\n  tensor \"w\" [512, 384];\n  tensor \"b\" [384];\n}\n",
             mesh, layout);
    tb_case k;
    open_case(&k, text, 2e-4);
    assert_int_equal(k.c.plan->sched->nbuckets, 1);
    assert_int_equal(k.c.plan->sched->nunits, 1);
    bool regather = k.c.plan->sched->units[0].reshard_after_forward && tr(&k, 0, MF_T2) > 0;
    assert_true(regather == reshard_regathers);
    double want = tr(&k, 0, MF_T1) + tr(&k, 0, MF_T2) + k.ps.fwd[0] + (regather ? tr(&k, 0, MF_T2) : 0) +
                  k.ps.bwd[0] + tr(&k, 0, MF_T3) + tr(&k, 0, MF_T4);
    assert_true(tr(&k, 0, MF_T3) > 0); /* the case moves data: the sum is not compute alone */
    for (int pf = 1; pf <= 3; pf++)
        assert_close(bound_of(&k, pf), want * SAFETY, layout);
    assert_tight(&k, want);
}

static void test_one_unit_one_axis(void **state)
{
    (void)state;
    one_unit("mesh gpu = 4;", "zero3", true);
    one_unit("mesh gpu = 4;", "ddp", false);
}

static void test_one_unit_two_axes(void **state)
{
    (void)state;
    one_unit("mesh node = 2, gpu = 4;", "hsdp", true);
    one_unit("mesh node = 2, gpu = 4;", "hfsdp", true);
}

static const char two_units[] = "unit \"u0\" layout %s {\n  tensor \"w\" [512, 384];\n}\n"
                                "unit \"u1\" layout %s {\n  tensor \"w\" [256, 384];\n}\n";

/* Opens the two units above in layouts l0 and l1 under head (mesh and
 * settings), one bucket each. */
static void open_two_units(tb_case *k, const char *head, const char *l0, const char *l1, double unit_time)
{
    char text[512];
    int o = snprintf(text, sizeof text, "%s\nbucket_size 1KiB;\n", head);
    snprintf(text + o, sizeof text - (size_t)o, two_units, l0, l1);
    open_case(k, text, unit_time);
    assert_int_equal(k->c.plan->sched->nbuckets, 2);
}

static void test_two_buckets_one_stream(void **state)
{
    (void)state;
    tb_case k;
    /* compute shorter than the transfers: they queue */
    open_two_units(&k, "mesh gpu = 4;\nmicrobatches 1;\nprefetch 1;", "zero2", "zero2", 1e-6);
    const mf_schedule *s = k.c.plan->sched;
    int b0 = s->buckets[0].unit == 0 ? 0 : 1, b1 = 1 - b0;
    assert_int_equal(s->buckets[b1].unit, 1);
    assert_true(tr(&k, b0, MF_T2) == 0 && tr(&k, b1, MF_T2) == 0);
    assert_true(tr(&k, b0, MF_T1) > 0 && tr(&k, b1, MF_T1) > 0);
    double t34_0 = tr(&k, b0, MF_T3) + tr(&k, b0, MF_T4), t34_1 = tr(&k, b1, MF_T3) + tr(&k, b1, MF_T4);
    /* both T1s are issued at step_begin (prefetch 1), bucket 1's queued
       behind bucket 0's on the stream; forward(0) waits for the first,
       forward(1) for the second */
    double t1_0 = tr(&k, b0, MF_T1), t1_1 = t1_0 + tr(&k, b1, MF_T1);
    double fwd_end = (t1_0 + k.ps.fwd[0] > t1_1 ? t1_0 + k.ps.fwd[0] : t1_1) + k.ps.fwd[1];
    double e1 = fwd_end + k.ps.bwd[1], e0 = e1 + k.ps.bwd[0];
    double a = e0 + t34_0, b = e1 + t34_1 + t34_0;
    double want = a > b ? a : b;
    assert_close(bound_of(&k, 1), want * SAFETY, "two buckets on one stream");
    assert_tight(&k, want);
}

static void test_not_tight(void **state)
{
    (void)state;
    tb_case k;
    open_two_units(&k, "mesh node = 2, socket = 2, gpu = 2;\nmicrobatches 2;\nprefetch 2;", "hfsdp3", "zero2", 1e-6);
    double lb, step = evaluated_step(&k, &lb);
    /* at least the compute of both microbatches, below the simulation */
    double compute = 2 * (k.ps.fwd[0] + k.ps.fwd[1] + k.ps.bwd[0] + k.ps.bwd[1]);
    if (!(lb > compute && lb < step * (1 - 1e-3)))
        fail_msg("bound %.12g, compute %.12g, simulated %.12g", lb, compute, step);
    close_case(&k);
}

/* Two microbatches where the simulator's waits are the ones the bound
 * keeps: the bound is the simulated step time (the factor aside). */
static void tight_two_microbatches(const char *mesh, const char *l0, const char *l1)
{
    char head[128];
    snprintf(head, sizeof head, "%s\nmicrobatches 2;\nprefetch 1;", mesh);
    tb_case k;
    open_two_units(&k, head, l0, l1, 0); /* compute from the default FLOP rate */
    double lb, step = evaluated_step(&k, &lb);
    assert_close(lb, step * SAFETY, l1);
    close_case(&k);
}

static void test_tight_two_microbatches(void **state)
{
    (void)state;
    tight_two_microbatches("mesh gpu = 8;", "ddp", "zero2");
    tight_two_microbatches("mesh node = 2, gpu = 4;", "ddp", "zero1");
}

/* Every candidate of a `layout auto` spec on the mesh: 0 < bound <=
 * simulated step time. */
static void never_above(const char *mesh)
{
    char text[512];
    int o = snprintf(text, sizeof text, "%s\nmicrobatches 2;\n", mesh);
    snprintf(text + o, sizeof text - (size_t)o, two_units, "auto", "auto");
    mf_compilation c;
    mf_compile_options copt = {.stop_after = MF_STAGE_SEMA};
    assert_int_equal(mf_pipeline_compile_buffer("tbound.mfsdp", text, strlen(text), &copt, &c), 0);
    mf_ps_options opt = {0};
    mf_sim_config_defaults(&opt.sim, &c.spec->mesh);
    mf_plan_search ps;
    assert_int_equal(mf_plan_search_init(&ps, c.spec, c.ast, &opt), 0);
    assert_true(ps.ngroups == 2 && ps.groups[0].nchoices >= 2);
    int ch[2];
    int64_t checked = 0;
    for (int64_t i = 0; i < ps.ncandidates; i++) {
        int64_t idx = i;
        for (int g = 1; g >= 0; g--) {
            ch[g] = (int)(idx % ps.groups[g].nchoices);
            idx /= ps.groups[g].nchoices;
        }
        int64_t bk = ps.bucket[idx % ps.nbucket];
        int pf = ps.prefetch[idx / ps.nbucket];
        mf_ps_point pt = {.choice = ch};
        assert_int_equal(mf_plan_search_evaluate(&ps, pf, bk, ch, &pt), 0);
        if (!(pt.lb_planned_time > 0 && pt.lb_planned_time <= pt.step_time))
            fail_msg("%s candidate %lld (%s, %s, prefetch %d, bucket %lld): bound %.12g, simulated %.12g", mesh,
                     (long long)i, mf_plan_search_layout_name(&ps, 0, ch[0]), mf_plan_search_layout_name(&ps, 1, ch[1]),
                     pf, (long long)bk, pt.lb_planned_time, pt.step_time);
        checked++;
    }
    assert_true(checked >= 12);
    mf_plan_search_free(&ps);
    mf_compilation_free(&c);
}

static void test_never_above_simulation(void **state)
{
    (void)state;
    never_above("mesh gpu = 8;");
    never_above("mesh node = 2, gpu = 4;");
    never_above("mesh node = 2, socket = 2, gpu = 2;");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_unit_one_axis),
        cmocka_unit_test(test_one_unit_two_axes),
        cmocka_unit_test(test_two_buckets_one_stream),
        cmocka_unit_test(test_tight_two_microbatches),
        cmocka_unit_test(test_not_tight),
        cmocka_unit_test(test_never_above_simulation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
