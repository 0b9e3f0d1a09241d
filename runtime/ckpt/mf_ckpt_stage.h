/*
 * mf_ckpt_stage: checkpoints of buffers that are not host memory
 * (docs/checkpoint.md, "GPU backends"). On a native backend (CUDA/NCCL:
 * master weights in device memory), and on the CPU backends when the test
 * and debug option MFSDP_CKPT_STAGE=1 is set, a save, a load, a Hugging
 * Face import and export touch the runtime's buffers and the optimizer
 * states' shards only through the backend's stage hook (be->stage), by
 * bounded host buffers: a save's writer fills its 16 MiB buffer through the
 * hook, a load's reader hands each chunk it has read and CRC'd (in its
 * bounce or 2 MiB scratch buffer) to the hook, an import converts into 4
 * MiB and an export copies 1 MiB at a time (mf_ckpt_hf_rt.c,
 * mf_ckpt_hf_export.c). Replicas then do not share reads (each reads its
 * own).
 */
#ifndef MF_CKPT_STAGE_H
#define MF_CKPT_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "mf_ckpt_io.h"
#include "mf_base.h"

/* The CPU backends' stage hook (be->stage): memcpy, and a process-wide
 * count of the bytes it moved, for tests (mf_ckpt_stage_host_bytes). */
mfsdp_result mf_ckpt_stage_host(mf_rt *rt, void *dst, const void *src, size_t bytes, char *err, size_t errlen);
uint64_t mf_ckpt_stage_host_bytes(void);
/* 1 when this runtime's checkpoints go through be->stage. */
int mf_ckpt_stage_active(const mf_rt *rt);
/* Before the first staged access: a native backend's submitted ops
 * complete (be->synchronize); a backend without a stage hook refused.
 * MFSDP_OK, or the failure with its message in err. */
mfsdp_result mf_ckpt_stage_begin(mf_rt *rt, char *err, size_t errlen);

/* A save's fill callback (mf_ckpt_fill_fn): entry i's bytes from buffer
 * memory src[i] through the hook. */
typedef struct mf_ckpt_stage_src {
    mf_rt *rt;
    const char **src;       /* per entry: buffer memory, or NULL (the entry has host data) */
} mf_ckpt_stage_src;
int mf_ckpt_stage_fill(void *ctx, int entry, uint64_t off, void *buf, size_t n, char *err, size_t errlen);

/* A load's chunk callback (mf_ckpt_reader.chunk, with reader->nodst):
 * each chunk to dst + off through the hook; the first failure is kept. */
typedef struct mf_ckpt_stage_dst {
    mf_rt *rt;
    char *dst;              /* buffer memory of the range being read */
    mfsdp_result res;
    char err[256];
} mf_ckpt_stage_dst;
void mf_ckpt_stage_chunk(void *ctx, size_t off, const void *data, size_t n);

#endif
