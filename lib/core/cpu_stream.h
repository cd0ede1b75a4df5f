/* The cpu device backend's streams and events, shared by its four parts:
 * - cpu_stream.c: the queue and its worker thread (create, enqueue, run, destroy);
 * - cpu_wait.c: the waiting policy (how a worker waits for work, how a thread waits for
 *   a stream to reach a position, and when a waiter runs queued tasks itself);
 * - cpu_event.c: events, and the operations that wait (synchronize, query, wait_event);
 * - cpu_device.c: allocation and the backend's table of operations.
 *
 * A side stream is a worker thread draining a fixed ring of tasks (no allocation per
 * task). Each stream counts tasks submitted and completed; recording an event stores
 * (stream, submitted count at that moment), and the event is complete once the
 * stream's completed count reaches it. Because a record names its own stream and
 * position, re-recording an event on another stream never releases a waiter early, and
 * records need no per-record allocation. Events hold a reference on the stream they
 * point at, so a stream destroyed while an event still names it stays readable.
 *
 * The calling thread's "current stream" has no thread and no ring: its work runs inline
 * and a wait on it blocks the caller. It is created on first use per thread and dropped
 * at thread exit. */
#ifndef FSDP2_CORE_CPU_STREAM_H
#define FSDP2_CORE_CPU_STREAM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/device_ops.h"

typedef enum cpu_task_kind {
    TASK_HOST,
    TASK_WAIT,
    TASK_MEMCPY,
    TASK_FILL,
    TASK_ACCUMULATE,
    TASK_CHUNK_COPY,
} cpu_task_kind_t;

typedef struct cpu_stream cpu_stream_t;

typedef struct cpu_task {
    cpu_task_kind_t kind;
    union {
        struct {
            fsdp2_host_fn fn;
            void *arg;
        } host;
        struct {
            cpu_stream_t *stream; /* holds a reference until the task has run */
            uint64_t target;
        } wait;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
        } memcpy;
        struct {
            void *dst;
            fsdp2_dtype_t dtype;
            size_t n;
            double value;
        } fill;
        struct {
            void *y;
            fsdp2_dtype_t y_dtype;
            const void *x;
            fsdp2_dtype_t x_dtype;
            size_t n;
            double alpha;
        } accumulate;
        fsdp2_chunk_copy_t chunk_copy;
    } u;
} cpu_task_t;

struct cpu_stream {
    struct fsdp2_stream base;
    atomic_int refs;
    pthread_mutex_t lock;
    pthread_cond_t not_empty; /* the worker sleeps here for tasks */
    pthread_cond_t not_full;  /* producers wait for room */
    pthread_cond_t progress;  /* waiters on `completed` (monotonic clock) */
    uint64_t submitted;       /* tasks enqueued so far */
    uint64_t completed;       /* tasks run so far */
    cpu_task_t *ring;
    size_t capacity, head, count;
    int stopping;
    int running;       /* a task is being run (by the worker or a helping waiter) */
    int64_t queued_ns; /* when the queue last went from empty to not empty */
    int blocked;       /* threads waiting on s that cannot run its tasks themselves */
    int helped_run;    /* tasks in a row run by waiters rather than the worker */
    int napping;       /* the worker naps: an enqueue may leave its wake-up owed */
    /* The waiting policy's settings, read from the env table when the stream is made
     * (fsdp2_cpu_wait_settings): FSDP2_CPU_STREAM_SPIN, _CLAIM_US, _NAP_US, _DEFER_WAKE,
     * _BLOCKING. */
    int spins;
    int64_t claim_ns, nap_ns;
    int defer_wake; /* 0 auto, 1 on, 2 off */
    int blocking;   /* each enqueue waits until its task has run */
    int has_thread;
    pthread_t thread;
    fsdp2_status_t error; /* first failure of a host function */
    int error_reported;   /* synchronize or query returned it */
    char error_message[512];
    uint64_t error_position; /* the task that failed first (its count of submitted tasks) */
    /* The last task that failed, for a blocking enqueue to return its own failure. */
    uint64_t failed_position;
    fsdp2_status_t failed_status;
    char failed_message[512];
    char name[32];
};

typedef struct cpu_event {
    struct fsdp2_event base;
    pthread_mutex_t lock;
    cpu_stream_t *stream; /* NULL: complete */
    uint64_t target;
} cpu_event_t;

static inline cpu_stream_t *cpu_stream_of(fsdp2_stream_t *s) { return (cpu_stream_t *)s; }

/* Set on stream worker threads: they never run another stream's tasks. */
extern _Thread_local int fsdp2_cpu_tls_is_worker;
/* The stream whose task this thread runs as a helping waiter (cpu_wait.c), or NULL. */
extern _Thread_local cpu_stream_t *fsdp2_cpu_tls_helping;

/* cpu_stream.c */
void fsdp2_cpu_stream_retain(cpu_stream_t *s);
void fsdp2_cpu_stream_release(cpu_stream_t *s); /* NULL ignored */
/* Runs the head task on the calling thread. Caller holds s->lock, s->count > 0 and
 * nobody else runs a task of s; returns with the lock held. */
void fsdp2_cpu_run_head_locked(cpu_stream_t *s);
/* Runs t inline on the current stream, or queues it on a side stream. */
fsdp2_status_t fsdp2_cpu_stream_submit(cpu_stream_t *s, const cpu_task_t *t);
/* FSDP2_ERR_INVALID_STATE when called from a host function running on s. */
fsdp2_status_t fsdp2_cpu_check_not_own_worker(cpu_stream_t *s, const char *what);
/* The stream's first error as this thread's error; `reporting` marks it seen. */
fsdp2_status_t fsdp2_cpu_stream_report(cpu_stream_t *s, int reporting);

/* cpu_wait.c */
/* The worker's wait: returns (lock held) once a task is queued that nobody runs and the
 * worker should take, or once s is stopping with nothing left. */
void fsdp2_cpu_worker_wait_locked(cpu_stream_t *s);
/* Blocks until s->completed >= target, or the timeout (ms, < 0 forever) passes; an
 * untimed wait from an application thread runs s's queued tasks itself. */
fsdp2_status_t fsdp2_cpu_wait_position(cpu_stream_t *s, uint64_t target, long timeout_ms);
/* Fills s's waiting settings from the env table. */
void fsdp2_cpu_wait_settings(cpu_stream_t *s);
/* Counts who runs s's head task (caller holds s->lock): the worker, or a waiter. */
void fsdp2_cpu_note_runner(cpu_stream_t *s);
/* Whether an enqueue on s (lock held) may leave the worker's wake-up owed by this
 * thread (deferred wake-ups); records it if so. */
int fsdp2_cpu_owe_wake(cpu_stream_t *s);
/* Pays every wake-up this thread owes except keep's (a stream it is about to wait for
 * and help: what is left queued after the wait is paid by the flush that follows it).
 * Every enqueue, wait, query, record and destroy calls it. */
void fsdp2_cpu_flush_owed(const cpu_stream_t *keep);
#include "core/cpu_wait.h"

/* The backend's operations, gathered into fsdp2_cpu_ops by cpu_device.c. */
fsdp2_status_t fsdp2_cpu_stream_create(int index, const char *name, fsdp2_stream_t **out);
fsdp2_status_t fsdp2_cpu_stream_destroy(fsdp2_stream_t *stream);
fsdp2_status_t fsdp2_cpu_stream_current(int index, fsdp2_stream_t **out);
fsdp2_status_t fsdp2_cpu_stream_launch_host(fsdp2_stream_t *stream, fsdp2_host_fn fn, void *arg);
fsdp2_status_t fsdp2_cpu_memcpy_async(void *dst, const void *src, size_t bytes,
                                      fsdp2_stream_t *stream);
fsdp2_status_t fsdp2_cpu_fill_async(void *dst, fsdp2_dtype_t dtype, size_t n, double value,
                                    fsdp2_stream_t *stream);
fsdp2_status_t fsdp2_cpu_accumulate_async(void *y, fsdp2_dtype_t y_dtype, const void *x,
                                          fsdp2_dtype_t x_dtype, size_t n, double alpha,
                                          fsdp2_stream_t *stream);
fsdp2_status_t fsdp2_cpu_chunk_copy_async(const fsdp2_chunk_copy_t *copy, fsdp2_stream_t *stream);
fsdp2_status_t fsdp2_cpu_stream_synchronize(fsdp2_stream_t *stream);
fsdp2_status_t fsdp2_cpu_stream_query(fsdp2_stream_t *stream);
fsdp2_status_t fsdp2_cpu_stream_wait_event(fsdp2_stream_t *stream, fsdp2_event_t *event);
fsdp2_status_t fsdp2_cpu_event_create(int index, fsdp2_event_t **out);
fsdp2_status_t fsdp2_cpu_event_destroy(fsdp2_event_t *event);
fsdp2_status_t fsdp2_cpu_event_record(fsdp2_event_t *event, fsdp2_stream_t *stream);
fsdp2_status_t fsdp2_cpu_event_query(fsdp2_event_t *event);
fsdp2_status_t fsdp2_cpu_event_wait_timeout(fsdp2_event_t *event, long timeout_ms);

#endif
