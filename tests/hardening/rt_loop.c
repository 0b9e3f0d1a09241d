/*
 * mfsdp-rt-loop: a runtime lifecycle loop for leak checkers (the valgrind
 * test): loads a schedule, then `rounds` times creates every rank's runtime
 * on the local backend (one thread per rank), replays `steps` steps under
 * the docs/design.md §4.1 oracle and destroys everything; also loads and frees a bad
 * schedule (the error path). Exit status 0 when every round verified.
 *
 *   mfsdp-rt-loop SCHEDULE.yaml [ROUNDS [STEPS]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_check.h"
#include "mfsdp.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mfsdp-rt-loop SCHEDULE.yaml [ROUNDS [STEPS]]\n");
        return 2;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    int steps = argc > 3 ? atoi(argv[3]) : 3;
    if (rounds < 1 || steps < 1) {
        fprintf(stderr, "mfsdp-rt-loop: ROUNDS and STEPS must be positive\n");
        return 2;
    }
    const char *bad = "format: mfsdp-schedule/3\nsource: x\n";
    mfsdp_schedule *b = NULL;
    if (mfsdp_schedule_load_buffer("bad.yaml", bad, strlen(bad), &b) != MFSDP_ERR_LOAD || b) {
        fprintf(stderr, "mfsdp-rt-loop: a bad schedule loaded\n");
        return 1;
    }
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(argv[1], &sh) != MFSDP_OK) {
        fprintf(stderr, "mfsdp-rt-loop: %s\n", mfsdp_last_error(NULL));
        return 2;
    }
    int64_t world = mfsdp_schedule_world_size(sh);
    mf_check_outcome *out = calloc((size_t)world, sizeof *out);
    if (!out) {
        mfsdp_schedule_free(sh);
        return 2;
    }
    int rc = 0;
    for (int r = 0; r < rounds && rc == 0; r++) {
        mfsdp_config cfg;
        mfsdp_config_init(&cfg);
        cfg.timeout_ms = 600000; /* valgrind is slow */
        if (r % 2 == 1)
            cfg.flags = MFSDP_FLAG_SYNCHRONOUS;
        mf_check_opts o = {.steps = steps, .stop_rank = -1, .stop_step = -1, .out = NULL};
        rc = mf_check_local(sh, NULL, &cfg, &o, out);
        printf("round %d (%s): %lld ranks, %d steps: %s\n", r + 1, r % 2 ? "synchronous" : "stream threads",
               (long long)world, steps, rc == 0 ? "verified" : out[0].msg);
    }
    free(out);
    mfsdp_schedule_free(sh);
    return rc == 0 ? 0 : 1;
}
