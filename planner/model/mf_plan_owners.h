/*
 * mf_plan_owners: who owns what under `Whole` (docs/semantics.md §9.1), from
 * a schedule's buckets alone (owners are derived from offsets): per shard of
 * a whole bucket, and per rank over the whole schedule. `explain` prints
 * them, `plan --optimizer muon` models the optimizer step from them, and the
 * balance benchmark (bench/whole/balance.sh) reads explain's YAML of them.
 *
 *   finest placement  of a whole bucket: its whole role with the most shards
 *                     (main_weight on a tie); its P shards refine every other
 *                     placement's, so each holds whole tensors
 *   cost              of a tensor: mf_layout_pass_whole_cost (numel, or with
 *                     `balance flops` rows*cols*min(rows, cols))
 *   Newton-Schulz     FLOPs of a 2-D tensor: MF_PLAN_NS_FLOPS x
 *                     rows*cols*min(rows, cols) (5 steps of 3 matmuls, 2 FLOPs
 *                     a multiply-add)
 */
#ifndef MF_PLAN_OWNERS_H
#define MF_PLAN_OWNERS_H

#include "mf_cost.h"
#include "mf_schedule.h"
#include "mf_spec.h"

#define MF_PLAN_NS_FLOPS 30

/* The placement of bucket b's whole role with the most shards (main_weight
 * on a tie), its role in *role when role is not NULL; NULL when no role is
 * whole. */
const mf_placement *mf_plan_owners_finest(const mf_mesh *m, const mf_bucket *b, int *role);

/* Role r's placement of bucket b, "[Partial, Whole]" where r is whole (the
 * schedule file's spelling, planner/passes/mf_emit.c), for explain and diff. */
const char *mf_plan_owners_placement(const mf_bucket *b, int r, int naxes, char *buf, size_t size);

/* The owner shard of tensor t under role r's placement of bucket b, -1 when
 * r is not whole in b (or t straddles). */
int64_t mf_plan_owners_of(const mf_mesh *m, const mf_bucket *b, int r, const mf_tensor *t);

/* The cost the packing balances (balance bytes: numel; flops:
 * rows*cols*min(rows, cols)) and the Newton-Schulz FLOPs of tensor t (0 for
 * a 1-D tensor: an elementwise optimizer's). */
int64_t mf_plan_owners_cost(mf_balance bal, const mf_tensor *t);
double mf_plan_owners_ns_flops(const mf_tensor *t);

/* One shard of a whole bucket's finest placement. */
typedef struct mf_plan_owner_shard {
    int ntensors;           /* tensors inside it */
    int first;              /* index of its first tensor in the bucket (offset order) */
    int64_t used;           /* mf_layout_shard_used */
    int64_t numel;          /* its tensors' elements */
    int64_t main_bytes;     /* numel in main_weight's dtype */
    int64_t grad_bytes;     /* numel in grad's dtype */
    int64_t cost;           /* its tensors' mf_plan_owners_cost */
} mf_plan_owner_shard;

/* Fills out[0..P) for the P shards of bucket b's finest placement (out holds
 * mf_layout_shards of it); returns P, 0 when b has no whole role. */
int64_t mf_plan_owners_shards(const mf_schedule *s, const mf_bucket *b, mf_balance bal,
                              mf_plan_owner_shard *out);

/* One rank over the whole schedule. */
typedef struct mf_plan_owner_rank {
    int64_t owned;          /* tensors whose main_weight is whole on it */
    int64_t owned_bytes;    /* their main_weight bytes */
    int64_t sharded_bytes;  /* main_weight bytes of the tensor elements it holds
                               of buckets whose main_weight is not whole */
    int64_t cost;           /* owned tensors' cost + the sharded elements it holds */
    double flops;           /* Newton-Schulz FLOPs of its owned 2-D tensors */
} mf_plan_owner_rank;

/* Fills out[0..world). */
void mf_plan_owners_ranks(const mf_schedule *s, mf_balance bal, mf_plan_owner_rank *out);

/* A lower bound on the most owned main_weight bytes (or Newton-Schulz FLOPs)
 * of a rank that ANY dealing of the whole tensors to shards must reach, for
 * the proof that a dealing cannot be beaten (docs/semantics.md §4.6):
 *   mean     the mean over the ranks (every dealing gives the same total);
 *   largest  the largest tensor (its owners hold it);
 *   pigeon   per finest main_weight placement with P shards and its tensors'
 *            values v_1 >= v_2 >= ..., for each k with kP + 1 tensors: some
 *            shard holds k + 1 of the kP + 1 largest, so at least
 *            v_{kP+1-k} + ... + v_{kP+1} (k = 1: the P-th and (P+1)-th);
 *   units    per such placement and unit u (each of its tensors' values,
 *            up to MF_PLAN_OWNERS_UNITS of them): a shard holding tensors
 *            of values v holds at least u * sum floor(v / u), so some shard
 *            holds at least u * ceil(sum over the tensors of floor(v / u) / P)
 *            (tensors of one size u: the count argument the mean misses).
 * `bound` is the largest of these, `why` names it (with its k and P, or its
 * unit and P). */
#define MF_PLAN_OWNERS_UNITS 256

typedef struct mf_plan_owner_bound {
    double mean, largest, pigeon, units, bound;
    int64_t k, P;           /* of the best pigeon term (0 when none) */
    double unit;            /* of the best units term */
    int64_t unit_P;
    const char *why;        /* "mean", "largest tensor", "pigeonhole" or "units" */
} mf_plan_owner_bound;

/* The bound on owned bytes (flops false) or on Newton-Schulz FLOPs (true);
 * false on OOM. */
bool mf_plan_owners_bound(const mf_schedule *s, bool flops, mf_plan_owner_bound *out);

/* The optimizer step of `mfsdpc plan --optimizer muon` (docs/plan.md §2):
 * Newton-Schulz on every 2-D tensor but adamw[0..nadamw) (full names, sorted:
 * mf_plan_muon_adamw, the recipe's embedding and head, which take AdamW's
 * elementwise update), at `flops` FLOP/s per rank. A tensor
 * whose main_weight is whole runs it on its owners only; any other runs it
 * on every rank, after an all_gather of its fp32 momentum over each Flat
 * axis of main_weight (one launch per tensor and axis, mf_cost_op). 1-D
 * tensors take an elementwise update, not modelled (as AdamW's is not).
 * Seconds: the most Newton-Schulz FLOPs of a rank over `flops`, plus the
 * gathers. */
double mf_plan_owners_muon_seconds(const mf_schedule *s, const mf_cost_model *cm, double flops,
                                   const char *const *adamw, int nadamw);

#endif
