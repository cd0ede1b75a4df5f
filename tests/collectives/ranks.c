/* See ranks.h. */
#include "ranks.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int rank_check(const rank_ctx_t *ctx, int ok, const char *expr, const char *file, int line,
               const char *fmt, ...)
{
    if (ok)
        return 0;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d/%d: %s:%d: check failed: %s: %s (last error: %s)\n", ctx->rank,
            ctx->size, file, line, expr, msg, fsdp2_last_error());
    return 1;
}

double ranks_seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

fsdp2_status_t ranks_value_from(rank_ctx_t *c, int from, const char *key, int64_t value,
                                int64_t *out)
{
    *out = 0;
    if (c->rank == from) {
        fsdp2_status_t s = fsdp2_store_add(c->store, key, value, out);
        if (s != FSDP2_SUCCESS)
            return s;
    }
    fsdp2_status_t s = fsdp2_store_wait(c->store, &key, 1);
    return s == FSDP2_SUCCESS ? fsdp2_store_add(c->store, key, 0, out) : s;
}

/* group_timeout_ms < 0: no world group or stream (run_ranks_store_only). */
static int rank_main(int rank, int size, int port_in, int *port_out, int nout, rank_fn fn,
                     void *arg, long group_timeout_ms)
{
    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.world_size = size;
    so.rank = rank;
    so.timeout_ms = 30000;
    fsdp2_store_t *store = NULL;
    if (rank == 0) {
        so.is_server = 1;
        so.port = 0;
    } else {
        int port = 0;
        if (read(port_in, &port, sizeof(port)) != (ssize_t)sizeof(port)) {
            fprintf(stderr, "rank %d: no port from rank 0\n", rank);
            return 90;
        }
        so.port = port;
    }
    if (fsdp2_store_create(&so, &store) != FSDP2_SUCCESS) {
        fprintf(stderr, "rank %d: store: %s\n", rank, fsdp2_last_error());
        return 91;
    }
    if (rank == 0) {
        int port = 0;
        fsdp2_store_port(store, &port);
        for (int i = 0; i < nout; i++)
            if (write(port_out[i], &port, sizeof(port)) != (ssize_t)sizeof(port))
                return 92;
    }
    rank_ctx_t ctx = {rank, size, store, NULL, NULL, arg};
    if (group_timeout_ms >= 0) {
        fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
        go.timeout_ms = group_timeout_ms;
        fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
        if (fsdp2_group_create(store, "world", rank, size, &go, &ctx.world) != FSDP2_SUCCESS) {
            fprintf(stderr, "rank %d: group: %s\n", rank, fsdp2_last_error());
            return 93;
        }
        if (fsdp2_stream_create(cpu, "coll", &ctx.stream) != FSDP2_SUCCESS)
            return 94;
    }
    int fails = fn(&ctx);
    fsdp2_stream_destroy(ctx.stream);
    fsdp2_group_destroy(ctx.world);
    fsdp2_store_destroy(store);
    return fails ? (fails > 80 ? 80 : fails) : 0;
}

static int spawn_ranks(int size, rank_fn fn, void *arg, long group_timeout_ms, int deadline_s,
                       ranks_result_t *result)
{
    ranks_result_t local;
    if (!result)
        result = &local;
    memset(result, 0, sizeof(*result));
    int pipes[16][2];
    pid_t pids[16];
    int outs[16];
    for (int r = 1; r < size; r++) {
        if (pipe(pipes[r]) != 0)
            return -1;
        outs[r - 1] = pipes[r][1];
    }
    fflush(NULL);
    for (int r = 0; r < size; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            int code = rank_main(r, size, r ? pipes[r][0] : -1, outs, r ? 0 : size - 1, fn, arg,
                                 group_timeout_ms);
            fflush(NULL);
            _exit(code);
        }
        result->pid[r] = (int)pids[r];
    }
    for (int r = 1; r < size; r++) {
        close(pipes[r][0]);
        close(pipes[r][1]);
    }
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int left = size, failed = 0;
    while (left > 0) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            for (int r = 0; r < size; r++) {
                if (pids[r] != pid)
                    continue;
                result->status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                failed += result->status[r] != 0;
                pids[r] = 0;
                left--;
            }
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec >= deadline_s) {
            result->timed_out = 1;
            for (int r = 0; r < size; r++)
                if (pids[r] > 0)
                    kill(pids[r], SIGKILL);
            while (waitpid(-1, NULL, 0) > 0)
                ;
            return -1;
        }
        struct timespec nap = {0, 2 * 1000 * 1000}; /* reaping, not synchronising */
        nanosleep(&nap, NULL);
    }
    return failed;
}

int run_ranks(int size, rank_fn fn, void *arg, long group_timeout_ms, int deadline_s,
              ranks_result_t *result)
{
    return spawn_ranks(size, fn, arg, group_timeout_ms < 0 ? 0 : group_timeout_ms, deadline_s,
                       result);
}

int run_ranks_store_only(int size, rank_fn fn, void *arg, int deadline_s, ranks_result_t *result)
{
    return spawn_ranks(size, fn, arg, -1, deadline_s, result);
}
