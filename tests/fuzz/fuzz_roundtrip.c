/*
 * fuzz_roundtrip: libFuzzer target for loader + verifier + emitter (and, for
 * small verified schedules, the replay runtime).
 *
 * Each input is loaded (mf_load_schedule_buffer); a schedule that loads is
 * checked like fuzz_load does and then verified (mf_verify_run). A schedule
 * that verifies must
 *   - re-emit (mf_emit_yaml) to a file that loads again and verifies, and
 *     whose second emission is byte for byte the first (the emitter is
 *     canonical and the loader loses nothing it writes);
 *   - when the input was itself canonical (emission == input), hash the same;
 *   - replay correctly: when small (world <= 8, a few MiB per rank, M <= 4,
 *     few ops), every rank runs one step on the local backend under the
 *     docs/design.md §4.1 oracle (mf_check_local); a verified schedule that delivers a
 *     wrong gradient is a verifier bug, one that crashes a runtime bug.
 * fuzz_roundtrip_corpus feeds every seed through the same function.
 */
#include <string.h>

#include "fuzz_common.h"
#include "mf_check.h"
#include "mf_passes.h"
#include "mfsdp.h"

static char *emit(const mf_schedule *s, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    FUZZ_CHECK(f != NULL);
    FUZZ_CHECK(mf_emit_yaml(s, f) == 0);
    FUZZ_CHECK(fclose(f) == 0);
    return buf;
}

static int verify(const mf_schedule *s, const char *text, size_t len)
{
    mf_source src = {.path = "fuz.yaml", .text = text, .len = len};
    mf_diag d;
    mf_diag_init(&d, &src, fuzz_devnull());
    int n = mf_verify_run(s, &d);
    mf_diag_finish(&d);
    FUZZ_CHECK((n == 0) == (d.nerrors == 0));
    return n;
}

static bool small_enough(const mf_schedule *s)
{
    if (s->mesh.world > 8 || s->microbatches > 4 || s->nops > 2000 || s->nunits > 64)
        return false;
    int64_t bytes = 0;
    for (int i = 0; i < s->nbuffers; i++)
        bytes += s->buffers[i].count * (int64_t)mf_dtype_size(s->buffers[i].dtype);
    return bytes <= (4 << 20);
}

static void replay(const char *text, size_t len)
{
    mfsdp_schedule *h = NULL;
    FUZZ_CHECK(mfsdp_schedule_load_buffer("fuz.yaml", text, len, &h) == MFSDP_OK);
    if (mf_check_rank_bytes(h) <= (16u << 20)) {
        mfsdp_config cfg;
        mfsdp_config_init(&cfg);
        cfg.timeout_ms = 20000;
        mf_check_opts o = {.steps = 1, .stop_rank = -1, .stop_step = -1, .out = NULL};
        mf_check_outcome out[8];
        int rc = mf_check_local(h, NULL, &cfg, &o, out);
        if (rc != 0)
            FUZZ_FAIL("a verified schedule fails the replay oracle (rc %d): %s", rc, out[0].msg);
    }
    mfsdp_schedule_free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    char err[512];
    mf_schedule *s = mf_load_schedule_buffer("fuz.yaml", text, size, err, sizeof err);
    if (!s)
        return 0;
    fuzz_check_loaded(s, text, size);
    if (verify(s, text, size) != 0) {
        mf_schedule_free(s);
        return 0;
    }
    size_t len1 = 0, len2 = 0;
    char *y1 = emit(s, &len1);
    mf_schedule *s2 = mf_load_schedule_buffer("fuz2.yaml", y1, len1, err, sizeof err);
    if (!s2)
        FUZZ_FAIL("the emission of a verified schedule does not load: %s", err);
    fuzz_check_loaded(s2, y1, len1);
    FUZZ_CHECK(verify(s2, y1, len1) == 0);
    char *y2 = emit(s2, &len2);
    if (len1 != len2 || memcmp(y1, y2, len1) != 0)
        FUZZ_FAIL("emit(load(emit(s))) differs from emit(s) (%zu vs %zu bytes)", len2, len1);
    if (len1 == size && memcmp(y1, text, size) == 0)
        FUZZ_CHECK(memcmp(s->hash, s2->hash, 32) == 0);
    if (small_enough(s2))
        replay(y1, len1);
    free(y1);
    free(y2);
    mf_schedule_free(s2);
    mf_schedule_free(s);
    return 0;
}
