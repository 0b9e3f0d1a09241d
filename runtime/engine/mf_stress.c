/*
 * mf_stress: the stress mode of the CPU stream threads (docs/runtime.md).
 * With MFSDP_STRESS_SEED set to a nonzero integer, every stream thread sleeps
 * a pseudo-random 0..MF_STRESS_MAX_US microseconds before each op, from a
 * generator seeded by the seed, the rank and the stream, so a wait the
 * schedule lacks turns into a wrong result instead of a lucky one, and the
 * same seed replays the same delays. Results must be bit-identical to the
 * synchronous mode (tests/runtime/test_stress.c).
 */
#include "mf_stress.h"

#include <stdlib.h>
#include <time.h>

uint64_t mf_stress_seed(int64_t rank, int stream)
{
    const char *v = getenv("MFSDP_STRESS_SEED");
    if (!v || !*v)
        return 0;
    char *end = NULL;
    unsigned long long seed = strtoull(v, &end, 10);
    if (*end || seed == 0)
        return 0;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)rank * 0xbf58476d1ce4e5b9ull ^ (uint64_t)(stream + 1);
    return x ? x : 1;
}

void mf_stress_delay(uint64_t *state)
{
    uint64_t x = *state; /* xorshift64 */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    long us = (long)(x % (MF_STRESS_MAX_US + 1));
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}
