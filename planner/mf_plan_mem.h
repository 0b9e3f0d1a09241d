/*
 * mf_plan_mem: memory per rank as `explain`, `simulate` and `plan` report it
 * (docs/plan.md §2): explain's model (mf_plan_memory_of, mf_plan_stats.h)
 * plus the optimizer state, `--optimizer-bytes` bytes per element of
 * main_weight held by the rank (main_weight's placement; default 8 = Adam's
 * two fp32 moments). The one function every command calls for a peak, so the
 * three always agree and the model can be exchanged in one place.
 */
#ifndef MF_PLAN_MEM_H
#define MF_PLAN_MEM_H

#include <stdbool.h>
#include <stdint.h>

#include "mf_plan.h"

#define MF_OPTIMIZER_BYTES_DEFAULT 8

typedef struct mf_plan_mem {
    int64_t peak_role[MF_ROLE_COUNT]; /* model peak by role (persistent + transient window) */
    int64_t persistent;     /* all roles, bytes per rank */
    int64_t transient_peak; /* all roles, largest prefetch+1-unit window */
    int64_t model_peak;     /* persistent + transient_peak (explain's "total peak") */
    int64_t optimizer;      /* optimizer_bytes per main_weight element held */
    int64_t peak;           /* model_peak + optimizer: the figure plan budgets */
} mf_plan_mem;

/* Memory of a planned spec (after the transition pass; the lowering is not
 * needed). Borrows p. False on OOM (out zeroed). Sums saturate. */
bool mf_plan_mem_of(const mf_plan *p, int64_t optimizer_bytes, mf_plan_mem *out);

/* Same for a schedule read from a file (no plan): the model peak is its
 * summary's (mf_schedule_summarize, which the lowering cross-checks against
 * mf_plan_memory_of). */
bool mf_sched_mem_of(const mf_schedule *s, int64_t optimizer_bytes, mf_plan_mem *out);

/* Parses "--optimizer-bytes" values: an integer 0..1024. Returns 0, or -1
 * with "CMD: error: ..." on stderr. */
int mf_parse_optimizer_bytes(const char *cmd, const char *v, int64_t *out);

/* Parses a byte size with an optional suffix B, KiB, MiB, GiB, TiB (also KB,
 * MB, GB, TB as powers of ten), e.g. "80GiB". Returns 0, or -1 with a message
 * naming `opt` on stderr. */
int mf_parse_size(const char *cmd, const char *opt, const char *v, int64_t *out);

/* Writes plan's estimate line (model + optimizer state, what `mfsdpc plan`
 * budgets; not the peak), shared by explain and simulate. */
void mf_plan_mem_print(FILE *out, const mf_plan_mem *m, int64_t optimizer_bytes);

#endif
