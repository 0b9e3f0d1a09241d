/*
 * mf_cmd_args: what the command lines of the mfsdpc subcommands share (each
 * parsed by mf_opts): the cost options, passed through whole because their
 * values need the mesh (mf_cost_is_option; compile, explain, diff,
 * simulate, plan), the one input operand, and the compute and link model of
 * `simulate`, which `plan` takes exactly as well (MF_SIM_OPTS, one
 * configuration: mf_cmd_args_sim_config).
 *
 * Messages are "CMD: error: ..." on stderr; the subcommand decides whether
 * its usage follows.
 */
#ifndef MF_CMD_ARGS_H
#define MF_CMD_ARGS_H

#include <stdbool.h>
#include <stdio.h>

#include "mf_opts.h"
#include "mf_simulate.h"

typedef struct mf_cmd_args {
    const char *cmd;        /* "mfsdpc compile", for messages */
    const char *input;      /* the one spec (or schedule) given; NULL until then */
    char **cost_args;       /* argc slots: the cost options, values checked once the mesh is known */
    int ncost;
    double tokens, tflops, unit_us; /* simulate's compute model (positive); 0: the default */
    bool host_async;
} mf_cmd_args;

/* The ids of simulate's model options (MF_SIM_OPTS), apart from a
 * subcommand's own (which stay below 64). */
enum { MF_SIM_OPT_TOKENS = 64, MF_SIM_OPT_TFLOPS, MF_SIM_OPT_UNIT_TIME, MF_SIM_OPT_HOST_ASYNC };

/* The compute model options, inside a subcommand's mf_opt table. */
#define MF_SIM_OPTS                                                                                          \
    {"--tokens", NULL, "a value", MF_SIM_OPT_TOKENS}, {"--tflops", NULL, "a value", MF_SIM_OPT_TFLOPS},      \
        {"--unit-time-us", NULL, "a value", MF_SIM_OPT_UNIT_TIME}, {"--host-async", NULL, NULL, MF_SIM_OPT_HOST_ASYNC}

/* Room for the cost options of argc arguments. 0, or 2 after "out of memory". */
int mf_cmd_args_init(mf_cmd_args *a, const char *cmd, int argc);
void mf_cmd_args_free(mf_cmd_args *a);

/* Takes what mf_opts_next returned (id, v) that is none of the
 * subcommand's own options: a model option of MF_SIM_OPTS, a cost option,
 * the input operand (a second one: "one spec at a time"). 0, or 2 after a
 * reported error (an unknown option, a missing value: reported by p). */
int mf_cmd_args_take(mf_cmd_args *a, const mf_opts *p, int id, const char *v);

/* Ends a parse that stopped (rc 1: --help, usage on stdout, exit status 0;
 * 2: a reported error, usage on stderr, exit status 2): frees a and
 * returns the exit status. */
int mf_cmd_args_stop(mf_cmd_args *a, int rc, void (*usage)(FILE *out));

/* "CMD: error: no spec given" unless the input was given: 0 or 2. */
int mf_cmd_args_need_input(const mf_cmd_args *a);

/* The simulator configuration of the options for a mesh: the defaults,
 * the cost options, the compute model. false after a reported error. */
bool mf_cmd_args_sim_config(const mf_cmd_args *a, const mf_mesh *mesh, mf_sim_config *cfg);

#endif
