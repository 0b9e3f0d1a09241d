/*
 * Emitter: the buffers and ops sections come from two writers
 * (planner/passes/mf_emit_lines.c when every name in them is plain, libyaml's
 * emitter otherwise; docs/schedule.md §1 "How the file is written"), and
 * both must give the same layout. Each case renames one name in memory so
 * that its section takes the libyaml path, and expects the all-plain
 * emission (the direct path) with that name's every occurrence replaced by
 * its hand-written YAML spelling. Also: empty sections ("key: []") and a
 * write error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_passes.h"
#include "sched_test.h"

static mf_schedule *sched; /* 2x2 mesh, units u0..u2, one axis op per bucket */
static char *plain;        /* its emission: every name plain */
static size_t plain_len;

static int setup(void **state)
{
    (void)state;
    char *spec = st_mode_spec("dp_outer = 2, dp_inner = 2", "RF", "PF", "FF", 3, 2, "", false);
    char *diag = NULL;
    sched = spec ? st_compile("emit.mfsdp", spec, true, &diag) : NULL;
    if (!sched && diag)
        fprintf(stderr, "%s", diag);
    free(diag);
    free(spec);
    plain = sched ? st_emit(sched, &plain_len) : NULL;
    return plain ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    free(plain);
    mf_schedule_free(sched);
    return 0;
}

/* text with every occurrence of `from` replaced by `to`; *count the number
 * replaced. Owned. */
static char *replace_all(const char *text, const char *from, const char *to, int *count)
{
    size_t fl = strlen(from), tl = strlen(to), n = 0;
    for (const char *p = strstr(text, from); p; p = strstr(p + fl, from))
        n++;
    char *out = malloc(strlen(text) + n * (tl > fl ? tl - fl : 0) + 1), *o = out;
    assert_non_null(out);
    const char *p = text;
    for (const char *q = strstr(p, from); q; q = strstr(p, from)) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, to, tl);
        o += tl;
        p = q + fl;
    }
    strcpy(o, p);
    *count = (int)n;
    return out;
}

/* Emits sched and compares with `expected`. */
static void expect_emission(const char *expected)
{
    size_t len;
    char *got = st_emit(sched, &len);
    assert_non_null(got);
    if (strcmp(got, expected) != 0) {
        /* print the first differing line */
        size_t i = 0, line = 1;
        while (got[i] && got[i] == expected[i])
            line += got[i++] == '\n';
        fprintf(stderr, "first difference at line %zu\n", line);
    }
    assert_string_equal(got, expected);
    free(got);
}

/* Renames `*slot` (old) to `name` for one emission; the expected text is the
 * plain emission with old, wherever it stands between the prefix and suffix
 * of a pair of ctx (NULL-terminated), spelled `yaml`; min: the fewest
 * replacements that shows the section was covered. */
static void check_rename(const char **slot, const char *name, const char *yaml, const char *const *ctx, int min)
{
    const char *old = *slot;
    char *expected = strdup(plain);
    int total = 0;
    assert_non_null(expected);
    for (int k = 0; ctx[k]; k += 2) {
        /* ctx: pairs of (prefix, suffix) around the name */
        char from[256], to[256];
        int n;
        snprintf(from, sizeof from, "%s%s%s", ctx[k], old, ctx[k + 1]);
        snprintf(to, sizeof to, "%s%s%s", ctx[k], yaml, ctx[k + 1]);
        char *next = replace_all(expected, from, to, &n);
        free(expected);
        expected = next;
        total += n;
    }
    assert_true(total >= min);
    *slot = name;
    expect_emission(expected);
    *slot = old;
    free(expected);
}

/* A unit name that needs double quotes: the ops (which print units) go
 * through libyaml, the buffers stay direct. */
static void test_unit_quoted(void **state)
{
    (void)state;
    static const char *const ctx[] = {"{name: ", ", ", "unit: ", "\n", "unit: ", ",", NULL};
    int u = st_unit(sched, "u1");
    assert_true(u >= 0);
    check_rename(&sched->units[u].name, "1st", "\"1st\"", ctx, 10);
    check_rename(&sched->units[u].name, "on", "\"on\"", ctx, 10);
}

/* A buffer name libyaml writes plain although the rule does not call it
 * plain (a space): both sections take libyaml's path. */
static void test_buffer_space(void **state)
{
    (void)state;
    static const char *const ctx[] = {"{name: ", ",", "src: ", ",", "dst: ", "}", NULL};
    int b = st_buffer(sched, "u1/L.weight");
    assert_true(b >= 0);
    check_rename(&sched->buffers[b].name, "w x", "w x", ctx, 3);
    check_rename(&sched->buffers[b].name, "2w", "\"2w\"", ctx, 3);
    check_rename(&sched->buffers[b].name, "w: x", "'w: x'", ctx, 3);
}

/* A bucket and an axis named to need quotes. */
static void test_bucket_axis_quoted(void **state)
{
    (void)state;
    static const char *const bctx[] = {"- name: ", "\n", "bucket: ", ",", "buckets: [", "]", NULL};
    int b = st_bucket(sched, "u0/L");
    assert_true(b >= 0);
    check_rename(&sched->buckets[b].name, "0/L", "\"0/L\"", bctx, 8);
    /* planner/passes/mf_emit.c writes every mapping key plain, the summary's
     * per-axis keys included: spell those first, then the quoted values. */
    int n1;
    char *keys = replace_all(plain, ", dp_inner: ", ", yes: ", &n1);
    char *saved = plain;
    plain = keys;
    static const char *const actx[] = {"{name: ", ",", "axis: ", ",", NULL};
    check_rename(&sched->mesh.axes[1].name, "yes", "\"yes\"", actx, 5);
    plain = saved;
    free(keys);
    assert_true(n1 >= 2);
}

/* No ops, then no buffers either: the sections read `key: []`. */
static void test_empty_sections(void **state)
{
    (void)state;
    int nops = sched->nops, nbuf = sched->nbuffers;
    sched->nops = 0;
    size_t len;
    char *got = st_emit(sched, &len);
    assert_non_null(strstr(got, "\nevents: "));
    assert_non_null(strstr(got, "\nops: []\nsummary:\n"));
    assert_null(strstr(got, "\n- {id: "));
    free(got);
    sched->nbuffers = 0;
    got = st_emit(sched, &len);
    assert_non_null(strstr(got, "\nbuffers: []\narena: {"));
    assert_null(strstr(got, "\n- {name: u0/L.weight"));
    free(got);
    sched->nops = nops;
    sched->nbuffers = nbuf;
}

/* A write that fails is reported, on either path. */
static void test_write_error(void **state)
{
    (void)state;
    FILE *f = fopen("/dev/full", "w");
    if (!f)
        skip();
    setvbuf(f, NULL, _IONBF, 0);
    assert_int_not_equal(mf_emit_yaml(sched, f), 0);
    const char *old = sched->units[0].name;
    sched->units[0].name = "1st";
    assert_int_not_equal(mf_emit_yaml(sched, f), 0);
    sched->units[0].name = old;
    fclose(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unit_quoted),
        cmocka_unit_test(test_buffer_space),
        cmocka_unit_test(test_bucket_axis_quoted),
        cmocka_unit_test(test_empty_sections),
        cmocka_unit_test(test_write_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
