/*
 * mf_backend_cuda_local: several thread-ranks on ONE GPU (MFSDP_BACKEND_CUDA_LOCAL),
 * so the CUDA data path -- device buffers, offsets, casts, the accumulate and
 * reduce kernels, events, the inner/outer/compute streams -- is exercised on
 * meshes of many ranks with a single device. Same native model, streams,
 * events and local ops as the NCCL backend (mf_cuda.c); only the
 * collectives differ: they are device copies and the reduce kernel between the
 * thread-ranks' buffers.
 *
 * It is built on the local backend: the thread-ranks attach to the same
 * mfsdp_local_group, exchange at create through it, and every collective uses
 * the local backend's communicator rendezvous (one per axis group) to trade a
 * small host payload: the op id, a CUDA event and the device pointers.
 * A collective, on each member's host thread:
 *   1. (in place all-gather / reduce-scatter) copy the source to a device
 *      scratch buffer, so the rank's own writes cannot race its peers' reads;
 *   2. record `ready` on the op's stream (everything before it is done);
 *   3. rendezvous #1: learn every member's ready event and pointers; check that
 *      all issued the same op;
 *   4. make the op's stream wait for every member's `ready`, then enqueue its
 *      own part, reading peers' memory directly:
 *        all_gather     copy each member's source into its slot of our dst,
 *                       in coord order (cudaMemcpyAsync, device to device);
 *        reduce_scatter our shard of every member's source, summed in coord
 *                       order, divided by the group size for avg (the reduce
 *                       kernel; the same bits as the CPU backends);
 *        all_reduce     chunk `coord` of the result, written into every
 *                       member's dst (only this member reads or writes that
 *                       chunk anywhere, so in place is safe);
 *   5. record `done`; rendezvous #2 (every `done` is recorded); make the op's
 *      stream wait for every member's `done`, so nobody reuses a buffer a peer
 *      still reads or writes.
 * Events are per communicator: the next collective on a communicator starts
 * only after every member passed rendezvous #2 of the previous one, so an
 * event is never re-recorded before its waiters enqueued their waits.
 * Nor destroyed: a member may leave the last collective and close while a
 * peer has yet to enqueue its wait on that member's `done`, so a closing
 * rank hands its events to its group's yard (cl_yard), and the last
 * cuda-local runtime of the group to close destroys them: by then every
 * peer has returned from its hooks and drained its streams.
 *
 * Host-compute mode (managed memory the host reads and writes while other
 * thread-ranks' kernels run on the same device) needs the device's
 * concurrentManagedAccess: refused at create without it.
 *
 * The rendezvous blocks the host (bounded by the timeout, aborted when a peer
 * fails): that is inherent to thread-ranks and harmless, since each device
 * step only ever depends on events already recorded. No CUDA graphs here.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "mf_cuda.h"
#include "mf_cuda_kernels.h"
#include "mf_free.h"

/* ---- the yard: events that outlive their rank's runtime ---- */

/* One local group's closed runtimes' events, destroyed when the last of the
 * group's cuda-local runtimes closes. Keyed by the group's address: an entry
 * exists while a runtime of the group is open (`open` > 0). */
typedef struct cl_yard {
    const void *group;
    int open;                     /* cuda-local runtimes of the group not closed */
    cudaEvent_t *evs;
    int nevs, cap;
    struct cl_yard *next;
} cl_yard;

static pthread_mutex_t cl_yard_mu = PTHREAD_MUTEX_INITIALIZER;
static cl_yard *cl_yards;

/* The group's entry (created when absent), or NULL; cl_yard_mu held. */
static cl_yard *yard_of(const void *group, bool create)
{
    for (cl_yard *y = cl_yards; y; y = y->next)
        if (y->group == group)
            return y;
    if (!create)
        return NULL;
    cl_yard *y = mf_base_calloc(1, sizeof *y);
    if (y) {
        y->group = group;
        y->next = cl_yards;
        cl_yards = y;
    }
    return y;
}

/* A runtime of `group` opened: false when out of memory. */
static bool yard_join(const void *group)
{
    pthread_mutex_lock(&cl_yard_mu);
    cl_yard *y = yard_of(group, true);
    if (y)
        y->open++;
    pthread_mutex_unlock(&cl_yard_mu);
    return y != NULL;
}

/* A runtime of `group` closes with its events a[0..n) and b[0..n) (entries
 * may be NULL): they join the yard; the last runtime out destroys them all.
 * An event that cannot be kept (out of memory) is leaked rather than
 * destroyed under a peer's wait. */
static void yard_leave(const void *group, const cudaEvent_t *a, const cudaEvent_t *b, int n)
{
    pthread_mutex_lock(&cl_yard_mu);
    cl_yard *y = yard_of(group, false);
    if (y && y->nevs + 2 * n > y->cap) {
        int cap = y->cap ? y->cap : 16;
        while (cap < y->nevs + 2 * n)
            cap *= 2;
        cudaEvent_t *ne = mf_base_calloc((size_t)cap, sizeof *ne);
        if (ne) {
            if (y->evs)
                memcpy(ne, y->evs, (size_t)y->nevs * sizeof *ne);
            mf_base_free(y->evs);
            y->evs = ne;
            y->cap = cap;
        }
    }
    for (int i = 0; y && i < 2 * n; i++) {
        cudaEvent_t ev = i < n ? (a ? a[i] : NULL) : (b ? b[i - n] : NULL);
        if (ev && y->nevs < y->cap)
            y->evs[y->nevs++] = ev;
    }
    if (y && --y->open == 0) {
        for (int i = 0; i < y->nevs; i++)
            cudaEventDestroy(y->evs[i]);
        cl_yard **at = &cl_yards;
        while (*at != y)
            at = &(*at)->next;
        *at = y->next;
        mf_base_free(y->evs);
        mf_base_free(y);
    }
    pthread_mutex_unlock(&cl_yard_mu);
}

/* What members trade at a rendezvous (a multiple of 4 bytes: it travels as
 * fp32 elements of the local backend's all-gather). */
typedef struct cl_payload {
    int32_t op;
    int32_t pad;
    cudaEvent_t ev;
    const void *src;
    void *dst;
} cl_payload;

typedef struct cl_be {
    mf_cuda_core core;            /* first: mfsdp_nccl_stream() reads it */
    mfsdp_nccl_config nc;
    void *local;                  /* the local backend's state */
    int ncomms;
    cudaEvent_t *ready, *done;    /* per communicator */
    void *scratch[MF_STREAM_COUNT];     /* device, for in-place all-gather / reduce-scatter */
    size_t scratch_bytes[MF_STREAM_COUNT];
    const void *group;            /* cfg->local_group; joined to its yard when set */
    cl_payload *peers;            /* [max group size] */
    int64_t max_group;
    const void **srcs;            /* [max group size] */
    void **dsts;                  /* [max group size] */
} cl_be;

static cl_be *be_of(mf_rt *rt)
{
    return (cl_be *)rt->be_state;
}

/* Runs a local-backend function with its own state in rt->be_state (the
 * host thread is the only one touching it: no stream threads in this model). */
#define WITH_LOCAL(rt, be, expr)         \
    do {                                 \
        (rt)->be_state = (be)->local;    \
        expr;                            \
        (be)->local = (rt)->be_state;    \
        (rt)->be_state = (be);           \
    } while (0)

/* Host-compute mode: the host reads and writes managed memory between its
 * hooks while the other thread-ranks' kernels run on the device, which
 * needs concurrentManagedAccess (without it, a host access to managed memory
 * while any kernel runs faults). */
static mfsdp_result check_managed_access(mf_rt *rt, int device)
{
    int concurrent = 0;
    cudaError_t e = cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device);
    if (e != cudaSuccess) {
        char msg[MF_RT_ERRLEN];
        mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "cuda-local: cudaDeviceGetAttribute("
                                      "cudaDevAttrConcurrentManagedAccess) on device %d", device);
        return mf_base_set_error(rt, r, "%s", msg);
    }
    if (!concurrent)
        return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED,
                                 "cuda-local with host compute (MFSDP_NCCL_HOST_COMPUTE, or a NULL "
                                 "backend_config): device %d has no concurrentManagedAccess, so the host "
                                 "cannot touch managed memory while other thread-ranks' kernels run; use a "
                                 "device trainer (a compute stream, no MFSDP_NCCL_HOST_COMPUTE) or the "
                                 "local backend", device);
    return MFSDP_OK;
}

static mfsdp_result cl_open(mf_rt *rt, const mfsdp_config *cfg, int64_t *rank, int64_t *world)
{
    cl_be *be = mf_base_calloc(1, sizeof *be);
    if (!be)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (cuda-local backend)");
    rt->be_state = be;
    mf_cuda_config_resolve(cfg, &be->nc);
    if (be->nc.flags & MFSDP_NCCL_GRAPHS)
        return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED,
                                 "cuda-local: CUDA graph mode needs one process per GPU (the NCCL backend)");
    if (be->nc.world_comm || be->nc.has_unique_id)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "cuda-local: the thread-ranks meet in cfg->local_group; world_comm and "
                                 "unique_id are for the NCCL backend");
    mfsdp_result res;
    WITH_LOCAL(rt, be, res = mf_backend_local.open(rt, cfg, rank, world));
    if (res != MFSDP_OK)
        return res;
    if (!yard_join(cfg->local_group))
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (cuda-local event yard)");
    be->group = cfg->local_group;
    res = mf_cuda_core_open(&be->core, rt, &be->nc, *rank);
    if (res != MFSDP_OK)
        return res;
    if (be->core.host_compute && (res = check_managed_access(rt, be->core.device)) != MFSDP_OK)
        return res;
    /* Peers read each other's buffers directly: plain device (or managed)
     * memory of this process, never ncclMemAlloc. */
    if (be->core.kind == MF_CUDA_MEM_NCCL)
        be->core.kind = MF_CUDA_MEM_DEVICE;
    return MFSDP_OK;
}

static mfsdp_result cl_alloc(mf_rt *rt, size_t bytes, void **out)
{
    return mf_cuda_core_alloc(&be_of(rt)->core, bytes, out);
}

static void cl_free(mf_rt *rt, void *p)
{
    mf_cuda_core_free(&be_of(rt)->core, p);
}

static mfsdp_result cl_exchange(mf_rt *rt, const void *mine, size_t bytes, void *all)
{
    cl_be *be = be_of(rt);
    mfsdp_result res;
    WITH_LOCAL(rt, be, res = mf_backend_local.exchange(rt, mine, bytes, all));
    return res;
}

/* The source elements a member exposes: count (times the group for a
 * reduce_scatter), or in a whole bucket's chunked form (rop->used) what it
 * holds of its source (a ragged bucket's buffers are shorter than n *
 * count). */
static int64_t cl_posted(const mf_rt_op *r)
{
    if (r->used)
        return r->src_count;
    return r->op->count * (r->op->kind == MF_OP_REDUCE_SCATTER ? r->nranks : 1);
}


static mfsdp_result cl_comm_init(mf_rt *rt, const mf_rt_comm *comms, int ncomms)
{
    cl_be *be = be_of(rt);
    mfsdp_result res;
    WITH_LOCAL(rt, be, res = mf_backend_local.comm_init(rt, comms, ncomms));
    if (res != MFSDP_OK)
        return res;
    be->ncomms = ncomms;
    be->ready = mf_base_calloc((size_t)(ncomms ? ncomms : 1), sizeof *be->ready);
    be->done = mf_base_calloc((size_t)(ncomms ? ncomms : 1), sizeof *be->done);
    if (!be->ready || !be->done)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (cuda-local events)");
    be->max_group = 1;
    for (int i = 0; i < ncomms; i++) {
        if (comms[i].nranks > MF_CUDA_MAX_OPERANDS)
            return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED,
                                     "cuda-local: axis %s has %lld ranks; one GPU emulates groups of at most %d",
                                     rt->s->mesh.axes[comms[i].axis].name, (long long)comms[i].nranks,
                                     MF_CUDA_MAX_OPERANDS);
        if (comms[i].nranks > be->max_group)
            be->max_group = comms[i].nranks;
        cudaError_t e = cudaEventCreateWithFlags(&be->ready[i], cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&be->done[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            char msg[MF_RT_ERRLEN];
            mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "cuda-local: collective events");
            return mf_base_set_error(rt, r, "%s", msg);
        }
    }
    be->peers = mf_base_calloc((size_t)be->max_group, sizeof *be->peers);
    be->srcs = mf_base_calloc((size_t)be->max_group, sizeof *be->srcs);
    be->dsts = mf_base_calloc((size_t)be->max_group, sizeof *be->dsts);
    if (!be->peers || !be->srcs || !be->dsts)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (cuda-local tables)");
    /* Device scratch for in-place gathers and reductions, per stream. */
    for (int i = 0; i < rt->s->nops; i++) {
        const mf_rt_op *r = &rt->rops[i];
        if (r->comm < 0 || !r->overlap || r->op->kind == MF_OP_ALL_REDUCE)
            continue;
        size_t bytes = (size_t)cl_posted(r) * mf_dtype_size(r->src_dtype);
        if (bytes > be->scratch_bytes[r->op->stream])
            be->scratch_bytes[r->op->stream] = bytes;
    }
    for (int st = 0; st < MF_STREAM_COUNT; st++)
        if (be->scratch_bytes[st]) {
            res = mf_cuda_core_alloc(&be->core, be->scratch_bytes[st], &be->scratch[st]);
            if (res != MFSDP_OK)
                return res;
        }
    return MFSDP_OK;
}

/* One rendezvous on the op's communicator: every member's payload into
 * be->peers[coord]. */
static mfsdp_result rendezvous(cl_be *be, mf_rt *rt, const mf_rt_op *rop, const cl_payload *mine, char *err,
                               size_t errlen)
{
    mf_op fake = *rop->op;
    fake.kind = MF_OP_ALL_GATHER;
    fake.dtype = MF_FP32;
    fake.count = (int64_t)(sizeof *mine / sizeof(float));
    mf_rt_op frop = *rop;
    frop.op = &fake;
    frop.src = (void *)mine;
    frop.dst = be->peers;
    frop.src_dtype = frop.dst_dtype = MF_FP32;
    frop.src_count = fake.count;
    frop.dst_count = fake.count * rop->nranks;
    frop.overlap = false;
    /* The payload moves whole on every member: never a whole bucket's prefix
     * form, whose `used` prefixes are the op's (elements of its chunks, up to
     * op->count each), not the payload's 8 floats. */
    frop.used = NULL;
    frop.bytes = (int64_t)sizeof *mine;
    mfsdp_result res;
    WITH_LOCAL(rt, be, res = mf_backend_local.collective(rt, &frop, 0, err, errlen));
    return res;
}

/* Enqueues this member's part of the collective on st, after every member's
 * `ready` (see the top): the copies and sums of step 4. */
static cudaError_t enqueue_part(cl_be *be, const mf_rt *rt, const mf_rt_op *rop, cudaStream_t st)
{
    const mf_op *op = rop->op;
    int64_t n = rop->nranks, me = rop->coord, cnt = op->count;
    size_t es = mf_dtype_size(op->dtype);
    float divisor = rt->s->reduce == MF_REDUCE_AVG ? (float)n : 1.0f;
    /* A whole bucket's prefix form (rop->used): the same copies and sums on
     * the used prefix of each chunk, the padding tail of each chunk this
     * member writes zero-filled on the op's stream (the same bits as the
     * padded form, whose padding sums zeros). */
    const int64_t *used = rop->used;
    int64_t u = used ? used[me] : cnt, own = used ? rop->dst_count : cnt;
    char *dst = rop->dst;
    cudaError_t e = cudaSuccess;
    switch (op->kind) {
    case MF_OP_ALL_GATHER:
        /* chunk p at disp[p] (p * count unless ragged), its tail up to the
         * next chunk (or the end) zeroed */
        for (int64_t p = 0; p < n && e == cudaSuccess; p++) {
            int64_t up = used ? used[p] : cnt, at = used ? rop->disp[p] : p * cnt;
            int64_t end = !used ? at + cnt : p + 1 < n ? rop->disp[p + 1] : rop->dst_count;
            e = mf_cuda_copy(dst + (size_t)at * es, be->peers[p].src, (size_t)up * es, st);
            if (e == cudaSuccess && at + up < end)
                e = cudaMemsetAsync(dst + (size_t)(at + up) * es, 0, (size_t)(end - at - up) * es, st);
        }
        break;
    case MF_OP_REDUCE_SCATTER:
        for (int64_t p = 0; p < n; p++)
            be->srcs[p] = (const char *)be->peers[p].src + (size_t)(used ? rop->disp[me] : me * cnt) * es;
        e = mf_cuda_combine(&rop->dst, 1, op->dtype, be->srcs, (int)n, op->dtype, u, divisor, MF_CUDA_DIV, false, st);
        if (e == cudaSuccess && u < own)
            e = cudaMemsetAsync(dst + (size_t)u * es, 0, (size_t)(own - u) * es, st);
        break;
    case MF_OP_ALL_REDUCE: {
        /* u is every member's (one shard); nobody else writes [u, own) of ours */
        if (u < own)
            e = cudaMemsetAsync(dst + (size_t)u * es, 0, (size_t)(own - u) * es, st);
        int64_t chunk = ((u + n - 1) / n + 63) / 64 * 64; /* keeps 16-byte alignment */
        int64_t lo = me * chunk, len = u - lo < chunk ? u - lo : chunk;
        if (len > 0 && e == cudaSuccess) {
            for (int64_t p = 0; p < n; p++) {
                be->srcs[p] = (const char *)be->peers[p].src + (size_t)lo * es;
                be->dsts[p] = (char *)be->peers[p].dst + (size_t)lo * es;
            }
            e = mf_cuda_combine(be->dsts, (int)n, op->dtype, be->srcs, (int)n, op->dtype, len, divisor, MF_CUDA_DIV,
                                false, st);
        }
        break;
    }
    default:
        break;
    }
    return e;
}

/* "rank R: op 12 (all_gather dp_inner, ...): <stage>" into what; only on a
 * failure (no snprintf per successful collective). */
static const char *cl_what(const cl_be *be, const mf_rt *rt, const mf_rt_op *rop, const char *stage, char *what,
                           size_t size)
{
    char desc[200];
    mf_cuda_describe(&be->core, rop, desc, sizeof desc);
    snprintf(what, size, "rank %lld: %s%s%s", (long long)rt->rank, desc, *stage ? ": " : "", stage);
    return what;
}

static mfsdp_result cl_collective(cl_be *be, mf_rt *rt, const mf_rt_op *rop, char *err, size_t errlen)
{
    mf_cuda_core *c = &be->core;
    const mf_op *op = rop->op;
    cudaStream_t st = c->stream[op->stream];
    int64_t n = rop->nranks, me = rop->coord;
    char what[300];
    cudaError_t e = cudaSuccess;
    const void *src = rop->src;
    if (rop->overlap && op->kind != MF_OP_ALL_REDUCE) {
        size_t bytes = (size_t)cl_posted(rop) * mf_dtype_size(op->dtype);
        e = cudaMemcpyAsync(be->scratch[op->stream], src, bytes, cudaMemcpyDeviceToDevice, st);
        src = be->scratch[op->stream];
    }
    if (e == cudaSuccess)
        e = cudaEventRecord(be->ready[rop->comm], st);
    if (e != cudaSuccess)
        return mf_cuda_fail(e, err, errlen, "%s", cl_what(be, rt, rop, "before the rendezvous", what, sizeof what));

    cl_payload mine = {.op = op->id, .ev = be->ready[rop->comm], .src = src, .dst = rop->dst};
    mfsdp_result res = rendezvous(be, rt, rop, &mine, err, errlen);
    if (res != MFSDP_OK)
        return res;
    for (int64_t p = 0; p < n; p++)
        if (be->peers[p].op != op->id) {
            snprintf(err, errlen, "%s: member %lld of the %s group issued op %d instead",
                     cl_what(be, rt, rop, "", what, sizeof what), (long long)p, rt->s->mesh.axes[op->axis].name,
                     be->peers[p].op);
            return MFSDP_ERR_MISMATCH;
        }
    for (int64_t p = 0; p < n && e == cudaSuccess; p++)
        if (p != me)
            e = cudaStreamWaitEvent(st, be->peers[p].ev, 0);
    if (e == cudaSuccess)
        e = enqueue_part(be, rt, rop, st);
    if (e == cudaSuccess)
        e = cudaEventRecord(be->done[rop->comm], st);
    if (e != cudaSuccess)
        return mf_cuda_fail(e, err, errlen, "%s",
                            cl_what(be, rt, rop, "enqueueing the device copies", what, sizeof what));

    mine.ev = be->done[rop->comm];
    res = rendezvous(be, rt, rop, &mine, err, errlen);
    if (res != MFSDP_OK)
        return res;
    for (int64_t p = 0; p < n && e == cudaSuccess; p++)
        if (p != me)
            e = cudaStreamWaitEvent(st, be->peers[p].ev, 0);
    if (e != cudaSuccess)
        return mf_cuda_fail(e, err, errlen, "%s", cl_what(be, rt, rop, "waiting for the members", what, sizeof what));
    return MFSDP_OK;
}

static mfsdp_result cl_submit(mf_rt *rt, const mf_rt_op *rop, int64_t microbatch, int64_t event_seq, char *err,
                              size_t errlen)
{
    cl_be *be = be_of(rt);
    mf_cuda_core *c = &be->core;
    mf_gpu_pos pos = mf_cuda_core_pos(c, rop->op, microbatch);
    mfsdp_result res;
    bool timed = rop->op->kind != MF_OP_RECORD && rop->op->kind != MF_OP_WAIT;
    if (timed)
        mf_cuda_core_time_begin(c, rop->op->id, 1, rop->op->stream, microbatch);
    if (mf_opkind_is_collective(rop->op->kind)) {
        if (rop->comm < 0 || rop->comm >= be->ncomms) {
            snprintf(err, errlen, "rank %lld: op %d has no communicator", (long long)rt->rank, rop->op->id);
            return MFSDP_ERR_INTERNAL;
        }
        res = cl_collective(be, rt, rop, err, errlen);
    } else {
        res = mf_cuda_core_local(c, rop, microbatch, event_seq, err, errlen);
    }
    if (timed)
        mf_cuda_core_time_end(c);
    if (res != MFSDP_OK)
        return res;
    return mf_cuda_core_after(c, rop, pos, err, errlen);
}

static mfsdp_result cl_synchronize(mf_rt *rt, char *err, size_t errlen)
{
    return mf_cuda_core_wait(&be_of(rt)->core, NULL, "mfsdp_synchronize", NULL, NULL, err, errlen);
}

static void cl_abort(mf_rt *rt, const char *why)
{
    cl_be *be = be_of(rt);
    if (be && be->local)
        WITH_LOCAL(rt, be, mf_backend_local.abort(rt, why));
}

static void cl_close(mf_rt *rt)
{
    cl_be *be = be_of(rt);
    if (!be)
        return;
    if (be->core.rt && be->core.stream[MF_STREAM_INNER])
        mf_cuda_core_free(&be->core, NULL); /* drains before peers may free what we read */
    if (be->group) {
        /* peers may still enqueue waits on them: the group's yard destroys
         * them once every runtime of the group closed */
        yard_leave(be->group, be->ready, be->done, be->ncomms);
    } else {
        for (int i = 0; i < be->ncomms; i++) {
            if (be->ready && be->ready[i])
                cudaEventDestroy(be->ready[i]);
            if (be->done && be->done[i])
                cudaEventDestroy(be->done[i]);
        }
    }
    if (be->local)
        WITH_LOCAL(rt, be, mf_backend_local.close(rt));
    mf_cuda_core_close(&be->core);
    MF_FREE_ALL_WITH(mf_base_free, be->ready, be->done, be->peers, be->srcs, be->dsts, be);
    rt->be_state = NULL;
}

const mf_backend_vtbl mf_backend_cuda_local = {
    .name = "cuda-local",
    .caps = MF_BE_NATIVE_STREAMS | MF_BE_HOST_EXCHANGE,
    .open = cl_open,
    .alloc = cl_alloc,
    .free = cl_free,
    .alloc_host = mf_cuda_alloc_host,
    .free_host = mf_cuda_free_host,
    .exchange = cl_exchange,
    .comm_init = cl_comm_init,
    .collective = NULL,
    .submit = cl_submit,
    .synchronize = cl_synchronize,
    .stage = mf_cuda_stage,
    .abort = cl_abort,
    .close = cl_close,
};
