/*
 * mf_ckpt_plan: the writers of every tensor element range (see the header).
 */
#include "mf_ckpt_plan.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_free.h"
#include "mf_int.h"
#include "mf_layout.h"

void mf_ckpt_plan_free(mf_ckpt_plan *p)
{
    if (!p)
        return;
    MF_FREE_ALL(p->t, p->p, p->first);
    memset(p, 0, sizeof *p);
}

void *mf_ckpt_plan_reserve(void *p, int64_t *cap, int64_t n, size_t elem, int64_t first)
{
    if (n < *cap)
        return p;
    int64_t c = *cap ? *cap * 2 : first;
    void *np = realloc(p, (size_t)c * elem);
    if (np)
        *cap = c;
    return np;
}

int mf_ckpt_plan_find(const mf_ckpt_plan *p, const char *name)
{
    for (int k = 0; k < p->ntensors; k++)
        if (strcmp(p->t[k].name, name) == 0)
            return k;
    return -1;
}

int mf_ckpt_plan_find_coord(const mf_ckpt_plan *p, const char *name, int64_t coord)
{
    for (int k = 0; k < p->ntensors; k++)
        if (strcmp(p->t[k].name, name) == 0 && (p->t[k].split < 0 || p->t[k].coord == coord))
            return k;
    return -1;
}

int64_t mf_ckpt_plan_coord(const mf_schedule *s, int bucket, int64_t rank)
{
    const mf_placement *pl = &s->buckets[bucket].place[MF_ROLE_WEIGHT];
    int64_t c = -1, after = s->mesh.world;
    for (int j = 0; j < s->mesh.naxes; j++) {
        int64_t n = s->mesh.axes[j].size;
        after /= n;
        if (pl->p[j] == MF_PLACE_DISTINCT)
            c = (c < 0 ? 0 : c * n) + (rank / after) % n;
    }
    return c;
}

void mf_ckpt_plan_held(const mf_schedule *s, const mf_ckpt_plan *p, int k, int64_t rank, int64_t *lo,
                       int64_t *hi)
{
    const mf_ckpt_ptensor *pt = &p->t[k];
    if (pt->coord >= 0 && pt->coord != mf_ckpt_plan_coord(s, pt->bucket, rank)) {
        *lo = *hi = 0; /* another coordinate's tensor */
        return;
    }
    const mf_bucket *b = &s->buckets[pt->bucket];
    const mf_tensor *t = &b->tensors[pt->index];
    mf_range r = mf_layout_bucket_range(&s->mesh, b, &b->place[MF_ROLE_MAIN_WEIGHT], rank);
    int64_t a = t->offset > r.offset ? t->offset : r.offset;
    int64_t e = t->offset + t->numel < r.offset + r.len ? t->offset + t->numel : r.offset + r.len;
    *lo = e > a ? a - t->offset : 0;
    *hi = e > a ? e - t->offset : 0;
}

int64_t mf_ckpt_plan_replicas(const mf_schedule *s, int bucket, int64_t rank, int64_t *out)
{
    const mf_bucket *b = &s->buckets[bucket];
    const mf_placement *pl = &b->place[MF_ROLE_MAIN_WEIGHT];
    mf_range mine = mf_layout_bucket_range(&s->mesh, b, pl, rank);
    int64_t n = 0, c = mf_ckpt_plan_coord(s, bucket, rank);
    for (int64_t r = 0; r < s->mesh.world; r++) {
        mf_range x = mf_layout_bucket_range(&s->mesh, b, pl, r);
        if (x.offset == mine.offset && x.len == mine.len && mf_ckpt_plan_coord(s, bucket, r) == c)
            out[n++] = r;
    }
    return n;
}

void mf_ckpt_plan_pieces_of(const mf_ckpt_plan *p, int64_t w, int k, int64_t *lo, int64_t *hi)
{
    int64_t a = p->first[w], e = p->first[w + 1];
    while (a < e) { /* the first piece of tensor >= k */
        int64_t m = a + (e - a) / 2;
        if (p->p[m].tensor < k)
            a = m + 1;
        else
            e = m;
    }
    *lo = a;
    for (e = a; e < p->first[w + 1] && p->p[e].tensor == k; e++)
        ;
    *hi = e;
}

static int mf_ckpt_piece_cmp(const void *a, const void *b)
{
    const mf_ckpt_piece *x = a, *y = b;
    return mf_cmp_keys((const int64_t[]){x->writer, x->tensor, x->start},
                       (const int64_t[]){y->writer, y->tensor, y->start}, 3);
}

typedef struct mf_ckpt_pvec {
    mf_ckpt_piece *p;
    int64_t n, cap;
} mf_ckpt_pvec;

static int mf_ckpt_pvec_push(mf_ckpt_pvec *v, int tensor, int64_t start, int64_t end, int64_t writer)
{
    mf_ckpt_piece *np = mf_ckpt_plan_reserve(v->p, &v->cap, v->n, sizeof *np, 256);
    if (!np)
        return -1;
    v->p = np;
    v->p[v->n++] = (mf_ckpt_piece){tensor, start, end, writer};
    return 0;
}

/* Pushes piece [start, end) of plan tensor pt (index k), cut where a run
 * of a split tensor ends (each piece one contiguous range of W). */
static int mf_ckpt_pvec_runs(mf_ckpt_pvec *v, const mf_ckpt_ptensor *pt, int k, int64_t start, int64_t end,
                             int64_t writer)
{
    while (start < end) {
        int64_t e = pt->split > 0 ? (start / pt->run + 1) * pt->run : end;
        e = e < end ? e : end;
        if (mf_ckpt_pvec_push(v, k, start, e, writer) != 0)
            return -1;
        start = e;
    }
    return 0;
}

/* Emits the pieces of shard range [o, o + len) of bucket b (its tensors are
 * plan tensors first .. first + ntensors of pt) split among the replicas. */
static int mf_ckpt_plan_shard(const mf_bucket *b, const mf_ckpt_ptensor *pt, int first, int64_t o, int64_t len,
                              const int64_t *reps, int64_t nrep, int64_t rot, mf_ckpt_pvec *v)
{
    int64_t total = 0;
    for (int i = 0; i < b->ntensors; i++) {
        const mf_tensor *t = &b->tensors[i];
        int64_t lo = t->offset > o ? t->offset : o;
        int64_t hi = t->offset + t->numel < o + len ? t->offset + t->numel : o + len;
        total += hi > lo ? hi - lo : 0;
    }
    int64_t seen = 0; /* tensor elements of the shard before tensor i */
    for (int i = 0; i < b->ntensors; i++) {
        const mf_tensor *t = &b->tensors[i];
        int64_t lo = t->offset > o ? t->offset : o;
        int64_t hi = t->offset + t->numel < o + len ? t->offset + t->numel : o + len;
        if (hi <= lo)
            continue;
        /* Part j covers ordinals [total*j/nrep, total*(j+1)/nrep). */
        for (int64_t j = 0; j < nrep; j++) {
            int64_t a = total * j / nrep, e = total * (j + 1) / nrep;
            int64_t pa = a > seen ? a : seen, pe = e < seen + (hi - lo) ? e : seen + (hi - lo);
            if (pe <= pa)
                continue;
            int64_t start = lo - t->offset + (pa - seen), end = start + (pe - pa);
            if (mf_ckpt_pvec_runs(v, &pt[first + i], first + i, start, end, reps[(j + rot) % nrep]) != 0)
                return -1;
        }
        seen += hi - lo;
    }
    return 0;
}

/* Groups the world's ranks of coordinate combination c (-1: all) by their
 * shard of bucket b and emits every shard; the bucket's tensors are plan
 * tensors first .. first + ntensors. */
static int mf_ckpt_plan_bucket(const mf_schedule *s, const mf_ckpt_ptensor *pt, int bi, int64_t c, int first,
                               int64_t *q, int64_t *order, int64_t *start, mf_ckpt_pvec *v)
{
    const mf_bucket *b = &s->buckets[bi];
    const mf_placement *pl = &b->place[MF_ROLE_MAIN_WEIGHT];
    int64_t world = s->mesh.world, shards = mf_layout_shards(&s->mesh, pl);
    memset(start, 0, (size_t)(shards + 1) * sizeof *start);
    for (int64_t r = 0; r < world; r++) {
        int64_t coords[MF_MAX_AXES];
        mf_layout_mesh_coords(&s->mesh, r, coords);
        q[r] = c >= 0 && mf_ckpt_plan_coord(s, bi, r) != c ? -1 : mf_layout_shard_index(&s->mesh, pl, coords);
        if (q[r] >= 0)
            start[q[r] + 1]++;
    }
    for (int64_t k = 0; k < shards; k++)
        start[k + 1] += start[k];
    for (int64_t r = 0; r < world; r++)
        if (q[r] >= 0)
            order[start[q[r]]++] = r; /* ascending ranks per shard */
    for (int64_t k = shards; k > 0; k--)
        start[k] = start[k - 1];
    start[0] = 0;
    for (int64_t k = 0; k < shards; k++) {
        int64_t nrep = start[k + 1] - start[k];
        mf_range sh = mf_layout_bucket_shard(&s->mesh, b, pl, k); /* equal, or ragged */
        const int64_t *reps = order + start[k];
        if (nrep > 0 && mf_ckpt_plan_shard(b, pt, first, sh.offset, sh.len, reps, nrep, (bi + k) % nrep, v) != 0)
            return -1;
    }
    return 0;
}

int mf_ckpt_plan_check_global(const mf_schedule *s, char *err, size_t errlen)
{
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        if (!mf_placement_has_distinct(&bk->place[MF_ROLE_WEIGHT], s->mesh.naxes))
            continue;
        for (int i = 0; i < bk->ntensors; i++) {
            const mf_tensor *t = &bk->tensors[i];
            if (!t->nglobal) {
                snprintf(err, errlen,
                         "tensor '%s' of bucket '%s' is Distinct (each coordinate holds a different tensor under "
                         "this name) and has no global name: checkpoints write the global tensors; give it "
                         "'global \"TEMPLATE\"' in the spec (docs/language.md §3.4)",
                         t->name, bk->name);
                return -1;
            }
            if (t->global_split && (t->global_dim < 0 || t->global_dim >= t->ndims)) {
                snprintf(err, errlen, "tensor '%s' of bucket '%s': split dim %d of its global name '%s' is out of "
                         "range (the tensor has %d dims)", t->name, bk->name, t->global_dim, t->global[0],
                         t->ndims);
                return -1;
            }
        }
    }
    return 0;
}

int mf_ckpt_plan_check_split(const mf_schedule *s, int naxes, char *const *axis_name, const int64_t *axis_size,
                             char *err, size_t errlen)
{
    for (int b = 0; b < s->nbuckets; b++)
        for (int i = 0; i < s->buckets[b].ntensors; i++) {
            const mf_tensor *t = &s->buckets[b].tensors[i];
            for (int j = 0; t->global_split && j < s->mesh.naxes; j++) {
                const mf_axis *ax = &s->mesh.axes[j];
                if (s->buckets[b].place[MF_ROLE_WEIGHT].p[j] != MF_PLACE_DISTINCT)
                    continue;
                for (int a = 0; a < naxes; a++)
                    if (strcmp(axis_name[a], ax->name) == 0 && axis_size[a] != ax->size) {
                        snprintf(err, errlen, "tensor '%s' (global '%s' split %d) is split over axis '%s' of size "
                                 "%" PRId64 " here, %" PRId64 " in the checkpoint: a split global tensor loads "
                                 "only with the same size of its Distinct axes (any data-parallel sizes)",
                                 t->name, t->global[0], t->global_dim, ax->name, ax->size, axis_size[a]);
                        return -1;
                    }
            }
        }
    return 0;
}

int64_t mf_ckpt_plan_gstart(const mf_ckpt_ptensor *pt, int64_t i)
{
    return pt->run > 0 ? i / pt->run * pt->grow + pt->gbase + i % pt->run : i;
}

int mf_ckpt_plan_gmap(const mf_schedule *s, int bucket, int index, int64_t c, int64_t *run, int64_t *grow,
                      int64_t *gbase, int64_t *gdims)
{
    const mf_tensor *t = &s->buckets[bucket].tensors[index];
    if (gdims)
        memcpy(gdims, t->dims, sizeof(int64_t) * MF_MAX_DIMS);
    *run = t->numel;
    *grow = 0;
    *gbase = 0;
    if (!t->global_split || c < 0)
        return -1;
    int d = t->global_dim;
    int64_t n = mf_ckpt_plan_combos(s, bucket), r = 1;
    for (int j = d; j < t->ndims; j++)
        r *= t->dims[j];
    *run = r;
    *grow = r * n;
    *gbase = c * r;
    if (gdims)
        gdims[d] = t->dims[d] * n;
    return d;
}

/* The plan tensors of bucket b for coordinate combination c (-1: not
 * Distinct) appended to out->t. */
static void mf_ckpt_plan_tensors(const mf_schedule *s, int b, int64_t c, mf_ckpt_plan *out)
{
    const mf_bucket *bk = &s->buckets[b];
    for (int i = 0; i < bk->ntensors; i++) {
        mf_ckpt_ptensor *pt = &out->t[out->ntensors++];
        const mf_tensor *t = &bk->tensors[i];
        pt->split = mf_ckpt_plan_gmap(s, b, i, c, &pt->run, &pt->grow, &pt->gbase, pt->gdims);
        pt->name = c < 0 ? t->name : t->global[pt->split >= 0 ? 0 : c]; /* split: one name, W */
        pt->local = t->name;
        pt->coord = c;
        pt->bucket = b;
        pt->index = i;
        pt->ndims = t->ndims;
        memcpy(pt->dims, t->dims, sizeof pt->dims);
        pt->numel = t->numel;
        pt->dtype = bk->dtype[MF_ROLE_MAIN_WEIGHT];
        int m = pt->split >= 0 ? mf_ckpt_plan_find(out, pt->name) : -1;
        pt->mt = m >= 0 && m < out->ntensors - 1 ? out->t[m].mt : out->nmt++;
    }
}

int64_t mf_ckpt_plan_combos(const mf_schedule *s, int b)
{
    int64_t n = 1;
    for (int j = 0; j < s->mesh.naxes; j++)
        if (s->buckets[b].place[MF_ROLE_WEIGHT].p[j] == MF_PLACE_DISTINCT)
            n *= s->mesh.axes[j].size;
    return n;
}

int mf_ckpt_plan_build(const mf_schedule *s, mf_ckpt_plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (mf_ckpt_plan_check_global(s, err, errlen) != 0)
        return -1;
    int64_t world = s->mesh.world, maxshards = 1;
    int64_t nt = 0;
    for (int b = 0; b < s->nbuckets; b++) {
        nt += s->buckets[b].ntensors * mf_ckpt_plan_combos(s, b);
        int64_t sh = mf_layout_shards(&s->mesh, &s->buckets[b].place[MF_ROLE_MAIN_WEIGHT]);
        maxshards = sh > maxshards ? sh : maxshards;
    }
    out->world = world;
    out->t = calloc((size_t)(nt ? nt : 1), sizeof *out->t);
    out->first = calloc((size_t)world + 1, sizeof *out->first);
    int64_t *q = malloc((size_t)world * sizeof *q), *order = malloc((size_t)world * sizeof *order);
    int64_t *start = malloc((size_t)(maxshards + 1) * sizeof *start);
    mf_ckpt_pvec v = {0};
    int rc = -1;
    if (!out->t || !out->first || !q || !order || !start)
        goto done;
    for (int b = 0; b < s->nbuckets; b++) {
        bool distinct = mf_placement_has_distinct(&s->buckets[b].place[MF_ROLE_WEIGHT], s->mesh.naxes);
        for (int64_t c = distinct ? 0 : -1, nc = mf_ckpt_plan_combos(s, b); c < (distinct ? nc : 0); c++) {
            int first = out->ntensors;
            mf_ckpt_plan_tensors(s, b, c, out);
            if (mf_ckpt_plan_bucket(s, out->t, b, c, first, q, order, start, &v) != 0)
                goto done;
        }
    }
    qsort(v.p, (size_t)v.n, sizeof *v.p, mf_ckpt_piece_cmp);
    for (int64_t i = 0; i < v.n; i++)
        out->first[v.p[i].writer + 1]++;
    for (int64_t r = 0; r < world; r++)
        out->first[r + 1] += out->first[r];
    out->p = v.p;
    out->npieces = v.n;
    v.p = NULL;
    rc = 0;
done:
    free(v.p);
    free(q);
    free(order);
    free(start);
    if (rc != 0) {
        snprintf(err, errlen, "out of memory (checkpoint plan)");
        mf_ckpt_plan_free(out);
    }
    return rc;
}
