/* The cpu device backend: allocation, and the table of its operations (streams and
 * events in cpu_stream.c, cpu_wait.c and cpu_event.c; kernels in cpu_kernels.c). */
#include <stdlib.h>

#include "core/cpu_arena.h"
#include "core/cpu_stream.h"
#include "core/error.h"

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
    .stream_create = fsdp2_cpu_stream_create,
    .stream_destroy = fsdp2_cpu_stream_destroy,
    .stream_current = fsdp2_cpu_stream_current,
    .stream_synchronize = fsdp2_cpu_stream_synchronize,
    .stream_query = fsdp2_cpu_stream_query,
    .stream_wait_event = fsdp2_cpu_stream_wait_event,
    .stream_launch_host = fsdp2_cpu_stream_launch_host,
    .event_create = fsdp2_cpu_event_create,
    .event_destroy = fsdp2_cpu_event_destroy,
    .event_record = fsdp2_cpu_event_record,
    .event_query = fsdp2_cpu_event_query,
    .event_wait_timeout = fsdp2_cpu_event_wait_timeout,
    .memcpy_async = fsdp2_cpu_memcpy_async,
    .fill = fsdp2_cpu_fill_async,
    .accumulate = fsdp2_cpu_accumulate_async,
    .chunk_copy = fsdp2_cpu_chunk_copy_async,
};
