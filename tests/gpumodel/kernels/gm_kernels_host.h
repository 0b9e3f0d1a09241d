/*
 * gm_kernels_host: what the kernels' host build offers besides gm_model.h's
 * gm_kernels_find -- the registry's enumeration (the self-tests hold it to
 * the nvcc object's instantiations), and the .cu's C interface built for the
 * host (mf_cuda_* renamed gm_cu_*, gm_kernels_shim.h): the same argument
 * checks, alignment choice and grid sizing as on the device, each launch run
 * at once on the calling thread on host memory (the stream is ignored).
 */
#ifndef GM_KERNELS_HOST_H
#define GM_KERNELS_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "gm_model.h"
#include "mf_cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most ranges one launch reports: every source and every destination. */
#define GM_KERNELS_MAX_RANGES (2 * MF_CUDA_MAX_OPERANDS)

/* The registry, in a fixed order: i < gm_kernels_count(). */
int gm_kernels_count(void);
const gm_kernel *gm_kernels_at(int i);

/* Launches run by the host build's cudaLaunchKernel on this thread. */
int gm_kernels_host_launches(void);

/* The device's %globaltimer on the host: CLOCK_MONOTONIC in ns. */
unsigned long long gm_kernels_globaltimer_ns(void);

/* mf_cuda_kernels.h's functions, host build (same contracts). */
cudaError_t gm_cu_combine(void *const *dsts, int ndst, mf_dtype dt, const void *const *srcs, int nsrc,
                          mf_dtype st, int64_t n, float scale, mf_cuda_scaling how, bool add_dst,
                          cudaStream_t stream);
cudaError_t gm_cu_cast(void *dst, mf_dtype dt, const void *src, mf_dtype st, int64_t n, cudaStream_t stream);
cudaError_t gm_cu_accumulate(void *dst, mf_dtype dt, const void *src, mf_dtype st, int64_t n, bool overwrite,
                             cudaStream_t stream);
cudaError_t gm_cu_scale(void *buf, mf_dtype t, int64_t n, float alpha, cudaStream_t stream);
cudaError_t gm_cu_fill_pattern(void *buf, mf_dtype t, int64_t n, uint32_t seed, cudaStream_t stream);
cudaError_t gm_cu_spin(int64_t ns, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
