/*
 * mf_diff: a semantic diff of two schedules for code review (`mfsdpc diff`).
 *
 * Buckets are matched by their unit's name and their first tensor (so a
 * layout rename, e.g. layers.3/hsdp -> layers.3/hfsdp, is a change, not a
 * removal); data ops by (bucket, transition, kind, axis name), the k-th such
 * op of A with the k-th of B -- never by id. Record/wait ops are summarized,
 * not matched. See docs/schedule.md, "Reading a diff".
 */
#ifndef MF_DIFF_H
#define MF_DIFF_H

#include <stdio.h>

#include "mf_schedule.h"

/* Writes the report comparing a (named name_a) with b to out. Returns 0 when
 * the schedules are equivalent (identical canonical YAML apart from `source`
 * and `source_sha256`), 1 when they differ, -1 on OOM. Borrows everything. */
int mf_diff_schedules(const mf_schedule *a, const char *name_a, const mf_schedule *b, const char *name_b,
                      FILE *out);

#endif
