/* Tests for the counter-based generator of fsdp2/random.h.
 *
 * The raw generator is checked against Random123's published Philox4x32-10 known-answer
 * vectors; once it is trusted, every value of fsdp2_random_value is recomputed here from
 * it with the formula written out in random.h, and every fill is compared with those
 * values (or with the same tensor filled whole), element by element, bit for bit. The
 * index arithmetic that maps a block's elements to global row-major indices is the
 * test's own: a naive per-element loop over a multi-index.
 *
 * Hot loops fail with `if (!ok) ck_abort_msg(...)` rather than ck_assert_msg, because
 * ck_assert_msg records a mark point on every success; the first mismatch ends the test. */
#include <check.h>

#include "check_main.h"
#include "test_rng.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/device.h>
#include <fsdp2/dtype.h>
#include <fsdp2/random.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

#define TEST_TIMEOUT_S 120

/* ---------------------------------------------------------------------------------- */
/* Helpers                                                                             */

static uint64_t f64_bits(double value)
{
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static uint32_t f32_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static float f32_from_bits(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;
static const fsdp2_device_t META = FSDP2_DEVICE_META_INIT;

static fsdp2_tensor_t *cpu_empty(fsdp2_dtype_t dtype, int ndim, const int64_t *shape)
{
    fsdp2_tensor_t *t = NULL;
    fsdp2_status_t status = fsdp2_tensor_empty(CPU, dtype, ndim, shape, &t);
    ck_assert_msg(status == FSDP2_SUCCESS && t != NULL, "tensor_empty(%s, ndim %d): %s (%s)",
                  fsdp2_dtype_name(dtype), ndim, fsdp2_status_name(status), fsdp2_last_error());
    return t;
}

static size_t elem_size(fsdp2_dtype_t dtype)
{
    size_t bytes = 0;
    ck_assert_int_eq(fsdp2_dtype_size(dtype, &bytes), FSDP2_SUCCESS);
    return bytes;
}

/* An element's raw bits, widened to 64 for printing. */
static uint64_t elem_bits(const void *data, size_t elem, int64_t index)
{
    const unsigned char *p = (const unsigned char *)data + (size_t)index * elem;
    if (elem == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    if (elem == 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? "," : "",
                                 (long long)shape[d]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
}

/* ---------------------------------------------------------------------------------- */
/* The reference: random.h's formula, recomputed from the raw generator                 */

static void ref_philox(uint64_t seed, uint64_t index, uint32_t x[4])
{
    const uint32_t counter[4] = {(uint32_t)(index & 0xffffffffu), (uint32_t)(index >> 32), 0,
                                 0};
    const uint32_t key[2] = {(uint32_t)(seed & 0xffffffffu), (uint32_t)(seed >> 32)};
    ck_assert_int_eq(fsdp2_philox4x32(counter, key, x), FSDP2_SUCCESS);
}

/* 53 bits of the 64-bit number hi:lo, scaled to [0, 1). */
static double ref_unit(uint32_t lo, uint32_t hi)
{
    uint64_t bits = ((uint64_t)hi << 32) | lo;
    return (double)(bits >> 11) * ldexp(1.0, -53);
}

static double ref_value(const fsdp2_random_init_t *init, uint64_t index)
{
    uint32_t x[4];
    ref_philox(init->seed, index, x);
    if (init->dist == FSDP2_RANDOM_UNIFORM)
        return init->a + (init->b - init->a) * ref_unit(x[0], x[1]);
    double u1 = 1.0 - ref_unit(x[0], x[1]);
    double u2 = ref_unit(x[2], x[3]);
    return init->a + init->b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The bf16 nearest to a normal, finite double (ties to even), found among the three
 * bf16 magnitudes around the top half of (float)value: the f32 rounding moves the value
 * by less than one bf16 step, so the nearest one is among them. Every candidate is
 * exact in double, so the distances are compared exactly. */
static uint16_t ref_bf16(double value)
{
    double mag = fabs(value);
    uint32_t top = f32_bits((float)mag) >> 16;
    uint32_t best = top;
    double best_dist = INFINITY;
    for (uint32_t m = top ? top - 1 : 0; m <= top + 1; m++) {
        double cand = (double)f32_from_bits(m << 16);
        double dist = fabs(cand - mag);
        if (dist < best_dist || (dist == best_dist && (m & 1u) == 0)) {
            best = m;
            best_dist = dist;
        }
    }
    return (uint16_t)(best | (signbit(value) ? 0x8000u : 0));
}

/* ---------------------------------------------------------------------------------- */
/* 1. Philox4x32-10 known answers (Random123, examples/kat_vectors)                     */

START_TEST(philox4x32_matches_random123_known_answer_vectors)
{
    static const struct {
        uint32_t counter[4];
        uint32_t key[2];
        uint32_t expect[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4] = {0};
        ck_assert_int_eq(fsdp2_philox4x32(kat[i].counter, kat[i].key, out), FSDP2_SUCCESS);
        for (int w = 0; w < 4; w++)
            ck_assert_msg(out[w] == kat[i].expect[w],
                          "vector %zu word %d: got 0x%08x, want 0x%08x (got {%08x %08x %08x "
                          "%08x})",
                          i, w, (unsigned)out[w], (unsigned)kat[i].expect[w], (unsigned)out[0],
                          (unsigned)out[1], (unsigned)out[2], (unsigned)out[3]);
    }
}
END_TEST

START_TEST(philox4x32_rejects_null_arguments)
{
    uint32_t counter[4] = {0}, key[2] = {0}, out[4];
    ck_assert_int_eq(fsdp2_philox4x32(NULL, key, out), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_philox4x32(counter, NULL, out), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_philox4x32(counter, key, NULL), FSDP2_ERR_INVALID_ARGUMENT);
    const char *message = fsdp2_last_error();
    ck_assert_msg(strstr(message, "NULL") != NULL, "last error \"%s\" does not say NULL",
                  message);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 2. fsdp2_random_value is the documented formula, bit for bit                         */

/* Small indices, both sides of the 32-bit boundary of the counter's low word, high
 * words of every size, and pseudo-random 64-bit indices. */
static size_t build_indices(uint64_t *out, size_t cap)
{
    size_t n = 0;
    for (uint64_t i = 0; i < 300 && n < cap; i++)
        out[n++] = i;
    const uint64_t edges[] = {0xffffffffull, 1ull << 32, 1ull << 40, 1ull << 53, 1ull << 63,
                              UINT64_MAX - 5};
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (uint64_t k = 0; k < 6 && n < cap; k++)
            out[n++] = edges[e] - 2 + k;
    uint64_t rng = 0x2545f4914f6cdd1dull;
    while (n < cap)
        out[n++] = rng_next(&rng);
    return n;
}

static void check_values_against_formula(const fsdp2_random_init_t *init, const char *what)
{
    enum { N_INDICES = 2000 };
    static uint64_t indices[N_INDICES];
    size_t n = build_indices(indices, N_INDICES);
    for (size_t i = 0; i < n; i++) {
        double got = NAN;
        fsdp2_status_t status = fsdp2_random_value(init, indices[i], &got);
        if (status != FSDP2_SUCCESS)
            ck_abort_msg("%s index %llu: %s (%s)", what, (unsigned long long)indices[i],
                         fsdp2_status_name(status), fsdp2_last_error());
        double want = ref_value(init, indices[i]);
        if (f64_bits(got) != f64_bits(want))
            ck_abort_msg("%s seed %llu index %llu: got %.17g (0x%016llx), want %.17g "
                         "(0x%016llx)",
                         what, (unsigned long long)init->seed, (unsigned long long)indices[i],
                         got, (unsigned long long)f64_bits(got), want,
                         (unsigned long long)f64_bits(want));
    }
}

static const uint64_t SEEDS[] = {0, 1, 42, 0xffffffffull, 1ull << 32, 0x0123456789abcdefull,
                                 UINT64_MAX};

START_TEST(uniform_value_equals_formula_from_philox_for_indices_past_2_pow_32)
{
    for (size_t s = 0; s < sizeof SEEDS / sizeof SEEDS[0]; s++) {
        fsdp2_random_init_t a = FSDP2_RANDOM_UNIFORM_INIT(SEEDS[s], 0.0, 1.0);
        fsdp2_random_init_t b = FSDP2_RANDOM_UNIFORM_INIT(SEEDS[s], -2.0, 3.0);
        fsdp2_random_init_t c = FSDP2_RANDOM_UNIFORM_INIT(SEEDS[s], -0.0625, -0.0625);
        fsdp2_random_init_t d = FSDP2_RANDOM_UNIFORM_INIT(SEEDS[s], -1e300, 1e300);
        check_values_against_formula(&a, "uniform(0, 1)");
        check_values_against_formula(&b, "uniform(-2, 3)");
        check_values_against_formula(&c, "uniform(-0.0625, -0.0625)");
        check_values_against_formula(&d, "uniform(-1e300, 1e300)");
    }
}
END_TEST

START_TEST(normal_value_equals_box_muller_from_philox_for_indices_past_2_pow_32)
{
    for (size_t s = 0; s < sizeof SEEDS / sizeof SEEDS[0]; s++) {
        fsdp2_random_init_t a = FSDP2_RANDOM_NORMAL_INIT(SEEDS[s], 0.0, 1.0);
        fsdp2_random_init_t b = FSDP2_RANDOM_NORMAL_INIT(SEEDS[s], 1.0, 2.0);
        fsdp2_random_init_t c = FSDP2_RANDOM_NORMAL_INIT(SEEDS[s], -3.5, 0.0);
        fsdp2_random_init_t d = FSDP2_RANDOM_NORMAL_INIT(SEEDS[s], 0.0, 0.02);
        check_values_against_formula(&a, "normal(0, 1)");
        check_values_against_formula(&b, "normal(1, 2)");
        check_values_against_formula(&c, "normal(-3.5, 0)");
        check_values_against_formula(&d, "normal(0, 0.02)");
    }
}
END_TEST

/* Endpoints of the unit map: all-zero bits give u = 0 and all-one bits the largest
 * double below 1, so uniform values stay in [low, high] and the log in Box-Muller sees
 * u1 in (0, 1]. Checked on the reference itself, so a wrong reading of the formula
 * fails here rather than as a mismatch later. */
START_TEST(unit_map_of_53_bits_spans_zero_to_one_minus_2_pow_minus_53)
{
    ck_assert_msg(ref_unit(0, 0) == 0.0, "unit(0, 0) = %a, want 0", ref_unit(0, 0));
    double top = ref_unit(0xffffffffu, 0xffffffffu);
    ck_assert_msg(top == 1.0 - ldexp(1.0, -53), "unit(~0, ~0) = %a, want %a", top,
                  1.0 - ldexp(1.0, -53));
    double low_bits_only = ref_unit(0x7ffu, 0);
    ck_assert_msg(low_bits_only == 0.0, "the 11 low bits must be dropped: unit(0x7ff, 0) = %a",
                  low_bits_only);
}
END_TEST

START_TEST(whole_fill_equals_formula_rounded_once_for_f64_f32_bf16)
{
    const int64_t shape[2] = {37, 129};
    const fsdp2_random_init_t inits[2] = {FSDP2_RANDOM_UNIFORM_INIT(7, -2.0, 3.0),
                                          FSDP2_RANDOM_NORMAL_INIT(7, 1.0, 2.0)};
    for (int k = 0; k < 2; k++) {
        fsdp2_tensor_t *t64 = cpu_empty(FSDP2_F64, 2, shape);
        fsdp2_tensor_t *t32 = cpu_empty(FSDP2_F32, 2, shape);
        fsdp2_tensor_t *t16 = cpu_empty(FSDP2_BF16, 2, shape);
        ck_assert_int_eq(fsdp2_random_fill(t64, &inits[k], NULL, NULL), FSDP2_SUCCESS);
        ck_assert_int_eq(fsdp2_random_fill(t32, &inits[k], NULL, NULL), FSDP2_SUCCESS);
        ck_assert_int_eq(fsdp2_random_fill(t16, &inits[k], NULL, NULL), FSDP2_SUCCESS);
        const double *v64 = t64->data;
        const float *v32 = t32->data;
        const uint16_t *v16 = t16->data;
        for (int64_t i = 0; i < t64->numel; i++) {
            double want = ref_value(&inits[k], (uint64_t)i);
            if (f64_bits(v64[i]) != f64_bits(want))
                ck_abort_msg("dist %d f64 element %lld: got %.17g, want %.17g", k,
                             (long long)i, v64[i], want);
            if (f32_bits(v32[i]) != f32_bits((float)want))
                ck_abort_msg("dist %d f32 element %lld: got %.9g (0x%08x), want %.9g (0x%08x) "
                             "from %.17g",
                             k, (long long)i, (double)v32[i], (unsigned)f32_bits(v32[i]),
                             (double)(float)want, (unsigned)f32_bits((float)want), want);
            if (v16[i] != ref_bf16(want))
                ck_abort_msg("dist %d bf16 element %lld: got 0x%04x, want 0x%04x from %.17g", k,
                             (long long)i, v16[i], ref_bf16(want), want);
        }
        fsdp2_tensor_release(t64);
        fsdp2_tensor_release(t32);
        fsdp2_tensor_release(t16);
    }
}
END_TEST

START_TEST(integer_fill_truncates_formula_value_toward_zero)
{
    const int64_t shape[1] = {5000};
    const fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT(11, -100.0, 100.0);
    fsdp2_tensor_t *t = cpu_empty(FSDP2_I32, 1, shape);
    ck_assert_int_eq(fsdp2_random_fill(t, &init, NULL, NULL), FSDP2_SUCCESS);
    const int32_t *v = t->data;
    for (int64_t i = 0; i < shape[0]; i++) {
        double value = ref_value(&init, (uint64_t)i);
        int32_t want = (int32_t)trunc(value);
        if (v[i] != want)
            ck_abort_msg("i32 element %lld: got %d, want %d (trunc of %.17g)", (long long)i,
                         (int)v[i], (int)want, value);
    }
    fsdp2_tensor_release(t);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 3. A block filled alone equals the same block of the tensor filled whole             */

/* The (offset, length) choices along a dim of size n: all of it, empty at either end,
 * all but the first row, the last row, a middle piece. */
static int block_choices(int64_t n, int64_t offsets[6], int64_t lengths[6])
{
    int64_t pairs[6][2] = {{0, n}, {0, 0}, {n, 0}, {1, n - 1}, {n - 1, 1}, {n / 3, n / 2}};
    int k = n >= 3 ? 6 : n >= 1 ? 5 : 3;
    for (int i = 0; i < k; i++) {
        offsets[i] = pairs[i][0];
        lengths[i] = pairs[i][1];
    }
    return k;
}

/* The row-major global index of the element at local multi-index idx of a block at
 * offset, in a tensor of global shape: sum of (offset + idx) * stride, naively. */
static int64_t global_index(int ndim, const int64_t *shape, const int64_t *offset,
                            const int64_t *idx)
{
    int64_t g = 0;
    for (int d = 0; d < ndim; d++)
        g = g * shape[d] + offset[d] + idx[d];
    return g;
}

static void check_block(fsdp2_dtype_t dtype, const fsdp2_random_init_t *init,
                        const fsdp2_tensor_t *whole, int ndim, const int64_t *shape,
                        const int64_t *offset, const int64_t *block)
{
    fsdp2_tensor_t *piece = cpu_empty(dtype, ndim, block);
    fsdp2_status_t status = fsdp2_random_fill(piece, init, shape, offset);
    char gs[96], bs[96], os[96];
    shape_text(ndim, shape, gs, sizeof gs);
    shape_text(ndim, block, bs, sizeof bs);
    shape_text(ndim, offset, os, sizeof os);
    if (status != FSDP2_SUCCESS)
        ck_abort_msg("%s block %s at %s of %s: %s (%s)", fsdp2_dtype_name(dtype), bs, os, gs,
                     fsdp2_status_name(status), fsdp2_last_error());
    size_t elem = elem_size(dtype);
    int64_t idx[FSDP2_MAX_DIMS] = {0};
    for (int64_t l = 0; l < piece->numel; l++) {
        int64_t g = global_index(ndim, shape, offset, idx);
        uint64_t got = elem_bits(piece->data, elem, l);
        uint64_t want = elem_bits(whole->data, elem, g);
        if (got != want)
            ck_abort_msg("%s block %s at %s of %s: local element %lld (global %lld) is "
                         "0x%llx, the whole tensor has 0x%llx",
                         fsdp2_dtype_name(dtype), bs, os, gs, (long long)l, (long long)g,
                         (unsigned long long)got, (unsigned long long)want);
        for (int d = ndim - 1; d >= 0; d--) {
            if (++idx[d] < block[d])
                break;
            idx[d] = 0;
        }
    }
    fsdp2_tensor_release(piece);
}

/* Every combination of the per-dim block choices, for one global shape and dtype. */
static void check_sharding_invariance(fsdp2_dtype_t dtype, int ndim, const int64_t *shape)
{
    const fsdp2_random_init_t inits[2] = {FSDP2_RANDOM_UNIFORM_INIT(1234, -2.0, 3.0),
                                          FSDP2_RANDOM_NORMAL_INIT(0xfeedull << 40, 0.0, 1.0)};
    int64_t offs[FSDP2_MAX_DIMS][6], lens[FSDP2_MAX_DIMS][6];
    int count[FSDP2_MAX_DIMS];
    int64_t combos = 1;
    for (int d = 0; d < ndim; d++) {
        count[d] = block_choices(shape[d], offs[d], lens[d]);
        combos *= count[d];
    }
    for (int k = 0; k < 2; k++) {
        fsdp2_tensor_t *whole = cpu_empty(dtype, ndim, shape);
        ck_assert_int_eq(fsdp2_random_fill(whole, &inits[k], NULL, NULL), FSDP2_SUCCESS);
        for (int64_t c = 0; c < combos; c++) {
            int64_t offset[FSDP2_MAX_DIMS] = {0}, block[FSDP2_MAX_DIMS] = {0};
            int64_t rest = c;
            for (int d = ndim - 1; d >= 0; d--) {
                int choice = (int)(rest % count[d]);
                rest /= count[d];
                offset[d] = offs[d][choice];
                block[d] = lens[d][choice];
            }
            check_block(dtype, &inits[k], whole, ndim, shape, offset, block);
        }
        fsdp2_tensor_release(whole);
    }
}

static const fsdp2_dtype_t FLOAT_DTYPES[] = {FSDP2_F32, FSDP2_BF16, FSDP2_F64};

START_TEST(block_fill_equals_sub_block_of_whole_fill_1d)
{
    const int64_t sizes[] = {1, 2, 7, 64, 4097, 10000};
    for (size_t t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            check_sharding_invariance(FLOAT_DTYPES[t], 1, &sizes[i]);
}
END_TEST

START_TEST(block_fill_equals_sub_block_of_whole_fill_2d)
{
    const int64_t shapes[][2] = {{7, 13}, {1, 5}, {13, 1}, {4, 4100}, {2, 3}};
    for (size_t t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            check_sharding_invariance(FLOAT_DTYPES[t], 2, shapes[i]);
}
END_TEST

START_TEST(block_fill_equals_sub_block_of_whole_fill_3d_and_4d)
{
    const int64_t s3[][3] = {{3, 5, 4}, {2, 1, 9}, {5, 3, 3}};
    const int64_t s4[2][4] = {{2, 3, 4, 5}, {3, 1, 2, 7}};
    for (size_t t = 0; t < 3; t++) {
        for (size_t i = 0; i < sizeof s3 / sizeof s3[0]; i++)
            check_sharding_invariance(FLOAT_DTYPES[t], 3, s3[i]);
        for (size_t i = 0; i < 2; i++)
            check_sharding_invariance(FLOAT_DTYPES[t], 4, s4[i]);
    }
}
END_TEST

START_TEST(block_fill_of_tensor_with_zero_sized_dim_succeeds_with_no_elements)
{
    const int64_t shapes[][3] = {{0, 5, 4}, {3, 0, 4}, {3, 5, 0}};
    for (size_t t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            check_sharding_invariance(FLOAT_DTYPES[t], 3, shapes[i]);
    const int64_t zero[1] = {0};
    for (size_t t = 0; t < 3; t++)
        check_sharding_invariance(FLOAT_DTYPES[t], 1, zero);
}
END_TEST

START_TEST(scalar_fill_is_element_zero_whole_and_as_a_block)
{
    const fsdp2_random_init_t init = FSDP2_RANDOM_NORMAL_INIT(99, 0.5, 3.0);
    fsdp2_tensor_t *whole = cpu_empty(FSDP2_F64, 0, NULL);
    fsdp2_tensor_t *block = cpu_empty(FSDP2_F64, 0, NULL);
    ck_assert_int_eq(whole->numel, 1);
    ck_assert_int_eq(fsdp2_random_fill(whole, &init, NULL, NULL), FSDP2_SUCCESS);
    const int64_t no_dims[1] = {0};
    ck_assert_int_eq(fsdp2_random_fill(block, &init, no_dims, no_dims), FSDP2_SUCCESS);
    double want = ref_value(&init, 0);
    double got_whole = *(const double *)whole->data;
    double got_block = *(const double *)block->data;
    ck_assert_msg(f64_bits(got_whole) == f64_bits(want), "whole scalar: got %.17g, want %.17g",
                  got_whole, want);
    ck_assert_msg(f64_bits(got_block) == f64_bits(want), "block scalar: got %.17g, want %.17g",
                  got_block, want);
    fsdp2_tensor_release(whole);
    fsdp2_tensor_release(block);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 4. Statistics and determinism                                                        */

#define N_SAMPLES 100000

static fsdp2_tensor_t *filled_f64(const fsdp2_random_init_t *init, int64_t n)
{
    fsdp2_tensor_t *t = cpu_empty(FSDP2_F64, 1, &n);
    ck_assert_int_eq(fsdp2_random_fill(t, init, NULL, NULL), FSDP2_SUCCESS);
    return t;
}

/* Tolerances are over four standard errors: 5/sqrt(12)/sqrt(1e5) = 0.0046 for the
 * uniform mean, 2/sqrt(1e5) = 0.0063 and 2/sqrt(2e5) = 0.0045 for the normal's. */
START_TEST(uniform_minus_2_to_3_stays_in_bounds_with_mean_0_5)
{
    const fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT(2024, -2.0, 3.0);
    fsdp2_tensor_t *t = filled_f64(&init, N_SAMPLES);
    const double *v = t->data;
    long double sum = 0;
    for (int64_t i = 0; i < N_SAMPLES; i++) {
        if (!(v[i] >= -2.0 && v[i] <= 3.0))
            ck_abort_msg("element %lld = %.17g is outside [-2, 3]", (long long)i, v[i]);
        sum += v[i];
    }
    double mean = (double)(sum / N_SAMPLES);
    ck_assert_msg(fabs(mean - 0.5) <= 0.02, "mean of %d samples: got %.6f, want 0.5 +- 0.02",
                  N_SAMPLES, mean);
    fsdp2_tensor_release(t);
}
END_TEST

START_TEST(normal_1_2_has_mean_1_and_std_2)
{
    const fsdp2_random_init_t init = FSDP2_RANDOM_NORMAL_INIT(2024, 1.0, 2.0);
    fsdp2_tensor_t *t = filled_f64(&init, N_SAMPLES);
    const double *v = t->data;
    long double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < N_SAMPLES; i++) {
        if (!isfinite(v[i]))
            ck_abort_msg("element %lld = %g is not finite", (long long)i, v[i]);
        sum += v[i];
    }
    long double mean = sum / N_SAMPLES;
    for (int64_t i = 0; i < N_SAMPLES; i++)
        sum_sq += (v[i] - mean) * (v[i] - mean);
    double std = (double)sqrtl(sum_sq / (N_SAMPLES - 1));
    ck_assert_msg(fabs((double)mean - 1.0) <= 0.03, "mean: got %.6f, want 1 +- 0.03",
                  (double)mean);
    ck_assert_msg(fabs(std - 2.0) <= 0.03, "std: got %.6f, want 2 +- 0.03", std);
    fsdp2_tensor_release(t);
}
END_TEST

START_TEST(different_seeds_give_different_values_at_every_index)
{
    const uint64_t seeds[] = {0, 1, 2, 1ull << 32, 1ull << 63};
    enum { N = 4096 };
    for (size_t a = 0; a < sizeof seeds / sizeof seeds[0]; a++) {
        for (size_t b = a + 1; b < sizeof seeds / sizeof seeds[0]; b++) {
            const fsdp2_random_init_t ia = FSDP2_RANDOM_UNIFORM_INIT(seeds[a], 0.0, 1.0);
            const fsdp2_random_init_t ib = FSDP2_RANDOM_UNIFORM_INIT(seeds[b], 0.0, 1.0);
            fsdp2_tensor_t *ta = filled_f64(&ia, N);
            fsdp2_tensor_t *tb = filled_f64(&ib, N);
            const double *va = ta->data, *vb = tb->data;
            int same = 0;
            for (int i = 0; i < N; i++)
                same += va[i] == vb[i];
            ck_assert_msg(same == 0,
                          "seeds %llu and %llu: %d of %d values equal (first: %.17g vs %.17g)",
                          (unsigned long long)seeds[a], (unsigned long long)seeds[b], same, N,
                          va[0], vb[0]);
            fsdp2_tensor_release(ta);
            fsdp2_tensor_release(tb);
        }
    }
}
END_TEST

START_TEST(same_seed_twice_gives_identical_bytes)
{
    const fsdp2_random_init_t inits[2] = {FSDP2_RANDOM_UNIFORM_INIT(77, -1.0, 1.0),
                                          FSDP2_RANDOM_NORMAL_INIT(77, 0.0, 0.02)};
    const int64_t shape[2] = {33, 257};
    for (int k = 0; k < 2; k++) {
        for (size_t t = 0; t < 3; t++) {
            fsdp2_tensor_t *first = cpu_empty(FLOAT_DTYPES[t], 2, shape);
            fsdp2_tensor_t *second = cpu_empty(FLOAT_DTYPES[t], 2, shape);
            memset(first->data, 0x11, first->nbytes);
            memset(second->data, 0x22, second->nbytes);
            ck_assert_int_eq(fsdp2_random_fill(first, &inits[k], NULL, NULL), FSDP2_SUCCESS);
            ck_assert_int_eq(fsdp2_random_fill(second, &inits[k], NULL, NULL), FSDP2_SUCCESS);
            size_t elem = elem_size(FLOAT_DTYPES[t]);
            for (int64_t i = 0; i < first->numel; i++) {
                uint64_t a = elem_bits(first->data, elem, i);
                uint64_t b = elem_bits(second->data, elem, i);
                if (a != b)
                    ck_abort_msg("dist %d %s element %lld: first fill 0x%llx, second 0x%llx", k,
                                 fsdp2_dtype_name(FLOAT_DTYPES[t]), (long long)i,
                                 (unsigned long long)a, (unsigned long long)b);
            }
            fsdp2_tensor_release(first);
            fsdp2_tensor_release(second);
        }
    }
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 5. Errors                                                                            */

static void expect_invalid(fsdp2_status_t status, const char *call, const char *needle)
{
    const char *message = fsdp2_last_error();
    ck_assert_msg(status == FSDP2_ERR_INVALID_ARGUMENT, "%s: got %s, want ERR_INVALID_ARGUMENT",
                  call, fsdp2_status_name(status));
    ck_assert_msg(strstr(message, needle) != NULL, "%s: last error \"%s\" does not mention \"%s\"",
                  call, message, needle);
}

/* An init rejected by both fsdp2_random_value and fsdp2_random_fill, whose message must
 * mention needle. */
static void expect_init_rejected(const fsdp2_random_init_t *init, const char *what,
                                 const char *needle)
{
    double value = 0;
    char call[128];
    snprintf(call, sizeof call, "random_value(%s)", what);
    expect_invalid(fsdp2_random_value(init, 0, &value), call, needle);

    const int64_t shape[1] = {8};
    fsdp2_tensor_t *t = cpu_empty(FSDP2_F32, 1, shape);
    memset(t->data, 0x5a, t->nbytes);
    snprintf(call, sizeof call, "random_fill(%s)", what);
    expect_invalid(fsdp2_random_fill(t, init, NULL, NULL), call, needle);
    const unsigned char *bytes = t->data;
    for (size_t i = 0; i < t->nbytes; i++)
        ck_assert_msg(bytes[i] == 0x5a, "%s: byte %zu written (0x%02x) despite the error", call,
                      i, bytes[i]);
    fsdp2_tensor_release(t);
}

START_TEST(init_with_wrong_size_field_is_rejected_naming_the_size)
{
    const unsigned sizes[] = {0, (unsigned)sizeof(fsdp2_random_init_t) - 8,
                              (unsigned)sizeof(fsdp2_random_init_t) + 8, 12345};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT(1, 0.0, 1.0);
        init.size = sizes[i];
        char needle[32], what[32];
        snprintf(needle, sizeof needle, "size %u", sizes[i]);
        snprintf(what, sizeof what, "size %u", sizes[i]);
        expect_init_rejected(&init, what, needle);
    }
}
END_TEST

START_TEST(uniform_with_low_above_high_is_rejected_naming_both)
{
    const fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT(1, 3.5, -2.25);
    expect_init_rejected(&init, "uniform(3.5, -2.25)", "3.5");
    expect_init_rejected(&init, "uniform(3.5, -2.25)", "-2.25");
}
END_TEST

START_TEST(normal_with_negative_std_is_rejected_naming_it)
{
    const fsdp2_random_init_t init = FSDP2_RANDOM_NORMAL_INIT(1, 0.0, -0.75);
    expect_init_rejected(&init, "normal(0, -0.75)", "-0.75");
    const fsdp2_random_init_t tiny = FSDP2_RANDOM_NORMAL_INIT(1, 0.0, -1e-300);
    expect_init_rejected(&tiny, "normal(0, -1e-300)", "-1e-300");
}
END_TEST

START_TEST(non_finite_parameters_are_rejected_naming_them)
{
    const fsdp2_random_init_t cases[] = {
        FSDP2_RANDOM_UNIFORM_INIT(1, NAN, 1.0),       FSDP2_RANDOM_UNIFORM_INIT(1, 0.0, NAN),
        FSDP2_RANDOM_UNIFORM_INIT(1, -INFINITY, 1.0), FSDP2_RANDOM_UNIFORM_INIT(1, 0.0, INFINITY),
        FSDP2_RANDOM_NORMAL_INIT(1, NAN, 1.0),        FSDP2_RANDOM_NORMAL_INIT(1, 0.0, NAN),
        FSDP2_RANDOM_NORMAL_INIT(1, INFINITY, 1.0),   FSDP2_RANDOM_NORMAL_INIT(1, 0.0, INFINITY),
    };
    const char *needles[] = {"nan", "nan", "inf", "inf", "nan", "nan", "inf", "inf"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[48];
        snprintf(what, sizeof what, "case %zu (%g, %g)", i, cases[i].a, cases[i].b);
        expect_init_rejected(&cases[i], what, needles[i]);
    }
}
END_TEST

/* A constant init fills every element with its value, rounded once, whatever the seed and
 * the block: a norm's unit weight without a callback. */
START_TEST(constant_init_fills_every_element_with_its_value_in_every_dtype)
{
    const int64_t shape[2] = {5, 7}, piece[2] = {2, 3}, at[2] = {3, 4};
    const fsdp2_random_init_t one = FSDP2_RANDOM_CONSTANT_INIT(1.0);
    const fsdp2_random_init_t third = FSDP2_RANDOM_CONSTANT_INIT(1.0 / 3.0);
    fsdp2_tensor_t *t32 = cpu_empty(FSDP2_F32, 2, shape), *t16 = cpu_empty(FSDP2_BF16, 2, shape);
    fsdp2_tensor_t *blk = cpu_empty(FSDP2_F32, 2, piece);
    ck_assert_int_eq(fsdp2_random_fill(t32, &one, NULL, NULL), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_random_fill(t16, &third, NULL, NULL), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_random_fill(blk, &third, shape, at), FSDP2_SUCCESS);
    for (int64_t i = 0; i < t32->numel; i++) {
        ck_assert_msg(((float *)t32->data)[i] == 1.0f, "element %lld: %g", (long long)i,
                      (double)((float *)t32->data)[i]);
        ck_assert_uint_eq(((uint16_t *)t16->data)[i], ref_bf16(1.0 / 3.0));
    }
    for (int64_t i = 0; i < blk->numel; i++)
        ck_assert(((float *)blk->data)[i] == (float)(1.0 / 3.0));
    double v;
    ck_assert_int_eq(fsdp2_random_value(&one, 1ull << 40, &v), FSDP2_SUCCESS);
    ck_assert(v == 1.0);
    fsdp2_random_init_t bad = FSDP2_RANDOM_CONSTANT_INIT(INFINITY);
    expect_init_rejected(&bad, "constant inf", "inf");
    fsdp2_tensor_release(t32), fsdp2_tensor_release(t16), fsdp2_tensor_release(blk);
}
END_TEST

START_TEST(unknown_distribution_is_rejected_naming_it)
{
    fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT(1, 0.0, 1.0);
    init.dist = (fsdp2_random_dist_t)42;
    expect_init_rejected(&init, "dist 42", "42");
    init.dist = (fsdp2_random_dist_t)-3;
    expect_init_rejected(&init, "dist -3", "-3");
}
END_TEST

START_TEST(null_init_or_value_is_rejected)
{
    double value;
    const fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT(1, 0.0, 1.0);
    expect_invalid(fsdp2_random_value(NULL, 0, &value), "random_value(NULL init)", "NULL");
    expect_invalid(fsdp2_random_value(&init, 0, NULL), "random_value(NULL value)", "NULL");
    const int64_t shape[1] = {4};
    fsdp2_tensor_t *t = cpu_empty(FSDP2_F32, 1, shape);
    expect_invalid(fsdp2_random_fill(t, NULL, NULL, NULL), "random_fill(NULL init)", "NULL");
    fsdp2_tensor_release(t);
}
END_TEST

START_TEST(null_tensor_is_rejected)
{
    const fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT(1, 0.0, 1.0);
    expect_invalid(fsdp2_random_fill(NULL, &init, NULL, NULL), "random_fill(NULL tensor)",
                   "NULL");
}
END_TEST

/* Blocks that stick out of the global shape: past the end, at a negative offset, larger
 * than the whole dim; each message names the offending offset or size. */
START_TEST(block_outside_global_shape_is_rejected_naming_the_offset)
{
    const fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT(1, 0.0, 1.0);
    const int64_t global[2] = {10, 20};
    const struct {
        int64_t block[2];
        int64_t offset[2];
        const char *needle;
    } cases[] = {
        {{4, 6}, {2, 17}, "17"},  /* 17 + 6 > 20 along dim 1 */
        {{4, 6}, {7, 0}, "7"},    /* 7 + 4 > 10 along dim 0 */
        {{4, 6}, {-1, 0}, "-1"},  /* negative offset */
        {{11, 6}, {0, 0}, "11"},  /* block larger than the dim */
        {{0, 6}, {11, 0}, "11"},  /* an empty block past the end is still outside */
        {{1, 21}, {0, 0}, "21"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fsdp2_tensor_t *t = cpu_empty(FSDP2_F32, 2, cases[i].block);
        char call[96];
        snprintf(call, sizeof call, "random_fill(block [%lld,%lld] at [%lld,%lld] of [10,20])",
                 (long long)cases[i].block[0], (long long)cases[i].block[1],
                 (long long)cases[i].offset[0], (long long)cases[i].offset[1]);
        expect_invalid(fsdp2_random_fill(t, &init, global, cases[i].offset), call,
                       cases[i].needle);
        fsdp2_tensor_release(t);
    }
}
END_TEST

START_TEST(meta_tensor_fill_succeeds_and_allocates_nothing)
{
    const fsdp2_random_init_t init = FSDP2_RANDOM_NORMAL_INIT(1, 0.0, 1.0);
    const int64_t shape[2] = {16, 32};
    fsdp2_tensor_t *t = NULL;
    ck_assert_int_eq(fsdp2_tensor_empty(META, FSDP2_F32, 2, shape, &t), FSDP2_SUCCESS);
    ck_assert_ptr_null(t->data);
    ck_assert_int_eq(fsdp2_random_fill(t, &init, NULL, NULL), FSDP2_SUCCESS);
    const int64_t global[2] = {64, 32}, offset[2] = {16, 0};
    ck_assert_int_eq(fsdp2_random_fill(t, &init, global, offset), FSDP2_SUCCESS);
    ck_assert_ptr_null(t->data);
    ck_assert_int_eq(t->numel, 16 * 32);
    ck_assert_int_eq(t->device.type, FSDP2_DEVICE_META);
    fsdp2_tensor_release(t);
}
END_TEST

/* ---------------------------------------------------------------------------------- */

static TCase *tcase_new(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    return tc;
}

static Suite *random_suite(void)
{
    Suite *s = suite_create("random");

    TCase *philox = tcase_new("philox");
    tcase_add_test(philox, philox4x32_matches_random123_known_answer_vectors);
    tcase_add_test(philox, philox4x32_rejects_null_arguments);
    suite_add_tcase(s, philox);

    TCase *formula = tcase_new("formula");
    tcase_add_test(formula, unit_map_of_53_bits_spans_zero_to_one_minus_2_pow_minus_53);
    tcase_add_test(formula, uniform_value_equals_formula_from_philox_for_indices_past_2_pow_32);
    tcase_add_test(formula, normal_value_equals_box_muller_from_philox_for_indices_past_2_pow_32);
    tcase_add_test(formula, whole_fill_equals_formula_rounded_once_for_f64_f32_bf16);
    tcase_add_test(formula, integer_fill_truncates_formula_value_toward_zero);
    suite_add_tcase(s, formula);

    TCase *sharding = tcase_new("sharding");
    tcase_add_test(sharding, block_fill_equals_sub_block_of_whole_fill_1d);
    tcase_add_test(sharding, block_fill_equals_sub_block_of_whole_fill_2d);
    tcase_add_test(sharding, block_fill_equals_sub_block_of_whole_fill_3d_and_4d);
    tcase_add_test(sharding, block_fill_of_tensor_with_zero_sized_dim_succeeds_with_no_elements);
    tcase_add_test(sharding, scalar_fill_is_element_zero_whole_and_as_a_block);
    suite_add_tcase(s, sharding);

    TCase *stats = tcase_new("statistics");
    tcase_add_test(stats, uniform_minus_2_to_3_stays_in_bounds_with_mean_0_5);
    tcase_add_test(stats, normal_1_2_has_mean_1_and_std_2);
    tcase_add_test(stats, different_seeds_give_different_values_at_every_index);
    tcase_add_test(stats, same_seed_twice_gives_identical_bytes);
    tcase_add_test(stats, constant_init_fills_every_element_with_its_value_in_every_dtype);
    suite_add_tcase(s, stats);

    TCase *errors = tcase_new("errors");
    tcase_add_test(errors, init_with_wrong_size_field_is_rejected_naming_the_size);
    tcase_add_test(errors, uniform_with_low_above_high_is_rejected_naming_both);
    tcase_add_test(errors, normal_with_negative_std_is_rejected_naming_it);
    tcase_add_test(errors, non_finite_parameters_are_rejected_naming_them);
    tcase_add_test(errors, unknown_distribution_is_rejected_naming_it);
    tcase_add_test(errors, null_init_or_value_is_rejected);
    tcase_add_test(errors, null_tensor_is_rejected);
    tcase_add_test(errors, block_outside_global_shape_is_rejected_naming_the_offset);
    tcase_add_test(errors, meta_tensor_fill_succeeds_and_allocates_nothing);
    suite_add_tcase(s, errors);

    return s;
}

FSDP2_CHECK_MAIN(random_suite)
