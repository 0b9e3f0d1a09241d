/*
 * The simulator on the real HFSDP example (schedules/hfsdp.mfsdp, compiled
 * in process): the outer all-gather (T1) and outer reduce-scatter (T4) are
 * hidden behind inner work except at the pipeline's fill and drain, the
 * single-stream variant is slower, the YAML round trip simulates
 * identically, and `mfsdpc simulate` behaves on good and bad input.
 *
 * argv[1] is the schedules/ directory of the source tree; argv[2] a scratch
 * directory for output files.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "mf_cli.h"
#include "mf_load.h"
#include "mf_passes.h"
#include "mf_pipeline.h"
#include "mf_simulate.h"

static const char *sched_dir = ".";
static const char *scratch = ".";

static char *path_in(const char *dir, const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

typedef struct fixture {
    mf_compilation c;
    mf_sim_config cfg;
} fixture;

/* Compiles the HFSDP example; compute 20 us forward, 40 us backward per unit
 * (enough to hide the communication in the steady state, not so much that a
 * single stream could hide it too). */
static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    mf_compile_options opt = {.stop_after = MF_STAGE_VERIFY, .verify = true};
    int rc = mf_pipeline_compile_file(path_in(sched_dir, "hfsdp.mfsdp"), &opt, &f->c);
    if (rc != 0 || !f->c.plan || !f->c.plan->sched) {
        mf_compilation_free(&f->c);
        free(f);
        return -1;
    }
    mf_sim_config_defaults(&f->cfg, &f->c.plan->sched->mesh);
    f->cfg.unit_time = 20e-6;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    mf_compilation_free(&f->c);
    free(f);
    return 0;
}

static void test_outer_hidden_in_steady_state(void **state)
{
    fixture *f = *state;
    const mf_schedule *s = f->c.plan->sched;
    mf_sim_result r;
    char err[256];
    assert_int_equal(mf_simulate(s, &f->cfg, &r, err, sizeof err), 0);

    /* the first and last compute segments bound the steady state */
    double first = -1, last = 0;
    for (int i = 0; i < r.nitems; i++)
        if (r.items[i].op < 0) {
            if (first < 0)
                first = r.items[i].start;
            last = r.items[i].end;
        }
    /* outer collectives exist (T1 all-gathers, T4 reduce-scatters) */
    int outer_ag = 0, outer_rs = 0;
    for (int i = 0; i < r.nitems; i++) {
        const mf_sim_item *it = &r.items[i];
        if (it->op < 0 || it->stream != MF_STREAM_OUTER)
            continue;
        outer_ag += s->ops[it->op].kind == MF_OP_ALL_GATHER;
        outer_rs += s->ops[it->op].kind == MF_OP_REDUCE_SCATTER;
    }
    assert_int_equal(outer_ag, 6); /* T1, once per hfsdp bucket */
    assert_int_equal(outer_rs, 6); /* T4, once per hfsdp bucket */
    assert_true(r.busy[MF_STREAM_OUTER] > 0);

    /* exposed outer time only before the first compute or after the last */
    double fill_drain = 0;
    for (int i = 0; i < r.nexposed_spans; i++) {
        const mf_sim_span *sp = &r.exposed_spans[i];
        if (sp->stream != MF_STREAM_OUTER)
            continue;
        if (!(sp->t1 <= first + 1e-12 || sp->t0 >= last - 1e-12))
            fail_msg("outer op %d exposed at %.3f..%.3f us, inside the steady state %.3f..%.3f us",
                     r.items[sp->item].op, sp->t0 * 1e6, sp->t1 * 1e6, first * 1e6, last * 1e6);
        fill_drain += sp->t1 - sp->t0;
    }
    assert_true(fill_drain - r.exposed[MF_STREAM_OUTER] < 1e-12 &&
                r.exposed[MF_STREAM_OUTER] - fill_drain < 1e-12);
    /* and that is a small part of the outer stream's work */
    assert_true(r.exposed[MF_STREAM_OUTER] < 0.2 * r.busy[MF_STREAM_OUTER]);
    /* the bytes agree with the schedule's own summary */
    for (int j = 0; j < s->mesh.naxes; j++)
        assert_int_equal(r.bytes[j], s->summary.bytes[j]);
    mf_sim_result_free(&r);
}

static void test_single_stream_is_slower(void **state)
{
    fixture *f = *state;
    const mf_schedule *s = f->c.plan->sched;
    mf_sim_result two, one;
    char err[256];
    assert_int_equal(mf_simulate(s, &f->cfg, &two, err, sizeof err), 0);
    mf_sim_config c1 = f->cfg;
    c1.single_stream = true;
    assert_int_equal(mf_simulate(s, &c1, &one, err, sizeof err), 0);
    assert_true(one.busy[MF_STREAM_OUTER] == 0);
    /* same work, serialized on one stream */
    double d = (one.busy[MF_STREAM_INNER] - (two.busy[MF_STREAM_INNER] + two.busy[MF_STREAM_OUTER]));
    assert_true(d < 1e-12 && d > -1e-12);
    assert_true(one.same_stream_waits > 0);
    assert_true(one.step_time > 1.05 * two.step_time);
    assert_true(one.comm_exposed > two.comm_exposed);
    mf_sim_result_free(&two);
    mf_sim_result_free(&one);
}

static int write_yaml(FILE *out, const void *ctx)
{
    return mf_emit_yaml(ctx, out);
}

/* A schedule written and loaded back simulates to the same times. */
static void test_yaml_round_trip(void **state)
{
    fixture *f = *state;
    const mf_schedule *s = f->c.plan->sched;
    char *yaml = path_in(scratch, "sim_hfsdp.yaml");
    assert_int_equal(mf_pipeline_write_file_atomic(yaml, NULL, write_yaml, s), 0);
    char err[512];
    mf_schedule *l = mf_load_schedule_file(yaml, err, sizeof err);
    if (!l)
        fail_msg("%s", err);
    mf_sim_result a, b;
    assert_int_equal(mf_simulate(s, &f->cfg, &a, err, sizeof err), 0);
    assert_int_equal(mf_simulate(l, &f->cfg, &b, err, sizeof err), 0);
    assert_int_equal(a.nitems, b.nitems);
    assert_true(a.step_time == b.step_time);
    for (int k = 0; k < MF_STREAM_COUNT; k++)
        assert_true(a.exposed[k] == b.exposed[k]);
    mf_sim_result_free(&a);
    mf_sim_result_free(&b);
    mf_schedule_free(l);
}

static int run_cli(const char *a0, const char *a1, const char *a2, const char *a3, const char *a4,
                   const char *a5, const char *a6)
{
    const char *v[] = {"simulate", a0, a1, a2, a3, a4, a5, a6, NULL};
    int n = 0;
    while (v[n])
        n++;
    fflush(stdout);
    return mf_cmd_simulate(n, (char **)v);
}

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_cli(void **state)
{
    (void)state;
    char spec[1024], trace[1024], svg[1024];
    snprintf(spec, sizeof spec, "%s", path_in(sched_dir, "hfsdp.mfsdp"));
    snprintf(trace, sizeof trace, "%s", path_in(scratch, "sim_cli.json"));
    snprintf(svg, sizeof svg, "%s", path_in(scratch, "sim_cli.svg"));
    unlink(trace);
    unlink(svg);
    assert_int_equal(run_cli(spec, "--trace", trace, "--svg", svg, "--compare-single-stream", NULL), 0);
    assert_true(exists(trace));
    assert_true(exists(svg));
    /* usage errors: exit 2, nothing written */
    unlink(trace);
    assert_int_equal(run_cli(spec, "--tflops", "-3", "--trace", trace, NULL, NULL), 2);
    assert_int_equal(run_cli(spec, "--svg-window", "5:1", "--trace", trace, NULL, NULL), 2);
    assert_int_equal(run_cli(spec, "--bogus", NULL, NULL, NULL, NULL, NULL), 2);
    assert_int_equal(run_cli(spec, "--inner-bw=fast", "--trace", trace, NULL, NULL, NULL), 2);
    assert_int_equal(run_cli(NULL, NULL, NULL, NULL, NULL, NULL, NULL), 2);
    assert_int_equal(run_cli(path_in(scratch, "missing.mfsdp"), NULL, NULL, NULL, NULL, NULL, NULL), 2);
    assert_int_equal(run_cli(spec, "--trace", spec, NULL, NULL, NULL, NULL), 2);
    assert_false(exists(trace));
    /* a spec with an error: exit 1, nothing written */
    char *bad = path_in(scratch, "sim_bad.mfsdp");
    FILE *b = fopen(bad, "w");
    assert_non_null(b);
    fputs("mesh a = 2;\nunit \"u\" { tensor \"t\" [4]; }\n", b);
    fclose(b);
    assert_int_equal(run_cli(bad, "--trace", trace, NULL, NULL, NULL, NULL), 1);
    assert_false(exists(trace));
    /* a broken schedule file: exit 1 */
    char *bady = path_in(scratch, "sim_bad.yaml");
    b = fopen(bady, "w");
    assert_non_null(b);
    fputs("format: mfsdp-schedule/999\n", b);
    fclose(b);
    assert_int_equal(run_cli(bady, NULL, NULL, NULL, NULL, NULL, NULL), 1);
    /* an output directory that does not exist: exit 2 */
    assert_int_equal(run_cli(spec, "--svg", path_in(scratch, "no/such/dir/x.svg"), NULL, NULL, NULL, NULL), 2);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        sched_dir = argv[1];
    if (argc > 2)
        scratch = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outer_hidden_in_steady_state),
        cmocka_unit_test(test_single_stream_is_slower),
        cmocka_unit_test(test_yaml_round_trip),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
