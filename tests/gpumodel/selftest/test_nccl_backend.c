/*
 * The NCCL model under mfsdp's unchanged NCCL backend, several ranks: every
 * mesh rank of a schedule is a thread of this process with its own runtime
 * (MFSDP_BACKEND_NCCL, a unique id shared by the threads, host compute),
 * checked by the replay oracle (mf_check_rank: replicas bitwise equal, every
 * unsharded weight equal to the cast main_weight, the delivered gradient
 * equal to the reference sum/average). This is what one GPU cannot show:
 * communicators split per axis, in-place collectives at offsets other than 0,
 * groups on several ranks, and Whole buckets in both forms: prefix (the
 * default where it moves fewer bytes: nested groups of ncclReduce /
 * ncclBroadcast) and padded (MFSDP_WHOLE_COLLECTIVES=padded).
 *
 *   test_nccl_backend SCHEDULE.yaml [STEPS]
 *
 * Environment: TEST_NCCL_NONBLOCKING=1 (nonblocking communicators),
 * TEST_NCCL_TIMEOUT_MS (the runtime's timeout, default 60000), and for the
 * watchdog paths TEST_NCCL_EXPECT_FAIL="a|b|..." with a GM_NCCL_FAULT: then
 * every rank must fail, each with its own error naming one of the
 * alternatives (a timeout, the watchdog, an abort -- never wrong data).
 *
 * Runs only on the model (LD_LIBRARY_PATH=<build>/tests/gpumodel/lib, set by
 * CTest): it refuses to run on another libnccl.so.2. Exit 0 when every rank
 * verified every step.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mf_check.h"
#include "mfsdp_nccl.h"

#define MAXR 64
#define XCHG_WAIT_S 120

/* The oracle's all-gather among the thread-ranks: double-buffered by call
 * parity (a rank writes buffer k % 2 at call k only after every rank arrived
 * at call k - 1, so nobody still reads it), bounded by XCHG_WAIT_S. */
typedef struct xchg {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    long arrived[2];              /* arrivals per parity, cumulative */
    long calls[MAXR];             /* per rank */
    unsigned char *buf[2];
    size_t cap;                   /* bytes per rank */
} xchg;

static const void *xchg_allgather(void *ctx, int64_t rank, const void *mine, size_t bytes, bool failing)
{
    (void)failing;
    xchg *x = ctx;
    if (bytes > x->cap)
        return NULL;
    pthread_mutex_lock(&x->mu);
    long k = x->calls[rank]++;
    int par = (int)(k % 2);
    memcpy(x->buf[par] + (size_t)rank * bytes, mine, bytes);
    x->arrived[par]++;
    pthread_cond_broadcast(&x->cv);
    long want = (k / 2 + 1) * x->n; /* every rank's call k (and k - 2, ...) */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += XCHG_WAIT_S;
    int rc = 0;
    while (x->arrived[par] < want && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&x->cv, &x->mu, &dl);
    bool ok = x->arrived[par] >= want;
    pthread_mutex_unlock(&x->mu);
    return ok ? x->buf[par] : NULL;
}

typedef struct rank_arg {
    const mfsdp_schedule *sh;
    ncclUniqueId id;
    int rank;
    int64_t steps;
    xchg *x;
    mf_check_outcome out;
    int rc;
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    nc.unique_id = a->id;
    nc.has_unique_id = 1;
    nc.flags |= MFSDP_NCCL_HOST_COMPUTE;
    if (getenv("TEST_NCCL_NONBLOCKING"))
        nc.flags |= MFSDP_NCCL_NONBLOCKING;
    nc.watchdog_poll_ms = 50;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_nccl(&cfg, &nc);
    cfg.rank = a->rank;
    const char *t = getenv("TEST_NCCL_TIMEOUT_MS");
    cfg.timeout_ms = t ? atoll(t) : 60000;
    mf_check_xchg xc = {xchg_allgather, NULL, a->x};
    mf_check_opts o = {.steps = a->steps, .stop_rank = -1, .stop_step = -1, .out = NULL};
    a->rc = mf_check_rank(a->sh, &cfg, &xc, &o, &a->out);
    return NULL;
}

/* True when s contains one of the '|'-separated alternatives. */
static bool matches_one(const char *s, const char *alts)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", alts);
    for (char *save = NULL, *a = strtok_r(buf, "|", &save); a; a = strtok_r(NULL, "|", &save))
        if (strstr(s, a))
            return true;
    return false;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_nccl_backend SCHEDULE.yaml [STEPS]\n");
        return 2;
    }
    if (!dlsym(RTLD_DEFAULT, "gm_nccl_stats")) {
        fprintf(stderr, "test_nccl_backend: libnccl.so.2 is not the CPU model's (set LD_LIBRARY_PATH to "
                        "<build>/tests/gpumodel/lib)\n");
        return 2;
    }
    int64_t steps = argc > 2 ? atoll(argv[2]) : 2;
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(argv[1], &sh) != MFSDP_OK) {
        fprintf(stderr, "test_nccl_backend: %s: %s\n", argv[1], mfsdp_last_error(NULL));
        return 2;
    }
    int n = (int)mfsdp_schedule_world_size(sh);
    if (n < 1 || n > MAXR) {
        fprintf(stderr, "test_nccl_backend: %s has %d ranks (1..%d here)\n", argv[1], n, MAXR);
        return 2;
    }
    xchg x = {.n = n, .cap = mf_check_xchg_bytes(sh)};
    pthread_mutex_init(&x.mu, NULL);
    pthread_cond_init(&x.cv, NULL);
    x.buf[0] = malloc((size_t)n * x.cap + 1);
    x.buf[1] = malloc((size_t)n * x.cap + 1);
    rank_arg *args = calloc((size_t)n, sizeof *args);
    pthread_t t[MAXR];
    ncclUniqueId id;
    if (!x.buf[0] || !x.buf[1] || !args || ncclGetUniqueId(&id) != ncclSuccess) {
        fprintf(stderr, "test_nccl_backend: out of memory or no unique id\n");
        return 2;
    }
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg){.sh = sh, .id = id, .rank = r, .steps = steps, .x = &x};
        if (pthread_create(&t[r], NULL, rank_main, &args[r]) != 0) {
            fprintf(stderr, "test_nccl_backend: cannot start rank %d\n", r);
            return 2;
        }
    }
    int bad = 0, unexpected = 0;
    const char *expect = getenv("TEST_NCCL_EXPECT_FAIL");
    for (int r = 0; r < n; r++) {
        pthread_join(t[r], NULL);
        if (args[r].rc != 0) {
            bad++;
            fprintf(stderr, "test_nccl_backend: rank %d: rc %d: %s%s%s\n", r, args[r].rc, args[r].out.msg,
                    args[r].out.own[0] ? " / own: " : "", args[r].out.own);
        }
        if (expect && (args[r].rc != 1 || !matches_one(args[r].out.own, expect))) {
            unexpected++;
            fprintf(stderr, "test_nccl_backend: rank %d did not fail with one of \"%s\" (rc %d: %s)\n", r, expect,
                    args[r].rc, args[r].out.own);
        }
    }
    printf("test_nccl_backend: %s: %d ranks, %lld steps, %d failed%s\n", argv[1], n, (long long)steps, bad,
           expect ? (unexpected ? ", not as expected" : ", as expected") : "");
    if (expect)
        bad = unexpected;
    free(args);
    free(x.buf[0]);
    free(x.buf[1]);
    mfsdp_schedule_free(sh);
    return bad ? 1 : 0;
}
