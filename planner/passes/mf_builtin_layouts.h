/*
 * mf_builtin_layouts: the layouts every spec may name without declaring them
 * (docs/plan.md §1): ddp, zero1, zero2, zero3, hsdp,
 * hsdp_nosync, hfsdp, fsdp2d, zero2_inner_zero1_outer and their 3-axis
 * analogues. One table (mf_builtin_layouts.c) is the only place their
 * placements live; sema resolves a name it does not find among the declared
 * layouts here, and `mfsdpc plan` searches over them.
 *
 * Every built-in layout keeps weight in bf16 and grad and main_weight in
 * fp32. A declared layout of the same name shadows the built-in one.
 */
#ifndef MF_BUILTIN_LAYOUTS_H
#define MF_BUILTIN_LAYOUTS_H

#include <stdbool.h>

#include "mf_schedule.h"

/* The keyword of a unit whose layout the planner chooses. */
#define MF_LAYOUT_AUTO "auto"

/* Number of entries in the table (some apply only to some mesh ranks). */
int mf_builtin_count(void);
/* Name of entry i (0 <= i < mf_builtin_count()). */
const char *mf_builtin_name(int i);
/* Index of `name`, or -1. */
int mf_builtin_layouts_find(const char *name);
/* Whether entry i applies to a mesh of naxes axes. */
bool mf_builtin_layouts_fits(int i, int naxes);
/* Mesh ranks entry i applies to, e.g. "2 or 3" (static text). */
const char *mf_builtin_ranks(int i);
/* Fills dtypes and placements of entry i on a mesh of naxes axes; false when
 * it does not apply to that rank. */
bool mf_builtin_layouts_resolve(int i, int naxes, mf_dtype dtype[MF_ROLE_COUNT], mf_placement place[MF_ROLE_COUNT]);
/* Which roles of entry i are Whole on their Flat axes (zero3_whole,
 * hsdp_whole, hfsdp_whole: grad and main_weight; docs/semantics.md §4.6). */
void mf_builtin_layouts_whole(int i, bool whole[MF_ROLE_COUNT]);

#endif
