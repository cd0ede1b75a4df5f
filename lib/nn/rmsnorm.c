/* RMSNorm over the last dim, as Llama's: the mean of squares summed in f64 per row, the
 * normalised row scaled by the weight. */
#include <math.h>
#include <string.h>

#include "nn_common.h"

fsdp2_status_t fsdp2_nn_rmsnorm_workspace_bytes(int64_t dim, size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_CHECK(nn_check_dim(dim, "dim"));
    *bytes = 2 * nn_region_bytes(dim); /* the weight as f32; the weight gradient's sums */
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_rmsnorm(const float *x, int64_t rows, const fsdp2_tensor_t *weight,
                                    int64_t *dim)
{
    FSDP2_ARG_CHECK(weight && weight->ndim == 1, "RMSNorm weight must be a 1-D tensor [dim]");
    *dim = weight->shape[0];
    FSDP2_CHECK(nn_check_param(weight, "RMSNorm weight", 1, dim));
    FSDP2_ARG_CHECK(rows >= 0, "rows = %lld is negative", (long long)rows);
    FSDP2_ARG_CHECK(*dim > 0 || rows == 0, "RMSNorm over dim 0");
    FSDP2_ARG_CHECK(x || rows == 0, "x is NULL");
    return FSDP2_SUCCESS;
}

/* The forward of rows of x, or of x + delta (then written to sum first, row by row). */
static fsdp2_status_t forward(const float *x, const float *delta, float *sum, int64_t rows,
                              float eps, const fsdp2_tensor_t *weight, float *y, float *rstd,
                              fsdp2_nn_workspace_t *ws)
{
    int64_t dim;
    FSDP2_CHECK(check_rmsnorm(x, rows, weight, &dim));
    FSDP2_ARG_CHECK((y && rstd) || rows == 0, "y or rstd is NULL");
    FSDP2_ARG_CHECK(eps >= 0 && isfinite(eps), "eps = %g: must be finite and >= 0", (double)eps);
    int staged = weight->dtype != FSDP2_F32;
    size_t need; /* checked whatever the dtypes: a program works the same with bf16 */
    FSDP2_CHECK(fsdp2_nn_rmsnorm_workspace_bytes(dim, &need));
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, need, "RMSNorm", &c));
    const float *w = nn_as_f32(weight, staged ? nn_carve_floats(&c, dim) : NULL);
    FSDP2_OMP("omp parallel for schedule(static) if(rows * dim > FSDP2_PAR_CHUNK)")
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = nn_residual_row(x, delta, sum, r, dim);
        float *yr = y + r * dim;
        double total = 0;
        for (int64_t j = 0; j < dim; j++)
            total += (double)xr[j] * xr[j];
        float s = (float)(1.0 / sqrt(total / (double)dim + eps));
        rstd[r] = s;
        for (int64_t j = 0; j < dim; j++)
            yr[j] = w[j] * (xr[j] * s);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_rmsnorm_forward(const float *x, int64_t rows, float eps,
                                        const fsdp2_tensor_t *weight, float *y, float *rstd,
                                        fsdp2_nn_workspace_t *ws)
{
    return forward(x, NULL, NULL, rows, eps, weight, y, rstd, ws);
}

fsdp2_status_t fsdp2_nn_add_rmsnorm_forward(const float *x, const float *delta, int64_t rows,
                                            float eps, const fsdp2_tensor_t *weight, float *sum,
                                            float *y, float *rstd, fsdp2_nn_workspace_t *ws)
{
    FSDP2_ARG_CHECK((delta && sum) || rows == 0, "delta or sum is NULL");
    FSDP2_ARG_CHECK(y != sum || rows == 0, "y aliases sum: both are outputs");
    return forward(x, delta, sum, rows, eps, weight, y, rstd, ws);
}

fsdp2_status_t fsdp2_nn_rmsnorm_backward(const float *x, const float *rstd, const float *dy,
                                         int64_t rows, const fsdp2_tensor_t *weight, float *dx,
                                         fsdp2_tensor_t *dweight, fsdp2_nn_workspace_t *ws)
{
    int64_t dim;
    FSDP2_CHECK(check_rmsnorm(x, rows, weight, &dim));
    FSDP2_ARG_CHECK((rstd && dy) || rows == 0, "rstd or dy is NULL");
    if (dweight)
        FSDP2_CHECK(nn_check_param(dweight, "RMSNorm weight gradient", 1, &dim));
    FSDP2_ARG_CHECK(!dx || (dx != dy && dx != x), "dx aliases x or dy: the backward adds into dx");
    int staged = weight->dtype != FSDP2_F32 || (dweight && dweight->dtype != FSDP2_F32);
    size_t need;
    FSDP2_CHECK(fsdp2_nn_rmsnorm_workspace_bytes(dim, &need));
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, need, "RMSNorm backward", &c));
    const float *w = nn_as_f32(weight, staged ? nn_carve_floats(&c, dim) : NULL);
    float *gw = NULL;
    if (dweight) {
        gw = dweight->dtype == FSDP2_F32 ? dweight->data : nn_carve_floats(&c, dim);
        if (dweight->dtype != FSDP2_F32)
            memset(gw, 0, sizeof(float) * (size_t)dim);
    }
    /* dx by rows; the weight gradient, a sum over rows, by columns, each column in row
     * order: the bits do not depend on the thread count */
    FSDP2_OMP("omp parallel for schedule(static) if(dx && rows * dim > FSDP2_PAR_CHUNK)")
    for (int64_t r = 0; r < (dx ? rows : 0); r++) {
        const float *xr = x + r * dim, *dr = dy + r * dim;
        float s = rstd[r];
        /* dx = s (g - xhat mean(g xhat)) with g = dy * w and xhat = x s */
        double sum_gx = 0;
        for (int64_t j = 0; j < dim; j++) {
            float xhat = xr[j] * s;
            sum_gx += (double)(dr[j] * w[j]) * xhat;
        }
        float mgx = (float)(sum_gx / (double)dim);
        float *xo = dx + r * dim;
        for (int64_t j = 0; j < dim; j++)
            xo[j] += s * (dr[j] * w[j] - xr[j] * s * mgx);
    }
    FSDP2_OMP("omp parallel if(gw && rows * dim > FSDP2_PAR_CHUNK)")
    {
        int64_t j0, j1;
        nn_column_range(gw ? dim : 0, nn_thread_index(), nn_region_threads(), &j0, &j1);
        for (int64_t r = 0; j0 < j1 && r < rows; r++) {
            const float *xr = x + r * dim, *dr = dy + r * dim;
            float s = rstd[r];
            for (int64_t j = j0; j < j1; j++)
                gw[j] += dr[j] * (xr[j] * s);
        }
    }
    if (gw && dweight->dtype != FSDP2_F32)
        nn_add_into(dweight, 0, gw, dim);
    return FSDP2_SUCCESS;
}
