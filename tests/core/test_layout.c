/*
 * Rank coordinates (row-major), axis groups and colors, the suffix rule; then
 * shard ranges (docs/semantics.md §2, inner-major) on 1-D, 2-D and 3-D meshes with
 * axis sizes 3 and 5, against hand-computed offsets; then, on every mesh of
 * up to three axes of sizes 1..5 and every legal placement, the structural
 * properties the planner relies on: each replica group partitions the bucket,
 * and a shard nests inside the shard of the next-inner suffix at c_s * len.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
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
    mf_layout_mesh_coords(&m, 7, c);          /* 7 = 1*5 + 2 */
    assert_int_equal(c[0], 1);
    assert_int_equal(c[1], 2);
    assert_int_equal(mf_layout_mesh_rank(&m, c), 7);
    int64_t group[5];
    mf_layout_axis_group(&m, 1, 7, group); /* inner group of node 1: ranks 5..9 */
    for (int i = 0; i < 5; i++)
        assert_int_equal(group[i], 5 + i);
    int64_t outer[3];
    mf_layout_axis_group(&m, 0, 7, outer); /* outer group with inner coord 2 */
    assert_int_equal(outer[0], 2);
    assert_int_equal(outer[1], 7);
    assert_int_equal(outer[2], 12);
    assert_int_equal(mf_layout_axis_color(&m, 0, 7), 2);
    assert_int_equal(mf_layout_axis_color(&m, 1, 7), 1);
}

static void test_suffix_rule(void **state)
{
    (void)state;
    mf_placement ok[] = {place_of("RF"), place_of("FF"), place_of("PF"), place_of("RR"), place_of("PP")};
    mf_placement bad[] = {place_of("FR"), place_of("FP"), place_of("FRF")};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_true(mf_layout_flat_suffix_ok(&ok[i], 2));
    assert_false(mf_layout_flat_suffix_ok(&bad[0], 2));
    assert_false(mf_layout_flat_suffix_ok(&bad[1], 2));
    assert_false(mf_layout_flat_suffix_ok(&bad[2], 3));
    assert_int_equal(mf_layout_flat_start(&ok[0], 2), 1);
    assert_int_equal(mf_layout_flat_start(&ok[1], 2), 0);
    assert_int_equal(mf_layout_flat_start(&ok[3], 2), 2);
}

static void test_1d_sizes_3_and_5(void **state)
{
    (void)state;
    int64_t three[] = {3}, five[] = {5};
    mf_mesh m3 = mesh_of(1, three), m5 = mesh_of(1, five);
    mf_placement f = place_of("F");
    const int64_t want3[] = {0, 4, 8}, want5[] = {0, 3, 6, 9, 12};
    for (int r = 0; r < 3; r++) {
        assert_int_equal(mf_layout_range(&m3, &f, r, 12).offset, want3[r]);
        assert_int_equal(mf_layout_range(&m3, &f, r, 12).len, 4);
    }
    for (int r = 0; r < 5; r++) {
        assert_int_equal(mf_layout_range(&m5, &f, r, 15).offset, want5[r]);
        assert_int_equal(mf_layout_range(&m5, &f, r, 15).len, 3);
    }
}

static void test_2d_5x3(void **state)
{
    (void)state;
    /* mesh (a0=5, a1=3), L = 30; [F,F]: q = c0 + 5*c1, len 2 (hand-computed) */
    int64_t sizes[] = {5, 3};
    mf_mesh m = mesh_of(2, sizes);
    mf_placement ff = place_of("FF"), rf = place_of("RF"), pf = place_of("PF"), rr = place_of("RR");
    const int64_t want_ff[15] = {0, 10, 20, 2, 12, 22, 4, 14, 24, 6, 16, 26, 8, 18, 28};
    const int64_t want_rf[15] = {0, 10, 20, 0, 10, 20, 0, 10, 20, 0, 10, 20, 0, 10, 20};
    for (int r = 0; r < 15; r++) {
        assert_int_equal(mf_layout_range(&m, &ff, r, 30).offset, want_ff[r]);
        assert_int_equal(mf_layout_range(&m, &ff, r, 30).len, 2);
        assert_int_equal(mf_layout_range(&m, &rf, r, 30).offset, want_rf[r]);
        assert_int_equal(mf_layout_range(&m, &rf, r, 30).len, 10);
        assert_int_equal(mf_layout_range(&m, &pf, r, 30).offset, want_rf[r]);
        assert_int_equal(mf_layout_range(&m, &rr, r, 30).offset, 0);
        assert_int_equal(mf_layout_range(&m, &rr, r, 30).len, 30);
    }
}

static void test_3d_5x3x2(void **state)
{
    (void)state;
    /* mesh (5, 3, 2), L = 60. rank = 6*c0 + 2*c1 + c2.
     * [F,F,F]: q = c0 + 5*c1 + 15*c2, len 2;  [R,F,F]: q = c1 + 3*c2, len 10;
     * [R,R,F] and [P,R,F]: q = c2, len 30. */
    int64_t sizes[] = {5, 3, 2};
    mf_mesh m = mesh_of(3, sizes);
    mf_placement fff = place_of("FFF"), rff = place_of("RFF"), rrf = place_of("RRF"), prf = place_of("PRF");
    const struct {
        int rank;
        int64_t fff, rff, rrf;
    } cases[] = {
        {0, 0, 0, 0},   {1, 30, 30, 30}, {2, 10, 10, 0},  {3, 40, 40, 30},
        {7, 32, 30, 30}, {11, 52, 50, 30}, {24, 8, 0, 0},  {29, 58, 50, 30},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(mf_layout_range(&m, &fff, cases[i].rank, 60).offset, cases[i].fff);
        assert_int_equal(mf_layout_range(&m, &rff, cases[i].rank, 60).offset, cases[i].rff);
        assert_int_equal(mf_layout_range(&m, &rrf, cases[i].rank, 60).offset, cases[i].rrf);
        assert_int_equal(mf_layout_range(&m, &prf, cases[i].rank, 60).offset, cases[i].rrf);
    }
    assert_int_equal(mf_layout_range(&m, &fff, 5, 60).len, 2);
    assert_int_equal(mf_layout_range(&m, &rff, 5, 60).len, 10);
    assert_int_equal(mf_layout_range(&m, &rrf, 5, 60).len, 30);
}

/* Every placement over {R,F,P}^k that satisfies the suffix rule, as letters. */
static int legal_placements(int k, char out[][MF_MAX_AXES + 1])
{
    int n = 0, total = 1;
    for (int j = 0; j < k; j++)
        total *= 3;
    for (int code = 0; code < total; code++) {
        char s[MF_MAX_AXES + 1] = {0};
        int c = code;
        for (int j = 0; j < k; j++, c /= 3)
            s[j] = "RFP"[c % 3];
        mf_placement p = place_of(s);
        if (mf_layout_flat_suffix_ok(&p, k)) {
            for (int j = 0; j <= k; j++)
                out[n][j] = s[j];
            n++;
        }
    }
    return n;
}

static void check_mesh(const mf_mesh *m)
{
    int k = m->naxes;
    char pls[81][MF_MAX_AXES + 1];
    int np = legal_placements(k, pls);
    int64_t L = m->world * 4;
    char *seen = malloc((size_t)L);
    assert_non_null(seen);
    for (int i = 0; i < np; i++) {
        mf_placement p = place_of(pls[i]);
        int s = mf_layout_flat_start(&p, k);
        int64_t shards = mf_layout_shards(m, &p);
        /* replica groups: ranks with coord 0 on every Flat axis pick a group */
        for (int64_t r0 = 0; r0 < m->world; r0++) {
            int64_t c0[MF_MAX_AXES];
            mf_layout_mesh_coords(m, r0, c0);
            bool leader = true;
            for (int j = s; j < k; j++)
                leader = leader && c0[j] == 0;
            if (!leader)
                continue;
            for (int64_t x = 0; x < L; x++)
                seen[x] = 0;
            for (int64_t r = 0; r < m->world; r++) {
                int64_t c[MF_MAX_AXES];
                mf_layout_mesh_coords(m, r, c);
                bool member = true;
                for (int j = 0; j < s; j++)
                    member = member && c[j] == c0[j];
                if (!member)
                    continue;
                mf_range rg = mf_layout_range(m, &p, r, L);
                assert_int_equal(rg.len, L / shards);
                for (int64_t x = rg.offset; x < rg.offset + rg.len; x++) {
                    assert_int_equal(seen[x], 0);
                    seen[x] = 1;
                }
            }
            for (int64_t x = 0; x < L; x++)
                assert_int_equal(seen[x], 1);
        }
        /* nesting: dropping the outermost Flat axis s widens the shard by n_s,
         * and this rank's shard sits at c_s * len inside it */
        if (s < k) {
            mf_placement q = p;
            q.p[s] = MF_PLACE_REPLICATE;
            for (int64_t r = 0; r < m->world; r++) {
                int64_t c[MF_MAX_AXES];
                mf_layout_mesh_coords(m, r, c);
                mf_range a = mf_layout_range(m, &p, r, L), b = mf_layout_range(m, &q, r, L);
                assert_int_equal(b.len, a.len * m->axes[s].size);
                assert_int_equal(a.offset, b.offset + c[s] * a.len);
            }
        }
    }
    free(seen);
}

static void test_partition_and_nesting_all_small_meshes(void **state)
{
    (void)state;
    for (int k = 1; k <= 3; k++) {
        int64_t sizes[3] = {1, 1, 1};
        int combos = 1;
        for (int j = 0; j < k; j++)
            combos *= 5;
        for (int code = 0; code < combos; code++) {
            int c = code;
            for (int j = 0; j < k; j++, c /= 5)
                sizes[j] = 1 + c % 5;
            mf_mesh m = mesh_of(k, sizes);
            check_mesh(&m);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coords_row_major),
        cmocka_unit_test(test_suffix_rule),
        cmocka_unit_test(test_1d_sizes_3_and_5),
        cmocka_unit_test(test_2d_5x3),
        cmocka_unit_test(test_3d_5x3x2),
        cmocka_unit_test(test_partition_and_nesting_all_small_meshes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
