/*
 * mf_cuda_kernels: the elementwise device kernels of the GPU backends (C
 * interface; the kernels live in mf_cuda_kernels.cu).
 *
 * One kernel family does all local arithmetic of a schedule on the device:
 *
 *     for every dst j:  dst_j[i] = D( (add_dst ? dst_0[i] : 0)
 *                                     + (src_0[i] + ... + src_{k-1}[i]) (*|/) scale )
 *
 * computed in fp32, sources added in index order (so results are
 * deterministic and independent of the launch configuration), and rounded once
 * to the destination dtype with round-to-nearest-even (NaN stays NaN, but
 * its bits are CUDA's: a NaN rounded to bf16/fp16 on the device is CUDA's
 * canonical quiet NaN, while the host references below keep the sign and
 * the top payload bits -- compare NaNs as NaNs, not bit for bit). The
 * schedule's local ops are special cases: cast (k = 1), accumulate (dst = src on
 * microbatch 0, dst += src after), scale (alpha on one buffer in place), and the
 * reductions of the multi-rank one-GPU backend (k = group size, several dsts).
 *
 * Invariants: every call only enqueues work on `stream` (no host
 * synchronization, no allocation, capturable into a CUDA graph) and returns
 * its own launch's result (never a stale error of an earlier call); n == 0 enqueues nothing. Element i of every dst is written
 * by the same thread that read element i of every src, so a dst may alias a src
 * at the same element positions (in-place cast/accumulate/scale/reduce), but
 * two ranges that overlap at shifted positions are undefined. Pointers aligned
 * to 16 bytes take the vectorized path (16-byte loads and stores, 8 elements
 * per thread per iteration); any other alignment is correct, only slower.
 */
#ifndef MF_CUDA_KERNELS_H
#define MF_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "mf_schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most sources or destinations of one mf_cuda_combine() launch (kernel
 * parameter space); larger groups are refused with cudaErrorInvalidValue. */
#define MF_CUDA_MAX_OPERANDS 64

/* How mf_cuda_combine applies its scale: multiply, or divide (the CPU
 * backends' averaging divides the sum by the group size; dividing here gives
 * the same bits). */
typedef enum { MF_CUDA_MUL = 0, MF_CUDA_DIV = 1 } mf_cuda_scaling;

/* Borrows every pointer (device memory, or host memory mapped into the device's
 * address space). dsts[0..ndst) all of dtype dt, srcs[0..nsrc) all of dtype st,
 * 1 <= ndst, nsrc <= MF_CUDA_MAX_OPERANDS. The fp32 arithmetic is exactly
 * ((src_0 + src_1) + ...) then * scale or / scale (skipped when scale is 1),
 * then dst_0 + that (no fused multiply-add), so a host loop in the same order
 * reproduces it bit for bit (mf_cpu_kernels_reduce does for MF_CUDA_DIV). Returns
 * cudaErrorInvalidValue for an unknown dtype, n < 0, a NULL operand or an
 * operand count out of range. */
cudaError_t mf_cuda_combine(void *const *dsts, int ndst, mf_dtype dt,
                            const void *const *srcs, int nsrc, mf_dtype st,
                            int64_t n, float scale, mf_cuda_scaling how, bool add_dst,
                            cudaStream_t stream);

/* dst[i] = (dt) src[i]; a plain device copy when the dtypes are equal. */
cudaError_t mf_cuda_cast(void *dst, mf_dtype dt, const void *src, mf_dtype st,
                         int64_t n, cudaStream_t stream);

/* The schedule's accumulate: overwrite (microbatch 0) makes dst = (dt) src,
 * else dst = (dt)(dst + src) in fp32. */
cudaError_t mf_cuda_accumulate(void *dst, mf_dtype dt, const void *src, mf_dtype st,
                               int64_t n, bool overwrite, cudaStream_t stream);

/* buf[i] = (t)(alpha * buf[i]) in place. */
cudaError_t mf_cuda_scale(void *buf, mf_dtype t, int64_t n, float alpha, cudaStream_t stream);

/* cudaMemcpyAsync of bytes device-to-device (any pointers the device can
 * address); the slice op and the copies of the one-GPU collectives. */
cudaError_t mf_cuda_copy(void *dst, const void *src, size_t bytes, cudaStream_t stream);

/* A deterministic, non-constant test pattern: buf[i] = (t) mf_cuda_pattern(seed, i). */
cudaError_t mf_cuda_fill_pattern(void *buf, mf_dtype t, int64_t n, uint32_t seed,
                                 cudaStream_t stream);

/* A one-thread kernel that spins for ns nanoseconds of the device's global
 * timer: a stand-in for compute in the device check (overlap, ordering
 * stress). Capped at ns + 1024 timer reads (each takes more than a
 * nanosecond), so a timer that stops advancing ends the spin early instead of
 * hanging the stream. */
cudaError_t mf_cuda_spin(int64_t ns, cudaStream_t stream);

/* The pattern's value, identical on host and device: a multiple of 1/64 in
 * [-8, 8), distinct per seed and per element. */
float mf_cuda_pattern(uint32_t seed, int64_t i);

/* Host references of the device conversions (round to nearest even; NaN kept
 * as a quiet NaN): fp32 -> bf16/fp16 bits and back. For tests and for
 * checking device results on the host. Bit-exact with the device for every
 * non-NaN input; a NaN's bits may differ (the device's is CUDA's canonical
 * NaN, here the sign and payload are kept): compare NaNs with isnan. */
uint16_t mf_cuda_host_to_bf16(float f);
uint16_t mf_cuda_host_to_fp16(float f);
float mf_cuda_host_from_bf16(uint16_t b);
float mf_cuda_host_from_fp16(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif
