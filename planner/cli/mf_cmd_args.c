/*
 * mf_cmd_args: the command-line pieces the mfsdpc subcommands share (see
 * mf_cmd_args.h).
 */
#include "mf_cmd_args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int mf_cmd_args_init(mf_cmd_args *a, const char *cmd, int argc)
{
    *a = (mf_cmd_args){.cmd = cmd};
    a->cost_args = calloc((size_t)argc + 1, sizeof *a->cost_args);
    if (!a->cost_args) {
        fprintf(stderr, "%s: error: out of memory\n", cmd);
        return 2;
    }
    return 0;
}

void mf_cmd_args_free(mf_cmd_args *a)
{
    free(a->cost_args);
    a->cost_args = NULL;
}

int mf_cmd_args_stop(mf_cmd_args *a, int rc, void (*usage)(FILE *out))
{
    usage(rc == 1 ? stdout : stderr);
    mf_cmd_args_free(a);
    return rc == 1 ? 0 : rc;
}

/* A positive finite number into *out: 0, or 2 with a message. */
static int mf_cmd_positive(const mf_cmd_args *a, const char *opt, const char *v, double *out)
{
    char *end = NULL;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end != '\0' || errno != 0 || !isfinite(x) || !(x > 0)) {
        fprintf(stderr, "%s: error: %s needs a positive number, got '%s'\n", a->cmd, opt, v ? v : "");
        return 2;
    }
    *out = x;
    return 0;
}

int mf_cmd_args_take(mf_cmd_args *a, const mf_opts *p, int id, const char *v)
{
    switch (id) {
    case MF_SIM_OPT_TOKENS: return mf_cmd_positive(a, "--tokens", v, &a->tokens);
    case MF_SIM_OPT_TFLOPS: return mf_cmd_positive(a, "--tflops", v, &a->tflops);
    case MF_SIM_OPT_UNIT_TIME: return mf_cmd_positive(a, "--unit-time-us", v, &a->unit_us);
    case MF_SIM_OPT_HOST_ASYNC: a->host_async = true; return 0;
    case MF_OPTS_EXTRA: a->cost_args[a->ncost++] = p->argv[p->i - 1]; return 0;
    case MF_OPTS_OPERAND:
        if (a->input) {
            fprintf(stderr, "%s: error: one spec at a time (got '%s' and '%s')\n", a->cmd, a->input, v);
            return 2;
        }
        a->input = v;
        return 0;
    default: return 2; /* reported */
    }
}

int mf_cmd_args_need_input(const mf_cmd_args *a)
{
    if (a->input)
        return 0;
    fprintf(stderr, "%s: error: no spec given\n", a->cmd);
    return 2;
}

bool mf_cmd_args_sim_config(const mf_cmd_args *a, const mf_mesh *mesh, mf_sim_config *cfg)
{
    mf_sim_config_defaults(cfg, mesh);
    for (int i = 0; i < a->ncost; i++) {
        int pr = mf_cost_parse_option(&cfg->cost, mesh, a->cost_args[i]);
        if (pr != 1) {
            if (pr == 0)
                fprintf(stderr, "%s: error: unknown option '%s'\n", a->cmd, a->cost_args[i]);
            return false;
        }
    }
    if (a->tokens > 0)
        cfg->tokens = a->tokens;
    if (a->tflops > 0)
        cfg->flops = a->tflops * 1e12;
    if (a->unit_us > 0)
        cfg->unit_time = a->unit_us * 1e-6;
    cfg->host_async = a->host_async;
    return true;
}
