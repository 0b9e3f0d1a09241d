/*
 * mf_cpu_kernels: the elementwise kernels of the CPU backends and the worker
 * model (mf_cpu_kernels.c): add, reduce, divide. bf16 and fp16 arithmetic is
 * done in fp32 and rounded once; conversions (mf_dtype_convert,
 * mf_dtype_load/store) are core/mf_dtype.h's.
 */
#ifndef MF_CPU_KERNELS_H
#define MF_CPU_KERNELS_H

#include <stdint.h>

#include "mf_schedule.h"

/* dst[i] = dst[i] + src[i] in fp32, stored as dd. */
void mf_cpu_kernels_add(void *dst, mf_dtype dd, const void *src, mf_dtype sd, int64_t n);
/* dst[i] = (sum over k < nsrc of srcs[k][off + i]) / divisor, summed in fp32
 * in k order (so every rank computing it gets the same bits); divisor 1 for
 * sum. dst may alias srcs[k] + off only when it is the same position. */
void mf_cpu_kernels_reduce(void *dst, const void *const *srcs, int nsrc, int64_t off, int64_t n,
                           mf_dtype d, int64_t divisor);
/* The same sums (the same bits), written into every dsts[j] at the position
 * read: dsts[j][off + i], i < n, j < ndst, with streaming stores
 * (mf_nt_copy.h; fenced before it returns). A dst may be a source
 * (in place): each block is read from every source before it is written. */
void mf_cpu_kernels_reduce_out(void *const *dsts, int ndst, const void *const *srcs, int nsrc,
                               int64_t off, int64_t n, mf_dtype d, int64_t divisor);
/* p[i] = p[i] / divisor, i < n. */
void mf_cpu_kernels_divide(void *p, mf_dtype d, int64_t n, int64_t divisor);

#endif
