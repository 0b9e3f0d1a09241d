/*
 * mf_offload: MFSDP_FLAG_OFFLOAD_MAIN, the CPU offload of the master weights
 * (FSDP2's CPUOffloadPolicy; docs/runtime.md §6). On a backend that can
 * allocate pinned host memory (be->alloc_host: the GPU backends) every
 * main_weight buffer moves out of the arena into one pinned, mapped host
 * block, packed at offsets of its own, followed by a host mirror of each
 * bucket's delivered gradient, which mfsdp_step_end fills. The arena keeps
 * its planned size and every other buffer its offset. Kernels and copies
 * (cast, accumulate, slice) read mapped host memory through unified
 * addressing; a collective on a main_weight buffer cannot (NCCL needs device
 * memory), so such a schedule is refused. On the CPU backends the flag is
 * accepted and does nothing: their buffers are host memory already.
 */
#ifndef MF_OFFLOAD_H
#define MF_OFFLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "mf_base.h"

typedef enum mf_offload_mode {
    MF_OFFLOAD_OFF,        /* the flag is not set */
    MF_OFFLOAD_NOOP,       /* set, but the backend's buffers are host memory already */
    MF_OFFLOAD_ACTIVE,     /* main_weight and the gradient mirror in pinned host memory */
    MF_OFFLOAD_REFUSED,    /* a collective runs on a main_weight buffer */
} mf_offload_mode;

/* The first op of s that runs a collective with a main_weight buffer as its
 * source or destination, or -1 when every access to one is a kernel or a
 * copy (cast, accumulate, slice). Pure. */
int mf_offload_refusing_op(const mf_schedule *s);

/* The placement decision, pure: what `flags` make of schedule s on a backend
 * that can (host_alloc) or cannot allocate pinned host memory. *op (may be
 * NULL) receives the refusing op for MF_OFFLOAD_REFUSED, else -1. */
mf_offload_mode mf_offload_decide(const mf_schedule *s, uint32_t flags, bool host_alloc, int *op);

/* The host block's layout: host_off[b] (s->nbuffers entries) is the byte
 * offset of buffer b in the block (each main_weight buffer, then each
 * bucket's delivered gradient: grad_final, else grad), -1 for any other
 * buffer; every entry rounded up to the schedule's alignment. Returns the
 * block's bytes; *main_bytes and *grad_bytes (may be NULL) its two parts. */
int64_t mf_offload_layout(const mf_schedule *s, int64_t *host_off, int64_t *main_bytes,
                          int64_t *grad_bytes);

/* At create, after the arena is placed and before ops are resolved: decides,
 * and when active allocates the host block and points every main_weight
 * buffer into it. Sets rt->offload when the flag is set. MFSDP_OK or the
 * error (set, handle-less: a refused schedule is MFSDP_ERR_UNSUPPORTED). */
mfsdp_result mf_offload_place(mf_rt *rt);
/* The host mirror of delivered-gradient buffer b, or NULL (not offloaded). */
void *mf_offload_mirror(const mf_rt *rt, int b);
/* The end of mfsdp_step_end when active: waits for the backend, then copies
 * every delivered gradient into its mirror (be->stage). A failure is sticky. */
mfsdp_result mf_offload_step_end(mf_rt *rt);
/* Releases the host block and rt->offload; NULL-safe. */
void mf_offload_free(mf_rt *rt);

/* Tests (process-wide, off by default): true makes mf_offload_place treat a
 * backend without alloc_host as if it had one (an accounted, zeroed host
 * block), so the active path -- the separate block, the views into it, the
 * gradient mirror copied at step_end through be->stage -- runs on the CPU
 * backends too. Set it only while no runtime is being created. */
void mf_offload_fake_host_alloc(bool on);

#endif
