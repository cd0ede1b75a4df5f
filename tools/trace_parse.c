/* Reading a trace file (see trace_parse.h): the events, checked one by one.
 *
 * The document is walked by hand down to the members of the top-level object; each
 * member's value, and each element of traceEvents, is parsed on its own with cJSON and
 * dropped once its fields are copied. A trace of a few hundred thousand events per rank
 * would otherwise hold hundreds of megabytes of cJSON nodes. */
#include "trace_parse.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int trace_loader_fail(trace_loader_t *L, const char *fmt, ...)
{
    int n = snprintf(L->error, L->error_len, "%s: ", L->m->path);
    if (n >= 0 && (size_t)n < L->error_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(L->error + n, L->error_len - n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int out_of_memory(trace_loader_t *L)
{
    return trace_loader_fail(L, "out of memory");
}

size_t trace_utf8_length(const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    if (s[0] < 0x80)
        return 1;
    size_t n = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
             : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    if (n == 0)
        return 0;
    /* no overlong forms, surrogates or code points past U+10FFFF */
    unsigned char lo = s[0] == 0xe0 ? 0xa0 : s[0] == 0xf0 ? 0x90 : 0x80;
    unsigned char hi = s[0] == 0xed ? 0x9f : s[0] == 0xf4 ? 0x8f : 0xbf;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

const char *trace_printable(const char *s, char *buf, size_t len, size_t max)
{
    size_t o = 0;
    if (max + 4 > len)
        max = len > 4 ? len - 4 : 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p && o < max) {
        size_t n = trace_utf8_length((const char *)p);
        if (n == 0 || (n == 1 && (*p < 0x20 || *p == 0x7f))) {
            buf[o++] = '?';
            p++;
            continue;
        }
        if (o + n > max)
            break;
        memcpy(buf + o, p, n);
        o += n;
        p += n;
    }
    if (*p)
        for (int i = 0; i < 3; i++)
            buf[o++] = '.';
    buf[o] = '\0';
    return buf;
}

static void line_column(const char *text, const char *at, int *line, int *column)
{
    *line = 1;
    *column = 1;
    for (const char *p = text; p < at; p++) {
        if (*p == '\n') {
            (*line)++;
            *column = 1;
        } else {
            (*column)++;
        }
    }
}

static const char *skip_space(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static int truncated(trace_loader_t *L)
{
    return trace_loader_fail(L, "the file ends before the JSON is complete (truncated?)");
}

static int syntax_error(trace_loader_t *L, const char *at, const char *what)
{
    if (at >= L->end)
        return truncated(L);
    int line, column;
    line_column(L->text, at, &line, &column);
    return trace_loader_fail(L, "not valid JSON at line %d column %d (%s)", line, column, what);
}

/* One JSON value at p; *next is just after it. */
static int parse_value(trace_loader_t *L, const char *p, cJSON **value, const char **next,
                       const char *what)
{
    const char *stop = NULL;
    *value = cJSON_ParseWithLengthOpts(p, (size_t)(L->end - p), &stop, 0);
    if (*value == NULL) {
        /* cJSON reports the last byte when the input ran out. */
        if (stop == NULL || stop >= L->end - 1)
            return truncated(L);
        return syntax_error(L, stop, what);
    }
    *next = stop;
    return 0;
}

static const char *json_type(const cJSON *v)
{
    return cJSON_IsArray(v) ? "array" : cJSON_IsObject(v) ? "object" : cJSON_IsString(v) ? "string"
         : cJSON_IsNumber(v) ? "number" : cJSON_IsBool(v) ? "boolean" : "null";
}

/* ---- one event -------------------------------------------------------------------- */

/* 0 and *out: a finite number; 1: absent; -1: something else. */
static int get_number(const cJSON *obj, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL)
        return 1;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return -1;
    *out = v->valuedouble;
    return 0;
}

static int get_integer(const cJSON *obj, const char *key, int64_t *out)
{
    double d;
    int rc = get_number(obj, key, &d);
    if (rc != 0)
        return rc;
    if (d != floor(d) || fabs(d) > 9007199254740992.0)
        return -1;
    *out = (int64_t)d;
    return 0;
}

static const char *get_string(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* "event 12 (ph X, pid 0, tid 2, ts 5.000, "forward fc1")" with what the event has. */
static const char *describe(const cJSON *e, size_t index, char *buf, size_t len)
{
    int n = snprintf(buf, len, "event %zu (", index);
    const char *sep = "";
    const char *ph = get_string(e, "ph"), *name = get_string(e, "name");
    int64_t i;
    double d;
    char printable[96];
    if (ph)
        n += snprintf(buf + n, len - n, "ph %s", trace_printable(ph, printable, 96, 8)), sep = ", ";
    if (get_integer(e, "pid", &i) == 0)
        n += snprintf(buf + n, len - n, "%spid %lld", sep, (long long)i), sep = ", ";
    if (get_integer(e, "tid", &i) == 0)
        n += snprintf(buf + n, len - n, "%stid %lld", sep, (long long)i), sep = ", ";
    if (get_number(e, "ts", &d) == 0)
        n += snprintf(buf + n, len - n, "%sts %.3f", sep, d), sep = ", ";
    if (name)
        n += snprintf(buf + n, len - n, "%s\"%s\"", sep, trace_printable(name, printable, 96, 60));
    snprintf(buf + n, len - n, ")");
    return buf;
}

static int fail_event(trace_loader_t *L, const cJSON *e, size_t index, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_event(trace_loader_t *L, const cJSON *e, size_t index, const char *fmt, ...)
{
    char where[256], what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return trace_loader_fail(L, "%s: %s", describe(e, index, where, sizeof(where)), what);
}

static int need_integer(trace_loader_t *L, const cJSON *e, size_t index, const char *key,
                        int64_t *out)
{
    int rc = get_integer(e, key, out);
    if (rc == 1)
        return fail_event(L, e, index, "no \"%s\"", key);
    if (rc < 0)
        return fail_event(L, e, index, "\"%s\" is not an integer", key);
    return 0;
}

static int need_number(trace_loader_t *L, const cJSON *e, size_t index, const char *key,
                       double *out)
{
    int rc = get_number(e, key, out);
    if (rc == 1)
        return fail_event(L, e, index, "no \"%s\"", key);
    if (rc < 0)
        return fail_event(L, e, index, "\"%s\" is not a finite number", key);
    return 0;
}

static int add_pid(trace_loader_t *L, int64_t pid)
{
    if (L->n_pids > 0 && L->pids[L->n_pids - 1] == pid)
        return 0;
    int64_t *pids = trace_reserve(L->pids, &L->pid_cap, L->n_pids + 1, sizeof(*pids));
    if (pids == NULL)
        return out_of_memory(L);
    L->pids = pids;
    pids[L->n_pids++] = pid;
    return 0;
}

/* args.key as an optional string copied into the model. */
static int optional_string(trace_loader_t *L, const cJSON *e, size_t index, const cJSON *args,
                           const char *key, const char **out)
{
    const cJSON *v = args ? cJSON_GetObjectItemCaseSensitive(args, key) : NULL;
    *out = NULL;
    if (v == NULL)
        return 0;
    if (!cJSON_IsString(v))
        return fail_event(L, e, index, "args.%s is a %s, not a string", key, json_type(v));
    *out = trace_model_strdup(L->m, v->valuestring);
    return *out ? 0 : out_of_memory(L);
}

static int slice_args(trace_loader_t *L, const cJSON *e, size_t index, trace_slice_t *s)
{
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (args != NULL && !cJSON_IsObject(args))
        return fail_event(L, e, index, "\"args\" is not an object");
    if (optional_string(L, e, index, args, "module", &s->module) ||
        optional_string(L, e, index, args, "dtype", &s->dtype) ||
        optional_string(L, e, index, args, "category", &s->memory_category))
        return -1;
    if (args == NULL)
        return 0;
    int rc = get_integer(args, "step", &s->step);
    if (rc < 0)
        return fail_event(L, e, index, "args.step is not an integer");
    s->has_step = rc == 0;
    rc = get_number(args, "bytes", &s->bytes);
    if (rc < 0 || (rc == 0 && s->bytes < 0))
        return fail_event(L, e, index, "args.bytes is not a non-negative number");
    s->has_bytes = rc == 0;
    return 0;
}

static int load_slice(trace_loader_t *L, const cJSON *e, size_t index)
{
    trace_slice_t s = {.event = index};
    if (need_integer(L, e, index, "pid", &s.pid) || need_integer(L, e, index, "tid", &s.tid) ||
        need_number(L, e, index, "ts", &s.ts) || need_number(L, e, index, "dur", &s.dur))
        return -1;
    if (s.dur < 0)
        return fail_event(L, e, index, "dur %g is negative", s.dur);
    const char *name = get_string(e, "name"), *cat = get_string(e, "cat");
    if (name == NULL)
        return fail_event(L, e, index, "no string \"name\"");
    if (cat == NULL)
        return fail_event(L, e, index, "no string \"cat\"");
    s.name = trace_model_strdup(L->m, name);
    s.cat = trace_model_strdup(L->m, cat);
    if (s.name == NULL || s.cat == NULL)
        return out_of_memory(L);
    if (slice_args(L, e, index, &s))
        return -1;
    trace_model_t *m = L->m;
    trace_slice_t *slices = trace_reserve(m->slices, &L->slice_cap, m->n_slices + 1, sizeof(s));
    if (slices == NULL)
        return out_of_memory(L);
    m->slices = slices;
    slices[m->n_slices++] = s;
    return add_pid(L, s.pid);
}

static int load_metadata(trace_loader_t *L, const cJSON *e, size_t index)
{
    const char *name = get_string(e, "name");
    int is_name = name && !strcmp(name, "thread_name");
    int is_sort = name && !strcmp(name, "thread_sort_index");
    int64_t pid;
    if (!is_name && !is_sort)
        return get_integer(e, "pid", &pid) == 0 ? add_pid(L, pid) : 0;
    trace_track_meta_t t = {0};
    if (need_integer(L, e, index, "pid", &t.pid) || need_integer(L, e, index, "tid", &t.tid))
        return -1;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (is_name) {
        const char *track = get_string(args, "name");
        if (track == NULL)
            return fail_event(L, e, index, "thread_name without a string args.name");
        if ((t.name = trace_model_strdup(L->m, track)) == NULL)
            return out_of_memory(L);
    } else {
        if (get_number(args, "sort_index", &t.sort_index) != 0)
            return fail_event(L, e, index, "thread_sort_index without a numeric args.sort_index");
        t.has_sort = 1;
    }
    trace_track_meta_t *meta = trace_reserve(L->meta, &L->meta_cap, L->n_meta + 1, sizeof(t));
    if (meta == NULL)
        return out_of_memory(L);
    L->meta = meta;
    meta[L->n_meta++] = t;
    return add_pid(L, t.pid);
}

static int load_flow(trace_loader_t *L, const cJSON *e, size_t index, char phase)
{
    trace_flow_end_t f = {.phase = phase, .event = index};
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
    char buf[64];
    if (cJSON_IsNumber(id) && isfinite(id->valuedouble))
        snprintf(buf, sizeof(buf), "%.17g", id->valuedouble);
    else if (!cJSON_IsString(id))
        return fail_event(L, e, index, "flow event without a numeric or string \"id\"");
    if (need_integer(L, e, index, "pid", &f.pid) || need_integer(L, e, index, "tid", &f.tid) ||
        need_number(L, e, index, "ts", &f.ts))
        return -1;
    if ((f.id = trace_model_strdup(L->m, cJSON_IsString(id) ? id->valuestring : buf)) == NULL)
        return out_of_memory(L);
    trace_flow_end_t *ends = trace_reserve(L->ends, &L->end_cap, L->n_ends + 1, sizeof(f));
    if (ends == NULL)
        return out_of_memory(L);
    L->ends = ends;
    ends[L->n_ends++] = f;
    return add_pid(L, f.pid);
}

static int load_counter(trace_loader_t *L, const cJSON *e, size_t index)
{
    const char *name = get_string(e, "name");
    if (name == NULL || strcmp(name, "memory") != 0)
        return 0; /* other counters are drawn by Perfetto, not by us */
    trace_counter_t c = {.event = index};
    if (need_integer(L, e, index, "pid", &c.pid) || need_number(L, e, index, "ts", &c.ts))
        return -1;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (!cJSON_IsObject(args))
        return fail_event(L, e, index, "memory counter without an \"args\" object");
    for (int k = 0; k < TRACE_MEMORY_CATEGORIES; k++) {
        const char *key = trace_memory_category_names[k];
        int rc = get_number(args, key, &c.bytes[k]);
        if (rc == 1 && k == TRACE_MEMORY_CATEGORIES - 1) {
            c.bytes[k] = 0;
            continue;
        }
        if (rc == 1)
            return fail_event(L, e, index, "memory counter has no \"%s\"", key);
        if (rc < 0 || c.bytes[k] < 0)
            return fail_event(L, e, index, "memory counter \"%s\" is not a non-negative number",
                              key);
    }
    trace_model_t *m = L->m;
    trace_counter_t *counters = trace_reserve(m->counters, &L->counter_cap, m->n_counters + 1,
                                        sizeof(c));
    if (counters == NULL)
        return out_of_memory(L);
    m->counters = counters;
    counters[m->n_counters++] = c;
    return add_pid(L, c.pid);
}

static int load_event(trace_loader_t *L, const cJSON *e, size_t index)
{
    if (!cJSON_IsObject(e))
        return trace_loader_fail(L, "event %zu is a JSON %s, not an object", index, json_type(e));
    const char *ph = get_string(e, "ph");
    if (ph == NULL)
        return fail_event(L, e, index, "no string \"ph\"");
    if (!strcmp(ph, "X"))
        return load_slice(L, e, index);
    if (!strcmp(ph, "M"))
        return load_metadata(L, e, index);
    if (!strcmp(ph, "s") || !strcmp(ph, "f"))
        return load_flow(L, e, index, ph[0]);
    if (!strcmp(ph, "C"))
        return load_counter(L, e, index);
    return 0;
}

/* ---- the document ----------------------------------------------------------------- */

static int parse_events(trace_loader_t *L, const char **at)
{
    const char *p = skip_space(*at + 1, L->end);
    if (p < L->end && *p == ']') {
        *at = p + 1;
        return 0;
    }
    for (size_t i = 0;; i++) {
        if (p >= L->end)
            return truncated(L);
        char what[64];
        snprintf(what, sizeof(what), "in traceEvents[%zu]", i);
        cJSON *e;
        if (parse_value(L, p, &e, &p, what))
            return -1;
        int rc = load_event(L, e, i);
        cJSON_Delete(e);
        if (rc)
            return -1;
        p = skip_space(p, L->end);
        if (p >= L->end)
            return truncated(L);
        if (*p == ']') {
            *at = p + 1;
            return 0;
        }
        if (*p != ',')
            return syntax_error(L, p, "expected ',' or ']' after an event");
        p = skip_space(p + 1, L->end);
    }
}

/* One top-level member at *at ('"' of its name); *at moves past its value. */
static int parse_member(trace_loader_t *L, const char **at, int *seen_events)
{
    cJSON *key, *value;
    const char *p;
    if (parse_value(L, *at, &key, &p, "a member name"))
        return -1;
    int is_events = !strcmp(key->valuestring, "traceEvents");
    cJSON_Delete(key);
    p = skip_space(p, L->end);
    if (p >= L->end)
        return truncated(L);
    if (*p != ':')
        return syntax_error(L, p, "expected ':' after a member name");
    p = skip_space(p + 1, L->end);
    if (p >= L->end)
        return truncated(L);
    if (is_events && *seen_events)
        return trace_loader_fail(L, "two \"traceEvents\" members");
    if (is_events && *p == '[') {
        *seen_events = 1;
        *at = p;
        return parse_events(L, at);
    }
    if (parse_value(L, p, &value, at, "a member value"))
        return -1;
    const char *type = json_type(value);
    cJSON_Delete(value);
    if (is_events)
        return trace_loader_fail(L, "\"traceEvents\" is a JSON %s, not an array", type);
    return 0;
}

static int parse_document(trace_loader_t *L)
{
    const char *p = skip_space(L->text, L->end);
    if (p >= L->end)
        return trace_loader_fail(L, L->text == L->end ? "empty file"
                                                      : "no JSON in the file, only white space");
    if (*p != '{') {
        cJSON *v;
        if (parse_value(L, p, &v, &p, "the top-level value"))
            return -1;
        const char *type = json_type(v);
        cJSON_Delete(v);
        return trace_loader_fail(L, "the top level is a JSON %s, not an object with "
                                 "\"traceEvents\"", type);
    }
    int seen = 0;
    p = skip_space(p + 1, L->end);
    if (p < L->end && *p == '}') {
        p++;
    } else {
        for (;;) {
            if (p >= L->end)
                return truncated(L);
            if (*p != '"')
                return syntax_error(L, p, "expected a member name");
            if (parse_member(L, &p, &seen))
                return -1;
            p = skip_space(p, L->end);
            if (p >= L->end)
                return truncated(L);
            if (*p == '}') {
                p++;
                break;
            }
            if (*p != ',')
                return syntax_error(L, p, "expected ',' or '}' after a member");
            p = skip_space(p + 1, L->end);
        }
    }
    p = skip_space(p, L->end);
    if (p < L->end)
        return syntax_error(L, p, "data after the top-level object");
    if (!seen)
        return trace_loader_fail(L, "no \"traceEvents\" array in the top-level object");
    return 0;
}

static char *read_file(trace_loader_t *L, const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        trace_loader_fail(L, "cannot open: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        trace_loader_fail(L, "not a regular file");
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *text = malloc(cap);
    for (ssize_t got = 1; text != NULL && got > 0;) {
        if (n + 1 >= cap) {
            char *bigger = realloc(text, cap *= 2);
            if (bigger == NULL) {
                free(text);
                text = NULL;
                break;
            }
            text = bigger;
        }
        got = read(fd, text + n, cap - n - 1);
        if (got < 0) {
            trace_loader_fail(L, "cannot read: %s", strerror(errno));
            free(text);
            close(fd);
            return NULL;
        }
        n += (size_t)got;
    }
    close(fd);
    if (text == NULL)
        out_of_memory(L);
    *len = n;
    return text;
}

int trace_parse_file(trace_loader_t *L, const char *path)
{
    size_t len = 0;
    char *text = read_file(L, path, &len);
    if (text == NULL)
        return -1;
    L->text = text;
    L->end = text + len;
    int rc = parse_document(L);
    free(text);
    L->text = L->end = NULL;
    return rc;
}
