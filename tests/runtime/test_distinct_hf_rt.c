/*
 * mfsdp_ckpt_export_hf / mfsdp_ckpt_import_hf of a schedule with Distinct
 * tensors (issue #42: the global model under the spec's global names), on 4
 * thread-ranks of the local backend, through the stage hook (the GPU
 * backends' path, MFSDP_CKPT_STAGE=1) and without it. The spec, compiled
 * in-process: mesh tp = 2 x dp = 2 (rank = 2 * tp + dp),
 *   mlp.w1 [2, 3]   global "W1" split 0   [Distinct, Replicate]  -> mlp.W1 [4, 3]
 *   mlp.w2 [3, 2]   global "W2" split 1   [Distinct, Replicate]  -> mlp.W2 [3, 4]
 *   e.x    [5]      global "x.{tp}"       [Distinct, Flat]       -> e.x.0, e.x.1 [5]
 *   e.y    [30, 3]  global "Y" split 1    [Distinct, Flat]       -> e.Y [30, 6]
 *   head.b [5]                            [Flat, Flat]           -> head.b [5]
 * Local element i of tp coordinate c is, by hand: W1 element 6c + i; W2
 * element (i / 2) * 4 + 2c + i % 2; x.c element i; Y element (i / 3) * 6 +
 * 3c + i % 3 (the dp = 0 rank's Flat shard of y ends inside a row). Every
 * rank sets each master element to 1000 T + g (T the global tensor's number
 * 1..6 above, g its global element); the export must hold exactly those
 * values in every element of the six global tensors with those shapes, and
 * the stage hook must have moved each of the 219 global elements exactly
 * once (4 bytes each): the dp replicas of mlp's tensors split their writes,
 * none written twice. Importing it into zeroed buffers gives every held
 * element back (the hook moving every held element once); without staging,
 * the same values and nothing through the hook. Without e.x's global clause
 * both calls are refused on every rank (MFSDP_ERR_UNSUPPORTED, naming the
 * tensor and the clause), creating nothing.
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

#include "mf_ckpt_hf.h"
#include "mf_ckpt_io.h"
#include "mf_ckpt_stage.h"
#include "mf_passes.h"
#include "mf_pipeline.h"
#include "mfsdp.h"
#include "mfsdp_ckpt.h"

#define WORLD 4

static const char *const spec =
    "mesh tp = 2, dp = 2;\n"
    "microbatches 1;\n"
    "layout tpr {\n  weight fp32 [Distinct, Replicate];\n  grad fp32 [Distinct, Partial];\n"
    "  main_weight fp32 [Distinct, Replicate];\n}\n"
    "layout tpf {\n  weight fp32 [Distinct, Flat];\n  grad fp32 [Distinct, Flat];\n"
    "  main_weight fp32 [Distinct, Flat];\n}\n"
    "layout dense {\n  weight fp32 [Flat, Flat];\n  grad fp32 [Flat, Flat];\n  main_weight fp32 [Flat, Flat];\n}\n"
    "unit \"mlp\" layout tpr {\n  tensor \"w1\" [2, 3] global \"W1\" split 0;\n"
    "  tensor \"w2\" [3, 2] global \"W2\" split 1;\n}\n"
    "unit \"e\" layout tpf {\n  tensor \"x\" [5] global \"x.{tp}\";\n  tensor \"y\" [30, 3] global \"Y\" split 1;\n}\n"
    "unit \"head\" layout dense {\n  tensor \"b\" [5];\n}\n";

/* The global tensors: name, dims, number T. */
static const struct {
    const char *name;
    int ndims;
    int64_t dims[2];
} globals[] = {{"mlp.W1", 2, {4, 3}}, {"mlp.W2", 2, {3, 4}}, {"e.x.0", 1, {5, 0}},
               {"e.x.1", 1, {5, 0}},  {"e.Y", 2, {30, 6}},   {"head.b", 1, {5, 0}}};
#define NGLOBAL 6
#define GLOBAL_ELEMENTS (12 + 12 + 5 + 5 + 180 + 5)

static mfsdp_schedule *g_sh;
static mfsdp_local_group *g_group;
static int64_t g_held[WORLD];
static int g_bad[WORLD];

/* 1000 T + g of local element i of tensor `name` at tp coordinate c. */
static float value(const char *name, int64_t c, int64_t i)
{
    if (strcmp(name, "mlp.w1") == 0)
        return 1000.0f * 1 + (float)(6 * c + i);
    if (strcmp(name, "mlp.w2") == 0)
        return 1000.0f * 2 + (float)(i / 2 * 4 + 2 * c + i % 2);
    if (strcmp(name, "e.x") == 0)
        return 1000.0f * (float)(3 + c) + (float)i;
    if (strcmp(name, "e.y") == 0)
        return 1000.0f * 5 + (float)(i / 3 * 6 + 3 * c + i % 3);
    return 1000.0f * 6 + (float)i; /* head.b */
}

static mfsdp_schedule *compile(const char *text)
{
    mf_compile_options opt;
    memset(&opt, 0, sizeof opt);
    opt.stop_after = MF_STAGE_VERIFY;
    opt.verify = true;
    char *diag = NULL, *yaml = NULL;
    size_t dlen = 0, ylen = 0;
    opt.diag_out = open_memstream(&diag, &dlen);
    mf_compilation c;
    int rc = mf_pipeline_compile_buffer("distinct_hf", text, strlen(text), &opt, &c);
    fclose(opt.diag_out);
    if (rc != 0 || !c.plan || !c.plan->sched)
        fail_msg("the spec does not compile (%d):\n%s", rc, diag);
    FILE *y = open_memstream(&yaml, &ylen);
    assert_int_equal(mf_emit_yaml(c.plan->sched, y), 0);
    fclose(y);
    mf_compilation_free(&c);
    free(diag);
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load_buffer("distinct_hf", yaml, ylen, &sh) != MFSDP_OK)
        fail_msg("the emitted schedule does not load: %s", mfsdp_last_error(NULL));
    free(yaml);
    return sh;
}

typedef struct rank_job {
    int64_t rank;
    int import;            /* 0: set the values and export; 1: zero, import, check */
    const char *dir;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = g_group;
    cfg.rank = j->rank;
    mfsdp_runtime *rt = NULL;
    int bad = mfsdp_create(g_sh, &cfg, &rt) != MFSDP_OK;
    int64_t c = j->rank / 2;
    g_held[j->rank] = 0;
    for (int k = 0; !bad && k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, k, &v);
        g_held[j->rank] += v.shard_count;
        for (int64_t i = 0; i < v.shard_count; i++)
            ((float *)v.main_weight)[i] = j->import ? 0.0f : value(v.name, c, v.shard_offset + i);
    }
    if (!bad)
        bad = j->import ? mfsdp_ckpt_import_hf(rt, j->dir, NULL) != MFSDP_OK
                        : mfsdp_ckpt_export_hf(rt, j->dir, MFSDP_FP32, NULL, 0) != MFSDP_OK;
    for (int k = 0; !bad && j->import && k < mfsdp_num_tensors(rt); k++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, k, &v);
        for (int64_t i = 0; i < v.shard_count && !bad; i++)
            if (((float *)v.main_weight)[i] != value(v.name, c, v.shard_offset + i)) {
                fprintf(stderr, "rank %lld: %s element %lld is %g after the import, want %g\n",
                        (long long)j->rank, v.name, (long long)(v.shard_offset + i),
                        (double)((float *)v.main_weight)[i], (double)value(v.name, c, v.shard_offset + i));
                bad = 1;
            }
    }
    if (bad)
        fprintf(stderr, "rank %lld: %s\n", (long long)j->rank, mfsdp_last_error(rt));
    g_bad[j->rank] = bad;
    mfsdp_destroy(rt);
    return NULL;
}

/* Runs the export or the import on every rank; the bytes the local stage
 * hook moved meanwhile. */
static uint64_t run(int import, const char *dir)
{
    pthread_t th[WORLD];
    rank_job jobs[WORLD];
    assert_int_equal(mfsdp_local_group_create(WORLD, &g_group), MFSDP_OK);
    uint64_t before = mf_ckpt_stage_host_bytes();
    for (int64_t r = 0; r < WORLD; r++) {
        jobs[r] = (rank_job){r, import, dir};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int64_t r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    mfsdp_local_group_destroy(g_group);
    for (int64_t r = 0; r < WORLD; r++)
        assert_int_equal(g_bad[r], 0);
    return mf_ckpt_stage_host_bytes() - before;
}

/* The export holds the six global tensors, in their shapes, 1000 T + g. */
static void check_files(const char *dir)
{
    mf_hf_model m;
    char err[1024];
    if (mf_ckpt_hf_open(dir, &m, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(m.n, NGLOBAL);
    float buf[180];
    for (int t = 0; t < NGLOBAL; t++) {
        int k = 0;
        while (k < m.n && strcmp(m.t[k].name, globals[t].name) != 0)
            k++;
        if (k == m.n)
            fail_msg("the export has no tensor '%s'", globals[t].name);
        assert_int_equal(m.t[k].ndims, globals[t].ndims);
        for (int d = 0; d < globals[t].ndims; d++)
            assert_int_equal(m.t[k].dims[d], globals[t].dims[d]);
        assert_int_equal(mf_hf_model_read(&m, k, 0, m.t[k].numel, buf, MF_FP32, err, sizeof err), 0);
        for (int64_t g = 0; g < m.t[k].numel; g++)
            if (buf[g] != 1000.0f * (float)(t + 1) + (float)g)
                fail_msg("%s element %lld is %g, want %g", globals[t].name, (long long)g, (double)buf[g],
                         (double)(1000.0f * (float)(t + 1) + (float)g));
    }
    mf_ckpt_hf_close(&m);
}

static void test_round_trip(void **state)
{
    (void)state;
    g_sh = compile(spec);
    char tmp[] = "/tmp/test_distinct_hf_rt.XXXXXX", dir[64];
    assert_non_null(mkdtemp(tmp));
    snprintf(dir, sizeof dir, "%s/hf", tmp);
    setenv("MFSDP_CKPT_STAGE", "1", 1);
    assert_int_equal(run(0, dir), (uint64_t)GLOBAL_ELEMENTS * 4); /* each global element once */
    check_files(dir);
    int64_t held = 0;
    uint64_t imported = run(1, dir);
    for (int r = 0; r < WORLD; r++)
        held += g_held[r];
    /* mlp's 12 elements per coordinate on both dp replicas (48), x and y once
     * per coordinate (2 x 95), head.b once (5) */
    assert_int_equal(held, 48 + 190 + 5);
    assert_int_equal(imported, (uint64_t)held * 4);
    unsetenv("MFSDP_CKPT_STAGE");
    assert_int_equal(run(1, dir), 0); /* the plain path: the same values, nothing staged */
    mf_ckpt_io_remove_dir(dir);
    rmdir(tmp);
    mfsdp_schedule_free(g_sh);
}

/* e.x without its global clause: both calls refused on every rank before
 * any file, naming the tensor and the clause. */
static void *refused_rank(void *arg)
{
    rank_job *j = arg;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = g_group;
    cfg.rank = j->rank;
    mfsdp_runtime *rt = NULL;
    int bad = mfsdp_create(g_sh, &cfg, &rt) != MFSDP_OK;
    for (int import = 0; import < 2 && !bad; import++) {
        mfsdp_result r = import ? mfsdp_ckpt_import_hf(rt, j->dir, NULL)
                                : mfsdp_ckpt_export_hf(rt, j->dir, MFSDP_FP32, NULL, 0);
        const char *msg = mfsdp_last_error(rt);
        bad = r != MFSDP_ERR_UNSUPPORTED ||
              !strstr(msg, import ? "mfsdp_ckpt_import_hf: tensor 'e.x' of bucket 'e/tpf' is Distinct"
                                  : "mfsdp_ckpt_export_hf: tensor 'e.x' of bucket 'e/tpf' is Distinct") ||
              !strstr(msg, "has no global name") || !strstr(msg, "'global \"TEMPLATE\"'");
        if (bad)
            fprintf(stderr, "rank %lld: result %d: %s\n", (long long)j->rank, (int)r, msg);
    }
    g_bad[j->rank] = bad;
    mfsdp_destroy(rt);
    return NULL;
}

static void test_unnamed_refused(void **state)
{
    (void)state;
    char *text = strdup(spec), *at = strstr(text, " global \"x.{tp}\"");
    assert_non_null(at);
    memmove(at, at + strlen(" global \"x.{tp}\""), strlen(at + strlen(" global \"x.{tp}\"")) + 1);
    g_sh = compile(text);
    free(text);
    pthread_t th[WORLD];
    rank_job jobs[WORLD];
    char tmp[] = "/tmp/test_distinct_hf_rt.XXXXXX", dir[64];
    assert_non_null(mkdtemp(tmp));
    snprintf(dir, sizeof dir, "%s/hf", tmp);
    assert_int_equal(mfsdp_local_group_create(WORLD, &g_group), MFSDP_OK);
    for (int64_t r = 0; r < WORLD; r++) {
        jobs[r] = (rank_job){r, 0, dir};
        pthread_create(&th[r], NULL, refused_rank, &jobs[r]);
    }
    for (int64_t r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    mfsdp_local_group_destroy(g_group);
    for (int64_t r = 0; r < WORLD; r++)
        assert_int_equal(g_bad[r], 0);
    assert_int_equal(access(dir, F_OK), -1); /* nothing created */
    rmdir(tmp);
    mfsdp_schedule_free(g_sh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_round_trip), cmocka_unit_test(test_unnamed_refused)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
