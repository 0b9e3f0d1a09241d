/*
 * mf_live: live intervals of transient buffers; see the header for the time
 * model. Linear in ops and buffers apart from one sort of each buffer's
 * accesses.
 */
#include "mf_live.h"
#include "mf_free.h"
#include "mf_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct access {
    int64_t t;
    int stream;
    int op;                 /* -2: the trainer */
    int hook;
    bool pure;
} access;

int mf_live_hook(const mf_schedule *s, mf_phase phase, int unit)
{
    int U = s->nunits;
    switch (phase) {
    case MF_PHASE_STEP_BEGIN:
        return 0;
    case MF_PHASE_FORWARD_PRE:
        return 1 + 2 * unit;
    case MF_PHASE_FORWARD_POST:
        return 2 + 2 * unit;
    case MF_PHASE_BACKWARD_PRE:
        return 2 * U + 1 + 2 * (U - 1 - unit);
    case MF_PHASE_BACKWARD_POST:
        return 2 * U + 2 + 2 * (U - 1 - unit);
    default:
        return 4 * U + 1;
    }
}

mf_phase mf_live_hook_phase(const mf_schedule *s, int h)
{
    int U = s->nunits;
    if (h == 0)
        return MF_PHASE_STEP_BEGIN;
    if (h >= 4 * U + 1)
        return MF_PHASE_STEP_END;
    if (h <= 2 * U)
        return (h - 1) % 2 == 0 ? MF_PHASE_FORWARD_PRE : MF_PHASE_FORWARD_POST;
    return (h - 2 * U - 1) % 2 == 0 ? MF_PHASE_BACKWARD_PRE : MF_PHASE_BACKWARD_POST;
}

int64_t mf_live_bytes(const mf_schedule *s, int b)
{
    int64_t a = s->align > 0 ? s->align : 1;
    int64_t bytes = s->buffers[b].count * (int64_t)mf_dtype_size(s->buffers[b].dtype);
    return (bytes + a - 1) / a * a;
}

static int cmp_access(const void *x, const void *y)
{
    const access *a = x, *b = y;
    int c = mf_cmp_i64(a->t, b->t);
    return c ? c : (int)b->pure - (int)a->pure;
}

static int64_t trainer_tick(const mf_live *lv, int h)
{
    return lv->hook_base[h + 1] - 1;
}

#ifndef MF_LIVE_OUTER_WINDOWS
#define MF_LIVE_OUTER_WINDOWS 2
#endif

/* Tick of the trainer's compute after the `windows`-th window-opening hook (a
 * forward_pre or backward_pre) strictly after hook h, unwrapped (>= T when
 * it is in the next microbatch). */
static int64_t next_window_end(const mf_schedule *s, const mf_live *lv, int h, int windows)
{
    for (int k = 1; k <= lv->nhooks; k++) {
        int g = (h + k) % lv->nhooks;
        mf_phase p = mf_live_hook_phase(s, g);
        if ((p == MF_PHASE_FORWARD_PRE || p == MF_PHASE_BACKWARD_PRE) && --windows == 0)
            return trainer_tick(lv, g) + (h + k >= lv->nhooks ? lv->T : 0);
    }
    return trainer_tick(lv, h);
}

static bool transient(const mf_schedule *s, int b)
{
    return b >= 0 && b < s->nbuffers && mf_live_in_arena(&s->buffers[b]);
}

/* Time layout: ticks per hook (its ops, then the trainer). */
static bool build_time(const mf_schedule *s, mf_live *lv)
{
    lv->nhooks = 4 * s->nunits + 2;
    lv->hook_base = calloc((size_t)lv->nhooks + 1, sizeof *lv->hook_base);
    lv->op_hook = calloc((size_t)(s->nops ? s->nops : 1), sizeof *lv->op_hook);
    lv->op_tick = calloc((size_t)(s->nops ? s->nops : 1), sizeof *lv->op_tick);
    if (!lv->hook_base || !lv->op_hook || !lv->op_tick)
        return false;
    int64_t *n = calloc((size_t)lv->nhooks, sizeof *n);
    if (!n)
        return false;
    for (int i = 0; i < s->nops; i++) {
        /* the short-step and evaluation programs are not in the cycle */
        lv->op_hook[i] = mf_op_in_step(&s->ops[i]) ? mf_live_hook(s, s->ops[i].phase, s->ops[i].unit) : -1;
        if (lv->op_hook[i] >= 0)
            n[lv->op_hook[i]]++;
    }
    int64_t t = 0;
    for (int h = 0; h < lv->nhooks; h++) {
        lv->hook_base[h] = t;
        t += n[h] + 1;
        n[h] = lv->hook_base[h]; /* next tick to hand out */
    }
    lv->hook_base[lv->nhooks] = t;
    lv->T = t;
    for (int i = 0; i < s->nops; i++)
        lv->op_tick[i] = lv->op_hook[i] >= 0 ? n[lv->op_hook[i]]++ : -1;
    free(n);
    return true;
}

static void add(access *acc, int *fill, int b, int64_t t, int stream, int op, int hook, bool pure)
{
    acc[fill[b]++] = (access){.t = t, .stream = stream, .op = op, .hook = hook, .pure = pure};
}

/* Every access of every transient buffer, grouped by buffer (start[b]). */
static access *collect(const mf_schedule *s, const mf_live *lv, int *start)
{
    int *cnt = calloc((size_t)s->nbuffers + 1, sizeof *cnt);
    if (!cnt)
        return NULL;
    for (int i = 0; i < s->nops; i++) {
        if (lv->op_hook[i] < 0)
            continue;
        if (transient(s, s->ops[i].src))
            cnt[s->ops[i].src]++;
        if (transient(s, s->ops[i].dst))
            cnt[s->ops[i].dst]++;
    }
    for (int b = 0; b < s->nbuffers; b++)
        if (transient(s, b) && (s->buffers[b].kind == MF_BUF_WEIGHT_FULL || s->buffers[b].kind == MF_BUF_GRAD_LOCAL))
            cnt[b] += 4;
    start[0] = 0;
    for (int b = 0; b < s->nbuffers; b++)
        start[b + 1] = start[b] + cnt[b];
    access *acc = malloc(sizeof *acc * (size_t)(start[s->nbuffers] ? start[s->nbuffers] : 1));
    if (!acc) {
        free(cnt);
        return NULL;
    }
    memcpy(cnt, start, sizeof *cnt * (size_t)s->nbuffers);
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        int h = lv->op_hook[i];
        if (h < 0)
            continue;
        if (transient(s, op->src))
            add(acc, cnt, op->src, lv->op_tick[i], op->stream, i, h, false);
        if (transient(s, op->dst))
            add(acc, cnt, op->dst, lv->op_tick[i], op->stream, i, h,
                op->kind != MF_OP_ACCUMULATE && op->src != op->dst);
    }
    for (int b = 0; b < s->nbuffers; b++) {
        const mf_buffer *bf = &s->buffers[b];
        if (!transient(s, b) || (bf->kind != MF_BUF_WEIGHT_FULL && bf->kind != MF_BUF_GRAD_LOCAL))
            continue;
        const mf_bucket *bk = &s->buckets[bf->bucket];
        int hb0 = mf_live_hook(s, MF_PHASE_BACKWARD_PRE, bk->last_unit);
        int hb1 = mf_live_hook(s, MF_PHASE_BACKWARD_PRE, bk->unit);
        bool local = bf->kind == MF_BUF_GRAD_LOCAL;
        int hf0 = mf_live_hook(s, MF_PHASE_FORWARD_PRE, bk->unit);
        int hf1 = mf_live_hook(s, MF_PHASE_FORWARD_PRE, bk->last_unit);
        /* grad_local: written over the backward window (forward entries
         * repeat the backward ones so the count stays 4). */
        add(acc, cnt, b, trainer_tick(lv, local ? hb0 : hf0), MF_STREAM_COMPUTE, -2, local ? hb0 : hf0, false);
        add(acc, cnt, b, trainer_tick(lv, local ? hb1 : hf1), MF_STREAM_COMPUTE, -2, local ? hb1 : hf1, false);
        add(acc, cnt, b, trainer_tick(lv, hb0), MF_STREAM_COMPUTE, -2, hb0, local);
        add(acc, cnt, b, trainer_tick(lv, hb1), MF_STREAM_COMPUTE, -2, hb1, false);
    }
    free(cnt);
    return acc;
}

/* Segments of one buffer from its sorted accesses a[0..n). */
static void segments(const mf_schedule *s, const mf_live *lv, int b, const access *a, int n,
                     mf_live_seg *out, int *nout)
{
    int npure = 0;
    for (int i = 0; i < n; i++)
        npure += a[i].pure;
    if (n == 0)
        return;
    for (int i = 0; i < n; i++) {
        if (npure > 0 && !a[i].pure)
            continue;
        mf_live_seg *g = &out[(*nout)++];
        memset(g, 0, sizeof *g);
        g->buffer = b;
        g->conditional = true;
        for (int st = 0; st < MF_STREAM_COUNT; st++)
            g->last[st] = -1;
        if (npure == 0) {       /* never overwritten: live all the time */
            g->start = 0;
            g->end = lv->T - 1;
            g->writer = -3;
            g->writer_hook = 0;
        } else {
            g->start = a[i].t;
            g->writer = a[i].op == -2 ? -1 : a[i].op;
            g->writer_hook = a[i].hook;
        }
        int64_t end = g->start;
        int last = i;
        for (int k = 0; k < n; k++) {
            int j = (i + k) % n;
            if (npure > 0 && k > 0 && a[j].pure)
                break;
            int64_t t = a[j].t + (j < i ? lv->T : 0);
            if (npure == 0)
                t = a[j].t;
            if (t >= end) {
                end = t;
                last = j;
            }
            g->last[a[j].stream] = a[j].op;
            g->last_hook[a[j].stream] = a[j].hook;
            if (a[j].op < 0 || s->ops[a[j].op].when == MF_WHEN_EVERY)
                g->conditional = false;
            else
                g->cond_class |= s->ops[a[j].op].when == MF_WHEN_FIRST ? 1 : 2;
        }
        if (npure > 0 && a[last].op >= 0 && a[last].stream != MF_STREAM_COMPUTE) {
            /* the outer axis is the slow one (docs/semantics.md §10) */
            int windows = a[last].stream == MF_STREAM_OUTER ? MF_LIVE_OUTER_WINDOWS : 1;
            int64_t ext = next_window_end(s, lv, a[last].hook, windows) + (last < i ? lv->T : 0);
            if (ext > end)
                end = ext;
        }
        if (end > g->start + lv->T - 1)
            end = g->start + lv->T - 1;
        if (npure > 0)
            g->end = end;
        if (!g->conditional)
            g->cond_class = 0;
        if (npure == 0)
            break;
    }
}

bool mf_live_build(const mf_schedule *s, mf_live *lv)
{
    memset(lv, 0, sizeof *lv);
    int *start = calloc((size_t)s->nbuffers + 1, sizeof *start);
    lv->buf_seg = calloc((size_t)s->nbuffers + 1, sizeof *lv->buf_seg);
    access *acc = NULL;
    if (!start || !lv->buf_seg || !build_time(s, lv) || !(acc = collect(s, lv, start)))
        goto fail;
    lv->segs = malloc(sizeof *lv->segs * (size_t)(start[s->nbuffers] + s->nbuffers + 1));
    if (!lv->segs)
        goto fail;
    for (int b = 0; b < s->nbuffers; b++) {
        lv->buf_seg[b] = lv->nsegs;
        int n = start[b + 1] - start[b];
        qsort(acc + start[b], (size_t)n, sizeof *acc, cmp_access);
        segments(s, lv, b, acc + start[b], n, lv->segs, &lv->nsegs);
        /* An extension never reaches the buffer's own next write. */
        int first = lv->buf_seg[b], cnt = lv->nsegs - first;
        for (int g = 0; cnt > 1 && g < cnt; g++) {
            mf_live_seg *x = &lv->segs[first + g];
            int64_t next = lv->segs[first + (g + 1) % cnt].start + (g + 1 == cnt ? lv->T : 0);
            if (x->end >= next)
                x->end = next - 1;
        }
    }
    lv->buf_seg[s->nbuffers] = lv->nsegs;
    free(acc);
    free(start);
    return true;
fail:
    free(acc);
    free(start);
    mf_live_free(lv);
    return false;
}

void mf_live_free(mf_live *lv)
{
    MF_FREE_ALL(lv->hook_base, lv->op_hook, lv->op_tick, lv->segs, lv->buf_seg);
    memset(lv, 0, sizeof *lv);
}

static bool meet(int64_t a0, int64_t a1, int64_t b0, int64_t b1)
{
    return a0 <= b1 && b0 <= a1;
}

bool mf_live_overlap(const mf_live *lv, const mf_live_seg *a, const mf_live_seg *b)
{
    int64_t T = lv->T;
    return meet(a->start, a->end, b->start, b->end) || meet(a->start, a->end, b->start + T, b->end + T) ||
           meet(a->start + T, a->end + T, b->start, b->end);
}

typedef struct delta {
    int64_t t, bytes;
} delta;

static int cmp_delta(const void *x, const void *y)
{
    const delta *a = x, *b = y;
    int c = mf_cmp_i64(a->t, b->t);
    return c ? c : mf_cmp_i64(a->bytes, b->bytes); /* removals first */
}

int64_t mf_live_lower_bound(const mf_schedule *s, const mf_live *lv)
{
    delta *d = malloc(sizeof *d * (size_t)(4 * lv->nsegs + 1));
    if (!d)
        return -1;
    int n = 0;
    for (int i = 0; i < lv->nsegs; i++) {
        const mf_live_seg *g = &lv->segs[i];
        int64_t bytes = mf_live_bytes(s, g->buffer);
        int64_t e = g->end < lv->T ? g->end : lv->T - 1;
        d[n++] = (delta){g->start, bytes};
        d[n++] = (delta){e + 1, -bytes};
        if (g->end >= lv->T) {
            d[n++] = (delta){0, bytes};
            d[n++] = (delta){g->end - lv->T + 1, -bytes};
        }
    }
    qsort(d, (size_t)n, sizeof *d, cmp_delta);
    int64_t live = 0, best = 0;
    for (int i = 0; i < n; i++) {
        live += d[i].bytes;
        if (live > best)
            best = live;
    }
    free(d);
    return best;
}
