/*
 * mf_sema: the semantic pass, AST (grammar/mf_ast.h) -> resolved spec
 * (mf_spec.h). It is the only place that knows the rules of docs/semantics.md §1, docs/semantics.md §4.1
 * and docs/language.md §4; every later pass trusts its output.
 *
 * What it does, in order:
 *   1. settings: the one mesh (1..4 named axes, sizes >= 1, world size within
 *      limits), microbatches, reduce, align, prefetch, bucket_size, balance;
 *   2. named layouts: each role exactly once, known dtypes and placements, one
 *      placement per mesh axis, then the layout rules: no Partial in weight or
 *      main_weight, Whole only in grad and main_weight and never mixed with
 *      Flat (stored as Flat plus mf_spec_layout.whole), Flat (and Whole) axes
 *      a suffix of the mesh, Distinct (MF_PLACE_DISTINCT) on an axis in all
 *      three roles or in none, and every per-axis step of
 *      T1..T4 legal (docs/semantics.md §4.1);
 *   3. units, once per declaration (templates): loop ranges, {var}
 *      substitutions, layout references, inline layouts (resolved like named
 *      ones, identical inline layouts shared), options, dimensions, element
 *      counts, and the expansion size against the limits below;
 *   4. expansion: loops unrolled, names substituted, then unit and full tensor
 *      names checked for duplicates.
 *
 * Invariants of the result (when mf_sema_run returns non-NULL): no errors were
 * reported; every layout index is valid; every placement has mesh.naxes legal
 * entries; every unit has >= 1 tensor; names are unique; every product
 * (numel, world, unit and spec totals) fits the limits, which leave later
 * passes headroom for bytes, padding and per-step counts in 63 bits
 * (MF_LIMIT_MAGNITUDE_BITS, core/mf_limits.h).
 * A unit without a default layout gets its first tensor's layout as `layout`.
 *
 * Errors accumulate; each names the offending thing, says what would be
 * legal, and adds a note at the related declaration where there is one.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "mf_builtin_layouts.h"
#include "mf_hash.h"
#include "mf_layout.h"
#include "mf_limits.h"
#include "mf_passes.h"
#include "mf_trans_rules.h"

/* Limits: the shared ones from core/mf_limits.h (docs/language.md). */
enum {
    MF_SEMA_MAX_UNITS = MF_LIMIT_UNITS,
    MF_SEMA_MAX_TENSORS = MF_LIMIT_TENSORS,
    MF_SEMA_MAX_MICROBATCHES = MF_LIMIT_MICROBATCHES,
    MF_SEMA_MAX_PREFETCH = MF_LIMIT_PREFETCH,
    MF_SEMA_MAX_WORLD = MF_LIMIT_WORLD,
    MF_SEMA_MIN_ALIGN = 16,             /* bytes */
    MF_SEMA_MAX_ALIGN = 1 << 30,        /* bytes */
    MF_SEMA_MAX_SCOPE = MF_PARSE_MAX_NESTING + 2,
    MF_SEMA_GLOBAL_BYTES = 4096,        /* an expanded global template */
};
#define MF_SEMA_MAX_ELEMS (INT64_C(1) << 42) /* elements per unit and per spec */

/* ---- small helpers ---- */

static bool mul_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static bool add_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_add_overflow(a, b, r); }

/* ---- pass state ---- */

typedef struct {
    const char *var;
    int64_t value;
    const mf_ast_loop *loop;
} mf_sema_binding;

/* What sema knows about each spec layout besides the spec entry itself. */
typedef struct {
    const mf_ast_layout *decl;
    const char *what;       /* "layout 'x'" or "the inline layout of tensor '...'" */
    bool ok;                /* fully resolved and legal */
} mf_sema_layout_info;

/* Per tensor declaration of the unit being expanded, in traversal order. */
typedef struct {
    const mf_ast_item *item;
    int layout;
    bool unit_default;      /* the layout is the unit's default */
    int64_t numel;
    bool global_ok;         /* its `global` clause checked (expand it) */
    int ndist;              /* the layout's Distinct axes, outermost first */
    int dist[MF_MAX_AXES];
} mf_sema_tinfo;

/* A global name claimed so far (docs/language.md §3.4): a tensor's own full
 * name, or one of a Distinct tensor's global names. */
typedef struct {
    mf_span span;
    const char *owner;      /* the claiming tensor's full name */
    bool split;             /* claimed by a split clause */
    int ndims;
    int64_t dims[MF_MAX_DIMS]; /* the global tensor's dims */
} mf_sema_gname;

typedef struct {
    mf_diag *d;
    mf_arena *a;
    const mf_ast *ast;
    mf_spec *spec;
    bool oom;
    bool have_mesh;

    mf_vec layouts;         /* mf_spec_layout */
    mf_vec linfo;           /* mf_sema_layout_info, parallel to layouts */
    mf_hash layout_names;
    mf_hash inline_sigs;

    mf_vec units;           /* mf_spec_unit */
    mf_hash unit_names;
    mf_hash tensor_names;
    int64_t nunits, ntensors, nelems;
    bool limit_hit;         /* a unit/tensor/element limit was reported */

    mf_vec tinfo;           /* mf_sema_tinfo of the current unit */
    mf_vec tensors;         /* mf_spec_tensor of the current unit */
    mf_vec tspans;          /* mf_span of every expanded tensor, for notes */
    mf_hash global_names;   /* global name -> index into gnames */
    mf_vec gnames;          /* mf_sema_gname */

    mf_sema_binding scope[MF_SEMA_MAX_SCOPE];
    int nscope;
} mf_sema;

static void sema_oom(mf_sema *s)
{
    if (!s->oom) {
        mf_span none = {0, 0, 0, 0};
        mf_diag_error(s->d, none, "out of memory in the semantic checks");
    }
    s->oom = true;
}

static const char *const dtype_names[] = {
#define X(E, name, size) name,
    MF_DTYPE_LIST(X)
#undef X
};
static const char *const place_names[] = {
#define X(E, name, letter) name,
    MF_PLACE_LIST(X)
#undef X
    MF_WHOLE_NAME,
    MF_DISTINCT_NAME,
};
static const char *const balance_names[] = {
#define X(E, name) name,
    MF_BALANCE_LIST(X)
#undef X
};
static const char *const reduce_names[] = {
#define X(E, name) name,
    MF_REDUCE_LIST(X)
#undef X
};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* "a, b or c" */
static void join_words(char *buf, size_t size, const char *const *w, size_t n, const char *last_sep)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < size; i++) {
        int k = snprintf(buf + o, size - o, "%s%s", i == 0 ? "" : (i + 1 == n ? last_sep : ", "), w[i]);
        if (k < 0)
            break;
        o += (size_t)k;
    }
}

/* Reports "unknown KIND 'word' ...; did you mean 'x'?" or the legal list. */
static void unknown_word(mf_sema *s, mf_span at, const char *kind, const char *word, const char *where,
                         const char *const *legal, size_t n)
{
    const char *hint = mf_diag_suggest(word, legal, n);
    if (hint) {
        mf_diag_error(s->d, at, "unknown %s '%s'%s; did you mean '%s'?", kind, word, where, hint);
    } else {
        char list[256];
        join_words(list, sizeof list, legal, n, " or ");
        mf_diag_error(s->d, at, "unknown %s '%s'%s; expected %s", kind, word, where, list);
    }
}

/* The span of bytes [off, off+len) inside a string token's content. */
static mf_span span_in_string(mf_span str, size_t off, size_t len)
{
    mf_span r = str;
    if (str.line != str.end_line)
        return str;
    r.col = str.col + 1 + (int)(off < 100000 ? off : 100000);
    r.end_col = r.col + (int)(len < 100000 ? len : 100000);
    if (r.end_col > str.end_col)
        return str;
    return r;
}

/* ---- settings ---- */

static void check_mesh(mf_sema *s)
{
    const mf_ast_mesh *m = s->ast->meshes;
    mf_span none = {0, 0, 0, 0};
    if (!m) {
        mf_diag_error(s->d, none, "missing 'mesh' statement; a spec needs one, e.g. 'mesh dp = 8;'");
        return;
    }
    for (const mf_ast_mesh *o = m->next; o; o = o->next) {
        mf_diag_error(s->d, o->span, "a second 'mesh' statement; a spec has exactly one mesh");
        mf_diag_note(s->d, m->span, "the first mesh is declared here");
    }
    bool ok = true;
    if (m->naxes > MF_MAX_AXES) {
        mf_diag_error(s->d, m->span, "the mesh has %d axes (limit is %d)", m->naxes, MF_MAX_AXES);
        ok = false;
    }
    mf_mesh *mesh = &s->spec->mesh;
    int64_t world = 1;
    bool world_over = false;
    int i = 0;
    for (const mf_ast_axis *x = m->axes; x; x = x->next, i++) {
        for (const mf_ast_axis *y = m->axes; y != x; y = y->next)
            if (strcmp(x->name.text, y->name.text) == 0) {
                mf_diag_error(s->d, x->name.span, "mesh axis '%s' declared twice; axis names must be unique",
                              x->name.text);
                mf_diag_note(s->d, y->name.span, "'%s' first declared here", y->name.text);
                ok = false;
                break;
            }
        if (x->size.value < 1) {
            mf_diag_error(s->d, x->size.span, "mesh axis '%s' has size %" PRId64 "; an axis needs at least 1 rank",
                          x->name.text, x->size.value);
            ok = false;
        } else if (!world_over && !mul_ok(world, x->size.value, &world)) {
            world_over = true;
        }
        if (i < MF_MAX_AXES) {
            mesh->axes[i].name = x->name.text;
            mesh->axes[i].size = x->size.value;
        }
    }
    if (world_over) {
        mf_diag_error(s->d, m->span, "the mesh size (the product of the axis sizes) overflows %d bits",
                      MF_LIMIT_MAGNITUDE_BITS);
        ok = false;
    } else if (ok && world > MF_SEMA_MAX_WORLD) {
        mf_diag_error(s->d, m->span, "the mesh has %" PRId64 " ranks (limit is %d)", world, MF_SEMA_MAX_WORLD);
        ok = false;
    }
    mesh->naxes = m->naxes < MF_MAX_AXES ? m->naxes : MF_MAX_AXES;
    mesh->world = world;
    s->spec->mesh_span = m->span;
    /* Placement arity is checked against the axes even when a size is bad. */
    s->have_mesh = m->naxes <= MF_MAX_AXES;
}

/* A size in bytes with an optional binary suffix; false (reported) when bad. */
static bool size_bytes(mf_sema *s, const mf_ast_setting *st, int64_t *out)
{
    /* "B" last, so that "MB" suggests "MiB" */
    static const char *const suffixes[] = {"KiB", "MiB", "GiB", "TiB", "B"};
    static const int shifts[] = {10, 20, 30, 40, 0};
    int64_t v = st->num.value;
    if (!st->num.suffix) {
        *out = v;
        return true;
    }
    for (size_t i = 0; i < COUNT(suffixes); i++)
        if (strcmp(st->num.suffix, suffixes[i]) == 0) {
            int64_t r;
            if (!mul_ok(v, INT64_C(1) << shifts[i], &r)) {
                mf_diag_error(s->d, st->num.span, "%s %" PRId64 "%s overflows %d bits", st->key.text, v,
                              st->num.suffix, MF_LIMIT_MAGNITUDE_BITS);
                return false;
            }
            *out = r;
            return true;
        }
    const char *hint = mf_diag_suggest(st->num.suffix, suffixes, COUNT(suffixes));
    mf_diag_error(s->d, st->num.span, "unknown size suffix '%s' in '%s'; expected B, KiB, MiB, GiB or TiB%s%s%s",
                  st->num.suffix, st->key.text, hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "");
    return false;
}

/* A count setting `name`: at least 1 (`hint` follows that message) and at
 * most max (too `excess`: "many", "deep"). False (reported) otherwise. */
static bool count_setting(mf_sema *s, const mf_ast_setting *st, const char *name, int64_t max, const char *hint,
                          const char *excess)
{
    int64_t v = st->num.value;
    if (v < 1)
        mf_diag_error(s->d, st->num.span, "%s is %" PRId64 "; it must be at least 1%s", name, v, hint);
    else if (v > max)
        mf_diag_error(s->d, st->num.span, "%s %" PRId64 " is too %s (limit is %" PRId64 ")", name, v, excess, max);
    return v >= 1 && v <= max;
}

/* align, in bytes: a power of two within [MF_SEMA_MIN_ALIGN, MF_SEMA_MAX_ALIGN]. */
static bool align_ok(mf_sema *s, const mf_ast_setting *st, int64_t b)
{
    if (b < MF_SEMA_MIN_ALIGN)
        mf_diag_error(s->d, st->num.span,
                      "align %" PRId64 " bytes is below the minimum of %d; use a power of two such as 256", b,
                      MF_SEMA_MIN_ALIGN);
    else if (b > MF_SEMA_MAX_ALIGN)
        mf_diag_error(s->d, st->num.span, "align %" PRId64 " bytes is too large (limit is %d)", b, MF_SEMA_MAX_ALIGN);
    else if ((b & (b - 1)) != 0)
        mf_diag_error(s->d, st->num.span, "align %" PRId64 " bytes is not a power of two; use e.g. 256", b);
    else
        return true;
    return false;
}

/* bucket_size, in bytes: 0 (no merging) or more. */
static bool bucket_size_ok(mf_sema *s, const mf_ast_setting *st, int64_t b)
{
    if (b >= 0)
        return true;
    mf_diag_error(s->d, st->num.span, "bucket_size is %" PRId64 " bytes; it must be 0 (no merging) or more", b);
    return false;
}

static void check_settings(mf_sema *s)
{
    mf_spec *sp = s->spec;
    const mf_ast_setting *first[MF_AST_SET_BALANCE + 1] = {0};
    for (const mf_ast_setting *st = s->ast->settings; st; st = st->next) {
        if (first[st->kind]) {
            mf_diag_error(s->d, st->key.span, "'%s' set twice; give it once", st->key.text);
            mf_diag_note(s->d, first[st->kind]->key.span, "first set here");
            continue;
        }
        first[st->kind] = st;
        int64_t v = st->num.value;
        switch (st->kind) {
        case MF_AST_SET_MICROBATCHES:
            if (count_setting(s, st, "microbatches", MF_SEMA_MAX_MICROBATCHES, "", "many"))
                sp->microbatches = v;
            break;
        case MF_AST_SET_REDUCE: {
            int r = mf_reduce_from_name(st->word.text);
            if (r < 0)
                unknown_word(s, st->word.span, "reduce op", st->word.text, "", reduce_names, COUNT(reduce_names));
            else
                sp->reduce = (mf_reduce)r;
            break;
        }
        case MF_AST_SET_BALANCE: {
            int b = -1;
            for (size_t i = 0; i < COUNT(balance_names); i++)
                if (strcmp(st->word.text, balance_names[i]) == 0)
                    b = (int)i;
            if (b < 0)
                unknown_word(s, st->word.span, "balance cost", st->word.text,
                             " (what the Whole packing balances)", balance_names, COUNT(balance_names));
            else
                sp->balance = (mf_balance)b;
            break;
        }
        case MF_AST_SET_PREFETCH:
            if (count_setting(s, st, "prefetch", MF_SEMA_MAX_PREFETCH, " (units ahead)", "deep"))
                sp->prefetch = (int)v;
            break;
        case MF_AST_SET_ALIGN:
        case MF_AST_SET_BUCKET_SIZE: {
            int64_t b;
            if (!size_bytes(s, st, &b))
                break;
            if (st->kind == MF_AST_SET_ALIGN && align_ok(s, st, b))
                sp->align = b;
            else if (st->kind == MF_AST_SET_BUCKET_SIZE && bucket_size_ok(s, st, b))
                sp->bucket_size = b;
            break;
        }
        }
    }
}

/* ---- layouts ---- */

/* Where a legality violation (mf_trans_rules_check_layout) points: the placement
 * entry of its role and axis, or the role's whole placement list for the
 * suffix rule; the note at the other role's entry. */
typedef struct mf_sema_illegal_ctx {
    mf_sema *s;
    const mf_ast_place *(*entry)[MF_MAX_AXES];
    const mf_ast_role *const *seen;
    const bool *whole;      /* per role: written Whole (checked as Flat) */
} mf_sema_illegal_ctx;

static void sema_illegal(void *ctx, const mf_illegal *v)
{
    const mf_sema_illegal_ctx *c = ctx;
    mf_span at = v->kind == MF_ILLEGAL_SUFFIX ? c->seen[v->role]->places_span : c->entry[v->role][v->axis]->span;
    bool whole = c->whole[v->role] || (v->note_role != MF_ROLE_COUNT && c->whole[v->note_role]);
    mf_diag_error(c->s->d, at, "%s%s", v->msg, whole ? " (Whole counts as Flat here)" : "");
    if (v->note_role != MF_ROLE_COUNT)
        mf_diag_note(c->s->d, c->entry[v->note_role][v->axis]->span, "%s%s", v->note,
                     c->whole[v->note_role] ? " (written Whole)" : "");
}

/* The mesh's axis names, outermost first; returns how many. */
static int axis_names(const mf_mesh *mesh, const char *names[MF_MAX_AXES])
{
    for (int j = 0; j < mesh->naxes; j++)
        names[j] = mesh->axes[j].name;
    return mesh->naxes;
}

/* The placement of role r has one entry per mesh axis. */
static void check_arity(mf_sema *s, const mf_ast_role *r, const char *what)
{
    const mf_mesh *mesh = &s->spec->mesh;
    int naxes = mesh->naxes;
    if (!s->have_mesh || r->nplaces == naxes)
        return;
    char axes[200];
    const char *names[MF_MAX_AXES];
    int n = axis_names(mesh, names);
    join_words(axes, sizeof axes, names, (size_t)n, ", ");
    mf_diag_error(s->d, r->places_span,
                  "the placement of '%s' in %s has %d %s but the mesh has %d %s (%s); give one entry "
                  "per axis, outermost first",
                  mf_role_name(r->role), what, r->nplaces, r->nplaces == 1 ? "entry" : "entries", naxes,
                  naxes == 1 ? "axis" : "axes", axes);
    mf_diag_note(s->d, s->spec->mesh_span, "the mesh is declared here");
}

/* The mesh axis a labeled entry names, or -1 (reported) when it names none
 * or one given before in this placement. */
static int labeled_slot(mf_sema *s, const mf_ast_place *p, const char *role, const mf_ast_place *const *entry)
{
    const mf_mesh *mesh = &s->spec->mesh;
    int slot = -1;
    for (int k = 0; k < mesh->naxes; k++)
        if (strcmp(mesh->axes[k].name, p->axis.text) == 0)
            slot = k;
    if (slot < 0) {
        const char *names[MF_MAX_AXES];
        int n = axis_names(mesh, names);
        char where[160];
        snprintf(where, sizeof where, " in the placement of '%s'", role);
        unknown_word(s, p->axis.span, "mesh axis", p->axis.text, where, names, (size_t)n);
        return -1;
    }
    if (entry[slot]) {
        mf_diag_error(s->d, p->axis.span, "axis '%s' appears twice in the placement of '%s'", p->axis.text, role);
        mf_diag_note(s->d, entry[slot]->span, "first given here");
        return -1;
    }
    return slot;
}

/* An unknown placement word: "did you mean ...?" with the closest of every
 * placement (the table's, Whole and Distinct), else the list of them. */
static void unknown_placement(mf_sema *s, mf_span at, const char *word, const char *where)
{
    unknown_word(s, at, "placement", word, where, place_names, COUNT(place_names));
}

/* Entry p of role r, Whole or Flat, after `other`, the first entry of the
 * other kind in the same placement (NULL: none): Whole on weight, or Whole
 * mixed with Flat (docs/semantics.md §1), reported at p. False when reported. */
static bool whole_entry_ok(mf_sema *s, const mf_ast_role *r, const char *what, const mf_ast_place *p,
                           bool p_whole, const mf_ast_place *other)
{
    if (p_whole && r->role == MF_ROLE_WEIGHT) {
        mf_diag_error(s->d, p->value.span,
                      "'weight' may not be Whole (in %s): the weight is all-gathered before compute, so only "
                      "grad and main_weight may be Whole; use Flat",
                      what);
        return false;
    }
    if (!other)
        return true;
    mf_diag_error(s->d, p->value.span,
                  "the placement of '%s' in %s mixes Whole and Flat; a role's split axes are all Whole or all "
                  "Flat: write %s here too, or %s there",
                  mf_role_name(r->role), what, p_whole ? "Flat" : "Whole", p_whole ? "Whole" : "Flat");
    mf_diag_note(s->d, other->value.span, "%s is written here", p_whole ? "Flat" : "Whole");
    return false;
}

/* Role r's placement entries into entry (per mesh axis), *out and *whole
 * (some entry is Whole: Flat in *out): all positional, or all labeled with
 * axis names (extension). */
static void resolve_entries(mf_sema *s, const mf_ast_role *r, const char *what, const mf_ast_place **entry,
                            mf_placement *out, bool *whole)
{
    const char *role = mf_role_name(r->role);
    bool labeled = r->places->axis.text != NULL;
    const mf_ast_place *first_whole = NULL, *first_flat = NULL;
    bool reported = false;  /* one Whole finding per placement */
    int j = 0;
    for (const mf_ast_place *p = r->places; p; p = p->next, j++) {
        bool is_whole = strcmp(p->value.text, MF_WHOLE_NAME) == 0;
        bool is_distinct = strcmp(p->value.text, MF_DISTINCT_NAME) == 0;
        int pl = is_whole ? MF_PLACE_FLAT : is_distinct ? (int)MF_PLACE_DISTINCT : mf_place_from_name(p->value.text);
        if (pl == MF_PLACE_FLAT) {
            if (!reported && !whole_entry_ok(s, r, what, p, is_whole, is_whole ? first_flat : first_whole))
                reported = true;
            if (is_whole && !first_whole)
                first_whole = p;
            else if (!is_whole && !first_flat)
                first_flat = p;
        }
        *whole = *whole || is_whole;
        if (pl < 0) {
            char where[160];
            snprintf(where, sizeof where, " for '%s' in %s", role, what);
            unknown_placement(s, p->value.span, p->value.text, where);
        }
        if ((p->axis.text != NULL) != labeled) {
            mf_diag_error(s->d, p->span,
                          "mixed labeled and positional entries in the placement of '%s'; label every entry "
                          "('axis: Flat') or none",
                          role);
            continue;
        }
        int slot = labeled && s->have_mesh ? labeled_slot(s, p, role, entry) : j;
        if (slot >= 0 && slot < MF_MAX_AXES) {
            entry[slot] = p;
            if (pl >= 0)
                out->p[slot] = (uint8_t)pl;
        }
    }
}

/* Every role is required: one error naming those the layout lacks. */
static void report_missing_roles(mf_sema *s, const mf_ast_layout *decl, const char *what,
                                 const mf_ast_role *const *seen)
{
    const char *missing[MF_ROLE_COUNT];
    size_t nmissing = 0;
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (!seen[r])
            missing[nmissing++] = mf_role_name((mf_role)r);
    if (!nmissing)
        return;
    char list[96], quoted[3][24];
    const char *q[3];
    for (size_t i = 0; i < nmissing; i++) {
        snprintf(quoted[i], sizeof quoted[i], "'%s'", missing[i]);
        q[i] = quoted[i];
    }
    join_words(list, sizeof list, q, nmissing, " and ");
    mf_diag_error(s->d, decl->span, "%s has no %s %s; a layout declares weight, grad and main_weight", what, list,
                  nmissing == 1 ? "role" : "roles");
}

/* In a layout with a Whole role, a role that is not Whole but splits into
 * more shards than the finest Whole role: a whole bucket's shards are ragged
 * (docs/semantics.md §4.6), cut at the owners' boundaries, and a finer split
 * has no boundaries to follow. */
static void whole_finer_error(mf_sema *s, const mf_ast_role *const seen[MF_ROLE_COUNT], const char *what,
                              const mf_spec_layout *out)
{
    const mf_mesh *m = &s->spec->mesh;
    int fine = -1;
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (out->whole[r] && (fine < 0 || mf_layout_shards(m, &out->place[r]) > mf_layout_shards(m, &out->place[fine])))
            fine = r;
    if (fine < 0)
        return;
    int64_t P = mf_layout_shards(m, &out->place[fine]);
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        int64_t n = mf_layout_shards(m, &out->place[r]);
        if (out->whole[r] || n <= P || !seen[r])
            continue;
        char a[64], b[64];
        mf_diag_error(s->d, seen[r]->places_span,
                      "'%s' in %s splits into %lld shards, more than the %lld of its Whole '%s' %s; a whole bucket's "
                      "shards follow its owners, so no role may split finer than the finest Whole one; use %s or "
                      "make '%s' Whole too",
                      mf_role_name((mf_role)r), what, (long long)n, (long long)P, mf_role_name((mf_role)fine),
                      mf_placement_format_as(&out->place[fine], m->naxes, true, a, sizeof a),
                      mf_placement_format(&out->place[fine], m->naxes, b, sizeof b), mf_role_name((mf_role)r));
        mf_diag_note(s->d, seen[fine]->places_span, "the Whole '%s' is placed here", mf_role_name((mf_role)fine));
    }
}

/* A Whole placement that breaks the suffix rule, with the placement that keeps it. */
static void whole_suffix_error(mf_sema *s, const mf_ast_role *r, const char *what, const mf_placement *p)
{
    const mf_mesh *mesh = &s->spec->mesh;
    int naxes = mesh->naxes, bad, inner;
    if (!mf_trans_rules_suffix_break(p, naxes, &bad, &inner))
        return;
    mf_placement fixed = mf_trans_rules_suffix_fix(p, naxes);
    char have[96], fix[96];
    mf_diag_error(s->d, r->places_span,
                  "placement %s of '%s' in %s breaks the suffix rule: axis '%s' is Whole but axis '%s' inside it "
                  "is %s; Whole axes must be the innermost, e.g. %s",
                  mf_placement_format_as(p, naxes, true, have, sizeof have), mf_role_name(r->role), what,
                  mesh->axes[bad].name, mesh->axes[inner].name, mf_place_name((mf_place)p->p[inner]),
                  mf_placement_format_as(&fixed, naxes, true, fix, sizeof fix));
}

/* Resolves the roles of a layout block into out (placements indexed by mesh
 * axis). Returns true when every role is present, well-formed and legal. */
static bool resolve_layout(mf_sema *s, const mf_ast_layout *decl, const char *what, mf_spec_layout *out)
{
    int before = mf_diag_errors(s->d);
    const mf_ast_role *seen[MF_ROLE_COUNT] = {0};
    const mf_ast_place *entry[MF_ROLE_COUNT][MF_MAX_AXES] = {{0}};
    for (const mf_ast_role *r = decl->roles; r; r = r->next) {
        const char *role = mf_role_name(r->role);
        if (seen[r->role]) {
            mf_diag_error(s->d, r->role_span, "role '%s' declared twice in %s; give each role once", role, what);
            mf_diag_note(s->d, seen[r->role]->role_span, "first declared here");
            continue;
        }
        seen[r->role] = r;
        out->role_span[r->role] = r->span;
        int dt = mf_dtype_from_name(r->dtype.text);
        if (dt < 0) {
            char where[160];
            snprintf(where, sizeof where, " for '%s' in %s", role, what);
            unknown_word(s, r->dtype.span, "dtype", r->dtype.text, where, dtype_names, COUNT(dtype_names));
        } else {
            out->dtype[r->role] = (mf_dtype)dt;
        }
        if (r->nplaces == 0) {
            mf_diag_error(s->d, r->places_span, "the placement of '%s' in %s is empty; give one entry per mesh axis",
                          role, what);
            continue;
        }
        check_arity(s, r, what);
        resolve_entries(s, r, what, entry[r->role], &out->place[r->role], &out->whole[r->role]);
    }
    report_missing_roles(s, decl, what, seen);
    if (mf_diag_errors(s->d) != before || !s->have_mesh)
        return false;

    /* The suffix rule of a Whole placement, in its own words (docs/semantics.md §1). */
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        if (out->whole[r] && !mf_layout_flat_suffix_ok(&out->place[r], s->spec->mesh.naxes))
            whole_suffix_error(s, seen[r], what, &out->place[r]);
    if (mf_diag_errors(s->d) != before)
        return false;
    whole_finer_error(s, seen, what, out);
    if (mf_diag_errors(s->d) != before)
        return false;

    /* Only grad Partial, the suffix rule, every transition's moves legal. */
    mf_sema_illegal_ctx ic = {s, entry, seen, out->whole};
    if (mf_trans_rules_check_layout(&s->spec->mesh, out->place, what, sema_illegal, &ic) != 0)
        return false;
    return mf_diag_errors(s->d) == before;
}

/* Appends a layout; returns its index or -1 on OOM. */
static int add_layout(mf_sema *s, const mf_spec_layout *l, const mf_ast_layout *decl, const char *what, bool ok)
{
    mf_spec_layout *nl = mf_vec_push(&s->layouts);
    mf_sema_layout_info *info = mf_vec_push(&s->linfo);
    if (!nl || !info) {
        sema_oom(s);
        return -1;
    }
    *nl = *l;
    info->decl = decl;
    info->what = what;
    info->ok = ok;
    return (int)s->layouts.len - 1;
}

static void check_named_layouts(mf_sema *s)
{
    for (const mf_ast_layout *l = s->ast->layouts; l; l = l->next) {
        int prev = (int)mf_hash_get_str(&s->layout_names, l->name.text);
        if (prev >= 0) {
            const mf_sema_layout_info *pi = (const mf_sema_layout_info *)s->linfo.data + prev;
            mf_diag_error(s->d, l->name.span, "layout '%s' declared twice; layout names must be unique",
                          l->name.text);
            mf_diag_note(s->d, pi->decl->span, "layout '%s' first declared here", l->name.text);
            continue;
        }
        mf_spec_layout out = {0};
        out.name = l->name.text;
        out.span = l->span;
        char *what = mf_arena_printf(s->a, "layout '%s'", l->name.text);
        if (!what) {
            sema_oom(s);
            return;
        }
        bool ok = resolve_layout(s, l, what, &out);
        int idx = add_layout(s, &out, l, what, ok);
        if (idx < 0 || mf_hash_put_str(&s->layout_names, l->name.text, idx) < 0) {
            sema_oom(s);
            return;
        }
    }
}

/* A built-in layout (mf_builtin_layouts.h) named by ref, added to the spec on
 * first use and then found by name like a declared one. Returns its index;
 * -1 when ref names no built-in layout; -2 when it names one that does not
 * fit the mesh (reported). */
static int builtin_layout(mf_sema *s, const mf_ast_name *ref, const char *user)
{
    int b = mf_builtin_layouts_find(ref->text);
    if (b < 0)
        return -1;
    const mf_mesh *mesh = &s->spec->mesh;
    mf_spec_layout out = {0};
    if (!s->have_mesh || !mf_builtin_layouts_resolve(b, mesh->naxes, out.dtype, out.place)) {
        if (s->have_mesh)
            mf_diag_error(s->d, ref->span,
                          "built-in layout '%s' for %s needs a mesh of %s axes, but the mesh has %d; declare "
                          "'layout %s { ... }' or pick another built-in layout (docs/language.md)",
                          ref->text, user, mf_builtin_ranks(b), mesh->naxes, ref->text);
        return -2;
    }
    mf_builtin_layouts_whole(b, out.whole);
    out.name = ref->text;
    out.span = ref->span;
    for (int r = 0; r < MF_ROLE_COUNT; r++)
        out.role_span[r] = ref->span;
    int idx = add_layout(s, &out, NULL, mf_arena_printf(s->a, "built-in layout '%s'", ref->text), true);
    if (idx < 0 || mf_hash_put_str(&s->layout_names, ref->text, idx) < 0) {
        sema_oom(s);
        return -2;
    }
    return idx;
}

/* Looks up a layout reference (declared, then built-in); reports an unknown
 * one. -1 when unknown. */
static int lookup_layout(mf_sema *s, const mf_ast_name *ref, const char *user)
{
    int idx = (int)mf_hash_get_str(&s->layout_names, ref->text);
    if (idx >= 0)
        return idx;
    idx = builtin_layout(s, ref, user);
    if (idx != -1)
        return idx < 0 ? -1 : idx;
    size_t n = 0;
    for (const mf_ast_layout *l = s->ast->layouts; l; l = l->next)
        n++;
    if (n == 0) {
        mf_diag_error(s->d, ref->span, "unknown layout '%s' for %s; no layouts are declared (write 'layout %s { ... }')",
                      ref->text, user, ref->text);
        return -1;
    }
    const char **names = calloc(n, sizeof *names);
    if (!names) {
        sema_oom(s);
        return -1;
    }
    size_t i = 0;
    for (const mf_ast_layout *l = s->ast->layouts; l; l = l->next)
        names[i++] = l->name.text;
    const char *hint = mf_diag_suggest(ref->text, names, n);
    if (hint) {
        mf_diag_error(s->d, ref->span, "unknown layout '%s' for %s; did you mean '%s'?", ref->text, user, hint);
        int h = (int)mf_hash_get_str(&s->layout_names, hint);
        if (h >= 0)
            mf_diag_note(s->d, ((const mf_sema_layout_info *)s->linfo.data)[h].decl->span,
                         "layout '%s' declared here", hint);
    } else {
        char list[256];
        join_words(list, sizeof list, names, n > 8 ? 8 : n, n > 8 ? ", " : " or ");
        mf_diag_error(s->d, ref->span, "unknown layout '%s' for %s; expected %s%s", ref->text, user,
                      n > 8 ? "one of " : "", list);
        if (n > 8)
            mf_diag_note(s->d, ref->span, "%zu layouts are declared in all", n);
    }
    free(names);
    return -1;
}

/* An inline layout: resolved once per declaration; identical ones share one
 * spec layout (so their tensors share a bucket). Returns the index or -1. */
static int inline_layout(mf_sema *s, const mf_ast_layout *decl, const char *unit_t, const char *tensor_t)
{
    char *what = mf_arena_printf(s->a, "the inline layout of tensor '%s.%s'", unit_t, tensor_t);
    if (!what) {
        sema_oom(s);
        return -1;
    }
    mf_spec_layout out = {0};
    out.span = decl->span;
    out.is_inline = true;
    if (!resolve_layout(s, decl, what, &out))
        return -1;
    int naxes = s->spec->mesh.naxes;
    char sig[128];
    int o = snprintf(sig, sizeof sig, "inline");
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        char letters[MF_MAX_AXES + 1];
        o += snprintf(sig + o, sizeof sig - (size_t)o, "|%d:%s%s", (int)out.dtype[r],
                      mf_placement_letters(&out.place[r], naxes, letters), out.whole[r] ? "W" : "");
    }
    int prev = (int)mf_hash_get_str(&s->inline_sigs, sig);
    if (prev >= 0)
        return prev;
    out.name = mf_arena_printf(s->a, "<inline %s.%s>", unit_t, tensor_t);
    if (!out.name) {
        sema_oom(s);
        return -1;
    }
    int idx = add_layout(s, &out, decl, what, true);
    if (idx < 0 || mf_hash_put_str(&s->inline_sigs, sig, idx) < 0) {
        sema_oom(s);
        return -1;
    }
    return idx;
}

/* ---- names and loops ---- */

static int scope_find(const mf_sema *s, const char *var, size_t len)
{
    for (int i = s->nscope - 1; i >= 0; i--)
        if (strlen(s->scope[i].var) == len && memcmp(s->scope[i].var, var, len) == 0)
            return i;
    return -1;
}

/*
 * Checks a name template: non-empty, braces balanced, every {var} bound.
 * Sets *used to the scope entries it uses (bit i = scope[i]). `kind` is
 * "unit" or "tensor". Returns false when it reported an error.
 */
static bool check_template(mf_sema *s, const mf_ast_name *name, const char *kind, uint32_t *used)
{
    const char *t = name->text;
    *used = 0;
    if (!*t) {
        mf_diag_error(s->d, name->span, "empty %s name; give it a name such as \"%s\"", kind,
                      strcmp(kind, "unit") == 0 ? "layers.{i}" : "attention.wo.weight");
        return false;
    }
    for (size_t i = 0; t[i]; i++) {
        if (t[i] == '}') {
            mf_diag_error(s->d, span_in_string(name->span, i, 1),
                          "unmatched '}' in %s name \"%s\"; write {var} to substitute a loop variable", kind, t);
            return false;
        }
        if (t[i] != '{')
            continue;
        const char *close = strchr(t + i + 1, '}');
        const char *open = strchr(t + i + 1, '{');
        if (!close || (open && open < close)) {
            mf_diag_error(s->d, span_in_string(name->span, i, 1),
                          "unterminated '{' in %s name \"%s\"; write {var} to substitute a loop variable", kind, t);
            return false;
        }
        size_t len = (size_t)(close - (t + i + 1));
        mf_span at = span_in_string(name->span, i, len + 2);
        if (len == 0) {
            mf_diag_error(s->d, at, "empty '{}' in %s name \"%s\"; write {var} to substitute a loop variable", kind,
                          t);
            return false;
        }
        int b = scope_find(s, t + i + 1, len);
        if (b < 0) {
            if (s->nscope == 0) {
                mf_diag_error(s->d, at,
                              "unknown substitution variable '%.*s' in %s name \"%s\"; no loop variable is in scope "
                              "here (write 'for %.*s in A..B')",
                              (int)len, t + i + 1, kind, t, (int)len, t + i + 1);
            } else {
                const char *vars[MF_SEMA_MAX_SCOPE];
                char list[160], quoted[MF_SEMA_MAX_SCOPE][40];
                for (int k = 0; k < s->nscope; k++) {
                    snprintf(quoted[k], sizeof quoted[k], "'%.32s'", s->scope[k].var);
                    vars[k] = quoted[k];
                }
                join_words(list, sizeof list, vars, (size_t)s->nscope, " and ");
                mf_diag_error(s->d, at, "unknown substitution variable '%.*s' in %s name \"%s\"; in scope: %s",
                              (int)len, t + i + 1, kind, t, list);
            }
            return false;
        }
        *used |= 1u << b;
        i += len + 1;
    }
    return true;
}

/* Range checks of a loop; *count = iterations. Returns false when reported. */
static bool check_loop(mf_sema *s, const mf_ast_loop *l, int64_t *count)
{
    int shadow = scope_find(s, l->var.text, strlen(l->var.text));
    if (shadow >= 0) {
        mf_diag_error(s->d, l->var.span, "loop variable '%s' is already bound by an enclosing loop; use another name",
                      l->var.text);
        mf_diag_note(s->d, s->scope[shadow].loop->var.span, "'%s' bound here", l->var.text);
        return false;
    }
    int64_t lo = l->lo.value, hi = l->hi.value;
    mf_span range = mf_span_join(l->lo.span, l->hi.span);
    if (lo == hi) {
        mf_diag_error(s->d, range,
                      "empty loop range %" PRId64 "..%" PRId64 "; ranges are half-open (A..B runs A to B-1), so "
                      "write %" PRId64 "..%" PRId64 " for one iteration",
                      lo, hi, lo, lo + (lo < INT64_MAX ? 1 : 0));
        return false;
    }
    if (lo > hi) {
        mf_diag_error(s->d, range,
                      "reversed loop range %" PRId64 "..%" PRId64 "; the start must be below the end, e.g. %" PRId64
                      "..%" PRId64,
                      lo, hi, hi, lo);
        return false;
    }
    if (__builtin_sub_overflow(hi, lo, count))
        *count = INT64_MAX;
    return true;
}

/* Writes a template with the bound variables substituted into the arena. */
static const char *substitute(mf_sema *s, const char *t)
{
    if (!strchr(t, '{'))
        return t;
    size_t cap = strlen(t) + 1 + (size_t)s->nscope * 24, o = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (size_t i = 0; t[i];) {
        if (t[i] == '{') {
            const char *close = strchr(t + i + 1, '}');
            int b = scope_find(s, t + i + 1, (size_t)(close - (t + i + 1)));
            char num[24];
            int k = snprintf(num, sizeof num, "%" PRId64, b >= 0 ? s->scope[b].value : 0);
            if (o + (size_t)k + 1 > cap) {
                cap = cap * 2 + (size_t)k;
                char *nb = realloc(buf, cap);
                if (!nb) {
                    free(buf);
                    return NULL;
                }
                buf = nb;
            }
            memcpy(buf + o, num, (size_t)k);
            o += (size_t)k;
            i = (size_t)(close - t) + 1;
        } else {
            if (o + 2 > cap) {
                cap *= 2;
                char *nb = realloc(buf, cap);
                if (!nb) {
                    free(buf);
                    return NULL;
                }
                buf = nb;
            }
            buf[o++] = t[i++];
        }
    }
    buf[o] = '\0';
    char *r = mf_arena_strndup(s->a, buf, o);
    free(buf);
    return r;
}

/* " (i = 3, e = 1)" for messages about an expanded name; "" outside loops. */
static void bindings_text(const mf_sema *s, char *buf, size_t size)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < s->nscope && o < size; i++) {
        int k = snprintf(buf + o, size - o, "%s%.32s = %" PRId64, i == 0 ? " (" : ", ", s->scope[i].var,
                         s->scope[i].value);
        if (k < 0)
            return;
        o += (size_t)k;
    }
    if (s->nscope && o < size)
        snprintf(buf + o, size - o, ")");
}

/* ---- global names (docs/language.md §3.4) ---- */

/* The names an expression of a `global` template may use besides the loop
 * variables: the tensor's Distinct axes (rename form) with their coordinate. */
typedef struct {
    const mf_sema_tinfo *ti;
    bool allow_axes;        /* rename form */
    int64_t coord[MF_MAX_AXES]; /* per Distinct axis (index into ti->dist) */
    const char *tmpl;       /* the template, for messages */
    mf_span span;           /* the template's string */
} mf_sema_gctx;

/* One name of an expression: a loop variable or (rename) a Distinct axis. */
static bool glob_name(mf_sema *s, const mf_sema_gctx *g, const char *e, size_t len, mf_span at, int64_t *out)
{
    int b = scope_find(s, e, len);
    if (b >= 0) {
        *out = s->scope[b].value;
        return true;
    }
    const mf_mesh *m = &s->spec->mesh;
    for (int k = 0; k < g->ti->ndist; k++) {
        const char *ax = m->axes[g->ti->dist[k]].name;
        if (strlen(ax) != len || memcmp(ax, e, len) != 0)
            continue;
        if (!g->allow_axes) {
            mf_diag_error(s->d, at,
                          "axis name '%.*s' in the split template \"%s\"; a split global name is one tensor for "
                          "every coordinate, so it may use loop variables only",
                          (int)len, e, g->tmpl);
            return false;
        }
        *out = g->coord[k];
        return true;
    }
    char list[200] = "";
    size_t o = 0;
    for (int i = 0; i < s->nscope && o < sizeof list; i++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s'%.32s'", o ? ", " : "", s->scope[i].var);
    for (int k = 0; g->allow_axes && k < g->ti->ndist && o < sizeof list; k++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s'%.32s'", o ? ", " : "", m->axes[g->ti->dist[k]].name);
    mf_diag_error(s->d, at, "unknown name '%.*s' in the global template \"%s\"; %s%s", (int)len, e, g->tmpl,
                  o ? "it may use " : "no loop variable or Distinct axis is in scope here",
                  list);
    return false;
}

/* A term: INT, NAME, INT*NAME or NAME*INT. `at` spans the whole {...}. */
static bool glob_term(mf_sema *s, const mf_sema_gctx *g, const char *e, size_t len, mf_span at, int64_t *out)
{
    while (len && e[0] == ' ')
        e++, len--;
    while (len && e[len - 1] == ' ')
        len--;
    const char *star = memchr(e, '*', len);
    if (star) {
        size_t l1 = (size_t)(star - e);
        int64_t a, b;
        bool n1 = l1 && e[0] >= '0' && e[0] <= '9', n2;
        const char *e2 = star + 1;
        size_t l2 = len - l1 - 1;
        while (l2 && *e2 == ' ')
            e2++, l2--;
        n2 = l2 && e2[0] >= '0' && e2[0] <= '9';
        if (n1 == n2 || memchr(e2, '*', l2)) {
            mf_diag_error(s->d, at,
                          "bad term '%.*s' in the global template \"%s\"; a term is INT, NAME, INT*NAME or NAME*INT",
                          (int)len, e, g->tmpl);
            return false;
        }
        return glob_term(s, g, e, l1, at, &a) && glob_term(s, g, e2, l2, at, &b) &&
               (mul_ok(a, b, out) || (mf_diag_error(s->d, at, "the global template \"%s\" overflows", g->tmpl), 0));
    }
    if (len && e[0] >= '0' && e[0] <= '9') {
        int64_t v = 0;
        for (size_t i = 0; i < len; i++)
            if (e[i] < '0' || e[i] > '9' || !mul_ok(v, 10, &v) || !add_ok(v, e[i] - '0', &v)) {
                mf_diag_error(s->d, at, "bad integer '%.*s' in the global template \"%s\"", (int)len, e, g->tmpl);
                return false;
            }
        *out = v;
        return true;
    }
    bool ident = len > 0;
    for (size_t i = 0; i < len; i++)
        ident &= (e[i] == '_' || (e[i] >= 'a' && e[i] <= 'z') || (e[i] >= 'A' && e[i] <= 'Z') ||
                  (i && e[i] >= '0' && e[i] <= '9'));
    if (!ident) {
        mf_diag_error(s->d, at,
                      "bad term '%.*s' in the global template \"%s\"; a term is INT, NAME, INT*NAME or NAME*INT",
                      (int)len, e, g->tmpl);
        return false;
    }
    return glob_name(s, g, e, len, at, out);
}

/* An expression: terms joined by '+' or '-'; the value must be >= 0. */
static bool glob_expr(mf_sema *s, const mf_sema_gctx *g, const char *e, size_t len, mf_span at, int64_t *out)
{
    int64_t acc = 0;
    int sign = 1;
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && e[i] != '+' && e[i] != '-')
            continue;
        int64_t v;
        if (!glob_term(s, g, e + start, i - start, at, &v))
            return false;
        if (!(sign > 0 ? add_ok(acc, v, &acc) : !__builtin_sub_overflow(acc, v, &acc))) {
            mf_diag_error(s->d, at, "the global template \"%s\" overflows", g->tmpl);
            return false;
        }
        sign = i < len && e[i] == '-' ? -1 : 1;
        start = i + 1;
    }
    if (acc < 0) {
        mf_diag_error(s->d, at, "'{%.*s}' in the global template \"%s\" is %" PRId64 "; an index must be >= 0",
                      (int)len, e, g->tmpl, acc);
        return false;
    }
    *out = acc;
    return true;
}

/* The template with every {expr} evaluated, or NULL (reported, or s->oom). */
static char *glob_expand(mf_sema *s, const mf_sema_gctx *g)
{
    const char *t = g->tmpl;
    char buf[MF_SEMA_GLOBAL_BYTES + 1];
    size_t o = 0;
    for (size_t i = 0; t[i];) {
        char piece[24];
        const char *add = t + i;
        size_t n = 1;
        if (t[i] == '{' || t[i] == '}') {
            const char *close = t[i] == '{' ? strchr(t + i + 1, '}') : NULL;
            const char *open = t[i] == '{' ? strchr(t + i + 1, '{') : NULL;
            if (!close || (open && open < close) || close == t + i + 1) {
                mf_diag_error(s->d, span_in_string(g->span, i, 1),
                              "unbalanced or empty braces in the global template \"%s\"; write {expr}", t);
                return NULL;
            }
            int64_t v;
            if (!glob_expr(s, g, t + i + 1, (size_t)(close - t - i - 1),
                           span_in_string(g->span, i, (size_t)(close - t - i) + 1), &v))
                return NULL;
            n = (size_t)snprintf(piece, sizeof piece, "%" PRId64, v);
            add = piece;
            i = (size_t)(close - t) + 1;
        } else {
            i++;
        }
        if (o + n > MF_SEMA_GLOBAL_BYTES) {
            mf_diag_error(s->d, g->span, "the global template \"%s\" expands past %d bytes", t, MF_SEMA_GLOBAL_BYTES);
            return NULL;
        }
        memcpy(buf + o, add, n);
        o += n;
    }
    buf[o] = '\0';
    if (!o) {
        mf_diag_error(s->d, g->span, "empty global template; write the global tensor's name, e.g. "
                                     "\"experts.{32*ep+e}.w1\"");
        return NULL;
    }
    char *r = mf_arena_strndup(s->a, buf, o);
    if (!r)
        sema_oom(s);
    return r;
}

/* Checks the clause of tensor item t once (template level): a Distinct axis,
 * D in range, the template's names. Sets ti->global_ok. */
static void check_global(mf_sema *s, const mf_ast_tensor *t, mf_sema_tinfo *ti)
{
    if (ti->layout < 0)
        return;
    const mf_spec_layout *l = &((const mf_spec_layout *)s->layouts.data)[ti->layout];
    for (int j = 0; j < s->spec->mesh.naxes; j++)
        if (l->place[MF_ROLE_WEIGHT].p[j] == MF_PLACE_DISTINCT)
            ti->dist[ti->ndist++] = j;
    if (!t->global.text)
        return;
    if (!ti->ndist) {
        mf_diag_error(s->d, t->global_span,
                      "'global' on tensor \"%s\", which is Distinct on no mesh axis; its own name is already its "
                      "global name (remove the clause, or give it a layout with a Distinct axis)",
                      t->name.text);
        return;
    }
    if (t->has_split && (t->split.value < 0 || t->split.value >= t->ndims)) {
        mf_diag_error(s->d, t->split.span, "split %" PRId64 " of tensor \"%s\" is out of range; it has %d "
                      "dimension%s (split 0..%d)", t->split.value, t->name.text, t->ndims,
                      t->ndims == 1 ? "" : "s", t->ndims - 1);
        return;
    }
    mf_sema_gctx g = {.ti = ti, .allow_axes = !t->has_split, .tmpl = t->global.text, .span = t->global.span};
    ti->global_ok = glob_expand(s, &g) != NULL;
}

/* Claims global name `name` for tensor `owner` (span at); reports a name
 * claimed before. `split` and dims describe the global tensor. */
static bool claim_global(mf_sema *s, const char *name, const char *owner, mf_span at, bool split, int ndims,
                         const int64_t *dims, const char *where)
{
    int prev = (int)mf_hash_get_str(&s->global_names, name);
    if (prev >= 0) {
        const mf_sema_gname *p = &((const mf_sema_gname *)s->gnames.data)[prev];
        bool shapes = split && p->split &&
                      (p->ndims != ndims || memcmp(p->dims, dims, (size_t)ndims * sizeof *dims) != 0);
        if (strcmp(p->owner, owner) == 0)
            mf_diag_error(s->d, at, "global name '%s' of tensor '%s'%s repeats for two coordinates of its Distinct "
                          "axes; use every Distinct axis in the template (e.g. {32*ep+e})", name, owner, where);
        else
            mf_diag_error(s->d, at, "global name '%s' of tensor '%s'%s is already claimed by tensor '%s'%s; global "
                          "names must be unique", name, owner, where, p->owner,
                          shapes ? " with another shape" : "");
        mf_diag_note(s->d, p->span, "'%s' claimed here", name);
        return false;
    }
    mf_sema_gname *g = mf_vec_push(&s->gnames);
    if (!g || mf_hash_put_str(&s->global_names, name, (int)s->gnames.len - 1) < 0) {
        sema_oom(s);
        return false;
    }
    *g = (mf_sema_gname){.span = at, .owner = owner, .split = split, .ndims = ndims};
    memcpy(g->dims, dims, (size_t)ndims * sizeof *dims);
    return true;
}

/* Expands the clause of st (a tensor of item t) for the current bindings
 * and claims its names; a tensor without one claims its own full name. */
static void expand_global(mf_sema *s, const char *unit, const mf_ast_tensor *t, const mf_sema_tinfo *ti,
                          mf_spec_tensor *st)
{
    char where[200];
    bindings_text(s, where, sizeof where);
    if (!t->global.text) {
        if (!ti->ndist)
            claim_global(s, st->name, st->name, st->span, false, st->ndims, st->dims, where);
        return;
    }
    if (!ti->global_ok)
        return;
    const mf_mesh *m = &s->spec->mesh;
    int64_t combos = 1;
    for (int k = 0; k < ti->ndist; k++)
        combos *= m->axes[ti->dist[k]].size;
    size_t n = t->has_split ? 1 : (size_t)combos;
    st->global = mf_arena_array(s->a, n, sizeof *st->global);
    if (!st->global) {
        sema_oom(s);
        return;
    }
    st->global_split = t->has_split;
    st->global_dim = t->has_split ? (int)t->split.value : 0;
    st->global_span = t->global_span;
    int64_t gd[MF_MAX_DIMS];
    memcpy(gd, st->dims, sizeof gd);
    if (t->has_split)
        gd[st->global_dim] *= combos;
    for (size_t c = 0; c < n && !s->oom; c++) {
        mf_sema_gctx g = {.ti = ti, .allow_axes = !t->has_split, .tmpl = t->global.text, .span = t->global.span};
        for (int k = ti->ndist - 1, r = (int)c; k >= 0; k--) {
            g.coord[k] = r % m->axes[ti->dist[k]].size;
            r /= (int)m->axes[ti->dist[k]].size;
        }
        char *e = glob_expand(s, &g);
        char *full = e ? mf_arena_printf(s->a, "%s.%s", unit, e) : NULL;
        if (!full) {
            if (e)
                sema_oom(s);
            return;
        }
        st->global[c] = full;
        char at[300];
        size_t o = (size_t)snprintf(at, sizeof at, "%s", where);
        for (int k = 0; !t->has_split && k < ti->ndist && o < sizeof at; k++)
            o += (size_t)snprintf(at + o, sizeof at - o, " at %s = %" PRId64, m->axes[ti->dist[k]].name, g.coord[k]);
        if (!claim_global(s, full, st->name, t->global_span, t->has_split, st->ndims, gd, at))
            return; /* one message per tensor */
    }
    st->nglobal = (int)n;
}

/* ---- units: templates ---- */

typedef struct {
    const mf_ast_unit *u;
    int layout;             /* default, -1 when none or unknown */
    bool layout_auto;       /* `layout auto`: layout is a placeholder */
    bool reshard;
    int64_t tensors;        /* per iteration, saturating */
    int64_t elems;          /* per iteration; -1 when it overflowed */
} mf_sema_unit_t;

static bool count_add(int64_t *acc, int64_t v)
{
    if (*acc < 0 || v < 0 || !add_ok(*acc, v, acc)) {
        *acc = -1;
        return false;
    }
    return true;
}

/* Checks the items of a unit body (once, not per iteration) and records each
 * tensor declaration in s->tinfo. Counts tensors and elements per iteration. */
/* The dimensions of tensor t: each at least 1, the product within
 * MF_SEMA_MAX_ELEMS. True (and the product in *out) when they are valid. */
static bool check_dims(mf_sema *s, const mf_ast_tensor *t, int64_t *out)
{
    int64_t numel = 1;
    bool over = false;
    if (t->ndims == 0) {
        mf_diag_error(s->d, t->dims_span,
                      "tensor \"%s\" has no dimensions; write [1] for a single element", t->name.text);
    } else if (t->ndims > MF_MAX_DIMS) {
        mf_diag_error(s->d, t->dims_span, "tensor \"%s\" has %d dimensions (limit is %d)", t->name.text,
                      t->ndims, MF_MAX_DIMS);
    }
    int k = 0;
    bool dims_ok = t->ndims >= 1 && t->ndims <= MF_MAX_DIMS;
    for (const mf_ast_dim *dm = t->dims; dm; dm = dm->next, k++) {
        if (dm->size.value < 1) {
            mf_diag_error(s->d, dm->size.span,
                          "dimension %d of tensor \"%s\" is %" PRId64 "; a dimension must be at least 1",
                          k + 1, t->name.text, dm->size.value);
            dims_ok = false;
        } else if (!over && !mul_ok(numel, dm->size.value, &numel)) {
            over = true;
        }
    }
    if (dims_ok && over) {
        mf_diag_error(s->d, t->dims_span,
                      "tensor \"%s\" has too many elements: the product of its dimensions overflows %d bits",
                      t->name.text, MF_LIMIT_MAGNITUDE_BITS);
        dims_ok = false;
    } else if (dims_ok && numel > MF_SEMA_MAX_ELEMS) {
        mf_diag_error(s->d, t->dims_span, "tensor \"%s\" has %" PRId64 " elements (limit is %" PRId64 ")",
                      t->name.text, numel, MF_SEMA_MAX_ELEMS);
        dims_ok = false;
    }
    *out = numel;
    return dims_ok;
}

/* One tensor item of unit ut: its name template, dimensions and layout;
 * counts it into *ntensors and *nelems. */
static void check_tensor(mf_sema *s, mf_sema_unit_t *ut, const mf_ast_item *it, int64_t *ntensors, int64_t *nelems)
{
    const mf_ast_tensor *t = &it->tensor;
    mf_sema_tinfo *ti = mf_vec_push(&s->tinfo);
    if (!ti) {
        sema_oom(s);
        return;
    }
    ti->item = it;
    ti->layout = -1;
    uint32_t used;
    if (check_template(s, &t->name, "tensor", &used)) {
        /* Variables of enclosing tensor loops must vary the name. */
        int first_for = ut->u->loop ? 1 : 0;
        for (int v = first_for; v < s->nscope; v++)
            if (!(used & (1u << v))) {
                mf_diag_error(s->d, t->name.span,
                              "tensor name \"%s\" does not use the loop variable '%s', so every iteration "
                              "would declare the same tensor; write {%s} in the name",
                              t->name.text, s->scope[v].var, s->scope[v].var);
                mf_diag_note(s->d, s->scope[v].loop->span, "the loop over '%s' is here", s->scope[v].var);
                break;
            }
    }
    int64_t numel = 0;
    bool dims_ok = check_dims(s, t, &numel);
    ti->numel = dims_ok ? numel : 0;
    /* layout: override, inline, or the unit's default */
    char user[320];
    snprintf(user, sizeof user, "tensor \"%s\" in unit \"%s\"", t->name.text, ut->u->name.text);
    if (t->layout.text) {
        ti->layout = lookup_layout(s, &t->layout, user);
    } else if (t->inline_layout) {
        ti->layout = inline_layout(s, t->inline_layout, ut->u->name.text, t->name.text);
    } else if (ut->u->layout.text) {
        ti->layout = ut->layout;
        ti->unit_default = true;
    } else {
        mf_diag_error(s->d, t->name.span,
                      "tensor \"%s\" has no layout: unit \"%s\" has no default 'layout NAME' and the tensor "
                      "gives none; add 'layout NAME' to either, or inline roles '{ weight ...; }'",
                      t->name.text, ut->u->name.text);
        mf_diag_note(s->d, ut->u->span, "unit \"%s\" declared here", ut->u->name.text);
    }
    if (dims_ok)
        check_global(s, t, ti);
    if (*ntensors < INT64_MAX)
        (*ntensors)++;
    if (!dims_ok)
        numel = 0;
    count_add(nelems, numel);
}

static void check_items(mf_sema *s, mf_sema_unit_t *ut, const mf_ast_item *items, int depth, int64_t *ntensors,
                        int64_t *nelems)
{
    *ntensors = 0;
    *nelems = 0;
    for (const mf_ast_item *it = items; it; it = it->next) {
        switch (it->kind) {
        case MF_AST_ITEM_OPTION:
            if (depth > 0)
                mf_diag_error(s->d, it->key.span,
                              "'%s' is a unit option; put it directly in the body of unit \"%s\", not in a loop",
                              it->key.text, ut->u->name.text);
            break;
        case MF_AST_ITEM_TENSOR:
            check_tensor(s, ut, it, ntensors, nelems);
            break;
        case MF_AST_ITEM_FOR: {
            int64_t iters;
            if (s->nscope >= MF_SEMA_MAX_SCOPE) {
                mf_diag_error(s->d, it->loop.span, "too many nested loops (limit is %d)", MF_SEMA_MAX_SCOPE);
                break;
            }
            bool ok = check_loop(s, &it->loop, &iters);
            if (!ok)
                iters = 0;
            s->scope[s->nscope++] = (mf_sema_binding){it->loop.var.text, it->loop.lo.value, &it->loop};
            int64_t nt, ne;
            check_items(s, ut, it->body, depth + 1, &nt, &ne);
            s->nscope--;
            if (s->oom)
                return;
            int64_t tt, te;
            if (!mul_ok(nt, iters, &tt))
                tt = INT64_MAX;
            if (ne < 0 || !mul_ok(ne, iters, &te))
                te = -1;
            if (*ntensors > INT64_MAX - tt)
                *ntensors = INT64_MAX;
            else
                *ntensors += tt;
            count_add(nelems, te);
            break;
        }
        }
        if (s->oom)
            return;
    }
}

/* Counts tensor declarations (not iterations) in a body. */
static bool has_tensors(const mf_ast_item *items)
{
    for (const mf_ast_item *it = items; it; it = it->next)
        if (it->kind == MF_AST_ITEM_TENSOR || (it->kind == MF_AST_ITEM_FOR && has_tensors(it->body)))
            return true;
    return false;
}

/* ---- units: expansion ---- */

/* Expands items for the current bindings, appending to s->tensors; consumes
 * s->tinfo from *cursor in the order check_items() recorded it. */
static void expand_items(mf_sema *s, const char *unit_name, const mf_ast_item *items, size_t *cursor)
{
    const mf_sema_tinfo *tinfo = s->tinfo.data;
    for (const mf_ast_item *it = items; it && !s->oom; it = it->next) {
        if (it->kind == MF_AST_ITEM_TENSOR) {
            const mf_sema_tinfo *ti = &tinfo[(*cursor)++];
            const mf_ast_tensor *t = &it->tensor;
            const char *tname = substitute(s, t->name.text);
            char *full = tname ? mf_arena_printf(s->a, "%s.%s", unit_name, tname) : NULL;
            mf_spec_tensor *st = mf_vec_push(&s->tensors);
            if (!full || !st) {
                sema_oom(s);
                return;
            }
            st->name = full;
            st->span = t->name.span;
            st->ndims = t->ndims;
            int k = 0;
            for (const mf_ast_dim *dm = t->dims; dm && k < MF_MAX_DIMS; dm = dm->next)
                st->dims[k++] = dm->size.value;
            st->numel = ti->numel;
            st->layout = ti->layout;
            st->unit_default = ti->unit_default;
            int prev = (int)mf_hash_get_str(&s->tensor_names, full);
            if (prev >= 0) {
                char where[200];
                bindings_text(s, where, sizeof where);
                mf_diag_error(s->d, t->name.span, "tensor '%s' declared twice%s; full tensor names must be unique",
                              full, where);
                mf_diag_note(s->d, ((const mf_span *)s->tspans.data)[prev], "'%s' first declared here", full);
                continue;
            }
            mf_span *sp = mf_vec_push(&s->tspans);
            if (!sp || mf_hash_put_str(&s->tensor_names, full, (int)s->tspans.len - 1) < 0) {
                sema_oom(s);
                return;
            }
            *sp = t->name.span;
            expand_global(s, unit_name, t, ti, st);
        } else if (it->kind == MF_AST_ITEM_FOR) {
            size_t start = *cursor, end = start;
            s->scope[s->nscope++] = (mf_sema_binding){it->loop.var.text, 0, &it->loop};
            for (int64_t v = it->loop.lo.value; v < it->loop.hi.value && !s->oom; v++) {
                s->scope[s->nscope - 1].value = v;
                size_t c = start;
                expand_items(s, unit_name, it->body, &c);
                end = c;
            }
            s->nscope--;
            *cursor = end;
        }
    }
}

static void expand_unit(mf_sema *s, const mf_sema_unit_t *ut)
{
    const mf_ast_unit *u = ut->u;
    const char *name = substitute(s, u->name.text);
    if (!name) {
        sema_oom(s);
        return;
    }
    int prev = (int)mf_hash_get_str(&s->unit_names, name);
    if (prev >= 0) {
        char where[200];
        bindings_text(s, where, sizeof where);
        mf_diag_error(s->d, u->name.span, "unit '%s' declared twice%s; unit names must be unique", name, where);
        mf_diag_note(s->d, ((const mf_spec_unit *)s->units.data)[prev].span, "'%s' first declared here", name);
        return;
    }
    mf_vec_init(&s->tensors, sizeof(mf_spec_tensor));
    size_t cursor = 0;
    expand_items(s, name, u->body, &cursor);
    mf_spec_unit *su = s->oom ? NULL : mf_vec_push(&s->units);
    if (!su) {
        mf_vec_free(&s->tensors);
        sema_oom(s);
        return;
    }
    su->name = name;
    su->span = u->span;
    su->reshard_after_forward = ut->reshard;
    su->layout_auto = ut->layout_auto;
    su->layout_span = ut->u->layout.span;
    su->ntensors = (int)s->tensors.len;
    su->tensors = mf_vec_to_arena(&s->tensors, s->a);
    su->layout = ut->layout >= 0 ? ut->layout : (su->ntensors ? su->tensors[0].layout : -1);
    if (!su->tensors || mf_hash_put_str(&s->unit_names, name, (int)s->units.len - 1) < 0)
        sema_oom(s);
}

/* `layout auto` (docs/plan.md §1): the unit's layout is
 * left to `mfsdpc plan`; until then its tensors hold the built-in zero3, so
 * every later check still has a legal layout to work on. */
static int auto_layout(mf_sema *s, const mf_ast_name *ref)
{
    mf_ast_name placeholder = {mf_builtin_name(mf_builtin_layouts_find("zero3")), ref->span};
    if (s->have_mesh && !mf_builtin_layouts_fits(mf_builtin_layouts_find("zero3"), s->spec->mesh.naxes)) {
        mf_diag_error(s->d, ref->span,
                      "'layout auto' chooses among the built-in layouts, which are defined for meshes of 1 to 3 "
                      "axes; the mesh has %d, so name a declared layout instead",
                      s->spec->mesh.naxes);
        return -1;
    }
    int idx = (int)mf_hash_get_str(&s->layout_names, placeholder.text);
    return idx >= 0 ? idx : lookup_layout(s, &placeholder, "'layout auto'");
}

/* The unit's options (reshard_after_forward, at most once) into ut. */
static void unit_options(mf_sema *s, const mf_ast_unit *u, mf_sema_unit_t *ut)
{
    const mf_ast_item *reshard = NULL;
    for (const mf_ast_item *it = u->body; it; it = it->next) {
        if (it->kind != MF_AST_ITEM_OPTION)
            continue;
        if (reshard) {
            mf_diag_error(s->d, it->key.span, "'%s' set twice in unit \"%s\"; give it once", it->key.text,
                          u->name.text);
            mf_diag_note(s->d, reshard->key.span, "first set here");
            continue;
        }
        reshard = it;
        if (strcmp(it->value.text, "true") == 0) {
            ut->reshard = true;
        } else if (strcmp(it->value.text, "false") == 0) {
            ut->reshard = false;
        } else {
            static const char *const bools[] = {"true", "false"};
            unknown_word(s, it->value.span, "value", it->value.text, " for 'reshard_after_forward'", bools, 2);
        }
    }
}

/* The unit's `iters` copies against the limits, before anything is
 * expanded: true (and the running totals counted) when they fit, else false
 * with one error. */
static bool unit_within_limits(mf_sema *s, const mf_ast_unit *u, const mf_sema_unit_t *ut, int64_t iters)
{
    mf_span at = u->loop ? u->loop->span : u->span;
    int64_t nt, all;
    if (iters > MF_SEMA_MAX_UNITS - s->nunits) {
        mf_diag_error(s->d, at, "too many units (limit is %d): unit \"%s\" expands to %s%" PRId64 " units",
                      MF_SEMA_MAX_UNITS, u->name.text, iters == INT64_MAX ? "more than " : "", iters);
        return false;
    }
    if (!mul_ok(ut->tensors, iters, &nt))
        nt = INT64_MAX;
    if (nt > MF_SEMA_MAX_TENSORS - s->ntensors) {
        mf_diag_error(s->d, at, "too many tensors (limit is %d): unit \"%s\" adds %s%" PRId64, MF_SEMA_MAX_TENSORS,
                      u->name.text, nt == INT64_MAX ? "more than " : "", nt == INT64_MAX ? INT64_MAX : nt);
        return false;
    }
    if (ut->elems < 0) {
        mf_diag_error(s->d, u->name.span,
                      "unit \"%s\" has too many elements: its tensors' sizes add up past %d bits", u->name.text,
                      MF_LIMIT_MAGNITUDE_BITS);
        return false;
    }
    if (ut->elems > MF_SEMA_MAX_ELEMS) {
        mf_diag_error(s->d, u->name.span, "unit \"%s\" has %" PRId64 " elements in all (limit is %" PRId64 ")",
                      u->name.text, ut->elems, MF_SEMA_MAX_ELEMS);
        return false;
    }
    if (!mul_ok(ut->elems, iters, &all) || !add_ok(s->nelems, all, &all) || all > MF_SEMA_MAX_ELEMS) {
        mf_diag_error(s->d, at, "too many elements in the spec (limit is %" PRId64 "): unit \"%s\" brings the total past it",
                      MF_SEMA_MAX_ELEMS, u->name.text);
        return false;
    }
    s->nunits += iters;
    s->ntensors += nt;
    s->nelems = all;
    return true;
}

static void check_unit(mf_sema *s, const mf_ast_unit *u)
{
    int before = mf_diag_errors(s->d);
    mf_sema_unit_t ut = {.u = u, .layout = -1, .reshard = true};
    s->nscope = 0;
    int64_t iters = 1;
    bool loop_ok = true;
    if (u->loop) {
        loop_ok = check_loop(s, u->loop, &iters);
        s->scope[s->nscope++] = (mf_sema_binding){u->loop->var.text, u->loop->lo.value, u->loop};
    }
    uint32_t used;
    if (check_template(s, &u->name, "unit", &used) && u->loop && !(used & 1u))
        mf_diag_error(s->d, u->name.span,
                      "unit name \"%s\" does not use the loop variable '%s', so every iteration would have the "
                      "same name; write {%s} in the name, e.g. \"%s.{%s}\"",
                      u->name.text, u->loop->var.text, u->loop->var.text, u->name.text, u->loop->var.text);
    if (u->layout.text && strcmp(u->layout.text, MF_LAYOUT_AUTO) == 0 &&
        mf_hash_get_str(&s->layout_names, MF_LAYOUT_AUTO) < 0) {
        ut.layout = auto_layout(s, &u->layout);
        ut.layout_auto = true;
    } else if (u->layout.text) {
        char user[300];
        snprintf(user, sizeof user, "unit \"%s\"", u->name.text);
        ut.layout = lookup_layout(s, &u->layout, user);
    }
    unit_options(s, u, &ut);
    if (!has_tensors(u->body)) {
        mf_diag_error(s->d, u->name.span, "unit \"%s\" has no tensors; a unit needs at least one 'tensor'",
                      u->name.text);
        return;
    }
    s->tinfo.len = 0;
    check_items(s, &ut, u->body, 0, &ut.tensors, &ut.elems);
    if (s->oom || mf_diag_errors(s->d) != before || !loop_ok || s->limit_hit)
        return;
    if (!unit_within_limits(s, u, &ut, iters)) {
        s->limit_hit = true;
        return;
    }
    int64_t lo = u->loop ? u->loop->lo.value : 0;
    for (int64_t i = 0; i < iters && !s->oom; i++) {
        if (u->loop)
            s->scope[0].value = lo + i;
        expand_unit(s, &ut);
    }
}

/* ---- the pass ---- */

mf_spec *mf_sema_run(const mf_ast *ast, mf_diag *d, mf_arena *a)
{
    mf_sema s;
    memset(&s, 0, sizeof s);
    s.d = d;
    s.a = a;
    s.ast = ast;
    s.spec = mf_arena_alloc(a, sizeof *s.spec);
    if (!s.spec) {
        sema_oom(&s);
        return NULL;
    }
    mf_vec_init(&s.layouts, sizeof(mf_spec_layout));
    mf_vec_init(&s.linfo, sizeof(mf_sema_layout_info));
    mf_vec_init(&s.units, sizeof(mf_spec_unit));
    mf_vec_init(&s.tinfo, sizeof(mf_sema_tinfo));
    mf_vec_init(&s.tspans, sizeof(mf_span));
    mf_vec_init(&s.gnames, sizeof(mf_sema_gname));

    mf_spec *sp = s.spec;
    sp->path = ast->src ? ast->src->path : NULL;
    sp->microbatches = 1;
    sp->reduce = MF_REDUCE_AVG;
    sp->align = 256;
    sp->prefetch = 1;
    sp->bucket_size = 0;
    sp->balance = MF_BALANCE_BYTES;

    check_mesh(&s);
    check_settings(&s);
    check_named_layouts(&s);
    for (const mf_ast_unit *u = ast->units; u && !s.oom; u = u->next)
        check_unit(&s, u);
    if (!ast->units && !s.oom) {
        mf_span none = {0, 0, 0, 0};
        mf_diag_error(d, none, "the spec declares no units; add at least one 'unit \"name\" layout NAME { ... }'");
    }

    mf_spec *result = NULL;
    if (!s.oom && mf_diag_errors(d) == 0) {
        sp->nlayouts = (int)s.layouts.len;
        sp->layouts = mf_vec_to_arena(&s.layouts, a);
        sp->nunits = (int)s.units.len;
        sp->units = mf_vec_to_arena(&s.units, a);
        if (!sp->layouts || !sp->units)
            sema_oom(&s);
        else
            result = sp;
    }
    mf_vec_free(&s.layouts);
    mf_vec_free(&s.linfo);
    mf_vec_free(&s.units);
    mf_vec_free(&s.tinfo);
    mf_vec_free(&s.tensors);
    mf_vec_free(&s.tspans);
    mf_hash_free(&s.layout_names);
    mf_hash_free(&s.inline_sigs);
    mf_hash_free(&s.unit_names);
    mf_hash_free(&s.tensor_names);
    mf_hash_free(&s.global_names);
    mf_vec_free(&s.gnames);
    return result;
}
