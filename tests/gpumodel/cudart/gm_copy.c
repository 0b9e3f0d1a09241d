/*
 * gm_copy: cudaMemcpy*, cudaMemset* as stream work on tracked memory.
 *
 * Operands are classified at the call: device (device or managed memory),
 * pinned (cudaHostAlloc/cudaMallocHost) or pageable (anything the model did not
 * allocate; allowed only where CUDA takes host memory: the host side of a
 * copy, or either side of a cudaMemcpyDefault). A device-side operand outside
 * every live allocation, a host-side operand in device memory, a range that
 * runs past its allocation, freed memory and overlapping source and
 * destination are violations that fail the call with cudaErrorInvalidValue.
 *
 * Host synchronization follows CUDA's documented behaviour (see gm_mem.c); the
 * copy itself always runs on the stream's worker.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "gm_internal.h"

enum { OP_PAGEABLE, OP_PINNED, OP_DEVICE };

typedef struct gm_copy {
    void *dst;
    const void *src;
    size_t n;
    int check_dst, check_src;  /* tracked operands, checked again at run */
    void *staged;              /* owned copy of a pageable source */
    int is_set, value;
    char what[GM_WHAT];
} gm_copy;

static cudaError_t copy_run(void *p, char *err, size_t len)
{
    gm_copy *c = p;
    cudaError_t e;
    if ((c->check_dst && (e = gm_check_range(c->dst, c->n, c->what, err, len)) != cudaSuccess) ||
        (c->check_src && (e = gm_check_range(c->src, c->n, c->what, err, len)) != cudaSuccess)) {
        gm_violation("device work on memory it may not touch: %s", err);
        return cudaErrorIllegalAddress;
    }
    if (c->is_set)
        memset(c->dst, c->value, c->n);
    else
        memcpy(c->dst, c->staged ? c->staged : c->src, c->n);
    return cudaSuccess;
}

static void copy_free(void *p)
{
    gm_copy *c = p;
    free(c->staged);
    free(c);
}

/* Classifies operand p of n bytes; `side` is 'd' (device side), 'h' (host
 * side) or 'a' (cudaMemcpyDefault: either). */
static cudaError_t classify(const char *call, const char *role, const void *p, size_t n, char side, int *cls)
{
    int dev;
    gm_mem_kind k = gm_mem_kind_of(p, &dev);
    char err[512];
    if (k == GM_MEM_NONE) {
        cudaError_t e = gm_check_range(p, n, role, err, sizeof err);
        if (e == cudaErrorIllegalAddress || side == 'd') {
            gm_violation("%s: %s", call, err);
            return cudaErrorInvalidValue;
        }
        *cls = OP_PAGEABLE;
        return cudaSuccess;
    }
    if (gm_check_range(p, n, role, err, sizeof err) != cudaSuccess) {
        gm_violation("%s: %s", call, err);
        return cudaErrorInvalidValue;
    }
    if (side == 'h' && k == GM_MEM_DEVICE) {
        gm_violation("%s: the %s %p is device memory, but the copy's kind says host memory", call, role, p);
        return cudaErrorInvalidValue;
    }
    *cls = k == GM_MEM_HOST ? OP_PINNED : OP_DEVICE;
    return cudaSuccess;
}

static cudaError_t sides(enum cudaMemcpyKind kind, char *dst, char *src)
{
    switch (kind) {
    case cudaMemcpyHostToHost: *dst = 'h', *src = 'h'; return cudaSuccess;
    case cudaMemcpyHostToDevice: *dst = 'd', *src = 'h'; return cudaSuccess;
    case cudaMemcpyDeviceToHost: *dst = 'h', *src = 'd'; return cudaSuccess;
    case cudaMemcpyDeviceToDevice: *dst = 'd', *src = 'd'; return cudaSuccess;
    case cudaMemcpyDefault: *dst = 'a', *src = 'a'; return cudaSuccess;
    default: return cudaErrorInvalidMemcpyDirection;
    }
}

/* Submits c to stream sh: staged when `stage` (not while capturing), after a
 * sync of the stream when `presync`, waited for when `wait`; `sync_api`: the
 * call is a synchronous one (prohibited during a global capture). */
static cudaError_t submit_op(cudaStream_t sh, gm_copy *c, int stage, int presync, int wait, int sync_api,
                             const char *call)
{
    if (stage) {
        c->staged = malloc(c->n);
        if (!c->staged) {
            copy_free(c);
            return gm_ret(cudaErrorMemoryAllocation);
        }
        memcpy(c->staged, c->src, c->n);
    }
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = sync_api ? gm_capture_prohibited_locked(call) : cudaSuccess;
    if (e == cudaSuccess)
        e = gm_stream_resolve_locked(sh, &s);
    if (e == cudaSuccess)
        e = gm_sticky_locked(s->device);
    if (e == cudaSuccess && s->cap) {
        free(c->staged);
        c->staged = NULL;
        e = gm_capture_add_locked(s, c->what, copy_run, c, copy_free);
        c = e == cudaSuccess ? NULL : c;
    } else if (e == cudaSuccess && (e = gm_capture_check_legacy_locked(s, call)) == cudaSuccess) {
        if (presync)
            gm_stream_sync_locked(s);
        uint64_t seq = 0;
        e = gm_submit_locked(s, c->what, copy_run, c, copy_free, NULL, 0, &seq);
        if (e == cudaSuccess) {
            c = NULL;
            if (wait) {
                gm_wait_seq_locked(s, seq);
                e = gm_sticky_locked(s->device);
            }
        }
    }
    pthread_mutex_unlock(&gm_g.mu);
    if (c)
        copy_free(c);
    return gm_ret(e);
}

static cudaError_t memcpy_common(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t sh,
                                 int sync_api, const char *call)
{
    gm_init();
    char ds, ss;
    if (sides(kind, &ds, &ss) != cudaSuccess)
        return gm_fail(cudaErrorInvalidMemcpyDirection, "%s: %d is not a cudaMemcpyKind", call, (int)kind);
    if (n == 0)
        return cudaSuccess;
    if (!dst || !src)
        return gm_fail(cudaErrorInvalidValue, "%s: a null pointer (dst %p, src %p, %zu bytes)", call, dst, src, n);
    int dc, sc;
    cudaError_t e = classify(call, "destination", dst, n, ds, &dc);
    if (e == cudaSuccess)
        e = classify(call, "source", src, n, ss, &sc);
    if (e != cudaSuccess)
        return gm_ret(e);
    if ((const char *)dst < (const char *)src + n && (const char *)src < (const char *)dst + n)
        return gm_fail(cudaErrorInvalidValue, "%s: source [%p, +%zu) and destination [%p, +%zu) overlap", call,
                       src, n, dst, n);
    gm_copy *c = calloc(1, sizeof *c);
    if (!c)
        return gm_ret(cudaErrorMemoryAllocation);
    c->dst = dst, c->src = src, c->n = n;
    c->check_dst = dc != OP_PAGEABLE, c->check_src = sc != OP_PAGEABLE;
    snprintf(c->what, sizeof c->what, "%s(%p <- %p, %zu bytes)", call, dst, src, n);
    int from_pageable = sc == OP_PAGEABLE, to_host = dc != OP_DEVICE, from_host = sc != OP_DEVICE;
    int stage = from_pageable && !to_host;
    int wait, presync = 0;
    if (sync_api) {
        presync = stage;
        wait = !stage && !(dc == OP_DEVICE && sc == OP_DEVICE);
    } else {
        wait = dc == OP_PAGEABLE || (from_host && to_host);
    }
    return submit_op(sh, c, stage, presync, wait, sync_api, call);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return memcpy_common(dst, src, n, kind, cudaStreamLegacy, 1, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
    return memcpy_common(dst, src, n, kind, s, 0, "cudaMemcpyAsync");
}

static cudaError_t memset_common(void *p, int value, size_t n, cudaStream_t sh, int sync_api, const char *call)
{
    gm_init();
    if (n == 0)
        return cudaSuccess;
    int cls;
    cudaError_t e = classify(call, "destination", p, n, 'd', &cls);
    if (e != cudaSuccess)
        return gm_ret(e);
    gm_copy *c = calloc(1, sizeof *c);
    if (!c)
        return gm_ret(cudaErrorMemoryAllocation);
    c->dst = p, c->n = n, c->is_set = 1, c->value = value, c->check_dst = 1;
    snprintf(c->what, sizeof c->what, "%s(%p, %d, %zu bytes)", call, p, value, n);
    return submit_op(sh, c, 0, 0, sync_api && cls == OP_PINNED, sync_api, call);
}

cudaError_t cudaMemset(void *p, int value, size_t n)
{
    return memset_common(p, value, n, cudaStreamLegacy, 1, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s)
{
    return memset_common(p, value, n, s, 0, "cudaMemsetAsync");
}
