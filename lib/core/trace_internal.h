/* The trace recorder (lib/core/trace.c) as the other layers use it.
 *
 * Every layer records into one buffer of fixed records, reserved with an atomic counter.
 * A slice on a stream is timed by two host functions enqueued around the work (so it is
 * the stream's time, not the caller's); slices on virtual tracks (steps, optimizer,
 * buffer holds) are timed on the calling thread. Callers test fsdp2_tracing() first:
 * off, that load is all a traced operation costs. */
#ifndef FSDP2_CORE_TRACE_INTERNAL_H
#define FSDP2_CORE_TRACE_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include <fsdp2/dtype.h>
#include <fsdp2/status.h>
#include <fsdp2/stream.h>
#include <fsdp2/trace.h>

extern atomic_int fsdp2_trace_on_;

static inline int fsdp2_tracing(void)
{
    return atomic_load_explicit(&fsdp2_trace_on_, memory_order_relaxed);
}

typedef enum trace_cat {
    TRACE_STEP,
    TRACE_FORWARD,
    TRACE_BACKWARD,
    TRACE_OPTIMIZER,
    TRACE_USER,
    TRACE_COPY_IN,
    TRACE_ALL_GATHER,
    TRACE_REDUCE_SCATTER,
    TRACE_ALL_REDUCE,
    TRACE_BROADCAST,
    TRACE_BARRIER,
    TRACE_COPY_OUT,
    TRACE_ACCUMULATE,
    TRACE_MEMORY,
    TRACE_WAIT, /* a thread blocked on its current stream's wait for an event */
    TRACE_CAT_COUNT
} trace_cat_t;

/* Bytes in use per category: the memory counters of a trace. */
typedef enum trace_mem {
    TRACE_MEM_SHARDED_PARAMS,
    TRACE_MEM_SHARDED_GRADS,
    TRACE_MEM_UNSHARDED_PARAMS,
    TRACE_MEM_UNSHARDED_GRADS,
    TRACE_MEM_REDUCE_SCATTER,
    TRACE_MEM_OPTIMIZER_STATE,
    TRACE_MEM_POST_FORWARD, /* reshard_after_forward = N: the post-forward shards */
    TRACE_MEM_COUNT
} trace_mem_t;

/* The fixed virtual tracks. */
typedef enum trace_virtual {
    TRACE_TRACK_STEPS = 1,
    TRACE_TRACK_COMPUTE = 2,
    TRACE_TRACK_OPTIMIZER = 3,
} trace_virtual_t;

/* What a slice says about itself; strings are copied (truncated to fit). */
typedef struct trace_op {
    trace_cat_t cat;
    const char *name;   /* defaults to the category's name */
    const char *module; /* FQN; NULL: the thread's label (fsdp2_trace_label_set) */
    uint64_t bytes;     /* 0: none */
    int dtype;          /* an fsdp2_dtype_t, or -1 */
    const char *group;  /* NULL: none */
    int64_t seq;        /* -1: none */
    trace_mem_t mem;    /* TRACE_MEMORY only: the category the bytes count in */
} trace_op_t;

#define TRACE_OP_INIT(c) {(c), NULL, NULL, 0, -1, NULL, -1, TRACE_MEM_COUNT}

/* Names a record of one trace: (generation << 32) | index; TRACE_NO_TOKEN for none.
 * Ending a token of an earlier trace does nothing. */
typedef int64_t trace_token_t;
#define TRACE_NO_TOKEN ((trace_token_t)-1)

/* A slice on stream's track around the work enqueued between begin and end. begin
 * returns a token for end (none when not recording or out of records; end ignores it). */
trace_token_t fsdp2_trace_stream_begin(fsdp2_stream_t *stream, const trace_op_t *op);
void fsdp2_trace_stream_end(fsdp2_stream_t *stream, trace_token_t token);

/* The same on a named buffer track (a memory hold timed in stream order): the bytes
 * count in op->mem from when the stream reaches begin until it reaches end. */
trace_token_t fsdp2_trace_stream_hold(fsdp2_stream_t *stream, const char *track,
                                      const trace_op_t *op);

/* A slice timed on the calling thread, on a virtual track or a named buffer track
 * (track_name != NULL). A TRACE_MEMORY op counts its bytes from begin to end. */
trace_token_t fsdp2_trace_host_begin(int virtual_track, const char *track_name,
                                     const trace_op_t *op);
void fsdp2_trace_host_end(trace_token_t token);

/* A wait of the current stream (the calling thread blocks) that has not completed yet:
 * a `wait` slice on its track around the blocking; -1 when not traced. */
trace_token_t fsdp2_trace_wait_begin(fsdp2_stream_t *stream, fsdp2_event_t *event);

/* Flow arrows: called by fsdp2_event_record and fsdp2_stream_wait_event. */
void fsdp2_trace_event_recorded(fsdp2_event_t *event, fsdp2_stream_t *stream);
void fsdp2_trace_event_waited(fsdp2_stream_t *stream, fsdp2_event_t *event);

/* The module that collectives enqueued by this thread are for (NULL: none), and the
 * dtype of their bytes when the operation itself has none (all_gather_pieces; -1: none).
 * The pointer is kept, not copied: clear it before the string goes away. */
void fsdp2_trace_label_set(const char *module, int dtype);

/* An FSDP root's forward begins: the next step, unless the application numbers steps. */
void fsdp2_trace_step_auto(void);

/* Long-lived allocations (sharded parameters and gradients, optimizer state), counted
 * always, so a trace started later still sees them. */
void fsdp2_trace_mem_static(trace_mem_t mem, int64_t delta);

/* Recording on this process: the session side (lib/collectives/trace_session.c). */
fsdp2_status_t fsdp2_trace_recorder_start(size_t capacity);
/* Ends recording; open steps end now. */
void fsdp2_trace_recorder_stop(void);
/* Writes what was recorded as one rank's trace file (written beside and renamed). */
fsdp2_status_t fsdp2_trace_write_part(const char *path, int rank, int world_size);

#endif
