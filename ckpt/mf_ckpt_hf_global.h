/*
 * mf_ckpt_hf_global: the global model a Hugging Face export writes and an
 * import reads (docs/checkpoint.md, "Hugging Face" and "Distinct tensors"),
 * computed from the schedule alone, identically on every rank.
 *
 * A tensor that is not Distinct is one global tensor under its own name. A
 * tensor Distinct on some axes (docs/semantics.md §4.7) holds a different
 * tensor per coordinate combination c of its bucket's Distinct axes
 * (row-major, outermost first: mf_ckpt_plan_coord) and needs global names
 * (mf_tensor.global, docs/language.md §3.4):
 *   - rename: coordinate c's tensor is the global tensor global[c], of the
 *     local tensor's shape (one global tensor per coordinate);
 *   - split D: one global tensor global[0], the coordinates' tensors
 *     concatenated along dim D in coordinate order: its dims[D] is the local
 *     dims[D] times the number of combinations nc.
 * Invariants: the global tensors are listed in the checkpoint plan's order
 * (bucket, then coordinate combination, then declaration: mf_ckpt_plan.h),
 * a split tensor once, at coordinate 0, so an export's files are the same
 * bytes as mfsdp-ckpt's export of a native checkpoint of the same weights;
 * every element of every global tensor is the image of exactly one
 * (coordinate, local element) pair, so replicas of a coordinate that split
 * their held range write every byte once.
 *
 * The local -> global element map of a coordinate's tensor is the
 * checkpoint plan's (mf_ckpt_plan_gmap, ckpt/mf_ckpt_plan.h): local element
 * i is global element (i / run) * grow + gbase + i % run, run elements
 * contiguous in both; for a split along D, run = dims[D] x ... (the rest),
 * grow = run x combinations, gbase = coordinate x run, so a local range is
 * one run for D = 0 and one run per outer index (strided) for D > 0; for
 * any other tensor run = numel, grow = gbase = 0 (mf_hf_global_run).
 */
#ifndef MF_CKPT_HF_GLOBAL_H
#define MF_CKPT_HF_GLOBAL_H

#include <stddef.h>
#include <stdint.h>

#include "mf_ckpt_hf.h"
#include "mf_schedule.h"

/* Where one local tensor of one coordinate lands in the global model. */
typedef struct mf_hf_place {
    int global;             /* index into mf_hf_global.shape */
    int64_t run, grow, gbase; /* the local -> global map (see above) */
} mf_hf_place;

/* One contiguous run: n local elements from `local` are global elements
 * from `global` of the same global tensor. */
typedef struct mf_hf_run {
    int64_t local, global, n;
} mf_hf_run;

typedef struct mf_hf_global {
    int n;                  /* global tensors */
    mf_hf_shape *shape;     /* n + 1: global name (borrowed from the schedule), global dims */
    int *slot;              /* per schedule tensor and coordinate combination: its global tensor */
    int *at;                /* per schedule tensor (schedule order): its first slot */
    int *tbase;             /* per bucket: the schedule-order index of its first tensor */
} mf_hf_global;

/* The global model of s. 0; -1 with a message naming the tensor and the
 * fix for a Distinct tensor without global names, or when out of memory
 * (*g then empty). Release with mf_hf_global_free. */
int mf_hf_global_build(const mf_schedule *s, mf_hf_global *g, char *err, size_t errlen);
void mf_hf_global_free(mf_hf_global *g);
/* Index of the global tensor named `name` in g, or -1. */
int mf_hf_global_find(const mf_hf_global *g, const char *name);
/* Where tensor `index` of bucket `bucket` of s, at coordinate combination
 * coord (mf_ckpt_plan_coord; -1 when the bucket has no Distinct axis),
 * lands in g. */
mf_hf_place mf_hf_global_place(const mf_hf_global *g, const mf_schedule *s, int bucket, int index, int64_t coord);
/* The run of place p that holds local element `at`, cut at local element
 * end (at < end): *r = {at, its global element, how many follow it
 * contiguously in both, at most end - at}. */
void mf_hf_global_run(const mf_hf_place *p, int64_t at, int64_t end, mf_hf_run *r);
#endif
