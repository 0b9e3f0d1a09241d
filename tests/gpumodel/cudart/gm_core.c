/*
 * gm_core: the model's process state and the device-level API -- the knobs
 * read from the environment once (GM_DEVICES, GM_NO_DEVICE, GM_SEED,
 * GM_DELAY_US, GM_DROP_WAIT, GM_DROP_WAIT_PER_THREAD, GM_STRICT,
 * GM_NO_CONCURRENT_MANAGED), the current
 * device and last error of each host thread, the devices' properties (an H100
 * SXM), error names, and the violation count reported at exit.
 *
 * Invariants: gm_init runs once before any other state is touched (every
 * entry point calls it); the violation count is atomic; a sticky error of a
 * device is returned by cudaGetLastError/PeekAtLastError without being
 * cleared, as a faulted context's is.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gm_internal.h"

gm_state gm_g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t gm_once = PTHREAD_ONCE_INIT;
static atomic_int gm_nviolations;
static int gm_strict;
static int gm_no_concurrent_managed;
static __thread gm_tls gm_tls_state = {.mode = cudaStreamCaptureModeGlobal};

static long env_long(const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end = NULL;
    long x = strtol(v, &end, 0);
    if (*end || x < lo || x > hi) {
        fprintf(stderr, "gpumodel: %s='%s' is not an integer in [%ld, %ld]; using %ld\n", name, v, lo, hi,
                dflt);
        return dflt;
    }
    return x;
}

static void gm_report_at_exit(void)
{
    int n = atomic_load(&gm_nviolations);
    if (n == 0)
        return;
    fprintf(stderr, "gpumodel: %d violation%s of CUDA's rules in this process\n", n, n == 1 ? "" : "s");
    if (gm_strict) {
        fflush(NULL);
        _exit(3);
    }
}

static void gm_init_once(void)
{
    gm_g.ndevices = (int)env_long("GM_DEVICES", 1, 1, GM_MAX_DEVICES);
    gm_g.no_device = env_long("GM_NO_DEVICE", 0, 0, 1) == 1;
    gm_g.seed = (uint64_t)env_long("GM_SEED", 1, 0, 0x7fffffffL);
    gm_g.delay_us = (unsigned)env_long("GM_DELAY_US", 200, 0, 1000000);
    gm_g.drop_wait = env_long("GM_DROP_WAIT", 0, 0, 0x7fffffffL);
    gm_g.drop_per_thread = env_long("GM_DROP_WAIT_PER_THREAD", 0, 0, 1) == 1;
    gm_strict = env_long("GM_STRICT", 0, 0, 1) == 1;
    gm_no_concurrent_managed = env_long("GM_NO_CONCURRENT_MANAGED", 0, 0, 1) == 1;
    gm_g.next_capture_id = 1;
    gm_stream_atfork();
    atexit(gm_report_at_exit);
}

void gm_init(void)
{
    pthread_once(&gm_once, gm_init_once);
}

gm_tls *gm_thread(void)
{
    return &gm_tls_state;
}

uint64_t gm_hash(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t gm_seed(void)
{
    gm_init();
    return gm_g.seed;
}

unsigned gm_delay_us(uint64_t site)
{
    gm_init();
    if (gm_g.delay_us == 0)
        return 0;
    return (unsigned)(gm_hash(gm_hash(gm_g.seed) ^ site) % (gm_g.delay_us + 1u));
}

void gm_violation(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&gm_nviolations, 1);
    fprintf(stderr, "gpumodel: %s\n", buf);
}

int gm_violations(void)
{
    return atomic_load(&gm_nviolations);
}

void gm_violations_reset(void)
{
    atomic_store(&gm_nviolations, 0);
}

void gm_note(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpumodel: note: %s\n", buf);
}

cudaError_t gm_ret(cudaError_t e)
{
    if (e != cudaSuccess)
        gm_tls_state.last = e;
    return e;
}

cudaError_t gm_fail(cudaError_t e, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    gm_violation("%s", buf);
    return gm_ret(e);
}

int gm_current_device(void)
{
    gm_init();
    return gm_tls_state.device;
}

int gm_device_count(void)
{
    gm_init();
    return gm_g.no_device ? 0 : gm_g.ndevices;
}

static cudaError_t check_device(int device)
{
    if (gm_g.no_device)
        return cudaErrorNoDevice;
    if (device < 0 || device >= gm_g.ndevices)
        return cudaErrorInvalidDevice;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    gm_init();
    if (!count)
        return gm_ret(cudaErrorInvalidValue);
    *count = 0;
    if (gm_g.no_device)
        return gm_ret(cudaErrorNoDevice);
    *count = gm_g.ndevices;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    gm_init();
    if (!device)
        return gm_ret(cudaErrorInvalidValue);
    if (gm_g.no_device)
        return gm_ret(cudaErrorNoDevice);
    *device = gm_tls_state.device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    gm_init();
    cudaError_t e = check_device(device);
    if (e != cudaSuccess)
        return gm_ret(e);
    gm_tls_state.device = device;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return gm_ret(cudaErrorInvalidValue);
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return gm_ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    gm_init();
    if (!p)
        return gm_ret(cudaErrorInvalidValue);
    cudaError_t e = check_device(device);
    if (e != cudaSuccess)
        return gm_ret(e);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (gpumodel)");
    for (int i = 0; i < 16; i++)
        p->uuid.bytes[i] = (char)(0x40 + device + i);
    p->totalGlobalMem = (size_t)80 << 30;
    p->sharedMemPerBlock = 48 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9, p->minor = 0;
    p->textureAlignment = 512, p->texturePitchAlignment = 32;
    p->multiProcessorCount = 132;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->ECCEnabled = 1;
    p->pciBusID = 0x18 + device;
    p->asyncEngineCount = 3;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 << 20;
    p->persistingL2CacheMaxSize = 30 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1, p->localL1CacheSupported = 1;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->concurrentManagedAccess = gm_no_concurrent_managed ? 0 : 1;
    p->computePreemptionSupported = 1;
    p->cooperativeLaunch = 1;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->maxBlocksPerMultiProcessor = 32;
    p->memoryPoolsSupported = 1;
    p->hostRegisterSupported = 1;
    p->deviceNumaId = -1, p->hostNumaId = -1;
    return cudaSuccess;
}

static int attribute_value(enum cudaDeviceAttr a, int *known)
{
    *known = 1;
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: return 1024;
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY: return 1024;
    case cudaDevAttrMaxBlockDimZ: return 64;
    case cudaDevAttrMaxGridDimX: return 2147483647;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: return 65535;
    case cudaDevAttrMaxSharedMemoryPerBlock: return 48 << 10;
    case cudaDevAttrWarpSize: return 32;
    case cudaDevAttrClockRate: return 1980000;
    case cudaDevAttrMemoryClockRate: return 2619000;
    case cudaDevAttrGlobalMemoryBusWidth: return 5120;
    case cudaDevAttrL2CacheSize: return 50 << 20;
    case cudaDevAttrMultiProcessorCount: return 132;
    case cudaDevAttrComputeCapabilityMajor: return 9;
    case cudaDevAttrComputeCapabilityMinor: return 0;
    case cudaDevAttrUnifiedAddressing: return 1;
    case cudaDevAttrCanMapHostMemory: return 1;
    case cudaDevAttrManagedMemory: return 1;
    case cudaDevAttrConcurrentManagedAccess: return gm_no_concurrent_managed ? 0 : 1;
    case cudaDevAttrConcurrentKernels: return 1;
    case cudaDevAttrAsyncEngineCount: return 3;
    case cudaDevAttrStreamPrioritiesSupported: return 1;
    case cudaDevAttrMaxThreadsPerMultiProcessor: return 2048;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: return 228 << 10;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: return 227 << 10;
    case cudaDevAttrPageableMemoryAccess: return 0;
    case cudaDevAttrIntegrated: return 0;
    case cudaDevAttrEccEnabled: return 1;
    case cudaDevAttrMemoryPoolsSupported: return 1;
    case cudaDevAttrCooperativeLaunch: return 1;
    default: *known = 0; return 0;
    }
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    gm_init();
    if (!value)
        return gm_ret(cudaErrorInvalidValue);
    cudaError_t e = check_device(device);
    if (e != cudaSuccess)
        return gm_ret(e);
    int known;
    *value = attribute_value(attr, &known);
    if (!known)
        gm_note("cudaDeviceGetAttribute: attribute %d is not modelled; 0 returned", (int)attr);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    gm_init();
    cudaError_t e = gm_tls_state.last;
    gm_tls_state.last = cudaSuccess;
    cudaError_t st = __atomic_load_n(&gm_g.sticky[gm_tls_state.device], __ATOMIC_ACQUIRE);
    return st != cudaSuccess ? st : e;
}

cudaError_t cudaPeekAtLastError(void)
{
    gm_init();
    cudaError_t st = __atomic_load_n(&gm_g.sticky[gm_tls_state.device], __ATOMIC_ACQUIRE);
    return st != cudaSuccess ? st : gm_tls_state.last;
}

#define GM_ERRORS(X)                                                                              \
    X(cudaSuccess, "no error")                                                                    \
    X(cudaErrorInvalidValue, "invalid argument")                                                  \
    X(cudaErrorMemoryAllocation, "out of memory")                                                 \
    X(cudaErrorInitializationError, "initialization error")                                       \
    X(cudaErrorInvalidConfiguration, "invalid configuration argument")                            \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                           \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                                    \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                       \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                    \
    X(cudaErrorInvalidDeviceFunction, "invalid device function")                                  \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                  \
    X(cudaErrorIllegalState, "the operation cannot be performed in the present state")            \
    X(cudaErrorNotReady, "device not ready")                                                      \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")                        \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                                       \
    X(cudaErrorNotSupported, "operation not supported")                                           \
    X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing")      \
    X(cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture") \
    X(cudaErrorStreamCaptureMerge, "operation would result in a merge of separate capture sequences") \
    X(cudaErrorStreamCaptureUnmatched, "capture was not ended in the same stream as it began")    \
    X(cudaErrorStreamCaptureUnjoined, "capturing stream has unjoined work")                       \
    X(cudaErrorStreamCaptureIsolation, "dependency created on uncaptured work in another stream") \
    X(cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a capturing blocking stream") \
    X(cudaErrorCapturedEvent, "operation not permitted on an event last recorded in a capturing stream") \
    X(cudaErrorStreamCaptureWrongThread, "attempt to terminate a thread-local capture sequence from another thread") \
    X(cudaErrorGraphExecUpdateFailure, "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update") \
    X(cudaErrorUnknown, "unknown error")

const char *cudaGetErrorName(cudaError_t e)
{
#define X(code, text)                                                                             \
    if (e == code)                                                                                \
        return #code;
    GM_ERRORS(X)
#undef X
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
#define X(code, text)                                                                             \
    if (e == code)                                                                                \
        return text;
    GM_ERRORS(X)
#undef X
    return "unrecognized error code";
}

double gm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define GM_TOMB ((const void *)1)

static size_t set_slot(const void *p, size_t cap)
{
    return (size_t)gm_hash((uint64_t)(uintptr_t)p) & (cap - 1);
}

static void set_grow(gm_set *set)
{
    size_t ncap = set->cap ? set->cap * 2 : 64;
    const void **nv = calloc(ncap, sizeof *nv);
    if (!nv) {
        fprintf(stderr, "gpumodel: out of host memory for a handle set\n");
        abort();
    }
    for (size_t i = 0; i < set->cap; i++) {
        const void *p = set->v[i];
        if (!p || p == GM_TOMB)
            continue;
        size_t j = set_slot(p, ncap);
        while (nv[j])
            j = (j + 1) & (ncap - 1);
        nv[j] = p;
    }
    free(set->v);
    set->v = nv;
    set->cap = ncap;
    set->used = set->n;
}

void gm_set_add(gm_set *set, const void *p)
{
    if ((set->used + 1) * 2 > set->cap)
        set_grow(set);
    size_t j = set_slot(p, set->cap);
    while (set->v[j] && set->v[j] != GM_TOMB)
        j = (j + 1) & (set->cap - 1);
    if (!set->v[j])
        set->used++;
    set->v[j] = p;
    set->n++;
}

int gm_set_has(const gm_set *set, const void *p)
{
    if (!set->cap || !p || p == GM_TOMB)
        return 0;
    size_t j = set_slot(p, set->cap);
    while (set->v[j]) {
        if (set->v[j] == p)
            return 1;
        j = (j + 1) & (set->cap - 1);
    }
    return 0;
}

void gm_set_del(gm_set *set, const void *p)
{
    if (!set->cap)
        return;
    size_t j = set_slot(p, set->cap);
    while (set->v[j]) {
        if (set->v[j] == p) {
            set->v[j] = GM_TOMB;
            set->n--;
            return;
        }
        j = (j + 1) & (set->cap - 1);
    }
}
