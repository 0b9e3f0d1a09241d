/*
 * mf_persist: the persistent region of one rank (docs/semantics.md §4.6 and docs/semantics.md §10).
 *
 * The region holds every buffer outside the transient arena
 * (!mf_live_in_arena). A buffer of a bucket with equal shards is as long on
 * every rank (count elements) and sits at its schedule offset. A buffer of a
 * ragged bucket (a whole bucket with bounds) is *per rank*: on rank r it is
 * as long as the range rank r holds under its placement
 * (mf_layout_bucket_range(...).len <= count); the per-rank buffers follow
 * the shared ones, in buffer order, each at the end of the previous one on
 * that rank (every buffer rounded up to `align` bytes, as in the arena), the
 * first at the furthest aligned end of the shared ones. The schedule records
 * rank 0's offsets and, as mem_persistent, the largest region over the
 * ranks. The planner's assignment, the memory verifier and the runtime's
 * allocation all read offsets and sizes from here, so they agree.
 *
 * Ownership: everything is borrowed; no allocation.
 */
#ifndef MF_PERSIST_H
#define MF_PERSIST_H

#include "mf_schedule.h"

/* Buffer b is outside the arena and its bucket is ragged (has bounds). */
bool mf_persist_per_rank(const mf_schedule *s, int b);
/* Elements of buffer b that rank r holds: its placement's range length in a
 * ragged bucket, else its count. */
int64_t mf_persist_held(const mf_schedule *s, int b, int64_t rank);
/* The shared part of the region: the furthest end of a buffer outside the
 * arena that is not per rank (its schedule offset + bytes, aligned). */
int64_t mf_persist_shared_end(const mf_schedule *s);
/* Rank r's region: writes the byte offset of every buffer outside the arena
 * into offsets[b] (NULL: none; arena buffers untouched) and returns its size
 * in bytes. Shared buffers keep their schedule offsets. */
int64_t mf_persist_layout(const mf_schedule *s, int64_t rank, int64_t *offsets);
/* The offset of persistent buffer b in rank r's region. */
int64_t mf_persist_at(const mf_schedule *s, int b, int64_t rank);
/* The largest region over the ranks: mem_persistent. */
int64_t mf_persist_most(const mf_schedule *s);
/* Per role, the most over the ranks of the bytes (unaligned) the rank
 * holds in buffers of lifetime `life` (mf_persist_held): the per-role model's
 * persistent and step terms when some bucket is ragged (each the most over
 * the ranks, docs/semantics.md §4.6). */
void mf_persist_role_most(const mf_schedule *s, mf_lifetime life, int64_t out[MF_ROLE_COUNT]);
/* Whether some buffer is per rank (the regions may differ by rank). */
bool mf_persist_any_per_rank(const mf_schedule *s);

#endif
