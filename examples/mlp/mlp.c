/*
 * mfsdp-mlp: a small multi-layer perceptron trained with libmfsdp, checked
 * against the same model trained in one process on the whole global batch.
 *
 *   mfsdp-mlp [--backend local|mpi] [--schedule FILE | --spec FILE]
 *             [--steps S] [--optimizer sgd|adam] [--batch B] [--clip C] [--tol T]
 *
 * The model comes from the schedule: every unit is one layer with tensors
 * "<unit>.weight" [out, in] and "<unit>.bias" [out]; consecutive layers
 * chain (in of layer l+1 == out of layer l); hidden layers use tanh, the last
 * is linear; the loss is 1/2 the mean squared error over the global batch.
 *
 * Every rank of the mesh is a data-parallel rank. Per step and microbatch m,
 * rank r trains on its own B samples of the global batch (B * M * world
 * samples per step). All communication goes through libmfsdp: forward and
 * backward read the unsharded weights through the views, backward writes
 * each microbatch's gradient into grad_local (scaled by 1/(M*B), so the
 * schedule's `avg` over ranks gives the global mean), and after step_end the
 * optimizer updates this rank's main_weight shard from the delivered
 * gradient shard. The library's helpers do the rest: the initial weights are
 * scattered from the full tensors (mfsdp_main_weight_scatter), --clip clips
 * the global gradient norm (mfsdp_grad_clip), and the trained weights are
 * gathered on rank 0 (mfsdp_main_weight_gather) to be compared with the
 * reference, which trains the same model (weights rounded to the schedule's
 * compute dtype, as the ranks see them) on the whole batch. Prints
 * max_rel_err= (per tensor, max |a - b| / max |b|, the maximum over tensors)
 * and exits 1 above the tolerance: 1e-5 when every dtype is fp32, looser for
 * bf16 (3e-2) and fp16 (5e-3) schedules.
 *
 * Only the public headers are used (mfsdp.h, and mfsdp_mpi.h with MPI);
 * --spec runs the mfsdpc program to compile a spec first.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mfsdp.h"
#ifdef MLP_WITH_MPI
#include "mfsdp_mpi.h"
#endif

#ifndef MLP_DEFAULT_SCHEDULE
#define MLP_DEFAULT_SCHEDULE "hfsdp.yaml"
#endif
#ifndef MLP_MFSDPC
#define MLP_MFSDPC "mfsdpc"
#endif

/* ---- options ---- */

typedef struct opts {
    const char *backend;
    const char *schedule;
    const char *spec;
    int64_t steps;
    int adam;
    int64_t batch;          /* samples per rank per microbatch */
    double clip;            /* > 0: clip the global gradient norm to this */
    double tol;             /* < 0: from the dtypes */
} opts;

/* ---- numbers ---- */

/* The value a buffer of dtype d stores for f (the runtime's own rounding). */
static float round_to(mfsdp_dtype d, float f)
{
    if (d == MFSDP_BF16)
        return mfsdp_bf16_to_f32(mfsdp_f32_to_bf16(f));
    if (d == MFSDP_FP16)
        return mfsdp_fp16_to_f32(mfsdp_f32_to_fp16(f));
    return f;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float uniform(uint64_t key)   /* [-1, 1) */
{
    return (float)((double)(mix(key) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ---- the model ---- */

typedef struct layer {
    int unit;
    int w, b;               /* tensor indices */
    int64_t in, out;
    mfsdp_dtype wdt;        /* compute dtype of the weights */
} layer;

typedef struct model {
    int nlayers;
    layer *layers;
    int64_t D, C;
    int64_t world, M;
    int avg;
    int fp32_only;
    mfsdp_dtype least;      /* least precise dtype anywhere */
} model;

static float init_param(int tensor, int64_t i, int64_t fan_in, int is_bias)
{
    float scale = is_bias ? 0.1f : 1.0f / sqrtf((float)fan_in);
    return scale * uniform(((uint64_t)tensor << 40) ^ (uint64_t)i);
}

/* Sample s of the data set: input x[D] and target t[C]. */
static void sample(const model *md, int64_t s, float *x, float *t)
{
    for (int64_t d = 0; d < md->D; d++)
        x[d] = uniform(((uint64_t)s << 20) ^ (uint64_t)d ^ 0x5a5a000000000000ull);
    for (int64_t c = 0; c < md->C; c++) {
        float acc = 0;
        for (int64_t d = 0; d < md->D; d++)
            acc += x[d] * uniform(0x7e7e000000000000ull ^ ((uint64_t)c << 20) ^ (uint64_t)d);
        t[c] = sinf(acc);
    }
}

static int build_model(const mfsdp_schedule *sh, model *md, char *err, size_t errlen)
{
    int units = mfsdp_schedule_num_units(sh), nt = mfsdp_schedule_num_tensors(sh);
    memset(md, 0, sizeof *md);
    md->layers = calloc((size_t)(units ? units : 1), sizeof *md->layers);
    if (!md->layers) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    md->nlayers = units;
    md->world = mfsdp_schedule_world_size(sh);
    md->M = mfsdp_schedule_microbatches(sh);
    md->avg = mfsdp_schedule_reduce_is_avg(sh);
    md->fp32_only = 1;
    md->least = MFSDP_FP32;
    for (int u = 0; u < units; u++)
        md->layers[u].w = md->layers[u].b = -1;
    for (int k = 0; k < nt; k++) {
        mfsdp_tensor_info ti;
        mfsdp_schedule_tensor_info(sh, k, &ti);
        const char *unit = mfsdp_schedule_unit_name(sh, ti.unit);
        size_t n = strlen(unit);
        layer *l = &md->layers[ti.unit];
        l->unit = ti.unit;
        const char *leaf = strncmp(ti.name, unit, n) == 0 && ti.name[n] == '.' ? ti.name + n + 1 : "";
        if (!strcmp(leaf, "weight") && ti.ndims == 2) {
            l->w = k;
            l->out = ti.dims[0];
            l->in = ti.dims[1];
            l->wdt = ti.weight_dtype;
        } else if (!strcmp(leaf, "bias") && ti.ndims == 1) {
            l->b = k;
        } else {
            snprintf(err, errlen,
                     "tensor %s: an MLP unit has exactly \"<unit>.weight\" [out, in] and "
                     "\"<unit>.bias\" [out]",
                     ti.name);
            return -1;
        }
        mfsdp_dtype ds[3] = {ti.weight_dtype, ti.grad_dtype, ti.main_weight_dtype};
        for (int i = 0; i < 3; i++) {
            if (ds[i] != MFSDP_FP32)
                md->fp32_only = 0;
            if (ds[i] == MFSDP_BF16 || (ds[i] == MFSDP_FP16 && md->least == MFSDP_FP32))
                md->least = ds[i];
        }
        if (ti.main_weight_dtype != MFSDP_FP32) {
            snprintf(err, errlen, "tensor %s: main_weight must be fp32", ti.name);
            return -1;
        }
    }
    for (int u = 0; u < units; u++) {
        layer *l = &md->layers[u];
        if (l->w < 0 || l->b < 0) {
            snprintf(err, errlen, "unit %s needs both a weight and a bias tensor",
                     mfsdp_schedule_unit_name(sh, u));
            return -1;
        }
        mfsdp_tensor_info bi;
        mfsdp_schedule_tensor_info(sh, l->b, &bi);
        if (bi.dims[0] != l->out || (u > 0 && l->in != md->layers[u - 1].out)) {
            snprintf(err, errlen, "unit %s: shapes do not chain (in %lld, out %lld, bias %lld)",
                     mfsdp_schedule_unit_name(sh, u), (long long)l->in, (long long)l->out,
                     (long long)bi.dims[0]);
            return -1;
        }
    }
    if (units == 0) {
        snprintf(err, errlen, "the schedule has no units");
        return -1;
    }
    md->D = md->layers[0].in;
    md->C = md->layers[units - 1].out;
    return 0;
}

/* Forward and backward of n samples with weights W[l], biases B[l]: adds
 * scale * dL/dW into gW, gB. a[l] holds n * in_l activations (a[L]: output). */
typedef struct work {
    float **a;              /* per layer + 1: activations, n * width */
    float *dy, *dz;         /* n * max width */
    float *x, *t;           /* one sample */
} work;

static int64_t max_width(const model *md)
{
    int64_t w = md->D;
    for (int l = 0; l < md->nlayers; l++)
        if (md->layers[l].out > w)
            w = md->layers[l].out;
    return w;
}

static int work_alloc(const model *md, int64_t n, work *w)
{
    memset(w, 0, sizeof *w);
    int64_t mw = max_width(md);
    w->a = calloc((size_t)md->nlayers + 1, sizeof *w->a);
    w->dy = malloc((size_t)(n * mw) * sizeof(float));
    w->dz = malloc((size_t)(n * mw) * sizeof(float));
    w->x = malloc((size_t)md->D * sizeof(float));
    w->t = malloc((size_t)(n * md->C) * sizeof(float));
    if (!w->a || !w->dy || !w->dz || !w->x || !w->t)
        return -1;
    for (int l = 0; l <= md->nlayers; l++) {
        int64_t width = l == 0 ? md->D : md->layers[l - 1].out;
        w->a[l] = malloc((size_t)(n * width) * sizeof(float));
        if (!w->a[l])
            return -1;
    }
    return 0;
}

static void work_free(const model *md, work *w)
{
    for (int l = 0; w->a && l <= md->nlayers; l++)
        free(w->a[l]);
    free(w->a);
    free(w->dy);
    free(w->dz);
    free(w->x);
    free(w->t);
}

/* Loads samples [first, first + n) into a[0] and t. */
static void load_batch(const model *md, work *w, int64_t first, int64_t n)
{
    for (int64_t s = 0; s < n; s++) {
        sample(md, first + s, w->x, w->t + s * md->C);
        memcpy(w->a[0] + s * md->D, w->x, (size_t)md->D * sizeof(float));
    }
}

static void forward_layer(const model *md, work *w, int l, const float *W, const float *B, int64_t n)
{
    const layer *ly = &md->layers[l];
    int last = l == md->nlayers - 1;
    for (int64_t s = 0; s < n; s++)
        for (int64_t o = 0; o < ly->out; o++) {
            float acc = B[o];
            const float *in = w->a[l] + s * ly->in, *row = W + o * ly->in;
            for (int64_t i = 0; i < ly->in; i++)
                acc += row[i] * in[i];
            w->a[l + 1][s * ly->out + o] = last ? acc : tanhf(acc);
        }
}

/* dy = scale * (y - t) at the output. */
static void output_grad(const model *md, work *w, int64_t n, float scale)
{
    const float *y = w->a[md->nlayers];
    for (int64_t k = 0; k < n * md->C; k++)
        w->dy[k] = scale * (y[k] - w->t[k]);
}

/* Backward of layer l: gradients into gW/gB (overwritten), dy for l - 1. */
static void backward_layer(const model *md, work *w, int l, const float *W, float *gW, float *gB,
                           int64_t n)
{
    const layer *ly = &md->layers[l];
    int last = l == md->nlayers - 1;
    for (int64_t k = 0; k < n * ly->out; k++) {
        float y = w->a[l + 1][k];
        w->dz[k] = last ? w->dy[k] : w->dy[k] * (1.0f - y * y);
    }
    for (int64_t o = 0; o < ly->out; o++) {
        float gb = 0;
        for (int64_t s = 0; s < n; s++)
            gb += w->dz[s * ly->out + o];
        gB[o] = gb;
        for (int64_t i = 0; i < ly->in; i++) {
            float g = 0;
            for (int64_t s = 0; s < n; s++)
                g += w->dz[s * ly->out + o] * w->a[l][s * ly->in + i];
            gW[o * ly->in + i] = g;
        }
    }
    for (int64_t s = 0; s < n; s++)
        for (int64_t i = 0; i < ly->in; i++) {
            float acc = 0;
            for (int64_t o = 0; o < ly->out; o++)
                acc += w->dz[s * ly->out + o] * W[o * ly->in + i];
            w->dy[s * ly->in + i] = acc;
        }
}

/* ---- the optimizer, elementwise on any range of a tensor ---- */

typedef struct optim {
    int adam;
    float lr, b1, b2, eps;
} optim;

static void optim_step(const optim *op, int64_t t, float *w, const float *g, float *m, float *v,
                       int64_t n)
{
    if (!op->adam) {
        for (int64_t i = 0; i < n; i++)
            w[i] -= op->lr * g[i];
        return;
    }
    float c1 = 1.0f - powf(op->b1, (float)t), c2 = 1.0f - powf(op->b2, (float)t);
    for (int64_t i = 0; i < n; i++) {
        m[i] = op->b1 * m[i] + (1.0f - op->b1) * g[i];
        v[i] = op->b2 * v[i] + (1.0f - op->b2) * g[i] * g[i];
        w[i] -= op->lr * (m[i] / c1) / (sqrtf(v[i] / c2) + op->eps);
    }
}


/* The factor that clips gradients of global norm `norm` to `clip`, as
 * mfsdp_grad_clip computes it (1 when no clipping). */
static float clip_factor(double norm, double clip)
{
    return clip > 0 && norm > clip ? (float)(clip / (norm + 1e-6)) : 1.0f;
}

/* ---- the reference: one process, whole global batch ---- */

typedef struct reference {
    float **param;          /* per tensor, numel */
} reference;

/* Tensor k's layer, and whether k is its bias; NULL when no layer has it. */
static const layer *tensor_layer(const model *md, int k, int *is_bias)
{
    for (int l = 0; l < md->nlayers; l++)
        if (md->layers[l].w == k || md->layers[l].b == k) {
            *is_bias = md->layers[l].b == k;
            return &md->layers[l];
        }
    return NULL;
}

static int64_t tensor_numel(const model *md, int k)
{
    int b = 0;
    const layer *ly = tensor_layer(md, k, &b);
    return !ly ? 0 : b ? ly->out : ly->out * ly->in;
}

/* The initial value of every element of tensor k (the same on every rank
 * and in the reference). */
static void tensor_init(const model *md, int k, float *out)
{
    int b = 0;
    const layer *ly = tensor_layer(md, k, &b);
    for (int64_t i = 0; ly && i < tensor_numel(md, k); i++)
        out[i] = init_param(k, i, ly->in, b);
}

/* nt zeroed float arrays, a[k] of n(k) elements, in one allocation (one
 * free). n(k) is tensor_numel, or with views the shard (shard = 1) or the
 * whole tensor. */
static float **arrays_new(const model *md, int nt, const mfsdp_tensor_view *views, int shard)
{
    size_t total = 0;
    for (int k = 0; k < nt; k++)
        total += (size_t)(views ? (shard ? views[k].shard_count : views[k].numel) : tensor_numel(md, k));
    float **a = calloc(1, (size_t)nt * sizeof *a + total * sizeof(float) + 1);
    float *at = a ? (float *)(a + nt) : NULL;
    for (int k = 0; a && k < nt; k++) {
        a[k] = at;
        at += views ? (shard ? views[k].shard_count : views[k].numel) : tensor_numel(md, k);
    }
    return a;
}

static int reference_train(const model *md, const opts *o, const optim *op, int nt, reference *ref)
{
    int64_t per_step = md->world * md->M * o->batch;
    work w;
    ref->param = arrays_new(md, nt, NULL, 0);
    struct { float **grad, **m, **v, **wc; } a = {arrays_new(md, nt, NULL, 0), arrays_new(md, nt, NULL, 0),
                                                 arrays_new(md, nt, NULL, 0), arrays_new(md, nt, NULL, 0)};
    int rc = work_alloc(md, per_step, &w) != 0 || !ref->param || !a.grad || !a.m || !a.v || !a.wc;
    for (int k = 0; rc == 0 && k < nt; k++)
        tensor_init(md, k, ref->param[k]);
    for (int64_t step = 0; rc == 0 && step < o->steps; step++) {
        load_batch(md, &w, step * per_step, per_step);
        for (int l = 0; l < md->nlayers; l++) {
            const layer *ly = &md->layers[l];
            /* The ranks compute with weights rounded to the compute dtype. */
            for (int64_t i = 0; i < ly->out * ly->in; i++)
                a.wc[ly->w][i] = round_to(ly->wdt, ref->param[ly->w][i]);
            for (int64_t i = 0; i < ly->out; i++)
                a.wc[ly->b][i] = round_to(ly->wdt, ref->param[ly->b][i]);
            forward_layer(md, &w, l, a.wc[ly->w], a.wc[ly->b], per_step);
        }
        output_grad(md, &w, per_step, 1.0f / (float)per_step);
        for (int l = md->nlayers - 1; l >= 0; l--) {
            const layer *ly = &md->layers[l];
            backward_layer(md, &w, l, a.wc[ly->w], a.grad[ly->w], a.grad[ly->b], per_step);
        }
        double sumsq = 0;
        for (int k = 0; k < nt; k++)
            for (int64_t i = 0; i < tensor_numel(md, k); i++)
                sumsq += (double)a.grad[k][i] * a.grad[k][i];
        float f = clip_factor(sqrt(sumsq), o->clip);
        for (int k = 0; k < nt; k++) {
            for (int64_t i = 0; f != 1.0f && i < tensor_numel(md, k); i++)
                a.grad[k][i] *= f;
            optim_step(op, step + 1, ref->param[k], a.grad[k], a.m[k], a.v[k], tensor_numel(md, k));
        }
    }
    free(a.grad);
    free(a.m);
    free(a.v);
    free(a.wc);
    work_free(md, &w);
    return rc ? -1 : 0;
}

/* ---- one data-parallel rank ---- */

typedef struct rank_job {
    const mfsdp_schedule *sh;
    mfsdp_config cfg;
    const model *md;
    const opts *o;
    const optim *op;
    const reference *ref;   /* read on rank 0 only */
    double rel_err;         /* max over tensors of max |a - b| / max |b| (every rank) */
    int failed;
    char msg[1200];
} rank_job;

/* A rank's runtime and per-tensor host arrays (index = tensor). */
typedef struct rank_state {
    mfsdp_runtime *rt;
    int nt;
    mfsdp_tensor_view *views;
    float **W, **G;         /* the unsharded weight as fp32, this microbatch's gradient */
    float **g, **m, **v;    /* this rank's shard: delivered gradient, Adam moments */
    work w;
} rank_state;

#define CHECK(call)                                                                      \
    do {                                                                                 \
        mfsdp_result r_ = (call);                                                        \
        if (r_ != MFSDP_OK) {                                                            \
            snprintf(j->msg, sizeof j->msg, "rank %lld: %s: %s: %s",                     \
                     (long long)(rs->rt ? mfsdp_rank(rs->rt) : j->cfg.rank), #call,       \
                     mfsdp_result_string(r_), mfsdp_last_error(rs->rt));                 \
            return -1;                                                                   \
        }                                                                                \
    } while (0)

/* Creates the runtime, allocates the arrays and scatters the initial
 * weights (between create and the first step_begin). */
static int rank_setup(rank_job *j, rank_state *rs)
{
    int nt = rs->nt = mfsdp_schedule_num_tensors(j->sh);
    rs->views = calloc((size_t)nt, sizeof *rs->views);
    if (!rs->views || work_alloc(j->md, j->o->batch, &rs->w) != 0)
        return -1;
    CHECK(mfsdp_create(j->sh, &j->cfg, &rs->rt));
    for (int k = 0; k < nt; k++)
        CHECK(mfsdp_tensor_view_get(rs->rt, k, &rs->views[k]));
    rs->W = arrays_new(j->md, nt, rs->views, 0);
    rs->G = arrays_new(j->md, nt, rs->views, 0);
    rs->g = arrays_new(j->md, nt, rs->views, 1);
    rs->m = arrays_new(j->md, nt, rs->views, 1);
    rs->v = arrays_new(j->md, nt, rs->views, 1);
    if (!rs->W || !rs->G || !rs->g || !rs->m || !rs->v)
        return -1;
    for (int k = 0; k < nt; k++) {
        tensor_init(j->md, k, rs->W[k]);    /* the full tensor, then this rank's shard of it */
        CHECK(mfsdp_main_weight_scatter(rs->rt, k, rs->W[k], MFSDP_FP32));
    }
    return 0;
}

static void rank_free(const model *md, rank_state *rs)
{
    mfsdp_destroy(rs->rt);
    free(rs->W);
    free(rs->G);
    free(rs->g);
    free(rs->m);
    free(rs->v);
    free(rs->views);
    work_free(md, &rs->w);
}

/* One microbatch through the hooks: forward reads the unsharded weights in
 * their window, backward overwrites grad_local. */
static int rank_microbatch(rank_job *j, rank_state *rs, int64_t first, int64_t mb, float scale)
{
    const model *md = j->md;
    int64_t n = j->o->batch;
    load_batch(md, &rs->w, first, n);
    for (int l = 0; l < md->nlayers; l++) {
        const layer *ly = &md->layers[l];
        const mfsdp_tensor_view *tw = &rs->views[ly->w], *tb = &rs->views[ly->b];
        CHECK(mfsdp_forward_pre(rs->rt, ly->unit, mb));
        CHECK(mfsdp_convert(rs->W[ly->w], MFSDP_FP32, tw->weight, tw->weight_dtype, tw->numel));
        CHECK(mfsdp_convert(rs->W[ly->b], MFSDP_FP32, tb->weight, tb->weight_dtype, tb->numel));
        forward_layer(md, &rs->w, l, rs->W[ly->w], rs->W[ly->b], n);
        CHECK(mfsdp_forward_post(rs->rt, ly->unit, mb));
    }
    output_grad(md, &rs->w, n, scale);
    for (int l = md->nlayers - 1; l >= 0; l--) {
        const layer *ly = &md->layers[l];
        const mfsdp_tensor_view *tw = &rs->views[ly->w], *tb = &rs->views[ly->b];
        CHECK(mfsdp_backward_pre(rs->rt, ly->unit, mb));
        CHECK(mfsdp_convert(rs->W[ly->w], MFSDP_FP32, tw->weight, tw->weight_dtype, tw->numel));
        backward_layer(md, &rs->w, l, rs->W[ly->w], rs->G[ly->w], rs->G[ly->b], n);
        CHECK(mfsdp_convert(tw->grad_local, tw->grad_local_dtype, rs->G[ly->w], MFSDP_FP32, tw->numel));
        CHECK(mfsdp_convert(tb->grad_local, tb->grad_local_dtype, rs->G[ly->b], MFSDP_FP32, tb->numel));
        CHECK(mfsdp_backward_post(rs->rt, ly->unit, mb));
    }
    return 0;
}

/* One optimizer step: the microbatches, then clipping and the update of
 * this rank's main_weight shard from its delivered gradient shard. */
static int rank_step(rank_job *j, rank_state *rs, int64_t step)
{
    const model *md = j->md;
    int64_t n = j->o->batch, rank = mfsdp_rank(rs->rt), per_step = md->world * md->M * n;
    /* avg divides by the world over ranks; microbatches and samples are ours. */
    float scale = 1.0f / (float)(md->M * n) / (md->avg ? 1.0f : (float)md->world);
    CHECK(mfsdp_step_begin(rs->rt));
    for (int64_t mb = 0; mb < md->M; mb++)
        if (rank_microbatch(j, rs, step * per_step + (mb * md->world + rank) * n, mb, scale) != 0)
            return -1;
    CHECK(mfsdp_step_end(rs->rt));
    if (j->o->clip > 0)
        CHECK(mfsdp_grad_clip(rs->rt, j->o->clip, NULL));
    for (int k = 0; k < rs->nt; k++) {
        const mfsdp_tensor_view *tv = &rs->views[k];
        CHECK(mfsdp_convert(rs->g[k], MFSDP_FP32, tv->grad, tv->grad_dtype, tv->shard_count));
        optim_step(j->op, step + 1, tv->main_weight, rs->g[k], rs->m[k], rs->v[k], tv->shard_count);
    }
    return 0;
}

/* Gathers every trained tensor on rank 0, compares it with the reference
 * there, and shares the worst relative error with every rank. */
static int rank_compare(rank_job *j, rank_state *rs)
{
    int root = mfsdp_rank(rs->rt) == 0;
    double worst = 0;
    for (int k = 0; k < rs->nt; k++) {
        int64_t n = rs->views[k].numel;
        CHECK(mfsdp_main_weight_gather(rs->rt, k, root ? rs->W[k] : NULL, MFSDP_FP32, 0));
        double diff = 0, mag = 0;
        for (int64_t i = 0; root && i < n; i++) {
            double b = j->ref->param[k][i], e = fabs((double)rs->W[k][i] - b);
            diff = e > diff || e != e ? e : diff;
            mag = fabs(b) > mag ? fabs(b) : mag;
        }
        double e = diff / (mag > 0 ? mag : 1.0);
        worst = e > worst || e != e ? e : worst;
    }
    CHECK(mfsdp_allreduce(rs->rt, &worst, 1, MFSDP_REDUCE_MAX));
    j->rel_err = worst;
    return 0;
}

static void rank_main(rank_job *j)
{
    rank_state rs;
    memset(&rs, 0, sizeof rs);
    j->failed = 1;
    snprintf(j->msg, sizeof j->msg, "rank %lld: out of memory", (long long)j->cfg.rank);
    int rc = rank_setup(j, &rs);
    for (int64_t step = 0; rc == 0 && step < j->o->steps; step++)
        rc = rank_step(j, &rs, step);
    if (rc == 0 && rank_compare(j, &rs) == 0)
        j->failed = 0;
    rank_free(j->md, &rs);
}

static void *rank_thread(void *p)
{
    rank_main(p);
    return NULL;
}

static double default_tol(const model *md)
{
    if (md->fp32_only)
        return 1e-5;
    return md->least == MFSDP_BF16 ? 3e-2 : 5e-3;
}

/* ---- command line ---- */

#ifdef MLP_INSTALLED_SCHEDULE
static char installed_schedule[8192];
#endif

/* An installed binary's <prefix>/MLP_INSTALLED_SCHEDULE (next to
 * <prefix>/bin/mfsdp-mlp) when it exists, else the build tree's hfsdp.yaml. */
static const char *default_schedule(void)
{
#ifdef MLP_INSTALLED_SCHEDULE
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = NULL;
    if (n > 0) {
        exe[n] = '\0';
        for (int up = 0; up < 2 && (slash = strrchr(exe, '/')) != NULL; up++)
            *slash = '\0';                        /* <prefix>/bin/mfsdp-mlp -> <prefix> */
    }
    if (slash) {
        snprintf(installed_schedule, sizeof installed_schedule, "%s/%s", exe, MLP_INSTALLED_SCHEDULE);
        if (access(installed_schedule, R_OK) == 0)
            return installed_schedule;
    }
#endif
    return MLP_DEFAULT_SCHEDULE;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mfsdp-mlp [--backend local|mpi] [--schedule FILE | --spec FILE] [--steps S]\n"
            "                 [--optimizer sgd|adam] [--batch B] [--clip C] [--tol T]\n"
            "Trains an MLP (one unit per layer: <unit>.weight [out, in], <unit>.bias [out])\n"
            "with libmfsdp on every rank of the schedule's mesh, trains the same model in one\n"
            "process on the whole global batch, and prints max_rel_err= between the two.\n"
            "  --schedule FILE  a compiled schedule (default: %s)\n"
            "  --spec FILE      compile this spec with mfsdpc first ($MFSDPC or %s)\n"
            "  --steps S        optimizer steps (default 5)\n"
            "  --optimizer      sgd (lr 0.1, default) or adam (lr 0.01)\n"
            "  --batch B        samples per rank per microbatch (default 4)\n"
            "  --clip C         clip the global gradient norm to C (default: no clipping)\n"
            "  --tol T          failure threshold (default 1e-5 for fp32 schedules, 3e-2 with\n"
            "                   bf16, 5e-3 with fp16)\n",
            MLP_DEFAULT_SCHEDULE, MLP_MFSDPC);
}

static int parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "local";
    o->schedule = default_schedule();
    o->steps = 5;
    o->batch = 4;
    o->tol = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "mfsdp-mlp: error: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        char *end = NULL;
        errno = 0;
        if (!strcmp(a, "--backend") && (!strcmp(v, "local") || !strcmp(v, "mpi")))
            o->backend = v;
        else if (!strcmp(a, "--schedule"))
            o->schedule = v;
        else if (!strcmp(a, "--spec"))
            o->spec = v;
        else if (!strcmp(a, "--steps") && (o->steps = strtoll(v, &end, 10)) > 0 && !*end)
            ;
        else if (!strcmp(a, "--batch") && (o->batch = strtoll(v, &end, 10)) > 0 && !*end)
            ;
        else if (!strcmp(a, "--clip") && (o->clip = strtod(v, &end)) > 0 && !*end)
            ;
        else if (!strcmp(a, "--tol") && (o->tol = strtod(v, &end)) > 0 && !*end)
            ;
        else if (!strcmp(a, "--optimizer") && (!strcmp(v, "sgd") || !strcmp(v, "adam")))
            o->adam = !strcmp(v, "adam");
        else {
            fprintf(stderr, "mfsdp-mlp: error: invalid option %s %s (see --help)\n", a, v);
            return 2;
        }
    }
    return -1;
}

/* --spec: runs `mfsdpc compile SPEC -o TMP` and returns TMP (owned). */
static char *compile_spec(const char *spec)
{
    /* $MFSDPC, the build tree's mfsdpc, or the one on PATH (installed). */
    const char *mfsdpc = getenv("MFSDPC")                  ? getenv("MFSDPC")
                         : access(MLP_MFSDPC, X_OK) == 0 ? MLP_MFSDPC
                                                          : "mfsdpc";
    char *tmp = strdup("/tmp/mfsdp-mlp-XXXXXX.yaml");
    if (!tmp)
        return NULL;
    int fd = mkstemps(tmp, 5);
    if (fd < 0) {
        free(tmp);
        return NULL;
    }
    close(fd);
    size_t len = strlen(mfsdpc) + strlen(spec) + strlen(tmp) + 64;
    char *cmd = malloc(len);
    if (!cmd) {
        unlink(tmp);
        free(tmp);
        return NULL;
    }
    snprintf(cmd, len, "'%s' compile '%s' -o '%s'", mfsdpc, spec, tmp);
    int rc = strchr(spec, '\'') || strchr(mfsdpc, '\'') ? -1 : system(cmd);
    free(cmd);
    if (rc != 0) {
        fprintf(stderr, "mfsdp-mlp: error: compiling %s with %s failed\n", spec, mfsdpc);
        unlink(tmp);
        free(tmp);
        return NULL;
    }
    return tmp;
}


/* Runs the ranks: one thread per rank on the local backend, this process
 * alone on MPI. Fills jobs[0..nranks). */
static int run_ranks(rank_job *jobs, int64_t nranks, const rank_job *proto, int mpi,
                     int64_t mpi_rank, void *mpi_comm)
{
    mfsdp_local_group *g = NULL;
    if (!mpi && mfsdp_local_group_create(nranks, &g) != MFSDP_OK) {
        fprintf(stderr, "mfsdp-mlp: error: %s\n", mfsdp_last_error(NULL));
        return -1;
    }
    for (int64_t r = 0; r < nranks; r++) {
        jobs[r] = *proto;
        mfsdp_config_init(&jobs[r].cfg);
        jobs[r].cfg.timeout_ms = 120000;
        jobs[r].cfg.local_group = g;
        jobs[r].cfg.rank = mpi ? mpi_rank : r;
#ifdef MLP_WITH_MPI
        if (mpi)
            mfsdp_config_set_mpi(&jobs[r].cfg, mpi_comm);
#endif
    }
    int rc = 0;
    if (mpi) {
        rank_main(&jobs[0]);
    } else {
        pthread_t *th = calloc((size_t)nranks, sizeof *th);
        int64_t started = 0;
        for (; th && started < nranks; started++)
            if (pthread_create(&th[started], NULL, rank_thread, &jobs[started]) != 0)
                break;
        for (int64_t r = 0; r < started; r++)
            pthread_join(th[r], NULL);
        free(th);
        if (started != nranks) {
            fprintf(stderr, "mfsdp-mlp: error: cannot start %lld threads\n", (long long)nranks);
            rc = -1;
        }
    }
    mfsdp_local_group_destroy(g);
    (void)mpi_comm;
    return rc;
}

static int run(const opts *o, const mfsdp_schedule *sh, int mpi, int mpi_rank, void *mpi_comm)
{
    model md;
    char err[512];
    int nt = mfsdp_schedule_num_tensors(sh), rc = 1;
    if (build_model(sh, &md, err, sizeof err) != 0) {
        if (mpi_rank == 0)
            fprintf(stderr, "mfsdp-mlp: error: %s: %s\n", o->schedule, err);
        free(md.layers);
        return 2;
    }
    optim op = {o->adam, o->adam ? 0.01f : 0.1f, 0.9f, 0.999f, 1e-8f};
    reference ref;
    memset(&ref, 0, sizeof ref);
    int64_t nranks = mpi ? 1 : md.world;
    rank_job *jobs = calloc((size_t)nranks, sizeof *jobs);
    rank_job proto = {.sh = sh, .md = &md, .o = o, .op = &op, .ref = &ref};
    if (!jobs || (mpi_rank == 0 && reference_train(&md, o, &op, nt, &ref) != 0)) {
        fprintf(stderr, "mfsdp-mlp: error: out of memory\n");
        goto done;
    }
    if (run_ranks(jobs, nranks, &proto, mpi, mpi_rank, mpi_comm) != 0)
        goto done;
    int failed = 0;
    for (int64_t r = 0; r < nranks; r++)
        if (jobs[r].failed) {
            fprintf(stderr, "mfsdp-mlp: error: %s\n", jobs[r].msg);
            failed = 1;
        }
#ifdef MLP_WITH_MPI
    if (mpi)   /* a failed rank's runtime is gone: agree on failure through MPI */
        MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, *(MPI_Comm *)mpi_comm);
#endif
    if (failed)
        goto done;
    double e = jobs[0].rel_err, tol = o->tol > 0 ? o->tol : default_tol(&md);
    if (mpi_rank == 0) {
        printf("mfsdp-mlp: %s: %d layers, %lld ranks, %lld microbatches x %lld samples per rank, "
               "%lld steps of %s%s\n",
               o->spec ? o->spec : o->schedule, md.nlayers, (long long)md.world, (long long)md.M,
               (long long)o->batch, (long long)o->steps, o->adam ? "adam" : "sgd",
               o->clip > 0 ? ", clipped" : "");
        printf("max_rel_err=%.3e (tolerance %.1e)\n", e, tol);
    }
    rc = e <= tol ? 0 : 1;
    if (rc && mpi_rank == 0)
        fprintf(stderr, "mfsdp-mlp: the data-parallel run differs from single-process training\n");
done:
    free(ref.param);
    free(jobs);
    free(md.layers);
    return rc;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    int mpi = !strcmp(o.backend, "mpi"), mpi_rank = 0;
    void *comm = NULL;
#ifdef MLP_WITH_MPI
    MPI_Comm world = MPI_COMM_WORLD;
    if (mpi) {
        int provided = 0;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
        comm = &world;
    }
#else
    if (mpi) {
        fprintf(stderr, "mfsdp-mlp: error: built without MPI\n");
        return 2;
    }
#endif
    char *compiled = NULL;
    if (o.spec) {
        /* Under MPI every process compiles its own copy (same input, same bytes). */
        compiled = compile_spec(o.spec);
        if (!compiled)
            rc = 2;
        o.schedule = compiled;
    }
    mfsdp_schedule *sh = NULL;
    if (rc < 0 && mfsdp_schedule_load(o.schedule, &sh) != MFSDP_OK) {
        if (mpi_rank == 0)
            fprintf(stderr, "mfsdp-mlp: error: %s\n", mfsdp_last_error(NULL));
        rc = 2;
    }
#ifdef MLP_WITH_MPI
    if (mpi) {
        int size = 0, bad = rc >= 0, any = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (!bad && size != mfsdp_schedule_world_size(sh)) {
            if (mpi_rank == 0)
                fprintf(stderr, "mfsdp-mlp: error: %d MPI processes, the mesh needs %lld\n", size,
                        (long long)mfsdp_schedule_world_size(sh));
            bad = 1;
        }
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (any)
            rc = 2;
    }
#endif
    if (rc < 0)
        rc = run(&o, sh, mpi, mpi_rank, comm);
    mfsdp_schedule_free(sh);
    if (compiled) {
        unlink(compiled);
        free(compiled);
    }
#ifdef MLP_WITH_MPI
    if (mpi)
        MPI_Finalize();
#endif
    return rc;
}
