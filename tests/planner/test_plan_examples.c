/*
 * The example specs (the .mfsdp files in schedules/) through the whole front end
 * (mf_pipeline_compile_buffer up to the transitions): every one plans, its layout
 * keeps the docs/semantics.md §3 invariants, and every transition of every bucket small
 * enough to simulate produces the contents its placements promise. The
 * explain listing renders for each.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_explain.h"
#include "mf_pipeline.h"
#include "plan_testlib.h"

static const char *dir;
static char *names[64];
static int nnames;

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int compile(const char *name, mf_compilation *c, char **diag)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len = 0;
    FILE *f = open_memstream(diag, &len);
    mf_compile_options opt = {.stop_after = MF_STAGE_TRANSITIONS, .diag_out = f};
    int rc = mf_pipeline_compile_file(path, &opt, c);
    fclose(f);
    return rc;
}

static void test_examples(void **state)
{
    (void)state;
    assert_true(nnames >= 5);
    for (int i = 0; i < nnames; i++) {
        mf_compilation c;
        char *diag = NULL;
        int rc = compile(names[i], &c, &diag);
        if (rc != 0)
            fail_msg("%s: exit %d:\n%s", names[i], rc, diag);
        print_message("%s: %d units, %d buckets\n", names[i], c.plan->sched->nunits, c.plan->sched->nbuckets);
        tl_check_plan(c.plan, 3000000);
        FILE *null = fopen("/dev/null", "w");
        assert_non_null(null);
        assert_int_equal(mf_explain_text(c.plan, null), 0);
        assert_int_equal(mf_explain_yaml(c.plan, null), 0);
        fclose(null);
        free(diag);
        mf_compilation_free(&c);
    }
}

int main(int argc, char **argv)
{
    dir = argc > 1 ? argv[1] : "schedules";
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "cannot open %s\n", dir);
        return 1;
    }
    struct dirent *e;
    while ((e = readdir(d)) && nnames < 64) {
        size_t n = strlen(e->d_name);
        if (n > 6 && strcmp(e->d_name + n - 6, ".mfsdp") == 0)
            names[nnames++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)nnames, sizeof names[0], by_name);
    if (nnames == 0) {
        fprintf(stderr, "no .mfsdp specs in %s\n", dir);
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_examples)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < nnames; i++)
        free(names[i]);
    return rc;
}
