/*
 * mfsdp-contract-bench: what the loop contract costs (docs/performance.md,
 * "The loop contract"), each figure next to its reference measured in the
 * same run:
 *
 *   trace check   mf_trace_admit + mf_trace_advance per hook, over the hook
 *                 sequence of full steps, against the whole hook (the replay
 *                 loop with the check: its lists issued on the local
 *                 backend, synchronous); goal <= 20 ns per hook
 *   verify on load  mf_verify_run on a loaded schedule against the load
 *                 itself (parse, structural checks, summary) of the same
 *                 file; goal: the verifier adds < 20 % to the load
 *
 *   mfsdp-contract-bench HOOK_SCHEDULE.yaml LOAD_SCHEDULE.yaml
 *
 * HOOK_SCHEDULE has a world of 1 (the local backend runs it on one thread);
 * LOAD_SCHEDULE is the big one (Llama-3-8B HFSDP). Best of several rounds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mf_diag.h"
#include "mf_load.h"
#include "mf_rt.h"
#include "mf_trace.h"
#include "mf_verify.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One full step's hooks through the trace check alone; returns the count. */
static int64_t trace_step(mf_rt *rt)
{
    const mf_schedule *s = rt->s;
    int64_t n = 0;
    unsigned pos;
#define HOOK(ph, u, m)                                                 \
    do {                                                               \
        if (mf_trace_admit(rt, ph, u, m, &pos) != MFSDP_OK)            \
            abort();                                                   \
        mf_trace_advance(rt, ph, u);                                   \
        n++;                                                           \
    } while (0)
    HOOK(MF_PHASE_STEP_BEGIN, -1, -1);
    for (int64_t m = 0; m < s->microbatches; m++) {
        for (int u = 0; u < s->nunits; u++) {
            HOOK(MF_PHASE_FORWARD_PRE, u, m);
            HOOK(MF_PHASE_FORWARD_POST, u, m);
        }
        for (int u = s->nunits - 1; u >= 0; u--) {
            HOOK(MF_PHASE_BACKWARD_PRE, u, m);
            HOOK(MF_PHASE_BACKWARD_POST, u, m);
        }
    }
    HOOK(MF_PHASE_STEP_END, -1, -1);
#undef HOOK
    return n;
}

/* One full step through the public hooks; returns the count. */
static int64_t replay_step(mfsdp_runtime *rt, int U, int64_t M)
{
    int64_t n = 2;
    if (mfsdp_step_begin(rt) != MFSDP_OK)
        abort();
    for (int64_t m = 0; m < M; m++) {
        for (int u = 0; u < U; u++)
            if (mfsdp_forward_pre(rt, u, m) != MFSDP_OK || mfsdp_forward_post(rt, u, m) != MFSDP_OK)
                abort();
        for (int u = U - 1; u >= 0; u--)
            if (mfsdp_backward_pre(rt, u, m) != MFSDP_OK || mfsdp_backward_post(rt, u, m) != MFSDP_OK)
                abort();
        n += 4 * U;
    }
    if (mfsdp_step_end(rt) != MFSDP_OK)
        abort();
    return n;
}

static int bench_trace(const char *path)
{
    mfsdp_schedule *sh;
    if (mfsdp_schedule_load(path, &sh) != MFSDP_OK || mfsdp_schedule_world_size(sh) != 1) {
        fprintf(stderr, "%s: %s\n", path, sh ? "needs a world of 1" : mfsdp_last_error(NULL));
        return 2;
    }
    mfsdp_local_group *g;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.flags = MFSDP_FLAG_SYNCHRONOUS;
    mfsdp_runtime *rt;
    if (mfsdp_local_group_create(1, &g) != MFSDP_OK || (cfg.local_group = g, mfsdp_create(sh, &cfg, &rt)) != MFSDP_OK) {
        fprintf(stderr, "create: %s\n", mfsdp_last_error(NULL));
        return 2;
    }
    int U = mfsdp_schedule_num_units(sh);
    int64_t M = mfsdp_schedule_microbatches(sh);
    double best_trace = 1e9, best_hook = 1e9;
    for (int round = 0; round < 7; round++) {
        int64_t n = 0;
        double t0 = now();
        for (int k = 0; k < 2000; k++)
            n += trace_step(rt);
        double tt = (now() - t0) / (double)n;
        n = 0;
        t0 = now();
        for (int k = 0; k < 200; k++)
            n += replay_step(rt, U, M);
        double th = (now() - t0) / (double)n;
        best_trace = tt < best_trace ? tt : best_trace;
        best_hook = th < best_hook ? th : best_hook;
    }
    printf("trace check (%s: %d units, M = %lld), best of 7 rounds\n", path, U, (long long)M);
    printf("  %-44s %10.1f ns/hook\n", "whole hook (replay loop with the check)", best_hook * 1e9);
    printf("  %-44s %10.1f ns/hook  (%.1f %% of the hook)\n", "the trace check alone", best_trace * 1e9,
           100.0 * best_trace / best_hook);
    printf("  %-44s %10.1f ns/hook\n", "the replay loop without it (difference)", (best_hook - best_trace) * 1e9);
    printf("  goal: trace check <= 20 ns/hook: %s\n", best_trace * 1e9 <= 20.0 ? "met" : "MISSED");
    mfsdp_destroy(rt);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
    return 0;
}

static int bench_verify(const char *path)
{
    double best_load = 1e9, best_verify = 1e9;
    char err[1024];
    for (int round = 0; round < 5; round++) {
        double t0 = now();
        mf_schedule *s = mf_load_schedule_file(path, err, sizeof err);
        double t1 = now();
        if (!s) {
            fprintf(stderr, "%s\n", err);
            return 2;
        }
        mf_source src = {path, NULL, 0};
        mf_diag d;
        mf_diag_init(&d, &src, stderr);
        int n = mf_verify_run(s, &d);
        double t2 = now();
        mf_schedule_free(s);
        if (n != 0)
            return 2;
        best_load = t1 - t0 < best_load ? t1 - t0 : best_load;
        best_verify = t2 - t1 < best_verify ? t2 - t1 : best_verify;
    }
    printf("verify on load (%s), best of 5 rounds\n", path);
    printf("  %-44s %10.1f ms\n", "load (parse, structure, summary)", best_load * 1e3);
    printf("  %-44s %10.1f ms  (+%.1f %% of the load)\n", "the verifier on the loaded schedule", best_verify * 1e3,
           100.0 * best_verify / best_load);
    printf("  goal: verify adds < 20 %% to the load: %s\n", best_verify < 0.2 * best_load ? "met" : "MISSED");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s HOOK_SCHEDULE.yaml LOAD_SCHEDULE.yaml\n", argv[0]);
        return 2;
    }
    int rc = bench_trace(argv[1]);
    return rc ? rc : bench_verify(argv[2]);
}
