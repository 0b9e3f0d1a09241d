/*
 * mf_int: small integer helpers. Saturating int64 arithmetic for byte and
 * time figures that may overflow on absurd inputs (the planner's search, its
 * statistics): a sum or product past INT64_MAX is INT64_MAX, which every
 * comparison then ranks last. Three-way comparisons for qsort comparators,
 * of one key or of several in order:
 *     return mf_cmp_keys((const int64_t[]){a->lo, a->hi, a->v},
 *                        (const int64_t[]){b->lo, b->hi, b->v}, 3);
 */
#ifndef MF_INT_H
#define MF_INT_H

#include <stdint.h>

static inline int64_t mf_sat_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

static inline int64_t mf_sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

/* -1, 0 or 1 as a < b, a == b, a > b. */
static inline int mf_cmp_i64(int64_t a, int64_t b)
{
    return (a > b) - (a < b);
}

/* The first of the n keys that differ decides, as mf_cmp_i64. */
static inline int mf_cmp_keys(const int64_t *a, const int64_t *b, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i] != b[i])
            return a[i] < b[i] ? -1 : 1;
    return 0;
}

#endif
