/*
 * test_shard_gather: mfsdp_shard_gather (mf_helpers.c) on 4 thread-ranks of
 * the local backend, against values worked out by hand.
 *
 * The spec (compiled in-process, `align 16`: shards of whole 4-element
 * blocks) has, on a 2 x 2 mesh (rank = 2 * outer + inner), tensor "a.w" [8]
 * with main_weight [Replicate, Flat] (ranks 0 and 2 hold elements [0, 4),
 * ranks 1 and 3 hold [4, 8): the dp_outer = 1 ranks are replicas) and
 * tensor "b.v" [10] with main_weight [Flat, Flat] (the flat index runs over
 * dp_outer fastest: ranks 0, 2, 1, 3 hold [0, 4), [4, 8), [8, 10) and
 * nothing). Rank r's shard buffer holds 10 * (r + 1) + i at its local index
 * i, so the whole tensors are, elementwise,
 *     a.w: 10 11 12 13 20 21 22 23      (ranks 0 and 1; replicas 2, 3 unread)
 *     b.v: 10 11 12 13 30 31 32 33 20 21
 * gathered to every rank (fp32 shards to fp32) and to rank 3 only (bf16
 * shards to fp16, the values exact in both). Then the refusals: a NULL
 * shard on a rank that holds elements, a bad dtype, a bad root.
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

#include "mf_pipeline.h"
#include "rt_testlib.h"

static const char SPEC[] =
    "mesh dp_outer = 2, dp_inner = 2;\n"
    "microbatches 1;\n"
    "align 16;\n"
    "layout rf { weight fp32 [Replicate, Replicate]; grad fp32 [Partial, Partial];\n"
    "            main_weight fp32 [Replicate, Flat]; }\n"
    "layout ff { weight fp32 [Replicate, Replicate]; grad fp32 [Partial, Partial];\n"
    "            main_weight fp32 [Flat, Flat]; }\n"
    "unit \"a\" layout rf { tensor \"w\" [8]; }\n"
    "unit \"b\" layout ff { tensor \"v\" [10]; }\n";

static const float WANT_A[8] = {10, 11, 12, 13, 20, 21, 22, 23};
static const float WANT_B[10] = {10, 11, 12, 13, 30, 31, 32, 33, 20, 21};
static const int64_t OFFSET[2][4] = {{0, 4, 0, 4}, {0, 8, 4, 10}};
static const int64_t COUNT[2][4] = {{4, 4, 4, 4}, {4, 2, 4, 0}};

static mfsdp_schedule *compile_spec(void)
{
    mf_compile_options opt;
    memset(&opt, 0, sizeof opt);
    opt.stop_after = MF_STAGE_VERIFY;
    opt.verify = true;
    char *diag = NULL, *yaml = NULL;
    size_t dlen = 0, ylen = 0;
    opt.diag_out = open_memstream(&diag, &dlen);
    mf_compilation c;
    int rc = mf_pipeline_compile_buffer("gather.mfsdp", SPEC, strlen(SPEC), &opt, &c);
    fclose(opt.diag_out);
    if (rc != 0 || !c.plan || !c.plan->sched)
        fail_msg("the spec does not compile (%d):\n%s", rc, diag);
    FILE *y = open_memstream(&yaml, &ylen);
    assert_int_equal(mf_emit_yaml(c.plan->sched, y), 0);
    fclose(y);
    mf_compilation_free(&c);
    free(diag);
    mfsdp_schedule *sh = NULL;
    assert_int_equal(mfsdp_schedule_load_buffer("gather.yaml", yaml, ylen, &sh), MFSDP_OK);
    free(yaml);
    return sh;
}

typedef struct job {
    const mfsdp_schedule *sh;
    mfsdp_local_group *g;
    int64_t rank;
    char err[512];
} job;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            snprintf(j->err, sizeof j->err, __VA_ARGS__);                  \
            goto out;                                                      \
        }                                                                  \
    } while (0)

/* One rank: the layout it was given, the two gathers, the refusals. */
static void *rank_main(void *p)
{
    job *j = p;
    int64_t r = j->rank;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = j->g;
    cfg.rank = r;
    cfg.timeout_ms = 30000;
    mfsdp_runtime *rt = NULL;
    float f32[2][4], all[10];
    uint16_t b16[2][4], half[10];
    CHECK(mfsdp_create(j->sh, &cfg, &rt) == MFSDP_OK, "create: %s", mfsdp_last_error(NULL));
    for (int k = 0; k < 2; k++) {
        mfsdp_tensor_view v;
        CHECK(mfsdp_tensor_view_get(rt, k, &v) == MFSDP_OK, "view %d", k);
        CHECK(v.shard_offset == OFFSET[k][r] || v.shard_count == 0, "%s: offset %lld", v.name,
              (long long)v.shard_offset);
        CHECK(v.shard_count == COUNT[k][r], "%s: count %lld", v.name, (long long)v.shard_count);
        for (int i = 0; i < 4; i++) {
            f32[k][i] = (float)(10 * (r + 1) + i);
            b16[k][i] = mfsdp_f32_to_bf16(f32[k][i]);
        }
    }
    for (int k = 0; k < 2; k++) {
        const float *want = k ? WANT_B : WANT_A;
        int n = k ? 10 : 8;
        memset(all, 0xff, sizeof all);
        CHECK(mfsdp_shard_gather(rt, k, COUNT[k][r] ? f32[k] : NULL, MFSDP_FP32, all, MFSDP_FP32,
                                 MFSDP_ALL_RANKS) == MFSDP_OK, "gather %d: %s", k,
              mfsdp_last_error(rt));
        for (int i = 0; i < n; i++)
            CHECK(all[i] == want[i], "tensor %d element %d: %g, want %g", k, i, all[i], want[i]);
        memset(half, 0xff, sizeof half);
        CHECK(mfsdp_shard_gather(rt, k, COUNT[k][r] ? b16[k] : NULL, MFSDP_BF16,
                                 r == 3 ? half : NULL, MFSDP_FP16, 3) == MFSDP_OK,
              "gather %d to rank 3: %s", k, mfsdp_last_error(rt));
        for (int i = 0; r == 3 && i < n; i++)
            CHECK(mfsdp_fp16_to_f32(half[i]) == want[i], "tensor %d element %d to rank 3", k, i);
    }
    /* refusals: every rank refuses before any communication */
    CHECK(mfsdp_shard_gather(rt, 0, NULL, MFSDP_FP32, all, MFSDP_FP32, MFSDP_ALL_RANKS) ==
              MFSDP_ERR_INVALID_ARGUMENT && strstr(mfsdp_last_error(rt), "mfsdp_shard_gather") &&
              strstr(mfsdp_last_error(rt), "the shard non-NULL"),
          "NULL shard: %s", mfsdp_last_error(rt));
    CHECK(mfsdp_shard_gather(rt, 0, f32[0], (mfsdp_dtype)9, all, MFSDP_FP32, 0) ==
              MFSDP_ERR_INVALID_ARGUMENT, "dtype 9 accepted");
    CHECK(mfsdp_shard_gather(rt, 0, f32[0], MFSDP_FP32, all, MFSDP_FP32, 4) ==
              MFSDP_ERR_INVALID_ARGUMENT, "root 4 accepted");
    CHECK(mfsdp_shard_gather(rt, 2, f32[0], MFSDP_FP32, all, MFSDP_FP32, 0) ==
              MFSDP_ERR_INVALID_ARGUMENT, "tensor 2 accepted");
out:
    mfsdp_destroy(rt);
    return NULL;
}

static void test_hand_worked(void **state)
{
    (void)state;
    mfsdp_schedule *sh = compile_spec();
    assert_int_equal(mfsdp_schedule_world_size(sh), 4);
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(4, &g), MFSDP_OK);
    job jobs[4];
    pthread_t th[4];
    for (int r = 0; r < 4; r++) {
        jobs[r] = (job){.sh = sh, .g = g, .rank = r};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < 4; r++)
        pthread_join(th[r], NULL);
    int failed = 0;
    for (int r = 0; r < 4; r++)
        if (jobs[r].err[0]) {
            print_error("rank %d: %s\n", r, jobs[r].err);
            failed = 1;
        }
    assert_false(failed);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_worked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
