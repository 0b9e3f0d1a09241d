/*
 * mf_limits: the one table of input limits. The language (the lexer and
 * planner/passes/mf_sema.c), the schedule loader (core/mf_load.c) and the planner's
 * search (planner/plan/mf_plan_search.c) all refuse input beyond these, with a
 * message naming the limit; docs/language.md and docs/schedule.md state
 * them. A schedule the compiler can write is always one the loader takes.
 */
#ifndef MF_LIMITS_H
#define MF_LIMITS_H

#include "mf_schedule.h"

enum {
    MF_LIMIT_AXES = MF_MAX_AXES,          /* mesh axes */
    MF_LIMIT_WORLD = 1 << 24,             /* ranks: the product of the axis sizes (so each size too) */
    MF_LIMIT_MICROBATCHES = 65536,        /* microbatches per step */
    MF_LIMIT_UNITS = 65536,               /* units, after loop expansion */
    MF_LIMIT_TENSORS = 1 << 20,           /* tensors in all, after loop expansion */
    MF_LIMIT_DIMS = MF_MAX_DIMS,          /* dimensions of a tensor */
    MF_LIMIT_PREFETCH = 1024,             /* units of prefetch */
    MF_LIMIT_NAME_BYTES = 1 << 20,        /* bytes of one name (unit, tensor, axis, layout) */
    MF_LIMIT_PLAN_CANDIDATES = 4000000,   /* candidates `plan` searches (a few seconds) */
    MF_LIMIT_PLAN_EXHAUSTIVE = 100000,    /* ... with --exhaustive, each one simulated */
    /* Every count, length, offset and size is an int64_t: a product or sum
     * past it "overflows 64 bits"; the checks on the spec keep every value
     * within its magnitude, "63 bits" (the sema, the layout pass, the
     * structural rules say which one, with these). */
    MF_LIMIT_INT_BITS = 64,
    MF_LIMIT_MAGNITUDE_BITS = MF_LIMIT_INT_BITS - 1,
};
_Static_assert(MF_LIMIT_INT_BITS == 8 * sizeof(int64_t), "counts and sizes are int64_t");

#endif
