/*
 * gm_model: the contract between the pieces of the CPU model of CUDA and NCCL
 * (tests/gpumodel/). The model is three parts, each its own folder:
 *
 *   cudart/   libcudart.so.13 (SONAME and symbol version libcudart.so.13): the
 *             CUDA runtime API the unchanged backends, tests and tools call --
 *             streams run by worker threads, events, tracked device memory,
 *             graph capture, pinned/mapped/managed memory, kernel launches;
 *   kernels/  the device kernels of runtime/backends/mf_cuda_kernels.cu built
 *             from the same source for the host, found by their device names;
 *   nccl/     libnccl.so.2: communicators of thread-ranks and of processes
 *             (shared memory), groups, collectives executed as stream work.
 *
 * Binaries built against the real CUDA and NCCL run on the model with
 * LD_LIBRARY_PATH=<build>/tests/gpumodel/lib (see tests/gpumodel/README.md).
 *
 * Everything here is exported by the model's libcudart.so.13 under the
 * GM_MODEL version node and is for the model's own parts (nccl/, kernels/,
 * the model's self-tests): a trainer never sees it.
 */
#ifndef GM_MODEL_H
#define GM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- stream work (cudart/) ---- */

/* A unit of device work run by a stream's worker thread. Returns cudaSuccess or
 * the error that the stream then reports as sticky (as a faulting kernel
 * would); `err` receives a message for the model's report. */
typedef cudaError_t (*gm_work_fn)(void *arg, char *err, size_t errlen);

/* Enqueues `run(arg)` on `s` (a stream, cudaStreamLegacy, cudaStreamPerThread
 * or 0) with CUDA's ordering: FIFO on the stream, the legacy default stream's
 * implicit synchronization, the perturbation's delays. When `s` is capturing,
 * the work becomes a graph node instead (run at each launch of the graph's
 * instance; `arg` then lives as long as the graph or instance). `free_arg`
 * (may be NULL) releases arg when nothing will run it again. `what` names the
 * work in reports ("ncclAllReduce on comm 0x..: rank 1 of 4"). */
cudaError_t gm_enqueue(cudaStream_t s, const char *what, gm_work_fn run, void *arg,
                       void (*free_arg)(void *arg));
/* On success the model owns arg (free_arg runs once nothing will run it
 * again); on an error nothing is enqueued and arg stays the caller's. Errors:
 * the device's sticky error, cudaErrorInvalidResourceHandle for a destroyed
 * or unknown stream (a violation), cudaErrorStreamCaptureInvalidated into an
 * invalidated capture, cudaErrorStreamCaptureImplicit for the legacy stream
 * while a blocking stream of the device captures. */

/* cudaSuccess when [p, p + bytes) lies inside one live allocation that device
 * work may touch (device, managed, mapped pinned host, ncclMemAlloc); else an
 * error (cudaErrorInvalidValue, or cudaErrorIllegalAddress for a freed one)
 * with a message naming `what`, the pointer and the nearest allocation. bytes
 * == 0 checks nothing. */
cudaError_t gm_check_range(const void *p, size_t bytes, const char *what, char *err, size_t errlen);

/* Allocation for the NCCL model's ncclMemAlloc/ncclMemFree: device memory of
 * the current device, tracked like cudaMalloc's, marked as NCCL's. */
cudaError_t gm_alloc_nccl(void **p, size_t bytes);
cudaError_t gm_free_nccl(void *p);

/* The perturbation seed of this process (GM_SEED, default 1) and a random
 * delay in microseconds drawn from it for a site (0 when GM_DELAY_US=0). */
uint64_t gm_seed(void);
unsigned gm_delay_us(uint64_t site);

/* A violation of CUDA's or NCCL's rules that the model detected: printed to
 * stderr as "gpumodel: <message>" and counted; with GM_STRICT=1 (set by
 * tests/gpumodel/run/model_run.sh and the self-tests; the model's default is
 * 0) the process exits 3 at the end with the count. */
void gm_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int gm_violations(void);
/* Sets the count back to 0 (a self-test that provokes a violation on purpose
 * observes it with gm_violations() and then resets it). */
void gm_violations_reset(void);

/* The calling host thread's current device (cudaSetDevice's, 0 at first) and
 * the device count of the model (GM_DEVICES, default 1). */
int gm_current_device(void);
int gm_device_count(void);

/* ---- kernels (kernels/) ---- */

/* The model of one kernel: its device name as nvcc registers it
 * (__cudaRegisterFunction's deviceName), how to run a launch on the host, and
 * the memory ranges a launch touches (for gm_check_range before it runs). */
typedef struct gm_range {
    const void *p;
    size_t bytes;
    int writes;
} gm_range;

/* Most parameters a modelled kernel may take. */
#define GM_KERNEL_MAX_ARGS 16

/* cudaLaunchKernel's `args` points into the caller's stack: at the launch the
 * model copies each parameter (arg_size[i] bytes from args[i]) into storage of
 * its own, each copy aligned to 16 bytes, and later calls ranges() and run()
 * with pointers to those copies. nargs and arg_size must therefore be exactly
 * the kernel's parameter list (sizeof of each parameter's type, in order). */
typedef struct gm_kernel {
    const char *key;   /* the device name demangled, namespaces and parameters
                          dropped: "combine_kernel<0, 1>" */
    void (*run)(void **args, dim3 grid, dim3 block);
    int (*ranges)(void **args, gm_range *out, int cap); /* count written; more
                          than cap means the ranges did not fit (an error) */
    int nargs;                             /* parameters of the kernel */
    size_t arg_size[GM_KERNEL_MAX_ARGS];   /* bytes of each parameter */
} gm_kernel;

/* The kernel whose demangled device name (namespaces dropped) is `key`; NULL
 * when the model has no host build of it. */
const gm_kernel *gm_kernels_find(const char *key);

/* Adds a kernel model that launches find before gm_kernels_find's (for the
 * model's self-tests: a fake kernel registered with __cudaRegisterFunction).
 * `k` is borrowed for the life of the process; at most 64. */
void gm_kernels_add(const gm_kernel *k);

/* ---- build layout ----
 * kernels/ builds a static library target `gm_kernels` (position independent:
 * it is linked into the model's libcudart.so.13) that defines
 * gm_kernels_find; without the target cudart/ builds a stub that finds none.
 * The model's shared libraries go to ${MFSDP_GPUMODEL_LIBDIR}
 * (<build>/tests/gpumodel/lib); the CMake target of libcudart.so.13 is
 * `gm_cudart`. */

#ifdef __cplusplus
}
#endif

#endif
