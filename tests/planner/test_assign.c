/*
 * test_assign: the buffer assignment (planner/passes/mf_assign.c,
 * docs/semantics.md §10) on every example spec and several modes:
 *   - the assignment passes the loader's arena check and the summary's
 *     allocated_bytes is the persistent region plus the arena, each region the
 *     sum (by an independent walk over the buffers) of what lies in it at most;
 *   - the arena is at least the live-bytes lower bound;
 *   - removing any wait the assignment added is refused by the verifier with a
 *     hazard naming both buffers and the missing edge;
 *   - shifting one transient buffer onto a neighbour live at the same time is
 *     refused by the loader.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_arena_check.h"
#include "mf_assign.h"
#include "mf_passes.h"
#include "sched_test.h"

#ifndef MFSDP_SOURCE_DIR
#error "MFSDP_SOURCE_DIR must be defined"
#endif

static const char *const examples[] = {"ddp", "deepseek_moe", "fsdp2d", "hfsdp", "hsdp", "hsdp_nosync",
                                       "mesh3d_hfsdp", "zero1", "zero2", "zero2_inner_zero1_outer", "zero3"};

/* The lowered schedule of a spec, without the assignment. */
static mf_schedule *lowered(const char *name, const char *text)
{
    mf_compile_options opt = {.stop_after = MF_STAGE_TRANSITIONS, .verify = false, .diag_out = stderr};
    mf_compilation c;
    if (mf_pipeline_compile_buffer(name, text, strlen(text), &opt, &c) != 0)
        fail_msg("%s does not compile", name);
    mf_diag d;
    mf_diag_init(&d, &c.src, stderr);
    assert_true(mf_lower_run(c.plan, &d));
    mf_diag_finish(&d);
    mf_schedule *s = c.plan->sched;
    c.plan->sched = NULL;
    mf_compilation_free(&c);
    return s;
}

static bool same_op(const mf_op *a, const mf_op *b)
{
    return a->phase == b->phase && a->unit == b->unit && a->when == b->when && a->stream == b->stream &&
           a->kind == b->kind && a->src == b->src && a->dst == b->dst && a->event == b->event;
}

static char *spec_of(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/schedules/%s.mfsdp", MFSDP_SOURCE_DIR, name);
    char *text = st_read(path, NULL);
    if (!text)
        fail_msg("cannot read %s", path);
    return text;
}

/* allocated = both regions; each region bounded by its buffers. */
static void check_totals(const char *name, const mf_schedule *s)
{
    int64_t pers_end = 0, arena_end = 0;
    for (int b = 0; b < s->nbuffers; b++) {
        const mf_buffer *bf = &s->buffers[b];
        int64_t bytes = bf->count * (int64_t)mf_dtype_size(bf->dtype);
        int64_t end = bf->offset + (bytes + s->align - 1) / s->align * s->align;
        if (bf->lifetime == MF_LIFETIME_MICROBATCH)
            arena_end = end > arena_end ? end : arena_end;
        else
            pers_end = end > pers_end ? end : pers_end;
    }
    if (s->mem_persistent != pers_end || s->mem_transient != arena_end)
        fail_msg("%s: regions %lld + %lld, the buffers end at %lld and %lld", name,
                 (long long)s->mem_persistent, (long long)s->mem_transient, (long long)pers_end,
                 (long long)arena_end);
    assert_int_equal(s->summary.allocated_bytes, pers_end + arena_end);
    assert_true(s->summary.live_bytes <= s->mem_transient);
    assert_true(s->summary.live_bytes > 0);
    char msg[512];
    assert_int_equal(mf_arena_check(s, msg, sizeof msg), -1);
}

static void test_examples_totals(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
        char *text = spec_of(examples[i]);
        char *diag = NULL;
        mf_schedule *s = st_compile(examples[i], text, true, &diag);
        if (!s)
            fail_msg("%s: %s", examples[i], diag);
        check_totals(examples[i], s);
        /* and the loader agrees after a round trip */
        size_t len;
        char *yaml = st_emit(s, &len), err[1024];
        mf_schedule *back = mf_load_schedule_buffer("t.yaml", yaml, len, err, sizeof err);
        if (!back)
            fail_msg("%s: %s", examples[i], err);
        assert_int_equal(back->summary.allocated_bytes, s->summary.allocated_bytes);
        mf_schedule_free(back);
        free(yaml);
        free(diag);
        free(text);
        mf_schedule_free(s);
    }
}

/* Each wait the assignment added, removed alone, is refused. */
static void drop_each_added_wait(const char *name, const char *text)
{
    mf_schedule *before = lowered(name, text);
    int nbefore = before->nops;
    mf_op *orig = malloc(sizeof *orig * (size_t)nbefore);
    memcpy(orig, before->ops, sizeof *orig * (size_t)nbefore);
    mf_schedule_free(before);

    mf_schedule *s = lowered(name, text);
    mf_assign_stats st;
    assert_true(mf_assign_run(s, &st));
    char *diag = NULL;
    if (st_verify(s, &diag) != 0)
        fail_msg("%s: the assigned schedule does not verify:\n%s", name, diag);
    free(diag);
    /* the ops the assignment inserted: those the original sequence skips */
    int i = 0, added = 0;
    for (int j = 0; j < s->nops; j++) {
        if (i < nbefore && same_op(&s->ops[j], &orig[i])) {
            i++;
            continue;
        }
        if (s->ops[j].kind != MF_OP_WAIT)
            continue;
        added++;
        size_t len;
        char *yaml = st_emit(s, &len), err[1024];
        mf_schedule *m = mf_load_schedule_buffer("t.yaml", yaml, len, err, sizeof err);
        free(yaml);
        assert_non_null(m);
        st_drop_op(m, j);
        char *msgs = NULL;
        int n = st_verify(m, &msgs);
        if (n == 0 || !strstr(msgs, "without an event edge") || !strstr(msgs, "memory reuse"))
            fail_msg("%s: dropping wait op %d (event %d) added by the assignment: %d errors:\n%s", name, j,
                     s->ops[j].event, n, msgs ? msgs : "");
        free(msgs);
        mf_schedule_free(m);
    }
    assert_int_equal(i, nbefore);
    assert_int_equal(added, st.waits_added);
    free(orig);
    mf_schedule_free(s);
}

static void test_drop_reuse_waits(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
        char *text = spec_of(examples[i]);
        drop_each_added_wait(examples[i], text);
        free(text);
    }
}

/* A transient buffer moved onto another one live at the same time. */
static void test_shifted_offset_refused(void **state)
{
    (void)state;
    char *text = spec_of("hfsdp");
    mf_schedule *s = st_compile("hfsdp", text, true, NULL);
    assert_non_null(s);
    int a = st_buffer(s, "layers.1/hfsdp.weight_full"), b = st_buffer(s, "layers.2/hfsdp.weight_full");
    assert_true(a >= 0 && b >= 0);
    /* both are live from forward_pre(layers.1) on (prefetch 1) */
    assert_true(s->buffers[a].offset != s->buffers[b].offset);
    size_t len;
    char *yaml = st_emit(s, &len);
    char find[256], repl[256];
    snprintf(find, sizeof find, "{name: layers.2/hfsdp.weight_full,");
    char *line = strstr(yaml, find);
    assert_non_null(line);
    char *off = strstr(line, "offset: ");
    snprintf(find, sizeof find, "offset: %lld}", (long long)s->buffers[b].offset);
    assert_true(strncmp(off, find, strlen(find)) == 0);
    snprintf(repl, sizeof repl, "offset: %lld}", (long long)s->buffers[a].offset);
    size_t pre = (size_t)(off - yaml);
    char *edited = malloc(len + 64);
    memcpy(edited, yaml, pre);
    strcpy(edited + pre, repl);
    strcat(edited, off + strlen(find));
    char err[1024];
    mf_schedule *m = mf_load_schedule_buffer("t.yaml", edited, strlen(edited), err, sizeof err);
    assert_null(m);
    if (!strstr(err, "layers.2/hfsdp.weight_full") || !strstr(err, "layers.1/hfsdp.weight_full") ||
        !strstr(err, "while both are live"))
        fail_msg("unexpected: %s", err);
    /* the same offset shifted past the arena is refused too */
    snprintf(repl, sizeof repl, "offset: %lld}", (long long)s->mem_transient);
    memcpy(edited, yaml, pre);
    strcpy(edited + pre, repl);
    strcat(edited, off + strlen(find));
    m = mf_load_schedule_buffer("t.yaml", edited, strlen(edited), err, sizeof err);
    assert_null(m);
    if (!strstr(err, "lies outside the transient arena"))
        fail_msg("unexpected: %s", err);
    free(edited);
    free(yaml);
    free(text);
    mf_schedule_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples_totals),
        cmocka_unit_test(test_drop_reuse_waits),
        cmocka_unit_test(test_shifted_offset_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
