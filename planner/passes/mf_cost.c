/*
 * mf_cost: the alpha-beta cost model per mesh axis (ring algorithms).
 *
 * Used by the transition pass to choose between legal compositions of a
 * multi-axis transition, by `explain` to print modeled times, and by
 * `simulate` to time a schedule. Pure functions of the model; no state.
 *
 * Defaults (docs/semantics.md, "cost model"), for H100/H200 SXM nodes:
 *   innermost axis  NVLink 4 through NVSwitch: 18 links x 25 GB/s = 450 GB/s per
 *                   direction per GPU; nccl-tests reach about 360 GB/s of bus
 *                   bandwidth for all-gather / reduce-scatter on 8 GPUs, which is
 *                   the ring's per-rank send rate: beta 360 GB/s, alpha 2 us per
 *                   ring step.
 *   other axes      one 400 Gb/s InfiniBand NIC (ConnectX-7) per GPU: 50 GB/s line
 *                   rate, about 45 GB/s achieved: beta 45 GB/s, alpha 8 us per ring
 *                   step (network hop plus NCCL proxy).
 *   launch          5 us per collective (kernel launch, proxy hand-off and the
 *                   stream event a decomposed composition adds). Without it the
 *                   ring formulas cannot tell a 3-launch composition from a
 *                   2-launch one with the same ring steps, and the choice would
 *                   not depend on message size.
 *   local_bw        3 TB/s of bytes touched (HBM3 3.35 TB/s on H100, 4.8 on H200).
 */
#include "mf_cost.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MF_INNER_ALPHA 2e-6
#define MF_INNER_BETA 360e9
#define MF_OUTER_ALPHA 8e-6
#define MF_OUTER_BETA 45e9
#define MF_LAUNCH 5e-6
#define MF_LOCAL_BW 3e12

void mf_cost_defaults(mf_cost_model *cm, const mf_mesh *mesh)
{
    memset(cm, 0, sizeof *cm);
    int k = mesh ? mesh->naxes : 1;
    for (int j = 0; j < MF_MAX_AXES; j++) {
        bool inner = j == k - 1;
        cm->axis[j].alpha = inner ? MF_INNER_ALPHA : MF_OUTER_ALPHA;
        cm->axis[j].beta = inner ? MF_INNER_BETA : MF_OUTER_BETA;
    }
    cm->local_bw = MF_LOCAL_BW;
    cm->launch = MF_LAUNCH;
}

double mf_cost_op(const mf_cost_model *cm, const mf_mesh *mesh, mf_opkind kind, int axis,
                  int64_t count, mf_dtype d)
{
    double b = (double)mf_dtype_size(d), c = (double)count;
    if (!mf_opkind_is_collective(kind)) {
        double touched = kind == MF_OP_ACCUMULATE ? 3 * c * b
                         : kind == MF_OP_CAST || kind == MF_OP_SLICE ? 2 * c * b
                                                                     : 0;
        return cm->local_bw > 0 ? touched / cm->local_bw : 0;
    }
    if (axis < 0 || axis >= mesh->naxes)
        return 0;
    double n = (double)mesh->axes[axis].size;
    const mf_link *l = &cm->axis[axis];
    double per_byte = l->beta > 0 ? 1.0 / l->beta : 0;
    switch (kind) {
    case MF_OP_ALL_GATHER:
    case MF_OP_REDUCE_SCATTER:
        return cm->launch + (n - 1) * (l->alpha + c * b * per_byte);
    case MF_OP_ALL_REDUCE:
        return cm->launch + 2 * (n - 1) * (l->alpha + c / n * b * per_byte);
    default:
        return 0;
    }
}

double mf_cost_op_bytes(const mf_cost_model *cm, const mf_mesh *mesh, mf_opkind kind, int axis,
                        int64_t count, int64_t bytes, mf_dtype d)
{
    if (!mf_opkind_is_collective(kind) || axis < 0 || axis >= mesh->naxes ||
        bytes == mf_schedule_collective_bytes(kind, mesh->axes[axis].size, count, d))
        return mf_cost_op(cm, mesh, kind, axis, count, d);
    double beta = cm->axis[axis].beta;
    return mf_cost_op(cm, mesh, kind, axis, 0, d) + (beta > 0 ? (double)bytes / beta : 0);
}

/* The value after '=' of arg when it starts with name followed by '='. */
static const char *option_value(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && arg[n] == '=' ? arg + n + 1 : NULL;
}

/* Parses a finite number >= 0 (> 0 when positive); false when malformed. */
static bool parse_number(const char *s, bool positive, double *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < 0 || (positive && v == 0))
        return false;
    *out = v;
    return true;
}

/* The axis named by the NAME part of "NAME:VALUE"; -1 when none matches. */
static int axis_by_name(const mf_mesh *mesh, const char *s, const char **value)
{
    const char *colon = strrchr(s, ':');
    if (!colon)
        return -1;
    *value = colon + 1;
    size_t n = (size_t)(colon - s);
    for (int j = 0; j < mesh->naxes; j++)
        if (strlen(mesh->axes[j].name) == n && strncmp(mesh->axes[j].name, s, n) == 0)
            return j;
    return -1;
}

static int bad_value(const char *arg, const char *expected)
{
    fprintf(stderr, "mfsdpc: error: malformed cost option '%s' (expected %s)\n", arg, expected);
    return -1;
}

static const char *const cost_options[] = {"--inner-bw", "--outer-bw", "--inner-lat", "--outer-lat",
                                           "--axis-bw",  "--axis-lat", "--local-bw",  "--launch-lat"};

bool mf_cost_is_option(const char *arg)
{
    for (size_t i = 0; i < sizeof cost_options / sizeof cost_options[0]; i++)
        if (option_value(arg, cost_options[i]))
            return true;
    return false;
}

/* A bandwidth option's GB/s (bw) or a latency option's microseconds. */
static void set_axis_cost(mf_link *a, bool bw, double x)
{
    if (bw)
        a->beta = x * 1e9;
    else
        a->alpha = x * 1e-6;
}

int mf_cost_parse_option(mf_cost_model *cm, const mf_mesh *mesh, const char *arg)
{
    const char *v;
    double x;
    int k = mesh->naxes;
    bool bw = (v = option_value(arg, "--inner-bw")) || (v = option_value(arg, "--outer-bw"));
    if (bw || (v = option_value(arg, "--inner-lat")) || (v = option_value(arg, "--outer-lat"))) {
        if (!parse_number(v, bw, &x))
            return bad_value(arg, bw ? "a bandwidth in GB/s per rank, > 0"
                                     : "a latency in microseconds per ring step, >= 0");
        bool inner = arg[2] == 'i';
        for (int j = 0; j < k; j++)
            if ((j == k - 1) == inner)
                set_axis_cost(&cm->axis[j], bw, x);
        return 1;
    }
    if ((v = option_value(arg, "--axis-bw")) || (v = option_value(arg, "--axis-lat"))) {
        bw = strncmp(arg, "--axis-bw", 9) == 0;
        const char *num = NULL;
        int j = axis_by_name(mesh, v, &num);
        if (j < 0) {
            fprintf(stderr, "mfsdpc: error: cost option '%s' names no mesh axis (the mesh has", arg);
            for (int i = 0; i < k; i++)
                fprintf(stderr, "%s %s", i ? "," : "", mesh->axes[i].name);
            fprintf(stderr, ")\n");
            return -1;
        }
        if (!parse_number(num, bw, &x))
            return bad_value(arg, bw ? "NAME:GBPS with GBPS > 0" : "NAME:US with US >= 0");
        set_axis_cost(&cm->axis[j], bw, x);
        return 1;
    }
    if ((v = option_value(arg, "--local-bw"))) {
        if (!parse_number(v, true, &x))
            return bad_value(arg, "a bandwidth in GB/s, > 0");
        cm->local_bw = x * 1e9;
        return 1;
    }
    if ((v = option_value(arg, "--launch-lat"))) {
        if (!parse_number(v, false, &x))
            return bad_value(arg, "a latency in microseconds per collective, >= 0");
        cm->launch = x * 1e-6;
        return 1;
    }
    return 0;
}
