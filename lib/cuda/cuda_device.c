/* The cuda device backend: memory, streams, events, copies and kernels on CUDA device
 * `index`, behind fsdp2_cuda_ops (lib/core/device_ops.h).
 *
 * Every call makes `index` the calling thread's current device for its duration and
 * restores the previous one (as NCCL and PyTorch's device guards do), so the library
 * never changes which device an application's own CUDA calls go to. Side streams are
 * non-blocking CUDA streams; the current stream of a device is its legacy default
 * stream (one object per device, shared by all threads as CUDA shares it). Events have
 * timing disabled, which makes record and wait cheaper.
 *
 * A host function runs on a CUDA runtime thread, where nothing can be returned to the
 * caller: its first failure is kept on the stream object (an atomic compare-and-swap
 * decides which one is first) and reported by every later synchronize and query. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dlfcn.h>

#include <cuda_runtime_api.h>

#include "core/clock.h"
#include "core/device_ops.h"
#include "core/error.h"
#include "core/log_internal.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_optim.h"
#include "cuda/cuda_stream.h"

/* Devices with a current-stream object; more GPUs than this in one process are refused. */
#define CUDA_MAX_DEVICES 64
#define CUDA_STREAM_NAME_MAX 32
#define CUDA_HOST_ERROR_MAX 1024

/* Host functions waiting on one stream at most; a launcher past that waits for one to
 * finish, as a full cpu stream queue makes its producer wait. */
#define CUDA_HOST_RING 256

struct cuda_stream;

/* What a host function needs on the runtime thread: a slot of its stream's ring. */
typedef struct cuda_host_call {
    fsdp2_host_fn fn;
    void *arg;
    struct cuda_stream *stream;
} cuda_host_call_t;

typedef struct cuda_stream {
    struct fsdp2_stream base; /* first: the core sees a fsdp2_stream_t */
    /* Host functions run in stream order, so slot (n % CUDA_HOST_RING) of the n-th launch
     * is free again once `finished` passed it: no allocation per launch. */
    pthread_mutex_t launch_lock; /* one launcher at a time; never taken by the trampoline */
    pthread_mutex_t host_lock;   /* ring accounting only: never held across a CUDA call */
    pthread_cond_t host_done;
    uint64_t host_launched, host_finished; /* under host_lock */
    cuda_host_call_t host_calls[CUDA_HOST_RING];
    cudaStream_t handle;
    char name[CUDA_STREAM_NAME_MAX];
    atomic_int host_status;   /* first failing fsdp2_status_t of a host function, or 0 */
    atomic_int host_message_ready;
    atomic_int host_reported; /* a synchronize or query has returned host_status */
    char host_message[CUDA_HOST_ERROR_MAX];
} cuda_stream_t;

typedef struct cuda_event {
    struct fsdp2_event base;
    cudaEvent_t handle;
} cuda_event_t;


static pthread_once_t cuda_init_once = PTHREAD_ONCE_INIT;
static int cuda_count;
static cudaError_t cuda_count_error;
static char cuda_count_why[160]; /* what cuda_count_error means here, for the message */
static cuda_stream_t cuda_current_streams[CUDA_MAX_DEVICES];

static void cuda_stream_init(cuda_stream_t *s, int index, cudaStream_t handle, const char *name,
                             int is_current)
{
    s->base.ops = &fsdp2_cuda_ops;
    s->base.device.type = FSDP2_DEVICE_CUDA;
    s->base.device.index = index;
    s->base.is_current = is_current;
    s->handle = handle;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "");
    atomic_init(&s->host_status, FSDP2_SUCCESS);
    atomic_init(&s->host_message_ready, 0);
    atomic_init(&s->host_reported, 0);
    s->host_message[0] = '\0';
    pthread_mutex_init(&s->launch_lock, NULL);
    pthread_mutex_init(&s->host_lock, NULL);
    pthread_cond_init(&s->host_done, NULL);
    s->host_launched = s->host_finished = 0;
}

static void cuda_init(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        count = 0;
        FSDP2_LOG(INFO, INIT, "CUDA: no devices (cudaGetDeviceCount: %s: %s)",
                  cudaGetErrorName(err), cudaGetErrorString(err));
    } else {
        FSDP2_LOG(INFO, INIT, "CUDA: %d device(s)", count);
    }
    cuda_count = count;
    cuda_count_error = err;
    /* The runtime loads the driver library itself; when it is missing or too old, say
     * which, since the runtime's "insufficient driver" covers both. */
    if (err == cudaErrorInsufficientDriver) {
        void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!driver)
            driver = dlopen("libcuda.so.1", RTLD_LAZY);
        if (driver) {
            int version = 0, runtime = 0;
            (void)cudaDriverGetVersion(&version);
            (void)cudaRuntimeGetVersion(&runtime);
            (void)cudaGetLastError();
            snprintf(cuda_count_why, sizeof(cuda_count_why),
                     "the NVIDIA driver supports CUDA %d.%d, this module's runtime is %d.%d",
                     version / 1000, version % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
        } else {
            snprintf(cuda_count_why, sizeof(cuda_count_why),
                     "no NVIDIA driver: libcuda.so.1 cannot be loaded");
        }
    } else if (err == cudaErrorNoDevice) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(cuda_count_why, sizeof(cuda_count_why), "no GPU is visible%s%s%s",
                 visible ? " (CUDA_VISIBLE_DEVICES='" : "", visible ? visible : "",
                 visible ? "')" : "");
    }
    for (int i = 0; i < CUDA_MAX_DEVICES; i++)
        cuda_stream_init(&cuda_current_streams[i], i, cudaStreamLegacy, "current", 1);
}

static fsdp2_status_t cuda_check(int index)
{
    pthread_once(&cuda_init_once, cuda_init);
    if (cuda_count_error != cudaSuccess && cuda_count_why[0])
        return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE,
                           "cuda:%d not available: %s (cudaGetDeviceCount: %s: %s)", index,
                           cuda_count_why, cudaGetErrorName(cuda_count_error),
                           cudaGetErrorString(cuda_count_error));
    if (cuda_count_error != cudaSuccess)
        return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE,
                           "cuda:%d not available: cudaGetDeviceCount failed: %s: %s", index,
                           cudaGetErrorName(cuda_count_error),
                           cudaGetErrorString(cuda_count_error));
    if (index < 0 || index >= cuda_count)
        return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE,
                           "cuda:%d not available: this process sees %d CUDA device(s)", index,
                           cuda_count);
    if (index >= CUDA_MAX_DEVICES)
        return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE,
                           "cuda:%d not available: libfsdp2 supports %d devices per process",
                           index, CUDA_MAX_DEVICES);
    return FSDP2_SUCCESS;
}

/* Makes index the thread's current device; *prev is the device to restore, -1 if none. */
static fsdp2_status_t cuda_device_enter(int index, int *prev)
{
    int current = -1;
    *prev = -1;
    FSDP2_CUDA_CHECK(cudaGetDevice(&current));
    if (current != index) {
        FSDP2_CUDA_CHECK(cudaSetDevice(index));
        *prev = current;
    }
    return FSDP2_SUCCESS;
}

static void cuda_device_leave(int prev)
{
    if (prev >= 0)
        (void)cudaSetDevice(prev);
}

static cuda_stream_t *cuda_stream_of(fsdp2_stream_t *stream)
{
    return (cuda_stream_t *)stream;
}

static cuda_event_t *cuda_event_of(fsdp2_event_t *event)
{
    return (cuda_event_t *)event;
}

/* ---- memory ---------------------------------------------------------------------- */

static fsdp2_status_t cuda_alloc(int index, size_t bytes, void **ptr)
{
    *ptr = NULL;
    FSDP2_CHECK(cuda_check(index));
    if (bytes == 0)
        return FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(index, &prev));
    cudaError_t err = cudaMalloc(ptr, bytes);
    cuda_device_leave(prev);
    if (err == cudaSuccess)
        return FSDP2_SUCCESS;
    *ptr = NULL;
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY,
                           "cudaMalloc of %zu bytes on cuda:%d failed: %s", bytes, index,
                           cudaGetErrorString(err));
    }
    return fsdp2_cuda_status(err, "cudaMalloc", __FILE__, __LINE__);
}

static fsdp2_status_t cuda_free(int index, void *ptr)
{
    if (ptr == NULL)
        return FSDP2_SUCCESS;
    FSDP2_CHECK(cuda_check(index));
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(index, &prev));
    FSDP2_CUDA_CHECK_GOTO(cudaFree(ptr), status, cleanup);
cleanup:
    cuda_device_leave(prev);
    return status;
}

/* ---- streams --------------------------------------------------------------------- */

static fsdp2_status_t cuda_stream_create(int index, const char *name, fsdp2_stream_t **stream)
{
    *stream = NULL;
    FSDP2_CHECK(cuda_check(index));
    cuda_stream_t *s = malloc(sizeof *s);
    if (s == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "stream '%s' on cuda:%d: out of memory",
                           name ? name : "", index);
    fsdp2_status_t status = FSDP2_SUCCESS;
    cudaStream_t handle = NULL;
    int prev = -1;
    FSDP2_CHECK_GOTO(cuda_device_enter(index, &prev), status, cleanup);
    FSDP2_CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking), status,
                          cleanup);
    cuda_stream_init(s, index, handle, name, 0);
    *stream = &s->base;
    FSDP2_LOG(DEBUG, STREAM, "created stream '%s' on cuda:%d", s->name, index);
cleanup:
    cuda_device_leave(prev);
    if (status != FSDP2_SUCCESS)
        free(s);
    return status;
}

static fsdp2_status_t cuda_stream_host_error(cuda_stream_t *s);

static fsdp2_status_t cuda_stream_destroy(fsdp2_stream_t *stream)
{
    cuda_stream_t *s = cuda_stream_of(stream);
    if (stream->is_current)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "the current stream of cuda:%d cannot be destroyed",
                           stream->device.index);
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev = -1;
    FSDP2_CHECK_GOTO(cuda_device_enter(stream->device.index, &prev), status, cleanup);
    /* Host functions still queued point at s: they must have run before it is freed. */
    FSDP2_CUDA_CHECK_GOTO(cudaStreamSynchronize(s->handle), status, cleanup);
cleanup:; /* the stream is destroyed whatever failed before */
    cudaError_t err = cudaStreamDestroy(s->handle);
    if (err != cudaSuccess && status == FSDP2_SUCCESS)
        status = fsdp2_cuda_status(err, "cudaStreamDestroy(s->handle)", __FILE__, __LINE__);
    cuda_device_leave(prev);
    if (status == FSDP2_SUCCESS && !atomic_load(&s->host_reported))
        status = cuda_stream_host_error(s); /* an error nobody synchronized for */
    FSDP2_LOG(DEBUG, STREAM, "destroyed stream '%s' on cuda:%d", s->name, stream->device.index);
    pthread_cond_destroy(&s->host_done);
    pthread_mutex_destroy(&s->host_lock);
    pthread_mutex_destroy(&s->launch_lock);
    free(s);
    return status;
}

static fsdp2_status_t cuda_stream_current(int index, fsdp2_stream_t **stream)
{
    *stream = NULL;
    FSDP2_CHECK(cuda_check(index));
    *stream = &cuda_current_streams[index].base;
    return FSDP2_SUCCESS;
}

/* The stream's kept host-function error, with its message moved to this thread. */
static fsdp2_status_t cuda_stream_host_error(cuda_stream_t *s)
{
    fsdp2_status_t status = (fsdp2_status_t)atomic_load(&s->host_status);
    if (status == FSDP2_SUCCESS)
        return FSDP2_SUCCESS;
    atomic_store(&s->host_reported, 1);
    if (atomic_load_explicit(&s->host_message_ready, memory_order_acquire))
        fsdp2_error_set_message(s->host_message);
    else /* the failing host function is still writing its message */
        fsdp2_error(status, "host function on stream '%s' (cuda:%d) failed: %s", s->name,
                    s->base.device.index, fsdp2_status_name(status));
    return status;
}

static fsdp2_status_t cuda_stream_synchronize(fsdp2_stream_t *stream)
{
    cuda_stream_t *s = cuda_stream_of(stream);
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(stream->device.index, &prev));
    FSDP2_CUDA_CHECK_GOTO(cudaStreamSynchronize(s->handle), status, cleanup);
cleanup:
    cuda_device_leave(prev);
    FSDP2_CHECK(status);
    return cuda_stream_host_error(s);
}

static fsdp2_status_t cuda_stream_query(fsdp2_stream_t *stream)
{
    cuda_stream_t *s = cuda_stream_of(stream);
    int prev;
    FSDP2_CHECK(cuda_device_enter(stream->device.index, &prev));
    cudaError_t err = cudaStreamQuery(s->handle);
    cuda_device_leave(prev);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        /* An error kept from a finished host function is reported at once. */
        fsdp2_status_t host = cuda_stream_host_error(s);
        return host != FSDP2_SUCCESS ? host : FSDP2_ERR_NOT_READY;
    }
    if (err != cudaSuccess)
        return fsdp2_cuda_status(err, "cudaStreamQuery", __FILE__, __LINE__);
    return cuda_stream_host_error(s);
}

static fsdp2_status_t cuda_stream_wait_event(fsdp2_stream_t *stream, fsdp2_event_t *event)
{
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(stream->device.index, &prev));
    FSDP2_CUDA_CHECK_GOTO(
        cudaStreamWaitEvent(cuda_stream_of(stream)->handle, cuda_event_of(event)->handle, 0),
        status, cleanup);
cleanup:
    cuda_device_leave(prev);
    return status;
}

static void CUDART_CB cuda_host_trampoline(void *data)
{
    cuda_host_call_t call = *(cuda_host_call_t *)data;
    cuda_stream_t *s = call.stream;
    pthread_mutex_lock(&s->host_lock); /* the slot is copied out: hand it back */
    s->host_finished++;
    pthread_cond_signal(&s->host_done);
    pthread_mutex_unlock(&s->host_lock);
    /* Cleared so that a failure without a message of its own is not reported with an
     * older one left on this runtime thread. */
    fsdp2_error_set_message("");
    fsdp2_status_t status = call.fn(call.arg);
    if (status == FSDP2_SUCCESS)
        return;
    int expected = FSDP2_SUCCESS;
    if (!atomic_compare_exchange_strong(&s->host_status, &expected, (int)status))
        return; /* an earlier failure is kept */
    const char *message = fsdp2_last_error();
    if (message != NULL && message[0] != '\0')
        snprintf(s->host_message, sizeof s->host_message, "%s", message);
    else
        snprintf(s->host_message, sizeof s->host_message,
                 "host function on stream '%s' (cuda:%d) failed: %s", s->name,
                 s->base.device.index, fsdp2_status_name(status));
    atomic_store_explicit(&s->host_message_ready, 1, memory_order_release);
    FSDP2_LOG(DEBUG, STREAM, "stream '%s' (cuda:%d): %s", s->name, s->base.device.index,
              s->host_message);
}

static fsdp2_status_t cuda_stream_launch_host(fsdp2_stream_t *stream, fsdp2_host_fn fn, void *arg)
{
    cuda_stream_t *s = cuda_stream_of(stream);
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev = -1;
    FSDP2_CHECK(cuda_device_enter(stream->device.index, &prev));
    /* cudaLaunchHostFunc can block while the stream's launch queue is full; holding
     * host_lock then would stop the trampoline ahead of us from freeing its slot. So the
     * slot is claimed under host_lock, and the launch happens under launch_lock only. */
    pthread_mutex_lock(&s->launch_lock);
    pthread_mutex_lock(&s->host_lock);
    while (s->host_launched - s->host_finished >= CUDA_HOST_RING)
        pthread_cond_wait(&s->host_done, &s->host_lock);
    cuda_host_call_t *call = &s->host_calls[s->host_launched % CUDA_HOST_RING];
    *call = (cuda_host_call_t){fn, arg, s};
    s->host_launched++; /* before the launch: its trampoline may finish before we return */
    pthread_mutex_unlock(&s->host_lock);
    cudaError_t err = cudaLaunchHostFunc(s->handle, cuda_host_trampoline, call);
    if (err != cudaSuccess) {
        pthread_mutex_lock(&s->host_lock);
        s->host_launched--; /* nothing was queued; launchers are serialised */
        pthread_mutex_unlock(&s->host_lock);
        status = fsdp2_cuda_status(err, "cudaLaunchHostFunc", __FILE__, __LINE__);
    }
    pthread_mutex_unlock(&s->launch_lock);
    cuda_device_leave(prev);
    return status;
}

/* ---- events ---------------------------------------------------------------------- */

static fsdp2_status_t cuda_event_create(int index, fsdp2_event_t **event)
{
    *event = NULL;
    FSDP2_CHECK(cuda_check(index));
    cuda_event_t *e = malloc(sizeof *e);
    if (e == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "event on cuda:%d: out of memory", index);
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev = -1;
    FSDP2_CHECK_GOTO(cuda_device_enter(index, &prev), status, cleanup);
    FSDP2_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&e->handle, cudaEventDisableTiming), status,
                          cleanup);
    e->base.ops = &fsdp2_cuda_ops;
    e->base.device.type = FSDP2_DEVICE_CUDA;
    e->base.device.index = index;
    *event = &e->base;
cleanup:
    cuda_device_leave(prev);
    if (status != FSDP2_SUCCESS)
        free(e);
    return status;
}

static fsdp2_status_t cuda_event_destroy(fsdp2_event_t *event)
{
    cuda_event_t *e = cuda_event_of(event);
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev = -1;
    FSDP2_CHECK_GOTO(cuda_device_enter(event->device.index, &prev), status, cleanup);
    /* Safe with work pending: CUDA releases the event once its record has completed. */
    FSDP2_CUDA_CHECK_GOTO(cudaEventDestroy(e->handle), status, cleanup);
cleanup:
    cuda_device_leave(prev);
    free(e);
    return status;
}

static fsdp2_status_t cuda_event_record(fsdp2_event_t *event, fsdp2_stream_t *stream)
{
    if (event->device.index != stream->device.index)
        return fsdp2_error(FSDP2_ERR_DEVICE_MISMATCH,
                           "event of cuda:%d recorded on a stream of cuda:%d",
                           event->device.index, stream->device.index);
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(stream->device.index, &prev));
    FSDP2_CUDA_CHECK_GOTO(cudaEventRecord(cuda_event_of(event)->handle, cuda_stream_of(stream)->handle),
                          status, cleanup);
cleanup:
    cuda_device_leave(prev);
    return status;
}

static fsdp2_status_t cuda_event_query(fsdp2_event_t *event)
{
    cudaError_t err = cudaEventQuery(cuda_event_of(event)->handle);
    if (err == cudaSuccess)
        return FSDP2_SUCCESS;
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return FSDP2_ERR_NOT_READY;
    }
    return fsdp2_cuda_status(err, "cudaEventQuery", __FILE__, __LINE__);
}

/* Polls rather than blocking in cudaEventSynchronize, which cannot time out. The
 * sleep starts short (a collective that is about to finish costs little latency) and
 * doubles up to 1 ms (a hung peer costs little CPU). */
static fsdp2_status_t cuda_event_wait_timeout(fsdp2_event_t *event, long timeout_ms)
{
    cuda_event_t *e = cuda_event_of(event);
    /* A timeout beyond ~100 days is forever (and would overflow the deadline below). */
    if (timeout_ms < 0 || timeout_ms > 8640000000L) {
        FSDP2_CUDA_CHECK(cudaEventSynchronize(e->handle));
        return FSDP2_SUCCESS;
    }
    uint64_t deadline = (uint64_t)fsdp2_now_ns() + (uint64_t)timeout_ms * 1000000u;
    long sleep_ns = 2000;
    for (;;) {
        fsdp2_status_t status = cuda_event_query(event);
        if (status != FSDP2_ERR_NOT_READY)
            return status;
        uint64_t now = (uint64_t)fsdp2_now_ns();
        if (now >= deadline)
            return fsdp2_error(FSDP2_ERR_TIMEOUT, "event on cuda:%d not complete after %ld ms",
                               event->device.index, timeout_ms);
        uint64_t left = deadline - now;
        struct timespec ts = {0, (uint64_t)sleep_ns < left ? sleep_ns : (long)left};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000)
            sleep_ns *= 2;
    }
}

/* ---- copies and kernels ------------------------------------------------------------ */

static fsdp2_status_t cuda_memcpy_async(void *dst, const void *src, size_t bytes,
                                        fsdp2_stream_t *stream)
{
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(stream->device.index, &prev));
    FSDP2_CUDA_CHECK_GOTO(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream_of(stream)->handle),
        status, cleanup);
cleanup:
    cuda_device_leave(prev);
    return status;
}

/* Kernels access elements with their natural alignment; a misaligned pointer would
 * fault on the device later, so it is refused now. */
static fsdp2_status_t cuda_require_aligned(const void *ptr, fsdp2_dtype_t dtype, const char *what)
{
    size_t size = 0;
    FSDP2_CHECK(fsdp2_dtype_size(dtype, &size));
    if ((uintptr_t)ptr % size != 0)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "%s %p is not aligned to its %s elements (%zu bytes), which CUDA "
                           "kernels need",
                           what, ptr, fsdp2_dtype_name(dtype), size);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t cuda_fill(void *dst, fsdp2_dtype_t dtype, size_t n, double value,
                                fsdp2_stream_t *stream)
{
    FSDP2_CHECK(cuda_require_aligned(dst, dtype, "fill destination"));
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(stream->device.index, &prev));
    FSDP2_CUDA_CHECK_GOTO(fsdp2_cuda_fill(dst, dtype, n, value, cuda_stream_of(stream)->handle),
                          status, cleanup);
cleanup:
    cuda_device_leave(prev);
    return status;
}

static fsdp2_status_t cuda_accumulate(void *y, fsdp2_dtype_t y_dtype, const void *x,
                                      fsdp2_dtype_t x_dtype, size_t n, double alpha,
                                      fsdp2_stream_t *stream)
{
    FSDP2_CHECK(cuda_require_aligned(y, y_dtype, "accumulate destination"));
    FSDP2_CHECK(cuda_require_aligned(x, x_dtype, "accumulate source"));
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(stream->device.index, &prev));
    FSDP2_CUDA_CHECK_GOTO(fsdp2_cuda_accumulate(y, y_dtype, x, x_dtype, n, alpha,
                                                cuda_stream_of(stream)->handle),
                          status, cleanup);
cleanup:
    cuda_device_leave(prev);
    return status;
}

static fsdp2_status_t cuda_chunk_copy(const fsdp2_chunk_copy_t *copy, fsdp2_stream_t *stream)
{
    /* Same-dtype copies go to cudaMemcpy*, which needs no alignment. */
    if (copy->dst_dtype != copy->src_dtype) {
        FSDP2_CHECK(cuda_require_aligned(copy->dst, copy->dst_dtype, "chunk copy destination"));
        FSDP2_CHECK(cuda_require_aligned(copy->src, copy->src_dtype, "chunk copy source"));
    }
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(stream->device.index, &prev));
    FSDP2_CUDA_CHECK_GOTO(fsdp2_cuda_chunk_copy(copy, cuda_stream_of(stream)->handle), status,
                          cleanup);
cleanup:
    cuda_device_leave(prev);
    return status;
}

static fsdp2_status_t cuda_pci_bus_id(int index, char *buf, size_t len)
{
    FSDP2_CHECK(cuda_check(index));
    FSDP2_CUDA_CHECK(cudaDeviceGetPCIBusId(buf, (int)len, index));
    return FSDP2_SUCCESS;
}

const fsdp2_device_ops_t fsdp2_cuda_ops = {
    .name = "cuda",
    .check = cuda_check,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_current = cuda_stream_current,
    .stream_synchronize = cuda_stream_synchronize,
    .stream_query = cuda_stream_query,
    .stream_wait_event = cuda_stream_wait_event,
    .stream_launch_host = cuda_stream_launch_host,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_wait_timeout = cuda_event_wait_timeout,
    .memcpy_async = cuda_memcpy_async,
    .fill = cuda_fill,
    .accumulate = cuda_accumulate,
    .chunk_copy = cuda_chunk_copy,
    .pci_bus_id = cuda_pci_bus_id,
};

cudaStream_t fsdp2_cuda_stream_handle(const fsdp2_stream_t *stream)
{
    return ((const cuda_stream_t *)stream)->handle;
}

fsdp2_status_t fsdp2_cuda_optim_step(int index, const optim_coeffs_t *c, fsdp2_dtype_t dtype,
                                     const void *shards, const void *chunks, size_t nchunks)
{
    if (nchunks == 0)
        return FSDP2_SUCCESS;
    int prev;
    FSDP2_CHECK(cuda_device_enter(index, &prev));
    cudaError_t err = fsdp2_cuda_optim_update(c, dtype, shards, chunks, nchunks,
                                              cuda_current_streams[index].handle);
    cuda_device_leave(prev);
    if (err != cudaSuccess)
        return fsdp2_cuda_status(err, "fsdp2_cuda_optim_update", __FILE__, __LINE__);
    return FSDP2_SUCCESS;
}

static pthread_mutex_t cuda_scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static double *cuda_scratch_of[CUDA_MAX_DEVICES];

fsdp2_status_t fsdp2_cuda_scratch(int index, double **scratch)
{
    FSDP2_CHECK(cuda_check(index));
    fsdp2_status_t status = FSDP2_SUCCESS;
    pthread_mutex_lock(&cuda_scratch_lock);
    if (!cuda_scratch_of[index]) {
        fsdp2_device_t dev = {FSDP2_DEVICE_CUDA, index};
        status = fsdp2_device_alloc(dev, FSDP2_CUDA_SCRATCH, (void **)&cuda_scratch_of[index]);
    }
    *scratch = cuda_scratch_of[index];
    pthread_mutex_unlock(&cuda_scratch_lock);
    return status;
}

fsdp2_status_t fsdp2_cuda_norm_shares(int index, fsdp2_tensor_t *const *grads, size_t count,
                                      int inf, double *share)
{
    int prev;
    FSDP2_CHECK(cuda_device_enter(index, &prev));
    cudaStream_t s = cuda_current_streams[index].handle;
    fsdp2_status_t status = FSDP2_SUCCESS;
    FSDP2_CUDA_CHECK_GOTO(cudaMemsetAsync(share, 0, sizeof(double), s), status, cleanup);
    for (size_t i = 0; i < count; i++)
        FSDP2_CUDA_CHECK_GOTO(fsdp2_cuda_norm_share(grads[i]->data, grads[i]->dtype,
                                                    (size_t)grads[i]->numel, inf, share, s),
                              status, cleanup);
cleanup:
    cuda_device_leave(prev);
    return status;
}

fsdp2_status_t fsdp2_cuda_scale_all(int index, fsdp2_tensor_t *const *grads, size_t count,
                                    double coef)
{
    int prev;
    FSDP2_CHECK(cuda_device_enter(index, &prev));
    cudaStream_t s = cuda_current_streams[index].handle;
    fsdp2_status_t status = FSDP2_SUCCESS;
    for (size_t i = 0; i < count; i++)
        FSDP2_CUDA_CHECK_GOTO(fsdp2_cuda_scale(grads[i]->data, grads[i]->dtype,
                                               (size_t)grads[i]->numel, coef, s),
                              status, cleanup);
cleanup:
    cuda_device_leave(prev);
    return status;
}
