/*
 * mf_arena: chunked bump allocator. Chunks grow geometrically; a request larger
 * than half a chunk gets a chunk of its own so big arrays waste nothing.
 */
#include "mf_arena.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mf_chunk {
    struct mf_chunk *next;
    size_t size;   /* usable bytes after the header */
    size_t used;   /* bytes handed out */
    max_align_t data[];
} mf_chunk;

struct mf_arena {
    mf_chunk *head;
    size_t next_size;  /* size of the next regular chunk */
    size_t total;      /* bytes handed out */
};

#define MF_ARENA_ALIGN 16u
#define MF_ARENA_FIRST 4096u
#define MF_ARENA_MAX_CHUNK (64u << 20)

mf_arena *mf_arena_create(void)
{
    mf_arena *a = calloc(1, sizeof *a);
    if (a)
        a->next_size = MF_ARENA_FIRST;
    return a;
}

void mf_arena_destroy(mf_arena *a)
{
    if (!a)
        return;
    mf_chunk *c = a->head;
    while (c) {
        mf_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(a);
}

static mf_chunk *chunk_new(size_t size)
{
    if (size > SIZE_MAX - sizeof(mf_chunk))
        return NULL;
    mf_chunk *c = malloc(sizeof(mf_chunk) + size);
    if (!c)
        return NULL;
    c->next = NULL;
    c->size = size;
    c->used = 0;
    return c;
}

void *mf_arena_alloc(mf_arena *a, size_t n)
{
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX - MF_ARENA_ALIGN)
        return NULL;
    n = (n + MF_ARENA_ALIGN - 1) & ~(size_t)(MF_ARENA_ALIGN - 1);
    mf_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        if (n > a->next_size / 2) {
            /* A dedicated chunk, linked behind the head so the head keeps
             * serving small requests. */
            mf_chunk *big = chunk_new(n);
            if (!big)
                return NULL;
            big->used = n;
            if (c) {
                big->next = c->next;
                c->next = big;
            } else {
                a->head = big;
            }
            a->total += n;
            memset(big->data, 0, n);
            return big->data;
        }
        c = chunk_new(a->next_size);
        if (!c)
            return NULL;
        c->next = a->head;
        a->head = c;
        if (a->next_size < MF_ARENA_MAX_CHUNK)
            a->next_size *= 2;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

void *mf_arena_array(mf_arena *a, size_t n, size_t sz)
{
    if (sz && n > SIZE_MAX / sz)
        return NULL;
    return mf_arena_alloc(a, n * sz);
}

char *mf_arena_strndup(mf_arena *a, const char *s, size_t n)
{
    char *p = mf_arena_alloc(a, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

char *mf_arena_strdup(mf_arena *a, const char *s)
{
    return mf_arena_strndup(a, s, strlen(s));
}

char *mf_arena_printf(mf_arena *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *p = mf_arena_alloc(a, (size_t)n + 1);
    if (!p)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

size_t mf_arena_used(const mf_arena *a)
{
    return a->total;
}

void mf_vec_init(mf_vec *v, size_t elem)
{
    v->data = NULL;
    v->len = 0;
    v->cap = 0;
    v->elem = elem;
}

void *mf_vec_push(mf_vec *v)
{
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        if (cap > SIZE_MAX / v->elem)
            return NULL;
        void *d = realloc(v->data, cap * v->elem);
        if (!d)
            return NULL;
        v->data = d;
        v->cap = cap;
    }
    void *p = (char *)v->data + v->len * v->elem;
    memset(p, 0, v->elem);
    v->len++;
    return p;
}

void mf_vec_free(mf_vec *v)
{
    free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

void *mf_vec_to_arena(mf_vec *v, mf_arena *a)
{
    void *p = mf_arena_array(a, v->len ? v->len : 1, v->elem);
    if (p && v->len)
        memcpy(p, v->data, v->len * v->elem);
    mf_vec_free(v);
    return p;
}
