/*
 * The GPU backends' plan (runtime/backends/mf_gpu_plan.c), checked without a GPU:
 * communicator split colors and keys on every test mesh, the op -> device call
 * table, NCCL group batching, and the CUDA graph region of each microbatch
 * position (fork/join, waits satisfied by graph launch order, the last
 * microbatch's outer reduction inside the captured region).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "gpu_synth.h"
#include "mf_gpu_plan.h"
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

/* Every axis of every mesh: ranks with one color form exactly one axis group,
 * ordered by key as mf_layout_axis_group orders it; colors are dense. */
static void test_split_every_mesh(void **state)
{
    (void)state;
    static const int64_t meshes[][5] = {
        /* naxes, sizes... */
        {2, 1, 1}, {2, 1, 4}, {2, 2, 2}, {2, 2, 4}, {2, 4, 2}, {2, 3, 2},
        {3, 2, 2, 2}, {1, 8}, {1, 1}, {4, 2, 3, 1, 2}, {3, 3, 1, 5},
    };
    for (size_t t = 0; t < sizeof meshes / sizeof meshes[0]; t++) {
        mf_mesh m = mesh_of((int)meshes[t][0], &meshes[t][1]);
        for (int j = 0; j < m.naxes; j++) {
            int64_t n = m.axes[j].size, ngroups = m.world / n;
            int64_t *seen = calloc((size_t)(ngroups * n), sizeof *seen);
            int64_t *group = calloc((size_t)n, sizeof *group);
            assert_non_null(seen);
            assert_non_null(group);
            for (int64_t g = 0; g < ngroups * n; g++)
                seen[g] = -1;
            for (int64_t r = 0; r < m.world; r++) {
                int color, key;
                mf_gpu_plan_split(&m, j, r, &color, &key);
                assert_true(color >= 0 && color < ngroups);
                assert_true(key >= 0 && key < n);
                /* one rank per (color, key) */
                assert_int_equal(seen[color * n + key], -1);
                seen[color * n + key] = r;
                /* the key orders the group like the shard math does */
                mf_layout_axis_group(&m, j, r, group);
                assert_int_equal(group[key], r);
                /* every member of r's axis group has r's color */
                for (int64_t i = 0; i < n; i++) {
                    int c2, k2;
                    mf_gpu_plan_split(&m, j, group[i], &c2, &k2);
                    assert_int_equal(c2, color);
                    assert_int_equal(k2, i);
                }
            }
            for (int64_t g = 0; g < ngroups * n; g++)
                assert_true(seen[g] >= 0);
            free(seen);
            free(group);
        }
    }
}

/* On [2, 4] rank 6 = (1, 2): its inner group is ranks 4..7 (node 1), its outer
 * group ranks {2, 6}; inner and outer never share a (comm, color). */
static void test_split_hand_computed(void **state)
{
    (void)state;
    int64_t sizes[] = {2, 4};
    mf_mesh m = mesh_of(2, sizes);
    int color, key;
    mf_gpu_plan_split(&m, 1, 6, &color, &key);
    assert_int_equal(color, 1);
    assert_int_equal(key, 2);
    mf_gpu_plan_split(&m, 0, 6, &color, &key);
    assert_int_equal(color, 2);
    assert_int_equal(key, 1);
    mf_gpu_plan_split(&m, 0, 2, &color, &key);
    assert_int_equal(color, 2);
    assert_int_equal(key, 0);
}

static void test_call_table(void **state)
{
    (void)state;
    assert_string_equal(mf_gpu_call_name(MF_GPU_CALL_ALL_GATHER), "ncclAllGather");
    assert_string_equal(mf_gpu_call_name(MF_GPU_CALL_REDUCE_SCATTER), "ncclReduceScatter");
    assert_string_equal(mf_gpu_call_name(MF_GPU_CALL_ALL_REDUCE), "ncclAllReduce");
    assert_string_equal(mf_gpu_call_name(MF_GPU_CALL_SLICE), "cudaMemcpyAsync");
    assert_string_equal(mf_gpu_call_name(MF_GPU_CALL_RECORD), "cudaEventRecord");
    assert_string_equal(mf_gpu_call_name(MF_GPU_CALL_WAIT), "cudaStreamWaitEvent");
    assert_null(mf_gpu_call_name(MF_GPU_CALL_COUNT));
    assert_true(mf_gpu_call_is_nccl(MF_GPU_CALL_ALL_REDUCE));
    assert_false(mf_gpu_call_is_nccl(MF_GPU_CALL_CAST));
    assert_false(mf_gpu_call_is_nccl(MF_GPU_CALL_SLICE));

    mf_schedule *s = synth_hfsdp(2, 4, 2, 2, 2);
    assert_non_null(s);
    for (int64_t r = 0; r < s->mesh.world; r++) {
        char err[256] = "";
        mf_gpu_plan *p = mf_gpu_plan_build(s, r, err, sizeof err);
        assert_non_null(p);
        for (int i = 0; i < s->nops; i++) {
            const mf_op *op = &s->ops[i];
            const mf_gpu_launch *l = &p->launch[i];
            assert_int_equal(l->stream, op->stream);
            switch (op->kind) {
            case MF_OP_ALL_GATHER:
                assert_int_equal(l->call, MF_GPU_CALL_ALL_GATHER);
                assert_int_equal(l->comm, op->axis);
                assert_int_equal(l->red, MF_GPU_RED_NONE);
                break;
            case MF_OP_REDUCE_SCATTER:
                assert_int_equal(l->call, MF_GPU_CALL_REDUCE_SCATTER);
                assert_int_equal(l->comm, op->axis);
                assert_int_equal(l->red, MF_GPU_RED_AVG);
                /* inner on the inner stream, outer on the outer stream */
                assert_int_equal(l->stream, op->axis == 1 ? MF_STREAM_INNER : MF_STREAM_OUTER);
                break;
            case MF_OP_CAST:
                assert_int_equal(l->call, MF_GPU_CALL_CAST);
                assert_int_equal(l->comm, -1);
                break;
            case MF_OP_ACCUMULATE:
                assert_int_equal(l->call, MF_GPU_CALL_ACCUMULATE);
                break;
            case MF_OP_RECORD:
                assert_int_equal(l->call, MF_GPU_CALL_RECORD);
                break;
            case MF_OP_WAIT:
                assert_int_equal(l->call, MF_GPU_CALL_WAIT);
                break;
            default:
                fail_msg("unexpected op kind %d", (int)op->kind);
            }
        }
        mf_gpu_plan_free(p);
    }
    mf_schedule_free(s);
}

/* ncclSum for reduce sum; the slice's source offset is this rank's coordinate
 * times the count (this rank's shard of the replicated buffer). */
static void test_slice_offsets_and_sum(void **state)
{
    (void)state;
    mf_schedule *s = synth_zero1_slice(4, 2);
    assert_non_null(s);
    s->reduce = MF_REDUCE_SUM;
    for (int64_t r = 0; r < 4; r++) {
        mf_gpu_plan *p = mf_gpu_plan_build(s, r, NULL, 0);
        assert_non_null(p);
        int slices = 0, reductions = 0;
        for (int i = 0; i < s->nops; i++) {
            if (s->ops[i].kind == MF_OP_SLICE) {
                assert_int_equal(p->launch[i].call, MF_GPU_CALL_SLICE);
                assert_int_equal(p->launch[i].src_offset, r * s->ops[i].count);
                assert_int_equal(p->launch[i].comm, -1); /* local: no communicator */
                slices++;
            } else if (s->ops[i].kind == MF_OP_ALL_REDUCE) {
                assert_int_equal(p->launch[i].red, MF_GPU_RED_SUM);
                reductions++;
            } else {
                assert_int_equal(p->launch[i].src_offset, 0);
            }
        }
        assert_int_equal(slices, 1);
        assert_int_equal(reductions, 1);
        mf_gpu_plan_free(p);
    }
    mf_schedule_free(s);
}

/* Checks the structural invariants of the groups of one position and returns
 * the number of grouped ops. */
static int check_groups(const mf_gpu_plan *p, mf_gpu_pos pos)
{
    const mf_schedule *s = p->s;
    const mf_gpu_region *r = &p->region[pos];
    int grouped = 0, open = -1, prev = -1;
    for (int k = 0; k < r->nops; k++) {
        int id = r->ops[k];
        int g = p->group[pos][id];
        if (p->group_begin[pos][id]) {
            assert_int_equal(open, -1);
            open = g;
        }
        if (g >= 0) {
            assert_int_equal(g, open); /* members are contiguous in issue order */
            assert_true(mf_gpu_call_is_nccl(p->launch[id].call));
            if (!p->group_begin[pos][id]) {
                /* same hook, stream and communicator as the previous member */
                assert_int_equal(s->ops[prev].phase, s->ops[id].phase);
                assert_int_equal(s->ops[prev].unit, s->ops[id].unit);
                assert_int_equal(p->launch[prev].stream, p->launch[id].stream);
                assert_int_equal(p->launch[prev].comm, p->launch[id].comm);
            }
            grouped++;
        } else {
            assert_int_equal(open, -1); /* nothing ungrouped inside an open group */
        }
        if (p->group_end[pos][id]) {
            assert_true(g >= 0);
            open = -1;
        }
        prev = id;
    }
    assert_int_equal(open, -1);
    return grouped;
}

/* With B buckets per unit the B gathers/reductions of one hook on one stream
 * form one group; with B = 1 there is nothing to group. */
static void test_groups(void **state)
{
    (void)state;
    for (int B = 1; B <= 3; B++) {
        mf_schedule *s = synth_hfsdp(2, 4, 3, 2, B);
        assert_non_null(s);
        mf_gpu_plan *p = mf_gpu_plan_build(s, 5, NULL, 0);
        assert_non_null(p);
        int U = s->nunits;
        /* first: outer AG (U groups), inner AG fwd + bwd (2U), inner RS (U) */
        assert_int_equal(check_groups(p, MF_GPU_POS_FIRST), B > 1 ? 4 * U * B : 0);
        assert_int_equal(p->ngroups[MF_GPU_POS_FIRST], B > 1 ? 4 * U : 0);
        assert_int_equal(check_groups(p, MF_GPU_POS_MIDDLE), B > 1 ? 3 * U * B : 0);
        assert_int_equal(p->ngroups[MF_GPU_POS_MIDDLE], B > 1 ? 3 * U : 0);
        /* last: inner AG fwd + bwd, inner RS, outer RS */
        assert_int_equal(check_groups(p, MF_GPU_POS_LAST), B > 1 ? 4 * U * B : 0);
        assert_false(p->region[MF_GPU_POS_ONLY].present);
        mf_gpu_plan_free(p);
        mf_schedule_free(s);
    }
}

/* Replays the eager issue order of one step and checks the graph regions
 * partition it; waits are elided exactly when their event's latest record
 * precedes the region. */
static void check_regions(const mf_schedule *s, const mf_gpu_plan *p)
{
    int64_t M = s->microbatches;
    int *last_record_region = malloc((size_t)(s->nevents > 0 ? s->nevents : 1) * sizeof(int));
    assert_non_null(last_record_region);
    for (int e = 0; e < s->nevents; e++)
        last_record_region[e] = -1;
    mf_gpu_hook hooks[64];
    for (int64_t m = 0; m < M; m++) {
        mf_gpu_pos pos = mf_gpu_plan_position(m, M);
        const mf_gpu_region *r = &p->region[pos];
        assert_true(r->present);
        int nh = mf_gpu_plan_hooks(s, pos, hooks, 64);
        assert_int_equal(nh, r->nhooks);
        int k = 0;
        for (int h = 0; h < nh; h++) {
            assert_int_equal(r->hooks[h].phase, hooks[h].phase);
            assert_int_equal(r->hooks[h].unit, hooks[h].unit);
            int last = -1;
            for (int i = 0; i < s->nops; i++) {
                const mf_op *op = &s->ops[i];
                if (op->phase != hooks[h].phase || op->unit != hooks[h].unit || !mf_gpu_plan_when_holds(op->when, pos))
                    continue;
                if (last >= 0)
                    assert_false(p->hook_last[pos][last]); /* only the hook's last op ends it */
                last = i;
                assert_true(k < r->nops);
                assert_int_equal(r->ops[k], i); /* the region is the eager issue order */
                k++;
                if (op->kind == MF_OP_RECORD)
                    last_record_region[op->event] = (int)m;
                else if (op->kind == MF_OP_WAIT)
                    assert_int_equal(p->elided[pos][i], last_record_region[op->event] != (int)m);
            }
            if (last >= 0)
                assert_true(p->hook_last[pos][last]);
        }
        assert_int_equal(k, r->nops);
    }
    free(last_record_region);
}

static void test_graph_regions(void **state)
{
    (void)state;
    for (int64_t M = 1; M <= 4; M++) {
        mf_schedule *s = synth_hfsdp(2, 2, M, 3, 1);
        assert_non_null(s);
        mf_gpu_plan *p = mf_gpu_plan_build(s, 3, NULL, 0);
        assert_non_null(p);
        assert_int_equal(p->region[MF_GPU_POS_ONLY].present, M == 1);
        assert_int_equal(p->region[MF_GPU_POS_FIRST].present, M >= 2);
        assert_int_equal(p->region[MF_GPU_POS_LAST].present, M >= 2);
        assert_int_equal(p->region[MF_GPU_POS_MIDDLE].present, M >= 3);
        check_regions(s, p);

        /* The region that ends the step holds every outer reduce-scatter (T4)
         * and step_end's wait for it, and joins the outer stream back. */
        mf_gpu_pos end = M == 1 ? MF_GPU_POS_ONLY : MF_GPU_POS_LAST;
        const mf_gpu_region *r = &p->region[end];
        assert_int_equal(r->hooks[r->nhooks - 1].phase, MF_PHASE_STEP_END);
        assert_true(r->stream_used[MF_STREAM_OUTER]);
        int t4 = 0;
        for (int k = 0; k < r->nops; k++) {
            const mf_op *op = &s->ops[r->ops[k]];
            if (op->kind == MF_OP_REDUCE_SCATTER && op->axis == 0)
                t4++;
            if (op->phase == MF_PHASE_STEP_END)
                assert_false(p->elided[end][r->ops[k]]);
        }
        assert_int_equal(t4, s->nunits);
        if (M >= 3) {
            /* middle: no outer traffic; the inner wait for the first
             * microbatch's outer gather is satisfied by launch order */
            const mf_gpu_region *mid = &p->region[MF_GPU_POS_MIDDLE];
            assert_false(mid->stream_used[MF_STREAM_OUTER]);
            int elided = 0;
            for (int k = 0; k < mid->nops; k++)
                elided += p->elided[MF_GPU_POS_MIDDLE][mid->ops[k]];
            assert_int_equal(elided, s->nunits);
            assert_int_equal(mid->hooks[0].phase, MF_PHASE_FORWARD_PRE);
            assert_int_equal(mid->hooks[mid->nhooks - 1].phase, MF_PHASE_BACKWARD_POST);
            assert_int_equal(mid->hooks[mid->nhooks - 1].unit, 0);
        }
        if (M >= 2) {
            const mf_gpu_region *first = &p->region[MF_GPU_POS_FIRST];
            assert_int_equal(first->hooks[0].phase, MF_PHASE_STEP_BEGIN);
            for (int k = 0; k < first->nops; k++)
                assert_false(p->elided[MF_GPU_POS_FIRST][first->ops[k]]);
        }
        mf_gpu_plan_free(p);
        mf_schedule_free(s);
    }
}

static void test_bad_input(void **state)
{
    (void)state;
    mf_schedule *s = synth_hfsdp(2, 2, 2, 1, 1);
    assert_non_null(s);
    char err[256] = "";
    assert_null(mf_gpu_plan_build(s, 4, err, sizeof err));
    assert_non_null(strstr(err, "out of range"));
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].kind == MF_OP_ALL_GATHER) {
            s->ops[i].axis = 2;
            break;
        }
    err[0] = 0;
    assert_null(mf_gpu_plan_build(s, 0, err, sizeof err));
    assert_non_null(strstr(err, "axis 2 out of range"));
    mf_schedule_free(s);
}

static void test_dump(void **state)
{
    (void)state;
    mf_schedule *s = synth_hfsdp(2, 4, 2, 1, 2);
    assert_non_null(s);
    mf_gpu_plan *p = mf_gpu_plan_build(s, 6, NULL, 0);
    assert_non_null(p);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    mf_gpu_plan_dump(p, f);
    fclose(f);
    assert_non_null(strstr(text, "comm 1 (dp_inner): ncclCommSplit color 1 key 2, 4 ranks"));
    assert_non_null(strstr(text, "comm 0 (dp_outer): ncclCommSplit color 2 key 1, 2 ranks"));
    assert_non_null(strstr(text, "inner ncclReduceScatter comm=1 ncclAvg fp32"));
    assert_non_null(strstr(text, "position last:"));
    free(text);
    mf_gpu_plan_free(p);
    mf_schedule_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_every_mesh),
        cmocka_unit_test(test_split_hand_computed),
        cmocka_unit_test(test_call_table),
        cmocka_unit_test(test_slice_offsets_and_sum),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_graph_regions),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_dump),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
