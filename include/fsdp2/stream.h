/* Streams and events: ordered queues of work on a device, and markers in them.
 *
 * The FSDP scheduling is written once against these. Their meaning is CUDA's:
 * - work enqueued on one stream runs in order, asynchronously to the caller;
 * - fsdp2_event_record marks "all work enqueued on the stream so far"; the event
 *   completes when that work has run; re-recording moves the mark;
 * - fsdp2_stream_wait_event makes later work on a stream wait until the event's most
 *   recent record (at the time of the call) has completed; an event never recorded is
 *   complete;
 * - query never blocks; synchronize blocks the caller.
 *
 * On cpu a stream is a worker thread draining a fixed-depth FIFO (FSDP2_CPU_STREAM_DEPTH
 * entries; enqueueing into a full queue blocks until there is room), and an event is a
 * position on a stream's counter of completed work. A thread that blocks without a
 * timeout until a stream reaches a position (synchronize, event synchronize, a wait on
 * the current stream) runs that stream's queued tasks itself while its worker is idle:
 * one runner at a time, in order. So a task may run on the waiting application thread;
 * host functions must not rely on which thread runs them. A worker with nothing queued
 * yields the core a few times (FSDP2_CPU_STREAM_SPIN) and then sleeps until an enqueue
 * wakes it, so an idle stream costs no CPU and a task enqueued to it starts within the
 * operating system's wake-up latency. A worker that is still yielding leaves a fresh
 * task to a waiter for FSDP2_CPU_STREAM_CLAIM_US (20 us); a task nobody waits for starts
 * that much later at most. Workers are SCHED_BATCH threads where the system allows it:
 * waking one does not preempt the enqueuing thread, so where every CPU is busy the task
 * starts when the scheduler next gives the worker a CPU, or runs on the enqueuing thread
 * if that thread waits for it first.
 * One exception, where ranks outnumber CPUs (FSDP2_CPU_STREAM_DEFER_WAKE, by default
 * once a shared-memory group of the process finds its host so): a worker whose recent
 * tasks were run by their waiters naps, and an enqueue leaves its wake-up to the
 * enqueuing thread's next stream or event call; a task whose thread makes no such call
 * starts when the nap ends (FSDP2_CPU_STREAM_NAP_US, 1 ms). The calling thread itself is the
 * "current stream" (fsdp2_stream_current): work enqueued there runs at once, inline,
 * and waiting on an event there blocks the caller. With FSDP2_CPU_STREAM_BLOCKING=on
 * (a debugging aid, as CUDA_LAUNCH_BLOCKING=1) an application thread's enqueue on a cpu
 * side stream returns once its task has run, with that task's failure; an enqueue from a
 * host function does not wait (its task may wait for the stream running the function).
 * On cuda they are CUDA streams (non
 * blocking) and events (no timing), and the current stream is the legacy default one.
 *
 * A host function must not enqueue on, synchronize or destroy the stream it runs on
 * (FSDP2_ERR_INVALID_STATE on cpu; CUDA forbids any CUDA call there).
 *
 * Errors inside asynchronous work (a failing host function) are kept on the stream
 * (the first one, with its message) and returned by fsdp2_stream_synchronize and
 * fsdp2_stream_query; later work still runs so nothing waiting on it hangs. */
#ifndef FSDP2_STREAM_H
#define FSDP2_STREAM_H

#include <stddef.h>

#include <fsdp2/device.h>
#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

typedef struct fsdp2_stream fsdp2_stream_t;
typedef struct fsdp2_event fsdp2_event_t;

/* A function run in stream order. On cpu it runs on the stream's worker, on a thread
 * waiting for the stream (see above), or inline on the current stream; on cuda through
 * cudaLaunchHostFunc. A non-success return
 * becomes the stream's error; set fsdp2_last_error's message with it by returning
 * through the library's error helpers, or it is reported by status name only. */
typedef fsdp2_status_t (*fsdp2_host_fn)(void *arg);

/* Creates a side stream on device (cpu or cuda:N). name is copied and used in logs
 * and thread names ("ag-copy-in"); may be NULL. Blocks (starts a thread on cpu). */
FSDP2_API fsdp2_status_t fsdp2_stream_create(fsdp2_device_t device, const char *name,
                                             fsdp2_stream_t **stream);

/* Waits for all work enqueued on stream, then destroys it. Safe with pending work
 * (the work completes first) as long as that work can complete. Returns the stream's
 * error if nobody synchronized for it (the stream is destroyed all the same). The current
 * stream cannot be destroyed. NULL is accepted and ignored. */
FSDP2_API fsdp2_status_t fsdp2_stream_destroy(fsdp2_stream_t *stream);

/* The calling thread's stream for device, owned by the library (do not destroy). */
FSDP2_API fsdp2_status_t fsdp2_stream_current(fsdp2_device_t device, fsdp2_stream_t **stream);

/* Device of a stream in *device. */
FSDP2_API fsdp2_status_t fsdp2_stream_device(const fsdp2_stream_t *stream,
                                             fsdp2_device_t *device);

/* Blocks until all work enqueued so far has run; returns the stream's first error. */
FSDP2_API fsdp2_status_t fsdp2_stream_synchronize(fsdp2_stream_t *stream);

/* FSDP2_SUCCESS when all enqueued work has run, FSDP2_ERR_NOT_READY while some is
 * pending, or the stream's first error. Never blocks. */
FSDP2_API fsdp2_status_t fsdp2_stream_query(fsdp2_stream_t *stream);

/* Later work on stream waits for event's latest record. Does not block the caller,
 * except on the cpu current stream where the caller is the one that waits. */
FSDP2_API fsdp2_status_t fsdp2_stream_wait_event(fsdp2_stream_t *stream, fsdp2_event_t *event);

/* Enqueues fn(arg) on stream. arg must stay valid until fn has run. */
FSDP2_API fsdp2_status_t fsdp2_stream_launch_host(fsdp2_stream_t *stream, fsdp2_host_fn fn,
                                                  void *arg);

/* Copies bytes from src to dst in stream order. Pointers may be on the stream's device
 * or on the host (cpu memory); async with respect to the caller. */
FSDP2_API fsdp2_status_t fsdp2_memcpy_async(void *dst, const void *src, size_t bytes,
                                            fsdp2_stream_t *stream);

FSDP2_API fsdp2_status_t fsdp2_event_create(fsdp2_device_t device, fsdp2_event_t **event);
/* Destroys an event. Waits already enqueued on it still see its record. NULL ignored. */
FSDP2_API fsdp2_status_t fsdp2_event_destroy(fsdp2_event_t *event);
FSDP2_API fsdp2_status_t fsdp2_event_record(fsdp2_event_t *event, fsdp2_stream_t *stream);
/* FSDP2_SUCCESS when complete, FSDP2_ERR_NOT_READY otherwise. Never blocks. */
FSDP2_API fsdp2_status_t fsdp2_event_query(fsdp2_event_t *event);
/* Blocks the caller until the event's latest record has completed. */
FSDP2_API fsdp2_status_t fsdp2_event_synchronize(fsdp2_event_t *event);
/* Like fsdp2_event_synchronize but gives up after timeout_ms with FSDP2_ERR_TIMEOUT. */
FSDP2_API fsdp2_status_t fsdp2_event_wait_timeout(fsdp2_event_t *event, long timeout_ms);

FSDP2_EXTERN_C_END

#endif
