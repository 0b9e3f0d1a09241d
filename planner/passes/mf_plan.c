/*
 * mf_plan: allocation of the planner's state between the layout, transition
 * and lowering passes (mf_plan.h). A plan borrows its spec and owns its
 * schedule until a caller takes it; transition steps live in plan->arena.
 */
#include "mf_plan.h"

#include <stdlib.h>

mf_plan *mf_plan_new(const mf_spec *spec, const mf_cost_model *cost)
{
    mf_plan *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->arena = mf_arena_create();
    p->sched = mf_schedule_new();
    if (!p->arena || !p->sched) {
        mf_arena_destroy(p->arena);
        mf_schedule_free(p->sched);
        free(p);
        return NULL;
    }
    p->spec = spec;
    if (cost)
        p->cost = *cost;
    else
        mf_cost_defaults(&p->cost, spec ? &spec->mesh : NULL);
    return p;
}

void mf_plan_free(mf_plan *p)
{
    if (!p)
        return;
    mf_schedule_free(p->sched);
    mf_arena_destroy(p->arena);
    free(p);
}
