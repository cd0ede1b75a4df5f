/* Marsaglia's xorshift64 for tests: a fixed seed makes every run test the same inputs,
 * and a printed seed lets a random one be replayed. The state must not be 0. */
#ifndef FSDP2_TESTS_TEST_RNG_H
#define FSDP2_TESTS_TEST_RNG_H

#include <stdint.h>

static inline uint64_t rng_next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

#endif
