/*
 * Verifier: every mode verifies; then one mutation at a time of a verified
 * HFSDP schedule (M = 3: first, middle, last) -- drop an event, change an
 * axis, a count, a predicate, a stream, a dtype -- must give a precise error
 * naming the op, the bucket, the buffer and the microbatch.
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

static mf_schedule *mode(const char *mesh, const char *w, const char *g, const char *o, int M, bool keep_last)
{
    char *text = st_mode_spec(mesh, w, g, o, 3, M, "", keep_last);
    char *diag = NULL;
    mf_schedule *s = st_compile("t.mfsdp", text, true, &diag);
    if (!s)
        fail_msg("compile failed:\n%s", diag);
    free(diag);
    free(text);
    return s;
}

static mf_schedule *hfsdp(int M, bool keep_last)
{
    return mode("dp_outer = 2, dp_inner = 4", "RF", "PF", "FF", M, keep_last);
}

/* Verifies s, expects errors, and checks that `want` is one of the messages. */
static void expect_error(const mf_schedule *s, const char *want)
{
    char *diag = NULL;
    int n = st_verify(s, &diag);
    if (n == 0 || !strstr(diag, want))
        fail_msg("expected an error containing\n  %s\ngot %d errors:\n%s", want, n, diag ? diag : "");
    free(diag);
}

static void test_all_modes_verify(void **state)
{
    (void)state;
    static const char *const m[][4] = {
        {"dp = 5", "R", "P", "R"},   {"dp = 5", "R", "P", "F"},   {"dp = 5", "R", "F", "F"},
        {"dp = 5", "F", "F", "F"},   {"a = 2, b = 3", "RF", "PF", "RF"}, {"a = 3, b = 2", "RF", "PF", "FF"},
        {"a = 2, b = 2", "RF", "PP", "RF"}, {"a = 2, b = 3", "FF", "FF", "FF"}, {"a = 2, b = 2", "RR", "PF", "FF"},
        {"a = 2, b = 2, c = 2", "RRF", "PFF", "FFF"}, {"a = 2, b = 1, c = 3", "RFF", "PFF", "RFF"},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        for (int M = 1; M <= 4; M++) {
            char *text = st_mode_spec(m[i][0], m[i][1], m[i][2], m[i][3], 3, M, "", M % 2 == 0);
            char *diag = NULL;
            mf_schedule *s = st_compile("t.mfsdp", text, false, &diag);
            if (!s)
                fail_msg("compile failed:\n%s", diag);
            free(diag);
            diag = NULL;
            if (st_verify(s, &diag) != 0)
                fail_msg("%s %s %s %s M=%d does not verify:\n%s", m[i][0], m[i][1], m[i][2], m[i][3], M, diag);
            free(diag);
            mf_schedule_free(s);
            free(text);
        }
}

static char *opdesc(const mf_schedule *s, int id, char *buf, size_t size)
{
    const mf_op *op = &s->ops[id];
    if (op->axis >= 0)
        snprintf(buf, size, "op %d (%s on %s, %s)", id, mf_opkind_name(op->kind), s->mesh.axes[op->axis].name,
                 s->buckets[op->bucket].name);
    else
        snprintf(buf, size, "op %d (%s, %s)", id, mf_opkind_name(op->kind), s->buckets[op->bucket].name);
    return buf;
}

/* The wait on `stream` right before op `id` (in the same hook). */
static int wait_before(const mf_schedule *s, int id, mf_stream stream)
{
    for (int i = id - 1; i >= 0 && s->ops[i].phase == s->ops[id].phase && s->ops[i].unit == s->ops[id].unit; i--)
        if (s->ops[i].kind == MF_OP_WAIT && s->ops[i].stream == stream)
            return i;
    fail_msg("no wait before op %d", id);
    return -1;
}

/* forward_pre's compute wait for the unsharded weight is gone. */
static void test_drop_forward_wait(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(3, false);
    int u = 1, b = s->units[u].first_bucket;
    int ag = st_find_op(s, MF_PHASE_FORWARD_PRE, -1, MF_OP_ALL_GATHER, MF_STREAM_INNER, 2, b, -1);
    int w = st_find_op(s, MF_PHASE_FORWARD_PRE, u, MF_OP_WAIT, MF_STREAM_COMPUTE, -1, -1, -1);
    assert_true(ag >= 0 && w > ag);
    st_drop_op(s, w);
    char want[256], od[128];
    snprintf(want, sizeof want,
             "the forward of unit u1 (on compute) reads weight_full written by %s without an event edge (microbatch first)",
             opdesc(s, ag, od, sizeof od));
    expect_error(s, want);
    mf_schedule_free(s);
}

/* The reduction no longer waits for backward_post's compute record. */
static void test_drop_grad_local_raw(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(3, false);
    int u = 2, b = s->units[u].first_bucket;
    int rs = st_find_op(s, MF_PHASE_BACKWARD_POST, u, MF_OP_REDUCE_SCATTER, -1, 3, b, -1);
    st_drop_op(s, wait_before(s, rs, MF_STREAM_INNER));
    rs--;
    char want[256], od[128];
    snprintf(want, sizeof want,
             "%s reads grad_local written by the backward of unit u2 (on compute) without an event edge (microbatch first)",
             opdesc(s, rs, od, sizeof od));
    expect_error(s, want);
    mf_schedule_free(s);
}

/* The next microbatch's backward no longer waits for the reduction to finish
 * reading grad_local (WAR). ZeRO-2: no forward gather on the same stream
 * orders compute after the reduction some other way (with one, the edge is
 * redundant and the verifier rightly accepts its removal). */
static void test_drop_grad_local_war(void **state)
{
    (void)state;
    mf_schedule *s = mode("dp = 4", "R", "F", "F", 3, false);
    /* Every compute wait at a backward_pre (W is Replicate: no re-gather),
     * i.e. the end of the previous T3 and the waits the buffer assignment
     * added where grad_local reuses bytes (they order the same accesses). */
    int dropped = 0;
    for (int i = s->nops - 1; i >= 0; i--) {
        const mf_op *op = &s->ops[i];
        if (op->phase == MF_PHASE_BACKWARD_PRE && op->kind == MF_OP_WAIT && op->stream == MF_STREAM_COMPUTE) {
            st_drop_op(s, i);
            dropped++;
        }
    }
    assert_true(dropped >= 3);
    int u = 1, b = s->units[u].first_bucket;
    int rs = st_find_op(s, MF_PHASE_BACKWARD_POST, u, MF_OP_REDUCE_SCATTER, -1, 3, b, -1);
    char want[256], od[128];
    snprintf(want, sizeof want,
             "the backward of unit u1 (on compute) writes grad_local read by %s without an event edge (microbatch middle)",
             opdesc(s, rs, od, sizeof od));
    expect_error(s, want);
    mf_schedule_free(s);
}

/* The backward re-gather no longer waits for forward_post (WAR on weight_full). */
static void test_drop_regather_war(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(3, false);
    /* the first re-gather of the backward (later ones are ordered through it) */
    int b = s->units[2].first_bucket;
    int ag = st_find_op(s, MF_PHASE_BACKWARD_PRE, -1, MF_OP_ALL_GATHER, -1, 2, b, -1);
    st_drop_op(s, wait_before(s, ag, MF_STREAM_INNER));
    ag--;
    char want[256], od[128];
    snprintf(want, sizeof want,
             "%s writes weight_full read by the forward of unit u2 (on compute) without an event edge (microbatch first)",
             opdesc(s, ag, od, sizeof od));
    expect_error(s, want);
    mf_schedule_free(s);
}

/* The inner gather no longer waits for the outer gather of T1. */
static void test_drop_t1_handoff(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int b = s->units[1].first_bucket;
    int outer = st_find_op(s, MF_PHASE_FORWARD_PRE, -1, MF_OP_ALL_GATHER, MF_STREAM_OUTER, 1, b, -1);
    int inner = st_find_op(s, MF_PHASE_FORWARD_PRE, -1, MF_OP_ALL_GATHER, MF_STREAM_INNER, 2, b, -1);
    int w = -1;
    for (int i = outer + 1; i < inner; i++)
        if (s->ops[i].kind == MF_OP_WAIT && s->ops[i].stream == MF_STREAM_INNER && s->ops[i].when == MF_WHEN_FIRST)
            w = i;
    assert_true(w >= 0);
    st_drop_op(s, w);
    inner--;
    char want[256], od[128], od2[128];
    snprintf(want, sizeof want, "%s reads weight written by %s without an event edge (microbatch first)",
             opdesc(s, inner, od, sizeof od), opdesc(s, outer, od2, sizeof od2));
    expect_error(s, want);
    mf_schedule_free(s);
}

/* step_end no longer waits for the last outer reduce-scatter. */
static void test_drop_step_end_wait(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(1, false);
    int b = s->units[0].first_bucket;
    int rs = st_find_op(s, MF_PHASE_BACKWARD_POST, -1, MF_OP_REDUCE_SCATTER, MF_STREAM_OUTER, 4, b, -1);
    int rec = rs + 1;
    assert_int_equal(s->ops[rec].kind, MF_OP_RECORD);
    int w = -1;
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].phase == MF_PHASE_STEP_END && s->ops[i].event == s->ops[rec].event)
            w = i;
    st_drop_op(s, w);
    char want[256], od[128];
    snprintf(want, sizeof want,
             "the optimizer (after step_end, on compute) reads grad_final written by %s without an event edge",
             opdesc(s, rs, od, sizeof od));
    expect_error(s, want);
    mf_schedule_free(s);
}

/* step_begin's record is gone: T1 waits for an event nobody records. */
static void test_drop_step_begin_record(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    assert_int_equal(s->ops[0].phase, MF_PHASE_STEP_BEGIN);
    int ev = s->ops[0].event;
    st_drop_op(s, 0);
    char want[128];
    snprintf(want, sizeof want, "event %d is recorded by 0 ops, expected exactly one", ev);
    expect_error(s, want);
    mf_schedule_free(s);
}

/* A collective moved to the other axis. */
static void test_change_axis(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int b = s->units[1].first_bucket;
    int rs = st_find_op(s, MF_PHASE_BACKWARD_POST, -1, MF_OP_REDUCE_SCATTER, -1, 3, b, 1);
    s->ops[rs].axis = 0;
    char want[256];
    snprintf(want, sizeof want, "op %d (reduce_scatter on dp_outer, u1/L) runs on stream inner, but collectives on "
             "dp_outer run on outer", rs);
    expect_error(s, want);
    snprintf(want, sizeof want, "op %d (reduce_scatter): count %lld needs a source of %lld elements", rs,
             (long long)s->ops[rs].count, 2 * (long long)s->ops[rs].count);
    expect_error(s, want);
    mf_schedule_free(s);
}

static void test_change_count(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int b = s->units[2].first_bucket;
    int ag = st_find_op(s, MF_PHASE_FORWARD_PRE, -1, MF_OP_ALL_GATHER, -1, 2, b, 1);
    s->ops[ag].count -= 1;
    char want[256];
    snprintf(want, sizeof want, "op %d (all_gather): count %lld needs a source of %lld elements, but 'u2/L.weight' "
             "holds %lld", ag, (long long)s->ops[ag].count, (long long)s->ops[ag].count,
             (long long)s->ops[ag].count + 1);
    expect_error(s, want);
    mf_schedule_free(s);
}

/* T3's reduce-scatter on the first microbatch only: the accumulate of the
 * middle microbatch reads a stage left from the first. */
static void test_change_predicate_t3(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(3, false);
    int b = s->units[0].first_bucket;
    int rs = st_find_op(s, MF_PHASE_BACKWARD_POST, -1, MF_OP_REDUCE_SCATTER, -1, 3, b, -1);
    int acc = st_find_op(s, MF_PHASE_BACKWARD_POST, -1, MF_OP_ACCUMULATE, -1, 3, b, -1);
    s->ops[rs].when = MF_WHEN_FIRST;
    char want[256];
    snprintf(want, sizeof want, "op %d (accumulate, u0/L) reads T3.reduce_scatter.dp_inner (lifetime microbatch) "
             "written in an earlier microbatch (microbatch middle)", acc);
    expect_error(s, want);
    mf_schedule_free(s);
}

/* T4 on the first microbatch: the delivered gradient misses the others. */
static void test_change_predicate_t4(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(3, false);
    int b = s->units[1].first_bucket;
    int rs = st_find_op(s, MF_PHASE_BACKWARD_POST, -1, MF_OP_REDUCE_SCATTER, -1, 4, b, -1);
    s->ops[rs].when = MF_WHEN_FIRST;
    for (int i = rs - 2; i <= rs + 1; i++) /* its wait and record follow it */
        if (s->ops[i].kind != MF_OP_ACCUMULATE && s->ops[i].when == MF_WHEN_LAST)
            s->ops[i].when = MF_WHEN_FIRST;
    expect_error(s, "the optimizer (after step_end, on compute) receives in grad_final a gradient that misses "
                    "microbatches middle, last\n");
    mf_schedule_free(s);
}

/* T1's cast only on the last microbatch: the first microbatch gathers nothing. */
static void test_change_predicate_t1(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int b = s->units[0].first_bucket;
    int cast = st_find_op(s, MF_PHASE_FORWARD_PRE, -1, MF_OP_CAST, -1, 1, b, -1);
    s->ops[cast].when = MF_WHEN_LAST;
    char want[256];
    snprintf(want, sizeof want, "op %d (all_gather on dp_outer, u0/L) reads T1.cast, which holds nothing yet in this "
             "step (microbatch first)", cast + 1);
    expect_error(s, want);
    mf_schedule_free(s);
}

/* A step_begin op with a microbatch predicate. */
static void test_predicate_for_phase(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    s->ops[0].when = MF_WHEN_LAST;
    expect_error(s, "op 0 (record of event 0 on compute, step_begin) has predicate last, but step_begin ops run once "
                    "per step (predicate every)");
    mf_schedule_free(s);
}

/* A collective on the wrong stream. */
static void test_change_stream_collective(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int b = s->units[1].first_bucket;
    int rs = st_find_op(s, MF_PHASE_BACKWARD_POST, -1, MF_OP_REDUCE_SCATTER, -1, 3, b, -1);
    s->ops[rs].stream = MF_STREAM_OUTER;
    char want[256];
    snprintf(want, sizeof want, "op %d (reduce_scatter on dp_inner, u1/L) runs on stream outer, but collectives on "
             "dp_inner run on inner", rs);
    expect_error(s, want);
    mf_schedule_free(s);
}

/* A local op moved to the other stream: it reads what the inner stream wrote
 * without an edge. */
static void test_change_stream_local(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int b = s->units[1].first_bucket;
    int rs = st_find_op(s, MF_PHASE_BACKWARD_POST, -1, MF_OP_REDUCE_SCATTER, -1, 3, b, -1);
    int acc = st_find_op(s, MF_PHASE_BACKWARD_POST, -1, MF_OP_ACCUMULATE, -1, 3, b, -1);
    s->ops[acc].stream = MF_STREAM_OUTER;
    char want[256], od[128];
    snprintf(want, sizeof want, "op %d (accumulate, u1/L) reads T3.reduce_scatter.dp_inner written by %s without an "
             "event edge (microbatch first)", acc, opdesc(s, rs, od, sizeof od));
    expect_error(s, want);
    mf_schedule_free(s);
}

static void test_change_dtype(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int b = s->units[0].first_bucket;
    int cast = st_find_op(s, MF_PHASE_FORWARD_PRE, -1, MF_OP_CAST, -1, 1, b, -1);
    s->ops[cast].dtype = MF_FP32;
    char want[256];
    snprintf(want, sizeof want, "op %d: dtype fp32 differs from the destination 'u0/L.T1.cast' (bf16)", cast);
    expect_error(s, want);
    mf_schedule_free(s);
}

/* A unit that reshards after forward loses its backward re-gather. */
static void test_drop_regather(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int b = s->units[1].first_bucket;
    int ag = st_find_op(s, MF_PHASE_BACKWARD_PRE, -1, MF_OP_ALL_GATHER, -1, 2, b, -1);
    st_drop_op(s, ag);
    expect_error(s, "the backward of unit u1 (on compute) reads weight_full after it was released at forward_post "
                    "(its unit reshards after forward) and before it was gathered again (microbatch first)");
    mf_schedule_free(s);
}

/* A gather on the wrong one of two Flat axes: 2-D FSDP on 2 x 2, where the
 * counts still fit, gathers the inner axis first. */
static void test_wrong_placement(void **state)
{
    (void)state;
    mf_schedule *s = mode("dp_outer = 2, dp_inner = 2", "FF", "FF", "FF", 2, false);
    int b = s->units[0].first_bucket;
    int ag = st_find_op(s, MF_PHASE_FORWARD_PRE, -1, MF_OP_ALL_GATHER, -1, 2, b, 0);
    s->ops[ag].axis = 1;
    s->ops[ag].stream = MF_STREAM_INNER;
    char want[256];
    snprintf(want, sizeof want, "op %d (all_gather on dp_inner, u0/L) reads 'u0/L.weight' at [Flat, Flat]: an "
             "all-gather needs Flat on its axis, the outermost Flat axis", ag);
    expect_error(s, want);
    mf_schedule_free(s);
}

/* The normative buffer rules. */
static void test_buffer_rules(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int wf = st_buffer(s, "u1/L.weight_full");
    s->buffers[wf].kind = MF_BUF_WEIGHT_STAGE;
    expect_error(s, "bucket 'u1/L' has no weight_full buffer (its weight is not replicated)");
    s->buffers[wf].kind = MF_BUF_WEIGHT_FULL;
    int mw = st_buffer(s, "u1/L.main_weight");
    s->buffers[mw].lifetime = MF_LIFETIME_MICROBATCH;
    expect_error(s, "buffer 'u1/L.main_weight' (main_weight) must be persistent: it lives across the step boundary");
    mf_schedule_free(s);
}

/* A wait on the stream its event is recorded on. */
static void test_wait_own_stream(void **state)
{
    (void)state;
    mf_schedule *s = hfsdp(2, false);
    int w = st_find_op(s, MF_PHASE_FORWARD_PRE, 0, MF_OP_WAIT, MF_STREAM_COMPUTE, -1, -1, -1);
    int ev = s->ops[w].event;
    int rec = -1;
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].kind == MF_OP_RECORD && s->ops[i].event == ev)
            rec = i;
    s->ops[rec].stream = MF_STREAM_COMPUTE;
    char want[128];
    snprintf(want, sizeof want, "op %d (wait of event %d on compute, forward_pre of u0) waits for an event recorded on "
             "its own stream", w, ev);
    expect_error(s, want);
    mf_schedule_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_modes_verify),
        cmocka_unit_test(test_drop_forward_wait),
        cmocka_unit_test(test_drop_grad_local_raw),
        cmocka_unit_test(test_drop_grad_local_war),
        cmocka_unit_test(test_drop_regather_war),
        cmocka_unit_test(test_drop_t1_handoff),
        cmocka_unit_test(test_drop_step_end_wait),
        cmocka_unit_test(test_drop_step_begin_record),
        cmocka_unit_test(test_change_axis),
        cmocka_unit_test(test_change_count),
        cmocka_unit_test(test_change_predicate_t3),
        cmocka_unit_test(test_change_predicate_t4),
        cmocka_unit_test(test_change_predicate_t1),
        cmocka_unit_test(test_predicate_for_phase),
        cmocka_unit_test(test_change_stream_collective),
        cmocka_unit_test(test_change_stream_local),
        cmocka_unit_test(test_change_dtype),
        cmocka_unit_test(test_drop_regather),
        cmocka_unit_test(test_wrong_placement),
        cmocka_unit_test(test_buffer_rules),
        cmocka_unit_test(test_wait_own_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
