/*
 * mf_simulate: times one training step of a schedule on a three-stream model
 * (compute, inner, outer) and draws it (Chrome trace JSON, SVG).
 *
 * The model (docs/simulate.md):
 *   - The trainer calls the hooks in order: step_begin; for each microbatch m:
 *     forward_pre(u) / forward_post(u) for u = 0..U-1, backward_pre(u) /
 *     backward_post(u) for u = U-1..0; step_end. At each hook the ops of that
 *     phase and unit whose `when` holds for m are issued in id order onto
 *     their streams (mf_schedule.h). Between a unit's pre and post hooks the
 *     trainer issues one compute segment of that unit on the compute stream.
 *   - The trainer's thread is the compute stream (host-synchronous, the
 *     default): a hook is called when the compute stream has finished all
 *     work issued before it, so an op cannot start before that time. This is
 *     how the schedule's prefetch depth takes effect: the lowering issues a
 *     gather `prefetch` units early, and it starts when the compute of that
 *     earlier unit starts. With host_async the host runs arbitrarily far
 *     ahead (every hook issues at time 0) and only events order the streams.
 *   - Issuing itself takes no time; every stream executes its items in issue
 *     order, one at a time.
 *   - `record` marks the stream's progress; `wait` holds its stream until the
 *     latest `record` of the same event issued before it has executed. A wait
 *     with no earlier record does not block (CUDA semantics) and is counted.
 *   - Collectives and local ops take mf_cost_op() seconds (alpha-beta per
 *     axis, mf_cost.h); record and wait take no time. Compute takes explicit
 *     per-unit times, or 6 * params * tokens / FLOP rate for forward+backward,
 *     split 1:2 between forward and backward.
 *
 * Because a wait only depends on items issued before it, and a hook's issue
 * time only on compute items issued before it, one pass over the
 * items in issue order computes every start and end time exactly (list
 * scheduling); no priority queue is needed. The step ends when every stream
 * has drained.
 *
 * Exposed communication is communication during which compute sits idle
 * waiting for it. The compute stream is idle before each wait that blocked
 * it and after its last item until the step ends; each such interval is
 * charged to the stream compute is transitively waiting for: walking back
 * from the record the wait matched, each item's start was fixed either by
 * the previous item of its stream or by the record its own wait matched
 * (`pred`), and that chain covers the interval without gaps. So
 * exposed[inner] + exposed[outer] = step time - busy[compute], and
 * hidden = busy - exposed per stream.
 *
 * The critical path is the same chain walked back from the last item to
 * finish; on_path[] is the time it spends on each stream (summing to the
 * step time). It names what bounds the step; exposed[] names what compute
 * waited for.
 */
#ifndef MF_SIMULATE_H
#define MF_SIMULATE_H

#include <stdio.h>

#include "mf_cost.h"
#include "mf_schedule.h"

/* One thing a stream executes: an instance of an op (an op with when=every
 * runs once per microbatch), or a compute segment of a unit. */
typedef struct mf_sim_item {
    int op;                 /* op id; -1 for a compute segment */
    int unit;               /* hook unit (op) or computing unit; -1 for step_begin/end */
    int microbatch;         /* -1 for step_begin/step_end ops */
    mf_phase phase;         /* hook that issued it; compute: FORWARD_PRE or BACKWARD_PRE */
    mf_stream stream;       /* stream it ran on (after the single-stream remap) */
    double start, end;      /* seconds since the start of the step */
    int pred;               /* item whose end fixed this start; -1 when it started at 0 */
    int dep;                /* wait: the record item it waited for; -1 otherwise */
    int64_t bytes;          /* collectives: bytes sent per rank (ring); local ops:
                               bytes read + written; 0 otherwise */
    bool blocked;           /* the start was fixed by dep, not by the stream */
    bool host_gated;        /* the start was fixed by the hook's issue time */
    bool critical;          /* on the critical path */
} mf_sim_item;

/* A piece of exposed communication: compute idle in [t0, t1) waiting for item. */
typedef struct mf_sim_span {
    double t0, t1;          /* seconds since the start of the step */
    mf_stream stream;       /* stream of the communication charged */
    int item;               /* the item running on that stream then */
} mf_sim_span;

typedef struct mf_sim_config {
    mf_cost_model cost;     /* per-axis alpha-beta and local bandwidth */
    double flops;           /* FLOP/s per rank for compute (default 400e12) */
    double tokens;          /* tokens per microbatch per rank (default 4096) */
    double unit_time;       /* > 0: forward seconds of every unit per microbatch
                               (backward twice that); overrides flops/tokens */
    const double *fwd_time; /* optional, per unit, seconds; overrides the above */
    const double *bwd_time; /* optional, per unit, seconds */
    bool single_stream;     /* run the outer stream's ops on the inner stream */
    bool host_async;        /* the host runs ahead of the GPU: hooks issue at time 0
                               (default false: host-synchronous, see above) */
    bool time_only;         /* fill the step time, busy, bytes and launches only:
                               no items (nitems counts them, items is NULL), no
                               critical path, no exposed spans, overlap 0 (the
                               plan search's lower bound needs the step time) */
} mf_sim_config;

typedef struct mf_sim_result {
    double step_time;                   /* seconds */
    double busy[MF_STREAM_COUNT];       /* seconds each stream executes something */
    double exposed[MF_STREAM_COUNT];    /* seconds compute idled waiting for this stream
                                           (0 for compute itself) */
    double on_path[MF_STREAM_COUNT];    /* seconds of the critical path on each stream */
    double comm_busy;                   /* busy[inner] + busy[outer] */
    double comm_exposed;                /* exposed[inner] + exposed[outer] */
    double overlap;                     /* (comm_busy - comm_exposed) / comm_busy; 1 when no comm */
    double compute_time;                /* sum of compute segments */
    int64_t bytes[MF_MAX_AXES];         /* bytes sent per rank per step, by axis */
    int64_t launches[MF_MAX_AXES];      /* collective launches per step, by axis */
    int64_t unit_params_total;          /* elements of all tensors (for FLOPs) */
    int unmatched_waits;                /* waits issued before any record of their event */
    int same_stream_waits;              /* waits whose record ran on the same stream */
    int nitems;
    mf_sim_item *items;                 /* owned; in issue order */
    int ncritical;
    int *critical;                      /* owned; item indices of the critical path with
                                           non-zero duration, in time order */
    int nexposed_spans;
    mf_sim_span *exposed_spans;         /* owned; in time order */
} mf_sim_result;

/* Fills the defaults: mf_cost_defaults() for the mesh, 400 TFLOP/s, 4096 tokens. */
void mf_sim_config_defaults(mf_sim_config *cfg, const mf_mesh *mesh);

/*
 * Simulates one step of s (borrowed) under cfg (borrowed). On success fills
 * *r (owned by the caller, release with mf_sim_result_free) and returns 0.
 * Returns -1 with a message in err[0..errlen) when the schedule cannot be
 * simulated (an op referencing a unit, stream or axis out of range) or memory
 * runs out; *r is then empty.
 */
int mf_simulate(const mf_schedule *s, const mf_sim_config *cfg, mf_sim_result *r, char *err,
                size_t errlen);
void mf_sim_result_free(mf_sim_result *r);

/* Seconds of compute of unit u per microbatch: forward and backward. */
void mf_simulate_unit_times(const mf_schedule *s, const mf_sim_config *cfg, int u, double *fwd,
                            double *bwd);

/* Short label of an item, e.g. "all_gather layers.3" or "fwd layers.3"; writes
 * into buf (size >= 16) and returns buf. */
char *mf_sim_item_label(const mf_schedule *s, const mf_sim_item *it, char *buf, size_t size);

/* Writes the human-readable report (step time, per-stream busy/exposed,
 * overlap, bytes, critical path) to out. */
void mf_simulate_report(FILE *out, const mf_schedule *s, const mf_sim_result *r, bool full_path);

/* mf_trace.c: Chrome trace JSON (Perfetto). Returns 0, or -1 on a write error. */
int mf_trace_write(FILE *out, const mf_schedule *s, const mf_sim_result *r);

/* mf_svg.c: a self-contained SVG picture of the timeline, of the window
 * [t0, t1) seconds (the whole step when t1 <= t0). Returns 0 or -1. */
int mf_svg_write(FILE *out, const mf_schedule *s, const mf_sim_result *r, double t0, double t1);

#endif
