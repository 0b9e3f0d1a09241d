/*
 * mf_live: live intervals of a schedule's transient buffers within one
 * microbatch (docs/semantics.md §10). Shared by the planner's buffer
 * assignment (planner/passes/mf_assign.c), the loader's arena check
 * (core/mf_arena_check.c), the summary's live-bytes lower bound and the
 * verifier's region hazards.
 *
 * Time: the trainer's hooks of one microbatch in call order form a cycle
 * (step_begin, forward_pre/post of units 0..U-1, backward_pre/post of units
 * U-1..0, step_end). Hook h gives one tick to each of its ops, in ascending
 * id, then one tick to the trainer's compute that follows the hook. A buffer's
 * accesses are its ops' reads and writes plus the trainer's: the unsharded
 * weight is read from forward_pre(unit) to forward_pre(last_unit) and from
 * backward_pre(last_unit) to backward_pre(unit); grad_local is written over
 * the same backward window. A segment runs from a write that overwrites the
 * whole buffer (a "pure" write) to the last access before the next one;
 * a segment whose last access is on a communication stream is extended to the
 * end of the trainer's next compute window, the time the collective is
 * expected to take (a planning choice; safety comes from the waits).
 *
 * Ownership: mf_live_build fills an mf_live whose arrays are malloc'ed;
 * mf_live_free releases them.
 */
#ifndef MF_LIVE_H
#define MF_LIVE_H

#include "mf_schedule.h"

typedef struct mf_live_seg {
    int buffer;
    int64_t start;          /* tick of the pure write, 0 <= start < T */
    int64_t end;            /* last access, extended; start <= end < start + T
                               (end >= T wraps into the next microbatch) */
    int writer;             /* op id of the pure write; -1: the trainer */
    int writer_hook;        /* hook of the pure write */
    int last[MF_STREAM_COUNT];      /* last access per stream: op id; -1 none;
                                       -2 the trainer (compute) */
    int last_hook[MF_STREAM_COUNT]; /* its hook */
    bool conditional;       /* every access is a first- or last-microbatch op:
                               the segment does not occur in every microbatch */
    int cond_class;         /* 0 every microbatch; 1 first only; 2 last only;
                               3 first and last only */

} mf_live_seg;

typedef struct mf_live {
    int nhooks;             /* 4U + 2 */
    int64_t T;              /* ticks per microbatch */
    int64_t *hook_base;     /* [nhooks + 1]: first tick of each hook; the
                               trainer's tick of hook h is hook_base[h+1] - 1 */
    int *op_hook;           /* [nops]: hook of each op; -1 outside the step (!mf_op_in_step) */
    int64_t *op_tick;       /* [nops] */
    int nsegs;
    mf_live_seg *segs;      /* grouped by buffer, in time order */
    int *buf_seg;           /* [nbuffers + 1]: segments of buffer b are
                               [buf_seg[b], buf_seg[b+1]); none when persistent */
} mf_live;

/* Whether a buffer lives in the transient arena (microbatch lifetime); the
 * others (persistent, and step buffers, which the optimizer reads after
 * step_end) get bytes of their own in the persistent region. */
static inline bool mf_live_in_arena(const mf_buffer *b)
{
    return b->lifetime == MF_LIFETIME_MICROBATCH;
}

/* Hook index of (phase, unit) in the cycle; unit ignored for step hooks. */
int mf_live_hook(const mf_schedule *s, mf_phase phase, int unit);
/* The phase of hook h. */
mf_phase mf_live_hook_phase(const mf_schedule *s, int h);

/* Fills lv for s (ops, buckets and buffers must be consistent, as after the
 * loader's structural checks or lowering). Returns false on OOM (lv zeroed). */
bool mf_live_build(const mf_schedule *s, mf_live *lv);
void mf_live_free(mf_live *lv);

/* True when segments a and b overlap in time (on the cycle). */
bool mf_live_overlap(const mf_live *lv, const mf_live_seg *a, const mf_live_seg *b);

/* Bytes of buffer b in the arena: count x dtype size rounded up to align. */
int64_t mf_live_bytes(const mf_schedule *s, int b);

/* The largest total of aligned transient bytes live at one tick; -1 on OOM. */
int64_t mf_live_lower_bound(const mf_schedule *s, const mf_live *lv);

#endif
