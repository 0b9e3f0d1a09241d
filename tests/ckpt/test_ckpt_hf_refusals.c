/*
 * The refusals of mfsdp_ckpt_export_hf and mfsdp_ckpt_import_hf (argv: a
 * compiled schedule of 2 ranks, a scratch directory): 2 thread-ranks make
 * each bad call together; each must return the result and the message
 * written out here, the same on every rank, or, where only rank 0 checks
 * (an existing output directory), rank 0's own message there and the
 * other's naming rank 0. Nothing is left behind.
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

#include <dirent.h>
#include <unistd.h>

#include "mfsdp.h"
#include "mfsdp_ckpt.h"

#define NRANKS 2

typedef struct bad_call {
    int import;                    /* 0: export, 1: import */
    const char *path;              /* output directory or model path */
    mfsdp_dtype dtype;             /* export */
    const char *map, *tie;         /* one rule each, or NULL */
    mfsdp_result want;
    const char *msg[NRANKS];       /* the last error on each rank */
} bad_call;

static const char *g_sched, *g_dir;
static mfsdp_schedule *g_sh;
static mfsdp_local_group *g_group;
static const bad_call *g_call;
static char g_got[NRANKS][1024];
static mfsdp_result g_res[NRANKS];

static void *rank_main(void *arg)
{
    int64_t rank = (int64_t)(intptr_t)arg;
    const bad_call *c = g_call;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = g_group;
    cfg.rank = rank;
    mfsdp_runtime *rt = NULL;
    g_res[rank] = mfsdp_create(g_sh, &cfg, &rt);
    if (g_res[rank] != MFSDP_OK) {
        snprintf(g_got[rank], sizeof g_got[rank], "create: %s", mfsdp_last_error(NULL));
        return NULL;
    }
    mfsdp_hf_options opt = MFSDP_HF_OPTIONS_INIT;
    const char *maps[1] = {c->map}, *ties[1] = {c->tie};
    opt.nmaps = c->map ? 1 : 0, opt.maps = maps;
    opt.nties = c->tie ? 1 : 0, opt.ties = ties;
    g_res[rank] = c->import ? mfsdp_ckpt_import_hf(rt, c->path, &opt)
                            : mfsdp_ckpt_export_hf(rt, c->path, c->dtype, &opt, 0);
    snprintf(g_got[rank], sizeof g_got[rank], "%s", mfsdp_last_error(rt));
    mfsdp_destroy(rt);
    return NULL;
}

static void run(const bad_call *c)
{
    pthread_t th[NRANKS];
    g_call = c;
    assert_int_equal(mfsdp_local_group_create(NRANKS, &g_group), MFSDP_OK);
    for (int r = 0; r < NRANKS; r++)
        pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r);
    for (int r = 0; r < NRANKS; r++)
        pthread_join(th[r], NULL);
    mfsdp_local_group_destroy(g_group);
    for (int r = 0; r < NRANKS; r++) {
        if (g_res[r] != c->want || strcmp(g_got[r], c->msg[r]) != 0)
            fail_msg("rank %d: result %d, want %d; message\n  '%s'\nwant\n  '%s'", r, (int)g_res[r], (int)c->want,
                     g_got[r], c->msg[r]);
    }
}

/* The scratch directory holds only what the test made. */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    if (d)
        closedir(d);
    return n;
}

#define ARGS_EXPORT "Hugging Face export failed: needs a directory, a dtype and rules FROM=TO / NAME=SOURCE"
#define ARGS_IMPORT "Hugging Face import refused: needs a path, and rules of the form FROM=TO / NAME=SOURCE"

static void test_refusals(void **state)
{
    (void)state;
    char tmp[4096], out[4200], none[4200], exists[4400], exists_rank0[4400];
    snprintf(tmp, sizeof tmp, "%s/test_ckpt_hf_refusals.XXXXXX", g_dir);
    assert_non_null(mkdtemp(tmp));
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(none, sizeof none, "%s/none", tmp);
    snprintf(exists, sizeof exists, "Hugging Face export failed: %s already exists", tmp);
    snprintf(exists_rank0, sizeof exists_rank0, "Hugging Face export failed: rank 0: %s already exists", tmp);
    char no_model[4400];
    snprintf(no_model, sizeof no_model, "Hugging Face import refused: %s: No such file or directory", none);
    assert_int_equal(mfsdp_schedule_load(g_sched, &g_sh), MFSDP_OK);
    assert_int_equal(mfsdp_schedule_world_size(g_sh), NRANKS);
    const bad_call calls[] = {
        {0, NULL, MFSDP_FP32, NULL, NULL, MFSDP_ERR_INVALID_ARGUMENT, {ARGS_EXPORT, ARGS_EXPORT}},
        {0, out, MFSDP_FP32, "no-equals-sign", NULL, MFSDP_ERR_INVALID_ARGUMENT, {ARGS_EXPORT, ARGS_EXPORT}},
        {0, out, MFSDP_FP32, NULL, "=SOURCE", MFSDP_ERR_INVALID_ARGUMENT, {ARGS_EXPORT, ARGS_EXPORT}},
        {0, out, (mfsdp_dtype)77, NULL, NULL, MFSDP_ERR_INVALID_ARGUMENT, {ARGS_EXPORT, ARGS_EXPORT}},
        {0, out, MFSDP_BF16, NULL, "x=y", MFSDP_ERR_INVALID_ARGUMENT,
         {"Hugging Face export failed: tie x=y: not two tensors of one size",
          "Hugging Face export failed: tie x=y: not two tensors of one size"}},
        {0, tmp, MFSDP_FP32, NULL, NULL, MFSDP_ERR_INVALID_ARGUMENT, {exists, exists_rank0}},
        {1, NULL, MFSDP_FP32, NULL, NULL, MFSDP_ERR_INVALID_ARGUMENT, {ARGS_IMPORT, ARGS_IMPORT}},
        {1, none, MFSDP_FP32, NULL, "NAME=", MFSDP_ERR_INVALID_ARGUMENT, {ARGS_IMPORT, ARGS_IMPORT}},
        {1, none, MFSDP_FP32, NULL, NULL, MFSDP_ERR_LOAD, {no_model, no_model}},
    };
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++)
        run(&calls[i]);
    assert_int_equal(entries(tmp), 0); /* no output, no temporary directory */
    mfsdp_schedule_free(g_sh);
    rmdir(tmp);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_ckpt_hf_refusals SCHEDULE DIR\n");
        return 2;
    }
    g_sched = argv[1];
    g_dir = argv[2];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
