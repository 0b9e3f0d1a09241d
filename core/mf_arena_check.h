/*
 * mf_arena_check: the structural rules of a schedule's memory assignment
 * (docs/semantics.md §10), shared by the loader, the planner's assignment
 * (which uses the same walk to find the waits reuse needs) and the verifier:
 * every buffer lies inside its region at an aligned offset, and two transient
 * buffers whose bytes overlap never have live intervals (mf_live) that overlap.
 */
#ifndef MF_ARENA_CHECK_H
#define MF_ARENA_CHECK_H

#include "mf_live.h"

/* Calls fn(ctx, a, b) for segment indices a, b (into lv->segs) whenever the
 * two share some byte and b is the next segment in time at that byte after a
 * (cyclically; a == b is skipped). With `through_conditional`, also for every
 * later segment up to and including the first one that is not conditional
 * (a segment that does not occur in every microbatch cannot carry the order
 * from a to the ones after it). A pair may be reported more than once.
 * Returns 1 when done, 0 when fn returned false, -1 on OOM. */
int mf_arena_walk(const mf_schedule *s, const mf_live *lv, bool (*fn)(void *ctx, int a, int b),
                  void *ctx, bool through_conditional);

/* Checks offsets and intervals. Returns -1 when the assignment is sound; -2 on
 * OOM; else the index of a buffer at fault, with a message in msg. */
int mf_arena_check(const mf_schedule *s, char *msg, size_t len);

#endif
