/*
 * gm_stream: streams as FIFO queues run by worker threads, and events.
 *
 * Work is never executed at the call: gm_submit_locked appends an item, and
 * the stream's worker runs it once the item is at the head of the queue and
 * its dependencies are met. Dependencies are (stream, sequence) pairs: an
 * event wait, the legacy default stream's implicit synchronization (an item on
 * the legacy stream depends on the last item of every blocking stream of the
 * device; an item on a blocking stream depends on the legacy stream's last),
 * or a graph exec's previous launch. Before some items a worker sleeps a
 * delay drawn from the seed, the stream and the item (the perturbation).
 *
 * A failing item (a gm_work_fn returning an error) makes the error sticky for
 * the device, as a fault does: later work of the device is skipped (its
 * sequence still completes so nothing waits forever) and the API returns it.
 *
 * Locking: the API holds gm_g.mu; a stream's queue, its worker's wake-ups
 * and its done_cv are guarded by the stream's own lock `lk` (taken after
 * gm_g.mu, never the other way round, and never two stream locks at once).
 * A worker's hot path takes only stream locks: its own to pop and complete,
 * a dependency's to sleep on it. done_seq is written under lk with release
 * order and read anywhere with acquire order (gm_done): it only grows, so a
 * stale read only makes a dependency look pending. The sticky errors are
 * atomics (a worker sets one without gm_g.mu).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gm_internal.h"

static gm_set gm_stream_set;   /* every stream ever made (never freed) */
static gm_set gm_event_set;    /* live events and quarantined destroyed ones */
#define GM_EVENT_QUARANTINE 4096
static gm_event *gm_event_ring[GM_EVENT_QUARANTINE];
static unsigned gm_event_ring_next;
static pthread_key_t gm_thread_key;
static pthread_once_t gm_key_once = PTHREAD_ONCE_INIT;

/* The first dependency of it not met yet, or NULL. */
static const gm_dep *unmet_dep(const gm_item *it)
{
    for (int i = 0; i < it->ndeps; i++)
        if (gm_done(it->deps[i].s) < it->deps[i].seq)
            return &it->deps[i];
    return NULL;
}

/* Sleeps until s->done_seq >= seq (s->lk held, no other lock): on
 * s->done_cv, with s->wake_at lowered to seq so the completion that reaches
 * it wakes us. */
static void wait_done_lk(gm_stream *s, uint64_t seq)
{
    while (gm_done(s) < seq) {
        if (seq < s->wake_at)
            s->wake_at = seq;
        pthread_cond_wait(&s->done_cv, &s->lk);
    }
}

/* The same, holding no lock. */
static void wait_done(gm_stream *s, uint64_t seq)
{
    if (gm_done(s) >= seq)
        return;
    pthread_mutex_lock(&s->lk);
    wait_done_lk(s, seq);
    pthread_mutex_unlock(&s->lk);
}

static void perturb(const gm_stream *s, uint64_t seq)
{
    uint64_t site = ((uint64_t)(unsigned)s->id << 40) ^ seq;
    if (gm_g.delay_us == 0 || (gm_hash(gm_g.seed * 31u + site) & 1u) == 0)
        return;
    unsigned us = gm_delay_us(site);
    if (us)
        usleep(us);
}

/* The head item of s has run (result r): pops it, advances done_seq and
 * wakes the waiters whose sequence is reached (s->lk held). */
static void complete_lk(gm_stream *s, gm_item *it, cudaError_t r, const char *err)
{
    if (r != cudaSuccess) {
        fprintf(stderr, "gpumodel: %s failed on stream %d of device %d: %s%s%s\n", it->what, s->id, s->device,
                cudaGetErrorName(r), err[0] ? ": " : "", err);
        cudaError_t none = cudaSuccess;
        __atomic_compare_exchange_n(&gm_g.sticky[s->device], &none, r, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    s->head = it->next;
    if (!s->head)
        s->tail = NULL;
    __atomic_store_n(&s->done_seq, it->seq, __ATOMIC_RELEASE);
    if (s->done_seq >= s->wake_at) {
        s->wake_at = UINT64_MAX;
        pthread_cond_broadcast(&s->done_cv);
    }
}

static void *worker(void *p)
{
    gm_stream *s = p;
    gm_thread()->device = s->device; /* work runs "on" the stream's device */
    pthread_mutex_lock(&s->lk);
    for (;;) {
        while (!s->head && !s->dead) {
            s->idle = 1;
            pthread_cond_wait(&s->wake, &s->lk);
            s->idle = 0;
        }
        if (!s->head)
            break;
        gm_item *it = s->head; /* stays the head: only this thread pops */
        pthread_mutex_unlock(&s->lk);
        for (const gm_dep *d; (d = unmet_dep(it));)
            wait_done(d->s, d->seq);
        cudaError_t sticky = __atomic_load_n(&gm_g.sticky[s->device], __ATOMIC_ACQUIRE);
        perturb(s, it->seq);
        cudaError_t r = cudaSuccess;
        char err[512] = "";
        if (it->fn && sticky == cudaSuccess)
            r = it->fn(it->arg, err, sizeof err);
        if (it->free_arg)
            it->free_arg(it->arg);
        free(it->deps);
        pthread_mutex_lock(&s->lk);
        complete_lk(s, it, r, err);
        free(it);
    }
    pthread_mutex_unlock(&s->lk);
    return NULL;
}

/* Marks s destroyed and wakes its worker to drain and exit (gm_g.mu held). */
static void stream_kill_locked(gm_stream *s)
{
    pthread_mutex_lock(&s->lk);
    s->dead = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lk);
}

static void thread_exit(void *p)
{
    gm_tls *t = p;
    pthread_mutex_lock(&gm_g.mu);
    for (int d = 0; d < GM_MAX_DEVICES; d++)
        if (t->per_thread[d]) {
            stream_kill_locked(t->per_thread[d]);
            t->per_thread[d] = NULL;
        }
    pthread_mutex_unlock(&gm_g.mu);
}

static void make_key(void)
{
    pthread_key_create(&gm_thread_key, thread_exit);
}

static gm_stream *stream_new_locked(int device, int kind, unsigned flags, int priority)
{
    gm_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->id = gm_g.next_stream_id++;
    s->device = device;
    s->kind = kind;
    s->flags = flags;
    s->priority = priority;
    s->wake_at = UINT64_MAX;
    pthread_mutex_init(&s->lk, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 8 << 20);
    int rc = pthread_create(&th, &attr, worker, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_cond_destroy(&s->wake);
        pthread_cond_destroy(&s->done_cv);
        pthread_mutex_destroy(&s->lk);
        free(s);
        return NULL;
    }
    s->next_all = gm_g.streams;
    gm_g.streams = s;
    gm_set_add(&gm_stream_set, s);
    return s;
}

/* The stream a handle names: 0 and cudaStreamLegacy the current device's
 * legacy stream, cudaStreamPerThread this thread's, else a created one. */
cudaError_t gm_stream_resolve_locked(cudaStream_t h, gm_stream **out)
{
    gm_tls *t = gm_thread();
    int dev = t->device;
    if (gm_g.no_device)
        return cudaErrorNoDevice;
    if (h == 0 || h == cudaStreamLegacy) {
        if (!gm_g.legacy[dev])
            gm_g.legacy[dev] = stream_new_locked(dev, GM_STREAM_LEGACY, 0, 0);
        *out = gm_g.legacy[dev];
        return *out ? cudaSuccess : cudaErrorMemoryAllocation;
    }
    if (h == cudaStreamPerThread) {
        if (!t->per_thread[dev]) {
            pthread_once(&gm_key_once, make_key);
            pthread_setspecific(gm_thread_key, t);
            t->per_thread[dev] = stream_new_locked(dev, GM_STREAM_PER_THREAD, 0, 0);
        }
        *out = t->per_thread[dev];
        return *out ? cudaSuccess : cudaErrorMemoryAllocation;
    }
    gm_stream *s = (gm_stream *)h;
    if (!gm_set_has(&gm_stream_set, s)) {
        gm_violation("stream handle %p was never created by cudaStreamCreate*", (void *)h);
        return cudaErrorInvalidResourceHandle;
    }
    if (s->dead) {
        gm_violation("use of stream %d (%p) after cudaStreamDestroy", s->id, (void *)h);
        return cudaErrorInvalidResourceHandle;
    }
    *out = s;
    return cudaSuccess;
}

static int blocking(const gm_stream *s)
{
    return s->kind != GM_STREAM_LEGACY && !(s->flags & cudaStreamNonBlocking);
}

/* The implicit dependencies of new work on s (the legacy stream's rules). */
static int implicit_deps_locked(const gm_stream *s, gm_dep *out, int cap)
{
    int n = 0;
    if (s->kind == GM_STREAM_LEGACY) {
        for (gm_stream *x = gm_g.streams; x; x = x->next_all)
            if (x != s && x->device == s->device && blocking(x) && gm_done(x) < x->enq_seq) {
                if (n < cap)
                    out[n] = (gm_dep){x, x->enq_seq};
                n++;
            }
    } else if (blocking(s)) {
        gm_stream *l = gm_g.legacy[s->device];
        if (l && gm_done(l) < l->enq_seq) {
            if (n < cap)
                out[n] = (gm_dep){l, l->enq_seq};
            n++;
        }
    }
    return n;
}

cudaError_t gm_submit_locked(gm_stream *s, const char *what, gm_work_fn fn, void *arg,
                             void (*free_arg)(void *), const gm_dep *extra, int nextra, uint64_t *seq)
{
    int nimp = implicit_deps_locked(s, NULL, 0);
    gm_item *it = calloc(1, sizeof *it);
    gm_dep *deps = (nimp + nextra) ? calloc((size_t)(nimp + nextra), sizeof *deps) : NULL;
    if (!it || ((nimp + nextra) && !deps)) {
        free(it);
        free(deps);
        return cudaErrorMemoryAllocation;
    }
    implicit_deps_locked(s, deps, nimp);
    for (int i = 0; i < nextra; i++)
        deps[nimp + i] = extra[i];
    it->ndeps = nimp + nextra;
    it->deps = deps;
    snprintf(it->what, sizeof it->what, "%s", what ? what : "work");
    it->fn = fn;
    it->arg = arg;
    it->free_arg = free_arg;
    it->seq = ++s->enq_seq;
    if (seq)
        *seq = it->seq;
    pthread_mutex_lock(&s->lk);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    if (s->idle)
        pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lk);
    return cudaSuccess;
}

/* gm_g.mu is released while it sleeps (as a wait on a condition variable
 * of gm_g.mu would): callers re-read what they need afterwards. */
void gm_wait_seq_locked(gm_stream *s, uint64_t seq)
{
    if (gm_done(s) >= seq)
        return;
    pthread_mutex_lock(&s->lk);
    if (gm_done(s) < seq) {
        pthread_mutex_unlock(&gm_g.mu);
        wait_done_lk(s, seq);
        pthread_mutex_unlock(&s->lk);
        pthread_mutex_lock(&gm_g.mu);
        return;
    }
    pthread_mutex_unlock(&s->lk);
}

/* Waits for everything s holds now; for the legacy stream also for the
 * blocking streams' work that legacy work enqueued now would wait for. */
void gm_stream_sync_locked(gm_stream *s)
{
    gm_dep deps[256];
    int n = implicit_deps_locked(s, deps, 256);
    uint64_t mine = s->enq_seq;
    if (n > 256)
        gm_device_sync_locked(s->device);
    for (int i = 0; i < n && i < 256; i++)
        gm_wait_seq_locked(deps[i].s, deps[i].seq);
    gm_wait_seq_locked(s, mine);
}

static int stream_idle_locked(gm_stream *s)
{
    gm_dep deps[1];
    if (gm_done(s) < s->enq_seq)
        return 0;
    return s->kind != GM_STREAM_LEGACY || implicit_deps_locked(s, deps, 1) == 0;
}

void gm_device_sync_locked(int device)
{
    for (gm_stream *x = gm_g.streams; x; x = x->next_all)
        if (x->device == device) {
            uint64_t t = x->enq_seq;
            gm_wait_seq_locked(x, t);
        }
}

cudaError_t gm_sticky_locked(int device)
{
    return __atomic_load_n(&gm_g.sticky[device], __ATOMIC_ACQUIRE);
}

cudaError_t gm_enqueue(cudaStream_t h, const char *what, gm_work_fn run, void *arg, void (*free_arg)(void *arg))
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(h, &s);
    if (e == cudaSuccess)
        e = gm_sticky_locked(s->device);
    if (e == cudaSuccess) {
        if (s->cap)
            e = gm_capture_add_locked(s, what, run, arg, free_arg);
        else if ((e = gm_capture_check_legacy_locked(s, what)) == cudaSuccess)
            e = gm_submit_locked(s, what, run, arg, free_arg, NULL, 0, NULL);
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

/* In a child forked after the model started, the workers are gone (fork keeps
 * only the calling thread): the child gets a fresh set of streams, pending
 * work of the parent's is dropped (its sequences count as complete, so
 * nothing waits for it) and captures are forgotten. Memory stays (fork copied
 * it). CUDA itself refuses a child's calls; the model must never hang. */
static void after_fork_child(void)
{
    pthread_mutex_init(&gm_g.mu, NULL);
    gm_mem_after_fork();
    gm_launch_after_fork();
    for (gm_stream *x = gm_g.streams; x; x = x->next_all) {
        x->head = x->tail = NULL;
        x->done_seq = x->enq_seq;
        x->dead = 1;
        x->cap = NULL;
        x->idle = 0;
        x->wake_at = UINT64_MAX;
        pthread_mutex_init(&x->lk, NULL); /* no thread of the parent is left to hold it */
        pthread_cond_init(&x->wake, NULL);
        pthread_cond_init(&x->done_cv, NULL);
    }
    for (int d = 0; d < GM_MAX_DEVICES; d++) {
        gm_g.legacy[d] = NULL;
        gm_thread()->per_thread[d] = NULL;
    }
    gm_g.captures = NULL;
}

void gm_stream_atfork(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* ---- the stream API ---- */

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *out, unsigned int flags, int priority)
{
    gm_init();
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking))
        return gm_ret(cudaErrorInvalidValue);
    if (gm_g.no_device)
        return gm_ret(cudaErrorNoDevice);
    priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = stream_new_locked(gm_thread()->device, GM_STREAM_USER, flags, priority);
    pthread_mutex_unlock(&gm_g.mu);
    if (!s)
        return gm_ret(cudaErrorMemoryAllocation);
    *out = (cudaStream_t)s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    return cudaStreamCreateWithPriority(out, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *out)
{
    return cudaStreamCreateWithPriority(out, 0, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t h)
{
    gm_init();
    if (h == 0 || h == cudaStreamLegacy || h == cudaStreamPerThread)
        return gm_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(h, &s);
    if (e == cudaSuccess) {
        if (s->cap)
            gm_capture_invalidate_locked(s->cap, "cudaStreamDestroy of a capturing stream");
        stream_kill_locked(s);
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaStreamGetPriority(cudaStream_t h, int *priority)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(h, &s);
    if (e == cudaSuccess && priority)
        *priority = s->priority;
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaStreamGetFlags(cudaStream_t h, unsigned int *flags)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(h, &s);
    if (e == cudaSuccess && flags)
        *flags = s->flags;
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaStreamQuery(cudaStream_t h)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(h, &s);
    if (e == cudaSuccess && s->cap) {
        gm_capture_invalidate_locked(s->cap, "cudaStreamQuery of the capturing stream");
        e = cudaErrorStreamCaptureUnsupported;
    }
    if (e == cudaSuccess)
        e = gm_capture_prohibited_locked("cudaStreamQuery");
    if (e == cudaSuccess && (e = gm_sticky_locked(s->device)) == cudaSuccess)
        e = stream_idle_locked(s) ? cudaSuccess : cudaErrorNotReady;
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(h, &s);
    if (e == cudaSuccess && s->cap) {
        gm_capture_invalidate_locked(s->cap, "cudaStreamSynchronize of the capturing stream");
        e = cudaErrorStreamCaptureUnsupported;
    }
    if (e == cudaSuccess)
        e = gm_capture_prohibited_locked("cudaStreamSynchronize");
    if (e == cudaSuccess) {
        gm_stream_sync_locked(s);
        e = gm_sticky_locked(s->device);
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

cudaError_t cudaDeviceSynchronize(void)
{
    gm_init();
    if (gm_g.no_device)
        return gm_ret(cudaErrorNoDevice);
    pthread_mutex_lock(&gm_g.mu);
    cudaError_t e = gm_capture_prohibited_locked("cudaDeviceSynchronize");
    /* Whatever the modes: the device encompasses its capturing streams. */
    for (gm_stream *x = gm_g.streams; x && e == cudaSuccess; x = x->next_all)
        if (x->cap && x->device == gm_thread()->device) {
            gm_capture_invalidate_locked(x->cap, "cudaDeviceSynchronize while a stream of the device captures");
            e = cudaErrorStreamCaptureUnsupported;
        }
    if (e == cudaSuccess) {
        gm_device_sync_locked(gm_thread()->device);
        e = gm_sticky_locked(gm_thread()->device);
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(e);
}

/* ---- events ---- */

static void stamp_release(void *p)
{
    gm_stamp *st = p;
    if (st && __atomic_sub_fetch(&st->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(st);
}

static cudaError_t stamp_run(void *p, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    ((gm_stamp *)p)->t = gm_now();
    return cudaSuccess;
}

static cudaError_t event_lookup_locked(cudaEvent_t h, const char *call, gm_event **out)
{
    gm_event *e = (gm_event *)h;
    if (!gm_set_has(&gm_event_set, e)) {
        gm_violation("%s: event handle %p was never created by cudaEventCreate* (or was destroyed long ago)",
                     call, (void *)h);
        return cudaErrorInvalidResourceHandle;
    }
    if (e->dead) {
        gm_violation("%s: use of event %p after cudaEventDestroy", call, (void *)h);
        return cudaErrorInvalidResourceHandle;
    }
    *out = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags)
{
    gm_init();
    unsigned ok = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (!out || (flags & ~ok) || ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
        return gm_ret(cudaErrorInvalidValue);
    if (gm_g.no_device)
        return gm_ret(cudaErrorNoDevice);
    gm_event *e = calloc(1, sizeof *e);
    if (!e)
        return gm_ret(cudaErrorMemoryAllocation);
    e->flags = flags;
    e->device = gm_thread()->device;
    pthread_mutex_lock(&gm_g.mu);
    gm_set_add(&gm_event_set, e);
    pthread_mutex_unlock(&gm_g.mu);
    *out = (cudaEvent_t)e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out)
{
    return cudaEventCreateWithFlags(out, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t h)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_event *e = NULL;
    cudaError_t r = event_lookup_locked(h, "cudaEventDestroy", &e);
    if (r == cudaSuccess) {
        /* Waits already enqueued name (stream, sequence), not the event. */
        e->dead = 1;
        stamp_release(e->stamp);
        e->stamp = NULL;
        gm_nodeset_free(&e->cap_nodes);
        gm_event *old = gm_event_ring[gm_event_ring_next];
        gm_event_ring[gm_event_ring_next] = e;
        gm_event_ring_next = (gm_event_ring_next + 1) % GM_EVENT_QUARANTINE;
        if (old) {
            gm_set_del(&gm_event_set, old);
            free(old);
        }
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(r);
}

cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t sh)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_event *e = NULL;
    gm_stream *s = NULL;
    cudaError_t r = event_lookup_locked(h, "cudaEventRecord", &e);
    if (r == cudaSuccess)
        r = gm_stream_resolve_locked(sh, &s);
    if (r == cudaSuccess)
        r = gm_sticky_locked(s->device);
    if (r == cudaSuccess && s->cap) {
        r = gm_capture_event_record_locked(e, s);
    } else if (r == cudaSuccess && (r = gm_capture_check_legacy_locked(s, "cudaEventRecord")) == cudaSuccess) {
        gm_stamp *st = calloc(1, sizeof *st);
        if (!st) {
            r = cudaErrorMemoryAllocation;
        } else {
            st->refs = 2; /* the event's and the item's */
            uint64_t seq = 0;
            r = gm_submit_locked(s, "cudaEventRecord", stamp_run, st, stamp_release, NULL, 0, &seq);
            if (r != cudaSuccess) {
                free(st);
            } else {
                stamp_release(e->stamp);
                e->stamp = st;
                e->recorded = 1;
                e->s = s;
                e->seq = seq;
                e->cap_id = 0;
                gm_nodeset_free(&e->cap_nodes);
            }
        }
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(r);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t h, cudaStream_t sh, unsigned int flags)
{
    if (flags != 0)
        return gm_ret(cudaErrorInvalidValue);
    return cudaEventRecord(h, sh);
}

/* cudaErrorCapturedEvent when e's last record was in a capture still going. */
static cudaError_t not_captured_locked(gm_event *e, const char *call)
{
    if (e->cap_id && gm_capture_find_locked(e->cap_id)) {
        gm_violation("%s: event %p was last recorded in capture %llu, which is still going", call, (void *)e,
                     e->cap_id);
        return cudaErrorCapturedEvent;
    }
    return cudaSuccess;
}

static int event_done_locked(const gm_event *e)
{
    return !e->recorded || gm_done(e->s) >= e->seq;
}

cudaError_t cudaEventQuery(cudaEvent_t h)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_event *e = NULL;
    cudaError_t r = event_lookup_locked(h, "cudaEventQuery", &e);
    if (r == cudaSuccess)
        r = not_captured_locked(e, "cudaEventQuery");
    if (r == cudaSuccess)
        r = gm_capture_prohibited_locked("cudaEventQuery");
    if (r == cudaSuccess && (r = gm_sticky_locked(e->device)) == cudaSuccess)
        r = event_done_locked(e) ? cudaSuccess : cudaErrorNotReady;
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(r);
}

cudaError_t cudaEventSynchronize(cudaEvent_t h)
{
    gm_init();
    pthread_mutex_lock(&gm_g.mu);
    gm_event *e = NULL;
    cudaError_t r = event_lookup_locked(h, "cudaEventSynchronize", &e);
    if (r == cudaSuccess)
        r = not_captured_locked(e, "cudaEventSynchronize");
    if (r == cudaSuccess)
        r = gm_capture_prohibited_locked("cudaEventSynchronize");
    if (r == cudaSuccess) {
        if (e->recorded)
            gm_wait_seq_locked(e->s, e->seq);
        r = gm_sticky_locked(e->device);
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(r);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    gm_init();
    if (!ms)
        return gm_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&gm_g.mu);
    gm_event *ea = NULL, *eb = NULL;
    cudaError_t r = event_lookup_locked(a, "cudaEventElapsedTime", &ea);
    if (r == cudaSuccess)
        r = event_lookup_locked(b, "cudaEventElapsedTime", &eb);
    if (r == cudaSuccess && ((ea->flags | eb->flags) & cudaEventDisableTiming))
        r = cudaErrorInvalidResourceHandle;
    if (r == cudaSuccess && (!ea->recorded || !eb->recorded))
        r = cudaErrorInvalidResourceHandle;
    if (r == cudaSuccess && (r = not_captured_locked(ea, "cudaEventElapsedTime")) == cudaSuccess)
        r = not_captured_locked(eb, "cudaEventElapsedTime");
    if (r == cudaSuccess)
        r = gm_sticky_locked(ea->device);
    if (r == cudaSuccess && (!event_done_locked(ea) || !event_done_locked(eb)))
        r = cudaErrorNotReady;
    if (r == cudaSuccess)
        *ms = (float)((eb->stamp->t - ea->stamp->t) * 1e3);
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(r);
}

static int drop_this_wait_locked(cudaStream_t sh, cudaEvent_t h)
{
    long n = gm_g.drop_per_thread ? ++gm_thread()->waits : ++gm_g.waits;
    if (gm_g.drop_wait == 0 || n != gm_g.drop_wait)
        return 0;
    fprintf(stderr, "gpumodel: GM_DROP_WAIT=%ld: cudaStreamWaitEvent #%ld%s (stream %p, event %p) dropped\n",
            gm_g.drop_wait, n, gm_g.drop_per_thread ? " of this thread" : "", (void *)sh, (void *)h);
    return 1;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t sh, cudaEvent_t h, unsigned int flags)
{
    gm_init();
    if (flags & ~(unsigned)cudaEventWaitExternal)
        return gm_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&gm_g.mu);
    gm_event *e = NULL;
    gm_stream *s = NULL;
    cudaError_t r = gm_stream_resolve_locked(sh, &s);
    if (r == cudaSuccess)
        r = event_lookup_locked(h, "cudaStreamWaitEvent", &e);
    if (r == cudaSuccess)
        r = gm_sticky_locked(s->device);
    if (r == cudaSuccess && !drop_this_wait_locked(sh, h)) {
        int handled = 0;
        r = gm_capture_event_wait_locked(s, e, &handled);
        if (r == cudaSuccess && !handled && !s->cap && e->recorded && gm_done(e->s) < e->seq &&
            (r = gm_capture_check_legacy_locked(s, "cudaStreamWaitEvent")) == cudaSuccess) {
            gm_dep d = {e->s, e->seq};
            r = gm_submit_locked(s, "cudaStreamWaitEvent", NULL, NULL, NULL, &d, 1, NULL);
        }
    }
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(r);
}

typedef struct gm_host_fn {
    cudaHostFn_t fn;
    void *data;
} gm_host_fn;

static cudaError_t host_fn_run(void *p, char *err, size_t len)
{
    (void)err, (void)len;
    gm_host_fn *h = p;
    h->fn(h->data);
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data)
{
    if (!fn)
        return gm_ret(cudaErrorInvalidValue);
    gm_host_fn *h = malloc(sizeof *h);
    if (!h)
        return gm_ret(cudaErrorMemoryAllocation);
    h->fn = fn, h->data = data;
    cudaError_t e = gm_enqueue(s, "cudaLaunchHostFunc", host_fn_run, h, free);
    if (e != cudaSuccess)
        free(h);
    return e;
}
