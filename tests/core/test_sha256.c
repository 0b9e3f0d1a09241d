/*
 * SHA-256 against FIPS 180-2 vectors and hashlib-computed messages whose
 * lengths sit on the padding boundaries (55/56, 63/64/65, 119/120, 128).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_load.h"

static void check(const void *data, size_t len, const char *want)
{
    char hex[65];
    uint8_t out[32];
    mf_sha256(data, len, out, hex);
    assert_string_equal(hex, want);
    /* the binary digest and the hex agree */
    for (int i = 0; i < 32; i++) {
        char two[3];
        snprintf(two, sizeof two, "%02x", out[i]);
        assert_memory_equal(two, want + 2 * i, 2);
    }
}

static void test_fips_vectors(void **state)
{
    (void)state;
    check("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check(two, strlen(two), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *fox = "The quick brown fox jumps over the lazy dog";
    check(fox, strlen(fox), "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592");
}

static void test_padding_boundaries(void **state)
{
    (void)state;
    static const struct {
        size_t n;
        const char *hex;
    } v[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
        {128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"},
    };
    char buf[128];
    memset(buf, 'a', sizeof buf);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        check(buf, v[i].n, v[i].hex);
}

static void test_million_a(void **state)
{
    (void)state;
    char *buf = malloc(1000000);
    assert_non_null(buf);
    memset(buf, 'a', 1000000);
    check(buf, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(buf);
}

static void test_null_outputs(void **state)
{
    (void)state;
    uint8_t out[32];
    mf_sha256("abc", 3, out, NULL);
    assert_int_equal(out[0], 0xba);
    assert_int_equal(out[31], 0xad);
    char hex[65];
    mf_sha256("abc", 3, NULL, hex);
    assert_int_equal(strlen(hex), 64);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fips_vectors),
        cmocka_unit_test(test_padding_boundaries),
        cmocka_unit_test(test_million_a),
        cmocka_unit_test(test_null_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
