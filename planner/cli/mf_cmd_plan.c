/*
 * mf_cmd_plan: `mfsdpc plan SPEC --memory SIZE [options]` (docs/plan.md).
 *
 * Reads a spec whose units may say `layout auto`, searches the layouts,
 * reshard_after_forward, prefetch depth and bucket_size (mf_plan_search.c),
 * prints the Pareto front of peak memory per rank against simulated step
 * time, and writes the chosen spec (mf_plan_write.c) with -o and the front's
 * picture with --svg, both or neither (mf_outputs.h: a command that exits
 * non-zero, or gets SIGINT/SIGTERM, writes nothing). The figures
 * printed for the chosen spec are recomputed from the written text through
 * the same passes `explain` and `simulate` run, and must equal the search's.
 *
 * Exit status: 0 a plan fits; 1 the spec has errors or nothing fits the
 * budget (the message names the smallest peak reachable and what dominates
 * it); 2 usage errors, unreadable input, unwritable output.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_cli.h"
#include "mf_cmd_args.h"
#include "mf_outputs.h"
#include "mf_pipeline.h"
#include "mf_plan_report.h"
#include "mf_plan_search.h"
#include "mf_plan_write.h"

#define CMD "mfsdpc plan"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: mfsdpc plan SPEC.mfsdp --memory SIZE [options]\n"
            "\n"
            "Chooses, for every unit declared 'layout auto', a built-in layout and\n"
            "reshard_after_forward, and the prefetch depth and bucket_size unless the spec\n"
            "sets them; prints the Pareto front of peak memory per rank against simulated\n"
            "step time and picks the fastest plan whose peak fits SIZE (docs/plan.md).\n"
            "\n"
            "  --memory SIZE             budget per rank, e.g. 80GiB (required)\n"
            "  -o FILE.mfsdp             write the chosen spec\n"
            "  --svg FILE.svg            draw the front (memory vs step time)\n"
            "  --optimizer NAME          adamw (default) or muon: muon also searches the Whole\n"
            "                            layouts and adds its Newton-Schulz step to the step time\n"
            "  --optimizer-tflops X      muon's Newton-Schulz rate per rank (default: --tflops's)\n"
            "  --muon-all                muon on every 2-D tensor (default: the recipe's hidden\n"
            "                            matrices, the embedding and the head to AdamW)\n"
            "  --optimizer-bytes N       optimizer state per main_weight element (default 8;\n"
            "                            4 with muon: one fp32 momentum)\n"
            "  --explain-choice          say why each unit got its layout\n"
            "  --exhaustive              simulate every candidate (slow; for tests)\n"
            "compute and link model, exactly as 'mfsdpc simulate' takes them:\n"
            "  --tokens N --tflops X --unit-time-us U --host-async\n"
            "  --inner-bw=GBPS --outer-bw=GBPS --inner-lat=US --outer-lat=US\n"
            "  --axis-bw=NAME:GBPS --axis-lat=NAME:US --local-bw=GBPS --launch-lat=US\n"
            "\n"
            "exit status: 0 a plan fits, 1 errors in the spec or nothing fits, 2 usage error\n");
}

typedef struct plan_args {
    mf_cmd_args ca;         /* the spec, the compute and link model */
    const char *out, *svg;
    int64_t budget, optb;
    bool have_budget, have_optb, explain_choice, exhaustive, muon, muon_all;
    double opt_tflops;      /* 0: the compute model's rate */
} plan_args;

/* --optimizer adamw|muon; 2 (reported) otherwise. */
static int parse_optimizer(const char *v, bool *muon)
{
    if (v && (strcmp(v, "adamw") == 0 || strcmp(v, "muon") == 0)) {
        *muon = v[0] == 'm';
        return 0;
    }
    fprintf(stderr, CMD ": error: --optimizer takes adamw or muon, got '%s'\n", v ? v : "");
    return 2;
}

/* --optimizer-tflops X, X > 0; 2 (reported) otherwise. */
static int parse_tflops(const char *v, double *out)
{
    char *end = NULL;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end != '\0' || errno != 0 || !isfinite(x) || !(x > 0)) {
        fprintf(stderr, CMD ": error: --optimizer-tflops needs a positive number, got '%s'\n", v ? v : "");
        return 2;
    }
    *out = x;
    return 0;
}

/* The options one by one; 1 after --help (printed), 2 after a reported error. */
static int parse_options(int argc, char **argv, plan_args *a)
{
    enum { O_MEM, O_OUT, O_OPTB, O_EXPL, O_EXH, O_HELP, O_SVG, O_OPT, O_OPTF, O_MALL };
    static const mf_opt opts[] = {
        {"--memory", NULL, "a size (e.g. 80GiB)", O_MEM}, {"--output", "-o", "a file name", O_OUT},
        {"--optimizer-bytes", NULL, "a value (bytes per parameter)", O_OPTB},
        {"--optimizer", NULL, "adamw or muon", O_OPT}, {"--optimizer-tflops", NULL, "a rate in TFLOP/s", O_OPTF},
        {"--muon-all", NULL, NULL, O_MALL}, {"--explain-choice", NULL, NULL, O_EXPL},
        {"--exhaustive", NULL, NULL, O_EXH},
        MF_SIM_OPTS, {"--help", "-h", NULL, O_HELP}, {"--svg", NULL, "a file name", O_SVG}};
    mf_opts p;
    mf_opts_init(&p, CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), mf_cost_is_option);
    int id;
    const char *v;
    while ((id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        int bad = 0;
        switch (id) {
        case O_MEM: bad = mf_plan_mem_parse_size(CMD, "--memory", v, &a->budget); a->have_budget = true; break;
        case O_OUT: a->out = v; break;
        case O_SVG: a->svg = v; break;
        case O_OPTB: bad = mf_plan_mem_parse_optimizer_bytes(CMD, v, &a->optb); a->have_optb = true; break;
        case O_OPT: bad = parse_optimizer(v, &a->muon); break;
        case O_OPTF: bad = parse_tflops(v, &a->opt_tflops); break;
        case O_MALL: a->muon_all = true; break;
        case O_EXPL: a->explain_choice = true; break;
        case O_EXH: a->exhaustive = true; break;
        case O_HELP: usage(stdout); return 1;
        case MF_OPTS_UNKNOWN: usage(stderr); return 2;
        default: bad = mf_cmd_args_take(&a->ca, &p, id, v); break;
        }
        if (bad)
            return 2;
    }
    return 0;
}

/* 0 parsed, 1 --help printed, 2 usage error (reported). */
static int parse_args(int argc, char **argv, plan_args *a)
{
    int rc = parse_options(argc, argv, a);
    if (rc != 0)
        return rc;
    const char *input = a->ca.input;
    if (mf_cmd_args_need_input(&a->ca) != 0) {
        usage(stderr);
        return 2;
    }
    if (!a->have_budget) {
        fprintf(stderr, CMD ": error: --memory SIZE is required (the budget per rank, e.g. 80GiB)\n");
        return 2;
    }
    if ((a->out && strcmp(a->out, input) == 0) || (a->svg && strcmp(a->svg, input) == 0) ||
        (a->out && a->svg && strcmp(a->out, a->svg) == 0)) {
        fprintf(stderr, CMD ": error: -o and --svg must differ from each other and from the input\n");
        return 2;
    }
    return 0;
}

typedef struct svg_ctx {
    const mf_plan_search *ps;
    int64_t budget;
    const mf_ps_point *chosen;
} svg_ctx;

static int write_svg(FILE *out, const void *ctx)
{
    const svg_ctx *c = ctx;
    return mf_plan_report_front_svg(out, c->ps, c->budget, c->chosen);
}

static int write_text(FILE *out, const void *ctx)
{
    const char *t = ctx;
    return fputs(t, out) < 0 ? -1 : 0;
}

int mf_cmd_plan(int argc, char **argv)
{
    plan_args a = {.optb = MF_OPTIMIZER_BYTES_DEFAULT};
    if (mf_cmd_args_init(&a.ca, CMD, argc) != 0)
        return 2;
    mf_compilation c;
    bool have_c = false, have_ps = false, have_os = false;
    mf_plan_search ps;
    mf_outputs os;
    char *text = NULL;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0) {
        rc = rc == 1 ? 0 : 2;
        goto done;
    }
    const char *input = a.ca.input;
    mf_compile_options copt = {.stop_after = MF_STAGE_SEMA};
    rc = mf_pipeline_compile_file(input, &copt, &c);
    have_c = true;
    if (rc != 0)
        goto done;
    if (a.muon && !a.have_optb)
        a.optb = MF_OPTIMIZER_BYTES_MUON;
    if (a.muon_all && !a.muon) {
        fprintf(stderr, CMD ": error: --muon-all needs --optimizer muon\n");
        rc = 2;
        goto done;
    }
    mf_ps_options po = {.optimizer_bytes = a.optb, .exhaustive = a.exhaustive, .muon = a.muon,
                        .muon_all = a.muon_all};
    if (!mf_cmd_args_sim_config(&a.ca, &c.spec->mesh, &po.sim)) {
        rc = 2;
        goto done;
    }
    po.optimizer_flops = a.opt_tflops > 0 ? a.opt_tflops * 1e12 : po.sim.flops;
    have_ps = true;
    if (mf_plan_search_init(&ps, c.spec, c.ast, &po) != 0 || mf_plan_search_run(&ps) != 0) {
        fprintf(stderr, "%s: error: %s\n", input, ps.err);
        rc = 1;
        goto done;
    }
    const mf_ps_point *best = mf_plan_search_choose(&ps, a.budget);
    mf_plan_report_print_front(&ps, input, a.budget, best);
    svg_ctx sc = {&ps, a.budget, best};
    mf_outputs_begin(&os, input);
    have_os = true;
    if (a.svg && mf_outputs_add(&os, a.svg, write_svg, &sc) != 0) {
        rc = 2;
        goto done;
    }
    if (!best) {
        rc = mf_plan_report_infeasible(&ps, a.budget);
        goto done;
    }
    if (a.explain_choice && mf_plan_report_explain_choice(&ps, best, a.budget) != 0) {
        fprintf(stderr, "%s: error: %s\n", input, ps.err);
        rc = 1;
        goto done;
    }
    char header[256];
    snprintf(header, sizeof header, "planned by mfsdpc plan --memory %lld%s --optimizer-bytes %lld from %s",
             (long long)a.budget, a.muon ? " --optimizer muon" : "", (long long)a.optb, input);
    text = mf_plan_write_spec(&ps, c.ast, c.text, c.src.len, best, header);
    if (!text) {
        fprintf(stderr, CMD ": error: out of memory\n");
        rc = 2;
        goto done;
    }
    rc = mf_plan_report_confirm(&ps, a.out ? a.out : "<chosen>", text, best);
    if (rc == 0 && a.out && mf_outputs_add(&os, a.out, write_text, text) != 0)
        rc = 2;
done:
    if (have_os && rc != 0)
        mf_outputs_discard(&os);   /* the picture and the plan, or neither */
    else if (have_os && mf_outputs_commit(&os) != 0)
        rc = 2;
    else if (have_os && a.out)
        printf("wrote %s\n", a.out);
    free(text);
    if (have_ps)
        mf_plan_search_free(&ps);
    if (have_c)
        mf_compilation_free(&c);
    mf_cmd_args_free(&a.ca);
    return rc;
}
