/*
 * mf_cuda_guard: what keeps the NCCL backend from hanging or lying,
 * written so that a test without a device can drive it.
 *
 *   - mf_cuda_calls: the CUDA and NCCL entry points the pollers, the watchdog
 *     and the registration go through; the real ones by default, replaced by
 *     fakes in tests/gpu/test_gpu_guard.c.
 *   - the watchdog (mf_watch): a thread that polls every communicator's
 *     asynchronous error (ncclCommGetAsyncError), the completion of the oldest
 *     in-flight collective per communication stream (an event recorded after
 *     it) and how long the trainer has been inside one NCCL call; on an error
 *     or past the timeout it reports the failure and aborts every
 *     communicator (ncclCommAbort). It works with blocking communicators (the
 *     default), the model of PyTorch's ProcessGroupNCCL: the abort takes the
 *     backend's NCCL lock when it can get it within MF_WATCH_LOCK_MS, and
 *     aborts without it when the trainer is stuck inside a blocking NCCL call
 *     (the only way to release that call).
 *   - registration of buffers with every communicator, undone completely on a
 *     partial failure.
 *   - the issue of a group of collectives: balanced ncclGroupStart/End.
 *   - NCCL_LAUNCH_ORDER_IMPLICIT, set once per process under a lock, with a
 *     warning when it cannot take effect.
 *
 * Threads: mf_watch_track / mf_watch_call_begin/end on the trainer's thread;
 * mf_watch_once on the watchdog thread (or a test's); mf_watch_abort on any.
 */
#ifndef MF_CUDA_GUARD_H
#define MF_CUDA_GUARD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "mf_base.h"

/* ---- the call table ---- */

typedef struct mf_cuda_api {
    cudaError_t (*event_query)(cudaEvent_t ev);
    cudaError_t (*stream_query)(cudaStream_t st);
    cudaError_t (*get_last_error)(void);
    ncclResult_t (*comm_async_error)(ncclComm_t comm, ncclResult_t *state);
    ncclResult_t (*comm_abort)(ncclComm_t comm);
    ncclResult_t (*comm_register)(ncclComm_t comm, void *buf, size_t bytes, void **handle);
    ncclResult_t (*comm_deregister)(ncclComm_t comm, void *handle);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
} mf_cuda_api;

/* The entry points in use (the real ones unless a test replaced them). */
extern mf_cuda_api mf_cuda_calls;
/* Restores the real entry points. */
void mf_cuda_calls_reset(void);

/* cudaEventQuery / cudaStreamQuery through mf_cuda_calls. A not-ready result
 * is also recorded by CUDA as the thread's last error, which the next
 * cudaGetLastError would return (a launch checked that way would fail with
 * "device not ready"); these clear it, so only real errors remain. */
cudaError_t mf_cuda_query_event(cudaEvent_t ev);
cudaError_t mf_cuda_query_stream(cudaStream_t st);

/* ---- the watchdog ---- */

#define MF_WATCH_TRACK 64    /* in-flight collectives tracked per stream */
#define MF_WATCH_LOCK_MS 1000 /* how long an abort waits for the NCCL lock */

typedef struct mf_watch_ring {
    cudaEvent_t ev[MF_WATCH_TRACK];
    int op[MF_WATCH_TRACK];
    int64_t t_ns[MF_WATCH_TRACK];
    int head, count; /* oldest entry, entries in use */
} mf_watch_ring;

/* Called once by the watchdog thread on the first failure (before the abort). */
typedef void (*mf_watch_fail_fn)(void *ctx, mfsdp_result r, const char *msg);

typedef struct mf_watch {
    mf_rt *rt;                   /* borrowed; NULL in tests (ops named by id) */
    int64_t rank, timeout_ms;    /* 0: no timeout */
    ncclComm_t world;            /* borrowed handles, aborted by mf_watch_abort */
    ncclComm_t *comms;
    int ncomms;
    const char *const *names;    /* per comm, for messages; may be NULL */
    pthread_mutex_t *nccl_mu;    /* borrowed: the backend's NCCL-call lock */
    const atomic_bool *capturing; /* borrowed; may be NULL */
    atomic_bool aborted;
    atomic_llong call_since_ns;  /* the trainer is inside an NCCL call since; 0: not */
    pthread_mutex_t ring_mu;
    mf_watch_ring ring[MF_STREAM_COUNT];
    bool ring_events;            /* ring events created */
    /* the thread */
    pthread_t thread;
    pthread_cond_t cv;
    bool started, stop, ready;
    int64_t poll_ms;
    int device;
    mf_watch_fail_fn on_fail;
    void *fail_ctx;
} mf_watch;

/* Initializes the locks (no CUDA call). Returns 0 or an errno. */
int mf_watch_init(mf_watch *w, mf_rt *rt, int64_t rank, int64_t timeout_ms, pthread_mutex_t *nccl_mu);
/* Creates the tracking events (needs the device). */
cudaError_t mf_watch_create_events(mf_watch *w);
/* Starts the thread: every poll_ms, mf_watch_once; on a failure on_fail,
 * then mf_watch_abort, then the thread ends. Returns 0 or an errno. */
int mf_watch_start(mf_watch *w, int64_t poll_ms, int device, mf_watch_fail_fn on_fail, void *ctx);
/* Stops and joins the thread, destroys the events and the locks. */
void mf_watch_destroy(mf_watch *w);

/* The trainer is about to call / has returned from an NCCL function that may
 * block (bounds a blocking communicator's call by the timeout). */
void mf_watch_call_begin(mf_watch *w);
void mf_watch_call_end(mf_watch *w);

/* Records a tracking event on `stream` after a collective (eager only: not
 * while capturing). Trainer's thread. */
void mf_watch_track(mf_watch *w, mf_stream st, cudaStream_t stream, int op);

/* One pass at time now_ns: asynchronous errors (when the NCCL lock is free),
 * an NCCL call open longer than the timeout, then the oldest in-flight
 * collective per stream (completed ones are dropped). Returns MFSDP_OK, or
 * the failure with a message: ERR_ABORTED (ncclRemoteError), ERR_TIMEOUT,
 * ERR_BACKEND. */
mfsdp_result mf_watch_once(mf_watch *w, int64_t now_ns, char *err, size_t errlen);

/* Aborts the world and every communicator, once (later calls return at
 * once); any thread. Takes the NCCL lock when it is free within lock_ms, else
 * aborts without it. */
void mf_watch_abort(mf_watch *w, int64_t lock_ms);
bool mf_watch_aborted(const mf_watch *w);

/* ---- registration ---- */

/* Registers regions[0..nregions) with comms[0..ncomms) into
 * handles[c * stride + k]. On a failure, deregisters every handle made so far
 * (the table is all NULL again) and returns the NCCL result with the failing
 * (comm, region) in *failed_comm / *failed_region. */
ncclResult_t mf_cuda_nccl_register_all(const ncclComm_t *comms, int ncomms, void *const *regions,
                                       const size_t *bytes, int nregions, void **handles, int stride,
                                       int *failed_comm, int *failed_region);
/* Deregisters every non-NULL handle (and NULLs it). */
void mf_cuda_nccl_deregister_all(const ncclComm_t *comms, int ncomms, void **handles, int nregions, int stride);

/* ---- groups ---- */

/* Issues n >= 1 collectives: enqueue(ctx, k) for k = 0, 1, ... in order,
 * stopping after the first that fails (ncclInProgress is no failure); with
 * n > 1 inside one ncclGroupStart/ncclGroupEnd, where ncclGroupEnd is called
 * exactly when ncclGroupStart succeeded -- also after a failed member, since
 * a started group must be closed. Returns the first failure, else (n > 1)
 * ncclGroupEnd's result, else (n == 1) the call's own result (ncclSuccess or
 * ncclInProgress). Allocates nothing. */
ncclResult_t mf_cuda_nccl_group_issue(int n, ncclResult_t (*enqueue)(void *ctx, int k), void *ctx);

/* ---- launch order ---- */

/* What to do with NCCL_LAUNCH_ORDER_IMPLICIT given its current value (NULL:
 * unset) and whether the trainer already uses NCCL in this process (it passed
 * a world communicator, so NCCL may have launched and cached the variable).
 * Returns true when the variable must be set to "1"; writes a warning (or "")
 * into warn. Pure. */
bool mf_cuda_nccl_launch_order_decide(const char *value, bool trainer_nccl, char *warn, size_t warnlen);

/* Applies the decision once per process under a lock (later calls only
 * report); warn receives the warning for this caller, or "". */
void mf_cuda_nccl_launch_order(bool trainer_nccl, char *warn, size_t warnlen);

#endif
