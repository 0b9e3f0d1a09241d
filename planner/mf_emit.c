/*
 * mf_emit: writes a schedule as the canonical YAML of docs/schedule.md §1 with libyaml's
 * emitter (docs/schedule.md describes every key). The `buffers:` and `ops:`
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
 *   - exactly what mf_schedule_load_buffer() reads: load -> emit gives the same
 *     bytes.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "mf_emit_lines.h"
#include "mf_passes.h"
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
    mf_emit_scalar_style(c, mf_yaml_int_text(v, buf), YAML_PLAIN_SCALAR_STYLE);
}

static void mf_emit_map_begin(mf_emit_ctx *c, bool flow)
{
    yaml_event_t ev;
    int ok = yaml_mapping_start_event_initialize(
        &ev, NULL, NULL, 1, flow ? YAML_FLOW_MAPPING_STYLE : YAML_BLOCK_MAPPING_STYLE);
    mf_emit_event(c, &ev, ok);
}

static void mf_emit_map_end(mf_emit_ctx *c)
{
    yaml_event_t ev;
    int ok = yaml_mapping_end_event_initialize(&ev);
    mf_emit_event(c, &ev, ok);
}

static void mf_emit_seq_begin(mf_emit_ctx *c, bool flow)
{
    yaml_event_t ev;
    int ok = yaml_sequence_start_event_initialize(
        &ev, NULL, NULL, 1, flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE);
    mf_emit_event(c, &ev, ok);
}

static void mf_emit_seq_end(mf_emit_ctx *c)
{
    yaml_event_t ev;
    int ok = yaml_sequence_end_event_initialize(&ev);
    mf_emit_event(c, &ev, ok);
}

/* A key: always one of the format's fixed identifiers, so always plain. */
static void mf_emit_key(mf_emit_ctx *c, const char *k)
{
    mf_emit_scalar_style(c, k, YAML_PLAIN_SCALAR_STYLE);
}

/* key: a vocabulary word (enum name), which is always plain. */
static void mf_emit_kv_word(mf_emit_ctx *c, const char *k, const char *word)
{
    mf_emit_key(c, k);
    mf_emit_scalar_style(c, word, YAML_PLAIN_SCALAR_STYLE);
}

/* key: string value */
static void mf_emit_kv_str(mf_emit_ctx *c, const char *k, const char *v)
{
    mf_emit_key(c, k);
    mf_emit_str(c, v);
}

static void mf_emit_kv_int(mf_emit_ctx *c, const char *k, int64_t v)
{
    mf_emit_key(c, k);
    mf_emit_int(c, v);
}

static void mf_emit_placement(mf_emit_ctx *c, const mf_placement *p)
{
    mf_emit_seq_begin(c, true);
    for (int j = 0; j < c->s->mesh.naxes; j++)
        mf_emit_str(c, mf_place_name((mf_place)p->p[j]));
    mf_emit_seq_end(c);
}

static const char *mf_emit_unit_name(const mf_schedule *s, int u)
{
    return u >= 0 && u < s->nunits ? s->units[u].name : "?";
}

static void mf_emit_header(mf_emit_ctx *c)
{
    const mf_schedule *s = c->s;
    mf_emit_kv_str(c, "format", s->programs ? MF_SCHEDULE_FORMAT : MF_SCHEDULE_FORMAT_STEP_ONLY);
    mf_emit_kv_str(c, "source", s->source ? s->source : "");
    mf_emit_key(c, "source_sha256");
    mf_emit_scalar_style(c, s->source_sha256, YAML_DOUBLE_QUOTED_SCALAR_STYLE);
    mf_emit_key(c, "mesh");
    mf_emit_map_begin(c, true);
    mf_emit_key(c, "axes");
    mf_emit_seq_begin(c, true);
    for (int j = 0; j < s->mesh.naxes; j++) {
        mf_emit_map_begin(c, true);
        mf_emit_kv_str(c, "name", s->mesh.axes[j].name);
        mf_emit_kv_int(c, "size", s->mesh.axes[j].size);
        mf_emit_map_end(c);
    }
    mf_emit_seq_end(c);
    mf_emit_map_end(c);
    mf_emit_kv_int(c, "microbatches", s->microbatches);
    mf_emit_kv_str(c, "reduce", mf_reduce_name(s->reduce));
    mf_emit_kv_int(c, "align", s->align);
    mf_emit_kv_int(c, "prefetch", s->prefetch);
}

static void mf_emit_units(mf_emit_ctx *c)
{
    const mf_schedule *s = c->s;
    mf_emit_key(c, "units");
    mf_emit_seq_begin(c, false);
    for (int u = 0; u < s->nunits; u++) {
        const mf_unit *un = &s->units[u];
        mf_emit_map_begin(c, true);
        mf_emit_kv_str(c, "name", un->name);
        mf_emit_key(c, "reshard_after_forward");
        mf_emit_scalar_style(c, un->reshard_after_forward ? "true" : "false", YAML_PLAIN_SCALAR_STYLE);
        mf_emit_key(c, "buckets");
        mf_emit_seq_begin(c, true);
        for (int b = un->first_bucket; b < un->first_bucket + un->nbuckets && b < s->nbuckets; b++)
            mf_emit_str(c, s->buckets[b].name);
        mf_emit_seq_end(c);
        mf_emit_map_end(c);
    }
    mf_emit_seq_end(c);
}

static void mf_emit_buckets(mf_emit_ctx *c)
{
    const mf_schedule *s = c->s;
    mf_emit_key(c, "buckets");
    mf_emit_seq_begin(c, false);
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        mf_emit_map_begin(c, false);
        mf_emit_kv_str(c, "name", bk->name);
        mf_emit_kv_str(c, "unit", mf_emit_unit_name(s, bk->unit));
        mf_emit_kv_str(c, "last_unit", mf_emit_unit_name(s, bk->last_unit));
        mf_emit_kv_str(c, "layout", bk->layout ? bk->layout : "");
        mf_emit_kv_int(c, "length", bk->length);
        mf_emit_kv_int(c, "used", bk->used);
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            mf_emit_str(c, mf_role_name((mf_role)r));
            mf_emit_map_begin(c, true);
            mf_emit_kv_str(c, "dtype", mf_dtype_name(bk->dtype[r]));
            mf_emit_key(c, "placement");
            mf_emit_placement(c, &bk->place[r]);
            mf_emit_map_end(c);
        }
        mf_emit_key(c, "tensors");
        mf_emit_seq_begin(c, false);
        for (int t = 0; t < bk->ntensors; t++) {
            const mf_tensor *te = &bk->tensors[t];
            mf_emit_map_begin(c, true);
            mf_emit_kv_str(c, "name", te->name);
            mf_emit_kv_int(c, "offset", te->offset);
            mf_emit_kv_int(c, "numel", te->numel);
            mf_emit_key(c, "dims");
            mf_emit_seq_begin(c, true);
            for (int d = 0; d < te->ndims; d++)
                mf_emit_int(c, te->dims[d]);
            mf_emit_seq_end(c);
            mf_emit_map_end(c);
        }
        mf_emit_seq_end(c);
        mf_emit_map_end(c);
    }
    mf_emit_seq_end(c);
}

static void mf_emit_buffers(mf_emit_ctx *c)
{
    const mf_schedule *s = c->s;
    mf_emit_key(c, "buffers");
    mf_emit_seq_begin(c, false);
    for (int i = 0; i < s->nbuffers; i++) {
        const mf_buffer *bf = &s->buffers[i];
        mf_emit_map_begin(c, true);
        mf_emit_kv_str(c, "name", bf->name);
        mf_emit_kv_str(c, "bucket",
                       bf->bucket >= 0 && bf->bucket < s->nbuckets ? s->buckets[bf->bucket].name : "?");
        mf_emit_kv_str(c, "kind", mf_bufkind_name(bf->kind));
        mf_emit_kv_str(c, "dtype", mf_dtype_name(bf->dtype));
        mf_emit_key(c, "placement");
        mf_emit_placement(c, &bf->place);
        mf_emit_kv_int(c, "count", bf->count);
        mf_emit_kv_str(c, "lifetime", mf_lifetime_name(bf->lifetime));
        mf_emit_kv_int(c, "offset", bf->offset);
        mf_emit_map_end(c);
    }
    mf_emit_seq_end(c);
}

/* key: the name of bucket or buffer `i`, quoted as decided once per name. */
static void mf_emit_kv_name(mf_emit_ctx *c, const char *k, const char *name, const yaml_scalar_style_t *style, int i)
{
    mf_emit_key(c, k);
    mf_emit_scalar_style(c, name, style ? style[i] : mf_yaml_str_style(name));
}

static void mf_emit_kv_bucket(mf_emit_ctx *c, const char *k, int b)
{
    if (b >= 0 && b < c->s->nbuckets)
        mf_emit_kv_name(c, k, c->s->buckets[b].name, c->bucket_style, b);
    else
        mf_emit_kv_str(c, k, "?");
}

static void mf_emit_kv_buffer(mf_emit_ctx *c, const char *k, int b)
{
    if (b >= 0 && b < c->s->nbuffers)
        mf_emit_kv_name(c, k, c->s->buffers[b].name, c->buffer_style, b);
    else
        mf_emit_kv_str(c, k, "?");
}

static void mf_emit_ops(mf_emit_ctx *c)
{
    static const char *const tnames[] = {"T0", "T1", "T2", "T3", "T4"};
    const mf_schedule *s = c->s;
    c->bucket_style = malloc(sizeof *c->bucket_style * (size_t)(s->nbuckets > 0 ? s->nbuckets : 1));
    c->buffer_style = malloc(sizeof *c->buffer_style * (size_t)(s->nbuffers > 0 ? s->nbuffers : 1));
    for (int i = 0; c->bucket_style && i < s->nbuckets; i++)
        c->bucket_style[i] = mf_yaml_str_style(s->buckets[i].name ? s->buckets[i].name : "");
    for (int i = 0; c->buffer_style && i < s->nbuffers; i++)
        c->buffer_style[i] = mf_yaml_str_style(s->buffers[i].name ? s->buffers[i].name : "");
    mf_emit_key(c, "ops");
    mf_emit_seq_begin(c, false);
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        mf_emit_map_begin(c, true);
        mf_emit_kv_int(c, "id", op->id);
        mf_emit_kv_word(c, "phase", mf_phase_name(op->phase));
        if (op->phase != MF_PHASE_STEP_BEGIN && op->phase != MF_PHASE_STEP_END)
            mf_emit_kv_str(c, "unit", mf_emit_unit_name(s, op->unit));
        mf_emit_kv_word(c, "when", mf_when_name(op->when));
        mf_emit_kv_word(c, "stream", mf_stream_name(op->stream));
        mf_emit_kv_word(c, "op", mf_opkind_name(op->kind));
        if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT) {
            mf_emit_kv_int(c, "event", op->event);
        } else {
            mf_emit_kv_str(c, "transition",
                           op->transition >= 0 && op->transition <= 4 ? tnames[op->transition] : "?");
            mf_emit_kv_bucket(c, "bucket", op->bucket);
            if (op->axis >= 0)
                mf_emit_kv_str(c, "axis",
                               op->axis < s->mesh.naxes ? s->mesh.axes[op->axis].name : "?");
            mf_emit_kv_word(c, "dtype", mf_dtype_name(op->dtype));
            mf_emit_kv_int(c, "count", op->count);
            mf_emit_kv_buffer(c, "src", op->src);
            mf_emit_kv_buffer(c, "dst", op->dst);
        }
        mf_emit_map_end(c);
    }
    mf_emit_seq_end(c);
    free(c->bucket_style);
    free(c->buffer_style);
    c->bucket_style = c->buffer_style = NULL;
}

static void mf_emit_role_map(mf_emit_ctx *c, const char *key, const int64_t v[MF_ROLE_COUNT])
{
    mf_emit_str(c, key);
    mf_emit_map_begin(c, true);
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        mf_emit_kv_int(c, mf_role_name((mf_role)r), v[r]);
    mf_emit_map_end(c);
}

static void mf_emit_summary(mf_emit_ctx *c)
{
    const mf_schedule *s = c->s;
    const mf_summary *sum = &s->summary;
    mf_emit_key(c, "summary");
    mf_emit_map_begin(c, false);
    mf_emit_key(c, "collectives");
    mf_emit_map_begin(c, false);
    for (int k = 0; k < MF_OPKIND_COUNT; k++) {
        if (!mf_opkind_is_collective((mf_opkind)k))
            continue;
        mf_emit_str(c, mf_opkind_name((mf_opkind)k));
        mf_emit_map_begin(c, true);
        for (int j = 0; j < s->mesh.naxes; j++)
            mf_emit_kv_int(c, s->mesh.axes[j].name, sum->collectives[k][j]);
        mf_emit_map_end(c);
    }
    mf_emit_map_end(c);
    mf_emit_key(c, "bytes_per_rank");
    mf_emit_map_begin(c, true);
    for (int j = 0; j < s->mesh.naxes; j++)
        mf_emit_kv_int(c, s->mesh.axes[j].name, sum->bytes[j]);
    mf_emit_map_end(c);
    mf_emit_role_map(c, "persistent_bytes", sum->persistent_bytes);
    mf_emit_role_map(c, "model_bytes", sum->model_bytes);
    mf_emit_kv_int(c, "live_bytes", sum->live_bytes);
    mf_emit_kv_int(c, "interference_bytes", sum->interference_bytes);
    mf_emit_kv_int(c, "allocated_bytes", sum->allocated_bytes);
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
    mf_emit_key(c, "arena");
    mf_emit_map_begin(c, true);
    mf_emit_kv_int(c, "persistent", c->s->mem_persistent);
    mf_emit_kv_int(c, "transient", c->s->mem_transient);
    mf_emit_map_end(c);
    mf_emit_kv_int(c, "events", c->s->nevents);
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
    mf_emit_units(&c);
    mf_emit_buckets(&c);
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
