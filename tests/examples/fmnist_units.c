/* See fmnist_units.h. */
#include "fmnist_units.h"

#include <check.h>
#include <stdlib.h>

uint64_t rng_next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

/* Uniform in [-1, 1). */
static float rng_float(uint64_t *state)
{
    return (float)((double)(rng_next(state) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

void fill_random(float *a, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++)
        a[i] = rng_float(&s);
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    ck_assert_msg(p != NULL, "calloc(%zu, %zu) failed", n, size);
    return p;
}
