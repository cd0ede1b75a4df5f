/* 2-D convolution (no padding, stride 1) as GEMMs over im2col matrices of CONV_CHUNK
 * samples at a time, and 2x2 max pooling. A chunk's GEMM has chunk * (h-k+1) * (w-k+1)
 * columns: several samples make the weight gradient's GEMM large enough to run near
 * the GEMM engine's peak while the im2col matrix of a 28x28 image stays in the caches.
 * Where the weight is bf16 and FSDP2_NN_BF16_GEMM says so (nn_gemm_bf16_wanted), the
 * GEMMs take bf16 operands, as the linear layer's: see "bf16 operands" below. */
#include <string.h>

#include "gemm.h"
#include "nn_common.h"

/* Samples per im2col GEMM. Part of the workspace size the query reports, so a constant
 * of the API rather than an environment tunable. */
#define CONV_CHUNK 4

typedef struct conv_dims {
    int64_t c, h, w, o, k, oh, ow, n, kk; /* n = oh * ow, kk = c * k * k */
} conv_dims_t;

static fsdp2_status_t conv_shape(int64_t c, int64_t h, int64_t w, int64_t o, int64_t k,
                                 conv_dims_t *d)
{
    FSDP2_ARG_CHECK(c > 0 && o > 0 && k > 0, "conv2d with c = %lld, o = %lld, k = %lld",
                    (long long)c, (long long)o, (long long)k);
    FSDP2_ARG_CHECK(h >= k && w >= k, "conv2d input %lldx%lld is smaller than the %lldx%lld kernel",
                    (long long)h, (long long)w, (long long)k, (long long)k);
    *d = (conv_dims_t){c, h, w, o, k, h - k + 1, w - k + 1, (h - k + 1) * (w - k + 1), c * k * k};
    FSDP2_CHECK(nn_check_dim(d->kk * d->n * CONV_CHUNK, "conv2d im2col size"));
    return nn_check_dim(d->o * d->n * CONV_CHUNK, "conv2d output size");
}

fsdp2_status_t fsdp2_nn_conv2d_workspace_bytes(int64_t c, int64_t h, int64_t w, int64_t o,
                                               int64_t k, size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    conv_dims_t d;
    FSDP2_CHECK(conv_shape(c, h, w, o, k, &d));
    *bytes = nn_region_bytes(d.kk * d.n * CONV_CHUNK) + nn_region_bytes(d.o * d.n * CONV_CHUNK) +
             2 * nn_region_bytes(d.o * d.kk) + nn_region_bytes(d.o);
    return FSDP2_SUCCESS;
}

/* The workspace of both directions, in the order the query sized it: the im2col matrix,
 * the GEMM's output (or the gradient's copy), the weight as f32, the weight and bias
 * gradient sums. */
typedef struct conv_scratch {
    float *col, *out, *w, *gw, *gb;
} conv_scratch_t;

static fsdp2_status_t conv_scratch(fsdp2_nn_workspace_t *ws, const conv_dims_t *d, const char *what,
                                   conv_scratch_t *s)
{
    size_t need;
    nn_carve_t cv;
    FSDP2_CHECK(fsdp2_nn_conv2d_workspace_bytes(d->c, d->h, d->w, d->o, d->k, &need));
    FSDP2_CHECK(nn_carve_begin(ws, need, what, &cv));
    s->col = nn_carve_floats(&cv, d->kk * d->n * CONV_CHUNK);
    s->out = nn_carve_floats(&cv, d->o * d->n * CONV_CHUNK);
    s->w = nn_carve_floats(&cv, d->o * d->kk);
    s->gw = nn_carve_floats(&cv, d->o * d->kk);
    s->gb = nn_carve_floats(&cv, d->o);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_conv(const float *x, int64_t batch, int64_t h, int64_t w,
                                 const fsdp2_tensor_t *weight, conv_dims_t *d)
{
    FSDP2_ARG_CHECK(weight && weight->ndim == 4 && weight->shape[2] == weight->shape[3],
                    "conv2d weight must be a 4-D tensor [o, c, k, k]");
    FSDP2_CHECK(nn_check_param(weight, "conv2d weight", 4, weight->shape));
    FSDP2_CHECK(conv_shape(weight->shape[1], h, w, weight->shape[0], weight->shape[2], d));
    FSDP2_ARG_CHECK(batch >= 0, "batch = %lld is negative", (long long)batch);
    FSDP2_ARG_CHECK(x || batch == 0, "x is NULL");
    return FSDP2_SUCCESS;
}

/* col[(ci*k + ki)*k + kj][at + oi*ow + oj] = x[ci][oi + ki][oj + kj], rows ld apart; col
 * of dtype dt, f32 (copied) or bf16 (rounded to nearest even). */
static void im2col(const float *x, void *col, fsdp2_dtype_t dt, int64_t ld, int64_t at,
                   const conv_dims_t *d)
{
    if (nn_gemm_preparing())
        return;
    for (int64_t ci = 0; ci < d->c; ci++)
        for (int64_t ki = 0; ki < d->k; ki++)
            for (int64_t kj = 0; kj < d->k; kj++) {
                int64_t first = ((ci * d->k + ki) * d->k + kj) * ld + at;
                if (dt == FSDP2_BF16) { /* the window [oh, ow] of x's plane ci, dense */
                    nn_convert_block((uint16_t *)col + first, FSDP2_BF16, x + ci * d->h * d->w,
                                     FSDP2_F32, d->w, ki, kj, d->oh, d->ow);
                    continue;
                }
                float *row = (float *)col + first;
                for (int64_t oi = 0; oi < d->oh; oi++)
                    memcpy(row + oi * d->ow, x + (ci * d->h + oi + ki) * d->w + kj,
                           sizeof(float) * (size_t)d->ow);
            }
}

static void col2im_add(const float *col, int64_t ld, int64_t at, float *dx, const conv_dims_t *d)
{
    if (nn_gemm_preparing())
        return;
    for (int64_t ci = 0; ci < d->c; ci++)
        for (int64_t ki = 0; ki < d->k; ki++)
            for (int64_t kj = 0; kj < d->k; kj++) {
                const float *row = col + ((ci * d->k + ki) * d->k + kj) * ld + at;
                for (int64_t oi = 0; oi < d->oh; oi++) {
                    float *o = dx + (ci * d->h + oi + ki) * d->w + kj;
                    const float *s = row + oi * d->ow;
                    for (int64_t oj = 0; oj < d->ow; oj++)
                        o[oj] += s[oj];
                }
            }
}

/* ---- bf16 operands (a bf16 weight, nn_gemm_bf16_wanted) ----
 * As PyTorch's CPU autocast computes a conv2d: the weight goes to nn_gemm_bf16 as it is,
 * the im2col columns and dy are rounded to bf16 (to nearest even), the products are
 * summed in f32 into f32 outputs. The weight gradient's GEMM, dW += dy col^T, takes two
 * activations, both rounded, as autocast's backward takes them. Staging, within the
 * workspace (its size unchanged): the rounded columns in the first half of the im2col
 * region, the rounded dy in the first half of the output region; dx's columns (f32)
 * overwrite the im2col region once the weight gradient's GEMM has read the rounded ones.
 * The bias gradient sums dy in f32 in the f32 path's order: its bits do not depend on the
 * mode. */

static fsdp2_status_t conv_ops16(const fsdp2_tensor_t *weight, int *ops16)
{
    *ops16 = 0;
    return weight->dtype == FSDP2_BF16 ? nn_gemm_bf16_wanted(ops16) : FSDP2_SUCCESS;
}

/* The backward of samples [s0, s0 + m) on bf16 operands; wsum, bsum the f32 sums of the
 * gradients asked for (else NULL). */
static fsdp2_status_t backward_chunk_bf16(const float *x, const float *dy, int64_t s0, int64_t m,
                                          const conv_dims_t *d, const fsdp2_tensor_t *weight,
                                          float *dx, float *wsum, float *bsum,
                                          const conv_scratch_t *sc)
{
    int64_t ld = m * d->n, plane = d->c * d->h * d->w;
    uint16_t *col16 = (uint16_t *)sc->col, *g16 = (uint16_t *)sc->out;
    for (int64_t j = 0; j < m; j++) {
        im2col(x + (s0 + j) * plane, col16, FSDP2_BF16, ld, j * d->n, d);
        const float *dys = dy + (s0 + j) * d->o * d->n;
        for (int64_t oc = 0; oc < d->o; oc++)
            nn_convert_block(g16 + oc * ld + j * d->n, FSDP2_BF16, dys, FSDP2_F32, d->n, oc, 0,
                             1, d->n);
    }
    for (int64_t oc = 0; bsum && oc < d->o; oc++) {
        float sum = 0;
        for (int64_t j = 0; j < m; j++) {
            const float *row = dy + ((s0 + j) * d->o + oc) * d->n;
            for (int64_t i = 0; i < d->n; i++)
                sum += row[i];
        }
        bsum[oc] += sum;
    }
    if (wsum)
        FSDP2_CHECK(nn_gemm_bf16(0, 1, d->o, d->kk, ld, 1.0f, g16, ld, col16, ld, 1.0f, wsum,
                                 d->kk));
    if (!dx)
        return FSDP2_SUCCESS;
    FSDP2_CHECK(nn_gemm_bf16(1, 0, d->kk, ld, d->o, 1.0f, weight->data, d->kk, g16, ld, 0.0f,
                             sc->col, ld));
    for (int64_t j = 0; j < m; j++)
        col2im_add(sc->col, ld, j * d->n, dx + (s0 + j) * plane, d);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_conv2d_forward(const float *x, int64_t batch, int64_t h, int64_t w,
                                       const fsdp2_tensor_t *weight, const fsdp2_tensor_t *bias,
                                       float *y, fsdp2_nn_workspace_t *ws)
{
    conv_dims_t d;
    FSDP2_CHECK(check_conv(x, batch, h, w, weight, &d));
    FSDP2_ARG_CHECK(y || batch == 0, "y is NULL");
    if (bias)
        FSDP2_CHECK(nn_check_param(bias, "conv2d bias", 1, &d.o));
    conv_scratch_t sc;
    FSDP2_CHECK(conv_scratch(ws, &d, "conv2d forward", &sc));
    int ops16;
    FSDP2_CHECK(conv_ops16(weight, &ops16));
    float *col = sc.col, *out = sc.out;
    const float *wf = ops16 ? NULL : nn_as_f32(weight, sc.w);
    const float *bf = bias ? nn_as_f32(bias, sc.gb) : NULL;
    for (int64_t s0 = 0; s0 < batch; s0 += CONV_CHUNK) {
        int64_t m = batch - s0 < CONV_CHUNK ? batch - s0 : CONV_CHUNK, ld = m * d.n;
        for (int64_t j = 0; j < m; j++)
            im2col(x + (s0 + j) * d.c * h * w, col, ops16 ? FSDP2_BF16 : FSDP2_F32, ld, j * d.n,
                   &d);
        if (ops16)
            FSDP2_CHECK(nn_gemm_bf16(0, 0, d.o, ld, d.kk, 1.0f, weight->data, d.kk,
                                     (const uint16_t *)col, ld, 0.0f, out, ld));
        else
            FSDP2_CHECK(nn_sgemm(0, 0, d.o, ld, d.kk, 1.0f, wf, d.kk, col, ld, 0.0f, out, ld));
        for (int64_t j = 0; j < (nn_gemm_preparing() ? 0 : m); j++) {
            float *ys = y + (s0 + j) * d.o * d.n;
            for (int64_t oc = 0; oc < d.o; oc++) {
                const float *src = out + oc * ld + j * d.n;
                float b = bf ? bf[oc] : 0.0f;
                for (int64_t i = 0; i < d.n; i++)
                    ys[oc * d.n + i] = src[i] + b;
            }
        }
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_conv2d_backward(const float *x, const float *dy, int64_t batch, int64_t h,
                                        int64_t w, const fsdp2_tensor_t *weight, float *dx,
                                        fsdp2_tensor_t *dweight, fsdp2_tensor_t *dbias,
                                        fsdp2_nn_workspace_t *ws)
{
    conv_dims_t d;
    FSDP2_CHECK(check_conv(x, batch, h, w, weight, &d));
    FSDP2_ARG_CHECK(dy || batch == 0, "dy is NULL");
    if (dweight)
        FSDP2_CHECK(nn_check_param(dweight, "conv2d weight gradient", 4, weight->shape));
    if (dbias)
        FSDP2_CHECK(nn_check_param(dbias, "conv2d bias gradient", 1, &d.o));
    conv_scratch_t sc;
    FSDP2_CHECK(conv_scratch(ws, &d, "conv2d backward", &sc));
    int ops16;
    FSDP2_CHECK(conv_ops16(weight, &ops16));
    float *col = sc.col, *g = sc.out, *gw = sc.gw, *gb = sc.gb;
    const float *wf = ops16 ? NULL : nn_as_f32(weight, sc.w);
    int w32 = dweight && dweight->dtype == FSDP2_F32, b32 = dbias && dbias->dtype == FSDP2_F32;
    if (dweight && !w32 && !nn_gemm_preparing())
        memset(gw, 0, sizeof(float) * (size_t)(d.o * d.kk));
    if (dbias && !b32 && !nn_gemm_preparing())
        memset(gb, 0, sizeof(float) * (size_t)d.o);
    float *wsum = w32 ? dweight->data : gw, *bsum = b32 ? dbias->data : gb;
    for (int64_t s0 = 0; s0 < batch; s0 += CONV_CHUNK) {
        int64_t m = batch - s0 < CONV_CHUNK ? batch - s0 : CONV_CHUNK, ld = m * d.n;
        if (ops16) {
            FSDP2_CHECK(backward_chunk_bf16(x, dy, s0, m, &d, weight, dx, dweight ? wsum : NULL,
                                            dbias ? bsum : NULL, &sc));
            continue;
        }
        for (int64_t j = 0; j < m; j++) {
            im2col(x + (s0 + j) * d.c * h * w, col, FSDP2_F32, ld, j * d.n, &d);
            const float *dys = dy + (s0 + j) * d.o * d.n;
            for (int64_t oc = 0; oc < (nn_gemm_preparing() ? 0 : d.o); oc++)
                memcpy(g + oc * ld + j * d.n, dys + oc * d.n, sizeof(float) * (size_t)d.n);
        }
        FSDP2_OMP("omp parallel for schedule(static) if(dbias && d.o * ld > FSDP2_PAR_CHUNK)")
        for (int64_t oc = 0; oc < (dbias ? d.o : 0); oc++) {
            float sum = 0;
            for (int64_t i = 0; i < ld; i++)
                sum += g[oc * ld + i];
            bsum[oc] += sum;
        }
        if (dweight)
            FSDP2_CHECK(nn_sgemm(0, 1, d.o, d.kk, ld, 1.0f, g, ld, col, ld, 1.0f, wsum, d.kk));
        if (!dx)
            continue;
        FSDP2_CHECK(nn_sgemm(1, 0, d.kk, ld, d.o, 1.0f, wf, d.kk, g, ld, 0.0f, col, ld));
        for (int64_t j = 0; j < m; j++)
            col2im_add(col, ld, j * d.n, dx + (s0 + j) * d.c * h * w, &d);
    }
    if (dweight && !w32)
        nn_add_into(dweight, 0, gw, d.o * d.kk);
    if (dbias && !b32)
        nn_add_into(dbias, 0, gb, d.o);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_pool(int64_t planes, int64_t h, int64_t w, int ok)
{
    FSDP2_ARG_CHECK(planes >= 0 && h >= 0 && w >= 0,
                    "maxpool2d with planes = %lld, h = %lld, w = %lld", (long long)planes,
                    (long long)h, (long long)w);
    FSDP2_ARG_CHECK(h * w <= INT32_MAX, "maxpool2d plane of %lld elements: indices overflow",
                    (long long)(h * w));
    FSDP2_ARG_CHECK(ok || planes * (h / 2) * (w / 2) == 0, "an array is NULL");
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_maxpool2d_forward(const float *x, int64_t planes, int64_t h, int64_t w,
                                          float *y, int32_t *argmax)
{
    FSDP2_CHECK(check_pool(planes, h, w, x && y && argmax));
    int64_t oh = h / 2, ow = w / 2;
    for (int64_t p = 0; p < planes; p++) {
        const float *xp = x + p * h * w;
        for (int64_t i = 0; i < oh; i++) {
            for (int64_t j = 0; j < ow; j++) {
                int64_t best = 2 * i * w + 2 * j;
                const int64_t cand[3] = {best + 1, best + w, best + w + 1};
                for (int q = 0; q < 3; q++)
                    best = xp[cand[q]] > xp[best] ? cand[q] : best;
                int64_t at = (p * oh + i) * ow + j;
                y[at] = xp[best];
                argmax[at] = (int32_t)best;
            }
        }
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_maxpool2d_backward(const float *dy, const int32_t *argmax, int64_t planes,
                                           int64_t h, int64_t w, float *dx)
{
    FSDP2_CHECK(check_pool(planes, h, w, dy && argmax && dx));
    int64_t per = (h / 2) * (w / 2);
    for (int64_t i = 0; i < planes * per; i++)
        FSDP2_ARG_CHECK(argmax[i] >= 0 && argmax[i] < h * w,
                        "argmax %d at %lld is outside the %lldx%lld plane", argmax[i],
                        (long long)i, (long long)h, (long long)w);
    for (int64_t p = 0; p < planes; p++)
        for (int64_t i = 0; i < per; i++)
            dx[p * h * w + argmax[p * per + i]] += dy[p * per + i];
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_conv2d_prepare(int64_t batch, int64_t c, int64_t h, int64_t w, int64_t o,
                                       int64_t k, fsdp2_dtype_t weight_dtype,
                                       fsdp2_dtype_t grad_dtype)
{
    FSDP2_CHECK(nn_check_dim(batch, "batch"));
    FSDP2_CHECK(nn_check_dtype(weight_dtype, "conv2d weight"));
    FSDP2_CHECK(nn_check_dtype(grad_dtype, "conv2d weight gradient"));
    size_t ws_bytes;
    FSDP2_CHECK(fsdp2_nn_conv2d_workspace_bytes(c, h, w, o, k, &ws_bytes)); /* checks the rest */
    /* x, y (smaller than [batch, o, h, w]) and the weight */
    const int64_t arrays[3][3] = {{batch, c, h * w}, {batch, o, h * w}, {o, c, k * k}};
    size_t bytes;
    FSDP2_CHECK(nn_prepare_bytes(arrays, 3, ws_bytes, &bytes));
    nn_prepare_t p;
    FSDP2_CHECK(nn_prepare_begin(&p, bytes));
    int64_t wshape[4] = {o, c, k, k};
    fsdp2_tensor_t wt, dw;
    nn_prepare_tensor(&p, &wt, weight_dtype, 4, wshape);
    nn_prepare_tensor(&p, &dw, grad_dtype, 4, wshape);
    fsdp2_nn_workspace_t ws = {p.span, ws_bytes};
    /* every array in the span, the bias gradient not asked for (it has no GEMM): nothing
     * is read or written */
    fsdp2_status_t s = fsdp2_nn_conv2d_forward(p.span, batch, h, w, &wt, NULL, p.span, &ws);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_nn_conv2d_backward(p.span, p.span, batch, h, w, &wt, p.span, &dw, NULL, &ws);
    nn_prepare_end(&p);
    return s;
}

