/*
 * mf_base: the bottom of the runtime engine, which every engine module and
 * every backend may include and which includes nothing of theirs (only the
 * backend interface, mf_backend.h, and core). It holds
 *
 *   the runtime struct   behind the opaque mfsdp_runtime handle, with its
 *                        stream queues (the state every layer reads)
 *   allocation           the accounted allocator every runtime allocation
 *                        goes through (with a test-only failure injection),
 *                        and the graveyard for memory a backend cannot free
 *   errors               the last-error strings, the sticky asynchronous
 *                        failure, the handle check, op descriptions
 *   time                 the monotonic clock, deadlines, condition variables
 *                        on CLOCK_MONOTONIC
 *
 * Invariants: after a successful create nothing is allocated per step; the
 * host thread alone touches the hook state and the event issue counters; the
 * rank mutex `mu` guards queues, event completion counters, the sticky
 * failure and the stream statistics.
 */
#ifndef MF_BASE_H
#define MF_BASE_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "mf_backend.h"
#include "mfsdp.h"

#define MF_RT_ERRLEN 1024

/* Runs `call` (an mfsdp_result expression); on failure stores it in `res`
 * and jumps to `label` (NCCL's NCCLCHECKGOTO). */
#define MF_CHECKGOTO(call, res, label)  \
    do {                                \
        (res) = (call);                 \
        if ((res) != MFSDP_OK)          \
            goto label;                 \
    } while (0)

/* ---- accounted allocation ---- */

void *mf_base_malloc(size_t n);
void *mf_base_calloc(size_t n, size_t size);
/* Zero-filled, `align` a power of two >= sizeof(void *). From MF_RT_HUGE_MIN
 * bytes on, aligned to it and backed by transparent huge pages where the
 * kernel has them (madvise; MFSDP_HUGE_PAGES=0 turns it off): memory-bound
 * collectives over buffers of megabytes pay a TLB miss per 4 KiB page
 * otherwise (docs/runtime.md §6). */
#define MF_RT_HUGE_MIN ((size_t)2 << 20)
void *mf_base_aligned_zalloc(size_t align, size_t n);
void mf_base_free(void *p);
/* Backend buffer allocation in host memory (the CPU backends' alloc/free):
 * 256-byte aligned (huge pages from MF_RT_HUGE_MIN bytes), zeroed; out of
 * memory is reported on rt. */
mfsdp_result mf_base_host_alloc(mf_rt *rt, size_t bytes, void **out);
void mf_base_host_free(mf_rt *rt, void *p);
/* Test hook: the k-th accounted allocation from now (0 = the next) fails;
 * k < 0 disables. Process-wide. */
void mf_base_alloc_fail_at(int64_t k);
/* Accounted allocations currently live (process-wide). */
int64_t mf_base_alloc_live(void);
/* Keeps an accounted allocation alive and reachable for the rest of the
 * process (a pending MPI operation may still write it; a leak checker sees
 * it as reachable). NULL is ignored. Thread-safe. */
void mf_base_graveyard(void *p);

/* ---- the runtime struct ---- */

/* A queued op: what a stream thread needs to run it. */
typedef struct mf_rt_entry {
    int32_t op;             /* op index */
    int64_t microbatch;
    int64_t seq;            /* record: this record's sequence number; wait: the target */
} mf_rt_entry;

typedef struct mf_rt_stream {
    mf_rt *rt;
    mf_stream id;
    uint64_t stress;        /* stress-mode generator (mf_stress.h); 0: off */
    pthread_t thread;
    bool started;
    pthread_cond_t work;    /* signalled when an entry is queued or on stop */
    mf_rt_entry *queue;     /* ring of cap entries */
    int64_t cap;            /* entries: the most this stream is issued in one step */
    int64_t pushed;         /* entries queued so far (host) */
    int64_t popped;         /* entries taken by the thread */
    int64_t completed;      /* entries finished (executed or skipped after a failure) */
    int current;            /* op being executed, -1 when idle */
    int64_t current_since;  /* ns (mf_base_now_ns) when it started; 0 for a record or wait */
    int64_t busy_ns;        /* executing ops */
    int64_t wait_ns;        /* blocked in event waits */
    char err[MF_RT_ERRLEN]; /* message of this stream's failing op */
} mf_rt_stream;

/* Op lists per hook: one per position a hook is issued at (MF_POS_* bits
 * of core/mf_schedule.h: middle, first, last, both, a short step's end). */
enum { MF_MB_CLASSES = MF_POS_SHORT + 1 };

/* A live runtime's first field: set by mfsdp_create, cleared by
 * mfsdp_destroy before the memory is freed. */
#define MF_RT_MAGIC 0x6d667364702d7274ull   /* "mfsdp-rt" */

struct mfsdp_runtime {
    uint64_t magic;             /* MF_RT_MAGIC while live */
    const mfsdp_schedule *sh;   /* borrowed */
    const mf_schedule *s;       /* sh->s */
    mfsdp_config cfg;
    int64_t rank, world;
    int64_t coords[MF_MAX_AXES];
    const mf_backend_vtbl *be;
    void *be_state;             /* backend's */
    bool native;                /* be->caps & MF_BE_NATIVE_STREAMS */
    bool synchronous;           /* MFSDP_FLAG_SYNCHRONOUS (worker model only) */

    void **bufs;                /* per schedule buffer; backend memory */
    void *mem_base;             /* the one allocation: persistent region, then the
                                   transient arena (docs/runtime.md) */
    int64_t mem_bytes;          /* its size */
    struct mf_offload *offload; /* MFSDP_FLAG_OFFLOAD_MAIN (mf_offload.c); NULL without it */
    mf_rt_op *rops;             /* per schedule op */
    int nlists;                 /* MF_PHASE_COUNT * (nunits + 1) * MF_MB_CLASSES */
    int *list_start;            /* nlists + 1 offsets into list_ops */
    int *list_ops;              /* op indices, ascending within a list */
    int64_t *ev_issued;         /* per event: records issued (host only) */
    int64_t *ev_done;           /* per event: latest completed record (under mu) */
    int ncomms;
    mf_rt_comm *comms;
    int comm_index[MF_STREAM_COUNT][MF_MAX_AXES]; /* -1 when unused */

    pthread_mutex_t mu;
    pthread_cond_t cv;          /* event completions, stream completions, failure */
    bool sync_ready;            /* mu/cv initialized */
    bool stop;                  /* stream threads exit */
    bool ops_waiting_space;     /* the host waits for room in a queue */
    mf_rt_stream streams[MF_STREAM_COUNT]; /* [MF_STREAM_COMPUTE] unused by threads */

    /* hook state (host only; mf_trace.c): the next hook expected */
    mf_phase next_phase;
    int next_unit;
    int64_t next_mb;
    int eval_unit;              /* evaluation pass: the unit of the open window, or
                                   the next one; -1 outside a pass */
    bool eval_open;             /* between eval_forward_pre and _post */

    /* the program agreement (mf_agree.c; host only) */
    bool agree;                 /* on: world > 1, a world all-gather, MFSDP_AGREE != 0 */
    int64_t steps_begun;        /* mfsdp_step_begin calls admitted */
    void *agree_all;            /* world records: the exchange's destination */

    mfsdp_result failed;        /* sticky asynchronous failure (under mu) */
    char fail_msg[MF_RT_ERRLEN];
    char err[MF_RT_ERRLEN];     /* last error returned to the caller */

    int nviews;
    mfsdp_tensor_view *views;
    struct mf_debug *check;     /* check mode state (mf_debug.c); NULL when off */
    mfsdp_stats stats;          /* host-side counters; stream times merged on read */
};

/* ---- errors ---- */

/* Every public entry taking a runtime calls this first: MFSDP_OK for a live
 * runtime; a NULL one is MFSDP_ERR_INVALID_ARGUMENT, one whose magic is gone
 * (destroyed, or never created) MFSDP_ERR_INVALID_USAGE, the message in the
 * thread's last error naming fn. Best effort: a destroyed handle's memory
 * may be unmapped or reused (docs/reliability.md). */
mfsdp_result mf_base_handle_check(const mf_rt *rt, const char *fn);
/* The same test without a message, for the queries that return a value. */
bool mf_base_live(const mf_rt *rt);
/* Formats rt->err (or the thread's handle-less message when rt is NULL) and
 * returns code. */
mfsdp_result mf_base_set_error(mf_rt *rt, mfsdp_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records the first asynchronous failure (thread-safe; takes mu) and wakes
 * every waiter; later failures keep the first message. */
void mf_base_fail(mf_rt *rt, mfsdp_result code, const char *msg);
/* mf_base_fail, then aborts the backend's communicators with the runtime's
 * first failure (the root cause peers are told), not necessarily msg. */
void mf_base_fail_and_abort(mf_rt *rt, mfsdp_result code, const char *msg);
/* A short description of op i for messages: "op 12 (all_gather dp_inner, unit layers.3)". */
void mf_base_describe_op(const mf_rt *rt, int i, char *buf, size_t size);
/* The calling thread's handle-less last error (MF_RT_ERRLEN bytes): what
 * mfsdp_last_error(NULL) returns. */
char *mf_base_thread_error(void);

/* ---- time ---- */

/* Monotonic clock, nanoseconds. */
int64_t mf_base_now_ns(void);
/* Absolute CLOCK_MONOTONIC deadline timeout_ms from now (0: none). */
struct timespec mf_base_deadline(int64_t timeout_ms);
/* pthread_cond_timedwait on CLOCK_MONOTONIC, or plain wait when timeout_ms
 * is 0; returns ETIMEDOUT past the deadline. */
int mf_base_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t timeout_ms,
                      const struct timespec *deadline);
/* Initializes a condition variable on CLOCK_MONOTONIC. */
int mf_base_cond_init(pthread_cond_t *cv);
/* One round of a wait on cv (mu held; the caller re-checks its condition):
 * the first max_spins rounds release mu and yield the core, so that a short
 * wait costs neither side a futex system call (threads that outnumber the
 * cores pay one on both sides of every hand-off otherwise); later rounds
 * sleep until the deadline (timeout_ms <= 0: none), which the first of them
 * sets (deadline->tv_sec < 0: not set yet), so a wait that ends while
 * yielding reads no clock. Returns ETIMEDOUT past the deadline. */
int mf_base_spin_wait(pthread_mutex_t *mu, pthread_cond_t *cv, int max_spins, int64_t timeout_ms,
                      struct timespec *deadline, int *spins);

#endif
