/* The nccl backend on cuda:0 through the public API.
 *
 * One GPU holds one rank of an NCCL communicator (NCCL refuses two ranks on one GPU),
 * so the collectives run in groups of one; what a group of one proves: the
 * communicator comes up from the store's unique id (also again under a name used
 * before), every collective reaches NCCL with the right buffers, counts, dtypes and
 * reduction (sum, avg and pre/post divides against the library's own reduction on the
 * host), on side streams and the current stream, all_gather_pieces lands every byte in
 * its piece and nothing between them, and misuse is refused with a clear error. A
 * second process asking for the same GPU gets NCCL's refusal as a clear error. The
 * watchdog test (--watchdog) blocks a stream behind a host function and expects the
 * group to fail with TIMEOUT and the communicator to be aborted; it runs as its own
 * process (a meson test of its own) so that an abort cannot touch the other tests.
 *
 * A standalone program: exit 0 on success, 1 on failure, 77 (SKIP) without a CUDA
 * device. */
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collectives/group_internal.h"
#include "gpu_check.h"

extern char **environ;

static const fsdp2_device_t dut = {FSDP2_DEVICE_CUDA, 0};
static fsdp2_store_t *store;

static fsdp2_status_t make_store(int rank, int world, int port, fsdp2_store_t **out)
{
    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.is_server = rank == 0;
    so.port = port;
    so.world_size = world;
    so.rank = rank;
    so.timeout_ms = 60000;
    return fsdp2_store_create(&so, out);
}

static fsdp2_status_t make_group(const char *name, long timeout_ms, fsdp2_group_t **g)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.backend = FSDP2_BACKEND_NCCL;
    go.cuda_device = 0;
    go.timeout_ms = timeout_ms;
    return fsdp2_group_create(store, name, 0, 1, &go, g);
}

/* A device buffer of bytes filled from host (poison when host is NULL). */
static void *device_copy(const void *host, size_t bytes, fsdp2_stream_t *s)
{
    void *d = NULL;
    if (fsdp2_device_alloc(dut, bytes, &d) != FSDP2_SUCCESS) {
        fprintf(stderr, "device_alloc(%zu): %s\n", bytes, fsdp2_last_error());
        exit(1);
    }
    void *poison = NULL;
    if (!host) {
        poison = xmalloc(bytes);
        memset(poison, 0xab, bytes);
        host = poison;
    }
    if (upload(d, host, bytes, s) != FSDP2_SUCCESS) {
        fprintf(stderr, "upload: %s\n", fsdp2_last_error());
        exit(1);
    }
    free(poison);
    return d;
}

/* ---- set-up ---------------------------------------------------------------------- */

static void test_missing_device_is_refused_by_name(void)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.backend = FSDP2_BACKEND_NCCL;
    go.cuda_device = 99;
    fsdp2_group_t *g = NULL;
    ASSERT_STATUS(fsdp2_group_create(store, "missing-gpu", 0, 1, &go, &g),
                  FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(fsdp2_last_error(), "cuda:99") != NULL, "message: %s", fsdp2_last_error());
    ASSERT_TRUE(g == NULL, "a group came back");
}

static void test_group_name_can_be_created_again(void)
{
    fsdp2_stream_t *s;
    ASSERT_OK(fsdp2_stream_create(dut, "again", &s));
    for (int round = 0; round < 3; round++) {
        fsdp2_group_t *g;
        ASSERT_OK(make_group("again", 0, &g));
        ASSERT_OK(fsdp2_barrier_async(g, s));
        ASSERT_OK(fsdp2_stream_synchronize(s));
        ASSERT_OK(fsdp2_group_error(g));
        ASSERT_OK(fsdp2_group_destroy(g));
    }
    ASSERT_OK(fsdp2_stream_destroy(s));
}

/* ---- data movement ---------------------------------------------------------------- */

static void test_all_gather_and_broadcast_move_every_dtype(void)
{
    fsdp2_group_t *g;
    fsdp2_stream_t *s;
    ASSERT_OK(make_group("gather", 0, &g));
    ASSERT_OK(fsdp2_stream_create(dut, "gather", &s));
    for (int d = 0; d < FSDP2_DTYPE_COUNT; d++) {
        fsdp2_dtype_t t = (fsdp2_dtype_t)d;
        size_t n = 1001, bytes = n * dsize(t);
        void *host = xmalloc(bytes), *got = xmalloc(bytes);
        random_values(host, t, n, 20);
        void *send = device_copy(host, bytes, s), *recv = device_copy(NULL, bytes, s);
        ASSERT_OK(fsdp2_all_gather_async(g, send, recv, n, t, s));
        ASSERT_OK(download(got, recv, bytes, s));
        ASSERT_TRUE(first_difference(host, got, t, n) < 0, "all_gather %s: element %ld",
                    fsdp2_dtype_name(t), first_difference(host, got, t, n));
        /* In place: send is the rank's block of recv. */
        ASSERT_OK(fsdp2_all_gather_async(g, recv, recv, n, t, s));
        ASSERT_OK(fsdp2_broadcast_async(g, recv, n, t, 0, s));
        ASSERT_OK(download(got, recv, bytes, s));
        ASSERT_TRUE(first_difference(host, got, t, n) < 0, "in place / broadcast %s",
                    fsdp2_dtype_name(t));
        ASSERT_OK(fsdp2_device_free(dut, send));
        ASSERT_OK(fsdp2_device_free(dut, recv));
        free(host);
        free(got);
    }
    /* count 0 is accepted and does nothing. */
    ASSERT_OK(fsdp2_all_gather_async(g, NULL, NULL, 0, FSDP2_F32, s));
    ASSERT_OK(fsdp2_stream_synchronize(s));
    ASSERT_OK(fsdp2_group_error(g));
    ASSERT_OK(fsdp2_stream_destroy(s));
    ASSERT_OK(fsdp2_group_destroy(g));
}

/* Pieces scattered over a buffer with gaps (grouped broadcasts), then one contiguous
 * run (a plain all-gather): the pieces get send's bytes in order, the gaps keep their
 * poison. */
static void test_all_gather_pieces_fill_pieces_and_nothing_else(void)
{
    fsdp2_group_t *g;
    fsdp2_stream_t *s;
    ASSERT_OK(make_group("pieces", 0, &g));
    ASSERT_OK(fsdp2_stream_create(dut, "pieces", &s));
    const size_t at[] = {4000, 16, 1200}, len[] = {100, 28, 901};
    size_t bytes = 100 + 28 + 901, whole = 8192;
    unsigned char *host = xmalloc(bytes), *got = xmalloc(whole), *want = xmalloc(whole);
    random_values(host, FSDP2_U8, bytes, 8);
    for (int contiguous = 0; contiguous < 2; contiguous++) {
        unsigned char *send = device_copy(host, bytes, s), *buf = device_copy(NULL, whole, s);
        memset(want, 0xab, whole);
        fsdp2_iov_t pieces[3];
        size_t from = 0, next = 64;
        for (int k = 0; k < 3; k++) {
            size_t place = contiguous ? next : at[k];
            pieces[k] = (fsdp2_iov_t){buf + place, len[k]};
            memcpy(want + place, host + from, len[k]);
            from += len[k];
            next += len[k];
        }
        size_t offsets[2] = {0, 3};
        ASSERT_OK(fsdp2_all_gather_pieces_async(g, send, bytes, pieces, offsets, s));
        ASSERT_OK(download(got, buf, whole, s));
        long i = first_difference(want, got, FSDP2_U8, whole);
        ASSERT_TRUE(i < 0, "%s pieces: byte %ld is 0x%02x, want 0x%02x",
                    contiguous ? "contiguous" : "scattered", i, i >= 0 ? got[i] : 0,
                    i >= 0 ? want[i] : 0);
        ASSERT_OK(fsdp2_device_free(dut, send));
        ASSERT_OK(fsdp2_device_free(dut, buf));
    }
    free(host);
    free(got);
    free(want);
    ASSERT_OK(fsdp2_group_error(g));
    ASSERT_OK(fsdp2_stream_destroy(s));
    ASSERT_OK(fsdp2_group_destroy(g));
}

/* ---- reductions ------------------------------------------------------------------- */

/* |a - b| within tol of |b| (tol 0: equal). */
static int close_enough(double a, double b, double tol)
{
    return a == b || fabs(a - b) <= tol * fabs(b);
}

static void check_reduction(fsdp2_group_t *g, fsdp2_stream_t *s, fsdp2_dtype_t t,
                            fsdp2_reduce_t r, int all_reduce, size_t n)
{
    size_t bytes = n * dsize(t);
    void *x = xmalloc(bytes), *want = xmalloc(bytes), *got = xmalloc(bytes);
    random_values(x, t, n, 10);
    const void *src[1] = {x};
    double post = r.post_divide; /* AVG divides by the group's size, 1 here */
    fsdp2_reduce_rank_order(want, t, src, 1, n, r.pre_divide, post);
    void *send = device_copy(x, bytes, s), *recv = device_copy(NULL, bytes, s);
    if (all_reduce)
        ASSERT_OK(fsdp2_all_reduce_async(g, send, n, t, &r, s));
    else
        ASSERT_OK(fsdp2_reduce_scatter_async(g, send, recv, n, t, &r, s));
    ASSERT_OK(download(got, all_reduce ? send : recv, bytes, s));
    /* A group of one reduces with the library's own kernel when it divides (NCCL's
     * one-rank kernel drops tail elements before 2.29.7) and copies otherwise: the host
     * reduction's bits either way. */
    double tol = 0;
    for (size_t i = 0; i < n; i++) {
        double a = 0, b = 0;
        fsdp2_convert(&a, FSDP2_F64, (char *)got + i * dsize(t), t, 1);
        fsdp2_convert(&b, FSDP2_F64, (char *)want + i * dsize(t), t, 1);
        ASSERT_TRUE(close_enough(a, b, tol),
                    "%s %s op %d pre %g post %g: element %zu is %.9g, want %.9g",
                    all_reduce ? "all_reduce" : "reduce_scatter", fsdp2_dtype_name(t), (int)r.op,
                    r.pre_divide, r.post_divide, i, a, b);
    }
    ASSERT_OK(fsdp2_device_free(dut, send));
    ASSERT_OK(fsdp2_device_free(dut, recv));
    free(x);
    free(want);
    free(got);
}

static void test_reductions_match_the_host_reduction(void)
{
    fsdp2_group_t *g;
    fsdp2_stream_t *s;
    ASSERT_OK(make_group("reduce", 0, &g));
    ASSERT_OK(fsdp2_stream_create(dut, "reduce", &s));
    const fsdp2_dtype_t floats[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16};
    const fsdp2_reduce_t reds[] = {
        {FSDP2_REDUCE_SUM, 1, 1}, {FSDP2_REDUCE_AVG, 1, 1}, {FSDP2_REDUCE_SUM, 2, 4},
        {FSDP2_REDUCE_AVG, 3, 1.5}, {FSDP2_REDUCE_SUM, 1, 10},
    };
    for (int d = 0; d < 4; d++)
        for (size_t k = 0; k < sizeof reds / sizeof reds[0]; k++)
            for (int all = 0; all < 2; all++) {
                int before = failures;
                check_reduction(g, s, floats[d], reds[k], all, 4099);
                check_reduction(g, s, floats[d], reds[k], all, 1);
                if (failures != before)
                    goto done;
            }
done:
    ASSERT_OK(fsdp2_group_error(g));
    ASSERT_OK(fsdp2_stream_destroy(s));
    ASSERT_OK(fsdp2_group_destroy(g));
}

/* An all-gather on a side stream and an all-reduce on the current stream, ordered by an
 * event: the all-reduce reads what the all-gather wrote. */
static void test_streams_and_events_order_collectives(void)
{
    fsdp2_group_t *g;
    fsdp2_stream_t *side, *cur;
    fsdp2_event_t *ev;
    ASSERT_OK(make_group("streams", 0, &g));
    ASSERT_OK(fsdp2_stream_create(dut, "side", &side));
    ASSERT_OK(fsdp2_stream_current(dut, &cur));
    ASSERT_OK(fsdp2_event_create(dut, &ev));
    size_t n = 1 << 22, bytes = n * sizeof(float);
    float *host = xmalloc(bytes), *got = xmalloc(bytes);
    random_values(host, FSDP2_F32, n, 10);
    void *send = device_copy(host, bytes, side), *recv = device_copy(NULL, bytes, side);
    ASSERT_OK(fsdp2_all_gather_async(g, send, recv, n, FSDP2_F32, side));
    ASSERT_OK(fsdp2_event_record(ev, side));
    ASSERT_OK(fsdp2_stream_wait_event(cur, ev));
    fsdp2_reduce_t r = {FSDP2_REDUCE_SUM, 1, 2};
    ASSERT_OK(fsdp2_all_reduce_async(g, recv, n, FSDP2_F32, &r, cur));
    ASSERT_OK(download(got, recv, bytes, cur));
    for (size_t i = 0; i < n; i++)
        ASSERT_TRUE(got[i] == host[i] * 0.5f, "element %zu: %g, want %g", i, got[i],
                    host[i] * 0.5f);
    ASSERT_OK(fsdp2_device_free(dut, send));
    ASSERT_OK(fsdp2_device_free(dut, recv));
    free(host);
    free(got);
    ASSERT_OK(fsdp2_event_destroy(ev));
    ASSERT_OK(fsdp2_stream_destroy(side));
    ASSERT_OK(fsdp2_group_destroy(g));
}

/* ---- misuse and failure ----------------------------------------------------------- */

static void test_cpu_stream_is_refused_before_the_group_moves_on(void)
{
    fsdp2_group_t *g;
    fsdp2_stream_t *host;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    ASSERT_OK(make_group("misuse", 0, &g));
    ASSERT_OK(fsdp2_stream_current(cpu, &host));
    float x[4] = {1, 2, 3, 4};
    ASSERT_STATUS(fsdp2_all_reduce_async(g, x, 4, FSDP2_F32, NULL, host),
                  FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(fsdp2_last_error(), "streams of cuda:0") != NULL, "message: %s",
                fsdp2_last_error());
    /* Refused before it took a sequence number: the group is still usable. */
    ASSERT_OK(fsdp2_group_error(g));
    fsdp2_stream_t *s;
    ASSERT_OK(fsdp2_stream_create(dut, "after-misuse", &s));
    ASSERT_OK(fsdp2_barrier_async(g, s));
    ASSERT_OK(fsdp2_stream_synchronize(s));
    ASSERT_OK(fsdp2_stream_destroy(s));
    ASSERT_OK(fsdp2_group_destroy(g));
}

static void test_abort_fails_later_collectives(void)
{
    fsdp2_group_t *g;
    fsdp2_stream_t *s;
    ASSERT_OK(make_group("abort", 0, &g));
    ASSERT_OK(fsdp2_stream_create(dut, "abort", &s));
    ASSERT_OK(fsdp2_barrier_async(g, s));
    ASSERT_OK(fsdp2_stream_synchronize(s));
    ASSERT_OK(fsdp2_group_abort(g));
    ASSERT_STATUS(fsdp2_barrier_async(g, s), FSDP2_ERR_ABORTED);
    ASSERT_STATUS(fsdp2_group_error(g), FSDP2_ERR_ABORTED);
    ASSERT_OK(fsdp2_stream_synchronize(s));
    ASSERT_OK(fsdp2_stream_destroy(s));
    ASSERT_OK(fsdp2_group_destroy(g));
}

/* Rank 1 in a child process on the same GPU: NCCL refuses the pair; both ranks must
 * get an error (not a hang, not a crash) that says why. */
static void test_two_ranks_on_one_gpu_are_refused_clearly(const char *self)
{
    fsdp2_store_t *pair;
    ASSERT_OK(make_store(0, 2, 0, &pair));
    int port = 0;
    ASSERT_OK(fsdp2_store_port(pair, &port));
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    char *argv[] = {(char *)self, "--rank1", port_text, NULL};
    pid_t child;
    ASSERT_TRUE(posix_spawn(&child, self, NULL, NULL, argv, environ) == 0, "spawn %s", self);
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.backend = FSDP2_BACKEND_NCCL;
    go.cuda_device = 0;
    go.timeout_ms = 30000;
    fsdp2_group_t *g = NULL;
    fsdp2_status_t st = fsdp2_group_create(pair, "pair", 0, 2, &go, &g);
    char message[512];
    snprintf(message, sizeof message, "%s", fsdp2_last_error());
    int status = 0;
    waitpid(child, &status, 0);
    fsdp2_group_destroy(g);
    fsdp2_store_destroy(pair);
    printf("    rank 0 of 2 on one GPU: %s: %s\n", fsdp2_status_name(st), message);
    ASSERT_TRUE(st != FSDP2_SUCCESS, "two ranks on one GPU were accepted");
    ASSERT_TRUE(strstr(message, "ncclCommInitRankConfig") != NULL, "message: %s", message);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "rank 1 did not get an error (exit status %d)", status);
}

static int run_rank1(int port)
{
    fsdp2_store_t *pair;
    if (make_store(1, 2, port, &pair) != FSDP2_SUCCESS)
        return 2;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.backend = FSDP2_BACKEND_NCCL;
    go.cuda_device = 0;
    go.timeout_ms = 30000;
    fsdp2_group_t *g = NULL;
    fsdp2_status_t st = fsdp2_group_create(pair, "pair", 1, 2, &go, &g);
    printf("    rank 1 of 2 on one GPU: %s: %s\n", fsdp2_status_name(st), fsdp2_last_error());
    fsdp2_group_destroy(g);
    fsdp2_store_destroy(pair);
    return st == FSDP2_SUCCESS ? 1 : 0;
}

/* The stream is held by a host function; the all-reduce behind it cannot finish, so
 * the watchdog must fail the group with TIMEOUT and abort the communicator. */
static void test_watchdog_fails_a_collective_past_the_timeout(void)
{
    fsdp2_group_t *g;
    fsdp2_stream_t *s;
    gate_t gate = {0};
    ASSERT_OK(make_group("watchdog", 3000, &g)); /* NCCL's init takes most of a second */
    ASSERT_OK(fsdp2_stream_create(dut, "held", &s));
    size_t n = 1024;
    void *buf = device_copy(NULL, n * sizeof(float), s);
    ASSERT_OK(fsdp2_stream_launch_host(s, gate_wait, &gate));
    ASSERT_OK(fsdp2_all_reduce_async(g, buf, n, FSDP2_F32, NULL, s));
    struct timespec nap = {0, 10 * 1000 * 1000};
    fsdp2_status_t st = FSDP2_SUCCESS;
    int waited_ms = 0;
    for (; waited_ms < 30000 && (st = fsdp2_group_error(g)) == FSDP2_SUCCESS; waited_ms += 10)
        nanosleep(&nap, NULL);
    char message[640];
    snprintf(message, sizeof message, "%s", fsdp2_last_error());
    atomic_store(&gate.open, 1);
    printf("    after %d ms: %s: %s\n", waited_ms, fsdp2_status_name(st), message);
    ASSERT_TRUE(st == FSDP2_ERR_TIMEOUT, "group error %s after %d ms", fsdp2_status_name(st),
                waited_ms);
    ASSERT_TRUE(waited_ms >= 2500, "timed out after %d ms, before the 3 s timeout", waited_ms);
    ASSERT_TRUE(strstr(message, "all_reduce") && strstr(message, "aborted"), "message: %s",
                message);
    ASSERT_OK(fsdp2_stream_synchronize(s));
    ASSERT_STATUS(fsdp2_barrier_async(g, s), FSDP2_ERR_TIMEOUT);
    ASSERT_OK(fsdp2_device_free(dut, buf));
    ASSERT_OK(fsdp2_stream_destroy(s));
    ASSERT_OK(fsdp2_group_destroy(g));
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--rank1") == 0)
        return run_rank1(atoi(argv[2]));
    int count = 0;
    if (fsdp2_cuda_device_count(&count) != FSDP2_SUCCESS || count == 0) {
        printf("SKIP: no CUDA device (%s)\n", fsdp2_last_error());
        return 77;
    }
    if (make_store(0, 1, 0, &store) != FSDP2_SUCCESS) {
        fprintf(stderr, "store: %s\n", fsdp2_last_error());
        return 1;
    }
    int watchdog = argc == 2 && strcmp(argv[1], "--watchdog") == 0;
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
#define T(name) {#name, test_##name}
        T(missing_device_is_refused_by_name),
        T(group_name_can_be_created_again),
        T(all_gather_and_broadcast_move_every_dtype),
        T(all_gather_pieces_fill_pieces_and_nothing_else),
        T(reductions_match_the_host_reduction),
        T(streams_and_events_order_collectives),
        T(cpu_stream_is_refused_before_the_group_moves_on),
        T(abort_fails_later_collectives),
#undef T
    };
    if (watchdog) {
        test_watchdog_fails_a_collective_past_the_timeout();
        printf("%s - watchdog_fails_a_collective_past_the_timeout\n", failures ? "FAIL" : "ok");
    } else {
        for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
            int before = failures;
            tests[i].fn();
            printf("%s - %s\n", failures == before ? "ok" : "FAIL", tests[i].name);
        }
        int before = failures;
        test_two_ranks_on_one_gpu_are_refused_clearly(argv[0]);
        printf("%s - two_ranks_on_one_gpu_are_refused_clearly\n",
               failures == before ? "ok" : "FAIL");
    }
    fsdp2_store_destroy(store);
    if (failures)
        fprintf(stderr, "test_nccl: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
