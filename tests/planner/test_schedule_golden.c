/*
 * Golden schedules: every schedules/NAME.mfsdp compiles, verifies, and gives
 * exactly the bytes of schedules/NAME.yaml; every golden loads, verifies and
 * round-trips byte for byte. Runs in the source tree (WORKING_DIRECTORY), so
 * the schedules record `source: schedules/NAME.mfsdp`.
 *
 * After an intended compiler change, regenerate and review the diff:
 *   MFSDP_UPDATE_GOLDEN=1 ctest --test-dir build -R test_schedule_golden
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sched_test.h"

#define MAX_SPECS 64

static int list(const char *suffix, char names[][128])
{
    DIR *d = opendir("schedules");
    if (!d)
        return -1;
    int n = 0;
    size_t sl = strlen(suffix);
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < MAX_SPECS) {
        size_t l = strlen(e->d_name);
        if (l > sl && l - sl < 128 && strcmp(e->d_name + l - sl, suffix) == 0) {
            memcpy(names[n], e->d_name, l - sl);
            names[n][l - sl] = '\0';
            n++;
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    return n;
}

static int write_text(FILE *out, const void *ctx)
{
    const char *t = ctx;
    return fwrite(t, 1, strlen(t), out) == strlen(t) ? 0 : -1;
}

/* The first line where a and b differ, for the failure message. */
static void first_difference(const char *a, const char *b, char *buf, size_t size)
{
    int line = 1;
    const char *la = a, *lb = b;
    while (*a && *a == *b) {
        if (*a == '\n') {
            line++;
            la = a + 1;
            lb = b + 1;
        }
        a++;
        b++;
    }
    int na = (int)strcspn(la, "\n"), nb = (int)strcspn(lb, "\n");
    snprintf(buf, size, "line %d:\n  golden:   %.*s\n  compiled: %.*s", line, na > 300 ? 300 : na, la,
             nb > 300 ? 300 : nb, lb);
}

static void test_specs_match_goldens(void **state)
{
    (void)state;
    static char specs[MAX_SPECS][128];
    int n = list(".mfsdp", specs);
    assert_true(n >= 9); /* every mode of docs/semantics.md §4.5 at least */
    bool update = getenv("MFSDP_UPDATE_GOLDEN") && strcmp(getenv("MFSDP_UPDATE_GOLDEN"), "1") == 0;
    int failures = 0;
    for (int i = 0; i < n; i++) {
        char spec[256], golden[256];
        snprintf(spec, sizeof spec, "schedules/%.127s.mfsdp", specs[i]);
        snprintf(golden, sizeof golden, "schedules/%.127s.yaml", specs[i]);
        mf_compile_options opt = {.stop_after = MF_STAGE_VERIFY, .verify = true};
        mf_compilation c;
        int rc = mf_pipeline_compile_file(spec, &opt, &c);
        if (rc != 0) {
            fprintf(stderr, "%s: does not compile and verify (rc %d)\n", spec, rc);
            failures++;
            mf_compilation_free(&c);
            continue;
        }
        char *yaml = st_emit(c.plan->sched, NULL);
        mf_compilation_free(&c);
        assert_non_null(yaml);
        if (update) {
            if (mf_pipeline_write_file_atomic(golden, spec, write_text, yaml) != 0)
                failures++;
            free(yaml);
            continue;
        }
        size_t len = 0;
        char *want = st_read(golden, &len);
        if (!want) {
            fprintf(stderr, "%s: no golden schedule %s; run MFSDP_UPDATE_GOLDEN=1 ctest -R test_schedule_golden\n", spec,
                    golden);
            failures++;
        } else if (strcmp(want, yaml) != 0) {
            char where[800];
            first_difference(want, yaml, where, sizeof where);
            fprintf(stderr, "%s: the compiled schedule differs from %s at %s\n(if intended: MFSDP_UPDATE_GOLDEN=1 "
                            "ctest -R test_schedule_golden, and review the diff)\n", spec, golden, where);
            failures++;
        }
        free(want);
        free(yaml);
    }
    assert_int_equal(failures, 0);
}

static void test_goldens_roundtrip(void **state)
{
    (void)state;
    static char yamls[MAX_SPECS][128], specs[MAX_SPECS][128];
    int n = list(".yaml", yamls), ns = list(".mfsdp", specs);
    assert_true(n >= 9);
    for (int i = 0; i < n; i++) {
        bool has_spec = false;
        for (int j = 0; j < ns; j++)
            has_spec = has_spec || strcmp(yamls[i], specs[j]) == 0;
        if (!has_spec)
            fail_msg("schedules/%s.yaml has no spec schedules/%s.mfsdp (stale golden)", yamls[i], yamls[i]);
        char path[256], err[1024];
        snprintf(path, sizeof path, "schedules/%.127s.yaml", yamls[i]);
        size_t len = 0;
        char *text = st_read(path, &len);
        assert_non_null(text);
        mf_schedule *s = mf_load_schedule_buffer(path, text, len, err, sizeof err);
        if (!s)
            fail_msg("%s", err);
        char *diag = NULL;
        if (st_verify(s, &diag) != 0)
            fail_msg("%s does not verify:\n%s", path, diag);
        free(diag);
        size_t elen = 0;
        char *again = st_emit(s, &elen);
        assert_int_equal(elen, len);
        assert_memory_equal(again, text, len);
        uint8_t h[32];
        mf_sha256(text, len, h, NULL);
        assert_memory_equal(h, s->hash, 32);
        char want_source[256];
        snprintf(want_source, sizeof want_source, "schedules/%.127s.mfsdp", yamls[i]);
        assert_string_equal(s->source, want_source);
        free(again);
        free(text);
        mf_schedule_free(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_specs_match_goldens),
        cmocka_unit_test(test_goldens_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
