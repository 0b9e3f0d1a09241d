/*
 * fuzz_load: libFuzzer target for the schedule loader (core/mf_load.c),
 * the one parser of untrusted bytes in the runtime library.
 *
 * Each input goes through mf_load_schedule_buffer(). Beyond "no crash, no
 * leak, no UB, bounded time and memory" (ASan/UBSan, libFuzzer's limits) it
 * checks the loader's contract and traps when it is broken:
 *   - NULL <=> a message was written, and the message is located
 *     ("fuz.yaml:LINE:COL: error: ..." with LINE inside the input, or
 *     "fuz.yaml: error: ..." for what has no position);
 *   - a returned schedule satisfies the invariant the runtime relies on
 *     (fuzz_check_loaded: every index in range, every op inside its buffers,
 *     every tensor inside its bucket, the hash is the SHA-256 of the bytes).
 * fuzz_load_corpus feeds every seed through the same function in every build.
 */
#include <string.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    memset(err, 'x', sizeof err);
    mf_schedule *s = mf_load_schedule_buffer("fuz.yaml", (const char *)data, size, err, sizeof err);
    FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL);
    if (!s) {
        if (!fuzz_located(err, "fuz.yaml", (const char *)data, size))
            FUZZ_FAIL("not a located error: %.300s", err);
        return 0;
    }
    FUZZ_CHECK(err[0] == '\0');
    fuzz_check_loaded(s, (const char *)data, size);
    mf_schedule_free(s);
    return 0;
}
