/*
 * mf_explain: the listing of `mfsdpc explain`. For every unit and bucket: the
 * tensors (offset, numel), padded length and padding overhead, placements and
 * dtypes per role, each transition's steps (collective, axis, stream, when,
 * count, bytes per rank) with the reason for the chosen composition, memory
 * per rank per role; then totals per step: collectives by kind and axis,
 * bytes per rank by axis, and memory per rank (mf_plan_stats.h).
 *
 * The text and YAML forms carry the same data. The YAML form is canonical:
 * fixed key order, integers only (times in nanoseconds, bandwidths in bytes
 * per second), so it diffs cleanly.
 */
#include "mf_explain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "mf_human.h"
#include "mf_interfere.h"
#include "mf_layout.h"
#include "mf_persist.h"
#include "mf_plan_owners.h"
#include "mf_plan_stats.h"
#include "mf_programs.h"
#include "mf_yaml_str.h"

/* Elements per rank of a role: its placement's longest shard (the equal
 * shards' L / shards unless the bucket is ragged). */
static int64_t local_elems(const mf_schedule *s, const mf_bucket *b, int role)
{
    return mf_layout_bucket_capacity(&s->mesh, b, &b->place[role]);
}

static const char *phases_of(const mf_plan *p, int b, int t)
{
    if (t == MF_T2 && p->sched->units[p->sched->buckets[b].unit].reshard_after_forward)
        return "forward_pre+backward_pre";
    return mf_phase_name(mf_trans_rules[t].phase);
}

static const char *transition_to_label(const mf_plan *p, int b, int t)
{
    const mf_bucket *bk = &p->sched->buckets[b];
    if (t == MF_T4 && mf_placement_equal(&bk->place[MF_ROLE_GRAD], &bk->place[MF_ROLE_MAIN_WEIGHT], p->sched->mesh.naxes))
        return "grad"; /* no grad_final: grad is the delivered gradient */
    if (t == MF_T2 && p->trans[b][t].nsteps == 0)
        return "weight"; /* W = Rep: no weight_full, weight is unsharded */
    return mf_trans_rules[t].to_buf;
}

static mf_balance balance_of(const mf_plan *p)
{
    return p->spec ? p->spec->balance : MF_BALANCE_BYTES;
}

static const char *balance_name(mf_balance b)
{
#define MF_BALANCE_NAME(E, name) name,
    static const char *const names[] = {MF_BALANCE_LIST(MF_BALANCE_NAME)};
#undef MF_BALANCE_NAME
    return (int)b >= 0 && (int)b < MF_BALANCE_COUNT ? names[b] : "?";
}

/* The whole roles of bucket b, "grad, main_weight". */
static const char *whole_roles(const mf_bucket *b, char *buf, size_t size)
{
    buf[0] = '\0';
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (b->whole[r])
            snprintf(buf + strlen(buf), size - strlen(buf), "%s%s", buf[0] ? ", " : "", mf_role_name((mf_role)r));
    return buf;
}

/* Bucket bi with its owners per shard (mf_plan_owners_shards): P shards of
 * the finest whole placement, that of role `role`. */
typedef struct owners_view {
    const mf_bucket *b;
    int64_t P;
    int role;
    mf_plan_owner_shard *o; /* P; the caller frees */
} owners_view;

/* False when bucket bi is not whole (or on OOM). */
static bool owners_of(const mf_plan *p, int bi, owners_view *v)
{
    v->b = &p->sched->buckets[bi];
    v->P = 0;
    v->role = MF_ROLE_MAIN_WEIGHT;
    const mf_placement *fine = mf_plan_owners_finest(&p->sched->mesh, v->b, &v->role);
    if (!fine)
        return false;
    v->o = malloc((size_t)mf_layout_shards(&p->sched->mesh, fine) * sizeof *v->o);
    if (v->o)
        v->P = mf_plan_owners_shards(p->sched, v->b, balance_of(p), v->o);
    return v->o != NULL;
}

/* The shards' used elements: the padding factor is P*S (the length) over it. */
static int64_t shards_used(const mf_plan_owner_shard *o, int64_t P)
{
    int64_t used = 0;
    for (int64_t q = 0; q < P; q++)
        used += o[q].used;
    return used;
}

/* Parts per million of P*S over the used elements (1000000 when none is). */
static int64_t padding_ppm(int64_t length, int64_t used)
{
    return used > 0 ? (int64_t)llround((double)length * 1e6 / (double)used) : 1000000;
}

/* ---------------------------------------------------------------- text */

static void text_header(const mf_plan *p, FILE *out)
{
    const mf_schedule *s = p->sched;
    const mf_spec *spec = p->spec;
    fprintf(out, "; mfsdpc explain %s\n", s->source);
    fprintf(out, "mesh        ");
    for (int j = 0; j < s->mesh.naxes; j++)
        fprintf(out, "%s%s=%lld", j ? " x " : "", s->mesh.axes[j].name, (long long)s->mesh.axes[j].size);
    fprintf(out, "  (world %lld, outermost first)\n", (long long)s->mesh.world);
    fprintf(out, "step        microbatches %lld, reduce %s, align %lld B, prefetch %d, bucket_size ",
            (long long)s->microbatches, mf_reduce_name(s->reduce), (long long)s->align, s->prefetch);
    if (spec && spec->bucket_size > 0)
        fprintf(out, "%lld B\n", (long long)spec->bucket_size);
    else
        fprintf(out, "0 (no merging)\n");
    fprintf(out, "cost model  ");
    for (int j = 0; j < s->mesh.naxes; j++)
        fprintf(out, "%s: alpha %.2f us, beta %.1f GB/s; ", s->mesh.axes[j].name, p->cost.axis[j].alpha * 1e6,
                p->cost.axis[j].beta / 1e9);
    fprintf(out, "launch %.2f us; local %.1f GB/s\n", p->cost.launch * 1e6, p->cost.local_bw / 1e9);
}

/* The axis groups a collective on `axis` spans, for a step whose placement
 * has a Distinct axis: "over dp_inner within each (dp_outer, ep): 4 groups of
 * 2 ranks, never across ep (Distinct)" (docs/semantics.md §4.7). */
static const char *groups_of(const mf_mesh *m, int axis, const mf_placement *pl, char *buf, size_t size)
{
    char others[160] = "", distinct[160] = "";
    for (int j = 0; j < m->naxes; j++) {
        if (j != axis)
            snprintf(others + strlen(others), sizeof others - strlen(others), "%s%s", others[0] ? ", " : "",
                     m->axes[j].name);
        if (pl->p[j] == MF_PLACE_DISTINCT)
            snprintf(distinct + strlen(distinct), sizeof distinct - strlen(distinct), "%s%s",
                     distinct[0] ? ", " : "", m->axes[j].name);
    }
    snprintf(buf, size, "over %s within each (%s): %lld groups of %lld ranks, never across %s (Distinct)",
             m->axes[axis].name, others, (long long)(m->world / m->axes[axis].size), (long long)m->axes[axis].size,
             distinct);
    return buf;
}

static void text_steps(const mf_plan *p, const mf_transition *tr, FILE *out)
{
    const mf_mesh *m = &p->sched->mesh;
    if (tr->nsteps == 0) {
        fprintf(out, "        (no steps: the placements already agree)\n");
        return;
    }
    fprintf(out, "        %-3s %-15s %-12s %-6s %-5s %-5s %-5s %-6s %14s %14s\n", "#", "op", "axis", "stream", "dtype",
            "from", "to", "when", "count", "bytes/rank");
    for (int i = 0; i < tr->nsteps; i++) {
        const mf_step *st = &tr->steps[i];
        char f[MF_MAX_AXES + 1], t[MF_MAX_AXES + 1];
        fprintf(out, "        %-3d %-15s %-12s %-6s %-5s %-5s %-5s %-6s %14lld %14lld\n", i, mf_opkind_name(st->kind),
                st->axis >= 0 ? m->axes[st->axis].name : "-", mf_stream_name(st->stream), mf_dtype_name(st->dtype),
                mf_placement_letters(&st->from, m->naxes, f), mf_placement_letters(&st->to, m->naxes, t),
                mf_when_name(tr->when), (long long)st->count, (long long)st->bytes);
        char g[256];
        if (mf_opkind_is_collective(st->kind) && mf_placement_has_distinct(&st->from, m->naxes))
            fprintf(out, "            %s\n", groups_of(m, st->axis, &st->from, g, sizeof g));
    }
}

/* How many ranks and tensors a row of the owners table names. */
#define MF_EXPLAIN_OWNERS_SHOWN 4

/* "0 (0,0), 4 (1,0)": the ranks holding shard q of placement pl. */
static void text_shard_ranks(const mf_mesh *m, const mf_placement *pl, int64_t q, FILE *out)
{
    int64_t c[MF_MAX_AXES];
    int shown = 0, more = 0;
    for (int64_t r = 0; r < m->world; r++) {
        mf_layout_mesh_coords(m, r, c);
        if (mf_layout_shard_index(m, pl, c) != q)
            continue;
        if (shown == MF_EXPLAIN_OWNERS_SHOWN) {
            more++;
            continue;
        }
        fprintf(out, "%s%lld (", shown++ ? ", " : "", (long long)r);
        for (int j = 0; j < m->naxes; j++)
            fprintf(out, "%s%lld", j ? "," : "", (long long)c[j]);
        fputc(')', out);
    }
    if (more)
        fprintf(out, " and %d more", more);
}

/* Each collective step of bucket bi: bytes per rank per launch in the
 * used-prefix form (the step's) and in the padded form (the ring's). */
static void text_whole_collectives(const mf_plan *p, int bi, FILE *out)
{
    const mf_mesh *m = &p->sched->mesh;
    fprintf(out, "      %-34s %16s %16s\n", "collectives (bytes/rank/launch)", "prefix form", "padded form");
    for (int t = 0; t < MF_NTRANSITIONS; t++)
        for (int i = 0; i < p->trans[bi][t].nsteps; i++) {
            const mf_step *st = &p->trans[bi][t].steps[i];
            if (!mf_opkind_is_collective(st->kind))
                continue;
            char what[64];
            snprintf(what, sizeof what, "T%d %s %s", t + 1, mf_opkind_name(st->kind), m->axes[st->axis].name);
            fprintf(out, "        %-32s %16lld %16lld\n", what, (long long)st->bytes,
                    (long long)mf_schedule_collective_bytes(st->kind, m->axes[st->axis].size, st->count, st->dtype));
        }
}

/* The owners table of a whole bucket (docs/semantics.md §9.1). */
static void text_owners(const mf_plan *p, int bi, FILE *out)
{
    const mf_schedule *s = p->sched;
    owners_view v;
    if (!owners_of(p, bi, &v))
        return;
    char wr[64], pl[128];
    fprintf(out, "    owners   Whole %s; %lld shards of %s %s (the finest); balance %s\n",
            whole_roles(v.b, wr, sizeof wr), (long long)v.P, mf_role_name((mf_role)v.role),
            mf_plan_owners_placement(v.b, v.role, s->mesh.naxes, pl, sizeof pl), balance_name(balance_of(p)));
    fprintf(out, "      %-5s %7s %14s %14s %14s %14s  %s\n", "shard", "tensors", "used", "main_weight B", "grad B", "cost",
            "ranks (coords)");
    for (int64_t q = 0; q < v.P; q++) {
        fprintf(out, "      %-5lld %7d %14lld %14lld %14lld %14lld  ", (long long)q, v.o[q].ntensors,
                (long long)v.o[q].used, (long long)v.o[q].main_bytes, (long long)v.o[q].grad_bytes,
                (long long)v.o[q].cost);
        text_shard_ranks(&s->mesh, &v.b->place[v.role], q, out);
        fputc('\n', out);
        if (v.o[q].ntensors > 0) {
            fprintf(out, "      %-5s ", "");
            for (int i = 0; i < v.o[q].ntensors && i < MF_EXPLAIN_OWNERS_SHOWN; i++)
                fprintf(out, "%s%s", i ? ", " : "", v.b->tensors[v.o[q].first + i].name);
            if (v.o[q].ntensors > MF_EXPLAIN_OWNERS_SHOWN)
                fprintf(out, " and %d more", v.o[q].ntensors - MF_EXPLAIN_OWNERS_SHOWN);
            fputc('\n', out);
        }
    }
    int64_t used = shards_used(v.o, v.P);
    if (v.b->bounds)
        fprintf(out, "      padding factor L/sum(used) = %lld / %lld = %.4f (ragged shards, the longest %lld)\n",
                (long long)v.b->length, (long long)used, (double)padding_ppm(v.b->length, used) / 1e6,
                (long long)local_elems(s, v.b, v.role));
    else
        fprintf(out, "      padding factor P*S/sum(used) = %lld x %lld / %lld = %.4f\n", (long long)v.P,
                (long long)(v.b->length / v.P), (long long)used, (double)padding_ppm(v.b->length, used) / 1e6);
    text_whole_collectives(p, bi, out);
    free(v.o);
}

static void text_bucket(const mf_plan *p, int bi, FILE *out)
{
    const mf_schedule *s = p->sched;
    const mf_bucket *b = &s->buckets[bi];
    int k = s->mesh.naxes;
    char h1[32], h2[32];
    fprintf(out, "  bucket %d %s  layout %s", bi, b->name, b->layout);
    if (b->last_unit != b->unit)
        fprintf(out, "  (merged: units %s .. %s)", s->units[b->unit].name, s->units[b->last_unit].name);
    fputc('\n', out);
    int64_t pad = b->length - b->used, gaps = b->used;
    for (int i = 0; i < b->ntensors; i++)
        gaps -= b->tensors[i].numel;
    fprintf(out, "    length %lld elements = %lld used (%lld of them alignment gaps) + %lld padding (%.2f%%)\n",
            (long long)b->length, (long long)b->used, (long long)gaps, (long long)pad,
            b->length ? 100.0 * (double)(b->length - b->used + gaps) / (double)b->length : 0.0);
    fprintf(out, "    %-12s %-5s %-36s %16s %16s\n", "role", "dtype", "placement", "elements/rank", "bytes/rank");
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        char pl[128];
        int64_t n = local_elems(s, b, r);
        fprintf(out, "    %-12s %-5s %-36s %16lld %16lld\n", mf_role_name((mf_role)r), mf_dtype_name(b->dtype[r]),
                mf_plan_owners_placement(b, r, k, pl, sizeof pl), (long long)n,
                (long long)(n * (int64_t)mf_dtype_size(b->dtype[r])));
    }
    if (b->bounds) /* docs/semantics.md §4.6 */
        fprintf(out, "    ragged shards: elements/rank is each role's longest shard; each rank holds only its "
                     "own range (owners below)\n");
    fprintf(out, "    %-12s %14s %14s  %s\n", "tensors", "offset", "numel", "name shape");
    for (int i = 0; i < b->ntensors; i++) {
        const mf_tensor *t = &b->tensors[i];
        fprintf(out, "    %-12s %14lld %14lld  %s [", "", (long long)t->offset, (long long)t->numel, t->name);
        for (int dd = 0; dd < t->ndims; dd++)
            fprintf(out, "%s%lld", dd ? ", " : "", (long long)t->dims[dd]);
        fprintf(out, "]\n");
    }
    for (int t = 0; t < MF_NTRANSITIONS; t++) {
        const mf_transition *tr = &p->trans[bi][t];
        char f[128], g[128];
        fprintf(out, "    T%d %-5s %s %s %s -> %s %s %s  at %s, %lld/step, %.2f us each\n", tr->id,
                mf_when_name(tr->when), mf_trans_rules[t].from_buf, mf_placement_format(&tr->from, k, f, sizeof f),
                mf_dtype_name(tr->from_dtype), transition_to_label(p, bi, t),
                mf_placement_format(&tr->to, k, g, sizeof g), mf_dtype_name(tr->to_dtype), phases_of(p, bi, t),
                (long long)mf_plan_stats_transition_runs(p, bi, t), tr->cost * 1e6);
        text_steps(p, tr, out);
        if (tr->why)
            fprintf(out, "        why: %s\n", tr->why);
    }
    mf_bucket_memory m;
    mf_bucket_memory_of(p, bi, &m);
    char h3[32], h4[32];
    fprintf(out, "    memory/rank main_weight  persistent %s\n", mf_human_bytes(m.main_weight, h1, sizeof h1));
    fprintf(out, "    memory/rank weight       persistent %s (at rest)  transient %s (unsharded %s, stages %s)\n",
            mf_human_bytes(m.persistent[MF_ROLE_WEIGHT], h1, sizeof h1), mf_human_bytes(m.transient[MF_ROLE_WEIGHT], h2, sizeof h2),
            mf_human_bytes(m.weight_full, h3, sizeof h3), mf_human_bytes(m.weight_stage, h4, sizeof h4));
    fprintf(out, "    memory/rank grad         persistent %s (accumulation %s, ", mf_human_bytes(m.persistent[MF_ROLE_GRAD], h1, sizeof h1),
            mf_human_bytes(m.grad, h2, sizeof h2));
    fprintf(out, "final %s)  transient %s ", mf_human_bytes(m.grad_final, h1, sizeof h1), mf_human_bytes(m.transient[MF_ROLE_GRAD], h2, sizeof h2));
    fprintf(out, "(local %s, stages %s)\n", mf_human_bytes(m.grad_local, h1, sizeof h1), mf_human_bytes(m.grad_stage, h2, sizeof h2));
    text_owners(p, bi, out);
}

static bool any_whole(const mf_schedule *s)
{
    for (int b = 0; b < s->nbuckets; b++)
        if (mf_layout_bucket_whole(&s->buckets[b]))
            return true;
    return false;
}

/* max / mean over the ranks of four figures: total main_weight bytes, owned
 * main_weight bytes, cost, Newton-Schulz FLOPs. */
typedef struct rank_spread {
    double max[4], mean[4];
} rank_spread;

static double rank_figure(const mf_plan_owner_rank *o, int k)
{
    switch (k) {
    case 0: return (double)(o->owned_bytes + o->sharded_bytes);
    case 1: return (double)o->owned_bytes;
    case 2: return (double)o->cost;
    default: return o->flops;
    }
}

static rank_spread spread_of(const mf_plan_owner_rank *o, int64_t world)
{
    rank_spread x = {{0}, {0}};
    for (int k = 0; k < 4; k++) {
        for (int64_t r = 0; r < world; r++) {
            double v = rank_figure(&o[r], k);
            x.mean[k] += v / (double)world;
            x.max[k] = v > x.max[k] ? v : x.max[k];
        }
    }
    return x;
}

/* max/mean in parts per million (1000000 when the mean is 0). */
static int64_t ratio_ppm(const rank_spread *x, int k)
{
    return x->mean[k] > 0 ? (int64_t)llround(x->max[k] / x->mean[k] * 1e6) : 1000000;
}

static const char *const spread_names[4] = {"main_weight_bytes", "owned_bytes", "cost", "ns_flops"};

/* The owners per rank over the whole schedule (mf_plan_owners_ranks), or NULL
 * (no whole bucket, OOM). The caller frees. */
static mf_plan_owner_rank *ranks_of(const mf_plan *p)
{
    if (!any_whole(p->sched))
        return NULL;
    mf_plan_owner_rank *o = malloc((size_t)p->sched->mesh.world * sizeof *o);
    if (o)
        mf_plan_owners_ranks(p->sched, balance_of(p), o);
    return o;
}

/* max / bound in parts per million (1000000 when the bound is 0). */
static int64_t bound_ppm(double max, const mf_plan_owner_bound *b)
{
    return b->bound > 0 ? (int64_t)llround(max / b->bound * 1e6) : 1000000;
}

/* The bound's reason for people: "pigeonhole: 2 of the 65 largest share one
 * of 64 shards". */
static const char *bound_why(const mf_plan_owner_bound *b, char *buf, size_t size)
{
    if (strcmp(b->why, "units") == 0) {
        snprintf(buf, size, "units of %.6g: each of %lld shards holds whole units of its tensors", b->unit,
                 (long long)b->unit_P);
        return buf;
    }
    if (strcmp(b->why, "pigeonhole") != 0)
        return b->why;
    snprintf(buf, size, "pigeonhole: %lld of the %lld largest share one of %lld shards", (long long)(b->k + 1),
             (long long)(b->k * b->P + 1), (long long)b->P);
    return buf;
}

/* The lower bounds any dealing of the whole tensors must reach, next to the
 * dealing's max (mf_plan_owners_bound): the proof that it cannot be beaten
 * when max/bound is 1. */
static void text_owner_bounds(const mf_plan *p, const rank_spread *x, FILE *out)
{
    static const struct { bool flops; int k; const char *name; } rows[] = {
        {false, 1, "owned bytes"}, {true, 3, "Newton-Schulz FLOPs"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        mf_plan_owner_bound b;
        char why[128];
        if (!mf_plan_owners_bound(p->sched, rows[i].flops, &b))
            return;
        fprintf(out, "  %-20s max %.6g, no dealing below %.6g (%s): max/bound %.4f\n", rows[i].name,
                x->max[rows[i].k], b.bound, bound_why(&b, why, sizeof why),
                (double)bound_ppm(x->max[rows[i].k], &b) / 1e6);
    }
}

static void text_rank_owners(const mf_plan *p, FILE *out)
{
    const mf_schedule *s = p->sched;
    mf_plan_owner_rank *o = ranks_of(p);
    if (!o)
        return;
    fprintf(out, "\nowners per rank (main_weight: owned = whole on the rank, sharded = held of the other buckets; "
                 "balance %s)\n", balance_name(balance_of(p)));
    fprintf(out, "  %-5s %-10s %6s %16s %16s %16s %16s %14s\n", "rank", "coords", "owned", "owned B", "sharded B", "main_weight B",
            "cost", "NS GFLOP");
    for (int64_t r = 0; r < s->mesh.world; r++) {
        int64_t c[MF_MAX_AXES];
        char co[64] = "";
        mf_layout_mesh_coords(&s->mesh, r, c);
        for (int j = 0; j < s->mesh.naxes; j++)
            snprintf(co + strlen(co), sizeof co - strlen(co), "%s%lld", j ? "," : "", (long long)c[j]);
        fprintf(out, "  %-5lld %-10s %6lld %16lld %16lld %16lld %16lld %14.3f\n", (long long)r, co, (long long)o[r].owned,
                (long long)o[r].owned_bytes, (long long)o[r].sharded_bytes, (long long)(o[r].owned_bytes + o[r].sharded_bytes),
                (long long)o[r].cost, o[r].flops / 1e9);
    }
    rank_spread x = spread_of(o, s->mesh.world);
    fprintf(out, "  max/mean  main_weight bytes %.4f, owned bytes %.4f, cost %.4f, Newton-Schulz FLOPs %.4f\n",
            (double)ratio_ppm(&x, 0) / 1e6, (double)ratio_ppm(&x, 1) / 1e6, (double)ratio_ppm(&x, 2) / 1e6,
            (double)ratio_ppm(&x, 3) / 1e6);
    text_owner_bounds(p, &x, out);
    free(o);
}

/* The interference bound with its clique (docs/semantics.md §10): the same
 * search as the summary's interference_bytes, run again for the members. */
static bool interference_of(const mf_schedule *s, mf_interfere *x)
{
    mf_live lv;
    memset(x, 0, sizeof *x);
    if (!mf_live_build(s, &lv))
        return false;
    bool ok = mf_interfere_bound(s, &lv, MF_INTERFERE_WORK, x);
    mf_live_free(&lv);
    return ok;
}

/* How many clique members the text form names. */
#define MF_EXPLAIN_CLIQUE_SHOWN 8

static void text_interference(const mf_schedule *s, const mf_interfere *x, FILE *out)
{
    char h1[32];
    fprintf(out, "               arena interference lower bound %s%s (%lld bytes), arena/bound %.3f\n",
            x->exact ? "" : "at least ", mf_human_bytes(x->bytes, h1, sizeof h1), (long long)x->bytes,
            x->bytes > 0 ? (double)s->mem_transient / (double)x->bytes : 1.0);
    fprintf(out, "               = %d buffers whose live ranges pairwise meet; with one address per buffer "
                 "for the run they must be disjoint:\n", x->nmembers);
    for (int k = 0; k < x->nmembers && k < MF_EXPLAIN_CLIQUE_SHOWN; k++)
        fprintf(out, "                 %s (%lld bytes)\n", s->buffers[x->members[k]].name,
                (long long)mf_live_bytes(s, x->members[k]));
    if (x->nmembers > MF_EXPLAIN_CLIQUE_SHOWN)
        fprintf(out, "                 ... and %d more\n", x->nmembers - MF_EXPLAIN_CLIQUE_SHOWN);
}

/* The evaluation pass and the short step (docs/schedule.md §3.1). */
static int text_eval(const mf_schedule *s, FILE *out)
{
    mf_eval_figures ev;
    char h1[32], h2[32];
    if (!s->programs)
        return 0;
    if (!mf_programs_eval_figures(s, &ev))
        return -1;
    fprintf(out, "evaluation pass (eval_forward_pre/post, between steps; no gradient buffers)\n");
    fprintf(out, "  memory/rank  peak transient %s (%lld bytes) of the arena's %s; allocated as for the step\n",
            mf_human_bytes(ev.peak_transient, h1, sizeof h1), (long long)ev.peak_transient,
            mf_human_bytes(s->mem_transient, h2, sizeof h2));
    fprintf(out, "  bytes/rank   %-28s %14s  (%lld launches a pass)\n", "axis", "bytes/pass", (long long)ev.launches);
    for (int j = 0; j < s->mesh.naxes; j++)
        fprintf(out, "               %-28s %14lld  %s\n", s->mesh.axes[j].name, (long long)ev.bytes[j],
                mf_human_bytes(ev.bytes[j], h1, sizeof h1));
    fprintf(out, "short step (step_end after m < M microbatches): the T4 reductions back to back, the "
                 "step's memory\n");
    return 0;
}

static int text_totals(const mf_plan *p, FILE *out)
{
    const mf_schedule *s = p->sched;
    mf_summary sum;
    mf_plan_memory mem;
    if (!mf_plan_totals(p, &sum) || !mf_plan_memory_of(p, &mem))
        return -1;
    char h1[32], h2[32], h3[32];
    fprintf(out, "\ntotals per step (T1 once, T2 M times per pre-hook, T3 M times, T4 once; M = %lld)\n",
            (long long)s->microbatches);
    fprintf(out, "  collectives  %-15s %-12s %14s\n", "op", "axis", "launches/step");
    int64_t all = 0;
    for (int kind = 0; kind < MF_OPKIND_COUNT; kind++)
        for (int j = 0; j < s->mesh.naxes; j++)
            if (sum.collectives[kind][j]) {
                fprintf(out, "               %-15s %-12s %14lld\n", mf_opkind_name((mf_opkind)kind),
                        s->mesh.axes[j].name, (long long)sum.collectives[kind][j]);
                all += sum.collectives[kind][j];
            }
    fprintf(out, "               %-15s %-12s %14lld\n", "all", "", (long long)all);
    fprintf(out, "  bytes/rank   %-28s %14s\n", "axis", "bytes/step");
    for (int j = 0; j < s->mesh.naxes; j++)
        fprintf(out, "               %-28s %14lld  %s\n", s->mesh.axes[j].name, (long long)sum.bytes[j],
                mf_human_bytes(sum.bytes[j], h1, sizeof h1));
    /* The one peak (docs/semantics.md §9): what the runtime allocates, from
     * the buffer assignment; the live-bytes bound next to it. */
    const mf_summary *ss = &s->summary;
    fprintf(out, "  memory/rank  peak %s (%lld bytes) allocated = persistent region %s + arena %s%s\n",
            mf_human_bytes(ss->allocated_bytes, h1, sizeof h1), (long long)ss->allocated_bytes,
            mf_human_bytes(s->mem_persistent, h2, sizeof h2), mf_human_bytes(s->mem_transient, h3, sizeof h3),
            mf_persist_any_per_rank(s) ? " (the region: the most over the ranks, ragged whole buckets)" : "");
    fprintf(out, "               arena live-bytes lower bound %s (%lld bytes), arena/bound %.3f\n",
            mf_human_bytes(ss->live_bytes, h1, sizeof h1), (long long)ss->live_bytes,
            ss->live_bytes > 0 ? (double)s->mem_transient / (double)ss->live_bytes : 1.0);
    mf_interfere x;
    if (!interference_of(s, &x))
        return -1;
    text_interference(s, &x, out);
    mf_interfere_free(&x);
    fprintf(out, "  model/rank   by role, not the peak: persistent + the largest sum over prefetch+1 = %d "
                 "consecutive units\n", s->prefetch + 1);
    fprintf(out, "               %-12s %14s %16s %14s\n", "role", "persistent", "window", "model");
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        fprintf(out, "               %-12s %14s %16s %14s\n", mf_role_name((mf_role)r),
                mf_human_bytes(mem.persistent[r], h1, sizeof h1), mf_human_bytes(mem.transient_peak[r], h2, sizeof h2),
                mf_human_bytes(mem.peak[r], h3, sizeof h3));
    fprintf(out, "               %-12s %14s %16s %14s  (%lld bytes)\n", "total", mf_human_bytes(mem.persistent_total, h1, sizeof h1),
            mf_human_bytes(mem.transient_peak_total, h2, sizeof h2), mf_human_bytes(mem.peak_total, h3, sizeof h3),
            (long long)mem.peak_total);
    return text_eval(s, out);
}

int mf_explain_text(const mf_plan *p, FILE *out)
{
    const mf_schedule *s = p->sched;
    text_header(p, out);
    for (int u = 0; u < s->nunits; u++) {
        const mf_unit *unit = &s->units[u];
        fprintf(out, "\nunit %d %s  (reshard_after_forward %s, %d bucket%s)\n", u, unit->name,
                unit->reshard_after_forward ? "true" : "false", unit->nbuckets, unit->nbuckets == 1 ? "" : "s");
        if (unit->nbuckets == 0)
            fprintf(out, "  (its tensors live in a merged bucket of an earlier unit)\n");
        for (int b = unit->first_bucket; b < unit->first_bucket + unit->nbuckets; b++)
            text_bucket(p, b, out);
    }
    if (text_totals(p, out) != 0)
        return -1;
    text_rank_owners(p, out);
    return fflush(out) == 0 && !ferror(out) ? 0 : -1;
}

/* ---------------------------------------------------------------- yaml */

typedef struct yout {
    yaml_emitter_t em;
    bool err;
} yout;

static void y_emit(yout *y, yaml_event_t *ev, int init_ok)
{
    if (y->err) {
        if (init_ok)
            yaml_event_delete(ev);
        return;
    }
    if (!init_ok || !yaml_emitter_emit(&y->em, ev)) /* emit frees the event either way */
        y->err = true;
}

static void y_str(yout *y, const char *s)
{
    yaml_event_t ev;
    int ok = yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1,
                                          mf_yaml_str_style(s));
    y_emit(y, &ev, ok);
}

static void y_raw(yout *y, const char *s)
{
    yaml_event_t ev;
    int ok = yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 0,
                                          YAML_PLAIN_SCALAR_STYLE);
    y_emit(y, &ev, ok);
}

static void y_int(yout *y, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    y_raw(y, buf);
}

static void y_map(yout *y, bool flow)
{
    yaml_event_t ev;
    int ok = yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, flow ? YAML_FLOW_MAPPING_STYLE : YAML_BLOCK_MAPPING_STYLE);
    y_emit(y, &ev, ok);
}

static void y_end_map(yout *y)
{
    yaml_event_t ev;
    y_emit(y, &ev, yaml_mapping_end_event_initialize(&ev));
}

static void y_seq(yout *y, bool flow)
{
    yaml_event_t ev;
    int ok = yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                                  flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE);
    y_emit(y, &ev, ok);
}

static void y_end_seq(yout *y)
{
    yaml_event_t ev;
    y_emit(y, &ev, yaml_sequence_end_event_initialize(&ev));
}

static void y_kstr(yout *y, const char *k, const char *v)
{
    y_raw(y, k);
    y_str(y, v);
}

static void y_kint(yout *y, const char *k, int64_t v)
{
    y_raw(y, k);
    y_int(y, v);
}

static void y_kbool(yout *y, const char *k, bool v)
{
    y_raw(y, k);
    y_raw(y, v ? "true" : "false");
}

/* whole: Flat axes spelled Whole (a whole role's, mf_bucket.whole). */
static void y_placement_as(yout *y, const char *k, const mf_placement *pl, int naxes, bool whole)
{
    y_raw(y, k);
    y_seq(y, true);
    for (int j = 0; j < naxes; j++)
        y_raw(y, mf_role_place_name(pl, j, whole));
    y_end_seq(y);
}

static void y_placement(yout *y, const char *k, const mf_placement *pl, int naxes)
{
    y_placement_as(y, k, pl, naxes, false);
}

static int64_t ns(double seconds)
{
    return (int64_t)llround(seconds * 1e9);
}

/* The mesh's axes: each one's name and size, or (cost) its link's figures. */
static void yaml_axes(yout *y, const mf_plan *p, bool cost)
{
    const mf_mesh *m = &p->sched->mesh;
    y_raw(y, "axes");
    y_seq(y, true);
    for (int j = 0; j < m->naxes; j++) {
        y_map(y, true);
        y_kstr(y, "name", m->axes[j].name);
        if (cost) {
            y_kint(y, "alpha_ns", ns(p->cost.axis[j].alpha));
            y_kint(y, "beta_bytes_per_s", (int64_t)llround(p->cost.axis[j].beta));
        } else {
            y_kint(y, "size", m->axes[j].size);
        }
        y_end_map(y);
    }
    y_end_seq(y);
}

static void yaml_header(yout *y, const mf_plan *p)
{
    const mf_schedule *s = p->sched;
    y_kstr(y, "format", "mfsdp-explain/1");
    y_kstr(y, "source", s->source);
    y_raw(y, "mesh");
    y_map(y, true);
    yaml_axes(y, p, false);
    y_kint(y, "world", s->mesh.world);
    y_end_map(y);
    y_kint(y, "microbatches", s->microbatches);
    y_kstr(y, "reduce", mf_reduce_name(s->reduce));
    y_kint(y, "align", s->align);
    y_kint(y, "prefetch", s->prefetch);
    y_kint(y, "bucket_size", p->spec ? p->spec->bucket_size : 0);
    y_raw(y, "cost");
    y_map(y, true);
    yaml_axes(y, p, true);
    y_kint(y, "launch_ns", ns(p->cost.launch));
    y_kint(y, "local_bytes_per_s", (int64_t)llround(p->cost.local_bw));
    y_end_map(y);
}

static void yaml_transition(yout *y, const mf_plan *p, int bi, int t)
{
    const mf_mesh *m = &p->sched->mesh;
    const mf_transition *tr = &p->trans[bi][t];
    y_map(y, false);
    y_kint(y, "id", tr->id);
    y_kstr(y, "when", mf_when_name(tr->when));
    y_kstr(y, "phases", phases_of(p, bi, t));
    y_raw(y, "from");
    y_map(y, true);
    y_kstr(y, "buffer", mf_trans_rules[t].from_buf);
    y_kstr(y, "role", mf_role_name(mf_trans_rules[t].from_role));
    y_placement(y, "placement", &tr->from, m->naxes);
    y_kstr(y, "dtype", mf_dtype_name(tr->from_dtype));
    y_end_map(y);
    y_raw(y, "to");
    y_map(y, true);
    y_kstr(y, "buffer", transition_to_label(p, bi, t));
    y_kstr(y, "role", mf_role_name(mf_trans_rules[t].to_role));
    y_placement(y, "placement", &tr->to, m->naxes);
    y_kstr(y, "dtype", mf_dtype_name(tr->to_dtype));
    y_end_map(y);
    y_kint(y, "runs_per_step", mf_plan_stats_transition_runs(p, bi, t));
    y_kint(y, "cost_ns", ns(tr->cost));
    if (tr->why)
        y_kstr(y, "why", tr->why);
    y_raw(y, "steps");
    y_seq(y, false);
    for (int i = 0; i < tr->nsteps; i++) {
        const mf_step *st = &tr->steps[i];
        y_map(y, true);
        y_kstr(y, "op", mf_opkind_name(st->kind));
        if (st->axis >= 0)
            y_kstr(y, "axis", m->axes[st->axis].name);
        y_kstr(y, "stream", mf_stream_name(st->stream));
        y_kstr(y, "when", mf_when_name(tr->when));
        y_kstr(y, "dtype", mf_dtype_name(st->dtype));
        y_placement(y, "from", &st->from, m->naxes);
        y_placement(y, "to", &st->to, m->naxes);
        y_kint(y, "count", st->count);
        y_kint(y, "bytes", st->bytes);
        char g[256];
        if (mf_opkind_is_collective(st->kind) && mf_placement_has_distinct(&st->from, m->naxes))
            y_kstr(y, "groups", groups_of(m, st->axis, &st->from, g, sizeof g));
        y_end_map(y);
    }
    y_end_seq(y);
    y_end_map(y);
}

static void yaml_whole_collectives(yout *y, const mf_plan *p, int bi)
{
    const mf_mesh *m = &p->sched->mesh;
    y_raw(y, "collectives");
    y_seq(y, false);
    for (int t = 0; t < MF_NTRANSITIONS; t++)
        for (int i = 0; i < p->trans[bi][t].nsteps; i++) {
            const mf_step *st = &p->trans[bi][t].steps[i];
            if (!mf_opkind_is_collective(st->kind))
                continue;
            y_map(y, true);
            y_kint(y, "transition", t + 1);
            y_kstr(y, "op", mf_opkind_name(st->kind));
            y_kstr(y, "axis", m->axes[st->axis].name);
            y_kint(y, "prefix_bytes", st->bytes);
            y_kint(y, "padded_bytes", mf_schedule_collective_bytes(st->kind, m->axes[st->axis].size, st->count, st->dtype));
            y_end_map(y);
        }
    y_end_seq(y);
}

static void yaml_shard_ranks(yout *y, const mf_mesh *m, const mf_placement *pl, int64_t q)
{
    int64_t c[MF_MAX_AXES];
    y_raw(y, "ranks");
    y_seq(y, true);
    for (int64_t r = 0; r < m->world; r++) {
        mf_layout_mesh_coords(m, r, c);
        if (mf_layout_shard_index(m, pl, c) == q)
            y_int(y, r);
    }
    y_end_seq(y);
}

/* owners: the owners table of a whole bucket (absent otherwise). */
static void yaml_owners(yout *y, const mf_plan *p, int bi)
{
    const mf_schedule *s = p->sched;
    owners_view v;
    if (!owners_of(p, bi, &v))
        return;
    y_raw(y, "owners");
    y_map(y, false);
    y_raw(y, "whole");
    y_seq(y, true);
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (v.b->whole[r])
            y_str(y, mf_role_name((mf_role)r));
    y_end_seq(y);
    y_kstr(y, "finest", mf_role_name((mf_role)v.role));
    y_kstr(y, "balance", balance_name(balance_of(p)));
    y_kint(y, "shards", v.P);
    y_kint(y, "shard_length", local_elems(p->sched, v.b, v.role)); /* the longest shard */
    int64_t used = shards_used(v.o, v.P);
    y_kint(y, "used", used);
    y_kint(y, "padding_factor_ppm", padding_ppm(v.b->length, used));
    y_raw(y, "shard_list");
    y_seq(y, false);
    for (int64_t q = 0; q < v.P; q++) {
        y_map(y, true);
        y_kint(y, "shard", q);
        yaml_shard_ranks(y, &s->mesh, &v.b->place[v.role], q);
        y_raw(y, "tensors");
        y_seq(y, true);
        for (int i = 0; i < v.o[q].ntensors; i++)
            y_str(y, v.b->tensors[v.o[q].first + i].name);
        y_end_seq(y);
        y_kint(y, "used", v.o[q].used);
        y_kint(y, "main_weight_bytes", v.o[q].main_bytes);
        y_kint(y, "grad_bytes", v.o[q].grad_bytes);
        y_kint(y, "cost", v.o[q].cost);
        y_end_map(y);
    }
    y_end_seq(y);
    yaml_whole_collectives(y, p, bi);
    y_end_map(y);
    free(v.o);
}

static void yaml_bucket(yout *y, const mf_plan *p, int bi)
{
    const mf_schedule *s = p->sched;
    const mf_bucket *b = &s->buckets[bi];
    int k = s->mesh.naxes;
    y_map(y, false);
    y_kint(y, "id", bi);
    y_kstr(y, "name", b->name);
    y_kstr(y, "layout", b->layout);
    y_kstr(y, "first_unit", s->units[b->unit].name);
    y_kstr(y, "last_unit", s->units[b->last_unit].name);
    int64_t gaps = b->used;
    for (int i = 0; i < b->ntensors; i++)
        gaps -= b->tensors[i].numel;
    y_kint(y, "length", b->length);
    y_kint(y, "used", b->used);
    y_kint(y, "gaps", gaps);
    y_kint(y, "padding", b->length - b->used);
    y_kint(y, "overhead_ppm", b->length ? (b->length - b->used + gaps) * 1000000 / b->length : 0);
    y_raw(y, "roles");
    y_map(y, false);
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        y_raw(y, mf_role_name((mf_role)r));
        y_map(y, true);
        y_kstr(y, "dtype", mf_dtype_name(b->dtype[r]));
        y_placement_as(y, "placement", &b->place[r], k, b->whole[r]);
        int64_t n = local_elems(s, b, r);
        y_kint(y, "elements_per_rank", n);
        y_kint(y, "bytes_per_rank", n * (int64_t)mf_dtype_size(b->dtype[r]));
        y_end_map(y);
    }
    y_end_map(y);
    y_raw(y, "tensors");
    y_seq(y, false);
    for (int i = 0; i < b->ntensors; i++) {
        const mf_tensor *t = &b->tensors[i];
        y_map(y, true);
        y_kstr(y, "name", t->name);
        y_raw(y, "shape");
        y_seq(y, true);
        for (int dd = 0; dd < t->ndims; dd++)
            y_int(y, t->dims[dd]);
        y_end_seq(y);
        y_kint(y, "offset", t->offset);
        y_kint(y, "numel", t->numel);
        y_end_map(y);
    }
    y_end_seq(y);
    y_raw(y, "transitions");
    y_seq(y, false);
    for (int t = 0; t < MF_NTRANSITIONS; t++)
        yaml_transition(y, p, bi, t);
    y_end_seq(y);
    mf_bucket_memory m;
    mf_bucket_memory_of(p, bi, &m);
    y_raw(y, "memory_per_rank");
    y_map(y, true);
    y_kint(y, "main_weight", m.main_weight);
    y_kint(y, "weight", m.weight);
    y_kint(y, "grad", m.grad);
    y_kint(y, "grad_final", m.grad_final);
    y_kint(y, "weight_full", m.weight_full);
    y_kint(y, "grad_local", m.grad_local);
    y_kint(y, "weight_stage", m.weight_stage);
    y_kint(y, "grad_stage", m.grad_stage);
    y_end_map(y);
    yaml_owners(y, p, bi);
    y_end_map(y);
}

static void yaml_roles(yout *y, const char *k, const int64_t v[MF_ROLE_COUNT], int64_t total)
{
    y_raw(y, k);
    y_map(y, true);
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        y_kint(y, mf_role_name((mf_role)r), v[r]);
    y_kint(y, "total", total);
    y_end_map(y);
}

/* key: [{axis, bytes}, ...] over the mesh's axes. */
static void yaml_axis_bytes(yout *y, const mf_schedule *s, const char *key, const int64_t *bytes)
{
    y_raw(y, key);
    y_seq(y, false);
    for (int j = 0; j < s->mesh.naxes; j++) {
        y_map(y, true);
        y_kstr(y, "axis", s->mesh.axes[j].name);
        y_kint(y, "bytes", bytes[j]);
        y_end_map(y);
    }
    y_end_seq(y);
}

/* lower_bound: per figure (owned bytes, Newton-Schulz FLOPs) the bound any
 * dealing must reach, its reason and max/bound (text_owner_bounds). */
static void yaml_owner_bounds(yout *y, const mf_plan *p, const rank_spread *x)
{
    static const struct { bool flops; int k; const char *name; } rows[] = {
        {false, 1, "owned_bytes"}, {true, 3, "ns_flops"}};
    y_raw(y, "lower_bound");
    y_map(y, false);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        mf_plan_owner_bound b;
        if (!mf_plan_owners_bound(p->sched, rows[i].flops, &b))
            break;
        y_raw(y, rows[i].name);
        y_map(y, true);
        y_kint(y, "bound", (int64_t)llround(b.bound));
        y_kstr(y, "why", b.why);
        y_kint(y, "max_over_bound_ppm", bound_ppm(x->max[rows[i].k], &b));
        y_end_map(y);
    }
    y_end_map(y);
}

/* owners_per_rank: every rank's owned and sharded main_weight, cost and
 * Newton-Schulz FLOPs, and max/mean of each (absent without a whole bucket). */
static void yaml_rank_owners(yout *y, const mf_plan *p)
{
    const mf_schedule *s = p->sched;
    mf_plan_owner_rank *o = ranks_of(p);
    if (!o)
        return;
    y_raw(y, "owners_per_rank");
    y_map(y, false);
    y_kstr(y, "balance", balance_name(balance_of(p)));
    y_raw(y, "ranks");
    y_seq(y, false);
    for (int64_t r = 0; r < s->mesh.world; r++) {
        y_map(y, true);
        y_kint(y, "rank", r);
        y_kint(y, "owned", o[r].owned);
        y_kint(y, "owned_bytes", o[r].owned_bytes);
        y_kint(y, "sharded_bytes", o[r].sharded_bytes);
        y_kint(y, "cost", o[r].cost);
        y_kint(y, "ns_flops", (int64_t)llround(o[r].flops));
        y_end_map(y);
    }
    y_end_seq(y);
    rank_spread x = spread_of(o, s->mesh.world);
    y_raw(y, "max_over_mean_ppm");
    y_map(y, true);
    for (int k = 0; k < 4; k++)
        y_kint(y, spread_names[k], ratio_ppm(&x, k));
    y_end_map(y);
    yaml_owner_bounds(y, p, &x);
    y_end_map(y);
    free(o);
}

static bool yaml_totals(yout *y, const mf_plan *p)
{
    const mf_schedule *s = p->sched;
    mf_summary sum;
    mf_plan_memory mem;
    if (!mf_plan_totals(p, &sum) || !mf_plan_memory_of(p, &mem))
        return false;
    y_raw(y, "totals");
    y_map(y, false);
    y_raw(y, "collectives_per_step");
    y_seq(y, false);
    for (int kind = 0; kind < MF_OPKIND_COUNT; kind++)
        for (int j = 0; j < s->mesh.naxes; j++)
            if (sum.collectives[kind][j]) {
                y_map(y, true);
                y_kstr(y, "op", mf_opkind_name((mf_opkind)kind));
                y_kstr(y, "axis", s->mesh.axes[j].name);
                y_kint(y, "launches", sum.collectives[kind][j]);
                y_end_map(y);
            }
    y_end_seq(y);
    yaml_axis_bytes(y, s, "bytes_per_rank_per_step", sum.bytes);
    y_raw(y, "memory_per_rank");
    y_map(y, false);
    y_kint(y, "peak", s->summary.allocated_bytes); /* allocated: the one peak */
    y_kint(y, "persistent_region", s->mem_persistent);
    y_kint(y, "arena", s->mem_transient);
    y_kint(y, "live_bytes", s->summary.live_bytes);
    mf_interfere x;
    if (!interference_of(s, &x))
        return false;
    y_kint(y, "interference_bytes", x.bytes);
    y_kbool(y, "interference_exact", x.exact);
    y_raw(y, "interference_clique");             /* pairwise live at once */
    y_seq(y, true);
    for (int k = 0; k < x.nmembers; k++)
        y_str(y, s->buffers[x.members[k]].name);
    y_end_seq(y);
    mf_interfere_free(&x);
    y_raw(y, "model");                            /* by role, not the peak */
    y_map(y, false);
    yaml_roles(y, "persistent", mem.persistent, mem.persistent_total);
    yaml_roles(y, "window", mem.transient_peak, mem.transient_peak_total);
    yaml_roles(y, "total", mem.peak, mem.peak_total);
    y_end_map(y);
    y_end_map(y);
    mf_eval_figures ev;
    if (s->programs) {
        if (!mf_programs_eval_figures(s, &ev))
            return false;
        y_raw(y, "evaluation_pass");
        y_map(y, false);
        y_kint(y, "peak_transient", ev.peak_transient);
        y_kint(y, "launches", ev.launches);
        yaml_axis_bytes(y, s, "bytes_per_rank", ev.bytes);
        y_end_map(y);
    }
    yaml_rank_owners(y, p);
    y_end_map(y);
    return true;
}

int mf_explain_yaml(const mf_plan *p, FILE *out)
{
    const mf_schedule *s = p->sched;
    yout y = {0};
    if (!yaml_emitter_initialize(&y.em))
        return -1;
    yaml_emitter_set_output_file(&y.em, out);
    yaml_emitter_set_unicode(&y.em, 1);
    yaml_emitter_set_width(&y.em, -1);
    yaml_event_t ev;
    y_emit(&y, &ev, yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING));
    y_emit(&y, &ev, yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1));
    y_map(&y, false);
    yaml_header(&y, p);
    y_raw(&y, "units");
    y_seq(&y, false);
    for (int u = 0; u < s->nunits; u++) {
        const mf_unit *unit = &s->units[u];
        y_map(&y, false);
        y_kint(&y, "id", u);
        y_kstr(&y, "name", unit->name);
        y_kbool(&y, "reshard_after_forward", unit->reshard_after_forward);
        y_raw(&y, "buckets");
        y_seq(&y, false);
        for (int b = unit->first_bucket; b < unit->first_bucket + unit->nbuckets; b++)
            yaml_bucket(&y, p, b);
        y_end_seq(&y);
        y_end_map(&y);
    }
    y_end_seq(&y);
    bool ok = yaml_totals(&y, p);
    y_end_map(&y);
    y_emit(&y, &ev, yaml_document_end_event_initialize(&ev, 1));
    y_emit(&y, &ev, yaml_stream_end_event_initialize(&ev));
    if (!y.err && !yaml_emitter_flush(&y.em))
        y.err = true;
    yaml_emitter_delete(&y.em);
    return ok && !y.err && fflush(out) == 0 && !ferror(out) ? 0 : -1;
}
