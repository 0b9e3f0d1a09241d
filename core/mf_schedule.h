/*
 * mf_schedule: the in-memory model of a compiled schedule (docs/schedule.md §2).
 *
 * This is the contract between every stage after the planner's transitions:
 * the lowering pass fills it, the verifier checks it, the emitter writes it,
 * the loader reads it back, the runtime replays it, the simulator times it and
 * `mfsdpc diff` compares two of them. It never includes planner or grammar
 * headers.
 *
 * Ownership: a schedule owns one arena; every array and string hanging off it
 * lives in that arena and dies with mf_schedule_free().
 *
 * Op semantics, per rank with mesh coords c (all counts in elements, the buffer
 * dtypes are the buffers' own; n_j is the size of axis j):
 *   all_gather     axis j, count n: dst[0 .. n_j*n) = concat over the axis group,
 *                  in coord order, of each rank's src[0 .. n)      (NCCL sendcount)
 *   reduce_scatter axis j, count n: dst[0 .. n) = reduce over the axis group of
 *                  src[c_j*n .. c_j*n + n)                         (NCCL recvcount)
 *   all_reduce     axis j, count n: dst[0 .. n) = reduce over the group of src[0 .. n);
 *                  src == dst (in place) is allowed
 *   slice          axis j, count n: dst[0 .. n) = src[c_j*n .. c_j*n + n) (local)
 *   cast           count n: dst[i] = (dst dtype) src[i]
 *   accumulate     count n: dst[i] = src[i] on microbatch 0, dst[i] + src[i] after
 *   record         stream marks event `event` (everything before it on the stream)
 *   wait           stream waits for the latest record of `event` issued before
 *                  this op in issue order
 * "reduce" is the schedule's reduce op: sum, or avg (sum divided by n_j, so
 * averages compose across axes).
 *
 * Buffers per bucket (normative, the runtime relies on it): exactly one buffer
 * of each kind main_weight, weight, grad_local and grad; a weight_full buffer
 * exactly when W is not all-Replicate (else `weight` is the unsharded weight);
 * a grad_final buffer exactly when G != O (else `grad` is the delivered
 * gradient); any number of weight_stage / grad_stage buffers. The trainer
 * computes with weight_full (or weight), writes each microbatch's gradient
 * into grad_local between backward_pre and backward_post, and after step_end
 * reads the delivered gradient and updates main_weight in place.
 *
 * Issue order: at a hook (phase, unit, microbatch m) the runtime issues, in
 * ascending id, every op with that phase and unit whose `when` holds for m
 * (first: m == 0, last: m == M-1, every: always). step_begin and step_end ops
 * have unit -1 and when = every (once per step). Ops on stream `compute` are
 * executed by the trainer's thread (CPU) or on its compute stream (GPU).
 *
 * Two more programs share the buffers and the arena (planner/passes/mf_programs.c,
 * docs/schedule.md §3.1): a short step's end -- step_end ops with when =
 * short, which run instead of the `every` ones when a step ends after
 * m < M microbatches -- and the forward-only (evaluation) pass between steps:
 * ops at eval_forward_pre(unit), when = every. Neither is part of the
 * training step's cycle (mf_op_in_step), its per-step totals or its live
 * intervals.
 */
#ifndef MF_SCHEDULE_H
#define MF_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mf_arena.h"

#define MF_MAX_AXES 4
#define MF_MAX_DIMS 8
#define MF_SCHEDULE_FORMAT "mfsdp-schedule/4"
/* The same without the short-step and evaluation programs (!programs). */
#define MF_SCHEDULE_FORMAT_STEP_ONLY "mfsdp-schedule/3"
/* Format 4 plus the placement value `Whole`: written when some bucket has a
 * whole role (mf_bucket.whole), so schedules without one keep format 4. */
#define MF_SCHEDULE_FORMAT_WHOLE "mfsdp-schedule/5"
/* Format 5 plus the placement value `Distinct`: written when some bucket has a
 * Distinct axis (MF_PLACE_DISTINCT), so schedules without one keep 4 or 5. */
#define MF_SCHEDULE_FORMAT_DISTINCT "mfsdp-schedule/6"
/* Format 6 plus ragged whole buckets (docs/semantics.md §4.6): a whole
 * bucket's shards follow its `bounds` (mf_bucket.bounds) and its persistent
 * buffers are per rank (core/mf_persist.h). Written when some bucket has a
 * whole role; a format 5 or 6 file with a whole role (equal, padded shards)
 * is refused with a hint to compile again. */
#define MF_SCHEDULE_FORMAT_RAGGED "mfsdp-schedule/7"
/* A tensor entry's optional key `global` (format 6, docs/schedule.md): the
 * global names of a Distinct tensor (mf_tensor.global), a list of names
 * (rename) or a mapping of `name` and `split` (split). Spelled here for the
 * emitter and the loader until core/mf_schema.h's tensor section holds an
 * optional key. */
#define MF_SCHEDULE_KEY_GLOBAL "global"
#define MF_SCHEDULE_KEY_GLOBAL_NAME "name"
#define MF_SCHEDULE_KEY_GLOBAL_SPLIT "split"

/* ---- closed vocabularies as X-macro tables: X(enum suffix, yaml name, ...) ---- */

/* dtypes: X(ENUM, name, bytes per element) */
#define MF_DTYPE_LIST(X) \
    X(FP32, "fp32", 4)   \
    X(BF16, "bf16", 2)   \
    X(FP16, "fp16", 2)

/* placements per axis: X(ENUM, long name, letter) */
#define MF_PLACE_LIST(X)         \
    X(REPLICATE, "Replicate", 'R') \
    X(FLAT, "Flat", 'F')         \
    X(PARTIAL, "Partial", 'P')

/* `Whole` is written where a role's Flat axes are tensor-atomic (mf_bucket.whole):
 * the layout math is Flat's, the packing keeps every tensor inside one shard. */
#define MF_WHOLE_NAME "Whole"
#define MF_WHOLE_LETTER 'W'

/* `Distinct` (docs/semantics.md §1): each coordinate of the axis holds a
 * different tensor of the same shape (a TP shard, another expert set), never
 * split and never communicated. It is a placement value past the table
 * (MF_PLACE_LIST stays the three data-parallel ones, so their messages keep
 * their text): no op of MF_OPKIND_LIST needs or leaves it, so no op ever runs
 * on a Distinct axis; a layout is Distinct on an axis in all three roles or in
 * none; the layout math counts it like Replicate (one tensor per coordinate,
 * not split). mf_place_name / mf_place_letter know it; mf_place_from_name does
 * not (the checker and the loader read it by MF_DISTINCT_NAME). */
#define MF_PLACE_DISTINCT ((mf_place)MF_PLACE_COUNT)
#define MF_DISTINCT_NAME "Distinct"
#define MF_DISTINCT_LETTER 'D'

/* roles of a tensor: X(ENUM, name) */
#define MF_ROLE_LIST(X)   \
    X(WEIGHT, "weight")   \
    X(GRAD, "grad")       \
    X(MAIN_WEIGHT, "main_weight")

/* hook points: X(ENUM, name) */
#define MF_PHASE_LIST(X)             \
    X(STEP_BEGIN, "step_begin")      \
    X(FORWARD_PRE, "forward_pre")    \
    X(FORWARD_POST, "forward_post")  \
    X(BACKWARD_PRE, "backward_pre")  \
    X(BACKWARD_POST, "backward_post") \
    X(STEP_END, "step_end")          \
    X(EVAL_PRE, "eval_forward_pre")  \
    X(EVAL_POST, "eval_forward_post")

/* microbatch predicates: X(ENUM, name) */
#define MF_WHEN_LIST(X) \
    X(FIRST, "first")   \
    X(EVERY, "every")   \
    X(LAST, "last")     \
    X(SHORT, "short")

/* streams: X(ENUM, name) */
#define MF_STREAM_LIST(X)   \
    X(COMPUTE, "compute")   \
    X(INNER, "inner")       \
    X(OUTER, "outer")

/* reduction ops: X(ENUM, name) */
#define MF_REDUCE_LIST(X) \
    X(AVG, "avg")         \
    X(SUM, "sum")

/* buffer lifetimes: X(ENUM, name) */
#define MF_LIFETIME_LIST(X)          \
    X(PERSISTENT, "persistent")      \
    X(STEP, "step")                  \
    X(MICROBATCH, "microbatch")

/* buffer kinds: X(ENUM, name, role) -- what a buffer holds */
#define MF_BUFKIND_LIST(X)                                                   \
    X(MAIN_WEIGHT, "main_weight", MAIN_WEIGHT) /* fp32 master at O        */ \
    X(WEIGHT, "weight", WEIGHT)                /* compute weight at rest, W */ \
    X(WEIGHT_STAGE, "weight_stage", WEIGHT)    /* intermediate of T1/T2     */ \
    X(WEIGHT_FULL, "weight_full", WEIGHT)      /* unsharded, Rep; W != Rep  */ \
    X(GRAD_LOCAL, "grad_local", GRAD)          /* trainer's microbatch grad */ \
    X(GRAD_STAGE, "grad_stage", GRAD)          /* intermediate of T3/T4     */ \
    X(GRAD, "grad", GRAD)                      /* accumulation buffer at G  */ \
    X(GRAD_FINAL, "grad_final", GRAD)          /* delivered gradient at O   */

/*
 * ops: X(ENUM, name, is_collective, need, becomes, at, stream, comment) -- the
 * one table of what each op does (docs/semantics.md §2, docs/semantics.md §4.2). The
 * structural checker (core/mf_struct.c), the transition search
 * (planner/passes/mf_transition.c) and the plan bounds (planner/plan/mf_plan_bound.c)
 * derive their moves from it.
 *   is_collective  the op communicates over its axis group
 *   need, becomes  the placement the op needs on its axis, and the one it
 *                  leaves there; NONE for the ops that keep the placement
 *   at             which axis, relative to the Flat suffix s..k-1 of the
 *                  op's source: FLAT_START (j = s), OUTSIDE_FLAT (j = s-1,
 *                  k-1 while nothing is Flat), ANY_AXIS, or NO_AXIS (the op
 *                  has no `axis` field)
 *   stream         AXIS: the stream of its axis (mf_axis_stream); FED: the
 *                  stream of the collective it feeds, never compute; ANY
 * The comment is the op's meaning; the full semantics are in the header
 * comment above and docs/schedule.md.
 */
#define MF_OPKIND_LIST(X)                                                                                        \
    X(ALL_GATHER, "all_gather", 1, FLAT, REPLICATE, FLAT_START, AXIS, "concat shards over an axis group")       \
    X(REDUCE_SCATTER, "reduce_scatter", 1, PARTIAL, FLAT, OUTSIDE_FLAT, AXIS, "reduce, keep this rank's shard") \
    X(ALL_REDUCE, "all_reduce", 1, PARTIAL, REPLICATE, ANY_AXIS, AXIS, "reduce over an axis group")             \
    X(SLICE, "slice", 0, REPLICATE, FLAT, OUTSIDE_FLAT, FED, "keep this rank's shard of a replicated buffer")   \
    X(CAST, "cast", 0, NONE, NONE, NO_AXIS, FED, "convert dtype elementwise")                                   \
    X(ACCUMULATE, "accumulate", 0, NONE, NONE, NO_AXIS, FED, "copy on microbatch 0, add after")                 \
    X(RECORD, "record", 0, NONE, NONE, NO_AXIS, ANY, "mark an event on this stream")                            \
    X(WAIT, "wait", 0, NONE, NONE, NO_AXIS, ANY, "wait for an event recorded on another stream")

/* One enum per table: MF_<prefix><ENUM> per row, then the count. */
#define MF_ENUM_DTYPE(E, ...) MF_##E,
#define MF_ENUM_PLACE(E, ...) MF_PLACE_##E,
#define MF_ENUM_ROLE(E, ...) MF_ROLE_##E,
#define MF_ENUM_PHASE(E, ...) MF_PHASE_##E,
#define MF_ENUM_WHEN(E, ...) MF_WHEN_##E,
#define MF_ENUM_STREAM(E, ...) MF_STREAM_##E,
#define MF_ENUM_REDUCE(E, ...) MF_REDUCE_##E,
#define MF_ENUM_LIFETIME(E, ...) MF_LIFETIME_##E,
#define MF_ENUM_BUF(E, ...) MF_BUF_##E,
#define MF_ENUM_OP(E, ...) MF_OP_##E,
typedef enum { MF_DTYPE_LIST(MF_ENUM_DTYPE) MF_DTYPE_COUNT } mf_dtype;
typedef enum { MF_PLACE_LIST(MF_ENUM_PLACE) MF_PLACE_COUNT } mf_place;
typedef enum { MF_ROLE_LIST(MF_ENUM_ROLE) MF_ROLE_COUNT } mf_role;
typedef enum { MF_PHASE_LIST(MF_ENUM_PHASE) MF_PHASE_COUNT } mf_phase;
typedef enum { MF_WHEN_LIST(MF_ENUM_WHEN) MF_WHEN_COUNT } mf_when;
typedef enum { MF_STREAM_LIST(MF_ENUM_STREAM) MF_STREAM_COUNT } mf_stream;
typedef enum { MF_REDUCE_LIST(MF_ENUM_REDUCE) MF_REDUCE_COUNT } mf_reduce;
typedef enum { MF_LIFETIME_LIST(MF_ENUM_LIFETIME) MF_LIFETIME_COUNT } mf_lifetime;
typedef enum { MF_BUFKIND_LIST(MF_ENUM_BUF) MF_BUFKIND_COUNT } mf_bufkind;
typedef enum { MF_OPKIND_LIST(MF_ENUM_OP) MF_OPKIND_COUNT } mf_opkind;

/* The op table's columns (MF_OPKIND_LIST). MF_PLACE_NONE: no placement
 * (need and becomes of the ops that keep it); past MF_PLACE_DISTINCT. */
#define MF_PLACE_NONE (MF_PLACE_COUNT + 1)
typedef enum { MF_OPAT_NO_AXIS, MF_OPAT_ANY_AXIS, MF_OPAT_FLAT_START, MF_OPAT_OUTSIDE_FLAT } mf_opat;
typedef enum { MF_OPSTREAM_AXIS, MF_OPSTREAM_FED, MF_OPSTREAM_ANY } mf_opstream;

typedef struct mf_opkind_info {
    const char *name;
    bool collective;
    int need, becomes;      /* mf_place, or MF_PLACE_NONE */
    mf_opat at;
    mf_opstream stream;
    const char *doc;
} mf_opkind_info;

/* Names for the enums above; NULL for an out-of-range value. */
const char *mf_dtype_name(mf_dtype d);
const char *mf_place_name(mf_place p);
const char *mf_role_name(mf_role r);
const char *mf_phase_name(mf_phase p);
const char *mf_when_name(mf_when w);
const char *mf_stream_name(mf_stream s);
const char *mf_reduce_name(mf_reduce r);
const char *mf_lifetime_name(mf_lifetime l);
const char *mf_bufkind_name(mf_bufkind k);
const char *mf_opkind_name(mf_opkind k);
size_t mf_dtype_size(mf_dtype d);
mf_role mf_bufkind_role(mf_bufkind k);
/* The op table's row of k; NULL for an out-of-range value. */
const mf_opkind_info *mf_opkind_info_of(mf_opkind k);
bool mf_opkind_is_collective(mf_opkind k);
/* The op works along one mesh axis (collectives and slice: at is not NO_AXIS). */
bool mf_opkind_on_axis(mf_opkind k);
/* The op kind whose single-axis move turns placement a into b on its axis,
 * or -1 when none does (a == b: nothing to do; P -> F -> R: two moves). */
int mf_opkind_for_move(mf_place a, mf_place b);
char mf_place_letter(mf_place p);

/* Reverse lookups: return the value, or -1 when the name is unknown. */
int mf_dtype_from_name(const char *s);
int mf_place_from_name(const char *s);
int mf_role_from_name(const char *s);
int mf_phase_from_name(const char *s);
int mf_when_from_name(const char *s);
int mf_stream_from_name(const char *s);
int mf_reduce_from_name(const char *s);
int mf_lifetime_from_name(const char *s);
int mf_bufkind_from_name(const char *s);
int mf_opkind_from_name(const char *s);

/* ---- the model ---- */

typedef struct mf_axis {
    const char *name;
    int64_t size;           /* ranks along this axis, >= 1 */
} mf_axis;

typedef struct mf_mesh {
    int naxes;              /* 1..MF_MAX_AXES, outermost first */
    mf_axis axes[MF_MAX_AXES];
    int64_t world;          /* product of the sizes */
} mf_mesh;

/* One placement entry per mesh axis (entries past naxes are unused). */
typedef struct mf_placement {
    uint8_t p[MF_MAX_AXES]; /* mf_place values */
} mf_placement;

typedef struct mf_tensor {
    const char *name;       /* full name: unit name + "." + tensor name */
    int ndims;
    int64_t dims[MF_MAX_DIMS];
    int64_t numel;          /* product of dims */
    int64_t offset;         /* first element within the bucket's flat buffer */
    /* Global names of a tensor Distinct on some axis (key `global`,
     * docs/schedule.md): nglobal == 0 when none. Rename (global_split false):
     * one full name per coordinate combination of the bucket's Distinct axes,
     * row-major, outermost axis first; split: nglobal == 1, the global tensor
     * is the coordinates' tensors concatenated along dim global_dim in that
     * order. The strings live in the schedule's arena. */
    int nglobal;
    const char **global;
    bool global_split;
    int global_dim;
} mf_tensor;

typedef struct mf_bucket {
    const char *name;       /* e.g. "layers.3/hfsdp", unique in the schedule */
    int unit;               /* index into units: the first unit whose tensors it holds */
    int last_unit;          /* last unit whose tensors it holds (== unit unless small
                               buckets of consecutive units were merged, bucket_size) */
    const char *layout;     /* layout name it came from (for humans) */
    mf_dtype dtype[MF_ROLE_COUNT];
    mf_placement place[MF_ROLE_COUNT];
    bool whole[MF_ROLE_COUNT]; /* the role is `Whole` on its Flat axes: every tensor lies
                               inside one shard (its owner's); only grad and main_weight
                               (docs/semantics.md §1 and docs/semantics.md §4.6) */
    int64_t *bounds;        /* ragged shards of a whole bucket (format 7,
                               docs/semantics.md §4.6): P + 1 element offsets, P the
                               shard count of the finest whole role
                               (mf_layout_bucket_fine); shard q of it is
                               [bounds[q], bounds[q+1]), bounds[P] == length. NULL for a
                               bucket with no whole role: equal shards of L / shards. In
                               the schedule's arena */
    int64_t length;         /* padded flat length L, elements (global) */
    int64_t used;           /* elements covered by tensors incl. alignment gaps */
    int ntensors;
    mf_tensor *tensors;     /* in declaration order; in offset order (shard by shard)
                               when a role is whole */
} mf_bucket;

typedef struct mf_unit {
    const char *name;
    bool reshard_after_forward;
    int first_bucket;       /* buckets [first_bucket, first_bucket + nbuckets) */
    int nbuckets;
} mf_unit;

typedef struct mf_buffer {
    const char *name;       /* e.g. "layers.3/hfsdp.weight_full" */
    int bucket;
    mf_bufkind kind;
    mf_dtype dtype;
    mf_placement place;
    int64_t count;          /* elements per rank */
    mf_lifetime lifetime;
    int64_t offset;         /* bytes from the start of its region: the persistent
                               region for persistent buffers, else the transient
                               arena (planner/passes/mf_assign.c; docs/semantics.md §10) */
} mf_buffer;

typedef struct mf_op {
    int id;                 /* == index in ops[]; issue order within a hook */
    mf_phase phase;
    int unit;               /* hook unit that issues it; -1 for step_begin/step_end */
    mf_when when;
    mf_stream stream;
    mf_opkind kind;
    int transition;         /* 1..4 for T1..T4, 0 for events */
    int bucket;             /* bucket the data belongs to; -1 for events */
    int axis;               /* mesh axis for collectives and slice; -1 otherwise */
    mf_dtype dtype;         /* element type moved (dst's dtype for cast) */
    int64_t count;          /* elements per rank (NCCL convention) */
    int src, dst;           /* buffer ids; -1 when none */
    int event;              /* record/wait: event id; -1 otherwise */
} mf_op;

/* Per-step totals; derived from the ops by mf_schedule_summarize(). */
typedef struct mf_summary {
    int64_t collectives[MF_OPKIND_COUNT][MF_MAX_AXES]; /* launches per step */
    int64_t bytes[MF_MAX_AXES];      /* bytes sent per rank per step (ring) */
    int64_t persistent_bytes[MF_ROLE_COUNT]; /* per rank */
    int64_t model_bytes[MF_ROLE_COUNT];       /* per rank, incl. transients: the
                                                prefetch-window model by role */
    int64_t live_bytes;      /* lower bound: most aligned transient bytes live at
                                one instant (mf_live_lower_bound) */
    int64_t interference_bytes; /* lower bound with one offset per buffer:
                                the heaviest set of pairwise interfering
                                buffers found (mf_interfere_bound) */
    int64_t allocated_bytes; /* what the runtime allocates per rank:
                                mem_persistent + mem_transient */
} mf_summary;

typedef struct mf_schedule {
    mf_arena *arena;        /* owns everything below */
    const char *source;     /* spec path as given on the command line */
    char source_sha256[65]; /* lowercase hex */
    mf_mesh mesh;
    int64_t microbatches;   /* M >= 1 */
    mf_reduce reduce;
    int64_t align;          /* shard alignment, bytes */
    int prefetch;           /* prefetch depth (units), >= 1 */
    int64_t mem_persistent; /* bytes of the persistent region per rank */
    int64_t mem_transient;  /* bytes of the transient arena per rank */
    int nunits, nbuckets, nbuffers, nops, nevents;
    mf_unit *units;         /* forward order */
    mf_bucket *buckets;
    mf_buffer *buffers;
    mf_op *ops;
    mf_summary summary;
    uint8_t hash[32];       /* sha256 of the schedule file (set by the loader/emitter) */
    bool programs;          /* has the short-step and evaluation programs (format 4;
                               set by planner/passes/mf_programs.c and the loader) */
} mf_schedule;

/* Returns an owned, empty schedule with its arena; NULL on OOM. */
mf_schedule *mf_schedule_new(void);
/* Takes the schedule; NULL is ignored. */
void mf_schedule_free(mf_schedule *s);

/* Recomputes s->summary from the ops, buffers and microbatch count
 * (core/mf_summary.c). Returns false (summary zeroed) when out of memory. */
bool mf_schedule_summarize(mf_schedule *s);

/* Bytes one rank sends for one launch of a collective on an axis of size n
 * (ring algorithms): all_gather and reduce_scatter (n-1)*count*size,
 * all_reduce 2*(n-1)*ceil(count/n)*size; 0 for local ops and n == 1. */
int64_t mf_schedule_collective_bytes(mf_opkind k, int64_t n, int64_t count, mf_dtype d);

/* The stream of the collectives on mesh axis `axis` of a mesh of naxes axes:
 * inner for the innermost axis, outer for the others (one stream per
 * communicator keeps their order the same on every rank). */
mf_stream mf_axis_stream(int naxes, int axis);

/* Times an op with predicate `when` at phase `phase` runs per (full) step;
 * 0 for the short-step and evaluation programs. */
int64_t mf_when_runs_per_step(mf_when when, mf_phase phase, int64_t microbatches);
/* Where a hook is issued, for predicates: bits of the microbatch position
 * (first, last; both for M = 1 and for the once-per-step hooks), or a short
 * step's end (alone). */
enum { MF_POS_MIDDLE = 0, MF_POS_FIRST = 1, MF_POS_LAST = 2, MF_POS_SHORT = 4 };
/* Whether an op with predicate w runs at a hook issued at `pos`: short only
 * at a short step's end, which runs nothing else; every anywhere else;
 * first and last at their positions. */
bool mf_when_holds(mf_when w, unsigned pos);
/* The runs the verifiers replay in a row (docs/schedule.md §5), standing for
 * every sequence of steps and evaluation passes: each entry is a step of
 * that many microbatch positions (min(M, 3): first, middle, last; fewer is a
 * short step) or 0 for an evaluation pass. Without the programs
 * (!s->programs): two full steps. Returns the count (at most
 * MF_REPLAY_RUNS_MAX). */
#define MF_REPLAY_RUNS_MAX 10
int mf_schedule_replay_runs(const mf_schedule *s, int runs[MF_REPLAY_RUNS_MAX]);
/* A data op (not a record or a wait). */
bool mf_op_is_data(const mf_op *op);
/* step_begin or step_end: once per step, unit -1. */
bool mf_phase_is_step(mf_phase phase);
/* eval_forward_pre or eval_forward_post: the evaluation program. */
bool mf_phase_is_eval(mf_phase phase);
/* The op belongs to the full training step (not to the short-step or the
 * evaluation program): what the live intervals, the buffer assignment and
 * the per-step totals see. */
bool mf_op_in_step(const mf_op *op);

/* Placement helpers. */
bool mf_placement_equal(const mf_placement *a, const mf_placement *b, int naxes);
/* Writes "[Replicate, Flat]" into buf (size >= 64); returns buf. */
char *mf_placement_format(const mf_placement *p, int naxes, char *buf, size_t size);
/* The name of axis j of a role's placement: `Whole` on a whole role's Flat
 * axes (mf_bucket.whole), else the placement's own name. */
const char *mf_role_place_name(const mf_placement *p, int j, bool whole);
/* mf_placement_format with mf_role_place_name: "[Partial, Whole]". */
char *mf_placement_format_as(const mf_placement *p, int naxes, bool whole, char *buf, size_t size);
/* Some axis of p is Distinct. */
bool mf_placement_has_distinct(const mf_placement *p, int naxes);
/* `fill` on every axis, except the Distinct axes of `keep` (NULL: none),
 * which stay Distinct: the all-Replicate and all-Partial placements of a
 * bucket (weight_full, grad_local) with its Distinct axes. */
mf_placement mf_placement_uniform(mf_place fill, const mf_placement *keep, int naxes);
/* Writes "RF"-style letters; buf size >= MF_MAX_AXES + 1. */
char *mf_placement_letters(const mf_placement *p, int naxes, char *buf);

#endif
