/* The trace recorder's records and state, shared by trace.c (recording) and
 * trace_write.c (writing a rank's file). */
#ifndef FSDP2_CORE_TRACE_REC_H
#define FSDP2_CORE_TRACE_REC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/trace_internal.h"

#define TRACE_MAX_TRACKS 256
#define TRACE_TRACK_STREAMS 10  /* side streams' tids start here */
#define TRACE_TRACK_BUFFERS 100 /* planned buffers' tids start here */
#define TRACE_TRACK_SPAN 90     /* tids per kind */
#define TRACE_RANGE_DEPTH 32

typedef enum trace_rec_kind {
    TREC_NONE,
    TREC_SLICE,
    TREC_FLOW_SRC, /* link: the slice the arrow starts in */
    TREC_FLOW_DST, /* link: its FLOW_SRC; t0: when the wait was released */
    TREC_COUNTER,  /* t0: when; u.values: bytes per category */
} trace_rec_kind_t;

typedef struct trace_rec {
    atomic_int kind; /* stored last: TREC_NONE while being filled */
    atomic_uint gen;
    int cat, track, link, mem;
    int host_timed; /* timed on the calling thread (closed at stop if still open) */
    int has_module;
    atomic_llong t0, t1; /* ns, CLOCK_MONOTONIC; 0: not yet */
    int64_t step;
    uint64_t bytes;
    int64_t seq;
    int dtype;
    union {
        struct {
            char name[40];
            char module[96];
            char group[32];
        } s;
        int64_t values[TRACE_MEM_COUNT];
    } u;
} trace_rec_t;

typedef struct trace_track {
    int tid;
    char base[96];  /* the name asked for (truncated) */
    char name[104]; /* as shown: base, or "base #2" for a second stream of that name */
} trace_track_t;

typedef struct trace_state {
    trace_rec_t *recs;
    size_t capacity;
    atomic_size_t next;
    atomic_size_t dropped;
    atomic_uint gen;
    trace_track_t tracks[TRACE_MAX_TRACKS];
    int num_tracks;
    int compute_claimed;
    atomic_llong step; /* the step operations are issued in (-1 before the first) */
    int user_steps;    /* fsdp2_trace_step was called: no automatic steps */
    int64_t auto_step;
    trace_token_t step_token;
    int64_t mem_now[TRACE_MEM_COUNT]; /* held by slices of this trace */
    int64_t start_ns, stop_ns;
} trace_state_t;

extern trace_state_t fsdp2_trace_;

const char *fsdp2_trace_cat_name(int cat);

#endif
