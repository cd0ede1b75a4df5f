/* The cpu device backend: allocation, streams as worker threads, events as positions.
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
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/cpu_arena.h"
#include "core/cpu_kernels.h"
#include "core/device_ops.h"
#include "core/env_internal.h"
#include "core/error.h"
#include "core/log_internal.h"

/* Yields before a worker or a waiter blocks on a condition variable: a wake-up costs a
 * scheduler round trip (tens of microseconds when ranks outnumber cores), and the next
 * task or the awaited completion often arrives within a few yields. (A worker that sleeps
 * at once is woken by every enqueue, whose wake-up can preempt the enqueuing caller when
 * ranks outnumber cores.) */
#define SPIN_YIELDS 64
#define CLAIM_NS 20000
/* Owed wake-ups (owe_wake): after this many tasks in a row run by their waiters, */
#define LAZY_AFTER 8
/* a sleeping worker naps this long at a time instead of being woken by each enqueue, */
#define NAP_NS 1000000
/* for at most this long after the queue last became non-empty; then it sleeps. */
#define LAZY_IDLE_NS 100000000
#define OWED_MAX 4 /* streams one thread may owe a wake-up */

typedef enum task_kind {
    TASK_HOST,
    TASK_WAIT,
    TASK_MEMCPY,
    TASK_FILL,
    TASK_ACCUMULATE,
    TASK_CHUNK_COPY,
} task_kind_t;

typedef struct cpu_stream cpu_stream_t;

typedef struct cpu_task {
    task_kind_t kind;
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
    pthread_cond_t not_empty; /* worker waits for tasks */
    pthread_cond_t not_full;  /* producers wait for room */
    pthread_cond_t progress;  /* waiters on `completed` (monotonic clock) */
    uint64_t submitted;       /* tasks enqueued so far */
    uint64_t completed;       /* tasks run so far */
    cpu_task_t *ring;
    size_t capacity, head, count;
    int stopping;
    int running; /* a task is being run (by the worker or a helping waiter) */
    int64_t queued_ns; /* when the queue last went from empty to not empty */
    int blocked;       /* threads waiting on s that cannot run its tasks (claim_later) */
    int helped_run;    /* tasks in a row run by waiters rather than the worker */
    int napping;       /* the worker sleeps in naps: an enqueue may defer its wake-up */
    int has_thread;
    pthread_t thread;
    fsdp2_status_t error; /* first failure of a host function */
    int error_reported;   /* synchronize or query returned it */
    char error_message[512];
    char name[32];
};

typedef struct cpu_event {
    struct fsdp2_event base;
    pthread_mutex_t lock;
    cpu_stream_t *stream; /* NULL: complete */
    uint64_t target;
} cpu_event_t;

static cpu_stream_t *as_stream(fsdp2_stream_t *s) { return (cpu_stream_t *)s; }
static cpu_event_t *as_event(fsdp2_event_t *e) { return (cpu_event_t *)e; }

static void stream_retain(cpu_stream_t *s)
{
    atomic_fetch_add(&s->refs, 1);
}

static void stream_release(cpu_stream_t *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->not_empty);
    pthread_cond_destroy(&s->not_full);
    pthread_cond_destroy(&s->progress);
    free(s->ring);
    free(s);
}

static fsdp2_status_t deadline_after(long timeout_ms, struct timespec *ts)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
    return FSDP2_SUCCESS;
}

/* Threads that are stream workers never help other streams (a host function of one
 * stream would otherwise run on another stream's thread); the stream whose task this
 * thread is running as a helper, so that task cannot use its own stream either. */
static _Thread_local int tls_is_worker;
static _Thread_local cpu_stream_t *tls_helping;

static fsdp2_status_t task_run(const cpu_task_t *t);
static void stream_note_error(cpu_stream_t *s, fsdp2_status_t status);

/* ---- owed wake-ups ----
 *
 * Waking a sleeping worker for each task costs a scheduler round trip, and a thread that
 * waits for its task at once (a blocking collective, a synchronize) runs it itself
 * anyway (can_help): the wake-up only puts another thread on a core the ranks need
 * (docs/performance-collectives.md, "The hand-off to the stream worker"). So once LAZY_AFTER tasks in
 * a row were run by their waiters, the worker naps (NAP_NS at a time) instead, and an
 * enqueue leaves its wake-up owed by its thread: the thread's next stream call pays it,
 * unless that call is a wait that runs the task itself. FSDP records an event after
 * each collective it enqueues, so its prefetches start at once; a task whose thread
 * makes no stream call starts when the nap ends. */
static _Thread_local cpu_stream_t *tls_owed[OWED_MAX]; /* each holds a reference */
static _Thread_local int tls_owed_n;
static pthread_key_t owed_key; /* its destructor pays what an exiting thread owes */
static pthread_once_t owed_once = PTHREAD_ONCE_INIT;
static int owed_key_made; /* without the key nothing is owed: exits would not pay */

/* Pays every wake-up this thread owes except keep's (a stream it is about to wait for
 * and help: what is left queued after the wait is paid by the flush that follows it). */
static void flush_owed(const cpu_stream_t *keep)
{
    int kept = 0;
    for (int i = 0; i < tls_owed_n; i++) {
        cpu_stream_t *s = tls_owed[i];
        if (s == keep) {
            tls_owed[kept++] = s;
            continue;
        }
        pthread_mutex_lock(&s->lock);
        if (s->count > 0)
            pthread_cond_signal(&s->not_empty);
        pthread_mutex_unlock(&s->lock);
        stream_release(s);
    }
    tls_owed_n = kept;
}

static void owed_at_exit(void *unused)
{
    (void)unused;
    flush_owed(NULL);
}

static void owed_key_init(void)
{
    owed_key_made = pthread_key_create(&owed_key, owed_at_exit) == 0;
}

/* Whether an enqueue on s (lock held) may leave the worker's wake-up owed by this
 * thread; records it if so. */
static int owe_wake(cpu_stream_t *s)
{
    if (!s->napping || tls_is_worker)
        return 0;
    for (int i = 0; i < tls_owed_n; i++)
        if (tls_owed[i] == s)
            return 1;
    if (tls_owed_n == OWED_MAX)
        return 0;
    pthread_once(&owed_once, owed_key_init);
    /* any non-NULL value runs the destructor at thread exit */
    if (!owed_key_made || pthread_setspecific(owed_key, &owed_key) != 0)
        return 0;
    stream_retain(s);
    tls_owed[tls_owed_n++] = s;
    return 1;
}

/* Runs the head task on the calling thread. Caller holds s->lock, s->count > 0 and
 * nobody else runs a task of s; returns with the lock held. One runner at a time keeps
 * the stream's order. */
static void run_head_locked(cpu_stream_t *s)
{
    cpu_task_t task = s->ring[s->head];
    s->running = 1;
    if (tls_is_worker)
        s->helped_run = 0;
    else if (s->helped_run < LAZY_AFTER)
        s->helped_run++;
    pthread_mutex_unlock(&s->lock);
    fsdp2_status_t status = task_run(&task);
    pthread_mutex_lock(&s->lock);
    if (status != FSDP2_SUCCESS)
        stream_note_error(s, status);
    s->head = (s->head + 1) % s->capacity;
    s->count--;
    s->completed++;
    s->running = 0;
    pthread_cond_broadcast(&s->progress);
    pthread_cond_signal(&s->not_full);
    if (s->count > 0 || s->stopping) /* a worker that slept while we ran: more work, or */
        pthread_cond_signal(&s->not_empty); /* destroy is waiting for it to leave */
}

/* Caller helps: an application thread about to block until s reaches a position runs
 * the queued tasks itself while the worker is not running one, instead of paying two
 * thread hand-offs (enqueue -> worker, worker -> waiter) for work it waits for anyway.
 * Caller holds s->lock. */
static int can_help(const cpu_stream_t *s, long timeout_ms)
{
    /* Only untimed waits help: a task may run for longer than a timeout allows. */
    return timeout_ms < 0 && s->has_thread && !tls_is_worker && !s->running && s->count > 0 &&
           !s->stopping;
}

static void help_locked(cpu_stream_t *s)
{
    /* The task's own failure is kept on the stream and reported by the wait; the
     * caller's last-error message must not change just because it helped. Only host
     * functions touch it (kernels cannot fail), so only they pay for the copy. */
    int host = s->ring[s->head].kind == TASK_HOST;
    char saved[1024];
    if (host) { /* a copy, not a format: this runs for every task a waiter helps with */
        size_t n = strnlen(fsdp2_last_error(), sizeof(saved) - 1);
        memcpy(saved, fsdp2_last_error(), n);
        saved[n] = '\0';
    }
    cpu_stream_t *outer = tls_helping;
    tls_helping = s;
    run_head_locked(s);
    tls_helping = outer;
    if (host)
        fsdp2_error_set_message(saved);
}

/* Blocks until s->completed >= target, or the timeout (ms, < 0 forever) passes. */
static fsdp2_status_t wait_position(cpu_stream_t *s, uint64_t target, long timeout_ms)
{
    struct timespec deadline;
    if (timeout_ms >= 0)
        deadline_after(timeout_ms, &deadline);
    fsdp2_status_t status = FSDP2_SUCCESS;
    pthread_mutex_lock(&s->lock);
    /* A waiter that will not help (a timed wait, another stream's worker) must not wait
     * out claim_later's delay or a nap whose wake-up another thread owes: the worker
     * takes the work at once while it is here. */
    int helper = timeout_ms < 0 && !tls_is_worker;
    s->blocked += !helper;
    if (!helper && s->count > 0 && !s->running)
        pthread_cond_signal(&s->not_empty);
    for (int spin = 0; spin < SPIN_YIELDS && s->completed < target; spin++) {
        if (can_help(s, timeout_ms)) {
            help_locked(s);
            continue;
        }
        pthread_mutex_unlock(&s->lock);
        sched_yield();
        pthread_mutex_lock(&s->lock);
    }
    while (s->completed < target) {
        if (can_help(s, timeout_ms)) { /* the tasks before target are queued: run them here */
            help_locked(s);
            continue;
        }
        if (timeout_ms < 0) {
            pthread_cond_wait(&s->progress, &s->lock);
        } else if (pthread_cond_timedwait(&s->progress, &s->lock, &deadline) == ETIMEDOUT &&
                   s->completed < target) {
            status = fsdp2_error(FSDP2_ERR_TIMEOUT,
                                 "stream '%s' did not reach task %llu of %llu within %ld ms "
                                 "(%llu done)",
                                 s->name, (unsigned long long)target,
                                 (unsigned long long)s->submitted, timeout_ms,
                                 (unsigned long long)s->completed);
            break;
        }
    }
    s->blocked -= !helper;
    pthread_mutex_unlock(&s->lock);
    return status;
}

/* Runs one task on the calling thread; returns a host function's status. */
static fsdp2_status_t task_run(const cpu_task_t *t)
{
    switch (t->kind) {
    case TASK_HOST:
        fsdp2_error_set_message(""); /* so a stale message is never blamed on this one */
        return t->u.host.fn(t->u.host.arg);
    case TASK_WAIT:
        wait_position(t->u.wait.stream, t->u.wait.target, -1);
        stream_release(t->u.wait.stream);
        return FSDP2_SUCCESS;
    case TASK_MEMCPY:
        memmove(t->u.memcpy.dst, t->u.memcpy.src, t->u.memcpy.bytes);
        return FSDP2_SUCCESS;
    case TASK_FILL:
        fsdp2_cpu_fill(t->u.fill.dst, t->u.fill.dtype, t->u.fill.n, t->u.fill.value);
        return FSDP2_SUCCESS;
    case TASK_ACCUMULATE:
        fsdp2_cpu_accumulate(t->u.accumulate.y, t->u.accumulate.y_dtype, t->u.accumulate.x,
                             t->u.accumulate.x_dtype, t->u.accumulate.n, t->u.accumulate.alpha);
        return FSDP2_SUCCESS;
    case TASK_CHUNK_COPY:
        fsdp2_cpu_chunk_copy(&t->u.chunk_copy);
        return FSDP2_SUCCESS;
    }
    return FSDP2_ERR_INTERNAL;
}

/* Caller holds s->lock. Keeps the first error and the worker thread's message. */
static void stream_note_error(cpu_stream_t *s, fsdp2_status_t status)
{
    if (s->error != FSDP2_SUCCESS)
        return;
    s->error = status;
    const char *message = fsdp2_last_error();
    /* A host function that failed without setting a message is reported by name. */
    snprintf(s->error_message, sizeof(s->error_message), "%s",
             message[0] ? message : fsdp2_status_name(status));
}

/* A worker still spinning leaves fresh work to the application for CLAIM_NS: a thread
 * that enqueues and then waits (a blocking collective, a synchronize) runs the task
 * itself (can_help) without handing it to another thread and back, which costs more
 * than the delay. Past the spins, CLAIM_NS after the queue last became non-empty, while
 * a waiter that cannot help is blocked on s, or when stopping, the work is the worker's.
 * (A task nobody waits for, or one polled with query, starts up to CLAIM_NS late.) */
static int claim_later(const cpu_stream_t *s, int spin)
{
    return s->count > 0 && !s->running && !s->stopping && !s->blocked && spin < SPIN_YIELDS &&
           fsdp2_now_ns() - s->queued_ns < CLAIM_NS;
}

static void *stream_worker(void *arg)
{
    cpu_stream_t *s = arg;
    tls_is_worker = 1;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        /* Wait for a task nobody is running; leave once stopping and all has run. */
        /* spin counts up to SPIN_YIELDS and stays there: an idle worker loops for days. */
        for (int spin = 0; s->count == 0 || s->running || claim_later(s, spin);
             spin += spin < SPIN_YIELDS) {
            if (s->stopping && s->count == 0 && !s->running)
                break;
            if (spin < SPIN_YIELDS) { /* work often follows at once: avoid a sleep/wake */
                pthread_mutex_unlock(&s->lock);
                sched_yield();
                pthread_mutex_lock(&s->lock);
                continue;
            }
            if (s->helped_run >= LAZY_AFTER && !s->stopping &&
                fsdp2_now_ns() - s->queued_ns < LAZY_IDLE_NS) { /* flush_owed wakes it */
                struct timespec nap;
                clock_gettime(CLOCK_MONOTONIC, &nap);
                nap.tv_nsec += NAP_NS;
                if (nap.tv_nsec >= 1000000000L) {
                    nap.tv_sec++;
                    nap.tv_nsec -= 1000000000L;
                }
                s->napping = 1;
                pthread_cond_timedwait(&s->not_empty, &s->lock, &nap);
                s->napping = 0;
                continue;
            }
            pthread_cond_wait(&s->not_empty, &s->lock);
        }
        if (s->count == 0)
            break;
        run_head_locked(s);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* A host function running on s's own worker must not enqueue on s or wait for s: with
 * a full ring, or waiting for itself, it would wait forever (CUDA forbids the same). */
static fsdp2_status_t check_not_own_worker(cpu_stream_t *s, const char *what)
{
    if (tls_helping == s || (s->has_thread && pthread_equal(pthread_self(), s->thread)))
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "%s called from a host function running on stream '%s' itself", what,
                           s->name);
    return FSDP2_SUCCESS;
}

/* Runs t inline on the current stream, or queues it on a side stream. */
static fsdp2_status_t stream_submit(cpu_stream_t *s, const cpu_task_t *t)
{
    flush_owed(s); /* the next stream call pays what this thread owes */
    if (s->base.is_current) {
        fsdp2_status_t status = task_run(t);
        pthread_mutex_lock(&s->lock);
        s->submitted++;
        s->completed++;
        if (status != FSDP2_SUCCESS) /* kept, as on a side stream */
            stream_note_error(s, status);
        pthread_mutex_unlock(&s->lock);
        return status;
    }
    FSDP2_CHECK(check_not_own_worker(s, "enqueue"));
    pthread_mutex_lock(&s->lock);
    while (s->count == s->capacity) {
        pthread_cond_signal(&s->not_empty); /* a full ring is never left to a nap */
        pthread_cond_wait(&s->not_full, &s->lock);
    }
    s->ring[(s->head + s->count) % s->capacity] = *t;
    if (s->count++ == 0)
        s->queued_ns = fsdp2_now_ns();
    s->submitted++;
    if (!owe_wake(s))
        pthread_cond_signal(&s->not_empty);
    pthread_mutex_unlock(&s->lock);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t stream_init(cpu_stream_t **out, const char *name, size_t capacity)
{
    cpu_stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "cpu stream '%s'", name);
    s->base.ops = &fsdp2_cpu_ops;
    s->base.device = (fsdp2_device_t){FSDP2_DEVICE_CPU, 0};
    atomic_init(&s->refs, 1);
    snprintf(s->name, sizeof(s->name), "%s", name);
    if (capacity) {
        s->ring = calloc(capacity, sizeof(*s->ring));
        if (!s->ring) {
            free(s);
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "cpu stream '%s': queue of %zu tasks",
                               name, capacity);
        }
        s->capacity = capacity;
    }
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->not_empty, &attr); /* the worker's naps: monotonic */
    pthread_cond_init(&s->not_full, NULL);
    pthread_cond_init(&s->progress, &attr);
    pthread_condattr_destroy(&attr);
    *out = s;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t cpu_stream_create(int index, const char *name, fsdp2_stream_t **out)
{
    (void)index;
    cpu_stream_t *s;
    size_t depth = (size_t)fsdp2_env_int(FSDP2_ENV_CPU_STREAM_DEPTH);
    FSDP2_CHECK(stream_init(&s, name, depth));
    /* Workers take no signals: SIGINT and friends belong to the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, stream_worker, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        stream_release(s);
        return fsdp2_error(FSDP2_ERR_SYSTEM, "cpu stream '%s': pthread_create: %s", name,
                           strerror(rc));
    }
    s->has_thread = 1;
    char thread_name[16];
    snprintf(thread_name, sizeof(thread_name), "fsdp2:%s", name);
    pthread_setname_np(s->thread, thread_name);
    FSDP2_LOG(DEBUG, STREAM, "created cpu stream '%s' (queue of %zu)", name, depth);
    *out = &s->base;
    return FSDP2_SUCCESS;
}

/* The stream's first error as this thread's error. `reporting` marks it as seen by the
 * application (synchronize, query); destroy only reports an error nobody saw. */
static fsdp2_status_t stream_report(cpu_stream_t *s, int reporting)
{
    pthread_mutex_lock(&s->lock);
    fsdp2_status_t status = s->error;
    int seen = s->error_reported;
    if (reporting)
        s->error_reported = 1;
    char message[sizeof(s->error_message)];
    if (status != FSDP2_SUCCESS) /* the first error is kept: copied only when there is one */
        memcpy(message, s->error_message, sizeof(message));
    pthread_mutex_unlock(&s->lock);
    if (status != FSDP2_SUCCESS && (reporting || !seen))
        return fsdp2_error(status, "stream '%s': %s", s->name, message);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t cpu_stream_destroy(fsdp2_stream_t *stream)
{
    cpu_stream_t *s = as_stream(stream);
    FSDP2_CHECK(check_not_own_worker(s, "destroy"));
    flush_owed(NULL);
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_cond_signal(&s->not_empty);
    pthread_mutex_unlock(&s->lock);
    if (s->has_thread)
        pthread_join(s->thread, NULL);
    FSDP2_LOG(DEBUG, STREAM, "destroyed cpu stream '%s' after %llu tasks", s->name,
              (unsigned long long)s->completed);
    fsdp2_status_t status = stream_report(s, 0); /* an error nobody synchronized for */
    stream_release(s);
    return status;
}

static pthread_key_t current_key;
static pthread_once_t current_once = PTHREAD_ONCE_INIT;

static void current_drop(void *p)
{
    stream_release(p);
}

static void current_key_init(void)
{
    pthread_key_create(&current_key, current_drop);
}

static fsdp2_status_t cpu_stream_current(int index, fsdp2_stream_t **out)
{
    (void)index;
    pthread_once(&current_once, current_key_init);
    cpu_stream_t *s = pthread_getspecific(current_key);
    if (!s) {
        FSDP2_CHECK(stream_init(&s, "current", 0));
        s->base.is_current = 1;
        pthread_setspecific(current_key, s);
    }
    *out = &s->base;
    return FSDP2_SUCCESS;
}


static fsdp2_status_t cpu_stream_synchronize(fsdp2_stream_t *stream)
{
    cpu_stream_t *s = as_stream(stream);
    FSDP2_CHECK(check_not_own_worker(s, "synchronize"));
    flush_owed(s); /* s's own tasks: this thread runs them */
    pthread_mutex_lock(&s->lock);
    uint64_t target = s->submitted;
    pthread_mutex_unlock(&s->lock);
    fsdp2_status_t status = wait_position(s, target, -1);
    flush_owed(NULL);
    FSDP2_CHECK(status);
    return stream_report(s, 1);
}

static fsdp2_status_t cpu_stream_query(fsdp2_stream_t *stream)
{
    cpu_stream_t *s = as_stream(stream);
    flush_owed(NULL); /* polling: the work must run meanwhile */
    pthread_mutex_lock(&s->lock);
    int done = s->completed == s->submitted;
    pthread_mutex_unlock(&s->lock);
    FSDP2_CHECK(stream_report(s, 1));
    return done ? FSDP2_SUCCESS : FSDP2_ERR_NOT_READY;
}

/* The event's latest record, with a reference on its stream (NULL when complete). */
static void event_capture(cpu_event_t *e, cpu_stream_t **s, uint64_t *target)
{
    pthread_mutex_lock(&e->lock);
    *s = e->stream;
    *target = e->target;
    if (*s)
        stream_retain(*s);
    pthread_mutex_unlock(&e->lock);
}

static int position_reached(cpu_stream_t *s, uint64_t target)
{
    pthread_mutex_lock(&s->lock);
    int done = s->completed >= target;
    pthread_mutex_unlock(&s->lock);
    return done;
}

static fsdp2_status_t cpu_stream_wait_event(fsdp2_stream_t *stream, fsdp2_event_t *event)
{
    cpu_stream_t *s = as_stream(stream), *on;
    uint64_t target;
    event_capture(as_event(event), &on, &target);
    if (!on) {
        flush_owed(NULL);
        return FSDP2_SUCCESS;
    }
    if (s->base.is_current || position_reached(on, target)) {
        flush_owed(on); /* on's tasks up to target: this thread runs them */
        fsdp2_status_t status = wait_position(on, target, -1);
        flush_owed(NULL);
        stream_release(on);
        return status;
    }
    cpu_task_t t = {.kind = TASK_WAIT, .u.wait = {on, target}}; /* the task owns the ref */
    return stream_submit(s, &t);
}

static fsdp2_status_t cpu_stream_launch_host(fsdp2_stream_t *stream, fsdp2_host_fn fn, void *arg)
{
    cpu_task_t t = {.kind = TASK_HOST, .u.host = {fn, arg}};
    return stream_submit(as_stream(stream), &t);
}

static fsdp2_status_t cpu_event_create(int index, fsdp2_event_t **out)
{
    (void)index;
    cpu_event_t *e = calloc(1, sizeof(*e));
    if (!e)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "cpu event");
    e->base.ops = &fsdp2_cpu_ops;
    e->base.device = (fsdp2_device_t){FSDP2_DEVICE_CPU, 0};
    pthread_mutex_init(&e->lock, NULL);
    *out = &e->base;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t cpu_event_destroy(fsdp2_event_t *event)
{
    cpu_event_t *e = as_event(event);
    stream_release(e->stream);
    pthread_mutex_destroy(&e->lock);
    free(e);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t cpu_event_record(fsdp2_event_t *event, fsdp2_stream_t *stream)
{
    cpu_event_t *e = as_event(event);
    cpu_stream_t *s = as_stream(stream), *on = NULL;
    uint64_t target = 0;
    flush_owed(NULL); /* what was recorded may be waited for elsewhere (a prefetch) */
    if (!s->base.is_current) { /* the current stream's work is always done already */
        pthread_mutex_lock(&s->lock);
        target = s->submitted;
        pthread_mutex_unlock(&s->lock);
        stream_retain(s);
        on = s;
    }
    pthread_mutex_lock(&e->lock);
    cpu_stream_t *old = e->stream;
    e->stream = on;
    e->target = target;
    pthread_mutex_unlock(&e->lock);
    stream_release(old);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t cpu_event_query(fsdp2_event_t *event)
{
    cpu_stream_t *on;
    uint64_t target;
    flush_owed(NULL); /* polling: the work must run meanwhile */
    event_capture(as_event(event), &on, &target);
    if (!on)
        return FSDP2_SUCCESS;
    int done = position_reached(on, target);
    stream_release(on);
    return done ? FSDP2_SUCCESS : FSDP2_ERR_NOT_READY;
}

static fsdp2_status_t cpu_event_wait_timeout(fsdp2_event_t *event, long timeout_ms)
{
    cpu_stream_t *on;
    uint64_t target;
    event_capture(as_event(event), &on, &target);
    flush_owed(on && timeout_ms < 0 ? on : NULL); /* a timed wait does not help */
    if (!on)
        return FSDP2_SUCCESS;
    fsdp2_status_t status = wait_position(on, target, timeout_ms);
    flush_owed(NULL);
    stream_release(on);
    return status;
}

static fsdp2_status_t cpu_memcpy_async(void *dst, const void *src, size_t bytes,
                                       fsdp2_stream_t *stream)
{
    cpu_task_t t = {.kind = TASK_MEMCPY, .u.memcpy = {dst, src, bytes}};
    return stream_submit(as_stream(stream), &t);
}

static fsdp2_status_t cpu_fill(void *dst, fsdp2_dtype_t dtype, size_t n, double value,
                               fsdp2_stream_t *stream)
{
    cpu_task_t t = {.kind = TASK_FILL, .u.fill = {dst, dtype, n, value}};
    return stream_submit(as_stream(stream), &t);
}

static fsdp2_status_t cpu_accumulate(void *y, fsdp2_dtype_t y_dtype, const void *x,
                                     fsdp2_dtype_t x_dtype, size_t n, double alpha,
                                     fsdp2_stream_t *stream)
{
    cpu_task_t t = {.kind = TASK_ACCUMULATE, .u.accumulate = {y, y_dtype, x, x_dtype, n, alpha}};
    return stream_submit(as_stream(stream), &t);
}

static fsdp2_status_t cpu_chunk_copy(const fsdp2_chunk_copy_t *copy, fsdp2_stream_t *stream)
{
    cpu_task_t t = {.kind = TASK_CHUNK_COPY, .u.chunk_copy = *copy};
    return stream_submit(as_stream(stream), &t);
}

static fsdp2_status_t cpu_check(int index)
{
    if (index != 0)
        return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE, "cpu device index %d (only 0 exists)", index);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t cpu_alloc(int index, size_t bytes, void **ptr)
{
    (void)index;
    *ptr = fsdp2_cpu_arena_alloc(bytes);
    if (*ptr)
        return FSDP2_SUCCESS;
    /* 64-byte alignment: whole cache lines and aligned AVX-512 loads. */
    int rc = posix_memalign(ptr, 64, bytes);
    if (rc != 0) {
        *ptr = NULL;
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "cpu allocation of %zu bytes failed", bytes);
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t cpu_free(int index, void *ptr)
{
    (void)index;
    if (!fsdp2_cpu_arena_free(ptr))
        free(ptr);
    return FSDP2_SUCCESS;
}

const fsdp2_device_ops_t fsdp2_cpu_ops = {
    .name = "cpu",
    .check = cpu_check,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_current = cpu_stream_current,
    .stream_synchronize = cpu_stream_synchronize,
    .stream_query = cpu_stream_query,
    .stream_wait_event = cpu_stream_wait_event,
    .stream_launch_host = cpu_stream_launch_host,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_query = cpu_event_query,
    .event_wait_timeout = cpu_event_wait_timeout,
    .memcpy_async = cpu_memcpy_async,
    .fill = cpu_fill,
    .accumulate = cpu_accumulate,
    .chunk_copy = cpu_chunk_copy,
};
