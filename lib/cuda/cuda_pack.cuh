/* What the CUDA kernel files share: launch shapes, the packs of the vector paths and
 * their alignment (see cuda_kernels.cu). Included by .cu files only; everything is in an
 * anonymous namespace, once per translation unit. */
#ifndef FSDP2_CUDA_PACK_CUH
#define FSDP2_CUDA_PACK_CUH

#include <cstddef>
#include <cstdint>

#include <fsdp2/dtype.h>

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
inline size_t common_head(const void *a, size_t a_elem, size_t a_pitch, const void *b, size_t b_elem,
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

/* The dtypes whose pairs have kernels of their own, scalar and vector: the floating
 * ones, between which the casts and accumulations of every step run. Any other pair goes
 * through one kernel per operation instantiated for kAnyDtype, which switches on the
 * dtypes at run time: the same element functions, so the same results, from a build
 * that compiles 58 kernels for the chunk copy and the accumulation. */
#define FSDP2_CU_FLOAT_MAP(XX) XX(F32) XX(F64) XX(BF16) XX(F16)

constexpr fsdp2_dtype_t kAnyDtype = FSDP2_DTYPE_COUNT;

/* Whether both dtypes are in FSDP2_CU_FLOAT_MAP. */
inline bool floating_pair(fsdp2_dtype_t a, fsdp2_dtype_t b)
{
    auto floating = [](fsdp2_dtype_t d) {
        switch (d) {
#define FSDP2_CU_CASE_(name) case FSDP2_##name:
            FSDP2_CU_FLOAT_MAP(FSDP2_CU_CASE_)
#undef FSDP2_CU_CASE_
            return true;
        default:
            return false;
        }
    };
    return floating(a) && floating(b);
}

inline unsigned blocks_for(size_t n, size_t cap)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > cap)
        blocks = cap;
    return (unsigned)(blocks == 0 ? 1 : blocks);
}

} // namespace

#endif
