/*
 * mf_diff: the semantic diff of two schedules (mf_diff.h).
 *
 * Output, in this order, each part only when something changed:
 *   the header (mesh, microbatches, reduce, align, prefetch);
 *   per unit (B's order, then units only A has): buckets added, removed or
 *   changed (name, layout, placements, dtypes, length), then data ops
 *   added (+), removed (-) and changed (~: predicate, stream, count, dtype,
 *   hook), each with its bytes per rank per step when it is a collective;
 *   totals per step before -> after: collectives by kind and axis, bytes per
 *   rank by axis, persistent and model (prefetch-window) bytes per rank by role, the arena and its bounds, ops and events.
 * Equivalence is decided on the canonical YAML (minus source and its hash),
 * so any difference, even one only in event numbering, exits 1.
 */
#include "mf_diff.h"

#include <stdlib.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_passes.h"
#include "mf_plan_owners.h"

typedef struct mf_diff_ctx {
    const mf_schedule *a, *b;
    FILE *out;
    int *bmatch;            /* per bucket of B: the matching bucket of A, or -1 */
    int *amatched;          /* per bucket of A: matched by some bucket of B */
    bool printed_unit;
    const char *unit;       /* the unit being printed */
} mf_diff_ctx;

static const char *mf_diff_size(int64_t v, char *buf, size_t size)
{
    int64_t a = v < 0 ? -v : v;
    const char *sign = v < 0 ? "-" : "";
    if (a < 1024)
        snprintf(buf, size, "%s%lld B", sign, (long long)a);
    else if (a < 1024 * 1024)
        snprintf(buf, size, "%s%.1f KiB", sign, (double)a / 1024.0);
    else if (a < 1024LL * 1024 * 1024)
        snprintf(buf, size, "%s%.1f MiB", sign, (double)a / (1024.0 * 1024.0));
    else
        snprintf(buf, size, "%s%.2f GiB", sign, (double)a / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

static const char *mf_diff_first_tensor(const mf_bucket *bk)
{
    return bk->ntensors > 0 ? bk->tensors[0].name : bk->name;
}

static const char *mf_diff_axis(const mf_schedule *s, int j)
{
    return j >= 0 && j < s->mesh.naxes ? s->mesh.axes[j].name : "";
}

static int mf_diff_unit_index(const mf_schedule *s, const char *name)
{
    for (int u = 0; u < s->nunits; u++)
        if (strcmp(s->units[u].name, name) == 0)
            return u;
    return -1;
}

/* Some tensor name of bucket x is one of bucket y's. */
static bool mf_diff_share_tensor(const mf_bucket *x, const mf_bucket *y)
{
    for (int i = 0; i < x->ntensors; i++)
        for (int j = 0; j < y->ntensors; j++)
            if (strcmp(x->tensors[i].name, y->tensors[j].name) == 0)
                return true;
    return false;
}

/* Buckets of one unit match by their first tensor, then (a whole bucket's
 * tensors are in offset order, so a Flat <-> Whole change reorders them) by
 * any tensor they share. */
static void mf_diff_match_shared(mf_diff_ctx *c)
{
    for (int i = 0; i < c->b->nbuckets; i++) {
        const mf_bucket *bb = &c->b->buckets[i];
        for (int j = 0; j < c->a->nbuckets && c->bmatch[i] < 0; j++) {
            const mf_bucket *ab = &c->a->buckets[j];
            if (!c->amatched[j] && strcmp(c->a->units[ab->unit].name, c->b->units[bb->unit].name) == 0 &&
                mf_diff_share_tensor(ab, bb)) {
                c->bmatch[i] = j;
                c->amatched[j] = 1;
            }
        }
    }
}

static void mf_diff_match_buckets(mf_diff_ctx *c)
{
    for (int i = 0; i < c->b->nbuckets; i++) {
        const mf_bucket *bb = &c->b->buckets[i];
        c->bmatch[i] = -1;
        for (int j = 0; j < c->a->nbuckets && c->bmatch[i] < 0; j++) {
            const mf_bucket *ab = &c->a->buckets[j];
            if (!c->amatched[j] && strcmp(c->a->units[ab->unit].name, c->b->units[bb->unit].name) == 0 &&
                strcmp(mf_diff_first_tensor(ab), mf_diff_first_tensor(bb)) == 0) {
                c->bmatch[i] = j;
                c->amatched[j] = 1;
            }
        }
    }
    mf_diff_match_shared(c);
}

static void mf_diff_unit_header(mf_diff_ctx *c)
{
    if (!c->printed_unit) {
        fprintf(c->out, "unit %s:\n", c->unit);
        c->printed_unit = true;
    }
}

/* Bytes per rank per step of one op (0 for local and event ops). */
static int64_t mf_diff_op_bytes(const mf_schedule *s, const mf_op *op)
{
    if (!mf_opkind_is_collective(op->kind) || op->axis < 0)
        return 0;
    return mf_when_runs_per_step(op->when, op->phase, s->microbatches) *
           mf_layout_op_bytes(s, op);
}

/* "forward_pre of layers.3", or "step_end" (a short step's end). */
static const char *mf_diff_hook(const mf_schedule *s, const mf_op *op, char *buf, size_t size)
{
    if (op->unit < 0 || op->unit >= s->nunits)
        snprintf(buf, size, "%s", mf_phase_name(op->phase));
    else
        snprintf(buf, size, "%s of %s", mf_phase_name(op->phase), s->units[op->unit].name);
    return buf;
}

static void mf_diff_print_op(mf_diff_ctx *c, char mark, const mf_schedule *s, const mf_op *op)
{
    char hk[160];
    char hb[32];
    mf_diff_unit_header(c);
    fprintf(c->out, "  %c %s", mark, mf_opkind_name(op->kind));
    if (op->axis >= 0)
        fprintf(c->out, " on %s", mf_diff_axis(s, op->axis));
    fprintf(c->out, " (T%d, %s, %s, stream %s, %s x %lld", op->transition, mf_when_name(op->when),
            mf_diff_hook(s, op, hk, sizeof hk), mf_stream_name(op->stream), mf_dtype_name(op->dtype),
            (long long)op->count);
    int64_t bytes = mf_diff_op_bytes(s, op);
    if (bytes)
        fprintf(c->out, ", %s per rank per step", mf_diff_size(bytes, hb, sizeof hb));
    fprintf(c->out, ") [%s]\n", s->buckets[op->bucket].name);
}

static void mf_diff_change_op(mf_diff_ctx *c, const mf_op *x, const mf_op *y)
{
    const mf_schedule *a = c->a, *b = c->b;
    char line[512];
    size_t at = 0;
#define MF_DIFF_ADD(...)                                                                \
    do {                                                                                \
        int n_ = snprintf(line + at, sizeof line - at, "%s", at ? ", " : "");          \
        at += n_ > 0 && (size_t)n_ < sizeof line - at ? (size_t)n_ : 0;                \
        n_ = snprintf(line + at, sizeof line - at, __VA_ARGS__);                       \
        at += n_ > 0 && (size_t)n_ < sizeof line - at ? (size_t)n_ : 0;                \
    } while (0)
    if (x->when != y->when)
        MF_DIFF_ADD("predicate %s -> %s", mf_when_name(x->when), mf_when_name(y->when));
    if (x->stream != y->stream)
        MF_DIFF_ADD("stream %s -> %s", mf_stream_name(x->stream), mf_stream_name(y->stream));
    if (x->count != y->count)
        MF_DIFF_ADD("count %lld -> %lld", (long long)x->count, (long long)y->count);
    if (x->dtype != y->dtype)
        MF_DIFF_ADD("dtype %s -> %s", mf_dtype_name(x->dtype), mf_dtype_name(y->dtype));
    char hx[160], hy[160];
    if (strcmp(mf_diff_hook(a, x, hx, sizeof hx), mf_diff_hook(b, y, hy, sizeof hy)) != 0)
        MF_DIFF_ADD("issued at %s -> %s", hx, hy);
    int64_t bx = mf_diff_op_bytes(a, x), by = mf_diff_op_bytes(b, y);
    if (bx != by) {
        char h1[32], h2[32];
        MF_DIFF_ADD("%s -> %s per rank per step", mf_diff_size(bx, h1, sizeof h1), mf_diff_size(by, h2, sizeof h2));
    }
#undef MF_DIFF_ADD
    if (!at)
        return;
    mf_diff_unit_header(c);
    fprintf(c->out, "  ~ %s", mf_opkind_name(y->kind));
    if (y->axis >= 0)
        fprintf(c->out, " on %s", mf_diff_axis(b, y->axis));
    fprintf(c->out, " (T%d at %s) [%s]: %s\n", y->transition, mf_phase_name(y->phase), b->buckets[y->bucket].name,
            line);
}

static bool mf_diff_same_key(const mf_schedule *a, const mf_op *x, const mf_schedule *b, const mf_op *y)
{
    /* an op of the step matches one of the step, a program's one of the same program */
    return x->transition == y->transition && x->kind == y->kind && mf_op_in_step(x) == mf_op_in_step(y) &&
           mf_phase_is_eval(x->phase) == mf_phase_is_eval(y->phase) &&
           strcmp(mf_diff_axis(a, x->axis), mf_diff_axis(b, y->axis)) == 0;
}

/* Ops of bucket ba of A against bucket bb of B (either may be -1). */
static int mf_diff_ops(mf_diff_ctx *c, int ba, int bb)
{
    const mf_schedule *a = c->a, *b = c->b;
    char *used = calloc((size_t)(a->nops ? a->nops : 1), 1);
    if (!used)
        return -1;
    for (int i = 0; bb >= 0 && i < b->nops; i++) {
        const mf_op *y = &b->ops[i];
        if (!mf_op_is_data(y) || y->bucket != bb)
            continue;
        int m = -1;
        for (int j = 0; ba >= 0 && j < a->nops && m < 0; j++) {
            const mf_op *x = &a->ops[j];
            if (!used[j] && mf_op_is_data(x) && x->bucket == ba && mf_diff_same_key(a, x, b, y))
                m = j;
        }
        if (m < 0) {
            mf_diff_print_op(c, '+', b, y);
        } else {
            used[m] = 1;
            mf_diff_change_op(c, &a->ops[m], y);
        }
    }
    for (int j = 0; ba >= 0 && j < a->nops; j++)
        if (!used[j] && mf_op_is_data(&a->ops[j]) && a->ops[j].bucket == ba)
            mf_diff_print_op(c, '-', a, &a->ops[j]);
    free(used);
    return 0;
}

/* "shard 3", or "none" (-1: the role is not whole, or the tensor is absent). */
static const char *mf_diff_owner(int64_t q, char *buf, size_t size)
{
    if (q < 0)
        snprintf(buf, size, "none");
    else
        snprintf(buf, size, "shard %lld", (long long)q);
    return buf;
}

/* Owner changes of B's tensors of bucket y against bucket x of A, for each
 * role that is whole in either (docs/semantics.md §9.1). */
static void mf_diff_owners(mf_diff_ctx *c, const mf_bucket *x, const mf_bucket *y)
{
    static const int roles[] = {MF_ROLE_MAIN_WEIGHT, MF_ROLE_GRAD};
    for (int i = 0; i < y->ntensors; i++) {
        const mf_tensor *ty = &y->tensors[i], *tx = NULL;
        for (int j = 0; j < x->ntensors && !tx; j++)
            if (strcmp(x->tensors[j].name, ty->name) == 0)
                tx = &x->tensors[j];
        for (size_t k = 0; tx && k < sizeof roles / sizeof roles[0]; k++) {
            int r = roles[k];
            if (!x->whole[r] && !y->whole[r])
                continue;
            int64_t qx = mf_plan_owners_of(&c->a->mesh, x, r, tx), qy = mf_plan_owners_of(&c->b->mesh, y, r, ty);
            char h1[32], h2[32];
            if (x->whole[r] == y->whole[r] && qx == qy)
                continue;
            mf_diff_unit_header(c);
            if (x->whole[r] && y->whole[r])
                fprintf(c->out, "  tensor %s: %s owner %s -> %s\n", ty->name, mf_role_name((mf_role)r),
                        mf_diff_owner(qx, h1, sizeof h1), mf_diff_owner(qy, h2, sizeof h2));
            else if (y->whole[r])
                fprintf(c->out, "  tensor %s: %s became whole (owner %s)\n", ty->name, mf_role_name((mf_role)r),
                        mf_diff_owner(qy, h2, sizeof h2));
            else
                fprintf(c->out, "  tensor %s: %s stopped being whole (owner was %s)\n", ty->name,
                        mf_role_name((mf_role)r), mf_diff_owner(qx, h1, sizeof h1));
        }
    }
}

/* "none", "[N0, ... (k names)]" or "N split D": a tensor's global names. */
static const char *mf_diff_global(const mf_tensor *t, char *buf, size_t size)
{
    if (!t->nglobal)
        snprintf(buf, size, "none");
    else if (t->global_split)
        snprintf(buf, size, "%s split %d", t->global[0], t->global_dim);
    else
        snprintf(buf, size, "[%s%s (%d names)]", t->global[0], t->nglobal > 1 ? ", ..." : "", t->nglobal);
    return buf;
}

static bool mf_diff_same_global(const mf_tensor *x, const mf_tensor *y)
{
    if (x->nglobal != y->nglobal || x->global_split != y->global_split || x->global_dim != y->global_dim)
        return false;
    for (int g = 0; g < x->nglobal; g++)
        if (strcmp(x->global[g], y->global[g]) != 0)
            return false;
    return true;
}

/* Global names (docs/language.md §3.4) of B's tensors of bucket y that differ
 * from those of the same tensor in bucket x of A: a checkpoint's tensors. */
static void mf_diff_globals(mf_diff_ctx *c, const mf_bucket *x, const mf_bucket *y)
{
    for (int i = 0; i < y->ntensors; i++) {
        const mf_tensor *ty = &y->tensors[i], *tx = NULL;
        for (int j = 0; j < x->ntensors && !tx; j++)
            if (strcmp(x->tensors[j].name, ty->name) == 0)
                tx = &x->tensors[j];
        if (!tx || mf_diff_same_global(tx, ty))
            continue;
        char g1[320], g2[320];
        mf_diff_unit_header(c);
        fprintf(c->out, "  tensor %s: global names %s -> %s\n", ty->name, mf_diff_global(tx, g1, sizeof g1),
                mf_diff_global(ty, g2, sizeof g2));
    }
}


/* A ragged bucket's shard bounds (docs/semantics.md §4.6) that changed: listed
 * when there are at most MF_DIFF_BOUNDS_SHOWN, else counted. */
#define MF_DIFF_BOUNDS_SHOWN 9
static void mf_diff_bound_list(FILE *out, const int64_t *v, int64_t n)
{
    fputc('[', out);
    for (int64_t i = 0; i < n; i++)
        fprintf(out, "%s%lld", i ? ", " : "", (long long)v[i]);
    fputc(']', out);
}

static void mf_diff_bounds(mf_diff_ctx *c, const mf_schedule *a, const mf_schedule *b, const mf_bucket *x,
                           const mf_bucket *y)
{
    int64_t nx = x->bounds ? mf_layout_bucket_nbounds(&a->mesh, x) : 0;
    int64_t ny = y->bounds ? mf_layout_bucket_nbounds(&b->mesh, y) : 0;
    int64_t differ = nx == ny ? 0 : (nx > ny ? nx : ny);
    for (int64_t q = 0; nx == ny && q < nx; q++)
        differ += x->bounds[q] != y->bounds[q];
    if (!differ)
        return;
    mf_diff_unit_header(c);
    if (nx <= MF_DIFF_BOUNDS_SHOWN && ny <= MF_DIFF_BOUNDS_SHOWN) {
        fprintf(c->out, "  bucket %s: shard bounds ", y->name);
        mf_diff_bound_list(c->out, x->bounds, nx);
        fputs(" -> ", c->out);
        mf_diff_bound_list(c->out, y->bounds, ny);
        fputc('\n', c->out);
    } else {
        fprintf(c->out, "  bucket %s: shard bounds: %lld -> %lld entries, %lld differ\n", y->name, (long long)nx,
                (long long)ny, (long long)differ);
    }
}

static void mf_diff_bucket_changes(mf_diff_ctx *c, int ba, int bb)
{
    const mf_schedule *a = c->a, *b = c->b;
    const mf_bucket *x = &a->buckets[ba], *y = &b->buckets[bb];
    char p1[64], p2[64];
    if (strcmp(x->name, y->name) != 0) {
        mf_diff_unit_header(c);
        fprintf(c->out, "  bucket %s -> %s\n", x->name, y->name);
    }
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        bool pl = a->mesh.naxes != b->mesh.naxes || !mf_placement_equal(&x->place[r], &y->place[r], a->mesh.naxes) ||
                  x->whole[r] != y->whole[r];
        if (pl || x->dtype[r] != y->dtype[r]) {
            mf_diff_unit_header(c);
            fprintf(c->out, "  bucket %s: %s %s %s -> %s %s\n", y->name, mf_role_name((mf_role)r),
                    mf_dtype_name(x->dtype[r]), mf_plan_owners_placement(x, r, a->mesh.naxes, p1, sizeof p1),
                    mf_dtype_name(y->dtype[r]), mf_plan_owners_placement(y, r, b->mesh.naxes, p2, sizeof p2));
        }
    }
    if (x->length != y->length || x->ntensors != y->ntensors) {
        mf_diff_unit_header(c);
        fprintf(c->out, "  bucket %s: %d tensors, length %lld -> %d tensors, length %lld\n", y->name, x->ntensors,
                (long long)x->length, y->ntensors, (long long)y->length);
    }
    mf_diff_bounds(c, a, b, x, y);
    if (a->mesh.naxes == b->mesh.naxes)
        mf_diff_owners(c, x, y);
    mf_diff_globals(c, x, y);
}

static int mf_diff_unit(mf_diff_ctx *c, const char *name)
{
    const mf_schedule *a = c->a, *b = c->b;
    int ua = mf_diff_unit_index(a, name), ub = mf_diff_unit_index(b, name);
    c->unit = name;
    c->printed_unit = false;
    if (ua < 0 || ub < 0) {
        fprintf(c->out, "unit %s: %s\n", name, ua < 0 ? "added" : "removed");
        c->printed_unit = true;
    } else if (a->units[ua].reshard_after_forward != b->units[ub].reshard_after_forward) {
        mf_diff_unit_header(c);
        fprintf(c->out, "  reshard_after_forward %s -> %s\n", a->units[ua].reshard_after_forward ? "true" : "false",
                b->units[ub].reshard_after_forward ? "true" : "false");
    }
    for (int i = 0; i < b->nbuckets; i++) {
        if (b->buckets[i].unit != ub)
            continue;
        if (c->bmatch[i] < 0) {
            mf_diff_unit_header(c);
            fprintf(c->out, "  + bucket %s (layout %s, %d tensors)\n", b->buckets[i].name, b->buckets[i].layout,
                    b->buckets[i].ntensors);
        } else {
            mf_diff_bucket_changes(c, c->bmatch[i], i);
        }
        if (mf_diff_ops(c, c->bmatch[i], i) != 0)
            return -1;
    }
    for (int j = 0; j < a->nbuckets; j++) {
        if (a->buckets[j].unit != ua || c->amatched[j])
            continue;
        mf_diff_unit_header(c);
        fprintf(c->out, "  - bucket %s (layout %s, %d tensors)\n", a->buckets[j].name, a->buckets[j].layout,
                a->buckets[j].ntensors);
        if (mf_diff_ops(c, j, -1) != 0)
            return -1;
    }
    return 0;
}

static int mf_diff_axis_of(const mf_schedule *s, const char *name)
{
    for (int j = 0; j < s->mesh.naxes; j++)
        if (strcmp(s->mesh.axes[j].name, name) == 0)
            return j;
    return -1;
}

static void mf_diff_total(mf_diff_ctx *c, bool *header, const char *what, int64_t x, int64_t y, bool bytes)
{
    if (x == y)
        return;
    if (!*header) {
        fprintf(c->out, "totals per step (before -> after):\n");
        *header = true;
    }
    if (bytes) {
        char h1[32], h2[32], h3[32];
        fprintf(c->out, "  %s: %lld -> %lld (%s -> %s, %s%s)\n", what, (long long)x, (long long)y,
                mf_diff_size(x, h1, sizeof h1), mf_diff_size(y, h2, sizeof h2), y > x ? "+" : "",
                mf_diff_size(y - x, h3, sizeof h3));
    } else {
        fprintf(c->out, "  %s: %lld -> %lld\n", what, (long long)x, (long long)y);
    }
}

static void mf_diff_totals(mf_diff_ctx *c)
{
    const mf_schedule *a = c->a, *b = c->b;
    const mf_summary *x = &a->summary, *y = &b->summary;
    bool header = false;
    char what[128];
    /* axes by name: B's, then those only A has */
    const char *axes[2 * MF_MAX_AXES];
    int naxes = 0;
    for (int j = 0; j < b->mesh.naxes; j++)
        axes[naxes++] = b->mesh.axes[j].name;
    for (int j = 0; j < a->mesh.naxes; j++)
        if (mf_diff_axis_of(b, a->mesh.axes[j].name) < 0)
            axes[naxes++] = a->mesh.axes[j].name;
    for (int k = 0; k < MF_OPKIND_COUNT; k++) {
        if (!mf_opkind_is_collective((mf_opkind)k))
            continue;
        for (int i = 0; i < naxes; i++) {
            int ja = mf_diff_axis_of(a, axes[i]), jb = mf_diff_axis_of(b, axes[i]);
            snprintf(what, sizeof what, "%s on %s", mf_opkind_name((mf_opkind)k), axes[i]);
            mf_diff_total(c, &header, what, ja >= 0 ? x->collectives[k][ja] : 0, jb >= 0 ? y->collectives[k][jb] : 0,
                          false);
        }
    }
    for (int i = 0; i < naxes; i++) {
        int ja = mf_diff_axis_of(a, axes[i]), jb = mf_diff_axis_of(b, axes[i]);
        snprintf(what, sizeof what, "bytes per rank on %s", axes[i]);
        mf_diff_total(c, &header, what, ja >= 0 ? x->bytes[ja] : 0, jb >= 0 ? y->bytes[jb] : 0, true);
    }
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        snprintf(what, sizeof what, "persistent bytes per rank, %s", mf_role_name((mf_role)r));
        mf_diff_total(c, &header, what, x->persistent_bytes[r], y->persistent_bytes[r], true);
    }
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        snprintf(what, sizeof what, "model bytes per rank (prefetch window), %s", mf_role_name((mf_role)r));
        mf_diff_total(c, &header, what, x->model_bytes[r], y->model_bytes[r], true);
    }
    /* the buffer assignment (docs/semantics.md §10) */
    mf_diff_total(c, &header, "arena bytes per rank (transient)", a->mem_transient, b->mem_transient, true);
    mf_diff_total(c, &header, "persistent region bytes per rank", a->mem_persistent, b->mem_persistent, true);
    mf_diff_total(c, &header, "allocated bytes per rank", x->allocated_bytes, y->allocated_bytes, true);
    mf_diff_total(c, &header, "live-bytes lower bound per rank", x->live_bytes, y->live_bytes, true);
    mf_diff_total(c, &header, "interference lower bound per rank", x->interference_bytes,
                  y->interference_bytes, true);
    mf_diff_total(c, &header, "ops", a->nops, b->nops, false);
    mf_diff_total(c, &header, "events", a->nevents, b->nevents, false);
}

static void mf_diff_header(mf_diff_ctx *c)
{
    const mf_schedule *a = c->a, *b = c->b;
    bool mesh = a->mesh.naxes != b->mesh.naxes;
    for (int j = 0; j < a->mesh.naxes && !mesh; j++)
        mesh = strcmp(a->mesh.axes[j].name, b->mesh.axes[j].name) != 0 || a->mesh.axes[j].size != b->mesh.axes[j].size;
    if (mesh) {
        fprintf(c->out, "mesh:");
        for (int j = 0; j < a->mesh.naxes; j++)
            fprintf(c->out, "%s %s=%lld", j ? "," : "", a->mesh.axes[j].name, (long long)a->mesh.axes[j].size);
        fprintf(c->out, " ->");
        for (int j = 0; j < b->mesh.naxes; j++)
            fprintf(c->out, "%s %s=%lld", j ? "," : "", b->mesh.axes[j].name, (long long)b->mesh.axes[j].size);
        fprintf(c->out, "\n");
    }
    if (a->microbatches != b->microbatches)
        fprintf(c->out, "microbatches: %lld -> %lld\n", (long long)a->microbatches, (long long)b->microbatches);
    if (a->reduce != b->reduce)
        fprintf(c->out, "reduce: %s -> %s\n", mf_reduce_name(a->reduce), mf_reduce_name(b->reduce));
    if (a->align != b->align)
        fprintf(c->out, "align: %lld -> %lld\n", (long long)a->align, (long long)b->align);
    if (a->prefetch != b->prefetch)
        fprintf(c->out, "prefetch: %d -> %d\n", a->prefetch, b->prefetch);
}

/* Canonical YAML without source and hash; NULL on OOM. */
static char *mf_diff_canonical(const mf_schedule *s, size_t *len)
{
    mf_schedule copy = *s;
    copy.source = "";
    memset(copy.source_sha256, '0', 64);
    copy.source_sha256[64] = '\0';
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    int rc = mf_emit_yaml(&copy, f);
    if (fclose(f) != 0 || rc != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

int mf_diff_schedules(const mf_schedule *a, const char *name_a, const mf_schedule *b, const char *name_b, FILE *out)
{
    size_t la = 0, lb = 0;
    char *ya = mf_diff_canonical(a, &la), *yb = mf_diff_canonical(b, &lb);
    if (!ya || !yb) {
        free(ya);
        free(yb);
        return -1;
    }
    bool same = la == lb && memcmp(ya, yb, la) == 0;
    free(ya);
    free(yb);
    if (same)
        return 0;

    /* The report goes to memory first, to tell whether anything was said. */
    char *body = NULL;
    size_t blen = 0;
    mf_diff_ctx c = {.a = a, .b = b};
    c.out = open_memstream(&body, &blen);
    c.bmatch = calloc((size_t)(b->nbuckets ? b->nbuckets : 1), sizeof *c.bmatch);
    c.amatched = calloc((size_t)(a->nbuckets ? a->nbuckets : 1), sizeof *c.amatched);
    int rc = 1;
    if (!c.out || !c.bmatch || !c.amatched) {
        rc = -1;
        goto done;
    }
    mf_diff_header(&c);
    mf_diff_match_buckets(&c);
    for (int u = 0; u < b->nunits && rc == 1; u++)
        if (mf_diff_unit(&c, b->units[u].name) != 0)
            rc = -1;
    for (int u = 0; u < a->nunits && rc == 1; u++)
        if (mf_diff_unit_index(b, a->units[u].name) < 0 && mf_diff_unit(&c, a->units[u].name) != 0)
            rc = -1;
    if (rc == 1)
        mf_diff_totals(&c);
done:
    if (c.out && fclose(c.out) != 0)
        rc = -1;
    if (rc == 1) {
        fprintf(out, "--- %s\n+++ %s\n", name_a, name_b);
        if (blen)
            fwrite(body, 1, blen, out);
        else
            fprintf(out, "the ops are the same but differ in order or event numbering\n");
    }
    free(body);
    free(c.bmatch);
    free(c.amatched);
    return rc;
}
