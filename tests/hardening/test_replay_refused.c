/*
 * Schedules the verifier refuses never replay as "verified" (issue 25, D5:
 * a schedule with one `record` deleted loaded, and mfsdp-replay called it
 * verified 2 runs in 5). A spec is compiled in-process; mutants are made by
 * deleting one record or one wait op (the later op ids renumbered, so the
 * file still loads) or by pointing a wait at another event. Each mutant that
 * loads and that the verifier (mf_verify_run) refuses is replayed by the
 * mfsdp-replay binary on the local backend, twice: it must exit non-zero
 * and never print "verified" (the runtime verifies on load and refuses it).
 * Mutants the loader refuses, or the verifier accepts, are counted only.
 *
 *   test_replay_refused MFSDP_REPLAY SPEC.mfsdp
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "mf_load.h"
#include "mf_passes.h"
#include "mf_pipeline.h"

#define MAX_LINES 8192
#define MUTANTS_PER_KIND 6

static const char *replay_bin, *spec_path;

typedef struct lines {
    char *text;             /* the schedule, owned; split in place */
    char *line[MAX_LINES];
    int n;
} lines;

static void split(lines *l, char *text)
{
    l->text = text;
    l->n = 0;
    for (char *p = text; *p && l->n < MAX_LINES; l->n++) {
        l->line[l->n] = p;
        char *nl = strchr(p, '\n');
        if (!nl)
            break;
        *nl = '\0';
        p = nl + 1;
    }
}

/* The op id of an op line ("- {id: N, ..."), or -1. */
static int op_id(const char *line)
{
    int id;
    return sscanf(line, "- {id: %d,", &id) == 1 ? id : -1;
}

/* The schedule without line `drop` (-1: none), op ids after it renumbered;
 * line `edit` replaced by `with` when edit >= 0. Owned. */
static char *join(const lines *l, int drop, int edit, const char *with)
{
    size_t cap = 1;
    for (int i = 0; i < l->n; i++)
        cap += strlen(l->line[i]) + 2 + (i == edit ? strlen(with) : 0);
    char *out = malloc(cap), *o = out;
    assert_non_null(out);
    bool after = false;
    for (int i = 0; i < l->n; i++) {
        if (i == drop) {
            after = true;
            continue;
        }
        const char *src = i == edit ? with : l->line[i];
        int id = op_id(src);
        if (after && id > 0) {
            const char *rest = strchr(src, ',');
            o += sprintf(o, "- {id: %d%s\n", id - 1, rest);
        } else {
            o += sprintf(o, "%s\n", src);
        }
    }
    *o = '\0';
    return out;
}

typedef struct tally {
    int tried, load_refused, verifier_accepted, replayed;
} tally;

/* Runs mfsdp-replay on path; returns its exit status (-1: killed), stdout in out. */
static int run_replay(const char *path, char *out, size_t cap)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --steps 2 --timeout-ms 5000 2>&1", replay_bin, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void try_mutant(char *text, const char *what, tally *t)
{
    t->tried++;
    char err[1024];
    mf_schedule *s = mf_load_schedule_buffer("mutant.yaml", text, strlen(text), err, sizeof err);
    if (!s) {
        t->load_refused++;
        free(text);
        return;
    }
    char *diag = NULL;
    size_t dlen = 0;
    FILE *df = open_memstream(&diag, &dlen);
    assert_non_null(df);
    mf_source src = {.path = "mutant.yaml", .text = "", .len = 0};
    mf_diag d;
    mf_diag_init(&d, &src, df);
    int nerr = mf_verify_run(s, &d);
    fclose(df);
    mf_schedule_free(s);
    if (nerr == 0) {
        t->verifier_accepted++;
        free(diag);
        free(text);
        return;
    }
    char path[] = "/tmp/mfsdp-refused-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    t->replayed++;
    for (int run = 0; run < 2; run++) {
        static char out[1 << 16];
        int rc = run_replay(path, out, sizeof out);
        bool said_verified = strstr(out, "\nverified:") || strncmp(out, "verified:", 9) == 0;
        if (rc == 0 || said_verified) {
            unlink(path);
            fail_msg("%s: the verifier refuses it (%.200s) but mfsdp-replay exited %d%s:\n%.600s", what,
                     diag, rc, said_verified ? " saying verified" : "", out);
        }
        /* The refusal names the file loaded, not the spec of its source:
         * key, and advises no `mfsdpc check` (which reads specs only). */
        char named[300];
        snprintf(named, sizeof named, "%s: error: ", path);
        if (!strstr(out, named) || strstr(out, "mfsdpc check") || strstr(out, spec_path)) {
            unlink(path);
            fail_msg("%s: the refusal must name %s and neither the spec nor mfsdpc check:\n%.600s", what,
                     path, out);
        }
    }
    unlink(path);
    free(diag);
    free(text);
}

/* Every k-th op line of a kind (op: record / op: wait), up to MUTANTS_PER_KIND. */
static void pick(const lines *l, const char *kind, int *at, int *n)
{
    int total = 0;
    for (int i = 0; i < l->n; i++)
        total += op_id(l->line[i]) >= 0 && strstr(l->line[i], kind) != NULL;
    int step = total / MUTANTS_PER_KIND > 0 ? total / MUTANTS_PER_KIND : 1, seen = 0;
    *n = 0;
    for (int i = 0; i < l->n && *n < MUTANTS_PER_KIND; i++)
        if (op_id(l->line[i]) >= 0 && strstr(l->line[i], kind) && seen++ % step == 0)
            at[(*n)++] = i;
}

static void test_refused_never_verified(void **state)
{
    (void)state;
    mf_compile_options opt = {.stop_after = MF_STAGE_VERIFY, .verify = true};
    mf_compilation c;
    assert_int_equal(mf_pipeline_compile_file(spec_path, &opt, &c), 0);
    char *yaml = NULL;
    size_t ylen = 0;
    FILE *f = open_memstream(&yaml, &ylen);
    assert_non_null(f);
    assert_int_equal(mf_emit_yaml(c.plan->sched, f), 0);
    fclose(f);
    mf_compilation_free(&c);
    lines l;
    split(&l, yaml);

    /* the unmutated schedule replays and verifies: the tool's verdict is real */
    char base_path[] = "/tmp/mfsdp-refused-base-XXXXXX";
    int fd = mkstemp(base_path);
    assert_true(fd >= 0);
    char *whole = join(&l, -1, -1, NULL);
    assert_int_equal(write(fd, whole, strlen(whole)), (ssize_t)strlen(whole));
    close(fd);
    free(whole);
    static char out[1 << 16];
    int rc = run_replay(base_path, out, sizeof out);
    unlink(base_path);
    if (rc != 0 || !strstr(out, "verified:"))
        fail_msg("the unmutated schedule does not verify (exit %d):\n%.600s", rc, out);

    tally t = {0};
    int at[MUTANTS_PER_KIND], n;
    char what[160];
    pick(&l, "op: record,", at, &n);
    for (int k = 0; k < n; k++) {
        snprintf(what, sizeof what, "record op deleted (line %d)", at[k] + 1);
        try_mutant(join(&l, at[k], -1, NULL), what, &t);
    }
    pick(&l, "op: wait,", at, &n);
    for (int k = 0; k < n; k++) {
        snprintf(what, sizeof what, "wait op deleted (line %d)", at[k] + 1);
        try_mutant(join(&l, at[k], -1, NULL), what, &t);
    }
    /* a wait on another event: the one recorded just before its own */
    for (int k = 0; k < n; k++) {
        const char *ln = l.line[at[k]], *ev = strstr(ln, "event: ");
        int e = ev ? atoi(ev + 7) : -1;
        if (e < 1)
            continue;
        char edited[1024];
        snprintf(edited, sizeof edited, "%.*sevent: %d}", (int)(ev - ln), ln, e - 1);
        snprintf(what, sizeof what, "wait on event %d instead of %d (line %d)", e - 1, e, at[k] + 1);
        try_mutant(join(&l, -1, at[k], edited), what, &t);
    }
    printf("mutants: %d tried, %d refused at load, %d accepted by the verifier, %d refused by the "
           "verifier and replayed twice each: none said verified, every run exited non-zero\n",
           t.tried, t.load_refused, t.verifier_accepted, t.replayed);
    /* the test is about the refused ones: there must be enough of them */
    assert_true(t.replayed >= MUTANTS_PER_KIND);
    free(yaml);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_replay_refused MFSDP_REPLAY SPEC.mfsdp\n");
        return 2;
    }
    replay_bin = argv[1];
    spec_path = argv[2];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_refused_never_verified)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
