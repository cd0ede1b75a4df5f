/* LoRA linear: the frozen base through the linear layer, then the adapter in blocks of
 * rows: t = dropout(x) (x itself without dropout), u = t A^T, y += scale u B^T. The
 * backward recomputes t and u per block (r is small: a GEMM of rows x r x in) instead of
 * keeping them, and sums the adapter's gradients in f32 before one rounding into a bf16
 * gradient. */
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
    const float *a, *b; /* the adapter as f32 */
    float *t, *u, *du, *dt, *ga, *gb;
    int64_t rb;
} lora_scratch_t;

static fsdp2_status_t carve(const fsdp2_tensor_t *weight, const fsdp2_nn_lora_t *lora, int64_t r,
                            fsdp2_nn_workspace_t *ws, const char *what, lora_scratch_t *s)
{
    int64_t out = weight->shape[0], in = weight->shape[1];
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, adapter_bytes(in, out, r), what, &c));
    s->rb = lora_rows(in);
    float *a32 = nn_carve_floats(&c, r * in), *b32 = nn_carve_floats(&c, out * r);
    s->a = nn_as_f32(lora->a, a32);
    s->b = nn_as_f32(lora->b, b32);
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
    if (lora->dropout > 0) {
        /* checked arguments: the dropout cannot fail */
        (void)fsdp2_nn_dropout_forward(t, n * in, lora->dropout, lora->seed,
                                       lora->offset + (uint64_t)(r0 * in), s->t);
        t = s->t;
    }
    *t_out = t;
    return nn_sgemm(0, 1, n, r, in, 1.0f, t, in, s->a, in, 0.0f, s->u, r);
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
    FSDP2_CHECK(fsdp2_nn_linear_forward(x, rows, weight, bias, y, ws));
    int64_t out = weight->shape[0], in = weight->shape[1];
    if (rows == 0 || out == 0 || in == 0)
        return FSDP2_SUCCESS;
    lora_scratch_t s;
    FSDP2_CHECK(carve(weight, lora, r, ws, "LoRA forward", &s));
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
    memset(region, 0, sizeof(float) * (size_t)g->numel);
    return region;
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
    /* the frozen base: dx += dy W, no gradient of W or b */
    FSDP2_CHECK(fsdp2_nn_linear_backward(x, dy, rows, weight, dx, NULL, NULL, ws));
    int64_t out = weight->shape[0], in = weight->shape[1];
    if (rows == 0 || out == 0 || in == 0)
        return FSDP2_SUCCESS;
    lora_scratch_t s;
    FSDP2_CHECK(carve(weight, lora, r, ws, "LoRA backward", &s));
    float scale = (float)lora->scale, *ga = grad_sum(da, s.ga), *gb = grad_sum(db, s.gb);
    for (int64_t r0 = 0; r0 < rows; r0 += s.rb) {
        int64_t n = rows - r0 < s.rb ? rows - r0 : s.rb;
        const float *t, *g = dy + r0 * out;
        FSDP2_CHECK(adapter_input(x, r0, n, in, r, lora, &s, &t));
        if (gb) /* dB += scale dy^T u */
            FSDP2_CHECK(nn_sgemm(1, 0, out, r, n, scale, g, out, s.u, r, 1.0f, gb, r));
        if (!ga && !dx)
            continue;
        /* du = scale dy B; dA += du^T t; dt = du A, through the mask into dx */
        FSDP2_CHECK(nn_sgemm(0, 0, n, r, out, scale, g, out, s.b, r, 0.0f, s.du, r));
        if (ga)
            FSDP2_CHECK(nn_sgemm(1, 0, r, in, n, 1.0f, s.du, r, t, in, 1.0f, ga, in));
        if (!dx)
            continue;
        FSDP2_CHECK(nn_sgemm(0, 0, n, in, r, 1.0f, s.du, r, s.a, in, 0.0f, s.dt, in));
        (void)fsdp2_nn_dropout_backward(s.dt, n * in, lora->dropout, lora->seed,
                                        lora->offset + (uint64_t)(r0 * in), dx + r0 * in);
    }
    if (ga && ga == s.ga)
        nn_add_into(da, 0, ga, da->numel);
    if (gb && gb == s.gb)
        nn_add_into(db, 0, gb, db->numel);
    return FSDP2_SUCCESS;
}
