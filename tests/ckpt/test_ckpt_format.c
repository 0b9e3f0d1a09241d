/*
 * The checkpoint format's parts: CRC-32C against the RFC 3720 test vectors
 * and its combination; the safetensors header parser's refusals (overlap,
 * gap, past the end, dtype/shape/size disagreement, duplicate names, header
 * bounds), each message naming the file and tensor; the manifest's checks;
 * and the write plan's properties on compiled schedules (argv: schedules):
 * every tensor element written exactly once, by a rank that holds it, and
 * ranks holding the same elements (replicas) writing equal shares: within one
 * element per bucket of each other.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "mf_ckpt_crc.h"
#include "mf_ckpt_io.h"
#include "mf_ckpt_manifest.h"
#include "mf_ckpt_plan.h"
#include "mf_ckpt_st.h"
#include "mf_load.h"

static int g_nsched;
static char **g_sched;

static void test_crc_vectors(void **state)
{
    (void)state;
    uint8_t buf[32];
    assert_int_equal(mf_ckpt_crc_update(0, "123456789", 9), 0xe3069283u);
    memset(buf, 0, 32);
    assert_int_equal(mf_ckpt_crc_update(0, buf, 32), 0x8a9136aau);
    memset(buf, 0xff, 32);
    assert_int_equal(mf_ckpt_crc_update(0, buf, 32), 0x62a8ab43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    assert_int_equal(mf_ckpt_crc_update(0, buf, 32), 0x46dd794eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    assert_int_equal(mf_ckpt_crc_update(0, buf, 32), 0x113fdb5cu);
    assert_int_equal(mf_ckpt_crc_update(0, buf, 0), 0u);
}

/* The CRC of a concatenation, from its parts, at every split point and
 * misalignment of a 1000-byte string. */
static void test_crc_combine(void **state)
{
    (void)state;
    uint8_t buf[1001];
    for (int i = 0; i < 1001; i++)
        buf[i] = (uint8_t)(i * 131 + 7);
    for (int off = 0; off < 2; off++) {
        uint32_t whole = mf_ckpt_crc_update(0, buf + off, 1000);
        for (size_t k = 0; k <= 1000; k += 37) {
            uint32_t a = mf_ckpt_crc_update(0, buf + off, k), b = mf_ckpt_crc_update(0, buf + off + k, 1000 - k);
            assert_int_equal(mf_ckpt_crc_combine(a, b, 1000 - k), whole);
            assert_int_equal(mf_ckpt_crc_update(a, buf + off + k, 1000 - k), whole);
        }
    }
}

/* Large buffers (the three-chain path) against a bit-at-a-time CRC-32C. */
static void test_crc_large(void **state)
{
    (void)state;
    size_t n = 200003;
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)((i * 2654435761u) >> 13);
    for (size_t off = 0; off < 3; off++) {
        uint32_t c = 0xffffffffu;
        for (size_t i = off; i < n; i++) {
            c ^= buf[i];
            for (int k = 0; k < 8; k++)
                c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        }
        assert_int_equal(mf_ckpt_crc_update(0, buf + off, n - off), ~c);
        assert_int_equal(mf_ckpt_crc_update(mf_ckpt_crc_update(0, buf + off, 1000), buf + off + 1000, n - off - 1000), ~c);
    }
    free(buf);
}

/* Parses json with a data section of data_len bytes; returns the message
 * ("" on success). */
static const char *st_parse(const char *json, uint64_t data_len)
{
    static char err[1024];
    mf_st_file f;
    err[0] = '\0';
    if (mf_ckpt_st_parse("f.safetensors", json, strlen(json), data_len, &f, err, sizeof err) == 0) {
        mf_ckpt_st_free(&f);
        assert_string_equal(err, "");
    } else {
        assert_true(err[0] != '\0');
    }
    return err;
}

static void expect_err(const char *json, uint64_t data_len, const char *part)
{
    const char *e = st_parse(json, data_len);
    if (!strstr(e, part) || strncmp(e, "f.safetensors: ", 15) != 0) {
        print_error("message '%s' does not contain '%s'\n", e, part);
        fail();
    }
}

static void test_st_valid(void **state)
{
    (void)state;
    const char *j = "{\"__metadata__\":{\"k\":\"v\"},\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[24,28]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                    "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[28,28]}}";
    mf_st_file f;
    char err[256];
    assert_int_equal(mf_ckpt_st_parse("f", j, strlen(j), 28, &f, err, sizeof err), 0);
    assert_int_equal(f.n, 3);
    assert_string_equal(f.e[0].name, "a"); /* sorted by offset */
    assert_int_equal(f.e[0].numel, 6);
    assert_string_equal(mf_ckpt_st_meta(&f, "k"), "v");
    assert_non_null(mf_ckpt_st_find(&f, "b"));
    mf_ckpt_st_free(&f);
}

static void test_st_refusals(void **state)
{
    (void)state;
    expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               "tensor 'b': data_offsets [4, 12) overlap tensor 'a'");
    expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20,
               "tensor 'b': data_offsets [12, 20) leave a gap of 4 bytes");
    expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12,
               "tensor 'a': data_offsets [0, 16) run past the end of the data (12 bytes)");
    expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
               "the tensors cover 8 of the data section's 12 bytes");
    expect_err("{\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': 3 elements of F16 are 6 bytes, data_offsets [0, 8) hold 8");
    expect_err("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': unknown or missing dtype 'F33'");
    expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "tensor 'a': shape[0]");
    expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "tensor 'a': data_offsets");
    expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16,
               "header: line 1, column 57: duplicate object key");
    expect_err("{\"a\":{\"dtype\":\"F32\",", 8, "header: line 1, column 20:");
    expect_err("[1]", 0, "header does not start with '{'");
    expect_err("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value of 'k' is not a string");
    expect_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': shape overflows");
}

/* Header length fields: over 100 MB, past the end of the file. */
static void test_st_bounds(void **state)
{
    (void)state;
    char path[] = "/tmp/mf_st_XXXXXX", err[512];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    uint8_t len[8] = {0};
    uint64_t n = 100000001;
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    assert_int_equal(write(fd, len, 8), 8);
    assert_int_equal(write(fd, "{}      ", 8), 8);
    mf_st_file f;
    assert_int_equal(mf_ckpt_st_read(fd, "x.safetensors", 16, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "x.safetensors: header length 100000001 exceeds the limit of 100000000"));
    len[0] = 9, len[1] = len[2] = len[3] = 0;
    assert_int_equal(pwrite(fd, len, 8, 0), 8);
    assert_int_equal(mf_ckpt_st_read(fd, "x.safetensors", 16, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "header length 9 runs past the end of the file (16 bytes)"));
    assert_int_equal(mf_ckpt_st_read(fd, "x.safetensors", 4, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "too short"));
    len[0] = 8;
    assert_int_equal(pwrite(fd, len, 8, 0), 8);
    assert_int_equal(mf_ckpt_st_read(fd, "x.safetensors", 16, &f, err, sizeof err), 0);
    assert_int_equal(f.n, 0);
    mf_ckpt_st_free(&f);
    close(fd);
    unlink(path);
}

/* Build, then parse back: the same entries and metadata; 8-byte padding. */
static void test_st_build(void **state)
{
    (void)state;
    mf_st_entry e[2] = {{.name = "w\"1", .dtype = MF_ST_F32, .ndims = 2, .shape = {2, 3}, .begin = 0, .end = 24},
                        {.name = "b", .dtype = MF_ST_U8, .ndims = 1, .shape = {5}, .begin = 24, .end = 29}};
    const char *k[] = {"fmt"}, *v[] = {"x"};
    uint8_t *out;
    size_t len;
    assert_int_equal(mf_ckpt_st_build(e, 2, k, v, 1, &out, &len), 0);
    assert_int_equal(len % 8, 0);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | out[i];
    assert_int_equal(n, len - 8);
    mf_st_file f;
    char err[256];
    assert_int_equal(mf_ckpt_st_parse("f", (char *)out + 8, n, 29, &f, err, sizeof err), 0);
    assert_string_equal(f.e[0].name, "w\"1");
    assert_int_equal(f.e[1].end, 29);
    assert_string_equal(mf_ckpt_st_meta(&f, "fmt"), "x");
    mf_ckpt_st_free(&f);
    free(out);
}

#define MANI_FMT                                                                                           \
    "{\"format\":\"mfsdp-checkpoint\",\"version\":%d,\"checkpoint_id\":\"0123456789abcdef0123456789abcdef\"," \
    "\"step\":1,\"schedule_sha256\":\"0000000000000000000000000000000000000000000000000000000000000000\","   \
    "\"mesh\":[{\"axis\":\"dp\",\"size\":2}],\"world\":2,\"states\":[{\"name\":\"main_weight\",\"dtype\":"   \
    "\"fp32\"}],\"tensors\":[{\"name\":\"t\",\"shape\":[10]}],\"files\":[%s]}"
#define MANI_FILE "{\"name\":\"%s\",\"rank\":%d,\"bytes\":100,\"crc32c\":\"00000000\",\"pieces\":[%s]}"

/* The parser's refusal of a manifest of tensor t[10] whose files are
 * `files` (MANI_FILE objects), "" when it accepts it. */
static const char *mani_files(int version, const char *files)
{
    static char text[2048], err[1024];
    snprintf(text, sizeof text, MANI_FMT, version, files);
    mf_ckpt_manifest m;
    err[0] = '\0';
    if (mf_ckpt_manifest_parse("manifest.json", text, strlen(text), &m, err, sizeof err) == 0)
        mf_ckpt_manifest_free(&m);
    return err;
}

/* One file, rank 0's. */
static const char *mani(int version, const char *file, const char *pieces)
{
    char f[1024];
    snprintf(f, sizeof f, MANI_FILE, file, 0, pieces);
    return mani_files(version, f);
}

/* Two files, a.safetensors (rank 0) holding pieces a and b.safetensors
 * (rank 1) holding pieces b. */
static const char *mani2(const char *a, const char *b)
{
    char f[1024];
    snprintf(f, sizeof f, MANI_FILE "," MANI_FILE, "a.safetensors", 0, a, "b.safetensors", 1, b);
    return mani_files(1, f);
}

/* A gap or an overlap names the files on both sides of it. */
static void test_manifest_coverage_files(void **state)
{
    (void)state;
    assert_string_equal(mani2("[0,0,0,4,8]", "[0,0,4,10,8]"), "");
    assert_string_equal(mani2("[0,0,0,4,8]", "[0,0,5,10,8]"),
                        "manifest.json: main_weight of tensor \"t\": elements [4, 5) are stored nowhere (the piece "
                        "before them ends at 4 in file \"a.safetensors\", the next starts at 5 in file "
                        "\"b.safetensors\")");
    assert_non_null(strstr(mani2("[0,0,6,10,8]", "[0,0,0,5,8]"), "ends at 5 in file \"b.safetensors\", the next "
                                                                  "starts at 6 in file \"a.safetensors\")"));
    assert_non_null(strstr(mani2("[0,0,0,5,8]", "[0,0,4,10,8]"),
                           "elements [4, 5) are stored twice (in file \"a.safetensors\" and in file "
                           "\"b.safetensors\")"));
    assert_non_null(strstr(mani2("[0,0,2,4,8]", "[0,0,4,10,8]"),
                           "elements [0, 2) are stored nowhere (the first piece starts at 2, in file "
                           "\"a.safetensors\")"));
    assert_non_null(strstr(mani2("[0,0,0,4,8]", "[0,0,4,9,8]"),
                           "elements [9, 10) are stored nowhere (the last piece ends at 9, in file "
                           "\"b.safetensors\")"));
}

static void test_manifest(void **state)
{
    (void)state;
    assert_string_equal(mani(1, "a.safetensors", "[0,0,0,4,8],[0,0,4,10,24]"), "");
    assert_non_null(strstr(mani(2, "a.safetensors", "[0,0,0,10,8]"), "format version 2 is not supported"));
    assert_non_null(strstr(mani(1, "../a", "[0,0,0,10,8]"), "files[0]: \"name\" must be a plain file name"));
    assert_non_null(strstr(mani(1, "a.safetensors", "[0,0,0,10,80]"), "files[0].pieces[0]: bytes [80, 120) run past"));
    assert_non_null(strstr(mani(1, "a.safetensors", "[0,0,0,4,8],[0,0,5,10,24]"),
                           "main_weight of tensor \"t\": elements [4, 5) are stored nowhere"));
    assert_non_null(strstr(mani(1, "a.safetensors", "[0,0,0,5,8],[0,0,4,10,28]"),
                           "main_weight of tensor \"t\": elements [4, 5) are stored twice"));
    assert_non_null(strstr(mani(1, "a.safetensors", "[0,0,0,4,8]"), "elements [4, 10) are stored nowhere"));
    assert_non_null(strstr(mani(1, "a.safetensors", "[0,1,0,10,8]"), "files[0].pieces[0]: not [state, tensor"));
}

/* Pieces read in part (mf_ckpt_parts_check): one file of 100 bytes whose
 * single piece, tensor t's 10 fp32 elements, is bytes [8, 48). */
typedef struct parts_fx {
    char dir[64];
    unsigned char bytes[100];
    mf_ckpt_reader r;
    mf_ckpt_rfile rf;
} parts_fx;

static void parts_open(parts_fx *x)
{
    snprintf(x->dir, sizeof x->dir, "/tmp/mf-parts-XXXXXX");
    assert_non_null(mkdtemp(x->dir));
    char path[128], text[2048], err[1024];
    snprintf(path, sizeof path, "%s/a.safetensors", x->dir);
    for (int i = 0; i < 100; i++)
        x->bytes[i] = (unsigned char)(i * 37 + 11);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, x->bytes, 100), 100);
    memset(&x->r, 0, sizeof x->r);
    char file[256];
    snprintf(file, sizeof file, MANI_FILE, "a.safetensors", 0, "[0,0,0,10,8]");
    snprintf(text, sizeof text, MANI_FMT, 1, file);
    assert_int_equal(mf_ckpt_manifest_parse("manifest.json", text, strlen(text), &x->r.m, err, sizeof err), 0);
    x->rf = (mf_ckpt_rfile){.fd = fd, .checked = 1, .dfd = -1};
    x->r.f = &x->rf;
    x->r.dir = x->dir;
}

static void parts_close(parts_fx *x)
{
    char path[128];
    snprintf(path, sizeof path, "%s/a.safetensors", x->dir);
    close(x->rf.fd);
    unlink(path);
    rmdir(x->dir);
    mf_ckpt_manifest_free(&x->r.m);
}

/* Part [off, off + len) of the piece as rank `rank` read it. */
static mf_ckpt_part part(const parts_fx *x, uint64_t off, uint64_t len, int64_t rank)
{
    return (mf_ckpt_part){0, off, len, mf_ckpt_crc_update(0, x->bytes + 8 + off, len), mf_ckpt_crc_update(0, x->bytes + 8, 40), rank};
}

static void test_parts(void **state)
{
    (void)state;
    parts_fx x;
    char err[1024] = "";
    parts_open(&x);
    /* Two ranks' parts, given out of order: combined, nothing read. */
    mf_ckpt_part two[2] = {part(&x, 16, 24, 1), part(&x, 0, 16, 0)};
    assert_int_equal(mf_ckpt_parts_check(&x.r, two, 2, 0, err, sizeof err), 0);
    assert_int_equal(x.r.bytes_read, 0);
    /* Bytes no part covers (a head and a tail) are read by the checker. */
    mf_ckpt_part mid[1] = {part(&x, 8, 8, 0)};
    assert_int_equal(mf_ckpt_parts_check(&x.r, mid, 1, 0, err, sizeof err), 0);
    assert_int_equal(x.r.bytes_read, 32);
    /* Replicas that read the same part: counted once. */
    mf_ckpt_part dup[3] = {part(&x, 0, 16, 0), part(&x, 0, 16, 2), part(&x, 16, 24, 1)};
    assert_int_equal(mf_ckpt_parts_check(&x.r, dup, 3, 0, err, sizeof err), 0);
    /* A part whose bytes were corrupt when read (its CRC is of other bytes). */
    mf_ckpt_part bad[2] = {part(&x, 0, 16, 0), part(&x, 16, 24, 1)};
    bad[1].crc ^= 1;
    assert_int_equal(mf_ckpt_parts_check(&x.r, bad, 2, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "/a.safetensors: entry 'main_weight:t[0:10]' fails its CRC-32C (read in part): the "
                                "file is corrupt"));
    /* Only the reader of the first part checks: rank 1 leaves it to rank 0. */
    bad[1].crc ^= 1;
    bad[0].crc ^= 1;
    assert_int_equal(mf_ckpt_parts_check(&x.r, bad, 2, 1, err, sizeof err), 0);
    assert_int_equal(mf_ckpt_parts_check(&x.r, bad, 2, 0, err, sizeof err), -1);
    /* Replicas that read different bytes, overlapping parts, a part past the piece. */
    mf_ckpt_part diff[3] = {part(&x, 0, 16, 0), part(&x, 0, 16, 2), part(&x, 16, 24, 1)};
    diff[1].crc ^= 1;
    assert_int_equal(mf_ckpt_parts_check(&x.r, diff, 3, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "ranks 0 and 2 read different bytes"));
    mf_ckpt_part over[2] = {part(&x, 0, 16, 0), part(&x, 8, 32, 1)};
    assert_int_equal(mf_ckpt_parts_check(&x.r, over, 2, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "ranks 0 and 1 read overlapping parts"));
    mf_ckpt_part past[1] = {part(&x, 32, 8, 0)};
    past[0].len = 16;
    assert_int_equal(mf_ckpt_parts_check(&x.r, past, 1, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "rank 0 read bytes [32, 48) of it, which has 40"));
    /* A flip in bytes that no part covered: found by the checker's own read. */
    assert_int_equal(pwrite(x.rf.fd, "\xff", 1, 8 + 30), 1);
    mf_ckpt_part head[1] = {part(&x, 0, 16, 0)};
    assert_int_equal(mf_ckpt_parts_check(&x.r, head, 1, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "fails its CRC-32C (read in part)"));
    parts_close(&x);
}

/* A schedule with a Distinct tensor without global names has no checkpoint
 * plan (the offline tools and reshard-plan build one first): refused naming
 * the tensor, its bucket and the clause; the split form is refused too. With
 * rename global names the plan holds one tensor per ep coordinate under its
 * global name, written by ranks of that coordinate only, every element once. */
static void test_plan_refuses_distinct(void **state)
{
    (void)state;
    mf_tensor t = {.name = "moe.experts.0.w1.weight", .ndims = 1, .dims = {64}, .numel = 64};
    mf_bucket b = {.name = "moe/ep_experts", .length = 64, .used = 64, .ntensors = 1, .tensors = &t};
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        b.place[r].p[0] = MF_PLACE_DISTINCT;
        b.place[r].p[1] = MF_PLACE_FLAT;
    }
    mf_schedule s = {.mesh = {.naxes = 2, .world = 4}, .nbuckets = 1, .buckets = &b};
    s.mesh.axes[0] = (mf_axis){.name = "ep", .size = 2};
    s.mesh.axes[1] = (mf_axis){.name = "dp", .size = 2};
    mf_ckpt_plan p;
    char err[512];
    assert_int_equal(mf_ckpt_plan_build(&s, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "tensor 'moe.experts.0.w1.weight' of bucket 'moe/ep_experts' is Distinct"));
    assert_non_null(strstr(err, "give it 'global \"TEMPLATE\"' in the spec"));
    mf_ckpt_plan_free(&p);
    const char *names[2] = {"moe.experts.0.w1.weight", "moe.experts.1.w1.weight"};
    t.global = names;
    t.nglobal = 1;
    t.global_split = true; /* the split form: one checkpoint tensor, one plan tensor per coordinate */
    assert_int_equal(mf_ckpt_plan_build(&s, &p, err, sizeof err), 0);
    assert_int_equal(p.ntensors, 2);
    assert_int_equal(p.nmt, 1);
    mf_ckpt_plan_free(&p);
    t.nglobal = 2;
    t.global_split = false;
    assert_int_equal(mf_ckpt_plan_build(&s, &p, err, sizeof err), 0);
    assert_int_equal(p.ntensors, 2);
    for (int k = 0; k < 2; k++) {
        assert_string_equal(p.t[k].name, names[k]);
        assert_string_equal(p.t[k].local, "moe.experts.0.w1.weight");
        assert_int_equal(p.t[k].coord, k);
        int64_t covered = 0;
        for (int64_t j = 0; j < p.npieces; j++)
            if (p.p[j].tensor == k) {
                assert_int_equal(p.p[j].writer / 2, k); /* rank = 2 * ep + dp */
                covered += p.p[j].end - p.p[j].start;
            }
        assert_int_equal(covered, 64);
        for (int64_t r = 0; r < 4; r++) {
            int64_t lo, hi;
            mf_ckpt_plan_held(&s, &p, k, r, &lo, &hi);
            assert_int_equal(hi - lo, r / 2 == k ? 32 : 0);
        }
    }
    mf_ckpt_plan_free(&p);
}

/* Plan properties on each compiled schedule given on the command line. */
static void test_plan(void **state)
{
    (void)state;
    for (int i = 0; i < g_nsched; i++) {
        char err[1024];
        mf_schedule *s = mf_load_schedule_file(g_sched[i], err, sizeof err);
        assert_non_null(s);
        mf_ckpt_plan p;
        assert_int_equal(mf_ckpt_plan_build(s, &p, err, sizeof err), 0);
        int64_t total = 0, *bytes = calloc((size_t)p.world, sizeof *bytes);
        for (int k = 0; k < p.ntensors; k++) {
            uint8_t *seen = calloc((size_t)p.t[k].numel + 1, 1);
            for (int64_t j = 0; j < p.npieces; j++) {
                const mf_ckpt_piece *pc = &p.p[j];
                if (pc->tensor != k)
                    continue;
                int64_t lo, hi;
                mf_ckpt_plan_held(s, &p, k, pc->writer, &lo, &hi);
                assert_true(pc->start >= lo && pc->end <= hi && pc->start < pc->end);
                for (int64_t e = pc->start; e < pc->end; e++)
                    seen[e]++;
                bytes[pc->writer] += pc->end - pc->start;
            }
            for (int64_t e = 0; e < p.t[k].numel; e++)
                assert_int_equal(seen[e], 1);
            total += p.t[k].numel;
            free(seen);
        }
        /* Replicas: ranks whose held ranges are equal for every tensor. */
        for (int64_t r = 0; r < p.world; r++)
            for (int64_t q = r + 1; q < p.world; q++) {
                int same = 1;
                for (int k = 0; k < p.ntensors && same; k++) {
                    int64_t a0, a1, b0, b1;
                    mf_ckpt_plan_held(s, &p, k, r, &a0, &a1);
                    mf_ckpt_plan_held(s, &p, k, q, &b0, &b1);
                    same = a0 == b0 && a1 == b1;
                }
                int64_t d = bytes[r] > bytes[q] ? bytes[r] - bytes[q] : bytes[q] - bytes[r];
                if (same && d > s->nbuckets) {
                    print_error("%s: replicas %lld and %lld write %lld and %lld elements\n", g_sched[i], (long long)r,
                                (long long)q, (long long)bytes[r], (long long)bytes[q]);
                    fail();
                }
            }
        (void)total;
        free(bytes);
        mf_ckpt_plan_free(&p);
        mf_schedule_free(s);
    }
}

int main(int argc, char **argv)
{
    g_nsched = argc - 1;
    g_sched = argv + 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc_vectors),  cmocka_unit_test(test_crc_combine), cmocka_unit_test(test_crc_large), cmocka_unit_test(test_st_valid),
        cmocka_unit_test(test_st_refusals),  cmocka_unit_test(test_st_bounds),   cmocka_unit_test(test_st_build),
        cmocka_unit_test(test_manifest),     cmocka_unit_test(test_manifest_coverage_files),
        cmocka_unit_test(test_parts),        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_plan_refuses_distinct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
