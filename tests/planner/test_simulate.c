/*
 * The step simulator on hand-built schedules with known answers: two streams
 * overlapping, event edges forcing serialization, exact exposed time, the
 * issue order of hooks and predicates, the latest-record rule, the
 * single-stream comparison, bad schedules, and the trace/SVG writers'
 * well-formedness (a small JSON validator below; XML is checked by a
 * separate CTest with xmllint when present).
 *
 * Durations are taken from mf_cost_op() itself, so the assertions test the
 * scheduling, not the cost formulas (which have their own tests).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_simulate.h"

#define EPS 1e-12

/* ---- building schedules by hand ---- */

typedef struct hs {
    mf_schedule *s;
    int cap;
} hs;

/* A schedule on mesh [outer=O, inner=I] with `units` units of one bucket
 * each; unit u holds one tensor of params[u] elements. */
static hs make(int64_t O, int64_t I, int64_t M, int units, const int64_t *params)
{
    hs h = {mf_schedule_new(), 64};
    assert_non_null(h.s);
    mf_schedule *s = h.s;
    s->source = "hand.yaml";
    s->mesh.naxes = 2;
    s->mesh.axes[0] = (mf_axis){"dp_outer", O};
    s->mesh.axes[1] = (mf_axis){"dp_inner", I};
    s->mesh.world = O * I;
    s->microbatches = M;
    s->nunits = units;
    s->nbuckets = units;
    s->units = mf_arena_array(s->arena, (size_t)units, sizeof *s->units);
    s->buckets = mf_arena_array(s->arena, (size_t)units, sizeof *s->buckets);
    s->ops = mf_arena_array(s->arena, (size_t)h.cap, sizeof *s->ops);
    s->nevents = 8;
    assert_non_null(s->units);
    assert_non_null(s->buckets);
    assert_non_null(s->ops);
    for (int u = 0; u < units; u++) {
        s->units[u].name = mf_arena_printf(s->arena, "u%d", u);
        s->units[u].first_bucket = u;
        s->units[u].nbuckets = 1;
        mf_bucket *b = &s->buckets[u];
        b->name = mf_arena_printf(s->arena, "u%d/b", u);
        b->unit = b->last_unit = u;
        b->ntensors = 1;
        b->tensors = mf_arena_array(s->arena, 1, sizeof *b->tensors);
        assert_non_null(b->tensors);
        b->tensors[0].name = mf_arena_printf(s->arena, "u%d.w", u);
        b->tensors[0].numel = params ? params[u] : 1000;
        b->length = b->used = b->tensors[0].numel;
    }
    return h;
}

static int add(hs *h, mf_phase phase, int unit, mf_when when, mf_stream stream, mf_opkind kind,
               int axis, int64_t count, int event)
{
    mf_schedule *s = h->s;
    assert_true(s->nops < h->cap);
    mf_op *op = &s->ops[s->nops];
    *op = (mf_op){.id = s->nops, .phase = phase, .unit = unit, .when = when, .stream = stream,
                  .kind = kind, .axis = axis, .dtype = MF_BF16, .count = count, .src = -1,
                  .dst = -1, .event = event, .bucket = unit >= 0 ? unit : -1,
                  .transition = event >= 0 ? 0 : 2};
    return s->nops++;
}

static int coll(hs *h, mf_phase phase, int unit, mf_when when, mf_stream stream, mf_opkind kind,
                int axis, int64_t count)
{
    return add(h, phase, unit, when, stream, kind, axis, count, -1);
}

static void rec(hs *h, mf_phase phase, int unit, mf_when when, mf_stream stream, int event)
{
    add(h, phase, unit, when, stream, MF_OP_RECORD, -1, 0, event);
}

static void wait(hs *h, mf_phase phase, int unit, mf_when when, mf_stream stream, int event)
{
    add(h, phase, unit, when, stream, MF_OP_WAIT, -1, 0, event);
}

static double cost(const mf_sim_config *cfg, const mf_schedule *s, mf_opkind k, int axis,
                   int64_t count)
{
    double t = mf_cost_op(&cfg->cost, &s->mesh, k, axis, count, MF_BF16);
    assert_true(t > 0); /* the model must give collectives a duration */
    return t;
}

/* Explicit per-unit compute times (seconds). */
static double fwd_t[8], bwd_t[8];

static void config(mf_sim_config *cfg, const mf_schedule *s, double fwd, double bwd)
{
    mf_sim_config_defaults(cfg, &s->mesh);
    for (int u = 0; u < 8; u++) {
        fwd_t[u] = fwd;
        bwd_t[u] = bwd;
    }
    cfg->fwd_time = fwd_t;
    cfg->bwd_time = bwd_t;
}

static int find_item(const mf_sim_result *r, int op, int m)
{
    for (int i = 0; i < r->nitems; i++)
        if (r->items[i].op == op && r->items[i].microbatch == m)
            return i;
    fail_msg("op %d microbatch %d not executed", op, m);
    return -1;
}

static void assert_close(double a, double b)
{
    double tol = EPS + 1e-9 * (a > b ? a : b);
    if (!(a - b <= tol && b - a <= tol))
        fail_msg("%.12g != %.12g", a, b);
}

/* Exposed communication covers exactly the compute stream's idle time; the
 * critical path is gapless from 0 to the step time. */
static void check_invariants(const mf_sim_result *r)
{
    assert_close(r->exposed[MF_STREAM_INNER] + r->exposed[MF_STREAM_OUTER],
                 r->step_time - r->busy[MF_STREAM_COMPUTE]);
    assert_close(r->exposed[MF_STREAM_COMPUTE], 0);
    double path = 0, spans = 0;
    for (int k = 0; k < MF_STREAM_COUNT; k++) {
        path += r->on_path[k];
        assert_true(r->exposed[k] <= r->busy[k] + 1e-12);
    }
    assert_close(path, r->step_time);
    for (int i = 1; i < r->ncritical; i++)
        assert_close(r->items[r->critical[i - 1]].end, r->items[r->critical[i]].start);
    if (r->ncritical > 0) {
        assert_close(r->items[r->critical[0]].start, 0);
        assert_close(r->items[r->critical[r->ncritical - 1]].end, r->step_time);
    }
    for (int i = 0; i < r->nexposed_spans; i++) {
        const mf_sim_span *sp = &r->exposed_spans[i];
        const mf_sim_item *it = &r->items[sp->item];
        assert_true(sp->t1 > sp->t0);
        assert_true(it->start <= sp->t0 + 1e-15 && sp->t1 <= it->end + 1e-15);
        assert_int_equal(it->stream, sp->stream);
        assert_true(sp->stream != MF_STREAM_COMPUTE);
        if (i > 0)
            assert_true(r->exposed_spans[i - 1].t1 <= sp->t0 + 1e-15);
        spans += sp->t1 - sp->t0;
    }
    assert_close(spans, r->comm_exposed);
}

/* ---- tests ---- */

/* An inner and an outer collective issued together run side by side; the
 * single-stream variant serializes them. */
static void test_two_streams_overlap(void **state)
{
    (void)state;
    hs h = make(2, 4, 1, 1, NULL);
    int a = coll(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_ALL_GATHER, 1, 1 << 20);
    int b = coll(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_OUTER, MF_OP_ALL_GATHER, 0, 1 << 20);
    mf_sim_config cfg;
    config(&cfg, h.s, 0, 0);
    double da = cost(&cfg, h.s, MF_OP_ALL_GATHER, 1, 1 << 20);
    double db = cost(&cfg, h.s, MF_OP_ALL_GATHER, 0, 1 << 20);
    assert_true(db > da); /* outer links are slower by default */

    mf_sim_result r;
    char err[256];
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);
    assert_close(r.items[find_item(&r, a, -1)].start, 0);
    assert_close(r.items[find_item(&r, b, -1)].start, 0);
    assert_close(r.step_time, db);
    assert_close(r.busy[MF_STREAM_INNER], da);
    assert_close(r.busy[MF_STREAM_OUTER], db);
    assert_close(r.exposed[MF_STREAM_OUTER], db); /* nothing to hide behind */
    assert_close(r.exposed[MF_STREAM_INNER], 0);
    assert_close(r.overlap, da / (da + db));
    assert_int_equal(r.bytes[0], mf_schedule_collective_bytes(MF_OP_ALL_GATHER, 2, 1 << 20, MF_BF16));
    assert_int_equal(r.bytes[1], mf_schedule_collective_bytes(MF_OP_ALL_GATHER, 4, 1 << 20, MF_BF16));
    check_invariants(&r);
    mf_sim_result_free(&r);

    cfg.single_stream = true;
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);
    assert_close(r.step_time, da + db);
    assert_close(r.busy[MF_STREAM_OUTER], 0);
    assert_int_equal(r.items[find_item(&r, b, -1)].stream, MF_STREAM_INNER);
    check_invariants(&r);
    mf_sim_result_free(&r);
    mf_schedule_free(h.s);
}

/* A record/wait pair makes the outer op start when the inner one ends. */
static void test_event_edge_serializes(void **state)
{
    (void)state;
    hs h = make(2, 4, 1, 1, NULL);
    int a = coll(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_REDUCE_SCATTER, 1, 4096);
    rec(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_INNER, 3);
    wait(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_OUTER, 3);
    int b = coll(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_OUTER, MF_OP_REDUCE_SCATTER, 0, 1024);
    mf_sim_config cfg;
    config(&cfg, h.s, 0, 0);
    double da = cost(&cfg, h.s, MF_OP_REDUCE_SCATTER, 1, 4096);
    double db = cost(&cfg, h.s, MF_OP_REDUCE_SCATTER, 0, 1024);
    mf_sim_result r;
    char err[256];
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);
    int ib = find_item(&r, b, -1);
    assert_close(r.items[ib].start, da);
    assert_close(r.step_time, da + db);
    assert_close(r.exposed[MF_STREAM_INNER], da);
    assert_close(r.exposed[MF_STREAM_OUTER], db);
    assert_close(r.overlap, 0);
    /* critical path: a then b, through the wait */
    assert_int_equal(r.ncritical, 2);
    assert_int_equal(r.critical[0], find_item(&r, a, -1));
    assert_int_equal(r.critical[1], ib);
    int iw = find_item(&r, 2, -1);
    assert_true(r.items[iw].blocked);
    assert_int_equal(r.items[iw].dep, find_item(&r, 1, -1));
    check_invariants(&r);
    mf_sim_result_free(&r);
    mf_schedule_free(h.s);
}

/*
 * Prefetch as the schedule encodes it: the outer all-gather of unit 1 is
 * issued at unit 0's forward_pre and compute waits for it only at unit 1.
 * Exposed time is exactly max(0, outer - compute of unit 0) (plus the inner
 * gather of unit 0, which nothing hides).
 */
static void run_prefetch(double fwd0, double *step, double *exposed_outer, double *ag_outer,
                         double *ag_inner)
{
    hs h = make(2, 4, 1, 2, NULL);
    /* forward_pre u0: inner AG for u0 (compute waits), outer AG for u1 */
    coll(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, MF_STREAM_INNER, MF_OP_ALL_GATHER, 1, 1 << 16);
    rec(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, MF_STREAM_INNER, 0);
    coll(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, MF_STREAM_OUTER, MF_OP_ALL_GATHER, 0, 1 << 22);
    rec(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, MF_STREAM_OUTER, 1);
    wait(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, MF_STREAM_COMPUTE, 0);
    /* forward_pre u1: compute waits for the outer gather */
    wait(&h, MF_PHASE_FORWARD_PRE, 1, MF_WHEN_FIRST, MF_STREAM_COMPUTE, 1);
    mf_sim_config cfg;
    config(&cfg, h.s, 0, 0);
    fwd_t[0] = fwd0;
    fwd_t[1] = 1e-3;
    *ag_inner = cost(&cfg, h.s, MF_OP_ALL_GATHER, 1, 1 << 16);
    *ag_outer = cost(&cfg, h.s, MF_OP_ALL_GATHER, 0, 1 << 22);
    mf_sim_result r;
    char err[256];
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);
    check_invariants(&r);
    *step = r.step_time;
    *exposed_outer = r.exposed[MF_STREAM_OUTER];
    assert_close(r.exposed[MF_STREAM_INNER], *ag_inner);
    mf_sim_result_free(&r);
    mf_schedule_free(h.s);
}

static void test_exposed_time_exact(void **state)
{
    (void)state;
    double step, exp_outer, ago, agi;
    /* compute of unit 0 longer than the outer gather: fully hidden */
    run_prefetch(1.0, &step, &exp_outer, &ago, &agi);
    assert_true(ago < 1.0);
    assert_close(exp_outer, 0);
    assert_close(step, agi + 1.0 + 1e-3);
    /* compute of unit 0 shorter: exactly the difference is exposed */
    double fwd0 = ago / 4;
    assert_true(agi < fwd0);
    run_prefetch(fwd0, &step, &exp_outer, &ago, &agi);
    assert_close(exp_outer, ago - (agi + fwd0));
    assert_close(step, ago + 1e-3);
}

/* Hooks run forward in unit order, backward in reverse; predicates select
 * microbatches; launches and bytes agree with the schedule's summary. */
static void test_issue_order_and_predicates(void **state)
{
    (void)state;
    int64_t params[3] = {1000, 2000, 3000};
    hs h = make(2, 4, 3, 3, params);
    int f = coll(&h, MF_PHASE_FORWARD_PRE, 1, MF_WHEN_FIRST, MF_STREAM_OUTER, MF_OP_ALL_GATHER, 0, 100);
    int e = coll(&h, MF_PHASE_BACKWARD_POST, 2, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_REDUCE_SCATTER, 1, 100);
    int l = coll(&h, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_LAST, MF_STREAM_OUTER, MF_OP_REDUCE_SCATTER, 0, 100);
    int z = coll(&h, MF_PHASE_STEP_END, -1, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_ALL_REDUCE, 1, 100);
    mf_sim_config cfg;
    mf_sim_config_defaults(&cfg, &h.s->mesh);
    cfg.flops = 1e12;
    cfg.tokens = 100;
    mf_sim_result r;
    char err[256];
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);
    assert_int_equal(r.nitems, 2 * 3 * 3 + 1 + 3 + 1 + 1);
    /* compute segments: for each microbatch fwd u0 u1 u2, bwd u2 u1 u0 */
    int expect_units[6] = {0, 1, 2, 2, 1, 0};
    int k = 0;
    for (int i = 0; i < r.nitems; i++) {
        const mf_sim_item *it = &r.items[i];
        if (it->op >= 0)
            continue;
        assert_int_equal(it->unit, expect_units[k % 6]);
        assert_int_equal(it->microbatch, k / 6);
        assert_int_equal(it->phase, k % 6 < 3 ? MF_PHASE_FORWARD_PRE : MF_PHASE_BACKWARD_PRE);
        /* 6 * params * tokens / flops, split 1:2 */
        double total = 6.0 * (double)params[it->unit] * 100 / 1e12;
        assert_close(it->end - it->start, k % 6 < 3 ? total / 3 : 2 * total / 3);
        k++;
    }
    assert_int_equal(k, 18);
    find_item(&r, f, 0);
    for (int m = 0; m < 3; m++)
        find_item(&r, e, m);
    find_item(&r, l, 2);
    find_item(&r, z, -1);
    /* the step_end op is issued last, the first-only op in microbatch 0 */
    assert_int_equal(find_item(&r, z, -1), r.nitems - 1);
    mf_schedule_summarize(h.s);
    for (int j = 0; j < 2; j++) {
        assert_int_equal(r.bytes[j], h.s->summary.bytes[j]);
        int64_t n = 0;
        for (int kk = 0; kk < MF_OPKIND_COUNT; kk++)
            n += h.s->summary.collectives[kk][j];
        assert_int_equal(r.launches[j], n);
    }
    assert_int_equal(r.unit_params_total, 6000);
    check_invariants(&r);
    mf_sim_result_free(&r);
    mf_schedule_free(h.s);
}

/* A wait binds to the latest record of its event issued before it, not to a
 * later one and not to the first one; a wait with no record does not block. */
static void test_latest_record(void **state)
{
    (void)state;
    hs h = make(2, 4, 1, 1, NULL);
    int a = coll(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_ALL_GATHER, 1, 1 << 18);
    rec(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_INNER, 5);
    wait(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_OUTER, 5);  /* op 2: after a */
    int x = coll(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_OUTER, MF_OP_ALL_REDUCE, 0, 64);
    int b = coll(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_ALL_GATHER, 1, 1 << 20);
    rec(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_INNER, 5);
    wait(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_COMPUTE, 5); /* op 6: after b */
    wait(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_COMPUTE, 6); /* op 7: never recorded */
    rec(&h, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_INNER, 6);
    mf_sim_config cfg;
    config(&cfg, h.s, 0, 0);
    double da = cost(&cfg, h.s, MF_OP_ALL_GATHER, 1, 1 << 18);
    double db = cost(&cfg, h.s, MF_OP_ALL_GATHER, 1, 1 << 20);
    double dx = cost(&cfg, h.s, MF_OP_ALL_REDUCE, 0, 64);
    mf_sim_result r;
    char err[256];
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);
    assert_close(r.items[find_item(&r, x, -1)].start, da);
    assert_close(r.items[find_item(&r, 6, -1)].start, da + db);
    assert_close(r.items[find_item(&r, 7, -1)].start, da + db);
    assert_int_equal(r.items[find_item(&r, 7, -1)].dep, -1);
    assert_int_equal(r.unmatched_waits, 1);
    assert_close(r.step_time, da + db > da + dx ? da + db : da + dx);
    (void)a;
    (void)b;
    check_invariants(&r);
    mf_sim_result_free(&r);
    mf_schedule_free(h.s);
}

/* Compute waits for the gradient reduction of the previous microbatch only
 * through events; without the edge it runs ahead. Checks that the backward
 * hand-off (comm waits for compute) delays the reduce-scatter. */
static void test_backward_handoff(void **state)
{
    (void)state;
    hs h = make(1, 8, 2, 1, NULL);
    h.s->mesh.axes[0].size = 1;
    h.s->mesh.world = 8;
    rec(&h, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_EVERY, MF_STREAM_COMPUTE, 0);
    wait(&h, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_EVERY, MF_STREAM_INNER, 0);
    int rs = coll(&h, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_REDUCE_SCATTER, 1, 1 << 20);
    mf_sim_config cfg;
    config(&cfg, h.s, 1e-3, 2e-3);
    double d = cost(&cfg, h.s, MF_OP_REDUCE_SCATTER, 1, 1 << 20);
    assert_true(d < 3e-3);
    mf_sim_result r;
    char err[256];
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);
    assert_close(r.items[find_item(&r, rs, 0)].start, 3e-3);
    assert_close(r.items[find_item(&r, rs, 1)].start, 6e-3);
    assert_close(r.step_time, 6e-3 + d);
    assert_close(r.exposed[MF_STREAM_INNER], d);  /* only the last one is exposed */
    assert_close(r.busy[MF_STREAM_INNER], 2 * d);
    assert_close(r.overlap, 0.5);
    check_invariants(&r);
    mf_sim_result_free(&r);
    mf_schedule_free(h.s);
}

/* Host-synchronous: an op issued at forward_pre(u1) cannot start before the
 * compute of u0 is done (the hook is called then); with a run-ahead host it
 * starts at 0. This is how the schedule's prefetch distance takes effect. */
static void test_host_sync_issue_time(void **state)
{
    (void)state;
    hs h = make(2, 4, 1, 3, NULL);
    int g = coll(&h, MF_PHASE_FORWARD_PRE, 1, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_ALL_GATHER, 1, 1 << 16);
    rec(&h, MF_PHASE_FORWARD_PRE, 1, MF_WHEN_EVERY, MF_STREAM_INNER, 0);
    wait(&h, MF_PHASE_FORWARD_PRE, 2, MF_WHEN_EVERY, MF_STREAM_COMPUTE, 0);
    mf_sim_config cfg;
    config(&cfg, h.s, 1e-6, 2e-6);
    double d = cost(&cfg, h.s, MF_OP_ALL_GATHER, 1, 1 << 16);
    assert_true(d > 1e-6);
    mf_sim_result r;
    char err[256];
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);
    int ig = find_item(&r, g, 0);
    assert_close(r.items[ig].start, 1e-6);           /* after fwd u0 */
    assert_true(r.items[ig].host_gated);
    assert_close(r.step_time, 1e-6 + d + 1e-6 + 3 * 2e-6);
    assert_close(r.exposed[MF_STREAM_INNER], d - 1e-6); /* fwd u1 hides 1 us of it */
    check_invariants(&r);
    mf_sim_result_free(&r);

    cfg.host_async = true;
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);
    assert_close(r.items[find_item(&r, g, 0)].start, 0);
    assert_close(r.exposed[MF_STREAM_INNER], d - 2e-6);
    check_invariants(&r);
    mf_sim_result_free(&r);
    mf_schedule_free(h.s);
}

static void test_bad_schedule(void **state)
{
    (void)state;
    hs h = make(2, 4, 1, 1, NULL);
    coll(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_ALL_GATHER, 7, 10);
    mf_sim_config cfg;
    config(&cfg, h.s, 0, 0);
    mf_sim_result r;
    char err[256] = "";
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "op 0"));
    assert_non_null(strstr(err, "axis 7"));
    assert_null(r.items);
    h.s->ops[0].axis = 1;
    h.s->ops[0].unit = 3;
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "unit 3"));
    h.s->ops[0].unit = 0;
    h.s->ops[0].kind = MF_OP_WAIT;
    h.s->ops[0].event = 99;
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "event 99"));
    mf_schedule_free(h.s);
}

/* ---- a tiny JSON validator (RFC 8259 grammar, no semantics) ---- */

typedef struct jp {
    const char *p, *end;
    int depth;
} jp;

static void jws(jp *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r'))
        j->p++;
}

static bool jvalue(jp *j);

static bool jstring(jp *j)
{
    if (j->p >= j->end || *j->p != '"')
        return false;
    for (j->p++; j->p < j->end; j->p++) {
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            return true;
        }
        if (c < 0x20)
            return false;
        if (c == '\\') {
            j->p++;
            if (j->p >= j->end || !strchr("\"\\/bfnrtu", *j->p))
                return false;
            if (*j->p == 'u') {
                for (int k = 0; k < 4; k++)
                    if (++j->p >= j->end || !strchr("0123456789abcdefABCDEF", *j->p))
                        return false;
            }
        }
    }
    return false;
}

static bool jnumber(jp *j)
{
    const char *s = j->p;
    if (j->p < j->end && *j->p == '-')
        j->p++;
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return false;
    if (*j->p == '0')
        j->p++;
    else
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return false;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9')
            return false;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            j->p++;
    }
    return j->p > s;
}

static bool jlit(jp *j, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || strncmp(j->p, w, n) != 0)
        return false;
    j->p += n;
    return true;
}

static bool jvalue(jp *j)
{
    jws(j);
    if (j->p >= j->end || ++j->depth > 64)
        return false;
    bool ok;
    char c = *j->p;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        jws(j);
        if (j->p < j->end && *j->p == close) {
            j->p++;
            ok = true;
        } else {
            ok = false;
            for (;;) {
                jws(j);
                if (c == '{') {
                    if (!jstring(j))
                        break;
                    jws(j);
                    if (j->p >= j->end || *j->p++ != ':')
                        break;
                }
                if (!jvalue(j))
                    break;
                jws(j);
                if (j->p < j->end && *j->p == ',') {
                    j->p++;
                    continue;
                }
                if (j->p < j->end && *j->p == close) {
                    j->p++;
                    ok = true;
                }
                break;
            }
        }
    } else if (c == '"')
        ok = jstring(j);
    else if (c == 't')
        ok = jlit(j, "true");
    else if (c == 'f')
        ok = jlit(j, "false");
    else if (c == 'n')
        ok = jlit(j, "null");
    else
        ok = jnumber(j);
    j->depth--;
    return ok;
}

static bool json_valid(const char *text, size_t len)
{
    jp j = {text, text + len, 0};
    if (!jvalue(&j))
        return false;
    jws(&j);
    return j.p == j.end;
}

static size_t count_substr(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void test_json_validator_rejects(void **state)
{
    (void)state;
    const char *good = "{\"a\":[1,2.5e-3,-0,true,null,\"x\\u00e9\"],\"b\":{}}";
    assert_true(json_valid(good, strlen(good)));
    const char *bad[] = {"{\"a\":1,}", "[1 2]", "{\"a\" 1}", "[01]", "\"\\x\"", "[nan]", "{} {}", "[1.]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (json_valid(bad[i], strlen(bad[i])))
            fail_msg("accepted %s", bad[i]);
}

/* The trace of a schedule with awkward names is valid JSON with one slice
 * per item and one flow pair per cross-stream wait. */
static void test_trace_and_svg_output(void **state)
{
    (void)state;
    hs h = make(2, 4, 2, 2, NULL);
    h.s->units[1].name = "la\"yer\\1<&>";
    h.s->buckets[1].name = "b\"\n1";
    coll(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, MF_STREAM_OUTER, MF_OP_ALL_GATHER, 0, 4096);
    rec(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, MF_STREAM_OUTER, 0);
    wait(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_EVERY, MF_STREAM_INNER, 0);
    coll(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_ALL_GATHER, 1, 4096);
    rec(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_EVERY, MF_STREAM_INNER, 1);
    wait(&h, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_EVERY, MF_STREAM_COMPUTE, 1);
    coll(&h, MF_PHASE_BACKWARD_POST, 1, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_REDUCE_SCATTER, 1, 4096);
    add(&h, MF_PHASE_BACKWARD_POST, 1, MF_WHEN_EVERY, MF_STREAM_INNER, MF_OP_ACCUMULATE, -1, 1024, -1);
    mf_sim_config cfg;
    config(&cfg, h.s, 1e-4, 2e-4);
    mf_sim_result r;
    char err[256];
    assert_int_equal(mf_simulate(h.s, &cfg, &r, err, sizeof err), 0);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(mf_trace_write(f, h.s, &r), 0);
    fclose(f);
    assert_true(json_valid(buf, len));
    assert_int_equal(count_substr(buf, "\"ph\":\"X\""), (size_t)r.nitems);
    size_t cross = 0;
    for (int i = 0; i < r.nitems; i++)
        if (r.items[i].dep >= 0 && r.items[i].stream != r.items[r.items[i].dep].stream)
            cross++;
    assert_int_equal(cross, 2 + 2); /* outer->inner once per microbatch... m1 waits for m0's record */
    assert_int_equal(count_substr(buf, "\"ph\":\"s\""), cross);
    assert_int_equal(count_substr(buf, "\"ph\":\"f\""), cross);
    assert_non_null(strstr(buf, "la\\\"yer\\\\1<&>"));
    free(buf);

    buf = NULL;
    f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(mf_svg_write(f, h.s, &r, 0, 0), 0);
    fclose(f);
    assert_non_null(strstr(buf, "<svg"));
    assert_non_null(strstr(buf, "</svg>\n"));
    assert_null(strstr(buf, "la\"yer")); /* escaped */
    assert_non_null(strstr(buf, "la&quot;yer\\1&lt;&amp;&gt;"));
    assert_non_null(strstr(buf, "microbatch 1"));
    free(buf);
    mf_sim_result_free(&r);
    mf_schedule_free(h.s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_streams_overlap),
        cmocka_unit_test(test_event_edge_serializes),
        cmocka_unit_test(test_exposed_time_exact),
        cmocka_unit_test(test_issue_order_and_predicates),
        cmocka_unit_test(test_latest_record),
        cmocka_unit_test(test_backward_handoff),
        cmocka_unit_test(test_host_sync_issue_time),
        cmocka_unit_test(test_bad_schedule),
        cmocka_unit_test(test_json_validator_rejects),
        cmocka_unit_test(test_trace_and_svg_output),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
