/*
 * Every mode of docs/semantics.md §4.5 is just placements: for each, the collectives per
 * step by kind and axis (mf_plan_totals) match the formulas of docs/semantics.md §4.5 (HSDP:
 * RS = U*M, AR = U; HFSDP: RS = U*(M+1), AR = 0, AG = U + 2*U*M; ZeRO-3:
 * AG = 2*U*M, RS = U*M; and the others row by row), and the bytes per rank per
 * step on every axis equal the ring lower bound computed here from each
 * bucket's padded length: (n-1)/n of the data per all-gather / reduce-scatter
 * in the narrower dtype, 2(n-1)/n per all-reduce, on the already-reduced
 * shard. Memory per rank is checked by hand for HFSDP.
 */
#include <stdlib.h>
#include <string.h>

#include "plan_testlib.h"

enum { DDP, ZERO1, ZERO2, ZERO3, HSDP, HFSDP, HSDP_NOSYNC, FSDP2D, Z2IN_Z1OUT, NMODES };

static const struct {
    const char *name;
    int k;
    const char *w, *g, *o;
} modes[NMODES] = {
    [DDP] = {"ddp", 1, "R", "P", "R"},
    [ZERO1] = {"zero1", 1, "R", "P", "F"},
    [ZERO2] = {"zero2", 1, "R", "F", "F"},
    [ZERO3] = {"zero3", 1, "F", "F", "F"},
    [HSDP] = {"hsdp", 2, "RF", "PF", "RF"},
    [HFSDP] = {"hfsdp", 2, "RF", "PF", "FF"},
    [HSDP_NOSYNC] = {"hsdp_nosync", 2, "RF", "PP", "RF"},
    [FSDP2D] = {"fsdp2d", 2, "FF", "FF", "FF"},
    [Z2IN_Z1OUT] = {"zero2_inner_zero1_outer", 2, "RR", "PF", "FF"},
};

static const int64_t tensor_sizes[] = {5000, 12345, 777, 100003};

enum { AG = MF_OP_ALL_GATHER, RS = MF_OP_REDUCE_SCATTER, AR = MF_OP_ALL_REDUCE };

static mf_plan *mode_plan(mf_arena *a, int mode, int U, int64_t M, int no_reshard_unit)
{
    const int64_t one[] = {8}, two[] = {2, 4};
    mf_spec *s = tl_spec_new(a, modes[mode].k, modes[mode].k == 1 ? one : two, M, MF_REDUCE_AVG);
    int l = tl_layout(a, s, modes[mode].name, modes[mode].w, MF_BF16, modes[mode].g, MF_FP32, modes[mode].o, MF_FP32);
    for (int i = 0; i < U; i++) {
        char name[32];
        snprintf(name, sizeof name, "layers.%d", i);
        int u = tl_unit(a, s, name, l, i != no_reshard_unit);
        tl_tensor(a, s, u, "w", tensor_sizes[i % 4], -1);
        if (i % 2)
            tl_tensor(a, s, u, "b", 33, -1);
    }
    char *diag = NULL;
    mf_plan *p = tl_plan(s, NULL, &diag);
    if (!p)
        fail_msg("%s: %s", modes[mode].name, diag);
    free(diag);
    return p;
}

static int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static void check_mode(int mode, int U, int64_t M, int no_reshard_unit)
{
    mf_arena *a = mf_arena_create();
    mf_plan *p = mode_plan(a, mode, U, M, no_reshard_unit);
    assert_int_equal(p->sched->nbuckets, U);
    int64_t want[MF_OPKIND_COUNT][MF_MAX_AXES] = {{0}}, bytes[MF_MAX_AXES] = {0};
    const int64_t bf = 2, f4 = 4;
    for (int b = 0; b < U; b++) {
        int64_t L = p->sched->buckets[b].length;
        int64_t T2 = (b == no_reshard_unit ? 1 : 2) * M; /* T2 runs per pre-hook */
        switch (mode) {
        case DDP:
            want[AR][0] += 1;
            bytes[0] += 2 * 7 * cdiv(L, 8) * f4;
            break;
        case ZERO1:
            want[AG][0] += 1, want[RS][0] += 1;
            bytes[0] += 7 * (L / 8) * bf + 7 * (L / 8) * f4;
            break;
        case ZERO2:
            want[AG][0] += 1, want[RS][0] += M;
            bytes[0] += 7 * (L / 8) * bf + M * 7 * (L / 8) * f4;
            break;
        case ZERO3:
            want[AG][0] += T2, want[RS][0] += M;
            bytes[0] += T2 * 7 * (L / 8) * bf + M * 7 * (L / 8) * f4;
            break;
        case HSDP:
            want[AG][1] += T2, want[RS][1] += M, want[AR][0] += 1;
            bytes[1] += T2 * 3 * (L / 4) * bf + M * 3 * (L / 4) * f4;
            bytes[0] += 2 * 1 * cdiv(L / 4, 2) * f4;
            break;
        case HFSDP:
            want[AG][0] += 1, want[AG][1] += T2, want[RS][1] += M, want[RS][0] += 1;
            bytes[1] += T2 * 3 * (L / 4) * bf + M * 3 * (L / 4) * f4;
            bytes[0] += 1 * (L / 8) * bf + 1 * (L / 8) * f4;
            break;
        case HSDP_NOSYNC:
            want[AG][1] += T2, want[RS][1] += 1, want[AR][0] += 1;
            bytes[1] += T2 * 3 * (L / 4) * bf + 3 * (L / 4) * f4;
            bytes[0] += 2 * 1 * cdiv(L / 4, 2) * f4;
            break;
        case FSDP2D:
            want[AG][0] += T2, want[AG][1] += T2, want[RS][1] += M, want[RS][0] += M;
            bytes[0] += T2 * 1 * (L / 8) * bf + M * 1 * (L / 8) * f4;
            bytes[1] += T2 * 3 * (L / 4) * bf + M * 3 * (L / 4) * f4;
            break;
        case Z2IN_Z1OUT:
            want[AG][0] += 1, want[AG][1] += 1, want[RS][1] += M, want[RS][0] += 1;
            bytes[0] += 1 * (L / 8) * bf + 1 * (L / 8) * f4;
            bytes[1] += 3 * (L / 4) * bf + M * 3 * (L / 4) * f4;
            break;
        }
    }
    mf_summary sum;
    assert_true(mf_plan_totals(p, &sum));
    for (int kind = 0; kind < MF_OPKIND_COUNT; kind++)
        for (int j = 0; j < MF_MAX_AXES; j++)
            if (sum.collectives[kind][j] != want[kind][j])
                fail_msg("%s U=%d M=%lld: %s on axis %d: %lld launches per step, want %lld", modes[mode].name, U,
                         (long long)M, mf_opkind_name((mf_opkind)kind), j, (long long)sum.collectives[kind][j],
                         (long long)want[kind][j]);
    for (int j = 0; j < MF_MAX_AXES; j++)
        if (sum.bytes[j] != bytes[j])
            fail_msg("%s U=%d M=%lld: axis %d: %lld bytes per rank per step, ring lower bound %lld", modes[mode].name,
                     U, (long long)M, j, (long long)sum.bytes[j], (long long)bytes[j]);
    /* the docs/semantics.md §4.5 closed forms, summed over axes */
    int64_t rs = sum.collectives[RS][0] + sum.collectives[RS][1], ar = sum.collectives[AR][0] + sum.collectives[AR][1],
            ag = sum.collectives[AG][0] + sum.collectives[AG][1];
    if (no_reshard_unit < 0) {
        if (mode == HSDP)
            assert_true(rs == U * M && ar == U);
        if (mode == HFSDP)
            assert_true(rs == U * (M + 1) && ar == 0 && ag == U + 2 * U * M);
        if (mode == ZERO3)
            assert_true(ag == 2 * U * M && rs == U * M);
    }
    tl_check_plan(p, 4000000);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static void test_every_mode(void **state)
{
    (void)state;
    for (int mode = 0; mode < NMODES; mode++)
        for (int64_t M = 1; M <= 4; M += 3)
            for (int U = 1; U <= 4; U += 3) {
                check_mode(mode, U, M, -1);
                check_mode(mode, U, M, U - 1); /* the head keeps its weights after forward */
            }
}

static void test_hfsdp_memory_by_hand(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    mf_plan *p = mode_plan(a, HFSDP, 3, 4, -1);
    int64_t L[3], t[3];
    for (int b = 0; b < 3; b++) {
        L[b] = p->sched->buckets[b].length;
        mf_bucket_memory m;
        mf_bucket_memory_of(p, b, &m);
        assert_int_equal(m.main_weight, L[b] / 8 * 4);
        assert_int_equal(m.weight, L[b] / 4 * 2);
        assert_int_equal(m.grad, L[b] / 4 * 4);
        assert_int_equal(m.grad_final, L[b] / 8 * 4);
        assert_int_equal(m.weight_full, L[b] * 2);
        assert_int_equal(m.grad_local, L[b] * 4);
        assert_int_equal(m.weight_stage, L[b] / 8 * 2); /* the cast's output, before the outer gather */
        assert_int_equal(m.grad_stage, L[b] / 4 * 4);   /* the reduce-scatter's output, before accumulate */
        assert_int_equal(m.persistent[MF_ROLE_GRAD], L[b] / 4 * 4 + L[b] / 8 * 4);
        t[b] = L[b] * 2 + L[b] / 8 * 2 + L[b] * 4 + L[b] / 4 * 4;
        assert_int_equal(m.transient[MF_ROLE_WEIGHT] + m.transient[MF_ROLE_GRAD], t[b]);
    }
    mf_plan_memory mem;
    assert_true(mf_plan_memory_of(p, &mem));
    int64_t persistent = 0;
    for (int b = 0; b < 3; b++)
        persistent += L[b] / 8 * 4 + L[b] / 4 * 2 + L[b] / 4 * 4 + L[b] / 8 * 4;
    assert_int_equal(mem.persistent_total, persistent);
    int64_t w01 = t[0] + t[1], w12 = t[1] + t[2];
    assert_int_equal(mem.transient_peak_total, w01 > w12 ? w01 : w12); /* prefetch 1: two units live */
    assert_int_equal(mem.peak_total, persistent + (w01 > w12 ? w01 : w12));
    mf_summary sum;
    assert_true(mf_plan_totals(p, &sum));
    assert_memory_equal(sum.persistent_bytes, mem.persistent, sizeof mem.persistent);
    assert_memory_equal(sum.model_bytes, mem.peak, sizeof mem.peak);
    mf_plan_free(p);

    /* prefetch 2: all three units' transients at once */
    mf_plan *q = mode_plan(a, HFSDP, 3, 4, -1);
    mf_spec *s = (mf_spec *)q->spec;
    mf_plan_free(q);
    s->prefetch = 2;
    p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    assert_true(mf_plan_memory_of(p, &mem));
    assert_int_equal(mem.transient_peak_total, t[0] + t[1] + t[2]);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static void test_replicated_weights_need_no_unshard(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    mf_plan *p = mode_plan(a, DDP, 2, 2, -1);
    mf_bucket_memory m;
    mf_bucket_memory_of(p, 0, &m);
    assert_int_equal(m.weight_full, 0); /* W = Rep: `weight` is the unsharded weight */
    /* G = [P] differs from O = [R]: the all-reduce delivers into its own buffer */
    assert_int_equal(m.grad_final, p->sched->buckets[0].length * 4);
    assert_int_equal(m.grad_stage, 0);  /* T3 has no collective; T4's only step writes grad_final */
    assert_int_equal(m.weight_stage, 0); /* T1 is the cast alone, straight into weight */
    mf_plan_free(p);
    mf_arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_mode),
        cmocka_unit_test(test_hfsdp_memory_by_hand),
        cmocka_unit_test(test_replicated_weights_need_no_unshard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
