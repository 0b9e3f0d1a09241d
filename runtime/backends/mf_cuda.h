/*
 * mf_cuda: what the two GPU backends (mf_backend_nccl.c: one GPU per
 * rank over NCCL; mf_backend_cuda_local.c: thread-ranks on one GPU) share --
 * the device, the three streams, one CUDA event per schedule event, device
 * memory, the local ops (cast, accumulate, slice, record, wait) as kernels,
 * copies and event calls, CUDA graph fork/join, the host-compute mode,
 * bounded polling instead of blocking synchronization, and the mapping of
 * CUDA and NCCL results onto mfsdp_result.
 *
 * Both backends use the engine's native model (mf_backend.h): the engine
 * calls submit() on the trainer's thread for every op in issue order, and the
 * backend enqueues it on the op's stream; nothing in a hook blocks the host
 * (except compute waits in host-compute mode, bounded by the timeout).
 *
 * Invariants: after mf_cuda_core_open() succeeded, stream[] holds three valid
 * streams and events[] one event per schedule event; memory handed out by
 * mf_cuda_core_alloc() stays valid until mf_cuda_core_close(), which first
 * drains the streams (bounded), so no kernel still runs on freed memory.
 */
#ifndef MF_CUDA_H
#define MF_CUDA_H

#include <pthread.h>
#include <stdatomic.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "mf_cuda_guard.h"
#include "mf_gpu_plan.h"
#include "mf_base.h"
#include "mfsdp_nccl.h"

/* ---- results ---- */

/* The mfsdp_result a CUDA error maps to: out of memory, invalid argument (bad
 * device or value), or backend (everything else: no device, an old driver, a
 * fault). */
mfsdp_result mf_cuda_map_error(cudaError_t e);
/* The mfsdp_result an NCCL result maps to: remote error -> aborted (a peer
 * failed), in progress -> timeout (still pending at a deadline), invalid
 * argument -> invalid argument, others -> backend. */
mfsdp_result mf_cuda_nccl_map_error(ncclResult_t r);
/* NCCL's data type of an mf_dtype (fp32, bf16, fp16). */
ncclDataType_t mf_cuda_nccl_dtype(mf_dtype d);

/* ---- memory ---- */

typedef enum { MF_CUDA_MEM_DEVICE, MF_CUDA_MEM_MANAGED, MF_CUDA_MEM_NCCL } mf_cuda_mem;

typedef struct mf_cuda_block {
    void *p;
    size_t bytes;
    mf_cuda_mem kind;
} mf_cuda_block;

/* ---- the shared state ---- */

typedef struct mf_cuda_core {
    mf_rt *rt;                       /* borrowed */
    int device;
    uint32_t flags;                  /* MFSDP_NCCL_* */
    bool host_compute, graphs;
    int64_t timeout_ms;              /* 0: no limit */
    cudaStream_t stream[MF_STREAM_COUNT];
    bool own_stream[MF_STREAM_COUNT];
    int priority;                    /* of the inner and outer streams */
    int nevents;
    cudaEvent_t *events;             /* one per schedule event */
    mf_gpu_plan *plan;               /* owned */
    int region_last[MF_GPU_POS_COUNT]; /* last op id of each position's region; -1 */

    /* memory: one pool sized from the schedule, then single blocks */
    mf_cuda_mem kind;                /* of every allocation (NCCL becomes DEVICE when
                                        ncclMemAlloc fails: mf_cuda.c) */
    mf_cuda_block pool;
    size_t pool_used;
    mf_cuda_block *blocks;
    int nblocks, cap_blocks;
    bool drained;                    /* streams drained before memory is released */

    /* graph mode */
    bool forked;                     /* the side streams joined the current capture */
    unsigned long long capture_id;
    cudaEvent_t fork_ev, join_ev[MF_STREAM_COUNT];
    atomic_bool capturing;           /* read by watchdogs: no event queries then */
    char warning[512];               /* mfsdp_nccl_warning(); "" when none */

    /* MFSDP_NCCL_TIMELINE: two timing events per timed op */
    struct mf_cuda_timed {
        int op, nops;
        mf_stream stream;
        int64_t microbatch;
        cudaEvent_t a, b;
    } *timed;
    int ntimed, cap_timed, open_timed; /* open_timed: begun and not ended, or -1 */
} mf_cuda_core;

/* Resolves the effective configuration: cfg->backend_config, or the host
 * trainer defaults when it is NULL. */
void mf_cuda_config_resolve(const mfsdp_config *cfg, mfsdp_nccl_config *out);

/* ", cudaStreamLegacy", ", cudaStreamPerThread" or "" (a stream handle in messages). */
const char *mf_cuda_stream_label(cudaStream_t s);

/* Checks the flag combinations (no CUDA call); failures through
 * mf_base_set_error(rt, ...): a compute stream with MFSDP_NCCL_HOST_COMPUTE
 * (named in the message), MFSDP_NCCL_GRAPHS on cudaStreamLegacy (never
 * capturable), a negative watchdog period, unknown flags. */
mfsdp_result mf_cuda_config_check(mf_rt *rt, const mfsdp_nccl_config *nc);

/* Checks that a device exists, picks nc->device (or the current one) and
 * makes it current on the calling thread. */
mfsdp_result mf_cuda_device_pick(mf_rt *rt, const mfsdp_nccl_config *nc, int *device);

/* Sets the device, creates the inner and outer streams at the highest
 * priority, adopts or creates the compute stream, one event per schedule event,
 * the plan for `rank`, and sizes the memory pool from the schedule. Host
 * thread; failures through mf_base_set_error(rt, ...). */
mfsdp_result mf_cuda_core_open(mf_cuda_core *c, mf_rt *rt, const mfsdp_nccl_config *nc, int64_t rank);
/* Releases everything open created (drains first; bounded by the timeout). */
void mf_cuda_core_close(mf_cuda_core *c);

/* Zero-filled memory of `bytes`, 256-byte aligned, of the core's kind (device,
 * managed or ncclMemAlloc): from one pool sized from the schedule (created on
 * the first call), then single blocks. Released at close. */
mfsdp_result mf_cuda_core_alloc(mf_cuda_core *c, size_t bytes, void **out);
void mf_cuda_core_free(mf_cuda_core *c, void *p);
/* The pool and the blocks, for registration with communicators. */
int mf_cuda_core_regions(const mf_cuda_core *c, const mf_cuda_block **out, int cap);

/* The position of a submitted op: step_begin ops belong to microbatch 0,
 * step_end ops to M-1. */
mf_gpu_pos mf_cuda_core_pos(const mf_cuda_core *c, const mf_op *op, int64_t microbatch);

/* Before an op: graph mode forks the side streams into an active capture of
 * the compute stream. *skip is set for a wait the capture must not contain
 * (its event was recorded before the region). */
mfsdp_result mf_cuda_core_before(mf_cuda_core *c, const mf_rt_op *rop, mf_gpu_pos pos, bool *skip,
                                 char *err, size_t errlen);
/* After an op: graph mode joins the side streams back at the region's last op;
 * host-compute mode blocks on compute waits and drains at the end of every
 * hook that issued device work. */
mfsdp_result mf_cuda_core_after(mf_cuda_core *c, const mf_rt_op *rop, mf_gpu_pos pos, char *err,
                                size_t errlen);
/* Enqueues a non-collective op (cast, accumulate, slice, record, wait). */
mfsdp_result mf_cuda_core_local(mf_cuda_core *c, const mf_rt_op *rop, int64_t microbatch,
                                int64_t event_seq, char *err, size_t errlen);

/* Called between polls of a wait; a non-OK result ends the wait with it
 * (e.g. an NCCL communicator's asynchronous error). */
typedef mfsdp_result (*mf_cuda_check_fn)(void *ctx, char *err, size_t errlen);

/* Polls until `ev` completed (or every stream of the core when ev is NULL),
 * never longer than the timeout: MFSDP_ERR_TIMEOUT then. `what` names the
 * wait in messages. */
mfsdp_result mf_cuda_core_wait(mf_cuda_core *c, cudaEvent_t ev, const char *what, mf_cuda_check_fn check,
                               void *ctx, char *err, size_t errlen);

/* MFSDP_NCCL_TIMELINE: a timing event on `st` before the op(s) are enqueued,
 * and one after. No-ops without the flag, while capturing, or when a step's
 * worth is already held. */
void mf_cuda_core_time_begin(mf_cuda_core *c, int op, int nops, mf_stream st, int64_t microbatch);
void mf_cuda_core_time_end(mf_cuda_core *c);

/* "op 12 (all_gather dp_inner, unit layers.3)" via the engine. */
void mf_cuda_describe(const mf_cuda_core *c, const mf_rt_op *rop, char *buf, size_t size);

/* The GPU backends' stage hook (be->stage, checkpoints): a copy between
 * device and host memory (cudaMemcpyDefault: the pointers say which is
 * which) on the runtime's inner stream, complete on return, so it is ordered
 * with the runtime's non-blocking streams on both backends; the checkpoint
 * code synchronized the backend first. */
mfsdp_result mf_cuda_stage(mf_rt *rt, void *dst, const void *src, size_t bytes, char *err, size_t errlen);

/* The GPU backends' alloc_host and free_host (MFSDP_FLAG_OFFLOAD_MAIN,
 * engine/mf_offload.c): zero-filled pinned host memory, cudaHostAlloc with
 * cudaHostAllocMapped | cudaHostAllocPortable, whose device address must be
 * its host address (unified addressing: kernels of any device read it at
 * the same pointer; refused otherwise); MFSDP_ERR_UNSUPPORTED with
 * MFSDP_NCCL_GRAPHS (step_end's host copy cannot be captured); the message
 * goes to rt->err. */
mfsdp_result mf_cuda_alloc_host(mf_rt *rt, size_t bytes, void **out);
void mf_cuda_free_host(mf_rt *rt, void *p);

/* Formats "<what>: <cuda error name> (<string>)" into err and returns the mapped result. */
mfsdp_result mf_cuda_fail(cudaError_t e, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));


#endif
