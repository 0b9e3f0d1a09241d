/*
 * gmn_shm: the shared-memory segment of a communicator and the waits on it
 * (see gmn.h for the protocol).
 *
 * Joining: the first rank to arrive creates /dev/shm/<name> (O_EXCL), sizes
 * it, fills the header and publishes `ready`; the others open it, wait for
 * `ready`, check nranks and map it. Each rank claims its slot (a rank joining
 * twice is refused), and the last rank to join unlinks the file, so a
 * finished or failed-after-join run leaves nothing behind; files of runs that
 * died while joining are removed by gmn_seg_sweep (their creator's pid is in
 * the name and no longer exists).
 *
 * Waiting: every wait polls its condition, sleeps on the segment's futex
 * word at most GMN_POLL_MS, and on each wake-up checks this rank's abort flag,
 * the peers' abort flags and (every 250 ms) whether a lagging peer's process
 * still exists. A lost peer fails a host wait (a split) with ncclRemoteError;
 * device work only records it as the asynchronous error and keeps waiting
 * until this rank aborts (NCCL's kernels do not exit on their own). After GM_NCCL_HANG_S seconds (default 120) a wait is a hang:
 * it is reported as a violation and the process exits 3, so CI never hangs.
 */
#include "gmn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gm_model.h"

#define GMN_POLL_MS 5
#define GMN_SHM_DIR "/dev/shm/"

double gmn_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double hang_limit;
static pthread_once_t hang_once = PTHREAD_ONCE_INIT;

static void hang_read(void)
{
    const char *v = getenv("GM_NCCL_HANG_S");
    char *end = NULL;
    double h = v && *v ? strtod(v, &end) : 120.0;
    if (v && *v && (end == v || *end || h <= 0)) {
        fprintf(stderr, "gpumodel: GM_NCCL_HANG_S=%s: expected a positive number of seconds\n", v);
        _exit(2);
    }
    hang_limit = h;
}

double gmn_hang_s(void)
{
    pthread_once(&hang_once, hang_read);
    return hang_limit;
}

_Noreturn void gmn_hang(const char *what, double waited_s)
{
    gm_violation("nccl: %s: stuck for %.1f s (GM_NCCL_HANG_S=%g); exiting instead of hanging", what, waited_s,
                 gmn_hang_s());
    fflush(stderr);
    _exit(3);
}

static void futex_wait(_Atomic uint32_t *w, uint32_t val, int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void wake(gmn_seg *seg)
{
    atomic_fetch_add(&seg->gen, 1);
    futex_wake(&seg->gen);
}

static size_t seg_bytes(int nranks)
{
    return sizeof(gmn_seg) + (size_t)nranks * sizeof(gmn_slot);
}

/* Opens (creating when first) the file; *created says which. */
static int open_seg(const char *path, size_t bytes, bool *created)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    *created = fd >= 0;
    if (fd >= 0) {
        /* reserved, not just sized: a full /dev/shm is an error here, not a
         * SIGBUS at the first touch of a page */
        int rc = ftruncate(fd, (off_t)bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
        if (rc != 0) {
            close(fd);
            unlink(path);
            errno = rc;
            return -1;
        }
        return fd;
    }
    if (errno != EEXIST)
        return -1;
    return open(path, O_RDWR);
}

static bool header_ready(void *arg)
{
    int fd = *(int *)arg;
    struct stat st;
    return fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(gmn_seg);
}

/* Maps the header of a joined file and waits until the creator published it. */
static ncclResult_t wait_header(struct ncclComm *comm, int fd, int nranks, const char *path)
{
    if (!gmn_wait_until(comm, header_ready, &fd, "ncclCommInitRank: waiting for the segment's creator"))
        return gmn_fail(comm, ncclSystemError, "ncclCommInitRank: aborted while joining %s", path);
    gmn_seg *h = mmap(NULL, sizeof(gmn_seg), PROT_READ, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED)
        return gmn_fail(comm, ncclSystemError, "ncclCommInitRank: cannot map %s: %s", path, strerror(errno));
    double t0 = gmn_now_s();
    while (atomic_load(&h->ready) != GMN_ID_MAGIC) {
        if (atomic_load(&comm->aborted)) {
            munmap(h, sizeof(gmn_seg));
            return gmn_fail(comm, ncclSystemError, "ncclCommInitRank: aborted while joining %s", path);
        }
        if (gmn_now_s() - t0 > gmn_hang_s())
            gmn_hang("ncclCommInitRank: the segment's creator never initialized it", gmn_now_s() - t0);
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    uint32_t n = h->nranks;
    munmap(h, sizeof(gmn_seg));
    if ((int)n != nranks)
        return gmn_fail(comm, ncclInvalidArgument,
                        "ncclCommInitRank: rank %d was given nranks %d, but the communicator's first rank gave %u",
                        comm->rank, nranks, n);
    return ncclSuccess;
}

static bool all_joined(void *arg)
{
    struct ncclComm *comm = arg;
    return atomic_load(&comm->seg->njoined) >= (uint32_t)comm->nranks;
}

ncclResult_t gmn_seg_join(struct ncclComm *comm, const char *name, int nranks, int rank)
{
    char path[sizeof GMN_SHM_DIR + GMN_NAME_MAX];
    snprintf(path, sizeof path, "%s%s", GMN_SHM_DIR, name);
    size_t bytes = seg_bytes(nranks);
    bool created = false;
    int fd = open_seg(path, bytes, &created);
    if (fd < 0)
        return gmn_fail(comm, ncclSystemError, "ncclCommInitRank: cannot create or open %s (%zu bytes for %d ranks): "
                        "%s", path, bytes, nranks, strerror(errno));
    ncclResult_t r = created ? ncclSuccess : wait_header(comm, fd, nranks, path);
    if (r != ncclSuccess) {
        close(fd);
        return r;
    }
    gmn_seg *seg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (seg == MAP_FAILED)
        return gmn_fail(comm, ncclSystemError, "ncclCommInitRank: cannot map %zu bytes of %s: %s", bytes, path,
                        strerror(errno));
    if (created) {
        seg->nranks = (uint32_t)nranks;
        atomic_store(&seg->ready, GMN_ID_MAGIC);
    }
    comm->seg = seg;
    comm->seg_bytes = bytes;
    gmn_slot *me = &seg->slots[rank];
    if (atomic_exchange(&me->joined, 1) != 0) {
        gmn_seg_unmap(comm);
        return gmn_fail(comm, ncclInvalidArgument,
                        "ncclCommInitRank: rank %d of %d joined the communicator twice (the same rank given to two "
                        "calls with one unique id)",
                        rank, nranks);
    }
    atomic_store(&me->pid, (int32_t)getpid());
    if (atomic_fetch_add(&seg->njoined, 1) + 1 == (uint32_t)nranks)
        unlink(path); /* everyone has it mapped */
    wake(seg);
    if (!gmn_wait_until(comm, all_joined, comm, "ncclCommInitRank: waiting for the other ranks to join")) {
        unlink(path);
        return gmn_fail(comm, ncclSystemError, "ncclCommInitRank: aborted before all %d ranks joined", nranks);
    }
    return ncclSuccess;
}

void gmn_seg_unmap(struct ncclComm *comm)
{
    if (comm->seg)
        munmap(comm->seg, comm->seg_bytes);
    comm->seg = NULL;
}

void gmn_seg_sweep(void)
{
    DIR *d = opendir(GMN_SHM_DIR);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = 0;
        if (strncmp(e->d_name, "gmnccl-", 7) != 0 || sscanf(e->d_name + 7, "%ld-", &pid) != 1 || pid <= 0)
            continue;
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            char path[sizeof GMN_SHM_DIR + 256];
            snprintf(path, sizeof path, "%s%s", GMN_SHM_DIR, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
}

void gmn_wake(struct ncclComm *comm)
{
    if (comm->seg)
        wake(comm->seg);
}

void gmn_arrive(struct ncclComm *comm, _Atomic uint64_t *mine, uint64_t p)
{
    atomic_store(mine, p);
    wake(comm->seg);
}

static bool peer_dead(const gmn_slot *s)
{
    int32_t pid = atomic_load(&s->pid);
    return pid > 0 && pid != (int32_t)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* A lagging peer that aborted or whose process died: a host wait (a split)
 * fails with ncclRemoteError; device work sets it as the asynchronous error
 * and keeps waiting, as NCCL's kernels do, until this rank aborts. */
static bool peer_lost(struct ncclComm *comm, bool host, int q, const char *how, const char *what, char *msg,
                      size_t len)
{
    snprintf(msg, len, "%s: rank %d %s", what, q, how);
    if (host)
        return true;
    gmn_set_async(comm, ncclRemoteError, "%s", msg);
    return false;
}

ncclResult_t gmn_wait_all(struct ncclComm *comm, bool host, uint64_t p, const char *what, char *msg, size_t len)
{
    gmn_seg *seg = comm->seg;
    double t0 = gmn_now_s(), live_at = t0;
    for (;;) {
        uint32_t g = atomic_load(&seg->gen);
        int lag = -1;
        for (int q = 0; q < comm->nranks; q++) {
            gmn_slot *s = &seg->slots[q];
            if ((host ? atomic_load(&s->host_phase) : atomic_load(&s->phase)) >= p)
                continue;
            lag = q;
            if (atomic_load(&s->aborted) && peer_lost(comm, host, q, "aborted its communicator", what, msg, len))
                return ncclRemoteError;
        }
        if (lag < 0)
            return ncclSuccess;
        if (atomic_load(&comm->aborted)) {
            snprintf(msg, len, "%s: this rank's communicator was aborted", what);
            return ncclInvalidUsage;
        }
        double now = gmn_now_s();
        if (now - live_at > 0.25) {
            live_at = now;
            for (int q = 0; q < comm->nranks; q++)
                if (peer_dead(&seg->slots[q]) && peer_lost(comm, host, q, "exited (its process is gone)", what, msg,
                                                           len))
                    return ncclRemoteError;
        }
        if (now - t0 > gmn_hang_s()) {
            char w[600];
            snprintf(w, sizeof w, "%s (rank %d of %d, waiting for rank %d)", what, comm->rank, comm->nranks, lag);
            gmn_hang(w, now - t0);
        }
        futex_wait(&seg->gen, g, GMN_POLL_MS);
    }
}

bool gmn_wait_until(struct ncclComm *comm, bool (*cond)(void *), void *arg, const char *what)
{
    double t0 = gmn_now_s();
    for (int iter = 0;; iter++) {
        uint32_t g = comm->seg ? atomic_load(&comm->seg->gen) : 0;
        if (cond(arg))
            return true;
        if (atomic_load(&comm->aborted))
            return false;
        if (gmn_now_s() - t0 > gmn_hang_s())
            gmn_hang(what, gmn_now_s() - t0);
        if (comm->seg) {
            futex_wait(&comm->seg->gen, g, GMN_POLL_MS);
        } else {
            struct timespec ts = {0, iter < 100 ? 50000L : 1000000L};
            nanosleep(&ts, NULL);
        }
    }
}
