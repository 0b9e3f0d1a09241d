/*
 * mf_ast: the syntax tree of a .mfsdp file, exactly as written (loops not
 * expanded, names not substituted, layout names not resolved). Every node
 * carries its source span, so the semantic pass can point at what it rejects.
 *
 * Invariants the parser guarantees:
 *   - every list below is in source order and NULL-terminated through `next`;
 *   - every string is NUL-terminated and lives in the arena passed to
 *     mf_parse(); a name's text is NULL exactly when the name is absent;
 *   - integers are as written (they may be zero or negative; the lexer already
 *     rejected literals that do not fit in 63 bits);
 *   - nothing is checked against the language's rules (roles missing, unknown
 *     dtypes, placement arity, ...): that is mf_sema's job.
 * The tree is read-only after mf_parse() returns.
 */
#ifndef MF_AST_H
#define MF_AST_H

#include <stdbool.h>
#include <stdint.h>

#include "mf_arena.h"
#include "mf_diag.h"
#include "mf_schedule.h"

/* An identifier, a quoted string or a keyword, with its span. For strings the
 * text is the unquoted content; the span covers the quotes. */
typedef struct mf_ast_name {
    const char *text;       /* NULL when absent */
    mf_span span;
} mf_ast_name;

/* An integer literal, with an optional unit suffix ("64MiB" -> 64, "MiB"). */
typedef struct mf_ast_int {
    int64_t value;
    const char *suffix;     /* NULL for a plain integer */
    mf_span span;
} mf_ast_int;

/* `dp_outer = 4` in a mesh statement. */
typedef struct mf_ast_axis {
    mf_ast_name name;
    mf_ast_int size;
    mf_span span;
    struct mf_ast_axis *next;
} mf_ast_axis;

typedef struct mf_ast_mesh {
    mf_ast_axis *axes;
    int naxes;
    mf_span span;           /* the `mesh` keyword */
    struct mf_ast_mesh *next;
} mf_ast_mesh;

/* Top-level settings: `microbatches 8;`, `reduce avg;`, ... */
typedef enum {
    MF_AST_SET_MICROBATCHES,
    MF_AST_SET_REDUCE,
    MF_AST_SET_ALIGN,
    MF_AST_SET_PREFETCH,
    MF_AST_SET_BUCKET_SIZE,
    MF_AST_SET_BALANCE,
} mf_ast_setting_kind;

typedef struct mf_ast_setting {
    mf_ast_setting_kind kind;
    mf_ast_name key;        /* the keyword as written */
    mf_ast_int num;         /* integer settings */
    mf_ast_name word;       /* identifier settings (reduce, balance) */
    mf_span span;           /* keyword .. ';' */
    struct mf_ast_setting *next;
} mf_ast_setting;

/* One entry of a placement list: `Flat`, or the extension `dp_inner: Flat`. */
typedef struct mf_ast_place {
    mf_ast_name axis;       /* text NULL when the entry is positional */
    mf_ast_name value;      /* Replicate | Flat | Partial as written */
    mf_span span;
    struct mf_ast_place *next;
} mf_ast_place;

/* `grad fp32 [Partial, Flat];` */
typedef struct mf_ast_role {
    mf_role role;
    mf_span role_span;      /* the role keyword */
    mf_ast_name dtype;
    mf_ast_place *places;
    int nplaces;
    mf_span places_span;    /* '[' .. ']' */
    mf_span span;           /* role keyword .. ';' */
    struct mf_ast_role *next;
} mf_ast_role;

/* A named `layout NAME { ... }` block, or the inline `{ ... }` of a tensor
 * (name.text == NULL). */
typedef struct mf_ast_layout {
    mf_ast_name name;
    mf_ast_role *roles;
    mf_span span;           /* the name (named) or the opening brace (inline) */
    struct mf_ast_layout *next;
} mf_ast_layout;

/* `for i in 0..32`: half-open range [lo, hi). */
typedef struct mf_ast_loop {
    mf_ast_name var;
    mf_ast_int lo, hi;
    mf_span span;           /* `for` .. hi */
} mf_ast_loop;

typedef struct mf_ast_dim {
    mf_ast_int size;
    struct mf_ast_dim *next;
} mf_ast_dim;

typedef struct mf_ast_tensor {
    mf_ast_name name;       /* as written, may contain {var} */
    mf_ast_dim *dims;
    int ndims;
    mf_span dims_span;      /* '[' .. ']' */
    mf_ast_name layout;     /* `layout NAME` override; text NULL when none */
    mf_ast_layout *inline_layout; /* `{ roles }` instead; NULL when none */
    mf_ast_name global;     /* `global "TEMPLATE"`: text NULL when none */
    bool has_split;         /* `split D` follows the template */
    mf_ast_int split;       /* D as written (checked by sema) */
    mf_span global_span;    /* `global` .. the template or D */
} mf_ast_tensor;

typedef enum {
    MF_AST_ITEM_TENSOR,     /* tensor "name" [dims] ...; */
    MF_AST_ITEM_FOR,        /* for e in A..B { items }   (extension) */
    MF_AST_ITEM_OPTION,     /* reshard_after_forward true; */
} mf_ast_item_kind;

typedef struct mf_ast_item {
    mf_ast_item_kind kind;
    mf_span span;           /* the keyword */
    struct mf_ast_item *next;
    mf_ast_tensor tensor;   /* MF_AST_ITEM_TENSOR */
    mf_ast_loop loop;       /* MF_AST_ITEM_FOR */
    struct mf_ast_item *body; /* MF_AST_ITEM_FOR */
    mf_ast_name key;        /* MF_AST_ITEM_OPTION: option keyword */
    mf_ast_name value;      /* MF_AST_ITEM_OPTION: its value as written */
} mf_ast_item;

/* `unit "name" [for i in A..B] [layout NAME] { items }` */
typedef struct mf_ast_unit {
    mf_ast_name name;       /* as written, may contain {i} */
    mf_ast_loop *loop;      /* NULL when not a loop */
    mf_ast_name layout;     /* default layout; text NULL when none */
    mf_ast_item *body;
    mf_span span;           /* the `unit` keyword .. the name */
    struct mf_ast_unit *next;
} mf_ast_unit;

struct mf_ast {
    const mf_source *src;   /* borrowed from the caller of mf_parse() */
    mf_ast_mesh *meshes;    /* all mesh statements (sema rejects a second) */
    mf_ast_setting *settings;
    mf_ast_layout *layouts; /* named layouts only */
    mf_ast_unit *units;
};

typedef struct mf_ast mf_ast;

/* Limits the parser enforces (each a located error when exceeded). */
#define MF_PARSE_MAX_NESTING 8  /* nested { } blocks */

/* Parses src into an AST allocated in `a` (borrowed; the AST lives as long as
 * it). Lexical and syntax errors go to d (the pipeline stops when there are
 * any); returns the AST, partial after errors, or NULL only when the parse
 * could not run (out of memory, a file over 1 GiB). Reentrant: no global
 * state; src is borrowed and src->text need not be NUL-terminated. */
mf_ast *mf_parse(const mf_source *src, mf_diag *d, mf_arena *a);

#endif
