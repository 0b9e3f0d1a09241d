/*
 * mf_ckpt_share: a load's reads, once per replica group (see the header).
 */
#include "mf_ckpt_share.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_ckpt_plan.h"

/* Largest single transfer between replicas. */
#define MF_CKPT_SHARE_CHUNK ((size_t)256 << 20)

typedef struct mf_ckpt_lvec {
    mf_ckpt_lpiece *p;
    int64_t n, cap;
} mf_ckpt_lvec;

static int mf_ckpt_lvec_push(mf_ckpt_lvec *v, mf_ckpt_lpiece x)
{
    if (v->n == v->cap) {
        int64_t cap = v->cap ? v->cap * 2 : 64;
        mf_ckpt_lpiece *np = realloc(v->p, (size_t)cap * sizeof *np);
        if (!np)
            return -1;
        v->p = np;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

static int mf_ckpt_lpiece_cmp(const void *a, const void *b)
{
    const mf_ckpt_lpiece *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

void mf_ckpt_lplan_free(mf_ckpt_lplan *lp)
{
    free(lp->p);
    free(lp->mine);
    free(lp->all);
    free(lp->reps);
    memset(lp, 0, sizeof *lp);
}

/* The pieces of plan tensor k (runtime tensor `view`, held range [a, b))
 * that the replicas reps[0..n) read, sorted; they must tile [a, b). */
static int mf_ckpt_lplan_tensor(const mf_ckpt_plan *plan, int k, int view, int bucket, int64_t a, int64_t b,
                                const int64_t *reps, int64_t n, mf_ckpt_lvec *v, char *err, size_t errlen)
{
    int64_t first = v->n;
    for (int64_t i = 0; i < n; i++) {
        int64_t lo, hi;
        mf_ckpt_plan_pieces_of(plan, reps[i], k, &lo, &hi);
        for (int64_t q = lo; q < hi; q++)
            if (mf_ckpt_lvec_push(v, (mf_ckpt_lpiece){view, bucket, plan->p[q].start, plan->p[q].end, reps[i]}) != 0)
                return snprintf(err, errlen, "out of memory (load plan)"), -1;
    }
    qsort(v->p + first, (size_t)(v->n - first), sizeof *v->p, mf_ckpt_lpiece_cmp);
    int64_t at = a;
    for (int64_t q = first; q < v->n; q++) {
        if (v->p[q].start != at)
            break;
        at = v->p[q].end;
    }
    if (at != b)
        return snprintf(err, errlen, "internal error: the replicas' pieces of tensor '%s' do not tile its held "
                        "elements [%" PRId64 ", %" PRId64 ")", plan->t[k].name, a, b), -1;
    return 0;
}

int mf_ckpt_lplan_build(mf_rt *rt, int nstates, mf_ckpt_lplan *lp, char *err, size_t errlen)
{
    memset(lp, 0, sizeof *lp);
    lp->share = (rt->be->caps & MF_BE_SHARED_MEMORY) || rt->be->transfer;
    if (lp->share && (rt->be->caps & MF_BE_SHARED_MEMORY)) {
        lp->per = (size_t)rt->nviews * (size_t)(nstates + 1);
        lp->mine = calloc(lp->per ? lp->per : 1, sizeof *lp->mine);
        lp->all = calloc((lp->per ? lp->per : 1) * (size_t)rt->world, sizeof *lp->all);
        lp->reps = malloc((size_t)rt->world * sizeof *lp->reps);
        if (!lp->mine || !lp->all || !lp->reps) {
            mf_ckpt_lplan_free(lp);
            return snprintf(err, errlen, "out of memory (load buffer table)"), -1;
        }
    }
    mf_ckpt_lvec v = {0};
    mf_ckpt_plan plan;
    int have_plan = 0, rc = -1, last_bucket = -1;
    int64_t *reps = malloc((size_t)rt->world * sizeof *reps), nrep = 0;
    if (!reps) {
        snprintf(err, errlen, "out of memory (load plan)");
        goto done;
    }
    if (!lp->share) { /* every rank reads all it holds */
        for (int k = 0; k < rt->nviews; k++)
            if (rt->views[k].shard_count > 0 &&
                mf_ckpt_lvec_push(&v, (mf_ckpt_lpiece){k, -1, rt->views[k].shard_offset,
                                                       rt->views[k].shard_offset + rt->views[k].shard_count,
                                                       rt->rank}) != 0) {
                snprintf(err, errlen, "out of memory (load plan)");
                goto done;
            }
        rc = 0;
        goto done;
    }
    if (mf_ckpt_plan_build(rt->s, &plan, err, errlen) != 0)
        goto done;
    have_plan = 1;
    for (int k = 0; k < plan.ntensors; k++) {
        int view = mfsdp_tensor_find(rt, plan.t[k].name);
        if (view < 0) {
            snprintf(err, errlen, "internal error: plan tensor '%s' is not in the runtime", plan.t[k].name);
            goto done;
        }
        const mfsdp_tensor_view *tv = &rt->views[view];
        if (tv->shard_count == 0)
            continue;
        if (plan.t[k].bucket != last_bucket) {
            last_bucket = plan.t[k].bucket;
            nrep = mf_ckpt_plan_replicas(rt->s, last_bucket, rt->rank, reps);
        }
        if (mf_ckpt_lplan_tensor(&plan, k, view, last_bucket, tv->shard_offset, tv->shard_offset + tv->shard_count,
                                 reps, nrep, &v, err, errlen) != 0)
            goto done;
    }
    rc = 0;
done:
    if (have_plan)
        mf_ckpt_plan_free(&plan);
    free(reps);
    if (rc != 0) {
        free(v.p);
        mf_ckpt_lplan_free(lp);
    } else {
        lp->p = v.p;
        lp->n = v.n;
    }
    return rc;
}

/* Where piece q's elements of state s (0: main_weight, i + 1: requested
 * state i) live in this rank's buffers, and their element size. */
static char *mf_ckpt_lplan_at(mf_rt *rt, const mfsdp_ckpt_load_options *opt, const mf_ckpt_lpiece *q, int s,
                              size_t *es)
{
    const mfsdp_tensor_view *v = &rt->views[q->view];
    mfsdp_dtype d = s == 0 ? v->main_weight_dtype : opt->states[s - 1].dtype;
    char *base = s == 0 ? v->main_weight : opt->states[s - 1].shards[q->view];
    *es = mfsdp_dtype_size(d);
    return base + (size_t)(q->start - v->shard_offset) * *es;
}

/* Where one piece's state goes in the shard's other replicas' buffers
 * (shared memory): the reader's chunk callback copies into them. */
typedef struct mf_ckpt_push {
    mf_rt *rt;
    const mf_ckpt_lplan *lp;
    size_t col;             /* the piece's (view, state) column of lp->all */
    size_t at;              /* byte offset of the piece in a replica's buffer */
    int64_t nrep;           /* lp->reps[0..nrep): the replicas, this rank included */
} mf_ckpt_push;

static void mf_ckpt_push_chunk(void *ctx, size_t off, const void *data, size_t n)
{
    const mf_ckpt_push *p = ctx;
    const mf_ckpt_lplan *lp = p->lp;
    for (int64_t m = 0; m < p->nrep; m++)
        if (lp->reps[m] != p->rt->rank)
            memcpy((char *)lp->all[(size_t)lp->reps[m] * lp->per + p->col] + p->at + off, data, n);
}

mfsdp_result mf_ckpt_lplan_peers(mf_rt *rt, mf_ckpt_lplan *lp, const mfsdp_ckpt_load_options *opt, char *err,
                                 size_t errlen)
{
    if (!lp->share || !lp->all)
        return MFSDP_OK;
    for (int k = 0; k < rt->nviews; k++)
        for (int s = 0; s <= opt->nstates; s++)
            lp->mine[(size_t)k * (size_t)(opt->nstates + 1) + (size_t)s] =
                (uintptr_t)(s == 0 ? rt->views[k].main_weight : opt->states[s - 1].shards[k]);
    mfsdp_result res = rt->be->allgather(rt, lp->mine, lp->per * sizeof *lp->mine, lp->all, err, errlen);
    if (res != MFSDP_OK) {
        mf_rt_fail(rt, res, err); /* others may still read the tables: the runtime is finished */
        lp->mine = lp->all = NULL; /* left allocated rather than freed under a reader */
    }
    return res;
}

int mf_ckpt_lplan_read(mf_rt *rt, mf_ckpt_lplan *lp, mf_ckpt_reader *r, const mfsdp_ckpt_load_options *opt,
                       const int *map, const int *smap, char *err, size_t errlen)
{
    /* State by state, then in plan order: the order of the entries in the
     * data files, so that a load on the saving schedule reads each file
     * front to back in one sequential pass (tensor by tensor, the three
     * states' regions of a file would be three interleaved streams, which
     * defeats the kernel's readahead). */
    mf_ckpt_push push = {rt, lp, 0, 0, 0};
    int last_bucket = -1, rc = 0;
    for (int s = 0; s <= opt->nstates && rc == 0; s++)
        for (int64_t i = 0; i < lp->n && rc == 0; i++) {
            const mf_ckpt_lpiece *q = &lp->p[i];
            if (q->reader != rt->rank)
                continue;
            size_t es;
            char *dst = mf_ckpt_lplan_at(rt, opt, q, s, &es);
            if (lp->all) { /* shared memory: copy each chunk to the replicas while in cache */
                if (q->bucket != last_bucket) {
                    last_bucket = q->bucket;
                    push.nrep = mf_ckpt_plan_replicas(rt->s, q->bucket, rt->rank, lp->reps);
                }
                push.col = (size_t)q->view * (size_t)(opt->nstates + 1) + (size_t)s;
                push.at = (size_t)(q->start - rt->views[q->view].shard_offset) * es;
                r->chunk = mf_ckpt_push_chunk;
                r->chunk_ctx = &push;
            }
            rc = mf_ckpt_read(r, s == 0 ? 0 : smap[s - 1], map[q->view], q->start, q->end, dst, err, errlen);
        }
    r->chunk = NULL;
    r->chunk_ctx = NULL;
    return rc;
}

/* Appends the transfers of one piece's state: to every other replica when
 * this rank read it, else from its reader; in chunks of at most
 * MF_CKPT_SHARE_CHUNK, in the same order on both sides. */
static int mf_ckpt_share_piece(mf_rt *rt, const mf_ckpt_lpiece *q, char *at, size_t bytes, const int64_t *reps,
                               int64_t nrep, mf_be_xfer **x, int64_t *n, int64_t *cap)
{
    for (size_t off = 0; off < bytes; off += MF_CKPT_SHARE_CHUNK) {
        size_t len = bytes - off < MF_CKPT_SHARE_CHUNK ? bytes - off : MF_CKPT_SHARE_CHUNK;
        for (int64_t m = 0; m < (q->reader == rt->rank ? nrep : 1); m++) {
            int64_t peer = q->reader == rt->rank ? reps[m] : q->reader;
            if (peer == rt->rank)
                continue;
            if (*n == *cap) {
                int64_t c = *cap ? *cap * 2 : 64;
                mf_be_xfer *nx = realloc(*x, (size_t)c * sizeof *nx);
                if (!nx)
                    return -1;
                *x = nx;
                *cap = c;
            }
            (*x)[(*n)++] = (mf_be_xfer){peer, at + off, len, q->reader == rt->rank};
        }
    }
    return 0;
}

/* Message passing: the readers send, the other replicas receive, straight
 * between the runtimes' buffers (be->transfer). */
static mfsdp_result mf_ckpt_share_transfer(mf_rt *rt, const mf_ckpt_lplan *lp, const mfsdp_ckpt_load_options *opt,
                                           char *err, size_t errlen)
{
    mf_be_xfer *x = NULL;
    int64_t n = 0, cap = 0, nrep = 0;
    int last_bucket = -1;
    int64_t *reps = malloc((size_t)rt->world * sizeof *reps);
    mfsdp_result res = MFSDP_ERR_OUT_OF_MEMORY;
    if (!reps)
        goto oom;
    for (int64_t i = 0; i < lp->n; i++) {
        const mf_ckpt_lpiece *q = &lp->p[i];
        if (q->reader == rt->rank && q->bucket != last_bucket) {
            last_bucket = q->bucket;
            nrep = mf_ckpt_plan_replicas(rt->s, q->bucket, rt->rank, reps);
        }
        for (int s = 0; s <= opt->nstates; s++) {
            size_t es;
            char *at = mf_ckpt_lplan_at(rt, opt, q, s, &es);
            if (mf_ckpt_share_piece(rt, q, at, (size_t)(q->end - q->start) * es, reps, nrep, &x, &n, &cap) != 0)
                goto oom;
        }
    }
    free(reps);
    res = rt->be->transfer(rt, x, n, err, errlen);
    free(x);
    return res;
oom:
    free(reps);
    free(x);
    snprintf(err, errlen, "out of memory (load transfers)");
    return res;
}

mfsdp_result mf_ckpt_lplan_share(mf_rt *rt, const mf_ckpt_lplan *lp, const mfsdp_ckpt_load_options *opt, char *err,
                                 size_t errlen)
{
    if (!lp->share || (rt->be->caps & MF_BE_SHARED_MEMORY))
        return MFSDP_OK; /* nothing shared, or copied during the reads */
    mfsdp_result res = mf_ckpt_share_transfer(rt, lp, opt, err, errlen);
    if (res != MFSDP_OK && res != MFSDP_ERR_OUT_OF_MEMORY)
        mf_rt_fail(rt, res, err); /* a transfer may still be pending: the runtime is finished */
    return res;
}
