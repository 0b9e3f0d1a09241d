/*
 * mf_assign: see the header.
 *
 * Offsets: persistent buffers in buffer order; transient buffers greedily,
 * largest first (ties: earliest start, then index) or earliest first (ties:
 * largest), the smaller arena of the two, each at the lowest
 * aligned offset free of every placed buffer whose live interval overlaps its
 * own. Placed buffers are indexed by the hooks their segments cover, so a
 * buffer only meets the few buffers live near it: near-linear in buffers.
 *
 * Waits: mf_arena_walk lists the pairs (a, b) of segments of different
 * buffers where b takes over bytes a used. b's first writer w (an op, or the
 * trainer for grad_local) must come after a's last access x on each stream.
 * A replay of two steps in the trainer's hook order at every microbatch
 * position (M = 1; first, last; first, middle, last), with every op's real
 * predicate and vector clocks per stream, decides which pairs the schedule
 * already orders (in stream order, or through records and waits): at each
 * run of a writer in the second step, each last access of the buffer it takes
 * over must be ordered before it. For a pair that is not, a record after x
 * (an existing `every` record right after it on its stream is reused; for the
 * trainer, a compute record at the hook that closes its window) and a wait
 * right before w with w's predicate; the wait then runs in the replay, so
 * later pairs it implies add nothing.
 */
#include "mf_assign.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mf_arena_check.h"
#include "mf_interfere.h"
#include "mf_live.h"
#include "mf_int.h"
#include "mf_persist.h"

/* ---- offsets ---- */

/* Buffers outside the arena one after another: the shared ones in buffer
 * order, then the per-rank ones of ragged buckets, where rank 0's offsets
 * are written and mem_persistent is the largest region over the ranks
 * (core/mf_persist.h, which the verifier and the runtime read too). */
static void assign_persistent(mf_schedule *s)
{
    int64_t at = 0;
    for (int b = 0; b < s->nbuffers; b++)
        if (!mf_live_in_arena(&s->buffers[b]) && !mf_persist_per_rank(s, b)) {
            s->buffers[b].offset = at;
            at += mf_live_bytes(s, b);
        }
    /* rank 0's region, as mf_persist_layout lays it (shared end first) */
    at = mf_persist_shared_end(s);
    for (int b = 0; b < s->nbuffers; b++)
        if (mf_persist_per_rank(s, b)) {
            s->buffers[b].offset = at;
            int64_t a = s->align > 0 ? s->align : 1;
            at += (mf_persist_held(s, b, 0) * (int64_t)mf_dtype_size(s->buffers[b].dtype) + a - 1) / a * a;
        }
    s->mem_persistent = mf_persist_most(s);
}

typedef struct range {
    int64_t lo, hi;
} range;

/* Sorts ranges by lo (in place; no allocation, no callback: place_from
 * runs it for every buffer of every order tried). The order among equal lo
 * does not matter to place_from: it raises its offset to the largest hi of
 * the ranges it meets, in any order, and stops at the first range that
 * starts at or past its end, which holds for all ranges of one lo alike. */
static void sort_ranges(range *r, int n)
{
    while (n > 16) {
        /* median of three as the pivot, Hoare partition */
        int64_t a = r[0].lo, b = r[n / 2].lo, c = r[n - 1].lo;
        int64_t pv = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        int i = 0, j = n - 1;
        for (;;) {
            while (r[i].lo < pv)
                i++;
            while (r[j].lo > pv)
                j--;
            if (i >= j)
                break;
            range t = r[i];
            r[i++] = r[j];
            r[j--] = t;
        }
        /* recurse on the smaller part, loop on the larger */
        int left = j + 1;
        if (left < n - left) {
            sort_ranges(r, left);
            r += left;
            n -= left;
        } else {
            sort_ranges(r + left, n - left);
            n = left;
        }
    }
    for (int i = 1; i < n; i++) {
        range t = r[i];
        int j = i - 1;
        while (j >= 0 && r[j].lo > t.lo) {
            r[j + 1] = r[j];
            j--;
        }
        r[j + 1] = t;
    }
}

static int hook_of_tick(const mf_live *lv, int64_t t)
{
    int lo = 0, hi = lv->nhooks - 1;
    t %= lv->T;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (lv->hook_base[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Per hook, the buffers live there (a growable int list). */
typedef struct slots {
    int **list;
    int *len, *cap;
} slots;

static bool slot_push(slots *sl, int h, int b)
{
    if (sl->len[h] == sl->cap[h]) {
        int cap = sl->cap[h] ? 2 * sl->cap[h] : 4;
        int *n = realloc(sl->list[h], sizeof *n * (size_t)cap);
        if (!n)
            return false;
        sl->list[h] = n;
        sl->cap[h] = cap;
    }
    sl->list[h][sl->len[h]++] = b;
    return true;
}

/* For each hook the segments of buffer b cover: with place >= 0 adds place
 * to the hook's list; else collects the listed entries into cand (once each,
 * by stamp). False on OOM. */
static bool cover(const mf_live *lv, int b, slots *sl, int place, int *stamp, int mark, int *cand,
                  int *ncand)
{
    for (int g = lv->buf_seg[b]; g < lv->buf_seg[b + 1]; g++) {
        const mf_live_seg *x = &lv->segs[g];
        int h0 = hook_of_tick(lv, x->start), h1 = hook_of_tick(lv, x->end);
        int n = x->end >= lv->T ? lv->nhooks - h0 + h1 + 1 : h1 - h0 + 1;
        if (x->end - x->start >= lv->T - 1 || n > lv->nhooks)
            n = lv->nhooks;
        for (int k = 0; k < n; k++) {
            int h = (h0 + k) % lv->nhooks;
            if (place >= 0) {
                if (!slot_push(sl, h, place))
                    return false;
                continue;
            }
            for (int i = 0; i < sl->len[h]; i++) {
                int c = sl->list[h][i];
                if (stamp[c] != mark) {
                    stamp[c] = mark;
                    cand[(*ncand)++] = c;
                }
            }
        }
    }
    return true;
}

static bool buffers_meet(const mf_live *lv, int a, int b)
{
    for (int i = lv->buf_seg[a]; i < lv->buf_seg[a + 1]; i++)
        for (int k = lv->buf_seg[b]; k < lv->buf_seg[b + 1]; k++)
            if (mf_live_overlap(lv, &lv->segs[i], &lv->segs[k]))
                return true;
    return false;
}

/* The packing problem: n transient buffers (local index i, buffer buf[i])
 * and, per buffer, the others whose live intervals meet its own
 * (adj[adj_start[i] .. adj_start[i+1])). An order places each buffer at the
 * lowest offset free of its placed neighbours; every packing can be had from
 * some order this way, so the search is over orders. */
typedef struct pack {
    int n;
    int *buf;
    int64_t *bytes, *start, *weight; /* weight: own + neighbours' bytes */
    int *adj_start, *adj;
    int *order, *pos;       /* pos[i]: i's place in order */
    int64_t *off, *top;     /* top[k]: arena after placing order[0..k] */
    range *rg;
    uint64_t *keys;         /* lowest_fit's sort keys */
    int *mark;              /* stamp << 2 | MOVED | SHIFTED in this try (place_from) */
    int stamp;
    int64_t work;           /* neighbour visits so far (the search budget) */
} pack;

static void pack_free(pack *p)
{
    free(p->buf);
    free(p->bytes);
    free(p->start);
    free(p->weight);
    free(p->adj_start);
    free(p->adj);
    free(p->order);
    free(p->pos);
    free(p->off);
    free(p->top);
    free(p->rg);
    free(p->keys);
    free(p->mark);
}

/* Collects the transient buffers that have segments and their neighbours.
 * Buffers never accessed get offset 0 (they share anything). */
static bool pack_build(pack *p, mf_schedule *s, const mf_live *lv)
{
    size_t nb = (size_t)s->nbuffers + 1;
    int *loc = malloc(sizeof *loc * nb), *stamp = malloc(sizeof *stamp * nb);
    int *cand = malloc(sizeof *cand * nb);
    slots sl = {calloc((size_t)lv->nhooks, sizeof(int *)), calloc((size_t)lv->nhooks, sizeof(int)),
                calloc((size_t)lv->nhooks, sizeof(int))};
    p->buf = malloc(sizeof *p->buf * nb);
    p->bytes = malloc(sizeof *p->bytes * nb);
    p->start = malloc(sizeof *p->start * nb);
    p->weight = malloc(sizeof *p->weight * nb);
    p->adj_start = calloc(nb + 1, sizeof *p->adj_start);
    p->order = malloc(sizeof *p->order * nb);
    p->pos = malloc(sizeof *p->pos * nb);
    p->off = calloc(nb, sizeof *p->off); /* read before placed (place_from) */
    p->top = malloc(sizeof *p->top * nb);
    p->rg = malloc(sizeof *p->rg * nb);
    p->keys = malloc(sizeof *p->keys * nb);
    p->mark = calloc(nb, sizeof *p->mark);
    bool ok = false;
    int nadj = 0, cap = 0;
    if (!loc || !stamp || !cand || !sl.list || !sl.len || !sl.cap || !p->buf || !p->bytes || !p->start ||
        !p->weight || !p->adj_start || !p->order || !p->pos || !p->off || !p->top || !p->rg || !p->keys ||
        !p->mark)
        goto done;
    for (int b = 0; b < s->nbuffers; b++) {
        stamp[b] = -1;
        loc[b] = -1;
        if (lv->buf_seg[b + 1] > lv->buf_seg[b]) {
            loc[b] = p->n;
            p->buf[p->n] = b;
            p->bytes[p->n] = mf_live_bytes(s, b);
            p->start[p->n++] = lv->segs[lv->buf_seg[b]].start;
            if (!cover(lv, b, &sl, b, NULL, 0, NULL, NULL))
                goto done;
        } else if (mf_live_in_arena(&s->buffers[b])) {
            s->buffers[b].offset = 0;
        }
    }
    for (int i = 0; i < p->n; i++) {
        int b = p->buf[i], ncand = 0;
        if (!cover(lv, b, &sl, -1, stamp, b, cand, &ncand))
            goto done;
        p->weight[i] = p->bytes[i];
        for (int k = 0; k < ncand; k++) {
            if (cand[k] == b || !buffers_meet(lv, b, cand[k]))
                continue;
            if (nadj == cap) {
                cap = cap ? 2 * cap : 256;
                int *n = realloc(p->adj, sizeof *n * (size_t)cap);
                if (!n)
                    goto done;
                p->adj = n;
            }
            p->adj[nadj++] = loc[cand[k]];
            p->weight[i] += p->bytes[loc[cand[k]]];
        }
        p->adj_start[i + 1] = nadj;
    }
    ok = true;
done:
    for (int h = 0; sl.list && h < lv->nhooks; h++)
        free(sl.list[h]);
    free(sl.list);
    free(sl.len);
    free(sl.cap);
    free(loc);
    free(stamp);
    free(cand);
    return ok;
}

/* The lowest offset at >= 0 with [at, at + bytes) free of the n ranges:
 * the ranges in order of start, at raised to the end of each that meets
 * [at, at + bytes), until one starts at or past at + bytes. The order is a
 * sort of keys start << KEY_SHIFT | index (one 8-byte value each) when every
 * start and the count fit; else sort_ranges. Equal starts may come in
 * either order (sort_ranges), so both give the same offset. keys: room for
 * n entries. */
#define KEY_SHIFT 20
static int64_t lowest_fit(range *rg, uint64_t *keys, int n, int64_t bytes)
{
    int64_t at = 0;
    uint64_t big = 0;
    for (int r = 0; r < n; r++)
        big |= (uint64_t)rg[r].lo;
    if (n >= (1 << KEY_SHIFT) || big >> (63 - KEY_SHIFT)) {
        sort_ranges(rg, n);
        for (int r = 0; r < n && rg[r].lo < at + bytes; r++)
            if (rg[r].hi > at)
                at = rg[r].hi;
        return at;
    }
    for (int r = 0; r < n; r++) {
        uint64_t k = (uint64_t)rg[r].lo << KEY_SHIFT | (uint64_t)r;
        int j = r - 1;
        while (j >= 0 && keys[j] > k) {
            keys[j + 1] = keys[j];
            j--;
        }
        keys[j + 1] = k;
    }
    for (int r = 0; r < n && (int64_t)(keys[r] >> KEY_SHIFT) < at + bytes; r++) {
        int64_t hi = rg[keys[r] & ((1u << KEY_SHIFT) - 1)].hi;
        if (hi > at)
            at = hi;
    }
    return at;
}

/* Places order[k0..n) (order[0..k0) stay where they are); returns the arena.
 * Once the arena exceeds `limit` it stops placing (the caller rejects the
 * order then, and restores what it saved) and returns a value above limit;
 * the work budget still counts every remaining buffer as placed, so the
 * search takes the same steps as with every buffer placed.
 *
 * With hi >= k0 (the search's tries), off[] holds the placement of an order
 * that differs from this one only in positions k0..hi, and the caller has
 * marked MOVED (mark >> 2 == stamp) the buffers whose order relative to
 * others changed. A buffer's fit depends only on the set of its neighbours
 * placed before it and their offsets, so it is its old offset, kept without
 * the sort, unless the buffer is MOVED, or a neighbour placed before it was
 * SHIFTED (placed at another offset in this try), or, at or before hi, a
 * neighbour is MOVED (it may have been before it and now be after, or the
 * reverse); past hi the neighbours before a buffer are the old set. When no
 * buffer has SHIFTED by hi, the rest is the old placement: its work is
 * counted and the old arena returned. Same offsets, arena and work count as
 * a full placement. hi = -1: every buffer is placed. */
#define MOVED 1
#define SHIFTED 2
static int64_t place_from(pack *p, int k0, int hi, int64_t limit)
{
    int64_t top = k0 > 0 ? p->top[k0 - 1] : 0;
    int stamp = p->stamp, shifted = 0;
    for (int k = k0; k < p->n; k++) {
        if (top > limit || (k == hi + 1 && hi >= 0 && !shifted)) {
            for (int r = k; r < p->n; r++)
                p->work += p->adj_start[p->order[r] + 1] - p->adj_start[p->order[r]] + 1;
            return top > limit ? top : p->top[p->n - 1];
        }
        int i = p->order[k], nr = 0, mi = p->mark[i], e0 = p->adj_start[i], e1 = p->adj_start[i + 1];
        int dirty = hi < 0 || mi >> 2 == stamp; /* only MOVED is set before i is placed */
        int near = k <= hi;
        for (int e = e0; e < e1 && !dirty; e++) {
            int j = p->adj[e], m = p->mark[j];
            dirty = (m >> 2 == stamp) & ((near & m & MOVED) | ((p->pos[j] < k) & (m >> 1) & 1));
        }
        p->work += e1 - e0 + 1;
        int64_t at = p->off[i];
        if (dirty) {
            for (int e = e0; e < e1; e++) {
                int j = p->adj[e];
                /* written always, kept when j is placed (no branch to mispredict) */
                p->rg[nr] = (range){p->off[j], p->off[j] + p->bytes[j]};
                nr += p->pos[j] < k;
            }
            at = lowest_fit(p->rg, p->keys, nr, p->bytes[i]);
            if (at != p->off[i]) {
                p->mark[i] = stamp << 2 | (mi >> 2 == stamp ? mi & MOVED : 0) | SHIFTED;
                shifted = 1;
            }
            p->off[i] = at;
        }
        if (at + p->bytes[i] > top)
            top = at + p->bytes[i];
        p->top[k] = top;
    }
    return top;
}

/* Greedy orders: largest first, earliest first, most crowded first (own
 * bytes plus the bytes of every buffer it meets); ties by the other keys. */
typedef struct order_key {
    int64_t k1, k2;
    int i;
} order_key;

static int cmp_key(const void *x, const void *y)
{
    const order_key *a = x, *b = y;
    return mf_cmp_keys((const int64_t[]){a->k1, a->k2, a->i}, (const int64_t[]){b->k1, b->k2, b->i}, 3);
}

static void set_order(pack *p, const int *order)
{
    memcpy(p->order, order, sizeof *order * (size_t)p->n);
    for (int k = 0; k < p->n; k++)
        p->pos[p->order[k]] = k;
}

/* The search budget: neighbour visits and orders tried. Small schedules get
 * the full search (a few ms); on the 100k-tensor benchmarks the budget ends it
 * after a few orders (docs/performance.md). */
#define MF_ASSIGN_WORK (1 << 22)
#define MF_ASSIGN_TRIES 4000

/* Hill climbing over orders from the best greedy one: move or swap two
 * random entries (a fixed-seed xorshift: the output is deterministic),
 * re-placing from the first changed position (only the buffers whose fit
 * can change are refitted, place_from); keep the change when the arena does
 * not grow; stop at the live-bytes bound or
 * when the budget is spent. best/best_order hold the smallest arena seen. */
static void search(pack *p, int64_t bound, int64_t *best, int64_t *best_off, int *best_order,
                   int *save_order, int64_t *save_off, int64_t *save_top)
{
    uint64_t x = 0x9e3779b97f4a7c15u;
    int64_t cur = *best;
    set_order(p, best_order);
    place_from(p, 0, -1, INT64_MAX);
    for (int t = 0; t < MF_ASSIGN_TRIES && p->n > 1 && cur > bound && p->work < MF_ASSIGN_WORK; t++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int i = (int)(x % (uint64_t)p->n), j = (int)((x >> 32) % (uint64_t)p->n);
        if (i == j)
            continue;
        int lo = i < j ? i : j, hi = i < j ? j : i, len = p->n - lo;
        memcpy(save_order, p->order + lo, sizeof *save_order * (size_t)len);
        for (int k = lo; k < p->n; k++) {
            save_off[k] = p->off[p->order[k]];
            save_top[k] = p->top[k];
        }
        /* the buffers whose order relative to others changes */
        p->stamp = t + 1;
        if (x & (1u << 20)) { /* swap */
            p->mark[p->order[i]] = p->mark[p->order[j]] = p->stamp << 2 | MOVED;
            int tmp = p->order[i];
            p->order[i] = p->order[j];
            p->order[j] = tmp;
        } else {              /* move order[i] to j */
            int v = p->order[i];
            p->mark[v] = p->stamp << 2 | MOVED;
            if (i < j)
                memmove(p->order + i, p->order + i + 1, sizeof *p->order * (size_t)(j - i));
            else
                memmove(p->order + j + 1, p->order + j, sizeof *p->order * (size_t)(i - j));
            p->order[j] = v;
        }
        for (int k = lo; k <= hi; k++)
            p->pos[p->order[k]] = k;
        int64_t v = place_from(p, lo, hi, cur);
        if (v <= cur) {
            cur = v;
            if (v < *best) {
                *best = v;
                for (int k = 0; k < p->n; k++)
                    best_off[k] = p->off[k];
            }
            continue;
        }
        memcpy(p->order + lo, save_order, sizeof *save_order * (size_t)len);
        for (int k = lo; k < p->n; k++) {
            p->pos[p->order[k]] = k;
            p->off[p->order[k]] = save_off[k];
            p->top[k] = save_top[k];
        }
    }
}

/* Offsets of the transient buffers: the smallest arena of the greedy orders
 * and the search from the best of them (docs/semantics.md §10). */
static bool assign_transient(mf_schedule *s, const mf_live *lv, int64_t bound)
{
    pack p = {0};
    bool ok = pack_build(&p, s, lv);
    size_t n = (size_t)p.n + 1;
    order_key *keys = malloc(sizeof *keys * n);
    int *ord = malloc(sizeof *ord * n), *best_order = malloc(sizeof *best_order * n);
    int *save_order = malloc(sizeof *save_order * n);
    int64_t *best_off = malloc(sizeof *best_off * n), *save_off = malloc(sizeof *save_off * n);
    int64_t *save_top = malloc(sizeof *save_top * n);
    int64_t best = -1;
    ok = ok && keys && ord && best_order && save_order && best_off && save_off && save_top;
    for (int by = 0; ok && by < 3; by++) {
        for (int i = 0; i < p.n; i++) {
            int64_t size = -p.bytes[i], start = p.start[i], crowd = -p.weight[i];
            keys[i] = by == 0   ? (order_key){size, start, i}
                      : by == 1 ? (order_key){start, size, i}
                                : (order_key){crowd, size, i};
        }
        qsort(keys, (size_t)p.n, sizeof *keys, cmp_key);
        for (int i = 0; i < p.n; i++)
            ord[i] = keys[i].i;
        set_order(&p, ord);
        int64_t v = place_from(&p, 0, -1, INT64_MAX);
        if (best < 0 || v < best) {
            best = v;
            memcpy(best_order, ord, sizeof *ord * (size_t)p.n);
            memcpy(best_off, p.off, sizeof *best_off * (size_t)p.n);
        }
    }
    if (ok && p.n > 0 && best > bound)
        search(&p, bound, &best, best_off, best_order, save_order, save_off, save_top);
    if (ok) {
        for (int i = 0; i < p.n; i++)
            s->buffers[p.buf[i]].offset = best_off[i];
        s->mem_transient = best > 0 ? best : 0;
    }
    pack_free(&p);
    free(keys);
    free(ord);
    free(best_order);
    free(save_order);
    free(best_off);
    free(save_off);
    free(save_top);
    return ok;
}

/* ---- the pairs that hand memory over ---- */

typedef struct edge {
    int a, b;               /* segments: a's last accesses before b's writer */
} edge;

typedef struct edge_vec {
    edge *e;
    int n, cap;
} edge_vec;

/* The array `arr` of n used elements of `size` bytes, with room for one more:
 * doubled (64 at first) when all *cap are used. NULL when out of memory (arr
 * is then still valid). */
static void *room_for_one(void *arr, int n, int *cap, size_t size)
{
    if (n < *cap)
        return arr;
    int grown = *cap ? 2 * *cap : 64;
    void *p = realloc(arr, size * (size_t)grown);
    if (p)
        *cap = grown;
    return p;
}

static bool collect_edge(void *ctx, int a, int b)
{
    edge_vec *v = ((void **)ctx)[0];
    const mf_live *lv = ((void **)ctx)[1];
    if (lv->segs[a].buffer == lv->segs[b].buffer || lv->segs[b].writer < -1)
        return true;
    if (v->n > 0 && v->e[v->n - 1].a == a && v->e[v->n - 1].b == b)
        return true; /* the same pair at the next byte range */
    edge *e = room_for_one(v->e, v->n, &v->cap, sizeof *e);
    if (!e)
        return false;
    v->e = e;
    v->e[v->n++] = (edge){a, b};
    return true;
}

/* Sorts the edges by (b, a) (segments 0 .. nsegs-1): a counting sort by a,
 * then a stable one by b. False on OOM. */
static bool sort_edges(edge_vec *v, int nsegs)
{
    edge *tmp = malloc(sizeof *tmp * (size_t)v->n);
    int *at = malloc(sizeof *at * ((size_t)nsegs + 1));
    bool ok = tmp && at;
    for (int pass = 0; ok && pass < 2; pass++) {
        const edge *from = pass == 0 ? v->e : tmp;
        edge *to = pass == 0 ? tmp : v->e;
        memset(at, 0, sizeof *at * ((size_t)nsegs + 1));
        for (int i = 0; i < v->n; i++)
            at[(pass == 0 ? from[i].a : from[i].b) + 1]++;
        for (int g = 0; g < nsegs; g++)
            at[g + 1] += at[g];
        for (int i = 0; i < v->n; i++)
            to[at[pass == 0 ? from[i].a : from[i].b]++] = from[i];
    }
    free(tmp);
    free(at);
    return ok;
}

/* ---- the waits ---- */

typedef struct insert {
    int next;               /* the next wait added for the same writer, -1 */
    int anchor;             /* op id; -1: append at the end */
    int after;              /* 0 before the anchor, 1 after */
    int seq;
    mf_op op;
} insert;

typedef struct vc {
    int64_t c[MF_STREAM_COUNT];
} vc;

typedef struct order_ctx {
    mf_schedule *s;
    const mf_live *lv;
    int *hstart, *hops;     /* ops of hook h: hops[hstart[h] .. hstart[h+1]) */
    edge *edges;
    int nedges;
    int *wstart;            /* edges of writer key k: [wstart[k], wstart[k+1]) in wedge */
    int *wedge;
    vc *opstamp, *tickstamp, *ev;
    bool *ev_set;
    int nev, evcap;
    int *rec_after;         /* op -> event of a record added right after it, -1 */
    mf_when *rec_after_when; /* its predicate */
    int *rec_tick;          /* hook -> event of the record closing its window */
    int *whead;             /* writer key -> its first added wait (index in ins), -1 */
    insert *ins;
    int nins, inscap;
    vc now[MF_STREAM_COUNT];
    mf_assign_stats st;
} order_ctx;

static int hook_unit(const mf_schedule *s, int h)
{
    int U = s->nunits;
    if (h == 0 || h >= 4 * U + 1)
        return -1;
    if (h <= 2 * U)
        return (h - 1) / 2;
    return U - 1 - (h - 2 * U - 1) / 2;
}

static bool step_hook(const mf_op *op)
{
    return op->phase == MF_PHASE_STEP_BEGIN || op->phase == MF_PHASE_STEP_END;
}

static mf_op *add_insert(order_ctx *c, int anchor, int after, int hook, mf_stream st, mf_opkind kind,
                         mf_when when, int event)
{
    insert *grown = room_for_one(c->ins, c->nins, &c->inscap, sizeof *grown);
    if (!grown)
        return NULL;
    c->ins = grown;
    insert *in = &c->ins[c->nins];
    in->next = -1;
    in->anchor = anchor;
    in->after = after;
    in->seq = c->nins++;
    mf_op *op = &in->op;
    memset(op, 0, sizeof *op);
    op->phase = mf_live_hook_phase(c->s, hook);
    op->unit = hook_unit(c->s, hook);
    op->when = when;
    op->stream = st;
    op->kind = kind;
    op->bucket = op->axis = op->src = op->dst = -1;
    op->dtype = MF_FP32;
    op->event = event;
    return op;
}

static int new_event(order_ctx *c)
{
    if (c->nev == c->evcap) {
        int cap = 2 * c->evcap + 16;
        vc *e = realloc(c->ev, sizeof *e * (size_t)cap);
        if (!e)
            return -1;
        c->ev = e;
        bool *f = realloc(c->ev_set, sizeof *f * (size_t)cap);
        if (!f)
            return -1;
        c->ev_set = f;
        c->evcap = cap;
    }
    c->ev_set[c->nev] = false;
    return c->nev++;
}

/* The event of a record that follows access x (op, or -2 = the trainer's
 * window of hook xh) on stream st, issued before op `limit`; added when none
 * exists. -1 on OOM. */
static int record_after(order_ctx *c, int x, int xh, mf_stream st, int limit, mf_when when)
{
    const mf_schedule *s = c->s;
    int h = x == -2 ? (xh + 1) % c->lv->nhooks : xh;
    int *memo = x == -2 ? &c->rec_tick[xh] : &c->rec_after[x];
    if (*memo >= 0 && (x == -2 || c->rec_after_when[x] == when))
        return *memo;
    bool seen = x == -2;
    for (int i = c->hstart[h]; i < c->hstart[h + 1]; i++) {
        const mf_op *op = &s->ops[c->hops[i]];
        if (!seen) {
            seen = c->hops[i] == x;
            continue;
        }
        if (op->stream != st)
            continue;
        if (op->kind == MF_OP_RECORD && op->when == when && c->hops[i] < limit) {
            if (x >= 0 && *memo >= 0)
                return op->event;
            if (x >= 0)
                c->rec_after_when[x] = when;
            return *memo = op->event;
        }
        break;
    }
    int e = new_event(c);
    if (e < 0)
        return -1;
    int first = c->hstart[h] < c->hstart[h + 1] ? c->hops[c->hstart[h]] : -1;
    if (!add_insert(c, x == -2 ? first : x, x == -2 ? 0 : 1, h, st, MF_OP_RECORD, when, e))
        return -1;
    c->st.records_added++;
    if (x >= 0 && *memo >= 0)
        return e; /* keep the first memo; this record serves this predicate */
    if (x >= 0)
        c->rec_after_when[x] = when;
    return *memo = e;
}

static void vc_max(vc *a, const vc *b)
{
    for (int k = 0; k < MF_STREAM_COUNT; k++)
        if (b->c[k] > a->c[k])
            a->c[k] = b->c[k];
}

static bool holds(mf_when w, bool first, bool last)
{
    return mf_when_holds(w, (first ? MF_POS_FIRST : 0) | (last ? MF_POS_LAST : 0));
}

/* Applies the waits already added before writer key k (from an earlier
 * instance of it), as the runtime would run them. */
static void run_added(order_ctx *c, int k, mf_stream sw, bool first, bool last)
{
    for (int j = c->whead[k]; j >= 0; j = c->ins[j].next)
        if (holds(c->ins[j].op.when, first, last) && c->ev_set[c->ins[j].op.event])
            vc_max(&c->now[sw], &c->ev[c->ins[j].op.event]);
}

/* The pairs whose writer is key k (an op id, or nops + hook for the
 * trainer), writing on stream sw with predicate `when`, anchored for a new
 * wait at (anchor, after): a wait for each last access the clocks do not
 * already order before the writer. */
typedef struct cand {
    int x, st, hook;
    vc r;                   /* what a record right after x captures */
    int64_t weight;
} cand;

static int cmp_cand(const void *p, const void *q)
{
    const cand *a = p, *b = q;
    return mf_cmp_i64(b->weight, a->weight); /* largest first */
}

static bool order_writer(order_ctx *c, int k, mf_stream sw, mf_when when, int anchor, int after, int hook)
{
    int n = c->wstart[k + 1] - c->wstart[k], nc = 0;
    if (n == 0)
        return true;
    cand *cs = malloc(sizeof *cs * (size_t)n * MF_STREAM_COUNT);
    if (!cs)
        return false;
    /* The last accesses not yet ordered before the writer. */
    for (int i = c->wstart[k]; i < c->wstart[k + 1]; i++) {
        const mf_live_seg *a = &c->lv->segs[c->edges[c->wedge[i]].a];

        for (int st = 0; st < MF_STREAM_COUNT; st++) {
            int x = a->last[st];
            if (x == -1 || st == (int)sw)
                continue;
            const vc *stamp = x == -2 ? &c->tickstamp[a->last_hook[st]] : &c->opstamp[x];
            if (stamp->c[st] == 0 || stamp->c[st] <= c->now[sw].c[st])
                continue; /* never ran yet, or ordered */
            cand *cd = &cs[nc++];
            *cd = (cand){.x = x, .st = st, .hook = a->last_hook[st], .r = *stamp};
            for (int j = 0; j < MF_STREAM_COUNT; j++)
                cd->weight += stamp->c[j];
        }
    }
    /* Greedy cover: a wait whose record captures more goes first; an access
     * the waits kept so far already order needs none. */
    qsort(cs, (size_t)nc, sizeof *cs, cmp_cand);
    vc have = c->now[sw];
    bool ok = true;
    for (int i = 0; i < nc && ok; i++) {
        int x = cs[i].x, st = cs[i].st;
        if (cs[i].r.c[st] <= have.c[st])
            continue;
        int rh = x == -2 ? (cs[i].hook + 1) % c->lv->nhooks : cs[i].hook;
        int e = record_after(c, x, cs[i].hook, (mf_stream)st, rh == hook && !after ? anchor : INT_MAX,
                             MF_WHEN_EVERY);
        if (e < 0) {
            ok = false;
            break;
        }
        if (!c->ev_set[e]) {
            c->ev[e] = cs[i].r;
            c->ev_set[e] = true;
        }
        bool dup = false;
        for (int j = c->whead[k]; j >= 0 && !dup; j = c->ins[j].next)
            dup = c->ins[j].op.event == e;
        if (!dup) {
            if (!add_insert(c, anchor, after, hook, sw, MF_OP_WAIT, when, e)) {
                ok = false;
                break;
            }
            c->ins[c->nins - 1].next = c->whead[k];
            c->whead[k] = c->nins - 1;
            c->st.waits_added++;
        }
        vc_max(&have, &c->ev[e]);
    }
    c->now[sw] = have;
    free(cs);
    return ok;
}

/* One hook at microbatch position (first, last); pairs are checked when
 * `check` (the second step, once every access has run at least once). */
static bool run_hook(order_ctx *c, int h, bool first, bool last, bool check)
{
    mf_schedule *s = c->s;
    for (int i = c->hstart[h]; i < c->hstart[h + 1]; i++) {
        int id = c->hops[i];
        const mf_op *op = &s->ops[id];
        if (!step_hook(op) && !holds(op->when, first, last))
            continue;
        vc *now = &c->now[op->stream];
        run_added(c, id, op->stream, first, last);
        if (check && !order_writer(c, id, op->stream, op->when, id, 0, h))
            return false;
        if (op->kind == MF_OP_WAIT && op->event >= 0 && c->ev_set[op->event])
            vc_max(now, &c->ev[op->event]);
        now->c[op->stream]++;
        c->opstamp[id] = *now;
        if (op->kind == MF_OP_RECORD && op->event >= 0) {
            c->ev[op->event] = *now;
            c->ev_set[op->event] = true;
        }
        if (c->rec_after[id] >= 0) {
            c->ev[c->rec_after[id]] = *now;
            c->ev_set[c->rec_after[id]] = true;
        }
    }
    int key = s->nops + h, last_op = c->hstart[h] < c->hstart[h + 1] ? c->hops[c->hstart[h + 1] - 1] : -1;
    run_added(c, key, MF_STREAM_COMPUTE, first, last);
    if (check && !order_writer(c, key, MF_STREAM_COMPUTE, MF_WHEN_EVERY, last_op, 1, h))
        return false;
    vc *now = &c->now[MF_STREAM_COMPUTE];
    now->c[MF_STREAM_COMPUTE]++;
    c->tickstamp[h] = *now;
    if (c->rec_tick[h] >= 0) {
        c->ev[c->rec_tick[h]] = *now;
        c->ev_set[c->rec_tick[h]] = true;
    }
    return true;
}

/* Two steps in the trainer's hook order at every microbatch position (M = 1;
 * first, last; first, middle, last), like the verifier; pairs are decided in
 * the second. */
static bool replay(order_ctx *c)
{
    const mf_schedule *s = c->s;
    int nmb = s->microbatches >= 3 ? 3 : (int)s->microbatches, U = s->nunits;
    for (int step = 0; step < 2; step++) {
        bool chk = step == 1;
        if (!run_hook(c, mf_live_hook(s, MF_PHASE_STEP_BEGIN, -1), true, false, chk))
            return false;
        for (int m = 0; m < nmb; m++) {
            bool first = m == 0, last = m == nmb - 1;
            for (int u = 0; u < U; u++)
                for (int p = MF_PHASE_FORWARD_PRE; p <= MF_PHASE_FORWARD_POST; p++)
                    if (!run_hook(c, mf_live_hook(s, (mf_phase)p, u), first, last, chk))
                        return false;
            for (int u = U - 1; u >= 0; u--)
                for (int p = MF_PHASE_BACKWARD_PRE; p <= MF_PHASE_BACKWARD_POST; p++)
                    if (!run_hook(c, mf_live_hook(s, (mf_phase)p, u), first, last, chk))
                        return false;
        }
        if (!run_hook(c, mf_live_hook(s, MF_PHASE_STEP_END, -1), false, true, chk))
            return false;
    }
    return true;
}

static int cmp_insert(const void *x, const void *y)
{
    const insert *a = x, *b = y;
    if (a->anchor != b->anchor)
        return a->anchor < b->anchor ? -1 : 1;
    if (a->after != b->after)
        return a->after - b->after;
    if (a->op.kind != b->op.kind) /* records before waits at one place */
        return a->op.kind == MF_OP_RECORD ? -1 : 1;
    return a->seq - b->seq;
}

/* Merges the inserts into the op array and renumbers. */
static bool rebuild(order_ctx *c)
{
    mf_schedule *s = c->s;
    if (c->nins == 0)
        return true;
    qsort(c->ins, (size_t)c->nins, sizeof *c->ins, cmp_insert);
    int total = s->nops + c->nins;
    mf_op *ops = mf_arena_array(s->arena, (size_t)total, sizeof *ops);
    if (!ops)
        return false;
    int n = 0, k = 0;
    while (k < c->nins && c->ins[k].anchor < 0)
        k++;
    int tail = k;
    for (int i = 0; i < s->nops; i++) {
        while (k < c->nins && c->ins[k].anchor == i && !c->ins[k].after)
            ops[n++] = c->ins[k++].op;
        ops[n++] = s->ops[i];
        while (k < c->nins && c->ins[k].anchor == i)
            ops[n++] = c->ins[k++].op;
    }
    for (int j = 0; j < tail; j++)
        ops[n++] = c->ins[j].op;
    for (int i = 0; i < n; i++)
        ops[i].id = i;
    s->ops = ops;
    s->nops = n;
    return true;
}

static bool index_ops(order_ctx *c)
{
    const mf_schedule *s = c->s;
    const mf_live *lv = c->lv;
    int nk = s->nops + lv->nhooks;
    c->hstart = calloc((size_t)lv->nhooks + 1, sizeof *c->hstart);
    c->hops = malloc(sizeof *c->hops * (size_t)(s->nops + 1));
    c->wstart = calloc((size_t)nk + 1, sizeof *c->wstart);
    c->wedge = malloc(sizeof *c->wedge * (size_t)(c->nedges + 1));
    c->opstamp = calloc((size_t)s->nops + 1, sizeof *c->opstamp);
    c->tickstamp = calloc((size_t)lv->nhooks, sizeof *c->tickstamp);
    c->rec_after = malloc(sizeof *c->rec_after * (size_t)(s->nops + 1));
    c->rec_after_when = malloc(sizeof *c->rec_after_when * (size_t)(s->nops + 1));
    c->rec_tick = malloc(sizeof *c->rec_tick * (size_t)lv->nhooks);
    c->whead = malloc(sizeof *c->whead * (size_t)(nk + 1));
    if (!c->whead)
        return false;
    for (int k = 0; k <= nk; k++)
        c->whead[k] = -1;
    if (!c->hstart || !c->hops || !c->wstart || !c->wedge || !c->opstamp || !c->tickstamp ||
        !c->rec_after || !c->rec_after_when || !c->rec_tick)
        return false;
    for (int i = 0; i < s->nops; i++) {
        if (lv->op_hook[i] >= 0) /* outside the step: no hook of the cycle */
            c->hstart[lv->op_hook[i] + 1]++;
        c->rec_after[i] = -1;
    }
    for (int h = 0; h < lv->nhooks; h++) {
        c->hstart[h + 1] += c->hstart[h];
        c->rec_tick[h] = -1;
    }
    int *fill = malloc(sizeof *fill * (size_t)(nk + 1));
    if (!fill)
        return false;
    memcpy(fill, c->hstart, sizeof *fill * (size_t)lv->nhooks);
    for (int i = 0; i < s->nops; i++)
        if (lv->op_hook[i] >= 0)
            c->hops[fill[lv->op_hook[i]]++] = i;
    for (int i = 0; i < c->nedges; i++) {
        const mf_live_seg *b = &lv->segs[c->edges[i].b];
        c->wstart[(b->writer >= 0 ? b->writer : s->nops + b->writer_hook) + 1]++;
    }
    for (int k = 0; k < nk; k++)
        c->wstart[k + 1] += c->wstart[k];
    memcpy(fill, c->wstart, sizeof *fill * (size_t)nk);
    for (int i = 0; i < c->nedges; i++) {
        const mf_live_seg *b = &lv->segs[c->edges[i].b];
        c->wedge[fill[b->writer >= 0 ? b->writer : s->nops + b->writer_hook]++] = i;
    }
    free(fill);
    return true;
}

static bool add_waits(mf_schedule *s, const mf_live *lv, mf_assign_stats *stats)
{
    edge_vec v = {0};
    void *wctx[2] = {&v, (void *)lv};
    if (mf_arena_walk(s, lv, collect_edge, wctx, true) < 0) {
        free(v.e);
        return false;
    }
    if (v.n > 0 && !sort_edges(&v, lv->nsegs)) {
        free(v.e);
        return false;
    }
    int m = 0;
    for (int i = 0; i < v.n; i++)
        if (m == 0 || v.e[m - 1].a != v.e[i].a || v.e[m - 1].b != v.e[i].b)
            v.e[m++] = v.e[i];
    order_ctx c = {.s = s, .lv = lv, .edges = v.e, .nedges = m};
    c.nev = c.evcap = s->nevents;
    c.ev = calloc((size_t)s->nevents + 1, sizeof *c.ev);
    c.ev_set = calloc((size_t)s->nevents + 1, sizeof *c.ev_set);
    bool ok = c.ev && c.ev_set && index_ops(&c) && replay(&c) && rebuild(&c);
    if (ok) {
        s->nevents = c.nev;
        if (stats)
            *stats = c.st;
    }
    free(c.hstart);
    free(c.hops);
    free(c.wstart);
    free(c.wedge);
    free(c.opstamp);
    free(c.tickstamp);
    free(c.ev);
    free(c.ev_set);
    free(c.rec_after);
    free(c.rec_after_when);
    free(c.rec_tick);
    free(c.whead);
    free(c.ins);
    free(v.e);
    return ok;
}

bool mf_assign_run_live(mf_schedule *s, const mf_live *lv, int64_t live, int64_t interference,
                        mf_assign_stats *stats)
{
    if (stats)
        memset(stats, 0, sizeof *stats);
    assign_persistent(s);
    /* The added records and waits touch no buffer: the bounds stand. The
     * order search stops at the interference bound (>= the live-bytes
     * bound): no arena with one offset per buffer is smaller. */
    if (live < 0)
        live = mf_live_lower_bound(s, lv);
    mf_interfere x = {.bytes = interference};
    bool ok = live >= 0 && (interference >= 0 || mf_interfere_bound(s, lv, MF_INTERFERE_WORK, &x)) &&
              assign_transient(s, lv, x.bytes > live ? x.bytes : live) && add_waits(s, lv, stats);
    if (ok) {
        s->summary.live_bytes = live;
        s->summary.interference_bytes = x.bytes;
        s->summary.allocated_bytes = s->mem_persistent + s->mem_transient;
    }
    mf_interfere_free(&x);
    return ok;
}

bool mf_assign_run(mf_schedule *s, mf_assign_stats *stats)
{
    mf_live lv;
    if (!mf_live_build(s, &lv))
        return false;
    bool ok = mf_assign_run_live(s, &lv, -1, -1, stats);
    mf_live_free(&lv);
    return ok;
}

int64_t mf_assign_persistent_bytes(const mf_schedule *s)
{
    int64_t at = 0;
    for (int b = 0; b < s->nbuffers; b++)
        if (!mf_live_in_arena(&s->buffers[b]) && !mf_persist_per_rank(s, b))
            at += mf_live_bytes(s, b);
    if (!mf_persist_any_per_rank(s))
        return at;
    int64_t most = 0;
    for (int64_t r = 0; r < s->mesh.world; r++) {
        int64_t n = at;
        for (int b = 0; b < s->nbuffers; b++)
            if (mf_persist_per_rank(s, b)) {
                int64_t a = s->align > 0 ? s->align : 1;
                int64_t bytes = mf_persist_held(s, b, r) * (int64_t)mf_dtype_size(s->buffers[b].dtype);
                n += (bytes + a - 1) / a * a;
            }
        most = n > most ? n : most;
    }
    return most;
}
