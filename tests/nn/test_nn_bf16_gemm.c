/* GEMMs with bf16 operands (lib/nn/gemm.c's nn_gemm_bf16, FSDP2_NN_BF16_GEMM): the GEMM
 * against a float64 loop on the same bf16 values, every transpose, padded strides, alpha
 * and beta, its emulation's blocks crossed; the linear layer with bf16 weights under
 * FSDP2_NN_BF16_GEMM=on against a float64 reference on bf16-rounded x, dy and W, over
 * shapes of several blocks, f32 and bf16 gradients; off the bits of the f32 path on the
 * rounded weight; auto the bits of on where oneDNN has bf16 kernels and of off elsewhere;
 * a bad value refused naming it.
 *
 * Tolerances: every product of two bf16 values is exact in f32 (8 + 8 significant bits),
 * so what an f32 GEMM adds is the rounding of its k sums, in whatever order: at most
 * (k + 2) 2^-24 times the sum of the products' magnitudes (Higham's gamma_k, the 2 for
 * alpha and the add into C), which is the bound checked per element. Rounding x or dy
 * other than to nearest even, or not at all, moves a result by about 2^-9 of that sum:
 * far outside the bound for the k used here. */
#include "../core/check_main.h"
#include "bf16_test_util.h"

#include <math.h>
#include <pthread.h>

#include "nn/gemm.h"

/* ---- nn_gemm_bf16 ---- */

/* C = alpha op(A) op(B) + beta C in f64 with the bound of the header: want and bound
 * [m, n]. */
static void reference(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                      const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                      double beta, const float *c, int64_t ldc, double *want, double *bound)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double sum = 0, mag = 0;
            for (int64_t p = 0; p < k; p++) {
                double v = bf(ta ? a[p * lda + i] : a[i * lda + p]) *
                           bf(tb ? b[j * ldb + p] : b[p * ldb + j]);
                sum += v;
                mag += fabs(v);
            }
            double cv = beta == 0 ? 0 : beta * c[i * ldc + j];
            want[i * n + j] = alpha * sum + cv;
            bound[i * n + j] = (double)(k + 2) * 0x1p-24 * (fabs(alpha) * mag + fabs(cv));
        }
}

static void check_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, int pad, float alpha,
                       float beta)
{
    int64_t lda = (ta ? m : k) + 3 * pad, ldb = (tb ? k : n) + 5 * pad, ldc = n + 2 * pad;
    uint16_t *a = random_bf16((ta ? k : m) * lda), *b = random_bf16((tb ? n : k) * ldb);
    float *c = random_f32(m * ldc);
    double *want = malloc(sizeof(double) * (size_t)(m * n + 1));
    double *bound = malloc(sizeof(double) * (size_t)(m * n + 1));
    if (beta == 0.0f) /* beta 0 never reads C */
        for (int64_t i = 0; i < m * ldc; i++)
            c[i] = NAN;
    if (pad)
        for (int64_t i = 0; i < m; i++)
            c[i * ldc + n] = NAN; /* never written */
    reference(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, want, bound);
    NN_OK(nn_gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double got = c[i * ldc + j], w = want[i * n + j];
            ck_assert_msg(fabs(got - w) <= bound[i * n + j],
                          "m %lld n %lld k %lld ta %d tb %d pad %d alpha %g beta %g: "
                          "C[%lld,%lld] = %.9g, want %.9g (bound %.3g)",
                          (long long)m, (long long)n, (long long)k, ta, tb, pad, alpha, beta,
                          (long long)i, (long long)j, got, w, bound[i * n + j]);
        }
        if (pad)
            ck_assert(isnan(c[i * ldc + n]));
    }
    free(a);
    free(b);
    free(c);
    free(want);
    free(bound);
}

START_TEST(gemm_bf16_matches_a_float64_loop_for_every_transpose_stride_alpha_and_beta)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {64, 96, 33}, {130, 17, 70}, {3, 200, 1}};
    const float alphas[] = {1.0f, 0.125f}, betas[] = {0.0f, 1.0f, 0.5f};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad < 2; pad++)
                    for (int ai = 0; ai < 2; ai++)
                        for (int bi = 0; bi < 3; bi++)
                            check_gemm(ta, tb, shapes[si][0], shapes[si][1], shapes[si][2], pad,
                                       alphas[ai], betas[bi]);
}
END_TEST

/* Sizes past the emulation's blocks (256 rows of A and B, 512 of the reduction), with
 * odd remainders: every block of C takes all its pieces of k, the first with beta. */
START_TEST(gemm_bf16_over_several_blocks_of_every_dimension)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(ta, tb, 300, 261, 1100, 1, 1.0f, 0.0f);
            check_gemm(ta, tb, 257, 300, 513, 0, 0.5f, 0.75f);
        }
}
END_TEST

START_TEST(gemm_bf16_with_k_or_alpha_zero_scales_c_and_empty_sizes_write_nothing)
{
    uint16_t a[4], b[4];
    for (int i = 0; i < 4; i++)
        a[i] = b[i] = fsdp2_f32_to_bf16((float)(i + 1));
    float c[4] = {1, 2, 3, 4};
    NN_OK(nn_gemm_bf16(0, 0, 2, 2, 0, 1.0f, a, 1, b, 2, 0.5f, c, 2));
    ck_assert(c[0] == 0.5f && c[3] == 2.0f);
    c[0] = NAN;
    NN_OK(nn_gemm_bf16(0, 0, 2, 2, 2, 0.0f, a, 2, b, 2, 0.0f, c, 2));
    ck_assert(c[0] == 0.0f && c[3] == 0.0f);
    c[0] = 7;
    NN_OK(nn_gemm_bf16(0, 0, 0, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2));
    NN_OK(nn_gemm_bf16(0, 0, 2, 0, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2));
    ck_assert(c[0] == 7.0f);
    float bias[2] = {5, 6};
    NN_OK(nn_gemm_bf16_bias(0, 1, 2, 2, 0, NULL, 0, NULL, 0, bias, c, 2));
    ck_assert(c[0] == 5.0f && c[1] == 6.0f && c[2] == 5.0f && c[3] == 6.0f);
    /* [1 2; 3 4] [1 2; 3 4]^T + bias */
    NN_OK(nn_gemm_bf16_bias(0, 1, 2, 2, 2, a, 2, b, 2, bias, c, 2));
    ck_assert(c[0] == 10.0f && c[1] == 17.0f && c[2] == 16.0f && c[3] == 31.0f);
}
END_TEST

START_TEST(gemm_bf16_counts_one_call_and_its_flops)
{
    int64_t m = 48, n = 40, k = 600; /* two pieces of k in the emulation: still one call */
    uint16_t *a = random_bf16(m * k), *b = random_bf16(k * n);
    float *c = f32_array(m * n);
    fsdp2_nn_gemm_stats_t before, after;
    NN_OK(fsdp2_nn_gemm_stats(&before));
    for (int i = 0; i < 3; i++)
        NN_OK(nn_gemm_bf16(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n));
    NN_OK(fsdp2_nn_gemm_stats(&after));
    ck_assert_int_eq(after.calls - before.calls, 3);
    ck_assert(after.flops - before.flops == 3.0 * 2 * m * n * k);
    free(a);
    free(b);
    free(c);
}
END_TEST

static void *probe(void *out)
{
    *(int *)out = nn_gemm_bf16_native();
    return NULL;
}

/* The probe answers the same on every thread at once, and never native without oneDNN. */
START_TEST(native_probe_is_one_answer_for_every_thread)
{
    pthread_t t[4];
    int got[4];
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, probe, &got[i]), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(got[i], nn_gemm_bf16_native());
    if (strcmp(nn_gemm_engine(), "blas") == 0)
        ck_assert_int_eq(nn_gemm_bf16_native(), 0);
}
END_TEST

/* ---- the linear layer ---- */

/* One layer's inputs: x [rows, in], dy [rows, out], W [out, in] bf16, bias f32, and the
 * gradients' starting values (accumulation is part of what is checked). */
typedef struct layer {
    int64_t rows, in, out;
    float *x, *dy, *bias, *dx0, *dw0;
    uint16_t *w, *dw0_bf16;
} layer_t;

typedef struct results {
    float *y, *dx, *dw, *db; /* dw as f32 whatever the gradient's dtype */
} results_t;

static layer_t make_layer(int64_t rows, int64_t in, int64_t out)
{
    layer_t l = {rows, in, out, random_f32(rows * in), random_f32(rows * out), random_f32(out),
                 random_f32(rows * in), random_f32(out * in), random_bf16(out * in),
                 random_bf16(out * in)};
    return l;
}

static void free_layer(layer_t *l)
{
    free(l->x);
    free(l->dy);
    free(l->bias);
    free(l->dx0);
    free(l->dw0);
    free(l->w);
    free(l->dw0_bf16);
}

static void free_results(results_t *r)
{
    free(r->y);
    free(r->dx);
    free(r->dw);
    free(r->db);
}

/* Forward and backward with the weight as bf16 (w32 NULL) or as f32 values w32; the
 * weight gradient of gdtype. */
static results_t run_linear(const layer_t *l, const float *w32, fsdp2_dtype_t gdtype)
{
    int64_t rows = l->rows, in = l->in, out = l->out;
    results_t r = {f32_array(rows * out), f32_array(rows * in), f32_array(out * in),
                   f32_array(out)};
    memcpy(r.dx, l->dx0, sizeof(float) * (size_t)(rows * in));
    uint16_t *dw16 = malloc(sizeof(uint16_t) * (size_t)(out * in));
    memcpy(dw16, l->dw0_bf16, sizeof(uint16_t) * (size_t)(out * in));
    if (gdtype == FSDP2_F32)
        memcpy(r.dw, l->dw0, sizeof(float) * (size_t)(out * in));
    fsdp2_tensor_t *w = w32 ? wrap((void *)w32, FSDP2_F32, 2, out, in)
                            : wrap(l->w, FSDP2_BF16, 2, out, in);
    fsdp2_tensor_t *b = wrap(l->bias, FSDP2_F32, 1, out, 0);
    fsdp2_tensor_t *dw = gdtype == FSDP2_F32 ? wrap(r.dw, FSDP2_F32, 2, out, in)
                                             : wrap(dw16, FSDP2_BF16, 2, out, in);
    fsdp2_tensor_t *db = wrap(r.db, FSDP2_F32, 1, out, 0);
    NN_OK(fsdp2_nn_linear_forward(l->x, rows, w, b, r.y, test_ws()));
    NN_OK(fsdp2_nn_linear_backward(l->x, l->dy, rows, w, r.dx, dw, db, test_ws()));
    if (gdtype != FSDP2_F32)
        for (int64_t i = 0; i < out * in; i++)
            r.dw[i] = fsdp2_bf16_to_f32(dw16[i]);
    fsdp2_tensor_release(w);
    fsdp2_tensor_release(b);
    fsdp2_tensor_release(dw);
    fsdp2_tensor_release(db);
    free(dw16);
    return r;
}

/* The float64 reference on bf16-rounded x, dy and W, and each element's bound. */
typedef struct expected {
    double *y, *y_bound, *dx, *dx_bound, *dw, *dw_bound;
} expected_t;

static expected_t expect(const layer_t *l, fsdp2_dtype_t gdtype)
{
    int64_t rows = l->rows, in = l->in, out = l->out;
    expected_t e;
    double **arrays[] = {&e.y, &e.y_bound, &e.dx, &e.dx_bound, &e.dw, &e.dw_bound};
    int64_t sizes[] = {rows * out, rows * out, rows * in, rows * in, out * in, out * in};
    for (int i = 0; i < 6; i++) {
        *arrays[i] = calloc((size_t)sizes[i], sizeof(double));
        ck_assert_ptr_nonnull(*arrays[i]);
    }
    double *x = malloc(sizeof(double) * (size_t)(rows * in));
    double *dy = malloc(sizeof(double) * (size_t)(rows * out));
    double *w = malloc(sizeof(double) * (size_t)(out * in));
    for (int64_t i = 0; i < rows * in; i++)
        x[i] = rounded(l->x[i]);
    for (int64_t i = 0; i < rows * out; i++)
        dy[i] = rounded(l->dy[i]);
    for (int64_t i = 0; i < out * in; i++)
        w[i] = bf(l->w[i]);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = l->bias[o], mag = fabs(s);
            for (int64_t i = 0; i < in; i++) {
                s += x[r * in + i] * w[o * in + i];
                mag += fabs(x[r * in + i] * w[o * in + i]);
            }
            e.y[r * out + o] = s;
            e.y_bound[r * out + o] = (double)(in + 2) * 0x1p-24 * mag;
        }
    for (int64_t r = 0; r < rows; r++) /* dx = dx0 + dy W */
        for (int64_t i = 0; i < in; i++) {
            double s = l->dx0[r * in + i], mag = fabs(s);
            for (int64_t o = 0; o < out; o++) {
                s += dy[r * out + o] * w[o * in + i];
                mag += fabs(dy[r * out + o] * w[o * in + i]);
            }
            e.dx[r * in + i] = s;
            e.dx_bound[r * in + i] = (double)(out + 2) * 0x1p-24 * mag;
        }
    for (int64_t o = 0; o < out; o++) /* dW = dW0 + dy^T x */
        for (int64_t i = 0; i < in; i++) {
            double s = gdtype == FSDP2_F32 ? l->dw0[o * in + i] : bf(l->dw0_bf16[o * in + i]);
            double mag = fabs(s);
            for (int64_t r = 0; r < rows; r++) {
                s += dy[r * out + o] * x[r * in + i];
                mag += fabs(dy[r * out + o] * x[r * in + i]);
            }
            e.dw[o * in + i] = s;
            e.dw_bound[o * in + i] = (double)(rows + 2) * 0x1p-24 * mag;
        }
    free(x);
    free(dy);
    free(w);
    return e;
}

static void free_expected(expected_t *e)
{
    free(e->y);
    free(e->y_bound);
    free(e->dx);
    free(e->dx_bound);
    free(e->dw);
    free(e->dw_bound);
}

/* rows, in, out: several blocks of rows of x (forward, dW) where rows in passes the
 * workspace's 2^19 bf16 values; of rows of dy (dx) where rows out does; several blocks
 * of W's rows for dW (in 700: blocks of 320 rows); and, at out 600001, dx over pieces
 * of out (a row of dy larger than the region). */
static const int64_t linear_shapes[][3] = {
    {1100, 1031, 37}, {1100, 37, 1031}, {300, 700, 1031}, {3, 1, 600001}, {5, 3, 2}};

START_TEST(linear_on_matches_float64_on_bf16_rounded_operands)
{
    set_mode("on");
    for (size_t si = 0; si < sizeof(linear_shapes) / sizeof(linear_shapes[0]); si++)
        for (int g = 0; g < 2; g++) {
            fsdp2_dtype_t gdtype = g ? FSDP2_BF16 : FSDP2_F32;
            layer_t l = make_layer(linear_shapes[si][0], linear_shapes[si][1],
                                   linear_shapes[si][2]);
            results_t r = run_linear(&l, NULL, gdtype);
            expected_t e = expect(&l, gdtype);
            char what[96];
            snprintf(what, sizeof(what), "rows %lld in %lld out %lld grad %s",
                     (long long)l.rows, (long long)l.in, (long long)l.out,
                     fsdp2_dtype_name(gdtype));
            count_past(what, r.y, e.y, e.y_bound, l.rows * l.out, 0, 1);
            count_past(what, r.dx, e.dx, e.dx_bound, l.rows * l.in, 0, 1);
            count_past(what, r.dw, e.dw, e.dw_bound, l.out * l.in, g, 1);
            free_results(&r);
            free_expected(&e);
            free_layer(&l);
        }
}
END_TEST

/* off: x and dy stay f32, so the results are those of the f32 path on the rounded
 * weight, to the bit where the weight is one block (the same GEMM calls); and they are
 * not within the bound of the bf16-rounded reference, which tells the two modes apart. */
START_TEST(linear_off_gives_the_bits_of_the_f32_path_on_the_rounded_weight)
{
    set_mode("off");
    for (int g = 0; g < 2; g++) {
        fsdp2_dtype_t gdtype = g ? FSDP2_BF16 : FSDP2_F32;
        layer_t l = make_layer(77, 129, 65); /* 129 65 < 2^18: one block */
        float *w32 = f32_array(l.out * l.in);
        for (int64_t i = 0; i < l.out * l.in; i++)
            w32[i] = fsdp2_bf16_to_f32(l.w[i]);
        results_t off = run_linear(&l, NULL, gdtype), f32 = run_linear(&l, w32, gdtype);
        ck_assert(memcmp(off.y, f32.y, sizeof(float) * (size_t)(l.rows * l.out)) == 0);
        ck_assert(memcmp(off.dx, f32.dx, sizeof(float) * (size_t)(l.rows * l.in)) == 0);
        ck_assert(memcmp(off.dw, f32.dw, sizeof(float) * (size_t)(l.out * l.in)) == 0);
        ck_assert(memcmp(off.db, f32.db, sizeof(float) * (size_t)l.out) == 0);
        expected_t e = expect(&l, gdtype);
        ck_assert_int_gt(count_past("off y", off.y, e.y, e.y_bound, l.rows * l.out, 0, 0), 0);
        ck_assert_int_gt(count_past("off dx", off.dx, e.dx, e.dx_bound, l.rows * l.in, 0, 0), 0);
        free_expected(&e);
        free_results(&off);
        free_results(&f32);
        free(w32);
        free_layer(&l);
    }
}
END_TEST

static int same_results(const layer_t *l, const results_t *a, const results_t *b)
{
    return memcmp(a->y, b->y, sizeof(float) * (size_t)(l->rows * l->out)) == 0 &&
           memcmp(a->dx, b->dx, sizeof(float) * (size_t)(l->rows * l->in)) == 0 &&
           memcmp(a->dw, b->dw, sizeof(float) * (size_t)(l->out * l->in)) == 0;
}

/* auto (and unset) is on where oneDNN has bf16 kernels, off elsewhere: the same bits. */
START_TEST(linear_auto_is_on_where_native_and_off_elsewhere)
{
    layer_t l = make_layer(300, 700, 1031);
    set_mode("on");
    results_t on = run_linear(&l, NULL, FSDP2_F32);
    set_mode("off");
    results_t off = run_linear(&l, NULL, FSDP2_F32);
    set_mode("auto");
    results_t automatic = run_linear(&l, NULL, FSDP2_F32);
    set_mode(NULL);
    results_t unset = run_linear(&l, NULL, FSDP2_F32);
    ck_assert(!same_results(&l, &on, &off));
    const results_t *want = nn_gemm_bf16_native() ? &on : &off;
    ck_assert_msg(same_results(&l, &automatic, want), "auto differs from %s",
                  nn_gemm_bf16_native() ? "on (native)" : "off (not native)");
    ck_assert(same_results(&l, &unset, want));
    free_results(&on);
    free_results(&off);
    free_results(&automatic);
    free_results(&unset);
    free_layer(&l);
}
END_TEST

START_TEST(a_bad_value_is_refused_naming_it_and_nothing_is_written)
{
    ck_assert_int_eq(setenv("FSDP2_NN_BF16_GEMM", "fast", 1), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_ERR_INVALID_CONFIG);
    layer_t l = make_layer(4, 3, 2);
    float y[8], dx[12], db[2] = {0, 0};
    for (int i = 0; i < 8; i++)
        y[i] = NAN;
    memset(dx, 0, sizeof(dx));
    fsdp2_tensor_t *w = wrap(l.w, FSDP2_BF16, 2, 2, 3);
    fsdp2_tensor_t *tdb = wrap(db, FSDP2_F32, 1, 2, 0);
    ck_assert_int_eq(fsdp2_nn_linear_forward(l.x, 4, w, NULL, y, test_ws()),
                     FSDP2_ERR_INVALID_CONFIG);
    ck_assert_msg(strstr(fsdp2_last_error(), "FSDP2_NN_BF16_GEMM='fast'") != NULL, "%s",
                  fsdp2_last_error());
    for (int i = 0; i < 8; i++)
        ck_assert(isnan(y[i]));
    ck_assert_int_eq(fsdp2_nn_linear_backward(l.x, l.dy, 4, w, dx, NULL, tdb, test_ws()),
                     FSDP2_ERR_INVALID_CONFIG);
    ck_assert_msg(strstr(fsdp2_last_error(), "'fast'") != NULL, "%s", fsdp2_last_error());
    for (int i = 0; i < 12; i++)
        ck_assert(dx[i] == 0.0f);
    ck_assert(db[0] == 0.0f && db[1] == 0.0f);
    fsdp2_tensor_release(w);
    fsdp2_tensor_release(tdb);
    free_layer(&l);
}
END_TEST

static Suite *nn_bf16_gemm_suite(void)
{
    Suite *s = suite_create("nn_bf16_gemm");
    TCase *tc = tcase_create("bf16_gemm");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, gemm_bf16_matches_a_float64_loop_for_every_transpose_stride_alpha_and_beta);
    tcase_add_test(tc, gemm_bf16_over_several_blocks_of_every_dimension);
    tcase_add_test(tc, gemm_bf16_with_k_or_alpha_zero_scales_c_and_empty_sizes_write_nothing);
    tcase_add_test(tc, gemm_bf16_counts_one_call_and_its_flops);
    tcase_add_test(tc, native_probe_is_one_answer_for_every_thread);
    tcase_add_test(tc, linear_on_matches_float64_on_bf16_rounded_operands);
    tcase_add_test(tc, linear_off_gives_the_bits_of_the_f32_path_on_the_rounded_weight);
    tcase_add_test(tc, linear_auto_is_on_where_native_and_off_elsewhere);
    tcase_add_test(tc, a_bad_value_is_refused_naming_it_and_nothing_is_written);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(nn_bf16_gemm_suite)
