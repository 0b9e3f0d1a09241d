/*
 * mf_verify_memory: the verifier's hazards per memory region
 * (docs/semantics.md §10, docs/schedule.md "The verifier"). Buffers of the
 * transient arena share bytes when their live intervals do not overlap; this
 * replays the runs of mf_schedule_replay_runs (full steps at every microbatch
 * position, short steps, evaluation passes between them), with the trainer's
 * accesses on the compute stream and vector
 * clocks per stream, and tracks, per elementary byte range of the arena, the
 * last write and the latest read per stream. An access by one buffer must come
 * after (through the streams' order and event edges) every access of another
 * buffer to the same bytes that conflicts with it: a write after the other's
 * last write and reads, a read after the other's last write. Accesses of one
 * buffer among themselves are the main verifier's business.
 *
 * Cost: per access, the elementary ranges its buffer covers (a few).
 */
#include "mf_verify_memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_live.h"
#include "mf_int.h"

#define MAX_REPORTS 8

typedef struct acc {
    int buf;                /* -1: none */
    int64_t clock;          /* the accessing stream's own clock at the access */
    int actor;              /* op id, or -1 - unit for the trainer */
    int stream;
} acc;

typedef struct region {
    acc write;
    acc read[MF_STREAM_COUNT];
} region;

typedef struct vm_ctx {
    const mf_schedule *s;
    mf_diag *d;
    int64_t *cut;           /* elementary range boundaries, sorted */
    int ncut;
    region *reg;            /* [ncut - 1] */
    int64_t vc[MF_STREAM_COUNT][MF_STREAM_COUNT];
    int64_t (*ev)[MF_STREAM_COUNT];
    bool *ev_set;
    const char *mbname;
    int errors;
    int *ustart, *ubuf, *ufill; /* per unit: its buckets' weight_full and grad_local */
    int reported[MAX_REPORTS][3];
    int nreported;
} vm_ctx;

static int cmp_i64(const void *x, const void *y)
{
    return mf_cmp_i64(*(const int64_t *)x, *(const int64_t *)y);
}

static int lower(const vm_ctx *c, int64_t x)
{
    int lo = 0, hi = c->ncut;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (c->cut[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void describe(const vm_ctx *c, const acc *a, char *buf, size_t size)
{
    const mf_schedule *s = c->s;
    if (a->actor < 0) {
        snprintf(buf, size, "the trainer's compute of unit %s (on compute)", s->units[-1 - a->actor].name);
        return;
    }
    const mf_op *op = &s->ops[a->actor];
    if (op->axis >= 0)
        snprintf(buf, size, "op %d (%s on %s, %s, stream %s)", op->id, mf_opkind_name(op->kind),
                 s->mesh.axes[op->axis].name, s->buckets[op->bucket].name, mf_stream_name(op->stream));
    else
        snprintf(buf, size, "op %d (%s, %s, stream %s)", op->id, mf_opkind_name(op->kind),
                 op->bucket >= 0 ? s->buckets[op->bucket].name : "-", mf_stream_name(op->stream));
}

static void hazard(vm_ctx *c, const acc *now, bool write, const acc *prev, bool prev_write, int r)
{
    for (int i = 0; i < c->nreported; i++)
        if (c->reported[i][0] == now->actor && c->reported[i][1] == now->buf && c->reported[i][2] == prev->buf)
            return;
    if (c->nreported < MAX_REPORTS) {
        c->reported[c->nreported][0] = now->actor;
        c->reported[c->nreported][1] = now->buf;
        c->reported[c->nreported++][2] = prev->buf;
    }
    char a[256], b[256];
    describe(c, now, a, sizeof a);
    describe(c, prev, b, sizeof b);
    const mf_schedule *s = c->s;
    mf_span none = {0, 0, 0, 0};
    mf_diag_error(c->d, none,
                  "%s %s %s at arena bytes %lld..%lld, which %s %s %s earlier, without an event edge "
                  "from stream %s to stream %s between them (memory reuse, microbatch %s)",
                  a, write ? "writes" : "reads", s->buffers[now->buf].name, (long long)c->cut[r],
                  (long long)c->cut[r + 1], b, prev_write ? "wrote" : "read", s->buffers[prev->buf].name,
                  mf_stream_name(prev->stream), mf_stream_name(now->stream), c->mbname);
    c->errors++;
}

static bool ordered(const vm_ctx *c, const acc *prev, int stream)
{
    return prev->buf < 0 || prev->stream == stream || prev->clock <= c->vc[stream][prev->stream];
}

/* One access of buffer b (transient) by actor on stream st. */
static void touch(vm_ctx *c, int b, bool write, int actor, int st)
{
    const mf_schedule *s = c->s;
    if (b < 0 || !mf_live_in_arena(&s->buffers[b]))
        return;
    acc now = {b, c->vc[st][st], actor, st};
    int lo = lower(c, s->buffers[b].offset), hi = lower(c, s->buffers[b].offset + mf_live_bytes(s, b));
    for (int r = lo; r < hi; r++) {
        region *g = &c->reg[r];
        if (g->write.buf != b && !ordered(c, &g->write, st))
            hazard(c, &now, write, &g->write, true, r);
        if (write)
            for (int t = 0; t < MF_STREAM_COUNT; t++)
                if (g->read[t].buf != b && !ordered(c, &g->read[t], st))
                    hazard(c, &now, true, &g->read[t], false, r);
        if (write) {
            g->write = now;
            for (int t = 0; t < MF_STREAM_COUNT; t++)
                g->read[t].buf = -1;
        } else {
            g->read[st] = now;
        }
    }
}

static void run_op(vm_ctx *c, const mf_op *op)
{
    int st = op->stream;
    if (op->kind == MF_OP_WAIT) {
        if (op->event >= 0 && c->ev_set[op->event])
            for (int k = 0; k < MF_STREAM_COUNT; k++)
                if (c->ev[op->event][k] > c->vc[st][k])
                    c->vc[st][k] = c->ev[op->event][k];
        return;
    }
    c->vc[st][st]++;
    if (op->kind == MF_OP_RECORD) {
        if (op->event >= 0) {
            memcpy(c->ev[op->event], c->vc[st], sizeof c->vc[st]);
            c->ev_set[op->event] = true;
        }
        return;
    }
    touch(c, op->src, op->src == op->dst, op->id, st);
    if (op->dst != op->src)
        touch(c, op->dst, true, op->id, st);
}

/* The trainer after hook (phase, u): reads the unsharded weights it computes
 * with; in backward it also writes grad_local. c->ubuf lists, per unit, the
 * weight_full and grad_local buffers of the buckets that cover it. */
static void trainer(vm_ctx *c, mf_phase phase, int u)
{
    const mf_schedule *s = c->s;
    c->vc[MF_STREAM_COMPUTE][MF_STREAM_COMPUTE]++;
    for (int i = c->ustart[u]; i < c->ustart[u + 1]; i++) {
        int b = c->ubuf[i];
        if (s->buffers[b].kind == MF_BUF_WEIGHT_FULL)
            touch(c, b, false, -1 - u, MF_STREAM_COMPUTE);
        else if (phase == MF_PHASE_BACKWARD_PRE)
            touch(c, b, true, -1 - u, MF_STREAM_COMPUTE);
    }
}

static bool trainer_buffer(const mf_buffer *bf)
{
    return bf->kind == MF_BUF_WEIGHT_FULL || bf->kind == MF_BUF_GRAD_LOCAL;
}

/* Fills ustart/ubuf (counting sort by unit); false on OOM. */
static bool index_units(vm_ctx *c)
{
    const mf_schedule *s = c->s;
    c->ustart = calloc((size_t)s->nunits + 1, sizeof *c->ustart);
    c->ufill = calloc((size_t)s->nunits + 1, sizeof *c->ufill);
    if (!c->ustart || !c->ufill)
        return false;
    for (int b = 0; b < s->nbuffers; b++)
        if (trainer_buffer(&s->buffers[b]))
            for (int u = s->buckets[s->buffers[b].bucket].unit; u <= s->buckets[s->buffers[b].bucket].last_unit; u++)
                c->ustart[u + 1]++;
    for (int u = 0; u < s->nunits; u++)
        c->ustart[u + 1] += c->ustart[u];
    c->ubuf = malloc(sizeof *c->ubuf * (size_t)(c->ustart[s->nunits] + 1));
    if (!c->ubuf)
        return false;
    memcpy(c->ufill, c->ustart, sizeof *c->ufill * (size_t)s->nunits);
    for (int b = 0; b < s->nbuffers; b++)
        if (trainer_buffer(&s->buffers[b]))
            for (int u = s->buckets[s->buffers[b].bucket].unit; u <= s->buckets[s->buffers[b].bucket].last_unit; u++)
                c->ubuf[c->ufill[u]++] = b;
    return true;
}

/* Runs the ops of hook (phase, u) whose predicate holds at `pos` (MF_POS_*),
 * then the trainer's accesses. */
static void hook(vm_ctx *c, const int *list, int n, mf_phase phase, int u, unsigned pos)
{
    const mf_schedule *s = c->s;
    for (int i = 0; i < n; i++) {
        const mf_op *op = &s->ops[list[i]];
        if (op->phase == phase && (u < 0 || op->unit == u) &&
            mf_when_holds(op->when, pos))
            run_op(c, op);
    }
    if (phase == MF_PHASE_FORWARD_PRE || phase == MF_PHASE_BACKWARD_PRE || phase == MF_PHASE_EVAL_PRE)
        trainer(c, phase, u);
}

/* The list of hook (phase, u): training hooks in mf_live_hook order, then
 * the evaluation hooks by unit. */
static int hook_key(const mf_schedule *s, mf_phase phase, int u)
{
    return mf_phase_is_eval(phase) ? 4 * s->nunits + 2 + u : mf_live_hook(s, phase, u);
}

static void run_hook(vm_ctx *c, const int *start, const int *ops, mf_phase phase, int u, unsigned pos)
{
    int h = hook_key(c->s, phase, u);
    hook(c, ops + start[h], start[h + 1] - start[h], phase, u, pos);
}

/* A step of nrun microbatch positions out of nmb (fewer: a short step). */
static void replay_step(vm_ctx *c, const int *start, const int *ops, int nrun, int nmb)
{
    const mf_schedule *s = c->s;
    static const char *const names[3][3] = {{"only", "", ""}, {"first", "last", ""}, {"first", "middle", "last"}};
    static const char *const short_names[2] = {"first (short step)", "middle (short step)"};
    bool full = nrun == nmb;
    c->mbname = full ? "first" : short_names[0];
    run_hook(c, start, ops, MF_PHASE_STEP_BEGIN, -1, MF_POS_FIRST | MF_POS_LAST);
    for (int m = 0; m < nrun; m++) {
        unsigned pos = (m == 0 ? MF_POS_FIRST : 0) | (full && m == nmb - 1 ? MF_POS_LAST : 0);
        c->mbname = full ? names[nmb - 1][m] : short_names[m > 0];
        for (int u = 0; u < s->nunits; u++)
            for (int p = MF_PHASE_FORWARD_PRE; p <= MF_PHASE_FORWARD_POST; p++)
                run_hook(c, start, ops, (mf_phase)p, u, pos);
        for (int u = s->nunits - 1; u >= 0; u--)
            for (int p = MF_PHASE_BACKWARD_PRE; p <= MF_PHASE_BACKWARD_POST; p++)
                run_hook(c, start, ops, (mf_phase)p, u, pos);
    }
    run_hook(c, start, ops, MF_PHASE_STEP_END, -1, full ? MF_POS_FIRST | MF_POS_LAST : MF_POS_SHORT);
}

static void replay_eval(vm_ctx *c, const int *start, const int *ops)
{
    c->mbname = "evaluation pass";
    for (int u = 0; u < c->s->nunits; u++) {
        run_hook(c, start, ops, MF_PHASE_EVAL_PRE, u, MF_POS_FIRST | MF_POS_LAST);
        run_hook(c, start, ops, MF_PHASE_EVAL_POST, u, MF_POS_FIRST | MF_POS_LAST);
    }
}

int mf_verify_memory(const mf_schedule *s, mf_diag *d)
{
    vm_ctx c = {.s = s, .d = d};
    int nh = 5 * s->nunits + 2, rc = -1;
    int *start = calloc((size_t)nh + 1, sizeof *start), *ops = malloc(sizeof *ops * (size_t)(s->nops + 1));
    int *fill = malloc(sizeof *fill * (size_t)(nh + 1));
    c.cut = malloc(sizeof *c.cut * (size_t)(2 * s->nbuffers + 2));
    c.ev = calloc((size_t)s->nevents + 1, sizeof *c.ev);
    c.ev_set = calloc((size_t)s->nevents + 1, sizeof *c.ev_set);
    if (!start || !ops || !fill || !c.cut || !c.ev || !c.ev_set)
        goto done;
    for (int b = 0; b < s->nbuffers; b++)
        if (mf_live_in_arena(&s->buffers[b])) {
            c.cut[c.ncut++] = s->buffers[b].offset;
            c.cut[c.ncut++] = s->buffers[b].offset + mf_live_bytes(s, b);
        }
    qsort(c.cut, (size_t)c.ncut, sizeof *c.cut, cmp_i64);
    int m = 0;
    for (int i = 0; i < c.ncut; i++)
        if (m == 0 || c.cut[m - 1] != c.cut[i])
            c.cut[m++] = c.cut[i];
    c.ncut = m;
    c.reg = malloc(sizeof *c.reg * (size_t)(c.ncut + 1));
    if (!c.reg || !index_units(&c))
        goto done;
    for (int r = 0; r <= c.ncut; r++) {
        c.reg[r].write.buf = -1;
        for (int t = 0; t < MF_STREAM_COUNT; t++)
            c.reg[r].read[t].buf = -1;
    }
    for (int i = 0; i < s->nops; i++)
        start[hook_key(s, s->ops[i].phase, s->ops[i].unit) + 1]++;
    for (int h = 0; h < nh; h++)
        start[h + 1] += start[h];
    memcpy(fill, start, sizeof *fill * (size_t)nh);
    for (int i = 0; i < s->nops; i++)
        ops[fill[hook_key(s, s->ops[i].phase, s->ops[i].unit)]++] = i;
    int runs[MF_REPLAY_RUNS_MAX], nruns = mf_schedule_replay_runs(s, runs);
    int nmb = s->microbatches >= 3 ? 3 : (int)s->microbatches;
    for (int r = 0; r < nruns; r++) {
        if (runs[r] == 0)
            replay_eval(&c, start, ops);
        else
            replay_step(&c, start, ops, runs[r], nmb);
    }
    rc = c.errors;
done:
    if (rc < 0) {
        mf_span none = {0, 0, 0, 0};
        mf_diag_error(d, none, "out of memory while verifying memory reuse");
        rc = 1;
    }
    free(start);
    free(ops);
    free(fill);
    free(c.cut);
    free(c.reg);
    free(c.ev);
    free(c.ev_set);
    free(c.ustart);
    free(c.ubuf);
    free(c.ufill);
    return rc;
}
