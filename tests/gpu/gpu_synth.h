/*
 * Hand-built schedules for the GPU backends' logic tests, written the way the
 * lowering pass writes them (docs/schedule.md §3), so the tests of the device plan do
 * not depend on the compiler:
 *
 *   synth_hfsdp(O, I, M, U, B): mesh [dp_outer=O, dp_inner=I], U units of B
 *   buckets, weight bf16 [R,F], grad fp32 [P,F], main_weight fp32 [F,F]:
 *     forward_pre  first  outer: wait step, cast main->stage, AG outer, record w
 *     forward_pre  every  inner: wait w (all buckets), AG inner per bucket,
 *                                record full; compute: wait full
 *     backward_pre every  inner: AG inner per bucket, record full; compute: wait
 *     backward_post every compute: record g; inner: wait g, RS inner + accumulate
 *                                per bucket; last: record rs; outer: wait rs,
 *                                RS outer per bucket, record fin
 *     step_begin: compute record step;  step_end: compute wait fin per unit
 *   synth_zero1_slice(N, M): mesh [dp=N], one unit, weight bf16 [R],
 *   grad fp32 [P] accumulated locally, all_reduce at last, then a slice to the
 *   fp32 [F] delivered gradient.
 *
 * Each builder returns an owned schedule (mf_schedule_free) or NULL on OOM.
 */
#ifndef GPU_SYNTH_H
#define GPU_SYNTH_H

#include <stdio.h>
#include <string.h>

#include "mf_schedule.h"

typedef struct synth {
    mf_schedule *s;
    int cap_ops;
} synth;

static mf_op *synth_op(synth *b, mf_phase ph, int unit, mf_when w, mf_stream st, mf_opkind k)
{
    if (b->s->nops >= b->cap_ops)
        return NULL;
    mf_op *op = &b->s->ops[b->s->nops];
    *op = (mf_op){.id = b->s->nops, .phase = ph, .unit = unit, .when = w, .stream = st, .kind = k,
                  .bucket = -1, .axis = -1, .src = -1, .dst = -1, .event = -1, .dtype = MF_FP32};
    b->s->nops++;
    return op;
}

static void synth_event(synth *b, mf_phase ph, int unit, mf_when w, mf_stream st, mf_opkind k, int ev)
{
    mf_op *op = synth_op(b, ph, unit, w, st, k);
    if (op)
        op->event = ev;
}

static void synth_data(synth *b, mf_phase ph, int unit, mf_when w, mf_stream st, mf_opkind k, int bucket,
                       int axis, mf_dtype dt, int64_t count, int src, int dst, int transition)
{
    mf_op *op = synth_op(b, ph, unit, w, st, k);
    if (!op)
        return;
    op->bucket = bucket;
    op->axis = axis;
    op->dtype = dt;
    op->count = count;
    op->src = src;
    op->dst = dst;
    op->transition = transition;
}

static mf_placement synth_place(const char *letters)
{
    mf_placement p = {{0}};
    for (int j = 0; letters[j] && j < MF_MAX_AXES; j++)
        p.p[j] = letters[j] == 'F' ? MF_PLACE_FLAT : letters[j] == 'P' ? MF_PLACE_PARTIAL : MF_PLACE_REPLICATE;
    return p;
}

static int synth_buffer(mf_schedule *s, int bucket, mf_bufkind kind, mf_dtype dt, const char *place,
                        int64_t count, mf_lifetime life)
{
    mf_buffer *buf = &s->buffers[s->nbuffers];
    *buf = (mf_buffer){.name = mf_bufkind_name(kind), .bucket = bucket, .kind = kind, .dtype = dt,
                       .place = synth_place(place), .count = count, .lifetime = life};
    return s->nbuffers++;
}

static bool synth_alloc(synth *b, int naxes, const int64_t *sizes, int64_t M, int nunits, int nbuckets,
                        int nbuffers, int nops, int nevents)
{
    mf_schedule *s = mf_schedule_new();
    if (!s)
        return false;
    b->s = s;
    s->mesh.naxes = naxes;
    s->mesh.world = 1;
    static const char *const names2[] = {"dp_outer", "dp_inner"};
    for (int j = 0; j < naxes; j++) {
        s->mesh.axes[j].name = naxes == 1 ? "dp" : names2[j];
        s->mesh.axes[j].size = sizes[j];
        s->mesh.world *= sizes[j];
    }
    s->microbatches = M;
    s->reduce = MF_REDUCE_AVG;
    s->nunits = nunits;
    s->nbuckets = nbuckets;
    s->nevents = nevents;
    s->units = mf_arena_array(s->arena, (size_t)nunits, sizeof *s->units);
    s->buckets = mf_arena_array(s->arena, (size_t)nbuckets, sizeof *s->buckets);
    s->buffers = mf_arena_array(s->arena, (size_t)nbuffers, sizeof *s->buffers);
    s->ops = mf_arena_array(s->arena, (size_t)nops, sizeof *s->ops);
    b->cap_ops = nops;
    if (!s->units || !s->buckets || !s->buffers || !s->ops) {
        mf_schedule_free(s);
        return false;
    }
    return true;
}

/* Events of synth_hfsdp: step, then per unit u: w, full, g, rs, fin. */
enum { SY_STEP = 0, SY_W = 1, SY_FULL, SY_G, SY_RS, SY_FIN, SY_PER_UNIT = 5 };
static int sy_ev(int u, int which) { return 1 + u * SY_PER_UNIT + (which - SY_W); }

static mf_schedule *synth_hfsdp(int64_t O, int64_t I, int64_t M, int U, int B)
{
    synth b;
    int64_t sizes[2] = {O, I};
    int nb = U * B, nbuf = nb * 8, nops = 2 + U * (6 + B * 9 + 10) + U * 2;
    if (!synth_alloc(&b, 2, sizes, M, U, nb, nbuf, nops, 1 + U * SY_PER_UNIT))
        return NULL;
    mf_schedule *s = b.s;
    int64_t L = O * I * 64; /* elements per bucket, divisible by every shard count */
    int (*buf)[8] = calloc((size_t)nb, sizeof *buf);
    if (!buf) {
        mf_schedule_free(s);
        return NULL;
    }
    for (int u = 0; u < U; u++) {
        char name[32];
        snprintf(name, sizeof name, "layers.%d", u);
        s->units[u] = (mf_unit){.name = mf_arena_strdup(s->arena, name), .reshard_after_forward = true,
                                .first_bucket = u * B, .nbuckets = B};
        for (int k = 0; k < B; k++) {
            int bk = u * B + k;
            mf_bucket *bu = &s->buckets[bk];
            bu->name = mf_arena_printf(s->arena, "%s/b%d", name, k);
            bu->unit = bu->last_unit = u;
            bu->length = bu->used = L;
            bu->dtype[MF_ROLE_WEIGHT] = MF_BF16;
            bu->dtype[MF_ROLE_GRAD] = MF_FP32;
            bu->dtype[MF_ROLE_MAIN_WEIGHT] = MF_FP32;
            buf[bk][0] = synth_buffer(s, bk, MF_BUF_MAIN_WEIGHT, MF_FP32, "FF", L / (O * I), MF_LIFETIME_PERSISTENT);
            buf[bk][1] = synth_buffer(s, bk, MF_BUF_WEIGHT_STAGE, MF_BF16, "FF", L / (O * I), MF_LIFETIME_STEP);
            buf[bk][2] = synth_buffer(s, bk, MF_BUF_WEIGHT, MF_BF16, "RF", L / I, MF_LIFETIME_PERSISTENT);
            buf[bk][3] = synth_buffer(s, bk, MF_BUF_WEIGHT_FULL, MF_BF16, "RR", L, MF_LIFETIME_MICROBATCH);
            buf[bk][4] = synth_buffer(s, bk, MF_BUF_GRAD_LOCAL, MF_FP32, "PP", L, MF_LIFETIME_MICROBATCH);
            buf[bk][5] = synth_buffer(s, bk, MF_BUF_GRAD, MF_FP32, "PF", L / I, MF_LIFETIME_STEP);
            buf[bk][6] = synth_buffer(s, bk, MF_BUF_GRAD_FINAL, MF_FP32, "FF", L / (O * I), MF_LIFETIME_STEP);
            buf[bk][7] = synth_buffer(s, bk, MF_BUF_GRAD_STAGE, MF_FP32, "PF", L / I, MF_LIFETIME_MICROBATCH);
        }
    }
    synth_event(&b, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_RECORD, SY_STEP);
    const mf_stream IN = MF_STREAM_INNER, OUT = MF_STREAM_OUTER, CO = MF_STREAM_COMPUTE;
    for (int u = 0; u < U; u++) {
        const mf_phase FP = MF_PHASE_FORWARD_PRE;
        synth_event(&b, FP, u, MF_WHEN_FIRST, OUT, MF_OP_WAIT, SY_STEP);
        for (int k = 0; k < B; k++) {
            int bk = u * B + k;
            synth_data(&b, FP, u, MF_WHEN_FIRST, OUT, MF_OP_CAST, bk, -1, MF_BF16, L / (O * I), buf[bk][0],
                       buf[bk][1], 1);
        }
        for (int k = 0; k < B; k++) {
            int bk = u * B + k;
            synth_data(&b, FP, u, MF_WHEN_FIRST, OUT, MF_OP_ALL_GATHER, bk, 0, MF_BF16, L / (O * I),
                       buf[bk][1], buf[bk][2], 1);
        }
        synth_event(&b, FP, u, MF_WHEN_FIRST, OUT, MF_OP_RECORD, sy_ev(u, SY_W));
        synth_event(&b, FP, u, MF_WHEN_EVERY, IN, MF_OP_WAIT, sy_ev(u, SY_W));
        for (int k = 0; k < B; k++) {
            int bk = u * B + k;
            synth_data(&b, FP, u, MF_WHEN_EVERY, IN, MF_OP_ALL_GATHER, bk, 1, MF_BF16, L / I, buf[bk][2],
                       buf[bk][3], 2);
        }
        synth_event(&b, FP, u, MF_WHEN_EVERY, IN, MF_OP_RECORD, sy_ev(u, SY_FULL));
        synth_event(&b, FP, u, MF_WHEN_EVERY, CO, MF_OP_WAIT, sy_ev(u, SY_FULL));
    }
    for (int u = U - 1; u >= 0; u--) {
        const mf_phase BP = MF_PHASE_BACKWARD_PRE, BQ = MF_PHASE_BACKWARD_POST;
        for (int k = 0; k < B; k++) {
            int bk = u * B + k;
            synth_data(&b, BP, u, MF_WHEN_EVERY, IN, MF_OP_ALL_GATHER, bk, 1, MF_BF16, L / I, buf[bk][2],
                       buf[bk][3], 2);
        }
        synth_event(&b, BP, u, MF_WHEN_EVERY, IN, MF_OP_RECORD, sy_ev(u, SY_FULL));
        synth_event(&b, BP, u, MF_WHEN_EVERY, CO, MF_OP_WAIT, sy_ev(u, SY_FULL));
        synth_event(&b, BQ, u, MF_WHEN_EVERY, CO, MF_OP_RECORD, sy_ev(u, SY_G));
        synth_event(&b, BQ, u, MF_WHEN_EVERY, IN, MF_OP_WAIT, sy_ev(u, SY_G));
        for (int k = 0; k < B; k++) {
            int bk = u * B + k;
            synth_data(&b, BQ, u, MF_WHEN_EVERY, IN, MF_OP_REDUCE_SCATTER, bk, 1, MF_FP32, L / I, buf[bk][4],
                       buf[bk][7], 3);
        }
        for (int k = 0; k < B; k++) {
            int bk = u * B + k;
            synth_data(&b, BQ, u, MF_WHEN_EVERY, IN, MF_OP_ACCUMULATE, bk, -1, MF_FP32, L / I, buf[bk][7],
                       buf[bk][5], 3);
        }
        synth_event(&b, BQ, u, MF_WHEN_LAST, IN, MF_OP_RECORD, sy_ev(u, SY_RS));
        synth_event(&b, BQ, u, MF_WHEN_LAST, OUT, MF_OP_WAIT, sy_ev(u, SY_RS));
        for (int k = 0; k < B; k++) {
            int bk = u * B + k;
            synth_data(&b, BQ, u, MF_WHEN_LAST, OUT, MF_OP_REDUCE_SCATTER, bk, 0, MF_FP32, L / (O * I),
                       buf[bk][5], buf[bk][6], 4);
        }
        synth_event(&b, BQ, u, MF_WHEN_LAST, OUT, MF_OP_RECORD, sy_ev(u, SY_FIN));
    }
    for (int u = 0; u < U; u++)
        synth_event(&b, MF_PHASE_STEP_END, -1, MF_WHEN_EVERY, CO, MF_OP_WAIT, sy_ev(u, SY_FIN));
    free(buf);
    return s;
}

static mf_schedule *synth_zero1_slice(int64_t N, int64_t M)
{
    synth b;
    int64_t sizes[1] = {N};
    if (!synth_alloc(&b, 1, sizes, M, 1, 1, 6, 16, 4))
        return NULL;
    mf_schedule *s = b.s;
    int64_t L = N * 64;
    s->units[0] = (mf_unit){.name = "embed", .reshard_after_forward = false, .first_bucket = 0, .nbuckets = 1};
    s->buckets[0] = (mf_bucket){.name = "embed/ddp", .unit = 0, .last_unit = 0, .length = L, .used = L};
    s->buckets[0].dtype[MF_ROLE_WEIGHT] = MF_BF16;
    int mw = synth_buffer(s, 0, MF_BUF_MAIN_WEIGHT, MF_FP32, "F", L / N, MF_LIFETIME_PERSISTENT);
    int ws = synth_buffer(s, 0, MF_BUF_WEIGHT_STAGE, MF_BF16, "F", L / N, MF_LIFETIME_STEP);
    int w = synth_buffer(s, 0, MF_BUF_WEIGHT, MF_BF16, "R", L, MF_LIFETIME_PERSISTENT);
    int gl = synth_buffer(s, 0, MF_BUF_GRAD_LOCAL, MF_FP32, "P", L, MF_LIFETIME_MICROBATCH);
    int g = synth_buffer(s, 0, MF_BUF_GRAD, MF_FP32, "P", L, MF_LIFETIME_STEP);
    int gf = synth_buffer(s, 0, MF_BUF_GRAD_FINAL, MF_FP32, "F", L / N, MF_LIFETIME_STEP);
    const mf_stream IN = MF_STREAM_INNER, CO = MF_STREAM_COMPUTE;
    synth_event(&b, MF_PHASE_STEP_BEGIN, -1, MF_WHEN_EVERY, CO, MF_OP_RECORD, 0);
    synth_event(&b, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, IN, MF_OP_WAIT, 0);
    synth_data(&b, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, IN, MF_OP_CAST, 0, -1, MF_BF16, L / N, mw, ws, 1);
    synth_data(&b, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, IN, MF_OP_ALL_GATHER, 0, 0, MF_BF16, L / N, ws, w, 1);
    synth_event(&b, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, IN, MF_OP_RECORD, 1);
    synth_event(&b, MF_PHASE_FORWARD_PRE, 0, MF_WHEN_FIRST, CO, MF_OP_WAIT, 1);
    synth_event(&b, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_EVERY, CO, MF_OP_RECORD, 2);
    synth_event(&b, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_EVERY, IN, MF_OP_WAIT, 2);
    synth_data(&b, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_EVERY, IN, MF_OP_ACCUMULATE, 0, -1, MF_FP32, L, gl, g, 3);
    synth_data(&b, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_LAST, IN, MF_OP_ALL_REDUCE, 0, 0, MF_FP32, L, g, g, 4);
    synth_data(&b, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_LAST, IN, MF_OP_SLICE, 0, 0, MF_FP32, L / N, g, gf, 4);
    synth_event(&b, MF_PHASE_BACKWARD_POST, 0, MF_WHEN_LAST, IN, MF_OP_RECORD, 3);
    synth_event(&b, MF_PHASE_STEP_END, -1, MF_WHEN_EVERY, CO, MF_OP_WAIT, 3);
    return s;
}

#endif
