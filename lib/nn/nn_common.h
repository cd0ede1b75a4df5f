/* What the layers share: argument checks for parameter tensors, the workspace carved into
 * f32 regions, and bf16-aware row loads and gradient adds. */
#ifndef FSDP2_NN_COMMON_H
#define FSDP2_NN_COMMON_H

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include <fsdp2/nn.h>

#include "core/error.h"
#include "core/parallel.h"

/* A parameter or gradient tensor: on a cpu device, f32 or bf16, of this shape. what names
 * it in the error ("linear weight"). */
fsdp2_status_t nn_check_param(const fsdp2_tensor_t *t, const char *what, int ndim,
                              const int64_t *shape);

/* A size that must be >= 0 and fit a BLAS int. */
fsdp2_status_t nn_check_dim(int64_t v, const char *what);
/* dtype is one a parameter of the layers may have: f32 or bf16. */
fsdp2_status_t nn_check_dtype(fsdp2_dtype_t dtype, const char *what);

/* Sequential regions of a workspace. */
typedef struct nn_carve {
    char *at;
    size_t left;
} nn_carve_t;

/* The carve of ws, refusing one smaller than need bytes (what names the layer). */
fsdp2_status_t nn_carve_begin(fsdp2_nn_workspace_t *ws, size_t need, const char *what,
                              nn_carve_t *c);
/* n floats, 64-byte aligned; nn_carve_begin checked the room. */
float *nn_carve_floats(nn_carve_t *c, int64_t n);

/* Bytes of a region of n floats in a workspace (its alignment slack included). */
size_t nn_region_bytes(int64_t n);

/* The block [rows, cols] at (r0, c0) of a row-major matrix of dtype st with leading
 * dimension ld, converted to dtype dt (f32 or bf16; to bf16 rounded to nearest even)
 * into dst, dense [rows, cols]. */
void nn_convert_block(void *dst, fsdp2_dtype_t dt, const void *src, fsdp2_dtype_t st,
                      int64_t ld, int64_t r0, int64_t c0, int64_t rows, int64_t cols);
/* count elements of t from element first, as f32, into dst. */
void nn_load(float *dst, const fsdp2_tensor_t *t, int64_t first, int64_t count);
/* t[first + i] += src[i] for count elements (a bf16 gradient is rounded once). */
void nn_add_into(fsdp2_tensor_t *t, int64_t first, const float *src, int64_t count);
/* t's elements as f32: t's own data when f32, else converted into scratch. */
const float *nn_as_f32(const fsdp2_tensor_t *t, float *scratch);


/* Bytes of one thread's bf16 staging for attention over seq positions of head dimension
 * hd (bf16 compute), and the bytes of such staging allocated so far (the tests check
 * that a second step of the same shapes allocates none). */
int64_t nn_attention_staging_bytes(int64_t seq, int64_t hd);
int64_t nn_attention_staging_allocated(void);

/* Threads a parallel region started here would get: 1 inside one, or without OpenMP. */
int nn_threads(void);
/* The threads of the parallel region this thread is in (1 outside one). */
int nn_region_threads(void);
/* This thread's index in its parallel region (0 outside one). */
int nn_thread_index(void);

/* A thread's share [*first, *end) of n columns in a region of threads: contiguous
 * ranges on 16-float (64-byte) boundaries, so that two threads share a cache line only
 * where the array itself does not start on one. */
void nn_column_range(int64_t n, int thread, int threads, int64_t *first, int64_t *end);

/* sum[j] += column j of src [rows, cols] (row stride ld), added in row order, the columns
 * split among the pool's threads: the same bits on any number of threads. */
void nn_column_sums(const float *src, int64_t rows, int64_t cols, int64_t ld, float *sum);

/* The first failure among a parallel region's threads, with its message: each failing
 * thread calls nn_par_fail (a fsdp2_error has set its own thread's message); after the
 * region, nn_par_result returns the status with that message set on the caller's thread. */
typedef struct nn_par_status {
    fsdp2_status_t status;
    char message[FSDP2_ERROR_MESSAGE_MAX];
} nn_par_status_t;
void nn_par_fail(nn_par_status_t *p, fsdp2_status_t s);
fsdp2_status_t nn_par_result(const nn_par_status_t *p);

/* The row r ([dim] floats) a fused residual + norm normalises: x's without delta, else
 * x + delta written into sum's row r (as fsdp2_nn_residual_forward adds; sum may alias x
 * or delta). */
static inline const float *nn_residual_row(const float *x, const float *delta, float *sum,
                                           int64_t r, int64_t dim)
{
    const float *xr = x + r * dim;
    if (!delta)
        return xr;
    float *sr = sum + r * dim;
    const float *dr = delta + r * dim;
    for (int64_t j = 0; j < dim; j++)
        sr[j] = xr[j] + dr[j];
    return sr;
}

/* ---- preparing (the layers' _prepare functions) ----
 * A layer prepares by calling its own forward and backward while this thread's GEMMs only
 * create primitives (nn_gemm_prepare_begin), on arrays in one span of address space that
 * can be neither read nor written (PROT_NONE, reserved, never backed by memory): a pass
 * that touched data would fault at once rather than compute on nothing. nn_convert_block,
 * nn_load, nn_add_into and nn_column_sums do nothing while preparing; a layer skips its
 * other loops itself (nn_gemm_preparing). */
typedef struct nn_prepare {
    void *span;
    size_t bytes;
} nn_prepare_t;

/* The bytes of a span that holds the largest of count f32 arrays, array i of
 * dims[i][0] x dims[i][1] x dims[i][2] elements (sizes >= 0), or ws bytes if more, and 256
 * bytes for the outputs the calls want apart from their inputs; a product that overflows
 * is refused, naming it. */
fsdp2_status_t nn_prepare_bytes(const int64_t (*dims)[3], int count, size_t ws, size_t *bytes);
/* Reserves bytes (> 0) of span and starts preparing (nn_gemm_prepare_begin). Not nested. */
fsdp2_status_t nn_prepare_begin(nn_prepare_t *p, size_t bytes);
void nn_prepare_end(nn_prepare_t *p);
/* A cpu tensor of dtype and shape whose data is the span (which must hold it). */
void nn_prepare_tensor(const nn_prepare_t *p, fsdp2_tensor_t *t, fsdp2_dtype_t dtype, int ndim,
                       const int64_t *shape);

/* e^x for |x| <= 87 to 2 ulp (e^-87 below, e^88 above), branch-free so that loops over it
 * vectorise (libm's expf does not): x = n ln 2 + f with |f| <= ln 2 / 2, a degree-7
 * Taylor polynomial for e^f (error below 3e-9), and 2^n through the exponent bits. */
static inline float nn_expf(float x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float r = x * 1.44269504089f + magic, n = r - magic;
    float f = x - n * 0.693145751953125f - n * 1.42860682030941723212e-6f;
    float p = 1.0f / 5040;
    p = p * f + 1.0f / 720;
    p = p * f + 1.0f / 120;
    p = p * f + 1.0f / 24;
    p = p * f + 1.0f / 6;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    int32_t bits;
    memcpy(&bits, &r, sizeof(bits)); /* the low mantissa bits of r hold n */
    int32_t scale_bits = (int32_t)((uint32_t)(bits - 0x4b400000 + 127) << 23);
    float scale;
    memcpy(&scale, &scale_bits, sizeof(scale));
    return p * scale;
}

/* tanh(u) = 1 - 2 / (e^(2u) + 1): saturates to +-1 without NaN; absolute error 2e-7. */
static inline float nn_tanhf(float u)
{
    return 1.0f - 2.0f / (nn_expf(2.0f * u) + 1.0f);
}

#endif
