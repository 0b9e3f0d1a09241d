/*
 * The checkpoint plan of a split global tensor (issue #42 item 2: `global
 * "W" split D`, docs/checkpoint.md "Distinct tensors"), checked against
 * hand-computed byte ranges of the global tensor, not against the plan's
 * own arithmetic.
 *
 * The mesh is tp = 2 x dp = 2 (rank = 2 * tp + dp); the local tensor
 * "mlp.w" is [3, 4] (12 elements), Distinct on tp, so the global tensor W
 * is [6, 4] for split 0 and [3, 8] for split 1. Global element ranges below
 * are W's row-major elements; "writes" are the pieces a save puts in each
 * rank's file, "reads" the ranges a rank needs for the elements it holds.
 *   - Flat on dp: rank (c, d) holds local elements [6d, 6d + 6): split 0
 *     makes that W[12c + 6d, 12c + 6d + 6), one range; split 1 cuts it at
 *     the local rows (local row i of coordinate c is W[8i + 4c, 8i + 4c + 4)):
 *     d = 0: [4c, 4c + 4) and [8 + 4c, 8 + 4c + 2); d = 1: [8 + 4c + 2,
 *     8 + 4c + 4) and [16 + 4c, 16 + 4c + 4).
 *   - Replicate on dp: both ranks of coordinate c hold all 12 elements and
 *     read all of them (W rows' halves of c), the first writes local
 *     [0, 6), the second [6, 12) (the plan's replica rotation is 0 for
 *     bucket 0, shard 0), cut at rows as above for split 1.
 * The manifest built from the plan must parse (its pieces tile W exactly),
 * name one tensor W with the global dims, and the load refusal of another
 * tp size names the tensor.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_ckpt_build.h"
#include "mf_ckpt_manifest.h"
#include "mf_ckpt_plan.h"

typedef struct fixture {
    mf_tensor t;
    mf_bucket b;
    mf_schedule s;
    const char *names[1];
} fixture;

static void setup(fixture *f, int split, mf_place dp_place)
{
    memset(f, 0, sizeof *f);
    f->names[0] = "mlp.w";
    f->t = (mf_tensor){.name = "mlp.w", .ndims = 2, .dims = {3, 4}, .numel = 12, .nglobal = 1,
                       .global = f->names, .global_split = true, .global_dim = split};
    f->b = (mf_bucket){.name = "mlp/tp", .length = 12, .used = 12, .ntensors = 1, .tensors = &f->t};
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        f->b.place[r].p[0] = MF_PLACE_DISTINCT;
        f->b.place[r].p[1] = dp_place;
    }
    f->s = (mf_schedule){.mesh = {.naxes = 2, .world = 4}, .nbuckets = 1, .buckets = &f->b};
    f->s.mesh.axes[0] = (mf_axis){.name = "tp", .size = 2};
    f->s.mesh.axes[1] = (mf_axis){.name = "dp", .size = 2};
}

/* Global element ranges, [2 * i] .. [2 * i + 1], n of them, ending with -1. */
typedef struct ranges {
    int64_t v[16];
} ranges;

/* The global ranges rank r writes: its plan pieces, mapped to W. */
static ranges writes(const mf_ckpt_plan *p, int64_t r)
{
    ranges out;
    int n = 0;
    for (int64_t i = p->first[r]; i < p->first[r + 1]; i++) {
        const mf_ckpt_piece *pc = &p->p[i];
        int64_t g = mf_ckpt_plan_gstart(&p->t[pc->tensor], pc->start);
        out.v[n++] = g;
        out.v[n++] = g + (pc->end - pc->start);
    }
    out.v[n] = -1;
    return out;
}

/* The global ranges rank r reads: its held local range, element by element
 * through gstart, merged where contiguous in W. */
static ranges reads(const mf_schedule *s, const mf_ckpt_plan *p, int64_t r)
{
    ranges out;
    int n = 0;
    for (int k = 0; k < p->ntensors; k++) {
        int64_t lo, hi;
        mf_ckpt_plan_held(s, p, k, r, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) {
            int64_t g = mf_ckpt_plan_gstart(&p->t[k], i);
            if (n > 0 && out.v[n - 1] == g)
                out.v[n - 1] = g + 1;
            else {
                out.v[n++] = g;
                out.v[n++] = g + 1;
            }
        }
    }
    out.v[n] = -1;
    return out;
}

static void expect(ranges got, const int64_t *want, int64_t rank, const char *what)
{
    int i = 0;
    for (; want[i] >= 0; i++)
        if (got.v[i] != want[i])
            fail_msg("rank %lld %s: range bound %d is %lld, want %lld", (long long)rank, what, i,
                     (long long)got.v[i], (long long)want[i]);
    if (got.v[i] != -1)
        fail_msg("rank %lld %s: more ranges than expected (next %lld)", (long long)rank, what, (long long)got.v[i]);
}

/* The manifest of the plan (every rank with a file large enough) parses:
 * one tensor W with dims gdims, pieces tiling it. */
static void manifest_ok(const fixture *f, const mf_ckpt_plan *p, int64_t d0, int64_t d1)
{
    mf_ckpt_states st = {.n = 1, .name = {"main_weight"}, .dtype = {MF_FP32}};
    mf_ckpt_report rep[4];
    for (int r = 0; r < 4; r++)
        rep[r] = (mf_ckpt_report){1, 1 << 20, 64, 0, 0};
    char *text = mf_ckpt_build_manifest(&f->s, p, &st, "0123456789abcdef0123456789abcdef", 3, rep);
    assert_non_null(text);
    mf_ckpt_manifest m;
    char err[512];
    if (mf_ckpt_manifest_parse("manifest.json", text, strlen(text), &m, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(m.ntensors, 1);
    assert_string_equal(m.tensors[0].name, "mlp.w");
    assert_int_equal(m.tensors[0].ndims, 2);
    assert_int_equal(m.tensors[0].dims[0], d0);
    assert_int_equal(m.tensors[0].dims[1], d1);
    int64_t covered = 0;
    for (int64_t i = 0; i < m.npieces; i++)
        covered += m.pieces[i].end - m.pieces[i].start;
    assert_int_equal(covered, 24);
    /* Another tp size in the checkpoint is refused, naming the tensor. */
    m.axis_size[0] = 4;
    assert_int_equal(mf_ckpt_plan_check_split(&f->s, m.naxes, m.axis_name, m.axis_size, err, sizeof err), -1);
    assert_non_null(strstr(err, "tensor 'mlp.w' (global 'mlp.w' split"));
    assert_non_null(strstr(err, "axis 'tp' of size 2 here, 4 in the checkpoint"));
    m.axis_size[0] = 2;
    assert_int_equal(mf_ckpt_plan_check_split(&f->s, m.naxes, m.axis_name, m.axis_size, err, sizeof err), 0);
    mf_ckpt_manifest_free(&m);
    free(text);
}

static void test_split0_flat(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 0, MF_PLACE_FLAT);
    mf_ckpt_plan p;
    char err[512];
    assert_int_equal(mf_ckpt_plan_build(&f.s, &p, err, sizeof err), 0);
    assert_int_equal(p.nmt, 1);
    assert_int_equal(p.ntensors, 2);
    for (int64_t c = 0; c < 2; c++) /* one plan tensor per tp coordinate, named W */
        assert_int_equal(mf_ckpt_plan_find_coord(&p, "mlp.w", c), c);
    assert_int_equal(mf_ckpt_plan_find_coord(&p, "mlp.x", 0), -1);
    static const int64_t w[4][3] = {{0, 6, -1}, {6, 12, -1}, {12, 18, -1}, {18, 24, -1}};
    for (int64_t r = 0; r < 4; r++) {
        expect(writes(&p, r), w[r], r, "writes");
        expect(reads(&f.s, &p, r), w[r], r, "reads");
    }
    manifest_ok(&f, &p, 6, 4);
    mf_ckpt_plan_free(&p);
}

static void test_split1_flat(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 1, MF_PLACE_FLAT);
    mf_ckpt_plan p;
    char err[512];
    assert_int_equal(mf_ckpt_plan_build(&f.s, &p, err, sizeof err), 0);
    static const int64_t w[4][5] = {
        {0, 4, 8, 10, -1},   /* tp 0, dp 0: local row 0, half of row 1 */
        {10, 12, 16, 20, -1}, /* tp 0, dp 1: the rest of row 1, row 2 */
        {4, 8, 12, 14, -1},  /* tp 1, dp 0 */
        {14, 16, 20, 24, -1}, /* tp 1, dp 1 */
    };
    for (int64_t r = 0; r < 4; r++) {
        expect(writes(&p, r), w[r], r, "writes");
        expect(reads(&f.s, &p, r), w[r], r, "reads");
    }
    manifest_ok(&f, &p, 3, 8);
    mf_ckpt_plan_free(&p);
}

static void test_split_replicated(void **state)
{
    (void)state;
    fixture f;
    for (int split = 0; split < 2; split++) {
        setup(&f, split, MF_PLACE_REPLICATE);
        mf_ckpt_plan p;
        char err[512];
        assert_int_equal(mf_ckpt_plan_build(&f.s, &p, err, sizeof err), 0);
        static const int64_t w0[4][5] = {{0, 6, -1}, {6, 12, -1}, {12, 18, -1}, {18, 24, -1}};
        static const int64_t r0[4][3] = {{0, 12, -1}, {0, 12, -1}, {12, 24, -1}, {12, 24, -1}};
        static const int64_t w1[4][5] = {{0, 4, 8, 10, -1}, {10, 12, 16, 20, -1}, {4, 8, 12, 14, -1},
                                         {14, 16, 20, 24, -1}};
        static const int64_t r1[4][7] = {{0, 4, 8, 12, 16, 20, -1}, {0, 4, 8, 12, 16, 20, -1},
                                         {4, 8, 12, 16, 20, 24, -1}, {4, 8, 12, 16, 20, 24, -1}};
        for (int64_t r = 0; r < 4; r++) {
            expect(writes(&p, r), split ? w1[r] : w0[r], r, "writes");
            expect(reads(&f.s, &p, r), split ? r1[r] : r0[r], r, "reads");
        }
        manifest_ok(&f, &p, split ? 3 : 6, split ? 8 : 4);
        mf_ckpt_plan_free(&p);
    }
}

/* A split dim out of range (a hand-made schedule; the loader refuses it
 * too) has no plan, with a message naming the tensor. */
static void test_split_bad_dim(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 2, MF_PLACE_FLAT);
    mf_ckpt_plan p;
    char err[512];
    assert_int_equal(mf_ckpt_plan_build(&f.s, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "tensor 'mlp.w' of bucket 'mlp/tp': split dim 2"));
    mf_ckpt_plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split0_flat),
        cmocka_unit_test(test_split1_flat),
        cmocka_unit_test(test_split_replicated),
        cmocka_unit_test(test_split_bad_dim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
