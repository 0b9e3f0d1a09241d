/*
 * mf_whole_owners: the tensors of every whole bucket dealt to shards over the
 * whole model, longest processing time first (mf_whole_owners.h).
 *
 * The ranks are seen through classes: one per distinct finest placement among
 * the buckets. Per class, each rank's shard (rank_shard) and the ranks of each
 * shard (members, grouped by shard from start[q]); per class and shard the
 * largest load of its ranks (worst), kept up to date as loads grow (loads only
 * grow, so a max is enough). A run resets the loads and deals every item;
 * a bucket that failed deals its groups in the next run (deal_all).
 */
#include "mf_whole_owners.h"

#include <stdlib.h>
#include <string.h>

#include "mf_free.h"
#include "mf_layout.h"

typedef struct owner_class {
    const mf_placement *place;
    int64_t P;
    int64_t *rank_shard;   /* world */
    int64_t *members;      /* world, grouped by shard */
    int64_t *start;        /* P + 1 */
    int64_t *worst;        /* P */
} owner_class;

/* One thing to deal: a tensor, or (for a bucket dealing its groups) a group. */
typedef struct owner_item {
    int bucket, index;      /* tensor index, or group */
    int64_t cost, size;     /* size: elements, each tensor rounded up to the quantum */
} owner_item;

/* The state of the dealing, shared by its runs. */
typedef struct dealing {
    const mf_mesh *m;
    mf_whole_bucket *b;
    int nb, ncls;
    owner_class *cls;
    int *cls_of;            /* per bucket */
    int64_t *first;         /* per bucket: its shards' start in used / taken, its groups' in gstart */
    int64_t *used;          /* per bucket and shard: elements dealt (rounded) */
    bool *taken;            /* per bucket and shard: a group took it */
    int64_t *gstart;        /* per bucket and group + 1: start in members */
    int *members;           /* tensor indices grouped by group, per bucket from its first tensor */
    int64_t *tfirst;        /* per bucket: its tensors' start in members */
    int64_t *loads;         /* per rank */
    owner_item *items;
    bool *by_group, *failed;
} dealing;

static int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t round_up(int64_t x, int64_t q)
{
    return q > 1 && x % q ? x + (q - x % q) : x;
}

static bool same_place(const mf_mesh *m, const mf_placement *a, const mf_placement *b)
{
    for (int j = 0; j < m->naxes; j++)
        if (a->p[j] != b->p[j])
            return false;
    return true;
}

/* Fills class c for placement pl (P shards); false on OOM. */
static bool class_init(const mf_mesh *m, const mf_placement *pl, int64_t P, owner_class *c)
{
    int64_t world = m->world;
    c->place = pl;
    c->P = P;
    c->rank_shard = malloc((size_t)world * sizeof *c->rank_shard);
    c->members = malloc((size_t)world * sizeof *c->members);
    c->start = calloc((size_t)P + 1, sizeof *c->start);
    c->worst = calloc((size_t)P, sizeof *c->worst);
    if (!c->rank_shard || !c->members || !c->start || !c->worst)
        return false;
    for (int64_t r = 0; r < world; r++) {
        int64_t coords[MF_MAX_AXES];
        mf_layout_mesh_coords(m, r, coords);
        c->rank_shard[r] = mf_layout_shard_index(m, pl, coords);
        c->start[c->rank_shard[r] + 1]++;
    }
    for (int64_t q = 0; q < P; q++)
        c->start[q + 1] += c->start[q];
    int64_t *fill = malloc((size_t)P * sizeof *fill);
    if (!fill)
        return false;
    memcpy(fill, c->start, (size_t)P * sizeof *fill);
    for (int64_t r = 0; r < world; r++)
        c->members[fill[c->rank_shard[r]]++] = r;
    free(fill);
    return true;
}

static void class_free(owner_class *c)
{
    MF_FREE_ALL(c->rank_shard, c->members, c->start, c->worst);
}

static int item_order(const void *a, const void *b)
{
    const owner_item *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    if (x->bucket != y->bucket)
        return x->bucket < y->bucket ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Adds cost to every rank of shard q of class c, and refreshes every class's
 * worst loads. */
static void charge(dealing *d, int c, int64_t q, int64_t cost)
{
    owner_class *cls = d->cls;
    for (int64_t i = cls[c].start[q]; i < cls[c].start[q + 1]; i++) {
        int64_t r = cls[c].members[i];
        d->loads[r] = sat_add(d->loads[r], cost);
        for (int k = 0; k < d->ncls; k++) {
            int64_t *w = &cls[k].worst[cls[k].rank_shard[r]];
            if (d->loads[r] > *w)
                *w = d->loads[r];
        }
    }
}

/* The class of each bucket, creating classes as they appear; false on OOM. */
static bool classify(dealing *d)
{
    for (int i = 0; i < d->nb; i++) {
        int c = 0;
        while (c < d->ncls && !same_place(d->m, d->cls[c].place, d->b[i].fine))
            c++;
        if (c == d->ncls && !class_init(d->m, d->b[i].fine, d->b[i].P, &d->cls[d->ncls++]))
            return false;
        d->cls_of[i] = c;
    }
    return true;
}

/* Each bucket's tensors grouped by group (members from tfirst, group g's
 * from gstart[first + g]). */
static void group_members(dealing *d)
{
    for (int i = 0; i < d->nb; i++) {
        const mf_whole_bucket *b = &d->b[i];
        int64_t *gs = d->gstart + d->first[i] + i; /* P + 1 per bucket */
        memset(gs, 0, (size_t)(b->P + 1) * sizeof *gs);
        for (int t = 0; t < b->n; t++)
            gs[b->group[t] + 1]++;
        for (int64_t g = 0; g < b->P; g++)
            gs[g + 1] += gs[g];
        int *mem = d->members + d->tfirst[i];
        for (int t = 0; t < b->n; t++)
            mem[gs[b->group[t]]++] = t;
        for (int64_t g = b->P; g > 0; g--)
            gs[g] = gs[g - 1];
        gs[0] = 0;
    }
}

/* The items of one run: each bucket's tensors, or its groups; returns the count. */
static int64_t make_items(dealing *d)
{
    int64_t k = 0;
    for (int i = 0; i < d->nb; i++) {
        const mf_whole_bucket *b = &d->b[i];
        if (!d->by_group[i]) {
            for (int t = 0; t < b->n; t++)
                d->items[k++] = (owner_item){i, t, b->cost[t], round_up(b->numel[t], b->tq)};
            continue;
        }
        const int64_t *gs = d->gstart + d->first[i] + i;
        const int *mem = d->members + d->tfirst[i];
        for (int64_t g = 0; g < b->P; g++) {
            owner_item it = {i, (int)g, 0, 0};
            for (int64_t j = gs[g]; j < gs[g + 1]; j++) {
                it.cost = sat_add(it.cost, b->cost[mem[j]]);
                it.size += round_up(b->numel[mem[j]], b->tq);
            }
            d->items[k++] = it;
        }
    }
    return k;
}

/* The load of shard q's span: the sum of the worst loads of the shards that
 * share q's coordinate on the innermost split axis (q / (P / n_last) in the
 * inner-major order), the ranks whose tensors a placement split on that axis
 * alone (a 2-D layout's weight and grad) holds together in a ragged bucket. */
static int64_t span_load(const dealing *d, const owner_class *c, int64_t q)
{
    int64_t inner = d->m->axes[d->m->naxes - 1].size, per = c->P % inner == 0 ? c->P / inner : c->P;
    int64_t lo = q / per * per, sum = 0;
    for (int64_t x = lo; x < lo + per; x++)
        sum = sat_add(sum, c->worst[x]);
    return sum;
}

/* The shard item `it` takes: least worst load among the shards with room (a
 * group: an untaken shard); ties: the least loaded span (span_load), then
 * the lowest shard; -1 when none has room. The spans spread the extra load
 * of the ties over the innermost axis, so the coarser placements' ragged
 * shards stay as balanced as the ranks. */
static int64_t pick(const dealing *d, const owner_item *it)
{
    const mf_whole_bucket *b = &d->b[it->bucket];
    const owner_class *c = &d->cls[d->cls_of[it->bucket]];
    const int64_t *used = d->used + d->first[it->bucket];
    const bool *taken = d->taken + d->first[it->bucket];
    int64_t best = -1, best_span = 0;
    for (int64_t q = 0; q < b->P; q++) {
        bool room = d->by_group[it->bucket] ? !taken[q] : used[q] + it->size <= b->S;
        if (!room || (best >= 0 && c->worst[q] > c->worst[best]))
            continue;
        int64_t span = span_load(d, c, q);
        if (best < 0 || c->worst[q] < c->worst[best] || span < best_span) {
            best = q;
            best_span = span;
        }
    }
    return best;
}

/* One run over the n items; marks the buckets where a tensor found no room
 * in failed[]; returns whether none did. */
static bool deal(dealing *d, int64_t n)
{
    int64_t shards = d->nb ? d->first[d->nb - 1] + d->b[d->nb - 1].P : 0;
    memset(d->used, 0, (size_t)shards * sizeof *d->used);
    memset(d->taken, 0, (size_t)shards * sizeof *d->taken);
    memset(d->loads, 0, (size_t)d->m->world * sizeof *d->loads);
    for (int c = 0; c < d->ncls; c++)
        memset(d->cls[c].worst, 0, (size_t)d->cls[c].P * sizeof *d->cls[c].worst);
    bool all = true;
    for (int64_t k = 0; k < n; k++) {
        const owner_item *it = &d->items[k];
        mf_whole_bucket *b = &d->b[it->bucket];
        int64_t q = pick(d, it);
        if (q < 0) {
            d->failed[it->bucket] = true;
            all = false;
            continue;
        }
        d->used[d->first[it->bucket] + q] += it->size;
        if (!d->by_group[it->bucket]) {
            b->shard[it->index] = (int)q;
        } else {
            d->taken[d->first[it->bucket] + q] = true;
            const int64_t *gs = d->gstart + d->first[it->bucket] + it->bucket;
            const int *mem = d->members + d->tfirst[it->bucket];
            for (int64_t j = gs[it->index]; j < gs[it->index + 1]; j++)
                b->shard[mem[j]] = (int)q;
        }
        if (it->cost > 0)
            charge(d, d->cls_of[it->bucket], q, it->cost);
    }
    return all;
}

/* Runs the dealing until no bucket fails (the header comment); returns the
 * most load of a rank. */
static int64_t deal_all(dealing *d)
{
    for (int run = 0;; run++) {
        int64_t n = make_items(d);
        qsort(d->items, (size_t)n, sizeof *d->items, item_order);
        if (deal(d, n))
            break;
        for (int i = 0; i < d->nb; i++)
            d->by_group[i] = d->by_group[i] || d->failed[i] || run + 1 >= MF_WHOLE_OWNERS_TRIES;
    }
    int64_t most = 0;
    for (int64_t r = 0; r < d->m->world; r++)
        most = d->loads[r] > most ? d->loads[r] : most;
    return most;
}

/* The tensors' shards of every bucket to (save) or from `keep`. */
static void shards_copy(dealing *d, int *keep, bool save)
{
    for (int i = 0; i < d->nb; i++) {
        int *shard = d->b[i].shard, *k = keep + d->tfirst[i];
        memcpy(save ? k : shard, save ? shard : k, (size_t)d->b[i].n * sizeof *shard);
    }
}

/* The better of two dealings, by the most load of a rank (ties: the first):
 * tensor by tensor (falling back to groups where needed), and every bucket
 * by its groups; tight shards (S near the mean group) can make the second
 * better. keep: scratch for one dealing's shards. */
static void deal_best(dealing *d, int *keep)
{
    int64_t by_tensor = deal_all(d);
    shards_copy(d, keep, true);
    for (int i = 0; i < d->nb; i++)
        d->by_group[i] = true;
    if (deal_all(d) >= by_tensor)
        shards_copy(d, keep, false);
}

bool mf_whole_owners_assign(const mf_mesh *m, mf_whole_bucket *b, int nb)
{
    size_t slots = nb ? (size_t)nb : 1;
    int64_t shards = 0, tensors = 0, items = 0;
    for (int i = 0; i < nb; i++) {
        shards += b[i].P;
        tensors += b[i].n;
        items += b[i].n > b[i].P ? b[i].n : b[i].P;
    }
    dealing d = {.m = m, .b = b, .nb = nb};
    d.cls = calloc(slots, sizeof *d.cls);
    d.cls_of = malloc(slots * sizeof *d.cls_of);
    d.first = malloc(slots * sizeof *d.first);
    d.tfirst = malloc(slots * sizeof *d.tfirst);
    d.used = malloc((size_t)(shards ? shards : 1) * sizeof *d.used);
    d.taken = malloc((size_t)(shards ? shards : 1) * sizeof *d.taken);
    d.gstart = malloc((size_t)(shards + nb + 1) * sizeof *d.gstart);
    d.members = malloc((size_t)(tensors ? tensors : 1) * sizeof *d.members);
    d.loads = malloc((size_t)m->world * sizeof *d.loads);
    d.items = malloc((size_t)(items ? items : 1) * sizeof *d.items);
    d.by_group = calloc(slots, sizeof *d.by_group);
    d.failed = calloc(slots, sizeof *d.failed);
    int *keep = malloc((size_t)(tensors ? tensors : 1) * sizeof *keep);
    bool ok = d.cls && d.cls_of && d.first && d.tfirst && d.used && d.taken && d.gstart && d.members &&
              d.loads && d.items && d.by_group && d.failed && keep;
    if (ok) {
        int64_t f = 0, t = 0;
        for (int i = 0; i < nb; i++) {
            d.first[i] = f;
            d.tfirst[i] = t;
            f += b[i].P;
            t += b[i].n;
        }
        ok = classify(&d);
    }
    if (ok) {
        group_members(&d);
        deal_best(&d, keep);
    }
    for (size_t c = 0; d.cls && c < slots; c++)
        class_free(&d.cls[c]); /* calloc'd: the unused ones hold NULLs */
    MF_FREE_ALL(d.cls, d.cls_of, d.first, d.tfirst, d.used, d.taken, d.gstart, d.members, d.loads, d.items,
                d.by_group, d.failed, keep);
    return ok;
}
