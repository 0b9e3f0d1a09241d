/*
 * Bad schedules (issue 8): truncated at every line boundary and at random
 * cut points, bit-flipped, and hand-edited files are refused at load with a
 * located error ("NAME:LINE:COL: error: ..."); a schedule compiled for
 * another mesh size than the world is refused at create on every rank.
 *
 * Bit flips that still load are checked against the loader's invariant
 * (tests/fuzz/fuzz_common.h), verified, and replayed on the local backend:
 * whatever the result, nothing may crash, hang or touch memory outside a
 * buffer (this test runs in the sanitize build too, under ASan/UBSan), and a
 * mutant the verifier accepts must pass the docs/design.md §4.1 oracle.
 *
 * Seeds: the .yaml files of tests/fuzz/seeds/schedules and of schedules (those
 * 128 KiB). Counts of what was tried are printed for docs/reliability.md.
 *
 * MF_BAD_SCHEDULES_SHARE=k (the sanitize build's per-change tier,
 * tests/hardening/CMakeLists.txt) tries one k-th of the cuts and flips: every
 * k-th line boundary, 1/k of the random cuts and of the bit flips of each seed,
 * the same ones every run; the nightly tier tries them all.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fuzz_common.h"
#include "hard_util.h"
#include "mf_check.h"
#include "mf_passes.h"
#include "mfsdp.h"

#define MAX_SEEDS 64
#define SEED_DIR MFSDP_SOURCE_DIR "/tests/fuzz/seeds/schedules"
#define EXAMPLE_DIR MFSDP_SOURCE_DIR "/schedules"

typedef struct seed {
    char *path;
    char *text;
    size_t len;
    int lines;
    bool small;             /* one of the small compiled seeds */
} seed;

static seed seeds[MAX_SEEDS];
static int nseeds;
static int share = 1;   /* MF_BAD_SCHEDULES_SHARE */

static int setup(void **state)
{
    (void)state;
    char *paths[MAX_SEEDS];
    int n = hard_list(SEED_DIR, ".yaml", paths, MAX_SEEDS);
    const char *k = getenv("MF_BAD_SCHEDULES_SHARE");
    if (k) {
        char *end;
        long v = strtol(k, &end, 10);
        if (*k == '\0' || *end || v < 1 || v > 100) {
            fprintf(stderr, "MF_BAD_SCHEDULES_SHARE='%s': expected a whole number from 1 to 100\n", k);
            return -1;
        }
        share = (int)v;
    }
    int m = hard_list(EXAMPLE_DIR, ".yaml", paths + n, MAX_SEEDS - n);
    for (int i = 0; i < n + m; i++) {
        size_t len;
        char *text = hard_read(paths[i], &len);
        if (!text || len > (128u << 10)) {
            free(text);
            free(paths[i]);
            continue;
        }
        seed *s = &seeds[nseeds++];
        s->path = paths[i];
        s->text = text;
        s->len = len;
        s->lines = hard_line_of(text, len);
        s->small = i < n;
    }
    return n >= 10 && m >= 9 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < nseeds; i++) {
        free(seeds[i].path);
        free(seeds[i].text);
    }
    return 0;
}

/* Loads text[0..len) as "NAME"; on failure checks the message is located
 * within the first max_line lines and returns NULL. */
static mf_schedule *load_or_located(const char *name, const char *text, size_t len, int max_line,
                                    int *line)
{
    char err[1024];
    mf_schedule *s = mf_load_schedule_buffer(name, text, len, err, sizeof err);
    if (!s && !hard_located(err, name, max_line, line))
        fail_msg("not a located error (lines 1..%d): %s", max_line, err);
    return s;
}

static void test_every_seed_loads(void **state)
{
    (void)state;
    assert_true(nseeds >= 19);
    for (int i = 0; i < nseeds; i++) {
        mf_schedule *s = load_or_located("seed.yaml", seeds[i].text, seeds[i].len, seeds[i].lines, NULL);
        if (!s)
            fail_msg("%s does not load", seeds[i].path);
        fuzz_check_loaded(s, seeds[i].text, seeds[i].len);
        mf_schedule_free(s);
    }
}

/* Every prefix that ends at a line boundary (the whole file excepted). */
static void test_truncated_at_every_line(void **state)
{
    (void)state;
    long tried = 0;
    for (int i = 0; i < nseeds; i++) {
        const seed *sd = &seeds[i];
        int line = 1;
        for (size_t cut = 0; cut < sd->len; cut++) {
            if (cut > 0 && sd->text[cut - 1] != '\n')
                continue;
            if ((line - 1) % share) {
                line++;
                continue;
            }
            char err[1024];
            mf_schedule *s = mf_load_schedule_buffer("cut.yaml", sd->text, cut, err, sizeof err);
            if (s)
                fail_msg("%s cut after line %d loads", sd->path, line - 1);
            if (cut == 0)
                assert_non_null(strstr(err, "cut.yaml: error: the file is empty"));
            else if (!hard_located(err, "cut.yaml", line, NULL))
                fail_msg("%s cut after line %d: not located in lines 1..%d: %s", sd->path, line - 1, line, err);
            line++;
            tried++;
        }
    }
    printf("truncated at every line boundary: %ld files refused, all located\n", tried);
    assert_true(tried * share > 2000);
}

/* Cuts anywhere: only a cut that drops nothing but trailing white space loads. */
static void test_truncated_at_random_points(void **state)
{
    (void)state;
    uint64_t rng = 0x5eed0001;
    long tried = 0, loaded = 0;
    for (int i = 0; i < nseeds; i++) {
        const seed *sd = &seeds[i];
        for (int k = 0; k < 200 / share; k++) {
            size_t cut = 1 + (size_t)(hard_rand(&rng) % (sd->len - 1));
            /* at the end of the input libyaml points at the line after the last */
            mf_schedule *s = load_or_located("cut.yaml", sd->text, cut, hard_line_of(sd->text, cut) + 1, NULL);
            tried++;
            if (!s)
                continue;
            loaded++;
            for (size_t j = cut; j < sd->len; j++)
                if (sd->text[j] != '\n' && sd->text[j] != ' ')
                    fail_msg("%s cut at byte %zu of %zu loads", sd->path, cut, sd->len);
            mf_schedule_free(s);
        }
    }
    printf("truncated at random points: %ld tried, %ld loaded (only white space dropped)\n", tried, loaded);
}

static int verify(const mf_schedule *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    mf_source src = {.path = "mutant.yaml", .text = "", .len = 0};
    mf_diag d;
    mf_diag_init(&d, &src, f);
    int n = mf_verify_run(s, &d);
    fclose(f);
    free(buf);
    return n;
}

typedef struct flip_stats {
    long tried, refused, loaded, verified, refused_on_load, replay_ok, replay_error;
} flip_stats;

/* Replays a loaded mutant on the local backend for one step under the
 * oracle. A verified one must pass; any other may fail, but must return. */
static void replay(const char *text, size_t len, bool verified, flip_stats *st, const char *what)
{
    mfsdp_schedule *h = NULL;
    /* The public API verifies on load: exactly the verified mutants load. */
    if (mfsdp_schedule_load_buffer("mutant.yaml", text, len, &h) != MFSDP_OK) {
        if (verified || !strstr(mfsdp_last_error(NULL), "the verifier found"))
            fail_msg("%s: loads internally but not through the public API: %s", what, mfsdp_last_error(NULL));
        st->refused_on_load++;
        return;
    }
    if (!verified)
        fail_msg("%s: the verifier refuses it, but the public API loads it", what);
    if (mfsdp_schedule_world_size(h) > 8 || mf_check_rank_bytes(h) > (8u << 20)) {
        mfsdp_schedule_free(h);
        return;
    }
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.timeout_ms = verified ? 30000 : 500;
    mf_check_opts o = {.steps = 1, .stop_rank = -1, .stop_step = -1, .out = NULL};
    mf_check_outcome out[8];
    int rc = mf_check_local(h, NULL, &cfg, &o, out);
    if (rc == 0)
        st->replay_ok++;
    else
        st->replay_error++;
    if (verified && rc != 0)
        fail_msg("%s: verified but fails the oracle: %s", what, out[0].msg);
    mfsdp_schedule_free(h);
}

static void test_bit_flips(void **state)
{
    (void)state;
    uint64_t rng = 0x5eed0002;
    flip_stats st = {0};
    for (int i = 0; i < nseeds; i++) {
        const seed *sd = &seeds[i];
        if (!sd->small)
            continue;
        char *mut = malloc(sd->len);
        assert_non_null(mut);
        for (int k = 0; k < 400 / share; k++) {
            memcpy(mut, sd->text, sd->len);
            size_t at = (size_t)(hard_rand(&rng) % sd->len);
            int bit = (int)(hard_rand(&rng) % 8);
            mut[at] = (char)(mut[at] ^ (1 << bit));
            char what[512];
            snprintf(what, sizeof what, "%s, bit %d of byte %zu (line %d)", sd->path, bit, at,
                     hard_line_of(sd->text, at));
            st.tried++;
            mf_schedule *s = load_or_located("mutant.yaml", mut, sd->len, sd->lines, NULL);
            if (!s) {
                st.refused++;
                continue;
            }
            st.loaded++;
            fuzz_check_loaded(s, mut, sd->len);
            bool ok = verify(s) == 0;
            st.verified += ok;
            mf_schedule_free(s);
            replay(mut, sd->len, ok, &st, what);
        }
        free(mut);
    }
    printf("bit flips: %ld tried, %ld refused with a located error, %ld loaded (%ld verified, %ld refused by the "
           "public API's verify on load); replays: %ld passed the oracle, %ld returned an error\n",
           st.tried, st.refused, st.loaded, st.verified, st.refused_on_load, st.replay_ok, st.replay_error);
    assert_true(st.refused > st.tried / 2);
}

/* ---- hand edits of tests/fuzz/seeds/schedules/hfsdp_2x2.yaml ---- */

typedef struct edit {
    const char *what;
    const char *line;       /* a substring of the line to edit (first match) */
    const char *from, *to;  /* replaced on that line */
    const char *expect;     /* substring of the message */
    const char *at;         /* substring of the line the error must point at (NULL: the edited one) */
} edit;

static const edit edits[] = {
    {"wrong format version", "format:", "mfsdp-schedule/3", "mfsdp-schedule/9", "unknown format 'mfsdp-schedule/9'", NULL},
    {"format before the buffer assignment", "format:", "mfsdp-schedule/3", "mfsdp-schedule/1", "written by an older mfsdpc", NULL},
    {"format before the interference bound", "format:", "mfsdp-schedule/3", "mfsdp-schedule/2", "written by an older mfsdpc", NULL},
    {"format missing", "format:", "format: mfsdp-schedule/3", "formats: mfsdp-schedule/3", "missing key 'format'", "format"},
    {"buffer count not matching the layout", "{name: embed/main.weight,", "count: 256", "count: 255",
     "does not match its bucket's length 512", NULL},
    {"bucket length not matching its buffers", "length: 512", "512", "1024", "does not match its bucket's length 1024",
     "{name: embed/main.main_weight,"},
    {"bucket length not divisible by the shards", "length: 512", "512", "514", "not divisible", NULL},
    {"mesh of another size than the counts", "mesh:", "dp_outer, size: 2", "dp_outer, size: 4",
     "does not match", "{name: embed/main.main_weight,"},
    {"mesh axis of size 0", "mesh:", "dp_inner, size: 2", "dp_inner, size: 0", "at least 1", NULL},
    {"numel not the product of the dims", "{name: embed.w,", "numel: 35", "numel: 36", "not the product", NULL},
    {"tensor outside its bucket", "{name: embed.w,", "offset: 0", "offset: 500", "lies outside", NULL},
    {"used not the end of the tensors", "used: 35", "35", "36",
     "bucket 'embed/main': used 36 is not the end of its furthest tensor ('embed.w' ends at 35)", NULL},
    {"op on a missing buffer", "{id: 7,", "dst: embed/main.weight_full", "dst: embed/main.weight_fulll",
     "unknown buffer 'embed/main.weight_fulll'", NULL},
    {"op on a missing bucket", "{id: 7,", "bucket: embed/main", "bucket: embed/mainn", "unknown bucket", NULL},
    {"op of a missing unit", "{id: 7,", "unit: embed", "unit: embedd", "unknown unit 'embedd'", NULL},
    {"op on a missing axis", "{id: 3,", "axis: dp_outer", "axis: dp_middle", "unknown axis 'dp_middle'", NULL},
    {"op on a missing event", "{id: 52,", "event: 16", "event: 17", "event 17 does not exist", NULL},
    {"op count past its source", "{id: 3,", "count: 128", "count: 256", "needs a source of 256", NULL},
    {"op count short of its buffers", "{id: 7,", "count: 256", "count: 128", "count 128 needs a source of 128", NULL},
    {"event recorded on two streams", "{id: 8,", "event: 3", "event: 1",
     "op 8 records event 1 on the inner stream, but op 4 records it on the outer stream", NULL},
    {"op dtype unlike its buffers", "{id: 3,", "dtype: bf16", "dtype: fp32", "differs", NULL},
    {"op ids out of sequence", "{id: 7,", "id: 7", "id: 8", "out of sequence", NULL},
    {"negative count", "{id: 7,", "count: 256", "count: -256", "at least 1", NULL},
    {"count past 64 bits", "{id: 7,", "count: 256", "count: 99999999999999999999", "overflows 64 bits", NULL},
    {"duplicate key", "{id: 7,", "op: all_gather", "op: all_gather, op: cast", "duplicate key 'op'", NULL},
    {"missing key", "{id: 7,", "phase: forward_pre, ", "", "missing key 'phase'", NULL},
    {"unknown op", "{id: 7,", "op: all_gather", "op: all_gatherr", "unknown op 'all_gatherr'", NULL},
    {"microbatches 0", "microbatches:", "3", "0", "at least 1", NULL},
    {"weight placement Partial", "weight: {dtype: bf16, placement: [Replicate, Flat]}", "[Replicate, Flat]",
     "[Partial, Flat]", "may not be Partial", NULL},
    {"Flat axes not a suffix", "main_weight: {dtype: fp32, placement: [Flat, Flat]}", "[Flat, Flat]",
     "[Flat, Replicate]", "suffix", NULL},
    {"placement of the wrong length", "main_weight: {dtype: fp32, placement: [Flat, Flat]}", "[Flat, Flat]",
     "[Flat]", "expected one per mesh axis", NULL},
    {"a byte that is not UTF-8", "{id: 7,", "all_gather", "all_\xffgather", "invalid leading UTF-8 octet", NULL},
    {"a control character", "{id: 7,", "all_gather", "all_\x01gather", "control characters are not allowed", NULL},
    {"summary not the ops'", "all_gather: {", "dp_outer: 2", "dp_outer: 3", "but the ops give 2", NULL},
    {"events fewer than used", "events:", "17", "16", "event 16 does not exist", "{id: 52,"},
    {"a second document", "allocated_bytes:", "14848", "14848\n---\n{format: x}", "a second YAML document", "{format: x}"},
};

static char *apply(const char *text, const edit *e, int *line, int *at_line)
{
    const char *l = strstr(text, e->line);
    if (!l)
        return NULL;
    while (l > text && l[-1] != '\n')
        l--;
    const char *eol = strchr(l, '\n');
    const char *f = strstr(l, e->from);
    if (!f || (eol && f > eol))
        return NULL;
    size_t n = strlen(text), fl = strlen(e->from), tl = strlen(e->to);
    char *out = malloc(n - fl + tl + 1);
    if (!out)
        return NULL;
    size_t pre = (size_t)(f - text);
    memcpy(out, text, pre);
    memcpy(out + pre, e->to, tl);
    memcpy(out + pre + tl, f + fl, n - pre - fl + 1);
    *line = hard_line_of(text, (size_t)(l - text));
    *at_line = *line;
    if (e->at) {
        const char *a = strstr(out, e->at);
        if (!a) {
            free(out);
            return NULL;
        }
        *at_line = hard_line_of(out, (size_t)(a - out));
    }
    return out;
}

static void test_hand_edits(void **state)
{
    (void)state;
    size_t len;
    char *text = hard_read(SEED_DIR "/hfsdp_2x2.yaml", &len);
    assert_non_null(text);
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        const edit *e = &edits[i];
        int line, at_line;
        char *mut = apply(text, e, &line, &at_line);
        if (!mut)
            fail_msg("edit '%s' does not apply to the seed", e->what);
        char err[1024];
        mf_schedule *s = mf_load_schedule_buffer("edited.yaml", mut, strlen(mut), err, sizeof err);
        if (s)
            fail_msg("%s (line %d): the edited schedule loads", e->what, line);
        int got;
        if (!hard_located(err, "edited.yaml", 10000, &got))
            fail_msg("%s: not located: %s", e->what, err);
        if (got != at_line || !strstr(err, e->expect))
            fail_msg("%s: expected line %d and '%s', got: %s", e->what, at_line, e->expect, err);
        /* the public API refuses it the same way */
        mfsdp_schedule *h = (mfsdp_schedule *)1;
        assert_int_equal(mfsdp_schedule_load_buffer("edited.yaml", mut, strlen(mut), &h), MFSDP_ERR_LOAD);
        assert_null(h);
        assert_non_null(strstr(mfsdp_last_error(NULL), e->expect));
        free(mut);
    }
    printf("hand edits: %zu refused, each at the edited line\n", sizeof edits / sizeof edits[0]);
    free(text);
}

/* ---- a schedule for another mesh size than the world ---- */

typedef struct world_arg {
    const mfsdp_schedule *sh;
    mfsdp_local_group *g;
    int64_t rank;
    mfsdp_result r;
    char msg[512];
} world_arg;

static void *world_rank(void *p)
{
    world_arg *a = p;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = a->g;
    cfg.rank = a->rank;
    cfg.timeout_ms = 20000;
    mfsdp_runtime *rt = NULL;
    a->r = mfsdp_create(a->sh, &cfg, &rt);
    snprintf(a->msg, sizeof a->msg, "%s", a->r == MFSDP_OK ? "" : mfsdp_last_error(NULL));
    mfsdp_destroy(rt);
    return NULL;
}

static void test_world_size_mismatch(void **state)
{
    (void)state;
    mfsdp_schedule *sh = NULL;
    assert_int_equal(mfsdp_schedule_load(SEED_DIR "/hfsdp_2x2.yaml", &sh), MFSDP_OK);
    assert_int_equal(mfsdp_schedule_world_size(sh), 4);
    const int64_t worlds[] = {1, 2, 3, 8};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        int64_t n = worlds[w];
        mfsdp_local_group *g = NULL;
        assert_int_equal(mfsdp_local_group_create(n, &g), MFSDP_OK);
        world_arg args[8];
        pthread_t th[8];
        for (int64_t r = 0; r < n; r++) {
            args[r] = (world_arg){.sh = sh, .g = g, .rank = r};
            assert_int_equal(pthread_create(&th[r], NULL, world_rank, &args[r]), 0);
        }
        for (int64_t r = 0; r < n; r++) {
            pthread_join(th[r], NULL);
            if (args[r].r != MFSDP_ERR_MISMATCH || !strstr(args[r].msg, "needs 4"))
                fail_msg("world %lld, rank %lld: %s: %s", (long long)n, (long long)r,
                         mfsdp_result_string(args[r].r), args[r].msg);
        }
        mfsdp_local_group_destroy(g);
    }
    mfsdp_schedule_free(sh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_seed_loads),
        cmocka_unit_test(test_truncated_at_every_line),
        cmocka_unit_test(test_truncated_at_random_points),
        cmocka_unit_test(test_bit_flips),
        cmocka_unit_test(test_hand_edits),
        cmocka_unit_test(test_world_size_mismatch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
