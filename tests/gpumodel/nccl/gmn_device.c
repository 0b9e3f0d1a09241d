/*
 * gmn_device: an optional model of what one GPU cannot show -- NCCL kernels
 * that cannot co-reside on a device, and NCCL_LAUNCH_ORDER_IMPLICIT.
 *
 * With GM_NCCL_EXCLUSIVE=1 each rank's device (keyed by the communicator's
 * root rank: thread-ranks share the CUDA model's device, a real rank has its
 * own) runs one collective at a time, the worst case of NCCL's persistent
 * kernels: a collective that waits for its peers holds the device. When
 * NCCL_LAUNCH_ORDER_IMPLICIT=1 is in the environment at the first launch (NCCL
 * reads it then; mfsdp sets it before creating its communicators), eager
 * collectives take the device in host launch order across all the rank's
 * communicators (a ticket per launch), as NCCL then orders their kernels;
 * without it, in the order their streams reach them. Two ranks that reach
 * two communicators' collectives in opposite orders then deadlock, as they
 * can on GPUs, and the hang watchdog reports it.
 *
 * Invariants: a ticket is served exactly once (run, or cancelled when its
 * item is aborted or freed without running); serving only grows; the device
 * is busy with at most one collective. Graph nodes take no ticket (only the
 * device). Default (GM_NCCL_EXCLUSIVE unset): nothing here is used.
 */
#include "gmn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct gmn_dev {
    int root_rank;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next;                /* tickets handed out */
    uint64_t serving;             /* the ticket that may take the device next */
    bool busy;
    char holder[200];             /* what holds the device (for the hang report) */
    uint64_t *cancelled;          /* tickets >= serving that will never run */
    size_t ncancelled, capcancelled;
} gmn_dev;

static pthread_mutex_t devs_mu = PTHREAD_MUTEX_INITIALIZER;
static gmn_dev **devs;
static int ndevs, capdevs;
static int mode = -1;             /* 0 off, 1 exclusive, 2 exclusive + implicit order */

int gmn_dev_mode(void)
{
    pthread_mutex_lock(&devs_mu);
    if (mode < 0) {
        const char *x = getenv("GM_NCCL_EXCLUSIVE"), *o = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
        mode = x && !strcmp(x, "1") ? (o && !strcmp(o, "1") ? 2 : 1) : 0;
    }
    int m = mode;
    pthread_mutex_unlock(&devs_mu);
    return m;
}

static gmn_dev *dev_of(int root_rank)
{
    pthread_mutex_lock(&devs_mu);
    gmn_dev *d = NULL;
    for (int i = 0; i < ndevs && !d; i++)
        if (devs[i]->root_rank == root_rank)
            d = devs[i];
    if (!d && ndevs == capdevs) {
        int cap = capdevs ? 2 * capdevs : 8;
        gmn_dev **p = realloc(devs, (size_t)cap * sizeof *p);
        if (p) {
            devs = p;
            capdevs = cap;
        }
    }
    if (!d && ndevs < capdevs) {
        d = calloc(1, sizeof *d);
        if (d) {
            d->root_rank = root_rank;
            pthread_mutex_init(&d->mu, NULL);
            pthread_cond_init(&d->cv, NULL);
            devs[ndevs++] = d;
        }
    }
    pthread_mutex_unlock(&devs_mu);
    return d;
}

bool gmn_dev_ticket(int root_rank, uint64_t *ticket)
{
    gmn_dev *d = gmn_dev_mode() == 2 ? dev_of(root_rank) : NULL;
    if (!d)
        return false;
    pthread_mutex_lock(&d->mu);
    *ticket = d->next++;
    pthread_mutex_unlock(&d->mu);
    return true;
}

/* Moves serving past cancelled tickets. d->mu held. */
static void skip_cancelled(gmn_dev *d)
{
    for (bool moved = true; moved;) {
        moved = false;
        for (size_t i = 0; i < d->ncancelled; i++)
            if (d->cancelled[i] == d->serving) {
                d->cancelled[i] = d->cancelled[--d->ncancelled];
                d->serving++;
                moved = true;
                break;
            }
    }
}

void gmn_dev_cancel(int root_rank, uint64_t ticket)
{
    gmn_dev *d = dev_of(root_rank);
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    if (d->ncancelled == d->capcancelled) {
        size_t cap = d->capcancelled ? 2 * d->capcancelled : 16;
        uint64_t *p = realloc(d->cancelled, cap * sizeof *p);
        if (p) {
            d->cancelled = p;
            d->capcancelled = cap;
        }
    }
    if (d->ncancelled < d->capcancelled)
        d->cancelled[d->ncancelled++] = ticket;
    skip_cancelled(d);
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

bool gmn_dev_acquire(struct ncclComm *comm, bool ticketed, uint64_t ticket, const char *what)
{
    gmn_dev *d = dev_of(comm->root_rank);
    if (!d)
        return true; /* out of memory: not exclusive */
    double t0 = gmn_now_s();
    pthread_mutex_lock(&d->mu);
    for (;;) {
        skip_cancelled(d);
        if (!d->busy && (!ticketed || ticket == d->serving)) {
            d->busy = true;
            snprintf(d->holder, sizeof d->holder, "%s", what);
            pthread_mutex_unlock(&d->mu);
            return true;
        }
        if (atomic_load(&comm->aborted)) {
            pthread_mutex_unlock(&d->mu);
            return false; /* the caller cancels its ticket */
        }
        if (gmn_now_s() - t0 > gmn_hang_s()) {
            char w[700];
            snprintf(w, sizeof w, "%s: waiting for rank %d's device (GM_NCCL_EXCLUSIVE%s; ticket %llu, serving %llu, "
                     "held by %s)", what, comm->root_rank, ticketed ? ", NCCL_LAUNCH_ORDER_IMPLICIT=1" : "",
                     (unsigned long long)ticket, (unsigned long long)d->serving, d->busy ? d->holder : "nothing");
            pthread_mutex_unlock(&d->mu);
            gmn_hang(w, gmn_now_s() - t0);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 5000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&d->cv, &d->mu, &ts);
    }
}

void gmn_dev_release(struct ncclComm *comm, bool ticketed, uint64_t ticket)
{
    gmn_dev *d = dev_of(comm->root_rank);
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->busy = false;
    if (ticketed && ticket == d->serving)
        d->serving++;
    skip_cancelled(d);
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}
