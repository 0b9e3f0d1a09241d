/*
 * mf_helpers: the public helpers every trainer would otherwise rewrite
 * (mfsdp.h, "helpers"): dtype conversions, unit lookup, scattering a full
 * tensor into this rank's main_weight shard, gathering a tensor's master
 * weight or a buffer sharded like it (an optimizer state), a small
 * all-reduce of doubles over the world, and the global gradient norm with
 * clipping.
 *
 * The collective helpers ride on one backend primitive, be->allgather (a
 * world all-gather on the runtime's own communicator or group, host thread
 * only). Reductions are done here in rank order in double, so every rank
 * computes the same bits on every backend. Which ranks hold a shard is pure
 * layout math (mf_layout.h): a main_weight shard is held by every rank that
 * differs only in its coordinates on the placement's Replicate axes, and the
 * one with coordinate 0 on all of them is its designated holder (the one
 * whose copy is gathered and whose gradient counts in the norm).
 *
 * Ownership: every buffer allocated here is freed before returning.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_agree.h"
#include "mf_base.h"
#include "mf_layout.h"
#include "mf_rt_schedule.h"
#include "mf_trace.h"

/* ---- conversions ---- */

MFSDP_API uint16_t mfsdp_f32_to_bf16(float f)
{
    return mf_dtype_f32_to_bf16(f);
}

MFSDP_API float mfsdp_bf16_to_f32(uint16_t h)
{
    return mf_dtype_bf16_to_f32(h);
}

MFSDP_API uint16_t mfsdp_f32_to_fp16(float f)
{
    return mf_dtype_f32_to_fp16(f);
}

MFSDP_API float mfsdp_fp16_to_f32(uint16_t h)
{
    return mf_dtype_fp16_to_f32(h);
}

static bool dtype_ok(mfsdp_dtype d)
{
    return d == MFSDP_FP32 || d == MFSDP_BF16 || d == MFSDP_FP16;
}

MFSDP_API mfsdp_result mfsdp_convert(void *dst, mfsdp_dtype dst_dtype, const void *src,
                                     mfsdp_dtype src_dtype, int64_t n)
{
    if (n < 0 || (n > 0 && (!dst || !src)) || !dtype_ok(dst_dtype) || !dtype_ok(src_dtype))
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT,
                                 "mfsdp_convert: needs buffers, n >= 0 and dtypes fp32, bf16 or fp16 "
                                 "(got n %lld, dtypes %d and %d)",
                                 (long long)n, (int)dst_dtype, (int)src_dtype);
    if (n > 0)
        mf_dtype_convert(dst, (mf_dtype)dst_dtype, src, (mf_dtype)src_dtype, n);
    return MFSDP_OK;
}

/* ---- lookups ---- */

MFSDP_API int mfsdp_schedule_unit_find(const mfsdp_schedule *sh, const char *name)
{
    if (!sh || !name)
        return -1;
    for (int u = 0; u < sh->s->nunits; u++)
        if (strcmp(sh->s->units[u].name, name) == 0)
            return u;
    return -1;
}

MFSDP_API int mfsdp_unit_find(const mfsdp_runtime *rt, const char *name)
{
    return mf_base_live(rt) ? mfsdp_schedule_unit_find(rt->sh, name) : -1;
}

/* ---- shared checks ---- */

/* Refuses a NULL runtime, a GPU backend and a failed runtime; names the
 * helper in the message. */
static mfsdp_result usable(mf_rt *rt, const char *fn)
{
    mfsdp_result res = mf_base_handle_check(rt, fn);
    if (res != MFSDP_OK)
        return res;
    if (rt->native || !rt->be->allgather)
        return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED,
                                 "%s: the %s backend keeps its buffers on the device; the helpers "
                                 "work on the local and mpi backends",
                                 fn, rt->be->name);
    pthread_mutex_lock(&rt->mu);
    mfsdp_result f = rt->failed;
    if (f != MFSDP_OK)
        snprintf(rt->err, sizeof rt->err, "%s: the runtime has failed: %.900s", fn, rt->fail_msg);
    pthread_mutex_unlock(&rt->mu);
    return f;
}

/* Between steps: before the first step_begin or after a step_end. */
static mfsdp_result between_steps(mf_rt *rt, const char *fn, const char *what)
{
    if (mf_trace_between_steps(rt))
        return MFSDP_OK;
    return mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                             "%s called inside a step: %s only between mfsdp_step_end and the next "
                             "mfsdp_step_begin (or before the first step)",
                             fn, what);
}

static mfsdp_result tensor_ok(mf_rt *rt, const char *fn, int tensor)
{
    if (tensor < 0 || tensor >= rt->nviews)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "%s: tensor index %d out of range [0, %d)", fn, tensor, rt->nviews);
    return MFSDP_OK;
}

/* The world all-gather; a failure fails the runtime (an MPI collective
 * that timed out cannot be cancelled). */
static mfsdp_result world_allgather(mf_rt *rt, const char *fn, const void *mine, size_t bytes,
                                    void *all)
{
    /* First the ranks agree that they all call this helper with these bytes
     * (a mismatch would pair with another exchange or truncate in MPI). */
    mfsdp_result res = mf_agree_helper(rt, fn, (int64_t)bytes);
    if (res != MFSDP_OK)
        return res;
    char msg[MF_RT_ERRLEN];
    msg[0] = '\0';
    res = rt->be->allgather(rt, mine, bytes, all, msg, sizeof msg);
    if (res != MFSDP_OK) {
        char full[MF_RT_ERRLEN];
        snprintf(full, sizeof full, "%s: %.900s", fn, msg);
        mf_base_fail(rt, res, full);
        mf_base_set_error(rt, res, "%s", full);
    }
    return res;
}

/* ---- layout facts ---- */

typedef struct mf_tensor_at {
    const mf_bucket *bk;
    const mf_tensor *t;
    const mf_placement *mw;   /* the main_weight placement */
} mf_tensor_at;

static mf_tensor_at tensor_at(const mf_rt *rt, int k)
{
    const mf_rt_tensor *rt_t = &rt->sh->tensors[k];
    const mf_bucket *bk = &rt->s->buckets[rt_t->bucket];
    mf_tensor_at a = {bk, &bk->tensors[rt_t->index], &bk->place[MF_ROLE_MAIN_WEIGHT]};
    return a;
}

/* True when `rank` is the designated holder of its main_weight shard under p:
 * coordinate 0 on every Replicate axis. */
static bool designated(const mf_mesh *m, const mf_placement *p, int64_t rank)
{
    int64_t c[MF_MAX_AXES];
    mf_layout_mesh_coords(m, rank, c);
    for (int j = 0; j < m->naxes; j++)
        if (p->p[j] == MF_PLACE_REPLICATE && c[j] != 0)
            return false;
    return true;
}

/* The elements [*lo, *hi) of tensor a (tensor-local) that rank q holds. */
static void held(const mf_rt *rt, const mf_tensor_at *a, int64_t q, int64_t *lo, int64_t *hi)
{
    mf_range r = mf_layout_bucket_range(&rt->s->mesh, a->bk, a->mw, q);
    int64_t l = a->t->offset > r.offset ? a->t->offset : r.offset;
    int64_t h = a->t->offset + a->t->numel < r.offset + r.len ? a->t->offset + a->t->numel
                                                               : r.offset + r.len;
    *lo = l - a->t->offset;
    *hi = (h > l ? h : l) - a->t->offset;
}

/* ---- scatter / gather ---- */

MFSDP_API mfsdp_result mfsdp_main_weight_scatter(mfsdp_runtime *rt, int tensor, const void *full,
                                                 mfsdp_dtype dtype)
{
    static const char fn[] = "mfsdp_main_weight_scatter";
    mfsdp_result res = usable(rt, fn);
    if (res == MFSDP_OK)
        res = tensor_ok(rt, fn, tensor);
    if (res == MFSDP_OK)
        res = between_steps(rt, fn, "main_weight may be written");
    if (res != MFSDP_OK)
        return res;
    if (!full || !dtype_ok(dtype))
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "%s: needs the full tensor and a dtype fp32, bf16 or fp16", fn);
    const mfsdp_tensor_view *v = &rt->views[tensor];
    if (v->shard_count > 0)
        mf_dtype_convert(v->main_weight, (mf_dtype)v->main_weight_dtype,
                       (const char *)full + (size_t)v->shard_offset * mfsdp_dtype_size(dtype),
                       (mf_dtype)dtype, v->shard_count);
    return MFSDP_OK;
}

/* The whole tensor `tensor` out of every rank's `src` (shard_count elements
 * of src_dtype, laid out like main_weight), converted to `dtype` into `out`
 * on rank `root` or on every rank: the body of both gathers. */
static mfsdp_result gather_body(mf_rt *rt, const char *fn, int tensor, const void *src,
                                mfsdp_dtype src_dtype, void *out, mfsdp_dtype dtype, int64_t root)
{
    mfsdp_result res = usable(rt, fn);
    if (res == MFSDP_OK)
        res = tensor_ok(rt, fn, tensor);
    if (res != MFSDP_OK)
        return res;
    const mfsdp_tensor_view *v = &rt->views[tensor];
    bool receives = root == MFSDP_ALL_RANKS || root == rt->rank;
    if (root < MFSDP_ALL_RANKS || root >= rt->world || !dtype_ok(dtype) || !dtype_ok(src_dtype) ||
        (receives && !out) || (v->shard_count > 0 && !src))
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "%s: root %lld must be a rank in [0, %lld) or MFSDP_ALL_RANKS, the "
                                 "dtypes fp32, bf16 or fp16, out non-NULL on receiving ranks and "
                                 "the shard non-NULL on ranks that hold one",
                                 fn, (long long)root, (long long)rt->world);
    mf_tensor_at a = tensor_at(rt, tensor);
    for (int j = 0; j < rt->s->mesh.naxes; j++)
        if (a.mw->p[j] == MF_PLACE_DISTINCT)
            return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED,
                                     "%s: tensor '%s' is Distinct on axis '%s' (each coordinate holds its "
                                     "own tensor under this name): a gather over the mesh would mix them; "
                                     "gathering distinct tensors needs their global names (issue #42, item 2)",
                                     fn, a.t->name, rt->s->mesh.axes[j].name);
    size_t es = mfsdp_dtype_size(src_dtype);
    /* Every rank sends a block of the largest shard any rank holds. */
    int64_t most = 0, lo, hi;
    for (int64_t q = 0; q < rt->world; q++) {
        held(rt, &a, q, &lo, &hi);
        most = hi - lo > most ? hi - lo : most;
    }
    size_t block = (size_t)(most ? most : 1) * es;
    char *mine = mf_base_calloc(1, block);
    char *all = mf_base_malloc(block * (size_t)rt->world);
    if (!mine || !all) {
        res = mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu bytes)", fn,
                                block * (size_t)rt->world);
        goto done;
    }
    if (v->shard_count > 0)
        memcpy(mine, src, (size_t)v->shard_count * es);
    res = world_allgather(rt, fn, mine, block, all);
    if (res != MFSDP_OK && (rt->be->caps & MF_BE_KEEPS_PENDING)) {
        mf_base_graveyard(mine);   /* the backend may still read mine and write all */
        mf_base_graveyard(all);
        return res;
    }
    if (res != MFSDP_OK || !receives)
        goto done;
    size_t os = mfsdp_dtype_size(dtype);
    for (int64_t q = 0; q < rt->world; q++) {
        held(rt, &a, q, &lo, &hi);
        if (hi > lo && designated(&rt->s->mesh, a.mw, q))
            mf_dtype_convert((char *)out + (size_t)lo * os, (mf_dtype)dtype, all + (size_t)q * block,
                           (mf_dtype)src_dtype, hi - lo);
    }
done:
    mf_base_free(mine);
    mf_base_free(all);
    return res;
}

MFSDP_API mfsdp_result mfsdp_main_weight_gather(mfsdp_runtime *rt, int tensor, void *out,
                                                mfsdp_dtype dtype, int64_t root)
{
    const void *src = NULL;
    mfsdp_dtype src_dtype = MFSDP_FP32;
    if (mf_base_live(rt) && tensor >= 0 && tensor < rt->nviews) {
        src = rt->views[tensor].main_weight;
        src_dtype = rt->views[tensor].main_weight_dtype;
    }
    return gather_body(rt, "mfsdp_main_weight_gather", tensor, src, src_dtype, out, dtype, root);
}

MFSDP_API mfsdp_result mfsdp_shard_gather(mfsdp_runtime *rt, int tensor, const void *shard,
                                          mfsdp_dtype shard_dtype, void *out, mfsdp_dtype dtype,
                                          int64_t root)
{
    return gather_body(rt, "mfsdp_shard_gather", tensor, shard, shard_dtype, out, dtype, root);
}

/* ---- all-reduce, gradient norm ---- */

MFSDP_API mfsdp_result mfsdp_allreduce(mfsdp_runtime *rt, double *values, int n, mfsdp_reduce_op op)
{
    static const char fn[] = "mfsdp_allreduce";
    mfsdp_result res = usable(rt, fn);
    if (res != MFSDP_OK)
        return res;
    if (n < 0 || n > (1 << 20) || (n > 0 && !values) ||
        (op != MFSDP_REDUCE_SUM && op != MFSDP_REDUCE_MAX && op != MFSDP_REDUCE_MIN))
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "%s: needs n in [0, %d] values and op SUM, MAX or MIN (got n %d, op %d)",
                                 fn, 1 << 20, n, (int)op);
    if (n == 0)
        return MFSDP_OK;
    double *all = mf_base_malloc((size_t)n * sizeof *all * (size_t)rt->world);
    if (!all)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    res = world_allgather(rt, fn, values, (size_t)n * sizeof *values, all);
    if (res != MFSDP_OK) {
        if (rt->be->caps & MF_BE_KEEPS_PENDING)
            mf_base_graveyard(all);   /* the backend may still write it */
        else
            mf_base_free(all);
        return res;
    }
    for (int i = 0; i < n; i++) {
        double acc = all[i];
        for (int64_t q = 1; q < rt->world; q++) {
            double x = all[q * n + i];
            if (op == MFSDP_REDUCE_SUM)
                acc += x;
            else if (op == MFSDP_REDUCE_MAX ? (x > acc || x != x) : (x < acc || x != x))
                acc = x;   /* NaN wins, so a bad value is never hidden */
        }
        values[i] = acc;
    }
    mf_base_free(all);
    return res;
}

/* Sum of squares of this rank's delivered gradient over the shards it is
 * the designated holder of. */
static double local_sumsq(const mf_rt *rt)
{
    double acc = 0;
    for (int k = 0; k < rt->nviews; k++) {
        const mfsdp_tensor_view *v = &rt->views[k];
        mf_tensor_at a = tensor_at(rt, k);
        if (v->shard_count == 0 || !designated(&rt->s->mesh, a.mw, rt->rank))
            continue;
        for (int64_t i = 0; i < v->shard_count; i++) {
            double g = mf_dtype_load(v->grad, (mf_dtype)v->grad_dtype, i);
            acc += g * g;
        }
    }
    return acc;
}

static mfsdp_result grad_norm(mf_rt *rt, const char *fn, double *norm)
{
    mfsdp_result res = usable(rt, fn);
    if (res == MFSDP_OK)
        res = between_steps(rt, fn, "the delivered gradient is complete");
    if (res == MFSDP_OK && rt->stats.steps == 0)
        res = mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                                "%s called before the first mfsdp_step_end: no gradient yet", fn);
    if (res != MFSDP_OK)
        return res;
    double sumsq = local_sumsq(rt);
    res = mfsdp_allreduce(rt, &sumsq, 1, MFSDP_REDUCE_SUM);
    if (res == MFSDP_OK)
        *norm = sqrt(sumsq);
    return res;
}

MFSDP_API mfsdp_result mfsdp_grad_norm(mfsdp_runtime *rt, double *norm)
{
    if (mf_base_live(rt) && !norm)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT, "mfsdp_grad_norm: norm is NULL");
    return grad_norm(rt, "mfsdp_grad_norm", norm);
}

MFSDP_API mfsdp_result mfsdp_grad_clip(mfsdp_runtime *rt, double max_norm, double *norm_out)
{
    static const char fn[] = "mfsdp_grad_clip";
    if (mf_base_live(rt) && !(max_norm > 0))
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT, "%s: max_norm %g must be > 0", fn,
                                 max_norm);
    double norm = 0;
    mfsdp_result res = grad_norm(rt, fn, &norm);
    if (res != MFSDP_OK)
        return res;
    if (norm_out)
        *norm_out = norm;
    if (!(norm > max_norm))
        return MFSDP_OK;
    float scale = (float)(max_norm / (norm + 1e-6));
    for (int k = 0; k < rt->nviews; k++) {
        const mfsdp_tensor_view *v = &rt->views[k];
        for (int64_t i = 0; i < v->shard_count; i++)
            mf_dtype_store(v->grad, (mf_dtype)v->grad_dtype, i,
                         mf_dtype_load(v->grad, (mf_dtype)v->grad_dtype, i) * scale);
    }
    return MFSDP_OK;
}
