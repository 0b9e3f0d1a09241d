/*
 * Valid specs: every schedules/ and tests/grammar/valid/ (every .mfsdp) must
 * check clean (status 0, no output), and the resolved spec must say what the
 * source says: loop expansion and names, per-tensor overrides, inline layouts,
 * labeled placements, defaults and the extensions.
 *
 * argv[1]: tests/grammar source dir; argv[2]: the schedules dir.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mf_pipeline.h"

static const char *g_frontend = ".";
static const char *g_schedules = "../../schedules";

typedef struct {
    mf_compilation c;
    char *diag;
    size_t diag_len;
} checked;

/* Compiles path up to sema; asserts it is clean. */
static const mf_spec *check_clean(checked *k, const char *path)
{
    FILE *out = open_memstream(&k->diag, &k->diag_len);
    assert_non_null(out);
    mf_compile_options opt = {.stop_after = MF_STAGE_SEMA, .diag_out = out};
    int rc = mf_pipeline_compile_file(path, &opt, &k->c);
    fclose(out);
    if (rc != 0 || k->diag_len != 0)
        fail_msg("%s: expected a clean check, got status %d:\n%s", path, rc, k->diag);
    assert_non_null(k->c.spec);
    return k->c.spec;
}

static void release(checked *k)
{
    mf_compilation_free(&k->c);
    free(k->diag);
}

static const mf_spec_unit *unit_named(const mf_spec *s, const char *name)
{
    for (int i = 0; i < s->nunits; i++)
        if (strcmp(s->units[i].name, name) == 0)
            return &s->units[i];
    fail_msg("no unit '%s'", name);
    return NULL;
}

static const mf_spec_tensor *tensor_named(const mf_spec_unit *u, const char *name)
{
    for (int i = 0; i < u->ntensors; i++)
        if (strcmp(u->tensors[i].name, name) == 0)
            return &u->tensors[i];
    fail_msg("no tensor '%s' in unit '%s'", name, u->name);
    return NULL;
}

static int layout_named(const mf_spec *s, const char *name)
{
    for (int i = 0; i < s->nlayouts; i++)
        if (strcmp(s->layouts[i].name, name) == 0)
            return i;
    fail_msg("no layout '%s'", name);
    return -1;
}

static void assert_place(const mf_spec *s, int layout, mf_role role, const char *letters)
{
    char buf[MF_MAX_AXES + 1];
    mf_placement_letters(&s->layouts[layout].place[role], s->mesh.naxes, buf);
    assert_string_equal(buf, letters);
}

static void check_dir(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (!d)
        fail_msg("cannot open %s", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".mfsdp") != 0)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        checked k = {0};
        const mf_spec *s = check_clean(&k, path);
        /* Invariants every later pass relies on. */
        assert_true(s->nunits >= 1);
        assert_true(s->mesh.naxes >= 1 && s->mesh.naxes <= MF_MAX_AXES);
        for (int u = 0; u < s->nunits; u++) {
            assert_true(s->units[u].ntensors >= 1);
            assert_in_range(s->units[u].layout, 0, s->nlayouts - 1);
            for (int t = 0; t < s->units[u].ntensors; t++) {
                const mf_spec_tensor *st = &s->units[u].tensors[t];
                assert_in_range(st->layout, 0, s->nlayouts - 1);
                int64_t n = 1;
                for (int j = 0; j < st->ndims; j++)
                    n *= st->dims[j];
                assert_true(n == st->numel && n >= 1);
            }
        }
        release(&k);
        (*count)++;
    }
    closedir(d);
}

static void test_all_valid_specs_check_clean(void **state)
{
    (void)state;
    int n = 0;
    check_dir(g_schedules, &n);
    assert_true(n >= 12); /* the 9 modes, llama, moe, 3-D */
    char valid[1024];
    snprintf(valid, sizeof valid, "%s/valid", g_frontend);
    int m = 0;
    check_dir(valid, &m);
    assert_true(m >= 8);
}

static void test_llama3_8b(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/llama3_8b_hfsdp.mfsdp", g_schedules);
    checked k = {0};
    const mf_spec *s = check_clean(&k, path);
    assert_int_equal(s->mesh.naxes, 2);
    assert_string_equal(s->mesh.axes[0].name, "dp_outer");
    assert_int_equal(s->mesh.axes[0].size, 4);
    assert_string_equal(s->mesh.axes[1].name, "dp_inner");
    assert_int_equal(s->mesh.axes[1].size, 8);
    assert_int_equal(s->mesh.world, 32);
    assert_int_equal(s->microbatches, 8);
    assert_int_equal(s->reduce, MF_REDUCE_AVG);
    assert_int_equal(s->align, 256);
    assert_int_equal(s->prefetch, 1);
    assert_int_equal(s->bucket_size, 0);

    /* embed, layers.0 .. layers.31 (half-open), head */
    assert_int_equal(s->nunits, 34);
    assert_string_equal(s->units[0].name, "embed");
    assert_string_equal(s->units[1].name, "layers.0");
    assert_string_equal(s->units[32].name, "layers.31");
    assert_string_equal(s->units[33].name, "head");
    assert_true(s->units[1].reshard_after_forward);
    assert_false(s->units[33].reshard_after_forward);

    int hfsdp = layout_named(s, "hfsdp"), norms = layout_named(s, "replicated_norms");
    assert_place(s, hfsdp, MF_ROLE_WEIGHT, "RF");
    assert_place(s, hfsdp, MF_ROLE_GRAD, "PF");
    assert_place(s, hfsdp, MF_ROLE_MAIN_WEIGHT, "FF");
    assert_int_equal(s->layouts[hfsdp].dtype[MF_ROLE_WEIGHT], MF_BF16);
    assert_int_equal(s->layouts[hfsdp].dtype[MF_ROLE_GRAD], MF_FP32);
    assert_place(s, norms, MF_ROLE_GRAD, "PP");

    const mf_spec_unit *l7 = unit_named(s, "layers.7");
    assert_int_equal(l7->layout, hfsdp);
    assert_int_equal(l7->ntensors, 6);
    const mf_spec_tensor *w13 = tensor_named(l7, "layers.7.feed_forward.w13.weight");
    assert_int_equal(w13->ndims, 2);
    assert_int_equal(w13->dims[0], 28672);
    assert_int_equal(w13->dims[1], 4096);
    assert_int_equal(w13->numel, (int64_t)28672 * 4096);
    assert_int_equal(w13->layout, hfsdp);
    /* per-tensor override */
    assert_int_equal(tensor_named(l7, "layers.7.ffn_norm.weight")->layout, norms);
    assert_int_equal(tensor_named(unit_named(s, "head"), "head.norm.weight")->layout, norms);
    /* declaration order is kept */
    assert_string_equal(l7->tensors[0].name, "layers.7.attention.wqkv.weight");
    assert_string_equal(l7->tensors[5].name, "layers.7.ffn_norm.weight");
    /* spans point at the source */
    assert_int_equal(s->units[5].span.line, s->units[6].span.line);
    assert_true(s->units[0].span.line > 0);
    release(&k);
}

static void test_deepseek_moe(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/deepseek_moe.mfsdp", g_schedules);
    checked k = {0};
    const mf_spec *s = check_clean(&k, path);
    assert_int_equal(s->bucket_size, 16 << 20);
    assert_int_equal(s->nunits, 6);
    const mf_spec_unit *l2 = unit_named(s, "layers.2");
    /* 7 tensors + 2 shared x 3 + 64 routed x 3 */
    assert_int_equal(l2->ntensors, 7 + 6 + 192);
    tensor_named(l2, "layers.2.moe.experts.63.w3.weight");
    tensor_named(l2, "layers.2.moe.shared_experts.1.w2.weight");
    assert_string_equal(l2->tensors[7].name, "layers.2.moe.shared_experts.0.w1.weight");
    assert_string_equal(l2->tensors[13].name, "layers.2.moe.experts.0.w1.weight");
    assert_string_equal(l2->tensors[14].name, "layers.2.moe.experts.0.w2.weight");
    assert_int_equal(tensor_named(l2, "layers.2.moe.gate.weight")->layout, layout_named(s, "replicated"));
    release(&k);
}

static void test_inline_layout_shared(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/zero2.mfsdp", g_schedules);
    checked k = {0};
    const mf_spec *s = check_clean(&k, path);
    int a = tensor_named(unit_named(s, "layers.0"), "layers.0.ffn_norm.weight")->layout;
    int b = tensor_named(unit_named(s, "layers.3"), "layers.3.ffn_norm.weight")->layout;
    assert_int_equal(a, b);
    assert_true(s->layouts[a].is_inline);
    assert_string_equal(s->layouts[a].name, "<inline layers.{i}.ffn_norm.weight>");
    assert_place(s, a, MF_ROLE_GRAD, "P");
    assert_int_equal(s->layouts[a].dtype[MF_ROLE_WEIGHT], MF_FP32);
    assert_int_equal(s->nlayouts, 2);
    assert_int_equal(s->microbatches, 3);
    release(&k);
}

static void test_defaults(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/valid/defaults.mfsdp", g_frontend);
    checked k = {0};
    const mf_spec *s = check_clean(&k, path);
    assert_int_equal(s->microbatches, 1);
    assert_int_equal(s->reduce, MF_REDUCE_AVG);
    assert_int_equal(s->align, 256);
    assert_int_equal(s->prefetch, 1);
    assert_int_equal(s->bucket_size, 0);
    assert_int_equal(s->nunits, 1);
    assert_true(s->units[0].reshard_after_forward);
    assert_string_equal(s->units[0].tensors[0].name, "u.w");
    assert_int_equal(s->units[0].tensors[0].numel, 15);
    assert_string_equal(s->path, path);
    release(&k);
}

static void test_extensions(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/valid/extensions.mfsdp", g_frontend);
    checked k = {0};
    const mf_spec *s = check_clean(&k, path);
    assert_int_equal(s->reduce, MF_REDUCE_SUM);
    assert_int_equal(s->align, 1024);
    assert_int_equal(s->prefetch, 3);
    assert_int_equal(s->bucket_size, 64 << 20);
    int hfsdp = layout_named(s, "hfsdp"), norms = layout_named(s, "norms");
    /* labeled entries land on their axes, whatever their order */
    assert_place(s, hfsdp, MF_ROLE_WEIGHT, "RF");
    assert_place(s, hfsdp, MF_ROLE_GRAD, "PF");
    /* no default layout: the first tensor's */
    const mf_spec_unit *embed = unit_named(s, "embed");
    assert_int_equal(embed->layout, hfsdp);
    assert_int_equal(embed->tensors[1].layout, norms);
    /* moe.1, moe.2 with nested tensor loops */
    assert_int_equal(s->nunits, 2 + 1 + 3);
    const mf_spec_unit *moe = unit_named(s, "moe.2");
    assert_false(moe->reshard_after_forward);
    assert_int_equal(moe->ntensors, 1 + 8 * 3 + 2);
    assert_string_equal(moe->tensors[1].name, "moe.2.experts.0.w1.weight");
    assert_string_equal(moe->tensors[3].name, "moe.2.experts.0.w3.weight");
    assert_string_equal(moe->tensors[24].name, "moe.2.experts.7.w3.weight");
    /* identical inline layouts share one entry */
    int n1 = tensor_named(moe, "moe.2.norm.weight")->layout;
    int n2 = tensor_named(moe, "moe.2.norm2.weight")->layout;
    assert_int_equal(n1, n2);
    assert_true(s->layouts[n1].is_inline);
    assert_int_not_equal(n1, norms);
    /* negative bounds */
    unit_named(s, "offset.-2");
    unit_named(s, "offset.0");
    assert_string_equal(s->units[s->nunits - 1].name, "offset.0");
    release(&k);
}

static void test_modes_3d(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/valid/modes_3d.mfsdp", g_frontend);
    checked k = {0};
    const mf_spec *s = check_clean(&k, path);
    assert_int_equal(s->mesh.naxes, 3);
    assert_int_equal(s->mesh.world, 8);
    assert_int_equal(s->nlayouts, 9);
    assert_int_equal(s->nunits, 18);
    assert_place(s, layout_named(s, "hsdp_nosync"), MF_ROLE_GRAD, "PPP");
    assert_place(s, layout_named(s, "hfsdp"), MF_ROLE_WEIGHT, "RFF");
    assert_place(s, layout_named(s, "zero2_inner_zero1_outer"), MF_ROLE_GRAD, "PFF");
    assert_string_equal(s->units[17].name, "zero2_inner_zero1_outer.1");
    release(&k);
}

static void test_crlf_and_utf8(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/valid/crlf.mfsdp", g_frontend);
    checked k = {0};
    const mf_spec *s = check_clean(&k, path);
    assert_string_equal(s->units[0].name, "\xc3\xa9mbed");
    assert_int_equal(s->units[0].tensors[0].span.line, 9);
    assert_int_equal(s->units[0].tensors[0].span.col, 9);
    release(&k);
}

static void test_distinct_global(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/valid/distinct_global.mfsdp", g_frontend);
    checked k = {0};
    const mf_spec *s = check_clean(&k, path);
    const mf_spec_unit *l1 = unit_named(s, "layers.1");
    /* rename: one name per ep coordinate (ep = 2), 4 experts per coordinate */
    const mf_spec_tensor *w1 = tensor_named(l1, "layers.1.experts.3.w1");
    assert_int_equal(w1->nglobal, 2);
    assert_false(w1->global_split);
    assert_string_equal(w1->global[0], "layers.1.moe.3.w1");
    assert_string_equal(w1->global[1], "layers.1.moe.7.w1");
    const mf_spec_tensor *w2 = tensor_named(l1, "layers.1.experts.0.w2");
    assert_string_equal(w2->global[1], "layers.1.moe.4.w2");
    /* split: one name, the dimension */
    const mf_spec_tensor *t1 = tensor_named(l1, "layers.1.tp.w1");
    assert_int_equal(t1->nglobal, 1);
    assert_true(t1->global_split);
    assert_int_equal(t1->global_dim, 0);
    assert_string_equal(t1->global[0], "layers.1.mlp.w1");
    const mf_spec_tensor *t2 = tensor_named(l1, "layers.1.tp.w2");
    assert_true(t2->global_split);
    assert_int_equal(t2->global_dim, 1);
    assert_string_equal(t2->global[0], "layers.1.mlp.w2");
    /* a dense tensor has none */
    assert_int_equal(tensor_named(l1, "layers.1.attn.w")->nglobal, 0);
    release(&k);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_frontend = argv[1];
    if (argc > 2)
        g_schedules = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_valid_specs_check_clean),
        cmocka_unit_test(test_llama3_8b),
        cmocka_unit_test(test_deepseek_moe),
        cmocka_unit_test(test_inline_layout_shared),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_extensions),
        cmocka_unit_test(test_modes_3d),
        cmocka_unit_test(test_crlf_and_utf8),
        cmocka_unit_test(test_distinct_global),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
