/* What the GPU test programs share: failure counting and assertions that print the
 * status and fsdp2_last_error(), a seeded random generator, random non-zero values of
 * any dtype, element comparisons, and copies to and from a device that wait. Standalone
 * programs (no Check): a test function returns at its first failed assertion. */
#ifndef FSDP2_TESTS_GPU_CHECK_H
#define FSDP2_TESTS_GPU_CHECK_H

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp2/fsdp2.h>

static int failures; /* assertions failed so far */

#define FAIL(...)                                              \
    do {                                                       \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);        \
        fprintf(stderr, __VA_ARGS__);                          \
        fputc('\n', stderr);                                   \
        failures++;                                            \
    } while (0)

#define ASSERT_STATUS(call, want)                                                       \
    do {                                                                                \
        fsdp2_status_t got_ = (call);                                                   \
        if (got_ != (want)) {                                                           \
            FAIL("%s: expected %s, got %s (%s)", #call, fsdp2_status_name(want),        \
                 fsdp2_status_name(got_), fsdp2_last_error());                          \
            return;                                                                     \
        }                                                                               \
    } while (0)

#define ASSERT_OK(call) ASSERT_STATUS(call, FSDP2_SUCCESS)

#define ASSERT_EQ_U64(a, b)                                                              \
    do {                                                                                 \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);   \
        if (a_ != b_) {                                                                  \
            FAIL("%s == %s: %llu != %llu", #a, #b, a_, b_);                              \
            return;                                                                      \
        }                                                                                \
    } while (0)

#define ASSERT_TRUE(cond, ...)                                                    \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: %s is false: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
            failures++;                                                           \
            return;                                                               \
        }                                                                         \
    } while (0)

/* ---- helpers ------------------------------------------------------------------- */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static inline uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static inline size_t dsize(fsdp2_dtype_t t)
{
    size_t b = 0;
    fsdp2_dtype_size(t, &b);
    return b;
}

static inline int dtype_is_float(fsdp2_dtype_t t)
{
    int f = 0;
    fsdp2_dtype_is_float(t, &f);
    return f;
}

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* n random elements of dtype t, none zero. Float magnitudes span 2^-max_exp ..
 * 2^max_exp (30 reaches f16 subnormals and overflow, u8/i32 saturation); integers
 * every bit length of their type. */
static inline void random_values(void *p, fsdp2_dtype_t t, size_t n, int max_exp)
{
    double one = 1.0;
    for (size_t i = 0; i < n; i++) {
        void *elem = (char *)p + i * dsize(t);
        if (dtype_is_float(t)) {
            double mag = ldexp(1.0 + (double)(rng_next() >> 11) * 0x1p-53,
                               (int)(rng_next() % (uint64_t)(2 * max_exp + 1)) - max_exp);
            double v = (rng_next() & 1) ? -mag : mag;
            fsdp2_convert(elem, t, &v, FSDP2_F64, 1);
        } else {
            int bits = 1 + (int)(rng_next() % (t == FSDP2_U8 ? 8 : t == FSDP2_I32 ? 31 : 63));
            int64_t v = (int64_t)(rng_next() >> (64 - bits));
            if (t != FSDP2_U8 && (rng_next() & 1))
                v = -v;
            fsdp2_convert(elem, t, &v, FSDP2_I64, 1);
        }
        double back = 0;
        fsdp2_convert(&back, FSDP2_F64, elem, t, 1);
        if (back == 0)
            fsdp2_convert(elem, t, &one, FSDP2_F64, 1);
    }
}

/* Index of the first differing element, or -1. */
static inline long first_difference(const void *a, const void *b, fsdp2_dtype_t t, size_t n)
{
    size_t e = dsize(t);
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * e, (const char *)b + i * e, e) != 0)
            return (long)i;
    return -1;
}

static inline uint64_t elem_bits(const void *p, fsdp2_dtype_t t, size_t i)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)p + i * dsize(t), dsize(t));
    return v;
}

/* Copies device memory to the host, in order on stream, and waits. */
static inline fsdp2_status_t download(void *host, const void *dev, size_t bytes, fsdp2_stream_t *s)
{
    fsdp2_status_t st = fsdp2_memcpy_async(host, dev, bytes, s);
    return st != FSDP2_SUCCESS ? st : fsdp2_stream_synchronize(s);
}

static inline fsdp2_status_t upload(void *dev, const void *host, size_t bytes, fsdp2_stream_t *s)
{
    fsdp2_status_t st = fsdp2_memcpy_async(dev, host, bytes, s);
    return st != FSDP2_SUCCESS ? st : fsdp2_stream_synchronize(s);
}

/* A host function that holds its stream until the test opens it: work queued behind
 * it is certainly pending, so NOT_READY can be asserted without racing the GPU. It
 * gives up after 60 s so a broken test cannot hang. */
typedef struct gate {
    atomic_int open;
} gate_t;

static inline fsdp2_status_t gate_wait(void *arg)
{
    gate_t *g = arg;
    struct timespec ts = {0, 100000};
    for (long waited_us = 0; !atomic_load(&g->open); waited_us += 100) {
        if (waited_us > 60L * 1000 * 1000)
            return FSDP2_ERR_TIMEOUT;
        nanosleep(&ts, NULL);
    }
    return FSDP2_SUCCESS;
}

#endif
