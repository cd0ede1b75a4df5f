/* The layers' one GEMM: C = alpha op(A) op(B) + beta C, row-major f32, as cblas_sgemm.
 *
 * With oneDNN at build time (FSDP2_HAVE_ONEDNN) it runs oneDNN's matmul primitive, which
 * picks its kernels from the CPU's feature flags (AVX2, AVX-512, AMX), not from its model
 * name. A primitive is created once per shape (sizes, strides, transposes, alpha, beta,
 * whether there is a bias, and the thread count) and kept for the life of the process;
 * later calls of that shape only look it up. Each thread creates the memory objects of a
 * shape on its first call of it and then only sets their data handles. A shape oneDNN's matmul does not implement goes to oneDNN's sgemm. Without
 * oneDNN the GEMMs go to the BLAS (OpenBLAS), which is checked once: generic kernels on a
 * CPU with AVX2 or AVX-512 get a warning naming the variable that fixes it.
 *
 * Threads: oneDNN's (OpenMP) pool, the one the layers' element-wise loops use too; a GEMM
 * called inside a parallel region runs on its calling thread. */
#ifndef FSDP2_NN_GEMM_H
#define FSDP2_NN_GEMM_H

#include <stdint.h>

#include <fsdp2/status.h>

/* trans_a: A is stored [k, m] (lda >= m) instead of [m, k] (lda >= k); trans_b the same
 * for B ([n, k] instead of [k, n]). beta 0 overwrites C without reading it. Sizes may be 0.
 * Fails only when oneDNN cannot create or run a primitive (out of memory). */
fsdp2_status_t nn_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc);

/* C = op(A) op(B) + bias, bias (NULL: none) a vector of n floats added to every row of C:
 * oneDNN's matmul adds it in its kernel, so C is written once; the BLAS and oneDNN's
 * sgemm get C filled with the bias and beta 1. */
fsdp2_status_t nn_sgemm_bias(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                             const float *a, int64_t lda, const float *b, int64_t ldb,
                             const float *bias, float *c, int64_t ldc);

/* C = alpha op(A) op(B) + beta C with A and B bf16 (uint16_t bit patterns) and C f32, the
 * products summed in f32, as nn_sgemm takes its arguments. Where nn_gemm_bf16_native,
 * oneDNN's bf16 matmul (its primitives kept per shape as nn_sgemm's); elsewhere, or for a
 * shape it does not implement, blocks of A and B are converted to f32 (exactly) in a
 * scratch of 1 MiB per thread, kept for the thread's life, and multiplied by the f32
 * GEMM: the same products, the f32 sums in another order. Counted as one GEMM in
 * fsdp2_nn_gemm_stats. */
fsdp2_status_t nn_gemm_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                            int64_t ldb, float beta, float *c, int64_t ldc);

/* nn_gemm_bf16 with alpha 1 and a bias as nn_sgemm_bias's. */
fsdp2_status_t nn_gemm_bf16_bias(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                 const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                                 const float *bias, float *c, int64_t ldc);

/* Whether bf16 GEMMs run on bf16 matrix units here: the CPU's flags show AVX512-BF16 or
 * AMX-BF16 and oneDNN creates a bf16 matmul kernel, not its reference loops (probed once,
 * thread-safely); 0 in a build without oneDNN. */
int nn_gemm_bf16_native(void);

/* Whether the GEMMs of a layer with bf16 weights take bf16 operands (nn_gemm_bf16):
 * FSDP2_NN_BF16_GEMM, from the env table (read once); auto = where
 * nn_gemm_bf16_native. Fails as fsdp2_env_init does when a variable's value is bad. */
fsdp2_status_t nn_gemm_bf16_wanted(int *wanted);

/* Preparing: between nn_gemm_prepare_begin and _end, this thread's GEMM calls (nn_sgemm,
 * nn_gemm_bf16 and their _bias forms) create the primitives of their shapes and return:
 * no operand is read or written (they may be NULL; a bias pointer only says whether there
 * is one), nothing is counted, no scratch is taken. A call keys its primitive on
 * nn_threads() as a real call does, so a layer prepares calls that run inside a parallel
 * region from inside the same region. The layers' _prepare functions walk their GEMMs this
 * way. */
void nn_gemm_prepare_begin(void);
void nn_gemm_prepare_end(void);
int nn_gemm_preparing(void);

/* Whether the GEMMs of a layer without parameters (attention) take bf16 operands: the
 * compute dtype (fsdp2_nn_set_compute_dtype) is bf16 and nn_gemm_bf16_wanted. Under f32
 * compute it reads no environment and never fails. */
fsdp2_status_t nn_compute_bf16_wanted(int *wanted);

/* Which engine runs nn_sgemm: "onednn" or "blas". */
const char *nn_gemm_engine(void);

/* The primitives created so far (0 without oneDNN): the tests check that a second step of
 * the same shapes creates none. */
int64_t nn_gemm_primitives(void);

/* The oneDNN memory objects created so far (0 without oneDNN): a thread makes those of a
 * shape on its first call of it and then only sets their data handles. */
int64_t nn_gemm_memory_objects(void);

/* For the BLAS fallback: the OPENBLAS_CORETYPE to suggest when OpenBLAS's kernels are
 * generic (corename one of its pre-AVX cores) on a CPU with AVX2 (has_avx2) or AVX-512
 * (has_avx512f), else NULL. */
const char *nn_blas_coretype_advice(const char *corename, int has_avx2, int has_avx512f);

#endif
