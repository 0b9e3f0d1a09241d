/*
 * mf_check: see the header. The oracle reads the schedule's bucket layouts
 * (internal headers) and the runtime's buffers (padding included); it drives
 * the runtime only through the public hooks and views.
 */
#include "mf_check.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mf_rt.h"

#define LR (1.0f / 16.0f)

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* k/256 with |k| <= 254: exact in bf16, fp16 and fp32. */
static double grad_value(int64_t step, int64_t rank, int64_t m, int bucket, int64_t e)
{
    uint64_t h = mix(mix(mix(mix((uint64_t)step * 1000003u + (uint64_t)bucket) ^ (uint64_t)rank) ^
                         (uint64_t)m) ^
                     (uint64_t)e);
    return (double)((int64_t)(h % 509) - 254) / 256.0;
}

static float init_value(int bucket, int64_t e)
{
    uint64_t h = mix(((uint64_t)bucket << 40) ^ (uint64_t)e);
    return (float)((double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static double dtype_eps(mf_dtype d)
{
    switch (d) {
    case MF_BF16:
        return 1.0 / 256.0;
    case MF_FP16:
        return 1.0 / 2048.0;
    default:
        return 1.0 / 16777216.0;
    }
}

typedef struct bucket_state {
    int unsharded, local, mw, delivered;   /* buffer ids */
    mf_range orange;                       /* this rank's main_weight range */
    int64_t L;
    uint8_t *mask;                         /* L: 1 where a tensor element lives */
    float *full_mw;                        /* L: every rank's main_weight assembled */
    uint8_t *filled;                       /* L: assembly scratch */
    double eps;                            /* of the least precise gradient dtype */
} bucket_state;

/* What every rank sends after a step (fixed size). */
typedef struct report {
    int32_t status;                        /* 0 ok, 1 oracle mismatch, 2 runtime error, 3 stopped */
    int32_t result;
    int64_t collectives[MFSDP_MAX_AXES], bytes[MFSDP_MAX_AXES];
    int64_t busy_ns[MFSDP_NUM_STREAMS];
    char msg[480];
} report;

typedef struct rank_ctx {
    const mf_schedule *s;
    mfsdp_runtime *rt;
    int64_t rank, world;
    bucket_state *bs;
    int64_t step;
    bool bad;                              /* an oracle mismatch was recorded */
    char first[480];
} rank_ctx;

static void mismatch(rank_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mismatch(rank_ctx *c, const char *fmt, ...)
{
    if (c->bad)
        return;
    c->bad = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->first, sizeof c->first, fmt, ap);
    va_end(ap);
}

size_t mf_check_xchg_bytes(const mfsdp_schedule *sh)
{
    const mf_schedule *s = sh->s;
    size_t n = 0;
    for (int i = 0; i < s->nbuffers; i++)
        if (s->buffers[i].kind == MF_BUF_MAIN_WEIGHT)
            n += (size_t)s->buffers[i].count * sizeof(float);
    return n > sizeof(report) ? n : sizeof(report);
}

static void free_state(rank_ctx *c)
{
    if (!c->bs)
        return;
    for (int b = 0; b < c->s->nbuckets; b++) {
        free(c->bs[b].mask);
        free(c->bs[b].full_mw);
        free(c->bs[b].filled);
    }
    free(c->bs);
    c->bs = NULL;
}

static bool init_state(rank_ctx *c)
{
    const mf_schedule *s = c->s;
    c->bs = calloc((size_t)(s->nbuckets ? s->nbuckets : 1), sizeof *c->bs);
    if (!c->bs)
        return false;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        bucket_state *st = &c->bs[b];
        st->unsharded = st->local = st->mw = st->delivered = -1;
        int grad = -1, final = -1;
        mf_dtype least = MF_FP32;
        for (int i = 0; i < s->nbuffers; i++) {
            const mf_buffer *bf = &s->buffers[i];
            if (bf->bucket != b)
                continue;
            if (mf_bufkind_role(bf->kind) == MF_ROLE_GRAD && dtype_eps(bf->dtype) > dtype_eps(least))
                least = bf->dtype;
            switch (bf->kind) {
            case MF_BUF_WEIGHT_FULL: st->unsharded = i; break;
            case MF_BUF_WEIGHT: if (st->unsharded < 0) st->unsharded = i; break;
            case MF_BUF_GRAD_LOCAL: st->local = i; break;
            case MF_BUF_MAIN_WEIGHT: st->mw = i; break;
            case MF_BUF_GRAD: grad = i; break;
            case MF_BUF_GRAD_FINAL: final = i; break;
            default: break;
            }
        }
        for (int i = 0; i < s->nbuffers; i++)   /* weight_full wins over weight */
            if (s->buffers[i].bucket == b && s->buffers[i].kind == MF_BUF_WEIGHT_FULL)
                st->unsharded = i;
        st->delivered = final >= 0 ? final : grad;
        st->eps = dtype_eps(least);
        st->L = bk->length;
        st->orange = mf_layout_range(&s->mesh, &bk->place[MF_ROLE_MAIN_WEIGHT], c->rank, bk->length);
        st->mask = calloc((size_t)(st->L ? st->L : 1), 1);
        st->full_mw = calloc((size_t)(st->L ? st->L : 1), sizeof(float));
        st->filled = calloc((size_t)(st->L ? st->L : 1), 1);
        if (!st->mask || !st->full_mw || !st->filled)
            return false;
        for (int t = 0; t < bk->ntensors; t++)
            memset(st->mask + bk->tensors[t].offset, 1, (size_t)bk->tensors[t].numel);
    }
    return true;
}

/* The views must point where the buffers say (the public API's contract). */
static void check_views(rank_ctx *c)
{
    const mf_schedule *s = c->s;
    int n = mfsdp_num_tensors(c->rt);
    for (int k = 0; k < n; k++) {
        mfsdp_tensor_view v;
        if (mfsdp_tensor_view_get(c->rt, k, &v) != MFSDP_OK) {
            mismatch(c, "rank %lld: mfsdp_tensor_view_get(%d) failed", (long long)c->rank, k);
            return;
        }
        const mf_rt_tensor *rt_t = &c->rt->sh->tensors[k];
        const mf_bucket *bk = &s->buckets[rt_t->bucket];
        const mf_tensor *t = &bk->tensors[rt_t->index];
        const bucket_state *st = &c->bs[rt_t->bucket];
        size_t ws = mf_dtype_size(s->buffers[st->unsharded].dtype);
        bool ok = v.numel == t->numel &&
                  v.weight == (char *)mf_rt_buffer(c->rt, st->unsharded) + (size_t)t->offset * ws &&
                  mfsdp_tensor_find(c->rt, v.name) == k;
        int64_t lo = t->offset > st->orange.offset ? t->offset : st->orange.offset;
        int64_t hi = t->offset + t->numel < st->orange.offset + st->orange.len
                         ? t->offset + t->numel
                         : st->orange.offset + st->orange.len;
        ok = ok && v.shard_count == (hi > lo ? hi - lo : 0);
        if (ok && v.shard_count > 0)
            ok = v.shard_offset == lo - t->offset &&
                 v.main_weight == (char *)mf_rt_buffer(c->rt, st->mw) +
                                      (size_t)(lo - st->orange.offset) * sizeof(float);
        if (!ok) {
            mismatch(c, "rank %lld: the view of tensor %s does not match its bucket layout",
                     (long long)c->rank, t->name);
            return;
        }
    }
}

static void init_main_weight(rank_ctx *c)
{
    const mf_schedule *s = c->s;
    for (int b = 0; b < s->nbuckets; b++) {
        bucket_state *st = &c->bs[b];
        mf_dtype d = s->buffers[st->mw].dtype;
        void *mw = mf_rt_buffer(c->rt, st->mw);
        for (int64_t i = 0; i < st->orange.len; i++) {
            int64_t e = st->orange.offset + i;
            mf_cpu_store(mw, d, i, st->mask[e] ? init_value(b, e) : 0.0f);
        }
    }
}

/* Exchanges main_weight shards and assembles every bucket's full copy. */
static bool assemble(rank_ctx *c, const mf_check_xchg *x)
{
    const mf_schedule *s = c->s;
    size_t per_rank = 0;
    for (int b = 0; b < s->nbuckets; b++)
        per_rank += (size_t)s->buffers[c->bs[b].mw].count * sizeof(float);
    float *mine = malloc(per_rank ? per_rank : 1);
    if (!mine)
        return false;
    size_t at = 0;
    for (int b = 0; b < s->nbuckets; b++) {
        const bucket_state *st = &c->bs[b];
        int64_t n = s->buffers[st->mw].count;
        mf_cpu_convert(mine + at, MF_FP32, mf_rt_buffer(c->rt, st->mw), s->buffers[st->mw].dtype, n);
        at += (size_t)n;
    }
    const float *all = x->allgather(x->ctx, c->rank, mine, per_rank);
    free(mine);
    if (!all)
        return false;
    at = 0;
    for (int b = 0; b < s->nbuckets; b++) {
        bucket_state *st = &c->bs[b];
        const mf_bucket *bk = &s->buckets[b];
        int64_t n = s->buffers[st->mw].count;
        memset(st->filled, 0, (size_t)st->L);
        for (int64_t r = 0; r < c->world; r++) {
            const float *shard = all + (size_t)r * (per_rank / sizeof(float)) + at;
            mf_range rr = mf_layout_range(&s->mesh, &bk->place[MF_ROLE_MAIN_WEIGHT], r, bk->length);
            for (int64_t i = 0; i < rr.len; i++) {
                int64_t e = rr.offset + i;
                if (!st->filled[e]) {
                    st->full_mw[e] = shard[i];
                    st->filled[e] = 1;
                } else if (memcmp(&st->full_mw[e], &shard[i], sizeof(float)) != 0) {
                    mismatch(c, "step %lld: main_weight replicas of bucket %s differ at element %lld: "
                             "%.9g on a lower rank, %.9g on rank %lld",
                             (long long)c->step, bk->name, (long long)e, (double)st->full_mw[e],
                             (double)shard[i], (long long)r);
                }
                if (!st->mask[e] && shard[i] != 0.0f)
                    mismatch(c, "step %lld: padding element %lld of bucket %s main_weight is %.9g on "
                             "rank %lld (padding must stay zero)",
                             (long long)c->step, (long long)e, bk->name, (double)shard[i], (long long)r);
            }
        }
        at += (size_t)n;
    }
    return true;
}

/* Every unsharded weight unit u computes with equals the cast main_weight. */
static void check_weights(rank_ctx *c, const char *hook, int u, int64_t m)
{
    const mf_schedule *s = c->s;
    if (c->bad)
        return;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        if (u < bk->unit || u > bk->last_unit)
            continue;
        const bucket_state *st = &c->bs[b];
        const mf_buffer *bf = &s->buffers[st->unsharded];
        const void *w = mf_rt_buffer(c->rt, st->unsharded);
        for (int64_t e = 0; e < st->L; e++) {
            uint16_t bits;
            float want = st->full_mw[e];
            if (bf->dtype == MF_BF16) {
                bits = mf_f32_to_bf16(want);
                want = mf_bf16_to_f32(bits);
            } else if (bf->dtype == MF_FP16) {
                bits = mf_f32_to_fp16(want);
                want = mf_fp16_to_f32(bits);
            }
            float got = mf_cpu_load(w, bf->dtype, e);
            if (memcmp(&got, &want, sizeof got) != 0) {
                mismatch(c, "step %lld, %s(unit %d, microbatch %lld): rank %lld, buffer %s, element "
                         "%lld%s: expected %.9g (cast main_weight), got %.9g",
                         (long long)c->step, hook, u, (long long)m, (long long)c->rank, bf->name,
                         (long long)e, st->mask[e] ? "" : " (padding)", (double)want, (double)got);
                return;
            }
        }
    }
}

/* Writes this microbatch's local gradient of every bucket whose first
 * backward hook this is, through the tensor views. */
static void write_grads(rank_ctx *c, int u, int64_t m)
{
    const mf_schedule *s = c->s;
    int n = mfsdp_num_tensors(c->rt);
    for (int k = 0; k < n; k++) {
        const mf_rt_tensor *rt_t = &c->rt->sh->tensors[k];
        const mf_bucket *bk = &s->buckets[rt_t->bucket];
        if (bk->last_unit != u)
            continue;
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(c->rt, k, &v);
        int64_t off = bk->tensors[rt_t->index].offset;
        for (int64_t i = 0; i < v.numel; i++)
            mf_cpu_store(v.grad_local, (mf_dtype)v.grad_local_dtype, i,
                         (float)grad_value(c->step, c->rank, m, rt_t->bucket, off + i));
    }
}

static void check_gradient(rank_ctx *c)
{
    const mf_schedule *s = c->s;
    if (c->bad)
        return;
    double div = s->reduce == MF_REDUCE_AVG ? (double)c->world : 1.0;
    int64_t M = s->microbatches;
    for (int b = 0; b < s->nbuckets; b++) {
        const bucket_state *st = &c->bs[b];
        const mf_buffer *bf = &s->buffers[st->delivered];
        const void *g = mf_rt_buffer(c->rt, st->delivered);
        double slack = (double)(M + c->world + 2 * s->mesh.naxes + 4) * st->eps;
        for (int64_t i = 0; i < st->orange.len; i++) {
            int64_t e = st->orange.offset + i;
            double got = mf_cpu_load(g, bf->dtype, i), want = 0.0, mag = 0.0;
            if (st->mask[e]) {
                for (int64_t r = 0; r < c->world; r++)
                    for (int64_t m = 0; m < M; m++) {
                        double v = grad_value(c->step, r, m, b, e);
                        want += v;
                        mag += fabs(v);
                    }
                want /= div;
                mag /= div;
            }
            if (fabs(got - want) > slack * mag) {
                mismatch(c, "step %lld: rank %lld, buffer %s, element %lld%s: delivered gradient "
                         "expected %.9g, got %.9g",
                         (long long)c->step, (long long)c->rank, bf->name, (long long)e,
                         st->mask[e] ? "" : " (padding)", want, got);
                return;
            }
        }
    }
}

static void sgd(rank_ctx *c)
{
    const mf_schedule *s = c->s;
    for (int b = 0; b < s->nbuckets; b++) {
        const bucket_state *st = &c->bs[b];
        void *mw = mf_rt_buffer(c->rt, st->mw);
        const void *g = mf_rt_buffer(c->rt, st->delivered);
        mf_dtype md = s->buffers[st->mw].dtype, gd = s->buffers[st->delivered].dtype;
        for (int64_t i = 0; i < st->orange.len; i++)
            mf_cpu_store(mw, md, i, mf_cpu_load(mw, md, i) - LR * mf_cpu_load(g, gd, i));
    }
}

/* Runs one step's hooks and checks; returns the first runtime error. */
static mfsdp_result run_step(rank_ctx *c, bool stop)
{
    const mf_schedule *s = c->s;
    mfsdp_runtime *rt = c->rt;
    mfsdp_result r = mfsdp_step_begin(rt);
    if (r != MFSDP_OK || stop)
        return r;
    for (int64_t m = 0; m < s->microbatches; m++) {
        for (int u = 0; u < s->nunits; u++) {
            if ((r = mfsdp_forward_pre(rt, u, m)) != MFSDP_OK)
                return r;
            check_weights(c, "forward_pre", u, m);
            if ((r = mfsdp_forward_post(rt, u, m)) != MFSDP_OK)
                return r;
        }
        for (int u = s->nunits - 1; u >= 0; u--) {
            if ((r = mfsdp_backward_pre(rt, u, m)) != MFSDP_OK)
                return r;
            check_weights(c, "backward_pre", u, m);
            write_grads(c, u, m);
            if ((r = mfsdp_backward_post(rt, u, m)) != MFSDP_OK)
                return r;
        }
    }
    if ((r = mfsdp_step_end(rt)) != MFSDP_OK)
        return r;
    check_gradient(c);
    sgd(c);
    return MFSDP_OK;
}

static void print_step(const mf_schedule *s, FILE *out, int64_t step, const report *all, int64_t world)
{
    fprintf(out, "step %lld:", (long long)step);
    for (int j = 0; j < s->mesh.naxes; j++)
        fprintf(out, " %s %lld collectives %.3f MB/rank;", s->mesh.axes[j].name,
                (long long)all[0].collectives[j], (double)all[0].bytes[j] / 1e6);
    int64_t busy[MFSDP_NUM_STREAMS] = {0};
    for (int64_t r = 0; r < world; r++)
        for (int st = 0; st < MFSDP_NUM_STREAMS; st++)
            if (all[r].busy_ns[st] > busy[st])
                busy[st] = all[r].busy_ns[st];
    fprintf(out, " time inner %.3f ms, outer %.3f ms, compute %.3f ms (max over ranks);",
            (double)busy[MFSDP_STREAM_INNER] / 1e6, (double)busy[MFSDP_STREAM_OUTER] / 1e6,
            (double)busy[MFSDP_STREAM_COMPUTE] / 1e6);
    for (int64_t r = 0; r < world; r++)
        if (all[r].status != 0 && all[r].status != 3) {
            fprintf(out, " FAILED: %s\n", all[r].msg);
            return;
        }
    for (int64_t r = 0; r < world; r++)
        if (all[r].status == 3) {
            fprintf(out, " rank %lld stopped calling hooks (fault injection)\n", (long long)r);
            return;
        }
    fprintf(out, " verified\n");
}

int mf_check_rank(const mfsdp_schedule *sh, const mfsdp_config *cfg, const mf_check_xchg *x,
                  const mf_check_opts *o, mf_check_outcome *out)
{
    memset(out, 0, sizeof *out);
    rank_ctx c;
    memset(&c, 0, sizeof c);
    c.s = sh->s;
    c.world = sh->s->mesh.world;
    c.rank = cfg->rank;
    out->create_result = mfsdp_create(sh, cfg, &c.rt);
    report rep;
    memset(&rep, 0, sizeof rep);
    if (out->create_result != MFSDP_OK) {
        rep.status = 2;
        rep.result = out->create_result;
        snprintf(rep.msg, sizeof rep.msg, "rank %lld: create failed: %s: %s", (long long)c.rank,
                 mfsdp_result_string(out->create_result), mfsdp_last_error(NULL));
        snprintf(out->own, sizeof out->own, "%s", rep.msg);
    } else if (!init_state(&c)) {
        rep.status = 2;
        rep.result = MFSDP_ERR_OUT_OF_MEMORY;
        snprintf(rep.msg, sizeof rep.msg, "rank %lld: the oracle is out of memory", (long long)c.rank);
    } else {
        c.rank = mfsdp_rank(c.rt);
        check_views(&c);
        init_main_weight(&c);
        if (c.bad) {
            rep.status = 1;
            snprintf(rep.msg, sizeof rep.msg, "%s", c.first);
        }
    }
    /* Everyone learns whether everyone is ready. */
    const report *all = x->allgather(x->ctx, c.rank, &rep, sizeof rep);
    int rc = 0;
    if (!all) {
        rc = 1;
        snprintf(out->msg, sizeof out->msg, "the check's own exchange failed");
    } else {
        for (int64_t r = 0; r < c.world && rc == 0; r++)
            if (all[r].status != 0) {
                rc = all[r].status == 2 ? 2 : 1;
                snprintf(out->msg, sizeof out->msg, "%s", all[r].msg);
            }
    }
    mfsdp_stats prev;
    memset(&prev, 0, sizeof prev);
    for (c.step = 1; rc == 0 && c.step <= o->steps; c.step++) {
        memset(&rep, 0, sizeof rep);
        if (!assemble(&c, x)) {
            rc = 1;
            snprintf(out->msg, sizeof out->msg, "the check's own exchange failed");
            break;
        }
        bool stop = c.rank == o->stop_rank && c.step == o->stop_step;
        mfsdp_result r = run_step(&c, stop);
        mfsdp_stats now;
        mfsdp_get_stats(c.rt, &now);
        for (int j = 0; j < MFSDP_MAX_AXES; j++) {
            rep.collectives[j] = now.collectives[j] - prev.collectives[j];
            rep.bytes[j] = now.bytes[j] - prev.bytes[j];
        }
        for (int st = 0; st < MFSDP_NUM_STREAMS; st++)
            rep.busy_ns[st] = now.busy_ns[st] - prev.busy_ns[st];
        prev = now;
        if (r != MFSDP_OK) {
            rep.status = 2;
            rep.result = r;
            if (out->error == MFSDP_OK)
                out->error = r;
            snprintf(rep.msg, sizeof rep.msg, "rank %lld: %s: %s", (long long)c.rank,
                     mfsdp_result_string(r), mfsdp_last_error(c.rt));
        } else if (stop) {
            rep.status = 3;
        } else if (c.bad) {
            rep.status = 1;
            snprintf(rep.msg, sizeof rep.msg, "%s", c.first);
        }
        if (rep.status != 0 && !out->own[0])
            snprintf(out->own, sizeof out->own, "%s", rep.status == 3 ? "stopped" : rep.msg);
        all = x->allgather(x->ctx, c.rank, &rep, sizeof rep);
        if (!all) {
            rc = 1;
            snprintf(out->msg, sizeof out->msg, "the check's own exchange failed");
            break;
        }
        if (c.rank == 0 && o->out)
            print_step(c.s, o->out, c.step, all, c.world);
        for (int64_t r2 = 0; r2 < c.world; r2++)
            if (all[r2].status != 0 && rc == 0) {
                rc = 1;
                snprintf(out->msg, sizeof out->msg, "%s",
                         all[r2].status == 3 ? "a rank stopped calling hooks" : all[r2].msg);
            }
        /* A real failure message beats the stopped rank's note. */
        for (int64_t r2 = 0; r2 < c.world; r2++)
            if (all[r2].status == 1 || all[r2].status == 2) {
                snprintf(out->msg, sizeof out->msg, "%s", all[r2].msg);
                break;
            }
    }
    mfsdp_destroy(c.rt);
    free_state(&c);
    out->rc = rc;
    return rc;
}

/* ---- local: ranks are threads ---- */

typedef struct local_xchg {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t world, arrived, gen;
    size_t cap;
    bool broken;            /* not every rank could be started */
    uint8_t *data[2];
} local_xchg;

static const void *local_allgather(void *ctx, int64_t rank, const void *mine, size_t bytes)
{
    local_xchg *x = ctx;
    if (bytes > x->cap)
        return NULL;
    pthread_mutex_lock(&x->mu);
    int64_t gen = x->gen;
    uint8_t *buf = x->data[gen & 1];
    memcpy(buf + (size_t)rank * bytes, mine, bytes);
    if (++x->arrived == x->world) {
        x->arrived = 0;
        x->gen++;
        pthread_cond_broadcast(&x->cv);
    }
    while (x->gen == gen && !x->broken)
        pthread_cond_wait(&x->cv, &x->mu);
    bool ok = x->gen != gen;
    pthread_mutex_unlock(&x->mu);
    return ok ? buf : NULL;
}

typedef struct local_arg {
    const mfsdp_schedule *sh;
    mfsdp_config cfg;
    const mf_check_xchg *x;
    const mf_check_opts *o;
    mf_check_outcome *out;
} local_arg;

static void *local_main(void *p)
{
    local_arg *a = p;
    mf_check_rank(a->sh, &a->cfg, a->x, a->o, a->out);
    return NULL;
}

int mf_check_local(const mfsdp_schedule *sh, const mfsdp_schedule *const *per_rank,
                   const mfsdp_config *cfg_template, const mf_check_opts *o,
                   mf_check_outcome *outcomes)
{
    int64_t world = sh->s->mesh.world;
    int rc = 2;
    mfsdp_local_group *g = NULL;
    local_xchg lx;
    memset(&lx, 0, sizeof lx);
    lx.world = world;
    lx.cap = mf_check_xchg_bytes(sh);
    for (int64_t r = 0; per_rank && r < world; r++) {
        size_t n = mf_check_xchg_bytes(per_rank[r]);
        if (n > lx.cap)
            lx.cap = n;
    }
    lx.data[0] = malloc(lx.cap * (size_t)world);
    lx.data[1] = malloc(lx.cap * (size_t)world);
    pthread_t *th = calloc((size_t)world, sizeof *th);
    local_arg *args = calloc((size_t)world, sizeof *args);
    if (!lx.data[0] || !lx.data[1] || !th || !args)
        goto done;
    pthread_mutex_init(&lx.mu, NULL);
    pthread_cond_init(&lx.cv, NULL);
    if (mfsdp_local_group_create(world, &g) != MFSDP_OK)
        goto sync_done;
    mf_check_xchg x = {local_allgather, &lx};
    int64_t started = 0;
    for (int64_t r = 0; r < world; r++) {
        args[r].sh = per_rank ? per_rank[r] : sh;
        args[r].cfg = *cfg_template;
        args[r].cfg.backend = cfg_template->backend == MFSDP_BACKEND_CUDA_LOCAL ? MFSDP_BACKEND_CUDA_LOCAL
                                                                                 : MFSDP_BACKEND_LOCAL;
        args[r].cfg.local_group = g;
        args[r].cfg.rank = r;
        args[r].x = &x;
        args[r].o = o;
        args[r].out = &outcomes[r];
        if (pthread_create(&th[r], NULL, local_main, &args[r]) != 0)
            break;
        started++;
    }
    if (started != world) {
        /* The started ranks time out in create; release their exchanges. */
        fprintf(stderr, "mf_check: cannot start %lld threads\n", (long long)world);
        pthread_mutex_lock(&lx.mu);
        lx.broken = true;
        pthread_cond_broadcast(&lx.cv);
        pthread_mutex_unlock(&lx.mu);
    }
    for (int64_t r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    rc = started == world ? outcomes[0].rc : 2;
    mfsdp_local_group_destroy(g);
sync_done:
    pthread_cond_destroy(&lx.cv);
    pthread_mutex_destroy(&lx.mu);
done:
    free(lx.data[0]);
    free(lx.data[1]);
    free(th);
    free(args);
    return rc;
}
