/* The CUDA kernels' element code (lib/cuda/cuda_convert.h), run on the host, gives the
 * same bytes as the cpu backend for every conversion and accumulation.
 *
 * The kernels call exactly these functions with constant dtypes, so this proves the
 * rounding, NaN and saturation logic of the GPU path on a machine without a GPU; what
 * is left to the device test (test_cuda_runtime) is the device compiler and the
 * launches. Sources: every bf16/f16/u8 pattern, every f32 pattern whose low 16 bits are
 * one of a set of rounding-sensitive values (all 2^32 with FSDP2_TEST_EXHAUSTIVE=1),
 * f64 patterns around every rounding position, integer edges, and random bits.
 *
 * A standalone program: exit 0 on success, 1 on failure. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

#include "cuda/cuda_convert.h"

static int failures;

#define ASSERT_OK(call)                                                                   \
    do {                                                                                  \
        fsdp2_status_t s_ = (call);                                                       \
        if (s_ != FSDP2_SUCCESS) {                                                        \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call,    \
                    fsdp2_status_name(s_), fsdp2_last_error());                           \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static size_t dsize(fsdp2_dtype_t t)
{
    size_t b = 0;
    fsdp2_dtype_size(t, &b);
    return b;
}

static uint64_t elem_bits(const void *p, fsdp2_dtype_t t, size_t i)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)p + i * dsize(t), dsize(t));
    return v;
}

/* Converts n elements of src both ways and compares the bytes. */
static void check_convert(fsdp2_dtype_t dt, fsdp2_dtype_t st, const void *src, size_t n,
                          const char *what)
{
    size_t db = dsize(dt);
    unsigned char *want = malloc(n * db), *got = malloc(n * db);
    if (!want || !got) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(want, 0xab, n * db);
    memset(got, 0xab, n * db);
    ASSERT_OK(fsdp2_convert(want, dt, src, st, n));
    for (size_t i = 0; i < n; i++)
        fsdp2_cu_convert_elem(dt, got, i, st, src, i);
    if (memcmp(want, got, n * db) != 0) {
        int shown = 0;
        for (size_t i = 0; i < n && shown < 8; i++) {
            if (memcmp(want + i * db, got + i * db, db) == 0)
                continue;
            fprintf(stderr,
                    "convert %s -> %s (%s): element %zu src 0x%" PRIx64 ": cpu 0x%" PRIx64
                    " cuda 0x%" PRIx64 "\n",
                    fsdp2_dtype_name(st), fsdp2_dtype_name(dt), what, i, elem_bits(src, st, i),
                    elem_bits(want, dt, i), elem_bits(got, dt, i));
            shown++;
        }
        failures++;
    }
    free(want);
    free(got);
}

static void check_all_targets(fsdp2_dtype_t st, const void *src, size_t n, const char *what)
{
    for (int d = 0; d < FSDP2_DTYPE_COUNT; d++)
        check_convert((fsdp2_dtype_t)d, st, src, n, what);
}

static void test_convert_16bit_sources_all_patterns(void)
{
    uint16_t *src = malloc(65536 * sizeof *src);
    for (uint32_t i = 0; i < 65536; i++)
        src[i] = (uint16_t)i;
    check_all_targets(FSDP2_BF16, src, 65536, "all patterns");
    check_all_targets(FSDP2_F16, src, 65536, "all patterns");
    free(src);
    uint8_t u8[256];
    for (int i = 0; i < 256; i++)
        u8[i] = (uint8_t)i;
    check_all_targets(FSDP2_U8, u8, 256, "all values");
}

/* Low halves that put an f32 at, just below and just above the rounding points of bf16
 * (bit 15) and f16 (bit 12, and higher bits for f16 subnormals, which vary the high
 * half). */
static const uint32_t f32_low_patterns[] = {
    0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x0fff, 0x1000, 0x1001, 0x1fff,
    0x2000, 0x2001, 0x3000, 0x2fff, 0x3001, 0x4000, 0x5000, 0x6000, 0x7000, 0x9000,
    0xc000, 0xe000, 0xf000, 0x4321,
};

static void test_convert_f32_sources(void)
{
    const size_t lows = sizeof f32_low_patterns / sizeof f32_low_patterns[0];
    size_t n = 65536 * lows;
    uint32_t *src = malloc(n * sizeof *src);
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (size_t k = 0; k < lows; k++)
            src[hi * lows + k] = (hi << 16) | f32_low_patterns[k];
    check_all_targets(FSDP2_F32, src, n, "rounding-sensitive patterns");
    for (size_t i = 0; i < n; i++)
        src[i] = (uint32_t)rng_next();
    check_all_targets(FSDP2_F32, src, n, "random patterns");
    free(src);

    const char *env = getenv("FSDP2_TEST_EXHAUSTIVE");
    if (env && strcmp(env, "1") == 0) {
        const size_t chunk = (size_t)1 << 24;
        uint32_t *all = malloc(chunk * sizeof *all);
        for (uint64_t base = 0; base < ((uint64_t)1 << 32); base += chunk) {
            for (size_t i = 0; i < chunk; i++)
                all[i] = (uint32_t)(base + i);
            check_convert(FSDP2_BF16, FSDP2_F32, all, chunk, "exhaustive");
            check_convert(FSDP2_F16, FSDP2_F32, all, chunk, "exhaustive");
            check_convert(FSDP2_I32, FSDP2_F32, all, chunk, "exhaustive");
            check_convert(FSDP2_F64, FSDP2_F32, all, chunk, "exhaustive");
        }
        free(all);
        printf("exhaustive f32 -> bf16/f16/i32/f64: done\n");
    }
}

/* Every top-16-bit pattern (sign, exponent, 4 fraction bits) with low 48 bits at and
 * around each power of two: covers the rounding point of bf16 (bit 44), f16 (bit 41)
 * and every subnormal shift, halfway ties, sticky bits and NaN payloads. */
static void test_convert_f64_sources(void)
{
    uint64_t lows[3 * 48 + 3];
    size_t nl = 0;
    lows[nl++] = 0;
    lows[nl++] = 1;
    lows[nl++] = (UINT64_C(1) << 48) - 1;
    for (int k = 1; k < 48; k++) {
        lows[nl++] = UINT64_C(1) << k;
        lows[nl++] = (UINT64_C(1) << k) - 1;
        lows[nl++] = (UINT64_C(1) << k) + 1;
    }
    size_t n = 65536 * nl;
    uint64_t *src = malloc(n * sizeof *src);
    for (uint64_t hi = 0; hi < 65536; hi++)
        for (size_t k = 0; k < nl; k++)
            src[hi * nl + k] = (hi << 48) | lows[k];
    check_all_targets(FSDP2_F64, src, n, "rounding-sensitive patterns");
    for (size_t i = 0; i < n; i++)
        src[i] = rng_next();
    check_all_targets(FSDP2_F64, src, n, "random patterns");
    /* Finite values of every magnitude an integer conversion could see. */
    for (size_t i = 0; i < n; i++) {
        double mag = ldexp(1.0 + (double)(rng_next() >> 11) * 0x1p-53, (int)(rng_next() % 140) - 70);
        double v = (rng_next() & 1) ? -mag : mag;
        memcpy(&src[i], &v, sizeof v);
    }
    check_all_targets(FSDP2_F64, src, n, "random finite values");
    free(src);
}

static void test_convert_integer_sources(void)
{
    size_t n = 1 << 20;
    int64_t *s64 = malloc(n * sizeof *s64);
    int32_t *s32 = malloc(n * sizeof *s32);
    size_t k = 0;
    for (int b = 0; b < 63; b++) {
        int64_t p = (int64_t)1 << b;
        int64_t around[] = {p, p - 1, p + 1, -p, -p + 1, -p - 1};
        for (size_t j = 0; j < 6; j++)
            s64[k++] = around[j];
    }
    s64[k++] = INT64_MAX;
    s64[k++] = INT64_MIN;
    s64[k++] = INT64_MIN + 1;
    s64[k++] = 0;
    /* Ties of bf16/f16 rounding beyond 2^53, where a plain (double) would round twice. */
    for (int b = 54; b < 63; b++) {
        for (int keep = 8; keep <= 11; keep++) {
            int64_t base = (int64_t)1 << b;
            int64_t tie = (int64_t)1 << (b - keep);
            s64[k++] = base + tie;
            s64[k++] = base + tie + 1;
            s64[k++] = base + 3 * tie;
            s64[k++] = -(base + tie + 1);
        }
    }
    for (; k < n; k++) {
        int bits = (int)(rng_next() % 64);
        uint64_t r = rng_next();
        s64[k] = bits == 0 ? 0 : (int64_t)(r >> (64 - bits)) * ((rng_next() & 1) ? -1 : 1);
    }
    check_all_targets(FSDP2_I64, s64, n, "edges and random");
    for (size_t i = 0; i < n; i++)
        s32[i] = (int32_t)s64[i];
    s32[0] = INT32_MAX;
    s32[1] = INT32_MIN;
    s32[2] = 16777217; /* 2^24 + 1: f32 tie */
    s32[3] = -16777219;
    check_all_targets(FSDP2_I32, s32, n, "edges and random");
    free(s64);
    free(s32);
}

static void random_bits(void *p, fsdp2_dtype_t t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next();
        memcpy((char *)p + i * dsize(t), &r, dsize(t));
    }
}

static int is_nan(const void *p, fsdp2_dtype_t t, size_t i)
{
    return isnan(fsdp2_cu_load_f64(t, p, i));
}

/* y += alpha * x on the cpu backend and with the kernel's element code, random bit
 * patterns (subnormals, infinities and NaNs included). Where the result is NaN only
 * NaN-ness is compared: the payload of a NaN made by arithmetic is the hardware's
 * (x86 propagates an operand's, a GPU makes a canonical one). */
static void test_accumulate_all_float_pairs(void)
{
    const fsdp2_dtype_t floats[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16};
    const double alphas[] = {1.0, -0.37, 3.0e-3, 65504.0, 1e-300};
    const size_t n = 1 << 16;
    fsdp2_stream_t *cpu;
    fsdp2_device_t dev = FSDP2_DEVICE_CPU_INIT;
    ASSERT_OK(fsdp2_stream_current(dev, &cpu));
    void *x = malloc(n * 8), *y0 = malloc(n * 8), *want = malloc(n * 8), *got = malloc(n * 8);
    for (size_t a = 0; a < sizeof alphas / sizeof alphas[0]; a++) {
        for (size_t yi = 0; yi < 4; yi++) {
            for (size_t xi = 0; xi < 4; xi++) {
                fsdp2_dtype_t yt = floats[yi], xt = floats[xi];
                random_bits(x, xt, n);
                random_bits(y0, yt, n);
                memcpy(want, y0, n * dsize(yt));
                memcpy(got, y0, n * dsize(yt));
                ASSERT_OK(fsdp2_accumulate_async(want, yt, x, xt, n, alphas[a], cpu));
                ASSERT_OK(fsdp2_stream_synchronize(cpu));
                float a32 = fsdp2_cu_f64_to_f32(alphas[a]);
                for (size_t i = 0; i < n; i++)
                    fsdp2_cu_accumulate_elem(yt, got, xt, x, i, a32, alphas[a]);
                int shown = 0;
                for (size_t i = 0; i < n; i++) {
                    int both_nan = is_nan(want, yt, i) && is_nan(got, yt, i);
                    if (both_nan || elem_bits(want, yt, i) == elem_bits(got, yt, i))
                        continue;
                    if (shown++ < 8)
                        fprintf(stderr,
                                "accumulate %s += %g * %s: element %zu y 0x%" PRIx64
                                " x 0x%" PRIx64 ": cpu 0x%" PRIx64 " cuda 0x%" PRIx64 "\n",
                                fsdp2_dtype_name(yt), alphas[a], fsdp2_dtype_name(xt), i,
                                elem_bits(y0, yt, i), elem_bits(x, xt, i),
                                elem_bits(want, yt, i), elem_bits(got, yt, i));
                }
                if (shown)
                    failures++;
            }
        }
    }
    free(x);
    free(y0);
    free(want);
    free(got);
}

/* fill converts its double once, with the same rules. */
static void test_fill_value_conversion(void)
{
    const double values[] = {0.0, -0.0, 1.0, -2.5, 3.14159, 1e10, -1e10, 300.7, 255.5, -1.5,
                             65520.0, 65519.99, 1e-8, 5.960464477539063e-08, 1e-40,
                             9.3e18, -9.3e18, 2147483647.5, NAN, -NAN, INFINITY, -INFINITY};
    fsdp2_stream_t *cpu;
    fsdp2_device_t dev = FSDP2_DEVICE_CPU_INIT;
    ASSERT_OK(fsdp2_stream_current(dev, &cpu));
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
        for (int d = 0; d < FSDP2_DTYPE_COUNT; d++) {
            uint64_t want = 0, got = 0;
            ASSERT_OK(fsdp2_fill_async(&want, (fsdp2_dtype_t)d, 1, values[v], cpu));
            fsdp2_cu_store_f64((fsdp2_dtype_t)d, &got, 0, values[v]);
            if (want != got) {
                fprintf(stderr, "fill %s with %g: cpu 0x%" PRIx64 " cuda 0x%" PRIx64 "\n",
                        fsdp2_dtype_name((fsdp2_dtype_t)d), values[v], want, got);
                failures++;
            }
        }
    }
}

int main(void)
{
    test_convert_16bit_sources_all_patterns();
    test_convert_f32_sources();
    test_convert_f64_sources();
    test_convert_integer_sources();
    test_accumulate_all_float_pairs();
    test_fill_value_conversion();
    if (failures) {
        fprintf(stderr, "test_cuda_convert: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_cuda_convert: all conversions and accumulations match the cpu backend\n");
    return 0;
}
