/*
 * mf_layout_pass: resolved spec -> plan->sched units and buckets (docs/semantics.md §3).
 *
 * Reads: the spec (mesh, options, units, tensors, layouts). Writes: the
 * schedule's header fields, units (forward order) and buckets with their
 * tensors; nothing else (buffers and ops belong to the lowering pass).
 *
 * Buckets. Within a unit, tensors whose layouts are identical (same dtype and
 * placement for all three roles; an inline layout identical to a named one
 * counts as the same) form one bucket, in order of first appearance. The
 * bucket is named `<unit>/<layout>`, after the first named layout among its
 * tensors, or `<unit>/inline.<tensor>` when all of them are inline.
 *
 * Flat layout, invariants every later pass relies on:
 *   - tensors are packed in declaration order (unit order, then declaration
 *     order, for a merged bucket), each offset a multiple of the tensor
 *     quantum (16 bytes in every role's dtype);
 *   - `used` is the end of the last tensor (gaps included), `length` L is used
 *     padded to a multiple of the bucket's quantum (mf_plan_stats.h), so every
 *     placement a transition may pass through has equal shards starting on
 *     `align` bytes in every role's dtype; L >= one quantum, L * widest dtype
 *     * 2 fits in 63 bits (the largest ring traffic of one launch).
 *
 * Whole layout (some role Whole, docs/semantics.md §4.6): the tensors of a
 * bucket form P groups, one per shard of the finest whole role
 * (whole_group: cost-descending greedy); the groups of every whole bucket
 * are dealt to shards over the whole model at once (mf_whole_owners); each
 * shard holds its group's tensors in declaration order (whole_place); the
 * bucket's tensor list is in offset order. Merging compares the equal form's
 * length P * S, which depends on the bucket's own groups only
 * (whole_length), never on the shards they take; the bucket is then laid
 * out ragged (whole_bounds): each shard as long as its tensors (aligned),
 * bounds[] in the schedule, L = bounds[P] <= P * S.
 *
 * Merging (spec->bucket_size > 0, in bytes): a unit's bucket whose own padded
 * size in main_weight's dtype is below bucket_size joins the bucket of the
 * same layout that the previous unit ended, when that one was also below
 * bucket_size, the two units agree on reshard_after_forward, and the merged
 * padded size (for a whole layout: the packed length) stays <= bucket_size.
 * The merged bucket belongs to its first unit (`unit`), `last_unit` is the
 * last unit it covers; a unit whose buckets
 * were all merged into earlier ones has nbuckets == 0. bucket_size 0 (the
 * default) never merges: last_unit == unit.
 */
#include <stdlib.h>
#include <string.h>

#include "mf_free.h"
#include "mf_hash.h"
#include "mf_layout.h"
#include "mf_limits.h"
#include "mf_passes.h"
#include "mf_plan_stats.h"
#include "mf_whole_owners.h"

/* ---- quanta ---- */

int64_t mf_layout_pass_tensor_quantum(const mf_dtype dt[MF_ROLE_COUNT])
{
    return mf_layout_shard_quantum(dt, 16); /* 16 bytes in every role's dtype */
}

int64_t mf_layout_pass_shard_quantum(const mf_dtype dt[MF_ROLE_COUNT], int64_t align)
{
    return mf_layout_shard_quantum(dt, align);
}

int mf_layout_pass_pad_start(const mf_mesh *m, const mf_placement pl[MF_ROLE_COUNT])
{
    int k = m->naxes, s = k;
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        int fs = mf_layout_flat_start(&pl[r], k);
        if (fs < s)
            s = fs;
    }
    const uint8_t *g = pl[MF_ROLE_GRAD].p, *o = pl[MF_ROLE_MAIN_WEIGHT].p;
    for (int i = 0; i + 1 < s; i++) {
        bool t3 = g[i] == MF_PLACE_REPLICATE, t4 = g[i] == MF_PLACE_PARTIAL && o[i] == MF_PLACE_REPLICATE;
        bool inner3 = true, inner4 = true;
        for (int j = i + 1; j < k; j++) {
            inner3 = inner3 && g[j] != MF_PLACE_PARTIAL;
            inner4 = inner4 && (g[j] == MF_PLACE_PARTIAL || g[j] == MF_PLACE_FLAT || o[j] == MF_PLACE_FLAT);
        }
        if ((t3 && inner3) || (t4 && inner4)) {
            s = i + 1;
            break;
        }
    }
    return s;
}

/* What a padded length depends on besides `used`: the padding quantum q (a
 * shard quantum times the sizes of the padded axes) and the widest dtype
 * size; false when q overflows. */
static bool pad_quantum(const mf_mesh *m, const mf_dtype dt[MF_ROLE_COUNT], const mf_placement pl[MF_ROLE_COUNT],
                        int64_t align, int64_t *q, int64_t *widest)
{
    *q = mf_layout_pass_shard_quantum(dt, align);
    for (int j = mf_layout_pass_pad_start(m, pl); j < m->naxes; j++)
        if (__builtin_mul_overflow(*q, m->axes[j].size, q))
            return false;
    *widest = 1;
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if ((int64_t)mf_dtype_size(dt[r]) > *widest)
            *widest = (int64_t)mf_dtype_size(dt[r]);
    return true;
}

/* used rounded up to q (at least one q), checked against 63 bits for twice
 * the widest dtype. */
static bool pad_to(int64_t q, int64_t widest, int64_t used, int64_t *length)
{
    int64_t units = used <= 0 ? 1 : used / q + (used % q != 0);
    int64_t len, bytes;
    if (__builtin_mul_overflow(units, q, &len) || __builtin_mul_overflow(len, 2 * widest, &bytes))
        return false;
    *length = len;
    return true;
}

bool mf_layout_pass_padded_length(const mf_mesh *m, const mf_dtype dt[MF_ROLE_COUNT],
                                  const mf_placement pl[MF_ROLE_COUNT], int64_t align, int64_t used,
                                  int64_t *length)
{
    int64_t q, widest;
    return pad_quantum(m, dt, pl, align, &q, &widest) && pad_to(q, widest, used, length);
}

/* ---- grouping ---- */

/* A layout signature's identity: the canonical (first) spec layout with the
 * same dtypes and placements, found through the core's hash table (keyed by
 * the dtype and placement bytes) so specs with one inline layout per tensor
 * stay linear. canon[l] = canonical layout index for every spec layout;
 * false on OOM. */
static bool canonical_layouts(const mf_spec *spec, int *canon)
{
    mf_hash t = MF_HASH_EMPTY;
    int naxes = spec->mesh.naxes;
    bool ok = true;
    for (int l = 0; l < spec->nlayouts && ok; l++) {
        const mf_spec_layout *x = &spec->layouts[l];
        uint8_t key[MF_ROLE_COUNT * (2 + MF_MAX_AXES)];
        size_t n = 0;
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            key[n++] = (uint8_t)x->dtype[r];
            key[n++] = (uint8_t)x->whole[r];
            for (int j = 0; j < naxes; j++)
                key[n++] = x->place[r].p[j];
        }
        int put = mf_hash_put(&t, key, n, l);
        ok = put >= 0;
        canon[l] = put > 0 ? l : (int)mf_hash_get(&t, key, n);
    }
    mf_hash_free(&t);
    return ok;
}

/* The tensors of one unit that share a signature. */
typedef struct group {
    int unit;
    int sig;                /* canonical layout index */
    int named;              /* first named (non-inline) layout among its tensors, or -1 */
    int first_tensor;       /* index within the unit of its first tensor */
    int ntensors;
    int start;              /* into the order[] array of this unit's tensors */
    int64_t used;           /* standalone: end of its last tensor */
    int64_t length;         /* standalone padded length */
    int next;               /* next group merged into the same bucket, or -1 */
} group;

typedef struct bucket_build {
    int head, tail;         /* group chain */
    int unit, last_unit;
    int64_t used;           /* merged so far */
} bucket_build;

typedef struct layout_state {
    const mf_spec *spec;
    bool quiet;             /* the plan's: names borrowed from the spec */
    mf_diag *d;
    int *canon;             /* per spec layout */
    int64_t *pad_q, *pad_w; /* per canonical layout: pad_quantum, computed on first
                               use (pad_q 0: not yet; -1: overflows) */
    int64_t *tq;            /* per canonical layout: tensor quantum, 0 until first use */
    int *sig_group;         /* per canonical layout: its group in the current unit, or -1 */
    int *sig_open;          /* per canonical layout: open bucket for merging, or -1 */
    mf_vec groups;          /* group */
    mf_vec buckets;         /* bucket_build */
    int **order;            /* per unit: tensor indices grouped, group by group */
    int *unit_first_group;  /* per unit, plus one at the end */
} layout_state;

static const mf_spec_layout *sig_layout(const layout_state *st, int sig)
{
    return &st->spec->layouts[sig];
}

/* Appends the tensors of group g after `used` elements; returns the new used
 * or -1 on overflow (error reported at the tensor). Writes offsets when out. */
static int64_t place_group(layout_state *st, const group *g, int64_t used, int64_t tq, mf_tensor *out)
{
    const mf_spec_unit *u = &st->spec->units[g->unit];
    for (int i = 0; i < g->ntensors; i++) {
        const mf_spec_tensor *t = &u->tensors[st->order[g->unit][g->start + i]];
        int64_t off = used;
        if ((used % tq && __builtin_add_overflow(used, tq - used % tq, &off)) || t->numel < 0 ||
            __builtin_add_overflow(off, t->numel, &used)) {
            mf_diag_error(st->d, t->span,
                          "tensor '%s' ends past the %d-bit limit of a bucket's length "
                          "(it starts at element %lld of its bucket)",
                          t->name, MF_LIMIT_MAGNITUDE_BITS, (long long)off);
            mf_diag_note(st->d, u->span, "in unit '%s'; split the unit or its tensors", u->name);
            return -1;
        }
        if (out) {
            out[i].name = t->name;
            out[i].ndims = t->ndims;
            memcpy(out[i].dims, t->dims, sizeof t->dims);
            out[i].numel = t->numel;
            out[i].offset = off;
            out[i].nglobal = t->nglobal;
            out[i].global = t->global;
            out[i].global_split = t->global_split;
            out[i].global_dim = t->global_dim;
        }
    }
    return used;
}

static int64_t tensor_quantum(layout_state *st, int sig)
{
    if (st->tq[sig] == 0)
        st->tq[sig] = mf_layout_pass_tensor_quantum(sig_layout(st, sig)->dtype);
    return st->tq[sig];
}

static bool padded(layout_state *st, int sig, int64_t used, int64_t *len)
{
    if (st->pad_q[sig] == 0) {
        const mf_spec_layout *l = sig_layout(st, sig);
        if (!pad_quantum(&st->spec->mesh, l->dtype, l->place, st->spec->align, &st->pad_q[sig], &st->pad_w[sig]))
            st->pad_q[sig] = -1;
    }
    return st->pad_q[sig] > 0 && pad_to(st->pad_q[sig], st->pad_w[sig], used, len);
}

static void overflow_error(layout_state *st, const group *g, int64_t used)
{
    const mf_spec_unit *u = &st->spec->units[g->unit];
    mf_diag_error(st->d, u->span,
                  "the bucket of layout '%s' in unit '%s' (%lld elements) cannot be padded "
                  "within %d bits (limit: length * 2 * widest dtype size, with length a multiple "
                  "of the world size times the alignment)",
                  sig_layout(st, g->named >= 0 ? g->named : g->sig)->name, u->name, (long long)used,
                  MF_LIMIT_MAGNITUDE_BITS);
    mf_diag_note(st->d, st->spec->mesh_span, "mesh declared here");
}

/* ---- Whole packing (docs/semantics.md §4.6) ---- */

/* The placement of the layout's whole role with the most shards (the finest;
 * its shards refine every other placement's), or NULL when no role is whole. */
static const mf_placement *whole_finest(const mf_mesh *m, const mf_spec_layout *l)
{
    const mf_placement *best = NULL;
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (l->whole[r] && (!best || mf_layout_shards(m, &l->place[r]) > mf_layout_shards(m, best)))
            best = &l->place[r];
    return best;
}

static int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

/* A tensor's cost for the packing: numel (`balance bytes`), or with `balance
 * flops` rows * cols * min(rows, cols), rows = dims[0], cols = numel / rows
 * (numel for 1-D); saturating. */
int64_t mf_layout_pass_whole_cost(mf_balance balance, int ndims, const int64_t *dims, int64_t numel)
{
    if (balance != MF_BALANCE_FLOPS || ndims < 2 || dims[0] <= 0)
        return numel;
    int64_t rows = dims[0], cols = numel / rows;
    return sat_mul(sat_mul(rows, cols), rows < cols ? rows : cols);
}

/* One tensor of a whole bucket being packed. */
typedef struct whole_item {
    const mf_spec_tensor *t;
    int64_t cost;
    int group, shard;
    int64_t offset;         /* bucket-global, once placed */
} whole_item;

static int item_by_cost(const void *a, const void *b)
{
    const whole_item *x = *(const whole_item *const *)a, *y = *(const whole_item *const *)b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return x < y ? -1 : x > y; /* declaration order */
}

/*
 * Step 1 of the packing (docs/semantics.md §4.6) of the n tensors `it` (in
 * declaration order) of a bucket of layout `sig` whose whole roles' finest
 * placement has P shards: by cost descending (ties: declaration order) each
 * tensor joins the group of least cost so far (ties: the lowest group).
 * Writes it[].cost, it[].group and gcost[0..P). False on OOM.
 */
static bool whole_group(layout_state *st, whole_item *it, int n, int64_t P, int64_t *gcost)
{
    whole_item **by = malloc((size_t)(n ? n : 1) * sizeof *by);
    if (!by)
        return false;
    memset(gcost, 0, (size_t)P * sizeof *gcost);
    for (int i = 0; i < n; i++) {
        it[i].cost = mf_layout_pass_whole_cost(st->spec->balance, it[i].t->ndims, it[i].t->dims, it[i].t->numel);
        by[i] = &it[i];
    }
    qsort(by, (size_t)n, sizeof *by, item_by_cost);
    for (int i = 0; i < n; i++) {
        int64_t g = 0;
        for (int64_t q = 1; q < P; q++)
            if (gcost[q] < gcost[g])
                g = q;
        by[i]->group = (int)g;
        gcost[g] = sat_add(gcost[g], by[i]->cost);
    }
    free(by);
    return true;
}

/* Ragged bounds (docs/semantics.md §4.6, format 7): shard q starts at
 * bounds[q], bounds[q+1] = bounds[q] + gused[q] rounded up to the shard
 * quantum (align bytes in every role's dtype), an empty shard 0 long; a
 * bucket of empty shards only gives its last shard one quantum, so L is never
 * 0. Writes P + 1 entries; *length = bounds[P]. */
static void whole_bounds(layout_state *st, int sig, const int64_t *gused, int64_t P, int64_t *bounds,
                         int64_t *length)
{
    int64_t qa = mf_layout_pass_shard_quantum(sig_layout(st, sig)->dtype, st->spec->align);
    bounds[0] = 0;
    for (int64_t q = 0; q < P; q++) /* each gused[q] <= S, so the sum <= L of the equal form */
        bounds[q + 1] = bounds[q] + (gused[q] + qa - 1) / qa * qa;
    if (bounds[P] == 0)
        bounds[P] = qa;
    *length = bounds[P];
}

/*
 * Step 4 of the packing: tensor i in shard shard[i] (NULL: its group's
 * number, as good as any for the length); in each shard its tensors in
 * declaration order from the shard's start, each at the tensor quantum.
 * S (0: computed) is the largest shard's used elements rounded up to pad
 * quantum / P (at least one); L = P * S, the equal form's length (what
 * merging compares). With bounds (the dealt shards), the shards are ragged
 * instead (whole_bounds): shard q starts at bounds[q] and L = bounds[P] <=
 * P * S. Writes it[].shard, .offset (bucket-global), *length and *used (the
 * end of the furthest tensor). False when L does not fit (nothing reported)
 * or on OOM (*oom).
 */
static bool whole_place(layout_state *st, int sig, whole_item *it, int n, int64_t P, const int *shard,
                        int64_t S, int64_t *bounds, int64_t *length, int64_t *used, bool *oom)
{
    int64_t tq = tensor_quantum(st, sig), qs = st->pad_q[sig] / P;
    int64_t *gused = calloc((size_t)P, sizeof *gused);
    if (!gused)
        return !(*oom = true);
    int64_t most = 0;
    for (int i = 0; i < n; i++) {
        int q = shard ? shard[i] : it[i].group;
        it[i].shard = q;
        int64_t off = gused[q];
        if (off % tq)
            off += tq - off % tq;
        it[i].offset = off; /* shard-local for now */
        gused[q] = off + it[i].t->numel; /* within the flat packing's bounds, checked before */
        if (gused[q] > most)
            most = gused[q];
    }
    int64_t units = most <= 0 ? 1 : most / qs + (most % qs != 0), bytes;
    bool ok = !(S == 0 && __builtin_mul_overflow(units, qs, &S)) && !__builtin_mul_overflow(S, P, length) &&
              !__builtin_mul_overflow(*length, 2 * st->pad_w[sig], &bytes);
    if (ok && bounds)
        whole_bounds(st, sig, gused, P, bounds, length);
    free(gused);
    if (!ok)
        return false;
    *used = 0;
    for (int i = 0; i < n; i++) {
        it[i].offset += bounds ? bounds[it[i].shard] : it[i].shard * S;
        if (it[i].offset + it[i].t->numel > *used)
            *used = it[i].offset + it[i].t->numel;
    }
    return true;
}

/* The finest whole placement's shard count of layout sig, with its pad
 * quantum filled (false when that overflows). */
static bool whole_shards(layout_state *st, int sig, int64_t *P)
{
    int64_t len;
    *P = mf_layout_shards(&st->spec->mesh, whole_finest(&st->spec->mesh, sig_layout(st, sig)));
    return padded(st, sig, 0, &len); /* fills pad_q / pad_w */
}

/* The tensors of the groups chained from `head`, then of group `extra` (-1:
 * none), in declaration order, into a new array (*n items); NULL on OOM. */
static whole_item *chain_items(layout_state *st, int head, int extra, int *n)
{
    const group *groups = st->groups.data;
    int count = 0;
    for (int g = head; g >= 0; g = groups[g].next)
        count += groups[g].ntensors;
    if (extra >= 0)
        count += groups[extra].ntensors;
    whole_item *it = calloc((size_t)(count ? count : 1), sizeof *it);
    if (!it)
        return NULL;
    int k = 0;
    for (int g = head; g >= 0 || extra >= 0; g = g >= 0 ? groups[g].next : -1) {
        const group *gp = &groups[g >= 0 ? g : extra];
        if (g < 0)
            extra = -1; /* appended last, once */
        for (int i = 0; i < gp->ntensors; i++)
            it[k++].t = &st->spec->units[gp->unit].tensors[st->order[gp->unit][gp->start + i]];
    }
    *n = count;
    return it;
}

/* The padded length of a whole bucket of groups head.. (+ extra), whichever
 * shards its groups take; false when it does not fit or on OOM (*oom). */
static bool whole_length(layout_state *st, int sig, int head, int extra, int64_t *length, bool *oom)
{
    int n = 0;
    int64_t used, P;
    if (!whole_shards(st, sig, &P))
        return false;
    whole_item *it = chain_items(st, head, extra, &n);
    int64_t *gcost = malloc((size_t)P * sizeof *gcost);
    bool ok = it && gcost && whole_group(st, it, n, P, gcost);
    if (!ok)
        *oom = true;
    ok = ok && whole_place(st, sig, it, n, P, NULL, 0, NULL, length, &used, oom);
    free(it);
    free(gcost);
    return ok;
}

/* Groups the tensors of every unit; false on OOM. */
static bool group_units(layout_state *st)
{
    const mf_spec *spec = st->spec;
    for (int l = 0; l < spec->nlayouts; l++)
        st->sig_group[l] = -1;
    for (int u = 0; u < spec->nunits; u++) {
        const mf_spec_unit *unit = &spec->units[u];
        int first = (int)st->groups.len;
        st->unit_first_group[u] = first;
        int *gid = malloc(((size_t)unit->ntensors + 1) * sizeof *gid);
        st->order[u] = malloc(((size_t)unit->ntensors + 1) * sizeof *st->order[u]);
        if (!gid || !st->order[u]) {
            free(gid);
            return false;
        }
        for (int i = 0; i < unit->ntensors; i++) {
            int l = unit->tensors[i].layout;
            int sig = st->canon[l];
            int g = st->sig_group[sig];
            if (g < first) {
                group *ng = mf_vec_push(&st->groups);
                if (!ng) {
                    free(gid);
                    return false;
                }
                g = (int)st->groups.len - 1;
                *ng = (group){.unit = u, .sig = sig, .named = -1, .first_tensor = i, .next = -1};
                st->sig_group[sig] = g;
            }
            group *gp = (group *)st->groups.data + g;
            if (gp->named < 0 && !spec->layouts[l].is_inline)
                gp->named = l;
            gp->ntensors++;
            gid[i] = g;
        }
        /* counting sort of the unit's tensors by group, stable */
        int at = 0;
        for (int g = first; g < (int)st->groups.len; g++) {
            group *gp = (group *)st->groups.data + g;
            gp->start = at;
            at += gp->ntensors;
            gp->ntensors = 0;
        }
        for (int i = 0; i < unit->ntensors; i++) {
            group *gp = (group *)st->groups.data + gid[i];
            st->order[u][gp->start + gp->ntensors++] = i;
        }
        free(gid);
    }
    st->unit_first_group[spec->nunits] = (int)st->groups.len;
    return true;
}

static int64_t o_size(layout_state *st, int sig)
{
    return (int64_t)mf_dtype_size(sig_layout(st, sig)->dtype[MF_ROLE_MAIN_WEIGHT]);
}

/* True when length elements in main_weight's dtype are below (or at most,
 * when `or_equal`) the bucket size. */
static bool fits(layout_state *st, int sig, int64_t length, bool or_equal)
{
    int64_t bytes;
    if (__builtin_mul_overflow(length, o_size(st, sig), &bytes))
        return false;
    return or_equal ? bytes <= st->spec->bucket_size : bytes < st->spec->bucket_size;
}

/* Lays out every group standalone, then assigns groups to buckets (merging
 * when asked). Returns false on errors or OOM (*oom set). */
static bool assign_buckets(layout_state *st, bool *oom)
{
    const mf_spec *spec = st->spec;
    group *groups = st->groups.data;
    for (int l = 0; l < spec->nlayouts; l++)
        st->sig_open[l] = -1;
    bool ok = true;
    for (int g = 0; g < (int)st->groups.len; g++) {
        group *gp = &groups[g];
        int64_t tq = tensor_quantum(st, gp->sig);
        gp->used = place_group(st, gp, 0, tq, NULL);
        if (gp->used < 0) {
            ok = false;
            continue;
        }
        bool whole = whole_finest(&spec->mesh, sig_layout(st, gp->sig)) != NULL;
        if (!padded(st, gp->sig, gp->used, &gp->length) ||
            (whole && !whole_length(st, gp->sig, g, -1, &gp->length, oom))) {
            if (*oom)
                return false;
            overflow_error(st, gp, gp->used);
            ok = false;
            continue;
        }
        int ob = spec->bucket_size > 0 ? st->sig_open[gp->sig] : -1;
        bool small = spec->bucket_size > 0 && fits(st, gp->sig, gp->length, false);
        if (ob >= 0 && small) {
            bucket_build *b = (bucket_build *)st->buckets.data + ob;
            int64_t start = b->used, merged, mlen;
            if (b->last_unit == gp->unit - 1 &&
                !(b->used % tq && __builtin_add_overflow(b->used, tq - b->used % tq, &start)) &&
                spec->units[b->unit].reshard_after_forward == spec->units[gp->unit].reshard_after_forward &&
                !__builtin_add_overflow(start, gp->used, &merged) && padded(st, gp->sig, merged, &mlen) &&
                (!whole || whole_length(st, gp->sig, b->head, g, &mlen, oom)) && fits(st, gp->sig, mlen, true)) {
                groups[b->tail].next = g;
                b->tail = g;
                b->last_unit = gp->unit;
                b->used = merged;
                continue;
            }
        }
        bucket_build *nb = mf_vec_push(&st->buckets);
        if (!nb) {
            *oom = true;
            return false;
        }
        *nb = (bucket_build){.head = g, .tail = g, .unit = gp->unit, .last_unit = gp->unit, .used = gp->used};
        st->sig_open[gp->sig] = small ? (int)st->buckets.len - 1 : -1;
    }
    return ok;
}

/* The bucket's label: the named layout, or inline.<tensor> */
static const char *bucket_label(layout_state *st, mf_arena *a, const group *g)
{
    if (g->named >= 0)
        return mf_arena_strdup(a, st->spec->layouts[g->named].name);
    const mf_spec_unit *u = &st->spec->units[g->unit];
    const char *full = u->tensors[g->first_tensor].name;
    size_t n = strlen(u->name);
    const char *shortname = strncmp(full, u->name, n) == 0 && full[n] == '.' ? full + n + 1 : full;
    return mf_arena_printf(a, "inline.%s", shortname);
}

/* A copy of s in the schedule's arena, or s itself (borrowed from the spec,
 * which outlives the plan) for a quiet plan, whose names are never printed. */
static const char *name_of(const layout_state *st, mf_arena *a, const char *s)
{
    return st->quiet ? s : mf_arena_strdup(a, s);
}

/* The global names of t copied like its name (the schedule outlives the
 * spec). False on OOM. */
static bool copy_globals(const layout_state *st, mf_arena *a, mf_tensor *t)
{
    if (!t->nglobal || st->quiet)
        return true;
    const char **g = mf_arena_array(a, (size_t)t->nglobal, sizeof *g);
    if (!g)
        return false;
    for (int i = 0; i < t->nglobal; i++)
        if (!(g[i] = mf_arena_strdup(a, t->global[i])))
            return false;
    t->global = g;
    return true;
}

/* One whole bucket between its grouping and its placing. */
typedef struct whole_build {
    int bucket;
    int sig;
    whole_item *it;         /* its tensors, declaration order */
    int64_t *gcost;         /* P */
    int64_t *cost, *numel;  /* per tensor, for the dealing */
    int *group, *shard;     /* per tensor */
} whole_build;

/* Places whole bucket w with its tensors' shards (w->shard) in ragged shards
 * (its bounds, in the schedule's arena), and puts its tensors in offset
 * order: shard by shard, declaration order within. False on OOM. */
static bool whole_materialize(layout_state *st, mf_schedule *s, const whole_build *w, const mf_whole_bucket *g)
{
    mf_bucket *out = &s->buckets[w->bucket];
    bool oom = false;
    int n = g->n;
    mf_tensor *sorted = mf_arena_array(s->arena, (size_t)n, sizeof *sorted);
    out->bounds = mf_arena_array(s->arena, (size_t)g->P + 1, sizeof *out->bounds);
    /* the length fit in assign_buckets; the dealing keeps S, the bounds stay within P * S */
    bool ok = sorted && out->bounds && n == out->ntensors &&
              whole_place(st, w->sig, w->it, n, g->P, w->shard, g->S, out->bounds, &out->length, &out->used, &oom);
    int k = 0;
    for (int64_t q = 0; ok && q < g->P; q++)
        for (int i = 0; i < n; i++)
            if (w->it[i].shard == q) {
                sorted[k] = out->tensors[i];
                sorted[k++].offset = w->it[i].offset;
            }
    if (ok)
        out->tensors = sorted;
    return ok;
}

/* Groups whole bucket b (layout sig, finest placement fine) into w and
 * describes it for the dealing in g: its tensors' costs and sizes, its
 * groups, and S from them (whole_place with the groups as shards). False on
 * OOM. */
static bool whole_prepare(layout_state *st, int b, int sig, const mf_placement *fine, whole_build *w,
                          mf_whole_bucket *g)
{
    const bucket_build *bb = (const bucket_build *)st->buckets.data + b;
    int64_t P = mf_layout_shards(&st->spec->mesh, fine), length, used;
    bool oom = false;
    int n = 0;
    *w = (whole_build){.bucket = b, .sig = sig};
    w->it = chain_items(st, bb->head, -1, &n);
    size_t slots = n ? (size_t)n : 1;
    w->gcost = malloc((size_t)P * sizeof *w->gcost);
    w->cost = malloc(slots * sizeof *w->cost);
    w->numel = malloc(slots * sizeof *w->numel);
    w->group = malloc(slots * sizeof *w->group);
    w->shard = malloc(slots * sizeof *w->shard);
    if (!w->it || !w->gcost || !w->cost || !w->numel || !w->group || !w->shard ||
        !whole_group(st, w->it, n, P, w->gcost))
        return false;
    for (int i = 0; i < n; i++) {
        w->cost[i] = w->it[i].cost;
        w->numel[i] = w->it[i].t->numel;
        w->group[i] = w->it[i].group;
    }
    /* the length fit in assign_buckets */
    if (!whole_place(st, sig, w->it, n, P, NULL, 0, NULL, &length, &used, &oom))
        return false;
    *g = (mf_whole_bucket){.fine = fine, .P = P, .n = n, .cost = w->cost, .numel = w->numel, .group = w->group,
                           .tq = tensor_quantum(st, sig), .S = length / P, .shard = w->shard};
    return true;
}

static void whole_build_free(whole_build *w)
{
    MF_FREE_ALL(w->it, w->gcost, w->cost, w->numel, w->group, w->shard);
}

/* The whole buckets of s (tensors copied in declaration order): each grouped
 * on its own (its S), their tensors dealt to shards over the whole model
 * (mf_whole_owners), then placed. False on OOM. */
static bool whole_buckets(layout_state *st, mf_schedule *s)
{
    const bucket_build *bb = st->buckets.data;
    const group *groups = st->groups.data;
    int nb = (int)st->buckets.len, nw = 0;
    whole_build *w = calloc((size_t)(nb ? nb : 1), sizeof *w);
    mf_whole_bucket *g = calloc((size_t)(nb ? nb : 1), sizeof *g);
    bool ok = w && g;
    for (int b = 0; ok && b < nb; b++) {
        int sig = groups[bb[b].head].sig;
        const mf_placement *fine = whole_finest(&s->mesh, sig_layout(st, sig));
        if (fine) {
            ok = whole_prepare(st, b, sig, fine, &w[nw], &g[nw]);
            nw++; /* freed below, also when it failed */
        }
    }
    ok = ok && mf_whole_owners_assign(&s->mesh, g, nw);
    for (int i = 0; ok && i < nw; i++)
        ok = whole_materialize(st, s, &w[i], &g[i]);
    for (int i = 0; w && i < nw; i++)
        whole_build_free(&w[i]);
    free(w);
    free(g);
    return ok;
}

/* Writes units and buckets into the schedule; false on OOM. */
static bool materialize(layout_state *st, mf_schedule *s)
{
    const mf_spec *spec = st->spec;
    mf_arena *a = s->arena;
    group *groups = st->groups.data;
    bucket_build *bb = st->buckets.data;
    int nb = (int)st->buckets.len;
    s->units = mf_arena_array(a, spec->nunits ? (size_t)spec->nunits : 1, sizeof *s->units);
    s->buckets = mf_arena_array(a, nb ? (size_t)nb : 1, sizeof *s->buckets);
    if (!s->units || !s->buckets)
        return false;
    for (int u = 0; u < spec->nunits; u++) {
        s->units[u].name = name_of(st, a, spec->units[u].name);
        if (!s->units[u].name)
            return false;
        s->units[u].reshard_after_forward = spec->units[u].reshard_after_forward;
        s->units[u].first_bucket = nb;
        s->units[u].nbuckets = 0;
    }
    for (int b = 0; b < nb; b++) {
        mf_bucket *out = &s->buckets[b];
        const group *head = &groups[bb[b].head];
        const mf_spec_layout *l = sig_layout(st, head->sig);
        int ntensors = 0;
        for (int g = bb[b].head; g >= 0; g = groups[g].next)
            ntensors += groups[g].ntensors;
        out->tensors = mf_arena_array(a, (size_t)ntensors, sizeof *out->tensors);
        const char *label = st->quiet ? "" : bucket_label(st, a, head);
        if (!out->tensors || !label)
            return false;
        /* quiet: the unit's name stands for the bucket's */
        out->name = st->quiet ? spec->units[bb[b].unit].name
                              : mf_arena_printf(a, "%s/%s", spec->units[bb[b].unit].name, label);
        out->layout = name_of(st, a, spec->layouts[head->named >= 0 ? head->named : head->sig].name);
        if (!out->name || !out->layout)
            return false;
        out->unit = bb[b].unit;
        out->last_unit = bb[b].last_unit;
        memcpy(out->dtype, l->dtype, sizeof out->dtype);
        memcpy(out->place, l->place, sizeof out->place);
        memcpy(out->whole, l->whole, sizeof out->whole);
        int64_t tq = tensor_quantum(st, head->sig), used = 0;
        for (int g = bb[b].head; g >= 0; g = groups[g].next) {
            used = place_group(st, &groups[g], used, tq, out->tensors + out->ntensors);
            for (int i = 0; i < groups[g].ntensors; i++) {
                mf_tensor *t = &out->tensors[out->ntensors + i];
                t->name = name_of(st, a, t->name);
                if (!t->name || !copy_globals(st, a, t))
                    return false;
            }
            out->ntensors += groups[g].ntensors;
        }
        out->used = used;
        padded(st, head->sig, used, &out->length); /* checked in assign_buckets */
        mf_unit *unit = &s->units[out->unit];
        if (unit->nbuckets == 0)
            unit->first_bucket = b;
        unit->nbuckets++;
    }
    s->nunits = spec->nunits;
    s->nbuckets = nb;
    return whole_buckets(st, s);
}

static bool copy_header(const mf_spec *spec, mf_schedule *s)
{
    s->source = mf_arena_strdup(s->arena, spec->path ? spec->path : "<input>");
    s->mesh = spec->mesh;
    for (int j = 0; j < spec->mesh.naxes; j++) {
        s->mesh.axes[j].name = mf_arena_strdup(s->arena, spec->mesh.axes[j].name);
        if (!s->mesh.axes[j].name)
            return false;
    }
    s->microbatches = spec->microbatches;
    s->reduce = spec->reduce;
    s->align = spec->align;
    s->prefetch = spec->prefetch;
    return s->source != NULL;
}

/* canonical_layouts, taken from (or saved into) the plan's shared map when
 * it has one (mf_plan.layout_canon). */
static bool canonical_of(mf_plan *p, int *canon)
{
    size_t n = (size_t)p->spec->nlayouts;
    if (p->layout_canon && n > 0 && p->layout_canon[0] >= 0) {
        memcpy(canon, p->layout_canon, n * sizeof *canon);
        return true;
    }
    if (!canonical_layouts(p->spec, canon))
        return false;
    if (p->layout_canon && n > 0)
        memcpy(p->layout_canon, canon, n * sizeof *canon);
    return true;
}

bool mf_layout_pass_run(mf_plan *p, mf_diag *d)
{
    const mf_spec *spec = p->spec;
    layout_state st = {.spec = spec, .d = d, .quiet = p->quiet};
    mf_vec_init(&st.groups, sizeof(group));
    mf_vec_init(&st.buckets, sizeof(bucket_build));
    size_t nl = spec->nlayouts ? (size_t)spec->nlayouts : 1, nu = (size_t)spec->nunits + 1;
    st.canon = malloc(nl * sizeof *st.canon);
    st.pad_q = calloc(nl, sizeof *st.pad_q);
    st.pad_w = calloc(nl, sizeof *st.pad_w);
    st.tq = calloc(nl, sizeof *st.tq);
    st.sig_group = malloc(nl * sizeof *st.sig_group);
    st.sig_open = malloc(nl * sizeof *st.sig_open);
    st.order = calloc(nu, sizeof *st.order);
    st.unit_first_group = malloc(nu * sizeof *st.unit_first_group);
    bool oom = !st.canon || !st.sig_group || !st.sig_open || !st.order || !st.unit_first_group || !st.pad_q ||
               !st.pad_w || !st.tq;
    bool ok = false;
    if (!oom)
        oom = !copy_header(spec, p->sched) || !canonical_of(p, st.canon) || !group_units(&st);
    if (!oom && assign_buckets(&st, &oom))
        ok = materialize(&st, p->sched) || !(oom = true);
    if (oom) {
        mf_span none = {0, 0, 0, 0};
        mf_diag_error(d, none, "out of memory while laying out buckets");
        ok = false;
    }
    for (size_t u = 0; st.order && u < nu; u++)
        free(st.order[u]);
    free(st.order);
    free(st.unit_first_group);
    free(st.canon);
    free(st.pad_q);
    free(st.pad_w);
    free(st.tq);
    free(st.sig_group);
    free(st.sig_open);
    mf_vec_free(&st.groups);
    mf_vec_free(&st.buckets);
    return ok && mf_diag_errors(d) == 0;
}
