/*
 * mf_hash: the one hash table of the project, byte-string keys to
 * non-negative integers. Open addressing with linear probing over a power-of-
 * two slot array kept at most half full, indexed by mf_hash_bytes (8 bytes
 * at a time: keys reach several hundred bytes in the plan search's memo,
 * where a byte-wise hash was a tenth of the search); keys are compared whole.
 * The project's one FNV-1a (mf_hash_fnv1a) is here too, for digests.
 *
 * Users: the loader's name tables, the semantic pass's symbol tables, the
 * layout pass's layout signatures, the structural checker's and the
 * verifier's "already seen" sets.
 *
 * Ownership: the table copies every key into an arena of its own; all of it
 * dies with mf_hash_free(). Out of memory is a result (-1), never an abort.
 */
#ifndef MF_HASH_H
#define MF_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "mf_arena.h"

typedef struct mf_hash_slot {
    const void *key;        /* NULL: empty; else in the table's arena */
    size_t len;
    uint64_t hash;
    int64_t val;
} mf_hash_slot;

typedef struct mf_hash {
    mf_hash_slot *slots;
    size_t cap, len;        /* cap: 0 or a power of two */
    mf_arena *keys;         /* created on the first insert */
} mf_hash;

/* A zeroed mf_hash is an empty table. */
#define MF_HASH_EMPTY {NULL, 0, 0, NULL}

/* 64-bit FNV-1a, the project's one: start from MF_FNV1A_BASIS (or a value
 * mixed into it) and feed bytes in pieces; the same bytes in the same order
 * give the same hash however they are split. For digests compared for
 * equality (a rank's master weights, the states every rank asks a
 * checkpoint for). */
#define MF_FNV1A_BASIS 0xcbf29ce484222325u
uint64_t mf_hash_fnv1a(uint64_t h, const void *p, size_t n);

/* The table's hash of n bytes (8 at a time, see above). */
uint64_t mf_hash_bytes(const void *p, size_t n);

/* The value stored for key, or -1 when absent. */
int64_t mf_hash_get(const mf_hash *t, const void *key, size_t n);
/* Adds key (copied) with val >= 0 unless present. Returns 1 when added, 0
 * when the key was present (its value unchanged), -1 when out of memory. */
int mf_hash_put(mf_hash *t, const void *key, size_t n, int64_t val);

/* The value stored for key; when absent, adds key (copied) with val >= 0
 * and returns val. -1 when out of memory. One probe where a get and a put
 * take two. */
int64_t mf_hash_get_or_put(mf_hash *t, const void *key, size_t n, int64_t val);

/* The same for NUL-terminated strings (the NUL is not part of the key). */
int64_t mf_hash_get_str(const mf_hash *t, const char *s);
int mf_hash_put_str(mf_hash *t, const char *s, int64_t val);

/* Releases everything; the table is empty afterwards. NULL is ignored. */
void mf_hash_free(mf_hash *t);

#endif
