/* The fsdp2run tests' harness: a temporary directory per test, fsdp2run started in its
 * own process group with its output in files, waits with deadlines (SIGCHLD stays blocked
 * and sigtimedwait sleeps; nothing polls in a loop), free ports. */
#ifndef FSDP2_TESTS_TOOLS_HARNESS_H
#define FSDP2_TESTS_TOOLS_HARNESS_H

#include <sys/types.h>

#define WAIT_MS 20000
#define MAX_RANKS 8

/* This test's directory and the files in it (set by harness_setup). */
extern char dir[256];
extern char out_path[300], err_path[300], fifo_path[300];

long long now_ms(void);

/* The value of a variable meson sets (FSDP2RUN, PRINT_ENV); fails the test without it. */
const char *path_of(const char *var);

/* Checked fixture: blocks SIGCHLD, removes launcher variables of the outer environment,
 * makes the directory. Teardown removes it. */
void harness_setup(void);
void harness_teardown(void);

/* Starts fsdp2run ARGS... (NULL-terminated) in its own process group (like a shell's
 * foreground job), its stdout and stderr into files (the same file when out == err), or
 * stdout into out_fd when that is not -1. */
pid_t start_with(const char *const *args, const char *out, const char *err, int out_fd);
pid_t start_at(const char *const *args, const char *out, const char *err);
pid_t start(const char *const *args); /* into out_path and err_path */

/* The whole file, NUL-terminated; the caller frees it. */
char *slurp(const char *path);

/* Waits up to timeout_ms for pid and returns its wait status; on a timeout kills its
 * group and fails the test, showing the stderr file err. */
int wait_exit(pid_t pid, long timeout_ms, const char *err);

/* The exit code; fails the test when pid died of a signal. */
int exit_code(int status);

/* start + wait_exit + exit_code. */
int run(const char *const *args);

/* A port nobody listens on now. */
int free_port(void);

#endif
