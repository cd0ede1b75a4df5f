/* Collective failures with real processes: a dead peer, a hung peer, an abort, an
 * enqueue that can never proceed, and ranks that call different collectives under one
 * sequence number, each an error within the group's timeout on every rank concerned,
 * never a hang and never a silent success.
 *
 * Ranks on one host use the shared-memory transport by default; meson runs this file a
 * second time with FSDP2_SHM=off, so that every case also runs over UCX messages (the
 * path across hosts). */
#include <check.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/check_main.h"
#include "core/env_internal.h"
#include "core/fault.h"
#include "ranks.h"

#define OK(ctx, call) RANK_CHECK(ctx, (call) == FSDP2_SUCCESS, "%s", #call)

/* A stream held by a host function until this thread lets it go, after enqueueing a
 * fifth reduction behind it: the first four hold the group's reduction places, so the
 * fifth cannot be enqueued until they finish, which they never would. The enqueue must
 * give up at the group's timeout (failing the group), not wait for ever. */
static fsdp2_status_t hold_until_released(void *arg)
{
    struct timespec t = {0, 1000 * 1000};
    while (!atomic_load((atomic_int *)arg))
        nanosleep(&t, NULL);
    return FSDP2_SUCCESS;
}

static int body_enqueue_behind_own_later_work(rank_ctx_t *c)
{
    int fails = 0;
    static atomic_int released;
    static float buf[5][16];
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *s;
    fails += OK(c, fsdp2_stream_create(cpu, "held", &s));
    fails += OK(c, fsdp2_stream_launch_host(s, hold_until_released, &released));
    for (int i = 0; i < 4; i++)
        fails += OK(c, fsdp2_all_reduce_async(c->world, buf[i], 16, FSDP2_F32, NULL, s));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fsdp2_status_t st = fsdp2_all_reduce_async(c->world, buf[4], 16, FSDP2_F32, NULL, s);
    double waited = ranks_seconds_since(&t0);
    fails += RANK_CHECK(c, st == FSDP2_ERR_TIMEOUT, "fifth reduction: %s", fsdp2_status_name(st));
    fails += RANK_CHECK(c, strstr(fsdp2_last_error(), "all_reduce") &&
                               strstr(fsdp2_last_error(), "FSDP2_TIMEOUT"),
                        "message: %s", fsdp2_last_error());
    fails += RANK_CHECK(c, waited >= 1.0 && waited < 10.0, "gave up after %.2f s (timeout 1.5 s)",
                        waited);
    atomic_store(&released, 1);
    fsdp2_stream_synchronize(s); /* the held reductions now run on a failed group */
    fsdp2_stream_destroy(s);
    return fails;
}

START_TEST(an_enqueue_behind_the_callers_own_later_work_times_out_instead_of_hanging)
{
    for (int size = 1; size <= 2; size++) {
        ranks_result_t res;
        int failed = run_ranks(size, body_enqueue_behind_own_later_work, NULL, 1500, 60, &res);
        ck_assert_msg(failed == 0 && !res.timed_out, "world size %d: statuses %d %d", size,
                      res.status[0], res.status[1]);
    }
}
END_TEST

static int body_peer_dies(rank_ctx_t *c)
{
    float buf[1024] = {0};
    /* every rank's world group is up before one dies (a peer still connecting to it
     * would fail in the runner's set-up, not in the collective under test) */
    if (fsdp2_store_barrier(c->store, "connected") != FSDP2_SUCCESS)
        return RANK_CHECK(c, 0, "barrier: %s", fsdp2_last_error());
    if (c->rank == c->size - 1)
        _exit(0); /* dies without a word after connecting */
    fsdp2_status_t s = fsdp2_all_reduce_async(c->world, buf, 1024, FSDP2_F32, NULL, c->stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(c->stream);
    int fails = RANK_CHECK(c, s == FSDP2_ERR_PEER_FAILED || s == FSDP2_ERR_TIMEOUT,
                           "status %s", fsdp2_status_name(s));
    /* the group stays failed: the next collective fails at once */
    fails += RANK_CHECK(c, fsdp2_all_reduce_async(c->world, buf, 4, FSDP2_F32, NULL, c->stream) != FSDP2_SUCCESS ||
                               fsdp2_stream_synchronize(c->stream) != FSDP2_SUCCESS,
                        "later collective fails");
    return fails;
}

START_TEST(a_dead_peer_is_an_error_on_every_survivor_not_a_hang)
{
    for (int size = 2; size <= 4; size++) {
        ranks_result_t res;
        run_ranks(size, body_peer_dies, NULL, 3000, 60, &res);
        ck_assert_msg(!res.timed_out, "ranks hung");
        for (int r = 0; r < size - 1; r++)
            ck_assert_msg(res.status[r] == 0, "size %d rank %d: status %d", size, r, res.status[r]);
    }
}
END_TEST

static int body_hung_peer(rank_ctx_t *c)
{
    float buf[16] = {0};
    if (c->rank == 0) {
        /* never joins the collective; leaves once the others reported */
        int64_t done = 0;
        fsdp2_store_add(c->store, "reported", 0, &done);
        const char *key = "all-reported";
        return OK(c, fsdp2_store_wait(c->store, &key, 1));
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fsdp2_status_t s = fsdp2_all_gather_async(c->world, buf + 4 * c->rank, buf, 4, FSDP2_F32, c->stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(c->stream);
    double waited = ranks_seconds_since(&t0);
    /* TIMEOUT, or PEER_FAILED when the other survivor timed out first and left */
    int fails = RANK_CHECK(c, s == FSDP2_ERR_TIMEOUT || s == FSDP2_ERR_PEER_FAILED, "status %s",
                           fsdp2_status_name(s));
    /* about the group's 1.5 s timeout: not at once, and not much later */
    fails += RANK_CHECK(c, waited > 1.0 && waited < 10.0, "failed after %.2f s", waited);
    fails += RANK_CHECK(c, strstr(fsdp2_last_error(), "all_gather") != NULL, "message");
    int64_t n = 0;
    fsdp2_store_add(c->store, "reported", 1, &n);
    if (n == c->size - 1)
        fsdp2_store_set(c->store, "all-reported", "1", 1);
    return fails;
}

START_TEST(a_hung_peer_times_out_with_a_message)
{
    ranks_result_t res;
    int failed = run_ranks(3, body_hung_peer, NULL, 1500, 60, &res);
    ck_assert_msg(failed == 0 && !res.timed_out, "statuses %d %d %d", res.status[0], res.status[1],
                  res.status[2]);
}
END_TEST

/* Rank 1 aborts; every other rank is already waiting in an all-reduce (the group's
 * timeout is 30 s, so only the abort's message can end it in time). */
static int body_abort(rank_ctx_t *c)
{
    float buf[64] = {0};
    int fails = 0;
    OK(c, fsdp2_store_barrier(c->store, "before"));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fsdp2_status_t s;
    if (c->rank == 1) {
        struct timespec nap = {0, 200 * 1000 * 1000}; /* the others are waiting by then */
        nanosleep(&nap, NULL);
        fails += OK(c, fsdp2_group_abort(c->world));
    }
    s = fsdp2_all_reduce_async(c->world, buf, 64, FSDP2_F32, NULL, c->stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(c->stream);
    double took = ranks_seconds_since(&t0);
    const char *msg = fsdp2_last_error();
    if (c->rank == 1) {
        fails += RANK_CHECK(c, s == FSDP2_ERR_ABORTED, "aborted rank: %s", fsdp2_status_name(s));
    } else {
        fails += RANK_CHECK(c, s == FSDP2_ERR_PEER_FAILED, "others: %s: %s",
                            fsdp2_status_name(s), msg);
        fails += RANK_CHECK(c, strstr(msg, "rank 1 failed") &&
                                   strstr(msg, "aborted by the application"),
                            "the message names rank 1 and its reason: %s", msg);
        fails += RANK_CHECK(c, took < 5.0, "failed after %.2f s (timeout 30 s)", took);
    }
    return fails;
}

START_TEST(abort_fails_every_rank_at_once_naming_the_aborting_rank)
{
    for (int size = 2; size <= 3; size++) {
        ranks_result_t res;
        int failed = run_ranks(size, body_abort, NULL, 30000, 60, &res);
        ck_assert_msg(failed == 0 && !res.timed_out, "size %d: statuses %d %d %d", size,
                      res.status[0], res.status[1], res.status[2]);
    }
}
END_TEST

/* Ranks calling different collectives as the group's same sequence number: rank 0 a
 * barrier where the others all-gather (case 0); rank 1 all-gathering half the bytes
 * (case 1); rank 1 skipping the all-gather (as after a local failure) and going on to
 * the barrier that follows it (case 2). Every rank must fail (none may take another's
 * call for its own), at first contact (well within the timeout) on both transports,
 * naming both calls on a rank that saw the mismatch (over UCX messages a length that
 * differs may be seen first: the message names the bytes). The group's timeout is
 * 30 s here, so only the stamps and the failing rank's abort can end the waits. */
static int body_mismatch(rank_ctx_t *c)
{
    int which = *(const int *)c->arg;
    const char *shm = getenv("FSDP2_SHM");
    int over_ucx = shm && !strcmp(shm, "off");
    size_t n = 1024; /* f32: 4096 B per rank */
    float *send = calloc(n, sizeof(float)), *recv = calloc(n * (size_t)c->size, sizeof(float));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fsdp2_status_t s = FSDP2_SUCCESS;
    if (which == 0 && c->rank == 0)
        s = fsdp2_barrier_async(c->world, c->stream);
    else if (which == 1 && c->rank == 1)
        s = fsdp2_all_gather_async(c->world, send, recv, n / 2, FSDP2_F32, c->stream);
    else if (which == 2 && c->rank == 1)
        s = fsdp2_barrier_async(c->world, c->stream);
    else
        s = fsdp2_all_gather_async(c->world, send, recv, n, FSDP2_F32, c->stream);
    if (s == FSDP2_SUCCESS && which == 2 && c->rank != 1)
        s = fsdp2_barrier_async(c->world, c->stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(c->stream);
    double seconds = ranks_seconds_since(&t0);
    int fails = RANK_CHECK(c, s != FSDP2_SUCCESS, "case %d: a mismatched call succeeded", which);
    const char *msg = fsdp2_last_error();
    fprintf(stderr, "rank %d case %d: %s after %.2f s: %s\n", c->rank, which,
            fsdp2_status_name(s), seconds, msg);
    /* A rank whose peer failed first may see that peer's abort (PEER_FAILED naming it)
     * or, over UCX, its transfers end (a transport error), also at once. */
    fails += RANK_CHECK(c, seconds < 2.0, "case %d: %.2f s to fail%s", which, seconds,
                        over_ucx ? " over UCX" : "");
    if (s == FSDP2_ERR_INVALID_STATE)
        fails += RANK_CHECK(c, (strstr(msg, "where rank") && strstr(msg, "called")) ||
                                   (over_ucx && strstr(msg, "bytes")),
                            "case %d: the message names both calls: %s", which, msg);
    /* PEER_FAILED names the peer: with its reason when its abort message came first, or
     * as a dead peer when its transfers ended first (it fails at once and exits). */
    if (s == FSDP2_ERR_PEER_FAILED)
        fails += RANK_CHECK(c, strstr(msg, "failed: ") || (over_ucx && strstr(msg, "peer ")),
                            "case %d: the message names the peer: %s", which, msg);
    free(send);
    free(recv);
    return fails;
}

START_TEST(different_calls_under_one_sequence_number_fail_on_every_rank)
{
    for (int size = 2; size <= 3; size++) {
        ranks_result_t res;
        int which = _i;
        int failed = run_ranks(size, body_mismatch, &which, 30000, 60, &res);
        ck_assert_msg(failed == 0 && !res.timed_out, "case %d at %d ranks: statuses %d %d %d",
                      which, size, res.status[0], res.status[1], res.status[2]);
    }
}
END_TEST

/* A member that fails its part of a group's creation, at any step, fails the creation on
 * every member at once, naming it, instead of leaving its peers waiting at the store for
 * the group's timeout or holding a group that fails at its first collective. The victim
 * counts the allocation points of one creation, then fails each in turn, one creation
 * per point (of the run of identical allocations, 6 for each of the UCX transport's 64
 * request slots, every 25th); a creation after them works. The transport is the run's
 * (collective_failures and collective_failures_ucx). arg: the victim's rank. */
static int body_creation_fails_on_one_member(rank_ctx_t *c)
{
    int victim = *(const int *)c->arg, fails = 0;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 60000; /* a creation that waits for it fails the check on `took` */
    fsdp2_group_t *g = NULL;
    if (c->rank == victim)
        fsdp2_fault_arm(FAULT_NONE, 0); /* counting only */
    fails += OK(c, fsdp2_group_create(c->store, "probe", c->rank, c->size, &go, &g));
    uint64_t points = fsdp2_fault_count(FAULT_ALLOC);
    fsdp2_fault_disarm();
    fsdp2_group_destroy(g);
    fails += RANK_CHECK(c, c->rank != victim || points >= 4, "%llu allocation points",
                        (unsigned long long)points);
    /* every rank walks as many points as the victim counted */
    int64_t n = 0;
    fails += OK(c, ranks_value_from(c, victim, "walk/points", (int64_t)points, &n));
    for (int64_t at = 1; at <= n && fails == 0; at++) {
        if (at > 24 && at + 40 <= n && at % 25 != 0)
            continue;
        char name[32], quoted[40];
        snprintf(name, sizeof(name), "walk%lld", (long long)at);
        snprintf(quoted, sizeof(quoted), "'%s'", name);
        if (c->rank == victim)
            fsdp2_fault_arm(FAULT_ALLOC, (uint64_t)at);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        g = NULL;
        fsdp2_status_t st = fsdp2_group_create(c->store, name, c->rank, c->size, &go, &g);
        double took = ranks_seconds_since(&t0);
        int fired = fsdp2_fault_fired();
        fsdp2_fault_disarm();
        const char *msg = fsdp2_last_error();
        fails += RANK_CHECK(c, g == NULL, "%s: a group on a failed creation", name);
        if (c->rank == victim) {
            fails += RANK_CHECK(c, fired && st == FSDP2_ERR_OUT_OF_MEMORY, "%s: %s: %s", name,
                                fsdp2_status_name(st), msg);
        } else {
            char who[16];
            snprintf(who, sizeof(who), "rank %d", victim);
            fails += RANK_CHECK(c, st == FSDP2_ERR_PEER_FAILED && strstr(msg, who) &&
                                       strstr(msg, "OUT_OF_MEMORY") && strstr(msg, quoted),
                                "%s: %s: %s", name, fsdp2_status_name(st), msg);
        }
        fails += RANK_CHECK(c, took < 30.0, "%s: failed after %.1f s (group timeout 60 s)", name,
                            took);
        if (g)
            fsdp2_group_destroy(g);
    }
    float x[4] = {(float)c->rank, 1, 2, 3};
    fails += OK(c, fsdp2_group_create(c->store, "after", c->rank, c->size, &go, &g));
    if (fails == 0) {
        fails += OK(c, fsdp2_all_reduce_async(g, x, 4, FSDP2_F32, NULL, c->stream));
        fails += OK(c, fsdp2_stream_synchronize(c->stream));
        float want = (float)(c->size * (c->size - 1) / 2);
        fails += RANK_CHECK(c, x[0] == want && x[3] == 3.0f * (float)c->size, "sum %g %g", x[0],
                            x[3]);
        fsdp2_group_destroy(g);
    }
    return fails;
}

/* _i: the victim, rank 1 or rank 0 (which leads the shared-memory set-up). */
START_TEST(a_member_that_fails_its_part_of_creation_fails_it_on_every_member)
{
    int victim = 1 - _i;
    for (int size = 2; size <= 3; size++) {
        ranks_result_t res;
        int failed = run_ranks(size, body_creation_fails_on_one_member, &victim, 0, 120, &res);
        ck_assert_msg(failed == 0 && !res.timed_out, "victim %d, world size %d: statuses %d %d %d",
                      victim, size, res.status[0], res.status[1], res.status[2]);
    }
}
END_TEST

static Suite *failures_suite(void)
{
    Suite *s = suite_create("collective failures");
    TCase *bad = tcase_create("failures");
    tcase_set_timeout(bad, 300);
    tcase_add_test(bad, a_dead_peer_is_an_error_on_every_survivor_not_a_hang);
    tcase_add_test(bad, a_hung_peer_times_out_with_a_message);
    tcase_add_test(bad, abort_fails_every_rank_at_once_naming_the_aborting_rank);
    tcase_add_test(bad, an_enqueue_behind_the_callers_own_later_work_times_out_instead_of_hanging);
    tcase_add_loop_test(bad, different_calls_under_one_sequence_number_fail_on_every_rank, 0, 3);
    tcase_add_loop_test(bad, a_member_that_fails_its_part_of_creation_fails_it_on_every_member,
                        0, 2);
    suite_add_tcase(s, bad);
    return s;
}

FSDP2_CHECK_MAIN(failures_suite)
