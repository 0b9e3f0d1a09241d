/*
 * mf_spec: the resolved spec, produced by the semantic pass (mf_sema) from the
 * AST. Loops are expanded, names substituted, layouts resolved to indices,
 * sizes checked; every later pass can trust it. Every entity keeps the span of
 * the declaration it came from, so later passes can still point at the source.
 *
 * Ownership: everything lives in the arena passed to mf_sema_run().
 */
#ifndef MF_SPEC_H
#define MF_SPEC_H

#include "mf_diag.h"
#include "mf_schedule.h"

/* `balance bytes|flops;`: the cost the Whole packing balances
 * (docs/semantics.md §4.6): X(ENUM, name). */
#define MF_BALANCE_LIST(X) \
    X(BYTES, "bytes")      \
    X(FLOPS, "flops")
#define MF_ENUM_BALANCE(E, ...) MF_BALANCE_##E,
typedef enum { MF_BALANCE_LIST(MF_ENUM_BALANCE) MF_BALANCE_COUNT } mf_balance;
#undef MF_ENUM_BALANCE

typedef struct mf_spec_layout {
    const char *name;       /* layout name; "<inline unit.tensor>" for inline ones */
    mf_span span;           /* the layout block, or the inline braces */
    bool is_inline;
    mf_dtype dtype[MF_ROLE_COUNT];
    mf_placement place[MF_ROLE_COUNT];
    bool whole[MF_ROLE_COUNT];  /* the role's Flat axes were written `Whole` (grad
                                   and main_weight only; docs/semantics.md §4.6) */
    mf_span role_span[MF_ROLE_COUNT]; /* each role's declaration */
} mf_spec_layout;

typedef struct mf_spec_tensor {
    const char *name;       /* full name: unit name + "." + tensor name */
    mf_span span;
    int ndims;
    int64_t dims[MF_MAX_DIMS];
    int64_t numel;          /* product of dims, checked against 63 bits */
    int layout;             /* index into spec->layouts (unit default or override) */
    bool unit_default;      /* layout is the unit's default (no override) */
    /* `global "TEMPLATE" [split D]` (docs/language.md §3.4), only on a tensor
     * Distinct on some axis: nglobal == 0 when the clause is absent; rename
     * (global_split false): one full global name per coordinate combination
     * of the layout's Distinct axes, row-major (outermost axis first); split:
     * nglobal == 1, the global tensor's name, concatenated along global_dim. */
    int nglobal;
    const char **global;
    bool global_split;
    int global_dim;
    mf_span global_span;    /* the clause */
} mf_spec_tensor;

typedef struct mf_spec_unit {
    const char *name;       /* after {i} substitution */
    mf_span span;           /* the unit declaration (the loop's for an expanded one) */
    int layout;             /* default layout index */
    bool layout_auto;       /* `layout auto`: layout is a placeholder (built-in zero3)
                               that `mfsdpc plan` replaces; later passes refuse it */
    mf_span layout_span;    /* the default layout's name as written */
    bool reshard_after_forward;  /* default true */
    int ntensors;
    mf_spec_tensor *tensors;     /* declaration order */
} mf_spec_unit;

typedef struct mf_spec {
    const char *path;       /* as given on the command line */
    mf_mesh mesh;
    mf_span mesh_span;
    int64_t microbatches;   /* default 1 */
    mf_reduce reduce;       /* default avg */
    int64_t align;          /* shard alignment in bytes, default 256, power of two */
    int64_t bucket_size;    /* bytes; consecutive small buckets of one layout merge up
                               to this size; 0 = no merging (default) */
    int prefetch;           /* prefetch depth in units, default 1 */
    mf_balance balance;     /* the Whole packing's cost, default bytes */
    int nlayouts;
    mf_spec_layout *layouts;
    int nunits;
    mf_spec_unit *units;    /* forward order */
} mf_spec;

#endif
