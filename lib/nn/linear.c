/* Linear layer: y = x W^T + b through nn_sgemm. An f32 weight and an f32 gradient go to it
 * directly; a bf16 one is converted (or accumulated) in blocks of about 1 MiB of f32, so
 * the workspace stays small whatever the layer's size. y and dW go by blocks of rows of W,
 * which keep their GEMMs' whole reduction (over in, over the rows of x). dx = dy W
 * reduces over out: by blocks of rows of W its GEMMs reduce over the block's rows only,
 * so where in > out (a block then has fewer rows than a block of columns has columns)
 * dx goes by blocks of columns of W instead, each GEMM reducing over all of out. Where
 * FSDP2_NN_BF16_GEMM says so (nn_gemm_bf16_wanted), a bf16 weight is not converted: x and dy
 * are rounded to bf16 instead and the GEMMs take bf16 operands (see below). */
#include <string.h>

#include "gemm.h"
#include "nn_common.h"

/* f32 elements per conversion block: about 1 MiB, a size that stays in any current
 * core's L2 or L3 with the GEMM's panels; it also fixes the workspace the queries report,
 * so it is a constant of the API rather than an environment tunable. */
#define LINEAR_BLOCK_FLOATS (1 << 18)

/* A block's side along a dimension of size total, the other side being across: as many
 * as fit LINEAR_BLOCK_FLOATS, a multiple of 64 (the GEMM kernels' panel width) when the
 * dimension takes more than one block, at least 1. */
static int64_t block_side(int64_t across, int64_t total)
{
    int64_t side = across > 0 ? LINEAR_BLOCK_FLOATS / across : total;
    if (side >= total)
        return total;
    if (side >= 64)
        side -= side % 64;
    return side < 1 ? 1 : side;
}

/* Rows of W per block of the forward and of a bf16 weight gradient: [rows, in]. */
static int64_t block_rows(int64_t in, int64_t out)
{
    return block_side(in, out);
}

/* dx's blocks of W, [krows, cols]: rows of W (cols = in) where in <= out; else whole
 * columns (krows = out) of at least 64 columns, or, when 64 whole columns exceed a
 * block (out > 4096), 64 columns of krows rows, a multiple of 64 of at least 4096. */
static void dx_block(int64_t in, int64_t out, int64_t *krows, int64_t *cols)
{
    if (in <= out) {
        *krows = block_rows(in, out);
        *cols = in;
        return;
    }
    int64_t c = block_side(out, in);
    if (c < 64 && in > c)
        c = 64;
    *cols = c;
    *krows = block_side(c, out);
}

/* The f32 floats of the block a bf16 weight is converted into: the larger of the two. */
static int64_t weight_block_floats(int64_t in, int64_t out)
{
    int64_t krows, cols, rows = block_rows(in, out) * in;
    dx_block(in, out, &krows, &cols);
    return krows * cols > rows ? krows * cols : rows;
}

/* ---- bf16 operands (nn_gemm_bf16_wanted, a bf16 weight) ----
 * The weight goes to nn_gemm_bf16 as it is; x and dy are rounded to bf16 (to nearest
 * even, fsdp2_convert) in blocks of rows, into the workspace's weight region, which this
 * path does not otherwise need: cap = 2 weight_block_floats(in, out) bf16 values, at least
 * two rows of x, and out + in values of dy's and x's rows (weight_block_floats >=
 * block_rows(in, out) in). */

/* rows x cols of a row-major f32 array (leading dimension ld) from (r0, c0), rounded to
 * bf16 into dst, dense [rows, cols]. */
static void to_bf16(uint16_t *dst, const float *src, int64_t ld, int64_t r0, int64_t c0,
                    int64_t rows, int64_t cols)
{
    nn_convert_block(dst, FSDP2_BF16, src, FSDP2_F32, ld, r0, c0, rows, cols);
}

/* y = x W^T + b by blocks of rows of x. */
static fsdp2_status_t forward_bf16_operands(const float *x, int64_t rows,
                                            const fsdp2_tensor_t *weight, const float *b,
                                            float *y, uint16_t *buf, int64_t cap)
{
    int64_t out = weight->shape[0], in = weight->shape[1];
    int64_t step = in > 0 ? cap / in : rows;
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
        int64_t m = rows - r0 < step ? rows - r0 : step;
        to_bf16(buf, x, in, r0, 0, m, in);
        FSDP2_CHECK(nn_gemm_bf16_bias(0, 1, m, out, in, buf, in, weight->data, in, b,
                                      y + r0 * out, out));
    }
    return FSDP2_SUCCESS;
}

/* dW += dy^T x by blocks of n rows of W (block_rows, as the f32 path's bf16 gradients),
 * each summing over all rows of x in blocks of nr rows: dy[r0:, w0:w0+n] and x[r0:] rounded
 * into buf as [nr, n] and [nr, in]. The sums go into an f32 gradient itself, or, for a
 * bf16 one, into gblk [n, in], added (rounded once) when the block's sum is whole. */
static fsdp2_status_t dweight_bf16_operands(const float *x, const float *dy, int64_t rows,
                                            int64_t in, int64_t out, fsdp2_tensor_t *dweight,
                                            uint16_t *buf, int64_t cap, float *gblk)
{
    int64_t rb = block_rows(in, out);
    int g16 = dweight->dtype != FSDP2_F32;
    for (int64_t w0 = 0; w0 < out; w0 += rb) {
        int64_t n = out - w0 < rb ? out - w0 : rb, nr = cap / (n + in);
        float *sum = g16 ? gblk : (float *)dweight->data + w0 * in;
        for (int64_t r0 = 0; r0 < rows; r0 += nr) {
            int64_t m = rows - r0 < nr ? rows - r0 : nr;
            to_bf16(buf, dy, out, r0, w0, m, n);
            to_bf16(buf + m * n, x, in, r0, 0, m, in);
            FSDP2_CHECK(nn_gemm_bf16(1, 0, n, in, m, 1.0f, buf, n, buf + m * n, in,
                                     g16 && r0 == 0 ? 0.0f : 1.0f, sum, in));
        }
        if (g16)
            nn_add_into(dweight, w0 * in, gblk, n * in);
    }
    return FSDP2_SUCCESS;
}

/* dx += dy W by blocks of rows of dy rounded into buf, each over all of out where a row
 * fits buf, else over pieces of out (multiples of 64). */
static fsdp2_status_t dx_bf16_operands(const float *dy, int64_t rows, int64_t in, int64_t out,
                                       const uint16_t *w, float *dx, uint16_t *buf,
                                       int64_t cap)
{
    int64_t nk = out <= cap ? out : cap - cap % 64, step = cap / nk;
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
        int64_t m = rows - r0 < step ? rows - r0 : step;
        for (int64_t k0 = 0; k0 < out; k0 += nk) {
            int64_t kk = out - k0 < nk ? out - k0 : nk;
            to_bf16(buf, dy, out, r0, k0, m, kk);
            FSDP2_CHECK(nn_gemm_bf16(0, 0, m, in, kk, 1.0f, buf, kk, w + k0 * in, in, 1.0f,
                                     dx + r0 * in, in));
        }
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t backward_bf16_operands(const float *x, const float *dy, int64_t rows,
                                             const fsdp2_tensor_t *weight, float *dx,
                                             fsdp2_tensor_t *dweight, uint16_t *buf,
                                             int64_t cap, float *gblk)
{
    int64_t out = weight->shape[0], in = weight->shape[1];
    if (dweight)
        FSDP2_CHECK(dweight_bf16_operands(x, dy, rows, in, out, dweight, buf, cap, gblk));
    if (dx)
        FSDP2_CHECK(dx_bf16_operands(dy, rows, in, out, weight->data, dx, buf, cap));
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_linear_workspace_bytes(int64_t in, int64_t out, size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_CHECK(nn_check_dim(in, "in"));
    FSDP2_CHECK(nn_check_dim(out, "out"));
    *bytes = nn_region_bytes(weight_block_floats(in, out)) +
             nn_region_bytes(block_rows(in, out) * in) + nn_region_bytes(out);
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
    float *wblk = staged ? nn_carve_floats(&c, weight_block_floats(in, out)) : NULL;
    float *b32 = staged ? nn_carve_floats(&c, out) : NULL;
    const float *b = bias ? nn_as_f32(bias, b32) : NULL;
    if (weight->dtype == FSDP2_F32) /* in 0: y is the bias, with no GEMM */
        return nn_sgemm_bias(0, 1, rows, out, in, x, in, weight->data, in, b, y, out);
    int ops16;
    FSDP2_CHECK(nn_gemm_bf16_wanted(&ops16));
    if (ops16)
        return forward_bf16_operands(x, rows, weight, b, y, (uint16_t *)wblk,
                                     2 * weight_block_floats(in, out));
    for (int64_t r0 = 0; r0 < out; r0 += rb) {
        int64_t n = out - r0 < rb ? out - r0 : rb;
        nn_load(wblk, weight, r0 * in, n * in);
        FSDP2_CHECK(nn_sgemm_bias(0, 1, rows, n, in, x, in, wblk, in, b ? b + r0 : NULL, y + r0,
                                  out));
    }
    return FSDP2_SUCCESS;
}

/* dbias += column sums of dy, summed in f32 (into the gradient itself when it is f32), the
 * columns split among the threads. */
static void bias_grad(const float *dy, int64_t rows, int64_t out, fsdp2_tensor_t *dbias,
                      float *acc)
{
    float *sum = dbias->dtype == FSDP2_F32 ? dbias->data : acc;
    if (sum == acc)
        memset(acc, 0, sizeof(float) * (size_t)out);
    nn_column_sums(dy, rows, out, out, sum);
    if (sum == acc)
        nn_add_into(dbias, 0, acc, out);
}

/* dx += dy W for a bf16 W [out, in], by blocks [krows, cols] of W (dx_block): dx[:, c0:c1]
 * += dy[:, k0:k1] W[k0:k1, c0:c1], the block converted into wblk. */
static fsdp2_status_t dx_bf16(const float *dy, int64_t rows, const fsdp2_tensor_t *weight,
                              float *dx, float *wblk)
{
    int64_t out = weight->shape[0], in = weight->shape[1], krows, cols;
    dx_block(in, out, &krows, &cols);
    for (int64_t c0 = 0; c0 < in; c0 += cols) {
        int64_t nc = in - c0 < cols ? in - c0 : cols;
        for (int64_t k0 = 0; k0 < out; k0 += krows) {
            int64_t nk = out - k0 < krows ? out - k0 : krows;
            if (nc == in)
                nn_load(wblk, weight, k0 * in, nk * in);
            for (int64_t r = 0; nc < in && r < nk; r++)
                nn_load(wblk + r * nc, weight, (k0 + r) * in + c0, nc);
            FSDP2_CHECK(nn_sgemm(0, 0, rows, nc, nk, 1.0f, dy + k0, out, wblk, nc, 1.0f,
                                 dx + c0, in));
        }
    }
    return FSDP2_SUCCESS;
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
    int ops16 = 0; /* bf16 operands: asked before anything is written */
    if (weight->dtype != FSDP2_F32 && (dx || dweight))
        FSDP2_CHECK(nn_gemm_bf16_wanted(&ops16));
    int staged = w16 || g16 || ops16 || (dbias && dbias->dtype != FSDP2_F32);
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
    float *wblk = staged ? nn_carve_floats(&c, weight_block_floats(in, out)) : NULL;
    float *gblk = staged ? nn_carve_floats(&c, rb * in) : NULL;
    float *acc = staged ? nn_carve_floats(&c, out) : NULL;
    if (dbias)
        bias_grad(dy, rows, out, dbias, acc);
    if (ops16)
        return backward_bf16_operands(x, dy, rows, weight, dx, dweight, (uint16_t *)wblk,
                                      2 * weight_block_floats(in, out), gblk);
    if (dweight && !g16)
        FSDP2_CHECK(nn_sgemm(1, 0, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dweight->data, in));
    if (dx && !w16)
        FSDP2_CHECK(nn_sgemm(0, 0, rows, in, out, 1.0f, dy, out, weight->data, in, 1.0f, dx, in));
    for (int64_t r0 = 0; g16 && r0 < out; r0 += rb) {
        int64_t n = out - r0 < rb ? out - r0 : rb;
        FSDP2_CHECK(nn_sgemm(1, 0, n, in, rows, 1.0f, dy + r0, out, x, in, 0.0f, gblk, in));
        nn_add_into(dweight, r0 * in, gblk, n * in);
    }
    if (w16)
        FSDP2_CHECK(dx_bf16(dy, rows, weight, dx, wblk));
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_linear_prepare(int64_t rows, int64_t in, int64_t out,
                                       fsdp2_dtype_t weight_dtype, fsdp2_dtype_t grad_dtype,
                                       int bias)
{
    FSDP2_CHECK(nn_check_dim(rows, "rows"));
    FSDP2_CHECK(nn_check_dim(in, "in"));
    FSDP2_CHECK(nn_check_dim(out, "out"));
    FSDP2_CHECK(nn_check_dtype(weight_dtype, "linear weight"));
    FSDP2_CHECK(nn_check_dtype(grad_dtype, "linear weight gradient"));
    FSDP2_ARG_CHECK(bias == 0 || bias == 1, "bias = %d: 0 or 1", bias);
    size_t ws_bytes, bytes;
    FSDP2_CHECK(fsdp2_nn_linear_workspace_bytes(in, out, &ws_bytes));
    const int64_t arrays[3][3] = {{rows, in, 1}, {rows, out, 1}, {out, in, 1}};
    FSDP2_CHECK(nn_prepare_bytes(arrays, 3, ws_bytes, &bytes));
    nn_prepare_t p;
    FSDP2_CHECK(nn_prepare_begin(&p, bytes));
    int64_t wshape[2] = {out, in};
    fsdp2_tensor_t w, b, dw;
    nn_prepare_tensor(&p, &w, weight_dtype, 2, wshape);
    nn_prepare_tensor(&p, &b, weight_dtype, 1, &out);
    nn_prepare_tensor(&p, &dw, grad_dtype, 2, wshape);
    fsdp2_nn_workspace_t ws = {p.span, ws_bytes};
    /* every array in the span: nothing is read or written */
    fsdp2_status_t s = fsdp2_nn_linear_forward(p.span, rows, &w, bias ? &b : NULL, p.span, &ws);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_nn_linear_backward(p.span, p.span, rows, &w, p.span, &dw, NULL, &ws);
    nn_prepare_end(&p);
    return s;
}

