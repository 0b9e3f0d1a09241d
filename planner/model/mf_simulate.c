/*
 * mf_simulate: the step simulator behind `mfsdpc simulate` (model and
 * definitions in mf_simulate.h and docs/simulate.md).
 *
 * Stage: reads a verified or loaded mf_schedule (borrowed, never modified)
 * and produces an mf_sim_result: one item per executed op instance and per
 * compute segment, in issue order, with start/end times, the item that fixed
 * each start, and the critical path.
 *
 * Invariants:
 *   - items[] is in issue order; an item's pred and dep are always earlier
 *     items, so times are final once an item is appended;
 *   - on every stream items run in issue order: an item starts at the
 *     latest of the end of the previous item of its stream, the end of the
 *     record its wait matched, and (host-synchronous model) the end of the
 *     compute stream's work issued before it; `pred` names which, so the
 *     critical path has no gaps and covers the step exactly;
 *   - costs come only from mf_cost_op(); this file has no cost formulas.
 */
#include "mf_simulate.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mf_diag.h"
#include "mf_free.h"
#include "mf_layout.h"

void mf_sim_config_defaults(mf_sim_config *cfg, const mf_mesh *mesh)
{
    memset(cfg, 0, sizeof *cfg);
    mf_cost_defaults(&cfg->cost, mesh);
    cfg->flops = 400e12;
    cfg->tokens = 4096;
}

void mf_sim_result_free(mf_sim_result *r)
{
    if (!r)
        return;
    MF_FREE_ALL(r->items, r->critical, r->exposed_spans);
    memset(r, 0, sizeof *r);
}

/* Unit a tensor of bucket b belongs to: the bucket's unit, or for a bucket
 * merged over several units the one whose name prefixes the tensor's. */
static int tensor_unit(const mf_schedule *s, const mf_bucket *b, const mf_tensor *t)
{
    if (b->last_unit <= b->unit)
        return b->unit;
    for (int u = b->unit; u <= b->last_unit && u < s->nunits; u++) {
        const char *un = s->units[u].name;
        size_t n = un ? strlen(un) : 0;
        if (n && t->name && strncmp(t->name, un, n) == 0 && t->name[n] == '.')
            return u;
    }
    return b->unit;
}

/* Elements of all tensors of unit u (the parameters its compute touches). */
static int64_t unit_params(const mf_schedule *s, int u)
{
    int64_t p = 0;
    for (int bi = 0; bi < s->nbuckets; bi++) {
        const mf_bucket *b = &s->buckets[bi];
        if (u < b->unit || u > (b->last_unit > b->unit ? b->last_unit : b->unit))
            continue;
        for (int ti = 0; ti < b->ntensors; ti++)
            if (tensor_unit(s, b, &b->tensors[ti]) == u)
                p += b->tensors[ti].numel;
    }
    return p;
}

static void times_from_params(const mf_sim_config *cfg, int64_t params, double *fwd, double *bwd)
{
    double total = 0;
    if (cfg->flops > 0)
        total = 6.0 * (double)params * cfg->tokens / cfg->flops;
    *fwd = total / 3.0;
    *bwd = total * 2.0 / 3.0;
}

void mf_simulate_unit_times(const mf_schedule *s, const mf_sim_config *cfg, int u, double *fwd,
                            double *bwd)
{
    if (cfg->fwd_time && cfg->bwd_time) {
        *fwd = cfg->fwd_time[u];
        *bwd = cfg->bwd_time[u];
    } else if (cfg->unit_time > 0) {
        *fwd = cfg->unit_time;
        *bwd = 2.0 * cfg->unit_time;
    } else {
        times_from_params(cfg, unit_params(s, u), fwd, bwd);
    }
}

char *mf_sim_item_label(const mf_schedule *s, const mf_sim_item *it, char *buf, size_t size)
{
    if (it->op < 0) {
        snprintf(buf, size, "%s %s", it->phase == MF_PHASE_BACKWARD_PRE ? "bwd" : "fwd",
                 s->units[it->unit].name);
        return buf;
    }
    const mf_op *op = &s->ops[it->op];
    if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
        snprintf(buf, size, "%s e%d", mf_opkind_name(op->kind), op->event);
    else if (op->bucket >= 0 && op->bucket < s->nbuckets)
        snprintf(buf, size, "%s %s", mf_opkind_name(op->kind), s->buckets[op->bucket].name);
    else
        snprintf(buf, size, "%s %s", mf_opkind_name(op->kind),
                 op->unit >= 0 ? s->units[op->unit].name : mf_phase_name(op->phase));
    return buf;
}

/* Rejects what the simulator cannot interpret, with the op id. */
static int check_schedule(const mf_schedule *s, const mf_sim_config *cfg, char *err, size_t errlen)
{
    if (s->microbatches < 1 || s->microbatches > INT32_MAX) {
        mf_diag_errf(err, errlen, "microbatches %lld out of range", (long long)s->microbatches);
        return -1;
    }
    if (s->nunits < 0 || (s->nunits > 0 && !s->units)) {
        mf_diag_errf(err, errlen, "schedule has no units array");
        return -1;
    }
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        bool step_phase = op->phase == MF_PHASE_STEP_BEGIN || op->phase == MF_PHASE_STEP_END;
        if ((int)op->phase < 0 || op->phase >= MF_PHASE_COUNT) {
            mf_diag_errf(err, errlen, "op %d: phase out of range", i);
            return -1;
        }
        if (step_phase ? op->unit != -1 : (op->unit < 0 || op->unit >= s->nunits)) {
            mf_diag_errf(err, errlen, "op %d: unit %d out of range for phase %s", i, op->unit,
                         mf_phase_name(op->phase));
            return -1;
        }
        if ((int)op->stream < 0 || op->stream >= MF_STREAM_COUNT) {
            mf_diag_errf(err, errlen, "op %d: stream out of range", i);
            return -1;
        }
        if ((int)op->kind < 0 || op->kind >= MF_OPKIND_COUNT ||
            (int)op->when < 0 || op->when >= MF_WHEN_COUNT) {
            mf_diag_errf(err, errlen, "op %d: kind or predicate out of range", i);
            return -1;
        }
        if (mf_opkind_is_collective(op->kind) && (op->axis < 0 || op->axis >= s->mesh.naxes)) {
            mf_diag_errf(err, errlen, "op %d: %s on axis %d, the mesh has %d axes", i,
                         mf_opkind_name(op->kind), op->axis, s->mesh.naxes);
            return -1;
        }
        if ((op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT) &&
            (op->event < 0 || op->event >= s->nevents)) {
            mf_diag_errf(err, errlen, "op %d: event %d out of range (%d events)", i, op->event,
                         s->nevents);
            return -1;
        }
    }
    if (cfg->fwd_time && !cfg->bwd_time) {
        mf_diag_errf(err, errlen, "per-unit forward times given without backward times");
        return -1;
    }
    return 0;
}

/* Ops grouped by hook: ops of (phase, unit) are idx[start[k] .. start[k+1]) in
 * id order, with k = phase * (nunits + 1) + unit + 1. */
typedef struct hook_index {
    int *start;
    int *idx;
    int nunits;
} hook_index;

static int hook_key(const hook_index *h, mf_phase p, int unit)
{
    return (int)p * (h->nunits + 1) + unit + 1;
}

static int build_hook_index(const mf_schedule *s, hook_index *h)
{
    h->nunits = s->nunits;
    size_t nkeys = (size_t)MF_PHASE_COUNT * ((size_t)s->nunits + 1);
    h->start = calloc(nkeys + 1, sizeof *h->start);
    h->idx = malloc(((size_t)s->nops + 1) * sizeof *h->idx);
    if (!h->start || !h->idx)
        return -1;
    for (int i = 0; i < s->nops; i++)
        h->start[hook_key(h, s->ops[i].phase, s->ops[i].unit) + 1]++;
    for (size_t k = 0; k < nkeys; k++)
        h->start[k + 1] += h->start[k];
    int *fill = malloc((nkeys + 1) * sizeof *fill);
    if (!fill)
        return -1;
    memcpy(fill, h->start, (nkeys + 1) * sizeof *fill);
    for (int i = 0; i < s->nops; i++)
        h->idx[fill[hook_key(h, s->ops[i].phase, s->ops[i].unit)]++] = i;
    free(fill);
    return 0;
}

/* A full step's hook at microbatch m (step hooks: once, at both ends). */
static bool when_holds(mf_when w, mf_phase p, int64_t m, int64_t M)
{
    if (mf_phase_is_step(p))
        return mf_when_holds(w, MF_POS_FIRST | MF_POS_LAST);
    return mf_when_holds(w, (m == 0 ? MF_POS_FIRST : 0) | (m == M - 1 ? MF_POS_LAST : 0));
}

/* The running state of the simulation. */
typedef struct sim {
    const mf_schedule *s;
    const mf_sim_config *cfg;
    mf_sim_result *r;
    int cap;
    double stream_end[MF_STREAM_COUNT];
    int stream_last[MF_STREAM_COUNT];
    int *last_record;       /* per event: item index of the latest record issued, -1 */
    double *rec_end;        /* per event: end of that record */
    int *rec_stream;        /* per event: stream of that record */
    double *fwd, *bwd;      /* per unit seconds */
    double *dur;            /* per op: seconds of one instance (mf_cost_op; the same every microbatch) */
    int64_t *ibytes;        /* per op: bytes of one instance */
    bool *coll;             /* per op: a collective */
    void *block;            /* owns the arrays above */
} sim;

static mf_sim_item *append(sim *st, mf_stream stream, double dur)
{
    mf_sim_result *r = st->r;
    mf_sim_item *it = &r->items[r->nitems];
    memset(it, 0, sizeof *it);
    it->stream = stream;
    it->dep = -1;
    it->pred = st->stream_last[stream];
    it->start = st->stream_end[stream];
    it->end = it->start + dur;
    return it;
}

static void commit(sim *st, mf_sim_item *it)
{
    int idx = st->r->nitems++;
    st->stream_end[it->stream] = it->end;
    st->stream_last[it->stream] = idx;
    st->r->busy[it->stream] += it->end - it->start;
}

static void issue_op(sim *st, int opid, int unit, int m)
{
    const mf_schedule *s = st->s;
    const mf_op *op = &s->ops[opid];
    mf_sim_result *r = st->r;
    mf_stream stream = op->stream;
    if (st->cfg->single_stream && stream == MF_STREAM_OUTER)
        stream = MF_STREAM_INNER;

    double dur = st->dur[opid];

    mf_sim_item *it = append(st, stream, dur);
    it->op = opid;
    it->unit = unit;
    it->microbatch = m;
    it->phase = op->phase;
    /* Host-synchronous trainer: the hook is called once the compute stream
     * has finished everything issued before it. */
    if (!st->cfg->host_async && stream != MF_STREAM_COMPUTE &&
        st->stream_end[MF_STREAM_COMPUTE] > it->start) {
        it->start = st->stream_end[MF_STREAM_COMPUTE];
        it->pred = st->stream_last[MF_STREAM_COMPUTE];
        it->host_gated = true;
    }
    if (op->kind == MF_OP_WAIT) {
        int rec = st->last_record[op->event];
        if (rec < 0) {
            r->unmatched_waits++;
        } else {
            it->dep = rec;
            if (st->rec_stream[op->event] == (int)stream)
                r->same_stream_waits++;
            else if (st->rec_end[op->event] > it->start) {
                it->start = st->rec_end[op->event];
                it->pred = rec;
                it->blocked = true;
                it->host_gated = false;
            }
        }
    }
    it->end = it->start + dur;
    it->bytes = st->ibytes[opid];
    if (st->coll[opid]) {
        r->bytes[op->axis] += it->bytes;
        r->launches[op->axis]++;
    }
    commit(st, it);
    if (op->kind == MF_OP_RECORD) {
        st->last_record[op->event] = r->nitems - 1;
        st->rec_end[op->event] = it->end;
        st->rec_stream[op->event] = (int)stream;
    }
}

/* Fills st->dur and st->ibytes: an op's duration and bytes depend on the op
 * only, so they are computed once per op, not once per instance. */
static void op_figures(sim *st)
{
    const mf_schedule *s = st->s;
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        double dur = 0;
        int64_t bytes = mf_layout_op_bytes(s, op);
        if (op->kind != MF_OP_RECORD && op->kind != MF_OP_WAIT)
            dur = mf_cost_op_bytes(&st->cfg->cost, &s->mesh, op->kind, op->axis, op->count, bytes, op->dtype);
        if (!(dur >= 0) || !isfinite(dur))
            dur = 0;
        st->dur[i] = dur;
        st->ibytes[i] = 0;
        st->coll[i] = mf_opkind_is_collective(op->kind);
        if (st->coll[i]) {
            st->ibytes[i] = bytes;
        } else if (op->kind != MF_OP_RECORD && op->kind != MF_OP_WAIT) {
            mf_dtype sd = op->src >= 0 && op->src < s->nbuffers ? s->buffers[op->src].dtype : op->dtype;
            int64_t n = op->count * (int64_t)(mf_dtype_size(sd) + mf_dtype_size(op->dtype));
            /* accumulate also reads its destination */
            st->ibytes[i] = op->kind == MF_OP_ACCUMULATE ? n + op->count * (int64_t)mf_dtype_size(op->dtype) : n;
        }
    }
}

/* issue_op for time_only: the same start and end arithmetic (the stream's
 * end, then the host gate, then the record's end), the same counters, but
 * no item is built. */
static void issue_op_time(sim *st, int opid)
{
    const mf_op *op = &st->s->ops[opid];
    mf_sim_result *r = st->r;
    int stream = op->stream;
    if (st->cfg->single_stream && stream == MF_STREAM_OUTER)
        stream = MF_STREAM_INNER;
    double start = st->stream_end[stream];
    if (!st->cfg->host_async && stream != MF_STREAM_COMPUTE && st->stream_end[MF_STREAM_COMPUTE] > start)
        start = st->stream_end[MF_STREAM_COMPUTE];
    if (op->kind == MF_OP_WAIT) {
        if (st->last_record[op->event] < 0)
            r->unmatched_waits++;
        else if (st->rec_stream[op->event] == stream)
            r->same_stream_waits++;
        else if (st->rec_end[op->event] > start)
            start = st->rec_end[op->event];
    }
    double end = start + st->dur[opid];
    if (st->coll[opid]) {
        r->bytes[op->axis] += st->ibytes[opid];
        r->launches[op->axis]++;
    }
    int idx = r->nitems++;
    st->stream_end[stream] = end;
    r->busy[stream] += end - start;
    if (op->kind == MF_OP_RECORD) {
        st->last_record[op->event] = idx;
        st->rec_end[op->event] = end;
        st->rec_stream[op->event] = stream;
    }
}

static void issue_hook(sim *st, const hook_index *h, mf_phase p, int unit, int m)
{
    if (st->cfg->time_only) {
        int k = hook_key(h, p, unit);
        for (int i = h->start[k]; i < h->start[k + 1]; i++)
            if (when_holds(st->s->ops[h->idx[i]].when, p, m, st->s->microbatches))
                issue_op_time(st, h->idx[i]);
        return;
    }
    int k = hook_key(h, p, unit);
    for (int i = h->start[k]; i < h->start[k + 1]; i++) {
        const mf_op *op = &st->s->ops[h->idx[i]];
        bool step_phase = p == MF_PHASE_STEP_BEGIN || p == MF_PHASE_STEP_END;
        if (when_holds(op->when, p, m, st->s->microbatches))
            issue_op(st, h->idx[i], unit, step_phase ? -1 : m);
    }
}

static void issue_compute(sim *st, int unit, int m, bool backward)
{
    if (st->cfg->time_only) { /* issue_op_time's counterpart */
        double start = st->stream_end[MF_STREAM_COMPUTE];
        double end = start + (backward ? st->bwd[unit] : st->fwd[unit]);
        st->r->compute_time += end - start;
        st->r->nitems++;
        st->stream_end[MF_STREAM_COMPUTE] = end;
        st->r->busy[MF_STREAM_COMPUTE] += end - start;
        return;
    }
    mf_sim_item *it = append(st, MF_STREAM_COMPUTE, backward ? st->bwd[unit] : st->fwd[unit]);
    it->op = -1;
    it->unit = unit;
    it->microbatch = m;
    it->phase = backward ? MF_PHASE_BACKWARD_PRE : MF_PHASE_FORWARD_PRE;
    st->r->compute_time += it->end - it->start;
    commit(st, it);
}

/* Items per step: every op instance plus two compute segments per unit and microbatch. */
static int64_t count_items(const mf_schedule *s)
{
    int64_t n = 2 * (int64_t)s->nunits * s->microbatches;
    for (int i = 0; i < s->nops; i++)
        n += mf_when_runs_per_step(s->ops[i].when, s->ops[i].phase, s->microbatches);
    return n;
}

static int find_critical_path(mf_sim_result *r)
{
    int last = -1;
    for (int i = 0; i < r->nitems; i++)
        if (last < 0 || r->items[i].end >= r->items[last].end)
            last = i;
    int n = 0;
    for (int i = last; i >= 0; i = r->items[i].pred) {
        mf_sim_item *it = &r->items[i];
        it->critical = true;
        r->on_path[it->stream] += it->end - it->start;
        if (it->end > it->start)
            n++;
    }
    r->critical = malloc(((size_t)n + 1) * sizeof *r->critical);
    if (!r->critical)
        return -1;
    r->ncritical = n;
    for (int i = last; i >= 0; i = r->items[i].pred)
        if (r->items[i].end > r->items[i].start)
            r->critical[--n] = i;
    return 0;
}

/* Attributes the compute-idle interval [a, b) to the communication that
 * held it: walks the chain of items that fixed the start times back from
 * item `from` (which ends at or after b) and charges each one's overlap
 * with [a, b) to its stream. The chain is gapless, so [a, b) is covered
 * exactly; it cannot reach a compute item inside [a, b) since compute is
 * idle there. */
static int attribute_idle(mf_sim_result *r, int from, double a, double b, mf_vec *spans)
{
    for (int i = from; i >= 0 && b > a; i = r->items[i].pred) {
        const mf_sim_item *it = &r->items[i];
        if (it->end <= a || it->stream == MF_STREAM_COMPUTE)
            break;
        double t0 = it->start > a ? it->start : a, t1 = it->end < b ? it->end : b;
        if (t1 > t0) {
            r->exposed[it->stream] += t1 - t0;
            mf_sim_span *sp = mf_vec_push(spans);
            if (!sp)
                return -1;
            *sp = (mf_sim_span){t0, t1, it->stream, i};
        }
        b = t0 < b ? t0 : b;
    }
    return 0;
}

static int span_cmp(const void *x, const void *y)
{
    const mf_sim_span *a = x, *b = y;
    return a->t0 < b->t0 ? -1 : a->t0 > b->t0;
}

/* Exposed communication: every interval in which the compute stream is
 * idle, charged to the stream that compute is (transitively) waiting for.
 * Compute is idle before a blocked wait (back to the previous compute-stream
 * item) and after its last item until the step ends. Spans are appended in
 * reverse time order per interval and sorted at the end. */
static int find_exposed(mf_sim_result *r, double compute_end)
{
    mf_vec spans;
    mf_vec_init(&spans, sizeof(mf_sim_span));
    int rc = 0;
    double prev_end = 0;
    for (int i = 0; i < r->nitems && rc == 0; i++) {
        const mf_sim_item *it = &r->items[i];
        if (it->stream != MF_STREAM_COMPUTE)
            continue;
        if (it->blocked && it->start > prev_end)
            rc = attribute_idle(r, it->dep, prev_end, it->start, &spans);
        prev_end = it->end;
    }
    if (rc == 0 && r->step_time > compute_end && r->ncritical > 0)
        rc = attribute_idle(r, r->critical[r->ncritical - 1], compute_end, r->step_time, &spans);
    if (rc != 0) {
        mf_vec_free(&spans);
        return -1;
    }
    r->nexposed_spans = (int)spans.len;
    r->exposed_spans = spans.data; /* malloc'ed by mf_vec; freed with the result */
    if (r->nexposed_spans > 1)
        qsort(r->exposed_spans, (size_t)r->nexposed_spans, sizeof *r->exposed_spans, span_cmp);
    return 0;
}

int mf_simulate(const mf_schedule *s, const mf_sim_config *cfg, mf_sim_result *r, char *err,
                size_t errlen)
{
    memset(r, 0, sizeof *r);
    if (check_schedule(s, cfg, err, errlen) != 0)
        return -1;
    int64_t nitems = count_items(s);
    if (nitems > INT32_MAX / 2) {
        mf_diag_errf(err, errlen, "too many op instances per step (%lld, limit is %d)",
                     (long long)nitems, INT32_MAX / 2);
        return -1;
    }

    sim st = {.s = s, .cfg = cfg, .r = r, .cap = (int)nitems};
    hook_index h = {0};
    int rc = -1;
    /* time_only keeps no items (issue_op_time, issue_compute) */
    r->items = cfg->time_only ? NULL : malloc(((size_t)nitems + 1) * sizeof *r->items);
    /* the per-event, per-unit and per-op arrays in one block, 8-byte
       elements first */
    size_t ne = (size_t)s->nevents + 1, nu = (size_t)s->nunits + 1, no = (size_t)s->nops + 1;
    st.block = malloc(8 * (ne + 2 * nu + 2 * no) + sizeof(int) * 2 * ne + sizeof(bool) * no);
    if (st.block) {
        st.rec_end = st.block;
        st.fwd = st.rec_end + ne;
        st.bwd = st.fwd + nu;
        st.dur = st.bwd + nu;
        st.ibytes = (int64_t *)(st.dur + no);
        st.last_record = (int *)(st.ibytes + no);
        st.rec_stream = st.last_record + ne;
        st.coll = (bool *)(st.rec_stream + ne);
    }
    if ((!r->items && !cfg->time_only) || !st.block || build_hook_index(s, &h) != 0) {
        mf_diag_errf(err, errlen, "out of memory");
        goto cleanup;
    }
    op_figures(&st);
    for (int e = 0; e < s->nevents; e++)
        st.last_record[e] = -1;
    for (int k = 0; k < MF_STREAM_COUNT; k++)
        st.stream_last[k] = -1;
    for (int u = 0; u < s->nunits; u++) {
        mf_simulate_unit_times(s, cfg, u, &st.fwd[u], &st.bwd[u]);
        if (!(st.fwd[u] >= 0) || !(st.bwd[u] >= 0) || !isfinite(st.fwd[u] + st.bwd[u])) {
            mf_diag_errf(err, errlen, "unit %s: compute time is not a finite non-negative number",
                         s->units[u].name);
            goto cleanup;
        }
    }
    /* every tensor belongs to exactly one unit: the sum over units is the sum
       over buckets, without matching names per unit */
    for (int bi = 0; bi < s->nbuckets; bi++)
        for (int ti = 0; ti < s->buckets[bi].ntensors; ti++)
            r->unit_params_total += s->buckets[bi].tensors[ti].numel;

    issue_hook(&st, &h, MF_PHASE_STEP_BEGIN, -1, 0);
    for (int m = 0; m < (int)s->microbatches; m++) {
        for (int u = 0; u < s->nunits; u++) {
            issue_hook(&st, &h, MF_PHASE_FORWARD_PRE, u, m);
            issue_compute(&st, u, m, false);
            issue_hook(&st, &h, MF_PHASE_FORWARD_POST, u, m);
        }
        for (int u = s->nunits - 1; u >= 0; u--) {
            issue_hook(&st, &h, MF_PHASE_BACKWARD_PRE, u, m);
            issue_compute(&st, u, m, true);
            issue_hook(&st, &h, MF_PHASE_BACKWARD_POST, u, m);
        }
    }
    issue_hook(&st, &h, MF_PHASE_STEP_END, -1, 0);

    for (int k = 0; k < MF_STREAM_COUNT; k++)
        if (st.stream_end[k] > r->step_time)
            r->step_time = st.stream_end[k];
    if (cfg->time_only) {
        rc = 0;
        goto cleanup;
    }
    if (find_critical_path(r) != 0 ||
        find_exposed(r, st.stream_end[MF_STREAM_COMPUTE]) != 0) {
        mf_diag_errf(err, errlen, "out of memory");
        goto cleanup;
    }
    r->comm_busy = r->busy[MF_STREAM_INNER] + r->busy[MF_STREAM_OUTER];
    r->comm_exposed = r->exposed[MF_STREAM_INNER] + r->exposed[MF_STREAM_OUTER];
    r->overlap = r->comm_busy > 0 ? (r->comm_busy - r->comm_exposed) / r->comm_busy : 1.0;
    rc = 0;

cleanup:
    free(h.start);
    free(h.idx);
    free(st.block);
    if (rc != 0)
        mf_sim_result_free(r);
    return rc;
}

/* ---- the text report ---- */

/* Formats seconds with a unit chosen for the magnitude. */
static const char *fmt_time(double t, char *buf, size_t size)
{
    double a = fabs(t);
    if (a >= 1.0)
        snprintf(buf, size, "%.3f s", t);
    else if (a >= 1e-3)
        snprintf(buf, size, "%.3f ms", t * 1e3);
    else
        snprintf(buf, size, "%.3f us", t * 1e6);
    return buf;
}

static const char *fmt_bytes(int64_t b, char *buf, size_t size)
{
    double v = (double)b;
    if (v >= 1e9)
        snprintf(buf, size, "%.3f GB", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, size, "%.3f MB", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, size, "%.3f kB", v / 1e3);
    else
        snprintf(buf, size, "%lld B", (long long)b);
    return buf;
}

void mf_simulate_report(FILE *out, const mf_schedule *s, const mf_sim_result *r, bool full_path)
{
    char a[32], b[32], c[32], la[96], lb[96];
    fprintf(out, "step time          %s\n", fmt_time(r->step_time, a, sizeof a));
    fprintf(out, "compute            %s (%.1f%% of the step)\n",
            fmt_time(r->compute_time, a, sizeof a),
            r->step_time > 0 ? 100.0 * r->compute_time / r->step_time : 0.0);
    fprintf(out, "compute idle       %s (waiting for communication)\n",
            fmt_time(r->step_time - r->busy[MF_STREAM_COMPUTE], a, sizeof a));
    fprintf(out, "\n%-8s %14s %14s %14s %16s\n", "stream", "busy", "exposed", "hidden",
            "critical path");
    for (int k = 0; k < MF_STREAM_COUNT; k++) {
        char d[32];
        double hidden = r->busy[k] - r->exposed[k];
        bool comp = k == MF_STREAM_COMPUTE;
        fprintf(out, "%-8s %14s %14s %14s %16s\n", mf_stream_name((mf_stream)k),
                fmt_time(r->busy[k], a, sizeof a), comp ? "-" : fmt_time(r->exposed[k], b, sizeof b),
                comp ? "-" : fmt_time(hidden < 0 ? 0 : hidden, c, sizeof c),
                fmt_time(r->on_path[k], d, sizeof d));
    }
    fprintf(out, "\ncommunication      busy %s, exposed %s, overlap %.1f%% (hidden / total)\n",
            fmt_time(r->comm_busy, a, sizeof a), fmt_time(r->comm_exposed, b, sizeof b),
            100.0 * r->overlap);
    fprintf(out, "bytes per rank per step:\n");
    for (int j = 0; j < s->mesh.naxes; j++)
        fprintf(out, "  %-12s %14s in %lld collectives\n", s->mesh.axes[j].name,
                fmt_bytes(r->bytes[j], a, sizeof a), (long long)r->launches[j]);
    if (r->unmatched_waits)
        fprintf(out, "note: %d waits have no record of their event earlier in the step (they wait "
                     "for the previous step, assumed complete) and did not block\n",
                r->unmatched_waits);

    fprintf(out, "\ncritical path (%d segments; compute %s, inner %s, outer %s):\n", r->ncritical,
            fmt_time(r->on_path[MF_STREAM_COMPUTE], a, sizeof a),
            fmt_time(r->on_path[MF_STREAM_INNER], b, sizeof b),
            fmt_time(r->on_path[MF_STREAM_OUTER], c, sizeof c));
    /* Runs of consecutive critical items on one stream are folded into one
     * line unless the full path was asked for. */
    for (int i = 0; i < r->ncritical;) {
        int j = i + 1;
        const mf_sim_item *first = &r->items[r->critical[i]];
        if (!full_path)
            while (j < r->ncritical && r->items[r->critical[j]].stream == first->stream)
                j++;
        const mf_sim_item *lastit = &r->items[r->critical[j - 1]];
        char ts[32], te[32];
        fmt_time(first->start, ts, sizeof ts);
        fmt_time(lastit->end, te, sizeof te);
        mf_sim_item_label(s, first, la, sizeof la);
        if (j - i == 1) {
            char mb[24] = "";
            if (first->microbatch >= 0)
                snprintf(mb, sizeof mb, " m%d", first->microbatch);
            fprintf(out, "  %12s .. %12s  %-7s %s%s\n", ts, te, mf_stream_name(first->stream), la,
                    mb);
        } else {
            mf_sim_item_label(s, lastit, lb, sizeof lb);
            char m0[24] = "", m1[24] = "";
            if (first->microbatch >= 0)
                snprintf(m0, sizeof m0, " m%d", first->microbatch);
            if (lastit->microbatch >= 0)
                snprintf(m1, sizeof m1, " m%d", lastit->microbatch);
            fprintf(out, "  %12s .. %12s  %-7s %s%s .. %s%s (%d segments)\n", ts, te,
                    mf_stream_name(first->stream), la, m0, lb, m1, j - i);
        }
        i = j;
    }
}
