/*
 * float_bits: a float from its IEEE-754 bits and back (memcpy, no type
 * punning), for the tests that state values by their bit patterns
 * (tests/core/test_dtype.c, tests/runtime/test_cpu_kernels.c).
 */
#ifndef FLOAT_BITS_H
#define FLOAT_BITS_H

#include <stdint.h>
#include <string.h>

static inline float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#endif
