/* The device backend interface. A backend (cpu, cuda) fills one const struct of
 * function pointers; lib/core/device.c, stream.c and kernels.c validate arguments and
 * dispatch through it, so nothing above this layer tests which device it runs on.
 *
 * Streams and events are backend structs whose first member is the common header
 * below, so the generic layer can find their ops and device. Kernel entry points get
 * arguments that were already checked (valid dtypes, non-overlapping, n > 0). */
#ifndef FSDP2_CORE_DEVICE_OPS_H
#define FSDP2_CORE_DEVICE_OPS_H

#include <stdatomic.h>
#include <stddef.h>

#include <fsdp2/device.h>
#include <fsdp2/kernels.h>
#include <fsdp2/stream.h>

struct fsdp2_device_ops;

struct fsdp2_stream {
    const struct fsdp2_device_ops *ops;
    fsdp2_device_t device;
    int is_current; /* the thread's current stream: never destroyed by the user */
    /* Tracing (lib/core/trace.c): the stream's name, its track in the session `trace_gen`
     * and the last slice enqueued on it there (flow arrows start in it). Zero before the
     * stream is first traced. */
    char name[32];
    _Atomic unsigned trace_gen;
    int trace_track;
    _Atomic int trace_last;
};

struct fsdp2_event {
    const struct fsdp2_device_ops *ops;
    fsdp2_device_t device;
    /* Tracing: the flow source of the latest record made in session `trace_gen`. */
    unsigned trace_gen;
    int trace_src;
};

typedef struct fsdp2_device_ops {
    const char *name;

    fsdp2_status_t (*check)(int index);
    fsdp2_status_t (*alloc)(int index, size_t bytes, void **ptr);
    fsdp2_status_t (*free)(int index, void *ptr);

    fsdp2_status_t (*stream_create)(int index, const char *name, fsdp2_stream_t **stream);
    fsdp2_status_t (*stream_destroy)(fsdp2_stream_t *stream);
    fsdp2_status_t (*stream_current)(int index, fsdp2_stream_t **stream);
    fsdp2_status_t (*stream_synchronize)(fsdp2_stream_t *stream);
    fsdp2_status_t (*stream_query)(fsdp2_stream_t *stream);
    fsdp2_status_t (*stream_wait_event)(fsdp2_stream_t *stream, fsdp2_event_t *event);
    fsdp2_status_t (*stream_launch_host)(fsdp2_stream_t *stream, fsdp2_host_fn fn, void *arg);

    fsdp2_status_t (*event_create)(int index, fsdp2_event_t **event);
    fsdp2_status_t (*event_destroy)(fsdp2_event_t *event);
    fsdp2_status_t (*event_record)(fsdp2_event_t *event, fsdp2_stream_t *stream);
    fsdp2_status_t (*event_query)(fsdp2_event_t *event);
    fsdp2_status_t (*event_wait_timeout)(fsdp2_event_t *event, long timeout_ms); /* <0: forever */

    fsdp2_status_t (*memcpy_async)(void *dst, const void *src, size_t bytes,
                                   fsdp2_stream_t *stream);
    fsdp2_status_t (*fill)(void *dst, fsdp2_dtype_t dtype, size_t n, double value,
                           fsdp2_stream_t *stream);
    fsdp2_status_t (*accumulate)(void *y, fsdp2_dtype_t y_dtype, const void *x,
                                 fsdp2_dtype_t x_dtype, size_t n, double alpha,
                                 fsdp2_stream_t *stream);
    /* Cast and plain copies arrive here as chunk copies (rows == 1 for a flat cast). */
    fsdp2_status_t (*chunk_copy)(const fsdp2_chunk_copy_t *copy, fsdp2_stream_t *stream);

    /* The device's PCI bus id ("0000:3B:00.0") into buf; NULL for devices not on PCI. */
    fsdp2_status_t (*pci_bus_id)(int index, char *buf, size_t len);
} fsdp2_device_ops_t;

extern const fsdp2_device_ops_t fsdp2_cpu_ops;

/* The backend for a device type (cuda's from the CUDA module, loaded at the first call);
 * FSDP2_ERR_NOT_AVAILABLE for cuda when the module cannot be loaded, and
 * FSDP2_ERR_INVALID_ARGUMENT for meta (it has no runtime). */
fsdp2_status_t fsdp2_device_ops_get(fsdp2_device_t device, const fsdp2_device_ops_t **ops);

/* Whether need more bytes fit the device's limit (FSDP2_CPU_MEMORY_LIMIT) with what is
 * live now; FSDP2_ERR_OUT_OF_MEMORY naming what, the bytes and the limit otherwise. */
fsdp2_status_t fsdp_memory_check_fits(fsdp2_device_t device, uint64_t need, const char *what);

#endif
