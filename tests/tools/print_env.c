/* The rank program of the fsdp2run tests. By default it prints one line:
 *   env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=...
 *       MASTER_PORT=...
 * Options (any order):
 *   --affinity          also print "affinity RANK=r cpus=0,1" (sched_getaffinity)
 *   --pid               also print "pid RANK=r PID=p"
 *   --lines N W         print N numbered lines of W payload bytes to stdout and to stderr,
 *                       through stdio's full buffering, so the pipe sees lines cut anywhere
 *   --tail              finally write "tail-RANK" to stdout without a newline
 *   --secret            also print "secret RANK=r VALUE=v" (FSDP2_STORE_SECRET)
 *   --omp               also print "omp RANK=r THREADS=t WAIT=w" (OMP_NUM_THREADS,
 *                       OMP_WAIT_POLICY)
 *   --report FIFO DIR   write "RANK PID PGID SID" to FIFO in one write, then wait for
 *                       signals: SIGUSR1 exits with the --usr1-exit code (default 3);
 *                       SIGTERM, SIGINT, SIGHUP create DIR/<term|int|hup>.RANK and then
 *                       die of that signal
 *   --usr1-exit CODE
 *   --ignore-term       on SIGTERM create the marker but keep waiting (for SIGKILL) */
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v ? v : "(unset)";
}

static void print_affinity(int rank)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        perror("sched_getaffinity");
        exit(1);
    }
    printf("affinity RANK=%d cpus=", rank);
    const char *sep = "";
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &set)) {
            printf("%s%d", sep, cpu);
            sep = ",";
        }
    printf("\n");
}

/* Line i of rank r on stream s ('o' or 'e'): "<s> <r> <i> " then w bytes from a pattern
 * the test recomputes. */
static void print_lines(int rank, int n, int w)
{
    char *payload = malloc((size_t)w + 1);
    if (!payload)
        exit(1);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            FILE *f = k == 0 ? stdout : stderr;
            for (int j = 0; j < w; j++)
                payload[j] = (char)('a' + (rank * 7 + i * 3 + j + k) % 26);
            payload[w] = '\n';
            fprintf(f, "%c %d %d ", k == 0 ? 'o' : 'e', rank, i);
            fwrite(payload, 1, (size_t)w + 1, f);
        }
    }
    free(payload);
}

static void touch(const char *dir, const char *what, int rank)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.%d", dir, what, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        if (write(fd, "1\n", 2) != 2)
            perror("marker");
        close(fd);
    }
}

static void report_and_wait(int rank, const char *fifo, const char *dir, int usr1_exit,
                            int ignore_term)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);

    char line[128];
    int len = snprintf(line, sizeof(line), "%d %d %d %d\n", rank, (int)getpid(), (int)getpgrp(),
                       (int)getsid(0));
    int fd = open(fifo, O_WRONLY);
    if (fd < 0 || write(fd, line, (size_t)len) != len) {
        perror("report fifo");
        exit(1);
    }
    close(fd);
    for (;;) {
        int sig = sigwaitinfo(&set, NULL);
        if (sig == SIGUSR1)
            exit(usr1_exit);
        const char *what = sig == SIGTERM ? "term" : sig == SIGINT ? "int" : sig == SIGHUP ? "hup"
                                                                                           : NULL;
        if (!what)
            continue;
        touch(dir, what, rank);
        if (sig == SIGTERM && ignore_term)
            continue;
        signal(sig, SIG_DFL);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(sig);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int rank = atoi(env("RANK"));
    int affinity = 0, pid = 0, lines = 0, width = 0, usr1_exit = 3, ignore_term = 0;
    int tail = 0, secret = 0, omp = 0;
    const char *fifo = NULL, *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--affinity") == 0) {
            affinity = 1;
        } else if (strcmp(argv[i], "--pid") == 0) {
            pid = 1;
        } else if (strcmp(argv[i], "--lines") == 0 && i + 2 < argc) {
            lines = atoi(argv[++i]);
            width = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--tail") == 0) {
            tail = 1;
        } else if (strcmp(argv[i], "--secret") == 0) {
            secret = 1;
        } else if (strcmp(argv[i], "--omp") == 0) {
            omp = 1;
        } else if (strcmp(argv[i], "--report") == 0 && i + 2 < argc) {
            fifo = argv[++i];
            dir = argv[++i];
        } else if (strcmp(argv[i], "--usr1-exit") == 0 && i + 1 < argc) {
            usr1_exit = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--ignore-term") == 0) {
            ignore_term = 1;
        } else {
            fprintf(stderr, "print_env: bad argument '%s'\n", argv[i]);
            return 2;
        }
    }
    printf("env RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s GROUP_RANK=%s "
           "MASTER_ADDR=%s MASTER_PORT=%s\n",
           env("RANK"), env("WORLD_SIZE"), env("LOCAL_RANK"), env("LOCAL_WORLD_SIZE"),
           env("GROUP_RANK"), env("MASTER_ADDR"), env("MASTER_PORT"));
    if (affinity)
        print_affinity(rank);
    if (pid)
        printf("pid RANK=%d PID=%d\n", rank, (int)getpid());
    if (secret)
        printf("secret RANK=%d VALUE=%s\n", rank, env("FSDP2_STORE_SECRET"));
    if (omp)
        printf("omp RANK=%d THREADS=%s WAIT=%s\n", rank, env("OMP_NUM_THREADS"),
               env("OMP_WAIT_POLICY"));
    if (lines > 0) {
        /* stderr is unbuffered by default: one write per byte would be slow. */
        static char buf[4096];
        setvbuf(stderr, buf, _IOFBF, sizeof(buf));
    }
    print_lines(rank, lines, width);
    if (tail)
        printf("tail-%d", rank);
    fflush(stdout);
    fflush(stderr);
    if (fifo)
        report_and_wait(rank, fifo, dir, usr1_exit, ignore_term);
    return 0;
}
