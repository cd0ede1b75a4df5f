/* Kernel entry points: validate everything here, so a kernel that was accepted cannot
 * fail on the stream, then dispatch to the backend. */
#include <stdint.h>

#include "core/device_ops.h"
#include "core/error.h"
#include "core/fault.h"

static fsdp2_status_t check_dtype(fsdp2_dtype_t dtype, const char *what, size_t *bytes)
{
    if (fsdp2_dtype_size(dtype, bytes) != FSDP2_SUCCESS)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "%s dtype %d is not a valid fsdp2_dtype_t",
                           what, (int)dtype);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_float(fsdp2_dtype_t dtype, const char *what)
{
    int is_float = 0;
    size_t bytes;
    FSDP2_CHECK(check_dtype(dtype, what, &bytes));
    fsdp2_dtype_is_float(dtype, &is_float);
    FSDP2_ARG_CHECK(is_float, "%s dtype %s is not floating point", what, fsdp2_dtype_name(dtype));
    return FSDP2_SUCCESS;
}

/* Byte span [*begin, *end) touched by rows x cols with a row stride, overflow checked. */
static fsdp2_status_t span(const void *base, size_t elem, size_t stride, size_t rows,
                           size_t cols, uintptr_t *begin, uintptr_t *end)
{
    size_t last_row, bytes;
    if (__builtin_mul_overflow(rows - 1, stride, &last_row) ||
        __builtin_add_overflow(last_row, cols, &bytes) ||
        __builtin_mul_overflow(bytes, elem, &bytes) ||
        __builtin_add_overflow((uintptr_t)base, bytes, end))
        return fsdp2_error(FSDP2_ERR_OVERFLOW,
                           "chunk copy of %zu rows x %zu cols with stride %zu overflows", rows,
                           cols, stride);
    *begin = (uintptr_t)base;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_fill_async(void *dst, fsdp2_dtype_t dtype, size_t n, double value,
                                fsdp2_stream_t *stream)
{
    size_t bytes;
    FSDP2_ARG_CHECK(stream, "stream is NULL");
    FSDP2_CHECK(check_dtype(dtype, "fill", &bytes));
    if (n == 0)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(dst, "fill: dst is NULL with n=%zu", n);
    if (fsdp2_fault_hit(FAULT_ENQUEUE))
        return fsdp2_fault_error(FAULT_ENQUEUE, "fill");
    return stream->ops->fill(dst, dtype, n, value, stream);
}

fsdp2_status_t fsdp2_chunk_copy_async(const fsdp2_chunk_copy_t *c, fsdp2_stream_t *stream)
{
    size_t db, sb;
    FSDP2_ARG_CHECK(c && stream, "copy or stream is NULL");
    FSDP2_CHECK(check_dtype(c->dst_dtype, "destination", &db));
    FSDP2_CHECK(check_dtype(c->src_dtype, "source", &sb));
    if (c->rows == 0 || c->cols == 0)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(c->dst && c->src, "chunk copy: dst=%p or src=%p is NULL", c->dst, c->src);
    FSDP2_ARG_CHECK(c->dst_stride >= c->cols && c->src_stride >= c->cols,
                    "chunk copy: strides (dst %zu, src %zu) must be >= cols %zu", c->dst_stride,
                    c->src_stride, c->cols);
    uintptr_t d0 = 0, d1 = 0, s0 = 0, s1 = 0;
    FSDP2_CHECK(span(c->dst, db, c->dst_stride, c->rows, c->cols, &d0, &d1));
    FSDP2_CHECK(span(c->src, sb, c->src_stride, c->rows, c->cols, &s0, &s1));
    FSDP2_ARG_CHECK(d1 <= s0 || s1 <= d0,
                    "chunk copy: destination [%p, +%zu) overlaps source [%p, +%zu)", c->dst,
                    (size_t)(d1 - d0), c->src, (size_t)(s1 - s0));
    if (fsdp2_fault_hit(FAULT_ENQUEUE))
        return fsdp2_fault_error(FAULT_ENQUEUE, "chunk_copy");
    return stream->ops->chunk_copy(c, stream);
}

fsdp2_status_t fsdp2_cast_async(void *dst, fsdp2_dtype_t dst_dtype, const void *src,
                                fsdp2_dtype_t src_dtype, size_t n, fsdp2_stream_t *stream)
{
    fsdp2_chunk_copy_t c = {dst, dst_dtype, n, src, src_dtype, n, 1, n};
    return fsdp2_chunk_copy_async(&c, stream);
}

fsdp2_status_t fsdp2_accumulate_async(void *y, fsdp2_dtype_t y_dtype, const void *x,
                                      fsdp2_dtype_t x_dtype, size_t n, double alpha,
                                      fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(stream, "stream is NULL");
    FSDP2_CHECK(check_float(y_dtype, "accumulate destination"));
    FSDP2_CHECK(check_float(x_dtype, "accumulate source"));
    if (n == 0)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(y && x, "accumulate: y=%p or x=%p is NULL with n=%zu", y, x, n);
    size_t yb = 0, xb = 0;
    fsdp2_dtype_size(y_dtype, &yb);
    fsdp2_dtype_size(x_dtype, &xb);
    uintptr_t y0 = (uintptr_t)y, x0 = (uintptr_t)x;
    int overlap = y0 < x0 + n * xb && x0 < y0 + n * yb;
    FSDP2_ARG_CHECK(!overlap || (y0 == x0 && y_dtype == x_dtype),
                    "accumulate: y [%p, +%zu) overlaps x [%p, +%zu) (only y == x is allowed)", y,
                    n * yb, x, n * xb);
    if (fsdp2_fault_hit(FAULT_ENQUEUE))
        return fsdp2_fault_error(FAULT_ENQUEUE, "accumulate");
    return stream->ops->accumulate(y, y_dtype, x, x_dtype, n, alpha, stream);
}

fsdp2_status_t fsdp2_axpy_async(void *y, const void *x, fsdp2_dtype_t dtype, size_t n,
                                double alpha, fsdp2_stream_t *stream)
{
    return fsdp2_accumulate_async(y, dtype, x, dtype, n, alpha, stream);
}
