/*
 * mf_ckpt_share: what a checkpoint load reads on this rank, and how the
 * replicas of a shard share what one of them read (docs/checkpoint.md,
 * "Who reads what").
 *
 * The loading schedule's save plan (mf_ckpt_plan) already splits every
 * shard's tensor elements evenly among the shard's replicas. A load follows
 * it: the rank that would write a piece in a save reads it from the
 * checkpoint, into its own buffers, and the piece then reaches the shard's
 * other replicas over the backend (be->transfer_post: MPI point-to-point into
 * their buffers, sent while the reader reads on) or, where ranks share
 * memory (MF_BE_SHARED_MEMORY: the local backend's threads), by a memcpy
 * from the reader's buffer. Each byte
 * is read once per replica group; no staging buffer is allocated (data goes
 * from the file into the reader's buffer, from there into the replicas'):
 * with shared memory the reader copies each chunk into the replicas'
 * buffers as soon as it has read it, still in the CPU's cache.
 * A backend with neither reads every replica's copy, as before.
 * A piece of a split global tensor (`global "W" split D`) is read as the
 * runs of W it covers (one for D = 0; for D > 0 a strided run per row of
 * the local tensor), each straight into its place in the buffers.
 */
#ifndef MF_CKPT_SHARE_H
#define MF_CKPT_SHARE_H

#include <stddef.h>
#include <stdint.h>

#include "mf_ckpt_io.h"
#include "mf_rt.h"
#include "mfsdp_ckpt.h"

/* One element range of a tensor this rank holds, and who reads it. */
typedef struct mf_ckpt_lpiece {
    int view;               /* runtime tensor index */
    int bucket;             /* schedule bucket */
    int64_t start, end;     /* tensor-local elements */
    int64_t reader;         /* world rank that reads it from the checkpoint */
    int64_t run, grow, gbase; /* local -> checkpoint elements (mf_ckpt_plan.h; split form) */
} mf_ckpt_lpiece;

typedef struct mf_ckpt_lplan {
    int share;              /* 1: replicas share reads (backend permitting) */
    int64_t n;
    mf_ckpt_lpiece *p;      /* plan order: tensor, then start */
    /* Shared memory (MF_BE_SHARED_MEMORY) only: every rank's buffer
     * addresses, [rank][view][state] (state 0: main_weight, i + 1:
     * requested state i; per = nviews * (nstates + 1) per rank), filled by
     * mf_ckpt_lplan_peers; mine is this rank's row. */
    uintptr_t *mine, *all;
    size_t per;
    int64_t *reps;          /* sharing only, scratch: a bucket's replicas, world entries */
} mf_ckpt_lplan;

/* The pieces this rank holds (nstates: how many states the load asks
 * for, to size the address table). 0, or -1 (out of memory) with a
 * message. Local: call it before the first agreement round, so that a
 * failure is reported there. */
int mf_ckpt_lplan_build(mf_rt *rt, int nstates, mf_ckpt_lplan *lp, char *err, size_t errlen);
void mf_ckpt_lplan_free(mf_ckpt_lplan *lp);
/* Shared memory only (else a no-op): every rank publishes its buffer
 * addresses (one world all-gather; collective, after the ranks agreed that
 * the checkpoint matches every runtime). A backend failure fails the
 * runtime. */
mfsdp_result mf_ckpt_lplan_peers(mf_rt *rt, mf_ckpt_lplan *lp, const mfsdp_ckpt_load_options *opt, char *err,
                                 size_t errlen);
/* Reads the pieces this rank is the reader of (main_weight and every
 * requested state; map: runtime tensor -> checkpoint tensor, smap: requested
 * state -> checkpoint state) and hands each to the shard's other replicas
 * as it is read: with shared memory (after mf_ckpt_lplan_peers) each chunk
 * read and CRC'd is copied at once, while in the CPU's cache, into the
 * same place of their buffers; with message passing every receive is posted
 * first, the sends of each message of MF_CKPT_SHARE_MSG bytes as soon as it
 * is read (in flight while the next is read), and all are waited for at
 * the end. After a data error the reads stop but every send is still
 * posted, so that no replica waits for a message that never comes.
 * Collective with message passing (every rank calls it, after the ranks
 * agreed that the checkpoint matches every runtime). Returns MFSDP_OK,
 * MFSDP_ERR_LOAD (a data error, message in err: the caller's next agreement
 * round fails the load everywhere), or a backend's failure (the runtime is
 * failed: a transfer may still be pending). */
mfsdp_result mf_ckpt_lplan_read(mf_rt *rt, mf_ckpt_lplan *lp, mf_ckpt_reader *r, const mfsdp_ckpt_load_options *opt,
                                const int *map, const int *smap, char *err, size_t errlen);

#endif
