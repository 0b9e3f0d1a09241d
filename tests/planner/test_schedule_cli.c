/*
 * `mfsdpc compile` and `mfsdpc diff` as a user runs them: exit codes, output
 * files written atomically (nothing on error, never over the input, no
 * temporary left behind), `-o -`, and the diff of the HSDP and HFSDP examples
 * naming the new outer all-gather and reduce-scatter of every unit and the
 * byte change. Arguments: the mfsdpc binary, the source directory.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "sched_test.h"

static const char *mfsdpc, *srcdir;
static char tmp[256];

static int setup(void **state)
{
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/mfsdp-cli-XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(tmp);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", tmp, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(tmp);
    return 0;
}

/* Runs mfsdpc with `args` (a shell word list); stdout and stderr go to
 * tmp/stdout and tmp/stderr. Returns the exit status. */
static int run(const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >'%s/stdout' 2>'%s/stderr'", srcdir, mfsdpc, args, tmp, tmp);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *out_of(const char *which)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmp, which);
    char *t = st_read(p, NULL);
    assert_non_null(t);
    return t;
}

static char *tmp_path(const char *name, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s", tmp, name);
    return buf;
}

/* Files in tmp other than stdout/stderr. */
static int count_files(char names[][64], int max)
{
    DIR *d = opendir(tmp);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && strcmp(e->d_name, "stdout") != 0 && strcmp(e->d_name, "stderr") != 0 && n < max)
            snprintf(names[n++], 64, "%.63s", e->d_name);
    if (d)
        closedir(d);
    return n;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_compile(void **state)
{
    (void)state;
    char out[512], args[4096], names[8][64];
    tmp_path("hfsdp.yaml", out, sizeof out);
    snprintf(args, sizeof args, "compile schedules/hfsdp.mfsdp -o '%s'", out);
    assert_int_equal(run(args), 0);
    char *text = st_read(out, NULL);
    assert_non_null(text);
    char *golden = st_read("schedules/hfsdp.yaml", NULL);
    if (golden)
        assert_string_equal(text, golden); /* same relative source path: the same bytes */
    assert_int_equal(count_files(names, 8), 1);
    /* -o - writes the same schedule to stdout */
    assert_int_equal(run("compile schedules/hfsdp.mfsdp -o -"), 0);
    char *so = out_of("stdout");
    assert_string_equal(so, text);
    /* --no-verify still writes it */
    snprintf(args, sizeof args, "compile --no-verify schedules/hfsdp.mfsdp --output='%s'", out);
    assert_int_equal(run(args), 0);
    free(so);
    free(golden);
    free(text);
    unlink(out);
}

static void test_compile_errors_write_nothing(void **state)
{
    (void)state;
    char bad[512], out[512], args[4096], names[8][64];
    tmp_path("bad.mfsdp", bad, sizeof bad);
    tmp_path("out.yaml", out, sizeof out);
    write_file(bad, "mesh dp = 4;\nlayout L { weight bf16 [Flat]; grad fp32 [Flat]; main_weight fp32 [Flat]; }\n"
                    "unit \"u\" layout L { tensor \"a\" [x]; }\n");
    write_file(out, "old contents\n");
    snprintf(args, sizeof args, "compile '%s' -o '%s'", bad, out);
    assert_int_equal(run(args), 1);
    char *err = out_of("stderr");
    assert_non_null(strstr(err, "bad.mfsdp:3:"));
    assert_non_null(strstr(err, "error:"));
    free(err);
    char *kept = st_read(out, NULL);
    assert_string_equal(kept, "old contents\n");
    free(kept);
    assert_int_equal(count_files(names, 8), 2); /* bad.mfsdp, out.yaml: no temporary left */
    /* never over the input */
    snprintf(args, sizeof args, "compile '%s' -o '%s'", bad, bad);
    char good[512];
    tmp_path("good.mfsdp", good, sizeof good);
    write_file(good, "mesh dp = 2;\nlayout L { weight bf16 [Flat]; grad fp32 [Flat]; main_weight fp32 [Flat]; }\n"
                     "unit \"u\" layout L { tensor \"a\" [7]; }\n");
    snprintf(args, sizeof args, "compile '%s' -o '%s'", good, good);
    assert_int_equal(run(args), 2);
    char *g = st_read(good, NULL);
    assert_non_null(strstr(g, "tensor \"a\" [7];"));
    free(g);
    err = out_of("stderr");
    assert_non_null(strstr(err, "refusing to overwrite the input file"));
    free(err);
    /* a directory that does not exist: rc 2, nothing created */
    snprintf(args, sizeof args, "compile '%s' -o '%s/no/such/dir/x.yaml'", good, tmp);
    assert_int_equal(run(args), 2);
    assert_int_equal(count_files(names, 8), 3);
    /* a missing spec */
    snprintf(args, sizeof args, "compile '%s/missing.mfsdp' -o '%s'", tmp, out);
    assert_int_equal(run(args), 2);
    unlink(bad);
    unlink(out);
    unlink(good);
}

static void test_compile_usage(void **state)
{
    (void)state;
    assert_int_equal(run("compile schedules/hfsdp.mfsdp"), 2);
    char *err = out_of("stderr");
    assert_non_null(strstr(err, "no output file given"));
    free(err);
    assert_int_equal(run("compile"), 2);
    assert_int_equal(run("compile schedules/hfsdp.mfsdp schedules/hsdp.mfsdp -o -"), 2);
    assert_int_equal(run("compile schedules/hfsdp.mfsdp -o - --frobnicate"), 2);
    assert_int_equal(run("compile schedules/hfsdp.mfsdp -o - --inner-bw=fast"), 2);
    assert_int_equal(run("compile schedules/hfsdp.mfsdp -o - --inner-bw=100"), 0);
    assert_int_equal(run("compile --help"), 0);
    char *out = out_of("stdout");
    assert_non_null(strstr(out, "usage: mfsdpc compile SPEC -o OUT.yaml"));
    free(out);
}

static void test_diff_hsdp_hfsdp(void **state)
{
    (void)state;
    assert_int_equal(run("diff schedules/hsdp.mfsdp schedules/hfsdp.mfsdp"), 1);
    char *out = out_of("stdout");
    static const char *const units[] = {"embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        char head[64];
        snprintf(head, sizeof head, "\nunit %s:\n", units[i]);
        const char *at = strstr(out, head);
        if (!at)
            fail_msg("no section for unit %s in:\n%s", units[i], out);
        const char *end = strstr(at + 1, "\nunit ");
        if (!end)
            end = strstr(at, "\ntotals");
        assert_non_null(end);
        const char *ag = strstr(at, "+ all_gather on dp_outer (T1, first");
        const char *rs = strstr(at, "+ reduce_scatter on dp_outer (T4, last");
        const char *ar = strstr(at, "- all_reduce on dp_outer (T4, last");
        if (!(ag && ag < end && rs && rs < end && ar && ar < end))
            fail_msg("unit %s: the new outer all-gather / reduce-scatter or the removed all-reduce is missing:\n%.*s",
                     units[i], (int)(end - at), at);
    }
    assert_non_null(strstr(out, "\ntotals per step (before -> after):\n"));
    assert_non_null(strstr(out, "  all_gather on dp_outer: 0 -> 6\n"));
    assert_non_null(strstr(out, "  reduce_scatter on dp_outer: 0 -> 6\n"));
    assert_non_null(strstr(out, "  bytes per rank on dp_outer: "));
    assert_non_null(strstr(out, "  persistent bytes per rank, main_weight: "));
    free(out);
}

static void test_diff_equivalence(void **state)
{
    (void)state;
    char out[512], args[4096];
    tmp_path("z3.yaml", out, sizeof out);
    snprintf(args, sizeof args, "compile schedules/zero3.mfsdp -o '%s'", out);
    assert_int_equal(run(args), 0);
    /* a spec and its compiled schedule are equivalent; so is a schedule and itself */
    snprintf(args, sizeof args, "diff schedules/zero3.mfsdp '%s'", out);
    assert_int_equal(run(args), 0);
    char *so = out_of("stdout");
    assert_string_equal(so, "");
    free(so);
    snprintf(args, sizeof args, "diff '%s' '%s'", out, out);
    assert_int_equal(run(args), 0);
    /* a hand-edited op that no longer matches the summary is refused (exit 2) */
    char *text = st_read(out, NULL);
    char *p = strstr(text, "when: every, stream: inner, op: reduce_scatter");
    assert_non_null(p);
    memcpy(p, "when: first", 11); /* same length as "when: every" */
    char changed[512];
    tmp_path("z3b.yaml", changed, sizeof changed);
    write_file(changed, text);
    free(text);
    snprintf(args, sizeof args, "diff '%s' '%s'", out, changed);
    assert_int_equal(run(args), 2);
    char *err = out_of("stderr");
    assert_non_null(strstr(err, "z3b.yaml:"));
    assert_non_null(strstr(err, "error: summary collectives.reduce_scatter.dp is "));
    free(err);
    /* a spec that differs in prefetch depth: exit 1, the hook changes listed */
    char *spec = st_read("schedules/zero3.mfsdp", NULL);
    assert_non_null(spec);
    char *pf = strstr(spec, "prefetch 2;");
    assert_non_null(pf);
    pf[9] = '1';
    char spec1[512];
    tmp_path("zero3_prefetch1.mfsdp", spec1, sizeof spec1);
    write_file(spec1, spec);
    free(spec);
    snprintf(args, sizeof args, "diff schedules/zero3.mfsdp '%s'", spec1);
    assert_int_equal(run(args), 1);
    so = out_of("stdout");
    assert_non_null(strstr(so, "prefetch: 2 -> 1\n"));
    /* the arena and both of its lower bounds (docs/semantics.md §10) */
    assert_non_null(strstr(so, "  arena bytes per rank (transient): 822784 -> 716288 "));
    assert_non_null(strstr(so, "  interference lower bound per rank: 822784 -> 716288 "));
    assert_non_null(strstr(so, "~ all_gather on dp (T2 at forward_pre) [layers.1/fsdp]: issued at forward_pre of "
                               "embed -> forward_pre of layers.0\n"));
    free(so);
    unlink(out);
    unlink(changed);
    unlink(spec1);
}

static void test_diff_errors(void **state)
{
    (void)state;
    assert_int_equal(run("diff schedules/hsdp.mfsdp"), 2);
    assert_int_equal(run("diff schedules/hsdp.mfsdp schedules/none.yaml"), 2);
    char *err = out_of("stderr");
    assert_non_null(strstr(err, "schedules/none.yaml: error: cannot open"));
    free(err);
    char bad[512], args[4096];
    tmp_path("broken.yaml", bad, sizeof bad);
    write_file(bad, "format: mfsdp-schedule/9\n");
    snprintf(args, sizeof args, "diff schedules/hsdp.mfsdp '%s'", bad);
    assert_int_equal(run(args), 2);
    err = out_of("stderr");
    assert_non_null(strstr(err, "broken.yaml:1:9: error: unknown format 'mfsdp-schedule/9'"));
    free(err);
    assert_int_equal(run("diff --help"), 0);
    unlink(bad);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MFSDPC SOURCE_DIR\n", argv[0]);
        return 2;
    }
    mfsdpc = argv[1];
    srcdir = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile),
        cmocka_unit_test(test_compile_errors_write_nothing),
        cmocka_unit_test(test_compile_usage),
        cmocka_unit_test(test_diff_hsdp_hfsdp),
        cmocka_unit_test(test_diff_equivalence),
        cmocka_unit_test(test_diff_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
