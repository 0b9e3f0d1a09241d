/*
 * mf_interfere: see the header.
 *
 * The graph: every segment is one or two arcs of the microbatch cycle [0, T)
 * (two when it wraps); two segments meet exactly when two of their arcs
 * overlap (the same relation as mf_live_overlap). A sweep over the arcs by
 * start lists each overlapping pair once per pair of arcs, and the live set at
 * each arc start; the heaviest of those is the peak instant, the seed.
 *
 * The search (Östergård, "A fast algorithm for the maximum clique problem",
 * 2002, weighted): vertices in order of weight, heaviest first; roots from the
 * last to the first; c[i] is the heaviest clique found within vertices i.. once
 * root i is done, so a candidate list starting at vertex j cannot add more
 * than c[j]. A branch is cut when the clique so far plus that, or plus the
 * candidates' total weight, cannot beat the incumbent.
 */
#include "mf_interfere.h"
#include "mf_int.h"

#include <stdlib.h>
#include <string.h>

void mf_interfere_free(mf_interfere *x)
{
    free(x->members);
    memset(x, 0, sizeof *x);
}

typedef struct cq {
    const int64_t *w;       /* by position (heaviest first) */
    const int *as, *adj;    /* neighbours by position, ascending */
    int64_t *c;
    int *cur, depth;
    int *best_set, nbest;
    int64_t best;
    int64_t work, budget;
    bool out, oom;
} cq;

static void rec(cq *q, const int *cand, int ncand, int64_t cw)
{
    if (cw > q->best) {
        q->best = cw;
        memcpy(q->best_set, q->cur, sizeof *q->cur * (size_t)q->depth);
        q->nbest = q->depth;
    }
    if (ncand == 0)
        return;
    q->work += 1 + ncand;
    if (q->work > q->budget) {
        q->out = true;
        return;
    }
    int64_t total = 0;
    for (int k = 0; k < ncand; k++)
        total += q->w[cand[k]];
    int *next = malloc(sizeof *next * (size_t)ncand);
    if (!next) {
        q->oom = true;
        return;
    }
    for (int k = 0; k < ncand && !q->out && !q->oom; k++) {
        int v = cand[k];
        /* c[] does not grow along the list: no later candidate does better */
        if (cw + total <= q->best || cw + q->c[v] <= q->best)
            break;
        total -= q->w[v];
        /* next = cand[k+1..] (all after v) that are neighbours of v */
        int e = q->as[v], end = q->as[v + 1], nn = 0;
        while (e < end && q->adj[e] <= v)
            e++;
        for (int i = k + 1; i < ncand && e < end;) {
            if (cand[i] == q->adj[e]) {
                next[nn++] = cand[i++];
                e++;
            } else if (cand[i] < q->adj[e]) {
                i++;
            } else {
                e++;
            }
        }
        q->work += (end - q->as[v]) + (ncand - k);
        q->cur[q->depth++] = v;
        rec(q, next, nn, cw + q->w[v]);
        q->depth--;
    }
    free(next);
}

typedef struct vkey {
    int64_t w;
    int v;
} vkey;

static int cmp_vkey(const void *x, const void *y)
{
    const vkey *a = x, *b = y;
    int c = mf_cmp_i64(b->w, a->w); /* heaviest first */
    return c ? c : mf_cmp_i64(a->v, b->v);
}

static int cmp_int(const void *x, const void *y)
{
    return mf_cmp_i64(*(const int *)x, *(const int *)y);
}

bool mf_interfere_clique(int n, const int64_t *w, const int *adj_start, const int *adj, const int *seed,
                         int nseed, int64_t budget, mf_interfere *out)
{
    memset(out, 0, sizeof *out);
    size_t sz = (size_t)n + 1, ne = (size_t)adj_start[n] + 1;
    vkey *key = malloc(sizeof *key * sz);
    int *pos = malloc(sizeof *pos * sz), *as = malloc(sizeof *as * sz), *padj = malloc(sizeof *padj * ne);
    int64_t *pw = malloc(sizeof *pw * sz);
    cq q = {.w = pw, .as = as, .adj = padj, .budget = budget};
    q.c = calloc(sz, sizeof *q.c);
    q.cur = malloc(sizeof *q.cur * sz);
    q.best_set = malloc(sizeof *q.best_set * sz);
    bool ok = false;
    if (!key || !pos || !as || !padj || !pw || !q.c || !q.cur || !q.best_set)
        goto done;
    for (int i = 0; i < n; i++)
        key[i] = (vkey){w[i], i};
    qsort(key, (size_t)n, sizeof *key, cmp_vkey);
    for (int p = 0; p < n; p++) {
        pos[key[p].v] = p;
        pw[p] = key[p].w;
    }
    as[0] = 0;
    for (int p = 0; p < n; p++) {
        int v = key[p].v, m = as[p];
        for (int e = adj_start[v]; e < adj_start[v + 1]; e++)
            padj[m++] = pos[adj[e]];
        qsort(padj + as[p], (size_t)(m - as[p]), sizeof *padj, cmp_int);
        as[p + 1] = m;
    }
    for (int k = 0; k < nseed; k++) {
        q.best += w[seed[k]];
        q.best_set[k] = pos[seed[k]];
    }
    q.nbest = nseed;
    for (int i = n - 1; i >= 0 && !q.out && !q.oom; i--) {
        int e = as[i];
        while (e < as[i + 1] && padj[e] <= i)
            e++;
        q.cur[0] = i;
        q.depth = 1;
        rec(&q, padj + e, as[i + 1] - e, pw[i]);
        q.c[i] = q.best;
    }
    if (q.oom)
        goto done;
    out->bytes = q.best;
    out->exact = !q.out;
    out->nmembers = q.nbest;
    out->members = malloc(sizeof *out->members * (size_t)(q.nbest + 1));
    if (!out->members)
        goto done;
    for (int k = 0; k < q.nbest; k++)
        out->members[k] = key[q.best_set[k]].v;
    qsort(out->members, (size_t)q.nbest, sizeof *out->members, cmp_int);
    ok = true;
done:
    if (!ok)
        mf_interfere_free(out);
    free(key);
    free(pos);
    free(as);
    free(padj);
    free(pw);
    free(q.c);
    free(q.cur);
    free(q.best_set);
    return ok;
}

/* ---- the graph of a schedule ---- */

typedef struct arc {
    int64_t lo, hi;
    int v;
} arc;

static int cmp_arc(const void *x, const void *y)
{
    const arc *a = x, *b = y;
    return mf_cmp_keys((const int64_t[]){a->lo, a->hi, a->v}, (const int64_t[]){b->lo, b->hi, b->v}, 3);
}

typedef struct pair {
    int a, b;               /* a < b */
} pair;

typedef struct graph {
    int n;
    int *buf;               /* vertex -> buffer */
    int64_t *w;
    arc *arcs;
    int narcs;
    pair *pairs;
    int npairs, cap;
    int *as, *adj;
    int *seed, nseed;
} graph;

static bool add_pair(graph *g, int a, int b)
{
    if (a == b)
        return true;
    if (g->npairs == g->cap) {
        int cap = g->cap ? 2 * g->cap : 256;
        pair *n = realloc(g->pairs, sizeof *n * (size_t)cap);
        if (!n)
            return false;
        g->pairs = n;
        g->cap = cap;
    }
    g->pairs[g->npairs++] = a < b ? (pair){a, b} : (pair){b, a};
    return true;
}

/* The overlapping pairs and the peak instant's set (the seed). */
static bool sweep(graph *g)
{
    int *active = malloc(sizeof *active * (size_t)(g->narcs + 1)), na = 0;
    bool ok = active != NULL;
    int64_t live = 0, peak = -1, tick = 0;
    for (int k = 0; ok && k < g->narcs;) {
        int64_t lo = g->arcs[k].lo;
        int m = 0;
        for (int i = 0; i < na; i++) {
            if (g->arcs[active[i]].hi >= lo)
                active[m++] = active[i];
            else
                live -= g->w[g->arcs[active[i]].v];
        }
        na = m;
        for (; ok && k < g->narcs && g->arcs[k].lo == lo; k++) {
            for (int i = 0; ok && i < na; i++)
                ok = add_pair(g, g->arcs[k].v, g->arcs[active[i]].v);
            active[na++] = k;
            live += g->w[g->arcs[k].v];
        }
        if (live > peak) {
            peak = live;
            tick = lo;
        }
    }
    g->seed = malloc(sizeof *g->seed * (size_t)(g->n + 1));
    ok = ok && g->seed;
    for (int k = 0; ok && k < g->narcs; k++)
        if (g->arcs[k].lo <= tick && tick <= g->arcs[k].hi)
            g->seed[g->nseed++] = g->arcs[k].v;
    if (ok) { /* a buffer's arcs never meet, but be sure: each buffer once */
        qsort(g->seed, (size_t)g->nseed, sizeof *g->seed, cmp_int);
        int m = 0;
        for (int i = 0; i < g->nseed; i++)
            if (m == 0 || g->seed[m - 1] != g->seed[i])
                g->seed[m++] = g->seed[i];
        g->nseed = m;
    }
    free(active);
    return ok;
}

/* Sorts the pairs by (a, b), a before b: a counting sort
 * by b, then a stable one by a (vertices are 0 .. n-1). False on OOM. */
static bool sort_pairs(graph *g)
{
    pair *tmp = malloc(sizeof *tmp * (size_t)g->npairs);
    int *at = malloc(sizeof *at * ((size_t)g->n + 1));
    bool ok = tmp && at;
    for (int pass = 0; ok && pass < 2; pass++) {
        const pair *from = pass == 0 ? g->pairs : tmp;
        pair *to = pass == 0 ? tmp : g->pairs;
        memset(at, 0, sizeof *at * ((size_t)g->n + 1));
        for (int i = 0; i < g->npairs; i++)
            at[(pass == 0 ? from[i].b : from[i].a) + 1]++;
        for (int v = 0; v < g->n; v++)
            at[v + 1] += at[v];
        for (int i = 0; i < g->npairs; i++)
            to[at[pass == 0 ? from[i].b : from[i].a]++] = from[i];
    }
    free(tmp);
    free(at);
    return ok;
}

static bool build(graph *g, const mf_schedule *s, const mf_live *lv)
{
    g->buf = malloc(sizeof *g->buf * (size_t)(s->nbuffers + 1));
    g->w = malloc(sizeof *g->w * (size_t)(s->nbuffers + 1));
    g->arcs = malloc(sizeof *g->arcs * (size_t)(2 * lv->nsegs + 1));
    bool ok = g->buf && g->w && g->arcs;
    for (int b = 0; ok && b < s->nbuffers; b++) {
        if (lv->buf_seg[b + 1] == lv->buf_seg[b])
            continue;
        g->buf[g->n] = b;
        g->w[g->n] = mf_live_bytes(s, b);
        for (int i = lv->buf_seg[b]; i < lv->buf_seg[b + 1]; i++) {
            const mf_live_seg *x = &lv->segs[i];
            g->arcs[g->narcs++] = (arc){x->start, x->end < lv->T ? x->end : lv->T - 1, g->n};
            if (x->end >= lv->T)
                g->arcs[g->narcs++] = (arc){0, x->end - lv->T, g->n};
        }
        g->n++;
    }
    if (ok) {
        qsort(g->arcs, (size_t)g->narcs, sizeof *g->arcs, cmp_arc);
        ok = sweep(g);
    }
    if (ok && g->npairs > 0)
        ok = sort_pairs(g);
    int m = 0;
    for (int i = 0; ok && i < g->npairs; i++)
        if (m == 0 || g->pairs[m - 1].a != g->pairs[i].a || g->pairs[m - 1].b != g->pairs[i].b)
            g->pairs[m++] = g->pairs[i];
    g->npairs = m;
    g->as = ok ? calloc((size_t)g->n + 2, sizeof *g->as) : NULL;
    g->adj = ok ? malloc(sizeof *g->adj * (size_t)(2 * m + 1)) : NULL;
    ok = ok && g->as && g->adj;
    for (int i = 0; ok && i < m; i++) {
        g->as[g->pairs[i].a + 2]++;
        g->as[g->pairs[i].b + 2]++;
    }
    for (int v = 0; ok && v < g->n; v++)
        g->as[v + 2] += g->as[v + 1];
    for (int i = 0; ok && i < m; i++) { /* as[v + 1] is v's fill pointer */
        g->adj[g->as[g->pairs[i].a + 1]++] = g->pairs[i].b;
        g->adj[g->as[g->pairs[i].b + 1]++] = g->pairs[i].a;
    }
    return ok;
}

bool mf_interfere_bound(const mf_schedule *s, const mf_live *lv, int64_t budget, mf_interfere *out)
{
    memset(out, 0, sizeof *out);
    graph g = {0};
    bool ok = build(&g, s, lv) && mf_interfere_clique(g.n, g.w, g.as, g.adj, g.seed, g.nseed, budget, out);
    for (int k = 0; ok && k < out->nmembers; k++)
        out->members[k] = g.buf[out->members[k]];
    free(g.buf);
    free(g.w);
    free(g.arcs);
    free(g.pairs);
    free(g.as);
    free(g.adj);
    free(g.seed);
    return ok;
}
