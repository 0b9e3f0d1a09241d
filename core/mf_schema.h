/*
 * mf_schema: the keys of the schedule file (docs/schedule.md §2), the one
 * place they are spelled. The loader (core/mf_load.c) looks every key up here,
 * both writers (planner/passes/mf_emit.c, planner/passes/mf_emit_lines.c) take the names
 * from here, and tests/docs/check_schema.py holds docs/schedule.md §2.5 to
 * the table, row for row.
 *
 * A section is one kind of mapping in the file; its keys are listed in the
 * order the writers write them. Each key has a value type, a presence (always,
 * or decided by the op's phase or kind), the format version it appeared in and
 * the phrase that messages name its value by. Maps keyed by names of the
 * schedule (the summary's values per axis, per role and per collective) are
 * typed here and their keys come from the mesh and the vocabularies.
 */
#ifndef MF_SCHEMA_H
#define MF_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>

/* value types: X(ENUM, name in docs) */
#define MF_SCHEMA_TYPE_LIST(X)               \
    X(STRING, "string")                      \
    X(NAME, "name")               /* a non-empty string, at most MF_LIMIT_NAME_BYTES */ \
    X(INT, "int")                                                                       \
    X(BOOL, "bool")                                                                     \
    X(ENUM, "enum")               /* a word of a closed vocabulary */                  \
    X(REF, "ref")                 /* the name of a unit, bucket, buffer or axis */     \
    X(LIST, "list")                                                                     \
    X(PLACEMENT, "placement")     /* a list of one placement per mesh axis */          \
    X(MAP, "map")                                                                       \
    X(PER_AXIS, "per axis")       /* a map: axis name -> int */                         \
    X(PER_ROLE, "per role")       /* a map: role name -> int */                         \
    X(PER_COLLECTIVE, "per collective") /* a map: collective op name -> per axis */

/* presence: X(ENUM, name in docs) -- when a key is in its mapping */
#define MF_SCHEMA_PRESENCE_LIST(X)    \
    X(REQUIRED, "required")           \
    X(UNIT_PHASE, "unit phases")      /* ops at a phase with a unit (not step_begin, step_end) */ \
    X(DATA_OP, "data ops")            /* ops other than record and wait */                        \
    X(AXIS_OP, "axis ops")            /* ops along a mesh axis (the collectives and slice) */     \
    X(EVENT_OP, "event ops")          /* record and wait */                                       \
    X(WHOLE_BUCKET, "whole buckets")  /* buckets with a Whole role (mf_bucket.bounds) */

/*
 * The sections' keys: X(SECTION, KEY, "key", TYPE, PRESENCE, since, what).
 * `since` is the format version (mfsdp-schedule/N) the key appeared in;
 * `what` names the value in messages ("expected an integer for the buffer
 * count"), NULL where the loader names it after the mapping (a role's
 * placement: "the grad placement").
 */
#define MF_SCHEMA_ROOT_KEYS(X)                                             \
    X(ROOT, FORMAT, "format", STRING, REQUIRED, 1, "format")               \
    X(ROOT, SOURCE, "source", STRING, REQUIRED, 1, "source")               \
    X(ROOT, SHA, "source_sha256", STRING, REQUIRED, 1, "source_sha256")    \
    X(ROOT, MESH, "mesh", MAP, REQUIRED, 1, "mesh")                        \
    X(ROOT, MICROBATCHES, "microbatches", INT, REQUIRED, 1, "microbatches") \
    X(ROOT, REDUCE, "reduce", ENUM, REQUIRED, 1, "reduce op")              \
    X(ROOT, ALIGN, "align", INT, REQUIRED, 1, "align")                     \
    X(ROOT, PREFETCH, "prefetch", INT, REQUIRED, 1, "prefetch")            \
    X(ROOT, UNITS, "units", LIST, REQUIRED, 1, "units")                    \
    X(ROOT, BUCKETS, "buckets", LIST, REQUIRED, 1, "buckets")              \
    X(ROOT, BUFFERS, "buffers", LIST, REQUIRED, 1, "buffers")              \
    X(ROOT, ARENA, "arena", MAP, REQUIRED, 2, "arena")                     \
    X(ROOT, EVENTS, "events", INT, REQUIRED, 1, "events")                  \
    X(ROOT, OPS, "ops", LIST, REQUIRED, 1, "ops")                          \
    X(ROOT, SUMMARY, "summary", MAP, REQUIRED, 1, "summary")

#define MF_SCHEMA_MESH_KEYS(X) X(MESH, AXES, "axes", LIST, REQUIRED, 1, "mesh axes")

#define MF_SCHEMA_AXIS_KEYS(X)                                  \
    X(AXIS, NAME, "name", NAME, REQUIRED, 1, "the axis name")   \
    X(AXIS, SIZE, "size", INT, REQUIRED, 1, "the axis size")

#define MF_SCHEMA_UNIT_KEYS(X)                                                              \
    X(UNIT, NAME, "name", NAME, REQUIRED, 1, "the unit name")                               \
    X(UNIT, RESHARD, "reshard_after_forward", BOOL, REQUIRED, 1, "reshard_after_forward")   \
    X(UNIT, BUCKETS, "buckets", LIST, REQUIRED, 1, "the unit's buckets")

/* weight, grad, main_weight: the roles in MF_ROLE_LIST's order (mf_role). */
#define MF_SCHEMA_BUCKET_KEYS(X)                                              \
    X(BUCKET, NAME, "name", NAME, REQUIRED, 1, "the bucket name")             \
    X(BUCKET, UNIT, "unit", REF, REQUIRED, 1, "unit")                         \
    X(BUCKET, LAST_UNIT, "last_unit", REF, REQUIRED, 1, "unit")               \
    X(BUCKET, LAYOUT, "layout", NAME, REQUIRED, 1, "the layout name")         \
    X(BUCKET, LENGTH, "length", INT, REQUIRED, 1, "the bucket length")        \
    X(BUCKET, USED, "used", INT, REQUIRED, 1, "used")                         \
    X(BUCKET, BOUNDS, "bounds", LIST, WHOLE_BUCKET, 7, "the shard bounds")   \
    X(BUCKET, WEIGHT, "weight", MAP, REQUIRED, 1, "weight")                   \
    X(BUCKET, GRAD, "grad", MAP, REQUIRED, 1, "grad")                         \
    X(BUCKET, MAIN_WEIGHT, "main_weight", MAP, REQUIRED, 1, "main_weight")    \
    X(BUCKET, TENSORS, "tensors", LIST, REQUIRED, 1, "tensors")

#define MF_SCHEMA_ROLE_KEYS(X)                                    \
    X(ROLE, DTYPE, "dtype", ENUM, REQUIRED, 1, "dtype")           \
    X(ROLE, PLACEMENT, "placement", PLACEMENT, REQUIRED, 1, NULL)

#define MF_SCHEMA_TENSOR_KEYS(X)                                      \
    X(TENSOR, NAME, "name", NAME, REQUIRED, 1, "the tensor name")     \
    X(TENSOR, OFFSET, "offset", INT, REQUIRED, 1, "the tensor offset") \
    X(TENSOR, NUMEL, "numel", INT, REQUIRED, 1, "numel")              \
    X(TENSOR, DIMS, "dims", LIST, REQUIRED, 1, "dims")

#define MF_SCHEMA_BUFFER_KEYS(X)                                                    \
    X(BUFFER, NAME, "name", NAME, REQUIRED, 1, "the buffer name")                   \
    X(BUFFER, BUCKET, "bucket", REF, REQUIRED, 1, "bucket")                         \
    X(BUFFER, KIND, "kind", ENUM, REQUIRED, 1, "buffer kind")                       \
    X(BUFFER, DTYPE, "dtype", ENUM, REQUIRED, 1, "dtype")                           \
    X(BUFFER, PLACEMENT, "placement", PLACEMENT, REQUIRED, 1, "the buffer placement") \
    X(BUFFER, COUNT, "count", INT, REQUIRED, 1, "the buffer count")                 \
    X(BUFFER, LIFETIME, "lifetime", ENUM, REQUIRED, 1, "lifetime")                  \
    X(BUFFER, OFFSET, "offset", INT, REQUIRED, 2, "the buffer offset")

#define MF_SCHEMA_ARENA_KEYS(X)                                                \
    X(ARENA, PERSISTENT, "persistent", INT, REQUIRED, 2, "arena persistent")   \
    X(ARENA, TRANSIENT, "transient", INT, REQUIRED, 2, "arena transient")

#define MF_SCHEMA_OP_KEYS(X)                                                  \
    X(OP, ID, "id", INT, REQUIRED, 1, "the op id")                            \
    X(OP, PHASE, "phase", ENUM, REQUIRED, 1, "phase")                         \
    X(OP, UNIT, "unit", REF, UNIT_PHASE, 1, "unit")                           \
    X(OP, WHEN, "when", ENUM, REQUIRED, 1, "when")                            \
    X(OP, STREAM, "stream", ENUM, REQUIRED, 1, "stream")                      \
    X(OP, OP, "op", ENUM, REQUIRED, 1, "op")                                  \
    X(OP, TRANSITION, "transition", ENUM, DATA_OP, 1, "transition")           \
    X(OP, BUCKET, "bucket", REF, DATA_OP, 1, "bucket")                        \
    X(OP, AXIS, "axis", REF, AXIS_OP, 1, "axis")                              \
    X(OP, DTYPE, "dtype", ENUM, DATA_OP, 1, "dtype")                          \
    X(OP, COUNT, "count", INT, DATA_OP, 1, "the op count")                    \
    X(OP, SRC, "src", REF, DATA_OP, 1, "buffer")                              \
    X(OP, DST, "dst", REF, DATA_OP, 1, "buffer")                              \
    X(OP, EVENT, "event", INT, EVENT_OP, 1, "the event id")

#define MF_SCHEMA_SUMMARY_KEYS(X)                                                             \
    X(SUMMARY, COLLECTIVES, "collectives", PER_COLLECTIVE, REQUIRED, 1, "summary collectives") \
    X(SUMMARY, BYTES, "bytes_per_rank", PER_AXIS, REQUIRED, 1, "bytes_per_rank")             \
    X(SUMMARY, PERSISTENT, "persistent_bytes", PER_ROLE, REQUIRED, 1, "persistent_bytes")    \
    X(SUMMARY, MODEL, "model_bytes", PER_ROLE, REQUIRED, 3, "model_bytes")                   \
    X(SUMMARY, LIVE, "live_bytes", INT, REQUIRED, 2, "live_bytes")                           \
    X(SUMMARY, INTERFERENCE, "interference_bytes", INT, REQUIRED, 3, "interference_bytes")   \
    X(SUMMARY, ALLOCATED, "allocated_bytes", INT, REQUIRED, 2, "allocated_bytes")

/* sections: X(SECTION, path in docs, what (messages; NULL: named by the caller), keys) */
#define MF_SCHEMA_SECTION_LIST(X)                                   \
    X(ROOT, "schedule", "the schedule", MF_SCHEMA_ROOT_KEYS)        \
    X(MESH, "mesh", "mesh", MF_SCHEMA_MESH_KEYS)                    \
    X(AXIS, "mesh.axes", "a mesh axis", MF_SCHEMA_AXIS_KEYS)        \
    X(UNIT, "units", "a unit", MF_SCHEMA_UNIT_KEYS)                 \
    X(BUCKET, "buckets", "a bucket", MF_SCHEMA_BUCKET_KEYS)         \
    X(ROLE, "buckets.<role>", NULL, MF_SCHEMA_ROLE_KEYS)            \
    X(TENSOR, "buckets.tensors", "a tensor", MF_SCHEMA_TENSOR_KEYS) \
    X(BUFFER, "buffers", "a buffer", MF_SCHEMA_BUFFER_KEYS)         \
    X(ARENA, "arena", "arena", MF_SCHEMA_ARENA_KEYS)                \
    X(OP, "ops", "an op", MF_SCHEMA_OP_KEYS)                        \
    X(SUMMARY, "summary", "summary", MF_SCHEMA_SUMMARY_KEYS)

#define MF_SCHEMA_ITEM(E, ...) MF_SCHEMA_##E,
typedef enum { MF_SCHEMA_TYPE_LIST(MF_SCHEMA_ITEM) MF_SCHEMA_TYPE_COUNT } mf_schema_type;
typedef enum { MF_SCHEMA_PRESENCE_LIST(MF_SCHEMA_ITEM) MF_SCHEMA_PRESENCE_COUNT } mf_schema_presence;
#undef MF_SCHEMA_ITEM
#define MF_SCHEMA_ITEM(SECTION, ...) MF_SECTION_##SECTION,
typedef enum { MF_SCHEMA_SECTION_LIST(MF_SCHEMA_ITEM) MF_SECTION_COUNT } mf_section;
#undef MF_SCHEMA_ITEM

/* Per section, the index of each key in its section: MF_K_BUCKET_LENGTH,
 * ..., and the count MF_K_BUCKET_NKEYS. */
#define MF_SCHEMA_ITEM(SECTION, KEY, ...) MF_K_##SECTION##_##KEY,
#define MF_SCHEMA_KEY_ENUM(SECTION, path, what, KEYS) \
    enum { KEYS(MF_SCHEMA_ITEM) MF_K_##SECTION##_NKEYS };
MF_SCHEMA_SECTION_LIST(MF_SCHEMA_KEY_ENUM)
#undef MF_SCHEMA_KEY_ENUM
#undef MF_SCHEMA_ITEM

typedef struct mf_schema_key {
    const char *name;       /* the key as written */
    size_t len;             /* strlen(name) */
    mf_schema_type type;
    mf_schema_presence presence;
    int since;              /* the format version it appeared in */
    const char *what;       /* names the value in messages; NULL: see above */
} mf_schema_key;

typedef struct mf_schema_section {
    const char *path;       /* where it is in the file, for docs */
    const char *what;       /* names the mapping in messages; NULL: the caller does */
    const mf_schema_key *keys;
    int nkeys;
} mf_schema_section;

extern const mf_schema_section mf_schema_sections[MF_SECTION_COUNT];

/* The row of a key: MF_KEY(BUCKET, LENGTH). */
#define MF_KEY(SECTION, KEY) (&mf_schema_sections[MF_SECTION_##SECTION].keys[MF_K_##SECTION##_##KEY])

/* The index of key `name` (NUL-terminated) in section s for a file of format
 * version `version`, or -1 when s has no such key in that version. */
int mf_schema_find(const mf_schema_section *s, const char *name, int version);

/* N of a format name "mfsdp-schedule/N" (MF_SCHEDULE_FORMAT and its kin), or
 * -1 for any other text. */
int mf_schema_format_version(const char *format);

const char *mf_schema_type_name(mf_schema_type t);
const char *mf_schema_presence_name(mf_schema_presence p);

#endif
