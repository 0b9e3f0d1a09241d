/*
 * mf_gpu_plan: maps a schedule onto device calls for one rank (see
 * mf_gpu_plan.h): communicator split keys, the call of each op, NCCL group
 * batching per microbatch position, and the CUDA graph region of each
 * position. Pure C; no CUDA or NCCL call is made here.
 *
 * Invariants of a built plan: every op has exactly one launch; collectives
 * name a valid axis and a reduction (reductions) or none (gathers); a group
 * never spans two hooks, two streams, two communicators or a non-collective;
 * every wait of a region either follows a record of its event inside the
 * region or is elided.
 */
#include "mf_gpu_plan.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mf_diag.h"
#include "mf_layout.h"

#define MF_CALL_NAME(E, name, nccl) name,
static const char *const call_names[] = {MF_GPU_CALL_LIST(MF_CALL_NAME)};
#undef MF_CALL_NAME
#define MF_CALL_NCCL(E, name, nccl) nccl,
static const bool call_nccl[] = {MF_GPU_CALL_LIST(MF_CALL_NCCL)};
#undef MF_CALL_NCCL
#define MF_POS_NAME(E, name) name,
static const char *const pos_names[] = {MF_GPU_POS_LIST(MF_POS_NAME)};
#undef MF_POS_NAME

/* The call of each op kind, indexed by mf_opkind. */
static const mf_gpu_call call_of_kind[MF_OPKIND_COUNT] = {
    [MF_OP_ALL_GATHER] = MF_GPU_CALL_ALL_GATHER,
    [MF_OP_REDUCE_SCATTER] = MF_GPU_CALL_REDUCE_SCATTER,
    [MF_OP_ALL_REDUCE] = MF_GPU_CALL_ALL_REDUCE,
    [MF_OP_SLICE] = MF_GPU_CALL_SLICE,
    [MF_OP_CAST] = MF_GPU_CALL_CAST,
    [MF_OP_ACCUMULATE] = MF_GPU_CALL_ACCUMULATE,
    [MF_OP_RECORD] = MF_GPU_CALL_RECORD,
    [MF_OP_WAIT] = MF_GPU_CALL_WAIT,
};

const char *mf_gpu_call_name(mf_gpu_call c)
{
    return (int)c >= 0 && c < MF_GPU_CALL_COUNT ? call_names[c] : NULL;
}

bool mf_gpu_call_is_nccl(mf_gpu_call c)
{
    return (int)c >= 0 && c < MF_GPU_CALL_COUNT && call_nccl[c];
}

const char *mf_gpu_pos_name(mf_gpu_pos p)
{
    return (int)p >= 0 && p < MF_GPU_POS_COUNT ? pos_names[p] : NULL;
}

mf_gpu_pos mf_gpu_plan_position(int64_t m, int64_t M)
{
    if (M <= 1)
        return MF_GPU_POS_ONLY;
    if (m <= 0)
        return MF_GPU_POS_FIRST;
    return m >= M - 1 ? MF_GPU_POS_LAST : MF_GPU_POS_MIDDLE;
}

bool mf_gpu_plan_when_holds(mf_when when, mf_gpu_pos p)
{
    switch (when) {
    case MF_WHEN_EVERY: return true;
    case MF_WHEN_FIRST: return p == MF_GPU_POS_FIRST || p == MF_GPU_POS_ONLY;
    case MF_WHEN_LAST: return p == MF_GPU_POS_LAST || p == MF_GPU_POS_ONLY;
    default: return false;
    }
}

void mf_gpu_plan_split(const mf_mesh *m, int axis, int64_t rank, int *color, int *key)
{
    int64_t c[MF_MAX_AXES];
    mf_layout_mesh_coords(m, rank, c);
    *color = (int)mf_layout_axis_color(m, axis, rank);
    *key = (int)c[axis];
}

static bool pos_present(mf_gpu_pos p, int64_t M)
{
    switch (p) {
    case MF_GPU_POS_ONLY: return M == 1;
    case MF_GPU_POS_FIRST:
    case MF_GPU_POS_LAST: return M >= 2;
    case MF_GPU_POS_MIDDLE: return M >= 3;
    default: return false;
    }
}

int mf_gpu_plan_hooks(const mf_schedule *s, mf_gpu_pos p, mf_gpu_hook *out, int cap)
{
    int n = 0;
#define MF_PUT(ph, u)                                      \
    do {                                                   \
        if (n < cap)                                       \
            out[n] = (mf_gpu_hook){.phase = (ph), .unit = (u)}; \
        n++;                                               \
    } while (0)
    if (p == MF_GPU_POS_FIRST || p == MF_GPU_POS_ONLY)
        MF_PUT(MF_PHASE_STEP_BEGIN, -1);
    for (int u = 0; u < s->nunits; u++) {
        MF_PUT(MF_PHASE_FORWARD_PRE, u);
        MF_PUT(MF_PHASE_FORWARD_POST, u);
    }
    for (int u = s->nunits - 1; u >= 0; u--) {
        MF_PUT(MF_PHASE_BACKWARD_PRE, u);
        MF_PUT(MF_PHASE_BACKWARD_POST, u);
    }
    if (p == MF_GPU_POS_LAST || p == MF_GPU_POS_ONLY)
        MF_PUT(MF_PHASE_STEP_END, -1);
#undef MF_PUT
    return n;
}

/* Ops per hook: index[phase][unit + 1] lists op ids in ascending order. */
typedef struct hook_index {
    int *start;   /* [MF_PHASE_COUNT * (nunits + 1) + 1] */
    int *ops;     /* [nops] */
    int slots;    /* nunits + 1 */
} hook_index;

static bool index_build(const mf_schedule *s, hook_index *ix)
{
    ix->slots = s->nunits + 1;
    size_t nslot = (size_t)MF_PHASE_COUNT * (size_t)ix->slots;
    ix->start = calloc(nslot + 1, sizeof *ix->start);
    ix->ops = calloc(s->nops > 0 ? (size_t)s->nops : 1, sizeof *ix->ops);
    int *fill = calloc(nslot, sizeof *fill);
    if (!ix->start || !ix->ops || !fill) {
        free(fill);
        return false;
    }
    for (int i = 0; i < s->nops; i++)
        ix->start[(size_t)s->ops[i].phase * ix->slots + (size_t)(s->ops[i].unit + 1) + 1]++;
    for (size_t k = 0; k < nslot; k++)
        ix->start[k + 1] += ix->start[k];
    for (int i = 0; i < s->nops; i++) {
        size_t slot = (size_t)s->ops[i].phase * ix->slots + (size_t)(s->ops[i].unit + 1);
        ix->ops[ix->start[slot] + fill[slot]++] = i;
    }
    free(fill);
    return true;
}

static void index_free(hook_index *ix)
{
    free(ix->start);
    free(ix->ops);
}

/* Checks the fields the device calls depend on; returns false with a message. */
static bool check_op(const mf_schedule *s, const mf_op *op, char *err, size_t errlen)
{
    if ((int)op->kind < 0 || op->kind >= MF_OPKIND_COUNT) {
        mf_diag_errf(err, errlen, "op %d: unknown op kind %d", op->id, (int)op->kind);
        return false;
    }
    if ((int)op->phase < 0 || op->phase >= MF_PHASE_COUNT || op->unit < -1 || op->unit >= s->nunits ||
        (int)op->stream < 0 || op->stream >= MF_STREAM_COUNT || (int)op->when < 0 ||
        op->when >= MF_WHEN_COUNT) {
        mf_diag_errf(err, errlen, "op %d: phase, unit, stream or when out of range", op->id);
        return false;
    }
    bool needs_axis = mf_opkind_on_axis(op->kind);
    if (needs_axis && (op->axis < 0 || op->axis >= s->mesh.naxes)) {
        mf_diag_errf(err, errlen, "op %d (%s): axis %d out of range", op->id, mf_opkind_name(op->kind), op->axis);
        return false;
    }
    bool event = op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT;
    if (event && (op->event < 0 || op->event >= s->nevents)) {
        mf_diag_errf(err, errlen, "op %d (%s): event %d out of range", op->id, mf_opkind_name(op->kind), op->event);
        return false;
    }
    if (!event && (op->src < 0 || op->src >= s->nbuffers || op->dst < 0 || op->dst >= s->nbuffers ||
                   op->count < 0)) {
        mf_diag_errf(err, errlen, "op %d (%s): buffers or count out of range", op->id, mf_opkind_name(op->kind));
        return false;
    }
    return true;
}

static bool build_groups(mf_gpu_plan *p, const hook_index *ix, mf_gpu_pos pos, const mf_gpu_hook *hooks,
                         int nhooks)
{
    const mf_schedule *s = p->s;
    size_t n = s->nops > 0 ? (size_t)s->nops : 1;
    p->group[pos] = malloc(n * sizeof(int));
    p->group_begin[pos] = calloc(n, sizeof(bool));
    p->group_end[pos] = calloc(n, sizeof(bool));
    if (!p->group[pos] || !p->group_begin[pos] || !p->group_end[pos])
        return false;
    for (int i = 0; i < s->nops; i++)
        p->group[pos][i] = -1;
    int ngroups = 0;
    for (int h = 0; h < nhooks; h++) {
        size_t slot = (size_t)hooks[h].phase * ix->slots + (size_t)(hooks[h].unit + 1);
        int prev = -1; /* previous issued op of this hook */
        for (int k = ix->start[slot]; k < ix->start[slot + 1]; k++) {
            int id = ix->ops[k];
            if (!mf_gpu_plan_when_holds(s->ops[id].when, pos))
                continue;
            const mf_gpu_launch *a = prev >= 0 ? &p->launch[prev] : NULL, *b = &p->launch[id];
            bool joins = a && mf_gpu_call_is_nccl(a->call) && mf_gpu_call_is_nccl(b->call) &&
                         a->stream == b->stream && a->comm == b->comm;
            if (joins) {
                if (p->group[pos][prev] < 0) {
                    p->group[pos][prev] = ngroups++;
                    p->group_begin[pos][prev] = true;
                }
                p->group[pos][id] = p->group[pos][prev];
                p->group_end[pos][prev] = false;
                p->group_end[pos][id] = true;
            }
            prev = id;
        }
    }
    p->ngroups[pos] = ngroups;
    return true;
}

static bool build_region(mf_gpu_plan *p, const hook_index *ix, mf_gpu_pos pos, const mf_gpu_hook *hooks,
                         int nhooks)
{
    const mf_schedule *s = p->s;
    mf_gpu_region *r = &p->region[pos];
    size_t n = s->nops > 0 ? (size_t)s->nops : 1;
    r->present = true;
    r->nhooks = nhooks;
    r->hooks = malloc((size_t)nhooks * sizeof *r->hooks);
    r->ops = malloc(n * sizeof *r->ops);
    p->elided[pos] = calloc(n, sizeof(bool));
    p->hook_last[pos] = calloc(n, sizeof(bool));
    bool *recorded = calloc(s->nevents > 0 ? (size_t)s->nevents : 1, sizeof(bool));
    if (!r->hooks || !r->ops || !p->elided[pos] || !p->hook_last[pos] || !recorded) {
        free(recorded);
        return false;
    }
    memcpy(r->hooks, hooks, (size_t)nhooks * sizeof *hooks);
    r->nops = 0;
    for (int h = 0; h < nhooks; h++) {
        size_t slot = (size_t)hooks[h].phase * ix->slots + (size_t)(hooks[h].unit + 1);
        int last = -1;
        for (int k = ix->start[slot]; k < ix->start[slot + 1]; k++) {
            int id = ix->ops[k];
            const mf_op *op = &s->ops[id];
            if (!mf_gpu_plan_when_holds(op->when, pos))
                continue;
            last = id;
            r->ops[r->nops++] = id;
            r->stream_used[op->stream] = true;
            if (op->kind == MF_OP_RECORD)
                recorded[op->event] = true;
            else if (op->kind == MF_OP_WAIT && !recorded[op->event])
                p->elided[pos][id] = true;
        }
        if (last >= 0)
            p->hook_last[pos][last] = true;
    }
    free(recorded);
    return true;
}

mf_gpu_plan *mf_gpu_plan_build(const mf_schedule *s, int64_t rank, char *err, size_t errlen)
{
    hook_index ix = {0};
    mf_gpu_hook *hooks = NULL;
    mf_gpu_plan *p = NULL;
    if (!s || rank < 0 || rank >= s->mesh.world || s->mesh.naxes < 1 || s->mesh.naxes > MF_MAX_AXES) {
        mf_diag_errf(err, errlen, "rank %lld out of range for a world of %lld", (long long)rank,
                     s ? (long long)s->mesh.world : 0LL);
        return NULL;
    }
    p = calloc(1, sizeof *p);
    if (!p)
        goto oom;
    p->s = s;
    p->rank = rank;
    mf_layout_mesh_coords(&s->mesh, rank, p->coords);
    for (int j = 0; j < s->mesh.naxes; j++)
        mf_gpu_plan_split(&s->mesh, j, rank, &p->color[j], &p->key[j]);

    p->launch = calloc(s->nops > 0 ? (size_t)s->nops : 1, sizeof *p->launch);
    if (!p->launch)
        goto oom;
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (!check_op(s, op, err, errlen))
            goto fail;
        mf_gpu_launch *l = &p->launch[i];
        l->call = call_of_kind[op->kind];
        l->stream = op->stream;
        l->comm = mf_opkind_is_collective(op->kind) ? op->axis : -1;
        l->red = MF_GPU_RED_NONE;
        if (op->kind == MF_OP_REDUCE_SCATTER || op->kind == MF_OP_ALL_REDUCE)
            l->red = s->reduce == MF_REDUCE_SUM ? MF_GPU_RED_SUM : MF_GPU_RED_AVG;
        l->src_offset = op->kind == MF_OP_SLICE ? p->coords[op->axis] * op->count : 0;
        if (op->kind == MF_OP_SLICE && s->buckets[op->bucket].bounds) /* ragged: the dst range in the src's */
            l->src_offset =
                mf_layout_bucket_range(&s->mesh, &s->buckets[op->bucket], &s->buffers[op->dst].place, rank).offset -
                mf_layout_bucket_range(&s->mesh, &s->buckets[op->bucket], &s->buffers[op->src].place, rank).offset;
    }

    if (!index_build(s, &ix))
        goto oom;
    int cap = 2 + 4 * s->nunits;
    hooks = malloc((size_t)cap * sizeof *hooks);
    if (!hooks)
        goto oom;
    for (int pos = 0; pos < MF_GPU_POS_COUNT; pos++) {
        if (!pos_present((mf_gpu_pos)pos, s->microbatches))
            continue;
        int nh = mf_gpu_plan_hooks(s, (mf_gpu_pos)pos, hooks, cap);
        if (!build_groups(p, &ix, (mf_gpu_pos)pos, hooks, nh) ||
            !build_region(p, &ix, (mf_gpu_pos)pos, hooks, nh))
            goto oom;
    }
    free(hooks);
    index_free(&ix);
    return p;
oom:
    mf_diag_errf(err, errlen, "out of memory building the GPU plan");
fail:
    free(hooks);
    index_free(&ix);
    mf_gpu_plan_free(p);
    return NULL;
}

void mf_gpu_plan_free(mf_gpu_plan *p)
{
    if (!p)
        return;
    free(p->launch);
    for (int pos = 0; pos < MF_GPU_POS_COUNT; pos++) {
        free(p->group[pos]);
        free(p->group_begin[pos]);
        free(p->group_end[pos]);
        free(p->elided[pos]);
        free(p->hook_last[pos]);
        free(p->region[pos].hooks);
        free(p->region[pos].ops);
    }
    free(p);
}

static const char *red_name(mf_gpu_red r)
{
    return r == MF_GPU_RED_SUM ? "ncclSum" : r == MF_GPU_RED_AVG ? "ncclAvg" : "-";
}

void mf_gpu_plan_dump(const mf_gpu_plan *p, FILE *out)
{
    const mf_schedule *s = p->s;
    fprintf(out, "rank %lld coords", (long long)p->rank);
    for (int j = 0; j < s->mesh.naxes; j++)
        fprintf(out, " %s=%lld", s->mesh.axes[j].name ? s->mesh.axes[j].name : "?", (long long)p->coords[j]);
    fprintf(out, "\n");
    for (int j = 0; j < s->mesh.naxes; j++)
        fprintf(out, "comm %d (%s): ncclCommSplit color %d key %d, %lld ranks\n", j,
                s->mesh.axes[j].name ? s->mesh.axes[j].name : "?", p->color[j], p->key[j],
                (long long)s->mesh.axes[j].size);
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        const mf_gpu_launch *l = &p->launch[i];
        fprintf(out, "op %d %s %s %s %s %s", op->id, mf_phase_name(op->phase),
                op->unit >= 0 && s->units ? s->units[op->unit].name : "-", mf_when_name(op->when),
                mf_stream_name(l->stream), mf_gpu_call_name(l->call));
        if (l->comm >= 0)
            fprintf(out, " comm=%d %s", l->comm, red_name(l->red));
        if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
            fprintf(out, " event=%d", op->event);
        else
            fprintf(out, " %s count=%lld src_offset=%lld", mf_dtype_name(op->dtype), (long long)op->count,
                    (long long)l->src_offset);
        fprintf(out, "\n");
    }
    for (int pos = 0; pos < MF_GPU_POS_COUNT; pos++) {
        const mf_gpu_region *r = &p->region[pos];
        if (!r->present)
            continue;
        int elided = 0;
        for (int k = 0; k < r->nops; k++)
            elided += p->elided[pos][r->ops[k]];
        fprintf(out, "position %s: %d hooks, %d ops, %d groups, %d waits elided in graph mode, streams%s%s%s\n",
                mf_gpu_pos_name((mf_gpu_pos)pos), r->nhooks, r->nops, p->ngroups[pos], elided,
                r->stream_used[MF_STREAM_COMPUTE] ? " compute" : "", r->stream_used[MF_STREAM_INNER] ? " inner" : "",
                r->stream_used[MF_STREAM_OUTER] ? " outer" : "");
        for (int k = 0; k < r->nops; k++) {
            int id = r->ops[k];
            if (p->group_begin[pos][id])
                fprintf(out, "  group %d: ops %d", p->group[pos][id], id);
            else if (p->group[pos][id] >= 0)
                fprintf(out, " %d", id);
            if (p->group_end[pos][id])
                fprintf(out, "\n");
        }
    }
}
