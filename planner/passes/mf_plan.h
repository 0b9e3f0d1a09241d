/*
 * mf_plan: what the layout and transition passes produce and the lowering
 * pass consumes.
 *
 *   mf_layout_pass   spec -> plan->sched: units, buckets (tensor offsets,
 *                    padded lengths, placements, dtypes)
 *   mf_transition    plan -> plan->trans: T1..T4 of every bucket as
 *                    single-axis steps in the order docs/semantics.md §2 forces
 *   mf_lower         plan -> plan->sched: buffers, ops, events
 *
 * Ownership: a plan borrows its spec; it owns its schedule (plan->sched) until
 * a caller takes it (sets plan->sched to NULL); steps live in plan->arena.
 */
#ifndef MF_PLAN_H
#define MF_PLAN_H

#include "mf_cost.h"
#include "mf_spec.h"
#include "mf_trans_rules.h" /* MF_T1..MF_T4, MF_NTRANSITIONS */

typedef struct mf_step {
    mf_opkind kind;         /* all_gather, reduce_scatter, all_reduce, slice, cast, accumulate */
    int axis;               /* mesh axis; -1 for cast and accumulate */
    mf_dtype dtype;         /* element type produced (and moved) */
    mf_placement from, to;  /* placement before and after this step */
    int64_t count;          /* elements per rank, NCCL convention */
    int64_t bytes;          /* bytes sent per rank per launch (ring), 0 for local steps */
    mf_stream stream;       /* collectives: inner for the innermost axis, outer for
                               the others; local steps: the stream of the collective
                               they feed or follow (mf_transition.c) */
} mf_step;

typedef struct mf_transition {
    int id;                 /* 1..4 */
    mf_when when;           /* T1 first, T2 every, T3 every, T4 last */
    mf_placement from, to;
    mf_dtype from_dtype, to_dtype;
    int nsteps;             /* 0 when nothing moves (e.g. T2 with W = Rep) */
    mf_step *steps;
    const char *why;        /* why this composition, when several were legal; else NULL */
    double cost;            /* modeled seconds per launch of the whole transition */
    /* per stream: modeled seconds of the steps on it, of the steps before
       the first of them and of those after the last (0 when none is on it);
       has_on: some step is on it (the plan search's time bound,
       mf_plan_tbound.c) */
    double on[MF_STREAM_COUNT], before[MF_STREAM_COUNT], after[MF_STREAM_COUNT];
    bool has_on[MF_STREAM_COUNT];
} mf_transition;

/* Transitions already built, keyed by what they depend on: a bucket's
 * dtypes, placements and padded length and the schedule's alignment (the
 * mesh and cost model must be the same for every plan that shares one:
 * the plan search's candidates). Owned by whoever created it
 * (mf_transition_cache_new/free, mf_transition.c); steps live in its arena. */
typedef struct mf_trans_cache mf_trans_cache;
mf_trans_cache *mf_transition_cache_new(void);
void mf_transition_cache_free(mf_trans_cache *c);

typedef struct mf_plan {
    mf_arena *arena;
    const mf_spec *spec;    /* borrowed */
    mf_schedule *sched;     /* owned until taken */
    mf_transition (*trans)[MF_NTRANSITIONS]; /* per bucket, indexed by bucket id */
    mf_cost_model cost;
    bool quiet;             /* skip the human-readable text no figure depends on:
                               transitions' `why` (and the search for the
                               alternative it names); bucket and buffer names
                               are their unit's, unit and tensor names are
                               borrowed from the spec (which must outlive the
                               plan); set by the plan search, whose candidates
                               are never printed */
    bool lazy_summary;      /* mf_lower_run leaves the schedule's summary and its
                               cross-check against the plan to
                               mf_lower_summarize (the plan search: only
                               candidates it finishes need them; the step
                               time and the peak do not read them) */
    mf_trans_cache *tcache; /* borrowed, or NULL: the transition pass reuses
                               (and fills) it; set only with quiet; the
                               plan's transitions then point to steps in the
                               cache's arena, so it must outlive the plan */
    int *layout_canon;      /* borrowed, or NULL: spec->nlayouts entries, each spec
                               layout's canonical index (mf_layout_pass.c), filled
                               by the first layout pass that finds entry 0 < 0;
                               shared by plans of one spec's layouts */
} mf_plan;

/* Returns an owned plan over `spec` (borrowed) with an empty schedule; cost may
 * be NULL for the defaults. NULL on OOM. */
mf_plan *mf_plan_new(const mf_spec *spec, const mf_cost_model *cost);
/* Takes the plan (and its schedule, unless taken). */
void mf_plan_free(mf_plan *p);

#endif
