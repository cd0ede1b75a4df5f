/* LoRA linear: the frozen base through the linear layer, then the adapter in blocks of
 * rows: t = dropout(x) (x itself without dropout), u = t A^T, y += scale u B^T. The
 * backward recomputes t and u per block (r is small: a GEMM of rows x r x in) instead of
 * keeping them, and sums the adapter's gradients in f32 before one rounding into a bf16
 * gradient. Where A and B are both bf16 and FSDP2_NN_BF16_GEMM says so
 * (nn_gemm_bf16_wanted), the adapter's GEMMs take bf16 operands, as the linear layer's
 * (see "bf16 operands" below); otherwise A and B are converted to f32. */
#include <math.h>
#include <string.h>

#include "gemm.h"
#include "nn_common.h"

/* f32 elements of the adapter's input per block: about 1 MiB, as the linear layer's. */
#define LORA_BLOCK_FLOATS (1 << 18)

static int64_t lora_rows(int64_t in)
{
    int64_t rb = in > 0 ? LORA_BLOCK_FLOATS / in : LORA_BLOCK_FLOATS;
    return rb < 1 ? 1 : rb;
}

/* The adapter's own regions: A and B as f32, their gradients' sums, and per block of rows
 * t and dt [rb, in], u and du [rb, r]. */
static size_t adapter_bytes(int64_t in, int64_t out, int64_t r)
{
    int64_t rb = lora_rows(in);
    return 2 * nn_region_bytes(r * in) + 2 * nn_region_bytes(out * r) +
           2 * nn_region_bytes(rb * in) + 2 * nn_region_bytes(rb * r);
}

fsdp2_status_t fsdp2_nn_lora_workspace_bytes(int64_t in, int64_t out, int64_t r, size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_CHECK(nn_check_dim(r, "r"));
    size_t base;
    FSDP2_CHECK(fsdp2_nn_linear_workspace_bytes(in, out, &base));
    size_t own = adapter_bytes(in, out, r);
    *bytes = own > base ? own : base;
    return FSDP2_SUCCESS;
}

/* The adapter's shapes against the base weight [out, in]. */
static fsdp2_status_t check_lora(const fsdp2_tensor_t *weight, const fsdp2_nn_lora_t *lora,
                                 int64_t *r)
{
    FSDP2_ARG_CHECK(lora, "lora is NULL");
    FSDP2_ARG_CHECK(weight && weight->ndim == 2, "linear weight must be a 2-D tensor [out, in]");
    FSDP2_ARG_CHECK(lora->a && lora->a->ndim == 2, "lora A must be a 2-D tensor [r, in]");
    *r = lora->a->shape[0];
    FSDP2_ARG_CHECK(*r > 0 && *r <= INT_MAX, "lora r = %lld is outside [1, %d]", (long long)*r,
                    INT_MAX);
    int64_t a_shape[2] = {*r, weight->shape[1]}, b_shape[2] = {weight->shape[0], *r};
    FSDP2_CHECK(nn_check_param(lora->a, "lora A", 2, a_shape));
    FSDP2_CHECK(nn_check_param(lora->b, "lora B", 2, b_shape));
    FSDP2_ARG_CHECK(isfinite(lora->scale), "lora scale = %g is not finite", lora->scale);
    FSDP2_ARG_CHECK(lora->dropout >= 0 && lora->dropout < 1,
                    "lora dropout probability %g is outside [0, 1)", lora->dropout);
    return FSDP2_SUCCESS;
}

typedef struct lora_scratch {
    const float *a, *b; /* the adapter as f32 (f32 operands) */
    uint16_t *stage;    /* bf16 operands: the regions of A and B as f32, as one */
    int64_t stage_cap;  /* its bf16 values */
    float *t, *u, *du, *dt, *ga, *gb;
    int64_t rb;
} lora_scratch_t;

/* The regions of adapter_bytes in its order; with ops16 the two regions of A and B as f32
 * are carved as one of r in + out r floats, which nn_region_bytes keeps within them. */
static fsdp2_status_t carve(const fsdp2_tensor_t *weight, const fsdp2_nn_lora_t *lora, int64_t r,
                            int ops16, fsdp2_nn_workspace_t *ws, const char *what,
                            lora_scratch_t *s)
{
    int64_t out = weight->shape[0], in = weight->shape[1];
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, adapter_bytes(in, out, r), what, &c));
    s->rb = lora_rows(in);
    if (ops16) {
        s->a = s->b = NULL;
        s->stage = (uint16_t *)nn_carve_floats(&c, r * in + out * r);
        s->stage_cap = 2 * (r * in + out * r);
    } else {
        float *a32 = nn_carve_floats(&c, r * in), *b32 = nn_carve_floats(&c, out * r);
        s->a = nn_as_f32(lora->a, a32);
        s->b = nn_as_f32(lora->b, b32);
        s->stage = NULL;
        s->stage_cap = 0;
    }
    s->ga = nn_carve_floats(&c, r * in);
    s->gb = nn_carve_floats(&c, out * r);
    s->t = nn_carve_floats(&c, s->rb * in);
    s->dt = nn_carve_floats(&c, s->rb * in);
    s->u = nn_carve_floats(&c, s->rb * r);
    s->du = nn_carve_floats(&c, s->rb * r);
    return FSDP2_SUCCESS;
}

/* t = dropout(x) for rows [r0, r0 + n) and u = t A^T; *t_out = t. */
static fsdp2_status_t adapter_input(const float *x, int64_t r0, int64_t n, int64_t in,
                                    int64_t r, const fsdp2_nn_lora_t *lora, lora_scratch_t *s,
                                    const float **t_out)
{
    const float *t = x + r0 * in;
    if (lora->dropout > 0 && !nn_gemm_preparing()) { /* preparing: the same strides */
        /* checked arguments: the dropout cannot fail */
        (void)fsdp2_nn_dropout_forward(t, n * in, lora->dropout, lora->seed,
                                       lora->offset + (uint64_t)(r0 * in), s->t);
        t = s->t;
    }
    *t_out = t;
    return nn_sgemm(0, 1, n, r, in, 1.0f, t, in, s->a, in, 0.0f, s->u, r);
}

/* ---- bf16 operands (A and B bf16, nn_gemm_bf16_wanted) ----
 * As PyTorch's CPU autocast computes PEFT's adapter: each GEMM's operands are bf16, the
 * products summed in f32 into f32 outputs. A and B go to nn_gemm_bf16 as they are; the
 * activations are rounded to bf16 (to nearest even): t = dropout(x) (the dropout on f32
 * x, then rounded, as autocast casts lora_A's input), u = t A^T, dy, and du = scale dy B.
 * Two GEMMs take two activations, both rounded, as autocast's backward of a bf16 linear
 * takes them: dB += scale dy^T u and dA += du^T t. scale is each GEMM's alpha, in f32.
 * Staging, within the workspace's regions (adapter_bytes is unchanged):
 *   t rounded: dt's region (t is dead before the backward's dt = du A overwrites it);
 *   u: computed into du's region, rounded into the first half of u's region;
 *   du: computed into du's region (u, rounded, is dead), rounded into u's second half;
 *   dy: rows rounded into t's region (its dropout output is dead once rounded) or the
 *       stage (A's and B's f32 regions), whichever holds more rows: at least 2 r. */

/* Whether the adapter takes bf16 operands: A and B both bf16, and the mode says so. */
static fsdp2_status_t adapter_ops16(const fsdp2_nn_lora_t *lora, int *ops16)
{
    *ops16 = 0;
    if (lora->a->dtype != FSDP2_BF16 || lora->b->dtype != FSDP2_BF16)
        return FSDP2_SUCCESS;
    return nn_gemm_bf16_wanted(ops16);
}

/* t = dropout(x) and u = t A^T for rows [r0, r0 + n), both rounded: *t16 [n, in], *u16
 * [n, r]. */
static fsdp2_status_t adapter_input_bf16(const float *x, int64_t r0, int64_t n, int64_t in,
                                         int64_t r, const fsdp2_nn_lora_t *lora,
                                         lora_scratch_t *s, const uint16_t **t16,
                                         const uint16_t **u16)
{
    const float *t = x;
    int64_t t0 = r0;
    if (lora->dropout > 0 && !nn_gemm_preparing()) { /* preparing: the same strides */
        (void)fsdp2_nn_dropout_forward(x + r0 * in, n * in, lora->dropout, lora->seed,
                                       lora->offset + (uint64_t)(r0 * in), s->t);
        t = s->t;
        t0 = 0;
    }
    uint16_t *tb = (uint16_t *)s->dt, *ub = (uint16_t *)s->u;
    nn_convert_block(tb, FSDP2_BF16, t, FSDP2_F32, in, t0, 0, n, in);
    FSDP2_CHECK(nn_gemm_bf16(0, 1, n, r, in, 1.0f, tb, in, lora->a->data, in, 0.0f, s->du, r));
    nn_convert_block(ub, FSDP2_BF16, s->du, FSDP2_F32, r, 0, 0, n, r);
    *t16 = tb;
    *u16 = ub;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t forward_bf16_operands(const float *x, int64_t rows, int64_t in,
                                            int64_t out, int64_t r, const fsdp2_nn_lora_t *lora,
                                            float *y, lora_scratch_t *s)
{
    for (int64_t r0 = 0; r0 < rows; r0 += s->rb) {
        int64_t n = rows - r0 < s->rb ? rows - r0 : s->rb;
        const uint16_t *t16, *u16;
        FSDP2_CHECK(adapter_input_bf16(x, r0, n, in, r, lora, s, &t16, &u16));
        FSDP2_CHECK(nn_gemm_bf16(0, 1, n, out, r, (float)lora->scale, u16, r, lora->b->data, r,
                                 1.0f, y + r0 * out, out));
    }
    return FSDP2_SUCCESS;
}

/* For rows [r0, r0 + n) of dy, rounded in pieces of rows: gb += scale dy^T u16 (gb not
 * NULL) and, with want_du, du = scale dy B into s->du. */
static fsdp2_status_t dy_gemms_bf16(const float *dy, int64_t r0, int64_t n, int64_t in,
                                    int64_t out, int64_t r, const fsdp2_nn_lora_t *lora,
                                    lora_scratch_t *s, const uint16_t *u16, float *gb,
                                    int want_du)
{
    float scale = (float)lora->scale;
    int64_t t_cap = 2 * s->rb * in;
    uint16_t *g16 = t_cap >= s->stage_cap ? (uint16_t *)s->t : s->stage;
    int64_t step = (t_cap >= s->stage_cap ? t_cap : s->stage_cap) / out;
    for (int64_t q0 = 0; q0 < n; q0 += step) {
        int64_t m = n - q0 < step ? n - q0 : step;
        nn_convert_block(g16, FSDP2_BF16, dy, FSDP2_F32, out, r0 + q0, 0, m, out);
        if (gb)
            FSDP2_CHECK(nn_gemm_bf16(1, 0, out, r, m, scale, g16, out, u16 + q0 * r, r, 1.0f,
                                     gb, r));
        if (want_du)
            FSDP2_CHECK(nn_gemm_bf16(0, 0, m, r, out, scale, g16, out, lora->b->data, r, 0.0f,
                                     s->du + q0 * r, r));
    }
    return FSDP2_SUCCESS;
}

/* The adapter's backward by blocks of rows; ga and gb the f32 sums (or NULL). */
static fsdp2_status_t backward_bf16_operands(const float *x, const float *dy, int64_t rows,
                                             int64_t in, int64_t out, int64_t r,
                                             const fsdp2_nn_lora_t *lora, float *dx, float *ga,
                                             float *gb, lora_scratch_t *s)
{
    uint16_t *du16 = (uint16_t *)s->u + s->rb * r;
    if (!ga && !gb && !dx)
        return FSDP2_SUCCESS;
    for (int64_t r0 = 0; r0 < rows; r0 += s->rb) {
        int64_t n = rows - r0 < s->rb ? rows - r0 : s->rb;
        const uint16_t *t16, *u16;
        FSDP2_CHECK(adapter_input_bf16(x, r0, n, in, r, lora, s, &t16, &u16));
        FSDP2_CHECK(dy_gemms_bf16(dy, r0, n, in, out, r, lora, s, u16, gb, ga || dx));
        if (!ga && !dx)
            continue;
        nn_convert_block(du16, FSDP2_BF16, s->du, FSDP2_F32, r, 0, 0, n, r);
        if (ga) /* dA += du^T t */
            FSDP2_CHECK(nn_gemm_bf16(1, 0, r, in, n, 1.0f, du16, r, t16, in, 1.0f, ga, in));
        if (!dx)
            continue;
        /* dt = du A, over t's rounded copy, then through the mask into dx */
        FSDP2_CHECK(nn_gemm_bf16(0, 0, n, in, r, 1.0f, du16, r, lora->a->data, in, 0.0f, s->dt,
                                 in));
        if (!nn_gemm_preparing())
            (void)fsdp2_nn_dropout_backward(s->dt, n * in, lora->dropout, lora->seed,
                                            lora->offset + (uint64_t)(r0 * in), dx + r0 * in);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_lora_forward(const float *x, int64_t rows, const fsdp2_tensor_t *weight,
                                     const fsdp2_tensor_t *bias, const fsdp2_nn_lora_t *lora,
                                     float *y, fsdp2_nn_workspace_t *ws)
{
    int64_t r;
    FSDP2_CHECK(check_lora(weight, lora, &r));
    FSDP2_ARG_CHECK(y != x || rows == 0, "y aliases x: the adapter reads x after the base "
                                         "writes y");
    size_t need;
    nn_carve_t c;
    FSDP2_CHECK(fsdp2_nn_lora_workspace_bytes(weight->shape[1], weight->shape[0], r, &need));
    FSDP2_CHECK(nn_carve_begin(ws, need, "LoRA forward", &c));
    int ops16; /* asked before the base writes y */
    FSDP2_CHECK(adapter_ops16(lora, &ops16));
    FSDP2_CHECK(fsdp2_nn_linear_forward(x, rows, weight, bias, y, ws));
    int64_t out = weight->shape[0], in = weight->shape[1];
    if (rows == 0 || out == 0 || in == 0)
        return FSDP2_SUCCESS;
    lora_scratch_t s;
    FSDP2_CHECK(carve(weight, lora, r, ops16, ws, "LoRA forward", &s));
    if (ops16)
        return forward_bf16_operands(x, rows, in, out, r, lora, y, &s);
    for (int64_t r0 = 0; r0 < rows; r0 += s.rb) {
        int64_t n = rows - r0 < s.rb ? rows - r0 : s.rb;
        const float *t;
        FSDP2_CHECK(adapter_input(x, r0, n, in, r, lora, &s, &t));
        FSDP2_CHECK(nn_sgemm(0, 1, n, out, r, (float)lora->scale, s.u, r, s.b, r, 1.0f,
                             y + r0 * out, out));
    }
    return FSDP2_SUCCESS;
}

/* A gradient's f32 sum: the tensor's own data when f32 (added to in place), else the
 * workspace's region zeroed, added into the tensor at the end. */
static float *grad_sum(fsdp2_tensor_t *g, float *region)
{
    if (!g)
        return NULL;
    if (g->dtype == FSDP2_F32)
        return g->data;
    if (!nn_gemm_preparing())
        memset(region, 0, sizeof(float) * (size_t)g->numel);
    return region;
}

/* The adapter's backward by blocks of rows on f32 operands; ga and gb the f32 sums (or
 * NULL). */
static fsdp2_status_t backward_f32_operands(const float *x, const float *dy, int64_t rows,
                                            int64_t in, int64_t out, int64_t r,
                                            const fsdp2_nn_lora_t *lora, float *dx, float *ga,
                                            float *gb, lora_scratch_t *s)
{
    float scale = (float)lora->scale;
    for (int64_t r0 = 0; r0 < rows; r0 += s->rb) {
        int64_t n = rows - r0 < s->rb ? rows - r0 : s->rb;
        const float *t, *g = dy + r0 * out;
        FSDP2_CHECK(adapter_input(x, r0, n, in, r, lora, s, &t));
        if (gb) /* dB += scale dy^T u */
            FSDP2_CHECK(nn_sgemm(1, 0, out, r, n, scale, g, out, s->u, r, 1.0f, gb, r));
        if (!ga && !dx)
            continue;
        /* du = scale dy B; dA += du^T t; dt = du A, through the mask into dx */
        FSDP2_CHECK(nn_sgemm(0, 0, n, r, out, scale, g, out, s->b, r, 0.0f, s->du, r));
        if (ga)
            FSDP2_CHECK(nn_sgemm(1, 0, r, in, n, 1.0f, s->du, r, t, in, 1.0f, ga, in));
        if (!dx)
            continue;
        FSDP2_CHECK(nn_sgemm(0, 0, n, in, r, 1.0f, s->du, r, s->a, in, 0.0f, s->dt, in));
        if (!nn_gemm_preparing())
            (void)fsdp2_nn_dropout_backward(s->dt, n * in, lora->dropout, lora->seed,
                                            lora->offset + (uint64_t)(r0 * in), dx + r0 * in);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_lora_backward(const float *x, const float *dy, int64_t rows,
                                      const fsdp2_tensor_t *weight, const fsdp2_nn_lora_t *lora,
                                      float *dx, fsdp2_tensor_t *da, fsdp2_tensor_t *db,
                                      fsdp2_nn_workspace_t *ws)
{
    int64_t r;
    FSDP2_CHECK(check_lora(weight, lora, &r));
    if (da)
        FSDP2_CHECK(nn_check_param(da, "lora A gradient", 2, lora->a->shape));
    if (db)
        FSDP2_CHECK(nn_check_param(db, "lora B gradient", 2, lora->b->shape));
    size_t need;
    nn_carve_t c;
    FSDP2_CHECK(fsdp2_nn_lora_workspace_bytes(weight->shape[1], weight->shape[0], r, &need));
    FSDP2_CHECK(nn_carve_begin(ws, need, "LoRA backward", &c));
    FSDP2_ARG_CHECK(!dx || (dx != dy && dx != x), "dx aliases x or dy: the backward adds into dx");
    int ops16; /* asked before the base writes dx */
    FSDP2_CHECK(adapter_ops16(lora, &ops16));
    /* the frozen base: dx += dy W, no gradient of W or b */
    FSDP2_CHECK(fsdp2_nn_linear_backward(x, dy, rows, weight, dx, NULL, NULL, ws));
    int64_t out = weight->shape[0], in = weight->shape[1];
    if (rows == 0 || out == 0 || in == 0)
        return FSDP2_SUCCESS;
    lora_scratch_t s;
    FSDP2_CHECK(carve(weight, lora, r, ops16, ws, "LoRA backward", &s));
    float *ga = grad_sum(da, s.ga), *gb = grad_sum(db, s.gb);
    if (ops16)
        FSDP2_CHECK(backward_bf16_operands(x, dy, rows, in, out, r, lora, dx, ga, gb, &s));
    else
        FSDP2_CHECK(backward_f32_operands(x, dy, rows, in, out, r, lora, dx, ga, gb, &s));
    if (ga && ga == s.ga)
        nn_add_into(da, 0, ga, da->numel);
    if (gb && gb == s.gb)
        nn_add_into(db, 0, gb, db->numel);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_lora_prepare(int64_t rows, int64_t in, int64_t out, int64_t r,
                                     double scale, fsdp2_dtype_t weight_dtype,
                                     fsdp2_dtype_t adapter_dtype, int bias)
{
    FSDP2_CHECK(nn_check_dim(rows, "rows"));
    FSDP2_CHECK(nn_check_dim(r, "r"));
    FSDP2_CHECK(nn_check_dtype(weight_dtype, "LoRA base weight"));
    FSDP2_CHECK(nn_check_dtype(adapter_dtype, "LoRA adapter"));
    FSDP2_ARG_CHECK(bias == 0 || bias == 1, "bias = %d: 0 or 1", bias);
    size_t ws_bytes;
    FSDP2_CHECK(fsdp2_nn_lora_workspace_bytes(in, out, r, &ws_bytes)); /* checks in, out */
    const int64_t arrays[5][3] = {{rows, in, 1}, {rows, out, 1}, {out, in, 1}, {r, in, 1},
                                  {out, r, 1}};
    size_t bytes;
    FSDP2_CHECK(nn_prepare_bytes(arrays, 5, ws_bytes, &bytes));
    nn_prepare_t p;
    FSDP2_CHECK(nn_prepare_begin(&p, bytes));
    int64_t wshape[2] = {out, in}, ashape[2] = {r, in}, bshape[2] = {out, r};
    fsdp2_tensor_t w, b, a, bb, da, db;
    nn_prepare_tensor(&p, &w, weight_dtype, 2, wshape);
    nn_prepare_tensor(&p, &b, weight_dtype, 1, &out);
    nn_prepare_tensor(&p, &a, adapter_dtype, 2, ashape);
    nn_prepare_tensor(&p, &bb, adapter_dtype, 2, bshape);
    nn_prepare_tensor(&p, &da, adapter_dtype, 2, ashape);
    nn_prepare_tensor(&p, &db, adapter_dtype, 2, bshape);
    fsdp2_nn_lora_t lora = {.a = &a, .b = &bb, .scale = scale};
    fsdp2_nn_workspace_t ws = {p.span, ws_bytes};
    /* every array in the span (y and dx apart from x, as the calls insist): nothing is
     * read or written */
    fsdp2_status_t s = fsdp2_nn_lora_forward(p.span, rows, &w, bias ? &b : NULL, &lora,
                                             (float *)p.span + 16, &ws);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_nn_lora_backward(p.span, (float *)p.span + 16, rows, &w, &lora,
                                   (float *)p.span + 32, &da, &db, &ws);
    nn_prepare_end(&p);
    return s;
}

