/* The CUDA kernels of the cuda device backend: fill, accumulate and the strided chunk
 * copy with cast, for every pair of the 7 dtypes.
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

#include <climits>

#include "cuda/cuda_convert.h"

namespace {

constexpr unsigned kThreads = 256;
/* An H100 holds 132 SMs x 2048 threads = 1056 blocks of 256 at once: a few waves of
 * that keeps every SM busy while the grid-stride loops cover larger tensors. */
constexpr size_t kMaxBlocks = 4096;
/* The y dimension of a grid is limited to 65535 blocks. */
constexpr size_t kMaxRowBlocks = 65535;
/* Elements a thread moves at once on the vector paths. */
constexpr size_t kPack = 8;

/* Bytes of one pack of T-sized elements, and the alignment its loads need: 16-byte
 * accesses, or one 8-byte access for 1-byte elements. */
__host__ __device__ constexpr size_t pack_bytes(size_t elem)
{
    return kPack * elem;
}
__host__ __device__ constexpr size_t pack_align(size_t elem)
{
    return pack_bytes(elem) < 16 ? pack_bytes(elem) : 16;
}

template <size_t Bytes>
struct alignas(Bytes < 16 ? Bytes : 16) pack_t {
    unsigned char b[Bytes];
};

/* One pack from global memory into registers, in 16-byte (or one 8-byte) accesses. */
template <size_t Bytes>
__device__ __forceinline__ pack_t<Bytes> load_pack(const void *p)
{
    pack_t<Bytes> v;
    if constexpr (Bytes >= 16) {
#pragma unroll
        for (size_t k = 0; k < Bytes / 16; k++)
            reinterpret_cast<uint4 *>(v.b)[k] = reinterpret_cast<const uint4 *>(p)[k];
    } else {
        *reinterpret_cast<uint2 *>(v.b) = *reinterpret_cast<const uint2 *>(p);
    }
    return v;
}

template <size_t Bytes>
__device__ __forceinline__ void store_pack(void *p, const pack_t<Bytes> &v)
{
    if constexpr (Bytes >= 16) {
#pragma unroll
        for (size_t k = 0; k < Bytes / 16; k++)
            reinterpret_cast<uint4 *>(p)[k] = reinterpret_cast<const uint4 *>(v.b)[k];
    } else {
        *reinterpret_cast<uint2 *>(p) = *reinterpret_cast<const uint2 *>(v.b);
    }
}

/* The head (< kPack elements) after which a row starting at a (elements of a_elem bytes,
 * rows a_pitch bytes apart) and one at b are both pack-aligned on every row; kPack when
 * there is none. */
size_t common_head(const void *a, size_t a_elem, size_t a_pitch, const void *b, size_t b_elem,
                   size_t b_pitch, size_t rows)
{
    size_t aa = pack_align(a_elem), ba = pack_align(b_elem);
    if (rows > 1 && (a_pitch % aa != 0 || b_pitch % ba != 0))
        return kPack;
    for (size_t h = 0; h < kPack; h++)
        if (((uintptr_t)a + h * a_elem) % aa == 0 && ((uintptr_t)b + h * b_elem) % ba == 0)
            return h;
    return kPack;
}

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
cudaError_t launch_accumulate(fsdp2_dtype_t x_dtype, void *y, const void *x, size_t n,
                              float alpha32, double alpha64, cudaStream_t stream)
{
    size_t head = common_head(y, fsdp2_cu_dtype_size(Y), 0, x, fsdp2_cu_dtype_size(x_dtype), 0, 1);
    int vec = head < kPack && n >= head + kPack;
    unsigned grid = vec ? blocks_for((n - head) / kPack, kMaxBlocks) : blocks_for(n, kMaxBlocks);
    switch (x_dtype) {
#define FSDP2_CU_CASE_(name, id, bytes, str)                                                  \
    case FSDP2_##name:                                                                        \
        if (vec)                                                                              \
            accumulate_vec_kernel<Y, FSDP2_##name><<<grid, kThreads, 0, stream>>>(            \
                (char *)y, (const char *)x, n, head, alpha32, alpha64);                       \
        else                                                                                  \
            accumulate_kernel<Y, FSDP2_##name><<<grid, kThreads, 0, stream>>>(y, x, n, alpha32, \
                                                                               alpha64);      \
        return cudaGetLastError();
        FSDP2_DTYPE_MAP(FSDP2_CU_CASE_)
#undef FSDP2_CU_CASE_
    default:
        return cudaErrorInvalidValue;
    }
}

template <fsdp2_dtype_t D>
cudaError_t launch_chunk_copy(const fsdp2_chunk_copy_t *c, cudaStream_t stream)
{
    size_t de = fsdp2_cu_dtype_size(D), se = fsdp2_cu_dtype_size(c->src_dtype);
    size_t head = common_head(c->dst, de, c->dst_stride * de, c->src, se, c->src_stride * se,
                              c->rows);
    int vec = head < kPack && c->cols >= head + kPack;
    size_t rows = c->rows < kMaxRowBlocks ? c->rows : kMaxRowBlocks;
    size_t cap = kMaxBlocks * 4 / rows;
    size_t per_row = vec ? (c->cols - head) / kPack : c->cols;
    dim3 grid(blocks_for(per_row, cap == 0 ? 1 : cap), (unsigned)rows, 1);
    switch (c->src_dtype) {
#define FSDP2_CU_CASE_(name, id, bytes, str)                                                 \
    case FSDP2_##name:                                                                       \
        if (vec)                                                                             \
            chunk_copy_vec_kernel<D, FSDP2_##name><<<grid, kThreads, 0, stream>>>(           \
                (char *)c->dst, c->dst_stride * de, (const char *)c->src, c->src_stride * se, \
                c->rows, c->cols, head);                                                     \
        else                                                                                 \
            chunk_copy_kernel<D, FSDP2_##name><<<grid, kThreads, 0, stream>>>(               \
                c->dst, c->dst_stride, c->src, c->src_stride, c->rows, c->cols);             \
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
    switch (copy->dst_dtype) {
#define FSDP2_CU_CASE_(name, id, bytes, str) \
    case FSDP2_##name:                       \
        return launch_chunk_copy<FSDP2_##name>(copy, stream);
        FSDP2_DTYPE_MAP(FSDP2_CU_CASE_)
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
