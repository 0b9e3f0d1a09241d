/*
 * Hostile sizes (issue 8): a 1 MB name, 100 000 errors, 100 000 levels of
 * nesting, numbers past every limit, very many tensors and units, and deeply
 * nested or alias-laden schedule YAML. Each is refused cleanly (status 1, a
 * located error naming the limit) or compiled; the diagnostics stay bounded
 * (the error cap: 100 printed, all counted; output linear in the input).
 * Time is not asserted here (tests/hardening/scale-bench.sh reports it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_load.h"
#include "mf_passes.h"
#include "mf_pipeline.h"

#define HDR "mesh dp = 2;\nlayout l { weight fp32 [Replicate]; grad fp32 [Partial]; main_weight fp32 [Replicate]; }\n"

/* A growable string. */
typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static void put(buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap : 4096);
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        assert_non_null(p);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(buf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void repeat(buf *b, const char *s, long n)
{
    for (long i = 0; i < n; i++)
        puts_(b, s);
}

static void printf_(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void printf_(buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof tmp);
    put(b, tmp, (size_t)n);
}

typedef struct result {
    int rc, nerrors;
    char *diag;             /* owned */
    size_t diag_len;
} result;

/* Compiles text through the verifier; diagnostics into r->diag. */
static result compile(const buf *in)
{
    result r = {0};
    FILE *f = open_memstream(&r.diag, &r.diag_len);
    assert_non_null(f);
    mf_compile_options opt = {.stop_after = MF_STAGE_VERIFY, .verify = true, .diag_out = f};
    mf_compilation c;
    r.rc = mf_pipeline_compile_buffer("big.mfsdp", in->p, in->len, &opt, &c);
    r.nerrors = c.diag.nerrors;
    if (r.rc == 0) {
        assert_non_null(c.plan);
        assert_int_equal(mf_emit_yaml(c.plan->sched, fopen("/dev/null", "w")), 0);
    }
    mf_compilation_free(&c);
    fclose(f);
    return r;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* rc 1, at least one error, output at most linear in the input, and `want`
 * in the first error. */
static void expect_refused(const buf *in, const char *want, const char *what)
{
    result r = compile(in);
    if (r.rc != 1 || r.nerrors < 1 || !strstr(r.diag, want))
        fail_msg("%s: rc %d, %d errors, expected '%s' in: %.600s", what, r.rc, r.nerrors, want, r.diag);
    if (!strstr(r.diag, "big.mfsdp:") || r.diag_len > 4 * in->len + 65536)
        fail_msg("%s: %zu bytes of diagnostics for %zu bytes of input", what, r.diag_len, in->len);
    free(r.diag);
}

static void test_long_names(void **state)
{
    (void)state;
    buf b = {0};
    puts_(&b, HDR "unit \"");
    repeat(&b, "n", 1 << 20);
    puts_(&b, "\" layout l { tensor \"w\" [3]; }\n");
    result r = compile(&b);
    assert_int_equal(r.rc, 0);
    free(r.diag);

    b.len = 0;
    puts_(&b, HDR "unit \"");
    repeat(&b, "n", 1 << 20);
    puts_(&b, "\" layout nosuch { tensor \"w\" [3]; }\n");
    r = compile(&b);
    assert_int_equal(r.rc, 1);
    assert_int_equal(r.nerrors, 1);
    /* the snippet is a window of the 1 MB line, the caret under 'nosuch' */
    const char *src = strstr(r.diag, "\n 3 | ..."), *caret = src ? strchr(src + 1, '\n') : NULL;
    assert_non_null(caret);
    size_t w = (size_t)(caret - src);
    const char *hat = strchr(caret + 1, '^');
    assert_true(w < 300 && hat && strncmp(src + 1 + (hat - caret - 1), "nosuch", 6) == 0);
    assert_true(r.diag_len < 4096);
    free(r.diag);

    b.len = 0;
    puts_(&b, HDR "unit \"u\" layout ");
    repeat(&b, "L", 1 << 20);
    puts_(&b, " { tensor \"w\" [3]; }\n");
    expect_refused(&b, "unknown layout", "1 MB layout identifier");

    b.len = 0;
    puts_(&b, HDR "unit \"u\" layout l { tensor \"");
    repeat(&b, "t", 1 << 20); /* unterminated, to the end of the file */
    expect_refused(&b, "unterminated string", "1 MB unterminated string");
    free(b.p);
}

static void test_many_errors(void **state)
{
    (void)state;
    static const char *const kinds[][3] = {
        {"unit \"x", "\" layout l { tensor \"w\" [0]; }\n", "at least 1"}, /* semantic */
        {"unit \"x", "\" layout nosuch { tensor \"w\" [3]; }\n", "unknown layout"},
        {"@", ";\n", "stray '@'"},                                          /* lexical */
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        buf b = {0};
        puts_(&b, HDR "unit \"u\" layout l { tensor \"w\" [3]; }\n");
        for (int i = 0; i < 100000; i++)
            printf_(&b, "%s%d%s", kinds[k][0], i, kinds[k][1]);
        result r = compile(&b);
        assert_int_equal(r.rc, 1);
        if (r.nerrors != 100000 || count(r.diag, ": error: ") != 100 ||
            !strstr(r.diag, "99900 more errors not shown (limit is 100); 100000 errors in all") ||
            !strstr(r.diag, kinds[k][2]) || r.diag_len > 100 * 2048)
            fail_msg("kind %zu: %d errors, %d printed, %zu bytes: ...%s", k, r.nerrors,
                     count(r.diag, ": error: "), r.diag_len, r.diag + (r.diag_len > 300 ? r.diag_len - 300 : 0));
        free(r.diag);
        free(b.p);
    }
    /* syntax errors: the parser recovers at each ';' and the output stays capped */
    buf b = {0};
    puts_(&b, HDR "unit \"u\" layout l { tensor \"w\" [3]; }\n");
    repeat(&b, "garbage line here ;\nmesh = ;\nunit unit unit;\n", 30000);
    result r = compile(&b);
    assert_int_equal(r.rc, 1);
    assert_true(r.nerrors >= 1 && count(r.diag, ": error: ") <= 100 && r.diag_len < 100 * 2048);
    free(r.diag);
    free(b.p);
}

static void test_deep_nesting(void **state)
{
    (void)state;
    buf b = {0};
    puts_(&b, HDR "unit \"u\" layout l { ");
    repeat(&b, "for a in 0..1 { ", 100000);
    puts_(&b, "tensor \"w\" [3];");
    repeat(&b, "}", 100000);
    puts_(&b, " }\n");
    expect_refused(&b, "too many nested blocks (limit is 8)", "100000 nested loops");

    const char *opens[] = {"{", "[", "(", "layout l { "};
    for (size_t i = 0; i < sizeof opens / sizeof opens[0]; i++) {
        b.len = 0;
        puts_(&b, HDR "unit \"u\" layout l { tensor \"w\" ");
        repeat(&b, opens[i], 100000);
        puts_(&b, "\n");
        expect_refused(&b, "error:", opens[i]);
    }
    free(b.p);
}

static void test_huge_numbers(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {HDR "unit \"u\" layout l { tensor \"w\" [99999999999999999999999999999]; }\n", "does not fit in 63 bits"},
        {HDR "unit \"u\" layout l { tensor \"w\" [9223372036854775807, 9223372036854775807]; }\n", "overflows 63 bits"},
        {HDR "unit \"u\" layout l { tensor \"w\" [4194304, 4194304]; }\n", "limit is 4398046511104"},
        {HDR "unit \"u\" layout l { tensor \"w\" [-5]; }\n", "error:"},
        {HDR "unit \"u{i}\" for i in 0..9223372036854775807 layout l { tensor \"w\" [3]; }\n", "too many units (limit is 65536)"},
        {HDR "unit \"u\" layout l { for t in 0..1048577 { tensor \"w{t}\" [3]; } }\n", "too many tensors (limit is 1048576)"},
        {HDR "unit \"u{i}\" for i in 0..70000 layout l { tensor \"w\" [3]; }\n", "too many units (limit is 65536)"},
        {HDR "unit \"u{i}\" for i in 0..1024 layout l { for t in 0..1024 { tensor \"w{t}\" [3]; } tensor \"x\" [1]; }\n",
         "too many tensors (limit is 1048576)"},
        {"mesh a = 4294967296, b = 4294967296;\n", "overflows 63 bits"},
        {"mesh a = 65536, b = 65536;\n", "limit is 16777216"},
        {"mesh dp = 2;\nmicrobatches 99999999999;\n", "limit is 65536"},
        {"mesh dp = 2;\nalign 4611686018427387904;\n", "too large"},
        {"mesh dp = 2;\nprefetch 9223372036854775807;\n", "too deep"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf b = {0};
        puts_(&b, cases[i][0]);
        char what[32];
        snprintf(what, sizeof what, "number case %zu", i);
        expect_refused(&b, cases[i][1], what);
        free(b.p);
    }
}

static void test_many_tensors_and_units(void **state)
{
    (void)state;
    buf b = {0};
    puts_(&b, "mesh o = 2, i = 4;\nlayout l { weight bf16 [Replicate, Flat]; grad fp32 [Partial, Flat]; "
              "main_weight fp32 [Flat, Flat]; }\nunit \"u\" layout l {\n");
    for (int i = 0; i < 100000; i++)
        printf_(&b, "  tensor \"t%d\" [%d];\n", i, 1 + i % 7);
    puts_(&b, "}\n");
    result r = compile(&b);
    assert_int_equal(r.rc, 0);
    free(r.diag);
    b.len = 0;
    puts_(&b, "mesh o = 2, i = 2;\nmicrobatches 2;\nlayout l { weight bf16 [Replicate, Flat]; grad fp32 [Partial, Flat]; "
              "main_weight fp32 [Flat, Flat]; }\nunit \"u{i}\" for i in 0..1000 layout l { tensor \"w\" [33, 7]; }\n");
    r = compile(&b);
    assert_int_equal(r.rc, 0);
    free(r.diag);
    free(b.p);
}

/* ---- the schedule loader ---- */

static void expect_load_refused(const buf *in, const char *want, const char *what)
{
    char err[1024];
    mf_schedule *s = mf_load_schedule_buffer("big.yaml", in->p, in->len, err, sizeof err);
    if (s || !strstr(err, want) || strncmp(err, "big.yaml:", 9) != 0)
        fail_msg("%s: %s", what, s ? "loaded" : err);
}

static void test_hostile_yaml(void **state)
{
    (void)state;
    const char *opens[] = {"[", "{a: ", "[\n", "{\n", "[a, "};
    for (size_t i = 0; i < sizeof opens / sizeof opens[0]; i++) {
        buf b = {0};
        puts_(&b, "format: mfsdp-schedule/3\nsource: ");
        repeat(&b, opens[i], 100000);
        expect_load_refused(&b, "nested more than 32 deep", opens[i]);
        free(b.p);
    }
    /* block nesting needs indentation, so its depth grows with the square
     * root of the size; 2000 levels (2 MB) */
    buf blk = {0};
    puts_(&blk, "format: mfsdp-schedule/3\nsource:\n");
    for (int i = 1; i <= 2000; i++) {
        repeat(&blk, " ", i);
        puts_(&blk, "-\n");
    }
    expect_load_refused(&blk, "nested more than 32 deep", "block nesting");
    free(blk.p);
    /* aliases: the document API shares nodes; the loader refuses repeats */
    buf b = {0};
    puts_(&b, "format: mfsdp-schedule/3\nsource: x\nsource_sha256: \"");
    repeat(&b, "0", 64);
    puts_(&b, "\"\nmesh: {axes: [{name: a, size: 2}]}\nmicrobatches: 1\nreduce: avg\nalign: 256\nprefetch: 1\n"
              "units: [&u {name: u, reshard_after_forward: true, buckets: []}, *u, *u, *u]\n"
              "buckets: []\nbuffers: []\narena: {persistent: 0, transient: 0}\nevents: 0\nops: []\n"
              "summary: {}\n");
    expect_load_refused(&b, "duplicate unit name 'u'", "aliased units");
    b.len = 0;
    puts_(&b, "format: mfsdp-schedule/3\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for (int i = 1; i < 9; i++) {
        printf_(&b, "a%d: &a%d [", i, i);
        for (int j = 0; j < 10; j++)
            printf_(&b, "%s*a%d", j ? ", " : "", i - 1);
        puts_(&b, "]\n");
    }
    expect_load_refused(&b, "unknown key 'a0'", "billion laughs");
    b.len = 0;
    puts_(&b, "format: mfsdp-schedule/3\n");
    repeat(&b, "k", 1 << 20);
    puts_(&b, ": 1\n");
    expect_load_refused(&b, "error:", "1 MB key");
    b.len = 0;
    for (int i = 0; i < 100000; i++)
        printf_(&b, "k%d: %d\n", i, i);
    expect_load_refused(&b, "format", "100000 keys");
    free(b.p);
}

/* Names go into the YAML schedule, whose emitter refuses bytes that are not
 * UTF-8: the lexer refuses them with a location (fuzz_planner finding). */
static void test_names_not_utf8(void **state)
{
    (void)state;
    static const char *const bad[] = {"e\xff", "\xc3", "\xc3(", "\xe2\x82", "\xed\xa0\x80", "\xc0\xaf",
                                      "\xf4\x90\x80\x80", "\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        buf b = {0};
        printf_(&b, HDR "unit \"u%s\" layout l { tensor \"w\" [3]; }\n", bad[i]);
        expect_refused(&b, "big.mfsdp:3:", "case");
        expect_refused(&b, "invalid UTF-8 byte", "case");
        free(b.p);
    }
    buf b = {0};
    puts_(&b, HDR "unit \"\xc3\xa9mbed \xe2\x82\xac \xf0\x9f\x98\x80\" layout l { tensor \"w\" [3]; }\n");
    result r = compile(&b);
    assert_int_equal(r.rc, 0);
    free(r.diag);
    free(b.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_names),
        cmocka_unit_test(test_many_errors),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_huge_numbers),
        cmocka_unit_test(test_many_tensors_and_units),
        cmocka_unit_test(test_hostile_yaml),
        cmocka_unit_test(test_names_not_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
