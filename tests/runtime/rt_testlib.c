/*
 * rt_testlib: see the header.
 */
#include "rt_testlib.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

const rt_mesh rt_meshes[] = {
    {"1x1", 2, {1, 1}}, {"1x4", 2, {1, 4}}, {"2x2", 2, {2, 2}},       {"2x4", 2, {2, 4}},
    {"4x2", 2, {4, 2}}, {"3x2", 2, {3, 2}}, {"2x2x2", 3, {2, 2, 2}},
};
const int rt_nmeshes = (int)(sizeof rt_meshes / sizeof rt_meshes[0]);

void rt_model_spec(mf_tb_spec *spec, const char *mode, const rt_mesh *mesh, int64_t microbatches,
                   mf_reduce reduce)
{
    memset(spec, 0, sizeof *spec);
    spec->naxes = mesh->naxes;
    for (int j = 0; j < mesh->naxes; j++)
        spec->sizes[j] = mesh->sizes[j];
    spec->microbatches = microbatches;
    spec->reduce = reduce;
    spec->nlayouts = 2;
    assert_true(mf_tb_mode(mode, mesh->naxes, &spec->layouts[0]));
    static _Thread_local char rep[MF_MAX_AXES + 1], par[MF_MAX_AXES + 1];
    for (int j = 0; j < mesh->naxes; j++) {
        rep[j] = 'R';
        par[j] = 'P';
    }
    rep[mesh->naxes] = par[mesh->naxes] = '\0';
    spec->layouts[1] = (mf_tb_layout){{MF_FP32, MF_FP32, MF_FP32}, {rep, par, rep}};
    spec->nunits = 3;
    spec->units[0] = (mf_tb_unit){"embed", false, 1, {{"weight", 1001, 0}}};
    spec->units[1] = (mf_tb_unit){"layer", false, 3, {{"w", 777, 0}, {"norm", 17, 1}, {"b", 33, 0}}};
    spec->units[2] = (mf_tb_unit){"head", true, 2, {{"w", 523, 0}, {"b", 5, 0}}};
}

mfsdp_schedule *rt_build(const mf_tb_spec *spec)
{
    char err[256];
    mf_schedule *s = mf_tb_build(spec, err, sizeof err);
    if (!s)
        fail_msg("builder: %s", err);
    mfsdp_schedule *sh = NULL;
    mfsdp_result r = mf_rt_schedule_wrap(s, &sh, err, sizeof err);
    if (r != MFSDP_OK)
        fail_msg("wrap: %s", err);
    return sh;
}

int rt_check_local(const mfsdp_schedule *sh, int64_t steps, uint32_t flags, char *msg, size_t msglen)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    mf_check_outcome *outs = calloc((size_t)world, sizeof *outs);
    assert_non_null(outs);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.timeout_ms = 60000;
    cfg.flags = flags;
    mf_check_opts o = {.steps = steps, .stop_rank = -1, .stop_step = -1, .out = NULL};
    int rc = mf_check_local(sh, NULL, &cfg, &o, outs);
    snprintf(msg, msglen, "%s", outs[0].msg);
    /* Every rank that ran allocated exactly the schedule's summary peak. */
    for (int64_t r = 0; rc == 0 && r < world; r++)
        assert_int_equal(outs[r].allocated_bytes, sh->s->summary.allocated_bytes);
    free(outs);
    return rc;
}
