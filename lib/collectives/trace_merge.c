/* Merging per-rank trace files into one (fsdp2_trace_merge; fsdp2_trace_stop calls it on
 * rank 0). Each part is parsed whole with cJSON and its events are written back one per
 * line. Parts from one host keep their monotonic timestamps. Parts from several hosts
 * (different boot ids) move onto the wall clock: each by its own realtime - monotonic
 * offset, minus the smallest offset of all parts, which the file records as
 * otherData.realtime_base_us. Shifting by the difference keeps timestamps near their
 * monotonic size, where doubles still resolve nanoseconds. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/trace_internal.h"

#define TRACE_PATH_MAX 4000


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
    double offset_ns; /* realtime - monotonic of its host */
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
    const cJSON *clock = cJSON_GetObjectItemCaseSensitive(other, "clock");
    if (cJSON_IsString(clock) && strcmp(clock->valuestring, "monotonic") != 0)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "trace merge: '%s' was already merged across hosts (clock '%s'); "
                           "merge the ranks' own files",
                           path, clock->valuestring);
    return FSDP2_SUCCESS;
}

static const char *rank_text(const cJSON *rank, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rank, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static fsdp2_status_t write_merged(const char *output, part_t *parts, size_t n, int realtime,
                                   double base_us)
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
               "\"format\":1,\"clock\":\"%s\",",
            realtime ? "realtime" : "monotonic");
    if (realtime)
        fprintf(f, "\"realtime_base_us\":%.3f,", base_us);
    fprintf(f, "\"ranks\":%s},\n\"traceEvents\":[\n", ranks_text);
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
    double base_ns = 0;
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
            parts[i].offset_ns = cJSON_IsNumber(off) ? off->valuedouble : 0;
            if (i == 0 || parts[i].offset_ns < base_ns)
                base_ns = parts[i].offset_ns;
        }
        for (size_t i = 0; i < n && realtime; i++)
            parts[i].shift_us = (parts[i].offset_ns - base_ns) / 1000.0;
    }
    if (status == FSDP2_SUCCESS)
        status = write_merged(output, parts, n, realtime, base_ns / 1000.0);
    for (size_t i = 0; i < n; i++)
        cJSON_Delete(parts[i].root);
    free(parts);
    return status;
}
