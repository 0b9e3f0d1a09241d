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

#include "mf_hash.h"
#include "mf_offload.h"
#include "mf_rt.h"

#define LR (1.0f / 16.0f)
#define CHUNK ((int64_t)1 << 20)   /* elements per rank per main_weight exchange */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/*
 * Local gradients: g(step, rank, m, bucket, e) = (j(step, rank, m, bucket) +
 * k(step, bucket, e)) / 64 with j in [-63, 63] and k in [-64, 63]: distinct
 * per rank, microbatch and element, exact in bf16, fp16 and fp32 (at most 7
 * significant bits), and the reduction has a closed form, so checking costs
 * O(1) per element: N*M*k(e) + sum of j.
 */
static int grad_j(int64_t step, int64_t rank, int64_t m, int bucket)
{
    uint64_t h = mix(mix(mix((uint64_t)step * 1000003u + (uint64_t)bucket) ^ (uint64_t)rank) ^
                     ((uint64_t)m << 20));
    return (int)(h % 127) - 63;
}

static int grad_k(uint32_t seed, int64_t e)
{
    uint32_t h = ((uint32_t)e * 2654435761u) ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    return (int)(h >> 25) - 64;
}

static uint32_t grad_seed(int64_t step, int bucket)
{
    return (uint32_t)mix((uint64_t)step * 7919u + (uint64_t)bucket * 104729u);
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
    void *full_w;                          /* L elements in the unsharded weight's dtype:
                                              every rank's main_weight assembled, cast */
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

/* True when element e of bucket bk belongs to a tensor (else padding). */
static bool is_tensor(const mf_bucket *bk, int64_t e)
{
    int lo = 0, hi = bk->ntensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const mf_tensor *t = &bk->tensors[mid];
        if (e < t->offset)
            hi = mid - 1;
        else if (e >= t->offset + t->numel)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

size_t mf_check_xchg_bytes(const mfsdp_schedule *sh)
{
    (void)sh;
    size_t n = (size_t)CHUNK * sizeof(float);
    return n > sizeof(report) ? n : sizeof(report);
}

size_t mf_check_rank_bytes(const mfsdp_schedule *sh)
{
    const mf_schedule *s = sh->s;
    size_t n = 0;
    for (int i = 0; i < s->nbuffers; i++) {
        const mf_buffer *bf = &s->buffers[i];
        n += (size_t)bf->count * mf_dtype_size(bf->dtype);
        if (bf->kind == MF_BUF_WEIGHT_FULL ||
            (bf->kind == MF_BUF_WEIGHT &&
             mf_layout_shards(&s->mesh, &s->buckets[bf->bucket].place[MF_ROLE_WEIGHT]) == 1))
            n += (size_t)bf->count * mf_dtype_size(bf->dtype);   /* the oracle's copy */
    }
    return n + (size_t)CHUNK * sizeof(float);
}

static void free_state(rank_ctx *c)
{
    if (!c->bs)
        return;
    for (int b = 0; b < c->s->nbuckets; b++)
        free(c->bs[b].full_w);
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
        int grad = -1, final = -1, weight = -1, full = -1;
        mf_dtype least = MF_FP32;
        for (int i = 0; i < s->nbuffers; i++) {
            const mf_buffer *bf = &s->buffers[i];
            if (bf->bucket != b)
                continue;
            if (mf_bufkind_role(bf->kind) == MF_ROLE_GRAD && dtype_eps(bf->dtype) > dtype_eps(least))
                least = bf->dtype;
            switch (bf->kind) {
            case MF_BUF_WEIGHT_FULL: full = i; break;
            case MF_BUF_WEIGHT: weight = i; break;
            case MF_BUF_GRAD_LOCAL: st->local = i; break;
            case MF_BUF_MAIN_WEIGHT: st->mw = i; break;
            case MF_BUF_GRAD: grad = i; break;
            case MF_BUF_GRAD_FINAL: final = i; break;
            default: break;
            }
        }
        st->unsharded = full >= 0 ? full : weight;
        st->delivered = final >= 0 ? final : grad;
        st->eps = dtype_eps(least);
        st->L = bk->length;
        st->orange = mf_layout_bucket_range(&s->mesh, bk, &bk->place[MF_ROLE_MAIN_WEIGHT], c->rank);
        st->full_w = calloc((size_t)(st->L ? st->L : 1), mf_dtype_size(s->buffers[st->unsharded].dtype));
        if (!st->full_w)
            return false;
    }
    return true;
}

/* Where a trainer reads bucket st's delivered gradient: its buffer, or the
 * host mirror that step_end fills under MFSDP_FLAG_OFFLOAD_MAIN. */
static void *delivered_ptr(const rank_ctx *c, const bucket_state *st)
{
    void *m = mf_offload_mirror(c->rt, st->delivered);
    return m ? m : mf_rt_buffer(c->rt, st->delivered);
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
        size_t ls = mf_dtype_size(s->buffers[st->local].dtype);
        bool ok = v.numel == t->numel &&
                  v.weight == (char *)mf_rt_buffer(c->rt, st->unsharded) + (size_t)t->offset * ws &&
                  v.grad_local == (char *)mf_rt_buffer(c->rt, st->local) + (size_t)t->offset * ls &&
                  mfsdp_tensor_find(c->rt, v.name) == k;
        int64_t lo = t->offset > st->orange.offset ? t->offset : st->orange.offset;
        int64_t hi = t->offset + t->numel < st->orange.offset + st->orange.len
                         ? t->offset + t->numel
                         : st->orange.offset + st->orange.len;
        ok = ok && v.shard_count == (hi > lo ? hi - lo : 0);
        size_t ms = mf_dtype_size(s->buffers[st->mw].dtype);
        size_t gs = mf_dtype_size(s->buffers[st->delivered].dtype);
        if (ok && v.shard_count > 0)
            ok = v.shard_offset == lo - t->offset &&
                 v.main_weight ==
                     (char *)mf_rt_buffer(c->rt, st->mw) + (size_t)(lo - st->orange.offset) * ms &&
                 v.grad == (char *)delivered_ptr(c, st) +
                               (size_t)(lo - st->orange.offset) * gs;
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
            mf_dtype_store(mw, d, i, is_tensor(&s->buckets[b], e) ? init_value(b, e) : 0.0f);
        }
    }
}

/* Ranks r and q hold the same tensors of bucket bk: equal coordinates on
 * each of its Distinct axes (docs/semantics.md §4.7; every rank when none). */
static bool same_tensors(const mf_schedule *s, const mf_bucket *bk, int64_t r, int64_t q)
{
    int64_t a[MF_MAX_AXES], b[MF_MAX_AXES];
    mf_layout_mesh_coords(&s->mesh, r, a);
    mf_layout_mesh_coords(&s->mesh, q, b);
    for (int j = 0; j < s->mesh.naxes; j++)
        if (bk->place[MF_ROLE_WEIGHT].p[j] == MF_PLACE_DISTINCT && a[j] != b[j])
            return false;
    return true;
}

/* The shard of placement p rank r holds. */
static int64_t shard_of(const mf_schedule *s, const mf_placement *p, int64_t r)
{
    int64_t coords[MF_MAX_AXES];
    mf_layout_mesh_coords(&s->mesh, r, coords);
    return mf_layout_shard_index(&s->mesh, p, coords);
}

/* Of the chunk [i0, i0 + len) of a buffer, the elements inside the first
 * `held` (a ragged bucket's rank holds fewer than the buffer's count). */
static int64_t held_in(int64_t held, int64_t i0, int64_t len)
{
    int64_t h = held - i0;
    return h < 0 ? 0 : h < len ? h : len;
}

/* Exchanges main_weight shards bucket by bucket (in chunks) and assembles
 * every bucket's full weight, cast to the unsharded weight's dtype. Replicas
 * must be bitwise equal and padding zero. */
static bool assemble(rank_ctx *c, const mf_check_xchg *x)
{
    const mf_schedule *s = c->s;
    float *mine = malloc((size_t)CHUNK * sizeof(float));
    int64_t *first = calloc((size_t)c->world, sizeof *first);
    if (!mine || !first) {
        free(mine);
        free(first);
        return false;
    }
    bool ok = true;
    for (int b = 0; b < s->nbuckets && ok; b++) {
        bucket_state *st = &c->bs[b];
        const mf_bucket *bk = &s->buckets[b];
        const mf_placement *O = &bk->place[MF_ROLE_MAIN_WEIGHT];
        mf_dtype wd = s->buffers[st->unsharded].dtype, md = s->buffers[st->mw].dtype;
        int64_t n = s->buffers[st->mw].count;
        /* first[q]: the lowest rank holding shard q (the replica others must equal). */
        int64_t shards = mf_layout_shards(&s->mesh, O);
        for (int64_t q = 0; q < shards; q++)
            first[q] = -1;
        for (int64_t r = 0; r < c->world; r++) {
            int64_t q = shard_of(s, O, r);
            if (first[q] < 0 && same_tensors(s, bk, c->rank, r))
                first[q] = r;
        }
        const void *mw = mf_rt_buffer(c->rt, st->mw);
        for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
            /* every rank sends `len` elements; a ragged bucket's rank holds
               only orange.len of the buffer's n: the rest is sent as zeros */
            int64_t len = n - i0 < CHUNK ? n - i0 : CHUNK, have = held_in(st->orange.len, i0, len);
            mf_dtype_convert(mine, MF_FP32, (const char *)mw + (size_t)i0 * mf_dtype_size(md), md, have);
            memset(mine + have, 0, (size_t)(len - have) * sizeof(float));
            const float *all = x->allgather(x->ctx, c->rank, mine, (size_t)len * sizeof(float), false);
            if (!all) {
                ok = false;
                break;
            }
            for (int64_t r = 0; r < c->world; r++) {
                if (!same_tensors(s, bk, c->rank, r))
                    continue; /* another coordinate's tensors (a Distinct axis) */
                mf_range rr = mf_layout_bucket_range(&s->mesh, bk, O, r);
                int64_t q = shard_of(s, O, r), rlen = held_in(rr.len, i0, len);
                const float *shard = all + r * len;
                const float *ref = all + first[q] * len;
                if (first[q] != r && memcmp(shard, ref, (size_t)len * sizeof(float)) != 0) {
                    int64_t i = 0;
                    while (i < len && memcmp(&shard[i], &ref[i], sizeof(float)) == 0)
                        i++;
                    mismatch(c, "step %lld: main_weight replicas of bucket %s differ at element "
                             "%lld: %.9g on rank %lld, %.9g on rank %lld",
                             (long long)c->step, bk->name, (long long)(rr.offset + i0 + i),
                             (double)ref[i], (long long)first[q], (double)shard[i], (long long)r);
                }
                if (first[q] != r)
                    continue;
                /* Padding: the gaps between tensors and the tail. */
                int64_t lo = rr.offset + i0, hi = lo + rlen, at = 0;
                for (int t = 0; t <= bk->ntensors; t++) {
                    int64_t gap_end = t < bk->ntensors ? bk->tensors[t].offset : bk->length;
                    for (int64_t e = at > lo ? at : lo; e < gap_end && e < hi; e++)
                        if (shard[e - lo] != 0.0f)
                            mismatch(c, "step %lld: padding element %lld of bucket %s main_weight "
                                     "is %.9g on rank %lld (padding must stay zero)",
                                     (long long)c->step, (long long)e, bk->name,
                                     (double)shard[e - lo], (long long)r);
                    if (t < bk->ntensors)
                        at = bk->tensors[t].offset + bk->tensors[t].numel;
                }
                mf_dtype_convert((char *)st->full_w + (size_t)(rr.offset + i0) * mf_dtype_size(wd), wd,
                               shard, MF_FP32, rlen);
            }
        }
    }
    free(mine);
    free(first);
    return ok;
}

/* Every unsharded weight unit u computes with equals the cast main_weight,
 * bit for bit, padding included. */
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
        size_t es = mf_dtype_size(bf->dtype);
        if (memcmp(w, st->full_w, (size_t)st->L * es) == 0)
            continue;
        int64_t e = 0;
        while (e < st->L && memcmp((const char *)w + e * es, (const char *)st->full_w + e * es, es) == 0)
            e++;
        mismatch(c, "step %lld, %s(unit %d, microbatch %lld): rank %lld, buffer %s, element %lld%s: "
                 "expected %.9g (cast main_weight), got %.9g",
                 (long long)c->step, hook, u, (long long)m, (long long)c->rank, bf->name,
                 (long long)e, is_tensor(bk, e) ? "" : " (padding)",
                 (double)mf_dtype_load(st->full_w, bf->dtype, e), (double)mf_dtype_load(w, bf->dtype, e));
        return;
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
        int j = grad_j(c->step, c->rank, m, rt_t->bucket);
        uint32_t seed = grad_seed(c->step, rt_t->bucket);
        if (v.grad_local_dtype == MFSDP_FP32) {
            float *gl = v.grad_local;
            for (int64_t i = 0; i < v.numel; i++)
                gl[i] = (float)(j + grad_k(seed, off + i)) / 64.0f;
        } else {
            for (int64_t i = 0; i < v.numel; i++)
                mf_dtype_store(v.grad_local, (mf_dtype)v.grad_local_dtype, i,
                             (float)(j + grad_k(seed, off + i)) / 64.0f);
        }
    }
}

static void check_gradient(rank_ctx *c)
{
    const mf_schedule *s = c->s;
    if (c->bad)
        return;
    int64_t M = s->microbatches;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        /* reduced over the ranks holding the same tensors (all but a Distinct axis) */
        int64_t n = 0;
        for (int64_t r = 0; r < c->world; r++)
            n += same_tensors(s, bk, c->rank, r);
        double div = s->reduce == MF_REDUCE_AVG ? (double)n : 1.0;
        int64_t NM = n * M;
        const bucket_state *st = &c->bs[b];
        const mf_buffer *bf = &s->buffers[st->delivered];
        const void *g = delivered_ptr(c, st);
        double slack = (double)(M + c->world + 2 * s->mesh.naxes + 4) * st->eps;
        double sum_j = 0.0, abs_j = 0.0;
        for (int64_t r = 0; r < c->world; r++)
            for (int64_t m = 0; m < M && same_tensors(s, bk, c->rank, r); m++) {
                int j = grad_j(c->step, r, m, b);
                sum_j += j;
                abs_j += j < 0 ? -j : j;
            }
        uint32_t seed = grad_seed(c->step, b);
        int64_t lo = st->orange.offset, hi = lo + st->orange.len;
        /* Tensor elements, tensor by tensor in offset order. grad_local
         * shares the arena with other buffers, so the delivered gradient's
         * gaps and padding are unspecified (docs/runtime.md). */
        for (int t = 0; t <= bk->ntensors; t++) {
            if (t == bk->ntensors)
                break;
            const mf_tensor *tn = &bk->tensors[t];
            int64_t t_lo = tn->offset > lo ? tn->offset : lo;
            int64_t t_hi = tn->offset + tn->numel < hi ? tn->offset + tn->numel : hi;
            for (int64_t e = t_lo; e < t_hi; e++) {
                double got = mf_dtype_load(g, bf->dtype, e - lo);
                int k = grad_k(seed, e);
                double want = (sum_j + (double)NM * k) / 64.0 / div;
                double mag = (abs_j + (double)NM * (k < 0 ? -k : k)) / 64.0 / div;
                if (fabs(got - want) > slack * mag) {
                    mismatch(c, "step %lld: rank %lld, buffer %s, element %lld (tensor %s): "
                             "delivered gradient expected %.9g, got %.9g",
                             (long long)c->step, (long long)c->rank, bf->name, (long long)e,
                             tn->name, want, got);
                    return;
                }
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
        const void *g = delivered_ptr(c, st);
        mf_dtype md = s->buffers[st->mw].dtype, gd = s->buffers[st->delivered].dtype;
        /* Tensor elements only, like a trainer through its views: the
         * gradient's padding is unspecified (docs/runtime.md). */
        for (int64_t i = 0; i < st->orange.len; i++)
            if (is_tensor(&s->buckets[b], st->orange.offset + i))
                mf_dtype_store(mw, md, i, mf_dtype_load(mw, md, i) - LR * mf_dtype_load(g, gd, i));
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
            fflush(out);
            return;
        }
    for (int64_t r = 0; r < world; r++)
        if (all[r].status == 3) {
            fprintf(out, " rank %lld stopped calling hooks (fault injection)\n", (long long)r);
            fflush(out);
            return;
        }
    fprintf(out, " verified\n");
    fflush(out);   /* progress shows under mpirun and in a file */
}

/* The check's own exchange failed: the same words as this rank's result and
 * its own problem (a survivor names the peer that never arrived). */
static void xchg_failed(const mf_check_xchg *x, mf_check_outcome *out)
{
    const char *why = x->why ? x->why(x->ctx) : NULL;
    snprintf(out->msg, sizeof out->msg, "the check's own exchange failed%s%s", why ? ": " : "",
             why ? why : "");
    if (!out->own[0])
        snprintf(out->own, sizeof out->own, "%s", out->msg);
}

/* Creates the runtime and the oracle's state, then every rank learns whether
 * every rank is ready. Returns 0 (all ready), 1 (a mismatch or a failed
 * exchange) or 2 (a runtime error somewhere); out->msg says which. */
static int check_setup(rank_ctx *c, const mfsdp_schedule *sh, const mfsdp_config *cfg, const mf_check_xchg *x,
                       mf_check_outcome *out)
{
    out->create_result = mfsdp_create(sh, cfg, &c->rt);
    out->allocated_bytes = mfsdp_allocated_bytes(c->rt);
    report rep;
    memset(&rep, 0, sizeof rep);
    if (out->create_result != MFSDP_OK) {
        rep.status = 2;
        rep.result = out->create_result;
        snprintf(rep.msg, sizeof rep.msg, "rank %lld: mfsdp_create: %s: %s", (long long)c->rank,
                 mfsdp_result_string(out->create_result), mfsdp_last_error(NULL));
        snprintf(out->own, sizeof out->own, "%s", rep.msg);
    } else if (!init_state(c)) {
        rep.status = 2;
        rep.result = MFSDP_ERR_OUT_OF_MEMORY;
        snprintf(rep.msg, sizeof rep.msg, "rank %lld: the oracle is out of memory", (long long)c->rank);
    } else {
        c->rank = mfsdp_rank(c->rt);
        check_views(c);
        init_main_weight(c);
        if (c->bad) {
            rep.status = 1;
            snprintf(rep.msg, sizeof rep.msg, "%s", c->first);
        }
    }
    const report *all = x->allgather(x->ctx, c->rank, &rep, sizeof rep, rep.status == 2);
    if (!all) {
        xchg_failed(x, out);
        return 1;
    }
    for (int64_t r = 0; r < c->world; r++)
        if (all[r].status != 0) {
            snprintf(out->msg, sizeof out->msg, "%s", all[r].msg);
            return all[r].status == 2 ? 2 : 1;
        }
    return 0;
}

/* This rank's report of one step: the counters since *prev, and how the step
 * ended (r, a stop by fault injection, or the oracle's first mismatch). */
static void step_report(rank_ctx *c, mfsdp_result r, bool stop, mfsdp_stats *prev, report *rep,
                        mf_check_outcome *out)
{
    mfsdp_stats now;
    mfsdp_get_stats(c->rt, &now);
    for (int j = 0; j < MFSDP_MAX_AXES; j++) {
        rep->collectives[j] = now.collectives[j] - prev->collectives[j];
        rep->bytes[j] = now.bytes[j] - prev->bytes[j];
    }
    for (int st = 0; st < MFSDP_NUM_STREAMS; st++)
        rep->busy_ns[st] = now.busy_ns[st] - prev->busy_ns[st];
    *prev = now;
    if (r != MFSDP_OK) {
        rep->status = 2;
        rep->result = r;
        if (out->error == MFSDP_OK)
            out->error = r;
        snprintf(rep->msg, sizeof rep->msg, "rank %lld: %s: %s", (long long)c->rank,
                 mfsdp_result_string(r), mfsdp_last_error(c->rt));
    } else if (stop) {
        rep->status = 3;
    } else if (c->bad) {
        rep->status = 1;
        snprintf(rep->msg, sizeof rep->msg, "%s", c->first);
    }
    if (rep->status != 0 && !out->own[0])
        snprintf(out->own, sizeof out->own, "%s",
                 rep->status == 3 ? "rank stopped calling hooks (fault injection)" : rep->msg);
}

/* The steps, each checked by every rank's report. Returns 0 or 1. */
static int check_steps(rank_ctx *c, const mf_check_xchg *x, const mf_check_opts *o, mf_check_outcome *out)
{
    int rc = 0;
    mfsdp_stats prev;
    memset(&prev, 0, sizeof prev);
    for (c->step = 1; rc == 0 && c->step <= o->steps; c->step++) {
        report rep;
        memset(&rep, 0, sizeof rep);
        if (!assemble(c, x)) {
            xchg_failed(x, out);
            return 1;
        }
        bool stop = c->rank == o->stop_rank && c->step == o->stop_step;
        step_report(c, run_step(c, stop), stop, &prev, &rep, out);
        const report *all = x->allgather(x->ctx, c->rank, &rep, sizeof rep, rep.status == 2);
        if (!all) {
            xchg_failed(x, out);
            return 1;
        }
        if (c->rank == 0 && o->out)
            print_step(c->s, o->out, c->step, all, c->world);
        for (int64_t r2 = 0; r2 < c->world; r2++)
            if (all[r2].status != 0 && rc == 0) {
                rc = 1;
                snprintf(out->msg, sizeof out->msg, "%s",
                         all[r2].status == 3 ? "a rank stopped calling hooks" : all[r2].msg);
            }
        /* A real failure message beats the stopped rank's note. */
        for (int64_t r2 = 0; r2 < c->world; r2++)
            if (all[r2].status == 1 || all[r2].status == 2) {
                snprintf(out->msg, sizeof out->msg, "%s", all[r2].msg);
                break;
            }
    }
    return rc;
}

/* The master weights after the run, for bit-identity checks. */
static uint64_t master_digest(const rank_ctx *c)
{
    uint64_t h = MF_FNV1A_BASIS;
    for (int b = 0; c->rt && c->bs && b < c->s->nbuckets; b++) {
        const mf_buffer *mb = &c->s->buffers[c->bs[b].mw];
        const unsigned char *p = mf_rt_buffer(c->rt, c->bs[b].mw);
        if (p)
            h = mf_hash_fnv1a(h, p, (size_t)c->bs[b].orange.len * mf_dtype_size(mb->dtype));
    }
    return h;
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
    int rc = check_setup(&c, sh, cfg, x, out);
    if (rc == 0)
        rc = check_steps(&c, x, o, out);
    out->digest = master_digest(&c);
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

static const void *local_allgather(void *ctx, int64_t rank, const void *mine, size_t bytes,
                                   bool failing)
{
    local_xchg *x = ctx;
    (void)failing;   /* threads cannot stop alone: wait for every rank */
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
    mf_check_xchg x = {local_allgather, NULL, &lx};
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
