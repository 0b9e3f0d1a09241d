/*
 * Lowering: the collective counts of docs/semantics.md §4.5 for every mode (meshes with
 * even and odd sizes, M = 1, 2, 3, prefetch 1 and 2), streams, prefetch hook
 * placement, the overlap rules of docs/semantics.md §5, compute-stream edges, reshard false,
 * merged buckets, lifetimes; every schedule also verifies and round-trips.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sched_test.h"

enum { AG, RS, AR };
static const int kinds[] = {MF_OP_ALL_GATHER, MF_OP_REDUCE_SCATTER, MF_OP_ALL_REDUCE};

/* Expected launches per step: c[kind][axis from the inside: 0 inner, 1 outer]
 * = per_u * U + per_um * U * M. */
typedef struct coef {
    int per_u, per_um;
} coef;

typedef struct mode {
    const char *name;
    bool two_d;
    const char *w, *g, *o;
    coef c[3][2];
} mode;

static const mode modes[] = {
    {"ddp", false, "R", "P", "R", {[AR] = {{1, 0}}}},
    {"zero1", false, "R", "P", "F", {[AG] = {{1, 0}}, [RS] = {{1, 0}}}},
    {"zero2", false, "R", "F", "F", {[AG] = {{1, 0}}, [RS] = {{0, 1}}}},
    {"zero3", false, "F", "F", "F", {[AG] = {{0, 2}}, [RS] = {{0, 1}}}},
    {"hsdp", true, "RF", "PF", "RF", {[AG] = {{0, 2}}, [RS] = {{0, 1}}, [AR] = {{0, 0}, {1, 0}}}},
    {"hfsdp", true, "RF", "PF", "FF", {[AG] = {{0, 2}, {1, 0}}, [RS] = {{0, 1}, {1, 0}}}},
    {"hsdp_nosync", true, "RF", "PP", "RF", {[AG] = {{0, 2}}, [RS] = {{1, 0}}, [AR] = {{0, 0}, {1, 0}}}},
    {"fsdp2d", true, "FF", "FF", "FF", {[AG] = {{0, 2}, {0, 2}}, [RS] = {{0, 1}, {0, 1}}}},
    {"zero2_inner_zero1_outer", true, "RR", "PF", "FF", {[AG] = {{1, 0}, {1, 0}}, [RS] = {{0, 1}, {1, 0}}}},
};

static mf_schedule *compile_or_fail(const char *text)
{
    char *diag = NULL;
    mf_schedule *s = st_compile("t.mfsdp", text, true, &diag);
    if (!s)
        fail_msg("compile failed:\n%s\n--- spec:\n%s", diag ? diag : "", text);
    free(diag);
    return s;
}

static void check_roundtrip(const mf_schedule *s)
{
    size_t len = 0, len2 = 0;
    char *y = st_emit(s, &len);
    assert_non_null(y);
    char err[1024];
    mf_schedule *back = mf_load_schedule_buffer("t.yaml", y, len, err, sizeof err);
    if (!back)
        fail_msg("reload failed: %s", err);
    char *y2 = st_emit(back, &len2);
    assert_non_null(y2);
    assert_int_equal(len, len2);
    assert_memory_equal(y, y2, len);
    char *diag = NULL;
    if (st_verify(back, &diag) != 0)
        fail_msg("the loaded schedule does not verify:\n%s", diag);
    free(diag);
    free(y);
    free(y2);
    mf_schedule_free(back);
}

/* Properties every lowered schedule has. */
static void check_shape(const mf_schedule *s)
{
    int k = s->mesh.naxes, U = s->nunits;
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        assert_int_equal(op->id, i);
        if (mf_opkind_is_collective(op->kind))
            assert_int_equal(op->stream, op->axis == k - 1 ? MF_STREAM_INNER : MF_STREAM_OUTER);
        if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
            continue;
        if (!mf_op_in_step(op)) { /* the programs: test_programs_shape */
            assert_true(op->when == MF_WHEN_SHORT ? op->phase == MF_PHASE_STEP_END && op->transition == 4
                                                  : op->phase == MF_PHASE_EVAL_PRE && op->transition <= 2);
            continue;
        }
        const mf_bucket *bk = &s->buckets[op->bucket];
        /* prefetch: forward gathers at forward_pre(unit - prefetch), backward
         * re-gathers at backward_pre(last_unit + prefetch), clamped */
        if (op->transition <= 2 && op->phase == MF_PHASE_FORWARD_PRE) {
            int want = bk->unit - s->prefetch;
            assert_int_equal(op->unit, want < 0 ? 0 : want);
        }
        if (op->transition == 2 && op->phase == MF_PHASE_BACKWARD_PRE) {
            int want = bk->last_unit + s->prefetch;
            assert_int_equal(op->unit, want > U - 1 ? U - 1 : want);
            assert_true(s->units[bk->unit].reshard_after_forward);
        }
        if (op->transition >= 3) {
            assert_int_equal(op->phase, MF_PHASE_BACKWARD_POST);
            assert_int_equal(op->unit, bk->unit);
        }
        /* predicates */
        if (op->transition == 1)
            assert_int_equal(op->when, MF_WHEN_FIRST);
        if (op->transition == 2 || op->transition == 3)
            assert_int_equal(op->when, MF_WHEN_EVERY);
        if (op->transition == 4)
            assert_int_equal(op->when, MF_WHEN_LAST);
        /* one op per bucket, transition, kind, axis and phase: never per tensor */
        for (int j = i + 1; j < s->nops; j++) {
            const mf_op *o2 = &s->ops[j];
            assert_false(o2->bucket == op->bucket && o2->transition == op->transition && o2->kind == op->kind &&
                         o2->axis == op->axis && o2->phase == op->phase);
        }
    }
}

static void test_mode_counts(void **state)
{
    (void)state;
    static const char *meshes2[] = {"dp_outer = 2, dp_inner = 4", "dp_outer = 3, dp_inner = 2"};
    static const char *meshes1[] = {"dp = 4", "dp = 3"};
    const int U = 3;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        const mode *md = &modes[mi];
        for (int mesh = 0; mesh < 2; mesh++)
            for (int M = 1; M <= 3; M++)
                for (int pf = 1; pf <= 2; pf++) {
                    char extra[32];
                    snprintf(extra, sizeof extra, "prefetch %d;", pf);
                    char *text = st_mode_spec(md->two_d ? meshes2[mesh] : meshes1[mesh], md->w, md->g, md->o, U, M,
                                              extra, false);
                    mf_schedule *s = compile_or_fail(text);
                    int k = s->mesh.naxes;
                    for (int kd = 0; kd < 3; kd++)
                        for (int inside = 0; inside < k; inside++) {
                            const coef *c = &md->c[kd][inside];
                            int64_t want = (int64_t)c->per_u * U + (int64_t)c->per_um * U * M;
                            int64_t got = s->summary.collectives[kinds[kd]][k - 1 - inside];
                            if (got != want)
                                fail_msg("%s, mesh %d, M=%d, prefetch %d: %s on axis %d: %lld launches, "
                                         "docs/semantics.md §4.5 says %lld",
                                         md->name, mesh, M, pf, mf_opkind_name(kinds[kd]), k - 1 - inside,
                                         (long long)got, (long long)want);
                        }
                    check_shape(s);
                    check_roundtrip(s);
                    mf_schedule_free(s);
                    free(text);
                }
    }
}

/* HFSDP: the outer all-gather of unit u+1 is issued at forward_pre(u) on the
 * first microbatch, before u+1's inner gather; on the last microbatch the
 * outer reduce-scatter of u follows its own inner reduce-scatter on outer. */
static void test_hfsdp_overlap(void **state)
{
    (void)state;
    char *text = st_mode_spec("dp_outer = 2, dp_inner = 4", "RF", "PF", "FF", 3, 2, "", false);
    mf_schedule *s = compile_or_fail(text);
    for (int u = 0; u + 1 < s->nunits; u++) {
        int b1 = s->units[u + 1].first_bucket;
        int ag_out = st_find_op(s, MF_PHASE_FORWARD_PRE, -1, MF_OP_ALL_GATHER, -1, 1, b1, 0);
        int ag_in = st_find_op(s, MF_PHASE_FORWARD_PRE, -1, MF_OP_ALL_GATHER, -1, 2, b1, 1);
        assert_true(ag_out >= 0 && ag_in > ag_out);
        assert_int_equal(s->ops[ag_out].unit, u);
        assert_int_equal(s->ops[ag_out].when, MF_WHEN_FIRST);
        assert_int_equal(s->ops[ag_out].stream, MF_STREAM_OUTER);
        assert_int_equal(s->ops[ag_out].dtype, MF_BF16); /* cast before the gather */
        /* the inner gather waits for the outer one (a wait on inner, first) */
        bool waited = false;
        for (int i = ag_out + 1; i < ag_in; i++)
            waited = waited || (s->ops[i].kind == MF_OP_WAIT && s->ops[i].stream == MF_STREAM_INNER &&
                                s->ops[i].when == MF_WHEN_FIRST);
        assert_true(waited);
    }
    for (int u = 0; u < s->nunits; u++) {
        int b = s->units[u].first_bucket;
        int rs_in = st_find_op(s, MF_PHASE_BACKWARD_POST, u, MF_OP_REDUCE_SCATTER, MF_STREAM_INNER, 3, b, 1);
        int acc = st_find_op(s, MF_PHASE_BACKWARD_POST, u, MF_OP_ACCUMULATE, MF_STREAM_INNER, 3, b, -1);
        int rs_out = st_find_op(s, MF_PHASE_BACKWARD_POST, u, MF_OP_REDUCE_SCATTER, MF_STREAM_OUTER, 4, b, 0);
        assert_true(rs_in >= 0 && acc > rs_in && rs_out > acc);
        assert_int_equal(s->ops[rs_out].when, MF_WHEN_LAST);
        /* record on inner after the accumulate, wait on outer before the outer RS */
        int rec = -1, wait = -1;
        for (int i = acc + 1; i < rs_out; i++) {
            if (s->ops[i].kind == MF_OP_RECORD && s->ops[i].stream == MF_STREAM_INNER)
                rec = i;
            if (s->ops[i].kind == MF_OP_WAIT && s->ops[i].stream == MF_STREAM_OUTER)
                wait = i;
        }
        assert_true(rec >= 0 && wait > rec);
        assert_int_equal(s->ops[rec].event, s->ops[wait].event);
        assert_int_equal(s->ops[wait].when, MF_WHEN_LAST);
    }
    mf_schedule_free(s);
    free(text);
}

static int count_ops(const mf_schedule *s, int phase, int unit, int kind, int stream)
{
    int n = 0;
    for (int i = 0; i < s->nops; i++)
        n += (int)s->ops[i].phase == phase && (unit < 0 || s->ops[i].unit == unit) && (int)s->ops[i].kind == kind &&
             (int)s->ops[i].stream == stream && mf_op_in_step(&s->ops[i]);
    return n;
}

static bool same_data(const mf_op *x, const mf_op *y)
{
    return x->kind == y->kind && x->bucket == y->bucket && x->axis == y->axis && x->count == y->count &&
           x->src == y->src && x->dst == y->dst && x->dtype == y->dtype && x->stream == y->stream;
}

/* The short-step and evaluation programs (planner/passes/mf_programs.c): the step's
 * own T4 ops at a short step's end, in order; per unit its buckets' forward
 * T1 and T2 at eval_forward_pre, compute waiting last; and the verifier
 * refuses either program with any one of its data ops taken out. */
static void test_programs_shape(void **state)
{
    (void)state;
    const char *layouts[][3] = {{"RF", "PF", "FF"}, {"RF", "PF", "RF"}, {"FF", "FF", "FF"}};
    for (int md = 0; md < 3; md++) {
        char *text = st_mode_spec("dp_outer = 2, dp_inner = 4", layouts[md][0], layouts[md][1], layouts[md][2], 3, 3,
                                  "", false);
        mf_schedule *s = compile_or_fail(text);
        free(text);
        assert_true(s->programs);
        int t4 = 0, k = 0;
        for (int i = 0; i < s->nops; i++)
            t4 += mf_op_in_step(&s->ops[i]) && s->ops[i].transition == 4;
        for (int i = 0; i < s->nops; i++) {
            const mf_op *op = &s->ops[i];
            if (op->when != MF_WHEN_SHORT || op->transition != 4)
                continue;
            while (k < s->nops && !(mf_op_in_step(&s->ops[k]) && s->ops[k].transition == 4))
                k++;
            assert_true(k < s->nops && same_data(op, &s->ops[k]));
            k++;
            t4--;
        }
        assert_int_equal(t4, 0);
        for (int u = 0; u < s->nunits; u++) {
            int last = -1, gathers = 0;
            for (int i = 0; i < s->nops; i++)
                if (s->ops[i].phase == MF_PHASE_EVAL_PRE && s->ops[i].unit == u) {
                    last = i;
                    gathers += s->ops[i].transition >= 1;
                }
            if (gathers == 0)
                continue;
            assert_int_equal(s->ops[last].kind, MF_OP_WAIT);
            assert_int_equal(s->ops[last].stream, MF_STREAM_COMPUTE);
        }
        size_t len;
        char *yaml = st_emit(s, &len), err[1024];
        for (int i = 0; i < s->nops; i++) {
            if (mf_op_in_step(&s->ops[i]) || s->ops[i].kind == MF_OP_RECORD || s->ops[i].kind == MF_OP_WAIT)
                continue;
            mf_schedule *m = mf_load_schedule_buffer("t.yaml", yaml, len, err, sizeof err);
            assert_non_null(m);
            st_drop_op(m, i);
            char *msgs = NULL;
            if (st_verify(m, &msgs) == 0)
                fail_msg("mode %d: the verifier accepts the programs without op %d", md, i);
            free(msgs);
            mf_schedule_free(m);
        }
        free(yaml);
        mf_schedule_free(s);
    }
}

/* The compute stream is joined at every hook docs/semantics.md §5 names. */
static void test_compute_edges(void **state)
{
    (void)state;
    char *text = st_mode_spec("dp_outer = 2, dp_inner = 4", "RF", "PF", "FF", 3, 3, "", false);
    mf_schedule *s = compile_or_fail(text);
    assert_int_equal(count_ops(s, MF_PHASE_STEP_BEGIN, -1, MF_OP_RECORD, MF_STREAM_COMPUTE), 1);
    assert_int_equal(count_ops(s, MF_PHASE_STEP_END, -1, MF_OP_WAIT, MF_STREAM_COMPUTE), s->nbuckets);
    for (int u = 0; u < s->nunits; u++) {
        assert_true(count_ops(s, MF_PHASE_FORWARD_PRE, u, MF_OP_WAIT, MF_STREAM_COMPUTE) >= 1);
        assert_int_equal(count_ops(s, MF_PHASE_FORWARD_POST, u, MF_OP_RECORD, MF_STREAM_COMPUTE), 1);
        /* re-gather ready + previous reduction done with grad_local */
        assert_int_equal(count_ops(s, MF_PHASE_BACKWARD_PRE, u, MF_OP_WAIT, MF_STREAM_COMPUTE), 2);
        int first = st_find_op(s, MF_PHASE_BACKWARD_POST, u, -1, -1, -1, -1, -1);
        assert_int_equal(s->ops[first].kind, MF_OP_RECORD);
        assert_int_equal(s->ops[first].stream, MF_STREAM_COMPUTE);
        /* and the reduction waits for exactly that record before reading grad_local */
        assert_int_equal(s->ops[first + 1].kind, MF_OP_WAIT);
        assert_int_equal(s->ops[first + 1].event, s->ops[first].event);
        assert_int_equal(s->ops[first + 2].kind, MF_OP_REDUCE_SCATTER);
        assert_int_equal(s->buffers[s->ops[first + 2].src].kind, MF_BUF_GRAD_LOCAL);
    }
    mf_schedule_free(s);
    free(text);
}

/* reshard_after_forward false: the unsharded weight lives until backward_post. */
static void test_keep_last(void **state)
{
    (void)state;
    for (int M = 1; M <= 3; M++) {
        char *text = st_mode_spec("dp = 4", "F", "F", "F", 3, M, "", true);
        mf_schedule *s = compile_or_fail(text);
        int b = s->units[2].first_bucket;
        assert_int_equal(st_find_op(s, MF_PHASE_BACKWARD_PRE, -1, MF_OP_ALL_GATHER, -1, 2, b, -1), -1);
        assert_int_equal(s->summary.collectives[MF_OP_ALL_GATHER][0], 2 * 3 * M - M);
        assert_int_equal(count_ops(s, MF_PHASE_FORWARD_POST, 2, MF_OP_RECORD, MF_STREAM_COMPUTE), 0);
        check_roundtrip(s);
        mf_schedule_free(s);
        free(text);
    }
}

/* Small buckets of consecutive units merge (bucket_size): gathered at the
 * first unit's forward_pre, reduced at its backward_post. */
static void test_merged_buckets(void **state)
{
    (void)state;
    for (int pf = 1; pf <= 2; pf++) {
        char extra[64];
        snprintf(extra, sizeof extra, "bucket_size 64KiB;\nprefetch %d;", pf);
        char *text = st_mode_spec("dp_outer = 2, dp_inner = 2", "RF", "PF", "FF", 6, 3, extra, false);
        mf_schedule *s = compile_or_fail(text);
        assert_true(s->nbuckets < s->nunits);
        int merged = -1;
        for (int b = 0; b < s->nbuckets && merged < 0; b++)
            if (s->buckets[b].last_unit > s->buckets[b].unit)
                merged = b;
        assert_true(merged >= 0);
        const mf_bucket *bk = &s->buckets[merged];
        int rs = st_find_op(s, MF_PHASE_BACKWARD_POST, -1, MF_OP_REDUCE_SCATTER, -1, 3, merged, -1);
        assert_true(rs >= 0);
        assert_int_equal(s->ops[rs].unit, bk->unit);
        int re = st_find_op(s, MF_PHASE_BACKWARD_PRE, -1, MF_OP_ALL_GATHER, -1, 2, merged, -1);
        int want = bk->last_unit + pf > s->nunits - 1 ? s->nunits - 1 : bk->last_unit + pf;
        assert_true(re >= 0);
        assert_int_equal(s->ops[re].unit, want);
        assert_int_equal(s->summary.collectives[MF_OP_REDUCE_SCATTER][1], s->nbuckets * 3);
        check_shape(s);
        check_roundtrip(s);
        mf_schedule_free(s);
        free(text);
    }
}

static void test_buffers_and_lifetimes(void **state)
{
    (void)state;
    char *text = st_mode_spec("dp_outer = 2, dp_inner = 4", "RF", "PF", "FF", 2, 2, "", false);
    mf_schedule *s = compile_or_fail(text);
    static const struct {
        const char *name;
        mf_bufkind kind;
        mf_lifetime life;
        mf_dtype dt;
        const char *place;
    } want[] = {
        {"u0/L.main_weight", MF_BUF_MAIN_WEIGHT, MF_LIFETIME_PERSISTENT, MF_FP32, "FF"},
        {"u0/L.weight", MF_BUF_WEIGHT, MF_LIFETIME_PERSISTENT, MF_BF16, "RF"},
        {"u0/L.T1.cast", MF_BUF_WEIGHT_STAGE, MF_LIFETIME_MICROBATCH, MF_BF16, "FF"},
        {"u0/L.weight_full", MF_BUF_WEIGHT_FULL, MF_LIFETIME_MICROBATCH, MF_BF16, "RR"},
        {"u0/L.grad_local", MF_BUF_GRAD_LOCAL, MF_LIFETIME_MICROBATCH, MF_FP32, "PP"},
        {"u0/L.T3.reduce_scatter.dp_inner", MF_BUF_GRAD_STAGE, MF_LIFETIME_MICROBATCH, MF_FP32, "PF"},
        {"u0/L.grad", MF_BUF_GRAD, MF_LIFETIME_PERSISTENT, MF_FP32, "PF"},
        {"u0/L.grad_final", MF_BUF_GRAD_FINAL, MF_LIFETIME_PERSISTENT, MF_FP32, "FF"},
    };
    int per_bucket = 0;
    for (int i = 0; i < s->nbuffers; i++)
        per_bucket += s->buffers[i].bucket == 0;
    assert_int_equal(per_bucket, (int)(sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int b = st_buffer(s, want[i].name);
        assert_int_equal(b, (int)i);
        const mf_buffer *bf = &s->buffers[b];
        assert_int_equal(bf->kind, want[i].kind);
        assert_int_equal(bf->lifetime, want[i].life);
        assert_int_equal(bf->dtype, want[i].dt);
        char letters[MF_MAX_AXES + 1];
        assert_string_equal(mf_placement_letters(&bf->place, 2, letters), want[i].place);
    }
    mf_schedule_free(s);
    free(text);
}

/* Emitting twice, and compiling twice, gives the same bytes. */
static void test_deterministic(void **state)
{
    (void)state;
    char *text = st_mode_spec("dp_outer = 3, dp_inner = 2", "FF", "FF", "FF", 4, 3, "prefetch 2;", true);
    mf_schedule *a = compile_or_fail(text), *b = compile_or_fail(text);
    size_t la, lb, la2;
    char *ya = st_emit(a, &la), *yb = st_emit(b, &lb), *ya2 = st_emit(a, &la2);
    assert_int_equal(la, lb);
    assert_memory_equal(ya, yb, la);
    assert_int_equal(la, la2);
    assert_memory_equal(ya, ya2, la);
    /* no floats, no absolute paths */
    assert_null(strstr(ya, "source: /"));
    for (const char *p = ya; (p = strchr(p, '.')) != NULL; p++)
        assert_false(p > ya && p[-1] >= '0' && p[-1] <= '9' && p[1] >= '0' && p[1] <= '9' && p[-2] == ' ');
    free(ya);
    free(yb);
    free(ya2);
    mf_schedule_free(a);
    mf_schedule_free(b);
    free(text);
}

/* An absolute spec path is written as its last component. */
static void test_source_never_absolute(void **state)
{
    (void)state;
    char *text = st_mode_spec("dp = 2", "F", "F", "F", 1, 1, "", false);
    char *diag = NULL;
    mf_schedule *s = st_compile("/abs/dir/model.mfsdp", text, true, &diag);
    assert_non_null(s);
    assert_string_equal(s->source, "model.mfsdp");
    char hex[65];
    mf_sha256(text, strlen(text), NULL, hex);
    assert_string_equal(s->source_sha256, hex);
    mf_schedule_free(s);
    free(diag);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mode_counts),
        cmocka_unit_test(test_hfsdp_overlap),
        cmocka_unit_test(test_compute_edges),
        cmocka_unit_test(test_programs_shape),
        cmocka_unit_test(test_keep_last),
        cmocka_unit_test(test_merged_buckets),
        cmocka_unit_test(test_buffers_and_lifetimes),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_source_never_absolute),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
