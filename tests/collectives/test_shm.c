/* The shared-memory transport (lib/collectives/shm.c), with real processes on 2, 3 and
 * 4 ranks: sizes on both sides of a slot (256 KiB) and long enough to wrap each rank's
 * ring of slots several times, every collective checked element-wise against values
 * the test computes; identical bits to the UCX transport (FSDP2_SHM=off) for sums that
 * round; the same values whether slots and outputs are written with non-temporal
 * stores or not; pieces gathers with pieces in place, apart, or both, and an input
 * overlapping this rank's pieces refused; and failures: a rank killed inside a large collective, and an abort, each
 * an error on every survivor well before the timeout, with nothing left in /dev/shm. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/check_main.h"
#include "collectives/shm_internal.h"
#include "collectives/ucx_internal.h"
#include "core/env_internal.h"
#include "elements.h"
#include "ranks.h"

#define OK(ctx, call) RANK_CHECK(ctx, (call) == FSDP2_SUCCESS, "%s", #call)
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define SLOT (256 << 10)

static size_t esize(fsdp2_dtype_t t)
{
    size_t b = 0;
    fsdp2_dtype_size(t, &b);
    return b;
}

/* Small integers: exact in every dtype, and so are their sums over 4 ranks. */
static double pattern(int rank, size_t i)
{
    return (double)((int)((i * 7 + (size_t)rank * 13) % 29) - 14);
}

static void fill(void *p, fsdp2_dtype_t t, int rank, size_t n, size_t base)
{
    FILL_CHUNKED(p, t, n, pattern, rank, base);
}

static double sum_over_ranks(int size, size_t i)
{
    double s = 0;
    for (int r = 0; r < size; r++)
        s += pattern(r, i);
    return s;
}

static int sync_ok(rank_ctx_t *c)
{
    return RANK_CHECK(c, fsdp2_stream_synchronize(c->stream) == FSDP2_SUCCESS, "synchronize: %s",
                      fsdp2_last_error());
}

typedef struct size_case {
    fsdp2_dtype_t dtype;
    size_t count; /* elements per rank */
} size_case_t;

/* Just under, at and over one slot; and 5+ slots (past the ring of 4). */
static const size_case_t cases[] = {
    {FSDP2_F32, SLOT / 4 - 1}, {FSDP2_F32, SLOT / 4},      {FSDP2_F32, SLOT / 4 + 1},
    {FSDP2_F32, 5 * SLOT / 4 + 3}, {FSDP2_BF16, 3 * SLOT / 2 + 5}, {FSDP2_F64, 2 * SLOT / 8 + 7},
    /* at 2 ranks, all-reduces from 192 KiB up to a slot take one step; just below, two */
    {FSDP2_F16, (192u << 10) / 2 - 1}, {FSDP2_F16, (192u << 10) / 2},
};

/* All-reduces from 16 MiB reduce straight into the slots (all_reduce_fused). */
static const size_case_t large_all_reduces[] = {{FSDP2_F32, (4u << 20) + 5}, {FSDP2_BF16, 8u << 20}};

/* FSDP2_TEST_SANITIZED=1 (meson sets it in the sanitizer builds): where a case is large
 * only to take more steps than a smaller one that reaches the same code (with small
 * slots, or to compare bits over many rounds), the sanitizers get the smaller one; the
 * normal build runs every size. */
static int sanitized(void)
{
    const char *v = getenv("FSDP2_TEST_SANITIZED");
    return v && strcmp(v, "1") == 0;
}

/* A collective is large from 16 MiB: all-reduces fuse (FSDP2_SHM_FUSED_MIN) and outputs
 * stream (FSDP2_SHM_STREAM_OUTPUT_MIN). Under the sanitizers large_thresholds lowers both
 * to 1 MiB and large() divides the large cases' counts by 16 with them: the same paths on
 * a sixteenth of the bytes. */
#define LARGE_DIV 16

static size_t large(size_t count)
{
    return sanitized() ? count / LARGE_DIV : count;
}

static void large_thresholds(void)
{
    if (sanitized()) {
        setenv("FSDP2_SHM_FUSED_MIN", "1M", 1);
        setenv("FSDP2_SHM_STREAM_OUTPUT_MIN", "1M", 1);
    } else {
        unsetenv("FSDP2_SHM_FUSED_MIN");
        unsetenv("FSDP2_SHM_STREAM_OUTPUT_MIN");
    }
}

static int check_all_gather(rank_ctx_t *c, fsdp2_dtype_t t, size_t n)
{
    int fails = 0;
    char *send = malloc(n * esize(t)), *recv = malloc(n * esize(t) * c->size);
    fill(send, t, c->rank, n, 0);
    memset(recv, 0xab, n * esize(t) * c->size);
    fails += OK(c, fsdp2_all_gather_async(c->world, send, recv, n, t, c->stream));
    fails += sync_ok(c);
    elements_t got;
    elements_init(&got, recv, t, n * (size_t)c->size);
    for (int r = 0; r < c->size && !fails; r++)
        for (size_t i = 0; i < n && !fails; i++)
            fails += RANK_CHECK(c, element(&got, r * n + i) == pattern(r, i),
                                "all_gather %s n=%zu rank %d element %zu: %g, want %g",
                                fsdp2_dtype_name(t), n, r, i, element(&got, r * n + i),
                                pattern(r, i));
    free(send);
    free(recv);
    return fails;
}

/* Out of place, then in place (recv is this rank's block of send: the other blocks must
 * come through unchanged). */
static int check_reduce_scatter(rank_ctx_t *c, fsdp2_dtype_t t, size_t n)
{
    int fails = 0;
    size_t total = n * (size_t)c->size, base = (size_t)c->rank * n;
    char *send = malloc(total * esize(t)), *recv = malloc(n * esize(t));
    for (int in_place = 0; in_place < 2 && !fails; in_place++) {
        char *out = in_place ? send + base * esize(t) : recv;
        fill(send, t, c->rank, total, 0);
        fails += OK(c, fsdp2_reduce_scatter_async(c->world, send, out, n, t, NULL, c->stream));
        fails += sync_ok(c);
        elements_t got, sent;
        elements_init(&got, out, t, n);
        elements_init(&sent, send, t, total);
        for (size_t i = 0; i < n && !fails; i++)
            fails += RANK_CHECK(c, element(&got, i) == sum_over_ranks(c->size, base + i),
                                "reduce_scatter%s %s n=%zu element %zu: %g, want %g",
                                in_place ? " in place" : "", fsdp2_dtype_name(t), n, i,
                                element(&got, i), sum_over_ranks(c->size, base + i));
        for (size_t i = 0; in_place && i < total && !fails; i++)
            if (i / n != (size_t)c->rank)
                fails += RANK_CHECK(c, element(&sent, i) == pattern(c->rank, i),
                                    "reduce_scatter in place %s n=%zu changed send element "
                                    "%zu: %g, want %g", fsdp2_dtype_name(t), n, i,
                                    element(&sent, i), pattern(c->rank, i));
    }
    free(send);
    free(recv);
    return fails;
}

static int check_all_reduce(rank_ctx_t *c, fsdp2_dtype_t t, size_t n)
{
    int fails = 0;
    char *buf = malloc(n * esize(t));
    fill(buf, t, c->rank, n, 0);
    fails += OK(c, fsdp2_all_reduce_async(c->world, buf, n, t, NULL, c->stream));
    fails += sync_ok(c);
    elements_t got;
    elements_init(&got, buf, t, n);
    for (size_t i = 0; i < n && !fails; i++)
        fails += RANK_CHECK(c, element(&got, i) == sum_over_ranks(c->size, i),
                            "all_reduce %s n=%zu element %zu: %g, want %g", fsdp2_dtype_name(t),
                            n, i, element(&got, i), sum_over_ranks(c->size, i));
    free(buf);
    return fails;
}

static int check_broadcast(rank_ctx_t *c, fsdp2_dtype_t t, size_t n)
{
    int fails = 0, root = c->size - 1;
    char *buf = malloc(n * esize(t));
    fill(buf, t, c->rank, n, 0);
    fails += OK(c, fsdp2_broadcast_async(c->world, buf, n, t, root, c->stream));
    fails += sync_ok(c);
    elements_t got;
    elements_init(&got, buf, t, n);
    for (size_t i = 0; i < n && !fails; i++)
        fails += RANK_CHECK(c, element(&got, i) == pattern(root, i),
                            "broadcast %s n=%zu element %zu", fsdp2_dtype_name(t), n, i);
    free(buf);
    return fails;
}

/* Rank r's `bytes` bytes over three pieces of a, b and the rest bytes, in its region at
 * dest + r * stride: in address order, or rotated (the rest first in the region, last
 * in the list). */
static void three_pieces(int size, unsigned char *dest, size_t stride, size_t bytes, size_t a,
                         size_t b, int rotated, fsdp2_iov_t *pieces, size_t *offsets)
{
    size_t rest = bytes - a - b, at = rotated ? rest : 0;
    offsets[0] = 0;
    for (int r = 0; r < size; r++) {
        unsigned char *base = dest + (size_t)r * stride;
        pieces[3 * r] = (fsdp2_iov_t){base + at, a};
        pieces[3 * r + 1] = (fsdp2_iov_t){base + at + a, b};
        pieces[3 * r + 2] = (fsdp2_iov_t){rotated ? base : base + a + b, rest};
        offsets[r + 1] = offsets[r] + 3;
    }
}

/* Rank r's bytes over three pieces whose boundaries fall inside slots. */
static int check_all_gather_pieces(rank_ctx_t *c)
{
    int fails = 0;
    const size_t bytes = 3 * SLOT + 1001;
    unsigned char *send = malloc(bytes), *dest = malloc(c->size * bytes);
    for (size_t i = 0; i < bytes; i++)
        send[i] = (unsigned char)(i * 31 + (size_t)c->rank * 7);
    fsdp2_iov_t pieces[4 * 3];
    size_t offsets[5];
    three_pieces(c->size, dest, bytes, bytes, SLOT + 100, SLOT / 3, 1, pieces, offsets);
    fails += OK(c, fsdp2_all_gather_pieces_async(c->world, send, bytes, pieces, offsets, c->stream));
    fails += sync_ok(c);
    for (int r = 0; r < c->size && !fails; r++) {
        size_t k = 0;
        for (int p = 0; p < 3; p++) {
            const unsigned char *d = pieces[3 * r + p].data;
            for (size_t i = 0; i < pieces[3 * r + p].bytes && !fails; i++, k++)
                fails += RANK_CHECK(c, d[i] == (unsigned char)(k * 31 + (size_t)r * 7),
                                    "pieces: rank %d byte %zu", r, k);
        }
    }
    free(send);
    free(dest);
    return fails;
}

static unsigned char in_place_pattern(int rank, size_t i)
{
    return (unsigned char)(i * 13 + (size_t)rank * 5);
}

/* This rank's input already where its pieces are (in place): all three pieces, or only
 * the first with the other two in a buffer apart (mixed: those are copied before any
 * bytes go out). Pieces cross slot boundaries. */
static int check_all_gather_pieces_in_place(rank_ctx_t *c, int mixed)
{
    int fails = 0;
    const size_t bytes = 3 * SLOT + 1001, region = bytes + 256;
    const size_t a = SLOT / 2 + 7, b = 2 * SLOT + 3;
    unsigned char *dest = calloc((size_t)c->size, region);
    unsigned char *apart = calloc((size_t)c->size, region);
    unsigned char *send = dest + (size_t)c->rank * region;
    for (size_t i = 0; i < bytes; i++)
        send[i] = in_place_pattern(c->rank, i);
    fsdp2_iov_t pieces[4 * 3];
    size_t offsets[5];
    three_pieces(c->size, dest, region, bytes, a, b, 0, pieces, offsets);
    for (int r = 0; mixed && r < c->size; r++) { /* pieces 1 and 2 move apart */
        pieces[3 * r + 1].data = apart + (size_t)r * region + a;
        pieces[3 * r + 2].data = apart + (size_t)r * region + a + b;
    }
    fails += OK(c, fsdp2_all_gather_pieces_async(c->world, send, bytes, pieces, offsets, c->stream));
    fails += sync_ok(c);
    for (int r = 0; r < c->size && !fails; r++) {
        const unsigned char *in_dest = dest + (size_t)r * region;
        const unsigned char *in_apart = apart + (size_t)r * region;
        for (size_t i = 0; i < bytes && !fails; i++) {
            unsigned char got = mixed && i >= a ? in_apart[i] : in_dest[i];
            fails += RANK_CHECK(c, got == in_place_pattern(r, i),
                                "in-place pieces (mixed %d): rank %d byte %zu is %u, want %u",
                                mixed, r, i, got, in_place_pattern(r, i));
        }
    }
    free(dest);
    free(apart);
    return fails;
}

/* This rank's input 100 bytes into its own pieces (overlapping them, not in place) is
 * refused before anything is enqueued, so the group stays usable. */
static int check_all_gather_pieces_refused(rank_ctx_t *c)
{
    const size_t bytes = 3 * SLOT + 1001, region = bytes + 256;
    unsigned char *dest = calloc((size_t)c->size, region);
    fsdp2_iov_t pieces[4 * 3];
    size_t offsets[5];
    three_pieces(c->size, dest, region, bytes, SLOT / 2 + 7, 2 * SLOT + 3, 0, pieces, offsets);
    const unsigned char *send = dest + (size_t)c->rank * region + 100;
    fsdp2_status_t s =
        fsdp2_all_gather_pieces_async(c->world, send, bytes, pieces, offsets, c->stream);
    int fails = RANK_CHECK(c, s == FSDP2_ERR_INVALID_ARGUMENT &&
                                  strstr(fsdp2_last_error(), "is not in place"),
                           "overlapping pieces: %s: %s", fsdp2_status_name(s),
                           fsdp2_last_error());
    free(dest);
    return fails;
}

/* large_scale divides the large all-reduces' counts (1: as they are). */
static int across_slots(rank_ctx_t *c, size_t large_scale)
{
    int fails = 0;
    for (size_t k = 0; k < COUNT(cases) && !fails; k++) {
        fails += check_all_gather(c, cases[k].dtype, cases[k].count);
        fails += check_reduce_scatter(c, cases[k].dtype, cases[k].count);
        fails += check_all_reduce(c, cases[k].dtype, cases[k].count);
        fails += check_broadcast(c, cases[k].dtype, cases[k].count);
    }
    for (size_t k = 0; k < COUNT(large_all_reduces) && !fails; k++)
        fails += check_all_reduce(c, large_all_reduces[k].dtype,
                                  large_all_reduces[k].count / large_scale);
    fails += check_all_gather_pieces(c);
    fails += check_all_gather_pieces_refused(c);
    fails += check_all_gather_pieces_in_place(c, 0);
    fails += check_all_gather_pieces_in_place(c, 1);
    /* zero-sized collectives between large ones take no steps and keep ranks in step */
    fails += check_all_gather(c, FSDP2_F32, 0);
    fails += check_all_reduce(c, FSDP2_F16, 0);
    fails += check_all_reduce(c, FSDP2_F16, 3);
    return fails;
}

/* Runs across_slots(c, scale) on a group of its own, created with the environment as it
 * is now. */
static int across_slots_in_group(rank_ctx_t *c, const char *name, size_t scale)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 30000;
    fsdp2_group_t *g = NULL, *world = c->world;
    int fails = OK(c, fsdp2_group_create(c->store, name, c->rank, c->size, &go, &g));
    if (!fails) {
        c->world = g;
        fails += across_slots(c, scale);
        c->world = world;
    }
    fsdp2_group_destroy(g);
    return fails;
}

/* (The sanitizers get large all-reduces of a sixteenth, fused from 1 MiB.) */
static int body_across_slots(rank_ctx_t *c)
{
    if (!sanitized())
        return across_slots(c, 1);
    large_thresholds();
    int fails = OK(c, fsdp2_env_reload());
    fails += fails ? 0 : across_slots_in_group(c, "large-scaled", LARGE_DIV);
    unsetenv("FSDP2_SHM_FUSED_MIN");
    unsetenv("FSDP2_SHM_STREAM_OUTPUT_MIN");
    return fails + OK(c, fsdp2_env_reload());
}

/* Runs body on every world size from lo to hi ranks; each must pass on every rank. */
static void passes_on_ranks(int lo, int hi, rank_fn body)
{
    for (int size = lo; size <= hi; size++) {
        ranks_result_t res;
        int failed = run_ranks(size, body, NULL, 30000, 240, &res);
        ck_assert_msg(failed == 0, "%d ranks: %d failed (timed out: %d)", size, failed,
                      res.timed_out);
    }
}

START_TEST(collectives_across_slot_boundaries_and_ring_wraps_on_2_to_4_ranks)
{
    passes_on_ranks(2, 4, body_across_slots);
}
END_TEST

/* ---- non-temporal slot and output stores ---- */

/* Every way of writing the slots and the outputs gives the same values, as
 * FSDP2_SHM_STREAM_STORES / FSDP2_SHM_STREAM_OUTPUT: both on (non-temporal stores), both
 * off (memcpy), slots plain with outputs streamed (what auto does for large gathers),
 * mixed (rank 0 streams both, the others neither: each rank's choice is its own and
 * must never change the steps), slots learned: the slots' way is timed per run and the
 * other way tried on run 2 and then every 8 runs (here with a rank arriving late, which
 * skews the timings; test_shm_stores.c drives the schedule itself), slots by the
 * topology's rule, and both auto (the rule, or learned under a hypervisor); outputs stream
 * when large (a 2-3 x 8 MiB all-gather; large() under the sanitizers); and outputs
 * streamed by auto from 4 KiB (FSDP2_SHM_STREAM_OUTPUT_MIN) with waits that never poll
 * (FSDP2_SHM_SPIN_US=0). Odd sizes, several slots, a large all-reduce (fused), pieces
 * whose boundaries fall
 * inside slots, a broadcast. (A missing fence would not fail this on x86, where the
 * stream's locked instructions drain the write-combining buffers; the fences are
 * there for the memory model.) */
static int body_stream_stores(rank_ctx_t *c)
{
    static const char *const modes[][2] = {
        {"on", "on"}, {"off", "off"}, {"off", "on"}, {"mixed", "mixed"}, {"learn", "auto"},
        {"topology", "auto"}, {"auto", "auto"}, {"off", "auto-4K"}};
    int fails = 0;
    fsdp2_group_t *world = c->world;
    for (size_t m = 0; m < COUNT(modes) && !fails; m++) {
        const char *stores = modes[m][0], *output = modes[m][1];
        if (strcmp(stores, "mixed") == 0)
            stores = output = c->rank == 0 ? "on" : "off";
        int small = strcmp(output, "auto-4K") == 0;
        setenv("FSDP2_SHM_STREAM_STORES", stores, 1);
        setenv("FSDP2_SHM_STREAM_OUTPUT", small ? "auto" : output, 1);
        if (small) {
            setenv("FSDP2_SHM_STREAM_OUTPUT_MIN", "4K", 1);
            setenv("FSDP2_SHM_SPIN_US", "0", 1);
        } else {
            large_thresholds();
            unsetenv("FSDP2_SHM_SPIN_US");
        }
        fails += OK(c, fsdp2_env_reload());
        char name[32];
        snprintf(name, sizeof(name), "stores-%s-%s", modes[m][0], modes[m][1]);
        fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
        go.timeout_ms = 30000;
        fsdp2_group_t *g = NULL;
        fails += OK(c, fsdp2_group_create(c->store, name, c->rank, c->size, &go, &g));
        if (fails) {
            fsdp2_group_destroy(g); /* NULL when the create failed */
            break;
        }
        c->world = g;
        fails += check_all_gather(c, FSDP2_F32, SLOT / 4 + 1);
        fails += check_all_gather(c, FSDP2_BF16, 3 * SLOT / 2 + 5);
        fails += check_reduce_scatter(c, FSDP2_F32, 5 * SLOT / 4 + 3);
        fails += check_reduce_scatter(c, FSDP2_F16, SLOT / 2 + 1);
        fails += check_all_reduce(c, FSDP2_F32, large(4u << 20) + 5);
        fails += check_all_reduce(c, FSDP2_F64, SLOT / 8 + 3);
        fails += check_all_gather_pieces(c);
        fails += check_broadcast(c, FSDP2_F64, 2 * SLOT / 8 + 7);
        if (strcmp(modes[m][0], "auto") == 0) {
            fails += check_all_gather(c, FSDP2_F32, large(2u << 20) + 3); /* output large */
            /* large: out of place the results stream, in place they do not */
            fails += check_reduce_scatter(c, FSDP2_BF16, large(8u << 20) + 3);
            if (c->rank == 1)
                usleep(100 * 1000);
            for (int i = 0; i < 10 && !fails; i++) {
                fails += check_all_reduce(c, FSDP2_F32, large(4u << 20) + 5);
                fails += check_all_gather(c, FSDP2_F32, SLOT / 4 + 1);
            }
        }
        c->world = world;
        fsdp2_group_destroy(g);
    }
    unsetenv("FSDP2_SHM_STREAM_STORES");
    unsetenv("FSDP2_SHM_STREAM_OUTPUT");
    unsetenv("FSDP2_SHM_STREAM_OUTPUT_MIN");
    unsetenv("FSDP2_SHM_FUSED_MIN");
    unsetenv("FSDP2_SHM_SPIN_US");
    fails += OK(c, fsdp2_env_reload());
    return fails;
}

START_TEST(streaming_and_plain_slot_and_output_stores_give_the_same_values_on_2_and_3_ranks)
{
    passes_on_ranks(2, 3, body_stream_stores);
}
END_TEST

/* ---- the protocol's sizes from the environment ---- */

static const char *const small_sizes[][2] = {
    {"FSDP2_SHM_SLOT_BYTES", "16K"}, {"FSDP2_SHM_SLOTS", "2"},
    {"FSDP2_SHM_ONE_STEP_MAX", "4K"}, {"FSDP2_SHM_ONE_STEP_PAIR_MIN", "8K"},
    {"FSDP2_SHM_FUSED_MIN", "256K"}};

static int set_sizes(rank_ctx_t *c, int on)
{
    for (size_t i = 0; i < COUNT(small_sizes); i++)
        if (on)
            setenv(small_sizes[i][0], small_sizes[i][1], 1);
        else
            unsetenv(small_sizes[i][0]);
    return OK(c, fsdp2_env_reload());
}

/* Slots of 16 KiB, 2 to a ring, one-step all-reduces up to 4 KiB (and at 2 ranks from
 * 8 KiB up to a slot), fused all-reduces from 256 KiB: every collective of the slot
 * sweep still gives the reference values, across many more steps and ring wraps. (The
 * sanitizers get large all-reduces of a sixteenth, 1 MiB: fused still, and 64 slots each,
 * not 16.) */
static int body_small_sizes(rank_ctx_t *c)
{
    int fails = set_sizes(c, 1);
    fails += fails ? 0 : across_slots_in_group(c, "small-sizes", sanitized() ? LARGE_DIV : 1);
    return fails + set_sizes(c, 0);
}

START_TEST(collectives_with_small_slots_and_thresholds_from_the_environment_on_2_to_4_ranks)
{
    passes_on_ranks(2, 4, body_small_sizes);
}
END_TEST

/* A group whose members' sizes differ cannot run the protocol: every member's create
 * fails, naming the variable and both values; sizes that agree but cannot work fail on
 * every member too. Either way the next group, with sizes alike, works. */
static int body_sizes_disagree(rank_ctx_t *c)
{
    int fails = 0;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 30000;
    if (c->rank == 1)
        setenv("FSDP2_SHM_SLOTS", "8", 1);
    fails += OK(c, fsdp2_env_reload());
    fsdp2_group_t *g = NULL;
    fsdp2_status_t st = fsdp2_group_create(c->store, "disagree", c->rank, c->size, &go, &g);
    fails += RANK_CHECK(c, st == FSDP2_ERR_INVALID_CONFIG && g == NULL &&
                               strstr(fsdp2_last_error(),
                                      "FSDP2_SHM_SLOTS is 8 on rank 1 but 4 on rank 0"),
                        "sizes that differ: %s: %s", fsdp2_status_name(st), fsdp2_last_error());
    unsetenv("FSDP2_SHM_SLOTS");
    setenv("FSDP2_SHM_SLOT_BYTES", "5000", 1);
    fails += OK(c, fsdp2_env_reload());
    st = fsdp2_group_create(c->store, "unworkable", c->rank, c->size, &go, &g);
    fails += RANK_CHECK(c, st == FSDP2_ERR_INVALID_CONFIG && g == NULL &&
                               strstr(fsdp2_last_error(), "FSDP2_SHM_SLOT_BYTES=5000"),
                        "a slot of 5000 bytes: %s: %s", fsdp2_status_name(st),
                        fsdp2_last_error());
    unsetenv("FSDP2_SHM_SLOT_BYTES");
    /* over UCX messages, the reductions' round size */
    setenv("FSDP2_SHM", "off", 1);
    if (c->rank == 1)
        setenv("FSDP2_UCX_SEGMENT_BYTES", "64K", 1);
    fails += OK(c, fsdp2_env_reload());
    st = fsdp2_group_create(c->store, "disagree-ucx", c->rank, c->size, &go, &g);
    fails += RANK_CHECK(c, st == FSDP2_ERR_INVALID_CONFIG && g == NULL &&
                               strstr(fsdp2_last_error(), "FSDP2_UCX_SEGMENT_BYTES is "),
                        "UCX segments that differ: %s: %s", fsdp2_status_name(st),
                        fsdp2_last_error());
    unsetenv("FSDP2_SHM");
    unsetenv("FSDP2_UCX_SEGMENT_BYTES");
    fails += OK(c, fsdp2_env_reload());
    fails += OK(c, fsdp2_group_create(c->store, "agreed", c->rank, c->size, &go, &g));
    if (!fails) {
        fsdp2_group_t *world = c->world;
        c->world = g;
        fails += check_all_reduce(c, FSDP2_F32, 3 * SLOT / 4 + 1);
        c->world = world;
    }
    fsdp2_group_destroy(g);
    return fails;
}

START_TEST(members_whose_sizes_differ_fail_alike_and_the_next_group_works)
{
    passes_on_ranks(2, 3, body_sizes_disagree);
}
END_TEST

/* Creates group `name` with rank 0 pinned to one CPU meanwhile: the fused all-reduce
 * pairs a piece's copies out with the next piece's copy-in only on a rank whose group
 * has a core per rank (what its affinity mask allows when the group is created), so
 * rank 0 keeps the phases apart and, given 2 CPUs, rank 1 pairs them. */
static int create_with_rank0_pinned(rank_ctx_t *c, const char *name, fsdp2_group_t **g)
{
    int fails = 0, cpu = sched_getcpu();
    cpu_set_t all, one;
    fails += RANK_CHECK(c, sched_getaffinity(0, sizeof(all), &all) == 0, "sched_getaffinity");
    if (c->rank == 0 && !fails) {
        fails += RANK_CHECK(c, cpu >= 0, "sched_getcpu: %d", cpu);
        CPU_ZERO(&one);
        CPU_SET(cpu < 0 ? 0 : cpu, &one);
        fails += RANK_CHECK(c, sched_setaffinity(0, sizeof(one), &one) == 0, "pin");
    }
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 30000;
    fails += OK(c, fsdp2_group_create(c->store, name, c->rank, c->size, &go, g));
    if (c->rank == 0) /* the group keeps the choice it made at creation */
        fails += RANK_CHECK(c, sched_setaffinity(0, sizeof(all), &all) == 0, "unpin");
    return fails;
}

/* Ranks may differ in pairing the fused all-reduce's phases (rank 0 pinned when the
 * group is created, rank 1 not: this needs 2 CPUs). The steps are the same either way.
 * (4 Mi + 1) f32 leaves rank 1 nothing in the last piece. (Under the sanitizers, large():
 * a sixteenth, fused from 1 MiB.) */
static int body_fused_phases_differ(rank_ctx_t *c)
{
    const size_case_t sizes[] = {{FSDP2_F32, large(4u << 20) + 5},
                                 {FSDP2_F32, large(4u << 20) + 1},
                                 {FSDP2_BF16, large(8u << 20)}};
    large_thresholds();
    int fails = OK(c, fsdp2_env_reload());
    cpu_set_t all;
    fails += RANK_CHECK(c, sched_getaffinity(0, sizeof(all), &all) == 0, "sched_getaffinity");
    if (c->rank == 1)
        fails += RANK_CHECK(c, CPU_COUNT(&all) >= 2,
                            "rank 1 may run on %d CPU: it would not pair its copies",
                            CPU_COUNT(&all));
    fsdp2_group_t *g = NULL, *world = c->world;
    if (!fails)
        fails += create_with_rank0_pinned(c, "fused-phases", &g);
    c->world = g;
    for (int i = 0; i < 2 && !fails; i++) {
        if (c->rank == 1 && i == 1)
            usleep(50 * 1000); /* arrive late once */
        for (size_t k = 0; k < COUNT(sizes) && !fails; k++)
            fails += check_all_reduce(c, sizes[k].dtype, sizes[k].count);
    }
    c->world = world;
    fsdp2_group_destroy(g);
    unsetenv("FSDP2_SHM_FUSED_MIN");
    unsetenv("FSDP2_SHM_STREAM_OUTPUT_MIN");
    return fails + OK(c, fsdp2_env_reload());
}

START_TEST(fused_all_reduce_ranks_may_pair_its_phases_or_not)
{
    passes_on_ranks(2, 2, body_fused_phases_differ);
}
END_TEST

/* ---- auto stores: a part try changes way inside a collective ---- */

#define ARMED_RUNS 100

/* How arm_part_tries sets the classes up: the steps of their last run (the part is an
 * eighth: 1 or 3 steps) and the way in use's made-up figure, the other way's 10 times
 * that. Far above any real run's cost, the part's estimate comes out far below and the
 * next run must try whole; far below, the estimate is far costlier still and must
 * leave the figure as it was (never raised) and the long wait going. */
typedef struct part_arming {
    uint32_t last_run_steps;
    double in_use_ns_per_byte;
    int far; /* the estimate comes out far costlier */
} part_arming_t;

static const part_arming_t armings[] = {{8, 1e3, 0}, {24, 1e-6, 1}};

/* Every kind and size class of sg set up so that its next run is a part try of a way
 * whose last figure is 10x the way in use's (rank 0 streams first, the others write
 * plainly first). */
static void arm_part_tries(shm_group_t *sg, int rank, const part_arming_t *a)
{
    for (int row = 0; row < SHM_STORE_ROWS; row++)
        for (int c = 0; c < SHM_STORE_CLASSES; c++) {
            int in_use = rank != 0;
            sg->stores[row][c] = (shm_store_class_t){
                .streaming = in_use, .runs = ARMED_RUNS, .last_try = 0,
                .last_run_steps = a->last_run_steps, .counted = {5, 5}};
            sg->stores[row][c].ns_per_byte[in_use] = a->in_use_ns_per_byte;
            sg->stores[row][c].ns_per_byte[!in_use] = 10 * a->in_use_ns_per_byte;
        }
}

/* The collectives that ran since arm_part_tries each made a part try that ended before
 * this rank's last post (learn_part ran, not a whole try's learning): within 2x, a
 * whole try is due; far costlier, the figure is the same and the long wait began. */
static int part_tries_ran(rank_ctx_t *c, const shm_group_t *sg, const part_arming_t *a,
                          const char *what)
{
    int ran = 0, fails = 0, in_use = c->rank != 0;
    for (int row = 0; row < SHM_STORE_ROWS; row++)
        for (int k = 0; k < SHM_STORE_CLASSES; k++) {
            const shm_store_class_t *s = &sg->stores[row][k];
            if (s->runs == ARMED_RUNS)
                continue;
            ran++;
            int learnt_part = a->far ? !s->try_whole && s->wait > 0 &&
                                           s->counted[!in_use] == 6 && s->counted[in_use] == 5 &&
                                           s->ns_per_byte[!in_use] == 10 * a->in_use_ns_per_byte
                                     : s->try_whole && s->counted[!in_use] == 5;
            fails += RANK_CHECK(c, s->runs == ARMED_RUNS + 1 && s->last_try == ARMED_RUNS &&
                                       s->streaming == in_use && learnt_part,
                                "%s (%u steps): row %d class %d: runs %llu, try_whole %d, far "
                                "wait %u, counted %u/%u, steps %u",
                                what, a->last_run_steps, row, k, (unsigned long long)s->runs,
                                s->try_whole, s->wait, s->counted[0], s->counted[1],
                                s->last_run_steps);
        }
    return fails + RANK_CHECK(c, ran > 0, "%s: no part try ran", what);
}

static int body_part_tries(rank_ctx_t *c)
{
    int fails = 0;
    setenv("FSDP2_SHM_STREAM_STORES", "learn", 1);
    large_thresholds();
    fails += OK(c, fsdp2_env_reload());
    fsdp2_group_t *g = NULL, *world = c->world;
    /* rank 0 keeps the fused all-reduce's phases apart, rank 1 pairs them (2 CPUs) */
    fails += create_with_rank0_pinned(c, "part-tries", &g);
    shm_group_t *sg = g ? ((ucx_group_t *)g->backend)->shm : NULL;
    fails += RANK_CHECK(c, sg != NULL, "the group is not on shared memory");
    c->world = g;
    /* (in a broadcast only the root writes slots; the others do not learn) */
#define PART_TRY(writes, call)                                                              \
    do {                                                                                    \
        if (!fails) {                                                                       \
            arm_part_tries(sg, c->rank, a);                                                 \
            fails += (call);                                                                \
            fails += fails || !(writes) ? 0 : part_tries_ran(c, sg, a, #call);              \
        }                                                                                   \
    } while (0)
    for (size_t m = 0; m < COUNT(armings) && !fails; m++) {
        const part_arming_t *a = &armings[m];
        /* (each posts at least 4 steps: a part of 3 ends before the last) */
        PART_TRY(1, check_all_gather(c, FSDP2_F32, SLOT + 1));
        PART_TRY(1, check_all_gather(c, FSDP2_BF16, 3 * SLOT / 2 + 5));
        PART_TRY(1, check_reduce_scatter(c, FSDP2_F32, 5 * SLOT / 4 + 3)); /* and in place */
        PART_TRY(1, check_reduce_scatter(c, FSDP2_BF16, large(8u << 20) + 3));
        PART_TRY(1, check_all_reduce(c, FSDP2_F64, SLOT + 3));
        PART_TRY(1, check_all_reduce(c, FSDP2_F32, large(4u << 20) + 5)); /* fused */
        PART_TRY(1, check_all_gather_pieces(c));
        PART_TRY(c->rank == c->size - 1, check_broadcast(c, FSDP2_F64, SLOT / 2 + 7));
    }
#undef PART_TRY
    c->world = world;
    fsdp2_group_destroy(g);
    unsetenv("FSDP2_SHM_STREAM_STORES");
    unsetenv("FSDP2_SHM_FUSED_MIN");
    unsetenv("FSDP2_SHM_STREAM_OUTPUT_MIN");
    fails += OK(c, fsdp2_env_reload());
    return fails;
}

START_TEST(a_part_try_changes_the_way_of_stores_inside_a_collective_on_2_and_3_ranks)
{
#if defined(__SSE2__)
    passes_on_ranks(2, 3, body_part_tries);
#else
    (void)body_part_tries; /* no streaming stores: auto never tries them */
#endif
}
END_TEST

/* ---- the same bits as UCX ---- */

static double wavy(int rank, size_t i)
{
    return sin((double)i * 0.37 + rank) * 1000.0 / (double)(rank + 3);
}

/* Sums of non-integers round at every step, so this checks the order of summation. The
 * UCX group reduces in rounds of 4 KiB per peer (FSDP2_UCX_SEGMENT_BYTES), many per
 * collective. */
static int body_same_bits(rank_ctx_t *c)
{
    int fails = 0;
    setenv("FSDP2_SHM", "off", 1);
    setenv("FSDP2_UCX_SEGMENT_BYTES", "4K", 1);
    fails += OK(c, fsdp2_env_reload());
    fsdp2_group_t *plain = NULL;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 30000;
    fails += OK(c, fsdp2_group_create(c->store, "plain", c->rank, c->size, &go, &plain));
    const fsdp2_dtype_t dts[] = {FSDP2_F32, FSDP2_F16, FSDP2_F64};
    /* the largest: fused all-reduces at 16 MiB (f32 at 4 ranks, f64 from 2); the
     * sanitizers get a count of a slot and more, whose paths the fused one's only repeats
     * (across_slots runs the fused path under them) */
    const size_t counts[] = {1000, 3 * SLOT / 4 + 11, sanitized() ? SLOT + 3 : (1u << 20) + 3};
    fsdp2_reduce_t avg = {FSDP2_REDUCE_AVG, 2.0, 1.0};
    for (size_t d = 0; d < COUNT(dts) && !fails; d++) {
        for (size_t k = 0; k < COUNT(counts) && !fails; k++) {
            fsdp2_dtype_t t = dts[d];
            size_t n = counts[k] * (size_t)c->size, bytes = n * esize(t);
            char *a = malloc(bytes), *b = malloc(bytes), *rs_a = malloc(bytes), *rs_b = malloc(bytes);
            FILL_CHUNKED(a, t, n, wavy, c->rank, 0);
            memcpy(b, a, bytes);
            fails += OK(c, fsdp2_reduce_scatter_async(c->world, a, rs_a, counts[k], t, &avg,
                                                      c->stream));
            fails += OK(c, fsdp2_reduce_scatter_async(plain, b, rs_b, counts[k], t, &avg,
                                                      c->stream));
            fails += OK(c, fsdp2_all_reduce_async(c->world, a, n, t, NULL, c->stream));
            fails += OK(c, fsdp2_all_reduce_async(plain, b, n, t, NULL, c->stream));
            fails += sync_ok(c);
            fails += RANK_CHECK(c, memcmp(rs_a, rs_b, counts[k] * esize(t)) == 0,
                                "reduce_scatter %s n=%zu: shm and ucx differ", fsdp2_dtype_name(t),
                                counts[k]);
            fails += RANK_CHECK(c, memcmp(a, b, bytes) == 0, "all_reduce %s n=%zu: shm and ucx differ",
                                fsdp2_dtype_name(t), n);
            free(a);
            free(b);
            free(rs_a);
            free(rs_b);
        }
    }
    fsdp2_group_destroy(plain);
    unsetenv("FSDP2_UCX_SEGMENT_BYTES");
    return fails + OK(c, fsdp2_env_reload());
}

START_TEST(shm_and_ucx_transports_give_identical_bits)
{
    passes_on_ranks(2, 4, body_same_bits);
}
END_TEST

/* ---- failures ---- */

/* Segments rank 0 of this run created that still have a name in /dev/shm. */
static int segments_left(int rank0_pid)
{
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "fsdp2-%d-", rank0_pid);
    int n = 0;
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d && (e = readdir(d));)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rank 0 kills the last rank (SIGKILL) once both have started a 16 MiB all-gather,
 * which takes milliseconds, so the victim dies inside it (or, on a slow day, just
 * before joining): every other rank must fail with an error, never hang. */
static int body_dies_inside(rank_ctx_t *c)
{
    int fails = 0;
    size_t n = (size_t)4 << 20;
    float *send = calloc(n, sizeof(float)), *recv = calloc(n * (size_t)c->size, sizeof(float));
    if (c->rank == 0)
        fails += RANK_CHECK(c, segments_left(getpid()) == 0, "segment still named in /dev/shm");
    double t0 = seconds();
    fsdp2_status_t s = fsdp2_all_gather_async(c->world, send, recv, n, FSDP2_F32, c->stream);
    if (c->rank == c->size - 1) {
        int32_t pid = (int32_t)getpid();
        fsdp2_store_set(c->store, "victim", &pid, sizeof(pid));
        fsdp2_stream_synchronize(c->stream); /* killed in here */
        return 1;
    }
    if (c->rank == 0) {
        int32_t pid = 0;
        size_t len = 0;
        fails += OK(c, fsdp2_store_get(c->store, "victim", &pid, sizeof(pid), &len));
        fails += RANK_CHECK(c, pid > 0 && kill(pid, SIGKILL) == 0, "kill %d", (int)pid);
    }
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(c->stream);
    fails += RANK_CHECK(c, s == FSDP2_ERR_PEER_FAILED || s == FSDP2_ERR_TIMEOUT, "status %s",
                        fsdp2_status_name(s));
    fails += RANK_CHECK(c, seconds() - t0 < 20, "failed after %.1f s", seconds() - t0);
    fails += RANK_CHECK(c, fsdp2_barrier_async(c->world, c->stream) != FSDP2_SUCCESS ||
                               fsdp2_stream_synchronize(c->stream) != FSDP2_SUCCESS,
                        "later collective fails");
    free(send);
    free(recv);
    return fails;
}

START_TEST(a_rank_dying_inside_a_large_collective_fails_the_others_and_leaves_no_segment)
{
    for (int size = 2; size <= 4; size++) {
        ranks_result_t res;
        run_ranks(size, body_dies_inside, NULL, 3000, 60, &res);
        ck_assert_msg(!res.timed_out, "%d ranks hung", size);
        for (int r = 0; r < size - 1; r++)
            ck_assert_msg(res.status[r] == 0, "size %d rank %d: status %d", size, r,
                          res.status[r]);
    }
}
END_TEST

/* Rank 1 aborts while the others wait in an all-gather it never joins: they fail at
 * once (the segment is marked broken), long before their 60 s timeout. */
static int body_abort_while_others_wait(rank_ctx_t *c)
{
    int fails = 0;
    size_t n = (size_t)1 << 20;
    float *send = calloc(n, sizeof(float)), *recv = calloc(n * (size_t)c->size, sizeof(float));
    if (c->rank == 1) {
        const char *key = "all-waiting";
        fails += OK(c, fsdp2_store_wait(c->store, &key, 1));
        fails += OK(c, fsdp2_group_abort(c->world));
    } else {
        double t0 = seconds();
        fsdp2_status_t s = fsdp2_all_gather_async(c->world, send, recv, n, FSDP2_F32, c->stream);
        int64_t count = 0;
        fsdp2_store_add(c->store, "waiting", 1, &count);
        if (count == c->size - 1)
            fsdp2_store_set(c->store, "all-waiting", "1", 1);
        if (s == FSDP2_SUCCESS)
            s = fsdp2_stream_synchronize(c->stream);
        fails += RANK_CHECK(c, s == FSDP2_ERR_PEER_FAILED, "status %s", fsdp2_status_name(s));
        fails += RANK_CHECK(c, seconds() - t0 < 20, "failed after %.1f s, not at once",
                            seconds() - t0);
    }
    free(send);
    free(recv);
    return fails;
}

START_TEST(an_abort_fails_the_peers_waiting_on_the_aborted_rank_at_once)
{
    for (int size = 2; size <= 3; size++) {
        ranks_result_t res;
        int failed = run_ranks(size, body_abort_while_others_wait, NULL, 60000, 50, &res);
        ck_assert_msg(failed == 0 && !res.timed_out, "%d ranks: statuses %d %d %d", size,
                      res.status[0], res.status[1], res.status[2]);
    }
}
END_TEST

static Suite *shm_suite(void)
{
    Suite *s = suite_create("shm");
    TCase *ok = tcase_create("results");
    tcase_set_timeout(ok, 600);
    tcase_add_test(ok, collectives_across_slot_boundaries_and_ring_wraps_on_2_to_4_ranks);
    tcase_add_test(ok, collectives_with_small_slots_and_thresholds_from_the_environment_on_2_to_4_ranks);
    tcase_add_test(ok, members_whose_sizes_differ_fail_alike_and_the_next_group_works);
    tcase_add_test(ok, shm_and_ucx_transports_give_identical_bits);
    tcase_add_test(ok, streaming_and_plain_slot_and_output_stores_give_the_same_values_on_2_and_3_ranks);
    tcase_add_test(ok, fused_all_reduce_ranks_may_pair_its_phases_or_not);
    tcase_add_test(ok, a_part_try_changes_the_way_of_stores_inside_a_collective_on_2_and_3_ranks);
    suite_add_tcase(s, ok);
    TCase *bad = tcase_create("failures");
    tcase_set_timeout(bad, 300);
    tcase_add_test(bad, a_rank_dying_inside_a_large_collective_fails_the_others_and_leaves_no_segment);
    tcase_add_test(bad, an_abort_fails_the_peers_waiting_on_the_aborted_rank_at_once);
    suite_add_tcase(s, bad);
    return s;
}

FSDP2_CHECK_MAIN(shm_suite)
