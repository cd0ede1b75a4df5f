/* The rendezvous store: values, counters, compare-and-set races and barriers across real
 * processes (1 to 4 ranks forked per test, rank 0 serving on a port the kernel picks
 * and handing it to the others through a pipe), and the failure paths: ranks that never
 * connect or die, a server that dies, timeouts; then each operation's definition and
 * argument checks with one process. (Malformed bytes, refused HELLOs, addresses and the
 * port's release: test_store_server.c.)
 *
 * Ranks report through a shared mapping and their exit status; the parent checks them
 * against values it computes itself. Nothing sleeps to "wait long enough": a rank that
 * must wait for another's request to be parked asks the server, with a deadline. */
#include <check.h>

#include "check_main.h"
#include "store_test_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fsdp2/fsdp2.h>

#include "core/env_internal.h"
#include "mesh/store_internal.h"
#include "mesh/store_server.h"

#define MAX_RANKS 4
#define ADDS_PER_RANK 1000
#define CAS_ROUNDS 20
#define CHILD_LIMIT_S 90

typedef struct rank_report {
    char message[1024];
    double elapsed_s;   /* what the body chose to time */
    double at_s;        /* a moment the body chose to mark (CLOCK_MONOTONIC) */
} rank_report_t;

typedef struct shared {
    rank_report_t report[MAX_RANKS];
    int64_t adds[MAX_RANKS][ADDS_PER_RANK];
    int cas_swapped[CAS_ROUNDS][MAX_RANKS];
    int cas_seen[CAS_ROUNDS][MAX_RANKS];
} shared_t;

typedef struct rank_ctx {
    int rank, world_size;
    fsdp2_store_t *store; /* the harness destroys it unless the body set it to NULL */
    shared_t *shared;
    rank_report_t *report;
} rank_ctx_t;

typedef int (*rank_body_t)(rank_ctx_t *ctx);

typedef struct run_spec {
    int world_size;
    int spawn;          /* ranks 0..spawn-1 run; the others never connect */
    long timeout_ms[MAX_RANKS];
    rank_body_t body;
} run_spec_t;

/* In a rank: record the failure and leave the body. */
#define RANK_FAIL(ctx, ...)                                                            \
    do {                                                                               \
        snprintf((ctx)->report->message, sizeof((ctx)->report->message), __VA_ARGS__); \
        return 1;                                                                      \
    } while (0)
#define RANK_EXPECT(ctx, cond, ...)      \
    do {                                 \
        if (!(cond))                     \
            RANK_FAIL(ctx, __VA_ARGS__); \
    } while (0)
#define RANK_OK(ctx, call)                                                                  \
    do {                                                                                    \
        fsdp2_status_t rank_s_ = (call);                                                    \
        RANK_EXPECT(ctx, rank_s_ == FSDP2_SUCCESS, "rank %d: %s: %s: %s", (ctx)->rank, #call, \
                    fsdp2_status_name(rank_s_), fsdp2_last_error());                        \
    } while (0)
#define RANK_STATUS(ctx, call, expected)                                                      \
    do {                                                                                      \
        fsdp2_status_t rank_s_ = (call);                                                      \
        RANK_EXPECT(ctx, rank_s_ == (expected), "rank %d: %s gave %s (expected %s): %s",      \
                    (ctx)->rank, #call, fsdp2_status_name(rank_s_),                           \
                    fsdp2_status_name(expected), fsdp2_last_error());                         \
    } while (0)

static int read_port(int fd)
{
    int port = 0;
    size_t got = 0;
    while (got < sizeof(port)) {
        ssize_t n = read(fd, (char *)&port + got, sizeof(port) - got);
        if (n <= 0 && !(n < 0 && errno == EINTR))
            return -1;
        got += n > 0 ? (size_t)n : 0;
    }
    return port;
}

static int rank_main(const run_spec_t *spec, int rank, int port_pipe[2], shared_t *sh)
{
    rank_ctx_t ctx = {rank, spec->world_size, NULL, sh, &sh->report[rank]};
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    o.world_size = spec->world_size;
    o.rank = rank;
    o.timeout_ms = spec->timeout_ms[rank];
    if (rank == 0) {
        close(port_pipe[0]);
        o.is_server = 1;
        RANK_OK(&ctx, fsdp2_store_create(&o, &ctx.store));
        int port = 0;
        RANK_OK(&ctx, fsdp2_store_port(ctx.store, &port));
        for (int r = 1; r < spec->spawn; r++)
            RANK_EXPECT(&ctx, write(port_pipe[1], &port, sizeof(port)) == sizeof(port),
                        "writing the port failed");
        close(port_pipe[1]);
    } else {
        close(port_pipe[1]);
        o.port = read_port(port_pipe[0]);
        close(port_pipe[0]);
        RANK_EXPECT(&ctx, o.port > 0, "rank %d: rank 0 never sent its port", rank);
        RANK_OK(&ctx, fsdp2_store_create(&o, &ctx.store));
    }
    int failed = spec->body(&ctx);
    fsdp2_status_t s = fsdp2_store_destroy(ctx.store);
    if (!failed && s != FSDP2_SUCCESS)
        RANK_FAIL(&ctx, "rank %d: destroy: %s: %s", rank, fsdp2_status_name(s),
                  fsdp2_last_error());
    return failed;
}

/* Forks spec->spawn ranks, waits for all of them, and returns their wait statuses. */
static void run_ranks(const run_spec_t *spec, shared_t *sh, int wstatus[MAX_RANKS])
{
    int port_pipe[2];
    ck_assert_int_eq(pipe(port_pipe), 0);
    fflush(NULL);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < spec->spawn; r++) {
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            alarm(CHILD_LIMIT_S);
            exit(rank_main(spec, r, port_pipe, sh) ? EXIT_FAILURE : EXIT_SUCCESS);
        }
    }
    close(port_pipe[0]);
    close(port_pipe[1]);
    for (int r = 0; r < spec->spawn; r++)
        ck_assert_int_eq(waitpid(pids[r], &wstatus[r], 0), pids[r]);
}

static shared_t *shared_create(void)
{
    shared_t *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
    ck_assert_ptr_ne(sh, MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    return sh;
}

static void expect_rank_exited_ok(const shared_t *sh, int rank, int wstatus)
{
    ck_assert_msg(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0,
                  "rank %d ended with status 0x%x: %s", rank, wstatus,
                  sh->report[rank].message);
}

/* Runs ranks that must all succeed. */
static shared_t *run_all_ok(int world_size, long timeout_ms, rank_body_t body)
{
    run_spec_t spec = {world_size, world_size, {0}, body};
    for (int r = 0; r < MAX_RANKS; r++)
        spec.timeout_ms[r] = timeout_ms;
    shared_t *sh = shared_create();
    int wstatus[MAX_RANKS];
    run_ranks(&spec, sh, wstatus);
    for (int r = 0; r < world_size; r++)
        expect_rank_exited_ok(sh, r, wstatus[r]);
    return sh;
}

/* Waits (up to 20 s) until the server holds n parked requests. Only on the server rank. */
static int wait_parked(fsdp2_store_t *store, int n)
{
    fsdp2_store_server_t *server = fsdp2_store_server_of(store);
    double deadline = now_s() + 20;
    fsdp2_store_server_stats_t st;
    for (;;) {
        fsdp2_store_server_stats(server, &st);
        if (st.parked == n)
            return 0;
        if (now_s() > deadline)
            return -1;
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
}

/* The bytes rank r stores under its j-th key: a pattern the checker recomputes. */
static const size_t value_sizes[] = {0, 1, 1000, 1 << 20};
#define NSIZES (sizeof(value_sizes) / sizeof(value_sizes[0]))

static uint8_t pattern_byte(int rank, size_t j, size_t i)
{
    return (uint8_t)(rank * 131 + j * 17 + i * 7 + 1);
}

/* ---------------------------------------------------------------------------------- */
/* Values across 1..4 ranks                                                             */

static int body_exchange(rank_ctx_t *ctx)
{
    uint8_t *buf = malloc(1 << 20);
    RANK_EXPECT(ctx, buf, "malloc");
    char key[64];
    for (size_t j = 0; j < NSIZES; j++) {
        for (size_t i = 0; i < value_sizes[j]; i++)
            buf[i] = pattern_byte(ctx->rank, j, i);
        snprintf(key, sizeof(key), "value/%d/%zu", ctx->rank, j);
        RANK_OK(ctx, fsdp2_store_set(ctx->store, key, buf, value_sizes[j]));
    }
    RANK_OK(ctx, fsdp2_store_barrier(ctx->store, "after-set"));
    for (int r = 0; r < ctx->world_size; r++) {
        for (size_t j = 0; j < NSIZES; j++) {
            size_t len = 12345;
            snprintf(key, sizeof(key), "value/%d/%zu", r, j);
            RANK_OK(ctx, fsdp2_store_get(ctx->store, key, buf, 1 << 20, &len));
            RANK_EXPECT(ctx, len == value_sizes[j], "%s: %zu bytes, expected %zu", key, len,
                        value_sizes[j]);
            for (size_t i = 0; i < len; i++)
                RANK_EXPECT(ctx, buf[i] == pattern_byte(r, j, i),
                            "%s byte %zu: %u, expected %u", key, i, buf[i],
                            pattern_byte(r, j, i));
        }
    }
    free(buf);
    char names[MAX_RANKS][32];
    const char *keys[MAX_RANKS];
    for (int r = 0; r < ctx->world_size; r++) {
        snprintf(names[r], sizeof(names[r]), "value/%d/2", r);
        keys[r] = names[r];
    }
    RANK_OK(ctx, fsdp2_store_wait(ctx->store, keys, (size_t)ctx->world_size));
    /* The same name twice: each call is its own barrier. */
    RANK_OK(ctx, fsdp2_store_barrier(ctx->store, "again"));
    RANK_OK(ctx, fsdp2_store_barrier(ctx->store, "again"));
    return 0;
}

START_TEST(values_set_by_each_rank_read_back_identically_by_every_rank)
{
    int world_size = _i + 1;
    munmap(run_all_ok(world_size, 30000, body_exchange), sizeof(shared_t));
}
END_TEST

static int body_late_set(rank_ctx_t *ctx)
{
    if (ctx->rank == 1) {
        char buf[16] = {0};
        size_t len = 0;
        RANK_OK(ctx, fsdp2_store_get(ctx->store, "late", buf, sizeof(buf), &len));
        RANK_EXPECT(ctx, len == 5 && memcmp(buf, "hello", 5) == 0, "got '%.*s'", (int)len, buf);
        return 0;
    }
    RANK_EXPECT(ctx, wait_parked(ctx->store, 1) == 0, "rank 1's get was never parked");
    RANK_OK(ctx, fsdp2_store_set(ctx->store, "late", "hello", 5));
    return 0;
}

START_TEST(get_is_parked_by_the_server_until_another_rank_sets_the_key)
{
    munmap(run_all_ok(2, 30000, body_late_set), sizeof(shared_t));
}
END_TEST

/* Rank 1 waits for "a" and "b" unless "failed"; rank 0 sets "a", then "failed" while
 * "b" is missing: the wait ends then, long before its timeout, with the value. */
static int body_unless(rank_ctx_t *ctx)
{
    const char *keys[] = {"a", "b"};
    if (ctx->rank == 1) {
        char buf[16] = {0};
        size_t len = 0;
        double t0 = now_s();
        fsdp2_status_t st = fsdp2_store_wait_unless(ctx->store, keys, 2, "failed", 20000, buf,
                                                    sizeof(buf), &len);
        double took = now_s() - t0;
        RANK_EXPECT(ctx, st == FSDP2_ERR_ABORTED && len == 4 && memcmp(buf, "oops", 4) == 0,
                    "%s, '%.*s': %s", fsdp2_status_name(st), (int)len, buf, fsdp2_last_error());
        RANK_EXPECT(ctx, took < 10, "the wait ended after %.1f s", took);
        RANK_OK(ctx, fsdp2_store_barrier(ctx->store, "checked"));
        return 0;
    }
    RANK_EXPECT(ctx, wait_parked(ctx->store, 1) == 0, "rank 1's wait was never parked");
    RANK_OK(ctx, fsdp2_store_set(ctx->store, "a", "1", 1));
    RANK_OK(ctx, fsdp2_store_set(ctx->store, "failed", "oops", 4));
    RANK_OK(ctx, fsdp2_store_barrier(ctx->store, "checked"));
    return 0;
}

START_TEST(a_wait_unless_ends_when_its_first_key_appears_while_another_is_missing)
{
    munmap(run_all_ok(2, 30000, body_unless), sizeof(shared_t));
}
END_TEST

/* Keys that all exist answer whatever `unless` says; a missing one with `unless` set
 * gives its value; neither times out naming only the waited-for keys missing. */
START_TEST(a_wait_unless_prefers_keys_that_exist_and_times_out_naming_the_missing_ones)
{
    fsdp2_store_t *st = open_store("127.0.0.1", 0, 1, 1, 0, 300);
    const char *keys[] = {"a", "b", "c"};
    char buf[8];
    size_t len = 99;
    ck_assert_int_eq(fsdp2_store_wait_unless(st, keys, 3, "bad", 300, buf, sizeof(buf), &len),
                     FSDP2_ERR_TIMEOUT);
    ck_assert_str_eq(fsdp2_last_error(), "wait: 3 of 3 keys not set within 0.3 s: 'a', 'b', 'c'");
    ck_assert_int_eq(len, 0);
    OK(fsdp2_store_set(st, "a", "1", 1));
    OK(fsdp2_store_set(st, "b", "1", 1));
    OK(fsdp2_store_set(st, "bad", "why", 3));
    ck_assert_int_eq(fsdp2_store_wait_unless(st, keys, 3, "bad", 300, buf, sizeof(buf), &len),
                     FSDP2_ERR_ABORTED);
    ck_assert_int_eq(len, 3);
    ck_assert_int_eq(memcmp(buf, "why", 3), 0);
    /* a value larger than the buffer: as much as fits, and its whole length */
    buf[2] = 'x';
    ck_assert_int_eq(fsdp2_store_wait_unless(st, keys, 3, "bad", 300, buf, 2, &len),
                     FSDP2_ERR_ABORTED);
    ck_assert_int_eq(len, 3);
    ck_assert_int_eq(memcmp(buf, "whx", 3), 0);
    OK(fsdp2_store_set(st, "c", "1", 1));
    OK(fsdp2_store_wait_unless(st, keys, 3, "bad", 300, buf, sizeof(buf), &len));
    ck_assert_int_eq(len, 0);
    ck_assert_int_eq(fsdp2_store_wait_unless(st, keys, 0, "bad", 300, buf, sizeof(buf), &len),
                     FSDP2_ERR_INVALID_ARGUMENT);
    OK(fsdp2_store_destroy(st));
}
END_TEST

static int body_adds(rank_ctx_t *ctx)
{
    for (int i = 0; i < ADDS_PER_RANK; i++)
        RANK_OK(ctx, fsdp2_store_add(ctx->store, "counter", 1,
                                     &ctx->shared->adds[ctx->rank][i]));
    RANK_OK(ctx, fsdp2_store_barrier(ctx->store, "added"));
    char text[32] = {0};
    size_t len = 0;
    RANK_OK(ctx, fsdp2_store_get(ctx->store, "counter", text, sizeof(text) - 1, &len));
    RANK_EXPECT(ctx, strcmp(text, "4000") == 0, "counter reads '%s'", text);
    return 0;
}

START_TEST(add_from_4_ranks_x_1000_reaches_4000_with_every_result_seen_once)
{
    shared_t *sh = run_all_ok(4, 30000, body_adds);
    static uint8_t seen[MAX_RANKS * ADDS_PER_RANK + 1];
    for (int r = 0; r < 4; r++) {
        for (int i = 0; i < ADDS_PER_RANK; i++) {
            int64_t v = sh->adds[r][i];
            ck_assert_msg(v >= 1 && v <= 4000, "rank %d add %d returned %" PRId64, r, i, v);
            ck_assert_msg(!seen[v], "value %" PRId64 " returned twice", v);
            seen[v] = 1;
            if (i)
                ck_assert_int_gt(v, sh->adds[r][i - 1]);
        }
    }
    munmap(sh, sizeof(*sh));
}
END_TEST

static int body_cas(rank_ctx_t *ctx)
{
    char key[32], mine[16], seen[16];
    snprintf(mine, sizeof(mine), "rank %d", ctx->rank);
    for (int round = 0; round < CAS_ROUNDS; round++) {
        snprintf(key, sizeof(key), "leader/%d", round);
        int swapped = -1;
        RANK_OK(ctx, fsdp2_store_compare_set(ctx->store, key, NULL, 0, mine, strlen(mine),
                                             &swapped));
        ctx->shared->cas_swapped[round][ctx->rank] = swapped;
        RANK_OK(ctx, fsdp2_store_barrier(ctx->store, "cas"));
        size_t len = 0;
        memset(seen, 0, sizeof(seen));
        RANK_OK(ctx, fsdp2_store_get(ctx->store, key, seen, sizeof(seen) - 1, &len));
        RANK_EXPECT(ctx, sscanf(seen, "rank %d", &ctx->shared->cas_seen[round][ctx->rank]) == 1,
                    "%s holds '%s'", key, seen);
    }
    return 0;
}

START_TEST(compare_set_races_between_4_ranks_have_exactly_one_winner)
{
    shared_t *sh = run_all_ok(4, 30000, body_cas);
    for (int round = 0; round < CAS_ROUNDS; round++) {
        int winners = 0, winner = -1;
        for (int r = 0; r < 4; r++) {
            ck_assert_int_ge(sh->cas_swapped[round][r], 0);
            if (sh->cas_swapped[round][r]) {
                winners++;
                winner = r;
            }
        }
        ck_assert_msg(winners == 1, "round %d: %d winners", round, winners);
        for (int r = 0; r < 4; r++)
            ck_assert_msg(sh->cas_seen[round][r] == winner, "round %d: rank %d saw %d, won %d",
                          round, r, sh->cas_seen[round][r], winner);
    }
    munmap(sh, sizeof(*sh));
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Ranks that never come or die, a server that dies                                     */

static int body_barrier_times_out(rank_ctx_t *ctx)
{
    double t0 = now_s();
    fsdp2_status_t s = fsdp2_store_barrier(ctx->store, "init");
    ctx->report->elapsed_s = now_s() - t0;
    snprintf(ctx->report->message, sizeof(ctx->report->message), "%s", fsdp2_last_error());
    RANK_EXPECT(ctx, s == FSDP2_ERR_TIMEOUT, "barrier gave %s: %s", fsdp2_status_name(s),
                fsdp2_last_error());
    if (ctx->rank == 0) {
        fsdp2_store_t *store = ctx->store;
        ctx->store = NULL;
        t0 = now_s();
        fsdp2_store_destroy(store);
        ctx->report->at_s = now_s() - t0;
    }
    return 0;
}

START_TEST(barrier_times_out_naming_the_ranks_that_never_connected)
{
    run_spec_t spec = {4, 2, {1000, 1000, 1000, 1000}, body_barrier_times_out};
    shared_t *sh = shared_create();
    int wstatus[MAX_RANKS];
    run_ranks(&spec, sh, wstatus);
    for (int r = 0; r < 2; r++) {
        expect_rank_exited_ok(sh, r, wstatus[r]);
        ck_assert_str_eq(sh->report[r].message,
                         "barrier 'init': ranks 2,3 of 4 did not arrive within 1.0 s");
        ck_assert_msg(sh->report[r].elapsed_s > 0.9 && sh->report[r].elapsed_s < 4,
                      "rank %d timed out after %.2f s", r, sh->report[r].elapsed_s);
    }
    /* Rank 1 closed; ranks 2 and 3 never connected, so the server waited for them only
     * for its grace of at most 1 s (the stop's test: test_store_server.c). */
    ck_assert_msg(sh->report[0].at_s > 0.5 && sh->report[0].at_s < 4,
                  "server destroy took %.2f s", sh->report[0].at_s);
    munmap(sh, sizeof(*sh));
}
END_TEST

START_TEST(barrier_timeout_comes_from_FSDP2_TIMEOUT_without_an_option)
{
    ck_assert_int_eq(setenv("FSDP2_TIMEOUT", "1", 1), 0);
    run_spec_t spec = {2, 1, {0}, body_barrier_times_out};
    shared_t *sh = shared_create();
    int wstatus[MAX_RANKS];
    run_ranks(&spec, sh, wstatus);
    expect_rank_exited_ok(sh, 0, wstatus[0]);
    ck_assert_str_eq(sh->report[0].message,
                     "barrier 'init': rank 1 of 2 did not arrive within 1.0 s");
    munmap(sh, sizeof(*sh));
}
END_TEST

/* 1 when a TCP connection to addr:port is accepted (then closed at once), 0 when it is
 * refused. */
static int tcp_connects(const char *addr, int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    ck_assert_int_eq(inet_pton(AF_INET, addr, &sa.sin_addr), 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    int err = errno;
    close(fd);
    ck_assert_msg(rc == 0 || err == ECONNREFUSED, "connect %s:%d: %s", addr, port, strerror(err));
    return rc == 0;
}

static int serve_on(const char *host, fsdp2_store_t **store)
{
    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.host = host;
    so.is_server = 1;
    so.timeout_ms = 5000;
    fsdp2_status_t st = fsdp2_store_create(&so, store);
    ck_assert_msg(st == FSDP2_SUCCESS, "store on %s: %s", host, fsdp2_last_error());
    int port = 0;
    ck_assert_int_eq(fsdp2_store_port(*store, &port), FSDP2_SUCCESS);
    return port;
}

/* Rank 0's server listens only on the address the ranks were told (127.0.0.2 here, in
 * the loopback range): a connection to another address of the host is refused; with
 * FSDP2_STORE_BIND=any it listens on every interface again. */
START_TEST(the_server_listens_only_on_the_address_the_ranks_were_told)
{
    fsdp2_store_t *store = NULL;
    int port = serve_on("127.0.0.2", &store);
    ck_assert_int_eq(tcp_connects("127.0.0.2", port), 1);
    ck_assert_int_eq(tcp_connects("127.0.0.1", port), 0);
    ck_assert_int_eq(fsdp2_store_destroy(store), FSDP2_SUCCESS);

    ck_assert_int_eq(setenv("FSDP2_STORE_BIND", "any", 1), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    port = serve_on("127.0.0.2", &store);
    ck_assert_int_eq(tcp_connects("127.0.0.1", port), 1);
    ck_assert_int_eq(fsdp2_store_destroy(store), FSDP2_SUCCESS);
    ck_assert_int_eq(unsetenv("FSDP2_STORE_BIND"), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
}
END_TEST

static int body_rank_2_dies(rank_ctx_t *ctx)
{
    RANK_OK(ctx, fsdp2_store_barrier(ctx->store, "start"));
    if (ctx->rank == 2)
        raise(SIGKILL);
    double t0 = now_s();
    char buf[8];
    RANK_STATUS(ctx, fsdp2_store_get(ctx->store, "from-rank-2", buf, sizeof(buf), NULL),
                FSDP2_ERR_TIMEOUT);
    RANK_STATUS(ctx, fsdp2_store_barrier(ctx->store, "after"), FSDP2_ERR_TIMEOUT);
    ctx->report->elapsed_s = now_s() - t0;
    snprintf(ctx->report->message, sizeof(ctx->report->message), "%s", fsdp2_last_error());
    return 0;
}

START_TEST(a_rank_killed_mid_run_makes_the_others_time_out_naming_it)
{
    run_spec_t spec = {3, 3, {1000, 1000, 1000}, body_rank_2_dies};
    shared_t *sh = shared_create();
    int wstatus[MAX_RANKS];
    run_ranks(&spec, sh, wstatus);
    ck_assert_msg(WIFSIGNALED(wstatus[2]) && WTERMSIG(wstatus[2]) == SIGKILL,
                  "rank 2 status 0x%x: %s", wstatus[2], sh->report[2].message);
    for (int r = 0; r < 2; r++) {
        expect_rank_exited_ok(sh, r, wstatus[r]);
        ck_assert_str_eq(sh->report[r].message,
                         "barrier 'after': rank 2 of 3 did not arrive within 1.0 s");
        ck_assert_msg(sh->report[r].elapsed_s < 8, "rank %d needed %.2f s", r,
                      sh->report[r].elapsed_s);
    }
    munmap(sh, sizeof(*sh));
}
END_TEST

static int body_server_dies(rank_ctx_t *ctx)
{
    RANK_OK(ctx, fsdp2_store_barrier(ctx->store, "start"));
    if (ctx->rank == 0) {
        RANK_EXPECT(ctx, wait_parked(ctx->store, ctx->world_size - 1) == 0,
                    "the other ranks' gets were never parked");
        raise(SIGKILL);
    }
    double t0 = now_s();
    char buf[8];
    RANK_STATUS(ctx, fsdp2_store_get(ctx->store, "never", buf, sizeof(buf), NULL),
                FSDP2_ERR_PEER_FAILED);
    ctx->report->elapsed_s = now_s() - t0;
    /* Later calls fail at once with the same error. */
    RANK_STATUS(ctx, fsdp2_store_set(ctx->store, "x", "1", 1), FSDP2_ERR_PEER_FAILED);
    return 0;
}

START_TEST(clients_get_peer_failed_long_before_the_timeout_when_the_server_dies)
{
    run_spec_t spec = {3, 3, {60000, 60000, 60000}, body_server_dies};
    shared_t *sh = shared_create();
    int wstatus[MAX_RANKS];
    run_ranks(&spec, sh, wstatus);
    ck_assert_msg(WIFSIGNALED(wstatus[0]) && WTERMSIG(wstatus[0]) == SIGKILL,
                  "rank 0 status 0x%x: %s", wstatus[0], sh->report[0].message);
    for (int r = 1; r < 3; r++) {
        expect_rank_exited_ok(sh, r, wstatus[r]);
        ck_assert_msg(sh->report[r].elapsed_s < 10, "rank %d noticed after %.2f s", r,
                      sh->report[r].elapsed_s);
    }
    munmap(sh, sizeof(*sh));
}
END_TEST

static int body_server_waits(rank_ctx_t *ctx)
{
    if (ctx->rank == 1) {
        RANK_OK(ctx, fsdp2_store_set(ctx->store, "ready", "", 0));
        char buf[8];
        RANK_STATUS(ctx, fsdp2_store_get(ctx->store, "never", buf, sizeof(buf), NULL),
                    FSDP2_ERR_TIMEOUT);
        ctx->report->at_s = now_s();
        return 0;
    }
    const char *ready = "ready";
    RANK_OK(ctx, fsdp2_store_wait(ctx->store, &ready, 1));
    fsdp2_store_t *store = ctx->store;
    ctx->store = NULL;
    RANK_OK(ctx, fsdp2_store_destroy(store));
    ctx->report->at_s = now_s();
    return 0;
}

START_TEST(server_destroy_waits_until_the_other_ranks_have_closed)
{
    run_spec_t spec = {2, 2, {20000, 1000}, body_server_waits};
    shared_t *sh = shared_create();
    int wstatus[MAX_RANKS];
    run_ranks(&spec, sh, wstatus);
    expect_rank_exited_ok(sh, 0, wstatus[0]);
    expect_rank_exited_ok(sh, 1, wstatus[1]);
    ck_assert_msg(sh->report[0].at_s > sh->report[1].at_s,
                  "the server stopped %.3f s before rank 1 finished",
                  sh->report[1].at_s - sh->report[0].at_s);
    ck_assert_msg(sh->report[0].at_s - sh->report[1].at_s < 10, "the server stopped %.2f s late",
                  sh->report[0].at_s - sh->report[1].at_s);
    munmap(sh, sizeof(*sh));
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Semantics and argument checks, the server and its one client in this process        */

START_TEST(get_and_wait_time_out_when_keys_never_come_and_the_store_stays_usable)
{
    fsdp2_store_t *st = open_store("127.0.0.1", 0, 1, 1, 0, 300);
    char buf[8];
    double t0 = now_s();
    ck_assert_int_eq(fsdp2_store_get(st, "x", buf, sizeof(buf), NULL), FSDP2_ERR_TIMEOUT);
    double elapsed = now_s() - t0;
    ck_assert_str_eq(fsdp2_last_error(), "get 'x': the key was not set within 0.3 s");
    ck_assert_msg(elapsed > 0.25 && elapsed < 3, "get gave up after %.2f s", elapsed);
    OK(fsdp2_store_set(st, "a", "1", 1));
    const char *keys[] = {"a", "b", "c", "d"};
    ck_assert_int_eq(fsdp2_store_wait(st, keys, 4), FSDP2_ERR_TIMEOUT);
    /* every missing key is named, and only those */
    ck_assert_str_eq(fsdp2_last_error(), "wait: 3 of 4 keys not set within 0.3 s: 'b', 'c', 'd'");
    OK(fsdp2_store_set(st, "b", "2", 1));
    OK(fsdp2_store_wait(st, keys, 2));
    OK(fsdp2_store_wait(st, NULL, 0));
    size_t len = 0;
    OK(fsdp2_store_get(st, "b", buf, sizeof(buf), &len));
    ck_assert_int_eq(len, 1);
    ck_assert_int_eq(buf[0], '2');
    OK(fsdp2_store_destroy(st));
}
END_TEST

START_TEST(add_and_compare_set_follow_their_definitions)
{
    fsdp2_store_t *st = open_store("127.0.0.1", 0, 1, 1, 0, 10000);
    int64_t v = 0;
    OK(fsdp2_store_add(st, "n", -7, &v));
    ck_assert_int_eq(v, -7);
    OK(fsdp2_store_add(st, "n", 10, &v));
    ck_assert_int_eq(v, 3);
    char text[32] = {0};
    OK(fsdp2_store_get(st, "n", text, sizeof(text) - 1, NULL));
    ck_assert_str_eq(text, "3");
    OK(fsdp2_store_set(st, "word", "abc", 3));
    ck_assert_int_eq(fsdp2_store_add(st, "word", 1, &v), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "'word'"));
    OK(fsdp2_store_set(st, "big", "9223372036854775807", 19));
    ck_assert_int_eq(fsdp2_store_add(st, "big", 1, &v), FSDP2_ERR_OVERFLOW);
    OK(fsdp2_store_get(st, "big", text, sizeof(text) - 1, NULL));
    ck_assert_str_eq(text, "9223372036854775807");
    int swapped = -1;
    OK(fsdp2_store_compare_set(st, "c", "x", 1, "y", 1, &swapped));
    ck_assert_int_eq(swapped, 0); /* missing equals only an empty expected */
    OK(fsdp2_store_compare_set(st, "c", NULL, 0, "y", 1, &swapped));
    ck_assert_int_eq(swapped, 1);
    OK(fsdp2_store_compare_set(st, "c", "x", 1, "z", 1, &swapped));
    ck_assert_int_eq(swapped, 0);
    OK(fsdp2_store_compare_set(st, "c", "y", 1, "", 0, &swapped));
    ck_assert_int_eq(swapped, 1);
    size_t len = 99;
    OK(fsdp2_store_get(st, "c", text, sizeof(text), &len));
    ck_assert_int_eq(len, 0);
    OK(fsdp2_store_destroy(st));
}
END_TEST

START_TEST(values_up_to_the_maximum_are_stored_and_larger_ones_refused)
{
    fsdp2_store_t *st = open_store("127.0.0.1", 0, 1, 1, 0, 30000);
    size_t max = FSDP2_STORE_VALUE_MAX;
    uint8_t *big = malloc(max + 1), *back = malloc(max);
    for (size_t i = 0; i <= max; i++)
        big[i] = (uint8_t)(i * 2654435761u >> 24);
    OK(fsdp2_store_set(st, "big", big, max));
    size_t len = 0;
    OK(fsdp2_store_get(st, "big", back, max, &len));
    ck_assert_int_eq(len, max);
    ck_assert_int_eq(memcmp(back, big, max), 0);
    ck_assert_int_eq(fsdp2_store_set(st, "bigger", big, max + 1), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_store_get(st, "big", back, 10, &len), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(len, max);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "16777216"));
    ck_assert_int_eq(memcmp(back, big, 10), 0);
    free(big);
    free(back);
    OK(fsdp2_store_destroy(st));
}
END_TEST

START_TEST(bad_arguments_are_refused_naming_the_value)
{
    fsdp2_store_t *st = NULL;
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    ck_assert_int_eq(fsdp2_store_create(NULL, &st), FSDP2_ERR_INVALID_ARGUMENT);
    o.size = 8;
    ck_assert_int_eq(fsdp2_store_create(&o, &st), FSDP2_ERR_INVALID_ARGUMENT);
    o.size = sizeof(o);
    o.rank = 2;
    o.world_size = 2;
    ck_assert_int_eq(fsdp2_store_create(&o, &st), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "rank=2"));
    o.rank = 0;
    o.port = 70000;
    ck_assert_int_eq(fsdp2_store_create(&o, &st), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "port=70000"));
    o.port = 0; /* a client needs a real port */
    ck_assert_int_eq(fsdp2_store_create(&o, &st), FSDP2_ERR_INVALID_ARGUMENT);
    o.host = "";
    o.is_server = 1;
    ck_assert_int_eq(fsdp2_store_create(&o, &st), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(st);
    st = open_store("127.0.0.1", 0, 1, 1, 0, 10000);
    char key[FSDP2_STORE_KEY_MAX + 2];
    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    ck_assert_int_eq(fsdp2_store_set(st, key, "", 0), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_store_set(st, "", "", 0), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_store_set(st, NULL, "", 0), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_store_barrier(st, ""), FSDP2_ERR_INVALID_ARGUMENT);
    key[FSDP2_STORE_KEY_MAX] = '\0';
    OK(fsdp2_store_set(st, key, "", 0));
    OK(fsdp2_store_barrier(st, "one rank"));
    OK(fsdp2_store_destroy(st));
    OK(fsdp2_store_destroy(NULL));
}
END_TEST

static Suite *store_suite(void)
{
    Suite *s = suite_create("store");
    TCase *multi = tcase_create("processes");
    tcase_set_timeout(multi, 120);
    tcase_add_loop_test(multi, values_set_by_each_rank_read_back_identically_by_every_rank, 0,
                        MAX_RANKS);
    tcase_add_test(multi, get_is_parked_by_the_server_until_another_rank_sets_the_key);
    tcase_add_test(multi, a_wait_unless_ends_when_its_first_key_appears_while_another_is_missing);
    tcase_add_test(multi, add_from_4_ranks_x_1000_reaches_4000_with_every_result_seen_once);
    tcase_add_test(multi, compare_set_races_between_4_ranks_have_exactly_one_winner);
    tcase_add_test(multi, barrier_times_out_naming_the_ranks_that_never_connected);
    tcase_add_test(multi, barrier_timeout_comes_from_FSDP2_TIMEOUT_without_an_option);
    tcase_add_test(multi, a_rank_killed_mid_run_makes_the_others_time_out_naming_it);
    tcase_add_test(multi, clients_get_peer_failed_long_before_the_timeout_when_the_server_dies);
    tcase_add_test(multi, server_destroy_waits_until_the_other_ranks_have_closed);
    suite_add_tcase(s, multi);

    TCase *one = tcase_create("one process");
    tcase_set_timeout(one, 120);
    tcase_add_test(one, get_and_wait_time_out_when_keys_never_come_and_the_store_stays_usable);
    tcase_add_test(one,
                   a_wait_unless_prefers_keys_that_exist_and_times_out_naming_the_missing_ones);
    tcase_add_test(one, add_and_compare_set_follow_their_definitions);
    tcase_add_test(one, values_up_to_the_maximum_are_stored_and_larger_ones_refused);
    tcase_add_test(one, bad_arguments_are_refused_naming_the_value);
    tcase_add_test(one, the_server_listens_only_on_the_address_the_ranks_were_told);
    suite_add_tcase(s, one);
    return s;
}

FSDP2_CHECK_MAIN(store_suite)
