/*
 * mf_gpu_plan: the GPU backends' reading of a schedule, computed once at
 * create, pure C (no CUDA, no NCCL), so its logic is tested on any machine.
 *
 * It answers, for one rank of a mesh:
 *   - communicators: one per mesh axis, split from the world communicator with
 *     color = mf_layout_axis_color() (the other coordinates) and key = this
 *     axis's coordinate, so each axis group is one communicator whose ranks are
 *     ordered as the schedule's shard math expects (docs/semantics.md §2), and the
 *     inner axis never shares a communicator with an outer one;
 *   - calls: what each op becomes (one NCCL call, one kernel, one copy or one
 *     event call), on which stream and communicator, with which reduction, and
 *     at which source offset (slice);
 *   - groups: per microbatch position, the runs of consecutive collectives of
 *     one hook on the same stream and communicator, issued as one
 *     ncclGroupStart/End (never mixing streams, so inner and outer are never
 *     in one group; never spanning a record, wait or kernel, which would have
 *     to run between them);
 *   - graph regions: per microbatch position (first, middle, last, or only when
 *     M == 1) the hooks one CUDA graph captures, where the inner and outer
 *     streams fork from and join back into the compute stream, and the waits
 *     whose event was recorded before the region (satisfied by graph launch
 *     order on the compute stream, so not captured: a capture cannot wait on
 *     an event recorded outside it).
 *
 * Hook order (the order the trainer calls hooks in one microbatch): forward_pre
 * and forward_post of units 0..U-1, then backward_pre and backward_post of
 * units U-1..0; step_begin precedes microbatch 0 and step_end follows M-1.
 *
 * Ownership: mf_gpu_plan_build() returns an owned plan that borrows the
 * schedule (which must outlive it); mf_gpu_plan_free() releases it.
 */
#ifndef MF_GPU_PLAN_H
#define MF_GPU_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mf_schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What an op becomes on the device: X(ENUM, API call, is NCCL). One per op kind. */
#define MF_GPU_CALL_LIST(X)                          \
    X(ALL_GATHER, "ncclAllGather", 1)                \
    X(REDUCE_SCATTER, "ncclReduceScatter", 1)        \
    X(ALL_REDUCE, "ncclAllReduce", 1)                \
    X(SLICE, "cudaMemcpyAsync", 0)                   \
    X(CAST, "mf_cuda_cast", 0)                       \
    X(ACCUMULATE, "mf_cuda_accumulate", 0)           \
    X(RECORD, "cudaEventRecord", 0)                  \
    X(WAIT, "cudaStreamWaitEvent", 0)

#define MF_GPU_CALL_ITEM(E, ...) MF_GPU_CALL_##E,
typedef enum { MF_GPU_CALL_LIST(MF_GPU_CALL_ITEM) MF_GPU_CALL_COUNT } mf_gpu_call;
#undef MF_GPU_CALL_ITEM

/* Reduction an NCCL collective uses. */
typedef enum { MF_GPU_RED_NONE, MF_GPU_RED_SUM, MF_GPU_RED_AVG } mf_gpu_red;

/* Microbatch positions: which `when` predicates hold. */
#define MF_GPU_POS_LIST(X)  \
    X(FIRST, "first")       \
    X(MIDDLE, "middle")     \
    X(LAST, "last")         \
    X(ONLY, "only")

#define MF_GPU_POS_ITEM(E, ...) MF_GPU_POS_##E,
typedef enum { MF_GPU_POS_LIST(MF_GPU_POS_ITEM) MF_GPU_POS_COUNT } mf_gpu_pos;
#undef MF_GPU_POS_ITEM

/* One op as the device sees it. */
typedef struct mf_gpu_launch {
    mf_gpu_call call;
    mf_stream stream;       /* compute = the trainer's stream */
    int comm;               /* axis whose communicator runs it; -1 for local ops */
    mf_gpu_red red;         /* reductions only */
    int64_t src_offset;     /* elements into src (slice: c_axis * count), else 0 */
} mf_gpu_launch;

/* A hook, as the trainer calls it. */
typedef struct mf_gpu_hook {
    mf_phase phase;
    int unit;               /* -1 for step_begin/step_end */
} mf_gpu_hook;

/* What a CUDA graph of one microbatch position captures. */
typedef struct mf_gpu_region {
    bool present;           /* the position occurs for this M */
    int nhooks;
    mf_gpu_hook *hooks;     /* in call order; fork at hooks[0], join after hooks[nhooks-1] */
    int nops;
    int *ops;               /* op ids issued in the region, in issue order */
    bool stream_used[MF_STREAM_COUNT]; /* streams with an op in the region */
} mf_gpu_region;

typedef struct mf_gpu_plan {
    const mf_schedule *s;   /* borrowed */
    int64_t rank;
    int64_t coords[MF_MAX_AXES];
    int color[MF_MAX_AXES]; /* ncclCommSplit color per axis */
    int key[MF_MAX_AXES];   /* ncclCommSplit key per axis (== coords) */
    mf_gpu_launch *launch;  /* [s->nops] */
    /* Groups per position: group[p][op] is the group index of an issued
     * collective that shares its group with another, -1 otherwise;
     * group_begin/group_end mark its first and last member. */
    int *group[MF_GPU_POS_COUNT];
    bool *group_begin[MF_GPU_POS_COUNT];
    bool *group_end[MF_GPU_POS_COUNT];
    int ngroups[MF_GPU_POS_COUNT];
    /* Graph regions per position; elided[p][op]: a wait in region p whose
     * event's latest record precedes the region (not captured). */
    mf_gpu_region region[MF_GPU_POS_COUNT];
    bool *elided[MF_GPU_POS_COUNT];
    /* hook_last[p][op]: the op is the last one its hook issues at position p
     * (where a host trainer may touch buffers next). */
    bool *hook_last[MF_GPU_POS_COUNT];
} mf_gpu_plan;

/* Name of a call ("ncclAllGather", ...), of a position; NULL out of range. */
const char *mf_gpu_call_name(mf_gpu_call c);
bool mf_gpu_call_is_nccl(mf_gpu_call c);
const char *mf_gpu_pos_name(mf_gpu_pos p);

/* The position of microbatch m of M (M >= 1, 0 <= m < M). */
mf_gpu_pos mf_gpu_plan_position(int64_t m, int64_t M);
/* Does an op with predicate `when` run at position p? */
bool mf_gpu_plan_when_holds(mf_when when, mf_gpu_pos p);

/* Split color and key of `rank` for the communicator of `axis`. */
void mf_gpu_plan_split(const mf_mesh *m, int axis, int64_t rank, int *color, int *key);

/* The hooks of one microbatch at position p, in call order (step_begin first
 * for first/only, step_end last for last/only). Writes at most cap hooks and
 * returns how many there are (2 + 4 * nunits at most). */
int mf_gpu_plan_hooks(const mf_schedule *s, mf_gpu_pos p, mf_gpu_hook *out, int cap);

/* Returns an owned plan for `rank`, or NULL with a message in err[0..errlen)
 * (out of memory, rank out of range, an op this plan cannot map). */
mf_gpu_plan *mf_gpu_plan_build(const mf_schedule *s, int64_t rank, char *err, size_t errlen);
/* Takes the plan; NULL is ignored. */
void mf_gpu_plan_free(mf_gpu_plan *p);

/* Prints the plan (one line per launch, groups and regions) for humans and
 * golden tests. */
void mf_gpu_plan_dump(const mf_gpu_plan *p, FILE *out);

#ifdef __cplusplus
}
#endif

#endif
