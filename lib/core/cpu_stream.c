/* cpu streams: the queue and its worker thread. Layout and invariants: cpu_stream.h. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/cpu_kernels.h"
#include "core/cpu_stream.h"
#include "core/env_internal.h"
#include "core/error.h"
#include "core/log_internal.h"

_Thread_local int fsdp2_cpu_tls_is_worker;

void fsdp2_cpu_stream_retain(cpu_stream_t *s)
{
    atomic_fetch_add(&s->refs, 1);
}

void fsdp2_cpu_stream_release(cpu_stream_t *s)
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

/* Runs one task on the calling thread; returns a host function's status. */
static fsdp2_status_t task_run(const cpu_task_t *t)
{
    switch (t->kind) {
    case TASK_HOST:
        fsdp2_error_set_message(""); /* so a stale message is never blamed on this one */
        return t->u.host.fn(t->u.host.arg);
    case TASK_WAIT:
        fsdp2_cpu_wait_position(t->u.wait.stream, t->u.wait.target, -1);
        fsdp2_cpu_stream_release(t->u.wait.stream);
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

/* Caller holds s->lock. Keeps the first error and the last, each with the running
 * thread's message and the failed task's position. */
static void stream_note_error(cpu_stream_t *s, fsdp2_status_t status, uint64_t position)
{
    const char *message = fsdp2_last_error();
    /* A host function that failed without setting a message is reported by name. */
    snprintf(s->failed_message, sizeof(s->failed_message), "%s",
             message[0] ? message : fsdp2_status_name(status));
    s->failed_status = status;
    s->failed_position = position;
    if (s->error != FSDP2_SUCCESS)
        return;
    s->error = status;
    s->error_position = position;
    memcpy(s->error_message, s->failed_message, sizeof(s->error_message));
}

/* One runner at a time keeps the stream's order: `running` excludes the others. */
void fsdp2_cpu_run_head_locked(cpu_stream_t *s)
{
    cpu_task_t task = s->ring[s->head];
    s->running = 1;
    fsdp2_cpu_note_runner(s);
    pthread_mutex_unlock(&s->lock);
    fsdp2_status_t status = task_run(&task);
    pthread_mutex_lock(&s->lock);
    if (status != FSDP2_SUCCESS)
        stream_note_error(s, status, s->completed + 1);
    s->head = (s->head + 1) % s->capacity;
    s->count--;
    s->completed++;
    s->running = 0;
    pthread_cond_broadcast(&s->progress);
    pthread_cond_signal(&s->not_full);
    if (s->count > 0 || s->stopping) /* a worker that slept while we ran: more work, or */
        pthread_cond_signal(&s->not_empty); /* destroy is waiting for it to leave */
}

static void *stream_worker(void *arg)
{
    cpu_stream_t *s = arg;
    fsdp2_cpu_tls_is_worker = 1;
    /* Its wake-ups must not preempt the thread that enqueued (the kernel lets a batch
     * thread preempt none): where every CPU is busy, that thread often runs the task
     * itself before the worker gets a CPU. A system that forbids it keeps the default. */
    struct sched_param param = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
    pthread_mutex_lock(&s->lock);
    for (;;) {
        fsdp2_cpu_worker_wait_locked(s);
        if (s->count == 0)
            break; /* stopping, and everything has run */
        fsdp2_cpu_run_head_locked(s);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* A host function running on s (on its worker, or on a waiter helping s) must not
 * enqueue on s or wait for s: with a full ring, or waiting for itself, it would wait
 * forever (CUDA forbids the same). */
fsdp2_status_t fsdp2_cpu_check_not_own_worker(cpu_stream_t *s, const char *what)
{
    if (fsdp2_cpu_tls_helping == s || (s->has_thread && pthread_equal(pthread_self(), s->thread)))
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "%s called from a host function running on stream '%s' itself", what,
                           s->name);
    return FSDP2_SUCCESS;
}

/* The failure of the task at `position`, once it has run: the last failure recorded
 * (a later failure on the stream, from another thread's task, can hide it). */
static fsdp2_status_t task_failure(cpu_stream_t *s, uint64_t position)
{
    pthread_mutex_lock(&s->lock);
    fsdp2_status_t status = s->failed_position == position ? s->failed_status : FSDP2_SUCCESS;
    char message[sizeof(s->failed_message)];
    if (status != FSDP2_SUCCESS) {
        memcpy(message, s->failed_message, sizeof(message));
        if (s->error_position == position)
            s->error_reported = 1; /* returned here: destroy need not report it again */
    }
    pthread_mutex_unlock(&s->lock);
    if (status == FSDP2_SUCCESS)
        return FSDP2_SUCCESS;
    return fsdp2_error(status, "stream '%s': %s", s->name, message);
}

fsdp2_status_t fsdp2_cpu_stream_submit(cpu_stream_t *s, const cpu_task_t *t)
{
    fsdp2_cpu_flush_owed(s); /* the next stream call pays what this thread owes */
    if (s->base.is_current) {
        fsdp2_status_t status = task_run(t);
        pthread_mutex_lock(&s->lock);
        s->submitted++;
        s->completed++;
        if (status != FSDP2_SUCCESS) /* kept, as on a side stream */
            stream_note_error(s, status, s->completed);
        pthread_mutex_unlock(&s->lock);
        return status;
    }
    FSDP2_CHECK(fsdp2_cpu_check_not_own_worker(s, "enqueue"));
    pthread_mutex_lock(&s->lock);
    while (s->count == s->capacity) {
        pthread_cond_signal(&s->not_empty); /* a full ring is never left to a nap */
        pthread_cond_wait(&s->not_full, &s->lock);
    }
    s->ring[(s->head + s->count) % s->capacity] = *t;
    if (s->count++ == 0)
        s->queued_ns = fsdp2_now_ns();
    uint64_t position = ++s->submitted;
    if (!fsdp2_cpu_owe_wake(s))
        pthread_cond_signal(&s->not_empty); /* a sleeping worker wakes; no syscall otherwise */
    pthread_mutex_unlock(&s->lock);
    /* FSDP2_CPU_STREAM_BLOCKING: the task has run (this thread runs it, as a waiter)
     * before the enqueue returns, and its failure is the enqueue's. Not for an enqueue
     * from a host function: its task may wait for the stream that runs the function. */
    if (!s->blocking || fsdp2_cpu_tls_is_worker || fsdp2_cpu_tls_helping)
        return FSDP2_SUCCESS;
    FSDP2_CHECK(fsdp2_cpu_wait_position(s, position, -1));
    return task_failure(s, position);
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
    fsdp2_cpu_wait_settings(s);
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
    pthread_cond_init(&s->not_empty, &attr); /* timed waits: the monotonic clock */
    pthread_cond_init(&s->not_full, NULL);
    pthread_cond_init(&s->progress, &attr);
    pthread_condattr_destroy(&attr);
    *out = s;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_cpu_stream_create(int index, const char *name, fsdp2_stream_t **out)
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
        fsdp2_cpu_stream_release(s);
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

fsdp2_status_t fsdp2_cpu_stream_report(cpu_stream_t *s, int reporting)
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

fsdp2_status_t fsdp2_cpu_stream_destroy(fsdp2_stream_t *stream)
{
    cpu_stream_t *s = cpu_stream_of(stream);
    FSDP2_CHECK(fsdp2_cpu_check_not_own_worker(s, "destroy"));
    fsdp2_cpu_flush_owed(NULL);
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_cond_signal(&s->not_empty);
    pthread_mutex_unlock(&s->lock);
    if (s->has_thread)
        pthread_join(s->thread, NULL);
    FSDP2_LOG(DEBUG, STREAM, "destroyed cpu stream '%s' after %llu tasks", s->name,
              (unsigned long long)s->completed);
    fsdp2_status_t status = fsdp2_cpu_stream_report(s, 0); /* an error nobody synchronized for */
    fsdp2_cpu_stream_release(s);
    return status;
}

static pthread_key_t current_key;
static pthread_once_t current_once = PTHREAD_ONCE_INIT;

static void current_drop(void *p)
{
    fsdp2_cpu_stream_release(p);
}

static void current_key_init(void)
{
    pthread_key_create(&current_key, current_drop);
}

fsdp2_status_t fsdp2_cpu_stream_current(int index, fsdp2_stream_t **out)
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

fsdp2_status_t fsdp2_cpu_stream_launch_host(fsdp2_stream_t *stream, fsdp2_host_fn fn, void *arg)
{
    cpu_task_t t = {.kind = TASK_HOST, .u.host = {fn, arg}};
    return fsdp2_cpu_stream_submit(cpu_stream_of(stream), &t);
}

fsdp2_status_t fsdp2_cpu_memcpy_async(void *dst, const void *src, size_t bytes,
                                      fsdp2_stream_t *stream)
{
    cpu_task_t t = {.kind = TASK_MEMCPY, .u.memcpy = {dst, src, bytes}};
    return fsdp2_cpu_stream_submit(cpu_stream_of(stream), &t);
}

fsdp2_status_t fsdp2_cpu_fill_async(void *dst, fsdp2_dtype_t dtype, size_t n, double value,
                                    fsdp2_stream_t *stream)
{
    cpu_task_t t = {.kind = TASK_FILL, .u.fill = {dst, dtype, n, value}};
    return fsdp2_cpu_stream_submit(cpu_stream_of(stream), &t);
}

fsdp2_status_t fsdp2_cpu_accumulate_async(void *y, fsdp2_dtype_t y_dtype, const void *x,
                                          fsdp2_dtype_t x_dtype, size_t n, double alpha,
                                          fsdp2_stream_t *stream)
{
    cpu_task_t t = {.kind = TASK_ACCUMULATE, .u.accumulate = {y, y_dtype, x, x_dtype, n, alpha}};
    return fsdp2_cpu_stream_submit(cpu_stream_of(stream), &t);
}

fsdp2_status_t fsdp2_cpu_chunk_copy_async(const fsdp2_chunk_copy_t *copy, fsdp2_stream_t *stream)
{
    cpu_task_t t = {.kind = TASK_CHUNK_COPY, .u.chunk_copy = *copy};
    return fsdp2_cpu_stream_submit(cpu_stream_of(stream), &t);
}
