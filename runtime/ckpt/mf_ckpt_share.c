/*
 * mf_ckpt_share: a load's reads, once per replica group (see the header).
 */
#include "mf_ckpt_share.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_ckpt_global.h"
#include "mf_ckpt_plan.h"
#include "mf_ckpt_stage.h"

/* Largest single message between replicas: a reader sends each as soon as
 * it has read it, while it reads the next. */
#define MF_CKPT_SHARE_MSG ((size_t)4 << 20)

typedef struct mf_ckpt_lvec {
    mf_ckpt_lpiece *p;
    int64_t n, cap;
} mf_ckpt_lvec;

static int mf_ckpt_lvec_push(mf_rt *rt, mf_ckpt_lvec *v, mf_ckpt_lpiece x)
{
    mf_ckpt_global_map(rt, x.view, &x.run, &x.grow, &x.gbase, NULL);
    mf_ckpt_lpiece *np = mf_ckpt_plan_reserve(v->p, &v->cap, v->n, sizeof *np, 64);
    if (!np)
        return -1;
    v->p = np;
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
static int mf_ckpt_lplan_tensor(mf_rt *rt, const mf_ckpt_plan *plan, int k, int view, int bucket, int64_t a,
                                int64_t b, const int64_t *reps, int64_t n, mf_ckpt_lvec *v, char *err, size_t errlen)
{
    int64_t first = v->n;
    for (int64_t i = 0; i < n; i++) {
        int64_t lo, hi;
        mf_ckpt_plan_pieces_of(plan, reps[i], k, &lo, &hi);
        for (int64_t q = lo; q < hi; q++)
            if (mf_ckpt_lvec_push(rt, v, (mf_ckpt_lpiece){.view = view, .bucket = bucket, .start = plan->p[q].start,
                                                          .end = plan->p[q].end, .reader = reps[i]}) != 0)
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
    lp->share = !mf_ckpt_stage_active(rt) &&
                ((rt->be->caps & MF_BE_SHARED_MEMORY) || (rt->be->transfer_post && rt->be->transfer_wait));
    if (lp->share) {
        int shm = (rt->be->caps & MF_BE_SHARED_MEMORY) != 0;
        lp->per = (size_t)rt->nviews * (size_t)(nstates + 1);
        lp->mine = shm ? calloc(lp->per ? lp->per : 1, sizeof *lp->mine) : NULL;
        lp->all = shm ? calloc((lp->per ? lp->per : 1) * (size_t)rt->world, sizeof *lp->all) : NULL;
        lp->reps = malloc((size_t)rt->world * sizeof *lp->reps);
        if ((shm && (!lp->mine || !lp->all)) || !lp->reps) {
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
                mf_ckpt_lvec_push(rt, &v, (mf_ckpt_lpiece){.view = k, .bucket = -1, .start = rt->views[k].shard_offset,
                                                           .end = rt->views[k].shard_offset + rt->views[k].shard_count,
                                                           .reader = rt->rank}) != 0) {
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
        if (plan.t[k].coord >= 0 && plan.t[k].coord != mf_ckpt_plan_coord(rt->s, plan.t[k].bucket, rt->rank))
            continue; /* another coordinate's global tensor */
        int view = mfsdp_tensor_find(rt, plan.t[k].local);
        if (view < 0) {
            snprintf(err, errlen, "internal error: plan tensor '%s' is not in the runtime", plan.t[k].local);
            goto done;
        }
        const mfsdp_tensor_view *tv = &rt->views[view];
        if (tv->shard_count == 0)
            continue;
        if (plan.t[k].bucket != last_bucket) {
            last_bucket = plan.t[k].bucket;
            nrep = mf_ckpt_plan_replicas(rt->s, last_bucket, rt->rank, reps);
        }
        if (mf_ckpt_lplan_tensor(rt, &plan, k, view, last_bucket, tv->shard_offset, tv->shard_offset + tv->shard_count,
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
        mf_base_fail(rt, res, err); /* others may still read the tables: the runtime is finished */
        lp->mine = lp->all = NULL; /* left allocated rather than freed under a reader */
    }
    return res;
}

/* Message passing: the sends of one piece's state that its reader posts as
 * its bytes arrive (the reader's chunk callback), in messages of
 * MF_CKPT_SHARE_MSG bytes cut the same way on both sides. */
typedef struct mf_ckpt_send {
    mf_rt *rt;
    void **set;             /* the backend's transfer set */
    const int64_t *reps;    /* the replicas, this rank included */
    int64_t nrep;
    char *at;               /* the piece's state in this rank's buffer */
    size_t bytes, posted;   /* its size; bytes whose sends are posted */
    mfsdp_result res;       /* the first backend failure */
    char *err;
    size_t errlen;
} mf_ckpt_send;

/* Posts the sends of every message that lies inside [0, upto), then makes
 * progress on the earlier ones. */
static void mf_ckpt_send_upto(mf_ckpt_send *s, size_t upto)
{
    mf_be_xfer x[8];
    while (s->res == MFSDP_OK && s->posted < s->bytes) {
        size_t len = s->bytes - s->posted < MF_CKPT_SHARE_MSG ? s->bytes - s->posted : MF_CKPT_SHARE_MSG;
        if (s->posted + len > upto)
            break;
        int k = 0;
        for (int64_t m = 0; m < s->nrep && s->res == MFSDP_OK; m++) {
            if (s->reps[m] != s->rt->rank)
                x[k++] = (mf_be_xfer){s->reps[m], s->at + s->posted, len, 1};
            if (k == 8 || (k > 0 && m + 1 == s->nrep)) {
                s->res = s->rt->be->transfer_post(s->rt, s->set, x, k, s->err, s->errlen);
                k = 0;
            }
        }
        s->posted += len;
    }
    if (s->res == MFSDP_OK)
        s->res = s->rt->be->transfer_post(s->rt, s->set, NULL, 0, s->err, s->errlen);
}

static void mf_ckpt_send_chunk(void *ctx, size_t off, const void *data, size_t n)
{
    (void)data;
    mf_ckpt_send_upto(ctx, off + n);
}

/* Message passing: posts the receives of every piece state this rank gets
 * from another replica, in the order its reader sends them. */
static mfsdp_result mf_ckpt_post_recvs(mf_rt *rt, const mf_ckpt_lplan *lp, const mfsdp_ckpt_load_options *opt,
                                       void **set, char *err, size_t errlen)
{
    mfsdp_result res = MFSDP_OK;
    for (int s = 0; s <= opt->nstates; s++)
        for (int64_t i = 0; i < lp->n && res == MFSDP_OK; i++) {
            const mf_ckpt_lpiece *q = &lp->p[i];
            if (q->reader == rt->rank)
                continue;
            size_t es;
            char *at = mf_ckpt_lplan_at(rt, opt, q, s, &es);
            size_t bytes = (size_t)(q->end - q->start) * es;
            for (size_t off = 0; off < bytes && res == MFSDP_OK; off += MF_CKPT_SHARE_MSG) {
                mf_be_xfer x = {q->reader, at + off, bytes - off < MF_CKPT_SHARE_MSG ? bytes - off : MF_CKPT_SHARE_MSG,
                                0};
                res = rt->be->transfer_post(rt, set, &x, 1, err, errlen);
            }
        }
    return res;
}

/* Points the reader's chunk callback at piece q's state s: the copies into
 * the replicas' buffers (shared memory) or the sends to them (messages). */
static void mf_ckpt_lplan_route(mf_rt *rt, mf_ckpt_lplan *lp, const mfsdp_ckpt_load_options *opt,
                                const mf_ckpt_lpiece *q, int s, mf_ckpt_reader *r, mf_ckpt_push *push,
                                mf_ckpt_send *send, int *last_bucket)
{
    size_t es;
    char *dst = mf_ckpt_lplan_at(rt, opt, q, s, &es);
    if (q->bucket != *last_bucket) {
        *last_bucket = q->bucket;
        push->nrep = mf_ckpt_plan_replicas(rt->s, q->bucket, rt->rank, lp->reps);
    }
    if (lp->all) {
        push->col = (size_t)q->view * (size_t)(opt->nstates + 1) + (size_t)s;
        push->at = (size_t)(q->start - rt->views[q->view].shard_offset) * es;
        r->chunk = mf_ckpt_push_chunk;
        r->chunk_ctx = push;
    } else {
        send->reps = lp->reps;
        send->nrep = push->nrep;
        send->at = dst;
        send->bytes = (size_t)(q->end - q->start) * es;
        send->posted = 0;
        r->chunk = mf_ckpt_send_chunk;
        r->chunk_ctx = send;
    }
}

/* The reader's chunk callback for one run of a piece: the piece's own
 * callback, at the run's byte offset in the piece. */
typedef struct mf_ckpt_runcb {
    void (*chunk)(void *ctx, size_t off, const void *data, size_t n);
    void *ctx;
    size_t base;
} mf_ckpt_runcb;

static void mf_ckpt_run_chunk(void *ctx, size_t off, const void *data, size_t n)
{
    const mf_ckpt_runcb *c = ctx;
    c->chunk(c->ctx, c->base + off, data, n);
}

/* Reads piece q of checkpoint (state, tensor) into dst (es-byte elements):
 * one mf_ckpt_read per run of the checkpoint tensor it covers (one unless
 * it is a piece of a split global tensor spanning rows), the chunk
 * callback seeing offsets from the piece's first byte as for one read. */
static int mf_ckpt_lplan_runs(mf_ckpt_reader *r, int state, int tensor, const mf_ckpt_lpiece *q, char *dst,
                              size_t es, char *err, size_t errlen)
{
    mf_ckpt_runcb cb = {r->chunk, r->chunk_ctx, 0};
    int rc = 0;
    for (int64_t a = q->start; a < q->end && rc == 0;) {
        int64_t e = q->run > 0 ? (a / q->run + 1) * q->run : q->end;
        e = e < q->end ? e : q->end;
        int64_t g = q->run > 0 ? a / q->run * q->grow + q->gbase + a % q->run : a;
        cb.base = (size_t)(a - q->start) * es;
        if (cb.chunk && cb.base) {
            r->chunk = mf_ckpt_run_chunk;
            r->chunk_ctx = &cb;
        }
        rc = mf_ckpt_read(r, state, tensor, g, g + (e - a), r->nodst ? dst : dst + cb.base, err, errlen);
        r->chunk = cb.chunk;
        r->chunk_ctx = cb.ctx;
        a = e;
    }
    return rc;
}

mfsdp_result mf_ckpt_lplan_read(mf_rt *rt, mf_ckpt_lplan *lp, mf_ckpt_reader *r, const mfsdp_ckpt_load_options *opt,
                                const int *map, const int *smap, char *err, size_t errlen)
{
    /* State by state, then in plan order: the order of the entries in the
     * data files, so that a load on the saving schedule reads each file
     * front to back in one sequential pass (tensor by tensor, the three
     * states' regions of a file would be three interleaved streams, which
     * defeats the kernel's readahead). */
    void *set = NULL;
    int msg = lp->share && !lp->all, last_bucket = -1, rc = 0;
    char berr[512] = "";
    mf_ckpt_push push = {rt, lp, 0, 0, 0};
    mf_ckpt_send send = {.rt = rt, .set = &set, .res = MFSDP_OK, .err = berr, .errlen = sizeof berr};
    mf_ckpt_stage_dst stage = {.rt = rt, .res = MFSDP_OK};
    if (mf_ckpt_stage_active(rt)) { /* buffer memory only through the stage hook (no sharing then) */
        r->nodst = 1;
        r->chunk = mf_ckpt_stage_chunk;
        r->chunk_ctx = &stage;
    }
    if (msg) /* every receive first: a send never waits for its match to be posted */
        send.res = mf_ckpt_post_recvs(rt, lp, opt, &set, berr, sizeof berr);
    for (int s = 0; s <= opt->nstates && send.res == MFSDP_OK; s++)
        for (int64_t i = 0; i < lp->n && send.res == MFSDP_OK; i++) {
            const mf_ckpt_lpiece *q = &lp->p[i];
            if (q->reader != rt->rank)
                continue;
            size_t es;
            char *dst = mf_ckpt_lplan_at(rt, opt, q, s, &es);
            if (lp->share)
                mf_ckpt_lplan_route(rt, lp, opt, q, s, r, &push, &send, &last_bucket);
            stage.dst = dst;
            /* After a data error the reads stop, but a reader still posts
             * every send (of whatever its buffers hold), so that every
             * replica's receives complete; the agreement round that follows
             * fails the load on every rank. */
            if (rc == 0)
                rc = mf_ckpt_lplan_runs(r, s == 0 ? 0 : smap[s - 1], map[q->view], q, dst, es, err, errlen);
            if (rc == 0 && stage.res != MFSDP_OK) {
                snprintf(err, errlen, "copying host memory to buffer memory failed: %s", stage.err);
                rc = -1;
            }
            if (msg)
                mf_ckpt_send_upto(&send, send.bytes);
        }
    r->chunk = NULL;
    r->chunk_ctx = NULL;
    r->nodst = 0;
    mfsdp_result wr = msg ? rt->be->transfer_wait(rt, set, berr, sizeof berr) : MFSDP_OK;
    mfsdp_result br = send.res != MFSDP_OK ? send.res : wr;
    if (br != MFSDP_OK) { /* a transfer may still be pending: the runtime is finished */
        snprintf(err, errlen, "transfer between replicas failed: %s", berr);
        mf_base_fail(rt, br, err);
        return br;
    }
    return rc == 0 ? MFSDP_OK : MFSDP_ERR_LOAD;
}
