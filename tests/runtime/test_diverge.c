/*
 * test_diverge: ranks that diverge from each other's program (issue 39,
 * docs/runtime.md §4.4). Each scenario runs one full step on every rank,
 * then rank 1 does something else than the others at step 2:
 *
 *   short    rank 1 ends step 2 after 1 of its 2 microbatches, the others
 *            begin microbatch 1
 *   eval     rank 1 runs an evaluation pass, the others begin step 2
 *   helper   rank 1 calls mfsdp_allreduce, the others begin step 2
 *   sizes    every rank calls mfsdp_allreduce, rank 1 with 1 value, the
 *            others with 2 (on MPI this aborted the job: MPI_ERR_TRUNCATE)
 *   ckpt     rank 1 calls mfsdp_ckpt_save, the others begin step 2 (its
 *            exchange and the step's agreement would have paired)
 *   stop     rank 1 destroys its runtime, the others begin step 2
 *
 * On ZeRO-3 and Whole schedules every collective of the two programs
 * matches in kind, dtype and count, so before the agreement they mixed
 * their data silently (or waited out the timeout). Now: every rank's call
 * at that point returns MFSDP_ERR_MISMATCH, well within the timeout, with
 * one message on every rank naming the step, what each side was about to
 * do and the ranks; the failure is sticky; for `stop` the others time out
 * in the agreement (2 s), or are woken by the first that did, instead.
 *
 *   test_diverge SCHEDULE...        local backend (thread-ranks), every schedule
 *   test_diverge --mpi SCHEDULE     this process is one MPI rank; first, rank
 *                                   1's stream thread fails to start in
 *                                   mfsdp_create (fault injection): the
 *                                   others fail at once naming rank 1
 */
#include <pthread.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mfsdp.h"
#include "mf_streams.h"
#include "mfsdp_ckpt.h"
#ifdef MFSDP_HAVE_MPI
#include <mpi.h>
#include "mfsdp_mpi.h"
#endif

enum { SC_SHORT, SC_EVAL, SC_HELPER, SC_SIZES, SC_CKPT, SC_STOP, SC_COUNT };
static const char *const sc_names[SC_COUNT] = {"short", "eval", "helper", "sizes", "ckpt", "stop"};
#define ODD 1            /* the rank that diverges */
#define TIMEOUT_MS 20000
#define STOP_TIMEOUT_MS 2000

typedef struct job {
    const mfsdp_schedule *sh;
    mfsdp_config cfg;
    int64_t rank;
    int sc;
    mfsdp_result r;      /* the first failing call's result */
    char where[64];      /* that call */
    char msg[1024];      /* its message */
    mfsdp_result again;  /* a later hook's result (sticky) */
    double secs;         /* from step 2's first call to the failure */
} job;

#include "diverge_calls.h"

static void run_job(job *j)
{
    mfsdp_runtime *rt = NULL;
    j->r = MFSDP_OK;
    j->again = MFSDP_OK;
    j->cfg.timeout_ms = j->sc == SC_STOP ? STOP_TIMEOUT_MS : TIMEOUT_MS;
    CALL(NULL, "mfsdp_create", mfsdp_create(j->sh, &j->cfg, &rt));
    if (j->r != MFSDP_OK)
        return;
    j->rank = mfsdp_rank(rt);
    int64_t M = mfsdp_schedule_microbatches(j->sh);
    bool odd = j->rank == ODD;
    double v[2] = {1, 2};
    step(j, rt, M);   /* step 1: the same everywhere */
    double t0 = now_s();
    switch (j->sc) {
    case SC_SHORT:
        step(j, rt, odd ? 1 : M);
        break;
    case SC_EVAL:
        if (odd)
            CALL(rt, "mfsdp_eval_forward_pre(0)", mfsdp_eval_forward_pre(rt, 0));
        else
            step(j, rt, M);
        break;
    case SC_HELPER:
        if (odd)
            CALL(rt, "mfsdp_allreduce", mfsdp_allreduce(rt, v, 2, MFSDP_REDUCE_SUM));
        else
            step(j, rt, M);
        break;
    case SC_SIZES:
        CALL(rt, "mfsdp_allreduce", mfsdp_allreduce(rt, v, odd ? 1 : 2, MFSDP_REDUCE_SUM));
        break;
    case SC_CKPT:
        if (odd) {
            char dir[] = "/tmp/mfsdp-diverge-XXXXXX", sub[64];
            mfsdp_ckpt_save_options so = MFSDP_CKPT_SAVE_OPTIONS_INIT;
            if (mkdtemp(dir)) {
                snprintf(sub, sizeof sub, "%s/ckpt", dir);
                CALL(rt, "mfsdp_ckpt_save", mfsdp_ckpt_save(rt, sub, &so));
                rmdir(sub);   /* (nothing is written: the call fails first) */
                rmdir(dir);
            }
        } else {
            step(j, rt, M);
        }
        break;
    default:   /* SC_STOP */
        if (!odd)
            step(j, rt, M);
        break;
    }
    j->secs = now_s() - t0;
    if (j->r != MFSDP_OK)
        j->again = mfsdp_step_begin(rt);
    mfsdp_destroy(rt);
}

/* Where rank `rank` must have failed, and what the message must say; NULL
 * where it must not fail. */
static const char *expected_where(int sc, int64_t rank)
{
    bool odd = rank == ODD;
    switch (sc) {
    case SC_SHORT: return odd ? "mfsdp_step_end" : "mfsdp_forward_pre(0,1)";
    case SC_EVAL: return odd ? "mfsdp_eval_forward_pre(0)" : "mfsdp_step_begin";
    case SC_HELPER: return odd ? "mfsdp_allreduce" : "mfsdp_step_begin";
    case SC_SIZES: return "mfsdp_allreduce";
    case SC_CKPT: return odd ? "mfsdp_ckpt_save" : "mfsdp_step_begin";
    default: return odd ? NULL : "mfsdp_step_begin";
    }
}

static const char *const sc_odd_says[SC_COUNT] = {
    "rank 1: end step 2 after 1 of its 2 microbatches (mfsdp_step_end: a short step)",
    "rank 1: run unit 0 \"embed\" of an evaluation pass (1 steps begun)",
    "rank 1: call mfsdp_allreduce (16 bytes per rank; 1 steps begun)",
    "rank 1: call mfsdp_allreduce (8 bytes per rank; 1 steps begun)",
    "rank 1: call mfsdp_ckpt_save (0 bytes per rank; 1 steps begun)",
    NULL};
static const char *const sc_others_say[SC_COUNT] = {
    ": begin microbatch 1 of step 2 (mfsdp_forward_pre(unit 0, microbatch 1))",
    ": begin step 2 (mfsdp_step_begin)",
    ": begin step 2 (mfsdp_step_begin)",
    ": call mfsdp_allreduce (16 bytes per rank; 1 steps begun)",
    ": begin step 2 (mfsdp_step_begin)",
    NULL};

/* One rank's verdict: 0, or 1 with the reason in why. */
static int check_job(const job *j, char *why, size_t size)
{
    const char *where = expected_where(j->sc, j->rank);
    const char *sc = sc_names[j->sc];
    if (!where) {
        if (j->r != MFSDP_OK)
            return snprintf(why, size, "%s: rank %lld failed at %s: %s", sc, (long long)j->rank, j->where,
                            j->msg), 1;
        return 0;
    }
    mfsdp_result want = j->sc == SC_STOP ? MFSDP_ERR_TIMEOUT : MFSDP_ERR_MISMATCH;
    if (j->sc == SC_STOP && j->r == MFSDP_ERR_ABORTED)
        want = MFSDP_ERR_ABORTED;   /* woken by the first survivor that timed out */
    if (j->r != want || strcmp(j->where, where) != 0)
        return snprintf(why, size, "%s: rank %lld: expected %s at %s, got %s at %s: %s", sc, (long long)j->rank,
                        mfsdp_result_string(want), where, mfsdp_result_string(j->r),
                        j->r == MFSDP_OK ? "-" : j->where, j->r == MFSDP_OK ? "(no error)" : j->msg), 1;
    /* (a peer's destroy may abort this rank's ops still in flight first:
     * then the sticky failure is that abort) */
    if (j->again == MFSDP_OK)
        return snprintf(why, size, "%s: rank %lld: the failure is not sticky (the next hook: %s)", sc,
                        (long long)j->rank, mfsdp_result_string(j->again)), 1;
    if (j->sc == SC_STOP && (!strstr(j->msg, "agreement") || j->secs > STOP_TIMEOUT_MS / 1000.0 + 3))
        return snprintf(why, size, "stop: rank %lld after %.1f s: %s", (long long)j->rank, j->secs, j->msg), 1;
    if (j->sc == SC_STOP)
        return 0;
    if (j->secs > TIMEOUT_MS / 4000.0)
        return snprintf(why, size, "%s: rank %lld failed only after %.1f s (timeout %d ms)", sc,
                        (long long)j->rank, j->secs, TIMEOUT_MS), 1;
    if (!strstr(j->msg, "the ranks' programs diverge") || !strstr(j->msg, sc_odd_says[j->sc]) ||
        !strstr(j->msg, sc_others_say[j->sc]))
        return snprintf(why, size, "%s: rank %lld: the message misses what each side did: %s", sc,
                        (long long)j->rank, j->msg), 1;
    return 0;
}

/* ---- local backend ---- */

static void *job_main(void *p)
{
    run_job(p);
    return NULL;
}

static void run_local(const char *path, int sc)
{
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(path, &sh) != MFSDP_OK)
        fail_msg("%s", mfsdp_last_error(NULL));
    int64_t world = mfsdp_schedule_world_size(sh);
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(world, &g), MFSDP_OK);
    job *jobs = calloc((size_t)world, sizeof *jobs);
    pthread_t *th = calloc((size_t)world, sizeof *th);
    assert_non_null(jobs);
    assert_non_null(th);
    for (int64_t r = 0; r < world; r++) {
        jobs[r].sh = sh;
        jobs[r].sc = sc;
        mfsdp_config_init(&jobs[r].cfg);
        jobs[r].cfg.local_group = g;
        jobs[r].cfg.rank = r;
        assert_int_equal(pthread_create(&th[r], NULL, job_main, &jobs[r]), 0);
    }
    for (int64_t r = 0; r < world; r++)
        pthread_join(th[r], NULL);
    char why[1400];
    for (int64_t r = 0; r < world; r++)
        if (check_job(&jobs[r], why, sizeof why))
            fail_msg("%s: %s", path, why);
    /* One message on every rank that got one. */
    for (int64_t r = 1; r < world && sc != SC_STOP; r++)
        if (strcmp(jobs[r].msg, jobs[0].msg) != 0)
            fail_msg("%s: %s: rank 0 and rank %lld differ:\n  %s\n  %s", path, sc_names[sc], (long long)r,
                     jobs[0].msg, jobs[r].msg);
    print_message("%s: %s: rank 0: %s\n", path, sc_names[sc], jobs[0].msg);
    free(jobs);
    free(th);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

static char **paths;
static int npaths;

static void test_diverge_local(void **state)
{
    (void)state;
    for (int i = 0; i < npaths; i++)
        for (int sc = 0; sc < SC_COUNT; sc++)
            run_local(paths[i], sc);
}

/* ---- mpi backend ---- */

static int run_mpi(const char *path, int *argc, char ***argv)
{
#ifdef MFSDP_HAVE_MPI
    int provided = 0, me = 0, n = 0, bad = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm comm = MPI_COMM_WORLD;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(path, &sh) != MFSDP_OK) {
        fprintf(stderr, "test_diverge: %s\n", mfsdp_last_error(NULL));
        MPI_Abort(comm, 2);
    }
    /* A stream thread that cannot start on rank 1 (docs/runtime.md §2). */
    {
        mfsdp_config cfg;
        mfsdp_config_init(&cfg);
        mfsdp_config_set_mpi(&cfg, &comm);
        cfg.timeout_ms = TIMEOUT_MS;
        if (me == ODD)
            mf_streams_fail_next_start();
        mfsdp_runtime *rt = NULL;
        double t0 = now_s();
        mfsdp_result r = mfsdp_create(sh, &cfg, &rt);
        double secs = now_s() - t0;
        const char *msg = mfsdp_last_error(NULL);
        bool ok = me == ODD ? r == MFSDP_ERR_INTERNAL && strstr(msg, "cannot start the inner stream thread")
                            : r == MFSDP_ERR_ABORTED && strstr(msg, "rank 1 failed to create its runtime");
        if (!ok || secs > TIMEOUT_MS / 4000.0) {
            fprintf(stderr, "FAILED: %s: start: rank %d: %s after %.1f s: %s\n", path, me, mfsdp_result_string(r),
                    secs, msg);
            bad = 1;
        } else if (me == 0) {
            printf("%s: start: rank 0: %s\n", path, msg);
        }
        mfsdp_destroy(rt);
    }
    for (int sc = 0; sc < SC_COUNT; sc++) {
        job j;
        memset(&j, 0, sizeof j);
        j.sh = sh;
        j.sc = sc;
        mfsdp_config_init(&j.cfg);
        mfsdp_config_set_mpi(&j.cfg, &comm);
        run_job(&j);
        char why[1400];
        int mine = check_job(&j, why, sizeof why);
        /* the same message on every rank (a hash of it, gathered) */
        unsigned long h = 5381;
        for (const char *c = sc == SC_STOP ? "" : j.msg; *c; c++)
            h = h * 33 + (unsigned char)*c;
        unsigned long *all = calloc((size_t)n, sizeof *all);
        MPI_Allgather(&h, 1, MPI_UNSIGNED_LONG, all, 1, MPI_UNSIGNED_LONG, comm);
        for (int r = 0; r < n && !mine; r++)
            if (all[r] != all[0] && (sc != SC_STOP))
                mine = snprintf(why, sizeof why, "%s: rank %d's message differs from rank 0's: %s",
                                sc_names[sc], me, j.msg) > 0;
        free(all);
        if (mine)
            fprintf(stderr, "FAILED: %s: %s\n", path, why);
        else if (me == 0)
            printf("%s: %s: rank 0: %s\n", path, sc_names[sc], j.r == MFSDP_OK ? "ok" : j.msg);
        bad |= mine;
    }
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
    if (me == 0)
        printf("%s\n", any ? "0 passed, 1 failed" : "1 passed, 0 failed");
    mfsdp_schedule_free(sh);
    MPI_Finalize();
    return any ? 1 : 0;
#else
    (void)path;
    (void)argc;
    (void)argv;
    fprintf(stderr, "built without MPI\n");
    return 77;
#endif
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "--mpi"))
        return run_mpi(argv[2], &argc, &argv);
    paths = argv + 1;
    npaths = argc - 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_diverge_local)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
