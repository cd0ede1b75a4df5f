/* Launchers of the CUDA kernels behind the cuda device backend (cuda_device.c).
 *
 * Each enqueues its work on stream for the calling thread's current device (the caller
 * sets it), launches nothing for n == 0 / rows == 0, and returns cudaGetLastError()
 * after the launch: cudaSuccess, or the launch error (an unknown dtype gives
 * cudaErrorInvalidValue). Arguments are otherwise assumed valid: pointers on the
 * device, aligned to their element size, non-overlapping. Conversions and arithmetic
 * follow fsdp2/dtype.h and fsdp2/kernels.h bit for bit (see cuda_convert.h). */
#ifndef FSDP2_CUDA_KERNELS_H
#define FSDP2_CUDA_KERNELS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include <fsdp2/dtype.h>
#include <fsdp2/kernels.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = (dtype) value for i < n; the value is converted once, on the host. */
cudaError_t fsdp2_cuda_fill(void *dst, fsdp2_dtype_t dtype, size_t n, double value,
                            cudaStream_t stream);

/* y[i] = (y_dtype)(y[i] + alpha * x[i]) for i < n, in f32 when both dtypes are
 * f32/bf16/f16 and in f64 otherwise, rounded once. */
cudaError_t fsdp2_cuda_accumulate(void *y, fsdp2_dtype_t y_dtype, const void *x,
                                  fsdp2_dtype_t x_dtype, size_t n, double alpha,
                                  cudaStream_t stream);

/* The strided 2D copy with cast of fsdp2_chunk_copy_async. Same-dtype copies go to
 * the copy engines (cudaMemcpyAsync / cudaMemcpy2DAsync). */
cudaError_t fsdp2_cuda_chunk_copy(const fsdp2_chunk_copy_t *copy, cudaStream_t stream);

/* y[i] = x[i] / pre / post (fsdp2_cu_divide_elem) for i < n: a reduction over one
 * rank. dtype f32, f64, bf16 or f16; y may be x. */
cudaError_t fsdp2_cuda_divide(void *y, const void *x, fsdp2_dtype_t dtype, size_t n, double pre,
                              double post, cudaStream_t stream);

/* *acc (a device double) += sum of g[i]^2 as doubles (inf 0), or *acc = max(*acc, |g[i]|)
 * (inf 1, NaN kept: as bits, a NaN is above every other non-negative double) for i < n;
 * dtype f32 or f64. The order of the sum is the GPU's (blocks, then atomics). */
cudaError_t fsdp2_cuda_norm_share(const void *g, fsdp2_dtype_t dtype, size_t n, int inf,
                                  double *acc, cudaStream_t stream);

/* g[i] = g[i] * coef for i < n, in the dtype (f32: coef rounded to f32 first), as
 * clip_grad_norm scales cpu gradients. dtype f32 or f64. */
cudaError_t fsdp2_cuda_scale(void *g, fsdp2_dtype_t dtype, size_t n, double coef,
                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
