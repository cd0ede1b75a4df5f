/* Runs a function as N real processes ("ranks") that share a rendezvous store and (unless
 * run_ranks_store_only) a world group, for multi-process tests. Rank 0 serves the store on a free port and
 * hands the port to the others through a pipe. Each rank's function returns its number
 * of failures (0 = pass); the rank prints what failed to stderr. The parent waits with a
 * deadline and kills every rank when it passes, so a hung collective fails the test
 * instead of hanging it. */
#ifndef FSDP2_TESTS_RANKS_H
#define FSDP2_TESTS_RANKS_H

#include <time.h>

#include <fsdp2/fsdp2.h>

typedef struct rank_ctx {
    int rank, size;
    fsdp2_store_t *store;
    fsdp2_group_t *world; /* NULL under run_ranks_store_only */
    fsdp2_stream_t *stream; /* a cpu side stream for collectives; NULL likewise */
    void *arg;
} rank_ctx_t;

typedef int (*rank_fn)(rank_ctx_t *ctx);

typedef struct ranks_result {
    int status[16];  /* each rank's exit code, or 128 + signal */
    int pid[16];     /* each rank's process id (reaped when run_ranks returns) */
    int timed_out;   /* the deadline passed and the ranks were killed */
} ranks_result_t;

/* Runs fn on `size` ranks; group_timeout_ms bounds every collective (0: default).
 * Returns 0 when every rank exited 0. */
int run_ranks(int size, rank_fn fn, void *arg, long group_timeout_ms, int deadline_s,
              ranks_result_t *result);

/* As run_ranks, without the world group and its stream (ctx->world and ctx->stream are
 * NULL): for a short job whose body makes its own groups from ctx->store, where creating
 * the world as well would be a third of its cost. */
int run_ranks_store_only(int size, rank_fn fn, void *arg, int deadline_s, ranks_result_t *result);

/* Rank `from` publishes value under key (unset until then); every rank reads it into
 * *out. */
fsdp2_status_t ranks_value_from(rank_ctx_t *c, int from, const char *key, int64_t value,
                                int64_t *out);

/* Seconds on CLOCK_MONOTONIC since *t0 (taken with clock_gettime). */
double ranks_seconds_since(const struct timespec *t0);

/* Prints a failure of this rank to stderr and counts it: `fails += RANK_CHECK(cond, ...)`.
 * The message's arguments are evaluated only when cond fails: checks run per element of
 * buffers of millions, where a call per element dominates (ten-fold under the
 * sanitizers). */
#define RANK_CHECK(ctx, cond, ...)                                                          \
    ((cond) ? 0 : rank_check((ctx), 0, #cond, __FILE__, __LINE__, __VA_ARGS__))
int rank_check(const rank_ctx_t *ctx, int ok, const char *expr, const char *file, int line,
               const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#endif
