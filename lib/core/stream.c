/* Streams and events: argument checks, then dispatch to the device's backend. */
#include <stddef.h>
#include <stdio.h>

#include "core/device_ops.h"
#include "core/env_internal.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/trace_internal.h"

static int same_device(fsdp2_device_t a, fsdp2_device_t b)
{
    return a.type == b.type && a.index == b.index;
}

fsdp2_status_t fsdp2_stream_create(fsdp2_device_t device, const char *name,
                                   fsdp2_stream_t **stream)
{
    FSDP2_ARG_CHECK(stream, "stream is NULL");
    *stream = NULL;
    FSDP2_CHECK(fsdp2_env_init());
    const fsdp2_device_ops_t *ops = NULL;
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    FSDP2_CHECK(ops->check(device.index));
    FSDP2_CHECK(ops->stream_create(device.index, name ? name : "side", stream));
    snprintf((*stream)->name, sizeof((*stream)->name), "%s", name ? name : "side");
    atomic_init(&(*stream)->trace_gen, 0);
    atomic_init(&(*stream)->trace_last, -1);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_stream_destroy(fsdp2_stream_t *stream)
{
    if (!stream)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(!stream->is_current, "the current stream cannot be destroyed");
    return stream->ops->stream_destroy(stream);
}

fsdp2_status_t fsdp2_stream_current(fsdp2_device_t device, fsdp2_stream_t **stream)
{
    FSDP2_ARG_CHECK(stream, "stream is NULL");
    const fsdp2_device_ops_t *ops = NULL;
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    FSDP2_CHECK(ops->check(device.index));
    return ops->stream_current(device.index, stream);
}

fsdp2_status_t fsdp2_stream_device(const fsdp2_stream_t *stream, fsdp2_device_t *device)
{
    FSDP2_ARG_CHECK(stream && device, "stream or device is NULL");
    *device = stream->device;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_stream_synchronize(fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(stream, "stream is NULL");
    return stream->ops->stream_synchronize(stream);
}

fsdp2_status_t fsdp2_stream_query(fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(stream, "stream is NULL");
    return stream->ops->stream_query(stream);
}

fsdp2_status_t fsdp2_stream_wait_event(fsdp2_stream_t *stream, fsdp2_event_t *event)
{
    FSDP2_ARG_CHECK(stream && event, "stream or event is NULL");
    FSDP2_ARG_CHECK(same_device(stream->device, event->device),
                    "the event's device (type %d index %d) is not the stream's (type %d index %d)",
                    (int)event->device.type, event->device.index, (int)stream->device.type,
                    stream->device.index);
    if (fsdp2_fault_hit(FAULT_ENQUEUE))
        return fsdp2_fault_error(FAULT_ENQUEUE, "stream_wait_event");
    if (!fsdp2_tracing())
        return stream->ops->stream_wait_event(stream, event);
    trace_token_t waiting = fsdp2_trace_wait_begin(stream, event);
    fsdp2_status_t status = stream->ops->stream_wait_event(stream, event);
    fsdp2_trace_host_end(waiting);
    FSDP2_CHECK(status);
    fsdp2_trace_event_waited(stream, event);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_stream_launch_host(fsdp2_stream_t *stream, fsdp2_host_fn fn, void *arg)
{
    FSDP2_ARG_CHECK(stream && fn, "stream or fn is NULL");
    if (fsdp2_fault_hit(FAULT_ENQUEUE))
        return fsdp2_fault_error(FAULT_ENQUEUE, "launch_host");
    return stream->ops->stream_launch_host(stream, fn, arg);
}

fsdp2_status_t fsdp2_memcpy_async(void *dst, const void *src, size_t bytes, fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(stream, "stream is NULL");
    if (bytes == 0)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(dst && src, "dst=%p or src=%p is NULL with %zu bytes", dst, src, bytes);
    if (fsdp2_fault_hit(FAULT_ENQUEUE))
        return fsdp2_fault_error(FAULT_ENQUEUE, "memcpy_async");
    return stream->ops->memcpy_async(dst, src, bytes, stream);
}

fsdp2_status_t fsdp2_event_create(fsdp2_device_t device, fsdp2_event_t **event)
{
    FSDP2_ARG_CHECK(event, "event is NULL");
    *event = NULL;
    const fsdp2_device_ops_t *ops = NULL;
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    FSDP2_CHECK(ops->check(device.index));
    FSDP2_CHECK(ops->event_create(device.index, event));
    (*event)->trace_gen = 0;
    (*event)->trace_src = -1;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_event_destroy(fsdp2_event_t *event)
{
    if (!event)
        return FSDP2_SUCCESS;
    return event->ops->event_destroy(event);
}

fsdp2_status_t fsdp2_event_record(fsdp2_event_t *event, fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(stream && event, "stream or event is NULL");
    FSDP2_ARG_CHECK(same_device(stream->device, event->device),
                    "event of device (type %d index %d) recorded on a stream of device (type %d "
                    "index %d)",
                    (int)event->device.type, event->device.index, (int)stream->device.type,
                    stream->device.index);
    if (fsdp2_fault_hit(FAULT_ENQUEUE))
        return fsdp2_fault_error(FAULT_ENQUEUE, "event_record");
    FSDP2_CHECK(event->ops->event_record(event, stream));
    if (fsdp2_tracing())
        fsdp2_trace_event_recorded(event, stream);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_event_query(fsdp2_event_t *event)
{
    FSDP2_ARG_CHECK(event, "event is NULL");
    return event->ops->event_query(event);
}

fsdp2_status_t fsdp2_event_synchronize(fsdp2_event_t *event)
{
    FSDP2_ARG_CHECK(event, "event is NULL");
    return event->ops->event_wait_timeout(event, -1);
}

fsdp2_status_t fsdp2_event_wait_timeout(fsdp2_event_t *event, long timeout_ms)
{
    FSDP2_ARG_CHECK(event, "event is NULL");
    FSDP2_ARG_CHECK(timeout_ms >= 0, "timeout_ms=%ld is negative", timeout_ms);
    return event->ops->event_wait_timeout(event, timeout_ms);
}
