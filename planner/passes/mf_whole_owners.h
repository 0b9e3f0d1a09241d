/*
 * mf_whole_owners: which shard each tensor of each whole bucket takes, over
 * the whole model at once (docs/semantics.md §4.6, step 3). Part of the
 * layout pass: mf_layout_pass.c gives each bucket its shard length S (from
 * its own groups) and places the tensors; this module only deals them.
 *
 * Longest processing time first over every tensor of every whole bucket: in
 * order of cost descending (ties: the earlier bucket, then declaration
 * order), each tensor goes to the shard of its own bucket whose ranks'
 * largest load is least (ties: the shard whose span -- the shards with its
 * coordinate on the innermost split axis -- carries the least load, then the
 * lowest shard) among those with room for
 * it (the shard's tensors so far, each rounded up to the tensor quantum,
 * plus this one, within S); its cost is then added to the load of every rank
 * of that shard. A rank's load is the cost it owns over every bucket;
 * buckets whose finest placements differ share the ranks' loads.
 *
 * A bucket where some tensor found no room deals its own groups instead
 * (each group to an empty shard, the same rule), and the dealing runs again;
 * after MF_WHOLE_OWNERS_TRIES runs every bucket deals its groups, which
 * always fit (S is at least the largest group). A second dealing has every
 * bucket deal its groups from the start; the one whose most loaded rank
 * carries less is kept (ties: the first). S, the room of every shard, never
 * depends on the dealing; the ragged shards laid out after it do
 * (mf_layout_pass.c, whole_bounds: each shard as long as what it got).
 */
#ifndef MF_WHOLE_OWNERS_H
#define MF_WHOLE_OWNERS_H

#include <stdbool.h>
#include <stdint.h>

#include "mf_schedule.h"

#define MF_WHOLE_OWNERS_TRIES 3

/* One whole bucket: its tensors in declaration order. */
typedef struct mf_whole_bucket {
    const mf_placement *fine;   /* its finest whole placement: P shards */
    int64_t P;
    int n;                      /* tensors */
    const int64_t *cost;        /* n: the balance cost of each tensor */
    const int64_t *numel;       /* n */
    const int *group;           /* n: its group (0..P-1), the fallback */
    int64_t tq;                 /* tensor quantum (elements) */
    int64_t S;                  /* shard length: every shard's room */
    int *shard;                 /* out, n: the shard of each tensor */
} mf_whole_bucket;

/* Deals every tensor of the nb buckets b[] to a shard (the header comment).
 * False on OOM (shard then undefined). */
bool mf_whole_owners_assign(const mf_mesh *m, mf_whole_bucket *b, int nb);

#endif
