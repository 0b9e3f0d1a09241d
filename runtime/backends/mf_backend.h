/*
 * mf_backend: the interface between the replay engine (mf_replay.c,
 * mf_streams.c) and a communication backend (mf_backend_local.c,
 * mf_backend_mpi.c, mf_backend_nccl.c, mf_backend_cuda_local.c). What a
 * backend needs of the runtime comes through here and engine/mf_base.h (the
 * runtime struct, allocation, errors, time); a backend includes no other
 * engine module.
 *
 * What the engine does for every backend
 *   - checks the config and the schedule, resolves every op of the schedule to
 *     this rank's buffers (mf_rt_op: pointers, counts, group size, coord) and
 *     precomputes, per (phase, unit, microbatch class), the list of ops a hook
 *     issues (mf_replay.c);
 *   - owns the hook state machine, error stickiness, statistics and views;
 *   - allocates every buffer through be->alloc (host or device memory).
 *
 * Two execution models, chosen by the backend's caps:
 *
 *   worker model (caps without MF_BE_NATIVE_STREAMS; local, mpi)
 *     The engine runs one CPU thread per communication stream (inner, outer);
 *     the compute stream is the trainer's thread. Each stream executes its
 *     ops in issue order. The engine itself executes events (counters under
 *     one mutex; waits sleep on a condition variable, with the timeout) and
 *     local ops (cast, accumulate, slice with the mf_cpu_* kernels below) and
 *     calls be->collective() on the stream's thread for collectives. A
 *     collective is blocking: it returns when dst is complete and src may be
 *     reused, or with an error (timeout: a peer never arrived).
 *
 *   native model (caps with MF_BE_NATIVE_STREAMS; the CUDA/NCCL backend)
 *     The engine calls be->submit() on the host thread for EVERY op, in
 *     issue order, including compute-stream ops, events and local ops; the
 *     backend enqueues it on its own stream for op->op->stream (a cudaStream
 *     per mf_stream; compute = the trainer's stream) and maps event ids to
 *     its own events (record = cudaEventRecord, wait = cudaStreamWaitEvent on
 *     the latest record, which is exactly the schedule's wait semantics).
 *     The engine starts no threads and never blocks in a hook; step_end does
 *     not synchronize (the trainer's compute stream is ordered by events);
 *     mfsdp_synchronize() calls be->synchronize().
 *
 * Order of calls (all on the host thread unless said otherwise):
 *   mfsdp_create:  open -> alloc (buffers, per-stream scratch) -> exchange
 *                  (schedule hash and create status over the world) ->
 *                  comm_init (all communicators) -> [worker threads start]
 *   hooks:         collective (stream threads; worker model) or submit
 *   mfsdp_destroy: [worker threads stop] -> abort (only when ops may still be
 *                  in flight or the runtime failed) -> free (every buffer) ->
 *                  close
 * abort may also be called from a stream thread after one of its collectives
 * timed out, so that peers blocked on the same communicator return at once.
 *
 * Errors: functions return an mfsdp_result. Host-thread functions describe
 * failures with mf_base_set_error(rt, ...); collective/submit/synchronize write
 * their message into the (err, errlen) buffer they are given, because they
 * may run concurrently with the host thread. Messages are lower-case and
 * concrete (which op, which axis, which ranks, how long).
 *
 * Backend state lives in rt->be_state (set by open, released by close).
 * Backends may read the runtime's resolved tables (rt->rops, rt->comms, the
 * schedule) but change nothing in them.
 */
#ifndef MF_BACKEND_H
#define MF_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mf_dtype.h"
#include "mf_schedule.h"
#include "mfsdp.h"

typedef struct mfsdp_runtime mf_rt;

/* One schedule op resolved for this rank (precomputed at create). */
typedef struct mf_rt_op {
    const mf_op *op;          /* the schedule's op: kind, stream, axis, dtype, count, event */
    void *src, *dst;          /* this rank's buffers (backend memory); NULL when none */
    int64_t src_count;        /* elements of src's buffer this rank holds (its range:
                                 < count in a ragged bucket, core/mf_persist.h) */
    int64_t dst_count;        /* elements of dst's buffer this rank holds */
    int64_t n;                /* elements a local op converts or adds on this rank: its
                                 range on the op's side (op->count unless ragged) */
    int64_t src_at;           /* a slice's first source element: coord * count, or the
                                 dst range's offset in the src range (ragged) */
    mf_dtype src_dtype, dst_dtype;
    int comm;                 /* index into rt->comms for collectives; -1 otherwise */
    int64_t nranks;           /* size of the op's axis group; 1 without an axis */
    int64_t coord;            /* this rank's coord on the op's axis; 0 without one */
    bool overlap;             /* src and dst are the same memory (in place) */
    /* A collective of a whole bucket in the prefix form (docs/runtime.md,
     * "Whole buckets"): used[c], c < nranks, is the used prefix (elements)
     * of the chunk of coord c on the op's shard side (dst of a
     * reduce_scatter, src of an all_gather, the buffer of an all_reduce:
     * every member holds the same shard there, so all entries are equal).
     * Only those elements move. disp[c] is where chunk c starts in the
     * op's full side (src of a reduce_scatter, dst of an all_gather; 0 for
     * an all_reduce): c * count for equal shards, the member's range offset
     * less this rank's full range offset in a ragged bucket (format 7,
     * docs/semantics.md §4.6), where chunks differ in length and no padding
     * exists. NULL: the padded form of an equal-shard bucket (every chunk
     * moves all `count` elements at c * count). Set at create, identical on
     * every member. */
    const int64_t *used;
    const int64_t *disp;
    int64_t bytes;            /* bytes this rank sends for the op in its form (stats) */
} mf_rt_op;

/* One communicator: an axis group as seen by one stream of this rank. */
typedef struct mf_rt_comm {
    int axis;
    mf_stream stream;         /* inner or outer (compute only if the schedule says so) */
    int64_t color;            /* mf_layout_axis_color(): which group of the axis */
    int64_t coord;            /* this rank's position in the group */
    int64_t nranks;           /* group size, the axis size */
    int64_t *ranks;           /* world ranks of the group in coord order (nranks) */
} mf_rt_comm;

enum {
    MF_BE_NATIVE_STREAMS = 1u << 0, /* the backend enqueues ops itself (see above) */
    MF_BE_KEEPS_PENDING = 1u << 1,  /* a failed collective may still be in flight (MPI
                                       cannot cancel): its buffers must never be freed
                                       (hand them to mf_base_graveyard) */
    MF_BE_SHARED_MEMORY = 1u << 2,  /* every rank's host buffers are addressable by every
                                       other rank (threads of one process: local) */
    MF_BE_HOST_EXCHANGE = 1u << 3,  /* exchange() of a small record is cheap enough for
                                       every step and never waits for the trainer's
                                       streams (NCCL: a gather on a stream of its own):
                                       the ranks' agreement on the program
                                       (engine/mf_agree.c, docs/runtime.md §4.4) rides on
                                       it after create; without the bit it is skipped */
};

/* One point-to-point transfer of be->transfer_post (checkpoint loads). */
typedef struct mf_be_xfer {
    int64_t peer;             /* world rank */
    void *buf;                /* host memory: sent from, or received into */
    size_t bytes;             /* <= INT_MAX */
    int send;                 /* 1: send buf to peer; 0: receive it from peer */
} mf_be_xfer;

typedef struct mf_backend_vtbl {
    const char *name;
    unsigned caps;            /* MF_BE_* */
    /* Attaches to the world described by cfg; sets rt->be_state and writes
     * this runtime's rank (cfg->rank, or the backend's when -1) and the
     * world size. */
    mfsdp_result (*open)(mf_rt *rt, const mfsdp_config *cfg, int64_t *rank, int64_t *world);
    /* Zero-filled memory of `bytes` (> 0) bytes, aligned to 256 bytes. */
    mfsdp_result (*alloc)(mf_rt *rt, size_t bytes, void **out);
    void (*free)(mf_rt *rt, void *p);
    /* MFSDP_FLAG_OFFLOAD_MAIN (engine/mf_offload.c): zero-filled pinned host
     * memory of `bytes` (> 0) bytes that the backend's kernels and copies can
     * read and write at the same address (mapped, portable: cudaHostAlloc on
     * the GPU backends); free_host releases it. NULL on the CPU backends,
     * whose buffers are host memory already (the flag is a no-op there). */
    mfsdp_result (*alloc_host)(mf_rt *rt, size_t bytes, void **out);
    void (*free_host)(mf_rt *rt, void *p);
    /* All-gather of `bytes` bytes per rank over the world, in rank order,
     * into all[world * bytes]; blocking, bounded by the timeout. At create;
     * with MF_BE_HOST_EXCHANGE also at the hooks' decision points (host
     * thread; the message goes to rt->err). */
    mfsdp_result (*exchange)(mf_rt *rt, const void *mine, size_t bytes, void *all);
    /* Builds every communicator (collective over the world: every rank
     * passes the same list, since the schedules matched). */
    mfsdp_result (*comm_init)(mf_rt *rt, const mf_rt_comm *comms, int ncomms);
    /* Worker model: runs one collective on the calling stream thread. */
    mfsdp_result (*collective)(mf_rt *rt, const mf_rt_op *op, int64_t microbatch, char *err,
                               size_t errlen);
    /* Native model: enqueues one op. event_seq: for record, the record's
     * sequence number for its event (1, 2, ...); for wait, the sequence
     * number of the latest record issued before it (0: none yet). */
    mfsdp_result (*submit)(mf_rt *rt, const mf_rt_op *op, int64_t microbatch, int64_t event_seq,
                           char *err, size_t errlen);
    /* Native model: waits for every submitted op. */
    mfsdp_result (*synchronize)(mf_rt *rt, char *err, size_t errlen);
    /* Host thread, after create (the helpers of mf_helpers.c): all-gather of
     * `bytes` bytes per rank over the world into all[world * bytes], in rank
     * order; every rank calls it in the same order with the same bytes;
     * bounded by the timeout; the message goes to err. On failure `mine` and
     * `all` may still be read or written later (MPI cannot cancel): the
     * caller must not free them. NULL: the backend has none
     * (MFSDP_ERR_UNSUPPORTED). */
    mfsdp_result (*allgather)(mf_rt *rt, const void *mine, size_t bytes, void *all, char *err,
                              size_t errlen);
    /* Host thread (mf_ckpt_share.c): point-to-point transfers over the
     * world, posted in batches while a load reads. transfer_post posts
     * x[0..n) (non-blocking) into the set *set (NULL: a new one) and makes
     * progress on the set's earlier transfers (n == 0: progress only). Each
     * send matches the receive its peer posts for this rank at the same
     * position among their transfers with each other. Everything posted is
     * waited for by one transfer_wait(set) (set NULL: nothing), which the
     * caller makes once after posting, even after a failed post: bounded by
     * the timeout, the message goes to err; it releases the set. On failure
     * the buffers may still be written later (MPI cannot cancel). NULL:
     * the backend has none (a backend with MF_BE_SHARED_MEMORY copies
     * instead). */
    mfsdp_result (*transfer_post)(mf_rt *rt, void **set, const mf_be_xfer *x, int64_t n, char *err,
                                  size_t errlen);
    mfsdp_result (*transfer_wait)(mf_rt *rt, void *set, char *err, size_t errlen);
    /* Host thread (checkpoints: mf_ckpt_stage.c): copies `bytes` between the
     * runtime's buffer memory (a buffer from alloc, or an optimizer state's
     * shard given with a checkpoint call, which lives in the same memory)
     * and host memory: dst and src, one of each. Blocking: dst is complete
     * on return; the caller has synchronized the backend first. The message
     * goes to err. memcpy on the CPU backends, cudaMemcpy on the GPU ones.
     * A checkpoint goes through it on a native backend (device memory), and
     * on the CPU backends when MFSDP_CKPT_STAGE=1 (a test and debug option:
     * every checkpoint access to buffer memory then goes through here, and
     * the CPU backends' hook counts the bytes: mf_ckpt_stage_host_bytes). */
    mfsdp_result (*stage)(mf_rt *rt, void *dst, const void *src, size_t bytes, char *err, size_t errlen);
    /* Makes peers blocked with this rank on a communicator return an error;
     * idempotent; callable from any thread. */
    void (*abort)(mf_rt *rt, const char *why);
    /* Releases rt->be_state (communicators included). */
    void (*close)(mf_rt *rt);
} mf_backend_vtbl;

/* The backends built into this library. */
extern const mf_backend_vtbl mf_backend_local;
#ifdef MFSDP_HAVE_MPI
extern const mf_backend_vtbl mf_backend_mpi;
#endif
/* --- CUDA/NCCL backend (mf_backend_nccl.c, mf_backend_cuda_local.c) --- */
#ifdef MFSDP_HAVE_CUDA
extern const mf_backend_vtbl mf_backend_nccl;
extern const mf_backend_vtbl mf_backend_cuda_local;
#endif

#endif
