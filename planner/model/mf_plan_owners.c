/*
 * mf_plan_owners: owners per shard of a whole bucket and per rank
 * (mf_plan_owners.h; docs/semantics.md §9.1).
 */
#include "mf_plan_owners.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_passes.h"
#include "mf_plan_muon.h"

const mf_placement *mf_plan_owners_finest(const mf_mesh *m, const mf_bucket *b, int *role)
{
    static const int order[] = {MF_ROLE_MAIN_WEIGHT, MF_ROLE_GRAD, MF_ROLE_WEIGHT};
    const mf_placement *best = NULL;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        int r = order[i];
        if (b->whole[r] && (!best || mf_layout_shards(m, &b->place[r]) > mf_layout_shards(m, best))) {
            best = &b->place[r];
            if (role)
                *role = r;
        }
    }
    return best;
}

const char *mf_plan_owners_placement(const mf_bucket *b, int r, int naxes, char *buf, size_t size)
{
    return mf_placement_format_as(&b->place[r], naxes, b->whole[r], buf, size);
}

int64_t mf_plan_owners_of(const mf_mesh *m, const mf_bucket *b, int r, const mf_tensor *t)
{
    if (!b->whole[r])
        return -1;
    return mf_layout_tensor_shard(m, b, &b->place[r], t->offset, t->numel);
}

int64_t mf_plan_owners_cost(mf_balance bal, const mf_tensor *t)
{
    return mf_layout_pass_whole_cost(bal, t->ndims, t->dims, t->numel);
}

double mf_plan_owners_ns_flops(const mf_tensor *t)
{
    if (t->ndims < 2 || t->dims[0] <= 0)
        return 0;
    double rows = (double)t->dims[0], cols = (double)t->numel / rows;
    return MF_PLAN_NS_FLOPS * rows * cols * (rows < cols ? rows : cols);
}

int64_t mf_plan_owners_shards(const mf_schedule *s, const mf_bucket *b, mf_balance bal,
                              mf_plan_owner_shard *out)
{
    const mf_placement *fine = mf_plan_owners_finest(&s->mesh, b, NULL);
    if (!fine)
        return 0;
    int64_t P = mf_layout_shards(&s->mesh, fine);
    memset(out, 0, (size_t)P * sizeof *out);
    for (int64_t q = 0; q < P; q++) {
        out[q].first = -1;
        out[q].used = mf_layout_shard_used(&s->mesh, fine, b, q);
    }
    int64_t mb = (int64_t)mf_dtype_size(b->dtype[MF_ROLE_MAIN_WEIGHT]);
    int64_t gb = (int64_t)mf_dtype_size(b->dtype[MF_ROLE_GRAD]);
    for (int i = 0; i < b->ntensors; i++) {
        const mf_tensor *t = &b->tensors[i];
        int64_t q = mf_layout_tensor_shard(&s->mesh, b, fine, t->offset, t->numel);
        if (q < 0)
            continue; /* straddles: the loader refuses such a schedule */
        mf_plan_owner_shard *o = &out[q];
        if (o->first < 0)
            o->first = i;
        o->ntensors++;
        o->numel += t->numel;
        o->main_bytes += t->numel * mb;
        o->grad_bytes += t->numel * gb;
        o->cost += mf_plan_owners_cost(bal, t);
    }
    return P;
}

/* Elements of [off, off + n) inside the range r. */
static int64_t overlap(mf_range r, int64_t off, int64_t n)
{
    int64_t lo = off > r.offset ? off : r.offset, hi = off + n < r.offset + r.len ? off + n : r.offset + r.len;
    return hi > lo ? hi - lo : 0;
}

/* Adds bucket b's main_weight to every rank of out. */
static void add_bucket(const mf_schedule *s, const mf_bucket *b, mf_balance bal, mf_plan_owner_rank *out)
{
    const mf_mesh *m = &s->mesh;
    const mf_placement *pl = &b->place[MF_ROLE_MAIN_WEIGHT];
    int64_t size = (int64_t)mf_dtype_size(b->dtype[MF_ROLE_MAIN_WEIGHT]);
    bool whole = b->whole[MF_ROLE_MAIN_WEIGHT];
    for (int64_t r = 0; r < m->world; r++) {
        mf_range rg = mf_layout_bucket_range(m, b, pl, r);
        mf_plan_owner_rank *o = &out[r];
        for (int i = 0; i < b->ntensors; i++) {
            const mf_tensor *t = &b->tensors[i];
            int64_t held = overlap(rg, t->offset, t->numel);
            if (held == 0)
                continue;
            if (whole) {
                o->owned++;
                o->owned_bytes += t->numel * size;
                o->cost += mf_plan_owners_cost(bal, t);
                o->flops += mf_plan_owners_ns_flops(t);
            } else {
                o->sharded_bytes += held * size;
                o->cost += held;
            }
        }
    }
}

void mf_plan_owners_ranks(const mf_schedule *s, mf_balance bal, mf_plan_owner_rank *out)
{
    memset(out, 0, (size_t)s->mesh.world * sizeof *out);
    for (int b = 0; b < s->nbuckets; b++)
        if (s->buckets[b].length > 0)
            add_bucket(s, &s->buckets[b], bal, out);
}

/* The value bounded of tensor t of bucket b: owned bytes or NS FLOPs. */
static double owned_value(const mf_bucket *b, const mf_tensor *t, bool flops)
{
    return flops ? mf_plan_owners_ns_flops(t)
                 : (double)t->numel * (double)mf_dtype_size(b->dtype[MF_ROLE_MAIN_WEIGHT]);
}

static int by_value_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* The pigeonhole term of the n values v (sorted descending) over P shards,
 * its k in *k. */
static double pigeon_of(const double *v, int64_t n, int64_t P, int64_t *k)
{
    double best = 0;
    for (int64_t j = 1; j * P + 1 <= n; j++) {
        double sum = 0;
        for (int64_t i = j * P - j; i <= j * P; i++) /* v_{jP+1-j} .. v_{jP+1}, 0-based */
            sum += v[i];
        if (sum > best) {
            best = sum;
            *k = j;
        }
    }
    return best;
}

/* Bucket b's main_weight is whole with placement pl. */
static bool whole_main_at(const mf_mesh *m, const mf_bucket *b, const mf_placement *pl)
{
    if (!b->whole[MF_ROLE_MAIN_WEIGHT])
        return false;
    for (int j = 0; j < m->naxes; j++)
        if (b->place[MF_ROLE_MAIN_WEIGHT].p[j] != pl->p[j])
            return false;
    return true;
}

/* The units term of the n values v (sorted descending) over P shards: the
 * best over up to MF_PLAN_OWNERS_UNITS units taken evenly among the
 * distinct values; its unit in *unit. */
static double units_of(const double *v, int64_t n, int64_t P, double *unit)
{
    int64_t distinct = 0;
    for (int64_t i = 0; i < n; i++)
        distinct += i == 0 || v[i] != v[i - 1];
    int64_t step = distinct / MF_PLAN_OWNERS_UNITS + 1, seen = 0;
    double best = 0;
    for (int64_t i = 0; i < n; i++) {
        if ((i > 0 && v[i] == v[i - 1]) || v[i] <= 0 || seen++ % step)
            continue;
        double units = 0;
        for (int64_t j = 0; j < n && v[j] >= v[i]; j++)
            units += floor(v[j] / v[i]);
        double term = v[i] * ceil(units / (double)P);
        if (term > best) {
            best = term;
            *unit = v[i];
        }
    }
    return best;
}

/* The pigeonhole term over the buckets whose main_weight is whole with
 * placement pl (P shards); false on OOM. */
static bool pigeon_class(const mf_schedule *s, const mf_placement *pl, bool flops, mf_plan_owner_bound *out)
{
    int64_t n = 0, P = mf_layout_shards(&s->mesh, pl);
    for (int b = 0; b < s->nbuckets; b++)
        if (whole_main_at(&s->mesh, &s->buckets[b], pl))
            n += s->buckets[b].ntensors;
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return false;
    int64_t k = 0, i = 0;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        if (whole_main_at(&s->mesh, bk, pl))
            for (int t = 0; t < bk->ntensors; t++)
                v[i++] = owned_value(bk, &bk->tensors[t], flops);
    }
    qsort(v, (size_t)n, sizeof *v, by_value_desc);
    double unit = 0, term = pigeon_of(v, n, P, &k), uterm = units_of(v, n, P, &unit);
    if (term > out->pigeon) {
        out->pigeon = term;
        out->k = k;
        out->P = P;
    }
    if (uterm > out->units) {
        out->units = uterm;
        out->unit = unit;
        out->unit_P = P;
    }
    free(v);
    return true;
}

bool mf_plan_owners_bound(const mf_schedule *s, bool flops, mf_plan_owner_bound *out)
{
    const mf_mesh *m = &s->mesh;
    memset(out, 0, sizeof *out);
    double total = 0;
    int *first = malloc((size_t)(s->nbuckets ? s->nbuckets : 1) * sizeof *first), nfirst = 0;
    if (!first)
        return false;
    bool ok = true;
    for (int b = 0; ok && b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        if (!bk->whole[MF_ROLE_MAIN_WEIGHT])
            continue;
        double holders = (double)m->world / (double)mf_layout_shards(m, &bk->place[MF_ROLE_MAIN_WEIGHT]);
        int e = 0; /* the pigeonhole once per placement: at its first bucket */
        while (e < nfirst && !whole_main_at(m, &s->buckets[first[e]], &bk->place[MF_ROLE_MAIN_WEIGHT]))
            e++;
        if (e == nfirst) {
            first[nfirst++] = b;
            ok = pigeon_class(s, &bk->place[MF_ROLE_MAIN_WEIGHT], flops, out);
        }
        for (int t = 0; t < bk->ntensors; t++) {
            double v = owned_value(bk, &bk->tensors[t], flops);
            total += v * holders;
            out->largest = v > out->largest ? v : out->largest;
        }
    }
    free(first);
    out->mean = total / (double)m->world;
    out->bound = out->mean;
    out->why = "mean";
    if (out->largest > out->bound) {
        out->bound = out->largest;
        out->why = "largest tensor";
    }
    if (out->pigeon > out->bound) {
        out->bound = out->pigeon;
        out->why = "pigeonhole";
    }
    if (out->units > out->bound) {
        out->bound = out->units;
        out->why = "units";
    }
    return ok;
}

/* Seconds of the all_gathers that make tensor t (count elements per rank
 * at placement pl) whole on every rank: one per Flat axis, outermost first. */
static double gather_seconds(const mf_mesh *m, const mf_cost_model *cm, const mf_placement *pl, int64_t numel)
{
    int64_t shards = mf_layout_shards(m, pl), c = (numel + shards - 1) / shards;
    double t = 0;
    for (int j = 0; j < m->naxes; j++) {
        if (pl->p[j] != MF_PLACE_FLAT)
            continue;
        t += mf_cost_op(cm, m, MF_OP_ALL_GATHER, j, c, MF_FP32);
        c *= m->axes[j].size;
    }
    return t;
}

double mf_plan_owners_muon_seconds(const mf_schedule *s, const mf_cost_model *cm, double flops,
                                   const char *const *adamw, int nadamw)
{
    const mf_mesh *m = &s->mesh;
    double *load = calloc((size_t)m->world, sizeof *load), everyone = 0, comm = 0, most = 0;
    if (!load)
        return -1;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        const mf_placement *pl = &bk->place[MF_ROLE_MAIN_WEIGHT];
        for (int i = 0; i < bk->ntensors; i++) {
            const mf_tensor *t = &bk->tensors[i];
            double f = mf_plan_owners_ns_flops(t);
            if (f == 0 || mf_plan_muon_is_adamw(adamw, nadamw, t->name))
                continue;
            if (!bk->whole[MF_ROLE_MAIN_WEIGHT]) {
                everyone += f;
                comm += gather_seconds(m, cm, pl, t->numel);
                continue;
            }
            for (int64_t r = 0; r < m->world; r++) {
                mf_range rg = mf_layout_bucket_range(m, bk, pl, r);
                if (rg.offset <= t->offset && t->offset < rg.offset + rg.len)
                    load[r] += f; /* its owner: the tensor lies inside the shard */
            }
        }
    }
    for (int64_t r = 0; r < m->world; r++)
        most = load[r] > most ? load[r] : most;
    free(load);
    return (most + everyone) / flops + comm;
}
