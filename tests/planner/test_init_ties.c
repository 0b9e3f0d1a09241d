/*
 * test_init_ties: `mfsdpc init` (planner/cli/mf_cmd_init.c, mf_init_ties.c) on
 * safetensors files written here (mf_ckpt_st_build), no Python needed:
 *   - save_model's deduplication (metadata "ALIAS": "STORED") with the head's
 *     name kept: the whole spec, golden, with the tensor renamed to the
 *     embedding's name and the `tied` layout; the reverse (embedding kept);
 *   - config.json's tie_word_embeddings, with a stored copy of the head left
 *     out; a config.json that is a FIFO refused at once (no open() blocking);
 *   - dot-less names in unit "root", an unknown --layout naming the valid
 *     ones, the spec checking clean through the front end.
 *
 * argv[1]: a scratch directory.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "mf_ckpt_st.h"
#include "mf_cli.h"
#include "mf_pipeline.h"

static const char *g_dir = ".";

typedef struct st_tensor {
    const char *name;
    int ndims;
    int64_t shape[2];
} st_tensor;

/* Writes a safetensors file of fp32 zeros; meta: key, value pairs. */
static void write_st(const char *path, const st_tensor *t, int n, const char *const *meta, int nmeta)
{
    mf_st_entry e[8];
    const char *key[4], *val[4];
    uint64_t at = 0;
    for (int k = 0; k < n; k++) {
        e[k] = (mf_st_entry){.name = (char *)t[k].name, .dtype = MF_ST_F32, .ndims = t[k].ndims, .numel = 1};
        for (int d = 0; d < t[k].ndims; d++) {
            e[k].shape[d] = t[k].shape[d];
            e[k].numel *= t[k].shape[d];
        }
        e[k].begin = at;
        e[k].end = at += (uint64_t)e[k].numel * 4;
    }
    for (int k = 0; k < nmeta; k++) {
        key[k] = meta[2 * k];
        val[k] = meta[2 * k + 1];
    }
    uint8_t *head;
    size_t len;
    assert_int_equal(mf_ckpt_st_build(e, n, key, val, nmeta, &head, &len), 0);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(head, 1, len, f), len);
    for (uint64_t i = 0; i < at; i++)
        fputc(0, f);
    assert_int_equal(fclose(f), 0);
    free(head);
}

typedef struct init_run {
    int rc;
    char out[8192];  /* the spec written with -o */
    char err[4096];  /* standard error */
} init_run;

static void slurp(const char *path, char *buf, size_t size)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* mfsdpc init MODEL --mesh MESH --layout LAYOUT [--unit UNIT] -o OUT, stderr captured. */
static void run_init(init_run *r, const char *model, const char *mesh, const char *layout, const char *unit)
{
    char outp[4096], errp[4096];
    snprintf(outp, sizeof outp, "%s/out.mfsdp", g_dir);
    snprintf(errp, sizeof errp, "%s/err.txt", g_dir);
    unlink(outp);
    char *argv[10] = {"init", (char *)model, "--mesh", (char *)mesh, "--layout", (char *)layout, "-o", outp};
    int argc = 8;
    if (unit) {
        argv[argc++] = "--unit";
        argv[argc++] = (char *)unit;
    }
    fflush(stderr);
    int saved = dup(2), fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    alarm(20); /* a blocking open() fails the test instead of hanging it */
    r->rc = mf_cmd_init(argc, argv);
    alarm(0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    slurp(outp, r->out, sizeof r->out);
    slurp(errp, r->err, sizeof r->err);
}

static char *path_in(const char *name)
{
    static char buf[4][4096];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
    return p;
}

/* The spec text checks clean through the front end. */
static void check_clean(const char *text)
{
    char *p = path_in("check.mfsdp");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    char *diag = NULL;
    size_t len = 0;
    FILE *d = open_memstream(&diag, &len);
    mf_compile_options opt = {.stop_after = MF_STAGE_SEMA, .diag_out = d};
    mf_compilation c;
    int rc = mf_pipeline_compile_file(p, &opt, &c);
    fclose(d);
    if (rc != 0 || len)
        fail_msg("the spec does not check clean (%d):\n%s\n%s", rc, diag, text);
    mf_compilation_free(&c);
    free(diag);
}

/* Writes NAME (a safetensors file in the scratch directory) and runs init on
 * it, which must succeed and write a spec that checks clean; returns its path. */
static char *init_ok(init_run *r, const char *name, const st_tensor *t, int n, const char *const *meta, int nmeta,
                     const char *mesh, const char *layout, const char *unit)
{
    char *f = path_in(name);
    write_st(f, t, n, meta, nmeta);
    run_init(r, f, mesh, layout, unit);
    if (r->rc != 0)
        fail_msg("init %s: status %d: %s", name, r->rc, r->err);
    check_clean(r->out);
    return f;
}

static const st_tensor g_gpt[] = {
    {"lm_head.weight", 2, {8, 4}}, {"transformer.h.0.w", 2, {4, 4}}, {"transformer.ln_f.weight", 1, {4}},
    {"transformer.wpe.weight", 2, {3, 4}}};

static void test_save_model_head_kept(void **state)
{
    (void)state;
    const char *meta[] = {"format", "pt", "transformer.wte.weight", "lm_head.weight"};
    init_run r;
    char *f = init_ok(&r, "head.safetensors", g_gpt, 4, meta, 2, "dp_outer=2,dp_inner=2", "hsdp", "transformer.h.{i}.");
    const char *want_tail =
        "# tied: \"transformer.wte.weight\" (also \"lm_head.weight\") is stored as \"lm_head.weight\": import "
        "with the tie transformer.wte.weight=lm_head.weight\n"
        "mesh dp_outer = 2, dp_inner = 2;\nmicrobatches 1;\nreduce avg;\n\n"
        "layout hsdp {\n  weight      fp32 [Replicate, Flat];\n  grad        fp32 [Partial, Flat];\n"
        "  main_weight fp32 [Replicate, Flat];\n}\n\n"
        "# read outside its unit's windows (tied): the weight whole on every rank\n"
        "layout tied {\n  weight      fp32 [Replicate, Replicate];\n  grad        fp32 [Partial, Flat];\n"
        "  main_weight fp32 [Replicate, Flat];\n}\n\n"
        "unit \"transformer.wte\" layout hsdp {\n  tensor \"weight\" [8, 4] layout tied;\n}\n\n"
        "unit \"transformer.h.0\" layout hsdp {\n  tensor \"w\" [4, 4];\n}\n\n"
        "unit \"transformer.ln_f\" layout hsdp {\n  tensor \"weight\" [4];\n}\n\n"
        "unit \"transformer.wpe\" layout hsdp {\n  tensor \"weight\" [3, 4];\n}\n";
    const char *tail = strstr(r.out, "# tied:");
    if (!tail || strcmp(tail, want_tail) != 0)
        fail_msg("got:\n%s\nwant (after the first two lines):\n%s", r.out, want_tail);
    /* a replicated compute weight (ddp) needs no override layout */
    run_init(&r, f, "dp=4", "ddp", NULL);
    assert_int_equal(r.rc, 0);
    assert_null(strstr(r.out, "layout tied"));
    assert_non_null(strstr(r.out, "unit \"transformer.wte\" layout ddp {\n  tensor \"weight\" [8, 4];"));
    /* a config.json beside it that says the same adds nothing */
    char *cfg = path_in("config.json");
    FILE *c = fopen(cfg, "w");
    assert_non_null(c);
    fputs("{\"tie_word_embeddings\": true, \"vocab_size\": 8}", c);
    fclose(c);
    run_init(&r, f, "dp_outer=2,dp_inner=2", "hsdp", "transformer.h.{i}.");
    unlink(cfg);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, want_tail) || strstr(r.out, "config.json"))
        fail_msg("with config.json: got:\n%s", r.out);
}

static void test_save_model_embedding_kept(void **state)
{
    (void)state;
    st_tensor t[4];
    memcpy(t, g_gpt, sizeof t);
    t[0].name = "transformer.wte.weight";
    const char *meta[] = {"lm_head.weight", "transformer.wte.weight"};
    init_run r;
    init_ok(&r, "wte.safetensors", t, 4, meta, 1, "dp=4", "zero3", NULL);
    assert_non_null(strstr(r.out, "unit \"transformer.wte\" layout zero3 {\n  tensor \"weight\" [8, 4] layout tied;"));
    assert_null(strstr(r.out, "lm_head\" layout"));
}

static void test_config_tie_word_embeddings(void **state)
{
    (void)state;
    char *d = path_in("cfg");
    mkdir(d, 0755);
    st_tensor t[5];
    memcpy(t, g_gpt, sizeof g_gpt);
    t[4] = (st_tensor){"transformer.wte.weight", 2, {8, 4}}; /* both stored: the head is a copy */
    char f[4200], cfg[4200];
    snprintf(f, sizeof f, "%s/model.safetensors", d);
    snprintf(cfg, sizeof cfg, "%s/config.json", d);
    write_st(f, t, 5, NULL, 0);
    FILE *c = fopen(cfg, "w");
    assert_non_null(c);
    fputs("{\"tie_word_embeddings\": true, \"vocab_size\": 8}", c);
    fclose(c);
    init_run r;
    run_init(&r, d, "dp=4", "zero3", NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "# tied (config.json tie_word_embeddings): \"transformer.wte.weight\" (also "
                                  "\"lm_head.weight\", whose stored copy is left out)"));
    assert_non_null(strstr(r.out, "unit \"transformer.wte\" layout zero3 {\n  tensor \"weight\" [8, 4] layout tied;"));
    assert_null(strstr(r.out, "lm_head\" layout"));
    check_clean(r.out);
    /* a FIFO where config.json should be: refused at once */
    unlink(cfg);
    assert_int_equal(mkfifo(cfg, 0644), 0);
    run_init(&r, d, "dp=4", "zero3", NULL);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "config.json: not a regular file"));
    assert_int_equal(r.out[0], '\0'); /* nothing written */
    unlink(cfg);
}

static void test_any_name_and_unknown_layout(void **state)
{
    (void)state;
    const st_tensor t[] = {{"cls_token", 2, {1, 4}}, {"patch.proj.weight", 2, {4, 3}}, {"we\"ird.w", 1, {2}}};
    init_run r;
    char *f = init_ok(&r, "vit.safetensors", t, 3, NULL, 0, "dp=2", "zero3", NULL);
    assert_non_null(strstr(r.out, "# \"cls_token\" has no unit prefix: here it is \"root.cls_token\""));
    assert_non_null(strstr(r.out, "unit \"root\" layout zero3 {\n  tensor \"cls_token\" [1, 4];"));
    assert_non_null(strstr(r.out, "unit \"we\\\"ird\" layout zero3 {"));
    run_init(&r, f, "dp=2", "zero9", NULL);
    assert_int_equal(r.rc, 2);
    assert_string_equal(r.err, "mfsdpc: error: unknown layout 'zero9' for --layout; use one of ddp, zero1, zero2, "
                               "zero3, hsdp, hsdp_nosync, hfsdp, fsdp2d\n");
}

int main(int argc, char **argv)
{
    if (argc == 2)
        g_dir = argv[1];
    mkdir(g_dir, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_model_head_kept),
        cmocka_unit_test(test_save_model_embedding_kept),
        cmocka_unit_test(test_config_tie_word_embeddings),
        cmocka_unit_test(test_any_name_and_unknown_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
