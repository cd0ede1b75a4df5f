/* Counter-based random numbers for initialising parameters.
 *
 * Element i (the row-major index in the global tensor) of a tensor filled with seed s
 * is a pure function of (s, i): Philox4x32-10 (Salmon et al., SC'11, as in Random123,
 * cuRAND and PyTorch's CUDA generator) with key s and counter i. So a tensor filled piece
 * by piece on any number of ranks equals the same tensor filled whole on one, and
 * nothing depends on the order pieces are filled in.
 *
 * Uniform: low + (high - low) * u with u = 53 random bits / 2^53 in [0, 1), computed in
 * double and rounded once to the dtype (so the result lies in [low, high]). Normal:
 * mean + std * sqrt(-2 ln u1) cos(2 pi u2) (Box-Muller, one value per counter), also in
 * double. Constant: a, rounded once to the dtype. The same libm gives the same bits; a different libm may differ in the last
 * bit of a normal value. */
#ifndef FSDP2_RANDOM_H
#define FSDP2_RANDOM_H

#include <stdint.h>

#include <fsdp2/export.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

FSDP2_EXTERN_C_BEGIN

typedef enum fsdp2_random_dist {
    FSDP2_RANDOM_UNIFORM = 0, /* a = low, b = high */
    FSDP2_RANDOM_NORMAL = 1,  /* a = mean, b = standard deviation (>= 0) */
    FSDP2_RANDOM_CONSTANT = 2, /* every element a (b and seed unused): a norm's unit weight,
                                * a zero bias */
} fsdp2_random_dist_t;

typedef struct fsdp2_random_init {
    unsigned size; /* sizeof(fsdp2_random_init_t) */
    fsdp2_random_dist_t dist;
    uint64_t seed;
    double a, b;
} fsdp2_random_init_t;

#define FSDP2_RANDOM_UNIFORM_INIT(seed, low, high) \
    {sizeof(fsdp2_random_init_t), FSDP2_RANDOM_UNIFORM, (seed), (low), (high)}
#define FSDP2_RANDOM_NORMAL_INIT(seed, mean, std) \
    {sizeof(fsdp2_random_init_t), FSDP2_RANDOM_NORMAL, (seed), (mean), (std)}
#define FSDP2_RANDOM_CONSTANT_INIT(value) \
    {sizeof(fsdp2_random_init_t), FSDP2_RANDOM_CONSTANT, 0, (value), 0.0}

/* The raw generator: out[0..4) = Philox4x32-10 of counter[0..4) under key[0..2). */
FSDP2_API fsdp2_status_t fsdp2_philox4x32(const uint32_t counter[4], const uint32_t key[2],
                                          uint32_t out[4]);

/* Element `index` of any tensor filled with init, in double (before rounding to a
 * dtype). */
FSDP2_API fsdp2_status_t fsdp2_random_value(const fsdp2_random_init_t *init, uint64_t index,
                                            double *value);

/* Fills t as the block at offset[0..ndim) of a tensor of global_shape[0..ndim) filled
 * with init (t->ndim == ndim, and the block lies inside). NULL global_shape means t is
 * the whole tensor. Blocking; on cuda the values are made on the host and copied.
 * Floating and integer dtypes (integers truncate); meta is a no-op. */
FSDP2_API fsdp2_status_t fsdp2_random_fill(fsdp2_tensor_t *t, const fsdp2_random_init_t *init,
                                           const int64_t *global_shape, const int64_t *offset);

FSDP2_EXTERN_C_END

#endif
