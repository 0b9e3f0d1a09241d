/*
 * mf_cmd_simulate: `mfsdpc simulate SPEC|SCHEDULE [options]`.
 *
 * Reads a spec (compiled and verified in memory with mf_pipeline_compile_file) or a
 * schedule file (mf_load_schedule_file), simulates one step (mf_simulate.c),
 * prints the report, and optionally writes a Chrome trace and an SVG
 * picture, both or neither (mf_outputs.h: a failure or SIGINT/SIGTERM
 * leaves every existing output untouched and no temporary). With
 * --compare-single-stream it simulates the same schedule a second time with
 * the outer stream's ops moved onto the inner stream and prints the
 * difference.
 *
 * Exit status: 0 success; 1 the input has errors (diagnostics printed);
 * 2 usage error, unreadable input or unwritable output.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_cli.h"
#include "mf_load.h"
#include "mf_cmd_args.h"
#include "mf_outputs.h"
#include "mf_pipeline.h"
#include "mf_plan_mem.h"
#include "mf_human.h"
#include "mf_plan_stats.h"
#include "mf_simulate.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: mfsdpc simulate SPEC.mfsdp|SCHEDULE.yaml [options]\n"
            "\n"
            "Simulates one training step of the schedule on three streams (compute,\n"
            "inner, outer) and prints the step time, busy and exposed time per stream,\n"
            "the overlap ratio, bytes per rank by axis and the critical path.\n"
            "\n"
            "outputs:\n"
            "  --trace FILE.json         Chrome trace JSON (open in ui.perfetto.dev)\n"
            "  --svg FILE.svg            SVG picture of the timeline\n"
            "  --svg-window FROM:TO      draw only that part of the step (milliseconds)\n"
            "  --compare-single-stream   also run with outer collectives on the inner stream\n"
            "  --full-path               print every critical-path segment (default: folded)\n"
            "memory model:\n"
            "  --optimizer-bytes N       optimizer state per main_weight element (default 8, Adam)\n"
            "compute model:\n"
            "  --tokens N                tokens per microbatch per rank (default 4096)\n"
            "  --tflops X                compute rate per rank, TFLOP/s (default 400);\n"
            "                            a unit's forward+backward takes 6*params*tokens/rate,\n"
            "                            split 1:2\n"
            "  --unit-time-us U          instead: every unit's forward takes U us, backward 2U\n"
            "  --host-async              the host runs ahead of the GPU (hooks issue at time 0);\n"
            "                            default: a hook issues when compute reaches it\n"
            "link model (alpha-beta per axis, defaults in docs/simulate.md):\n"
            "  --inner-bw=GBPS --outer-bw=GBPS --inner-lat=US --outer-lat=US\n"
            "  --axis-bw=NAME:GBPS --axis-lat=NAME:US --local-bw=GBPS --launch-lat=US\n");
}

static bool has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

typedef struct out_ctx {
    const mf_schedule *s;
    const mf_sim_result *r;
    double t0, t1;          /* SVG window, seconds; t1 <= t0 = whole step */
} out_ctx;

/* "FROM:TO" in milliseconds, 0 <= FROM < TO. */
static int parse_window(const char *v, double *t0, double *t1)
{
    char *end = NULL;
    errno = 0;
    double a = v ? strtod(v, &end) : 0;
    if (v && end != v && *end == ':' && errno == 0) {
        const char *rest = end + 1;
        double b = strtod(rest, &end);
        if (end != rest && *end == '\0' && errno == 0 && isfinite(a) && isfinite(b) && a >= 0 &&
            b > a) {
            *t0 = a * 1e-3;
            *t1 = b * 1e-3;
            return 0;
        }
    }
    fprintf(stderr, "mfsdpc simulate: error: --svg-window needs FROM:TO in milliseconds with "
                    "0 <= FROM < TO, got '%s'\n", v ? v : "");
    return -1;
}

static int write_trace(FILE *out, const void *ctx)
{
    const out_ctx *c = ctx;
    return mf_trace_write(out, c->s, c->r);
}

static int write_svg(FILE *out, const void *ctx)
{
    const out_ctx *c = ctx;
    return mf_svg_write(out, c->s, c->r, c->t0, c->t1);
}

static void print_header(const char *path, const mf_schedule *s, const mf_sim_config *cfg)
{
    printf("simulate %s: mesh", path);
    for (int j = 0; j < s->mesh.naxes; j++)
        printf("%s%s=%lld", j ? " x " : " ", s->mesh.axes[j].name, (long long)s->mesh.axes[j].size);
    printf(", %lld microbatches, %d units, %d buckets, %d ops\n", (long long)s->microbatches,
           s->nunits, s->nbuckets, s->nops);
    if (cfg->unit_time > 0)
        printf("model: compute %.3f us forward, %.3f us backward per unit and microbatch\n",
               cfg->unit_time * 1e6, 2 * cfg->unit_time * 1e6);
    else
        printf("model: compute %.1f TFLOP/s x %.0f tokens per microbatch (6 * params * tokens)\n",
               cfg->flops / 1e12, cfg->tokens);
    printf("       host %s\n", cfg->host_async ? "asynchronous (hooks issue at time 0)"
                                                : "synchronous (a hook issues when compute reaches it)");
    printf("       links:");
    for (int j = 0; j < s->mesh.naxes; j++)
        printf("%s %s %.1f GB/s %.2f us", j ? ";" : "", s->mesh.axes[j].name,
               cfg->cost.axis[j].beta / 1e9, cfg->cost.axis[j].alpha * 1e6);
    printf("; local %.1f GB/s\n\n", cfg->cost.local_bw / 1e9);
}

/* The command line of `mfsdpc simulate`. */
typedef struct sim_args {
    mf_cmd_args ca;         /* the input, the compute and link model */
    const char *trace, *svg;
    bool compare, full_path;
    double win0, win1;
    int64_t optb;           /* --optimizer-bytes */
} sim_args;

/* The options one by one. Returns -1 to go on, else the exit status (0
 * after --help, 2 after a reported error). */
static int parse_options(int argc, char **argv, sim_args *a)
{
    enum { OPT_TRACE, OPT_SVG, OPT_WINDOW, OPT_HELP, OPT_COMPARE, OPT_FULL_PATH, OPT_OPTB };
    static const mf_opt opts[] = {
        {"--trace", NULL, "a value", OPT_TRACE},          {"--svg", NULL, "a value", OPT_SVG},
        MF_SIM_OPTS,                                      {"--svg-window", NULL, "a value", OPT_WINDOW},
        {"--help", "-h", NULL, OPT_HELP},                 {"--compare-single-stream", NULL, NULL, OPT_COMPARE},
        {"--full-path", NULL, NULL, OPT_FULL_PATH},
        {"--optimizer-bytes", NULL, "a value (bytes per parameter)", OPT_OPTB}};
    mf_opts p;
    mf_opts_init(&p, a->ca.cmd, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), mf_cost_is_option);
    int id, bad = 0;
    const char *val;
    while (!bad && (id = mf_opts_next(&p, &val)) != MF_OPTS_END) {
        if (id == OPT_TRACE)
            a->trace = val;
        else if (id == OPT_SVG)
            a->svg = val;
        else if (id == OPT_WINDOW)
            bad = parse_window(val, &a->win0, &a->win1) != 0;
        else if (id == OPT_HELP) {
            usage(stdout);
            return 0;
        } else if (id == OPT_COMPARE)
            a->compare = true;
        else if (id == OPT_FULL_PATH)
            a->full_path = true;
        else if (id == OPT_OPTB)
            bad = mf_plan_mem_parse_optimizer_bytes(a->ca.cmd, val, &a->optb) != 0;
        else if (id == MF_OPTS_UNKNOWN) {
            usage(stderr); /* reported */
            return 2;
        } else if (id == MF_OPTS_OPERAND && a->ca.input) {
            fprintf(stderr, "mfsdpc simulate: error: one input expected, got '%s' and '%s'\n",
                    a->ca.input, val);
            return 2;
        } else
            bad = mf_cmd_args_take(&a->ca, &p, id, val) != 0;
    }
    return bad ? 2 : -1;
}

/* Parses argv into a (a->ca has argc slots for the link options). Returns
 * -1 to go on, else the exit status (0 after --help, 2 after a reported
 * error). */
static int parse_args(int argc, char **argv, sim_args *a)
{
    int rc = parse_options(argc, argv, a);
    if (rc >= 0)
        return rc;
    const char *input = a->ca.input;
    if (!input) {
        fprintf(stderr, "mfsdpc simulate: error: no input (a .mfsdp spec or a .yaml schedule)\n");
        usage(stderr);
        return 2;
    }
    if ((a->trace && (strcmp(a->trace, input) == 0 || (a->svg && strcmp(a->trace, a->svg) == 0))) ||
        (a->svg && strcmp(a->svg, input) == 0)) {
        fprintf(stderr, "mfsdpc simulate: error: output files must differ from each other and from the input\n");
        return 2;
    }
    return -1;
}

/* The comparison with one stream (--compare-single-stream). */
static void print_compare(const mf_sim_result *res, const mf_sim_result *single)
{
    double diff = single->step_time - res->step_time;
    printf("\nsingle stream (outer collectives on the inner stream, %d same-stream waits "
           "become no-ops):\n",
           single->same_stream_waits);
    printf("  step time   two streams %.3f ms, one stream %.3f ms\n", res->step_time * 1e3,
           single->step_time * 1e3);
    printf("  the second stream saves %.3f ms per step (%.1f%%); exposed communication "
           "%.3f ms -> %.3f ms\n",
           diff * 1e3, single->step_time > 0 ? 100.0 * diff / single->step_time : 0.0,
           single->comm_exposed * 1e3, res->comm_exposed * 1e3);
}

/* The schedule to simulate: a schedule file loaded into *loaded, or a spec
 * compiled into *comp (*have_comp set). Returns 0, or the exit status. */
static int open_input(const sim_args *a, mf_compilation *comp, bool *have_comp, mf_schedule **loaded,
                      const mf_schedule **s)
{
    const char *input = a->ca.input;
    if (has_suffix(input, ".yaml") || has_suffix(input, ".yml")) {
        FILE *probe = fopen(input, "rb");
        if (!probe) {
            fprintf(stderr, "mfsdpc simulate: error: cannot read '%s': %s\n", input, strerror(errno));
            return 2;
        }
        fclose(probe);
        char err[1024];
        *loaded = mf_load_schedule_file(input, err, sizeof err);
        if (!*loaded) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        *s = *loaded;
        return 0;
    }
    mf_compile_options opt = {.stop_after = MF_STAGE_VERIFY, .verify = true,
                              .ncost_args = a->ca.ncost, .cost_args = a->ca.cost_args};
    int crc = mf_pipeline_compile_file(input, &opt, comp);
    *have_comp = true;
    if (crc != 0 || !comp->plan || !comp->plan->sched)
        return crc ? crc : 1;
    *s = comp->plan->sched;
    return 0;
}

int mf_cmd_simulate(int argc, char **argv)
{
    sim_args a = {.optb = MF_OPTIMIZER_BYTES_DEFAULT};
    mf_compilation comp;
    bool have_comp = false;
    mf_schedule *loaded = NULL;
    mf_sim_result res = {0}, single = {0};
    const mf_schedule *s = NULL;
    mf_sim_config cfg;
    char err[512];
    int rc = 2;
    if (mf_cmd_args_init(&a.ca, "mfsdpc simulate", argc) != 0)
        return 2;
    int prc = parse_args(argc, argv, &a);
    if (prc >= 0) {
        rc = prc;
        goto done;
    }
    if ((rc = open_input(&a, &comp, &have_comp, &loaded, &s)) != 0)
        goto done;
    rc = 2;
    if (!mf_cmd_args_sim_config(&a.ca, &s->mesh, &cfg))
        goto done;
    rc = 1;
    if (mf_simulate(s, &cfg, &res, err, sizeof err) != 0) {
        fprintf(stderr, "%s: error: cannot simulate: %s\n", a.ca.input, err);
        goto done;
    }
    print_header(a.ca.input, s, &cfg);
    mf_simulate_report(stdout, s, &res, a.full_path);
    mf_plan_mem mem;
    mf_plan_mem_of(s, a.optb, &mem);
    char h1[32];
    printf("memory/rank  peak %s (%lld bytes) allocated = persistent region + arena (docs/semantics.md §10)\n",
           mf_human_bytes(mem.allocated, h1, sizeof h1), (long long)mem.allocated);
    mf_plan_mem_print(stdout, &mem, a.optb);
    if (a.compare) {
        mf_sim_config one = cfg;
        one.single_stream = true;
        if (mf_simulate(s, &one, &single, err, sizeof err) != 0) {
            fprintf(stderr, "%s: error: cannot simulate: %s\n", a.ca.input, err);
            goto done;
        }
        print_compare(&res, &single);
    }
    fflush(stdout);

    out_ctx ctx = {s, &res, a.win0, a.win1};
    mf_outputs os;
    mf_outputs_begin(&os, a.ca.input);
    if (a.trace)
        mf_outputs_add(&os, a.trace, write_trace, &ctx);
    if (a.svg && !os.failed)
        mf_outputs_add(&os, a.svg, write_svg, &ctx);
    rc = mf_outputs_commit(&os) == 0 ? 0 : 2;   /* every output, or none */

done:
    mf_sim_result_free(&res);
    mf_sim_result_free(&single);
    if (have_comp)
        mf_compilation_free(&comp);
    mf_schedule_free(loaded);
    mf_cmd_args_free(&a.ca);
    return rc;
}
