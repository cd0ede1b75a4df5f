/* FSDP2_CUDA_CHECK: turns a failing CUDA runtime call into FSDP2_ERR_BACKEND with a
 * message naming the call and CUDA's error name and string, e.g.
 * "cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking) failed
 * (lib/cuda/cuda_device.c:212): cudaErrorMemoryAllocation: out of memory".
 *
 * The runtime also remembers a non-sticky error as the thread's "last error", where a
 * later cudaGetLastError() (the kernel launchers' check) would find it again; reporting
 * an error therefore clears it. Sticky errors (a faulting kernel) cannot be cleared
 * and keep failing every later call, which is what they should do. */
#ifndef FSDP2_CUDA_CHECK_H
#define FSDP2_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "core/error.h"

static inline fsdp2_status_t fsdp2_cuda_status(cudaError_t err, const char *call,
                                               const char *file, int line)
{
    (void)cudaGetLastError();
    return fsdp2_error(FSDP2_ERR_BACKEND, "%s failed (%s:%d): %s: %s", call, file, line,
                       cudaGetErrorName(err), cudaGetErrorString(err));
}

#define FSDP2_CUDA_CHECK(call)                                                  \
    do {                                                                        \
        cudaError_t fsdp2_cuda_e_ = (call);                                     \
        if (fsdp2_cuda_e_ != cudaSuccess)                                       \
            return fsdp2_cuda_status(fsdp2_cuda_e_, #call, __FILE__, __LINE__); \
    } while (0)

/* Keeps the first error, as FSDP2_CHECK_GOTO does: a later failure on the way to the
 * cleanup label neither replaces the status nor its message. */
#define FSDP2_CUDA_CHECK_GOTO(call, status, label)                                       \
    do {                                                                                 \
        cudaError_t fsdp2_cuda_e_ = (call);                                              \
        if (fsdp2_cuda_e_ != cudaSuccess) {                                              \
            if ((status) == FSDP2_SUCCESS)                                               \
                (status) = fsdp2_cuda_status(fsdp2_cuda_e_, #call, __FILE__, __LINE__);  \
            else                                                                         \
                (void)cudaGetLastError();                                                \
            goto label;                                                                  \
        }                                                                                \
    } while (0)

#endif
