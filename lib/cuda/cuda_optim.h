/* The optimizers' update rules on cuda shards (lib/optim): every shard of one dtype in
 * one launch (a multi-tensor kernel), with the host rules' arithmetic (update_rules_impl.h)
 * bit for bit: the same op order in the shard's dtype, products and sums rounded one by
 * one (never fused), correctly rounded division and square root. */
#ifndef FSDP2_CUDA_OPTIM_H
#define FSDP2_CUDA_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_module.h"
#include "optim/optim_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Chunks needed for shards of these sizes (to size the table). */
size_t fsdp2_cuda_optim_chunks(const optim_shard_t *shards, size_t count);
/* Fills chunks[0 .. fsdp2_cuda_optim_chunks(shards, count)) (host memory). */
void fsdp2_cuda_optim_fill_chunks(const optim_shard_t *shards, size_t count,
                                  fsdp2_cuda_optim_chunk_t *chunks);

/* One step of rule c->kind over the shards of dtype (f32 or f64) listed in device memory:
 * shards (the table, device pointers inside) and chunks (nchunks entries), enqueued on
 * stream for the current device. */
cudaError_t fsdp2_cuda_optim_update(const optim_coeffs_t *c, fsdp2_dtype_t dtype,
                                    const optim_shard_t *shards,
                                    const fsdp2_cuda_optim_chunk_t *chunks, size_t nchunks,
                                    cudaStream_t stream);

#ifdef __cplusplus
}

#else
#include <fsdp2/status.h>

#include <fsdp2/tensor.h>

/* fsdp2_cuda_optim_update on the current stream of cuda:index (lib/cuda/cuda_device.c),
 * with the CUDA error as a status. shards and chunks are the device tables. */
fsdp2_status_t fsdp2_cuda_optim_step(int index, const optim_coeffs_t *c, fsdp2_dtype_t dtype,
                                     const void *shards, const void *chunks, size_t nchunks);

/* The scratch of cuda:index, allocated at the first call (through the device allocator,
 * so counted) and kept for the process. */
fsdp2_status_t fsdp2_cuda_scratch(int index, double **scratch);

/* *share (device memory) = the 2-norm's sum of squares (inf 0) or the inf-norm's max
 * |g| (inf 1) over the count f32/f64 tensors on cuda:index, on its current stream. */
fsdp2_status_t fsdp2_cuda_norm_shares(int index, fsdp2_tensor_t *const *grads, size_t count,
                                      int inf, double *share);

/* Every tensor scaled by coef in place (fsdp2_cuda_scale), on the current stream. */
fsdp2_status_t fsdp2_cuda_scale_all(int index, fsdp2_tensor_t *const *grads, size_t count,
                                    double coef);
#endif

#endif
