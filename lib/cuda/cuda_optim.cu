/* The optimizers' update rules as one multi-tensor kernel per dtype: block b updates
 * chunk b of the chunk table (one shard's elements [start, start + count)), its threads
 * striding over the chunk; a grid-stride loop over chunks covers tables longer than the
 * grid. The element code mirrors update_rules_impl.h line by line with the _rn
 * intrinsics, so that nvcc cannot contract a product and a sum into an FMA the host
 * does not do. */
#include "cuda/cuda_optim.h"

#include <math.h>

namespace {

constexpr unsigned kOptimThreads = 256;
constexpr size_t kOptimMaxBlocks = 8192;

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float root(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ double root(double a) { return __dsqrt_rn(a); }

/* The step's coefficients rounded to T on the host, as the host rules round them. */
template <typename T>
struct coeffs_t {
    T neg_lr, wd, momentum, keep;              /* SGD */
    int use_wd, use_momentum, first, nesterov; /* SGD, Adadelta (use_wd) */
    T decay, w1, beta2, w2, bc2_sqrt, eps, neg_step; /* AdamW (eps: Adadelta too) */
    T rho, w;                                        /* Adadelta */
};

template <typename T>
coeffs_t<T> coeffs_of(const optim_coeffs_t *c)
{
    coeffs_t<T> k;
    k.neg_lr = (T)-c->lr;
    k.wd = (T)c->weight_decay;
    k.momentum = (T)c->momentum;
    k.keep = (T)(1.0 - c->dampening);
    k.use_wd = c->weight_decay != 0.0;
    k.use_momentum = c->momentum != 0.0;
    k.first = c->first_step;
    k.nesterov = c->nesterov;
    k.decay = (T)(1.0 - c->lr * c->weight_decay);
    k.w1 = (T)(1.0 - c->beta1);
    k.beta2 = (T)c->beta2;
    k.w2 = (T)(1.0 - c->beta2);
    k.bc2_sqrt = (T)sqrt(c->bias_correction2);
    k.eps = (T)c->eps;
    k.neg_step = (T)(-c->lr / c->bias_correction1);
    k.rho = (T)c->rho;
    k.w = (T)(1.0 - c->rho);
    return k;
}

template <typename T>
__device__ __forceinline__ T lerp(T start, T end, T weight)
{
    return (weight < (T)0.5 && weight > (T)-0.5) ? add(start, mul(weight, sub(end, start)))
                                                 : sub(end, mul(sub(end, start), sub((T)1, weight)));
}

template <typename T>
__device__ __forceinline__ void sgd(const coeffs_t<T> &k, T *p, const T *grad, T *buf, int64_t i)
{
    T g = grad[i];
    if (k.use_wd)
        g = add(g, mul(k.wd, p[i]));
    if (k.use_momentum) {
        T b = k.first ? g : add(mul(buf[i], k.momentum), mul(k.keep, g));
        buf[i] = b;
        g = k.nesterov ? add(g, mul(k.momentum, b)) : b;
    }
    p[i] = add(p[i], mul(k.neg_lr, g));
}

template <typename T>
__device__ __forceinline__ void adamw(const coeffs_t<T> &k, T *p, const T *grad, T *m, T *v,
                                      int64_t i)
{
    T g = grad[i];
    T pi = mul(p[i], k.decay);
    T mi = lerp(m[i], g, k.w1);
    T vi = add(mul(v[i], k.beta2), mul(mul(k.w2, g), g));
    T denom = add(div(root(vi), k.bc2_sqrt), k.eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = add(pi, mul(k.neg_step, div(mi, denom)));
}

template <typename T>
__device__ __forceinline__ void adadelta(const coeffs_t<T> &k, T *p, const T *grad, T *sq, T *acc,
                                         int64_t i)
{
    T g = grad[i];
    if (k.use_wd)
        g = add(g, mul(k.wd, p[i]));
    T sqi = add(mul(sq[i], k.rho), mul(mul(k.w, g), g));
    T sd = root(add(sqi, k.eps));
    T delta = mul(div(root(add(acc[i], k.eps)), sd), g);
    sq[i] = sqi;
    acc[i] = add(mul(acc[i], k.rho), mul(mul(k.w, delta), delta));
    p[i] = add(p[i], mul(k.neg_lr, delta));
}

template <typename T, fsdp2_optimizer_kind_t K>
__global__ void update_kernel(coeffs_t<T> k, const optim_shard_t *__restrict__ shards,
                              const fsdp2_cuda_optim_chunk_t *__restrict__ chunks, size_t nchunks)
{
    for (size_t b = blockIdx.x; b < nchunks; b += gridDim.x) {
        fsdp2_cuda_optim_chunk_t c = chunks[b];
        const optim_shard_t s = shards[c.shard];
        T *p = (T *)s.param;
        const T *g = (const T *)s.grad;
        T *s0 = (T *)s.state[0], *s1 = (T *)s.state[1];
        for (int64_t i = c.start + threadIdx.x; i < c.start + c.count; i += blockDim.x) {
            if (K == FSDP2_OPTIMIZER_SGD)
                sgd(k, p, g, s0, i);
            else if (K == FSDP2_OPTIMIZER_ADAMW)
                adamw(k, p, g, s0, s1, i);
            else
                adadelta(k, p, g, s0, s1, i);
        }
    }
}

template <typename T>
cudaError_t launch(const optim_coeffs_t *c, const optim_shard_t *shards,
                   const fsdp2_cuda_optim_chunk_t *chunks, size_t nchunks, cudaStream_t stream)
{
    coeffs_t<T> k = coeffs_of<T>(c);
    unsigned grid = (unsigned)(nchunks < kOptimMaxBlocks ? nchunks : kOptimMaxBlocks);
    switch (c->kind) {
    case FSDP2_OPTIMIZER_SGD:
        update_kernel<T, FSDP2_OPTIMIZER_SGD>
            <<<grid, kOptimThreads, 0, stream>>>(k, shards, chunks, nchunks);
        break;
    case FSDP2_OPTIMIZER_ADAMW:
        update_kernel<T, FSDP2_OPTIMIZER_ADAMW>
            <<<grid, kOptimThreads, 0, stream>>>(k, shards, chunks, nchunks);
        break;
    case FSDP2_OPTIMIZER_ADADELTA:
        update_kernel<T, FSDP2_OPTIMIZER_ADADELTA>
            <<<grid, kOptimThreads, 0, stream>>>(k, shards, chunks, nchunks);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

} // namespace

extern "C" size_t fsdp2_cuda_optim_chunks(const optim_shard_t *shards, size_t count)
{
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        n += (size_t)((shards[i].numel + FSDP2_CUDA_OPTIM_CHUNK - 1) / FSDP2_CUDA_OPTIM_CHUNK);
    return n;
}

extern "C" void fsdp2_cuda_optim_fill_chunks(const optim_shard_t *shards, size_t count,
                                             fsdp2_cuda_optim_chunk_t *chunks)
{
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        for (int64_t at = 0; at < shards[i].numel; at += FSDP2_CUDA_OPTIM_CHUNK) {
            int64_t left = shards[i].numel - at;
            chunks[n].shard = (int32_t)i;
            chunks[n].count = (int32_t)(left < FSDP2_CUDA_OPTIM_CHUNK ? left : FSDP2_CUDA_OPTIM_CHUNK);
            chunks[n].start = at;
            n++;
        }
}

extern "C" cudaError_t fsdp2_cuda_optim_update(const optim_coeffs_t *c, fsdp2_dtype_t dtype,
                                               const optim_shard_t *shards,
                                               const fsdp2_cuda_optim_chunk_t *chunks,
                                               size_t nchunks, cudaStream_t stream)
{
    (void)cudaGetLastError();
    if (nchunks == 0)
        return cudaSuccess;
    if (dtype == FSDP2_F32)
        return launch<float>(c, shards, chunks, nchunks, stream);
    if (dtype == FSDP2_F64)
        return launch<double>(c, shards, chunks, nchunks, stream);
    return cudaErrorInvalidValue;
}
