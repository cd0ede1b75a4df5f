/* The trace recorder: fixed records in one buffer, tracks, steps, ranges, memory
 * counters and flow arrows (see trace_internal.h). Writing them out is trace_write.c.
 *
 * A record is reserved with one atomic increment and published by storing its kind
 * last; its times are atomics because the host functions that stamp them run on stream
 * threads. Each start of recording is a new generation: records, streams, events and
 * the host functions still queued from an earlier generation are recognised by it and
 * ignored; tokens carry their generation too. After a stop, markers change nothing.
 * (A marker that passed its check just as a new trace started could still stamp a
 * record of it: markers of a trace that was stopped without synchronizing its streams
 * are the documented misuse.) The buffer is allocated on the first start, with the
 * capacity of that start, and kept until exit (markers may still point into it). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/device_ops.h"
#include "core/error.h"
#include "core/trace_rec.h"

atomic_int fsdp2_trace_on_;

trace_state_t fsdp2_trace_;

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_llong mem_static[TRACE_MEM_COUNT];
static _Thread_local const char *tls_label;
static _Thread_local int tls_label_dtype = -1;
static _Thread_local trace_token_t tls_ranges[TRACE_RANGE_DEPTH];
static _Thread_local int tls_range_depth;
static _Thread_local unsigned tls_range_gen;

_Static_assert(sizeof(void *) >= 8, "markers pack a generation and an index into a pointer");

static const char *const cat_names[TRACE_CAT_COUNT] = {
    "step",      "forward",        "backward",   "optimizer", "user",     "copy_in",
    "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier",  "copy_out",
    "accumulate", "memory",   "wait",
};

const char *fsdp2_trace_cat_name(int cat)
{
    return cat >= 0 && cat < TRACE_CAT_COUNT ? cat_names[cat] : "unknown";
}

static unsigned current_gen(void)
{
    return atomic_load_explicit(&fsdp2_trace_.gen, memory_order_acquire);
}

/* Reserves a record of this generation; -1 (counted) when the buffer is full. */
static int rec_reserve(void)
{
    size_t i = atomic_fetch_add_explicit(&fsdp2_trace_.next, 1, memory_order_relaxed);
    if (i >= fsdp2_trace_.capacity) {
        atomic_fetch_add_explicit(&fsdp2_trace_.dropped, 1, memory_order_relaxed);
        return -1;
    }
    trace_rec_t *r = &fsdp2_trace_.recs[i];
    atomic_store_explicit(&r->kind, TREC_NONE, memory_order_relaxed);
    atomic_store_explicit(&r->gen, current_gen(), memory_order_relaxed);
    atomic_store_explicit(&r->t0, 0, memory_order_relaxed);
    atomic_store_explicit(&r->t1, 0, memory_order_relaxed);
    return (int)i;
}

static void rec_publish(int i, trace_rec_kind_t kind)
{
    atomic_store_explicit(&fsdp2_trace_.recs[i].kind, kind, memory_order_release);
}

/* The record index i of generation gen, if that is still the current generation. */
static trace_rec_t *rec_live(int i, unsigned gen)
{
    if (i < 0 || (size_t)i >= fsdp2_trace_.capacity || gen != current_gen())
        return NULL;
    trace_rec_t *r = &fsdp2_trace_.recs[i];
    return atomic_load_explicit(&r->gen, memory_order_relaxed) == gen ? r : NULL;
}

/* A token names a record and its generation, so one kept across a stop and a start
 * never touches the record now at that index. */
static trace_token_t token_of(int i, unsigned gen)
{
    return i < 0 ? TRACE_NO_TOKEN : (trace_token_t)(((uint64_t)gen << 32) | (uint32_t)i);
}

static trace_rec_t *token_rec(trace_token_t token)
{
    if (token < 0)
        return NULL;
    return rec_live((int)(uint32_t)token, (unsigned)((uint64_t)token >> 32));
}

/* Truncates like snprintf, but never inside a UTF-8 sequence (the file must stay valid
 * JSON text). */
static void copy_text(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--; /* src[n] would start the part cut off: cut before its lead byte */
    }
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}


/* A track by name (caller holds trace_lock): an existing one of that name, unless
 * `unique` asks for a new one (then "name #2", "name #3"...), numbered from `first`
 * within its kind's span. -1 when the kind has no tid left (the record is dropped rather
 * than put on another track, where it could overlap). Names compare as stored
 * (truncated), so a long name finds its track again. */
static int track_named_locked(const char *name, int first, int unique)
{
    trace_state_t *t = &fsdp2_trace_;
    char base[sizeof(t->tracks[0].base)];
    copy_text(base, sizeof(base), name);
    int copies = 0, tid = first;
    for (int k = 0; k < t->num_tracks; k++) {
        if (t->tracks[k].tid >= first && t->tracks[k].tid < first + TRACE_TRACK_SPAN &&
            t->tracks[k].tid >= tid)
            tid = t->tracks[k].tid + 1;
        if (strcmp(t->tracks[k].base, base) == 0) {
            if (!unique)
                return t->tracks[k].tid;
            copies++;
        }
    }
    if (t->num_tracks == TRACE_MAX_TRACKS || tid >= first + TRACE_TRACK_SPAN)
        return -1;
    trace_track_t *tr = &t->tracks[t->num_tracks++];
    tr->tid = tid;
    memcpy(tr->base, base, sizeof(base));
    if (copies)
        snprintf(tr->name, sizeof(tr->name), "%.80s #%d", base, copies + 1);
    else
        copy_text(tr->name, sizeof(tr->name), base);
    return tid;
}

static int track_named(const char *name, int first, int unique)
{
    pthread_mutex_lock(&trace_lock);
    int tid = track_named_locked(name, first, unique);
    pthread_mutex_unlock(&trace_lock);
    return tid;
}

/* The stream's track in this generation, registered on first use: the first current
 * stream is "compute", other streams are named after themselves. */
static int stream_track(fsdp2_stream_t *s, unsigned gen)
{
    if (atomic_load_explicit(&s->trace_gen, memory_order_acquire) == gen)
        return s->trace_track;
    pthread_mutex_lock(&trace_lock);
    if (s->trace_gen != gen) {
        int tid;
        if (s->is_current && !fsdp2_trace_.compute_claimed) {
            fsdp2_trace_.compute_claimed = 1;
            tid = TRACE_TRACK_COMPUTE;
        } else {
            tid = track_named_locked(s->is_current ? "compute" : (s->name[0] ? s->name : "stream"),
                                     TRACE_TRACK_STREAMS, 1);
        }
        s->trace_track = tid;
        atomic_store_explicit(&s->trace_last, -1, memory_order_relaxed);
        atomic_store_explicit(&s->trace_gen, gen, memory_order_release);
    }
    pthread_mutex_unlock(&trace_lock);
    return s->trace_track;
}

/* Bytes in use changed: a counter record with all categories at this moment. */
static void mem_change(trace_mem_t mem, int64_t delta)
{
    pthread_mutex_lock(&trace_lock);
    if (mem < TRACE_MEM_COUNT)
        fsdp2_trace_.mem_now[mem] += delta;
    int i = rec_reserve();
    if (i >= 0) {
        trace_rec_t *r = &fsdp2_trace_.recs[i];
        for (int k = 0; k < TRACE_MEM_COUNT; k++)
            r->u.values[k] = atomic_load(&mem_static[k]) + fsdp2_trace_.mem_now[k];
        atomic_store_explicit(&r->t0, fsdp2_now_ns(), memory_order_relaxed);
        rec_publish(i, TREC_COUNTER);
    }
    pthread_mutex_unlock(&trace_lock);
}

void fsdp2_trace_mem_static(trace_mem_t mem, int64_t delta)
{
    if (mem >= TRACE_MEM_COUNT || delta == 0)
        return;
    atomic_fetch_add(&mem_static[mem], delta);
    if (fsdp2_tracing())
        mem_change(TRACE_MEM_COUNT, 0);
}

/* A slice record with op's description, not yet published. */
static int slice_reserve(const trace_op_t *op, int track)
{
    if (track < 0) { /* out of tracks */
        atomic_fetch_add_explicit(&fsdp2_trace_.dropped, 1, memory_order_relaxed);
        return -1;
    }
    int i = rec_reserve();
    if (i < 0)
        return -1;
    trace_rec_t *r = &fsdp2_trace_.recs[i];
    r->cat = op->cat;
    r->track = track;
    r->step = atomic_load_explicit(&fsdp2_trace_.step, memory_order_relaxed);
    r->bytes = op->bytes;
    r->dtype = op->dtype >= 0 || op->module ? op->dtype : tls_label_dtype;
    r->seq = op->seq;
    r->mem = op->cat == TRACE_MEMORY ? op->mem : TRACE_MEM_COUNT;
    r->host_timed = 0;
    copy_text(r->u.s.name, sizeof(r->u.s.name), op->name ? op->name : cat_names[op->cat]);
    copy_text(r->u.s.module, sizeof(r->u.s.module), op->module ? op->module : tls_label);
    r->has_module = op->module || tls_label;
    copy_text(r->u.s.group, sizeof(r->u.s.group), op->group);
    return i;
}

static void *marker_arg(trace_token_t token)
{
    return (void *)(uintptr_t)token;
}

/* A marker's record, while its trace is still recording (after the stop, a marker
 * changes nothing: not the record, not the counters). */
static trace_rec_t *marker_rec(void *arg)
{
    return fsdp2_tracing() ? token_rec((trace_token_t)(uintptr_t)arg) : NULL;
}

static fsdp2_status_t mark_begin(void *arg)
{
    trace_rec_t *r = marker_rec(arg);
    if (r) {
        atomic_store_explicit(&r->t0, fsdp2_now_ns(), memory_order_release);
        if (r->mem < TRACE_MEM_COUNT)
            mem_change((trace_mem_t)r->mem, (int64_t)r->bytes);
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t mark_end(void *arg)
{
    trace_rec_t *r = marker_rec(arg);
    if (r) {
        if (r->mem < TRACE_MEM_COUNT)
            mem_change((trace_mem_t)r->mem, -(int64_t)r->bytes);
        atomic_store_explicit(&r->t1, fsdp2_now_ns(), memory_order_release);
    }
    return FSDP2_SUCCESS;
}

static trace_token_t stream_slice(fsdp2_stream_t *stream, int track, const trace_op_t *op,
                                  int last)
{
    unsigned gen = current_gen();
    int i = slice_reserve(op, track);
    if (i < 0)
        return TRACE_NO_TOKEN;
    rec_publish(i, TREC_SLICE);
    if (last)
        atomic_store_explicit(&stream->trace_last, i, memory_order_relaxed);
    /* A marker that cannot be enqueued leaves the slice unfinished (left out). */
    fsdp2_stream_launch_host(stream, mark_begin, marker_arg(token_of(i, gen)));
    return token_of(i, gen);
}

trace_token_t fsdp2_trace_stream_begin(fsdp2_stream_t *stream, const trace_op_t *op)
{
    if (!fsdp2_tracing() || !stream)
        return TRACE_NO_TOKEN;
    return stream_slice(stream, stream_track(stream, current_gen()), op, 1);
}

trace_token_t fsdp2_trace_stream_hold(fsdp2_stream_t *stream, const char *track,
                                      const trace_op_t *op)
{
    if (!fsdp2_tracing() || !stream)
        return TRACE_NO_TOKEN;
    return stream_slice(stream, track_named(track, TRACE_TRACK_BUFFERS, 0), op, 0);
}

void fsdp2_trace_stream_end(fsdp2_stream_t *stream, trace_token_t token)
{
    if (token < 0 || !stream)
        return;
    if (token_rec(token))
        fsdp2_stream_launch_host(stream, mark_end, marker_arg(token));
}

trace_token_t fsdp2_trace_host_begin(int virtual_track, const char *track_name,
                                     const trace_op_t *op)
{
    if (!fsdp2_tracing())
        return TRACE_NO_TOKEN;
    int track = track_name ? track_named(track_name, TRACE_TRACK_BUFFERS, 0) : virtual_track;
    unsigned gen = current_gen();
    int i = slice_reserve(op, track);
    if (i < 0)
        return TRACE_NO_TOKEN;
    trace_rec_t *r = &fsdp2_trace_.recs[i];
    r->host_timed = 1;
    atomic_store_explicit(&r->t0, fsdp2_now_ns(), memory_order_release);
    rec_publish(i, TREC_SLICE);
    if (r->mem < TRACE_MEM_COUNT)
        mem_change((trace_mem_t)r->mem, (int64_t)r->bytes);
    return token_of(i, gen);
}

void fsdp2_trace_host_end(trace_token_t token)
{
    if (token < 0)
        return;
    trace_rec_t *r = token_rec(token);
    if (!r || atomic_load_explicit(&r->t1, memory_order_relaxed))
        return;
    if (r->mem < TRACE_MEM_COUNT)
        mem_change((trace_mem_t)r->mem, -(int64_t)r->bytes);
    atomic_store_explicit(&r->t1, fsdp2_now_ns(), memory_order_release);
}

trace_token_t fsdp2_trace_wait_begin(fsdp2_stream_t *stream, fsdp2_event_t *event)
{
    if (!stream->is_current || fsdp2_event_query(event) == FSDP2_SUCCESS)
        return TRACE_NO_TOKEN; /* a side stream's wait blocks nobody; a complete one, nothing */
    trace_op_t op = TRACE_OP_INIT(TRACE_WAIT);
    op.module = "";
    trace_token_t token = fsdp2_trace_host_begin(stream_track(stream, current_gen()), NULL, &op);
    trace_rec_t *r = token_rec(token);
    if (r)
        r->has_module = 0;
    return token;
}

void fsdp2_trace_event_recorded(fsdp2_event_t *event, fsdp2_stream_t *stream)
{
    unsigned gen = current_gen();
    int track = stream_track(stream, gen);
    int last = atomic_load_explicit(&stream->trace_last, memory_order_relaxed);
    int src = -1;
    if (last >= 0 && track >= 0 && (src = rec_reserve()) >= 0) {
        trace_rec_t *r = &fsdp2_trace_.recs[src];
        r->track = track;
        r->link = last;
        rec_publish(src, TREC_FLOW_SRC);
    }
    event->trace_src = src;
    event->trace_gen = gen;
}

static fsdp2_status_t mark_flow(void *arg)
{
    trace_rec_t *r = marker_rec(arg);
    if (r)
        atomic_store_explicit(&r->t0, fsdp2_now_ns(), memory_order_release);
    return FSDP2_SUCCESS;
}

void fsdp2_trace_event_waited(fsdp2_stream_t *stream, fsdp2_event_t *event)
{
    unsigned gen = current_gen();
    if (event->trace_gen != gen || event->trace_src < 0)
        return;
    int track = stream_track(stream, gen);
    int i = track < 0 ? -1 : rec_reserve();
    if (i < 0)
        return;
    trace_rec_t *r = &fsdp2_trace_.recs[i];
    r->track = track;
    r->link = event->trace_src;
    rec_publish(i, TREC_FLOW_DST);
    fsdp2_stream_launch_host(stream, mark_flow, marker_arg(token_of(i, gen)));
}

void fsdp2_trace_label_set(const char *module, int dtype)
{
    tls_label = module;
    tls_label_dtype = module ? dtype : -1;
}

/* Ends the open step slice and opens `step` (caller holds trace_lock). */
static void step_locked(int64_t step)
{
    trace_state_t *t = &fsdp2_trace_;
    int64_t now = fsdp2_now_ns();
    trace_rec_t *open = token_rec(t->step_token);
    if (open)
        atomic_store_explicit(&open->t1, now, memory_order_release);
    atomic_store_explicit(&t->step, step, memory_order_relaxed);
    char name[40];
    snprintf(name, sizeof(name), "step %lld", (long long)step);
    trace_op_t op = TRACE_OP_INIT(TRACE_STEP);
    op.name = name;
    op.module = "";
    unsigned gen = current_gen();
    int i = slice_reserve(&op, TRACE_TRACK_STEPS);
    if (i >= 0) {
        fsdp2_trace_.recs[i].host_timed = 1;
        fsdp2_trace_.recs[i].has_module = 0;
        atomic_store_explicit(&fsdp2_trace_.recs[i].t0, now, memory_order_release);
        rec_publish(i, TREC_SLICE);
    }
    t->step_token = token_of(i, gen);
}

fsdp2_status_t fsdp2_trace_step(int64_t step)
{
    FSDP2_ARG_CHECK(step >= 0, "trace step %lld is negative", (long long)step);
    if (!fsdp2_tracing())
        return FSDP2_SUCCESS;
    pthread_mutex_lock(&trace_lock);
    fsdp2_trace_.user_steps = 1;
    step_locked(step);
    pthread_mutex_unlock(&trace_lock);
    return FSDP2_SUCCESS;
}

void fsdp2_trace_step_auto(void)
{
    if (!fsdp2_tracing())
        return;
    pthread_mutex_lock(&trace_lock);
    if (!fsdp2_trace_.user_steps)
        step_locked(fsdp2_trace_.auto_step++);
    pthread_mutex_unlock(&trace_lock);
}

fsdp2_status_t fsdp2_trace_range_push(const char *name)
{
    FSDP2_ARG_CHECK(name, "trace range name is NULL");
    if (!fsdp2_tracing())
        return FSDP2_SUCCESS;
    unsigned gen = current_gen();
    if (tls_range_gen != gen) {
        tls_range_gen = gen;
        tls_range_depth = 0;
    }
    FSDP2_ARG_CHECK(tls_range_depth < TRACE_RANGE_DEPTH,
                    "trace range '%s': ranges nest at most %d deep", name, TRACE_RANGE_DEPTH);
    fsdp2_stream_t *current = NULL;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    FSDP2_CHECK(fsdp2_stream_current(cpu, &current));
    trace_op_t op = TRACE_OP_INIT(TRACE_USER);
    op.name = name;
    tls_ranges[tls_range_depth++] =
        fsdp2_trace_host_begin(stream_track(current, gen), NULL, &op);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_trace_range_pop(void)
{
    if (!fsdp2_tracing())
        return FSDP2_SUCCESS;
    if (tls_range_gen != current_gen() || tls_range_depth == 0)
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "trace range pop without a push");
    fsdp2_trace_host_end(tls_ranges[--tls_range_depth]);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_trace_active(int *on)
{
    FSDP2_ARG_CHECK(on, "on is NULL");
    *on = fsdp2_tracing();
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_trace_recorder_start(size_t capacity)
{
    trace_state_t *t = &fsdp2_trace_;
    pthread_mutex_lock(&trace_lock);
    if (fsdp2_tracing()) {
        pthread_mutex_unlock(&trace_lock);
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "tracing is already on");
    }
    if (!t->recs) {
        t->recs = calloc(capacity, sizeof(*t->recs));
        if (!t->recs) {
            pthread_mutex_unlock(&trace_lock);
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "trace buffer of %zu records (%zu bytes)",
                               capacity, capacity * sizeof(*t->recs));
        }
        t->capacity = capacity; /* fixed for the process: markers may point into it */
    }
    atomic_fetch_add_explicit(&t->gen, 1, memory_order_acq_rel);
    atomic_store(&t->next, 0);
    atomic_store(&t->dropped, 0);
    t->num_tracks = 0;
    t->compute_claimed = 0;
    t->user_steps = 0;
    t->auto_step = 0;
    t->step_token = TRACE_NO_TOKEN;
    atomic_store(&t->step, -1);
    memset(t->mem_now, 0, sizeof(t->mem_now));
    t->start_ns = fsdp2_now_ns();
    atomic_store_explicit(&fsdp2_trace_on_, 1, memory_order_release);
    pthread_mutex_unlock(&trace_lock);
    mem_change(TRACE_MEM_COUNT, 0); /* the first counter: what is allocated already */
    return FSDP2_SUCCESS;
}

void fsdp2_trace_recorder_stop(void)
{
    trace_state_t *t = &fsdp2_trace_;
    pthread_mutex_lock(&trace_lock);
    atomic_store_explicit(&fsdp2_trace_on_, 0, memory_order_release);
    t->stop_ns = fsdp2_now_ns();
    /* Host-timed slices still open (the step, buffers held across the stop) end here;
     * a slice timed on a stream that has not reached its end stays unfinished. */
    size_t n = atomic_load(&t->next);
    if (n > t->capacity)
        n = t->capacity;
    for (size_t i = 0; i < n; i++) {
        trace_rec_t *r = &t->recs[i];
        if (atomic_load_explicit(&r->kind, memory_order_acquire) == TREC_SLICE &&
            atomic_load_explicit(&r->gen, memory_order_relaxed) == current_gen() && r->host_timed &&
            atomic_load(&r->t0) && !atomic_load(&r->t1))
            atomic_store(&r->t1, t->stop_ns);
    }
    pthread_mutex_unlock(&trace_lock);
}
