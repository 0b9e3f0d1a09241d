/*
 * The shard functions of a bucket (core/mf_layout.c, docs/semantics.md §4.6)
 * on hand-made buckets, every value by hand: mf_layout_tensor_shard (the
 * shard holding a range wholly, or -1 when it straddles) and
 * mf_layout_shard_used (the used prefix of a shard: from its start to the
 * furthest tensor element in it), including a Flat bucket whose tensors
 * straddle shards; and the ragged shards of a whole bucket with bounds
 * (mf_layout_bucket_shard / _range / _capacity): docs/semantics.md §4.6's
 * example on dp = 2
 * and a 2x4 mesh under [Whole, Whole] and [Replicate, Whole], empty shards
 * included; and the per-rank persistent region of such a bucket
 * (core/mf_persist.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "mf_layout.h"
#include "mf_persist.h"

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
    mf_bucket b400 = {.name = "f", .length = 400};
    mf_placement rf = place2(MF_PLACE_REPLICATE, MF_PLACE_FLAT), ff = place2(MF_PLACE_FLAT, MF_PLACE_FLAT);
    mf_placement rr = place2(MF_PLACE_REPLICATE, MF_PLACE_REPLICATE);
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &rf, 0, 200), 0);   /* exactly shard 0 */
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &rf, 200, 200), 1); /* exactly shard 1 */
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &rf, 150, 60), -1); /* 150..209 straddles 200 */
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &rf, 199, 1), 0);
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &ff, 150, 50), 1);  /* 150..199 in [F,F] shard 1 */
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &ff, 150, 51), -1); /* .. 200 crosses into shard 2 */
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &ff, 300, 100), 3);
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &rr, 150, 60), 0);  /* one shard: the whole bucket */
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &ff, 250, 0), 2);   /* empty: its offset's shard */
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &ff, 380, 40), -1); /* past the end */
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &ff, -1, 10), -1);
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
    mf_bucket b400 = {.name = "f", .length = 400};
    assert_int_equal(mf_layout_shard_used(&m, &rf, &b, 0), 200);
    assert_int_equal(mf_layout_shard_used(&m, &rf, &b, 1), 100);
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &rf, 0, 250), -1);
    assert_int_equal(mf_layout_tensor_shard(&m, &b400, &rf, 256, 44), 1);
    /* only a's tail in shard 1 */
    b.ntensors = 1;
    assert_int_equal(mf_layout_shard_used(&m, &rf, &b, 1), 50);
}

static mf_mesh mesh_1(int64_t n)
{
    mf_mesh m = {.naxes = 1, .world = n};
    m.axes[0] = (mf_axis){"dp", n};
    return m;
}

/* docs/semantics.md §4.6's example, ragged: 100, 60, 50, 30, 10 fp32 on
 * dp = 2 (T = 4, a shard quantum of 64 elements): shard 0 holds 100 at 0 and
 * 30 at 100 (used 130, rounded to 192), shard 1 holds 60 at 192, 50 at 252, 10
 * at 304 (used 122, rounded to 128): bounds [0, 192, 320], L = 320. */
static void test_ragged_example(void **state)
{
    (void)state;
    mf_mesh m = mesh_1(2);
    mf_tensor t[5] = {{.name = "a", .numel = 100, .offset = 0},   {.name = "d", .numel = 30, .offset = 100},
                      {.name = "b", .numel = 60, .offset = 192},  {.name = "c", .numel = 50, .offset = 252},
                      {.name = "e", .numel = 10, .offset = 304}};
    int64_t bounds[3] = {0, 192, 320};
    mf_bucket b = {.name = "w", .length = 320, .used = 314, .ntensors = 5, .tensors = t, .bounds = bounds};
    mf_placement w = {{MF_PLACE_FLAT}}, r = {{MF_PLACE_REPLICATE}};
    b.place[MF_ROLE_WEIGHT] = w;
    b.place[MF_ROLE_GRAD] = w;
    b.place[MF_ROLE_MAIN_WEIGHT] = w;
    b.whole[MF_ROLE_GRAD] = b.whole[MF_ROLE_MAIN_WEIGHT] = true;
    assert_ptr_equal(mf_layout_bucket_fine(&m, &b), &b.place[MF_ROLE_GRAD]);
    assert_int_equal(mf_layout_bucket_nbounds(&m, &b), 3);
    mf_range r0 = mf_layout_bucket_range(&m, &b, &w, 0), r1 = mf_layout_bucket_range(&m, &b, &w, 1);
    assert_int_equal(r0.offset, 0);
    assert_int_equal(r0.len, 192);
    assert_int_equal(r1.offset, 192);
    assert_int_equal(r1.len, 128);
    assert_int_equal(mf_layout_bucket_range(&m, &b, &r, 1).offset, 0);
    assert_int_equal(mf_layout_bucket_range(&m, &b, &r, 1).len, 320);
    assert_int_equal(mf_layout_bucket_capacity(&m, &b, &w), 192);
    assert_int_equal(mf_layout_bucket_capacity(&m, &b, &r), 320);
    assert_int_equal(mf_layout_shard_used(&m, &w, &b, 0), 130);
    assert_int_equal(mf_layout_shard_used(&m, &w, &b, 1), 122);
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &w, 252, 50), 1);
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &w, 100, 30), 0);
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &w, 180, 20), -1); /* 180..199 crosses 192 */
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &w, 310, 11), -1); /* past L */
    /* equal shards would have been 160 each: the bounds decide */
    assert_int_equal(mf_layout_bucket_shard(&m, &b, &w, 1).offset, 192);
    assert_int_equal(mf_layout_bucket_shard(&m, &b, &w, 2).len, 0); /* q out of range */
    /* the used prefixes: 130 + 122 elements for a gather on dp, the least own
     * 122 (rank 1): (252 - 122) * 4 bytes, under the ring's (2-1) * 192 * 4 */
    assert_int_equal(mf_layout_collective_bytes(&m, &b, MF_OP_ALL_GATHER, 0, &w, 192, MF_FP32), 130 * 4);
}

/* A 2x4 mesh (outer 2, inner 4; rank = 4 c0 + c1), grad and main_weight
 * [Whole, Whole]: 8 fine shards, q = c0 + 2 c1 (inner-major), of lengths
 * 64, 0, 128, 64, 192, 64, 0, 0: bounds 0 64 64 192 256 448 512 512 512.
 * Tensors a 50 @0 (q0), b 100 @64 and c 20 @168 (q2), e 40 @192 (q3), d 150
 * @256 (q4), f 60 @448 (q5). Under [Replicate, Whole] (4 shards, q' = c1,
 * k = 2): [0,64) [64,256) [256,512) [512,512). */
static void test_ragged_2x4(void **state)
{
    (void)state;
    mf_mesh m = {.naxes = 2, .world = 8};
    m.axes[0] = (mf_axis){"outer", 2};
    m.axes[1] = (mf_axis){"inner", 4};
    mf_tensor t[6] = {{.name = "a", .numel = 50, .offset = 0},    {.name = "b", .numel = 100, .offset = 64},
                      {.name = "c", .numel = 20, .offset = 168},  {.name = "e", .numel = 40, .offset = 192},
                      {.name = "d", .numel = 150, .offset = 256}, {.name = "f", .numel = 60, .offset = 448}};
    int64_t bounds[9] = {0, 64, 64, 192, 256, 448, 512, 512, 512};
    mf_bucket b = {.name = "w", .length = 512, .used = 508, .ntensors = 6, .tensors = t, .bounds = bounds};
    mf_placement ww = place2(MF_PLACE_FLAT, MF_PLACE_FLAT), rw = place2(MF_PLACE_REPLICATE, MF_PLACE_FLAT);
    mf_placement rr = place2(MF_PLACE_REPLICATE, MF_PLACE_REPLICATE);
    b.place[MF_ROLE_WEIGHT] = rw;
    b.place[MF_ROLE_GRAD] = rw;
    b.place[MF_ROLE_MAIN_WEIGHT] = ww;
    b.whole[MF_ROLE_GRAD] = b.whole[MF_ROLE_MAIN_WEIGHT] = true;
    assert_ptr_equal(mf_layout_bucket_fine(&m, &b), &b.place[MF_ROLE_MAIN_WEIGHT]);
    assert_int_equal(mf_layout_bucket_nbounds(&m, &b), 9);
    static const int64_t ww_off[8] = {0, 64, 256, 512, 64, 192, 448, 512};
    static const int64_t ww_len[8] = {64, 128, 192, 0, 0, 64, 64, 0};
    static const int64_t rw_off[8] = {0, 64, 256, 512, 0, 64, 256, 512};
    static const int64_t rw_len[8] = {64, 192, 256, 0, 64, 192, 256, 0};
    for (int64_t r = 0; r < 8; r++) {
        mf_range x = mf_layout_bucket_range(&m, &b, &ww, r), y = mf_layout_bucket_range(&m, &b, &rw, r);
        assert_int_equal(x.offset, ww_off[r]);
        assert_int_equal(x.len, ww_len[r]);
        assert_int_equal(y.offset, rw_off[r]);
        assert_int_equal(y.len, rw_len[r]);
        assert_int_equal(mf_layout_bucket_range(&m, &b, &rr, r).len, 512);
    }
    assert_int_equal(mf_layout_bucket_capacity(&m, &b, &ww), 192);
    assert_int_equal(mf_layout_bucket_capacity(&m, &b, &rw), 256);
    assert_int_equal(mf_layout_bucket_capacity(&m, &b, &rr), 512);
    static const int64_t ww_q[6] = {0, 2, 2, 3, 4, 5}, rw_q[6] = {0, 1, 1, 1, 2, 2};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(mf_layout_tensor_shard(&m, &b, &ww, t[i].offset, t[i].numel), ww_q[i]);
        assert_int_equal(mf_layout_tensor_shard(&m, &b, &rw, t[i].offset, t[i].numel), rw_q[i]);
    }
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &ww, 64, 0), 2); /* empty: fine shard 1 is empty */
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &ww, 60, 10), -1);
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &rw, 60, 10), -1);
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &rw, 200, 60), -1); /* crosses 256 */
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &ww, 200, 60), -1);
    assert_int_equal(mf_layout_shard_used(&m, &ww, &b, 2), 124);
    assert_int_equal(mf_layout_shard_used(&m, &ww, &b, 4), 150);
    assert_int_equal(mf_layout_shard_used(&m, &ww, &b, 1), 0);
    assert_int_equal(mf_layout_shard_used(&m, &rw, &b, 1), 168);
    assert_int_equal(mf_layout_shard_used(&m, &rw, &b, 2), 252);
    /* all_gather on inner (4 members) counted on [R,W]: used 50 + 168 + 252
     * + 0, the least own 0: 470 elements of fp32 (ring: 3 * 256 * 4) */
    assert_int_equal(mf_layout_collective_bytes(&m, &b, MF_OP_ALL_GATHER, 1, &rw, 256, MF_FP32), 470 * 4);
    /* a non-whole placement with more shards than the finest has no ragged
     * shards: [Flat, Flat] on a bucket whose finest is [Replicate, Whole] */
    b.place[MF_ROLE_MAIN_WEIGHT] = rw;
    int64_t b4[5] = {0, 64, 256, 512, 512};
    b.bounds = b4;
    assert_int_equal(mf_layout_bucket_nbounds(&m, &b), 5);
    assert_false(mf_layout_bucket_placement_ok(&m, &b, &ww));
    assert_true(mf_layout_bucket_placement_ok(&m, &b, &rr));
    assert_int_equal(mf_layout_bucket_shard(&m, &b, &ww, 0).len, 0);
    assert_int_equal(mf_layout_tensor_shard(&m, &b, &ww, 0, 50), -1);
    assert_int_equal(mf_layout_bucket_range(&m, &b, &rw, 6).offset, 256);
}

/* Without bounds the bucket's shards are equal (mf_layout_range's): L = 64
 * on the 2x4 mesh, [Replicate, Flat] rank 5 (c1 = 1) holds [16, 32). */
static void test_equal_shards(void **state)
{
    (void)state;
    mf_mesh m = {.naxes = 2, .world = 8};
    m.axes[0] = (mf_axis){"outer", 2};
    m.axes[1] = (mf_axis){"inner", 4};
    mf_bucket b = {.name = "f", .length = 64};
    mf_placement rf = place2(MF_PLACE_REPLICATE, MF_PLACE_FLAT), ff = place2(MF_PLACE_FLAT, MF_PLACE_FLAT);
    assert_null(mf_layout_bucket_fine(&m, &b));
    assert_int_equal(mf_layout_bucket_nbounds(&m, &b), 0);
    assert_int_equal(mf_layout_bucket_range(&m, &b, &rf, 5).offset, 16);
    assert_int_equal(mf_layout_bucket_range(&m, &b, &rf, 5).len, 16);
    assert_int_equal(mf_layout_bucket_range(&m, &b, &ff, 5).offset, 3 * 8); /* q = 1 + 2 * 1 */
    assert_int_equal(mf_layout_bucket_capacity(&m, &b, &ff), 8);
}

/* The persistent region (align 256 bytes, dp = 2): bucket 0 equal, its
 * main_weight 64 fp32 at offset 0 (256 bytes, shared); bucket 1 ragged as
 * in test_ragged_example: main_weight [Whole] (count 192 fp32), weight_full
 * in the arena (320), grad of step lifetime [Whole] (192 bf16). Rank 0 holds
 * 192 elements of each: main_weight at 256 (768 bytes), grad at 1024 (384,
 * rounded to 512), region 1536; rank 1 holds 128: main_weight at 256 (512),
 * grad at 768 (256), region 1024. */
static void test_persist_regions(void **state)
{
    (void)state;
    int64_t bounds[3] = {0, 192, 320};
    mf_placement w = {{MF_PLACE_FLAT}}, r = {{MF_PLACE_REPLICATE}};
    mf_bucket bk[2] = {{.name = "flat", .length = 128}, {.name = "whole", .length = 320, .bounds = bounds}};
    for (int i = 0; i < MF_ROLE_COUNT; i++)
        bk[0].place[i] = bk[1].place[i] = w;
    bk[1].whole[MF_ROLE_GRAD] = bk[1].whole[MF_ROLE_MAIN_WEIGHT] = true;
    mf_buffer bf[4] = {
        {.name = "f.main", .bucket = 0, .kind = MF_BUF_MAIN_WEIGHT, .dtype = MF_FP32, .place = w, .count = 64,
         .lifetime = MF_LIFETIME_PERSISTENT, .offset = 0},
        {.name = "w.main", .bucket = 1, .kind = MF_BUF_MAIN_WEIGHT, .dtype = MF_FP32, .place = w, .count = 192,
         .lifetime = MF_LIFETIME_PERSISTENT, .offset = 256},
        {.name = "w.full", .bucket = 1, .kind = MF_BUF_WEIGHT_FULL, .dtype = MF_FP32, .place = r, .count = 320,
         .lifetime = MF_LIFETIME_MICROBATCH, .offset = 0},
        {.name = "w.grad", .bucket = 1, .kind = MF_BUF_GRAD, .dtype = MF_BF16, .place = w, .count = 192,
         .lifetime = MF_LIFETIME_STEP, .offset = 1024},
    };
    mf_schedule s = {.mesh = mesh_1(2), .align = 256, .nbuckets = 2, .buckets = bk, .nbuffers = 4, .buffers = bf};
    assert_false(mf_persist_per_rank(&s, 0));
    assert_true(mf_persist_per_rank(&s, 1));
    assert_false(mf_persist_per_rank(&s, 2)); /* in the arena */
    assert_true(mf_persist_per_rank(&s, 3));
    assert_int_equal(mf_persist_held(&s, 1, 1), 128);
    assert_int_equal(mf_persist_held(&s, 2, 1), 320);
    assert_int_equal(mf_persist_held(&s, 0, 1), 64);
    assert_int_equal(mf_persist_shared_end(&s), 256);
    int64_t off[4] = {-1, -1, -1, -1};
    assert_int_equal(mf_persist_layout(&s, 0, off), 1536);
    assert_int_equal(off[0], 0);
    assert_int_equal(off[1], 256);
    assert_int_equal(off[2], -1);
    assert_int_equal(off[3], 1024);
    assert_int_equal(mf_persist_layout(&s, 1, off), 1024);
    assert_int_equal(off[3], 768);
    assert_int_equal(mf_persist_at(&s, 3, 1), 768);
    assert_int_equal(mf_persist_at(&s, 3, 0), 1024);
    assert_int_equal(mf_persist_most(&s), 1536);
    /* without bounds every buffer is shared: the region is the furthest end */
    bk[1].bounds = NULL;
    assert_false(mf_persist_any_per_rank(&s));
    assert_int_equal(mf_persist_most(&s), 1024 + 512);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_shard),
        cmocka_unit_test(test_shard_used_whole),
        cmocka_unit_test(test_shard_used_straddling),
        cmocka_unit_test(test_ragged_example),
        cmocka_unit_test(test_ragged_2x4),
        cmocka_unit_test(test_equal_shards),
        cmocka_unit_test(test_persist_regions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
