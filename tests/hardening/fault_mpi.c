/*
 * mfsdp-fault-mpi: one MPI process per rank drives the replay runtime through
 * its hooks (no oracle, zero gradients) while one rank dies: it calls
 * _exit(3) -- no MPI_Finalize, no mfsdp_destroy, like a crash -- at a chosen
 * point. Every surviving rank must get an error from the hook (or create) it
 * is in, within the timeout, destroy its runtime and free its schedule; it
 * then prints one line "rank R: survived: ..." and exits 1 without
 * MPI_Finalize (a collective finalize would wait for the dead rank).
 *
 *   mfsdp-fault-mpi SCHEDULE.yaml --die-rank R --die-at create|forward_pre|backward_post|step_end
 *                   [--die-step S] [--kill] [--steps N] [--timeout-ms T]
 *
 * The dying rank dies in step S (default 2; 0 with create: before create),
 * at the middle unit, microbatch 0 for the unit hooks, before making the
 * call; with --kill by SIGKILL instead of _exit(3). Without --die-rank nothing
 * dies and every rank prints "rank R: completed N steps" and exits 0.
 * Used by fault_mpi.cmake, which also checks what mpirun does.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mfsdp.h"
#include "mfsdp_mpi.h"
#include "mf_opts.h"

static int rank = -1, die_rank = -1, die_step = 2;
static const char *die_at = "";
static bool die_kill;       /* SIGKILL instead of _exit(3) */

static void die(void)
{
    fflush(stdout);
    if (die_kill)
        raise(SIGKILL);
    _exit(3);
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void maybe_die(const char *where, int step, int unit, int mid, int64_t m)
{
    if (rank == die_rank && step == die_step && strcmp(where, die_at) == 0 && unit == mid && m == 0) {
        printf("rank %d: dying at %s (step %d, unit %d)\n", rank, where, step, unit);
        die();
    }
}

/* Where a hook failed: its name, when it was called, in which step. */
typedef struct hook_at {
    const char *where;
    double t0;              /* ms, when the call began */
    int step;
} hook_at;

/* One step's hooks, microbatch by microbatch (dying where told to). */
static mfsdp_result run_step(mfsdp_runtime *rt, int units, int64_t mbs, int mid, hook_at *at)
{
    int step = at->step;
    at->t0 = now_ms();
    at->where = "step_begin";
    mfsdp_result r = mfsdp_step_begin(rt);
    for (int64_t m = 0; m < mbs && r == MFSDP_OK; m++) {
        for (int u = 0; u < units && r == MFSDP_OK; u++) {
            maybe_die("forward_pre", step, u, mid, m);
            at->t0 = now_ms();
            at->where = "forward_pre";
            r = mfsdp_forward_pre(rt, u, m);
            if (r == MFSDP_OK) {
                at->t0 = now_ms();
                at->where = "forward_post";
                r = mfsdp_forward_post(rt, u, m);
            }
        }
        for (int u = units - 1; u >= 0 && r == MFSDP_OK; u--) {
            at->t0 = now_ms();
            at->where = "backward_pre";
            r = mfsdp_backward_pre(rt, u, m);
            maybe_die("backward_post", step, u, mid, m);
            if (r == MFSDP_OK) {
                at->t0 = now_ms();
                at->where = "backward_post";
                r = mfsdp_backward_post(rt, u, m);
            }
        }
    }
    maybe_die("step_end", step, mid, mid, 0);
    if (r == MFSDP_OK) {
        at->t0 = now_ms();
        at->where = "step_end";
        r = mfsdp_step_end(rt);
    }
    return r;
}

/* The command line; false after "bad argument". */
static bool parse_args(int argc, char **argv, const char **path, int *steps, int64_t *timeout)
{
    enum { O_RANK, O_AT, O_KILL, O_STEP, O_STEPS, O_TIMEOUT };
    static const mf_opt opts[] = {
        {"--die-rank", NULL, "a value", O_RANK}, {"--die-at", NULL, "a value", O_AT},
        {"--kill", NULL, NULL, O_KILL},          {"--die-step", NULL, "a value", O_STEP},
        {"--steps", NULL, "a value", O_STEPS},   {"--timeout-ms", NULL, "a value", O_TIMEOUT}};
    mf_opts p;
    mf_opts_init(&p, "mfsdp-fault-mpi", argc, argv, opts, 6, NULL);
    p.quiet = true; /* every mistake is a bad argument */
    int id;
    const char *v;
    while ((id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == O_RANK)
            die_rank = atoi(v);
        else if (id == O_AT)
            die_at = v;
        else if (id == O_KILL)
            die_kill = true;
        else if (id == O_STEP)
            die_step = atoi(v);
        else if (id == O_STEPS)
            *steps = atoi(v);
        else if (id == O_TIMEOUT)
            *timeout = atoll(v);
        else if (id == MF_OPTS_OPERAND && !*path)
            *path = v;
        else {
            fprintf(stderr, "mfsdp-fault-mpi: bad argument '%s'\n", p.arg);
            return false;
        }
    }
    return true;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int steps = 3;
    int64_t timeout = 3000;
    if (!parse_args(argc, argv, &path, &steps, &timeout))
        return 2;
    if (!path)
        return 2;
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    setvbuf(stdout, NULL, _IOLBF, 0);

    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(path, &sh) != MFSDP_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, mfsdp_last_error(NULL));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int units = mfsdp_schedule_num_units(sh), mid = units / 2;
    int64_t mbs = mfsdp_schedule_microbatches(sh);
    if (rank == die_rank && die_step == 0 && strcmp(die_at, "create") == 0) {
        printf("rank %d: dying before create\n", rank);
        die();
    }
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    MPI_Comm comm = MPI_COMM_WORLD;
    mfsdp_config_set_mpi(&cfg, &comm);
    cfg.timeout_ms = timeout;
    mfsdp_runtime *rt = NULL;
    hook_at at = {"create", now_ms(), 0};
    mfsdp_result r = mfsdp_create(sh, &cfg, &rt);
    if (r == MFSDP_OK) {
        for (at.step = 1; at.step <= steps && r == MFSDP_OK; at.step++)
            r = run_step(rt, units, mbs, mid, &at);
        at.step--;
    }
    if (r == MFSDP_OK) {
        printf("rank %d: completed %d steps\n", rank, steps);
        mfsdp_destroy(rt);
        mfsdp_schedule_free(sh);
        MPI_Finalize();
        return 0;
    }
    double waited = now_ms() - at.t0;
    char msg[600];
    snprintf(msg, sizeof msg, "%s", rt ? mfsdp_last_error(rt) : mfsdp_last_error(NULL));
    /* A sticky error: the next hook returns it at once. */
    mfsdp_result again = rt ? mfsdp_step_end(rt) : r;
    double t1 = now_ms();
    mfsdp_destroy(rt);
    mfsdp_schedule_free(sh);
    printf("rank %d: survived: step %d %s returned %s after %.0f ms (timeout %lld ms), then %s; "
           "destroyed in %.0f ms: %.300s\n",
           rank, at.step, at.where, mfsdp_result_string(r), waited, (long long)timeout, mfsdp_result_string(again),
           now_ms() - t1, msg);
    fflush(stdout);
    _exit(1);
}
