/*
 * mfsdp-mlp: a small multi-layer perceptron trained with libmfsdp, checked
 * against the same model trained in one process on the whole global batch.
 *
 *   mfsdp-mlp [--backend local|mpi] [--schedule FILE | --spec FILE]
 *             [--steps S] [--optimizer sgd|adam] [--batch B] [--tol T]
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
 * gradient shard. The reference trains the same model (weights rounded to
 * the schedule's compute dtype, as the ranks see them) on the whole batch.
 * Prints max_rel_err= (per tensor, max |a - b| / max |b|, the maximum over
 * tensors) and exits 1 above the tolerance: 1e-5 when every dtype is fp32,
 * looser for bf16 (3e-2) and fp16 (5e-3) schedules.
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
    double tol;             /* < 0: from the dtypes */
} opts;

/* ---- numbers ---- */

static float bf16_round(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return f;
    x = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &x, 4);
    return f;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0) {
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    x = sign | (exp == 31 ? 0x7f800000u | (mant << 13) : ((exp + 112u) << 23) | (mant << 13));
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (ax <= 0x33000000u)
        return (uint16_t)sign;
    if (ax < 0x38800000u) {
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(ax >> 23);
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
        q += rem > half || (rem == half && (q & 1u));
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - 0x38000000u, q = r >> 13, rem = r & 0x1fffu;
    q += rem > 0x1000u || (rem == 0x1000u && (q & 1u));
    return (uint16_t)(sign | q);
}

/* The value a buffer of dtype d stores for f. */
static float round_to(mfsdp_dtype d, float f)
{
    if (d == MFSDP_BF16)
        return bf16_round(f);
    if (d == MFSDP_FP16)
        return half_to_float(float_to_half(f));
    return f;
}

static float load(const void *p, mfsdp_dtype d, int64_t i)
{
    if (d == MFSDP_FP32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (d == MFSDP_FP16)
        return half_to_float(h);
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void store(void *p, mfsdp_dtype d, int64_t i, float f)
{
    if (d == MFSDP_FP32) {
        ((float *)p)[i] = f;
        return;
    }
    if (d == MFSDP_FP16) {
        ((uint16_t *)p)[i] = float_to_half(f);
        return;
    }
    f = bf16_round(f);
    uint32_t x;
    memcpy(&x, &f, 4);
    ((uint16_t *)p)[i] = (uint16_t)(x >> 16);
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

/* ---- the reference: one process, whole global batch ---- */

typedef struct reference {
    float **param;          /* per tensor, numel */
} reference;

static int64_t tensor_numel(const model *md, int k)
{
    for (int l = 0; l < md->nlayers; l++) {
        if (md->layers[l].w == k)
            return md->layers[l].out * md->layers[l].in;
        if (md->layers[l].b == k)
            return md->layers[l].out;
    }
    return 0;
}

static int reference_train(const model *md, const opts *o, const optim *op, int nt, reference *ref)
{
    int64_t per_step = md->world * md->M * o->batch;
    work w;
    int rc = -1;
    ref->param = calloc((size_t)nt, sizeof *ref->param);
    float **grad = calloc((size_t)nt, sizeof *grad), **m = calloc((size_t)nt, sizeof *m);
    float **v = calloc((size_t)nt, sizeof *v), **wc = calloc((size_t)nt, sizeof *wc);
    if (!ref->param || !grad || !m || !v || !wc || work_alloc(md, per_step, &w) != 0)
        goto done;
    for (int l = 0; l < md->nlayers; l++) {
        const layer *ly = &md->layers[l];
        int ks[2] = {ly->w, ly->b};
        for (int j = 0; j < 2; j++) {
            int k = ks[j];
            int64_t n = tensor_numel(md, k);
            ref->param[k] = malloc((size_t)n * sizeof(float));
            grad[k] = malloc((size_t)n * sizeof(float));
            m[k] = calloc((size_t)n, sizeof(float));
            v[k] = calloc((size_t)n, sizeof(float));
            wc[k] = malloc((size_t)n * sizeof(float));
            if (!ref->param[k] || !grad[k] || !m[k] || !v[k] || !wc[k])
                goto done;
            for (int64_t i = 0; i < n; i++)
                ref->param[k][i] = init_param(k, i, ly->in, j == 1);
        }
    }
    for (int64_t step = 0; step < o->steps; step++) {
        load_batch(md, &w, step * per_step, per_step);
        for (int l = 0; l < md->nlayers; l++) {
            const layer *ly = &md->layers[l];
            /* The ranks compute with weights rounded to the compute dtype. */
            for (int64_t i = 0; i < ly->out * ly->in; i++)
                wc[ly->w][i] = round_to(ly->wdt, ref->param[ly->w][i]);
            for (int64_t i = 0; i < ly->out; i++)
                wc[ly->b][i] = round_to(ly->wdt, ref->param[ly->b][i]);
            forward_layer(md, &w, l, wc[ly->w], wc[ly->b], per_step);
        }
        output_grad(md, &w, per_step, 1.0f / (float)per_step);
        for (int l = md->nlayers - 1; l >= 0; l--) {
            const layer *ly = &md->layers[l];
            backward_layer(md, &w, l, wc[ly->w], grad[ly->w], grad[ly->b], per_step);
        }
        for (int k = 0; k < nt; k++)
            optim_step(op, step + 1, ref->param[k], grad[k], m[k], v[k], tensor_numel(md, k));
    }
    rc = 0;
done:
    for (int k = 0; k < nt; k++) {
        if (grad)
            free(grad[k]);
        if (m)
            free(m[k]);
        if (v)
            free(v[k]);
        if (wc)
            free(wc[k]);
    }
    free(grad);
    free(m);
    free(v);
    free(wc);
    work_free(md, &w);
    return rc;
}

static void reference_free(reference *ref, int nt)
{
    for (int k = 0; ref->param && k < nt; k++)
        free(ref->param[k]);
    free(ref->param);
}

/* ---- one data-parallel rank ---- */

typedef struct rank_job {
    const mfsdp_schedule *sh;
    mfsdp_config cfg;
    const model *md;
    const opts *o;
    const optim *op;
    const reference *ref;
    double *maxdiff;        /* per tensor: max |a - b| over this rank's shard */
    int failed;
    char msg[1200];
    int64_t allocated;      /* mfsdp_allocated_bytes of this rank's runtime */
} rank_job;

#define CHECKGOTO(call)                                                                  \
    do {                                                                                 \
        mfsdp_result r_ = (call);                                                        \
        if (r_ != MFSDP_OK) {                                                            \
            snprintf(j->msg, sizeof j->msg, "rank %lld: %s: %s: %s", (long long)rank,    \
                     #call, mfsdp_result_string(r_), mfsdp_last_error(rt));              \
            goto done;                                                                   \
        }                                                                                \
    } while (0)

static void rank_main(rank_job *j)
{
    const model *md = j->md;
    const opts *o = j->o;
    int nt = mfsdp_schedule_num_tensors(j->sh);
    int64_t rank = j->cfg.rank, n = o->batch;
    mfsdp_runtime *rt = NULL;
    work w;
    memset(&w, 0, sizeof w);
    float **W = calloc((size_t)nt, sizeof *W), **G = calloc((size_t)nt, sizeof *G);
    float **m = calloc((size_t)nt, sizeof *m), **v = calloc((size_t)nt, sizeof *v);
    float **g = calloc((size_t)nt, sizeof *g);
    mfsdp_tensor_view *views = calloc((size_t)nt, sizeof *views);
    j->failed = 1;
    if (!W || !G || !m || !v || !g || !views || work_alloc(md, n, &w) != 0) {
        snprintf(j->msg, sizeof j->msg, "rank %lld: out of memory", (long long)rank);
        goto done;
    }
    CHECKGOTO(mfsdp_create(j->sh, &j->cfg, &rt));
    rank = mfsdp_rank(rt);
    j->allocated = mfsdp_allocated_bytes(rt);
    for (int k = 0; k < nt; k++) {
        CHECKGOTO(mfsdp_tensor_view_get(rt, k, &views[k]));
        int64_t numel = views[k].numel, sc = views[k].shard_count;
        W[k] = malloc((size_t)numel * sizeof(float));
        G[k] = malloc((size_t)numel * sizeof(float));
        m[k] = calloc((size_t)(sc ? sc : 1), sizeof(float));
        v[k] = calloc((size_t)(sc ? sc : 1), sizeof(float));
        g[k] = malloc((size_t)(sc ? sc : 1) * sizeof(float));
        if (!W[k] || !G[k] || !m[k] || !v[k] || !g[k]) {
            snprintf(j->msg, sizeof j->msg, "rank %lld: out of memory", (long long)rank);
            goto done;
        }
    }
    /* This rank's shard of the initial parameters (the reference's init). */
    for (int l = 0; l < md->nlayers; l++) {
        const layer *ly = &md->layers[l];
        int ks[2] = {ly->w, ly->b};
        for (int b = 0; b < 2; b++) {
            const mfsdp_tensor_view *tv = &views[ks[b]];
            for (int64_t i = 0; i < tv->shard_count; i++)
                ((float *)tv->main_weight)[i] = init_param(ks[b], tv->shard_offset + i, ly->in, b == 1);
        }
    }
    int64_t per_step = md->world * md->M * n;
    /* avg divides by the world over ranks; microbatches and samples are ours. */
    float scale = 1.0f / (float)(md->M * n) / (md->avg ? 1.0f : (float)md->world);
    for (int64_t step = 0; step < o->steps; step++) {
        CHECKGOTO(mfsdp_step_begin(rt));
        for (int64_t mb = 0; mb < md->M; mb++) {
            load_batch(md, &w, step * per_step + (mb * md->world + rank) * n, n);
            for (int l = 0; l < md->nlayers; l++) {
                const layer *ly = &md->layers[l];
                CHECKGOTO(mfsdp_forward_pre(rt, ly->unit, mb));
                for (int b = 0; b < 2; b++) {
                    const mfsdp_tensor_view *tv = &views[b ? ly->b : ly->w];
                    for (int64_t i = 0; i < tv->numel; i++)
                        W[b ? ly->b : ly->w][i] = load(tv->weight, tv->weight_dtype, i);
                }
                forward_layer(md, &w, l, W[ly->w], W[ly->b], n);
                CHECKGOTO(mfsdp_forward_post(rt, ly->unit, mb));
            }
            output_grad(md, &w, n, scale);
            for (int l = md->nlayers - 1; l >= 0; l--) {
                const layer *ly = &md->layers[l];
                CHECKGOTO(mfsdp_backward_pre(rt, ly->unit, mb));
                const mfsdp_tensor_view *tw = &views[ly->w];
                for (int64_t i = 0; i < tw->numel; i++)
                    W[ly->w][i] = load(tw->weight, tw->weight_dtype, i);
                backward_layer(md, &w, l, W[ly->w], G[ly->w], G[ly->b], n);
                for (int b = 0; b < 2; b++) {
                    int k = b ? ly->b : ly->w;
                    for (int64_t i = 0; i < views[k].numel; i++)
                        store(views[k].grad_local, views[k].grad_local_dtype, i, G[k][i]);
                }
                CHECKGOTO(mfsdp_backward_post(rt, ly->unit, mb));
            }
        }
        CHECKGOTO(mfsdp_step_end(rt));
        for (int k = 0; k < nt; k++) {
            const mfsdp_tensor_view *tv = &views[k];
            for (int64_t i = 0; i < tv->shard_count; i++)
                g[k][i] = load(tv->grad, tv->grad_dtype, i);
            optim_step(j->op, step + 1, tv->main_weight, g[k], m[k], v[k], tv->shard_count);
        }
    }
    for (int k = 0; k < nt; k++) {
        const mfsdp_tensor_view *tv = &views[k];
        double d = 0;
        for (int64_t i = 0; i < tv->shard_count; i++) {
            double e = fabs((double)((float *)tv->main_weight)[i] - j->ref->param[k][tv->shard_offset + i]);
            if (e > d || e != e)
                d = e;
        }
        j->maxdiff[k] = d;
    }
    j->failed = 0;
done:
    mfsdp_destroy(rt);
    for (int k = 0; k < nt; k++) {
        if (W)
            free(W[k]);
        if (G)
            free(G[k]);
        if (m)
            free(m[k]);
        if (v)
            free(v[k]);
        if (g)
            free(g[k]);
    }
    free(W);
    free(G);
    free(m);
    free(v);
    free(g);
    free(views);
    work_free(md, &w);
}

static void *rank_thread(void *p)
{
    rank_main(p);
    return NULL;
}

/* max over tensors of max |a - b| / max |b| */
static double rel_err(const model *md, const reference *ref, const double *maxdiff, int nt)
{
    double worst = 0;
    for (int k = 0; k < nt; k++) {
        int64_t n = tensor_numel(md, k);
        double mag = 0;
        for (int64_t i = 0; i < n; i++)
            if (fabs(ref->param[k][i]) > mag)
                mag = fabs(ref->param[k][i]);
        double e = maxdiff[k] / (mag > 0 ? mag : 1.0);
        if (e > worst || e != e)
            worst = e;
    }
    return worst;
}

static double default_tol(const model *md)
{
    if (md->fp32_only)
        return 1e-5;
    return md->least == MFSDP_BF16 ? 3e-2 : 5e-3;
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mfsdp-mlp [--backend local|mpi] [--schedule FILE | --spec FILE] [--steps S]\n"
            "                 [--optimizer sgd|adam] [--batch B] [--tol T]\n"
            "Trains an MLP (one unit per layer: <unit>.weight [out, in], <unit>.bias [out])\n"
            "with libmfsdp on every rank of the schedule's mesh, trains the same model in one\n"
            "process on the whole global batch, and prints max_rel_err= between the two.\n"
            "  --schedule FILE  a compiled schedule (default: %s)\n"
            "  --spec FILE      compile this spec with mfsdpc first ($MFSDPC or %s)\n"
            "  --steps S        optimizer steps (default 5)\n"
            "  --optimizer      sgd (lr 0.1, default) or adam (lr 0.01)\n"
            "  --batch B        samples per rank per microbatch (default 4)\n"
            "  --tol T          failure threshold (default 1e-5 for fp32 schedules, 3e-2 with\n"
            "                   bf16, 5e-3 with fp16)\n",
            MLP_DEFAULT_SCHEDULE, MLP_MFSDPC);
}

static int parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "local";
    o->schedule = MLP_DEFAULT_SCHEDULE;
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
    const char *mfsdpc = getenv("MFSDPC") ? getenv("MFSDPC") : MLP_MFSDPC;
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
    rank_job *jobs = NULL;
    pthread_t *th = NULL;
    int64_t nranks = mpi ? 1 : md.world;
    double *maxdiff = calloc((size_t)(nt * nranks), sizeof *maxdiff);
    double *worst = calloc((size_t)nt, sizeof *worst);
    jobs = calloc((size_t)nranks, sizeof *jobs);
    th = calloc((size_t)nranks, sizeof *th);
    mfsdp_local_group *g = NULL;
    if (!maxdiff || !worst || !jobs || !th || reference_train(&md, o, &op, nt, &ref) != 0) {
        fprintf(stderr, "mfsdp-mlp: error: out of memory\n");
        goto done;
    }
    if (!mpi && mfsdp_local_group_create(md.world, &g) != MFSDP_OK) {
        fprintf(stderr, "mfsdp-mlp: error: %s\n", mfsdp_last_error(NULL));
        goto done;
    }
    for (int64_t r = 0; r < nranks; r++) {
        rank_job *j = &jobs[r];
        j->sh = sh;
        mfsdp_config_init(&j->cfg);
        j->cfg.timeout_ms = 120000;
        if (mpi) {
#ifdef MLP_WITH_MPI
            mfsdp_config_set_mpi(&j->cfg, mpi_comm);
            j->cfg.rank = mpi_rank;
#endif
        } else {
            j->cfg.local_group = g;
            j->cfg.rank = r;
        }
        j->md = &md;
        j->o = o;
        j->op = &op;
        j->ref = &ref;
        j->maxdiff = maxdiff + r * nt;
    }
    if (mpi) {
        rank_main(&jobs[0]);
    } else {
        int64_t started = 0;
        for (; started < nranks; started++)
            if (pthread_create(&th[started], NULL, rank_thread, &jobs[started]) != 0)
                break;
        for (int64_t r = 0; r < started; r++)
            pthread_join(th[r], NULL);
        if (started != nranks) {
            fprintf(stderr, "mfsdp-mlp: error: cannot start %lld threads\n", (long long)nranks);
            goto done;
        }
    }
    int failed = 0;
    for (int64_t r = 0; r < nranks; r++)
        if (jobs[r].failed) {
            fprintf(stderr, "mfsdp-mlp: error: %s\n", jobs[r].msg);
            failed = 1;
        }
    for (int64_t r = 0; r < nranks; r++)
        for (int k = 0; k < nt; k++)
            if (maxdiff[r * nt + k] > worst[k] || maxdiff[r * nt + k] != maxdiff[r * nt + k])
                worst[k] = maxdiff[r * nt + k];
#ifdef MLP_WITH_MPI
    if (mpi) {
        int any = failed;
        MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, *(MPI_Comm *)mpi_comm);
        MPI_Allreduce(MPI_IN_PLACE, worst, nt, MPI_DOUBLE, MPI_MAX, *(MPI_Comm *)mpi_comm);
        failed = any;
    }
#endif
    if (failed) {
        rc = 1;
        goto done;
    }
    double e = rel_err(&md, &ref, worst, nt), tol = o->tol > 0 ? o->tol : default_tol(&md);
    if (mpi_rank == 0) {
        printf("mfsdp-mlp: %s: %d layers, %lld ranks, %lld microbatches x %lld samples per rank, "
               "%lld steps of %s\n",
               o->spec ? o->spec : o->schedule, md.nlayers, (long long)md.world, (long long)md.M,
               (long long)o->batch, (long long)o->steps, o->adam ? "adam" : "sgd");
        printf("max_rel_err=%.3e (tolerance %.1e)\n", e, tol);
        printf("memory: allocated %lld bytes per rank (one arena), the schedule's peak %lld bytes\n",
               (long long)jobs[0].allocated, (long long)mfsdp_schedule_peak_bytes(jobs[0].sh));
    }
    rc = e <= tol ? 0 : 1;
    if (rc && mpi_rank == 0)
        fprintf(stderr, "mfsdp-mlp: the data-parallel run differs from single-process training\n");
done:
    mfsdp_local_group_destroy(g);
    reference_free(&ref, nt);
    free(maxdiff);
    free(worst);
    free(jobs);
    free(th);
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
