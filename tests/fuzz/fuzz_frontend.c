/*
 * fuzz_frontend: libFuzzer target for the front end. Each input runs through
 * mf_pipeline_compile_buffer() up to the semantic pass (parse + sema), diagnostics to
 * /dev/null. Beyond "no crash, no leak, no UB" (ASan/UBSan), it checks the
 * pass's contract and traps when it is broken:
 *   - status 0 <=> no errors reported <=> a spec was produced;
 *   - a produced spec satisfies the invariants later passes rely on: at least
 *     one unit, every unit has tensors, layout indices in range, numel equal
 *     to the product of the dims, placements with the Flat suffix property
 *     and Partial only in grad, the limits on ranks and elements.
 * The same function is fed every seed file by fuzz_corpus_main.c in every
 * build, so the target is exercised even without clang.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mf_layout.h"
#include "mf_pipeline.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                \
    do {                           \
        if (!(cond))               \
            __builtin_trap();      \
    } while (0)

static void check_spec(const mf_spec *s)
{
    CHECK(s->mesh.naxes >= 1 && s->mesh.naxes <= MF_MAX_AXES);
    int64_t world = 1;
    for (int j = 0; j < s->mesh.naxes; j++) {
        CHECK(s->mesh.axes[j].size >= 1 && s->mesh.axes[j].name);
        world *= s->mesh.axes[j].size;
    }
    CHECK(world == s->mesh.world && world <= (1 << 24));
    CHECK(s->microbatches >= 1 && s->prefetch >= 1 && s->bucket_size >= 0);
    CHECK(s->align >= 16 && (s->align & (s->align - 1)) == 0);
    CHECK(s->nlayouts >= 1 && s->nunits >= 1);
    for (int l = 0; l < s->nlayouts; l++) {
        const mf_spec_layout *ly = &s->layouts[l];
        CHECK(ly->name);
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            CHECK((int)ly->dtype[r] >= 0 && ly->dtype[r] < MF_DTYPE_COUNT);
            CHECK(mf_layout_flat_suffix_ok(&ly->place[r], s->mesh.naxes));
            for (int j = 0; j < s->mesh.naxes; j++) {
                CHECK(ly->place[r].p[j] <= MF_PLACE_DISTINCT);
                if (r != MF_ROLE_GRAD)
                    CHECK(ly->place[r].p[j] != MF_PLACE_PARTIAL);
            }
        }
    }
    int64_t total = 0;
    for (int u = 0; u < s->nunits; u++) {
        const mf_spec_unit *un = &s->units[u];
        CHECK(un->name && un->ntensors >= 1);
        CHECK(un->layout >= 0 && un->layout < s->nlayouts);
        for (int t = 0; t < un->ntensors; t++) {
            const mf_spec_tensor *st = &un->tensors[t];
            CHECK(st->name && st->layout >= 0 && st->layout < s->nlayouts);
            CHECK(st->ndims >= 1 && st->ndims <= MF_MAX_DIMS);
            int64_t n = 1;
            for (int d = 0; d < st->ndims; d++) {
                CHECK(st->dims[d] >= 1);
                CHECK(!__builtin_mul_overflow(n, st->dims[d], &n));
            }
            CHECK(n == st->numel);
            CHECK(!__builtin_add_overflow(total, n, &total));
        }
    }
    CHECK(total <= (INT64_C(1) << 42));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    if (!devnull)
        devnull = fopen("/dev/null", "w");
    if (!devnull)
        abort();
    mf_compile_options opt = {.stop_after = MF_STAGE_SEMA, .diag_out = devnull};
    mf_compilation c;
    int rc = mf_pipeline_compile_buffer("fuzz.mfsdp", (const char *)data, size, &opt, &c);
    CHECK(rc == 0 || rc == 1);
    CHECK((rc == 0) == (c.diag.nerrors == 0));
    CHECK((rc == 0) == (c.spec != NULL));
    if (c.spec)
        check_spec(c.spec);
    mf_compilation_free(&c);
    return 0;
}
