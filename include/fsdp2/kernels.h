/* Small kernels, enqueued on a stream: the data movement FSDP needs around its
 * collectives (copy-in with cast, copy-out, chunk_cat, gradient accumulation).
 *
 * All take element counts, not bytes, and run asynchronously in stream order on the
 * stream's device (pointers must be addressable there: host memory for cpu, device
 * memory for cuda). Arguments are validated when enqueued, so an accepted kernel cannot
 * fail later. Conversions follow fsdp2/dtype.h. Arithmetic on bf16/f16 is done in f32
 * and rounded once per element. */
#ifndef FSDP2_KERNELS_H
#define FSDP2_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/dtype.h>
#include <fsdp2/export.h>
#include <fsdp2/status.h>
#include <fsdp2/stream.h>

FSDP2_EXTERN_C_BEGIN

/* dst[i] = value (converted to dtype) for i < n. */
FSDP2_API fsdp2_status_t fsdp2_fill_async(void *dst, fsdp2_dtype_t dtype, size_t n,
                                          double value, fsdp2_stream_t *stream);

/* dst[i] = (dst_dtype) src[i] for i < n. Same dtype is a plain copy. */
FSDP2_API fsdp2_status_t fsdp2_cast_async(void *dst, fsdp2_dtype_t dst_dtype, const void *src,
                                          fsdp2_dtype_t src_dtype, size_t n,
                                          fsdp2_stream_t *stream);

/* y[i] += alpha * x[i] for i < n, x and y of the same floating dtype. */
FSDP2_API fsdp2_status_t fsdp2_axpy_async(void *y, const void *x, fsdp2_dtype_t dtype, size_t n,
                                          double alpha, fsdp2_stream_t *stream);

/* y[i] = (y_dtype)((float-or-double) y[i] + alpha * x[i]): accumulates x of one dtype
 * into y of another (bf16 gradients into f32 shards). Both floating. */
FSDP2_API fsdp2_status_t fsdp2_accumulate_async(void *y, fsdp2_dtype_t y_dtype, const void *x,
                                                fsdp2_dtype_t x_dtype, size_t n, double alpha,
                                                fsdp2_stream_t *stream);

/* A strided 2D block copy with cast, the shape of FSDP's chunk copies:
 * for r < rows, c < cols: dst[r * dst_stride + c] = (dst_dtype) src[r * src_stride + c].
 * Strides are in elements of their own dtype and must be >= cols. Source and
 * destination regions must not overlap. */
typedef struct fsdp2_chunk_copy {
    void *dst;
    fsdp2_dtype_t dst_dtype;
    size_t dst_stride;
    const void *src;
    fsdp2_dtype_t src_dtype;
    size_t src_stride;
    size_t rows;
    size_t cols;
} fsdp2_chunk_copy_t;

FSDP2_API fsdp2_status_t fsdp2_chunk_copy_async(const fsdp2_chunk_copy_t *copy,
                                                fsdp2_stream_t *stream);

FSDP2_EXTERN_C_END

#endif
