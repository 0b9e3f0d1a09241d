/*
 * gm_mem: device, managed and pinned host memory as tracked host mappings,
 * and the copies and fills that touch them.
 *
 * Every allocation is its own mmap: the pointer handed out is 256-byte aligned
 * and ends as close to a PROT_NONE guard page as its alignment allows; fresh
 * memory is filled with 0xFF bytes (a NaN in fp32, bf16 and fp16), as CUDA
 * does not zero cudaMalloc, cudaMallocManaged or cudaHostAlloc memory (beyond
 * 1 GiB only the first and last 64 MiB). The live allocations may take at most
 * half of the host's memory (then cudaErrorMemoryAllocation, with a note).
 * A freed allocation stays mapped PROT_NONE (its pages released) in a
 * quarantine of the last GM_QUARANTINE frees, so its addresses are not reused
 * and a later use is reported as use of freed memory.
 *
 * Copies follow CUDA's documented host synchronization: a copy from pageable
 * host memory is staged at the call; a copy to pageable host memory returns
 * when done; cudaMemcpy device-to-device and cudaMemset of device memory
 * return before the work ran. Every operand of device work is checked to lie
 * in one live allocation, at the call and again when the work runs (a graph
 * may run after a free).
 *
 * Invariants: recs is sorted by p and its ranges never overlap; gm_mem_mu is
 * never held while gm_g.mu is taken.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gm_internal.h"

#define GM_QUARANTINE 2048
#define GM_DEVICE_BYTES ((size_t)80 << 30)

typedef struct gm_rec {
    char *p;            /* the pointer handed out */
    size_t size;        /* bytes asked for */
    char *map;          /* the mapping, guard page included */
    size_t maplen;
    gm_mem_kind kind;
    int device;
    int live;
    int nccl;           /* from gm_alloc_nccl */
    unsigned long long freed_at;
} gm_rec;

static pthread_mutex_t gm_mem_mu = PTHREAD_MUTEX_INITIALIZER;
static gm_rec *recs;
static size_t nrecs, caprecs, nfreed;
static unsigned long long free_clock;
static size_t device_bytes[GM_MAX_DEVICES];
static size_t live_bytes; /* every live allocation, host memory it takes */

/* The model's memory is this host's: at most half of it. */
static size_t host_limit(size_t page)
{
    long pages = sysconf(_SC_PHYS_PAGES);
    return pages > 0 ? (size_t)pages * page / 2 : (size_t)-1;
}

/* Fresh memory is not zero: 0xFF bytes, all of it up to GM_POISON_ALL; of a
 * larger allocation its first and last GM_POISON_EDGE bytes (touching every
 * page of a huge buffer would cost its size in host memory at once). */
#define GM_POISON_ALL ((size_t)1 << 30)
#define GM_POISON_EDGE ((size_t)64 << 20)

static void poison(char *p, size_t bytes)
{
    if (bytes <= GM_POISON_ALL) {
        memset(p, 0xFF, bytes);
        return;
    }
    memset(p, 0xFF, GM_POISON_EDGE);
    memset(p + bytes - GM_POISON_EDGE, 0xFF, GM_POISON_EDGE);
}

void gm_mem_after_fork(void)
{
    pthread_mutex_init(&gm_mem_mu, NULL);
}

static const char *kind_name(gm_mem_kind k)
{
    switch (k) {
    case GM_MEM_DEVICE: return "device";
    case GM_MEM_HOST: return "pinned host";
    case GM_MEM_MANAGED: return "managed";
    default: return "pageable host";
    }
}

/* Index of the last record whose p <= x, or -1. */
static long find_le(const void *x)
{
    long lo = 0, hi = (long)nrecs - 1, r = -1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        if ((const char *)recs[mid].p <= (const char *)x)
            r = mid, lo = mid + 1;
        else
            hi = mid - 1;
    }
    return r;
}

static gm_rec *find_containing(const void *x)
{
    long i = find_le(x);
    if (i < 0)
        return NULL;
    gm_rec *r = &recs[i];
    size_t span = r->size ? r->size : 1;
    return (const char *)x < r->p + span ? r : NULL;
}

static void evict_oldest_freed(void)
{
    size_t oldest = nrecs;
    for (size_t i = 0; i < nrecs; i++)
        if (!recs[i].live && (oldest == nrecs || recs[i].freed_at < recs[oldest].freed_at))
            oldest = i;
    if (oldest == nrecs)
        return;
    munmap(recs[oldest].map, recs[oldest].maplen);
    memmove(&recs[oldest], &recs[oldest + 1], (nrecs - oldest - 1) * sizeof *recs);
    nrecs--;
    nfreed--;
}

static cudaError_t insert_rec(const gm_rec *r)
{
    if (nrecs == caprecs) {
        size_t ncap = caprecs ? caprecs * 2 : 256;
        gm_rec *n = realloc(recs, ncap * sizeof *n);
        if (!n)
            return cudaErrorMemoryAllocation;
        recs = n;
        caprecs = ncap;
    }
    long i = find_le(r->p) + 1;
    memmove(&recs[i + 1], &recs[i], (nrecs - (size_t)i) * sizeof *recs);
    recs[i] = *r;
    nrecs++;
    return cudaSuccess;
}

static cudaError_t alloc_tracked(void **out, size_t bytes, gm_mem_kind kind, int nccl)
{
    *out = NULL;
    if (bytes == 0)
        return cudaSuccess;
    int dev = gm_thread()->device;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (bytes + page - 1) / page * page;
    size_t maplen = body + page;
    pthread_mutex_lock(&gm_mem_mu);
    if ((kind != GM_MEM_HOST && device_bytes[dev] + bytes > GM_DEVICE_BYTES) ||
        live_bytes + bytes > host_limit(page)) {
        pthread_mutex_unlock(&gm_mem_mu);
        if (live_bytes + bytes > host_limit(page))
            gm_note("an allocation of %zu bytes would take the model past half of this host's memory "
                    "(%zu bytes live); refused with cudaErrorMemoryAllocation",
                    bytes, live_bytes);
        return cudaErrorMemoryAllocation;
    }
    char *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        pthread_mutex_unlock(&gm_mem_mu);
        return cudaErrorMemoryAllocation;
    }
    mprotect(map + body, page, PROT_NONE);
    gm_rec r = {.p = map + body - (bytes + 255) / 256 * 256, .size = bytes, .map = map, .maplen = maplen,
                .kind = kind, .device = dev, .live = 1, .nccl = nccl};
    poison(r.p, bytes);
    if (insert_rec(&r) != cudaSuccess) {
        munmap(map, maplen);
        pthread_mutex_unlock(&gm_mem_mu);
        return cudaErrorMemoryAllocation;
    }
    if (kind != GM_MEM_HOST)
        device_bytes[dev] += bytes;
    live_bytes += bytes;
    pthread_mutex_unlock(&gm_mem_mu);
    *out = r.p;
    return cudaSuccess;
}

/* Frees what alloc_tracked gave for `call` (which takes `kinds`, a bit mask of
 * 1 << gm_mem_kind); the device was synchronized by the caller. */
static cudaError_t free_tracked(void *p, unsigned kinds, int nccl, const char *call)
{
    pthread_mutex_lock(&gm_mem_mu);
    gm_rec *r = find_containing(p);
    cudaError_t e = cudaSuccess;
    if (!r) {
        gm_violation("%s(%p): not a pointer the model allocated", call, p);
        e = cudaErrorInvalidValue;
    } else if (!r->live) {
        gm_violation("%s(%p): already freed (a double free)", call, p);
        e = cudaErrorInvalidValue;
    } else if (r->p != (char *)p) {
        gm_violation("%s(%p): points %zu bytes into a %zu-byte allocation, not at its start", call, p,
                     (size_t)((char *)p - r->p), r->size);
        e = cudaErrorInvalidValue;
    } else if (!(kinds & (1u << r->kind)) || r->nccl != nccl) {
        gm_violation("%s(%p): the memory is %s memory%s", call, p, kind_name(r->kind),
                     r->nccl ? " from ncclMemAlloc" : "");
        e = cudaErrorInvalidValue;
    }
    if (e == cudaSuccess) {
        madvise(r->map, r->maplen, MADV_DONTNEED);
        mprotect(r->map, r->maplen, PROT_NONE);
        r->live = 0;
        r->freed_at = ++free_clock;
        if (r->kind != GM_MEM_HOST)
            device_bytes[r->device] -= r->size;
        live_bytes -= r->size;
        if (++nfreed > GM_QUARANTINE)
            evict_oldest_freed();
    }
    pthread_mutex_unlock(&gm_mem_mu);
    return e;
}

static void describe_nearest(const void *p, char *buf, size_t len)
{
    long i = find_le(p);
    if (i < 0 && nrecs)
        i = 0;
    if (i < 0) {
        snprintf(buf, len, "no allocation exists");
        return;
    }
    const gm_rec *r = &recs[i];
    snprintf(buf, len, "nearest: %s%s allocation [%p, +%zu)", r->live ? "" : "freed ", kind_name(r->kind),
             (void *)r->p, r->size);
}

cudaError_t gm_check_range(const void *p, size_t bytes, const char *what, char *err, size_t errlen)
{
    if (bytes == 0)
        return cudaSuccess;
    char near[160];
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&gm_mem_mu);
    gm_rec *r = find_containing(p);
    if (r && !r->live) {
        snprintf(err, errlen, "%s: %p is in freed %s memory [%p, +%zu)", what, p, kind_name(r->kind),
                 (void *)r->p, r->size);
        e = cudaErrorIllegalAddress;
    } else if (!r) {
        describe_nearest(p, near, sizeof near);
        snprintf(err, errlen, "%s: [%p, +%zu) is not inside any allocation (%s)", what, p, bytes, near);
        e = cudaErrorInvalidValue;
    } else if ((size_t)((const char *)p - r->p) + bytes > r->size) {
        snprintf(err, errlen, "%s: [%p, +%zu) runs %zu bytes past the end of %s allocation [%p, +%zu)", what, p,
                 bytes, (size_t)((const char *)p - r->p) + bytes - r->size, kind_name(r->kind), (void *)r->p,
                 r->size);
        e = cudaErrorInvalidValue;
    }
    pthread_mutex_unlock(&gm_mem_mu);
    return e;
}

gm_mem_kind gm_mem_kind_of(const void *p, int *device)
{
    pthread_mutex_lock(&gm_mem_mu);
    gm_rec *r = find_containing(p);
    gm_mem_kind k = r && r->live ? r->kind : GM_MEM_NONE;
    if (device)
        *device = r && r->live ? r->device : cudaInvalidDeviceId;
    pthread_mutex_unlock(&gm_mem_mu);
    return k;
}

/* ---- allocation API ---- */

static cudaError_t unsafe_during_capture(const char *call)
{
    pthread_mutex_lock(&gm_g.mu);
    cudaError_t e = gm_capture_prohibited_locked(call);
    if (e == cudaSuccess)
        e = gm_sticky_locked(gm_thread()->device);
    pthread_mutex_unlock(&gm_g.mu);
    return e;
}

static cudaError_t alloc_api(void **p, size_t bytes, gm_mem_kind kind, const char *call)
{
    gm_init();
    if (!p)
        return gm_ret(cudaErrorInvalidValue);
    if (gm_g.no_device)
        return gm_ret(cudaErrorNoDevice);
    cudaError_t e = unsafe_during_capture(call);
    if (e == cudaSuccess)
        e = alloc_tracked(p, bytes, kind, 0);
    return gm_ret(e);
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    return alloc_api(p, bytes, GM_MEM_DEVICE, "cudaMalloc");
}

cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned int flags)
{
    if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost)
        return gm_ret(cudaErrorInvalidValue);
    return alloc_api(p, bytes, GM_MEM_MANAGED, "cudaMallocManaged");
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    return alloc_api(p, bytes, GM_MEM_HOST, "cudaMallocHost");
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags)
{
    unsigned ok = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
    if (flags & ~ok)
        return gm_ret(cudaErrorInvalidValue);
    return alloc_api(p, bytes, GM_MEM_HOST, "cudaHostAlloc");
}

/* cudaFree and cudaFreeHost synchronize the device before they free. */
static cudaError_t free_api(void *p, unsigned kinds, int nccl, const char *call)
{
    gm_init();
    if (!p)
        return cudaSuccess;
    cudaError_t e = unsafe_during_capture(call);
    if (e != cudaSuccess)
        return gm_ret(e);
    int dev = cudaInvalidDeviceId;
    gm_mem_kind_of(p, &dev);
    pthread_mutex_lock(&gm_g.mu);
    gm_device_sync_locked(gm_thread()->device);
    if (dev >= 0 && dev != gm_thread()->device)
        gm_device_sync_locked(dev);
    pthread_mutex_unlock(&gm_g.mu);
    return gm_ret(free_tracked(p, kinds, nccl, call));
}

cudaError_t cudaFree(void *p)
{
    return free_api(p, 1u << GM_MEM_DEVICE | 1u << GM_MEM_MANAGED, 0, "cudaFree");
}

cudaError_t cudaFreeHost(void *p)
{
    return free_api(p, 1u << GM_MEM_HOST, 0, "cudaFreeHost");
}

cudaError_t gm_alloc_nccl(void **p, size_t bytes)
{
    gm_init();
    if (!p)
        return cudaErrorInvalidValue;
    return alloc_tracked(p, bytes, GM_MEM_DEVICE, 1);
}

cudaError_t gm_free_nccl(void *p)
{
    return free_api(p, 1u << GM_MEM_DEVICE, 1, "ncclMemFree");
}

cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int flags)
{
    gm_init();
    if (!d || flags != 0)
        return gm_ret(cudaErrorInvalidValue);
    if (gm_mem_kind_of(h, NULL) != GM_MEM_HOST)
        return gm_fail(cudaErrorInvalidValue, "cudaHostGetDevicePointer(%p): not pinned host memory", h);
    *d = h; /* unified addressing: the device sees the host address */
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    gm_init();
    if (!a)
        return gm_ret(cudaErrorInvalidValue);
    int dev;
    gm_mem_kind k = gm_mem_kind_of(p, &dev);
    memset(a, 0, sizeof *a);
    a->device = dev;
    switch (k) {
    case GM_MEM_DEVICE: a->type = cudaMemoryTypeDevice; a->devicePointer = (void *)p; break;
    case GM_MEM_HOST: a->type = cudaMemoryTypeHost; a->devicePointer = a->hostPointer = (void *)p; break;
    case GM_MEM_MANAGED: a->type = cudaMemoryTypeManaged; a->devicePointer = a->hostPointer = (void *)p; break;
    default: a->type = cudaMemoryTypeUnregistered; break;
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    gm_init();
    if (!free_bytes || !total_bytes)
        return gm_ret(cudaErrorInvalidValue);
    if (gm_g.no_device)
        return gm_ret(cudaErrorNoDevice);
    pthread_mutex_lock(&gm_mem_mu);
    *total_bytes = GM_DEVICE_BYTES;
    *free_bytes = GM_DEVICE_BYTES - device_bytes[gm_thread()->device];
    pthread_mutex_unlock(&gm_mem_mu);
    return cudaSuccess;
}
