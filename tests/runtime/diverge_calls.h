/*
 * diverge_calls: the trainer's calls of the divergence tests
 * (tests/runtime/test_diverge.c on the CPU backends, tests/gpu/
 * test_diverge_nccl.c on NCCL), one copy for both. Include it after the
 * test's `job` type, which has the fields
 *
 *     const mfsdp_schedule *sh;
 *     mfsdp_result r;      the first failing call's result
 *     char where[64];      that call
 *     char msg[1024];      its message
 *
 * CALL(rt, name, call) makes a call only while nothing failed, and records
 * the first failure: every later call of the job is skipped, so a job's
 * outcome is the call where it failed and that call's message.
 */
#ifndef DIVERGE_CALLS_H
#define DIVERGE_CALLS_H

#include <stdio.h>
#include <time.h>

#include "mfsdp.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define CALL(rt, name, call)                                                         \
    do {                                                                             \
        if (j->r == MFSDP_OK) {                                                      \
            mfsdp_result r_ = (call);                                                \
            if (r_ != MFSDP_OK) {                                                    \
                j->r = r_;                                                           \
                snprintf(j->where, sizeof j->where, "%s", name);                     \
                snprintf(j->msg, sizeof j->msg, "%s", mfsdp_last_error(rt));         \
            }                                                                        \
        }                                                                            \
    } while (0)

/* Microbatch m's forward and backward (the trainer's compute left out). */
static void microbatch(job *j, mfsdp_runtime *rt, int64_t m)
{
    int U = mfsdp_schedule_num_units(j->sh);
    char name[64];
    for (int u = 0; u < U; u++) {
        snprintf(name, sizeof name, "mfsdp_forward_pre(%d,%lld)", u, (long long)m);
        CALL(rt, name, mfsdp_forward_pre(rt, u, m));
        CALL(rt, "mfsdp_forward_post", mfsdp_forward_post(rt, u, m));
    }
    for (int u = U - 1; u >= 0; u--) {
        CALL(rt, "mfsdp_backward_pre", mfsdp_backward_pre(rt, u, m));
        CALL(rt, "mfsdp_backward_post", mfsdp_backward_post(rt, u, m));
    }
}

/* A step of m microbatches (m < M: a short step). */
static void step(job *j, mfsdp_runtime *rt, int64_t m)
{
    CALL(rt, "mfsdp_step_begin", mfsdp_step_begin(rt));
    for (int64_t k = 0; k < m; k++)
        microbatch(j, rt, k);
    CALL(rt, "mfsdp_step_end", mfsdp_step_end(rt));
}

#endif
