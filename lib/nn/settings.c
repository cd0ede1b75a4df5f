/* The layers' process-wide settings: the thread pool's size, the compute dtype, and whether
 * GEMMs take bf16 operands (FSDP2_NN_BF16_GEMM). */
#include <fsdp2/dtype.h>
#include <fsdp2/nn.h>

#include "core/env_internal.h"
#include "core/error.h"
#include "gemm.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef FSDP2_HAVE_ONEDNN
void openblas_set_num_threads(int threads);
#endif

/* FSDP2_NN_BF16_GEMM's choices, in the env table's order. */
enum { BF16_GEMM_AUTO, BF16_GEMM_ON, BF16_GEMM_OFF };

fsdp2_status_t nn_gemm_bf16_wanted(int *wanted)
{
    FSDP2_CHECK(fsdp2_env_init()); /* a bad value is an error, naming it */
    int64_t mode = fsdp2_env_int(FSDP2_ENV_NN_BF16_GEMM);
    *wanted = mode == BF16_GEMM_ON || (mode == BF16_GEMM_AUTO && nn_gemm_bf16_native());
    return FSDP2_SUCCESS;
}

/* fsdp2_nn_set_compute_dtype's setting: 1 for bf16. */
static int compute_bf16;

fsdp2_status_t fsdp2_nn_set_compute_dtype(fsdp2_dtype_t dtype)
{
    FSDP2_ARG_CHECK(dtype == FSDP2_F32 || dtype == FSDP2_BF16,
                    "dtype = %d (%s): the layers compute in f32 or bf16", (int)dtype,
                    fsdp2_dtype_name(dtype));
    __atomic_store_n(&compute_bf16, dtype == FSDP2_BF16, __ATOMIC_RELAXED);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_get_compute_dtype(fsdp2_dtype_t *dtype)
{
    FSDP2_ARG_CHECK(dtype, "dtype is NULL");
    *dtype = __atomic_load_n(&compute_bf16, __ATOMIC_RELAXED) ? FSDP2_BF16 : FSDP2_F32;
    return FSDP2_SUCCESS;
}

fsdp2_status_t nn_compute_bf16_wanted(int *wanted)
{
    *wanted = 0;
    if (!__atomic_load_n(&compute_bf16, __ATOMIC_RELAXED))
        return FSDP2_SUCCESS; /* the environment is not consulted: f32 as it always was */
    return nn_gemm_bf16_wanted(wanted);
}

fsdp2_status_t fsdp2_nn_set_threads(int threads)
{
    FSDP2_ARG_CHECK(threads >= 1, "threads = %d: the layers need at least 1", threads);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
#ifndef FSDP2_HAVE_ONEDNN
    openblas_set_num_threads(threads);
#endif
    return FSDP2_SUCCESS;
}
