/*
 * mf_check: the oracle of docs/design.md §4.1, run on every rank while it replays a
 * schedule. Shared by mfsdp-replay (local threads or MPI processes) and the
 * runtime tests.
 *
 * Each rank fills its main_weight shard with values distinct per element,
 * then per step: every rank's main_weight shards are exchanged (replicas must
 * be bitwise equal) and assembled; after each forward_pre and backward_pre,
 * every unsharded weight buffer the unit computes with must equal the cast
 * main_weight, padding included (exact); between backward_pre and
 * backward_post the rank writes grad_local through the tensor views with
 * values distinct per (step, rank, microbatch, element), exact in every
 * dtype and with a closed-form sum; after step_end the
 * delivered gradient at main_weight's placement must equal
 * (1/N) Σ_ranks Σ_microbatches local_grad (or the sum), computed in double,
 * within a tolerance of the least precise gradient dtype, and zero on
 * padding; then the rank applies SGD (lr 1/16) to its main_weight shard so
 * the next step sees new weights.
 *
 * Ranks meet through an mf_check_xchg (an all-gather the caller provides:
 * threads or MPI) once after create and once per step, so a failing rank
 * never leaves the others waiting; a rank that never arrives (dead, stopped)
 * fails the exchange of a caller that bounds it (mfsdp-replay --backend mpi:
 * the runtime's timeout), and the check ends with rc 1 naming it. Every
 * rank's rc is 0 only when every rank's oracle agreed on every step.
 */
#ifndef MF_CHECK_H
#define MF_CHECK_H

#include <stdbool.h>
#include <stdio.h>

#include "mfsdp.h"

/* All-gather among the ranks of the check (not through libmfsdp): returns a
 * pointer to world * bytes bytes in rank order, valid until the next call,
 * or NULL on failure (a peer that never arrived: then `why`, when set, says
 * which). `failing`: this rank's runtime failed in this step, so every live
 * peer's runtime is failing too (its error channel) and arrives soon; an
 * exchange with a deadline may wait less for the others. */
typedef struct mf_check_xchg {
    const void *(*allgather)(void *ctx, int64_t rank, const void *mine, size_t bytes, bool failing);
    const char *(*why)(void *ctx);   /* the last failure; NULL: not said */
    void *ctx;
} mf_check_xchg;

typedef struct mf_check_opts {
    int64_t steps;          /* steps to run (>= 1) */
    int64_t stop_rank;      /* fault injection: this rank stops calling hooks ... */
    int64_t stop_step;      /* ... after step_begin of this step (1-based); -1: never */
    FILE *out;              /* per-step report printed by rank 0; NULL: silent */
} mf_check_opts;

/* What one rank ends with. */
typedef struct mf_check_outcome {
    int rc;                 /* 0 every rank verified every step; 1 a mismatch or a
                               runtime error somewhere; 2 create failed */
    mfsdp_result create_result;
    mfsdp_result error;     /* this rank's first runtime error (MFSDP_OK if none) */
    char msg[1024];         /* the first problem seen by any rank (same on every rank) */
    char own[1024];         /* this rank's own first problem */
    int64_t allocated_bytes; /* mfsdp_allocated_bytes of this rank's runtime */
    uint64_t digest;        /* FNV-1a of this rank's main_weight buffers after the
                               last step (bit-identical runs agree) */
} mf_check_outcome;

/* Bytes per rank the check's exchanges need at most for this schedule. */
size_t mf_check_xchg_bytes(const mfsdp_schedule *sh);

/* Bytes one rank needs (runtime buffers and the oracle's copies). */
size_t mf_check_rank_bytes(const mfsdp_schedule *sh);

/* Runs the check on one rank; creates and destroys the runtime with cfg. */
int mf_check_rank(const mfsdp_schedule *sh, const mfsdp_config *cfg, const mf_check_xchg *x,
                  const mf_check_opts *o, mf_check_outcome *out);

/*
 * Runs every rank of the mesh as a thread on the local backend (a group
 * created here). `per_rank`, when non-NULL, gives rank r's schedule handle
 * (mismatch tests); else every rank uses sh. cfg_template supplies timeout
 * and flags, and MFSDP_BACKEND_CUDA_LOCAL when the thread-ranks should run on
 * one GPU (else the local backend). outcomes has world entries. Returns the rank-0 rc (the same on
 * every rank), or 2 when the threads could not be started.
 */
int mf_check_local(const mfsdp_schedule *sh, const mfsdp_schedule *const *per_rank,
                   const mfsdp_config *cfg_template, const mf_check_opts *o,
                   mf_check_outcome *outcomes);

#endif
