/*
 * mf_verify: the schedule verifier (docs/schedule.md §5), in the core so that
 * the compiler runs it on what it writes and the runtime on what it loads.
 */
#ifndef MF_VERIFY_H
#define MF_VERIFY_H

#include "mf_diag.h"
#include "mf_schedule.h"

/* Checks a schedule (compiled or loaded); errors name op ids and buffers and
 * go to d. Returns the number of errors found (0 = verified). */
int mf_verify_run(const mf_schedule *s, mf_diag *d);

#endif
