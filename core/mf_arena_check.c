/*
 * mf_arena_check: see the header. The walk cuts the arena into elementary
 * byte ranges at every buffer boundary and lists, per range, the segments of
 * the buffers covering it in order of start; consecutive segments there are
 * the pairs that hand memory over. Checking only consecutive pairs suffices:
 * arcs of a cycle sorted by start are pairwise disjoint exactly when each
 * ends before the next one starts.
 */
#include "mf_arena_check.h"
#include "mf_int.h"
#include "mf_persist.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct piece {
    int range;              /* elementary range index */
    int seg;
    int64_t start;
} piece;

static int cmp_i64(const void *x, const void *y)
{
    return mf_cmp_i64(*(const int64_t *)x, *(const int64_t *)y);
}

static int cmp_piece(const void *x, const void *y)
{
    const piece *a = x, *b = y;
    return mf_cmp_keys((const int64_t[]){a->range, a->start, a->seg},
                       (const int64_t[]){b->range, b->start, b->seg}, 3);
}

/* Index of the first cut >= x. */
static int64_t lower(const int64_t *cut, int64_t n, int64_t x)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (cut[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int mf_arena_walk(const mf_schedule *s, const mf_live *lv, bool (*fn)(void *ctx, int a, int b),
                  void *ctx, bool through_conditional)
{
    int rc = -1;
    int64_t *cut = malloc(sizeof *cut * (size_t)(2 * s->nbuffers + 1));
    piece *p = NULL;
    if (!cut)
        return -1;
    int64_t ncut = 0;
    for (int b = 0; b < s->nbuffers; b++)
        if (lv->buf_seg[b + 1] > lv->buf_seg[b]) {
            cut[ncut++] = s->buffers[b].offset;
            cut[ncut++] = s->buffers[b].offset + mf_live_bytes(s, b);
        }
    qsort(cut, (size_t)ncut, sizeof *cut, cmp_i64);
    int64_t m = 0;
    for (int64_t i = 0; i < ncut; i++)
        if (m == 0 || cut[m - 1] != cut[i])
            cut[m++] = cut[i];
    ncut = m;
    /* Count the pieces, then fill them. */
    size_t npiece = 0, cap = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int b = 0; b < s->nbuffers; b++) {
            int nseg = lv->buf_seg[b + 1] - lv->buf_seg[b];
            if (nseg == 0)
                continue;
            int64_t lo = lower(cut, ncut, s->buffers[b].offset);
            int64_t hi = lower(cut, ncut, s->buffers[b].offset + mf_live_bytes(s, b));
            for (int64_t r = lo; r < hi; r++)
                for (int g = lv->buf_seg[b]; g < lv->buf_seg[b + 1]; g++) {
                    if (pass == 1)
                        p[npiece] = (piece){.range = (int)r, .seg = g, .start = lv->segs[g].start};
                    npiece++;
                }
        }
        if (pass == 0) {
            cap = npiece;
            npiece = 0;
            if (!(p = malloc(sizeof *p * (cap ? cap : 1))))
                goto done;
        }
    }
    qsort(p, npiece, sizeof *p, cmp_piece);
    rc = 1;
    /* next[k * 4 + c]: the next piece of the group after k (cyclically) whose
     * segment has class c; -1 none */
    int *next = malloc(sizeof *next * (npiece ? npiece : 1) * 4);
    if (!next) {
        rc = -1;
        goto done;
    }
    for (size_t i = 0; i < npiece && rc == 1;) {
        size_t j = i;
        while (j < npiece && p[j].range == p[i].range)
            j++;
        size_t n = j - i;
        if (n > 1) {
            int last[4] = {-1, -1, -1, -1};
            for (size_t r = 0; r < 2 * n; r++) { /* backwards, twice round */
                size_t k = i + (2 * n - 1 - r) % n;
                for (int c = 0; c < 4; c++)
                    next[k * 4 + c] = last[c] == (int)k ? -1 : last[c];
                last[lv->segs[p[k].seg].cond_class] = (int)k;
            }
            for (size_t k = i; k < j && rc == 1; k++) {
                size_t nx = k + 1 < j ? k + 1 : i;
                if (!fn(ctx, p[k].seg, p[nx].seg))
                    rc = 0;
                if (!through_conditional || !lv->segs[p[nx].seg].conditional)
                    continue;
                /* the first segment of each class up to the next that occurs in
                 * every microbatch: the order must reach each of them directly */
                int stop = next[k * 4];
                size_t dstop = stop < 0 ? n : ((size_t)stop + n - k) % n;
                for (int c = 0; c < 4 && rc == 1; c++) {
                    int to = next[k * 4 + c];
                    if (to < 0 || to == (int)nx || ((size_t)to + n - k) % n > dstop)
                        continue;
                    if (!fn(ctx, p[k].seg, p[to].seg))
                        rc = 0;
                }
            }
        }
        i = j;
    }
    free(next);
done:
    free(p);
    free(cut);
    return rc;
}

typedef struct check_ctx {
    const mf_schedule *s;
    const mf_live *lv;
    char *msg;
    size_t len;
    int bad;
} check_ctx;

static bool check_pair(void *ctx, int a, int b)
{
    check_ctx *c = ctx;
    const mf_live_seg *x = &c->lv->segs[a], *y = &c->lv->segs[b];
    if (!mf_live_overlap(c->lv, x, y))
        return true;
    const mf_buffer *bx = &c->s->buffers[x->buffer], *by = &c->s->buffers[y->buffer];
    snprintf(c->msg, c->len,
             "buffer '%s' (offset %lld, %lld bytes) overlaps buffer '%s' (offset %lld, %lld bytes) "
             "in the arena while both are live (ticks %lld..%lld and %lld..%lld of %lld per microbatch)",
             by->name, (long long)by->offset, (long long)mf_live_bytes(c->s, y->buffer), bx->name,
             (long long)bx->offset, (long long)mf_live_bytes(c->s, x->buffer), (long long)y->start,
             (long long)y->end, (long long)x->start, (long long)x->end, (long long)c->lv->T);
    c->bad = y->buffer;
    return false;
}

typedef struct span {
    int64_t offset;
    int b;
} span;

static int cmp_span(const void *x, const void *y)
{
    const span *a = x, *b = y;
    return mf_cmp_i64(a->offset, b->offset);
}

static int persistent_disjoint(const mf_schedule *s, char *msg, size_t len)
{
    span *order = malloc(sizeof *order * (size_t)(s->nbuffers ? s->nbuffers : 1));
    if (!order)
        return -2;
    int n = 0;
    for (int b = 0; b < s->nbuffers; b++)
        if (!mf_live_in_arena(&s->buffers[b]) && !mf_persist_per_rank(s, b))
            order[n++] = (span){s->buffers[b].offset, b};
    qsort(order, (size_t)n, sizeof *order, cmp_span);
    int bad = -1;
    for (int i = 1; i < n && bad < 0; i++) {
        const mf_buffer *p = &s->buffers[order[i - 1].b], *q = &s->buffers[order[i].b];
        if (p->offset + mf_live_bytes(s, order[i - 1].b) > q->offset) {
            snprintf(msg, len, "persistent buffer '%s' (offset %lld) overlaps persistent buffer '%s' "
                     "(offset %lld, %lld bytes)", q->name, (long long)q->offset, p->name,
                     (long long)p->offset, (long long)mf_live_bytes(s, order[i - 1].b));
            bad = order[i].b;
        }
    }
    free(order);
    return bad;
}

/* The per-rank buffers of ragged buckets (core/mf_persist.h): each at rank
 * 0's offset, every rank's region within mem_persistent. -1 when sound. */
static int per_rank_check(const mf_schedule *s, char *msg, size_t len)
{
    if (!mf_persist_any_per_rank(s))
        return -1;
    int64_t *at = malloc(sizeof *at * (size_t)s->nbuffers);
    if (!at)
        return -2;
    mf_persist_layout(s, 0, at);
    int bad = -1;
    for (int b = 0; b < s->nbuffers && bad < 0; b++)
        if (mf_persist_per_rank(s, b) && s->buffers[b].offset != at[b]) {
            snprintf(msg, len, "buffer '%s': offset %lld is not %lld, its offset on rank 0 in the persistent region "
                     "(a ragged bucket's persistent buffers follow the shared ones, rank by rank)",
                     s->buffers[b].name, (long long)s->buffers[b].offset, (long long)at[b]);
            bad = b;
        }
    free(at);
    int64_t most = mf_persist_most(s);
    for (int b = 0; b < s->nbuffers && bad < 0 && most > s->mem_persistent; b++)
        if (mf_persist_per_rank(s, b)) {
            snprintf(msg, len, "the persistent region (%lld bytes) is smaller than the %lld bytes some rank's "
                     "per-rank buffers need ('%s' is one)", (long long)s->mem_persistent, (long long)most,
                     s->buffers[b].name);
            bad = b;
        }
    return bad;
}

int mf_arena_check(const mf_schedule *s, char *msg, size_t len)
{
    int pr = per_rank_check(s, msg, len);
    if (pr != -1)
        return pr;
    for (int b = 0; b < s->nbuffers; b++) {
        const mf_buffer *bf = &s->buffers[b];
        if (mf_persist_per_rank(s, b))
            continue; /* per_rank_check */
        bool pers = !mf_live_in_arena(bf);
        int64_t region = pers ? s->mem_persistent : s->mem_transient;
        int64_t bytes = mf_live_bytes(s, b);
        if (bf->offset % (s->align > 0 ? s->align : 1) != 0) {
            snprintf(msg, len, "buffer '%s': offset %lld is not a multiple of align %lld", bf->name,
                     (long long)bf->offset, (long long)s->align);
            return b;
        }
        if (bf->offset > region || bytes > region - bf->offset) {
            snprintf(msg, len, "buffer '%s': offset %lld + %lld bytes lies outside the %s (%lld bytes)",
                     bf->name, (long long)bf->offset, (long long)bytes,
                     pers ? "persistent region" : "transient arena", (long long)region);
            return b;
        }
    }
    /* Persistent buffers never share bytes. */
    int bad = persistent_disjoint(s, msg, len);
    if (bad != -1)
        return bad;
    int rc;
    mf_live lv;
    if (!mf_live_build(s, &lv))
        return -2;
    check_ctx c = {.s = s, .lv = &lv, .msg = msg, .len = len, .bad = -1};
    int w = mf_arena_walk(s, &lv, check_pair, &c, false);
    rc = w < 0 ? -2 : w == 0 ? c.bad : -1;
    mf_live_free(&lv);
    return rc;
}
