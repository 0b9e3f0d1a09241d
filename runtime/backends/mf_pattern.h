/*
 * mf_pattern: the test pattern the device kernels fill (mf_cuda_fill_pattern)
 * and the host checks recompute, in one place so that a host-only build
 * (the CPU replays of the device tests) uses the very same values.
 * A multiple of 1/64 in [-8, 8), distinct per seed and per element: sums of a
 * few of them, and their averages over a power-of-two group, are exact in
 * fp32 whatever the order.
 */
#ifndef MF_PATTERN_H
#define MF_PATTERN_H

#include <stdint.h>

#ifdef __CUDACC__
#define MF_PATTERN_HD __host__ __device__ __forceinline__
#else
#define MF_PATTERN_HD static inline
#endif

MF_PATTERN_HD float mf_pattern(uint32_t seed, int64_t i)
{
    uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + ((uint64_t)seed << 32 | seed) + 0x632BE59BD9B4E019ull;
    z ^= z >> 31;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    return (float)((int)(z & 1023u) - 512) / 64.0f;
}

#endif
