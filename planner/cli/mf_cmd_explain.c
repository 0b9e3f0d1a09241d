/*
 * mfsdpc explain SPEC [--format text|yaml] [cost options]
 *
 * Runs the pipeline up to lowering and the buffer assignment (mf_pipeline_compile_file
 * with stop_after = MF_STAGE_LOWER) and prints the plan (mf_explain.h) on stdout.
 * Exit status: 0 success, 1 errors in the spec (diagnostics on stderr),
 * 2 usage errors, unreadable files, malformed cost options, write errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_cli.h"
#include "mf_explain.h"
#include "mf_cmd_args.h"
#include "mf_pipeline.h"
#include "mf_plan_mem.h"
#include "mf_plan_stats.h"

static void explain_usage(FILE *out)
{
    fprintf(out,
            "usage: mfsdpc explain SPEC [--format text|yaml] [cost options]\n"
            "\n"
            "Prints, per unit and bucket: tensors (offset, numel), padded length and padding,\n"
            "placements and dtypes per role, the steps of T1..T4 (collective, axis, stream,\n"
            "when, count, bytes per rank) with the reason for each choice, memory per rank;\n"
            "then totals per step.\n"
            "\n"
            "  --format text|yaml     human-readable listing (default) or the same data as YAML\n"
            "  --optimizer-bytes N    optimizer state per main_weight element (default 8, Adam);\n"
            "                         the text listing ends with the peak plus it (what plan budgets)\n"
            "  --inner-bw=GBPS        bandwidth per rank of the innermost axis (default 360)\n"
            "  --outer-bw=GBPS        bandwidth per rank of every other axis (default 45)\n"
            "  --inner-lat=US         latency per ring step, innermost axis (default 2)\n"
            "  --outer-lat=US         latency per ring step, other axes (default 8)\n"
            "  --axis-bw=NAME:GBPS    bandwidth of one named axis\n"
            "  --axis-lat=NAME:US     latency of one named axis\n"
            "  --launch-lat=US        fixed cost per collective launch (default 5)\n"
            "  --local-bw=GBPS        bandwidth of local ops, bytes touched (default 3000)\n"
            "\n"
            "exit status: 0 success, 1 error in the spec, 2 usage error\n");
}

/* Parses argv into a, format and optb. 0, 1 after --help, 2 after a
 * reported error (the usage follows). */
static int explain_parse(int argc, char **argv, mf_cmd_args *a, const char **format, int64_t *optb)
{
    enum { OPT_HELP, OPT_FORMAT, OPT_OPTB };
    static const mf_opt opts[] = {{"--help", "-h", NULL, OPT_HELP},
                                  {"--format", NULL, "a value (text or yaml)", OPT_FORMAT},
                                  {"--optimizer-bytes", NULL, "a value (bytes per parameter)", OPT_OPTB}};
    mf_opts p;
    mf_opts_init(&p, a->cmd, argc, argv, opts, 3, mf_cost_is_option);
    int rc = 0, id;
    const char *v;
    while (rc == 0 && (id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == OPT_HELP)
            return 1;
        if (id == OPT_FORMAT)
            *format = v;
        else if (id == OPT_OPTB)
            rc = mf_plan_mem_parse_optimizer_bytes(a->cmd, v, optb) != 0 ? 2 : 0;
        else
            rc = mf_cmd_args_take(a, &p, id, v);
    }
    if (rc == 0 && strcmp(*format, "text") != 0 && strcmp(*format, "yaml") != 0) {
        fprintf(stderr, "mfsdpc explain: error: unknown format '%s' (expected text or yaml)\n", *format);
        rc = 2;
    }
    return rc == 0 ? mf_cmd_args_need_input(a) : rc;
}

int mf_cmd_explain(int argc, char **argv)
{
    const char *format = "text";
    int64_t optb = MF_OPTIMIZER_BYTES_DEFAULT;
    mf_cmd_args a;
    int rc = mf_cmd_args_init(&a, "mfsdpc explain", argc);
    if (rc != 0)
        return rc;
    if ((rc = explain_parse(argc, argv, &a, &format, &optb)) != 0)
        return mf_cmd_args_stop(&a, rc, explain_usage);
    const char *path = a.input;
    /* Through lowering and the buffer assignment: the allocated peak is the
     * assignment's (docs/semantics.md §10). */
    mf_compile_options opt = {.stop_after = MF_STAGE_LOWER, .ncost_args = a.ncost, .cost_args = a.cost_args};
    mf_compilation c;
    rc = mf_pipeline_compile_file(path, &opt, &c);
    if (rc == 0) {
        bool yaml = strcmp(format, "yaml") == 0;
        int w = yaml ? mf_explain_yaml(c.plan, stdout) : mf_explain_text(c.plan, stdout);
        if (w == 0 && !yaml) {
            /* the figure plan budgets: the allocated peak above plus the
             * optimizer state (docs/semantics.md §9, docs/plan.md §2) */
            mf_plan_mem mem;
            mf_plan_mem_of(c.plan->sched, optb, &mem);
            mf_plan_mem_print(stdout, &mem, optb);
        }
        if (w != 0) {
            fprintf(stderr, "mfsdpc explain: error: cannot write the listing\n");
            rc = 2;
        }
    }
    mf_compilation_free(&c);
    mf_cmd_args_free(&a);
    return rc;
}
