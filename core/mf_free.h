/*
 * mf_free: releasing what a struct owns in one statement. A release function
 * names each owned pointer once:
 *     MF_FREE_ALL(m->states, m->tensors, m->files);
 * frees them in the order written (NULL ones too, as free() allows). Code
 * whose allocations go through another release (the runtime's counted
 * mf_base_free) names it:
 *     MF_FREE_ALL_WITH(mf_base_free, be->ready, be->done, be);
 * Every pointer is read before the first is released, so the struct holding
 * them may come last. Nothing is cleared: the caller resets or frees the
 * struct.
 */
#ifndef MF_FREE_H
#define MF_FREE_H

#include <stddef.h>
#include <stdlib.h>

/* Releases p[0..n) with `release`, in order. */
static inline void mf_free_each(void (*release)(void *), void *const *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        release(p[i]);
}

#define MF_FREE_ALL_WITH(release, ...)                                       \
    mf_free_each((release), (void *const[]){__VA_ARGS__},                    \
                 sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))
#define MF_FREE_ALL(...) MF_FREE_ALL_WITH(free, __VA_ARGS__)

#endif
