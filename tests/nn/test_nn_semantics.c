/* lib/nn's contract beyond the numbers: gradients are added; bf16 parameters and
 * gradients give the f32 results on the rounded values; dropout masks are reproducible,
 * piecewise equal to whole, and the backward's equal the forward's; bad input is refused
 * with the offending value named and nothing written. */
#include "../core/check_main.h"
#include "../core/test_rng.h"
#include "nn_test_util.h"

#include <fsdp2/random.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float *random_f32(int64_t n, float lo, float hi)
{
    float *p = f32_array(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * (float)((rng_next(&rng_state) >> 40) * 0x1.0p-24);
    return p;
}

static uint16_t *to_bf16(const float *v, int64_t n)
{
    uint16_t *p = calloc((size_t)n, sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++)
        p[i] = fsdp2_f32_to_bf16(v[i]);
    return p;
}

static double *as_f64(const float *v, int64_t n)
{
    double *p = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        p[i] = v[i];
    return p;
}

static void assert_close_f32(const char *what, const float *got, const float *want, int64_t n,
                             double tol)
{
    double *w = as_f64(want, n);
    assert_close(what, got, w, n, tol);
    free(w);
}

START_TEST(every_backward_adds_to_its_gradients)
{
    const int64_t rows = 6, in = 5, out = 4;
    float *x = random_f32(rows * in, -1, 1), *w = random_f32(out * in, -1, 1);
    float *b = random_f32(out, -1, 1), *dy = random_f32(rows * out, -1, 1);
    float *dx1 = f32_array(rows * in), *dw1 = f32_array(out * in), *db1 = f32_array(out);
    float *dx2 = f32_array(rows * in), *dw2 = f32_array(out * in), *db2 = f32_array(out);
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, out, in), *tb = wrap(b, FSDP2_F32, 1, out, 0);
    fsdp2_tensor_t *g1w = wrap(dw1, FSDP2_F32, 2, out, in), *g1b = wrap(db1, FSDP2_F32, 1, out, 0);
    fsdp2_tensor_t *g2w = wrap(dw2, FSDP2_F32, 2, out, in), *g2b = wrap(db2, FSDP2_F32, 1, out, 0);
    NN_OK(fsdp2_nn_linear_backward(x, dy, rows, tw, dx1, g1w, g1b, test_ws()));
    NN_OK(fsdp2_nn_linear_backward(x, dy, rows, tw, dx2, g2w, g2b, test_ws()));
    NN_OK(fsdp2_nn_linear_backward(x, dy, rows, tw, dx2, g2w, g2b, test_ws()));
    for (int64_t i = 0; i < rows * in; i++)
        dx1[i] *= 2;
    for (int64_t i = 0; i < out * in; i++)
        dw1[i] *= 2;
    for (int64_t i = 0; i < out; i++)
        db1[i] *= 2;
    assert_close_f32("linear dx twice", dx2, dx1, rows * in, 1e-6);
    assert_close_f32("linear dweight twice", dw2, dw1, out * in, 1e-6);
    assert_close_f32("linear dbias twice", db2, db1, out, 1e-6);

    /* layer norm, attention and the element-wise ops add into dx as well */
    float mean[6], rstd[6], *y = f32_array(rows * in), *d1 = f32_array(rows * in);
    float *d2 = f32_array(rows * in);
    fsdp2_tensor_t *lw = wrap(w, FSDP2_F32, 1, in, 0);
    NN_OK(fsdp2_nn_layernorm_forward(x, rows, 1e-5f, lw, NULL, y, mean, rstd, test_ws()));
    NN_OK(fsdp2_nn_layernorm_backward(x, mean, rstd, y, rows, lw, d1, NULL, NULL, test_ws()));
    for (int64_t i = 0; i < rows * in; i++)
        d2[i] = 1.0f;
    NN_OK(fsdp2_nn_layernorm_backward(x, mean, rstd, y, rows, lw, d2, NULL, NULL, test_ws()));
    for (int64_t i = 0; i < rows * in; i++)
        d1[i] += 1.0f;
    assert_close_f32("layernorm dx onto ones", d2, d1, rows * in, 1e-6);
    memset(d1, 0, sizeof(float) * (size_t)(rows * in));
    NN_OK(fsdp2_nn_gelu_backward(x, y, rows * in, d1));
    NN_OK(fsdp2_nn_gelu_backward(x, y, rows * in, d1));
    memset(d2, 0, sizeof(float) * (size_t)(rows * in));
    NN_OK(fsdp2_nn_gelu_backward(x, y, rows * in, d2));
    for (int64_t i = 0; i < rows * in; i++)
        d2[i] *= 2;
    assert_close_f32("gelu dx twice", d1, d2, rows * in, 1e-6);
    fsdp2_tensor_release(lw);

    float *qkv = random_f32(2 * 3 * 9, -1, 1), *ay = f32_array(2 * 3 * 3);
    float *probs = f32_array(2 * 3 * 3 * 3), *q1 = f32_array(54), *q2 = f32_array(54);
    fsdp2_nn_workspace_t ws = workspace_new(1 << 16);
    NN_OK(fsdp2_nn_attention_forward(qkv, 2, 3, 3, 3, ay, probs));
    NN_OK(fsdp2_nn_attention_backward(qkv, probs, ay, 2, 3, 3, 3, q1, &ws));
    NN_OK(fsdp2_nn_attention_backward(qkv, probs, ay, 2, 3, 3, 3, q2, &ws));
    NN_OK(fsdp2_nn_attention_backward(qkv, probs, ay, 2, 3, 3, 3, q2, &ws));
    for (int i = 0; i < 54; i++)
        q1[i] *= 2;
    assert_close_f32("attention dqkv twice", q2, q1, 54, 1e-6);
    workspace_free(&ws);

    fsdp2_tensor_release(tw), fsdp2_tensor_release(tb);
    fsdp2_tensor_release(g1w), fsdp2_tensor_release(g1b);
    fsdp2_tensor_release(g2w), fsdp2_tensor_release(g2b);
    free(x), free(w), free(b), free(dy), free(dx1), free(dw1), free(db1), free(dx2), free(dw2);
    free(db2), free(y), free(d1), free(d2), free(qkv), free(ay), free(probs), free(q1), free(q2);
}
END_TEST

/* A layer big enough for several conversion blocks: the bf16 weight gives the f32
 * results on the rounded weight, and a bf16 gradient (from zero) is the f32 gradient
 * rounded once (within one bf16 step, plus 1e-6 for the f32 sums of 9 terms below 1, which
 * blocked and whole GEMMs add in different orders). */
START_TEST(bf16_linear_equals_f32_on_rounded_weights_across_blocks)
{
    const int64_t rows = 9, in = 600, out = 1000;
    size_t bytes;
    NN_OK(fsdp2_nn_linear_workspace_bytes(in, out, &bytes));
    ck_assert_uint_lt(bytes, 3u << 20);
    fsdp2_nn_workspace_t ws = workspace_new(bytes);
    float *x = random_f32(rows * in, -1, 1), *w = random_f32(out * in, -0.1f, 0.1f);
    float *b = random_f32(out, -1, 1), *dy = random_f32(rows * out, -1, 1);
    uint16_t *w16 = to_bf16(w, out * in), *b16 = to_bf16(b, out);
    float *wr = from_bf16(w16, out * in), *br = from_bf16(b16, out);
    float *y16 = f32_array(rows * out), *y32 = f32_array(rows * out);
    fsdp2_tensor_t *tw16 = wrap(w16, FSDP2_BF16, 2, out, in), *tb16 = wrap(b16, FSDP2_BF16, 1, out, 0);
    fsdp2_tensor_t *twr = wrap(wr, FSDP2_F32, 2, out, in), *tbr = wrap(br, FSDP2_F32, 1, out, 0);
    NN_OK(fsdp2_nn_linear_forward(x, rows, tw16, tb16, y16, &ws));
    NN_OK(fsdp2_nn_linear_forward(x, rows, twr, tbr, y32, test_ws()));
    assert_close_f32("bf16 linear y", y16, y32, rows * out, 1e-6);

    uint16_t *gw16 = calloc((size_t)(out * in), 2), *gb16 = calloc((size_t)out, 2);
    float *gw = f32_array(out * in), *gb = f32_array(out);
    float *dx16 = f32_array(rows * in), *dx32 = f32_array(rows * in);
    fsdp2_tensor_t *tgw16 = wrap(gw16, FSDP2_BF16, 2, out, in);
    fsdp2_tensor_t *tgb16 = wrap(gb16, FSDP2_BF16, 1, out, 0);
    fsdp2_tensor_t *tgw = wrap(gw, FSDP2_F32, 2, out, in), *tgb = wrap(gb, FSDP2_F32, 1, out, 0);
    NN_OK(fsdp2_nn_linear_backward(x, dy, rows, tw16, dx16, tgw16, tgb16, &ws));
    NN_OK(fsdp2_nn_linear_backward(x, dy, rows, twr, dx32, tgw, tgb, test_ws()));
    assert_close_f32("bf16 linear dx", dx16, dx32, rows * in, 1e-6);
    for (int64_t i = 0; i < out * in; i++) {
        float got = fsdp2_bf16_to_f32(gw16[i]), want = gw[i];
        if (!(fabsf(got - want) <= fabsf(want) * 0x1.0p-8f + 1e-6f))
            ck_abort_msg("bf16 dweight[%lld] = %.9g, f32 %.9g", (long long)i, got, want);
    }
    for (int64_t i = 0; i < out; i++)
        ck_assert_uint_eq(gb16[i], fsdp2_f32_to_bf16(gb[i]));

    /* too small a workspace: refused with the bytes, nothing written */
    fsdp2_nn_workspace_t small = {ws.data, bytes - 1};
    memset(y16, 0, sizeof(float) * (size_t)(rows * out));
    ck_assert_int_eq(fsdp2_nn_linear_forward(x, rows, tw16, tb16, y16, &small),
                     FSDP2_ERR_INVALID_ARGUMENT);
    char want_msg[64];
    snprintf(want_msg, sizeof(want_msg), "%zu bytes", bytes);
    ck_assert_msg(strstr(fsdp2_last_error(), want_msg), "message: %s", fsdp2_last_error());
    for (int64_t i = 0; i < rows * out; i++)
        ck_assert(y16[i] == 0.0f);

    fsdp2_tensor_release(tw16), fsdp2_tensor_release(tb16), fsdp2_tensor_release(twr);
    fsdp2_tensor_release(tbr), fsdp2_tensor_release(tgw16), fsdp2_tensor_release(tgb16);
    fsdp2_tensor_release(tgw), fsdp2_tensor_release(tgb);
    workspace_free(&ws);
    free(x), free(w), free(b), free(dy), free(w16), free(b16), free(wr), free(br), free(y16);
    free(y32), free(gw16), free(gb16), free(gw), free(gb), free(dx16), free(dx32);
}
END_TEST

/* The bf16 linear against a float64 loop on the rounded weights, for shapes whose
 * conversion blocks differ: rows of W (in <= out, the last block partial), columns of W
 * over the whole reduction (in > out), and 64 columns of 4096 rows (out > 4096), each
 * with odd sizes. dx adds to what it held; the bf16 weight gradient (from zero) is the
 * float64 gradient rounded once, within one bf16 step. */
START_TEST(bf16_linear_matches_a_float64_loop_for_every_block_layout)
{
    const int64_t shapes[][3] = {{5, 333, 1001}, {4, 1000, 301}, {3, 4133, 4099}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int64_t rows = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
        size_t bytes;
        NN_OK(fsdp2_nn_linear_workspace_bytes(in, out, &bytes));
        ck_assert_uint_lt(bytes, 3u << 20);
        fsdp2_nn_workspace_t ws = workspace_new(bytes);
        float *x = random_f32(rows * in, -1, 1), *w = random_f32(out * in, -0.1f, 0.1f);
        float *b = random_f32(out, -1, 1), *dy = random_f32(rows * out, -1, 1);
        float *dx = random_f32(rows * in, -1, 1), *y = f32_array(rows * out);
        uint16_t *w16 = to_bf16(w, out * in), *b16 = to_bf16(b, out);
        uint16_t *gw16 = calloc((size_t)(out * in), 2), *gb16 = calloc((size_t)out, 2);
        float *wr = from_bf16(w16, out * in), *br = from_bf16(b16, out);
        double *want_y = calloc((size_t)(rows * out), sizeof(double));
        double *want_dx = as_f64(dx, rows * in), *want_gw = calloc((size_t)(out * in), 8);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t o = 0; o < out; o++) {
                double sum = br[o];
                for (int64_t i = 0; i < in; i++) {
                    sum += (double)x[r * in + i] * wr[o * in + i];
                    want_dx[r * in + i] += (double)dy[r * out + o] * wr[o * in + i];
                    want_gw[o * in + i] += (double)dy[r * out + o] * x[r * in + i];
                }
                want_y[r * out + o] = sum;
            }
        fsdp2_tensor_t *tw = wrap(w16, FSDP2_BF16, 2, out, in), *tb = wrap(b16, FSDP2_BF16, 1, out, 0);
        fsdp2_tensor_t *tgw = wrap(gw16, FSDP2_BF16, 2, out, in);
        fsdp2_tensor_t *tgb = wrap(gb16, FSDP2_BF16, 1, out, 0);
        NN_OK(fsdp2_nn_linear_forward(x, rows, tw, tb, y, &ws));
        NN_OK(fsdp2_nn_linear_backward(x, dy, rows, tw, dx, tgw, tgb, &ws));
        assert_close("bf16 linear y vs float64", y, want_y, rows * out, 1e-5);
        assert_close("bf16 linear dx vs float64", dx, want_dx, rows * in, 1e-5);
        for (int64_t i = 0; i < out * in; i++) {
            double got = fsdp2_bf16_to_f32(gw16[i]), want = want_gw[i];
            if (!(fabs(got - want) <= fabs(want) * 0x1.0p-8 + 1e-6))
                ck_abort_msg("in %lld out %lld: bf16 dweight[%lld] = %.9g, float64 %.9g",
                             (long long)in, (long long)out, (long long)i, got, want);
        }
        fsdp2_tensor_release(tw), fsdp2_tensor_release(tb), fsdp2_tensor_release(tgw);
        fsdp2_tensor_release(tgb);
        workspace_free(&ws);
        free(x), free(w), free(b), free(dy), free(dx), free(y), free(w16), free(b16);
        free(gw16), free(gb16), free(wr), free(br), free(want_y), free(want_dx), free(want_gw);
    }
}
END_TEST

/* 1000 contributions of 1/1024 to a bf16 row holding 1.0: added one by one in bf16 each
 * would vanish (below half a step of 1.0); summed in f32 first they add 0.9765625. */
START_TEST(bf16_embedding_gradient_sums_repeated_ids_in_f32_first)
{
    enum { N = 1000, DIM = 3, NUM = 4 };
    int32_t *ids = calloc(N, sizeof(int32_t));
    float *dy = f32_array(N * DIM);
    for (int i = 0; i < N; i++) {
        ids[i] = i % 2 ? 2 : 0;
        for (int j = 0; j < DIM; j++)
            dy[i * DIM + j] = 1.0f / 1024;
    }
    ids[7] = 3;
    uint16_t g[NUM * DIM];
    for (int i = 0; i < NUM * DIM; i++)
        g[i] = fsdp2_f32_to_bf16(1.0f);
    size_t bytes;
    NN_OK(fsdp2_nn_embedding_workspace_bytes(N, NUM, DIM, &bytes));
    fsdp2_nn_workspace_t ws = workspace_new(bytes);
    fsdp2_tensor_t *tg = wrap(g, FSDP2_BF16, 2, NUM, DIM);
    NN_OK(fsdp2_nn_embedding_backward(ids, dy, N, tg, &ws));
    /* row 0: 499 ids (one went to row 3); row 2: 500; row 1: none; row 3: one */
    const float want[NUM] = {1.0f + 499.0f / 1024, 1.0f, 1.0f + 500.0f / 1024, 1.0f + 1.0f / 1024};
    for (int r = 0; r < NUM; r++) {
        for (int j = 0; j < DIM; j++) {
            float got = fsdp2_bf16_to_f32(g[r * DIM + j]);
            ck_assert_msg(got == fsdp2_bf16_to_f32(fsdp2_f32_to_bf16(want[r])),
                          "row %d: %.9g where %.9g rounded to bf16 is right", r, got, want[r]);
        }
    }
    fsdp2_tensor_release(tg);
    workspace_free(&ws);
    free(ids), free(dy);
}
END_TEST

START_TEST(bf16_layernorm_equals_f32_on_rounded_parameters)
{
    const int64_t rows = 5, dim = 37;
    float *x = random_f32(rows * dim, -2, 3), *w = random_f32(dim, 0.5f, 1.5f);
    float *b = random_f32(dim, -1, 1), *dy = random_f32(rows * dim, -1, 1);
    uint16_t *w16 = to_bf16(w, dim), *b16 = to_bf16(b, dim);
    float *wr = from_bf16(w16, dim), *br = from_bf16(b16, dim);
    float *y16 = f32_array(rows * dim), *y32 = f32_array(rows * dim), m[5], s[5];
    size_t bytes;
    NN_OK(fsdp2_nn_layernorm_workspace_bytes(dim, &bytes));
    fsdp2_nn_workspace_t ws = workspace_new(bytes);
    fsdp2_tensor_t *a = wrap(w16, FSDP2_BF16, 1, dim, 0), *c = wrap(b16, FSDP2_BF16, 1, dim, 0);
    fsdp2_tensor_t *ar = wrap(wr, FSDP2_F32, 1, dim, 0), *cr = wrap(br, FSDP2_F32, 1, dim, 0);
    NN_OK(fsdp2_nn_layernorm_forward(x, rows, 1e-5f, a, c, y16, m, s, &ws));
    NN_OK(fsdp2_nn_layernorm_forward(x, rows, 1e-5f, ar, cr, y32, m, s, test_ws()));
    assert_close_f32("bf16 layernorm y", y16, y32, rows * dim, 1e-6);
    uint16_t *gw16 = calloc((size_t)dim, 2), *gb16 = calloc((size_t)dim, 2);
    float *gw = f32_array(dim), *gb = f32_array(dim);
    float *dx16 = f32_array(rows * dim), *dx32 = f32_array(rows * dim);
    fsdp2_tensor_t *tgw16 = wrap(gw16, FSDP2_BF16, 1, dim, 0), *tgb16 = wrap(gb16, FSDP2_BF16, 1, dim, 0);
    fsdp2_tensor_t *tgw = wrap(gw, FSDP2_F32, 1, dim, 0), *tgb = wrap(gb, FSDP2_F32, 1, dim, 0);
    NN_OK(fsdp2_nn_layernorm_backward(x, m, s, dy, rows, a, dx16, tgw16, tgb16, &ws));
    NN_OK(fsdp2_nn_layernorm_backward(x, m, s, dy, rows, ar, dx32, tgw, tgb, test_ws()));
    assert_close_f32("bf16 layernorm dx", dx16, dx32, rows * dim, 1e-6);
    for (int64_t i = 0; i < dim; i++) {
        ck_assert_uint_eq(gw16[i], fsdp2_f32_to_bf16(gw[i]));
        ck_assert_uint_eq(gb16[i], fsdp2_f32_to_bf16(gb[i]));
    }
    fsdp2_tensor_release(a), fsdp2_tensor_release(c), fsdp2_tensor_release(ar);
    fsdp2_tensor_release(cr), fsdp2_tensor_release(tgw16), fsdp2_tensor_release(tgb16);
    fsdp2_tensor_release(tgw), fsdp2_tensor_release(tgb);
    workspace_free(&ws);
    free(x), free(w), free(b), free(dy), free(w16), free(b16), free(wr), free(br), free(y16);
    free(y32), free(gw16), free(gb16), free(gw), free(gb), free(dx16), free(dx32);
}
END_TEST

START_TEST(bf16_conv2d_equals_f32_on_rounded_parameters)
{
    const int64_t B = 5, C = 2, H = 7, W = 6, O = 3, K = 3, nx = B * C * H * W;
    const int64_t nw = O * C * K * K, ny = B * O * (H - K + 1) * (W - K + 1);
    float *x = random_f32(nx, -1, 1), *w = random_f32(nw, -1, 1), *b = random_f32(O, -1, 1);
    float *dy = random_f32(ny, -1, 1);
    uint16_t *w16 = to_bf16(w, nw), *b16 = to_bf16(b, O);
    float *wr = from_bf16(w16, nw), *br = from_bf16(b16, O);
    int64_t shape[4] = {O, C, K, K};
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_tensor_t *tw16, *twr, *tgw16, *tgw;
    uint16_t *gw16 = calloc((size_t)nw, 2), *gb16 = calloc((size_t)O, 2);
    float *gw = f32_array(nw), *gb = f32_array(O);
    NN_OK(fsdp2_tensor_from_blob(w16, cpu, FSDP2_BF16, 4, shape, NULL, NULL, &tw16));
    NN_OK(fsdp2_tensor_from_blob(wr, cpu, FSDP2_F32, 4, shape, NULL, NULL, &twr));
    NN_OK(fsdp2_tensor_from_blob(gw16, cpu, FSDP2_BF16, 4, shape, NULL, NULL, &tgw16));
    NN_OK(fsdp2_tensor_from_blob(gw, cpu, FSDP2_F32, 4, shape, NULL, NULL, &tgw));
    fsdp2_tensor_t *tb16 = wrap(b16, FSDP2_BF16, 1, O, 0), *tbr = wrap(br, FSDP2_F32, 1, O, 0);
    fsdp2_tensor_t *tgb16 = wrap(gb16, FSDP2_BF16, 1, O, 0), *tgb = wrap(gb, FSDP2_F32, 1, O, 0);
    size_t bytes;
    NN_OK(fsdp2_nn_conv2d_workspace_bytes(C, H, W, O, K, &bytes));
    fsdp2_nn_workspace_t ws = workspace_new(bytes);
    float *y16 = f32_array(ny), *y32 = f32_array(ny), *dx16 = f32_array(nx), *dx32 = f32_array(nx);
    NN_OK(fsdp2_nn_conv2d_forward(x, B, H, W, tw16, tb16, y16, &ws));
    NN_OK(fsdp2_nn_conv2d_forward(x, B, H, W, twr, tbr, y32, &ws));
    ck_assert_int_eq(memcmp(y16, y32, sizeof(float) * (size_t)ny), 0);
    NN_OK(fsdp2_nn_conv2d_backward(x, dy, B, H, W, tw16, dx16, tgw16, tgb16, &ws));
    NN_OK(fsdp2_nn_conv2d_backward(x, dy, B, H, W, twr, dx32, tgw, tgb, &ws));
    ck_assert_int_eq(memcmp(dx16, dx32, sizeof(float) * (size_t)nx), 0);
    for (int64_t i = 0; i < nw; i++)
        ck_assert_uint_eq(gw16[i], fsdp2_f32_to_bf16(gw[i]));
    for (int64_t i = 0; i < O; i++)
        ck_assert_uint_eq(gb16[i], fsdp2_f32_to_bf16(gb[i]));
    fsdp2_tensor_release(tw16), fsdp2_tensor_release(twr), fsdp2_tensor_release(tgw16);
    fsdp2_tensor_release(tgw), fsdp2_tensor_release(tb16), fsdp2_tensor_release(tbr);
    fsdp2_tensor_release(tgb16), fsdp2_tensor_release(tgb);
    workspace_free(&ws);
    free(x), free(w), free(b), free(dy), free(w16), free(b16), free(wr), free(br), free(gw16);
    free(gb16), free(gw), free(gb), free(y16), free(y32), free(dx16), free(dx32);
}
END_TEST

/* The mask recomputed here from fsdp2_philox4x32 by the rule nn.h states. */
static float mask_of(uint64_t seed, uint64_t index, double p)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t counter[4] = {(uint32_t)(index / 4), (uint32_t)(index / 4 >> 32), 0x64726f70u, 0};
    uint32_t r[4];
    fsdp2_philox4x32(counter, key, r);
    return (double)r[index % 4] * 0x1.0p-32 < p ? 0.0f : (float)(1.0 / (1.0 - p));
}

START_TEST(dropout_is_reproducible_piecewise_and_its_backward_uses_the_same_mask)
{
    enum { N = 40000 };
    const double p = 0.3;
    float *x = random_f32(N, 0.5f, 1.5f), *y = f32_array(N), *z = f32_array(N);
    NN_OK(fsdp2_nn_dropout_forward(x, N, p, 77, 1000, y));
    int64_t dropped = 0;
    for (int64_t i = 0; i < N; i++) {
        float want = x[i] * mask_of(77, 1000 + (uint64_t)i, p);
        if (y[i] != want)
            ck_abort_msg("y[%lld] = %.9g, want %.9g", (long long)i, y[i], want);
        dropped += y[i] == 0.0f;
    }
    ck_assert_msg(fabs((double)dropped / N - p) < 0.01, "dropped %lld of %d", (long long)dropped, N);
    /* in pieces at their offsets: the same values; in place too */
    memcpy(z, x, sizeof(float) * N);
    NN_OK(fsdp2_nn_dropout_forward(z, 13, p, 77, 1000, z));
    NN_OK(fsdp2_nn_dropout_forward(z + 13, N - 13, p, 77, 1013, z + 13));
    ck_assert_int_eq(memcmp(y, z, sizeof(float) * N), 0);
    /* backward: dx += dy * mask */
    float *dx = f32_array(N);
    for (int64_t i = 0; i < N; i++)
        dx[i] = 1.0f;
    NN_OK(fsdp2_nn_dropout_backward(x, N, p, 77, 1000, dx));
    for (int64_t i = 0; i < N; i++)
        ck_assert(dx[i] == 1.0f + y[i]);
    /* another seed: another mask; p = 0: a copy */
    NN_OK(fsdp2_nn_dropout_forward(x, N, p, 78, 1000, z));
    ck_assert_int_ne(memcmp(y, z, sizeof(float) * N), 0);
    NN_OK(fsdp2_nn_dropout_forward(x, N, 0, 78, 0, z));
    ck_assert_int_eq(memcmp(x, z, sizeof(float) * N), 0);
    free(x), free(y), free(z), free(dx);
}
END_TEST

START_TEST(residual_forward_and_backward_fan_out)
{
    float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40}, dy[4] = {1, -1, 2, -2};
    NN_OK(fsdp2_nn_residual_forward(a, b, 4, a));
    ck_assert(a[0] == 11 && a[3] == 44);
    float da[4] = {1, 1, 1, 1}, db[4] = {0};
    NN_OK(fsdp2_nn_residual_backward(dy, 4, da, db));
    ck_assert(da[0] == 2 && da[1] == 0 && db[2] == 2 && db[3] == -2);
    ck_assert_int_eq(fsdp2_nn_residual_backward(dy, 4, dy, NULL), FSDP2_ERR_INVALID_ARGUMENT);
}
END_TEST

/* Zeroing: exactly n elements (several chunks and a partial one, on 1 to 3 threads), -0.0
 * and NaN included; a NULL array with n > 0 and a negative n are refused, n = 0 is not. */
START_TEST(zero_writes_exactly_n_zeros_on_any_thread_count)
{
    const int64_t n = 3 * 16384 + 77;
    float *x = malloc(sizeof(float) * (size_t)(n + 8));
    ck_assert_ptr_nonnull(x);
    for (int threads = 1; threads <= 3; threads++) {
        NN_OK(fsdp2_nn_set_threads(threads));
        for (int64_t i = 0; i < n + 8; i++)
            x[i] = i >= n ? 1.5f : i % 3 == 0 ? -0.0f : i % 3 == 1 ? NAN : 1.5f;
        NN_OK(fsdp2_nn_zero(x, n));
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &x[i], sizeof(bits));
            ck_assert_msg(bits == 0, "threads %d: element %lld is 0x%08x", threads,
                          (long long)i, bits);
        }
        for (int64_t i = n; i < n + 8; i++)
            ck_assert_msg(x[i] == 1.5f, "threads %d: element %lld past n was written",
                          threads, (long long)i);
    }
    ck_assert_int_eq(fsdp2_nn_zero(NULL, 4), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_zero(x, -1), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "-1"));
    NN_OK(fsdp2_nn_zero(NULL, 0));
    free(x);
}
END_TEST

/* The fused residual add + norm gives the bits of the two calls, with sum apart, in place
 * over x, and over delta; rows enough for the threads to split them. */
START_TEST(add_norm_forward_equals_the_residual_add_then_the_norm)
{
    const int64_t rows = 300, dim = 96, n = rows * dim;
    float *x = random_f32(n, -2, 3), *d = random_f32(n, -1, 1), *w = random_f32(dim, 0.5f, 1.5f),
          *b = random_f32(dim, -0.5f, 0.5f);
    float *sum = f32_array(n), *y = f32_array(n), *ref_sum = f32_array(n), *ref_y = f32_array(n);
    float *mean = f32_array(rows), *rstd = f32_array(rows), *ref_mean = f32_array(rows),
          *ref_rstd = f32_array(rows), *xc = f32_array(n), *dc = f32_array(n);
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 1, dim, 0), *tb = wrap(b, FSDP2_F32, 1, dim, 0);
    NN_OK(fsdp2_nn_set_threads(2));
    for (int rms = 0; rms < 2; rms++) {
        NN_OK(fsdp2_nn_residual_forward(x, d, n, ref_sum));
        if (rms)
            NN_OK(fsdp2_nn_rmsnorm_forward(ref_sum, rows, 1e-6f, tw, ref_y, ref_rstd, test_ws()));
        else
            NN_OK(fsdp2_nn_layernorm_forward(ref_sum, rows, 1e-5f, tw, tb, ref_y, ref_mean,
                                             ref_rstd, test_ws()));
        for (int place = 0; place < 3; place++) { /* sum apart, over x, over delta */
            memcpy(xc, x, sizeof(float) * (size_t)n);
            memcpy(dc, d, sizeof(float) * (size_t)n);
            float *out = place == 0 ? sum : place == 1 ? xc : dc;
            if (rms)
                NN_OK(fsdp2_nn_add_rmsnorm_forward(xc, dc, rows, 1e-6f, tw, out, y, rstd,
                                                   test_ws()));
            else
                NN_OK(fsdp2_nn_add_layernorm_forward(xc, dc, rows, 1e-5f, tw, tb, out, y, mean,
                                                     rstd, test_ws()));
            ck_assert_msg(memcmp(out, ref_sum, sizeof(float) * (size_t)n) == 0,
                          "%s, place %d: sum differs", rms ? "rmsnorm" : "layernorm", place);
            ck_assert_msg(memcmp(y, ref_y, sizeof(float) * (size_t)n) == 0,
                          "%s, place %d: y differs", rms ? "rmsnorm" : "layernorm", place);
            ck_assert(memcmp(rstd, ref_rstd, sizeof(float) * (size_t)rows) == 0);
            ck_assert(rms || memcmp(mean, ref_mean, sizeof(float) * (size_t)rows) == 0);
        }
    }
    ck_assert_int_eq(fsdp2_nn_add_layernorm_forward(x, NULL, rows, 1e-5f, tw, tb, sum, y, mean,
                                                    rstd, test_ws()),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_add_rmsnorm_forward(x, d, rows, 1e-6f, tw, y, y, rstd, test_ws()),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "y aliases sum") != NULL, "%s", fsdp2_last_error());
    fsdp2_tensor_release(tw);
    fsdp2_tensor_release(tb);
    float *all[] = {x, d, w, b, sum, y, ref_sum, ref_y, mean, rstd, ref_mean, ref_rstd, xc, dc};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        free(all[i]);
}
END_TEST

START_TEST(bf16_rmsnorm_equals_f32_on_rounded_weights_and_its_backward_adds)
{
    const int64_t rows = 5, dim = 37;
    float *x = random_f32(rows * dim, -2, 3), *w = random_f32(dim, 0.5f, 1.5f);
    float *dy = random_f32(rows * dim, -1, 1);
    uint16_t *w16 = to_bf16(w, dim);
    float *wr = from_bf16(w16, dim), *y16 = f32_array(rows * dim), *y32 = f32_array(rows * dim);
    float s16[5], s32[5];
    size_t bytes;
    NN_OK(fsdp2_nn_rmsnorm_workspace_bytes(dim, &bytes));
    fsdp2_nn_workspace_t ws = workspace_new(bytes);
    fsdp2_tensor_t *a = wrap(w16, FSDP2_BF16, 1, dim, 0), *ar = wrap(wr, FSDP2_F32, 1, dim, 0);
    NN_OK(fsdp2_nn_rmsnorm_forward(x, rows, 1e-6f, a, y16, s16, &ws));
    NN_OK(fsdp2_nn_rmsnorm_forward(x, rows, 1e-6f, ar, y32, s32, test_ws()));
    assert_close_f32("bf16 rmsnorm y", y16, y32, rows * dim, 0);
    /* the gradients land on buffers holding 1: the backward adds */
    uint16_t *gw16 = calloc((size_t)dim, 2);
    float *gw = f32_array(dim), *dx16 = f32_array(rows * dim), *dx32 = f32_array(rows * dim);
    for (int64_t i = 0; i < dim; i++)
        gw16[i] = fsdp2_f32_to_bf16(1.0f), gw[i] = 1.0f;
    for (int64_t i = 0; i < rows * dim; i++)
        dx16[i] = dx32[i] = 1.0f;
    fsdp2_tensor_t *tgw16 = wrap(gw16, FSDP2_BF16, 1, dim, 0), *tgw = wrap(gw, FSDP2_F32, 1, dim, 0);
    NN_OK(fsdp2_nn_rmsnorm_backward(x, s16, dy, rows, a, dx16, tgw16, &ws));
    NN_OK(fsdp2_nn_rmsnorm_backward(x, s32, dy, rows, ar, dx32, tgw, test_ws()));
    assert_close_f32("bf16 rmsnorm dx", dx16, dx32, rows * dim, 0);
    float *dx0 = f32_array(rows * dim);
    NN_OK(fsdp2_nn_rmsnorm_backward(x, s32, dy, rows, ar, dx0, NULL, test_ws()));
    for (int64_t i = 0; i < rows * dim; i++)
        ck_assert_float_eq(dx32[i], 1.0f + dx0[i]);
    for (int64_t i = 0; i < dim; i++) /* 1 + the sum, rounded once */
        ck_assert_uint_eq(gw16[i], fsdp2_f32_to_bf16(gw[i]));
    fsdp2_tensor_release(a), fsdp2_tensor_release(ar), fsdp2_tensor_release(tgw16);
    fsdp2_tensor_release(tgw);
    workspace_free(&ws);
    free(x), free(w), free(dy), free(w16), free(wr), free(y16), free(y32), free(gw16), free(gw);
    free(dx16), free(dx32), free(dx0);
}
END_TEST

START_TEST(gqa_attention_with_one_group_per_head_equals_the_fused_attention)
{
    /* kv_heads = heads: the same numbers as GPT-2's fused layout, q, k, v split apart */
    const int64_t B = 2, T = 70, H = 3, D = 4, C = H * D;
    float *qkv = random_f32(B * T * 3 * C, -1.5f, 1.5f), *dy = random_f32(B * T * C, -1, 1);
    float *q = f32_array(B * T * C), *k = f32_array(B * T * C), *v = f32_array(B * T * C);
    for (int64_t r = 0; r < B * T; r++) {
        memcpy(q + r * C, qkv + r * 3 * C, sizeof(float) * C);
        memcpy(k + r * C, qkv + r * 3 * C + C, sizeof(float) * C);
        memcpy(v + r * C, qkv + r * 3 * C + 2 * C, sizeof(float) * C);
    }
    float *y1 = f32_array(B * T * C), *y2 = f32_array(B * T * C);
    float *p1 = f32_array(B * H * T * T), *p2 = f32_array(B * H * T * T);
    float *dqkv = f32_array(B * T * 3 * C), *dq = f32_array(B * T * C), *dk = f32_array(B * T * C);
    float *dv = f32_array(B * T * C);
    size_t bytes;
    NN_OK(fsdp2_nn_attention_workspace_bytes(T, &bytes));
    fsdp2_nn_workspace_t ws = workspace_new(bytes);
    NN_OK(fsdp2_nn_attention_forward(qkv, B, T, C, H, y1, p1));
    NN_OK(fsdp2_nn_gqa_attention_forward(q, k, v, B, T, H, H, D, y2, p2));
    ck_assert_mem_eq(y1, y2, sizeof(float) * (size_t)(B * T * C));
    ck_assert_mem_eq(p1, p2, sizeof(float) * (size_t)(B * H * T * T));
    NN_OK(fsdp2_nn_attention_backward(qkv, p1, dy, B, T, C, H, dqkv, &ws));
    NN_OK(fsdp2_nn_gqa_attention_backward(q, k, v, p2, dy, B, T, H, H, D, dq, dk, dv, &ws));
    for (int64_t r = 0; r < B * T; r++) {
        ck_assert_mem_eq(dq + r * C, dqkv + r * 3 * C, sizeof(float) * C);
        ck_assert_mem_eq(dk + r * C, dqkv + r * 3 * C + C, sizeof(float) * C);
        ck_assert_mem_eq(dv + r * C, dqkv + r * 3 * C + 2 * C, sizeof(float) * C);
    }
    workspace_free(&ws);
    free(qkv), free(dy), free(q), free(k), free(v), free(y1), free(y2), free(p1), free(p2);
    free(dqkv), free(dq), free(dk), free(dv);
}
END_TEST

START_TEST(llama_layers_refuse_bad_input_naming_the_value_and_write_nothing)
{
    float x[64] = {0}, y[64], w[8] = {1, 1, 1, 1, 1, 1, 1, 1}, table[64];
    for (int i = 0; i < 64; i++)
        y[i] = 5.0f;
    fsdp2_tensor_t *w4 = wrap(w, FSDP2_F32, 1, 4, 0), *w5 = wrap(w, FSDP2_F32, 1, 5, 0);
    float rstd[4] = {1, 1, 1, 1};
    ck_assert_int_eq(fsdp2_nn_rmsnorm_forward(x, 2, NAN, w4, y, rstd, test_ws()),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "eps = nan"), "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_rmsnorm_backward(x, rstd, x, 2, w4, y, w5, test_ws()),
                     FSDP2_ERR_SHAPE_MISMATCH);
    ck_assert_msg(strstr(fsdp2_last_error(), "[5]") && strstr(fsdp2_last_error(), "[4]"), "%s",
                  fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_rmsnorm_backward(x, rstd, y, 2, w4, y, NULL, test_ws()),
                     FSDP2_ERR_INVALID_ARGUMENT);
    uint16_t w16[4] = {0};
    fsdp2_tensor_t *b4 = wrap(w16, FSDP2_BF16, 1, 4, 0);
    ck_assert_int_eq(fsdp2_nn_rmsnorm_forward(x, 2, 1e-6f, b4, y, rstd, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "bytes"), "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_swiglu_backward(x, x, y, 8, y, NULL), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_swiglu_forward(x, x, -3, y), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "-3"), "%s", fsdp2_last_error());
    /* rope: an odd head_dim, a sequence past the table, bad scaling bounds */
    fsdp2_nn_rope_config_t cfg = FSDP2_NN_ROPE_CONFIG_INIT;
    ck_assert_int_eq(fsdp2_nn_rope_table(&cfg, 5, 2, table), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "head_dim = 5"), "%s", fsdp2_last_error());
    NN_OK(fsdp2_nn_rope_table(&cfg, 4, 4, table));
    ck_assert_int_eq(fsdp2_nn_rope_forward(x, table, 1, 5, 1, 4, 4, y),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "seq = 5") && strstr(fsdp2_last_error(), "4 positions"),
                  "%s", fsdp2_last_error());
    cfg.theta = -1;
    ck_assert_int_eq(fsdp2_nn_rope_table(&cfg, 4, 4, table), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "theta = -1"), "%s", fsdp2_last_error());
    cfg = (fsdp2_nn_rope_config_t)FSDP2_NN_ROPE_CONFIG_INIT;
    cfg.scaling = FSDP2_NN_ROPE_LLAMA3;
    cfg.factor = 8, cfg.low_freq_factor = 4, cfg.high_freq_factor = 1;
    cfg.original_max_positions = 8192;
    ck_assert_int_eq(fsdp2_nn_rope_table(&cfg, 4, 4, table), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "high_freq_factor = 1"), "%s", fsdp2_last_error());
    cfg.low_freq_factor = 1, cfg.high_freq_factor = 4, cfg.original_max_positions = 0;
    ck_assert_int_eq(fsdp2_nn_rope_table(&cfg, 4, 4, table), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "original_max_position_embeddings = 0"), "%s",
                  fsdp2_last_error());
    /* attention: kv_heads that do not divide heads */
    ck_assert_int_eq(fsdp2_nn_gqa_attention_forward(x, x, x, 1, 2, 6, 4, 2, y, y),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "kv_heads = 4 does not divide heads = 6"), "%s",
                  fsdp2_last_error());
    for (int i = 0; i < 64; i++)
        ck_assert(y[i] == 5.0f);
    fsdp2_tensor_release(w4), fsdp2_tensor_release(w5), fsdp2_tensor_release(b4);
}
END_TEST

/* The LoRA layer against the layers it is made of (a linear, a dropout, two linears
 * without bias), over blocks of rows: in = 8192 gives blocks of 32 rows, so 100 rows are
 * four blocks, the last partial; the dropout's offsets must continue across them. */
START_TEST(lora_equals_its_composition_across_row_blocks_and_with_bf16_base_or_adapters)
{
    const int64_t rows = 100, in = 8192, out = 5, r = 3;
    const double p = 0.25, scale = 0.5;
    float *x = random_f32(rows * in, -1, 1), *w = random_f32(out * in, -0.1f, 0.1f);
    float *b = random_f32(out, -1, 1), *a = random_f32(r * in, -0.1f, 0.1f);
    float *bb = random_f32(out * r, -1, 1), *dy = random_f32(rows * out, -1, 1);
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, out, in), *tb = wrap(b, FSDP2_F32, 1, out, 0);
    fsdp2_tensor_t *ta = wrap(a, FSDP2_F32, 2, r, in), *tbb = wrap(bb, FSDP2_F32, 2, out, r);
    size_t bytes;
    NN_OK(fsdp2_nn_lora_workspace_bytes(in, out, r, &bytes));
    fsdp2_nn_workspace_t ws = workspace_new(bytes);
    /* the composition: y = lin(x) + scale lin_B(lin_A(drop(x))) */
    float *t = f32_array(rows * in), *u = f32_array(rows * r), *v = f32_array(rows * out);
    float *want = f32_array(rows * out), *got = f32_array(rows * out);
    NN_OK(fsdp2_nn_linear_forward(x, rows, tw, tb, want, &ws));
    NN_OK(fsdp2_nn_dropout_forward(x, rows * in, p, 9, 11, t));
    NN_OK(fsdp2_nn_linear_forward(t, rows, ta, NULL, u, &ws));
    NN_OK(fsdp2_nn_linear_forward(u, rows, tbb, NULL, v, &ws));
    for (int64_t i = 0; i < rows * out; i++)
        want[i] += (float)scale * v[i];
    fsdp2_nn_lora_t lora = {.a = ta, .b = tbb, .scale = scale, .dropout = p, .seed = 9,
                            .offset = 11};
    NN_OK(fsdp2_nn_lora_forward(x, rows, tw, tb, &lora, got, &ws));
    assert_close_f32("lora y", got, want, rows * out, 1e-5);
    /* backward of the composition: dv = scale dy; du = dv B; dA = du^T t; dB = dv^T u;
     * dt = du A; dx = dy W + drop'(dt) */
    float *dv = f32_array(rows * out), *du = f32_array(rows * r), *dt = f32_array(rows * in);
    float *dx_want = f32_array(rows * in), *da_want = f32_array(r * in);
    float *db_want = f32_array(out * r);
    for (int64_t i = 0; i < rows * out; i++)
        dv[i] = (float)scale * dy[i];
    fsdp2_tensor_t *tdaw = wrap(da_want, FSDP2_F32, 2, r, in);
    fsdp2_tensor_t *tdbw = wrap(db_want, FSDP2_F32, 2, out, r);
    NN_OK(fsdp2_nn_linear_backward(u, dv, rows, tbb, du, tdbw, NULL, &ws));
    NN_OK(fsdp2_nn_linear_backward(t, du, rows, ta, dt, tdaw, NULL, &ws));
    NN_OK(fsdp2_nn_linear_backward(x, dy, rows, tw, dx_want, NULL, NULL, &ws));
    NN_OK(fsdp2_nn_dropout_backward(dt, rows * in, p, 9, 11, dx_want));
    float *dx = f32_array(rows * in), *da = f32_array(r * in), *db = f32_array(out * r);
    fsdp2_tensor_t *tda = wrap(da, FSDP2_F32, 2, r, in), *tdb = wrap(db, FSDP2_F32, 2, out, r);
    NN_OK(fsdp2_nn_lora_backward(x, dy, rows, tw, &lora, dx, tda, tdb, &ws));
    assert_close_f32("lora dx", dx, dx_want, rows * in, 1e-5);
    assert_close_f32("lora dA", da, da_want, r * in, 1e-5);
    assert_close_f32("lora dB", db, db_want, out * r, 1e-5);

    /* bf16 adapters and gradients: the f32 results on the rounded values, one rounding */
    uint16_t *a16 = to_bf16(a, r * in), *b16 = to_bf16(bb, out * r);
    float *ar = from_bf16(a16, r * in), *br = from_bf16(b16, out * r);
    fsdp2_tensor_t *ta16 = wrap(a16, FSDP2_BF16, 2, r, in), *tb16 = wrap(b16, FSDP2_BF16, 2, out, r);
    fsdp2_tensor_t *tar = wrap(ar, FSDP2_F32, 2, r, in), *tbr = wrap(br, FSDP2_F32, 2, out, r);
    fsdp2_nn_lora_t l16 = lora, lr = lora;
    l16.a = ta16, l16.b = tb16, lr.a = tar, lr.b = tbr;
    NN_OK(fsdp2_nn_lora_forward(x, rows, tw, tb, &l16, got, &ws));
    NN_OK(fsdp2_nn_lora_forward(x, rows, tw, tb, &lr, want, &ws));
    assert_close_f32("bf16 lora y", got, want, rows * out, 0);
    /* a bf16 base: the f32 results on the rounded weight */
    uint16_t *w16 = to_bf16(w, out * in);
    float *wr = from_bf16(w16, out * in);
    fsdp2_tensor_t *tw16 = wrap(w16, FSDP2_BF16, 2, out, in), *twr = wrap(wr, FSDP2_F32, 2, out, in);
    NN_OK(fsdp2_nn_lora_forward(x, rows, tw16, tb, &lora, got, &ws));
    NN_OK(fsdp2_nn_lora_forward(x, rows, twr, tb, &lora, want, &ws));
    assert_close_f32("lora y over a bf16 base", got, want, rows * out, 0);
    float *dx16 = f32_array(rows * in), *dxr = f32_array(rows * in);
    NN_OK(fsdp2_nn_lora_backward(x, dy, rows, tw16, &lora, dx16, NULL, NULL, &ws));
    NN_OK(fsdp2_nn_lora_backward(x, dy, rows, twr, &lora, dxr, NULL, NULL, &ws));
    assert_close_f32("lora dx over a bf16 base", dx16, dxr, rows * in, 1e-6);
    fsdp2_tensor_release(tw16), fsdp2_tensor_release(twr);
    free(w16), free(wr), free(dx16), free(dxr);
    uint16_t *gb16 = calloc((size_t)(out * r), 2);
    float *gb32 = f32_array(out * r);
    fsdp2_tensor_t *tgb16 = wrap(gb16, FSDP2_BF16, 2, out, r);
    fsdp2_tensor_t *tgb32 = wrap(gb32, FSDP2_F32, 2, out, r);
    NN_OK(fsdp2_nn_lora_backward(x, dy, rows, tw, &l16, NULL, NULL, tgb16, &ws));
    NN_OK(fsdp2_nn_lora_backward(x, dy, rows, tw, &lr, NULL, NULL, tgb32, &ws));
    for (int64_t i = 0; i < out * r; i++)
        ck_assert_uint_eq(gb16[i], fsdp2_f32_to_bf16(gb32[i]));
    workspace_free(&ws);
    fsdp2_tensor_t *all[] = {tw, tb, ta, tbb, tdaw, tdbw, tda, tdb, ta16, tb16, tar, tbr, tgb16,
                             tgb32};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        fsdp2_tensor_release(all[i]);
    void *mem[] = {x, w, b, a, bb, dy, t, u, v, want, got, dv, du, dt, dx_want, da_want,
                   db_want, dx, da, db, a16, b16, ar, br, gb16, gb32};
    for (size_t i = 0; i < sizeof(mem) / sizeof(mem[0]); i++)
        free(mem[i]);
}
END_TEST

START_TEST(lora_refuses_a_bad_rank_shape_alias_or_dropout_naming_them)
{
    float w[64] = {0}, x[16] = {0}, y[16], ab[64] = {0}, big[4096];
    for (int i = 0; i < 16; i++)
        y[i] = 5.0f;
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, 4, 3); /* out 4, in 3 */
    fsdp2_tensor_t *a0 = wrap(ab, FSDP2_F32, 2, 0, 3), *a4 = wrap(ab, FSDP2_F32, 2, 4, 3);
    fsdp2_tensor_t *a2 = wrap(ab, FSDP2_F32, 2, 2, 3), *b2 = wrap(ab, FSDP2_F32, 2, 4, 2);
    fsdp2_tensor_t *b3 = wrap(ab, FSDP2_F32, 2, 5, 2);
    fsdp2_nn_workspace_t ws = {big, sizeof(big)};
    fsdp2_nn_lora_t l = {.a = a0, .b = b2, .scale = 1};
    ck_assert_int_eq(fsdp2_nn_lora_forward(x, 2, tw, NULL, &l, y, &ws),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "lora r = 0"), "%s", fsdp2_last_error());
    l.a = a4; /* r 4 on a base [4, 3] (peft allows r past in): B must be [4, 4] */
    ck_assert_int_eq(fsdp2_nn_lora_forward(x, 2, tw, NULL, &l, y, &ws), FSDP2_ERR_SHAPE_MISMATCH);
    ck_assert_msg(strstr(fsdp2_last_error(), "lora B has shape [4,2] where [4,4]"), "%s",
                  fsdp2_last_error());
    l.a = a2, l.b = b2; /* y over x: the base would overwrite the adapter's input */
    ck_assert_int_eq(fsdp2_nn_lora_forward(x, 2, tw, NULL, &l, x, &ws),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "y aliases x"), "%s", fsdp2_last_error());
    l.a = a2, l.b = b3;
    ck_assert_int_eq(fsdp2_nn_lora_forward(x, 2, tw, NULL, &l, y, &ws), FSDP2_ERR_SHAPE_MISMATCH);
    ck_assert_msg(strstr(fsdp2_last_error(), "lora B has shape [5,2] where [4,2]"), "%s",
                  fsdp2_last_error());
    l.b = b2, l.dropout = 1.0;
    ck_assert_int_eq(fsdp2_nn_lora_forward(x, 2, tw, NULL, &l, y, &ws),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "dropout probability 1"), "%s", fsdp2_last_error());
    l.dropout = 0;
    fsdp2_nn_workspace_t small = {big, 64};
    ck_assert_int_eq(fsdp2_nn_lora_forward(x, 2, tw, NULL, &l, y, &small),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "given 64"), "%s", fsdp2_last_error());
    for (int i = 0; i < 16; i++)
        ck_assert(y[i] == 5.0f);
    size_t bytes;
    NN_OK(fsdp2_nn_lora_workspace_bytes(3, 4, 2, &bytes));
    fsdp2_nn_workspace_t enough = workspace_new(bytes);
    NN_OK(fsdp2_nn_lora_forward(x, 2, tw, NULL, &l, y, &enough));
    workspace_free(&enough);
    fsdp2_tensor_release(tw), fsdp2_tensor_release(a0), fsdp2_tensor_release(a4);
    fsdp2_tensor_release(a2), fsdp2_tensor_release(b2), fsdp2_tensor_release(b3);
}
END_TEST

START_TEST(bad_input_is_refused_naming_the_value_and_writes_nothing)
{
    float w[12] = {0}, x[8] = {0}, y[8], big[64];
    for (int i = 0; i < 8; i++)
        y[i] = 5.0f;
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, 3, 4);
    /* a bias of the wrong length */
    fsdp2_tensor_t *tb = wrap(w, FSDP2_F32, 1, 4, 0);
    ck_assert_int_eq(fsdp2_nn_linear_forward(x, 2, tw, tb, y, test_ws()),
                     FSDP2_ERR_SHAPE_MISMATCH);
    ck_assert_msg(strstr(fsdp2_last_error(), "[4]") && strstr(fsdp2_last_error(), "[3]"), "%s",
                  fsdp2_last_error());
    ck_assert(y[0] == 5.0f);
    ck_assert_int_eq(fsdp2_nn_linear_forward(x, -1, tw, NULL, y, test_ws()),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "-1"), "%s", fsdp2_last_error());
    /* a meta parameter and an f16 one */
    fsdp2_device_t meta = FSDP2_DEVICE_META_INIT;
    int64_t shape[2] = {3, 4};
    fsdp2_tensor_t *tm, *th;
    NN_OK(fsdp2_tensor_empty(meta, FSDP2_F32, 2, shape, &tm));
    ck_assert_int_eq(fsdp2_nn_linear_forward(x, 2, tm, NULL, y, test_ws()),
                     FSDP2_ERR_DEVICE_MISMATCH);
    NN_OK(fsdp2_tensor_from_blob(w, (fsdp2_device_t)FSDP2_DEVICE_CPU_INIT, FSDP2_F16, 2, shape,
                                 NULL, NULL, &th));
    ck_assert_int_eq(fsdp2_nn_linear_forward(x, 2, th, NULL, y, test_ws()),
                     FSDP2_ERR_DTYPE_MISMATCH);
    ck_assert_msg(strstr(fsdp2_last_error(), "f16"), "%s", fsdp2_last_error());
    /* an id out of range: named, and the output untouched */
    int32_t ids[3] = {0, 3, 2};
    ck_assert_int_eq(fsdp2_nn_embedding_forward(ids, 3, 0, tw, big), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "id 3 at index 1"), "%s", fsdp2_last_error());
    ck_assert(y[0] == 5.0f);
    /* a layer-norm backward whose dx is dy or x: refused (the parameter gradients read x
     * and dy after dx is written), nothing written */
    {
        float lx[8] = {1, 2, 3, 4, 5, 6, 7, 9}, ldy[8] = {1, 1, 1, 1, 2, 2, 2, 2};
        float lw[4] = {1, 1, 1, 1}, lm[2] = {2.5f, 6.75f}, ls[2] = {1, 1}, gw[4] = {0};
        fsdp2_tensor_t *tlw = wrap(lw, FSDP2_F32, 1, 4, 0), *tgw = wrap(gw, FSDP2_F32, 1, 4, 0);
        for (int alias = 0; alias < 2; alias++) {
            float *dx = alias ? lx : ldy, keep = dx[0];
            ck_assert_int_eq(fsdp2_nn_layernorm_backward(lx, lm, ls, ldy, 2, tlw, dx, tgw, NULL,
                                                         test_ws()),
                             FSDP2_ERR_INVALID_ARGUMENT);
            ck_assert_msg(strstr(fsdp2_last_error(), "dx aliases x or dy"), "%s",
                          fsdp2_last_error());
            ck_assert(dx[0] == keep && gw[0] == 0.0f);
        }
        fsdp2_tensor_release(tlw);
        fsdp2_tensor_release(tgw);
    }
    /* heads that do not divide dim; a workspace too small for attention */
    ck_assert_int_eq(fsdp2_nn_attention_forward(big, 1, 2, 10, 3, big, big),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "dim = 10"), "%s", fsdp2_last_error());
    fsdp2_nn_workspace_t ws = {big, 8};
    ck_assert_int_eq(fsdp2_nn_attention_backward(big, big, big, 1, 4, 2, 1, big, &ws),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "given 8"), "%s", fsdp2_last_error());
    /* a target out of range, a NaN divisor, a bad dropout probability */
    int32_t targets[2] = {1, 4};
    double loss = -1;
    ck_assert_int_eq(cross_entropy(x, targets, 2, 4, -100, 0, &loss, y, NULL, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "target 4 of row 1"), "%s", fsdp2_last_error());
    ck_assert(y[0] == 5.0f && loss == -1);
    ck_assert_int_eq(cross_entropy(x, targets, 1, 4, -100, NAN, &loss, y, NULL, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_dropout_forward(x, 8, 1.0, 1, 0, y), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "probability 1"), "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_dropout_backward(x, 8, 0.5, 1, 0, x), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_relu_backward(x, y, 8, y), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_gelu_backward(x, y, 8, y), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert(y[0] == 5.0f);
    /* a layer norm weight given where a gradient of another length is */
    fsdp2_tensor_t *g5 = wrap(w, FSDP2_F32, 1, 5, 0), *n4 = wrap(w, FSDP2_F32, 1, 4, 0);
    float m[2] = {0}, s[2] = {1, 1};
    ck_assert_int_eq(fsdp2_nn_layernorm_backward(x, m, s, x, 2, n4, y, g5, NULL, test_ws()),
                     FSDP2_ERR_SHAPE_MISMATCH);
    ck_assert(y[0] == 5.0f);
    fsdp2_tensor_release(g5), fsdp2_tensor_release(n4);
    fsdp2_tensor_release(tw), fsdp2_tensor_release(tb), fsdp2_tensor_release(tm);
    fsdp2_tensor_release(th);
}
END_TEST

START_TEST(zero_rows_and_empty_layers_are_accepted_and_write_nothing)
{
    float w[6] = {1, 2, 3, 4, 5, 6};
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, 2, 3);
    NN_OK(fsdp2_nn_linear_forward(NULL, 0, tw, NULL, NULL, test_ws()));
    NN_OK(fsdp2_nn_linear_backward(NULL, NULL, 0, tw, NULL, NULL, NULL, test_ws()));
    NN_OK(fsdp2_nn_attention_forward(NULL, 0, 4, 6, 2, NULL, NULL));
    double loss = -1;
    int64_t counted = -1;
    NN_OK(cross_entropy(NULL, NULL, 0, 5, -100, 0, &loss, NULL, &counted, NULL));
    ck_assert(loss == 0 && counted == 0);
    /* every row ignored: loss 0, gradient zeroed */
    float z[4] = {1, 2, 3, 4}, dz[4] = {9, 9, 9, 9};
    int32_t t[2] = {-100, -100};
    NN_OK(cross_entropy(z, t, 2, 2, -100, 0, &loss, dz, &counted, NULL));
    ck_assert(loss == 0 && counted == 0 && dz[0] == 0 && dz[3] == 0);
    /* in = 0: an empty product, y = the bias (BLAS would refuse its leading dims) */
    float b[2] = {0.5f, -2.0f}, y[6] = {9, 9, 9, 9, 9, 9}, none[1] = {0};
    fsdp2_tensor_t *w0 = wrap(none, FSDP2_F32, 2, 2, 0), *tb = wrap(b, FSDP2_F32, 1, 2, 0);
    NN_OK(fsdp2_nn_linear_forward(none, 3, w0, tb, y, test_ws()));
    ck_assert(y[0] == 0.5f && y[1] == -2.0f && y[4] == 0.5f && y[5] == -2.0f);
    NN_OK(fsdp2_nn_linear_forward(none, 3, w0, NULL, y, test_ws()));
    ck_assert(y[0] == 0.0f && y[5] == 0.0f);
    fsdp2_tensor_release(w0), fsdp2_tensor_release(tb);
    fsdp2_tensor_release(tw);
}
END_TEST

/* Logits of 1000 and more: exp would overflow without the max subtracted. Closed form:
 * two classes a, b with target a: loss = log(1 + exp(b - a)), d/da = p_a - 1, d/db = p_b. */
/* A program written for f32 must not start failing when its parameters become bf16: the
 * layers with a workspace query refuse a missing workspace whatever the dtypes. */
START_TEST(f32_layers_refuse_a_missing_workspace_as_bf16_ones_do)
{
    float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 1, 1, 1, 1, 1}, y[6] = {9, 9, 9, 9, 9, 9};
    float m[2], s[2];
    int32_t ids[2] = {0, 1};
    fsdp2_tensor_t *lin = wrap(w, FSDP2_F32, 2, 2, 3), *norm = wrap(w, FSDP2_F32, 1, 3, 0);
    fsdp2_tensor_t *table = wrap(w, FSDP2_F32, 2, 2, 3);
    ck_assert_int_eq(fsdp2_nn_linear_forward(x, 2, lin, NULL, y, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "linear forward needs a workspace of"), "%s",
                  fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_linear_backward(x, x, 2, lin, y, NULL, NULL, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_layernorm_forward(x, 2, 1e-5f, norm, NULL, y, m, s, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_layernorm_backward(x, m, s, x, 2, norm, y, NULL, NULL, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_rmsnorm_forward(x, 2, 1e-5f, norm, y, s, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_rmsnorm_backward(x, s, x, 2, norm, y, NULL, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_embedding_backward(ids, x, 2, table, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "embedding backward needs a workspace of"), "%s",
                  fsdp2_last_error());
    for (int i = 0; i < 6; i++)
        ck_assert(y[i] == 9 && w[i] == 1);
    fsdp2_tensor_release(lin), fsdp2_tensor_release(norm), fsdp2_tensor_release(table);
}
END_TEST

/* One query for a whole model: the largest of its layers' own queries; a bad shape named
 * by its index. */
START_TEST(the_workspace_of_a_model_is_its_largest_layer_query)
{
    fsdp2_nn_layer_shape_t layers[] = {
        {FSDP2_NN_LINEAR, {768, 2304}},      {FSDP2_NN_LORA, {768, 768, 8}},
        {FSDP2_NN_EMBEDDING, {1024, 50257, 768}}, {FSDP2_NN_LAYERNORM, {768}},
        {FSDP2_NN_RMSNORM, {4096}},          {FSDP2_NN_CONV2D, {1, 28, 28, 8, 5}},
        {FSDP2_NN_ATTENTION, {1024}}};
    size_t want = 0, b[7], all;
    NN_OK(fsdp2_nn_linear_workspace_bytes(768, 2304, &b[0]));
    NN_OK(fsdp2_nn_lora_workspace_bytes(768, 768, 8, &b[1]));
    NN_OK(fsdp2_nn_embedding_workspace_bytes(1024, 50257, 768, &b[2]));
    NN_OK(fsdp2_nn_layernorm_workspace_bytes(768, &b[3]));
    NN_OK(fsdp2_nn_rmsnorm_workspace_bytes(4096, &b[4]));
    NN_OK(fsdp2_nn_conv2d_workspace_bytes(1, 28, 28, 8, 5, &b[5]));
    NN_OK(fsdp2_nn_attention_workspace_bytes(1024, &b[6]));
    for (size_t n = 1; n <= 7; n++) { /* each prefix: the largest query so far */
        want = b[n - 1] > want ? b[n - 1] : want;
        NN_OK(fsdp2_nn_workspace_bytes(layers, n, &all));
        ck_assert_msg(all == want, "%zu layers: %zu bytes, their largest query %zu", n, all,
                      want);
    }
    NN_OK(fsdp2_nn_workspace_bytes(NULL, 0, &all));
    ck_assert_uint_eq(all, 0);
    layers[2].dims[1] = -5;
    ck_assert_int_eq(fsdp2_nn_workspace_bytes(layers, 7, &all), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "layer 2 of 7") &&
                      strstr(fsdp2_last_error(), "num = -5"),
                  "%s", fsdp2_last_error());
    layers[2].dims[1] = 5;
    layers[5].kind = (fsdp2_nn_layer_kind_t)42;
    ck_assert_int_eq(fsdp2_nn_workspace_bytes(layers, 7, &all), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "kind 42"), "%s", fsdp2_last_error());
}
END_TEST

/* The options struct: NULL means the defaults (ignore_index -100, the mean over the
 * counted rows); the size field is checked; the result carries the counts. */
START_TEST(cross_entropy_options_default_and_check_their_size)
{
    float z[6] = {1, 2, 3, 3, 2, 1}, dz[6];
    int32_t t[3] = {2, -100, 1};
    fsdp2_nn_cross_entropy_result_t r = {-1, -1, -1};
    NN_OK(fsdp2_nn_cross_entropy(z, t, 2, 3, NULL, dz, &r));
    /* row 0: target 2 is the arg-max; row 1 (target -100) is skipped */
    double l0 = -log(exp(3.0) / (exp(1.0) + exp(2.0) + exp(3.0)));
    ck_assert_msg(fabs(r.loss - l0) < 1e-6, "loss %.9g, closed form %.9g", r.loss, l0);
    ck_assert(r.counted == 1 && r.correct == 1 && dz[3] == 0 && dz[5] == 0);
    fsdp2_nn_cross_entropy_options_t o = FSDP2_NN_CROSS_ENTROPY_OPTIONS_INIT;
    ck_assert_int_eq(o.ignore_index, -100);
    o.divisor = 4; /* a global count: the sum over this call's rows divided by it */
    NN_OK(fsdp2_nn_cross_entropy(z, t, 2, 3, &o, NULL, &r));
    ck_assert_msg(fabs(r.loss - l0 / 4) < 1e-6, "loss %.9g, want %.9g", r.loss, l0 / 4);
    o.ignore_index = 7; /* now -100 is an ordinary target, outside [0, 3) */
    ck_assert_int_eq(fsdp2_nn_cross_entropy(z, t, 2, 3, &o, NULL, &r),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "target -100 of row 1"), "%s", fsdp2_last_error());
    o.size = 3;
    ck_assert_int_eq(fsdp2_nn_cross_entropy(z, t, 2, 3, &o, NULL, &r),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "cross-entropy options"), "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_cross_entropy(z, t, 2, 3, NULL, NULL, NULL),
                     FSDP2_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(cross_entropy_stays_exact_for_logits_of_1000)
{
    float z[4] = {1000.0f, 1001.0f, 3000.0f, 2990.0f}, dz[4];
    int32_t t[2] = {0, 0};
    double loss;
    NN_OK(cross_entropy(z, t, 2, 2, -100, 0, &loss, dz, NULL, NULL));
    double l0 = log1p(exp(1.0)), l1 = log1p(exp(-10.0));
    ck_assert_msg(fabs(loss - (l0 + l1) / 2) < 1e-6, "loss %.9g, closed form %.9g", loss,
                  (l0 + l1) / 2);
    double p0 = 1 / (1 + exp(1.0)), p1 = 1 / (1 + exp(-10.0));
    ck_assert(fabs(dz[0] - (p0 - 1) / 2) < 1e-6 && fabs(dz[1] - (1 - p0) / 2) < 1e-6);
    ck_assert(fabs(dz[2] - (p1 - 1) / 2) < 1e-6 && fabs(dz[3] - (1 - p1) / 2) < 1e-6);
}
END_TEST

static Suite *nn_semantics_suite(void)
{
    Suite *s = suite_create("nn_semantics");
    TCase *tc = tcase_create("semantics");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, every_backward_adds_to_its_gradients);
    tcase_add_test(tc, bf16_linear_equals_f32_on_rounded_weights_across_blocks);
    tcase_add_test(tc, bf16_linear_matches_a_float64_loop_for_every_block_layout);
    tcase_add_test(tc, bf16_embedding_gradient_sums_repeated_ids_in_f32_first);
    tcase_add_test(tc, bf16_layernorm_equals_f32_on_rounded_parameters);
    tcase_add_test(tc, bf16_conv2d_equals_f32_on_rounded_parameters);
    tcase_add_test(tc, dropout_is_reproducible_piecewise_and_its_backward_uses_the_same_mask);
    tcase_add_test(tc, residual_forward_and_backward_fan_out);
    tcase_add_test(tc, zero_writes_exactly_n_zeros_on_any_thread_count);
    tcase_add_test(tc, add_norm_forward_equals_the_residual_add_then_the_norm);
    tcase_add_test(tc, cross_entropy_stays_exact_for_logits_of_1000);
    tcase_add_test(tc, bad_input_is_refused_naming_the_value_and_writes_nothing);
    tcase_add_test(tc, bf16_rmsnorm_equals_f32_on_rounded_weights_and_its_backward_adds);
    tcase_add_test(tc, gqa_attention_with_one_group_per_head_equals_the_fused_attention);
    tcase_add_test(tc, llama_layers_refuse_bad_input_naming_the_value_and_write_nothing);
    tcase_add_test(tc, lora_equals_its_composition_across_row_blocks_and_with_bf16_base_or_adapters);
    tcase_add_test(tc, lora_refuses_a_bad_rank_shape_alias_or_dropout_naming_them);
    tcase_add_test(tc, zero_rows_and_empty_layers_are_accepted_and_write_nothing);
    tcase_add_test(tc, f32_layers_refuse_a_missing_workspace_as_bf16_ones_do);
    tcase_add_test(tc, the_workspace_of_a_model_is_its_largest_layer_query);
    tcase_add_test(tc, cross_entropy_options_default_and_check_their_size);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(nn_semantics_suite)
