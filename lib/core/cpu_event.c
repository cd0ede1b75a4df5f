/* cpu events, and the stream operations that wait or poll: an event is a position on
 * one stream's count of completed tasks (cpu_stream.h). */
#include <pthread.h>
#include <stdlib.h>

#include "core/cpu_stream.h"
#include "core/error.h"

static cpu_event_t *as_event(fsdp2_event_t *e) { return (cpu_event_t *)e; }

fsdp2_status_t fsdp2_cpu_stream_synchronize(fsdp2_stream_t *stream)
{
    cpu_stream_t *s = cpu_stream_of(stream);
    FSDP2_CHECK(fsdp2_cpu_check_not_own_worker(s, "synchronize"));
    fsdp2_cpu_flush_owed(s); /* s's own tasks: this thread runs them */
    pthread_mutex_lock(&s->lock);
    uint64_t target = s->submitted;
    pthread_mutex_unlock(&s->lock);
    fsdp2_status_t status = fsdp2_cpu_wait_position(s, target, -1);
    fsdp2_cpu_flush_owed(NULL);
    FSDP2_CHECK(status);
    return fsdp2_cpu_stream_report(s, 1);
}

fsdp2_status_t fsdp2_cpu_stream_query(fsdp2_stream_t *stream)
{
    cpu_stream_t *s = cpu_stream_of(stream);
    fsdp2_cpu_flush_owed(NULL); /* polling: the work must run meanwhile */
    pthread_mutex_lock(&s->lock);
    int done = s->completed == s->submitted;
    pthread_mutex_unlock(&s->lock);
    FSDP2_CHECK(fsdp2_cpu_stream_report(s, 1));
    return done ? FSDP2_SUCCESS : FSDP2_ERR_NOT_READY;
}

/* The event's latest record, with a reference on its stream (NULL when complete). */
static void event_capture(cpu_event_t *e, cpu_stream_t **s, uint64_t *target)
{
    pthread_mutex_lock(&e->lock);
    *s = e->stream;
    *target = e->target;
    if (*s)
        fsdp2_cpu_stream_retain(*s);
    pthread_mutex_unlock(&e->lock);
}

static int position_reached(cpu_stream_t *s, uint64_t target)
{
    pthread_mutex_lock(&s->lock);
    int done = s->completed >= target;
    pthread_mutex_unlock(&s->lock);
    return done;
}

/* A host function running on s that waits for a later position of s would wait for
 * itself. */
static fsdp2_status_t own_wait_refused(cpu_stream_t *s, uint64_t target)
{
    if (position_reached(s, target))
        return FSDP2_SUCCESS;
    return fsdp2_cpu_check_not_own_worker(s, "a wait for an event");
}

fsdp2_status_t fsdp2_cpu_stream_wait_event(fsdp2_stream_t *stream, fsdp2_event_t *event)
{
    cpu_stream_t *s = cpu_stream_of(stream), *on;
    uint64_t target;
    event_capture(as_event(event), &on, &target);
    if (!on) {
        fsdp2_cpu_flush_owed(NULL);
        return FSDP2_SUCCESS;
    }
    if (s->base.is_current || position_reached(on, target)) {
        fsdp2_status_t status = own_wait_refused(on, target);
        if (status == FSDP2_SUCCESS) {
            fsdp2_cpu_flush_owed(on); /* on's tasks up to target: this thread runs them */
            status = fsdp2_cpu_wait_position(on, target, -1);
            fsdp2_cpu_flush_owed(NULL);
        }
        fsdp2_cpu_stream_release(on);
        return status;
    }
    cpu_task_t t = {.kind = TASK_WAIT, .u.wait = {on, target}}; /* the task owns the ref */
    fsdp2_status_t status = fsdp2_cpu_stream_submit(s, &t);
    if (status != FSDP2_SUCCESS) /* not queued: the reference is still ours */
        fsdp2_cpu_stream_release(on);
    return status;
}

fsdp2_status_t fsdp2_cpu_event_create(int index, fsdp2_event_t **out)
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

fsdp2_status_t fsdp2_cpu_event_destroy(fsdp2_event_t *event)
{
    cpu_event_t *e = as_event(event);
    fsdp2_cpu_stream_release(e->stream);
    pthread_mutex_destroy(&e->lock);
    free(e);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_cpu_event_record(fsdp2_event_t *event, fsdp2_stream_t *stream)
{
    cpu_event_t *e = as_event(event);
    cpu_stream_t *s = cpu_stream_of(stream), *on = NULL;
    uint64_t target = 0;
    fsdp2_cpu_flush_owed(NULL); /* what was recorded may be waited for elsewhere (a prefetch) */
    if (!s->base.is_current) { /* the current stream's work is always done already */
        pthread_mutex_lock(&s->lock);
        target = s->submitted;
        pthread_mutex_unlock(&s->lock);
        fsdp2_cpu_stream_retain(s);
        on = s;
    }
    pthread_mutex_lock(&e->lock);
    cpu_stream_t *old = e->stream;
    e->stream = on;
    e->target = target;
    pthread_mutex_unlock(&e->lock);
    fsdp2_cpu_stream_release(old);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_cpu_event_query(fsdp2_event_t *event)
{
    cpu_stream_t *on;
    uint64_t target;
    fsdp2_cpu_flush_owed(NULL); /* polling: the work must run meanwhile */
    event_capture(as_event(event), &on, &target);
    if (!on)
        return FSDP2_SUCCESS;
    int done = position_reached(on, target);
    fsdp2_cpu_stream_release(on);
    return done ? FSDP2_SUCCESS : FSDP2_ERR_NOT_READY;
}

fsdp2_status_t fsdp2_cpu_event_wait_timeout(fsdp2_event_t *event, long timeout_ms)
{
    cpu_stream_t *on;
    uint64_t target;
    event_capture(as_event(event), &on, &target);
    fsdp2_cpu_flush_owed(on && timeout_ms < 0 ? on : NULL); /* a timed wait does not help */
    if (!on)
        return FSDP2_SUCCESS;
    fsdp2_status_t status = own_wait_refused(on, target);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_cpu_wait_position(on, target, timeout_ms);
    fsdp2_cpu_flush_owed(NULL);
    fsdp2_cpu_stream_release(on);
    return status;
}
