/* What the tests of bf16 GEMM operands share: random inputs, bf16 rounding as the
 * library rounds, the FSDP2_NN_BF16_GEMM mode set and reloaded, and the per-element bound
 * check. */
#ifndef FSDP2_TESTS_NN_BF16_UTIL_H
#define FSDP2_TESTS_NN_BF16_UTIL_H

#include "../core/test_rng.h"
#include "nn_test_util.h"

#include "core/env_internal.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

/* Uniform in [-1, 1), 24 random bits. */
static inline float uniform(void)
{
    return (float)((rng_next(&rng_state) >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

static inline uint16_t *random_bf16(int64_t n)
{
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    ck_assert_ptr_nonnull(p);
    for (int64_t i = 0; i < n; i++)
        p[i] = fsdp2_f32_to_bf16(uniform());
    return p;
}

static inline float *random_f32(int64_t n)
{
    float *p = f32_array(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = uniform();
    return p;
}

static inline double bf(uint16_t v)
{
    return (double)fsdp2_bf16_to_f32(v);
}

/* x rounded to bf16 as the library rounds (nearest even), back as a double. */
static inline double rounded(float x)
{
    return bf(fsdp2_f32_to_bf16(x));
}

/* FSDP2_NN_BF16_GEMM = mode (NULL: unset), read again. */
static inline void set_mode(const char *mode)
{
    if (mode)
        ck_assert_int_eq(setenv("FSDP2_NN_BF16_GEMM", mode, 1), 0);
    else
        ck_assert_int_eq(unsetenv("FSDP2_NN_BF16_GEMM"), 0);
    NN_OK(fsdp2_env_reload());
}

/* The elements of got farther from want than bound (+ a bf16 rounding of want when
 * half_ulp): 0, or with fail, the test fails naming the first. */
static inline int64_t count_past(const char *what, const float *got, const double *want,
                                 const double *bound, int64_t n, int half_ulp, int fail)
{
    int64_t past = 0;
    for (int64_t i = 0; i < n; i++) {
        double b = bound[i] + (half_ulp ? 0x1p-8 * fabs(want[i]) : 0);
        if (!(fabs((double)got[i] - want[i]) <= b)) {
            if (fail)
                ck_abort_msg("%s: element %lld is %.9g where %.9g is expected (bound %.3g)",
                             what, (long long)i, (double)got[i], want[i], b);
            past++;
        }
    }
    return past;
}

#endif
