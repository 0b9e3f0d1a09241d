/*
 * mf_verify: checks a schedule, compiled or loaded (docs/schedule.md §5). Reads the
 * schedule only; every finding is an error naming the op (id, kind, axis,
 * bucket), the buffer and, for the replay, the microbatch position.
 *
 * 1. Structure: the core's structural checker, strict (core/mf_struct.c:
 *    header, bucket layout, the normative buffer rules, every op's fields,
 *    streams, counts, dtypes, the placement each op produces, on every rank
 *    the shard the layout assigns, events). Errors there stop the check.
 *
 * 2. Abstract replay (this file, prefix mf_areplay_). The schedule is
 *    replayed hook by hook, two steps in a row (so
 *    hazards across the step boundary show), for every microbatch position
 *    that exists: M = 1 (first = last), M = 2 (first, last), M >= 3 (first,
 *    one middle standing for all middles, last). The trainer is part of the
 *    replay on the compute stream: its forward of unit v reads each covering
 *    bucket's unsharded weight between forward_pre(v) and forward_post(v), its
 *    backward reads it and writes grad_local between backward_pre(v) and
 *    backward_post(v), and the optimizer, after step_end, reads the delivered
 *    gradient and writes main_weight.
 *
 *    Values (abstract interpretation per buffer): a buffer holds nothing, a
 *    weight (the main_weight of step k, at some placement and dtype), or a
 *    gradient (at some placement, where Partial on an axis means "not yet
 *    reduced over that axis", summed over a set of microbatches). Distinct
 *    on an axis means "this rank's coordinate's own tensor": the trainer's
 *    local gradient and the unsharded weight carry the bucket's Distinct
 *    axes, no op changes them (part 1 refuses any op on a Distinct axis), so
 *    a value that reaches the optimizer at main_weight's placement is the
 *    rank's own coordinate's, reduced over the other axes only. Each op
 *    checks its input and computes its output; the output must match the
 *    destination's declared placement. Postconditions: every unsharded weight
 *    the trainer reads is the current step's main_weight at Rep in weight's
 *    dtype; the delivered gradient is reduced over every axis, summed over
 *    every microbatch, at main_weight's placement. A microbatch buffer may not
 *    be read in a later microbatch than it was written, and a weight_full whose
 *    unit reshards after forward may not be read in backward unless gathered
 *    again.
 *
 *    Ordering: vector clocks per stream (compute, inner, outer); a record
 *    snapshots its stream's clock into the event, a wait merges the latest
 *    snapshot. Every read-after-write, write-after-read and write-after-write
 *    on a buffer from different streams must be ordered by these edges.
 *
 * The collective order per communicator (axis) is the same on every rank
 * because every rank runs the same op list with the same predicates and every
 * collective of an axis runs on that axis's one stream; part 1 checks the
 * latter.
 *
 * Cost: linear in buckets + buffers + ops, plus the trainer's accesses (one per
 * unit a bucket covers), plus the per-rank checks of part 1. Findings already
 * reported are kept in a hash set (core/mf_hash.h); the buckets the trainer
 * touches at unit v are swept, not searched.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_hash.h"
#include "mf_verify_memory.h"
#include "mf_layout.h"
#include "mf_verify.h"
#include "mf_struct.h"

/* ---- context and findings ---- */

typedef struct mf_verify_ctx {
    const mf_schedule *s;
    mf_diag *d;
    int errors;
    int *delivered;         /* per bucket: the buffer holding the delivered gradient */
    int *full;              /* per bucket: the buffer the trainer computes with */
    int *local;             /* per bucket: grad_local */
    int *mainw;             /* per bucket: main_weight */
    mf_hash seen;           /* (op or actor, buffer, kind) findings already reported */
} mf_verify_ctx;

__attribute__((format(printf, 2, 3))) static void mf_verify_err(mf_verify_ctx *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mf_span none = {0, 0, 0, 0};
    mf_diag_error(c->d, none, "%s", msg);
    c->errors++;
}

/* The structural checker's findings, as errors; it goes on after each. */
static bool mf_verify_finding(void *ctx, const mf_struct_finding *f)
{
    mf_verify_err(ctx, "%s", f->msg);
    return true;
}

/* True the first time (actor, buffer, what) is seen: each finding is
 * reported once, not once per microbatch and step. Out of memory, it answers
 * true (a finding may then repeat, none is lost). */
static bool mf_verify_first(mf_verify_ctx *c, int actor, int buffer, int what)
{
    int key[3] = {actor, buffer, what};
    return mf_hash_put(&c->seen, key, sizeof key, 0) != 0;
}

static const char *mf_verify_unit(const mf_schedule *s, int u)
{
    return u >= 0 && u < s->nunits ? s->units[u].name : "?";
}

/* A buffer's name without its bucket prefix ("grad_local"). */
static const char *mf_verify_bufname(const mf_schedule *s, int b)
{
    const mf_buffer *bf = &s->buffers[b];
    const char *bk = s->buckets[bf->bucket].name;
    size_t n = strlen(bk);
    if (strncmp(bf->name, bk, n) == 0 && bf->name[n] == '.')
        return bf->name + n + 1;
    return bf->name;
}

/* Per bucket, the buffers the trainer and the optimizer use (the structure
 * was checked: each fixed kind exists once). */
static void mf_verify_roles(mf_verify_ctx *c)
{
    const mf_schedule *s = c->s;
    for (int i = 0; i < s->nbuffers; i++) {
        const mf_buffer *bf = &s->buffers[i];
        int b = bf->bucket;
        if (bf->kind == MF_BUF_MAIN_WEIGHT)
            c->mainw[b] = i;
        if (bf->kind == MF_BUF_GRAD_LOCAL)
            c->local[b] = i;
        if (bf->kind == MF_BUF_WEIGHT_FULL || (bf->kind == MF_BUF_WEIGHT && c->full[b] < 0))
            c->full[b] = i;
        if (bf->kind == MF_BUF_GRAD_FINAL || (bf->kind == MF_BUF_GRAD && c->delivered[b] < 0))
            c->delivered[b] = i;
    }
}

/* ---- abstract replay ---- */

enum { V_NONE, V_WEIGHT, V_GRAD };

typedef struct mf_absval {
    int kind;               /* V_NONE, V_WEIGHT, V_GRAD */
    mf_placement place;     /* Partial = not yet reduced over that axis */
    mf_dtype dtype;
    int version;            /* weight: the step whose main_weight it is */
    uint32_t mbs;           /* gradient: the microbatches summed (bits) */
    int step, mb;           /* when it was written */
    bool released;          /* weight_full after forward of a unit that reshards */
} mf_absval;

typedef struct mf_access {
    int stream;             /* -1: none */
    int64_t t;              /* the stream's own clock at the access */
    int actor;              /* op id, or -1 - trainer action index */
    int mb;                 /* microbatch position of the access */
} mf_access;

typedef struct mf_bufstate {
    mf_absval v;
    mf_access write;
    mf_access reads[MF_STREAM_COUNT];
} mf_bufstate;

typedef struct mf_vclock {
    int64_t c[MF_STREAM_COUNT];
} mf_vclock;

/* Trainer actions, named in messages. */
enum { A_FORWARD, A_BACKWARD, A_OPTIMIZER, A_EVAL, A_KINDS };

/* Buckets grouped by unit: those of unit u are ids[start[u] .. start[u + 1]),
 * in ascending bucket order. */
typedef struct mf_areplay_index {
    int *start;             /* nunits + 1 entries */
    int *ids;
} mf_areplay_index;

typedef struct mf_areplay {
    mf_verify_ctx *c;
    mf_areplay_index by_unit;   /* buckets by first unit */
    mf_areplay_index by_last;   /* buckets by last unit */
    int *cover, ncover;     /* the buckets covering the unit of the sweep, ascending */
    int *cover_next;        /* scratch of the sweep */
    mf_bufstate *buf;
    mf_vclock stream[MF_STREAM_COUNT];
    mf_vclock *event;
    bool *event_set;
    int step;               /* 1, 2, ...: the step running, or the last one run */
    int version;            /* the main_weight version the trainer must compute with */
    int mb;                 /* simulated microbatch index 0.., EVAL_MB in an evaluation pass */
    int nmb;                /* simulated microbatches per full step */
    int nrun;               /* microbatches run in this step (< nmb: a short step) */
    unsigned at;            /* MF_POS_* of the hook being issued */
    bool first;
    const char *pos;        /* "first", "middle", "last", "only", "evaluation pass" ... */
    int actor_kind, actor_unit; /* the trainer action in progress */
} mf_areplay;

static const char *mf_areplay_actor(const mf_areplay *sim, int actor, char *buf, size_t size)
{
    const mf_schedule *s = sim->c->s;
    if (actor >= 0)
        return mf_struct_opdesc(s, &s->ops[actor], buf, size);
    int a = -1 - actor;
    int kind = a % A_KINDS, unit = a / A_KINDS;
    if (kind == A_OPTIMIZER)
        snprintf(buf, size, "the optimizer (after step_end, on compute)");
    else
        snprintf(buf, size, "the %s of unit %s (on compute)",
                 kind == A_FORWARD ? "forward" : kind == A_EVAL ? "evaluation forward" : "backward",
                 mf_verify_unit(s, unit));
    return buf;
}

static int mf_areplay_trainer_actor(int kind, int unit)
{
    return -1 - (unit * A_KINDS + kind);
}

static bool mf_areplay_ordered(const mf_areplay *sim, int stream, const mf_access *prev)
{
    return prev->stream < 0 || prev->stream == stream || sim->stream[stream].c[prev->stream] >= prev->t;
}

static void mf_areplay_hazard(mf_areplay *sim, int actor, int stream, int b, const mf_access *prev, const char *what)
{
    mf_verify_ctx *c = sim->c;
    int what_key = what[0] * 256 + what[1];
    if (!mf_verify_first(c, actor, b, what_key))
        return;
    char a[192], p[192];
    char where[64] = "";
    if (actor != mf_areplay_trainer_actor(A_OPTIMIZER, 0))
        snprintf(where, sizeof where, " (microbatch %s)", sim->pos);
    mf_verify_err(c, "%s %s %s %s by %s without an event edge%s", mf_areplay_actor(sim, actor, a, sizeof a),
                  what[0] == 'r' ? "reads" : "writes", mf_verify_bufname(c->s, b),
                  what[1] == 'w' ? "written" : "read", mf_areplay_actor(sim, prev->actor, p, sizeof p), where);
    (void)stream;
}

/* Ordering checks and bookkeeping for one access; `write` distinguishes. */
static void mf_areplay_access(mf_areplay *sim, int actor, int stream, int b, bool write)
{
    mf_bufstate *st = &sim->buf[b];
    int64_t t = sim->stream[stream].c[stream];
    if (!mf_areplay_ordered(sim, stream, &st->write))
        mf_areplay_hazard(sim, actor, stream, b, &st->write, write ? "ww" : "rw");
    if (write) {
        for (int r = 0; r < MF_STREAM_COUNT; r++)
            if (st->reads[r].stream >= 0 && !mf_areplay_ordered(sim, stream, &st->reads[r]))
                mf_areplay_hazard(sim, actor, stream, b, &st->reads[r], "wr");
        st->write = (mf_access){stream, t, actor, sim->mb};
        for (int r = 0; r < MF_STREAM_COUNT; r++)
            st->reads[r].stream = -1;
    } else {
        st->reads[stream] = (mf_access){stream, t, actor, sim->mb};
    }
}

static void mf_areplay_tick(mf_areplay *sim, int stream)
{
    sim->stream[stream].c[stream]++;
}

/* A value error, reported once per (actor, buffer). */
__attribute__((format(printf, 4, 5))) static void mf_areplay_bad(mf_areplay *sim, int actor, int b, const char *fmt, ...)
{
    mf_verify_ctx *c = sim->c;
    if (!mf_verify_first(c, actor, b, 0))
        return;
    char msg[512], a[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (actor == mf_areplay_trainer_actor(A_OPTIMIZER, 0)) /* runs between steps, not in a microbatch */
        mf_verify_err(c, "%s %s", mf_areplay_actor(sim, actor, a, sizeof a), msg);
    else
        mf_verify_err(c, "%s %s (microbatch %s)", mf_areplay_actor(sim, actor, a, sizeof a), msg, sim->pos);
}

/* Checks that buffer b holds something readable now; false when not. Runs
 * for every read of every op, so the name is looked up for a message only. */
static bool mf_areplay_readable(mf_areplay *sim, int actor, int b)
{
    const mf_schedule *s = sim->c->s;
    const mf_bufstate *st = &sim->buf[b];
    const mf_buffer *bf = &s->buffers[b];
    if (st->v.kind == V_NONE) {
        mf_areplay_bad(sim, actor, b, "reads %s, which holds nothing yet in this step", mf_verify_bufname(s, b));
        return false;
    }
    if (st->v.released) {
        mf_areplay_bad(sim, actor, b, "reads %s after it was released at forward_post (its unit reshards after forward) "
                   "and before it was gathered again", mf_verify_bufname(s, b));
        return false;
    }
    if (bf->lifetime == MF_LIFETIME_MICROBATCH && (st->v.step != sim->step || st->v.mb != sim->mb)) {
        mf_areplay_bad(sim, actor, b, "reads %s (lifetime microbatch) written in an earlier microbatch",
                       mf_verify_bufname(s, b));
        return false;
    }
    if (bf->lifetime == MF_LIFETIME_STEP && st->v.step != sim->step) {
        mf_areplay_bad(sim, actor, b, "reads %s (lifetime step) written in an earlier step", mf_verify_bufname(s, b));
        return false;
    }
    return true;
}

/* The microbatches the step ran (all M of a full step, m of a short one). */
static uint32_t mf_areplay_all_mbs(const mf_areplay *sim)
{
    return (1u << sim->nrun) - 1u;
}

static void mf_areplay_data_op(mf_areplay *sim, const mf_op *op)
{
    const mf_schedule *s = sim->c->s;
    int k = s->mesh.naxes;
    char pa[64], pb[64];
    mf_areplay_tick(sim, op->stream);
    mf_areplay_access(sim, op->id, op->stream, op->src, false);
    mf_areplay_access(sim, op->id, op->stream, op->dst, true);
    mf_bufstate *src = &sim->buf[op->src], *dst = &sim->buf[op->dst];
    const mf_buffer *db = &s->buffers[op->dst];
    mf_absval nv = src->v;
    bool ok = mf_areplay_readable(sim, op->id, op->src);
    if (ok) {
        bool grad_op = op->kind == MF_OP_REDUCE_SCATTER || op->kind == MF_OP_ALL_REDUCE || op->kind == MF_OP_ACCUMULATE;
        if (grad_op && nv.kind != V_GRAD) {
            mf_areplay_bad(sim, op->id, op->src, "reduces %s, which holds a weight, not a gradient",
                       mf_verify_bufname(s, op->src));
            ok = false;
        }
    }
    if (ok) {
        char why[128];
        mf_placement moved;
        if (!mf_struct_op_move(s, op, &nv.place, &moved, why, sizeof why)) {
            mf_areplay_bad(sim, op->id, op->src, "reads %s holding %s: %s", mf_verify_bufname(s, op->src),
                       mf_placement_format(&nv.place, k, pa, sizeof pa), why);
            ok = false;
        }
        nv.place = moved;
    }
    if (ok && op->kind == MF_OP_ACCUMULATE && !sim->first) {
        if (dst->v.kind != V_GRAD || dst->v.step != sim->step) {
            mf_areplay_bad(sim, op->id, op->dst, "adds into %s, which holds no gradient of this step",
                       mf_verify_bufname(s, op->dst));
            ok = false;
        } else if (!mf_placement_equal(&dst->v.place, &nv.place, k)) {
            mf_areplay_bad(sim, op->id, op->dst, "adds a gradient at %s into %s holding one at %s",
                       mf_placement_format(&nv.place, k, pa, sizeof pa), mf_verify_bufname(s, op->dst),
                       mf_placement_format(&dst->v.place, k, pb, sizeof pb));
            ok = false;
        } else if (dst->v.mbs & nv.mbs) {
            mf_areplay_bad(sim, op->id, op->dst, "adds the gradient of a microbatch into %s twice",
                       mf_verify_bufname(s, op->dst));
            ok = false;
        } else {
            nv.mbs |= dst->v.mbs;
        }
    }
    if (ok && !mf_placement_equal(&nv.place, &db->place, k)) {
        mf_areplay_bad(sim, op->id, op->dst, "writes a value at %s into %s, declared %s",
                   mf_placement_format(&nv.place, k, pa, sizeof pa), mf_verify_bufname(s, op->dst),
                   mf_placement_format(&db->place, k, pb, sizeof pb));
        ok = false;
    }
    if (!ok) {
        /* Poison the destination so one mistake is reported once, where it is made. */
        dst->v = (mf_absval){.kind = V_NONE};
        dst->v.step = -1;
        return;
    }
    nv.dtype = db->dtype;
    nv.step = sim->step;
    nv.mb = sim->mb;
    nv.released = false;
    dst->v = nv;
}

static void mf_areplay_event_op(mf_areplay *sim, const mf_op *op)
{
    mf_areplay_tick(sim, op->stream);
    if (op->kind == MF_OP_RECORD) {
        sim->event[op->event] = sim->stream[op->stream];
        sim->event_set[op->event] = true;
    } else if (sim->event_set[op->event]) {
        for (int i = 0; i < MF_STREAM_COUNT; i++)
            if (sim->event[op->event].c[i] > sim->stream[op->stream].c[i])
                sim->stream[op->stream].c[i] = sim->event[op->event].c[i];
    }
}

static bool mf_areplay_when(const mf_areplay *sim, mf_when w)
{
    return mf_when_holds(w, sim->at);
}

/* Issues the ops of one hook, in id order. */
static void mf_areplay_hook(mf_areplay *sim, const int *ids, int n)
{
    const mf_schedule *s = sim->c->s;
    for (int i = 0; i < n; i++) {
        const mf_op *op = &s->ops[ids[i]];
        if (!mf_areplay_when(sim, op->when))
            continue;
        if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
            mf_areplay_event_op(sim, op);
        else
            mf_areplay_data_op(sim, op);
    }
}

/*
 * Moves the sweep to unit v: sim->cover becomes the buckets covering v
 * (unit <= v <= last_unit), ascending. Forward (v ascending from 0) keeps the
 * previous unit's buckets that reach v and merges in those starting at v;
 * backward (v descending from the last unit) keeps those that start at or
 * before v and merges in those ending at v. Each call costs the two lists'
 * lengths, so a sweep costs the trainer's accesses, not units x buckets.
 */
static void mf_areplay_cover(mf_areplay *sim, int v, bool forward)
{
    const mf_schedule *s = sim->c->s;
    const mf_areplay_index *ix = forward ? &sim->by_unit : &sim->by_last;
    const int *add = ix->ids + ix->start[v];
    int nadd = ix->start[v + 1] - ix->start[v], n = 0, i = 0, j = 0;
    while (i < sim->ncover || j < nadd) {
        if (i < sim->ncover) {
            const mf_bucket *bk = &s->buckets[sim->cover[i]];
            if (forward ? bk->last_unit < v : bk->unit > v) {
                i++;
                continue;
            }
        }
        if (j >= nadd || (i < sim->ncover && sim->cover[i] < add[j]))
            sim->cover_next[n++] = sim->cover[i++];
        else
            sim->cover_next[n++] = add[j++];
    }
    int *t = sim->cover;
    sim->cover = sim->cover_next;
    sim->cover_next = t;
    sim->ncover = n;
}

/* Placement p is bucket bk's unsharded weight: Replicate on every axis but
 * the bucket's Distinct ones, where it is this coordinate's own tensor. */
static bool mf_verify_unsharded(const mf_schedule *s, const mf_bucket *bk, const mf_placement *p)
{
    mf_placement rep = mf_placement_uniform(MF_PLACE_REPLICATE, &bk->place[MF_ROLE_WEIGHT], s->mesh.naxes);
    return mf_placement_equal(p, &rep, s->mesh.naxes);
}

/* The trainer reads the unsharded weight of every bucket covering unit v
 * (sim->cover). */
static void mf_areplay_compute_reads(mf_areplay *sim, int kind, int v)
{
    mf_verify_ctx *c = sim->c;
    const mf_schedule *s = c->s;
    int actor = mf_areplay_trainer_actor(kind, v);
    char pa[64];
    mf_areplay_tick(sim, MF_STREAM_COMPUTE);
    for (int i = 0; i < sim->ncover; i++) {
        int b = sim->cover[i];
        const mf_bucket *bk = &s->buckets[b];
        int fb = c->full[b];
        mf_areplay_access(sim, actor, MF_STREAM_COMPUTE, fb, false);
        if (!mf_areplay_readable(sim, actor, fb))
            continue;
        const mf_absval *val = &sim->buf[fb].v;
        if (val->kind != V_WEIGHT)
            mf_areplay_bad(sim, actor, fb, "computes with %s, which holds a gradient", mf_verify_bufname(s, fb));
        else if (val->version != sim->version)
            mf_areplay_bad(sim, actor, fb, "computes with %s holding the main_weight of %s (T1 did not refresh it)",
                           mf_verify_bufname(s, fb), kind == A_EVAL ? "before the last optimizer step"
                                                                    : "the previous step");
        else if (!mf_verify_unsharded(s, bk, &val->place))
            mf_areplay_bad(sim, actor, fb, "computes with %s holding %s, not the unsharded weight",
                       mf_verify_bufname(s, fb), mf_placement_format(&val->place, s->mesh.naxes, pa, sizeof pa));
        else if (val->dtype != bk->dtype[MF_ROLE_WEIGHT])
            mf_areplay_bad(sim, actor, fb, "computes with %s in %s, not weight's dtype %s", mf_verify_bufname(s, fb),
                       mf_dtype_name(val->dtype), mf_dtype_name(bk->dtype[MF_ROLE_WEIGHT]));
    }
}

/* The trainer writes this microbatch's gradient of the buckets covering v
 * (sim->cover). */
static void mf_areplay_compute_grads(mf_areplay *sim, int v)
{
    mf_verify_ctx *c = sim->c;
    const mf_schedule *s = c->s;
    int actor = mf_areplay_trainer_actor(A_BACKWARD, v);
    for (int i = 0; i < sim->ncover; i++) {
        int b = sim->cover[i];
        const mf_bucket *bk = &s->buckets[b];
        int lb = c->local[b];
        mf_areplay_access(sim, actor, MF_STREAM_COMPUTE, lb, true);
        mf_absval *val = &sim->buf[lb].v;
        mf_placement partial = mf_placement_uniform(MF_PLACE_PARTIAL, &bk->place[MF_ROLE_GRAD], s->mesh.naxes);
        *val = (mf_absval){.kind = V_GRAD, .place = partial, .dtype = bk->dtype[MF_ROLE_GRAD],
                           .mbs = 1u << sim->mb, .step = sim->step, .mb = sim->mb};
    }
}

/* After step_end: the optimizer reads every delivered gradient and writes main_weight. */
static void mf_areplay_optimizer(mf_areplay *sim)
{
    mf_verify_ctx *c = sim->c;
    const mf_schedule *s = c->s;
    int k = s->mesh.naxes, actor = mf_areplay_trainer_actor(A_OPTIMIZER, 0);
    char pa[64], pb[64];
    mf_areplay_tick(sim, MF_STREAM_COMPUTE);
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        int db = c->delivered[b];
        mf_areplay_access(sim, actor, MF_STREAM_COMPUTE, db, false);
        const mf_absval *val = &sim->buf[db].v;
        if (val->kind != V_GRAD || val->step != sim->step) {
            mf_areplay_bad(sim, actor, db, "finds no gradient of this step in %s at step_end", mf_verify_bufname(s, db));
        } else if (!mf_placement_equal(&val->place, &bk->place[MF_ROLE_MAIN_WEIGHT], k)) {
            mf_areplay_bad(sim, actor, db, "receives the gradient in %s at %s, but main_weight is %s (reduced over "
                       "every axis)", mf_verify_bufname(s, db), mf_placement_format(&val->place, k, pa, sizeof pa),
                       mf_placement_format(&bk->place[MF_ROLE_MAIN_WEIGHT], k, pb, sizeof pb));
        } else if (val->mbs != mf_areplay_all_mbs(sim)) {
            char missing[64] = "";
            int n = 0;
            for (int m = 0; m < sim->nrun; m++)
                if (!(val->mbs & (1u << m)))
                    n += snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                                  n ? ", " : "", m == 0 ? "first" : m == sim->nmb - 1 ? "last" : "middle") > 0;
            mf_areplay_bad(sim, actor, db, "receives in %s a gradient that misses microbatch%s %s",
                       mf_verify_bufname(s, db), n > 1 ? "es" : "", missing);
        }
        int mw = c->mainw[b];
        mf_areplay_access(sim, actor, MF_STREAM_COMPUTE, mw, true);
        sim->buf[mw].v = (mf_absval){.kind = V_WEIGHT, .place = bk->place[MF_ROLE_MAIN_WEIGHT],
                                     .dtype = bk->dtype[MF_ROLE_MAIN_WEIGHT], .version = sim->step + 1,
                                     .step = sim->step, .mb = sim->mb};
    }
}

/* Ops grouped by hook: index = phase * (nunits + 1) + unit + 1. */
typedef struct mf_areplay_hooks {
    int *start, *ids;
} mf_areplay_hooks;

static int mf_areplay_hook_index(const mf_schedule *s, mf_phase ph, int unit)
{
    return (int)ph * (s->nunits + 1) + unit + 1;
}

static void mf_areplay_run_hook(mf_areplay *sim, const mf_areplay_hooks *h, mf_phase ph, int unit)
{
    int i = mf_areplay_hook_index(sim->c->s, ph, unit);
    mf_areplay_hook(sim, h->ids + h->start[i], h->start[i + 1] - h->start[i]);
}

/* Unit v's forward window (a step's or an evaluation pass's: mode A_FORWARD
 * or A_EVAL): its pre hook, the trainer's reads of the unsharded weights,
 * its post hook. */
static void mf_areplay_forward_unit(mf_areplay *sim, const mf_areplay_hooks *h, int v, int mode)
{
    bool eval = mode == A_EVAL;
    mf_areplay_run_hook(sim, h, eval ? MF_PHASE_EVAL_PRE : MF_PHASE_FORWARD_PRE, v);
    mf_areplay_cover(sim, v, true);
    mf_areplay_compute_reads(sim, mode, v);
    mf_areplay_run_hook(sim, h, eval ? MF_PHASE_EVAL_POST : MF_PHASE_FORWARD_POST, v);
}

/* A step of sim->nrun microbatch positions (< sim->nmb: a short step, whose
 * step_end runs the `short` program). */
static void mf_areplay_step(mf_areplay *sim, const mf_areplay_hooks *h)
{
    const mf_schedule *s = sim->c->s;
    bool full = sim->nrun == sim->nmb;
    sim->version = sim->step;
    sim->at = MF_POS_FIRST | MF_POS_LAST;
    mf_areplay_run_hook(sim, h, MF_PHASE_STEP_BEGIN, -1);
    for (int m = 0; m < sim->nrun; m++) {
        bool last = full && m == sim->nmb - 1;
        sim->mb = m;
        sim->first = m == 0;
        sim->at = (sim->first ? MF_POS_FIRST : 0) | (last ? MF_POS_LAST : 0);
        if (full)
            sim->pos = sim->nmb == 1 ? "first=last" : sim->first ? "first" : last ? "last" : "middle";
        else
            sim->pos = sim->first ? "first (short step)" : "middle (short step)";
        sim->ncover = 0;
        for (int v = 0; v < s->nunits; v++) {
            mf_areplay_forward_unit(sim, h, v, A_FORWARD);
            for (int i = sim->by_last.start[v]; i < sim->by_last.start[v + 1]; i++) {
                int b = sim->by_last.ids[i];
                if (s->units[s->buckets[b].unit].reshard_after_forward && sim->c->full[b] >= 0 &&
                    s->buffers[sim->c->full[b]].kind == MF_BUF_WEIGHT_FULL)
                    sim->buf[sim->c->full[b]].v.released = true;
            }
        }
        sim->ncover = 0;
        for (int v = s->nunits - 1; v >= 0; v--) {
            mf_areplay_run_hook(sim, h, MF_PHASE_BACKWARD_PRE, v);
            mf_areplay_cover(sim, v, false);
            mf_areplay_compute_reads(sim, A_BACKWARD, v);
            mf_areplay_compute_grads(sim, v);
            mf_areplay_run_hook(sim, h, MF_PHASE_BACKWARD_POST, v);
        }
    }
    sim->at = full ? MF_POS_FIRST | MF_POS_LAST : MF_POS_SHORT;
    mf_areplay_run_hook(sim, h, MF_PHASE_STEP_END, -1);
    mf_areplay_optimizer(sim);
}

/* A microbatch index no step uses: what an evaluation pass writes is never
 * taken for a microbatch's own value. */
enum { EVAL_MB = 31 };

/* An evaluation pass after step sim->step: the trainer reads each unit's
 * unsharded weight, which must be the main_weight the optimizer just wrote. */
static void mf_areplay_eval(mf_areplay *sim, const mf_areplay_hooks *h)
{
    const mf_schedule *s = sim->c->s;
    sim->version = sim->step + 1;
    sim->mb = EVAL_MB;
    sim->first = false;
    sim->at = MF_POS_FIRST | MF_POS_LAST;
    sim->pos = "evaluation pass";
    sim->ncover = 0;
    for (int v = 0; v < s->nunits; v++)
        mf_areplay_forward_unit(sim, h, v, A_EVAL);
}

/* Groups the buckets by first unit (`first`) or last unit, ascending within a
 * unit (a stable counting sort; the units were checked to be in range).
 * False on OOM; ix holds what was allocated. */
static bool mf_areplay_index_build(mf_areplay_index *ix, const mf_schedule *s, bool first)
{
    ix->start = calloc((size_t)s->nunits + 2, sizeof *ix->start);
    ix->ids = malloc((size_t)(s->nbuckets ? s->nbuckets : 1) * sizeof *ix->ids);
    if (!ix->start || !ix->ids)
        return false;
    for (int b = 0; b < s->nbuckets; b++)
        ix->start[(first ? s->buckets[b].unit : s->buckets[b].last_unit) + 2]++;
    for (int u = 0; u < s->nunits; u++)
        ix->start[u + 2] += ix->start[u + 1];
    for (int b = 0; b < s->nbuckets; b++)
        ix->ids[ix->start[(first ? s->buckets[b].unit : s->buckets[b].last_unit) + 1]++] = b;
    return true;
}

static void mf_areplay_run(mf_verify_ctx *c)
{
    const mf_schedule *s = c->s;
    int nh = MF_PHASE_COUNT * (s->nunits + 1) + 1;
    mf_areplay_hooks h = {calloc((size_t)nh + 1, sizeof(int)), malloc((size_t)(s->nops ? s->nops : 1) * sizeof(int))};
    mf_areplay sim = {.c = c};
    sim.buf = calloc((size_t)(s->nbuffers ? s->nbuffers : 1), sizeof *sim.buf);
    sim.event = calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *sim.event);
    sim.event_set = calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *sim.event_set);
    sim.cover = malloc((size_t)(s->nbuckets ? s->nbuckets : 1) * sizeof *sim.cover);
    sim.cover_next = malloc((size_t)(s->nbuckets ? s->nbuckets : 1) * sizeof *sim.cover_next);
    if (!h.start || !h.ids || !sim.buf || !sim.event || !sim.event_set || !sim.cover || !sim.cover_next ||
        !mf_areplay_index_build(&sim.by_unit, s, true) || !mf_areplay_index_build(&sim.by_last, s, false)) {
        mf_verify_err(c, "out of memory while verifying");
        goto done;
    }
    /* counting sort of op ids by hook, stable (keeps id order within a hook) */
    for (int i = 0; i < s->nops; i++)
        h.start[mf_areplay_hook_index(s, s->ops[i].phase, s->ops[i].unit) + 1]++;
    for (int i = 0; i < nh; i++)
        h.start[i + 1] += h.start[i];
    {
        int *fill = calloc((size_t)nh, sizeof *fill);
        if (!fill) {
            mf_verify_err(c, "out of memory while verifying");
            goto done;
        }
        for (int i = 0; i < s->nops; i++) {
            int x = mf_areplay_hook_index(s, s->ops[i].phase, s->ops[i].unit);
            h.ids[h.start[x] + fill[x]++] = i;
        }
        free(fill);
    }
    for (int i = 0; i < s->nbuffers; i++) {
        sim.buf[i].write.stream = -1;
        for (int r = 0; r < MF_STREAM_COUNT; r++)
            sim.buf[i].reads[r].stream = -1;
        sim.buf[i].v.step = -1;
    }
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        sim.buf[c->mainw[b]].v = (mf_absval){.kind = V_WEIGHT, .place = bk->place[MF_ROLE_MAIN_WEIGHT],
                                            .dtype = bk->dtype[MF_ROLE_MAIN_WEIGHT], .version = 1, .step = 0};
    }
    sim.nmb = s->microbatches >= 3 ? 3 : (int)s->microbatches;
    int runs[MF_REPLAY_RUNS_MAX], nruns = mf_schedule_replay_runs(s, runs);
    for (int r = 0; r < nruns; r++) {
        if (runs[r] == 0) {
            mf_areplay_eval(&sim, &h);
            continue;
        }
        sim.step++;
        sim.nrun = runs[r];
        mf_areplay_step(&sim, &h);
    }
done:
    free(h.start);
    free(h.ids);
    free(sim.buf);
    free(sim.event);
    free(sim.event_set);
    free(sim.cover);
    free(sim.cover_next);
    free(sim.by_unit.start);
    free(sim.by_unit.ids);
    free(sim.by_last.start);
    free(sim.by_last.ids);
}

int mf_verify_run(const mf_schedule *s, mf_diag *d)
{
    mf_verify_ctx c = {.s = s, .d = d};
    mf_struct_sink k = {mf_verify_finding, &c, 0, false};
    if (mf_struct_check(s, MF_STRUCT_STRICT, &k) != 0)
        return c.errors;
    size_t nb = s->nbuckets ? (size_t)s->nbuckets : 1;
    c.delivered = malloc(nb * sizeof(int));
    c.full = malloc(nb * sizeof(int));
    c.local = malloc(nb * sizeof(int));
    c.mainw = malloc(nb * sizeof(int));
    if (!c.delivered || !c.full || !c.local || !c.mainw) {
        mf_verify_err(&c, "out of memory while verifying");
        goto done;
    }
    for (size_t b = 0; b < nb; b++)
        c.delivered[b] = c.full[b] = c.local[b] = c.mainw[b] = -1;
    mf_verify_roles(&c);
    mf_areplay_run(&c);
    if (c.errors == 0) /* memory reuse: hazards per arena byte range */
        c.errors += mf_verify_memory(s, d);
done:
    free(c.delivered);
    free(c.full);
    free(c.local);
    free(c.mainw);
    mf_hash_free(&c.seen);
    return c.errors;
}
