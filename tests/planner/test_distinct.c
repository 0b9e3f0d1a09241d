/*
 * The Distinct placement (docs/semantics.md §1, docs/semantics.md §4.7; issue #42): the
 * checker's acceptance and located refusals, transitions that never touch a
 * Distinct axis on 3-D meshes (HSDP, HFSDP, ZeRO-3 and DDP variants), the
 * bytes per rank of schedules/deepseek_moe_ep.mfsdp against the ring bound
 * per group computed by hand, format 6 and the loader's round trip, and the
 * refusals of a schedule edited by hand to run an op on a Distinct axis.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_layout.h"
#include "mf_struct.h"
#include "sched_test.h"

static mf_schedule *compile(const char *text)
{
    char *diag = NULL;
    mf_schedule *s = st_compile("d.mfsdp", text, true, &diag);
    if (!s)
        fail_msg("compile failed:\n%s", diag ? diag : "");
    free(diag);
    return s;
}

/* The spec is refused; the diagnostics contain `want` and `at` (a location). */
static void refused_spec(const char *text, const char *at, const char *want)
{
    char *diag = NULL;
    mf_schedule *s = st_compile("d.mfsdp", text, false, &diag);
    if (s)
        fail_msg("accepted:\n%s", text);
    if (!diag || !strstr(diag, want))
        fail_msg("diagnostics lack '%s':\n%s", want, diag ? diag : "");
    if (at && !strstr(diag, at))
        fail_msg("diagnostics lack the location '%s':\n%s", at, diag);
    free(diag);
}

#define MESH3 "mesh dp_outer = 2, ep = 2, dp_inner = 2;\n"
#define LAYOUT(name, w, g, o)                                                                              \
    "layout " name " {\n  weight fp32 [" w "];\n  grad fp32 [" g "];\n  main_weight fp32 [" o "];\n}\n"
#define UNITS(name)                                                                                        \
    "unit \"u{i}\" for i in 0..3 layout " name " {\n  tensor \"a\" [37, 11];\n  tensor \"b\" [300];\n}\n"

/* Legal: Distinct on ep in all three roles, with Flat inside it (the suffix
 * rule counts Distinct like Replicate) and with Whole on the other axes. */
static void test_accepted(void **state)
{
    (void)state;
    mf_schedule *s = compile(MESH3 LAYOUT("x", "Replicate, Distinct, Flat", "Partial, Distinct, Flat",
                                          "Replicate, Distinct, Flat") UNITS("x"));
    const mf_bucket *bk = &s->buckets[0];
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        assert_int_equal(bk->place[r].p[1], MF_PLACE_DISTINCT);
    /* a Distinct axis does not divide the buffer: 2 shards (dp_inner), not 4 */
    assert_int_equal(mf_layout_shards(&s->mesh, &bk->place[MF_ROLE_MAIN_WEIGHT]), 2);
    mf_schedule_free(s);
    s = compile(MESH3 LAYOUT("w", "Replicate, Distinct, Flat", "Partial, Distinct, Whole",
                             "Replicate, Distinct, Whole") UNITS("w"));
    assert_true(s->buckets[0].whole[MF_ROLE_GRAD]);
    mf_schedule_free(s);
    /* the built-in ep_experts: [R, D, F] / [P, D, F] / [R, D, F] */
    s = compile(MESH3 UNITS("ep_experts"));
    static const uint8_t want[MF_ROLE_COUNT][3] = {
        {MF_PLACE_REPLICATE, MF_PLACE_DISTINCT, MF_PLACE_FLAT},
        {MF_PLACE_PARTIAL, MF_PLACE_DISTINCT, MF_PLACE_FLAT},
        {MF_PLACE_REPLICATE, MF_PLACE_DISTINCT, MF_PLACE_FLAT},
    };
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        assert_memory_equal(s->buckets[0].place[r].p, want[r], 3);
    mf_schedule_free(s);
}

/* Mixtures are refused at the offending entry, with a note at a Distinct
 * one; so is the suffix rule's break and a misspelling. */
static void test_refused(void **state)
{
    (void)state;
    /* grad Partial where weight is Distinct: line 4 "  grad fp32 [Partial, Partial, Flat];", the
     * second entry at column 23 */
    refused_spec(MESH3 LAYOUT("m", "Replicate, Distinct, Flat", "Partial, Partial, Flat",
                              "Replicate, Distinct, Flat") UNITS("m"),
                 "d.mfsdp:4:23: error: 'grad' is Partial on axis 'ep' in layout 'm', where 'weight' is Distinct",
                 "would need communication across distinct tensors: weight, grad and main_weight must all be "
                 "Distinct on 'ep', or none");
    refused_spec(MESH3 LAYOUT("m", "Replicate, Distinct, Flat", "Partial, Partial, Flat",
                              "Replicate, Distinct, Flat") UNITS("m"),
                 "d.mfsdp:3:27: note: weight is Distinct on 'ep' here", "error");
    /* Distinct in main_weight only: weight and grad are each reported */
    char *diag = NULL;
    assert_null(st_compile("d.mfsdp",
                           MESH3 LAYOUT("o", "Replicate, Replicate, Flat", "Partial, Partial, Flat",
                                        "Replicate, Distinct, Flat") UNITS("o"),
                           false, &diag));
    assert_non_null(strstr(diag, "d.mfsdp:3:27: error: 'weight' is Replicate on axis 'ep' in layout 'o', where "
                                 "'main_weight' is Distinct"));
    assert_non_null(strstr(diag, "d.mfsdp:4:23: error: 'grad' is Partial on axis 'ep' in layout 'o', where "
                                 "'main_weight' is Distinct"));
    free(diag);
    /* Flat outside a Distinct axis breaks the suffix rule */
    refused_spec(MESH3 LAYOUT("f", "Flat, Distinct, Flat", "Flat, Distinct, Flat", "Flat, Distinct, Flat")
                     UNITS("f"),
                 "d.mfsdp:3:15: error: placement [Flat, Distinct, Flat] of 'weight'",
                 "axis 'dp_outer' is Flat but axis 'ep' inside it is Distinct; Flat axes must be the innermost, e.g. "
                 "[Distinct, Flat, Flat]");
    refused_spec(MESH3 LAYOUT("t", "Replicate, Distinkt, Flat", "Partial, Distinct, Flat",
                              "Replicate, Distinct, Flat") UNITS("t"),
                 "d.mfsdp:3:27:", "unknown placement 'Distinkt' for 'weight' in layout 't'; did you mean 'Distinct'?");
}

/* Every op of every bucket with a Distinct axis runs on another axis; the
 * variants still communicate on the others, and verify. */
static void test_no_op_on_distinct(void **state)
{
    (void)state;
    static const struct {
        const char *mesh, *w, *g, *o;
        int d;                  /* the Distinct axis */
        int collectives;        /* at least this many per step on the other axes */
    } v[] = {
        /* HSDP inside each ep coordinate */
        {MESH3, "Replicate, Distinct, Flat", "Partial, Distinct, Flat", "Replicate, Distinct, Flat", 1, 3},
        /* HFSDP over dp_outer x dp_inner per expert set (ep outermost) */
        {"mesh ep = 2, dp_outer = 2, dp_inner = 2;\n", "Distinct, Replicate, Flat", "Distinct, Partial, Flat",
         "Distinct, Flat, Flat", 0, 3},
        /* ZeRO-3 over the other two axes */
        {"mesh ep = 2, dp_outer = 2, dp_inner = 2;\n", "Distinct, Flat, Flat", "Distinct, Flat, Flat",
         "Distinct, Flat, Flat", 0, 4},
        /* DDP with Distinct innermost (a TP-like axis) */
        {"mesh dp_outer = 2, dp_inner = 2, tp = 2;\n", "Replicate, Replicate, Distinct",
         "Partial, Partial, Distinct", "Replicate, Replicate, Distinct", 2, 1},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char spec[2048];
        snprintf(spec, sizeof spec,
                 "%smicrobatches 3;\nlayout x {\n  weight bf16 [%s];\n  grad fp32 [%s];\n  main_weight fp32 [%s];\n}\n"
                 UNITS("x"),
                 v[i].mesh, v[i].w, v[i].g, v[i].o);
        mf_schedule *s = compile(spec);
        int on_other = 0;
        for (int k = 0; k < s->nops; k++) {
            const mf_op *op = &s->ops[k];
            if (op->axis < 0)
                continue;
            if (op->axis == v[i].d)
                fail_msg("variant %zu: op %d (%s) runs on the Distinct axis", i, k, mf_opkind_name(op->kind));
            on_other += mf_opkind_is_collective(op->kind) && op->unit == 0 && op->phase != MF_PHASE_EVAL_PRE &&
                        op->when != MF_WHEN_SHORT;
        }
        if (on_other < v[i].collectives)
            fail_msg("variant %zu: %d collectives of unit u0 on the other axes, expected at least %d", i, on_other,
                     v[i].collectives);
        assert_int_equal(s->summary.bytes[v[i].d], 0);
        assert_int_equal(st_verify(s, NULL), 0);
        mf_schedule_free(s);
    }
}

/* schedules/deepseek_moe_ep.mfsdp: an expert bucket holds 32 experts of
 * 3 x 176 x 512 = 270336 elements: L = 8650752 per ep coordinate (a multiple
 * of every quantum, no padding). Its ops, ring bound per group (n = 2):
 *   T2 all_gather dp_inner, bf16, sendcount L/2 = 4325376: (2-1) * 4325376 * 2 = 8650752
 *   T3 reduce_scatter dp_inner, fp32, recvcount 4325376: (2-1) * 4325376 * 4 = 17301504
 *   T4 all_reduce dp_outer, fp32, count 4325376: 2 (2-1) ceil(4325376/2) * 4 = 17301504
 * and nothing on ep. */
static void test_ep_example_bytes(void **state)
{
    (void)state;
    size_t len = 0;
    char *text = st_read("schedules/deepseek_moe_ep.mfsdp", &len);
    assert_non_null(text);
    mf_schedule *s = compile(text);
    free(text);
    int b = st_bucket(s, "layers.2/experts");
    assert_true(b >= 0);
    assert_int_equal(s->buckets[b].length, 8650752);
    static const struct {
        int kind, axis, transition;
        int64_t bytes;
    } want[] = {
        {MF_OP_ALL_GATHER, 2, 2, 8650752},
        {MF_OP_REDUCE_SCATTER, 2, 3, 17301504},
        {MF_OP_ALL_REDUCE, 0, 4, 17301504},
    };
    int seen[3] = {0};
    for (int k = 0; k < s->nops; k++) {
        const mf_op *op = &s->ops[k];
        if (op->bucket != b || !mf_opkind_is_collective(op->kind))
            continue;
        assert_int_not_equal(op->axis, 1);
        int hit = -1;
        for (int i = 0; i < 3; i++)
            if ((int)op->kind == want[i].kind && op->axis == want[i].axis && op->transition == want[i].transition)
                hit = i;
        if (hit < 0)
            fail_msg("unexpected %s on axis %d (T%d)", mf_opkind_name(op->kind), op->axis, op->transition);
        assert_int_equal(mf_layout_op_bytes(s, op), want[hit].bytes);
        seen[hit]++;
    }
    for (int i = 0; i < 3; i++)
        assert_true(seen[i] > 0);
    mf_schedule_free(s);
}

/* Small EP schedule for the format tests. */
static mf_schedule *small_ep(void)
{
    return compile(MESH3 LAYOUT("x", "Replicate, Distinct, Flat", "Partial, Distinct, Flat",
                                "Replicate, Distinct, Flat")
                       LAYOUT("dense", "Replicate, Flat, Flat", "Partial, Flat, Flat", "Replicate, Flat, Flat")
                           "unit \"u{i}\" for i in 0..2 layout dense {\n  tensor \"a\" [37, 11];\n"
                           "  tensor \"e\" [300] layout x;\n}\n");
}

/* Format 6, Distinct written on every role and buffer of the expert
 * bucket, and emit -> load -> emit gives the same bytes. */
static void test_format_roundtrip(void **state)
{
    (void)state;
    mf_schedule *s = small_ep();
    size_t n = 0;
    char *y = st_emit(s, &n);
    assert_non_null(strstr(y, "format: mfsdp-schedule/6\n"));
    assert_non_null(strstr(y, "weight: {dtype: fp32, placement: [Replicate, Distinct, Flat]}"));
    assert_non_null(strstr(y, "kind: grad_local, dtype: fp32, placement: [Partial, Distinct, Partial]"));
    assert_non_null(strstr(y, "kind: weight_full, dtype: fp32, placement: [Replicate, Distinct, Replicate]"));
    char err[1024];
    mf_schedule *back = mf_load_schedule_buffer("t.yaml", y, n, err, sizeof err);
    if (!back)
        fail_msg("%s", err);
    assert_int_equal(back->buckets[st_bucket(back, "u0/x")].place[MF_ROLE_GRAD].p[1], MF_PLACE_DISTINCT);
    char *y2 = st_emit(back, NULL);
    assert_string_equal(y, y2);
    assert_int_equal(st_verify(back, NULL), 0);
    free(y2);
    free(y);
    mf_schedule_free(back);
    mf_schedule_free(s);

    /* without a Distinct axis the same spec keeps format 4 */
    s = compile(MESH3 LAYOUT("dense", "Replicate, Flat, Flat", "Partial, Flat, Flat", "Replicate, Flat, Flat")
                    UNITS("dense"));
    y = st_emit(s, NULL);
    assert_non_null(strstr(y, "format: mfsdp-schedule/4\n"));
    free(y);
    mf_schedule_free(s);
}

static void load_refused(const char *yaml, const char *find, const char *repl, const char *want)
{
    char *bad = st_replace(yaml, find, repl), err[1024];
    mf_schedule *s = mf_load_schedule_buffer("t.yaml", bad, strlen(bad), err, sizeof err);
    if (s)
        fail_msg("accepted after replacing '%s' by '%s'", find, repl);
    if (!strstr(err, want))
        fail_msg("message '%s' lacks '%s'", err, want);
    free(bad);
}

/* A schedule edited by hand: the loader, the structural checker and the
 * verifier refuse an op on the Distinct axis, a Distinct axis in one role
 * only, and Distinct in an older format. */
static void test_edited_refused(void **state)
{
    (void)state;
    mf_schedule *s = small_ep();
    int b = st_bucket(s, "u0/x");
    int g = st_find_op(s, -1, -1, MF_OP_ALL_GATHER, -1, 2, b, 2);
    assert_true(g >= 0);
    char *y = st_emit(s, NULL);
    /* the T2 all-gather of u0/x moved from dp_inner to ep */
    char find[256], repl[256];
    snprintf(find, sizeof find, "op: all_gather, transition: T2, bucket: u0/x, axis: dp_inner");
    snprintf(repl, sizeof repl, "op: all_gather, transition: T2, bucket: u0/x, axis: ep");
    load_refused(y, find, repl, "all_gather on axis 'ep', which is Distinct in bucket 'u0/x'");
    load_refused(y, "format: mfsdp-schedule/6", "format: mfsdp-schedule/5",
                 "placement 'Distinct' needs format mfsdp-schedule/6 (the file says mfsdp-schedule/5)");
    load_refused(y, "grad: {dtype: fp32, placement: [Partial, Distinct, Flat]}",
                 "grad: {dtype: fp32, placement: [Partial, Partial, Flat]}",
                 "bucket 'u0/x': axis 'ep' is Distinct in 2 of its 3 roles");
    free(y);

    /* in memory: the verifier (strict structural check) */
    char *diag = NULL;
    s->ops[g].axis = 1;
    assert_true(st_verify(s, &diag) > 0);
    assert_non_null(strstr(diag, "all_gather on axis 'ep', which is Distinct in bucket 'u0/x': each coordinate of a "
                                 "Distinct axis holds a different tensor, so no op may run on it"));
    free(diag);
    s->ops[g].axis = 2;
    assert_int_equal(st_verify(s, NULL), 0);
    char err[1024];
    s->buckets[b].place[MF_ROLE_MAIN_WEIGHT].p[1] = MF_PLACE_REPLICATE;
    assert_false(mf_struct_check_first(s, err, sizeof err));
    assert_non_null(strstr(err, "axis 'ep' is Distinct in 2 of its 3 roles"));
    mf_schedule_free(s);
}

/* Global names (docs/language.md §3.4, docs/schedule.md): the spec's
 * rename and split clauses give each tensor its global names, the key
 * `global` carries them through emit -> load -> emit byte for byte, and the
 * loader refuses a wrong count, a repeated name, a split past the dims and
 * names on a tensor Distinct on no axis. */
static void test_global_roundtrip(void **state)
{
    (void)state;
    mf_schedule *s = compile(MESH3 LAYOUT("x", "Replicate, Distinct, Flat", "Partial, Distinct, Flat",
                                          "Replicate, Distinct, Flat")
                                 LAYOUT("dense", "Replicate, Flat, Flat", "Partial, Flat, Flat", "Replicate, Flat, Flat")
                                     "unit \"u{i}\" for i in 0..2 layout dense {\n  tensor \"a\" [37, 11];\n"
                                     "  for e in 0..3 {\n    tensor \"e{e}\" [30] layout x global \"g{3*ep+e}\";\n  }\n"
                                     "  tensor \"t\" [6, 5] layout x global \"tp\" split 1;\n}\n");
    const mf_bucket *bk = &s->buckets[st_bucket(s, "u1/x")];
    assert_int_equal(bk->ntensors, 4);
    const mf_tensor *e2 = &bk->tensors[2], *t = &bk->tensors[3];
    assert_string_equal(e2->name, "u1.e2");
    assert_int_equal(e2->nglobal, 2);
    assert_false(e2->global_split);
    assert_string_equal(e2->global[0], "u1.g2");
    assert_string_equal(e2->global[1], "u1.g5");
    assert_true(t->global_split);
    assert_int_equal(t->global_dim, 1);
    assert_int_equal(t->nglobal, 1);
    assert_string_equal(t->global[0], "u1.tp");
    assert_int_equal(s->buckets[st_bucket(s, "u1/dense")].tensors[0].nglobal, 0);
    size_t n = 0;
    char *y = st_emit(s, &n);
    assert_non_null(strstr(y, "{name: u1.e2, offset: "));
    assert_non_null(strstr(y, "dims: [30], global: [u1.g2, u1.g5]}"));
    assert_non_null(strstr(y, "dims: [6, 5], global: {name: u1.tp, split: 1}}"));
    char err[1024];
    mf_schedule *back = mf_load_schedule_buffer("t.yaml", y, n, err, sizeof err);
    if (!back)
        fail_msg("%s", err);
    const mf_tensor *b2 = &back->buckets[st_bucket(back, "u1/x")].tensors[2];
    assert_int_equal(b2->nglobal, 2);
    assert_string_equal(b2->global[1], "u1.g5");
    char *y2 = st_emit(back, NULL);
    assert_string_equal(y, y2);
    free(y2);
    mf_schedule_free(back);
    load_refused(y, "global: [u1.g2, u1.g5]", "global: [u1.g2]",
                 "tensor 'u1.e2' has 1 global names, expected 2");
    load_refused(y, "global: [u1.g2, u1.g5]", "global: [u1.g2, u1.g4]",
                 "global name 'u1.g4' of tensor 'u1.e2' is already a global tensor name");
    load_refused(y, "global: {name: u1.tp, split: 1}", "global: {name: u1.tp, split: 2}",
                 "split 2 of tensor 'u1.t' is out of range: it has 2 dims");
    load_refused(y, "global: {name: u1.tp, split: 1}", "global: {name: u1.a, split: 1}",
                 "global name 'u1.a' of tensor 'u1.t' is already a global tensor name");
    load_refused(y, "dims: [37, 11]}", "dims: [37, 11], global: [p, q]}",
                 "tensor 'u0.a' has global names but bucket 'u0/dense' is Distinct on no axis");
    free(y);
    mf_schedule_free(s);

    /* the compiler's refusals, located */
    refused_spec(MESH3 LAYOUT("x", "Replicate, Distinct, Flat", "Partial, Distinct, Flat", "Replicate, Distinct, Flat")
                     "unit \"u\" layout x {\n  tensor \"a\" [4] global \"g{f}\";\n}\n",
                 "d.mfsdp:8:27:", "unknown name 'f' in the global template \"g{f}\"");
    refused_spec(MESH3 LAYOUT("x", "Replicate, Distinct, Flat", "Partial, Distinct, Flat", "Replicate, Distinct, Flat")
                     "unit \"u\" layout x {\n  tensor \"a\" [4] global \"g\";\n}\n",
                 "d.mfsdp:8:", "repeats for two coordinates of its Distinct axes");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted),         cmocka_unit_test(test_refused),
        cmocka_unit_test(test_no_op_on_distinct), cmocka_unit_test(test_ep_example_bytes),
        cmocka_unit_test(test_format_roundtrip), cmocka_unit_test(test_edited_refused),
        cmocka_unit_test(test_global_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
