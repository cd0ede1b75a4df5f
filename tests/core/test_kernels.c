/* Kernels on cpu streams against naive per-element references: fill, cast, strided
 * chunk copy with cast, accumulate in every float dtype pair; argument errors. The
 * scalar conversions themselves are proven in test_dtype.c; here the references use
 * them one element at a time, so what is checked is indexing, strides, dtype dispatch
 * and the arithmetic (f32 for 16/32-bit pairs, f64 otherwise, one rounding). */
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

#define OK(call) ck_assert_msg((call) == FSDP2_SUCCESS, "%s failed: %s", #call, fsdp2_last_error())

static const fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
static const fsdp2_dtype_t all_dtypes[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16,
                                           FSDP2_I32, FSDP2_I64, FSDP2_U8};
static const fsdp2_dtype_t float_dtypes[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static size_t esize(fsdp2_dtype_t t)
{
    size_t b = 0;
    fsdp2_dtype_size(t, &b);
    return b;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random non-zero values in [-100, 100] written in dtype t. */
static void random_fill(void *p, fsdp2_dtype_t t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double v = ((double)(rng() % 20001) - 10000.0) / 100.0;
        if (v == 0)
            v = 0.25;
        fsdp2_convert((char *)p + i * esize(t), t, &v, FSDP2_F64, 1);
    }
}

static double element(const void *p, fsdp2_dtype_t t, size_t i)
{
    double v;
    fsdp2_convert(&v, FSDP2_F64, (const char *)p + i * esize(t), t, 1);
    return v;
}

START_TEST(fill_writes_the_converted_value_everywhere_and_nothing_past_n)
{
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "fill", &s));
    /* values whose element is one repeated byte in some dtypes (written by memset) and
     * not in others: 0 in all, -0.0 in the integers, 0x01010101 in i32, 3.75 in u8 only */
    const double values[] = {3.75, 0.0, -0.0, 16843009.0};
    for (size_t k = 0; k < COUNT(all_dtypes) * COUNT(values); k++) {
        fsdp2_dtype_t t = all_dtypes[k % COUNT(all_dtypes)];
        double v = values[k / COUNT(all_dtypes)];
        unsigned char buf[8 * 101];
        memset(buf, 0xab, sizeof(buf));
        OK(fsdp2_fill_async(buf, t, 100, v, s));
        OK(fsdp2_stream_synchronize(s));
        unsigned char want[8];
        fsdp2_convert(want, t, &v, FSDP2_F64, 1);
        for (size_t i = 0; i < 100; i++)
            ck_assert_msg(memcmp(buf + i * esize(t), want, esize(t)) == 0,
                          "%s element %zu of a fill with %g", fsdp2_dtype_name(t), i, v);
        for (size_t i = 100 * esize(t); i < 101 * esize(t); i++)
            ck_assert_int_eq(buf[i], 0xab);
    }
    OK(fsdp2_stream_destroy(s));
}
END_TEST

START_TEST(cast_matches_elementwise_conversion_for_every_dtype_pair)
{
    enum { N = 1000 };
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "cast", &s));
    static unsigned char src[8 * N], dst[8 * N + 8], want[8];
    for (size_t a = 0; a < COUNT(all_dtypes); a++) {
        for (size_t b = 0; b < COUNT(all_dtypes); b++) {
            fsdp2_dtype_t st = all_dtypes[a], dt = all_dtypes[b];
            random_fill(src, st, N);
            memset(dst, 0xab, sizeof(dst));
            OK(fsdp2_cast_async(dst, dt, src, st, N, s));
            OK(fsdp2_stream_synchronize(s));
            for (size_t i = 0; i < N; i++) {
                fsdp2_convert(want, dt, src + i * esize(st), st, 1);
                ck_assert_msg(memcmp(dst + i * esize(dt), want, esize(dt)) == 0,
                              "%s -> %s element %zu", fsdp2_dtype_name(st), fsdp2_dtype_name(dt), i);
            }
            ck_assert_int_eq(dst[N * esize(dt)], 0xab);
        }
    }
    OK(fsdp2_stream_destroy(s));
}
END_TEST

/* FSDP's copy-in shape: rows of a parameter shard placed at a stride inside a padded
 * all-gather buffer, with a cast; cells between rows stay untouched. */
START_TEST(chunk_copy_places_strided_rows_with_cast_and_leaves_gaps_untouched)
{
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "chunk", &s));
    const size_t shapes[][4] = {/* rows, cols, src_stride, dst_stride */
                                {7, 13, 13, 16}, {5, 1, 3, 1}, {1, 9, 9, 9}, {13, 7, 20, 7},
                                {3, 64, 64, 128}};
    for (size_t k = 0; k < COUNT(shapes); k++) {
        size_t rows = shapes[k][0], cols = shapes[k][1], ss = shapes[k][2], ds = shapes[k][3];
        for (size_t a = 0; a < COUNT(all_dtypes); a++) {
            for (size_t b = 0; b < COUNT(all_dtypes); b++) {
                fsdp2_dtype_t st = all_dtypes[a], dt = all_dtypes[b];
                size_t sbytes = rows * ss * esize(st), dbytes = rows * ds * esize(dt);
                unsigned char *src = malloc(sbytes), *dst = malloc(dbytes), want[8];
                random_fill(src, st, rows * ss);
                memset(dst, 0xab, dbytes);
                fsdp2_chunk_copy_t c = {dst, dt, ds, src, st, ss, rows, cols};
                OK(fsdp2_chunk_copy_async(&c, s));
                OK(fsdp2_stream_synchronize(s));
                for (size_t r = 0; r < rows; r++) {
                    for (size_t col = 0; col < ds; col++) {
                        unsigned char *got = dst + (r * ds + col) * esize(dt);
                        if (col < cols) {
                            fsdp2_convert(want, dt, src + (r * ss + col) * esize(st), st, 1);
                            ck_assert_msg(memcmp(got, want, esize(dt)) == 0,
                                          "%s -> %s row %zu col %zu", fsdp2_dtype_name(st),
                                          fsdp2_dtype_name(dt), r, col);
                        } else {
                            for (size_t z = 0; z < esize(dt); z++)
                                ck_assert_int_eq(got[z], 0xab);
                        }
                    }
                }
                free(src);
                free(dst);
            }
        }
    }
    OK(fsdp2_stream_destroy(s));
}
END_TEST

static int is_f32_class(fsdp2_dtype_t t)
{
    return t != FSDP2_F64;
}

START_TEST(accumulate_matches_reference_arithmetic_for_every_float_pair)
{
    enum { N = 777 };
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "acc", &s));
    static unsigned char y[8 * N], y0[8 * N], x[8 * N], want[8];
    const double alphas[] = {1.0, -0.5, 1.0 / 3.0};
    for (size_t ai = 0; ai < COUNT(alphas); ai++) {
        double alpha = alphas[ai];
        for (size_t a = 0; a < COUNT(float_dtypes); a++) {
            for (size_t b = 0; b < COUNT(float_dtypes); b++) {
                fsdp2_dtype_t yt = float_dtypes[a], xt = float_dtypes[b];
                random_fill(y0, yt, N);
                random_fill(x, xt, N);
                memcpy(y, y0, sizeof(y));
                OK(fsdp2_accumulate_async(y, yt, x, xt, N, alpha, s));
                OK(fsdp2_stream_synchronize(s));
                for (size_t i = 0; i < N; i++) {
                    double yv = element(y0, yt, i), xv = element(x, xt, i);
                    if (is_f32_class(yt) && is_f32_class(xt)) {
                        volatile float prod = (float)alpha * (float)xv; /* no fused multiply-add */
                        float r = (float)yv + prod;
                        fsdp2_convert(want, yt, &r, FSDP2_F32, 1);
                    } else {
                        volatile double prod = alpha * xv;
                        double r = yv + prod;
                        fsdp2_convert(want, yt, &r, FSDP2_F64, 1);
                    }
                    ck_assert_msg(memcmp(y + i * esize(yt), want, esize(yt)) == 0,
                                  "%s += %g * %s element %zu: got %.9g want %.9g",
                                  fsdp2_dtype_name(yt), alpha, fsdp2_dtype_name(xt), i,
                                  element(y, yt, i), element(want, yt, 0));
                }
            }
        }
    }
    /* axpy is accumulate with one dtype: a closed form check in f64 */
    double yy[5] = {1, 2, 3, 4, 5}, xx[5] = {10, 20, 30, 40, 50};
    OK(fsdp2_axpy_async(yy, xx, FSDP2_F64, 5, 0.5, s));
    OK(fsdp2_stream_synchronize(s));
    for (int i = 0; i < 5; i++)
        ck_assert_double_eq(yy[i], (i + 1) * 6.0);
    OK(fsdp2_stream_destroy(s));
}
END_TEST

START_TEST(bad_kernel_arguments_are_rejected_when_enqueued)
{
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "bad", &s));
    float a[64], b[64];
    int32_t i32[4] = {0};
    ck_assert_int_eq(fsdp2_fill_async(a, (fsdp2_dtype_t)42, 4, 0, s), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "42"));
    ck_assert_int_eq(fsdp2_fill_async(NULL, FSDP2_F32, 4, 0, s), FSDP2_ERR_INVALID_ARGUMENT);
    OK(fsdp2_fill_async(NULL, FSDP2_F32, 0, 0, s)); /* n == 0 is a no-op */
    ck_assert_int_eq(fsdp2_accumulate_async(i32, FSDP2_I32, a, FSDP2_F32, 4, 1, s),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "i32"));
    fsdp2_chunk_copy_t narrow = {b, FSDP2_F32, 4, a, FSDP2_F32, 8, 2, 5};
    ck_assert_int_eq(fsdp2_chunk_copy_async(&narrow, s), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "stride"));
    fsdp2_chunk_copy_t overlap = {a + 4, FSDP2_F32, 8, a, FSDP2_F32, 8, 2, 8};
    ck_assert_int_eq(fsdp2_chunk_copy_async(&overlap, s), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "overlaps"));
    fsdp2_chunk_copy_t huge = {b, FSDP2_F32, SIZE_MAX / 2, a, FSDP2_F32, 8, 4, 1};
    ck_assert_int_eq(fsdp2_chunk_copy_async(&huge, s), FSDP2_ERR_OVERFLOW);
    ck_assert_int_eq(fsdp2_accumulate_async(a + 1, FSDP2_F32, a, FSDP2_F32, 8, 1, s),
                     FSDP2_ERR_INVALID_ARGUMENT); /* partial overlap: order-dependent */
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "overlaps"));
    ck_assert_int_eq(fsdp2_accumulate_async(a, FSDP2_F32, a, FSDP2_BF16, 8, 1, s),
                     FSDP2_ERR_INVALID_ARGUMENT); /* same address, other dtype */
    for (int i = 0; i < 8; i++)
        a[i] = (float)i;
    OK(fsdp2_accumulate_async(a, FSDP2_F32, a, FSDP2_F32, 8, 1, s)); /* y == x: y = 2y */
    OK(fsdp2_stream_synchronize(s));
    ck_assert_float_eq(a[7], 14.0f);
    ck_assert_int_eq(fsdp2_cast_async(b, FSDP2_F32, a, FSDP2_F32, 4, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    OK(fsdp2_stream_synchronize(s)); /* nothing bad was enqueued */
    OK(fsdp2_stream_destroy(s));
}
END_TEST

START_TEST(tensor_sized_kernels_on_allocator_memory_are_exact)
{
    /* A larger run through the counted allocator: zeros, then cast f32 -> bf16 -> f32
     * equals fsdp2_bf16_to_f32(fsdp2_f32_to_bf16(x)) for every element. */
    const int64_t shape[2] = {1000, 257};
    fsdp2_tensor_t *x, *h, *back;
    OK(fsdp2_tensor_empty(cpu, FSDP2_F32, 2, shape, &x));
    OK(fsdp2_tensor_zeros(cpu, FSDP2_BF16, 2, shape, &h));
    OK(fsdp2_tensor_empty(cpu, FSDP2_F32, 2, shape, &back));
    float *xd = x->data;
    for (int64_t i = 0; i < x->numel; i++)
        xd[i] = (float)sin((double)i) * 1000.0f;
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "round-trip", &s));
    OK(fsdp2_cast_async(h->data, FSDP2_BF16, x->data, FSDP2_F32, (size_t)x->numel, s));
    OK(fsdp2_cast_async(back->data, FSDP2_F32, h->data, FSDP2_BF16, (size_t)x->numel, s));
    OK(fsdp2_stream_synchronize(s));
    const float *bd = back->data;
    for (int64_t i = 0; i < x->numel; i++)
        ck_assert_float_eq(bd[i], fsdp2_bf16_to_f32(fsdp2_f32_to_bf16(xd[i])));
    OK(fsdp2_stream_destroy(s));
    OK(fsdp2_tensor_release(x));
    OK(fsdp2_tensor_release(h));
    OK(fsdp2_tensor_release(back));
}
END_TEST

static Suite *kernels_suite(void)
{
    Suite *suite = suite_create("kernels");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fill_writes_the_converted_value_everywhere_and_nothing_past_n);
    tcase_add_test(tc, cast_matches_elementwise_conversion_for_every_dtype_pair);
    tcase_add_test(tc, chunk_copy_places_strided_rows_with_cast_and_leaves_gaps_untouched);
    tcase_add_test(tc, accumulate_matches_reference_arithmetic_for_every_float_pair);
    tcase_add_test(tc, bad_kernel_arguments_are_rejected_when_enqueued);
    tcase_add_test(tc, tensor_sized_kernels_on_allocator_memory_are_exact);
    suite_add_tcase(suite, tc);
    return suite;
}

FSDP2_CHECK_MAIN(kernels_suite)
