/*
 * mf_plan_write: the spec `mfsdpc plan` writes (docs/plan.md §4): the input
 * text with each `layout auto` replaced by the chosen built-in layout name,
 * `reshard_after_forward false;` added to a unit that chose it, and
 * `prefetch` / `bucket_size` added after the mesh statement when the chosen
 * values are not the defaults. Comments, loops and everything else stay as
 * written, so the output reads like the input.
 */
#ifndef MF_PLAN_WRITE_H
#define MF_PLAN_WRITE_H

#include "mf_plan_search.h"

/* Returns the new text (owned, NUL-terminated) for point pt, or NULL on OOM.
 * src/len is the input text, ast its tree; header is a comment line to put
 * first (without the leading '#'), or NULL. */
char *mf_plan_write_spec(const mf_plan_search *ps, const struct mf_ast *ast, const char *src, size_t len,
                         const mf_ps_point *pt, const char *header);

#endif
