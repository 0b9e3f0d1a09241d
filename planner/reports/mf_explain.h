/*
 * mf_explain: renders a planned spec (layout + transitions, before lowering)
 * for humans (text, like SQLite's EXPLAIN or `luac -l`) or tools (YAML, the
 * same data in a canonical order). Reads the plan only.
 */
#ifndef MF_EXPLAIN_H
#define MF_EXPLAIN_H

#include <stdio.h>

#include "mf_plan.h"

/* Both borrow the plan (after mf_transition_run) and return 0, or -1 on a
 * write error or OOM. */
int mf_explain_text(const mf_plan *p, FILE *out);
int mf_explain_yaml(const mf_plan *p, FILE *out);

#endif
