/*
 * mf_struct: the structural rules of a schedule, once (see mf_struct.h for
 * the rules and who runs them). Every check reads the schedule only and
 * reports into a sink; nothing here allocates except the per-rank check's
 * memo and axis group.
 */
#include "mf_struct.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_hash.h"
#include "mf_layout.h"
#include "mf_limits.h"

#define MF_STRUCT_MAX_RANKS 1024 /* per-rank range checks up to this world size */

/* Reports one finding; returns false when the sink wants no more. */
__attribute__((format(printf, 5, 6))) static bool mf_struct_fail(mf_struct_sink *k, mf_struct_at at, int index,
                                                                 mf_struct_field field, const char *fmt, ...)
{
    if (k->stop)
        return false;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mf_struct_finding f = {at, index, field, msg};
    k->findings++;
    if (!k->report(k->ctx, &f))
        k->stop = true;
    return !k->stop;
}

bool mf_struct_kind_placement(const mf_schedule *s, const mf_bucket *bk, mf_bufkind k, mf_placement *out)
{
    switch (k) {
    case MF_BUF_MAIN_WEIGHT:
    case MF_BUF_GRAD_FINAL:
        *out = bk->place[MF_ROLE_MAIN_WEIGHT];
        return true;
    case MF_BUF_WEIGHT:
        *out = bk->place[MF_ROLE_WEIGHT];
        return true;
    case MF_BUF_WEIGHT_FULL: /* Replicate, one coordinate's tensor on a Distinct axis */
        *out = mf_placement_uniform(MF_PLACE_REPLICATE, &bk->place[MF_ROLE_WEIGHT], s->mesh.naxes);
        return true;
    case MF_BUF_GRAD_LOCAL:
        *out = mf_placement_uniform(MF_PLACE_PARTIAL, &bk->place[MF_ROLE_GRAD], s->mesh.naxes);
        return true;
    case MF_BUF_GRAD:
        *out = bk->place[MF_ROLE_GRAD];
        return true;
    default:
        return false;
    }
}

bool mf_struct_op_ragged(const mf_schedule *s, const mf_op *op)
{
    return op->bucket >= 0 && op->bucket < s->nbuckets && s->buckets[op->bucket].bounds && op->src >= 0 &&
           op->src < s->nbuffers && op->dst >= 0 && op->dst < s->nbuffers &&
           mf_layout_bucket_placement_ok(&s->mesh, &s->buckets[op->bucket], &s->buffers[op->src].place) &&
           mf_layout_bucket_placement_ok(&s->mesh, &s->buckets[op->bucket], &s->buffers[op->dst].place);
}

int64_t mf_struct_op_count_of(const mf_schedule *s, const mf_op *op)
{
    const mf_bucket *bk = &s->buckets[op->bucket];
    const mf_opkind_info *in = mf_opkind_info_of(op->kind);
    bool shards = in && in->at != MF_OPAT_NO_AXIS && in->becomes == MF_PLACE_FLAT;
    const mf_buffer *side = shards ? &s->buffers[op->dst] : &s->buffers[op->src];
    return mf_layout_bucket_capacity(&s->mesh, bk, &side->place);
}

bool mf_struct_op_extents(const mf_schedule *s, const mf_op *op, int64_t *src_need, int64_t *dst_need)
{
    int64_t n = op->axis >= 0 && op->axis < s->mesh.naxes ? s->mesh.axes[op->axis].size : 1, big;
    const mf_opkind_info *in = mf_opkind_info_of(op->kind);
    *src_need = *dst_need = op->count;
    if (mf_struct_op_ragged(s, op)) {
        /* ragged shards: each buffer holds its placement's longest shard */
        const mf_bucket *bk = &s->buckets[op->bucket];
        *src_need = mf_layout_bucket_capacity(&s->mesh, bk, &s->buffers[op->src].place);
        *dst_need = mf_layout_bucket_capacity(&s->mesh, bk, &s->buffers[op->dst].place);
        return true;
    }
    /* a gather writes n shards of count; an op that shards its axis reads them */
    bool gathers = in && in->at != MF_OPAT_NO_AXIS && in->need == MF_PLACE_FLAT;
    bool shards = in && in->at != MF_OPAT_NO_AXIS && in->becomes == MF_PLACE_FLAT;
    if (!gathers && !shards)
        return true;
    if (__builtin_mul_overflow(op->count, n, &big))
        return false;
    if (gathers)
        *dst_need = big;
    else
        *src_need = big;
    return true;
}

/* Is axis j where an op of this row works, given the first axis fs of the
 * Flat suffix (docs/semantics.md, "2. Shard order")? */
static bool mf_struct_axis_fits(mf_opat at, int j, int fs)
{
    switch (at) {
    case MF_OPAT_ANY_AXIS:
        return true;
    case MF_OPAT_FLAT_START:
        return j == fs;
    case MF_OPAT_OUTSIDE_FLAT:
        return j == fs - 1;
    default:
        return false;
    }
}

bool mf_struct_move(mf_opkind k, int axis, int naxes, const mf_placement *src, mf_placement *out)
{
    const mf_opkind_info *in = mf_opkind_info_of(k);
    *out = *src;
    if (!in || in->at == MF_OPAT_NO_AXIS)
        return true; /* the ops without an axis keep the placement */
    if (axis < 0 || axis >= naxes || src->p[axis] != in->need ||
        !mf_struct_axis_fits(in->at, axis, mf_layout_flat_start(src, naxes)))
        return false;
    out->p[axis] = (uint8_t)in->becomes;
    return true;
}

void mf_struct_move_why(mf_opkind k, char *buf, size_t size)
{
    static const char *const where[] = {
        [MF_OPAT_FLAT_START] = ", the outermost Flat axis",
        [MF_OPAT_OUTSIDE_FLAT] = ", just outside the Flat axes",
    };
    const mf_opkind_info *in = mf_opkind_info_of(k);
    if (!in || in->at == MF_OPAT_NO_AXIS) {
        snprintf(buf, size, "%s keeps the placement", in ? in->name : "an unknown op");
        return;
    }
    /* "all_gather" is spoken "an all-gather" */
    char spoken[32];
    snprintf(spoken, sizeof spoken, "%s", in->name);
    for (char *c = spoken; *c; c++)
        *c = *c == '_' ? '-' : *c;
    snprintf(buf, size, "%s %s needs %s on its axis%s", strchr("aeiou", spoken[0]) ? "an" : "a", spoken,
             mf_place_name((mf_place)in->need), where[in->at] ? where[in->at] : "");
}

bool mf_struct_op_move(const mf_schedule *s, const mf_op *op, const mf_placement *src, mf_placement *out,
                       char *why, size_t whylen)
{
    if (mf_struct_move(op->kind, op->axis, s->mesh.naxes, src, out))
        return true;
    mf_struct_move_why(op->kind, why, whylen);
    return false;
}

/* ---- the rules the loader and the runtime share ---- */

void mf_struct_bucket_role(const mf_schedule *s, int b, int r, mf_struct_sink *k)
{
    const mf_bucket *bk = &s->buckets[b];
    int64_t shards = mf_layout_shards(&s->mesh, &bk->place[r]);
    if (!bk->bounds && bk->length % shards != 0)
        mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_LENGTH,
                       "bucket '%s': length %lld is not divisible by the %lld shards of its %s placement", bk->name,
                       (long long)bk->length, (long long)shards, mf_role_name((mf_role)r));
    else if (bk->length > INT64_MAX / (int64_t)mf_dtype_size(bk->dtype[r]))
        mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_LENGTH, "bucket '%s': length %lld overflows %d bits in bytes",
                       bk->name, (long long)bk->length, MF_LIMIT_INT_BITS);
}

void mf_struct_bucket_bounds(const mf_schedule *s, int b, mf_struct_sink *k)
{
    const mf_bucket *bk = &s->buckets[b];
    int64_t n = mf_layout_bucket_nbounds(&s->mesh, bk), qa = mf_layout_shard_quantum(bk->dtype, s->align);
    if (!bk->bounds) {
        if (n)
            mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                           "bucket '%s' has a Whole role but no bounds (its ragged shards, format 7)", bk->name);
        return;
    }
    if (!n) {
        mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE, "bucket '%s' has bounds but no Whole role", bk->name);
        return;
    }
    for (int64_t q = 0; q < n; q++) {
        const char *bad = q == 0 && bk->bounds[0] != 0 ? "the first bound is not 0"
                          : q > 0 && bk->bounds[q] < bk->bounds[q - 1] ? "it is below the bound before it"
                          : bk->bounds[q] % qa != 0 ? "it is not a multiple of the shard quantum"
                          : q == n - 1 && bk->bounds[q] != bk->length ? "the last bound is not the bucket's length"
                                                                     : NULL;
        if (bad) {
            mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                           "bucket '%s': bound %lld is %lld: %s (bounds: %lld entries, non-decreasing from 0 to the "
                           "length %lld, multiples of %lld elements)",
                           bk->name, (long long)q, (long long)bk->bounds[q], bad, (long long)n,
                           (long long)bk->length, (long long)qa);
            return;
        }
    }
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (!mf_layout_bucket_placement_ok(&s->mesh, bk, &bk->place[r])) {
            mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                           "bucket '%s': its %s placement splits into %lld shards, more than the %lld of its finest "
                           "Whole role; no role of a whole bucket splits finer",
                           bk->name, mf_role_name((mf_role)r), (long long)mf_layout_shards(&s->mesh, &bk->place[r]),
                           (long long)(n - 1));
            return;
        }
}

void mf_struct_bucket_whole(const mf_schedule *s, int b, mf_struct_sink *k)
{
    const mf_bucket *bk = &s->buckets[b];
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        if (!bk->whole[r])
            continue;
        const char *role = mf_role_name((mf_role)r);
        const mf_placement *pl = &bk->place[r];
        if (r == MF_ROLE_WEIGHT) {
            mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                           "bucket '%s': weight may not be Whole (only grad and main_weight may be)", bk->name);
            return;
        }
        bool flat = false;
        for (int j = 0; j < s->mesh.naxes; j++)
            flat = flat || pl->p[j] == MF_PLACE_FLAT;
        if (!flat) {
            mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                           "bucket '%s': its %s placement is Whole but splits no axis (Whole stands where Flat would)",
                           bk->name, role);
            return;
        }
        int64_t shards = mf_layout_shards(&s->mesh, pl);
        for (int t = 0; t < bk->ntensors; t++) {
            const mf_tensor *te = &bk->tensors[t];
            if (mf_layout_tensor_shard(&s->mesh, bk, pl, te->offset, te->numel) < 0) {
                mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                               "bucket '%s': tensor '%s' (offset %lld, numel %lld) straddles a shard of the Whole %s "
                               "placement (%lld shards, at most %lld elements); a Whole role keeps every tensor "
                               "inside one shard",
                               bk->name, te->name, (long long)te->offset, (long long)te->numel, role,
                               (long long)shards, (long long)mf_layout_bucket_capacity(&s->mesh, bk, pl));
                return;
            }
        }
    }
}

void mf_struct_bucket_distinct(const mf_schedule *s, int b, mf_struct_sink *k)
{
    const mf_bucket *bk = &s->buckets[b];
    for (int j = 0; j < s->mesh.naxes; j++) {
        int nd = 0;
        for (int r = 0; r < MF_ROLE_COUNT; r++)
            nd += bk->place[r].p[j] == MF_PLACE_DISTINCT;
        if (nd != 0 && nd != MF_ROLE_COUNT) {
            mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                           "bucket '%s': axis '%s' is Distinct in %d of its 3 roles; a Distinct axis holds a "
                           "different tensor on each coordinate, so weight, grad and main_weight are all Distinct "
                           "on it or none is",
                           bk->name, s->mesh.axes[j].name, nd);
            return;
        }
    }
}

void mf_struct_buffer(const mf_schedule *s, int i, mf_struct_sink *k)
{
    const mf_buffer *bf = &s->buffers[i];
    const mf_bucket *bk = &s->buckets[bf->bucket];
    int64_t shards = mf_layout_shards(&s->mesh, &bf->place);
    if (bk->bounds && !mf_layout_bucket_placement_ok(&s->mesh, bk, &bf->place))
        mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_NONE,
                       "buffer '%s': its placement splits into %lld shards, more than the %lld of its whole bucket "
                       "'%s' (no role of a whole bucket splits finer than its finest Whole role)",
                       bf->name, (long long)shards, (long long)(mf_layout_bucket_nbounds(&s->mesh, bk) - 1), bk->name);
    else if (bk->bounds && bf->count != mf_layout_bucket_capacity(&s->mesh, bk, &bf->place))
        mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_COUNT,
                       "buffer '%s': count %lld is not %lld, the longest shard of its placement in the ragged bucket "
                       "'%s'",
                       bf->name, (long long)bf->count, (long long)mf_layout_bucket_capacity(&s->mesh, bk, &bf->place),
                       bk->name);
    else if (!bk->bounds && (bk->length % shards != 0 || bf->count != bk->length / shards))
        mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_COUNT,
                       "buffer '%s': count %lld does not match its bucket's length %lld over the %lld shards of its placement",
                       bf->name, (long long)bf->count, (long long)bk->length, (long long)shards);
    else if (bf->count > INT64_MAX / (int64_t)mf_dtype_size(bf->dtype))
        mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_COUNT, "buffer '%s': %lld elements overflow %d bits in bytes",
                       bf->name, (long long)bf->count, MF_LIMIT_INT_BITS);
}

/* One buffer against the placement and dtype its kind demands. */
static bool mf_struct_kind_rules(const mf_schedule *s, int i, mf_struct_sink *k)
{
    const mf_buffer *bf = &s->buffers[i];
    const mf_bucket *bk = &s->buckets[bf->bucket];
    mf_placement want;
    if (!mf_struct_kind_placement(s, bk, bf->kind, &want))
        return true;
    mf_dtype want_dt = bk->dtype[mf_bufkind_role(bf->kind)];
    char a[64], b[64];
    if (!mf_placement_equal(&want, &bf->place, s->mesh.naxes))
        return mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_NONE, "buffer '%s' (%s) has placement %s, expected %s",
                              bf->name, mf_bufkind_name(bf->kind),
                              mf_placement_format(&bf->place, s->mesh.naxes, a, sizeof a),
                              mf_placement_format(&want, s->mesh.naxes, b, sizeof b));
    if (bf->dtype != want_dt)
        return mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_NONE, "buffer '%s' (%s) has dtype %s, expected %s",
                              bf->name, mf_bufkind_name(bf->kind), mf_dtype_name(bf->dtype), mf_dtype_name(want_dt));
    return true;
}

/* Bucket b has a buffer of the optional kind exactly when it is needed
 * (counts per kind in c); `because` says why it is, `unless` why not. */
static bool mf_struct_bucket_optional(const mf_schedule *s, int b, mf_bufkind kind, bool needed, const int *c,
                                      const char *because, const char *unless, mf_struct_sink *k)
{
    const char *name = s->buckets[b].name, *kn = mf_bufkind_name(kind);
    if (needed && !c[kind])
        return mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_BUFFERS, "bucket '%s' has no %s buffer (%s)", name, kn,
                              because);
    if (!needed && c[kind])
        return mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_BUFFERS, "bucket '%s' has a %s buffer, but %s", name, kn,
                              unless);
    return true;
}

/* The buffer kinds one bucket has (counts per kind) against the rules. */
static bool mf_struct_bucket_set(const mf_schedule *s, int b, const int *c, mf_struct_sink *k)
{
    static const mf_bufkind required[] = {MF_BUF_MAIN_WEIGHT, MF_BUF_WEIGHT, MF_BUF_GRAD_LOCAL, MF_BUF_GRAD};
    const mf_bucket *bk = &s->buckets[b];
    mf_placement rep = mf_placement_uniform(MF_PLACE_REPLICATE, &bk->place[MF_ROLE_WEIGHT], s->mesh.naxes);
    for (size_t r = 0; r < sizeof required / sizeof required[0]; r++)
        if (!c[required[r]] && !mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_BUFFERS, "bucket '%s' has no %s buffer",
                                               bk->name, mf_bufkind_name(required[r])))
            return false;
    bool need_full = !mf_placement_equal(&bk->place[MF_ROLE_WEIGHT], &rep, s->mesh.naxes);
    bool need_final = !mf_placement_equal(&bk->place[MF_ROLE_GRAD], &bk->place[MF_ROLE_MAIN_WEIGHT], s->mesh.naxes);
    return mf_struct_bucket_optional(s, b, MF_BUF_WEIGHT_FULL, need_full, c, "its weight is not replicated",
                                     "its weight is replicated", k) &&
           mf_struct_bucket_optional(s, b, MF_BUF_GRAD_FINAL, need_final, c,
                                     "grad and main_weight placements differ",
                                     "grad and main_weight placements are equal", k);
}

void mf_struct_bucket_buffers(const mf_schedule *s, mf_struct_sink *k)
{
    int *count = calloc((size_t)(s->nbuckets ? s->nbuckets : 1) * MF_BUFKIND_COUNT, sizeof *count);
    if (!count) {
        mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE, "out of memory");
        k->stop = true;
        return;
    }
    for (int i = 0; i < s->nbuffers && !k->stop; i++) {
        const mf_buffer *bf = &s->buffers[i];
        if (++count[bf->bucket * MF_BUFKIND_COUNT + bf->kind] > 1 && bf->kind != MF_BUF_WEIGHT_STAGE &&
            bf->kind != MF_BUF_GRAD_STAGE) {
            mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_NONE, "bucket '%s' has a second %s buffer '%s'",
                           s->buckets[bf->bucket].name, mf_bufkind_name(bf->kind), bf->name);
            continue;
        }
        mf_struct_kind_rules(s, i, k);
    }
    for (int b = 0; b < s->nbuckets && !k->stop; b++)
        mf_struct_bucket_set(s, b, &count[b * MF_BUFKIND_COUNT], k);
    free(count);
}

/* Counts against the buffers (mf_struct_op_extents). */
static bool mf_struct_op_counts(const mf_schedule *s, const mf_op *op, mf_struct_sink *k)
{
    const mf_buffer *src = &s->buffers[op->src], *dst = &s->buffers[op->dst];
    const char *kind = mf_opkind_name(op->kind);
    int64_t want_src, want_dst;
    if (!mf_struct_op_extents(s, op, &want_src, &want_dst))
        return mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_COUNT, "op %d: count %lld times the axis size overflows",
                              op->id, (long long)op->count);
    if (mf_struct_op_ragged(s, op) && op->count != mf_struct_op_count_of(s, op))
        return mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_COUNT,
                              "op %d (%s): count %lld is not %lld, the longest shard of the side it shards in the "
                              "ragged bucket '%s'",
                              op->id, kind, (long long)op->count, (long long)mf_struct_op_count_of(s, op),
                              s->buckets[op->bucket].name);
    if (src->count != want_src)
        return mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_COUNT,
                              "op %d (%s): count %lld needs a source of %lld elements, but '%s' holds %lld", op->id,
                              kind, (long long)op->count, (long long)want_src, src->name, (long long)src->count);
    if (dst->count != want_dst)
        return mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_COUNT,
                              "op %d (%s): count %lld needs a destination of %lld elements, but '%s' holds %lld",
                              op->id, kind, (long long)op->count, (long long)want_dst, dst->name,
                              (long long)dst->count);
    return true;
}

/* An op on a mesh axis where its bucket is Distinct (it would mix the
 * coordinates' different tensors). */
static bool mf_struct_on_distinct(const mf_schedule *s, const mf_op *op)
{
    return mf_opkind_on_axis(op->kind) && op->axis >= 0 && op->axis < s->mesh.naxes &&
           s->buckets[op->bucket].place[MF_ROLE_WEIGHT].p[op->axis] == MF_PLACE_DISTINCT;
}

void mf_struct_data_op(const mf_schedule *s, int i, mf_struct_sink *k)
{
    const mf_op *op = &s->ops[i];
    const mf_buffer *src = &s->buffers[op->src], *dst = &s->buffers[op->dst];
    if (src->bucket != op->bucket)
        mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_SRC,
                       "op %d: source buffer '%s' belongs to bucket '%s', not to the op's bucket '%s'", i, src->name,
                       s->buckets[src->bucket].name, s->buckets[op->bucket].name);
    else if (dst->bucket != op->bucket)
        mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_DST,
                       "op %d: destination buffer '%s' belongs to bucket '%s', not to the op's bucket '%s'", i,
                       dst->name, s->buckets[dst->bucket].name, s->buckets[op->bucket].name);
    else if (mf_struct_on_distinct(s, op))
        mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_NONE,
                       "op %d: %s on axis '%s', which is Distinct in bucket '%s': each coordinate of a Distinct axis "
                       "holds a different tensor, so no op may run on it (docs/semantics.md §4.7)",
                       i, mf_opkind_name(op->kind), s->mesh.axes[op->axis].name, s->buckets[op->bucket].name);
    else if (op->src == op->dst && op->kind != MF_OP_ALL_REDUCE)
        mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_DST, "op %d: a %s op cannot work in place (src and dst are both '%s')",
                       i, mf_opkind_name(op->kind), src->name);
    else if (dst->dtype != op->dtype)
        mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_DTYPE, "op %d: dtype %s differs from the destination '%s' (%s)", i,
                       mf_dtype_name(op->dtype), dst->name, mf_dtype_name(dst->dtype));
    else if (op->kind != MF_OP_CAST && src->dtype != op->dtype)
        mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_DTYPE, "op %d: dtype %s differs from the source '%s' (%s)", i,
                       mf_dtype_name(op->dtype), src->name, mf_dtype_name(src->dtype));
    else
        mf_struct_op_counts(s, op, k);
}

void mf_struct_events(const mf_schedule *s, mf_struct_sink *k)
{
    int *first = malloc((size_t)(s->nevents ? s->nevents : 1) * sizeof *first);
    if (!first) {
        mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE, "out of memory");
        k->stop = true;
        return;
    }
    for (int e = 0; e < s->nevents; e++)
        first[e] = -1;
    for (int i = 0; i < s->nops && !k->stop; i++) {
        const mf_op *op = &s->ops[i];
        if (op->kind != MF_OP_RECORD)
            continue;
        int f = first[op->event];
        if (f < 0)
            first[op->event] = i;
        else if (s->ops[f].stream != op->stream)
            mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_NONE,
                           "op %d records event %d on the %s stream, but op %d records it on the %s stream (an event belongs to one stream)",
                           i, op->event, mf_stream_name(op->stream), f, mf_stream_name(s->ops[f].stream));
    }
    free(first);
}

/* ---- field ranges of a schedule built in memory ---- */

static bool mf_struct_header(const mf_schedule *s, mf_struct_sink *k)
{
    const mf_mesh *m = &s->mesh;
    if (m->naxes < 1 || m->naxes > MF_MAX_AXES)
        return mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE, "the mesh has %d axes, expected 1 to %d",
                              m->naxes, MF_MAX_AXES);
    int64_t world = 1;
    for (int j = 0; j < m->naxes; j++) {
        if (m->axes[j].size < 1 || world > INT64_MAX / m->axes[j].size)
            return mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE, "mesh axis '%s' has an invalid size %lld",
                                  m->axes[j].name ? m->axes[j].name : "?", (long long)m->axes[j].size);
        world *= m->axes[j].size;
    }
    if (world != m->world)
        return mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE,
                              "the mesh world size %lld is not the product of its axes (%lld)", (long long)m->world,
                              (long long)world);
    if (s->microbatches < 1)
        return mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE, "microbatches must be at least 1, got %lld",
                              (long long)s->microbatches);
    return true;
}

/* Bucket fields the other checks index by or divide with. */
static bool mf_struct_bucket_ranges(const mf_schedule *s, int b, mf_struct_sink *k)
{
    const mf_bucket *bk = &s->buckets[b];
    if (bk->unit < 0 || bk->unit >= s->nunits || bk->last_unit < bk->unit || bk->last_unit >= s->nunits)
        return mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE, "bucket '%s' has an invalid unit range %d..%d",
                              bk->name, bk->unit, bk->last_unit);
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if ((int)bk->dtype[r] < 0 || bk->dtype[r] >= MF_DTYPE_COUNT)
            return mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE, "bucket '%s' has an invalid %s dtype",
                                  bk->name, mf_role_name((mf_role)r));
    if (bk->length <= 0)
        return mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE, "bucket '%s' has length %lld", bk->name,
                              (long long)bk->length);
    int before = k->findings;
    for (int r = 0; r < MF_ROLE_COUNT && k->findings == before; r++)
        mf_struct_bucket_role(s, b, r, k);
    if (k->findings != before)
        return false;
    for (int t = 0; t < bk->ntensors; t++) {
        const mf_tensor *te = &bk->tensors[t];
        if (te->offset < 0 || te->numel < 0 || te->offset > bk->length - te->numel)
            return mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE, "bucket '%s': tensor '%s' lies outside it",
                                  bk->name, te->name);
    }
    mf_struct_bucket_whole(s, b, k);
    mf_struct_bucket_distinct(s, b, k);
    return k->findings == before;
}

static bool mf_struct_buffer_ranges(const mf_schedule *s, int i, mf_struct_sink *k)
{
    const mf_buffer *bf = &s->buffers[i];
    if (bf->bucket < 0 || bf->bucket >= s->nbuckets || (int)bf->kind < 0 || bf->kind >= MF_BUFKIND_COUNT ||
        (int)bf->dtype < 0 || bf->dtype >= MF_DTYPE_COUNT || (int)bf->lifetime < 0 ||
        bf->lifetime >= MF_LIFETIME_COUNT)
        return mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_NONE,
                              "buffer '%s' has an invalid bucket, kind, dtype or lifetime", bf->name);
    return true;
}

static bool mf_struct_op_ranges(const mf_schedule *s, int i, mf_struct_sink *k)
{
    const mf_op *op = &s->ops[i];
    bool step = mf_phase_is_step(op->phase);
    if (op->id != i)
        return mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_NONE, "op at index %d has id %d (ids are indices)", i, op->id);
    if ((int)op->kind < 0 || op->kind >= MF_OPKIND_COUNT || (int)op->phase < 0 || op->phase >= MF_PHASE_COUNT ||
        (int)op->when < 0 || op->when >= MF_WHEN_COUNT || (int)op->stream < 0 || op->stream >= MF_STREAM_COUNT ||
        (step ? op->unit != -1 : (op->unit < 0 || op->unit >= s->nunits)))
        return mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_NONE,
                              "op %d has an invalid phase, unit, kind, stream or predicate", i);
    /* The programs the runtime builds its hook lists from (mf_schedule.h). */
    if (op->when == MF_WHEN_SHORT ? op->phase != MF_PHASE_STEP_END
                                  : mf_phase_is_eval(op->phase) && op->when != MF_WHEN_EVERY)
        return mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_NONE,
                              "op %d has predicate %s at %s: predicate short belongs to step_end (a short step's "
                              "end), and the evaluation hooks' ops run on every pass (predicate every)",
                              i, mf_when_name(op->when), mf_phase_name(op->phase));
    if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT) {
        if (op->event < 0 || op->event >= s->nevents)
            return mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_NONE,
                                  "op %d: event %d does not exist (the schedule has %d events)", i, op->event,
                                  s->nevents);
        return true;
    }
    bool on_axis = mf_opkind_on_axis(op->kind);
    if (op->bucket < 0 || op->bucket >= s->nbuckets || op->src < 0 || op->src >= s->nbuffers || op->dst < 0 ||
        op->dst >= s->nbuffers || (on_axis && (op->axis < 0 || op->axis >= s->mesh.naxes)) ||
        (!on_axis && op->axis != -1) || (int)op->dtype < 0 || op->dtype >= MF_DTYPE_COUNT || op->count < 1)
        return mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_NONE,
                              "op %d (%s) has an invalid bucket, buffer, axis, dtype or count", i,
                              mf_opkind_name(op->kind));
    return true;
}

/* ---- the compiler's conventions (MF_STRUCT_STRICT) ---- */

static void mf_struct_strict_header(const mf_schedule *s, mf_struct_sink *k)
{
    if (s->prefetch < 1)
        mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE, "prefetch must be at least 1, got %d", s->prefetch);
    if (s->align < 1 || (s->align & (s->align - 1)))
        mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE, "align must be a power of two, got %lld",
                       (long long)s->align);
}

/* Suffix rule and aligned shards of the bucket's placements; tensors in
 * order, inside the used part, on 16 bytes. */
static void mf_struct_strict_bucket(const mf_schedule *s, int b, mf_struct_sink *k)
{
    const mf_bucket *bk = &s->buckets[b];
    int naxes = s->mesh.naxes;
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        const mf_placement *pl = &bk->place[r];
        char pb[64];
        if (!mf_layout_flat_suffix_ok(pl, naxes)) {
            mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE, "bucket '%s': the %s placement %s breaks the suffix rule",
                           bk->name, mf_role_name((mf_role)r), mf_placement_format(pl, naxes, pb, sizeof pb));
            continue;
        }
        int64_t shards = mf_layout_shards(&s->mesh, pl);
        if (bk->bounds)
            continue; /* ragged: the loader checked every bound against the shard quantum */
        for (int r2 = 0; r2 < MF_ROLE_COUNT; r2++) {
            int64_t bytes = bk->length / shards * (int64_t)mf_dtype_size(bk->dtype[r2]);
            if (s->align > 0 && bytes % s->align != 0)
                mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                               "bucket '%s': a shard of its %s placement is %lld bytes in %s, not a multiple of align %lld",
                               bk->name, mf_role_name((mf_role)r), (long long)bytes, mf_dtype_name(bk->dtype[r2]),
                               (long long)s->align);
        }
    }
    int64_t end = 0;
    for (int t = 0; t < bk->ntensors; t++) {
        const mf_tensor *te = &bk->tensors[t];
        if (te->offset < end || te->offset > bk->used - te->numel)
            mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                           "bucket '%s': tensor '%s' (offset %lld, numel %lld) overlaps another or leaves the bucket",
                           bk->name, te->name, (long long)te->offset, (long long)te->numel);
        for (int r = 0; r < MF_ROLE_COUNT; r++)
            if (te->offset * (int64_t)mf_dtype_size(bk->dtype[r]) % 16 != 0)
                mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE,
                               "bucket '%s': tensor '%s' at offset %lld does not start on 16 bytes in %s", bk->name,
                               te->name, (long long)te->offset, mf_dtype_name(bk->dtype[r]));
        end = te->offset + te->numel;
    }
    if (bk->used > bk->length)
        mf_struct_fail(k, MF_AT_BUCKET, b, MF_FIELD_NONE, "bucket '%s': used %lld exceeds the length %lld", bk->name,
                       (long long)bk->used, (long long)bk->length);
}

/* Suffix rule; the buffers that live across the step boundary persist. */
static void mf_struct_strict_buffer(const mf_schedule *s, int i, mf_struct_sink *k)
{
    const mf_buffer *bf = &s->buffers[i];
    const mf_bucket *bk = &s->buckets[bf->bucket];
    char pb[64];
    if (!mf_layout_flat_suffix_ok(&bf->place, s->mesh.naxes))
        mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_NONE, "buffer '%s': placement %s breaks the suffix rule",
                       bf->name, mf_placement_format(&bf->place, s->mesh.naxes, pb, sizeof pb));
    bool across = bf->kind == MF_BUF_MAIN_WEIGHT || bf->kind == MF_BUF_GRAD_FINAL ||
                  (bf->kind == MF_BUF_GRAD &&
                   mf_placement_equal(&bk->place[MF_ROLE_GRAD], &bk->place[MF_ROLE_MAIN_WEIGHT], s->mesh.naxes));
    if (across && bf->lifetime != MF_LIFETIME_PERSISTENT)
        mf_struct_fail(k, MF_AT_BUFFER, i, MF_FIELD_NONE,
                       "buffer '%s' (%s) must be persistent: it lives across the step boundary", bf->name,
                       mf_bufkind_name(bf->kind));
}

const char *mf_struct_opdesc(const mf_schedule *s, const mf_op *op, char *buf, size_t size)
{
    const char *kind = mf_opkind_name(op->kind);
    if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
        snprintf(buf, size, "op %d (%s of event %d on %s, %s%s%s)", op->id, kind, op->event,
                 mf_stream_name(op->stream), mf_phase_name(op->phase), op->unit >= 0 ? " of " : "",
                 op->unit >= 0 ? s->units[op->unit].name : "");
    else if (op->axis >= 0)
        snprintf(buf, size, "op %d (%s on %s, %s)", op->id, kind, s->mesh.axes[op->axis].name,
                 s->buckets[op->bucket].name);
    else
        snprintf(buf, size, "op %d (%s, %s)", op->id, kind, s->buckets[op->bucket].name);
    return buf;
}

/* Rank r of a ragged op (docs/semantics.md §4.6): its ranges by the bounds.
 * A gather's destination is its group's source ranges one after another (in
 * coord order); a reduce_scatter's or a slice's destination ranges, one
 * after another over the group, are the source range they share; an
 * all_reduce and the local ops keep the range. group: the axis group's
 * ranks (collectives and slice). */
static bool mf_struct_rank_ragged(const mf_schedule *s, const mf_op *op, int64_t r, const int64_t *group)
{
    const mf_mesh *m = &s->mesh;
    const mf_bucket *bk = &s->buckets[op->bucket];
    const mf_placement *sp = &s->buffers[op->src].place, *dp = &s->buffers[op->dst].place;
    mf_range sr = mf_layout_bucket_range(m, bk, sp, r), dr = mf_layout_bucket_range(m, bk, dp, r);
    if (op->axis < 0 || op->kind == MF_OP_ALL_REDUCE)
        return dr.offset == sr.offset && dr.len == sr.len;
    int64_t n = m->axes[op->axis].size, at = op->kind == MF_OP_ALL_GATHER ? dr.offset : sr.offset;
    for (int64_t i = 0; i < n; i++) {
        mf_range g = op->kind == MF_OP_ALL_GATHER ? mf_layout_bucket_range(m, bk, sp, group[i])
                                                  : mf_layout_bucket_range(m, bk, dp, group[i]);
        if (g.offset != at)
            return false;
        at += g.len;
    }
    return op->kind == MF_OP_ALL_GATHER ? at == dr.offset + dr.len : at == sr.offset + sr.len;
}

/* On every rank, do the elements moved match the shards the layout assigns?
 * Ops with equal (kind, axis, placements, length, count) give equal answers:
 * each signature is checked once (memo); a ragged bucket's ops by their
 * bucket too. */
static void mf_struct_ranks(const mf_schedule *s, const mf_op *op, mf_hash *memo, mf_struct_sink *k)
{
    const mf_mesh *m = &s->mesh;
    if (m->world > MF_STRUCT_MAX_RANKS)
        return;
    const mf_buffer *src = &s->buffers[op->src], *dst = &s->buffers[op->dst];
    bool ragged = mf_struct_op_ragged(s, op);
    int64_t L = s->buckets[op->bucket].length;
    /* memo key: the bucket itself when ragged (its bounds decide) */
    int64_t sig[4 + 2 * MF_MAX_AXES] = {op->kind, op->axis, ragged ? -1 - op->bucket : L, op->count};
    for (int j = 0; j < MF_MAX_AXES; j++) {
        sig[4 + j] = src->place.p[j];
        sig[4 + MF_MAX_AXES + j] = dst->place.p[j];
    }
    if (mf_hash_put(memo, sig, sizeof sig, 0) == 0)
        return; /* checked before (out of memory: check again) */
    int64_t *group = op->axis >= 0 ? malloc((size_t)m->axes[op->axis].size * sizeof *group) : NULL;
    char ob[160];
    if (op->axis >= 0 && !group) {
        mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE, "out of memory while verifying");
        return;
    }
    for (int64_t r = 0; r < m->world; r++) {
        mf_range sr = mf_layout_range(m, &src->place, r, L), dr = mf_layout_range(m, &dst->place, r, L);
        int64_t coords[MF_MAX_AXES];
        mf_layout_mesh_coords(m, r, coords);
        bool ok = true;
        if (op->axis >= 0)
            mf_layout_axis_group(m, op->axis, r, group);
        if (ragged) {
            ok = mf_struct_rank_ragged(s, op, r, group);
        } else if (mf_opkind_is_collective(op->kind)) {
            int64_t n = m->axes[op->axis].size;
            for (int64_t i = 0; i < n && ok; i++) {
                mf_range gr = mf_layout_range(m, &src->place, group[i], L);
                if (op->kind == MF_OP_ALL_GATHER)
                    ok = gr.offset == dr.offset + i * op->count && gr.len == op->count;
                else
                    ok = gr.offset == sr.offset && gr.len == sr.len;
            }
            if (ok && op->kind == MF_OP_REDUCE_SCATTER)
                ok = dr.offset == sr.offset + coords[op->axis] * op->count && dr.len == op->count;
            if (ok && op->kind == MF_OP_ALL_REDUCE)
                ok = dr.offset == sr.offset && dr.len == sr.len;
        } else if (op->kind == MF_OP_SLICE) {
            ok = dr.offset == sr.offset + coords[op->axis] * op->count && dr.len == op->count;
        } else {
            ok = dr.offset == sr.offset && dr.len == sr.len;
        }
        if (!ok) {
            mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE,
                           "%s: on rank %lld the elements it moves are not the shard the layout assigns to '%s'",
                           mf_struct_opdesc(s, op, ob, sizeof ob), (long long)r, dst->name);
            break;
        }
    }
    free(group);
}

/* A data op's transition, phase and stream; when its operands and counts
 * passed mf_struct_data_op (`fits`), its placements. */
static void mf_struct_strict_data_op(const mf_schedule *s, const mf_op *op, bool fits, mf_hash *memo,
                                     mf_struct_sink *k)
{
    int naxes = s->mesh.naxes;
    char ob[160], pa[64], pb[64], pc[64];
    const char *od = mf_struct_opdesc(s, op, ob, sizeof ob);
    const mf_buffer *src = &s->buffers[op->src], *dst = &s->buffers[op->dst];
    if (op->transition < 1 || op->transition > 4)
        mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE, "%s has transition %d, expected T1..T4", od,
                       op->transition);
    if (op->event != -1)
        mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE, "%s carries an event", od);
    if (mf_phase_is_step(op->phase) && op->when != MF_WHEN_SHORT)
        mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE,
                       "%s: data ops run at unit hooks (or at a short step's end), not at %s", od,
                       mf_phase_name(op->phase));
    mf_opstream rule = mf_opkind_info_of(op->kind)->stream;
    if (rule == MF_OPSTREAM_AXIS) {
        mf_stream want = mf_axis_stream(naxes, op->axis);
        if (op->stream != want)
            mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE,
                           "%s runs on stream %s, but collectives on %s run on %s (one stream per communicator keeps "
                           "their order the same on every rank)",
                           od, mf_stream_name(op->stream), s->mesh.axes[op->axis].name, mf_stream_name(want));
    } else if (rule == MF_OPSTREAM_FED && op->stream == MF_STREAM_COMPUTE) {
        mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE,
                       "%s runs on the compute stream; local ops run on the stream of the collective they feed", od);
    }
    if (!fits)
        return;
    mf_placement moved;
    char why[128];
    if (!mf_struct_op_move(s, op, &src->place, &moved, why, sizeof why)) {
        mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE, "%s reads '%s' at %s: %s", od, src->name,
                       mf_placement_format(&src->place, naxes, pa, sizeof pa), why);
        return;
    }
    if (!mf_placement_equal(&moved, &dst->place, naxes)) {
        mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE, "%s turns %s into %s, but its destination '%s' is %s", od,
                       mf_placement_format(&src->place, naxes, pa, sizeof pa),
                       mf_placement_format(&moved, naxes, pb, sizeof pb), dst->name,
                       mf_placement_format(&dst->place, naxes, pc, sizeof pc));
        return;
    }
    mf_struct_ranks(s, op, memo, k);
}

/* A record or wait: once per step at step hooks (or at a short step's end),
 * no data fields. */
static void mf_struct_strict_op(const mf_schedule *s, const mf_op *op, mf_struct_sink *k)
{
    char ob[160];
    if (mf_phase_is_step(op->phase) && op->when != MF_WHEN_EVERY && op->when != MF_WHEN_SHORT)
        mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE,
                       "%s has predicate %s, but %s ops run once per step (predicate every)",
                       mf_struct_opdesc(s, op, ob, sizeof ob), mf_when_name(op->when), mf_phase_name(op->phase));
    if ((op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT) &&
        (op->bucket != -1 || op->src != -1 || op->dst != -1 || op->axis != -1))
        mf_struct_fail(k, MF_AT_OP, op->id, MF_FIELD_NONE, "%s carries data fields",
                       mf_struct_opdesc(s, op, ob, sizeof ob));
}

/* Each event recorded by exactly one op, waited for on another stream. */
static void mf_struct_strict_events(const mf_schedule *s, mf_struct_sink *k)
{
    int *records = calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *records);
    int *rec_stream = calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *rec_stream);
    char ob[160];
    if (!records || !rec_stream) {
        mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE, "out of memory while verifying");
        goto done;
    }
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].kind == MF_OP_RECORD) {
            records[s->ops[i].event]++;
            rec_stream[s->ops[i].event] = s->ops[i].stream;
        }
    for (int e = 0; e < s->nevents; e++)
        if (records[e] != 1)
            mf_struct_fail(k, MF_AT_SCHEDULE, -1, MF_FIELD_NONE, "event %d is recorded by %d ops, expected exactly one",
                           e, records[e]);
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (op->kind == MF_OP_WAIT && records[op->event] == 1 && rec_stream[op->event] == (int)op->stream)
            mf_struct_fail(k, MF_AT_OP, i, MF_FIELD_NONE, "%s waits for an event recorded on its own stream",
                           mf_struct_opdesc(s, op, ob, sizeof ob));
    }
done:
    free(records);
    free(rec_stream);
}

/* ---- everything ---- */

/* Field ranges of every object; the rules below index by them. */
static bool mf_struct_ranges(const mf_schedule *s, mf_struct_sink *k)
{
    int before = k->findings;
    if (!mf_struct_header(s, k))
        return false;
    for (int b = 0; b < s->nbuckets && !k->stop; b++)
        mf_struct_bucket_ranges(s, b, k);
    for (int i = 0; i < s->nbuffers && !k->stop; i++)
        mf_struct_buffer_ranges(s, i, k);
    for (int i = 0; i < s->nops && !k->stop; i++)
        mf_struct_op_ranges(s, i, k);
    return k->findings == before;
}

int mf_struct_check(const mf_schedule *s, unsigned flags, mf_struct_sink *k)
{
    int before = k->findings;
    bool strict = flags & MF_STRUCT_STRICT;
    if (!mf_struct_ranges(s, k))
        return k->findings - before;
    if (strict)
        mf_struct_strict_header(s, k);
    for (int b = 0; strict && b < s->nbuckets && !k->stop; b++)
        mf_struct_strict_bucket(s, b, k);
    for (int i = 0; i < s->nbuffers && !k->stop; i++) {
        mf_struct_buffer(s, i, k);
        if (strict)
            mf_struct_strict_buffer(s, i, k);
    }
    if (!k->stop)
        mf_struct_bucket_buffers(s, k);
    mf_hash memo = MF_HASH_EMPTY;
    for (int i = 0; i < s->nops && !k->stop; i++) {
        const mf_op *op = &s->ops[i];
        bool data = mf_op_is_data(op);
        int seen = k->findings;
        if (data)
            mf_struct_data_op(s, i, k);
        if (strict && data)
            mf_struct_strict_data_op(s, op, k->findings == seen, &memo, k);
        if (strict)
            mf_struct_strict_op(s, op, k);
    }
    mf_hash_free(&memo);
    if (!k->stop)
        mf_struct_events(s, k);
    if (strict && !k->stop)
        mf_struct_strict_events(s, k);
    return k->findings - before;
}

typedef struct mf_struct_first {
    const char *source;
    char *err;
    size_t errlen;
} mf_struct_first;

static bool mf_struct_keep_first(void *ctx, const mf_struct_finding *f)
{
    mf_struct_first *c = ctx;
    if (c->err && c->errlen)
        snprintf(c->err, c->errlen, "%s: %s", c->source ? c->source : "<schedule>", f->msg);
    return false;
}

bool mf_struct_check_first(const mf_schedule *s, char *err, size_t errlen)
{
    mf_struct_first c = {s->source, err, errlen};
    mf_struct_sink k = {mf_struct_keep_first, &c, 0, false};
    return mf_struct_check(s, 0, &k) == 0;
}
