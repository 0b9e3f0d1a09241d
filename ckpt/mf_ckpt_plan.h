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
 * same combination. A Distinct tensor without global names has no plan
 * (mf_ckpt_plan_build refuses it, naming the tensor).
 *
 * The split form (`global "W" split D`): combination k's plan tensor is
 * named W too (its `name`; `mt` numbers the checkpoint tensors, which such
 * plan tensors share) and stays in local elements, but the checkpoint
 * tensor is the global W (gdims: dims[D] x combinations), of which local
 * element i is global element (i / run) * grow + gbase + i % run (run =
 * dims[D] x ... x dims[ndims-1], grow = run x combinations, gbase = k x
 * run; for D = 0 one run, contiguous). Pieces never cross a run, so each
 * piece is one contiguous element range of W (mf_ckpt_plan_gstart), and the
 * pieces of every combination tile W exactly once. Any other tensor has
 * run = numel, grow = 0, gbase = 0: global elements are local ones.
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
    int split;              /* D of the split form, -1 when none */
    int mt;                 /* checkpoint tensor: plan tensors named alike share one */
    int64_t gdims[MF_MAX_DIMS]; /* the checkpoint tensor's dims (== dims unless split) */
    int64_t run, grow, gbase;   /* local -> global elements (see above) */
} mf_ckpt_ptensor;

typedef struct mf_ckpt_piece {
    int tensor;             /* index into plan.t */
    int64_t start, end;     /* tensor-local elements [start, end) */
    int64_t writer;         /* world rank */
} mf_ckpt_piece;

typedef struct mf_ckpt_plan {
    int64_t world;
    int ntensors;
    int nmt;                /* checkpoint tensors: plan tensors by distinct name */
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
/* 0 when every Distinct tensor of s has global names (rename or split
 * form), else -1 with a message naming the first tensor that lacks them. */
int mf_ckpt_plan_check_global(const mf_schedule *s, char *err, size_t errlen);
/* Index of the plan tensor named `name`, or -1 (the split form: the
 * first combination's). */
int mf_ckpt_plan_find(const mf_ckpt_plan *p, const char *name);
/* Index of the plan tensor named `name` of coordinate combination coord
 * (-1: not Distinct), or -1: matches one plan's tensor with another's
 * (mfsdpc reshard-plan) where a split form's combinations share a name. */
int mf_ckpt_plan_find_coord(const mf_ckpt_plan *p, const char *name, int64_t coord);
/* The global element (of the checkpoint tensor) of local element i of plan
 * tensor pt (see above; i's run continues contiguously in W). */
int64_t mf_ckpt_plan_gstart(const mf_ckpt_ptensor *pt, int64_t i);
/* The local -> global map of tensor `index` of bucket `bucket` held by
 * coordinate combination c (see above), and its global dims into gdims
 * (may be NULL). Returns the split dim, or -1 when the tensor is not split. */
int mf_ckpt_plan_gmap(const mf_schedule *s, int bucket, int index, int64_t c, int64_t *run, int64_t *grow,
                      int64_t *gbase, int64_t *gdims);
/* A load's refusal of a split global tensor whose Distinct axes changed
 * size: 0 when for every split tensor of s each of its bucket's Distinct
 * axes that the checkpoint's mesh (naxes names and sizes) also has has the
 * same size there, else -1 with a message naming the tensor and the axis. */
int mf_ckpt_plan_check_split(const mf_schedule *s, int naxes, char *const *axis_name, const int64_t *axis_size,
                             char *err, size_t errlen);
/* The number of coordinate combinations of bucket b's Distinct axes (1
 * when none). */
int64_t mf_ckpt_plan_combos(const mf_schedule *s, int b);

#endif
