/*
 * mf_trans_rules: the table of the four transitions (mf_trans_rules.h) as
 * data, and the legality of a layout's placements, checked here once for the
 * semantic pass and the transition pass.
 */
#include "mf_trans_rules.h"

#include <stdio.h>
#include <string.h>

#include "mf_layout.h"

#define MF_TR_ROW(ID, when, phase, from_role, from_fixed, from_buf, from_text, to_role, to_fixed, to_buf, to_text, \
                  to_dtype_role, feeds, follows, ops, moves, when_text)                                         \
    {#ID,       MF_WHEN_##when, MF_PHASE_##phase, MF_ROLE_##from_role, MF_ROLE_##to_role, MF_ROLE_##to_dtype_role,  \
     from_fixed, to_fixed,      from_buf,         to_buf,              from_text,         to_text,                  \
     when_text, feeds,          follows,          ops,                 moves},
const mf_trans_rule mf_trans_rules[MF_NTRANSITIONS] = {MF_TRANSITION_LIST(MF_TR_ROW)};
#undef MF_TR_ROW

/* A role's placement, or `fixed` on every axis but the role's Distinct ones
 * (the local gradient and the unsharded weight are one coordinate's tensor). */
static mf_placement mf_trans_end(int fixed, const mf_placement *role, int naxes)
{
    if (fixed == MF_TR_ROLE)
        return *role;
    return mf_placement_uniform((mf_place)fixed, role, naxes);
}

mf_trans_ends mf_trans_rules_endpoints(int t, const mf_placement place[MF_ROLE_COUNT], const mf_dtype dtype[MF_ROLE_COUNT],
                                       int naxes)
{
    const mf_trans_rule *tr = &mf_trans_rules[t];
    mf_trans_ends e;
    e.from = mf_trans_end(tr->from_fixed, &place[tr->from_role], naxes);
    e.to = mf_trans_end(tr->to_fixed, &place[tr->to_role], naxes);
    e.from_dtype = dtype ? dtype[tr->from_role] : MF_FP32;
    e.to_dtype = dtype ? dtype[tr->to_dtype_role] : MF_FP32;
    return e;
}

bool mf_trans_rules_move_ok(int t, mf_place a, mf_place b)
{
    if (a == MF_PLACE_DISTINCT || b == MF_PLACE_DISTINCT)
        return a == b;   /* nothing moves on a Distinct axis */
    if ((int)a < 0 || a >= MF_PLACE_COUNT || (int)b < 0 || b >= MF_PLACE_COUNT)
        return false;
    return (mf_trans_rules[t].moves >> (a * MF_PLACE_COUNT + b)) & 1u;
}

bool mf_trans_rules_op_ok(int t, mf_opkind k)
{
    return (mf_trans_rules[t].ops >> k) & 1u;
}

/* "a", "a or b", "a, b or c" into buf. */
static void mf_trans_join(char *buf, size_t size, const char *const *w, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < size; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int k = snprintf(buf + o, size - o, "%s%s", sep, w[i]);
        if (k < 0)
            break;
        o += (size_t)k;
    }
}

static void mf_trans_report(mf_illegal_fn report, void *ctx, mf_illegal_kind kind, mf_role role, int axis,
                            const char *msg, mf_role note_role, const char *note)
{
    mf_illegal v = {kind, role, axis, msg, note_role, note};
    report(ctx, &v);
}

/* Only grad may be Partial: the first Partial axis of each other role. */
static int mf_trans_check_partial(const mf_mesh *mesh, const mf_placement place[MF_ROLE_COUNT], const char *what,
                                  mf_illegal_fn report, void *ctx)
{
    int n = 0;
    char msg[512];
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        if (r == MF_ROLE_GRAD)
            continue;
        for (int j = 0; j < mesh->naxes; j++)
            if (place[r].p[j] == MF_PLACE_PARTIAL) {
                snprintf(msg, sizeof msg,
                         "'%s' may not be Partial (axis '%s' in %s); only grad may be Partial: use Replicate or Flat",
                         mf_role_name((mf_role)r), mesh->axes[j].name, what);
                mf_trans_report(report, ctx, MF_ILLEGAL_PARTIAL, (mf_role)r, j, msg, MF_ROLE_COUNT, NULL);
                n++;
                break;
            }
    }
    return n;
}

bool mf_trans_rules_suffix_break(const mf_placement *p, int naxes, int *flat, int *inner)
{
    for (int j = 0; j < naxes; j++)
        if (p->p[j] == MF_PLACE_FLAT)
            for (int k = j + 1; k < naxes; k++)
                if (p->p[k] != MF_PLACE_FLAT) {
                    *flat = j;
                    *inner = k;
                    return true;
                }
    return false;
}

mf_placement mf_trans_rules_suffix_fix(const mf_placement *p, int naxes)
{
    mf_placement fixed = {{0}};
    int o = 0;
    for (int j = 0; j < naxes; j++)
        if (p->p[j] != MF_PLACE_FLAT)
            fixed.p[o++] = p->p[j];
    while (o < naxes)
        fixed.p[o++] = MF_PLACE_FLAT;
    return fixed;
}

/* The Flat axes are the innermost ones, for every role. */
static int mf_trans_check_suffix(const mf_mesh *mesh, const mf_placement place[MF_ROLE_COUNT], const char *what,
                                 mf_illegal_fn report, void *ctx)
{
    int n = 0, naxes = mesh->naxes;
    char msg[512];
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        const mf_placement *p = &place[r];
        int bad_flat, bad_inner;
        if (!mf_trans_rules_suffix_break(p, naxes, &bad_flat, &bad_inner))
            continue;
        char have[64], fix[64];
        mf_placement fixed = mf_trans_rules_suffix_fix(p, naxes);
        mf_placement_format(p, naxes, have, sizeof have);
        mf_placement_format(&fixed, naxes, fix, sizeof fix);
        snprintf(msg, sizeof msg,
                 "placement %s of '%s' in %s breaks the suffix rule: axis '%s' is Flat but axis '%s' inside it is "
                 "%s; Flat axes must be the innermost, e.g. %s",
                 have, mf_role_name((mf_role)r), what, mesh->axes[bad_flat].name, mesh->axes[bad_inner].name,
                 mf_place_name((mf_place)p->p[bad_inner]), fix);
        mf_trans_report(report, ctx, MF_ILLEGAL_SUFFIX, (mf_role)r, bad_flat, msg, MF_ROLE_COUNT, NULL);
        n++;
    }
    return n;
}

/* An axis Distinct in some role is Distinct in all three: each role that is
 * not is reported at its entry, with a note at a Distinct one. */
static int mf_trans_check_distinct(const mf_mesh *mesh, const mf_placement place[MF_ROLE_COUNT], const char *what,
                                   mf_illegal_fn report, void *ctx)
{
    int n = 0;
    char msg[768], note[256];
    for (int j = 0; j < mesh->naxes; j++) {
        int d = -1;
        for (int r = 0; r < MF_ROLE_COUNT && d < 0; r++)
            d = place[r].p[j] == MF_PLACE_DISTINCT ? r : -1;
        if (d < 0)
            continue;
        const char *axis = mesh->axes[j].name, *dr = mf_role_name((mf_role)d);
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            if (place[r].p[j] == MF_PLACE_DISTINCT)
                continue;
            snprintf(msg, sizeof msg,
                     "'%s' is %s on axis '%s' in %s, where '%s' is Distinct; a Distinct axis holds a different "
                     "tensor on each coordinate, and %s there would need communication across distinct tensors: "
                     "weight, grad and main_weight must all be Distinct on '%s', or none",
                     mf_role_name((mf_role)r), mf_place_name((mf_place)place[r].p[j]), axis, what, dr,
                     mf_place_name((mf_place)place[r].p[j]), axis);
            snprintf(note, sizeof note, "%s is Distinct on '%s' here", dr, axis);
            mf_trans_report(report, ctx, MF_ILLEGAL_DISTINCT, (mf_role)r, j, msg, (mf_role)d, note);
            n++;
        }
    }
    return n;
}

/* One transition's move on one axis, which its `moves` do not allow. */
static void mf_trans_report_move(const mf_mesh *mesh, int t, int j, int from, int to, const char *what,
                                 mf_illegal_fn report, void *ctx)
{
    const mf_trans_rule *tr = &mf_trans_rules[t];
    bool from_role = tr->from_fixed == MF_TR_ROLE, to_role = tr->to_fixed == MF_TR_ROLE;
    /* A fix: another target for this source, or another source. */
    const char *to_ok[MF_PLACE_COUNT], *from_ok[MF_PLACE_COUNT];
    size_t nto = 0, nfrom = 0;
    for (int p = 0; p < MF_PLACE_COUNT; p++) {
        if (mf_trans_rules_move_ok(t, (mf_place)from, (mf_place)p) && !(tr->to_role != MF_ROLE_GRAD && p == MF_PLACE_PARTIAL))
            to_ok[nto++] = mf_place_name((mf_place)p);
        if (mf_trans_rules_move_ok(t, (mf_place)p, (mf_place)to))
            from_ok[nfrom++] = mf_place_name((mf_place)p);
    }
    char fix[256] = "", a[96], b[96], msg[768], note[256];
    const char *axis = mesh->axes[j].name;
    mf_trans_join(a, sizeof a, to_ok, nto);
    mf_trans_join(b, sizeof b, from_ok, nfrom);
    if (nto && to_role && nfrom && from_role)
        snprintf(fix, sizeof fix, "make %s %s on '%s', or %s %s", tr->to_text, a, axis, tr->from_text, b);
    else if (nto && to_role)
        snprintf(fix, sizeof fix, "make %s %s on '%s'", tr->to_text, a, axis);
    else if (nfrom && from_role)
        snprintf(fix, sizeof fix, "make %s %s on '%s'", tr->from_text, b, axis);
    snprintf(msg, sizeof msg, "%s (%s -> %s, %s) cannot go %s -> %s on axis '%s' in %s; %s", tr->name, tr->from_text,
             tr->to_text, tr->when_text, mf_place_name((mf_place)from), mf_place_name((mf_place)to), axis, what, fix);
    snprintf(note, sizeof note, "%s is %s on '%s' here", tr->from_text, mf_place_name((mf_place)from), axis);
    mf_trans_report(report, ctx, MF_ILLEGAL_MOVE, to_role ? tr->to_role : tr->from_role, j, msg,
                    from_role && to_role ? tr->from_role : MF_ROLE_COUNT, note);
}

int mf_trans_rules_check_layout(const mf_mesh *mesh, const mf_placement place[MF_ROLE_COUNT], const char *what,
                                mf_illegal_fn report, void *ctx)
{
    int n = mf_trans_check_partial(mesh, place, what, report, ctx);
    n += mf_trans_check_suffix(mesh, place, what, report, ctx);
    n += mf_trans_check_distinct(mesh, place, what, report, ctx);
    if (n)
        return n;
    for (int t = 0; t < MF_NTRANSITIONS; t++) {
        mf_trans_ends e = mf_trans_rules_endpoints(t, place, NULL, mesh->naxes);
        for (int j = 0; j < mesh->naxes; j++) {
            int from = e.from.p[j], to = e.to.p[j];
            if (mf_trans_rules_move_ok(t, (mf_place)from, (mf_place)to))
                continue;
            mf_trans_report_move(mesh, t, j, from, to, what, report, ctx);
            n++;
        }
    }
    return n;
}
