/*
 * The two shard functions of a Whole bucket (core/mf_layout.c,
 * docs/semantics.md §4.6) on hand-made buckets, every value by hand:
 * mf_layout_tensor_shard (the shard holding a range wholly, or -1 when it
 * straddles) and mf_layout_shard_used (the used prefix of a shard: from its
 * start to the furthest tensor element in it), including a Flat bucket whose
 * tensors straddle shards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "mf_layout.h"

static mf_mesh mesh_2x2(void)
{
    mf_mesh m = {.naxes = 2, .world = 4};
    m.axes[0] = (mf_axis){"outer", 2};
    m.axes[1] = (mf_axis){"inner", 2};
    return m;
}

static mf_placement place2(mf_place a, mf_place b)
{
    mf_placement p = {{0}};
    p.p[0] = (uint8_t)a;
    p.p[1] = (uint8_t)b;
    return p;
}

/* L = 400: [R,F] has 2 shards of 200, [F,F] 4 of 100. */
static void test_tensor_shard(void **state)
{
    (void)state;
    mf_mesh m = mesh_2x2();
    mf_placement rf = place2(MF_PLACE_REPLICATE, MF_PLACE_FLAT), ff = place2(MF_PLACE_FLAT, MF_PLACE_FLAT);
    mf_placement rr = place2(MF_PLACE_REPLICATE, MF_PLACE_REPLICATE);
    assert_int_equal(mf_layout_tensor_shard(&m, &rf, 400, 0, 200), 0);   /* exactly shard 0 */
    assert_int_equal(mf_layout_tensor_shard(&m, &rf, 400, 200, 200), 1); /* exactly shard 1 */
    assert_int_equal(mf_layout_tensor_shard(&m, &rf, 400, 150, 60), -1); /* 150..209 straddles 200 */
    assert_int_equal(mf_layout_tensor_shard(&m, &rf, 400, 199, 1), 0);
    assert_int_equal(mf_layout_tensor_shard(&m, &ff, 400, 150, 50), 1);  /* 150..199 in [F,F] shard 1 */
    assert_int_equal(mf_layout_tensor_shard(&m, &ff, 400, 150, 51), -1); /* .. 200 crosses into shard 2 */
    assert_int_equal(mf_layout_tensor_shard(&m, &ff, 400, 300, 100), 3);
    assert_int_equal(mf_layout_tensor_shard(&m, &rr, 400, 150, 60), 0);  /* one shard: the whole bucket */
    assert_int_equal(mf_layout_tensor_shard(&m, &ff, 400, 250, 0), 2);   /* empty: its offset's shard */
    assert_int_equal(mf_layout_tensor_shard(&m, &ff, 400, 380, 40), -1); /* past the end */
    assert_int_equal(mf_layout_tensor_shard(&m, &ff, 400, -1, 10), -1);
}

/* A whole bucket on [R,F], L = 400, S = 200: shard 0 holds a 0..99 and b
 * 104..153 (a gap of 4 inside the prefix: used 154), shard 1 holds c
 * 200..229 (used 30). Under [F,F] (4 shards of 100): shard 0 used 100 (a),
 * shard 1 used 54 (b ends at 154), shard 2 used 30, shard 3 nothing. */
static void test_shard_used_whole(void **state)
{
    (void)state;
    mf_mesh m = mesh_2x2();
    mf_tensor t[3] = {{.name = "a", .numel = 100, .offset = 0},
                      {.name = "b", .numel = 50, .offset = 104},
                      {.name = "c", .numel = 30, .offset = 200}};
    mf_bucket b = {.name = "w", .length = 400, .used = 230, .ntensors = 3, .tensors = t};
    mf_placement rf = place2(MF_PLACE_REPLICATE, MF_PLACE_FLAT), ff = place2(MF_PLACE_FLAT, MF_PLACE_FLAT);
    assert_int_equal(mf_layout_shard_used(&m, &rf, &b, 0), 154);
    assert_int_equal(mf_layout_shard_used(&m, &rf, &b, 1), 30);
    assert_int_equal(mf_layout_shard_used(&m, &ff, &b, 0), 100);
    assert_int_equal(mf_layout_shard_used(&m, &ff, &b, 1), 54);
    assert_int_equal(mf_layout_shard_used(&m, &ff, &b, 2), 30);
    assert_int_equal(mf_layout_shard_used(&m, &ff, &b, 3), 0);
}

/* A Flat bucket (no whole role) whose tensors straddle: L = 400 on [R,F],
 * a 0..249 and b 256..299. Shard 0 is full (a runs past it: 200); shard 1
 * holds a's tail 200..249 and b up to 299: used 100. tensor_shard says -1
 * for a. */
static void test_shard_used_straddling(void **state)
{
    (void)state;
    mf_mesh m = mesh_2x2();
    mf_tensor t[2] = {{.name = "a", .numel = 250, .offset = 0}, {.name = "b", .numel = 44, .offset = 256}};
    mf_bucket b = {.name = "f", .length = 400, .used = 300, .ntensors = 2, .tensors = t};
    mf_placement rf = place2(MF_PLACE_REPLICATE, MF_PLACE_FLAT);
    assert_int_equal(mf_layout_shard_used(&m, &rf, &b, 0), 200);
    assert_int_equal(mf_layout_shard_used(&m, &rf, &b, 1), 100);
    assert_int_equal(mf_layout_tensor_shard(&m, &rf, 400, 0, 250), -1);
    assert_int_equal(mf_layout_tensor_shard(&m, &rf, 400, 256, 44), 1);
    /* only a's tail in shard 1 */
    b.ntensors = 1;
    assert_int_equal(mf_layout_shard_used(&m, &rf, &b, 1), 50);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_shard),
        cmocka_unit_test(test_shard_used_whole),
        cmocka_unit_test(test_shard_used_straddling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
