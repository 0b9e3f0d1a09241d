/*
 * rt_testlib: helpers shared by the runtime tests: the model used across the
 * mode x mesh matrix, builder schedules wrapped into public handles, and the
 * oracle run on the local backend.
 */
#ifndef RT_TESTLIB_H
#define RT_TESTLIB_H

#include "mf_check.h"
#include "mf_rt.h"
#include "mf_test_builder.h"

typedef struct rt_mesh {
    const char *name;
    int naxes;
    int64_t sizes[MF_MAX_AXES];
} rt_mesh;

extern const rt_mesh rt_meshes[];
extern const int rt_nmeshes;

/* A three-unit model with sizes that divide by nothing: unit 1 also has a
 * tensor in a second, all-replicated layout; the last unit keeps its weights
 * after forward. */
void rt_model_spec(mf_tb_spec *spec, const char *mode, const rt_mesh *mesh, int64_t microbatches,
                   mf_reduce reduce);

/* Builds and wraps; fails the test on error. */
mfsdp_schedule *rt_build(const mf_tb_spec *spec);

/* Runs the oracle on the local backend for `steps` steps; returns rank 0's
 * outcome rc and copies rank 0's message into msg. */
int rt_check_local(const mfsdp_schedule *sh, int64_t steps, uint32_t flags, char *msg, size_t msglen);

#endif
