/*
 * mfsdpc diff A B [cost options]
 *
 * A and B are schedules (loaded with mf_load_schedule_file) or specs
 * (compiled and verified in memory). A file is a spec when its name ends in
 * .mfsdp, a schedule when it ends in .yaml or .yml; otherwise it is a
 * schedule when it starts with the `format:` key. Prints the semantic diff
 * of mf_diff.h. Exit status, like diff(1): 0 equivalent, 1 different,
 * 2 on any error (usage, unreadable or malformed input, a spec with errors).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_cli.h"
#include "mf_diff.h"
#include "mf_load.h"
#include "mf_cmd_args.h"
#include "mf_pipeline.h"

static void mf_diff_usage(FILE *out)
{
    fprintf(out,
            "usage: mfsdpc diff A B [cost options]\n"
            "\n"
            "Semantic diff of two schedules or specs (a .mfsdp spec is compiled in memory):\n"
            "per unit, collectives and local ops added (+), removed (-) or changed (~: predicate,\n"
            "stream, count, dtype, hook), matched by bucket, transition, kind and axis; then the\n"
            "totals per step before -> after: collectives by kind and axis, bytes per rank by\n"
            "axis, persistent and peak memory per rank by role.\n"
            "\n"
            "exit status: 0 equivalent, 1 different, 2 error\n");
}

typedef struct mf_diff_input {
    mf_schedule *loaded;    /* owned, when a schedule file */
    mf_compilation comp;    /* when a spec */
    bool compiled;
    const mf_schedule *s;
} mf_diff_input;

static bool mf_diff_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool mf_diff_is_schedule(const char *path)
{
    if (mf_diff_ends_with(path, ".mfsdp"))
        return false;
    if (mf_diff_ends_with(path, ".yaml") || mf_diff_ends_with(path, ".yml"))
        return true;
    size_t len = 0;
    char *text = mf_pipeline_read_file(path, &len);
    bool yes = text && strncmp(text, "format:", 7) == 0;
    free(text);
    return yes;
}

static int mf_diff_open(const char *path, char **cost_args, int ncost, mf_diff_input *in)
{
    memset(in, 0, sizeof *in);
    if (mf_diff_is_schedule(path)) {
        char err[1024];
        in->loaded = mf_load_schedule_file(path, err, sizeof err);
        if (!in->loaded) {
            fprintf(stderr, "%s\n", err);
            return 2;
        }
        in->s = in->loaded;
        return 0;
    }
    mf_compile_options opt = {.stop_after = MF_STAGE_VERIFY, .verify = true, .ncost_args = ncost,
                              .cost_args = cost_args};
    in->compiled = true;
    int rc = mf_pipeline_compile_file(path, &opt, &in->comp);
    if (rc != 0 || !in->comp.plan || !in->comp.plan->sched)
        return 2;
    in->s = in->comp.plan->sched;
    return 0;
}

static void mf_diff_close(mf_diff_input *in)
{
    mf_schedule_free(in->loaded);
    if (in->compiled)
        mf_compilation_free(&in->comp);
}

/* Parses argv into a and paths[2]. 0, 1 after --help, 2 after a reported
 * error (the usage follows). */
static int mf_diff_parse(int argc, char **argv, mf_cmd_args *a, const char *paths[2])
{
    static const mf_opt opts[] = {{"--help", "-h", NULL, 0}};
    mf_opts p;
    mf_opts_init(&p, a->cmd, argc, argv, opts, 1, mf_cost_is_option);
    int id, npaths = 0, rc = 0;
    const char *v;
    while (rc == 0 && (id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == 0)
            return 1;
        if (id == MF_OPTS_OPERAND && npaths == 2) {
            fprintf(stderr, "mfsdpc diff: error: expected two files, got a third: '%s'\n", v);
            rc = 2;
        } else if (id == MF_OPTS_OPERAND) {
            paths[npaths++] = v;
        } else {
            rc = mf_cmd_args_take(a, &p, id, v);
        }
    }
    if (rc == 0 && npaths != 2) {
        fprintf(stderr, "mfsdpc diff: error: expected two files (schedules or specs)\n");
        rc = 2;
    }
    return rc;
}

int mf_cmd_diff(int argc, char **argv)
{
    const char *paths[2] = {NULL, NULL};
    mf_cmd_args a;
    int rc = mf_cmd_args_init(&a, "mfsdpc diff", argc);
    if (rc != 0)
        return rc;
    if ((rc = mf_diff_parse(argc, argv, &a, paths)) != 0)
        return mf_cmd_args_stop(&a, rc, mf_diff_usage);
    mf_diff_input in[2];
    rc = mf_diff_open(paths[0], a.cost_args, a.ncost, &in[0]);
    if (rc == 0) {
        rc = mf_diff_open(paths[1], a.cost_args, a.ncost, &in[1]);
        if (rc == 0) {
            rc = mf_diff_schedules(in[0].s, paths[0], in[1].s, paths[1], stdout);
            if (rc < 0) {
                fprintf(stderr, "mfsdpc diff: error: out of memory\n");
                rc = 2;
            } else if (fflush(stdout) != 0) {
                fprintf(stderr, "mfsdpc diff: error: cannot write the report\n");
                rc = 2;
            }
        }
        mf_diff_close(&in[1]);
    }
    mf_diff_close(&in[0]);
    mf_cmd_args_free(&a);
    return rc;
}
