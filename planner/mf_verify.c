/*
 * mf_verify: checks a schedule, compiled or loaded (docs/schedule.md §5). Reads the
 * schedule only; every finding is an error naming the op (id, kind, axis,
 * bucket), the buffer and, for the simulation, the microbatch position.
 *
 * 1. Structure. Header values; bucket layout (equal shards starting on `align`
 *    bytes, tensors 16-byte aligned and inside the bucket); the normative
 *    buffer rules of mf_schedule.h; every op's fields: a collective runs on the
 *    stream of its axis (inner for the innermost, outer otherwise), local ops
 *    on a communication stream, step_begin/step_end ops once per step; counts
 *    and dtypes fit the buffers; placements fit the op (an all-gather turns
 *    Flat into Replicate on the outermost Flat axis, a reduce-scatter Partial
 *    into Flat just outside the Flat suffix, ...), and, on every rank, the
 *    elements each rank sends are the ones the receiver's shard expects
 *    (mf_layout_range); each event is recorded by exactly one op and waited
 *    for on another stream. Errors here stop the check.
 *
 * 2. Simulation. The schedule is replayed hook by hook, two steps in a row (so
 *    hazards across the step boundary show), for every microbatch position
 *    that exists: M = 1 (first = last), M = 2 (first, last), M >= 3 (first,
 *    one middle standing for all middles, last). The trainer is part of the
 *    replay on the compute stream: its forward of unit v reads each covering
 *    bucket's unsharded weight between forward_pre(v) and forward_post(v), its
 *    backward reads it and writes grad_local between backward_pre(v) and
 *    backward_post(v), and the optimizer, after step_end, reads the delivered
 *    gradient and writes main_weight.
 *
 *    Values (abstract interpretation per buffer): a buffer holds nothing, a
 *    weight (the main_weight of step k, at some placement and dtype), or a
 *    gradient (at some placement, where Partial on an axis means "not yet
 *    reduced over that axis", summed over a set of microbatches). Each op
 *    checks its input and computes its output; the output must match the
 *    destination's declared placement. Postconditions: every unsharded weight
 *    the trainer reads is the current step's main_weight at Rep in weight's
 *    dtype; the delivered gradient is reduced over every axis, summed over
 *    every microbatch, at main_weight's placement. A microbatch buffer may not
 *    be read in a later microbatch than it was written, and a weight_full whose
 *    unit reshards after forward may not be read in backward unless gathered
 *    again.
 *
 *    Ordering: vector clocks per stream (compute, inner, outer); a record
 *    snapshots its stream's clock into the event, a wait merges the latest
 *    snapshot. Every read-after-write, write-after-read and write-after-write
 *    on a buffer from different streams must be ordered by these edges.
 *
 * The collective order per communicator (axis) is the same on every rank
 * because every rank runs the same op list with the same predicates and every
 * collective of an axis runs on that axis's one stream; part 1 checks the
 * latter.
 *
 * Cost: linear in buckets + buffers + ops, plus the trainer's accesses (one per
 * unit a bucket covers), plus the per-rank checks (world x axis size, once per
 * distinct op signature). Findings and signatures already seen are kept in
 * hash sets; the buckets the trainer touches at unit v are swept, not searched.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_passes.h"

#define MF_VERIFY_MAX_RANKS 1024   /* per-rank range checks up to this world size */

/* ---- structure ---- */

typedef struct mf_verify_ctx {
    const mf_schedule *s;
    mf_diag *d;
    int errors;
    mf_placement rep, partial;
    int *delivered;         /* per bucket: the buffer holding the delivered gradient */
    int *full;              /* per bucket: the buffer the trainer computes with */
    int *local;             /* per bucket: grad_local */
    int *mainw;             /* per bucket: main_weight */
    /* error de-duplication: (op or actor, buffer, kind) keys already reported,
     * an open-addressing set; capseen is 0 or a power of two */
    struct mf_verify_key *seen;
    size_t nseen, capseen;
    struct mf_rank_sig *sigs; /* per-rank checks already done: the same kind of set */
    size_t nsigs, capsigs;
} mf_verify_ctx;

__attribute__((format(printf, 2, 3))) static void mf_verify_err(mf_verify_ctx *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mf_span none = {0, 0, 0, 0};
    mf_diag_error(c->d, none, "%s", msg);
    c->errors++;
}

typedef struct mf_verify_key {
    int actor, buffer, what;
    bool used;              /* slot taken */
} mf_verify_key;

/* FNV-1a over n bytes; seeds the open-addressing sets below. */
static uint64_t mf_verify_hash(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211u;
    return h ^ (h >> 29);
}

static uint64_t mf_verify_key_hash(const mf_verify_key *k)
{
    int v[3] = {k->actor, k->buffer, k->what};
    return mf_verify_hash(v, sizeof v);
}

/* True the first time (actor, buffer, what) is seen: each finding is
 * reported once, not once per microbatch and step. Out of memory, it answers
 * true (a finding may then repeat, none is lost). */
static bool mf_verify_first(mf_verify_ctx *c, int actor, int buffer, int what)
{
    mf_verify_key key = {actor, buffer, what, true};
    if ((c->nseen + 1) * 2 > c->capseen) {
        size_t cap = c->capseen ? c->capseen * 2 : 64;
        mf_verify_key *n = calloc(cap, sizeof *n);
        if (!n)
            return true;
        for (size_t i = 0; i < c->capseen; i++) {
            if (!c->seen[i].used)
                continue;
            size_t j = mf_verify_key_hash(&c->seen[i]) & (cap - 1);
            while (n[j].used)
                j = (j + 1) & (cap - 1);
            n[j] = c->seen[i];
        }
        free(c->seen);
        c->seen = n;
        c->capseen = cap;
    }
    size_t i = mf_verify_key_hash(&key) & (c->capseen - 1);
    for (; c->seen[i].used; i = (i + 1) & (c->capseen - 1))
        if (c->seen[i].actor == actor && c->seen[i].buffer == buffer && c->seen[i].what == what)
            return false;
    c->seen[i] = key;
    c->nseen++;
    return true;
}

static const char *mf_verify_axis(const mf_schedule *s, int j)
{
    return j >= 0 && j < s->mesh.naxes ? s->mesh.axes[j].name : "?";
}

static const char *mf_verify_unit(const mf_schedule *s, int u)
{
    return u >= 0 && u < s->nunits ? s->units[u].name : "?";
}

/* "op 17 (reduce_scatter on dp_inner, layers.3/hfsdp)" */
static const char *mf_verify_opdesc(const mf_schedule *s, const mf_op *op, char *buf, size_t size)
{
    const char *kind = mf_opkind_name(op->kind) ? mf_opkind_name(op->kind) : "?";
    if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
        snprintf(buf, size, "op %d (%s of event %d on %s, %s%s%s)", op->id, kind, op->event,
                 mf_stream_name(op->stream) ? mf_stream_name(op->stream) : "?",
                 mf_phase_name(op->phase) ? mf_phase_name(op->phase) : "?", op->unit >= 0 ? " of " : "",
                 op->unit >= 0 ? mf_verify_unit(s, op->unit) : "");
    else if (op->axis >= 0)
        snprintf(buf, size, "op %d (%s on %s, %s)", op->id, kind, mf_verify_axis(s, op->axis),
                 op->bucket >= 0 && op->bucket < s->nbuckets ? s->buckets[op->bucket].name : "?");
    else
        snprintf(buf, size, "op %d (%s, %s)", op->id, kind,
                 op->bucket >= 0 && op->bucket < s->nbuckets ? s->buckets[op->bucket].name : "?");
    return buf;
}

/* A buffer's name without its bucket prefix ("grad_local"). */
static const char *mf_verify_bufname(const mf_schedule *s, int b)
{
    const mf_buffer *bf = &s->buffers[b];
    const char *bk = s->buckets[bf->bucket].name;
    size_t n = strlen(bk);
    if (strncmp(bf->name, bk, n) == 0 && bf->name[n] == '.')
        return bf->name + n + 1;
    return bf->name;
}

static void mf_verify_header(mf_verify_ctx *c)
{
    const mf_schedule *s = c->s;
    if (s->mesh.naxes < 1 || s->mesh.naxes > MF_MAX_AXES) {
        mf_verify_err(c, "the mesh has %d axes, expected 1 to %d", s->mesh.naxes, MF_MAX_AXES);
        return;
    }
    int64_t world = 1;
    for (int j = 0; j < s->mesh.naxes; j++) {
        if (s->mesh.axes[j].size < 1 || world > INT64_MAX / s->mesh.axes[j].size) {
            mf_verify_err(c, "mesh axis '%s' has an invalid size %lld", mf_verify_axis(s, j),
                          (long long)s->mesh.axes[j].size);
            return;
        }
        world *= s->mesh.axes[j].size;
    }
    if (world != s->mesh.world)
        mf_verify_err(c, "the mesh world size %lld is not the product of its axes (%lld)", (long long)s->mesh.world,
                      (long long)world);
    if (s->microbatches < 1)
        mf_verify_err(c, "microbatches must be at least 1, got %lld", (long long)s->microbatches);
    if (s->prefetch < 1)
        mf_verify_err(c, "prefetch must be at least 1, got %d", s->prefetch);
    if (s->align < 1 || (s->align & (s->align - 1)))
        mf_verify_err(c, "align must be a power of two, got %lld", (long long)s->align);
}

static void mf_verify_buckets(mf_verify_ctx *c)
{
    const mf_schedule *s = c->s;
    int k = s->mesh.naxes;
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        if (bk->unit < 0 || bk->unit >= s->nunits || bk->last_unit < bk->unit || bk->last_unit >= s->nunits) {
            mf_verify_err(c, "bucket '%s' has an invalid unit range %d..%d", bk->name, bk->unit, bk->last_unit);
            continue;
        }
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            const mf_placement *pl = &bk->place[r];
            char pb[64];
            if (!mf_placement_suffix_ok(pl, k)) {
                mf_verify_err(c, "bucket '%s': the %s placement %s breaks the suffix rule", bk->name,
                              mf_role_name((mf_role)r), mf_placement_format(pl, k, pb, sizeof pb));
                continue;
            }
            int64_t shards = mf_placement_shards(&s->mesh, pl);
            if (bk->length <= 0 || bk->length % shards != 0) {
                mf_verify_err(c, "bucket '%s': length %lld does not split into the %lld equal shards of its %s placement",
                              bk->name, (long long)bk->length, (long long)shards, mf_role_name((mf_role)r));
                continue;
            }
            for (int r2 = 0; r2 < MF_ROLE_COUNT; r2++) {
                int64_t bytes = bk->length / shards * (int64_t)mf_dtype_size(bk->dtype[r2]);
                if (s->align > 0 && bytes % s->align != 0)
                    mf_verify_err(c, "bucket '%s': a shard of its %s placement is %lld bytes in %s, not a multiple of align %lld",
                                  bk->name, mf_role_name((mf_role)r), (long long)bytes,
                                  mf_dtype_name(bk->dtype[r2]), (long long)s->align);
            }
        }
        int64_t end = 0;
        for (int t = 0; t < bk->ntensors; t++) {
            const mf_tensor *te = &bk->tensors[t];
            if (te->offset < end || te->numel < 0 || te->offset > bk->used - te->numel)
                mf_verify_err(c, "bucket '%s': tensor '%s' (offset %lld, numel %lld) overlaps another or leaves the bucket",
                              bk->name, te->name, (long long)te->offset, (long long)te->numel);
            for (int r = 0; r < MF_ROLE_COUNT; r++)
                if (te->offset * (int64_t)mf_dtype_size(bk->dtype[r]) % 16 != 0)
                    mf_verify_err(c, "bucket '%s': tensor '%s' at offset %lld does not start on 16 bytes in %s",
                                  bk->name, te->name, (long long)te->offset, mf_dtype_name(bk->dtype[r]));
            end = te->offset + te->numel;
        }
        if (bk->used > bk->length)
            mf_verify_err(c, "bucket '%s': used %lld exceeds its length %lld", bk->name, (long long)bk->used,
                          (long long)bk->length);
    }
}

static void mf_verify_buffers(mf_verify_ctx *c)
{
    const mf_schedule *s = c->s;
    int k = s->mesh.naxes;
    size_t nslots = (size_t)(s->nbuckets ? s->nbuckets : 1) * MF_BUFKIND_COUNT;
    int *count = calloc(nslots, sizeof *count);
    int *last = malloc(nslots * sizeof *last); /* per (bucket, kind): the last buffer */
    if (!count || !last) {
        free(count);
        free(last);
        mf_verify_err(c, "out of memory while verifying");
        return;
    }
    for (int i = 0; i < s->nbuffers; i++) {
        const mf_buffer *bf = &s->buffers[i];
        if (bf->bucket < 0 || bf->bucket >= s->nbuckets || (int)bf->kind < 0 || bf->kind >= MF_BUFKIND_COUNT) {
            mf_verify_err(c, "buffer '%s' has an invalid bucket or kind", bf->name);
            continue;
        }
        const mf_bucket *bk = &s->buckets[bf->bucket];
        count[bf->bucket * MF_BUFKIND_COUNT + bf->kind]++;
        last[bf->bucket * MF_BUFKIND_COUNT + bf->kind] = i;
        char pb[64], wb[64];
        if (!mf_placement_suffix_ok(&bf->place, k)) {
            mf_verify_err(c, "buffer '%s': placement %s breaks the suffix rule", bf->name,
                          mf_placement_format(&bf->place, k, pb, sizeof pb));
            continue;
        }
        int64_t shards = mf_placement_shards(&s->mesh, &bf->place);
        if (bk->length % shards != 0 || bf->count != bk->length / shards)
            mf_verify_err(c, "buffer '%s': count %lld is not its bucket's length %lld over %lld shards", bf->name,
                          (long long)bf->count, (long long)bk->length, (long long)shards);
        const mf_placement *want = NULL;
        mf_dtype want_dt = bk->dtype[mf_bufkind_role(bf->kind)];
        switch (bf->kind) {
        case MF_BUF_MAIN_WEIGHT:
        case MF_BUF_GRAD_FINAL:
            want = &bk->place[MF_ROLE_MAIN_WEIGHT];
            break;
        case MF_BUF_WEIGHT:
            want = &bk->place[MF_ROLE_WEIGHT];
            break;
        case MF_BUF_WEIGHT_FULL:
            want = &c->rep;
            break;
        case MF_BUF_GRAD_LOCAL:
            want = &c->partial;
            break;
        case MF_BUF_GRAD:
            want = &bk->place[MF_ROLE_GRAD];
            break;
        default:
            break;
        }
        if (want && !mf_placement_equal(want, &bf->place, k))
            mf_verify_err(c, "buffer '%s' (%s) has placement %s, expected %s", bf->name, mf_bufkind_name(bf->kind),
                          mf_placement_format(&bf->place, k, pb, sizeof pb), mf_placement_format(want, k, wb, sizeof wb));
        if (want && bf->dtype != want_dt)
            mf_verify_err(c, "buffer '%s' (%s) has dtype %s, expected %s", bf->name, mf_bufkind_name(bf->kind),
                          mf_dtype_name(bf->dtype), mf_dtype_name(want_dt));
        if ((bf->kind == MF_BUF_MAIN_WEIGHT || bf->kind == MF_BUF_GRAD_FINAL ||
             (bf->kind == MF_BUF_GRAD && mf_placement_equal(&bk->place[MF_ROLE_GRAD], &bk->place[MF_ROLE_MAIN_WEIGHT], k))) &&
            bf->lifetime != MF_LIFETIME_PERSISTENT)
            mf_verify_err(c, "buffer '%s' (%s) must be persistent: it lives across the step boundary", bf->name,
                          mf_bufkind_name(bf->kind));
        if (bf->kind == MF_BUF_MAIN_WEIGHT)
            c->mainw[bf->bucket] = i;
        if (bf->kind == MF_BUF_GRAD_LOCAL)
            c->local[bf->bucket] = i;
        if (bf->kind == MF_BUF_WEIGHT_FULL || (bf->kind == MF_BUF_WEIGHT && c->full[bf->bucket] < 0))
            c->full[bf->bucket] = i;
        if (bf->kind == MF_BUF_GRAD_FINAL || (bf->kind == MF_BUF_GRAD && c->delivered[bf->bucket] < 0))
            c->delivered[bf->bucket] = i;
    }
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        const int *n = &count[b * MF_BUFKIND_COUNT];
        static const mf_bufkind one[] = {MF_BUF_MAIN_WEIGHT, MF_BUF_WEIGHT, MF_BUF_GRAD_LOCAL, MF_BUF_GRAD};
        for (size_t i = 0; i < sizeof one / sizeof one[0]; i++)
            if (n[one[i]] != 1)
                mf_verify_err(c, "bucket '%s' has %d %s buffers, expected exactly one", bk->name, n[one[i]],
                              mf_bufkind_name(one[i]));
        bool need_full = !mf_placement_equal(&bk->place[MF_ROLE_WEIGHT], &c->rep, k);
        bool need_final = !mf_placement_equal(&bk->place[MF_ROLE_GRAD], &bk->place[MF_ROLE_MAIN_WEIGHT], k);
        if (n[MF_BUF_WEIGHT_FULL] != (need_full ? 1 : 0))
            mf_verify_err(c, "bucket '%s' has %d weight_full buffers, expected %d (weight is %s)", bk->name,
                          n[MF_BUF_WEIGHT_FULL], need_full ? 1 : 0, need_full ? "sharded" : "replicated");
        if (n[MF_BUF_GRAD_FINAL] != (need_final ? 1 : 0))
            mf_verify_err(c, "bucket '%s' has %d grad_final buffers, expected %d", bk->name, n[MF_BUF_GRAD_FINAL],
                          need_final ? 1 : 0);
        /* the trainer computes with weight_full, not weight */
        if (need_full && n[MF_BUF_WEIGHT_FULL] == 1)
            c->full[b] = last[b * MF_BUFKIND_COUNT + MF_BUF_WEIGHT_FULL];
        if (need_final && n[MF_BUF_GRAD_FINAL] == 1)
            c->delivered[b] = last[b * MF_BUFKIND_COUNT + MF_BUF_GRAD_FINAL];
    }
    free(count);
    free(last);
}

/* The placement an op must turn src into, or false with a reason. */
static bool mf_verify_moves(const mf_schedule *s, const mf_op *op, const mf_placement *src, mf_placement *out,
                            const char **why)
{
    int k = s->mesh.naxes, j = op->axis, fs = mf_placement_flat_start(src, k);
    *out = *src;
    switch (op->kind) {
    case MF_OP_ALL_GATHER:
        if (src->p[j] != MF_PLACE_FLAT || j != fs) {
            *why = "an all-gather needs Flat on its axis, the outermost Flat axis";
            return false;
        }
        out->p[j] = MF_PLACE_REPLICATE;
        return true;
    case MF_OP_REDUCE_SCATTER:
        if (src->p[j] != MF_PLACE_PARTIAL || j != fs - 1) {
            *why = "a reduce-scatter needs Partial on its axis, just outside the Flat axes";
            return false;
        }
        out->p[j] = MF_PLACE_FLAT;
        return true;
    case MF_OP_ALL_REDUCE:
        if (src->p[j] != MF_PLACE_PARTIAL) {
            *why = "an all-reduce needs Partial on its axis";
            return false;
        }
        out->p[j] = MF_PLACE_REPLICATE;
        return true;
    case MF_OP_SLICE:
        if (src->p[j] != MF_PLACE_REPLICATE || j != fs - 1) {
            *why = "a slice needs Replicate on its axis, just outside the Flat axes";
            return false;
        }
        out->p[j] = MF_PLACE_FLAT;
        return true;
    default:
        return true;
    }
}

/* What the per-rank check of an op depends on; equal signatures give equal
 * results, so each is checked once. */
typedef struct mf_rank_sig {
    mf_opkind kind;
    int axis;
    mf_placement src, dst;
    int64_t length, count;
    bool used;              /* slot taken (set members only) */
} mf_rank_sig;

/* True the first time signature sig (zero-filled padding) is seen; out of
 * memory, true (the check then repeats). */
static bool mf_verify_sig_first(mf_verify_ctx *c, const mf_rank_sig *sig)
{
    if ((c->nsigs + 1) * 2 > c->capsigs) {
        size_t cap = c->capsigs ? c->capsigs * 2 : 64;
        mf_rank_sig *n = calloc(cap, sizeof *n);
        if (!n)
            return true;
        for (size_t i = 0; i < c->capsigs; i++) {
            if (!c->sigs[i].used)
                continue;
            size_t j = mf_verify_hash(&c->sigs[i], sizeof c->sigs[i]) & (cap - 1);
            while (n[j].used)
                j = (j + 1) & (cap - 1);
            memcpy(&n[j], &c->sigs[i], sizeof n[j]); /* padding bytes too: they are hashed */
        }
        free(c->sigs);
        c->sigs = n;
        c->capsigs = cap;
    }
    size_t i = mf_verify_hash(sig, sizeof *sig) & (c->capsigs - 1);
    for (; c->sigs[i].used; i = (i + 1) & (c->capsigs - 1))
        if (memcmp(&c->sigs[i], sig, sizeof *sig) == 0)
            return false;
    memcpy(&c->sigs[i], sig, sizeof *sig);
    c->nsigs++;
    return true;
}

/* On every rank, do the elements moved match the shards the layout assigns? */
static void mf_verify_ranks(mf_verify_ctx *c, const mf_op *op)
{
    const mf_schedule *s = c->s;
    const mf_mesh *m = &s->mesh;
    if (m->world > MF_VERIFY_MAX_RANKS)
        return;
    const mf_buffer *src = &s->buffers[op->src], *dst = &s->buffers[op->dst];
    int64_t L = s->buckets[op->bucket].length;
    mf_rank_sig sig;
    memset(&sig, 0, sizeof sig);
    sig.kind = op->kind;
    sig.axis = op->axis;
    sig.src = src->place;
    sig.dst = dst->place;
    sig.length = L;
    sig.count = op->count;
    sig.used = true;
    if (!mf_verify_sig_first(c, &sig))
        return;
    int64_t *group = op->axis >= 0 ? malloc((size_t)m->axes[op->axis].size * sizeof *group) : NULL;
    char ob[160];
    if (op->axis >= 0 && !group) {
        mf_verify_err(c, "out of memory while verifying");
        return;
    }
    for (int64_t r = 0; r < m->world; r++) {
        mf_range sr = mf_layout_range(m, &src->place, r, L), dr = mf_layout_range(m, &dst->place, r, L);
        int64_t coords[MF_MAX_AXES];
        mf_mesh_coords(m, r, coords);
        bool ok = true;
        switch (op->kind) {
        case MF_OP_ALL_GATHER:
        case MF_OP_REDUCE_SCATTER:
        case MF_OP_ALL_REDUCE: {
            int64_t n = m->axes[op->axis].size;
            mf_mesh_axis_group(m, op->axis, r, group);
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
            break;
        }
        case MF_OP_SLICE:
            ok = dr.offset == sr.offset + coords[op->axis] * op->count && dr.len == op->count;
            break;
        default:
            ok = dr.offset == sr.offset && dr.len == sr.len;
            break;
        }
        if (!ok) {
            mf_verify_err(c, "%s: on rank %lld the elements it moves are not the shard the layout assigns to '%s'",
                          mf_verify_opdesc(s, op, ob, sizeof ob), (long long)r, dst->name);
            break;
        }
    }
    free(group);
}

static void mf_verify_data_op(mf_verify_ctx *c, const mf_op *op)
{
    const mf_schedule *s = c->s;
    int k = s->mesh.naxes;
    char ob[160], pa[64], pb[64];
    const char *od = mf_verify_opdesc(s, op, ob, sizeof ob);
    bool axis_op = mf_opkind_is_collective(op->kind) || op->kind == MF_OP_SLICE;
    if (op->bucket < 0 || op->bucket >= s->nbuckets || op->src < 0 || op->src >= s->nbuffers || op->dst < 0 ||
        op->dst >= s->nbuffers || (axis_op && (op->axis < 0 || op->axis >= k)) || (!axis_op && op->axis != -1)) {
        mf_verify_err(c, "%s has an invalid bucket, buffer or axis", od);
        return;
    }
    if (op->transition < 1 || op->transition > 4)
        mf_verify_err(c, "%s has transition %d, expected T1..T4", od, op->transition);
    if (op->event != -1)
        mf_verify_err(c, "%s carries an event", od);
    const mf_buffer *src = &s->buffers[op->src], *dst = &s->buffers[op->dst];
    if (src->bucket != op->bucket || dst->bucket != op->bucket) {
        mf_verify_err(c, "%s moves data between buckets ('%s' -> '%s')", od, src->name, dst->name);
        return;
    }
    if (op->src == op->dst && op->kind != MF_OP_ALL_REDUCE)
        mf_verify_err(c, "%s works in place on '%s'", od, src->name);
    if (mf_opkind_is_collective(op->kind)) {
        mf_stream want = op->axis == k - 1 ? MF_STREAM_INNER : MF_STREAM_OUTER;
        if (op->stream != want)
            mf_verify_err(c, "%s runs on stream %s, but collectives on %s run on %s (one stream per communicator keeps "
                          "their order the same on every rank)",
                          od, mf_stream_name(op->stream), mf_verify_axis(s, op->axis), mf_stream_name(want));
    } else if (op->stream == MF_STREAM_COMPUTE) {
        mf_verify_err(c, "%s runs on the compute stream; local ops run on the stream of the collective they feed", od);
    }
    if (dst->dtype != op->dtype || (op->kind != MF_OP_CAST && src->dtype != op->dtype))
        mf_verify_err(c, "%s moves %s, but '%s' is %s and '%s' is %s", od, mf_dtype_name(op->dtype), src->name,
                      mf_dtype_name(src->dtype), dst->name, mf_dtype_name(dst->dtype));
    int64_t n = axis_op ? s->mesh.axes[op->axis].size : 1;
    int64_t want_src = op->count, want_dst = op->count;
    if (op->kind == MF_OP_ALL_GATHER)
        want_dst = op->count * n;
    if (op->kind == MF_OP_REDUCE_SCATTER || op->kind == MF_OP_SLICE)
        want_src = op->count * n;
    if (op->count <= 0 || src->count != want_src || dst->count != want_dst) {
        mf_verify_err(c, "%s: count %lld does not fit its buffers ('%s' holds %lld, '%s' holds %lld elements)", od,
                      (long long)op->count, src->name, (long long)src->count, dst->name, (long long)dst->count);
        return;
    }
    mf_placement moved;
    const char *why = NULL;
    if (!mf_verify_moves(s, op, &src->place, &moved, &why)) {
        mf_verify_err(c, "%s reads '%s' at %s: %s", od, src->name, mf_placement_format(&src->place, k, pa, sizeof pa), why);
        return;
    }
    if (!mf_placement_equal(&moved, &dst->place, k)) {
        mf_verify_err(c, "%s turns %s into %s, but its destination '%s' is %s", od,
                      mf_placement_format(&src->place, k, pa, sizeof pa), mf_placement_format(&moved, k, pb, sizeof pb),
                      dst->name, mf_placement_format(&dst->place, k, ob, sizeof ob));
        return;
    }
    mf_verify_ranks(c, op);
}

static void mf_verify_ops(mf_verify_ctx *c)
{
    const mf_schedule *s = c->s;
    char ob[160];
    int *records = calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *records);
    int *rec_stream = calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *rec_stream);
    if (!records || !rec_stream) {
        free(records);
        free(rec_stream);
        mf_verify_err(c, "out of memory while verifying");
        return;
    }
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (op->id != i) {
            mf_verify_err(c, "op at index %d has id %d (ids are indices)", i, op->id);
            continue;
        }
        if ((int)op->kind < 0 || op->kind >= MF_OPKIND_COUNT || (int)op->phase < 0 || op->phase >= MF_PHASE_COUNT ||
            (int)op->when < 0 || op->when >= MF_WHEN_COUNT || (int)op->stream < 0 || op->stream >= MF_STREAM_COUNT) {
            mf_verify_err(c, "op %d has an invalid kind, phase, predicate or stream", i);
            continue;
        }
        const char *od = mf_verify_opdesc(s, op, ob, sizeof ob);
        bool step_phase = op->phase == MF_PHASE_STEP_BEGIN || op->phase == MF_PHASE_STEP_END;
        if (step_phase && op->unit != -1)
            mf_verify_err(c, "%s: %s ops belong to no unit", od, mf_phase_name(op->phase));
        if (!step_phase && (op->unit < 0 || op->unit >= s->nunits)) {
            mf_verify_err(c, "%s has an invalid unit %d", od, op->unit);
            continue;
        }
        if (step_phase && op->when != MF_WHEN_EVERY)
            mf_verify_err(c, "%s has predicate %s, but %s ops run once per step (predicate every)", od,
                          mf_when_name(op->when), mf_phase_name(op->phase));
        if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT) {
            if (op->event < 0 || op->event >= s->nevents) {
                mf_verify_err(c, "%s refers to event %d, but the schedule has %d events", od, op->event, s->nevents);
                continue;
            }
            if (op->bucket != -1 || op->src != -1 || op->dst != -1 || op->axis != -1)
                mf_verify_err(c, "%s carries data fields", od);
            if (op->kind == MF_OP_RECORD) {
                records[op->event]++;
                rec_stream[op->event] = op->stream;
            }
            continue;
        }
        if (step_phase)
            mf_verify_err(c, "%s: data ops run at unit hooks, not at %s", od, mf_phase_name(op->phase));
        mf_verify_data_op(c, op);
    }
    for (int e = 0; e < s->nevents; e++)
        if (records[e] != 1)
            mf_verify_err(c, "event %d is recorded by %d ops, expected exactly one", e, records[e]);
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (op->kind != MF_OP_WAIT || op->event < 0 || op->event >= s->nevents || records[op->event] != 1)
            continue;
        if (rec_stream[op->event] == (int)op->stream)
            mf_verify_err(c, "%s waits for an event recorded on its own stream", mf_verify_opdesc(s, op, ob, sizeof ob));
    }
    free(records);
    free(rec_stream);
}

/* ---- simulation ---- */

enum { V_NONE, V_WEIGHT, V_GRAD };

typedef struct mf_absval {
    int kind;               /* V_NONE, V_WEIGHT, V_GRAD */
    mf_placement place;     /* Partial = not yet reduced over that axis */
    mf_dtype dtype;
    int version;            /* weight: the step whose main_weight it is */
    uint32_t mbs;           /* gradient: the microbatches summed (bits) */
    int step, mb;           /* when it was written */
    bool released;          /* weight_full after forward of a unit that reshards */
} mf_absval;

typedef struct mf_access {
    int stream;             /* -1: none */
    int64_t t;              /* the stream's own clock at the access */
    int actor;              /* op id, or -1 - trainer action index */
    int mb;                 /* microbatch position of the access */
} mf_access;

typedef struct mf_bufstate {
    mf_absval v;
    mf_access write;
    mf_access reads[MF_STREAM_COUNT];
} mf_bufstate;

typedef struct mf_vclock {
    int64_t c[MF_STREAM_COUNT];
} mf_vclock;

/* Trainer actions, named in messages. */
enum { A_FORWARD, A_BACKWARD, A_OPTIMIZER };

/* Buckets grouped by unit: those of unit u are ids[start[u] .. start[u + 1]),
 * in ascending bucket order. */
typedef struct mf_sim_index {
    int *start;             /* nunits + 1 entries */
    int *ids;
} mf_sim_index;

typedef struct mf_sim {
    mf_verify_ctx *c;
    mf_sim_index by_unit;   /* buckets by first unit */
    mf_sim_index by_last;   /* buckets by last unit */
    int *cover, ncover;     /* the buckets covering the unit of the sweep, ascending */
    int *cover_next;        /* scratch of the sweep */
    mf_bufstate *buf;
    mf_vclock stream[MF_STREAM_COUNT];
    mf_vclock *event;
    bool *event_set;
    int step;               /* 1, 2 */
    int mb;                 /* simulated microbatch index 0.. */
    int nmb;                /* simulated microbatches per step */
    bool first, last;
    const char *pos;        /* "first", "middle", "last", "only" */
    int actor_kind, actor_unit; /* the trainer action in progress */
} mf_sim;

static const char *mf_sim_actor(const mf_sim *sim, int actor, char *buf, size_t size)
{
    const mf_schedule *s = sim->c->s;
    if (actor >= 0)
        return mf_verify_opdesc(s, &s->ops[actor], buf, size);
    int a = -1 - actor;
    int kind = a % 3, unit = a / 3;
    if (kind == A_OPTIMIZER)
        snprintf(buf, size, "the optimizer (after step_end, on compute)");
    else
        snprintf(buf, size, "the %s of unit %s (on compute)", kind == A_FORWARD ? "forward" : "backward",
                 mf_verify_unit(s, unit));
    return buf;
}

static int mf_sim_trainer_actor(int kind, int unit)
{
    return -1 - (unit * 3 + kind);
}

static bool mf_sim_ordered(const mf_sim *sim, int stream, const mf_access *prev)
{
    return prev->stream < 0 || prev->stream == stream || sim->stream[stream].c[prev->stream] >= prev->t;
}

static void mf_sim_hazard(mf_sim *sim, int actor, int stream, int b, const mf_access *prev, const char *what)
{
    mf_verify_ctx *c = sim->c;
    int what_key = what[0] * 256 + what[1];
    if (!mf_verify_first(c, actor, b, what_key))
        return;
    char a[192], p[192];
    char where[64] = "";
    if (actor != mf_sim_trainer_actor(A_OPTIMIZER, 0))
        snprintf(where, sizeof where, " (microbatch %s)", sim->pos);
    mf_verify_err(c, "%s %s %s %s by %s without an event edge%s", mf_sim_actor(sim, actor, a, sizeof a),
                  what[0] == 'r' ? "reads" : "writes", mf_verify_bufname(c->s, b),
                  what[1] == 'w' ? "written" : "read", mf_sim_actor(sim, prev->actor, p, sizeof p), where);
    (void)stream;
}

/* Ordering checks and bookkeeping for one access; `write` distinguishes. */
static void mf_sim_access(mf_sim *sim, int actor, int stream, int b, bool write)
{
    mf_bufstate *st = &sim->buf[b];
    int64_t t = sim->stream[stream].c[stream];
    if (!mf_sim_ordered(sim, stream, &st->write))
        mf_sim_hazard(sim, actor, stream, b, &st->write, write ? "ww" : "rw");
    if (write) {
        for (int r = 0; r < MF_STREAM_COUNT; r++)
            if (st->reads[r].stream >= 0 && !mf_sim_ordered(sim, stream, &st->reads[r]))
                mf_sim_hazard(sim, actor, stream, b, &st->reads[r], "wr");
        st->write = (mf_access){stream, t, actor, sim->mb};
        for (int r = 0; r < MF_STREAM_COUNT; r++)
            st->reads[r].stream = -1;
    } else {
        st->reads[stream] = (mf_access){stream, t, actor, sim->mb};
    }
}

static void mf_sim_tick(mf_sim *sim, int stream)
{
    sim->stream[stream].c[stream]++;
}

/* A value error, reported once per (actor, buffer). */
__attribute__((format(printf, 4, 5))) static void mf_sim_bad(mf_sim *sim, int actor, int b, const char *fmt, ...)
{
    mf_verify_ctx *c = sim->c;
    if (!mf_verify_first(c, actor, b, 0))
        return;
    char msg[512], a[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (actor == mf_sim_trainer_actor(A_OPTIMIZER, 0)) /* runs between steps, not in a microbatch */
        mf_verify_err(c, "%s %s", mf_sim_actor(sim, actor, a, sizeof a), msg);
    else
        mf_verify_err(c, "%s %s (microbatch %s)", mf_sim_actor(sim, actor, a, sizeof a), msg, sim->pos);
}

/* Checks that buffer b holds something readable now; false when not. */
static bool mf_sim_readable(mf_sim *sim, int actor, int b)
{
    const mf_schedule *s = sim->c->s;
    const mf_bufstate *st = &sim->buf[b];
    const mf_buffer *bf = &s->buffers[b];
    const char *name = mf_verify_bufname(s, b);
    if (st->v.kind == V_NONE) {
        mf_sim_bad(sim, actor, b, "reads %s, which holds nothing yet in this step", name);
        return false;
    }
    if (st->v.released) {
        mf_sim_bad(sim, actor, b, "reads %s after it was released at forward_post (its unit reshards after forward) "
                   "and before it was gathered again", name);
        return false;
    }
    if (bf->lifetime == MF_LIFETIME_MICROBATCH && (st->v.step != sim->step || st->v.mb != sim->mb)) {
        mf_sim_bad(sim, actor, b, "reads %s (lifetime microbatch) written in an earlier microbatch", name);
        return false;
    }
    if (bf->lifetime == MF_LIFETIME_STEP && st->v.step != sim->step) {
        mf_sim_bad(sim, actor, b, "reads %s (lifetime step) written in an earlier step", name);
        return false;
    }
    return true;
}

static uint32_t mf_sim_all_mbs(const mf_sim *sim)
{
    return (1u << sim->nmb) - 1u;
}

static void mf_sim_data_op(mf_sim *sim, const mf_op *op)
{
    const mf_schedule *s = sim->c->s;
    int k = s->mesh.naxes;
    char pa[64], pb[64];
    mf_sim_tick(sim, op->stream);
    mf_sim_access(sim, op->id, op->stream, op->src, false);
    mf_sim_access(sim, op->id, op->stream, op->dst, true);
    mf_bufstate *src = &sim->buf[op->src], *dst = &sim->buf[op->dst];
    const mf_buffer *db = &s->buffers[op->dst];
    mf_absval nv = src->v;
    bool ok = mf_sim_readable(sim, op->id, op->src);
    if (ok) {
        bool grad_op = op->kind == MF_OP_REDUCE_SCATTER || op->kind == MF_OP_ALL_REDUCE || op->kind == MF_OP_ACCUMULATE;
        if (grad_op && nv.kind != V_GRAD) {
            mf_sim_bad(sim, op->id, op->src, "reduces %s, which holds a weight, not a gradient",
                       mf_verify_bufname(s, op->src));
            ok = false;
        }
    }
    if (ok) {
        const char *why = NULL;
        mf_placement moved;
        if (!mf_verify_moves(s, op, &nv.place, &moved, &why)) {
            mf_sim_bad(sim, op->id, op->src, "reads %s holding %s: %s", mf_verify_bufname(s, op->src),
                       mf_placement_format(&nv.place, k, pa, sizeof pa), why);
            ok = false;
        }
        nv.place = moved;
    }
    if (ok && op->kind == MF_OP_ACCUMULATE && !sim->first) {
        if (dst->v.kind != V_GRAD || dst->v.step != sim->step) {
            mf_sim_bad(sim, op->id, op->dst, "adds into %s, which holds no gradient of this step",
                       mf_verify_bufname(s, op->dst));
            ok = false;
        } else if (!mf_placement_equal(&dst->v.place, &nv.place, k)) {
            mf_sim_bad(sim, op->id, op->dst, "adds a gradient at %s into %s holding one at %s",
                       mf_placement_format(&nv.place, k, pa, sizeof pa), mf_verify_bufname(s, op->dst),
                       mf_placement_format(&dst->v.place, k, pb, sizeof pb));
            ok = false;
        } else if (dst->v.mbs & nv.mbs) {
            mf_sim_bad(sim, op->id, op->dst, "adds the gradient of a microbatch into %s twice",
                       mf_verify_bufname(s, op->dst));
            ok = false;
        } else {
            nv.mbs |= dst->v.mbs;
        }
    }
    if (ok && !mf_placement_equal(&nv.place, &db->place, k)) {
        mf_sim_bad(sim, op->id, op->dst, "writes a value at %s into %s, declared %s",
                   mf_placement_format(&nv.place, k, pa, sizeof pa), mf_verify_bufname(s, op->dst),
                   mf_placement_format(&db->place, k, pb, sizeof pb));
        ok = false;
    }
    if (!ok) {
        /* Poison the destination so one mistake is reported once, where it is made. */
        dst->v = (mf_absval){.kind = V_NONE};
        dst->v.step = -1;
        return;
    }
    nv.dtype = db->dtype;
    nv.step = sim->step;
    nv.mb = sim->mb;
    nv.released = false;
    dst->v = nv;
}

static void mf_sim_event_op(mf_sim *sim, const mf_op *op)
{
    mf_sim_tick(sim, op->stream);
    if (op->kind == MF_OP_RECORD) {
        sim->event[op->event] = sim->stream[op->stream];
        sim->event_set[op->event] = true;
    } else if (sim->event_set[op->event]) {
        for (int i = 0; i < MF_STREAM_COUNT; i++)
            if (sim->event[op->event].c[i] > sim->stream[op->stream].c[i])
                sim->stream[op->stream].c[i] = sim->event[op->event].c[i];
    }
}

static bool mf_sim_when(const mf_sim *sim, mf_when w)
{
    return w == MF_WHEN_EVERY || (w == MF_WHEN_FIRST && sim->first) || (w == MF_WHEN_LAST && sim->last);
}

/* Issues the ops of one hook, in id order. */
static void mf_sim_hook(mf_sim *sim, const int *ids, int n)
{
    const mf_schedule *s = sim->c->s;
    for (int i = 0; i < n; i++) {
        const mf_op *op = &s->ops[ids[i]];
        if (!mf_sim_when(sim, op->when))
            continue;
        if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
            mf_sim_event_op(sim, op);
        else
            mf_sim_data_op(sim, op);
    }
}

/*
 * Moves the sweep to unit v: sim->cover becomes the buckets covering v
 * (unit <= v <= last_unit), ascending. Forward (v ascending from 0) keeps the
 * previous unit's buckets that reach v and merges in those starting at v;
 * backward (v descending from the last unit) keeps those that start at or
 * before v and merges in those ending at v. Each call costs the two lists'
 * lengths, so a sweep costs the trainer's accesses, not units x buckets.
 */
static void mf_sim_cover(mf_sim *sim, int v, bool forward)
{
    const mf_schedule *s = sim->c->s;
    const mf_sim_index *ix = forward ? &sim->by_unit : &sim->by_last;
    const int *add = ix->ids + ix->start[v];
    int nadd = ix->start[v + 1] - ix->start[v], n = 0, i = 0, j = 0;
    while (i < sim->ncover || j < nadd) {
        if (i < sim->ncover) {
            const mf_bucket *bk = &s->buckets[sim->cover[i]];
            if (forward ? bk->last_unit < v : bk->unit > v) {
                i++;
                continue;
            }
        }
        if (j >= nadd || (i < sim->ncover && sim->cover[i] < add[j]))
            sim->cover_next[n++] = sim->cover[i++];
        else
            sim->cover_next[n++] = add[j++];
    }
    int *t = sim->cover;
    sim->cover = sim->cover_next;
    sim->cover_next = t;
    sim->ncover = n;
}

/* The trainer reads the unsharded weight of every bucket covering unit v
 * (sim->cover). */
static void mf_sim_compute_reads(mf_sim *sim, int kind, int v)
{
    mf_verify_ctx *c = sim->c;
    const mf_schedule *s = c->s;
    int actor = mf_sim_trainer_actor(kind, v);
    char pa[64];
    mf_sim_tick(sim, MF_STREAM_COMPUTE);
    for (int i = 0; i < sim->ncover; i++) {
        int b = sim->cover[i];
        const mf_bucket *bk = &s->buckets[b];
        int fb = c->full[b];
        mf_sim_access(sim, actor, MF_STREAM_COMPUTE, fb, false);
        if (!mf_sim_readable(sim, actor, fb))
            continue;
        const mf_absval *val = &sim->buf[fb].v;
        if (val->kind != V_WEIGHT)
            mf_sim_bad(sim, actor, fb, "computes with %s, which holds a gradient", mf_verify_bufname(s, fb));
        else if (val->version != sim->step)
            mf_sim_bad(sim, actor, fb, "computes with %s holding the main_weight of the previous step (T1 did not "
                       "refresh it)", mf_verify_bufname(s, fb));
        else if (!mf_placement_equal(&val->place, &c->rep, s->mesh.naxes))
            mf_sim_bad(sim, actor, fb, "computes with %s holding %s, not the unsharded weight",
                       mf_verify_bufname(s, fb), mf_placement_format(&val->place, s->mesh.naxes, pa, sizeof pa));
        else if (val->dtype != bk->dtype[MF_ROLE_WEIGHT])
            mf_sim_bad(sim, actor, fb, "computes with %s in %s, not weight's dtype %s", mf_verify_bufname(s, fb),
                       mf_dtype_name(val->dtype), mf_dtype_name(bk->dtype[MF_ROLE_WEIGHT]));
    }
}

/* The trainer writes this microbatch's gradient of the buckets covering v
 * (sim->cover). */
static void mf_sim_compute_grads(mf_sim *sim, int v)
{
    mf_verify_ctx *c = sim->c;
    const mf_schedule *s = c->s;
    int actor = mf_sim_trainer_actor(A_BACKWARD, v);
    for (int i = 0; i < sim->ncover; i++) {
        int b = sim->cover[i];
        const mf_bucket *bk = &s->buckets[b];
        int lb = c->local[b];
        mf_sim_access(sim, actor, MF_STREAM_COMPUTE, lb, true);
        mf_absval *val = &sim->buf[lb].v;
        *val = (mf_absval){.kind = V_GRAD, .place = c->partial, .dtype = bk->dtype[MF_ROLE_GRAD],
                           .mbs = 1u << sim->mb, .step = sim->step, .mb = sim->mb};
    }
}

/* After step_end: the optimizer reads every delivered gradient and writes main_weight. */
static void mf_sim_optimizer(mf_sim *sim)
{
    mf_verify_ctx *c = sim->c;
    const mf_schedule *s = c->s;
    int k = s->mesh.naxes, actor = mf_sim_trainer_actor(A_OPTIMIZER, 0);
    char pa[64], pb[64];
    mf_sim_tick(sim, MF_STREAM_COMPUTE);
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        int db = c->delivered[b];
        mf_sim_access(sim, actor, MF_STREAM_COMPUTE, db, false);
        const mf_absval *val = &sim->buf[db].v;
        if (val->kind != V_GRAD || val->step != sim->step) {
            mf_sim_bad(sim, actor, db, "finds no gradient of this step in %s at step_end", mf_verify_bufname(s, db));
        } else if (!mf_placement_equal(&val->place, &bk->place[MF_ROLE_MAIN_WEIGHT], k)) {
            mf_sim_bad(sim, actor, db, "receives the gradient in %s at %s, but main_weight is %s (reduced over "
                       "every axis)", mf_verify_bufname(s, db), mf_placement_format(&val->place, k, pa, sizeof pa),
                       mf_placement_format(&bk->place[MF_ROLE_MAIN_WEIGHT], k, pb, sizeof pb));
        } else if (val->mbs != mf_sim_all_mbs(sim)) {
            char missing[64] = "";
            int n = 0;
            for (int m = 0; m < sim->nmb; m++)
                if (!(val->mbs & (1u << m)))
                    n += snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                                  n ? ", " : "", m == 0 ? "first" : m == sim->nmb - 1 ? "last" : "middle") > 0;
            mf_sim_bad(sim, actor, db, "receives in %s a gradient that misses microbatch%s %s",
                       mf_verify_bufname(s, db), n > 1 ? "es" : "", missing);
        }
        int mw = c->mainw[b];
        mf_sim_access(sim, actor, MF_STREAM_COMPUTE, mw, true);
        sim->buf[mw].v = (mf_absval){.kind = V_WEIGHT, .place = bk->place[MF_ROLE_MAIN_WEIGHT],
                                     .dtype = bk->dtype[MF_ROLE_MAIN_WEIGHT], .version = sim->step + 1,
                                     .step = sim->step, .mb = sim->mb};
    }
}

/* Ops grouped by hook: index = phase * (nunits + 1) + unit + 1. */
typedef struct mf_hooks {
    int *start, *ids;
} mf_hooks;

static int mf_hook_index(const mf_schedule *s, mf_phase ph, int unit)
{
    return (int)ph * (s->nunits + 1) + unit + 1;
}

static void mf_sim_run_hook(mf_sim *sim, const mf_hooks *h, mf_phase ph, int unit)
{
    int i = mf_hook_index(sim->c->s, ph, unit);
    mf_sim_hook(sim, h->ids + h->start[i], h->start[i + 1] - h->start[i]);
}

static void mf_sim_step(mf_sim *sim, const mf_hooks *h)
{
    const mf_schedule *s = sim->c->s;
    mf_sim_run_hook(sim, h, MF_PHASE_STEP_BEGIN, -1);
    for (int m = 0; m < sim->nmb; m++) {
        sim->mb = m;
        sim->first = m == 0;
        sim->last = m == sim->nmb - 1;
        sim->pos = sim->nmb == 1 ? "first=last" : sim->first ? "first" : sim->last ? "last" : "middle";
        sim->ncover = 0;
        for (int v = 0; v < s->nunits; v++) {
            mf_sim_run_hook(sim, h, MF_PHASE_FORWARD_PRE, v);
            mf_sim_cover(sim, v, true);
            mf_sim_compute_reads(sim, A_FORWARD, v);
            mf_sim_run_hook(sim, h, MF_PHASE_FORWARD_POST, v);
            for (int i = sim->by_last.start[v]; i < sim->by_last.start[v + 1]; i++) {
                int b = sim->by_last.ids[i];
                if (s->units[s->buckets[b].unit].reshard_after_forward && sim->c->full[b] >= 0 &&
                    s->buffers[sim->c->full[b]].kind == MF_BUF_WEIGHT_FULL)
                    sim->buf[sim->c->full[b]].v.released = true;
            }
        }
        sim->ncover = 0;
        for (int v = s->nunits - 1; v >= 0; v--) {
            mf_sim_run_hook(sim, h, MF_PHASE_BACKWARD_PRE, v);
            mf_sim_cover(sim, v, false);
            mf_sim_compute_reads(sim, A_BACKWARD, v);
            mf_sim_compute_grads(sim, v);
            mf_sim_run_hook(sim, h, MF_PHASE_BACKWARD_POST, v);
        }
    }
    mf_sim_run_hook(sim, h, MF_PHASE_STEP_END, -1);
    mf_sim_optimizer(sim);
}

/* Groups the buckets by first unit (`first`) or last unit, ascending within a
 * unit (a stable counting sort; the units were checked to be in range).
 * False on OOM; ix holds what was allocated. */
static bool mf_sim_index_build(mf_sim_index *ix, const mf_schedule *s, bool first)
{
    ix->start = calloc((size_t)s->nunits + 2, sizeof *ix->start);
    ix->ids = malloc((size_t)(s->nbuckets ? s->nbuckets : 1) * sizeof *ix->ids);
    if (!ix->start || !ix->ids)
        return false;
    for (int b = 0; b < s->nbuckets; b++)
        ix->start[(first ? s->buckets[b].unit : s->buckets[b].last_unit) + 2]++;
    for (int u = 0; u < s->nunits; u++)
        ix->start[u + 2] += ix->start[u + 1];
    for (int b = 0; b < s->nbuckets; b++)
        ix->ids[ix->start[(first ? s->buckets[b].unit : s->buckets[b].last_unit) + 1]++] = b;
    return true;
}

static void mf_verify_simulate(mf_verify_ctx *c)
{
    const mf_schedule *s = c->s;
    int nh = MF_PHASE_COUNT * (s->nunits + 1) + 1;
    mf_hooks h = {calloc((size_t)nh + 1, sizeof(int)), malloc((size_t)(s->nops ? s->nops : 1) * sizeof(int))};
    mf_sim sim = {.c = c};
    sim.buf = calloc((size_t)(s->nbuffers ? s->nbuffers : 1), sizeof *sim.buf);
    sim.event = calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *sim.event);
    sim.event_set = calloc((size_t)(s->nevents ? s->nevents : 1), sizeof *sim.event_set);
    sim.cover = malloc((size_t)(s->nbuckets ? s->nbuckets : 1) * sizeof *sim.cover);
    sim.cover_next = malloc((size_t)(s->nbuckets ? s->nbuckets : 1) * sizeof *sim.cover_next);
    if (!h.start || !h.ids || !sim.buf || !sim.event || !sim.event_set || !sim.cover || !sim.cover_next ||
        !mf_sim_index_build(&sim.by_unit, s, true) || !mf_sim_index_build(&sim.by_last, s, false)) {
        mf_verify_err(c, "out of memory while verifying");
        goto done;
    }
    /* counting sort of op ids by hook, stable (keeps id order within a hook) */
    for (int i = 0; i < s->nops; i++)
        h.start[mf_hook_index(s, s->ops[i].phase, s->ops[i].unit) + 1]++;
    for (int i = 0; i < nh; i++)
        h.start[i + 1] += h.start[i];
    {
        int *fill = calloc((size_t)nh, sizeof *fill);
        if (!fill) {
            mf_verify_err(c, "out of memory while verifying");
            goto done;
        }
        for (int i = 0; i < s->nops; i++) {
            int x = mf_hook_index(s, s->ops[i].phase, s->ops[i].unit);
            h.ids[h.start[x] + fill[x]++] = i;
        }
        free(fill);
    }
    for (int i = 0; i < s->nbuffers; i++) {
        sim.buf[i].write.stream = -1;
        for (int r = 0; r < MF_STREAM_COUNT; r++)
            sim.buf[i].reads[r].stream = -1;
        sim.buf[i].v.step = -1;
    }
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        sim.buf[c->mainw[b]].v = (mf_absval){.kind = V_WEIGHT, .place = bk->place[MF_ROLE_MAIN_WEIGHT],
                                            .dtype = bk->dtype[MF_ROLE_MAIN_WEIGHT], .version = 1, .step = 0};
    }
    sim.nmb = s->microbatches >= 3 ? 3 : (int)s->microbatches;
    for (sim.step = 1; sim.step <= 2; sim.step++)
        mf_sim_step(&sim, &h);
done:
    free(h.start);
    free(h.ids);
    free(sim.buf);
    free(sim.event);
    free(sim.event_set);
    free(sim.cover);
    free(sim.cover_next);
    free(sim.by_unit.start);
    free(sim.by_unit.ids);
    free(sim.by_last.start);
    free(sim.by_last.ids);
}

int mf_verify_run(const mf_schedule *s, mf_diag *d)
{
    mf_verify_ctx c = {.s = s, .d = d};
    size_t nb = s->nbuckets ? (size_t)s->nbuckets : 1;
    c.delivered = malloc(nb * sizeof(int));
    c.full = malloc(nb * sizeof(int));
    c.local = malloc(nb * sizeof(int));
    c.mainw = malloc(nb * sizeof(int));
    if (!c.delivered || !c.full || !c.local || !c.mainw) {
        mf_verify_err(&c, "out of memory while verifying");
        goto done;
    }
    for (size_t b = 0; b < nb; b++)
        c.delivered[b] = c.full[b] = c.local[b] = c.mainw[b] = -1;
    mf_verify_header(&c);
    if (c.errors)
        goto done;
    for (int j = 0; j < s->mesh.naxes; j++) {
        c.rep.p[j] = MF_PLACE_REPLICATE;
        c.partial.p[j] = MF_PLACE_PARTIAL;
    }
    mf_verify_buckets(&c);
    mf_verify_buffers(&c);
    mf_verify_ops(&c);
    if (c.errors == 0)
        mf_verify_simulate(&c);
done:
    free(c.delivered);
    free(c.full);
    free(c.local);
    free(c.mainw);
    free(c.seen);
    free(c.sigs);
    return c.errors;
}
