/*
 * mf_transition: plan->sched buckets -> plan->trans, the transitions T1..T4 of
 * every bucket (docs/semantics.md §4) as sequences of single-axis steps.
 *
 *   T1 first  main_weight@O -> weight@W        cast, then slices / all-gathers
 *   T2 every  weight@W -> Rep                  all-gathers, outermost first
 *   T3 every  grad_local@[P..P] -> G           reductions, then accumulate at G
 *   T4 last   grad@G -> O                      reductions, slices, all-gathers
 *
 * Single-axis moves and where they are legal (docs/semantics.md §2, s = the first axis
 * of the current Flat suffix, k = the number of axes), the need / becomes /
 * at columns of the op table (MF_OPKIND_LIST, core/mf_schedule.h), applied by
 * mf_struct_move (core/mf_struct.c), the structural checker's own:
 *   all_gather     F->R on axis s                (gathers run outermost-first)
 *   reduce_scatter P->F on axis s-1              (k-1 when nothing is Flat yet)
 *   all_reduce     P->R on any axis
 *   slice          R->F on axis s-1              (local, no communication)
 * A composition is a sequence of moves from the source to the target
 * placement. The pass enumerates every composition that only makes progress
 * (an all-reduce or all-gather only on an axis whose target is Replicate, a
 * slice only where it is Flat, a reduce-scatter only where it is Flat or
 * Replicate; undoing a move is never cheaper), keeps those whose every
 * intermediate placement has equal aligned shards for the bucket's length,
 * and picks the cheapest under the plan's alpha-beta cost model
 * (mf_cost.h). Ties go to less traffic, then fewer steps, then reductions on
 * inner axes and gathers on outer axes first. When more than one composition
 * was legal, `why` names the chosen one and one alternative with both modeled
 * times: the cheapest alternative that moves a different number of bytes
 * (the bytes-versus-launches trade-off), else the cheapest that differs in
 * launches, else a reordering.
 *
 * T1 casts where the narrower dtype moves: before its gathers when weight's
 * dtype is no wider than main_weight's (the usual fp32 -> bf16), after them
 * otherwise. The cast is emitted even when the dtypes agree: it is the copy
 * from main_weight into weight.
 *
 * Per-axis legality is checked again here (the semantic pass rejects illegal
 * specs first); a violation is a located error naming the unit, role, axis
 * and a fix, and the bucket gets no transitions.
 *
 * A bucket's transitions depend only on its dtypes, placements and padded
 * length, the alignment, the mesh and the cost model. Plans that share a
 * cache (mf_plan.tcache: the plan search's candidates, one mesh and cost
 * model) take a bucket's transitions from it when a bucket with the same
 * key was built before, legality included, and add the ones they build.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_hash.h"
#include "mf_layout.h"
#include "mf_passes.h"
#include "mf_plan_stats.h"
#include "mf_struct.h"

enum { MF_MAX_MOVES = 2 * MF_MAX_AXES };

typedef struct move {
    mf_opkind kind;
    int axis;
} move;

typedef struct path {
    int n;
    move m[MF_MAX_MOVES];
} path;

/* Candidate compositions for one (transition, source, target), cached per pass. */
typedef struct cand_set {
    int t;
    mf_placement from, to;
    mf_vec paths;           /* path */
} cand_set;

typedef struct trans_state {
    mf_plan *p;
    mf_diag *d;
    int k;
    mf_vec sets;            /* cand_set */
    mf_vec reported;        /* int: spec layouts already diagnosed */
} trans_state;

/* A composition evaluated for one bucket. */
typedef struct eval {
    bool valid;
    double cost;            /* seconds */
    int64_t bytes;          /* per rank, all steps */
    int launches;
} eval;

/* ---- enumeration ---- */

/* Does a move of kind k make progress towards target on its axis (the
 * pruning of docs/semantics.md §4.3): it leaves the axis at the target, or a
 * reduction leaves it Flat on the way to Replicate (a reduce-scatter, an
 * all-gather later)? Undoing a move is never cheaper. */
static bool makes_progress(mf_opkind k, mf_place target)
{
    const mf_opkind_info *in = mf_opkind_info_of(k);
    return (int)target == in->becomes ||
           (in->need == MF_PLACE_PARTIAL && in->becomes == MF_PLACE_FLAT && target == MF_PLACE_REPLICATE);
}

/* May transition t make move mv at placement st (k axes) on its way to
 * `to`? The move itself is the op table's (mf_struct_move). */
static bool move_ok(int t, const mf_placement *st, const mf_placement *to, int k, move mv)
{
    mf_placement next;
    return mf_opkind_on_axis(mv.kind) && mf_trans_rules_op_ok(t, mv.kind) && mf_struct_move(mv.kind, mv.axis, k, st, &next) &&
           makes_progress(mv.kind, (mf_place)to->p[mv.axis]);
}

/* The placement a legal move (move_ok) leaves. */
static mf_placement apply_move(const mf_placement *st, int k, move mv)
{
    mf_placement next;
    mf_struct_move(mv.kind, mv.axis, k, st, &next);
    return next;
}

/* The order the search tries the moves in (ties keep the first found). */
static const mf_opkind move_kinds[] = {MF_OP_REDUCE_SCATTER, MF_OP_ALL_REDUCE, MF_OP_ALL_GATHER, MF_OP_SLICE};

/* Depth-first enumeration of simple paths; false on OOM. */
static bool enumerate(int t, int k, const mf_placement *st, const mf_placement *to, path *cur,
                      mf_placement *seen, mf_vec *out)
{
    if (mf_placement_equal(st, to, k)) {
        path *np = mf_vec_push(out);
        if (!np)
            return false;
        *np = *cur;
        return true;
    }
    if (cur->n >= 2 * k)
        return true;
    for (int j = k - 1; j >= 0; j--) {
        for (size_t i = 0; i < sizeof move_kinds / sizeof move_kinds[0]; i++) {
            move mv = {move_kinds[i], j};
            if (!move_ok(t, st, to, k, mv))
                continue;
            mf_placement ns = apply_move(st, k, mv);
            bool again = false;
            for (int s = 0; s <= cur->n && !again; s++)
                again = mf_placement_equal(&seen[s], &ns, k);
            if (again)
                continue;
            cur->m[cur->n++] = mv;
            seen[cur->n] = ns;
            bool ok = enumerate(t, k, &ns, to, cur, seen, out);
            cur->n--;
            if (!ok)
                return false;
        }
    }
    return true;
}

static const cand_set *candidates(trans_state *ts, int t, const mf_placement *from, const mf_placement *to)
{
    cand_set *sets = ts->sets.data;
    for (size_t i = 0; i < ts->sets.len; i++)
        if (sets[i].t == t && mf_placement_equal(&sets[i].from, from, ts->k) &&
            mf_placement_equal(&sets[i].to, to, ts->k))
            return &sets[i];
    cand_set *cs = mf_vec_push(&ts->sets);
    if (!cs)
        return NULL;
    cs->t = t;
    cs->from = *from;
    cs->to = *to;
    mf_vec_init(&cs->paths, sizeof(path));
    path cur = {0};
    mf_placement seen[MF_MAX_MOVES + 1];
    seen[0] = *from;
    if (!enumerate(t, ts->k, from, to, &cur, seen, &cs->paths)) {
        mf_vec_free(&cs->paths);
        ts->sets.len--;
        return NULL;
    }
    return cs;
}

/* ---- evaluation ---- */

typedef struct bucket_ctx {
    const mf_mesh *mesh;
    const mf_bucket *b;
    int64_t shard_quantum;  /* A: every shard a multiple of it */
} bucket_ctx;

/* Elements per rank at placement pl (its capacity, the longest shard, in a
 * ragged bucket); -1 when the shards are not equal and aligned, or (ragged)
 * pl has more shards than the finest whole placement. */
static int64_t local_count(const bucket_ctx *bc, const mf_placement *pl)
{
    if (bc->b->bounds)
        return mf_layout_bucket_placement_ok(bc->mesh, bc->b, pl) ? mf_layout_bucket_capacity(bc->mesh, bc->b, pl)
                                                                  : -1;
    int64_t shards = mf_layout_shards(bc->mesh, pl), q;
    if (__builtin_mul_overflow(shards, bc->shard_quantum, &q) || bc->b->length % q != 0)
        return -1;
    return bc->b->length / shards;
}

/* Fills one step for move mv at placement st with local count c. */
static mf_step make_step(const bucket_ctx *bc, const mf_placement *st, int64_t c, move mv, mf_dtype dt)
{
    mf_step s = {0};
    int64_t n = bc->mesh->axes[mv.axis].size;
    s.kind = mv.kind;
    s.axis = mv.axis;
    s.dtype = dt;
    s.from = *st;
    s.to = apply_move(st, bc->mesh->naxes, mv);
    /* an op that shards its axis keeps 1/n of the elements; in a ragged
     * bucket its count is the capacity of the side it shards */
    s.count = mf_opkind_info_of(mv.kind)->becomes == MF_PLACE_FLAT ? c / n : c;
    if (bc->b->bounds && mf_opkind_info_of(mv.kind)->becomes == MF_PLACE_FLAT)
        s.count = mf_layout_bucket_placement_ok(bc->mesh, bc->b, &s.to)
                      ? mf_layout_bucket_capacity(bc->mesh, bc->b, &s.to)
                      : 0;
    s.bytes = mf_layout_collective_bytes(bc->mesh, bc->b, mv.kind, mv.axis,
                                         mf_layout_shard_side(mv.kind, &s.from, &s.to), s.count, dt);
    return s;
}

static eval evaluate(const mf_plan *p, const bucket_ctx *bc, const mf_placement *from, const path *pa,
                     mf_dtype dt)
{
    eval e = {.valid = true};
    mf_placement st = *from;
    int64_t c = local_count(bc, &st);
    if (c < 0)
        return (eval){0};
    for (int i = 0; i < pa->n; i++) {
        mf_step s = make_step(bc, &st, c, pa->m[i], dt);
        st = s.to;
        c = local_count(bc, &st);
        if (c < 0)
            return (eval){0};
        e.cost += mf_cost_op_bytes(&p->cost, bc->mesh, s.kind, s.axis, s.count, s.bytes, dt);
        e.bytes += s.bytes;
        e.launches += mf_opkind_is_collective(s.kind);
    }
    return e;
}

static int move_key(move m)
{
    bool reduction = mf_opkind_info_of(m.kind)->need == MF_PLACE_PARTIAL;
    return reduction ? MF_MAX_AXES - 1 - m.axis : m.axis;
}

/* True when composition a (eval ea) is preferred over b. */
static bool better(const path *a, eval ea, const path *b, eval eb)
{
    double tol = 1e-12 + 1e-9 * fmax(ea.cost, eb.cost);
    if (fabs(ea.cost - eb.cost) > tol)
        return ea.cost < eb.cost;
    if (ea.bytes != eb.bytes)
        return ea.bytes < eb.bytes;
    if (a->n != b->n)
        return a->n < b->n;
    for (int i = 0; i < a->n; i++)
        if (move_key(a->m[i]) != move_key(b->m[i]))
            return move_key(a->m[i]) < move_key(b->m[i]);
    return false;
}

/* ---- diagnostics ---- */

/* The spec layout a bucket came from (first tensor of its unit with the same
 * signature), or -1. */
static int bucket_spec_layout(const mf_plan *p, const mf_bucket *b)
{
    const mf_spec_unit *u = &p->spec->units[b->unit];
    for (int i = 0; i < u->ntensors; i++) {
        const mf_spec_layout *l = &p->spec->layouts[u->tensors[i].layout];
        bool same = true;
        for (int r = 0; r < MF_ROLE_COUNT && same; r++)
            same = l->dtype[r] == b->dtype[r] && mf_placement_equal(&l->place[r], &b->place[r], p->sched->mesh.naxes);
        if (same)
            return u->tensors[i].layout;
    }
    return -1;
}

/* The first violation mf_trans_rules_check_layout reports. */
typedef struct first_illegal {
    bool found;
    mf_role role, note_role;
    int axis;
    char msg[768], note[256];
} first_illegal;

static void keep_first(void *ctx, const mf_illegal *v)
{
    first_illegal *f = ctx;
    if (f->found)
        return;
    *f = (first_illegal){.found = true, .role = v->role, .note_role = v->note_role, .axis = v->axis};
    snprintf(f->msg, sizeof f->msg, "%s", v->msg);
    snprintf(f->note, sizeof f->note, "%s", v->note ? v->note : "");
}

/* Reports the first legality violation of the bucket's placements (the
 * semantic pass's rule, mf_trans_rules_check_layout: a spec that came through it
 * has none); returns true when one was found. Diagnoses each spec layout
 * once. */
static bool check_legal(trans_state *ts, int bi)
{
    const mf_plan *p = ts->p;
    const mf_bucket *b = &p->sched->buckets[bi];
    const mf_mesh *m = &p->sched->mesh;
    first_illegal f = {0};
    for (int r = 0; r < MF_ROLE_COUNT && !f.found; r++)
        for (int j = 0; j < m->naxes && !f.found; j++)
            if (b->place[r].p[j] > MF_PLACE_DISTINCT) {
                f = (first_illegal){.found = true, .role = (mf_role)r, .note_role = MF_ROLE_COUNT, .axis = j};
                snprintf(f.msg, sizeof f.msg, "%s has an unknown placement", mf_role_name((mf_role)r));
            }
    int l = bucket_spec_layout(p, b);
    if (!f.found) {
        char what[160];
        snprintf(what, sizeof what, "layout '%s'", l >= 0 ? p->spec->layouts[l].name : b->layout);
        mf_trans_rules_check_layout(m, b->place, what, keep_first, &f);
    }
    if (!f.found)
        return false;
    int *seen = ts->reported.data;
    for (size_t i = 0; i < ts->reported.len; i++)
        if (seen[i] == l)
            return true;
    int *slot = mf_vec_push(&ts->reported);
    if (slot)
        *slot = l;
    mf_span none = {0, 0, 0, 0};
    const mf_spec_layout *sl = l >= 0 ? &p->spec->layouts[l] : NULL;
    mf_diag_error(ts->d, sl ? sl->role_span[f.role] : none, "unit '%s', %s, axis '%s': %s",
                  p->sched->units[b->unit].name, mf_role_name(f.role), m->axes[f.axis].name, f.msg);
    if (sl && f.note_role != MF_ROLE_COUNT)
        mf_diag_note(ts->d, sl->role_span[f.note_role], "%s", f.note);
    return true;
}

/* ---- building transitions ---- */

static char *describe(const mf_mesh *m, const path *pa, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < pa->n && at < size; i++) {
        int n = snprintf(buf + at, size - at, "%s%s(%s)", i ? " + " : "", mf_opkind_name(pa->m[i].kind),
                         m->axes[pa->m[i].axis].name);
        at += n > 0 ? (size_t)n : 0;
    }
    if (pa->n == 0)
        snprintf(buf, size, "nothing");
    return buf;
}

static const char *why_text(mf_plan *p, const bucket_ctx *bc, const path *best, eval eb, const path *alt,
                            eval ea, mf_dtype dt)
{
    char a[256], b[256];
    const char *reason;
    if (eb.launches < ea.launches && eb.bytes > ea.bytes)
        reason = "latency-bound: fewer launches outweigh the extra bytes";
    else if (eb.launches > ea.launches && eb.bytes < ea.bytes)
        reason = "bandwidth-bound: fewer bytes outweigh the extra launches";
    else if (eb.bytes < ea.bytes)
        reason = "fewer bytes per rank";
    else if (eb.launches < ea.launches)
        reason = "fewer launches";
    else if (eb.cost < ea.cost)
        reason = "cheaper links";
    else
        reason = "equal cost: reductions run innermost-first, gathers outermost-first";
    return mf_arena_printf(p->arena, "%s: %.2f us over %s: %.2f us for %lld bytes (%s)",
                           describe(bc->mesh, best, b, sizeof b), eb.cost * 1e6,
                           describe(bc->mesh, alt, a, sizeof a), ea.cost * 1e6,
                           (long long)(bc->b->length * (int64_t)mf_dtype_size(dt)), reason);
}

/* Does the step run on its axis's stream (the op table's stream column:
 * the collectives), rather than on the one of the collective it feeds? */
static bool on_axis_stream(const mf_step *st)
{
    return mf_opkind_info_of(st->kind)->stream == MF_OPSTREAM_AXIS;
}

/* The first step of tr on its axis's stream from index i on, going by dir
 * (+1 or -1); NULL when none. */
static const mf_step *axis_step(const mf_transition *tr, int i, int dir)
{
    for (; i >= 0 && i < tr->nsteps; i += dir)
        if (on_axis_stream(&tr->steps[i]))
            return &tr->steps[i];
    return NULL;
}

/* The streams of every step of one bucket (docs/semantics.md §5): a collective
 * runs on inner for the innermost axis, on outer for the others; a local step
 * (cast, slice, accumulate) takes the stream of the next collective of its
 * transition (the one it feeds), else the previous one (the one it follows),
 * else of the first collective of the transition it feeds (T1 -> T2,
 * T3 -> T4), else of the last one of the transition it follows (T4 <- T3;
 * both columns of mf_trans_rules.h), else inner. Which steps are which is
 * the op table's stream column (MF_OPKIND_LIST). The lowering pass places
 * ops on these streams (mf_step.stream) and computes none itself. */
static void assign_streams(mf_transition tr[MF_NTRANSITIONS], int k)
{
    for (int t = 0; t < MF_NTRANSITIONS; t++)
        for (int i = 0; i < tr[t].nsteps; i++)
            if (on_axis_stream(&tr[t].steps[i]))
                tr[t].steps[i].stream = mf_axis_stream(k, tr[t].steps[i].axis);
    for (int t = 0; t < MF_NTRANSITIONS; t++)
        for (int i = 0; i < tr[t].nsteps; i++) {
            mf_step *st = &tr[t].steps[i];
            if (on_axis_stream(st))
                continue;
            int feeds = mf_trans_rules[t].feeds, follows = mf_trans_rules[t].follows;
            const mf_step *src = axis_step(&tr[t], i + 1, 1);
            if (!src)
                src = axis_step(&tr[t], i - 1, -1);
            if (!src && feeds >= 0)
                src = axis_step(&tr[feeds], 0, 1);
            if (!src && follows >= 0)
                src = axis_step(&tr[follows], tr[follows].nsteps - 1, -1);
            st->stream = src ? src->stream : MF_STREAM_INNER;
        }
}

/* The seconds of each transition's steps (mf_transition.cost) and per
 * stream (on, before, after), once their streams are assigned. */
static void step_figures(const mf_plan *p, mf_transition tr[MF_NTRANSITIONS])
{
    for (int t = 0; t < MF_NTRANSITIONS; t++) {
        mf_transition *x = &tr[t];
        double at = 0, last_end[MF_STREAM_COUNT] = {0};
        for (int k = 0; k < MF_STREAM_COUNT; k++) {
            x->on[k] = x->before[k] = x->after[k] = 0;
            x->has_on[k] = false;
        }
        for (int i = 0; i < x->nsteps; i++) {
            const mf_step *st = &x->steps[i];
            int k = (int)st->stream;
            if (!x->has_on[k])
                x->before[k] = at;
            x->has_on[k] = true;
            double d = mf_cost_op_bytes(&p->cost, &p->sched->mesh, st->kind, st->axis, st->count, st->bytes, st->dtype);
            at += d;
            x->on[k] += d;
            last_end[k] = at;
        }
        x->cost = at;
        for (int k = 0; k < MF_STREAM_COUNT; k++)
            x->after[k] = x->has_on[k] ? at - last_end[k] : 0;
    }
}

/* The compositions of one transition evaluated for a bucket: the best, the
 * alternative `why` names, and how many were valid. */
typedef struct choice {
    const path *best, *alt;
    eval eb, ea;
    int nvalid;
} choice;

/* Picks the best valid composition of cs from `from`, moving dtype dt, and
 * (unless quiet) the alternative named in `why`: preferably the best one
 * that trades bytes against launches (different bytes per rank), else the
 * best that differs in launches or cost, else the best mere reordering. */
static choice choose(const mf_plan *p, const bucket_ctx *bc, const cand_set *cs, const mf_placement *from,
                     mf_dtype dt)
{
    const path *paths = cs->paths.data;
    choice ch = {0};
    for (size_t i = 0; i < cs->paths.len; i++) {
        eval e = evaluate(p, bc, from, &paths[i], dt);
        if (!e.valid)
            continue;
        ch.nvalid++;
        if (!ch.best || better(&paths[i], e, ch.best, ch.eb))
            ch.best = &paths[i], ch.eb = e;
    }
    int alt_rank = -1;
    for (size_t i = 0; ch.best && ch.nvalid > 1 && !p->quiet && i < cs->paths.len; i++) {
        if (&paths[i] == ch.best)
            continue;
        eval e = evaluate(p, bc, from, &paths[i], dt);
        if (!e.valid)
            continue;
        int rank = e.bytes != ch.eb.bytes ? 2
                   : e.launches != ch.eb.launches || fabs(e.cost - ch.eb.cost) > 1e-12 + 1e-9 * fmax(e.cost, ch.eb.cost)
                       ? 1
                       : 0;
        if (rank > alt_rank || (rank == alt_rank && better(&paths[i], e, ch.alt, ch.ea)))
            ch.alt = &paths[i], ch.ea = e, alt_rank = rank;
    }
    return ch;
}

/* No composition of transition t turns e's source into its target. */
static void report_no_composition(trans_state *ts, const mf_bucket *b, int t, const mf_trans_ends *e)
{
    const mf_plan *p = ts->p;
    int naxes = p->sched->mesh.naxes, l = bucket_spec_layout(p, b);
    mf_span none = {0, 0, 0, 0};
    char f[64], g[64];
    mf_diag_error(ts->d, l >= 0 ? p->spec->layouts[l].span : none,
                  "unit '%s': no composition of single-axis steps turns %s into %s for T%d of bucket '%s' "
                  "(length %lld); fix: use placements whose Flat axes are the innermost ones",
                  p->sched->units[b->unit].name, mf_placement_format(&e->from, naxes, f, sizeof f),
                  mf_placement_format(&e->to, naxes, g, sizeof g), t + 1, b->name, (long long)b->length);
}

/* A local step (cast, accumulate) at placement st with c elements. */
static mf_step local_step(mf_opkind kind, mf_dtype dt, const mf_placement *st, int64_t c)
{
    return (mf_step){.kind = kind, .axis = -1, .dtype = dt, .from = *st, .to = *st, .count = c};
}

/* tr's steps: path best from `from` moving dtype dt, with T1's cast (before
 * the moves when cast_first, else after) and T3's accumulate added around
 * it. False on OOM. */
static bool fill_steps(mf_plan *p, const bucket_ctx *bc, int t, const path *best, const mf_placement *from,
                       mf_dtype dt, bool cast_first, mf_transition *tr)
{
    const mf_bucket *b = bc->b;
    int extra = t == MF_T1 || t == MF_T3; /* the cast, the accumulate */
    tr->steps = mf_arena_array(p->arena, (size_t)(best->n + extra), sizeof *tr->steps);
    if (!tr->steps)
        return false;
    mf_placement st = *from;
    int64_t c = local_count(bc, &st);
    int n = 0;
    if (t == MF_T1 && cast_first)
        tr->steps[n++] = local_step(MF_OP_CAST, b->dtype[MF_ROLE_WEIGHT], &st, c);
    for (int i = 0; i < best->n; i++) {
        tr->steps[n] = make_step(bc, &st, c, best->m[i], dt);
        st = tr->steps[n++].to;
        c = local_count(bc, &st);
    }
    if (t == MF_T1 && !cast_first)
        tr->steps[n++] = local_step(MF_OP_CAST, b->dtype[MF_ROLE_WEIGHT], &st, c);
    if (t == MF_T3)
        tr->steps[n++] = local_step(MF_OP_ACCUMULATE, b->dtype[MF_ROLE_GRAD], &st, c);
    tr->nsteps = n; /* its seconds: step_figures, once the streams are assigned */
    return true;
}

/* Builds transition t of bucket bi; false on error (reported) or OOM (*oom). */
static bool build(trans_state *ts, int bi, int t, bool *oom)
{
    mf_plan *p = ts->p;
    const mf_bucket *b = &p->sched->buckets[bi];
    bucket_ctx bc = {&p->sched->mesh, b, mf_layout_pass_shard_quantum(b->dtype, p->sched->align)};
    mf_transition *tr = &p->trans[bi][t];
    mf_trans_ends e = mf_trans_rules_endpoints(t, b->place, b->dtype, p->sched->mesh.naxes);
    tr->id = t + 1;
    tr->when = mf_trans_rules[t].when;
    tr->from = e.from;
    tr->to = e.to;
    tr->from_dtype = e.from_dtype;
    tr->to_dtype = e.to_dtype;
    const cand_set *cs = candidates(ts, t, &e.from, &e.to);
    if (!cs) {
        *oom = true;
        return false;
    }
    /* T1 moves data in the narrower dtype; T2..T4 in their own. */
    mf_dtype dw = b->dtype[MF_ROLE_WEIGHT], dmo = b->dtype[MF_ROLE_MAIN_WEIGHT];
    bool cast_first = mf_dtype_size(dw) <= mf_dtype_size(dmo);
    mf_dtype move_dt = t == MF_T1 ? (cast_first ? dw : dmo) : e.to_dtype;
    choice ch = choose(p, &bc, cs, &e.from, move_dt);
    if (!ch.best) {
        report_no_composition(ts, b, t, &e);
        return false;
    }
    if (!fill_steps(p, &bc, t, ch.best, &e.from, move_dt, cast_first, tr)) {
        *oom = true;
        return false;
    }
    if (ch.nvalid > 1 && !p->quiet) {
        tr->why = why_text(p, &bc, ch.best, ch.eb, ch.alt, ch.ea, move_dt);
        if (!tr->why) {
            *oom = true;
            return false;
        }
    }
    return true;
}

/* ---- the cache shared by a search's candidates ---- */

struct mf_trans_cache {
    mf_hash index;          /* key -> entry */
    mf_vec entries;         /* mf_transition[MF_NTRANSITIONS] */
    mf_arena *arena;        /* their steps */
};

mf_trans_cache *mf_transition_cache_new(void)
{
    mf_trans_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    mf_vec_init(&c->entries, sizeof(mf_transition[MF_NTRANSITIONS]));
    c->arena = mf_arena_create();
    if (!c->arena) {
        free(c);
        return NULL;
    }
    return c;
}

void mf_transition_cache_free(mf_trans_cache *c)
{
    if (!c)
        return;
    mf_hash_free(&c->index);
    mf_vec_free(&c->entries);
    mf_arena_destroy(c->arena);
    free(c);
}

/* Everything build() and check_legal() read of a bucket besides the plan's
 * mesh and cost model: dtypes, placements, padded length, alignment. */
static size_t cache_key(const mf_schedule *s, const mf_bucket *b, uint8_t *key)
{
    size_t n = 0;
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        key[n++] = (uint8_t)b->dtype[r];
        for (int j = 0; j < s->mesh.naxes; j++)
            key[n++] = b->place[r].p[j];
    }
    memcpy(key + n, &b->length, sizeof b->length);
    n += sizeof b->length;
    memcpy(key + n, &s->align, sizeof s->align);
    return n + sizeof s->align;
}

/* Copies the bucket's transitions from the cache when there; 1 found, 0 not,
 * -1 OOM. */
static int cache_get(mf_plan *p, int b, const uint8_t *key, size_t n)
{
    int64_t e = mf_hash_get(&p->tcache->index, key, n);
    if (e < 0)
        return 0;
    const mf_transition *src = (const mf_transition *)p->tcache->entries.data + (size_t)e * MF_NTRANSITIONS;
    /* the steps stay in the cache's arena: no pass writes a step after
       this one, and the cache outlives the plans that share it */
    for (int t = 0; t < MF_NTRANSITIONS; t++)
        p->trans[b][t] = src[t];
    return 1;
}

/* Stores the bucket's transitions (built without errors); false on OOM. */
static bool cache_put(mf_plan *p, int b, const uint8_t *key, size_t n)
{
    mf_trans_cache *c = p->tcache;
    mf_transition *dst = mf_vec_push(&c->entries);
    if (!dst)
        return false;
    for (int t = 0; t < MF_NTRANSITIONS; t++) {
        const mf_transition *tr = &p->trans[b][t];
        dst[t] = *tr;
        dst[t].why = NULL;
        dst[t].steps = mf_arena_array(c->arena, (size_t)(tr->nsteps ? tr->nsteps : 1), sizeof *tr->steps);
        if (!dst[t].steps)
            return false;
        memcpy(dst[t].steps, tr->steps, (size_t)tr->nsteps * sizeof *tr->steps);
    }
    return mf_hash_put(&c->index, key, n, (int64_t)c->entries.len - 1) >= 0;
}

bool mf_transition_run(mf_plan *p, mf_diag *d)
{
    mf_schedule *s = p->sched;
    trans_state ts = {.p = p, .d = d, .k = s->mesh.naxes};
    mf_vec_init(&ts.sets, sizeof(cand_set));
    mf_vec_init(&ts.reported, sizeof(int));
    bool oom = false, ok = true;
    p->trans = mf_arena_array(p->arena, s->nbuckets ? (size_t)s->nbuckets : 1, sizeof *p->trans);
    oom = !p->trans;
    for (int b = 0; b < s->nbuckets && !oom; b++) {
        uint8_t key[MF_ROLE_COUNT * (1 + MF_MAX_AXES) + 16];
        size_t kn = 0;
        if (p->tcache && !mf_layout_bucket_whole(&s->buckets[b])) { /* a whole bucket's bytes read its tensors */
            kn = cache_key(s, &s->buckets[b], key);
            int got = cache_get(p, b, key, kn);
            oom = got < 0;
            if (got != 0)
                continue;
        }
        if (check_legal(&ts, b)) {
            ok = false;
            continue;
        }
        bool built = true;
        for (int t = 0; t < MF_NTRANSITIONS && !oom; t++)
            built = build(&ts, b, t, &oom) && built;
        if (built) {
            assign_streams(p->trans[b], ts.k);
            step_figures(p, p->trans[b]);
        }
        if (built && !oom && kn)
            oom = !cache_put(p, b, key, kn);
        ok = ok && built;
    }
    if (oom) {
        mf_span none = {0, 0, 0, 0};
        mf_diag_error(d, none, "out of memory while planning transitions");
        ok = false;
    }
    cand_set *sets = ts.sets.data;
    for (size_t i = 0; i < ts.sets.len; i++)
        mf_vec_free(&sets[i].paths);
    mf_vec_free(&ts.sets);
    mf_vec_free(&ts.reported);
    return ok && mf_diag_errors(d) == 0;
}
