/* Single-copy collectives (lib/collectives/shm_direct.c) with real processes on 2, 3 and
 * 4 ranks whose buffers come from fsdp2_device_alloc (the shareable cpu arena):
 * all-reduce, reduce-scatter, all-gather (also into pieces) and broadcast.
 *
 * References: every rank's input is a closed form of (rank, index) with fractions, so
 * sums round; the test sums them itself in rank order in the accumulation type (f32
 * for f32, bf16 and f16, rounded once; f64 for f64) and wants the same bits, which is
 * also what the slots give. The group's counters say which way each collective went:
 * single-copy when every rank's buffers are shareable, through the slots (and still
 * right) when one rank's are not, and not even announced when one rank switched
 * single-copy off. A rank that dies makes the others fail, not hang. */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../core/check_main.h"
#include "collectives/shm_internal.h"
#include "collectives/ucx_internal.h"
#include "core/env_internal.h"
#include "elements.h"
#include "ranks.h"

#define OK(ctx, call) RANK_CHECK(ctx, (call) == FSDP2_SUCCESS, "%s: %s", #call, fsdp2_last_error())

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;

static size_t esize(fsdp2_dtype_t t)
{
    size_t b = 0;
    fsdp2_dtype_size(t, &b);
    return b;
}

/* Rank r's element i before conversion: eighths and sixty-fourths up to about 40, so
 * that f16 and bf16 round some of them and most sums round in f32. */
static double value(int rank, size_t i)
{
    long k = (long)((i * 2654435761u + (size_t)rank * 40503u) % 5001u) - 2500;
    return (double)k / 64.0 + (double)((i + (size_t)rank) % 7) / 8.0;
}

/* What value() becomes in t, back as a double (exact). f64 and f32 round as C does;
 * the 16-bit types through the library's conversion, which their tests check. */
static double stored(fsdp2_dtype_t t, int rank, size_t i)
{
    double v = value(rank, i), back;
    if (t == FSDP2_F64)
        return v;
    if (t == FSDP2_F32)
        return (double)(float)v;
    char cell[8];
    fsdp2_convert(cell, t, &v, FSDP2_F64, 1);
    fsdp2_convert(&back, FSDP2_F64, cell, t, 1);
    return back;
}

static void fill(void *p, fsdp2_dtype_t t, int rank, size_t n, size_t base)
{
    FILL_CHUNKED(p, t, n, value, rank, base);
}

/* Element i reduced over ranks in rank order, as the library promises, written into
 * out (one element of t): each input divided by pre, summed, divided by post. */
static void reference(fsdp2_dtype_t t, int size, size_t i, double pre, double post, void *out)
{
    if (t == FSDP2_F64) {
        double acc = 0;
        for (int r = 0; r < size; r++) {
            double v = stored(t, r, i) / pre;
            acc = r == 0 ? v : acc + v;
        }
        acc = acc / post;
        memcpy(out, &acc, 8);
        return;
    }
    float acc = 0;
    for (int r = 0; r < size; r++) {
        float v = (float)stored(t, r, i);
        if (pre != 1.0)
            v = v / (float)pre;
        acc = r == 0 ? v : acc + v;
    }
    if (post != 1.0)
        acc = acc / (float)post;
    if (t == FSDP2_F32)
        memcpy(out, &acc, 4);
    else
        fsdp2_convert(out, t, &acc, FSDP2_F32, 1);
}

static void *device_alloc(rank_ctx_t *c, size_t bytes, int *fails)
{
    void *p = NULL;
    *fails += OK(c, fsdp2_device_alloc(CPU, bytes, &p));
    return p;
}

static int same_bits(rank_ctx_t *c, const char *what, fsdp2_dtype_t t, const void *got,
                     const void *want, size_t i)
{
    if (memcmp(got, want, esize(t)) == 0)
        return 0;
    double g, w;
    fsdp2_convert(&g, FSDP2_F64, got, t, 1);
    fsdp2_convert(&w, FSDP2_F64, want, t, 1);
    return RANK_CHECK(c, memcmp(got, want, esize(t)) == 0, "%s %s element %zu: %.9g, want %.9g",
                      what, fsdp2_dtype_name(t), i, g, w);
}

typedef struct shape {
    fsdp2_dtype_t dtype;
    size_t count; /* elements per rank (reduce-scatter, all-gather) or in all */
} shape_t;

/* Not multiples of the ranks, of a cache line or of the 64 KiB blocks, and one that is
 * just the smallest buffer the arena takes (ARENA_MIN). */
#define ARENA_MIN (64u << 10)
static shape_t shapes[] = {
    {FSDP2_F32, ARENA_MIN / 4}, {FSDP2_F32, 300007}, {FSDP2_BF16, 180001},
    {FSDP2_F16, 70003},         {FSDP2_F64, 90011},
};

/* FSDP2_TEST_SANITIZED=1 (meson sets it in the sanitizer builds): the sanitizers look for
 * memory and thread errors on the paths, which the larger shapes only take more times.
 * There the blocks, copies and pair chunks are a quarter of their defaults and the
 * shapes with them (never under ARENA_MIN, which the arena would not take): the same
 * pieces on a quarter of the bytes. */
static void scale_for_sanitizers(void)
{
    static const char *const scaled[][2] = {{"FSDP2_SHM_DIRECT_BLOCK", "16K"},  /* 64 KiB */
                                            {"FSDP2_SHM_DIRECT_COPY", "64K"},   /* 256 KiB */
                                            {"FSDP2_SHM_PAIR_CHUNK", "4K"}};    /* 16 KiB */
    const char *v = getenv("FSDP2_TEST_SANITIZED");
    if (!v || strcmp(v, "1") != 0)
        return;
    for (size_t i = 0; i < sizeof(scaled) / sizeof(scaled[0]); i++)
        setenv(scaled[i][0], scaled[i][1], 0);
    for (size_t k = 1; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        size_t least = ARENA_MIN / esize(shapes[k].dtype) + 3;
        shapes[k].count = shapes[k].count / 4 > least ? shapes[k].count / 4 : least;
    }
}

static int run_all_reduce(rank_ctx_t *c, fsdp2_group_t *g, shape_t s, const fsdp2_reduce_t *red,
                          int shareable)
{
    int fails = 0;
    size_t bytes = s.count * esize(s.dtype);
    char *buf = shareable ? device_alloc(c, bytes, &fails) : malloc(bytes);
    fill(buf, s.dtype, c->rank, s.count, 0);
    fails += OK(c, fsdp2_all_reduce_async(g, buf, s.count, s.dtype, red, c->stream));
    fails += OK(c, fsdp2_stream_synchronize(c->stream));
    double pre = red ? red->pre_divide : 1.0;
    double post = red ? red->post_divide * (red->op == FSDP2_REDUCE_AVG ? c->size : 1) : 1.0;
    char want[8];
    for (size_t i = 0; i < s.count && !fails; i++) {
        reference(s.dtype, c->size, i, pre, post, want);
        fails += same_bits(c, "all_reduce", s.dtype, buf + i * esize(s.dtype), want, i);
    }
    if (shareable)
        fsdp2_device_free(CPU, buf);
    else
        free(buf);
    return fails;
}

/* Out of place, then in place (the other blocks of send must come through unchanged). */
static int run_reduce_scatter(rank_ctx_t *c, fsdp2_group_t *g, shape_t s, int shareable)
{
    int fails = 0;
    size_t es = esize(s.dtype), total = s.count * (size_t)c->size, base = (size_t)c->rank * s.count;
    char *send = shareable ? device_alloc(c, total * es, &fails) : malloc(total * es);
    char *recv = malloc(s.count * es); /* this rank's own output: any memory */
    fsdp2_reduce_t avg = FSDP2_REDUCE_AVG_INIT;
    for (int in_place = 0; in_place < 2 && !fails; in_place++) {
        char *out = in_place ? send + base * es : recv;
        fill(send, s.dtype, c->rank, total, 0);
        fails += OK(c, fsdp2_reduce_scatter_async(g, send, out, s.count, s.dtype,
                                                  in_place ? &avg : NULL, c->stream));
        fails += OK(c, fsdp2_stream_synchronize(c->stream));
        char want[8];
        for (size_t i = 0; i < s.count && !fails; i++) {
            reference(s.dtype, c->size, base + i, 1.0, in_place ? c->size : 1.0, want);
            fails += same_bits(c, in_place ? "reduce_scatter in place" : "reduce_scatter",
                               s.dtype, out + i * es, want, base + i);
        }
        elements_t sent;
        elements_init(&sent, send, s.dtype, total);
        for (size_t i = 0; in_place && i < total && !fails; i++)
            if (i / s.count != (size_t)c->rank) {
                double v = stored(s.dtype, c->rank, i), got = element(&sent, i);
                fails += RANK_CHECK(c, got == v, "reduce_scatter in place changed send "
                                    "element %zu: %g, want %g", i, got, v);
            }
    }
    if (shareable)
        fsdp2_device_free(CPU, send);
    else
        free(send);
    free(recv);
    return fails;
}

/* Out of place, then in place (send is this rank's block of recv). */
static int run_all_gather(rank_ctx_t *c, fsdp2_group_t *g, shape_t s, int shareable)
{
    int fails = 0;
    size_t es = esize(s.dtype), total = s.count * (size_t)c->size;
    char *recv = shareable ? device_alloc(c, total * es, &fails) : malloc(total * es);
    char *send = malloc(s.count * es);
    for (int in_place = 0; in_place < 2 && !fails; in_place++) {
        char *in = in_place ? recv + (size_t)c->rank * s.count * es : send;
        memset(recv, 0xab, total * es);
        fill(in, s.dtype, c->rank, s.count, 0);
        fails += OK(c, fsdp2_all_gather_async(g, in, recv, s.count, s.dtype, c->stream));
        fails += OK(c, fsdp2_stream_synchronize(c->stream));
        elements_t gathered;
        elements_init(&gathered, recv, s.dtype, total);
        for (size_t i = 0; i < total && !fails; i++) {
            int r = (int)(i / s.count);
            double got = element(&gathered, i), want = stored(s.dtype, r, i % s.count);
            fails += RANK_CHECK(c, got == want, "all_gather%s %s element %zu: %g, want %g",
                                in_place ? " in place" : "", fsdp2_dtype_name(s.dtype), i, got,
                                want);
        }
    }
    if (shareable)
        fsdp2_device_free(CPU, recv);
    else
        free(recv);
    free(send);
    return fails;
}

/* f32 elements per rank into three pieces per rank: the rest first in the block, last
 * in the list; in place, this rank's first piece is its input itself. */
static int run_all_gather_pieces(rank_ctx_t *c, fsdp2_group_t *g, size_t count, int shareable)
{
    int fails = 0, n = c->size;
    size_t bytes = count * 4, a = 4 * (count / 3), b = 4 * (count / 5), rest = bytes - a - b;
    float *send = shareable ? device_alloc(c, bytes, &fails) : malloc(bytes);
    char *dest = malloc((size_t)n * bytes);
    fsdp2_iov_t pieces[3 * 4];
    size_t offsets[5] = {0};
    for (int in_place = 0; in_place < 2 && !fails; in_place++) {
        for (int r = 0; r < n; r++) {
            char *block = dest + (size_t)r * bytes;
            pieces[3 * r] = (fsdp2_iov_t){block + rest, a};
            pieces[3 * r + 1] = (fsdp2_iov_t){block + rest + a, b};
            pieces[3 * r + 2] = (fsdp2_iov_t){block, rest};
            offsets[r + 1] = offsets[r] + 3;
        }
        if (in_place)
            pieces[3 * c->rank].data = send;
        memset(dest, 0xab, (size_t)n * bytes);
        fill(send, FSDP2_F32, c->rank, count, 0);
        fails += OK(c, fsdp2_all_gather_pieces_async(g, send, bytes, pieces, offsets, c->stream));
        fails += OK(c, fsdp2_stream_synchronize(c->stream));
        for (int r = 0; r < n && !fails; r++)
            for (size_t i = 0; i < count && !fails; i++) {
                size_t at = 4 * i; /* where byte at of rank r's input went */
                const char *p = at < a ? (const char *)pieces[3 * r].data + at
                                : at < a + b ? (const char *)pieces[3 * r + 1].data + (at - a)
                                : (const char *)pieces[3 * r + 2].data + (at - a - b);
                float got;
                memcpy(&got, p, 4);
                fails += RANK_CHECK(c, got == (float)stored(FSDP2_F32, r, i),
                                    "all_gather_pieces%s rank %d element %zu: %g, want %g",
                                    in_place ? " in place" : "", r, i, (double)got,
                                    stored(FSDP2_F32, r, i));
            }
    }
    if (shareable)
        fsdp2_device_free(CPU, send);
    else
        free(send);
    free(dest);
    return fails;
}

static int run_broadcast(rank_ctx_t *c, fsdp2_group_t *g, shape_t s, int root, int shareable)
{
    int fails = 0;
    size_t es = esize(s.dtype);
    char *buf = shareable ? device_alloc(c, s.count * es, &fails) : malloc(s.count * es);
    fill(buf, s.dtype, c->rank, s.count, 0);
    fails += OK(c, fsdp2_broadcast_async(g, buf, s.count, s.dtype, root, c->stream));
    fails += OK(c, fsdp2_stream_synchronize(c->stream));
    elements_t got_all;
    elements_init(&got_all, buf, s.dtype, s.count);
    for (size_t i = 0; i < s.count && !fails; i++) {
        double got = element(&got_all, i), want = stored(s.dtype, root, i);
        fails += RANK_CHECK(c, got == want, "broadcast from %d %s element %zu: %g, want %g",
                            root, fsdp2_dtype_name(s.dtype), i, got, want);
    }
    if (shareable)
        fsdp2_device_free(CPU, buf);
    else
        free(buf);
    return fails;
}

static shm_group_t *shm_of(fsdp2_group_t *g) { return ((ucx_group_t *)g->backend)->shm; }

/* Every collective of every shape; `shareable(rank)` says whose buffers are. Returns
 * the failures; *collectives counts the collectives run (each announces). */
static int run_every_collective(rank_ctx_t *c, int shareable, int *collectives)
{
    int fails = 0;
    fsdp2_reduce_t sum_halves = {FSDP2_REDUCE_SUM, 2.0, 1.0}, avg = FSDP2_REDUCE_AVG_INIT;
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]) && !fails; k++) {
        shape_t s = shapes[k];
        fails += run_all_reduce(c, c->world, s, NULL, shareable);
        fails += run_all_reduce(c, c->world, s, k % 2 ? &avg : &sum_halves, shareable);
        fails += run_reduce_scatter(c, c->world, s, shareable); /* two */
        fails += run_all_gather(c, c->world, s, shareable);     /* two */
        fails += run_broadcast(c, c->world, s, 0, shareable);
        fails += run_broadcast(c, c->world, s, c->size - 1, shareable);
        fails += run_all_gather_pieces(c, c->world, s.count, shareable); /* two */
        *collectives += 10;
    }
    return fails;
}

/* The group's counts of single-copy and declined collectives must be these. */
static int counted(rank_ctx_t *c, const shm_group_t *sg, uint64_t ran, uint64_t declined)
{
    return RANK_CHECK(c, sg->direct_ran == ran && sg->direct_declined == declined,
                      "%llu single-copy and %llu declined, want %llu and %llu",
                      (unsigned long long)sg->direct_ran, (unsigned long long)sg->direct_declined,
                      (unsigned long long)ran, (unsigned long long)declined);
}

/* Three ranks run body; all must pass. */
static void three_ranks(rank_fn body)
{
    ranks_result_t res;
    int failed = run_ranks(3, body, NULL, 60000, 240, &res);
    ck_assert_msg(failed == 0 && !res.timed_out, "statuses %d %d %d", res.status[0],
                  res.status[1], res.status[2]);
}

static int body_every_rank_shareable(rank_ctx_t *c)
{
    int fails = 0, collectives = 0;
    shm_group_t *sg = shm_of(c->world);
    fails += RANK_CHECK(c, sg && sg->direct_policy, "the group does not allow single-copy");
    if (fails)
        return fails;
    fails += run_every_collective(c, 1, &collectives);
    fails += counted(c, sg, (uint64_t)collectives, 0);
    /* the first (an all-reduce) agreed on every rank's arena: none after it took a
     * verdict step */
    fails += RANK_CHECK(c, sg->direct_verdicts == 1, "%llu verdict steps, want 1",
                        (unsigned long long)sg->direct_verdicts);
    return fails;
}

START_TEST(single_copy_collectives_give_the_rank_order_sums_on_2_3_and_4_ranks)
{
    for (int size = 2; size <= 4; size++) {
        ranks_result_t res;
        int failed = run_ranks(size, body_every_rank_shareable, NULL, 60000, 240, &res);
        ck_assert_msg(failed == 0 && !res.timed_out, "%d ranks: statuses %d %d %d %d", size,
                      res.status[0], res.status[1], res.status[2], res.status[3]);
    }
}
END_TEST

/* How much each rank copies or sums at a time is its own choice: the ranks of one group
 * run with different FSDP2_SHM_DIRECT_BLOCK, FSDP2_SHM_DIRECT_COPY, FSDP2_SHM_PAIR_CHUNK
 * and FSDP2_SHM_STREAM_MIN (down to 64 bytes), and every collective still gives the
 * rank-order sums. */
static int body_per_rank_chunks(rank_ctx_t *c)
{
    static const char *const sizes[3][4] = {{"64", "4K", "64", "64"},
                                            {"4K", "64", "1K", "1M"},
                                            {"1M", "1M", "16K", "16K"}};
    static const char *const names[4] = {"FSDP2_SHM_DIRECT_BLOCK", "FSDP2_SHM_DIRECT_COPY",
                                         "FSDP2_SHM_PAIR_CHUNK", "FSDP2_SHM_STREAM_MIN"};
    for (int i = 0; i < 4; i++)
        setenv(names[i], sizes[c->rank % 3][i], 1);
    int fails = OK(c, fsdp2_env_reload()), collectives = 0;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 60000;
    fsdp2_group_t *g = NULL, *world = c->world;
    fails += OK(c, fsdp2_group_create(c->store, "chunks", c->rank, c->size, &go, &g));
    if (!fails) {
        c->world = g;
        fails += run_every_collective(c, 1, &collectives);
        fails += counted(c, shm_of(g), (uint64_t)collectives, 0);
        c->world = world;
    }
    fsdp2_group_destroy(g);
    for (int i = 0; i < 4; i++)
        unsetenv(names[i]);
    return fails + OK(c, fsdp2_env_reload());
}

START_TEST(ranks_may_copy_and_sum_in_pieces_of_their_own_size)
{
    three_ranks(body_per_rank_chunks);
}
END_TEST

/* Rank 1's buffers are plain malloc: every collective announces, sees that, and goes
 * through the slots on every rank, with the same results. */
static int body_one_rank_not_shareable(rank_ctx_t *c)
{
    int fails = 0, collectives = 0;
    shm_group_t *sg = shm_of(c->world);
    fails += run_every_collective(c, c->rank != 1, &collectives);
    fails += counted(c, sg, 0, (uint64_t)collectives);
    return fails;
}

START_TEST(one_rank_without_shareable_buffers_sends_every_rank_through_the_slots)
{
    three_ranks(body_one_rank_not_shareable);
}
END_TEST

/* A single-copy broadcast from rank 0 (rank 1 maps nothing for it, and the group agrees
 * on no arenas), then rank 1 takes rank 0's arena as unmappable (what another pid
 * namespace gives): the next collective announces, rank 1's verdict is no, every rank
 * goes through the slots, and the group announces nothing after that. */
static int body_one_rank_cannot_map(rank_ctx_t *c)
{
    int fails = 0, collectives = 0;
    shm_group_t *sg = shm_of(c->world);
    fails += run_broadcast(c, c->world, shapes[1], 0, 1);
    fails += counted(c, sg, 1, 0);
    if (c->rank == 1 && !fails) {
        direct_peer_t *p = &sg->peers[0];
        const direct_desc_t *d = &sg->descs[(size_t)((sg->direct_runs - 1) % 2) *
                                            (size_t)c->size];
        fails += RANK_CHECK(c, p->map == NULL, "rank 0's arena is mapped");
        fails += RANK_CHECK(c, !p->agreed, "the group agreed on arenas after a broadcast");
        *p = (direct_peer_t){.pid = d->pid, .fd = d->fd, .bytes = d->arena_bytes,
                             .nonce = d->nonce, .failed = 1};
    }
    fails += run_every_collective(c, 1, &collectives);
    fails += counted(c, sg, 1, 1);
    fails += RANK_CHECK(c, !sg->direct_policy, "single-copy still allowed");
    return fails;
}

START_TEST(a_rank_that_cannot_map_a_peer_sends_every_rank_through_the_slots)
{
    three_ranks(body_one_rank_cannot_map);
}
END_TEST

/* FSDP2_SHM_SINGLE_COPY=off on the last rank only: the group agrees at set-up, and no
 * collective even announces. */
static int body_one_rank_switched_off(rank_ctx_t *c)
{
    int fails = 0, collectives = 0;
    if (c->rank == c->size - 1)
        setenv("FSDP2_SHM_SINGLE_COPY", "off", 1);
    fails += OK(c, fsdp2_env_reload());
    fsdp2_group_t *g = NULL;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    fails += OK(c, fsdp2_group_create(c->store, "single-copy-off", c->rank, c->size, &go, &g));
    if (fails)
        return fails;
    shm_group_t *sg = shm_of(g);
    fails += RANK_CHECK(c, sg && !sg->direct_policy, "rank %d off, yet the group allows it",
                        c->size - 1);
    fsdp2_group_t *world = c->world;
    c->world = g;
    fails += run_every_collective(c, 1, &collectives);
    c->world = world;
    fails += counted(c, sg, 0, 0);
    fsdp2_group_destroy(g);
    return fails;
}

START_TEST(single_copy_switched_off_on_one_rank_is_off_for_the_group)
{
    three_ranks(body_one_rank_switched_off);
}
END_TEST

/* The last rank dies before its all-reduce: the others fail with an error naming a peer
 * well before the group's timeout, instead of hanging in the first step. */
static int body_rank_dies(rank_ctx_t *c)
{
    int fails = 0;
    size_t n = (4u << 20) / 4;
    float *buf = device_alloc(c, n * 4, &fails);
    for (size_t i = 0; i < n; i++)
        buf[i] = 1.0f;
    fails += OK(c, fsdp2_all_reduce_async(c->world, buf, n, FSDP2_F32, NULL, c->stream));
    fails += OK(c, fsdp2_stream_synchronize(c->stream)); /* once single-copy, all mapped */
    if (c->rank == c->size - 1)
        raise(SIGKILL);
    fsdp2_status_t s = fsdp2_all_reduce_async(c->world, buf, n, FSDP2_F32, NULL, c->stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(c->stream);
    fails += RANK_CHECK(c, s == FSDP2_ERR_PEER_FAILED, "status %s (%s)", fsdp2_status_name(s),
                        fsdp2_last_error());
    return fails;
}

START_TEST(a_rank_dying_before_a_single_copy_collective_fails_the_others)
{
    ranks_result_t res;
    run_ranks(3, body_rank_dies, NULL, 60000, 50, &res);
    ck_assert_msg(!res.timed_out, "the ranks hung");
    ck_assert_msg(res.status[0] == 0 && res.status[1] == 0 && res.status[2] == 128 + SIGKILL,
                  "statuses %d %d %d", res.status[0], res.status[1], res.status[2]);
}
END_TEST

static Suite *shm_direct_suite(void)
{
    scale_for_sanitizers();
    Suite *s = suite_create("shm_direct");
    TCase *tc = tcase_create("single_copy");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, single_copy_collectives_give_the_rank_order_sums_on_2_3_and_4_ranks);
    tcase_add_test(tc, ranks_may_copy_and_sum_in_pieces_of_their_own_size);
    tcase_add_test(tc, one_rank_without_shareable_buffers_sends_every_rank_through_the_slots);
    tcase_add_test(tc, a_rank_that_cannot_map_a_peer_sends_every_rank_through_the_slots);
    tcase_add_test(tc, single_copy_switched_off_on_one_rank_is_off_for_the_group);
    tcase_add_test(tc, a_rank_dying_before_a_single_copy_collective_fails_the_others);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(shm_direct_suite)
