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
 * with every string printed verbatim and the keys those of the schema table
 * (core/mf_schema.h), their separators built once per writer. That holds only for strings that
 * mf_yaml_str_style() calls plain ([A-Za-z_][A-Za-z0-9_./-]*, not a reserved
 * word): libyaml writes those plain in a flow context. Any other string (one
 * that needs quotes or escapes, or the "?" of an index out of range) sends the
 * whole section back to libyaml (MF_EMIT_LINES_NOT_PLAIN), so quoting stays
 * libyaml's. The loader still parses the file with libyaml; tests/fuzz's
 * round trip and the golden schedules check the bytes.
 */
#include "mf_emit_lines.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mf_schema.h"
#include "mf_yaml_str.h"

/* What comes before the value of each key of a section's flow mapping:
 * "- {key: " for the first, ", key: " for the others (core/mf_schema.h). */
typedef struct mf_lines_seps {
    char text[MF_K_OP_NKEYS][32]; /* the longest key of either section is 10 bytes */
    size_t len[MF_K_OP_NKEYS];
} mf_lines_seps;
_Static_assert((int)MF_K_BUFFER_NKEYS <= (int)MF_K_OP_NKEYS, "mf_lines_seps holds the buffers' keys too");

/* A vocabulary: the plain length of each word, -1 when it is not plain. */
typedef struct mf_lines_vocab {
    int count;
    int len[32];
    const char *word[32];
} mf_lines_vocab;

struct mf_emit_lines {
    const mf_schedule *s;
    int *bucket_len, *buffer_len, *unit_len; /* plain lengths, -1 = not plain; one allocation */
    int axis_len[MF_MAX_AXES];
    mf_lines_vocab dtype, place, bufkind, lifetime, phase, when, stream, opkind;
    mf_lines_seps buffer_seps, op_seps;
    /* output, buffered in 64 KiB blocks; ok is false after a failed write */
    FILE *out;
    bool ok;
    size_t n;
    char buf[1 << 16];
};

static void mf_lines_flush(mf_emit_lines *o)
{
    if (o->n && o->ok && fwrite(o->buf, 1, o->n, o->out) != o->n)
        o->ok = false;
    o->n = 0;
}

static void mf_lines_put(mf_emit_lines *o, const char *p, size_t len)
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

static void mf_lines_int(mf_emit_lines *o, int64_t v)
{
    char buf[24];
    const char *p = mf_yaml_str_int(v, buf);
    mf_lines_put(o, p, (size_t)(buf + sizeof buf - 1 - p));
}

/* Length of v when mf_yaml_str_style() calls it plain, else -1. */
static int mf_lines_plain_len(const char *v)
{
    if (!v || mf_yaml_str_style(v) != YAML_PLAIN_SCALAR_STYLE)
        return -1;
    size_t n = strlen(v);
    return n > (size_t)INT32_MAX ? -1 : (int)n;
}

/* Plain lengths into len[0..n) of n names, the one at field offset `off` of
 * each of the n records of `size` bytes at base; returns len + n. */
static int *mf_lines_names(int *len, const void *base, int n, size_t size, size_t off)
{
    for (int i = 0; i < n; i++) {
        const char *name;
        memcpy(&name, (const char *)base + (size_t)i * size + off, sizeof name);
        len[i] = mf_lines_plain_len(name);
    }
    return len + n;
}

static void mf_lines_seps_init(mf_lines_seps *o, mf_section sec)
{
    const mf_schema_section *s = &mf_schema_sections[sec];
    for (int k = 0; k < s->nkeys && k < MF_K_OP_NKEYS; k++) {
        int n = snprintf(o->text[k], sizeof o->text[k], "%s%s: ", k ? ", " : "- {", s->keys[k].name);
        o->len[k] = n > 0 && (size_t)n < sizeof o->text[k] ? (size_t)n : 0;
    }
}

static void mf_lines_vocab_init(mf_lines_vocab *v, int count, const char *(*name)(int))
{
    v->count = count <= (int)(sizeof v->len / sizeof v->len[0]) ? count : 0; /* 0: nothing is plain */
    for (int i = 0; i < v->count; i++) {
        v->word[i] = name(i);
        v->len[i] = mf_lines_plain_len(v->word[i]);
    }
}

/* Whether word i of v is in range and plain. */
static bool mf_lines_word_ok(const mf_lines_vocab *v, int i) { return i >= 0 && i < v->count && v->len[i] >= 0; }

static void mf_lines_word(mf_emit_lines *o, const mf_lines_vocab *v, int i)
{
    mf_lines_put(o, v->word[i], (size_t)v->len[i]);
}

static const char *mf_lines_dtype(int i) { return mf_dtype_name((mf_dtype)i); }
static const char *mf_lines_place(int i) { return mf_place_name((mf_place)i); }
static const char *mf_lines_bufkind(int i) { return mf_bufkind_name((mf_bufkind)i); }
static const char *mf_lines_lifetime(int i) { return mf_lifetime_name((mf_lifetime)i); }
static const char *mf_lines_phase(int i) { return mf_phase_name((mf_phase)i); }
static const char *mf_lines_when(int i) { return mf_when_name((mf_when)i); }
static const char *mf_lines_stream(int i) { return mf_stream_name((mf_stream)i); }
static const char *mf_lines_opkind(int i) { return mf_opkind_name((mf_opkind)i); }

mf_emit_lines *mf_emit_lines_new(const mf_schedule *s)
{
    mf_emit_lines *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->s = s;
    l->bucket_len = malloc(sizeof *l->bucket_len * ((size_t)s->nbuckets + (size_t)s->nbuffers + (size_t)s->nunits + 1));
    if (!l->bucket_len) {
        free(l);
        return NULL;
    }
    l->buffer_len = mf_lines_names(l->bucket_len, s->buckets, s->nbuckets, sizeof *s->buckets, offsetof(mf_bucket, name));
    l->unit_len = mf_lines_names(l->buffer_len, s->buffers, s->nbuffers, sizeof *s->buffers, offsetof(mf_buffer, name));
    mf_lines_names(l->unit_len, s->units, s->nunits, sizeof *s->units, offsetof(mf_unit, name));
    for (int j = 0; j < MF_MAX_AXES; j++)
        l->axis_len[j] = j < s->mesh.naxes ? mf_lines_plain_len(s->mesh.axes[j].name) : -1;
    mf_lines_vocab_init(&l->dtype, MF_DTYPE_COUNT, mf_lines_dtype);
    mf_lines_vocab_init(&l->place, MF_PLACE_DISTINCT + 1, mf_lines_place); /* the table and Distinct */
    mf_lines_vocab_init(&l->bufkind, MF_BUFKIND_COUNT, mf_lines_bufkind);
    mf_lines_vocab_init(&l->lifetime, MF_LIFETIME_COUNT, mf_lines_lifetime);
    mf_lines_vocab_init(&l->phase, MF_PHASE_COUNT, mf_lines_phase);
    mf_lines_vocab_init(&l->when, MF_WHEN_COUNT, mf_lines_when);
    mf_lines_vocab_init(&l->stream, MF_STREAM_COUNT, mf_lines_stream);
    mf_lines_vocab_init(&l->opkind, MF_OPKIND_COUNT, mf_lines_opkind);
    mf_lines_seps_init(&l->buffer_seps, MF_SECTION_BUFFER);
    mf_lines_seps_init(&l->op_seps, MF_SECTION_OP);
    return l;
}

void mf_emit_lines_free(mf_emit_lines *l)
{
    if (l)
        free(l->bucket_len);
    free(l);
}

static bool mf_lines_in(int v, int count) { return v >= 0 && v < count; }

/* Whether every buffer can be written directly (see the file comment). */
static bool mf_lines_buffers_plain(const mf_emit_lines *l)
{
    const mf_schedule *s = l->s;
    if (s->mesh.naxes > MF_MAX_AXES)
        return false;
    for (int i = 0; i < s->nbuffers; i++) {
        const mf_buffer *bf = &s->buffers[i];
        if (l->buffer_len[i] < 0 || !mf_lines_in(bf->bucket, s->nbuckets) || l->bucket_len[bf->bucket] < 0 ||
            !mf_lines_word_ok(&l->bufkind, (int)bf->kind) || !mf_lines_word_ok(&l->dtype, (int)bf->dtype) ||
            !mf_lines_word_ok(&l->lifetime, (int)bf->lifetime))
            return false;
        for (int j = 0; j < s->mesh.naxes; j++)
            if (!mf_lines_word_ok(&l->place, (int)bf->place.p[j]))
                return false;
    }
    return true;
}

/* The separator and key before a value: "- {key: " or ", key: ". */
static void mf_lines_key(mf_emit_lines *o, const mf_lines_seps *seps, int key)
{
    mf_lines_put(o, seps->text[key], seps->len[key]);
}

/* key: a name of the schedule, `len` its plain length */
static void mf_lines_kv_name(mf_emit_lines *o, const mf_lines_seps *seps, int key, const char *name, int len)
{
    mf_lines_key(o, seps, key);
    mf_lines_put(o, name, (size_t)len);
}

/* key: word i of a vocabulary */
static void mf_lines_kv_word(mf_emit_lines *o, const mf_lines_seps *seps, int key, const mf_lines_vocab *v, int i)
{
    mf_lines_key(o, seps, key);
    mf_lines_word(o, v, i);
}

static void mf_lines_kv_int(mf_emit_lines *o, const mf_lines_seps *seps, int key, int64_t v)
{
    mf_lines_key(o, seps, key);
    mf_lines_int(o, v);
}

static void mf_lines_buffer(mf_emit_lines *o, int i)
{
    const mf_schedule *s = o->s;
    const mf_buffer *bf = &s->buffers[i];
    const mf_lines_seps *k = &o->buffer_seps;
    mf_lines_kv_name(o, k, MF_K_BUFFER_NAME, bf->name, o->buffer_len[i]);
    mf_lines_kv_name(o, k, MF_K_BUFFER_BUCKET, s->buckets[bf->bucket].name, o->bucket_len[bf->bucket]);
    mf_lines_kv_word(o, k, MF_K_BUFFER_KIND, &o->bufkind, (int)bf->kind);
    mf_lines_kv_word(o, k, MF_K_BUFFER_DTYPE, &o->dtype, (int)bf->dtype);
    mf_lines_key(o, k, MF_K_BUFFER_PLACEMENT);
    MF_LINES_LIT(o, "[");
    for (int j = 0; j < s->mesh.naxes; j++) {
        if (j)
            MF_LINES_LIT(o, ", ");
        mf_lines_word(o, &o->place, bf->place.p[j]);
    }
    MF_LINES_LIT(o, "]");
    mf_lines_kv_int(o, k, MF_K_BUFFER_COUNT, bf->count);
    mf_lines_kv_word(o, k, MF_K_BUFFER_LIFETIME, &o->lifetime, (int)bf->lifetime);
    mf_lines_kv_int(o, k, MF_K_BUFFER_OFFSET, bf->offset);
    MF_LINES_LIT(o, "}\n");
}

/* A section of the root mapping: its key, then one line per item
 * ("key: []" when it has none). */
static int mf_lines_section(mf_emit_lines *l, FILE *out, const mf_schema_key *key, int n,
                            void (*item)(mf_emit_lines *, int))
{
    l->out = out;
    l->ok = true;
    l->n = 0;
    mf_lines_put(l, key->name, key->len);
    if (n == 0)
        MF_LINES_LIT(l, ": []\n");
    else
        MF_LINES_LIT(l, ":\n");
    for (int i = 0; i < n; i++)
        item(l, i);
    mf_lines_flush(l);
    return l->ok ? MF_EMIT_LINES_OK : MF_EMIT_LINES_IO;
}

int mf_emit_lines_buffers(mf_emit_lines *l, FILE *out)
{
    if (!l || !mf_lines_buffers_plain(l))
        return MF_EMIT_LINES_NOT_PLAIN;
    return mf_lines_section(l, out, MF_KEY(ROOT, BUFFERS), l->s->nbuffers, mf_lines_buffer);
}

static bool mf_lines_has_unit(const mf_op *op)
{
    return op->phase != MF_PHASE_STEP_BEGIN && op->phase != MF_PHASE_STEP_END;
}

static bool mf_lines_is_event(const mf_op *op) { return op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT; }

static bool mf_lines_op_plain(const mf_emit_lines *l, const mf_op *op)
{
    const mf_schedule *s = l->s;
    if (!mf_lines_word_ok(&l->phase, (int)op->phase) || !mf_lines_word_ok(&l->when, (int)op->when) ||
        !mf_lines_word_ok(&l->stream, (int)op->stream) || !mf_lines_word_ok(&l->opkind, (int)op->kind))
        return false;
    if (mf_lines_has_unit(op) && (!mf_lines_in(op->unit, s->nunits) || l->unit_len[op->unit] < 0))
        return false;
    if (mf_lines_is_event(op))
        return true;
    return op->transition >= 0 && op->transition <= 4 && mf_lines_in(op->bucket, s->nbuckets) &&
           l->bucket_len[op->bucket] >= 0 &&
           (op->axis < 0 || (op->axis < s->mesh.naxes && op->axis < MF_MAX_AXES && l->axis_len[op->axis] >= 0)) &&
           mf_lines_word_ok(&l->dtype, (int)op->dtype) && mf_lines_in(op->src, s->nbuffers) &&
           l->buffer_len[op->src] >= 0 && mf_lines_in(op->dst, s->nbuffers) && l->buffer_len[op->dst] >= 0;
}

static void mf_lines_op(mf_emit_lines *o, int i)
{
    static const char *const tnames[] = {"T0", "T1", "T2", "T3", "T4"};
    const mf_schedule *s = o->s;
    const mf_op *op = &s->ops[i];
    const mf_lines_seps *k = &o->op_seps;
    mf_lines_kv_int(o, k, MF_K_OP_ID, op->id);
    mf_lines_kv_word(o, k, MF_K_OP_PHASE, &o->phase, (int)op->phase);
    if (mf_lines_has_unit(op))
        mf_lines_kv_name(o, k, MF_K_OP_UNIT, s->units[op->unit].name, o->unit_len[op->unit]);
    mf_lines_kv_word(o, k, MF_K_OP_WHEN, &o->when, (int)op->when);
    mf_lines_kv_word(o, k, MF_K_OP_STREAM, &o->stream, (int)op->stream);
    mf_lines_kv_word(o, k, MF_K_OP_OP, &o->opkind, (int)op->kind);
    if (mf_lines_is_event(op)) {
        mf_lines_kv_int(o, k, MF_K_OP_EVENT, op->event);
        MF_LINES_LIT(o, "}\n");
        return;
    }
    mf_lines_kv_name(o, k, MF_K_OP_TRANSITION, tnames[op->transition], 2);
    mf_lines_kv_name(o, k, MF_K_OP_BUCKET, s->buckets[op->bucket].name, o->bucket_len[op->bucket]);
    if (op->axis >= 0)
        mf_lines_kv_name(o, k, MF_K_OP_AXIS, s->mesh.axes[op->axis].name, o->axis_len[op->axis]);
    mf_lines_kv_word(o, k, MF_K_OP_DTYPE, &o->dtype, (int)op->dtype);
    mf_lines_kv_int(o, k, MF_K_OP_COUNT, op->count);
    mf_lines_kv_name(o, k, MF_K_OP_SRC, s->buffers[op->src].name, o->buffer_len[op->src]);
    mf_lines_kv_name(o, k, MF_K_OP_DST, s->buffers[op->dst].name, o->buffer_len[op->dst]);
    MF_LINES_LIT(o, "}\n");
}

int mf_emit_lines_ops(mf_emit_lines *l, FILE *out)
{
    if (!l)
        return MF_EMIT_LINES_NOT_PLAIN;
    for (int i = 0; i < l->s->nops; i++)
        if (!mf_lines_op_plain(l, &l->s->ops[i]))
            return MF_EMIT_LINES_NOT_PLAIN;
    return mf_lines_section(l, out, MF_KEY(ROOT, OPS), l->s->nops, mf_lines_op);
}
