/*
 * mf_ckpt_plan: which rank writes which element range of which tensor
 * (docs/checkpoint.md, "Who writes what"), computed from the schedule alone,
 * identically on every rank and in the offline tools.
 *
 * A tensor's master weight lives in its bucket's main_weight buffer; rank r
 * holds the bucket elements mf_layout_bucket_range(mesh, bucket, main_weight
 * placement, r) (equal shards, or a whole bucket's ragged ones),
 * so its piece of a tensor is one contiguous element range of the tensor.
 * Ranks holding the same shard are replicas. The tensor elements of a shard
 * (bucket padding and alignment gaps excluded) are cut into as many
 * contiguous parts as the shard has replicas; replica (i + bucket + shard)
 * mod n writes part i. So every tensor element is written exactly once and
 * the replicas of a shard write equal shares.
 *
 * A bucket Distinct on some axis (docs/semantics.md §4.7) holds a different
 * tensor per coordinate combination of its Distinct axes: its tensors enter
 * the plan once per combination, under their global names (mf_tensor.global,
 * rename form), and the replicas of a shard are the ranks holding it with the
 * same combination. A Distinct tensor without global names, or with the split
 * form, has no plan (mf_ckpt_plan_build refuses it, naming the tensor).
 */
#ifndef MF_CKPT_PLAN_H
#define MF_CKPT_PLAN_H

#include "mf_schedule.h"

typedef struct mf_ckpt_ptensor {
    const char *name;       /* borrowed from the schedule: the global name */
    const char *local;      /* the schedule's (local) tensor name; == name unless Distinct */
    int64_t coord;          /* the coordinate combination it belongs to, -1 when not Distinct */
    int bucket, index;      /* in the schedule */
    int ndims;
    int64_t dims[MF_MAX_DIMS];
    int64_t numel;
    mf_dtype dtype;         /* main_weight dtype */
} mf_ckpt_ptensor;

typedef struct mf_ckpt_piece {
    int tensor;             /* index into plan.t */
    int64_t start, end;     /* tensor-local elements [start, end) */
    int64_t writer;         /* world rank */
} mf_ckpt_piece;

typedef struct mf_ckpt_plan {
    int64_t world;
    int ntensors;
    mf_ckpt_ptensor *t;     /* schedule order: bucket, then declaration */
    int64_t npieces;
    mf_ckpt_piece *p;       /* sorted by writer, tensor, start */
    int64_t *first;         /* world + 1: pieces of rank r are p[first[r] .. first[r+1]) */
} mf_ckpt_plan;

/* Builds the plan of schedule s. Returns 0, or -1 (out of memory) with a
 * message. Release with mf_ckpt_plan_free. */
int mf_ckpt_plan_build(const mf_schedule *s, mf_ckpt_plan *out, char *err, size_t errlen);
void mf_ckpt_plan_free(mf_ckpt_plan *p);
/* Room for element n of a growing array p of elem-byte elements with
 * capacity *cap (doubled when full, `first` when empty): p itself or its
 * reallocation (then *cap updated), NULL when out of memory (p unchanged). */
void *mf_ckpt_plan_reserve(void *p, int64_t *cap, int64_t n, size_t elem, int64_t first);
/* The tensor-local element range [*lo, *hi) of plan tensor k that rank r
 * holds in main_weight (*lo == *hi when none). */
void mf_ckpt_plan_held(const mf_schedule *s, const mf_ckpt_plan *p, int k, int64_t rank, int64_t *lo,
                       int64_t *hi);
/* The ranks holding the same main_weight shard of bucket `bucket` as
 * `rank` (its replicas, itself included), ascending, into out[world];
 * returns how many. */
int64_t mf_ckpt_plan_replicas(const mf_schedule *s, int bucket, int64_t rank, int64_t *out);
/* The pieces writer w writes of plan tensor k: p->p[*lo .. *hi) (sorted by
 * start; empty when none). */
void mf_ckpt_plan_pieces_of(const mf_ckpt_plan *p, int64_t w, int k, int64_t *lo, int64_t *hi);
/* The row-major combination of rank's coordinates on the Distinct axes of
 * bucket `bucket` (outermost first), -1 when the bucket has none. */
int64_t mf_ckpt_plan_coord(const mf_schedule *s, int bucket, int64_t rank);
/* 0 when every Distinct tensor of s has global names of the rename form,
 * else -1 with a message naming the first tensor that lacks them. */
int mf_ckpt_plan_check_global(const mf_schedule *s, char *err, size_t errlen);
/* Index of the plan tensor named `name`, or -1. */
int mf_ckpt_plan_find(const mf_ckpt_plan *p, const char *name);

#endif
