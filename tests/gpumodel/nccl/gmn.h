/*
 * gmn: the internals of the CPU model of NCCL (libnccl.so.2, tests/gpumodel/nccl).
 *
 * One communicator of N ranks is one shared-memory segment (gmn_seg, a file in
 * /dev/shm named by the unique id, or derived from the parent's name for a
 * split) that every rank maps, whether the ranks are threads of one process
 * or processes under mpirun. Each rank owns one slot of the segment and
 * writes only there; it reads the others'. Progress is a per-rank phase
 * counter (gmn_slot.phase, monotonic): a rank that wrote its part of phase p
 * stores phase = p and waits until every peer's phase >= p. Data and
 * descriptors are double-buffered by phase parity, so a writer of phase p
 * (buffer p % 2) never overwrites what a reader of phase p - 2 still reads
 * (it passed phase p - 1, which every reader reached after reading).
 * Waits sleep on a futex (gmn_seg.gen, bumped after every phase store) with
 * a short timeout, and on each wake-up look at the abort flags, the peers'
 * liveness and the hang watchdog (GM_NCCL_HANG_S): no wait is unbounded.
 *
 * Invariants:
 *   - a communicator's collectives run on one rank one at a time
 *     (ncclComm.exec_mu), in the order their stream work starts;
 *   - a struct ncclComm lives while the user holds it or stream work (also a
 *     graph node) references it (refs); the segment is unmapped with it;
 *   - the segment's file exists only until every rank joined (the last one
 *     unlinks it); a crashed run's files are swept by ncclGetUniqueId.
 */
#ifndef GMN_H
#define GMN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nccl.h>

#define GMN_CHUNK (128u * 1024u)   /* data bytes per rank per phase buffer */
#define GMN_MAX_RANKS 512
#define GMN_NAME_MAX 96            /* segment file name, NUL included */
#define GMN_ID_MAGIC 0x31636e6d67ULL /* "gmnc1": a unique id made by this model */

/* The kinds of collectives, as compared across ranks. */
typedef enum gmn_kind {
    GMN_ALL_GATHER = 1,
    GMN_REDUCE_SCATTER,
    GMN_ALL_REDUCE,
    GMN_REDUCE,
    GMN_BROADCAST,
    GMN_ALL_TO_ALL,
    GMN_GATHER,
    GMN_SCATTER,
} gmn_kind;
#define GMN_NKINDS 8

/* What a rank called at one sequence number of a communicator. */
typedef struct gmn_desc {
    int32_t kind;                 /* gmn_kind */
    int32_t dtype;                /* ncclDataType_t */
    int32_t op;                   /* ncclRedOp_t (reducing kinds) */
    int32_t root;                 /* rooted kinds, else -1 */
    uint64_t count;               /* elements: per rank for all-gather's send,
                                     reduce-scatter's recv, all-to-all's per-peer
                                     block, gather's send, scatter's recv; else the
                                     whole buffer */
    uint64_t seq;                 /* this rank's collective number on the comm */
} gmn_desc;

typedef struct gmn_slot {
    _Atomic uint64_t phase;       /* the last phase this rank arrived at */
    _Atomic uint64_t host_phase;  /* the last host barrier (splits) it arrived at */
    _Atomic uint32_t joined;      /* 1 once the rank joined */
    _Atomic uint32_t aborted;     /* 1 once the rank aborted its communicator */
    _Atomic int32_t pid;
    int32_t split_color[2];       /* by host phase parity */
    int32_t split_key[2];
    gmn_desc desc[2];             /* by phase parity */
    char pad[64];
    unsigned char data[2][GMN_CHUNK]; /* by phase parity */
} gmn_slot;

typedef struct gmn_seg {
    _Atomic uint64_t ready;       /* GMN_ID_MAGIC once the creator initialized it */
    uint32_t nranks;
    _Atomic uint32_t njoined;
    _Atomic uint32_t gen;         /* futex word: bumped after every phase store */
    uint32_t pad[9];
    gmn_slot slots[];
} gmn_seg;

/* A registration (ncclCommRegister). */
typedef struct gmn_reg {
    uint64_t magic;               /* GMN_REG_MAGIC while registered */
    struct ncclComm *comm;
    const char *p;
    size_t bytes;
    struct gmn_reg *next;
} gmn_reg;
#define GMN_REG_MAGIC 0x7265676e6d67ULL

#define GMN_COMM_MAGIC 0x6d6d6f636e6d67ULL

struct ncclComm {
    uint64_t magic;               /* GMN_COMM_MAGIC while the user holds it */
    _Atomic int refs;             /* the user's, stream work's, the init thread's */
    char name[GMN_NAME_MAX];      /* the segment's file name */
    char comm_name[64];           /* ncclConfig_t.commName */
    gmn_seg *seg;                 /* NULL until joined */
    size_t seg_bytes;
    int rank, nranks, device;
    int root_rank;                /* the rank in the communicator made from a unique id
                                     that this one descends from (splits keep it) */
    bool blocking;
    _Atomic int init_state;       /* ncclInProgress while joining, then the result */
    _Atomic int async_err;        /* ncclSuccess or the asynchronous error */
    _Atomic bool aborted;         /* ncclCommAbort was called on this rank */
    _Atomic int finalize_state;   /* 0: not asked, ncclInProgress, ncclSuccess */
    _Atomic int launch_polls;     /* nonblocking: polls left reporting ncclInProgress */
    _Atomic long outstanding;     /* eager stream work enqueued, not finished */
    pthread_t init_thread;
    bool init_thread_live;
    pthread_mutex_t exec_mu;      /* one collective at a time on this rank */
    uint64_t phase;               /* under exec_mu: this rank's phase counter */
    uint64_t ncoll;               /* under exec_mu: collectives run */
    uint64_t host_phase;          /* the user thread's: host barriers passed */
    uint64_t nsplit;              /* the user thread's: splits done */
    pthread_mutex_t reg_mu;
    gmn_reg *regs;
    pthread_mutex_t err_mu;       /* last_err: written by the user's and stream threads */
    char last_err[512];
};

/* ---- gmn_shm.c: segments, waits ---- */

/* Creates or joins the segment `name` of nranks as `rank` (blocking; bounded
 * by the hang watchdog and by comm->aborted). Sets comm->seg. */
ncclResult_t gmn_seg_join(struct ncclComm *comm, const char *name, int nranks, int rank);
void gmn_seg_unmap(struct ncclComm *comm);
/* Removes files of dead runs: gmnccl-<pid>-... whose pid no longer exists. */
void gmn_seg_sweep(void);
/* Stores phase p for this rank and wakes the waiters. */
void gmn_arrive(struct ncclComm *comm, _Atomic uint64_t *mine, uint64_t p);
void gmn_wake(struct ncclComm *comm);
/* Waits until every rank's counter (phase, or host_phase with `host`) >= p.
 * ncclSuccess; ncclInvalidUsage when this rank aborted; with `host`,
 * ncclRemoteError when a lagging peer aborted or died (msg says which) --
 * without, that peer only sets ncclRemoteError as comm's asynchronous error
 * and the wait goes on until this rank aborts. */
ncclResult_t gmn_wait_all(struct ncclComm *comm, bool host, uint64_t p, const char *what, char *msg, size_t len);
/* Waits until cond(arg) holds, polling every ms, bounded like gmn_wait_all
 * (the hang watchdog); false when comm was aborted first. */
bool gmn_wait_until(struct ncclComm *comm, bool (*cond)(void *), void *arg, const char *what);
/* The hang limit in seconds (GM_NCCL_HANG_S, default 120). */
double gmn_hang_s(void);
_Noreturn void gmn_hang(const char *what, double waited_s);
double gmn_now_s(void);

/* ---- gmn_comm.c ---- */

void gmn_comm_ref(struct ncclComm *comm);
/* A reference when comm is live (looked up and taken atomically); false if not. */
bool gmn_comm_hold(struct ncclComm *comm);
void gmn_comm_unref(struct ncclComm *comm);
/* ncclSuccess when comm is a live communicator ready for calls; else an
 * error with the last-error message set. */
ncclResult_t gmn_comm_check(struct ncclComm *comm, const char *call);
/* Sets the thread's and comm's (if any) last error; returns r. */
ncclResult_t gmn_fail(struct ncclComm *comm, ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sets comm's asynchronous error once (the first one stays). */
void gmn_set_async(struct ncclComm *comm, ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* True when [p, p + bytes) lies in one of comm's registrations. */
bool gmn_registered(struct ncclComm *comm, const void *p, size_t bytes);

/* The fault of GM_NCCL_FAULT for this comm (kind 0: none). */
typedef struct gmn_fault {
    int kind;                     /* 0, GMN_FAULT_STOP, GMN_FAULT_ASYNC */
    int rank;                     /* the root rank it hits */
    uint64_t after;               /* collectives that complete first */
    char comm[64];                /* only the communicator of this commName ("": all) */
} gmn_fault;
#define GMN_FAULT_STOP 1
#define GMN_FAULT_ASYNC 2
const gmn_fault *gmn_fault_for(const struct ncclComm *comm);

/* ---- gmn_group.c: groups ---- */

int gmn_group_depth(void);
/* Records an error of a member (reported by the outermost ncclGroupEnd). */
void gmn_group_error(ncclResult_t r);
/* A creation job started inside a group (gmn_comm.c): the outermost
 * ncclGroupEnd waits for it when its communicator is blocking. Takes a
 * reference to the job. */
struct gmn_job;
void gmn_group_defer_job(struct gmn_job *j, bool blocking);
bool gmn_job_done(void *job);
ncclResult_t gmn_job_result(void *job);
void gmn_job_unref(struct gmn_job *j);

/* ---- gmn_coll.c: collectives ---- */

typedef struct gmn_call {
    gmn_desc d;
    const void *send;
    void *recv;
    struct ncclComm *comm;
    cudaStream_t stream;
} gmn_call;
/* Checks and launches (or defers inside a group) one collective. */
ncclResult_t gmn_coll(gmn_call *c, const char *name);
/* Launches a checked collective as stream work. */
ncclResult_t gmn_launch(const gmn_call *c);
const char *gmn_kind_name(int kind);

/* ---- gmn_device.c: exclusive devices, implicit launch order (opt-in) ---- */

/* 0: off (GM_NCCL_EXCLUSIVE unset); 1: one collective at a time per rank's
 * device; 2: also in host launch order (NCCL_LAUNCH_ORDER_IMPLICIT=1). Read
 * once, at the first launch. */
int gmn_dev_mode(void);
/* Mode 2: the next ticket of root_rank's device (host launch order). */
bool gmn_dev_ticket(int root_rank, uint64_t *ticket);
/* Takes comm's device (in ticket order when ticketed); false when comm was
 * aborted first. Bounded by the hang watchdog. */
bool gmn_dev_acquire(struct ncclComm *comm, bool ticketed, uint64_t ticket, const char *what);
void gmn_dev_release(struct ncclComm *comm, bool ticketed, uint64_t ticket);
/* A ticket that will never run (its item was aborted or skipped). */
void gmn_dev_cancel(int root_rank, uint64_t ticket);

/* ---- gmn_reduce.c: element types and reductions ---- */

/* Bytes of one element of t; 0 for a type the model does not implement. */
size_t gmn_dtype_size(int t);
const char *gmn_dtype_name(int t);
const char *gmn_op_name(int op);
/* out[i] = op over ranks 0..n-1 (in that order) of in[r][i], i < count; for
 * fp16/bf16 in fp32, rounded once; avg divides the sum by n (in fp32 for the
 * 16-bit types, in the type otherwise, integer division for integers). */
void gmn_reduce(int dtype, int op, int n, const void *const *in, void *out, size_t count);

/* Statistics (gm_nccl.h) */
extern _Atomic unsigned long gmn_stat_colls, gmn_stat_registered, gmn_stat_aborts, gmn_stat_mismatches;
extern _Atomic unsigned long gmn_stat_kind[GMN_NKINDS]; /* by gmn_kind - 1 */

#endif
