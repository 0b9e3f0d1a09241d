/*
 * Golden diagnostics for the front end: every tests/grammar/invalid/NAME.mfsdp
 * runs through the in-process pipeline up to the semantic pass, and what it
 * prints must equal NAME.expected byte for byte. The file name in the
 * diagnostics is the relative path the test passes ("invalid/NAME.mfsdp"),
 * which is also what `mfsdpc check invalid/NAME.mfsdp` prints when run from
 * tests/grammar.
 *
 * argv[1]: the tests/grammar source directory.
 * MFSDP_UPDATE_GOLDEN=1 rewrites the .expected files instead of comparing.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mf_pipeline.h"

static const char *g_dir = ".";

enum { MIN_GOLDEN = 45 };

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names (without extension) of the files in dir ending in ext. */
static char **list_files(const char *dir, const char *ext, size_t *n)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t cap = 64, len = 0;
    char **names = malloc(cap * sizeof *names);
    assert_non_null(names);
    struct dirent *e;
    size_t el = strlen(ext);
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= el || strcmp(e->d_name + l - el, ext) != 0)
            continue;
        if (len == cap) {
            cap *= 2;
            names = realloc(names, cap * sizeof *names);
            assert_non_null(names);
        }
        names[len] = strndup(e->d_name, l - el);
        assert_non_null(names[len]);
        len++;
    }
    closedir(d);
    qsort(names, len, sizeof *names, cmp_str);
    *n = len;
    return names;
}

static void free_list(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Runs parse + sema on path; returns the diagnostics (owned) and the status. */
static char *diagnose(const char *path, int *rc)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_non_null(out);
    mf_compile_options opt = {.stop_after = MF_STAGE_SEMA, .diag_out = out};
    mf_compilation c;
    *rc = mf_pipeline_compile_file(path, &opt, &c);
    mf_compilation_free(&c);
    fclose(out);
    return buf;
}

static char *slurp(const char *path)
{
    size_t len;
    return mf_pipeline_read_file(path, &len);
}

/* Index of the first differing line, for a readable failure. */
static void report_mismatch(const char *name, const char *want, const char *got)
{
    int line = 1;
    const char *w = want, *g = got;
    while (*w && *w == *g) {
        if (*w == '\n')
            line++;
        w++;
        g++;
    }
    fprintf(stderr, "golden mismatch: invalid/%s.expected differs at line %d\n--- expected\n%s--- got\n%s---\n",
            name, line, want, got);
}

static void test_golden_diagnostics(void **state)
{
    (void)state;
    bool update = getenv("MFSDP_UPDATE_GOLDEN") && strcmp(getenv("MFSDP_UPDATE_GOLDEN"), "1") == 0;
    size_t n;
    char **names = list_files("invalid", ".mfsdp", &n);
    assert_true(n >= MIN_GOLDEN);
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        char path[512], expected[512];
        snprintf(path, sizeof path, "invalid/%s.mfsdp", names[i]);
        snprintf(expected, sizeof expected, "invalid/%s.expected", names[i]);
        int rc;
        char *got = diagnose(path, &rc);
        /* Every invalid spec fails with at least one located error. */
        if (rc != 1 || !strstr(got, ": error: ")) {
            fprintf(stderr, "%s: expected exit status 1 and an error, got %d:\n%s", path, rc, got);
            failures++;
        }
        if (update) {
            FILE *f = fopen(expected, "wb");
            assert_non_null(f);
            fputs(got, f);
            fclose(f);
        } else {
            char *want = slurp(expected);
            if (!want) {
                fprintf(stderr, "%s: missing (run with MFSDP_UPDATE_GOLDEN=1 to create it)\n", expected);
                failures++;
            } else if (strcmp(want, got) != 0) {
                report_mismatch(names[i], want, got);
                failures++;
            }
            free(want);
        }
        free(got);
    }
    free_list(names, n);
    assert_int_equal(failures, 0);
}

/* No stale .expected without its spec. */
static void test_no_orphan_expected(void **state)
{
    (void)state;
    size_t n;
    char **names = list_files("invalid", ".expected", &n);
    for (size_t i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "invalid/%s.mfsdp", names[i]);
        if (access(path, R_OK) != 0)
            fail_msg("invalid/%s.expected has no spec", names[i]);
    }
    free_list(names, n);
}

/* The same input twice gives the same output (no state leaks between
 * parses), and parsing from a buffer equals parsing the file. */
static void test_deterministic(void **state)
{
    (void)state;
    const char *path = "invalid/several_errors.mfsdp";
    int rc1, rc2;
    char *a = diagnose(path, &rc1);
    char *b = diagnose(path, &rc2);
    assert_int_equal(rc1, rc2);
    assert_string_equal(a, b);

    char *text = slurp(path);
    assert_non_null(text);
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    mf_compile_options opt = {.stop_after = MF_STAGE_SEMA, .diag_out = out};
    mf_compilation c;
    int rc3 = mf_pipeline_compile_buffer(path, text, strlen(text), &opt, &c);
    mf_compilation_free(&c);
    fclose(out);
    assert_int_equal(rc3, 1);
    assert_string_equal(a, buf);
    free(text);
    free(buf);
    free(a);
    free(b);
}

/* The several-mistakes files report each mistake at its own line. */
static void test_several_errors_each_located(void **state)
{
    (void)state;
    int rc;
    char *got = diagnose("invalid/several_errors.mfsdp", &rc);
    assert_int_equal(rc, 1);
    static const char *const at[] = {
        "invalid/several_errors.mfsdp:3:14: error: microbatches",
        "invalid/several_errors.mfsdp:9:20: error: placement [Flat, Replicate]",
        "invalid/several_errors.mfsdp:22:40: error: unknown layout 'hfdsp'",
        "invalid/several_errors.mfsdp:23:40: error: dimension 2",
        "invalid/several_errors.mfsdp:24:46: error: unknown layout 'norm'",
        "invalid/several_errors.mfsdp:28:37: error: dimension 3",
    };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
        if (!strstr(got, at[i]))
            fail_msg("missing '%s' in:\n%s", at[i], got);
    free(got);

    got = diagnose("invalid/syntax_several_errors.mfsdp", &rc);
    assert_int_equal(rc, 1);
    static const char *const syn[] = {
        "invalid/syntax_several_errors.mfsdp:3:15: error: expected ';'",
        "invalid/syntax_several_errors.mfsdp:7:29: error:",
        "invalid/syntax_several_errors.mfsdp:11:22: error: expected 'layout' or 'global' or ';' or '{' before 'tensor'",
        "invalid/syntax_several_errors.mfsdp:15:18: error:",
        "invalid/syntax_several_errors.mfsdp:17:17: error:",
    };
    for (size_t i = 0; i < sizeof syn / sizeof syn[0]; i++)
        if (!strstr(got, syn[i]))
            fail_msg("missing '%s' in:\n%s", syn[i], got);
    free(got);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_dir = argv[1];
    if (chdir(g_dir) != 0) {
        perror(g_dir);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_diagnostics),
        cmocka_unit_test(test_no_orphan_expected),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_several_errors_each_located),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
