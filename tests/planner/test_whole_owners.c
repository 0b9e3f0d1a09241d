/*
 * The dealing of whole tensors to shards over the whole model
 * (planner/passes/mf_whole_owners.h) and the lower bound any dealing must
 * reach (mf_plan_owners_bound), on hand-built buckets with every expected
 * shard and bound worked out in the comments. Tensor quantum 1 unless said.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_plan_owners.h"
#include "mf_whole_owners.h"
#include "plan_testlib.h"

static mf_whole_bucket wb(const mf_placement *fine, int64_t P, int n, const int64_t *numel, const int *group,
                          int64_t S, int *shard)
{
    return (mf_whole_bucket){.fine = fine, .P = P, .n = n, .cost = numel, .numel = numel, .group = group,
                             .tq = 1, .S = S, .shard = shard};
}

/* A: 30, 30 (S 64); B: 100, 40 (S 128) on dp = 2. Tensor by tensor: 100 (B)
 * -> shard 0 (loads 100 / 0), 40 (B) -> 1 (40), 30 (A) -> 1 (70 < 100), 30
 * (A) -> 1 (70 < 100; 30 + 30 <= 64): 100 / 100. By groups A's second group
 * would have to take A's free shard 0: 130 / 70; the first dealing is kept. */
static void test_across_buckets(void **state)
{
    (void)state;
    mf_mesh m = tl_mesh(1, 2, 0);
    mf_placement F = tl_place("F");
    int64_t na[] = {30, 30}, nbs[] = {100, 40};
    int ga[] = {0, 1}, gb[] = {0, 1}, sa[2], sb[2];
    mf_whole_bucket b[2] = {wb(&F, 2, 2, na, ga, 64, sa), wb(&F, 2, 2, nbs, gb, 128, sb)};
    assert_true(mf_whole_owners_assign(&m, b, 2));
    assert_int_equal(sb[0], 0);
    assert_int_equal(sb[1], 1);
    assert_int_equal(sa[0], 1);
    assert_int_equal(sa[1], 1);
}

/* A: 45 (S 64); B: 50, 50, 34, 33, 33 (S 100; groups {50, 50}, {34, 33, 33}).
 * Tensor by tensor: 50 -> 0, 50 -> 1, 45 (A) -> 0 (95), 34 -> 1 (84), 33:
 * shard 1 has no room (84 + 33 > 100) -> 0 (83 used), 33: neither (116, 117)
 * -> B deals its groups: {50, 50} (100) -> 0, {34, 33, 33} (100) -> 1, A's 45
 * -> 0 (tie, the lowest). Every bucket by groups gives the same 145 / 100. */
static void test_falls_back_to_groups(void **state)
{
    (void)state;
    mf_mesh m = tl_mesh(1, 2, 0);
    mf_placement F = tl_place("F");
    int64_t na[] = {45}, nbs[] = {50, 50, 34, 33, 33};
    int ga[] = {0}, gb[] = {0, 0, 1, 1, 1}, sa[1], sb[5];
    mf_whole_bucket b[2] = {wb(&F, 2, 1, na, ga, 64, sa), wb(&F, 2, 5, nbs, gb, 100, sb)};
    assert_true(mf_whole_owners_assign(&m, b, 2));
    const int want[] = {0, 0, 1, 1, 1};
    for (int i = 0; i < 5; i++)
        assert_int_equal(sb[i], want[i]);
    assert_int_equal(sa[0], 0);
}

/* Buckets of different finest placements share the ranks' loads. Mesh 2 x 2:
 * [F, F] shard q = c0 + 2 c1 (rank 0 -> 0, 1 -> 2, 2 -> 1, 3 -> 3); [R, F]
 * shard = c1 (ranks 0, 2 -> 0; 1, 3 -> 1). A [F, F]: 100 -> shard 0 (rank 0);
 * B [R, F]: 90 -> shard 1 (its shard 0 holds rank 0, load 100). */
static void test_classes_share_loads(void **state)
{
    (void)state;
    mf_mesh m = tl_mesh(2, 2, 2);
    mf_placement FF = tl_place("FF"), RF = tl_place("RF");
    int64_t na[] = {100}, nbs[] = {90};
    int g[] = {0}, sa[1], sb[1];
    mf_whole_bucket b[2] = {wb(&FF, 4, 1, na, g, 128, sa), wb(&RF, 2, 1, nbs, g, 128, sb)};
    assert_true(mf_whole_owners_assign(&m, b, 2));
    assert_int_equal(sa[0], 0);
    assert_int_equal(sb[0], 1);
}

/* Rooms count each tensor rounded up to the quantum. C: 50 -> shard 0. D (tq
 * 8, S 16): 9 -> shard 1 (its rank holds 0 < 50), rounded to 16; 7 (rounded
 * 8) cannot join it (16 + 8 > 16) and goes to shard 0, the more loaded. */
static void test_room_rounds_to_the_quantum(void **state)
{
    (void)state;
    mf_mesh m = tl_mesh(1, 2, 0);
    mf_placement F = tl_place("F");
    int64_t nc[] = {50}, nd[] = {9, 7};
    int gc[] = {0}, gd[] = {0, 1}, sc[1], sd[2];
    mf_whole_bucket b[2] = {wb(&F, 2, 1, nc, gc, 64, sc), wb(&F, 2, 2, nd, gd, 16, sd)};
    b[1].tq = 8;
    assert_true(mf_whole_owners_assign(&m, b, 2));
    assert_int_equal(sc[0], 0);
    assert_int_equal(sd[0], 1); /* 9: rank 1 holds 0 < 50 */
    assert_int_equal(sd[1], 0); /* 7: no room left on shard 1 (16 + 8 > 16) */
}

/* A hand-built schedule of whole fp32 buckets on dp = P, one tensor per value
 * (numel = value / 4 bytes), 1-D. */
static mf_schedule *whole_schedule(int64_t P, int n, const int64_t *bytes)
{
    mf_schedule *s = calloc(1, sizeof *s);
    mf_bucket *b = calloc(1, sizeof *b);
    mf_tensor *t = calloc((size_t)n, sizeof *t);
    assert_non_null(s);
    assert_non_null(b);
    assert_non_null(t);
    s->mesh = tl_mesh(1, P, 0);
    for (int i = 0; i < n; i++)
        t[i] = (mf_tensor){.name = "t", .ndims = 1, .dims = {bytes[i] / 4}, .numel = bytes[i] / 4};
    b->ntensors = n;
    b->tensors = t;
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        b->dtype[r] = MF_FP32;
        b->place[r] = tl_place("F");
    }
    b->whole[MF_ROLE_GRAD] = b->whole[MF_ROLE_MAIN_WEIGHT] = true;
    s->buckets = b;
    s->nbuckets = 1;
    return s;
}

static void free_schedule(mf_schedule *s)
{
    free(s->buckets[0].tensors);
    free(s->buckets);
    free(s);
}

/* 5 tensors of 400 bytes on 4 shards: mean 500, largest 400; pigeonhole: 2 of
 * the 5 largest share a shard: 800, the bound. */
static void test_bound_pigeonhole(void **state)
{
    (void)state;
    const int64_t v[] = {400, 400, 400, 400, 400};
    mf_schedule *s = whole_schedule(4, 5, v);
    mf_plan_owner_bound b;
    assert_true(mf_plan_owners_bound(s, false, &b));
    assert_true(fabs(b.mean - 500) < 1e-9);
    assert_true(fabs(b.largest - 400) < 1e-9);
    assert_true(fabs(b.bound - 800) < 1e-9);
    assert_string_equal(b.why, "pigeonhole");
    assert_int_equal(b.k, 1);
    assert_int_equal(b.P, 4);
    free_schedule(s);
}

/* 2 shards, tensors 1000 and eleven of 100: mean 1050, pigeonhole k = 1
 * (the 2nd and 3rd: 200), k = 5 (the 6 of the 11 largest: 600). Units of 100:
 * 10 + 11 = 21 over 2 shards -> 11 units: 1100, the bound (the mean misses
 * that 100s cannot split). */
static void test_bound_units(void **state)
{
    (void)state;
    int64_t v[12] = {1000};
    for (int i = 1; i < 12; i++)
        v[i] = 100;
    mf_schedule *s = whole_schedule(2, 12, v);
    mf_plan_owner_bound b;
    assert_true(mf_plan_owners_bound(s, false, &b));
    assert_true(fabs(b.mean - 1050) < 1e-9);
    assert_true(fabs(b.bound - 1100) < 1e-9);
    assert_string_equal(b.why, "units");
    assert_true(fabs(b.unit - 100) < 1e-9);
    assert_int_equal(b.unit_P, 2);
    free_schedule(s);
}

/* One tensor larger than the rest together: the largest tensor. */
static void test_bound_largest(void **state)
{
    (void)state;
    const int64_t v[] = {4000, 40, 40};
    mf_schedule *s = whole_schedule(2, 3, v);
    mf_plan_owner_bound b;
    assert_true(mf_plan_owners_bound(s, false, &b));
    assert_true(fabs(b.bound - 4000) < 1e-9);
    assert_string_equal(b.why, "largest tensor");
    free_schedule(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_across_buckets),       cmocka_unit_test(test_falls_back_to_groups),
        cmocka_unit_test(test_classes_share_loads),  cmocka_unit_test(test_room_rounds_to_the_quantum),
        cmocka_unit_test(test_bound_pigeonhole),     cmocka_unit_test(test_bound_units),
        cmocka_unit_test(test_bound_largest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
