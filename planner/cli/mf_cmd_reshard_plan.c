/*
 * mfsdpc reshard-plan OLD.yaml NEW.yaml
 *
 * The plan of loading a checkpoint saved under schedule OLD into a runtime
 * of schedule NEW (docs/checkpoint.md, "Resharding"): for every rank of NEW,
 * which element ranges of which data file of OLD's checkpoint it reads
 * (rank-RRRRR.safetensors, written by OLD's rank RRRRR), computed from the
 * two schedules alone with the runtime's own plan (mf_ckpt_plan). Every state
 * (main_weight and each optimizer state) moves by the same element ranges.
 * Ends with the totals: elements needed, elements read, their ratio.
 * Exit status: 0, 1 when the schedules do not hold the same tensors, 2 on
 * usage or unreadable input.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_ckpt_plan.h"
#include "mf_cli.h"
#include "mf_int.h"
#include "mf_load.h"
#include "mf_opts.h"

static void mf_rp_usage(FILE *out)
{
    fprintf(out, "usage: mfsdpc reshard-plan OLD.yaml NEW.yaml\n\n"
                 "Which file ranges of a checkpoint saved under OLD each rank of NEW reads.\n"
                 "exit status: 0 ok, 1 the schedules hold different tensors, 2 error\n");
}

static void mf_rp_mesh(const mf_schedule *s, char *buf, size_t size)
{
    size_t at = 0;
    for (int a = 0; a < s->mesh.naxes && at < size; a++)
        at += (size_t)snprintf(buf + at, size - at, "%s%s=%" PRId64, a ? " x " : "", s->mesh.axes[a].name,
                               s->mesh.axes[a].size);
}

/* Old pieces sorted by (tensor, start): index array. */
static int mf_rp_cmp(const void *a, const void *b, void *ctx)
{
    const mf_ckpt_plan *p = ctx;
    const mf_ckpt_piece *x = &p->p[*(const int64_t *)a], *y = &p->p[*(const int64_t *)b];
    int c = mf_cmp_i64(x->tensor, y->tensor);
    return c ? c : mf_cmp_i64(x->start, y->start);
}

static int mf_rp_match(const mf_schedule *os, const mf_schedule *ns, const mf_ckpt_plan *o, const mf_ckpt_plan *n,
                       int *tmap)
{
    int bad = 0;
    char *names[MF_MAX_AXES], err[512];
    int64_t sizes[MF_MAX_AXES];
    for (int a = 0; a < os->mesh.naxes; a++) {
        names[a] = (char *)os->mesh.axes[a].name;
        sizes[a] = os->mesh.axes[a].size;
    }
    if (mf_ckpt_plan_check_split(ns, os->mesh.naxes, names, sizes, err, sizeof err) != 0)
        fprintf(stderr, "mfsdpc: error: %s\n", err), bad++;
    for (int k = 0; k < n->ntensors; k++) { /* a split tensor: the same combination's slice */
        int t = tmap[k] = mf_ckpt_plan_find_coord(o, n->t[k].name, n->t[k].coord);
        if (t < 0)
            fprintf(stderr, "mfsdpc: error: tensor '%s' of NEW is not in OLD\n", n->t[k].name), bad++;
        else if (o->t[t].numel != n->t[k].numel || o->t[t].ndims != n->t[k].ndims ||
                 memcmp(o->t[t].gdims, n->t[k].gdims, sizeof(int64_t) * (size_t)n->t[k].ndims) != 0 ||
                 o->t[t].dtype != n->t[k].dtype)
            fprintf(stderr, "mfsdpc: error: tensor '%s' has another shape or main_weight dtype in OLD\n",
                    n->t[k].name), bad++;
    }
    if (o->nmt != n->nmt)
        fprintf(stderr, "mfsdpc: error: OLD has %d tensors, NEW %d\n", o->nmt, n->nmt), bad++;
    return bad;
}

static void mf_rp_print(const mf_schedule *ns, const mf_ckpt_plan *o, const mf_ckpt_plan *n, const int *tmap,
                        const int64_t *idx)
{
    int64_t needed = 0, read = 0, lines = 0;
    for (int64_t r = 0; r < n->world; r++) {
        printf("rank %" PRId64 ":\n", r);
        for (int k = 0; k < n->ntensors; k++) {
            int64_t lo, hi;
            mf_ckpt_plan_held(ns, n, k, r, &lo, &hi);
            needed += hi - lo;
            for (int64_t i = 0; i < o->npieces && lo < hi; i++) {
                const mf_ckpt_piece *p = &o->p[idx[i]];
                if (p->tensor != tmap[k] || p->end <= lo || p->start >= hi)
                    continue;
                int64_t a = p->start > lo ? p->start : lo, b = p->end < hi ? p->end : hi;
                /* in the checkpoint tensor's elements (a split tensor: W's; a piece never crosses a run) */
                int64_t ga = mf_ckpt_plan_gstart(&n->t[k], a), gp = mf_ckpt_plan_gstart(&o->t[p->tensor], p->start);
                printf("  %s[%" PRId64 ":%" PRId64 "] <- rank-%05" PRId64 ".safetensors entry [%" PRId64 ":%" PRId64
                       "], elements %" PRId64 "..%" PRId64 " of it\n", n->t[k].name, ga, ga + (b - a), p->writer, gp,
                       gp + (p->end - p->start), a - p->start, b - p->start);
                read += b - a;
                lines++;
            }
        }
    }
    printf("totals: %" PRId64 " ranges; elements needed %" PRId64 ", read %" PRId64 " (%.3f x needed; per state, "
           "plus each data file's header once per rank that opens it)\n", lines, needed, read,
           needed ? (double)read / (double)needed : 1.0);
}

/* OLD and NEW into path[2]. -1 to go on, else the exit status (0 after
 * --help; 2 after anything but two schedules, with the usage). */
static int mf_rp_parse(int argc, char **argv, const char *path[2])
{
    static const mf_opt opts[] = {{"--help", "-h", NULL, 0}};
    mf_opts p;
    mf_opts_init(&p, "mfsdpc reshard-plan", argc, argv, opts, 1, NULL);
    p.quiet = true; /* the usage says it */
    int id, n = 0;
    const char *v;
    while ((id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == 0) {
            mf_rp_usage(stdout);
            return 0;
        }
        if (id != MF_OPTS_OPERAND || n == 2)
            n = 3;
        else
            path[n++] = v;
    }
    if (n != 2) {
        mf_rp_usage(stderr);
        return 2;
    }
    return -1;
}

int mf_cmd_reshard_plan(int argc, char **argv)
{
    const char *path[2];
    int prc = mf_rp_parse(argc, argv, path);
    if (prc >= 0)
        return prc;
    char err[1024], a[256] = "", b[256] = "";
    mf_schedule *os = mf_load_schedule_file(path[0], err, sizeof err), *ns = NULL;
    mf_ckpt_plan o = {0}, n = {0};
    int rc = 2, *tmap = NULL;
    int64_t *idx = NULL;
    if (!os || !(ns = mf_load_schedule_file(path[1], err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        goto done;
    }
    for (int i = 0; i < 2; i++) {
        err[0] = '\0';
        if (mf_ckpt_plan_build(i ? ns : os, i ? &n : &o, err, sizeof err) != 0) {
            fprintf(stderr, "mfsdpc: error: %s: %s\n", path[i], err[0] ? err : "out of memory");
            rc = err[0] && !strstr(err, "out of memory") ? 1 : 2;
            goto done;
        }
    }
    if (!(tmap = calloc((size_t)n.ntensors + 1, sizeof *tmap)) ||
        !(idx = malloc((size_t)(o.npieces + 1) * sizeof *idx))) {
        fprintf(stderr, "mfsdpc: error: out of memory\n");
        goto done;
    }
    if (mf_rp_match(os, ns, &o, &n, tmap) != 0) {
        rc = 1;
        goto done;
    }
    for (int64_t i = 0; i < o.npieces; i++)
        idx[i] = i;
    qsort_r(idx, (size_t)o.npieces, sizeof *idx, mf_rp_cmp, &o);
    mf_rp_mesh(os, a, sizeof a);
    mf_rp_mesh(ns, b, sizeof b);
    printf("reshard plan: %s (%s, %" PRId64 " ranks) -> %s (%s, %" PRId64 " ranks)\n", path[0], a, o.world, path[1],
           b, n.world);
    mf_rp_print(ns, &o, &n, tmap, idx);
    rc = 0;
done:
    free(idx);
    free(tmap);
    mf_ckpt_plan_free(&o);
    mf_ckpt_plan_free(&n);
    mf_schedule_free(os);
    mf_schedule_free(ns);
    return rc;
}
