/*
 * mf_programs: the short-step and evaluation programs of a schedule
 * (docs/schedule.md §3.1), derived from the training step's own data ops
 * after the buffer assignment, so they share its buffers and its arena.
 */
#ifndef MF_PROGRAMS_H
#define MF_PROGRAMS_H

#include <stdbool.h>

#include "mf_schedule.h"

/* Appends both programs to s's ops (new events, ids after the step's) and
 * sets s->programs. Returns false on OOM (s is then unchanged). */
bool mf_programs_run(mf_schedule *s);

/* What one evaluation pass costs per rank: the most transient bytes live at
 * once (the unsharded weights of the buckets covering a unit and the stages
 * of its gathers), and the bytes its collectives send per axis. */
typedef struct mf_eval_figures {
    int64_t peak_transient;
    int64_t bytes[MF_MAX_AXES];
    int64_t launches;
} mf_eval_figures;
/* False on OOM; zeros for a schedule without the programs. */
bool mf_programs_eval_figures(const mf_schedule *s, mf_eval_figures *out);

#endif
