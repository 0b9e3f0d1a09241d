/*
 * mf_backend_nccl: the production GPU backend, one rank per GPU over NCCL
 * (docs/gpu.md), in the engine's native model (mf_backend.h).
 *
 * Communicators: at open the backend makes its own world communicator
 * (ncclCommSplit of the trainer's, or ncclCommInitRankConfig from a unique id,
 * or a world of one), so its traffic never interleaves with the trainer's; at
 * comm_init it splits one communicator per (stream, axis) the schedule uses,
 * color = mf_layout_axis_color(), key = the coordinate on the axis
 * (mf_gpu_plan_split(); checked against the engine's table), so inner and outer
 * traffic never share a communicator.
 *
 * Ops: a collective is one ncclAllGather / ncclReduceScatter / ncclAllReduce
 * (ncclAvg or ncclSum per the schedule) on its stream; the plan's groups
 * (consecutive collectives of one hook on one stream and communicator) are
 * issued as one ncclGroupStart/End: their members are deferred until the last
 * one is submitted (nothing else can come between them by construction), so no
 * group is ever left open across hooks or after an error (mf_cuda_nccl_group_issue:
 * ncclGroupEnd exactly when ncclGroupStart succeeded); a flush allocates
 * nothing (the pending list and the post-copies are sized at open). Local ops and events
 * go through mf_cuda.c.
 *
 * Errors and hangs: every NCCL call is checked. Communicators are blocking by
 * default (a nonblocking group costs a host thread per collective in NCCL
 * 2.28); with MFSDP_NCCL_NONBLOCKING an ncclInProgress result is polled
 * (ncclCommGetAsyncError) until it settles, bounded by the timeout. The
 * optional watchdog (mf_cuda_guard.c) polls every communicator's
 * asynchronous error, the completion of the oldest in-flight collective per
 * stream and how long an NCCL call of the trainer has been running; on an
 * error or a timeout it records the failure in the runtime (sticky: the next
 * hook returns it) and aborts every communicator (ncclCommAbort), which ends
 * the NCCL kernels that wait for a dead peer. NCCL API calls are serialized
 * by `mu`; the abort takes it too unless the trainer is stuck inside a call
 * (see the guard). Collectives on the compute stream are refused at open.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mf_cuda.h"
#include "mf_cuda_kernels.h"
#include "mf_free.h"

/* A copy to run after a collective's NCCL call, then a zero fill. */
typedef struct post_copy {
    void *dst;
    const void *src;
    size_t bytes;
    void *zero;                   /* padding to zero-fill after the copy (prefix form) */
    size_t zero_bytes;
} post_copy;

typedef struct nccl_be {
    mf_cuda_core core;            /* first: mfsdp_nccl_stream() reads it */
    mfsdp_nccl_config nc;
    bool nonblocking;
    ncclComm_t world;             /* own world communicator */
    int ncomms;
    ncclComm_t *comms;            /* per engine communicator (rt->comms order) */
    char (*names)[96];            /* per communicator: config.commName, alive as long as it */
    const char **name_ptrs;       /* the same, for the watchdog's messages */
    void **reg;                   /* [ncomms * MF_NCCL_MAX_REG] registration handles */
    int nreg;                     /* regions per communicator in reg (NULL: not registered) */
    pthread_mutex_t mu;           /* NCCL calls vs abort */
    bool mu_ready;
    /* the deferred group */
    int *pending;                 /* op ids */
    int npending;
    post_copy *posts;             /* per pending collective: its copy after the call
                                     (allocated at open: nothing per flush) */
    mf_watch watch;               /* the aborted flag; the watchdog thread when started */
    /* the small exchange (the ranks' agreement, mf_agree.c): made at open */
    cudaStream_t xs;              /* its own non-blocking stream */
    cudaEvent_t xev;              /* recorded after the copy back */
    char *xdev;                   /* device: world * MF_NCCL_XCHG_BYTES */
    char *xhost;                  /* pinned host: the same */
} nccl_be;

/* Exchanges up to this many bytes per rank take the small path. */
#define MF_NCCL_XCHG_BYTES 128

#define MF_NCCL_MAX_REG 64

static nccl_be *be_of(mf_rt *rt)
{
    return (nccl_be *)rt->be_state;
}

static bool aborted(const nccl_be *be)
{
    return mf_watch_aborted(&be->watch);
}

/* "<what>: <nccl error string> (<ncclGetLastError>)" */
static mfsdp_result nccl_fail(ncclResult_t r, ncclComm_t comm, char *err, size_t errlen, const char *what)
{
    const char *last = ncclGetLastError(comm);
    snprintf(err, errlen, "%s: %s%s%s%s", what, ncclGetErrorString(r), last && *last ? " (" : "",
             last && *last ? last : "", last && *last ? ")" : "");
    return mf_cuda_nccl_map_error(r);
}

/* Polls a nonblocking communicator until its pending call settled; bounded by
 * the timeout. Call with mu held; it is released between polls. */
static ncclResult_t settle(nccl_be *be, ncclComm_t comm, ncclResult_t r, bool *timed_out)
{
    *timed_out = false;
    int64_t t0 = mf_base_now_ns();
    for (int iter = 0; r == ncclInProgress; iter++) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(comm, &state);
        if (q != ncclSuccess)
            return q;
        if (state != ncclInProgress)
            return state;
        if (be->core.timeout_ms > 0 && (mf_base_now_ns() - t0) / 1000000 >= be->core.timeout_ms) {
            *timed_out = true;
            return ncclInProgress;
        }
        pthread_mutex_unlock(&be->mu);
        struct timespec ts = {0, iter < 100 ? 10000 : 1000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&be->mu);
        if (aborted(be))
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
    if (aborted(be)) {
        snprintf(err, errlen, "%s: the communicators were aborted after an earlier failure", what);
        return MFSDP_ERR_ABORTED;
    }
    return nccl_fail(r, comm, err, errlen, what);
}

/* Aborts every communicator once; any thread, without mu held. */
static void abort_all(nccl_be *be)
{
    if (be->mu_ready)
        mf_watch_abort(&be->watch, MF_WATCH_LOCK_MS);
}

/* The watchdog's failure report: sticky in the runtime (it aborts next). */
static void watch_failed(void *ctx, mfsdp_result r, const char *msg)
{
    nccl_be *be = ctx;
    mf_base_fail(be->core.rt, r, msg);
}

/* Refuses collectives on the compute stream: NCCL would run them there, but
 * nothing tracks them (the watchdog's events, the group plan and the graph
 * regions assume inner and outer). */
static mfsdp_result check_streams(mf_rt *rt)
{
    const mf_schedule *s = rt->s;
    for (int i = 0; i < s->nops; i++)
        if (mf_opkind_is_collective(s->ops[i].kind) && s->ops[i].stream == MF_STREAM_COMPUTE) {
            char what[200];
            mf_base_describe_op(rt, i, what, sizeof what);
            return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED,
                                     "%s is a collective on the compute stream: the NCCL backend runs "
                                     "collectives only on the inner and outer streams",
                                     what);
        }
    return MFSDP_OK;
}

/* The small exchange's stream, event and buffers (world * MF_NCCL_XCHG_BYTES
 * bytes of device memory and as many of pinned host memory): made once, so
 * an exchange allocates nothing. */
static mfsdp_result xchg_open(nccl_be *be, int world)
{
    size_t total = (size_t)world * MF_NCCL_XCHG_BYTES;
    char msg[MF_RT_ERRLEN];
    /* the inner and outer streams' priority: the gather is scheduled ahead of compute kernels */
    cudaError_t e = cudaStreamCreateWithPriority(&be->xs, cudaStreamNonBlocking, be->core.priority);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&be->xev, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&be->xdev, total);
    if (e == cudaSuccess)
        e = cudaHostAlloc((void **)&be->xhost, total, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "the world exchange's stream, event and %zu-byte buffers",
                                      total);
        return mf_base_set_error(be->core.rt, r, "%s", msg);
    }
    return MFSDP_OK;
}

/* After the communicators are gone (nothing can still run on the stream). */
static void xchg_close(nccl_be *be)
{
    if (be->xs)
        cudaStreamSynchronize(be->xs);
    if (be->xdev)
        cudaFree(be->xdev);
    if (be->xhost)
        cudaFreeHost(be->xhost);
    if (be->xev)
        cudaEventDestroy(be->xev);
    if (be->xs)
        cudaStreamDestroy(be->xs);
    be->xs = NULL;
    be->xev = NULL;
    be->xdev = be->xhost = NULL;
}

/* ---- vtbl ---- */

static mfsdp_result nccl_open(mf_rt *rt, const mfsdp_config *cfg, int64_t *rank, int64_t *world)
{
    nccl_be *be = mf_base_calloc(1, sizeof *be);
    if (!be)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (nccl backend)");
    rt->be_state = be;
    be->core.timeout_ms = cfg->timeout_ms; /* bounds the communicator setup below */
    mf_cuda_config_resolve(cfg, &be->nc);
    /* Everything that can be checked without the device, first. */
    mfsdp_result cr = mf_cuda_config_check(rt, &be->nc);
    if (cr != MFSDP_OK)
        return cr;
    int64_t mesh_world = rt->s->mesh.world;
    if (!be->nc.world_comm && !be->nc.has_unique_id && mesh_world != 1)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "the schedule's mesh has %lld ranks: pass world_comm or a unique id in the "
                                 "mfsdp_nccl_config (backend_config)",
                                 (long long)mesh_world);
    if (!be->nc.world_comm && be->nc.has_unique_id && (cfg->rank < 0 || cfg->rank >= mesh_world))
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "with a unique id, cfg->rank must be this rank in [0, %lld), not %lld",
                               (long long)mesh_world, (long long)cfg->rank);
    if ((cr = check_streams(rt)) != MFSDP_OK)
        return cr;
    /* Blocking by default: the watchdog aborts them from its own thread (see
     * mf_cuda_guard.c). */
    be->nonblocking = (be->nc.flags & MFSDP_NCCL_NONBLOCKING) != 0;
    if (pthread_mutex_init(&be->mu, NULL) != 0)
        return mf_base_set_error(rt, MFSDP_ERR_INTERNAL, "cannot initialize a mutex");
    if (mf_watch_init(&be->watch, rt, cfg->rank, cfg->timeout_ms, &be->mu) != 0) {
        pthread_mutex_destroy(&be->mu);
        return mf_base_set_error(rt, MFSDP_ERR_INTERNAL, "cannot initialize the watchdog's locks");
    }
    be->watch.capturing = &be->core.capturing;
    be->mu_ready = true;
    be->pending = mf_base_calloc((size_t)(rt->s->nops ? rt->s->nops : 1), sizeof *be->pending);
    be->posts = mf_base_calloc((size_t)(rt->s->nops ? rt->s->nops : 1), sizeof *be->posts);
    if (!be->pending || !be->posts)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (nccl groups)");
    if (!(be->nc.flags & MFSDP_NCCL_NO_IMPLICIT_ORDER)) {
        mf_cuda_nccl_launch_order(be->nc.world_comm != NULL, be->core.warning, sizeof be->core.warning);
        if (be->core.warning[0])
            fprintf(stderr, "libmfsdp: warning: %s\n", be->core.warning);
    }
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
    be->watch.world = be->world;
    be->watch.rank = r;
    if (res == MFSDP_ERR_TIMEOUT)
        abort_all(be); /* a peer never joined: do not leave a half-built communicator */
    if (res != MFSDP_OK)
        return mf_base_set_error(rt, res, "%s", msg);
    *rank = r;
    *world = n;
    res = mf_cuda_core_open(&be->core, rt, &be->nc, r);
    return res == MFSDP_OK ? xchg_open(be, n) : res;
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
    if (aborted(be)) {
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

/* The small exchange's check between polls: this rank's abort, or an
 * asynchronous error of the world communicator, the gather's own. Not the
 * schedule's communicators: a peer that already has every record (its
 * gather completed) may fail its runtime on the verdict and abort them
 * while this rank's gather, which no longer needs that peer, finishes. */
static mfsdp_result world_check(void *ctx, char *err, size_t errlen)
{
    nccl_be *be = ctx;
    pthread_mutex_lock(&be->mu);
    mfsdp_result res = MFSDP_OK;
    ncclResult_t state = ncclSuccess;
    if (aborted(be)) {
        snprintf(err, errlen, "rank %lld: the communicators were aborted after a failure", (long long)be->core.rt->rank);
        res = MFSDP_ERR_ABORTED;
    } else if (ncclCommGetAsyncError(be->world, &state) == ncclSuccess && state != ncclSuccess &&
               state != ncclInProgress) {
        res = nccl_fail(state, be->world, err, errlen, "the world communicator reported an asynchronous error");
    }
    pthread_mutex_unlock(&be->mu);
    return res;
}

/*
 * The small exchange (bytes <= MF_NCCL_XCHG_BYTES: the ranks' agreement at
 * every decision point, and create's own): mine into the pinned buffer, a
 * copy to the device, ncclAllGather over the backend's world communicator
 * (used by nothing else after create: the schedule's collectives run on the
 * split ones) and a copy back, all on the exchange's own stream, then a
 * bounded poll of one event recorded after them -- the trainer's streams
 * are neither waited for nor ordered with it. Every rank issues it at the
 * same decision point, in the same order relative to its other NCCL calls,
 * so under NCCL_LAUNCH_ORDER_IMPLICIT the launch order stays the same on
 * every rank. While the calling thread captures a graph (MFSDP_NCCL_GRAPHS,
 * any capture mode) the exchange still runs eagerly: the thread's capture
 * interaction mode is relaxed for its duration (as the watchdog's thread is,
 * mf_cuda_guard.c), since polling an event outside the capture is
 * otherwise a prohibited call that would invalidate it.
 */
static mfsdp_result small_exchange(nccl_be *be, const void *mine, size_t bytes, void *all, char *msg, size_t msglen)
{
    mf_rt *rt = be->core.rt;
    size_t total = bytes * (size_t)rt->world, at = (size_t)rt->rank * bytes;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess)
        return mf_cuda_fail(e, msg, msglen, "exchange: relaxing the thread's capture mode");
    memcpy(be->xhost + at, mine, bytes); /* the last exchange's copy back completed */
    mfsdp_result res = MFSDP_OK;
    pthread_mutex_lock(&be->mu);
    e = cudaMemcpyAsync(be->xdev + at, be->xhost + at, bytes, cudaMemcpyHostToDevice, be->xs);
    if (e != cudaSuccess) {
        res = mf_cuda_fail(e, msg, msglen, "exchange: copying %zu bytes to the device", bytes);
    } else if (aborted(be)) {
        snprintf(msg, msglen, "exchange: the communicators were aborted after an earlier failure");
        res = MFSDP_ERR_ABORTED;
    } else {
        mf_watch_call_begin(&be->watch);
        ncclResult_t nr = ncclAllGather(be->xdev + at, be->xdev, bytes, ncclUint8, be->world, be->xs);
        mf_watch_call_end(&be->watch);
        res = check_nccl(be, be->world, nr, msg, msglen, "exchange: ncclAllGather over the world");
    }
    if (res == MFSDP_OK && ((e = cudaMemcpyAsync(be->xhost, be->xdev, total, cudaMemcpyDeviceToHost, be->xs)) !=
                                cudaSuccess ||
                            (e = cudaEventRecord(be->xev, be->xs)) != cudaSuccess))
        res = mf_cuda_fail(e, msg, msglen, "exchange: copying %zu bytes back", total);
    pthread_mutex_unlock(&be->mu);
    if (res == MFSDP_OK)
        res = mf_cuda_core_wait(&be->core, be->xev, "exchange over the world", world_check, be, msg, msglen);
    if (res == MFSDP_OK)
        memcpy(all, be->xhost, total);
    cudaThreadExchangeStreamCaptureMode(&mode); /* back to the thread's own */
    return res;
}

static mfsdp_result nccl_exchange(mf_rt *rt, const void *mine, size_t bytes, void *all)
{
    nccl_be *be = be_of(rt);
    if (bytes <= MF_NCCL_XCHG_BYTES && be->xhost) {
        char msg[MF_RT_ERRLEN];
        mfsdp_result res = small_exchange(be, mine, bytes, all, msg, sizeof msg);
        if (res == MFSDP_ERR_TIMEOUT)
            abort_all(be); /* ends the gather */
        if (res != MFSDP_OK)
            return mf_base_set_error(rt, res, "%s", msg);
        return MFSDP_OK;
    }
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
    ncclResult_t nr = aborted(be) ? ncclRemoteError
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
        return mf_base_set_error(rt, res, "%s", msg);
    return MFSDP_OK;
}

static mfsdp_result nccl_comm_init(mf_rt *rt, const mf_rt_comm *comms, int ncomms)
{
    nccl_be *be = be_of(rt);
    char msg[MF_RT_ERRLEN], what[256];
    mfsdp_result res = MFSDP_OK;
    size_t nc_ = (size_t)(ncomms ? ncomms : 1);
    be->comms = mf_base_calloc(nc_, sizeof *be->comms);
    be->reg = mf_base_calloc(nc_ * MF_NCCL_MAX_REG, sizeof *be->reg);
    be->names = mf_base_calloc(nc_, sizeof *be->names);
    be->name_ptrs = mf_base_calloc(nc_, sizeof *be->name_ptrs);
    if (!be->comms || !be->reg || !be->names || !be->name_ptrs)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (communicators)");
    be->ncomms = ncomms;
    be->watch.comms = be->comms;
    be->watch.names = be->name_ptrs;
    be->watch.ncomms = ncomms;
    for (int i = 0; i < ncomms; i++) {
        const mf_rt_comm *cm = &comms[i];
        int color, key;
        mf_gpu_plan_split(&rt->s->mesh, cm->axis, rt->rank, &color, &key);
        if (color != cm->color || key != cm->coord)
            return mf_base_set_error(rt, MFSDP_ERR_INTERNAL,
                                     "communicator %d (axis %d): split color/key %d/%d disagree with the engine's "
                                     "%lld/%lld",
                                     i, cm->axis, color, key, (long long)cm->color, (long long)cm->coord);
        /* NCCL keeps the pointer: the name lives as long as the communicator. */
        char *name = be->names[i];
        snprintf(name, sizeof be->names[i], "mfsdp-%s-%s", rt->s->mesh.axes[cm->axis].name,
                 mf_stream_name(cm->stream));
        be->name_ptrs[i] = name;
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = be->nonblocking ? 0 : 1;
        config.commName = name;
        snprintf(what, sizeof what, "ncclCommSplit for axis %s (%s stream, color %d, key %d)",
                 rt->s->mesh.axes[cm->axis].name, mf_stream_name(cm->stream), color, key);
        pthread_mutex_lock(&be->mu);
        ncclResult_t nr = aborted(be) ? ncclRemoteError : ncclCommSplit(be->world, color, key, &be->comms[i], &config);
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
            return mf_base_set_error(rt, res, "%s", msg);
        }
    }
    /* Register the buffers (one pool, plus any overflow blocks) where NCCL can
     * use them in place (NVLS, CollNet, zero-copy P2P). */
    if (be->core.kind == MF_CUDA_MEM_NCCL) {
        const mf_cuda_block *regions[MF_NCCL_MAX_REG];
        void *ptr[MF_NCCL_MAX_REG];
        size_t bytes[MF_NCCL_MAX_REG];
        int nr_ = mf_cuda_core_regions(&be->core, regions, MF_NCCL_MAX_REG);
        for (int k = 0; k < nr_; k++) {
            ptr[k] = regions[k]->p;
            bytes[k] = regions[k]->bytes;
        }
        int bad_comm, bad_region;
        be->nreg = nr_; /* close deregisters whatever is left (nothing after a failure) */
        pthread_mutex_lock(&be->mu);
        ncclResult_t nr = mf_cuda_nccl_register_all(be->comms, ncomms, ptr, bytes, nr_, be->reg, MF_NCCL_MAX_REG,
                                                    &bad_comm, &bad_region);
        if (nr != ncclSuccess) {
            snprintf(what, sizeof what, "ncclCommRegister of region %d (%zu bytes) with %s", bad_region,
                     bytes[bad_region], be->names[bad_comm]);
            res = nccl_fail(nr, be->comms[bad_comm], msg, sizeof msg, what);
        }
        pthread_mutex_unlock(&be->mu);
        if (res != MFSDP_OK)
            return mf_base_set_error(rt, res, "%s", msg);
    }
    if (be->nc.watchdog_poll_ms > 0) {
        cudaError_t e = mf_watch_create_events(&be->watch);
        if (e != cudaSuccess) {
            res = mf_cuda_fail(e, msg, sizeof msg, "watchdog events");
            return mf_base_set_error(rt, res, "%s", msg);
        }
        if (mf_watch_start(&be->watch, be->nc.watchdog_poll_ms, be->core.device, watch_failed, be) != 0)
            return mf_base_set_error(rt, MFSDP_ERR_INTERNAL, "cannot start the watchdog thread");
    }
    return MFSDP_OK;
}

/* What the NCCL calls of one collective op take (mu held): its
 * communicator, its stream, the element type, the reduction (the schedule's
 * sum or avg), the element size (bytes) and the op's count (elements per
 * rank's chunk). */
typedef struct coll_args {
    ncclComm_t comm;
    cudaStream_t st;
    ncclDataType_t dt;
    ncclRedOp_t red;
    size_t es, n;
} coll_args;

static coll_args coll_args_of(const nccl_be *be, const mf_rt_op *rop)
{
    const mf_op *op = rop->op;
    return (coll_args){
        .comm = be->comms[rop->comm],
        .st = be->core.stream[op->stream],
        .dt = mf_cuda_nccl_dtype(op->dtype),
        .red = be->core.rt->s->reduce == MF_REDUCE_SUM ? ncclSum : ncclAvg,
        .es = mf_dtype_size(op->dtype),
        .n = (size_t)op->count,
    };
}

/*
 * A whole bucket's collective in the prefix form (rop->used; docs/runtime.md,
 * "Whole buckets"), one nested ncclGroupStart/End (ended only after a
 * successful start): a reduce-scatter is one ncclReduce of the used prefix of
 * chunk c to coord c, an all-gather one ncclBroadcast of coord c's prefix
 * into chunk c, an all-reduce one ncclAllReduce of the prefix. The padding
 * tail of each chunk this rank writes is zeroed with cudaMemsetAsync on the
 * op's stream, before the group or (in place, where the tail is still read)
 * in the post step. NCCL's ring reduce and its reduce-scatter (or its
 * all-reduce of another count) may add in another order: the bits can
 * differ from the padded form's within rounding (tests/gpu, stage
 * whole_prefix). mu held.
 */
static ncclResult_t enqueue_prefix(const mf_rt_op *rop, const coll_args *a, post_copy *post, cudaError_t *pre_err)
{
    const mf_op *op = rop->op;
    ncclComm_t comm = a->comm;
    cudaStream_t st = a->st;
    size_t es = a->es, own = (size_t)rop->dst_count; /* own: what this rank holds of dst */
    int64_t g = rop->nranks, me = rop->coord;
    size_t u = (size_t)rop->used[me], at = (size_t)rop->disp[me] * es;
    char *src = rop->src, *dst = rop->dst;
    cudaError_t e = cudaSuccess;
    if (op->kind == MF_OP_ALL_GATHER) {
        if (rop->overlap && at)   /* our prefix to its chunk, before chunk 0 is overwritten */
            e = cudaMemcpyAsync(dst + at, src, u * es, cudaMemcpyDeviceToDevice, st);
        for (int64_t c = 0; c < g && e == cudaSuccess; c++) {
            /* chunk c's tail: from its prefix's end to the next chunk (or the end) */
            size_t from = (size_t)(rop->disp[c] + rop->used[c]), end = c + 1 < g ? (size_t)rop->disp[c + 1] : own;
            if (from < end)
                e = cudaMemsetAsync(dst + from * es, 0, (end - from) * es, st);
        }
    } else if (op->kind == MF_OP_REDUCE_SCATTER && rop->overlap) {
        /* reduced in place in our chunk, then moved to dst[0, u) */
        *post = (post_copy){.dst = dst, .src = src + at, .bytes = at ? u * es : 0,
                            .zero = dst + u * es, .zero_bytes = (own - u) * es};
    } else if (u < own) {   /* our tail is read by nobody */
        e = cudaMemsetAsync(dst + u * es, 0, (own - u) * es, st);
    }
    *pre_err = e;
    if (e != cudaSuccess)
        return ncclSuccess;   /* the caller reports the staging error */
    ncclResult_t r = mf_cuda_calls.group_start();
    if (r != ncclSuccess)
        return r;
    for (int64_t c = 0; c < g && r == ncclSuccess; c++) {
        size_t uc = (size_t)rop->used[c], off = (size_t)rop->disp[c] * es;
        if (op->kind == MF_OP_REDUCE_SCATTER)
            r = ncclReduce(src + off, c == me && !rop->overlap ? dst : src + off, uc, a->dt, a->red, (int)c,
                           comm, st);
        else if (op->kind == MF_OP_ALL_GATHER)
            r = ncclBroadcast(rop->overlap ? dst + off : src, dst + off, uc, a->dt, (int)c, comm, st);
        else if (c == 0)
            r = ncclAllReduce(src, dst, u, a->dt, a->red, comm, st);
    }
    ncclResult_t end = mf_cuda_calls.group_end();   /* also after a failed member */
    return r != ncclSuccess && r != ncclInProgress ? r : end;
}

/* Enqueues one collective (mu held). `post` receives the copy to run after the
 * NCCL call (in-place reduce-scatter of a rank whose shard is not first). */

static ncclResult_t enqueue_collective(nccl_be *be, const mf_rt_op *rop, post_copy *post, cudaError_t *pre_err)
{
    const mf_op *op = rop->op;
    const coll_args a = coll_args_of(be, rop);
    size_t es = a.es, n = a.n, at = (size_t)rop->coord * n * es;
    *pre_err = cudaSuccess;
    *post = (post_copy){0};
    if (rop->used)
        return enqueue_prefix(rop, &a, post, pre_err);
    switch (op->kind) {
    case MF_OP_ALL_GATHER:
        if (rop->overlap) {
            /* in place: NCCL wants sendbuff == recvbuff + rank * count */
            if (at)
                *pre_err = cudaMemcpyAsync((char *)rop->dst + at, rop->src, n * es, cudaMemcpyDeviceToDevice, a.st);
            return ncclAllGather((char *)rop->dst + at, rop->dst, n, a.dt, a.comm, a.st);
        }
        return ncclAllGather(rop->src, rop->dst, n, a.dt, a.comm, a.st);
    case MF_OP_REDUCE_SCATTER:
        if (rop->overlap) {
            if (at)
                *post = (post_copy){.dst = rop->dst, .src = (char *)rop->src + at, .bytes = n * es};
            return ncclReduceScatter(rop->src, (char *)rop->src + at, n, a.dt, a.red, a.comm, a.st);
        }
        return ncclReduceScatter(rop->src, rop->dst, n, a.dt, a.red, a.comm, a.st);
    case MF_OP_ALL_REDUCE:
        return ncclAllReduce(rop->src, rop->dst, n, a.dt, a.red, a.comm, a.st);
    default:
        return ncclInvalidUsage;
    }
}

/* mf_cuda_nccl_group_issue's member k: pending collective k; the first staging
 * copy error is kept in cuda_err. */
typedef struct group_ctx {
    nccl_be *be;
    cudaError_t cuda_err;
} group_ctx;

static ncclResult_t enqueue_pending(void *ctx, int k)
{
    group_ctx *g = ctx;
    nccl_be *be = g->be;
    cudaError_t pe;
    ncclResult_t nr = enqueue_collective(be, &be->core.rt->rops[be->pending[k]], &be->posts[k], &pe);
    if (pe != cudaSuccess && g->cuda_err == cudaSuccess)
        g->cuda_err = pe;
    return nr;
}

/* "rank R: op 12 (...)" or, for a group, "... (ncclGroupStart/End of n
 * collectives from op 12)": the deferred collectives named for a message,
 * formatted only when one is written (no snprintf per successful collective). */
static const char *group_what(const nccl_be *be, int n, char *what, size_t size)
{
    const mf_rt *rt = be->core.rt;
    char desc[200];
    mf_base_describe_op(rt, be->pending[0], desc, sizeof desc);
    if (n > 1)
        snprintf(what, size, "rank %lld: %s (ncclGroupStart/End of %d collectives from op %d)", (long long)rt->rank,
                 desc, n, be->pending[0]);
    else
        snprintf(what, size, "rank %lld: %s", (long long)rt->rank, desc);
    return what;
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
    char what[MF_RT_ERRLEN]; /* formatted only on a failure (group_what) */
    post_copy *posts = be->posts;
    pthread_mutex_lock(&be->mu);
    mfsdp_result res = MFSDP_OK;
    if (aborted(be)) {
        snprintf(err, errlen, "%s: the communicators were aborted after an earlier failure",
                 group_what(be, n, what, sizeof what));
        res = MFSDP_ERR_ABORTED;
        goto unlock;
    }
    mf_watch_call_begin(&be->watch); /* a blocking call that never returns is the watchdog's */
    group_ctx g = {.be = be, .cuda_err = cudaSuccess};
    ncclResult_t first_err = mf_cuda_nccl_group_issue(n, enqueue_pending, &g);
    cudaError_t cuda_err = g.cuda_err;
    mf_watch_call_end(&be->watch);
    if (first_err != ncclSuccess) /* (check_nccl passes ncclSuccess as it is) */
        res = check_nccl(be, be->comms[first->comm], first_err, err, errlen, group_what(be, n, what, sizeof what));
    if (res == MFSDP_OK && cuda_err != cudaSuccess)
        res = mf_cuda_fail(cuda_err, err, errlen, "%s: in-place staging copy", group_what(be, n, what, sizeof what));
    for (int k = 0; k < n && res == MFSDP_OK; k++) {
        cudaStream_t st = be->core.stream[first->op->stream];
        cudaError_t e = cudaSuccess;
        if (posts[k].bytes)
            e = cudaMemcpyAsync(posts[k].dst, posts[k].src, posts[k].bytes, cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess && posts[k].zero_bytes)
            e = cudaMemsetAsync(posts[k].zero, 0, posts[k].zero_bytes, st);
        if (e != cudaSuccess)
            res = mf_cuda_fail(e, err, errlen, "%s: in-place result copy", group_what(be, n, what, sizeof what));
    }
unlock:
    pthread_mutex_unlock(&be->mu);
    if (res == MFSDP_OK)
        mf_watch_track(&be->watch, first->op->stream, be->core.stream[first->op->stream], be->pending[n - 1]);
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
        mf_cuda_core_time_begin(c, be->pending[0], be->npending, op->stream, microbatch);
        res = flush_group(be, err, errlen);
        mf_cuda_core_time_end(c);
    } else if (!skip) {
        if (be->npending) /* cannot be: groups are contiguous runs of collectives */
            res = flush_group(be, err, errlen);
        bool timed = op->kind != MF_OP_RECORD && op->kind != MF_OP_WAIT;
        if (timed)
            mf_cuda_core_time_begin(c, op->id, 1, op->stream, microbatch);
        if (res == MFSDP_OK)
            res = mf_cuda_core_local(c, rop, microbatch, event_seq, err, errlen);
        if (timed)
            mf_cuda_core_time_end(c);
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
    if (be->mu_ready)
        mf_watch_destroy(&be->watch); /* stops the thread first */
    if (be->core.rt && be->core.stream[MF_STREAM_INNER])
        mf_cuda_core_free(&be->core, NULL); /* drains */
    if (be->mu_ready) {
        pthread_mutex_lock(&be->mu);
        if (!aborted(be)) {
            mf_cuda_nccl_deregister_all(be->comms, be->ncomms, be->reg, be->nreg, MF_NCCL_MAX_REG);
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
    xchg_close(be);
    mf_cuda_core_close(&be->core);
    MF_FREE_ALL_WITH(mf_base_free, be->comms, be->reg, be->names, be->name_ptrs, be->pending, be->posts, be);
    rt->be_state = NULL;
}

const mf_backend_vtbl mf_backend_nccl = {
    .name = "nccl",
    .caps = MF_BE_NATIVE_STREAMS | MF_BE_HOST_EXCHANGE,
    .open = nccl_open,
    .alloc = nccl_alloc,
    .free = nccl_free,
    .alloc_host = mf_cuda_alloc_host,
    .free_host = mf_cuda_free_host,
    .exchange = nccl_exchange,
    .comm_init = nccl_comm_init,
    .collective = NULL,
    .submit = nccl_submit,
    .synchronize = nccl_synchronize,
    .stage = mf_cuda_stage,
    .abort = nccl_abort,
    .close = nccl_close,
};
