/*
 * mf_plan_search: the search of `mfsdpc plan` (docs/plan.md §3).
 *
 * A group is one unit declaration of the spec (a loop's units share one
 * choice, so the written spec keeps the loop). A group declared `layout auto`
 * chooses among the built-in layouts that fit the mesh (mf_builtin_layouts.h,
 * those with equal placements counted once) and, when the chosen weight is
 * sharded and the unit does not set it, reshard_after_forward true/false;
 * every other group keeps what the spec says. Unless the spec sets them, the
 * prefetch depth is chosen from 1..3 and bucket_size from a ladder. A
 * candidate is one choice per group plus the two settings; candidate index
 * i numbers them with prefetch slowest, then bucket_size, then the groups in
 * declaration order, the last fastest (mixed radix).
 *
 * A candidate's figures come from the compiler's own code: the layout,
 * transition, lowering and buffer assignment passes and mf_plan_mem_of
 * (peak memory per rank: allocated bytes + optimizer state), and
 * mf_simulate (step time, bytes per axis, overlap) -- exactly what
 * `explain` and `simulate` print for the spec the planner writes.
 *
 * The front is the set of candidates no other candidate dominates (less or
 * equal memory and step time, one of them less); candidates with equal memory
 * and step time are one point, represented by the one with fewer outer bytes,
 * then the earliest in enumeration order. The search is exact: it evaluates a
 * candidate unless a front point already found is at most its lower bounds
 * on memory and step time with one strictly below -- from the spec
 * (mf_plan_bound.c), from its planned buckets (mf_plan_tbound.c and the
 * memory bound here), from its lowered schedule -- and a candidate so
 * skipped is dominated by that point.
 */
#ifndef MF_PLAN_SEARCH_H
#define MF_PLAN_SEARCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mf_hash.h" /* mf_hash, and mf_vec through mf_arena.h */
#include "mf_plan_mem.h"
#include "mf_simulate.h"
#include "mf_spec.h"

struct mf_ast;

typedef struct mf_ps_choice {
    int layout;             /* index into the search's spec layouts */
    int builtin;            /* built-in entry, -1 for a group that keeps its layout */
    bool reshard;
} mf_ps_choice;

#define MF_PS_FIFO 10 /* values per choice in mf_ps_group.lb_fifo */

typedef struct mf_ps_group {
    const char *name;       /* the declaration's name as written ("layers.{i}") */
    int first_unit, nunits; /* spec units [first, first + n) */
    bool is_auto;
    bool reshard_set;       /* the unit sets reshard_after_forward itself */
    int nchoices;
    mf_ps_choice *choices;
    /* lower-bound contributions per choice (mf_plan_bound.c), nchoices rows */
    double *lb_persistent;  /* bytes per rank, incl. optimizer state */
    double *lb_wf, *lb_gl;  /* per choice: weight_full and grad_local bytes of one unit */
    double *lb_bytes;       /* per choice x axis: bytes per rank per step */
    double *lb_fixed;       /* per choice x axis: launch + latency seconds per step (no merging) */
    double *lb_head, *lb_tail; /* per choice: chains before its first forward, after its last backward */
    double *lb_t2;          /* per choice: T2 chain seconds of one unit (no merging) */
    double *lb_fifo;        /* per choice x MF_PS_FIFO: one T3 of the unit's layouts on the
                               inner and outer streams, one T2 of its sharded ones on each,
                               then 1 where such a T2 has an all_gather, then the T3 and
                               T2 seconds again without the fixed terms (mf_plan_bound.c,
                               compute_chain) */
    double *lb_drain;       /* per choice x 4: last-microbatch T3 + T4 seconds per unit on the
                               inner and outer streams (bandwidth), then their fixed parts */
} mf_ps_group;

/* One evaluated candidate. */
typedef struct mf_ps_point {
    int64_t index;          /* enumeration order */
    int prefetch;
    int64_t bucket_size;
    int *choice;            /* per group, owned by the search */
    mf_plan_mem mem;
    double lb_planned;      /* the search's lower bound of mem.peak from the planned buckets */
    double lb_planned_time; /* its lower bound of step_time from them (0: not computed) */
    double step_time;       /* simulated, plus optimizer_time */
    double optimizer_time;  /* the modelled optimizer step (muon; 0 for adamw, not modelled) */
    double overlap;
    double comm_exposed;
    int64_t bytes[MF_MAX_AXES];
    int64_t outer_bytes;    /* bytes per rank per step on every axis but the innermost */
} mf_ps_point;

typedef struct mf_ps_options {
    int64_t optimizer_bytes;
    bool muon;              /* --optimizer muon: Whole layouts searched, the optimizer step
                               modelled (mf_plan_owners_muon_seconds), no tensor fusion */
    double optimizer_flops; /* FLOP/s per rank of the Newton-Schulz steps */
    bool muon_all;          /* --muon-all: Newton-Schulz on every 2-D tensor, the
                               embedding and the head included */
    const char **adamw;     /* set by mf_plan_search_init (owned by the search): the
                               tensors the Muon recipe gives to AdamW (mf_plan_muon_adamw) */
    int nadamw;
    mf_sim_config sim;      /* cost model and compute model, as simulate takes them */
    bool exhaustive;        /* evaluate every candidate (for tests) */
} mf_ps_options;

typedef struct mf_plan_search {
    const mf_spec *base;    /* borrowed: the spec as written (auto units hold zero3) */
    mf_spec spec;           /* candidate spec: base + built-in layouts, units rewritten */
    mf_ps_options opt;
    int ngroups;
    mf_ps_group *groups;
    int nprefetch;
    int prefetch[3];
    int nbucket;
    int64_t bucket[4];
    int64_t ncandidates;
    int64_t evaluated;      /* candidates compiled and simulated */
    int64_t memory_only;    /* candidates laid out only: the memory bound from their buckets and
                               their time bound were dominated */
    int64_t sim_pruned;     /* candidates dominated by their exact memory and the step time
                               simulated before the buffer assignment (a lower bound) */
    double compute_time;    /* seconds, the same for every candidate */
    double *fwd, *bwd;      /* per unit compute seconds (mf_simulate_unit_times of the first
                               candidate; they depend on the tensors only) */
    double *lb_scratch;     /* 7 x nunits, for mf_plan_search_lower_bounds */
    const double **lb_fifo_of; /* nunits, for mf_plan_search_lower_bounds */
    struct mf_ps_live_item *lb_items; /* nunits, for mf_plan_search_lower_bounds */
    FILE *sink;             /* diagnostics of candidate compilations (none expected) */
    struct mf_trans_cache *tcache; /* transitions per bucket signature, shared by the candidates */
    mf_vec memo;            /* figures computed per laid-out schedule */
    mf_hash memo_index;     /* a laid-out schedule's key (memo_of) -> its memo entry */
    uint8_t *memo_key;      /* the key being built, memo_key_cap bytes */
    size_t memo_key_cap;
    int64_t reused;         /* candidates whose laid-out schedule was seen before */
    int *layout_canon;      /* spec.nlayouts entries, for mf_plan.layout_canon */
    int nfront;
    mf_ps_point *front;     /* sorted by memory, then step time */
    char err[512];
} mf_plan_search;

/* Sets up the search over base (borrowed; its arena must outlive the search)
 * with the AST it came from (for the unit declarations). 0, or -1 with a
 * message in ps->err. */
int mf_plan_search_init(mf_plan_search *ps, const mf_spec *base, const struct mf_ast *ast, const mf_ps_options *opt);
void mf_plan_search_free(mf_plan_search *ps);

/* Runs the search; fills ps->front. 0, or -1 with a message in ps->err. */
int mf_plan_search_run(mf_plan_search *ps);

/* The chosen point: lowest step time with peak <= budget, ties to less
 * memory, then fewer outer bytes, then enumeration order; NULL when none fits. */
const mf_ps_point *mf_plan_search_choose(const mf_plan_search *ps, int64_t budget);

/* Evaluates one candidate (prefetch, bucket_size, choice per group) into *pt
 * (pt->choice must point to ngroups ints). 0, or -1 with ps->err. */
int mf_plan_search_evaluate(mf_plan_search *ps, int prefetch, int64_t bucket, const int *choice, mf_ps_point *pt);
/* Same, but when lb_time >= 0 stops (returns 1, not simulated) as soon as
 * a front point dominates its bounds (lb_time and the tighter ones it
 * computes). planned: NULL, or the bounds on memory and step time from its
 * planned buckets, already computed. */
int mf_plan_search_evaluate_pruned(mf_plan_search *ps, int prefetch, int64_t bucket, const int *choice, double lb_time,
                                   const double *planned, mf_ps_point *pt);

/* Lower bounds of a candidate (mf_plan_bound.c). */
int mf_plan_search_bounds_prepare(mf_plan_search *ps);
void mf_plan_search_lower_bounds(const mf_plan_search *ps, int prefetch, int64_t bucket, const int *choice,
                                 double *lb_mem, double *lb_time);

/* Lower bounds on the step time of a laid-out plan whose transitions are
 * planned, before the lowering, one per prefetch depth in prefetch[0..n)
 * (the plan's own is not read) into out[]; 0 until the compute times are
 * known (ps->fwd). 0, or -1 on OOM. mf_plan_tbound_time_bounds
 * (mf_plan_tbound.h) with what it reads of the search. */
struct mf_plan;
int mf_plan_search_planned_time_bounds(const mf_plan_search *ps, const struct mf_plan *p, const int *prefetch, int n,
                                       double *out);

/* The arena bound (mf_plan_bound.c): units [a, z] whose weight_full (wf
 * bytes, 0 when none) and grad_local (gl) are one bucket's, or one unit's
 * elements' share of its buckets'; nr: the units keep their weight after
 * forward; t2_stage and t3_after (0 when unknown) the bytes of the buffers
 * the extension of core/mf_live.c keeps live after the hook that issues
 * T2 and T3. Returns a lower bound on the bytes of those buffers live at one
 * instant, hence on the arena. scratch: 2 x nunits doubles. */
typedef struct mf_ps_live_item {
    int a, z;
    double wf, gl;
    bool nr;
    double t2_stage;        /* T2 stage buffers read by a step on a communication stream */
    double t3_after;        /* grad_local and T3 stage buffers read by such a step */
} mf_ps_live_item;
double mf_plan_search_arena_bound(int nunits, int prefetch, const mf_ps_live_item *it, int n, double *scratch);

/* Seconds of the optimizer step the search adds to a candidate's simulated
 * step time: mf_plan_owners_muon_seconds with muon, else 0 (not modelled). */
double mf_plan_search_optimizer_seconds(const mf_ps_options *opt, const mf_schedule *s);

/* Name of the layout of choice c of group g ("hsdp", or the spec's own). */
const char *mf_plan_search_layout_name(const mf_plan_search *ps, int g, int c);

#endif
