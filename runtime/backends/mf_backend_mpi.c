/*
 * mf_backend_mpi: one process per rank over MPI (worker model). Built only
 * when CMake finds MPI (MFSDP_HAVE_MPI).
 *
 * Communicators: the trainer's communicator is duplicated (the world); each
 * mesh axis used by a collective gets MPI_Comm_split(world, color =
 * mf_layout_axis_color, key = the coord on the axis), duplicated once per
 * stream that uses it, so inner and outer traffic never share a
 * communicator and two stream threads never use one communicator at once.
 * This needs MPI_THREAD_MULTIPLE, checked at open. Every communicator the
 * runtime makes (the world's duplicate, each axis split and its per-stream
 * duplicates, the error channel) gets MPI_ERRORS_RETURN, so an MPI error on
 * them is an mfsdp error, not the end of the job. Open MPI 4.1 reports the
 * error of a failed nonblocking collective (libnbc: MPI_ERR_TRUNCATE when
 * ranks disagree on a count) at MPI_Test on MPI_COMM_WORLD instead, whose
 * handler is the trainer's: the ranks therefore agree on every program and
 * helper size before a collective is posted (engine/mf_agree.c), so no count
 * mismatch reaches MPI from the hooks or the helpers.
 *
 * Collectives follow the schedule's op semantics (mf_schedule.h), which for an
 * in-place reduce-scatter put the result at dst[0..n) -- what MPI_IN_PLACE
 * does for MPI_Reduce_scatter_block, unlike NCCL's in-place layout (result at
 * recvbuff + rank * n; mfsdp never asks for that one). An in-place all-gather
 * (src == dst) first moves the rank's contribution from dst[0..n) to
 * dst[c*n..] and then runs with MPI_IN_PLACE. bf16 and fp16 sums use
 * user-defined ops that add in fp32 and round once per pairwise combination;
 * `avg` is the sum divided by the group size afterwards. Counts above the
 * chunk limit (INT_MAX, or MFSDP_MPI_MAX_COUNT for tests) are split:
 * all-reduce by ranges, all-gather with a strided receive type,
 * reduce-scatter by packing each chunk's blocks into a scratch buffer.
 *
 * Waiting: by default every collective is nonblocking and polled with
 * MPI_Test back to back, like MPI_Wait, with a sched_yield every 16 polls,
 * for its first MF_MPI_YIELD_MS (Open MPI's nonblocking collectives progress
 * only inside MPI calls, so a sleeping poller stalls every round of the
 * algorithm; with more processes than cores Open MPI's progress yields the
 * core itself), then with sleeps that back off from 1 us to 1 ms (a long
 * wait: a peer is late, burn no core), bounded by the timeout. A timeout or an abort
 * returns an error and leaves the request pending (MPI cannot cancel a
 * collective); the runtime is failed from then on.
 *
 * Small and large reduce-scatters on a power-of-2 group (at most
 * MF_MPI_RH_MAX or at least MF_MPI_RH_LARGE bytes in all) do not use libnbc:
 * rh_reduce_scatter runs recursive halving over
 * MPI_Isend/MPI_Irecv, partner distance 1 first, each rank keeping the blocks
 * whose index agrees with its own rank in the bits seen so far, so it ends
 * with its own block: log2(p) exchanges where libnbc's binomial reduce to
 * rank 0 and linear scatter take log2(p) + 1 latency-bound rounds. Its sums
 * pair the same groups of ranks as that binomial tree ((r0 + r1) + (r2 +
 * r3), ...), each combination with MPI_Reduce_local and the same MPI_Op, so
 * the bits equal libnbc's (addition commutes; test_mpi_rh compares them).
 * Its waits are wait_request's. A large one runs chunk by chunk (the same
 * elements of every block; each element's sums are the same whatever the
 * chunk), so its scratch stays under MF_MPI_RH_SCRATCH: libnbc's binomial
 * reduce moves the whole vector at every level of its tree and measured 3-4 x
 * slower at 16 MiB (docs/performance.md); in between the two measured alike.
 * MFSDP_MPI_P2P=0 (read at create) turns it off.
 *
 * MFSDP_MPI_BLOCKING=1 in the environment (read at create) selects the
 * blocking calls instead (MPI_Allreduce, ...): Open MPI runs its tuned
 * algorithms for them, faster than its nonblocking (libnbc) ones, but a
 * blocking collective cannot be bounded, so the timeout does not apply to
 * collectives and a peer that never joins one (or fails before it) leaves
 * this rank waiting; the trade-off is measured in docs/performance.md.
 *
 * Root cause across ranks: each runtime keeps one receive posted on its own
 * duplicate of the world (the error communicator) for a peer's failure
 * message. A rank that fails first (its abort is not caused by such a
 * message) sends its message to every peer, fire and forget; a peer polling a
 * collective picks it up (one thread at a time) and aborts with it, so its
 * error names the first failing rank's own message instead of a timeout.
 */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mf_base.h"
#include "mf_ckpt_stage.h"
#include "mf_cpu_kernels.h"

typedef struct mf_mpi_state {
    MPI_Comm world;            /* dup of the trainer's communicator */
    bool world_ok;
    int ncomms;
    MPI_Comm *comms;           /* per runtime comm index; MPI_COMM_NULL until made */
    MPI_Op sum_bf16, sum_fp16;
    bool ops_ok;
    int64_t max_count;         /* elements per MPI call */
    bool blocking;             /* MFSDP_MPI_BLOCKING=1: blocking collectives */
    void *scratch[MF_STREAM_COUNT]; /* reduce-scatter packing, per stream */
    int64_t scratch_elems[MF_STREAM_COUNT];
    bool p2p;                  /* small reduce-scatters by rh_reduce_scatter */
    void *rh[MF_STREAM_COUNT]; /* its scratch, per stream */
    size_t rh_bytes[MF_STREAM_COUNT];
    /* Whole buckets' prefix form (mf_rt_op.used): per op, -1 (the padded
     * calls) or the start in `whole` of its recvcounts[g] then displs[g] */
    int64_t *whole_at;
    int *whole;
    void *pack[MF_STREAM_COUNT]; /* a reduce-scatter's prefixes packed, per stream */
    size_t pack_bytes[MF_STREAM_COUNT];
    _Atomic bool aborted;
    _Atomic int abandoned;     /* collectives left pending (timeout, abort): their
                                  buffers may still be written, so none is freed */
    char why[768];
    /* the error channel (see the top of the file) */
    MPI_Comm errcomm;
    bool err_ok;               /* errcomm made and err_req posted */
    bool err_done;             /* err_req completed (a peer's message is in err_in) */
    bool sent;                 /* this rank sent its own failure */
    pthread_mutex_t err_mu;    /* one thread tests err_req at a time */
    MPI_Request err_req;
    char err_in[640];
} mf_mpi_state;

#define MF_MPI_ERR_TAG 7411
#define MF_MPI_CKPT_TAG 7412
/* How long a wait polls with sched_yield before it sleeps between polls. */
#define MF_MPI_YIELD_MS 200
/* Reduce-scatters of at most MF_MPI_RH_MAX or at least MF_MPI_RH_LARGE bytes
 * in all (every rank's blocks) run by rh_reduce_scatter on power-of-2
 * groups, in chunks whose scratch fits MF_MPI_RH_SCRATCH bytes per stream. */
#define MF_MPI_RH_MAX 16384
#define MF_MPI_RH_LARGE ((size_t)16 << 20)
#define MF_MPI_RH_SCRATCH ((size_t)8 << 20)
#define MF_MPI_RH_TAG 7413

/* The MPI reductions of bf16 and fp16: inout[i] += in[i] in fp32, rounded
 * once (mf_cpu_kernels_add; the sum is commutative, so the bits are in + inout's). */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    mf_cpu_kernels_add(inout, MF_BF16, in, MF_BF16, *len);
}

static void fp16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    mf_cpu_kernels_add(inout, MF_FP16, in, MF_FP16, *len);
}

static mfsdp_result mpi_fail(char *err, size_t errlen, int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    snprintf(err, errlen, "%s failed: %s", what, s);
    return MFSDP_ERR_BACKEND;
}

/* Checks the error channel for a peer's failure message; on one, aborts
 * this runtime with it. Any thread; never blocks. */
static void poll_peer_failure(mf_mpi_state *st)
{
    if (!st->err_ok || st->err_done || pthread_mutex_trylock(&st->err_mu) != 0)
        return;
    int done = 0;
    MPI_Status status;
    if (!st->err_done && MPI_Test(&st->err_req, &done, &status) == MPI_SUCCESS && done) {
        st->err_done = true;
        st->err_in[sizeof st->err_in - 1] = '\0';
        if (!st->aborted) {
            snprintf(st->why, sizeof st->why, "rank %d failed first: %s", status.MPI_SOURCE,
                     st->err_in);
            st->aborted = true;
        }
    }
    pthread_mutex_unlock(&st->err_mu);
}

/* Polls a request until it completes, the timeout passes or the runtime is
 * aborted. */
static mfsdp_result wait_request(mf_rt *rt, mf_mpi_state *st, MPI_Request *req, const char *what,
                                 char *err, size_t errlen)
{
    int64_t start = mf_base_now_ns();
    int64_t limit = rt->cfg.timeout_ms * 1000000;
    long nap = 1000;
    for (unsigned polls = 0;; polls++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, errlen, rc, what);
        if (done)
            return MFSDP_OK;
        /* Like MPI_Wait, poll back to back (Open MPI's progress yields the
         * core itself when oversubscribed); every 16th poll: the error channel
         * (its MPI_Test is another round of progress), the abort flag, the
         * clock, and one yield of our own (a trainer thread on this core). */
        if (polls % 16 != 15)
            continue;
        poll_peer_failure(st);
        if (st->aborted) {
            st->abandoned++;
            snprintf(err, errlen, "%s aborted: %s", what, st->why);
            return MFSDP_ERR_ABORTED;
        }
        int64_t waited = mf_base_now_ns() - start;
        if (limit > 0 && waited > limit) {
            st->abandoned++;
            snprintf(err, errlen,
                     "%s timed out after %lld ms (a peer never joined it; MPI cannot cancel the "
                     "collective, so this runtime is finished)",
                     what, (long long)rt->cfg.timeout_ms);
            return MFSDP_ERR_TIMEOUT;
        }
        if (waited < (int64_t)MF_MPI_YIELD_MS * 1000000) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, nap};
        nanosleep(&ts, NULL);
        if (nap < 1000000)
            nap *= 2;
    }
}

static mfsdp_result mpi_open(mf_rt *rt, const mfsdp_config *cfg, int64_t *rank, int64_t *world)
{
    int inited = 0, finalized = 0, level = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                                 "MPI is not initialized (call MPI_Init_thread with "
                                 "MPI_THREAD_MULTIPLE first, and destroy runtimes before MPI_Finalize)");
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_USAGE,
                                 "MPI was initialized without MPI_THREAD_MULTIPLE (provided level %d); "
                                 "the inner and outer streams call MPI concurrently",
                                 level);
    if (!cfg->mpi_comm)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "config.mpi_comm is NULL (use mfsdp_config_set_mpi)");
    mf_mpi_state *st = mf_base_calloc(1, sizeof *st);
    if (!st)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory");
    st->world = MPI_COMM_NULL;
    st->errcomm = MPI_COMM_NULL;
    pthread_mutex_init(&st->err_mu, NULL);
    /* Nonblocking and polled, so that a rank that never calls mfsdp_create
     * gives a timeout here instead of a hang (MPI_Comm_dup is a blocking
     * collective). */
    MPI_Request req;
    int rc = MPI_Comm_idup(*(MPI_Comm *)cfg->mpi_comm, &st->world, &req);
    if (rc != MPI_SUCCESS) {
        mf_base_free(st);
        mpi_fail(rt->err, sizeof rt->err, rc, "MPI_Comm_idup of the world");
        return MFSDP_ERR_BACKEND;
    }
    char msg[MF_RT_ERRLEN];
    mfsdp_result res = wait_request(rt, st, &req, "duplicating the world communicator (every rank must call "
                                    "mfsdp_create)", msg, sizeof msg);
    if (res != MFSDP_OK) {
        /* The pending request still writes st->world if the peers ever
         * arrive and MPI cannot cancel it: st stays allocated (leaked). */
        return mf_base_set_error(rt, res, "%s", msg);
    }
    st->world_ok = true;
    MPI_Comm_set_errhandler(st->world, MPI_ERRORS_RETURN);
    int r = 0, n = 0;
    MPI_Comm_rank(st->world, &r);
    MPI_Comm_size(st->world, &n);
    rt->be_state = st;
    if (cfg->rank >= 0 && cfg->rank != r)
        return mf_base_set_error(rt, MFSDP_ERR_INVALID_ARGUMENT,
                                 "config.rank %lld differs from the rank %d in the MPI communicator",
                                 (long long)cfg->rank, r);
    const char *blk = getenv("MFSDP_MPI_BLOCKING");
    st->blocking = blk && !strcmp(blk, "1");
    const char *p2p = getenv("MFSDP_MPI_P2P");
    st->p2p = !(p2p && !strcmp(p2p, "0"));
    st->max_count = INT_MAX;
    const char *env = getenv("MFSDP_MPI_MAX_COUNT");   /* test knob: force chunking */
    if (env && atoll(env) > 0 && atoll(env) < INT_MAX)
        st->max_count = atoll(env);
    *rank = r;
    *world = n;
    return MFSDP_OK;
}

static mfsdp_result mpi_exchange(mf_rt *rt, const void *mine, size_t bytes, void *all)
{
    mf_mpi_state *st = rt->be_state;
    MPI_Request req;
    int rc = MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, st->world, &req);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rt->err, sizeof rt->err, rc, "MPI_Iallgather of the world exchange");
    char msg[MF_RT_ERRLEN];
    /* At create: the schedule hashes; after it (a live runtime): the ranks'
     * agreement at a hook (engine/mf_agree.c). */
    mfsdp_result res = wait_request(rt, st, &req,
                                    rt->magic == MF_RT_MAGIC
                                        ? "the ranks' agreement at a hook (every rank must reach it)"
                                        : "the schedule hash exchange",
                                    msg, sizeof msg);
    if (res != MFSDP_OK)
        mf_base_set_error(rt, res, "%s", msg);
    return res;
}

static mfsdp_result mpi_allgather(mf_rt *rt, const void *mine, size_t bytes, void *all, char *err,
                                  size_t errlen)
{
    mf_mpi_state *st = rt->be_state;
    if (bytes > INT_MAX) {
        snprintf(err, errlen, "all-gather of %zu bytes per rank exceeds MPI's count limit", bytes);
        return MFSDP_ERR_INVALID_ARGUMENT;
    }
    MPI_Request req;
    int rc = MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, st->world, &req);
    if (rc != MPI_SUCCESS)
        return mpi_fail(err, errlen, rc, "MPI_Iallgather over the world (helper)");
    return wait_request(rt, st, &req,
                        "the world all-gather (of a helper, or of the ranks' agreement at a hook: every "
                        "rank must make it)",
                        err, errlen);
}

/* Checkpoint loads' point-to-point transfers (be->transfer_post / _wait):
 * sends and receives posted on the world communicator (collectives there
 * never match point-to-point messages) as the load reads, then each waited
 * for in turn, bounded by the timeout. Posting in list order keeps MPI's
 * per-pair ordering equal to the lists' order. */
typedef struct mpi_xfer_set {
    MPI_Request *req;
    int64_t *peer;              /* world rank, negated - 1 for a receive (for messages) */
    int64_t n, cap, done;       /* req[0..done) are known complete */
    mfsdp_result res;           /* the first failed post */
} mpi_xfer_set;

static int mpi_xfer_grow(mpi_xfer_set *t, int64_t need)
{
    if (t->n + need <= t->cap)
        return 0;
    int64_t cap = t->cap ? t->cap : 64;
    while (cap < t->n + need)
        cap *= 2;
    MPI_Request *req = mf_base_calloc((size_t)cap, sizeof *req);
    int64_t *peer = mf_base_calloc((size_t)cap, sizeof *peer);
    if (!req || !peer) {
        mf_base_free(req);
        mf_base_free(peer);
        return -1;
    }
    if (t->n) {
        memcpy(req, t->req, (size_t)t->n * sizeof *req);
        memcpy(peer, t->peer, (size_t)t->n * sizeof *peer);
    }
    mf_base_free(t->req);
    mf_base_free(t->peer);
    t->req = req;
    t->peer = peer;
    t->cap = cap;
    return 0;
}

static mfsdp_result mpi_transfer_post(mf_rt *rt, void **set, const mf_be_xfer *x, int64_t n, char *err,
                                      size_t errlen)
{
    mf_mpi_state *st = rt->be_state;
    mpi_xfer_set *t = *set;
    if (!t && !(t = *set = mf_base_calloc(1, sizeof *t))) {
        snprintf(err, errlen, "out of memory (transfer requests)");
        return MFSDP_ERR_OUT_OF_MEMORY;
    }
    if (t->res != MFSDP_OK)
        return t->res;
    if (mpi_xfer_grow(t, n) != 0) {
        snprintf(err, errlen, "out of memory (%lld transfer requests)", (long long)(t->n + n));
        return t->res = MFSDP_ERR_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < n; i++) {
        const mf_be_xfer *x1 = &x[i];
        int rc = x1->bytes > INT_MAX ? MPI_ERR_COUNT
                 : x1->send ? MPI_Isend(x1->buf, (int)x1->bytes, MPI_BYTE, (int)x1->peer, MF_MPI_CKPT_TAG,
                                        st->world, &t->req[t->n])
                            : MPI_Irecv(x1->buf, (int)x1->bytes, MPI_BYTE, (int)x1->peer, MF_MPI_CKPT_TAG,
                                        st->world, &t->req[t->n]);
        if (rc != MPI_SUCCESS)
            return t->res = mpi_fail(err, errlen, rc, x1->send ? "MPI_Isend (checkpoint load)"
                                                                : "MPI_Irecv (checkpoint load)");
        t->peer[t->n++] = x1->send ? x1->peer : -x1->peer - 1;
    }
    /* Progress (Open MPI moves data only inside MPI calls): test the oldest
     * transfers not known complete. */
    for (int flag = 1; flag && t->done < t->n;) {
        int rc = MPI_Test(&t->req[t->done], &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return t->res = mpi_fail(err, errlen, rc, "MPI_Test (checkpoint load)");
        t->done += flag;
    }
    return MFSDP_OK;
}

static mfsdp_result mpi_transfer_wait(mf_rt *rt, void *set, char *err, size_t errlen)
{
    mf_mpi_state *st = rt->be_state;
    mpi_xfer_set *t = set;
    if (!t)
        return MFSDP_OK;
    mfsdp_result res = t->res;
    for (int64_t i = t->done; i < t->n && res == MFSDP_OK; i++) {
        char what[96];
        int64_t p = t->peer[i];
        snprintf(what, sizeof what, "a checkpoint load's transfer %s rank %lld", p >= 0 ? "to" : "from",
                 (long long)(p >= 0 ? p : -p - 1));
        res = wait_request(rt, st, &t->req[i], what, err, errlen);
    }
    if (res != MFSDP_OK && t->n > t->done) {
        st->abandoned++;       /* requests may be pending: never free them or their buffers */
        return res;
    }
    mf_base_free(t->req);       /* all complete */
    mf_base_free(t->peer);
    mf_base_free(t);
    return res;
}

/* Bytes of every rank's blocks of a reduce-scatter. */
static size_t rh_total(const mf_rt_op *r)
{
    return (size_t)(r->op->count * r->nranks) * mf_dtype_size(r->op->dtype);
}

/* Whether rh_reduce_scatter runs this op (decided alike on every rank: the
 * op, the group size and the environment are the same everywhere). */
static bool rh_applies(const mf_mpi_state *st, const mf_rt_op *r)
{
    int64_t g = r->nranks;
    return st->p2p && !st->blocking && r->op->kind == MF_OP_REDUCE_SCATTER && g >= 2 &&
           (g & (g - 1)) == 0 && r->op->count <= st->max_count &&
           (rh_total(r) <= MF_MPI_RH_MAX || rh_total(r) >= MF_MPI_RH_LARGE);
}

/* Elements of every block that one round of rh_reduce_scatter takes: all of
 * them, or as many as keep its scratch (2 g blocks of that length) within
 * MF_MPI_RH_SCRATCH. */
static int64_t rh_chunk(const mf_rt_op *r)
{
    int64_t fit = (int64_t)(MF_MPI_RH_SCRATCH / (2 * (size_t)r->nranks * mf_dtype_size(r->op->dtype)));
    return r->op->count < fit ? r->op->count : fit > 0 ? fit : 1;
}

/* Bytes of scratch rh_reduce_scatter needs for r. */
static size_t rh_scratch_bytes(const mf_rt_op *r)
{
    return 2 * (size_t)r->nranks * (size_t)rh_chunk(r) * mf_dtype_size(r->op->dtype);
}

/* Recursive-halving reduce-scatter of n elements per block over the group
 * `comm` of g = 2^k ranks (the top of the file), elements [o, o + len) of
 * every block at a time (rh_chunk). In the step of distance d (1, 2, 4, ...)
 * this rank `me` holds the blocks b with b % d == me % d and trades with
 * me ^ d: it sends those whose bit d differs from its own (packed) and adds
 * the partner's copy of those it keeps; after the last step it holds block
 * me. The scratch (rh_bytes of its stream) holds the accumulator (all g
 * blocks of a chunk), the packed half sent and the half received. */
static mfsdp_result rh_reduce_scatter(mf_rt *rt, mf_mpi_state *st, const mf_rt_op *r,
                                      const char *src, char *dst, MPI_Datatype type, MPI_Op sum,
                                      MPI_Comm comm, char *err, size_t errlen)
{
    int64_t n = r->op->count, g = r->nranks, me = r->coord, chunk = rh_chunk(r);
    /* src holds block b at b * row; the scratch holds blocks of cap bytes */
    size_t es = mf_dtype_size(r->op->dtype), cap = (size_t)chunk * es, row = (size_t)n * es;
    char *acc = st->rh[r->op->stream], *out = acc + (size_t)g * cap, *in = out + (size_t)g / 2 * cap;
    for (int64_t o = 0; o < n; o += chunk) {
        int64_t len = n - o < chunk ? n - o : chunk;
        size_t blk = (size_t)len * es, at = (size_t)o * es;   /* a block's chunk; its start */
        for (int64_t d = 1; d < g; d *= 2) {
            int k = 0;
            for (int64_t b = me % d; b < g; b += d)
                if ((b & d) != (me & d))
                    memcpy(out + (size_t)k++ * blk,
                           d == 1 ? src + (size_t)b * row + at : acc + (size_t)b * blk, blk);
            MPI_Request req[2];
            int peer = (int)(me ^ d);
            int rc = MPI_Irecv(in, k * (int)len, type, peer, MF_MPI_RH_TAG, comm, &req[0]);
            if (rc == MPI_SUCCESS)
                rc = MPI_Isend(out, k * (int)len, type, peer, MF_MPI_RH_TAG, comm, &req[1]);
            if (rc != MPI_SUCCESS) {
                st->abandoned++;   /* the receive may be posted */
                return mpi_fail(err, errlen, rc, " (MPI_Isend/MPI_Irecv)");
            }
            mfsdp_result res = wait_request(rt, st, &req[0], "", err, errlen);
            if (res == MFSDP_OK)
                res = wait_request(rt, st, &req[1], "", err, errlen);
            if (res != MFSDP_OK)
                return res;
            k = 0;
            for (int64_t b = me % d; b < g; b += d)
                if ((b & d) == (me & d)) {
                    char *a = acc + (size_t)b * blk;
                    if (d == 1)
                        memcpy(a, src + (size_t)b * row + at, blk);
                    rc = MPI_Reduce_local(in + (size_t)k++ * blk, a, (int)len, type, sum);
                    if (rc != MPI_SUCCESS)
                        return mpi_fail(err, errlen, rc, " (MPI_Reduce_local)");
                }
        }
        memcpy(dst + at, acc + (size_t)me * blk, blk);
    }
    return MFSDP_OK;
}

/* The prefix form's tables (mf_rt_op.used): int counts and displacements
 * per op, and the packing scratch of reduce-scatters whose prefixes are not
 * contiguous in src (or that run in place). An op whose counts pass the
 * per-call limit keeps the padded calls: the same bits, its padding being
 * zero (docs/runtime.md, "Whole buckets"). */
static mfsdp_result whole_init(mf_rt *rt, mf_mpi_state *st)
{
    const mf_schedule *s = rt->s;
    int64_t total = 0;
    st->whole_at = mf_base_calloc((size_t)(s->nops ? s->nops : 1), sizeof *st->whole_at);
    if (!st->whole_at)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (whole collectives)");
    for (int i = 0; i < s->nops; i++) {
        const mf_rt_op *r = &rt->rops[i];
        int64_t sum = 0;
        st->whole_at[i] = -1;
        if (!r->used)
            continue;
        for (int64_t c = 0; c < r->nranks; c++)
            sum += r->used[c];
        bool ragged = s->buckets[r->op->bucket].bounds != NULL;
        if (r->src_count > st->max_count || r->dst_count > st->max_count || sum > st->max_count) {
            if (ragged) /* no padded form to fall back on */
                return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED,
                                         "op %d of the ragged bucket '%s' moves more elements than one MPI call "
                                         "takes (%lld); split the bucket (bucket_size)",
                                         i, s->buckets[r->op->bucket].name, (long long)st->max_count);
            continue;
        }
        if (r->op->count * r->nranks > st->max_count && !ragged)
            continue;
        st->whole_at[i] = total;
        total += 2 * r->nranks;
        if (r->op->kind != MF_OP_REDUCE_SCATTER)
            continue;
        bool contiguous = !r->overlap;   /* the prefixes end to end in src */
        for (int64_t c = 0; c + 1 < r->nranks; c++)
            contiguous &= r->disp[c] + r->used[c] == r->disp[c + 1];
        size_t bytes = contiguous ? 0 : (size_t)sum * mf_dtype_size(r->op->dtype);
        if (bytes > st->pack_bytes[r->op->stream])
            st->pack_bytes[r->op->stream] = bytes;
    }
    st->whole = mf_base_calloc((size_t)(total ? total : 1), sizeof *st->whole);
    if (!st->whole)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (whole collectives)");
    for (int i = 0; i < s->nops; i++) {
        const mf_rt_op *r = &rt->rops[i];
        if (st->whole_at[i] < 0)
            continue;
        int *counts = st->whole + st->whole_at[i], *displs = counts + r->nranks;
        for (int64_t c = 0, at = 0; c < r->nranks; c++) {
            counts[c] = (int)r->used[c];
            /* all-gather: chunk c of dst; reduce-scatter: unused (packed) */
            displs[c] = (int)(r->op->kind == MF_OP_ALL_GATHER ? r->disp[c] : at);
            at += r->used[c];
        }
    }
    for (int k = 0; k < MF_STREAM_COUNT; k++)
        if (st->pack_bytes[k] && !(st->pack[k] = mf_base_aligned_zalloc(256, st->pack_bytes[k])))
            return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY,
                                     "out of memory (whole reduce-scatter packing, %zu bytes)",
                                     st->pack_bytes[k]);
    return MFSDP_OK;
}

static mfsdp_result mpi_comm_init(mf_rt *rt, const mf_rt_comm *comms, int ncomms)
{
    mf_mpi_state *st = rt->be_state;
    mfsdp_result res_whole;
    st->comms = mf_base_calloc((size_t)(ncomms ? ncomms : 1), sizeof *st->comms);
    if (!st->comms)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of memory (communicators)");
    st->ncomms = ncomms;
    for (int c = 0; c < ncomms; c++)
        st->comms[c] = MPI_COMM_NULL;
    int rc = MPI_Op_create(bf16_sum, 1, &st->sum_bf16);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Op_create(fp16_sum, 1, &st->sum_fp16);
        if (rc != MPI_SUCCESS)
            MPI_Op_free(&st->sum_bf16);
    }
    if (rc != MPI_SUCCESS)
        return mpi_fail(rt->err, sizeof rt->err, rc, "MPI_Op_create");
    st->ops_ok = true;
    /* Axis by axis, in the same order on every rank: split, then one dup per
     * stream using the axis. */
    for (int j = 0; j < rt->s->mesh.naxes; j++) {
        bool used = false;
        for (int c = 0; c < ncomms; c++)
            used |= comms[c].axis == j;
        if (!used)
            continue;
        MPI_Comm axis;
        int color = 0, key = 0;
        for (int c = 0; c < ncomms; c++)
            if (comms[c].axis == j) {
                color = (int)comms[c].color;
                key = (int)comms[c].coord;
            }
        rc = MPI_Comm_split(st->world, color, key, &axis);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rt->err, sizeof rt->err, rc, "MPI_Comm_split");
        MPI_Comm_set_errhandler(axis, MPI_ERRORS_RETURN);
        for (int c = 0; c < ncomms && rc == MPI_SUCCESS; c++)
            if (comms[c].axis == j && (rc = MPI_Comm_dup(axis, &st->comms[c])) == MPI_SUCCESS)
                rc = MPI_Comm_set_errhandler(st->comms[c], MPI_ERRORS_RETURN);
        MPI_Comm_free(&axis);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rt->err, sizeof rt->err, rc, "MPI_Comm_dup");
    }
    /* Scratch for chunked reduce-scatters. */
    for (int i = 0; i < rt->s->nops; i++) {
        const mf_rt_op *r = &rt->rops[i];
        if (r->op->kind != MF_OP_REDUCE_SCATTER || r->op->count <= st->max_count)
            continue;
        int64_t chunk = st->max_count;
        if (chunk * r->nranks > ((int64_t)16 << 20))
            chunk = ((int64_t)16 << 20) / r->nranks > 0 ? ((int64_t)16 << 20) / r->nranks : 1;
        int64_t elems = chunk * r->nranks;
        if (elems > st->scratch_elems[r->op->stream])
            st->scratch_elems[r->op->stream] = elems;
    }
    for (int i = 0; i < rt->s->nops; i++) {
        const mf_rt_op *r = &rt->rops[i];
        if (rh_applies(st, r) && rh_scratch_bytes(r) > st->rh_bytes[r->op->stream])
            st->rh_bytes[r->op->stream] = rh_scratch_bytes(r);
    }
    for (int s = 0; s < MF_STREAM_COUNT; s++)
        if (st->rh_bytes[s] && !(st->rh[s] = mf_base_aligned_zalloc(256, st->rh_bytes[s])))
            return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY,
                                     "out of memory (reduce-scatter scratch)");
    for (int s = 0; s < MF_STREAM_COUNT; s++)
        if (st->scratch_elems[s]) {
            st->scratch[s] = mf_base_aligned_zalloc(256, (size_t)st->scratch_elems[s] * 4);
            if (!st->scratch[s])
                return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY,
                                         "out of memory (reduce-scatter scratch)");
        }
    res_whole = whole_init(rt, st);
    if (res_whole != MFSDP_OK)
        return res_whole;
    /* The error channel: its own communicator, one receive always posted. */
    rc = MPI_Comm_dup(st->world, &st->errcomm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(st->errcomm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS)
        rc = MPI_Irecv(st->err_in, (int)sizeof st->err_in - 1, MPI_CHAR, MPI_ANY_SOURCE,
                       MF_MPI_ERR_TAG, st->errcomm, &st->err_req);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rt->err, sizeof rt->err, rc, "the error channel (MPI_Comm_dup, MPI_Irecv)");
    st->err_ok = true;
    return MFSDP_OK;
}

/* The collective calls of mpi_collective: nonblocking, or with
 * MFSDP_MPI_BLOCKING=1 blocking (then *req is MPI_REQUEST_NULL, which
 * wait_request finds complete at its first poll). */
static int start_allreduce(const mf_mpi_state *st, const void *s, void *d, int n, MPI_Datatype t,
                           MPI_Op op, MPI_Comm c, MPI_Request *req)
{
    *req = MPI_REQUEST_NULL;
    return st->blocking ? MPI_Allreduce(s, d, n, t, op, c) : MPI_Iallreduce(s, d, n, t, op, c, req);
}

static int start_reduce_scatter(const mf_mpi_state *st, const void *s, void *d, int n,
                                MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *req)
{
    *req = MPI_REQUEST_NULL;
    return st->blocking ? MPI_Reduce_scatter_block(s, d, n, t, op, c)
                        : MPI_Ireduce_scatter_block(s, d, n, t, op, c, req);
}

static int start_allgather(const mf_mpi_state *st, const void *s, int n, MPI_Datatype t, void *d,
                           int dn, MPI_Datatype dt, MPI_Comm c, MPI_Request *req)
{
    *req = MPI_REQUEST_NULL;
    return st->blocking ? MPI_Allgather(s, n, t, d, dn, dt, c)
                        : MPI_Iallgather(s, n, t, d, dn, dt, c, req);
}

static int start_reduce_scatterv(const mf_mpi_state *st, const void *s, void *d, const int *counts,
                                 MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *req)
{
    *req = MPI_REQUEST_NULL;
    return st->blocking ? MPI_Reduce_scatter(s, d, counts, t, op, c)
                        : MPI_Ireduce_scatter(s, d, counts, t, op, c, req);
}

static int start_allgatherv(const mf_mpi_state *st, const void *s, int n, MPI_Datatype t, void *d,
                            const int *counts, const int *displs, MPI_Comm c, MPI_Request *req)
{
    *req = MPI_REQUEST_NULL;
    return st->blocking ? MPI_Allgatherv(s, n, t, d, counts, displs, t, c)
                        : MPI_Iallgatherv(s, n, t, d, counts, displs, t, c, req);
}

/* A whole bucket's collective in the prefix form (st->whole_at[op] >= 0):
 * only the used prefix of each chunk moves, the padding tail of each chunk
 * written is zero-filled. Reduce-scatter: MPI_Ireduce_scatter with the
 * prefixes as counts (packed first unless they lie end to end in src);
 * libnbc sums it by the same binomial tree to rank 0 as
 * MPI_Ireduce_scatter_block, whose bits rh_reduce_scatter also has, so the
 * bits are the padded form's (test_whole_collectives_mpi4). All-gather:
 * MPI_Iallgatherv into the chunks. All-reduce: MPI_Iallreduce of the
 * prefix (Open MPI picks its algorithm by size, so beyond groups of 2 the
 * sums may pair differently from the padded call's). */
static mfsdp_result run_whole(mf_rt *rt, const mf_rt_op *r, const int *counts, char *err,
                              size_t errlen)
{
    mf_mpi_state *st = rt->be_state;
    const mf_op *op = r->op;
    MPI_Comm comm = st->comms[r->comm];
    MPI_Datatype type = op->dtype == MF_FP32 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op sum = op->dtype == MF_FP32 ? MPI_SUM : op->dtype == MF_BF16 ? st->sum_bf16 : st->sum_fp16;
    size_t es = mf_dtype_size(op->dtype);
    int64_t g = r->nranks, me = r->coord, u = r->used[me], own = r->dst_count;
    char *src = r->src, *dst = r->dst;
    MPI_Request req;
    int rc = MPI_SUCCESS;
    switch (op->kind) {
    case MF_OP_REDUCE_SCATTER: {
        const char *send = src;
        bool contiguous = !r->overlap;   /* as whole_init decided */
        for (int64_t c = 0; c + 1 < g; c++)
            contiguous &= r->disp[c] + r->used[c] == r->disp[c + 1];
        if (!contiguous) {
            char *p = st->pack[op->stream];
            for (int64_t c = 0, at = 0; c < g; at += r->used[c], c++)
                if (r->used[c])   /* no pack buffer when every prefix is empty */
                    memcpy(p + (size_t)at * es, src + (size_t)r->disp[c] * es, (size_t)r->used[c] * es);
            send = p;
        } else {
            send = src + (size_t)r->disp[0] * es;
        }
        rc = start_reduce_scatterv(st, send, dst, counts, type, sum, comm, &req);
        break;
    }
    case MF_OP_ALL_GATHER:
        if (r->overlap)
            memmove(dst + (size_t)r->disp[me] * es, src, (size_t)u * es);
        rc = start_allgatherv(st, r->overlap ? MPI_IN_PLACE : src, (int)u, type, dst, counts,
                              counts + g, comm, &req);
        break;
    case MF_OP_ALL_REDUCE:
        rc = start_allreduce(st, r->overlap ? MPI_IN_PLACE : src, dst, (int)u, type, sum, comm, &req);
        break;
    default:
        snprintf(err, errlen, ": not a collective");
        return MFSDP_ERR_INTERNAL;
    }
    if (rc != MPI_SUCCESS)
        return mpi_fail(err, errlen, rc, " (prefix form)");
    mfsdp_result res = wait_request(rt, st, &req, " (prefix form)", err, errlen);
    if (res != MFSDP_OK)
        return res;
    /* the tails past the used prefixes (alignment, or the equal form's
       padding) zeroed: chunk c ends where chunk c + 1 starts */
    if (op->kind == MF_OP_ALL_GATHER)
        for (int64_t c = 0; c < g; c++) {
            int64_t end = c + 1 < g ? r->disp[c + 1] : own;
            memset(dst + (size_t)(r->disp[c] + r->used[c]) * es, 0, (size_t)(end - r->disp[c] - r->used[c]) * es);
        }
    else
        memset(dst + (size_t)u * es, 0, (size_t)(own - u) * es);
    if (rt->s->reduce == MF_REDUCE_AVG && op->kind != MF_OP_ALL_GATHER)
        mf_cpu_kernels_divide(dst, op->dtype, u, g);
    return MFSDP_OK;
}

/* Runs one collective; messages start with what follows the collective's
 * description (" timed out ..."), which mpi_collective puts in front (only
 * on failure: formatting it costs as much as a tiny collective). */
static mfsdp_result run_collective(mf_rt *rt, const mf_rt_op *r, char *err, size_t errlen)
{
    mf_mpi_state *st = rt->be_state;
    const mf_op *op = r->op;
    if (r->used && st->whole_at[op->id] >= 0)
        return run_whole(rt, r, st->whole + st->whole_at[op->id], err, errlen);
    MPI_Comm comm = st->comms[r->comm];
    MPI_Datatype type = op->dtype == MF_FP32 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op sum = op->dtype == MF_FP32 ? MPI_SUM : op->dtype == MF_BF16 ? st->sum_bf16 : st->sum_fp16;
    size_t es = mf_dtype_size(op->dtype);
    int64_t n = op->count, g = r->nranks;
    char *src = r->src, *dst = r->dst;
    const char *what = "";
    mfsdp_result res = MFSDP_OK;
    MPI_Request req;
    int rc = MPI_SUCCESS;
    switch (op->kind) {
    case MF_OP_ALL_REDUCE:
        for (int64_t o = 0; o < n && res == MFSDP_OK; o += st->max_count) {
            int64_t len = n - o < st->max_count ? n - o : st->max_count;
            rc = start_allreduce(st, r->overlap ? MPI_IN_PLACE : src + o * (int64_t)es,
                                 dst + o * (int64_t)es, (int)len, type, sum, comm, &req);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, errlen, rc, what);
            res = wait_request(rt, st, &req, what, err, errlen);
        }
        break;
    case MF_OP_REDUCE_SCATTER:
        if (rh_applies(st, r)) {
            res = rh_reduce_scatter(rt, st, r, src, dst, type, sum, comm, err, errlen);
            break;
        }
        if (n <= st->max_count) {
            rc = start_reduce_scatter(st, r->overlap ? MPI_IN_PLACE : src, dst, (int)n, type, sum,
                                      comm, &req);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, errlen, rc, what);
            res = wait_request(rt, st, &req, what, err, errlen);
            break;
        }
        {
            /* Pack chunk [o, o+len) of every block, reduce-scatter it. Chunks
             * go up in o, so an in-place dst only overwrites packed data. */
            char *scratch = st->scratch[op->stream];
            int64_t chunk = st->scratch_elems[op->stream] / g;
            for (int64_t o = 0; o < n && res == MFSDP_OK; o += chunk) {
                int64_t len = n - o < chunk ? n - o : chunk;
                for (int64_t i = 0; i < g; i++)
                    memcpy(scratch + (size_t)(i * len) * es, src + (size_t)(i * n + o) * es,
                           (size_t)len * es);
                rc = start_reduce_scatter(st, scratch, dst + o * (int64_t)es, (int)len, type, sum,
                                          comm, &req);
                if (rc != MPI_SUCCESS)
                    return mpi_fail(err, errlen, rc, what);
                res = wait_request(rt, st, &req, what, err, errlen);
            }
        }
        break;
    case MF_OP_ALL_GATHER:
        if (r->overlap)
            memmove(dst + (size_t)(r->coord * n) * es, src, (size_t)n * es);
        if (n <= st->max_count) {
            rc = start_allgather(st, r->overlap ? MPI_IN_PLACE : src, (int)n, type, dst, (int)n, type,
                                 comm, &req);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, errlen, rc, what);
            res = wait_request(rt, st, &req, what, err, errlen);
            break;
        }
        for (int64_t o = 0; o < n && res == MFSDP_OK; o += st->max_count) {
            /* Block i of this chunk lands at dst[i*n + o]: a receive type of
             * len elements with an extent of n elements. */
            int64_t len = n - o < st->max_count ? n - o : st->max_count;
            MPI_Datatype blk, strided;
            rc = MPI_Type_contiguous((int)len, type, &blk);
            if (rc == MPI_SUCCESS)
                rc = MPI_Type_create_resized(blk, 0, (MPI_Aint)(n * (int64_t)es), &strided);
            if (rc == MPI_SUCCESS)
                rc = MPI_Type_commit(&strided);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, errlen, rc, what);
            rc = start_allgather(st, r->overlap ? MPI_IN_PLACE : src + o * (int64_t)es, (int)len,
                                 type, dst + o * (int64_t)es, 1, strided, comm, &req);
            if (rc == MPI_SUCCESS)
                res = wait_request(rt, st, &req, what, err, errlen);
            MPI_Type_free(&strided);
            MPI_Type_free(&blk);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, errlen, rc, what);
        }
        break;
    default:
        snprintf(err, errlen, ": not a collective");
        return MFSDP_ERR_INTERNAL;
    }
    if (res == MFSDP_OK && rt->s->reduce == MF_REDUCE_AVG &&
        (op->kind == MF_OP_ALL_REDUCE || op->kind == MF_OP_REDUCE_SCATTER))
        mf_cpu_kernels_divide(dst, op->dtype, n, g);
    return res;
}

static mfsdp_result mpi_collective(mf_rt *rt, const mf_rt_op *r, int64_t microbatch, char *err,
                                   size_t errlen)
{
    (void)microbatch;
    mfsdp_result res = run_collective(rt, r, err, errlen);
    if (res != MFSDP_OK) {
        const mf_op *op = r->op;
        char tail[MF_RT_ERRLEN];
        snprintf(tail, sizeof tail, "%s", err);
        snprintf(err, errlen, "%s of %lld %s elements on axis %s%s", mf_opkind_name(op->kind),
                 (long long)op->count, mf_dtype_name(op->dtype), rt->s->mesh.axes[op->axis].name,
                 tail);
    }
    return res;
}

/* Sends this rank's own failure to every peer once (not when the abort was
 * caused by a peer's message: that rank already told everyone). */
static void send_failure(mf_rt *rt, mf_mpi_state *st, const char *why)
{
    poll_peer_failure(st);
    if (!st->err_ok || st->sent || st->err_done)
        return;
    st->sent = true;
    char msg[sizeof st->err_in];
    snprintf(msg, sizeof msg, "%s", why);
    int n = 0, me = 0;
    MPI_Comm_size(st->errcomm, &n);
    MPI_Comm_rank(st->errcomm, &me);
    for (int q = 0; q < n; q++) {
        MPI_Request req;
        if (q != me && MPI_Isend(msg, (int)strlen(msg) + 1, MPI_CHAR, q, MF_MPI_ERR_TAG,
                                 st->errcomm, &req) == MPI_SUCCESS)
            MPI_Request_free(&req);   /* small: sent eagerly, completes on its own */
    }
    (void)rt;
}

static void mpi_abort(mf_rt *rt, const char *why)
{
    mf_mpi_state *st = rt->be_state;
    if (!st)
        return;
    send_failure(rt, st, why);
    if (st->aborted)
        return;
    snprintf(st->why, sizeof st->why, "%s", why);
    st->aborted = true;
}

/* A buffer is freed unless a collective was left pending: MPI cannot cancel
 * one, and a peer arriving late would complete it into freed memory. Then
 * the runtime's buffers are leaked on purpose (the process is failing). */
static void mpi_free(mf_rt *rt, void *p)
{
    mf_mpi_state *st = rt->be_state;
    if (!st || !st->abandoned)
        mf_base_host_free(rt, p);
    else
        mf_base_graveyard(p);
}

static void mpi_close(mf_rt *rt)
{
    mf_mpi_state *st = rt->be_state;
    if (!st)
        return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    /* With a collective left pending the communicators stay: MPI keeps
     * progressing it, and Open MPI's nonblocking collectives use the
     * communicator's internals until they complete. They stay too after any
     * abort (this rank's or a peer's), even with nothing pending here: a
     * peer may still send into them (its half of a collective this rank
     * never joined, its failure message), and Open MPI keeps a message for a
     * freed context id until a new communicator takes that id -- where it
     * would match the next runtime's collectives (a hang or a crash seen
     * when a runtime was created again after one destroyed mid-step). */
    bool keep = finalized || st->abandoned || st->aborted;
    if (!keep) {
        for (int c = 0; st->comms && c < st->ncomms; c++)
            if (st->comms[c] != MPI_COMM_NULL)
                MPI_Comm_free(&st->comms[c]);
        if (st->err_ok) {
            pthread_mutex_lock(&st->err_mu);
            if (!st->err_done) {
                MPI_Cancel(&st->err_req);
                MPI_Wait(&st->err_req, MPI_STATUS_IGNORE);
            }
            pthread_mutex_unlock(&st->err_mu);
            MPI_Comm_free(&st->errcomm);
        }
        if (st->ops_ok) {
            MPI_Op_free(&st->sum_bf16);
            MPI_Op_free(&st->sum_fp16);
        }
        if (st->world_ok)
            MPI_Comm_free(&st->world);
    }
    for (int s = 0; s < MF_STREAM_COUNT; s++)
        if (st->abandoned) {
            mf_base_graveyard(st->scratch[s]);
            mf_base_graveyard(st->rh[s]);
            mf_base_graveyard(st->pack[s]);
        } else {
            mf_base_free(st->scratch[s]);
            mf_base_free(st->rh[s]);
            mf_base_free(st->pack[s]);
        }
    if (st->abandoned)
        mf_base_graveyard(st->whole);   /* a pending call may still read its counts */
    else
        mf_base_free(st->whole);
    mf_base_free(st->whole_at);
    mf_base_free(st->comms);
    pthread_mutex_destroy(&st->err_mu);
    /* A kept error channel's receive is still posted into st->err_in. */
    if (keep && st->err_ok && !st->err_done)
        mf_base_graveyard(st);
    else
        mf_base_free(st);
    rt->be_state = NULL;
}

const mf_backend_vtbl mf_backend_mpi = {
    .name = "mpi",
    .caps = MF_BE_KEEPS_PENDING | MF_BE_HOST_EXCHANGE,
    .open = mpi_open,
    .alloc = mf_base_host_alloc,
    .free = mpi_free,
    .exchange = mpi_exchange,
    .comm_init = mpi_comm_init,
    .collective = mpi_collective,
    .submit = NULL,
    .synchronize = NULL,
    .allgather = mpi_allgather,
    .transfer_post = mpi_transfer_post,
    .transfer_wait = mpi_transfer_wait,
    .stage = mf_ckpt_stage_host, /* memcpy (mf_ckpt_stage.h) */
    .abort = mpi_abort,
    .close = mpi_close,
};
