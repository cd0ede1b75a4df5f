/* Tracing sessions: start and stop around chosen steps, FSDP2_TRACE, and merging the
 * ranks' files into one (see fsdp2/trace.h). Here rather than in lib/core because the
 * merge at stop meets the other ranks through the context's store. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

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
    unsigned sessions; /* starts so far: names the keys of the stop's meeting */
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
    } else if (fsdp2_process_info_from_env(&info) == FSDP2_SUCCESS) {
        rank = info.rank; /* launched as one of several ranks, without fsdp2_init */
        world_size = info.world_size;
    }
    FSDP2_CHECK(check_path(path));
    FSDP2_CHECK(fsdp2_trace_recorder_start((size_t)fsdp2_env_int(FSDP2_ENV_TRACE_EVENTS)));
    session.ctx = ctx;
    session.rank = rank;
    session.world_size = world_size;
    snprintf(session.path, sizeof(session.path), "%s", path);
    session.sessions++;
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

fsdp2_status_t fsdp2_trace_stop(fsdp2_context_t *ctx)
{
    if (!fsdp2_tracing())
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "trace stop: tracing is not on");
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
    char key_prefix[128], key[160], word[512];
    snprintf(key_prefix, sizeof(key_prefix), "fsdp2/trace/%u", session.sessions);
    snprintf(key, sizeof(key), "%s/%d", key_prefix, session.rank);
    if (status == FSDP2_SUCCESS)
        snprintf(word, sizeof(word), "ok");
    else
        snprintf(word, sizeof(word), "%s", fsdp2_last_error());
    fsdp2_store_t *store = NULL;
    FSDP2_CHECK(fsdp2_context_store(session.ctx, &store));
    fsdp2_status_t told = fsdp2_store_set(store, key, word, strlen(word));
    if (status != FSDP2_SUCCESS)
        return fsdp2_error(status, "%s", word);
    FSDP2_CHECK(told);
    return session.rank == 0 ? gather_parts(store, key_prefix) : FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_trace_session_from_env(fsdp2_context_t *ctx)
{
    const char *path = getenv("FSDP2_TRACE");
    if (!path || !path[0])
        return FSDP2_SUCCESS;
    fsdp2_status_t status = fsdp2_trace_start(ctx, path);
    if (status != FSDP2_SUCCESS)
        return fsdp2_error(status == FSDP2_ERR_IO ? FSDP2_ERR_INVALID_CONFIG : status,
                           "FSDP2_TRACE='%s': %s", path, fsdp2_last_error());
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_trace_session_end(fsdp2_context_t *ctx)
{
    if (!fsdp2_tracing() || session.ctx != ctx)
        return FSDP2_SUCCESS;
    return fsdp2_trace_stop(ctx);
}

/* ---- merge ---- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        char *bigger = realloc(buf, 2 * cap + 1);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

typedef struct part {
    cJSON *root;
    cJSON *events; /* traceEvents */
    cJSON *ranks;  /* otherData.ranks */
    double shift_us;
} part_t;

static fsdp2_status_t load_part(const char *path, part_t *p)
{
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text)
        return fsdp2_error(FSDP2_ERR_IO, "trace merge: cannot read '%s': %s", path,
                           strerror(errno ? errno : EIO));
    p->root = cJSON_ParseWithLength(text, len);
    free(text);
    cJSON *other = p->root ? cJSON_GetObjectItemCaseSensitive(p->root, "otherData") : NULL;
    p->events = p->root ? cJSON_GetObjectItemCaseSensitive(p->root, "traceEvents") : NULL;
    p->ranks = other ? cJSON_GetObjectItemCaseSensitive(other, "ranks") : NULL;
    if (!p->root || !cJSON_IsArray(p->events) || !cJSON_IsArray(p->ranks) ||
        cJSON_GetArraySize(p->ranks) < 1)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "trace merge: '%s' is not a libfsdp2 trace (JSON with traceEvents and "
                           "otherData.ranks)",
                           path);
    return FSDP2_SUCCESS;
}

static const char *rank_text(const cJSON *rank, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rank, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static fsdp2_status_t write_merged(const char *output, part_t *parts, size_t n, int realtime)
{
    char tmp[TRACE_PATH_MAX + 64];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", output, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return fsdp2_error(FSDP2_ERR_IO, "trace merge: cannot create '%s': %s", tmp,
                           strerror(errno));
    cJSON *ranks = cJSON_CreateArray();
    for (size_t i = 0; i < n && ranks; i++) {
        cJSON *r;
        cJSON_ArrayForEach(r, parts[i].ranks)
            cJSON_AddItemToArray(ranks, cJSON_Duplicate(r, 1));
    }
    char *ranks_text = ranks ? cJSON_PrintUnformatted(ranks) : NULL;
    cJSON_Delete(ranks);
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (!ranks_text) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "trace merge: rank list");
        goto close;
    }
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"libfsdp2 merge\","
               "\"format\":1,\"clock\":\"%s\",\"ranks\":%s},\n\"traceEvents\":[\n",
            realtime ? "realtime" : "monotonic", ranks_text);
    free(ranks_text);
    const char *sep = "";
    for (size_t i = 0; i < n && status == FSDP2_SUCCESS; i++) {
        cJSON *e;
        cJSON_ArrayForEach(e, parts[i].events)
        {
            cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
            if (parts[i].shift_us != 0 && cJSON_IsNumber(ts))
                cJSON_SetNumberValue(ts, ts->valuedouble + parts[i].shift_us);
            char *line = cJSON_PrintUnformatted(e);
            if (!line) {
                status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "trace merge: an event");
                break;
            }
            fprintf(f, "%s%s", sep, line);
            free(line);
            sep = ",\n";
        }
    }
    fputs("\n]}\n", f);
close:
    if (ferror(f) && status == FSDP2_SUCCESS)
        status = fsdp2_error(FSDP2_ERR_IO, "trace merge: writing '%s' failed", tmp);
    if (fclose(f) != 0 && status == FSDP2_SUCCESS)
        status = fsdp2_error(FSDP2_ERR_IO, "trace merge: writing '%s' failed: %s", tmp,
                             strerror(errno));
    if (status == FSDP2_SUCCESS && rename(tmp, output) != 0)
        status = fsdp2_error(FSDP2_ERR_IO, "trace merge: cannot rename '%s' to '%s': %s", tmp,
                             output, strerror(errno));
    if (status != FSDP2_SUCCESS)
        unlink(tmp);
    return status;
}

fsdp2_status_t fsdp2_trace_merge(const char *const *inputs, size_t n, const char *output)
{
    FSDP2_ARG_CHECK(inputs && n > 0 && output && output[0],
                    "trace merge: inputs (%zu) or output is missing", n);
    for (size_t i = 0; i < n; i++)
        FSDP2_ARG_CHECK(inputs[i], "trace merge: input %zu is NULL", i);
    part_t *parts = calloc(n, sizeof(*parts));
    if (!parts)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "trace merge: %zu inputs", n);
    fsdp2_status_t status = FSDP2_SUCCESS;
    for (size_t i = 0; i < n && status == FSDP2_SUCCESS; i++)
        status = load_part(inputs[i], &parts[i]);
    /* The same rank twice would put two files' events on one process. */
    for (size_t i = 0; i < n && status == FSDP2_SUCCESS; i++) {
        for (size_t j = 0; j < i && status == FSDP2_SUCCESS; j++) {
            cJSON *a, *b;
            cJSON_ArrayForEach(a, parts[i].ranks) cJSON_ArrayForEach(b, parts[j].ranks)
            {
                const cJSON *ra = cJSON_GetObjectItemCaseSensitive(a, "rank");
                const cJSON *rb = cJSON_GetObjectItemCaseSensitive(b, "rank");
                if (cJSON_IsNumber(ra) && cJSON_IsNumber(rb) && ra->valueint == rb->valueint &&
                    status == FSDP2_SUCCESS)
                    status = fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                                         "trace merge: rank %d is in both '%s' and '%s'",
                                         ra->valueint, inputs[j], inputs[i]);
            }
        }
    }
    int realtime = 0;
    if (status == FSDP2_SUCCESS && n > 1) {
        const char *boot0 = rank_text(cJSON_GetArrayItem(parts[0].ranks, 0), "boot_id");
        for (size_t i = 0; i < n; i++) {
            cJSON *r;
            cJSON_ArrayForEach(r, parts[i].ranks) realtime |=
                strcmp(rank_text(r, "boot_id"), boot0) != 0 || !boot0[0];
        }
        for (size_t i = 0; i < n && realtime; i++) {
            const cJSON *off = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(parts[i].ranks, 0),
                                                                "realtime_minus_monotonic_ns");
            parts[i].shift_us = cJSON_IsNumber(off) ? off->valuedouble / 1000.0 : 0;
        }
    }
    if (status == FSDP2_SUCCESS)
        status = write_merged(output, parts, n, realtime);
    for (size_t i = 0; i < n; i++)
        cJSON_Delete(parts[i].root);
    free(parts);
    return status;
}
