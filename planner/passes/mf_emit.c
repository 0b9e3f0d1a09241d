/*
 * mf_emit: writes a schedule as the canonical YAML of docs/schedule.md §1 with libyaml's
 * emitter; the key names come from the schema table (core/mf_schema.h), in its
 * order (docs/schedule.md describes every key). The `buffers:` and `ops:`
 * sections, one line per buffer and per op, are written directly by
 * mf_emit_lines.c with the same bytes when all their strings are plain: an
 * emitter event per scalar was a third of a large compile (see
 * mf_emit_lines.c for why that is safe).
 *
 * Invariants of the output:
 *   - canonical: the bytes depend only on the schedule; keys come in a fixed
 *     order; no timestamps, no absolute paths (the source path is written as
 *     stored), no floats (every number is an integer);
 *   - one op, one buffer, one unit, one tensor per line (flow mappings, no line
 *     wrapping), so `git diff` of two schedules shows the ops that changed;
 *   - strings are quoted by the project's one rule (core/mf_yaml_str.h);
 *     source_sha256 is always double-quoted;
 *   - exactly what mf_load_schedule_buffer() reads: load -> emit gives the same
 *     bytes.
 */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "mf_emit_lines.h"
#include "mf_layout.h"
#include "mf_passes.h"
#include "mf_schema.h"
#include "mf_yaml_str.h"

typedef struct mf_emit_ctx {
    yaml_emitter_t em;
    const mf_schedule *s;
    FILE *out;
    bool ok;            /* false after the first emitter or write error */
    bool em_live;       /* em is initialized (a segment is open) */
    /* Whether each bucket / buffer name needs quotes, decided once when
     * mf_emit_ops writes the ops (they name them hundreds of thousands of
     * times). NULL (out of memory) = decide each time. */
    yaml_scalar_style_t *bucket_style;
    yaml_scalar_style_t *buffer_style;
    mf_emit_lines *lines; /* the direct writer; NULL: out of memory */
} mf_emit_ctx;

static int mf_emit_write(void *data, unsigned char *buffer, size_t size)
{
    mf_emit_ctx *c = data;
    if (size && fwrite(buffer, 1, size, c->out) != size) {
        c->ok = false;
        return 0;
    }
    return 1;
}

static void mf_emit_event(mf_emit_ctx *c, yaml_event_t *ev, int initialized)
{
    if (!initialized) {
        c->ok = false;
        return;
    }
    if (!c->ok) {
        yaml_event_delete(ev);
        return;
    }
    if (!yaml_emitter_emit(&c->em, ev)) /* takes the event either way */
        c->ok = false;
}

static void mf_emit_scalar_style(mf_emit_ctx *c, const char *v, yaml_scalar_style_t style)
{
    yaml_event_t ev;
    int ok = yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)v, (int)strlen(v), 1, 1,
                                          style);
    mf_emit_event(c, &ev, ok);
}

static void mf_emit_str(mf_emit_ctx *c, const char *v)
{
    if (!v)
        v = "";
    mf_emit_scalar_style(c, v, mf_yaml_str_style(v));
}

static void mf_emit_int(mf_emit_ctx *c, int64_t v)
{
    char buf[24];
    mf_emit_scalar_style(c, mf_yaml_str_int(v, buf), YAML_PLAIN_SCALAR_STYLE);
}

/* Starts a mapping (seq false) or a sequence, flow or block. */
static void mf_emit_begin(mf_emit_ctx *c, bool seq, bool flow)
{
    yaml_event_t ev;
    int ok = seq ? yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                                        flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE)
                 : yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
                                                       flow ? YAML_FLOW_MAPPING_STYLE : YAML_BLOCK_MAPPING_STYLE);
    mf_emit_event(c, &ev, ok);
}

static void mf_emit_end(mf_emit_ctx *c, bool seq)
{
    yaml_event_t ev;
    int ok = seq ? yaml_sequence_end_event_initialize(&ev) : yaml_mapping_end_event_initialize(&ev);
    mf_emit_event(c, &ev, ok);
}

static void mf_emit_map_begin(mf_emit_ctx *c, bool flow) { mf_emit_begin(c, false, flow); }
static void mf_emit_map_end(mf_emit_ctx *c) { mf_emit_end(c, false); }
static void mf_emit_seq_begin(mf_emit_ctx *c, bool flow) { mf_emit_begin(c, true, flow); }
static void mf_emit_seq_end(mf_emit_ctx *c) { mf_emit_end(c, true); }

/* A key of the format (core/mf_schema.h): a fixed identifier, so always plain. */
static void mf_emit_key(mf_emit_ctx *c, const mf_schema_key *k)
{
    mf_emit_scalar_style(c, k->name, YAML_PLAIN_SCALAR_STYLE);
}

static void mf_emit_kv(mf_emit_ctx *c, const mf_schema_key *k, const char *v, yaml_scalar_style_t style)
{
    mf_emit_key(c, k);
    mf_emit_scalar_style(c, v, style);
}

/* key: a vocabulary word (enum name), which is always plain. */
static void mf_emit_kv_word(mf_emit_ctx *c, const mf_schema_key *k, const char *word)
{
    mf_emit_kv(c, k, word, YAML_PLAIN_SCALAR_STYLE);
}

/* key: string value, quoted by the one rule */
static void mf_emit_kv_str(mf_emit_ctx *c, const mf_schema_key *k, const char *v)
{
    v = v ? v : "";
    mf_emit_kv(c, k, v, mf_yaml_str_style(v));
}

static void mf_emit_kv_int(mf_emit_ctx *c, const mf_schema_key *k, int64_t v)
{
    char buf[24];
    mf_emit_kv(c, k, mf_yaml_str_int(v, buf), YAML_PLAIN_SCALAR_STYLE);
}

/* A flow mapping of one int per name of the schedule (axis, role), the names
 * written plain as keys. */
static void mf_emit_int_map(mf_emit_ctx *c, const char *const *names, const int64_t *v, int n)
{
    mf_emit_map_begin(c, true);
    for (int i = 0; i < n; i++) {
        mf_emit_scalar_style(c, names[i], YAML_PLAIN_SCALAR_STYLE);
        mf_emit_int(c, v[i]);
    }
    mf_emit_map_end(c);
}

/* key: a block list of n items, each written by item(c, i). */
static void mf_emit_list(mf_emit_ctx *c, const mf_schema_key *k, int n, void (*item)(mf_emit_ctx *, int))
{
    mf_emit_key(c, k);
    mf_emit_seq_begin(c, false);
    for (int i = 0; i < n; i++)
        item(c, i);
    mf_emit_seq_end(c);
}

/* A placement; a whole role's Flat axes are written Whole (format 5). */
static void mf_emit_placement(mf_emit_ctx *c, const mf_schema_key *k, const mf_placement *p, bool whole)
{
    mf_emit_key(c, k);
    mf_emit_seq_begin(c, true);
    for (int j = 0; j < c->s->mesh.naxes; j++)
        mf_emit_str(c, mf_role_place_name(p, j, whole));
    mf_emit_seq_end(c);
}

/* The format: 7 when some bucket has a whole role (ragged, with bounds), 6
 * when some bucket has a Distinct axis, else 4 (3 without the programs);
 * format 5 is no longer written. */
static const char *mf_emit_format(const mf_schedule *s)
{
    for (int b = 0; b < s->nbuckets; b++)
        if (s->buckets[b].bounds)
            return MF_SCHEDULE_FORMAT_RAGGED;
    for (int b = 0; b < s->nbuckets; b++)
        if (mf_placement_has_distinct(&s->buckets[b].place[MF_ROLE_WEIGHT], s->mesh.naxes))
            return MF_SCHEDULE_FORMAT_DISTINCT;
    for (int b = 0; b < s->nbuckets; b++)
        for (int r = 0; r < MF_ROLE_COUNT; r++)
            if (s->buckets[b].whole[r])
                return MF_SCHEDULE_FORMAT_WHOLE;
    return s->programs ? MF_SCHEDULE_FORMAT : MF_SCHEDULE_FORMAT_STEP_ONLY;
}

static const char *mf_emit_unit_name(const mf_schedule *s, int u)
{
    return u >= 0 && u < s->nunits ? s->units[u].name : "?";
}

static void mf_emit_header(mf_emit_ctx *c)
{
    const mf_schedule *s = c->s;
    mf_emit_kv_str(c, MF_KEY(ROOT, FORMAT), mf_emit_format(s));
    mf_emit_kv_str(c, MF_KEY(ROOT, SOURCE), s->source);
    mf_emit_kv(c, MF_KEY(ROOT, SHA), s->source_sha256, YAML_DOUBLE_QUOTED_SCALAR_STYLE);
    mf_emit_key(c, MF_KEY(ROOT, MESH));
    mf_emit_map_begin(c, true);
    mf_emit_key(c, MF_KEY(MESH, AXES));
    mf_emit_seq_begin(c, true);
    for (int j = 0; j < s->mesh.naxes; j++) {
        mf_emit_map_begin(c, true);
        mf_emit_kv_str(c, MF_KEY(AXIS, NAME), s->mesh.axes[j].name);
        mf_emit_kv_int(c, MF_KEY(AXIS, SIZE), s->mesh.axes[j].size);
        mf_emit_map_end(c);
    }
    mf_emit_seq_end(c);
    mf_emit_map_end(c);
    mf_emit_kv_int(c, MF_KEY(ROOT, MICROBATCHES), s->microbatches);
    mf_emit_kv_str(c, MF_KEY(ROOT, REDUCE), mf_reduce_name(s->reduce));
    mf_emit_kv_int(c, MF_KEY(ROOT, ALIGN), s->align);
    mf_emit_kv_int(c, MF_KEY(ROOT, PREFETCH), s->prefetch);
}

static void mf_emit_unit(mf_emit_ctx *c, int u)
{
    const mf_schedule *s = c->s;
    const mf_unit *un = &s->units[u];
    mf_emit_map_begin(c, true);
    mf_emit_kv_str(c, MF_KEY(UNIT, NAME), un->name);
    mf_emit_kv_word(c, MF_KEY(UNIT, RESHARD), un->reshard_after_forward ? "true" : "false");
    mf_emit_key(c, MF_KEY(UNIT, BUCKETS));
    mf_emit_seq_begin(c, true);
    for (int b = un->first_bucket; b < un->first_bucket + un->nbuckets && b < s->nbuckets; b++)
        mf_emit_str(c, s->buckets[b].name);
    mf_emit_seq_end(c);
    mf_emit_map_end(c);
}

static void mf_emit_tensor(mf_emit_ctx *c, const mf_tensor *te)
{
    mf_emit_map_begin(c, true);
    mf_emit_kv_str(c, MF_KEY(TENSOR, NAME), te->name);
    mf_emit_kv_int(c, MF_KEY(TENSOR, OFFSET), te->offset);
    mf_emit_kv_int(c, MF_KEY(TENSOR, NUMEL), te->numel);
    mf_emit_key(c, MF_KEY(TENSOR, DIMS));
    mf_emit_seq_begin(c, true);
    for (int d = 0; d < te->ndims; d++)
        mf_emit_int(c, te->dims[d]);
    mf_emit_seq_end(c);
    if (te->nglobal) { /* global: [N0, N1, ...] | {name: N, split: D} */
        mf_emit_scalar_style(c, MF_SCHEDULE_KEY_GLOBAL, YAML_PLAIN_SCALAR_STYLE);
        if (te->global_split) {
            mf_emit_map_begin(c, true);
            mf_emit_scalar_style(c, MF_SCHEDULE_KEY_GLOBAL_NAME, YAML_PLAIN_SCALAR_STYLE);
            mf_emit_str(c, te->global[0]);
            mf_emit_scalar_style(c, MF_SCHEDULE_KEY_GLOBAL_SPLIT, YAML_PLAIN_SCALAR_STYLE);
            mf_emit_int(c, te->global_dim);
            mf_emit_map_end(c);
        } else {
            mf_emit_seq_begin(c, true);
            for (int g = 0; g < te->nglobal; g++)
                mf_emit_str(c, te->global[g]);
            mf_emit_seq_end(c);
        }
    }
    mf_emit_map_end(c);
}

static void mf_emit_bucket(mf_emit_ctx *c, int b)
{
    const mf_schedule *s = c->s;
    const mf_bucket *bk = &s->buckets[b];
    mf_emit_map_begin(c, false);
    mf_emit_kv_str(c, MF_KEY(BUCKET, NAME), bk->name);
    mf_emit_kv_str(c, MF_KEY(BUCKET, UNIT), mf_emit_unit_name(s, bk->unit));
    mf_emit_kv_str(c, MF_KEY(BUCKET, LAST_UNIT), mf_emit_unit_name(s, bk->last_unit));
    mf_emit_kv_str(c, MF_KEY(BUCKET, LAYOUT), bk->layout);
    mf_emit_kv_int(c, MF_KEY(BUCKET, LENGTH), bk->length);
    mf_emit_kv_int(c, MF_KEY(BUCKET, USED), bk->used);
    if (bk->bounds) {
        mf_emit_key(c, MF_KEY(BUCKET, BOUNDS));
        mf_emit_seq_begin(c, true);
        for (int64_t q = 0, n = mf_layout_bucket_nbounds(&s->mesh, bk); q < n; q++)
            mf_emit_int(c, bk->bounds[q]);
        mf_emit_seq_end(c);
    }
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        mf_emit_key(c, &MF_KEY(BUCKET, WEIGHT)[r]); /* the roles' keys, in mf_role order */
        mf_emit_map_begin(c, true);
        mf_emit_kv_str(c, MF_KEY(ROLE, DTYPE), mf_dtype_name(bk->dtype[r]));
        mf_emit_placement(c, MF_KEY(ROLE, PLACEMENT), &bk->place[r], bk->whole[r]);
        mf_emit_map_end(c);
    }
    mf_emit_key(c, MF_KEY(BUCKET, TENSORS));
    mf_emit_seq_begin(c, false);
    for (int t = 0; t < bk->ntensors; t++)
        mf_emit_tensor(c, &bk->tensors[t]);
    mf_emit_seq_end(c);
    mf_emit_map_end(c);
}

static void mf_emit_buffer(mf_emit_ctx *c, int i)
{
    const mf_schedule *s = c->s;
    const mf_buffer *bf = &s->buffers[i];
    mf_emit_map_begin(c, true);
    mf_emit_kv_str(c, MF_KEY(BUFFER, NAME), bf->name);
    mf_emit_kv_str(c, MF_KEY(BUFFER, BUCKET),
                   bf->bucket >= 0 && bf->bucket < s->nbuckets ? s->buckets[bf->bucket].name : "?");
    mf_emit_kv_str(c, MF_KEY(BUFFER, KIND), mf_bufkind_name(bf->kind));
    mf_emit_kv_str(c, MF_KEY(BUFFER, DTYPE), mf_dtype_name(bf->dtype));
    mf_emit_placement(c, MF_KEY(BUFFER, PLACEMENT), &bf->place, false);
    mf_emit_kv_int(c, MF_KEY(BUFFER, COUNT), bf->count);
    mf_emit_kv_str(c, MF_KEY(BUFFER, LIFETIME), mf_lifetime_name(bf->lifetime));
    mf_emit_kv_int(c, MF_KEY(BUFFER, OFFSET), bf->offset);
    mf_emit_map_end(c);
}

static void mf_emit_buffers(mf_emit_ctx *c)
{
    mf_emit_list(c, MF_KEY(ROOT, BUFFERS), c->s->nbuffers, mf_emit_buffer);
}

/* key: the name of bucket or buffer `i`, quoted as decided once per name;
 * "?" for a name out of range (NULL). */
static void mf_emit_kv_name(mf_emit_ctx *c, const mf_schema_key *k, const char *name,
                            const yaml_scalar_style_t *style, int i)
{
    if (!name)
        mf_emit_kv_str(c, k, "?");
    else
        mf_emit_kv(c, k, name, style ? style[i] : mf_yaml_str_style(name));
}

static void mf_emit_kv_bucket(mf_emit_ctx *c, const mf_schema_key *k, int b)
{
    const mf_schedule *s = c->s;
    mf_emit_kv_name(c, k, b >= 0 && b < s->nbuckets ? s->buckets[b].name : NULL, c->bucket_style, b);
}

static void mf_emit_kv_buffer(mf_emit_ctx *c, const mf_schema_key *k, int b)
{
    const mf_schedule *s = c->s;
    mf_emit_kv_name(c, k, b >= 0 && b < s->nbuffers ? s->buffers[b].name : NULL, c->buffer_style, b);
}

static void mf_emit_op(mf_emit_ctx *c, int i)
{
    static const char *const tnames[] = {"T0", "T1", "T2", "T3", "T4"};
    const mf_schedule *s = c->s;
    const mf_op *op = &s->ops[i];
    mf_emit_map_begin(c, true);
    mf_emit_kv_int(c, MF_KEY(OP, ID), op->id);
    mf_emit_kv_word(c, MF_KEY(OP, PHASE), mf_phase_name(op->phase));
    if (op->phase != MF_PHASE_STEP_BEGIN && op->phase != MF_PHASE_STEP_END)
        mf_emit_kv_str(c, MF_KEY(OP, UNIT), mf_emit_unit_name(s, op->unit));
    mf_emit_kv_word(c, MF_KEY(OP, WHEN), mf_when_name(op->when));
    mf_emit_kv_word(c, MF_KEY(OP, STREAM), mf_stream_name(op->stream));
    mf_emit_kv_word(c, MF_KEY(OP, OP), mf_opkind_name(op->kind));
    if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT) {
        mf_emit_kv_int(c, MF_KEY(OP, EVENT), op->event);
    } else {
        mf_emit_kv_str(c, MF_KEY(OP, TRANSITION),
                       op->transition >= 0 && op->transition <= 4 ? tnames[op->transition] : "?");
        mf_emit_kv_bucket(c, MF_KEY(OP, BUCKET), op->bucket);
        if (op->axis >= 0)
            mf_emit_kv_str(c, MF_KEY(OP, AXIS), op->axis < s->mesh.naxes ? s->mesh.axes[op->axis].name : "?");
        mf_emit_kv_word(c, MF_KEY(OP, DTYPE), mf_dtype_name(op->dtype));
        mf_emit_kv_int(c, MF_KEY(OP, COUNT), op->count);
        mf_emit_kv_buffer(c, MF_KEY(OP, SRC), op->src);
        mf_emit_kv_buffer(c, MF_KEY(OP, DST), op->dst);
    }
    mf_emit_map_end(c);
}

/* Whether each bucket / buffer name needs quotes, decided once (the ops name
 * them hundreds of thousands of times); NULL when out of memory. */
static yaml_scalar_style_t *mf_emit_styles(const void *base, int n, size_t size, size_t off)
{
    yaml_scalar_style_t *style = malloc(sizeof *style * (size_t)(n > 0 ? n : 1));
    for (int i = 0; style && i < n; i++) {
        const char *name;
        memcpy(&name, (const char *)base + (size_t)i * size + off, sizeof name);
        style[i] = mf_yaml_str_style(name ? name : "");
    }
    return style;
}

static void mf_emit_ops(mf_emit_ctx *c)
{
    const mf_schedule *s = c->s;
    c->bucket_style = mf_emit_styles(s->buckets, s->nbuckets, sizeof *s->buckets, offsetof(mf_bucket, name));
    c->buffer_style = mf_emit_styles(s->buffers, s->nbuffers, sizeof *s->buffers, offsetof(mf_buffer, name));
    mf_emit_list(c, MF_KEY(ROOT, OPS), s->nops, mf_emit_op);
    free(c->bucket_style);
    free(c->buffer_style);
    c->bucket_style = c->buffer_style = NULL;
}

static void mf_emit_role_map(mf_emit_ctx *c, const mf_schema_key *k, const int64_t v[MF_ROLE_COUNT])
{
    const char *names[MF_ROLE_COUNT];
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        names[r] = mf_role_name((mf_role)r);
    mf_emit_key(c, k);
    mf_emit_int_map(c, names, v, MF_ROLE_COUNT);
}

static void mf_emit_summary(mf_emit_ctx *c)
{
    const mf_schedule *s = c->s;
    const mf_summary *sum = &s->summary;
    const char *axes[MF_MAX_AXES];
    int naxes = s->mesh.naxes < MF_MAX_AXES ? s->mesh.naxes : MF_MAX_AXES;
    for (int j = 0; j < naxes; j++)
        axes[j] = s->mesh.axes[j].name;
    mf_emit_key(c, MF_KEY(ROOT, SUMMARY));
    mf_emit_map_begin(c, false);
    mf_emit_key(c, MF_KEY(SUMMARY, COLLECTIVES));
    mf_emit_map_begin(c, false);
    for (int k = 0; k < MF_OPKIND_COUNT; k++) {
        if (!mf_opkind_is_collective((mf_opkind)k))
            continue;
        mf_emit_str(c, mf_opkind_name((mf_opkind)k));
        mf_emit_int_map(c, axes, sum->collectives[k], naxes);
    }
    mf_emit_map_end(c);
    mf_emit_key(c, MF_KEY(SUMMARY, BYTES));
    mf_emit_int_map(c, axes, sum->bytes, naxes);
    mf_emit_role_map(c, MF_KEY(SUMMARY, PERSISTENT), sum->persistent_bytes);
    mf_emit_role_map(c, MF_KEY(SUMMARY, MODEL), sum->model_bytes);
    mf_emit_kv_int(c, MF_KEY(SUMMARY, LIVE), sum->live_bytes);
    mf_emit_kv_int(c, MF_KEY(SUMMARY, INTERFERENCE), sum->interference_bytes);
    mf_emit_kv_int(c, MF_KEY(SUMMARY, ALLOCATED), sum->allocated_bytes);
    mf_emit_map_end(c);
}

/* Starts a segment: a stream holding one document whose root is a block
 * mapping. The document is written as several such segments (see
 * mf_emit_yaml); each ends where the next top-level key would start. */
static void mf_emit_seg_begin(mf_emit_ctx *c)
{
    yaml_event_t ev;
    if (!c->ok)
        return;
    if (!yaml_emitter_initialize(&c->em)) {
        c->ok = false;
        return;
    }
    c->em_live = true;
    yaml_emitter_set_output(&c->em, mf_emit_write, c);
    yaml_emitter_set_unicode(&c->em, 1);
    yaml_emitter_set_indent(&c->em, 2);
    yaml_emitter_set_width(&c->em, -1); /* never wrap: one op per line */
    yaml_emitter_set_break(&c->em, YAML_LN_BREAK);
    int ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    mf_emit_event(c, &ev, ok);
    ok = yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
    mf_emit_event(c, &ev, ok);
    mf_emit_map_begin(c, false);
}

/* Ends the segment: closes the mapping, the document and the stream and
 * flushes. The implicit document end writes only the last line's break. */
static void mf_emit_seg_end(mf_emit_ctx *c)
{
    yaml_event_t ev;
    if (!c->em_live)
        return;
    mf_emit_map_end(c);
    int ok = yaml_document_end_event_initialize(&ev, 1);
    mf_emit_event(c, &ev, ok);
    ok = yaml_stream_end_event_initialize(&ev);
    mf_emit_event(c, &ev, ok);
    if (c->ok && !yaml_emitter_flush(&c->em))
        c->ok = false;
    yaml_emitter_delete(&c->em);
    c->em_live = false;
}

/* One of the sections of mf_emit_lines.h: written directly when it can be,
 * else as a segment of its own by libyaml's emitter (section(c)). */
static void mf_emit_section(mf_emit_ctx *c, int (*direct)(mf_emit_lines *, FILE *),
                            void (*section)(mf_emit_ctx *))
{
    if (!c->ok)
        return;
    int rc = direct(c->lines, c->out);
    if (rc == MF_EMIT_LINES_IO)
        c->ok = false;
    if (rc != MF_EMIT_LINES_NOT_PLAIN)
        return;
    mf_emit_seg_begin(c);
    section(c);
    mf_emit_seg_end(c);
}

static void mf_emit_arena_events(mf_emit_ctx *c)
{
    mf_emit_key(c, MF_KEY(ROOT, ARENA));
    mf_emit_map_begin(c, true);
    mf_emit_kv_int(c, MF_KEY(ARENA, PERSISTENT), c->s->mem_persistent);
    mf_emit_kv_int(c, MF_KEY(ARENA, TRANSIENT), c->s->mem_transient);
    mf_emit_map_end(c);
    mf_emit_kv_int(c, MF_KEY(ROOT, EVENTS), c->s->nevents);
}

/*
 * The document is one block mapping at indent 0, written in five segments:
 * header..buckets, buffers, arena+events, ops, summary. The buffers and ops
 * sections (nearly all the bytes) come from mf_emit_lines.c when every string
 * in them is plain; the others, and those two otherwise, each come from a
 * libyaml stream of their own. A stream whose root is a block mapping at
 * indent 0 writes exactly the lines that mapping's keys would write inside one
 * bigger mapping, so the bytes are those of a single stream.
 */
int mf_emit_yaml(const mf_schedule *s, FILE *out)
{
    mf_emit_ctx c = {.s = s, .out = out, .ok = true};
    c.lines = mf_emit_lines_new(s); /* NULL (out of memory): libyaml writes all */

    mf_emit_seg_begin(&c);
    mf_emit_header(&c);
    mf_emit_list(&c, MF_KEY(ROOT, UNITS), s->nunits, mf_emit_unit);
    mf_emit_list(&c, MF_KEY(ROOT, BUCKETS), s->nbuckets, mf_emit_bucket);
    mf_emit_seg_end(&c);
    mf_emit_section(&c, mf_emit_lines_buffers, mf_emit_buffers);
    mf_emit_seg_begin(&c);
    mf_emit_arena_events(&c);
    mf_emit_seg_end(&c);
    mf_emit_section(&c, mf_emit_lines_ops, mf_emit_ops);
    mf_emit_seg_begin(&c);
    mf_emit_summary(&c);
    mf_emit_seg_end(&c);

    mf_emit_lines_free(c.lines);
    return c.ok ? 0 : -1;
}
