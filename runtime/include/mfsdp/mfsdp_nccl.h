/*
 * mfsdp_nccl.h: the GPU part of libmfsdp's public interface (CUDA + NCCL),
 * kept out of mfsdp.h so that trainers without CUDA never see <nccl.h>.
 * Available when the library was built with the backend
 * (mfsdp_backend_available(MFSDP_BACKEND_NCCL)).
 *
 * Two backends share this configuration:
 *
 *   MFSDP_BACKEND_NCCL        one process (or thread) per GPU. Every schedule
 *       op becomes one NCCL call, one kernel, one copy or one event call on a
 *       CUDA stream: inner and outer streams owned by the runtime (non-blocking,
 *       highest priority), compute-stream ops on the trainer's stream. One
 *       communicator per axis group, split from the world communicator
 *       (ncclCommSplit, color = the other coordinates, key = the coordinate on
 *       the axis). Hooks never block the host: forward_pre makes the compute
 *       stream wait for the unsharded weight with cudaStreamWaitEvent.
 *
 *   MFSDP_BACKEND_CUDA_LOCAL  several thread-ranks on ONE GPU (tests and
 *       single-GPU replay): the same device buffers, kernels, streams and
 *       events, with collectives done by device copies and the reduce kernel
 *       between the thread-ranks' buffers. Pass cfg->local_group as for the
 *       local backend.
 *
 * Launch order: one host thread issues each GPU's ops (the trainer's thread,
 * through the hooks), in the schedule's fixed order, which is the same on
 * every rank. The backend also sets NCCL_LAUNCH_ORDER_IMPLICIT=1, once per
 * process under a lock (unless the environment sets it, or
 * MFSDP_NCCL_NO_IMPLICIT_ORDER) before it creates its communicators, so NCCL
 * launches the kernels of the inner and the outer communicator on the device
 * in that host order and two ranks can never wait on each other's other
 * communicator. When that cannot take effect (the variable has another value,
 * or the trainer's NCCL may have launched already) mfsdp_nccl_warning() says
 * so.
 *
 * Errors: every CUDA and NCCL result is checked; the message names the op,
 * the call and NCCL's last error. Communicators are blocking by default (a
 * collective is one short host call); with a watchdog (the default) a thread
 * polls ncclCommGetAsyncError, the completion of every in-flight collective
 * and how long an NCCL call has been running; on an error or past
 * cfg->timeout_ms it aborts the communicators (ncclCommAbort), so a dead peer
 * gives MFSDP_ERR_TIMEOUT or MFSDP_ERR_ABORTED on the survivors' next hook
 * instead of a hang. Collectives must be on the inner or outer stream:
 * mfsdp_create refuses a schedule with one on the compute stream.
 */
#ifndef MFSDP_NCCL_H
#define MFSDP_NCCL_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "mfsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mfsdp_nccl_config flags. */
enum {
    /* Communicators are nonblocking (ncclConfig_t.blocking = 0): creation
     * and splits are bounded by cfg->timeout_ms too. The price, in NCCL
     * 2.28: on 2 or more ranks every group (and lone collective) is run by a
     * new host thread and polled until it settles -- tens of microseconds of
     * host time per collective. Default: blocking (see docs/gpu.md). */
    MFSDP_NCCL_NONBLOCKING = 1u << 0,
    /* Buffers come from ncclMemAlloc (one pool) and are registered with every
     * communicator that moves them (ncclCommRegister). Else cudaMalloc. */
    MFSDP_NCCL_MEM_ALLOC = 1u << 1,
    /* CUDA graph mode: when the compute stream is being captured, the inner
     * and outer streams fork from it at the first op of a microbatch position
     * and join back at its last op (see docs/gpu.md); capture one graph per
     * position (first, middle, last; or one when M == 1). */
    MFSDP_NCCL_GRAPHS = 1u << 2,
    /* The trainer computes on the host (mfsdp-replay, mfsdp-mlp, tests):
     * buffers are CUDA managed memory readable by the host, compute-stream
     * waits block the host until the event completed, and every hook that
     * issued device work returns only once it completed (streams still run
     * concurrently within a hook). Correct for any host access between hooks,
     * at the price of overlap across hooks. No graphs. */
    MFSDP_NCCL_HOST_COMPUTE = 1u << 3,
    /* Leave NCCL_LAUNCH_ORDER_IMPLICIT alone. */
    MFSDP_NCCL_NO_IMPLICIT_ORDER = 1u << 4,
    /* Time every op on the device (two timing events around it on its
     * stream; not inside a capture); read with mfsdp_nccl_timeline(). For
     * measurements: the extra events cost host time per op. */
    MFSDP_NCCL_TIMELINE = 1u << 5,
};

typedef struct mfsdp_nccl_config {
    size_t size;                  /* sizeof(mfsdp_nccl_config), set by the initializers */
    uint32_t version;             /* MFSDP_ABI_VERSION, set by the initializers */
    ncclComm_t world_comm;        /* borrowed: spans exactly the mesh's ranks; the
                                     runtime splits its own communicators from it.
                                     NULL: use unique_id (or a world of 1) */
    ncclUniqueId unique_id;       /* with world_comm NULL and has_unique_id: every
                                     rank passes the same id and its cfg->rank */
    int has_unique_id;
    int device;                   /* CUDA device of this rank; -1: the current one */
    cudaStream_t compute_stream;  /* the trainer's compute stream (borrowed);
                                     NULL: the runtime creates one, see
                                     mfsdp_nccl_stream(). The default streams
                                     are handles too: cudaStreamLegacy (the
                                     legacy default stream, PyTorch's default
                                     stream; not with MFSDP_NCCL_GRAPHS: CUDA
                                     cannot capture it) or cudaStreamPerThread */
    uint32_t flags;               /* MFSDP_NCCL_* */
    int64_t watchdog_poll_ms;     /* watchdog period; 0: no watchdog thread */
} mfsdp_nccl_config;

/* Defaults: world_comm NULL, no unique id, the current device, no compute
 * stream, flags MEM_ALLOC (blocking communicators), watchdog every 100 ms.
 * `mfsdp_nccl_config nc = MFSDP_NCCL_CONFIG_INIT;` or mfsdp_nccl_config_init(&nc). */
#define MFSDP_NCCL_CONFIG_INIT \
    { sizeof(mfsdp_nccl_config), MFSDP_ABI_VERSION, NULL, {{0}}, 0, -1, NULL, MFSDP_NCCL_MEM_ALLOC, 100 }
/* Fills nc with MFSDP_NCCL_CONFIG_INIT. */
MFSDP_API void mfsdp_nccl_config_init(mfsdp_nccl_config *nc);

/* Selects the NCCL backend with *nc (borrowed until mfsdp_create returns).
 * With cfg->backend_config NULL the backend runs a host trainer on one GPU:
 * the defaults plus MFSDP_NCCL_HOST_COMPUTE, a world of exactly one rank (its
 * own communicator), own streams. That is how mfsdp-replay drives it. */
static inline void mfsdp_config_set_nccl(mfsdp_config *cfg, mfsdp_nccl_config *nc)
{
    cfg->backend = MFSDP_BACKEND_NCCL;
    cfg->backend_config = nc;
    cfg->local_group = NULL;
}

/* Selects the one-GPU thread-rank backend on group g; nc may be NULL (the
 * defaults plus MFSDP_NCCL_HOST_COMPUTE: the current device, own streams). */
static inline void mfsdp_config_set_cuda_local(mfsdp_config *cfg, mfsdp_local_group *g,
                                               mfsdp_nccl_config *nc)
{
    cfg->backend = MFSDP_BACKEND_CUDA_LOCAL;
    cfg->backend_config = nc;
    cfg->local_group = g;
}

/*
 * The CUDA stream the runtime uses for `stream` (MFSDP_STREAM_COMPUTE,
 * _INNER or _OUTER): the trainer's compute stream, or the one the runtime
 * created when none was given. NULL when rt is not on a GPU backend.
 */
MFSDP_API cudaStream_t mfsdp_nccl_stream(const mfsdp_runtime *rt, int stream);

/* The CUDA device the runtime runs on; -1 when rt is not on a GPU backend. */
MFSDP_API int mfsdp_nccl_device(const mfsdp_runtime *rt);

/* One op's device time (MFSDP_NCCL_TIMELINE). */
typedef struct mfsdp_nccl_op_time {
    int op;                /* schedule op id; for an NCCL group, its first member */
    int nops;              /* ops covered: 1, or the group's size */
    int stream;            /* MFSDP_STREAM_* */
    int64_t microbatch;    /* -1: a step_begin / step_end op */
    double start_us;       /* when its stream reached it, since `origin` */
    double end_us;         /* when it completed, since `origin` */
    char name[64];         /* "all_gather dp_inner", "cast", ... */
} mfsdp_nccl_op_time;

/* Copies the ops timed since the previous call (at most cap, in issue order;
 * at most one step's worth is kept) into out and forgets them. Times are
 * relative to `origin`, an event with timing the caller recorded before the
 * first of them. Call after mfsdp_synchronize(). Returns the number copied;
 * -1 without MFSDP_NCCL_TIMELINE, when rt is not on a GPU backend, or when an
 * event has not completed or cannot be timed. */
MFSDP_API int mfsdp_nccl_timeline(mfsdp_runtime *rt, cudaEvent_t origin, mfsdp_nccl_op_time *out, int cap);

/* A warning of mfsdp_create that did not stop it (today: why
 * NCCL_LAUNCH_ORDER_IMPLICIT may not take effect), or "" when there is none
 * or rt is not on a GPU backend. Owned by rt. */
MFSDP_API const char *mfsdp_nccl_warning(const mfsdp_runtime *rt);

#ifdef __cplusplus
}
#endif

#endif
