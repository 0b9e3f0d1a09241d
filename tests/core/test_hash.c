/*
 * core/mf_hash: the project's FNV-1a against the published 64-bit test
 * vectors of the FNV reference (offset basis 0xcbf29ce484222325, prime
 * 0x100000001b3, xor then multiply), written out by hand; then the table's
 * contract (mf_hash.h): put adds once and keeps the first value, get finds
 * exactly what was put, get_or_put returns the stored value or adds the new
 * one, keys are copied and compared whole (length included), growth past
 * the first 64 slots keeps every key, and keys whose hashes share their low
 * bits (one probe chain) are all told apart.
 *
 * mf_hash has no out-of-memory test hook (its allocations are calloc and
 * the arena's), so the -1 path is not exercised here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "mf_hash.h"

static void test_fnv1a_published_vectors(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        uint64_t out;
    } vec[] = {
        {"", 0xcbf29ce484222325u},
        {"a", 0xaf63dc4c8601ec8cu},
        {"b", 0xaf63df4c8601f1a5u},
        {"foobar", 0x85944171f73967e8u},
    };
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
        uint64_t h = mf_hash_fnv1a(MF_FNV1A_BASIS, vec[i].in, strlen(vec[i].in));
        if (h != vec[i].out)
            fail_msg("fnv1a(\"%s\") = 0x%016llx, expected 0x%016llx", vec[i].in, (unsigned long long)h,
                     (unsigned long long)vec[i].out);
    }
    assert_true(MF_FNV1A_BASIS == 0xcbf29ce484222325u);
}

/* The same bytes fed in pieces give the published hash of the whole. */
static void test_fnv1a_pieces(void **state)
{
    (void)state;
    const char *s = "foobar";
    for (size_t cut = 0; cut <= 6; cut++) {
        uint64_t h = mf_hash_fnv1a(MF_FNV1A_BASIS, s, cut);
        h = mf_hash_fnv1a(h, s + cut, 6 - cut);
        assert_true(h == 0x85944171f73967e8u);
    }
}

static void test_put_get(void **state)
{
    (void)state;
    mf_hash t = MF_HASH_EMPTY;
    assert_int_equal(mf_hash_get_str(&t, "w"), -1); /* empty table */
    assert_int_equal(mf_hash_put_str(&t, "w", 7), 1);
    assert_int_equal(mf_hash_put_str(&t, "g", 0), 1);
    assert_int_equal(mf_hash_put_str(&t, "w", 9), 0); /* present: value kept */
    assert_int_equal(mf_hash_get_str(&t, "w"), 7);
    assert_int_equal(mf_hash_get_str(&t, "g"), 0);
    assert_int_equal(mf_hash_get_str(&t, "x"), -1);
    assert_int_equal(mf_hash_get_str(&t, "ww"), -1);
    assert_int_equal((int)t.len, 2);

    /* the key is copied: the caller's buffer may change afterwards */
    char buf[8] = "layer";
    assert_int_equal(mf_hash_put(&t, buf, 5, 3), 1);
    memcpy(buf, "XXXXX", 5);
    assert_int_equal(mf_hash_get(&t, "layer", 5), 3);
    assert_int_equal(mf_hash_get(&t, buf, 5), -1);

    /* keys are compared with their length: a prefix is another key */
    assert_int_equal(mf_hash_get(&t, "layer", 4), -1);
    assert_int_equal(mf_hash_put(&t, "layer", 4, 4), 1);
    assert_int_equal(mf_hash_get(&t, "layer", 4), 4);
    assert_int_equal(mf_hash_get(&t, "layer", 5), 3);

    /* bytes past a NUL count */
    assert_int_equal(mf_hash_put(&t, "a\0b", 3, 11), 1);
    assert_int_equal(mf_hash_put(&t, "a\0c", 3, 12), 1);
    assert_int_equal(mf_hash_get(&t, "a\0b", 3), 11);
    assert_int_equal(mf_hash_get(&t, "a\0c", 3), 12);
    assert_int_equal(mf_hash_get_str(&t, "a"), -1);
    mf_hash_free(&t);
    assert_null(t.slots);
    assert_int_equal((int)t.len, 0);
    assert_int_equal(mf_hash_get_str(&t, "w"), -1); /* freed: empty again */
    mf_hash_free(NULL);
}

static void test_empty_key(void **state)
{
    (void)state;
    mf_hash t = MF_HASH_EMPTY;
    assert_int_equal(mf_hash_get(&t, "", 0), -1);
    assert_int_equal(mf_hash_put_str(&t, "", 5), 1);
    assert_int_equal(mf_hash_get(&t, "", 0), 5);
    assert_int_equal(mf_hash_get_str(&t, ""), 5);
    assert_int_equal(mf_hash_put(&t, "", 0, 6), 0);
    assert_int_equal(mf_hash_get(&t, "\0", 1), -1); /* one NUL byte is not the empty key */
    assert_int_equal(mf_hash_put(&t, "\0", 1, 8), 1);
    assert_int_equal(mf_hash_get(&t, "", 0), 5);
    assert_int_equal(mf_hash_get(&t, "\0", 1), 8);
    mf_hash_free(&t);
}

static void test_get_or_put(void **state)
{
    (void)state;
    mf_hash t = MF_HASH_EMPTY;
    assert_int_equal(mf_hash_get_or_put(&t, "k", 1, 42), 42); /* added */
    assert_int_equal((int)t.len, 1);
    assert_int_equal(mf_hash_get_or_put(&t, "k", 1, 43), 42); /* present: the stored value */
    assert_int_equal((int)t.len, 1);
    assert_int_equal(mf_hash_get(&t, "k", 1), 42);
    assert_int_equal(mf_hash_get_or_put(&t, "j", 1, 0), 0);
    assert_int_equal(mf_hash_put(&t, "j", 1, 5), 0);
    assert_int_equal(mf_hash_get(&t, "j", 1), 0);
    assert_int_equal((int)t.len, 2);
    mf_hash_free(&t);
}

/* Far past the first 64 slots (several doublings): every key keeps its
 * value, absent keys stay absent, and the table stays at most half full. */
static void test_growth(void **state)
{
    (void)state;
    enum { N = 5000 };
    mf_hash t = MF_HASH_EMPTY;
    char key[32];
    for (int i = 0; i < N; i++) {
        int n = snprintf(key, sizeof key, "unit.%d", i);
        assert_int_equal(mf_hash_put(&t, key, (size_t)n, 3 * (int64_t)i + 1), 1);
        assert_true(t.len * 2 <= t.cap);
    }
    assert_int_equal((int)t.len, N);
    assert_true(t.cap >= 2 * N);
    assert_true((t.cap & (t.cap - 1)) == 0);
    for (int i = 0; i < N; i++) {
        int n = snprintf(key, sizeof key, "unit.%d", i);
        if (mf_hash_get(&t, key, (size_t)n) != 3 * (int64_t)i + 1)
            fail_msg("key %s lost after growth", key);
        assert_int_equal(mf_hash_put(&t, key, (size_t)n, 0), 0);
    }
    for (int i = N; i < N + 200; i++) {
        int n = snprintf(key, sizeof key, "unit.%d", i);
        assert_int_equal(mf_hash_get(&t, key, (size_t)n), -1);
    }
    mf_hash_free(&t);
}

/* Keys whose table hashes agree in their low 12 bits land on one probe
 * chain at every capacity up to 4096: each is still found with its own
 * value, and a key of the same bits that was never put is absent. */
static void test_low_bit_collisions(void **state)
{
    (void)state;
    enum { M = 24 };
    char keys[M + 1][32];
    int lens[M + 1], found = 0;
    uint64_t low = 0;
    char key[32];
    for (int i = 0; found <= M && i < 50000000; i++) {
        int n = snprintf(key, sizeof key, "bucket-%d", i);
        uint64_t h = mf_hash_bytes(key, (size_t)n) & 0xfff;
        if (found == 0)
            low = h;
        if (h != low)
            continue;
        memcpy(keys[found], key, (size_t)n + 1);
        lens[found++] = n;
    }
    assert_int_equal(found, M + 1);
    mf_hash t = MF_HASH_EMPTY;
    for (int i = 0; i < M; i++)
        assert_int_equal(mf_hash_put(&t, keys[i], (size_t)lens[i], 100 + i), 1);
    for (int i = 0; i < M; i++)
        assert_int_equal(mf_hash_get(&t, keys[i], (size_t)lens[i]), 100 + i);
    assert_int_equal(mf_hash_get(&t, keys[M], (size_t)lens[M]), -1);
    assert_int_equal(mf_hash_get_or_put(&t, keys[M], (size_t)lens[M], 7), 7);
    assert_int_equal(mf_hash_get(&t, keys[0], (size_t)lens[0]), 100);
    assert_int_equal((int)t.len, M + 1);
    mf_hash_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fnv1a_published_vectors),
        cmocka_unit_test(test_fnv1a_pieces),
        cmocka_unit_test(test_put_get),
        cmocka_unit_test(test_empty_key),
        cmocka_unit_test(test_get_or_put),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_low_bit_collisions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
