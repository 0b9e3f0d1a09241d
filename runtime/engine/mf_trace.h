/*
 * mf_trace: the trace check, always on (docs/runtime.md §4). Every hook call
 * is compared with the next event the schedule expects -- (phase, unit,
 * microbatch) of the training step, a short step's end, or the next unit of
 * an evaluation pass -- and a call that diverges is refused with
 * MFSDP_ERR_INVALID_USAGE and a message naming what came and what was
 * expected; nothing is issued and the state does not move, so the trainer
 * can still make the right call. The state lives in the runtime (mf_base.h,
 * "hook state") and only the host thread touches it.
 */
#ifndef MF_TRACE_H
#define MF_TRACE_H

#include "mf_base.h"

/* Checks hook (phase, unit, microbatch; both -1 for the step hooks) against the
 * expected event. On success returns MFSDP_OK and the position the hook's
 * ops are issued at (MF_POS_* of core/mf_schedule.h); else the error, set
 * on rt. */
mfsdp_result mf_trace_admit(mf_rt *rt, mf_phase phase, int unit, int64_t microbatch, unsigned *pos);
/* Moves the state past an admitted hook. */
void mf_trace_advance(mf_rt *rt, mf_phase phase, int unit);
/* No step is half done and no evaluation window is open: helpers,
 * checkpoints and destroy may run. */
bool mf_trace_between_steps(const mf_rt *rt);
/* The state of a fresh runtime: before the first step. */
void mf_trace_reset(mf_rt *rt);

#endif
