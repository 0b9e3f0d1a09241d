/*
 * fuzz_common: what the libFuzzer targets of tests/fuzz share.
 *
 * FUZZ_CHECK(cond) traps (a crash libFuzzer reports, with the input) when an
 * invariant is broken; unlike assert() it is never compiled out.
 * FUZZ_FAIL(fmt, ...) prints why first. fuzz_devnull() is where diagnostics
 * go. fuzz_check_loaded() checks what mf_load.h promises of every schedule it
 * returns (every index in range, every op's elements inside its buffers,
 * every tensor inside its bucket): the runtime relies on it without checking.
 */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_layout.h"
#include "mf_load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_FAIL(...)                                 \
    do {                                               \
        fprintf(stderr, "fuzz: invariant broken: ");   \
        fprintf(stderr, __VA_ARGS__);                  \
        fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__); \
        __builtin_trap();                              \
    } while (0)

#define FUZZ_CHECK(cond)                      \
    do {                                      \
        if (!(cond))                          \
            FUZZ_FAIL("%s", #cond);           \
    } while (0)

/* True when err is "name:LINE:COL: error: ..." with LINE at most one past
 * the last line of text[0..len) (libyaml reports the end of the input on the
 * line after it; a line ends at \n, \r\n, \r, NEL, LS or PS), or
 * "name: error: ..." (no position, e.g. an empty file). */
static inline bool fuzz_located(const char *err, const char *name, const char *text, size_t len)
{
    size_t nl = strlen(name);
    if (strncmp(err, name, nl) != 0)
        return false;
    if (strncmp(err + nl, ": error: ", 9) == 0)
        return true;
    long lines = 1; /* an upper bound: YAML also breaks lines at \r, NEL, LS, PS */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        lines += c == '\n' || c == '\r' || c == 0x85 || c == 0xa8 || c == 0xa9;
    }
    char *end;
    long line = err[nl] == ':' ? strtol(err + nl + 1, &end, 10) : 0;
    if (line < 1 || line > lines + 1 || *end != ':')
        return false;
    long col = strtol(end + 1, &end, 10);
    return col >= 1 && strncmp(end, ": error: ", 9) == 0;
}

static inline FILE *fuzz_devnull(void)
{
    static FILE *devnull;
    if (!devnull)
        devnull = fopen("/dev/null", "w");
    if (!devnull)
        abort();
    return devnull;
}

/* Elements an op reads from src and writes to dst (per rank). */
static inline void fuzz_op_extent(const mf_schedule *s, const mf_op *op, int64_t *src, int64_t *dst)
{
    int64_t n = op->axis >= 0 ? s->mesh.axes[op->axis].size : 1;
    *src = *dst = op->count;
    const mf_bucket *bk = &s->buckets[op->bucket];
    if (bk->bounds) { /* ragged: a rank touches at most its placements' longest shards */
        *src = mf_layout_bucket_capacity(&s->mesh, bk, &s->buffers[op->src].place);
        *dst = mf_layout_bucket_capacity(&s->mesh, bk, &s->buffers[op->dst].place);
        return;
    }
    if (op->kind == MF_OP_ALL_GATHER)
        FUZZ_CHECK(!__builtin_mul_overflow(op->count, n, dst));
    else if (op->kind == MF_OP_REDUCE_SCATTER || op->kind == MF_OP_SLICE)
        FUZZ_CHECK(!__builtin_mul_overflow(op->count, n, src));
}

/* The loader's invariant on success (mf_load.c, top comment), re-derived. */
static inline void fuzz_check_loaded(const mf_schedule *s, const char *text, size_t len)
{
    FUZZ_CHECK(s->source && s->source_sha256[64] == '\0');
    FUZZ_CHECK(s->mesh.naxes >= 1 && s->mesh.naxes <= MF_MAX_AXES);
    int64_t world = 1;
    for (int j = 0; j < s->mesh.naxes; j++) {
        FUZZ_CHECK(s->mesh.axes[j].name && s->mesh.axes[j].size >= 1);
        FUZZ_CHECK(!__builtin_mul_overflow(world, s->mesh.axes[j].size, &world));
    }
    FUZZ_CHECK(world == s->mesh.world);
    FUZZ_CHECK(s->microbatches >= 1 && s->prefetch >= 1 && s->align >= 1);
    FUZZ_CHECK((unsigned)s->reduce < MF_REDUCE_COUNT);
    FUZZ_CHECK(s->nunits >= 0 && s->nbuckets >= 0 && s->nbuffers >= 0 && s->nops >= 0 && s->nevents >= 0);

    for (int u = 0; u < s->nunits; u++) {
        const mf_unit *un = &s->units[u];
        FUZZ_CHECK(un->name && un->first_bucket >= 0 && un->nbuckets >= 0);
        FUZZ_CHECK(un->first_bucket + (int64_t)un->nbuckets <= s->nbuckets);
        for (int b = un->first_bucket; b < un->first_bucket + un->nbuckets; b++)
            FUZZ_CHECK(s->buckets[b].unit == u);
    }
    for (int b = 0; b < s->nbuckets; b++) {
        const mf_bucket *bk = &s->buckets[b];
        FUZZ_CHECK(bk->name && bk->unit >= 0 && bk->unit <= bk->last_unit && bk->last_unit < s->nunits);
        FUZZ_CHECK(bk->length >= 1 && bk->used >= 0 && bk->used <= bk->length);
        for (int r = 0; r < MF_ROLE_COUNT; r++) {
            FUZZ_CHECK((unsigned)bk->dtype[r] < MF_DTYPE_COUNT);
            FUZZ_CHECK(mf_layout_flat_suffix_ok(&bk->place[r], s->mesh.naxes));
            int64_t shards = mf_layout_shards(&s->mesh, &bk->place[r]);
            FUZZ_CHECK(shards >= 1 && bk->length % shards == 0);
            for (int j = 0; j < s->mesh.naxes; j++)
                FUZZ_CHECK(bk->place[r].p[j] <= MF_PLACE_DISTINCT &&
                           (r == MF_ROLE_GRAD || bk->place[r].p[j] != MF_PLACE_PARTIAL));
        }
        FUZZ_CHECK(bk->ntensors >= 1 && bk->tensors);
        int64_t end = 0;
        for (int t = 0; t < bk->ntensors; t++) {
            const mf_tensor *te = &bk->tensors[t];
            FUZZ_CHECK(te->name && te->ndims >= 1 && te->ndims <= MF_MAX_DIMS);
            int64_t n = 1;
            for (int d = 0; d < te->ndims; d++)
                FUZZ_CHECK(te->dims[d] >= 0 && !__builtin_mul_overflow(n, te->dims[d], &n));
            FUZZ_CHECK(n == te->numel && te->offset >= end);
            FUZZ_CHECK(te->numel <= bk->used && te->offset <= bk->used - te->numel);
            end = te->offset + te->numel;
        }
    }
    for (int i = 0; i < s->nbuffers; i++) {
        const mf_buffer *bf = &s->buffers[i];
        FUZZ_CHECK(bf->name && bf->bucket >= 0 && bf->bucket < s->nbuckets);
        FUZZ_CHECK((unsigned)bf->kind < MF_BUFKIND_COUNT && (unsigned)bf->dtype < MF_DTYPE_COUNT);
        FUZZ_CHECK((unsigned)bf->lifetime < MF_LIFETIME_COUNT);
        const mf_bucket *bk = &s->buckets[bf->bucket];
        FUZZ_CHECK(mf_layout_bucket_placement_ok(&s->mesh, bk, &bf->place));
        FUZZ_CHECK(bf->count >= 1 && bf->count == mf_layout_bucket_capacity(&s->mesh, bk, &bf->place));
        int64_t bytes;
        FUZZ_CHECK(!__builtin_mul_overflow(bf->count, (int64_t)mf_dtype_size(bf->dtype), &bytes));
        /* every rank's range of the bucket under this placement fits the
           buffer (is it, unless the bucket is ragged) */
        mf_range last = mf_layout_bucket_range(&s->mesh, bk, &bf->place, s->mesh.world - 1);
        FUZZ_CHECK((bk->bounds ? last.len <= bf->count : last.len == bf->count) && last.offset >= 0 &&
                   last.offset <= bk->length - last.len);
    }
    for (int i = 0; i < s->nops; i++) {
        const mf_op *op = &s->ops[i];
        FUZZ_CHECK(op->id == i);
        FUZZ_CHECK((unsigned)op->phase < MF_PHASE_COUNT && (unsigned)op->when < MF_WHEN_COUNT);
        FUZZ_CHECK((unsigned)op->stream < MF_STREAM_COUNT && (unsigned)op->kind < MF_OPKIND_COUNT);
        bool step = op->phase == MF_PHASE_STEP_BEGIN || op->phase == MF_PHASE_STEP_END;
        FUZZ_CHECK(step ? op->unit == -1 : (op->unit >= 0 && op->unit < s->nunits));
        if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT) {
            FUZZ_CHECK(op->event >= 0 && op->event < s->nevents);
            FUZZ_CHECK(op->src == -1 && op->dst == -1 && op->bucket == -1);
            continue;
        }
        FUZZ_CHECK(op->event == -1);
        FUZZ_CHECK(op->bucket >= 0 && op->bucket < s->nbuckets);
        FUZZ_CHECK(op->src >= 0 && op->src < s->nbuffers && op->dst >= 0 && op->dst < s->nbuffers);
        bool has_axis = mf_opkind_is_collective(op->kind) || op->kind == MF_OP_SLICE;
        FUZZ_CHECK(has_axis ? (op->axis >= 0 && op->axis < s->mesh.naxes) : op->axis == -1);
        FUZZ_CHECK(op->count >= 1 && (unsigned)op->dtype < MF_DTYPE_COUNT);
        const mf_buffer *src = &s->buffers[op->src], *dst = &s->buffers[op->dst];
        FUZZ_CHECK(dst->dtype == op->dtype && (op->kind == MF_OP_CAST || src->dtype == op->dtype));
        int64_t need_src, need_dst;
        fuzz_op_extent(s, op, &need_src, &need_dst);
        if (need_src > src->count || need_dst > dst->count)
            FUZZ_FAIL("op %d (%s) touches %lld/%lld elements of buffers holding %lld/%lld", i,
                      mf_opkind_name(op->kind), (long long)need_src, (long long)need_dst,
                      (long long)src->count, (long long)dst->count);
    }
    /* every event is recorded on one stream (the runtime's event counters) */
    for (int e = 0; e < s->nevents; e++) {
        int stream = -1;
        for (int i = 0; i < s->nops; i++)
            if (s->ops[i].kind == MF_OP_RECORD && s->ops[i].event == e) {
                FUZZ_CHECK(stream < 0 || stream == (int)s->ops[i].stream);
                stream = (int)s->ops[i].stream;
            }
    }
    uint8_t h[32];
    mf_sha256(text, len, h, NULL);
    for (int i = 0; i < 32; i++)
        FUZZ_CHECK(h[i] == s->hash[i]);
}

#endif
