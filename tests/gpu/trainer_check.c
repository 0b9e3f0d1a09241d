/*
 * trainer_check: the device tests' trainer and checks (trainer_check.h), for
 * any backend through tc_ops.
 */
#include "trainer_check.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_backend.h"
#include "mf_pattern.h"

__attribute__((format(printf, 2, 3))) static bool failf(tc_trainer *tr, const char *fmt, ...)
{
    if (!tr->err[0]) {
        int n = snprintf(tr->err, sizeof tr->err, "rank %lld: ", (long long)tr->rank);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tr->err + n, sizeof tr->err - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool view(tc_trainer *tr, int t, mfsdp_tensor_view *v)
{
    mfsdp_result r = mfsdp_tensor_view_get(tr->rt, t, v);
    return r == MFSDP_OK || failf(tr, "tensor view %d: %s", t, mfsdp_result_string(r));
}

static bool hook(tc_trainer *tr, mfsdp_result r, const char *what, int u, int64_t m)
{
    return r == MFSDP_OK ||
           failf(tr, "%s(unit %d, microbatch %lld): %s: %s", what, u, (long long)m, mfsdp_result_string(r),
                 mfsdp_last_error(tr->rt));
}

/* *buf grown to v's shard_count floats, for a shard of role `what` that must
 * be fp32 (dt); NULL after failf. */
static float *fp32_shard(tc_trainer *tr, float **buf, const mfsdp_tensor_view *v, mfsdp_dtype dt, const char *what)
{
    if (dt != MFSDP_FP32) {
        failf(tr, "%s: %s is not fp32", v->name, what);
        return NULL;
    }
    float *b = realloc(*buf, (size_t)v->shard_count * sizeof *b);
    if (!b) {
        failf(tr, "out of memory");
        return NULL;
    }
    return *buf = b;
}

uint32_t tc_grad_seed(int64_t rank, int64_t m, int t)
{
    return 5000u + 1000u * (uint32_t)rank + 100u * (uint32_t)m + (uint32_t)t;
}

int64_t tc_grad_microbatch(const tc_trainer *tr, int64_t m)
{
    int64_t M = mfsdp_schedule_microbatches(tr->sh);
    return tr->positions && m > 0 && m < M - 1 ? 1 : m;
}

const char *const tc_nccl_modes[] = {"hfsdp", "zero3", "ddp", "hsdp_nosync"};
const int tc_nccl_nmodes = (int)(sizeof tc_nccl_modes / sizeof tc_nccl_modes[0]);
const rt_mesh tc_local_meshes[] = {{"1x4", 2, {1, 4}}, {"2x2", 2, {2, 2}}, {"2x4", 2, {2, 4}}, {"2x2x2", 3, {2, 2, 2}}};
const int tc_local_nmeshes = (int)(sizeof tc_local_meshes / sizeof tc_local_meshes[0]);
const char *const tc_local_modes[] = {"ddp",  "zero1",  "zero3", "hsdp", "hfsdp", "fsdp2d", "zero2_inner_zero1_outer",
                                      "hsdp_nosync"};
const int tc_local_nmodes = (int)(sizeof tc_local_modes / sizeof tc_local_modes[0]);

mf_reduce tc_local_reduce(int k)
{
    return k % 2 ? MF_REDUCE_SUM : MF_REDUCE_AVG;
}

bool tc_open(tc_trainer *tr, mfsdp_runtime *rt, const mfsdp_schedule *sh, int64_t rank, const tc_ops *ops,
             void *ctx)
{
    *tr = (tc_trainer){.rt = rt, .sh = sh, .ops = ops, .ctx = ctx, .rank = rank, .ntensors = mfsdp_num_tensors(rt)};
    for (int w = 0; w < 2; w++) {
        tr->seen[w] = calloc((size_t)tr->ntensors, sizeof *tr->seen[w]);
        if (!tr->seen[w])
            return failf(tr, "out of memory");
    }
    float *host = NULL;
    bool ok = true;
    for (int t = 0; ok && t < tr->ntensors; t++) {
        mfsdp_tensor_view v;
        if (!(ok = view(tr, t, &v)))
            break;
        size_t bytes = (size_t)v.numel * mfsdp_dtype_size(v.weight_dtype);
        for (int w = 0; ok && w < 2; w++)
            if (!(tr->seen[w][t] = ops->alloc(ctx, bytes ? bytes : 1)))
                ok = failf(tr, "cannot allocate %zu bytes for %s's weight copy", bytes, v.name);
        if (!ok || !v.shard_count)
            continue;
        if (!(ok = fp32_shard(tr, &host, &v, v.main_weight_dtype, "main_weight") != NULL))
            break;
        for (int64_t i = 0; i < v.shard_count; i++)
            host[i] = mf_pattern(7 + (uint32_t)t, v.shard_offset + i);
        ok = ops->write(ctx, v.main_weight, host, (size_t)v.shard_count * sizeof *host) ||
             failf(tr, "%s: cannot write main_weight", v.name);
    }
    free(host);
    return ok;
}

void tc_close(tc_trainer *tr)
{
    for (int w = 0; w < 2; w++) {
        for (int t = 0; tr->seen[w] && t < tr->ntensors; t++)
            if (tr->seen[w][t])
                tr->ops->release(tr->ctx, tr->seen[w][t]);
        free(tr->seen[w]);
        tr->seen[w] = NULL;
    }
}

bool tc_poison_grads(tc_trainer *tr)
{
    for (int t = 0; t < tr->ntensors; t++) {
        mfsdp_tensor_view v;
        if (!view(tr, t, &v))
            return false;
        size_t bytes = (size_t)v.shard_count * mfsdp_dtype_size(v.grad_dtype);
        if (!bytes)
            continue;
        void *nan = malloc(bytes);
        if (!nan)
            return failf(tr, "out of memory");
        memset(nan, 0xff, bytes);
        bool ok = tr->ops->write(tr->ctx, v.grad, nan, bytes);
        free(nan);
        if (!ok)
            return failf(tr, "%s: cannot write grad", v.name);
    }
    return true;
}

/* Inside unit u's window w: copy each of its weights out; in the backward
 * window of microbatch m also write its grad_local. */
static bool in_window(tc_trainer *tr, int u, int64_t m, int w)
{
    for (int t = 0; t < tr->ntensors; t++) {
        mfsdp_tensor_view v;
        if (!view(tr, t, &v))
            return false;
        if (v.unit != u)
            continue;
        if (!tr->ops->copy(tr->ctx, tr->seen[w][t], v.weight, (size_t)v.numel * mfsdp_dtype_size(v.weight_dtype)))
            return failf(tr, "%s: cannot copy the weight in its window", v.name);
        uint32_t seed = tc_grad_seed(tr->rank, tc_grad_microbatch(tr, m), t);
        if (w == 1 && !tr->ops->fill(tr->ctx, v.grad_local, v.grad_local_dtype, v.numel, seed))
            return failf(tr, "%s: cannot fill grad_local", v.name);
    }
    return true;
}

bool tc_step(tc_trainer *tr)
{
    mfsdp_runtime *rt = tr->rt;
    int U = mfsdp_schedule_num_units(tr->sh);
    int64_t M = mfsdp_schedule_microbatches(tr->sh);
    for (int64_t m = 0; m < M; m++) {
        if (tr->ops->microbatch_begin && !tr->ops->microbatch_begin(tr->ctx, m))
            return failf(tr, "microbatch %lld: cannot begin", (long long)m);
        if (m == 0 && !hook(tr, mfsdp_step_begin(rt), "step_begin", -1, m))
            return false;
        for (int u = 0; u < U; u++)
            if (!hook(tr, mfsdp_forward_pre(rt, u, m), "forward_pre", u, m) || !in_window(tr, u, m, 0) ||
                !hook(tr, mfsdp_forward_post(rt, u, m), "forward_post", u, m))
                return false;
        for (int u = U - 1; u >= 0; u--)
            if (!hook(tr, mfsdp_backward_pre(rt, u, m), "backward_pre", u, m) || !in_window(tr, u, m, 1) ||
                !hook(tr, mfsdp_backward_post(rt, u, m), "backward_post", u, m))
                return false;
        if (m == M - 1 && !hook(tr, mfsdp_step_end(rt), "step_end", -1, m))
            return false;
        if (tr->ops->microbatch_end && !tr->ops->microbatch_end(tr->ctx, m))
            return failf(tr, "microbatch %lld: cannot end", (long long)m);
    }
    return true;
}

/* The numel weights of tensor t at w (host copy) equal the cast main_weight;
 * `where` names the copy in the message. */
static bool weights_ok(tc_trainer *tr, const mfsdp_tensor_view *v, int t, const void *dev, const char *where)
{
    size_t es = mfsdp_dtype_size(v->weight_dtype);
    unsigned char *w = malloc((size_t)v->numel * es + 1);
    if (!w)
        return failf(tr, "out of memory");
    bool ok = tr->ops->read(tr->ctx, w, dev, (size_t)v->numel * es) || failf(tr, "%s: cannot read the weight", v->name);
    for (int64_t i = 0; ok && i < v->numel; i++) {
        unsigned char want[4];
        mf_dtype_store(want, (mf_dtype)v->weight_dtype, 0, mf_pattern(7 + (uint32_t)t, i));
        if (memcmp(w + (size_t)i * es, want, es))
            ok = failf(tr, "%s: weight element %lld %s is %g, not the cast main_weight %g", v->name, (long long)i, where,
                       (double)mf_dtype_load(w, (mf_dtype)v->weight_dtype, i), (double)mf_pattern(7 + (uint32_t)t, i));
    }
    free(w);
    return ok;
}

/* Every op issued so far has completed. */
static bool synchronized(tc_trainer *tr)
{
    mfsdp_result r = mfsdp_synchronize(tr->rt);
    return r == MFSDP_OK ||
           failf(tr, "synchronize: %s: %s", mfsdp_result_string(r), mfsdp_last_error(tr->rt));
}

bool tc_verify(tc_trainer *tr)
{
    if (!synchronized(tr))
        return false;
    int64_t N = mfsdp_schedule_world_size(tr->sh), M = mfsdp_schedule_microbatches(tr->sh);
    bool avg = mfsdp_schedule_reduce_is_avg(tr->sh);
    float *got = NULL;
    bool ok = true;
    for (int t = 0; ok && t < tr->ntensors; t++) {
        mfsdp_tensor_view v;
        if (!(ok = view(tr, t, &v)))
            break;
        if (v.shard_count) {
            if (!(ok = fp32_shard(tr, &got, &v, v.grad_dtype, "the delivered gradient") != NULL))
                break;
            ok = tr->ops->read(tr->ctx, got, v.grad, (size_t)v.shard_count * sizeof *got) ||
                 failf(tr, "%s: cannot read grad", v.name);
            for (int64_t i = 0; ok && i < v.shard_count; i++) {
                int64_t at = v.shard_offset + i;
                double want = 0;
                for (int64_t rk = 0; rk < N; rk++)
                    for (int64_t m = 0; m < M; m++) {
                        unsigned char local[4]; /* as grad_local holds it */
                        uint32_t seed = tc_grad_seed(rk, tc_grad_microbatch(tr, m), t);
                        mf_dtype_store(local, (mf_dtype)v.grad_local_dtype, 0, mf_pattern(seed, at));
                        want += mf_dtype_load(local, (mf_dtype)v.grad_local_dtype, 0);
                    }
                if (avg)
                    want /= (double)N;
                if ((double)got[i] != want)
                    ok = failf(tr, "%s: gradient element %lld is %g, want %g", v.name, (long long)at, (double)got[i],
                               want);
            }
        }
        ok = ok && weights_ok(tr, &v, t, tr->seen[0][t], "in its forward window") &&
             weights_ok(tr, &v, t, tr->seen[1][t], "in its backward window");
    }
    free(got);
    return ok;
}

bool tc_train(tc_trainer *tr, int steps)
{
    for (int s = 0; s < steps; s++)
        if (!tc_poison_grads(tr) || !tc_step(tr) || !tc_verify(tr))
            return false;
    return true;
}

bool tc_verify_weights_after_step(tc_trainer *tr)
{
    if (!synchronized(tr))
        return false;
    for (int t = 0; t < tr->ntensors; t++) {
        mfsdp_tensor_view v;
        if (!view(tr, t, &v) || !weights_ok(tr, &v, t, v.weight, "after the step"))
            return false;
    }
    return true;
}

typedef struct thread_rank {
    tc_rank_main rank_main;
    void *arg;
    mfsdp_local_group *g;
    int64_t rank;
    bool ok;
    char err[512];
} thread_rank;

static void *thread_rank_main(void *p)
{
    thread_rank *a = p;
    a->ok = a->rank_main(a->arg, a->g, a->rank, a->err, sizeof a->err);
    return NULL;
}

bool tc_run_thread_ranks(const mfsdp_schedule *sh, tc_rank_main rank_main, void *arg, char *err, size_t errlen)
{
    int64_t N = mfsdp_schedule_world_size(sh);
    mfsdp_local_group *g = NULL;
    thread_rank *ranks = calloc((size_t)N, sizeof *ranks);
    pthread_t *th = calloc((size_t)N, sizeof *th);
    int64_t started = 0;
    bool ok = ranks && th && mfsdp_local_group_create(N, &g) == MFSDP_OK;
    if (!ok)
        snprintf(err, errlen, "cannot set up %lld thread-ranks", (long long)N);
    for (; ok && started < N; started++) {
        ranks[started] = (thread_rank){.rank_main = rank_main, .arg = arg, .g = g, .rank = started};
        if (pthread_create(&th[started], NULL, thread_rank_main, &ranks[started])) {
            /* the ranks already started wait for this one until their timeout */
            snprintf(err, errlen, "cannot start thread-rank %lld", (long long)started);
            ok = false;
            break;
        }
    }
    for (int64_t r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    for (int64_t r = 0; ok && r < N; r++)
        if (!ranks[r].ok) {
            snprintf(err, errlen, "%s", ranks[r].err[0] ? ranks[r].err : "a rank failed without a message");
            ok = false;
        }
    mfsdp_local_group_destroy(g);
    free(ranks);
    free(th);
    return ok;
}
