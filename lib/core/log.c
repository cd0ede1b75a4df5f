/* Logging to stderr with a host:pid:rank prefix, filtered by level and subsystem. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/env_internal.h"
#include "core/error.h"
#include "core/log_internal.h"

/* -1 until first use; then the level from FSDP2_LOG_LEVEL or fsdp2_log_set_level. */
static atomic_int log_level = -1;
static atomic_int log_rank = -1;

static const char *const subsys_names[FSDP2_SUBSYS_COUNT] = {
#define FSDP2_SUBSYS_NAME_(name, str) str,
    FSDP2_SUBSYS_MAP(FSDP2_SUBSYS_NAME_)
#undef FSDP2_SUBSYS_NAME_
};

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

int fsdp2_log_enabled(fsdp2_log_level_t level, fsdp2_subsys_t subsys)
{
    int current = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (current < 0) {
        current = (int)fsdp2_env_int(FSDP2_ENV_LOG_LEVEL);
        int expected = -1;
        atomic_compare_exchange_strong(&log_level, &expected, current);
        current = atomic_load(&log_level);
    }
    if ((int)level > current)
        return 0;
    return (fsdp2_env_int(FSDP2_ENV_LOG_SUBSYS) >> subsys) & 1;
}

void fsdp2_log_write(fsdp2_log_level_t level, fsdp2_subsys_t subsys, const char *fmt, ...)
{
    char host[64] = "?";
    gethostname(host, sizeof(host) - 1);
    char rank[16] = "-";
    int r = atomic_load(&log_rank);
    if (r >= 0)
        snprintf(rank, sizeof(rank), "%d", r);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* One fprintf per line so lines from threads and ranks do not interleave. */
    fprintf(stderr, "%s:%d:%s fsdp2 %s %s: %s\n", host, (int)getpid(), rank,
            level_names[level], subsys_names[subsys], msg);
}

fsdp2_status_t fsdp2_log_set_level(fsdp2_log_level_t level)
{
    if ((int)level < FSDP2_LOG_ERROR || level > FSDP2_LOG_TRACE)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "log level %d is not one of 0 (error) .. 4 (trace)", (int)level);
    atomic_store(&log_level, (int)level);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_log_set_rank(int rank)
{
    if (rank < -1)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "rank %d is below -1", rank);
    atomic_store(&log_rank, rank);
    return FSDP2_SUCCESS;
}
