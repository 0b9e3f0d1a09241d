/*
 * plan_testlib: helpers for the planner tests.
 *
 *  - tl_spec_*: build a resolved mf_spec directly (no parser needed), with
 *    placements written as letters ("RF", "PFF", ...);
 *  - tl_plan: run mf_layout_pass_run + mf_transition_run, diagnostics captured;
 *  - tl_check_layout: the invariants of docs/semantics.md §3, recomputed independently;
 *  - tl_check_transition: executes a transition's steps on concrete per-rank
 *    arrays with the op semantics of core/mf_schedule.h (values distinct
 *    per rank, microbatch and element) and compares every intermediate and the
 *    final contents with what the placement promises (mf_layout_range).
 *
 * Checks fail through cmocka assertions with a message naming the bucket,
 * transition and step.
 */
#ifndef PLAN_TESTLIB_H
#define PLAN_TESTLIB_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mf_layout.h"
#include "mf_passes.h"
#include "mf_plan_stats.h"

enum { TL_MAX_LAYOUTS = 512, TL_MAX_UNITS = 256, TL_MAX_TENSORS = 64 };

mf_placement tl_place(const char *letters);
/* A 1-D mesh `dp` of n0 ranks (naxes 1), or dp_outer = n0 x dp_inner = n1. */
mf_mesh tl_mesh(int naxes, int64_t n0, int64_t n1);

/* A spec with a mesh of naxes axes named a0..a3 (owned by the arena). */
mf_spec *tl_spec_new(mf_arena *a, int naxes, const int64_t *sizes, int64_t microbatches, mf_reduce reduce);
/* Adds a named layout; returns its index. Role spans are on line 100 + 10*index + role. */
int tl_layout(mf_arena *a, mf_spec *s, const char *name, const char *w, mf_dtype dw, const char *g, mf_dtype dg,
              const char *o, mf_dtype dmo);
/* Adds a unit with a default layout; returns its index. Its span is on line 10 + index. */
int tl_unit(mf_arena *a, mf_spec *s, const char *name, int layout, bool reshard_after_forward);
/* Adds a tensor (1-D, numel elements) to a unit; layout -1 = the unit's. */
void tl_tensor(mf_arena *a, mf_spec *s, int unit, const char *name, int64_t numel, int layout);
void tl_tensor2(mf_arena *a, mf_spec *s, int unit, const char *name, int64_t d0, int64_t d1, int layout);

/* Runs layout and transitions. Returns the plan, or NULL when a pass failed;
 * *diag (when non-NULL) gets the diagnostics text (caller frees). */
mf_plan *tl_plan(const mf_spec *s, const mf_cost_model *cost, char **diag);

void tl_check_layout(const mf_plan *p);
void tl_check_transition(const mf_plan *p, int bucket, int t);
/* Both of the above for every bucket (transitions only when world * L is at
 * most max_cells, to keep the simulator fast). */
void tl_check_plan(const mf_plan *p, int64_t max_cells);

/* A small deterministic PRNG for property tests. */
uint64_t tl_rand(uint64_t *state);
int64_t tl_rand_range(uint64_t *state, int64_t lo, int64_t hi); /* inclusive */

#endif
