/* Tests for tensors (fsdp2/tensor.h) and devices (fsdp2/device.h) on cpu and meta.
 *
 * References: element sizes and shape products are written out here (a table and a
 * naive loop), and memory accounting is checked against fsdp2_memory_stats taken before
 * each step, so a test states exactly how many bytes a call must add or return. Every
 * test runs in its own forked process, so the allocator's counters start from whatever
 * the test itself did; tests still compare against a "before" snapshot rather than 0.
 * Lifetime tests read through views after the parent is released: a premature free
 * shows as wrong counters here and as a use-after-free under AddressSanitizer. */
#include <check.h>

#include "check_main.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/device.h>
#include <fsdp2/dtype.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

#include "core/env_internal.h"

#define TEST_TIMEOUT_S 60

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;
static const fsdp2_device_t META = FSDP2_DEVICE_META_INIT;

struct dtype_row {
    fsdp2_dtype_t dtype;
    size_t bytes;
};

static const struct dtype_row dtype_rows[] = {
    {FSDP2_F32, 4}, {FSDP2_F64, 8}, {FSDP2_BF16, 2}, {FSDP2_F16, 2},
    {FSDP2_I32, 4}, {FSDP2_I64, 8}, {FSDP2_U8, 1},
};
#define DTYPE_COUNT ((int)(sizeof(dtype_rows) / sizeof(dtype_rows[0])))

struct shape_row {
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
};

static const struct shape_row shape_rows[] = {
    {1, {1}}, {1, {7}}, {2, {3, 5}}, {3, {2, 3, 4}}, {2, {37, 29}}, {4, {2, 1, 3, 65}},
};
#define SHAPE_COUNT ((int)(sizeof(shape_rows) / sizeof(shape_rows[0])))

static int64_t naive_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

static fsdp2_memory_stats_t cpu_stats(void)
{
    fsdp2_memory_stats_t stats;
    fsdp2_status_t s = fsdp2_memory_stats_get(CPU, &stats);
    ck_assert_msg(s == FSDP2_SUCCESS, "fsdp2_memory_stats_get(cpu) = %s (%s)",
                  fsdp2_status_name(s), fsdp2_last_error());
    return stats;
}

#define ASSERT_OK(call)                                                                  \
    do {                                                                                 \
        fsdp2_status_t assert_ok_s_ = (call);                                            \
        ck_assert_msg(assert_ok_s_ == FSDP2_SUCCESS, "%s = %s (%s)", #call,               \
                      fsdp2_status_name(assert_ok_s_), fsdp2_last_error());             \
    } while (0)

#define ASSERT_STATUS(call, expected)                                                    \
    do {                                                                                 \
        fsdp2_status_t assert_status_s_ = (call);                                        \
        ck_assert_msg(assert_status_s_ == (expected), "%s = %s, expected %s (%s)", #call, \
                      fsdp2_status_name(assert_status_s_), fsdp2_status_name(expected),  \
                      fsdp2_last_error());                                               \
    } while (0)

#define ASSERT_MESSAGE_HAS(needle)                                                       \
    ck_assert_msg(strstr(fsdp2_last_error(), (needle)) != NULL,                          \
                  "message '%s' does not contain '%s'", fsdp2_last_error(), (needle))

#define ASSERT_ALLOCATED(expected)                                                       \
    do {                                                                                 \
        uint64_t assert_alloc_got_ = cpu_stats().allocated_bytes;                         \
        uint64_t assert_alloc_want_ = (expected);                                        \
        ck_assert_msg(assert_alloc_got_ == assert_alloc_want_,                           \
                      "cpu allocated_bytes = %llu, expected %llu",                       \
                      (unsigned long long)assert_alloc_got_,                             \
                      (unsigned long long)assert_alloc_want_);                           \
    } while (0)

/* ---------------------------------------------------------------------------------- */
/* empty and zeros on cpu                                                              */

START_TEST(empty_allocates_exactly_nbytes_and_release_returns_them_for_every_dtype)
{
    for (int d = 0; d < DTYPE_COUNT; d++) {
        for (int k = 0; k < SHAPE_COUNT; k++) {
            const struct shape_row *sh = &shape_rows[k];
            int64_t numel = naive_numel(sh->ndim, sh->shape);
            size_t nbytes = (size_t)numel * dtype_rows[d].bytes;
            fsdp2_memory_stats_t before = cpu_stats();

            fsdp2_tensor_t *t = NULL;
            ASSERT_OK(fsdp2_tensor_empty(CPU, dtype_rows[d].dtype, sh->ndim, sh->shape, &t));
            ck_assert_msg(t->numel == numel && t->nbytes == nbytes,
                          "%s shape #%d: numel %lld nbytes %zu, expected %lld and %zu",
                          fsdp2_dtype_name(dtype_rows[d].dtype), k, (long long)t->numel,
                          t->nbytes, (long long)numel, nbytes);
            ck_assert_int_eq(t->ndim, sh->ndim);
            for (int i = 0; i < FSDP2_MAX_DIMS; i++)
                ck_assert_int_eq(t->shape[i], i < sh->ndim ? sh->shape[i] : 0);
            ck_assert_int_eq(t->dtype, dtype_rows[d].dtype);
            ck_assert_int_eq(t->device.type, FSDP2_DEVICE_CPU);
            ck_assert_ptr_nonnull(t->data);
            ck_assert_msg(((uintptr_t)t->data & 63) == 0, "data %p is not 64-byte aligned",
                          t->data);
            /* The whole range is writable (ASan checks the bounds). */
            memset(t->data, 0xab, t->nbytes);

            fsdp2_memory_stats_t during = cpu_stats();
            ck_assert_msg(during.allocated_bytes == before.allocated_bytes + nbytes,
                          "%s shape #%d: allocated %llu, expected %llu + %zu",
                          fsdp2_dtype_name(dtype_rows[d].dtype), k,
                          (unsigned long long)during.allocated_bytes,
                          (unsigned long long)before.allocated_bytes, nbytes);
            ck_assert_uint_eq(during.alloc_count, before.alloc_count + 1);

            ASSERT_OK(fsdp2_tensor_release(t));
            fsdp2_memory_stats_t after = cpu_stats();
            ck_assert_uint_eq(after.allocated_bytes, before.allocated_bytes);
            ck_assert_uint_eq(after.free_count, before.free_count + 1);
        }
    }
}
END_TEST

START_TEST(zeros_fills_every_byte_with_zero_for_every_dtype)
{
    for (int d = 0; d < DTYPE_COUNT; d++) {
        for (int k = 0; k < SHAPE_COUNT; k++) {
            const struct shape_row *sh = &shape_rows[k];
            /* Dirty a block of the same size first, so reused memory is not zero by luck. */
            fsdp2_tensor_t *dirty = NULL;
            ASSERT_OK(fsdp2_tensor_empty(CPU, dtype_rows[d].dtype, sh->ndim, sh->shape, &dirty));
            memset(dirty->data, 0xff, dirty->nbytes);
            ASSERT_OK(fsdp2_tensor_release(dirty));

            fsdp2_memory_stats_t before = cpu_stats();
            fsdp2_tensor_t *t = NULL;
            ASSERT_OK(fsdp2_tensor_zeros(CPU, dtype_rows[d].dtype, sh->ndim, sh->shape, &t));
            ck_assert_uint_eq(cpu_stats().allocated_bytes, before.allocated_bytes + t->nbytes);
            const unsigned char *bytes = t->data;
            for (size_t i = 0; i < t->nbytes; i++)
                if (bytes[i] != 0)
                    ck_abort_msg("%s shape #%d: byte %zu of %zu is %#x, expected 0",
                                 fsdp2_dtype_name(dtype_rows[d].dtype), k, i, t->nbytes,
                                 bytes[i]);
            ASSERT_OK(fsdp2_tensor_release(t));
            ck_assert_uint_eq(cpu_stats().allocated_bytes, before.allocated_bytes);
        }
    }
}
END_TEST

START_TEST(peak_tracks_the_most_bytes_live_at_once_and_reset_lowers_it)
{
    ASSERT_OK(fsdp2_memory_stats_reset_peak(CPU));
    fsdp2_memory_stats_t base = cpu_stats();
    ck_assert_uint_eq(base.peak_allocated_bytes, base.allocated_bytes);

    const int64_t a_shape[] = {100}, b_shape[] = {200}, c_shape[] = {50};
    fsdp2_tensor_t *a, *b, *c;
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_U8, 1, a_shape, &a));
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_U8, 1, b_shape, &b));
    ASSERT_OK(fsdp2_tensor_release(a));
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_U8, 1, c_shape, &c));

    fsdp2_memory_stats_t now = cpu_stats();
    ck_assert_uint_eq(now.allocated_bytes, base.allocated_bytes + 250);
    ck_assert_uint_eq(now.peak_allocated_bytes, base.allocated_bytes + 300);

    ASSERT_OK(fsdp2_tensor_release(b));
    ASSERT_OK(fsdp2_tensor_release(c));
    now = cpu_stats();
    ck_assert_uint_eq(now.allocated_bytes, base.allocated_bytes);
    ck_assert_uint_eq(now.peak_allocated_bytes, base.allocated_bytes + 300);

    ASSERT_OK(fsdp2_memory_stats_reset_peak(CPU));
    ck_assert_uint_eq(cpu_stats().peak_allocated_bytes, base.allocated_bytes);
}
END_TEST

/* FSDP2_CPU_MEMORY_LIMIT: what fits is allocated, the allocation that would pass it is
 * refused naming the bytes and the limit, and nothing is counted for it. */
START_TEST(an_allocation_past_the_cpu_memory_limit_is_refused_and_counts_nothing)
{
    fsdp2_memory_stats_t base = cpu_stats();
    char limit[32];
    snprintf(limit, sizeof(limit), "%llu", (unsigned long long)(base.allocated_bytes + 1000));
    ck_assert_int_eq(setenv("FSDP2_CPU_MEMORY_LIMIT", limit, 1), 0);
    ASSERT_OK(fsdp2_env_reload());
    uint64_t capacity = 0;
    ASSERT_OK(fsdp2_memory_capacity(CPU, &capacity));
    ck_assert_uint_eq(capacity, base.allocated_bytes + 1000);
    const int64_t fits[] = {600}, over[] = {401};
    fsdp2_tensor_t *a = NULL, *b = NULL;
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_U8, 1, fits, &a));
    fsdp2_status_t st = fsdp2_tensor_empty(CPU, FSDP2_U8, 1, over, &b);
    ck_assert_msg(st == FSDP2_ERR_OUT_OF_MEMORY && strstr(fsdp2_last_error(), "401 bytes") &&
                      strstr(fsdp2_last_error(), limit),
                  "%s: %s", fsdp2_status_name(st), fsdp2_last_error());
    ck_assert_ptr_null(b);
    ck_assert_uint_eq(cpu_stats().allocated_bytes, base.allocated_bytes + 600);
    const int64_t exact[] = {400}; /* up to the limit exactly */
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_U8, 1, exact, &b));
    ASSERT_OK(fsdp2_tensor_release(a));
    ASSERT_OK(fsdp2_tensor_release(b));
    ck_assert_int_eq(unsetenv("FSDP2_CPU_MEMORY_LIMIT"), 0);
    ASSERT_OK(fsdp2_env_reload());
    ASSERT_OK(fsdp2_memory_capacity(CPU, &capacity));
    ck_assert_uint_eq(capacity, 0);
}
END_TEST

START_TEST(empty_rejects_unknown_dtype)
{
    const int64_t shape[] = {4};
    fsdp2_tensor_t *t = (fsdp2_tensor_t *)&t;
    ASSERT_STATUS(fsdp2_tensor_empty(CPU, (fsdp2_dtype_t)99, 1, shape, &t),
                  FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(t);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* meta tensors, and the edges of shapes                                               */

START_TEST(meta_tensors_allocate_nothing_and_have_no_data)
{
    fsdp2_memory_stats_t before = cpu_stats();
    for (int d = 0; d < DTYPE_COUNT; d++) {
        for (int k = 0; k < SHAPE_COUNT; k++) {
            const struct shape_row *sh = &shape_rows[k];
            fsdp2_tensor_t *e = NULL, *z = NULL;
            ASSERT_OK(fsdp2_tensor_empty(META, dtype_rows[d].dtype, sh->ndim, sh->shape, &e));
            ASSERT_OK(fsdp2_tensor_zeros(META, dtype_rows[d].dtype, sh->ndim, sh->shape, &z));
            int64_t numel = naive_numel(sh->ndim, sh->shape);
            ck_assert_ptr_null(e->data);
            ck_assert_ptr_null(z->data);
            ck_assert_int_eq(e->device.type, FSDP2_DEVICE_META);
            ck_assert_int_eq(e->numel, numel);
            ck_assert_uint_eq(e->nbytes, (size_t)numel * dtype_rows[d].bytes);
            ASSERT_OK(fsdp2_tensor_release(e));
            ASSERT_OK(fsdp2_tensor_release(z));
        }
    }
    fsdp2_memory_stats_t after = cpu_stats();
    ck_assert_uint_eq(after.alloc_count, before.alloc_count);
    ck_assert_uint_eq(after.allocated_bytes, before.allocated_bytes);
}
END_TEST

START_TEST(meta_tensor_computes_bytes_too_large_to_allocate)
{
    const int64_t shape[] = {(int64_t)1 << 61, 1}; /* 2^63 bytes of f32 */
    fsdp2_tensor_t *t = NULL;
    ASSERT_OK(fsdp2_tensor_empty(META, FSDP2_F32, 2, shape, &t));
    ck_assert_int_eq(t->numel, (int64_t)1 << 61);
    ck_assert_uint_eq(t->nbytes, (size_t)1 << 63);
    ck_assert_ptr_null(t->data);
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(zero_dim_tensor_is_a_scalar_of_one_element)
{
    fsdp2_memory_stats_t before = cpu_stats();
    fsdp2_tensor_t *t = NULL;
    ASSERT_OK(fsdp2_tensor_zeros(CPU, FSDP2_F64, 0, NULL, &t));
    ck_assert_int_eq(t->ndim, 0);
    ck_assert_int_eq(t->numel, 1);
    ck_assert_uint_eq(t->nbytes, 8);
    ck_assert_ptr_nonnull(t->data);
    ck_assert(*(const double *)t->data == 0.0);
    ck_assert_uint_eq(cpu_stats().allocated_bytes, before.allocated_bytes + 8);
    ASSERT_OK(fsdp2_tensor_release(t));
    ck_assert_uint_eq(cpu_stats().allocated_bytes, before.allocated_bytes);

    int64_t numel = 0;
    ASSERT_OK(fsdp2_shape_numel(0, NULL, &numel));
    ck_assert_int_eq(numel, 1);
}
END_TEST

START_TEST(zero_sized_dim_has_no_elements_no_data_and_no_allocation)
{
    const int64_t shape[] = {4, 0, 3};
    fsdp2_memory_stats_t before = cpu_stats();
    fsdp2_tensor_t *e = NULL, *z = NULL;
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_F32, 3, shape, &e));
    ASSERT_OK(fsdp2_tensor_zeros(CPU, FSDP2_F32, 3, shape, &z));
    ck_assert_int_eq(e->numel, 0);
    ck_assert_uint_eq(e->nbytes, 0);
    ck_assert_ptr_null(e->data);
    ck_assert_ptr_null(z->data);
    fsdp2_memory_stats_t during = cpu_stats();
    ck_assert_uint_eq(during.alloc_count, before.alloc_count);
    ck_assert_uint_eq(during.allocated_bytes, before.allocated_bytes);
    ASSERT_OK(fsdp2_tensor_release(e));
    ASSERT_OK(fsdp2_tensor_release(z));
    ck_assert_uint_eq(cpu_stats().free_count, before.free_count);
}
END_TEST

START_TEST(eight_dims_are_accepted_and_nine_are_rejected)
{
    const int64_t shape8[] = {1, 2, 1, 2, 1, 2, 1, 2};
    fsdp2_tensor_t *t = NULL;
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_F32, 8, shape8, &t));
    ck_assert_int_eq(t->ndim, 8);
    ck_assert_int_eq(t->numel, 16);
    ck_assert_uint_eq(t->nbytes, 64);
    ASSERT_OK(fsdp2_tensor_release(t));

    const int64_t shape9[] = {1, 2, 1, 2, 1, 2, 1, 2, 1};
    t = (fsdp2_tensor_t *)&t;
    ASSERT_STATUS(fsdp2_tensor_empty(CPU, FSDP2_F32, 9, shape9, &t),
                  FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(t);
    ASSERT_MESSAGE_HAS("9");
    ASSERT_STATUS(fsdp2_tensor_empty(CPU, FSDP2_F32, -1, shape9, &t),
                  FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_MESSAGE_HAS("-1");
}
END_TEST

START_TEST(negative_dim_is_rejected_with_a_message_naming_the_shape)
{
    const int64_t shape[] = {2, -3, 4};
    fsdp2_memory_stats_t before = cpu_stats();
    fsdp2_tensor_t *t = (fsdp2_tensor_t *)&t;
    ASSERT_STATUS(fsdp2_tensor_empty(CPU, FSDP2_F32, 3, shape, &t), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(t);
    ASSERT_MESSAGE_HAS("[2,-3,4]");
    ck_assert_uint_eq(cpu_stats().alloc_count, before.alloc_count);
    int64_t numel = 0;
    ASSERT_STATUS(fsdp2_shape_numel(3, shape, &numel), FSDP2_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(numel_overflow_of_int64_is_an_overflow_error)
{
    const int64_t shape[] = {INT64_MAX, 2};
    fsdp2_tensor_t *t = (fsdp2_tensor_t *)&t;
    ASSERT_STATUS(fsdp2_tensor_empty(CPU, FSDP2_U8, 2, shape, &t), FSDP2_ERR_OVERFLOW);
    ck_assert_ptr_null(t);
    ASSERT_MESSAGE_HAS("[9223372036854775807,2]");
    ASSERT_STATUS(fsdp2_tensor_empty(META, FSDP2_U8, 2, shape, &t), FSDP2_ERR_OVERFLOW);
    int64_t numel = 0;
    ASSERT_STATUS(fsdp2_shape_numel(2, shape, &numel), FSDP2_ERR_OVERFLOW);
}
END_TEST

START_TEST(byte_overflow_of_size_t_is_an_overflow_error)
{
    /* 2^62 elements fit in int64_t; 2^62 * 4 bytes do not fit in a 64-bit size_t. */
    const int64_t shape[] = {(int64_t)1 << 62, 1};
    int64_t numel = 0;
    ASSERT_OK(fsdp2_shape_numel(2, shape, &numel));
    ck_assert_int_eq(numel, (int64_t)1 << 62);

    fsdp2_tensor_t *t = (fsdp2_tensor_t *)&t;
    ASSERT_STATUS(fsdp2_tensor_empty(CPU, FSDP2_F32, 2, shape, &t), FSDP2_ERR_OVERFLOW);
    ck_assert_ptr_null(t);
    ASSERT_MESSAGE_HAS("[4611686018427387904,1]");
    ASSERT_MESSAGE_HAS("f32");
    ASSERT_STATUS(fsdp2_tensor_empty(META, FSDP2_F32, 2, shape, &t), FSDP2_ERR_OVERFLOW);
    /* One byte per element still fits. */
    ASSERT_OK(fsdp2_tensor_empty(META, FSDP2_U8, 2, shape, &t));
    ck_assert_uint_eq(t->nbytes, (size_t)1 << 62);
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Views: narrow, reshape, retain                                                      */

/* A cpu f32 tensor of shape {rows, cols} holding 0, 1, 2, ... in row-major order. */
static fsdp2_tensor_t *iota_f32(int64_t rows, int64_t cols)
{
    const int64_t shape[] = {rows, cols};
    fsdp2_tensor_t *t = NULL;
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_F32, 2, shape, &t));
    float *p = t->data;
    for (int64_t i = 0; i < rows * cols; i++)
        p[i] = (float)i;
    return t;
}

START_TEST(narrow_of_middle_rows_points_at_the_right_offset_and_allocates_nothing)
{
    fsdp2_tensor_t *t = iota_f32(6, 4);
    fsdp2_memory_stats_t before = cpu_stats();
    fsdp2_tensor_t *v = NULL;
    ASSERT_OK(fsdp2_tensor_narrow(t, 2, 3, &v));
    ck_assert_int_eq(v->ndim, 2);
    ck_assert_int_eq(v->shape[0], 3);
    ck_assert_int_eq(v->shape[1], 4);
    ck_assert_int_eq(v->numel, 12);
    ck_assert_uint_eq(v->nbytes, 48);
    ck_assert_int_eq(v->dtype, FSDP2_F32);
    ck_assert_msg((char *)v->data == (char *)t->data + 2 * 4 * sizeof(float),
                  "view data %p, expected parent %p + 32 bytes", v->data, t->data);
    const float *vp = v->data;
    for (int i = 0; i < 12; i++)
        ck_assert_msg(vp[i] == (float)(8 + i), "view element %d = %g, expected %d", i, vp[i],
                      8 + i);
    ck_assert_uint_eq(cpu_stats().alloc_count, before.alloc_count);
    ck_assert_uint_eq(cpu_stats().allocated_bytes, before.allocated_bytes);
    ASSERT_OK(fsdp2_tensor_release(v));
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(narrow_view_shares_memory_with_its_parent)
{
    fsdp2_tensor_t *t = iota_f32(6, 4);
    fsdp2_tensor_t *v = NULL;
    ASSERT_OK(fsdp2_tensor_narrow(t, 3, 2, &v));
    ((float *)v->data)[5] = -1.5f; /* row 1, col 1 of the view = row 4, col 1 */
    float got = ((const float *)t->data)[4 * 4 + 1];
    ck_assert_msg(got == -1.5f, "parent[4][1] = %g after writing -1.5 through the view", got);
    ((float *)t->data)[3 * 4] = 42.0f;
    got = ((const float *)v->data)[0];
    ck_assert_msg(got == 42.0f, "view[0][0] = %g after writing 42 through the parent", got);
    ASSERT_OK(fsdp2_tensor_release(v));
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(narrow_of_a_narrow_composes_the_offsets)
{
    fsdp2_tensor_t *t = iota_f32(10, 3);
    fsdp2_tensor_t *a = NULL, *b = NULL;
    ASSERT_OK(fsdp2_tensor_narrow(t, 2, 6, &a));
    ASSERT_OK(fsdp2_tensor_narrow(a, 3, 2, &b));
    ck_assert_msg((char *)b->data == (char *)t->data + 5 * 3 * sizeof(float),
                  "data %p, expected parent %p + row 5", b->data, t->data);
    ck_assert_msg(((const float *)b->data)[0] == 15.0f, "b[0][0] = %g, expected 15",
                  ((const float *)b->data)[0]);
    ASSERT_OK(fsdp2_tensor_release(t));
    ASSERT_OK(fsdp2_tensor_release(a));
    ASSERT_OK(fsdp2_tensor_release(b));
}
END_TEST

START_TEST(narrow_of_length_zero_is_allowed_at_every_start_including_the_end)
{
    fsdp2_tensor_t *t = iota_f32(6, 4);
    for (int64_t start = 0; start <= 6; start++) {
        fsdp2_tensor_t *v = NULL;
        ASSERT_OK(fsdp2_tensor_narrow(t, start, 0, &v));
        ck_assert_int_eq(v->shape[0], 0);
        ck_assert_int_eq(v->shape[1], 4);
        ck_assert_int_eq(v->numel, 0);
        ck_assert_uint_eq(v->nbytes, 0);
        ck_assert_ptr_null(v->data);
        ASSERT_OK(fsdp2_tensor_release(v));
    }
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(narrow_out_of_range_is_rejected_naming_the_range_and_the_size)
{
    fsdp2_tensor_t *t = iota_f32(6, 4);
    const int64_t bad[][2] = {{5, 2}, {7, 0}, {-1, 1}, {0, -1}, {0, 7}, {INT64_MAX, 1},
                              {1, INT64_MAX}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fsdp2_tensor_t *v = (fsdp2_tensor_t *)&v;
        fsdp2_status_t s = fsdp2_tensor_narrow(t, bad[i][0], bad[i][1], &v);
        ck_assert_msg(s == FSDP2_ERR_INVALID_ARGUMENT,
                      "narrow(start %lld, length %lld) of 6 rows = %s, expected "
                      "ERR_INVALID_ARGUMENT",
                      (long long)bad[i][0], (long long)bad[i][1], fsdp2_status_name(s));
        ck_assert_ptr_null(v);
        char start[32];
        snprintf(start, sizeof(start), "[%lld,", (long long)bad[i][0]);
        ASSERT_MESSAGE_HAS(start);
        ASSERT_MESSAGE_HAS("6");
    }
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(narrow_of_a_zero_dim_tensor_is_rejected)
{
    fsdp2_tensor_t *t = NULL, *v = (fsdp2_tensor_t *)&v;
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_F32, 0, NULL, &t));
    ASSERT_STATUS(fsdp2_tensor_narrow(t, 0, 1, &v), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(v);
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(narrow_of_a_meta_tensor_is_a_meta_view_without_data)
{
    const int64_t shape[] = {10, 3};
    fsdp2_tensor_t *t = NULL, *v = NULL;
    ASSERT_OK(fsdp2_tensor_empty(META, FSDP2_BF16, 2, shape, &t));
    ASSERT_OK(fsdp2_tensor_narrow(t, 4, 5, &v));
    ck_assert_int_eq(v->device.type, FSDP2_DEVICE_META);
    ck_assert_int_eq(v->shape[0], 5);
    ck_assert_uint_eq(v->nbytes, 5 * 3 * 2);
    ck_assert_ptr_null(v->data);
    ASSERT_OK(fsdp2_tensor_release(t));
    ASSERT_OK(fsdp2_tensor_release(v));
}
END_TEST

START_TEST(reshape_infers_minus_one_and_shares_memory)
{
    fsdp2_tensor_t *t = iota_f32(6, 4);
    fsdp2_memory_stats_t before = cpu_stats();

    const int64_t s38[] = {3, -1};
    fsdp2_tensor_t *r = NULL;
    ASSERT_OK(fsdp2_tensor_reshape(t, 2, s38, &r));
    ck_assert_int_eq(r->ndim, 2);
    ck_assert_int_eq(r->shape[0], 3);
    ck_assert_int_eq(r->shape[1], 8);
    ck_assert_int_eq(r->numel, 24);
    ck_assert_ptr_eq(r->data, t->data);

    const int64_t flat[] = {-1};
    fsdp2_tensor_t *f = NULL;
    ASSERT_OK(fsdp2_tensor_reshape(r, 1, flat, &f));
    ck_assert_int_eq(f->ndim, 1);
    ck_assert_int_eq(f->shape[0], 24);
    ck_assert_int_eq(f->shape[1], 0);

    const int64_t s234[] = {2, -1, 4};
    fsdp2_tensor_t *g = NULL;
    ASSERT_OK(fsdp2_tensor_reshape(t, 3, s234, &g));
    ck_assert_int_eq(g->shape[1], 3);

    ((float *)f->data)[13] = -7.0f;
    ck_assert_msg(((const float *)t->data)[3 * 4 + 1] == -7.0f,
                  "parent[3][1] = %g after writing -7 at flat index 13",
                  ((const float *)t->data)[3 * 4 + 1]);
    ck_assert_uint_eq(cpu_stats().alloc_count, before.alloc_count);

    ASSERT_OK(fsdp2_tensor_release(t));
    ASSERT_OK(fsdp2_tensor_release(r));
    ASSERT_OK(fsdp2_tensor_release(f));
    ASSERT_OK(fsdp2_tensor_release(g));
}
END_TEST

START_TEST(reshape_of_a_narrow_view_keeps_the_view_offset)
{
    fsdp2_tensor_t *t = iota_f32(6, 4);
    fsdp2_tensor_t *v = NULL, *r = NULL;
    ASSERT_OK(fsdp2_tensor_narrow(t, 2, 2, &v));
    const int64_t flat[] = {8};
    ASSERT_OK(fsdp2_tensor_reshape(v, 1, flat, &r));
    ck_assert_ptr_eq(r->data, v->data);
    ck_assert_msg(((const float *)r->data)[0] == 8.0f, "r[0] = %g, expected 8",
                  ((const float *)r->data)[0]);
    ASSERT_OK(fsdp2_tensor_release(t));
    ASSERT_OK(fsdp2_tensor_release(v));
    ASSERT_OK(fsdp2_tensor_release(r));
}
END_TEST

START_TEST(reshape_with_another_numel_is_a_shape_mismatch_naming_both_shapes)
{
    fsdp2_tensor_t *t = iota_f32(6, 4);
    const int64_t s55[] = {5, 5};
    fsdp2_tensor_t *r = (fsdp2_tensor_t *)&r;
    ASSERT_STATUS(fsdp2_tensor_reshape(t, 2, s55, &r), FSDP2_ERR_SHAPE_MISMATCH);
    ck_assert_ptr_null(r);
    ASSERT_MESSAGE_HAS("[6,4]");
    ASSERT_MESSAGE_HAS("[5,5]");
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(reshape_rejects_two_minus_ones_and_an_uninferable_minus_one)
{
    fsdp2_tensor_t *t = iota_f32(6, 4);
    fsdp2_tensor_t *r = (fsdp2_tensor_t *)&r;
    const int64_t two[] = {-1, -1};
    ASSERT_STATUS(fsdp2_tensor_reshape(t, 2, two, &r), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(r);
    const int64_t indivisible[] = {-1, 5};
    ASSERT_STATUS(fsdp2_tensor_reshape(t, 2, indivisible, &r), FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_MESSAGE_HAS("24");
    const int64_t negative[] = {-2, -12};
    ASSERT_STATUS(fsdp2_tensor_reshape(t, 2, negative, &r), FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(storage_outlives_the_parent_while_a_view_exists)
{
    fsdp2_memory_stats_t before = cpu_stats();
    fsdp2_tensor_t *t = iota_f32(16, 16);
    fsdp2_tensor_t *v = NULL;
    ASSERT_OK(fsdp2_tensor_narrow(t, 4, 4, &v));
    ASSERT_OK(fsdp2_tensor_release(t));

    ck_assert_msg(cpu_stats().allocated_bytes == before.allocated_bytes + 1024,
                  "allocated %llu after releasing the parent, expected %llu + 1024 (the view "
                  "keeps the storage)",
                  (unsigned long long)cpu_stats().allocated_bytes,
                  (unsigned long long)before.allocated_bytes);
    ck_assert_uint_eq(cpu_stats().free_count, before.free_count);
    const float *vp = v->data;
    for (int i = 0; i < 64; i++)
        ck_assert_msg(vp[i] == (float)(64 + i), "view element %d = %g after the parent's "
                      "release, expected %d", i, vp[i], 64 + i);

    ASSERT_OK(fsdp2_tensor_release(v));
    ASSERT_ALLOCATED(before.allocated_bytes);
    ck_assert_uint_eq(cpu_stats().free_count, before.free_count + 1);
}
END_TEST

START_TEST(retain_gives_a_second_handle_on_the_same_view)
{
    fsdp2_memory_stats_t before = cpu_stats();
    fsdp2_tensor_t *t = iota_f32(4, 4);
    fsdp2_tensor_t *v = NULL, *r = NULL;
    ASSERT_OK(fsdp2_tensor_narrow(t, 1, 2, &v));
    ASSERT_OK(fsdp2_tensor_retain(v, &r));
    ck_assert_ptr_ne(r, v);
    ck_assert_ptr_eq(r->data, v->data);
    ck_assert_int_eq(r->numel, v->numel);
    ck_assert_int_eq(r->shape[0], 2);

    ASSERT_OK(fsdp2_tensor_release(t));
    ASSERT_OK(fsdp2_tensor_release(v));
    ASSERT_ALLOCATED(before.allocated_bytes + 64);
    ck_assert_msg(((const float *)r->data)[0] == 4.0f, "retained[0] = %g, expected 4",
                  ((const float *)r->data)[0]);
    ASSERT_OK(fsdp2_tensor_release(r));
    ASSERT_ALLOCATED(before.allocated_bytes);
}
END_TEST

START_TEST(release_of_null_succeeds)
{
    ASSERT_OK(fsdp2_tensor_release(NULL));
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* from_blob                                                                           */

struct deleter_log {
    int calls;
    void *data;
    void *user;
};

static void record_deleter(void *data, void *user)
{
    struct deleter_log *log = user;
    log->calls++;
    log->data = data;
    log->user = user;
}

START_TEST(from_blob_calls_the_deleter_once_after_the_last_view_with_the_user_pointer)
{
    float *buf = malloc(8 * 2 * sizeof(float));
    ck_assert_ptr_nonnull(buf);
    for (int i = 0; i < 16; i++)
        buf[i] = (float)i;
    struct deleter_log log = {0, NULL, NULL};
    fsdp2_memory_stats_t before = cpu_stats();

    const int64_t shape[] = {8, 2};
    fsdp2_tensor_t *t = NULL, *v = NULL, *r = NULL;
    ASSERT_OK(fsdp2_tensor_from_blob(buf, CPU, FSDP2_F32, 2, shape, record_deleter, &log, &t));
    ck_assert_ptr_eq(t->data, buf);
    ck_assert_int_eq(t->numel, 16);
    ASSERT_OK(fsdp2_tensor_narrow(t, 6, 2, &v));
    ck_assert_ptr_eq(v->data, buf + 12);
    ASSERT_OK(fsdp2_tensor_retain(v, &r));
    /* Wrapped memory is the caller's: the library's allocator does not count it. */
    ck_assert_uint_eq(cpu_stats().allocated_bytes, before.allocated_bytes);

    ASSERT_OK(fsdp2_tensor_release(t));
    ck_assert_int_eq(log.calls, 0);
    ASSERT_OK(fsdp2_tensor_release(v));
    ck_assert_int_eq(log.calls, 0);
    ck_assert(((const float *)r->data)[3] == 15.0f);
    ASSERT_OK(fsdp2_tensor_release(r));
    ck_assert_int_eq(log.calls, 1);
    ck_assert_ptr_eq(log.data, buf);
    ck_assert_ptr_eq(log.user, &log);
    ck_assert_uint_eq(cpu_stats().free_count, before.free_count);
    free(buf);
}
END_TEST

START_TEST(from_blob_without_deleter_leaves_the_memory_to_the_caller)
{
    float buf[6] = {1, 2, 3, 4, 5, 6};
    const int64_t shape[] = {2, 3};
    fsdp2_tensor_t *t = NULL;
    ASSERT_OK(fsdp2_tensor_from_blob(buf, CPU, FSDP2_F32, 2, shape, NULL, NULL, &t));
    ck_assert_ptr_eq(t->data, buf);
    ASSERT_OK(fsdp2_tensor_release(t));
    ck_assert(buf[5] == 6.0f);
}
END_TEST

START_TEST(from_blob_rejects_meta_null_data_and_bad_shapes_without_calling_the_deleter)
{
    struct deleter_log log = {0, NULL, NULL};
    float buf[4];
    const int64_t shape[] = {4};
    const int64_t negative[] = {-4};
    fsdp2_tensor_t *t = (fsdp2_tensor_t *)&t;
    ASSERT_STATUS(fsdp2_tensor_from_blob(buf, META, FSDP2_F32, 1, shape, record_deleter, &log,
                                         &t),
                  FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(t);
    ASSERT_STATUS(fsdp2_tensor_from_blob(NULL, CPU, FSDP2_F32, 1, shape, record_deleter, &log,
                                         &t),
                  FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(fsdp2_tensor_from_blob(buf, CPU, FSDP2_F32, 1, negative, record_deleter, &log,
                                         &t),
                  FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(log.calls, 0);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* check and shape_format                                                              */

START_TEST(tensor_check_shape_mismatch_message_is_exact)
{
    const int64_t have[] = {128, 784};
    const int64_t want[] = {128, 785};
    fsdp2_tensor_t *t = NULL;
    ASSERT_OK(fsdp2_tensor_empty(META, FSDP2_F32, 2, have, &t));
    ASSERT_OK(fsdp2_tensor_check(t, "fc1.weight", FSDP2_F32, 2, have));
    ASSERT_STATUS(fsdp2_tensor_check(t, "fc1.weight", FSDP2_F32, 2, want),
                  FSDP2_ERR_SHAPE_MISMATCH);
    ck_assert_str_eq(fsdp2_last_error(),
                     "tensor 'fc1.weight': shape [128,784] does not match [128,785]");
    ASSERT_STATUS(fsdp2_tensor_check(t, "fc1.weight", FSDP2_F32, 1, want),
                  FSDP2_ERR_SHAPE_MISMATCH);
    ck_assert_str_eq(fsdp2_last_error(),
                     "tensor 'fc1.weight': shape [128,784] does not match [128]");
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(tensor_check_dtype_mismatch_names_tensor_and_both_dtypes)
{
    const int64_t shape[] = {128, 784};
    fsdp2_tensor_t *t = NULL;
    ASSERT_OK(fsdp2_tensor_empty(META, FSDP2_F32, 2, shape, &t));
    ASSERT_STATUS(fsdp2_tensor_check(t, "fc1.weight", FSDP2_BF16, 2, shape),
                  FSDP2_ERR_DTYPE_MISMATCH);
    ASSERT_MESSAGE_HAS("'fc1.weight'");
    ASSERT_MESSAGE_HAS("f32");
    ASSERT_MESSAGE_HAS("bf16");
    ASSERT_STATUS(fsdp2_tensor_check(NULL, "fc1.weight", FSDP2_F32, 2, shape),
                  FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_MESSAGE_HAS("fc1.weight");
    ASSERT_OK(fsdp2_tensor_check(t, NULL, FSDP2_F32, 2, shape));
    ASSERT_OK(fsdp2_tensor_release(t));
}
END_TEST

START_TEST(shape_format_writes_brackets_and_commas)
{
    char buf[256];
    const int64_t shape[] = {128, 784};
    ASSERT_OK(fsdp2_shape_format(2, shape, buf, sizeof(buf)));
    ck_assert_str_eq(buf, "[128,784]");
    ASSERT_OK(fsdp2_shape_format(0, NULL, buf, sizeof(buf)));
    ck_assert_str_eq(buf, "[]");
    const int64_t eight[] = {INT64_MIN, INT64_MAX, 0, 1, -1, 22, 333, 4444};
    ASSERT_OK(fsdp2_shape_format(8, eight, buf, sizeof(buf)));
    ck_assert_str_eq(buf,
                     "[-9223372036854775808,9223372036854775807,0,1,-1,22,333,4444]");
}
END_TEST

START_TEST(shape_format_truncates_safely_into_every_small_length)
{
    const int64_t shape[] = {128, 784, 5};
    const char *full = "[128,784,5]";
    const size_t full_len = strlen(full);
    for (size_t len = 1; len <= full_len + 3; len++) {
        char buf[64];
        memset(buf, 0x5a, sizeof(buf));
        ASSERT_OK(fsdp2_shape_format(3, shape, buf, len));
        size_t want = len - 1 < full_len ? len - 1 : full_len;
        ck_assert_msg(strlen(buf) == want && strncmp(buf, full, want) == 0,
                      "len %zu: wrote '%s', expected the first %zu bytes of '%s'", len, buf,
                      want, full);
        for (size_t i = len; i < sizeof(buf); i++)
            ck_assert_msg((unsigned char)buf[i] == 0x5a,
                          "len %zu: byte %zu past the buffer was written (%#x)", len, i,
                          (unsigned char)buf[i]);
    }
    char one[2] = {'x', 'x'};
    ASSERT_OK(fsdp2_shape_format(0, NULL, one, 1));
    ck_assert_int_eq(one[0], '\0');
    ck_assert_int_eq(one[1], 'x');
    ASSERT_STATUS(fsdp2_shape_format(3, shape, one, 0), FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(fsdp2_shape_format(3, shape, NULL, 8), FSDP2_ERR_INVALID_ARGUMENT);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Devices                                                                             */

START_TEST(device_parse_and_format_round_trip)
{
    const struct {
        const char *text;
        fsdp2_device_type_t type;
        int index;
        const char *formatted;
    } cases[] = {
        {"cpu", FSDP2_DEVICE_CPU, 0, "cpu"},       {"meta", FSDP2_DEVICE_META, 0, "meta"},
        {"cuda:3", FSDP2_DEVICE_CUDA, 3, "cuda:3"}, {"cuda", FSDP2_DEVICE_CUDA, 0, "cuda:0"},
        {"cuda:0", FSDP2_DEVICE_CUDA, 0, "cuda:0"}, {"cuda:63", FSDP2_DEVICE_CUDA, 63, "cuda:63"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fsdp2_device_t d = {FSDP2_DEVICE_META, -99};
        ASSERT_OK(fsdp2_device_parse(cases[i].text, &d));
        ck_assert_msg(d.type == cases[i].type && d.index == cases[i].index,
                      "'%s' parsed to type %d index %d, expected type %d index %d",
                      cases[i].text, (int)d.type, d.index, (int)cases[i].type, cases[i].index);
        char buf[FSDP2_DEVICE_NAME_MAX];
        ASSERT_OK(fsdp2_device_format(d, buf, sizeof(buf)));
        ck_assert_msg(strcmp(buf, cases[i].formatted) == 0, "'%s' formats as '%s', expected '%s'",
                      cases[i].text, buf, cases[i].formatted);
        fsdp2_device_t again;
        ASSERT_OK(fsdp2_device_parse(buf, &again));
        ck_assert(again.type == d.type && again.index == d.index);
    }
}
END_TEST

START_TEST(device_parse_rejects_malformed_names_and_names_them)
{
    const char *bad[] = {"cuda:", "cuda:x", "gpu", "", "CPU", "cuda:1x", "cuda:-1",
                         " cpu", "cpu ", "cuda:64", "cuda:99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fsdp2_device_t d;
        fsdp2_status_t s = fsdp2_device_parse(bad[i], &d);
        ck_assert_msg(s == FSDP2_ERR_INVALID_ARGUMENT, "fsdp2_device_parse('%s') = %s, expected "
                      "ERR_INVALID_ARGUMENT", bad[i], fsdp2_status_name(s));
        char quoted[64];
        snprintf(quoted, sizeof(quoted), "'%s'", bad[i]);
        ASSERT_MESSAGE_HAS(quoted);
    }
}
END_TEST

START_TEST(device_format_of_an_invalid_type_is_rejected)
{
    char buf[FSDP2_DEVICE_NAME_MAX];
    fsdp2_device_t d = {(fsdp2_device_type_t)7, 0};
    ASSERT_STATUS(fsdp2_device_format(d, buf, sizeof(buf)), FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_MESSAGE_HAS("7");
}
END_TEST

START_TEST(device_check_accepts_cpu_and_meta_and_reports_cuda_by_availability)
{
    ASSERT_OK(fsdp2_device_check(CPU));
    ASSERT_OK(fsdp2_device_check(META));
    int count = -1;
    ASSERT_OK(fsdp2_cuda_device_count(&count));
    ck_assert_int_ge(count, 0);
    fsdp2_device_t cuda0 = {FSDP2_DEVICE_CUDA, 0};
    if (count == 0) {
        ASSERT_STATUS(fsdp2_device_check(cuda0), FSDP2_ERR_NOT_AVAILABLE);
        ck_assert_msg(fsdp2_last_error()[0] != '\0', "cuda:0 not available, but no reason");
    } else {
        ASSERT_OK(fsdp2_device_check(cuda0));
    }
    if (count < 63) {
        fsdp2_device_t missing = {FSDP2_DEVICE_CUDA, 63};
        ASSERT_STATUS(fsdp2_device_check(missing), FSDP2_ERR_NOT_AVAILABLE);
        ck_assert_msg(fsdp2_last_error()[0] != '\0', "cuda:63 not available, but no reason");
    }
    fsdp2_device_t cpu1 = {FSDP2_DEVICE_CPU, 1};
    ASSERT_STATUS(fsdp2_device_check(cpu1), FSDP2_ERR_NOT_AVAILABLE);
}
END_TEST

START_TEST(tensor_on_unavailable_cuda_fails_without_allocating)
{
    int count = -1;
    ASSERT_OK(fsdp2_cuda_device_count(&count));
    if (count > 0)
        return; /* only meaningful where cuda:0 is missing */
    const int64_t shape[] = {4};
    fsdp2_device_t cuda0 = {FSDP2_DEVICE_CUDA, 0};
    fsdp2_tensor_t *t = (fsdp2_tensor_t *)&t;
    fsdp2_status_t s = fsdp2_tensor_empty(cuda0, FSDP2_F32, 1, shape, &t);
    ck_assert_msg(s != FSDP2_SUCCESS, "fsdp2_tensor_empty(cuda:0) succeeded with no GPU");
    ck_assert_ptr_null(t);
}
END_TEST

START_TEST(device_alloc_and_free_count_bytes_and_zero_bytes_gives_null)
{
    fsdp2_memory_stats_t before = cpu_stats();
    void *p = NULL;
    ASSERT_OK(fsdp2_device_alloc(CPU, 1000, &p));
    ck_assert_ptr_nonnull(p);
    ck_assert_msg(((uintptr_t)p & 63) == 0, "%p is not 64-byte aligned", p);
    ASSERT_ALLOCATED(before.allocated_bytes + 1000);
    ASSERT_OK(fsdp2_device_free(CPU, p));
    ASSERT_ALLOCATED(before.allocated_bytes);

    void *z = (void *)&z;
    ASSERT_OK(fsdp2_device_alloc(CPU, 0, &z));
    ck_assert_ptr_null(z);
    ASSERT_OK(fsdp2_device_free(CPU, NULL));
    ck_assert_uint_eq(cpu_stats().alloc_count, before.alloc_count + 1);

    ASSERT_STATUS(fsdp2_device_alloc(META, 16, &z), FSDP2_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(device_free_of_a_foreign_pointer_is_rejected_and_changes_nothing)
{
    void *mine = NULL;
    ASSERT_OK(fsdp2_device_alloc(CPU, 128, &mine));
    fsdp2_memory_stats_t before = cpu_stats();

    void *foreign = malloc(128);
    ck_assert_ptr_nonnull(foreign);
    ASSERT_STATUS(fsdp2_device_free(CPU, foreign), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(fsdp2_last_error()[0] != '\0', "no message for a foreign pointer");
    ASSERT_MESSAGE_HAS("cpu");
    int on_stack = 0;
    ASSERT_STATUS(fsdp2_device_free(CPU, &on_stack), FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(fsdp2_device_free(CPU, (char *)mine + 64), FSDP2_ERR_INVALID_ARGUMENT);

    fsdp2_memory_stats_t after = cpu_stats();
    ck_assert_uint_eq(after.allocated_bytes, before.allocated_bytes);
    ck_assert_uint_eq(after.free_count, before.free_count);
    memset(foreign, 1, 128); /* still ours, still valid */
    free(foreign);
    ASSERT_OK(fsdp2_device_free(CPU, mine));
}
END_TEST

START_TEST(device_free_twice_is_rejected_the_second_time)
{
    void *p = NULL;
    ASSERT_OK(fsdp2_device_alloc(CPU, 256, &p));
    ASSERT_OK(fsdp2_device_free(CPU, p));
    fsdp2_memory_stats_t before = cpu_stats();
    ASSERT_STATUS(fsdp2_device_free(CPU, p), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_uint_eq(cpu_stats().allocated_bytes, before.allocated_bytes);
    ck_assert_uint_eq(cpu_stats().free_count, before.free_count);
}
END_TEST

/* Freed allocations leave entries behind in the allocator's bookkeeping; a pointer that
 * was never allocated must still be rejected however many of those exist. Where they
 * land depends on the addresses malloc returns, so the test goes through many rounds
 * of different sizes to cover many layouts. */
START_TEST(device_free_of_small_bogus_pointers_is_rejected_after_many_frees)
{
    const uintptr_t bogus[] = {1, 2, 8, 64, 4096};
    uint64_t rng = 0x9e3779b97f4a7c15ull; /* xorshift64, fixed seed */
    for (int round = 0; round < 256; round++) {
        void *p[120];
        for (int i = 0; i < 120; i++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            ASSERT_OK(fsdp2_device_alloc(CPU, (size_t)(1 + rng % 4096), &p[i]));
        }
        for (int i = 0; i < 120; i++)
            ASSERT_OK(fsdp2_device_free(CPU, p[i]));
        fsdp2_memory_stats_t before = cpu_stats();
        for (size_t i = 0; i < sizeof(bogus) / sizeof(bogus[0]); i++) {
            fsdp2_status_t s = fsdp2_device_free(CPU, (void *)bogus[i]);
            ck_assert_msg(s == FSDP2_ERR_INVALID_ARGUMENT,
                          "round %d: fsdp2_device_free(cpu, %#lx) = %s, expected "
                          "ERR_INVALID_ARGUMENT",
                          round, (unsigned long)bogus[i], fsdp2_status_name(s));
        }
        fsdp2_memory_stats_t after = cpu_stats();
        ck_assert_uint_eq(after.allocated_bytes, before.allocated_bytes);
        ck_assert_uint_eq(after.free_count, before.free_count);
    }
}
END_TEST

START_TEST(device_free_on_meta_is_rejected)
{
    int x;
    ASSERT_STATUS(fsdp2_device_free(META, &x), FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_MESSAGE_HAS("meta");
}
END_TEST

static TCase *tcase_new(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    return tc;
}

START_TEST(shape_arguments_out_of_range_are_errors_not_crashes)
{
    char buf[64];
    ck_assert_int_eq(fsdp2_shape_format(2, NULL, buf, sizeof(buf)), FSDP2_ERR_INVALID_ARGUMENT);
    const int64_t one[1] = {3};
    ck_assert_int_eq(fsdp2_shape_format(100, one, buf, sizeof(buf)), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "100"));
    fsdp2_tensor_t *t;
    fsdp2_device_t cpu = {FSDP2_DEVICE_CPU, 0};
    ck_assert_int_eq(fsdp2_tensor_empty(cpu, FSDP2_F32, 1, one, &t), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_tensor_check(t, "w", FSDP2_F32, 3, NULL), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_tensor_check(t, "w", FSDP2_F32, 100, one), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "100"));
    fsdp2_tensor_release(t);
}
END_TEST

static Suite *tensor_suite(void)
{
    Suite *s = suite_create("tensor");

    TCase *alloc = tcase_new("alloc");
    tcase_add_test(alloc, empty_allocates_exactly_nbytes_and_release_returns_them_for_every_dtype);
    tcase_add_test(alloc, shape_arguments_out_of_range_are_errors_not_crashes);
    tcase_add_test(alloc, zeros_fills_every_byte_with_zero_for_every_dtype);
    tcase_add_test(alloc, peak_tracks_the_most_bytes_live_at_once_and_reset_lowers_it);
    tcase_add_test(alloc, an_allocation_past_the_cpu_memory_limit_is_refused_and_counts_nothing);
    tcase_add_test(alloc, empty_rejects_unknown_dtype);
    suite_add_tcase(s, alloc);

    TCase *shapes = tcase_new("shapes");
    tcase_add_test(shapes, meta_tensors_allocate_nothing_and_have_no_data);
    tcase_add_test(shapes, meta_tensor_computes_bytes_too_large_to_allocate);
    tcase_add_test(shapes, zero_dim_tensor_is_a_scalar_of_one_element);
    tcase_add_test(shapes, zero_sized_dim_has_no_elements_no_data_and_no_allocation);
    tcase_add_test(shapes, eight_dims_are_accepted_and_nine_are_rejected);
    tcase_add_test(shapes, negative_dim_is_rejected_with_a_message_naming_the_shape);
    tcase_add_test(shapes, numel_overflow_of_int64_is_an_overflow_error);
    tcase_add_test(shapes, byte_overflow_of_size_t_is_an_overflow_error);
    suite_add_tcase(s, shapes);

    TCase *views = tcase_new("views");
    tcase_add_test(views, narrow_of_middle_rows_points_at_the_right_offset_and_allocates_nothing);
    tcase_add_test(views, narrow_view_shares_memory_with_its_parent);
    tcase_add_test(views, narrow_of_a_narrow_composes_the_offsets);
    tcase_add_test(views, narrow_of_length_zero_is_allowed_at_every_start_including_the_end);
    tcase_add_test(views, narrow_out_of_range_is_rejected_naming_the_range_and_the_size);
    tcase_add_test(views, narrow_of_a_zero_dim_tensor_is_rejected);
    tcase_add_test(views, narrow_of_a_meta_tensor_is_a_meta_view_without_data);
    tcase_add_test(views, reshape_infers_minus_one_and_shares_memory);
    tcase_add_test(views, reshape_of_a_narrow_view_keeps_the_view_offset);
    tcase_add_test(views, reshape_with_another_numel_is_a_shape_mismatch_naming_both_shapes);
    tcase_add_test(views, reshape_rejects_two_minus_ones_and_an_uninferable_minus_one);
    tcase_add_test(views, storage_outlives_the_parent_while_a_view_exists);
    tcase_add_test(views, retain_gives_a_second_handle_on_the_same_view);
    tcase_add_test(views, release_of_null_succeeds);
    suite_add_tcase(s, views);

    TCase *blob = tcase_new("from_blob");
    tcase_add_test(blob, from_blob_calls_the_deleter_once_after_the_last_view_with_the_user_pointer);
    tcase_add_test(blob, from_blob_without_deleter_leaves_the_memory_to_the_caller);
    tcase_add_test(blob,
                   from_blob_rejects_meta_null_data_and_bad_shapes_without_calling_the_deleter);
    suite_add_tcase(s, blob);

    TCase *check = tcase_new("check_and_format");
    tcase_add_test(check, tensor_check_shape_mismatch_message_is_exact);
    tcase_add_test(check, tensor_check_dtype_mismatch_names_tensor_and_both_dtypes);
    tcase_add_test(check, shape_format_writes_brackets_and_commas);
    tcase_add_test(check, shape_format_truncates_safely_into_every_small_length);
    suite_add_tcase(s, check);

    TCase *device = tcase_new("device");
    tcase_add_test(device, device_parse_and_format_round_trip);
    tcase_add_test(device, device_parse_rejects_malformed_names_and_names_them);
    tcase_add_test(device, device_format_of_an_invalid_type_is_rejected);
    tcase_add_test(device, device_check_accepts_cpu_and_meta_and_reports_cuda_by_availability);
    tcase_add_test(device, tensor_on_unavailable_cuda_fails_without_allocating);
    tcase_add_test(device, device_alloc_and_free_count_bytes_and_zero_bytes_gives_null);
    tcase_add_test(device, device_free_of_a_foreign_pointer_is_rejected_and_changes_nothing);
    tcase_add_test(device, device_free_twice_is_rejected_the_second_time);
    tcase_add_test(device, device_free_of_small_bogus_pointers_is_rejected_after_many_frees);
    tcase_add_test(device, device_free_on_meta_is_rejected);
    suite_add_tcase(s, device);

    return s;
}

FSDP2_CHECK_MAIN(tensor_suite)
