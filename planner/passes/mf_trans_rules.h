/*
 * mf_trans_rules: the four transitions of every bucket (docs/semantics.md,
 * "4. The four transitions"), one row each, and the legality rules of a
 * layout's placements. Every pass reads
 * the facts from here: the semantic pass (legality, mf_sema.c), the
 * transition pass (placements, dtypes, ops, streams, mf_transition.c), the
 * lowering (phases and hand-offs, mf_lower.c) and explain (names, phases,
 * mf_explain.c).
 *
 * MF_TRANSITION_LIST(X), X(ID, when, phase, from_role, from_fixed, from_buf,
 *   from_text, to_role, to_fixed, to_buf, to_text, to_dtype_role, feeds,
 *   follows, ops, moves, when_text):
 *   when          predicate of its ops: once at the first microbatch, every
 *                 microbatch, or once at the last
 *   phase         the hook that issues it (T2 also at backward_pre when the
 *                 unit reshards after forward)
 *   from_role     the role whose placement and dtype it starts from ...
 *   from_fixed    ... unless every axis is this placement (T3 starts from the
 *                 trainer's local gradient, Partial everywhere; a
 *                 Distinct axis of the role stays Distinct,
 *                 docs/semantics.md §4.7);
 *                 MF_TR_ROLE: the role's placement
 *   from_buf      the buffer it reads; from_text names the source in messages
 *   to_role, to_fixed, to_buf, to_text: the same for the target (T2 ends
 *                 unsharded, Replicate everywhere; T4 ends at main_weight's
 *                 placement in grad's dtype)
 *   to_dtype_role the role whose dtype the target has
 *   feeds/follows the transition whose first/last collective gives a local
 *                 step its stream when its own transition has none (T1 feeds
 *                 T2, T3 feeds T4; T2 follows T1, T4 follows T3); -1 none
 *   ops           the single-axis ops its compositions may use (bits of
 *                 mf_opkind); the cast of T1 and the accumulate of T3 are
 *                 added around them by the transition pass
 *   moves         per axis, the placement changes it may make (bits
 *                 MF_TR_MOVE(from, to)); a layout whose placements need any
 *                 other is illegal. Distinct -> Distinct is every
 *                 transition's move on a Distinct axis (no op), and the only
 *                 one there: a layout is Distinct on an axis in all three
 *                 roles or in none
 *   when_text     when it runs, for messages
 */
#ifndef MF_TRANS_RULES_H
#define MF_TRANS_RULES_H

#include "mf_schedule.h"

#define MF_TR_ROLE (MF_PLACE_NONE + 1) /* from_fixed / to_fixed: the role's own placement */
#define MF_TR_OP(k) (1u << MF_OP_##k)
#define MF_TR_MOVE(a, b) (1u << (MF_PLACE_##a * MF_PLACE_COUNT + MF_PLACE_##b))

#define MF_TRANSITION_LIST(X)                                                                                   \
    X(T1, FIRST, FORWARD_PRE, MAIN_WEIGHT, MF_TR_ROLE, "main_weight", "main_weight", WEIGHT, MF_TR_ROLE,       \
      "weight", "weight", WEIGHT, MF_T2, -1, MF_TR_OP(ALL_GATHER) | MF_TR_OP(SLICE),                          \
      MF_TR_MOVE(REPLICATE, REPLICATE) | MF_TR_MOVE(REPLICATE, FLAT) | MF_TR_MOVE(FLAT, FLAT) |                \
          MF_TR_MOVE(FLAT, REPLICATE),                                                                          \
      "at the first microbatch")                                                                               \
    X(T2, EVERY, FORWARD_PRE, WEIGHT, MF_TR_ROLE, "weight", "weight", WEIGHT, MF_PLACE_REPLICATE, "weight_full", \
      "the unsharded weight", WEIGHT, -1, MF_T1, MF_TR_OP(ALL_GATHER),                                         \
      MF_TR_MOVE(REPLICATE, REPLICATE) | MF_TR_MOVE(FLAT, REPLICATE), "before compute")                        \
    X(T3, EVERY, BACKWARD_POST, GRAD, MF_PLACE_PARTIAL, "grad_local", "the local gradient", GRAD, MF_TR_ROLE,   \
      "grad", "grad", GRAD, MF_T4, -1,                                                                          \
      MF_TR_OP(ALL_GATHER) | MF_TR_OP(REDUCE_SCATTER) | MF_TR_OP(ALL_REDUCE),                                  \
      MF_TR_MOVE(PARTIAL, PARTIAL) | MF_TR_MOVE(PARTIAL, FLAT) | MF_TR_MOVE(PARTIAL, REPLICATE),               \
      "after every backward")                                                                                  \
    X(T4, LAST, BACKWARD_POST, GRAD, MF_TR_ROLE, "grad", "grad", MAIN_WEIGHT, MF_TR_ROLE, "grad_final",         \
      "main_weight", GRAD, -1, MF_T3,                                                                           \
      MF_TR_OP(ALL_GATHER) | MF_TR_OP(SLICE) | MF_TR_OP(REDUCE_SCATTER) | MF_TR_OP(ALL_REDUCE),               \
      MF_TR_MOVE(PARTIAL, FLAT) | MF_TR_MOVE(PARTIAL, REPLICATE) | MF_TR_MOVE(REPLICATE, REPLICATE) |          \
          MF_TR_MOVE(REPLICATE, FLAT) | MF_TR_MOVE(FLAT, FLAT),                                                 \
      "at the last microbatch")

#define MF_TR_ENUM(ID, ...) MF_##ID,
enum { MF_TRANSITION_LIST(MF_TR_ENUM) MF_NTRANSITIONS };
#undef MF_TR_ENUM

/* One row of the table. */
typedef struct mf_trans_rule {
    const char *name;       /* "T1" */
    mf_when when;
    mf_phase phase;
    mf_role from_role, to_role, to_dtype_role;
    int from_fixed, to_fixed; /* an mf_place, or MF_TR_ROLE */
    const char *from_buf, *to_buf, *from_text, *to_text, *when_text;
    int feeds, follows;     /* transition index, or -1 */
    unsigned ops, moves;
} mf_trans_rule;

extern const mf_trans_rule mf_trans_rules[MF_NTRANSITIONS];

/* Transition t's two ends for a bucket or layout whose roles have these
 * placements and dtypes (naxes axes): the source and target placements
 * (a role's, or from_fixed / to_fixed on every axis) and dtypes (from_role's
 * and to_dtype_role's; fp32 when dtype is NULL, for the placements alone).
 * The transition search, the legality check and the plan bounds
 * (mf_plan_bound.c) all take the endpoints from here. */
typedef struct mf_trans_ends {
    mf_placement from, to;
    mf_dtype from_dtype, to_dtype;
} mf_trans_ends;

mf_trans_ends mf_trans_rules_endpoints(int t, const mf_placement place[MF_ROLE_COUNT], const mf_dtype dtype[MF_ROLE_COUNT],
                                       int naxes);

/* May transition t go from placement a to b on one axis? */
bool mf_trans_rules_move_ok(int t, mf_place a, mf_place b);
/* May transition t's compositions use op kind k? */
bool mf_trans_rules_op_ok(int t, mf_opkind k);

/* A rule a layout's placements break. */
typedef enum { MF_ILLEGAL_PARTIAL, MF_ILLEGAL_SUFFIX, MF_ILLEGAL_DISTINCT, MF_ILLEGAL_MOVE } mf_illegal_kind;

typedef struct mf_illegal {
    mf_illegal_kind kind;
    mf_role role;           /* where the error points */
    int axis;
    const char *msg;        /* the error (borrowed for the call) */
    mf_role note_role;      /* MF_ROLE_COUNT: no note */
    const char *note;       /* the note at note_role's entry on the same axis */
} mf_illegal;

/* Receives each violation. */
typedef void (*mf_illegal_fn)(void *ctx, const mf_illegal *v);

/*
 * The legality of a layout (placements of weight, grad, main_weight; `what`
 * names it in messages: "layout 'hfsdp'"): only grad may be Partial; the
 * Flat axes of every placement are a suffix of the mesh; an axis Distinct
 * in one role is Distinct in all three; and, when these hold, on every axis
 * every transition makes a move of its `moves`.
 * Reports every violation in that order; returns how many.
 */
/* The suffix rule (docs/semantics.md §1): true when placement p has a Flat
 * axis *flat with a non-Flat axis *inner inside it (the first such pair). */
bool mf_trans_rules_suffix_break(const mf_placement *p, int naxes, int *flat, int *inner);
/* p with its Flat axes moved innermost, the order kept: the fix a suffix
 * error suggests. */
mf_placement mf_trans_rules_suffix_fix(const mf_placement *p, int naxes);

int mf_trans_rules_check_layout(const mf_mesh *mesh, const mf_placement place[MF_ROLE_COUNT], const char *what,
                                mf_illegal_fn report, void *ctx);

#endif
