/*
 * cuda_ops: trainer_check's memory operations on one CUDA stream (the
 * trainer's compute stream): fills and copies are enqueued there, so they are
 * ordered with the hooks by the stream alone, as a CUDA trainer's kernels are;
 * write and read complete before returning. Device tests only.
 */
#ifndef CUDA_OPS_H
#define CUDA_OPS_H

#include <cuda_runtime_api.h>

#include "trainer_check.h"

/* ctx of cuda_ops: a cuda_stream_ctx (microbatch_begin/end are the caller's) */
typedef struct cuda_stream_ctx {
    cudaStream_t stream;
} cuda_stream_ctx;

/* The operations on ((cuda_stream_ctx *)ctx)->stream; a failing CUDA call
 * prints its error to stderr. microbatch_begin/end are NULL. */
extern const tc_ops cuda_ops;

#endif
