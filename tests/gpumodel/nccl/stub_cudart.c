/*
 * stub_cudart: a stand-in for the CUDA model (tests/gpumodel/cudart, target
 * gm_cudart) with just what the NCCL model and its self-tests call, built
 * only when gm_cudart is not part of the build (so the NCCL model can be
 * tested alone). Streams are FIFO queues run by one worker thread each (work
 * is never run at the call); device memory is tracked host memory; nothing
 * captures. Not a model of CUDA: the real one is cudart/.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gm_model.h"

/* ---- memory ---- */

typedef struct alloc {
    char *p;
    size_t bytes;
    struct alloc *next;
} alloc;
static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static alloc *allocs;

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    alloc *a = calloc(1, sizeof *a);
    if (!p || !a || !(a->p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256))) {
        free(a);
        return cudaErrorMemoryAllocation;
    }
    memset(a->p, 0xa5, bytes);
    a->bytes = bytes;
    pthread_mutex_lock(&mem_mu);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&mem_mu);
    *p = a->p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    pthread_mutex_lock(&mem_mu);
    alloc **pp = &allocs;
    while (*pp && (*pp)->p != p)
        pp = &(*pp)->next;
    alloc *a = *pp;
    if (a)
        *pp = a->next;
    pthread_mutex_unlock(&mem_mu);
    if (!a)
        return cudaErrorInvalidValue;
    free(a->p);
    free(a);
    return cudaSuccess;
}

cudaError_t gm_alloc_nccl(void **p, size_t bytes)
{
    return cudaMalloc(p, bytes);
}

cudaError_t gm_free_nccl(void *p)
{
    return cudaFree(p);
}

cudaError_t gm_check_range(const void *p, size_t bytes, const char *what, char *err, size_t errlen)
{
    if (!bytes)
        return cudaSuccess;
    const char *c = p;
    pthread_mutex_lock(&mem_mu);
    alloc *a = allocs;
    while (a && !(c >= a->p && c + bytes <= a->p + a->bytes))
        a = a->next;
    pthread_mutex_unlock(&mem_mu);
    if (a)
        return cudaSuccess;
    snprintf(err, errlen, "%s: [%p, +%zu) is not inside one device allocation", what, p, bytes);
    return cudaErrorInvalidValue;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    (void)kind;
    cudaStreamSynchronize(0); /* the legacy stream only: the tests' streams are non-blocking */
    memcpy(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int v, size_t bytes)
{
    cudaStreamSynchronize(0);
    memset(dst, v, bytes);
    return cudaSuccess;
}

/* ---- streams ---- */

typedef struct item {
    gm_work_fn run;
    void *arg;
    void (*free_arg)(void *);
    struct item *next;
} item;

typedef struct stub_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *head, *tail;
    int busy;
    cudaError_t sticky;
    pthread_t thread;
    struct stub_stream *next_all;
} stub_stream;

static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;
static stub_stream *all_streams, *legacy;

static void *worker(void *arg)
{
    stub_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head)
            pthread_cond_wait(&s->cv, &s->mu);
        item *it = s->head;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        char err[512] = "";
        cudaError_t e = it->run(it->arg, err, sizeof err);
        if (it->free_arg)
            it->free_arg(it->arg);
        pthread_mutex_lock(&s->mu);
        if (e != cudaSuccess && s->sticky == cudaSuccess) {
            s->sticky = e;
            fprintf(stderr, "stub_cudart: stream work failed: %s\n", err);
        }
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        s->busy = 0;
        free(it);
        pthread_cond_broadcast(&s->cv);
    }
    return NULL;
}

static stub_stream *stream_new(void)
{
    stub_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_create(&s->thread, NULL, worker, s);
    pthread_detach(s->thread);
    pthread_mutex_lock(&all_mu);
    s->next_all = all_streams;
    all_streams = s;
    pthread_mutex_unlock(&all_mu);
    return s;
}

static stub_stream *resolve(cudaStream_t h)
{
    if (h && h != cudaStreamLegacy && h != cudaStreamPerThread)
        return (stub_stream *)h;
    pthread_mutex_lock(&all_mu);
    bool make = !legacy;
    pthread_mutex_unlock(&all_mu);
    if (make) {
        stub_stream *s = stream_new();
        pthread_mutex_lock(&all_mu);
        if (!legacy)
            legacy = s;
        pthread_mutex_unlock(&all_mu);
    }
    return legacy;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    (void)flags;
    stub_stream *s = stream_new();
    *out = (cudaStream_t)s;
    return s ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamCreate(cudaStream_t *out)
{
    return cudaStreamCreateWithFlags(out, 0);
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
    stub_stream *s = resolve(h);
    pthread_mutex_lock(&s->mu);
    while (s->head)
        pthread_cond_wait(&s->cv, &s->mu);
    cudaError_t e = s->sticky;
    pthread_mutex_unlock(&s->mu);
    return e;
}

cudaError_t cudaStreamQuery(cudaStream_t h)
{
    stub_stream *s = resolve(h);
    pthread_mutex_lock(&s->mu);
    cudaError_t e = s->sticky != cudaSuccess ? s->sticky : s->head ? cudaErrorNotReady : cudaSuccess;
    pthread_mutex_unlock(&s->mu);
    return e;
}

cudaError_t cudaStreamDestroy(cudaStream_t h)
{
    return cudaStreamSynchronize(h); /* the worker stays: a stub */
}

cudaError_t cudaDeviceSynchronize(void)
{
    pthread_mutex_lock(&all_mu);
    stub_stream *s = all_streams;
    pthread_mutex_unlock(&all_mu);
    cudaError_t e = cudaSuccess;
    for (; s; s = s->next_all) {
        cudaError_t x = cudaStreamSynchronize((cudaStream_t)s);
        if (e == cudaSuccess)
            e = x;
    }
    return e;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t h, enum cudaStreamCaptureStatus *st)
{
    (void)h;
    *st = cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t gm_enqueue(cudaStream_t h, const char *what, gm_work_fn run, void *arg, void (*free_arg)(void *arg))
{
    (void)what;
    stub_stream *s = resolve(h);
    item *it = calloc(1, sizeof *it);
    if (!it)
        return cudaErrorMemoryAllocation;
    *it = (item){run, arg, free_arg, NULL};
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

typedef struct copy_arg {
    void *dst;
    const void *src;
    size_t bytes;
} copy_arg;

static cudaError_t copy_run(void *arg, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    copy_arg *c = arg;
    memcpy(c->dst, c->src, c->bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t st)
{
    (void)kind;
    copy_arg *c = malloc(sizeof *c);
    if (!c)
        return cudaErrorMemoryAllocation;
    *c = (copy_arg){dst, src, bytes};
    cudaError_t e = gm_enqueue(st, "cudaMemcpyAsync", copy_run, c, free);
    if (e != cudaSuccess)
        free(c);
    return e;
}

/* ---- device, errors, perturbation, violations ---- */

static __thread int cur_device;

cudaError_t cudaGetDevice(int *d)
{
    *d = cur_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    cur_device = d;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : "stub_cudart error";
}

uint64_t gm_seed(void)
{
    const char *v = getenv("GM_SEED");
    return v ? strtoull(v, NULL, 10) : 1;
}

unsigned gm_delay_us(uint64_t site)
{
    const char *v = getenv("GM_DELAY_US");
    unsigned max = v ? (unsigned)strtoul(v, NULL, 10) : 200;
    if (!max)
        return 0;
    uint64_t x = site ^ (gm_seed() * 0x9e3779b97f4a7c15ULL);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (unsigned)(x % (max + 1));
}

static atomic_int nviolations;

void gm_violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gpumodel: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    atomic_fetch_add(&nviolations, 1);
}

int gm_violations(void)
{
    return atomic_load(&nviolations);
}

void gm_violations_reset(void)
{
    atomic_store(&nviolations, 0);
}
