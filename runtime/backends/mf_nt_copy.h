/*
 * mf_nt_copy: memcpy writing the destination with streaming (non-temporal)
 * stores where the CPU has them (mf_nt_copy.c): no read for ownership of the
 * destination's cache lines. For the CPU backends' large collectives and
 * mf_cpu_kernels_reduce_out.
 */
#ifndef MF_NT_COPY_H
#define MF_NT_COPY_H

#include <stddef.h>

/* memcpy(dst, src, bytes); call mf_nt_copy_fence before another thread
 * reads dst (streaming stores are weakly ordered). */
void mf_nt_copy(void *dst, const void *src, size_t bytes);
void mf_nt_copy_fence(void);

#endif
