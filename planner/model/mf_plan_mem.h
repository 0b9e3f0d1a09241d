/*
 * mf_plan_mem: memory per rank as `explain`, `simulate` and `plan` report it
 * (docs/plan.md §2, docs/semantics.md §9-10): the bytes the runtime
 * allocates (the persistent region + the transient arena of the buffer
 * assignment, the peak `explain` leads with) plus the optimizer state,
 * `--optimizer-bytes` bytes per element of main_weight held by the rank
 * (main_weight's placement; default 8 = Adam's two fp32 moments), which the
 * arena does not hold. The one function every command calls for the figure
 * `plan` budgets, so the three always agree. With ragged (whole) buckets the
 * ranks differ (docs/semantics.md §4.6): each term is the most over the
 * ranks (mem_persistent already is), so the sum bounds every rank's.
 */
#ifndef MF_PLAN_MEM_H
#define MF_PLAN_MEM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mf_plan.h"

#define MF_OPTIMIZER_BYTES_DEFAULT 8
#define MF_OPTIMIZER_BYTES_MUON 4 /* plan --optimizer muon: one fp32 momentum */

typedef struct mf_plan_mem {
    int64_t persistent;     /* persistent region, bytes per rank (the most over the ranks) */
    int64_t arena;          /* transient arena, bytes per rank */
    int64_t allocated;      /* persistent + arena: what the runtime allocates (explain's peak) */
    int64_t optimizer;      /* optimizer_bytes per main_weight element held (the most over the ranks) */
    int64_t peak;           /* allocated + optimizer: the figure plan budgets */
    bool per_rank;          /* some bucket is ragged: the ranks differ, each term is their most */
} mf_plan_mem;

/* Memory of a schedule after the buffer assignment (compiled through
 * mf_assign_run, or read from a file): its allocated bytes plus the
 * optimizer state. Borrows s. Sums saturate. */
void mf_plan_mem_of(const mf_schedule *s, int64_t optimizer_bytes, mf_plan_mem *out);

/* The optimizer state alone: optimizer_bytes per main_weight element held
 * (per bucket, the rank's main_weight range), the most over the ranks.
 * Saturates. */
int64_t mf_plan_mem_optimizer_bytes(const mf_schedule *s, int64_t optimizer_bytes);

/* Parses "--optimizer-bytes" values: an integer 0..1024. Returns 0, or -1
 * with "CMD: error: ..." on stderr. */
int mf_plan_mem_parse_optimizer_bytes(const char *cmd, const char *v, int64_t *out);

/* Parses a byte size with an optional suffix B, KiB, MiB, GiB, TiB (also KB,
 * MB, GB, TB as powers of ten), e.g. "80GiB". Returns 0, or -1 with a message
 * naming `opt` on stderr. */
int mf_plan_mem_parse_size(const char *cmd, const char *opt, const char *v, int64_t *out);

/* Writes the line with the figure `mfsdpc plan` budgets (allocated +
 * optimizer state), shared by explain and simulate. */
void mf_plan_mem_print(FILE *out, const mf_plan_mem *m, int64_t optimizer_bytes);

#endif
