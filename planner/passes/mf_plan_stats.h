/*
 * mf_plan_stats: numbers derived from a plan after the layout and transition
 * passes, shared by `mfsdpc explain` and by the lowering pass, which
 * cross-checks its compiled schedule's summary against them.
 *
 * Layout quanta (docs/semantics.md §3), for one bucket with role dtypes dt[] and
 * placements pl[]:
 *   tensor quantum  T = lcm over roles of 16 / gcd(16, size): every tensor
 *                   offset is a multiple of T, i.e. 16-byte aligned in every
 *                   role's dtype.
 *   shard quantum   A = lcm over roles of align / gcd(align, size): a shard
 *                   length that is a multiple of A starts every shard on
 *                   `align` bytes in every role's dtype.
 *   pad start       s* = the outermost Flat-suffix start any placement of the
 *                   bucket's transitions may use: the roles' own suffixes, and
 *                   i+1 for an axis i that T3 or T4 reduces to Replicate while
 *                   every axis inside it can be made Flat (the bandwidth-optimal
 *                   composition reduce-scatters inside i before reducing i).
 *   length          L = a multiple of A * prod_{j >= s*} n_j (at least one
 *                   such quantum): every placement with Flat suffix s >= s* has
 *                   equal shards, each a multiple of A elements.
 *
 * Memory per rank (bytes), per bucket, assuming the buffers of
 * core/mf_schedule.h:
 *   persistent  main_weight   L/S_O * size(O dtype)
 *               weight        L/S_W * size(W dtype)      weight at rest
 *               grad          L/S_G * size(G dtype)      accumulation buffer
 *               grad_final    L/S_O * size(G dtype)      only when G != O
 *   transient   weight_full   L * size(W dtype)          only when W != Rep
 *               grad_local    L * size(G dtype)          the trainer's microbatch gradient
 *               weight_stage  one buffer per T1/T2 step output that is not the
 *                             transition's last (the weight or weight_full)
 *               grad_stage    one buffer per T3 collective output (the
 *                             accumulate reads the last one) and per T4 step
 *                             output that is not the last (grad_final)
 * (S_x is the number of shards of placement x). Transients count per unit
 * (a bucket belongs to its first unit); the peak takes the largest sum over
 * prefetch+1 consecutive units, as mf_schedule_summarize() does.
 *
 * Runs per step (launches): T1 once, T2 M times per pre-hook (forward_pre, and
 * backward_pre again when the bucket's unit reshards after forward), T3 M
 * times, T4 once.
 */
#ifndef MF_PLAN_STATS_H
#define MF_PLAN_STATS_H

#include "mf_plan.h"

/* ---- layout quanta (computed by the layout pass, reused by transitions) ---- */

int64_t mf_layout_pass_tensor_quantum(const mf_dtype dt[MF_ROLE_COUNT]);
int64_t mf_layout_pass_shard_quantum(const mf_dtype dt[MF_ROLE_COUNT], int64_t align);
int mf_layout_pass_pad_start(const mf_mesh *m, const mf_placement pl[MF_ROLE_COUNT]);
/* The padded length for `used` elements; false when it does not fit 63 bits. */
bool mf_layout_pass_padded_length(const mf_mesh *m, const mf_dtype dt[MF_ROLE_COUNT],
                                  const mf_placement pl[MF_ROLE_COUNT], int64_t align, int64_t used,
                                  int64_t *length);

/* ---- memory ---- */

typedef struct mf_bucket_memory {
    int64_t main_weight;    /* persistent, bytes per rank */
    int64_t weight;         /* persistent: weight at rest at W */
    int64_t grad;           /* persistent: accumulation buffer at G */
    int64_t grad_final;     /* persistent: delivered gradient at O, 0 when G == O */
    int64_t weight_full;    /* transient: unsharded weight, 0 when W == Rep */
    int64_t grad_local;     /* transient: full local gradient */
    int64_t weight_stage;   /* transient: T1/T2 intermediates */
    int64_t grad_stage;     /* transient: T3/T4 intermediates */
    int64_t persistent[MF_ROLE_COUNT]; /* the above summed by role */
    int64_t transient[MF_ROLE_COUNT];
} mf_bucket_memory;

/* Memory of bucket b (needs the transition pass). */
void mf_bucket_memory_of(const mf_plan *p, int b, mf_bucket_memory *out);

typedef struct mf_plan_memory {
    int64_t persistent[MF_ROLE_COUNT];     /* bytes per rank (the most over the ranks when some bucket is ragged) */
    int64_t transient_peak[MF_ROLE_COUNT]; /* largest prefetch+1-unit window, per role */
    int64_t peak[MF_ROLE_COUNT];           /* persistent + transient_peak */
    int64_t persistent_total;
    int64_t transient_peak_total;          /* largest window of all roles together */
    int64_t peak_total;                    /* persistent_total + transient_peak_total */
} mf_plan_memory;

/* Fills out; false on OOM (out is zeroed then). */
bool mf_plan_memory_of(const mf_plan *p, mf_plan_memory *out);

/* ---- per-step totals ---- */

/* Launches per step of transition t of bucket b (0 when it has no steps). */
int64_t mf_plan_stats_transition_runs(const mf_plan *p, int b, int t);

/* Collectives per step by kind and axis, bytes per rank per step by axis, and
 * persistent / model bytes per rank by role, in the shape of the compiled
 * schedule's summary (mf_schedule_summarize()). Sums saturate at INT64_MAX.
 * False on OOM. */
bool mf_plan_totals(const mf_plan *p, mf_summary *out);

#endif
