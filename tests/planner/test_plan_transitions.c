/*
 * The transition planner (docs/semantics.md §2, docs/semantics.md §4): for EVERY legal (weight, grad,
 * main_weight) placement triple on 2-D and 3-D meshes (axis sizes 1..5), the
 * composed steps of T1..T4, executed on per-rank arrays by the op-semantics
 * simulator of plan_testlib, produce exactly what each intermediate and the
 * target placement promise (reduce avg and sum, several microbatches).
 * Every illegal triple is rejected with a located message naming the unit,
 * role, axis and a fix. Random property tests cover meshes of 1..4 axes of
 * sizes 1..5 with uneven tensors and random dtypes. Known decompositions are
 * checked step by step, and the composition choice is shown to depend on the
 * message size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_testlib.h"

/* All placements over {R,F,P}^k satisfying the suffix rule; with_p = false
 * leaves out those with a Partial axis. */
static int placements(int k, bool with_p, bool suffix_only, char out[][MF_MAX_AXES + 1])
{
    int n = 0, total = 1;
    for (int j = 0; j < k; j++)
        total *= 3;
    for (int code = 0; code < total; code++) {
        char s[MF_MAX_AXES + 1] = {0};
        int c = code;
        bool has_p = false;
        for (int j = 0; j < k; j++, c /= 3) {
            s[j] = "RFP"[c % 3];
            has_p = has_p || s[j] == 'P';
        }
        mf_placement p = tl_place(s);
        if ((!with_p && has_p) || (suffix_only && !mf_layout_flat_suffix_ok(&p, k)))
            continue;
        memcpy(out[n++], s, MF_MAX_AXES + 1);
    }
    return n;
}

static bool t4_legal(const char *g, const char *o)
{
    for (int j = 0; g[j]; j++)
        if (g[j] == 'F' && o[j] == 'R')
            return false;
    return true;
}

/* One bucket with uneven tensors under (w, g, o); checks the whole plan. */
static void check_triple(int k, const int64_t *sizes, const char *w, const char *g, const char *o, mf_reduce red,
                         int64_t mb, mf_dtype dw)
{
    mf_arena *a = mf_arena_create();
    mf_spec *s = tl_spec_new(a, k, sizes, mb, red);
    s->align = 64;
    int l = tl_layout(a, s, "x", w, dw, g, MF_FP32, o, MF_FP32);
    int u = tl_unit(a, s, "u", l, true);
    tl_tensor(a, s, u, "w", 37, -1);
    tl_tensor(a, s, u, "v", 11, -1);
    char *diag = NULL;
    mf_plan *p = tl_plan(s, NULL, &diag);
    if (!p)
        fail_msg("W %s G %s O %s: %s", w, g, o, diag);
    free(diag);
    tl_check_plan(p, INT64_MAX);
    /* T2 gathers exactly the Flat axes of W, outermost first */
    int flats = 0;
    for (int j = 0; j < k; j++)
        flats += w[j] == 'F';
    assert_int_equal(p->trans[0][MF_T2].nsteps, flats);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static void exhaustive(int k, const int64_t *sizes)
{
    char wo[81][MF_MAX_AXES + 1], gs[81][MF_MAX_AXES + 1];
    int nwo = placements(k, false, true, wo), ng = placements(k, true, true, gs);
    int checked = 0;
    for (int iw = 0; iw < nwo; iw++)
        for (int ig = 0; ig < ng; ig++)
            for (int io = 0; io < nwo; io++) {
                if (!t4_legal(gs[ig], wo[io]))
                    continue;
                mf_reduce red = (iw + ig + io) % 2 ? MF_REDUCE_SUM : MF_REDUCE_AVG;
                check_triple(k, sizes, wo[iw], gs[ig], wo[io], red, 2, MF_BF16);
                checked++;
            }
    assert_true(checked > 0);
}

static void test_every_legal_triple_2d(void **state)
{
    (void)state;
    const int64_t meshes[][2] = {{2, 3}, {3, 5}, {5, 2}, {1, 4}, {3, 1}};
    for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++)
        exhaustive(2, meshes[i]);
}

static void test_every_legal_triple_3d(void **state)
{
    (void)state;
    const int64_t meshes[][3] = {{2, 3, 2}, {3, 1, 5}, {2, 2, 2}};
    for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++)
        exhaustive(3, meshes[i]);
}

static void test_wide_weight_gathers_in_main_dtype(void **state)
{
    (void)state;
    /* weight fp32, main_weight fp16 (unusual): gather fp16, cast last */
    const int64_t sizes[] = {2, 3};
    mf_arena *a = mf_arena_create();
    mf_spec *s = tl_spec_new(a, 2, sizes, 1, MF_REDUCE_AVG);
    int l = tl_layout(a, s, "x", "RF", MF_FP32, "PF", MF_FP32, "FF", MF_FP16);
    int u = tl_unit(a, s, "u", l, true);
    tl_tensor(a, s, u, "w", 100, -1);
    mf_plan *p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    const mf_transition *t1 = &p->trans[0][MF_T1];
    assert_int_equal(t1->nsteps, 2);
    assert_int_equal(t1->steps[0].kind, MF_OP_ALL_GATHER);
    assert_int_equal(t1->steps[0].dtype, MF_FP16);
    assert_int_equal(t1->steps[1].kind, MF_OP_CAST);
    assert_int_equal(t1->steps[1].dtype, MF_FP32);
    tl_check_plan(p, INT64_MAX);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

/* ---- illegal triples ---- */

static void expect_rejected(const char *w, const char *g, const char *o, int role, const char *axis,
                            const char *needle)
{
    const int64_t sizes[] = {2, 3};
    mf_arena *a = mf_arena_create();
    mf_spec *s = tl_spec_new(a, 2, sizes, 1, MF_REDUCE_AVG);
    int l = tl_layout(a, s, "bad", w, MF_BF16, g, MF_FP32, o, MF_FP32);
    int u = tl_unit(a, s, "layer", l, true);
    tl_tensor(a, s, u, "w", 100, -1);
    tl_tensor(a, s, u, "b", 10, -1);
    char *diag = NULL;
    mf_plan *p = tl_plan(s, NULL, &diag);
    if (p)
        fail_msg("W %s G %s O %s was accepted", w, g, o);
    char want[256];
    snprintf(want, sizeof want, "test.mfsdp:%d:3: error: unit 'layer', %s, axis '%s': ", 101 + role,
             mf_role_name((mf_role)role), axis);
    if (!strstr(diag, want) || (needle && !strstr(diag, needle)))
        fail_msg("W %s G %s O %s: expected '%s'%s%s, got:\n%s", w, g, o, want, needle ? " and " : "",
                 needle ? needle : "", diag);
    /* one diagnosis per layout, however many buckets use it */
    assert_null(strstr(strstr(diag, want) + 1, want));
    free(diag);
    mf_arena_destroy(a);
}

static void test_illegal_triples_rejected(void **state)
{
    (void)state;
    /* the semantic pass's messages (mf_trans_rules_check_layout), located at the unit */
    expect_rejected("PF", "PF", "FF", MF_ROLE_WEIGHT, "a0",
                    "'weight' may not be Partial (axis 'a0' in layout 'bad'); only grad may be Partial");
    expect_rejected("RF", "PF", "PF", MF_ROLE_MAIN_WEIGHT, "a0", "'main_weight' may not be Partial");
    expect_rejected("FR", "PF", "FF", MF_ROLE_WEIGHT, "a0", "Flat axes must be the innermost, e.g. [Replicate, Flat]");
    expect_rejected("RF", "FP", "FF", MF_ROLE_GRAD, "a0",
                    "axis 'a0' is Flat but axis 'a1' inside it is Partial; Flat axes must be the innermost, "
                    "e.g. [Partial, Flat]");
    expect_rejected("RF", "PF", "FR", MF_ROLE_MAIN_WEIGHT, "a0", "inside it");
    expect_rejected("RF", "FF", "RF", MF_ROLE_MAIN_WEIGHT, "a0",
                    "T4 (grad -> main_weight, at the last microbatch) cannot go Flat -> Replicate on axis 'a0'");
    expect_rejected("RR", "RF", "RR", MF_ROLE_MAIN_WEIGHT, "a1", "make main_weight Flat on 'a1'");
    /* and exhaustively: every triple outside the legality table is rejected */
    char all[81][MF_MAX_AXES + 1];
    int n = placements(2, true, false, all), rejected = 0;
    for (int iw = 0; iw < n; iw++)
        for (int ig = 0; ig < n; ig++)
            for (int io = 0; io < n; io++) {
                const char *w = all[iw], *g = all[ig], *o = all[io];
                mf_placement pw = tl_place(w), pg = tl_place(g), po = tl_place(o);
                bool legal = !strchr(w, 'P') && !strchr(o, 'P') && mf_layout_flat_suffix_ok(&pw, 2) &&
                             mf_layout_flat_suffix_ok(&pg, 2) && mf_layout_flat_suffix_ok(&po, 2) && t4_legal(g, o);
                if (legal)
                    continue;
                const int64_t sizes[] = {3, 2};
                mf_arena *a = mf_arena_create();
                mf_spec *s = tl_spec_new(a, 2, sizes, 1, MF_REDUCE_AVG);
                int l = tl_layout(a, s, "bad", w, MF_BF16, g, MF_FP32, o, MF_FP32);
                tl_tensor(a, s, tl_unit(a, s, "layer", l, true), "w", 10, -1);
                char *diag = NULL;
                mf_plan *p = tl_plan(s, NULL, &diag);
                if (p)
                    fail_msg("W %s G %s O %s was accepted", w, g, o);
                if (!strstr(diag, "test.mfsdp:10") || !strstr(diag, "unit 'layer'") || !strstr(diag, "axis 'a") ||
                    !(strstr(diag, "; make ") || strstr(diag, "use Replicate or Flat") || strstr(diag, "e.g. [")))
                    fail_msg("W %s G %s O %s: unlocated or vague message:\n%s", w, g, o, diag);
                free(diag);
                mf_arena_destroy(a);
                rejected++;
            }
    assert_true(rejected > 500);
}

/* ---- random property tests ---- */

static void test_random_meshes_and_tensors(void **state)
{
    (void)state;
    uint64_t rng = 20240611;
    static const mf_dtype dtypes[] = {MF_FP32, MF_BF16, MF_FP16};
    static const int64_t aligns[] = {1, 16, 64, 256};
    int done = 0;
    while (done < 400) {
        int k = (int)tl_rand_range(&rng, 1, 4);
        int64_t sizes[MF_MAX_AXES], world = 1;
        for (int j = 0; j < k; j++) {
            sizes[j] = tl_rand_range(&rng, 1, 5);
            world *= sizes[j];
        }
        if (world > 200)
            continue;
        char wo[81][MF_MAX_AXES + 1], gs[81][MF_MAX_AXES + 1];
        int nwo = placements(k, false, true, wo), ng = placements(k, true, true, gs);
        mf_arena *a = mf_arena_create();
        mf_spec *s = tl_spec_new(a, k, sizes, tl_rand_range(&rng, 1, 3),
                                 tl_rand_range(&rng, 0, 1) ? MF_REDUCE_SUM : MF_REDUCE_AVG);
        s->align = aligns[tl_rand_range(&rng, 0, 3)];
        int nl = (int)tl_rand_range(&rng, 1, 3);
        for (int i = 0; i < nl; i++) {
            const char *g = gs[tl_rand_range(&rng, 0, ng - 1)], *o;
            do
                o = wo[tl_rand_range(&rng, 0, nwo - 1)];
            while (!t4_legal(g, o));
            char name[32];
            snprintf(name, sizeof name, "l%d", i);
            tl_layout(a, s, name, wo[tl_rand_range(&rng, 0, nwo - 1)], dtypes[tl_rand_range(&rng, 0, 2)], g,
                      dtypes[tl_rand_range(&rng, 0, 2)], o, dtypes[tl_rand_range(&rng, 0, 2)]);
        }
        int nu = (int)tl_rand_range(&rng, 1, 3);
        for (int i = 0; i < nu; i++) {
            char name[32];
            snprintf(name, sizeof name, "u%d", i);
            int u = tl_unit(a, s, name, (int)tl_rand_range(&rng, 0, nl - 1), tl_rand_range(&rng, 0, 1));
            int nt = (int)tl_rand_range(&rng, 1, 4);
            for (int t = 0; t < nt; t++) {
                snprintf(name, sizeof name, "t%d", t);
                tl_tensor(a, s, u, name, tl_rand_range(&rng, 1, 300),
                          tl_rand_range(&rng, 0, 2) ? -1 : (int)tl_rand_range(&rng, 0, nl - 1));
            }
        }
        if (tl_rand_range(&rng, 0, 3) == 0)
            s->bucket_size = tl_rand_range(&rng, 256, 8192);
        char *diag = NULL;
        mf_plan *p = tl_plan(s, NULL, &diag);
        if (!p)
            fail_msg("random spec %d rejected: %s", done, diag);
        free(diag);
        tl_check_plan(p, 2000000);
        mf_plan_free(p);
        mf_arena_destroy(a);
        done++;
    }
}

/* ---- known decompositions ---- */

static mf_plan *one_bucket(int k, const int64_t *sizes, const char *w, mf_dtype dw, const char *g, const char *o,
                           int64_t numel, const mf_cost_model *cm, mf_arena *a)
{
    mf_spec *s = tl_spec_new(a, k, sizes, 2, MF_REDUCE_AVG);
    int l = tl_layout(a, s, "x", w, dw, g, MF_FP32, o, MF_FP32);
    tl_tensor(a, s, tl_unit(a, s, "u", l, true), "w", numel, -1);
    mf_plan *p = tl_plan(s, cm, NULL);
    assert_non_null(p);
    return p;
}

static void expect_steps(const mf_transition *tr, const char *want)
{
    char got[256] = "";
    for (int i = 0; i < tr->nsteps; i++) {
        char one[48];
        if (tr->steps[i].axis >= 0)
            snprintf(one, sizeof one, "%s%s@%d", i ? " " : "", mf_opkind_name(tr->steps[i].kind), tr->steps[i].axis);
        else
            snprintf(one, sizeof one, "%s%s", i ? " " : "", mf_opkind_name(tr->steps[i].kind));
        strncat(got, one, sizeof got - strlen(got) - 1);
    }
    if (strcmp(got, want) != 0)
        fail_msg("T%d: got '%s', want '%s'", tr->id, got, want);
}

static void test_known_decompositions(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    const int64_t m24[] = {2, 4}, m222[] = {2, 2, 2};
    /* HFSDP */
    mf_plan *p = one_bucket(2, m24, "RF", MF_BF16, "PF", "FF", 4096, NULL, a);
    int64_t L = p->sched->buckets[0].length;
    expect_steps(&p->trans[0][MF_T1], "cast all_gather@0");
    assert_int_equal(p->trans[0][MF_T1].steps[0].count, L / 8);
    assert_int_equal(p->trans[0][MF_T1].steps[1].count, L / 8);
    assert_int_equal(p->trans[0][MF_T1].steps[1].dtype, MF_BF16);
    assert_int_equal(p->trans[0][MF_T1].steps[0].stream, MF_STREAM_OUTER); /* feeds the outer gather */
    expect_steps(&p->trans[0][MF_T2], "all_gather@1");
    assert_int_equal(p->trans[0][MF_T2].steps[0].count, L / 4);
    expect_steps(&p->trans[0][MF_T3], "reduce_scatter@1 accumulate");
    assert_int_equal(p->trans[0][MF_T3].steps[0].count, L / 4);
    assert_int_equal(p->trans[0][MF_T3].steps[1].stream, MF_STREAM_INNER);
    expect_steps(&p->trans[0][MF_T4], "reduce_scatter@0");
    assert_int_equal(p->trans[0][MF_T4].steps[0].bytes, (2 - 1) * L / 8 * 4);
    mf_plan_free(p);
    /* 2-D FSDP: gathers outermost-first, reductions innermost-first */
    p = one_bucket(2, m24, "FF", MF_BF16, "FF", "FF", 4096, NULL, a);
    L = p->sched->buckets[0].length;
    expect_steps(&p->trans[0][MF_T1], "cast");
    expect_steps(&p->trans[0][MF_T2], "all_gather@0 all_gather@1");
    assert_int_equal(p->trans[0][MF_T2].steps[0].count, L / 8);
    assert_int_equal(p->trans[0][MF_T2].steps[1].count, L / 4);
    expect_steps(&p->trans[0][MF_T3], "reduce_scatter@1 reduce_scatter@0 accumulate");
    assert_int_equal(p->trans[0][MF_T3].steps[1].count, L / 8);
    expect_steps(&p->trans[0][MF_T4], "");
    mf_plan_free(p);
    /* 3-D HFSDP */
    p = one_bucket(3, m222, "RRF", MF_BF16, "PFF", "FFF", 4096, NULL, a);
    expect_steps(&p->trans[0][MF_T1], "cast all_gather@0 all_gather@1");
    expect_steps(&p->trans[0][MF_T2], "all_gather@2");
    expect_steps(&p->trans[0][MF_T3], "reduce_scatter@2 reduce_scatter@1 accumulate");
    expect_steps(&p->trans[0][MF_T4], "reduce_scatter@0");
    mf_plan_free(p);
    /* HSDP without sync: everything at the last microbatch, inner first */
    p = one_bucket(2, m24, "RF", MF_BF16, "PP", "RF", 1 << 20, NULL, a);
    expect_steps(&p->trans[0][MF_T3], "accumulate");
    expect_steps(&p->trans[0][MF_T4], "reduce_scatter@1 all_reduce@0");
    assert_non_null(p->trans[0][MF_T4].why);
    mf_plan_free(p);
    /* ZeRO-1 style slice: main_weight replicated, weight sharded */
    p = one_bucket(2, m24, "FF", MF_BF16, "PF", "RF", 4096, NULL, a);
    expect_steps(&p->trans[0][MF_T1], "cast slice@0");
    assert_int_equal(p->trans[0][MF_T1].steps[1].stream, MF_STREAM_OUTER);
    mf_plan_free(p);
    /* T4 G = R -> O = F: a local slice, on the stream of the T3 collective it follows */
    p = one_bucket(2, m24, "RR", MF_BF16, "RR", "RF", 4096, NULL, a);
    expect_steps(&p->trans[0][MF_T4], "slice@1");
    const mf_transition *t3 = &p->trans[0][MF_T3];
    assert_int_equal(p->trans[0][MF_T4].steps[0].stream, t3->steps[t3->nsteps - 2].stream);
    mf_plan_free(p);
    /* HSDP: T1 is the cast alone; it feeds T2's inner gather */
    p = one_bucket(2, m24, "RF", MF_BF16, "PF", "RF", 4096, NULL, a);
    expect_steps(&p->trans[0][MF_T1], "cast");
    assert_int_equal(p->trans[0][MF_T1].steps[0].stream, MF_STREAM_INNER);
    expect_steps(&p->trans[0][MF_T4], "all_reduce@0");
    mf_plan_free(p);
    /* no-sync accumulation: the accumulate feeds T4's inner reduce-scatter */
    p = one_bucket(2, m24, "RF", MF_BF16, "PP", "RF", 4096, NULL, a);
    assert_int_equal(p->trans[0][MF_T3].steps[0].stream, MF_STREAM_INNER);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

/* ---- the choice depends on the message size ---- */

static bool decomposed(const mf_transition *tr)
{
    return tr->nsteps == 3 && tr->steps[0].kind == MF_OP_REDUCE_SCATTER && tr->steps[1].kind == MF_OP_ALL_REDUCE &&
           tr->steps[2].kind == MF_OP_ALL_GATHER;
}

static void test_choice_switches_with_size(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    const int64_t m48[] = {4, 8};
    /* tiny replicated bucket: two all-reduces (fewer launches) */
    mf_plan *p = one_bucket(2, m48, "RR", MF_FP32, "PP", "RR", 64, NULL, a);
    const mf_transition *t4 = &p->trans[0][MF_T4];
    expect_steps(t4, "all_reduce@1 all_reduce@0");
    assert_non_null(t4->why);
    assert_non_null(strstr(t4->why, "all_reduce(a1) + all_reduce(a0): "));
    assert_non_null(strstr(t4->why, " over reduce_scatter(a1) + all_reduce(a0) + all_gather(a1): "));
    assert_non_null(strstr(t4->why, "latency-bound"));
    mf_plan_free(p);
    /* large: inner reduce-scatter, outer all-reduce on 1/8 of the data, inner all-gather */
    p = one_bucket(2, m48, "RR", MF_FP32, "PP", "RR", 1 << 22, NULL, a);
    t4 = &p->trans[0][MF_T4];
    assert_true(decomposed(t4));
    int64_t L = p->sched->buckets[0].length;
    assert_int_equal(t4->steps[1].count, L / 8);
    assert_int_equal(t4->steps[1].bytes, 2 * 3 * (L / 8 / 4) * 4); /* ring lower bound on the outer axis */
    assert_non_null(strstr(t4->why, "bandwidth-bound"));
    tl_check_plan(p, 0);
    mf_plan_free(p);
    /* sweeping the size, the choice switches exactly once */
    int switches = 0;
    bool prev = false;
    for (int64_t n = 16; n <= (1 << 22); n *= 2) {
        p = one_bucket(2, m48, "RR", MF_FP32, "PP", "RR", n, NULL, a);
        bool d = decomposed(&p->trans[0][MF_T4]);
        switches += n > 16 && d != prev;
        prev = d;
        mf_plan_free(p);
    }
    assert_int_equal(switches, 1);
    assert_true(prev);
    /* without a launch cost, fewer bytes always win */
    mf_cost_model cm;
    mf_mesh mesh = {.naxes = 2};
    mf_cost_defaults(&cm, &mesh);
    cm.launch = 0;
    p = one_bucket(2, m48, "RR", MF_FP32, "PP", "RR", 64, &cm, a);
    assert_true(decomposed(&p->trans[0][MF_T4]));
    mf_plan_free(p);
    /* 1-D P -> R: all-reduce, with reduce-scatter + all-gather named as the alternative */
    const int64_t m8[] = {8};
    p = one_bucket(1, m8, "R", MF_FP32, "P", "R", 1 << 20, NULL, a);
    expect_steps(&p->trans[0][MF_T4], "all_reduce@0");
    assert_non_null(strstr(p->trans[0][MF_T4].why, "over reduce_scatter(a0) + all_gather(a0)"));
    mf_plan_free(p);
    mf_arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_legal_triple_2d),
        cmocka_unit_test(test_every_legal_triple_3d),
        cmocka_unit_test(test_wide_weight_gathers_in_main_dtype),
        cmocka_unit_test(test_illegal_triples_rejected),
        cmocka_unit_test(test_random_meshes_and_tensors),
        cmocka_unit_test(test_known_decompositions),
        cmocka_unit_test(test_choice_switches_with_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
