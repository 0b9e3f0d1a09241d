/*
 * mf_assign: static buffer assignment, the pass after lowering
 * (docs/semantics.md §10). Gives every persistent buffer its own range of the
 * persistent region and every transient buffer an offset in one arena such
 * that buffers whose live intervals (core/mf_live.h) overlap never share a
 * byte, then adds the record/wait pairs that make the reuse safe: where a
 * buffer takes over bytes from another, its first writer waits for the other's
 * last access on every other stream, unless the schedule already orders the
 * two. Works on any consistent schedule (compiled or built by the tests).
 */
#ifndef MF_ASSIGN_H
#define MF_ASSIGN_H

#include "mf_live.h"
#include "mf_schedule.h"

typedef struct mf_assign_stats {
    int waits_added;        /* wait ops added */
    int records_added;      /* record ops (events) added */
} mf_assign_stats;

/* Assigns offsets, sets mem_persistent / mem_transient, inserts the waits
 * (renumbering op ids) and sets the summary's live_bytes, interference_bytes
 * (core/mf_interfere.h) and allocated_bytes
 * (the rest of the summary, which waits do not change, must be computed
 * already: mf_schedule_summarize). stats may be NULL.
 * Returns false on OOM (the schedule is then unusable). */
bool mf_assign_run(mf_schedule *s, mf_assign_stats *stats);

/* The same with s's live intervals already built (mf_live_build on s as it
 * is; borrowed), their live-bytes bound (mf_live_lower_bound) and the
 * interference bound (mf_interfere_bound with MF_INTERFERE_WORK; .bytes),
 * each -1 to compute it here: what `mfsdpc plan` calls after it bounded a
 * candidate's arena with them. */
bool mf_assign_run_live(mf_schedule *s, const mf_live *lv, int64_t live, int64_t interference,
                        mf_assign_stats *stats);

/* The persistent region mf_assign_run lays out: every buffer outside the
 * arena, each rounded up to align. */
int64_t mf_assign_persistent_bytes(const mf_schedule *s);

#endif
