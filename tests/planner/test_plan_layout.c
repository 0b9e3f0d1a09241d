/*
 * The layout pass (docs/semantics.md §3): tensor and shard quanta in every role's
 * dtype, tight packing, minimal padding that keeps every placement's shards
 * equal and aligned, grouping into buckets (inline layouts identical to a
 * named one share its bucket), bucket names, merging under bucket_size, and
 * located 63-bit overflow errors.
 */
#include <stdlib.h>
#include <string.h>

#include "plan_testlib.h"

static void test_quanta(void **state)
{
    (void)state;
    mf_dtype mixed[] = {MF_BF16, MF_FP32, MF_FP32}, f32[] = {MF_FP32, MF_FP32, MF_FP32},
             f16[] = {MF_FP16, MF_FP16, MF_FP16};
    assert_int_equal(mf_layout_pass_tensor_quantum(mixed), 8);  /* 16 B of bf16 */
    assert_int_equal(mf_layout_pass_tensor_quantum(f32), 4);
    assert_int_equal(mf_layout_pass_tensor_quantum(f16), 8);
    assert_int_equal(mf_layout_pass_shard_quantum(mixed, 256), 128);
    assert_int_equal(mf_layout_pass_shard_quantum(f32, 256), 64);
    assert_int_equal(mf_layout_pass_shard_quantum(mixed, 16), 8);
    assert_int_equal(mf_layout_pass_shard_quantum(f32, 2), 1);
    assert_int_equal(mf_layout_pass_shard_quantum(f32, 1), 1);
}

static int64_t sizes2x4[] = {2, 4};

static void pad_start_of(const char *w, const char *g, const char *o, int want)
{
    mf_mesh m = {.naxes = 2, .world = 8};
    m.axes[0].size = 2;
    m.axes[1].size = 4;
    mf_placement pl[MF_ROLE_COUNT];
    pl[MF_ROLE_WEIGHT] = tl_place(w);
    pl[MF_ROLE_GRAD] = tl_place(g);
    pl[MF_ROLE_MAIN_WEIGHT] = tl_place(o);
    assert_int_equal(mf_layout_pass_pad_start(&m, pl), want);
}

static void test_pad_start(void **state)
{
    (void)state;
    pad_start_of("RF", "PF", "FF", 0);  /* HFSDP: main_weight shards over all */
    pad_start_of("RF", "PF", "RF", 1);  /* HSDP */
    pad_start_of("RR", "PP", "RR", 1);  /* T4 [P,P]->[R,R] may reduce-scatter inside */
    pad_start_of("RR", "RR", "RR", 1);  /* T3 [P,P]->[R,R] likewise */
    pad_start_of("RR", "RP", "RR", 2);  /* axis 1 stays Partial in T3; T4 only all-reduces it */
    pad_start_of("RR", "PR", "RR", 2);  /* T3 reduces axis 1 only: nothing outside it */
    pad_start_of("RR", "PP", "RF", 1);
}

static void test_hfsdp_offsets_and_padding(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    mf_spec *s = tl_spec_new(a, 2, sizes2x4, 2, MF_REDUCE_AVG);
    int l = tl_layout(a, s, "hfsdp", "RF", MF_BF16, "PF", MF_FP32, "FF", MF_FP32);
    int u = tl_unit(a, s, "embed", l, true);
    tl_tensor2(a, s, u, "tok", 1001, 64, -1); /* 64064 */
    tl_tensor2(a, s, u, "adapter", 97, 33, -1); /* 3201 */
    tl_tensor(a, s, u, "norm", 64, -1);
    mf_plan *p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    const mf_bucket *b = &p->sched->buckets[0];
    assert_int_equal(p->sched->nbuckets, 1);
    assert_string_equal(b->name, "embed/hfsdp");
    assert_string_equal(b->tensors[0].name, "embed.tok");
    assert_int_equal(b->tensors[0].offset, 0);
    assert_int_equal(b->tensors[1].offset, 64064);
    assert_int_equal(b->tensors[2].offset, 67272); /* 67265 rounded up to 8 (16 B of bf16) */
    assert_int_equal(b->used, 67336);
    /* quantum 128 (256 B of bf16) x 8 ranks (main_weight shards over all) */
    assert_int_equal(b->length, 67584);
    assert_int_equal(b->tensors[0].ndims, 2);
    assert_int_equal(b->tensors[0].dims[1], 64);
    tl_check_plan(p, 0);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static void test_grouping_and_names(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    mf_spec *s = tl_spec_new(a, 2, sizes2x4, 1, MF_REDUCE_AVG);
    int h = tl_layout(a, s, "hfsdp", "RF", MF_BF16, "PF", MF_FP32, "FF", MF_FP32);
    int n = tl_layout(a, s, "norms", "RR", MF_FP32, "PP", MF_FP32, "RR", MF_FP32);
    int in_same = tl_layout(a, s, "<inline u.d>", "RR", MF_FP32, "PP", MF_FP32, "RR", MF_FP32);
    int in_own = tl_layout(a, s, "<inline u.e>", "RR", MF_BF16, "PR", MF_FP32, "RR", MF_FP32);
    int in_first = tl_layout(a, s, "<inline v.x>", "FF", MF_BF16, "FF", MF_FP32, "FF", MF_FP32);
    int named_later = tl_layout(a, s, "fsdp2d", "FF", MF_BF16, "FF", MF_FP32, "FF", MF_FP32);
    int u = tl_unit(a, s, "u", h, true);
    tl_tensor(a, s, u, "a", 100, -1);
    tl_tensor(a, s, u, "b", 10, n);
    tl_tensor(a, s, u, "c", 100, -1);
    tl_tensor(a, s, u, "d", 10, in_same);
    tl_tensor(a, s, u, "e", 10, in_own);
    int v = tl_unit(a, s, "v", h, true);
    tl_tensor(a, s, v, "x", 7, in_first);
    tl_tensor(a, s, v, "y", 9, named_later);
    mf_plan *p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    const mf_schedule *sc = p->sched;
    assert_int_equal(sc->nbuckets, 4);
    assert_int_equal(sc->units[0].first_bucket, 0);
    assert_int_equal(sc->units[0].nbuckets, 3);
    assert_int_equal(sc->units[1].first_bucket, 3);
    assert_int_equal(sc->units[1].nbuckets, 1);
    assert_string_equal(sc->buckets[0].name, "u/hfsdp");
    assert_int_equal(sc->buckets[0].ntensors, 2);
    assert_string_equal(sc->buckets[0].tensors[1].name, "u.c");
    assert_int_equal(sc->buckets[0].tensors[1].offset, 104);
    assert_string_equal(sc->buckets[1].name, "u/norms");
    assert_int_equal(sc->buckets[1].ntensors, 2);
    assert_string_equal(sc->buckets[1].tensors[1].name, "u.d");
    assert_int_equal(sc->buckets[1].tensors[1].offset, 12); /* fp32 only: 4-element quantum */
    assert_string_equal(sc->buckets[2].name, "u/inline.e");
    /* an inline layout first, then an identical named one: named after the named one */
    assert_string_equal(sc->buckets[3].name, "v/fsdp2d");
    assert_int_equal(sc->buckets[3].ntensors, 2);
    assert_string_equal(sc->buckets[3].layout, "fsdp2d");
    tl_check_plan(p, 1 << 22);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static void test_replicated_padding(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    int64_t one[] = {8};
    mf_spec *s = tl_spec_new(a, 1, one, 1, MF_REDUCE_AVG);
    int ddp = tl_layout(a, s, "ddp", "R", MF_FP32, "P", MF_FP32, "R", MF_FP32);
    int u = tl_unit(a, s, "u", ddp, true);
    tl_tensor(a, s, u, "w", 10, -1);
    mf_plan *p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    assert_int_equal(p->sched->buckets[0].length, 64); /* no Flat anywhere: one 256 B quantum */
    mf_plan_free(p);

    mf_spec *s2 = tl_spec_new(a, 2, sizes2x4, 1, MF_REDUCE_AVG);
    int rep = tl_layout(a, s2, "rep", "RR", MF_FP32, "PP", MF_FP32, "RR", MF_FP32);
    u = tl_unit(a, s2, "u", rep, true);
    tl_tensor(a, s2, u, "w", 10, -1);
    p = tl_plan(s2, NULL, NULL);
    assert_non_null(p);
    assert_int_equal(p->sched->buckets[0].length, 256); /* 64 x dp_inner, for the inner reduce-scatter */
    tl_check_plan(p, 1 << 22);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static void test_align_option(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    int64_t sizes[] = {3, 5};
    mf_spec *s = tl_spec_new(a, 2, sizes, 1, MF_REDUCE_SUM);
    s->align = 512;
    int l = tl_layout(a, s, "f", "FF", MF_FP16, "FF", MF_FP32, "FF", MF_FP32);
    int u = tl_unit(a, s, "u", l, true);
    tl_tensor(a, s, u, "w", 1, -1);
    tl_tensor(a, s, u, "x", 1, -1);
    mf_plan *p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    const mf_bucket *b = &p->sched->buckets[0];
    assert_int_equal(b->tensors[1].offset, 8);
    assert_int_equal(b->used, 9);
    assert_int_equal(b->length, 256 * 15); /* 512 B of fp16 per shard, 15 shards */
    tl_check_plan(p, 1 << 22);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static void test_merging(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    int64_t two[] = {2};
    mf_spec *s = tl_spec_new(a, 1, two, 2, MF_REDUCE_AVG);
    s->bucket_size = 10000;
    int l = tl_layout(a, s, "fsdp", "F", MF_FP32, "F", MF_FP32, "F", MF_FP32);
    int big = tl_layout(a, s, "big", "R", MF_FP32, "P", MF_FP32, "F", MF_FP32);
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "l%d", i);
        int u = tl_unit(a, s, name, l, true);
        tl_tensor(a, s, u, "w", 1000, -1);  /* alone: 1024 elements = 4 KiB */
        tl_tensor(a, s, u, "big", 5000, big); /* alone: 20 KiB > bucket_size: never merges */
    }
    mf_plan *p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    const mf_schedule *sc = p->sched;
    /* l0+l1 (2000 -> 2048 elements, 8 KiB), l2+l3; plus one big bucket per unit */
    assert_int_equal(sc->nbuckets, 6);
    assert_string_equal(sc->buckets[0].name, "l0/fsdp");
    assert_int_equal(sc->buckets[0].unit, 0);
    assert_int_equal(sc->buckets[0].last_unit, 1);
    assert_int_equal(sc->buckets[0].ntensors, 2);
    assert_string_equal(sc->buckets[0].tensors[1].name, "l1.w");
    assert_int_equal(sc->buckets[0].tensors[1].offset, 1000);
    assert_int_equal(sc->buckets[0].length, 2048);
    assert_string_equal(sc->buckets[1].name, "l0/big");
    assert_int_equal(sc->buckets[1].last_unit, 0);
    assert_int_equal(sc->units[1].nbuckets, 1);
    assert_string_equal(sc->buckets[sc->units[1].first_bucket].name, "l1/big");
    assert_string_equal(sc->buckets[3].name, "l2/fsdp");
    assert_int_equal(sc->buckets[3].last_unit, 3);
    tl_check_plan(p, 1 << 22);
    mf_plan_free(p);

    /* a unit that keeps its weights after forward does not merge with one that reshards */
    s->units[1].reshard_after_forward = false;
    p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    sc = p->sched;
    assert_int_equal(sc->buckets[0].last_unit, 0);
    assert_int_equal(sc->units[1].nbuckets, 2);
    const mf_bucket *b2 = &sc->buckets[sc->units[2].first_bucket];
    assert_string_equal(b2->name, "l2/fsdp");
    assert_int_equal(b2->last_unit, 3);
    tl_check_plan(p, 1 << 22);
    mf_plan_free(p);

    /* bucket_size 0: never merge */
    s->bucket_size = 0;
    p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    assert_int_equal(p->sched->nbuckets, 8);
    for (int b = 0; b < 8; b++)
        assert_int_equal(p->sched->buckets[b].last_unit, p->sched->buckets[b].unit);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static void test_overflow_is_located(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    int64_t two[] = {2};
    mf_spec *s = tl_spec_new(a, 1, two, 1, MF_REDUCE_AVG);
    int l = tl_layout(a, s, "fsdp", "F", MF_FP32, "F", MF_FP32, "F", MF_FP32);
    int u = tl_unit(a, s, "huge", l, true);
    tl_tensor(a, s, u, "a", INT64_C(1) << 62, -1);
    tl_tensor(a, s, u, "b", INT64_C(1) << 62, -1);
    char *diag = NULL;
    assert_null(tl_plan(s, NULL, &diag));
    assert_non_null(strstr(diag, "test.mfsdp:1002:3: error: tensor 'huge.b' ends past the 63-bit limit"));
    assert_non_null(strstr(diag, "test.mfsdp:10:3: note: in unit 'huge'"));
    free(diag);

    /* fits as elements, but not once doubled in fp32 bytes */
    mf_spec *s2 = tl_spec_new(a, 1, two, 1, MF_REDUCE_AVG);
    l = tl_layout(a, s2, "fsdp", "F", MF_FP32, "F", MF_FP32, "F", MF_FP32);
    u = tl_unit(a, s2, "big", l, true);
    tl_tensor(a, s2, u, "a", INT64_C(1) << 61, -1);
    assert_null(tl_plan(s2, NULL, &diag));
    assert_non_null(strstr(diag, "test.mfsdp:10:3: error: the bucket of layout 'fsdp' in unit 'big'"));
    assert_non_null(strstr(diag, "63 bits"));
    free(diag);
    mf_arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quanta),
        cmocka_unit_test(test_pad_start),
        cmocka_unit_test(test_hfsdp_offsets_and_padding),
        cmocka_unit_test(test_grouping_and_names),
        cmocka_unit_test(test_replicated_padding),
        cmocka_unit_test(test_align_option),
        cmocka_unit_test(test_merging),
        cmocka_unit_test(test_overflow_is_located),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
