/*
 * mf_arena: bump allocator used for every compilation's AST and IR and for a
 * loaded schedule. Memory is released all at once by mf_arena_destroy().
 *
 * Invariants: every pointer returned is aligned to 16 bytes and stays valid
 * until the arena is destroyed. Allocation failure returns NULL (never aborts);
 * callers turn it into an error of their own.
 */
#ifndef MF_ARENA_H
#define MF_ARENA_H

#include <stddef.h>

typedef struct mf_arena mf_arena;

/* Returns an owned arena, or NULL when out of memory. */
mf_arena *mf_arena_create(void);
/* Takes the arena; NULL is ignored. */
void mf_arena_destroy(mf_arena *a);

/* Borrowed from the arena: zeroed memory of n bytes, NULL when out of memory. */
void *mf_arena_alloc(mf_arena *a, size_t n);
/* n elements of size sz, with overflow check; zeroed. */
void *mf_arena_array(mf_arena *a, size_t n, size_t sz);
/* Copies of strings into the arena. */
char *mf_arena_strdup(mf_arena *a, const char *s);
char *mf_arena_strndup(mf_arena *a, const char *s, size_t n);
/* printf into the arena. */
char *mf_arena_printf(mf_arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Total bytes handed out (for benchmarks and memory reports). */
size_t mf_arena_used(const mf_arena *a);

/*
 * Growable array helper built on malloc (not the arena) for passes that do not
 * know their output size; freed with mf_vec_free or moved into the arena with
 * mf_vec_to_arena.
 */
typedef struct mf_vec {
    void *data;
    size_t len;     /* elements in use */
    size_t cap;     /* elements allocated */
    size_t elem;    /* bytes per element */
} mf_vec;

void mf_vec_init(mf_vec *v, size_t elem);
/* Returns a pointer to a new zeroed element at the end, NULL on OOM. */
void *mf_vec_push(mf_vec *v);
void mf_vec_free(mf_vec *v);
/* Copies the contents into the arena and frees the vector; NULL on OOM
 * (the vector is freed either way). Zero elements gives a valid non-NULL
 * pointer only when the arena can allocate 1 byte. */
void *mf_vec_to_arena(mf_vec *v, mf_arena *a);

#endif
