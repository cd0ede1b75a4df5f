/* The fsdp2run tests' harness (see harness.h). */
#include <check.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

char dir[256];
char out_path[300], err_path[300], fifo_path[300];

long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *path_of(const char *var)
{
    const char *p = getenv(var);
    ck_assert_msg(p && *p, "%s is not set (meson passes it)", var);
    return p;
}

/* Each test runs in its own process (Check forks): SIGCHLD stays blocked so that
 * sigtimedwait can wait for the launcher; launcher variables of the outer environment
 * are removed so they cannot change what is tested. */
void harness_setup(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    static const char *const unset[] = {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK",
                                        "FSDP2RUN_GRACE_SECONDS", "RANK", "WORLD_SIZE",
                                        "MASTER_ADDR", "MASTER_PORT"};
    for (size_t i = 0; i < sizeof(unset) / sizeof(unset[0]); i++)
        unsetenv(unset[i]);
    snprintf(dir, sizeof(dir), "/tmp/fsdp2run-test-XXXXXX");
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    snprintf(out_path, sizeof(out_path), "%s/out", dir);
    snprintf(err_path, sizeof(err_path), "%s/err", dir);
    snprintf(fifo_path, sizeof(fifo_path), "%s/reports", dir);
}

void harness_teardown(void)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[600];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
                unlink(path);
            }
        }
        closedir(d);
    }
    rmdir(dir);
}

pid_t start_with(const char *const *args, const char *out, const char *err, int out_fd)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = path_of("FSDP2RUN");
    for (; args[n - 1] && n < 63; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0);
        int o = out_fd >= 0 ? out_fd : open(out, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
        int e = strcmp(out, err) == 0 ? dup(o) : open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

pid_t start_at(const char *const *args, const char *out, const char *err)
{
    return start_with(args, out, err, -1);
}

pid_t start(const char *const *args)
{
    return start_at(args, out_path, err_path);
}

char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    size_t n;
    while ((n = fread(text + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2)
            text = realloc(text, cap *= 2);
    }
    fclose(f);
    text[len] = '\0';
    return text;
}

int wait_exit(pid_t pid, long timeout_ms, const char *err)
{
    long long deadline = now_ms() + timeout_ms;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    for (;;) {
        int status;
        pid_t got = waitpid(pid, &status, WNOHANG);
        ck_assert_msg(got >= 0, "waitpid: %s", strerror(errno));
        if (got == pid)
            return status;
        long long left = deadline - now_ms();
        if (left <= 0) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            char *text = slurp(err);
            ck_abort_msg("fsdp2run (pid %d) still running after %ld ms; stderr:\n%s", (int)pid,
                         timeout_ms, text);
        }
        struct timespec ts = {left / 1000, (left % 1000) * 1000000};
        sigtimedwait(&set, NULL, &ts);
    }
}

int exit_code(int status)
{
    ck_assert_msg(WIFEXITED(status), "fsdp2run did not exit normally (status 0x%x, signal %d)",
                  status, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return WEXITSTATUS(status);
}

int run(const char *const *args)
{
    return exit_code(wait_exit(start(args), WAIT_MS, err_path));
}

int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    ck_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    ck_assert(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}
