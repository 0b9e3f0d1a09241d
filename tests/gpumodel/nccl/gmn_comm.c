/*
 * gmn_comm: communicators of the NCCL model -- unique ids, creation
 * (ncclCommInitRank[Config], ncclCommInitAll, ncclCommSplit), the blocking
 * and nonblocking state machine, finalize / destroy / abort, the
 * asynchronous error, queries and the last-error strings.
 *
 * Creation is a job: join the segment (gmn_shm.c), after a host barrier on
 * the parent for a split. A blocking communicator outside a group runs the
 * job in the call; a nonblocking one (config.blocking = 0), or any creation
 * inside ncclGroupStart/End, runs it on a detached thread: the call returns
 * ncclInProgress (nonblocking) or ncclSuccess (blocking, in a group: the
 * outermost ncclGroupEnd waits for it), and ncclCommGetAsyncError reports
 * ncclInProgress until the job ended, then its result.
 *
 * Nonblocking state machine (ncclCommGetAsyncError, first match wins):
 *   creating -> ncclInProgress | creation failed -> its error |
 *   asynchronous error (mismatch, a peer aborted, injected fault) -> it |
 *   finalize asked -> ncclInProgress until no eager work is left, then
 *   ncclSuccess | a launch returned ncclInProgress -> ncclInProgress for one
 *   poll | ncclSuccess.
 */
#include "gmn.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "gm_model.h"


static __thread char tl_err[512];

/* The unique id: a magic and the segment's file name. */
typedef struct gmn_id {
    uint64_t magic;
    char name[GMN_NAME_MAX];
} gmn_id;
_Static_assert(sizeof(gmn_id) <= NCCL_UNIQUE_ID_BYTES, "the model's id must fit ncclUniqueId");

/* ---- live communicators (a stale handle is detected, not dereferenced) ---- */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm **live;
static int nlive, caplive;

static bool live_add(struct ncclComm *c)
{
    pthread_mutex_lock(&live_mu);
    bool ok = true;
    if (nlive == caplive) {
        int cap = caplive ? 2 * caplive : 16;
        struct ncclComm **p = realloc(live, (size_t)cap * sizeof *p);
        if (p) {
            live = p;
            caplive = cap;
        } else {
            ok = false;
        }
    }
    if (ok)
        live[nlive++] = c;
    pthread_mutex_unlock(&live_mu);
    return ok;
}

static bool live_remove(struct ncclComm *c)
{
    pthread_mutex_lock(&live_mu);
    bool found = false;
    for (int i = 0; i < nlive && !found; i++)
        if (live[i] == c) {
            live[i] = live[--nlive];
            found = true;
        }
    pthread_mutex_unlock(&live_mu);
    return found;
}

static bool live_has(const struct ncclComm *c)
{
    pthread_mutex_lock(&live_mu);
    bool found = false;
    for (int i = 0; i < nlive && !found; i++)
        found = live[i] == c;
    pthread_mutex_unlock(&live_mu);
    return found;
}

/* Takes a reference to c when it is live (atomically with the lookup, so a
 * concurrent ncclCommAbort from a watchdog thread cannot free it under the
 * caller); false when it is not. */
bool gmn_comm_hold(struct ncclComm *c)
{
    pthread_mutex_lock(&live_mu);
    bool found = false;
    for (int i = 0; i < nlive && !found; i++)
        found = live[i] == c;
    if (found)
        atomic_fetch_add(&c->refs, 1);
    pthread_mutex_unlock(&live_mu);
    return found;
}

/* ---- errors ---- */

static void vset(struct ncclComm *comm, const char *fmt, va_list ap)
{
    vsnprintf(tl_err, sizeof tl_err, fmt, ap);
    if (comm) {
        pthread_mutex_lock(&comm->err_mu);
        snprintf(comm->last_err, sizeof comm->last_err, "%s", tl_err);
        pthread_mutex_unlock(&comm->err_mu);
    }
    const char *dbg = getenv("NCCL_DEBUG");
    if (dbg && *dbg && strcasecmp(dbg, "VERSION") != 0)
        fprintf(stderr, "gpumodel: nccl: WARN %s\n", tl_err);
}

ncclResult_t gmn_fail(struct ncclComm *comm, ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(comm, fmt, ap);
    va_end(ap);
    return r;
}

void gmn_set_async(struct ncclComm *comm, ncclResult_t r, const char *fmt, ...)
{
    int expect = ncclSuccess;
    if (!atomic_compare_exchange_strong(&comm->async_err, &expect, (int)r))
        return;
    char msg[sizeof comm->last_err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&comm->err_mu);
    memcpy(comm->last_err, msg, sizeof msg);
    pthread_mutex_unlock(&comm->err_mu);
    fprintf(stderr, "gpumodel: nccl: rank %d of %s: asynchronous error %s: %s\n", comm->rank, comm->comm_name,
            ncclGetErrorString(r), msg);
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* A copy (this thread's, valid until its next call): other threads write
 * comm's message. */
const char *ncclGetLastError(ncclComm_t comm)
{
    static __thread char copy[sizeof tl_err];
    if (comm && gmn_comm_hold(comm)) {
        pthread_mutex_lock(&comm->err_mu);
        snprintf(copy, sizeof copy, "%s", comm->last_err);
        pthread_mutex_unlock(&comm->err_mu);
        gmn_comm_unref(comm);
        if (copy[0])
            return copy;
    }
    return tl_err;
}

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return gmn_fail(NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* ---- references ---- */

void gmn_comm_ref(struct ncclComm *comm)
{
    atomic_fetch_add(&comm->refs, 1);
}

void gmn_comm_unref(struct ncclComm *comm)
{
    if (atomic_fetch_sub(&comm->refs, 1) != 1)
        return;
    gmn_seg_unmap(comm);
    pthread_mutex_destroy(&comm->exec_mu);
    pthread_mutex_destroy(&comm->reg_mu);
    pthread_mutex_destroy(&comm->err_mu);
    free(comm);
}

ncclResult_t gmn_comm_check(struct ncclComm *comm, const char *call)
{
    if (!comm)
        return gmn_fail(NULL, ncclInvalidArgument, "%s: comm is NULL", call);
    if (!live_has(comm))
        return gmn_fail(NULL, ncclInvalidArgument, "%s: comm %p is not a live communicator (destroyed, aborted or "
                        "never created)", call, (void *)comm);
    int st = atomic_load(&comm->init_state);
    if (st == ncclInProgress)
        return gmn_fail(comm, ncclInvalidUsage, "%s: communicator %s is still being created (poll "
                        "ncclCommGetAsyncError until it returns ncclSuccess)", call, comm->comm_name);
    if (st != ncclSuccess)
        return gmn_fail(comm, ncclInvalidUsage, "%s: the creation of communicator %s failed (%s)", call,
                        comm->comm_name, ncclGetErrorString((ncclResult_t)st));
    if (atomic_load(&comm->finalize_state) != 0)
        return gmn_fail(comm, ncclInvalidUsage, "%s: communicator %s was finalized", call, comm->comm_name);
    return ncclSuccess;
}

/* ---- unique ids ---- */

ncclResult_t ncclGetUniqueId(ncclUniqueId *out)
{
    if (!out)
        return gmn_fail(NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    gmn_seg_sweep();
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        rnd = (uint64_t)gmn_now_s() * 1000003u ^ (uint64_t)getpid();
    static _Atomic unsigned counter;
    gmn_id id = {.magic = GMN_ID_MAGIC};
    snprintf(id.name, sizeof id.name, "gmnccl-%d-%016llx-%u", (int)getpid(), (unsigned long long)rnd,
             atomic_fetch_add(&counter, 1));
    memset(out, 0, sizeof *out);
    memcpy(out->internal, &id, sizeof id);
    return ncclSuccess;
}

/* ---- creation ---- */

static ncclResult_t read_config(const ncclConfig_t *config, const struct ncclComm *parent, bool *blocking,
                                char *name, size_t namelen, const char *call)
{
    *blocking = parent ? parent->blocking : true;
    if (parent)
        snprintf(name, namelen, "%s", parent->comm_name);
    if (!config)
        return ncclSuccess;
    if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, commName) + sizeof(char *))
        return gmn_fail(NULL, ncclInvalidArgument, "%s: config was not initialized with NCCL_CONFIG_INITIALIZER "
                        "(magic 0x%x, size %zu)", call, config->magic, config->size);
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
        return gmn_fail(NULL, ncclInvalidArgument, "%s: config.blocking is %d, expected 0 or 1", call,
                        config->blocking);
    if (config->blocking != NCCL_CONFIG_UNDEF_INT)
        *blocking = config->blocking == 1;
    if (config->commName)
        snprintf(name, namelen, "%s", config->commName);
    return ncclSuccess;
}

static struct ncclComm *comm_new(bool blocking, const char *comm_name)
{
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->magic = GMN_COMM_MAGIC;
    atomic_init(&c->refs, 1);
    c->blocking = blocking;
    atomic_init(&c->init_state, ncclInProgress);
    pthread_mutex_init(&c->exec_mu, NULL);
    pthread_mutex_init(&c->reg_mu, NULL);
    pthread_mutex_init(&c->err_mu, NULL);
    snprintf(c->comm_name, sizeof c->comm_name, "%s", comm_name);
    if (cudaGetDevice(&c->device) != cudaSuccess)
        c->device = 0;
    if (!live_add(c)) {
        gmn_comm_unref(c);
        return NULL;
    }
    return c;
}

/* A creation job: join `child` (rank/nranks set), after the split barrier on
 * `parent` when there is one. `child` may be NULL (NCCL_SPLIT_NOCOLOR). */
typedef struct gmn_job {
    _Atomic int refs;
    _Atomic int done;             /* 1 when finished; result then valid */
    ncclResult_t result;
    struct ncclComm *parent, *child;
    int color, key;
    char seg_name[GMN_NAME_MAX];
} gmn_job;

void gmn_job_unref(gmn_job *j)
{
    if (atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    if (j->parent)
        gmn_comm_unref(j->parent);
    if (j->child)
        gmn_comm_unref(j->child);
    free(j);
}

/* The split barrier: every rank of the parent posts (color, key); the child's
 * rank is its place among its color by (key, parent rank). */
static ncclResult_t split_barrier(gmn_job *j)
{
    struct ncclComm *p = j->parent;
    uint64_t hp = ++p->host_phase, s = p->nsplit++;
    gmn_slot *me = &p->seg->slots[p->rank];
    me->split_color[hp % 2] = j->color;
    me->split_key[hp % 2] = j->key;
    gmn_arrive(p, &me->host_phase, hp);
    char msg[512];
    ncclResult_t r = gmn_wait_all(p, true, hp, "ncclCommSplit", msg, sizeof msg);
    if (r != ncclSuccess)
        return gmn_fail(j->child, r == ncclInvalidUsage ? ncclSystemError : r, "%s", msg);
    if (!j->child)
        return ncclSuccess;
    int n = 0, rank = 0;
    for (int q = 0; q < p->nranks; q++) {
        const gmn_slot *o = &p->seg->slots[q];
        if (o->split_color[hp % 2] != j->color)
            continue;
        n++;
        if (o->split_key[hp % 2] < j->key || (o->split_key[hp % 2] == j->key && q < p->rank))
            rank++;
    }
    j->child->rank = rank;
    j->child->nranks = n;
    /* the creator's pid stays first in the name so that a sweep finds it */
    int pid = 0;
    sscanf(p->name, "gmnccl-%d-", &pid);
    uint64_t h = 1469598103934665603ULL;
    for (const char *c = p->name; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    h = (h ^ s) * 1099511628211ULL;
    h = (h ^ (uint64_t)(uint32_t)j->color) * 1099511628211ULL;
    snprintf(j->seg_name, sizeof j->seg_name, "gmnccl-%d-%016llx-s", pid, (unsigned long long)h);
    return ncclSuccess;
}

static ncclResult_t job_run(gmn_job *j)
{
    ncclResult_t r = ncclSuccess;
    if (j->parent)
        r = split_barrier(j);
    if (r == ncclSuccess && j->child) {
        snprintf(j->child->name, sizeof j->child->name, "%s", j->seg_name);
        r = gmn_seg_join(j->child, j->seg_name, j->child->nranks, j->child->rank);
    }
    if (j->child) {
        const gmn_fault *f = r == ncclSuccess ? gmn_fault_for(j->child) : NULL;
        if (f && f->kind == GMN_FAULT_ASYNC && f->after == 0)
            gmn_set_async(j->child, ncclSystemError, "injected fault (GM_NCCL_FAULT): rank %d reports an "
                          "asynchronous system error after 0 collectives", j->child->root_rank);
        atomic_store(&j->child->init_state, (int)r);
    }
    j->result = r;
    atomic_store(&j->done, 1);
    return r;
}

static void *job_thread(void *arg)
{
    gmn_job *j = arg;
    job_run(j);
    gmn_job_unref(j);
    return NULL;
}

bool gmn_job_done(void *arg)
{
    return atomic_load(&((gmn_job *)arg)->done) != 0;
}

ncclResult_t gmn_job_result(void *job)
{
    return ((gmn_job *)job)->result;
}

/* Runs the job in the call (blocking, outside a group) or on a thread. */
static ncclResult_t job_start(gmn_job *j, bool blocking, ncclComm_t *out)
{
    bool async = !blocking || gmn_group_depth() > 0;
    pthread_t t;
    if (async) {
        atomic_fetch_add(&j->refs, 1);
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &a, job_thread, j);
        pthread_attr_destroy(&a);
        if (rc != 0) {
            atomic_fetch_sub(&j->refs, 1);
            async = false;
        }
    }
    if (!async) {
        ncclResult_t r = job_run(j);
        if (r != ncclSuccess && j->child) {
            *out = NULL;
            live_remove(j->child);
            j->child->magic = 0;
            gmn_comm_unref(j->child); /* the user's reference */
        }
        gmn_job_unref(j);
        return r;
    }
    if (gmn_group_depth() > 0)
        gmn_group_defer_job(j, blocking); /* takes the reference */
    else
        gmn_job_unref(j);
    return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config)
{
    const char *call = "ncclCommInitRankConfig";
    if (!out)
        return gmn_fail(NULL, ncclInvalidArgument, "%s: comm is NULL", call);
    *out = NULL;
    gmn_id id;
    memcpy(&id, commId.internal, sizeof id);
    if (id.magic != GMN_ID_MAGIC || !memchr(id.name, 0, sizeof id.name))
        return gmn_fail(NULL, ncclInvalidArgument, "%s: the unique id was not made by ncclGetUniqueId", call);
    if (nranks < 1 || nranks > GMN_MAX_RANKS)
        return gmn_fail(NULL, ncclInvalidArgument, "%s: nranks is %d, expected 1..%d", call, nranks, GMN_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return gmn_fail(NULL, ncclInvalidArgument, "%s: rank is %d, expected 0..%d", call, rank, nranks - 1);
    bool blocking = true;
    char cname[64] = "";
    ncclResult_t r = read_config(config, NULL, &blocking, cname, sizeof cname, call);
    if (r != ncclSuccess)
        return r;
    if (!cname[0])
        snprintf(cname, sizeof cname, "%.50s", id.name + 7);
    gmn_job *j = calloc(1, sizeof *j);
    struct ncclComm *c = j ? comm_new(blocking, cname) : NULL;
    if (!c) {
        free(j);
        return gmn_fail(NULL, ncclSystemError, "%s: out of memory", call);
    }
    c->rank = c->root_rank = rank;
    c->nranks = nranks;
    atomic_init(&j->refs, 1);
    j->child = c;
    gmn_comm_ref(c); /* the job's */
    snprintf(j->seg_name, sizeof j->seg_name, "%s", id.name);
    *out = c;
    return job_start(j, blocking, out);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms || ndev < 1)
        return gmn_fail(NULL, ncclInvalidArgument, "ncclCommInitAll: comms is NULL or ndev %d < 1", ndev);
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return r;
    ncclGroupStart();
    for (int i = 0; i < ndev && r == ncclSuccess; i++) {
        int prev = 0;
        cudaGetDevice(&prev);
        if (devlist)
            cudaSetDevice(devlist[i]);
        r = ncclCommInitRank(&comms[i], ndev, id, i);
        cudaSetDevice(prev);
    }
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    const char *call = "ncclCommSplit";
    ncclResult_t r = gmn_comm_check(comm, call);
    if (r != ncclSuccess)
        return r;
    if (!newcomm)
        return gmn_fail(comm, ncclInvalidArgument, "%s: newcomm is NULL", call);
    *newcomm = NULL;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return gmn_fail(comm, ncclInvalidArgument, "%s: color %d is negative and not NCCL_SPLIT_NOCOLOR", call,
                        color);
    bool blocking = true;
    char cname[64] = "";
    if ((r = read_config(config, comm, &blocking, cname, sizeof cname, call)) != ncclSuccess)
        return r;
    gmn_job *j = calloc(1, sizeof *j);
    struct ncclComm *c = j && color != NCCL_SPLIT_NOCOLOR ? comm_new(blocking, cname) : NULL;
    if (!j || (color != NCCL_SPLIT_NOCOLOR && !c)) {
        free(j);
        return gmn_fail(comm, ncclSystemError, "%s: out of memory", call);
    }
    atomic_init(&j->refs, 1);
    j->parent = comm;
    gmn_comm_ref(comm);
    j->color = color;
    j->key = key;
    if (c) {
        c->root_rank = comm->root_rank;
        j->child = c;
        gmn_comm_ref(c);
        *newcomm = c;
    }
    return job_start(j, blocking, newcomm);
}

/* ---- state, queries ---- */

static bool no_outstanding(void *arg)
{
    return atomic_load(&((struct ncclComm *)arg)->outstanding) == 0;
}

/* Done waiting for the stream work: none left, or the comm is broken (its
 * work then waits for an abort that a wait here would never give). */
static bool settled(void *arg)
{
    struct ncclComm *c = arg;
    return no_outstanding(c) || atomic_load(&c->async_err) != ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError || !gmn_comm_hold(comm))
        return gmn_fail(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: %s",
                        !comm ? "comm is NULL" : !asyncError ? "asyncError is NULL" : "comm is not a live communicator");
    int st = atomic_load(&comm->init_state), a = atomic_load(&comm->async_err);
    int fin = atomic_load(&comm->finalize_state);
    if (st != ncclSuccess)
        *asyncError = (ncclResult_t)st;
    else if (a != ncclSuccess)
        *asyncError = (ncclResult_t)a;
    else if (fin == ncclInProgress && !no_outstanding(comm))
        *asyncError = ncclInProgress;
    else if (atomic_load(&comm->launch_polls) > 0) {
        atomic_fetch_sub(&comm->launch_polls, 1);
        *asyncError = ncclInProgress;
    } else {
        if (fin == ncclInProgress)
            atomic_store(&comm->finalize_state, ncclSuccess);
        *asyncError = ncclSuccess;
    }
    gmn_comm_unref(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    ncclResult_t r = gmn_comm_check(comm, "ncclCommCount");
    if (r == ncclSuccess && !count)
        r = gmn_fail(comm, ncclInvalidArgument, "ncclCommCount: count is NULL");
    if (r == ncclSuccess)
        *count = comm->nranks;
    return r;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    ncclResult_t r = gmn_comm_check(comm, "ncclCommUserRank");
    if (r == ncclSuccess && !rank)
        r = gmn_fail(comm, ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    if (r == ncclSuccess)
        *rank = comm->rank;
    return r;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    ncclResult_t r = gmn_comm_check(comm, "ncclCommCuDevice");
    if (r == ncclSuccess && !device)
        r = gmn_fail(comm, ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    if (r == ncclSuccess)
        *device = comm->device;
    return r;
}

/* ---- the end of a communicator ---- */

static bool init_done(void *arg)
{
    return atomic_load(&((struct ncclComm *)arg)->init_state) != ncclInProgress;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t r = gmn_comm_check(comm, "ncclCommFinalize");
    if (r != ncclSuccess || !gmn_comm_hold(comm))
        return r != ncclSuccess ? r : gmn_fail(NULL, ncclInvalidArgument, "ncclCommFinalize: comm was aborted");
    if (!comm->blocking) {
        atomic_store(&comm->finalize_state, ncclInProgress);
        r = ncclInProgress;
    } else {
        gmn_wait_until(comm, settled, comm, "ncclCommFinalize: waiting for the communicator's stream work");
        int a = atomic_load(&comm->async_err);
        if (a != ncclSuccess)
            r = gmn_fail(comm, (ncclResult_t)a, "ncclCommFinalize of %s: the communicator has an asynchronous "
                         "error (%s): abort it", comm->comm_name, ncclGetErrorString((ncclResult_t)a));
        else
            atomic_store(&comm->finalize_state, ncclSuccess);
    }
    gmn_comm_unref(comm);
    return r;
}

static void release(struct ncclComm *comm)
{
    pthread_mutex_lock(&comm->reg_mu);
    for (gmn_reg *g = comm->regs, *next; g; g = next) {
        next = g->next;
        g->magic = 0;
        free(g);
    }
    comm->regs = NULL;
    pthread_mutex_unlock(&comm->reg_mu);
    comm->magic = 0;
    gmn_comm_unref(comm);
}

/* Aborts a communicator this thread just took off the live list: its
 * creation and running work see the flag within a poll, peers see the slot's. */
static void abort_taken(struct ncclComm *comm)
{
    atomic_fetch_add(&gmn_stat_aborts, 1);
    atomic_store(&comm->aborted, true);
    double t0 = gmn_now_s();
    while (!init_done(comm) && gmn_now_s() - t0 < gmn_hang_s())
        usleep(1000);
    if (comm->seg) {
        atomic_store(&comm->seg->slots[comm->rank].aborted, 1);
        gmn_wake(comm);
    }
    pthread_mutex_lock(&comm->exec_mu); /* the running item has returned */
    pthread_mutex_unlock(&comm->exec_mu);
    if (comm->name[0] && comm->seg && atomic_load(&comm->seg->njoined) < (uint32_t)comm->nranks) {
        char path[GMN_NAME_MAX + 16];
        snprintf(path, sizeof path, "/dev/shm/%s", comm->name);
        unlink(path);
    }
    release(comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    if (!gmn_comm_hold(comm))
        return gmn_fail(NULL, ncclInvalidArgument, "ncclCommDestroy: comm %p is not a live communicator", (void *)comm);
    ncclResult_t r = ncclSuccess;
    if (gmn_group_depth() > 0) {
        r = gmn_fail(comm, ncclInvalidUsage, "ncclCommDestroy of %s inside ncclGroupStart/End", comm->comm_name);
        goto out;
    }
    gmn_wait_until(comm, init_done, comm, "ncclCommDestroy: waiting for the communicator's creation");
    if (atomic_load(&comm->init_state) == ncclSuccess)
        gmn_wait_until(comm, settled, comm, "ncclCommDestroy: waiting for the communicator's stream work");
    if (!live_remove(comm)) {
        r = gmn_fail(NULL, ncclInvalidArgument, "ncclCommDestroy: comm %p was destroyed or aborted meanwhile",
                     (void *)comm);
        goto out;
    }
    if (atomic_load(&comm->init_state) != ncclSuccess || atomic_load(&comm->async_err) != ncclSuccess)
        abort_taken(comm); /* a broken comm: its blocked work ends as with an abort */
    else
        release(comm);
out:
    gmn_comm_unref(comm); /* ours */
    return r;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    if (!live_remove(comm))
        return gmn_fail(NULL, ncclInvalidArgument, "ncclCommAbort: comm %p is not a live communicator", (void *)comm);
    abort_taken(comm);
    return ncclSuccess;
}
