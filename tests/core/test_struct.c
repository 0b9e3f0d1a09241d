/*
 * The op table (MF_OPKIND_LIST, core/mf_schedule.h) against the op semantics
 * written out by hand from docs/semantics.md §2, docs/semantics.md §4.2 (and the
 * streams of docs/semantics.md §5): what every op kind needs on its axis, what it makes it, which axis it
 * may run on and on which stream. Then the two users of the table agree
 * with the same hand-written facts: mf_struct_move (the structural checker
 * and the verifier) on every placement of meshes of 1 to 4 axes, and the
 * transition search (planner/passes/mf_transition.c) on every step it composes for
 * the layouts of docs/semantics.md §4.2, which between them use every data
 * op kind.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_struct.h"
#include "mf_trans_rules.h"
#include "plan_testlib.h"

/* Where on its axis an op may run, relative to the Flat suffix s..k-1. */
enum { NO_AXIS, ANY_AXIS, AT_S, AT_S_MINUS_1 };
/* Streams (docs/semantics.md §5): its axis's; the one of the collective it
 * feeds (never compute); any. */
enum { ST_AXIS, ST_FED, ST_ANY };

/* The facts, by hand. need/becomes -1: the op keeps the placement. */
static const struct fact {
    mf_opkind kind;
    const char *name;
    bool collective;
    int need, becomes, where, stream;
    const char *why; /* the checker's reason when the move is refused */
} facts[] = {
    {MF_OP_ALL_GATHER, "all_gather", true, MF_PLACE_FLAT, MF_PLACE_REPLICATE, AT_S, ST_AXIS,
     "an all-gather needs Flat on its axis, the outermost Flat axis"},
    {MF_OP_REDUCE_SCATTER, "reduce_scatter", true, MF_PLACE_PARTIAL, MF_PLACE_FLAT, AT_S_MINUS_1, ST_AXIS,
     "a reduce-scatter needs Partial on its axis, just outside the Flat axes"},
    {MF_OP_ALL_REDUCE, "all_reduce", true, MF_PLACE_PARTIAL, MF_PLACE_REPLICATE, ANY_AXIS, ST_AXIS,
     "an all-reduce needs Partial on its axis"},
    {MF_OP_SLICE, "slice", false, MF_PLACE_REPLICATE, MF_PLACE_FLAT, AT_S_MINUS_1, ST_FED,
     "a slice needs Replicate on its axis, just outside the Flat axes"},
    {MF_OP_CAST, "cast", false, -1, -1, NO_AXIS, ST_FED, NULL},
    {MF_OP_ACCUMULATE, "accumulate", false, -1, -1, NO_AXIS, ST_FED, NULL},
    {MF_OP_RECORD, "record", false, -1, -1, NO_AXIS, ST_ANY, NULL},
    {MF_OP_WAIT, "wait", false, -1, -1, NO_AXIS, ST_ANY, NULL},
};

static const struct fact *fact_of(mf_opkind k)
{
    for (size_t i = 0; i < sizeof facts / sizeof facts[0]; i++)
        if (facts[i].kind == k)
            return &facts[i];
    fail_msg("op kind %d has no hand-written fact", (int)k);
    return NULL;
}

static const char *letters(const mf_placement *p, int k, char *buf)
{
    for (int j = 0; j < k; j++)
        buf[j] = "RFP"[p->p[j]];
    buf[k] = '\0';
    return buf;
}

/* The table's rows say what the facts say, every kind. */
static void test_table_rows(void **state)
{
    (void)state;
    assert_int_equal(sizeof facts / sizeof facts[0], MF_OPKIND_COUNT);
    static const mf_opat at_of[] = {[NO_AXIS] = MF_OPAT_NO_AXIS, [ANY_AXIS] = MF_OPAT_ANY_AXIS,
                                    [AT_S] = MF_OPAT_FLAT_START, [AT_S_MINUS_1] = MF_OPAT_OUTSIDE_FLAT};
    static const mf_opstream stream_of[] = {[ST_AXIS] = MF_OPSTREAM_AXIS, [ST_FED] = MF_OPSTREAM_FED,
                                            [ST_ANY] = MF_OPSTREAM_ANY};
    for (int k = 0; k < MF_OPKIND_COUNT; k++) {
        const struct fact *f = fact_of((mf_opkind)k);
        const mf_opkind_info *in = mf_opkind_info_of((mf_opkind)k);
        assert_non_null(in);
        assert_string_equal(in->name, f->name);
        assert_string_equal(mf_opkind_name((mf_opkind)k), f->name);
        assert_int_equal(in->collective, f->collective);
        assert_int_equal(mf_opkind_is_collective((mf_opkind)k), f->collective);
        assert_int_equal(in->need, f->need < 0 ? MF_PLACE_NONE : f->need);
        assert_int_equal(in->becomes, f->becomes < 0 ? MF_PLACE_NONE : f->becomes);
        assert_int_equal(in->at, at_of[f->where]);
        assert_int_equal(mf_opkind_on_axis((mf_opkind)k), f->where != NO_AXIS);
        assert_int_equal(in->stream, stream_of[f->stream]);
        assert_true(in->doc && in->doc[0]);
    }
    assert_null(mf_opkind_info_of(MF_OPKIND_COUNT));
    assert_null(mf_opkind_info_of((mf_opkind)-1));
}

/* The one-move op per placement change (docs/semantics.md §4.2, "step"). */
static void test_op_for_move(void **state)
{
    (void)state;
    static const int want[MF_PLACE_COUNT][MF_PLACE_COUNT] = {
        [MF_PLACE_REPLICATE] = {[MF_PLACE_REPLICATE] = -1, [MF_PLACE_FLAT] = MF_OP_SLICE, [MF_PLACE_PARTIAL] = -1},
        [MF_PLACE_FLAT] = {[MF_PLACE_REPLICATE] = MF_OP_ALL_GATHER, [MF_PLACE_FLAT] = -1, [MF_PLACE_PARTIAL] = -1},
        [MF_PLACE_PARTIAL] = {[MF_PLACE_REPLICATE] = MF_OP_ALL_REDUCE, [MF_PLACE_FLAT] = MF_OP_REDUCE_SCATTER,
                              [MF_PLACE_PARTIAL] = -1},
    };
    for (int a = 0; a < MF_PLACE_COUNT; a++)
        for (int b = 0; b < MF_PLACE_COUNT; b++)
            assert_int_equal(mf_opkind_for_move((mf_place)a, (mf_place)b), want[a][b]);
}

/* Single cases on 2-D and 3-D placements, moved and refused, with the
 * reasons the checker gives. */
static void test_move_cases(void **state)
{
    (void)state;
    static const struct {
        mf_opkind kind;
        const char *src;
        int axis;
        const char *dst; /* NULL: refused */
    } cases[] = {
        {MF_OP_ALL_GATHER, "FF", 0, "RF"},   {MF_OP_ALL_GATHER, "FF", 1, NULL},
        {MF_OP_ALL_GATHER, "RF", 1, "RR"},   {MF_OP_ALL_GATHER, "RR", 1, NULL},
        {MF_OP_ALL_GATHER, "PF", 1, "PR"},   {MF_OP_ALL_GATHER, "RFF", 1, "RRF"},
        {MF_OP_REDUCE_SCATTER, "PP", 1, "PF"}, {MF_OP_REDUCE_SCATTER, "PP", 0, NULL},
        {MF_OP_REDUCE_SCATTER, "PF", 0, "FF"}, {MF_OP_REDUCE_SCATTER, "RF", 0, NULL},
        {MF_OP_REDUCE_SCATTER, "PPF", 1, "PFF"}, {MF_OP_REDUCE_SCATTER, "PPF", 0, NULL},
        {MF_OP_ALL_REDUCE, "PP", 0, "RP"},   {MF_OP_ALL_REDUCE, "PF", 0, "RF"},
        {MF_OP_ALL_REDUCE, "RP", 0, NULL},   {MF_OP_ALL_REDUCE, "PPP", 1, "PRP"},
        {MF_OP_SLICE, "RR", 1, "RF"},        {MF_OP_SLICE, "RF", 0, "FF"},
        {MF_OP_SLICE, "RR", 0, NULL},        {MF_OP_SLICE, "PF", 0, NULL},
        {MF_OP_CAST, "PF", -1, "PF"},        {MF_OP_ACCUMULATE, "FF", -1, "FF"},
        {MF_OP_RECORD, "RR", -1, "RR"},      {MF_OP_WAIT, "RF", -1, "RF"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int k = (int)strlen(cases[i].src);
        mf_placement src = tl_place(cases[i].src), out;
        char got[MF_MAX_AXES + 1];
        bool ok = mf_struct_move(cases[i].kind, cases[i].axis, k, &src, &out);
        if (ok != (cases[i].dst != NULL))
            fail_msg("%s on axis %d of %s: %s", mf_opkind_name(cases[i].kind), cases[i].axis, cases[i].src,
                     ok ? "moved, expected a refusal" : "refused, expected a move");
        if (ok)
            assert_string_equal(letters(&out, k, got), cases[i].dst);
    }
    /* the reasons, each op kind that works on an axis */
    for (int kind = 0; kind < MF_OPKIND_COUNT; kind++) {
        const struct fact *f = fact_of((mf_opkind)kind);
        if (!f->why)
            continue;
        char why[128];
        mf_struct_move_why((mf_opkind)kind, why, sizeof why);
        assert_string_equal(why, f->why);
    }
}

/* The first axis of the Flat suffix, by the definition (docs/semantics.md §1). */
static int flat_start(const char *p, int k)
{
    int s = k;
    while (s > 0 && p[s - 1] == 'F')
        s--;
    return s;
}

static bool fact_allows(const struct fact *f, const char *p, int k, int j)
{
    int s = flat_start(p, k);
    bool axis_ok = f->where == ANY_AXIS || (f->where == AT_S && j == s) || (f->where == AT_S_MINUS_1 && j == s - 1);
    return axis_ok && p[j] == "RFP"[f->need];
}

/* mf_struct_move on every placement of {R,F,P}^k, k = 1..4, every axis and
 * every op kind with an axis, against the facts. */
static void test_move_exhaustive(void **state)
{
    (void)state;
    int moved[MF_OPKIND_COUNT] = {0}, refused[MF_OPKIND_COUNT] = {0};
    for (int k = 1; k <= MF_MAX_AXES; k++) {
        int total = 1;
        for (int j = 0; j < k; j++)
            total *= 3;
        for (int code = 0; code < total; code++) {
            char p[MF_MAX_AXES + 1] = {0};
            for (int j = 0, c = code; j < k; j++, c /= 3)
                p[j] = "RFP"[c % 3];
            mf_placement src = tl_place(p);
            for (int kind = 0; kind < MF_OPKIND_COUNT; kind++) {
                const struct fact *f = fact_of((mf_opkind)kind);
                if (f->where == NO_AXIS)
                    continue;
                for (int j = 0; j < k; j++) {
                    mf_placement out;
                    bool ok = mf_struct_move((mf_opkind)kind, j, k, &src, &out), want = fact_allows(f, p, k, j);
                    if (ok != want)
                        fail_msg("%s on axis %d of %s: got %s", f->name, j, p, ok ? "a move" : "a refusal");
                    char q[MF_MAX_AXES + 1], got[MF_MAX_AXES + 1];
                    memcpy(q, p, sizeof q);
                    if (ok) {
                        q[j] = "RFP"[f->becomes];
                        assert_string_equal(letters(&out, k, got), q);
                    }
                    (ok ? moved : refused)[kind]++;
                }
            }
        }
    }
    for (int kind = 0; kind < MF_OPKIND_COUNT; kind++)
        if (fact_of((mf_opkind)kind)->where != NO_AXIS)
            assert_true(moved[kind] > 0 && refused[kind] > 0);
}

/* Every step of every transition the search composes for these layouts:
 * its placement change is the fact of its kind (need -> becomes on its axis,
 * the rest kept, on the right axis), mf_struct_move agrees, and each
 * transition runs from and to the roles docs/semantics.md §4 names. */
static void check_layout_steps(const char *w, const char *g, const char *o, int64_t numel, bool *seen)
{
    static const int64_t sizes[] = {2, 4};
    int k = 2;
    mf_arena *a = mf_arena_create();
    mf_spec *s = tl_spec_new(a, k, sizes, 2, MF_REDUCE_AVG);
    int l = tl_layout(a, s, "x", w, MF_BF16, g, MF_FP32, o, MF_FP32);
    int u = tl_unit(a, s, "u", l, true);
    tl_tensor(a, s, u, "t", numel, -1);
    char *diag = NULL;
    mf_plan *p = tl_plan(s, NULL, &diag);
    if (!p)
        fail_msg("W %s G %s O %s: %s", w, g, o, diag);
    free(diag);
    /* T1 O -> W, T2 W -> Rep, T3 [P..P] -> G, T4 G -> O */
    const char *ends[MF_NTRANSITIONS][2] = {{o, w}, {w, "RR"}, {"PP", g}, {g, o}};
    for (int t = 0; t < MF_NTRANSITIONS; t++) {
        const mf_transition *tr = &p->trans[0][t];
        char from[MF_MAX_AXES + 1], to[MF_MAX_AXES + 1];
        assert_string_equal(letters(&tr->from, k, from), ends[t][0]);
        assert_string_equal(letters(&tr->to, k, to), ends[t][1]);
        for (int i = 0; i < tr->nsteps; i++) {
            const mf_step *st = &tr->steps[i];
            const struct fact *f = fact_of(st->kind);
            letters(&st->from, k, from);
            letters(&st->to, k, to);
            seen[st->kind] = true;
            if (f->where == NO_AXIS) {
                assert_int_equal(st->axis, -1);
                assert_string_equal(from, to);
                continue;
            }
            if (!fact_allows(f, from, k, st->axis))
                fail_msg("T%d of %s/%s/%s: %s on axis %d of %s", t + 1, w, g, o, f->name, st->axis, from);
            char want[MF_MAX_AXES + 1];
            memcpy(want, from, sizeof want);
            want[st->axis] = "RFP"[f->becomes];
            assert_string_equal(to, want);
            mf_placement moved;
            assert_true(mf_struct_move(st->kind, st->axis, k, &st->from, &moved));
            assert_true(mf_placement_equal(&moved, &st->to, k));
        }
    }
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static void test_search_agrees(void **state)
{
    (void)state;
    bool seen[MF_OPKIND_COUNT] = {0};
    check_layout_steps("RF", "PF", "RF", 4096, seen);      /* HSDP */
    check_layout_steps("RF", "PF", "FF", 4096, seen);      /* HFSDP */
    check_layout_steps("FF", "FF", "FF", 4096, seen);      /* 2-D FSDP */
    check_layout_steps("RF", "PP", "RF", 4096, seen);      /* no-sync */
    check_layout_steps("RR", "PF", "FF", 4096, seen);      /* ZeRO-2 inner, ZeRO-1 outer */
    check_layout_steps("RF", "PP", "RR", 4096, seen);      /* DDP master: T1 slices */
    check_layout_steps("RR", "PP", "RR", 1 << 20, seen);   /* bandwidth-bound T4: RS, AR, AG */
    for (int kind = 0; kind < MF_OPKIND_COUNT; kind++)
        if (kind != MF_OP_RECORD && kind != MF_OP_WAIT && !seen[kind])
            fail_msg("no layout made the search use %s", mf_opkind_name((mf_opkind)kind));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_rows),      cmocka_unit_test(test_op_for_move),
        cmocka_unit_test(test_move_cases),      cmocka_unit_test(test_move_exhaustive),
        cmocka_unit_test(test_search_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
