/* Shared checks and conversions of the layers. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <fsdp2/dtype.h>

#include "core/cpu_kernels.h"
#include "gemm.h"
#include "nn_common.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define NN_ALIGN 64

fsdp2_status_t nn_check_dtype(fsdp2_dtype_t dtype, const char *what)
{
    if (dtype != FSDP2_F32 && dtype != FSDP2_BF16)
        return fsdp2_error(FSDP2_ERR_DTYPE_MISMATCH, "%s dtype %s (%d): the layers take f32 or bf16",
                           what, fsdp2_dtype_name(dtype), (int)dtype);
    return FSDP2_SUCCESS;
}

fsdp2_status_t nn_check_param(const fsdp2_tensor_t *t, const char *what, int ndim,
                              const int64_t *shape)
{
    if (!t)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    if (t->device.type != FSDP2_DEVICE_CPU)
        return fsdp2_error(FSDP2_ERR_DEVICE_MISMATCH,
                           "%s is on device type %d: the layers compute on the cpu device",
                           what, (int)t->device.type);
    if (t->dtype != FSDP2_F32 && t->dtype != FSDP2_BF16)
        return fsdp2_error(FSDP2_ERR_DTYPE_MISMATCH, "%s has dtype %s: the layers take f32 or bf16",
                           what, fsdp2_dtype_name(t->dtype));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char have[96], want[96];
        fsdp2_shape_format(t->ndim, t->shape, have, sizeof(have));
        fsdp2_shape_format(ndim, shape, want, sizeof(want));
        return fsdp2_error(FSDP2_ERR_SHAPE_MISMATCH, "%s has shape %s where %s is needed", what,
                           have, want);
    }
    if (t->numel > 0 && !t->data)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "%s has no data", what);
    return FSDP2_SUCCESS;
}

fsdp2_status_t nn_check_dim(int64_t v, const char *what)
{
    if (v < 0 || v > INT_MAX)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "%s = %lld is outside [0, %d]", what,
                           (long long)v, INT_MAX);
    return FSDP2_SUCCESS;
}

size_t nn_region_bytes(int64_t n)
{
    return (((size_t)n * sizeof(float) + NN_ALIGN - 1) / NN_ALIGN) * NN_ALIGN + NN_ALIGN;
}

fsdp2_status_t nn_carve_begin(fsdp2_nn_workspace_t *ws, size_t need, const char *what,
                              nn_carve_t *c)
{
    c->at = NULL;
    c->left = 0;
    if (need == 0)
        return FSDP2_SUCCESS;
    if (!ws || !ws->data || ws->bytes < need)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "%s needs a workspace of %zu bytes; it was given %zu", what, need,
                           ws && ws->data ? ws->bytes : (size_t)0);
    c->at = ws->data;
    c->left = ws->bytes;
    return FSDP2_SUCCESS;
}

float *nn_carve_floats(nn_carve_t *c, int64_t n)
{
    uintptr_t p = ((uintptr_t)c->at + NN_ALIGN - 1) & ~(uintptr_t)(NN_ALIGN - 1);
    size_t used = (size_t)(p - (uintptr_t)c->at) + (size_t)n * sizeof(float);
    c->at += used;
    c->left -= used;
    return (float *)p;
}

void nn_convert_block(void *dst, fsdp2_dtype_t dt, const void *src, fsdp2_dtype_t st,
                      int64_t ld, int64_t r0, int64_t c0, int64_t rows, int64_t cols)
{
    if (nn_gemm_preparing())
        return;
    size_t de = dt == FSDP2_F32 ? sizeof(float) : sizeof(uint16_t);
    size_t se = st == FSDP2_F32 ? sizeof(float) : sizeof(uint16_t);
    const char *from = (const char *)src + ((size_t)r0 * (size_t)ld + (size_t)c0) * se;
    if (cols == ld) { /* whole rows: one run */
        fsdp2_convert(dst, dt, from, st, (size_t)(rows * cols));
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        fsdp2_convert((char *)dst + (size_t)(r * cols) * de, dt, from + (size_t)(r * ld) * se,
                      st, (size_t)cols);
}

void nn_load(float *dst, const fsdp2_tensor_t *t, int64_t first, int64_t count)
{
    if (nn_gemm_preparing())
        return;
    size_t elem = t->dtype == FSDP2_F32 ? sizeof(float) : sizeof(uint16_t);
    /* f32 or bf16, checked by nn_check_param: the conversion cannot fail */
    fsdp2_convert(dst, FSDP2_F32, (const char *)t->data + (size_t)first * elem, t->dtype,
                  (size_t)count);
}

void nn_add_into(fsdp2_tensor_t *t, int64_t first, const float *src, int64_t count)
{
    if (nn_gemm_preparing())
        return;
    size_t elem = t->dtype == FSDP2_F32 ? sizeof(float) : sizeof(uint16_t);
    fsdp2_cpu_accumulate((char *)t->data + (size_t)first * elem, t->dtype, src, FSDP2_F32,
                         (size_t)count, 1.0);
}

const float *nn_as_f32(const fsdp2_tensor_t *t, float *scratch)
{
    if (t->dtype == FSDP2_F32)
        return t->data;
    nn_load(scratch, t, 0, t->numel);
    return scratch;
}

int nn_threads(void)
{
#ifdef _OPENMP
    return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    return 1;
#endif
}

int nn_region_threads(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

int nn_thread_index(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

void nn_column_range(int64_t n, int thread, int threads, int64_t *first, int64_t *end)
{
    int64_t lines = (n + 15) / 16, a = lines * thread / threads * 16,
            b = lines * (thread + 1) / threads * 16;
    *first = a < n ? a : n;
    *end = b < n ? b : n;
}

void nn_column_sums(const float *src, int64_t rows, int64_t cols, int64_t ld, float *sum)
{
    if (nn_gemm_preparing())
        return;
    FSDP2_OMP("omp parallel if(rows * cols > FSDP2_PAR_CHUNK)")
    {
        int64_t j0, j1;
        nn_column_range(cols, nn_thread_index(), nn_region_threads(), &j0, &j1);
        for (int64_t r = 0; r < rows; r++) {
            const float *s = src + r * ld;
            for (int64_t j = j0; j < j1; j++)
                sum[j] += s[j];
        }
    }
}

void nn_par_fail(nn_par_status_t *p, fsdp2_status_t s)
{
    FSDP2_OMP("omp critical(nn_par_status)")
    {
        if (p->status == FSDP2_SUCCESS) {
            p->status = s;
            snprintf(p->message, sizeof(p->message), "%s", fsdp2_last_error());
        }
    }
}

fsdp2_status_t nn_par_result(const nn_par_status_t *p)
{
    if (p->status != FSDP2_SUCCESS)
        fsdp2_error_set_message(p->message);
    return p->status;
}

fsdp2_status_t nn_prepare_bytes(const int64_t (*dims)[3], int count, size_t ws, size_t *bytes)
{
    uint64_t most = ws;
    for (int i = 0; i < count; i++) {
        uint64_t n = sizeof(float);
        for (int j = 0; j < 3; j++)
            if (__builtin_mul_overflow(n, (uint64_t)dims[i][j], &n))
                return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                                   "preparing: an array of %lld x %lld x %lld floats overflows "
                                   "the address space",
                                   (long long)dims[i][0], (long long)dims[i][1],
                                   (long long)dims[i][2]);
        most = n > most ? n : most;
    }
    FSDP2_ARG_CHECK(most <= SIZE_MAX - 256, "preparing: %llu bytes overflow a size",
                    (unsigned long long)most);
    *bytes = (size_t)most + 256;
    return FSDP2_SUCCESS;
}

fsdp2_status_t nn_prepare_begin(nn_prepare_t *p, size_t bytes)
{
    p->bytes = bytes;
    p->span = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p->span == MAP_FAILED) {
        p->span = NULL;
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY,
                           "preparing the GEMMs: no %zu bytes of address space to lay out the "
                           "arrays in (mmap: %s)",
                           bytes, strerror(errno));
    }
    nn_gemm_prepare_begin();
    return FSDP2_SUCCESS;
}

void nn_prepare_end(nn_prepare_t *p)
{
    nn_gemm_prepare_end();
    if (p->span)
        munmap(p->span, p->bytes);
    p->span = NULL;
}

void nn_prepare_tensor(const nn_prepare_t *p, fsdp2_tensor_t *t, fsdp2_dtype_t dtype, int ndim,
                       const int64_t *shape)
{
    memset(t, 0, sizeof(*t));
    t->data = p->span;
    t->dtype = dtype;
    t->device = (fsdp2_device_t)FSDP2_DEVICE_CPU_INIT;
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= shape[i];
    }
    t->nbytes = (size_t)t->numel * (dtype == FSDP2_F32 ? sizeof(float) : sizeof(uint16_t));
}
