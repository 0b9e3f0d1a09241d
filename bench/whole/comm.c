/*
 * mfsdp-whole-comm-bench: the collectives of a whole bucket in the padded and
 * the prefix form (docs/runtime.md, "Whole buckets"), next to a Flat bucket of
 * the same tensors (the ring bound), on the MPI backend, measured in the same
 * run (bench/whole/comm_run.sh: mpirun -np 4). Not a test: it prints a table.
 *
 * The unit is a Llama-like block at hidden size D = 512 (fp32 gradients):
 * q, k, v, o [D, D], gate, up, down [D, 1408] and the two norms as one [2 D].
 * The whole bucket puts each tensor on one of 4 owners as the design's
 * packing does (cost = numel, largest first, to the least loaded shard):
 * gate, up, down on shards 0, 1, 2; q, k, v on shard 3, o on shard 0, norms on
 * shard 1. The shard length S is the largest shard's (with the builder's
 * 128-element quantum); the Flat bucket packs the tensors end to end.
 *
 * For each (bucket, form) it runs a schedule of one reduce_scatter
 * (grad_local -> grad) or one all_gather (grad -> weight_full) per step and
 * reports the median step time over --reps steps after warm-up, and the
 * bytes per rank the runtime counted (mfsdp_stats.bytes: the ring model for
 * the padded form, the used prefixes for the prefix form, docs/runtime.md).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_rt.h"
#include "mf_test_builder.h"
#include "mfsdp.h"
#include "mfsdp_mpi.h"

#define D 512
#define NT 8
#define RANKS 4

static const char *const NAMES[NT] = {"b.gate", "b.up", "b.down", "b.q", "b.k", "b.v", "b.o", "b.norms"};
static const int64_t NUMEL[NT] = {D * 1408, D * 1408, D * 1408, D * D, D * D, D * D, D * D, 2 * D};
static const int OWNER[NT] = {0, 1, 2, 3, 3, 3, 0, 1};

/* One schedule: the bucket (whole or Flat) and one collective per step. */
static mfsdp_schedule *schedule(bool whole, mf_opkind kind, int64_t *L_out)
{
    int64_t load[RANKS] = {0}, at[NT], end = 0;
    for (int k = 0; k < NT; k++) {
        at[k] = whole ? load[OWNER[k]] : end;
        if (whole)
            load[OWNER[k]] += NUMEL[k];
        end += NUMEL[k];
    }
    int64_t S = 0, q = 128;
    for (int r = 0; r < RANKS; r++)
        S = load[r] > S ? load[r] : S;
    S = (S + q - 1) / q * q;
    int64_t L = whole ? RANKS * S : (end + RANKS * q - 1) / (RANKS * q) * (RANKS * q);
    mf_tb_spec spec;
    mf_tb_spec_1d(&spec, RANKS, MF_REDUCE_SUM);
    spec.layouts[0] = (mf_tb_layout){{MF_FP32, MF_FP32, MF_FP32}, {"F", "F", "F"}};
    spec.units[0] = (mf_tb_unit){"b", false, 1, {{"t", L, 0}}};
    char err[256];
    mf_schedule *s = mf_tb_build(&spec, err, sizeof err);
    if (!s || s->buckets[0].length != L) {
        fprintf(stderr, "mfsdp-whole-comm-bench: cannot build the schedule: %s\n", s ? "padded" : err);
        return NULL;
    }
    mf_bucket *b = &s->buckets[0];
    mf_tensor *t = mf_arena_array(s->arena, NT, sizeof *t);
    for (int k = 0; k < NT; k++)   /* in offset order */
        t[k] = (mf_tensor){.name = NAMES[k], .ndims = 1, .dims = {NUMEL[k]}, .numel = NUMEL[k],
                           .offset = (whole ? OWNER[k] * S : 0) + at[k]};
    for (int i = 1; i < NT; i++)
        for (int j = i; j > 0 && t[j].offset < t[j - 1].offset; j--) {
            mf_tensor x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    b->tensors = t;
    b->ntensors = NT;
    b->used = t[NT - 1].offset + t[NT - 1].numel;
    b->whole[MF_ROLE_GRAD] = b->whole[MF_ROLE_MAIN_WEIGHT] = whole;
    int local = -1, grad = -1, full = -1;
    for (int i = 0; i < s->nbuffers; i++) {
        local = s->buffers[i].kind == MF_BUF_GRAD_LOCAL ? i : local;
        grad = s->buffers[i].kind == MF_BUF_GRAD ? i : grad;
        full = s->buffers[i].kind == MF_BUF_WEIGHT_FULL ? i : full;
    }
    mf_op *ops = mf_arena_array(s->arena, 3, sizeof *ops);
    ops[0] = (mf_op){.id = 0, .phase = MF_PHASE_STEP_BEGIN, .unit = -1, .when = MF_WHEN_EVERY,
                     .stream = MF_STREAM_INNER, .kind = kind, .bucket = 0, .axis = 0, .dtype = MF_FP32,
                     .count = L / RANKS, .event = -1,
                     .src = kind == MF_OP_REDUCE_SCATTER ? local : grad,
                     .dst = kind == MF_OP_REDUCE_SCATTER ? grad : full};
    mf_tb_step_begin_fence(ops, 1);
    s->ops = ops;
    s->nops = 3;
    s->nevents = 1;
    mf_schedule_summarize(s);
    mfsdp_schedule *h = NULL;
    if (mf_rt_schedule_wrap(s, &h, err, sizeof err) != MFSDP_OK) {
        fprintf(stderr, "mfsdp-whole-comm-bench: %s\n", err);
        return NULL;
    }
    *L_out = L;
    return h;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds per step and bytes per rank per step of one configuration. */
static int measure(bool whole, const char *form, mf_opkind kind, int reps, double *sec, int64_t *bytes,
                   int64_t *L)
{
    mfsdp_schedule *sh = schedule(whole, kind, L);
    if (!sh)
        return 1;
    if (form)
        setenv("MFSDP_WHOLE_COLLECTIVES", form, 1);
    else
        unsetenv("MFSDP_WHOLE_COLLECTIVES");
    MPI_Comm comm = MPI_COMM_WORLD;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_mpi(&cfg, &comm);
    cfg.timeout_ms = 120000;
    mfsdp_runtime *rt = NULL;
    if (mfsdp_create(sh, &cfg, &rt) != MFSDP_OK) {
        fprintf(stderr, "create: %s\n", mfsdp_last_error(NULL));
        mfsdp_schedule_free(sh);
        return 1;
    }
    double *t = calloc((size_t)reps, sizeof *t);
    int bad = !t;
    for (int i = -3; i < reps && !bad; i++) {   /* 3 warm-up steps */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        bad = mfsdp_step_begin(rt) || mfsdp_forward_pre(rt, 0, 0) || mfsdp_forward_post(rt, 0, 0) ||
              mfsdp_backward_pre(rt, 0, 0) || mfsdp_backward_post(rt, 0, 0) || mfsdp_step_end(rt);
        double dt = MPI_Wtime() - t0, worst = dt;
        MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (i >= 0)
            t[i] = worst;
    }
    mfsdp_stats st;
    if (!bad && mfsdp_get_stats(rt, &st) == MFSDP_OK) {
        int64_t mine = st.bytes[0] / st.steps, most = mine;
        MPI_Allreduce(&mine, &most, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        *bytes = most;
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        *sec = t[reps / 2];
    }
    if (bad)
        fprintf(stderr, "step: %s\n", mfsdp_last_error(rt));
    free(t);
    mfsdp_destroy(rt);
    mfsdp_schedule_free(sh);
    unsetenv("MFSDP_WHOLE_COLLECTIVES");
    return bad;
}

int main(int argc, char **argv)
{
    int provided, me, n;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int reps = argc >= 3 && !strcmp(argv[1], "--reps") ? atoi(argv[2]) : 20;
    if (n != RANKS || reps < 1) {
        if (me == 0)
            fprintf(stderr, "mfsdp-whole-comm-bench: run under mpirun -np %d [--reps N]\n", RANKS);
        MPI_Finalize();
        return 2;
    }
    int64_t used = 0;
    for (int k = 0; k < NT; k++)
        used += NUMEL[k];
    if (me == 0)
        printf("Llama-like block, D = %d, %lld fp32 elements; 4 MPI ranks, median of %d steps\n"
               "%-15s %-14s %-7s %10s %12s %10s %8s\n",
               D, (long long)used, reps, "op", "bucket", "form", "L", "bytes/rank", "ms", "vs ring");
    static const struct {
        bool whole;
        const char *form;
        const char *label;
    } cfgs[] = {{false, NULL, "flat (ring)"}, {true, "padded", "whole"}, {true, "prefix", "whole"}};
    mf_opkind kinds[2] = {MF_OP_REDUCE_SCATTER, MF_OP_ALL_GATHER};
    int bad = 0;
    for (int k = 0; k < 2 && !bad; k++) {
        double ring = 0;
        for (int c = 0; c < 3 && !bad; c++) {
            double sec = 0;
            int64_t bytes = 0, L = 0;
            bad = measure(cfgs[c].whole, cfgs[c].form, kinds[k], reps, &sec, &bytes, &L);
            if (c == 0)
                ring = sec;
            if (!bad && me == 0)
                printf("%-15s %-14s %-7s %10lld %12lld %10.3f %7.2fx\n", mf_opkind_name(kinds[k]),
                       cfgs[c].label, cfgs[c].form ? cfgs[c].form : "-", (long long)L,
                       (long long)bytes, sec * 1e3, ring > 0 ? sec / ring : 0.0);
        }
    }
    MPI_Finalize();
    return bad;
}
