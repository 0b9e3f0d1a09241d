/*
 * Loader: round trip (load -> emit gives the same bytes; the hash is the
 * SHA-256 of the bytes) and every malformed case refused with the exact
 * located message "t.yaml:LINE:COL: error: ...", where LINE:COL is the YAML
 * mark of the offending node (computed from the mutated text, so the test
 * states which node the message must point at).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sched_test.h"

static const char *const spec =
    "mesh dp_outer = 2, dp_inner = 2;\n"
    "microbatches 2;\n"
    "layout L {\n"
    "  weight bf16 [Replicate, Flat];\n"
    "  grad fp32 [Partial, Flat];\n"
    "  main_weight fp32 [Flat, Flat];\n"
    "}\n"
    "unit \"u{i}\" for i in 0..2 layout L {\n"
    "  tensor \"a\" [37, 11];\n"
    "  tensor \"b\" [5];\n"
    "}\n";

static char *base;          /* the canonical YAML of spec */
static size_t base_len;
static int base_nops;

static int setup(void **state)
{
    (void)state;
    char *diag = NULL;
    mf_schedule *s = st_compile("base.mfsdp", spec, true, &diag);
    if (!s) {
        fprintf(stderr, "%s", diag);
        free(diag);
        return -1;
    }
    free(diag);
    base = st_emit(s, &base_len);
    base_nops = s->nops;
    mf_schedule_free(s);
    return base ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    free(base);
    return 0;
}

/* Replaces the nth (1-based) occurrence of find in text; owned result. */
static char *replace(const char *text, const char *find, int nth, const char *repl)
{
    const char *at = text;
    for (int i = 0; i < nth; i++) {
        at = strstr(i ? at + 1 : at, find);
        if (!at)
            fail_msg("'%s' (occurrence %d) not in the schedule", find, nth);
    }
    size_t pre = (size_t)(at - text), fl = strlen(find), rl = strlen(repl), tl = strlen(text);
    char *out = malloc(tl - fl + rl + 1);
    memcpy(out, text, pre);
    memcpy(out + pre, repl, rl);
    memcpy(out + pre + rl, at + fl, tl - pre - fl + 1);
    return out;
}

/* "LINE:COL" of the nth occurrence of needle. */
static void loc(const char *text, const char *needle, int nth, char *buf, size_t size)
{
    const char *at = text;
    for (int i = 0; i < nth; i++) {
        at = strstr(i ? at + 1 : at, needle);
        if (!at)
            fail_msg("mark '%s' (occurrence %d) not in the mutated schedule", needle, nth);
    }
    int line = 1, col = 1;
    for (const char *p = text; p < at; p++) {
        if (*p == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    snprintf(buf, size, "%d:%d", line, col);
}

static void expect_refused(const char *text, const char *mark, int mark_nth, const char *msg)
{
    char err[1024], where[32], want[1200];
    mf_schedule *s = mf_load_schedule_buffer("t.yaml", text, strlen(text), err, sizeof err);
    if (s)
        fail_msg("loaded, expected: %s", msg);
    if (mark) {
        loc(text, mark, mark_nth, where, sizeof where);
        snprintf(want, sizeof want, "t.yaml:%s: error: %s", where, msg);
    } else {
        snprintf(want, sizeof want, "t.yaml: error: %s", msg);
    }
    assert_string_equal(err, want);
}

/* Mutates the base by replacing `find` (nth occurrence) with `repl` and
 * expects msg at the nth occurrence of `mark` in the mutated text. */
static void bad(const char *find, int nth, const char *repl, const char *mark, int mark_nth, const char *msg)
{
    char *text = replace(base, find, nth, repl);
    expect_refused(text, mark, mark_nth, msg);
    free(text);
}

static void test_roundtrip(void **state)
{
    (void)state;
    char err[1024];
    mf_schedule *s = mf_load_schedule_buffer("t.yaml", base, base_len, err, sizeof err);
    if (!s)
        fail_msg("%s", err);
    size_t len;
    char *again = st_emit(s, &len);
    assert_int_equal(len, base_len);
    assert_memory_equal(again, base, len);
    uint8_t h[32];
    mf_sha256(base, base_len, h, NULL);
    assert_memory_equal(h, s->hash, 32);
    assert_string_equal(s->source, "base.mfsdp");
    assert_int_equal(s->units[1].first_bucket, 1);
    assert_int_equal(s->units[1].nbuckets, 1);
    assert_int_equal(st_verify(s, NULL), 0);
    free(again);
    mf_schedule_free(s);
}

/* A schedule written by hand in another (valid) style loads, and emits the
 * canonical form. */
static void test_non_canonical_input(void **state)
{
    (void)state;
    char *t1 = replace(base, "microbatches: 2", 1, "microbatches:    2   # a comment");
    char *t2 = replace(t1, "reduce: avg", 1, "\"reduce\": 'avg'");
    char err[1024];
    mf_schedule *s = mf_load_schedule_buffer("t.yaml", t2, strlen(t2), err, sizeof err);
    if (!s)
        fail_msg("%s", err);
    size_t len;
    char *canon = st_emit(s, &len);
    assert_int_equal(len, base_len);
    assert_memory_equal(canon, base, len);
    free(canon);
    mf_schedule_free(s);
    free(t1);
    free(t2);
}

static void test_format_and_keys(void **state)
{
    (void)state;
    bad("mfsdp-schedule/4", 1, "mfsdp-schedule/9", "mfsdp-schedule/9", 1,
        "unknown format 'mfsdp-schedule/9' (expected mfsdp-schedule/4)");
    bad("mfsdp-schedule/4", 1, "mfsdp-schedule/1", "mfsdp-schedule/1", 1,
        "format 'mfsdp-schedule/1' was written by an older mfsdpc: it has no buffer offsets or arena; "
        "compile the spec again with this mfsdpc (expected mfsdp-schedule/4)");
    bad("mfsdp-schedule/4", 1, "mfsdp-schedule/2", "mfsdp-schedule/2", 1,
        "format 'mfsdp-schedule/2' was written by an older mfsdpc: its summary has no interference_bytes and "
        "calls the per-role model peak_bytes; compile the spec again with this mfsdpc (expected mfsdp-schedule/4)");
    bad("format: mfsdp-schedule/4\n", 1, "", "source:", 1, "missing key 'format' (expected format: mfsdp-schedule/4)");
    bad("microbatches: 2\n", 1, "", "format", 1, "missing key 'microbatches' in the schedule");
    bad("reduce: avg\n", 1, "reduce: avg\nextra: 1\n", "extra", 1, "unknown key 'extra' in the schedule");
    bad("{id: 0, phase", 1, "{id: 0, id: 0, phase", "id: 0", 2, "duplicate key 'id' in an op");
    bad("{name: u0, reshard", 1, "{reshard", "{reshard", 1, "missing key 'name' in a unit");
    bad("events: 29\n", 1, "", "format", 1, "missing key 'events' in the schedule");
    bad("op: cast,", 1, "op: cast, event: 3,", "event: 3", 1, "op 2: a cast op has no key 'event'");
    bad("op: record, event: 0}", 1, "op: record, event: 0, count: 77}", "count: 77", 1,
        "op 0: a record op has no key 'count'");
    bad("op: cast, transition: T1, ", 1, "op: cast, ", "{id: 2,", 1, "missing key 'transition' in op 2 (cast)");
    bad("unit: u0, when: first, stream: outer, op: wait", 1, "when: first, stream: outer, op: wait", "{id: 1,", 1,
        "missing key 'unit' in op 1 (phase forward_pre)");
    bad("{id: 0, phase: step_begin,", 1, "{id: 0, phase: step_begin, unit: u0,", "unit: u0, when: every", 1,
        "op 0: a step_begin op has no unit");
}

static void test_types(void **state)
{
    (void)state;
    bad("microbatches: 2", 1, "microbatches: [2]", "[2]", 1, "expected an integer for microbatches, got a sequence");
    bad("count: 128", 1, "count: \"128\"", "\"128\"", 1,
        "expected an integer for the buffer count, got the quoted string '128'");
    bad("count: 128", 1, "count: 12x", "12x", 1, "expected an integer for the buffer count, got '12x'");
    bad("count: 128", 1, "count: 0128", "0128", 1, "expected an integer for the buffer count, got '0128'");
    bad("reshard_after_forward: true", 1, "reshard_after_forward: yes", "yes", 1,
        "expected true or false for reshard_after_forward");
    bad("mesh: {axes:", 1, "mesh: {axes: 3, xkey:", "xkey", 1, "unknown key 'xkey' in mesh");
    bad("dims: [37, 11]", 1, "dims: 37", "37}", 1, "expected a sequence for dims, got a scalar");
    bad("name: u0/L\n", 1, "name: [u0/L]\n", "[u0/L]\n", 1, "expected a string for the bucket name, got a sequence");
    bad("format: mfsdp-schedule/4\n", 1, "- format: mfsdp-schedule/4\n", "source:", 1,
        "invalid YAML: did not find expected '-' indicator while parsing a block collection");
}

static void test_enums(void **state)
{
    (void)state;
    bad("dtype: bf16", 1, "dtype: bf8", "bf8", 1, "unknown dtype 'bf8' (expected fp32, bf16, fp16)");
    bad("reduce: avg", 1, "reduce: max", "max", 1, "unknown reduce op 'max' (expected avg, sum)");
    bad("placement: [Replicate, Flat]", 1, "placement: [Replicate, Sharded]", "Sharded", 1,
        "unknown placement 'Sharded' (expected Replicate, Flat, Partial)");
    bad("phase: forward_pre", 1, "phase: forward", "forward,", 1,
        "unknown phase 'forward' (expected step_begin, forward_pre, forward_post, backward_pre, backward_post, step_end, eval_forward_pre, eval_forward_post)");
    bad("when: first", 1, "when: sometimes", "sometimes", 1, "unknown when 'sometimes' (expected first, every, last, short)");
    bad("stream: outer", 1, "stream: side", "side", 1, "unknown stream 'side' (expected compute, inner, outer)");
    bad("op: all_gather", 1, "op: broadcast", "broadcast", 1,
        "unknown op 'broadcast' (expected all_gather, reduce_scatter, all_reduce, slice, cast, accumulate, record, wait)");
    bad("kind: weight_stage", 1, "kind: scratch", "scratch", 1,
        "unknown buffer kind 'scratch' (expected main_weight, weight, weight_stage, weight_full, grad_local, grad_stage, "
        "grad, grad_final)");
    bad("lifetime: microbatch", 1, "lifetime: forever", "forever", 1,
        "unknown lifetime 'forever' (expected persistent, step, microbatch)");
    bad("transition: T1", 1, "transition: T5", "T5", 1, "unknown transition 'T5' (expected T1, T2, T3, T4)");
}

static void test_references(void **state)
{
    (void)state;
    bad("bucket: u0/L, kind: main_weight", 1, "bucket: u9/L, kind: main_weight", "u9/L", 1, "unknown bucket 'u9/L'");
    bad("src: u0/L.main_weight", 1, "src: u0/L.nothing", "u0/L.nothing", 1, "unknown buffer 'u0/L.nothing'");
    bad("unit: u0, when", 1, "unit: u7, when", "u7", 1, "unknown unit 'u7'");
    bad("axis: dp_outer", 1, "axis: dp_middle", "dp_middle", 1, "unknown axis 'dp_middle'");
    bad("last_unit: u0", 1, "last_unit: nobody", "nobody", 1, "unknown unit 'nobody'");
    bad("buckets: [u0/L]", 1, "buckets: [u1/L]", "u1/L]", 1, "unit 'u0' lists bucket 'u1/L', whose unit is 'u1'");
    bad("buckets: [u0/L]", 1, "buckets: []", "[]", 1, "unit 'u0' lists 0 buckets, but 1 buckets name it as their unit");
    bad("op: record, event: 0}", 1, "op: record, event: 99}", "99", 1,
        "op 0: event 99 does not exist (the schedule has 29 events)");
    char msg[128];
    snprintf(msg, sizeof msg, "the schedule declares 100000 events but has only %d ops", base_nops);
    bad("events: 29", 1, "events: 100000", "- {id: 0,", 1, msg);
    bad("last_unit: u1", 1, "last_unit: u0", "u0\n  layout", 2,
        "bucket 'u1/L': last_unit 'u0' comes before its unit 'u1'");
    bad("dst: u0/L.T1.cast}", 1, "dst: u1/L.T1.cast}", "u1/L.T1.cast}", 1,
        "op 2: destination buffer 'u1/L.T1.cast' belongs to bucket 'u1/L', not to the op's bucket 'u0/L'");
}

static void test_sizes(void **state)
{
    (void)state;
    /* an op count that does not fit its buffers */
    bad("axis: dp_outer, dtype: bf16, count: 128", 1, "axis: dp_outer, dtype: bf16, count: 64", "64, src: u0", 1,
        "op 3 (all_gather): count 64 needs a source of 64 elements, but 'u0/L.T1.cast' holds 128");
    bad("axis: dp_inner, dtype: bf16, count: 256", 1, "axis: dp_inner, dtype: bf16, count: 255", "255", 1,
        "op 7 (all_gather): count 255 needs a source of 255 elements, but 'u0/L.weight' holds 256");
    /* a buffer count that is not length / shards */
    bad("placement: [Flat, Flat], count: 128", 1, "placement: [Flat, Flat], count: 256", "256, lifetime", 1,
        "buffer 'u0/L.main_weight': count 256 does not match its bucket's length 512 over the 4 shards of its placement");
    bad("length: 512", 1, "length: 510", "510", 1,
        "bucket 'u0/L': length 510 is not divisible by the 4 shards of its main_weight placement");
    /* tensors */
    bad("offset: 408", 1, "offset: 400", "400, numel", 1,
        "tensor 'u0.b' at offset 400 overlaps the previous tensor (which ends at 407)");
    bad("offset: 408", 1, "offset: 409", "409", 1,
        "tensor 'u0.b' (offset 409, numel 5) lies outside the used part of bucket 'u0/L' (413 elements)");
    bad("numel: 407", 1, "numel: 406", "406", 1, "tensor 'u0.a': numel 406 is not the product of its dims (407)");
    bad("used: 413", 1, "used: 600", "600", 1, "bucket 'u0/L': used 600 exceeds the length 512");
    /* issue 39: a forged `used` past the furthest tensor (within the length) */
    bad("used: 413", 1, "used: 500", "500", 1,
        "bucket 'u0/L': used 500 is not the end of its furthest tensor ('u0.b' ends at 413)");
    /* negative and overflowing numbers */
    bad("length: 512", 1, "length: -512", "-512", 1, "the bucket length must be at least 1, got -512");
    bad("offset: 0", 1, "offset: -1", "-1", 1, "the tensor offset must not be negative, got -1");
    bad("count: 128", 1, "count: 99999999999999999999", "9999", 1,
        "the buffer count overflows 64 bits: '99999999999999999999'");
    /* sizes beyond the shared limits (core/mf_limits.h) */
    bad("size: 2}, {name: dp_inner, size: 2}", 1, "size: 4294967296}, {name: dp_inner, size: 4294967296}",
        "4294967296}", 1, "the axis size must be at most 16777216, got 4294967296");
    bad("dims: [37, 11]", 1, "dims: [4294967296, 4294967296, 4]", "4294967296, 4]", 1,
        "the size of tensor 'u0.a' overflows 64 bits");
    bad("microbatches: 2", 1, "microbatches: 0", "0\n", 1, "microbatches must be at least 1, got 0");
    bad("align: 256", 1, "align: 100", "100", 1, "align must be a power of two, got 100");
    bad("prefetch: 1", 1, "prefetch: 3000000000", "3000000000", 1, "prefetch must be at most 1024, got 3000000000");
}

static void test_names_and_rules(void **state)
{
    (void)state;
    bad("{name: u1, reshard", 1, "{name: u0, reshard", "u0, reshard", 2, "duplicate unit name 'u0'");
    bad("{name: u0/L.weight,", 1, "{name: u0/L.main_weight,", "u0/L.main_weight, bucket", 2,
        "duplicate buffer name 'u0/L.main_weight'");
    bad("{name: dp_inner, size", 1, "{name: dp_outer, size", "dp_outer, size", 2, "duplicate axis name 'dp_outer'");
    bad("{name: u1.b,", 1, "{name: u1.a,", "u1.a,", 2, "duplicate tensor name 'u1.a'");
    /* normative buffer rules */
    bad("kind: weight_full", 1, "kind: weight_stage", "- {name: u0/L.main_weight", 1,
        "bucket 'u0/L' has no weight_full buffer (its weight is not replicated)");
    bad("kind: grad_local, dtype: fp32", 1, "kind: grad_local, dtype: bf16", "{name: u0/L.grad_local", 1,
        "buffer 'u0/L.grad_local' (grad_local) has dtype bf16, expected fp32");
    bad("kind: weight, dtype: bf16, placement: [Replicate, Flat], count: 256", 1,
        "kind: weight_full, dtype: bf16, placement: [Replicate, Flat], count: 256", "{name: u0/L.weight,", 1,
        "buffer 'u0/L.weight' (weight_full) has placement [Replicate, Flat], expected [Replicate, Replicate]");
    bad("placement: [Replicate, Flat]}", 1, "placement: [Flat, Replicate]}", "[Flat, Replicate]", 1,
        "the weight placement: the Flat axes must be the innermost ones (a suffix of the mesh)");
    bad("placement: [Replicate, Flat]}", 1, "placement: [Partial, Flat]}", "Partial, Flat]}", 1,
        "the weight placement may not be Partial");
    bad("placement: [Replicate, Flat]}", 1, "placement: [Flat]}", "[Flat]}", 1,
        "the weight placement has 1 entries, expected one per mesh axis (2)");
    /* ops the runtime could not run safely */
    bad("{id: 1,", 1, "{id: 5,", "5, phase: forward_pre, unit: u0, when: first, stream: outer", 1, "op id 5 out of sequence, expected 1 (ids are the op's index)");
    bad("src: u0/L.T1.cast, dst: u0/L.weight}", 1, "src: u0/L.weight, dst: u0/L.weight}", "u0/L.weight}", 1,
        "op 3: a all_gather op cannot work in place (src and dst are both 'u0/L.weight')");
    bad("op: cast, transition: T1, bucket: u0/L, dtype: bf16", 1, "op: cast, transition: T1, bucket: u0/L, dtype: fp32",
        "fp32, count: 128, src: u0/L.main", 1, "op 2: dtype fp32 differs from the destination 'u0/L.T1.cast' (bf16)");
}

static void test_summary(void **state)
{
    (void)state;
    bad("all_gather: {dp_outer: 2,", 1, "all_gather: {dp_outer: 3,", "3, dp_inner", 1,
        "summary collectives.all_gather.dp_outer is 3, but the ops give 2");
    /* one more than the true value */
    const char *at = strstr(base, "model_bytes: {weight: ");
    assert_non_null(at);
    long long v = strtoll(at + strlen("model_bytes: {weight: "), NULL, 10);
    char find[64], repl[64], msg[128];
    snprintf(find, sizeof find, "model_bytes: {weight: %lld,", v);
    snprintf(repl, sizeof repl, "model_bytes: {weight: %lld,", v + 1);
    snprintf(msg, sizeof msg, "summary model_bytes.weight is %lld, but the buffers give %lld", v + 1, v);
    char mark[32];
    snprintf(mark, sizeof mark, "%lld, grad", v + 1);
    bad(find, 1, repl, mark, 1, msg);
}

static void test_documents(void **state)
{
    (void)state;
    expect_refused("", NULL, 0, "the file is empty (expected a schedule, format mfsdp-schedule/4)");
    expect_refused("- a\n- b\n", "- a", 1, "expected a schedule (a mapping), got a sequence");
    char *two = malloc(base_len + 32);
    snprintf(two, base_len + 32, "%s---\nx: 1\n", base);
    expect_refused(two, "x: 1", 1, "a second YAML document (a schedule file holds exactly one)");
    free(two);
    /* unterminated flow mapping: libyaml's message, located */
    char *cut = replace(base, "event: 0}", 1, "event: 0");
    char err[1024];
    assert_null(mf_load_schedule_buffer("t.yaml", cut, strlen(cut), err, sizeof err));
    assert_non_null(strstr(err, "t.yaml:"));
    assert_non_null(strstr(err, ": error: invalid YAML: "));
    free(cut);
    /* a NUL inside a name */
    char nul[] = "format: \"mfsdp-schedule/4\\0x\"\n";
    expect_refused(nul, "\"mfsdp", 1, "format contains a NUL character");
}

static void test_every_truncation(void **state)
{
    (void)state;
    /* No prefix of a schedule loads, and none crashes (run under the sanitizers). */
    char err[256];
    for (size_t n = 0; n + 1 < base_len; n += 7) {
        mf_schedule *s = mf_load_schedule_buffer("t.yaml", base, n, err, sizeof err);
        if (s)
            fail_msg("a %zu-byte prefix loaded", n);
        assert_non_null(strstr(err, "error: "));
    }
}

static void test_file_errors(void **state)
{
    (void)state;
    char err[512];
    assert_null(mf_load_schedule_file("/nonexistent/dir/x.yaml", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/dir/x.yaml: error: cannot open: "));
    /* a tiny error buffer truncates, never overflows */
    char small[12];
    assert_null(mf_load_schedule_buffer("t.yaml", "x", 1, small, sizeof small));
    assert_int_equal(strlen(small), sizeof small - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_non_canonical_input),
        cmocka_unit_test(test_format_and_keys),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_enums),
        cmocka_unit_test(test_references),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_names_and_rules),
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_documents),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_file_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
