/*
 * Whole buckets' figures on hand-built buckets with hand-computed values:
 * the used-prefix bytes of each collective kind (mf_layout_collective_bytes,
 * mf_layout_op_bytes), the cost model's seconds for them (mf_cost_op_bytes),
 * and the owners per shard and per rank (mf_plan_owners.h).
 */
#include <math.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_plan_owners.h"
#include "plan_testlib.h"

/* Tensors 1000, 600, 500, 300 (2-D, 10 columns) and 10 (1-D) packed by hand
 * at 0, 1024, 2048, 3072, 3376 of a bucket of 4096: on 4 shards of 1024 the
 * used prefixes are 1000, 600, 500, 314. */
#define T(n, nd, d0, d1, num, off) {.name = n, .ndims = nd, .dims = {d0, d1}, .numel = num, .offset = off}
static mf_tensor tensors[5] = {
    T("a", 2, 100, 10, 1000, 0), T("b", 2, 60, 10, 600, 1024), T("c", 2, 50, 10, 500, 2048),
    T("d", 2, 30, 10, 300, 3072), T("e", 1, 10, 0, 10, 3376),
};
#undef T

static mf_bucket bucket(bool whole)
{
    mf_bucket b = {.name = "blk/zw", .length = 4096, .used = 3386, .ntensors = 5, .tensors = tensors};
    b.dtype[MF_ROLE_WEIGHT] = MF_BF16;
    b.dtype[MF_ROLE_GRAD] = MF_FP32;
    b.dtype[MF_ROLE_MAIN_WEIGHT] = MF_FP32;
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        b.place[r] = tl_place("F");
    b.whole[MF_ROLE_GRAD] = b.whole[MF_ROLE_MAIN_WEIGHT] = whole;
    return b;
}

static void test_prefix_bytes_1d(void **state)
{
    (void)state;
    mf_mesh m = tl_mesh(1, 4, 0);
    mf_bucket w = bucket(true), f = bucket(false);
    mf_placement F = tl_place("F");
    /* the rank with the smallest shard (3: 314) moves the other three */
    assert_int_equal(mf_layout_collective_bytes(&m, &w, MF_OP_ALL_GATHER, 0, &F, 1024, MF_BF16), (1000 + 600 + 500) * 2);
    assert_int_equal(mf_layout_collective_bytes(&m, &w, MF_OP_REDUCE_SCATTER, 0, &F, 1024, MF_FP32), 2100 * 4);
    /* the padded (ring) form: (n - 1) * count * size */
    assert_int_equal(mf_layout_collective_bytes(&m, &f, MF_OP_ALL_GATHER, 0, &F, 1024, MF_BF16), 3 * 1024 * 2);
    assert_int_equal(mf_schedule_collective_bytes(MF_OP_ALL_GATHER, 4, 1024, MF_BF16), 3 * 1024 * 2);
    assert_true(mf_layout_bucket_whole(&w));
    assert_false(mf_layout_bucket_whole(&f));
    mf_placement R = tl_place("R");
    assert_ptr_equal(mf_layout_shard_side(MF_OP_REDUCE_SCATTER, &R, &F), &F);
    assert_ptr_equal(mf_layout_shard_side(MF_OP_ALL_GATHER, &F, &R), &F);
}

static void test_prefix_bytes_2d(void **state)
{
    (void)state;
    mf_mesh m = tl_mesh(2, 2, 2);
    mf_bucket w = bucket(true);
    /* [P, F]: 2 shards of 2048 split by the inner axis; used 1624 and 1338 */
    mf_placement PF = tl_place("PF"), FF = tl_place("FF");
    w.place[MF_ROLE_GRAD] = PF;
    /* all_reduce over dp_outer on its own shard: 2 (n-1) ceil(u / n) size, the larger u */
    assert_int_equal(mf_layout_collective_bytes(&m, &w, MF_OP_ALL_REDUCE, 0, &PF, 2048, MF_FP32), 2 * 812 * 4);
    assert_int_equal(mf_schedule_collective_bytes(MF_OP_ALL_REDUCE, 2, 2048, MF_FP32), 2 * 1024 * 4);
    /* reduce_scatter over dp_inner into [P, F]: the member of shard 1 moves shard 0's 1624 */
    assert_int_equal(mf_layout_collective_bytes(&m, &w, MF_OP_REDUCE_SCATTER, 1, &PF, 2048, MF_FP32), 1624 * 4);
    /* [F, F]: shard q = c0 + 2 c1 of 1024: rank (0,0) 0, (1,0) 1, (0,1) 2, (1,1) 3.
       Over dp_outer the groups are {0, 1} (moves 1000) and {2, 3} (moves 500): 1000 */
    assert_int_equal(mf_layout_collective_bytes(&m, &w, MF_OP_REDUCE_SCATTER, 0, &FF, 1024, MF_FP32), 1000 * 4);
    /* over dp_inner: {0, 2} moves 1000, {1, 3} moves 600 */
    assert_int_equal(mf_layout_collective_bytes(&m, &w, MF_OP_ALL_GATHER, 1, &FF, 1024, MF_BF16), 1000 * 2);
}

static void test_op_bytes_and_cost(void **state)
{
    (void)state;
    mf_schedule s = {.mesh = tl_mesh(1, 4, 0), .microbatches = 1};
    mf_bucket b = bucket(true);
    mf_buffer bufs[2] = {{.name = "full", .bucket = 0, .dtype = MF_FP32, .place = tl_place("P"), .count = 4096},
                         {.name = "grad", .bucket = 0, .dtype = MF_FP32, .place = tl_place("F"), .count = 1024}};
    mf_op op = {.kind = MF_OP_REDUCE_SCATTER, .bucket = 0, .axis = 0, .dtype = MF_FP32, .count = 1024, .src = 0, .dst = 1};
    s.buckets = &b;
    s.nbuckets = 1;
    s.buffers = bufs;
    s.nbuffers = 2;
    assert_int_equal(mf_layout_op_bytes(&s, &op), 8400);
    op.kind = MF_OP_CAST;
    assert_int_equal(mf_layout_op_bytes(&s, &op), 0);
    mf_cost_model cm;
    mf_cost_defaults(&cm, &s.mesh);
    /* the ring's figure when the bytes are the ring's */
    double ring = mf_cost_op(&cm, &s.mesh, MF_OP_REDUCE_SCATTER, 0, 1024, MF_FP32);
    assert_true(fabs(mf_cost_op_bytes(&cm, &s.mesh, MF_OP_REDUCE_SCATTER, 0, 1024, 3 * 1024 * 4, MF_FP32) - ring) < 1e-15);
    /* else launch + (n-1) alpha + bytes / beta */
    double want = 5e-6 + 3 * 2e-6 + 8400 / 360e9;
    assert_true(fabs(mf_cost_op_bytes(&cm, &s.mesh, MF_OP_REDUCE_SCATTER, 0, 1024, 8400, MF_FP32) - want) < 1e-15);
    assert_true(mf_cost_op_bytes(&cm, &s.mesh, MF_OP_REDUCE_SCATTER, 0, 1024, 8400, MF_FP32) < ring);
}

static void test_owners(void **state)
{
    (void)state;
    mf_bucket b[2] = {bucket(true), bucket(false)};
    mf_schedule s = {.mesh = tl_mesh(1, 4, 0), .microbatches = 1, .buckets = b, .nbuckets = 2};
    mf_plan_owner_shard o[4];
    assert_int_equal(mf_plan_owners_shards(&s, &b[0], MF_BALANCE_FLOPS, o), 4);
    assert_int_equal(mf_plan_owners_shards(&s, &b[1], MF_BALANCE_FLOPS, o), 0);
    mf_plan_owners_shards(&s, &b[0], MF_BALANCE_FLOPS, o);
    assert_int_equal(o[3].ntensors, 2);
    assert_int_equal(o[3].first, 3);
    assert_int_equal(o[3].used, 314);
    assert_int_equal(o[3].main_bytes, 310 * 4);
    /* flops: rows * cols * min(rows, cols); a 1-D tensor costs its numel */
    assert_int_equal(o[0].cost, 100 * 10 * 10);
    assert_int_equal(o[3].cost, 30 * 10 * 10 + 10);
    mf_plan_owners_shards(&s, &b[0], MF_BALANCE_BYTES, o);
    assert_int_equal(o[3].cost, 310);
    /* per rank: the whole bucket owned, the Flat copy's elements held */
    mf_plan_owner_rank r[4];
    mf_plan_owners_ranks(&s, MF_BALANCE_BYTES, r);
    assert_int_equal(r[0].owned, 1);
    assert_int_equal(r[0].owned_bytes, 4000);
    assert_int_equal(r[0].sharded_bytes, 1000 * 4); /* a's 1000 of [0, 1024) */
    assert_int_equal(r[3].owned, 2);
    assert_int_equal(r[3].sharded_bytes, 310 * 4);
    assert_int_equal(r[3].cost, 310 + 310);
    assert_true(fabs(r[0].flops - 30.0 * 100 * 10 * 10) < 1e-6);
    assert_true(fabs(r[3].flops - 30.0 * 30 * 10 * 10) < 1e-6); /* the 1-D e has none */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_bytes_1d),
        cmocka_unit_test(test_prefix_bytes_2d),
        cmocka_unit_test(test_op_bytes_and_cost),
        cmocka_unit_test(test_owners),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
