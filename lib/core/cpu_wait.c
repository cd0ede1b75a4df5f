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
 * stream's tasks (a host function of one stream would run on another's thread). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/cpu_stream.h"
#include "core/env_internal.h"
#include "core/error.h"

_Thread_local cpu_stream_t *fsdp2_cpu_tls_helping;

static int spin_yields(void)
{
    return (int)fsdp2_env_int(FSDP2_ENV_CPU_STREAM_SPIN);
}

static int64_t claim_ns(void)
{
    return fsdp2_env_int(FSDP2_ENV_CPU_STREAM_CLAIM_US) * 1000;
}

/* Whether the worker, after `spin` of its `spins` yields, leaves the head task to a
 * waiter for now. Never once a waiter that cannot help is blocked on s, or when
 * stopping. */
static int claim_later(const cpu_stream_t *s, int spin, int spins)
{
    return s->count > 0 && !s->running && !s->stopping && !s->blocked && spin < spins &&
           fsdp2_now_ns() - s->queued_ns < claim_ns();
}

void fsdp2_cpu_worker_wait_locked(cpu_stream_t *s)
{
    int spins = spin_yields();
    /* spin counts up to spins and stays there: the worker then sleeps until signalled */
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
        pthread_cond_wait(&s->not_empty, &s->lock);
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

static void deadline_after(long timeout_ms, struct timespec *ts)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

fsdp2_status_t fsdp2_cpu_wait_position(cpu_stream_t *s, uint64_t target, long timeout_ms)
{
    struct timespec deadline;
    if (timeout_ms >= 0)
        deadline_after(timeout_ms, &deadline);
    fsdp2_status_t status = FSDP2_SUCCESS;
    pthread_mutex_lock(&s->lock);
    /* A waiter that will not help must not wait out the claim window: the worker takes
     * the work at once while such a waiter is here. */
    int helper = timeout_ms < 0 && !fsdp2_cpu_tls_is_worker;
    s->blocked += !helper;
    if (!helper && s->count > 0 && !s->running)
        pthread_cond_signal(&s->not_empty);
    int spins = spin_yields();
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
