/* What other CUDA-linked parts of the library (the nccl backend) need of the cuda device
 * backend's streams. */
#ifndef FSDP2_CUDA_STREAM_H
#define FSDP2_CUDA_STREAM_H

#include <cuda_runtime_api.h>

#include <fsdp2/stream.h>

/* The CUDA stream behind a cuda fsdp2 stream (cudaStreamLegacy for a device's current
 * stream). The caller has checked that stream is on a cuda device. */
cudaStream_t fsdp2_cuda_stream_handle(const fsdp2_stream_t *stream);

#endif
