/*
 * mf_load: reads a schedule file (docs/schedule.md §2) into an
 * mf_schedule with libyaml's document API. Every key is looked up in the
 * schema table (core/mf_schema.h) for the file's format version, which also
 * says which keys are required and how messages name each value.
 *
 * The runtime trusts what this returns, so the loader refuses, with the YAML
 * mark of the offending node ("file:line:col: error: ..."), everything that is
 * not exactly a well-formed schedule: an unknown format, a missing, unknown or
 * duplicate key, a value of the wrong type, an unknown enum name, a dangling
 * unit/bucket/buffer/axis/event reference, a negative or overflowing number, a
 * mesh whose product overflows, duplicate names, tensors that overlap or leave
 * their bucket, a buffer whose element count is not the bucket length divided
 * by the shard count of its placement (in a ragged whole bucket: its
 * placement's longest shard), a whole bucket whose `bounds` are missing,
 * miscounted, unordered, off the shard quantum or not ending at its length,
 * a bucket that breaks the normative
 * buffer rules of mf_schedule.h, an op whose count does not fit its buffers
 * (per op kind and axis size) or whose dtype differs from theirs, an event
 * recorded on two streams, and a summary that differs from the one
 * recomputed from the ops.
 *
 * Invariant on success: for every op, every element it reads or writes lies
 * inside its src and dst buffers, every index field is in range, and every
 * total of the summary fits in 64 bits. The first error stops the load; no
 * partially loaded schedule is ever returned.
 */
#include "mf_load.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "mf_hash.h"
#include "mf_arena_check.h"
#include "mf_layout.h"
#include "mf_limits.h"
#include "mf_schema.h"
#include "mf_struct.h"

/* ---- loader context ---- */

typedef struct mf_loader {
    const char *name;       /* for messages */
    yaml_document_t doc;
    mf_schedule *s;
    char *err;
    size_t errlen;
    bool failed;
    mf_hash units, buckets, buffers, axes, tensors; /* name -> index */
    mf_hash globals;        /* global tensor names: non-distinct tensors' and `global` ones */
    int64_t ntensors;       /* tensors so far, against MF_LIMIT_TENSORS */
    int version;            /* of the file's format: which keys it has (core/mf_schema.h) */
} mf_loader;

typedef yaml_node_t mf_node;

__attribute__((format(printf, 3, 4))) static bool mf_load_fail(mf_loader *l, const mf_node *at,
                                                              const char *fmt, ...)
{
    if (l->failed)
        return false;
    l->failed = true;
    if (!l->err || !l->errlen)
        return false;
    int n;
    if (at)
        n = snprintf(l->err, l->errlen, "%s:%zu:%zu: error: ", l->name, at->start_mark.line + 1,
                     at->start_mark.column + 1);
    else
        n = snprintf(l->err, l->errlen, "%s: error: ", l->name);
    if (n >= 0 && (size_t)n < l->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(l->err + n, l->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return false;
}

static bool mf_load_oom(mf_loader *l)
{
    return mf_load_fail(l, NULL, "out of memory");
}

/*
 * Where the structural checks' findings (core/mf_struct.c) point: the node of
 * the field a finding names when known, else the node of its buffer or op,
 * else `any`; bucket findings point at the buffers section.
 */
typedef struct mf_load_site {
    mf_loader *l;
    mf_node *field[MF_FIELD_BUFFERS + 1];
    mf_node **buffers, **ops;   /* per index, or NULL */
    mf_node *section, *any;
} mf_load_site;

static bool mf_load_finding(void *ctx, const mf_struct_finding *f)
{
    mf_load_site *site = ctx;
    mf_node *at = site->field[f->field];
    if (!at && f->at == MF_AT_BUFFER && site->buffers)
        at = site->buffers[f->index];
    if (!at && f->at == MF_AT_OP && site->ops)
        at = site->ops[f->index];
    if (!at && f->at == MF_AT_BUCKET)
        at = site->section;
    if (!at)
        at = site->any;
    return mf_load_fail(site->l, at, "%s", f->msg);
}

static mf_node *mf_load_node(mf_loader *l, int id)
{
    return yaml_document_get_node(&l->doc, id);
}

static const char *mf_load_node_kind(const mf_node *n)
{
    switch (n->type) {
    case YAML_SCALAR_NODE:
        return "a scalar";
    case YAML_SEQUENCE_NODE:
        return "a sequence";
    case YAML_MAPPING_NODE:
        return "a mapping";
    default:
        return "nothing";
    }
}

static const char *mf_load_scalar(const mf_node *n)
{
    return (const char *)n->data.scalar.value;
}

/* How messages name the value of a key (core/mf_schema.h). */
#define MF_WHAT(SECTION, KEY) (MF_KEY(SECTION, KEY)->what)

/*
 * Reads the keys of a mapping into out[] (value nodes, NULL when absent), in
 * the order of the section's keys (those of the file's format version).
 * Refuses a non-mapping, a non-scalar or unknown key, a duplicate key and a
 * missing required one. `what` names the mapping in messages.
 */
static bool mf_load_fields(mf_loader *l, mf_node *map, const char *what, const mf_schema_section *sec,
                           mf_node **out, mf_node **keynodes)
{
    if (map->type != YAML_MAPPING_NODE)
        return mf_load_fail(l, map, "expected a mapping for %s, got %s", what, mf_load_node_kind(map));
    int nkeys = sec->nkeys;
    for (int i = 0; i < nkeys; i++) {
        out[i] = NULL;
        if (keynodes)
            keynodes[i] = NULL;
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        mf_node *k = mf_load_node(l, p->key), *v = mf_load_node(l, p->value);
        if (!k || !v)
            return mf_load_fail(l, map, "malformed mapping in %s", what);
        if (k->type != YAML_SCALAR_NODE)
            return mf_load_fail(l, k, "expected a string key in %s, got %s", what, mf_load_node_kind(k));
        int i = mf_schema_find(sec, mf_load_scalar(k), l->version);
        if (i < 0)
            return mf_load_fail(l, k, "unknown key '%s' in %s", mf_load_scalar(k), what);
        if (out[i])
            return mf_load_fail(l, k, "duplicate key '%s' in %s", mf_load_scalar(k), what);
        out[i] = v;
        if (keynodes)
            keynodes[i] = k;
    }
    for (int i = 0; i < nkeys; i++)
        if (sec->keys[i].presence == MF_SCHEMA_REQUIRED && sec->keys[i].since <= l->version && !out[i])
            return mf_load_fail(l, map, "missing key '%s' in %s", sec->keys[i].name, what);
    return true;
}

/* The keys of schema section `sec`, the mapping named as the table names it. */
static bool mf_load_section(mf_loader *l, mf_node *map, mf_section sec, mf_node **out, mf_node **keynodes)
{
    const mf_schema_section *s = &mf_schema_sections[sec];
    return mf_load_fields(l, map, s->what, s, out, keynodes);
}

/* A mapping keyed by n names of the schedule (axes, roles, collectives),
 * each required, with values of `type`. */
static bool mf_load_named(mf_loader *l, mf_node *map, const char *what, const char *const *names, int n,
                          mf_schema_type type, mf_node **out)
{
    mf_schema_key keys[MF_OPKIND_COUNT + MF_ROLE_COUNT + MF_MAX_AXES]; /* n is one of these counts */
    for (int i = 0; i < n; i++)
        keys[i] = (mf_schema_key){names[i], strlen(names[i]), type, MF_SCHEMA_REQUIRED, 0, what};
    mf_schema_section sec = {what, what, keys, n};
    return mf_load_fields(l, map, what, &sec, out, NULL);
}

static bool mf_load_str(mf_loader *l, mf_node *n, const char *what, const char **out)
{
    if (n->type != YAML_SCALAR_NODE)
        return mf_load_fail(l, n, "expected a string for %s, got %s", what, mf_load_node_kind(n));
    if (n->data.scalar.length != strlen(mf_load_scalar(n)))
        return mf_load_fail(l, n, "%s contains a NUL character", what);
    *out = mf_load_scalar(n);
    return true;
}

/* A name: a non-empty string, copied into the schedule's arena. */
static bool mf_load_name(mf_loader *l, mf_node *n, const char *what, const char **out)
{
    const char *v = NULL;
    if (!mf_load_str(l, n, what, &v))
        return false;
    if (!v[0])
        return mf_load_fail(l, n, "%s is empty", what);
    if (n->data.scalar.length > MF_LIMIT_NAME_BYTES)
        return mf_load_fail(l, n, "%s of %zu bytes is too long (limit is %d)", what,
                            (size_t)n->data.scalar.length, MF_LIMIT_NAME_BYTES);
    *out = mf_arena_strdup(l->s->arena, v);
    return *out ? true : mf_load_oom(l);
}

static bool mf_load_int(mf_loader *l, mf_node *n, const char *what, int64_t min, int64_t max,
                        int64_t *out)
{
    if (n->type != YAML_SCALAR_NODE)
        return mf_load_fail(l, n, "expected an integer for %s, got %s", what, mf_load_node_kind(n));
    const char *v = mf_load_scalar(n);
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return mf_load_fail(l, n, "expected an integer for %s, got the quoted string '%s'", what, v);
    const char *p = v;
    bool neg = *p == '-';
    if (neg)
        p++;
    if (!*p || (p[0] == '0' && p[1]))
        return mf_load_fail(l, n, "expected an integer for %s, got '%s'", what, v);
    uint64_t acc = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return mf_load_fail(l, n, "expected an integer for %s, got '%s'", what, v);
        unsigned d = (unsigned)(*p - '0');
        if (acc > (UINT64_MAX - d) / 10 || acc * 10 + d > (uint64_t)INT64_MAX + (neg ? 1u : 0u))
            return mf_load_fail(l, n, "%s overflows 64 bits: '%s'", what, v);
        acc = acc * 10 + d;
    }
    int64_t x = neg ? (acc == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)acc) : (int64_t)acc;
    if (x < min) {
        if (min == 0)
            return mf_load_fail(l, n, "%s must not be negative, got %lld", what, (long long)x);
        return mf_load_fail(l, n, "%s must be at least %lld, got %lld", what, (long long)min,
                            (long long)x);
    }
    if (x > max)
        return mf_load_fail(l, n, "%s must be at most %lld, got %lld", what, (long long)max,
                            (long long)x);
    *out = x;
    return true;
}

static bool mf_load_int32(mf_loader *l, mf_node *n, const char *what, int64_t min, int *out)
{
    int64_t v;
    if (!mf_load_int(l, n, what, min, INT_MAX, &v))
        return false;
    *out = (int)v;
    return true;
}

static bool mf_load_bool(mf_loader *l, mf_node *n, const char *what, bool *out)
{
    if (n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        if (strcmp(mf_load_scalar(n), "true") == 0) {
            *out = true;
            return true;
        }
        if (strcmp(mf_load_scalar(n), "false") == 0) {
            *out = false;
            return true;
        }
    }
    return mf_load_fail(l, n, "expected true or false for %s", what);
}

typedef int (*mf_from_name_fn)(const char *);

/* An enum name; `choices` lists the accepted names for the message. */
static bool mf_load_enum(mf_loader *l, mf_node *n, const char *what, mf_from_name_fn from,
                         const char *choices, int *out)
{
    const char *v = NULL;
    if (!mf_load_str(l, n, what, &v))
        return false;
    int x = from(v);
    if (x < 0)
        return mf_load_fail(l, n, "unknown %s '%s' (expected %s)", what, v, choices);
    *out = x;
    return true;
}

/* "a, b, c": the names of an X-macro table, for messages. */
#define MF_CHOICE_ITEM(E, name, ...) ", " name
#define MF_CHOICES(list) (&(list(MF_CHOICE_ITEM))[2]) /* skip the first ", " */
static const char *const mf_dtype_choices = MF_CHOICES(MF_DTYPE_LIST);
static const char *const mf_place_choices = MF_CHOICES(MF_PLACE_LIST);
static const char *const mf_phase_choices = MF_CHOICES(MF_PHASE_LIST);
static const char *const mf_when_choices = MF_CHOICES(MF_WHEN_LIST);
static const char *const mf_stream_choices = MF_CHOICES(MF_STREAM_LIST);
static const char *const mf_reduce_choices = MF_CHOICES(MF_REDUCE_LIST);
static const char *const mf_lifetime_choices = MF_CHOICES(MF_LIFETIME_LIST);
static const char *const mf_bufkind_choices = MF_CHOICES(MF_BUFKIND_LIST);
static const char *const mf_opkind_choices = MF_CHOICES(MF_OPKIND_LIST);
#undef MF_CHOICES
#undef MF_CHOICE_ITEM

static bool mf_load_seq(mf_loader *l, mf_node *n, const char *what)
{
    if (n->type != YAML_SEQUENCE_NODE)
        return mf_load_fail(l, n, "expected a sequence for %s, got %s", what, mf_load_node_kind(n));
    return true;
}

static int mf_load_seq_len(const mf_node *n)
{
    return (int)(n->data.sequence.items.top - n->data.sequence.items.start);
}

static mf_node *mf_load_item(mf_loader *l, mf_node *seq, int i)
{
    return mf_load_node(l, seq->data.sequence.items.start[i]);
}

/* A placement: one name per mesh axis, Flat axes a suffix (docs/semantics.md §1).
 * With `whole` (a bucket's grad or main_weight; NULL elsewhere) also Whole,
 * from format 7 on (5 and 6 wrote equal, padded whole shards: refused with a
 * hint): all split axes Whole (stored Flat, *whole set) or none.
 * From format 6 on, Distinct anywhere (MF_PLACE_DISTINCT; the structural
 * checker holds a bucket's three roles to the same Distinct axes). */
static bool mf_load_placement(mf_loader *l, mf_node *n, const char *what, bool allow_partial,
                              mf_placement *out, bool *whole)
{
    mf_node *first_whole = NULL, *first_flat = NULL;
    if (!mf_load_seq(l, n, what))
        return false;
    int naxes = l->s->mesh.naxes;
    if (mf_load_seq_len(n) != naxes)
        return mf_load_fail(l, n, "%s has %d entries, expected one per mesh axis (%d)", what,
                            mf_load_seq_len(n), naxes);
    memset(out, 0, sizeof *out);
    for (int j = 0; j < naxes; j++) {
        int p = 0;
        mf_node *it = mf_load_item(l, n, j);
        if (it->type == YAML_SCALAR_NODE && strcmp(mf_load_scalar(it), MF_WHOLE_NAME) == 0) {
            if (l->version < mf_schema_format_version(MF_SCHEDULE_FORMAT_WHOLE))
                return mf_load_fail(l, it, "%s: placement 'Whole' needs format %s (the file says mfsdp-schedule/%d)",
                                    what, MF_SCHEDULE_FORMAT_RAGGED, l->version);
            if (l->version < mf_schema_format_version(MF_SCHEDULE_FORMAT_RAGGED))
                return mf_load_fail(l, it, "%s: a Whole bucket of format mfsdp-schedule/%d is laid out in equal, "
                                    "padded shards; this mfsdp reads ragged shards (format %s); compile the spec "
                                    "again with this mfsdpc", what, l->version, MF_SCHEDULE_FORMAT_RAGGED);
            if (!whole)
                return mf_load_fail(l, it, "%s may not be Whole; only a bucket's grad and main_weight may be (the "
                                    "weight is all-gathered before compute, buffers are written Flat)", what);
            first_whole = first_whole ? first_whole : it;
            p = MF_PLACE_FLAT;
        } else if (it->type == YAML_SCALAR_NODE && strcmp(mf_load_scalar(it), MF_DISTINCT_NAME) == 0) {
            if (l->version < mf_schema_format_version(MF_SCHEDULE_FORMAT_DISTINCT))
                return mf_load_fail(l, it, "%s: placement 'Distinct' needs format %s (the file says mfsdp-schedule/%d)",
                                    what, MF_SCHEDULE_FORMAT_DISTINCT, l->version);
            p = MF_PLACE_DISTINCT;
        } else {
            if (!mf_load_enum(l, it, "placement", mf_place_from_name, mf_place_choices, &p))
                return false;
            if (p == MF_PLACE_FLAT && !first_flat)
                first_flat = it;
        }
        if (p == MF_PLACE_PARTIAL && !allow_partial)
            return mf_load_fail(l, it, "%s may not be Partial", what);
        if (first_whole && first_flat)
            return mf_load_fail(l, it, "%s mixes Whole and Flat; a role's split axes are all Whole or all Flat", what);
        out->p[j] = (uint8_t)p;
    }
    if (whole)
        *whole = first_whole != NULL;
    if (!mf_layout_flat_suffix_ok(out, naxes))
        return mf_load_fail(l, n, "%s: the Flat axes must be the innermost ones (a suffix of the mesh)",
                            what);
    return true;
}

/* Resolves a name in a table; `what` names the kind of thing for the message. */
static bool mf_load_ref(mf_loader *l, mf_node *n, const mf_hash *t, const char *what, int *out)
{
    const char *v = NULL;
    if (!mf_load_str(l, n, what, &v))
        return false;
    int x = (int)mf_hash_get_str(t, v);
    if (x < 0)
        return mf_load_fail(l, n, "unknown %s '%s'", what, v);
    *out = x;
    return true;
}

static bool mf_load_register(mf_loader *l, mf_hash *t, const char *name, mf_node *at,
                             const char *what, int val)
{
    int r = mf_hash_put_str(t, name, val);
    if (r < 0)
        return mf_load_oom(l);
    if (r == 0)
        return mf_load_fail(l, at, "duplicate %s name '%s'", what, name);
    return true;
}

/* An arena array of n elements of `size` bytes (room for one when n is 0);
 * NULL, with the error set, when out of memory. */
static void *mf_load_array(mf_loader *l, int n, size_t size)
{
    void *a = mf_arena_array(l->s->arena, (size_t)(n ? n : 1), size);
    if (!a)
        mf_load_oom(l);
    return a;
}

/* A list of the file: refuses a non-sequence, sets *count and returns an
 * array of *count items of `size` bytes, and in *where (when non-NULL) one
 * node per item for the messages of later checks; NULL with the error set. */
static void *mf_load_list(mf_loader *l, mf_node *n, const char *what, int *count, size_t size, mf_node ***where)
{
    if (!mf_load_seq(l, n, what))
        return NULL;
    *count = mf_load_seq_len(n);
    if (where && !(*where = mf_load_array(l, *count, sizeof **where)))
        return NULL;
    return mf_load_array(l, *count, size);
}

/* The keys of an item of section sec, then its name (the value of key
 * `name_key`), registered as item i in `names` under `kind` for messages. */
static bool mf_load_named_item(mf_loader *l, mf_node *item, mf_section sec, mf_node **v, int name_key,
                               mf_hash *names, const char *kind, int i, const char **name)
{
    return mf_load_section(l, item, sec, v, NULL) &&
           mf_load_name(l, v[name_key], mf_schema_sections[sec].keys[name_key].what, name) &&
           mf_load_register(l, names, *name, v[name_key], kind, i);
}

/* ---- sections ---- */

static bool mf_load_mesh(mf_loader *l, mf_node *n)
{
    mf_node *v[MF_K_MESH_NKEYS] = {NULL}, *a[MF_K_AXIS_NKEYS] = {NULL};
    if (!mf_load_section(l, n, MF_SECTION_MESH, v, NULL) || !mf_load_seq(l, v[MF_K_MESH_AXES], MF_WHAT(MESH, AXES)))
        return false;
    mf_node *axes = v[MF_K_MESH_AXES];
    int naxes = mf_load_seq_len(axes);
    if (naxes < 1 || naxes > MF_MAX_AXES)
        return mf_load_fail(l, axes, "the mesh has %d axes, expected 1 to %d", naxes, MF_MAX_AXES);
    mf_mesh *m = &l->s->mesh;
    m->naxes = naxes;
    m->world = 1;
    for (int j = 0; j < naxes; j++) {
        if (!mf_load_section(l, mf_load_item(l, axes, j), MF_SECTION_AXIS, a, NULL) ||
            !mf_load_name(l, a[MF_K_AXIS_NAME], MF_WHAT(AXIS, NAME), &m->axes[j].name) ||
            !mf_load_int(l, a[MF_K_AXIS_SIZE], MF_WHAT(AXIS, SIZE), 1, MF_LIMIT_WORLD, &m->axes[j].size) ||
            !mf_load_register(l, &l->axes, m->axes[j].name, a[MF_K_AXIS_NAME], "axis", j))
            return false;
        m->world *= m->axes[j].size;   /* both at most MF_LIMIT_WORLD: no overflow */
        if (m->world > MF_LIMIT_WORLD)
            return mf_load_fail(l, a[MF_K_AXIS_SIZE], "the mesh has %lld ranks (limit is %d)", (long long)m->world,
                                MF_LIMIT_WORLD);
    }
    return true;
}

static bool mf_load_units(mf_loader *l, mf_node *n, mf_node ***bucket_lists)
{
    mf_schedule *s = l->s;
    if (!(s->units = mf_load_list(l, n, MF_WHAT(ROOT, UNITS), &s->nunits, sizeof *s->units, bucket_lists)))
        return false;
    if (s->nunits > MF_LIMIT_UNITS)
        return mf_load_fail(l, n, "the schedule has %d units (limit is %d)", s->nunits, MF_LIMIT_UNITS);
    for (int u = 0; u < s->nunits; u++) {
        mf_node *v[MF_K_UNIT_NKEYS];
        mf_unit *un = &s->units[u];
        if (!mf_load_section(l, mf_load_item(l, n, u), MF_SECTION_UNIT, v, NULL) ||
            !mf_load_name(l, v[MF_K_UNIT_NAME], MF_WHAT(UNIT, NAME), &un->name) ||
            !mf_load_bool(l, v[MF_K_UNIT_RESHARD], MF_WHAT(UNIT, RESHARD), &un->reshard_after_forward) ||
            !mf_load_seq(l, v[MF_K_UNIT_BUCKETS], MF_WHAT(UNIT, BUCKETS)) ||
            !mf_load_register(l, &l->units, un->name, v[MF_K_UNIT_NAME], "unit", u))
            return false;
        (*bucket_lists)[u] = v[MF_K_UNIT_BUCKETS];
    }
    return true;
}

/* The tensor section with the optional key `global` (format 6) appended,
 * into keys[MF_K_TENSOR_NKEYS + 1] (per call: no shared state between
 * threads): MF_SCHEDULE_KEY_GLOBAL is not yet in core/mf_schema.h's table.
 * Its presence is none of the table's (optional: mf_load_fields checks
 * REQUIRED only). */
static mf_schema_section mf_load_tensor_section(mf_schema_key *keys)
{
    const mf_schema_section *base = &mf_schema_sections[MF_SECTION_TENSOR];
    memcpy(keys, base->keys, sizeof(mf_schema_key) * MF_K_TENSOR_NKEYS);
    keys[MF_K_TENSOR_NKEYS] = (mf_schema_key){MF_SCHEDULE_KEY_GLOBAL, strlen(MF_SCHEDULE_KEY_GLOBAL),
                                              MF_SCHEMA_LIST, MF_SCHEMA_PRESENCE_COUNT,
                                              mf_schema_format_version(MF_SCHEDULE_FORMAT_DISTINCT),
                                              "the global names"};
    return (mf_schema_section){base->path, base->what, keys, MF_K_TENSOR_NKEYS + 1};
}

/* Registers global name `name` (at node at) against every other one. */
static bool mf_load_global_name(mf_loader *l, const char *name, mf_node *at, const char *tensor)
{
    int r = mf_hash_put_str(&l->globals, name, 1);
    if (r < 0)
        return mf_load_oom(l);
    if (r == 0)
        return mf_load_fail(l, at, "global name '%s' of tensor '%s' is already a global tensor name; global "
                            "names must be unique in the schedule", name, tensor);
    return true;
}

/* The `global` value g of tensor te of bucket bk: a list of one name per
 * coordinate combination of the Distinct axes, or {name: N, split: D}. */
static bool mf_load_global(mf_loader *l, mf_node *g, const mf_bucket *bk, mf_tensor *te)
{
    const mf_mesh *m = &l->s->mesh;
    int64_t combos = 1;
    int ndist = 0;
    for (int j = 0; j < m->naxes; j++)
        if (bk->place[MF_ROLE_WEIGHT].p[j] == MF_PLACE_DISTINCT) {
            combos *= m->axes[j].size;
            ndist++;
        }
    if (!ndist)
        return mf_load_fail(l, g, "tensor '%s' has global names but bucket '%s' is Distinct on no axis; only a "
                            "Distinct tensor has them", te->name, bk->name);
    if (g->type == YAML_MAPPING_NODE) {
        mf_node *v[2] = {NULL, NULL};
        const char *names[2] = {MF_SCHEDULE_KEY_GLOBAL_NAME, MF_SCHEDULE_KEY_GLOBAL_SPLIT};
        mf_schema_key keys[2] = {{names[0], strlen(names[0]), MF_SCHEMA_NAME, MF_SCHEMA_REQUIRED, 0, "a global name"},
                                 {names[1], strlen(names[1]), MF_SCHEMA_INT, MF_SCHEMA_REQUIRED, 0, "split"}};
        mf_schema_section sec = {"global", "a split global name", keys, 2};
        int64_t d;
        if (!(te->global = mf_load_array(l, 1, sizeof *te->global)) ||
            !mf_load_fields(l, g, sec.what, &sec, v, NULL) ||
            !mf_load_name(l, v[0], "a global name", &te->global[0]))
            return false;
        if (!mf_load_int(l, v[1], "split", 0, INT64_MAX, &d))
            return false;
        if (d >= te->ndims)
            return mf_load_fail(l, v[1], "split %lld of tensor '%s' is out of range: it has %d dims", (long long)d,
                                te->name, te->ndims);
        te->nglobal = 1;
        te->global_split = true;
        te->global_dim = (int)d;
        return mf_load_global_name(l, te->global[0], v[0], te->name);
    }
    if (!mf_load_seq(l, g, "the global names"))
        return false;
    int n = mf_load_seq_len(g);
    if (n != combos)
        return mf_load_fail(l, g, "tensor '%s' has %d global names, expected %lld: one per coordinate of its "
                            "Distinct axes", te->name, n, (long long)combos);
    if (!(te->global = mf_load_array(l, n, sizeof *te->global)))
        return false;
    for (int i = 0; i < n; i++) {
        mf_node *gn = mf_load_item(l, g, i);
        if (!mf_load_name(l, gn, "a global name", &te->global[i]) ||
            !mf_load_global_name(l, te->global[i], gn, te->name))
            return false;
    }
    te->nglobal = n;
    return true;
}

static bool mf_load_tensors(mf_loader *l, mf_node *n, mf_bucket *bk)
{
    if (!mf_load_seq(l, n, MF_WHAT(BUCKET, TENSORS)))
        return false;
    bk->ntensors = mf_load_seq_len(n);
    if (bk->ntensors < 1)
        return mf_load_fail(l, n, "bucket '%s' has no tensors", bk->name);
    if ((l->ntensors += bk->ntensors) > MF_LIMIT_TENSORS)
        return mf_load_fail(l, n, "the schedule has more than %d tensors (the limit)", MF_LIMIT_TENSORS);
    if (!(bk->tensors = mf_load_array(l, bk->ntensors, sizeof *bk->tensors)))
        return false;
    int64_t end = 0;
    mf_schema_key keys[MF_K_TENSOR_NKEYS + 1];
    const mf_schema_section sec = mf_load_tensor_section(keys);
    for (int t = 0; t < bk->ntensors; t++) {
        mf_tensor *te = &bk->tensors[t];
        mf_node *v[MF_K_TENSOR_NKEYS + 1];
        if (!mf_load_fields(l, mf_load_item(l, n, t), sec.what, &sec, v, NULL) ||
            !mf_load_name(l, v[MF_K_TENSOR_NAME], MF_WHAT(TENSOR, NAME), &te->name) ||
            !mf_load_register(l, &l->tensors, te->name, v[MF_K_TENSOR_NAME], "tensor", t) ||
            !mf_load_int(l, v[MF_K_TENSOR_OFFSET], MF_WHAT(TENSOR, OFFSET), 0, INT64_MAX, &te->offset) ||
            !mf_load_int(l, v[MF_K_TENSOR_NUMEL], MF_WHAT(TENSOR, NUMEL), 0, INT64_MAX, &te->numel) ||
            !mf_load_seq(l, v[MF_K_TENSOR_DIMS], MF_WHAT(TENSOR, DIMS)))
            return false;
        te->ndims = mf_load_seq_len(v[MF_K_TENSOR_DIMS]);
        if (te->ndims < 1 || te->ndims > MF_MAX_DIMS)
            return mf_load_fail(l, v[MF_K_TENSOR_DIMS], "tensor '%s' has %d dims, expected 1 to %d", te->name,
                                te->ndims, MF_MAX_DIMS);
        int64_t prod = 1;
        for (int d = 0; d < te->ndims; d++) {
            mf_node *dn = mf_load_item(l, v[MF_K_TENSOR_DIMS], d);
            if (!mf_load_int(l, dn, "a dimension", 0, INT64_MAX, &te->dims[d]))
                return false;
            if (te->dims[d] && prod > INT64_MAX / te->dims[d])
                return mf_load_fail(l, dn, "the size of tensor '%s' overflows 64 bits", te->name);
            prod *= te->dims[d];
        }
        if (prod != te->numel)
            return mf_load_fail(l, v[MF_K_TENSOR_NUMEL], "tensor '%s': numel %lld is not the product of its dims (%lld)",
                                te->name, (long long)te->numel, (long long)prod);
        if (te->offset < end)
            return mf_load_fail(l, v[MF_K_TENSOR_OFFSET], "tensor '%s' at offset %lld overlaps the previous tensor (which ends at %lld)",
                                te->name, (long long)te->offset, (long long)end);
        if (te->numel > bk->used || te->offset > bk->used - te->numel)
            return mf_load_fail(l, v[MF_K_TENSOR_OFFSET], "tensor '%s' (offset %lld, numel %lld) lies outside the used part of bucket '%s' (%lld elements)",
                                te->name, (long long)te->offset, (long long)te->numel, bk->name,
                                (long long)bk->used);
        end = te->offset + te->numel;
        mf_node *g = v[MF_K_TENSOR_NKEYS];
        if (g ? !mf_load_global(l, g, bk, te)
              : !mf_placement_has_distinct(&bk->place[MF_ROLE_WEIGHT], l->s->mesh.naxes) &&
                    !mf_load_global_name(l, te->name, v[MF_K_TENSOR_NAME], te->name))
            return false;
    }
    return true;
}

/* `used` is the end of the furthest tensor (docs/schedule.md §2.1): a
 * forged value would pass for the extent of the tensors. */
static bool mf_load_used(mf_loader *l, mf_node *at, const mf_bucket *bk)
{
    int64_t furthest = 0;
    int far = 0;
    for (int i = 0; i < bk->ntensors; i++)
        if (bk->tensors[i].offset + bk->tensors[i].numel >= furthest) {
            furthest = bk->tensors[i].offset + bk->tensors[i].numel;
            far = i;
        }
    if (bk->used != furthest)
        return mf_load_fail(l, at, "bucket '%s': used %lld is not the end of its furthest tensor ('%s' ends at %lld)",
                            bk->name, (long long)bk->used, bk->tensors[far].name, (long long)furthest);
    return true;
}

/* The `bounds` of bucket bk (format 7), at node n (NULL: absent): present
 * exactly when a role is Whole, one entry per shard of the finest Whole
 * role plus one; the values are checked by mf_struct_bucket_bounds. */
static bool mf_load_bounds(mf_loader *l, mf_node *n, mf_node *at, mf_bucket *bk)
{
    int64_t want = mf_layout_bucket_nbounds(&l->s->mesh, bk);
    if (!n) {
        if (want)
            return mf_load_fail(l, at, "bucket '%s' has a Whole role but no key '%s' (its ragged shards: %lld bounds)",
                                bk->name, MF_KEY(BUCKET, BOUNDS)->name, (long long)want);
        return true;
    }
    if (!want)
        return mf_load_fail(l, n, "bucket '%s' has '%s' but no Whole role; only a whole bucket has ragged shards",
                            bk->name, MF_KEY(BUCKET, BOUNDS)->name);
    if (!mf_load_seq(l, n, MF_WHAT(BUCKET, BOUNDS)))
        return false;
    if (mf_load_seq_len(n) != want)
        return mf_load_fail(l, n, "bucket '%s' has %d bounds, expected %lld: one per shard of its finest Whole role "
                            "and the end", bk->name, mf_load_seq_len(n), (long long)want);
    if (!(bk->bounds = mf_load_array(l, (int)want, sizeof *bk->bounds)))
        return false;
    for (int q = 0; q < (int)want; q++)
        if (!mf_load_int(l, mf_load_item(l, n, q), MF_WHAT(BUCKET, BOUNDS), 0, INT64_MAX, &bk->bounds[q]))
            return false;
    mf_load_site site = {.l = l, .any = n};
    mf_struct_sink sink = {mf_load_finding, &site, 0, false};
    mf_struct_bucket_bounds(l->s, (int)(bk - l->s->buckets), &sink);
    return sink.findings == 0;
}

static bool mf_load_buckets(mf_loader *l, mf_node *n)
{
    mf_schedule *s = l->s;
    if (!(s->buckets = mf_load_list(l, n, MF_WHAT(ROOT, BUCKETS), &s->nbuckets, sizeof *s->buckets, NULL)))
        return false;
    for (int b = 0; b < s->nbuckets; b++) {
        mf_bucket *bk = &s->buckets[b];
        mf_node *v[MF_K_BUCKET_NKEYS];
        if (!mf_load_named_item(l, mf_load_item(l, n, b), MF_SECTION_BUCKET, v, MF_K_BUCKET_NAME, &l->buckets,
                                "bucket", b, &bk->name) ||
            !mf_load_ref(l, v[MF_K_BUCKET_UNIT], &l->units, MF_WHAT(BUCKET, UNIT), &bk->unit) ||
            !mf_load_ref(l, v[MF_K_BUCKET_LAST_UNIT], &l->units, MF_WHAT(BUCKET, LAST_UNIT), &bk->last_unit) ||
            !mf_load_name(l, v[MF_K_BUCKET_LAYOUT], MF_WHAT(BUCKET, LAYOUT), &bk->layout) ||
            !mf_load_int(l, v[MF_K_BUCKET_LENGTH], MF_WHAT(BUCKET, LENGTH), 1, INT64_MAX, &bk->length) ||
            !mf_load_int(l, v[MF_K_BUCKET_USED], MF_WHAT(BUCKET, USED), 0, INT64_MAX, &bk->used))
            return false;
        if (bk->last_unit < bk->unit)
            return mf_load_fail(l, v[MF_K_BUCKET_LAST_UNIT], "bucket '%s': last_unit '%s' comes before its unit '%s'",
                                bk->name, s->units[bk->last_unit].name, s->units[bk->unit].name);
        if (b > 0 && bk->unit < s->buckets[b - 1].unit)
            return mf_load_fail(l, v[MF_K_BUCKET_UNIT], "bucket '%s' is listed after a bucket of a later unit (buckets must be in unit order)",
                                bk->name);
        if (bk->used > bk->length)
            return mf_load_fail(l, v[MF_K_BUCKET_USED], "bucket '%s': used %lld exceeds the length %lld", bk->name,
                                (long long)bk->used, (long long)bk->length);
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            mf_node *rv[MF_K_ROLE_NKEYS];
            int dt;
            char what[64];
            const char *role = MF_KEY(BUCKET, WEIGHT)[r].name; /* the roles' keys, in mf_role order */
            snprintf(what, sizeof what, "the %s placement", role);
            if (!mf_load_fields(l, v[MF_K_BUCKET_WEIGHT + r], role, &mf_schema_sections[MF_SECTION_ROLE], rv, NULL) ||
                !mf_load_enum(l, rv[MF_K_ROLE_DTYPE], MF_WHAT(ROLE, DTYPE), mf_dtype_from_name, mf_dtype_choices, &dt) ||
                !mf_load_placement(l, rv[MF_K_ROLE_PLACEMENT], what, r == MF_ROLE_GRAD, &bk->place[r],
                                   r == MF_ROLE_WEIGHT ? NULL : &bk->whole[r]))
                return false;
            bk->dtype[r] = (mf_dtype)dt;
        }
        if (!mf_load_bounds(l, v[MF_K_BUCKET_BOUNDS], v[MF_K_BUCKET_LENGTH], bk))
            return false;
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            mf_load_site site = {.l = l, .any = v[MF_K_BUCKET_LENGTH]};
            mf_struct_sink sink = {mf_load_finding, &site, 0, false};
            mf_struct_bucket_role(s, b, r, &sink);
            if (sink.findings)
                return false;
        }
        if (!mf_load_tensors(l, v[MF_K_BUCKET_TENSORS], bk))
            return false;
        if (!mf_load_used(l, v[MF_K_BUCKET_USED], bk))
            return false;
        mf_load_site site = {.l = l, .any = v[MF_K_BUCKET_TENSORS]};
        mf_struct_sink sink = {mf_load_finding, &site, 0, false};
        mf_struct_bucket_whole(s, b, &sink);
        if (!sink.findings)
            mf_struct_bucket_distinct(s, b, &sink);
        if (sink.findings)
            return false;
    }
    return true;
}

/* Checks each unit's bucket list against the buckets' `unit` fields. */
static bool mf_load_unit_buckets(mf_loader *l, mf_node **lists)
{
    mf_schedule *s = l->s;
    int b = 0;
    for (int u = 0; u < s->nunits; u++) {
        mf_unit *un = &s->units[u];
        un->first_bucket = b;
        while (b < s->nbuckets && s->buckets[b].unit == u)
            b++;
        un->nbuckets = b - un->first_bucket;
        mf_node *list = lists[u];
        int n = mf_load_seq_len(list);
        for (int i = 0; i < n; i++) {
            int x = -1;
            if (!mf_load_ref(l, mf_load_item(l, list, i), &l->buckets, "bucket", &x))
                return false;
            if (s->buckets[x].unit != u)
                return mf_load_fail(l, mf_load_item(l, list, i), "unit '%s' lists bucket '%s', whose unit is '%s'",
                                    un->name, s->buckets[x].name, s->units[s->buckets[x].unit].name);
            if (i >= un->nbuckets || x != un->first_bucket + i)
                return mf_load_fail(l, mf_load_item(l, list, i), "unit '%s' lists bucket '%s' out of the order of the buckets section",
                                    un->name, s->buckets[x].name);
        }
        if (n != un->nbuckets)
            return mf_load_fail(l, list, "unit '%s' lists %d buckets, but %d buckets name it as their unit",
                                un->name, n, un->nbuckets);
    }
    return true;
}

static bool mf_load_buffers(mf_loader *l, mf_node *n, mf_node ***where)
{
    mf_schedule *s = l->s;
    if (!(s->buffers = mf_load_list(l, n, MF_WHAT(ROOT, BUFFERS), &s->nbuffers, sizeof *s->buffers, where)))
        return false;
    for (int i = 0; i < s->nbuffers; i++) {
        mf_buffer *bf = &s->buffers[i];
        mf_node *item = mf_load_item(l, n, i), *v[MF_K_BUFFER_NKEYS];
        int kind, dt, life;
        if (!mf_load_named_item(l, item, MF_SECTION_BUFFER, v, MF_K_BUFFER_NAME, &l->buffers, "buffer", i,
                                &bf->name) ||
            !mf_load_ref(l, v[MF_K_BUFFER_BUCKET], &l->buckets, MF_WHAT(BUFFER, BUCKET), &bf->bucket) ||
            !mf_load_enum(l, v[MF_K_BUFFER_KIND], MF_WHAT(BUFFER, KIND), mf_bufkind_from_name, mf_bufkind_choices,
                          &kind) ||
            !mf_load_enum(l, v[MF_K_BUFFER_DTYPE], MF_WHAT(BUFFER, DTYPE), mf_dtype_from_name, mf_dtype_choices, &dt))
            return false;
        bf->kind = (mf_bufkind)kind;
        bf->dtype = (mf_dtype)dt;
        if (!mf_load_placement(l, v[MF_K_BUFFER_PLACEMENT], MF_WHAT(BUFFER, PLACEMENT),
                               mf_bufkind_role(bf->kind) == MF_ROLE_GRAD, &bf->place, NULL) ||
            !mf_load_int(l, v[MF_K_BUFFER_COUNT], MF_WHAT(BUFFER, COUNT), 1, INT64_MAX, &bf->count) ||
            !mf_load_enum(l, v[MF_K_BUFFER_LIFETIME], MF_WHAT(BUFFER, LIFETIME), mf_lifetime_from_name,
                          mf_lifetime_choices, &life) ||
            !mf_load_int(l, v[MF_K_BUFFER_OFFSET], MF_WHAT(BUFFER, OFFSET), 0, INT64_MAX, &bf->offset))
            return false;
        bf->lifetime = (mf_lifetime)life;
        mf_load_site site = {.l = l, .any = item};
        site.field[MF_FIELD_COUNT] = v[MF_K_BUFFER_COUNT];
        mf_struct_sink k = {mf_load_finding, &site, 0, false};
        mf_struct_buffer(s, i, &k);
        if (k.findings)
            return false;
        (*where)[i] = item;
    }
    return true;
}

/* The normative buffer rules (core/mf_struct.c). */
static bool mf_load_bucket_buffers(mf_loader *l, mf_node **where, mf_node *section)
{
    mf_load_site site = {.l = l, .buffers = where, .section = section, .any = section};
    mf_struct_sink k = {mf_load_finding, &site, 0, false};
    mf_struct_bucket_buffers(l->s, &k);
    return k.findings == 0;
}

/* The unit of an op: present exactly at a phase with a unit (the presence
 * column of core/mf_schema.h). */
static bool mf_load_op_unit(mf_loader *l, mf_node *item, int i, mf_op *op, mf_node **v, mf_node **k)
{
    bool step_phase = mf_phase_is_step(op->phase);
    if (step_phase && v[MF_K_OP_UNIT])
        return mf_load_fail(l, k[MF_K_OP_UNIT], "op %d: a %s op has no unit", i, mf_phase_name(op->phase));
    if (!step_phase && !v[MF_K_OP_UNIT])
        return mf_load_fail(l, item, "missing key '%s' in op %d (phase %s)", MF_KEY(OP, UNIT)->name, i,
                            mf_phase_name(op->phase));
    return !v[MF_K_OP_UNIT] || mf_load_ref(l, v[MF_K_OP_UNIT], &l->units, MF_WHAT(OP, UNIT), &op->unit);
}

/*
 * The other keys an op has by its kind (the presence column): an event on
 * record and wait, the data keys on the others and an axis on those along an
 * axis.
 */
static bool mf_load_op_keys(mf_loader *l, mf_node *item, int i, const mf_op *op, mf_node **v, mf_node **k)
{
    const mf_schema_section *sec = &mf_schema_sections[MF_SECTION_OP];
    const char *kind = mf_opkind_name(op->kind);
    bool is_event = !mf_op_is_data(op), has_axis = mf_opkind_on_axis(op->kind);
    for (int f = 0; f < sec->nkeys; f++) {
        mf_schema_presence p = sec->keys[f].presence;
        bool data = p == MF_SCHEMA_DATA_OP || p == MF_SCHEMA_AXIS_OP;
        if (is_event && data && v[f])
            return mf_load_fail(l, k[f], "op %d: a %s op has no key '%s'", i, kind, sec->keys[f].name);
    }
    const mf_schema_key *event = MF_KEY(OP, EVENT);
    if (is_event && !v[MF_K_OP_EVENT])
        return mf_load_fail(l, item, "missing key '%s' in op %d (%s)", event->name, i, kind);
    if (is_event)
        return true;
    if (v[MF_K_OP_EVENT])
        return mf_load_fail(l, k[MF_K_OP_EVENT], "op %d: a %s op has no key '%s'", i, kind, event->name);
    for (int f = 0; f < sec->nkeys; f++)
        if (sec->keys[f].presence == MF_SCHEMA_DATA_OP && !v[f])
            return mf_load_fail(l, item, "missing key '%s' in op %d (%s)", sec->keys[f].name, i, kind);
    const char *axis = MF_KEY(OP, AXIS)->name;
    if (has_axis && !v[MF_K_OP_AXIS])
        return mf_load_fail(l, item, "missing key '%s' in op %d (%s)", axis, i, kind);
    if (!has_axis && v[MF_K_OP_AXIS])
        return mf_load_fail(l, k[MF_K_OP_AXIS], "op %d: a %s op has no key '%s'", i, kind, axis);
    return true;
}

/* The data fields of a data op: transition, bucket, axis, dtype, count, src, dst. */
static bool mf_load_op_data(mf_loader *l, mf_node **v, mf_op *op)
{
    const char *t = NULL;
    int x;
    if (!mf_load_str(l, v[MF_K_OP_TRANSITION], MF_WHAT(OP, TRANSITION), &t))
        return false;
    if (t[0] != 'T' || t[1] < '1' || t[1] > '4' || t[2])
        return mf_load_fail(l, v[MF_K_OP_TRANSITION], "unknown transition '%s' (expected T1, T2, T3, T4)", t);
    op->transition = t[1] - '0';
    if (!mf_load_ref(l, v[MF_K_OP_BUCKET], &l->buckets, MF_WHAT(OP, BUCKET), &op->bucket) ||
        (v[MF_K_OP_AXIS] && !mf_load_ref(l, v[MF_K_OP_AXIS], &l->axes, MF_WHAT(OP, AXIS), &op->axis)) ||
        !mf_load_enum(l, v[MF_K_OP_DTYPE], MF_WHAT(OP, DTYPE), mf_dtype_from_name, mf_dtype_choices, &x))
        return false;
    op->dtype = (mf_dtype)x;
    return mf_load_int(l, v[MF_K_OP_COUNT], MF_WHAT(OP, COUNT), 1, INT64_MAX, &op->count) &&
           mf_load_ref(l, v[MF_K_OP_SRC], &l->buffers, MF_WHAT(OP, SRC), &op->src) &&
           mf_load_ref(l, v[MF_K_OP_DST], &l->buffers, MF_WHAT(OP, DST), &op->dst);
}

static bool mf_load_op(mf_loader *l, mf_node *item, int i, mf_op *op)
{
    mf_node *v[MF_K_OP_NKEYS], *k[MF_K_OP_NKEYS];
    mf_schedule *s = l->s;
    int phase, when, stream, kind;
    int64_t id;
    if (!mf_load_section(l, item, MF_SECTION_OP, v, k) ||
        !mf_load_int(l, v[MF_K_OP_ID], MF_WHAT(OP, ID), 0, INT_MAX, &id))
        return false;
    if (id != i)
        return mf_load_fail(l, v[MF_K_OP_ID], "op id %lld out of sequence, expected %d (ids are the op's index)",
                            (long long)id, i);
    if (!mf_load_enum(l, v[MF_K_OP_PHASE], MF_WHAT(OP, PHASE), mf_phase_from_name, mf_phase_choices, &phase) ||
        !mf_load_enum(l, v[MF_K_OP_WHEN], MF_WHAT(OP, WHEN), mf_when_from_name, mf_when_choices, &when) ||
        !mf_load_enum(l, v[MF_K_OP_STREAM], MF_WHAT(OP, STREAM), mf_stream_from_name, mf_stream_choices, &stream) ||
        !mf_load_enum(l, v[MF_K_OP_OP], MF_WHAT(OP, OP), mf_opkind_from_name, mf_opkind_choices, &kind))
        return false;
    *op = (mf_op){.id = i, .phase = (mf_phase)phase, .when = (mf_when)when, .stream = (mf_stream)stream,
                  .kind = (mf_opkind)kind, .unit = -1, .transition = 0, .bucket = -1, .axis = -1, .src = -1,
                  .dst = -1, .event = -1, .dtype = MF_FP32, .count = 0};
    if (!mf_load_op_unit(l, item, i, op, v, k) || !mf_load_op_keys(l, item, i, op, v, k))
        return false;
    if (!mf_op_is_data(op))
        return mf_load_int32(l, v[MF_K_OP_EVENT], MF_WHAT(OP, EVENT), 0, &op->event) &&
               (op->event < s->nevents ||
                mf_load_fail(l, v[MF_K_OP_EVENT], "op %d: event %d does not exist (the schedule has %d events)", i,
                             op->event, s->nevents));
    if (!mf_load_op_data(l, v, op))
        return false;
    mf_load_site site = {.l = l, .any = item};
    site.field[MF_FIELD_SRC] = v[MF_K_OP_SRC];
    site.field[MF_FIELD_DST] = v[MF_K_OP_DST];
    site.field[MF_FIELD_DTYPE] = v[MF_K_OP_DTYPE];
    site.field[MF_FIELD_COUNT] = v[MF_K_OP_COUNT];
    mf_struct_sink sink = {mf_load_finding, &site, 0, false};
    mf_struct_data_op(s, i, &sink);
    return sink.findings == 0;
}

static bool mf_load_ops(mf_loader *l, mf_node *n, mf_node ***where)
{
    mf_schedule *s = l->s;
    if (!(s->ops = mf_load_list(l, n, MF_WHAT(ROOT, OPS), &s->nops, sizeof *s->ops, where)))
        return false;
    if (s->nevents > s->nops)
        return mf_load_fail(l, n, "the schedule declares %d events but has only %d ops", s->nevents, s->nops);
    for (int i = 0; i < s->nops; i++) {
        (*where)[i] = mf_load_item(l, n, i);
        if (!mf_load_op(l, (*where)[i], i, &s->ops[i]))
            return false;
    }
    /* Every event is recorded on one stream (the runtime's event counters). */
    mf_load_site site = {.l = l, .ops = *where, .any = n};
    mf_struct_sink k = {mf_load_finding, &site, 0, false};
    mf_struct_events(s, &k);
    return k.findings == 0;
}

/*
 * Recomputes the totals with overflow checks before mf_schedule_summarize()
 * does the same sums unchecked: a hostile count must not overflow there.
 */
static bool mf_load_totals_fit(mf_loader *l, mf_node **op_where, mf_node *buffers)
{
    const mf_schedule *s = l->s;
    int64_t axis_bytes[MF_MAX_AXES] = {0}, launches = 0, mem = 0;
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        if (!mf_opkind_is_collective(op->kind))
            continue;
        /* An upper bound of mf_schedule_collective_bytes(): 2 (n-1) (count/n + 1) size. */
        int64_t n = s->mesh.axes[op->axis].size, size = (int64_t)mf_dtype_size(op->dtype);
        int64_t per = op->kind == MF_OP_ALL_REDUCE ? op->count / n + 1 : op->count, b;
        int64_t runs = mf_when_runs_per_step(op->when, op->phase, s->microbatches);
        if (__builtin_mul_overflow(per, 2 * (n - 1), &b) || __builtin_mul_overflow(b, size, &b) ||
            __builtin_mul_overflow(b, runs, &b) ||
            __builtin_add_overflow(axis_bytes[op->axis], b, &axis_bytes[op->axis]) ||
            __builtin_add_overflow(launches, runs, &launches))
            return mf_load_fail(l, op_where[i], "op %d: the bytes sent per step overflow 64 bits", i);
    }
    for (int i = 0; i < s->nbuffers; i++)
        if (__builtin_add_overflow(mem, s->buffers[i].count * (int64_t)mf_dtype_size(s->buffers[i].dtype), &mem))
            return mf_load_fail(l, buffers, "the total size of the buffers overflows 64 bits");
    return true;
}

/* The summary's values keyed by the names of the schedule (roles, axes),
 * each recomputed: `by` says from what, for the message. */
static bool mf_load_values(mf_loader *l, mf_node *n, const char *what, const char *const *names, int count,
                           const int64_t *want, const char *by)
{
    mf_node *v[MF_ROLE_COUNT + MF_MAX_AXES];
    if (!mf_load_named(l, n, what, names, count, MF_SCHEMA_INT, v))
        return false;
    for (int i = 0; i < count; i++) {
        int64_t x;
        if (!mf_load_int(l, v[i], what, 0, INT64_MAX, &x))
            return false;
        if (x != want[i])
            return mf_load_fail(l, v[i], "summary %s.%s is %lld, but the %s give %lld", what, names[i],
                                (long long)x, by, (long long)want[i]);
    }
    return true;
}

static bool mf_load_role_values(mf_loader *l, mf_node *n, const char *what, const int64_t want[MF_ROLE_COUNT])
{
    const char *names[MF_ROLE_COUNT];
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        names[r] = mf_role_name((mf_role)r);
    return mf_load_values(l, n, what, names, MF_ROLE_COUNT, want, "buffers");
}

/* One value per mesh axis, keyed by axis name. */
static bool mf_load_axis_values(mf_loader *l, mf_node *n, const char *what, const int64_t *want)
{
    const mf_mesh *m = &l->s->mesh;
    const char *names[MF_MAX_AXES];
    for (int j = 0; j < m->naxes; j++)
        names[j] = m->axes[j].name;
    return mf_load_values(l, n, what, names, m->naxes, want, "ops");
}

/* One summary total that the loader recomputes (docs/schedule.md). */
static bool mf_load_total(mf_loader *l, mf_node *n, const char *what, int64_t want)
{
    int64_t x;
    if (!mf_load_int(l, n, what, 0, INT64_MAX, &x))
        return false;
    if (x != want)
        return mf_load_fail(l, n, "summary %s is %lld, but the buffers give %lld", what, (long long)x,
                            (long long)want);
    return true;
}

static bool mf_load_summary(mf_loader *l, mf_node *n)
{
    mf_node *v[MF_K_SUMMARY_NKEYS];
    if (!mf_load_section(l, n, MF_SECTION_SUMMARY, v, NULL))
        return false;
    mf_schedule *s = l->s;
    if (!mf_schedule_summarize(s))
        return mf_load_oom(l);
    const mf_summary *sum = &s->summary;
    const char *names[MF_OPKIND_COUNT];
    int kinds[MF_OPKIND_COUNT], nk = 0;
    for (int k = 0; k < MF_OPKIND_COUNT; k++)
        if (mf_opkind_is_collective((mf_opkind)k)) {
            kinds[nk] = k;
            names[nk++] = mf_opkind_name((mf_opkind)k);
        }
    mf_node *cv[MF_OPKIND_COUNT];
    if (!mf_load_named(l, v[MF_K_SUMMARY_COLLECTIVES], MF_WHAT(SUMMARY, COLLECTIVES), names, nk, MF_SCHEMA_PER_AXIS,
                       cv))
        return false;
    for (int i = 0; i < nk; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s.%s", MF_KEY(SUMMARY, COLLECTIVES)->name, names[i]);
        if (!mf_load_axis_values(l, cv[i], what, sum->collectives[kinds[i]]))
            return false;
    }
    return mf_load_axis_values(l, v[MF_K_SUMMARY_BYTES], MF_WHAT(SUMMARY, BYTES), sum->bytes) &&
           mf_load_role_values(l, v[MF_K_SUMMARY_PERSISTENT], MF_WHAT(SUMMARY, PERSISTENT), sum->persistent_bytes) &&
           mf_load_role_values(l, v[MF_K_SUMMARY_MODEL], MF_WHAT(SUMMARY, MODEL), sum->model_bytes) &&
           mf_load_total(l, v[MF_K_SUMMARY_LIVE], MF_WHAT(SUMMARY, LIVE), sum->live_bytes) &&
           mf_load_total(l, v[MF_K_SUMMARY_INTERFERENCE], MF_WHAT(SUMMARY, INTERFERENCE), sum->interference_bytes) &&
           mf_load_total(l, v[MF_K_SUMMARY_ALLOCATED], MF_WHAT(SUMMARY, ALLOCATED), sum->allocated_bytes);
}

/* The arena sizes, then every offset inside them and no overlap of buffers
 * live at the same time (core/mf_arena_check.c). */
static bool mf_arena_check_load(mf_loader *l, mf_node *arena, mf_node **buffer_where)
{
    mf_node *v[MF_K_ARENA_NKEYS];
    mf_schedule *s = l->s;
    if (!mf_load_section(l, arena, MF_SECTION_ARENA, v, NULL) ||
        !mf_load_int(l, v[MF_K_ARENA_PERSISTENT], MF_WHAT(ARENA, PERSISTENT), 0, INT64_MAX / 2, &s->mem_persistent) ||
        !mf_load_int(l, v[MF_K_ARENA_TRANSIENT], MF_WHAT(ARENA, TRANSIENT), 0, INT64_MAX / 2, &s->mem_transient))
        return false;
    char msg[512];
    int b = mf_arena_check(s, msg, sizeof msg);
    if (b == -2)
        return mf_load_oom(l);
    return b < 0 || mf_load_fail(l, buffer_where[b], "%s", msg);
}

/* The format, first: it decides which keys the file has (core/mf_schema.h). */
static bool mf_load_format(mf_loader *l, mf_node *root)
{
    const mf_schema_key *key = MF_KEY(ROOT, FORMAT);
    mf_node *fmt = NULL;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        mf_node *k = mf_load_node(l, p->key);
        if (k && k->type == YAML_SCALAR_NODE && strcmp(mf_load_scalar(k), key->name) == 0)
            fmt = mf_load_node(l, p->value);
    }
    if (!fmt)
        return mf_load_fail(l, root, "missing key '%s' (expected %s: %s)", key->name, key->name, MF_SCHEDULE_FORMAT);
    const char *f = NULL;
    if (!mf_load_str(l, fmt, key->what, &f))
        return false;
    /* Formats of older mfsdpc versions (docs/schedule.md §2): a hint, not a guess. */
    const char *older = strcmp(f, "mfsdp-schedule/1") == 0 ? "it has no buffer offsets or arena"
                        : strcmp(f, "mfsdp-schedule/2") == 0
                            ? "its summary has no interference_bytes and calls the per-role model peak_bytes"
                            : NULL;
    if (older)
        return mf_load_fail(l, fmt, "format '%s' was written by an older mfsdpc: %s; compile the spec again "
                            "with this mfsdpc (expected %s)", f, older, MF_SCHEDULE_FORMAT);
    /* Format 3 is format 4 without the short-step and evaluation programs
     * (docs/schedule.md §2): it loads and trains; those hooks are refused. */
    l->s->programs = strcmp(f, MF_SCHEDULE_FORMAT) == 0 || strcmp(f, MF_SCHEDULE_FORMAT_WHOLE) == 0 ||
                     strcmp(f, MF_SCHEDULE_FORMAT_DISTINCT) == 0 || strcmp(f, MF_SCHEDULE_FORMAT_RAGGED) == 0;
    if (!l->s->programs && strcmp(f, MF_SCHEDULE_FORMAT_STEP_ONLY) != 0)
        return mf_load_fail(l, fmt, "unknown format '%s' (expected %s)", f, MF_SCHEDULE_FORMAT);
    l->version = mf_schema_format_version(f);
    return true;
}

/* source and source_sha256 */
static bool mf_load_source(mf_loader *l, mf_node **v)
{
    mf_schedule *s = l->s;
    const char *sha = NULL;
    if (!mf_load_str(l, v[MF_K_ROOT_SOURCE], MF_WHAT(ROOT, SOURCE), &s->source))
        return false;
    if (!(s->source = mf_arena_strdup(s->arena, s->source)))
        return mf_load_oom(l);
    if (!mf_load_str(l, v[MF_K_ROOT_SHA], MF_WHAT(ROOT, SHA), &sha))
        return false;
    bool hex = strlen(sha) == 64;
    for (int i = 0; hex && i < 64; i++)
        hex = (sha[i] >= '0' && sha[i] <= '9') || (sha[i] >= 'a' && sha[i] <= 'f');
    if (!hex)
        return mf_load_fail(l, v[MF_K_ROOT_SHA], "%s must be 64 lowercase hex digits", MF_KEY(ROOT, SHA)->name);
    memcpy(s->source_sha256, sha, 65);
    return true;
}

static bool mf_load_root(mf_loader *l, mf_node *root)
{
    mf_schedule *s = l->s;
    if (root->type != YAML_MAPPING_NODE)
        return mf_load_fail(l, root, "expected a schedule (a mapping), got %s", mf_load_node_kind(root));
    mf_node *v[MF_K_ROOT_NKEYS];
    if (!mf_load_format(l, root) || !mf_load_section(l, root, MF_SECTION_ROOT, v, NULL) || !mf_load_source(l, v))
        return false;

    int x;
    int64_t align, prefetch;
    mf_node **bucket_lists, **buffer_where, **op_where;
    if (!mf_load_mesh(l, v[MF_K_ROOT_MESH]) ||
        !mf_load_int(l, v[MF_K_ROOT_MICROBATCHES], MF_WHAT(ROOT, MICROBATCHES), 1, MF_LIMIT_MICROBATCHES,
                     &s->microbatches) ||
        !mf_load_enum(l, v[MF_K_ROOT_REDUCE], MF_WHAT(ROOT, REDUCE), mf_reduce_from_name, mf_reduce_choices, &x))
        return false;
    s->reduce = (mf_reduce)x;
    if (!mf_load_int(l, v[MF_K_ROOT_ALIGN], MF_WHAT(ROOT, ALIGN), 1, INT64_MAX, &align))
        return false;
    if (align & (align - 1))
        return mf_load_fail(l, v[MF_K_ROOT_ALIGN], "align must be a power of two, got %lld", (long long)align);
    s->align = align;
    if (!mf_load_int(l, v[MF_K_ROOT_PREFETCH], MF_WHAT(ROOT, PREFETCH), 1, MF_LIMIT_PREFETCH, &prefetch))
        return false;
    s->prefetch = (int)prefetch;
    mf_node *buffers = v[MF_K_ROOT_BUFFERS];
    if (!mf_load_units(l, v[MF_K_ROOT_UNITS], &bucket_lists) || !mf_load_buckets(l, v[MF_K_ROOT_BUCKETS]) ||
        !mf_load_unit_buckets(l, bucket_lists) || !mf_load_buffers(l, buffers, &buffer_where) ||
        !mf_load_bucket_buffers(l, buffer_where, buffers) ||
        !mf_load_int32(l, v[MF_K_ROOT_EVENTS], MF_WHAT(ROOT, EVENTS), 0, &s->nevents) ||
        !mf_load_ops(l, v[MF_K_ROOT_OPS], &op_where) || !mf_load_totals_fit(l, op_where, buffers) ||
        !mf_arena_check_load(l, v[MF_K_ROOT_ARENA], buffer_where))
        return false;
    return mf_load_summary(l, v[MF_K_ROOT_SUMMARY]);
}

static void mf_load_parse_error(mf_loader *l, const yaml_parser_t *p, const char *text, size_t len)
{
    const yaml_mark_t *m = p->problem ? &p->problem_mark : &p->context_mark;
    yaml_node_t at = {0};
    at.start_mark = *m;
    if (p->error == YAML_READER_ERROR) {
        /* Bytes libyaml cannot decode come with an offset, not a mark: count
         * lines and characters the way libyaml's marks do (breaks are \n,
         * \r\n, \r, NEL, LS and PS; a column counts characters). */
        size_t off = p->problem_offset < len ? p->problem_offset : len;
        const unsigned char *u = (const unsigned char *)text;
        at.start_mark.line = at.start_mark.column = 0;
        for (size_t i = 0; i < off; i++) {
            bool brk = u[i] == '\n' || (u[i] == '\r' && (i + 1 >= len || u[i + 1] != '\n'));
            if (!brk && i + 1 < off && u[i] == 0xc2 && u[i + 1] == 0x85)
                brk = true, i += 1;
            else if (!brk && i + 2 < off && u[i] == 0xe2 && u[i + 1] == 0x80 && (u[i + 2] == 0xa8 || u[i + 2] == 0xa9))
                brk = true, i += 2;
            if (brk) {
                at.start_mark.line++;
                at.start_mark.column = 0;
            } else if ((u[i] & 0xc0) != 0x80) {
                at.start_mark.column++;
            }
        }
    }
    if (p->error == YAML_MEMORY_ERROR) {
        mf_load_oom(l);
        return;
    }
    if (p->context)
        mf_load_fail(l, &at, "invalid YAML: %s %s", p->problem ? p->problem : "syntax error", p->context);
    else
        mf_load_fail(l, &at, "invalid YAML: %s", p->problem ? p->problem : "syntax error");
}

/*
 * libyaml's scanner keeps one simple-key slot per open flow collection and
 * walks all of them at every token, so nesting costs quadratic time: 100000
 * nested '[' (200 KB) took a minute to load. A schedule nests 5 levels deep;
 * a first pass over the events refuses anything deeper than
 * MF_LOAD_MAX_DEPTH before the document is built. Syntax errors are left to
 * the real load, which reports them.
 */
#define MF_LOAD_MAX_DEPTH 32

static bool mf_load_depth_ok(mf_loader *l, const char *text, size_t len)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return mf_load_oom(l);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    bool ok = true;
    int depth = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev))
            break;
        yaml_event_type_t t = ev.type;
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) {
            if (++depth > MF_LOAD_MAX_DEPTH) {
                yaml_node_t at = {0};
                at.start_mark = ev.start_mark;
                ok = mf_load_fail(l, &at, "collections nested more than %d deep (a schedule nests 5)",
                                  MF_LOAD_MAX_DEPTH);
            }
        } else if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(&ev);
        if (!ok || t == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&p);
    return ok;
}

mf_schedule *mf_load_schedule_buffer(const char *name, const char *text, size_t len, char *err,
                                     size_t errlen)
{
    mf_loader l = {.name = name ? name : "<schedule>", .err = err, .errlen = errlen};
    if (err && errlen)
        err[0] = '\0';
    l.s = mf_schedule_new();
    if (!l.s) {
        mf_load_oom(&l);
        return NULL;
    }
    if (!mf_load_depth_ok(&l, text, len)) {
        mf_schedule_free(l.s);
        return NULL;
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        mf_load_oom(&l);
        mf_schedule_free(l.s);
        return NULL;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    bool have_doc = false;
    if (!yaml_parser_load(&parser, &l.doc)) {
        mf_load_parse_error(&l, &parser, text, len);
    } else {
        have_doc = true;
        mf_node *root = yaml_document_get_root_node(&l.doc);
        if (!root) {
            mf_load_fail(&l, NULL, "the file is empty (expected a schedule, format %s)", MF_SCHEDULE_FORMAT);
        } else if (mf_load_root(&l, root)) {
            yaml_document_t next;
            if (!yaml_parser_load(&parser, &next)) {
                mf_load_parse_error(&l, &parser, text, len);
            } else {
                mf_node *extra = yaml_document_get_root_node(&next);
                if (extra)
                    mf_load_fail(&l, extra, "a second YAML document (a schedule file holds exactly one)");
                yaml_document_delete(&next);
            }
        }
    }
    if (have_doc)
        yaml_document_delete(&l.doc);
    yaml_parser_delete(&parser);
    mf_hash_free(&l.units);
    mf_hash_free(&l.buckets);
    mf_hash_free(&l.buffers);
    mf_hash_free(&l.axes);
    mf_hash_free(&l.tensors);
    mf_hash_free(&l.globals);
    if (l.failed) {
        mf_schedule_free(l.s);
        return NULL;
    }
    mf_sha256(text, len, l.s->hash, NULL);
    return l.s;
}

mf_schedule *mf_load_schedule_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (err && errlen)
            snprintf(err, errlen, "%s: error: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    bool ok = buf != NULL;
    while (ok) {
        if (n == cap) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                ok = false;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            ok = !ferror(f);
            break;
        }
    }
    fclose(f);
    if (!ok) {
        free(buf);
        if (err && errlen)
            snprintf(err, errlen, "%s: error: cannot read the file", path);
        return NULL;
    }
    mf_schedule *s = mf_load_schedule_buffer(path, buf, n, err, errlen);
    free(buf);
    return s;
}
