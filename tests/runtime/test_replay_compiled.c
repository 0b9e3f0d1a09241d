/*
 * End to end with the compiler: for every mode of docs/semantics.md §4.5 x meshes
 * {1x1, 1x4, 2x2, 2x4, 4x2, 3x2, 2x2x2} x M in {1, 3}, a spec is generated,
 * compiled in-process (mf_pipeline_compile_buffer: parse .. lower, verify), emitted as
 * YAML, loaded back through the public loader, and replayed on the local
 * backend with the docs/design.md §4.1 oracle for two steps. Sizes do not divide by any world
 * size; one tensor of a unit has its own all-replicated layout; the last
 * unit keeps its weights after forward.
 */
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

/* "[Replicate, Flat]" from letters. */
static void placement(char *out, size_t size, const char *letters)
{
    size_t at = (size_t)snprintf(out, size, "[");
    for (int j = 0; letters[j]; j++)
        at += (size_t)snprintf(out + at, size - at, "%s%s", j ? ", " : "",
                               letters[j] == 'F' ? "Flat" : letters[j] == 'P' ? "Partial" : "Replicate");
    snprintf(out + at, size - at, "]");
}

static char *spec_text(const char *mode, const rt_mesh *mesh, int64_t M, const char *reduce)
{
    mf_tb_layout l;
    assert_true(mf_tb_mode(mode, mesh->naxes, &l));
    static const char *const names2[] = {"dp_outer", "dp_inner"};
    static const char *const names3[] = {"node", "socket", "gpu"};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    fprintf(f, "# generated: %s on %s, M = %lld\nmesh ", mode, mesh->name, (long long)M);
    for (int j = 0; j < mesh->naxes; j++)
        fprintf(f, "%s%s = %lld", j ? ", " : "", mesh->naxes == 3 ? names3[j] : names2[j],
                (long long)mesh->sizes[j]);
    fprintf(f, ";\nmicrobatches %lld;\nreduce %s;\n", (long long)M, reduce);
    char w[96], g[96], o[96], rep[96], par[96], r_l[8], p_l[8];
    placement(w, sizeof w, l.place[MF_ROLE_WEIGHT]);
    placement(g, sizeof g, l.place[MF_ROLE_GRAD]);
    placement(o, sizeof o, l.place[MF_ROLE_MAIN_WEIGHT]);
    for (int j = 0; j < mesh->naxes; j++) {
        r_l[j] = 'R';
        p_l[j] = 'P';
    }
    r_l[mesh->naxes] = p_l[mesh->naxes] = '\0';
    placement(rep, sizeof rep, r_l);
    placement(par, sizeof par, p_l);
    fprintf(f, "layout main {\n  weight bf16 %s;\n  grad fp32 %s;\n  main_weight fp32 %s;\n}\n", w, g, o);
    fprintf(f, "layout rep {\n  weight fp32 %s;\n  grad fp32 %s;\n  main_weight fp32 %s;\n}\n", rep, par,
            rep);
    fprintf(f, "unit \"embed\" layout main {\n  tensor \"weight\" [91, 11];\n}\n");
    fprintf(f, "unit \"layers.{i}\" for i in 0..2 layout main {\n  tensor \"w\" [37, 21];\n"
               "  tensor \"norm\" [17] layout rep;\n  tensor \"b\" [33];\n}\n");
    fprintf(f, "unit \"head\" layout main {\n  reshard_after_forward false;\n  tensor \"w\" [523];\n"
               "  tensor \"b\" [5];\n}\n");
    fclose(f);
    return buf;
}

/* Compiles spec text, emits it, loads it through the public API. */
static mfsdp_schedule *compile(const char *name, const char *text)
{
    mf_compile_options opt;
    memset(&opt, 0, sizeof opt);
    opt.stop_after = MF_STAGE_VERIFY;
    opt.verify = true;
    char *diag = NULL;
    size_t dlen = 0;
    opt.diag_out = open_memstream(&diag, &dlen);
    mf_compilation c;
    int rc = mf_pipeline_compile_buffer(name, text, strlen(text), &opt, &c);
    fclose(opt.diag_out);
    if (rc != 0 || !c.plan || !c.plan->sched)
        fail_msg("%s does not compile (%d):\n%s\n%s", name, rc, diag, text);
    char *yaml = NULL;
    size_t ylen = 0;
    FILE *y = open_memstream(&yaml, &ylen);
    assert_int_equal(mf_emit_yaml(c.plan->sched, y), 0);
    fclose(y);
    mf_compilation_free(&c);
    free(diag);
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load_buffer(name, yaml, ylen, &sh) != MFSDP_OK)
        fail_msg("%s: emitted schedule does not load: %s", name, mfsdp_last_error(NULL));
    free(yaml);
    return sh;
}

static void run_mode(const char *mode, const char *reduce)
{
    for (int k = 0; k < rt_nmeshes; k++)
        for (int64_t M = 1; M <= 3; M += 2) {
            char name[128];
            snprintf(name, sizeof name, "%s_%s_m%lld.mfsdp", mode, rt_meshes[k].name, (long long)M);
            char *text = spec_text(mode, &rt_meshes[k], M, reduce);
            mfsdp_schedule *sh = compile(name, text);
            char msg[1024];
            int rc = rt_check_local(sh, 2, 0, msg, sizeof msg);
            mfsdp_schedule_free(sh);
            if (rc != 0)
                fail_msg("%s: %s\n%s", name, msg, text);
            free(text);
        }
}

#define MODE_TEST(name, reduce)             \
    static void test_##name(void **state)   \
    {                                       \
        (void)state;                        \
        run_mode(#name, reduce);            \
    }
MODE_TEST(ddp, "avg")
MODE_TEST(zero1, "avg")
MODE_TEST(zero2, "sum")
MODE_TEST(zero3, "avg")
MODE_TEST(hsdp, "avg")
MODE_TEST(hfsdp, "avg")
MODE_TEST(hsdp_nosync, "sum")
MODE_TEST(fsdp2d, "avg")
MODE_TEST(zero2_inner_zero1_outer, "avg")

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ddp),   cmocka_unit_test(test_zero1),
        cmocka_unit_test(test_zero2), cmocka_unit_test(test_zero3),
        cmocka_unit_test(test_hsdp),  cmocka_unit_test(test_hfsdp),
        cmocka_unit_test(test_hsdp_nosync), cmocka_unit_test(test_fsdp2d),
        cmocka_unit_test(test_zero2_inner_zero1_outer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
