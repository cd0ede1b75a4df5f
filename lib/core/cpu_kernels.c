/* cpu kernels: fill, accumulate (axpy with cast), strided chunk copy with cast.
 *
 * Accumulate computes in f32 when both sides are f32/bf16/f16 and in f64 otherwise,
 * as y + (alpha * x) without fused multiply-add (C11 mode keeps contraction off), then
 * rounds once into y's dtype: the CUDA kernels use the same expression so both devices
 * give the same bits. */
#include <string.h>

#include "core/cpu_kernels.h"
#include "core/dtype_convert.h"

static size_t elem_size(fsdp2_dtype_t t)
{
    size_t bytes = 0;
    fsdp2_dtype_size(t, &bytes);
    return bytes;
}

void fsdp2_cpu_fill(void *dst, fsdp2_dtype_t dtype, size_t n, double value)
{
    unsigned char elem[8];
    store_from_f64(elem, dtype, 0, value);
    size_t bytes = elem_size(dtype);
    int uniform = 1; /* every byte the same (zero, most often): memset's wider stores */
    for (size_t i = 1; i < bytes; i++)
        uniform = uniform && elem[i] == elem[0];
    if (uniform) {
        memset(dst, elem[0], n * bytes);
        return;
    }
    switch (bytes) {
    case 2: {
        uint16_t v, *d = dst;
        memcpy(&v, elem, 2);
        for (size_t i = 0; i < n; i++)
            d[i] = v;
        break;
    }
    case 4: {
        uint32_t v, *d = dst;
        memcpy(&v, elem, 4);
        for (size_t i = 0; i < n; i++)
            d[i] = v;
        break;
    }
    default: {
        uint64_t v, *d = dst;
        memcpy(&v, elem, 8);
        for (size_t i = 0; i < n; i++)
            d[i] = v;
        break;
    }
    }
}

static int is_f32_class(fsdp2_dtype_t t)
{
    return t == FSDP2_F32 || t == FSDP2_BF16 || t == FSDP2_F16;
}

static float load_f32(const void *p, fsdp2_dtype_t t, size_t i)
{
    switch (t) {
    case FSDP2_BF16: return cvt_bf16_to_f32(((const uint16_t *)p)[i]);
    case FSDP2_F16: return cvt_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void store_f32(void *p, fsdp2_dtype_t t, size_t i, float v)
{
    switch (t) {
    case FSDP2_BF16: ((uint16_t *)p)[i] = cvt_f32_to_bf16(v); break;
    case FSDP2_F16: ((uint16_t *)p)[i] = cvt_f32_to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

FSDP2_VECTOR_CLONES
void fsdp2_cpu_accumulate(void *y, fsdp2_dtype_t y_dtype, const void *x, fsdp2_dtype_t x_dtype,
                          size_t n, double alpha)
{
    if (y_dtype == FSDP2_F32 && x_dtype == FSDP2_F32) {
        float a = (float)alpha, *yy = y;
        const float *xx = x;
        for (size_t i = 0; i < n; i++)
            yy[i] = yy[i] + a * xx[i];
    } else if (y_dtype == FSDP2_F32 && x_dtype == FSDP2_BF16) {
        float a = (float)alpha, *yy = y;
        const uint16_t *xx = x;
        for (size_t i = 0; i < n; i++)
            yy[i] = yy[i] + a * cvt_bf16_to_f32(xx[i]);
    } else if (y_dtype == FSDP2_F64 && x_dtype == FSDP2_F64) {
        double *yy = y;
        const double *xx = x;
        for (size_t i = 0; i < n; i++)
            yy[i] = yy[i] + alpha * xx[i];
    } else if (is_f32_class(y_dtype) && is_f32_class(x_dtype)) {
        float a = (float)alpha;
        for (size_t i = 0; i < n; i++)
            store_f32(y, y_dtype, i, load_f32(y, y_dtype, i) + a * load_f32(x, x_dtype, i));
    } else {
        for (size_t i = 0; i < n; i++)
            store_from_f64(y, y_dtype, i, load_f64(y, y_dtype, i) + alpha * load_f64(x, x_dtype, i));
    }
}

void fsdp2_cpu_chunk_copy(const fsdp2_chunk_copy_t *c)
{
    size_t db = elem_size(c->dst_dtype), sb = elem_size(c->src_dtype);
    if (c->dst_stride == c->cols && c->src_stride == c->cols) {
        fsdp2_convert_unchecked(c->dst, c->dst_dtype, c->src, c->src_dtype, c->rows * c->cols);
        return;
    }
    for (size_t r = 0; r < c->rows; r++)
        fsdp2_convert_unchecked((char *)c->dst + r * c->dst_stride * db, c->dst_dtype,
                                (const char *)c->src + r * c->src_stride * sb, c->src_dtype,
                                c->cols);
}
