/* What the unit-test programs of the Fashion-MNIST example (test_fmnist_data.c,
 * test_fmnist_sampler.c) share: the per-test timeout, checked allocation, and seeded
 * random inputs. Each program's TCase "regressions" holds the
 * bugs these tests found, since fixed. */
#ifndef FSDP2_TESTS_FMNIST_UNITS_H
#define FSDP2_TESTS_FMNIST_UNITS_H

#include <stddef.h>
#include <stdint.h>

#define TEST_TIMEOUT_S 120

/* calloc that fails the test instead of returning NULL; n == 0 still gives a pointer. */
void *xcalloc(size_t n, size_t size);

/* Marsaglia's xorshift64: fixed seeds make every run test the same inputs. */
uint64_t rng_next(uint64_t *state);
/* a[0..n) uniform in [-1, 1), a function of seed alone. */
void fill_random(float *a, size_t n, uint64_t seed);

/* FMNIST_TEST_KNOWN_BUGS is set: register the tests of known bugs. */

#endif
