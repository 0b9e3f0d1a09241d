/*
 * mf_passes: the compiler pipeline, one pass per file:
 *
 *   mf_parse          grammar/   text      -> AST
 *   mf_sema_run       mf_sema.c  AST       -> resolved spec   (all docs/language.md §4 rules)
 *   mf_layout_pass_run     mf_layout_pass.c     -> units, buckets   (docs/semantics.md §3)
 *   mf_transition_run mf_transition.c      -> T1..T4 steps     (docs/semantics.md §4; the rules
 *                                          of T1..T4: mf_trans_rules.h)
 *   mf_lower_run      mf_lower.c           -> buffers, ops, events
 *   mf_assign_run     mf_assign.c          -> offsets in the persistent region and the arena
 *                                          (docs/semantics.md §10; mf_assign.h)
 *   mf_programs_run   mf_programs.c        -> short-step and evaluation programs
 *                                          (docs/schedule.md §3.1; mf_programs.h)
 *   mf_verify_run     core/mf_verify.c         checks a schedule (docs/schedule.md §5): the core's
 *                                          structural rules (core/mf_struct.c), then
 *                                          the abstract replay
 *   mf_emit_yaml      mf_emit.c            schedule -> canonical YAML
 *
 * Each pass reports into an mf_diag and returns false when it found errors;
 * the driver (mf_pipeline.c) stops at the first pass with errors. The passes
 * are planner/passes/, the bottom layer of the planner (docs/design.md §5).
 */
#ifndef MF_PASSES_H
#define MF_PASSES_H

#include <stdio.h>

#include "mf_ast.h"
#include "mf_plan.h"
#include "mf_verify.h"

/* Borrows ast; returns a spec allocated in `a`, or NULL when errors were reported. */
mf_spec *mf_sema_run(const mf_ast *ast, mf_diag *d, mf_arena *a);

/* mf_plan_new, mf_plan_free: mf_plan.h. */

bool mf_layout_pass_run(mf_plan *p, mf_diag *d);
/* The cost the Whole packing balances for a tensor (docs/semantics.md §4.6):
 * numel, or with `balance flops` rows*cols*min(rows, cols). */
int64_t mf_layout_pass_whole_cost(mf_balance balance, int ndims, const int64_t *dims, int64_t numel);
bool mf_transition_run(mf_plan *p, mf_diag *d);
bool mf_lower_run(mf_plan *p, mf_diag *d);
/* The lowering's last step, which mf_lower_run runs unless p->lazy_summary:
 * the schedule's summary, checked against the plan's totals. */
bool mf_lower_summarize(mf_plan *p, mf_diag *d);

/* mf_verify_run: core/mf_verify.h (the runtime runs it on every load). */

/* Writes the canonical YAML of s to out. Returns 0, or -1 on a write error. */
int mf_emit_yaml(const mf_schedule *s, FILE *out);

#endif
