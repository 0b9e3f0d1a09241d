/*
 * mf_plan_report: what `mfsdpc plan` prints (docs/plan.md §4): the front as
 * a table, the reasons for each unit's layout, the message when nothing
 * fits, and the confirmation that the written spec gives the search's
 * figures under the passes `explain` and `simulate` run.
 */
#ifndef MF_PLAN_REPORT_H
#define MF_PLAN_REPORT_H

#include "mf_plan_search.h"

/* The front on stdout; `chosen` (may be NULL) is marked. */
void mf_plan_report_print_front(const mf_plan_search *ps, const char *input, int64_t budget, const mf_ps_point *chosen);

/* For each auto group, the chosen layout against every other choice of that
 * group with the rest of the plan fixed (simulated). 0, or -1 with ps->err. */
int mf_plan_report_explain_choice(mf_plan_search *ps, const mf_ps_point *chosen, int64_t budget);

/* The message on stderr when no front point fits; returns 1. */
int mf_plan_report_infeasible(const mf_plan_search *ps, int64_t budget);

/* Compiles and verifies `text` (the spec to be written) as `compile` does,
 * computes its peak (mf_plan_mem_of) and step time (mf_simulate) with the
 * search's options, prints them, and checks they equal pt's. 0 when they do;
 * 1 (message printed) otherwise. */
int mf_plan_report_confirm(const mf_plan_search *ps, const char *path, const char *text, const mf_ps_point *pt);

/* An SVG picture of the front (memory on x, step time on y; the chosen
 * point red, the budget dashed). 0, or -1 on a write error. */
int mf_plan_report_front_svg(FILE *out, const mf_plan_search *ps, int64_t budget, const mf_ps_point *chosen);

/* The layouts of a point, e.g. "embed=hfsdp layers.{i}=hsdp(no reshard)". */
void mf_plan_report_point_layouts(const mf_plan_search *ps, const mf_ps_point *pt, char *buf, size_t size);

#endif
