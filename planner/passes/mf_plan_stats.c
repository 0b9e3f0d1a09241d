/*
 * mf_plan_stats: memory per rank and per-step totals of a planned (layout +
 * transitions) but not yet lowered spec; the definitions are in
 * mf_plan_stats.h. Reads the plan only. Every sum saturates at INT64_MAX so a
 * huge spec gives a huge number, never a wrapped one.
 */
#include "mf_plan_stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_int.h"


static int64_t local_bytes(const mf_schedule *s, const mf_bucket *b, const mf_placement *pl, mf_dtype d)
{
    /* a ragged bucket's buffers are counted at their longest shard, as the
       lowering sizes them (mf_layout_bucket_capacity) */
    return mf_layout_bucket_capacity(&s->mesh, b, pl) * (int64_t)mf_dtype_size(d);
}

/* Bytes of the outputs of steps [first, last) of a transition. */
static int64_t stage_bytes(const mf_schedule *s, const mf_bucket *b, const mf_transition *tr, int first, int last,
                           bool collectives_only)
{
    int64_t sum = 0;
    for (int i = first; i < last; i++)
        if (!collectives_only || mf_opkind_is_collective(tr->steps[i].kind))
            sum = mf_sat_add(sum, local_bytes(s, b, &tr->steps[i].to, tr->steps[i].dtype));
    return sum;
}

void mf_bucket_memory_of(const mf_plan *p, int bi, mf_bucket_memory *m)
{
    const mf_schedule *s = p->sched;
    const mf_bucket *b = &s->buckets[bi];
    const mf_placement *W = &b->place[MF_ROLE_WEIGHT], *G = &b->place[MF_ROLE_GRAD],
                       *O = &b->place[MF_ROLE_MAIN_WEIGHT];
    mf_dtype dw = b->dtype[MF_ROLE_WEIGHT], dg = b->dtype[MF_ROLE_GRAD];
    memset(m, 0, sizeof *m);
    m->main_weight = local_bytes(s, b, O, b->dtype[MF_ROLE_MAIN_WEIGHT]);
    m->weight = local_bytes(s, b, W, dw);
    m->grad = local_bytes(s, b, G, dg);
    m->grad_final = mf_placement_equal(G, O, s->mesh.naxes) ? 0 : local_bytes(s, b, O, dg);
    /* unsharded: Replicate on every axis but the Distinct ones */
    mf_placement rep = mf_placement_uniform(MF_PLACE_REPLICATE, W, s->mesh.naxes);
    bool w_rep = mf_placement_equal(W, &rep, s->mesh.naxes);
    m->weight_full = w_rep ? 0 : b->length * (int64_t)mf_dtype_size(dw);
    m->grad_local = b->length * (int64_t)mf_dtype_size(dg);
    if (p->trans) {
        const mf_transition *t = p->trans[bi];
        m->weight_stage = mf_sat_add(stage_bytes(s, b, &t[MF_T1], 0, t[MF_T1].nsteps - 1, false),
                                  stage_bytes(s, b, &t[MF_T2], 0, t[MF_T2].nsteps - 1, false));
        m->grad_stage = mf_sat_add(stage_bytes(s, b, &t[MF_T3], 0, t[MF_T3].nsteps, true),
                                stage_bytes(s, b, &t[MF_T4], 0, t[MF_T4].nsteps - 1, false));
    }
    m->persistent[MF_ROLE_MAIN_WEIGHT] = m->main_weight;
    m->persistent[MF_ROLE_WEIGHT] = m->weight;
    m->persistent[MF_ROLE_GRAD] = mf_sat_add(m->grad, m->grad_final);
    m->transient[MF_ROLE_WEIGHT] = mf_sat_add(m->weight_full, m->weight_stage);
    m->transient[MF_ROLE_GRAD] = mf_sat_add(m->grad_local, m->grad_stage);
}

/* Per role, the most over the ranks of the persistent bytes a rank holds
 * (its ranges: buffers as the lowering makes them, grad_final beside grad
 * when G != O), when some bucket is ragged: core's summary counts the same
 * (mf_persist_role_most). False (out untouched) when no bucket is. */
static bool ragged_persistent(const mf_schedule *s, int64_t out[MF_ROLE_COUNT])
{
    bool ragged = false;
    for (int b = 0; b < s->nbuckets; b++)
        ragged = ragged || s->buckets[b].bounds;
    if (!ragged)
        return false;
    int64_t most[MF_ROLE_COUNT] = {0};
    for (int64_t r = 0; r < s->mesh.world; r++) {
        int64_t sum[MF_ROLE_COUNT] = {0};
        for (int b = 0; b < s->nbuckets; b++) {
            const mf_bucket *bk = &s->buckets[b];
            const mf_placement *G = &bk->place[MF_ROLE_GRAD], *O = &bk->place[MF_ROLE_MAIN_WEIGHT];
            int64_t o = mf_layout_bucket_range(&s->mesh, bk, O, r).len;
            for (int k = 0; k < MF_ROLE_COUNT; k++)
                sum[k] = mf_sat_add(sum[k], mf_layout_bucket_range(&s->mesh, bk, &bk->place[k], r).len *
                                                (int64_t)mf_dtype_size(bk->dtype[k]));
            if (!mf_placement_equal(G, O, s->mesh.naxes))
                sum[MF_ROLE_GRAD] = mf_sat_add(sum[MF_ROLE_GRAD], o * (int64_t)mf_dtype_size(bk->dtype[MF_ROLE_GRAD]));
        }
        for (int k = 0; k < MF_ROLE_COUNT; k++)
            most[k] = sum[k] > most[k] ? sum[k] : most[k];
    }
    memcpy(out, most, sizeof most);
    return true;
}

bool mf_plan_memory_of(const mf_plan *p, mf_plan_memory *out)
{
    const mf_schedule *s = p->sched;
    memset(out, 0, sizeof *out);
    size_t nu = s->nunits ? (size_t)s->nunits : 1;
    int64_t *per_unit = calloc(nu * (MF_ROLE_COUNT + 1), sizeof *per_unit);
    if (!per_unit)
        return false;
    for (int b = 0; b < s->nbuckets; b++) {
        mf_bucket_memory m;
        mf_bucket_memory_of(p, b, &m);
        int64_t *row = per_unit + (size_t)s->buckets[b].unit * (MF_ROLE_COUNT + 1);
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            out->persistent[r] = mf_sat_add(out->persistent[r], m.persistent[r]);
            out->persistent_total = mf_sat_add(out->persistent_total, m.persistent[r]);
            row[r] = mf_sat_add(row[r], m.transient[r]);
            row[MF_ROLE_COUNT] = mf_sat_add(row[MF_ROLE_COUNT], m.transient[r]);
        }
    }
    if (ragged_persistent(s, out->persistent)) {
        out->persistent_total = 0;
        for (int r = 0; r < MF_ROLE_COUNT; r++)
            out->persistent_total = mf_sat_add(out->persistent_total, out->persistent[r]);
    }
    int window = s->prefetch + 1;
    for (int u = 0; u < s->nunits; u++) {
        int64_t w[MF_ROLE_COUNT + 1] = {0};
        for (int v = u; v < s->nunits && v < u + window; v++)
            for (int r = 0; r <= MF_ROLE_COUNT; r++)
                w[r] = mf_sat_add(w[r], per_unit[(size_t)v * (MF_ROLE_COUNT + 1) + (size_t)r]);
        for (int r = 0; r < MF_ROLE_COUNT; r++)
            if (w[r] > out->transient_peak[r])
                out->transient_peak[r] = w[r];
        if (w[MF_ROLE_COUNT] > out->transient_peak_total)
            out->transient_peak_total = w[MF_ROLE_COUNT];
    }
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        out->peak[r] = mf_sat_add(out->persistent[r], out->transient_peak[r]);
    out->peak_total = mf_sat_add(out->persistent_total, out->transient_peak_total);
    free(per_unit);
    return true;
}

int64_t mf_plan_stats_transition_runs(const mf_plan *p, int b, int t)
{
    const mf_schedule *s = p->sched;
    if (!p->trans || p->trans[b][t].nsteps == 0)
        return 0;
    switch (t) {
    case MF_T2:
        return mf_sat_mul(s->microbatches, s->units[s->buckets[b].unit].reshard_after_forward ? 2 : 1);
    case MF_T3:
        return s->microbatches;
    default:
        return 1;
    }
}

bool mf_plan_totals(const mf_plan *p, mf_summary *out)
{
    const mf_schedule *s = p->sched;
    memset(out, 0, sizeof *out);
    for (int b = 0; p->trans && b < s->nbuckets; b++)
        for (int t = 0; t < MF_NTRANSITIONS; t++) {
            const mf_transition *tr = &p->trans[b][t];
            int64_t runs = mf_plan_stats_transition_runs(p, b, t);
            for (int i = 0; i < tr->nsteps; i++) {
                const mf_step *st = &tr->steps[i];
                if (!mf_opkind_is_collective(st->kind) || st->axis < 0 || st->axis >= s->mesh.naxes)
                    continue;
                out->collectives[st->kind][st->axis] = mf_sat_add(out->collectives[st->kind][st->axis], runs);
                out->bytes[st->axis] = mf_sat_add(out->bytes[st->axis], mf_sat_mul(runs, st->bytes));
            }
        }
    mf_plan_memory mem;
    if (!mf_plan_memory_of(p, &mem))
        return false;
    memcpy(out->persistent_bytes, mem.persistent, sizeof mem.persistent);
    memcpy(out->model_bytes, mem.peak, sizeof mem.peak);
    return true;
}
