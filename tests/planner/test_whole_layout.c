/*
 * Whole packing and owners (docs/semantics.md §4.6), every expected offset,
 * shard length S and length L computed by hand in the comments; the loader's
 * and the structural checker's refusals of a Whole schedule edited by hand.
 *
 * All specs keep every role fp32 with align 256, so the tensor quantum is 4
 * elements and the shard quantum A is 64; with the pad start s* = 0 (some
 * role Flat from the outermost axis, or a 1-D mesh) the pad quantum is
 * 64 * world and S is a multiple of 64 * world / P. S only bounds a shard's
 * room for the dealing (and merging's length); the shards themselves are
 * ragged (format 7): shard q ends at its tensors' end rounded up to A, an
 * empty shard is 0 long, L = the last bound.
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
    mf_schedule *s = st_compile("whole.mfsdp", text, true, &diag);
    if (!s)
        fail_msg("compile failed:\n%s", diag ? diag : "");
    free(diag);
    return s;
}

/* Tensor `name` of bucket b: its offset, and its owner shard under the
 * bucket's main_weight placement. */
static const mf_tensor *tensor(const mf_schedule *s, int b, const char *name)
{
    const mf_bucket *bk = &s->buckets[b];
    for (int t = 0; t < bk->ntensors; t++)
        if (strcmp(bk->tensors[t].name, name) == 0)
            return &bk->tensors[t];
    fail_msg("no tensor %s in bucket %s", name, bk->name);
    return NULL;
}

static int64_t owner(const mf_schedule *s, int b, const char *name)
{
    const mf_bucket *bk = &s->buckets[b];
    const mf_tensor *t = tensor(s, b, name);
    return mf_layout_tensor_shard(&s->mesh, bk, &bk->place[MF_ROLE_MAIN_WEIGHT], t->offset, t->numel);
}

/* The bucket's tensors in this order (offset order) at these offsets. */
static void expect_tensors(const mf_schedule *s, int b, int n, const char *const *names, const int64_t *offsets)
{
    const mf_bucket *bk = &s->buckets[b];
    assert_int_equal(bk->ntensors, n);
    for (int i = 0; i < n; i++) {
        assert_string_equal(bk->tensors[i].name, names[i]);
        assert_int_equal(bk->tensors[i].offset, offsets[i]);
    }
}

#define ALL_FP32_1D(G, O)                                                                                   \
    "layout z {\n  weight fp32 [Flat];\n  grad fp32 [" G "];\n  main_weight fp32 [" O "];\n}\n"

/* 100, 60, 50, 30, 10 on 2 shards. By cost: a 100 -> g0; b 60 -> g1; c 50 ->
 * g1 (60 < 100: 110); d 30 -> g0 (100 < 110: 130); e 10 -> g1 (110 < 130:
 * 120). g0 = {a, d} (130) takes shard 0, g1 = {b, c, e} shard 1. Shard 0: a at
 * 0, d at 100 (used 130); shard 1: b at 0, c at 60, e at 112 (110 rounded to
 * 4; used 122). S = 130 rounded up to 64 * 2 / 2 = 64: 192. Ragged: shard 0
 * 130 -> 192, shard 1 122 -> 128: bounds [0, 192, 320], L = 320. */
static void test_pack_by_hand(void **state)
{
    (void)state;
    mf_schedule *s = compile("mesh dp = 2;\n" ALL_FP32_1D("Whole", "Whole")
                             "unit \"u\" layout z {\n  tensor \"a\" [100];\n  tensor \"b\" [60];\n"
                             "  tensor \"c\" [50];\n  tensor \"d\" [30];\n  tensor \"e\" [10];\n}\n");
    const char *names[] = {"u.a", "u.d", "u.b", "u.c", "u.e"};
    const int64_t offs[] = {0, 100, 192, 252, 304};
    expect_tensors(s, 0, 5, names, offs);
    assert_int_equal(s->buckets[0].length, 320);
    assert_int_equal(s->buckets[0].used, 314);
    assert_non_null(s->buckets[0].bounds);
    assert_int_equal(s->buckets[0].bounds[0], 0);
    assert_int_equal(s->buckets[0].bounds[1], 192);
    assert_int_equal(s->buckets[0].bounds[2], 320);
    assert_true(s->buckets[0].whole[MF_ROLE_GRAD] && s->buckets[0].whole[MF_ROLE_MAIN_WEIGHT]);
    assert_false(s->buckets[0].whole[MF_ROLE_WEIGHT]);
    assert_int_equal(owner(s, 0, "u.a"), 0);
    assert_int_equal(owner(s, 0, "u.e"), 1);
    /* the used prefixes a whole collective moves: 130 of 192 and 122 of 128 */
    assert_int_equal(mf_layout_shard_used(&s->mesh, &s->buckets[0].place[MF_ROLE_GRAD], &s->buckets[0], 0), 130);
    assert_int_equal(mf_layout_shard_used(&s->mesh, &s->buckets[0].place[MF_ROLE_GRAD], &s->buckets[0], 1), 122);
    mf_schedule_free(s);
}

/* Equal costs: declaration order decides. t0 -> g0, t1 -> g1, t2 -> g0 (tie,
 * lowest), t3 -> g1; equal groups go to shards in group order. Both shards
 * 128 (two 64s): bounds [0, 128, 256], L = 256: t0 0, t2 64, t1 128, t3 192.
 * Compiling again gives the same bytes. */
static void test_ties_deterministic(void **state)
{
    (void)state;
    const char *spec = "mesh dp = 2;\n" ALL_FP32_1D("Whole", "Whole")
                       "unit \"u\" layout z {\n  tensor \"t0\" [64];\n  tensor \"t1\" [64];\n"
                       "  tensor \"t2\" [64];\n  tensor \"t3\" [64];\n}\n";
    mf_schedule *s = compile(spec), *again = compile(spec);
    const char *names[] = {"u.t0", "u.t2", "u.t1", "u.t3"};
    const int64_t offs[] = {0, 64, 128, 192};
    expect_tensors(s, 0, 4, names, offs);
    assert_int_equal(s->buckets[0].length, 256);
    char *a = st_emit(s, NULL), *b = st_emit(again, NULL);
    assert_string_equal(a, b);
    free(a);
    free(b);
    mf_schedule_free(s);
    mf_schedule_free(again);
}

/* A [8, 512] (numel 4096, flops 8*512*8 = 32768), B [64, 64] (4096, 262144),
 * C [60, 60] (3600, 216000) on 2 shards.
 * bytes: A -> g0, B -> g1 (A first on the tie), C -> g0 (tie): shard 0 = {A, C}
 *   (7696, up to 64: 7744), shard 1 = {B}: A 0, C 4096, B 7744.
 * flops: B -> g0, C -> g1, A -> g1 (216000 < 262144): g0 = {B} (262144) is the
 *   heavier and takes shard 0 (4096 long): B 0, A 4096, C 8192; shard 1 is
 *   7696 up to 64 = 7744 long: L = 11840 (the equal form's 2 * 7744 = 15488). */
static void test_balance_flops(void **state)
{
    (void)state;
    const char *units = "unit \"u\" layout z {\n  tensor \"A\" [8, 512];\n  tensor \"B\" [64, 64];\n"
                        "  tensor \"C\" [60, 60];\n}\n";
    char spec[1024];
    snprintf(spec, sizeof spec, "mesh dp = 2;\nbalance bytes;\n" ALL_FP32_1D("Whole", "Whole") "%s", units);
    mf_schedule *s = compile(spec);
    const char *nb[] = {"u.A", "u.C", "u.B"};
    const int64_t ob[] = {0, 4096, 7744};
    expect_tensors(s, 0, 3, nb, ob);
    mf_schedule_free(s);
    snprintf(spec, sizeof spec, "mesh dp = 2;\nbalance flops;\n" ALL_FP32_1D("Whole", "Whole") "%s", units);
    s = compile(spec);
    const char *nf[] = {"u.B", "u.A", "u.C"};
    const int64_t of[] = {0, 4096, 8192};
    expect_tensors(s, 0, 3, nf, of);
    assert_int_equal(s->buckets[0].length, 11840);
    mf_schedule_free(s);
}

/* Four identical units of one tensor on 4 shards: each bucket's tensor goes
 * to the shard whose rank owns least so far, so the owners are 0, 1, 2, 3.
 * Ragged, bucket b's shards before b are empty: its tensor is at 0, shard b
 * is 100 up to 64 = 128 long, L = 128 (the equal form's 4 * 128 = 512). */
static void test_global_tie_break(void **state)
{
    (void)state;
    mf_schedule *s = compile("mesh dp = 4;\n" ALL_FP32_1D("Whole", "Whole")
                             "unit \"u{i}\" for i in 0..4 layout z {\n  tensor \"t\" [100];\n}\n");
    assert_int_equal(s->nbuckets, 4);
    for (int b = 0; b < 4; b++) {
        char name[16];
        snprintf(name, sizeof name, "u%d.t", b);
        assert_int_equal(s->buckets[b].length, 128);
        assert_int_equal(tensor(s, b, name)->offset, 0);
        assert_int_equal(owner(s, b, name), b);
        assert_int_equal(s->buckets[b].bounds[b], 0);
        assert_int_equal(s->buckets[b].bounds[b + 1], 128);
    }
    mf_schedule_free(s);
}

/* bucket_size 3 KiB, six units of one [100] on 4 shards. Alone a bucket is
 * L = 512 (2048 bytes < 3072). u0..u3 merge: one tensor per shard, still 512.
 * With u4 a shard holds two (100 + 100 = 200 -> S = 256, L = 1024: 4096 bytes
 * > 3072), so u4 starts a bucket, which u5 joins (L = 512). In the second
 * bucket every rank owns 100 so far: u4.t takes shard 0, u5.t shard 1.
 * Merging compares the equal form's lengths; the buckets are then ragged:
 * the first [0, 128, 256, 384, 512] (L = 512), the second [0, 128, 256,
 * 256, 256] (L = 256). */
static void test_merged(void **state)
{
    (void)state;
    mf_schedule *s = compile("mesh dp = 4;\nbucket_size 3KiB;\n" ALL_FP32_1D("Whole", "Whole")
                             "unit \"u{i}\" for i in 0..6 layout z {\n  tensor \"t\" [100];\n}\n");
    assert_int_equal(s->nbuckets, 2);
    assert_int_equal(s->buckets[0].unit, 0);
    assert_int_equal(s->buckets[0].last_unit, 3);
    assert_int_equal(s->buckets[0].length, 512);
    const char *n0[] = {"u0.t", "u1.t", "u2.t", "u3.t"};
    const int64_t o0[] = {0, 128, 256, 384};
    expect_tensors(s, 0, 4, n0, o0);
    assert_int_equal(s->buckets[1].unit, 4);
    assert_int_equal(s->buckets[1].last_unit, 5);
    assert_int_equal(s->buckets[1].length, 256);
    const char *n1[] = {"u4.t", "u5.t"};
    const int64_t o1[] = {0, 128};
    expect_tensors(s, 1, 2, n1, o1);
    mf_schedule_free(s);
}

/* One rank: one shard, so Whole packs like Flat (the same spec with Flat is
 * the reference): declaration order, the same offsets and length. */
static void test_one_rank(void **state)
{
    (void)state;
    const char *units = "unit \"u\" layout z {\n  tensor \"a\" [30];\n  tensor \"b\" [100];\n"
                        "  tensor \"c\" [7, 9];\n}\n";
    char spec[1024];
    snprintf(spec, sizeof spec, "mesh dp = 1;\n" ALL_FP32_1D("Whole", "Whole") "%s", units);
    mf_schedule *w = compile(spec);
    snprintf(spec, sizeof spec, "mesh dp = 1;\n" ALL_FP32_1D("Flat", "Flat") "%s", units);
    mf_schedule *f = compile(spec);
    assert_int_equal(w->buckets[0].length, f->buckets[0].length);
    assert_int_equal(w->buckets[0].used, f->buckets[0].used);
    for (int t = 0; t < 3; t++) {
        assert_string_equal(w->buckets[0].tensors[t].name, f->buckets[0].tensors[t].name);
        assert_int_equal(w->buckets[0].tensors[t].offset, f->buckets[0].tensors[t].offset);
    }
    assert_int_equal(w->buckets[0].tensors[1].offset, 32); /* 30 up to 4 */
    mf_schedule_free(w);
    mf_schedule_free(f);
}

/* 3-D mesh 2 x 2 x 2, [R,R,F]/[P,P,W]/[W,W,W]: P = 8 (main_weight's), one
 * rank per shard. Four tensors, one per group, dealt by cost: 300 -> shard
 * 0 (all loads 0); 200: shards 1..7 carry 0, their spans (the shards of one
 * coordinate c_c of the innermost axis: q / 4) carry 300 (shards 1-3) and 0
 * (4-7): shard 4; 100: spans 300 and 200: shard 5; 50: spans 300 and
 * 300, the lowest: shard 1. S = 300 up to 64 * 8 / 8: 320. Ragged: shard 0
 * 320, 1 64, 4 256, 5 128, the others empty: bounds [0, 320, 384, 384, 384,
 * 640, 768, 768, 768], L = 768; offsets w 0, x 320, z 384, y 640. Shard q of
 * [W,W,W] is c_a + 2 c_b + 4 c_c, so shard 1 is rank 4 (coords (1, 0, 0)):
 * [320, 384). Under grad's [P,P,W] (2 shards, q' = c_c, each 4 fine shards:
 * [0, 384) and [384, 768)) x lies in shard 0, and rank 1 (c_c = 1) holds
 * [384, 768). */
static void test_mesh_3d(void **state)
{
    (void)state;
    mf_schedule *s = compile("mesh a = 2, b = 2, c = 2;\n"
                             "layout z {\n  weight fp32 [Replicate, Replicate, Flat];\n"
                             "  grad fp32 [Partial, Partial, Whole];\n  main_weight fp32 [Whole, Whole, Whole];\n}\n"
                             "unit \"u\" layout z {\n  tensor \"x\" [50];\n  tensor \"y\" [100];\n"
                             "  tensor \"z\" [200];\n  tensor \"w\" [300];\n}\n");
    const mf_bucket *bk = &s->buckets[0];
    const char *names[] = {"u.w", "u.x", "u.z", "u.y"};
    const int64_t offs[] = {0, 320, 384, 640};
    expect_tensors(s, 0, 4, names, offs);
    assert_int_equal(bk->length, 768);
    static const int64_t bounds[9] = {0, 320, 384, 384, 384, 640, 768, 768, 768};
    for (int q = 0; q < 9; q++)
        assert_int_equal(bk->bounds[q], bounds[q]);
    mf_range r = mf_layout_bucket_range(&s->mesh, bk, &bk->place[MF_ROLE_MAIN_WEIGHT], 4);
    assert_int_equal(r.offset, 320);
    assert_int_equal(r.len, 64);
    mf_range g = mf_layout_bucket_range(&s->mesh, bk, &bk->place[MF_ROLE_GRAD], 1); /* c_c = 1 */
    assert_int_equal(g.offset, 384);
    assert_int_equal(g.len, 384);
    const mf_tensor *x = tensor(s, 0, "u.x");
    assert_int_equal(mf_layout_tensor_shard(&s->mesh, bk, &bk->place[MF_ROLE_GRAD], x->offset, x->numel), 0);
    mf_schedule_free(s);
}

/* The file says format 7, writes Whole only on the whole roles and the
 * bounds of the ragged shards. */
static void test_emitted(void **state)
{
    (void)state;
    mf_schedule *s = compile("mesh dp_outer = 2, dp_inner = 2;\n"
                             "unit \"u\" layout hsdp_whole {\n  tensor \"a\" [100, 3];\n  tensor \"b\" [7];\n}\n");
    char *y = st_emit(s, NULL);
    assert_non_null(strstr(y, "format: mfsdp-schedule/7\n"));
    assert_non_null(strstr(y, "  bounds: ["));
    assert_non_null(strstr(y, "weight: {dtype: bf16, placement: [Replicate, Flat]}"));
    assert_non_null(strstr(y, "grad: {dtype: fp32, placement: [Partial, Whole]}"));
    assert_non_null(strstr(y, "main_weight: {dtype: fp32, placement: [Replicate, Whole]}"));
    char err[512];
    mf_schedule *back = mf_load_schedule_buffer("t.yaml", y, strlen(y), err, sizeof err);
    if (!back)
        fail_msg("%s", err);
    assert_true(back->buckets[0].whole[MF_ROLE_GRAD] && back->buckets[0].whole[MF_ROLE_MAIN_WEIGHT]);
    assert_false(back->buckets[0].whole[MF_ROLE_WEIGHT]);
    char *y2 = st_emit(back, NULL);
    assert_string_equal(y, y2);
    free(y2);
    free(y);
    mf_schedule_free(back);
    mf_schedule_free(s);
}

/* The edited file is refused with a message containing want at line:col of
 * the first occurrence of `at` in the edited text (0: any place). */
static void refused(const char *yaml, const char *find, const char *repl, const char *at, const char *want)
{
    char *bad = st_replace(yaml, find, repl), err[1024], where[64] = "";
    mf_schedule *s = mf_load_schedule_buffer("t.yaml", bad, strlen(bad), err, sizeof err);
    if (s)
        fail_msg("accepted after replacing '%s' by '%s'", find, repl);
    if (!strstr(err, want))
        fail_msg("message '%s' lacks '%s'", err, want);
    if (at) {
        const char *p = strstr(bad, at);
        int line = 1, col = 1;
        for (const char *q = bad; q < p; q++) {
            col = *q == '\n' ? 1 : col + 1;
            line += *q == '\n';
        }
        snprintf(where, sizeof where, "t.yaml:%d:%d: ", line, col);
        if (strncmp(err, where, strlen(where)) != 0)
            fail_msg("message '%s' is not at %s", err, where);
    }
    free(bad);
}

static void test_loader_refusals(void **state)
{
    (void)state;
    mf_schedule *s = compile("mesh dp = 2;\n" ALL_FP32_1D("Whole", "Whole")
                             "unit \"u\" layout z {\n  tensor \"a\" [100];\n  tensor \"b\" [60];\n"
                             "  tensor \"c\" [50];\n  tensor \"d\" [30];\n  tensor \"e\" [10];\n}\n");
    char *y = st_emit(s, NULL);
    refused(y, "weight: {dtype: fp32, placement: [Flat]}", "weight: {dtype: fp32, placement: [Whole]}", "Whole]}",
            "the weight placement may not be Whole");
    /* a format 5 file (equal, padded shards, no bounds) is refused with a hint */
    char *old = st_replace(y, "  bounds: [0, 192, 320]\n", "");
    refused(old, "format: mfsdp-schedule/7", "format: mfsdp-schedule/5", "Whole]}",
            "a Whole bucket of format mfsdp-schedule/5 is laid out in equal, padded shards; this mfsdp reads "
            "ragged shards (format mfsdp-schedule/7); compile the spec again");
    refused(old, "format: mfsdp-schedule/7", "format: mfsdp-schedule/4", "Whole]}",
            "placement 'Whole' needs format mfsdp-schedule/7 (the file says mfsdp-schedule/4)");
    refused(old, "dtype: fp32", "dtype: fp32", "320\n  used",
            "bucket 'u/z' has a Whole role but no key 'bounds' (its ragged shards: 3 bounds)");
    free(old);
    /* the bounds: their count, 0 first, order, quantum, end */
    refused(y, "bounds: [0, 192, 320]", "bounds: 7", "7\n  weight", "expected a sequence for the shard bounds");
    refused(y, "bounds: [0, 192, 320]", "bounds: [0, 320]", "[0, 320]",
            "bucket 'u/z' has 2 bounds, expected 3");
    refused(y, "bounds: [0, 192, 320]", "bounds: [64, 192, 320]", "[64, 192",
            "bound 0 is 64: the first bound is not 0");
    refused(y, "bounds: [0, 192, 320]", "bounds: [0, 200, 320]", "[0, 200",
            "bound 1 is 200: it is not a multiple of the shard quantum");
    refused(y, "bounds: [0, 192, 320]", "bounds: [0, 384, 320]", "[0, 384",
            "bound 2 is 320: it is below the bound before it");
    refused(y, "bounds: [0, 192, 320]", "bounds: [0, 192, 384]", "[0, 192, 384",
            "bound 2 is 384: the last bound is not the bucket's length");
    /* the per-rank persistent region (docs/semantics.md §4.6): rank 0 holds
     * 192 of each of main_weight, weight and grad (768 bytes each: offsets
     * 0, 768, 1536, region 2304), rank 1 128 (512 bytes each) */
    refused(y, "lifetime: persistent, offset: 1536}", "lifetime: persistent, offset: 1792}", NULL,
            "buffer 'u/z.grad': offset 1792 is not 1536, its offset on rank 0 in the persistent region");
    refused(y, "arena: {persistent: 2304", "arena: {persistent: 2048", NULL,
            "the persistent region (2048 bytes) is smaller than the 2304 bytes some rank's per-rank buffers need");
    /* b moved from 192 to 150: 150..210 straddles the boundary at 192 */
    refused(y, "{name: u.b, offset: 192", "{name: u.b, offset: 150", NULL,
            "bucket 'u/z': tensor 'u.b' (offset 150, numel 60) straddles a shard of the Whole grad placement "
            "(2 shards, at most 192 elements)");
    /* a buffer is written Flat */
    refused(y, "placement: [Flat], count: 192", "placement: [Whole], count: 192", "Whole], count",
            "may not be Whole");
    free(y);
    mf_schedule_free(s);

    s = compile("mesh dp_outer = 2, dp_inner = 2;\n"
                "unit \"u\" layout hfsdp_whole {\n  tensor \"a\" [100, 3];\n  tensor \"b\" [7];\n}\n");
    y = st_emit(s, NULL);
    refused(y, "placement: [Whole, Whole]", "placement: [Flat, Whole]", "Whole]}\n  tensors",
            "the main_weight placement mixes Whole and Flat");
    free(y);
    mf_schedule_free(s);
}

/* A role that is not Whole but splits finer than the finest Whole role has
 * no ragged shards (docs/semantics.md §4.6): zero3's weight [Flat, Flat]
 * beside grad [Partial, Whole] is refused at the weight's placement, with
 * the fix; in a file, the loader refuses the same at the bucket's bounds. */
static void test_finer_role_refused(void **state)
{
    (void)state;
    const char *spec = "mesh dp_outer = 2, dp_inner = 2;\n"
                       "layout zw {\n  weight fp32 [Flat, Flat];\n  grad fp32 [Partial, Whole];\n"
                       "  main_weight fp32 [Replicate, Whole];\n}\n"
                       "unit \"u\" layout zw {\n  tensor \"a\" [100];\n}\n";
    char *diag = NULL;
    mf_schedule *s = st_compile("whole.mfsdp", spec, false, &diag);
    if (s)
        fail_msg("accepted:\n%s", spec);
    const char *want = "whole.mfsdp:3:15: error: 'weight' in layout 'zw' splits into 4 shards, more than the 2 of "
                       "its Whole 'grad' [Partial, Whole]; a whole bucket's shards follow its owners, so no role may "
                       "split finer than the finest Whole one; use [Partial, Flat] or make 'weight' Whole too";
    if (!diag || !strstr(diag, want))
        fail_msg("diagnostics lack '%s':\n%s", want, diag ? diag : "");
    free(diag);
    s = compile("mesh dp_outer = 2, dp_inner = 2;\n"
                "unit \"u\" layout hsdp_whole {\n  tensor \"a\" [100, 3];\n  tensor \"b\" [7];\n}\n");
    char *y = st_emit(s, NULL);
    refused(y, "weight: {dtype: bf16, placement: [Replicate, Flat]}", "weight: {dtype: bf16, placement: [Flat, Flat]}",
            "[0, ", "bucket 'u/hsdp_whole': its weight placement splits into 4 shards, more than the 2 of its "
            "finest Whole role");
    free(y);
    mf_schedule_free(s);
}

/* The structural checker (the runtime's check of a schedule in memory). */
static void test_struct_refusals(void **state)
{
    (void)state;
    mf_schedule *s = compile("mesh dp = 2;\n" ALL_FP32_1D("Whole", "Whole")
                             "unit \"u\" layout z {\n  tensor \"a\" [100];\n  tensor \"b\" [60];\n}\n");
    char err[1024];
    assert_true(mf_struct_check_first(s, err, sizeof err));
    s->buckets[0].whole[MF_ROLE_WEIGHT] = true;
    assert_false(mf_struct_check_first(s, err, sizeof err));
    assert_non_null(strstr(err, "bucket 'u/z': weight may not be Whole"));
    s->buckets[0].whole[MF_ROLE_WEIGHT] = false;
    /* a at 0 (shard 0: [0, 128)), b at 128 (shard 1: [128, 192)); b moved to
     * 100 straddles 128 */
    assert_int_equal(tensor(s, 0, "u.b")->offset, 128);
    assert_int_equal(s->buckets[0].length, 192);
    s->buckets[0].tensors[1].offset = 100;
    assert_false(mf_struct_check_first(s, err, sizeof err));
    assert_non_null(strstr(err, "tensor 'u.b' (offset 100, numel 60) straddles a shard of the Whole grad"));
    s->buckets[0].tensors[1].offset = 128;
    /* a buffer counted at anything but its placement's longest shard (128) */
    for (int b = 0; b < s->nbuffers; b++)
        if (s->buffers[b].kind == MF_BUF_MAIN_WEIGHT) {
            assert_int_equal(s->buffers[b].count, 128);
            s->buffers[b].count = 96; /* the equal form's 192 / 2 */
        }
    assert_false(mf_struct_check_first(s, err, sizeof err));
    assert_non_null(strstr(err, "count 96 is not 128, the longest shard of its placement in the ragged bucket"));
    mf_schedule_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_by_hand),  cmocka_unit_test(test_ties_deterministic),
        cmocka_unit_test(test_balance_flops), cmocka_unit_test(test_global_tie_break),
        cmocka_unit_test(test_merged),        cmocka_unit_test(test_one_rank),
        cmocka_unit_test(test_mesh_3d),       cmocka_unit_test(test_emitted),
        cmocka_unit_test(test_loader_refusals), cmocka_unit_test(test_struct_refusals),
        cmocka_unit_test(test_finer_role_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
