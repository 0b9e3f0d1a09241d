/*
 * The device tests' checks replayed on the CPU local backend, on every
 * machine: test_nccl_device's cases (1x1, every mode of tc_nccl_modes eager,
 * hfsdp for each microbatch count its graph captures use) and
 * test_cuda_local_device's (every mode on every mesh, on thread-ranks), with
 * the same schedules, so the same arena offsets, and the same trainer_check
 * code; only the memory (host) and the ordering (at once) differ. A check
 * that is wrong about when a view is valid fails here, not on a device.
 * The graph cases replay with the fills a per-position graph replay gives
 * (trainer_check's `positions`: microbatches 1..M-2 fill microbatch 1's
 * values). It would have failed the old checks: reading every weight view after the
 * step finds a reused (stale) view in hfsdp 1x1 and zero3 1x4, which this test
 * asserts too, so the replay stays sensitive to that class of bug.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_backend.h"
#include "mf_pattern.h"
#include "trainer_check.h"

static bool host_fill(void *ctx, void *buf, mfsdp_dtype t, int64_t n, uint32_t seed)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        mf_dtype_store(buf, (mf_dtype)t, i, mf_pattern(seed, i));
    return true;
}

static bool host_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, src, bytes);
    return true;
}

static void *host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return malloc(bytes);
}

static void host_release(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static const tc_ops host_ops = {.fill = host_fill, .copy = host_copy, .write = host_copy, .read = host_copy,
                                .alloc = host_alloc, .release = host_release};

/* What one thread-rank does: `steps` trained and checked steps, then, when
 * after_step, the old check of every weight view after the step. */
typedef struct replay {
    const mfsdp_schedule *sh;
    int steps;
    bool after_step;
    bool positions;   /* tc_trainer.positions: the graph replay's fills */
} replay;

static bool rank_main(void *arg, mfsdp_local_group *g, int64_t rank, char *err, size_t errlen)
{
    const replay *p = arg;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = g;
    cfg.rank = rank;
    cfg.timeout_ms = 60000;
    mfsdp_runtime *rt = NULL;
    mfsdp_result r = mfsdp_create(p->sh, &cfg, &rt);
    if (r != MFSDP_OK) {
        snprintf(err, errlen, "rank %lld: create: %s: %s", (long long)rank, mfsdp_result_string(r),
                 mfsdp_last_error(NULL));
        return false;
    }
    /* one arena of the schedule's size, views at the schedule's offsets: the
     * layout the GPU backends use */
    if (mfsdp_allocated_bytes(rt) != mfsdp_schedule_peak_bytes(p->sh)) {
        snprintf(err, errlen, "rank %lld: %lld bytes allocated, the schedule's arena is %lld", (long long)rank,
                 (long long)mfsdp_allocated_bytes(rt), (long long)mfsdp_schedule_peak_bytes(p->sh));
        mfsdp_destroy(rt);
        return false;
    }
    tc_trainer tr;
    bool ok = tc_open(&tr, rt, p->sh, rank, &host_ops, NULL);
    tr.positions = p->positions;
    ok = ok && tc_train(&tr, p->steps) && (!p->after_step || tc_verify_weights_after_step(&tr));
    snprintf(err, errlen, "%s", tr.err);
    tc_close(&tr);
    mfsdp_destroy(rt);
    return ok;
}

/* Replays mode on mesh (M microbatches); returns true when every check
 * passed, else false with the message in err. */
static bool replay_positions(const char *mode, const rt_mesh *mesh, int64_t M, mf_reduce reduce, bool after_step,
                             bool positions, char *err, size_t errlen)
{
    mf_tb_spec spec;
    rt_model_spec(&spec, mode, mesh, M, reduce);
    mfsdp_schedule *sh = rt_build(&spec);
    replay p = {.sh = sh, .steps = 2, .after_step = after_step, .positions = positions};
    bool ok = tc_run_thread_ranks(sh, rank_main, &p, err, errlen);
    mfsdp_schedule_free(sh);
    return ok;
}

static bool replay_case(const char *mode, const rt_mesh *mesh, int64_t M, mf_reduce reduce, bool after_step,
                        char *err, size_t errlen)
{
    return replay_positions(mode, mesh, M, reduce, after_step, false, err, errlen);
}

static const rt_mesh one = {"1x1", 2, {1, 1}};

static void test_nccl_device_cases(void **state)
{
    (void)state;
    char err[512];
    for (int k = 0; k < tc_nccl_nmodes; k++)
        if (!replay_case(tc_nccl_modes[k], &one, 3, MF_REDUCE_AVG, false, err, sizeof err))
            fail_msg("%s on 1x1 (test_nccl_device eager): %s", tc_nccl_modes[k], err);
    for (int64_t M = TC_GRAPH_MIN_M; M <= TC_GRAPH_MAX_M; M++)
        if (!replay_positions("hfsdp", &one, M, MF_REDUCE_AVG, false, true, err, sizeof err))
            fail_msg("hfsdp on 1x1, M = %lld (test_nccl_device graphs): %s", (long long)M, err);
}

static void test_cuda_local_device_cases(void **state)
{
    (void)state;
    char err[512];
    for (int k = 0; k < tc_local_nmeshes; k++)
        for (int i = 0; i < tc_local_nmodes; i++)
            if (!replay_case(tc_local_modes[i], &tc_local_meshes[k], 3, tc_local_reduce(i), false, err, sizeof err))
                fail_msg("%s on %s (test_cuda_local_device): %s", tc_local_modes[i], tc_local_meshes[k].name, err);
}

/* The old checks read every weight view after the step: with static buffer
 * reuse those bytes then hold other buffers, and the replay must see it. */
static void test_after_step_views_are_stale(void **state)
{
    (void)state;
    static const struct {
        const char *mode;
        const rt_mesh *mesh;
        int64_t M;
    } stale[] = {{"hfsdp", &one, 2}, {"zero3", &one, 3}, {"hsdp_nosync", &one, 4}, {"zero3", &tc_local_meshes[0], 3}};
    char err[512];
    for (size_t k = 0; k < sizeof stale / sizeof stale[0]; k++) {
        err[0] = 0;
        if (replay_case(stale[k].mode, stale[k].mesh, stale[k].M, MF_REDUCE_AVG, true, err, sizeof err))
            fail_msg("%s on %s, M = %lld: every weight view still held its weights after the step (no reuse?)",
                     stale[k].mode, stale[k].mesh->name, (long long)stale[k].M);
        if (!strstr(err, "after the step"))
            fail_msg("%s on %s: failed before the after-step check: %s", stale[k].mode, stale[k].mesh->name, err);
    }
    /* ddp keeps every weight persistent: the old check holds there */
    if (!replay_case("ddp", &one, 3, MF_REDUCE_AVG, true, err, sizeof err))
        fail_msg("ddp on 1x1: %s", err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_device_cases),
        cmocka_unit_test(test_cuda_local_device_cases),
        cmocka_unit_test(test_after_step_views_are_stale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
