/*
 * gmn_group: ncclGroupStart / ncclGroupEnd of the NCCL model.
 *
 * Groups are per host thread, as in NCCL, and nest: only the outermost
 * ncclGroupEnd acts. Inside a group a collective is checked at its call (an
 * error is returned there and remembered) and deferred; creations
 * (init/split) run on their own threads. The outermost ncclGroupEnd:
 *   1. waits for the group's blocking creations (a nonblocking one is left
 *      running: the result is then ncclInProgress);
 *   2. when no member failed, launches the deferred collectives in call order
 *      (each as stream work on its own stream and communicator: a group may
 *      span several communicators and streams); when one failed, launches
 *      none and returns the first error;
 *   3. returns ncclInProgress when a member's communicator is nonblocking
 *      (which then reports ncclInProgress for one ncclCommGetAsyncError poll).
 */
#include "gmn.h"

#include <stdlib.h>
#include <unistd.h>

typedef struct group_job {
    struct gmn_job *job;
    bool blocking;
} group_job;

static __thread int depth;
static __thread ncclResult_t first_err;
static __thread gmn_call *calls;
static __thread int ncalls, capcalls;
static __thread group_job *jobs;
static __thread int njobs, capjobs;

int gmn_group_depth(void)
{
    return depth;
}

void gmn_group_error(ncclResult_t r)
{
    if (depth > 0 && first_err == ncclSuccess && r != ncclSuccess && r != ncclInProgress)
        first_err = r;
}

void gmn_group_defer_job(struct gmn_job *j, bool blocking)
{
    if (njobs == capjobs) {
        int cap = capjobs ? 2 * capjobs : 8;
        group_job *p = realloc(jobs, (size_t)cap * sizeof *p);
        if (!p) { /* cannot track it: wait now */
            while (!gmn_job_done(j))
                usleep(200);
            gmn_group_error(gmn_job_result(j));
            gmn_job_unref(j);
            return;
        }
        jobs = p;
        capjobs = cap;
    }
    jobs[njobs++] = (group_job){j, blocking};
}

/* Defers a checked collective (takes a reference to its communicator). */
ncclResult_t gmn_group_defer(const gmn_call *c);
ncclResult_t gmn_group_defer(const gmn_call *c)
{
    if (ncalls == capcalls) {
        int cap = capcalls ? 2 * capcalls : 16;
        gmn_call *p = realloc(calls, (size_t)cap * sizeof *p);
        if (!p) {
            ncclResult_t r = gmn_fail(c->comm, ncclSystemError, "ncclGroupStart/End: out of memory");
            gmn_group_error(r);
            return r;
        }
        calls = p;
        capcalls = cap;
    }
    gmn_comm_ref(c->comm);
    calls[ncalls++] = *c;
    return ncclSuccess;
}

/* nccl.h declares these without a prototype */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclGroupStart(void)
{
    if (depth == 0)
        first_err = ncclSuccess;
    depth++;
    return ncclSuccess;
}

static bool job_done(void *j)
{
    return gmn_job_done(j);
}

ncclResult_t ncclGroupEnd(void)
{
    if (depth == 0)
        return gmn_fail(NULL, ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
    if (--depth > 0)
        return ncclSuccess;
    ncclResult_t r = first_err;
    bool in_progress = false;
    for (int i = 0; i < njobs; i++) {
        if (jobs[i].blocking) {
            /* bounded by the hang watchdog inside the job's own waits */
            while (!job_done(jobs[i].job))
                usleep(200);
            ncclResult_t jr = gmn_job_result(jobs[i].job);
            if (r == ncclSuccess && jr != ncclSuccess)
                r = jr;
        } else {
            in_progress = true;
        }
        gmn_job_unref(jobs[i].job);
    }
    for (int i = 0; i < ncalls; i++) {
        if (r == ncclSuccess) {
            ncclResult_t lr = gmn_launch(&calls[i]);
            if (lr != ncclSuccess)
                r = lr;
            else if (!calls[i].comm->blocking) {
                atomic_store(&calls[i].comm->launch_polls, 1);
                in_progress = true;
            }
        }
        gmn_comm_unref(calls[i].comm);
    }
    /* the lists are the thread's: released here, not left to leak at its exit */
    free(calls);
    free(jobs);
    calls = NULL;
    jobs = NULL;
    ncalls = capcalls = njobs = capjobs = 0;
    first_err = ncclSuccess;
    return r == ncclSuccess && in_progress ? ncclInProgress : r;
}
