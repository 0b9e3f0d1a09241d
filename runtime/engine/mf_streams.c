/*
 * mf_streams: the worker execution model (local and MPI backends). Each
 * rank has two stream threads, inner and outer, each taking its queued ops in
 * order; the compute stream is the trainer's thread, which runs its ops at
 * issue. Events are counters: a record completes by raising its event's
 * counter to its sequence number; a wait on the compute stream sleeps on the
 * rank's condition variable until the counter reaches its target (the latest
 * record issued before it). A wait on a worker stream never blocks its
 * thread: it only starts once its record has completed (can_start), and until
 * then its stream has no executor. Every blocking wait is a condition-variable
 * wait bounded by the configured timeout (a worker stream held up by a wait
 * is bounded by step_end's drain, whose message names the record).
 *
 * Hand-offs are what a thread model costs (docs/performance.md, "Runtime"):
 * waking a thread and sleeping until it answers is a few microseconds of
 * kernel scheduling per op, far more than the op. So:
 *   - a stream's entries have one executor at a time (q->current >= 0 while
 *     one runs), which is the stream thread or the host thread "helping": a
 *     compute-stream wait whose record has not run, or step_end's drain, runs
 *     queued entries of an idle stream itself, in order, instead of sleeping
 *     until that stream's thread runs them;
 *   - the host queues a hook's entries without waking anyone and wakes each
 *     stream with new entries once, at the end of the hook
 *     (mf_streams_kick), so the streams still overlap with the trainer's
 *     compute between hooks. Before the host runs an entry that can block
 *     (a collective), it wakes the other streams, so that every stream always
 *     has an executor and nothing waits on an entry nobody will run;
 *   - waking is kick_locked: records and satisfied waits at the head of an
 *     idle stream run on the waker's thread (they take no time, a wake-up
 *     costs two context switches), so a stream's thread is woken only for an
 *     entry with work in it. A stream thread kicks the other streams after
 *     each entry, the host at the end of each hook and whenever its wait or
 *     drain has nothing to help with: that is how a completed record reaches
 *     the waits on it.
 *
 * Invariants: queues are rings sized at create to the most entries a stream
 * is issued in one step, and step_end drains them, so the host never waits
 * for space and nothing is allocated per step. After a failure (sticky, first
 * message wins) executors skip their remaining entries, so drains return.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "mf_cpu_kernels.h"
#include "mf_streams.h"
#include "mf_stress.h"

static bool help_one(mf_rt *rt);
static bool kick_locked(mf_rt *rt, int except);

/* q's next entry (one is queued) and its op. rt->mu held. */
static const mf_rt_entry *head(const mf_rt_stream *q)
{
    return &q->queue[q->popped % q->cap];
}

static const mf_op *head_op(const mf_rt *rt, const mf_rt_stream *q)
{
    return rt->rops[head(q)->op].op;
}

/* True when q's next entry (one is queued) is a wait whose record has not
 * completed. rt->mu held. */
static bool head_waits(const mf_rt *rt, const mf_rt_stream *q)
{
    const mf_op *op = head_op(rt, q);
    return op->kind == MF_OP_WAIT && rt->ev_done[op->event] < head(q)->seq;
}

/* True when q's next entry can start now: one is queued, nobody executes q,
 * and it is not a wait whose record has not completed (after a failure
 * every entry can start: executors skip them). rt->mu held. */
static bool can_start(const mf_rt *rt, const mf_rt_stream *q)
{
    if (q->popped == q->pushed || q->current >= 0)
        return false;
    return !head_waits(rt, q) || rt->failed != MFSDP_OK || rt->stop;
}

/* sched_yield rounds a wait spends before sleeping on its condition variable. */
#ifndef MF_STREAM_SPINS
#define MF_STREAM_SPINS 32
#endif
/* The same for an idle stream thread waiting for entries: each of its
 * yields is a context switch when other threads are runnable. */
#ifndef MF_STREAM_IDLE_SPINS
#define MF_STREAM_IDLE_SPINS 4
#endif

/* One round of a wait on `cv` under rt->mu (mf_base_spin_wait, with
 * MF_STREAM_SPINS yields before it sleeps). */
static int spin_wait(mf_rt *rt, pthread_cond_t *cv, int64_t timeout_ms, struct timespec *deadline,
                     int *spins)
{
    return mf_base_spin_wait(&rt->mu, cv, MF_STREAM_SPINS, timeout_ms, deadline, spins);
}

/* A record: raises its event's counter to its sequence number. */
static void exec_record(mf_rt *rt, const mf_op *op, int64_t seq)
{
    pthread_mutex_lock(&rt->mu);
    if (rt->ev_done[op->event] < seq)
        rt->ev_done[op->event] = seq;
    pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->mu);
}

/* Waits until record #seq of op's event completed, helping (compute stream)
 * and kicking the streams meanwhile; a failure or stop aborts it, the
 * timeout ends it. *t0 is set when it first has to wait. rt->mu held. */
static mfsdp_result wait_for_record(mf_rt *rt, mf_stream on, const mf_op *op, int64_t seq,
                                    int64_t *t0)
{
    struct timespec deadline = {-1, 0};
    int spins = 0;
    while (rt->ev_done[op->event] < seq) {
        if (*t0 == 0)
            *t0 = mf_base_now_ns();
        if (rt->failed != MFSDP_OK || rt->stop)
            return MFSDP_ERR_ABORTED;
        if (on == MF_STREAM_COMPUTE && help_one(rt)) {
            deadline.tv_sec = -1;   /* progress was made: the timeout starts again */
            continue;
        }
        if (kick_locked(rt, -1))
            continue;
        if (spin_wait(rt, &rt->cv, rt->cfg.timeout_ms, &deadline, &spins) == ETIMEDOUT &&
            rt->ev_done[op->event] < seq)
            return MFSDP_ERR_TIMEOUT;
    }
    return MFSDP_OK;
}

/* What holds up a failed wait: the stream that records its event, and the
 * op that stream has been in for busy_for ns (-1: idle, or in an untimed
 * record or wait). */
typedef struct mf_wait_blocker {
    mf_stream rec;
    int busy_op;
    int64_t busy_for;
} mf_wait_blocker;

/* rt->mu held. */
static mf_wait_blocker find_blocker(const mf_rt *rt, int event)
{
    mf_wait_blocker b = {MF_STREAM_COMPUTE, -1, 0};
    for (int i = 0; i < rt->s->nops; i++)
        if (rt->s->ops[i].kind == MF_OP_RECORD && rt->s->ops[i].event == event)
            b.rec = rt->s->ops[i].stream;
    const mf_rt_stream *q = &rt->streams[b.rec];
    if (b.rec != MF_STREAM_COMPUTE && q->current >= 0 && q->current_since != 0) {
        b.busy_op = q->current;
        b.busy_for = mf_base_now_ns() - q->current_since;
    }
    return b;
}

/* A wait timed out while the recording stream is inside a collective, which
 * has its own timeout and knows more (which peers are missing): gives it one
 * more period, and reports its failure instead of this symptom (copied into
 * err, *root_cause set). Returns the wait's result. rt->mu held. */
static mfsdp_result await_collective(mf_rt *rt, const mf_op *op, int64_t seq, char *err,
                                     size_t errlen, bool *root_cause)
{
    struct timespec more = mf_base_deadline(rt->cfg.timeout_ms);
    while (rt->ev_done[op->event] < seq && rt->failed == MFSDP_OK && !rt->stop)
        if (mf_base_cond_wait(&rt->cv, &rt->mu, rt->cfg.timeout_ms, &more) == ETIMEDOUT)
            break;
    if (rt->ev_done[op->event] >= seq)
        return MFSDP_OK;
    if (rt->failed == MFSDP_OK)
        return MFSDP_ERR_TIMEOUT;
    snprintf(err, errlen, "%s", rt->fail_msg);
    *root_cause = true;
    return rt->failed;
}

/* The message of a failed wait (timed out, or interrupted by an earlier
 * failure); done: the latest completed record of its event. */
static void describe_failed_wait(const mf_rt *rt, mf_stream on, const mf_rt_entry *e,
                                 mfsdp_result res, int64_t done, const mf_wait_blocker *b,
                                 char *err, size_t errlen)
{
    const mf_op *op = rt->rops[e->op].op;
    char what[200], stuck[260] = "";
    mf_base_describe_op(rt, e->op, what, sizeof what);
    if (b->busy_op >= 0) {
        char op2[200];
        mf_base_describe_op(rt, b->busy_op, op2, sizeof op2);
        snprintf(stuck, sizeof stuck, "; the %s stream has been in %s for %lld ms",
                 mf_stream_name(b->rec), op2, (long long)(b->busy_for / 1000000));
    }
    if (res == MFSDP_ERR_TIMEOUT)
        snprintf(err, errlen,
                 "rank %lld, %s stream: %s timed out after %lld ms: record #%lld of event "
                 "%d on the %s stream never completed (latest completed #%lld)%s",
                 (long long)rt->rank, mf_stream_name(on), what, (long long)rt->cfg.timeout_ms,
                 (long long)e->seq, op->event, mf_stream_name(b->rec), (long long)done, stuck);
    else
        snprintf(err, errlen, "rank %lld, %s stream: %s interrupted by an earlier failure",
                 (long long)rt->rank, mf_stream_name(on), what);
}

/* A wait: until the latest record issued before it completed (none yet:
 * nothing to wait for, like a never-recorded cudaEvent). Time blocked is
 * added to *wait_ns. */
static mfsdp_result exec_wait(mf_rt *rt, mf_stream on, const mf_rt_entry *e, char *err,
                              size_t errlen, int64_t *wait_ns)
{
    if (e->seq <= 0)
        return MFSDP_OK;
    const mf_op *op = rt->rops[e->op].op;
    int64_t t0 = 0;             /* read only when the wait does not return at once */
    pthread_mutex_lock(&rt->mu);
    mfsdp_result res = wait_for_record(rt, on, op, e->seq, &t0);
    int64_t done = rt->ev_done[op->event];
    mf_wait_blocker b = {MF_STREAM_COMPUTE, -1, 0};
    if (res != MFSDP_OK)
        b = find_blocker(rt, op->event);
    bool root_cause = false;
    if (res == MFSDP_ERR_TIMEOUT && b.busy_op >= 0 && mf_opkind_is_collective(rt->s->ops[b.busy_op].kind))
        res = await_collective(rt, op, e->seq, err, errlen, &root_cause);
    pthread_mutex_unlock(&rt->mu);
    if (t0)
        *wait_ns += mf_base_now_ns() - t0;
    if (res != MFSDP_OK && !root_cause)
        describe_failed_wait(rt, on, e, res, done, &b, err, errlen);
    return res;
}

/* A local op: cast, accumulate (the first microbatch overwrites), slice. */
static void exec_local(const mf_rt_op *r, int64_t microbatch)
{
    const mf_op *op = r->op;
    if (op->kind == MF_OP_ACCUMULATE && microbatch > 0) {
        mf_cpu_kernels_add(r->dst, r->dst_dtype, r->src, r->src_dtype, r->n);
    } else if (op->kind == MF_OP_SLICE) {
        size_t at = (size_t)r->src_at * mf_dtype_size(r->src_dtype);
        mf_dtype_convert(r->dst, r->dst_dtype, (const char *)r->src + at, r->src_dtype, r->n);
    } else {   /* a cast, or the first microbatch's accumulate */
        mf_dtype_convert(r->dst, r->dst_dtype, r->src, r->src_dtype, r->n);
    }
}

/* A collective, through the backend; its message is prefixed with the rank
 * and the op. */
static mfsdp_result exec_collective(mf_rt *rt, const mf_rt_entry *e, char *err, size_t errlen)
{
    mfsdp_result res = rt->be->collective(rt, &rt->rops[e->op], e->microbatch, err, errlen);
    if (res != MFSDP_OK) {
        char what[200], detail[MF_RT_ERRLEN];
        mf_base_describe_op(rt, e->op, what, sizeof what);
        snprintf(detail, sizeof detail, "%s", err);
        snprintf(err, errlen, "rank %lld: %s failed: %s", (long long)rt->rank, what, detail);
    }
    return res;
}

/* Executes a local op or a collective, or completes/awaits an event. */
mfsdp_result mf_streams_exec(mf_rt *rt, mf_stream on, const mf_rt_entry *e, char *err,
                             size_t errlen, int64_t *wait_ns)
{
    const mf_op *op = rt->rops[e->op].op;
    switch (op->kind) {
    case MF_OP_RECORD:
        exec_record(rt, op, e->seq);
        return MFSDP_OK;
    case MF_OP_WAIT:
        return exec_wait(rt, on, e, err, errlen, wait_ns);
    case MF_OP_CAST:
    case MF_OP_ACCUMULATE:
    case MF_OP_SLICE:
        exec_local(&rt->rops[e->op], e->microbatch);
        return MFSDP_OK;
    default:
        return exec_collective(rt, e, err, errlen);
    }
}

/* Takes q's next entry and runs it on the calling thread (q's thread or the
 * host). Called and returns with rt->mu held; q has an entry queued and no
 * executor (q->current < 0). */
static void run_entry(mf_rt *rt, mf_rt_stream *q)
{
    mf_rt_entry e = *head(q);
    q->popped++;
    q->current = e.op;
    /* Records and waits are not timed: a record takes no time, and a wait
     * counts its own waiting (it reads the clock only when it waits). */
    mf_opkind kind = rt->rops[e.op].op->kind;
    bool timed = q->stress || (kind != MF_OP_RECORD && kind != MF_OP_WAIT);
    int64_t t0 = timed ? mf_base_now_ns() : 0;
    q->current_since = t0;
    bool skip = rt->failed != MFSDP_OK;
    pthread_mutex_unlock(&rt->mu);

    mfsdp_result res = MFSDP_OK;
    int64_t wait_ns = 0;
    if (q->stress && !skip)   /* stress mode: a seeded random delay (counted as busy) */
        mf_stress_delay(&q->stress);
    if (!skip)
        res = mf_streams_exec(rt, q->id, &e, q->err, sizeof q->err, &wait_ns);
    int64_t t1 = timed ? mf_base_now_ns() : wait_ns;
    if (res != MFSDP_OK) {
        /* Peers blocked with us on a communicator learn at once. */
        mf_base_fail_and_abort(rt, res, q->err);
    }

    pthread_mutex_lock(&rt->mu);
    q->busy_ns += (t1 - t0) - wait_ns;
    q->wait_ns += wait_ns;
    q->completed++;
    q->current = -1;
    if (rt->ops_waiting_space || q->completed == q->pushed || kind == MF_OP_RECORD)
        pthread_cond_broadcast(&rt->cv);
}

/* Brings the streams (but `except`) that nobody executes up to date, rt->mu
 * held: their records and satisfied waits at the head of their queues run
 * here, on the calling thread (they take no time; waking a thread for them
 * costs two context switches), and the threads of those left with an entry
 * that can start are woken. Signalling a thread that is not waiting costs no
 * system call. True when it ran an entry: rt->mu was released meanwhile, so
 * the caller re-checks what it waits for before sleeping. */
static bool kick_locked(mf_rt *rt, int except)
{
    bool ran_any = false;
    for (bool ran = true; ran; ran_any |= ran) {
        ran = false;
        for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) {
            mf_rt_stream *q = &rt->streams[st];
            if (st == except || !can_start(rt, q))
                continue;
            mf_opkind kind = head_op(rt, q)->kind;
            if (kind == MF_OP_WAIT || kind == MF_OP_RECORD) {
                run_entry(rt, q);
                ran = true;
            }
        }
    }
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) {
        mf_rt_stream *q = &rt->streams[st];
        if (st != except && can_start(rt, q))
            pthread_cond_signal(&q->work);
    }
    return ran_any;
}

void mf_streams_kick(mf_rt *rt)
{
    pthread_mutex_lock(&rt->mu);
    kick_locked(rt, -1);
    pthread_mutex_unlock(&rt->mu);
}

/* Host thread only: runs one queued entry of a stream that has no executor,
 * if any (inner first); true when it ran one. rt->mu held (released while
 * the entry runs). An unsatisfied wait is left to its stream's thread (the
 * host would only sleep in it); before a collective the other streams are
 * woken, since the host may block in it. */
static bool help_one(mf_rt *rt)
{
    if (rt->stop || rt->synchronous)
        return false;
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) {
        mf_rt_stream *q = &rt->streams[st];
        if (!can_start(rt, q))
            continue;
        const mf_op *op = head_op(rt, q);
        /* The kick may run entries, releasing rt->mu: q's thread may have
         * taken this one meanwhile (progress either way). */
        if (mf_opkind_is_collective(op->kind) && kick_locked(rt, st) && !can_start(rt, q))
            return true;
        run_entry(rt, q);
        return true;
    }
    return false;
}

static void *stream_main(void *arg)
{
    mf_rt_stream *q = arg;
    mf_rt *rt = q->rt;
    pthread_mutex_lock(&rt->mu);
    for (;;) {
        int spins = MF_STREAM_SPINS - MF_STREAM_IDLE_SPINS;
        struct timespec none = {-1, 0};
        while (!rt->stop && !can_start(rt, q))
            spin_wait(rt, &q->work, 0, &none, &spins);
        if (rt->stop)
            break;
        run_entry(rt, q);
        kick_locked(rt, q->id);
    }
    pthread_mutex_unlock(&rt->mu);
    return NULL;
}

static atomic_int fail_next_start;   /* mf_streams_fail_next_start */

void mf_streams_fail_next_start(void)
{
    atomic_store(&fail_next_start, 1);
}

mfsdp_result mf_streams_start(mf_rt *rt)
{
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) {
        mf_rt_stream *q = &rt->streams[st];
        q->stress = mf_stress_seed(rt->rank, st);
        int rc = atomic_exchange(&fail_next_start, 0) ? EAGAIN
                                                      : pthread_create(&q->thread, NULL, stream_main, q);
        if (rc != 0) {
            mf_streams_stop(rt);
            return mf_base_set_error(rt, MFSDP_ERR_INTERNAL, "cannot start the %s stream thread: %s",
                                     mf_stream_name((mf_stream)st), strerror(rc));
        }
        q->started = true;
    }
    return MFSDP_OK;
}

void mf_streams_stop(mf_rt *rt)
{
    pthread_mutex_lock(&rt->mu);
    rt->stop = true;
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++)
        pthread_cond_broadcast(&rt->streams[st].work);
    pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->mu);
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++)
        if (rt->streams[st].started) {
            pthread_join(rt->streams[st].thread, NULL);
            rt->streams[st].started = false;
        }
}

mfsdp_result mf_streams_issue(mf_rt *rt, int i, int64_t m, int64_t seq, int64_t *wait_ns)
{
    const mf_op *op = &rt->s->ops[i];
    mf_rt_entry e = {.op = i, .microbatch = m, .seq = seq};
    if (op->stream == MF_STREAM_COMPUTE) {
        char msg[MF_RT_ERRLEN];
        msg[0] = '\0';
        mfsdp_result res = mf_streams_exec(rt, MF_STREAM_COMPUTE, &e, msg, sizeof msg, wait_ns);
        if (res != MFSDP_OK) {
            mf_base_fail_and_abort(rt, res, msg);
        }
        return res;
    }
    mf_rt_stream *q = &rt->streams[op->stream];
    mfsdp_result res = MFSDP_OK;
    pthread_mutex_lock(&rt->mu);
    struct timespec deadline = {-1, 0};
    while (res == MFSDP_OK && q->pushed - q->popped >= q->cap) {
        /* Only reachable when a schedule issues more than its per-step count
         * without a step_end (defensive: the ring is sized for one step). */
        if (rt->failed != MFSDP_OK) {
            res = rt->failed;
            break;
        }
        rt->ops_waiting_space = true;
        if (kick_locked(rt, -1)) {
            rt->ops_waiting_space = false;
            continue;
        }
        if (deadline.tv_sec < 0)
            deadline = mf_base_deadline(rt->cfg.timeout_ms);
        if (mf_base_cond_wait(&rt->cv, &rt->mu, rt->cfg.timeout_ms, &deadline) == ETIMEDOUT)
            res = MFSDP_ERR_TIMEOUT;
        rt->ops_waiting_space = false;
    }
    if (res == MFSDP_OK) {
        q->queue[q->pushed % q->cap] = e;
        q->pushed++;                /* woken at the end of the hook (mf_streams_kick) */
    }
    pthread_mutex_unlock(&rt->mu);
    if (res == MFSDP_ERR_TIMEOUT) {
        char msg[256];
        snprintf(msg, sizeof msg, "rank %lld: the %s stream's queue stayed full for %lld ms",
                 (long long)rt->rank, mf_stream_name(op->stream), (long long)rt->cfg.timeout_ms);
        mf_base_fail(rt, res, msg);
    }
    return res;
}

static bool all_completed(const mf_rt *rt)
{
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++)
        if (rt->streams[st].completed != rt->streams[st].pushed)
            return false;
    return true;
}

/* For a drain that timed out: how far q got, and what holds it up (the op it
 * is in, or the record its next op waits for). rt->mu held. Returns the
 * characters written, like snprintf. */
static int describe_stream(const mf_rt *rt, const mf_rt_stream *q, char *buf, size_t size)
{
    int n = snprintf(buf, size, "; %s stream: %lld of %lld ops done", mf_stream_name((mf_stream)q->id),
                     (long long)q->completed, (long long)q->pushed);
    size_t at = (size_t)n < size ? (size_t)n : size;   /* where the rest goes (truncated) */
    char what[200];
    if (q->current >= 0) {
        mf_base_describe_op(rt, q->current, what, sizeof what);
        return n + snprintf(buf + at, size - at, ", in %s", what);
    }
    if (q->popped == q->pushed || !head_waits(rt, q))
        return n;
    const mf_rt_entry *e = head(q);
    const mf_op *op = head_op(rt, q);
    mf_base_describe_op(rt, e->op, what, sizeof what);
    return n + snprintf(buf + at, size - at,
                        ", %s waits for record #%lld of event %d (latest completed #%lld)", what,
                        (long long)e->seq, op->event, (long long)rt->ev_done[op->event]);
}

mfsdp_result mf_streams_drain(mf_rt *rt)
{
    mfsdp_result res = MFSDP_OK;
    struct timespec deadline = {-1, 0};
    int spins = 0;
    pthread_mutex_lock(&rt->mu);
    while (!all_completed(rt)) {
        if (rt->failed != MFSDP_OK) {
            res = rt->failed;
            break;
        }
        if (help_one(rt)) {
            deadline.tv_sec = -1;
            continue;
        }
        if (kick_locked(rt, -1))
            continue;
        if (spin_wait(rt, &rt->cv, rt->cfg.timeout_ms, &deadline, &spins) == ETIMEDOUT &&
            !all_completed(rt)) {
            res = MFSDP_ERR_TIMEOUT;
            break;
        }
    }
    if (res == MFSDP_OK && rt->failed != MFSDP_OK)
        res = rt->failed;
    char msg[MF_RT_ERRLEN];
    if (res == MFSDP_ERR_TIMEOUT) {
        int n = snprintf(msg, sizeof msg, "rank %lld: the streams did not finish within %lld ms",
                         (long long)rt->rank, (long long)rt->cfg.timeout_ms);
        for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT && n < (int)sizeof msg; st++)
            n += describe_stream(rt, &rt->streams[st], msg + n, sizeof msg - (size_t)n);
    }
    pthread_mutex_unlock(&rt->mu);
    if (res == MFSDP_ERR_TIMEOUT)
        mf_base_fail_and_abort(rt, res, msg);
    return res;
}

bool mf_streams_busy(mf_rt *rt)
{
    pthread_mutex_lock(&rt->mu);
    bool busy = !all_completed(rt);
    pthread_mutex_unlock(&rt->mu);
    return busy;
}
