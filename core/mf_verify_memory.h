/*
 * mf_verify_memory: the verifier's check of memory reuse, per byte range of
 * the transient arena (docs/semantics.md §10). Called by mf_verify_run.
 */
#ifndef MF_VERIFY_MEMORY_H
#define MF_VERIFY_MEMORY_H

#include "mf_diag.h"
#include "mf_schedule.h"

/* Reports each hazard (naming both buffers, both accesses, the streams the
 * missing edge would join and the microbatch) into d; returns their number. */
int mf_verify_memory(const mf_schedule *s, mf_diag *d);

#endif
