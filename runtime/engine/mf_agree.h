/*
 * mf_agree: the ranks agree on every step's program (docs/runtime.md §4.4).
 * The trace check (mf_trace.c) holds each rank to its schedule; what the
 * schedule leaves to the trainer -- begin a step or run an evaluation pass,
 * begin the next microbatch or end the step short, which unit of a pass,
 * which helper -- is decided at a few hooks, and ranks that decide
 * differently would pair collectives that match in kind, dtype and count
 * and mix their data silently. At each such decision point every rank
 * exchanges one small record (what it is about to do: the step number, the
 * microbatch, the unit or the helper and its size) over the world, before
 * anything is issued; records that differ fail the runtime on every rank
 * with MFSDP_ERR_MISMATCH and one message, the same on every rank, naming
 * the step, what each group of ranks was about to do and the ranks (a rank
 * whose exchange a faster peer's failure aborted takes that peer's
 * message, which names the same disagreement).
 *
 * The decision points: mfsdp_step_begin, mfsdp_forward_pre(unit 0,
 * microbatch m > 0), a short step's mfsdp_step_end, every
 * mfsdp_eval_forward_pre, and every collective helper before its own
 * exchange. A full step's end and the other hooks follow from the trace
 * check. Off on a world of one, on a backend without a cheap world exchange
 * (MF_BE_HOST_EXCHANGE: all four backends have one; nccl's is a small
 * all-gather on its own stream, mf_backend_nccl.c), and with MFSDP_AGREE=0
 * (read at create, compared between ranks in the create exchange).
 *
 * Invariants: nothing is allocated after create (the gather's destination
 * is made there); only the host thread runs it.
 */
#ifndef MF_AGREE_H
#define MF_AGREE_H

#include "mf_base.h"

/* What a rank is about to do at a decision point. */
typedef enum {
    MF_AGREE_STEP = 1,      /* mfsdp_step_begin */
    MF_AGREE_MICROBATCH,    /* mfsdp_forward_pre(unit 0, microbatch m > 0) */
    MF_AGREE_SHORT_END,     /* mfsdp_step_end after m < M microbatches */
    MF_AGREE_EVAL,          /* mfsdp_eval_forward_pre(unit u) */
    MF_AGREE_HELPER,        /* a collective helper (or checkpoint call) */
} mf_agree_what;

/* MFSDP_AGREE from the environment: 1 (on, the default) or 0. */
int64_t mf_agree_env(void);
/* At create, after the backend is open: decides whether the agreement runs
 * (see above) and allocates the gather's destination. MFSDP_OK or
 * MFSDP_ERR_OUT_OF_MEMORY (set, handle-less). */
mfsdp_result mf_agree_create(mf_rt *rt);
void mf_agree_free(mf_rt *rt);
/* The hook (phase, unit, microbatch) was admitted at position pos (MF_POS_*):
 * at a decision point, agrees on it with every rank. MFSDP_OK, or the
 * runtime's failure (sticky, set on rt): MFSDP_ERR_MISMATCH when the ranks
 * disagree, or the backend's error (a rank that never arrives: timeout). */
mfsdp_result mf_agree_hook(mf_rt *rt, mf_phase phase, int unit, int64_t microbatch, unsigned pos);
/* Before a collective helper's own exchange: fn its public name (the same
 * on every rank), arg what must match too (its bytes per rank). */
mfsdp_result mf_agree_helper(mf_rt *rt, const char *fn, int64_t arg);
/* Counts an admitted hook (steps begun). */
void mf_agree_advance(mf_rt *rt, mf_phase phase);

#endif
