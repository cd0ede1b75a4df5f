/* The CUDA kernels of the cuda device backend: fill, accumulate and the strided chunk
 * copy with cast, for every pair of the 7 dtypes.
 *
 * Every kernel is a grid-stride loop over elements whose body is one function of
 * cuda_convert.h, instantiated for a compile-time pair of dtypes so that its dtype
 * switches fold away; the same functions run on the host in the conversion test.
 * Launch shapes are capped (kMaxBlocks) so huge tensors do not make huge grids: the
 * loops cover the rest. */
#include "cuda/cuda_kernels.h"

#include <climits>

#include "cuda/cuda_convert.h"

namespace {

constexpr unsigned kThreads = 256;
/* An H100 holds 132 SMs x 2048 threads = 1056 blocks of 256 at once: a few waves of
 * that keeps every SM busy while the grid-stride loops cover larger tensors. */
constexpr size_t kMaxBlocks = 4096;
/* The y dimension of a grid is limited to 65535 blocks. */
constexpr size_t kMaxRowBlocks = 65535;

unsigned blocks_for(size_t n, size_t cap)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > cap)
        blocks = cap;
    return (unsigned)(blocks == 0 ? 1 : blocks);
}

template <typename T>
__global__ void fill_kernel(T *__restrict__ dst, size_t n, T value)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = value;
}

template <fsdp2_dtype_t Y, fsdp2_dtype_t X>
__global__ void accumulate_kernel(void *__restrict__ y, const void *__restrict__ x, size_t n,
                                  float alpha32, double alpha64)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        fsdp2_cu_accumulate_elem(Y, y, X, x, i, alpha32, alpha64);
}

/* blockIdx.y walks rows, blockIdx.x/threadIdx.x the columns of a row, so each warp
 * reads and writes consecutive elements of one row. */
template <fsdp2_dtype_t D, fsdp2_dtype_t S>
__global__ void chunk_copy_kernel(void *__restrict__ dst, size_t dst_stride,
                                  const void *__restrict__ src, size_t src_stride, size_t rows,
                                  size_t cols)
{
    size_t col_stride = (size_t)gridDim.x * blockDim.x;
    size_t col0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
        size_t d = r * dst_stride;
        size_t s = r * src_stride;
        for (size_t c = col0; c < cols; c += col_stride)
            fsdp2_cu_convert_elem(D, dst, d + c, S, src, s + c);
    }
}

template <fsdp2_dtype_t Y>
cudaError_t launch_accumulate(fsdp2_dtype_t x_dtype, void *y, const void *x, size_t n,
                              float alpha32, double alpha64, cudaStream_t stream)
{
    unsigned grid = blocks_for(n, kMaxBlocks);
    switch (x_dtype) {
#define FSDP2_CU_CASE_(name, id, bytes, str)                                              \
    case FSDP2_##name:                                                                    \
        accumulate_kernel<Y, FSDP2_##name><<<grid, kThreads, 0, stream>>>(y, x, n, alpha32, \
                                                                           alpha64);     \
        return cudaGetLastError();
        FSDP2_DTYPE_MAP(FSDP2_CU_CASE_)
#undef FSDP2_CU_CASE_
    default:
        return cudaErrorInvalidValue;
    }
}

template <fsdp2_dtype_t D>
cudaError_t launch_chunk_copy(const fsdp2_chunk_copy_t *c, dim3 grid, cudaStream_t stream)
{
    switch (c->src_dtype) {
#define FSDP2_CU_CASE_(name, id, bytes, str)                                          \
    case FSDP2_##name:                                                                \
        chunk_copy_kernel<D, FSDP2_##name><<<grid, kThreads, 0, stream>>>(            \
            c->dst, c->dst_stride, c->src, c->src_stride, c->rows, c->cols);          \
        return cudaGetLastError();
        FSDP2_DTYPE_MAP(FSDP2_CU_CASE_)
#undef FSDP2_CU_CASE_
    default:
        return cudaErrorInvalidValue;
    }
}

template <typename T>
cudaError_t launch_fill(void *dst, size_t n, const void *pattern, cudaStream_t stream)
{
    T value;
    memcpy(&value, pattern, sizeof value);
    fill_kernel<T><<<blocks_for(n, kMaxBlocks), kThreads, 0, stream>>>((T *)dst, n, value);
    return cudaGetLastError();
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

extern "C" cudaError_t fsdp2_cuda_fill(void *dst, fsdp2_dtype_t dtype, size_t n, double value,
                                       cudaStream_t stream)
{
    size_t elem = fsdp2_cu_dtype_size(dtype);
    if (elem == 0)
        return cudaErrorInvalidValue;
    /* A stale error of an earlier call on this thread must not be taken for ours. */
    (void)cudaGetLastError();
    if (n == 0)
        return cudaSuccess;
    uint64_t pattern = 0;
    fsdp2_cu_store_f64(dtype, &pattern, 0, value);
    const unsigned char *bytes = (const unsigned char *)&pattern;
    int uniform = 1;
    for (size_t b = 1; b < elem; b++)
        uniform &= bytes[b] == bytes[0];
    if (uniform) /* zeros, u8, 0xffff...: cudaMemsetAsync */
        return cudaMemsetAsync(dst, bytes[0], n * elem, stream);
    switch (elem) {
    case 2:
        return launch_fill<uint16_t>(dst, n, &pattern, stream);
    case 4:
        return launch_fill<uint32_t>(dst, n, &pattern, stream);
    default:
        return launch_fill<uint64_t>(dst, n, &pattern, stream);
    }
}

extern "C" cudaError_t fsdp2_cuda_accumulate(void *y, fsdp2_dtype_t y_dtype, const void *x,
                                             fsdp2_dtype_t x_dtype, size_t n, double alpha,
                                             cudaStream_t stream)
{
    (void)cudaGetLastError();
    if (fsdp2_cu_dtype_size(y_dtype) == 0 || fsdp2_cu_dtype_size(x_dtype) == 0)
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    float alpha32 = fsdp2_cu_f64_to_f32(alpha);
    switch (y_dtype) {
#define FSDP2_CU_CASE_(name, id, bytes, str) \
    case FSDP2_##name:                       \
        return launch_accumulate<FSDP2_##name>(x_dtype, y, x, n, alpha32, alpha, stream);
        FSDP2_DTYPE_MAP(FSDP2_CU_CASE_)
#undef FSDP2_CU_CASE_
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t fsdp2_cuda_chunk_copy(const fsdp2_chunk_copy_t *copy, cudaStream_t stream)
{
    (void)cudaGetLastError();
    size_t dst_elem = fsdp2_cu_dtype_size(copy->dst_dtype);
    if (dst_elem == 0 || fsdp2_cu_dtype_size(copy->src_dtype) == 0)
        return cudaErrorInvalidValue;
    if (copy->rows == 0 || copy->cols == 0)
        return cudaSuccess;
    if (copy->dst_dtype == copy->src_dtype)
        return copy_same_dtype(copy, dst_elem, stream);
    size_t rows = copy->rows < kMaxRowBlocks ? copy->rows : kMaxRowBlocks;
    size_t cap = kMaxBlocks * 4 / rows;
    dim3 grid(blocks_for(copy->cols, cap == 0 ? 1 : cap), (unsigned)rows, 1);
    switch (copy->dst_dtype) {
#define FSDP2_CU_CASE_(name, id, bytes, str) \
    case FSDP2_##name:                       \
        return launch_chunk_copy<FSDP2_##name>(copy, grid, stream);
        FSDP2_DTYPE_MAP(FSDP2_CU_CASE_)
#undef FSDP2_CU_CASE_
    default:
        return cudaErrorInvalidValue;
    }
}
