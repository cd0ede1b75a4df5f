/* The waiting policy of cpu streams: how a worker waits for work, and how a thread
 * waits until a stream reaches a position.
 *
 * Both yield the core FSDP2_CPU_STREAM_SPIN times before they block on a condition
 * variable: the next task or the awaited completion often comes within microseconds,
 * and a sleep and wake-up costs a scheduler round trip. A worker that has blocked sleeps
 * until an enqueue signals it, so an idle stream costs no CPU and a task enqueued to it
 * starts within the operating system's wake-up latency.
 *
 * A thread about to block until a stream reaches a position runs the stream's queued
 * tasks itself while the worker is not running one ("helps"), instead of paying two
 * hand-offs (enqueue -> worker, worker -> waiter) for work it waits for anyway. A
 * worker that is still yielding leaves a task to such a waiter for
 * FSDP2_CPU_STREAM_CLAIM_US after the queue became non-empty; a task nobody waits for
 * starts that much later at most. Only untimed waits from application threads help: a
 * task may run for longer than a timeout allows, and a worker never runs another
 * stream's tasks (a host function of one stream would run on another's thread).
 *
 * Deferred wake-ups, only where ranks outnumber CPUs. There each wake-up of a worker
 * takes a CPU from the ranks in the middle of their collectives, and a blocking-style
 * caller (enqueue, then synchronize) runs the task itself anyway. So once LAZY_AFTER
 * tasks in a row were run by their waiters, the worker naps (FSDP2_CPU_STREAM_NAP_US at
 * a time, for at most LAZY_IDLE_NAPS naps after its queue last became non-empty, then it
 * sleeps) and an enqueue leaves its wake-up owed by the enqueuing thread: the thread's
 * next stream or event call pays it, unless that call is a wait that runs the task
 * itself, and a thread that exits pays what it owes. A task whose thread makes no
 * further stream call then starts when the nap ends. FSDP records an event right after
 * each collective it enqueues, which pays the wake-up at once. The mode is
 * FSDP2_CPU_STREAM_DEFER_WAKE: auto turns it on once a shared-memory group of this
 * process finds its host's ranks outnumbering their CPUs. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/cpu_stream.h"
#include "core/env_internal.h"
#include "core/error.h"

_Thread_local cpu_stream_t *fsdp2_cpu_tls_helping;

#define LAZY_AFTER 8       /* tasks in a row run by their waiters before the worker naps */
#define LAZY_IDLE_NAPS 100 /* naps after the queue last became non-empty; then it sleeps */
#define OWED_MAX 4         /* streams one thread may owe a wake-up */

static atomic_int oversubscribed; /* a shared-memory group found more ranks than CPUs */

void fsdp2_cpu_streams_note_oversubscribed(void)
{
    atomic_store(&oversubscribed, 1);
}

static int deferring(const cpu_stream_t *s)
{
    return s->defer_wake == 1 ||
           (s->defer_wake == 0 && atomic_load_explicit(&oversubscribed, memory_order_relaxed));
}

void fsdp2_cpu_wait_settings(cpu_stream_t *s)
{
    s->spins = (int)fsdp2_env_int(FSDP2_ENV_CPU_STREAM_SPIN);
    s->claim_ns = fsdp2_env_int(FSDP2_ENV_CPU_STREAM_CLAIM_US) * 1000;
    s->nap_ns = fsdp2_env_int(FSDP2_ENV_CPU_STREAM_NAP_US) * 1000;
    s->defer_wake = (int)fsdp2_env_int(FSDP2_ENV_CPU_STREAM_DEFER_WAKE); /* auto|on|off */
    s->blocking = fsdp2_env_int(FSDP2_ENV_CPU_STREAM_BLOCKING) == 1; /* off|on */
}

/* Each owed stream holds a reference until paid. */
static _Thread_local cpu_stream_t *tls_owed[OWED_MAX];
static _Thread_local int tls_owed_n;
static pthread_key_t owed_key; /* its destructor pays what an exiting thread owes */
static pthread_once_t owed_once = PTHREAD_ONCE_INIT;
static int owed_key_made; /* without the key nothing is owed: exits would not pay */

void fsdp2_cpu_flush_owed(const cpu_stream_t *keep)
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
        fsdp2_cpu_stream_release(s);
    }
    tls_owed_n = kept;
}

static void owed_at_exit(void *unused)
{
    (void)unused;
    fsdp2_cpu_flush_owed(NULL);
}

static void owed_key_init(void)
{
    owed_key_made = pthread_key_create(&owed_key, owed_at_exit) == 0;
}

int fsdp2_cpu_owe_wake(cpu_stream_t *s)
{
    if (!s->napping || fsdp2_cpu_tls_is_worker)
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
    fsdp2_cpu_stream_retain(s);
    tls_owed[tls_owed_n++] = s;
    return 1;
}

void fsdp2_cpu_note_runner(cpu_stream_t *s)
{
    if (fsdp2_cpu_tls_is_worker)
        s->helped_run = 0;
    else if (s->helped_run < LAZY_AFTER)
        s->helped_run++;
}

/* Whether the worker, after `spin` of its `spins` yields, leaves the head task to a
 * waiter for now. Never once a waiter that cannot help is blocked on s, or when
 * stopping. */
static int claim_later(const cpu_stream_t *s, int spin, int spins)
{
    return s->count > 0 && !s->running && !s->stopping && !s->blocked && spin < spins &&
           fsdp2_now_ns() - s->queued_ns < s->claim_ns;
}

void fsdp2_cpu_worker_wait_locked(cpu_stream_t *s)
{
    int spins = s->spins;
    /* spin counts up to spins and stays there (the worker then sleeps until signalled),
     * but a wake-up for a fresh task starts it again for the claim window */
    for (int spin = 0; s->count == 0 || s->running || claim_later(s, spin, spins);
         spin += spin < spins) {
        if (s->stopping && s->count == 0 && !s->running)
            return;
        if (spin < spins) {
            pthread_mutex_unlock(&s->lock);
            sched_yield();
            pthread_mutex_lock(&s->lock);
            continue;
        }
        int64_t nap = s->nap_ns;
        if (s->helped_run >= LAZY_AFTER && !s->stopping && deferring(s) &&
            fsdp2_now_ns() - s->queued_ns < LAZY_IDLE_NAPS * nap) {
            /* an owed wake-up (fsdp2_cpu_flush_owed) ends it early */
            struct timespec until = fsdp2_time_after(CLOCK_MONOTONIC, nap);
            s->napping = 1;
            pthread_cond_timedwait(&s->not_empty, &s->lock, &until);
            s->napping = 0;
            continue;
        }
        pthread_cond_wait(&s->not_empty, &s->lock);
        spin = -1; /* woken: a waiter may still claim the fresh task */
    }
}

/* Caller holds s->lock. */
static int can_help(const cpu_stream_t *s, long timeout_ms)
{
    return timeout_ms < 0 && s->has_thread && !fsdp2_cpu_tls_is_worker && !s->running &&
           s->count > 0 && !s->stopping;
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
    cpu_stream_t *outer = fsdp2_cpu_tls_helping;
    fsdp2_cpu_tls_helping = s;
    fsdp2_cpu_run_head_locked(s);
    fsdp2_cpu_tls_helping = outer;
    if (host)
        fsdp2_error_set_message(saved);
}

fsdp2_status_t fsdp2_cpu_wait_position(cpu_stream_t *s, uint64_t target, long timeout_ms)
{
    struct timespec deadline;
    if (timeout_ms >= 0)
        deadline = fsdp2_time_after(CLOCK_MONOTONIC, (int64_t)timeout_ms * 1000000);
    fsdp2_status_t status = FSDP2_SUCCESS;
    pthread_mutex_lock(&s->lock);
    /* A waiter that will not help must not wait out the claim window or a nap whose
     * wake-up another thread owes: the worker takes the work at once while it is here. */
    int helper = timeout_ms < 0 && !fsdp2_cpu_tls_is_worker;
    s->blocked += !helper;
    if (!helper && s->count > 0 && !s->running)
        pthread_cond_signal(&s->not_empty);
    int spins = s->spins;
    for (int spin = 0; spin < spins && s->completed < target; spin++) {
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
