/*
 * bench_planner: planner benchmarks (never run as tests; see run.sh).
 *
 *   bench_planner gen --shape moe|deep --tensors N
 *       writes a synthetic spec to stdout.
 *   bench_planner time --shape moe|deep --tensors N --stage check|compile
 *       generates the spec in memory, runs the pipeline (check: parse + sema;
 *       compile: every pass through the verifier, then the YAML emitter into
 *       /dev/null) and prints one line of key=value: wall and CPU seconds of
 *       the pipeline (generation excluded), peak RSS
 *       (getrusage, whole process, so run one measurement per process), the
 *       spec's size and the schedule's op count.
 *   bench_planner quality SPEC...
 *       compiles each spec and prints, per mesh axis, bytes per rank per step
 *       against the ring lower bound, and collective launches per step
 *       against tensors (fusion).
 *
 * Synthetic shapes (mesh 4 x 8, HFSDP layout, every 8th tensor a small norm
 * with a replicated layout override, 4 microbatches):
 *   moe   16 units ("few units with many tensors"): a router, then experts of
 *         three matrices each, until the unit has N/16 tensors;
 *   deep  N/8 units ("many units") of 6 matrices and 2 norms each, capped at
 *         50 000 units (sema allows 65 536), so 10^6 tensors make 50 000 units.
 * Sizes vary per tensor (rows 64..448, 128 columns) so that no two buckets
 * pad the same way.
 *
 * Ring lower bound (per bucket, E = elements of its tensors, no padding;
 * n_j the size of axis j; b the dtype's bytes):
 *   gathers (T1 O->W once, T2 W->Rep per forward and per resharded backward):
 *     the gathered axes outermost-first; gathering axis j while the rank holds
 *     h = E / prod(n of the axes still Flat) sends (n_j - 1) * h * b;
 *   reductions (T3 P->G per microbatch, T4 G->O once): axes innermost-first;
 *     with h the elements a rank still holds, a reduce-scatter sends
 *     (n_j - 1) * h / n_j * b and an all-reduce 2 * (n_j - 1) * h / n_j * b,
 *     after which h /= n_j (for the all-reduce through the hierarchical
 *     composition RS, outer work on h / n_j, AG, whose two halves are what the
 *     2 counts); a slice (R -> F) sends nothing and divides h by n_j.
 * The ratio schedule / bound is therefore >= 1; it is 1 up to padding for an
 * optimal schedule.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "mf_opts.h"
#include "mf_passes.h"
#include "mf_pipeline.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of this process (user + system): unlike wall time, barely
 * disturbed by other load on a shared machine; the pipeline is one thread. */
static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static long peak_rss_kb(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

/* ---- the synthetic spec ---- */

typedef enum { SHAPE_MOE, SHAPE_DEEP } shape;

static const char *const header =
    "# synthetic benchmark spec (bench/planner/bench_planner.c)\n"
    "mesh dp_outer = 4, dp_inner = 8;\n"
    "microbatches 4;\n"
    "reduce avg;\n"
    "layout hfsdp {\n"
    "  weight      bf16 [Replicate, Flat];\n"
    "  grad        fp32 [Partial, Flat];\n"
    "  main_weight fp32 [Flat, Flat];\n"
    "}\n"
    "layout norms {\n"
    "  weight      fp32 [Replicate, Replicate];\n"
    "  grad        fp32 [Partial, Partial];\n"
    "  main_weight fp32 [Replicate, Replicate];\n"
    "}\n";

static void gen_tensor(FILE *out, long long t, const char *name, long long idx)
{
    if (t % 8 == 7)
        fprintf(out, "  tensor \"%s%lld.norm\" [%d] layout norms;\n", name, idx, 64 + (int)(t % 5) * 32);
    else
        fprintf(out, "  tensor \"%s%lld.weight\" [%d, 128];\n", name, idx, 64 * (1 + (int)(t * 5 % 7)));
}

/* Writes the spec; returns the number of units. */
static long long gen_spec(FILE *out, shape sh, long long ntensors)
{
    fputs(header, out);
    /* deep: 8 tensors per unit, at most 50 000 units (sema's unit limit is
     * 65 536), so 1 000 000 tensors make 50 000 units of 20 */
    long long units = sh == SHAPE_MOE ? 16 : (ntensors + 7) / 8;
    if (units > 50000)
        units = 50000;
    if (units > ntensors)
        units = ntensors;
    long long per = ntensors / units, extra = ntensors % units, t = 0;
    for (long long u = 0; u < units; u++) {
        long long n = per + (u < extra ? 1 : 0);
        if (sh == SHAPE_MOE) {
            fprintf(out, "unit \"moe.%lld\" layout hfsdp {\n", u);
            for (long long i = 0; i < n; i++, t++) {
                if (i == 0)
                    fprintf(out, "  tensor \"router.weight\" [64, 128];\n");
                else
                    gen_tensor(out, t, "experts.", i);
            }
        } else {
            fprintf(out, "unit \"layers.%lld\" layout hfsdp {\n", u);
            for (long long i = 0; i < n; i++, t++)
                gen_tensor(out, t, "p", i);
        }
        fprintf(out, "}\n");
    }
    return units;
}

static int parse_shape(const char *s, shape *sh)
{
    if (s && strcmp(s, "moe") == 0)
        *sh = SHAPE_MOE;
    else if (s && strcmp(s, "deep") == 0)
        *sh = SHAPE_DEEP;
    else {
        fprintf(stderr, "bench_planner: error: --shape moe|deep expected\n");
        return -1;
    }
    return 0;
}

/* ---- time ---- */

static int cmd_time(shape sh, long long ntensors, const char *stage)
{
    bool full = strcmp(stage, "compile") == 0;
    if (!full && strcmp(stage, "check") != 0) {
        fprintf(stderr, "bench_planner: error: --stage check|compile expected\n");
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem)
        return 2;
    long long units = gen_spec(mem, sh, ntensors);
    if (fclose(mem) != 0 || !text)
        return 2;
    long rss_before = peak_rss_kb();

    mf_compile_options opt = {.stop_after = full ? MF_STAGE_VERIFY : MF_STAGE_SEMA,
                              .verify = full};
    mf_compilation c;
    double c0 = cpu_seconds();
    double t0 = now();
    int rc = mf_pipeline_compile_buffer("synthetic.mfsdp", text, len, &opt, &c);
    double t1 = now(), t2 = t1;
    long long nops = 0, nbuckets = 0;
    if (rc == 0 && full && c.plan && c.plan->sched) {
        FILE *null = fopen("/dev/null", "w");
        if (!null || mf_emit_yaml(c.plan->sched, null) != 0)
            rc = 2;
        if (null)
            fclose(null);
        t2 = now();
        nops = c.plan->sched->nops;
        nbuckets = c.plan->sched->nbuckets;
    }
    double c2 = cpu_seconds();
    printf("shape=%s tensors=%lld units=%lld stage=%s rc=%d seconds=%.4f cpu_s=%.4f pipeline_s=%.4f "
           "emit_s=%.4f peak_rss_kb=%ld rss_before_kb=%ld spec_bytes=%zu buckets=%lld ops=%lld\n",
           sh == SHAPE_MOE ? "moe" : "deep", ntensors, units, stage, rc, t2 - t0, c2 - c0, t1 - t0,
           t2 - t1, peak_rss_kb(), rss_before, len, nbuckets, nops);
    mf_compilation_free(&c);
    free(text);
    return rc;
}

/* ---- quality ---- */

/* Gathers from placement `from` to `to` (F -> R axes), outermost-first. */
static void bound_gather(const mf_mesh *m, const mf_placement *from, const mf_placement *to,
                         double E, double b, double runs, double *out)
{
    double div = 1;
    for (int j = 0; j < m->naxes; j++)
        if (from->p[j] == MF_PLACE_FLAT)
            div *= (double)m->axes[j].size;
    for (int j = 0; j < m->naxes; j++) {
        double n = (double)m->axes[j].size;
        if (from->p[j] == MF_PLACE_FLAT && to->p[j] == MF_PLACE_REPLICATE) {
            out[j] += runs * (n - 1) * (E / div) * b;
            div /= n;
        }
    }
}

/* Reductions from `from` to `to`, innermost-first (see the file comment). */
static void bound_reduce(const mf_mesh *m, const mf_placement *from, const mf_placement *to,
                         double E, double b, double runs, double *out)
{
    double h = E;
    for (int j = 0; j < m->naxes; j++)
        if (from->p[j] == MF_PLACE_FLAT)
            h /= (double)m->axes[j].size;
    for (int j = m->naxes - 1; j >= 0; j--) {
        double n = (double)m->axes[j].size;
        int f = from->p[j], t = to->p[j];
        if (f == MF_PLACE_PARTIAL && t == MF_PLACE_FLAT) {
            out[j] += runs * (n - 1) * h / n * b;
            h /= n;
        } else if (f == MF_PLACE_PARTIAL && t == MF_PLACE_REPLICATE) {
            out[j] += runs * 2 * (n - 1) * h / n * b;
            h /= n;
        } else if (f == MF_PLACE_REPLICATE && t == MF_PLACE_FLAT) {
            h /= n;
        }
    }
}

static int cmd_quality(int argc, char **argv)
{
    printf("%-34s %-9s %14s %14s %7s %9s %8s %9s %8s\n", "spec", "axis", "bytes/rank/step",
           "ring bound", "ratio", "launches", "tensors", "launch/t", "fusion");
    int worst = 0;
    for (int i = 0; i < argc; i++) {
        mf_compile_options opt = {.stop_after = MF_STAGE_VERIFY, .verify = true};
        mf_compilation c;
        int rc = mf_pipeline_compile_file(argv[i], &opt, &c);
        if (rc != 0 || !c.plan || !c.plan->sched) {
            printf("%-34s compile failed (%d)\n", argv[i], rc);
            mf_compilation_free(&c);
            worst = 1;
            continue;
        }
        const mf_schedule *s = c.plan->sched;
        double bound[MF_MAX_AXES] = {0};
        long long tensors = 0;
        for (int bi = 0; bi < s->nbuckets; bi++) {
            const mf_bucket *bk = &s->buckets[bi];
            double E = 0;
            for (int t = 0; t < bk->ntensors; t++)
                E += (double)bk->tensors[t].numel;
            tensors += bk->ntensors;
            const mf_placement *W = &bk->place[MF_ROLE_WEIGHT], *G = &bk->place[MF_ROLE_GRAD],
                               *O = &bk->place[MF_ROLE_MAIN_WEIGHT];
            mf_placement rep = {{0}}, part;
            for (int j = 0; j < MF_MAX_AXES; j++)
                part.p[j] = MF_PLACE_PARTIAL;
            double M = (double)s->microbatches;
            bool raf = bk->unit >= 0 && bk->unit < s->nunits && s->units[bk->unit].reshard_after_forward;
            double bw = (double)mf_dtype_size(bk->dtype[MF_ROLE_WEIGHT]);
            double bo = (double)mf_dtype_size(bk->dtype[MF_ROLE_MAIN_WEIGHT]);
            double bg = (double)mf_dtype_size(bk->dtype[MF_ROLE_GRAD]);
            bound_gather(&s->mesh, O, W, E, bw < bo ? bw : bo, 1, bound);
            bound_gather(&s->mesh, W, &rep, E, bw, M * (raf ? 2 : 1), bound);
            bound_reduce(&s->mesh, &part, G, E, bg, M, bound);
            bound_reduce(&s->mesh, G, O, E, bg, 1, bound);
        }
        /* fusion: launches a per-tensor schedule would need / launches made */
        double launches = 0, unfused = 0;
        for (int k = 0; k < s->nops; k++) {
            const mf_op *op = &s->ops[k];
            if (!mf_opkind_is_collective(op->kind))
                continue;
            double runs = (double)mf_when_runs_per_step(op->when, op->phase, s->microbatches);
            launches += runs;
            if (op->bucket >= 0 && op->bucket < s->nbuckets)
                unfused += runs * s->buckets[op->bucket].ntensors;
        }
        const char *name = strrchr(argv[i], '/') ? strrchr(argv[i], '/') + 1 : argv[i];
        double tb = 0, tbound = 0;
        for (int j = 0; j < s->mesh.naxes; j++) {
            double got = (double)s->summary.bytes[j];
            tb += got;
            tbound += bound[j];
            if (got == 0 && bound[j] == 0)
                continue;
            printf("%-34s %-9s %14.0f %14.0f %7.4f %9s %8s %9s %8s\n", name, s->mesh.axes[j].name,
                   got, bound[j], bound[j] > 0 ? got / bound[j] : 0.0, "", "", "", "");
        }
        printf("%-34s %-9s %14.0f %14.0f %7.4f %9.0f %8lld %9.4f %8.1f\n", name, "total", tb, tbound,
               tbound > 0 ? tb / tbound : (tb == 0 ? 1.0 : 0.0), launches, tensors,
               tensors ? launches / (double)tensors : 0.0, launches > 0 ? unfused / launches : 0.0);
        mf_compilation_free(&c);
    }
    return worst;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_planner gen --shape moe|deep --tensors N\n"
                    "       bench_planner time --shape moe|deep --tensors N --stage check|compile\n"
                    "       bench_planner quality SPEC...\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage();
        return 2;
    }
    if (strcmp(argv[1], "quality") == 0)
        return cmd_quality(argc - 2, argv + 2);
    const char *shape_s = NULL, *stage = "check";
    long long n = 0;
    enum { O_SHAPE, O_TENSORS, O_STAGE };
    static const mf_opt opts[] = {{"--shape", NULL, "a value", O_SHAPE}, {"--tensors", NULL, "a value", O_TENSORS},
                                  {"--stage", NULL, "a value", O_STAGE}};
    mf_opts p;
    mf_opts_init(&p, "bench_planner", argc - 1, argv + 1, opts, 3, NULL); /* after the command */
    p.quiet = true; /* any mistake: the usage */
    int id;
    const char *v;
    while ((id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == O_SHAPE)
            shape_s = v;
        else if (id == O_TENSORS)
            n = strtoll(v, NULL, 10);
        else if (id == O_STAGE)
            stage = v;
        else {
            usage();
            return 2;
        }
    }
    shape sh;
    if (parse_shape(shape_s, &sh) != 0 || n < 1 || n > 100000000LL) {
        usage();
        return 2;
    }
    if (strcmp(argv[1], "gen") == 0) {
        gen_spec(stdout, sh, n);
        return fflush(stdout) == 0 ? 0 : 2;
    }
    if (strcmp(argv[1], "time") == 0)
        return cmd_time(sh, n, stage);
    usage();
    return 2;
}
