/*
 * mf_cuda: the device side shared by the NCCL and the one-GPU
 * thread-rank backends (see mf_cuda.h): streams, events, memory,
 * local ops, graph fork/join, host-compute mode, bounded waits and result
 * mapping.
 *
 * Event semantics: the schedule's wait waits for the latest record of its
 * event issued before it; cudaStreamWaitEvent waits for the latest
 * cudaEventRecord made before the call. Because the engine submits every op
 * in issue order on one host thread, one cudaEvent per schedule event gives
 * exactly the schedule's semantics. A wait with no earlier record (event_seq
 * 0) enqueues nothing.
 *
 * Nothing here synchronizes the host in a hook, except where the host is the
 * consumer (host-compute mode) and then only through bounded polling.
 */
#include "mf_cuda.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mf_cuda_kernels.h"

/* ---- results ---- */

mfsdp_result mf_cuda_map_error(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return MFSDP_OK;
    case cudaErrorMemoryAllocation:
        return MFSDP_ERR_OUT_OF_MEMORY;
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidValue:
        return MFSDP_ERR_INVALID_ARGUMENT;
    default:
        return MFSDP_ERR_BACKEND;
    }
}

mfsdp_result mf_cuda_nccl_map_error(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return MFSDP_OK;
    case ncclRemoteError:
        return MFSDP_ERR_ABORTED;
    case ncclInProgress:
        return MFSDP_ERR_TIMEOUT;
    case ncclInvalidArgument:
        return MFSDP_ERR_INVALID_ARGUMENT;
    default:
        return MFSDP_ERR_BACKEND;
    }
}

ncclDataType_t mf_cuda_nccl_dtype(mf_dtype d)
{
    switch (d) {
    case MF_BF16: return ncclBfloat16;
    case MF_FP16: return ncclFloat16;
    default: return ncclFloat32;
    }
}

mfsdp_result mf_cuda_fail(cudaError_t e, char *err, size_t errlen, const char *fmt, ...)
{
    char what[MF_RT_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (err && errlen)
        snprintf(err, errlen, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return mf_cuda_map_error(e);
}

void mf_cuda_describe(const mf_cuda_core *c, const mf_rt_op *rop, char *buf, size_t size)
{
    mf_base_describe_op(c->rt, rop->op->id, buf, size);
}

const char *mf_cuda_stream_label(cudaStream_t s)
{
    if (s == cudaStreamLegacy)
        return ", cudaStreamLegacy";
    if (s == cudaStreamPerThread)
        return ", cudaStreamPerThread";
    return "";
}

void mf_cuda_config_resolve(const mfsdp_config *cfg, mfsdp_nccl_config *out)
{
    if (cfg->backend_config) {
        *out = *(const mfsdp_nccl_config *)cfg->backend_config;
        return;
    }
    mfsdp_nccl_config_init(out);
    out->flags |= MFSDP_NCCL_HOST_COMPUTE;
}

mfsdp_result mf_cuda_config_check(mf_rt *rt, const mfsdp_nccl_config *nc)
{
    bool host = (nc->flags & MFSDP_NCCL_HOST_COMPUTE) != 0;
    if (host && (nc->flags & MFSDP_NCCL_GRAPHS))
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "MFSDP_NCCL_GRAPHS needs a device trainer: it cannot be combined with "
                                 "MFSDP_NCCL_HOST_COMPUTE (or a NULL backend_config)");
    if (host && nc->compute_stream)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "MFSDP_NCCL_HOST_COMPUTE: the host is the compute stream, so "
                                 "compute_stream must be NULL (it is %p%s)", (void *)nc->compute_stream,
                                 mf_cuda_stream_label(nc->compute_stream));
    if ((nc->flags & MFSDP_NCCL_GRAPHS) && nc->compute_stream == cudaStreamLegacy)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "MFSDP_NCCL_GRAPHS: the compute stream is the legacy default stream "
                                 "(cudaStreamLegacy), which CUDA cannot capture; pass a stream the trainer "
                                 "created (or cudaStreamPerThread)");
    if (nc->watchdog_poll_ms < 0)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT, "watchdog_poll_ms is %lld (0: no watchdog)",
                                 (long long)nc->watchdog_poll_ms);
    uint32_t known = MFSDP_NCCL_NONBLOCKING | MFSDP_NCCL_MEM_ALLOC | MFSDP_NCCL_GRAPHS |
                     MFSDP_NCCL_HOST_COMPUTE | MFSDP_NCCL_NO_IMPLICIT_ORDER | MFSDP_NCCL_TIMELINE;
    if (nc->flags & ~known)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT, "unknown mfsdp_nccl_config flags 0x%x",
                                 (unsigned)(nc->flags & ~known));
    return MFSDP_OK;
}

mfsdp_result mf_cuda_device_pick(mf_rt *rt, const mfsdp_nccl_config *nc, int *device)
{
    char msg[MF_RT_ERRLEN];
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1) {
        if (e == cudaSuccess)
            e = cudaErrorNoDevice;
        mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "no usable CUDA device (cudaGetDeviceCount)");
        return mf_base_set_error(rt, r, "%s", msg);
    }
    *device = nc->device;
    if (*device < 0 && (e = cudaGetDevice(device)) != cudaSuccess) {
        mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "cudaGetDevice");
        return mf_base_set_error(rt, r, "%s", msg);
    }
    if (*device >= ndev)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT, "device %d out of range (%d CUDA devices)",
                                 *device, ndev);
    if ((e = cudaSetDevice(*device)) != cudaSuccess) {
        mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "cudaSetDevice(%d)", *device);
        return mf_base_set_error(rt, r, "%s", msg);
    }
    return MFSDP_OK;
}

/* ---- open / close ---- */

static int64_t pool_bytes(const mf_schedule *s)
{
    /* The runtime allocates one block at the planned size (mf_rt.c setup). */
    return (s->mem_persistent + s->mem_transient + 255) / 256 * 256;
}

mfsdp_result mf_cuda_core_open(mf_cuda_core *c, mf_rt *rt, const mfsdp_nccl_config *nc, int64_t rank)
{
    cudaError_t e;
    char msg[MF_RT_ERRLEN];
    c->rt = rt;
    c->flags = nc->flags;
    c->host_compute = (nc->flags & MFSDP_NCCL_HOST_COMPUTE) != 0;
    c->graphs = (nc->flags & MFSDP_NCCL_GRAPHS) != 0;
    c->timeout_ms = rt->cfg.timeout_ms;
    c->kind = c->host_compute ? MF_CUDA_MEM_MANAGED
              : (nc->flags & MFSDP_NCCL_MEM_ALLOC) ? MF_CUDA_MEM_NCCL
                                                   : MF_CUDA_MEM_DEVICE;
    for (int p = 0; p < MF_GPU_POS_COUNT; p++)
        c->region_last[p] = -1;
    atomic_init(&c->capturing, false);
    mfsdp_result cr = mf_cuda_config_check(rt, nc);
    if (cr != MFSDP_OK)
        return cr;

    mfsdp_result dr = mf_cuda_device_pick(rt, nc, &c->device);
    if (dr != MFSDP_OK)
        return dr;

    int least = 0, greatest = 0;
    if ((e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess)
        goto cuda_fail;
    c->priority = greatest;
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) {
        if ((e = cudaStreamCreateWithPriority(&c->stream[st], cudaStreamNonBlocking, greatest)) != cudaSuccess)
            goto cuda_fail;
        c->own_stream[st] = true;
    }
    if (nc->compute_stream) {
        c->stream[MF_STREAM_COMPUTE] = nc->compute_stream;
    } else {
        if ((e = cudaStreamCreateWithFlags(&c->stream[MF_STREAM_COMPUTE], cudaStreamNonBlocking)) != cudaSuccess)
            goto cuda_fail;
        c->own_stream[MF_STREAM_COMPUTE] = true;
    }

    const mf_schedule *s = rt->s;
    c->events = mf_base_calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *c->events);
    if (!c->events)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (events)");
    for (int i = 0; i < s->nevents; i++) {
        if ((e = cudaEventCreateWithFlags(&c->events[i], cudaEventDisableTiming)) != cudaSuccess)
            goto cuda_fail;
        c->nevents = i + 1;
    }
    if ((e = cudaEventCreateWithFlags(&c->fork_ev, cudaEventDisableTiming)) != cudaSuccess)
        goto cuda_fail;
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++)
        if ((e = cudaEventCreateWithFlags(&c->join_ev[st], cudaEventDisableTiming)) != cudaSuccess)
            goto cuda_fail;

    c->open_timed = -1;
    if (nc->flags & MFSDP_NCCL_TIMELINE) {
        int64_t per_step = 0;
        for (int i = 0; i < s->nops; i++)   /* every stream's ops of one full step */
            per_step += mf_when_runs_per_step(s->ops[i].when, s->ops[i].phase, s->microbatches);
        c->timed = mf_base_calloc((size_t)per_step + 1, sizeof *c->timed);
        if (!c->timed)
            return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (timeline)");
        for (int64_t i = 0; i < per_step + 1; i++) {
            if ((e = cudaEventCreate(&c->timed[i].a)) != cudaSuccess)
                goto cuda_fail;
            c->cap_timed = (int)i + 1;
            if ((e = cudaEventCreate(&c->timed[i].b)) != cudaSuccess)
                goto cuda_fail;
        }
    }

    c->plan = mf_gpu_plan_build(s, rank, msg, sizeof msg);
    if (!c->plan)
        return mf_base_set_error(rt, MFSDP_ERR_INTERNAL, "cannot map the schedule onto the device: %s", msg);
    for (int p = 0; p < MF_GPU_POS_COUNT; p++) {
        const mf_gpu_region *r = &c->plan->region[p];
        if (r->present && r->nops > 0)
            c->region_last[p] = r->ops[r->nops - 1];
    }
    return MFSDP_OK;

cuda_fail: {
    mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "CUDA setup on device %d", c->device);
    return mf_base_set_error(rt, r, "%s", msg);
}
}

static void release_block(mf_cuda_block *b)
{
    if (!b->p)
        return;
    if (b->kind == MF_CUDA_MEM_NCCL)
        ncclMemFree(b->p);
    else
        cudaFree(b->p);
    b->p = NULL;
}

static void drain(mf_cuda_core *c)
{
    if (c->drained)
        return;
    c->drained = true;
    char msg[MF_RT_ERRLEN];
    if (mf_cuda_core_wait(c, NULL, "draining the streams before release", NULL, NULL, msg, sizeof msg) !=
        MFSDP_OK)
        fprintf(stderr, "libmfsdp: rank %lld: %s\n", (long long)c->rt->rank, msg);
}

void mf_cuda_core_close(mf_cuda_core *c)
{
    if (!c->rt)
        return;
    if (c->stream[MF_STREAM_INNER])
        drain(c);
    for (int i = 0; i < c->nblocks; i++)
        release_block(&c->blocks[i]);
    mf_base_free(c->blocks);
    c->blocks = NULL;
    c->nblocks = 0;
    release_block(&c->pool);
    for (int i = 0; i < c->nevents; i++)
        cudaEventDestroy(c->events[i]);
    mf_base_free(c->events);
    c->events = NULL;
    if (c->fork_ev)
        cudaEventDestroy(c->fork_ev);
    for (int st = 0; st < MF_STREAM_COUNT; st++) {
        if (c->join_ev[st])
            cudaEventDestroy(c->join_ev[st]);
        if (c->own_stream[st] && c->stream[st])
            cudaStreamDestroy(c->stream[st]);
        c->stream[st] = NULL;
    }
    for (int i = 0; i < c->cap_timed; i++) {
        cudaEventDestroy(c->timed[i].a);
        if (c->timed[i].b)
            cudaEventDestroy(c->timed[i].b);
    }
    mf_base_free(c->timed);
    c->timed = NULL;
    c->cap_timed = 0;
    mf_gpu_plan_free(c->plan);
    c->plan = NULL;
    c->rt = NULL;
}

/* ---- memory ---- */

static cudaError_t raw_alloc(mf_cuda_core *c, size_t bytes, void **out)
{
    switch (c->kind) {
    case MF_CUDA_MEM_MANAGED:
        return cudaMallocManaged(out, bytes, cudaMemAttachGlobal);
    case MF_CUDA_MEM_NCCL: {
        ncclResult_t r = ncclMemAlloc(out, bytes);
        return r == ncclSuccess ? cudaSuccess : cudaErrorMemoryAllocation;
    }
    default:
        return cudaMalloc(out, bytes);
    }
}

/* Allocates and zero-fills a block (synchronously: create time only). */
static mfsdp_result new_block(mf_cuda_core *c, size_t bytes, mf_cuda_block *b)
{
    char msg[MF_RT_ERRLEN];
    void *p = NULL;
    cudaError_t e = raw_alloc(c, bytes, &p);
    if (e != cudaSuccess && c->kind == MF_CUDA_MEM_NCCL) {
        /* ncclMemAlloc needs the driver's cuMem support (and a real NCCL):
         * without it, plain device memory, not registered with NCCL, for this
         * block and every later one. */
        fprintf(stderr, "libmfsdp: warning: rank %lld: ncclMemAlloc of %zu bytes failed: using cudaMalloc (buffers "
                        "not registered with NCCL)\n",
                (long long)c->rt->rank, bytes);
        c->kind = MF_CUDA_MEM_DEVICE;
        e = raw_alloc(c, bytes, &p);
    }
    if (e != cudaSuccess) {
        mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "cannot allocate %zu bytes of %s memory on device %d",
                                      bytes,
                                      c->kind == MF_CUDA_MEM_NCCL      ? "ncclMemAlloc"
                                      : c->kind == MF_CUDA_MEM_MANAGED ? "managed"
                                                                       : "device",
                                      c->device);
        return mf_base_set_error(c->rt, r, "%s", msg);
    }
    *b = (mf_cuda_block){.p = p, .bytes = bytes, .kind = c->kind};
    cudaStream_t st = c->stream[MF_STREAM_INNER];
    if ((e = cudaMemsetAsync(p, 0, bytes, st)) != cudaSuccess || (e = cudaStreamSynchronize(st)) != cudaSuccess) {
        release_block(b);
        mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "cannot zero %zu bytes on device %d", bytes, c->device);
        return mf_base_set_error(c->rt, r, "%s", msg);
    }
    return MFSDP_OK;
}

mfsdp_result mf_cuda_core_alloc(mf_cuda_core *c, size_t bytes, void **out)
{
    size_t need = (bytes + 255) / 256 * 256;
    if (!c->pool.p && c->nblocks == 0) {
        size_t want = (size_t)pool_bytes(c->rt->s);
        if (want < need)
            want = need;
        mfsdp_result r = new_block(c, want, &c->pool);
        if (r != MFSDP_OK)
            return r;
        c->pool_used = 0;
    }
    if (c->pool.p && c->pool.bytes - c->pool_used >= need) {
        *out = (char *)c->pool.p + c->pool_used;
        c->pool_used += need;
        return MFSDP_OK;
    }
    if (c->nblocks == c->cap_blocks) {
        int cap = c->cap_blocks ? 2 * c->cap_blocks : 8;
        mf_cuda_block *nb = mf_base_calloc((size_t)cap, sizeof *nb);
        if (!nb)
            return mf_base_set_error(c->rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (block table)");
        if (c->blocks)
            memcpy(nb, c->blocks, (size_t)c->nblocks * sizeof *nb);
        mf_base_free(c->blocks);
        c->blocks = nb;
        c->cap_blocks = cap;
    }
    mfsdp_result r = new_block(c, need, &c->blocks[c->nblocks]);
    if (r != MFSDP_OK)
        return r;
    *out = c->blocks[c->nblocks++].p;
    return MFSDP_OK;
}

void mf_cuda_core_free(mf_cuda_core *c, void *p)
{
    /* Memory is released at close, after the streams drained and the
     * communicators deregistered it; here only make sure nothing still runs. */
    (void)p;
    if (c->rt && c->stream[MF_STREAM_INNER])
        drain(c);
}

int mf_cuda_core_regions(const mf_cuda_core *c, const mf_cuda_block **out, int cap)
{
    int n = 0;
    if (c->pool.p && n < cap)
        out[n++] = &c->pool;
    for (int i = 0; i < c->nblocks && n < cap; i++)
        out[n++] = &c->blocks[i];
    return n;
}

/* ---- waiting ---- */

static void backoff(int iter)
{
    if (iter < 64) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, iter < 1024 ? 20000 : 200000}; /* 20 us, then 200 us */
    nanosleep(&ts, NULL);
}

mfsdp_result mf_cuda_core_wait(mf_cuda_core *c, cudaEvent_t ev, const char *what, mf_cuda_check_fn check,
                               void *ctx, char *err, size_t errlen)
{
    int64_t t0 = mf_base_now_ns();
    int pending = 1;
    for (int iter = 0;; iter++) {
        pending = 0;
        cudaError_t e = cudaSuccess;
        if (ev) {
            e = mf_cuda_query_event(ev);
            pending = e == cudaErrorNotReady;
        } else {
            for (int st = 0; st < MF_STREAM_COUNT && (e == cudaSuccess || e == cudaErrorNotReady); st++) {
                if (!c->stream[st])
                    continue;
                cudaError_t q = mf_cuda_query_stream(c->stream[st]);
                if (q == cudaErrorNotReady)
                    pending++;
                else
                    e = q;
            }
        }
        if (e != cudaSuccess && e != cudaErrorNotReady)
            return mf_cuda_fail(e, err, errlen, "rank %lld: %s", (long long)c->rt->rank, what);
        if (!pending)
            return MFSDP_OK;
        if (check) {
            mfsdp_result r = check(ctx, err, errlen);
            if (r != MFSDP_OK)
                return r;
        }
        int64_t waited_ms = (mf_base_now_ns() - t0) / 1000000;
        if (c->timeout_ms > 0 && waited_ms >= c->timeout_ms) {
            snprintf(err, errlen,
                     "rank %lld: %s timed out after %lld ms: the device did not get there; a stream is "
                     "stuck, usually in a collective whose peers stopped",
                     (long long)c->rt->rank, what, (long long)waited_ms);
            return MFSDP_ERR_TIMEOUT;
        }
        backoff(iter);
    }
}

/* ---- ops ---- */

mf_gpu_pos mf_cuda_core_pos(const mf_cuda_core *c, const mf_op *op, int64_t microbatch)
{
    int64_t M = c->rt->s->microbatches;
    if (op->phase == MF_PHASE_STEP_BEGIN)
        microbatch = 0;
    else if (op->phase == MF_PHASE_STEP_END)
        microbatch = M - 1;
    return mf_gpu_plan_position(microbatch, M);
}

static mfsdp_result fork_streams(mf_cuda_core *c, char *err, size_t errlen)
{
    cudaError_t e = cudaEventRecord(c->fork_ev, c->stream[MF_STREAM_COMPUTE]);
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT && e == cudaSuccess; st++)
        e = cudaStreamWaitEvent(c->stream[st], c->fork_ev, 0);
    if (e != cudaSuccess)
        return mf_cuda_fail(e, err, errlen, "rank %lld: forking the inner and outer streams into the capture",
                            (long long)c->rt->rank);
    return MFSDP_OK;
}

static mfsdp_result join_streams(mf_cuda_core *c, char *err, size_t errlen)
{
    cudaError_t e = cudaSuccess;
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT && e == cudaSuccess; st++) {
        e = cudaEventRecord(c->join_ev[st], c->stream[st]);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(c->stream[MF_STREAM_COMPUTE], c->join_ev[st], 0);
    }
    if (e != cudaSuccess)
        return mf_cuda_fail(e, err, errlen, "rank %lld: joining the inner and outer streams back into the capture",
                            (long long)c->rt->rank);
    return MFSDP_OK;
}

mfsdp_result mf_cuda_core_before(mf_cuda_core *c, const mf_rt_op *rop, mf_gpu_pos pos, bool *skip,
                                 char *err, size_t errlen)
{
    *skip = false;
    if (!c->graphs)
        return MFSDP_OK;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    cudaError_t e = cudaStreamGetCaptureInfo(c->stream[MF_STREAM_COMPUTE], &status, &id, NULL, NULL, NULL, NULL);
    if (e != cudaSuccess)
        return mf_cuda_fail(e, err, errlen, "rank %lld: cudaStreamGetCaptureInfo on the compute stream",
                            (long long)c->rt->rank);
    if (status == cudaStreamCaptureStatusInvalidated) {
        snprintf(err, errlen, "rank %lld: the capture of the compute stream was invalidated before op %d",
                 (long long)c->rt->rank, rop->op->id);
        return MFSDP_ERR_BACKEND;
    }
    if (status != cudaStreamCaptureStatusActive) {
        c->forked = false; /* a capture ended (or none began): eager launches */
        atomic_store(&c->capturing, false);
        return MFSDP_OK;
    }
    if (!c->forked || id != c->capture_id) {
        atomic_store(&c->capturing, true);
        mfsdp_result r = fork_streams(c, err, errlen);
        if (r != MFSDP_OK)
            return r;
        c->forked = true;
        c->capture_id = id;
    }
    *skip = rop->op->kind == MF_OP_WAIT && c->plan->elided[pos] && c->plan->elided[pos][rop->op->id];
    return MFSDP_OK;
}

mfsdp_result mf_cuda_core_after(mf_cuda_core *c, const mf_rt_op *rop, mf_gpu_pos pos, char *err,
                                size_t errlen)
{
    const mf_op *op = rop->op;
    bool region_end = c->region_last[pos] == op->id;
    if (c->graphs && c->forked && region_end) {
        mfsdp_result r = join_streams(c, err, errlen);
        c->forked = false;
        atomic_store(&c->capturing, false);
        return r;
    }
    if (!c->host_compute)
        return MFSDP_OK;
    mfsdp_result r = MFSDP_OK;
    if (op->stream == MF_STREAM_COMPUTE && op->kind == MF_OP_WAIT) /* the host is the compute stream */
        r = mf_cuda_core_wait(c, c->events[op->event], "the host's wait for the event", NULL, NULL, err, errlen);
    else if (op->stream == MF_STREAM_COMPUTE && op->kind != MF_OP_RECORD)
        r = mf_cuda_core_wait(c, NULL, "the host's wait for the streams", NULL, NULL, err, errlen);
    if (r != MFSDP_OK) {
        /* named only now: no snprintf per successful op */
        char what[200], msg[MF_RT_ERRLEN];
        mf_cuda_describe(c, rop, what, sizeof what);
        snprintf(msg, sizeof msg, "%s", err);
        snprintf(err, errlen, "%s: %s", what, msg);
        return r;
    }
    /* The host may touch any buffer once the hook returns (it writes grad_local
     * after backward_pre, reads the gradient after step_end, updates
     * main_weight): drain at the end of every hook that issued something, so
     * no device op of an earlier hook still reads or writes. */
    if (c->plan->hook_last[pos] && c->plan->hook_last[pos][op->id])
        return mf_cuda_core_wait(c, NULL, "draining the streams at the end of the hook", NULL, NULL, err, errlen);
    return MFSDP_OK;
}

mfsdp_result mf_cuda_core_local(mf_cuda_core *c, const mf_rt_op *rop, int64_t microbatch,
                                int64_t event_seq, char *err, size_t errlen)
{
    const mf_op *op = rop->op;
    cudaStream_t st = c->stream[op->stream];
    cudaError_t e = cudaSuccess;
    switch (op->kind) {
    case MF_OP_RECORD:
        e = cudaEventRecord(c->events[op->event], st);
        break;
    case MF_OP_WAIT:
        if (event_seq > 0) /* nothing recorded yet: nothing to wait for */
            e = cudaStreamWaitEvent(st, c->events[op->event], 0);
        break;
    case MF_OP_CAST:
        e = mf_cuda_cast(rop->dst, rop->dst_dtype, rop->src, rop->src_dtype, rop->n, st); /* the rank's range */
        break;
    case MF_OP_ACCUMULATE:
        e = mf_cuda_accumulate(rop->dst, rop->dst_dtype, rop->src, rop->src_dtype, rop->n, microbatch <= 0, st);
        break;
    case MF_OP_SLICE: {
        size_t es = mf_dtype_size(rop->src_dtype);
        e = mf_cuda_copy(rop->dst, (const char *)rop->src + (size_t)rop->src_at * es, (size_t)rop->n * es, st);
        break;
    }
    default: {
        char what[200];
        mf_cuda_describe(c, rop, what, sizeof what);
        snprintf(err, errlen, "rank %lld: %s is not a local op", (long long)c->rt->rank, what);
        return MFSDP_ERR_INTERNAL;
    }
    }
    if (e != cudaSuccess) {
        char what[200];
        mf_cuda_describe(c, rop, what, sizeof what);
        return mf_cuda_fail(e, err, errlen, "rank %lld: %s on the %s stream", (long long)c->rt->rank, what,
                            mf_stream_name(op->stream));
    }
    return MFSDP_OK;
}

/* ---- timeline ---- */

void mf_cuda_core_time_begin(mf_cuda_core *c, int op, int nops, mf_stream st, int64_t microbatch)
{
    if (!c->timed || c->ntimed >= c->cap_timed || atomic_load(&c->capturing))
        return;
    struct mf_cuda_timed *t = &c->timed[c->ntimed];
    if (cudaEventRecord(t->a, c->stream[st]) != cudaSuccess)
        return;
    t->op = op;
    t->nops = nops;
    t->stream = st;
    t->microbatch = microbatch;
    c->open_timed = c->ntimed;
}

void mf_cuda_core_time_end(mf_cuda_core *c)
{
    if (c->open_timed < 0)
        return;
    struct mf_cuda_timed *t = &c->timed[c->open_timed];
    c->open_timed = -1;
    if (cudaEventRecord(t->b, c->stream[t->stream]) == cudaSuccess)
        c->ntimed++;
}

MFSDP_API int mfsdp_nccl_timeline(mfsdp_runtime *rt, cudaEvent_t origin, mfsdp_nccl_op_time *out, int cap)
{
    if (!rt || !rt->be_state || (rt->be != &mf_backend_nccl && rt->be != &mf_backend_cuda_local) || !out ||
        cap < 0)
        return -1;
    mf_cuda_core *c = (mf_cuda_core *)rt->be_state;
    if (!c->timed)
        return -1;
    int n = c->ntimed < cap ? c->ntimed : cap, res = n;
    for (int i = 0; i < n; i++) {
        const struct mf_cuda_timed *t = &c->timed[i];
        const mf_op *op = &rt->s->ops[t->op];
        float a = 0, b = 0;
        if (cudaEventElapsedTime(&a, origin, t->a) != cudaSuccess ||
            cudaEventElapsedTime(&b, origin, t->b) != cudaSuccess) {
            (void)cudaGetLastError(); /* not ready / not timed: reported as -1 */
            res = -1;
            break;
        }
        out[i] = (mfsdp_nccl_op_time){.op = t->op, .nops = t->nops, .stream = (int)t->stream,
                                      .microbatch = t->microbatch, .start_us = 1e3 * a, .end_us = 1e3 * b};
        if (mf_opkind_is_collective(op->kind))
            snprintf(out[i].name, sizeof out[i].name, "%s %s", mf_opkind_name(op->kind),
                     rt->s->mesh.axes[op->axis].name);
        else
            snprintf(out[i].name, sizeof out[i].name, "%s", mf_opkind_name(op->kind));
    }
    c->ntimed = 0;
    return res;
}

/* ---- public queries ---- */

MFSDP_API cudaStream_t mfsdp_nccl_stream(const mfsdp_runtime *rt, int stream)
{
    if (!rt || !rt->be_state || stream < 0 || stream >= MF_STREAM_COUNT ||
        (rt->be != &mf_backend_nccl && rt->be != &mf_backend_cuda_local))
        return NULL;
    /* Both GPU backends keep their core first in their state. */
    const mf_cuda_core *c = (const mf_cuda_core *)rt->be_state;
    return c->stream[stream];
}

MFSDP_API int mfsdp_nccl_device(const mfsdp_runtime *rt)
{
    if (!rt || !rt->be_state || (rt->be != &mf_backend_nccl && rt->be != &mf_backend_cuda_local))
        return -1;
    return ((const mf_cuda_core *)rt->be_state)->device;
}

MFSDP_API const char *mfsdp_nccl_warning(const mfsdp_runtime *rt)
{
    if (!rt || !rt->be_state || (rt->be != &mf_backend_nccl && rt->be != &mf_backend_cuda_local))
        return "";
    return ((const mf_cuda_core *)rt->be_state)->warning;
}

mfsdp_result mf_cuda_stage(mf_rt *rt, void *dst, const void *src, size_t bytes, char *err, size_t errlen)
{
    /* Both GPU backends keep their core first in their state. On the inner
     * stream, not the legacy default one: the runtime's streams are
     * non-blocking, so a plain cudaMemcpy would not be ordered with them (and
     * from pageable memory it may return before its DMA is done). */
    const mf_cuda_core *c = (const mf_cuda_core *)rt->be_state;
    cudaStream_t st = c->stream[MF_STREAM_INNER];
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(st);
    return e == cudaSuccess ? MFSDP_OK
                            : mf_cuda_fail(e, err, errlen, "copy of %zu bytes on the inner stream (checkpoint staging)",
                                           bytes);
}

mfsdp_result mf_cuda_alloc_host(mf_rt *rt, size_t bytes, void **out)
{
    char msg[MF_RT_ERRLEN];
    void *p = NULL, *dev = NULL;
    *out = NULL;
    if (((const mf_cuda_core *)rt->be_state)->graphs)   /* both backends keep their core first */
        return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED,
                                 "not with MFSDP_NCCL_GRAPHS: step_end waits for the step and copies "
                                 "the delivered gradient into host memory, which a captured step_end "
                                 "cannot do; drop one of the two flags");
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
        mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "cudaHostAlloc of %zu bytes (mapped, portable)", bytes);
        return mf_base_set_error(rt, r, "%s", msg);
    }
    if ((e = cudaHostGetDevicePointer(&dev, p, 0)) != cudaSuccess || dev != p) {
        cudaFreeHost(p);
        if (e != cudaSuccess) {
            mfsdp_result r = mf_cuda_fail(e, msg, sizeof msg, "cudaHostGetDevicePointer");
            return mf_base_set_error(rt, r, "%s", msg);
        }
        return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED,
                                 "pinned host memory at %p has device address %p: offload needs "
                                 "unified addressing (the same pointer on host and device)", p, dev);
    }
    memset(p, 0, bytes);
    *out = p;
    return MFSDP_OK;
}

void mf_cuda_free_host(mf_rt *rt, void *p)
{
    (void)rt;
    if (p)
        cudaFreeHost(p);
}
