/*
 * plan_testlib: spec builder, layout invariants and the op-semantics
 * simulator used by the planner tests (see plan_testlib.h).
 */
#include "plan_testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const axis_names[] = {"a0", "a1", "a2", "a3"};

mf_placement tl_place(const char *letters)
{
    mf_placement p = {{0}};
    for (int j = 0; letters[j]; j++)
        p.p[j] = letters[j] == 'F' ? MF_PLACE_FLAT : letters[j] == 'P' ? MF_PLACE_PARTIAL : MF_PLACE_REPLICATE;
    return p;
}

mf_mesh tl_mesh(int naxes, int64_t n0, int64_t n1)
{
    mf_mesh m = {.naxes = naxes, .world = naxes == 1 ? n0 : n0 * n1};
    m.axes[0].name = naxes == 1 ? "dp" : "dp_outer";
    m.axes[0].size = n0;
    if (naxes == 2) {
        m.axes[1].name = "dp_inner";
        m.axes[1].size = n1;
    }
    return m;
}

static mf_span line_span(int line)
{
    mf_span s = {line, 3, line, 9};
    return s;
}

mf_spec *tl_spec_new(mf_arena *a, int naxes, const int64_t *sizes, int64_t microbatches, mf_reduce reduce)
{
    mf_spec *s = mf_arena_alloc(a, sizeof *s);
    assert_non_null(s);
    s->path = "test.mfsdp";
    s->mesh.naxes = naxes;
    s->mesh.world = 1;
    for (int j = 0; j < naxes; j++) {
        s->mesh.axes[j].name = axis_names[j];
        s->mesh.axes[j].size = sizes[j];
        s->mesh.world *= sizes[j];
    }
    s->mesh_span = line_span(1);
    s->microbatches = microbatches;
    s->reduce = reduce;
    s->align = 256;
    s->prefetch = 1;
    s->layouts = mf_arena_array(a, TL_MAX_LAYOUTS, sizeof *s->layouts);
    s->units = mf_arena_array(a, TL_MAX_UNITS, sizeof *s->units);
    assert_non_null(s->layouts);
    assert_non_null(s->units);
    return s;
}

int tl_layout(mf_arena *a, mf_spec *s, const char *name, const char *w, mf_dtype dw, const char *g, mf_dtype dg,
              const char *o, mf_dtype dmo)
{
    assert_true(s->nlayouts < TL_MAX_LAYOUTS);
    int i = s->nlayouts++;
    mf_spec_layout *l = &s->layouts[i];
    l->name = mf_arena_strdup(a, name);
    l->is_inline = name[0] == '<';
    l->span = line_span(100 + 10 * i);
    l->place[MF_ROLE_WEIGHT] = tl_place(w);
    l->place[MF_ROLE_GRAD] = tl_place(g);
    l->place[MF_ROLE_MAIN_WEIGHT] = tl_place(o);
    l->dtype[MF_ROLE_WEIGHT] = dw;
    l->dtype[MF_ROLE_GRAD] = dg;
    l->dtype[MF_ROLE_MAIN_WEIGHT] = dmo;
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        l->role_span[r] = line_span(100 + 10 * i + 1 + r);
    return i;
}

int tl_unit(mf_arena *a, mf_spec *s, const char *name, int layout, bool reshard_after_forward)
{
    assert_true(s->nunits < TL_MAX_UNITS);
    int i = s->nunits++;
    mf_spec_unit *u = &s->units[i];
    u->name = mf_arena_strdup(a, name);
    u->span = line_span(10 + i);
    u->layout = layout;
    u->reshard_after_forward = reshard_after_forward;
    u->tensors = mf_arena_array(a, TL_MAX_TENSORS, sizeof *u->tensors);
    assert_non_null(u->tensors);
    return i;
}

void tl_tensor2(mf_arena *a, mf_spec *s, int unit, const char *name, int64_t d0, int64_t d1, int layout)
{
    mf_spec_unit *u = &s->units[unit];
    assert_true(u->ntensors < TL_MAX_TENSORS);
    mf_spec_tensor *t = &u->tensors[u->ntensors++];
    t->name = mf_arena_printf(a, "%s.%s", u->name, name);
    t->span = line_span(1000 + u->ntensors);
    t->ndims = d1 > 0 ? 2 : 1;
    t->dims[0] = d0;
    t->dims[1] = d1 > 0 ? d1 : 0;
    t->numel = d1 > 0 ? d0 * d1 : d0;
    t->layout = layout >= 0 ? layout : u->layout;
}

void tl_tensor(mf_arena *a, mf_spec *s, int unit, const char *name, int64_t numel, int layout)
{
    tl_tensor2(a, s, unit, name, numel, 0, layout);
}

mf_plan *tl_plan(const mf_spec *s, const mf_cost_model *cost, char **diag)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    assert_non_null(mem);
    mf_source src = {s->path, "", 0};
    mf_diag d;
    mf_diag_init(&d, &src, mem);
    mf_plan *p = mf_plan_new(s, cost);
    assert_non_null(p);
    bool ok = mf_layout_pass_run(p, &d) && mf_transition_run(p, &d);
    mf_diag_finish(&d);
    fclose(mem);
    if (diag)
        *diag = text;
    else
        free(text);
    if (!ok) {
        mf_plan_free(p);
        return NULL;
    }
    return p;
}

uint64_t tl_rand(uint64_t *state)
{
    /* splitmix64 */
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

int64_t tl_rand_range(uint64_t *state, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(tl_rand(state) % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------------ mesh math
 *
 * The test's own mesh and shard math, written from the definitions (docs/
 * semantics.md) rather than calling core/mf_layout.c, so the checks below
 * compare the planner against an independent statement of the rules:
 *   - rank <-> coords: row-major, the innermost (last) axis fastest;
 *   - a placement's Flat axes split the bucket one after another, innermost
 *     first: the innermost Flat axis cuts [0, L) into n pieces and a rank
 *     keeps piece c; the next Flat axis out cuts that piece again; ...
 *   - a ring collective on n ranks sends, per rank, n - 1 pieces of `count`
 *     elements (all-gather, reduce-scatter), or twice n - 1 pieces of
 *     count / n rounded up (all-reduce = reduce-scatter + all-gather).
 */

static void tl_coords(const mf_mesh *m, int64_t rank, int64_t c[MF_MAX_AXES])
{
    for (int j = m->naxes - 1; j >= 0; j--) {
        c[j] = rank % m->axes[j].size;
        rank /= m->axes[j].size;
    }
}

/* The ranks that differ from `rank` only on `axis`, by their coordinate there. */
static void tl_axis_group(const mf_mesh *m, int axis, int64_t rank, int64_t *out)
{
    int64_t stride = 1;
    for (int j = m->naxes - 1; j > axis; j--)
        stride *= m->axes[j].size;
    int64_t c[MF_MAX_AXES];
    tl_coords(m, rank, c);
    int64_t base = rank - c[axis] * stride;
    for (int64_t i = 0; i < m->axes[axis].size; i++)
        out[i] = base + i * stride;
}

static int64_t tl_shards(const mf_mesh *m, const mf_placement *pl)
{
    int64_t n = 1;
    for (int j = 0; j < m->naxes; j++)
        if (pl->p[j] == MF_PLACE_FLAT)
            n *= m->axes[j].size;
    return n;
}

static mf_range tl_range(const mf_mesh *m, const mf_placement *pl, int64_t rank, int64_t L)
{
    int64_t c[MF_MAX_AXES];
    tl_coords(m, rank, c);
    mf_range r = {0, L};
    for (int j = m->naxes - 1; j >= 0 && pl->p[j] == MF_PLACE_FLAT; j--) {
        r.len /= m->axes[j].size;
        r.offset += c[j] * r.len;
    }
    return r;
}

/* A ragged bucket's range (docs/semantics.md §4.6), recomputed here: the
 * finest whole placement has P = nbounds - 1 shards, placement pl Pp of them
 * (its Flat axes, innermost first: shard q = sum c_j * prod of the sizes of
 * the Flat axes outside j), k = P / Pp, shard q = [bounds[q k], bounds[(q+1) k]).
 * bounds NULL: tl_range's equal shards of L. */
static mf_range tl_range_b(const mf_mesh *m, const mf_placement *pl, int64_t rank, int64_t L, const int64_t *bounds,
                           int64_t nbounds)
{
    if (!bounds)
        return tl_range(m, pl, rank, L);
    int64_t c[MF_MAX_AXES], q = 0, stride = 1, s = m->naxes;
    tl_coords(m, rank, c);
    while (s > 0 && pl->p[s - 1] == MF_PLACE_FLAT)
        s--;
    for (int64_t j = s; j < m->naxes; j++) {
        q += c[j] * stride;
        stride *= m->axes[j].size;
    }
    int64_t k = (nbounds - 1) / stride;
    assert_int_equal((nbounds - 1) % stride, 0);
    return (mf_range){bounds[q * k], bounds[(q + 1) * k] - bounds[q * k]};
}

static int64_t tl_ring_bytes(mf_opkind k, int64_t n, int64_t count, int64_t size)
{
    if (k == MF_OP_ALL_REDUCE)
        return 2 * (n - 1) * (count / n + (count % n != 0)) * size;
    return (n - 1) * count * size;
}

/* ------------------------------------------------------------ layout */

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* A ragged bucket's bounds (docs/semantics.md §4.6): from 0 to L, never
 * decreasing, each on `align` bytes in every role's dtype; every role's
 * ranks tile [0, L) with ranges that lie on bounds; every tensor inside one
 * shard of the finest whole placement. */
static void tl_check_ragged(const mf_schedule *s, const mf_bucket *b)
{
    const mf_mesh *m = &s->mesh;
    int64_t nb = mf_layout_bucket_nbounds(m, b);
    assert_true(nb >= 2);
    assert_int_equal(b->bounds[0], 0);
    assert_int_equal(b->bounds[nb - 1], b->length);
    for (int64_t q = 0; q < nb; q++) {
        assert_true(q == 0 || b->bounds[q] >= b->bounds[q - 1]);
        for (int r = 0; r < MF_ROLE_COUNT; r++)
            assert_int_equal(b->bounds[q] * (int64_t)mf_dtype_size(b->dtype[r]) % s->align, 0);
    }
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        int64_t covered = 0;
        for (int64_t rank = 0; rank < m->world; rank++) {
            mf_range rg = tl_range_b(m, &b->place[r], rank, b->length, b->bounds, nb);
            assert_true(rg.offset >= 0 && rg.offset + rg.len <= b->length);
            covered += rg.len; /* every shard as often as it has ranks */
        }
        assert_int_equal(covered, b->length * (m->world / tl_shards(m, &b->place[r])));
    }
    for (int i = 0; i < b->ntensors; i++) {
        const mf_tensor *t = &b->tensors[i];
        int64_t q = 0;
        while (q + 1 < nb && b->bounds[q + 1] <= t->offset && t->numel > 0)
            q++;
        assert_true(t->numel == 0 || t->offset + t->numel <= b->bounds[q + 1]);
    }
}

void tl_check_layout(const mf_plan *p)
{
    const mf_spec *spec = p->spec;
    const mf_schedule *s = p->sched;
    const mf_mesh *m = &s->mesh;
    assert_int_equal(s->nunits, spec->nunits);
    assert_int_equal(s->mesh.world, spec->mesh.world);
    /* every spec tensor lands in exactly one bucket of a unit range covering its unit */
    int64_t seen_tensors = 0;
    int next_bucket = 0;
    for (int u = 0; u < s->nunits; u++) {
        assert_string_equal(s->units[u].name, spec->units[u].name);
        assert_int_equal(s->units[u].first_bucket == next_bucket || s->units[u].nbuckets == 0, 1);
        next_bucket += s->units[u].nbuckets;
    }
    assert_int_equal(next_bucket, s->nbuckets);
    for (int bi = 0; bi < s->nbuckets; bi++) {
        const mf_bucket *b = &s->buckets[bi];
        assert_true(b->unit >= 0 && b->unit <= b->last_unit && b->last_unit < s->nunits);
        assert_true(bi >= s->units[b->unit].first_bucket &&
                    bi < s->units[b->unit].first_bucket + s->units[b->unit].nbuckets);
        if (spec->bucket_size == 0)
            assert_int_equal(b->last_unit, b->unit);
        /* name */
        size_t un = strlen(s->units[b->unit].name);
        assert_memory_equal(b->name, s->units[b->unit].name, un);
        assert_int_equal(b->name[un], '/');
        for (int bj = 0; bj < bi; bj++)
            assert_string_not_equal(b->name, s->buckets[bj].name);
        /* tensor quantum: 16 bytes in every role's dtype; packing is tight */
        int64_t tq = 1, aq = 1;
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            int64_t size = (int64_t)mf_dtype_size(b->dtype[r]);
            tq = max64(tq, 16 / size);
            aq = max64(aq, s->align / (s->align < size ? s->align : size));
        }
        int64_t end = 0;
        for (int i = 0; i < b->ntensors; i++) {
            const mf_tensor *t = &b->tensors[i];
            for (int r = 0; r < MF_ROLE_COUNT; r++)
                assert_int_equal(t->offset * (int64_t)mf_dtype_size(b->dtype[r]) % 16, 0);
            assert_true(t->offset >= end);
            /* a whole bucket packs shard by shard (docs/semantics.md §4.6): gaps at shard starts */
            bool whole = b->whole[MF_ROLE_GRAD] || b->whole[MF_ROLE_MAIN_WEIGHT];
            assert_true(whole || t->offset - end < tq);
            end = t->offset + t->numel;
            seen_tensors++;
        }
        assert_int_equal(b->used, end);
        assert_true(b->length >= b->used && b->length > 0);
        /* the padding stays below one quantum of the whole mesh: every shard
         * count divides the world, so a multiple of aq * world always splits
         * evenly and aligned (the exact padding is checked against
         * hand-worked lengths in test_plan_layout.c) */
        assert_true(b->whole[MF_ROLE_GRAD] || b->whole[MF_ROLE_MAIN_WEIGHT] || b->length - b->used < aq * m->world);
        /* every role placement: equal shards, aligned in every role's dtype,
         * and the shards of the ranks tile [0, L): each rank's range is shard
         * q = offset / len of S equal shards, and every q occurs */
        if (b->bounds) {
            tl_check_ragged(s, b);
            continue;
        }
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            const mf_placement *pl = &b->place[r];
            int64_t shards = tl_shards(m, pl);
            assert_int_equal(b->length % shards, 0);
            char *covered = calloc((size_t)shards, 1);
            assert_non_null(covered);
            for (int64_t rank = 0; rank < m->world; rank++) {
                mf_range rg = tl_range(m, pl, rank, b->length);
                assert_int_equal(rg.len, b->length / shards);
                assert_int_equal(rg.offset % rg.len, 0);
                assert_true(rg.offset / rg.len < shards);
                for (int r2 = 0; r2 < MF_ROLE_COUNT; r2++)
                    assert_int_equal(rg.offset * (int64_t)mf_dtype_size(b->dtype[r2]) % s->align, 0);
                covered[rg.offset / rg.len] = 1;
            }
            for (int64_t x = 0; x < shards; x++)
                assert_int_equal(covered[x], 1);
            free(covered);
        }
    }
    int64_t spec_tensors = 0;
    for (int u = 0; u < spec->nunits; u++)
        spec_tensors += spec->units[u].ntensors;
    assert_int_equal(seen_tensors, spec_tensors);
}

/* ------------------------------------------------------------ simulator */

typedef enum { TRUTH_WEIGHT, TRUTH_GRAD } truth_kind;

typedef struct sim {
    const mf_mesh *m;
    int64_t L;
    mf_reduce reduce;
    double **buf;           /* per rank */
    int64_t *len;           /* per rank */
    const int64_t *bounds;  /* a ragged bucket's (tl_range_b), else NULL */
    int64_t nbounds;
} sim;

static double grad_value(int64_t mb, int64_t rank, int64_t i, int64_t world, int64_t L)
{
    return (double)(1 + i + L * (rank + world * mb));
}

/* Key of a rank: its coords on the Partial axes of pl (mixed radix). */
static int64_t partial_key(const mf_mesh *m, const mf_placement *pl, int64_t rank, int64_t *nkeys)
{
    int64_t c[MF_MAX_AXES], key = 0, n = 1;
    tl_coords(m, rank, c);
    for (int j = 0; j < m->naxes; j++)
        if (pl->p[j] == MF_PLACE_PARTIAL) {
            key = key * m->axes[j].size + c[j];
            n *= m->axes[j].size;
        }
    if (nkeys)
        *nkeys = n;
    return key;
}

/* Expected full-length contents per partial key for placement pl:
 * weights: X[i] = 0.5 + i everywhere; grads: the reduction over the non-Partial
 * axes of the sum over microbatches [mb0, mb1) of the ranks' local values. */
static double *expected_table(const mf_mesh *m, int64_t L, mf_reduce red, truth_kind kind, const mf_placement *pl,
                              int64_t mb0, int64_t mb1, int64_t *nkeys_out)
{
    int64_t nkeys;
    partial_key(m, pl, 0, &nkeys);
    double *t = calloc((size_t)(nkeys * L), sizeof *t);
    assert_non_null(t);
    if (kind == TRUTH_WEIGHT) {
        for (int64_t i = 0; i < L; i++)
            t[i] = 0.5 + (double)i;
        *nkeys_out = 1;
        return t;
    }
    for (int64_t r = 0; r < m->world; r++) {
        double *row = t + partial_key(m, pl, r, NULL) * L;
        for (int64_t mb = mb0; mb < mb1; mb++)
            for (int64_t i = 0; i < L; i++)
                row[i] += grad_value(mb, r, i, m->world, L);
    }
    if (red == MF_REDUCE_AVG) {
        double reduced = (double)(m->world / nkeys);
        for (int64_t i = 0; i < nkeys * L; i++)
            t[i] /= reduced;
    }
    *nkeys_out = nkeys;
    return t;
}

static void compare_state(const sim *S, const mf_placement *pl, const double *table, const char *what)
{
    const mf_mesh *m = S->m;
    for (int64_t r = 0; r < m->world; r++) {
        mf_range rg = tl_range_b(m, pl, r, S->L, S->bounds, S->nbounds);
        if (S->len[r] != rg.len)
            fail_msg("%s: rank %lld holds %lld elements, its placement promises %lld", what, (long long)r,
                     (long long)S->len[r], (long long)rg.len);
        const double *row = table + partial_key(m, pl, r, NULL) * S->L;
        for (int64_t x = 0; x < rg.len; x++) {
            double want = row[rg.offset + x], got = S->buf[r][x];
            if (fabs(want - got) > 1e-9 * fmax(1.0, fabs(want)))
                fail_msg("%s: rank %lld element %lld (global %lld): got %.17g, want %.17g", what, (long long)r,
                         (long long)x, (long long)(rg.offset + x), got, want);
        }
    }
}

static void load_state(sim *S, const mf_placement *pl, const double *table)
{
    for (int64_t r = 0; r < S->m->world; r++) {
        mf_range rg = tl_range_b(S->m, pl, r, S->L, S->bounds, S->nbounds);
        free(S->buf[r]);
        S->buf[r] = malloc((size_t)(rg.len ? rg.len : 1) * sizeof(double));
        assert_non_null(S->buf[r]);
        S->len[r] = rg.len;
        memcpy(S->buf[r], table + partial_key(S->m, pl, r, NULL) * S->L + rg.offset, (size_t)rg.len * sizeof(double));
    }
}

/* One step on a ragged bucket, by ranges (docs/semantics.md §4.6): a
 * gather concatenates its group's ranges, a reduce_scatter or slice keeps
 * the rank's destination range out of the source range (reduced over the
 * group), the rest keep the range. count: the longest shard of the side the
 * step shards (the destination of a reduce_scatter or slice, else the
 * source), at least every rank's length. */
static void run_step_ragged(sim *S, const mf_step *st, const char *what)
{
    const mf_mesh *m = S->m;
    int64_t world = m->world, n = st->axis >= 0 ? m->axes[st->axis].size : 1;
    double **out = calloc((size_t)world, sizeof *out);
    int64_t *outlen = calloc((size_t)world, sizeof *outlen), *group = calloc((size_t)n, sizeof *group);
    assert_true(out && outlen && group);
    bool shards = st->kind == MF_OP_REDUCE_SCATTER || st->kind == MF_OP_SLICE;
    double scale = S->reduce == MF_REDUCE_AVG ? 1.0 / (double)n : 1.0;
    for (int64_t r = 0; r < world; r++) {
        mf_range sr = tl_range_b(m, &st->from, r, S->L, S->bounds, S->nbounds);
        mf_range dr = tl_range_b(m, &st->to, r, S->L, S->bounds, S->nbounds);
        if (S->len[r] != sr.len || (shards ? dr.len : sr.len) > st->count)
            fail_msg("%s: rank %lld holds %lld of a %lld range, count %lld", what, (long long)r,
                     (long long)S->len[r], (long long)sr.len, (long long)st->count);
        if (st->axis >= 0)
            tl_axis_group(m, st->axis, r, group);
        outlen[r] = dr.len;
        out[r] = calloc((size_t)(dr.len ? dr.len : 1), sizeof(double));
        assert_non_null(out[r]);
        for (int64_t x = 0; x < dr.len; x++) {
            int64_t e = dr.offset + x; /* bucket element */
            double v = 0;
            if (st->kind == MF_OP_ALL_GATHER) {
                for (int64_t g = 0; g < n; g++) {
                    mf_range gr = tl_range_b(m, &st->from, group[g], S->L, S->bounds, S->nbounds);
                    if (e >= gr.offset && e < gr.offset + gr.len)
                        v = S->buf[group[g]][e - gr.offset];
                }
            } else if (st->kind == MF_OP_REDUCE_SCATTER || st->kind == MF_OP_ALL_REDUCE) {
                for (int64_t g = 0; g < n; g++)
                    v += S->buf[group[g]][e - sr.offset];
                v *= scale;
            } else {
                v = S->buf[r][e - sr.offset];
            }
            out[r][x] = v;
        }
    }
    for (int64_t r = 0; r < world; r++) {
        free(S->buf[r]);
        S->buf[r] = out[r];
        S->len[r] = outlen[r];
    }
    free(group);
    free(out);
    free(outlen);
}

/* Executes one step with the semantics of core/mf_schedule.h. */
static void run_step(sim *S, const mf_step *st, const char *what)
{
    if (S->bounds) {
        run_step_ragged(S, st, what);
        return;
    }
    const mf_mesh *m = S->m;
    int64_t world = m->world;
    double **out = calloc((size_t)world, sizeof *out);
    int64_t *outlen = calloc((size_t)world, sizeof *outlen);
    assert_non_null(out);
    assert_non_null(outlen);
    int64_t n = st->axis >= 0 ? m->axes[st->axis].size : 1;
    int64_t *group = calloc((size_t)n, sizeof *group);
    assert_non_null(group);
    for (int64_t r = 0; r < world; r++) {
        int64_t c[MF_MAX_AXES];
        tl_coords(m, r, c);
        int64_t cj = st->axis >= 0 ? c[st->axis] : 0, cnt = st->count, in = S->len[r];
        if (st->axis >= 0)
            tl_axis_group(m, st->axis, r, group);
        switch (st->kind) {
        case MF_OP_ALL_GATHER:
            if (in != cnt)
                fail_msg("%s: all_gather sendcount %lld but rank %lld holds %lld", what, (long long)cnt,
                         (long long)r, (long long)in);
            outlen[r] = n * cnt;
            break;
        case MF_OP_REDUCE_SCATTER:
        case MF_OP_SLICE:
            if (in != n * cnt)
                fail_msg("%s: %s count %lld x %lld ranks but rank %lld holds %lld", what, mf_opkind_name(st->kind),
                         (long long)cnt, (long long)n, (long long)r, (long long)in);
            outlen[r] = cnt;
            break;
        default:
            if (in != cnt)
                fail_msg("%s: %s count %lld but rank %lld holds %lld", what, mf_opkind_name(st->kind),
                         (long long)cnt, (long long)r, (long long)in);
            outlen[r] = cnt;
            break;
        }
        out[r] = calloc((size_t)(outlen[r] ? outlen[r] : 1), sizeof(double));
        assert_non_null(out[r]);
        double scale = S->reduce == MF_REDUCE_AVG ? 1.0 / (double)n : 1.0;
        for (int64_t x = 0; x < outlen[r]; x++) {
            double v = 0;
            switch (st->kind) {
            case MF_OP_ALL_GATHER:
                v = S->buf[group[x / cnt]][x % cnt];
                break;
            case MF_OP_REDUCE_SCATTER:
                for (int64_t g = 0; g < n; g++)
                    v += S->buf[group[g]][cj * cnt + x];
                v *= scale;
                break;
            case MF_OP_ALL_REDUCE:
                for (int64_t g = 0; g < n; g++)
                    v += S->buf[group[g]][x];
                v *= scale;
                break;
            case MF_OP_SLICE:
                v = S->buf[r][cj * cnt + x];
                break;
            default: /* cast, accumulate (its copy half; the add is done by the caller) */
                v = S->buf[r][x];
                break;
            }
            out[r][x] = v;
        }
    }
    for (int64_t r = 0; r < world; r++) {
        free(S->buf[r]);
        S->buf[r] = out[r];
        S->len[r] = outlen[r];
    }
    free(group);
    free(out);
    free(outlen);
}

static void check_step_fields(const mf_plan *p, int b, int t, int i, const mf_placement *cur, mf_dtype want_dtype,
                              const char *what)
{
    const mf_mesh *m = &p->sched->mesh;
    const mf_step *st = &p->trans[b][t].steps[i];
    if (!mf_placement_equal(&st->from, cur, m->naxes))
        fail_msg("%s: step starts from the wrong placement", what);
    if (mf_opkind_is_collective(st->kind)) {
        assert_true(st->axis >= 0 && st->axis < m->naxes);
        int64_t ring = tl_ring_bytes(st->kind, m->axes[st->axis].size, st->count, (int64_t)mf_dtype_size(st->dtype));
        const mf_bucket *bk = &p->sched->buckets[b];
        /* a whole bucket moves used prefixes only: never above the ring (tests/planner/test_whole_cost.c) */
        if (bk->whole[MF_ROLE_GRAD] || bk->whole[MF_ROLE_MAIN_WEIGHT])
            assert_true(st->bytes >= 0 && st->bytes <= ring);
        else
            assert_int_equal(st->bytes, ring);
        assert_int_equal(st->stream, st->axis == m->naxes - 1 ? MF_STREAM_INNER : MF_STREAM_OUTER);
        if (st->dtype != want_dtype)
            fail_msg("%s: %s moves %s, expected %s", what, mf_opkind_name(st->kind), mf_dtype_name(st->dtype),
                     mf_dtype_name(want_dtype));
    } else {
        assert_int_equal(st->bytes, 0);
        assert_true(st->stream == MF_STREAM_INNER || st->stream == MF_STREAM_OUTER);
    }
    /* single-axis rules of docs/semantics.md §2 */
    int s = mf_layout_flat_start(cur, m->naxes);
    switch (st->kind) {
    case MF_OP_ALL_GATHER:
        assert_int_equal(st->axis, s);
        break;
    case MF_OP_REDUCE_SCATTER:
    case MF_OP_SLICE:
        assert_int_equal(st->axis, s - 1);
        break;
    default:
        break;
    }
    assert_true(mf_layout_flat_suffix_ok(&st->to, m->naxes));
}

void tl_check_transition(const mf_plan *p, int b, int t)
{
    const mf_schedule *s = p->sched;
    const mf_mesh *m = &s->mesh;
    const mf_bucket *bk = &s->buckets[b];
    const mf_transition *tr = &p->trans[b][t];
    int64_t L = bk->length, M = s->microbatches;
    sim S = {m, L, s->reduce, calloc((size_t)m->world, sizeof(double *)), calloc((size_t)m->world, sizeof(int64_t)),
             bk->bounds, mf_layout_bucket_nbounds(m, bk)};
    assert_non_null(S.buf);
    assert_non_null(S.len);
    char what[256];
    int64_t nk;
    assert_int_equal(tr->id, t + 1);
    mf_dtype dw = bk->dtype[MF_ROLE_WEIGHT], dg = bk->dtype[MF_ROLE_GRAD], dmo = bk->dtype[MF_ROLE_MAIN_WEIGHT];
    if (t == MF_T1 || t == MF_T2) {
        double *truth = expected_table(m, L, s->reduce, TRUTH_WEIGHT, &tr->from, 0, 0, &nk);
        load_state(&S, &tr->from, truth);
        mf_placement cur = tr->from;
        int casts = 0;
        for (int i = 0; i < tr->nsteps; i++) {
            const mf_step *st = &tr->steps[i];
            snprintf(what, sizeof what, "bucket %s T%d step %d (%s)", bk->name, t + 1, i, mf_opkind_name(st->kind));
            /* gathers move the narrower of the two dtypes */
            mf_dtype want = t == MF_T2 ? dw : (mf_dtype_size(dw) <= mf_dtype_size(dmo) ? dw : dmo);
            check_step_fields(p, b, t, i, &cur, want, what);
            assert_true(st->kind == MF_OP_ALL_GATHER || st->kind == MF_OP_SLICE ||
                        (t == MF_T1 && st->kind == MF_OP_CAST));
            casts += st->kind == MF_OP_CAST;
            run_step(&S, st, what);
            cur = st->to;
            compare_state(&S, &cur, truth, what);
        }
        assert_int_equal(casts, t == MF_T1 ? 1 : 0);
        free(truth);
    } else if (t == MF_T3) {
        double *acc_table = expected_table(m, L, s->reduce, TRUTH_GRAD, &tr->to, 0, M, &nk);
        double **acc = calloc((size_t)m->world, sizeof *acc);
        assert_non_null(acc);
        mf_placement all_p = tl_place("PPPP");
        assert_true(mf_placement_equal(&tr->from, &all_p, m->naxes));
        for (int64_t mb = 0; mb < M; mb++) {
            double *local = expected_table(m, L, s->reduce, TRUTH_GRAD, &tr->from, mb, mb + 1, &nk);
            load_state(&S, &tr->from, local);
            free(local);
            mf_placement cur = tr->from;
            for (int i = 0; i < tr->nsteps; i++) {
                const mf_step *st = &tr->steps[i];
                snprintf(what, sizeof what, "bucket %s T3 microbatch %lld step %d (%s)", bk->name, (long long)mb, i,
                         mf_opkind_name(st->kind));
                check_step_fields(p, b, t, i, &cur, dg, what);
                if (st->kind == MF_OP_ACCUMULATE) {
                    assert_int_equal(i, tr->nsteps - 1);
                    run_step(&S, st, what);
                    for (int64_t r = 0; r < m->world; r++) {
                        if (mb == 0) {
                            acc[r] = S.buf[r];
                            S.buf[r] = NULL;
                        } else {
                            for (int64_t x = 0; x < S.len[r]; x++)
                                acc[r][x] += S.buf[r][x];
                        }
                    }
                    continue;
                }
                assert_true(st->kind == MF_OP_REDUCE_SCATTER || st->kind == MF_OP_ALL_REDUCE ||
                            st->kind == MF_OP_ALL_GATHER);
                run_step(&S, st, what);
                cur = st->to;
                double *exp = expected_table(m, L, s->reduce, TRUTH_GRAD, &cur, mb, mb + 1, &nk);
                compare_state(&S, &cur, exp, what);
                free(exp);
            }
            assert_true(mf_placement_equal(&cur, &tr->to, m->naxes));
        }
        assert_true(tr->nsteps >= 1 && tr->steps[tr->nsteps - 1].kind == MF_OP_ACCUMULATE);
        for (int64_t r = 0; r < m->world; r++) {
            free(S.buf[r]);
            S.buf[r] = acc[r];
        }
        free(acc);
        snprintf(what, sizeof what, "bucket %s T3 accumulated over %lld microbatches", bk->name, (long long)M);
        compare_state(&S, &tr->to, acc_table, what);
        free(acc_table);
    } else {
        double *start = expected_table(m, L, s->reduce, TRUTH_GRAD, &tr->from, 0, M, &nk);
        load_state(&S, &tr->from, start);
        free(start);
        mf_placement cur = tr->from;
        for (int i = 0; i < tr->nsteps; i++) {
            const mf_step *st = &tr->steps[i];
            snprintf(what, sizeof what, "bucket %s T4 step %d (%s)", bk->name, i, mf_opkind_name(st->kind));
            check_step_fields(p, b, t, i, &cur, dg, what);
            assert_true(st->kind != MF_OP_CAST && st->kind != MF_OP_ACCUMULATE);
            run_step(&S, st, what);
            cur = st->to;
            double *exp = expected_table(m, L, s->reduce, TRUTH_GRAD, &cur, 0, M, &nk);
            compare_state(&S, &cur, exp, what);
            free(exp);
        }
    }
    /* the last step (or no step) leaves the target placement */
    mf_placement end = tr->nsteps ? tr->steps[tr->nsteps - 1].to : tr->from;
    assert_true(mf_placement_equal(&end, &tr->to, m->naxes));
    for (int64_t r = 0; r < m->world; r++)
        free(S.buf[r]);
    free(S.buf);
    free(S.len);
}

void tl_check_plan(const mf_plan *p, int64_t max_cells)
{
    tl_check_layout(p);
    const mf_schedule *s = p->sched;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        /* the transitions connect the roles */
        assert_true(mf_placement_equal(&p->trans[b][MF_T1].from, &bk->place[MF_ROLE_MAIN_WEIGHT], s->mesh.naxes));
        assert_true(mf_placement_equal(&p->trans[b][MF_T1].to, &bk->place[MF_ROLE_WEIGHT], s->mesh.naxes));
        assert_true(mf_placement_equal(&p->trans[b][MF_T2].from, &bk->place[MF_ROLE_WEIGHT], s->mesh.naxes));
        assert_true(mf_placement_equal(&p->trans[b][MF_T3].to, &bk->place[MF_ROLE_GRAD], s->mesh.naxes));
        assert_true(mf_placement_equal(&p->trans[b][MF_T4].from, &bk->place[MF_ROLE_GRAD], s->mesh.naxes));
        assert_true(mf_placement_equal(&p->trans[b][MF_T4].to, &bk->place[MF_ROLE_MAIN_WEIGHT], s->mesh.naxes));
        if (s->mesh.world * bk->length > max_cells)
            continue;
        for (int t = 0; t < MF_NTRANSITIONS; t++)
            tl_check_transition(p, b, t);
    }
}
