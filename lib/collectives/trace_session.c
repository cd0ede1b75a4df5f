/* Tracing sessions: start and stop around chosen steps, and FSDP2_TRACE (see
 * fsdp2/trace.h). Here rather than in lib/core because the stop meets the other ranks
 * through the context's store; merging their files is trace_merge.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collectives/trace_session.h"
#include "core/env_internal.h"
#include "core/error.h"
#include "core/log_internal.h"
#include "core/trace_internal.h"

#define TRACE_PATH_MAX 4000

static struct {
    fsdp2_context_t *ctx;
    int rank, world_size;
    char path[TRACE_PATH_MAX];
    unsigned sessions; /* start calls with a context so far: names the stop's keys */
    /* A start on a context of several ranks that failed here: the next stop on that
     * context still tells rank 0, so it does not wait out the timeout. */
    fsdp2_context_t *failed_ctx;
    char failed[512];
} session;

static void part_path(char *buf, size_t cap, const char *path, int rank)
{
    snprintf(buf, cap, "%s.rank%d.json", path, rank);
}

/* The directory that will hold path must exist and be writable, and path must not be a
 * directory: checked at start so that a long run does not fail at its end. */
static fsdp2_status_t check_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return fsdp2_error(FSDP2_ERR_IO, "trace path '%s' is a directory", path);
    char dir[TRACE_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    if (access(dir, W_OK) != 0)
        return fsdp2_error(FSDP2_ERR_IO, "trace path '%s': directory '%s' is not writable: %s",
                           path, dir, strerror(errno));
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_trace_start(fsdp2_context_t *ctx, const char *path)
{
    FSDP2_ARG_CHECK(path && path[0], "trace path is NULL or empty");
    FSDP2_ARG_CHECK(strlen(path) < TRACE_PATH_MAX - 32, "trace path of %zu characters is too long",
                    strlen(path));
    if (fsdp2_tracing())
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "tracing is already on (writing '%s')",
                           session.path);
    FSDP2_CHECK(fsdp2_env_init());
    int rank = 0, world_size = 1;
    fsdp2_process_info_t info;
    if (ctx) {
        FSDP2_CHECK(fsdp2_context_info(ctx, &info));
        rank = info.rank;
        world_size = info.world_size;
        session.sessions++; /* every rank counts every start, failed or not */
        session.failed_ctx = NULL;
    } else if (fsdp2_process_info_from_env(&info) == FSDP2_SUCCESS) {
        rank = info.rank; /* launched as one of several ranks, without fsdp2_init */
        world_size = info.world_size;
    }
    fsdp2_status_t status = check_path(path);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_trace_recorder_start((size_t)fsdp2_env_int(FSDP2_ENV_TRACE_EVENTS));
    if (status != FSDP2_SUCCESS) {
        if (ctx && world_size > 1) {
            session.failed_ctx = ctx;
            snprintf(session.failed, sizeof(session.failed), "%s", fsdp2_last_error());
        }
        return status;
    }
    session.ctx = ctx;
    session.rank = rank;
    session.world_size = world_size;
    snprintf(session.path, sizeof(session.path), "%s", path);
    FSDP2_LOG(INFO, CORE, "tracing into '%s'", path);
    return FSDP2_SUCCESS;
}

/* Rank 0's end of the stop: waits for every rank's word, then merges the parts. */
static fsdp2_status_t gather_parts(fsdp2_store_t *store, const char *key_prefix)
{
    int n = session.world_size;
    char key[256], value[512];
    char(*parts)[TRACE_PATH_MAX + 32] = calloc((size_t)n, sizeof(*parts));
    const char **list = calloc((size_t)n, sizeof(*list));
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (!parts || !list) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "trace: %d part names", n);
        goto done;
    }
    int missing = 0;
    for (int r = 0; r < n && status == FSDP2_SUCCESS; r++) {
        snprintf(key, sizeof(key), "%s/%d", key_prefix, r);
        size_t len = 0;
        status = fsdp2_store_get(store, key, value, sizeof(value) - 1, &len);
        if (status != FSDP2_SUCCESS)
            break;
        value[len < sizeof(value) ? len : sizeof(value) - 1] = '\0';
        if (strcmp(value, "ok") != 0)
            status = fsdp2_error(FSDP2_ERR_IO, "trace: rank %d could not write its part: %s", r,
                                 value);
        part_path(parts[r], sizeof(parts[r]), session.path, r);
        list[r] = parts[r];
        if (access(parts[r], R_OK) != 0)
            missing++;
    }
    if (status != FSDP2_SUCCESS)
        goto done;
    if (missing) {
        FSDP2_LOG(WARN, CORE,
                  "trace: %d of %d rank files are not readable here (other hosts?): they stay "
                  "as %s.rank<R>.json; merge them with fsdp2-trace merge -o %s ...",
                  missing, n, session.path, session.path);
        goto done;
    }
    status = fsdp2_trace_merge(list, (size_t)n, session.path);
    for (int r = 0; r < n && status == FSDP2_SUCCESS; r++)
        unlink(parts[r]);
done:
    free(parts);
    free(list);
    return status;
}

/* The store keys of this session's stop meeting start with this. */
static void meeting_prefix(char *buf, size_t cap)
{
    snprintf(buf, cap, "fsdp2/trace/%u", session.sessions);
}

/* Posts this rank's word for the stop's meeting: "ok" or why its part is missing. */
static fsdp2_status_t tell(fsdp2_store_t *store, const char *prefix, int rank, const char *word)
{
    char key[160];
    snprintf(key, sizeof(key), "%s/%d", prefix, rank);
    return fsdp2_store_set(store, key, word, strlen(word));
}

fsdp2_status_t fsdp2_trace_stop(fsdp2_context_t *ctx)
{
    char prefix[128];
    if (!fsdp2_tracing()) {
        if (ctx && session.failed_ctx == ctx) { /* rank 0 is waiting for our word */
            fsdp2_store_t *store = NULL;
            fsdp2_process_info_t info;
            session.failed_ctx = NULL;
            meeting_prefix(prefix, sizeof(prefix));
            if (fsdp2_context_store(ctx, &store) == FSDP2_SUCCESS &&
                fsdp2_context_info(ctx, &info) == FSDP2_SUCCESS) {
                char word[600];
                snprintf(word, sizeof(word), "tracing did not start: %s", session.failed);
                tell(store, prefix, info.rank, word);
            }
        }
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "trace stop: tracing is not on");
    }
    FSDP2_ARG_CHECK(!ctx || !session.ctx || ctx == session.ctx,
                    "trace stop: not the context tracing was started with");
    fsdp2_trace_recorder_stop();
    if (session.world_size == 1)
        return fsdp2_trace_write_part(session.path, session.rank, session.world_size);
    char part[TRACE_PATH_MAX + 32];
    part_path(part, sizeof(part), session.path, session.rank);
    fsdp2_status_t status = fsdp2_trace_write_part(part, session.rank, session.world_size);
    if (!session.ctx)
        return status; /* no store to meet at: the parts stay for fsdp2_trace_merge */
    char word[512];
    snprintf(word, sizeof(word), "%s", status == FSDP2_SUCCESS ? "ok" : fsdp2_last_error());
    meeting_prefix(prefix, sizeof(prefix));
    fsdp2_store_t *store = NULL;
    FSDP2_CHECK(fsdp2_context_store(session.ctx, &store));
    fsdp2_status_t told = tell(store, prefix, session.rank, word);
    if (status != FSDP2_SUCCESS)
        return fsdp2_error(status, "%s", word);
    FSDP2_CHECK(told);
    /* Rank 0 merges and says how it went; the others wait for that, so a next trace
     * to the same path cannot meet this one's parts, and every rank returns the same. */
    char key[160];
    snprintf(key, sizeof(key), "%s/merged", prefix);
    if (session.rank == 0) {
        status = gather_parts(store, prefix);
        snprintf(word, sizeof(word), "%s", status == FSDP2_SUCCESS ? "ok" : fsdp2_last_error());
        fsdp2_store_set(store, key, word, strlen(word));
        return status;
    }
    size_t len = 0;
    FSDP2_CHECK(fsdp2_store_get(store, key, word, sizeof(word) - 1, &len));
    word[len < sizeof(word) ? len : sizeof(word) - 1] = '\0';
    if (strcmp(word, "ok") != 0)
        return fsdp2_error(FSDP2_ERR_IO, "trace: rank 0 could not merge the ranks' files: %s",
                           word);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_trace_session_from_env(fsdp2_context_t *ctx)
{
    /* The table takes any path; trying its directory is the check (check_path). */
    const char *path = fsdp2_env_text(FSDP2_ENV_TRACE);
    if (!path)
        return FSDP2_SUCCESS;
    fsdp2_status_t status = fsdp2_trace_start(ctx, path);
    if (status != FSDP2_SUCCESS)
        return fsdp2_error(status == FSDP2_ERR_IO ? FSDP2_ERR_INVALID_CONFIG : status,
                           "FSDP2_TRACE='%s': %s", path, fsdp2_last_error());
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_trace_session_end(fsdp2_context_t *ctx)
{
    if ((!fsdp2_tracing() || session.ctx != ctx) && session.failed_ctx != ctx)
        return FSDP2_SUCCESS;
    fsdp2_status_t status = fsdp2_trace_stop(ctx);
    return status == FSDP2_ERR_INVALID_STATE ? FSDP2_SUCCESS : status; /* failed start: told */
}
