/*
 * mf_plan_tbound: a lower bound on the step time of a candidate that is laid
 * out and whose transitions are planned, before the lowering runs (the
 * search's most expensive step; docs/plan.md §3). With the buckets and
 * their steps known, every op the lowering will issue is known up to the
 * waits and records that connect them, and its duration is exactly
 * mf_cost_op of its step, the simulator's own function. The bound keeps a
 * subset of the simulator's constraints (planner/model/mf_simulate.c: an item
 * starts at the latest of its stream's last end, the compute stream's end
 * when its hook is issued (host-synchronous issue) and the end of the
 * record it waits for), so it never exceeds the simulated step time:
 *
 *   Chains. A transition's steps run one after another (a step on another
 *   stream than the one before waits for its record), so a chain ends at
 *   least the sum of its steps' durations after it can start.
 *
 *   Compute. The trainer's compute items run one at a time in hook order;
 *   t below is never later than the compute stream's end, so a hook issued
 *   when the compute reaches it is issued no earlier than t there.
 *   forward(u) waits for the gathers of the buckets whose first unit is u:
 *   T1 (first microbatch, after step_begin) and T2, issued at
 *   forward_pre(max(a - p, 0)) and, from the second microbatch on, waiting
 *   for the backward_post(a) record of the microbatch before. backward(u)
 *   waits for the re-gather of the buckets whose last unit is u that
 *   reshard (issued at backward_pre(min(z + p, U - 1))) and for the T3 of
 *   those buckets in the microbatch before (issued at backward_post(a),
 *   waiting for its record). (mf_lower.c; a bucket covers units a..z,
 *   p = prefetch.)
 *
 *   Streams (FIFO). A stream runs its ops one at a time in issue order.
 *   From the second microbatch on, take on stream s the T3 steps of the
 *   microbatch before of every bucket with a <= v, and the forward T2 steps
 *   of every bucket with a <= u: the T3s were issued at backward_post hooks
 *   before the T2s, each T3 starts no earlier than its bucket's
 *   backward_post(a) record plus the steps before its first step on s, so
 *   the first of them on s starts no earlier than the least such time, and
 *   the last of them on s, the last-issued T2 (issue hook, then bucket
 *   order), ends at least the sum of all their s-durations later; its
 *   chain's later steps follow. forward(u) waits for all these T2s (each
 *   directly or through the forward of its first unit, which comes no
 *   later). The drain: after the last backward, the step's end waits for
 *   every bucket's T3 and T4, and the same argument holds for the T3 and
 *   T4 steps on s of the buckets with a <= v.
 *
 * The search (mf_plan_search.c) calls it; what the bound reads of the search
 * comes in mf_plan_tbound_in, so this file knows nothing of the search.
 * tests/planner/test_plan_search.c checks it against the simulated step time
 * of every candidate of its random instances.
 */
#include <stdlib.h>

#include "mf_plan_tbound.h"

#include "mf_plan.h"

enum { NS = 2 }; /* communication streams: 0 inner, 1 outer */

/* Per bucket and transition: the chain's seconds, and per stream the
 * seconds on it, before its first step there and after its last. */
typedef struct tchain {
    double total, on[NS], pre[NS], post[NS];
    bool has[NS];
} tchain;

typedef struct tb_ctx {
    const mf_plan_tbound_in *in;
    const mf_schedule *s;
    tchain (*ch)[MF_NTRANSITIONS];
    tchain *ch12;           /* per bucket: T1 then T2 (the first microbatch's gather) */
    tchain *ch34;           /* per bucket: T3 then T4 (the last microbatch's reduction) */
    int U, nb, p;
    int *by_a, *a_start;    /* bucket ids by first unit (counting sort) */
    int *by_z, *z_start;    /* bucket ids by last unit */
    double *fs, *bs, *be, *be_prev;
    double *turn_pre, *turn_on; /* turn_terms: per unit x {T3, T3 + T4} x stream */
} tb_ctx;

static int stream_slot(const mf_plan_tbound_in *in, mf_stream st)
{
    if (st == MF_STREAM_INNER)
        return 0;
    if (st == MF_STREAM_OUTER)
        return in->sim->single_stream ? 0 : 1;
    return -1;
}

/* The transition's figures (mf_transition.c computes them with the cost
 * model the simulator uses) on the two communication streams; with
 * single_stream the outer stream's steps run on the inner one. */
static void chain_of(const mf_plan_tbound_in *in, const mf_transition *tr, tchain *c)
{
    *c = (tchain){.total = tr->nsteps > 0 ? tr->cost : 0};
    for (int st = MF_STREAM_INNER; tr->nsteps > 0 && st <= MF_STREAM_OUTER; st++) {
        int k = stream_slot(in, (mf_stream)st);
        if (!tr->has_on[st])
            continue;
        c->on[k] += tr->on[st];
        c->pre[k] = c->has[k] && c->pre[k] < tr->before[st] ? c->pre[k] : tr->before[st];
        c->post[k] = c->has[k] && c->post[k] < tr->after[st] ? c->post[k] : tr->after[st];
        c->has[k] = true;
    }
}

/* The chain of a's steps then b's. */
static tchain concat(const tchain *a, const tchain *b)
{
    tchain c;
    c.total = a->total + b->total;
    for (int k = 0; k < NS; k++) {
        c.has[k] = a->has[k] || b->has[k];
        c.on[k] = a->on[k] + b->on[k];
        c.pre[k] = a->has[k] ? a->pre[k] : a->total + b->pre[k];
        c.post[k] = b->has[k] ? b->post[k] : a->post[k] + b->total;
        if (!c.has[k])
            c.pre[k] = c.post[k] = 0;
    }
    return c;
}

/* ids[start[u] .. start[u + 1]): the buckets with key u, in id order. */
static void index_by(const mf_schedule *s, bool last, int *ids, int *start)
{
    int U = s->nunits;
    for (int u = 0; u <= U; u++)
        start[u] = 0;
    for (int b = 0; b < s->nbuckets; b++)
        start[(last ? s->buckets[b].last_unit : s->buckets[b].unit) + 1]++;
    for (int u = 0; u < U; u++)
        start[u + 1] += start[u];
    int *fill = start + U + 1; /* U + 1 more ints */
    for (int u = 0; u <= U; u++)
        fill[u] = start[u];
    for (int b = 0; b < s->nbuckets; b++)
        ids[fill[last ? s->buckets[b].last_unit : s->buckets[b].unit]++] = b;
}

static int fwd_hook(const tb_ctx *x, const mf_bucket *b)
{
    return b->unit - x->p < 0 ? 0 : b->unit - x->p;
}

/* Per unit v and stream k, over the buckets whose first unit is v: the
 * least time from their backward_post(v) record to the start of their
 * first step on k, and the seconds of their steps on k; once for the T3s
 * (a microbatch but the last), once for the T3s and T4s (the last).
 * pre < 0: no such step. */
static void turn_terms(tb_ctx *x)
{
    for (int v = 0; v < x->U; v++)
        for (int last = 0; last < 2; last++)
            for (int k = 0; k < NS; k++) {
                double pre = -1, on = 0;
                for (int i = x->a_start[v]; i < x->a_start[v + 1]; i++) {
                    int b = x->by_a[i];
                    const tchain *c = last ? &x->ch34[b] : &x->ch[b][MF_T3];
                    if (!c->has[k])
                        continue;
                    pre = pre < 0 || c->pre[k] < pre ? c->pre[k] : pre;
                    on += c->on[k];
                }
                size_t at = ((size_t)v * 2 + (size_t)last) * NS + (size_t)k;
                x->turn_pre[at] = pre;
                x->turn_on[at] = on;
            }
}

/* The FIFO bound on stream k after the backward whose backward_post
 * records are be[]: for every v, the least start of the T3 (and T4 when
 * `last`) steps on k of the buckets with a <= v plus all their seconds on
 * k; the largest over v in turn[k] (-1: no such step). */
static void turn_of(const tb_ctx *x, const double *be, bool last, double *turn)
{
    for (int k = 0; k < NS; k++) {
        double start = -1, sum = 0;
        turn[k] = -1;
        for (int v = 0; v < x->U; v++) {
            size_t at = ((size_t)v * 2 + (last ? 1 : 0)) * NS + (size_t)k;
            if (x->turn_pre[at] < 0)
                continue;
            double st = be[v] + x->turn_pre[at];
            start = start < 0 || st < start ? st : start;
            sum += x->turn_on[at];
            if (start + sum > turn[k])
                turn[k] = start + sum;
        }
    }
}

/* The forward of microbatch m, t the compute's end before it; fills x->fs. */
static double forward(tb_ctx *x, int m, double t)
{
    const mf_schedule *s = x->s;
    /* base[k]: the least start of the steps on k counted in sum[k]: the T3s
       of the microbatch before (turn_of), or in the first microbatch the
       gathers themselves */
    double base[NS] = {-1, -1}, sum[NS] = {0, 0}, post[NS] = {0, 0};
    int last_hook[NS] = {-1, -1}, last_b[NS] = {-1, -1};
    bool async = x->in->sim->host_async;
    if (m > 0)
        turn_of(x, x->be_prev, false, base);
    for (int u = 0; u < x->U; u++) {
        x->fs[u] = t;
        for (int i = x->a_start[u]; i < x->a_start[u + 1]; i++) {
            int b = x->by_a[i];
            const mf_bucket *bk = &s->buckets[b];
            /* the gather: T1 then T2 in the first microbatch (T1 after
               step_begin), T2 alone later */
            const tchain *c = m == 0 ? &x->ch12[b] : &x->ch[b][MF_T2];
            int h = fwd_hook(x, bk);
            double issue = async ? 0 : x->fs[h], ready = issue;
            if (m == 0)
                ready = issue + c->total;
            else if (c->total > 0)
                ready = (issue > x->be_prev[u] ? issue : x->be_prev[u]) + c->total;
            if (ready > t)
                t = ready;
            for (int k = 0; k < NS; k++) {
                if (!c->has[k])
                    continue;
                sum[k] += c->on[k];
                if (m == 0 && (base[k] < 0 || issue + c->pre[k] < base[k]))
                    base[k] = issue + c->pre[k];
                if (h > last_hook[k] || (h == last_hook[k] && b > last_b[k])) {
                    last_hook[k] = h;
                    last_b[k] = b;
                    post[k] = c->post[k];
                }
            }
        }
        for (int k = 0; k < NS; k++)
            if (base[k] >= 0 && last_b[k] >= 0 && base[k] + sum[k] + post[k] > t)
                t = base[k] + sum[k] + post[k];
        t += x->in->fwd[u];
    }
    return t;
}

/* The backward of microbatch m; fills x->bs and x->be. */
static double backward(tb_ctx *x, int m, double t)
{
    const mf_schedule *s = x->s;
    bool async = x->in->sim->host_async;
    for (int u = x->U - 1; u >= 0; u--) {
        x->bs[u] = t;
        for (int i = x->z_start[u]; i < x->z_start[u + 1]; i++) {
            int b = x->by_z[i];
            const mf_bucket *bk = &s->buckets[b];
            const tchain *t2 = &x->ch[b][MF_T2];
            if (s->units[bk->unit].reshard_after_forward && t2->total > 0) {
                int h = u + x->p > x->U - 1 ? x->U - 1 : u + x->p;
                double ready = (async ? 0 : x->bs[h]) + t2->total;
                if (ready > t)
                    t = ready;
                /* FIFO: the re-gather queues behind the T3s issued at
                   backward_post(a), a > h, of this microbatch */
                for (int k = 0; k < NS; k++) {
                    if (!t2->has[k])
                        continue;
                    double start = -1, sum = 0;
                    for (int a = h + 1; a < x->U; a++) {
                        size_t at = (size_t)a * 2 * NS + (size_t)k;
                        if (x->turn_pre[at] < 0)
                            continue;
                        double st = x->be[a] + x->turn_pre[at];
                        start = start < 0 || st < start ? st : start;
                        sum += x->turn_on[at];
                        if (start + sum + t2->on[k] + t2->post[k] > t)
                            t = start + sum + t2->on[k] + t2->post[k];
                    }
                }
            }
            if (m > 0 && x->be_prev[bk->unit] + x->ch[b][MF_T3].total > t)
                t = x->be_prev[bk->unit] + x->ch[b][MF_T3].total;
        }
        t += x->in->bwd[u];
        x->be[u] = t;
    }
    return t;
}

/* The bound for one prefetch depth (x prepared). */
static double bound_for(tb_ctx *x, int prefetch)
{
    const mf_schedule *s = x->s;
    x->p = prefetch;
    double t = 0;
    for (int m = 0; m < (int)s->microbatches; m++) {
        t = forward(x, m, t);
        t = backward(x, m, t);
        double *sw = x->be_prev;
        x->be_prev = x->be;
        x->be = sw;
    }
    /* the drain: be_prev holds the last microbatch's backward ends */
    double r = t;
    for (int b = 0; b < x->nb; b++) {
        double e = x->be_prev[s->buckets[b].unit] + x->ch[b][MF_T3].total + x->ch[b][MF_T4].total;
        r = e > r ? e : r;
    }
    double turn[NS];
    turn_of(x, x->be_prev, true, turn);
    for (int k = 0; k < NS; k++)
        if (turn[k] >= 0) {
            /* the last of these steps on k is the last-issued bucket's:
               the least first unit, the highest id there (T4 after T3);
               its chain's later steps follow it */
            double post = 0;
            bool found = false;
            for (int v = 0; v < x->U && !found; v++)
                for (int i = x->a_start[v]; i < x->a_start[v + 1]; i++) {
                    const tchain *c = &x->ch34[x->by_a[i]];
                    if (c->has[k]) {
                        post = c->post[k];
                        found = true;
                    }
                }
            r = turn[k] + post > r ? turn[k] + post : r;
        }
    return r * (1 - 1e-9);
}

int mf_plan_tbound_time_bounds(const mf_plan_tbound_in *in, const struct mf_plan *p, const int *prefetch, int n,
                               double *out)
{
    const mf_schedule *s = p->sched;
    for (int i = 0; i < n; i++)
        out[i] = 0;
    if (!in->fwd || !in->bwd || !p->trans)
        return 0;
    tb_ctx x = {.in = in, .s = s, .U = s->nunits, .nb = s->nbuckets};
    x.ch = malloc(sizeof *x.ch * ((size_t)x.nb + 1));
    x.ch12 = malloc(sizeof *x.ch12 * (2 * (size_t)x.nb + 1));
    x.ch34 = x.ch12 + x.nb;
    double *d = malloc(sizeof *d * ((4 + 4 * NS) * (size_t)x.U + 1));
    int *ix = malloc(sizeof *ix * (2 * (size_t)x.nb + 4 * (size_t)x.U + 4));
    int rc = -1;
    if (!x.ch || !x.ch12 || !d || !ix)
        goto done;
    x.by_a = ix;
    x.by_z = ix + x.nb;
    x.a_start = ix + 2 * x.nb;
    x.z_start = x.a_start + 2 * x.U + 2;
    index_by(s, false, x.by_a, x.a_start);
    index_by(s, true, x.by_z, x.z_start);
    x.fs = d;
    x.bs = d + x.U;
    x.be = d + 2 * x.U;
    x.be_prev = d + 3 * x.U;
    x.turn_pre = d + 4 * x.U;
    x.turn_on = x.turn_pre + 2 * NS * x.U;
    for (int b = 0; b < x.nb; b++)
        for (int t = 0; t < MF_NTRANSITIONS; t++)
            chain_of(in, &p->trans[b][t], &x.ch[b][t]);
    for (int b = 0; b < x.nb; b++) {
        x.ch12[b] = concat(&x.ch[b][MF_T1], &x.ch[b][MF_T2]);
        x.ch34[b] = concat(&x.ch[b][MF_T3], &x.ch[b][MF_T4]);
    }
    turn_terms(&x);
    /* the optimizer step the search adds is exact from the buckets already
       (monotone rounding keeps the sum below the figure's) */
    double opt_s = in->optimizer_seconds(in->ctx, s);
    for (int i = 0; i < n; i++)
        out[i] = bound_for(&x, prefetch[i]) + opt_s;
    rc = 0;
done:
    free(x.ch);
    free(x.ch12);
    free(d);
    free(ix);
    return rc;
}
