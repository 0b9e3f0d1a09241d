/*
 * The shared option parser (core/mf_opts.c): options, values in both forms,
 * aliases, short-only options, operands in order, pass-through arguments;
 * an unknown option, a missing value and --help; the leniencies of
 * getopt_long it refuses
 * (abbreviations, "-oV", grouped aliases, "--" where not listed); two parses
 * in one process. The messages are written out here by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mf_opts.h"

enum { O_HELP, O_FORMAT, O_OUT, O_QUIET, O_END };

static const mf_opt table[] = {{"--help", "-h", NULL, O_HELP},
                               {"--format", NULL, "a value (text or yaml)", O_FORMAT},
                               {"--output", "-o", "a file name", O_OUT},
                               {"--quiet", NULL, NULL, O_QUIET}};

static bool is_extra(const char *a)
{
    return strncmp(a, "--bw=", 5) == 0;
}

/* What one parse returned, with its values, and what it printed on stderr. */
typedef struct run {
    int n;
    int id[16];
    const char *val[16];
    char err[512];
} run;

static void parse(run *r, const char *const *args, const mf_opt *t, int nt, bool quiet)
{
    char *argv[17];
    int argc = 0;
    argv[argc++] = (char *)"cmd";
    for (; args[argc - 1]; argc++)
        argv[argc] = (char *)args[argc - 1];
    argv[argc] = NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *saved = stderr;
    stderr = open_memstream(&buf, &len);
    assert_non_null(stderr);
    mf_opts p;
    mf_opts_init(&p, "mfsdpc test", argc, argv, t, nt, is_extra);
    p.quiet = quiet;
    memset(r, 0, sizeof *r);
    const char *v;
    int id;
    while (r->n < 16 && (id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        r->id[r->n] = id;
        r->val[r->n++] = v;
        if (id == MF_OPTS_UNKNOWN || id == MF_OPTS_NO_VALUE || id == O_END)
            break;
    }
    fclose(stderr);
    stderr = saved;
    snprintf(r->err, sizeof r->err, "%s", buf ? buf : "");
    free(buf);
}

/* The k-th result was id, with value val (NULL: none). */
static void expect_arg(const run *r, int k, int id, const char *val)
{
    assert_true(k < r->n);
    assert_int_equal(r->id[k], id);
    if (val)
        assert_string_equal(r->val[k], val);
    else
        assert_null(r->val[k]);
}

/* The parse returned n results, the last one id, and printed err. */
static void expect_end(const run *r, int n, int id, const char *err)
{
    assert_int_equal(r->n, n);
    assert_int_equal(r->id[n - 1], id);
    assert_string_equal(r->err, err);
}

static void test_options_and_operands(void **state)
{
    (void)state;
    const char *args[] = {"a.mfsdp", "--format", "yaml", "--output=x.yaml", "-o", "y", "--quiet", "--bw=3",
                          "-",       "b",        NULL};
    run r;
    parse(&r, args, table, 4, false);
    assert_int_equal(r.n, 8);
    expect_arg(&r, 0, MF_OPTS_OPERAND, "a.mfsdp");
    expect_arg(&r, 1, O_FORMAT, "yaml");
    expect_arg(&r, 2, O_OUT, "x.yaml");
    expect_arg(&r, 3, O_OUT, "y");
    expect_arg(&r, 4, O_QUIET, NULL);
    expect_arg(&r, 5, MF_OPTS_EXTRA, "--bw=3");
    expect_arg(&r, 6, MF_OPTS_OPERAND, "-");
    expect_arg(&r, 7, MF_OPTS_OPERAND, "b");
    assert_string_equal(r.err, "");
}

static void test_value_may_look_like_an_option(void **state)
{
    (void)state;
    const char *args[] = {"-o", "--help", "--output=", NULL};
    run r;
    parse(&r, args, table, 4, false);
    assert_int_equal(r.n, 2);
    expect_arg(&r, 0, O_OUT, "--help");
    expect_arg(&r, 1, O_OUT, "");
}

static void test_unknown_option(void **state)
{
    (void)state;
    const char *args[] = {"a", "--frobnicate", "b", NULL};
    run r;
    parse(&r, args, table, 4, false);
    expect_arg(&r, 1, MF_OPTS_UNKNOWN, "--frobnicate");
    expect_end(&r, 2, MF_OPTS_UNKNOWN, "mfsdpc test: error: unknown option '--frobnicate'\n");
}

static void test_missing_value(void **state)
{
    (void)state;
    run r;
    const char *long_form[] = {"a", "--format", NULL};
    parse(&r, long_form, table, 4, false);
    expect_end(&r, 2, MF_OPTS_NO_VALUE, "mfsdpc test: error: --format needs a value (text or yaml)\n");
    const char *alias[] = {"-o", NULL};
    parse(&r, alias, table, 4, false);
    expect_end(&r, 1, MF_OPTS_NO_VALUE, "mfsdpc test: error: -o needs a file name\n");
}

static void test_help(void **state)
{
    (void)state;
    run r;
    const char *longer[] = {"--help", NULL};
    parse(&r, longer, table, 4, false);
    assert_int_equal(r.n, 1);
    expect_arg(&r, 0, O_HELP, NULL);
    const char *alias[] = {"x", "-h", NULL};
    parse(&r, alias, table, 4, false);
    expect_end(&r, 2, O_HELP, "");
}

/* What getopt_long alone would take, refused as unknown options. */
static void test_refused_leniencies(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"--form", "mfsdpc test: error: unknown option '--form'\n"},        /* abbreviation */
        {"--out=f", "mfsdpc test: error: unknown option '--out=f'\n"},      /* abbreviation */
        {"-ofile", "mfsdpc test: error: unknown option '-ofile'\n"},        /* attached value */
        {"-ho", "mfsdpc test: error: unknown option '-ho'\n"},              /* grouped aliases */
        {"--quiet=1", "mfsdpc test: error: unknown option '--quiet=1'\n"},  /* a flag's value */
        {"--", "mfsdpc test: error: unknown option '--'\n"},                /* not listed */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *args[] = {cases[k][0], "a", NULL};
        run r;
        parse(&r, args, table, 4, false);
        expect_end(&r, 1, MF_OPTS_UNKNOWN, cases[k][1]);
    }
}

static void test_listed_double_dash(void **state)
{
    (void)state;
    static const mf_opt t[] = {{"--help", "-h", NULL, O_HELP}, {"--", NULL, NULL, O_END}};
    const char *args[] = {"-h", "--", "--help", NULL};
    run r;
    parse(&r, args, t, 2, false);
    expect_arg(&r, 0, O_HELP, NULL);
    expect_end(&r, 2, O_END, "");
}

/* An entry named "-o" has no long name: "--o" is no option. */
static void test_short_only(void **state)
{
    (void)state;
    static const mf_opt t[] = {{"-o", NULL, "a file name", O_OUT}};
    const char *args[] = {"-o", "f", "--o", NULL};
    run r;
    parse(&r, args, t, 1, false);
    expect_arg(&r, 0, O_OUT, "f");
    expect_end(&r, 2, MF_OPTS_UNKNOWN, "mfsdpc test: error: unknown option '--o'\n");
    const char *last[] = {"x", "-o", NULL};
    parse(&r, last, t, 1, false);
    expect_arg(&r, 1, MF_OPTS_NO_VALUE, NULL);
    expect_end(&r, 2, MF_OPTS_NO_VALUE, "mfsdpc test: error: -o needs a file name\n");
}

static void test_quiet(void **state)
{
    (void)state;
    const char *args[] = {"--frobnicate", NULL};
    run r;
    parse(&r, args, table, 4, true);
    expect_end(&r, 1, MF_OPTS_UNKNOWN, "");
}

/* A second parse in the same process starts again at argv[1], though the
 * first stopped half-way. */
static void test_parses_again(void **state)
{
    (void)state;
    run r;
    const char *first[] = {"--format", "text", "--frob", "rest", NULL};
    parse(&r, first, table, 4, true);
    expect_end(&r, 2, MF_OPTS_UNKNOWN, "");
    const char *second[] = {"s", "--quiet", NULL};
    parse(&r, second, table, 4, false);
    expect_arg(&r, 0, MF_OPTS_OPERAND, "s");
    expect_end(&r, 2, O_QUIET, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_and_operands),
        cmocka_unit_test(test_value_may_look_like_an_option),
        cmocka_unit_test(test_unknown_option),
        cmocka_unit_test(test_missing_value),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_refused_leniencies),
        cmocka_unit_test(test_listed_double_dash),
        cmocka_unit_test(test_short_only),
        cmocka_unit_test(test_quiet),
        cmocka_unit_test(test_parses_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
