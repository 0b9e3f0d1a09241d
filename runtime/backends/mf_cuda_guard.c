/*
 * mf_cuda_guard: the call table, the watchdog, registration and the
 * launch-order variable of the NCCL backend (see mf_cuda_guard.h).
 *
 * Why the watchdog can abort without the NCCL lock: with blocking
 * communicators (the default) a call such as the first collective over a
 * connection to a dead peer can block the trainer inside NCCL while it holds
 * the lock. ncclCommAbort from another thread is the only way out (PyTorch's
 * ProcessGroupNCCL does the same); the aborted flag is set before, so once the
 * stuck call returns the trainer makes no further call on the communicator.
 */
#include "mf_cuda_guard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the call table ---- */

#define MF_REAL_CALLS                                                                      \
    {                                                                                      \
        .event_query = cudaEventQuery, .stream_query = cudaStreamQuery,                    \
        .get_last_error = cudaGetLastError, .comm_async_error = ncclCommGetAsyncError,     \
        .comm_abort = ncclCommAbort, .comm_register = ncclCommRegister,                    \
        .comm_deregister = ncclCommDeregister, .group_start = ncclGroupStart,              \
        .group_end = ncclGroupEnd,                                                         \
    }

static const mf_cuda_api real_calls = MF_REAL_CALLS;
mf_cuda_api mf_cuda_calls = MF_REAL_CALLS;

void mf_cuda_calls_reset(void)
{
    mf_cuda_calls = real_calls;
}

cudaError_t mf_cuda_query_event(cudaEvent_t ev)
{
    cudaError_t e = mf_cuda_calls.event_query(ev);
    if (e == cudaErrorNotReady)
        (void)mf_cuda_calls.get_last_error(); /* not an error: do not leave it for the next launch check */
    return e;
}

cudaError_t mf_cuda_query_stream(cudaStream_t st)
{
    cudaError_t e = mf_cuda_calls.stream_query(st);
    if (e == cudaErrorNotReady)
        (void)mf_cuda_calls.get_last_error();
    return e;
}

/* ---- the watchdog ---- */

int mf_watch_init(mf_watch *w, mf_rt *rt, int64_t rank, int64_t timeout_ms, pthread_mutex_t *nccl_mu)
{
    memset(w, 0, sizeof *w);
    w->rt = rt;
    w->rank = rank;
    w->timeout_ms = timeout_ms;
    w->nccl_mu = nccl_mu;
    atomic_init(&w->aborted, false);
    atomic_init(&w->call_since_ns, 0);
    int rc = pthread_mutex_init(&w->ring_mu, NULL);
    if (rc != 0)
        return rc;
    if ((rc = mf_base_cond_init(&w->cv)) != 0) {
        pthread_mutex_destroy(&w->ring_mu);
        return rc;
    }
    w->ready = true;
    return 0;
}

cudaError_t mf_watch_create_events(mf_watch *w)
{
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) /* collectives run there only */
        for (int k = 0; k < MF_WATCH_TRACK; k++) {
            cudaError_t e = cudaEventCreateWithFlags(&w->ring[st].ev[k], cudaEventDisableTiming);
            if (e != cudaSuccess)
                return e;
            w->ring_events = true;
        }
    return cudaSuccess;
}

void mf_watch_call_begin(mf_watch *w)
{
    atomic_store(&w->call_since_ns, (long long)mf_base_now_ns());
}

void mf_watch_call_end(mf_watch *w)
{
    atomic_store(&w->call_since_ns, 0);
}

void mf_watch_track(mf_watch *w, mf_stream st, cudaStream_t stream, int op)
{
    if (!w->started || (w->capturing && atomic_load(w->capturing)))
        return;
    pthread_mutex_lock(&w->ring_mu);
    mf_watch_ring *q = &w->ring[st];
    if (q->count < MF_WATCH_TRACK) { /* when full, the older entries already witness a stall */
        int slot = (q->head + q->count) % MF_WATCH_TRACK;
        if (cudaEventRecord(q->ev[slot], stream) == cudaSuccess) {
            q->op[slot] = op;
            q->t_ns[slot] = mf_base_now_ns();
            q->count++;
        }
    }
    pthread_mutex_unlock(&w->ring_mu);
}

static void describe(const mf_watch *w, int op, char *buf, size_t size)
{
    if (w->rt)
        mf_base_describe_op(w->rt, op, buf, size);
    else
        snprintf(buf, size, "op %d", op);
}

/* Asynchronous errors of every communicator; skipped when the trainer holds
 * the NCCL lock (the open-call check below covers a call that never returns). */
static mfsdp_result check_async(mf_watch *w, char *err, size_t errlen)
{
    if (pthread_mutex_trylock(w->nccl_mu) != 0)
        return MFSDP_OK;
    mfsdp_result res = MFSDP_OK;
    for (int i = -1; i < w->ncomms && res == MFSDP_OK && !atomic_load(&w->aborted); i++) {
        ncclComm_t comm = i < 0 ? w->world : w->comms[i];
        if (!comm)
            continue;
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = mf_cuda_calls.comm_async_error(comm, &state);
        if (q == ncclSuccess && (state == ncclSuccess || state == ncclInProgress))
            continue;
        ncclResult_t bad = q != ncclSuccess ? q : state;
        const char *name = i < 0 ? "world" : w->names && w->names[i] ? w->names[i] : "?";
        snprintf(err, errlen, "rank %lld: watchdog: the communicator %s reported an error: %s",
                 (long long)w->rank, name, ncclGetErrorString(bad));
        res = bad == ncclRemoteError ? MFSDP_ERR_ABORTED : MFSDP_ERR_BACKEND;
    }
    pthread_mutex_unlock(w->nccl_mu);
    return res;
}

static mfsdp_result check_rings(mf_watch *w, int64_t now_ns, char *err, size_t errlen)
{
    mfsdp_result res = MFSDP_OK;
    pthread_mutex_lock(&w->ring_mu);
    for (int st = 0; st < MF_STREAM_COUNT && res == MFSDP_OK; st++) {
        mf_watch_ring *q = &w->ring[st];
        while (q->count > 0) {
            cudaError_t e = mf_cuda_query_event(q->ev[q->head]);
            if (e == cudaSuccess) {
                q->head = (q->head + 1) % MF_WATCH_TRACK;
                q->count--;
                continue;
            }
            int64_t ms = (now_ns - q->t_ns[q->head]) / 1000000;
            char what[200];
            describe(w, q->op[q->head], what, sizeof what);
            if (e != cudaErrorNotReady) {
                snprintf(err, errlen, "rank %lld: watchdog: the %s stream failed after %s: %s", (long long)w->rank,
                         mf_stream_name((mf_stream)st), what, cudaGetErrorName(e));
                res = MFSDP_ERR_BACKEND;
            } else if (w->timeout_ms > 0 && ms >= w->timeout_ms) {
                snprintf(err, errlen,
                         "rank %lld: watchdog: %s on the %s stream has not completed after %lld ms (timeout %lld "
                         "ms): a peer stopped or died; the communicators were aborted",
                         (long long)w->rank, what, mf_stream_name((mf_stream)st), (long long)ms,
                         (long long)w->timeout_ms);
                res = MFSDP_ERR_TIMEOUT;
            }
            break;
        }
    }
    pthread_mutex_unlock(&w->ring_mu);
    return res;
}

mfsdp_result mf_watch_once(mf_watch *w, int64_t now_ns, char *err, size_t errlen)
{
    if (atomic_load(&w->aborted))
        return MFSDP_OK; /* already reported */
    mfsdp_result res = check_async(w, err, errlen);
    if (res != MFSDP_OK)
        return res;
    long long since = atomic_load(&w->call_since_ns);
    if (since > 0 && w->timeout_ms > 0 && (now_ns - since) / 1000000 >= w->timeout_ms) {
        snprintf(err, errlen,
                 "rank %lld: watchdog: an NCCL call has not returned after %lld ms (timeout %lld ms): a peer "
                 "stopped or died; the communicators were aborted",
                 (long long)w->rank, (long long)((now_ns - since) / 1000000), (long long)w->timeout_ms);
        return MFSDP_ERR_TIMEOUT;
    }
    /* While the compute stream is captured nothing eager is tracked; the
     * thread runs in relaxed capture mode, so a query would not invalidate a
     * capture anyway. */
    if (w->capturing && atomic_load(w->capturing))
        return MFSDP_OK;
    return check_rings(w, now_ns, err, errlen);
}

bool mf_watch_aborted(const mf_watch *w)
{
    return atomic_load(&w->aborted);
}

void mf_watch_abort(mf_watch *w, int64_t lock_ms)
{
    if (atomic_exchange(&w->aborted, true))
        return;
    bool locked = false;
    if (w->nccl_mu) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += lock_ms / 1000;
        ts.tv_nsec += (lock_ms % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        locked = pthread_mutex_timedlock(w->nccl_mu, &ts) == 0;
    }
    for (int i = 0; i < w->ncomms; i++)
        if (w->comms && w->comms[i])
            mf_cuda_calls.comm_abort(w->comms[i]);
    if (w->world)
        mf_cuda_calls.comm_abort(w->world);
    if (locked)
        pthread_mutex_unlock(w->nccl_mu);
}

static void *watch_main(void *arg)
{
    mf_watch *w = arg;
    cudaSetDevice(w->device);
    /* Relaxed: this thread's queries never count against a capture another
     * thread runs, whatever its mode (global included). */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    pthread_mutex_lock(&w->ring_mu);
    while (!w->stop) {
        struct timespec deadline = mf_base_deadline(w->poll_ms);
        while (!w->stop && mf_base_cond_wait(&w->cv, &w->ring_mu, w->poll_ms, &deadline) != ETIMEDOUT)
            ;
        if (w->stop)
            break;
        pthread_mutex_unlock(&w->ring_mu);
        char msg[MF_RT_ERRLEN];
        mfsdp_result r = mf_watch_once(w, mf_base_now_ns(), msg, sizeof msg);
        if (r != MFSDP_OK) {
            if (w->on_fail)
                w->on_fail(w->fail_ctx, r, msg);
            mf_watch_abort(w, MF_WATCH_LOCK_MS);
            pthread_mutex_lock(&w->ring_mu);
            break;
        }
        pthread_mutex_lock(&w->ring_mu);
    }
    pthread_mutex_unlock(&w->ring_mu);
    return NULL;
}

int mf_watch_start(mf_watch *w, int64_t poll_ms, int device, mf_watch_fail_fn on_fail, void *ctx)
{
    w->poll_ms = poll_ms;
    w->device = device;
    w->on_fail = on_fail;
    w->fail_ctx = ctx;
    w->started = true; /* before the thread: track() may run at once */
    int rc = pthread_create(&w->thread, NULL, watch_main, w);
    if (rc != 0)
        w->started = false;
    return rc;
}

void mf_watch_destroy(mf_watch *w)
{
    if (!w->ready)
        return;
    if (w->started) {
        pthread_mutex_lock(&w->ring_mu);
        w->stop = true;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->ring_mu);
        pthread_join(w->thread, NULL);
        w->started = false;
    }
    if (w->ring_events)
        for (int st = 0; st < MF_STREAM_COUNT; st++)
            for (int k = 0; k < MF_WATCH_TRACK; k++)
                if (w->ring[st].ev[k])
                    cudaEventDestroy(w->ring[st].ev[k]);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->ring_mu);
    w->ready = false;
}

/* ---- registration ---- */

void mf_cuda_nccl_deregister_all(const ncclComm_t *comms, int ncomms, void **handles, int nregions, int stride)
{
    for (int c = 0; c < ncomms; c++)
        for (int k = 0; k < nregions; k++) {
            void **h = &handles[c * stride + k];
            if (*h && comms[c])
                mf_cuda_calls.comm_deregister(comms[c], *h);
            *h = NULL;
        }
}

ncclResult_t mf_cuda_nccl_register_all(const ncclComm_t *comms, int ncomms, void *const *regions,
                                       const size_t *bytes, int nregions, void **handles, int stride,
                                       int *failed_comm, int *failed_region)
{
    *failed_comm = *failed_region = -1;
    for (int c = 0; c < ncomms; c++)
        for (int k = 0; k < nregions; k++) {
            void **h = &handles[c * stride + k];
            ncclResult_t r = mf_cuda_calls.comm_register(comms[c], regions[k], bytes[k], h);
            if (r != ncclSuccess) {
                *h = NULL;
                *failed_comm = c;
                *failed_region = k;
                mf_cuda_nccl_deregister_all(comms, ncomms, handles, nregions, stride);
                return r;
            }
        }
    return ncclSuccess;
}

/* ---- launch order ---- */

bool mf_cuda_nccl_launch_order_decide(const char *value, bool trainer_nccl, char *warn, size_t warnlen)
{
    if (warnlen)
        warn[0] = '\0';
    if (value && strcmp(value, "1") == 0)
        return false;
    if (value) {
        snprintf(warn, warnlen,
                 "NCCL_LAUNCH_ORDER_IMPLICIT is \"%s\" in the environment and was left alone: NCCL does not "
                 "order the inner and outer communicators' kernels by their host launch order (set it to 1)",
                 value);
        return false;
    }
    if (trainer_nccl)
        snprintf(warn, warnlen,
                 "NCCL_LAUNCH_ORDER_IMPLICIT was not set when the trainer started using NCCL: NCCL reads it at "
                 "its first launch in the process, so if the trainer launched a collective before "
                 "mfsdp_create, setting it now has no effect (set NCCL_LAUNCH_ORDER_IMPLICIT=1 in the "
                 "environment before the process starts)");
    return true;
}

static pthread_mutex_t launch_order_mu = PTHREAD_MUTEX_INITIALIZER;
static bool launch_order_done;
static char launch_order_warn[512];

void mf_cuda_nccl_launch_order(bool trainer_nccl, char *warn, size_t warnlen)
{
    pthread_mutex_lock(&launch_order_mu);
    if (!launch_order_done) {
        if (mf_cuda_nccl_launch_order_decide(getenv("NCCL_LAUNCH_ORDER_IMPLICIT"), trainer_nccl, launch_order_warn,
                                             sizeof launch_order_warn))
            setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 1);
        launch_order_done = true;
    }
    snprintf(warn, warnlen, "%s", launch_order_warn);
    pthread_mutex_unlock(&launch_order_mu);
}

/* ---- groups ---- */

ncclResult_t mf_cuda_nccl_group_issue(int n, ncclResult_t (*enqueue)(void *ctx, int k), void *ctx)
{
    if (n == 1)
        return enqueue(ctx, 0);
    ncclResult_t first = mf_cuda_calls.group_start();
    if (first != ncclSuccess)
        return first; /* no group is open: nothing to close */
    for (int k = 0; k < n && first == ncclSuccess; k++) {
        ncclResult_t r = enqueue(ctx, k);
        if (r != ncclSuccess && r != ncclInProgress)
            first = r;
    }
    ncclResult_t end = mf_cuda_calls.group_end(); /* also after a failed member */
    return first != ncclSuccess ? first : end;
}
