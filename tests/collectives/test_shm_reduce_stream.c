/* fsdp2_shm_reduce_stream (lib/collectives/shm_stores.c), the reduction a streamed
 * reduce-scatter output is written by: the same bits as fsdp2_reduce_rank_order (what
 * the slots and an output that is not streamed get) for every dtype, rank count, pre
 * and post divide, for outputs starting anywhere in a cache line and of every length
 * around a line's worth, in place too, and nothing written outside the output; f32 and
 * f64 also against a sum computed here. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/check_main.h"
#include "collectives/group_internal.h"
#include "collectives/shm_internal.h"

#define MAX_N 5
#define MAX_COUNT 300
#define GUARD 64
#define CANARY 0xa5

static const fsdp2_dtype_t dtypes[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16};
static const size_t sizes[] = {4, 8, 2, 2};

/* Values spread over signs and magnitudes, exactly representable in every dtype, so
 * the sources of bf16 and f16 are the same numbers (and the sums still round). */
static double value(unsigned seed, size_t i)
{
    uint32_t h = (uint32_t)(seed * 2654435761u) ^ (uint32_t)(i * 40503u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((double)(h % 2001u) - 1000.0) / 64.0 * (h & 0x10000u ? 1.0 / 3.0 : 1.0);
}

static void fill(void *p, fsdp2_dtype_t t, unsigned seed, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        double v = value(seed, i);
        switch (t) {
        case FSDP2_F32: ((float *)p)[i] = (float)v; break;
        case FSDP2_F64: ((double *)p)[i] = v; break;
        case FSDP2_BF16: ((uint16_t *)p)[i] = fsdp2_f64_to_bf16(v); break;
        default: ((uint16_t *)p)[i] = fsdp2_f64_to_f16(v); break;
        }
    }
}

/* Every offset of dst within a line, every count up to a few lines, n ranks. */
static void check_dtype(int d, double pre, double post)
{
    fsdp2_dtype_t t = dtypes[d];
    size_t es = sizes[d];
    static _Alignas(64) char srcbuf[MAX_N][MAX_COUNT * 8];
    static _Alignas(64) char want[GUARD + MAX_COUNT * 8 + GUARD];
    static _Alignas(64) char got[GUARD + MAX_COUNT * 8 + GUARD];
    for (int n = 1; n <= MAX_N; n++) {
        const void *src[MAX_N];
        for (int r = 0; r < n; r++) {
            fill(srcbuf[r], t, (unsigned)(r + 7 * n), MAX_COUNT);
            src[r] = srcbuf[r];
        }
        for (size_t off = 0; off < 64; off += es) {
            for (size_t count = 0; count <= MAX_COUNT; count += count < 80 ? 1 : 37) {
                memset(want, CANARY, sizeof(want));
                memset(got, CANARY, sizeof(got));
                fsdp2_reduce_rank_order(want + GUARD + off, t, src, n, count, pre, post);
                fsdp2_shm_reduce_stream(got + GUARD + off, t, es, src, n, count, pre, post);
                fsdp2_shm_fence_streams();
                ck_assert_msg(memcmp(want, got, sizeof(got)) == 0,
                              "dtype %d, %d ranks, offset %zu, count %zu, pre %g, post %g: "
                              "streamed bytes differ", (int)t, n, off, count, pre, post);
                if (t == FSDP2_F32 && count) {
                    size_t i = count - 1; /* the last element, past any streamed line */
                    float acc = 0.0f;
                    for (int r = 0; r < n; r++)
                        acc = r ? acc + ((const float *)src[r])[i] / (float)pre
                                : ((const float *)src[r])[i] / (float)pre;
                    float have;
                    memcpy(&have, got + GUARD + off + i * es, sizeof(have));
                    ck_assert_msg(have == acc / (float)post, "f32 [%zu]: %g, want %g", i,
                                  (double)have, (double)(acc / (float)post));
                }
            }
        }
    }
}

START_TEST(streams_the_same_bits)
{
    check_dtype(_i, 1.0, 1.0);
    check_dtype(_i, 1.0, 3.0);  /* AVG over 3, or a post factor */
    check_dtype(_i, 2.0, 1.5);  /* pre and post divide factors */
    check_dtype(_i, 1.0 + 1e-12, 1.0); /* divides, by 1.0f in f32 */
}
END_TEST

/* In place: the output is one of the sources (what FSDP2_SHM_STREAM_OUTPUT=stream does
 * to an in-place reduce-scatter), at every offset within a line. */
START_TEST(streams_in_place)
{
    fsdp2_dtype_t t = dtypes[_i];
    size_t es = sizes[_i], count = 203;
    enum { N = 3 };
    static _Alignas(64) char bufs[N][GUARD + MAX_COUNT * 8 + GUARD];
    static _Alignas(64) char want[MAX_COUNT * 8];
    for (int mine = 0; mine < N; mine++) {
        for (size_t off = 0; off < 64; off += es) {
            const void *src[N];
            for (int r = 0; r < N; r++) {
                memset(bufs[r], CANARY, sizeof(bufs[r]));
                fill(bufs[r] + GUARD + off, t, (unsigned)r + 3u, count);
                src[r] = bufs[r] + GUARD + off;
            }
            fsdp2_reduce_rank_order(want, t, src, N, count, 2.0, 3.0);
            fsdp2_shm_reduce_stream(bufs[mine] + GUARD + off, t, es, src, N, count, 2.0, 3.0);
            fsdp2_shm_fence_streams();
            ck_assert_msg(memcmp(want, bufs[mine] + GUARD + off, count * es) == 0,
                          "dtype %d in place on source %d, offset %zu: bytes differ", (int)t,
                          mine, off);
            for (size_t k = 0; k < GUARD + off; k++)
                ck_assert_int_eq((unsigned char)bufs[mine][k], CANARY);
            for (size_t k = GUARD + off + count * es; k < sizeof(bufs[mine]); k++)
                ck_assert_int_eq((unsigned char)bufs[mine][k], CANARY);
        }
    }
}
END_TEST

/* Every element of a long f64 output against a sum computed here (the streamed body is
 * nearly all of it). */
START_TEST(f64_against_a_reference)
{
    enum { COUNT = 4099, N = 3 };
    double *s[N], *out = aligned_alloc(64, ((COUNT + 8) * sizeof(double) + 63) / 64 * 64);
    const void *src[N];
    for (int r = 0; r < N; r++) {
        s[r] = malloc(COUNT * sizeof(double));
        fill(s[r], FSDP2_F64, (unsigned)r + 1u, COUNT);
        src[r] = s[r];
    }
    fsdp2_shm_reduce_stream((char *)(out + 1), FSDP2_F64, 8, src, N, COUNT, 4.0, 0.5);
    fsdp2_shm_fence_streams();
    for (size_t i = 0; i < COUNT; i++) {
        double acc = s[0][i] / 4.0 + s[1][i] / 4.0 + s[2][i] / 4.0;
        ck_assert_msg(out[1 + i] == acc / 0.5, "[%zu]: %.17g, want %.17g", i, out[1 + i],
                      acc / 0.5);
    }
    for (int r = 0; r < N; r++)
        free(s[r]);
    free(out);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("shm_reduce_stream");
    TCase *tc = tcase_create("stream");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, streams_the_same_bits, 0, 4);
    tcase_add_loop_test(tc, streams_in_place, 0, 4);
    tcase_add_test(tc, f64_against_a_reference);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(make_suite)
