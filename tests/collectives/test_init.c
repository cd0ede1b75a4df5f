/* fsdp2_init: a process with no launcher variables is a world of 1 with a working world
 * group; bad launcher variables are errors naming them, and nothing is left behind. The
 * context's HSDP mesh: one process, bad shard sizes, and two processes whose launcher
 * variables break the node rules (every rank refuses, none waits). Ranks that never
 * start: every rank that did names them, within the timeout.
 * (Multi-rank fsdp2_init runs in two_nodes.sh through coll_check.) */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/check_main.h"
#include "core/env_internal.h"
#include "core/fault.h"
#include <fsdp2/fsdp2.h>

static const char *const launcher_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
    "SLURM_NTASKS", "PMI_RANK", "PMI_SIZE"};

static void clear_launcher_env(void)
{
    for (size_t i = 0; i < sizeof(launcher_vars) / sizeof(launcher_vars[0]); i++)
        unsetenv(launcher_vars[i]);
}

START_TEST(a_bare_process_is_a_world_of_one_with_a_working_group)
{
    clear_launcher_env();
    fsdp2_context_t *ctx;
    ck_assert_msg(fsdp2_init(NULL, &ctx) == FSDP2_SUCCESS, "%s", fsdp2_last_error());
    fsdp2_process_info_t info;
    fsdp2_group_t *world;
    ck_assert_int_eq(fsdp2_context_info(ctx, &info), FSDP2_SUCCESS);
    ck_assert_int_eq(info.rank, 0);
    ck_assert_int_eq(info.world_size, 1);
    ck_assert_int_eq(fsdp2_context_world(ctx, &world), FSDP2_SUCCESS);
    fsdp2_stream_t *cur;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    ck_assert_int_eq(fsdp2_stream_current(cpu, &cur), FSDP2_SUCCESS);
    float x[3] = {1, 2, 3};
    ck_assert_int_eq(fsdp2_all_reduce_async(world, x, 3, FSDP2_F32, NULL, cur), FSDP2_SUCCESS);
    ck_assert_float_eq(x[2], 3.0f);
    ck_assert_int_eq(fsdp2_finalize(ctx), FSDP2_SUCCESS);
}
END_TEST

START_TEST(bad_launcher_variables_are_errors_naming_them)
{
    clear_launcher_env();
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "2", 1);
    fsdp2_context_t *ctx = (fsdp2_context_t *)&ctx;
    ck_assert_int_eq(fsdp2_init(NULL, &ctx), FSDP2_ERR_INVALID_CONFIG);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(fsdp2_last_error(), "RANK") != NULL, "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_finalize(NULL), FSDP2_SUCCESS);
}
END_TEST

START_TEST(the_hsdp_mesh_of_one_process_and_bad_shard_sizes)
{
    clear_launcher_env();
    fsdp2_context_t *ctx;
    ck_assert_msg(fsdp2_init(NULL, &ctx) == FSDP2_SUCCESS, "%s", fsdp2_last_error());
    fsdp2_mesh_t *mesh = NULL, *again = NULL;
    ck_assert_msg(fsdp2_context_hsdp_mesh(ctx, 0, &mesh) == FSDP2_SUCCESS, "%s",
                  fsdp2_last_error());
    ck_assert_int_eq(fsdp2_context_hsdp_mesh(ctx, 1, &again), FSDP2_SUCCESS);
    ck_assert_ptr_eq(mesh, again);
    int ndim = 0, size0 = 0, size1 = 0, dim = -1;
    ck_assert_int_eq(fsdp2_mesh_ndim(mesh, &ndim), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_mesh_size(mesh, 0, &size0), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_mesh_size(mesh, 1, &size1), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_mesh_dim(mesh, "shard", &dim), FSDP2_SUCCESS);
    ck_assert_int_eq(ndim, 2);
    ck_assert_int_eq(size0, 1);
    ck_assert_int_eq(size1, 1);
    ck_assert_int_eq(dim, 1);
    const int bad[] = {3, -2};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char needle[64];
        snprintf(needle, sizeof(needle), "shard size %d does not divide the world size 1", bad[i]);
        ck_assert_int_eq(fsdp2_context_hsdp_mesh(ctx, bad[i], &again), FSDP2_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_null(again);
        ck_assert_msg(strstr(fsdp2_last_error(), needle), "%s", fsdp2_last_error());
    }
    ck_assert_int_eq(fsdp2_context_hsdp_mesh(NULL, 0, &again), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_finalize(ctx), FSDP2_SUCCESS);
}
END_TEST

/* Two processes with launcher variables of our choosing: each inits, asks for the
 * natural HSDP mesh and must get `want` (with a message naming `needle`); then an
 * explicit shard size of 2 and of 1 must work. local_rank[r], local_world[r] per rank. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* The launcher's variables of rank `rank` of a world of 2 on 127.0.0.1:port. */
static void set_pair_env(int rank, int port, int local_rank, int local_world)
{
    clear_launcher_env();
    char v[32];
    setenv("WORLD_SIZE", "2", 1);
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", local_rank);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof(v), "%d", local_world);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof(v), "%d", port);
    setenv("MASTER_PORT", v, 1);
    setenv("FSDP2_TIMEOUT", "20", 1);
}

static int hsdp_rank(int rank, int port, const int *local_rank, const int *local_world,
                     fsdp2_status_t want, const char *needle)
{
    set_pair_env(rank, port, local_rank[rank], local_world[rank]);
    fsdp2_context_t *ctx;
    if (fsdp2_init(NULL, &ctx) != FSDP2_SUCCESS) {
        fprintf(stderr, "rank %d: init: %s\n", rank, fsdp2_last_error());
        return 1;
    }
    fsdp2_mesh_t *mesh = NULL;
    int bad = 0;
    fsdp2_status_t s = fsdp2_context_hsdp_mesh(ctx, 0, &mesh);
    if (s != want || (needle && !strstr(fsdp2_last_error(), needle))) {
        fprintf(stderr, "rank %d: natural hsdp mesh gave %s (%s), want %s naming '%s'\n", rank,
                fsdp2_status_name(s), fsdp2_last_error(), fsdp2_status_name(want),
                needle ? needle : "");
        bad = 1;
    }
    for (int shard = 2; shard >= 1 && !bad; shard--) {
        if (fsdp2_context_hsdp_mesh(ctx, shard, &mesh) != FSDP2_SUCCESS) {
            fprintf(stderr, "rank %d: shard %d: %s\n", rank, shard, fsdp2_last_error());
            bad = 1;
        }
    }
    return fsdp2_finalize(ctx) != FSDP2_SUCCESS || bad;
}

/* Runs body(rank, port, arg) as ranks 0 and 1 in two child processes, the store on a
 * free port; both must exit 0. Returns the port. */
typedef int (*pair_body_fn)(int rank, int port, const void *arg);

static int run_pair(pair_body_fn body, const void *arg)
{
    int port = free_port();
    ck_assert_int_gt(port, 0);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0)
            _exit(body(r, port, arg));
    }
    for (int r = 0; r < 2; r++) {
        int status = 0;
        ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d failed (%d)", r,
                      status);
    }
    return port;
}

typedef struct hsdp_case {
    const int *local_rank, *local_world;
    fsdp2_status_t want;
    const char *needle;
} hsdp_case_t;

static int hsdp_body(int rank, int port, const void *arg)
{
    const hsdp_case_t *c = arg;
    return hsdp_rank(rank, port, c->local_rank, c->local_world, c->want, c->needle);
}

static void run_hsdp_pair(const int *local_rank, const int *local_world, fsdp2_status_t want,
                          const char *needle)
{
    hsdp_case_t c = {local_rank, local_world, want, needle};
    run_pair(hsdp_body, &c);
}

/* fsdp2_init failing after the world was made (FSDP2_TRACE's directory missing) keeps
 * the cause as its message on every rank: tearing the world down must not replace it. */
static int bad_trace_body(int rank, int port, const void *arg)
{
    (void)arg;
    set_pair_env(rank, port, rank, 2);
    setenv("FSDP2_TRACE", "/nonexistent-dir/t.json", 1);
    fsdp2_env_reload();
    fsdp2_context_t *ctx = NULL;
    fsdp2_status_t s = fsdp2_init(NULL, &ctx);
    if (s != FSDP2_ERR_INVALID_CONFIG ||
        !strstr(fsdp2_last_error(), "FSDP2_TRACE='/nonexistent-dir/t.json'")) {
        fprintf(stderr, "rank %d: init gave %s (%s), want INVALID_CONFIG naming FSDP2_TRACE\n",
                rank, fsdp2_status_name(s), fsdp2_last_error());
        return 1;
    }
    return 0;
}

/* fsdp2_init failing on rank 1 alone, after the world was made: rank 0's init succeeds,
 * and its first collective fails naming rank 1 and the cause, though rank 1's process
 * lives on until rank 0 is done (no pid check can find it gone; without the news rank 0
 * would wait for FSDP2_TIMEOUT and fail with ERR_TIMEOUT). arg: a pipe, written by rank
 * 0 when it is done. */
static int one_bad_trace_body(int rank, int port, const void *arg)
{
    const int *done = arg;
    set_pair_env(rank, port, rank, 2);
    if (rank == 1) {
        setenv("FSDP2_TRACE", "/nonexistent-dir/t.json", 1);
        fsdp2_env_reload();
    }
    fsdp2_context_t *ctx = NULL;
    fsdp2_status_t s = fsdp2_init(NULL, &ctx);
    if (rank == 1) {
        int bad = s != FSDP2_ERR_INVALID_CONFIG;
        if (bad)
            fprintf(stderr, "rank 1: init gave %s (%s)\n", fsdp2_status_name(s),
                    fsdp2_last_error());
        struct pollfd p = {done[0], POLLIN, 0};
        bad |= poll(&p, 1, 60000) != 1;
        return bad;
    }
    if (s != FSDP2_SUCCESS) {
        fprintf(stderr, "rank 0: init: %s\n", fsdp2_last_error());
        return 1;
    }
    fsdp2_group_t *world = NULL;
    fsdp2_stream_t *stream = NULL;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    float x = 1;
    s = fsdp2_context_world(ctx, &world);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_current(cpu, &stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_all_reduce_async(world, &x, 1, FSDP2_F32, NULL, stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(stream);
    const char *msg = fsdp2_last_error();
    int bad = s != FSDP2_ERR_PEER_FAILED || !strstr(msg, "rank 1") || !strstr(msg, "FSDP2_TRACE");
    if (bad)
        fprintf(stderr, "rank 0: all_reduce gave %s: %s\n", fsdp2_status_name(s), msg);
    bad |= write(done[1], "x", 1) != 1;
    fsdp2_finalize(ctx);
    return bad;
}

START_TEST(an_init_that_fails_on_one_rank_fails_the_others_first_collective_at_once)
{
    int done[2];
    ck_assert_int_eq(pipe(done), 0);
    run_pair(one_bad_trace_body, done);
    close(done[0]);
    close(done[1]);
}
END_TEST

/* An HSDP mesh whose creation failed (rank 1's first allocation in it) fails on both
 * ranks, and asking again makes it: the retry takes a name of its own, since the failed
 * creation left its keys in the store. */
static int hsdp_retry_body(int rank, int port, const void *arg)
{
    (void)arg;
    set_pair_env(rank, port, rank, 2);
    fsdp2_context_t *ctx = NULL;
    if (fsdp2_init(NULL, &ctx) != FSDP2_SUCCESS) {
        fprintf(stderr, "rank %d: init: %s\n", rank, fsdp2_last_error());
        return 1;
    }
    fsdp2_mesh_t *mesh = NULL;
    if (rank == 1)
        fsdp2_fault_arm(FAULT_ALLOC, 1);
    fsdp2_status_t s = fsdp2_context_hsdp_mesh(ctx, 2, &mesh);
    fsdp2_fault_disarm();
    fsdp2_status_t want = rank == 1 ? FSDP2_ERR_OUT_OF_MEMORY : FSDP2_ERR_PEER_FAILED;
    int bad = s != want || mesh != NULL;
    if (bad)
        fprintf(stderr, "rank %d: first hsdp mesh gave %s, want %s: %s\n", rank,
                fsdp2_status_name(s), fsdp2_status_name(want), fsdp2_last_error());
    fsdp2_group_t *g = NULL;
    fsdp2_stream_t *stream = NULL;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    float x = (float)rank + 1;
    s = fsdp2_context_hsdp_mesh(ctx, 2, &mesh);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_mesh_group(mesh, 1, &g);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_current(cpu, &stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_all_reduce_async(g, &x, 1, FSDP2_F32, NULL, stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(stream);
    if (s != FSDP2_SUCCESS || x != 3.0f) {
        fprintf(stderr, "rank %d: the retry gave %s, sum %g: %s\n", rank, fsdp2_status_name(s),
                x, fsdp2_last_error());
        bad = 1;
    }
    return fsdp2_finalize(ctx) != FSDP2_SUCCESS || bad;
}

START_TEST(a_failed_hsdp_mesh_can_be_asked_for_again)
{
    run_pair(hsdp_retry_body, NULL);
}
END_TEST

START_TEST(a_failed_init_of_two_ranks_keeps_its_cause_as_the_message)
{
    run_pair(bad_trace_body, NULL);
}
END_TEST

START_TEST(every_rank_refuses_an_hsdp_layout_that_breaks_the_node_rules)
{
    /* One node of 2 whose local ranks are swapped (a cyclic mapping): not consecutive. */
    const int swapped[2] = {1, 0}, two[2] = {2, 2};
    run_hsdp_pair(swapped, two, FSDP2_ERR_INVALID_CONFIG, "node ranks are not consecutive");
    /* Nodes of 1 and 2 ranks: the ranks ask for different shard sizes. */
    const int locals[2] = {0, 1}, worlds[2] = {1, 2};
    run_hsdp_pair(locals, worlds, FSDP2_ERR_INVALID_CONFIG, "asks for shard size");
    /* A node of 2 mapped by node: the natural mesh is [1, 2]. */
    const int by_node[2] = {0, 1};
    run_hsdp_pair(by_node, two, FSDP2_SUCCESS, NULL);
}
END_TEST

/* A world of 4 of which only ranks 0 and 1 ever start: both fail fsdp2_init with a
 * timeout naming ranks 2 and 3, within about one FSDP2_TIMEOUT (rank 0's store server
 * used to wait a second timeout for the ranks that never connected). FSDP2_TIMEOUT is
 * set in the environment, which is where fsdp2_init takes it from. */
static int lonely_rank(int rank, int port)
{
    clear_launcher_env();
    char v[32];
    setenv("WORLD_SIZE", "4", 1);
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof(v), "%d", port);
    setenv("MASTER_PORT", v, 1);
    setenv("FSDP2_TIMEOUT", "2", 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fsdp2_context_t *ctx = NULL;
    fsdp2_status_t s = fsdp2_init(NULL, &ctx);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    const char *msg = fsdp2_last_error();
    int names_both = (strstr(msg, "2, 3") || strstr(msg, "2,3")) != 0;
    /* the timeout, rank 0's 1 s grace for the ranks that never connected, and room for a
     * loaded machine; a second timeout would make it 5 s or more */
    if (s != FSDP2_ERR_TIMEOUT || !names_both || took > 4.5 || ctx) {
        fprintf(stderr, "rank %d: fsdp2_init gave %s after %.2f s (FSDP2_TIMEOUT=2): %s\n", rank,
                fsdp2_status_name(s), took, msg);
        return 1;
    }
    return 0;
}

static int lonely_body(int rank, int port, const void *arg)
{
    (void)arg;
    return lonely_rank(rank, port);
}

START_TEST(ranks_that_never_start_are_named_by_every_rank_within_the_timeout)
{
    int port = run_pair(lonely_body, NULL);
    /* and rank 0's port is free again */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)port)};
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ck_assert_msg(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "port %d still bound", port);
    close(fd);
}
END_TEST

static Suite *init_suite(void)
{
    Suite *s = suite_create("init");
    TCase *tc = tcase_create("init");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_bare_process_is_a_world_of_one_with_a_working_group);
    tcase_add_test(tc, bad_launcher_variables_are_errors_naming_them);
    tcase_add_test(tc, the_hsdp_mesh_of_one_process_and_bad_shard_sizes);
    tcase_add_test(tc, every_rank_refuses_an_hsdp_layout_that_breaks_the_node_rules);
    tcase_add_test(tc, a_failed_init_of_two_ranks_keeps_its_cause_as_the_message);
    tcase_add_test(tc, a_failed_hsdp_mesh_can_be_asked_for_again);
    tcase_add_test(tc, an_init_that_fails_on_one_rank_fails_the_others_first_collective_at_once);
    tcase_add_test(tc, ranks_that_never_start_are_named_by_every_rank_within_the_timeout);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(init_suite)
