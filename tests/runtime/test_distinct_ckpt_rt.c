/*
 * Native checkpoints of split global tensors (`global "W" split D`, issue #42
 * item 2) through the runtime on thread-ranks (local backend): specs
 * compiled here from text, every value a closed form of the element's
 * place in the WHOLE tensor, computed by this test's own 2-D indexing
 * (global row, column), never by the code under test.
 *
 * Unit "u" on tp x dp: "a" [3, 5] split 0 (W [6, 5]) and "b" [3, 7] split 1
 * (W [3, 14]), Distinct on tp (a Flat on dp, b Replicate on dp: replicas
 * that share their reads), "n" [4] Flat on both axes.
 *   1. tp = 2 x dp = 2 (4 ranks) saves main_weight and a state exp_avg and
 *      loads both back (shared reads; then staged, MFSDP_CKPT_STAGE=1, where
 *      each rank reads its own elements run by run);
 *   2. tp = 2 x dp = 1 (2 ranks) loads it: another data-parallel size;
 *   3. a plain model on dp = 2 whose "a" is [6, 5] and "b" [3, 14] (no
 *      Distinct axis) loads it: the checkpoint holds the whole tensors W;
 *   4. tp = 4 x dp = 1 ("a" [3, 5] split 0 is W [12, 5]; "b" [3, 7] split 1
 *      is [3, 28]) is refused, naming the tensor, nothing loaded.
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

#include "mfsdp.h"
#include "mfsdp_ckpt.h"
#include "sched_test.h"

/* The spec on tp = T x dp = D: "%d" twice, filled by ranks(). */
#define SPEC_TP                                                                                                    \
    "mesh tp = %d, dp = %d;\n"                                                                                      \
    "layout flat { weight fp32 [Flat, Flat]; grad fp32 [Flat, Flat]; main_weight fp32 [Flat, Flat]; }\n"           \
    "layout tpf { weight fp32 [Distinct, Flat]; grad fp32 [Distinct, Flat];\n"                                     \
    "             main_weight fp32 [Distinct, Flat]; }\n"                                                          \
    "layout tpr { weight fp32 [Distinct, Replicate]; grad fp32 [Distinct, Replicate];\n"                           \
    "             main_weight fp32 [Distinct, Replicate]; }\n"                                                     \
    "unit \"u\" layout flat {\n"                                                                                    \
    "  tensor \"a\" [3, 5] layout tpf global \"a\" split 0;\n"                                                      \
    "  tensor \"b\" [3, 7] layout tpr global \"b\" split 1;\n"                                                      \
    "  tensor \"n\" [4];\n"                                                                                         \
    "}\n"

static const char *spec_plain =
    "mesh dp = 2;\n"
    "layout flat { weight fp32 [Flat]; grad fp32 [Flat]; main_weight fp32 [Flat]; }\n"
    "unit \"u\" layout flat {\n"
    "  tensor \"a\" [6, 5];\n"
    "  tensor \"b\" [3, 14];\n"
    "  tensor \"n\" [4];\n"
    "}\n";

typedef struct run {
    mfsdp_schedule *s;
    mfsdp_local_group *group;
    const char *dir;
    int what;               /* 0 save + load back, 1 load, 2 load refused */
    int64_t tp;             /* tp size (0: the plain model) */
    char err[512];          /* the first problem of this rank ("" none) */
    int64_t rank;
} run;

/* The value of whole-tensor element (i, j) of tensor `name` (exact in fp32). */
static float value(const char *name, int64_t i, int64_t j, int state)
{
    int k = name[2] - 'a'; /* "u.a", "u.b", "u.n" */
    return (float)(k * 1000 + i * 40 + j) + (state ? 0.5f : 0.0f);
}

/* The whole tensor's (row, column) of element l of this rank's local tensor
 * v (its tp coordinate c of tp): the test's own indexing of the split. */
static void whole_at(const mfsdp_tensor_view *v, int64_t c, int64_t l, int64_t *i, int64_t *j)
{
    int64_t cols = v->ndims == 2 ? v->dims[1] : v->numel;
    *i = l / cols;
    *j = l % cols;
    if (c >= 0 && strcmp(v->name, "u.a") == 0)
        *i += c * v->dims[0];
    if (c >= 0 && strcmp(v->name, "u.b") == 0)
        *j += c * cols;
}

/* Fills (fill) or checks main_weight and the state shards st[t]. */
static void each(mfsdp_runtime *rt, run *r, float **st, int fill, const char *what)
{
    int64_t c = r->tp ? mfsdp_coord(rt, 0) : -1;
    for (int t = 0; t < mfsdp_num_tensors(rt) && !r->err[0]; t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        for (int64_t x = 0; x < v.shard_count; x++) {
            int64_t i, j;
            whole_at(&v, c, v.shard_offset + x, &i, &j);
            float w = value(v.name, i, j, 0), s = value(v.name, i, j, 1), *m = v.main_weight;
            if (fill) {
                m[x] = w;
                st[t][x] = s;
            } else if (memcmp(&m[x], &w, sizeof w) || memcmp(&st[t][x], &s, sizeof s)) {
                snprintf(r->err, sizeof r->err, "%s: rank %lld: %s element %lld (whole [%lld, %lld]) is %g / %g, "
                         "want %g / %g", what, (long long)r->rank, v.name, (long long)(v.shard_offset + x),
                         (long long)i, (long long)j, m[x], st[t][x], w, s);
                return;
            }
        }
    }
}

/* Overwrites main_weight and the states, loads r->dir, checks. */
static void load(mfsdp_runtime *rt, run *r, float **st, const char *what)
{
    for (int t = 0; t < mfsdp_num_tensors(rt); t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        for (int64_t x = 0; x < v.shard_count; x++)
            ((float *)v.main_weight)[x] = st[t][x] = -1e9f;
    }
    mfsdp_ckpt_state state = {"exp_avg", MFSDP_FP32, (void **)st};
    mfsdp_ckpt_load_options lo = MFSDP_CKPT_LOAD_OPTIONS_INIT;
    lo.nstates = 1;
    lo.states = &state;
    mfsdp_result res = mfsdp_ckpt_load(rt, r->dir, &lo);
    if (r->what == 2) {
        const char *e = mfsdp_last_error(rt);
        if (res == MFSDP_OK || !strstr(e, "tensor 'u.a' (global 'u.a' split 0) is split over axis 'tp' of size 4 "
                                          "here, 2 in the checkpoint"))
            snprintf(r->err, sizeof r->err, "%s: rank %lld: result %d, %s", what, (long long)r->rank, (int)res, e);
        return;
    }
    if (res != MFSDP_OK)
        snprintf(r->err, sizeof r->err, "%s: load: %s", what, mfsdp_last_error(rt));
    else
        each(rt, r, st, 0, what);
}

static void *rank_main(void *arg)
{
    run *r = arg;
    mfsdp_config cfg = MFSDP_CONFIG_INIT;
    cfg.local_group = r->group;
    mfsdp_runtime *rt = NULL;
    if (mfsdp_create(r->s, &cfg, &rt) != MFSDP_OK) {
        snprintf(r->err, sizeof r->err, "create: %s", mfsdp_last_error(NULL));
        return NULL;
    }
    r->rank = mfsdp_rank(rt);
    int n = mfsdp_num_tensors(rt);
    float **st = calloc((size_t)n, sizeof *st);
    for (int t = 0; st && t < n; t++) {
        mfsdp_tensor_view v;
        mfsdp_tensor_view_get(rt, t, &v);
        st[t] = calloc((size_t)v.shard_count + 1, sizeof **st);
    }
    if (r->what == 0) {
        each(rt, r, st, 1, "fill");
        mfsdp_ckpt_state state = {"exp_avg", MFSDP_FP32, (void **)st};
        mfsdp_ckpt_save_options so = MFSDP_CKPT_SAVE_OPTIONS_INIT;
        so.nstates = 1;
        so.states = &state;
        if (mfsdp_ckpt_save(rt, r->dir, &so) != MFSDP_OK)
            snprintf(r->err, sizeof r->err, "save: %s", mfsdp_last_error(rt));
    }
    if (!r->err[0])
        load(rt, r, st, r->what == 0 ? "load back" : "load");
    for (int t = 0; st && t < n; t++)
        free(st[t]);
    free(st);
    mfsdp_destroy(rt);
    return NULL;
}

static mfsdp_schedule *compile(const char *text)
{
    char *diag = NULL, *yaml = NULL;
    mf_schedule *s = st_compile("split.mfsdp", text, true, &diag);
    size_t len = 0;
    mfsdp_schedule *out = NULL;
    if (!s || !(yaml = st_emit(s, &len)) || mfsdp_schedule_load_buffer("split.mfsdp", yaml, len, &out) != MFSDP_OK)
        fail_msg("cannot compile:\n%s\n%s", text, diag ? diag : mfsdp_last_error(NULL));
    free(yaml);
    free(diag);
    mf_schedule_free(s);
    return out;
}

/* Runs `what` on a world of tp x dp thread-ranks (tp 0: the plain model). */
static void ranks(int tp, int dp, int what, const char *dir)
{
    char text[2048];
    if (tp)
        snprintf(text, sizeof text, SPEC_TP, tp, dp);
    mfsdp_schedule *s = compile(tp ? text : spec_plain);
    int world = (tp ? tp : 1) * dp;
    mfsdp_local_group *group = NULL;
    assert_int_equal(mfsdp_local_group_create(world, &group), MFSDP_OK);
    run r[8];
    pthread_t th[8];
    for (int i = 0; i < world; i++) {
        r[i] = (run){.s = s, .group = group, .dir = dir, .what = what, .tp = tp};
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &r[i]), 0);
    }
    for (int i = 0; i < world; i++)
        pthread_join(th[i], NULL);
    mfsdp_local_group_destroy(group);
    mfsdp_schedule_free(s);
    for (int i = 0; i < world; i++)
        if (r[i].err[0])
            fail_msg("tp %d x dp %d: %s", tp, dp, r[i].err);
}

static void test_split_save_load(void **state)
{
    (void)state;
    char root[64] = "/tmp/mfsdp_split_XXXXXX", dir[96], cmd[128];
    assert_non_null(mkdtemp(root));
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    ranks(2, 2, 0, dir);
    setenv("MFSDP_CKPT_STAGE", "1", 1); /* staged: every rank reads its own elements, run by run */
    ranks(2, 2, 1, dir);
    unsetenv("MFSDP_CKPT_STAGE");
    ranks(2, 1, 1, dir);
    ranks(0, 2, 1, dir);
    ranks(4, 1, 2, dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_split_save_load)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
