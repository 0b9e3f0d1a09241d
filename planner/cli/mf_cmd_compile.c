/*
 * mfsdpc compile SPEC -o OUT.yaml [--no-verify] [cost options]
 *
 * Runs the whole pipeline (mf_pipeline_compile_file up to MF_STAGE_VERIFY) and writes
 * the canonical schedule (mf_emit_yaml). The file is written to a temporary
 * next to OUT and renamed (mf_outputs.h): on any error or SIGINT/SIGTERM
 * nothing is written, no temporary is left and an existing OUT is
 * untouched; OUT may not be the spec itself.
 * `-o -` writes the schedule to stdout.
 *
 * Exit status: 0 success, 1 errors in the spec or a schedule the verifier
 * rejects (diagnostics on stderr), 2 usage errors, unreadable input,
 * malformed cost options, write errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_cli.h"
#include "mf_cmd_args.h"
#include "mf_outputs.h"
#include "mf_pipeline.h"

static void mf_compile_usage(FILE *out)
{
    fprintf(out,
            "usage: mfsdpc compile SPEC -o OUT.yaml [--no-verify] [cost options]\n"
            "\n"
            "Compiles a .mfsdp spec into its verified static schedule (docs/schedule.md)\n"
            "and writes it as canonical YAML: byte-identical for the same input.\n"
            "\n"
            "  -o OUT.yaml, --output=OUT.yaml   where to write it ('-' for stdout); written\n"
            "                         to a temporary file and renamed, never over SPEC\n"
            "  --no-verify            skip the schedule verifier (docs/schedule.md §5)\n"
            "  --inner-bw=GBPS, --outer-bw=GBPS, --inner-lat=US, --outer-lat=US,\n"
            "  --axis-bw=NAME:GBPS, --axis-lat=NAME:US, --launch-lat=US, --local-bw=GBPS\n"
            "                         cost model used to choose between legal compositions\n"
            "\n"
            "exit status: 0 success, 1 error in the spec, 2 usage or I/O error\n");
}

static int mf_compile_write(FILE *out, const void *ctx)
{
    return mf_emit_yaml(ctx, out);
}

/* Parses argv into a, out and verify. 0, 1 after --help, 2 after a
 * reported error (the usage follows). */
static int mf_compile_parse(int argc, char **argv, mf_cmd_args *a, const char **out, bool *verify)
{
    enum { OPT_HELP, OPT_OUTPUT, OPT_NO_VERIFY };
    static const mf_opt opts[] = {{"--help", "-h", NULL, OPT_HELP},
                                  {"--output", "-o", "a file name", OPT_OUTPUT},
                                  {"--no-verify", NULL, NULL, OPT_NO_VERIFY}};
    mf_opts p;
    mf_opts_init(&p, a->cmd, argc, argv, opts, 3, mf_cost_is_option);
    int id, rc = 0;
    const char *v;
    while (rc == 0 && (id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == OPT_HELP)
            return 1;
        if (id == OPT_OUTPUT && *out) {
            fprintf(stderr, "mfsdpc compile: error: more than one output file\n");
            rc = 2;
        }
        if (id == OPT_OUTPUT)
            *out = v;
        else if (id == OPT_NO_VERIFY)
            *verify = false;
        else
            rc = mf_cmd_args_take(a, &p, id, v);
    }
    if (rc == 0)
        rc = mf_cmd_args_need_input(a);
    if (rc == 0 && (!*out || !(*out)[0])) {
        fprintf(stderr, "mfsdpc compile: error: no output file given (-o OUT.yaml, or -o - for stdout)\n");
        rc = 2;
    }
    return rc;
}

int mf_cmd_compile(int argc, char **argv)
{
    const char *out = NULL;
    bool verify = true;
    mf_cmd_args a;
    int rc = mf_cmd_args_init(&a, "mfsdpc compile", argc);
    if (rc != 0)
        return rc;
    rc = mf_compile_parse(argc, argv, &a, &out, &verify);
    if (rc != 0)
        return mf_cmd_args_stop(&a, rc, mf_compile_usage);
    const char *spec = a.input;
    mf_compile_options opt = {
        .stop_after = MF_STAGE_VERIFY,
        .verify = verify,
        .ncost_args = a.ncost,
        .cost_args = a.cost_args,
    };
    mf_compilation c;
    rc = mf_pipeline_compile_file(spec, &opt, &c);
    if (rc == 0 && (!c.plan || !c.plan->sched)) {
        fprintf(stderr, "mfsdpc compile: error: internal error: no schedule was produced\n");
        rc = 2;
    }
    if (rc == 0) {
        const mf_schedule *s = c.plan->sched;
        if (strcmp(out, "-") == 0) {
            if (mf_emit_yaml(s, stdout) != 0 || fflush(stdout) != 0) {
                fprintf(stderr, "mfsdpc compile: error: cannot write the schedule to stdout\n");
                rc = 2;
            }
        } else {
            mf_outputs os;
            mf_outputs_begin(&os, spec);
            int wrote = mf_outputs_add(&os, out, mf_compile_write, s);
            if (mf_outputs_commit(&os) != 0 || wrote != 0)
                rc = 2;
        }
    }
    mf_compilation_free(&c);
    mf_cmd_args_free(&a);
    return rc;
}
