/*
 * The Hugging Face export/import's global model (ckpt/mf_ckpt_hf_global.h,
 * issue #42: Distinct tensors under their global names) checked against
 * hand-computed names, shapes and byte ranges, not against the module's own
 * arithmetic.
 *
 * The mesh is tp = 2 x dp = 2. Bucket "mlp/tp" is Distinct on tp, Flat on
 * dp, and holds (local shapes):
 *   mlp.w1 [2, 3]  global "W1" split 0  -> one global tensor W1 [4, 3]
 *   mlp.w2 [3, 2]  global "W2" split 1  -> one global tensor W2 [3, 4]
 *   mlp.e  [4]     rename e.0 / e.1     -> two global tensors [4]
 * bucket "head/dp" (not Distinct) holds head.b [5]. The export's data, fp32,
 * in schedule order: W1 bytes [0, 48), W2 [48, 96), e.0 [96, 112), e.1
 * [112, 128), head.b [128, 148) (data-relative: after the header).
 *
 * Byte ranges of a coordinate's local elements (4 bytes each):
 *   split 0, coordinate 1, local elements [1, 5) of w1: W1's elements
 *     6 + [1, 5) = [7, 11): bytes [28, 44), one run;
 *   split 1, coordinate 1, local elements [1, 5) of w2 ([3, 2]: rows of 2):
 *     local 1 is row 0 col 1 -> W2[0][2 + 1] = element 3; local 2, 3 are
 *     row 1 -> W2[1][2 .. 4) = elements 6, 7; local 4 is row 2 col 0 ->
 *     W2[2][2] = element 10: runs {1 -> 3, 1}, {2 -> 6, 2}, {4 -> 10, 1},
 *     bytes 48 + [12, 16), 48 + [24, 32), 48 + [40, 44);
 *   split 1, coordinate 0, all of w2: W2 rows' first halves, elements
 *     [0, 2), [4, 6), [8, 10);
 *   a 3-D [2, 2, 2] tensor split along dim 1 over 3 coordinates, coordinate
 *     2, all 8 elements: global [2, 6, 2], runs {0 -> 8, 4}, {4 -> 20, 4};
 *   rename, coordinate 1, local [0, 4) of e: e.1's elements [0, 4), bytes
 *     [112, 128).
 * The global tensors follow the checkpoint plan's order (bucket, coordinate,
 * declaration). A Distinct tensor without global names is refused naming it
 * and the clause.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_ckpt_hf_global.h"
#include "mf_ckpt_hf_layout.h"

typedef struct fixture {
    mf_tensor t[3], head;
    mf_bucket b[2];
    mf_schedule s;
    const char *w1[1], *w2[1], *e[2];
} fixture;

static void setup(fixture *f)
{
    memset(f, 0, sizeof *f);
    f->w1[0] = "W1";
    f->w2[0] = "W2";
    f->e[0] = "e.0";
    f->e[1] = "e.1";
    f->t[0] = (mf_tensor){.name = "mlp.w1", .ndims = 2, .dims = {2, 3}, .numel = 6, .offset = 0, .nglobal = 1,
                          .global = f->w1, .global_split = true, .global_dim = 0};
    f->t[1] = (mf_tensor){.name = "mlp.w2", .ndims = 2, .dims = {3, 2}, .numel = 6, .offset = 6, .nglobal = 1,
                          .global = f->w2, .global_split = true, .global_dim = 1};
    f->t[2] = (mf_tensor){.name = "mlp.e", .ndims = 1, .dims = {4}, .numel = 4, .offset = 12, .nglobal = 2,
                          .global = f->e};
    f->head = (mf_tensor){.name = "head.b", .ndims = 1, .dims = {5}, .numel = 5};
    f->b[0] = (mf_bucket){.name = "mlp/tp", .length = 16, .used = 16, .ntensors = 3, .tensors = f->t};
    f->b[1] = (mf_bucket){.name = "head/dp", .length = 6, .used = 5, .ntensors = 1, .tensors = &f->head};
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        f->b[0].place[r].p[0] = MF_PLACE_DISTINCT;
        f->b[0].place[r].p[1] = MF_PLACE_FLAT;
        f->b[1].place[r].p[0] = MF_PLACE_FLAT;
        f->b[1].place[r].p[1] = MF_PLACE_FLAT;
    }
    f->s = (mf_schedule){.mesh = {.naxes = 2, .world = 4}, .nbuckets = 2, .buckets = f->b};
    f->s.mesh.axes[0] = (mf_axis){.name = "tp", .size = 2};
    f->s.mesh.axes[1] = (mf_axis){.name = "dp", .size = 2};
}

/* The runs of local elements [lo, hi) at place p, as {local, global, n}
 * triples, ending with -1. */
static void runs(const mf_hf_place *p, int64_t lo, int64_t hi, int64_t *out)
{
    int n = 0;
    mf_hf_run r;
    for (int64_t a = lo; a < hi; a += r.n) {
        mf_hf_global_run(p, a, hi, &r);
        out[n++] = r.local;
        out[n++] = r.global;
        out[n++] = r.n;
    }
    out[n] = -1;
}

static void expect_runs(const int64_t *got, const int64_t *want, const char *what)
{
    int i = 0;
    for (; want[i] >= 0; i++)
        if (got[i] != want[i])
            fail_msg("%s: run value %d is %lld, want %lld", what, i, (long long)got[i], (long long)want[i]);
    if (got[i] != -1)
        fail_msg("%s: more runs than expected (next %lld)", what, (long long)got[i]);
}

static void test_global_tensors(void **state)
{
    (void)state;
    fixture f;
    setup(&f);
    mf_hf_global g;
    char err[512];
    assert_int_equal(mf_hf_global_build(&f.s, &g, err, sizeof err), 0);
    assert_int_equal(g.n, 5);
    static const char *const names[] = {"W1", "W2", "e.0", "e.1", "head.b"};
    static const int64_t dims[][2] = {{4, 3}, {3, 4}, {4, 0}, {4, 0}, {5, 0}};
    static const int64_t numel[] = {12, 12, 4, 4, 5};
    for (int k = 0; k < 5; k++) {
        assert_string_equal(g.shape[k].name, names[k]);
        assert_int_equal(g.shape[k].dims[0], dims[k][0]);
        if (g.shape[k].ndims == 2)
            assert_int_equal(g.shape[k].dims[1], dims[k][1]);
        assert_int_equal(g.shape[k].numel, numel[k]);
    }
    assert_int_equal(mf_hf_global_find(&g, "e.1"), 3);
    assert_int_equal(mf_hf_global_find(&g, "mlp.e"), -1);
    /* places: a split tensor is one global tensor for both coordinates */
    assert_int_equal(mf_hf_global_place(&g, &f.s, 0, 0, 1).global, 0);
    assert_int_equal(mf_hf_global_place(&g, &f.s, 0, 1, 0).global, 1);
    assert_int_equal(mf_hf_global_place(&g, &f.s, 0, 2, 0).global, 2);
    assert_int_equal(mf_hf_global_place(&g, &f.s, 0, 2, 1).global, 3);
    assert_int_equal(mf_hf_global_place(&g, &f.s, 1, 0, -1).global, 4);
    mf_hf_global_free(&g);
}

/* The byte ranges of the header's comment: layout offsets + run elements. */
static void test_byte_ranges(void **state)
{
    (void)state;
    fixture f;
    setup(&f);
    mf_hf_global g;
    mf_hf_layout l;
    mf_hf_rules rules = {0};
    char err[512];
    int64_t got[64];
    assert_int_equal(mf_hf_global_build(&f.s, &g, err, sizeof err), 0);
    assert_int_equal(mf_hf_layout_build(g.shape, g.n, &rules, MF_FP32, 1u << 30, &l), 0);
    assert_int_equal(l.nfiles, 1);
    static const uint64_t data[] = {0, 48, 96, 112, 128};
    for (int k = 0; k < 5; k++)
        assert_int_equal(l.offset[k] - l.header_len[0], data[k]);
    assert_int_equal(l.bytes[0] - l.header_len[0], 148);

    mf_hf_place p = mf_hf_global_place(&g, &f.s, 0, 0, 1); /* split 0, coordinate 1 */
    runs(&p, 1, 5, got);
    expect_runs(got, (const int64_t[]){1, 7, 4, -1}, "split 0, coordinate 1");
    assert_int_equal(l.offset[p.global] - l.header_len[0] + (uint64_t)got[1] * 4, 28);

    p = mf_hf_global_place(&g, &f.s, 0, 1, 1); /* split 1, coordinate 1 */
    runs(&p, 1, 5, got);
    expect_runs(got, (const int64_t[]){1, 3, 1, 2, 6, 2, 4, 10, 1, -1}, "split 1, coordinate 1");
    static const uint64_t bytes[][2] = {{60, 64}, {72, 80}, {88, 92}};
    for (int i = 0; i < 3; i++) {
        uint64_t at = l.offset[p.global] - l.header_len[0] + (uint64_t)got[3 * i + 1] * 4;
        assert_int_equal(at, bytes[i][0]);
        assert_int_equal(at + (uint64_t)got[3 * i + 2] * 4, bytes[i][1]);
    }
    p = mf_hf_global_place(&g, &f.s, 0, 1, 0); /* split 1, coordinate 0, whole */
    runs(&p, 0, 6, got);
    expect_runs(got, (const int64_t[]){0, 0, 2, 2, 4, 2, 4, 8, 2, -1}, "split 1, coordinate 0");

    p = mf_hf_global_place(&g, &f.s, 0, 2, 1); /* rename, coordinate 1 */
    runs(&p, 0, 4, got);
    expect_runs(got, (const int64_t[]){0, 0, 4, -1}, "rename, coordinate 1");
    assert_int_equal(l.offset[p.global] - l.header_len[0], 112);
    mf_hf_layout_free(&l);
    mf_hf_global_free(&g);
}

/* mlp.w1 made [2, 2, 2] split along dim 1, tp of size 3: W1 is [2, 6, 2]. */
static void test_split_3d(void **state)
{
    (void)state;
    fixture f;
    setup(&f);
    f.t[0] = (mf_tensor){.name = "mlp.w1", .ndims = 3, .dims = {2, 2, 2}, .numel = 8, .nglobal = 1,
                         .global = f.w1, .global_split = true, .global_dim = 1};
    f.t[2].nglobal = 3;
    const char *e3[] = {"e.0", "e.1", "e.2"};
    f.t[2].global = e3;
    f.s.mesh.axes[0].size = 3;
    f.s.mesh.world = 6;
    mf_hf_global g;
    char err[512];
    int64_t got[32];
    assert_int_equal(mf_hf_global_build(&f.s, &g, err, sizeof err), 0);
    assert_int_equal(g.shape[0].ndims, 3);
    assert_int_equal(g.shape[0].dims[0], 2);
    assert_int_equal(g.shape[0].dims[1], 6);
    assert_int_equal(g.shape[0].dims[2], 2);
    assert_int_equal(g.shape[0].numel, 24);
    /* local (o, j, k) of coordinate 2 is W1[o][4 + j][k] = element 12 o + 8 + 2 j + k */
    mf_hf_place p = mf_hf_global_place(&g, &f.s, 0, 0, 2);
    runs(&p, 0, 8, got);
    expect_runs(got, (const int64_t[]){0, 8, 4, 4, 20, 4, -1}, "3-D split 1 of 3, coordinate 2");
    runs(&p, 3, 6, got); /* cut inside both runs */
    expect_runs(got, (const int64_t[]){3, 11, 1, 4, 20, 2, -1}, "3-D, local [3, 6)");
    assert_int_equal(mf_hf_global_place(&g, &f.s, 0, 2, 2).global, 4); /* e.2 after W1, W2, e.0, e.1 */
    mf_hf_global_free(&g);
}

/* The checkpoint plan's order (bucket, coordinate, declaration), which
 * mfsdp-ckpt's export of a native checkpoint follows: mlp.w1 renamed a.0 /
 * a.1 gives a.0, W2, e.0 (coordinate 0), a.1, e.1 (coordinate 1), head.b. */
static void test_plan_order(void **state)
{
    (void)state;
    fixture f;
    setup(&f);
    const char *a[] = {"a.0", "a.1"};
    f.t[0].global = a;
    f.t[0].nglobal = 2;
    f.t[0].global_split = false;
    mf_hf_global g;
    char err[512];
    assert_int_equal(mf_hf_global_build(&f.s, &g, err, sizeof err), 0);
    static const char *const names[] = {"a.0", "W2", "e.0", "a.1", "e.1", "head.b"};
    assert_int_equal(g.n, 6);
    for (int k = 0; k < 6; k++)
        assert_string_equal(g.shape[k].name, names[k]);
    assert_int_equal(mf_hf_global_place(&g, &f.s, 0, 0, 1).global, 3);
    assert_int_equal(mf_hf_global_place(&g, &f.s, 0, 1, 1).global, 1);
    assert_int_equal(mf_hf_global_place(&g, &f.s, 0, 2, 1).global, 4);
    assert_int_equal(mf_hf_global_place(&g, &f.s, 1, 0, -1).global, 5);
    mf_hf_global_free(&g);
}

static void test_unnamed_refused(void **state)
{
    (void)state;
    fixture f;
    setup(&f);
    f.t[2].nglobal = 0;
    f.t[2].global = NULL;
    mf_hf_global g;
    char err[512];
    assert_int_equal(mf_hf_global_build(&f.s, &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "tensor 'mlp.e' of bucket 'mlp/tp' is Distinct"));
    assert_non_null(strstr(err, "has no global name"));
    assert_non_null(strstr(err, "'global \"TEMPLATE\"'"));
    assert_null(g.shape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_global_tensors),
        cmocka_unit_test(test_byte_ranges),
        cmocka_unit_test(test_split_3d),
        cmocka_unit_test(test_plan_order),
        cmocka_unit_test(test_unnamed_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
