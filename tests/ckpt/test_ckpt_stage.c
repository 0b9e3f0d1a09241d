/*
 * Checkpoints through the backend's stage hook (runtime/ckpt/mf_ckpt_stage.h),
 * the path the GPU backends take, exercised on the local backend with
 * MFSDP_CKPT_STAGE=1 (argv: a compiled schedule, a scratch directory):
 * 8 thread-ranks fill main_weight and two Adam states with values that
 * depend on the element only, save staged, load staged into zeroed buffers,
 * export main_weight as a Hugging Face checkpoint and import it back into
 * zeroed buffers, staged, then load and import again without staging. Every value must come
 * back bit for bit, and the CPU backends' count of staged bytes must be
 * exactly what each operation has to move through the hook: the save, every
 * tensor element of the 3 states once (4 bytes each; the schedule's tensor
 * sizes); the staged load, every element each rank holds (replicas do not
 * share reads when staged); the export, every element of main_weight once;
 * the import, every main_weight element each rank holds; the plain load
 * and import, nothing. A save or load that
 * touched a buffer directly would move fewer bytes through the hook.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <unistd.h>

#include "mf_ckpt_io.h"
#include "mf_ckpt_stage.h"
#include "mfsdp.h"
#include "mfsdp_ckpt.h"

#define MAXR 64

static const char *g_sched, *g_dir;
static mfsdp_schedule *g_sh;
static mfsdp_local_group *g_group;
static pthread_barrier_t g_bar;
static int64_t g_held[MAXR];       /* elements each rank holds (all tensors) */
static int g_bad[MAXR];            /* per rank: a failed call or a wrong value */

typedef struct rank_job {
    int64_t rank;
    int op;                        /* 0 save, 1 load (check values), 2 export (after a load), 3 import (check
                                      main_weight) */
    const char *dir;
} rank_job;

static float value(int state, int64_t element, int tensor)
{
    return (float)(element * 3 + state) * 0.25f + (float)tensor;
}

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = g_group;
    cfg.rank = j->rank;
    mfsdp_runtime *rt = NULL;
    int bad = mfsdp_create(g_sh, &cfg, &rt) != MFSDP_OK;
    int nt = bad ? 0 : mfsdp_num_tensors(rt);
    void **st[2] = {calloc((size_t)nt + 1, sizeof(void *)), calloc((size_t)nt + 1, sizeof(void *))};
    mfsdp_tensor_view *v = calloc((size_t)nt + 1, sizeof *v);
    g_held[j->rank] = 0;
    for (int k = 0; k < nt; k++) {
        mfsdp_tensor_view_get(rt, k, &v[k]);
        g_held[j->rank] += v[k].shard_count;
        for (int s = 0; s < 2; s++)
            st[s][k] = calloc((size_t)v[k].shard_count + 1, sizeof(float));
        for (int64_t i = 0; i < v[k].shard_count; i++) {
            float *w = v[k].main_weight;
            w[i] = j->op == 0 || j->op == 2 ? value(0, v[k].shard_offset + i, k) : 0.0f;
            for (int s = 0; s < 2; s++)
                ((float *)st[s][k])[i] = j->op == 0 ? value(s + 1, v[k].shard_offset + i, k) : 0.0f;
        }
    }
    mfsdp_ckpt_state states[2] = {{"exp_avg", MFSDP_FP32, st[0]}, {"exp_avg_sq", MFSDP_FP32, st[1]}};
    pthread_barrier_wait(&g_bar);
    if (!bad && j->op == 0) {
        mfsdp_ckpt_save_options so = MFSDP_CKPT_SAVE_OPTIONS_INIT;
        so.step = 7, so.nstates = 2, so.states = states;
        bad = mfsdp_ckpt_save(rt, j->dir, &so) != MFSDP_OK;
    } else if (!bad && j->op == 2) {
        bad = mfsdp_ckpt_export_hf(rt, j->dir, MFSDP_FP32, NULL, 0) != MFSDP_OK;
    } else if (!bad && j->op == 3) {
        bad = mfsdp_ckpt_import_hf(rt, j->dir, NULL) != MFSDP_OK;
        for (int k = 0; k < nt && !bad; k++)
            for (int64_t i = 0; i < v[k].shard_count && !bad; i++)
                bad = ((float *)v[k].main_weight)[i] != value(0, v[k].shard_offset + i, k);
    } else if (!bad) {
        mfsdp_ckpt_load_options lo = MFSDP_CKPT_LOAD_OPTIONS_INIT;
        lo.nstates = 2, lo.states = states;
        bad = mfsdp_ckpt_load(rt, j->dir, &lo) != MFSDP_OK || lo.step != 7;
        for (int k = 0; k < nt && !bad; k++)
            for (int64_t i = 0; i < v[k].shard_count && !bad; i++)
                bad = ((float *)v[k].main_weight)[i] != value(0, v[k].shard_offset + i, k) ||
                      ((float *)st[0][k])[i] != value(1, v[k].shard_offset + i, k) ||
                      ((float *)st[1][k])[i] != value(2, v[k].shard_offset + i, k);
    }
    if (bad)
        fprintf(stderr, "rank %lld: %s\n", (long long)j->rank, mfsdp_last_error(rt));
    g_bad[j->rank] = bad;
    for (int k = 0; k < nt; k++)
        for (int s = 0; s < 2; s++)
            free(st[s][k]);
    free(st[0]);
    free(st[1]);
    free(v);
    mfsdp_destroy(rt);
    return NULL;
}

/* Runs op on every rank; the bytes the local stage hook moved meanwhile. */
static uint64_t run(int op, const char *dir)
{
    int64_t w = mfsdp_schedule_world_size(g_sh);
    pthread_t th[MAXR];
    rank_job jobs[MAXR];
    assert_true(w <= MAXR);
    assert_int_equal(mfsdp_local_group_create(w, &g_group), MFSDP_OK);
    pthread_barrier_init(&g_bar, NULL, (unsigned)w);
    uint64_t before = mf_ckpt_stage_host_bytes();
    for (int64_t r = 0; r < w; r++) {
        jobs[r] = (rank_job){r, op, dir};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int64_t r = 0; r < w; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g_bar);
    mfsdp_local_group_destroy(g_group);
    for (int64_t r = 0; r < w; r++)
        assert_int_equal(g_bad[r], 0);
    return mf_ckpt_stage_host_bytes() - before;
}

static void test_staged_round_trip(void **state)
{
    (void)state;
    assert_int_equal(mfsdp_schedule_load(g_sched, &g_sh), MFSDP_OK);
    int64_t w = mfsdp_schedule_world_size(g_sh), numel = 0, held = 0;
    for (int k = 0; k < mfsdp_schedule_num_tensors(g_sh); k++) {
        mfsdp_tensor_info ti;
        mfsdp_schedule_tensor_info(g_sh, k, &ti);
        numel += ti.numel;
    }
    char tmp[4096], dir[4200];
    snprintf(tmp, sizeof tmp, "%s/test_ckpt_stage.XXXXXX", g_dir);
    assert_non_null(mkdtemp(tmp));
    snprintf(dir, sizeof dir, "%s/staged", tmp);
    setenv("MFSDP_CKPT_STAGE", "1", 1);
    uint64_t saved = run(0, dir);
    assert_int_equal(saved, (uint64_t)numel * 3 * 4); /* every element of 3 fp32 states, once */
    uint64_t loaded = run(1, dir);
    for (int64_t r = 0; r < w; r++)
        held += g_held[r];
    assert_true(held > numel); /* the schedule has replicas: each reads its own when staged */
    assert_int_equal(loaded, (uint64_t)held * 3 * 4);
    /* Hugging Face export (fp32: every element once, as the save plan
     * splits them) and import (every element each rank holds). */
    char hf[4300];
    snprintf(hf, sizeof hf, "%s/hf", tmp);
    assert_int_equal(run(2, hf), (uint64_t)numel * 4);
    assert_int_equal(run(3, hf), (uint64_t)held * 4);
    unsetenv("MFSDP_CKPT_STAGE");
    assert_int_equal(run(1, dir), 0); /* the plain path: same bytes, nothing staged */
    assert_int_equal(run(3, hf), 0);
    mfsdp_schedule_free(g_sh);
    mf_ckpt_io_remove_dir(dir);
    mf_ckpt_io_remove_dir(hf);
    rmdir(tmp);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_ckpt_stage SCHEDULE DIR\n");
        return 2;
    }
    g_sched = argv[1];
    g_dir = argv[2];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_staged_round_trip)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
