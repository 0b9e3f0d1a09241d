/*
 * Shard ranges (DESIGN §3.2) against hand-computed offsets, rank coordinates
 * and axis groups.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mf_layout.h"

static mf_mesh mesh_of(int n, const int64_t *sizes)
{
    mf_mesh m = {.naxes = n, .world = 1};
    for (int j = 0; j < n; j++) {
        m.axes[j].name = "a";
        m.axes[j].size = sizes[j];
        m.world *= sizes[j];
    }
    return m;
}

static mf_placement place_of(const char *letters)
{
    mf_placement p = {{0}};
    for (int j = 0; letters[j]; j++)
        p.p[j] = letters[j] == 'F' ? MF_PLACE_FLAT : letters[j] == 'P' ? MF_PLACE_PARTIAL : MF_PLACE_REPLICATE;
    return p;
}

static void test_coords_row_major(void **state)
{
    (void)state;
    int64_t sizes[] = {3, 5};
    mf_mesh m = mesh_of(2, sizes);
    int64_t c[MF_MAX_AXES];
    mf_mesh_coords(&m, 7, c);          /* 7 = 1*5 + 2 */
    assert_int_equal(c[0], 1);
    assert_int_equal(c[1], 2);
    assert_int_equal(mf_mesh_rank(&m, c), 7);
    int64_t group[5];
    mf_mesh_axis_group(&m, 1, 7, group); /* inner group of node 1: ranks 5..9 */
    for (int i = 0; i < 5; i++)
        assert_int_equal(group[i], 5 + i);
    int64_t outer[3];
    mf_mesh_axis_group(&m, 0, 7, outer); /* outer group with inner coord 2 */
    assert_int_equal(outer[0], 2);
    assert_int_equal(outer[1], 7);
    assert_int_equal(outer[2], 12);
    assert_int_equal(mf_mesh_axis_color(&m, 0, 7), 2);
    assert_int_equal(mf_mesh_axis_color(&m, 1, 7), 1);
}

static void test_ranges_1d(void **state)
{
    (void)state;
    int64_t sizes[] = {5};
    mf_mesh m = mesh_of(1, sizes);
    mf_placement f = place_of("F"), r = place_of("R");
    for (int64_t rank = 0; rank < 5; rank++) {
        mf_range x = mf_layout_range(&m, &f, rank, 100);
        assert_int_equal(x.offset, rank * 20);
        assert_int_equal(x.len, 20);
        mf_range y = mf_layout_range(&m, &r, rank, 100);
        assert_int_equal(y.offset, 0);
        assert_int_equal(y.len, 100);
    }
}

static void test_ranges_2d_inner_major(void **state)
{
    (void)state;
    /* (dp_outer=3, dp_inner=5), [Flat, Flat]: offset = (c_inner*3 + c_outer) * L/15 */
    int64_t sizes[] = {3, 5};
    mf_mesh m = mesh_of(2, sizes);
    mf_placement ff = place_of("FF"), rf = place_of("RF"), pf = place_of("PF");
    const int64_t L = 150;
    for (int64_t rank = 0; rank < 15; rank++) {
        int64_t co = rank / 5, ci = rank % 5;
        mf_range x = mf_layout_range(&m, &ff, rank, L);
        assert_int_equal(x.len, 10);
        assert_int_equal(x.offset, (ci * 3 + co) * 10);
        mf_range y = mf_layout_range(&m, &rf, rank, L);
        assert_int_equal(y.len, 30);
        assert_int_equal(y.offset, ci * 30);
        mf_range z = mf_layout_range(&m, &pf, rank, L);
        assert_int_equal(z.offset, ci * 30);
        /* the [F,F] shard lies inside the [R,F] shard, at c_outer */
        assert_int_equal(x.offset, y.offset + co * x.len);
    }
}

static void test_ranges_3d(void **state)
{
    (void)state;
    /* (2, 3, 5): [F,F,F] q = c2*6 + c1*2 + c0; [R,F,F] q = c2*3 + c1 */
    int64_t sizes[] = {2, 3, 5};
    mf_mesh m = mesh_of(3, sizes);
    mf_placement fff = place_of("FFF"), rff = place_of("RFF"), rrf = place_of("RRF");
    const int64_t L = 300;
    for (int64_t rank = 0; rank < 30; rank++) {
        int64_t c0 = rank / 15, c1 = (rank / 5) % 3, c2 = rank % 5;
        assert_int_equal(mf_layout_range(&m, &fff, rank, L).offset, (c2 * 6 + c1 * 2 + c0) * 10);
        assert_int_equal(mf_layout_range(&m, &rff, rank, L).offset, (c2 * 3 + c1) * 20);
        assert_int_equal(mf_layout_range(&m, &rrf, rank, L).offset, c2 * 60);
    }
}

static void test_suffix_rule(void **state)
{
    (void)state;
    mf_placement ok[] = {place_of("RF"), place_of("FF"), place_of("PF"), place_of("RR"), place_of("PP")};
    mf_placement bad[] = {place_of("FR"), place_of("FP"), place_of("FRF")};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_true(mf_placement_suffix_ok(&ok[i], 2));
    assert_false(mf_placement_suffix_ok(&bad[0], 2));
    assert_false(mf_placement_suffix_ok(&bad[1], 2));
    assert_false(mf_placement_suffix_ok(&bad[2], 3));
    assert_int_equal(mf_placement_flat_start(&ok[0], 2), 1);
    assert_int_equal(mf_placement_flat_start(&ok[1], 2), 0);
    assert_int_equal(mf_placement_flat_start(&ok[3], 2), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coords_row_major),
        cmocka_unit_test(test_ranges_1d),
        cmocka_unit_test(test_ranges_2d_inner_major),
        cmocka_unit_test(test_ranges_3d),
        cmocka_unit_test(test_suffix_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
