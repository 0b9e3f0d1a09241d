/*
 * fuzz_planner: libFuzzer target for the whole compiler, spec text to
 * verified schedule YAML (mf_pipeline_compile_buffer up to lowering, then the
 * verifier, the emitter and the loader).
 *
 * Beyond "no crash, no leak, no UB, bounded time and memory" it traps when
 *   - the status disagrees with the diagnostics (0 <=> no error <=> a
 *     schedule), or is neither 0 nor 1;
 *   - lowering succeeded but the verifier rejects the schedule (every spec
 *     the front end accepts must compile to a verified schedule);
 *   - the emitted YAML does not load back, the loaded schedule does not
 *     verify, or emitting it again does not give the same bytes.
 * fuzz_planner_corpus feeds every seed (and prefixes of small ones).
 */
#include <string.h>

#include "fuzz_common.h"
#include "mf_pipeline.h"

static char *emit(const mf_schedule *s, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    FUZZ_CHECK(f != NULL);
    FUZZ_CHECK(mf_emit_yaml(s, f) == 0);
    FUZZ_CHECK(fclose(f) == 0);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mf_compile_options opt = {.stop_after = MF_STAGE_LOWER, .diag_out = fuzz_devnull()};
    mf_compilation c;
    int rc = mf_pipeline_compile_buffer("fuzz.mfsdp", (const char *)data, size, &opt, &c);
    FUZZ_CHECK(rc == 0 || rc == 1);
    FUZZ_CHECK((rc == 0) == (c.diag.nerrors == 0));
    if (rc != 0) {
        mf_compilation_free(&c);
        return 0;
    }
    FUZZ_CHECK(c.spec && c.plan && c.plan->sched);
    const mf_schedule *s = c.plan->sched;
    if (mf_verify_run(s, &c.diag) != 0)
        FUZZ_FAIL("the verifier rejects the schedule of a spec the front end accepted");
    size_t len1 = 0, len2 = 0;
    char *y1 = emit(s, &len1);
    char err[512];
    mf_schedule *s2 = mf_load_schedule_buffer("fuzz.yaml", y1, len1, err, sizeof err);
    if (!s2)
        FUZZ_FAIL("the compiled schedule does not load: %s", err);
    fuzz_check_loaded(s2, y1, len1);
    FUZZ_CHECK(mf_verify_run(s2, &c.diag) == 0);
    char *y2 = emit(s2, &len2);
    if (len1 != len2 || memcmp(y1, y2, len1) != 0)
        FUZZ_FAIL("emit(load(emit(compile(spec)))) differs from emit(compile(spec))");
    free(y1);
    free(y2);
    mf_schedule_free(s2);
    mf_compilation_free(&c);
    return 0;
}
