/*
 * mf_lower: plan->trans (T1..T4 of every bucket as single-axis steps) ->
 * plan->sched buffers, ops and events (docs/semantics.md §4; op semantics and the
 * normative buffer rules in core/mf_schedule.h; docs/schedule.md).
 *
 * Buffers, per bucket: main_weight@O, weight@W, grad@G (persistent);
 * weight_full@Rep when W != Rep, grad_final@O when G != O (persistent);
 * grad_local@[P..P] (microbatch: the trainer's gradient of one microbatch);
 * one stage buffer per step output that is not its transition's result
 * (microbatch), named "<bucket>.T<t>.<op>[.<axis>]". Every step writes a fresh
 * buffer, so no op works in place.
 *
 * Ops, per bucket, as chains of steps at hook points:
 *   T1 (first)  at forward_pre(unit - prefetch), main_weight -> weight
 *   T2 (every)  right after T1, weight -> weight_full; again at
 *               backward_pre(last_unit + prefetch) when the unit reshards
 *   T3 (every)  at backward_post(unit), grad_local -> grad (accumulate)
 *   T4 (last)   right after T3, grad -> grad_final
 * (hook units clamp to the first and last unit). A merged bucket (last_unit >
 * unit) is gathered before its first unit's forward and reduced after its
 * first unit's backward, which comes last in backward order.
 *
 * Streams: every data op runs on the stream the transition pass chose for
 * its step (mf_step.stream; the rule is in mf_transition.c), so explain and
 * the schedule cannot disagree. Compute-side records and waits run on
 * `compute`.
 *
 * Events, one record/wait pair per cross-stream dependency, recorded by one op
 * each and reused across microbatches ("wait" waits for the latest record):
 *   step_begin           compute records SB (the optimizer updated main_weight);
 *                        every T1 chain waits for it before reading main_weight
 *   inside a chain       where consecutive steps change stream
 *   T1 -> T2             T2 waits for T1's end when they start on other streams
 *   forward_pre(unit)    compute waits for weight_full (T2 end; T1 end when W = Rep)
 *   forward_post(last)   compute records FD; the backward re-gather waits (WAR:
 *                        compute is done reading weight_full)
 *   backward_pre(last)   compute waits for the re-gather, and for the end of the
 *                        previous microbatch's T3 (WAR: grad_local is reused)
 *   backward_post(unit)  compute records BP; T3 waits before reading grad_local,
 *                        and the next microbatch's forward gather waits before
 *                        overwriting weight_full (WAR)
 *   T3 -> T4             T4 waits for T3's end when it starts on another stream
 *   step_end             compute waits for every delivered gradient
 * Every chain thus starts after everything that touched its buffers before
 * (through compute) and ends in an event compute waits for; mf_verify checks
 * that this orders every cross-stream access.
 *
 * Op ids are indices; within a hook, chains come in bucket order (prefetched
 * ones after the current unit's), then compute's waits; at post-hooks
 * compute's record comes first.
 *
 * Cost: linear in units + buckets + ops. The buckets each hook handles come
 * from per-unit lists built once by stable counting sorts (mf_lower_index),
 * so no hook scans every bucket.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_load.h"
#include "mf_passes.h"
#include "mf_plan_stats.h"

enum { MF_LOWER_MAX_STEPS = 4 * MF_MAX_AXES + 2 };

typedef struct mf_lower_bucket {
    int main, weight, full, local, grad, final;  /* buffer ids, -1 when absent */
    int out[MF_NTRANSITIONS][MF_LOWER_MAX_STEPS]; /* output buffer of each step */
    int ev_t1, ev_t2f, ev_t2b, ev_t3, ev_t4;     /* chain-end events, -1 until used */
    int ev_hand[MF_NTRANSITIONS + 1][MF_LOWER_MAX_STEPS]; /* hand-off before step i, per
                               transition; [MF_NTRANSITIONS]: the backward T2 */
    bool regather;          /* T2 again at backward_pre */
} mf_lower_bucket;

/* Buckets grouped by a unit-valued key: those of unit u are
 * ids[start[u] .. start[u + 1]), in the order the index was built from. */
typedef struct mf_lower_index {
    int *start;             /* nunits + 1 entries */
    int *ids;               /* bucket ids */
} mf_lower_index;

typedef struct mf_lower_ctx {
    mf_plan *p;
    mf_schedule *s;
    mf_diag *d;
    mf_vec ops;             /* mf_op */
    mf_vec bufs;            /* mf_buffer */
    mf_lower_bucket *bk;
    int *ev_fd, *ev_bp;     /* per unit: compute records at forward_post / backward_post */
    int ev_sb;
    mf_lower_index by_fwd;  /* by forward issue unit, ascending bucket */
    mf_lower_index by_unit; /* by first unit, ascending bucket */
    mf_lower_index by_last; /* by last unit, ascending bucket */
    mf_lower_index by_bwd;  /* re-gathered buckets by backward issue unit,
                               descending last unit, then ascending bucket */
    bool oom;
} mf_lower_ctx;

/* ---- building blocks ---- */

static int mf_lower_event(mf_lower_ctx *c, int *slot)
{
    if (*slot < 0)
        *slot = c->s->nevents++;
    return *slot;
}

static mf_op *mf_lower_op(mf_lower_ctx *c, mf_phase phase, int unit, mf_when when, mf_stream stream,
                          mf_opkind kind)
{
    mf_op *op = mf_vec_push(&c->ops);
    if (!op) {
        c->oom = true;
        return NULL;
    }
    op->id = (int)c->ops.len - 1;
    op->phase = phase;
    op->unit = unit;
    op->when = when;
    op->stream = stream;
    op->kind = kind;
    op->transition = 0;
    op->bucket = op->axis = op->src = op->dst = op->event = -1;
    op->dtype = MF_FP32;
    return op;
}

static void mf_lower_sync(mf_lower_ctx *c, mf_phase phase, int unit, mf_when when, mf_stream stream,
                          mf_opkind kind, int *event)
{
    mf_op *op = mf_lower_op(c, phase, unit, when, stream, kind);
    if (op)
        op->event = mf_lower_event(c, event);
}

static int mf_lower_buffer(mf_lower_ctx *c, int b, mf_bufkind kind, const char *suffix, mf_dtype dt,
                           const mf_placement *pl, mf_lifetime life)
{
    const mf_bucket *bk = &c->s->buckets[b];
    mf_buffer *bf = mf_vec_push(&c->bufs);
    if (!bf) {
        c->oom = true;
        return -1;
    }
    bf->name = c->p->quiet ? bk->name : mf_arena_printf(c->s->arena, "%s.%s", bk->name, suffix);
    if (!bf->name)
        c->oom = true;
    bf->bucket = b;
    bf->kind = kind;
    bf->dtype = dt;
    bf->place = *pl;
    bf->count = mf_layout_bucket_capacity(&c->s->mesh, bk, pl); /* L / shards unless ragged */
    bf->lifetime = life;
    return (int)c->bufs.len - 1;
}

/* Replicate on every axis but its Distinct ones: the unsharded weight. */
static bool mf_lower_is_rep(const mf_placement *pl, int naxes)
{
    mf_placement rep = mf_placement_uniform(MF_PLACE_REPLICATE, pl, naxes);
    return mf_placement_equal(pl, &rep, naxes);
}

/* ---- buffers ---- */

static bool mf_lower_check_steps(mf_lower_ctx *c, int b)
{
    const mf_schedule *s = c->s;
    const mf_bucket *bk = &s->buckets[b];
    const mf_transition *tr = c->p->trans[b];
    mf_span none = {0, 0, 0, 0};
    for (int t = 0; t < MF_NTRANSITIONS; t++) {
        if (tr[t].nsteps > MF_LOWER_MAX_STEPS || tr[t].nsteps < 0) {
            mf_diag_error(c->d, none, "internal error: T%d of bucket '%s' has %d steps (limit %d)", t + 1,
                          bk->name, tr[t].nsteps, MF_LOWER_MAX_STEPS);
            return false;
        }
        for (int i = 0; i < tr[t].nsteps; i++) {
            const mf_step *st = &tr[t].steps[i];
            bool axis_op = mf_opkind_on_axis(st->kind);
            if (axis_op != (st->axis >= 0 && st->axis < s->mesh.naxes) || st->count <= 0 ||
                mf_layout_shards(&s->mesh, &st->to) <= 0 ||
                (!bk->bounds && bk->length % mf_layout_shards(&s->mesh, &st->to) != 0) ||
                !mf_layout_bucket_placement_ok(&s->mesh, bk, &st->to)) {
                mf_diag_error(c->d, none, "internal error: step %d of T%d of bucket '%s' is malformed", i,
                              t + 1, bk->name);
                return false;
            }
        }
    }
    if (tr[MF_T1].nsteps == 0 || tr[MF_T3].nsteps == 0 ||
        tr[MF_T3].steps[tr[MF_T3].nsteps - 1].kind != MF_OP_ACCUMULATE) {
        mf_diag_error(c->d, none, "internal error: bucket '%s' needs a T1 (at least its cast) and a T3 "
                      "ending in accumulate", bk->name);
        return false;
    }
    return true;
}

static char *mf_lower_stage_name(mf_lower_ctx *c, int t, const mf_step *st, char *buf, size_t size)
{
    if (c->p->quiet)
        buf[0] = '\0'; /* not used: quiet buffers take the bucket's name */
    else if (st->axis >= 0)
        snprintf(buf, size, "T%d.%s.%s", t + 1, mf_opkind_name(st->kind), c->s->mesh.axes[st->axis].name);
    else
        snprintf(buf, size, "T%d.%s", t + 1, mf_opkind_name(st->kind));
    return buf;
}

/* Creates the buffers of bucket b in a fixed order and records which buffer
 * every step writes. */
static void mf_lower_buffers(mf_lower_ctx *c, int b)
{
    const mf_schedule *s = c->s;
    const mf_bucket *bk = &s->buckets[b];
    const mf_transition *tr = c->p->trans[b];
    mf_lower_bucket *lb = &c->bk[b];
    int k = s->mesh.naxes;
    /* weight_full and grad_local: one coordinate's tensor on a Distinct axis */
    mf_placement rep = mf_placement_uniform(MF_PLACE_REPLICATE, &bk->place[MF_ROLE_WEIGHT], k);
    mf_placement partial = mf_placement_uniform(MF_PLACE_PARTIAL, &bk->place[MF_ROLE_GRAD], k);
    const mf_placement *W = &bk->place[MF_ROLE_WEIGHT], *G = &bk->place[MF_ROLE_GRAD],
                       *O = &bk->place[MF_ROLE_MAIN_WEIGHT];
    mf_dtype dw = bk->dtype[MF_ROLE_WEIGHT], dg = bk->dtype[MF_ROLE_GRAD];
    char name[128];
    lb->full = lb->final = -1;

    lb->main = mf_lower_buffer(c, b, MF_BUF_MAIN_WEIGHT, "main_weight", bk->dtype[MF_ROLE_MAIN_WEIGHT], O,
                               MF_LIFETIME_PERSISTENT);
    lb->weight = mf_lower_buffer(c, b, MF_BUF_WEIGHT, "weight", dw, W, MF_LIFETIME_PERSISTENT);
    for (int i = 0; i + 1 < tr[MF_T1].nsteps; i++)
        lb->out[MF_T1][i] = mf_lower_buffer(c, b, MF_BUF_WEIGHT_STAGE,
                                            mf_lower_stage_name(c, MF_T1, &tr[MF_T1].steps[i], name, sizeof name),
                                            tr[MF_T1].steps[i].dtype, &tr[MF_T1].steps[i].to, MF_LIFETIME_MICROBATCH);
    lb->out[MF_T1][tr[MF_T1].nsteps - 1] = lb->weight;
    if (!mf_lower_is_rep(W, k)) {
        for (int i = 0; i + 1 < tr[MF_T2].nsteps; i++)
            lb->out[MF_T2][i] = mf_lower_buffer(c, b, MF_BUF_WEIGHT_STAGE,
                                                mf_lower_stage_name(c, MF_T2, &tr[MF_T2].steps[i], name, sizeof name),
                                                dw, &tr[MF_T2].steps[i].to, MF_LIFETIME_MICROBATCH);
        lb->full = mf_lower_buffer(c, b, MF_BUF_WEIGHT_FULL, "weight_full", dw, &rep, MF_LIFETIME_MICROBATCH);
        if (tr[MF_T2].nsteps > 0)
            lb->out[MF_T2][tr[MF_T2].nsteps - 1] = lb->full;
    }
    lb->local = mf_lower_buffer(c, b, MF_BUF_GRAD_LOCAL, "grad_local", dg, &partial, MF_LIFETIME_MICROBATCH);
    for (int i = 0; i + 1 < tr[MF_T3].nsteps; i++)
        lb->out[MF_T3][i] = mf_lower_buffer(c, b, MF_BUF_GRAD_STAGE,
                                            mf_lower_stage_name(c, MF_T3, &tr[MF_T3].steps[i], name, sizeof name),
                                            dg, &tr[MF_T3].steps[i].to, MF_LIFETIME_MICROBATCH);
    lb->grad = mf_lower_buffer(c, b, MF_BUF_GRAD, "grad", dg, G, MF_LIFETIME_PERSISTENT);
    lb->out[MF_T3][tr[MF_T3].nsteps - 1] = lb->grad;
    for (int i = 0; i + 1 < tr[MF_T4].nsteps; i++)
        lb->out[MF_T4][i] = mf_lower_buffer(c, b, MF_BUF_GRAD_STAGE,
                                            mf_lower_stage_name(c, MF_T4, &tr[MF_T4].steps[i], name, sizeof name),
                                            dg, &tr[MF_T4].steps[i].to, MF_LIFETIME_MICROBATCH);
    if (!mf_placement_equal(G, O, k)) {
        lb->final = mf_lower_buffer(c, b, MF_BUF_GRAD_FINAL, "grad_final", dg, O, MF_LIFETIME_PERSISTENT);
        if (tr[MF_T4].nsteps > 0)
            lb->out[MF_T4][tr[MF_T4].nsteps - 1] = lb->final;
    }
}

/* The buffer step i of transition t reads. */
static int mf_lower_step_src(const mf_lower_ctx *c, int b, int t, int i)
{
    const mf_lower_bucket *lb = &c->bk[b];
    if (i > 0)
        return lb->out[t][i - 1];
    switch (t) {
    case MF_T1:
        return lb->main;
    case MF_T2:
        return lb->weight;
    case MF_T3:
        return lb->local;
    default:
        return lb->grad;
    }
}

/* ---- chains ---- */

typedef struct mf_lower_start {
    int *event;             /* event slot to wait for, NULL = none */
    mf_stream from;         /* stream the event is recorded on */
    mf_when when;
} mf_lower_start;

/*
 * Emits the steps of transition t of bucket b at (phase, unit, when): the
 * start waits on the first step's stream (skipped when recorded on that same
 * stream), a record/wait hand-off wherever the stream changes, then the data
 * ops.
 */
static void mf_lower_chain(mf_lower_ctx *c, int b, int t, mf_phase phase, int unit, mf_when when,
                           const mf_lower_start *starts, int nstarts)
{
    int *hand = c->bk[b].ev_hand[phase == MF_PHASE_BACKWARD_PRE ? MF_NTRANSITIONS : t];
    const mf_transition *tr = &c->p->trans[b][t];
    mf_lower_bucket *lb = &c->bk[b];
    for (int i = 0; i < tr->nsteps; i++) {
        const mf_step *st = &tr->steps[i];
        mf_stream stream = st->stream;
        if (i == 0) {
            for (int k = 0; k < nstarts; k++)
                if (starts[k].event && starts[k].from != stream)
                    mf_lower_sync(c, phase, unit, starts[k].when, stream, MF_OP_WAIT, starts[k].event);
        } else if (stream != tr->steps[i - 1].stream) {
            mf_lower_sync(c, phase, unit, when, tr->steps[i - 1].stream, MF_OP_RECORD, &hand[i]);
            mf_lower_sync(c, phase, unit, when, stream, MF_OP_WAIT, &hand[i]);
        }
        mf_op *op = mf_lower_op(c, phase, unit, when, stream, st->kind);
        if (!op)
            return;
        op->transition = t + 1;
        op->bucket = b;
        op->axis = st->axis;
        op->dtype = st->dtype;
        op->count = st->count;
        op->src = mf_lower_step_src(c, b, t, i);
        op->dst = lb->out[t][i];
    }
}

static mf_stream mf_lower_end_stream(const mf_lower_ctx *c, int b, int t)
{
    const mf_transition *tr = &c->p->trans[b][t];
    return tr->steps[tr->nsteps - 1].stream;
}

static bool mf_lower_has(const mf_lower_ctx *c, int b, int t)
{
    return c->p->trans[b][t].nsteps > 0;
}

/* T1 (first) and T2 (every) of bucket b, issued at forward_pre(unit). */
static void mf_lower_gather_fwd(mf_lower_ctx *c, int b, int unit)
{
    mf_lower_bucket *lb = &c->bk[b];
    const mf_bucket *bk = &c->s->buckets[b];
    mf_lower_start sb = {&c->ev_sb, MF_STREAM_COMPUTE, MF_WHEN_FIRST};
    mf_lower_chain(c, b, MF_T1, MF_PHASE_FORWARD_PRE, unit, MF_WHEN_FIRST, &sb, 1);
    mf_stream t1_end = mf_lower_end_stream(c, b, MF_T1);
    bool t2 = mf_lower_has(c, b, MF_T2);
    /* Someone on another stream reads what T1 wrote: record its end. */
    if (!t2 || c->p->trans[b][MF_T2].steps[0].stream != t1_end)
        mf_lower_sync(c, MF_PHASE_FORWARD_PRE, unit, MF_WHEN_FIRST, t1_end, MF_OP_RECORD, &lb->ev_t1);
    if (!t2)
        return;
    mf_lower_start starts[2] = {
        {lb->ev_t1 >= 0 ? &lb->ev_t1 : NULL, t1_end, MF_WHEN_FIRST},
        {&c->ev_bp[bk->unit], MF_STREAM_COMPUTE, MF_WHEN_EVERY},
    };
    mf_lower_chain(c, b, MF_T2, MF_PHASE_FORWARD_PRE, unit, MF_WHEN_EVERY, starts, 2);
    mf_lower_sync(c, MF_PHASE_FORWARD_PRE, unit, MF_WHEN_EVERY, mf_lower_end_stream(c, b, MF_T2), MF_OP_RECORD,
                  &lb->ev_t2f);
}

/* T2 again (every) at backward_pre(unit) for a bucket that reshards. */
static void mf_lower_gather_bwd(mf_lower_ctx *c, int b, int unit)
{
    mf_lower_bucket *lb = &c->bk[b];
    mf_lower_start fd = {&c->ev_fd[c->s->buckets[b].last_unit], MF_STREAM_COMPUTE, MF_WHEN_EVERY};
    mf_lower_chain(c, b, MF_T2, MF_PHASE_BACKWARD_PRE, unit, MF_WHEN_EVERY, &fd, 1);
    mf_lower_sync(c, MF_PHASE_BACKWARD_PRE, unit, MF_WHEN_EVERY, mf_lower_end_stream(c, b, MF_T2), MF_OP_RECORD,
                  &lb->ev_t2b);
}

/* T3 (every) then T4 (last) of bucket b at backward_post(unit). */
static void mf_lower_reduce(mf_lower_ctx *c, int b, int unit)
{
    mf_lower_bucket *lb = &c->bk[b];
    mf_lower_start bp = {&c->ev_bp[unit], MF_STREAM_COMPUTE, MF_WHEN_EVERY};
    mf_lower_chain(c, b, MF_T3, MF_PHASE_BACKWARD_POST, unit, MF_WHEN_EVERY, &bp, 1);
    mf_stream t3_end = mf_lower_end_stream(c, b, MF_T3);
    mf_lower_sync(c, MF_PHASE_BACKWARD_POST, unit, MF_WHEN_EVERY, t3_end, MF_OP_RECORD, &lb->ev_t3);
    if (!mf_lower_has(c, b, MF_T4))
        return;
    mf_lower_start t3 = {&lb->ev_t3, t3_end, MF_WHEN_LAST};
    mf_lower_chain(c, b, MF_T4, MF_PHASE_BACKWARD_POST, unit, MF_WHEN_LAST, &t3, 1);
    mf_lower_sync(c, MF_PHASE_BACKWARD_POST, unit, MF_WHEN_LAST, mf_lower_end_stream(c, b, MF_T4), MF_OP_RECORD,
                  &lb->ev_t4);
}

/* ---- hooks ---- */

static int mf_lower_fwd_issue(const mf_lower_ctx *c, int b)
{
    int u = c->s->buckets[b].unit - c->s->prefetch;
    return u < 0 ? 0 : u;
}

static int mf_lower_bwd_issue(const mf_lower_ctx *c, int b)
{
    int u = c->s->buckets[b].last_unit + c->s->prefetch, last = c->s->nunits - 1;
    return u > last ? last : u;
}

/*
 * Fills ix with the buckets of `order` (n ids; NULL = 0 .. n-1) grouped by
 * key[b] in [0, nunits), keeping their order within a key (a stable counting
 * sort); a bucket whose key is out of range is left out. Returns false on OOM
 * (ix then holds whatever was allocated; mf_lower_index_free frees it).
 */
static bool mf_lower_index_build(mf_lower_index *ix, int nunits, const int *key, const int *order, int n)
{
    ix->start = calloc((size_t)nunits + 2, sizeof *ix->start);
    ix->ids = malloc((size_t)(n ? n : 1) * sizeof *ix->ids);
    if (!ix->start || !ix->ids)
        return false;
    for (int i = 0; i < n; i++) {
        int k = key[order ? order[i] : i];
        if (k >= 0 && k < nunits)
            ix->start[k + 2]++;
    }
    /* start[k + 1] becomes the fill position of key k, then its end */
    for (int k = 0; k < nunits; k++)
        ix->start[k + 2] += ix->start[k + 1];
    for (int i = 0; i < n; i++) {
        int b = order ? order[i] : i, k = key[b];
        if (k >= 0 && k < nunits)
            ix->ids[ix->start[k + 1]++] = b;
    }
    return true;
}

static void mf_lower_index_free(mf_lower_index *ix)
{
    free(ix->start);
    free(ix->ids);
}

/* Builds the four hook indexes; false on OOM. */
static bool mf_lower_indexes(mf_lower_ctx *c)
{
    const mf_schedule *s = c->s;
    int nb = s->nbuckets, nu = s->nunits;
    int *key = malloc((size_t)(nb ? nb : 1) * sizeof *key);
    int *order = malloc((size_t)(nb ? nb : 1) * sizeof *order);
    bool ok = key && order;
    for (int b = 0; ok && b < nb; b++)
        key[b] = mf_lower_fwd_issue(c, b);
    ok = ok && mf_lower_index_build(&c->by_fwd, nu, key, NULL, nb);
    for (int b = 0; ok && b < nb; b++)
        key[b] = s->buckets[b].unit;
    ok = ok && mf_lower_index_build(&c->by_unit, nu, key, NULL, nb);
    for (int b = 0; ok && b < nb; b++)
        key[b] = s->buckets[b].last_unit;
    ok = ok && mf_lower_index_build(&c->by_last, nu, key, NULL, nb);
    /* re-gathers: by descending last unit first, then (stably) by issue unit */
    int n = 0;
    for (int u = nu - 1; ok && u >= 0; u--)
        for (int i = c->by_last.start[u]; i < c->by_last.start[u + 1]; i++)
            if (c->bk[c->by_last.ids[i]].regather)
                order[n++] = c->by_last.ids[i];
    for (int b = 0; ok && b < nb; b++)
        key[b] = mf_lower_bwd_issue(c, b);
    ok = ok && mf_lower_index_build(&c->by_bwd, nu, key, order, n);
    free(key);
    free(order);
    return ok;
}

static void mf_lower_forward_pre(mf_lower_ctx *c, int v)
{
    const mf_lower_index *fx = &c->by_fwd, *ux = &c->by_unit;
    for (int i = fx->start[v]; i < fx->start[v + 1]; i++)
        mf_lower_gather_fwd(c, fx->ids[i], v);
    for (int i = ux->start[v]; i < ux->start[v + 1]; i++) {
        int b = ux->ids[i];
        mf_lower_bucket *lb = &c->bk[b];
        if (mf_lower_has(c, b, MF_T2))
            mf_lower_sync(c, MF_PHASE_FORWARD_PRE, v, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_WAIT, &lb->ev_t2f);
        else
            mf_lower_sync(c, MF_PHASE_FORWARD_PRE, v, MF_WHEN_FIRST, MF_STREAM_COMPUTE, MF_OP_WAIT, &lb->ev_t1);
    }
}

static void mf_lower_forward_post(mf_lower_ctx *c, int v)
{
    const mf_lower_index *lx = &c->by_last;
    for (int i = lx->start[v]; i < lx->start[v + 1]; i++)
        if (c->bk[lx->ids[i]].regather) {
            mf_lower_sync(c, MF_PHASE_FORWARD_POST, v, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_RECORD, &c->ev_fd[v]);
            return;
        }
}

static void mf_lower_backward_pre(mf_lower_ctx *c, int v)
{
    const mf_lower_index *bx = &c->by_bwd, *lx = &c->by_last;
    /* Prefetched re-gathers in the order backward needs them. */
    for (int i = bx->start[v]; i < bx->start[v + 1]; i++)
        mf_lower_gather_bwd(c, bx->ids[i], v);
    for (int i = lx->start[v]; i < lx->start[v + 1]; i++) {
        mf_lower_bucket *lb = &c->bk[lx->ids[i]];
        if (lb->regather)
            mf_lower_sync(c, MF_PHASE_BACKWARD_PRE, v, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_WAIT, &lb->ev_t2b);
        mf_lower_sync(c, MF_PHASE_BACKWARD_PRE, v, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_WAIT, &lb->ev_t3);
    }
}

static void mf_lower_backward_post(mf_lower_ctx *c, int v)
{
    const mf_lower_index *ux = &c->by_unit;
    if (ux->start[v] == ux->start[v + 1])
        return;
    mf_lower_sync(c, MF_PHASE_BACKWARD_POST, v, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_RECORD, &c->ev_bp[v]);
    for (int i = ux->start[v]; i < ux->start[v + 1]; i++)
        mf_lower_reduce(c, ux->ids[i], v);
}

static void mf_lower_step_end(mf_lower_ctx *c)
{
    for (int b = 0; b < c->s->nbuckets; b++) {
        mf_lower_bucket *lb = &c->bk[b];
        mf_lower_sync(c, MF_PHASE_STEP_END, -1, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_WAIT,
                      mf_lower_has(c, b, MF_T4) ? &lb->ev_t4 : &lb->ev_t3);
    }
}

/*
 * Drops a wait that an earlier wait already covers: same stream, same event,
 * a predicate that runs at least whenever this one does (every covers all),
 * no record of the event issued in between, both inside the microbatch loop
 * (unit phases, where id order is issue order). Renumbers the ids.
 */
static void mf_lower_drop_redundant_waits(mf_lower_ctx *c)
{
    int nev = c->s->nevents;
    uint8_t *seen = calloc((size_t)(nev ? nev : 1) * MF_STREAM_COUNT, 1); /* bit per mf_when */
    if (!seen) {
        c->oom = true;
        return;
    }
    mf_op *ops = c->ops.data;
    size_t n = 0;
    bool dirty = false;     /* some bit of `seen` is set (clearing it is O(events)) */
    for (size_t i = 0; i < c->ops.len; i++) {
        mf_op op = ops[i];
        bool step_phase = op.phase == MF_PHASE_STEP_BEGIN || op.phase == MF_PHASE_STEP_END;
        if (step_phase) {
            if (dirty)
                memset(seen, 0, (size_t)(nev ? nev : 1) * MF_STREAM_COUNT);
            dirty = false;
        } else if (op.kind == MF_OP_RECORD) {
            memset(seen + (size_t)op.event * MF_STREAM_COUNT, 0, MF_STREAM_COUNT);
        } else if (op.kind == MF_OP_WAIT) {
            uint8_t *w = &seen[(size_t)op.event * MF_STREAM_COUNT + op.stream];
            if (*w & (1u << MF_WHEN_EVERY | 1u << op.when))
                continue;
            *w |= (uint8_t)(1u << op.when);
            dirty = true;
        }
        op.id = (int)n;
        ops[n++] = op;
    }
    c->ops.len = n;
    free(seen);
}

/* ---- the pass ---- */

/* `source` as given, never absolute: an absolute path keeps its last part. */
static const char *mf_lower_source_name(const char *path)
{
    if (!path || !path[0])
        return "<input>";
    if (path[0] != '/')
        return path;
    const char *slash = strrchr(path, '/');
    return slash[1] ? slash + 1 : path;
}

/* Gives an empty vector room for about n elements up front (the plan
 * search lowers hundreds of thousands of small schedules; growing from 8 by
 * doubling was a tenth of the lowering). A failed allocation leaves it
 * empty: it then grows as usual. */
static void reserve(mf_vec *v, size_t n)
{
    void *d = n < SIZE_MAX / v->elem ? malloc(n * v->elem) : NULL;
    if (d) {
        v->data = d;
        v->cap = n;
    }
}

/* Summarizes the lowered schedule and compares the summary with the plan's
 * own totals (mf_plan_stats.h). */
bool mf_lower_summarize(mf_plan *p, mf_diag *d)
{
    mf_summary want;
    mf_span none = {0, 0, 0, 0};
    if (!mf_schedule_summarize(p->sched) || !mf_plan_totals(p, &want)) {
        mf_diag_error(d, none, "out of memory while lowering the schedule");
        return false;
    }
    const mf_summary *got = &p->sched->summary;
    bool same = memcmp(want.bytes, got->bytes, sizeof want.bytes) == 0 &&
                memcmp(want.persistent_bytes, got->persistent_bytes, sizeof want.persistent_bytes) == 0 &&
                memcmp(want.model_bytes, got->model_bytes, sizeof want.model_bytes) == 0;
    for (int k = 0; k < MF_OPKIND_COUNT && same; k++)
        for (int j = 0; j < MF_MAX_AXES && same; j++)
            same = want.collectives[k][j] == got->collectives[k][j];
    if (!same)
        mf_diag_error(d, none, "internal error: the lowered schedule's per-step totals differ from the "
                      "plan's (collectives, bytes or memory)");
    return same;
}

bool mf_lower_run(mf_plan *p, mf_diag *d)
{
    mf_schedule *s = p->sched;
    mf_span none = {0, 0, 0, 0};
    if (!p->trans && s->nbuckets > 0) {
        mf_diag_error(d, none, "internal error: lowering needs the transitions of every bucket");
        return false;
    }
    mf_lower_ctx c = {.p = p, .s = s, .d = d, .ev_sb = -1};
    mf_vec_init(&c.ops, sizeof(mf_op));
    mf_vec_init(&c.bufs, sizeof(mf_buffer));
    size_t nb = s->nbuckets ? (size_t)s->nbuckets : 1, nu = s->nunits ? (size_t)s->nunits : 1;
    reserve(&c.ops, 24 * nb + 8 * nu + 16);
    reserve(&c.bufs, 8 * nb + 8);
    c.bk = calloc(nb, sizeof *c.bk);
    c.ev_fd = malloc(nu * sizeof *c.ev_fd);
    c.ev_bp = malloc(nu * sizeof *c.ev_bp);
    bool ok = c.bk && c.ev_fd && c.ev_bp;
    c.oom = !ok;
    s->nevents = 0;
    for (size_t u = 0; ok && u < nu; u++)
        c.ev_fd[u] = c.ev_bp[u] = -1;
    for (int b = 0; ok && b < s->nbuckets; b++) {
        mf_lower_bucket *lb = &c.bk[b];
        lb->ev_t1 = lb->ev_t2f = lb->ev_t2b = lb->ev_t3 = lb->ev_t4 = -1;
        for (int t = 0; t <= MF_NTRANSITIONS; t++)
            for (int i = 0; i < MF_LOWER_MAX_STEPS; i++)
                lb->ev_hand[t][i] = -1;
        ok = mf_lower_check_steps(&c, b);
        if (!ok)
            break;
        const mf_bucket *bk = &s->buckets[b];
        lb->regather = s->units[bk->unit].reshard_after_forward && p->trans[b][MF_T2].nsteps > 0;
        mf_lower_buffers(&c, b);
    }

    if (ok && !c.oom && !mf_lower_indexes(&c))
        c.oom = true;
    if (ok && !c.oom) {
        mf_lower_sync(&c, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_RECORD, &c.ev_sb);
        for (int v = 0; v < s->nunits; v++) {
            mf_lower_forward_pre(&c, v);
            mf_lower_forward_post(&c, v);
        }
        for (int v = s->nunits - 1; v >= 0; v--) {
            mf_lower_backward_pre(&c, v);
            mf_lower_backward_post(&c, v);
        }
        mf_lower_step_end(&c);
        mf_lower_drop_redundant_waits(&c);
    }

    if (ok && !c.oom) {
        s->nbuffers = (int)c.bufs.len;
        s->nops = (int)c.ops.len;
        s->buffers = mf_vec_to_arena(&c.bufs, s->arena);
        s->ops = mf_vec_to_arena(&c.ops, s->arena);
        s->source = mf_arena_strdup(s->arena, mf_lower_source_name(s->source ? s->source
                                                                           : p->spec ? p->spec->path : NULL));
        if (d->src && d->src->text)
            mf_sha256(d->src->text, d->src->len, NULL, s->source_sha256);
        else {
            memset(s->source_sha256, '0', 64); /* no source text: 64 zeros */
            s->source_sha256[64] = '\0';
        }
        c.oom = !s->buffers || !s->ops || !s->source;
        if (!c.oom && !p->lazy_summary)
            ok = mf_lower_summarize(p, d);
    }
    mf_vec_free(&c.bufs);
    mf_vec_free(&c.ops);
    free(c.bk);
    free(c.ev_fd);
    free(c.ev_bp);
    mf_lower_index_free(&c.by_fwd);
    mf_lower_index_free(&c.by_unit);
    mf_lower_index_free(&c.by_last);
    mf_lower_index_free(&c.by_bwd);
    if (c.oom)
        mf_diag_error(d, none, "out of memory while lowering the schedule");
    return ok && !c.oom && mf_diag_errors(d) == 0;
}
