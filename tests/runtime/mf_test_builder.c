/*
 * mf_test_builder: see the header. Builds buckets (one per unit per layout,
 * tensors 8-element aligned, length padded to world * 128 elements), the
 * normative buffers, and the ops of T1..T4 as chains of single-axis steps.
 */
#include "mf_test_builder.h"

#include "mf_assign.h"
#include "mf_programs.h"

#include <stdio.h>
#include <string.h>

#include "mf_layout.h"

const char *const mf_tb_modes[] = {"ddp",  "zero1",       "zero2",  "zero3", "hsdp",
                                   "hfsdp", "hsdp_nosync", "fsdp2d", "zero2_inner_zero1_outer"};
const int mf_tb_nmodes = (int)(sizeof mf_tb_modes / sizeof mf_tb_modes[0]);

/* Letters for k axes: `outer` on axes 0..k-2, `inner` on axis k-1. */
static const char *letters(char buf[MF_MAX_AXES + 1], int k, char outer, char inner)
{
    for (int j = 0; j < k; j++)
        buf[j] = j == k - 1 ? inner : outer;
    buf[k] = '\0';
    return buf;
}

void mf_tb_spec_1d(mf_tb_spec *spec, int64_t ranks, mf_reduce reduce)
{
    memset(spec, 0, sizeof *spec);
    spec->naxes = 1;
    spec->sizes[0] = ranks;
    spec->microbatches = 1;
    spec->reduce = reduce;
    spec->nlayouts = 1;
    spec->nunits = 1;
}

void mf_tb_step_begin_fence(mf_op *ops, int at)
{
    ops[at] = (mf_op){.id = at, .phase = MF_PHASE_STEP_BEGIN, .unit = -1, .when = MF_WHEN_EVERY,
                      .stream = MF_STREAM_INNER, .kind = MF_OP_RECORD, .bucket = -1, .axis = -1,
                      .src = -1, .dst = -1, .event = 0};
    ops[at + 1] = ops[at];
    ops[at + 1].id = at + 1;
    ops[at + 1].stream = MF_STREAM_COMPUTE;
    ops[at + 1].kind = MF_OP_WAIT;
}

bool mf_tb_mode(const char *mode, int k, mf_tb_layout *out)
{
    if (k < 1 || k > MF_MAX_AXES)
        return false;
    static _Thread_local char bufs[MF_ROLE_COUNT][MF_MAX_AXES + 1];
    /* W, G, O as (outer, inner) letters */
    static const struct {
        const char *name;
        char w[2], g[2], o[2];
    } table[] = {
        {"ddp", {'R', 'R'}, {'P', 'P'}, {'R', 'R'}},
        {"zero1", {'R', 'R'}, {'P', 'P'}, {'F', 'F'}},
        {"zero2", {'R', 'R'}, {'F', 'F'}, {'F', 'F'}},
        {"zero3", {'F', 'F'}, {'F', 'F'}, {'F', 'F'}},
        {"hsdp", {'R', 'F'}, {'P', 'F'}, {'R', 'F'}},
        {"hfsdp", {'R', 'F'}, {'P', 'F'}, {'F', 'F'}},
        {"hsdp_nosync", {'R', 'F'}, {'P', 'P'}, {'R', 'F'}},
        {"fsdp2d", {'F', 'F'}, {'F', 'F'}, {'F', 'F'}},
        {"zero2_inner_zero1_outer", {'R', 'R'}, {'P', 'F'}, {'F', 'F'}},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, mode) != 0)
            continue;
        out->dtype[MF_ROLE_WEIGHT] = MF_BF16;
        out->dtype[MF_ROLE_GRAD] = MF_FP32;
        out->dtype[MF_ROLE_MAIN_WEIGHT] = MF_FP32;
        out->place[MF_ROLE_WEIGHT] = letters(bufs[0], k, table[i].w[0], table[i].w[1]);
        out->place[MF_ROLE_GRAD] = letters(bufs[1], k, table[i].g[0], table[i].g[1]);
        out->place[MF_ROLE_MAIN_WEIGHT] = letters(bufs[2], k, table[i].o[0], table[i].o[1]);
        return true;
    }
    return false;
}

/* ---- construction state ---- */

typedef struct tb {
    mf_schedule *s;
    mf_vec ops, bufs;
    int nevents;
    int hook_event[MF_PHASE_COUNT][MF_TB_MAX_UNITS + 1]; /* compute record per hook */
    bool hook_recorded[MF_PHASE_COUNT][MF_TB_MAX_UNITS + 1];
    char *err;
    size_t errlen;
    bool oom;
} tb;

static mf_placement parse_place(const char *letters_, int k)
{
    mf_placement p;
    memset(&p, 0, sizeof p);
    for (int j = 0; j < k; j++)
        p.p[j] = letters_[j] == 'F' ? MF_PLACE_FLAT
                 : letters_[j] == 'P' ? MF_PLACE_PARTIAL
                                      : MF_PLACE_REPLICATE;
    return p;
}

static int add_buffer(tb *b, int bucket, mf_bufkind kind, mf_dtype dt, mf_placement p, int64_t count,
                      mf_lifetime life, const char *suffix)
{
    mf_buffer *buf = mf_vec_push(&b->bufs);
    if (!buf) {
        b->oom = true;
        return -1;
    }
    buf->name = mf_arena_printf(b->s->arena, "%s.%s", b->s->buckets[bucket].name, suffix);
    buf->bucket = bucket;
    buf->kind = kind;
    buf->dtype = dt;
    buf->place = p;
    buf->count = count;
    buf->lifetime = life;
    return (int)b->bufs.len - 1;
}

static void add_op(tb *b, mf_phase ph, int unit, mf_when when, mf_stream st, mf_opkind kind,
                   int transition, int bucket, int axis, mf_dtype dt, int64_t count, int src, int dst,
                   int event)
{
    mf_op *op = mf_vec_push(&b->ops);
    if (!op) {
        b->oom = true;
        return;
    }
    op->id = (int)b->ops.len - 1;
    op->phase = ph;
    op->unit = unit;
    op->when = when;
    op->stream = st;
    op->kind = kind;
    op->transition = transition;
    op->bucket = bucket;
    op->axis = axis;
    op->dtype = dt;
    op->count = count;
    op->src = src;
    op->dst = dst;
    op->event = event;
}

static void record_wait(tb *b, mf_phase ph, int unit, mf_when rw, mf_stream from, mf_when ww,
                        mf_stream to, int event)
{
    add_op(b, ph, unit, rw, from, MF_OP_RECORD, 0, -1, -1, MF_FP32, 0, -1, -1, event);
    add_op(b, ph, unit, ww, to, MF_OP_WAIT, 0, -1, -1, MF_FP32, 0, -1, -1, event);
}

/* One step of a chain before streams are assigned. */
typedef struct step {
    mf_opkind kind;
    int axis;               /* -1 for cast / accumulate */
    mf_dtype dtype;
    int64_t count;
    int src, dst;
    mf_when when;
    int transition;
    mf_stream stream;
} step;

#define MAX_STEPS 16

/* Appends the single-axis steps turning placement `from` into `to` (count =
 * elements per rank at `from`); intermediate results go to new stage buffers
 * and the last one to `dst`. Returns the number of steps, -1 when illegal. */
static int compose(tb *b, int bucket, mf_placement from, mf_placement to, mf_dtype dt, int src,
                   int dst, mf_bufkind stage_kind, mf_when when, int transition, step *out, int n)
{
    const mf_mesh *m = &b->s->mesh;
    int64_t L = b->s->buckets[bucket].length;
    mf_placement cur = from;
    int cur_buf = src;
    int k = m->naxes;
    while (!mf_placement_equal(&cur, &to, k)) {
        int s = mf_layout_flat_start(&cur, k);
        mf_opkind kind = MF_OPKIND_COUNT;
        int axis = -1;
        if (s < k && to.p[s] == MF_PLACE_REPLICATE) {
            kind = MF_OP_ALL_GATHER;
            axis = s;
        } else if (s > 0 && cur.p[s - 1] == MF_PLACE_PARTIAL && to.p[s - 1] == MF_PLACE_FLAT) {
            kind = MF_OP_REDUCE_SCATTER;
            axis = s - 1;
        } else if (s > 0 && cur.p[s - 1] == MF_PLACE_REPLICATE && to.p[s - 1] == MF_PLACE_FLAT) {
            kind = MF_OP_SLICE;
            axis = s - 1;
        } else {
            for (int j = k - 1; j >= 0 && axis < 0; j--)
                if (cur.p[j] == MF_PLACE_PARTIAL && to.p[j] == MF_PLACE_REPLICATE) {
                    kind = MF_OP_ALL_REDUCE;
                    axis = j;
                }
        }
        if (axis < 0 || n >= MAX_STEPS) {
            snprintf(b->err, b->errlen, "no single-axis step leads from the current placement");
            return -1;
        }
        mf_placement next = cur;
        next.p[axis] = kind == MF_OP_ALL_GATHER || kind == MF_OP_ALL_REDUCE ? MF_PLACE_REPLICATE
                                                                            : MF_PLACE_FLAT;
        int64_t in_count = L / mf_layout_shards(m, &cur);
        int64_t out_count = L / mf_layout_shards(m, &next);
        int out_buf = dst;
        if (!mf_placement_equal(&next, &to, k)) {
            char suffix[32];
            snprintf(suffix, sizeof suffix, "%s%d", stage_kind == MF_BUF_WEIGHT_STAGE ? "wstage" : "gstage",
                     (int)b->bufs.len);
            out_buf = add_buffer(b, bucket, stage_kind, dt, next, out_count, MF_LIFETIME_STEP, suffix);
        }
        step *st = &out[n++];
        st->kind = kind;
        st->axis = axis;
        st->dtype = dt;
        st->count = kind == MF_OP_ALL_GATHER ? in_count : kind == MF_OP_ALL_REDUCE ? in_count : out_count;
        st->src = cur_buf;
        st->dst = out_buf;
        st->when = when;
        st->transition = transition;
        cur = next;
        cur_buf = out_buf;
    }
    return n;
}

static mf_stream stream_of_axis(const tb *b, int axis)
{
    return axis == b->s->mesh.naxes - 1 ? MF_STREAM_INNER : MF_STREAM_OUTER;
}

static int new_event(tb *b)
{
    return b->nevents++;
}

/* The compute record that opens a hook (emitted once per hook). */
static int hook_event(tb *b, mf_phase ph, int unit)
{
    int slot = unit < 0 ? MF_TB_MAX_UNITS : unit;
    if (!b->hook_recorded[ph][slot]) {
        b->hook_event[ph][slot] = new_event(b);
        b->hook_recorded[ph][slot] = true;
        add_op(b, ph, unit, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_RECORD, 0, -1, -1, MF_FP32, 0, -1,
               -1, b->hook_event[ph][slot]);
    }
    return b->hook_event[ph][slot];
}

/*
 * Emits a chain at a hook: assigns streams (collectives by axis; local ops
 * follow the previous collective, else the next, else inner), makes every
 * stream the chain uses wait for the hook's compute record and for the
 * chain's previous instance (`chain_event`) and for `after_event` (a chain
 * that must finish first; -1 for none), joins consecutive ops on
 * different streams, and, when `compute_reads`, makes compute wait for the
 * end. Returns the event recorded at the chain's end.
 */
static int emit_chain(tb *b, mf_phase ph, int unit, int bucket, step *steps, int n, int chain_event,
                      int after_event, bool compute_reads)
{
    if (n == 0)
        return -1;
    for (int i = 0; i < n; i++)
        steps[i].stream = MF_STREAM_COUNT;
    for (int i = 0; i < n; i++)
        if (steps[i].kind == MF_OP_ALL_GATHER || steps[i].kind == MF_OP_REDUCE_SCATTER ||
            steps[i].kind == MF_OP_ALL_REDUCE)
            steps[i].stream = stream_of_axis(b, steps[i].axis);
    for (int i = 0; i < n; i++) {
        if (steps[i].stream != MF_STREAM_COUNT)
            continue;
        for (int j = i - 1; j >= 0 && steps[i].stream == MF_STREAM_COUNT; j--)
            if (steps[j].stream != MF_STREAM_COUNT)
                steps[i].stream = steps[j].stream;
        for (int j = i + 1; j < n && steps[i].stream == MF_STREAM_COUNT; j++)
            if (steps[j].stream != MF_STREAM_COUNT)
                steps[i].stream = steps[j].stream;
        if (steps[i].stream == MF_STREAM_COUNT)
            steps[i].stream = MF_STREAM_INNER;
    }
    int he = hook_event(b, ph, unit);
    bool joined[MF_STREAM_COUNT] = {false};
    for (int i = 0; i < n; i++) {
        mf_stream st = steps[i].stream;
        if (!joined[st]) {
            add_op(b, ph, unit, MF_WHEN_EVERY, st, MF_OP_WAIT, 0, -1, -1, MF_FP32, 0, -1, -1, he);
            add_op(b, ph, unit, MF_WHEN_EVERY, st, MF_OP_WAIT, 0, -1, -1, MF_FP32, 0, -1, -1,
                   chain_event);
            if (after_event >= 0)
                add_op(b, ph, unit, MF_WHEN_EVERY, st, MF_OP_WAIT, 0, -1, -1, MF_FP32, 0, -1, -1,
                       after_event);
            joined[st] = true;
        }
        if (i > 0 && steps[i - 1].stream != st) {
            int e = new_event(b);
            record_wait(b, ph, unit, steps[i - 1].when, steps[i - 1].stream, steps[i].when, st, e);
        }
        const step *p = &steps[i];
        add_op(b, ph, unit, p->when, st, p->kind, p->transition, bucket, p->axis, p->dtype, p->count,
               p->src, p->dst, -1);
    }
    /* The chain's end: the next instance and (maybe) compute wait for it. */
    add_op(b, ph, unit, steps[n - 1].when, steps[n - 1].stream, MF_OP_RECORD, 0, -1, -1, MF_FP32, 0,
           -1, -1, chain_event);
    if (compute_reads)
        add_op(b, ph, unit, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_WAIT, 0, -1, -1, MF_FP32, 0, -1,
               -1, chain_event);
    return chain_event;
}

static int find_buffer(tb *b, int bucket, mf_bufkind kind)
{
    const mf_buffer *bufs = b->bufs.data;
    for (size_t i = 0; i < b->bufs.len; i++)
        if (bufs[i].bucket == bucket && bufs[i].kind == kind)
            return (int)i;
    return -1;
}

static uint8_t fnv_fill(uint8_t out[32], const void *data, size_t len, uint64_t seed)
{
    const uint8_t *p = data;
    for (int w = 0; w < 4; w++) {
        uint64_t h = 1469598103934665603ull ^ (seed + (uint64_t)w * 0x9e3779b97f4a7c15ull);
        for (size_t i = 0; i < len; i++) {
            h ^= p[i];
            h *= 1099511628211ull;
        }
        memcpy(out + 8 * w, &h, 8);
    }
    return out[0];
}

/* Status of the builder's steps: 0, or TB_OOM, or TB_FAIL (err set). */
enum { TB_OK = 0, TB_OOM = -1, TB_FAIL = -2 };

/* Buckets: per unit, one per layout used, in first-use order. */
static int tb_buckets(tb *b, const mf_tb_spec *spec, mf_bucket *buckets, int *nb_out)
{
    mf_schedule *s = b->s;
    char *err = b->err;
    size_t errlen = b->errlen;
    int k = spec->naxes, nb = 0;
    for (int u = 0; u < spec->nunits; u++) {
        const mf_tb_unit *tu = &spec->units[u];
        s->units[u].name = mf_arena_strdup(s->arena, tu->name);
        s->units[u].reshard_after_forward = !tu->keep_after_forward;
        s->units[u].first_bucket = nb;
        for (int l = 0; l < spec->nlayouts; l++) {
            int count = 0;
            for (int t = 0; t < tu->ntensors; t++)
                count += tu->tensors[t].layout == l;
            if (!count)
                continue;
            mf_bucket *bk = &buckets[nb];
            bk->name = mf_arena_printf(s->arena, "%s/l%d", tu->name, l);
            bk->unit = bk->last_unit = u;
            bk->layout = mf_arena_printf(s->arena, "l%d", l);
            for (int r = 0; r < MF_ROLE_COUNT; r++) {
                bk->dtype[r] = spec->layouts[l].dtype[r];
                bk->place[r] = parse_place(spec->layouts[l].place[r], k);
                if (!mf_layout_flat_suffix_ok(&bk->place[r], k)) {
                    snprintf(err, errlen, "layout %d: Flat axes must be a suffix", l);
                    return TB_FAIL;
                }
            }
            bk->tensors = mf_arena_array(s->arena, (size_t)count, sizeof *bk->tensors);
            if (!bk->tensors)
                return TB_OOM;
            int64_t at = 0;
            for (int t = 0; t < tu->ntensors; t++) {
                if (tu->tensors[t].layout != l)
                    continue;
                mf_tensor *tn = &bk->tensors[bk->ntensors++];
                tn->name = mf_arena_printf(s->arena, "%s.%s", tu->name, tu->tensors[t].name);
                tn->ndims = 1;
                tn->dims[0] = tu->tensors[t].numel;
                tn->numel = tu->tensors[t].numel;
                tn->offset = at;
                at = (at + tn->numel + 7) / 8 * 8;
            }
            bk->used = at;
            int64_t quantum = s->mesh.world * 128;
            bk->length = (at + quantum - 1) / quantum * quantum;
            if (bk->length == 0)
                bk->length = quantum;
            nb++;
        }
        s->units[u].nbuckets = nb - s->units[u].first_bucket;
    }
    *nb_out = nb;
    return TB_OK;
}

/* The normative buffers of every bucket. */
static int tb_buffers(tb *bp, int nb)
{
    const mf_schedule *s = bp->s;
    const mf_bucket *buckets = s->buckets;
    int k = s->mesh.naxes;
    for (int bi = 0; bi < nb; bi++) {
        const mf_bucket *bk = &buckets[bi];
        int64_t L = bk->length;
        mf_placement W = bk->place[MF_ROLE_WEIGHT], G = bk->place[MF_ROLE_GRAD],
                     O = bk->place[MF_ROLE_MAIN_WEIGHT];
        mf_placement rep, partial;
        memset(&rep, 0, sizeof rep);
        memset(&partial, 0, sizeof partial);
        for (int j = 0; j < k; j++) {
            rep.p[j] = MF_PLACE_REPLICATE;
            partial.p[j] = MF_PLACE_PARTIAL;
        }
        mf_dtype wd = bk->dtype[MF_ROLE_WEIGHT], gd = bk->dtype[MF_ROLE_GRAD],
                 od = bk->dtype[MF_ROLE_MAIN_WEIGHT];
        add_buffer(bp, bi, MF_BUF_MAIN_WEIGHT, od, O, L / mf_layout_shards(&s->mesh, &O),
                   MF_LIFETIME_PERSISTENT, "main_weight");
        add_buffer(bp, bi, MF_BUF_WEIGHT, wd, W, L / mf_layout_shards(&s->mesh, &W),
                   MF_LIFETIME_PERSISTENT, "weight");
        if (!mf_placement_equal(&W, &rep, k))
            add_buffer(bp, bi, MF_BUF_WEIGHT_FULL, wd, rep, L, MF_LIFETIME_MICROBATCH, "weight_full");
        add_buffer(bp, bi, MF_BUF_GRAD_LOCAL, gd, partial, L, MF_LIFETIME_MICROBATCH, "grad_local");
        add_buffer(bp, bi, MF_BUF_GRAD, gd, G, L / mf_layout_shards(&s->mesh, &G),
                   MF_LIFETIME_PERSISTENT, "grad");
        if (!mf_placement_equal(&G, &O, k))
            add_buffer(bp, bi, MF_BUF_GRAD_FINAL, gd, O, L / mf_layout_shards(&s->mesh, &O),
                       MF_LIFETIME_STEP, "grad_final");
        if (bp->oom)
            return TB_OOM;
    }

    return TB_OK;
}

/* T1 and T2 of every bucket at forward_pre (T2 again at backward_pre when
 * the unit reshards), and backward_pre's wait for the previous T3. */
static int tb_gathers(tb *bp, const mf_tb_spec *spec, const int *fwd_chain, const int *bwd_chain)
{
    const mf_schedule *s = bp->s;
    const mf_bucket *buckets = s->buckets;
    int k = s->mesh.naxes;
    for (int u = 0; u < spec->nunits; u++) {
        for (int bi = s->units[u].first_bucket; bi < s->units[u].first_bucket + s->units[u].nbuckets; bi++) {
            const mf_bucket *bk = &buckets[bi];
            mf_placement W = bk->place[MF_ROLE_WEIGHT], O = bk->place[MF_ROLE_MAIN_WEIGHT];
            mf_placement rep;
            memset(&rep, 0, sizeof rep);
            for (int j = 0; j < k; j++)
                rep.p[j] = MF_PLACE_REPLICATE;
            mf_dtype wd = bk->dtype[MF_ROLE_WEIGHT];
            int mw = find_buffer(bp, bi, MF_BUF_MAIN_WEIGHT), w = find_buffer(bp, bi, MF_BUF_WEIGHT);
            int full = find_buffer(bp, bi, MF_BUF_WEIGHT_FULL);
            step steps[MAX_STEPS];
            int n = 0;
            /* T1: cast at O, then O -> W. */
            int cast_dst = w;
            if (!mf_placement_equal(&O, &W, k))
                cast_dst = add_buffer(bp, bi, MF_BUF_WEIGHT_STAGE, wd, O,
                                      bk->length / mf_layout_shards(&s->mesh, &O), MF_LIFETIME_STEP,
                                      "wcast");
            steps[n++] = (step){MF_OP_CAST, -1, wd, bk->length / mf_layout_shards(&s->mesh, &O), mw,
                                cast_dst, MF_WHEN_FIRST, 1, MF_STREAM_COUNT};
            if (cast_dst != w)
                n = compose(bp, bi, O, W, wd, cast_dst, w, MF_BUF_WEIGHT_STAGE, MF_WHEN_FIRST, 1, steps, n);
            if (n < 0)
                return TB_FAIL;
            /* T2: W -> Rep into weight_full. */
            int t2_start = n;
            if (full >= 0)
                n = compose(bp, bi, W, rep, wd, w, full, MF_BUF_WEIGHT_STAGE, MF_WHEN_EVERY, 2, steps, n);
            if (n < 0)
                return TB_FAIL;
            emit_chain(bp, MF_PHASE_FORWARD_PRE, u, bi, steps, n, fwd_chain[bi], -1, true);
            if (full >= 0 && s->units[u].reshard_after_forward) {
                step again[MAX_STEPS];
                int m = 0;
                for (int i = t2_start; i < n; i++)
                    again[m++] = steps[i];
                emit_chain(bp, MF_PHASE_BACKWARD_PRE, u, bi, again, m, fwd_chain[bi], -1, true);
            }
            /* The trainer overwrites grad_local at backward: wait until the
             * previous microbatch's T3 read it. */
            hook_event(bp, MF_PHASE_BACKWARD_PRE, u);
            add_op(bp, MF_PHASE_BACKWARD_PRE, u, MF_WHEN_EVERY, MF_STREAM_COMPUTE, MF_OP_WAIT, 0, -1, -1,
                   MF_FP32, 0, -1, -1, bwd_chain[bi]);
            if (bp->oom)
                return TB_OOM;
        }
    }
    return TB_OK;
}

/* T3 and T4 of every bucket at backward_post. */
static int tb_reductions(tb *bp, const mf_tb_spec *spec, const int *bwd_chain, const int *t4_chain)
{
    const mf_schedule *s = bp->s;
    const mf_bucket *buckets = s->buckets;
    int k = s->mesh.naxes;
    for (int u = 0; u < spec->nunits; u++) {
        for (int bi = s->units[u].first_bucket; bi < s->units[u].first_bucket + s->units[u].nbuckets; bi++) {
            const mf_bucket *bk = &buckets[bi];
            mf_placement G = bk->place[MF_ROLE_GRAD], O = bk->place[MF_ROLE_MAIN_WEIGHT];
            mf_placement partial;
            memset(&partial, 0, sizeof partial);
            for (int j = 0; j < k; j++)
                partial.p[j] = MF_PLACE_PARTIAL;
            mf_dtype gd = bk->dtype[MF_ROLE_GRAD];
            int local = find_buffer(bp, bi, MF_BUF_GRAD_LOCAL), g = find_buffer(bp, bi, MF_BUF_GRAD);
            int fin = find_buffer(bp, bi, MF_BUF_GRAD_FINAL);
            step steps[MAX_STEPS];
            int n = 0;
            /* T3: local [P..P] -> G into a stage, then accumulate into grad. */
            int64_t gcount = bk->length / mf_layout_shards(&s->mesh, &G);
            int reduced = local;
            if (!mf_placement_equal(&partial, &G, k)) {
                reduced = add_buffer(bp, bi, MF_BUF_GRAD_STAGE, gd, G, gcount, MF_LIFETIME_MICROBATCH,
                                     "greduced");
                n = compose(bp, bi, partial, G, gd, local, reduced, MF_BUF_GRAD_STAGE, MF_WHEN_EVERY, 3,
                            steps, n);
                if (n < 0)
                    return TB_FAIL;
            }
            steps[n++] = (step){MF_OP_ACCUMULATE, -1, gd, gcount, reduced, g, MF_WHEN_EVERY, 3,
                                MF_STREAM_COUNT};
            emit_chain(bp, MF_PHASE_BACKWARD_POST, u, bi, steps, n, bwd_chain[bi], -1, false);
            /* T4: G -> O into grad_final, after T3. */
            if (fin >= 0) {
                step t4[MAX_STEPS];
                int m = compose(bp, bi, G, O, gd, g, fin, MF_BUF_GRAD_STAGE, MF_WHEN_LAST, 4, t4, 0);
                if (m < 0)
                    return TB_FAIL;
                emit_chain(bp, MF_PHASE_BACKWARD_POST, u, bi, t4, m, t4_chain[bi], bwd_chain[bi], false);
            }
            if (bp->oom)
                return TB_OOM;
        }
    }
    return TB_OK;
}

mf_schedule *mf_tb_build(const mf_tb_spec *spec, char *err, size_t errlen)
{
    tb b;
    memset(&b, 0, sizeof b);
    b.err = err;
    b.errlen = errlen;
    err[0] = '\0';
    mf_schedule *s = mf_schedule_new();
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b.s = s;
    mf_vec_init(&b.ops, sizeof(mf_op));
    mf_vec_init(&b.bufs, sizeof(mf_buffer));
    int k = spec->naxes, nb = 0, rc;
    s->source = "test-builder";
    s->mesh.naxes = k;
    s->mesh.world = 1;
    static const char *const axis_names[] = {"dp_a", "dp_b", "dp_c", "dp_d"};
    for (int j = 0; j < k; j++) {
        s->mesh.axes[j].name = k == 2 ? (j == 0 ? "dp_outer" : "dp_inner") : axis_names[j];
        s->mesh.axes[j].size = spec->sizes[j];
        s->mesh.world *= spec->sizes[j];
    }
    s->microbatches = spec->microbatches;
    s->reduce = spec->reduce;
    s->nunits = spec->nunits;
    s->units = mf_arena_array(s->arena, (size_t)spec->nunits, sizeof *s->units);
    mf_bucket *buckets = mf_arena_array(s->arena, MF_TB_MAX_UNITS * MF_TB_MAX_LAYOUTS, sizeof *buckets);
    if (!s->units || !buckets)
        goto oom;
    if ((rc = tb_buckets(&b, spec, buckets, &nb)) != TB_OK)
        goto status;
    s->nbuckets = nb;
    s->buckets = buckets;
    if ((rc = tb_buffers(&b, nb)) != TB_OK)
        goto status;

    /* Ops, hook by hook in the order the trainer calls them (ids ascend
     * within a hook; hooks of different units interleave freely). */
    int *fwd_chain = mf_arena_array(s->arena, (size_t)(nb ? nb : 1), sizeof(int));
    int *bwd_chain = mf_arena_array(s->arena, (size_t)(nb ? nb : 1), sizeof(int));
    int *t4_chain = mf_arena_array(s->arena, (size_t)(nb ? nb : 1), sizeof(int));
    if (!fwd_chain || !bwd_chain || !t4_chain)
        goto oom;
    for (int bi = 0; bi < nb; bi++) {
        fwd_chain[bi] = new_event(&b);
        bwd_chain[bi] = new_event(&b);   /* T3's end: also frees grad_local */
        t4_chain[bi] = new_event(&b);
    }
    if ((rc = tb_gathers(&b, spec, fwd_chain, bwd_chain)) != TB_OK ||
        (rc = tb_reductions(&b, spec, bwd_chain, t4_chain)) != TB_OK)
        goto status;
    /* step_end: compute waits for both streams. */
    for (int st = MF_STREAM_INNER; st < MF_STREAM_COUNT; st++) {
        int e = new_event(&b);
        record_wait(&b, MF_PHASE_STEP_END, -1, MF_WHEN_EVERY, (mf_stream)st, MF_WHEN_EVERY,
                    MF_STREAM_COMPUTE, e);
    }
    if (b.oom)
        goto oom;

    /* Ops were appended hook by hook; the schedule wants ids in issue order
     * within a hook, which appending preserves. Renumber (ids == index). */
    s->nops = (int)b.ops.len;
    s->ops = mf_vec_to_arena(&b.ops, s->arena);
    s->nbuffers = (int)b.bufs.len;
    s->buffers = mf_vec_to_arena(&b.bufs, s->arena);
    s->nevents = b.nevents;
    if (!s->ops || !s->buffers)
        goto oom;
    /* Offsets in one arena and the waits reuse needs (planner/passes/mf_assign.c),
     * as the compiler does. */
    if (!mf_schedule_summarize(s) || !mf_assign_run(s, NULL) || !mf_programs_run(s))
        goto oom;
    /* A hash of the structure (the builder has no file to hash). */
    uint64_t seed = spec->salt;
    fnv_fill(s->hash, s->ops, sizeof(mf_op) * (size_t)s->nops, seed);
    uint8_t more[32];
    fnv_fill(more, &s->mesh.world, sizeof s->mesh.world, seed + s->microbatches);
    for (int i = 0; i < 32; i++)
        s->hash[i] ^= more[i];
    return s;

status:
    if (rc == TB_FAIL)
        goto fail;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    mf_vec_free(&b.ops);
    mf_vec_free(&b.bufs);
    mf_schedule_free(s);
    return NULL;
}
