/*
 * mf_emit_lines: the `buffers:` and `ops:` sections written without libyaml's
 * emitter (see mf_emit_lines.h for the contract).
 *
 * Why these two sections bypass the emitter: they hold one line per buffer and
 * per op (475 000 op lines at 100 000 tensors in bench/planner's deep shape)
 * and libyaml costs an allocated event, a copy and a style analysis per scalar:
 * a third of a whole compile. Their lines have a fixed shape, so they are
 * written here byte for byte as libyaml writes them with mf_emit.c's settings
 * (indent 2, no width limit, "\n" breaks):
 *
 *   key:\n                      the section key, then one line per item:
 *   - {k1: v1, k2: v2, ...}\n    a flow mapping in an indentless block sequence
 *   - {..., placement: [a, b], ...}\n   a flow sequence inside it
 *   key: []\n                   the section when it has no items
 *
 * with every string printed verbatim. That holds only for strings that
 * mf_yaml_str_style() calls plain ([A-Za-z_][A-Za-z0-9_./-]*, not a reserved
 * word): libyaml writes those plain in a flow context. Any other string (one
 * that needs quotes or escapes, or the "?" of an index out of range) sends the
 * whole section back to libyaml (MF_EMIT_LINES_NOT_PLAIN), so quoting stays
 * libyaml's. The loader still parses the file with libyaml; tests/fuzz's
 * round trip and the golden schedules check the bytes.
 */
#include "mf_emit_lines.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mf_yaml_str.h"

/* Output buffered in 64 KiB blocks; ok is false after the first failed write. */
typedef struct mf_lines_out {
    FILE *out;
    bool ok;
    size_t n;
    char buf[1 << 16];
} mf_lines_out;

static void mf_lines_flush(mf_lines_out *o)
{
    if (o->n && o->ok && fwrite(o->buf, 1, o->n, o->out) != o->n)
        o->ok = false;
    o->n = 0;
}

static void mf_lines_put(mf_lines_out *o, const char *p, size_t len)
{
    if (len > sizeof o->buf - o->n) {
        mf_lines_flush(o);
        if (len > sizeof o->buf) {
            if (o->ok && fwrite(p, 1, len, o->out) != len)
                o->ok = false;
            return;
        }
    }
    memcpy(o->buf + o->n, p, len);
    o->n += len;
}

#define MF_LINES_LIT(o, lit) mf_lines_put((o), (lit), sizeof(lit) - 1)

static void mf_lines_int(mf_lines_out *o, int64_t v)
{
    char tmp[24], *p = tmp + sizeof tmp;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    mf_lines_put(o, p, (size_t)(tmp + sizeof tmp - p));
}

/* Length of v when mf_yaml_str_style() calls it plain, else -1. */
static int mf_lines_plain_len(const char *v)
{
    if (!v || mf_yaml_str_style(v) != YAML_PLAIN_SCALAR_STYLE)
        return -1;
    size_t n = strlen(v);
    return n > (size_t)INT32_MAX ? -1 : (int)n;
}

/* The plain lengths of n names (name_at(s, i)); NULL when out of memory.
 * *all_plain: whether every one is plain. Caller frees. */
static int *mf_lines_names(const mf_schedule *s, int n, const char *(*name_at)(const mf_schedule *, int),
                           bool *all_plain)
{
    int *len = malloc(sizeof *len * (size_t)(n > 0 ? n : 1));
    *all_plain = true;
    for (int i = 0; len && i < n; i++) {
        len[i] = mf_lines_plain_len(name_at(s, i));
        if (len[i] < 0)
            *all_plain = false;
    }
    return len;
}

static const char *mf_lines_bucket_at(const mf_schedule *s, int i) { return s->buckets[i].name; }
static const char *mf_lines_buffer_at(const mf_schedule *s, int i) { return s->buffers[i].name; }
static const char *mf_lines_unit_at(const mf_schedule *s, int i) { return s->units[i].name; }

/* Whether every name of a vocabulary (name(0) .. name(count - 1)) is plain. */
static bool mf_lines_words_plain(const char *(*name)(int), int count)
{
    for (int i = 0; i < count; i++)
        if (mf_lines_plain_len(name(i)) < 0)
            return false;
    return true;
}

static const char *mf_lines_dtype(int i) { return mf_dtype_name((mf_dtype)i); }
static const char *mf_lines_place(int i) { return mf_place_name((mf_place)i); }
static const char *mf_lines_bufkind(int i) { return mf_bufkind_name((mf_bufkind)i); }
static const char *mf_lines_lifetime(int i) { return mf_lifetime_name((mf_lifetime)i); }
static const char *mf_lines_phase(int i) { return mf_phase_name((mf_phase)i); }
static const char *mf_lines_when(int i) { return mf_when_name((mf_when)i); }
static const char *mf_lines_stream(int i) { return mf_stream_name((mf_stream)i); }
static const char *mf_lines_opkind(int i) { return mf_opkind_name((mf_opkind)i); }

static bool mf_lines_in(int v, int count) { return v >= 0 && v < count; }

static void mf_lines_word(mf_lines_out *o, const char *w) { mf_lines_put(o, w, strlen(w)); }

static bool mf_lines_buffers_plain(const mf_schedule *s, const int *bucket_len)
{
    if (!mf_lines_words_plain(mf_lines_dtype, MF_DTYPE_COUNT) ||
        !mf_lines_words_plain(mf_lines_place, MF_PLACE_COUNT) ||
        !mf_lines_words_plain(mf_lines_bufkind, MF_BUFKIND_COUNT) ||
        !mf_lines_words_plain(mf_lines_lifetime, MF_LIFETIME_COUNT))
        return false;
    for (int i = 0; i < s->nbuffers; i++) {
        const mf_buffer *bf = &s->buffers[i];
        if (!mf_lines_in(bf->bucket, s->nbuckets) || bucket_len[bf->bucket] < 0 ||
            !mf_lines_in((int)bf->kind, MF_BUFKIND_COUNT) || !mf_lines_in((int)bf->dtype, MF_DTYPE_COUNT) ||
            !mf_lines_in((int)bf->lifetime, MF_LIFETIME_COUNT))
            return false;
        for (int j = 0; j < s->mesh.naxes; j++)
            if (!mf_lines_in((int)bf->place.p[j], MF_PLACE_COUNT))
                return false;
    }
    return true;
}

static void mf_lines_buffer(mf_lines_out *o, const mf_schedule *s, const mf_buffer *bf, int name_len,
                            const int *bucket_len)
{
    MF_LINES_LIT(o, "- {name: ");
    mf_lines_put(o, bf->name, (size_t)name_len);
    MF_LINES_LIT(o, ", bucket: ");
    mf_lines_put(o, s->buckets[bf->bucket].name, (size_t)bucket_len[bf->bucket]);
    MF_LINES_LIT(o, ", kind: ");
    mf_lines_word(o, mf_bufkind_name(bf->kind));
    MF_LINES_LIT(o, ", dtype: ");
    mf_lines_word(o, mf_dtype_name(bf->dtype));
    MF_LINES_LIT(o, ", placement: [");
    for (int j = 0; j < s->mesh.naxes; j++) {
        if (j)
            MF_LINES_LIT(o, ", ");
        mf_lines_word(o, mf_place_name((mf_place)bf->place.p[j]));
    }
    MF_LINES_LIT(o, "], count: ");
    mf_lines_int(o, bf->count);
    MF_LINES_LIT(o, ", lifetime: ");
    mf_lines_word(o, mf_lifetime_name(bf->lifetime));
    MF_LINES_LIT(o, ", offset: ");
    mf_lines_int(o, bf->offset);
    MF_LINES_LIT(o, "}\n");
}

int mf_emit_lines_buffers(const mf_schedule *s, FILE *out)
{
    int rc = MF_EMIT_LINES_NOT_PLAIN;
    bool buckets_plain, buffers_plain;
    mf_lines_out *o = NULL;
    int *bucket_len = mf_lines_names(s, s->nbuckets, mf_lines_bucket_at, &buckets_plain);
    int *buffer_len = mf_lines_names(s, s->nbuffers, mf_lines_buffer_at, &buffers_plain);
    (void)buckets_plain; /* a bucket no buffer names may need quotes */
    if (!bucket_len || !buffer_len || !buffers_plain || !mf_lines_buffers_plain(s, bucket_len))
        goto out;
    o = malloc(sizeof *o);
    if (!o)
        goto out;
    o->out = out;
    o->ok = true;
    o->n = 0;
    if (s->nbuffers == 0)
        MF_LINES_LIT(o, "buffers: []\n");
    else
        MF_LINES_LIT(o, "buffers:\n");
    for (int i = 0; i < s->nbuffers; i++)
        mf_lines_buffer(o, s, &s->buffers[i], buffer_len[i], bucket_len);
    mf_lines_flush(o);
    rc = o->ok ? MF_EMIT_LINES_OK : MF_EMIT_LINES_IO;
out:
    free(o);
    free(bucket_len);
    free(buffer_len);
    return rc;
}

/* The plain lengths of the names ops print, and of the op vocabularies. */
typedef struct mf_lines_op_names {
    int *bucket_len, *buffer_len, *unit_len;
    int axis_len[MF_MAX_AXES];
} mf_lines_op_names;

static bool mf_lines_op_plain(const mf_schedule *s, const mf_op *op, const mf_lines_op_names *nm)
{
    if (!mf_lines_in((int)op->phase, MF_PHASE_COUNT) || !mf_lines_in((int)op->when, MF_WHEN_COUNT) ||
        !mf_lines_in((int)op->stream, MF_STREAM_COUNT) || !mf_lines_in((int)op->kind, MF_OPKIND_COUNT))
        return false;
    if (op->phase != MF_PHASE_STEP_BEGIN && op->phase != MF_PHASE_STEP_END &&
        (!mf_lines_in(op->unit, s->nunits) || nm->unit_len[op->unit] < 0))
        return false;
    if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT)
        return true;
    return op->transition >= 0 && op->transition <= 4 && mf_lines_in(op->bucket, s->nbuckets) &&
           nm->bucket_len[op->bucket] >= 0 && (op->axis < 0 || (op->axis < s->mesh.naxes && nm->axis_len[op->axis] >= 0)) &&
           mf_lines_in((int)op->dtype, MF_DTYPE_COUNT) && mf_lines_in(op->src, s->nbuffers) &&
           nm->buffer_len[op->src] >= 0 && mf_lines_in(op->dst, s->nbuffers) && nm->buffer_len[op->dst] >= 0;
}

static void mf_lines_op(mf_lines_out *o, const mf_schedule *s, const mf_op *op, const mf_lines_op_names *nm)
{
    static const char *const tnames[] = {"T0", "T1", "T2", "T3", "T4"};
    MF_LINES_LIT(o, "- {id: ");
    mf_lines_int(o, op->id);
    MF_LINES_LIT(o, ", phase: ");
    mf_lines_word(o, mf_phase_name(op->phase));
    if (op->phase != MF_PHASE_STEP_BEGIN && op->phase != MF_PHASE_STEP_END) {
        MF_LINES_LIT(o, ", unit: ");
        mf_lines_put(o, s->units[op->unit].name, (size_t)nm->unit_len[op->unit]);
    }
    MF_LINES_LIT(o, ", when: ");
    mf_lines_word(o, mf_when_name(op->when));
    MF_LINES_LIT(o, ", stream: ");
    mf_lines_word(o, mf_stream_name(op->stream));
    MF_LINES_LIT(o, ", op: ");
    mf_lines_word(o, mf_opkind_name(op->kind));
    if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT) {
        MF_LINES_LIT(o, ", event: ");
        mf_lines_int(o, op->event);
        MF_LINES_LIT(o, "}\n");
        return;
    }
    MF_LINES_LIT(o, ", transition: ");
    mf_lines_put(o, tnames[op->transition], 2);
    MF_LINES_LIT(o, ", bucket: ");
    mf_lines_put(o, s->buckets[op->bucket].name, (size_t)nm->bucket_len[op->bucket]);
    if (op->axis >= 0) {
        MF_LINES_LIT(o, ", axis: ");
        mf_lines_put(o, s->mesh.axes[op->axis].name, (size_t)nm->axis_len[op->axis]);
    }
    MF_LINES_LIT(o, ", dtype: ");
    mf_lines_word(o, mf_dtype_name(op->dtype));
    MF_LINES_LIT(o, ", count: ");
    mf_lines_int(o, op->count);
    MF_LINES_LIT(o, ", src: ");
    mf_lines_put(o, s->buffers[op->src].name, (size_t)nm->buffer_len[op->src]);
    MF_LINES_LIT(o, ", dst: ");
    mf_lines_put(o, s->buffers[op->dst].name, (size_t)nm->buffer_len[op->dst]);
    MF_LINES_LIT(o, "}\n");
}

/* Whether every op can be written directly (see the file comment). */
static bool mf_lines_ops_plain(const mf_schedule *s, const mf_lines_op_names *nm)
{
    if (!mf_lines_words_plain(mf_lines_phase, MF_PHASE_COUNT) ||
        !mf_lines_words_plain(mf_lines_when, MF_WHEN_COUNT) ||
        !mf_lines_words_plain(mf_lines_stream, MF_STREAM_COUNT) ||
        !mf_lines_words_plain(mf_lines_opkind, MF_OPKIND_COUNT) ||
        !mf_lines_words_plain(mf_lines_dtype, MF_DTYPE_COUNT))
        return false;
    for (int i = 0; i < s->nops; i++)
        if (!mf_lines_op_plain(s, &s->ops[i], nm))
            return false;
    return true;
}

int mf_emit_lines_ops(const mf_schedule *s, FILE *out)
{
    int rc = MF_EMIT_LINES_NOT_PLAIN;
    bool all;
    mf_lines_out *o = NULL;
    mf_lines_op_names nm = {0};
    nm.bucket_len = mf_lines_names(s, s->nbuckets, mf_lines_bucket_at, &all);
    nm.buffer_len = mf_lines_names(s, s->nbuffers, mf_lines_buffer_at, &all);
    nm.unit_len = mf_lines_names(s, s->nunits, mf_lines_unit_at, &all);
    for (int j = 0; j < s->mesh.naxes && j < MF_MAX_AXES; j++)
        nm.axis_len[j] = mf_lines_plain_len(s->mesh.axes[j].name);
    if (!nm.bucket_len || !nm.buffer_len || !nm.unit_len || s->mesh.naxes > MF_MAX_AXES ||
        !mf_lines_ops_plain(s, &nm))
        goto out;
    o = malloc(sizeof *o);
    if (!o)
        goto out;
    o->out = out;
    o->ok = true;
    o->n = 0;
    if (s->nops == 0)
        MF_LINES_LIT(o, "ops: []\n");
    else
        MF_LINES_LIT(o, "ops:\n");
    for (int i = 0; i < s->nops; i++)
        mf_lines_op(o, s, &s->ops[i], &nm);
    mf_lines_flush(o);
    rc = o->ok ? MF_EMIT_LINES_OK : MF_EMIT_LINES_IO;
out:
    free(o);
    free(nm.bucket_len);
    free(nm.buffer_len);
    free(nm.unit_len);
    return rc;
}
