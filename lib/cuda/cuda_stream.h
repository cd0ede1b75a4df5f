/* What the CUDA module's other parts (the nccl backend, the entry points) need of the cuda
 * device backend. */
#ifndef FSDP2_CUDA_STREAM_H
#define FSDP2_CUDA_STREAM_H

#include <cuda_runtime_api.h>

#include <fsdp2/stream.h>

#include "core/device_ops.h"

/* The cuda device backend (cuda_device.c). */
extern const fsdp2_device_ops_t fsdp2_cuda_ops;

/* The CUDA stream behind a cuda fsdp2 stream (cudaStreamLegacy for a device's current
 * stream). The caller has checked that stream is on a cuda device. */
cudaStream_t fsdp2_cuda_stream_handle(const fsdp2_stream_t *stream);

#endif
