/*
 * mf_backend_nccl: the production GPU backend, one rank per GPU over NCCL
 * (docs/gpu.md), in the engine's native model (mf_backend.h).
 *
 * Communicators: at open the backend makes its own world communicator
 * (ncclCommSplit of the trainer's, or ncclCommInitRankConfig from a unique id,
 * or a world of one), so its traffic never interleaves with the trainer's; at
 * comm_init it splits one communicator per (stream, axis) the schedule uses,
 * color = mf_mesh_axis_color(), key = the coordinate on the axis
 * (mf_gpu_split(); checked against the engine's table), so inner and outer
 * traffic never share a communicator.
 *
 * Ops: a collective is one ncclAllGather / ncclReduceScatter / ncclAllReduce
 * (ncclAvg or ncclSum per the schedule) on its stream; the plan's groups
 * (consecutive collectives of one hook on one stream and communicator) are
 * issued as one ncclGroupStart/End: their members are deferred until the last
 * one is submitted (nothing else can come between them by construction), so no
 * group is ever left open across hooks or after an error. Local ops and events
 * go through mf_backend_cuda.c.
 *
 * Errors and hangs: every NCCL call is checked; with nonblocking communicators
 * an ncclInProgress result is polled (ncclCommGetAsyncError) until it settles,
 * bounded by the timeout. The optional watchdog thread polls every
 * communicator's asynchronous error and the completion of the oldest in-flight
 * collective per stream (an event recorded after it); on an error or a timeout
 * it records the failure in the runtime (sticky: the next hook returns it) and
 * aborts every communicator (ncclCommAbort), which ends the NCCL kernels that
 * wait for a dead peer. NCCL API calls and the abort are serialized by `mu`
 * (each call is short: nonblocking communicators never block the host), so no
 * call ever runs on an aborted communicator.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mf_backend_cuda.h"
#include "mf_cuda_kernels.h"

#define MF_TRACK 64 /* in-flight collectives tracked per stream */

typedef struct track_ring {
    cudaEvent_t ev[MF_TRACK];
    int op[MF_TRACK];
    int64_t t_ns[MF_TRACK];
    int head, count;              /* oldest entry, entries in use */
} track_ring;

typedef struct nccl_be {
    mf_cuda_core core;            /* first: mfsdp_nccl_stream() reads it */
    mfsdp_nccl_config nc;
    bool nonblocking;
    ncclComm_t world;             /* own world communicator */
    int ncomms;
    ncclComm_t *comms;            /* per engine communicator (rt->comms order) */
    void **reg;                   /* [ncomms * MF_NCCL_MAX_REG] registration handles */
    int nreg;                     /* regions registered per communicator */
    pthread_mutex_t mu;           /* NCCL calls vs abort */
    bool mu_ready;
    bool aborted;
    /* the deferred group */
    int *pending;                 /* op ids */
    int npending;
    /* watchdog */
    pthread_t wd;
    bool wd_started, wd_stop;
    pthread_mutex_t wd_mu;        /* wd_stop, the tracking rings */
    pthread_cond_t wd_cv;
    bool wd_ready;
    track_ring ring[MF_STREAM_COUNT];
} nccl_be;

#define MF_NCCL_MAX_REG 64

static nccl_be *be_of(mf_rt *rt)
{
    return (nccl_be *)rt->be_state;
}

/* "<what>: <nccl error string> (<ncclGetLastError>)" */
static mfsdp_result nccl_fail(ncclResult_t r, ncclComm_t comm, char *err, size_t errlen, const char *what)
{
    const char *last = ncclGetLastError(comm);
    snprintf(err, errlen, "%s: %s%s%s%s", what, ncclGetErrorString(r), last && *last ? " (" : "",
             last && *last ? last : "", last && *last ? ")" : "");
    return mf_nccl_map_error(r);
}

/* Polls a nonblocking communicator until its pending call settled; bounded by
 * the timeout. Call with mu held; it is released between polls. */
static ncclResult_t settle(nccl_be *be, ncclComm_t comm, ncclResult_t r, bool *timed_out)
{
    *timed_out = false;
    int64_t t0 = mf_rt_now_ns();
    for (int iter = 0; r == ncclInProgress; iter++) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(comm, &state);
        if (q != ncclSuccess)
            return q;
        if (state != ncclInProgress)
            return state;
        if (be->core.timeout_ms > 0 && (mf_rt_now_ns() - t0) / 1000000 >= be->core.timeout_ms) {
            *timed_out = true;
            return ncclInProgress;
        }
        pthread_mutex_unlock(&be->mu);
        struct timespec ts = {0, iter < 100 ? 10000 : 1000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&be->mu);
        if (be->aborted)
            return ncclRemoteError;
    }
    return r;
}

/* Settles r on comm and formats a failure. Call with mu held. */
static mfsdp_result check_nccl(nccl_be *be, ncclComm_t comm, ncclResult_t r, char *err, size_t errlen,
                               const char *what)
{
    bool timed_out = false;
    if (r == ncclInProgress && be->nonblocking)
        r = settle(be, comm, r, &timed_out);
    if (r == ncclSuccess)
        return MFSDP_OK;
    if (timed_out) {
        snprintf(err, errlen, "%s: still in progress after %lld ms (a peer did not join)", what,
                 (long long)be->core.timeout_ms);
        return MFSDP_ERR_TIMEOUT;
    }
    if (be->aborted) {
        snprintf(err, errlen, "%s: the communicators were aborted after an earlier failure", what);
        return MFSDP_ERR_ABORTED;
    }
    return nccl_fail(r, comm, err, errlen, what);
}

/* Aborts every communicator once; any thread. */
static void abort_all(nccl_be *be)
{
    if (!be->mu_ready)
        return;
    pthread_mutex_lock(&be->mu);
    if (!be->aborted) {
        be->aborted = true;
        for (int i = 0; i < be->ncomms; i++)
            if (be->comms[i])
                ncclCommAbort(be->comms[i]);
        if (be->world)
            ncclCommAbort(be->world);
    }
    pthread_mutex_unlock(&be->mu);
}

/* ---- watchdog ---- */

/* One pass: asynchronous errors, then the oldest in-flight collective of each
 * stream. Returns non-OK with a message when the runtime must fail. */
static mfsdp_result watch_once(nccl_be *be, char *err, size_t errlen)
{
    mf_rt *rt = be->core.rt;
    pthread_mutex_lock(&be->mu);
    mfsdp_result res = MFSDP_OK;
    for (int i = -1; i < be->ncomms && res == MFSDP_OK && !be->aborted; i++) {
        ncclComm_t comm = i < 0 ? be->world : be->comms[i];
        if (!comm)
            continue;
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(comm, &state);
        if (q == ncclSuccess && (state == ncclSuccess || state == ncclInProgress))
            continue;
        char what[200];
        if (i < 0)
            snprintf(what, sizeof what, "rank %lld: watchdog: the world communicator reported an error",
                     (long long)rt->rank);
        else
            snprintf(what, sizeof what, "rank %lld: watchdog: the %s communicator of axis %s reported an error",
                     (long long)rt->rank, mf_stream_name(rt->comms[i].stream),
                     rt->s->mesh.axes[rt->comms[i].axis].name);
        res = nccl_fail(q != ncclSuccess ? q : state, comm, err, errlen, what);
        if (res == MFSDP_ERR_TIMEOUT) /* cannot be: in progress is filtered above */
            res = MFSDP_ERR_BACKEND;
    }
    pthread_mutex_unlock(&be->mu);
    if (res != MFSDP_OK || atomic_load(&be->core.capturing))
        return res;

    int64_t now = mf_rt_now_ns();
    pthread_mutex_lock(&be->wd_mu);
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT && res == MFSDP_OK; st++) {
        track_ring *q = &be->ring[st];
        while (q->count > 0) {
            cudaError_t e = cudaEventQuery(q->ev[q->head]);
            if (e == cudaSuccess) {
                q->head = (q->head + 1) % MF_TRACK;
                q->count--;
                continue;
            }
            int64_t ms = (now - q->t_ns[q->head]) / 1000000;
            if (e != cudaErrorNotReady) {
                res = mf_cuda_fail(e, err, errlen, "rank %lld: watchdog: the %s stream failed", (long long)rt->rank,
                                   mf_stream_name((mf_stream)st));
            } else if (be->core.timeout_ms > 0 && ms >= be->core.timeout_ms) {
                char what[200];
                mf_rt_describe_op(rt, q->op[q->head], what, sizeof what);
                snprintf(err, errlen,
                         "rank %lld: watchdog: %s on the %s stream has not completed after %lld ms (timeout %lld "
                         "ms): a peer stopped or died; the communicators were aborted",
                         (long long)rt->rank, what, mf_stream_name((mf_stream)st), (long long)ms,
                         (long long)be->core.timeout_ms);
                res = MFSDP_ERR_TIMEOUT;
            }
            break;
        }
    }
    pthread_mutex_unlock(&be->wd_mu);
    return res;
}

static void *watchdog_main(void *arg)
{
    nccl_be *be = arg;
    cudaSetDevice(be->core.device);
    pthread_mutex_lock(&be->wd_mu);
    while (!be->wd_stop) {
        struct timespec deadline = mf_rt_deadline(be->nc.watchdog_poll_ms);
        while (!be->wd_stop && mf_rt_cond_wait(&be->wd_cv, &be->wd_mu, be->nc.watchdog_poll_ms, &deadline) != ETIMEDOUT)
            ;
        if (be->wd_stop)
            break;
        pthread_mutex_unlock(&be->wd_mu);
        char msg[MF_RT_ERRLEN];
        mfsdp_result r = watch_once(be, msg, sizeof msg);
        if (r != MFSDP_OK) {
            mf_rt_fail(be->core.rt, r, msg);
            abort_all(be);
            pthread_mutex_lock(&be->wd_mu);
            break;
        }
        pthread_mutex_lock(&be->wd_mu);
    }
    pthread_mutex_unlock(&be->wd_mu);
    return NULL;
}

/* Records a tracking event after a collective (eager launches only). */
static void track(nccl_be *be, mf_stream st, int op)
{
    if (!be->wd_started || atomic_load(&be->core.capturing))
        return;
    pthread_mutex_lock(&be->wd_mu);
    track_ring *q = &be->ring[st];
    if (q->count < MF_TRACK) { /* when full, the older entries already witness a stall */
        int slot = (q->head + q->count) % MF_TRACK;
        if (cudaEventRecord(q->ev[slot], be->core.stream[st]) == cudaSuccess) {
            q->op[slot] = op;
            q->t_ns[slot] = mf_rt_now_ns();
            q->count++;
        }
    }
    pthread_mutex_unlock(&be->wd_mu);
}

/* ---- vtbl ---- */

static mfsdp_result nccl_open(mf_rt *rt, const mfsdp_config *cfg, int64_t *rank, int64_t *world)
{
    nccl_be *be = mf_rt_calloc(1, sizeof *be);
    if (!be)
        return mf_rt_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (nccl backend)");
    rt->be_state = be;
    be->core.timeout_ms = cfg->timeout_ms; /* bounds the communicator setup below */
    mf_cuda_config_resolve(cfg, &be->nc);
    /* Everything that can be checked without the device, first. */
    mfsdp_result cr = mf_cuda_config_check(rt, &be->nc);
    if (cr != MFSDP_OK)
        return cr;
    int64_t mesh_world = rt->s->mesh.world;
    if (!be->nc.world_comm && !be->nc.has_unique_id && mesh_world != 1)
        return mf_rt_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                               "the schedule's mesh has %lld ranks: pass world_comm or a unique id in the "
                               "mfsdp_nccl_config (backend_config)",
                               (long long)mesh_world);
    if (!be->nc.world_comm && be->nc.has_unique_id && (cfg->rank < 0 || cfg->rank >= mesh_world))
        return mf_rt_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                               "with a unique id, cfg->rank must be this rank in [0, %lld), not %lld",
                               (long long)mesh_world, (long long)cfg->rank);
    /* The watchdog aborts from its own thread: only safe when no NCCL call
     * blocks the host, i.e. with nonblocking communicators. */
    be->nonblocking = (be->nc.flags & MFSDP_NCCL_NONBLOCKING) || be->nc.watchdog_poll_ms > 0;
    if (pthread_mutex_init(&be->mu, NULL) != 0)
        return mf_rt_set_error(rt, MFSDP_ERR_INTERNAL, "cannot initialize a mutex");
    be->mu_ready = true;
    if (pthread_mutex_init(&be->wd_mu, NULL) != 0)
        return mf_rt_set_error(rt, MFSDP_ERR_INTERNAL, "cannot initialize a mutex");
    if (mf_rt_cond_init(&be->wd_cv) != 0) {
        pthread_mutex_destroy(&be->wd_mu);
        return mf_rt_set_error(rt, MFSDP_ERR_INTERNAL, "cannot initialize a condition variable");
    }
    be->wd_ready = true;
    be->pending = mf_rt_calloc((size_t)(rt->s->nops ? rt->s->nops : 1), sizeof *be->pending);
    if (!be->pending)
        return mf_rt_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (nccl groups)");
    if (!(be->nc.flags & MFSDP_NCCL_NO_IMPLICIT_ORDER))
        setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
    int device = -1;
    cr = mf_cuda_device_pick(rt, &be->nc, &device); /* before NCCL binds the communicator to it */
    if (cr != MFSDP_OK)
        return cr;

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = be->nonblocking ? 0 : 1;
    config.commName = "mfsdp-world";
    char msg[MF_RT_ERRLEN];
    mfsdp_result res = MFSDP_OK;
    int n = 0, r = 0;
    ncclResult_t nr;
    pthread_mutex_lock(&be->mu);
    if (be->nc.world_comm) {
        if ((nr = ncclCommCount(be->nc.world_comm, &n)) != ncclSuccess ||
            (nr = ncclCommUserRank(be->nc.world_comm, &r)) != ncclSuccess) {
            res = nccl_fail(nr, be->nc.world_comm, msg, sizeof msg, "cannot query the trainer's world communicator");
            goto unlock;
        }
        if (cfg->rank >= 0 && cfg->rank != r) {
            res = MFSDP_ERR_INVALID_ARGUMENT;
            snprintf(msg, sizeof msg, "cfg->rank is %lld but this rank is %d in the world communicator",
                     (long long)cfg->rank, r);
            goto unlock;
        }
        nr = ncclCommSplit(be->nc.world_comm, 0, r, &be->world, &config);
        res = check_nccl(be, be->world ? be->world : be->nc.world_comm, nr, msg, sizeof msg,
                         "ncclCommSplit of the trainer's world communicator");
    } else if (be->nc.has_unique_id) {
        n = (int)mesh_world;
        r = (int)cfg->rank;
        nr = ncclCommInitRankConfig(&be->world, n, be->nc.unique_id, r, &config);
        res = check_nccl(be, be->world, nr, msg, sizeof msg, "ncclCommInitRankConfig of the world");
    } else {
        ncclUniqueId id;
        if ((nr = ncclGetUniqueId(&id)) != ncclSuccess) {
            res = nccl_fail(nr, NULL, msg, sizeof msg, "ncclGetUniqueId");
            goto unlock;
        }
        n = 1;
        r = 0;
        nr = ncclCommInitRankConfig(&be->world, 1, id, 0, &config);
        res = check_nccl(be, be->world, nr, msg, sizeof msg, "ncclCommInitRankConfig of a world of one");
    }
unlock:
    pthread_mutex_unlock(&be->mu);
    if (res == MFSDP_ERR_TIMEOUT)
        abort_all(be); /* a peer never joined: do not leave a half-built communicator */
    if (res != MFSDP_OK)
        return mf_rt_set_error(rt, res, "%s", msg);
    *rank = r;
    *world = n;
    return mf_cuda_core_open(&be->core, rt, &be->nc, r);
}

static mfsdp_result nccl_alloc(mf_rt *rt, size_t bytes, void **out)
{
    return mf_cuda_core_alloc(&be_of(rt)->core, bytes, out);
}

static void nccl_free(mf_rt *rt, void *p)
{
    mf_cuda_core_free(&be_of(rt)->core, p);
}

/* A check between polls: a communicator's asynchronous error ends the wait. */
static mfsdp_result async_check(void *ctx, char *err, size_t errlen)
{
    nccl_be *be = ctx;
    pthread_mutex_lock(&be->mu);
    mfsdp_result res = MFSDP_OK;
    if (be->aborted) {
        snprintf(err, errlen, "rank %lld: the communicators were aborted after a failure", (long long)be->core.rt->rank);
        res = MFSDP_ERR_ABORTED;
    }
    for (int i = -1; i < be->ncomms && res == MFSDP_OK; i++) {
        ncclComm_t comm = i < 0 ? be->world : be->comms[i];
        ncclResult_t state = ncclSuccess;
        if (!comm || ncclCommGetAsyncError(comm, &state) != ncclSuccess)
            continue;
        if (state != ncclSuccess && state != ncclInProgress)
            res = nccl_fail(state, comm, err, errlen, "a communicator reported an asynchronous error");
    }
    pthread_mutex_unlock(&be->mu);
    return res;
}

static mfsdp_result nccl_exchange(mf_rt *rt, const void *mine, size_t bytes, void *all)
{
    nccl_be *be = be_of(rt);
    mf_cuda_core *c = &be->core;
    char msg[MF_RT_ERRLEN];
    mfsdp_result res = MFSDP_OK;
    cudaStream_t st = c->stream[MF_STREAM_INNER];
    char *d = NULL;
    size_t total = bytes * (size_t)rt->world;
    cudaError_t e = cudaMalloc((void **)&d, total);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(d + (size_t)rt->rank * bytes, mine, bytes, cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess) {
        res = mf_cuda_fail(e, msg, sizeof msg, "exchange: staging %zu bytes on the device", total);
        goto done;
    }
    pthread_mutex_lock(&be->mu);
    ncclResult_t nr = be->aborted ? ncclRemoteError
                                  : ncclAllGather(d + (size_t)rt->rank * bytes, d, bytes, ncclUint8, be->world, st);
    res = check_nccl(be, be->world, nr, msg, sizeof msg, "exchange: ncclAllGather over the world");
    pthread_mutex_unlock(&be->mu);
    /* Wait (bounded) before the copy back: a copy into pageable memory would
     * block the host behind a gather that never ends. */
    if (res == MFSDP_OK)
        res = mf_cuda_core_wait(c, NULL, "exchange over the world", async_check, be, msg, sizeof msg);
    if (res == MFSDP_OK && (e = cudaMemcpy(all, d, total, cudaMemcpyDeviceToHost)) != cudaSuccess)
        res = mf_cuda_fail(e, msg, sizeof msg, "exchange: copying back");
done:
    if (res == MFSDP_ERR_TIMEOUT)
        abort_all(be); /* ends the gather, so the stream drains */
    if (d) {
        cudaStreamSynchronize(st); /* the staging buffer may still be in use after a failure */
        cudaFree(d);
    }
    if (res != MFSDP_OK)
        return mf_rt_set_error(rt, res, "%s", msg);
    return MFSDP_OK;
}

static mfsdp_result nccl_comm_init(mf_rt *rt, const mf_rt_comm *comms, int ncomms)
{
    nccl_be *be = be_of(rt);
    char msg[MF_RT_ERRLEN], what[256];
    mfsdp_result res = MFSDP_OK;
    be->comms = mf_rt_calloc((size_t)(ncomms ? ncomms : 1), sizeof *be->comms);
    be->reg = mf_rt_calloc((size_t)(ncomms ? ncomms : 1) * MF_NCCL_MAX_REG, sizeof *be->reg);
    if (!be->comms || !be->reg)
        return mf_rt_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (communicators)");
    be->ncomms = ncomms;
    for (int i = 0; i < ncomms; i++) {
        const mf_rt_comm *cm = &comms[i];
        int color, key;
        mf_gpu_split(&rt->s->mesh, cm->axis, rt->rank, &color, &key);
        if (color != cm->color || key != cm->coord)
            return mf_rt_set_error(rt, MFSDP_ERR_INTERNAL,
                                   "communicator %d (axis %d): split color/key %d/%d disagree with the engine's "
                                   "%lld/%lld",
                                   i, cm->axis, color, key, (long long)cm->color, (long long)cm->coord);
        char name[96];
        snprintf(name, sizeof name, "mfsdp-%s-%s", rt->s->mesh.axes[cm->axis].name, mf_stream_name(cm->stream));
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = be->nonblocking ? 0 : 1;
        config.commName = name;
        snprintf(what, sizeof what, "ncclCommSplit for axis %s (%s stream, color %d, key %d)",
                 rt->s->mesh.axes[cm->axis].name, mf_stream_name(cm->stream), color, key);
        pthread_mutex_lock(&be->mu);
        ncclResult_t nr = be->aborted ? ncclRemoteError : ncclCommSplit(be->world, color, key, &be->comms[i], &config);
        res = check_nccl(be, be->comms[i] ? be->comms[i] : be->world, nr, msg, sizeof msg, what);
        int n = 0;
        if (res == MFSDP_OK && (nr = ncclCommCount(be->comms[i], &n)) != ncclSuccess)
            res = nccl_fail(nr, be->comms[i], msg, sizeof msg, "ncclCommCount");
        pthread_mutex_unlock(&be->mu);
        if (res == MFSDP_OK && n != cm->nranks) {
            res = MFSDP_ERR_MISMATCH;
            snprintf(msg, sizeof msg, "%s gave %d ranks, the mesh axis has %lld", what, n, (long long)cm->nranks);
        }
        if (res != MFSDP_OK) {
            if (res == MFSDP_ERR_TIMEOUT)
                abort_all(be);
            return mf_rt_set_error(rt, res, "%s", msg);
        }
    }
    /* Register the buffers (one pool, plus any overflow blocks) where NCCL can
     * use them in place (NVLS, CollNet, zero-copy P2P). */
    if (be->core.kind == MF_CUDA_MEM_NCCL) {
        const mf_cuda_block *regions[MF_NCCL_MAX_REG];
        int nr_ = mf_cuda_core_regions(&be->core, regions, MF_NCCL_MAX_REG);
        for (int i = 0; i < ncomms; i++)
            for (int k = 0; k < nr_; k++) {
                pthread_mutex_lock(&be->mu);
                ncclResult_t nr = ncclCommRegister(be->comms[i], regions[k]->p, regions[k]->bytes,
                                                   &be->reg[i * MF_NCCL_MAX_REG + k]);
                res = check_nccl(be, be->comms[i], nr, msg, sizeof msg, "ncclCommRegister");
                pthread_mutex_unlock(&be->mu);
                if (res != MFSDP_OK)
                    return mf_rt_set_error(rt, res, "%s", msg);
            }
        be->nreg = nr_;
    }
    if (be->nc.watchdog_poll_ms > 0) {
        for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++)
            for (int k = 0; k < MF_TRACK; k++) {
                cudaError_t e = cudaEventCreateWithFlags(&be->ring[st].ev[k], cudaEventDisableTiming);
                if (e != cudaSuccess) {
                    res = mf_cuda_fail(e, msg, sizeof msg, "watchdog events");
                    return mf_rt_set_error(rt, res, "%s", msg);
                }
            }
        if (pthread_create(&be->wd, NULL, watchdog_main, be) != 0)
            return mf_rt_set_error(rt, MFSDP_ERR_INTERNAL, "cannot start the watchdog thread");
        be->wd_started = true;
    }
    return MFSDP_OK;
}

/* Enqueues one collective (mu held). `post` receives the copy to run after the
 * NCCL call (in-place reduce-scatter of a rank whose shard is not first). */
typedef struct post_copy {
    void *dst;
    const void *src;
    size_t bytes;
} post_copy;

static ncclResult_t enqueue_collective(nccl_be *be, const mf_rt_op *rop, post_copy *post, cudaError_t *pre_err)
{
    const mf_op *op = rop->op;
    ncclComm_t comm = be->comms[rop->comm];
    cudaStream_t st = be->core.stream[op->stream];
    ncclDataType_t dt = mf_nccl_dtype(op->dtype);
    ncclRedOp_t red = be->core.rt->s->reduce == MF_REDUCE_SUM ? ncclSum : ncclAvg;
    size_t es = mf_dtype_size(op->dtype), n = (size_t)op->count, at = (size_t)rop->coord * n * es;
    *pre_err = cudaSuccess;
    post->bytes = 0;
    switch (op->kind) {
    case MF_OP_ALL_GATHER:
        if (rop->overlap) {
            /* in place: NCCL wants sendbuff == recvbuff + rank * count */
            if (at)
                *pre_err = cudaMemcpyAsync((char *)rop->dst + at, rop->src, n * es, cudaMemcpyDeviceToDevice, st);
            return ncclAllGather((char *)rop->dst + at, rop->dst, n, dt, comm, st);
        }
        return ncclAllGather(rop->src, rop->dst, n, dt, comm, st);
    case MF_OP_REDUCE_SCATTER:
        if (rop->overlap) {
            if (at)
                *post = (post_copy){.dst = rop->dst, .src = (char *)rop->src + at, .bytes = n * es};
            return ncclReduceScatter(rop->src, (char *)rop->src + at, n, dt, red, comm, st);
        }
        return ncclReduceScatter(rop->src, rop->dst, n, dt, red, comm, st);
    case MF_OP_ALL_REDUCE:
        return ncclAllReduce(rop->src, rop->dst, n, dt, red, comm, st);
    default:
        return ncclInvalidUsage;
    }
}

/* Issues the deferred collectives as one group (or one call when alone). */
static mfsdp_result flush_group(nccl_be *be, char *err, size_t errlen)
{
    mf_rt *rt = be->core.rt;
    int n = be->npending;
    be->npending = 0;
    if (n == 0)
        return MFSDP_OK;
    const mf_rt_op *first = &rt->rops[be->pending[0]];
    char what[MF_RT_ERRLEN], desc[200];
    mf_rt_describe_op(rt, be->pending[0], desc, sizeof desc);
    if (n > 1)
        snprintf(what, sizeof what, "rank %lld: %s (ncclGroupStart/End of %d collectives from op %d)",
                 (long long)rt->rank, desc, n, be->pending[0]);
    else
        snprintf(what, sizeof what, "rank %lld: %s", (long long)rt->rank, desc);
    post_copy *posts = mf_rt_calloc((size_t)n, sizeof *posts);
    if (!posts) {
        snprintf(err, errlen, "%s: out of memory", what);
        return MFSDP_ERR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&be->mu);
    mfsdp_result res = MFSDP_OK;
    if (be->aborted) {
        snprintf(err, errlen, "%s: the communicators were aborted after an earlier failure", what);
        res = MFSDP_ERR_ABORTED;
        goto unlock;
    }
    ncclResult_t first_err = ncclSuccess, nr;
    cudaError_t cuda_err = cudaSuccess;
    if (n > 1 && (nr = ncclGroupStart()) != ncclSuccess)
        first_err = nr;
    for (int k = 0; k < n && first_err == ncclSuccess; k++) {
        cudaError_t pe;
        nr = enqueue_collective(be, &rt->rops[be->pending[k]], &posts[k], &pe);
        if (pe != cudaSuccess && cuda_err == cudaSuccess)
            cuda_err = pe;
        if (nr != ncclSuccess && nr != ncclInProgress)
            first_err = nr;
        else if (n == 1)
            first_err = nr;
    }
    if (n > 1) { /* always close the group, even after a failed member */
        nr = ncclGroupEnd();
        if (first_err == ncclSuccess)
            first_err = nr;
    }
    res = check_nccl(be, be->comms[first->comm], first_err, err, errlen, what);
    if (res == MFSDP_OK && cuda_err != cudaSuccess)
        res = mf_cuda_fail(cuda_err, err, errlen, "%s: in-place staging copy", what);
    for (int k = 0; k < n && res == MFSDP_OK; k++) {
        if (!posts[k].bytes)
            continue;
        cudaError_t e = cudaMemcpyAsync(posts[k].dst, posts[k].src, posts[k].bytes, cudaMemcpyDeviceToDevice,
                                        be->core.stream[first->op->stream]);
        if (e != cudaSuccess)
            res = mf_cuda_fail(e, err, errlen, "%s: in-place result copy", what);
    }
unlock:
    pthread_mutex_unlock(&be->mu);
    mf_rt_free(posts);
    if (res == MFSDP_OK)
        track(be, first->op->stream, be->pending[n - 1]);
    else if (res == MFSDP_ERR_TIMEOUT)
        abort_all(be);
    return res;
}

static mfsdp_result nccl_submit(mf_rt *rt, const mf_rt_op *rop, int64_t microbatch, int64_t event_seq, char *err,
                                size_t errlen)
{
    nccl_be *be = be_of(rt);
    mf_cuda_core *c = &be->core;
    const mf_op *op = rop->op;
    mf_gpu_pos pos = mf_cuda_core_pos(c, op, microbatch);
    bool skip = false;
    mfsdp_result res = mf_cuda_core_before(c, rop, pos, &skip, err, errlen);
    if (res != MFSDP_OK)
        return res;
    if (mf_opkind_is_collective(op->kind)) {
        if (rop->comm < 0 || rop->comm >= be->ncomms) {
            snprintf(err, errlen, "rank %lld: op %d has no communicator", (long long)rt->rank, op->id);
            return MFSDP_ERR_INTERNAL;
        }
        const mf_gpu_plan *p = c->plan;
        be->pending[be->npending++] = op->id;
        bool grouped = p->group[pos] && p->group[pos][op->id] >= 0;
        if (grouped && !p->group_end[pos][op->id])
            return MFSDP_OK; /* deferred until the group's last member */
        res = flush_group(be, err, errlen);
    } else if (!skip) {
        if (be->npending) /* cannot be: groups are contiguous runs of collectives */
            res = flush_group(be, err, errlen);
        if (res == MFSDP_OK)
            res = mf_cuda_core_local(c, rop, microbatch, event_seq, err, errlen);
    }
    if (res != MFSDP_OK)
        return res;
    return mf_cuda_core_after(c, rop, pos, err, errlen);
}

static mfsdp_result nccl_synchronize(mf_rt *rt, char *err, size_t errlen)
{
    nccl_be *be = be_of(rt);
    mfsdp_result res = mf_cuda_core_wait(&be->core, NULL, "mfsdp_synchronize", async_check, be, err, errlen);
    if (res == MFSDP_ERR_TIMEOUT)
        abort_all(be);
    return res;
}

static void nccl_abort(mf_rt *rt, const char *why)
{
    (void)why;
    if (rt->be_state)
        abort_all(be_of(rt));
}

static void nccl_close(mf_rt *rt)
{
    nccl_be *be = be_of(rt);
    if (!be)
        return;
    if (be->wd_started) {
        pthread_mutex_lock(&be->wd_mu);
        be->wd_stop = true;
        pthread_cond_broadcast(&be->wd_cv);
        pthread_mutex_unlock(&be->wd_mu);
        pthread_join(be->wd, NULL);
    }
    if (be->core.rt && be->core.stream[MF_STREAM_INNER])
        mf_cuda_core_free(&be->core, NULL); /* drains */
    if (be->mu_ready) {
        pthread_mutex_lock(&be->mu);
        if (!be->aborted) {
            for (int i = 0; i < be->ncomms; i++) {
                if (!be->comms[i])
                    continue;
                for (int k = 0; k < be->nreg; k++)
                    if (be->reg[i * MF_NCCL_MAX_REG + k])
                        ncclCommDeregister(be->comms[i], be->reg[i * MF_NCCL_MAX_REG + k]);
            }
            /* Finalize (flushes, may be in progress on nonblocking comms), then destroy. */
            char msg[MF_RT_ERRLEN];
            for (int i = -1; i < be->ncomms; i++) {
                ncclComm_t comm = i < 0 ? be->world : be->comms[i];
                if (!comm)
                    continue;
                if (check_nccl(be, comm, ncclCommFinalize(comm), msg, sizeof msg, "ncclCommFinalize") != MFSDP_OK)
                    ncclCommAbort(comm);
                else
                    ncclCommDestroy(comm);
            }
        }
        pthread_mutex_unlock(&be->mu);
        pthread_mutex_destroy(&be->mu);
    }
    for (int st = 0; st < MF_STREAM_COUNT; st++)
        for (int k = 0; k < MF_TRACK; k++)
            if (be->ring[st].ev[k])
                cudaEventDestroy(be->ring[st].ev[k]);
    if (be->wd_ready) {
        pthread_cond_destroy(&be->wd_cv);
        pthread_mutex_destroy(&be->wd_mu);
    }
    mf_cuda_core_close(&be->core);
    mf_rt_free(be->comms);
    mf_rt_free(be->reg);
    mf_rt_free(be->pending);
    mf_rt_free(be);
    rt->be_state = NULL;
}

const mf_backend_vtbl mf_backend_nccl = {
    .name = "nccl",
    .caps = MF_BE_NATIVE_STREAMS,
    .open = nccl_open,
    .alloc = nccl_alloc,
    .free = nccl_free,
    .exchange = nccl_exchange,
    .comm_init = nccl_comm_init,
    .collective = NULL,
    .submit = nccl_submit,
    .synchronize = nccl_synchronize,
    .abort = nccl_abort,
    .close = nccl_close,
};
