/*
 * gm_launch: kernels -- the registration nvcc's host stubs make at load time
 * (__cudaRegisterFatBinary, __cudaRegisterFunction: host stub -> device
 * name), the launch configuration stack of <<<...>>> (__cudaPush/Pop
 * CallConfiguration), and cudaLaunchKernel / __cudaLaunchKernel.
 *
 * A launch finds the kernel's host build by its key (the device name
 * demangled, namespaces and parameters dropped) through gm_kernels_find,
 * checks the launch configuration as CUDA does, copies the parameters (args
 * points at the caller's stack) into storage of its own, checks every memory
 * range the kernel declares with gm_check_range (at the launch and again when
 * it runs), and enqueues the run. Nothing runs at the call.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "gm_internal.h"

#define GM_MAX_RANGES 64

typedef struct gm_func {
    const void *host;          /* the host stub's address */
    const char *device_name;   /* mangled, as registered */
    char key[256];
    int looked;
    const gm_kernel *k;
} gm_func;

static pthread_mutex_t gm_func_mu = PTHREAD_MUTEX_INITIALIZER;
static gm_func *funcs;
static size_t nfuncs, capfuncs;

typedef struct gm_config {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
} gm_config;

static __thread gm_config config_stack[8];
static __thread int config_depth;

void gm_launch_after_fork(void)
{
    pthread_mutex_init(&gm_func_mu, NULL);
}

void **__cudaRegisterFatBinary(void *fatCubin)
{
    void **h = calloc(1, sizeof *h);
    if (h)
        *h = fatCubin;
    return h;
}

void __cudaRegisterFatBinaryEnd(void **handle)
{
    (void)handle;
}

void __cudaUnregisterFatBinary(void **handle)
{
    free(handle);
}

void __cudaRegisterFunction(void **handle, const char *hostFun, char *deviceFun, const char *deviceName,
                            int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
    (void)handle, (void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim, (void)wSize;
    pthread_mutex_lock(&gm_func_mu);
    if (nfuncs == capfuncs) {
        size_t ncap = capfuncs ? capfuncs * 2 : 64;
        gm_func *n = realloc(funcs, ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&gm_func_mu);
            fprintf(stderr, "gpumodel: out of host memory registering kernel %s\n", deviceName);
            return;
        }
        funcs = n;
        capfuncs = ncap;
    }
    gm_func *f = &funcs[nfuncs++];
    memset(f, 0, sizeof *f);
    f->host = hostFun;
    f->device_name = deviceName;
    pthread_mutex_unlock(&gm_func_mu);
}

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t smem, struct CUstream_st *stream)
{
    if (config_depth == 8)
        return 1;
    config_stack[config_depth++] = (gm_config){grid, block, smem, (cudaStream_t)stream};
    return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *smem, void *stream)
{
    if (config_depth == 0)
        return cudaErrorMissingConfiguration;
    gm_config c = config_stack[--config_depth];
    *grid = c.grid, *block = c.block, *smem = c.smem;
    *(cudaStream_t *)stream = c.stream;
    return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *hostFun)
{
    if (k)
        *k = (cudaKernel_t)hostFun; /* the stub itself names the kernel */
    return cudaSuccess;
}

static const gm_kernel *added[64];
static int nadded;

void gm_kernels_add(const gm_kernel *k)
{
    pthread_mutex_lock(&gm_func_mu);
    if (nadded < 64)
        added[nadded++] = k;
    pthread_mutex_unlock(&gm_func_mu);
}

static const gm_kernel *find_kernel(const char *key)
{
    for (int i = 0; i < nadded; i++)
        if (strcmp(added[i]->key, key) == 0)
            return added[i];
    return gm_kernels_find(key);
}

/* The registered function of a stub, its key and host build looked up once. */
static const gm_func *find_func(const void *host)
{
    pthread_mutex_lock(&gm_func_mu);
    gm_func *f = NULL;
    for (size_t i = 0; i < nfuncs && !f; i++)
        if (funcs[i].host == host)
            f = &funcs[i];
    if (f && !f->looked) {
        if (gm_demangle_key(f->device_name, f->key, sizeof f->key) != 0)
            snprintf(f->key, sizeof f->key, "%s", f->device_name);
        f->k = find_kernel(f->key);
        f->looked = 1;
    }
    pthread_mutex_unlock(&gm_func_mu);
    return f;
}

typedef struct gm_klaunch {
    const gm_kernel *k;
    dim3 grid, block;
    char what[GM_WHAT];
    void *argv[GM_KERNEL_MAX_ARGS];
    unsigned char *data;
} gm_klaunch;

static void klaunch_free(void *p)
{
    gm_klaunch *l = p;
    free(l->data);
    free(l);
}

static cudaError_t check_ranges(const gm_klaunch *l, char *err, size_t len)
{
    gm_range r[GM_MAX_RANGES];
    int n = l->k->ranges ? l->k->ranges((void **)l->argv, r, GM_MAX_RANGES) : 0;
    if (n > GM_MAX_RANGES) {
        snprintf(err, len, "%s: %d memory ranges, the model takes %d", l->what, n, GM_MAX_RANGES);
        return cudaErrorInvalidValue;
    }
    for (int i = 0; i < n; i++) {
        char role[GM_WHAT + 64];
        snprintf(role, sizeof role, "%s operand %d (%s)", l->what, i, r[i].writes ? "written" : "read");
        cudaError_t e = gm_check_range(r[i].p, r[i].bytes, role, err, len);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

static cudaError_t klaunch_run(void *p, char *err, size_t len)
{
    gm_klaunch *l = p;
    if (check_ranges(l, err, len) != cudaSuccess) {
        gm_violation("device work on memory it may not touch: %s", err);
        return cudaErrorIllegalAddress;
    }
    l->k->run((void **)l->argv, l->grid, l->block);
    return cudaSuccess;
}

static cudaError_t check_config(dim3 g, dim3 b, size_t smem)
{
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z)
        return cudaErrorInvalidConfiguration;
    if (b.x > 1024 || b.y > 1024 || b.z > 64 || (uint64_t)b.x * b.y * b.z > 1024)
        return cudaErrorInvalidConfiguration;
    if (g.x > 2147483647u || g.y > 65535 || g.z > 65535 || smem > (48u << 10))
        return cudaErrorInvalidConfiguration;
    return cudaSuccess;
}

static gm_klaunch *klaunch_new(const gm_func *f, dim3 grid, dim3 block, void **args)
{
    const gm_kernel *k = f->k;
    size_t total = 0;
    for (int i = 0; i < k->nargs; i++)
        total += (k->arg_size[i] + 15) / 16 * 16;
    gm_klaunch *l = calloc(1, sizeof *l);
    unsigned char *data = aligned_alloc(16, total ? total : 16);
    if (!l || !data) {
        free(l);
        free(data);
        return NULL;
    }
    size_t off = 0;
    for (int i = 0; i < k->nargs; i++) {
        memcpy(data + off, args[i], k->arg_size[i]);
        l->argv[i] = data + off;
        off += (k->arg_size[i] + 15) / 16 * 16;
    }
    l->k = k, l->grid = grid, l->block = block, l->data = data;
    snprintf(l->what, sizeof l->what, "kernel %s<<<(%u,%u,%u), (%u,%u,%u)>>>", f->key, grid.x, grid.y, grid.z,
             block.x, block.y, block.z);
    return l;
}

static cudaError_t enqueue_launch(gm_klaunch *l, cudaStream_t sh)
{
    pthread_mutex_lock(&gm_g.mu);
    gm_stream *s = NULL;
    cudaError_t e = gm_stream_resolve_locked(sh, &s);
    if (e == cudaSuccess)
        e = gm_sticky_locked(s->device);
    if (e == cudaSuccess && s->cap)
        e = gm_capture_add_locked(s, l->what, klaunch_run, l, klaunch_free);
    else if (e == cudaSuccess && (e = gm_capture_check_legacy_locked(s, l->what)) == cudaSuccess)
        e = gm_submit_locked(s, l->what, klaunch_run, l, klaunch_free, NULL, 0, NULL);
    pthread_mutex_unlock(&gm_g.mu);
    if (e != cudaSuccess)
        klaunch_free(l);
    return e;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem, cudaStream_t s)
{
    gm_init();
    if (gm_g.no_device)
        return gm_ret(cudaErrorNoDevice);
    const gm_func *f = find_func(func);
    if (!f)
        return gm_fail(cudaErrorInvalidDeviceFunction, "cudaLaunchKernel: %p is not a registered kernel", func);
    if (!f->k)
        return gm_fail(cudaErrorInvalidDeviceFunction, "cudaLaunchKernel: the model has no host build of kernel "
                       "'%s' (%s)", f->key, f->device_name);
    if (check_config(grid, block, smem) != cudaSuccess)
        return gm_fail(cudaErrorInvalidConfiguration, "%s: invalid launch configuration grid (%u,%u,%u) "
                       "block (%u,%u,%u) shared %zu bytes", f->key, grid.x, grid.y, grid.z, block.x, block.y,
                       block.z, smem);
    if (f->k->nargs < 0 || f->k->nargs > GM_KERNEL_MAX_ARGS || (f->k->nargs > 0 && !args))
        return gm_fail(cudaErrorInvalidValue, "%s: %d parameters (model limit %d) or no args", f->key,
                       f->k->nargs, GM_KERNEL_MAX_ARGS);
    gm_klaunch *l = klaunch_new(f, grid, block, args);
    if (!l)
        return gm_ret(cudaErrorMemoryAllocation);
    char err[512];
    if (check_ranges(l, err, sizeof err) != cudaSuccess) {
        klaunch_free(l);
        return gm_fail(cudaErrorInvalidValue, "cudaLaunchKernel: %s", err);
    }
    return gm_ret(enqueue_launch(l, s));
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t smem,
                               cudaStream_t s)
{
    return cudaLaunchKernel((const void *)kernel, grid, block, args, smem, s);
}
