/* The LoRA linear and conv2d with bf16 parameters under FSDP2_NN_BF16_GEMM (lib/nn/lora.c,
 * lib/nn/conv.c): under on, forward and backward against a float64 reference on
 * bf16-rounded operands (x, the dropout's output, dy, the adapter's u = t A^T and
 * du = scale dy B, conv's im2col columns), with f32 and bf16 gradients, over several
 * blocks of rows and both places dy's rounded rows are staged; in exactly the workspace
 * the queries report. off (and an adapter with one f32 matrix) the bits of the f32 path
 * on the rounded parameters; auto the bits of on where oneDNN has bf16 kernels and of off
 * elsewhere; a bad value refused before anything is written.
 *
 * Tolerances: a product of two bf16 values is exact in f32, so an f32 result differs from
 * the float64 sum of its K terms by at most (K + c) 2^-24 times the sum of their
 * magnitudes (Higham's gamma_K; c counts the other roundings: alpha, the dropout's scale,
 * the bias, the adds into C and into dx). An intermediate the layer rounds to bf16 (u,
 * du) is itself such an f32 sum: where a bf16 rounding boundary lies within its bound,
 * the layer's rounded value may be the neighbour of the reference's, one bf16 step away,
 * and that step times what it multiplies is added to the bound of every result using it.
 * Rounding an operand other than to nearest even, or not at all, moves a result by about
 * 2^-9 of its magnitudes: far outside the bounds for the sizes used here. */
#include "../core/check_main.h"
#include "bf16_test_util.h"

#include <math.h>

#include "nn/gemm.h"

#define EPS 0x1p-24

static double *f64_array(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

static uint16_t *bf16_copy(const uint16_t *src, int64_t n)
{
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    ck_assert_ptr_nonnull(p);
    memcpy(p, src, sizeof(uint16_t) * (size_t)n);
    return p;
}

/* Exactly the bytes a query reported: the layer may use no more. */
static fsdp2_nn_workspace_t workspace(size_t bytes)
{
    fsdp2_nn_workspace_t ws = {malloc(bytes), bytes};
    ck_assert_ptr_nonnull(ws.data);
    return ws;
}

/* An f32 sum the layer rounds to bf16, within err of the float64 v: the reference's
 * rounded value, and in *step how far the layer's may be from it. */
static double round_within(double v, double err, double *step)
{
    double mid = rounded((float)v), lo = rounded((float)(v - err)), hi = rounded((float)(v + err));
    *step = fmax(mid - lo, hi - mid);
    return mid;
}

static int same_floats(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

/* ---- LoRA ---- */

/* One LoRA layer: a bf16 base W [out, in] with an f32 bias, adapters A [r, in] and
 * B [out, r] bf16, and the gradients' starting values (accumulation is checked too). */
typedef struct lora_case {
    int64_t rows, in, out, r;
    double p, scale;
    float *x, *dy, *bias, *dx0, *da0, *db0;
    uint16_t *w, *a, *b, *da0_bf16, *db0_bf16;
} lora_case_t;

typedef struct lora_results {
    float *y, *dx, *da, *db; /* da, db as f32 whatever the gradients' dtype */
} lora_results_t;

static lora_case_t make_lora(int64_t rows, int64_t in, int64_t out, int64_t r, double p)
{
    lora_case_t c = {rows, in, out, r, p, 2.0 / (double)r + 0.3,
                     random_f32(rows * in), random_f32(rows * out), random_f32(out),
                     random_f32(rows * in), random_f32(r * in), random_f32(out * r),
                     random_bf16(out * in), random_bf16(r * in), random_bf16(out * r),
                     random_bf16(r * in), random_bf16(out * r)};
    return c;
}

static void free_lora(lora_case_t *c)
{
    float *f[] = {c->x, c->dy, c->bias, c->dx0, c->da0, c->db0};
    uint16_t *h[] = {c->w, c->a, c->b, c->da0_bf16, c->db0_bf16};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        free(f[i]);
    for (size_t i = 0; i < sizeof(h) / sizeof(h[0]); i++)
        free(h[i]);
}

static void free_lora_results(lora_results_t *r)
{
    free(r->y);
    free(r->dx);
    free(r->da);
    free(r->db);
}

/* A gradient tensor of gdtype starting at f32 or bf16 values; *f32_data its f32 array
 * (the results' own), *bf16_data a bf16 copy (to free). */
static fsdp2_tensor_t *grad(fsdp2_dtype_t gdtype, const float *init, const uint16_t *init16,
                            int64_t d0, int64_t d1, float *f32_data, uint16_t **bf16_data)
{
    int64_t n = d0 * d1;
    *bf16_data = bf16_copy(init16, n);
    if (gdtype == FSDP2_F32) {
        memcpy(f32_data, init, sizeof(float) * (size_t)n);
        return wrap(f32_data, FSDP2_F32, 2, d0, d1);
    }
    return wrap(*bf16_data, FSDP2_BF16, 2, d0, d1);
}

/* Forward and backward with A and B bf16, or as the f32 values a32 and b32 where given
 * (each independently); the adapter's gradients of gdtype. */
static lora_results_t run_lora(const lora_case_t *c, const float *a32, const float *b32,
                               fsdp2_dtype_t gdtype)
{
    int64_t rows = c->rows, in = c->in, out = c->out, r = c->r;
    lora_results_t res = {f32_array(rows * out), f32_array(rows * in), f32_array(r * in),
                          f32_array(out * r)};
    memcpy(res.dx, c->dx0, sizeof(float) * (size_t)(rows * in));
    fsdp2_tensor_t *w = wrap(c->w, FSDP2_BF16, 2, out, in);
    fsdp2_tensor_t *bias = wrap(c->bias, FSDP2_F32, 1, out, 0);
    fsdp2_tensor_t *a = a32 ? wrap((void *)a32, FSDP2_F32, 2, r, in)
                            : wrap(c->a, FSDP2_BF16, 2, r, in);
    fsdp2_tensor_t *b = b32 ? wrap((void *)b32, FSDP2_F32, 2, out, r)
                            : wrap(c->b, FSDP2_BF16, 2, out, r);
    uint16_t *da16, *db16;
    fsdp2_tensor_t *da = grad(gdtype, c->da0, c->da0_bf16, r, in, res.da, &da16);
    fsdp2_tensor_t *db = grad(gdtype, c->db0, c->db0_bf16, out, r, res.db, &db16);
    fsdp2_nn_lora_t lora = {.a = a, .b = b, .scale = c->scale, .dropout = c->p, .seed = 5,
                            .offset = 12};
    size_t bytes;
    NN_OK(fsdp2_nn_lora_workspace_bytes(in, out, r, &bytes));
    fsdp2_nn_workspace_t ws = workspace(bytes);
    NN_OK(fsdp2_nn_lora_forward(c->x, rows, w, bias, &lora, res.y, &ws));
    NN_OK(fsdp2_nn_lora_backward(c->x, c->dy, rows, w, &lora, res.dx, da, db, &ws));
    if (gdtype != FSDP2_F32) {
        for (int64_t i = 0; i < r * in; i++)
            res.da[i] = fsdp2_bf16_to_f32(da16[i]);
        for (int64_t i = 0; i < out * r; i++)
            res.db[i] = fsdp2_bf16_to_f32(db16[i]);
    }
    fsdp2_tensor_t *tensors[] = {w, bias, a, b, da, db};
    for (size_t i = 0; i < sizeof(tensors) / sizeof(tensors[0]); i++)
        fsdp2_tensor_release(tensors[i]);
    free(ws.data);
    free(da16);
    free(db16);
    return res;
}

/* The float64 reference and each element's bound, for y, dx, dA and dB. */
typedef struct lora_expected {
    double *y, *y_bound, *dx, *dx_bound, *da, *da_bound, *db, *db_bound;
} lora_expected_t;

/* The adapter's input as the layer rounds it (t = dropout(x), the dropout being the
 * library's own, tested elsewhere) and the mask's factors (0 or 1 / (1 - p)). */
static void adapter_input(const lora_case_t *c, double *t16, double *mask)
{
    int64_t n = c->rows * c->in;
    float *t = f32_array(n), *ones = f32_array(n), *m = f32_array(n);
    memcpy(t, c->x, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        ones[i] = m[i] = 1.0f;
    if (c->p > 0) {
        NN_OK(fsdp2_nn_dropout_forward(c->x, n, c->p, 5, 12, t));
        NN_OK(fsdp2_nn_dropout_forward(ones, n, c->p, 5, 12, m));
    }
    for (int64_t i = 0; i < n; i++) {
        t16[i] = rounded(t[i]);
        mask[i] = m[i];
    }
    free(t);
    free(ones);
    free(m);
}

static void lora_forward_reference(const lora_case_t *c, const double *x16, const double *t16,
                                   const double *a, const double *b, double *u, double *u_step,
                                   lora_expected_t *e)
{
    int64_t in = c->in, out = c->out, r = c->r;
    for (int64_t q = 0; q < c->rows; q++) {
        for (int64_t j = 0; j < r; j++) { /* u = t A^T, rounded */
            double s = 0, mag = 0;
            for (int64_t i = 0; i < in; i++) {
                s += t16[q * in + i] * a[j * in + i];
                mag += fabs(t16[q * in + i] * a[j * in + i]);
            }
            u[q * r + j] = round_within(s, (double)(in + 2) * EPS * mag, &u_step[q * r + j]);
        }
        for (int64_t o = 0; o < out; o++) { /* y = x W^T + bias + scale u B^T */
            double s = c->bias[o], mag = fabs(s), ad = 0, ad_mag = 0, slack = 0;
            for (int64_t i = 0; i < in; i++) {
                double v = x16[q * in + i] * bf(c->w[o * in + i]);
                s += v;
                mag += fabs(v);
            }
            for (int64_t j = 0; j < r; j++) {
                ad += u[q * r + j] * b[o * r + j];
                ad_mag += (fabs(u[q * r + j]) + u_step[q * r + j]) * fabs(b[o * r + j]);
                slack += u_step[q * r + j] * fabs(b[o * r + j]);
            }
            e->y[q * out + o] = s + c->scale * ad;
            e->y_bound[q * out + o] = (double)(in + r + 6) * EPS * (mag + c->scale * ad_mag) +
                                      c->scale * slack;
        }
    }
}

static void lora_backward_reference(const lora_case_t *c, fsdp2_dtype_t gdtype,
                                    const double *t16, const double *mask, const double *a,
                                    const double *b, const double *u, const double *u_step,
                                    lora_expected_t *e)
{
    int64_t rows = c->rows, in = c->in, out = c->out, r = c->r;
    double *dy16 = f64_array(rows * out), *du = f64_array(rows * r), *du_step = f64_array(rows * r);
    for (int64_t i = 0; i < rows * out; i++)
        dy16[i] = rounded(c->dy[i]);
    for (int64_t q = 0; q < rows; q++)
        for (int64_t j = 0; j < r; j++) { /* du = scale dy B, rounded */
            double s = 0, mag = 0;
            for (int64_t o = 0; o < out; o++) {
                s += dy16[q * out + o] * b[o * r + j];
                mag += fabs(dy16[q * out + o] * b[o * r + j]);
            }
            du[q * r + j] = round_within(c->scale * s, (double)(out + 3) * EPS * c->scale * mag,
                                         &du_step[q * r + j]);
        }
    for (int64_t q = 0; q < rows; q++) /* dx = dx0 + dy W + mask (du A) */
        for (int64_t i = 0; i < in; i++) {
            double s = c->dx0[q * in + i], mag = fabs(s), ad = 0, ad_mag = 0, slack = 0;
            for (int64_t o = 0; o < out; o++) {
                double v = dy16[q * out + o] * bf(c->w[o * in + i]);
                s += v;
                mag += fabs(v);
            }
            for (int64_t j = 0; j < r; j++) {
                ad += du[q * r + j] * a[j * in + i];
                ad_mag += (fabs(du[q * r + j]) + du_step[q * r + j]) * fabs(a[j * in + i]);
                slack += du_step[q * r + j] * fabs(a[j * in + i]);
            }
            double m = mask[q * in + i];
            e->dx[q * in + i] = s + m * ad;
            e->dx_bound[q * in + i] = (double)(out + r + 8) * EPS * (mag + m * ad_mag) + m * slack;
        }
    for (int64_t j = 0; j < r; j++) /* dA = dA0 + du^T t */
        for (int64_t i = 0; i < in; i++) {
            double s = gdtype == FSDP2_F32 ? c->da0[j * in + i] : bf(c->da0_bf16[j * in + i]);
            double mag = fabs(s), slack = 0;
            for (int64_t q = 0; q < rows; q++) {
                s += du[q * r + j] * t16[q * in + i];
                mag += (fabs(du[q * r + j]) + du_step[q * r + j]) * fabs(t16[q * in + i]);
                slack += du_step[q * r + j] * fabs(t16[q * in + i]);
            }
            e->da[j * in + i] = s;
            e->da_bound[j * in + i] = (double)(rows + 4) * EPS * mag + slack;
        }
    for (int64_t o = 0; o < out; o++) /* dB = dB0 + scale dy^T u */
        for (int64_t j = 0; j < r; j++) {
            double s = 0, mag = 0, slack = 0;
            for (int64_t q = 0; q < rows; q++) {
                s += dy16[q * out + o] * u[q * r + j];
                mag += fabs(dy16[q * out + o]) * (fabs(u[q * r + j]) + u_step[q * r + j]);
                slack += fabs(dy16[q * out + o]) * u_step[q * r + j];
            }
            double b0 = gdtype == FSDP2_F32 ? c->db0[o * r + j] : bf(c->db0_bf16[o * r + j]);
            e->db[o * r + j] = b0 + c->scale * s;
            e->db_bound[o * r + j] =
                (double)(rows + 4) * EPS * (fabs(b0) + c->scale * mag) + c->scale * slack;
        }
    free(dy16);
    free(du);
    free(du_step);
}

static lora_expected_t expect_lora(const lora_case_t *c, fsdp2_dtype_t gdtype)
{
    int64_t rows = c->rows, in = c->in, out = c->out, r = c->r;
    lora_expected_t e;
    double **arrays[] = {&e.y, &e.y_bound, &e.dx, &e.dx_bound,
                         &e.da, &e.da_bound, &e.db, &e.db_bound};
    int64_t sizes[] = {rows * out, rows * out, rows * in, rows * in, r * in, r * in, out * r, out * r};
    for (int i = 0; i < 8; i++)
        *arrays[i] = f64_array(sizes[i]);
    double *x16 = f64_array(rows * in), *t16 = f64_array(rows * in), *mask = f64_array(rows * in);
    double *a = f64_array(r * in), *b = f64_array(out * r);
    double *u = f64_array(rows * r), *u_step = f64_array(rows * r);
    for (int64_t i = 0; i < rows * in; i++)
        x16[i] = rounded(c->x[i]);
    for (int64_t i = 0; i < r * in; i++)
        a[i] = bf(c->a[i]);
    for (int64_t i = 0; i < out * r; i++)
        b[i] = bf(c->b[i]);
    adapter_input(c, t16, mask);
    lora_forward_reference(c, x16, t16, a, b, u, u_step, &e);
    lora_backward_reference(c, gdtype, t16, mask, a, b, u, u_step, &e);
    double *tmp[] = {x16, t16, mask, a, b, u, u_step};
    for (size_t i = 0; i < sizeof(tmp) / sizeof(tmp[0]); i++)
        free(tmp[i]);
    return e;
}

static void free_lora_expected(lora_expected_t *e)
{
    double *arrays[] = {e->y, e->y_bound, e->dx, e->dx_bound, e->da, e->da_bound, e->db,
                        e->db_bound};
    for (int i = 0; i < 8; i++)
        free(arrays[i]);
}

/* rows, in, out, r, dropout: 600 rows of in 1031 are three blocks of the adapter's rows
 * (254 each, the last partial); out 1031 over in 37 rounds dy in pieces of 508 rows in the
 * dropout's region; r 64 with in 3 and out 5000 stages dy in the adapter's own f32
 * regions instead (128 rows a piece). */
static const struct {
    int64_t rows, in, out, r;
    double p;
} lora_shapes[] = {{600, 1031, 37, 4, 0.0},
                   {1100, 37, 1031, 8, 0.3},
                   {300, 3, 5000, 64, 0.0},
                   {5, 3, 2, 1, 0.5}};

START_TEST(lora_on_matches_float64_on_bf16_rounded_operands)
{
    set_mode("on");
    for (size_t si = 0; si < sizeof(lora_shapes) / sizeof(lora_shapes[0]); si++)
        for (int g = 0; g < 2; g++) {
            fsdp2_dtype_t gdtype = g ? FSDP2_BF16 : FSDP2_F32;
            lora_case_t c = make_lora(lora_shapes[si].rows, lora_shapes[si].in,
                                      lora_shapes[si].out, lora_shapes[si].r, lora_shapes[si].p);
            lora_results_t res = run_lora(&c, NULL, NULL, gdtype);
            lora_expected_t e = expect_lora(&c, gdtype);
            char what[128];
            snprintf(what, sizeof(what), "lora rows %lld in %lld out %lld r %lld p %g grad %s",
                     (long long)c.rows, (long long)c.in, (long long)c.out, (long long)c.r, c.p,
                     fsdp2_dtype_name(gdtype));
            count_past(what, res.y, e.y, e.y_bound, c.rows * c.out, 0, 1);
            count_past(what, res.dx, e.dx, e.dx_bound, c.rows * c.in, 0, 1);
            count_past(what, res.da, e.da, e.da_bound, c.r * c.in, g, 1);
            count_past(what, res.db, e.db, e.db_bound, c.out * c.r, g, 1);
            free_lora_results(&res);
            free_lora_expected(&e);
            free_lora(&c);
        }
}
END_TEST

static int same_lora(const lora_case_t *c, const lora_results_t *x, const lora_results_t *y)
{
    return same_floats(x->y, y->y, c->rows * c->out) && same_floats(x->dx, y->dx, c->rows * c->in) &&
           same_floats(x->da, y->da, c->r * c->in) && same_floats(x->db, y->db, c->out * c->r);
}

/* ---- conv2d ---- */

/* One conv2d: x [batch, c, h, w], a bf16 weight [o, c, k, k], an f32 bias, dy, and the
 * gradients' starting values. */
typedef struct conv_case {
    int64_t batch, c, h, w, o, k, oh, ow, nx, nw, ny;
    float *x, *dy, *bias, *dx0, *dw0, *db0;
    uint16_t *wt, *dw0_bf16, *db0_bf16;
} conv_case_t;

typedef struct conv_results {
    float *y, *dx, *dw, *db;
} conv_results_t;

static conv_case_t make_conv(int64_t batch, int64_t c, int64_t h, int64_t w, int64_t o,
                             int64_t k)
{
    int64_t oh = h - k + 1, ow = w - k + 1;
    int64_t nx = batch * c * h * w, nw = o * c * k * k, ny = batch * o * oh * ow;
    conv_case_t v = {batch, c, h, w, o, k, oh, ow, nx, nw, ny,
                     random_f32(nx), random_f32(ny), random_f32(o), random_f32(nx),
                     random_f32(nw), random_f32(o), random_bf16(nw), random_bf16(nw),
                     random_bf16(o)};
    return v;
}

static void free_conv(conv_case_t *v)
{
    float *f[] = {v->x, v->dy, v->bias, v->dx0, v->dw0, v->db0};
    uint16_t *h[] = {v->wt, v->dw0_bf16, v->db0_bf16};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        free(f[i]);
    for (size_t i = 0; i < sizeof(h) / sizeof(h[0]); i++)
        free(h[i]);
}

static void free_conv_results(conv_results_t *r)
{
    free(r->y);
    free(r->dx);
    free(r->dw);
    free(r->db);
}

static fsdp2_tensor_t *tensor4(void *data, fsdp2_dtype_t dtype, const conv_case_t *v)
{
    int64_t shape[4] = {v->o, v->c, v->k, v->k};
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_tensor_t *t = NULL;
    NN_OK(fsdp2_tensor_from_blob(data, cpu, dtype, 4, shape, NULL, NULL, &t));
    return t;
}

/* Forward and backward with the weight bf16 (w32 NULL) or as the f32 values w32; the
 * weight and bias gradients of gdtype. */
static conv_results_t run_conv(const conv_case_t *v, const float *w32, fsdp2_dtype_t gdtype)
{
    conv_results_t res = {f32_array(v->ny), f32_array(v->nx), f32_array(v->nw), f32_array(v->o)};
    memcpy(res.dx, v->dx0, sizeof(float) * (size_t)v->nx);
    fsdp2_tensor_t *w = w32 ? tensor4((void *)w32, FSDP2_F32, v) : tensor4(v->wt, FSDP2_BF16, v);
    fsdp2_tensor_t *bias = wrap(v->bias, FSDP2_F32, 1, v->o, 0);
    uint16_t *dw16 = bf16_copy(v->dw0_bf16, v->nw), *db16 = bf16_copy(v->db0_bf16, v->o);
    fsdp2_tensor_t *dw, *db;
    if (gdtype == FSDP2_F32) {
        memcpy(res.dw, v->dw0, sizeof(float) * (size_t)v->nw);
        memcpy(res.db, v->db0, sizeof(float) * (size_t)v->o);
        dw = tensor4(res.dw, FSDP2_F32, v);
        db = wrap(res.db, FSDP2_F32, 1, v->o, 0);
    } else {
        dw = tensor4(dw16, FSDP2_BF16, v);
        db = wrap(db16, FSDP2_BF16, 1, v->o, 0);
    }
    size_t bytes;
    NN_OK(fsdp2_nn_conv2d_workspace_bytes(v->c, v->h, v->w, v->o, v->k, &bytes));
    fsdp2_nn_workspace_t ws = workspace(bytes);
    NN_OK(fsdp2_nn_conv2d_forward(v->x, v->batch, v->h, v->w, w, bias, res.y, &ws));
    NN_OK(fsdp2_nn_conv2d_backward(v->x, v->dy, v->batch, v->h, v->w, w, res.dx, dw, db, &ws));
    if (gdtype != FSDP2_F32) {
        for (int64_t i = 0; i < v->nw; i++)
            res.dw[i] = fsdp2_bf16_to_f32(dw16[i]);
        for (int64_t i = 0; i < v->o; i++)
            res.db[i] = fsdp2_bf16_to_f32(db16[i]);
    }
    fsdp2_tensor_release(w);
    fsdp2_tensor_release(bias);
    fsdp2_tensor_release(dw);
    fsdp2_tensor_release(db);
    free(ws.data);
    free(dw16);
    free(db16);
    return res;
}

typedef struct conv_expected {
    double *y, *y_bound, *dx, *dx_bound, *dw, *dw_bound, *db, *db_bound;
} conv_expected_t;

/* The float64 reference on rounded x, dy and W: every (sample, output channel, output
 * position, input channel, kernel tap) term once, into y, dx and dW; the bias gradient
 * on dy as it is (the f32 path's sum in every mode). */
static conv_expected_t expect_conv(const conv_case_t *v, fsdp2_dtype_t gdtype)
{
    conv_expected_t e;
    double **arrays[] = {&e.y, &e.y_bound, &e.dx, &e.dx_bound,
                         &e.dw, &e.dw_bound, &e.db, &e.db_bound};
    int64_t sizes[] = {v->ny, v->ny, v->nx, v->nx, v->nw, v->nw, v->o, v->o};
    for (int i = 0; i < 8; i++)
        *arrays[i] = f64_array(sizes[i]);
    /* magnitudes first, in the bound arrays */
    for (int64_t i = 0; i < v->nx; i++) {
        e.dx[i] = v->dx0[i];
        e.dx_bound[i] = fabs(v->dx0[i]);
    }
    for (int64_t i = 0; i < v->nw; i++) {
        e.dw[i] = gdtype == FSDP2_F32 ? v->dw0[i] : bf(v->dw0_bf16[i]);
        e.dw_bound[i] = fabs(e.dw[i]);
    }
    for (int64_t oc = 0; oc < v->o; oc++) {
        e.db[oc] = gdtype == FSDP2_F32 ? v->db0[oc] : bf(v->db0_bf16[oc]);
        e.db_bound[oc] = fabs(e.db[oc]);
    }
    int64_t n = v->oh * v->ow, kk = v->c * v->k * v->k;
    for (int64_t s = 0; s < v->batch; s++)
        for (int64_t oc = 0; oc < v->o; oc++)
            for (int64_t p = 0; p < n; p++) {
                int64_t yi = (s * v->o + oc) * n + p, oi = p / v->ow, oj = p % v->ow;
                double ys = v->bias[oc], ymag = fabs(ys), g = rounded(v->dy[yi]);
                e.db[oc] += v->dy[yi];
                e.db_bound[oc] += fabs(v->dy[yi]);
                for (int64_t t = 0; t < kk; t++) {
                    int64_t ci = t / (v->k * v->k), ki = t / v->k % v->k, kj = t % v->k;
                    int64_t xi = ((s * v->c + ci) * v->h + oi + ki) * v->w + oj + kj;
                    double x = rounded(v->x[xi]), w = bf(v->wt[oc * kk + t]);
                    ys += w * x;
                    ymag += fabs(w * x);
                    e.dx[xi] += w * g;
                    e.dx_bound[xi] += fabs(w * g);
                    e.dw[oc * kk + t] += g * x;
                    e.dw_bound[oc * kk + t] += fabs(g * x);
                }
                e.y[yi] = ys;
                e.y_bound[yi] = (double)(kk + 3) * EPS * ymag;
            }
    for (int64_t i = 0; i < v->nx; i++)
        e.dx_bound[i] *= (double)(v->o * v->k * v->k + 3) * EPS;
    for (int64_t i = 0; i < v->nw; i++)
        e.dw_bound[i] *= (double)(v->batch * n + 3) * EPS;
    for (int64_t oc = 0; oc < v->o; oc++)
        e.db_bound[oc] *= (double)(v->batch * n + 3) * EPS;
    return e;
}

static void free_conv_expected(conv_expected_t *e)
{
    double *arrays[] = {e->y, e->y_bound, e->dx, e->dx_bound, e->dw, e->dw_bound, e->db,
                        e->db_bound};
    for (int i = 0; i < 8; i++)
        free(arrays[i]);
}

/* batch, c, h, w, o, k: a full chunk of 4 samples and a partial one; 800 columns per
 * output (c 32, k 5); a kernel the size of the image; k 1. */
static const int64_t conv_shapes[][6] = {
    {6, 3, 9, 8, 5, 3}, {5, 32, 12, 12, 64, 5}, {3, 2, 5, 5, 4, 5}, {4, 3, 4, 5, 2, 1}};

START_TEST(conv2d_on_matches_float64_on_bf16_rounded_operands)
{
    set_mode("on");
    for (size_t si = 0; si < sizeof(conv_shapes) / sizeof(conv_shapes[0]); si++)
        for (int g = 0; g < 2; g++) {
            fsdp2_dtype_t gdtype = g ? FSDP2_BF16 : FSDP2_F32;
            const int64_t *sh = conv_shapes[si];
            conv_case_t v = make_conv(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5]);
            conv_results_t res = run_conv(&v, NULL, gdtype);
            conv_expected_t e = expect_conv(&v, gdtype);
            char what[128];
            snprintf(what, sizeof(what), "conv2d %lldx%lldx%lldx%lld o %lld k %lld grad %s",
                     (long long)sh[0], (long long)sh[1], (long long)sh[2], (long long)sh[3],
                     (long long)sh[4], (long long)sh[5], fsdp2_dtype_name(gdtype));
            count_past(what, res.y, e.y, e.y_bound, v.ny, 0, 1);
            count_past(what, res.dx, e.dx, e.dx_bound, v.nx, 0, 1);
            count_past(what, res.dw, e.dw, e.dw_bound, v.nw, g, 1);
            count_past(what, res.db, e.db, e.db_bound, v.o, g, 1);
            free_conv_results(&res);
            free_conv_expected(&e);
            free_conv(&v);
        }
}
END_TEST

static int same_conv(const conv_case_t *v, const conv_results_t *a, const conv_results_t *b)
{
    return same_floats(a->y, b->y, v->ny) && same_floats(a->dx, b->dx, v->nx) &&
           same_floats(a->dw, b->dw, v->nw) && same_floats(a->db, b->db, v->o);
}

/* ---- the modes ---- */

/* off: the activations stay f32, so both layers give the bits of their f32 path on the
 * rounded parameters, and their results are not within the bounds of the rounded
 * reference. Under on an adapter with one f32 matrix takes the f32 path too. */
START_TEST(off_gives_the_bits_of_the_f32_path_on_the_rounded_parameters)
{
    const char *modes[] = {"off", "on"};
    for (int mi = 0; mi < 2; mi++) {
        set_mode(modes[mi]);
        lora_case_t c = make_lora(300, 37, 1031, 8, 0.3);
        float *a32 = from_bf16(c.a, c.r * c.in), *b32 = from_bf16(c.b, c.out * c.r);
        lora_results_t f32 = run_lora(&c, a32, b32, FSDP2_F32);
        if (mi == 0) {
            lora_results_t off = run_lora(&c, NULL, NULL, FSDP2_F32);
            ck_assert_msg(same_lora(&c, &off, &f32), "off: bf16 adapters differ from f32 ones");
            lora_expected_t e = expect_lora(&c, FSDP2_F32);
            ck_assert_int_gt(count_past("off lora y", off.y, e.y, e.y_bound, c.rows * c.out, 0, 0),
                             0);
            free_lora_expected(&e);
            free_lora_results(&off);
        } else { /* on: A bf16 with B f32, A f32 with B bf16 */
            lora_results_t a16 = run_lora(&c, NULL, b32, FSDP2_F32);
            lora_results_t b16 = run_lora(&c, a32, NULL, FSDP2_F32);
            ck_assert_msg(same_lora(&c, &a16, &f32), "on: bf16 A with f32 B left the f32 path");
            ck_assert_msg(same_lora(&c, &b16, &f32), "on: f32 A with bf16 B left the f32 path");
            free_lora_results(&a16);
            free_lora_results(&b16);
        }
        free_lora_results(&f32);
        free(a32);
        free(b32);
        free_lora(&c);
    }
    set_mode("off");
    for (int g = 0; g < 2; g++) {
        fsdp2_dtype_t gdtype = g ? FSDP2_BF16 : FSDP2_F32;
        conv_case_t v = make_conv(6, 3, 9, 8, 5, 3);
        float *w32 = from_bf16(v.wt, v.nw);
        conv_results_t off = run_conv(&v, NULL, gdtype), f32 = run_conv(&v, w32, gdtype);
        ck_assert_msg(same_conv(&v, &off, &f32), "off: a bf16 conv2d weight differs from f32");
        conv_expected_t e = expect_conv(&v, gdtype);
        ck_assert_int_gt(count_past("off conv2d y", off.y, e.y, e.y_bound, v.ny, 0, 0), 0);
        free_conv_expected(&e);
        free_conv_results(&off);
        free_conv_results(&f32);
        free(w32);
        free_conv(&v);
    }
}
END_TEST

/* auto (and unset) is on where oneDNN has bf16 kernels, off elsewhere: the same bits. */
START_TEST(auto_is_on_where_native_and_off_elsewhere)
{
    const char *modes[] = {"on", "off", "auto", NULL};
    lora_case_t c = make_lora(300, 37, 1031, 8, 0.3);
    conv_case_t v = make_conv(5, 32, 12, 12, 64, 5);
    lora_results_t lr[4];
    conv_results_t cr[4];
    for (int i = 0; i < 4; i++) {
        set_mode(modes[i]);
        lr[i] = run_lora(&c, NULL, NULL, FSDP2_F32);
        cr[i] = run_conv(&v, NULL, FSDP2_F32);
    }
    ck_assert(!same_lora(&c, &lr[0], &lr[1]));
    ck_assert(!same_conv(&v, &cr[0], &cr[1]));
    int want = nn_gemm_bf16_native() ? 0 : 1;
    for (int i = 2; i < 4; i++) {
        ck_assert_msg(same_lora(&c, &lr[i], &lr[want]), "lora under %s differs from %s",
                      modes[i] ? modes[i] : "unset", modes[want]);
        ck_assert_msg(same_conv(&v, &cr[i], &cr[want]), "conv2d under %s differs from %s",
                      modes[i] ? modes[i] : "unset", modes[want]);
    }
    for (int i = 0; i < 4; i++) {
        free_lora_results(&lr[i]);
        free_conv_results(&cr[i]);
    }
    free_lora(&c);
    free_conv(&v);
}
END_TEST

/* A bad value fails the call before anything is written: for LoRA, before its base (f32
 * here, so the base itself never asks) writes y or dx. */
START_TEST(a_bad_value_is_refused_before_anything_is_written)
{
    ck_assert_int_eq(setenv("FSDP2_NN_BF16_GEMM", "fast", 1), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_ERR_INVALID_CONFIG);
    lora_case_t c = make_lora(4, 3, 2, 1, 0.0);
    float w32[6], y[8], dx[12];
    for (int i = 0; i < 6; i++)
        w32[i] = fsdp2_bf16_to_f32(c.w[i]);
    for (int i = 0; i < 8; i++)
        y[i] = NAN;
    memset(dx, 0, sizeof(dx));
    fsdp2_tensor_t *w = wrap(w32, FSDP2_F32, 2, 2, 3), *a = wrap(c.a, FSDP2_BF16, 2, 1, 3);
    fsdp2_tensor_t *b = wrap(c.b, FSDP2_BF16, 2, 2, 1);
    fsdp2_nn_lora_t lora = {.a = a, .b = b, .scale = 1};
    ck_assert_int_eq(fsdp2_nn_lora_forward(c.x, 4, w, NULL, &lora, y, test_ws()),
                     FSDP2_ERR_INVALID_CONFIG);
    ck_assert_msg(strstr(fsdp2_last_error(), "FSDP2_NN_BF16_GEMM='fast'") != NULL, "%s",
                  fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_lora_backward(c.x, c.dy, 4, w, &lora, dx, NULL, NULL, test_ws()),
                     FSDP2_ERR_INVALID_CONFIG);
    for (int i = 0; i < 8; i++)
        ck_assert(isnan(y[i]));
    for (int i = 0; i < 12; i++)
        ck_assert(dx[i] == 0.0f);
    conv_case_t v = make_conv(2, 1, 4, 4, 2, 3);
    fsdp2_tensor_t *cw = tensor4(v.wt, FSDP2_BF16, &v);
    float cy[8];
    for (int i = 0; i < 8; i++)
        cy[i] = NAN;
    ck_assert_int_eq(fsdp2_nn_conv2d_forward(v.x, 2, 4, 4, cw, NULL, cy, test_ws()),
                     FSDP2_ERR_INVALID_CONFIG);
    ck_assert_msg(strstr(fsdp2_last_error(), "'fast'") != NULL, "%s", fsdp2_last_error());
    for (int i = 0; i < 8; i++)
        ck_assert(isnan(cy[i]));
    float cdx[32] = {0};
    ck_assert_int_eq(fsdp2_nn_conv2d_backward(v.x, v.dy, 2, 4, 4, cw, cdx, NULL, NULL, test_ws()),
                     FSDP2_ERR_INVALID_CONFIG);
    for (int i = 0; i < 32; i++)
        ck_assert(cdx[i] == 0.0f);
    fsdp2_tensor_release(w);
    fsdp2_tensor_release(a);
    fsdp2_tensor_release(b);
    fsdp2_tensor_release(cw);
    free_lora(&c);
    free_conv(&v);
}
END_TEST

static Suite *nn_bf16_lora_conv_suite(void)
{
    Suite *s = suite_create("nn_bf16_lora_conv");
    TCase *tc = tcase_create("bf16_operands");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, lora_on_matches_float64_on_bf16_rounded_operands);
    tcase_add_test(tc, conv2d_on_matches_float64_on_bf16_rounded_operands);
    tcase_add_test(tc, off_gives_the_bits_of_the_f32_path_on_the_rounded_parameters);
    tcase_add_test(tc, auto_is_on_where_native_and_off_elsewhere);
    tcase_add_test(tc, a_bad_value_is_refused_before_anything_is_written);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(nn_bf16_lora_conv_suite)
