/*
 * mf_plan_tbound: lower bounds on the step time of a laid-out plan whose
 * transitions are planned, before the lowering runs (docs/plan.md §3; the
 * argument: mf_plan_tbound.c). A layer below the search: the search
 * (mf_plan_search.c) calls it and passes in what it reads of the search --
 * the per-unit compute seconds, the simulator's stream configuration and
 * the optimizer step it adds to a schedule's step time -- so this module
 * includes nothing of the search (no include circle).
 *
 * Invariant: each bound is at most the step time the search figures for the
 * lowered schedule (mf_simulate's step time plus optimizer_seconds).
 */
#ifndef MF_PLAN_TBOUND_H
#define MF_PLAN_TBOUND_H

#include "mf_schedule.h"
#include "mf_simulate.h"

struct mf_plan;

/* What the bound reads of its caller; everything borrowed. */
typedef struct mf_plan_tbound_in {
    const double *fwd, *bwd;    /* per unit compute seconds; NULL while not known (every bound 0) */
    const mf_sim_config *sim;   /* single_stream, host_async: as the simulator runs */
    /* seconds of the optimizer step added to schedule s's simulated step time */
    double (*optimizer_seconds)(const void *ctx, const mf_schedule *s);
    const void *ctx;            /* optimizer_seconds' first argument */
} mf_plan_tbound_in;

/* One bound per prefetch depth in prefetch[0..n) (the plan's own is not
 * read) into out[]; all 0 until in->fwd and in->bwd are known or when the
 * plan has no transitions. 0, or -1 on OOM. */
int mf_plan_tbound_time_bounds(const mf_plan_tbound_in *in, const struct mf_plan *p, const int *prefetch, int n,
                               double *out);

#endif
