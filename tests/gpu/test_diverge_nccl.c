/*
 * test_diverge_nccl: ranks that diverge from each other's program on the
 * NCCL backend (issue 39, docs/runtime.md §4.4), whose agreement rides on
 * the backend's small world exchange (mf_backend_nccl.c: its own stream,
 * event and buffers; the trainer's streams are not drained). Every mesh
 * rank is a thread of this process with its own runtime (a unique id shared
 * by the threads, host compute, the watchdog on). Each scenario runs one
 * full step on every rank, then at step 2:
 *
 *   same     every rank runs step 2 and 3 as well: no error anywhere
 *   short    rank 1 ends step 2 after 1 of its 2 microbatches, the others
 *            begin microbatch 1
 *   eval     rank 1 runs an evaluation pass, the others begin step 2
 *   helper   rank 1 calls mfsdp_ckpt_save, the others begin step 2 (the
 *            collective helpers refuse GPU backends; the checkpoint calls
 *            agree first)
 *   graphs   MFSDP_NCCL_GRAPHS with a device compute stream: step 1 captured
 *            one microbatch per graph in the thread-local capture mode (its
 *            decision points agree inside the captures, which must not be
 *            invalidated), the graphs launched; then step 2 as `short`
 *
 * Every rank's call at that point must return MFSDP_ERR_MISMATCH, well
 * within the timeout, with one message on every rank naming what each side
 * was about to do; the failure is sticky. (tests/runtime/test_diverge.c
 * runs the same scenarios, and more, on the CPU backends.)
 *
 *   test_diverge_nccl [--no-graphs] SCHEDULE.yaml...
 *                                            the scenarios on each schedule
 *                                            (without `graphs` on those after
 *                                            --no-graphs)
 *   test_diverge_nccl --bench SCHEDULE STEPS the time per decision point:
 *                                            STEPS steps with and without
 *                                            the agreement (MFSDP_AGREE)
 *
 * Runs only on the model (LD_LIBRARY_PATH=<build>/tests/gpumodel/lib, set by
 * CTest), or on a machine with as many GPUs as the schedule has ranks.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mfsdp.h"
#include "mfsdp_ckpt.h"
#include "mfsdp_nccl.h"

enum { SC_SAME, SC_SHORT, SC_EVAL, SC_HELPER, SC_GRAPHS, SC_COUNT };
static const char *const sc_names[SC_COUNT] = {"same", "short", "eval", "helper", "graphs"};
#define ODD 1
#define MAXR 16
#define TIMEOUT_MS 20000

typedef struct job {
    const mfsdp_schedule *sh;
    ncclUniqueId id;
    int64_t rank;
    int sc;
    int64_t steps;       /* --bench: steps to run */
    mfsdp_result r;      /* the first failing call's result */
    char where[64];
    char msg[1024];
    mfsdp_result again;  /* the next hook after the failure (sticky) */
    double secs;         /* step 2's first call to the failure; --bench: the steps */
} job;

#include "diverge_calls.h"

#define CUDA_CALL(name, call)                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (j->r == MFSDP_OK && e_ != cudaSuccess) {                                            \
            j->r = MFSDP_ERR_BACKEND;                                                           \
            snprintf(j->where, sizeof j->where, "%s", name);                                    \
            snprintf(j->msg, sizeof j->msg, "%s: %s", name, cudaGetErrorName(e_));              \
        }                                                                                       \
    } while (0)

/* Step 1 as docs/gpu.md's CUDA graph mode: one thread-local capture per
 * microbatch (its decision points agree inside it), then the graphs
 * launched in order and the compute stream synchronized. */
static void captured_step(job *j, mfsdp_runtime *rt, cudaStream_t compute, int64_t M)
{
    int U = mfsdp_schedule_num_units(j->sh);
    cudaGraphExec_t x[8] = {0};
    for (int64_t m = 0; m < M && m < 8 && j->r == MFSDP_OK; m++) {
        cudaGraph_t g = NULL;
        CUDA_CALL("cudaStreamBeginCapture", cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
        if (m == 0)
            CALL(rt, "mfsdp_step_begin (captured)", mfsdp_step_begin(rt));
        for (int u = 0; u < U; u++) {
            CALL(rt, "mfsdp_forward_pre (captured)", mfsdp_forward_pre(rt, u, m));
            CALL(rt, "mfsdp_forward_post (captured)", mfsdp_forward_post(rt, u, m));
        }
        for (int u = U - 1; u >= 0; u--) {
            CALL(rt, "mfsdp_backward_pre (captured)", mfsdp_backward_pre(rt, u, m));
            CALL(rt, "mfsdp_backward_post (captured)", mfsdp_backward_post(rt, u, m));
        }
        if (m == M - 1)
            CALL(rt, "mfsdp_step_end (captured)", mfsdp_step_end(rt));
        CUDA_CALL("cudaStreamEndCapture (the capture was invalidated?)", cudaStreamEndCapture(compute, &g));
        if (g) {
            CUDA_CALL("cudaGraphInstantiate", cudaGraphInstantiate(&x[m], g, 0));
            cudaGraphDestroy(g);
        }
    }
    for (int64_t m = 0; m < M && m < 8; m++)
        if (x[m])
            CUDA_CALL("cudaGraphLaunch", cudaGraphLaunch(x[m], compute));
    CUDA_CALL("cudaStreamSynchronize", cudaStreamSynchronize(compute));
    for (int64_t m = 0; m < M && m < 8; m++)
        if (x[m])
            cudaGraphExecDestroy(x[m]);
    CALL(rt, "mfsdp_synchronize", mfsdp_synchronize(rt));
}

static void *job_main(void *p)
{
    job *j = p;
    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    nc.unique_id = j->id;
    nc.has_unique_id = 1;
    cudaStream_t compute = NULL;
    if (j->sc == SC_GRAPHS) {
        if (cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) != cudaSuccess) {
            j->r = MFSDP_ERR_BACKEND;
            snprintf(j->msg, sizeof j->msg, "cannot create the compute stream");
            return NULL;
        }
        nc.compute_stream = compute;
        nc.flags |= MFSDP_NCCL_GRAPHS;
    } else {
        nc.flags |= MFSDP_NCCL_HOST_COMPUTE;
    }
    nc.watchdog_poll_ms = 50;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_nccl(&cfg, &nc);
    cfg.rank = j->rank;
    cfg.timeout_ms = TIMEOUT_MS;
    mfsdp_runtime *rt = NULL;
    j->r = MFSDP_OK;
    j->again = MFSDP_OK;
    CALL(NULL, "mfsdp_create", mfsdp_create(j->sh, &cfg, &rt));
    if (j->r != MFSDP_OK) {
        if (compute)
            cudaStreamDestroy(compute);
        return NULL;
    }
    int64_t M = mfsdp_schedule_microbatches(j->sh);
    bool odd = j->rank == ODD;
    if (j->steps > 0) {   /* --bench */
        step(j, rt, M);   /* warm */
        double t0 = now_s();
        for (int64_t s = 0; s < j->steps; s++)
            step(j, rt, M);
        CALL(rt, "mfsdp_synchronize", mfsdp_synchronize(rt));
        j->secs = now_s() - t0;
        mfsdp_destroy(rt);
        return NULL;
    }
    if (j->sc == SC_GRAPHS)
        captured_step(j, rt, compute, M);
    else
        step(j, rt, M);   /* step 1: the same everywhere */
    double t0 = now_s();
    switch (j->sc) {
    case SC_SAME:
        step(j, rt, M);
        step(j, rt, M);
        CALL(rt, "mfsdp_synchronize", mfsdp_synchronize(rt));
        break;
    case SC_SHORT:
    case SC_GRAPHS:
        step(j, rt, odd ? 1 : M);
        break;
    case SC_EVAL:
        if (odd)
            CALL(rt, "mfsdp_eval_forward_pre(0)", mfsdp_eval_forward_pre(rt, 0));
        else
            step(j, rt, M);
        break;
    default:   /* SC_HELPER */
        if (odd) {
            char dir[] = "/tmp/mfsdp-diverge-nccl-XXXXXX", sub[64];
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
    }
    j->secs = now_s() - t0;
    if (j->r != MFSDP_OK)
        j->again = mfsdp_step_begin(rt);
    mfsdp_destroy(rt);
    if (compute)
        cudaStreamDestroy(compute);
    return NULL;
}

/* Where rank `rank` must fail in scenario sc; NULL: nowhere. */
static const char *expected_where(int sc, int64_t rank)
{
    bool odd = rank == ODD;
    switch (sc) {
    case SC_SHORT:
    case SC_GRAPHS: return odd ? "mfsdp_step_end" : "mfsdp_forward_pre(0,1)";
    case SC_EVAL: return odd ? "mfsdp_eval_forward_pre(0)" : "mfsdp_step_begin";
    case SC_HELPER: return odd ? "mfsdp_ckpt_save" : "mfsdp_step_begin";
    default: return NULL;
    }
}

static const char *const sc_odd_says[SC_COUNT] = {
    NULL, "rank 1: end step 2 after 1 of its 2 microbatches (mfsdp_step_end: a short step)",
    "rank 1: run unit 0 \"embed\" of an evaluation pass (1 steps begun)",
    "rank 1: call mfsdp_ckpt_save (0 bytes per rank; 1 steps begun)",
    "rank 1: end step 2 after 1 of its 2 microbatches (mfsdp_step_end: a short step)"};
static const char *const sc_others_say[SC_COUNT] = {
    NULL, ": begin microbatch 1 of step 2 (mfsdp_forward_pre(unit 0, microbatch 1))",
    ": begin step 2 (mfsdp_step_begin)", ": begin step 2 (mfsdp_step_begin)",
    ": begin microbatch 1 of step 2 (mfsdp_forward_pre(unit 0, microbatch 1))"};

/* 0, or 1 with the reason in why. */
static int check_job(const job *j, char *why, size_t size)
{
    const char *where = expected_where(j->sc, j->rank), *sc = sc_names[j->sc];
    if (!where) {
        if (j->r != MFSDP_OK)
            return snprintf(why, size, "%s: rank %lld failed at %s: %s", sc, (long long)j->rank, j->where, j->msg), 1;
        return 0;
    }
    if (j->r != MFSDP_ERR_MISMATCH || strcmp(j->where, where) != 0)
        return snprintf(why, size, "%s: rank %lld: expected MFSDP_ERR_MISMATCH at %s, got %s at %s: %s", sc,
                        (long long)j->rank, where, mfsdp_result_string(j->r), j->r == MFSDP_OK ? "-" : j->where,
                        j->r == MFSDP_OK ? "(no error)" : j->msg), 1;
    if (j->again == MFSDP_OK)
        return snprintf(why, size, "%s: rank %lld: the failure is not sticky", sc, (long long)j->rank), 1;
    if (j->secs > TIMEOUT_MS / 4000.0)
        return snprintf(why, size, "%s: rank %lld failed only after %.1f s", sc, (long long)j->rank, j->secs), 1;
    if (!strstr(j->msg, "the ranks' programs diverge") || !strstr(j->msg, sc_odd_says[j->sc]) ||
        !strstr(j->msg, sc_others_say[j->sc]))
        return snprintf(why, size, "%s: rank %lld: the message misses what each side did: %s", sc,
                        (long long)j->rank, j->msg), 1;
    return 0;
}

/* Runs every rank of sh as a thread; jobs[world]. Returns 0 or 2 (setup). */
static int run_ranks(const mfsdp_schedule *sh, int sc, int64_t steps, job *jobs, int world)
{
    pthread_t th[MAXR];
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess)
        return 2;
    for (int r = 0; r < world; r++) {
        jobs[r] = (job){.sh = sh, .id = id, .rank = r, .sc = sc, .steps = steps};
        if (pthread_create(&th[r], NULL, job_main, &jobs[r]) != 0)
            return 2;
    }
    for (int r = 0; r < world; r++)
        pthread_join(th[r], NULL);
    return 0;
}

static int load(const char *path, mfsdp_schedule **sh, int *world)
{
    if (mfsdp_schedule_load(path, sh) != MFSDP_OK) {
        fprintf(stderr, "test_diverge_nccl: %s: %s\n", path, mfsdp_last_error(NULL));
        return 2;
    }
    *world = (int)mfsdp_schedule_world_size(*sh);
    if (*world < 2 || *world > MAXR) {
        fprintf(stderr, "test_diverge_nccl: %s has %d ranks (2..%d here)\n", path, *world, MAXR);
        return 2;
    }
    return 0;
}

static int scenarios(const char *path, bool graphs)
{
    mfsdp_schedule *sh = NULL;
    int world = 0, bad = 0;
    if (load(path, &sh, &world))
        return 2;
    job jobs[MAXR];
    char why[1400];
    for (int sc = 0; sc < SC_COUNT; sc++) {
        if (sc == SC_GRAPHS && !graphs)
            continue;
        if (run_ranks(sh, sc, 0, jobs, world)) {
            fprintf(stderr, "test_diverge_nccl: cannot start the ranks\n");
            return 2;
        }
        int mine = 0;
        for (int r = 0; r < world; r++)
            if (check_job(&jobs[r], why, sizeof why)) {
                fprintf(stderr, "FAILED: %s: %s\n", path, why);
                mine = 1;
            }
        for (int r = 1; r < world && !mine; r++)
            if (strcmp(jobs[r].msg, jobs[0].msg) != 0) {
                fprintf(stderr, "FAILED: %s: %s: rank 0 and rank %d differ:\n  %s\n  %s\n", path, sc_names[sc], r,
                        jobs[0].msg, jobs[r].msg);
                mine = 1;
            }
        if (!mine)
            printf("%s: %s: rank 0: %s\n", path, sc_names[sc], jobs[0].r == MFSDP_OK ? "ok" : jobs[0].msg);
        bad |= mine;
    }
    mfsdp_schedule_free(sh);
    return bad;
}

/* The time per decision point: steps with and without the agreement, the
 * best of three runs each. */
static int bench(const char *path, int64_t steps)
{
    mfsdp_schedule *sh = NULL;
    int world = 0;
    if (load(path, &sh, &world) || steps < 1)
        return 2;
    int64_t M = mfsdp_schedule_microbatches(sh);
    double best[2] = {1e30, 1e30};
    job jobs[MAXR];
    for (int k = 0; k < 6; k++) {
        int on = k % 2;
        setenv("MFSDP_AGREE", on ? "1" : "0", 1);
        if (run_ranks(sh, SC_SAME, steps, jobs, world))
            return 2;
        double worst = 0;
        for (int r = 0; r < world; r++) {
            if (jobs[r].r != MFSDP_OK) {
                fprintf(stderr, "test_diverge_nccl: --bench: rank %d: %s: %s\n", r, jobs[r].where, jobs[r].msg);
                return 1;
            }
            worst = jobs[r].secs > worst ? jobs[r].secs : worst;
        }
        best[on] = worst < best[on] ? worst : best[on];
    }
    double points = (double)steps * (double)M;   /* step_begin + forward_pre(0, m > 0) */
    printf("%s: %d ranks, %lld steps of %lld microbatches: %.3f ms/step with the agreement, %.3f without: "
           "%.1f us per decision point (%.0f points)\n",
           path, world, (long long)steps, (long long)M, 1e3 * best[1] / (double)steps, 1e3 * best[0] / (double)steps,
           1e6 * (best[1] - best[0]) / points, points);
    mfsdp_schedule_free(sh);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "--bench"))
        return bench(argv[2], atoll(argv[3]));
    if (argc < 2) {
        fprintf(stderr, "usage: test_diverge_nccl SCHEDULE.yaml... | --bench SCHEDULE.yaml STEPS\n");
        return 2;
    }
    int bad = 0;
    bool graphs = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-graphs")) {
            graphs = false;
            continue;
        }
        int r = scenarios(argv[i], graphs);
        if (r == 2)
            return 2;
        bad |= r;
    }
    printf("%s\n", bad ? "FAILED" : "passed");
    return bad;
}
