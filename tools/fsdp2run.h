/* fsdp2run internals shared by fsdp2run.c (options, spawning) and fsdp2run_supervisor.c
 * (the event loop: output lines, signals, exits). */
#ifndef FSDP2RUN_H
#define FSDP2RUN_H

#include <stddef.h>
#include <sys/types.h>

/* Exit statuses of the launcher itself (a rank's own status passes through). */
#define FSDP2RUN_EXIT_ERROR 1 /* could not start: pipe, fork, topology */
#define FSDP2RUN_EXIT_USAGE 2

/* A line longer than this is cut into pieces of this size, each prefixed. */
#define FSDP2RUN_LINE_MAX (64 * 1024)

/* One of a rank's output pipes, and the partial line read from it so far. */
typedef struct rank_stream {
    int fd;      /* read end, -1 at EOF */
    int out_fd;  /* STDOUT_FILENO or STDERR_FILENO */
    size_t used; /* bytes in buf not yet printed */
    char *buf;   /* FSDP2RUN_LINE_MAX bytes */
} rank_stream_t;

/* A rank's report of its first group failure (lib/collectives/group.c): its own, or an
 * echo of a peer's. */
enum { SAYS_ORIGIN = 1, SAYS_ECHO = 2 };

typedef struct rank_proc {
    int rank, local_rank;
    pid_t pid;   /* also its process group id: each rank leads its own session */
    int running; /* started and not yet reaped */
    int status;  /* waitpid status once reaped */
    int failed_at; /* 1 + its place among the ranks that exited failing (0: did not) */
    int says;      /* what it told FSDP2_RUN_REPORT_FD: 0 nothing, SAYS_ORIGIN, SAYS_ECHO */
    int stopped;   /* it exited by the SIGTERM or SIGKILL fsdp2run sent when stopping */
    rank_stream_t streams[2]; /* stdout, stderr */
} rank_proc_t;

typedef struct supervisor {
    rank_proc_t *ranks;
    int nranks;
    int running;          /* ranks not yet reaped */
    int signal_fd;        /* signalfd for SIGCHLD, SIGINT, SIGTERM, SIGHUP */
    long grace_ms;        /* SIGTERM -> SIGKILL */
    long long kill_at_ms; /* monotonic deadline for SIGKILL; -1 when not stopping */
    int killed;           /* SIGKILL has been sent */
    int interrupted_by;   /* first signal the launcher got, 0 if none */
    rank_proc_t *first_failure;
    int failures;         /* ranks that exited failing so far */
    int report_fd;        /* read end of FSDP2_RUN_REPORT_FD's pipe, -1 if none */
    int dead_out[3];      /* writes to fd 1 / 2 failed (closed pipe): discard */
    char *line;           /* the prefixed line being printed */
    size_t line_cap;
} supervisor_t;

/* Runs until every rank has exited and its output is printed; returns the launcher's
 * exit status (0, the first failing rank's, or 128+signal) and sets *reraise to the
 * signal the launcher should die of (the one it was stopped with), or 0. */
int fsdp2run_supervise(supervisor_t *sv, int *reraise);

/* Sends sig to the process group of every rank still running. */
void fsdp2run_signal_ranks(supervisor_t *sv, int sig);

/* The status a shell would show for a waitpid status: the exit code, or 128+signal. */
int fsdp2run_shell_status(int wait_status);

#endif
