/*
 * The semantic pass (planner/passes/mf_sema.c) on small specs given as text: what
 * it resolves (mesh, defaults, loop expansion, names, sizes, layout indices,
 * overrides and inline layouts) against hand-worked values, and which
 * weight/grad/main_weight triples it accepts on one axis against the
 * hand-worked legality table of docs/semantics.md (the rules themselves live
 * in planner/passes/mf_trans_rules.h).
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

typedef struct checked {
    mf_compilation c;
    char *diag;
    size_t len;
    int rc;
} checked;

/* Runs parse + sema on text; the diagnostics land in k->diag. */
static void sema(checked *k, const char *text)
{
    FILE *out = open_memstream(&k->diag, &k->len);
    assert_non_null(out);
    mf_compile_options opt = {.stop_after = MF_STAGE_SEMA, .diag_out = out};
    k->rc = mf_pipeline_compile_buffer("t.mfsdp", text, strlen(text), &opt, &k->c);
    fclose(out);
}

static void release(checked *k)
{
    mf_compilation_free(&k->c);
    free(k->diag);
}

static const char *const small_spec =
    "mesh outer = 2, inner = 3;\n"
    "microbatches 4;\n"
    "layout z {\n"
    "  weight bf16 [Replicate, Flat];\n"
    "  grad fp32 [Partial, Flat];\n"
    "  main_weight fp32 [Flat, Flat];\n"
    "}\n"
    "layout r {\n"
    "  weight fp32 [Replicate, Replicate];\n"
    "  grad fp32 [Partial, Partial];\n"
    "  main_weight fp32 [Replicate, Replicate];\n"
    "}\n"
    "unit \"l.{i}\" for i in 1..3 layout z {\n"
    "  tensor \"w\" [5, 7];\n"
    "  tensor \"n\" [7] layout r;\n"
    "}\n"
    "unit \"head\" layout z {\n"
    "  reshard_after_forward false;\n"
    "  tensor \"o\" [2, 3, 4] { weight fp16 [Replicate, Flat]; grad fp32 [Partial, Flat];"
    " main_weight fp32 [Flat, Flat]; }\n"
    "}\n";

/* Hand-worked: what the semantic pass must resolve small_spec into. */
static const struct {
    const char *unit, *tensor; /* full names */
    int ndims;
    int64_t numel;
    const char *layout;     /* NULL: an inline layout */
} small_tensors[] = {
    {"l.1", "l.1.w", 2, 35, "z"},
    {"l.1", "l.1.n", 1, 7, "r"},
    {"l.2", "l.2.w", 2, 35, "z"},
    {"l.2", "l.2.n", 1, 7, "r"},
    {"head", "head.o", 3, 24, NULL},
};

static void test_resolves_a_small_spec(void **state)
{
    (void)state;
    checked k = {0};
    sema(&k, small_spec);
    if (k.rc != 0 || k.len != 0)
        fail_msg("expected a clean check, got %d:\n%s", k.rc, k.diag);
    const mf_spec *s = k.c.spec;
    assert_non_null(s);
    /* mesh, then the defaults of everything the spec leaves out */
    int64_t header[] = {s->mesh.naxes, s->mesh.axes[1].size, s->mesh.world, s->microbatches, s->reduce,
                        s->align, s->prefetch, s->bucket_size};
    int64_t want[] = {2, 3, 6, 4, MF_REDUCE_AVG, 256, 1, 0};
    assert_memory_equal(header, want, sizeof want);
    assert_string_equal(s->mesh.axes[0].name, "outer");
    /* for i in 1..3 is half-open: l.1 and l.2, then head (which keeps its
     * weight after forward); tensors in declaration order */
    int n = 0;
    for (int u = 0; u < s->nunits; u++) {
        assert_int_equal(s->units[u].reshard_after_forward, u < 2);
        for (int t = 0; t < s->units[u].ntensors; t++, n++) {
            const mf_spec_tensor *te = &s->units[u].tensors[t];
            assert_true(n < (int)(sizeof small_tensors / sizeof small_tensors[0]));
            assert_string_equal(s->units[u].name, small_tensors[n].unit);
            assert_string_equal(te->name, small_tensors[n].tensor);
            assert_int_equal(te->ndims, small_tensors[n].ndims);
            assert_int_equal(te->numel, small_tensors[n].numel);
            const mf_spec_layout *l = &s->layouts[te->layout];
            if (small_tensors[n].layout)
                assert_string_equal(l->name, small_tensors[n].layout);
            else
                assert_true(l->is_inline && l->dtype[MF_ROLE_WEIGHT] == MF_FP16 &&
                            l->place[MF_ROLE_GRAD].p[0] == MF_PLACE_PARTIAL);
        }
    }
    assert_int_equal(n, 5);
    /* the named layout as declared */
    const mf_spec_layout *z = &s->layouts[s->units[0].layout];
    assert_true(z->dtype[MF_ROLE_WEIGHT] == MF_BF16 && z->place[MF_ROLE_WEIGHT].p[0] == MF_PLACE_REPLICATE &&
                z->place[MF_ROLE_WEIGHT].p[1] == MF_PLACE_FLAT);
    release(&k);
}

/*
 * On one axis (no suffix rule to break), hand-worked from the four
 * transitions: weight and main_weight may not be Partial (T1, T2 move
 * weights, which have no partial sums); T4 cannot turn a Flat gradient into
 * a Replicate main_weight (that would all-gather a gradient). Every other
 * triple is legal: 2 (W) x 3 (G) x 2 (O) - 2 (G = F, O = R) = 10.
 */
static bool legal_1d(char w, char g, char o)
{
    return w != 'P' && o != 'P' && !(g == 'F' && o == 'R');
}

static const char *place_word(char c)
{
    return c == 'R' ? "Replicate" : c == 'F' ? "Flat" : "Partial";
}

static void test_legality_on_one_axis(void **state)
{
    (void)state;
    static const char letters[] = "RFP";
    int accepted = 0;
    for (int iw = 0; iw < 3; iw++)
        for (int ig = 0; ig < 3; ig++)
            for (int io = 0; io < 3; io++) {
                char w = letters[iw], g = letters[ig], o = letters[io];
                char text[512];
                snprintf(text, sizeof text,
                         "mesh dp = 4;\nlayout l {\n  weight bf16 [%s];\n  grad fp32 [%s];\n"
                         "  main_weight fp32 [%s];\n}\nunit \"u\" layout l {\n  tensor \"w\" [8];\n}\n",
                         place_word(w), place_word(g), place_word(o));
                checked k = {0};
                sema(&k, text);
                bool ok = k.rc == 0 && k.len == 0;
                if (ok != legal_1d(w, g, o))
                    fail_msg("W %c G %c O %c: %s, expected %s:\n%s", w, g, o, ok ? "accepted" : "rejected",
                             legal_1d(w, g, o) ? "legal" : "illegal", k.diag ? k.diag : "");
                if (!ok && !strstr(k.diag, "t.mfsdp:"))
                    fail_msg("W %c G %c O %c: unlocated diagnostic:\n%s", w, g, o, k.diag);
                accepted += ok;
                release(&k);
            }
    assert_int_equal(accepted, 10);
}

/* The suffix rule on two axes: Flat outside a non-Flat axis is refused
 * with the placement to use instead. */
static void test_suffix_rule(void **state)
{
    (void)state;
    checked k = {0};
    sema(&k, "mesh a = 2, b = 2;\nlayout l {\n  weight bf16 [Flat, Replicate];\n  grad fp32 [Partial, Flat];\n"
             "  main_weight fp32 [Flat, Flat];\n}\nunit \"u\" layout l {\n  tensor \"w\" [8];\n}\n");
    assert_int_equal(k.rc, 1);
    assert_non_null(strstr(k.diag, "t.mfsdp:3:15: error: placement [Flat, Replicate] of 'weight' in layout 'l' "
                                   "breaks the suffix rule: axis 'a' is Flat but axis 'b' inside it is Replicate; "
                                   "Flat axes must be the innermost, e.g. [Replicate, Flat]"));
    release(&k);
}

static const struct CMUnitTest sema_tests[] = {
    cmocka_unit_test(test_resolves_a_small_spec),
    cmocka_unit_test(test_legality_on_one_axis),
    cmocka_unit_test(test_suffix_rule),
};

int main(void)
{
    return cmocka_run_group_tests(sema_tests, NULL, NULL);
}
