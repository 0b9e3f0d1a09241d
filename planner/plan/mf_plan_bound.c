/*
 * mf_plan_bound: lower bounds on a candidate's peak memory and step time,
 * from the spec alone (no pass runs), for the pruning of mf_plan_search.c
 * (docs/plan.md §3). Each bound drops something the real figure adds, so it
 * is never above it:
 *
 * Memory per rank: the allocated bytes (persistent region + transient
 * arena of the buffer assignment, docs/semantics.md §10) plus the optimizer
 * state. A bucket's padded length L is at least the sum of its tensors'
 * elements n, and every buffer of the lowering (mf_lower.c) holds L/S or L
 * elements, rounded up to `align` bytes, so per tensor of layout (W, G, O)
 * the persistent region holds at least
 *   n*(size(O)/S_O + size(W)/S_W + size(G)/S_G + [G != O] size(G)/S_O)
 * (main_weight, weight, grad, grad_final) and the optimizer state is
 * n*optimizer_bytes/S_O. The arena is at least the bytes of the transient
 * buffers live at any one instant (its live-bytes bound, core/mf_live.h);
 * mf_plan_search_arena_bound (below) finds buffers provably live together at the
 * trainer's compute of one unit, stage buffers dropped.
 *
 * Step time. Compute runs on one stream, so step >= the compute time (the
 * same for every candidate, taken from the first simulation). Every stream
 * runs one op at a time and a collective on axis j of size n_j moving b
 * bytes per element takes at least its bandwidth term: all_gather and
 * reduce_scatter (n_j-1)*c*b/beta_j with c the per-rank count, all_reduce
 * 2*(n_j-1)*(c/n_j)*b/beta_j. Between placements A and B (dtype sizes bA,
 * bB) every axis j with A=Flat, B=Replicate needs an all_gather on j, with
 * A=Partial, B=Flat a reduce_scatter, with A=Partial, B=Replicate an
 * all_reduce (or a reduce_scatter and an all_gather, the same bytes); the
 * per-rank count of each is at least n over the sizes of the other axes a
 * composition may have made Flat by then -- those Flat in A or B, and those
 * going Partial -> Replicate, which may reduce_scatter first and gather
 * last (so the reduction of one such axis may run on a shard of another's:
 * reduce_scatter inner, all_reduce outer on 1/n_inner, all_gather inner) --
 * over n_j too for a gather or reduce_scatter on j, and b >= min(bA, bB). T1 (O -> W) runs once, T2
 * (W -> Replicate) M times per pre-hook when W is sharded, T3 (Partial ->
 * G) M times, T4 (G -> O, grad dtype) once. The innermost axis's
 * collectives run on the inner stream, the others on the outer stream, so
 * step >= the larger of the two sums.
 *
 * The test suite checks both bounds against every candidate of the
 * randomized instances (tests/planner/test_plan_search.c).
 */
#include <stdlib.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_plan_search.h"

static double shards(const mf_mesh *m, const mf_placement *p) { return (double)mf_layout_shards(m, p); }

static bool all_rep(const mf_placement *p, int naxes)
{
    for (int j = 0; j < naxes; j++)
        if (p->p[j] != MF_PLACE_REPLICATE)
            return false;
    return true;
}

/* Lower bounds of moving n elements once from e's source A to its target B
 * (mf_trans_rules_endpoints: the placements and dtypes of a transition): per axis
 * the bytes per rank (bytes[j]) and the fixed seconds (fixed[j]: launch and
 * ring latency) of the collective that axis needs. Adds runs x them. */
static void move_lb(const mf_plan_search *ps, const mf_trans_ends *e, double n, double runs, double *bytes,
                    double *fixed)
{
    const mf_placement *A = &e->from, *B = &e->to;
    mf_dtype da = e->from_dtype, db = e->to_dtype;
    const mf_mesh *m = &ps->spec.mesh;
    const mf_cost_model *cm = &ps->opt.sim.cost;
    /* axes a composition may make Flat on the way: Flat in A or B, or
       Partial -> Replicate (a reduce_scatter there, an all_gather later) */
    double flat = 1;
    bool can_flat[MF_MAX_AXES];
    for (int j = 0; j < m->naxes; j++) {
        can_flat[j] = A->p[j] == MF_PLACE_FLAT || B->p[j] == MF_PLACE_FLAT ||
                      (A->p[j] == MF_PLACE_PARTIAL && B->p[j] == MF_PLACE_REPLICATE);
        if (can_flat[j])
            flat *= (double)m->axes[j].size;
    }
    double b = (double)(mf_dtype_size(da) < mf_dtype_size(db) ? mf_dtype_size(da) : mf_dtype_size(db));
    for (int j = 0; j < m->naxes; j++) {
        double nj = (double)m->axes[j].size, x = 0, f = 0;
        if (nj < 2)
            continue;
        /* the per-rank count when axis j's collective runs is at least n
           over the other axes that may be Flat then (c), and c / nj with
           axis j Flat before a gather or after a reduce_scatter */
        double c = n / (can_flat[j] ? flat / nj : flat);
        /* the op that makes A -> B on axis j in one move (the op table) */
        int k = mf_opkind_for_move((mf_place)A->p[j], (mf_place)B->p[j]);
        if (k == MF_OP_ALL_GATHER || k == MF_OP_REDUCE_SCATTER) {
            x = (nj - 1) * (c / nj) * b;
            f = cm->launch + (nj - 1) * cm->axis[j].alpha;
        } else if (k == MF_OP_ALL_REDUCE) {
            x = 2 * (nj - 1) / nj * c * b;
            f = cm->launch + 2 * (nj - 1) * cm->axis[j].alpha;
        }
        bytes[j] += runs * x;
        fixed[j] += runs * f;
    }
}

/* Seconds of a chain of collectives with these per-axis bounds. */
static double chain(const mf_plan_search *ps, const double *bytes, const double *fixed)
{
    double t = 0;
    for (int j = 0; j < ps->spec.mesh.naxes; j++)
        t += fixed[j] + bytes[j] / ps->opt.sim.cost.axis[j].beta;
    return t;
}

/*
 * The arena bound. Time is core/mf_live.h's cycle of one microbatch: the
 * hooks in the trainer's order, each hook's ops, then the trainer's compute
 * after it. Each item is a run of units [a, z] with the bytes of its
 * weight_full (wf, 0 when W is Replicate: no such buffer) and grad_local
 * (gl) and whether it keeps its weight after forward (nr): a bucket of the
 * lowering, or, for a bound from the spec alone, one unit's tensors (every
 * bucket holding them covers that unit, so the buffers found live below for
 * the unit hold its elements; each unit is counted once, and a bucket's
 * tensors occupy disjoint spans of its L, so the sum over the units never
 * exceeds the live buffers' bytes). A merged bucket's units agree on
 * reshard_after_forward (mf_layout_pass.c).
 *
 * What writes these buffers over (mf_lower.c, mf_live.c): weight_full only
 * by the last step of T2, issued every microbatch at forward_pre(a - p) and,
 * when the bucket reshards, again at backward_pre(z + p) (clamped to the
 * first and last unit; p = prefetch); grad_local only by the trainer at
 * backward_pre(z). The trainer reads weight_full at the compute after
 * forward_pre(a .. z) and backward_pre(z .. a), and writes grad_local at
 * backward_pre(z .. a). A buffer is live at every tick from a write over
 * it to its last access before the next (a buffer never written over is
 * live all the time). Hence, at the compute after backward_pre(u):
 *   - a bucket covering u (a <= u <= z): both buffers are accessed there;
 *   - a bucket with z < u that keeps its weight: its forward gather came
 *     before forward_pre(a), the trainer reads it again at backward_pre(a),
 *     after backward_pre(u) (a < u), and nothing wrote it over in between;
 *   - a bucket with z < u <= z + p that reshards: its re-gather was issued
 *     at backward_pre(min(z + p, U - 1)), at or before backward_pre(u), and
 *     is read at backward_pre(a), later;
 * and at the compute after forward_pre(u), the weight_full of
 *   - a bucket with a - p <= u <= z: gathered at forward_pre(max(a - p, 0)),
 *     at or before forward_pre(u), read at forward_pre(max(a, u)) or later;
 *   - a bucket with z < u that keeps its weight (as above).
 * With the transitions known, more: a buffer whose last access is an op on
 * a communication stream stays live until the trainer's compute after the
 * next forward_pre or backward_pre hook (core/mf_live.c, the extension;
 * never into the buffer's own next write, which comes a pre-hook later at
 * the earliest). So the T2 stage buffers (each written by one step of T2
 * and read by the next, at the same hook) whose reader runs on such a
 * stream are live at the compute after the hook that issued T2:
 * forward_pre(max(a - p, 0)), and backward_pre(min(z + p, U - 1)) when the
 * bucket reshards; and grad_local (whose last access is T3's first step)
 * and the T3 stage buffers, when read on such a stream, are live at the
 * compute after backward_pre(a - 1), the next window after T3's hook
 * backward_post(a) (a >= 1). Each is a buffer of its own, counted once.
 * The arena is at least the largest such sum. scratch: 2 x nunits doubles.
 */
double mf_plan_search_arena_bound(int nunits, int prefetch, const mf_ps_live_item *it, int n, double *scratch)
{
    int U = nunits, p = prefetch;
    double *bw = scratch, *fw = scratch + U; /* difference arrays: backward and forward ticks */
    memset(scratch, 0, sizeof *scratch * 2 * (size_t)U);
#define RANGE(arr, lo, hi, v)                                                                                     \
    do {                                                                                                          \
        int lo_ = (lo) < 0 ? 0 : (lo), hi_ = (hi) > U - 1 ? U - 1 : (hi);                                          \
        if (lo_ <= hi_) {                                                                                         \
            (arr)[lo_] += (v);                                                                                    \
            if (hi_ + 1 < U)                                                                                      \
                (arr)[hi_ + 1] -= (v);                                                                            \
        }                                                                                                         \
    } while (0)
    for (int i = 0; i < n; i++) {
        const mf_ps_live_item *x = &it[i];
        RANGE(bw, x->a, x->z, x->wf + x->gl);
        RANGE(bw, x->z + 1, x->nr ? U - 1 : x->z + p, x->wf);
        RANGE(fw, x->a - p, x->nr ? U - 1 : x->z, x->wf);
        int f = x->a - p < 0 ? 0 : x->a - p, r = x->z + p > U - 1 ? U - 1 : x->z + p;
        RANGE(fw, f, f, x->t2_stage);
        if (!x->nr)
            RANGE(bw, r, r, x->t2_stage);
        if (x->a >= 1)
            RANGE(bw, x->a - 1, x->a - 1, x->t3_after);
    }
#undef RANGE
    double b = 0, f = 0, best = 0;
    for (int u = 0; u < U; u++) {
        b += bw[u];
        f += fw[u];
        if (b > best)
            best = b;
        if (f > best)
            best = f;
    }
    return best;
}

typedef struct unit_lb {
    double pers, wf, gl;    /* persistent incl. optimizer; weight_full and grad_local bytes */
    double bytes[MF_MAX_AXES], fixed[MF_MAX_AXES]; /* per step, per axis */
    double head, tail;      /* chains before the first forward and after the last backward */
    double drain_bw[2], drain_fixed[2]; /* last-microbatch T3 + T4 seconds per comm stream */
    double t2;              /* T2 chain (weight gather before a compute), without merging */
    double r3[2], g2[2];    /* per comm stream (inner, outer): seconds of one T3 of all the
                               unit's layouts, of one T2 of its sharded ones */
    double r3bw[2], g2bw[2]; /* the same, bandwidth terms only (what merging keeps) */
    bool gathers[2];        /* some T2 of the unit has an all_gather on that stream */
} unit_lb;

/* Adds per-axis bounds to the two comm streams (innermost axis: inner). */
static void by_stream(const mf_plan_search *ps, const double *bytes, const double *fixed, double *bw, double *fx)
{
    int naxes = ps->spec.mesh.naxes;
    for (int j = 0; j < naxes; j++) {
        int s = j == naxes - 1 ? 0 : 1;
        bw[s] += bytes[j] / ps->opt.sim.cost.axis[j].beta;
        fx[s] += fixed[j];
    }
}

/* Adds runs x one run's per-axis bounds (b, f) to bytes and fixed. */
static void add_runs(int naxes, double runs, const double *b, const double *f, double *bytes, double *fixed)
{
    for (int j = 0; j < naxes; j++) {
        bytes[j] += runs * b[j];
        fixed[j] += runs * f[j];
    }
}

/* One run's per-axis bounds summed per comm stream: all (seconds) and the
 * bandwidth terms alone (bw, what merging keeps), added to both. */
static void stream_sums(const mf_plan_search *ps, const double *b, const double *f, double *all, double *bw)
{
    double sb[2] = {0, 0}, sf[2] = {0, 0};
    by_stream(ps, b, f, sb, sf);
    for (int k = 0; k < 2; k++) {
        all[k] += sb[k] + sf[k];
        bw[k] += sb[k];
    }
}

/* Bounds of one unit of group g under choice c. Tensors of one layout share
 * a bucket (without merging), so the fixed costs count once per layout. */
static int unit_bounds(const mf_plan_search *ps, int g, int c, unit_lb *out)
{
    const mf_spec *sp = &ps->spec;
    const mf_mesh *m = &sp->mesh;
    const mf_ps_group *gr = &ps->groups[g];
    const mf_ps_choice *ch = &gr->choices[c];
    const mf_spec_unit *su = &ps->base->units[gr->first_unit];
    double M = (double)sp->microbatches, optb = (double)ps->opt.optimizer_bytes;
    double *elems = calloc((size_t)sp->nlayouts, sizeof *elems);
    if (!elems)
        return -1;
    memset(out, 0, sizeof *out);
    for (int t = 0; t < su->ntensors; t++) {
        const mf_spec_tensor *st = &su->tensors[t];
        elems[gr->is_auto && st->unit_default ? ch->layout : st->layout] += (double)st->numel;
    }
    for (int li = 0; li < sp->nlayouts; li++) {
        if (elems[li] == 0)
            continue;
        const mf_spec_layout *l = &sp->layouts[li];
        const mf_placement *W = &l->place[MF_ROLE_WEIGHT], *G = &l->place[MF_ROLE_GRAD],
                           *O = &l->place[MF_ROLE_MAIN_WEIGHT];
        mf_dtype dw = l->dtype[MF_ROLE_WEIGHT], dg = l->dtype[MF_ROLE_GRAD], dO = l->dtype[MF_ROLE_MAIN_WEIGHT];
        double n = elems[li], sw = (double)mf_dtype_size(dw), sg = (double)mf_dtype_size(dg),
               so = (double)mf_dtype_size(dO);
        bool wsh = !all_rep(W, m->naxes);
        out->pers += n * (so / shards(m, O) + sw / shards(m, W) + sg / shards(m, G) + optb / shards(m, O));
        if (!mf_placement_equal(G, O, m->naxes))
            out->pers += n * sg / shards(m, O);
        out->wf += wsh ? n * sw : 0;
        out->gl += n * sg;
        /* one run of each transition (T2 only when W is sharded) */
        mf_trans_ends e[MF_NTRANSITIONS];
        double tb[MF_NTRANSITIONS][MF_MAX_AXES] = {{0}}, tf[MF_NTRANSITIONS][MF_MAX_AXES] = {{0}};
        for (int t = 0; t < MF_NTRANSITIONS; t++) {
            e[t] = mf_trans_rules_endpoints(t, l->place, l->dtype, m->naxes);
            if (t != MF_T2 || wsh)
                move_lb(ps, &e[t], n, 1, tb[t], tf[t]);
        }
        double hb[MF_MAX_AXES] = {0}, hf[MF_MAX_AXES] = {0}, lb[MF_MAX_AXES] = {0}, lf[MF_MAX_AXES] = {0};
        add_runs(m->naxes, 1, tb[MF_T1], tf[MF_T1], hb, hf);
        add_runs(m->naxes, wsh, tb[MF_T2], tf[MF_T2], hb, hf);
        add_runs(m->naxes, 1, tb[MF_T3], tf[MF_T3], lb, lf);
        add_runs(m->naxes, 1, tb[MF_T4], tf[MF_T4], lb, lf);
        double h = chain(ps, hb, hf), tl = chain(ps, lb, lf);
        if (wsh) {
            double g2 = chain(ps, tb[MF_T2], tf[MF_T2]);
            out->t2 = g2 > out->t2 ? g2 : out->t2;
        }
        by_stream(ps, lb, lf, out->drain_bw, out->drain_fixed);
        stream_sums(ps, tb[MF_T3], tf[MF_T3], out->r3, out->r3bw);
        if (wsh) {
            stream_sums(ps, tb[MF_T2], tf[MF_T2], out->g2, out->g2bw);
            /* an axis where T2 needs an all_gather: one on that axis's stream */
            for (int j = 0; j < m->naxes; j++)
                if (mf_opkind_for_move((mf_place)e[MF_T2].from.p[j], (mf_place)e[MF_T2].to.p[j]) == MF_OP_ALL_GATHER &&
                    m->axes[j].size > 1)
                    out->gathers[j == m->naxes - 1 ? 0 : 1] = true;
        }
        out->head = h > out->head ? h : out->head;
        out->tail = tl > out->tail ? tl : out->tail;
        add_runs(m->naxes, 1, tb[MF_T1], tf[MF_T1], out->bytes, out->fixed);
        add_runs(m->naxes, wsh ? M * (ch->reshard ? 2 : 1) : 0, tb[MF_T2], tf[MF_T2], out->bytes, out->fixed);
        add_runs(m->naxes, M, tb[MF_T3], tf[MF_T3], out->bytes, out->fixed);
        add_runs(m->naxes, 1, tb[MF_T4], tf[MF_T4], out->bytes, out->fixed);
    }
    free(elems);
    return 0;
}

int mf_plan_search_bounds_prepare(mf_plan_search *ps)
{
    for (int g = 0; g < ps->ngroups; g++) {
        mf_ps_group *gr = &ps->groups[g];
        gr->lb_persistent = calloc((size_t)gr->nchoices, sizeof(double));
        gr->lb_wf = calloc((size_t)gr->nchoices, sizeof(double));
        gr->lb_gl = calloc((size_t)gr->nchoices, sizeof(double));
        gr->lb_bytes = calloc((size_t)gr->nchoices * MF_MAX_AXES, sizeof(double));
        gr->lb_fixed = calloc((size_t)gr->nchoices * MF_MAX_AXES, sizeof(double));
        gr->lb_head = calloc((size_t)gr->nchoices, sizeof(double));
        gr->lb_tail = calloc((size_t)gr->nchoices, sizeof(double));
        gr->lb_drain = calloc((size_t)gr->nchoices * 4, sizeof(double));
        gr->lb_t2 = calloc((size_t)gr->nchoices, sizeof(double));
        gr->lb_fifo = calloc((size_t)gr->nchoices * MF_PS_FIFO, sizeof(double));
        if (!gr->lb_persistent || !gr->lb_wf || !gr->lb_gl || !gr->lb_bytes || !gr->lb_fixed || !gr->lb_head ||
            !gr->lb_tail || !gr->lb_drain || !gr->lb_t2 || !gr->lb_fifo)
            return -1;
        for (int c = 0; c < gr->nchoices; c++) {
            unit_lb ub;
            if (unit_bounds(ps, g, c, &ub) != 0)
                return -1;
            gr->lb_persistent[c] = ub.pers * gr->nunits;
            gr->lb_wf[c] = ub.wf;
            gr->lb_gl[c] = ub.gl;
            gr->lb_head[c] = ub.head;
            gr->lb_tail[c] = ub.tail;
            gr->lb_t2[c] = ub.t2;
            double *fi = &gr->lb_fifo[(size_t)c * MF_PS_FIFO];
            for (int k = 0; k < 2; k++) {
                fi[k] = ub.r3[k];
                fi[2 + k] = ub.g2[k];
                fi[4 + k] = ub.gathers[k] ? 1 : 0;
                fi[6 + k] = ub.r3bw[k];
                fi[8 + k] = ub.g2bw[k];
            }
            for (int k = 0; k < 2; k++) {
                gr->lb_drain[(size_t)c * 4 + (size_t)k] = ub.drain_bw[k];
                gr->lb_drain[(size_t)c * 4 + 2 + (size_t)k] = ub.drain_fixed[k];
            }
            for (int j = 0; j < MF_MAX_AXES; j++) {
                gr->lb_bytes[(size_t)c * MF_MAX_AXES + (size_t)j] = ub.bytes[j] * gr->nunits;
                gr->lb_fixed[(size_t)c * MF_MAX_AXES + (size_t)j] = ub.fixed[j] * gr->nunits;
            }
        }
    }
    ps->lb_scratch = calloc((size_t)ps->base->nunits * 7 + 7, sizeof(double));
    ps->lb_fifo_of = calloc((size_t)ps->base->nunits + 1, sizeof *ps->lb_fifo_of);
    ps->lb_items = calloc((size_t)ps->base->nunits + 1, sizeof *ps->lb_items);
    return ps->lb_scratch && ps->lb_fifo_of && ps->lb_items ? 0 : -1;
}

/* The compute chain with its weight gathers (host-synchronous issue only):
 * the compute items run one at a time in hook order; without merging, the
 * T2 gather of unit u is issued when compute reaches the hook of the unit
 * `prefetch` places earlier in that pass (forward_pre(u - p), or
 * backward_pre(u + p) for a unit that reshards after forward, clamped to
 * the first and last unit; mf_lower.c), which is when the compute item
 * before that hook ends, and its chain takes at least t2(u): the compute of
 * u starts no earlier than that hook time plus t2(u). The first forward starts after the
 * first unit's T1 and T2 (g0). After bwd(u) of the last microbatch, the
 * last-microbatch T3 and T4 collectives of units 0..u must still run on
 * each comm stream (drain).
 *
 * Streams run their ops in issue order (FIFO). Two places where a gather
 * the compute waits for is issued right after reductions on the same
 * streams, merged buckets or not:
 *   - forward of unit 0 in microbatch m >= 1: the T3 of every bucket of
 *     unit 0 is issued at backward_post(0) of m-1, when bwd(0, m-1) has
 *     ended (host-synchronous: the hook; host-asynchronous: its first step
 *     waits for the compute's record there), and unit 0's T2 gathers at
 *     forward_pre(0) of m, the next hook (forward_pre(max(0 - p, 0)));
 *     forward_pre(0) waits for each bucket with a T2 (a sharded weight).
 *     On a comm stream s where such a T2 has an op (an all_gather on an
 *     axis of s of size > 1 where the weight is Flat), that op runs after
 *     every T3 op on s, all after that end: fwd(0, m) starts >= end
 *     bwd(0, m-1) + r3_s(0) + g2_s(0), r3_s and g2_s the stream's bounds of
 *     one T3 of all of the unit's layouts and one T2 of its sharded ones (a
 *     merged bucket starting at unit 0 only moves more; every layout is its
 *     own bucket, one launch per step at least);
 *   - without merging, the re-gather of a unit u that reshards is issued at
 *     backward_pre(u + p) when u + p < U - 1, after the T3 of unit
 *     w = u + p + 1 issued at backward_post(w), the hook before: bwd(u, m)
 *     starts >= end bwd(w, m) + r3_s(w) + g2_s(u) on each stream s where
 *     u's T2 has an op.
 * Returns the largest finish this forces. */
static double compute_chain(const mf_plan_search *ps, int prefetch, int64_t bucket, const int *choice, double g0)
{
    int U = ps->base->nunits, M = (int)ps->spec.microbatches, p = prefetch;
    double *t2 = ps->lb_scratch, *rs = t2 + U, *fs = rs + U, *bs = fs + U, *dsum = bs + U, *be = dsum + U;
    const double **fifo = ps->lb_fifo_of;
    double sum[2] = {0, 0};
    int u = 0;
    for (int g = 0; g < ps->ngroups; g++) {
        const mf_ps_group *gr = &ps->groups[g];
        const double *dr = &gr->lb_drain[(size_t)choice[g] * 4];
        for (int k = 0; k < gr->nunits; k++, u++) {
            fifo[u] = &gr->lb_fifo[(size_t)choice[g] * MF_PS_FIFO];
            t2[u] = bucket > 0 || ps->opt.sim.host_async ? 0 : gr->lb_t2[choice[g]];
            rs[u] = gr->choices[choice[g]].reshard ? 1 : 0;
            for (int s = 0; s < 2; s++)
                sum[s] += dr[s] + (bucket > 0 ? 0 : dr[2 + s]);
            dsum[u] = sum[0] > sum[1] ? sum[0] : sum[1]; /* per stream max of sums, below */
        }
    }
    /* fs/bs: when compute reaches each unit's forward_pre / backward_pre
       hook (the end of the compute before it), where the lowering issues the
       gather of unit u + p (forward) or u - p (backward), clamped */
    double t = 0, best = 0;
    int merged = bucket > 0 ? 6 : 0; /* merged buckets share launches: bandwidth terms only */
    for (int m = 0; m < M; m++) {
        /* turn[s]: the latest end_bwd(v, m - 1) + the T3 seconds of units
           0..v on stream s (see the FIFO argument above); -1: none */
        double turn[2] = {-1, -1}, r[2] = {0, 0}, gsum[2] = {0, 0};
        bool gathered[2] = {false, false};
        for (int v = 0; m > 0 && v < U; v++)
            for (int s = 0; s < 2; s++) {
                r[s] += fifo[v][merged + s];
                if ((r[s] > 0 || !ps->opt.sim.host_async) && be[v] + r[s] > turn[s])
                    turn[s] = be[v] + r[s];
            }
        for (u = 0; u < U; u++) {
            fs[u] = t;
            int at = u - p < 0 ? 0 : u - p;
            if (fs[at] + t2[u] > t)
                t = fs[at] + t2[u];
            if (m == 0 && u == 0 && g0 > t)
                t = g0;
            for (int s = 0; m > 0 && u == 0 && s < 2; s++)
                if (fifo[0][4 + s] > 0 && be[0] + fifo[0][s] + fifo[0][2 + s] > t)
                        t = be[0] + fifo[0][s] + fifo[0][2 + s];
            for (int s = 0; m > 0 && s < 2; s++) {
                gsum[s] += fifo[u][2 + merged + s];
                gathered[s] = gathered[s] || fifo[u][4 + s] > 0;
                if (gathered[s] && turn[s] >= 0 && turn[s] + gsum[s] > t)
                    t = turn[s] + gsum[s];
            }
            t += ps->fwd[u];
        }
        for (u = U - 1; u >= 0; u--) {
            bs[u] = t;
            int at = u + p > U - 1 ? U - 1 : u + p;
            if (rs[u] > 0 && bs[at] + t2[u] > t)
                t = bs[at] + t2[u];
            for (int s = 0; bucket == 0 && rs[u] > 0 && at < U - 1 && s < 2; s++)
                if (fifo[u][4 + s] > 0 && be[at + 1] + fifo[at + 1][s] + fifo[u][2 + s] > t)
                        t = be[at + 1] + fifo[at + 1][s] + fifo[u][2 + s];
            t += ps->bwd[u];
            be[u] = t;
            if (m == M - 1 && t + dsum[u] > best)
                best = t + dsum[u];
        }
    }
    return best > t ? best : t;
}

/* The drain at the end of the step: once bwd(u, last microbatch) has ended
 * (at >= g0 + compute - the backward still to come, sum of bwd(v) for v < u),
 * every stream still has to run the last-microbatch T3 and the T4
 * collectives of units 0..u: they wait for their unit's backward, which
 * ends later, and a stream runs one op at a time. The largest such finish
 * over u and the two comm streams. */
static double drain(const mf_plan_search *ps, int64_t bucket, const int *choice, double g0)
{
    double best = 0, rest = ps->compute_time + g0, sum[2] = {0, 0};
    int u = 0;
    for (int g = 0; g < ps->ngroups; g++) {
        const mf_ps_group *gr = &ps->groups[g];
        const double *dr = &gr->lb_drain[(size_t)choice[g] * 4];
        for (int k = 0; k < gr->nunits; k++, u++) {
            if (u > 0)
                rest -= ps->bwd[u - 1];
            for (int s = 0; s < 2; s++) {
                sum[s] += dr[s] + (bucket > 0 ? 0 : dr[2 + s]);
                if (rest + sum[s] > best)
                    best = rest + sum[s];
            }
        }
    }
    return best;
}

void mf_plan_search_lower_bounds(const mf_plan_search *ps, int prefetch, int64_t bucket, const int *choice, double *lb_mem,
                                 double *lb_time)
{
    const mf_mesh *m = &ps->spec.mesh;
    double pers = 0, bytes[MF_MAX_AXES] = {0}, fixed[MF_MAX_AXES] = {0};
    mf_ps_live_item *items = ps->lb_items;
    int u = 0;
    for (int g = 0; g < ps->ngroups; g++) {
        const mf_ps_group *gr = &ps->groups[g];
        int c = choice[g];
        pers += gr->lb_persistent[c];
        for (int j = 0; j < m->naxes; j++) {
            bytes[j] += gr->lb_bytes[(size_t)c * MF_MAX_AXES + (size_t)j];
            fixed[j] += gr->lb_fixed[(size_t)c * MF_MAX_AXES + (size_t)j];
        }
        for (int k = 0; k < gr->nunits; k++, u++)
            items[u] = (mf_ps_live_item){u, u, gr->lb_wf[c], gr->lb_gl[c], !gr->choices[c].reshard, 0, 0};
    }
    double peak_t = mf_plan_search_arena_bound(u, prefetch, items, u, ps->lb_scratch); /* scratch reused below */
    double inner = 0, outer = 0;
    for (int j = 0; j < m->naxes; j++) {
        /* merged buckets share launches: fixed costs count only without merging */
        double t = bytes[j] / ps->opt.sim.cost.axis[j].beta + (bucket > 0 ? 0 : fixed[j]);
        if (j == m->naxes - 1)
            inner += t;
        else
            outer += t;
    }
    /* a relative margin for rounding: a bound must never exceed the figure */
    *lb_mem = (pers + peak_t) * (1 - 1e-9);
    double t = inner > outer ? inner : outer;
    if (ps->ngroups > 0 && ps->bwd) {
        /* the first unit's chains frame the compute (unit 0 is in group 0) */
        double g0 = ps->groups[0].lb_head[choice[0]];
        double frame = g0 + ps->compute_time + ps->groups[0].lb_tail[choice[0]];
        t = frame > t ? frame : t;
        double d = drain(ps, bucket, choice, g0);
        t = d > t ? d : t;
        d = compute_chain(ps, prefetch, bucket, choice, g0);
        t = d > t ? d : t;
    }
    *lb_time = t * (1 - 1e-9);
}
