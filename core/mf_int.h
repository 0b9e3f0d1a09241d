/*
 * mf_int: small integer helpers. Saturating int64 arithmetic for byte and
 * time figures that may overflow on absurd inputs (the planner's search, its
 * statistics): a sum or product past INT64_MAX is INT64_MAX, which every
 * comparison then ranks last. A three-way comparison for qsort comparators
 * that order by several keys:
 *     int c;
 *     if ((c = mf_cmp_i64(a->lo, b->lo)) || (c = mf_cmp_i64(a->hi, b->hi)))
 *         return c;
 *     return mf_cmp_i64(a->v, b->v);
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

#endif
