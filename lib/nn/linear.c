/* Linear layer: y = x W^T + b through nn_sgemm. An f32 weight and an f32 gradient go to it
 * directly; a bf16 one is converted (or accumulated) in blocks of rows of about 1 MiB of
 * f32, so the workspace stays small whatever the layer's size. */
#include <string.h>

#include "gemm.h"
#include "nn_common.h"

/* f32 elements per conversion block: about 1 MiB, a size that stays in any current
 * core's L2 or L3 with the GEMM's panels; it also fixes the workspace the queries report,
 * so it is a constant of the API rather than an environment tunable. */
#define LINEAR_BLOCK_FLOATS (1 << 18)

static int64_t block_rows(int64_t in, int64_t out)
{
    int64_t rb = in > 0 ? LINEAR_BLOCK_FLOATS / in : out;
    rb = rb < 1 ? 1 : rb;
    return rb < out ? rb : out;
}

fsdp2_status_t fsdp2_nn_linear_workspace_bytes(int64_t in, int64_t out, size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_CHECK(nn_check_dim(in, "in"));
    FSDP2_CHECK(nn_check_dim(out, "out"));
    int64_t rb = block_rows(in, out);
    *bytes = 2 * nn_region_bytes(rb * in) + nn_region_bytes(out);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_linear(const float *x, int64_t rows, const fsdp2_tensor_t *weight,
                                   int64_t *in, int64_t *out)
{
    FSDP2_ARG_CHECK(x || rows == 0, "x is NULL");
    FSDP2_CHECK(nn_check_dim(rows, "rows"));
    FSDP2_ARG_CHECK(weight && weight->ndim == 2, "linear weight must be a 2-D tensor [out, in]");
    *out = weight->shape[0];
    *in = weight->shape[1];
    FSDP2_CHECK(nn_check_param(weight, "linear weight", 2, weight->shape));
    FSDP2_CHECK(nn_check_dim(*in, "in"));
    return nn_check_dim(*out, "out");
}

fsdp2_status_t fsdp2_nn_linear_forward(const float *x, int64_t rows, const fsdp2_tensor_t *weight,
                                       const fsdp2_tensor_t *bias, float *y,
                                       fsdp2_nn_workspace_t *ws)
{
    int64_t in, out;
    FSDP2_CHECK(check_linear(x, rows, weight, &in, &out));
    FSDP2_ARG_CHECK(y || rows == 0, "y is NULL");
    if (bias)
        FSDP2_CHECK(nn_check_param(bias, "linear bias", 1, &out));
    int staged = weight->dtype != FSDP2_F32 || (bias && bias->dtype != FSDP2_F32);
    size_t need; /* checked whatever the dtypes: a program works the same with bf16 */
    FSDP2_CHECK(fsdp2_nn_linear_workspace_bytes(in, out, &need));
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, need, "linear forward", &c));
    if (rows == 0 || out == 0)
        return FSDP2_SUCCESS;
    int64_t rb = block_rows(in, out);
    float *wblk = staged ? nn_carve_floats(&c, rb * in) : NULL;
    float *b32 = staged ? nn_carve_floats(&c, out) : NULL;
    float beta = 0.0f;
    if (in == 0) { /* an empty product: y is the bias (BLAS refuses a leading dim of 0) */
        for (int64_t r = 0; r < rows; r++) {
            if (bias)
                memcpy(y + r * out, nn_as_f32(bias, b32), sizeof(float) * (size_t)out);
            else
                memset(y + r * out, 0, sizeof(float) * (size_t)out);
        }
        return FSDP2_SUCCESS;
    }
    if (bias) {
        const float *b = nn_as_f32(bias, b32);
        for (int64_t r = 0; r < rows; r++)
            memcpy(y + r * out, b, sizeof(float) * (size_t)out);
        beta = 1.0f;
    }
    if (weight->dtype == FSDP2_F32) {
        FSDP2_CHECK(nn_sgemm(0, 1, rows, out, in, 1.0f, x, in, weight->data, in, beta, y, out));
        return FSDP2_SUCCESS;
    }
    for (int64_t r0 = 0; r0 < out; r0 += rb) {
        int64_t n = out - r0 < rb ? out - r0 : rb;
        nn_load(wblk, weight, r0 * in, n * in);
        FSDP2_CHECK(nn_sgemm(0, 1, rows, n, in, 1.0f, x, in, wblk, in, beta, y + r0, out));
    }
    return FSDP2_SUCCESS;
}

/* dbias += column sums of dy, summed in f32 (into the gradient itself when it is f32). */
static void bias_grad(const float *dy, int64_t rows, int64_t out, fsdp2_tensor_t *dbias,
                      float *acc)
{
    float *sum = dbias->dtype == FSDP2_F32 ? dbias->data : acc;
    if (sum == acc)
        memset(acc, 0, sizeof(float) * (size_t)out);
    for (int64_t r = 0; r < rows; r++) {
        const float *d = dy + r * out;
        for (int64_t j = 0; j < out; j++)
            sum[j] += d[j];
    }
    if (sum == acc)
        nn_add_into(dbias, 0, acc, out);
}

fsdp2_status_t fsdp2_nn_linear_backward(const float *x, const float *dy, int64_t rows,
                                        const fsdp2_tensor_t *weight, float *dx,
                                        fsdp2_tensor_t *dweight, fsdp2_tensor_t *dbias,
                                        fsdp2_nn_workspace_t *ws)
{
    int64_t in, out;
    FSDP2_CHECK(check_linear(x, rows, weight, &in, &out));
    FSDP2_ARG_CHECK(dy || rows == 0, "dy is NULL");
    if (dweight)
        FSDP2_CHECK(nn_check_param(dweight, "linear weight gradient", 2, weight->shape));
    if (dbias)
        FSDP2_CHECK(nn_check_param(dbias, "linear bias gradient", 1, &out));
    int w16 = dx && weight->dtype != FSDP2_F32;
    int g16 = dweight && dweight->dtype != FSDP2_F32;
    int staged = w16 || g16 || (dbias && dbias->dtype != FSDP2_F32);
    size_t need;
    FSDP2_CHECK(fsdp2_nn_linear_workspace_bytes(in, out, &need));
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, need, "linear backward", &c));
    if (rows == 0 || out == 0 || in == 0) {
        if (dbias && rows > 0)
            bias_grad(dy, rows, out, dbias, staged ? nn_carve_floats(&c, out) : NULL);
        return FSDP2_SUCCESS;
    }
    int64_t rb = block_rows(in, out);
    float *wblk = staged ? nn_carve_floats(&c, rb * in) : NULL;
    float *gblk = staged ? nn_carve_floats(&c, rb * in) : NULL;
    float *acc = staged ? nn_carve_floats(&c, out) : NULL;
    if (dbias)
        bias_grad(dy, rows, out, dbias, acc);
    if (dweight && !g16)
        FSDP2_CHECK(nn_sgemm(1, 0, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dweight->data, in));
    if (dx && !w16)
        FSDP2_CHECK(nn_sgemm(0, 0, rows, in, out, 1.0f, dy, out, weight->data, in, 1.0f, dx, in));
    if (!w16 && !g16)
        return FSDP2_SUCCESS;
    for (int64_t r0 = 0; r0 < out; r0 += rb) {
        int64_t n = out - r0 < rb ? out - r0 : rb;
        if (g16) {
            FSDP2_CHECK(nn_sgemm(1, 0, n, in, rows, 1.0f, dy + r0, out, x, in, 0.0f, gblk, in));
            nn_add_into(dweight, r0 * in, gblk, n * in);
        }
        if (w16) {
            nn_load(wblk, weight, r0 * in, n * in);
            FSDP2_CHECK(nn_sgemm(0, 0, rows, in, n, 1.0f, dy + r0, out, wblk, in, 1.0f, dx, in));
        }
    }
    return FSDP2_SUCCESS;
}
