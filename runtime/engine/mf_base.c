/*
 * mf_base: the bottom of the engine (mf_base.h): the accounted allocator, the
 * graveyard, errors and the sticky failure, clocks and condition variables.
 *
 * Invariants: every allocation of the runtime is counted (mf_base_alloc_live)
 * and may be made to fail (mf_base_alloc_fail_at) for the tests that check
 * that a failed create frees everything; the first asynchronous failure of a
 * runtime is kept, later ones only wake the waiters again.
 */
#include "mf_base.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* ---- accounted allocation ---- */

static atomic_llong alloc_live;
static atomic_llong alloc_fail_countdown = -1;

static bool alloc_injected_failure(void)
{
    if (atomic_load(&alloc_fail_countdown) < 0)
        return false;
    return atomic_fetch_sub(&alloc_fail_countdown, 1) == 0;
}

void mf_base_alloc_fail_at(int64_t k)
{
    atomic_store(&alloc_fail_countdown, (long long)(k < 0 ? -1 : k));
}

int64_t mf_base_alloc_live(void)
{
    return atomic_load(&alloc_live);
}

void *mf_base_malloc(size_t n)
{
    if (alloc_injected_failure())
        return NULL;
    void *p = malloc(n ? n : 1);
    if (p)
        atomic_fetch_add(&alloc_live, 1);
    return p;
}

void *mf_base_calloc(size_t n, size_t size)
{
    if (alloc_injected_failure())
        return NULL;
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p)
        atomic_fetch_add(&alloc_live, 1);
    return p;
}

/* Whether allocations of MF_RT_HUGE_MIN bytes and more ask for transparent
 * huge pages (MFSDP_HUGE_PAGES=0 in the environment: no). */
static bool huge_pages_wanted(void)
{
    const char *env = getenv("MFSDP_HUGE_PAGES");
    return !(env && strcmp(env, "0") == 0);
}

void *mf_base_aligned_zalloc(size_t align, size_t n)
{
    if (alloc_injected_failure())
        return NULL;
    void *p = NULL;
    bool huge = n >= MF_RT_HUGE_MIN && huge_pages_wanted();
    if (huge && align < MF_RT_HUGE_MIN)
        align = MF_RT_HUGE_MIN;
    if (posix_memalign(&p, align, n ? n : 1) != 0)
        return NULL;
    /* Before the first touch, so that the zeroing below already faults in
     * huge pages (a hint: without THP the pages stay small). */
    if (huge)
        (void)madvise(p, n & ~(MF_RT_HUGE_MIN - 1), MADV_HUGEPAGE);
    memset(p, 0, n);
    atomic_fetch_add(&alloc_live, 1);
    return p;
}

mfsdp_result mf_base_host_alloc(mf_rt *rt, size_t bytes, void **out)
{
    *out = mf_base_aligned_zalloc(256, bytes);
    if (!*out)
        return mf_base_set_error(rt, MFSDP_ERR_OUT_OF_MEMORY, "out of host memory (%zu bytes)", bytes);
    return MFSDP_OK;
}

void mf_base_host_free(mf_rt *rt, void *p)
{
    (void)rt;
    mf_base_free(p);
}

void mf_base_free(void *p)
{
    if (!p)
        return;
    atomic_fetch_sub(&alloc_live, 1);
    free(p);
}

/* ---- errors ---- */

static _Thread_local char thread_err[MF_RT_ERRLEN];

char *mf_base_thread_error(void)
{
    return thread_err;
}

mfsdp_result mf_base_set_error(mf_rt *rt, mfsdp_result code, const char *fmt, ...)
{
    char *buf = rt ? rt->err : thread_err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, MF_RT_ERRLEN, fmt, ap);
    va_end(ap);
    return code;
}

/* Reads the magic of a handle that may have been freed: ASan would report
 * that read, and its quarantine keeps the memory mapped, which is what the
 * check is for (best effort). */
__attribute__((no_sanitize_address)) bool mf_base_live(const mf_rt *rt)
{
    return rt && rt->magic == MF_RT_MAGIC;
}

mfsdp_result mf_base_handle_check(const mf_rt *rt, const char *fn)
{
    if (mf_base_live(rt))
        return MFSDP_OK;
    if (!rt)
        return mf_base_set_error(NULL, MFSDP_ERR_INVALID_ARGUMENT, "%s: rt is NULL", fn);
    return mf_base_set_error(NULL, MFSDP_ERR_INVALID_USAGE,
                             "%s: rt is not a live runtime (destroyed by mfsdp_destroy, or not made "
                             "by mfsdp_create)",
                             fn);
}

void mf_base_fail(mf_rt *rt, mfsdp_result code, const char *msg)
{
    pthread_mutex_lock(&rt->mu);
    if (rt->failed == MFSDP_OK) {
        rt->failed = code;
        snprintf(rt->fail_msg, sizeof rt->fail_msg, "%s", msg);
    }
    pthread_cond_broadcast(&rt->cv);
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++)
        pthread_cond_broadcast(&rt->streams[st].work);
    pthread_mutex_unlock(&rt->mu);
}

void mf_base_fail_and_abort(mf_rt *rt, mfsdp_result code, const char *msg)
{
    mf_base_fail(rt, code, msg);
    /* Peers learn the root cause: the first failure of this runtime, which
     * may be another stream's (a wait interrupted by it fails later, but
     * can reach this point first). */
    char first[sizeof rt->fail_msg];
    pthread_mutex_lock(&rt->mu);
    snprintf(first, sizeof first, "%s", rt->fail_msg);
    pthread_mutex_unlock(&rt->mu);
    rt->be->abort(rt, first);
}

void mf_base_describe_op(const mf_rt *rt, int i, char *buf, size_t size)
{
    const mf_schedule *s = rt->s;
    const mf_op *op = &s->ops[i];
    const char *unit = op->unit >= 0 && op->unit < s->nunits ? s->units[op->unit].name : "-";
    if (mf_opkind_is_collective(op->kind) && op->axis >= 0 && op->axis < s->mesh.naxes)
        snprintf(buf, size, "op %d (%s %s on %s, %s of unit %s)", i, mf_opkind_name(op->kind),
                 s->mesh.axes[op->axis].name, mf_stream_name(op->stream), mf_phase_name(op->phase),
                 unit);
    else if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
        snprintf(buf, size, "op %d (%s event %d on %s, %s of unit %s)", i, mf_opkind_name(op->kind),
                 op->event, mf_stream_name(op->stream), mf_phase_name(op->phase), unit);
    else
        snprintf(buf, size, "op %d (%s on %s, %s of unit %s)", i, mf_opkind_name(op->kind),
                 mf_stream_name(op->stream), mf_phase_name(op->phase), unit);
}


MFSDP_API const char *mfsdp_last_error(const mfsdp_runtime *rt)
{
    return mf_base_live(rt) ? rt->err : thread_err;
}

/* ---- the graveyard ---- */

typedef struct mf_grave {
    void *p;
    struct mf_grave *next;
} mf_grave;

static mf_grave *graveyard;
static pthread_mutex_t graveyard_mu = PTHREAD_MUTEX_INITIALIZER;

void mf_base_graveyard(void *p)
{
    mf_grave *g = p ? malloc(sizeof *g) : NULL;
    if (!g)
        return;   /* out of memory: p stays allocated, merely unreferenced */
    pthread_mutex_lock(&graveyard_mu);
    g->p = p;
    g->next = graveyard;
    graveyard = g;
    pthread_mutex_unlock(&graveyard_mu);
}

/* ---- time ---- */

int64_t mf_base_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct timespec mf_base_deadline(int64_t timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (timeout_ms > 0) {
        ts.tv_sec += (time_t)(timeout_ms / 1000);
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
    }
    return ts;
}

int mf_base_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t timeout_ms,
                      const struct timespec *deadline)
{
    if (timeout_ms <= 0)
        return pthread_cond_wait(cv, mu);
    return pthread_cond_timedwait(cv, mu, deadline);
}

int mf_base_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return -1;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

int mf_base_spin_wait(pthread_mutex_t *mu, pthread_cond_t *cv, int max_spins, int64_t timeout_ms,
                      struct timespec *deadline, int *spins)
{
    if (*spins < max_spins) {
        ++*spins;
        pthread_mutex_unlock(mu);
        sched_yield();
        pthread_mutex_lock(mu);
        return 0;
    }
    if (deadline->tv_sec < 0)
        *deadline = mf_base_deadline(timeout_ms);
    return mf_base_cond_wait(cv, mu, timeout_ms, deadline);
}
