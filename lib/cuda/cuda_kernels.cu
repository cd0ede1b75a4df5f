/* The CUDA kernels of the cuda device backend: fill, accumulate for every pair of the 7
 * dtypes (kernels of their own for the floating pairs: cuda_pack.cuh), the reductions'
 * divide, and clipping's norm and scale (the strided chunk copy with cast is in
 * cuda_chunk_copy.cu, compiled in one unit with this file).
 *
 * Every kernel is a grid-stride loop whose body is one function of cuda_convert.h,
 * instantiated for a compile-time pair of dtypes so that its dtype switches fold away;
 * the same functions run on the host in the conversion test. Casts, chunk copies and
 * accumulations move packs of kPack elements per thread with 8- or 16-byte loads and
 * stores whenever every row's start can be brought to that alignment on both sides by
 * the same head of fewer than kPack elements (the head and the tail of each row go one
 * element per thread); otherwise they go one element per thread throughout. Launch
 * shapes are capped (kMaxBlocks) so huge tensors do not make huge grids: the loops
 * cover the rest. */
#include "cuda/cuda_kernels.h"

#include <cstring>

#include "cuda/cuda_convert.h"
#include "cuda/cuda_pack.cuh"

namespace {

template <typename T>
__global__ void fill_kernel(T *__restrict__ dst, size_t n, T value)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = value;
}

/* An element per thread. <Y, X> for a floating pair; <kAnyDtype, kAnyDtype> for any pair,
 * the dtypes then given at run time as yd and xd (the same for every thread, so the
 * switches on them do not diverge). */
template <fsdp2_dtype_t Y, fsdp2_dtype_t X>
__global__ void accumulate_kernel(fsdp2_dtype_t yd, void *__restrict__ y, fsdp2_dtype_t xd,
                                  const void *__restrict__ x, size_t n, float alpha32,
                                  double alpha64)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        fsdp2_cu_accumulate_elem(Y == kAnyDtype ? yd : Y, y, X == kAnyDtype ? xd : X, x, i,
                                 alpha32, alpha64);
}

/* blockIdx.y walks rows, blockIdx.x/threadIdx.x the columns of a row, so each warp
 * reads and writes consecutive elements of one row. */
template <fsdp2_dtype_t Y, fsdp2_dtype_t X>
__global__ void accumulate_vec_kernel(char *__restrict__ y, const char *__restrict__ x, size_t n,
                                      size_t head, float alpha32, double alpha64)
{
    constexpr size_t kY = fsdp2_cu_dtype_size(Y), kX = fsdp2_cu_dtype_size(X);
    size_t packs = (n - head) / kPack;
    size_t tail0 = head + packs * kPack;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    /* Two packs per thread per round: their four loads are in flight together (a
     * read-modify-write stream needs more bytes in flight than a copy). */
    for (size_t p = t; p < packs; p += 2 * stride) {
        size_t e0 = head + p * kPack, e1 = e0 + stride * kPack;
        int second = p + stride < packs;
        pack_t<pack_bytes(kX)> x0 = load_pack<pack_bytes(kX)>(x + e0 * kX), x1;
        pack_t<pack_bytes(kY)> y0 = load_pack<pack_bytes(kY)>(y + e0 * kY), y1;
        if (second) {
            x1 = load_pack<pack_bytes(kX)>(x + e1 * kX);
            y1 = load_pack<pack_bytes(kY)>(y + e1 * kY);
        }
#pragma unroll
        for (size_t k = 0; k < kPack; k++)
            fsdp2_cu_accumulate_elem(Y, y0.b, X, x0.b, k, alpha32, alpha64);
        store_pack<pack_bytes(kY)>(y + e0 * kY, y0);
        if (second) {
#pragma unroll
            for (size_t k = 0; k < kPack; k++)
                fsdp2_cu_accumulate_elem(Y, y1.b, X, x1.b, k, alpha32, alpha64);
            store_pack<pack_bytes(kY)>(y + e1 * kY, y1);
        }
    }
    if (t < head)
        fsdp2_cu_accumulate_elem(Y, y, X, x, t, alpha32, alpha64);
    if (t < n - tail0)
        fsdp2_cu_accumulate_elem(Y, y, X, x, tail0 + t, alpha32, alpha64);
}

template <fsdp2_dtype_t T>
__global__ void divide_kernel(void *y, const void *x, size_t n, float pre32, float post32,
                              double pre64, double post64)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        fsdp2_cu_divide_elem(T, y, x, i, pre32, post32, pre64, post64);
}

template <typename T>
__global__ void norm_share_kernel(const T *__restrict__ g, size_t n, int inf, double *acc)
{
    __shared__ double part[kThreads / 32];
    double v = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double x = (double)g[i];
        if (inf) {
            double a = fabs(x);
            v = (isnan(a) || a > v) ? (isnan(v) ? v : a) : v;
        } else {
            v = __dadd_rn(v, __dmul_rn(x, x));
        }
    }
    for (int off = 16; off > 0; off /= 2) {
        double o = __shfl_down_sync(0xffffffffu, v, off);
        v = inf ? ((isnan(v) || v >= o) ? v : o) : __dadd_rn(v, o);
    }
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double b = part[0];
        for (unsigned w = 1; w < blockDim.x / 32; w++)
            b = inf ? ((isnan(b) || b >= part[w]) ? b : part[w]) : __dadd_rn(b, part[w]);
        if (inf)
            atomicMax((unsigned long long *)acc, (unsigned long long)__double_as_longlong(b));
        else
            atomicAdd(acc, b);
    }
}

template <typename T>
__global__ void scale_kernel(T *g, size_t n, T coef)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if constexpr (sizeof(T) == 4)
            g[i] = __fmul_rn(g[i], coef);
        else
            g[i] = __dmul_rn(g[i], coef);
    }
}

template <fsdp2_dtype_t Y>
cudaError_t launch_accumulate_float(fsdp2_dtype_t x_dtype, void *y, const void *x, size_t n,
                             float alpha32, double alpha64, cudaStream_t stream)
{
    size_t head = common_head(y, fsdp2_cu_dtype_size(Y), 0, x, fsdp2_cu_dtype_size(x_dtype), 0, 1);
    int vec = head < kPack && n >= head + kPack;
    unsigned grid = vec ? blocks_for((n - head) / kPack, kMaxBlocks) : blocks_for(n, kMaxBlocks);
    switch (x_dtype) {
#define FSDP2_CU_CASE_(name)                                                                   \
    case FSDP2_##name:                                                                         \
        if (vec)                                                                               \
            accumulate_vec_kernel<Y, FSDP2_##name><<<grid, kThreads, 0, stream>>>(             \
                (char *)y, (const char *)x, n, head, alpha32, alpha64);                        \
        else                                                                                   \
            accumulate_kernel<Y, FSDP2_##name><<<grid, kThreads, 0, stream>>>(                 \
                Y, y, x_dtype, x, n, alpha32, alpha64);                                        \
        return cudaGetLastError();
        FSDP2_CU_FLOAT_MAP(FSDP2_CU_CASE_)
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
    if (!floating_pair(y_dtype, x_dtype)) {
        accumulate_kernel<kAnyDtype, kAnyDtype><<<blocks_for(n, kMaxBlocks), kThreads, 0, stream>>>(
            y_dtype, y, x_dtype, x, n, alpha32, alpha);
        return cudaGetLastError();
    }
    switch (y_dtype) {
#define FSDP2_CU_CASE_(name) \
    case FSDP2_##name:       \
        return launch_accumulate_float<FSDP2_##name>(x_dtype, y, x, n, alpha32, alpha, stream);
        FSDP2_CU_FLOAT_MAP(FSDP2_CU_CASE_)
#undef FSDP2_CU_CASE_
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t fsdp2_cuda_divide(void *y, const void *x, fsdp2_dtype_t dtype, size_t n,
                                         double pre, double post, cudaStream_t stream)
{
    (void)cudaGetLastError();
    if (n == 0)
        return cudaSuccess;
    float pre32 = fsdp2_cu_f64_to_f32(pre), post32 = fsdp2_cu_f64_to_f32(post);
    unsigned grid = blocks_for(n, kMaxBlocks);
    switch (dtype) {
    case FSDP2_F32:
        divide_kernel<FSDP2_F32><<<grid, kThreads, 0, stream>>>(y, x, n, pre32, post32, pre, post);
        break;
    case FSDP2_F64:
        divide_kernel<FSDP2_F64><<<grid, kThreads, 0, stream>>>(y, x, n, pre32, post32, pre, post);
        break;
    case FSDP2_BF16:
        divide_kernel<FSDP2_BF16><<<grid, kThreads, 0, stream>>>(y, x, n, pre32, post32, pre, post);
        break;
    case FSDP2_F16:
        divide_kernel<FSDP2_F16><<<grid, kThreads, 0, stream>>>(y, x, n, pre32, post32, pre, post);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t fsdp2_cuda_norm_share(const void *g, fsdp2_dtype_t dtype, size_t n,
                                             int inf, double *acc, cudaStream_t stream)
{
    (void)cudaGetLastError();
    if (n == 0)
        return cudaSuccess;
    unsigned grid = blocks_for(n, 1024);
    if (dtype == FSDP2_F32)
        norm_share_kernel<float><<<grid, kThreads, 0, stream>>>((const float *)g, n, inf, acc);
    else if (dtype == FSDP2_F64)
        norm_share_kernel<double><<<grid, kThreads, 0, stream>>>((const double *)g, n, inf, acc);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}

extern "C" cudaError_t fsdp2_cuda_scale(void *g, fsdp2_dtype_t dtype, size_t n, double coef,
                                        cudaStream_t stream)
{
    (void)cudaGetLastError();
    if (n == 0)
        return cudaSuccess;
    unsigned grid = blocks_for(n, kMaxBlocks);
    if (dtype == FSDP2_F32)
        scale_kernel<float><<<grid, kThreads, 0, stream>>>((float *)g, n,
                                                           fsdp2_cu_f64_to_f32(coef));
    else if (dtype == FSDP2_F64)
        scale_kernel<double><<<grid, kThreads, 0, stream>>>((double *)g, n, coef);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}
