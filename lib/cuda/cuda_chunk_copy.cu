/* The strided chunk copy with cast of the cuda device backend, for every pair of the 7
 * dtypes (cuda_kernels.h; how the kernels are built: cuda_kernels.cu; which pairs have
 * vector kernels: cuda_pack.cuh). The module's .cu files compile as one translation
 * unit (lib/meson.build), so their anonymous namespaces share one scope. */
#include "cuda/cuda_kernels.h"

#include <climits>
#include <cstring>

#include "cuda/cuda_convert.h"
#include "cuda/cuda_pack.cuh"

namespace {

/* An element per thread; <D, S> a floating pair, or <kAnyDtype, kAnyDtype> for any pair
 * given at run time as dd and sd (cuda_kernels.cu's accumulate_kernel). */
template <fsdp2_dtype_t D, fsdp2_dtype_t S>
__global__ void chunk_copy_kernel(fsdp2_dtype_t dd, void *__restrict__ dst, size_t dst_stride,
                                  fsdp2_dtype_t sd, const void *__restrict__ src,
                                  size_t src_stride, size_t rows, size_t cols)
{
    size_t col_stride = (size_t)gridDim.x * blockDim.x;
    size_t col0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
        size_t d = r * dst_stride;
        size_t s = r * src_stride;
        for (size_t c = col0; c < cols; c += col_stride)
            fsdp2_cu_convert_elem(D == kAnyDtype ? dd : D, dst, d + c,
                                  S == kAnyDtype ? sd : S, src, s + c);
    }
}

/* The chunk copy in packs: per row, elements [head, head + packs * kPack) a pack per
 * thread, the head and the tail (fewer than kPack each) an element per thread. */
template <fsdp2_dtype_t D, fsdp2_dtype_t S>
__global__ void chunk_copy_vec_kernel(char *__restrict__ dst, size_t dst_pitch,
                                      const char *__restrict__ src, size_t src_pitch,
                                      size_t rows, size_t cols, size_t head)
{
    constexpr size_t kD = fsdp2_cu_dtype_size(D), kS = fsdp2_cu_dtype_size(S);
    size_t packs = (cols - head) / kPack;
    size_t tail0 = head + packs * kPack;
    size_t col_stride = (size_t)gridDim.x * blockDim.x;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
        char *d = dst + r * dst_pitch;
        const char *s = src + r * src_pitch;
        for (size_t p = t; p < packs; p += col_stride) {
            size_t e = head + p * kPack;
            pack_t<pack_bytes(kS)> in = load_pack<pack_bytes(kS)>(s + e * kS);
            pack_t<pack_bytes(kD)> out;
#pragma unroll
            for (size_t k = 0; k < kPack; k++)
                fsdp2_cu_convert_elem(D, out.b, k, S, in.b, k);
            store_pack<pack_bytes(kD)>(d + e * kD, out);
        }
        if (t < head)
            fsdp2_cu_convert_elem(D, d, t, S, s, t);
        if (t < cols - tail0)
            fsdp2_cu_convert_elem(D, d, tail0 + t, S, s, tail0 + t);
    }
}

template <fsdp2_dtype_t D>
cudaError_t launch_chunk_copy_float(const fsdp2_chunk_copy_t *c, dim3 grid, int vec,
                                    size_t head, cudaStream_t stream)
{
    size_t de = fsdp2_cu_dtype_size(D), se = fsdp2_cu_dtype_size(c->src_dtype);
    switch (c->src_dtype) {
#define FSDP2_CU_CASE_(name)                                                                  \
    case FSDP2_##name:                                                                        \
        if constexpr (D == FSDP2_##name) /* a copy within one dtype is a memcpy */            \
            return cudaErrorInvalidValue;                                                     \
        else if (vec)                                                                         \
            chunk_copy_vec_kernel<D, FSDP2_##name><<<grid, kThreads, 0, stream>>>(            \
                (char *)c->dst, c->dst_stride * de, (const char *)c->src,                     \
                c->src_stride * se, c->rows, c->cols, head);                                  \
        else                                                                                  \
            chunk_copy_kernel<D, FSDP2_##name><<<grid, kThreads, 0, stream>>>(                \
                D, c->dst, c->dst_stride, c->src_dtype, c->src, c->src_stride, c->rows,       \
                c->cols);                                                                     \
        return cudaGetLastError();
        FSDP2_CU_FLOAT_MAP(FSDP2_CU_CASE_)
#undef FSDP2_CU_CASE_
    default:
        return cudaErrorInvalidValue;
    }
}

/* A copy with the same dtype on both sides is a memcpy: the copy engines do it at
 * full bandwidth without occupying SMs, and it needs no alignment. */
cudaError_t copy_same_dtype(const fsdp2_chunk_copy_t *c, size_t elem, cudaStream_t stream)
{
    size_t width = c->cols * elem;
    if (c->rows == 1 || (c->dst_stride == c->cols && c->src_stride == c->cols))
        return cudaMemcpyAsync(c->dst, c->src, width * c->rows, cudaMemcpyDefault, stream);
    size_t dpitch = c->dst_stride * elem;
    size_t spitch = c->src_stride * elem;
    /* cudaMemcpy2D* limits pitches to the device's maximum (2^31 - 1 on current GPUs). */
    if (dpitch <= INT_MAX && spitch <= INT_MAX)
        return cudaMemcpy2DAsync(c->dst, dpitch, c->src, spitch, width, c->rows,
                                 cudaMemcpyDefault, stream);
    /* Rows over 2 GiB apart: few of them fit in a GPU, so one copy per row is cheap. */
    for (size_t r = 0; r < c->rows; r++) {
        cudaError_t err = cudaMemcpyAsync((char *)c->dst + r * dpitch,
                                          (const char *)c->src + r * spitch, width,
                                          cudaMemcpyDefault, stream);
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

} // namespace

extern "C" cudaError_t fsdp2_cuda_chunk_copy(const fsdp2_chunk_copy_t *c, cudaStream_t stream)
{
    (void)cudaGetLastError();
    size_t dst_elem = fsdp2_cu_dtype_size(c->dst_dtype);
    if (dst_elem == 0 || fsdp2_cu_dtype_size(c->src_dtype) == 0)
        return cudaErrorInvalidValue;
    if (c->rows == 0 || c->cols == 0)
        return cudaSuccess;
    if (c->dst_dtype == c->src_dtype)
        return copy_same_dtype(c, dst_elem, stream);
    size_t de = dst_elem, se = fsdp2_cu_dtype_size(c->src_dtype);
    size_t head = common_head(c->dst, de, c->dst_stride * de, c->src, se, c->src_stride * se,
                              c->rows);
    int floating = floating_pair(c->dst_dtype, c->src_dtype);
    int vec = floating && head < kPack && c->cols >= head + kPack;
    size_t rows = c->rows < kMaxRowBlocks ? c->rows : kMaxRowBlocks;
    size_t cap = kMaxBlocks * 4 / rows;
    size_t per_row = vec ? (c->cols - head) / kPack : c->cols;
    dim3 grid(blocks_for(per_row, cap == 0 ? 1 : cap), (unsigned)rows, 1);
    if (!floating) {
        chunk_copy_kernel<kAnyDtype, kAnyDtype><<<grid, kThreads, 0, stream>>>(
            c->dst_dtype, c->dst, c->dst_stride, c->src_dtype, c->src, c->src_stride, c->rows,
            c->cols);
        return cudaGetLastError();
    }
    switch (c->dst_dtype) {
#define FSDP2_CU_CASE_(name) \
    case FSDP2_##name:       \
        return launch_chunk_copy_float<FSDP2_##name>(c, grid, vec, head, stream);
        FSDP2_CU_FLOAT_MAP(FSDP2_CU_CASE_)
#undef FSDP2_CU_CASE_
    default:
        return cudaErrorInvalidValue;
    }
}
