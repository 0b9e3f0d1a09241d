/*
 * mf_struct: the structural rules of a schedule, written once. The loader
 * (core/mf_load.c) runs them on every file it reads, the runtime on every
 * schedule it is handed in memory (mf_rt_schedule_wrap), the verifier
 * (core/mf_verify.c) on every schedule it checks, before its abstract
 * replay. The rules (mf_schedule.h states them; docs/schedule.md explains):
 *
 *   buffers    the normative buffer set of a bucket (one main_weight, weight,
 *              grad_local, grad; weight_full exactly when W is not all
 *              Replicate; grad_final exactly when G != O), each fixed buffer
 *              at the placement and dtype its kind demands
 *              (mf_struct_kind_placement), every buffer's count the bucket
 *              length over the shards of its placement;
 *   ops        operands in the op's bucket, dtypes that match, no in-place
 *              work except all_reduce, counts that fit the buffers per op
 *              kind and axis size (mf_struct_op_extents);
 *   events     each event recorded on one stream;
 *   distinct   an axis Distinct in a bucket's role is Distinct in all three,
 *              and no op (collective or slice) runs on a bucket's Distinct
 *              axis (docs/semantics.md §4.7).
 *
 * With MF_STRUCT_STRICT (the verifier) also the compiler's conventions: the
 * header's align and prefetch, the suffix rule and equal aligned shards of
 * every placement, 16-byte aligned tensors, persistent buffers that live
 * across the step, the stream of each op (the op table's stream column,
 * mf_axis_stream), the placement each op produces (the op table's need,
 * becomes and at, mf_struct_move), on every rank the shard the layout
 * assigns, and each event recorded exactly once and waited for on another
 * stream.
 *
 * Findings go to a sink, which decides whether to go on (the loader stops at
 * the first, the verifier collects all). A finding names the object and the
 * field it is about, so the loader can point at the YAML node.
 */
#ifndef MF_STRUCT_H
#define MF_STRUCT_H

#include "mf_schedule.h"

/* What a finding is about. */
typedef enum { MF_AT_SCHEDULE, MF_AT_BUCKET, MF_AT_BUFFER, MF_AT_OP } mf_struct_at;

/* The field of that object (MF_FIELD_NONE: the object as a whole;
 * MF_FIELD_BUFFERS on a bucket: the buffers section). */
typedef enum {
    MF_FIELD_NONE, MF_FIELD_COUNT, MF_FIELD_SRC, MF_FIELD_DST, MF_FIELD_DTYPE, MF_FIELD_LENGTH, MF_FIELD_BUFFERS
} mf_struct_field;

typedef struct mf_struct_finding {
    mf_struct_at at;
    int index;              /* bucket, buffer or op index; -1 for the schedule */
    mf_struct_field field;
    const char *msg;        /* borrowed for the call */
} mf_struct_finding;

/* Receives findings; returns false to stop checking. */
typedef bool (*mf_struct_report_fn)(void *ctx, const mf_struct_finding *f);

typedef struct mf_struct_sink {
    mf_struct_report_fn report;
    void *ctx;
    int findings;           /* reported so far */
    bool stop;              /* report returned false (or out of memory) */
} mf_struct_sink;

enum { MF_STRUCT_STRICT = 1 };

/* The placement a buffer of kind k of bucket bk must have; false for the
 * stage kinds, which may have any. */
bool mf_struct_kind_placement(const mf_schedule *s, const mf_bucket *bk, mf_bufkind k, mf_placement *out);

/* Elements an op reads from src and writes to dst, per the op semantics
 * (all_gather writes n_axis * count, reduce_scatter and slice read it).
 * False when that overflows 64 bits. */
bool mf_struct_op_extents(const mf_schedule *s, const mf_op *op, int64_t *src_need, int64_t *dst_need);
/* The op's bucket is ragged (has bounds) and its operands' placements fit it:
 * its buffers hold their placements' longest shards, and a rank moves its
 * own ranges (docs/semantics.md §4.6). */
bool mf_struct_op_ragged(const mf_schedule *s, const mf_op *op);
/* The count a ragged op must have: the longest shard of its shard side (the
 * destination of an op that shards its axis, else the source). */
int64_t mf_struct_op_count_of(const mf_schedule *s, const mf_op *op);

/* The single-axis move of op kind k on `axis` of placement src (naxes
 * axes), from the op table (MF_OPKIND_LIST's need, becomes and at): the
 * placement it leaves in *out, or false when src is not what k needs on
 * that axis or the axis is not where k works. Kinds without an axis keep
 * the placement. The structural checker, the verifier and the transition
 * search (planner/passes/mf_transition.c) all move through it. */
bool mf_struct_move(mf_opkind k, int axis, int naxes, const mf_placement *src, mf_placement *out);

/* The bounds of bucket b (docs/semantics.md §4.6): present exactly when a
 * role is Whole; P + 1 entries (the loader reads that many), 0 first,
 * non-decreasing, multiples of the shard quantum, the last == length; every
 * role's placement no finer than the finest Whole one. Run by the loader
 * before mf_struct_bucket_whole. */
void mf_struct_bucket_bounds(const mf_schedule *s, int b, mf_struct_sink *k);
/* The whole roles of bucket b (mf_bucket.whole, docs/semantics.md §4.6): only
 * grad and main_weight, with some Flat axis, and every tensor inside one shard
 * of each (mf_layout_tensor_shard). Run on every bucket by the loader (after
 * its tensors) and with the field ranges. */
void mf_struct_bucket_whole(const mf_schedule *s, int b, mf_struct_sink *k);
/* A bucket's Distinct axes: Distinct in all three roles or in none. */
void mf_struct_bucket_distinct(const mf_schedule *s, int b, mf_struct_sink *k);
/* Why a move of k was refused, from the same row: "an all-gather needs Flat
 * on its axis, the outermost Flat axis". */
void mf_struct_move_why(mf_opkind k, char *buf, size_t size);

/* mf_struct_move for an op of s: the placement op turns src into (one axis
 * changes), or false with the reason in why (mf_struct_move_why). */
bool mf_struct_op_move(const mf_schedule *s, const mf_op *op, const mf_placement *src, mf_placement *out,
                       char *why, size_t whylen);

/* "op 17 (reduce_scatter on dp_inner, layers.3/hfsdp)", "op 3 (wait of event 1
 * on compute, forward_pre of u0)": how findings name an op (its fields in
 * range). Returns buf. */
const char *mf_struct_opdesc(const mf_schedule *s, const mf_op *op, char *buf, size_t size);

/* The checks one by one, for the loader, which runs each as soon as its
 * operands are read (indices are assumed in range there). */
/* Bucket b's length splits into the shards of role r's placement and fits
 * 64 bits in bytes of r's dtype. */
void mf_struct_bucket_role(const mf_schedule *s, int b, int r, mf_struct_sink *k);
void mf_struct_buffer(const mf_schedule *s, int i, mf_struct_sink *k);
void mf_struct_bucket_buffers(const mf_schedule *s, mf_struct_sink *k);
void mf_struct_data_op(const mf_schedule *s, int i, mf_struct_sink *k);
void mf_struct_events(const mf_schedule *s, mf_struct_sink *k);

/* Every rule on a schedule built in memory: field ranges first, then the
 * rules above (and the conventions under MF_STRUCT_STRICT). Returns the
 * number of findings reported. */
int mf_struct_check(const mf_schedule *s, unsigned flags, mf_struct_sink *k);

/* Runs mf_struct_check without strictness and writes the first finding, as
 * "source: message", into err. True when there is none. */
bool mf_struct_check_first(const mf_schedule *s, char *err, size_t errlen);

#endif
