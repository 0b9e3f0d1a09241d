/*
 * gmn_coll: the collectives of the NCCL model -- argument and buffer checks
 * at the call (NCCL's, plus its in-place rules asserted), then one unit of
 * stream work per call (gm_enqueue: ordered by the CUDA model's streams and
 * events, a graph node while the stream is capturing).
 *
 * A rank's work item, when its stream reaches it:
 *   1. skips (as NCCL's kernels exit) when the communicator was aborted or
 *      holds an asynchronous error; checks its buffers (gm_check_range);
 *   2. takes the communicator's execution lock, applies an injected fault
 *      (GM_NCCL_FAULT) and the perturbation's delay (gm_delay_us);
 *   3. phase "desc": posts what it called (kind, count, type, op, root) and
 *      waits for every peer's; any difference is a mismatch: a violation, an
 *      asynchronous ncclInvalidUsage on the communicator, no data moved;
 *   4. phases "data": in rounds of at most GMN_CHUNK bytes per rank, writes
 *      its contribution to its slot, waits for the peers', reads theirs and
 *      writes its output (reductions in rank order, gmn_reduce.c).
 * A peer that aborted or died sets ncclRemoteError as the communicator's
 * asynchronous error, and the item keeps waiting; an item that starts on a
 * communicator holding an asynchronous error waits too: both return only when
 * this rank aborts the communicator (NCCL's kernels exit then, not before),
 * and the stream does not fail. A mismatched collective returns at once.
 */
#include "gmn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gm_model.h"

ncclResult_t gmn_group_defer(const gmn_call *c);

const char *gmn_kind_name(int kind)
{
    switch (kind) {
    case GMN_ALL_GATHER: return "ncclAllGather";
    case GMN_REDUCE_SCATTER: return "ncclReduceScatter";
    case GMN_ALL_REDUCE: return "ncclAllReduce";
    case GMN_REDUCE: return "ncclReduce";
    case GMN_BROADCAST: return "ncclBroadcast";
    case GMN_ALL_TO_ALL: return "ncclAlltoAll";
    case GMN_GATHER: return "ncclGather";
    case GMN_SCATTER: return "ncclScatter";
    default: return "an unknown collective";
    }
}

static bool reducing(int kind)
{
    return kind == GMN_REDUCE_SCATTER || kind == GMN_ALL_REDUCE || kind == GMN_REDUCE;
}

static bool rooted(int kind)
{
    return kind == GMN_REDUCE || kind == GMN_BROADCAST || kind == GMN_GATHER || kind == GMN_SCATTER;
}

/* Kinds whose ranks post one block per peer in a round (N * len elements). */
static bool wide(int kind)
{
    return kind == GMN_REDUCE_SCATTER || kind == GMN_ALL_TO_ALL || kind == GMN_SCATTER;
}

/* Bytes the call reads from send and writes to recv on this rank. */
static void call_bytes(const gmn_call *c, size_t *sb, size_t *rb)
{
    size_t es = gmn_dtype_size(c->d.dtype), n = (size_t)c->d.count, N = (size_t)c->comm->nranks;
    bool root = c->d.root == c->comm->rank;
    switch (c->d.kind) {
    case GMN_ALL_GATHER: *sb = n * es; *rb = N * n * es; break;
    case GMN_REDUCE_SCATTER: *sb = N * n * es; *rb = n * es; break;
    case GMN_REDUCE: *sb = n * es; *rb = root ? n * es : 0; break;
    case GMN_BROADCAST: *sb = root ? n * es : 0; *rb = n * es; break;
    case GMN_ALL_TO_ALL: *sb = *rb = N * n * es; break;
    case GMN_GATHER: *sb = n * es; *rb = root ? N * n * es : 0; break;
    case GMN_SCATTER: *sb = root ? N * n * es : 0; *rb = n * es; break;
    default: *sb = *rb = n * es; break;
    }
}

/* NCCL's in-place rules: the only overlap allowed is the in-place layout:
 * all-gather and gather (at the root) send from recvbuff + rank * count,
 * reduce-scatter and scatter (at the root) receive at sendbuff + rank *
 * count, the others send == recv; all-to-all has no in-place form. */
static ncclResult_t check_overlap(const gmn_call *c, size_t sb, size_t rb, const char *name)
{
    const char *s = c->send, *r = c->recv;
    if (!sb || !rb || s + sb <= r || r + rb <= s)
        return ncclSuccess;
    size_t es = gmn_dtype_size(c->d.dtype), at = (size_t)c->comm->rank * (size_t)c->d.count * es;
    bool ok;
    const char *rule;
    switch (c->d.kind) {
    case GMN_ALL_GATHER: case GMN_GATHER:
        ok = s == r + at;
        rule = "sendbuff == recvbuff + rank * count * size";
        break;
    case GMN_REDUCE_SCATTER: case GMN_SCATTER:
        ok = r == s + at;
        rule = "recvbuff == sendbuff + rank * count * size";
        break;
    case GMN_ALL_TO_ALL:
        ok = false;
        rule = "ncclAlltoAll has no in-place form";
        break;
    default:
        ok = s == r;
        rule = "sendbuff == recvbuff";
        break;
    }
    if (ok)
        return ncclSuccess;
    gm_violation("nccl: %s on %s (rank %d of %d): sendbuff %p (%zu bytes) overlaps recvbuff %p (%zu bytes) but is "
                 "not in place (%s)",
                 name, c->comm->comm_name, c->comm->rank, c->comm->nranks, c->send, sb, c->recv, rb, rule);
    return gmn_fail(c->comm, ncclInvalidArgument, "%s: sendbuff %p overlaps recvbuff %p and is not in place (%s)",
                    name, c->send, c->recv, rule);
}

static ncclResult_t check_buf(const gmn_call *c, const void *p, size_t bytes, const char *what, const char *name)
{
    if (!bytes)
        return ncclSuccess;
    if (!p)
        return gmn_fail(c->comm, ncclInvalidArgument, "%s: %s is NULL with %zu bytes to move", name, what, bytes);
    char err[512], w[128];
    snprintf(w, sizeof w, "%s's %s", name, what);
    if (gm_check_range(p, bytes, w, err, sizeof err) != cudaSuccess) {
        gm_violation("nccl: %s on %s (rank %d): %s", name, c->comm->comm_name, c->comm->rank, err);
        return gmn_fail(c->comm, ncclInvalidArgument, "%s: %s", name, err);
    }
    return ncclSuccess;
}

static ncclResult_t check_call(const gmn_call *c, const char *name)
{
    ncclResult_t r = gmn_comm_check(c->comm, name);
    if (r != ncclSuccess)
        return r;
    if (atomic_load(&c->comm->aborted))
        return gmn_fail(c->comm, ncclInvalidUsage, "%s: communicator %s was aborted", name, c->comm->comm_name);
    if (gmn_dtype_size(c->d.dtype) == 0)
        return gmn_fail(c->comm, ncclInvalidArgument, "%s: invalid datatype %d (%s%s)", name, c->d.dtype,
                        gmn_dtype_name(c->d.dtype), c->d.dtype == ncclFloat8e4m3 || c->d.dtype == ncclFloat8e5m2
                                                        ? ": fp8 is not modelled" : "");
    if (reducing(c->d.kind) && (c->d.op < 0 || c->d.op >= ncclNumOps))
        return gmn_fail(c->comm, ncclInvalidArgument, "%s: invalid reduction operation %d (expected sum, prod, "
                        "max, min or avg; ncclRedOpCreatePreMulSum is not modelled)", name, c->d.op);
    if (rooted(c->d.kind) && (c->d.root < 0 || c->d.root >= c->comm->nranks))
        return gmn_fail(c->comm, ncclInvalidArgument, "%s: invalid root %d (the communicator has %d ranks)", name,
                        c->d.root, c->comm->nranks);
    size_t sb, rb;
    call_bytes(c, &sb, &rb);
    if ((r = check_buf(c, c->send, sb, "sendbuff", name)) != ncclSuccess ||
        (r = check_buf(c, c->recv, rb, "recvbuff", name)) != ncclSuccess)
        return r;
    return check_overlap(c, sb, rb, name);
}

ncclResult_t gmn_coll(gmn_call *c, const char *name)
{
    /* held for the call: a watchdog thread's ncclCommAbort cannot free it under us */
    bool held = c->comm && gmn_comm_hold(c->comm);
    ncclResult_t r = check_call(c, name);
    if (r != ncclSuccess)
        gmn_group_error(r);
    else if (gmn_group_depth() > 0)
        r = gmn_group_defer(c);
    else if ((r = gmn_launch(c)) == ncclSuccess && !c->comm->blocking) {
        atomic_store(&c->comm->launch_polls, 1);
        r = ncclInProgress;
    }
    if (held)
        gmn_comm_unref(c->comm);
    return r;
}

/* ---- the stream work ---- */

typedef struct gmn_work {
    gmn_call c;
    bool eager;                   /* enqueued to run once (not a graph node) */
    bool ticketed, served;        /* gmn_device.c: a launch-order ticket, and whether
                                     it was used (run or cancelled) */
    uint64_t ticket;
    char what[200];
} gmn_work;

/* Called once nothing runs w again: after its run, or instead of it (the
 * CUDA model skips work after a sticky error), or when its graph goes. */
static void work_free(void *arg)
{
    gmn_work *w = arg;
    if (w->ticketed && !w->served)
        gmn_dev_cancel(w->c.comm->root_rank, w->ticket);
    if (w->eager)
        atomic_fetch_sub(&w->c.comm->outstanding, 1);
    gmn_comm_unref(w->c.comm);
    free(w);
}

static bool aborted_cond(void *arg)
{
    return atomic_load(&((struct ncclComm *)arg)->aborted);
}

/* The descriptor phase: false when the collective must not move data. */
static bool exchange_desc(const gmn_work *w)
{
    struct ncclComm *comm = w->c.comm;
    gmn_seg *seg = comm->seg;
    uint64_t p = ++comm->phase;
    gmn_slot *me = &seg->slots[comm->rank];
    me->desc[p % 2] = w->c.d;
    me->desc[p % 2].seq = comm->ncoll;
    gmn_arrive(comm, &me->phase, p);
    char msg[512];
    if (gmn_wait_all(comm, false, p, w->what, msg, sizeof msg) != ncclSuccess)
        return false; /* this rank aborted */
    const gmn_desc *a = &me->desc[p % 2];
    for (int q = 0; q < comm->nranks; q++) {
        const gmn_desc *b = &seg->slots[q].desc[p % 2];
        bool same = a->kind == b->kind && a->count == b->count && a->dtype == b->dtype &&
                    (!reducing(a->kind) || a->op == b->op) && (!rooted(a->kind) || a->root == b->root);
        if (same)
            continue;
        atomic_fetch_add(&gmn_stat_mismatches, 1);
        gm_violation("nccl: mismatched collectives on %s at collective %llu: rank %d called %s(count %llu, %s, %s, "
                     "root %d), rank %d called %s(count %llu, %s, %s, root %d)",
                     comm->comm_name, (unsigned long long)a->seq, comm->rank, gmn_kind_name(a->kind),
                     (unsigned long long)a->count, gmn_dtype_name(a->dtype), gmn_op_name(a->op), a->root, q,
                     gmn_kind_name(b->kind), (unsigned long long)b->count, gmn_dtype_name(b->dtype),
                     gmn_op_name(b->op), b->root);
        gmn_set_async(comm, ncclInvalidUsage, "mismatched collectives at collective %llu: rank %d called %s, rank %d "
                      "called %s (or another count, type, op or root)", (unsigned long long)a->seq, comm->rank,
                      gmn_kind_name(a->kind), q, gmn_kind_name(b->kind));
        return false;
    }
    return true;
}

/* This rank's part of a round: its block(s) into its slot buffer. */
static void post_round(const gmn_work *w, unsigned char *buf, size_t off, size_t len)
{
    const gmn_desc *d = &w->c.d;
    struct ncclComm *comm = w->c.comm;
    size_t es = gmn_dtype_size(d->dtype), n = (size_t)d->count, N = (size_t)comm->nranks;
    const char *send = w->c.send;
    bool root = comm->rank == d->root;
    if ((d->kind == GMN_BROADCAST || d->kind == GMN_SCATTER) && !root)
        return;
    if (wide(d->kind))
        for (size_t q = 0; q < N; q++)
            memcpy(buf + q * len * es, send + (q * n + off) * es, len * es);
    else
        memcpy(buf, send + off * es, len * es);
}

/* One round: elements [off, off + len) of the per-rank (per-block) count.
 * ins: nranks pointers of the caller's (w may be a graph node that two graph
 * instances run at once: nothing of a run lives in it). */
static bool round_once(const gmn_work *w, size_t off, size_t len, const void **ins)
{
    struct ncclComm *comm = w->c.comm;
    const gmn_desc *d = &w->c.d;
    size_t es = gmn_dtype_size(d->dtype), n = (size_t)d->count, N = (size_t)comm->nranks, me = (size_t)comm->rank;
    char *recv = w->c.recv;
    uint64_t p = ++comm->phase;
    post_round(w, comm->seg->slots[me].data[p % 2], off, len);
    gmn_arrive(comm, &comm->seg->slots[me].phase, p);
    char msg[512];
    if (gmn_wait_all(comm, false, p, w->what, msg, sizeof msg) != ncclSuccess)
        return false; /* this rank aborted */
    for (size_t q = 0; q < N; q++) /* wide kinds: our block of every peer's post */
        ins[q] = comm->seg->slots[q].data[p % 2] + (wide(d->kind) ? me * len * es : 0);
    switch (d->kind) {
    case GMN_GATHER:
        if ((int)me != d->root)
            break;
        /* fall through */
    case GMN_ALL_GATHER:
    case GMN_ALL_TO_ALL:
        for (size_t q = 0; q < N; q++)
            memcpy(recv + (q * n + off) * es, ins[q], len * es);
        break;
    case GMN_BROADCAST:
    case GMN_SCATTER:
        memcpy(recv + off * es, ins[d->root], len * es);
        break;
    case GMN_REDUCE:
        if ((int)me != d->root)
            break;
        /* fall through */
    default:
        gmn_reduce(d->dtype, d->op, (int)N, (const void *const *)ins, recv + off * es, len);
        break;
    }
    return true;
}

static cudaError_t check_ranges(gmn_work *w, char *err, size_t errlen)
{
    size_t sb, rb;
    call_bytes(&w->c, &sb, &rb);
    cudaError_t e = cudaSuccess;
    if (sb)
        e = gm_check_range(w->c.send, sb, "the sendbuff of a running NCCL collective", err, errlen);
    if (e == cudaSuccess && rb)
        e = gm_check_range(w->c.recv, rb, "the recvbuff of a running NCCL collective", err, errlen);
    return e;
}

static void run_locked(const gmn_work *w)
{
    struct ncclComm *comm = w->c.comm;
    const gmn_fault *f = gmn_fault_for(comm);
    if (f && f->kind == GMN_FAULT_STOP && comm->ncoll == f->after) {
        fprintf(stderr, "gpumodel: nccl: injected fault (GM_NCCL_FAULT): rank %d stops at collective %llu of %s\n",
                comm->root_rank, (unsigned long long)comm->ncoll, comm->comm_name);
        gmn_wait_until(comm, aborted_cond, comm, w->what); /* never arrives: until aborted */
        return;
    }
    uint64_t site = 0xcbf29ce484222325ULL;
    for (const char *c = comm->name; *c; c++)
        site = (site ^ (unsigned char)*c) * 0x100000001b3ULL;
    unsigned us = gm_delay_us(site ^ ((uint64_t)comm->rank << 40) ^ comm->ncoll);
    if (us)
        usleep(us);
    if (!exchange_desc(w))
        return;
    const gmn_desc *d = &w->c.d;
    size_t es = gmn_dtype_size(d->dtype);
    size_t per = GMN_CHUNK / (es * (wide(d->kind) ? (size_t)comm->nranks : 1));
    const void *ins[GMN_MAX_RANKS];
    for (size_t off = 0; off < d->count; off += per)
        if (!round_once(w, off, d->count - off < per ? d->count - off : per, ins))
            return;
    comm->ncoll++;
    if (f && f->kind == GMN_FAULT_ASYNC && comm->ncoll == f->after)
        gmn_set_async(comm, ncclSystemError, "injected fault (GM_NCCL_FAULT): rank %d reports an asynchronous "
                      "system error after %llu collectives", comm->root_rank, (unsigned long long)f->after);
}

static cudaError_t work_run(void *arg, char *err, size_t errlen)
{
    gmn_work *w = arg;
    struct ncclComm *comm = w->c.comm;
    cudaError_t e = cudaSuccess;
    if (atomic_load(&comm->aborted))
        return cudaSuccess;
    e = check_ranges(w, err, errlen);
    if (e != cudaSuccess) {
        gmn_set_async(comm, ncclUnhandledCudaError, "%s: %s", w->what, err);
        return e;
    }
    bool exclusive = gmn_dev_mode() != 0;
    if (exclusive && !gmn_dev_acquire(comm, w->ticketed, w->ticket, w->what))
        return cudaSuccess; /* aborted while waiting for the device: work_free cancels the ticket */
    if (w->ticketed)
        w->served = true; /* eager: runs once */
    pthread_mutex_lock(&comm->exec_mu);
    if (atomic_load(&comm->async_err) != ncclSuccess) /* a broken comm's kernels hang until aborted */
        gmn_wait_until(comm, aborted_cond, comm, w->what);
    else if (!atomic_load(&comm->aborted))
        run_locked(w);
    pthread_mutex_unlock(&comm->exec_mu);
    if (exclusive)
        gmn_dev_release(comm, w->ticketed, w->ticket);
    return cudaSuccess;
}

ncclResult_t gmn_launch(const gmn_call *c)
{
    struct ncclComm *comm = c->comm;
    gmn_work *w = calloc(1, sizeof *w);
    if (!w)
        return gmn_fail(comm, ncclSystemError, "%s: out of memory", gmn_kind_name(c->d.kind));
    w->c = *c;
    snprintf(w->what, sizeof w->what, "%s of %llu %s on %s: rank %d of %d", gmn_kind_name(c->d.kind),
             (unsigned long long)c->d.count, gmn_dtype_name(c->d.dtype), comm->comm_name, comm->rank, comm->nranks);
    size_t sb, rb;
    call_bytes(c, &sb, &rb);
    atomic_fetch_add(&gmn_stat_colls, 1);
    atomic_fetch_add(&gmn_stat_kind[c->d.kind - 1], 1);
    if ((sb || rb) && (!sb || gmn_registered(comm, c->send, sb)) && (!rb || gmn_registered(comm, c->recv, rb)))
        atomic_fetch_add(&gmn_stat_registered, 1);
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    w->eager = cudaStreamIsCapturing(c->stream, &st) != cudaSuccess || st == cudaStreamCaptureStatusNone;
    if (w->eager) {
        atomic_fetch_add(&comm->outstanding, 1);
        w->ticketed = gmn_dev_ticket(comm->root_rank, &w->ticket); /* host launch order */
    }
    gmn_comm_ref(comm);
    cudaError_t e = gm_enqueue(c->stream, w->what, work_run, w, work_free);
    if (e != cudaSuccess) {
        char what[sizeof w->what];
        snprintf(what, sizeof what, "%s", w->what);
        work_free(w); /* gm_enqueue took nothing */
        return gmn_fail(comm, ncclUnhandledCudaError, "%s: cannot enqueue on stream %p: %s", what,
                        (void *)c->stream, cudaGetErrorString(e));
    }
    return ncclSuccess;
}

/* ---- the API ---- */

static ncclResult_t coll(int kind, const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                         int root, ncclComm_t comm, cudaStream_t stream)
{
    gmn_call c = {.d = {.kind = kind, .dtype = (int32_t)dt, .op = reducing(kind) ? (int32_t)op : -1,
                        .root = rooted(kind) ? root : -1, .count = count},
                  .send = send, .recv = recv, .comm = comm, .stream = stream};
    return gmn_coll(&c, gmn_kind_name(kind));
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    return coll(GMN_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return coll(GMN_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return coll(GMN_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll(GMN_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    return coll(GMN_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream)
{
    return coll(GMN_ALL_TO_ALL, sendbuff, recvbuff, count, datatype, ncclSum, -1, comm, stream);
}

ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream)
{
    return coll(GMN_GATHER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream)
{
    return coll(GMN_SCATTER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}
