/*
 * mf_rt_schedule: the schedule handle (mfsdp_schedule) behind the public
 * schedule API: loading a schedule file or buffer (with the verifier's
 * checks on load, docs/runtime.md §2, and a hint when the input is a .mfsdp
 * spec), wrapping a schedule built in memory, and the schedule queries.
 *
 * Invariants: a handle is read-only after load, so any number of runtimes
 * (thread-ranks) may share it; it owns its mf_schedule.
 */
#ifndef MF_RT_SCHEDULE_H
#define MF_RT_SCHEDULE_H

#include <stddef.h>

#include "mf_schedule.h"
#include "mfsdp.h"

typedef struct mf_rt_tensor {
    int bucket;             /* bucket holding the tensor */
    int index;              /* index in the bucket's tensors */
    int unit;               /* unit whose hooks bracket its compute */
} mf_rt_tensor;

struct mfsdp_schedule {
    mf_schedule *s;         /* owned */
    int ntensors;
    mf_rt_tensor *tensors;  /* schedule order (bucket, then declaration); in s->arena */
};

/* Wraps an owned mf_schedule into a handle (takes s; frees it on failure).
 * Checks what the runtime relies on beyond the loader (buffers per bucket,
 * op operands, event streams); on a failure returns MFSDP_ERR_LOAD with the
 * message in err. */
mfsdp_result mf_rt_schedule_wrap(mf_schedule *s, mfsdp_schedule **out, char *err, size_t errlen);

/* What every description of tensor k (0 <= k < h->ntensors) begins with, the
 * tensor info and the views alike: its full name (borrowed from the
 * schedule), unit, ndims, dims (the first MFSDP_MAX_DIMS) and numel. */
void mf_rt_schedule_tensor_id(const mfsdp_schedule *h, int k, const char **name, int *unit, int *ndims,
                              int64_t dims[MFSDP_MAX_DIMS], int64_t *numel);

#endif
