/* Every backward of lib/nn against central finite differences of an f64 reference
 * forward written here (naive loops from the formulas in nn.h), on random shapes with
 * odd sizes and head dims 5 and 7. The reference forward is first checked against the
 * layer's own f32 forward, so the chain is: layer forward == reference, and layer
 * backward == d reference. The scalar differentiated is L = sum(y * r) for a random r
 * (which is then the dy given to the backward); the losses differentiate themselves.
 * Inputs are f32 values, so both sides see the same numbers. */
#include "../core/check_main.h"
#include "../core/test_rng.h"
#include "nn_test_util.h"

#define FWD_TOL 2e-6
#define GRAD_TOL 1e-4
#define FD_H 1e-5

typedef struct gc gc_t;
typedef void (*ref_fn)(const gc_t *g, double *y);

/* One case: up to three differentiated inputs and the shape fields the ops use. */
struct gc {
    double *in[3];
    int64_t n[3];
    int nin;
    int64_t rows, a, b, c, d; /* op-specific sizes */
    const int32_t *ids;
    const float *table; /* the rope table */
    ref_fn forward;
    int64_t ny;
    const double *r;
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform(double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng_next(&rng_state) >> 11) * 0x1.0p-53;
}

/* n f32-representable values in [lo, hi). */
static double *random_values(int64_t n, double lo, double hi)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)uniform(lo, hi);
    return v;
}

static float *to_f32(const double *v, int64_t n)
{
    float *p = f32_array(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)v[i];
    return p;
}

static double weighted_sum(const gc_t *g)
{
    double *y = malloc(sizeof(double) * (size_t)(g->ny > 0 ? g->ny : 1));
    g->forward(g, y);
    double l = 0;
    for (int64_t i = 0; i < g->ny; i++)
        l += y[i] * g->r[i];
    free(y);
    return l;
}

/* Central differences of L with respect to input k. */
static double *finite_differences(gc_t *g, int k)
{
    double *fd = malloc(sizeof(double) * (size_t)(g->n[k] > 0 ? g->n[k] : 1));
    for (int64_t i = 0; i < g->n[k]; i++) {
        double keep = g->in[k][i];
        g->in[k][i] = keep + FD_H;
        double up = weighted_sum(g);
        g->in[k][i] = keep - FD_H;
        double down = weighted_sum(g);
        g->in[k][i] = keep;
        fd[i] = (up - down) / (2 * FD_H);
    }
    return fd;
}

static void check_forward(const gc_t *g, const float *y, const char *what)
{
    double *want = malloc(sizeof(double) * (size_t)(g->ny > 0 ? g->ny : 1));
    g->forward(g, want);
    assert_close(what, y, want, g->ny, FWD_TOL);
    free(want);
}

static void check_grad(gc_t *g, int k, const float *grad, const char *what)
{
    double *fd = finite_differences(g, k);
    assert_close(what, grad, fd, g->n[k], GRAD_TOL);
    free(fd);
}

/* ---- linear: in[0] x [rows, a], in[1] w [b, a], in[2] bias [b] ---- */

static void ref_linear(const gc_t *g, double *y)
{
    for (int64_t r = 0; r < g->rows; r++) {
        for (int64_t o = 0; o < g->b; o++) {
            double s = g->in[2][o];
            for (int64_t i = 0; i < g->a; i++)
                s += g->in[0][r * g->a + i] * g->in[1][o * g->a + i];
            y[r * g->b + o] = s;
        }
    }
}

START_TEST(linear_backward_matches_finite_differences)
{
    const int64_t shapes[][3] = {{3, 1, 1}, {5, 13, 7}, {4, 17, 33}, {1, 9, 2}};
    for (int s = 0; s < 4; s++) {
        int64_t rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        gc_t g = {.rows = rows, .a = in, .b = out, .forward = ref_linear, .nin = 3};
        g.in[0] = random_values(g.n[0] = rows * in, -1, 1);
        g.in[1] = random_values(g.n[1] = out * in, -0.5, 0.5);
        g.in[2] = random_values(g.n[2] = out, -0.2, 0.2);
        double *r = random_values(g.ny = rows * out, -1, 1);
        g.r = r;
        float *x = to_f32(g.in[0], g.n[0]), *w = to_f32(g.in[1], g.n[1]);
        float *b = to_f32(g.in[2], g.n[2]), *dy = to_f32(r, g.ny), *y = f32_array(g.ny);
        float *dx = f32_array(g.n[0]), *dw = f32_array(g.n[1]), *db = f32_array(g.n[2]);
        fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, out, in), *tb = wrap(b, FSDP2_F32, 1, out, 0);
        fsdp2_tensor_t *tdw = wrap(dw, FSDP2_F32, 2, out, in);
        fsdp2_tensor_t *tdb = wrap(db, FSDP2_F32, 1, out, 0);
        NN_OK(fsdp2_nn_linear_forward(x, rows, tw, tb, y, test_ws()));
        check_forward(&g, y, "linear y");
        NN_OK(fsdp2_nn_linear_backward(x, dy, rows, tw, dx, tdw, tdb, test_ws()));
        check_grad(&g, 0, dx, "linear dx");
        check_grad(&g, 1, dw, "linear dweight");
        check_grad(&g, 2, db, "linear dbias");
        fsdp2_tensor_release(tw), fsdp2_tensor_release(tb);
        fsdp2_tensor_release(tdw), fsdp2_tensor_release(tdb);
        free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(r);
        for (int k = 0; k < 3; k++)
            free(g.in[k]);
    }
}
END_TEST

/* ---- layer norm: in[0] x [rows, a], in[1] w [a], in[2] b [a], eps 1e-5 ---- */

static void ref_layernorm(const gc_t *g, double *y)
{
    for (int64_t r = 0; r < g->rows; r++) {
        const double *x = g->in[0] + r * g->a;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < g->a; j++)
            mean += x[j] / (double)g->a;
        for (int64_t j = 0; j < g->a; j++)
            var += (x[j] - mean) * (x[j] - mean) / (double)g->a;
        for (int64_t j = 0; j < g->a; j++)
            y[r * g->a + j] = (x[j] - mean) / sqrt(var + (double)1e-5f) * g->in[1][j] + g->in[2][j];
    }
}

START_TEST(layernorm_backward_matches_finite_differences)
{
    const int64_t shapes[][2] = {{1, 3}, {4, 17}, {3, 33}, {2, 2}};
    for (int s = 0; s < 4; s++) {
        int64_t rows = shapes[s][0], dim = shapes[s][1];
        gc_t g = {.rows = rows, .a = dim, .forward = ref_layernorm, .nin = 3};
        g.in[0] = random_values(g.n[0] = rows * dim, 1, 4); /* a mean far from 0 */
        g.in[1] = random_values(g.n[1] = dim, 0.5, 1.5);
        g.in[2] = random_values(g.n[2] = dim, -0.2, 0.2);
        double *r = random_values(g.ny = rows * dim, -1, 1);
        g.r = r;
        float *x = to_f32(g.in[0], g.n[0]), *w = to_f32(g.in[1], g.n[1]);
        float *b = to_f32(g.in[2], g.n[2]), *dy = to_f32(r, g.ny), *y = f32_array(g.ny);
        float *dx = f32_array(g.n[0]), *dw = f32_array(dim), *db = f32_array(dim);
        float *mean = f32_array(rows), *rstd = f32_array(rows);
        fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 1, dim, 0), *tb = wrap(b, FSDP2_F32, 1, dim, 0);
        fsdp2_tensor_t *tdw = wrap(dw, FSDP2_F32, 1, dim, 0);
        fsdp2_tensor_t *tdb = wrap(db, FSDP2_F32, 1, dim, 0);
        NN_OK(fsdp2_nn_layernorm_forward(x, rows, 1e-5f, tw, tb, y, mean, rstd, test_ws()));
        check_forward(&g, y, "layernorm y");
        NN_OK(fsdp2_nn_layernorm_backward(x, mean, rstd, dy, rows, tw, dx, tdw, tdb, test_ws()));
        check_grad(&g, 0, dx, "layernorm dx");
        check_grad(&g, 1, dw, "layernorm dweight");
        check_grad(&g, 2, db, "layernorm dbias");
        fsdp2_tensor_release(tw), fsdp2_tensor_release(tb);
        fsdp2_tensor_release(tdw), fsdp2_tensor_release(tdb);
        free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(r);
        free(mean), free(rstd);
        for (int k = 0; k < 3; k++)
            free(g.in[k]);
    }
}
END_TEST

/* ---- GELU (tanh): in[0] x [a] ---- */

static void ref_gelu(const gc_t *g, double *y)
{
    for (int64_t i = 0; i < g->a; i++) {
        double x = g->in[0][i];
        y[i] = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}

START_TEST(gelu_backward_matches_finite_differences)
{
    gc_t g = {.a = 301, .forward = ref_gelu, .nin = 1};
    g.in[0] = random_values(g.n[0] = 301, -6, 6);
    double *r = random_values(g.ny = 301, -1, 1);
    g.r = r;
    float *x = to_f32(g.in[0], 301), *dy = to_f32(r, 301), *y = f32_array(301);
    float *dx = f32_array(301);
    NN_OK(fsdp2_nn_gelu_forward(x, 301, y));
    check_forward(&g, y, "gelu y");
    NN_OK(fsdp2_nn_gelu_backward(x, dy, 301, dx));
    check_grad(&g, 0, dx, "gelu dx");
    free(x), free(dy), free(y), free(dx), free(r), free(g.in[0]);
}
END_TEST

/* ---- causal attention: in[0] qkv [a=batch, b=seq, 3 c], c = dim, d = heads ---- */

static void ref_attention(const gc_t *g, double *y)
{
    int64_t B = g->a, T = g->b, C = g->c, H = g->d, D = C / H;
    const double *qkv = g->in[0];
    double *p = malloc(sizeof(double) * (size_t)T);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < T; i++) {
                const double *q = qkv + (b * T + i) * 3 * C + h * D;
                double max = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = qkv + (b * T + j) * 3 * C + C + h * D;
                    double s = 0;
                    for (int64_t e = 0; e < D; e++)
                        s += q[e] * k[e];
                    p[j] = s / sqrt((double)D);
                    max = p[j] > max ? p[j] : max;
                }
                for (int64_t j = 0; j <= i; j++)
                    sum += (p[j] = exp(p[j] - max));
                for (int64_t e = 0; e < D; e++) {
                    double o = 0;
                    for (int64_t j = 0; j <= i; j++)
                        o += p[j] / sum * qkv[(b * T + j) * 3 * C + 2 * C + h * D + e];
                    y[(b * T + i) * C + h * D + e] = o;
                }
            }
        }
    }
    free(p);
}

START_TEST(attention_backward_matches_finite_differences_for_odd_head_dims_and_row_blocks)
{
    /* batch, seq, dim, heads: head dims 4, 5, 7, 1, and 150 positions (query blocks of
     * 64, 64 and 22 rows) */
    const int64_t shapes[][4] = {{1, 1, 4, 1}, {2, 7, 15, 3}, {1, 9, 14, 2}, {2, 4, 3, 3},
                                 {1, 150, 6, 2}};
    for (int s = 0; s < 5; s++) {
        int64_t B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], H = shapes[s][3];
        gc_t g = {.a = B, .b = T, .c = C, .d = H, .forward = ref_attention, .nin = 1};
        g.in[0] = random_values(g.n[0] = B * T * 3 * C, -1.5, 1.5);
        double *r = random_values(g.ny = B * T * C, -1, 1);
        g.r = r;
        float *qkv = to_f32(g.in[0], g.n[0]), *dy = to_f32(r, g.ny), *y = f32_array(g.ny);
        float *probs = f32_array(B * H * T * T), *dqkv = f32_array(g.n[0]);
        size_t bytes;
        NN_OK(fsdp2_nn_attention_workspace_bytes(T, &bytes));
        fsdp2_nn_workspace_t ws = workspace_new(bytes);
        NN_OK(fsdp2_nn_attention_forward(qkv, B, T, C, H, y, probs));
        check_forward(&g, y, "attention y");
        NN_OK(fsdp2_nn_attention_backward(qkv, probs, dy, B, T, C, H, dqkv, &ws));
        check_grad(&g, 0, dqkv, "attention dqkv");
        workspace_free(&ws);
        free(qkv), free(dy), free(y), free(probs), free(dqkv), free(r), free(g.in[0]);
    }
}
END_TEST

/* ---- embedding: in[0] table [a, b], ids [rows] ---- */

static void ref_embedding(const gc_t *g, double *y)
{
    for (int64_t i = 0; i < g->rows; i++)
        for (int64_t j = 0; j < g->b; j++)
            y[i * g->b + j] = g->in[0][(int64_t)g->ids[i] * g->b + j];
}

START_TEST(embedding_backward_matches_finite_differences_with_repeated_ids)
{
    const int32_t ids[] = {4, 0, 4, 6, 4, 1, 0, 3, 6, 4, 2};
    gc_t g = {.rows = 11, .a = 7, .b = 5, .ids = ids, .forward = ref_embedding, .nin = 1};
    g.in[0] = random_values(g.n[0] = 35, -1, 1);
    double *r = random_values(g.ny = 55, -1, 1);
    g.r = r;
    float *w = to_f32(g.in[0], 35), *dy = to_f32(r, 55), *y = f32_array(55), *dw = f32_array(35);
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, 7, 5), *tdw = wrap(dw, FSDP2_F32, 2, 7, 5);
    NN_OK(fsdp2_nn_embedding_forward(ids, 11, 0, tw, y));
    check_forward(&g, y, "embedding y");
    NN_OK(fsdp2_nn_embedding_backward(ids, dy, 11, tdw, test_ws()));
    check_grad(&g, 0, dw, "embedding dweight");
    fsdp2_tensor_release(tw), fsdp2_tensor_release(tdw);
    free(w), free(dy), free(y), free(dw), free(r), free(g.in[0]);
}
END_TEST

/* ---- conv2d: in[0] x [a=batch, c, h, w], in[1] w [o, c, k, k], in[2] b [o] ----
 * sizes: c = channels, d = kernel, rows = o, and h, w packed in b as h * 1000 + w. */

static void ref_conv(const gc_t *g, double *y)
{
    int64_t B = g->a, C = g->c, K = g->d, O = g->rows, H = g->b / 1000, W = g->b % 1000;
    int64_t oh = H - K + 1, ow = W - K + 1;
    for (int64_t s = 0; s < B; s++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double acc = g->in[2][o];
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t ki = 0; ki < K; ki++)
                            for (int64_t kj = 0; kj < K; kj++)
                                acc += g->in[0][((s * C + c) * H + i + ki) * W + j + kj] *
                                       g->in[1][((o * C + c) * K + ki) * K + kj];
                    y[((s * O + o) * oh + i) * ow + j] = acc;
                }
}

START_TEST(conv2d_backward_matches_finite_differences)
{
    /* batch, c, h, w, o, k: a non-square image, k = 1, k = h, and 6 samples (a full chunk of
     * 4 and a partial one) */
    const int64_t shapes[][6] = {{2, 3, 6, 6, 4, 3}, {2, 2, 7, 5, 3, 3}, {3, 4, 5, 6, 2, 1},
                                 {2, 3, 4, 4, 5, 4}, {6, 1, 5, 5, 2, 2}};
    for (int s = 0; s < 5; s++) {
        int64_t B = shapes[s][0], C = shapes[s][1], H = shapes[s][2], W = shapes[s][3];
        int64_t O = shapes[s][4], K = shapes[s][5], ny = B * O * (H - K + 1) * (W - K + 1);
        gc_t g = {.a = B, .b = H * 1000 + W, .c = C, .d = K, .rows = O, .forward = ref_conv,
                  .nin = 3};
        g.in[0] = random_values(g.n[0] = B * C * H * W, -1, 1);
        g.in[1] = random_values(g.n[1] = O * C * K * K, -0.5, 0.5);
        g.in[2] = random_values(g.n[2] = O, -0.2, 0.2);
        double *r = random_values(g.ny = ny, -1, 1);
        g.r = r;
        float *x = to_f32(g.in[0], g.n[0]), *w = to_f32(g.in[1], g.n[1]);
        float *b = to_f32(g.in[2], g.n[2]), *dy = to_f32(r, ny), *y = f32_array(ny);
        float *dx = f32_array(g.n[0]), *dw = f32_array(g.n[1]), *db = f32_array(O);
        int64_t wshape[4] = {O, C, K, K};
        fsdp2_tensor_t *tw, *tdw, *tb = wrap(b, FSDP2_F32, 1, O, 0);
        fsdp2_tensor_t *tdb = wrap(db, FSDP2_F32, 1, O, 0);
        fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
        NN_OK(fsdp2_tensor_from_blob(w, cpu, FSDP2_F32, 4, wshape, NULL, NULL, &tw));
        NN_OK(fsdp2_tensor_from_blob(dw, cpu, FSDP2_F32, 4, wshape, NULL, NULL, &tdw));
        size_t bytes;
        NN_OK(fsdp2_nn_conv2d_workspace_bytes(C, H, W, O, K, &bytes));
        fsdp2_nn_workspace_t ws = workspace_new(bytes);
        NN_OK(fsdp2_nn_conv2d_forward(x, B, H, W, tw, tb, y, &ws));
        check_forward(&g, y, "conv2d y");
        NN_OK(fsdp2_nn_conv2d_backward(x, dy, B, H, W, tw, dx, tdw, tdb, &ws));
        check_grad(&g, 0, dx, "conv2d dx");
        check_grad(&g, 1, dw, "conv2d dweight");
        check_grad(&g, 2, db, "conv2d dbias");
        workspace_free(&ws);
        fsdp2_tensor_release(tw), fsdp2_tensor_release(tb);
        fsdp2_tensor_release(tdw), fsdp2_tensor_release(tdb);
        free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(r);
        for (int k = 0; k < 3; k++)
            free(g.in[k]);
    }
}
END_TEST

/* ---- maxpool2d: in[0] x [a planes, b=h, c=w] ---- */

static void ref_maxpool(const gc_t *g, double *y)
{
    int64_t H = g->b, W = g->c, oh = H / 2, ow = W / 2;
    for (int64_t p = 0; p < g->a; p++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                double m = -INFINITY;
                for (int di = 0; di < 2; di++)
                    for (int dj = 0; dj < 2; dj++) {
                        double v = g->in[0][(p * H + 2 * i + di) * W + 2 * j + dj];
                        m = v > m ? v : m;
                    }
                y[(p * oh + i) * ow + j] = m;
            }
}

/* Inputs are a shuffled ladder 0.01 apart (no ties, and a step of 1e-5 never changes which
 * element wins); w = 7 leaves a last column no window reads. */
START_TEST(maxpool2d_backward_matches_finite_differences_on_inputs_without_ties)
{
    const int64_t P = 6, H = 6, W = 7, n = P * H * W, ny = P * 3 * 3;
    gc_t g = {.a = P, .b = H, .c = W, .forward = ref_maxpool, .nin = 1};
    g.in[0] = malloc(sizeof(double) * n);
    g.n[0] = n;
    for (int64_t i = 0; i < n; i++)
        g.in[0][i] = (float)(0.01 * (double)i - 1.0);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(rng_next(&rng_state) % (uint64_t)(i + 1));
        double t = g.in[0][i];
        g.in[0][i] = g.in[0][j];
        g.in[0][j] = t;
    }
    double *r = random_values(g.ny = ny, -1, 1);
    g.r = r;
    float *x = to_f32(g.in[0], n), *dy = to_f32(r, ny), *y = f32_array(ny), *dx = f32_array(n);
    int32_t *arg = calloc((size_t)ny, sizeof(int32_t));
    NN_OK(fsdp2_nn_maxpool2d_forward(x, P, H, W, y, arg));
    check_forward(&g, y, "maxpool y");
    for (int64_t i = 0; i < ny; i++) /* the index names the maximum */
        ck_assert(x[(i / 9) * H * W + arg[i]] == y[i]);
    NN_OK(fsdp2_nn_maxpool2d_backward(dy, arg, P, H, W, dx));
    check_grad(&g, 0, dx, "maxpool dx");
    free(x), free(dy), free(y), free(dx), free(arg), free(r), free(g.in[0]);
}
END_TEST

/* ---- losses: the scalar itself is differentiated (r = [1]) ---- */

static void ref_cross_entropy(const gc_t *g, double *y)
{
    double sum = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < g->rows; r++) {
        if (g->ids[r] == -1)
            continue;
        const double *z = g->in[0] + r * g->a;
        double s = 0;
        for (int64_t j = 0; j < g->a; j++)
            s += exp(z[j]);
        sum += log(s) - z[g->ids[r]];
        count++;
    }
    y[0] = sum / (g->c > 0 ? (double)g->c : (double)count);
}

static void ref_mse(const gc_t *g, double *y)
{
    double s = 0;
    for (int64_t i = 0; i < g->a; i++)
        s += (g->in[0][i] - g->in[1][i]) * (g->in[0][i] - g->in[1][i]);
    y[0] = s / (double)g->a;
}

START_TEST(cross_entropy_and_mse_gradients_match_finite_differences)
{
    const double one = 1;
    const int32_t targets[] = {3, -1, 0, 8, 8, 2, -1};
    for (int divisor = 0; divisor <= 16; divisor += 16) { /* the mean, then a fixed divisor */
        gc_t g = {.rows = 7, .a = 9, .c = divisor, .ids = targets, .ny = 1, .r = &one, .nin = 1,
                  .forward = ref_cross_entropy};
        g.in[0] = random_values(g.n[0] = 63, -3, 3);
        float *z = to_f32(g.in[0], 63), *dz = f32_array(63);
        double loss, want;
        int64_t counted;
        NN_OK(cross_entropy(z, targets, 7, 9, -1, divisor, &loss, dz, &counted, NULL));
        ck_assert_int_eq(counted, 5);
        ref_cross_entropy(&g, &want);
        ck_assert_msg(fabs(loss - want) < 1e-6 * fabs(want), "loss %.9g, reference %.9g", loss,
                      want);
        check_grad(&g, 0, dz, "cross-entropy dlogits");
        free(z), free(dz), free(g.in[0]);
    }
    gc_t g = {.a = 13, .ny = 1, .r = &one, .nin = 2, .forward = ref_mse};
    g.in[0] = random_values(g.n[0] = 13, -2, 2);
    g.in[1] = random_values(g.n[1] = 13, -2, 2);
    float *p = to_f32(g.in[0], 13), *t = to_f32(g.in[1], 13), *dp = f32_array(13);
    double loss, want;
    NN_OK(fsdp2_nn_mse(p, t, 13, &loss, dp));
    ref_mse(&g, &want);
    ck_assert_msg(fabs(loss - want) < 1e-9, "mse %.12g, reference %.12g", loss, want);
    check_grad(&g, 0, dp, "mse dpred");
    free(p), free(t), free(dp), free(g.in[0]), free(g.in[1]);
}
END_TEST

/* ---- RMSNorm: in[0] x [rows, a], in[1] w [a], eps 1e-6 ---- */

static void ref_rmsnorm(const gc_t *g, double *y)
{
    for (int64_t r = 0; r < g->rows; r++) {
        const double *x = g->in[0] + r * g->a;
        double ms = 0;
        for (int64_t j = 0; j < g->a; j++)
            ms += x[j] * x[j] / (double)g->a;
        for (int64_t j = 0; j < g->a; j++)
            y[r * g->a + j] = x[j] / sqrt(ms + (double)1e-6f) * g->in[1][j];
    }
}

START_TEST(rmsnorm_backward_matches_finite_differences)
{
    const int64_t shapes[][2] = {{1, 3}, {4, 17}, {3, 64}, {2, 1}};
    for (int s = 0; s < 4; s++) {
        int64_t rows = shapes[s][0], dim = shapes[s][1];
        gc_t g = {.rows = rows, .a = dim, .forward = ref_rmsnorm, .nin = 2};
        g.in[0] = random_values(g.n[0] = rows * dim, -2, 2);
        g.in[1] = random_values(g.n[1] = dim, 0.5, 1.5);
        double *r = random_values(g.ny = rows * dim, -1, 1);
        g.r = r;
        float *x = to_f32(g.in[0], g.n[0]), *w = to_f32(g.in[1], g.n[1]);
        float *dy = to_f32(r, g.ny), *y = f32_array(g.ny), *dx = f32_array(g.n[0]);
        float *dw = f32_array(dim), *rstd = f32_array(rows);
        fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 1, dim, 0), *tdw = wrap(dw, FSDP2_F32, 1, dim, 0);
        NN_OK(fsdp2_nn_rmsnorm_forward(x, rows, 1e-6f, tw, y, rstd, test_ws()));
        check_forward(&g, y, "rmsnorm y");
        NN_OK(fsdp2_nn_rmsnorm_backward(x, rstd, dy, rows, tw, dx, tdw, test_ws()));
        check_grad(&g, 0, dx, "rmsnorm dx");
        check_grad(&g, 1, dw, "rmsnorm dweight");
        fsdp2_tensor_release(tw), fsdp2_tensor_release(tdw);
        free(x), free(w), free(dy), free(y), free(dx), free(dw), free(rstd), free(r);
        free(g.in[0]), free(g.in[1]);
    }
}
END_TEST

/* ---- SwiGLU's gate: in[0] gate [a], in[1] up [a] ---- */

static void ref_swiglu(const gc_t *g, double *y)
{
    for (int64_t i = 0; i < g->a; i++) {
        double x = g->in[0][i];
        y[i] = x / (1 + exp(-x)) * g->in[1][i];
    }
}

START_TEST(swiglu_backward_matches_finite_differences)
{
    gc_t g = {.a = 203, .forward = ref_swiglu, .nin = 2};
    g.in[0] = random_values(g.n[0] = 203, -9, 9);
    g.in[1] = random_values(g.n[1] = 203, -2, 2);
    double *r = random_values(g.ny = 203, -1, 1);
    g.r = r;
    float *gate = to_f32(g.in[0], 203), *up = to_f32(g.in[1], 203), *dy = to_f32(r, 203);
    float *y = f32_array(203), *dgate = f32_array(203), *dup = f32_array(203);
    NN_OK(fsdp2_nn_swiglu_forward(gate, up, 203, y));
    check_forward(&g, y, "swiglu y");
    NN_OK(fsdp2_nn_swiglu_backward(gate, up, dy, 203, dgate, dup));
    check_grad(&g, 0, dgate, "swiglu dgate");
    check_grad(&g, 1, dup, "swiglu dup");
    free(gate), free(up), free(dy), free(y), free(dgate), free(dup), free(r);
    free(g.in[0]), free(g.in[1]);
}
END_TEST

/* ---- rotary embeddings: in[0] x [a=batch, b=seq, c=heads * d], d = head_dim; the
 * angles come from the table (f32), the rotation is the reference's ---- */

static void ref_rope(const gc_t *g, double *y)
{
    int64_t half = g->d / 2;
    for (int64_t r = 0; r < g->a * g->b; r++) {
        const float *cs = g->table + (r % g->b) * g->d, *sn = cs + half;
        for (int64_t h = 0; h < g->c; h++) {
            const double *x = g->in[0] + (r * g->c + h) * g->d;
            double *o = y + (r * g->c + h) * g->d;
            for (int64_t i = 0; i < half; i++) {
                o[i] = x[i] * cs[i] - x[i + half] * sn[i];
                o[i + half] = x[i + half] * cs[i] + x[i] * sn[i];
            }
        }
    }
}

START_TEST(rope_backward_matches_finite_differences_also_in_place)
{
    const int64_t B = 2, T = 9, H = 3, D = 8, n = B * T * H * D;
    fsdp2_nn_rope_config_t cfg = FSDP2_NN_ROPE_CONFIG_INIT;
    float *table = f32_array(16 * D);
    NN_OK(fsdp2_nn_rope_table(&cfg, D, 16, table));
    gc_t g = {.a = B, .b = T, .c = H, .d = D, .table = table, .forward = ref_rope, .nin = 1};
    g.in[0] = random_values(g.n[0] = n, -2, 2);
    double *r = random_values(g.ny = n, -1, 1);
    g.r = r;
    float *x = to_f32(g.in[0], n), *dy = to_f32(r, n), *y = f32_array(n), *dx = f32_array(n);
    NN_OK(fsdp2_nn_rope_forward(x, table, B, T, H, D, 16, y));
    check_forward(&g, y, "rope y");
    NN_OK(fsdp2_nn_rope_backward(dy, table, B, T, H, D, 16, dx));
    check_grad(&g, 0, dx, "rope dx");
    /* in place: the forward over x itself, the backward over dy itself */
    NN_OK(fsdp2_nn_rope_forward(x, table, B, T, H, D, 16, x));
    check_forward(&g, x, "rope y in place");
    NN_OK(fsdp2_nn_rope_backward(dy, table, B, T, H, D, 16, dy));
    check_grad(&g, 0, dy, "rope dx in place");
    free(x), free(dy), free(y), free(dx), free(r), free(g.in[0]), free(table);
}
END_TEST

/* ---- grouped-query attention: in[0] q [a=batch, b=seq, c=heads * rows], in[1] k and
 * in[2] v [batch, seq, d=kv_heads * rows], rows = head_dim ---- */

static void ref_gqa(const gc_t *g, double *y)
{
    int64_t B = g->a, T = g->b, H = g->c, KV = g->d, D = g->rows, group = H / KV;
    double *p = malloc(sizeof(double) * (size_t)T);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            int64_t kh = h / group;
            for (int64_t i = 0; i < T; i++) {
                const double *q = g->in[0] + ((b * T + i) * H + h) * D;
                double max = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = g->in[1] + ((b * T + j) * KV + kh) * D;
                    double s = 0;
                    for (int64_t e = 0; e < D; e++)
                        s += q[e] * k[e];
                    p[j] = s / sqrt((double)D);
                    max = p[j] > max ? p[j] : max;
                }
                for (int64_t j = 0; j <= i; j++)
                    sum += (p[j] = exp(p[j] - max));
                for (int64_t e = 0; e < D; e++) {
                    double o = 0;
                    for (int64_t j = 0; j <= i; j++)
                        o += p[j] / sum * g->in[2][((b * T + j) * KV + kh) * D + e];
                    y[((b * T + i) * H + h) * D + e] = o;
                }
            }
        }
    }
    free(p);
}

START_TEST(gqa_attention_backward_matches_finite_differences_for_groups_and_row_blocks)
{
    /* batch, seq, heads, kv_heads, head_dim: groups of 3, 2, 1 (multi-head) and 4
     * (multi-query), odd head dims, and 70 positions (query blocks of 64 and 6 rows) */
    const int64_t shapes[][5] = {{2, 5, 6, 2, 5}, {1, 8, 4, 2, 7}, {2, 3, 3, 3, 2},
                                 {1, 6, 4, 1, 3}, {1, 70, 2, 1, 4}};
    for (int s = 0; s < 5; s++) {
        int64_t B = shapes[s][0], T = shapes[s][1], H = shapes[s][2], KV = shapes[s][3];
        int64_t D = shapes[s][4];
        gc_t g = {.a = B, .b = T, .c = H, .d = KV, .rows = D, .forward = ref_gqa, .nin = 3};
        g.in[0] = random_values(g.n[0] = B * T * H * D, -1.5, 1.5);
        g.in[1] = random_values(g.n[1] = B * T * KV * D, -1.5, 1.5);
        g.in[2] = random_values(g.n[2] = B * T * KV * D, -1.5, 1.5);
        double *r = random_values(g.ny = B * T * H * D, -1, 1);
        g.r = r;
        float *q = to_f32(g.in[0], g.n[0]), *k = to_f32(g.in[1], g.n[1]);
        float *v = to_f32(g.in[2], g.n[2]), *dy = to_f32(r, g.ny), *y = f32_array(g.ny);
        float *probs = f32_array(B * H * T * T), *dq = f32_array(g.n[0]);
        float *dk = f32_array(g.n[1]), *dv = f32_array(g.n[2]);
        size_t bytes;
        NN_OK(fsdp2_nn_attention_workspace_bytes(T, &bytes));
        fsdp2_nn_workspace_t ws = workspace_new(bytes);
        NN_OK(fsdp2_nn_gqa_attention_forward(q, k, v, B, T, H, KV, D, y, probs));
        check_forward(&g, y, "gqa attention y");
        NN_OK(fsdp2_nn_gqa_attention_backward(q, k, v, probs, dy, B, T, H, KV, D, dq, dk, dv, &ws));
        check_grad(&g, 0, dq, "gqa attention dq");
        check_grad(&g, 1, dk, "gqa attention dk");
        check_grad(&g, 2, dv, "gqa attention dv");
        workspace_free(&ws);
        free(q), free(k), free(v), free(dy), free(y), free(probs), free(dq), free(dk), free(dv);
        free(r);
        for (int i = 0; i < 3; i++)
            free(g.in[i]);
    }
}
END_TEST

/* ---- LoRA linear: in[0] x [rows, a], in[1] A [d, a], in[2] B [b, d]; the frozen base
 * W [b, a], its bias and the dropout mask m [rows, a] (0 or 1 / (1 - p), from the dropout
 * layer) in a lora_case_t: y = x W^T + bias + 2 ((x m) A^T) B^T ---- */

typedef struct lora_case {
    const float *w, *bias, *mask;
} lora_case_t;

static const lora_case_t *lora_now;

static void ref_lora(const gc_t *g, double *y)
{
    const lora_case_t *lc = lora_now;
    int64_t in = g->a, out = g->b, r = g->d;
    double *u = malloc(sizeof(double) * (size_t)r);
    for (int64_t row = 0; row < g->rows; row++) {
        const double *x = g->in[0] + row * in;
        for (int64_t k = 0; k < r; k++) {
            u[k] = 0;
            for (int64_t i = 0; i < in; i++)
                u[k] += x[i] * lc->mask[row * in + i] * g->in[1][k * in + i];
        }
        for (int64_t o = 0; o < out; o++) {
            double s = lc->bias[o];
            for (int64_t i = 0; i < in; i++)
                s += x[i] * lc->w[o * in + i];
            for (int64_t k = 0; k < r; k++)
                s += 2.0 * u[k] * g->in[2][o * r + k];
            y[row * out + o] = s;
        }
    }
    free(u);
}

START_TEST(lora_backward_matches_finite_differences_through_the_dropout_mask)
{
    /* rows, in, out, r, dropout */
    const int64_t shapes[][4] = {{5, 13, 7, 2}, {3, 4, 9, 4}, {1, 6, 6, 1}};
    const double drop[] = {0.3, 0.0, 0.5};
    for (int s = 0; s < 3; s++) {
        int64_t rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2], r = shapes[s][3];
        gc_t g = {.rows = rows, .a = in, .b = out, .d = r, .forward = ref_lora, .nin = 3};
        g.in[0] = random_values(g.n[0] = rows * in, -1, 1);
        g.in[1] = random_values(g.n[1] = r * in, -0.5, 0.5);
        g.in[2] = random_values(g.n[2] = out * r, -0.5, 0.5);
        double *wv = random_values(out * in, -0.5, 0.5), *bv = random_values(out, -0.2, 0.2);
        double *r_ = random_values(g.ny = rows * out, -1, 1);
        g.r = r_;
        float *x = to_f32(g.in[0], g.n[0]), *a = to_f32(g.in[1], g.n[1]);
        float *b = to_f32(g.in[2], g.n[2]), *w = to_f32(wv, out * in), *bias = to_f32(bv, out);
        float *mask = f32_array(rows * in), *dy = to_f32(r_, g.ny), *y = f32_array(g.ny);
        float *dx = f32_array(g.n[0]), *da = f32_array(g.n[1]), *db = f32_array(g.n[2]);
        for (int64_t i = 0; i < rows * in; i++)
            mask[i] = 1.0f;
        NN_OK(fsdp2_nn_dropout_forward(mask, rows * in, drop[s], 77, 5, mask));
        lora_case_t lc = {w, bias, mask};
        lora_now = &lc;
        fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, out, in), *tb = wrap(bias, FSDP2_F32, 1, out, 0);
        fsdp2_tensor_t *ta = wrap(a, FSDP2_F32, 2, r, in), *tbb = wrap(b, FSDP2_F32, 2, out, r);
        fsdp2_tensor_t *tda = wrap(da, FSDP2_F32, 2, r, in), *tdb = wrap(db, FSDP2_F32, 2, out, r);
        fsdp2_nn_lora_t lora = {.a = ta, .b = tbb, .scale = 2.0, .dropout = drop[s], .seed = 77,
                                .offset = 5};
        size_t bytes;
        NN_OK(fsdp2_nn_lora_workspace_bytes(in, out, r, &bytes));
        fsdp2_nn_workspace_t ws = workspace_new(bytes);
        NN_OK(fsdp2_nn_lora_forward(x, rows, tw, tb, &lora, y, &ws));
        check_forward(&g, y, "lora y");
        NN_OK(fsdp2_nn_lora_backward(x, dy, rows, tw, &lora, dx, tda, tdb, &ws));
        check_grad(&g, 0, dx, "lora dx");
        check_grad(&g, 1, da, "lora dA");
        check_grad(&g, 2, db, "lora dB");
        workspace_free(&ws);
        fsdp2_tensor_release(tw), fsdp2_tensor_release(tb), fsdp2_tensor_release(ta);
        fsdp2_tensor_release(tbb), fsdp2_tensor_release(tda), fsdp2_tensor_release(tdb);
        free(x), free(a), free(b), free(w), free(bias), free(mask), free(dy), free(y), free(dx);
        free(da), free(db), free(wv), free(bv), free(r_);
        for (int k = 0; k < 3; k++)
            free(g.in[k]);
    }
}
END_TEST

static Suite *nn_gradcheck_suite(void)
{
    Suite *s = suite_create("nn_gradcheck");
    TCase *tc = tcase_create("finite_differences");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, linear_backward_matches_finite_differences);
    tcase_add_test(tc, layernorm_backward_matches_finite_differences);
    tcase_add_test(tc, gelu_backward_matches_finite_differences);
    tcase_add_test(tc, attention_backward_matches_finite_differences_for_odd_head_dims_and_row_blocks);
    tcase_add_test(tc, embedding_backward_matches_finite_differences_with_repeated_ids);
    tcase_add_test(tc, cross_entropy_and_mse_gradients_match_finite_differences);
    tcase_add_test(tc, conv2d_backward_matches_finite_differences);
    tcase_add_test(tc, maxpool2d_backward_matches_finite_differences_on_inputs_without_ties);
    tcase_add_test(tc, rmsnorm_backward_matches_finite_differences);
    tcase_add_test(tc, swiglu_backward_matches_finite_differences);
    tcase_add_test(tc, rope_backward_matches_finite_differences_also_in_place);
    tcase_add_test(tc, gqa_attention_backward_matches_finite_differences_for_groups_and_row_blocks);
    tcase_add_test(tc, lora_backward_matches_finite_differences_through_the_dropout_mask);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(nn_gradcheck_suite)
