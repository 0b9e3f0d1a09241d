/*
 * gm_kernels_shim: what the host compiler needs to build
 * runtime/backends/mf_cuda_kernels.cu, unchanged, as ordinary C++
 * (gm_kernels.cpp includes this, then the .cu). The CUDA headers are the real
 * ones in host mode: cuda_bf16.h and cuda_fp16.h then use their host
 * implementations of the conversions (__float2bfloat16_rn, __half2float, ...)
 * and vector_types.h gives float4/uint4/dim3 with their device alignment.
 *
 * Invariants:
 *  - the built-in variables (threadIdx, blockIdx, blockDim, gridDim) are
 *    thread_local: two stream workers may run kernels at once;
 *  - __fadd_rn/__fmul_rn/__fdiv_rn are single IEEE operations in SSE
 *    registers (the TU is compiled with -ffp-contract=off, and x87 excess
 *    precision is refused below), so the fp32 arithmetic is the device's, bit
 *    for bit, except NaN payloads (gm_kernels.cpp, "NaN payloads");
 *  - block-level cooperation (__syncthreads, shared memory, warp shuffles,
 *    atomics) does not compile: the model runs a block's threads one after
 *    another, which is only the device's semantics for kernels whose threads
 *    never wait on each other (the grid-stride kernels of the .cu);
 *  - the .cu's CUDA runtime calls and its C interface are renamed (gm_cu_*),
 *    so the host build neither calls a CUDA runtime nor clashes with the
 *    real mf_cuda_* of libmfsdp in the same process.
 */
#ifndef GM_KERNELS_SHIM_H
#define GM_KERNELS_SHIM_H

#ifndef __cplusplus
#error "gm_kernels_shim.h is C++ (the host build of a .cu)"
#endif
#ifdef __CUDACC__
#error "gm_kernels_shim.h is for the host compiler, not nvcc"
#endif
#if !defined(__SSE2_MATH__) || (defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0)
#error "the host build of the kernels needs fp32 arithmetic in SSE registers (FLT_EVAL_METHOD 0)"
#endif

/* Device-only decorations: no meaning on the host. */
#define __launch_bounds__(...)
#define __global__
#define __device__
#define __host__

/* What a block's threads run one after another cannot do. Each expands to an
 * undeclared name that says why, so the build fails at the use. */
#define __syncthreads() gm_host_model_runs_threads_one_after_another_no_syncthreads
#define __syncwarp(...) gm_host_model_runs_threads_one_after_another_no_syncwarp
#define __shared__ gm_host_model_has_no_shared_memory
#define atomicAdd(...) gm_host_model_has_no_atomics
#define __shfl_sync(...) gm_host_model_has_no_warp_shuffles

/* The .cu's CUDA runtime calls: the host build runs a launch at once through
 * the registry (gm_kernels.cpp), for the self-test of the .cu's dispatch. */
#define cudaLaunchKernel gm_cu_cudaLaunchKernel
#define cudaGetLastError gm_cu_cudaGetLastError
#define cudaMemcpyAsync gm_cu_cudaMemcpyAsync

/* The .cu's C interface (mf_cuda_kernels.h), renamed. */
#define mf_cuda_combine gm_cu_combine
#define mf_cuda_copy gm_cu_copy
#define mf_cuda_cast gm_cu_cast
#define mf_cuda_accumulate gm_cu_accumulate
#define mf_cuda_scale gm_cu_scale
#define mf_cuda_fill_pattern gm_cu_fill_pattern
#define mf_cuda_spin gm_cu_spin
#define mf_cuda_pattern gm_cu_pattern
#define mf_cuda_host_to_bf16 gm_cu_host_to_bf16
#define mf_cuda_host_to_fp16 gm_cu_host_to_fp16
#define mf_cuda_host_from_bf16 gm_cu_host_from_bf16
#define mf_cuda_host_from_fp16 gm_cu_host_from_fp16

/* Every header the .cu includes, first, so that the .cu's own #includes are
 * no-ops and the macros below touch only the .cu's text. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mf_cuda_kernels.h"
#include "mf_pattern.h"

/* The built-in variables, per host thread (set by gm_kernels.cpp's grid loop). */
static thread_local uint3 threadIdx;
static thread_local uint3 blockIdx;
static thread_local dim3 blockDim;
static thread_local dim3 gridDim;

/* The fp32 intrinsics the .cu uses: one IEEE operation each, round to
 * nearest even. */
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }

/* The device's nanosecond global timer (%globaltimer), read on the host's
 * monotonic clock: the .cu reads it through MF_GLOBALTIMER(v), which it
 * defines as inline PTX only when not defined already. Inline PTX anywhere
 * else in the .cu cannot build here (the assembler refuses "mov.u64"): such a
 * read needs a macro of its own, defined here. */
extern "C" unsigned long long gm_kernels_globaltimer_ns(void);
#define MF_GLOBALTIMER(v) ((v) = gm_kernels_globaltimer_ns())

#endif
