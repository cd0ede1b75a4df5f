/* fsdp2run with real processes: the environment each rank sees (1 to 4 ranks, one node
 * and two "nodes" on loopback), whole prefixed output lines, exit statuses of failing and
 * killed ranks with no rank left behind, signal forwarding, and usage errors. Binding,
 * --topology and the mpirun path are in test_fsdp2run_bind.c.
 *
 * Ranks are tests/tools/print_env. Tests never sleep to "wait long enough": ranks report
 * their pids through a FIFO once they are up (the test holds it open for reading with
 * O_RDWR, so it never sees a hang-up between writers), and every wait is a poll or
 * sigtimedwait with a deadline that fails the test instead of hanging it. */
#include <check.h>

#include "../core/check_main.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* ---- environment ---------------------------------------------------------------- */

typedef struct env_line {
    int rank, world, local_rank, local_world, group_rank, port;
    char addr[64];
} env_line_t;

/* Parses every "[rank R] env ..." line of text into lines[R - base]; returns how many. */
static int parse_env(const char *text, int base, env_line_t *lines, int max)
{
    int found = 0;
    for (const char *p = text; (p = strstr(p, "] env ")) != NULL; p++) {
        const char *line = p;
        while (line > text && line[-1] != '\n')
            line--;
        int prefix_rank;
        env_line_t e;
        int got = sscanf(line,
                         "[rank %d] env RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d "
                         "GROUP_RANK=%d MASTER_ADDR=%63s MASTER_PORT=%d",
                         &prefix_rank, &e.rank, &e.world, &e.local_rank, &e.local_world,
                         &e.group_rank, e.addr, &e.port);
        ck_assert_msg(got == 8, "cannot parse line: %.200s", line);
        ck_assert_int_eq(prefix_rank, e.rank);
        ck_assert_msg(e.rank - base >= 0 && e.rank - base < max, "rank %d out of range", e.rank);
        lines[e.rank - base] = e;
        found++;
    }
    return found;
}

START_TEST(each_rank_sees_its_rank_world_and_master)
{
    int n = _i; /* 1..4 ranks */
    char nproc[16];
    snprintf(nproc, sizeof(nproc), "%d", n);
    const char *args[] = {"--nproc-per-node", nproc, path_of("PRINT_ENV"), NULL};
    ck_assert_int_eq(run(args), 0);
    char *text = slurp(out_path);
    env_line_t lines[MAX_RANKS];
    ck_assert_int_eq(parse_env(text, 0, lines, MAX_RANKS), n);
    for (int r = 0; r < n; r++) {
        ck_assert_int_eq(lines[r].rank, r);
        ck_assert_int_eq(lines[r].world, n);
        ck_assert_int_eq(lines[r].local_rank, r);
        ck_assert_int_eq(lines[r].local_world, n);
        ck_assert_int_eq(lines[r].group_rank, 0);
        ck_assert_str_eq(lines[r].addr, "127.0.0.1");
        ck_assert_int_eq(lines[r].port, lines[0].port);
        ck_assert(lines[r].port > 0 && lines[r].port < 65536);
    }
    free(text);
}
END_TEST

/* OpenMP's threads sleep between regions (OMP_WAIT_POLICY=PASSIVE) where the ranks'
 * threads outnumber the usable CPUs, and keep libgomp's default elsewhere; a policy the
 * user gave is passed on, as OMP_NUM_THREADS. */
START_TEST(ranks_get_a_passive_openmp_wait_policy_where_their_threads_outnumber_the_cpus)
{
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    int cpus = CPU_COUNT(&set);
    char all[16];
    snprintf(all, sizeof(all), "%d", cpus);
    const char *args[] = {"--nproc-per-node", "2", path_of("PRINT_ENV"), "--omp", NULL};
    /* CPUs / 2 threads each: as many as the CPUs (on one CPU, 1 each: two) */
    ck_assert_int_eq(unsetenv("OMP_WAIT_POLICY"), 0);
    ck_assert_int_eq(unsetenv("OMP_NUM_THREADS"), 0);
    ck_assert_int_eq(run(args), 0);
    char *text = slurp(out_path);
    ck_assert_msg(strstr(text, "omp RANK=0 THREADS=") && strstr(text, "omp RANK=1 THREADS="),
                  "no omp lines in:\n%s", text);
    ck_assert_msg(cpus >= 2 ? strstr(text, "WAIT=(unset)") && !strstr(text, "WAIT=PASSIVE")
                            : strstr(text, "WAIT=PASSIVE") && !strstr(text, "WAIT=(unset)"),
                  "%d CPUs: %s", cpus, text);
    free(text);
    /* every CPU for each rank: twice as many threads as CPUs */
    ck_assert_int_eq(setenv("OMP_NUM_THREADS", all, 1), 0);
    ck_assert_int_eq(run(args), 0);
    text = slurp(out_path);
    ck_assert_msg(strstr(text, "omp RANK=1 THREADS=") && strstr(text, "WAIT=PASSIVE") &&
                      !strstr(text, "WAIT=(unset)"),
                  "OMP_NUM_THREADS=%s on %d CPUs: %s", all, cpus, text);
    free(text);
    ck_assert_int_eq(setenv("OMP_WAIT_POLICY", "ACTIVE", 1), 0);
    ck_assert_int_eq(run(args), 0);
    text = slurp(out_path);
    ck_assert_msg(strstr(text, "omp RANK=1 THREADS=") && strstr(text, "WAIT=ACTIVE") &&
                      !strstr(text, "WAIT=PASSIVE"),
                  "%s", text);
    free(text);
    ck_assert_int_eq(unsetenv("OMP_WAIT_POLICY"), 0);
    ck_assert_int_eq(unsetenv("OMP_NUM_THREADS"), 0);
}
END_TEST

/* Each rank gets the same fresh store secret (64 hex digits), different for each job;
 * a secret the user set is passed on as it is. */
START_TEST(ranks_share_a_fresh_store_secret_unless_one_is_given)
{
    char values[2][3][80];
    for (int job = 0; job < 2; job++) {
        const char *args[] = {"--nproc-per-node", "3", path_of("PRINT_ENV"), "--secret", NULL};
        ck_assert_int_eq(run(args), 0);
        char *text = slurp(out_path);
        for (int r = 0; r < 3; r++) {
            char needle[32];
            snprintf(needle, sizeof(needle), "secret RANK=%d VALUE=", r);
            const char *at = strstr(text, needle);
            ck_assert_msg(at, "no secret line for rank %d in:\n%s", r, text);
            ck_assert_int_eq(sscanf(at + strlen(needle), "%79s", values[job][r]), 1);
            ck_assert_uint_eq(strlen(values[job][r]), 64);
            ck_assert_uint_eq(strspn(values[job][r], "0123456789abcdef"), 64);
            ck_assert_str_eq(values[job][r], values[job][0]);
        }
        free(text);
    }
    ck_assert_str_ne(values[0][0], values[1][0]);
    ck_assert_int_eq(setenv("FSDP2_STORE_SECRET", "given-by-the-user", 1), 0);
    const char *args[] = {"--nproc-per-node", "2", path_of("PRINT_ENV"), "--secret", NULL};
    ck_assert_int_eq(run(args), 0);
    char *text = slurp(out_path);
    ck_assert_ptr_nonnull(strstr(text, "secret RANK=0 VALUE=given-by-the-user"));
    ck_assert_ptr_nonnull(strstr(text, "secret RANK=1 VALUE=given-by-the-user"));
    free(text);
    ck_assert_int_eq(unsetenv("FSDP2_STORE_SECRET"), 0);
}
END_TEST

START_TEST(given_master_addr_and_port_are_passed_on)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", free_port());
    const char *args[] = {"--nproc-per-node=2", "--master-addr", "localhost", "--master_port",
                          port, "--", path_of("PRINT_ENV"), NULL};
    ck_assert_int_eq(run(args), 0);
    char *text = slurp(out_path);
    env_line_t lines[MAX_RANKS];
    ck_assert_int_eq(parse_env(text, 0, lines, MAX_RANKS), 2);
    for (int r = 0; r < 2; r++) {
        ck_assert_str_eq(lines[r].addr, "localhost");
        ck_assert_int_eq(lines[r].port, atoi(port));
    }
    free(text);
}
END_TEST

/* Two launchers as nodes 0 and 1 of one job, on loopback. */
START_TEST(two_nodes_on_loopback_give_global_ranks_0_to_3)
{
    char port[16], out1[320], err1[320];
    snprintf(port, sizeof(port), "%d", free_port());
    snprintf(out1, sizeof(out1), "%s/out1", dir);
    snprintf(err1, sizeof(err1), "%s/err1", dir);
    const char *node0[] = {"--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", port,
                           path_of("PRINT_ENV"), NULL};
    const char *node1[] = {"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", port,
                           path_of("PRINT_ENV"), NULL};
    pid_t p0 = start(node0), p1 = start_at(node1, out1, err1);
    ck_assert_int_eq(exit_code(wait_exit(p0, WAIT_MS, err_path)), 0);
    ck_assert_int_eq(exit_code(wait_exit(p1, WAIT_MS, err1)), 0);
    env_line_t lines[4];
    for (int node = 0; node < 2; node++) {
        char *text = slurp(node == 0 ? out_path : out1);
        ck_assert_int_eq(parse_env(text, 2 * node, lines + 2 * node, 2), 2);
        free(text);
    }
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(lines[r].rank, r);
        ck_assert_int_eq(lines[r].world, 4);
        ck_assert_int_eq(lines[r].local_rank, r % 2);
        ck_assert_int_eq(lines[r].local_world, 2);
        ck_assert_int_eq(lines[r].group_rank, r / 2);
        ck_assert_str_eq(lines[r].addr, "127.0.0.1");
        ck_assert_int_eq(lines[r].port, atoi(port));
    }
}
END_TEST

/* ---- output ---------------------------------------------------------------------- */

#define OUT_RANKS 3
#define OUT_LINES 100
#define OUT_WIDTH 5000 /* longer than a pipe's atomic write and stdio's buffer */

/* Checks one whole output line against the pattern print_env writes; counts it. */
static void check_output_line(const char *line, size_t len, int next[OUT_RANKS][2],
                              int tails[OUT_RANKS])
{
    int prefix_rank, rank, index, head = 0;
    char stream;
    if (sscanf(line, "[rank %d] tail-%d%n", &prefix_rank, &rank, &head) == 2 &&
        (size_t)head == len) {
        ck_assert_int_eq(prefix_rank, rank);
        tails[rank]++;
        return;
    }
    int got = sscanf(line, "[rank %d] %c %d %d %n", &prefix_rank, &stream, &rank, &index, &head);
    ck_assert_msg(got == 4 && head > 0, "line is not whole or not prefixed: %.120s", line);
    ck_assert_int_eq(prefix_rank, rank);
    ck_assert_msg(rank >= 0 && rank < OUT_RANKS, "bad rank %d", rank);
    int k = stream == 'o' ? 0 : 1;
    ck_assert_msg(index == next[rank][k], "rank %d stream %c: line %d where %d was due", rank,
                  stream, index, next[rank][k]);
    next[rank][k]++;
    ck_assert_msg(len - (size_t)head == OUT_WIDTH, "rank %d line %d has %zu payload bytes", rank,
                  index, len - (size_t)head);
    char want[OUT_WIDTH];
    for (int j = 0; j < OUT_WIDTH; j++)
        want[j] = (char)('a' + (rank * 7 + index * 3 + j + k) % 26);
    ck_assert_msg(memcmp(line + head, want, OUT_WIDTH) == 0, "rank %d line %d: wrong payload",
                  rank, index);
}

/* stdout and stderr into one file: every line must still be one rank's whole line. */
START_TEST(output_lines_are_prefixed_whole_and_in_order)
{
    char lines[16], width[16];
    snprintf(lines, sizeof(lines), "%d", OUT_LINES);
    snprintf(width, sizeof(width), "%d", OUT_WIDTH);
    const char *args[] = {"--nproc-per-node", "3", path_of("PRINT_ENV"), "--lines", lines, width,
                          "--tail", NULL};
    int status = wait_exit(start_at(args, out_path, out_path), WAIT_MS, out_path);
    ck_assert_int_eq(exit_code(status), 0);
    char *text = slurp(out_path);
    int next[OUT_RANKS][2] = {{0}}, tails[OUT_RANKS] = {0}, envs = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        ck_assert_msg(nl != NULL, "output does not end with a newline: %.80s", line);
        *nl = '\0';
        if (strstr(line, "] env RANK="))
            envs++;
        else
            check_output_line(line, (size_t)(nl - line), next, tails);
        line = nl + 1;
    }
    ck_assert_int_eq(envs, OUT_RANKS);
    for (int r = 0; r < OUT_RANKS; r++) {
        ck_assert_int_eq(next[r][0], OUT_LINES);
        ck_assert_int_eq(next[r][1], OUT_LINES);
        ck_assert_msg(tails[r] == 1, "rank %d's partial last line printed %d times", r, tails[r]);
    }
    free(text);
}
END_TEST

/* `fsdp2run ... | head`: once the reader is gone, the ranks' own stdout is closed, they
 * die of SIGPIPE as a lone program would, and fsdp2run exits 141 instead of running on. */
START_TEST(closed_stdout_ends_the_ranks_with_sigpipe)
{
    int p[2];
    ck_assert(pipe2(p, O_CLOEXEC) == 0); /* fsdp2run must not hold the read end itself */
    const char *args[] = {"--nproc-per-node", "2", path_of("PRINT_ENV"), "--lines", "100000000",
                          "10", NULL};
    /* Its stderr (as much again) is not kept. */
    pid_t pid = start_with(args, out_path, "/dev/null", p[1]);
    close(p[1]);
    char first[64];
    ck_assert(read(p[0], first, sizeof(first)) > 0);
    close(p[0]);
    ck_assert_int_eq(exit_code(wait_exit(pid, WAIT_MS, "/dev/null")), 128 + SIGPIPE);
}
END_TEST

START_TEST(stdout_and_stderr_stay_apart)
{
    const char *args[] = {"--nproc-per-node", "2", path_of("PRINT_ENV"), "--lines", "3", "10",
                          NULL};
    ck_assert_int_eq(run(args), 0);
    char *out = slurp(out_path), *err = slurp(err_path);
    ck_assert_msg(strstr(out, "] o 1 2 ") && !strstr(out, "] e "), "stdout:\n%s", out);
    ck_assert_msg(strstr(err, "[rank 1] e 1 2 ") && !strstr(err, "] o "), "stderr:\n%s", err);
    free(out);
    free(err);
}
END_TEST

/* ---- failures and signals ------------------------------------------------------- */

typedef struct report {
    int pid, pgid, sid;
} report_t;

static int open_reports(void)
{
    ck_assert_msg(mkfifo(fifo_path, 0600) == 0, "mkfifo: %s", strerror(errno));
    int fd = open(fifo_path, O_RDWR | O_NONBLOCK);
    ck_assert_msg(fd >= 0, "open fifo: %s", strerror(errno));
    return fd;
}

/* Reads n "RANK PID PGID SID" reports (ranks 0..n-1) or fails after WAIT_MS. */
static void collect_reports(int fd, int n, report_t *reports)
{
    char text[4096];
    size_t len = 0;
    int got = 0;
    long long deadline = now_ms() + WAIT_MS;
    for (int r = 0; r < n; r++)
        reports[r].pid = 0;
    while (got < n) {
        long long left = deadline - now_ms();
        if (left <= 0) {
            char *err = slurp(err_path);
            ck_abort_msg("only %d of %d ranks reported; stderr:\n%s", got, n, err);
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        ssize_t k = read(fd, text + len, sizeof(text) - 1 - len);
        if (k <= 0)
            continue;
        len += (size_t)k;
        text[len] = '\0';
        char *nl;
        while ((nl = strchr(text, '\n')) != NULL) {
            int rank;
            report_t rep;
            ck_assert(sscanf(text, "%d %d %d %d", &rank, &rep.pid, &rep.pgid, &rep.sid) == 4);
            ck_assert_msg(rank >= 0 && rank < n && reports[rank].pid == 0, "bad report rank %d",
                          rank);
            reports[rank] = rep;
            got++;
            len -= (size_t)(nl + 1 - text);
            memmove(text, nl + 1, len + 1);
        }
    }
}

static int marker_exists(const char *what, int rank)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/%s.%d", dir, what, rank);
    return access(path, F_OK) == 0;
}

/* After fsdp2run returned, none of its ranks may be left (they were its children and
 * it reaped them, so their pids are free: kill(pid, 0) fails with ESRCH). */
static void assert_no_rank_left(const report_t *reports, int n)
{
    for (int r = 0; r < n; r++)
        ck_assert_msg(kill(reports[r].pid, 0) != 0 && errno == ESRCH,
                      "rank %d (pid %d) is still alive", r, reports[r].pid);
}

START_TEST(failing_rank_status_is_returned_and_the_others_are_stopped)
{
    /* A long grace period: the others must go on SIGTERM, well before any SIGKILL. */
    setenv("FSDP2RUN_GRACE_SECONDS", "60", 1);
    int fd = open_reports();
    const char *args[] = {"--nproc-per-node", "4", path_of("PRINT_ENV"), "--report", fifo_path,
                          dir, NULL};
    pid_t pid = start(args);
    report_t reports[4];
    collect_reports(fd, 4, reports);
    long long t0 = now_ms();
    ck_assert_int_eq(kill(reports[1].pid, SIGUSR1), 0); /* rank 1 exits 3 */
    ck_assert_int_eq(exit_code(wait_exit(pid, WAIT_MS, err_path)), 3);
    ck_assert_msg(now_ms() - t0 < 10000, "stopping took %lld ms", now_ms() - t0);
    assert_no_rank_left(reports, 4);
    for (int r = 0; r < 4; r++)
        ck_assert_msg(marker_exists("term", r) == (r != 1), "rank %d: SIGTERM marker %d", r,
                      marker_exists("term", r));
    char *err = slurp(err_path);
    ck_assert_msg(strstr(err, "rank 1 failed first") && strstr(err, "status 3"), "stderr:\n%s",
                  err);
    free(err);
    close(fd);
}
END_TEST

START_TEST(rank_killed_by_sigkill_gives_137)
{
    int fd = open_reports();
    const char *args[] = {"--nproc-per-node", "3", path_of("PRINT_ENV"), "--report", fifo_path,
                          dir, NULL};
    pid_t pid = start(args);
    report_t reports[3];
    collect_reports(fd, 3, reports);
    ck_assert_int_eq(kill(reports[2].pid, SIGKILL), 0);
    ck_assert_int_eq(exit_code(wait_exit(pid, WAIT_MS, err_path)), 137);
    assert_no_rank_left(reports, 3);
    char *err = slurp(err_path);
    ck_assert_msg(strstr(err, "rank 2 failed first") && strstr(err, "signal 9"), "stderr:\n%s",
                  err);
    free(err);
    close(fd);
}
END_TEST

/* Ranks that ignore SIGTERM get SIGKILL once the grace period is over. */
START_TEST(ranks_ignoring_sigterm_are_killed_after_the_grace_period)
{
    setenv("FSDP2RUN_GRACE_SECONDS", "0.2", 1);
    int fd = open_reports();
    const char *args[] = {"--nproc-per-node", "3", path_of("PRINT_ENV"), "--report", fifo_path,
                          dir, "--ignore-term", "--usr1-exit", "5", NULL};
    pid_t pid = start(args);
    report_t reports[3];
    collect_reports(fd, 3, reports);
    ck_assert_int_eq(kill(reports[0].pid, SIGUSR1), 0);
    ck_assert_int_eq(exit_code(wait_exit(pid, WAIT_MS, err_path)), 5);
    assert_no_rank_left(reports, 3);
    for (int r = 1; r < 3; r++)
        ck_assert_msg(marker_exists("term", r), "rank %d never saw SIGTERM", r);
    char *err = slurp(err_path);
    ck_assert_msg(strstr(err, "SIGKILL") && strstr(err, "rank 0 failed first"), "stderr:\n%s",
                  err);
    free(err);
    close(fd);
}
END_TEST

/* A signal sent to fsdp2run's process group, as a terminal sends Ctrl-C (SIGINT) or a
 * hang-up, or sent to fsdp2run alone (SIGTERM from kill): every rank gets it once, from
 * fsdp2run (they lead their own sessions, outside the terminal's group), and fsdp2run
 * dies of the same signal. */
START_TEST(signals_to_the_launcher_reach_every_rank)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    static const char *const names[] = {"int", "term", "hup"};
    int sig = sigs[_i];
    int fd = open_reports();
    const char *args[] = {"--nproc-per-node", "3", path_of("PRINT_ENV"), "--report", fifo_path,
                          dir, NULL};
    pid_t pid = start(args);
    report_t reports[3];
    collect_reports(fd, 3, reports);
    for (int r = 0; r < 3; r++) {
        ck_assert_msg(reports[r].pgid == reports[r].pid && reports[r].sid == reports[r].pid,
                      "rank %d: pid %d pgid %d sid %d: not its own session", r, reports[r].pid,
                      reports[r].pgid, reports[r].sid);
        ck_assert_int_ne(reports[r].pgid, pid);
    }
    ck_assert_int_eq(sig == SIGTERM ? kill(pid, sig) : kill(-pid, sig), 0);
    int status = wait_exit(pid, WAIT_MS, err_path);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == sig,
                  "fsdp2run status 0x%x, expected death by signal %d", status, sig);
    assert_no_rank_left(reports, 3);
    for (int r = 0; r < 3; r++)
        ck_assert_msg(marker_exists(names[_i], r), "rank %d never saw signal %d", r, sig);
    close(fd);
}
END_TEST

/* ---- usage ---------------------------------------------------------------------- */

START_TEST(bad_usage_exits_2_naming_the_problem)
{
    const char *prog = path_of("PRINT_ENV");
    struct {
        const char *args[12];
        const char *names;
    } cases[] = {
        {{"--nproc-per-node", "0", prog}, "--nproc-per-node '0'"},
        {{"--nproc-per-node", "two", prog}, "'two'"},
        {{"--nproc-per-node"}, "--nproc-per-node needs a value"},
        {{"--bind", "sideways", "--nproc-per-node", "1", prog}, "--bind 'sideways'"},
        {{"--frobnicate", prog}, "'--frobnicate'"},
        {{"-x", prog}, "'-x'"},
        {{"--nproc-per-node", "2"}, "no PROGRAM"},
        {{"--nnodes", "2", "--nproc-per-node", "1", prog}, "--nnodes 2 needs"},
        {{"--nnodes", "2", "--node-rank", "2", "--nproc-per-node", "1", "--master-addr", "h",
          "--master-port", "5", prog},
         "--node-rank 2"},
        {{"--master-port", "70000", "--nproc-per-node", "1", prog}, "--master-port '70000'"},
        {{prog}, "--nproc-per-node is required"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ck_assert_msg(run(cases[i].args) == 2, "case %zu did not exit 2", i);
        char *err = slurp(err_path);
        ck_assert_msg(strstr(err, cases[i].names) && strstr(err, "usage:"),
                      "case %zu: stderr lacks \"%s\":\n%s", i, cases[i].names, err);
        free(err);
    }
    setenv("FSDP2RUN_GRACE_SECONDS", "soon", 1);
    const char *grace[] = {"--nproc-per-node", "1", prog, NULL};
    ck_assert_int_eq(run(grace), 2);
    char *err = slurp(err_path);
    ck_assert_msg(strstr(err, "FSDP2RUN_GRACE_SECONDS='soon'"), "stderr:\n%s", err);
    free(err);
}
END_TEST

static TCase *tcase_with_harness(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
    tcase_set_timeout(tc, 60);
    return tc;
}

/* Rank 1's first collective cannot start (fault injection): it fails on its own and its
 * peers fail because it did, and exit first. fsdp2run names rank 1 (the ranks report
 * which failures were echoes) and returns its status. */
START_TEST(the_rank_named_as_failing_first_is_the_one_whose_failure_was_its_own)
{
    setenv("FSDP2_FAULT_KIND", "collective", 1);
    setenv("FSDP2_FAULT_AT", "1", 1);
    setenv("FSDP2_FAULT_RANK", "1", 1);
    setenv("FSDP2RUN_GRACE_SECONDS", "30", 1);
    const char *args[] = {"--nproc-per-node", "3", path_of("FAIL_RANK"), NULL};
    pid_t pid = start(args);
    int status = wait_exit(pid, WAIT_MS, err_path);
    unsetenv("FSDP2_FAULT_KIND");
    unsetenv("FSDP2_FAULT_AT");
    unsetenv("FSDP2_FAULT_RANK");
    char *err = slurp(err_path);
    ck_assert_msg(exit_code(status) == 2, "exit %d; stderr:\n%s", exit_code(status), err);
    ck_assert_msg(strstr(err, "rank 1 failed first: it exited with status 2") &&
                      strstr(err, "which exited first, failed because it did"),
                  "stderr:\n%s", err);
    free(err);
}
END_TEST

static Suite *fsdp2run_suite(void)
{
    Suite *s = suite_create("fsdp2run");
    TCase *env = tcase_with_harness("environment");
    tcase_add_loop_test(env, each_rank_sees_its_rank_world_and_master, 1, 5);
    tcase_add_test(env, given_master_addr_and_port_are_passed_on);
    tcase_add_test(env, ranks_share_a_fresh_store_secret_unless_one_is_given);
    tcase_add_test(env, ranks_get_a_passive_openmp_wait_policy_where_their_threads_outnumber_the_cpus);
    tcase_add_test(env, two_nodes_on_loopback_give_global_ranks_0_to_3);
    suite_add_tcase(s, env);

    TCase *out = tcase_with_harness("output");
    tcase_add_test(out, output_lines_are_prefixed_whole_and_in_order);
    tcase_add_test(out, stdout_and_stderr_stay_apart);
    tcase_add_test(out, closed_stdout_ends_the_ranks_with_sigpipe);
    suite_add_tcase(s, out);

    TCase *fail = tcase_with_harness("failures");
    tcase_add_test(fail, failing_rank_status_is_returned_and_the_others_are_stopped);
    tcase_add_test(fail, rank_killed_by_sigkill_gives_137);
    tcase_add_test(fail, the_rank_named_as_failing_first_is_the_one_whose_failure_was_its_own);
    tcase_add_test(fail, ranks_ignoring_sigterm_are_killed_after_the_grace_period);
    tcase_add_loop_test(fail, signals_to_the_launcher_reach_every_rank, 0, 3);
    suite_add_tcase(s, fail);

    TCase *usage = tcase_with_harness("usage");
    tcase_add_test(usage, bad_usage_exits_2_naming_the_problem);
    suite_add_tcase(s, usage);
    return s;
}

FSDP2_CHECK_MAIN(fsdp2run_suite)
