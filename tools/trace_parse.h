/* Reading a trace file's events into the arrays trace_model.c builds the model from.
 * Private to trace_model.c and trace_parse.c. */
#ifndef FSDP2_TOOLS_TRACE_PARSE_H
#define FSDP2_TOOLS_TRACE_PARSE_H

#include "trace_model.h"

typedef struct trace_flow_end {
    const char *id;
    char phase; /* 's' or 'f' */
    int64_t pid, tid;
    double ts;
    size_t event;
} trace_flow_end_t;

/* thread_name or thread_sort_index of one (pid, tid). */
typedef struct trace_track_meta {
    int64_t pid, tid;
    const char *name;
    double sort_index;
    int has_sort;
} trace_track_meta_t;

/* What the events leave: slices and counters go straight into the model (unsorted),
 * the rest waits here for trace_model.c. */
typedef struct trace_loader {
    trace_model_t *m;
    const char *text, *end;
    char *error;
    size_t error_len;
    size_t slice_cap, counter_cap, end_cap, meta_cap, pid_cap;
    trace_flow_end_t *ends;
    size_t n_ends;
    trace_track_meta_t *meta;
    size_t n_meta;
    int64_t *pids; /* of every event, repeated */
    size_t n_pids;
} trace_loader_t;

/* Reads path and parses its events into L (L->m->path names the file in messages). */
int trace_parse_file(trace_loader_t *L, const char *path);

/* "PATH: message" into L->error; returns -1. */
int trace_loader_fail(trace_loader_t *L, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* s copied into the model's strings; NULL when out of memory. */
const char *trace_model_strdup(trace_model_t *m, const char *s);

/* array (of *cap items of elem bytes) with room for need items, doubling; NULL when out
 * of memory, array left as it was. */
void *trace_reserve(void *array, size_t *cap, size_t need, size_t elem);

#endif
