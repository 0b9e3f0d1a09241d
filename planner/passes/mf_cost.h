/*
 * mf_cost: the alpha-beta cost model per mesh axis (ring algorithms), used by
 * the transition pass to choose between legal compositions and by `simulate`
 * to time a schedule.
 *
 *   all_gather / reduce_scatter on n ranks, per-rank count c elements of b bytes:
 *       t = (n-1) * (alpha + c*b / beta)
 *   all_reduce, count c:  t = 2*(n-1) * (alpha + (c/n)*b / beta)
 *   every collective adds a fixed `launch` (also on an axis of size 1)
 *   local ops (cast, slice, accumulate): t = bytes touched / local_bw
 *       (cast and slice read and write c elements: 2*c*b; accumulate 3*c*b)
 *
 * Defaults (documented in docs/semantics.md): the innermost axis is an
 * NVLink-class link, every other axis an InfiniBand-class link.
 */
#ifndef MF_COST_H
#define MF_COST_H

#include "mf_schedule.h"

typedef struct mf_link {
    double alpha;           /* seconds per ring step (latency) */
    double beta;            /* bytes per second per rank (bandwidth) */
} mf_link;

typedef struct mf_cost_model {
    mf_link axis[MF_MAX_AXES];  /* per mesh axis */
    double local_bw;        /* bytes per second for local ops */
    double launch;          /* seconds of fixed overhead per collective launch
                               (kernel launch, proxy hand-off, stream event) */
} mf_cost_model;

/* Fills the defaults for a mesh: innermost axis NVLink-class, others IB-class. */
void mf_cost_defaults(mf_cost_model *cm, const mf_mesh *mesh);

/* Seconds for one launch of an op on axis `axis` (ignored for local ops)
 * moving `count` elements per rank of dtype d (NCCL convention). */
double mf_cost_op(const mf_cost_model *cm, const mf_mesh *mesh, mf_opkind kind, int axis,
                  int64_t count, mf_dtype d);

/* Seconds for one launch of an op that sends `bytes` per rank
 * (mf_layout_collective_bytes): mf_cost_op when that is the ring's figure for
 * `count`; else (a whole bucket's used-prefix form, docs/semantics.md §6.1) the
 * ring's launch and latency steps plus the bytes at the link's rate. */
double mf_cost_op_bytes(const mf_cost_model *cm, const mf_mesh *mesh, mf_opkind kind, int axis,
                        int64_t count, int64_t bytes, mf_dtype d);

/*
 * Parses a command-line option of the form --inner-bw=GBPS, --outer-bw=GBPS,
 * --inner-lat=US, --outer-lat=US, --axis-bw=NAME:GBPS, --axis-lat=NAME:US,
 * --local-bw=GBPS, --launch-lat=US. Returns 1 when the option was consumed, 0 when it is not a
 * cost option, -1 (with a message on stderr) when its value is malformed.
 */
int mf_cost_parse_option(mf_cost_model *cm, const mf_mesh *mesh, const char *arg);

/* True when arg looks like one of the options above (its value unchecked);
 * lets a command sort its arguments before the mesh is known. */
bool mf_cost_is_option(const char *arg);

#endif
