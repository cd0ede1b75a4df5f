/* Philox4x32-10 and the sharding-invariant fills built on it (fsdp2/random.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/random.h>
#include <fsdp2/stream.h>

#include "core/error.h"
#include "core/options.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Values are made in blocks of this many doubles, then converted to the dtype. */
#define FILL_BLOCK 4096

static void philox(const uint32_t in[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = in[0], c1 = in[1], c2 = in[2], c3 = in[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

fsdp2_status_t fsdp2_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    FSDP2_ARG_CHECK(counter && key && out, "philox: counter, key or out is NULL");
    philox(counter, key, out);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_init(const fsdp2_random_init_t *init)
{
    FSDP2_ARG_CHECK(init, "random init is NULL");
    fsdp2_random_init_t copy;
    memset(&copy, 0, sizeof(copy));
    FSDP2_CHECK(fsdp2_options_copy("random init", &copy, sizeof(copy), init, NULL, 0));
    FSDP2_ARG_CHECK(isfinite(init->a) && isfinite(init->b),
                    "random init: parameters %g and %g must be finite", init->a, init->b);
    if (init->dist == FSDP2_RANDOM_UNIFORM) {
        FSDP2_ARG_CHECK(init->a <= init->b, "random init: uniform low %g is above high %g",
                        init->a, init->b);
    } else if (init->dist == FSDP2_RANDOM_NORMAL) {
        FSDP2_ARG_CHECK(init->b >= 0, "random init: normal standard deviation %g is negative",
                        init->b);
    } else if (init->dist != FSDP2_RANDOM_CONSTANT) {
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "random init: distribution %d is not uniform (0), normal (1) or "
                           "constant (2)",
                           (int)init->dist);
    }
    return FSDP2_SUCCESS;
}

/* 53 bits of (lo, hi) as a double in [0, 1). */
static double unit(uint32_t lo, uint32_t hi)
{
    return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1.0p-53;
}

static double value_at(const fsdp2_random_init_t *init, uint64_t index)
{
    if (init->dist == FSDP2_RANDOM_CONSTANT)
        return init->a;
    const uint32_t counter[4] = {(uint32_t)index, (uint32_t)(index >> 32), 0, 0};
    const uint32_t key[2] = {(uint32_t)init->seed, (uint32_t)(init->seed >> 32)};
    uint32_t x[4];
    philox(counter, key, x);
    if (init->dist == FSDP2_RANDOM_UNIFORM)
        return init->a + (init->b - init->a) * unit(x[0], x[1]);
    double u1 = 1.0 - unit(x[0], x[1]); /* (0, 1]: log stays finite */
    double u2 = unit(x[2], x[3]);
    return init->a + init->b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

fsdp2_status_t fsdp2_random_value(const fsdp2_random_init_t *init, uint64_t index, double *value)
{
    FSDP2_CHECK(check_init(init));
    FSDP2_ARG_CHECK(value, "value is NULL");
    *value = value_at(init, index);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_block(const fsdp2_tensor_t *t, const int64_t *global_shape,
                                  const int64_t *offset)
{
    FSDP2_ARG_CHECK(offset, "random fill: global_shape is given but offset is NULL");
    for (int d = 0; d < t->ndim; d++) {
        FSDP2_ARG_CHECK(global_shape[d] >= 0 && offset[d] >= 0 &&
                            offset[d] <= global_shape[d] - t->shape[d],
                        "random fill: block of %lld at offset %lld along dim %d is outside the "
                        "global size %lld",
                        (long long)t->shape[d], (long long)offset[d], d,
                        (long long)global_shape[d]);
    }
    return FSDP2_SUCCESS;
}

/* Makes the values of t's elements in row-major order into host memory dst (t's dtype):
 * one innermost row at a time, whose global indices are consecutive. */
static void fill_host(void *dst, const fsdp2_tensor_t *t, const fsdp2_random_init_t *init,
                      const int64_t *global_shape, const int64_t *offset, size_t elem)
{
    int nd = t->ndim;
    int64_t gstride[FSDP2_MAX_DIMS], idx[FSDP2_MAX_DIMS] = {0};
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        gstride[d] = s;
        s *= global_shape[d];
    }
    int64_t row = nd ? t->shape[nd - 1] : 1;
    int64_t rows = row ? t->numel / row : 0;
    double block[FILL_BLOCK];
    char *out = dst;
    for (int64_t r = 0; r < rows; r++) {
        uint64_t base = 0;
        for (int d = 0; d < nd; d++)
            base += (uint64_t)((offset[d] + idx[d]) * gstride[d]);
        for (int64_t j = 0; j < row; j += FILL_BLOCK) {
            int64_t n = row - j < FILL_BLOCK ? row - j : FILL_BLOCK;
            for (int64_t k = 0; k < n; k++)
                block[k] = value_at(init, base + (uint64_t)(j + k));
            fsdp2_convert(out, t->dtype, block, FSDP2_F64, (size_t)n);
            out += (size_t)n * elem;
        }
        /* Next row: bump the multi-index of the dims before the last. */
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
}

fsdp2_status_t fsdp2_random_fill(fsdp2_tensor_t *t, const fsdp2_random_init_t *init,
                                 const int64_t *global_shape, const int64_t *offset)
{
    FSDP2_ARG_CHECK(t, "random fill: tensor is NULL");
    FSDP2_CHECK(check_init(init));
    static const int64_t zero[FSDP2_MAX_DIMS];
    if (!global_shape) {
        global_shape = t->shape;
        offset = zero;
    }
    FSDP2_CHECK(check_block(t, global_shape, offset));
    if (t->device.type == FSDP2_DEVICE_META || t->numel == 0)
        return FSDP2_SUCCESS;
    size_t elem;
    FSDP2_CHECK(fsdp2_dtype_size(t->dtype, &elem));
    if (t->device.type == FSDP2_DEVICE_CPU) {
        fill_host(t->data, t, init, global_shape, offset, elem);
        return FSDP2_SUCCESS;
    }
    void *host = malloc(t->nbytes);
    if (!host)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "random fill: %zu bytes of host staging",
                           t->nbytes);
    fill_host(host, t, init, global_shape, offset, elem);
    fsdp2_stream_t *stream;
    fsdp2_status_t status = fsdp2_stream_current(t->device, &stream);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_memcpy_async(t->data, host, t->nbytes, stream);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_stream_synchronize(stream);
    free(host);
    return status;
}
