/* Layer norm over the last dim. Row statistics are summed in f64 (two passes: mean, then
 * the centred squares), which keeps rows with a large mean exact to f32. */
#include <math.h>
#include <string.h>

#include "nn_common.h"

fsdp2_status_t fsdp2_nn_layernorm_workspace_bytes(int64_t dim, size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_CHECK(nn_check_dim(dim, "dim"));
    *bytes = 4 * nn_region_bytes(dim); /* weight, bias as f32; two gradient sums */
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_norm(const float *x, int64_t rows, const fsdp2_tensor_t *weight,
                                 const fsdp2_tensor_t *bias, int64_t *dim)
{
    FSDP2_ARG_CHECK(weight && weight->ndim == 1, "layer norm weight must be a 1-D tensor [dim]");
    *dim = weight->shape[0];
    FSDP2_CHECK(nn_check_param(weight, "layer norm weight", 1, dim));
    if (bias)
        FSDP2_CHECK(nn_check_param(bias, "layer norm bias", 1, dim));
    FSDP2_ARG_CHECK(rows >= 0, "rows = %lld is negative", (long long)rows);
    FSDP2_ARG_CHECK(*dim > 0 || rows == 0, "layer norm over dim 0");
    FSDP2_ARG_CHECK(x || rows == 0, "x is NULL");
    return FSDP2_SUCCESS;
}

/* The forward of rows of x, or of x + delta (then written to sum first, row by row, and
 * normalised from there while the row is in cache). */
static fsdp2_status_t forward(const float *x, const float *delta, float *sum, int64_t rows,
                              float eps, const fsdp2_tensor_t *weight, const fsdp2_tensor_t *bias,
                              float *y, float *mean, float *rstd, fsdp2_nn_workspace_t *ws)
{
    int64_t dim;
    FSDP2_CHECK(check_norm(x, rows, weight, bias, &dim));
    FSDP2_ARG_CHECK((y && mean && rstd) || rows == 0, "y, mean or rstd is NULL");
    FSDP2_ARG_CHECK(eps >= 0 && isfinite(eps), "eps = %g: must be finite and >= 0", (double)eps);
    int staged = weight->dtype != FSDP2_F32 || (bias && bias->dtype != FSDP2_F32);
    size_t need; /* checked whatever the dtypes: a program works the same with bf16 */
    FSDP2_CHECK(fsdp2_nn_layernorm_workspace_bytes(dim, &need));
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, need, "layer norm", &c));
    const float *w = nn_as_f32(weight, staged ? nn_carve_floats(&c, dim) : NULL);
    float *b32 = staged ? nn_carve_floats(&c, dim) : NULL;
    const float *b = bias ? nn_as_f32(bias, b32) : NULL;
    FSDP2_OMP("omp parallel for schedule(static) if(rows * dim > FSDP2_PAR_CHUNK)")
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = nn_residual_row(x, delta, sum, r, dim);
        float *yr = y + r * dim;
        double total = 0;
        for (int64_t j = 0; j < dim; j++)
            total += xr[j];
        double mu = total / (double)dim, var = 0;
        for (int64_t j = 0; j < dim; j++)
            var += ((double)xr[j] - mu) * ((double)xr[j] - mu);
        float m = (float)mu, s = (float)(1.0 / sqrt(var / (double)dim + eps));
        mean[r] = m;
        rstd[r] = s;
        for (int64_t j = 0; j < dim; j++)
            yr[j] = (xr[j] - m) * s * w[j] + (b ? b[j] : 0.0f);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_layernorm_forward(const float *x, int64_t rows, float eps,
                                          const fsdp2_tensor_t *weight, const fsdp2_tensor_t *bias,
                                          float *y, float *mean, float *rstd,
                                          fsdp2_nn_workspace_t *ws)
{
    return forward(x, NULL, NULL, rows, eps, weight, bias, y, mean, rstd, ws);
}

fsdp2_status_t fsdp2_nn_add_layernorm_forward(const float *x, const float *delta, int64_t rows,
                                              float eps, const fsdp2_tensor_t *weight,
                                              const fsdp2_tensor_t *bias, float *sum, float *y,
                                              float *mean, float *rstd, fsdp2_nn_workspace_t *ws)
{
    FSDP2_ARG_CHECK((delta && sum) || rows == 0, "delta or sum is NULL");
    FSDP2_ARG_CHECK(y != sum || rows == 0, "y aliases sum: both are outputs");
    return forward(x, delta, sum, rows, eps, weight, bias, y, mean, rstd, ws);
}

fsdp2_status_t fsdp2_nn_layernorm_backward(const float *x, const float *mean, const float *rstd,
                                           const float *dy, int64_t rows,
                                           const fsdp2_tensor_t *weight, float *dx,
                                           fsdp2_tensor_t *dweight, fsdp2_tensor_t *dbias,
                                           fsdp2_nn_workspace_t *ws)
{
    int64_t dim;
    FSDP2_CHECK(check_norm(x, rows, weight, NULL, &dim));
    FSDP2_ARG_CHECK((mean && rstd && dy) || rows == 0, "mean, rstd or dy is NULL");
    /* dx is written for every row before the parameter gradients read x and dy */
    FSDP2_ARG_CHECK(!dx || (dx != dy && dx != x), "dx aliases x or dy: the backward adds into dx");
    if (dweight)
        FSDP2_CHECK(nn_check_param(dweight, "layer norm weight gradient", 1, &dim));
    if (dbias)
        FSDP2_CHECK(nn_check_param(dbias, "layer norm bias gradient", 1, &dim));
    int staged = weight->dtype != FSDP2_F32 || (dweight && dweight->dtype != FSDP2_F32) ||
                 (dbias && dbias->dtype != FSDP2_F32);
    size_t need;
    FSDP2_CHECK(fsdp2_nn_layernorm_workspace_bytes(dim, &need));
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, need, "layer norm backward", &c));
    const float *w = nn_as_f32(weight, staged ? nn_carve_floats(&c, dim) : NULL);
    float *gw = NULL, *gb = NULL;
    if (dweight) {
        gw = dweight->dtype == FSDP2_F32 ? dweight->data : nn_carve_floats(&c, dim);
        if (dweight->dtype != FSDP2_F32)
            memset(gw, 0, sizeof(float) * (size_t)dim);
    }
    if (dbias) {
        gb = dbias->dtype == FSDP2_F32 ? dbias->data : nn_carve_floats(&c, dim);
        if (dbias->dtype != FSDP2_F32)
            memset(gb, 0, sizeof(float) * (size_t)dim);
    }
    /* dx by rows; the parameter gradients, sums over rows, by columns, each column in row
     * order: the bits do not depend on the thread count */
    FSDP2_OMP("omp parallel for schedule(static) if(dx && rows * dim > FSDP2_PAR_CHUNK)")
    for (int64_t r = 0; r < (dx ? rows : 0); r++) {
        const float *xr = x + r * dim, *dr = dy + r * dim;
        float m = mean[r], s = rstd[r];
        /* dx = s (g - mean(g) - xhat mean(g xhat)) with g = dy * w */
        double sum_g = 0, sum_gx = 0;
        for (int64_t j = 0; j < dim; j++) {
            float xhat = (xr[j] - m) * s, g = dr[j] * w[j];
            sum_g += g;
            sum_gx += (double)g * xhat;
        }
        float mg = (float)(sum_g / (double)dim), mgx = (float)(sum_gx / (double)dim);
        float *xo = dx + r * dim;
        for (int64_t j = 0; j < dim; j++) {
            float xhat = (xr[j] - m) * s;
            xo[j] += s * (dr[j] * w[j] - mg - xhat * mgx);
        }
    }
    FSDP2_OMP("omp parallel if((gw || gb) && rows * dim > FSDP2_PAR_CHUNK)")
    {
        int64_t j0, j1;
        nn_column_range(gw || gb ? dim : 0, nn_thread_index(), nn_region_threads(), &j0, &j1);
        for (int64_t r = 0; j0 < j1 && r < rows; r++) {
            const float *xr = x + r * dim, *dr = dy + r * dim;
            float m = mean[r], s = rstd[r];
            for (int64_t j = j0; gw && j < j1; j++)
                gw[j] += dr[j] * ((xr[j] - m) * s);
            for (int64_t j = j0; gb && j < j1; j++)
                gb[j] += dr[j];
        }
    }
    if (gw && dweight->dtype != FSDP2_F32)
        nn_add_into(dweight, 0, gw, dim);
    if (gb && dbias->dtype != FSDP2_F32)
        nn_add_into(dbias, 0, gb, dim);
    return FSDP2_SUCCESS;
}
