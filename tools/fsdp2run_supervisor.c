/* The launcher's event loop: one poll() over a signalfd and every rank's stdout and
 * stderr pipe. Output is cut into whole lines and each is printed with "[rank R] " in
 * front, by this one process, so lines from different ranks never mix. A rank that fails
 * (non-zero exit or a signal) stops the others: SIGTERM to each rank's process group,
 * SIGKILL after the grace period. Signals to the launcher are forwarded once; a second
 * one kills the ranks at once. Nothing here busy-waits: poll sleeps until a pipe has
 * data, a signal arrives, or the SIGKILL deadline. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fsdp2run.h"

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int fsdp2run_shell_status(int wait_status)
{
    if (WIFEXITED(wait_status))
        return WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status))
        return 128 + WTERMSIG(wait_status);
    return FSDP2RUN_EXIT_ERROR;
}

static void describe_status(int wait_status, char *buf, size_t len)
{
    if (WIFSIGNALED(wait_status))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(wait_status),
                 strsignal(WTERMSIG(wait_status)));
    else
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(wait_status));
}

void fsdp2run_signal_ranks(supervisor_t *sv, int sig)
{
    /* Only ranks not yet reaped: a reaped rank's pid (and so its group id) may already
     * belong to an unrelated process. A rank that has not reached its setsid() yet has no
     * group of its own: it gets the signal directly, held pending (its signals are
     * blocked until just before exec) rather than lost. */
    for (int i = 0; i < sv->nranks; i++) {
        pid_t pid = sv->ranks[i].pid;
        if (sv->ranks[i].running && kill(-pid, sig) != 0 && errno == ESRCH)
            kill(pid, sig);
    }
}

/* Once the reader of our stdout (or stderr) is gone, as in `fsdp2run ... | head`, the
 * ranks' pipes to that stream are closed too: their next write fails with SIGPIPE, as if
 * they had written to the closed pipe themselves. */
static void close_ranks_output(supervisor_t *sv, int out_fd)
{
    for (int i = 0; i < sv->nranks; i++)
        for (int k = 0; k < 2; k++) {
            rank_stream_t *s = &sv->ranks[i].streams[k];
            if (s->out_fd == out_fd && s->fd >= 0) {
                close(s->fd);
                s->fd = -1;
                s->used = 0;
            }
        }
}

/* Writes all of buf to fd. A destination that fails is dropped: a closed pipe as above,
 * anything else (a full disk) by discarding, so that the ranks never block on us. */
static void write_all(supervisor_t *sv, int fd, const char *buf, size_t len)
{
    while (len > 0 && !sv->dead_out[fd]) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            sv->dead_out[fd] = 1;
            if (n < 0 && errno == EPIPE)
                close_ranks_output(sv, fd);
            return;
        }
        buf += n;
        len -= (size_t)n;
    }
}

/* Prints line [p, p+len) (without its newline) of rank r as one write. */
static void print_line(supervisor_t *sv, const rank_proc_t *r, int fd, const char *p,
                       size_t len)
{
    char prefix[32];
    int plen = snprintf(prefix, sizeof(prefix), "[rank %d] ", r->rank);
    /* prefix + line + newline in one buffer: one write() per line keeps lines whole
     * even when stdout and stderr go to the same file. */
    size_t need = (size_t)plen + len + 1;
    if (need > sv->line_cap) {
        char *grown = realloc(sv->line, need);
        if (!grown) {
            write_all(sv, fd, prefix, (size_t)plen);
            write_all(sv, fd, p, len);
            write_all(sv, fd, "\n", 1);
            return;
        }
        sv->line = grown;
        sv->line_cap = need;
    }
    memcpy(sv->line, prefix, (size_t)plen);
    memcpy(sv->line + plen, p, len);
    sv->line[need - 1] = '\n';
    write_all(sv, fd, sv->line, need);
}

/* Prints the complete lines in s->buf and keeps the partial one; with flush, prints the
 * partial one too (at EOF, or when a line fills the whole buffer). */
static void emit_lines(supervisor_t *sv, const rank_proc_t *r, rank_stream_t *s, int flush)
{
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->used - start);
        if (!nl)
            break;
        size_t end = (size_t)(nl - s->buf);
        print_line(sv, r, s->out_fd, s->buf + start, end - start);
        if (s->fd < 0)
            return; /* closed by close_ranks_output */
        start = end + 1;
    }
    if ((flush || s->used - start == FSDP2RUN_LINE_MAX) && s->used > start) {
        print_line(sv, r, s->out_fd, s->buf + start, s->used - start);
        if (s->fd < 0)
            return;
        start = s->used;
    }
    memmove(s->buf, s->buf + start, s->used - start);
    s->used -= start;
}

static void close_stream(supervisor_t *sv, const rank_proc_t *r, rank_stream_t *s)
{
    emit_lines(sv, r, s, 1);
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    s->used = 0;
}

/* One read from a readable (or hung-up) pipe. Returns the bytes read (0 at EOF, when
 * empty, or on an error). */
static size_t read_stream(supervisor_t *sv, const rank_proc_t *r, rank_stream_t *s)
{
    ssize_t n = read(s->fd, s->buf + s->used, FSDP2RUN_LINE_MAX - s->used);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    if (n <= 0) {
        close_stream(sv, r, s);
        return 0;
    }
    s->used += (size_t)n;
    emit_lines(sv, r, s, 0);
    return (size_t)n;
}

static void start_stopping(supervisor_t *sv)
{
    if (sv->kill_at_ms < 0 && !sv->killed)
        sv->kill_at_ms = now_ms() + sv->grace_ms;
}

static void on_rank_exit(supervisor_t *sv, rank_proc_t *r)
{
    int failed = !(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0);
    if (failed)
        r->failed_at = ++sv->failures;
    r->stopped = sv->first_failure && WIFSIGNALED(r->status) &&
                 (WTERMSIG(r->status) == SIGTERM || WTERMSIG(r->status) == SIGKILL);
    /* Once stopping (a failure or a signal to the launcher), later exits are the
     * consequence, not the cause. */
    if (!failed || sv->first_failure || sv->interrupted_by)
        return;
    sv->first_failure = r;
    char what[96];
    describe_status(r->status, what, sizeof(what));
    fprintf(stderr, "fsdp2run: rank %d (local rank %d, pid %d) %s; stopping the other ranks\n",
            r->rank, r->local_rank, (int)r->pid, what);
    fsdp2run_signal_ranks(sv, SIGTERM);
    start_stopping(sv);
}

static void reap(supervisor_t *sv)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < sv->nranks; i++) {
            rank_proc_t *r = &sv->ranks[i];
            if (r->running && r->pid == pid) {
                r->running = 0;
                r->status = status;
                sv->running--;
                on_rank_exit(sv, r);
                break;
            }
        }
    }
}

static void on_signal(supervisor_t *sv, int sig)
{
    if (sig == SIGCHLD) {
        reap(sv);
        return;
    }
    if (sv->interrupted_by) {
        fprintf(stderr, "fsdp2run: got %s again; killing the ranks\n", strsignal(sig));
        fsdp2run_signal_ranks(sv, SIGKILL);
        sv->killed = 1;
        sv->kill_at_ms = -1;
        return;
    }
    sv->interrupted_by = sig;
    fprintf(stderr, "fsdp2run: got signal %d (%s); forwarding it to %d running rank%s\n", sig,
            strsignal(sig), sv->running, sv->running == 1 ? "" : "s");
    fsdp2run_signal_ranks(sv, sig);
    start_stopping(sv);
}

static void read_signals(supervisor_t *sv)
{
    struct signalfd_siginfo info[8];
    ssize_t n;
    while ((n = read(sv->signal_fd, info, sizeof(info))) > 0)
        for (size_t i = 0; i < (size_t)n / sizeof(info[0]); i++)
            on_signal(sv, (int)info[i].ssi_signo);
}

static void kill_stragglers(supervisor_t *sv)
{
    fprintf(stderr, "fsdp2run: %d rank%s still running %.1f s after being asked to stop; "
            "sending SIGKILL\n", sv->running, sv->running == 1 ? "" : "s",
            (double)sv->grace_ms / 1000.0);
    fsdp2run_signal_ranks(sv, SIGKILL);
    sv->killed = 1;
    sv->kill_at_ms = -1;
}

/* The ranks' reports ("RANK origin|echo" lines) into their `says`. */
static void read_reports(supervisor_t *sv)
{
    char buf[4096];
    size_t used = 0;
    ssize_t n;
    while (sv->report_fd >= 0 &&
           (n = read(sv->report_fd, buf + used, sizeof(buf) - 1 - used)) > 0) {
        used += (size_t)n;
        buf[used] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            int rank = -1;
            char kind[16] = "";
            if (sscanf(line, "%d %15s", &rank, kind) == 2)
                for (int i = 0; i < sv->nranks; i++)
                    if (sv->ranks[i].rank == rank)
                        sv->ranks[i].says = !strcmp(kind, "echo") ? SAYS_ECHO : SAYS_ORIGIN;
            line = nl + 1;
        }
        used = strlen(line);
        memmove(buf, line, used);
    }
}

/* The rank to name as having failed first: the earliest failing rank that reported a
 * failure of its own; else the first to exit failing, unless it reported only an echo
 * of a peer's and a failing rank that reported nothing exists (a crash), other than one
 * fsdp2run's own stopping ended. */
static rank_proc_t *origin_of_failure(supervisor_t *sv)
{
    rank_proc_t *best = NULL;
    for (int i = 0; i < sv->nranks; i++) {
        rank_proc_t *r = &sv->ranks[i];
        if (r->failed_at && r->says == SAYS_ORIGIN && (!best || r->failed_at < best->failed_at))
            best = r;
    }
    if (best || !sv->first_failure || sv->first_failure->says != SAYS_ECHO)
        return best ? best : sv->first_failure;
    for (int i = 0; i < sv->nranks; i++) {
        rank_proc_t *r = &sv->ranks[i];
        if (r->failed_at && !r->says && !r->stopped && (!best || r->failed_at < best->failed_at))
            best = r;
    }
    return best ? best : sv->first_failure;
}

/* After the last rank was reaped: what it wrote before exiting is already in the pipes,
 * so read until each is empty or at EOF, without waiting for processes the ranks may
 * have left behind holding the write ends. A pipe holds at most 1 MiB (Linux's default
 * pipe-max-size); reading no more than that from each keeps a leftover process that
 * writes without pause from holding us here. */
static void drain(supervisor_t *sv)
{
    size_t budget = (size_t)1 << 20;
    for (int i = 0; i < sv->nranks; i++)
        for (int k = 0; k < 2; k++) {
            rank_stream_t *s = &sv->ranks[i].streams[k];
            size_t taken = 0;
            size_t n = 1;
            while (s->fd >= 0 && taken < budget && n > 0) {
                n = read_stream(sv, &sv->ranks[i], s);
                taken += n;
            }
            if (s->fd >= 0)
                close_stream(sv, &sv->ranks[i], s);
        }
}

int fsdp2run_supervise(supervisor_t *sv, int *reraise)
{
    struct pollfd *fds = calloc((size_t)sv->nranks * 2 + 1, sizeof(*fds));
    rank_stream_t **owners = calloc((size_t)sv->nranks * 2 + 1, sizeof(*owners));
    rank_proc_t **procs = calloc((size_t)sv->nranks * 2 + 1, sizeof(*procs));
    if (!fds || !owners || !procs) {
        fprintf(stderr, "fsdp2run: out of memory; killing the ranks\n");
        fsdp2run_signal_ranks(sv, SIGKILL);
        while (sv->running > 0 && waitpid(-1, NULL, 0) > 0)
            sv->running--;
        free(fds), free(owners), free(procs);
        *reraise = 0;
        return FSDP2RUN_EXIT_ERROR;
    }
    while (sv->running > 0) {
        int n = 0;
        fds[n++] = (struct pollfd){.fd = sv->signal_fd, .events = POLLIN};
        for (int i = 0; i < sv->nranks; i++)
            for (int k = 0; k < 2; k++)
                if (sv->ranks[i].streams[k].fd >= 0) {
                    owners[n] = &sv->ranks[i].streams[k];
                    procs[n] = &sv->ranks[i];
                    fds[n] = (struct pollfd){.fd = owners[n]->fd, .events = POLLIN};
                    n++;
                }
        int timeout = -1;
        if (sv->kill_at_ms >= 0) {
            long long left = sv->kill_at_ms - now_ms();
            timeout = left > 0 ? (int)(left > 1000000 ? 1000000 : left) : 0;
        }
        int ready = poll(fds, (nfds_t)n, timeout);
        if (ready < 0 && errno != EINTR) {
            perror("fsdp2run: poll");
            kill_stragglers(sv);
        }
        if (ready > 0) {
            if (fds[0].revents)
                read_signals(sv);
            for (int j = 1; j < n; j++)
                if (fds[j].revents && owners[j]->fd >= 0)
                    read_stream(sv, procs[j], owners[j]);
        }
        if (sv->kill_at_ms >= 0 && now_ms() >= sv->kill_at_ms && sv->running > 0)
            kill_stragglers(sv);
    }
    drain(sv);
    free(fds), free(owners), free(procs);
    free(sv->line);
    sv->line = NULL;
    sv->line_cap = 0;

    *reraise = 0;
    if (sv->first_failure) {
        read_reports(sv);
        rank_proc_t *r = origin_of_failure(sv);
        char what[96];
        describe_status(r->status, what, sizeof(what));
        if (r == sv->first_failure)
            fprintf(stderr, "fsdp2run: rank %d failed first: it %s\n", r->rank, what);
        else
            fprintf(stderr, "fsdp2run: rank %d failed first: it %s (rank %d, which exited "
                    "first, failed because it did)\n", r->rank, what, sv->first_failure->rank);
        return fsdp2run_shell_status(r->status);
    }
    if (sv->interrupted_by) {
        *reraise = sv->interrupted_by;
        return 128 + sv->interrupted_by;
    }
    return 0;
}
