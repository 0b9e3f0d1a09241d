/*
 * mf_stress: seeded random delays for the CPU stream threads (docs/runtime.md,
 * "Stress mode"). Off unless MFSDP_STRESS_SEED is set.
 */
#ifndef MF_STRESS_H
#define MF_STRESS_H

#include <stdint.h>

#define MF_STRESS_MAX_US 200

/* The generator state of one stream of one rank; 0 when the mode is off. */
uint64_t mf_stress_seed(int64_t rank, int stream);
/* Sleeps 0..MF_STRESS_MAX_US microseconds; advances *state (nonzero). */
void mf_stress_delay(uint64_t *state);

#endif
