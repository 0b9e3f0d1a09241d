/*
 * mf_programs: two programs beside the training step, built from the step's
 * data ops once the buffers have their offsets (docs/schedule.md §3.1):
 *
 *   a short step's end   step_end, when short. A step that ends after
 *                        m < M microbatches ran microbatch m-1 as a middle
 *                        one, so no T4 chain ran: they run here, every
 *                        bucket's in the order backward issues them.
 *   an evaluation pass   eval_forward_pre(u), when every: the T1 and T2
 *                        chains (main_weight -> weight -> weight_full) of the
 *                        buckets whose first unit is u, in bucket order;
 *                        compute waits for their end. The optimizer may have
 *                        changed main_weight since the last step, so T1 runs
 *                        on every pass.
 *
 * Each hook's ops form one serial chain, ordered by construction: a barrier
 * first (a record on compute and on every stream the step uses; the chain's
 * first stream waits for the others), a record/wait hand-off wherever the
 * stream changes, and a record at the end that compute waits for. Every op
 * of the chain thus comes after everything issued before the hook and before
 * everything compute does after it, so the arena's reuse rule holds whatever
 * the step's schedule overlapped; the verifier replays both programs anyway
 * (core/mf_verify.c, mf_verify_memory.c). The price is no overlap inside
 * the chain: a short step is rare, and an evaluation pass has no backward to
 * hide its gathers behind.
 *
 * Cost: linear in ops + buckets.
 */
#include "mf_programs.h"

#include <stdlib.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_live.h"

typedef struct chain {
    mf_schedule *s;
    mf_vec *ops;            /* mf_op: the new ops */
    const bool *used;       /* [MF_STREAM_COUNT]: streams the step's data ops use */
    mf_phase phase;
    int unit;
    mf_when when;
    int barrier[MF_STREAM_COUNT]; /* event each stream recorded at the start; -1 none */
    int at;                 /* stream of the chain's last data op; -1 before the first */
    bool oom;
} chain;

static void sync_op(chain *c, mf_stream stream, mf_opkind kind, int event)
{
    mf_op *op = mf_vec_push(c->ops);
    if (!op) {
        c->oom = true;
        return;
    }
    *op = (mf_op){.phase = c->phase, .unit = c->unit, .when = c->when, .stream = stream, .kind = kind,
                  .bucket = -1, .axis = -1, .dtype = MF_FP32, .src = -1, .dst = -1, .event = event};
}

static int new_event(chain *c)
{
    return c->s->nevents++;
}

static void chain_begin(chain *c, mf_phase phase, int unit, mf_when when)
{
    c->phase = phase;
    c->unit = unit;
    c->when = when;
    c->at = -1;
    for (int st = 0; st < MF_STREAM_COUNT; st++) {
        c->barrier[st] = -1;
        if (st == MF_STREAM_COMPUTE || c->used[st]) {
            c->barrier[st] = new_event(c);
            sync_op(c, (mf_stream)st, MF_OP_RECORD, c->barrier[st]);
        }
    }
}

/* Appends a copy of data op `d` at the chain's hook. */
static void chain_add(chain *c, const mf_op *d)
{
    if (c->at < 0) {
        for (int st = 0; st < MF_STREAM_COUNT; st++)
            if (c->barrier[st] >= 0 && st != (int)d->stream)
                sync_op(c, d->stream, MF_OP_WAIT, c->barrier[st]);
    } else if (c->at != (int)d->stream) {
        int e = new_event(c);
        sync_op(c, (mf_stream)c->at, MF_OP_RECORD, e);
        sync_op(c, d->stream, MF_OP_WAIT, e);
    }
    c->at = (int)d->stream;
    mf_op *op = mf_vec_push(c->ops);
    if (!op) {
        c->oom = true;
        return;
    }
    *op = *d;
    op->phase = c->phase;
    op->unit = c->unit;
    op->when = c->when;
}

/* Compute waits for the chain (or, when it moved no data, for the barrier). */
static void chain_end(chain *c)
{
    if (c->at >= 0) {
        int e = new_event(c);
        sync_op(c, (mf_stream)c->at, MF_OP_RECORD, e);
        sync_op(c, MF_STREAM_COMPUTE, MF_OP_WAIT, e);
        return;
    }
    for (int st = 0; st < MF_STREAM_COUNT; st++)
        if (st != MF_STREAM_COMPUTE && c->barrier[st] >= 0)
            sync_op(c, MF_STREAM_COMPUTE, MF_OP_WAIT, c->barrier[st]);
}

/* A forward gather of the step: T1, or T2 at forward_pre (not the re-gather). */
static bool is_forward_gather(const mf_op *op)
{
    return mf_op_is_data(op) && mf_op_in_step(op) &&
           (op->transition == 1 || (op->transition == 2 && op->phase == MF_PHASE_FORWARD_PRE));
}

/* The evaluation program: one chain per unit that some bucket starts at. */
static void eval_program(chain *c, const mf_op *step_ops, int nstep)
{
    const mf_schedule *s = c->s;
    int nb = s->nbuckets;
    /* gathers grouped by bucket (stable: id order within a bucket) */
    int *start = calloc((size_t)nb + 2, sizeof *start), *ids = malloc(sizeof *ids * (size_t)(nstep + 1));
    if (!start || !ids) {
        c->oom = true;
        goto done;
    }
    for (int i = 0; i < nstep; i++)
        if (is_forward_gather(&step_ops[i]))
            start[step_ops[i].bucket + 2]++;
    for (int b = 0; b < nb; b++)
        start[b + 2] += start[b + 1];
    for (int i = 0; i < nstep; i++)
        if (is_forward_gather(&step_ops[i]))
            ids[start[step_ops[i].bucket + 1]++] = i;
    /* a unit's buckets are [first_bucket, first_bucket + nbuckets) */
    for (int u = 0; u < s->nunits && !c->oom; u++) {
        const mf_unit *un = &s->units[u];
        bool open = false;
        for (int b = un->first_bucket; b < un->first_bucket + un->nbuckets; b++) {
            if (s->buckets[b].unit != u)
                continue;
            if (!open)
                chain_begin(c, MF_PHASE_EVAL_PRE, u, MF_WHEN_EVERY);
            open = true;
            for (int k = start[b]; k < start[b + 1]; k++)
                chain_add(c, &step_ops[ids[k]]);
        }
        if (open)
            chain_end(c);
    }
done:
    free(start);
    free(ids);
}

/* The short step's end: every T4 op of the step, in id (= backward) order. */
static void short_program(chain *c, const mf_op *step_ops, int nstep)
{
    chain_begin(c, MF_PHASE_STEP_END, -1, MF_WHEN_SHORT);
    for (int i = 0; i < nstep; i++)
        if (mf_op_is_data(&step_ops[i]) && mf_op_in_step(&step_ops[i]) && step_ops[i].transition == 4)
            chain_add(c, &step_ops[i]);
    chain_end(c);
}

bool mf_programs_run(mf_schedule *s)
{
    bool used[MF_STREAM_COUNT] = {false};
    for (int i = 0; i < s->nops; i++)
        if (mf_op_is_data(&s->ops[i]))
            used[s->ops[i].stream] = true;
    mf_vec ops;
    mf_vec_init(&ops, sizeof(mf_op));
    int nevents = s->nevents;
    chain c = {.s = s, .ops = &ops, .used = used};
    short_program(&c, s->ops, s->nops);
    eval_program(&c, s->ops, s->nops);
    mf_op *all = c.oom ? NULL : mf_arena_array(s->arena, (size_t)s->nops + ops.len, sizeof *all);
    if (!all) {
        mf_vec_free(&ops);
        s->nevents = nevents;
        return false;
    }
    memcpy(all, s->ops, sizeof *all * (size_t)s->nops);
    memcpy(all + s->nops, ops.data, sizeof *all * ops.len);
    s->nops += (int)ops.len;
    for (int i = 0; i < s->nops; i++)
        all[i].id = i;
    s->ops = all;
    s->programs = true;
    mf_vec_free(&ops);
    return true;
}

bool mf_programs_eval_figures(const mf_schedule *s, mf_eval_figures *out)
{
    memset(out, 0, sizeof *out);
    size_t nu = (size_t)(s->nunits > 0 ? s->nunits : 1);
    int64_t *live = calloc(nu, sizeof *live);
    int *stamp = malloc(sizeof *stamp * (size_t)(s->nbuffers + 1));
    if (!live || !stamp) {
        free(live);
        free(stamp);
        return false;
    }
    for (int b = 0; b < s->nbuffers; b++) {
        stamp[b] = -1;
        const mf_buffer *bf = &s->buffers[b];
        if (bf->kind != MF_BUF_WEIGHT_FULL || !mf_live_in_arena(bf))
            continue;
        const mf_bucket *bk = &s->buckets[bf->bucket];
        for (int u = bk->unit; u <= bk->last_unit; u++)
            live[u] += mf_live_bytes(s, b);
    }
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (op->phase != MF_PHASE_EVAL_PRE || !mf_op_is_data(op))
            continue;
        if (mf_opkind_is_collective(op->kind)) {
            out->bytes[op->axis] += mf_layout_op_bytes(s, op);
            out->launches++;
        }
        int ends[2] = {op->src, op->dst};
        for (int e = 0; e < 2; e++) {
            int b = ends[e];
            const mf_buffer *bf = &s->buffers[b];
            if (stamp[b] == op->unit || bf->kind == MF_BUF_WEIGHT_FULL || !mf_live_in_arena(bf))
                continue;
            stamp[b] = op->unit;
            live[op->unit] += mf_live_bytes(s, b);
        }
    }
    for (int u = 0; u < s->nunits; u++)
        if (live[u] > out->peak_transient)
            out->peak_transient = live[u];
    free(live);
    free(stamp);
    return true;
}
