/* Collectives with real processes: 1, 2, 3 and 4 ranks, every operation and dtype,
 * sizes from 0 to several reduction segments and not divisible by the world size, plus
 * random sizes, each result checked element-wise against values the test computes
 * itself. Then concurrency (two streams on one group) and bad arguments; failures are in
 * test_coll_failures.c.
 *
 * Ranks on one host use the shared-memory transport by default; meson runs this file a
 * second time with FSDP2_SHM=off, so that every case also runs over UCX messages (the
 * path across hosts). */
#include <check.h>
#include <sched.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/check_main.h"
#include "../core/test_rng.h"
#include "elements.h"
#include "ranks.h"

#define OK(ctx, call) RANK_CHECK(ctx, (call) == FSDP2_SUCCESS, "%s", #call)

/* The last of each spans several slots and reduction segments (scale_for_sanitizers). */
static size_t sizes[] = {0, 1, 5, 1000, 300001};
static size_t all_reduce_counts[] = {0, 1, 3, 5, 1001, 600007};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static size_t esize(fsdp2_dtype_t t)
{
    size_t b = 0;
    fsdp2_dtype_size(t, &b);
    return b;
}

/* A value exactly representable in every dtype: small integers. */
static double pattern(int rank, size_t i)
{
    return (double)((int)((i * 7 + (size_t)rank * 13) % 29) - 14);
}

static void fill_pattern(void *p, fsdp2_dtype_t t, int rank, size_t n, size_t base)
{
    FILL_CHUNKED(p, t, n, pattern, rank, base);
}

static int sync_ok(rank_ctx_t *c)
{
    return RANK_CHECK(c, fsdp2_stream_synchronize(c->stream) == FSDP2_SUCCESS, "synchronize");
}

/* buf holds `blocks` blocks of n elements, block b being rank from + b's pattern (a
 * gather: from 0, blocks = size; a broadcast: from root, one block). Reports the first
 * element that is not, with `what` saying which call. */
static int expect_blocks(rank_ctx_t *c, const void *buf, fsdp2_dtype_t t, size_t n, int from,
                         int blocks, const char *what)
{
    elements_t e;
    elements_init(&e, buf, t, n * (size_t)blocks);
    for (int b = 0; b < blocks; b++)
        for (size_t i = 0; i < n; i++) {
            double got = element(&e, (size_t)b * n + i), want = pattern(from + b, i);
            if (RANK_CHECK(c, got == want, "%s: %s n=%zu from rank %d element %zu: %g, want %g",
                           what, fsdp2_dtype_name(t), n, from + b, i, got, want))
                return 1;
        }
    return 0;
}

/* ---- all_gather ---- */

static int body_all_gather(rank_ctx_t *c)
{
    int fails = 0;
    const fsdp2_dtype_t dts[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16, FSDP2_I32, FSDP2_I64};
    for (size_t d = 0; d < COUNT(dts); d++) {
        for (size_t s = 0; s < COUNT(sizes); s++) {
            fsdp2_dtype_t t = dts[d];
            size_t n = sizes[s];
            char *send = malloc(n * esize(t) + 1), *recv = malloc(n * esize(t) * c->size + 1);
            fill_pattern(send, t, c->rank, n, 0);
            memset(recv, 0xab, n * esize(t) * c->size);
            fails += OK(c, fsdp2_all_gather_async(c->world, send, recv, n, t, c->stream));
            fails += sync_ok(c);
            fails += fails ? 0 : expect_blocks(c, recv, t, n, 0, c->size, "all_gather");
            /* in place: our block already sits in recv */
            memset(recv, 0xab, n * esize(t) * c->size);
            fill_pattern(recv + (size_t)c->rank * n * esize(t), t, c->rank, n, 0);
            fails += OK(c, fsdp2_all_gather_async(c->world, recv + (size_t)c->rank * n * esize(t),
                                                  recv, n, t, c->stream));
            fails += sync_ok(c);
            fails += fails ? 0 : expect_blocks(c, recv, t, n, 0, c->size, "in place all_gather");
            free(send);
            free(recv);
        }
    }
    return fails;
}

/* Each rank's bytes land in three uneven pieces scattered over one destination. */
static int body_all_gather_pieces(rank_ctx_t *c)
{
    int fails = 0;
    const size_t bytes = 10007;
    unsigned char *send = malloc(bytes), *dest = malloc(c->size * (bytes + 64));
    for (size_t i = 0; i < bytes; i++)
        send[i] = (unsigned char)(i * 31 + (size_t)c->rank * 7);
    memset(dest, 0xee, c->size * (bytes + 64));
    fsdp2_iov_t pieces[16 * 3];
    size_t offsets[17];
    offsets[0] = 0;
    for (int r = 0; r < c->size; r++) {
        /* rank r's region starts at r * (bytes + 64); pieces leave 16-byte gaps */
        unsigned char *base = dest + (size_t)r * (bytes + 64);
        size_t a = 1000 + (size_t)r, b = 5000, rest = bytes - a - b;
        pieces[3 * r] = (fsdp2_iov_t){base + a + 16, b};
        pieces[3 * r + 1] = (fsdp2_iov_t){base, a}; /* out of address order on purpose */
        pieces[3 * r + 2] = (fsdp2_iov_t){base + a + b + 32, rest};
        offsets[r + 1] = offsets[r] + 3;
    }
    fails += OK(c, fsdp2_all_gather_pieces_async(c->world, send, bytes, pieces, offsets, c->stream));
    fails += sync_ok(c);
    for (int r = 0; r < c->size && !fails; r++) {
        size_t k = 0;
        for (int p = 0; p < 3; p++) {
            const unsigned char *d = pieces[3 * r + p].data;
            for (size_t i = 0; i < pieces[3 * r + p].bytes && !fails; i++, k++)
                fails += RANK_CHECK(c, d[i] == (unsigned char)(k * 31 + (size_t)r * 7),
                                    "rank %d byte %zu", r, k);
        }
    }
    free(send);
    free(dest);
    return fails;
}

/* Zero-length pieces (NULL or not) between real ones, and a gather of no bytes at all
 * with no pieces array. */
static int body_all_gather_empty_pieces(rank_ctx_t *c)
{
    int fails = 0;
    const size_t bytes = 777, stride = 1024;
    unsigned char *send = malloc(bytes), *dest = malloc(c->size * stride);
    for (size_t i = 0; i < bytes; i++)
        send[i] = (unsigned char)(i * 13 + (size_t)c->rank * 5 + 1);
    memset(dest, 0xee, c->size * stride);
    fsdp2_iov_t pieces[16 * 5];
    size_t offsets[17] = {0};
    for (int r = 0; r < c->size; r++) {
        unsigned char *base = dest + (size_t)r * stride;
        pieces[5 * r] = (fsdp2_iov_t){NULL, 0};
        pieces[5 * r + 1] = (fsdp2_iov_t){base, 300};
        pieces[5 * r + 2] = (fsdp2_iov_t){base + 310, 0};
        pieces[5 * r + 3] = (fsdp2_iov_t){base + 320, bytes - 300};
        pieces[5 * r + 4] = (fsdp2_iov_t){NULL, 0};
        offsets[r + 1] = offsets[r] + 5;
    }
    fails += OK(c, fsdp2_all_gather_pieces_async(c->world, send, bytes, pieces, offsets, c->stream));
    fails += sync_ok(c);
    for (int r = 0; r < c->size && !fails; r++) {
        const unsigned char *base = dest + (size_t)r * stride;
        for (size_t i = 0; i < bytes && !fails; i++) {
            size_t at = i < 300 ? i : 320 + (i - 300);
            fails += RANK_CHECK(c, base[at] == (unsigned char)(i * 13 + (size_t)r * 5 + 1),
                                "rank %d byte %zu", r, i);
        }
        for (size_t at = 300; at < 320 && !fails; at++) /* the gap stays untouched */
            fails += RANK_CHECK(c, base[at] == 0xee, "rank %d gap byte %zu written", r, at);
    }
    size_t none[17] = {0};
    fails += OK(c, fsdp2_all_gather_pieces_async(c->world, NULL, 0, NULL, none, c->stream));
    fails += sync_ok(c);
    free(send);
    free(dest);
    return fails;
}

/* ---- reductions ---- */

typedef struct reduce_case {
    fsdp2_reduce_op_t op;
    double pre, post;
} reduce_case_t;

static const reduce_case_t reduce_cases[] = {
    {FSDP2_REDUCE_SUM, 1, 1}, {FSDP2_REDUCE_AVG, 1, 1}, {FSDP2_REDUCE_SUM, 2, 4},
    {FSDP2_REDUCE_AVG, 2, 4}};

/* The reference: contributions of ranks 0..size-1 in order, in f64, then rounded to t.
 * Inputs are small integers and the factors powers of two or the world size, so f64
 * gives the exact result and the library's f32 arithmetic must round to the same value
 * (SUM) or within one unit in the last place of t (AVG by 3). */
static double reference(const reduce_case_t *rc, int size, size_t i, size_t base)
{
    double acc = 0;
    for (int r = 0; r < size; r++)
        acc += pattern(r, base + i) / rc->pre;
    acc /= rc->post;
    if (rc->op == FSDP2_REDUCE_AVG)
        acc /= size;
    return acc;
}

static int close_enough(double got, double want, fsdp2_dtype_t t, int exact)
{
    double rounded = t == FSDP2_F32 ? (double)(float)want : want;
    if (t != FSDP2_F32 && t != FSDP2_F64) { /* the 16-bit types: the library rounds */
        unsigned char tmp[8];
        fsdp2_convert(tmp, t, &want, FSDP2_F64, 1);
        fsdp2_convert(&rounded, FSDP2_F64, tmp, t, 1);
    }
    if (exact)
        return got == rounded;
    double ulp = t == FSDP2_F64 ? 1e-15 : t == FSDP2_F32 ? 1.2e-7 : t == FSDP2_BF16 ? 7.9e-3 : 9.8e-4;
    return fabs(got - want) <= 2 * ulp * fmax(1.0, fabs(want));
}

/* This rank's reduce-scatter result, n elements at out, against the reference. */
static int expect_reduced(rank_ctx_t *c, const reduce_case_t *rc, fsdp2_dtype_t t, size_t n,
                          const void *out, int exact, const char *what)
{
    elements_t got;
    elements_init(&got, out, t, n);
    for (size_t i = 0; i < n; i++) {
        double want = reference(rc, c->size, i, (size_t)c->rank * n);
        if (RANK_CHECK(c, close_enough(element(&got, i), want, t, exact),
                       "%s %s %s n=%zu (pre %g, post %g) element %zu: %.9g, want %.9g", what,
                       rc->op == FSDP2_REDUCE_SUM ? "sum" : "avg", fsdp2_dtype_name(t), n,
                       rc->pre, rc->post, i, element(&got, i), want))
            return 1;
    }
    return 0;
}

static int body_reduce_scatter(rank_ctx_t *c)
{
    int fails = 0;
    const fsdp2_dtype_t dts[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16};
    for (size_t d = 0; d < COUNT(dts); d++)
        for (size_t s = 0; s < COUNT(sizes); s++)
            for (size_t k = 0; k < COUNT(reduce_cases); k++) {
                fsdp2_dtype_t t = dts[d];
                const reduce_case_t *rc = &reduce_cases[k];
                size_t n = sizes[s], total = n * c->size;
                char *send = malloc(total * esize(t) + 1), *recv = malloc(n * esize(t) + 1);
                fill_pattern(send, t, c->rank, total, 0);
                memset(recv, 0xab, n * esize(t));
                fsdp2_reduce_t red = {rc->op, rc->pre, rc->post};
                fails += OK(c, fsdp2_reduce_scatter_async(c->world, send, recv, n, t, &red, c->stream));
                fails += sync_ok(c);
                int exact = rc->op == FSDP2_REDUCE_SUM || (c->size & (c->size - 1)) == 0;
                fails += fails ? 0 : expect_reduced(c, rc, t, n, recv, exact, "reduce_scatter");
                /* in place: the result lands in this rank's block of send, the other
                 * blocks stay as they were */
                char *own = send + (size_t)c->rank * n * esize(t);
                fails += OK(c, fsdp2_reduce_scatter_async(c->world, send, own, n, t, &red, c->stream));
                fails += sync_ok(c);
                fails += fails ? 0 : expect_reduced(c, rc, t, n, own, exact, "in place reduce_scatter");
                elements_t sent;
                elements_init(&sent, send, t, total);
                for (size_t i = 0; i < total && !fails; i++)
                    if (i / n != (size_t)c->rank)
                        fails += RANK_CHECK(c, element(&sent, i) == pattern(c->rank, i),
                                            "in place reduce_scatter %s n=%zu changed send "
                                            "element %zu (block %zu): %g, want %g",
                                            fsdp2_dtype_name(t), n, i, i / n, element(&sent, i),
                                            pattern(c->rank, i));
                free(send);
                free(recv);
            }
    return fails;
}

static int body_all_reduce(rank_ctx_t *c)
{
    int fails = 0;
    const fsdp2_dtype_t dts[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16};
    for (size_t d = 0; d < COUNT(dts); d++)
        for (size_t s = 0; s < COUNT(all_reduce_counts); s++)
            for (size_t k = 0; k < COUNT(reduce_cases); k++) {
                fsdp2_dtype_t t = dts[d];
                const reduce_case_t *rc = &reduce_cases[k];
                size_t n = all_reduce_counts[s];
                char *buf = malloc(n * esize(t) + 1);
                fill_pattern(buf, t, c->rank, n, 0);
                fsdp2_reduce_t red = {rc->op, rc->pre, rc->post};
                fails += OK(c, fsdp2_all_reduce_async(c->world, buf, n, t, &red, c->stream));
                fails += sync_ok(c);
                int exact = rc->op == FSDP2_REDUCE_SUM || (c->size & (c->size - 1)) == 0;
                elements_t got;
                elements_init(&got, buf, t, n);
                for (size_t i = 0; i < n && !fails; i++) {
                    double want = reference(rc, c->size, i, 0);
                    fails += RANK_CHECK(c, close_enough(element(&got, i), want, t, exact),
                                        "%s n=%zu case %zu element %zu: %.9g, want %.9g",
                                        fsdp2_dtype_name(t), n, k, i, element(&got, i), want);
                }
                free(buf);
            }
    return fails;
}

/* 16-bit sums accumulate in f32, in rank order: rank 0 gives `big` and every other rank
 * 1. In bf16 (big 256) and f16 (big 2048), where the spacing at big is 2, the f32 sum is
 * big + size - 1, rounded once; accumulated in the 16-bit type every big + 1 would
 * round back to big. In f32 (big 2^24, spacing 2) the same rounding is the point: in
 * rank order every big + 1 rounds back to big, so the sum is big on any number of
 * ranks, while adding the ones first (or in f64) would give more. */
static int body_sixteen_bit_sums(rank_ctx_t *c)
{
    int fails = 0;
    const fsdp2_dtype_t dts[] = {FSDP2_BF16, FSDP2_F16, FSDP2_F32};
    enum { N = 1001 };
    for (size_t d = 0; d < COUNT(dts); d++) {
        fsdp2_dtype_t t = dts[d];
        double big = t == FSDP2_BF16 ? 256 : t == FSDP2_F16 ? 2048 : 16777216;
        double mine = c->rank == 0 ? big : 1;
        double want = t == FSDP2_F32 ? big : big + (c->size - 1);
        unsigned char tmp[8];
        fsdp2_convert(tmp, t, &want, FSDP2_F64, 1);
        fsdp2_convert(&want, FSDP2_F64, tmp, t, 1);
        size_t es = esize(t);
        char *buf = malloc(N * es), *send = malloc(N * es * c->size), *recv = malloc(N * es);
        for (size_t i = 0; i < N; i++)
            fsdp2_convert(buf + es * i, t, &mine, FSDP2_F64, 1);
        for (int r = 0; r < c->size; r++)
            memcpy(send + (size_t)r * N * es, buf, N * es);
        fails += OK(c, fsdp2_all_reduce_async(c->world, buf, N, t, NULL, c->stream));
        fails += OK(c, fsdp2_reduce_scatter_async(c->world, send, recv, N, t, NULL, c->stream));
        fails += sync_ok(c);
        elements_t reduced, scattered;
        elements_init(&reduced, buf, t, N);
        elements_init(&scattered, recv, t, N);
        for (size_t i = 0; i < N && !fails; i++) {
            fails += RANK_CHECK(c, element(&reduced, i) == want,
                                "%s all_reduce element %zu: %g, want %g", fsdp2_dtype_name(t), i,
                                element(&reduced, i), want);
            fails += RANK_CHECK(c, element(&scattered, i) == want,
                                "%s reduce_scatter element %zu: %g, want %g",
                                fsdp2_dtype_name(t), i, element(&scattered, i), want);
        }
        free(buf);
        free(send);
        free(recv);
    }
    return fails;
}

/* Random counts (log-uniform up to 2^19 elements, so across the transports' 256 KiB and
 * 1 MiB pieces), dtypes, reduction cases and roots; the seed comes from the parent, so
 * every rank draws the same, and is printed so that a failure can be replayed with
 * FSDP2_TEST_SEED. */
/* Broadcast of n elements from root into buf (root's pattern there, 0xab elsewhere),
 * checked on every rank against root's pattern. */
static int check_broadcast(rank_ctx_t *c, char *buf, fsdp2_dtype_t t, size_t n, int root,
                           const char *what)
{
    if (c->rank == root)
        fill_pattern(buf, t, root, n, 0);
    else
        memset(buf, 0xab, n * esize(t));
    int fails = OK(c, fsdp2_broadcast_async(c->world, buf, n, t, root, c->stream));
    fails += sync_ok(c);
    return fails ? fails : expect_blocks(c, buf, t, n, root, 1, what);
}

static int body_random_sizes(rank_ctx_t *c)
{
    int fails = 0;
    uint64_t state = *(const uint64_t *)c->arg | 1;
    const fsdp2_dtype_t dts[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16};
    for (int draw = 0; draw < 12 && !fails; draw++) {
        fsdp2_dtype_t t = dts[rng_next(&state) % COUNT(dts)];
        size_t n = (size_t)(rng_next(&state) % ((uint64_t)1 << (rng_next(&state) % 20)));
        const reduce_case_t *rc = &reduce_cases[rng_next(&state) % COUNT(reduce_cases)];
        int root = (int)(rng_next(&state) % (uint64_t)c->size);
        size_t total = n * c->size;
        char *send = malloc(total * esize(t) + 1), *recv = malloc(total * esize(t) + 1);
        fsdp2_reduce_t red = {rc->op, rc->pre, rc->post};
        int exact = rc->op == FSDP2_REDUCE_SUM || (c->size & (c->size - 1)) == 0;
        /* all_gather (over bytes that cannot pass for a result) */
        fill_pattern(send, t, c->rank, n, 0);
        memset(recv, 0xab, total * esize(t));
        fails += OK(c, fsdp2_all_gather_async(c->world, send, recv, n, t, c->stream));
        fails += sync_ok(c);
        fails += fails ? 0 : expect_blocks(c, recv, t, n, 0, c->size, "random all_gather");
        /* reduce_scatter */
        fill_pattern(send, t, c->rank, total, 0);
        memset(recv, 0xab, n * esize(t));
        fails += OK(c, fsdp2_reduce_scatter_async(c->world, send, recv, n, t, &red, c->stream));
        fails += sync_ok(c);
        elements_t scattered;
        elements_init(&scattered, recv, t, n);
        for (size_t i = 0; i < n && !fails; i++)
            fails += RANK_CHECK(c, close_enough(element(&scattered, i),
                                                reference(rc, c->size, i, (size_t)c->rank * n), t,
                                                exact),
                                "draw %d reduce_scatter %s n=%zu element %zu", draw,
                                fsdp2_dtype_name(t), n, i);
        /* all_reduce of the whole buffer */
        fails += OK(c, fsdp2_all_reduce_async(c->world, send, total, t, &red, c->stream));
        fails += sync_ok(c);
        elements_t reduced;
        elements_init(&reduced, send, t, total);
        for (size_t i = 0; i < total && !fails; i++)
            fails += RANK_CHECK(c, close_enough(element(&reduced, i), reference(rc, c->size, i, 0), t,
                                                exact),
                                "draw %d all_reduce %s count %zu element %zu", draw,
                                fsdp2_dtype_name(t), total, i);
        fails += check_broadcast(c, recv, t, total, root, "random broadcast");
        free(send);
        free(recv);
    }
    return fails;
}

static int body_broadcast_and_barrier(rank_ctx_t *c)
{
    int fails = 0;
    const fsdp2_dtype_t dts[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16, FSDP2_I32, FSDP2_I64};
    for (size_t d = 0; d < COUNT(dts); d++)
        for (size_t s = 0; s < COUNT(sizes); s++)
            for (int root = 0; root < c->size; root++) {
                fsdp2_dtype_t t = dts[d];
                size_t n = sizes[s];
                char *buf = malloc(n * esize(t) + 1);
                fails += check_broadcast(c, buf, t, n, root, "broadcast");
                free(buf);
            }
    /* After the barrier every rank must see every rank's arrival. */
    int64_t arrived = 0;
    fails += OK(c, fsdp2_store_add(c->store, "arrivals", 1, &arrived));
    fails += OK(c, fsdp2_barrier_async(c->world, c->stream));
    fails += sync_ok(c);
    fails += OK(c, fsdp2_store_add(c->store, "arrivals", 0, &arrived));
    fails += RANK_CHECK(c, arrived == c->size, "after the barrier %lld of %d arrived",
                        (long long)arrived, c->size);
    return fails;
}

/* An all-gather stream and a reduce-scatter stream on one group, 100 rounds each,
 * enqueued alternately: collectives run concurrently yet match by sequence number. */
static int body_two_streams(rank_ctx_t *c)
{
    int fails = 0;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *rs;
    fails += OK(c, fsdp2_stream_create(cpu, "rs", &rs));
    enum { ROUNDS = 100, N = 4099 };
    float *ag_send = malloc(N * sizeof(float)), *ag_recv = malloc(ROUNDS * N * c->size * sizeof(float));
    float *rs_send = malloc(N * c->size * sizeof(float)), *rs_recv = malloc(ROUNDS * N * sizeof(float));
    fill_pattern(ag_send, FSDP2_F32, c->rank, N, 0);
    fill_pattern(rs_send, FSDP2_F32, c->rank, (size_t)N * c->size, 0);
    for (int k = 0; k < ROUNDS; k++) {
        fails += OK(c, fsdp2_all_gather_async(c->world, ag_send, ag_recv + (size_t)k * N * c->size,
                                              N, FSDP2_F32, c->stream));
        fails += OK(c, fsdp2_reduce_scatter_async(c->world, rs_send, rs_recv + (size_t)k * N, N,
                                                  FSDP2_F32, NULL, rs));
    }
    fails += sync_ok(c);
    fails += RANK_CHECK(c, fsdp2_stream_synchronize(rs) == FSDP2_SUCCESS, "rs stream");
    reduce_case_t sum = {FSDP2_REDUCE_SUM, 1, 1};
    for (int k = 0; k < ROUNDS && !fails; k++) {
        for (int r = 0; r < c->size && !fails; r++)
            for (size_t i = 0; i < N && !fails; i++)
                fails += RANK_CHECK(c, ag_recv[((size_t)k * c->size + r) * N + i] == pattern(r, i),
                                    "round %d all_gather rank %d element %zu", k, r, i);
        for (size_t i = 0; i < N && !fails; i++)
            fails += RANK_CHECK(c, rs_recv[(size_t)k * N + i] ==
                                       (float)reference(&sum, c->size, i, (size_t)c->rank * N),
                                "round %d reduce_scatter element %zu", k, i);
    }
    fsdp2_stream_destroy(rs);
    free(ag_send);
    free(ag_recv);
    free(rs_send);
    free(rs_recv);
    return fails;
}

/* Holds a stream before its collective so that ranks start their reductions in opposite
 * orders. Not a wait for anything: any delay, or none, must give the same result. */
static fsdp2_status_t delay_run(void *arg)
{
    (void)arg;
    struct timespec t = {0, 200 * 1000 * 1000};
    nanosleep(&t, NULL);
    return FSDP2_SUCCESS;
}

/* Eight all-reduces of one group on eight streams, each rank starting a different half
 * first: more reductions in flight than the group has scratch sets. Handing sets out in
 * arrival order deadlocked this until the timeout (rank 0 holding every set for seqs 0-3,
 * rank 1 for 4-7). */
static int body_many_reductions_in_opposite_orders(rank_ctx_t *c)
{
    enum { NS = 8, N = 1024 };
    int fails = 0;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *s[NS];
    static float buf[NS][N];
    for (int i = 0; i < NS; i++) {
        fails += OK(c, fsdp2_stream_create(cpu, "many", &s[i]));
        for (int j = 0; j < N; j++)
            buf[i][j] = (float)(c->rank + 1);
    }
    for (int i = 0; i < NS; i++)
        if ((c->rank % 2 == 0) == (i >= NS / 2))
            fails += OK(c, fsdp2_stream_launch_host(s[i], delay_run, NULL));
    for (int i = 0; i < NS; i++)
        fails += OK(c, fsdp2_all_reduce_async(c->world, buf[i], N, FSDP2_F32, NULL, s[i]));
    float want = (float)(c->size * (c->size + 1) / 2);
    for (int i = 0; i < NS; i++) {
        fails += RANK_CHECK(c, fsdp2_stream_synchronize(s[i]) == FSDP2_SUCCESS, "stream %d", i);
        fails += RANK_CHECK(c, buf[i][N - 1] == want, "stream %d: %g, want %g", i, buf[i][N - 1],
                            want);
        fsdp2_stream_destroy(s[i]);
    }
    return fails;
}

/* A group destroyed while reduce-scatters it was given still wait on a side stream (a
 * host function holds the stream first, so they have not even started): destroy waits
 * for them instead of freeing what they use; they finish with the right sums, and the
 * stream is synchronized and destroyed after the group is gone. (It crashed in the
 * shared-memory transport before.) */
static int body_destroy_with_collectives_in_flight(rank_ctx_t *c)
{
    enum { K = 4 };
    int fails = 0;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 20000;
    fsdp2_group_t *g = NULL;
    fsdp2_stream_t *s = NULL;
    fails += OK(c, fsdp2_group_create(c->store, "in-flight", c->rank, c->size, &go, &g));
    fails += OK(c, fsdp2_stream_create(cpu, "in-flight", &s));
    if (fails)
        return fails;
    size_t n = (size_t)1 << 16; /* per rank: 256 KiB of f32 */
    float *send[K], *recv[K];
    for (int k = 0; k < K; k++) {
        send[k] = malloc(n * (size_t)c->size * sizeof(float));
        recv[k] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n * (size_t)c->size; i++)
            send[k][i] = (float)(c->rank + 1 + k);
    }
    fails += OK(c, fsdp2_stream_launch_host(s, delay_run, NULL));
    for (int k = 0; k < K && !fails; k++)
        fails += OK(c, fsdp2_reduce_scatter_async(g, send[k], recv[k], n, FSDP2_F32, NULL, s));
    fails += OK(c, fsdp2_group_destroy(g));
    fails += RANK_CHECK(c, fsdp2_stream_synchronize(s) == FSDP2_SUCCESS, "stream: %s",
                        fsdp2_last_error());
    for (int k = 0; k < K; k++) {
        float want = (float)(c->size * (c->size + 1) / 2 + c->size * k);
        fails += RANK_CHECK(c, recv[k][0] == want && recv[k][n - 1] == want,
                            "reduce-scatter %d: %g .. %g, want %g", k, recv[k][0], recv[k][n - 1],
                            want);
        free(send[k]);
        free(recv[k]);
    }
    fsdp2_stream_destroy(s);
    return fails;
}

/* Every rank pinned to one and the same CPU before its group is made: more ranks than
 * cores on any machine, as on this 2-core one (the group then never spins). Collectives
 * of small and large sizes must finish, with the right values, within the deadline. A
 * wait that starved its peer only slows this down (0.2-0.6 s per world size here, 1-4 s
 * with the shared-memory waits made pure spins), so speed is left to the benchmarks. */
static int body_pinned_to_one_cpu(rank_ctx_t *c)
{
    int fails = 0;
    cpu_set_t allowed, one;
    CPU_ZERO(&one);
    fails += RANK_CHECK(c, sched_getaffinity(0, sizeof(allowed), &allowed) == 0, "affinity");
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &allowed)) {
            CPU_SET(cpu, &one);
            break;
        }
    fails += RANK_CHECK(c, sched_setaffinity(0, sizeof(one), &one) == 0, "pin");
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 20000;
    fsdp2_group_t *g = NULL;
    fails += OK(c, fsdp2_group_create(c->store, "pinned", c->rank, c->size, &go, &g));
    if (fails)
        return fails;
    fsdp2_group_t *world = c->world;
    c->world = g; /* the checks below run on the pinned group */
    float small[256];
    for (int k = 0; k < 200 && !fails; k++) {
        for (int i = 0; i < 256; i++)
            small[i] = (float)(c->rank + i + k);
        fails += OK(c, fsdp2_all_reduce_async(g, small, 256, FSDP2_F32, NULL, c->stream));
        fails += sync_ok(c);
        float want = (float)(c->size * (c->size - 1) / 2 + c->size * (7 + k));
        fails += RANK_CHECK(c, small[7] == want, "round %d: %g, want %g", k, small[7], want);
    }
    size_t n = (size_t)1 << 18; /* 1 MiB of f32 per rank */
    float *send = malloc(n * sizeof(float)), *recv = malloc(n * c->size * sizeof(float));
    for (int k = 0; k < 5 && !fails; k++) {
        fill_pattern(send, FSDP2_F32, c->rank, n, 0);
        fails += OK(c, fsdp2_all_gather_async(g, send, recv, n, FSDP2_F32, c->stream));
        fails += sync_ok(c);
        for (int r = 0; r < c->size && !fails; r++)
            fails += RANK_CHECK(c, recv[(size_t)r * n + n - 1] == pattern(r, n - 1) &&
                                       recv[(size_t)r * n] == pattern(r, 0),
                                "all_gather round %d rank %d", k, r);
        fill_pattern(recv, FSDP2_F32, c->rank, n * c->size, 0);
        fails += OK(c, fsdp2_reduce_scatter_async(g, recv, send, n, FSDP2_F32, NULL, c->stream));
        fails += sync_ok(c);
        reduce_case_t sum = {FSDP2_REDUCE_SUM, 1, 1};
        for (size_t i = 0; i < n && !fails; i += 4099)
            fails += RANK_CHECK(c, send[i] == (float)reference(&sum, c->size, i,
                                                                 (size_t)c->rank * n),
                                "reduce_scatter round %d element %zu", k, i);
    }
    free(send);
    free(recv);
    c->world = world;
    fsdp2_group_destroy(g);
    return fails;
}

static int body_bad_arguments(rank_ctx_t *c)
{
    int fails = 0;
    int32_t x[4] = {0};
    fails += RANK_CHECK(c, fsdp2_all_reduce_async(c->world, x, 4, FSDP2_I32, NULL, c->stream) ==
                               FSDP2_ERR_INVALID_ARGUMENT, "i32 reduction rejected");
    fails += RANK_CHECK(c, strstr(fsdp2_last_error(), "i32") != NULL, "message names i32");
    fails += RANK_CHECK(c, fsdp2_broadcast_async(c->world, x, 4, FSDP2_I32, c->size, c->stream) ==
                               FSDP2_ERR_INVALID_ARGUMENT, "root out of range");
    fsdp2_reduce_t bad = {FSDP2_REDUCE_SUM, 0.0, 1.0};
    fails += RANK_CHECK(c, fsdp2_all_reduce_async(c->world, x, 4, FSDP2_F32, &bad, c->stream) ==
                               FSDP2_ERR_INVALID_ARGUMENT, "pre_divide 0 rejected");
    /* gathers whose send overlaps the output other than in place (at 1 rank too: even a
     * lone rank's copy would read bytes it had already overwritten) */
    float g[4 * 4 + 2];
    fails += RANK_CHECK(c, fsdp2_all_gather_async(c->world, g + 4 * c->rank + 1, g, 4, FSDP2_F32,
                                                  c->stream) == FSDP2_ERR_INVALID_ARGUMENT &&
                               strstr(fsdp2_last_error(), "overlaps recv") != NULL,
                        "all_gather send inside recv, off its block: %s", fsdp2_last_error());
    fails += RANK_CHECK(c, fsdp2_reduce_scatter_async(c->world, g, g + 4 * c->rank + 1, 4,
                                                      FSDP2_F32, NULL, c->stream) ==
                                   FSDP2_ERR_INVALID_ARGUMENT &&
                               strstr(fsdp2_last_error(), "is not in place") != NULL,
                        "reduce_scatter into its own block of send, shifted: %s",
                        fsdp2_last_error());
    /* exactly on the next rank's block: this rank would write what that rank reads */
    fails += RANK_CHECK(c, c->size == 1 ||
                               (fsdp2_reduce_scatter_async(c->world, g,
                                                           g + 4 * ((c->rank + 1) % c->size), 4,
                                                           FSDP2_F32, NULL, c->stream) ==
                                    FSDP2_ERR_INVALID_ARGUMENT &&
                                strstr(fsdp2_last_error(), "is not in place") != NULL),
                        "reduce_scatter into the next rank's block of send: %s",
                        fsdp2_last_error());
    char bytes[4 * 8 + 8];
    fsdp2_iov_t pieces[4];
    size_t offsets[5] = {0};
    for (int r = 0; r < c->size; r++) {
        pieces[r] = (fsdp2_iov_t){bytes + 8 * r, 8};
        offsets[r + 1] = (size_t)r + 1;
    }
    /* send is the next rank's piece (the peers write it while it is read), or at 1 rank
     * this rank's own piece, shifted (not in place) */
    int next = (c->rank + 1) % c->size;
    const char *send = c->size > 1 ? bytes + 8 * next : bytes + 4;
    char want[64] = "is not in place";
    if (c->size > 1)
        snprintf(want, sizeof(want), "rank %d's pieces[%d]", next, next);
    fails += RANK_CHECK(c, fsdp2_all_gather_pieces_async(c->world, send, 8, pieces, offsets,
                                                         c->stream) == FSDP2_ERR_INVALID_ARGUMENT &&
                               strstr(fsdp2_last_error(), want) != NULL,
                        "pieces overlapping send: %s", fsdp2_last_error());
    /* nothing was enqueued: the group still works */
    float y[2] = {1, 2};
    fails += OK(c, fsdp2_all_reduce_async(c->world, y, 2, FSDP2_F32, NULL, c->stream));
    fails += sync_ok(c);
    fails += RANK_CHECK(c, y[0] == c->size && y[1] == 2 * c->size, "sum after errors");
    return fails;
}

static void run_all_sizes(rank_fn fn)
{
    for (int size = 1; size <= 4; size++) {
        ranks_result_t res;
        int failed = run_ranks(size, fn, NULL, 20000, 120, &res);
        ck_assert_msg(failed == 0, "world size %d: %d ranks failed (timed out: %d; statuses %d %d %d %d)",
                      size, failed, res.timed_out, res.status[0], res.status[1], res.status[2],
                      res.status[3]);
    }
}

START_TEST(all_gather_every_dtype_and_size_on_1_to_4_ranks) { run_all_sizes(body_all_gather); }
END_TEST
START_TEST(all_gather_into_scattered_pieces_on_1_to_4_ranks) { run_all_sizes(body_all_gather_pieces); }
END_TEST
START_TEST(all_gather_into_empty_pieces_and_of_no_bytes_on_1_to_4_ranks)
{
    run_all_sizes(body_all_gather_empty_pieces);
}
END_TEST
START_TEST(reduce_scatter_sum_avg_and_divide_factors_on_1_to_4_ranks) { run_all_sizes(body_reduce_scatter); }
END_TEST
START_TEST(all_reduce_uneven_counts_on_1_to_4_ranks) { run_all_sizes(body_all_reduce); }
END_TEST
START_TEST(sums_accumulate_in_f32_in_rank_order)
{
    run_all_sizes(body_sixteen_bit_sums);
}
END_TEST
START_TEST(random_sizes_of_every_operation_on_1_to_4_ranks)
{
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    const char *text = getenv("FSDP2_TEST_SEED");
    if (text && *text)
        seed = strtoull(text, NULL, 0);
    printf("random sizes: FSDP2_TEST_SEED=%llu\n", (unsigned long long)seed);
    fflush(stdout);
    for (int size = 1; size <= 4; size++) {
        ranks_result_t res;
        int failed = run_ranks(size, body_random_sizes, &seed, 20000, 120, &res);
        ck_assert_msg(failed == 0, "world size %d, FSDP2_TEST_SEED=%llu: %d ranks failed", size,
                      (unsigned long long)seed, failed);
    }
}
END_TEST
START_TEST(broadcast_from_every_root_and_barrier_on_1_to_4_ranks) { run_all_sizes(body_broadcast_and_barrier); }
END_TEST
START_TEST(collectives_on_two_streams_of_one_group_match_by_sequence) { run_all_sizes(body_two_streams); }
END_TEST
START_TEST(ranks_pinned_to_one_cpu_still_make_progress)
{
    for (int size = 2; size <= 4; size++) {
        ranks_result_t res;
        int failed = run_ranks(size, body_pinned_to_one_cpu, NULL, 20000, 90, &res);
        ck_assert_msg(failed == 0 && !res.timed_out, "world size %d: %d ranks failed (timed out: "
                      "%d)", size, failed, res.timed_out);
    }
}
END_TEST
START_TEST(bad_arguments_are_errors_and_leave_the_group_usable) { run_all_sizes(body_bad_arguments); }
END_TEST
START_TEST(destroying_a_group_waits_for_its_collectives_in_flight)
{
    run_all_sizes(body_destroy_with_collectives_in_flight);
}
END_TEST
START_TEST(more_reductions_in_flight_than_scratch_sets_do_not_deadlock)
{
    run_all_sizes(body_many_reductions_in_opposite_orders);
}
END_TEST

/* FSDP2_TEST_SANITIZED=1 (meson sets it in the sanitizer builds): the sanitizers look
 * for memory and thread errors on the paths, which the large sizes only take more times.
 * There the shared-memory slots, the one-step thresholds and the UCX reduction segments
 * are a sixteenth of their defaults, and the large sizes with them: the same steps, ring
 * wraps and segments on a sixteenth of the bytes. The normal build runs the defaults. */
static void scale_for_sanitizers(void)
{
    static const char *const scaled[][2] = {
        {"FSDP2_SHM_SLOT_BYTES", "16K"},     /* 256 KiB */
        {"FSDP2_SHM_ONE_STEP_MAX", "1K"},    /* 16 KiB */
        {"FSDP2_SHM_ONE_STEP_PAIR_MIN", "12K"}, /* 192 KiB */
        {"FSDP2_UCX_SEGMENT_BYTES", "64K"}}; /* 1 MiB */
    const char *v = getenv("FSDP2_TEST_SANITIZED");
    if (!v || strcmp(v, "1") != 0)
        return;
    for (size_t i = 0; i < COUNT(scaled); i++)
        setenv(scaled[i][0], scaled[i][1], 0);
    sizes[COUNT(sizes) - 1] /= 16;
    all_reduce_counts[COUNT(all_reduce_counts) - 1] /= 16;
}

static Suite *collectives_suite(void)
{
    scale_for_sanitizers();
    Suite *s = suite_create("collectives");
    TCase *ok = tcase_create("ucx");
    tcase_set_timeout(ok, 300);
    tcase_add_test(ok, all_gather_every_dtype_and_size_on_1_to_4_ranks);
    tcase_add_test(ok, all_gather_into_scattered_pieces_on_1_to_4_ranks);
    tcase_add_test(ok, all_gather_into_empty_pieces_and_of_no_bytes_on_1_to_4_ranks);
    tcase_add_test(ok, reduce_scatter_sum_avg_and_divide_factors_on_1_to_4_ranks);
    tcase_add_test(ok, sums_accumulate_in_f32_in_rank_order);
    tcase_add_test(ok, random_sizes_of_every_operation_on_1_to_4_ranks);
    tcase_add_test(ok, all_reduce_uneven_counts_on_1_to_4_ranks);
    tcase_add_test(ok, broadcast_from_every_root_and_barrier_on_1_to_4_ranks);
    tcase_add_test(ok, collectives_on_two_streams_of_one_group_match_by_sequence);
    tcase_add_test(ok, bad_arguments_are_errors_and_leave_the_group_usable);
    tcase_add_test(ok, ranks_pinned_to_one_cpu_still_make_progress);
    tcase_add_test(ok, more_reductions_in_flight_than_scratch_sets_do_not_deadlock);
    tcase_add_test(ok, destroying_a_group_waits_for_its_collectives_in_flight);
    suite_add_tcase(s, ok);
    return s;
}

FSDP2_CHECK_MAIN(collectives_suite)
