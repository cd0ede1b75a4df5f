/* A trace file (docs/tracing.md, "The trace file") loaded for fsdp2-trace: the slices,
 * tracks, flows, memory counters and steps of every rank, checked on the way in.
 *
 * Loading is checking: trace_model_load refuses a file that is not one JSON object with
 * a traceEvents array, a slice without numeric pid/tid/ts/dur >= 0 or a string
 * name/cat, slices that partly overlap on one track, a flow id without exactly one 's'
 * and one 'f' (the 'f' not earlier), and a memory counter without all six non-negative
 * categories; the message names the file, the event and the problem. Events of other
 * phases are skipped. The events array is parsed one event at a time, so the whole
 * document never sits in memory as a cJSON tree. */
#ifndef FSDP2_TOOLS_TRACE_MODEL_H
#define FSDP2_TOOLS_TRACE_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Timestamps are written with nanosecond decimals: ends closer than this touch. */
#define TRACE_EPSILON_US 0.0005

/* The last, post_forward_params, may be missing (traces written before it existed). */
#define TRACE_MEMORY_CATEGORIES 7
extern const char *const trace_memory_category_names[TRACE_MEMORY_CATEGORIES];

typedef struct trace_slice {
    int64_t pid, tid;
    double ts, dur;             /* microseconds */
    const char *name, *cat;     /* owned by the model */
    const char *module;         /* args.module, NULL when absent ("" is the root) */
    const char *dtype;          /* args.dtype, NULL when absent */
    const char *memory_category; /* args.category, NULL when absent */
    int has_step, has_bytes;
    int64_t step;               /* args.step */
    double bytes;               /* args.bytes */
    size_t event;               /* index in traceEvents, for messages */
    size_t track;               /* index in trace_model_t.tracks */
    int depth;                  /* 0 at the top of its track, 1 inside one slice, ... */
} trace_slice_t;

/* One (pid, tid). Its slices are slices[first_slice .. first_slice + n_slices), ordered
 * by start, longer first, so that a parent comes before what it contains. */
typedef struct trace_track {
    int64_t pid, tid;
    const char *name; /* thread_name, NULL when the trace names none */
    double sort_index; /* thread_sort_index, else tid */
    size_t first_slice, n_slices;
} trace_track_t;

typedef struct trace_flow {
    const char *id;
    int64_t s_pid, s_tid, f_pid, f_tid;
    double s_ts, f_ts;
} trace_flow_t;

/* A "memory" counter: bytes per category from ts until the next counter of the rank. */
typedef struct trace_counter {
    int64_t pid;
    double ts;
    double bytes[TRACE_MEMORY_CATEGORIES];
    size_t event;
} trace_counter_t;

typedef struct trace_step {
    int64_t pid, step;
    double ts, dur;
    size_t slice;
} trace_step_t;

/* Everything of one pid: indices into the model's arrays. tracks lists the rank's tracks
 * in display order (thread_sort_index, then tid); counters are by time; steps by number. */
typedef struct trace_rank {
    int64_t pid;
    size_t *tracks, n_tracks;
    size_t first_counter, n_counters;
    size_t first_step, n_steps;
} trace_rank_t;

typedef struct trace_model {
    char *path;
    trace_slice_t *slices;
    size_t n_slices;
    trace_track_t *tracks; /* by (pid, tid) */
    size_t n_tracks;
    trace_flow_t *flows;
    size_t n_flows;
    trace_counter_t *counters; /* by (pid, ts, event) */
    size_t n_counters;
    trace_step_t *steps; /* by (pid, step) */
    size_t n_steps;
    trace_rank_t *ranks; /* by pid */
    size_t n_ranks;
    struct trace_arena *strings;
} trace_model_t;

/* Reads and checks path. 0 and *out on success (free it with trace_model_free); -1 with
 * a one-line message in error ("PATH: ...") otherwise. */
int trace_model_load(const char *path, trace_model_t **out, char *error, size_t error_len);
void trace_model_free(trace_model_t *model);

/* The rank with this pid, NULL when the trace has none. */
const trace_rank_t *trace_model_rank(const trace_model_t *model, int64_t pid);

/* The rank's step number `step`, NULL when it has none. */
const trace_step_t *trace_model_step(const trace_model_t *model, const trace_rank_t *rank,
                                     int64_t step);

/* Sum of a counter's six categories. */
double trace_counter_total(const trace_counter_t *counter);

/* The memory counter of the rank with the largest total in effect during [ws, we) (the
 * last one at or before each moment), and in *at the moment it is reached there: ws for
 * the counter already in effect when the window opens, else its own ts. Of counters at
 * one ts only the last is ever in effect. NULL when no counter is in effect then. */
const trace_counter_t *trace_memory_peak(const trace_model_t *model, const trace_rank_t *rank,
                                         double ws, double we, double *at);

/* bytes as "512 B", "1.5 KiB", "20.00 MiB" or "1.25 GiB" into buf. Returns buf. */
const char *trace_format_bytes(double bytes, char *buf, size_t len);

/* The label of a track: its name, or "tid N" written into buf. */
const char *trace_track_label(const trace_track_t *track, char *buf, size_t len);

/* The length of the valid UTF-8 sequence at s (1 to 4), 0 when it is not one. */
size_t trace_utf8_length(const char *s);

/* s without control characters or invalid UTF-8, cut to at most max bytes with "...",
 * for one-line messages. Returns buf. */
const char *trace_printable(const char *s, char *buf, size_t len, size_t max);

/* ---- what fsdp2-trace makes of a model (trace_summary.c, trace_svg.c) ------------- */

/* --rank R and --step N; without them every rank and, for svg, the default step. */
typedef struct trace_filter {
    int has_rank, has_step;
    int64_t rank, step;
} trace_filter_t;

/* The ranks the filter selects, by pid, into out (room for model->n_ranks); how many, or
 * -1 with a message naming --rank's value when the trace has no such rank. */
int trace_select_ranks(const trace_model_t *model, const trace_filter_t *filter,
                       const trace_rank_t **out, char *error, size_t error_len);

/* The summary per rank and per step (fsdp2_trace.c's usage says what is in it), as text
 * or as one JSON object, to out. 0, or -1 with a message in error (a rank or step that
 * is not in the trace, a trace without steps). */
int trace_summary_write(const trace_model_t *model, const trace_filter_t *filter, int json,
                        FILE *out, char *error, size_t error_len);

/* One step's timeline as a standalone SVG document to out; title names the trace. 0, or
 * -1 with a message in error, before anything is written. */
int trace_svg_write(const trace_model_t *model, const trace_filter_t *filter,
                    const char *title, FILE *out, char *error, size_t error_len);

/* Formats the message into error (len bytes) and returns -1, for `return trace_fail(...)`. */
int trace_fail(char *error, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
