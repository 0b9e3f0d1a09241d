/*
 * mf_hash: open-addressing hash table with copied byte-string keys (see
 * mf_hash.h for the contract).
 */
#include "mf_hash.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

uint64_t mf_hash_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3u; /* FNV-1a 64-bit prime */
    return h;
}

uint64_t mf_hash_bytes(const void *p, size_t n)
{
    const unsigned char *k = p;
    uint64_t h = 0x9e3779b97f4a7c15u ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, k + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdu;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    if (n > i)
        memcpy(&w, k + i, n - i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53u;
    h ^= h >> 32;
    return h;
}

/* The slot holding key, or the empty slot where it would go. */
static mf_hash_slot *mf_hash_find(const mf_hash *t, const void *key, size_t n, uint64_t h)
{
    size_t mask = t->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        mf_hash_slot *sl = &t->slots[i];
        if (!sl->key || (sl->hash == h && sl->len == n && memcmp(sl->key, key, n) == 0))
            return sl;
    }
}

int64_t mf_hash_get(const mf_hash *t, const void *key, size_t n)
{
    if (!t->cap)
        return -1;
    const mf_hash_slot *sl = mf_hash_find(t, key, n, mf_hash_bytes(key, n));
    return sl->key ? sl->val : -1;
}

/* Doubles the slot array (64 slots first); false when out of memory. */
static bool mf_hash_grow(mf_hash *t)
{
    size_t cap = t->cap ? t->cap * 2 : 64;
    mf_hash_slot *ns = calloc(cap, sizeof *ns);
    if (!ns)
        return false;
    for (size_t i = 0; i < t->cap; i++) {
        const mf_hash_slot *sl = &t->slots[i];
        if (!sl->key)
            continue;
        size_t j = sl->hash & (cap - 1);
        while (ns[j].key)
            j = (j + 1) & (cap - 1);
        ns[j] = *sl;
    }
    free(t->slots);
    t->slots = ns;
    t->cap = cap;
    return true;
}

/* The slot of key, filled with val (the key copied) when it was empty;
 * NULL when out of memory. */
static mf_hash_slot *mf_hash_slot_of(mf_hash *t, const void *key, size_t n, int64_t val)
{
    if ((t->len + 1) * 2 > t->cap && !mf_hash_grow(t))
        return NULL;
    if (!t->keys && !(t->keys = mf_arena_create()))
        return NULL;
    uint64_t h = mf_hash_bytes(key, n);
    mf_hash_slot *sl = mf_hash_find(t, key, n, h);
    if (sl->key)
        return sl;
    void *copy = mf_arena_alloc(t->keys, n ? n : 1);
    if (!copy)
        return NULL;
    memcpy(copy, key, n);
    *sl = (mf_hash_slot){copy, n, h, val};
    t->len++;
    return sl;
}

int mf_hash_put(mf_hash *t, const void *key, size_t n, int64_t val)
{
    size_t len = t->len;
    if (!mf_hash_slot_of(t, key, n, val))
        return -1;
    return t->len > len;
}

int64_t mf_hash_get_or_put(mf_hash *t, const void *key, size_t n, int64_t val)
{
    const mf_hash_slot *sl = mf_hash_slot_of(t, key, n, val);
    return sl ? sl->val : -1;
}

int64_t mf_hash_get_str(const mf_hash *t, const char *s)
{
    return mf_hash_get(t, s, strlen(s));
}

int mf_hash_put_str(mf_hash *t, const char *s, int64_t val)
{
    return mf_hash_put(t, s, strlen(s), val);
}

void mf_hash_free(mf_hash *t)
{
    if (!t)
        return;
    free(t->slots);
    mf_arena_destroy(t->keys);
    memset(t, 0, sizeof *t);
}
