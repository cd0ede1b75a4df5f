/* The layers' GEMM (lib/nn/gemm.c) against a float64 triple loop, every transpose, padded
 * strides, alpha and beta as cblas_sgemm takes them, with and without a bias; one primitive per shape, created once;
 * the BLAS fallback's advice on generic kernels; the layers' results and their parameter
 * gradients' sums over rows the same bits on 1 and 2 threads, and with fewer attention
 * scratches than threads. */
#include "../core/check_main.h"
#include "../core/test_rng.h"
#include "nn_test_util.h"

#include <math.h>

#include "core/env_internal.h"
#include "nn/gemm.h"
#include "nn/nn_common.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float *random_f32(int64_t n)
{
    float *p = f32_array(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)((rng_next(&rng_state) >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
    return p;
}

/* C = alpha op(A) op(B) + beta C in f64, row-major, cblas's meaning of beta 0. */
static void reference(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, double beta,
                      const float *c, int64_t ldc, double *out)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double sum = 0;
            for (int64_t p = 0; p < k; p++)
                sum += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                       (double)(tb ? b[j * ldb + p] : b[p * ldb + j]);
            out[i * n + j] = alpha * sum + (beta == 0 ? 0 : beta * c[i * ldc + j]);
        }
}

START_TEST(sgemm_matches_a_float64_loop_for_every_transpose_stride_alpha_and_beta)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {64, 96, 33}, {130, 17, 70}, {3, 200, 1}};
    const float alphas[] = {1.0f, 0.125f}, betas[] = {0.0f, 1.0f, 0.5f};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad < 2; pad++)
                    for (int ai = 0; ai < 2; ai++)
                        for (int bi = 0; bi < 3; bi++) {
                            int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                            int64_t lda = (ta ? m : k) + 3 * pad, ldb = (tb ? k : n) + 5 * pad;
                            int64_t ldc = n + 2 * pad;
                            float *a = random_f32((ta ? k : m) * lda);
                            float *b = random_f32((tb ? n : k) * ldb);
                            float *c = random_f32(m * ldc);
                            double *want = malloc(sizeof(double) * (size_t)(m * n));
                            if (betas[bi] == 0.0f) /* beta 0 never reads C */
                                for (int64_t i = 0; i < m * ldc; i++)
                                    c[i] = NAN;
                            reference(ta, tb, m, n, k, alphas[ai], a, lda, b, ldb, betas[bi], c,
                                      ldc, want);
                            float pad_value = c[ldc - 1];
                            ck_assert_int_eq(nn_sgemm(ta, tb, m, n, k, alphas[ai], a, lda, b,
                                                      ldb, betas[bi], c, ldc),
                                             FSDP2_SUCCESS);
                            for (int64_t i = 0; i < m; i++)
                                for (int64_t j = 0; j < n; j++) {
                                    double got = c[i * ldc + j], w = want[i * n + j];
                                    ck_assert_msg(fabs(got - w) <= 1e-5 * (1 + fabs(w)),
                                                  "m %lld n %lld k %lld ta %d tb %d pad %d "
                                                  "alpha %g beta %g: C[%lld,%lld] = %.9g, "
                                                  "want %.9g",
                                                  (long long)m, (long long)n, (long long)k, ta,
                                                  tb, pad, alphas[ai], betas[bi], (long long)i,
                                                  (long long)j, got, w);
                                }
                            if (pad) /* the padding columns of C are not written */
                                ck_assert(memcmp(&c[ldc - 1], &pad_value, sizeof(float)) == 0);
                            free(a);
                            free(b);
                            free(c);
                            free(want);
                        }
}
END_TEST

/* C = op(A) op(B) + bias against the float64 loop, with and without a bias, every
 * transpose and padded strides; the bias and its absence are different primitives. */
START_TEST(sgemm_bias_matches_a_float64_loop_with_and_without_a_bias)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {64, 96, 33}, {130, 17, 70}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad < 2; pad++)
                    for (int with = 0; with < 2; with++) {
                        int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                        int64_t lda = (ta ? m : k) + 3 * pad, ldb = (tb ? k : n) + 5 * pad;
                        int64_t ldc = n + 2 * pad;
                        float *a = random_f32((ta ? k : m) * lda);
                        float *b = random_f32((tb ? n : k) * ldb);
                        float *bias = with ? random_f32(n) : NULL;
                        float *c = f32_array(m * ldc);
                        for (int64_t i = 0; i < m * ldc; i++)
                            c[i] = NAN; /* never read */
                        double *want = malloc(sizeof(double) * (size_t)(m * n));
                        reference(ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc, want);
                        for (int64_t i = 0; bias && i < m; i++)
                            for (int64_t j = 0; j < n; j++)
                                want[i * n + j] += bias[j];
                        ck_assert_int_eq(nn_sgemm_bias(ta, tb, m, n, k, a, lda, b, ldb, bias, c,
                                                       ldc),
                                         FSDP2_SUCCESS);
                        for (int64_t i = 0; i < m; i++)
                            for (int64_t j = 0; j < n; j++) {
                                double got = c[i * ldc + j], w = want[i * n + j];
                                ck_assert_msg(fabs(got - w) <= 1e-5 * (1 + fabs(w)),
                                              "m %lld n %lld k %lld ta %d tb %d pad %d bias %d: "
                                              "C[%lld,%lld] = %.9g, want %.9g",
                                              (long long)m, (long long)n, (long long)k, ta, tb,
                                              pad, with, (long long)i, (long long)j, got, w);
                            }
                        if (pad) /* the padding columns of C are not written */
                            ck_assert(isnan(c[ldc - 1]));
                        free(a);
                        free(b);
                        free(bias);
                        free(c);
                        free(want);
                    }
    /* k 0: C is the bias in every row */
    float bias[3] = {1, 2, 3}, c[6];
    ck_assert_int_eq(nn_sgemm_bias(0, 1, 2, 3, 0, NULL, 0, NULL, 0, bias, c, 3), FSDP2_SUCCESS);
    for (int i = 0; i < 6; i++)
        ck_assert(c[i] == bias[i % 3]);
    if (strcmp(nn_gemm_engine(), "onednn") == 0) { /* a bias is part of the shape */
        int64_t m = 9, n = 11, k = 13;
        float *a = random_f32(m * k), *b = random_f32(k * n), *cc = f32_array(m * n);
        float *v = random_f32(n);
        ck_assert_int_eq(nn_sgemm_bias(0, 0, m, n, k, a, k, b, n, NULL, cc, n), FSDP2_SUCCESS);
        int64_t made = nn_gemm_primitives();
        ck_assert_int_eq(nn_sgemm_bias(0, 0, m, n, k, a, k, b, n, v, cc, n), FSDP2_SUCCESS);
        ck_assert_int_eq(nn_gemm_primitives(), made + 1);
        ck_assert_int_eq(nn_sgemm_bias(0, 0, m, n, k, a, k, b, n, v, cc, n), FSDP2_SUCCESS);
        ck_assert_int_eq(nn_gemm_primitives(), made + 1);
        free(a);
        free(b);
        free(cc);
        free(v);
    }
}
END_TEST

START_TEST(sgemm_with_k_or_alpha_zero_scales_c_and_empty_sizes_write_nothing)
{
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, c[4] = {1, 2, 3, 4};
    ck_assert_int_eq(nn_sgemm(0, 0, 2, 2, 0, 1.0f, a, 1, b, 2, 0.5f, c, 2), FSDP2_SUCCESS);
    ck_assert(c[0] == 0.5f && c[3] == 2.0f);
    c[0] = NAN;
    ck_assert_int_eq(nn_sgemm(0, 0, 2, 2, 2, 0.0f, a, 2, b, 2, 0.0f, c, 2), FSDP2_SUCCESS);
    ck_assert(c[0] == 0.0f && c[3] == 0.0f);
    c[0] = 7;
    ck_assert_int_eq(nn_sgemm(0, 0, 0, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2), FSDP2_SUCCESS);
    ck_assert_int_eq(nn_sgemm(0, 0, 2, 0, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2), FSDP2_SUCCESS);
    ck_assert(c[0] == 7.0f);
}
END_TEST

START_TEST(a_shape_creates_one_primitive_and_the_counters_add_its_flops)
{
    int64_t m = 48, n = 40, k = 24;
    float *a = random_f32(m * k), *b = random_f32(k * n), *c = f32_array(m * n);
    fsdp2_nn_gemm_stats_t before, after;
    ck_assert_int_eq(fsdp2_nn_gemm_stats(&before), FSDP2_SUCCESS);
    ck_assert_int_eq(nn_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n), FSDP2_SUCCESS);
    int64_t made = nn_gemm_primitives(), memories = nn_gemm_memory_objects();
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(nn_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n), FSDP2_SUCCESS);
    ck_assert_int_eq(nn_gemm_primitives(), made); /* looked up, not created again */
    ck_assert_int_eq(nn_gemm_memory_objects(), memories); /* nor its memory objects */
    if (strcmp(nn_gemm_engine(), "onednn") == 0) {
        ck_assert_int_ge(made, 1);
        ck_assert_int_ge(memories, 3);
        /* another beta is another primitive */
        ck_assert_int_eq(nn_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 1.0f, c, n), FSDP2_SUCCESS);
        ck_assert_int_eq(nn_gemm_primitives(), made + 1);
    } else {
        ck_assert_int_eq(made, 0);
        ck_assert_int_eq(nn_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 1.0f, c, n), FSDP2_SUCCESS);
    }
    ck_assert_int_eq(fsdp2_nn_gemm_stats(&after), FSDP2_SUCCESS);
    ck_assert_int_eq(after.calls - before.calls, 5);
    ck_assert(after.flops - before.flops == 5.0 * 2 * m * n * k);
    ck_assert(after.seconds > before.seconds);
    ck_assert_str_eq(after.engine, nn_gemm_engine());
    ck_assert_int_eq(fsdp2_nn_gemm_stats(NULL), FSDP2_ERR_INVALID_ARGUMENT);
    free(a);
    free(b);
    free(c);
}
END_TEST

/* Each thread makes its own memory objects of a shape once: the first round makes three
 * (A, B, C) for each thread that ran a GEMM, a second round on the same threads makes
 * none, and each thread's C gets its own product. */
START_TEST(threads_make_their_memory_objects_of_a_shape_once)
{
    enum { SLOTS = 4 };
    int64_t m = 20, n = 12, k = 7;
    float *a = random_f32(SLOTS * m * k), *b = random_f32(k * n), *c = f32_array(SLOTS * m * n);
    double *want = malloc(sizeof(double) * (size_t)(m * n));
    for (int round = 0; round < 2; round++) {
        int64_t before = nn_gemm_memory_objects();
        nn_par_status_t par = {FSDP2_SUCCESS, ""};
        int ran[SLOTS] = {0}; /* by thread index: that thread ran a GEMM */
        ck_assert_int_eq(fsdp2_nn_set_threads(2), FSDP2_SUCCESS);
        FSDP2_OMP("omp parallel for schedule(static, 1)")
        for (int i = 0; i < SLOTS; i++) {
            fsdp2_status_t st = nn_sgemm(0, 0, m, n, k, 1.0f, a + i * m * k, k, b, n, 0.0f,
                                         c + i * m * n, n);
            if (st != FSDP2_SUCCESS)
                nn_par_fail(&par, st);
            ran[nn_thread_index() % SLOTS] = 1; /* (at most 2 threads) */
        }
        ck_assert_int_eq(nn_par_result(&par), FSDP2_SUCCESS);
        int threads = 0;
        for (int t = 0; t < SLOTS; t++)
            threads += ran[t];
        if (round == 1 || strcmp(nn_gemm_engine(), "onednn") != 0)
            ck_assert_int_eq(nn_gemm_memory_objects(), before);
        else
            ck_assert_msg(nn_gemm_memory_objects() == before + 3 * threads,
                          "%lld memory objects made by %d threads, want 3 each",
                          (long long)(nn_gemm_memory_objects() - before), threads);
        for (int i = 0; i < SLOTS; i++) {
            reference(0, 0, m, n, k, 1.0, a + i * m * k, k, b, n, 0.0, NULL, n, want);
            for (int64_t j = 0; j < m * n; j++)
                ck_assert_msg(fabs(c[i * m * n + j] - want[j]) <= 1e-5 * (1 + fabs(want[j])),
                              "round %d slot %d: C[%lld] = %.9g, want %.9g", round, i,
                              (long long)j, c[i * m * n + j], want[j]);
        }
    }
    free(a);
    free(b);
    free(c);
    free(want);
}
END_TEST

START_TEST(blas_advice_names_a_coretype_only_for_generic_kernels_on_avx2_or_avx512)
{
    ck_assert_str_eq(nn_blas_coretype_advice("Prescott", 1, 1), "SkylakeX");
    ck_assert_str_eq(nn_blas_coretype_advice("PRESCOTT", 1, 0), "Haswell");
    ck_assert_str_eq(nn_blas_coretype_advice("Core2", 1, 0), "Haswell");
    ck_assert_ptr_null(nn_blas_coretype_advice("Prescott", 0, 0)); /* an SSE3 CPU: right */
    ck_assert_ptr_null(nn_blas_coretype_advice("Haswell", 1, 0));
    ck_assert_ptr_null(nn_blas_coretype_advice("SkylakeX", 1, 1));
    ck_assert_ptr_null(nn_blas_coretype_advice("Zen", 1, 0));
    ck_assert_ptr_null(nn_blas_coretype_advice("Cooperlake", 1, 1));
    ck_assert_ptr_null(nn_blas_coretype_advice(NULL, 1, 1));
    ck_assert_ptr_null(nn_blas_coretype_advice("a core name longer than any real one", 1, 1));
}
END_TEST

/* The attention forward and backward, the GEMM-heavy layers, on the threads asked for and
 * with ws_bytes of workspace (0: the query's answer). */
static void run_attention(int threads, size_t ws_bytes, const float *qkv, const float *dy,
                          int64_t batch, int64_t seq, int64_t dim, int64_t heads, float *y,
                          float *probs, float *dqkv)
{
    ck_assert_int_eq(fsdp2_nn_set_threads(threads), FSDP2_SUCCESS);
    size_t need;
    ck_assert_int_eq(fsdp2_nn_attention_workspace_bytes(seq, &need), FSDP2_SUCCESS);
    fsdp2_nn_workspace_t ws = {.bytes = ws_bytes ? ws_bytes : need};
    ws.data = aligned_alloc(64, (ws.bytes + 63) / 64 * 64);
    memset(dqkv, 0, sizeof(float) * (size_t)(batch * seq * 3 * dim));
    ck_assert_int_eq(fsdp2_nn_attention_forward(qkv, batch, seq, dim, heads, y, probs),
                     FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_attention_backward(qkv, probs, dy, batch, seq, dim, heads, dqkv,
                                                 &ws),
                     FSDP2_SUCCESS);
    free(ws.data);
}

START_TEST(attention_gives_the_same_bits_on_one_thread_two_threads_and_one_scratch)
{
    const int64_t batch = 3, seq = 70, dim = 32, heads = 4;
    int64_t nqkv = batch * seq * 3 * dim, ny = batch * seq * dim, np = batch * heads * seq * seq;
    float *qkv = random_f32(nqkv), *dy = random_f32(ny);
    float *y[3], *p[3], *d[3];
    for (int i = 0; i < 3; i++) {
        y[i] = f32_array(ny);
        p[i] = f32_array(np);
        d[i] = f32_array(nqkv);
    }
    size_t one_slot;
    ck_assert_int_eq(fsdp2_nn_set_threads(1), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_attention_workspace_bytes(seq, &one_slot), FSDP2_SUCCESS);
    size_t two_slots;
    ck_assert_int_eq(fsdp2_nn_set_threads(2), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_attention_workspace_bytes(seq, &two_slots), FSDP2_SUCCESS);
#ifdef _OPENMP
    ck_assert_uint_eq(two_slots, 2 * one_slot); /* a scratch per thread */
#endif
    run_attention(1, 0, qkv, dy, batch, seq, dim, heads, y[0], p[0], d[0]);
    run_attention(2, 0, qkv, dy, batch, seq, dim, heads, y[1], p[1], d[1]);
    run_attention(2, one_slot, qkv, dy, batch, seq, dim, heads, y[2], p[2], d[2]);
    for (int i = 1; i < 3; i++) {
        ck_assert(memcmp(y[0], y[i], sizeof(float) * (size_t)ny) == 0);
        ck_assert(memcmp(p[0], p[i], sizeof(float) * (size_t)np) == 0);
        ck_assert(memcmp(d[0], d[i], sizeof(float) * (size_t)nqkv) == 0);
    }
    /* a workspace below one scratch is refused, naming the bytes */
    fsdp2_nn_workspace_t small = {.data = d[2], .bytes = one_slot - 1};
    ck_assert_int_eq(fsdp2_nn_attention_backward(qkv, p[0], dy, batch, seq, dim, heads, d[2],
                                                 &small),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "needs a workspace"));
    ck_assert_int_eq(fsdp2_nn_set_threads(0), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "threads = 0"));
    for (int i = 0; i < 3; i++) {
        free(y[i]);
        free(p[i]);
        free(d[i]);
    }
    free(qkv);
    free(dy);
}
END_TEST

/* Every threaded layer once on the threads asked for; outputs in out[0..7]. */
static void run_layers(int threads, const float *x, const float *x2, const float *dy,
                       int64_t rows, int64_t dim, float **out, double *loss)
{
    int64_t n = rows * dim;
    ck_assert_int_eq(fsdp2_nn_set_threads(threads), FSDP2_SUCCESS);
    for (int i = 0; i < 8; i++)
        memset(out[i], 0, sizeof(float) * (size_t)n);
    ck_assert_int_eq(fsdp2_nn_gelu_forward(x, n, out[0]), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_gelu_backward(x, dy, n, out[1]), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_swiglu_forward(x, x2, n, out[2]), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_swiglu_backward(x, x2, dy, n, out[3], out[4]), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_dropout_forward(x, n, 0.25, 7, 3, out[5]), FSDP2_SUCCESS);
    float *w = f32_array(dim), *mean = f32_array(rows), *rstd = f32_array(rows);
    for (int64_t j = 0; j < dim; j++)
        w[j] = 1.0f + 0.01f * (float)j;
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 1, dim, 0);
    size_t ln_bytes, rms_bytes;
    ck_assert_int_eq(fsdp2_nn_layernorm_workspace_bytes(dim, &ln_bytes), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_rmsnorm_workspace_bytes(dim, &rms_bytes), FSDP2_SUCCESS);
    fsdp2_nn_workspace_t ws = {.bytes = ln_bytes > rms_bytes ? ln_bytes : rms_bytes};
    ws.data = aligned_alloc(64, (ws.bytes + 63) / 64 * 64);
    ck_assert_int_eq(fsdp2_nn_layernorm_forward(x, rows, 1e-5f, tw, NULL, out[6], mean, rstd,
                                                &ws),
                     FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_rmsnorm_forward(x, rows, 1e-5f, tw, out[7], rstd, &ws),
                     FSDP2_SUCCESS);
    int32_t *targets = malloc(sizeof(int32_t) * (size_t)rows);
    for (int64_t r = 0; r < rows; r++)
        targets[r] = r % 5 == 0 ? -100 : (int32_t)((r * 7) % dim);
    fsdp2_nn_cross_entropy_result_t result;
    ck_assert_int_eq(fsdp2_nn_cross_entropy(x, targets, rows, dim, NULL, out[5], &result),
                     FSDP2_SUCCESS);
    *loss = result.loss;
    free(targets);
    fsdp2_tensor_release(tw);
    free(ws.data);
    free(w);
    free(mean);
    free(rstd);
}

START_TEST(threaded_layers_give_the_same_bits_on_one_and_two_threads)
{
    const int64_t rows = 300, dim = 257; /* several chunks, none of them whole */
    int64_t n = rows * dim;
    float *x = random_f32(n), *x2 = random_f32(n), *dy = random_f32(n);
    float *one[8], *two[8];
    for (int i = 0; i < 8; i++) {
        one[i] = f32_array(n);
        two[i] = f32_array(n);
    }
    double loss1, loss2;
    run_layers(1, x, x2, dy, rows, dim, one, &loss1);
    run_layers(2, x, x2, dy, rows, dim, two, &loss2);
    for (int i = 0; i < 8; i++)
        ck_assert_msg(memcmp(one[i], two[i], sizeof(float) * (size_t)n) == 0,
                      "output %d differs between 1 and 2 threads", i);
    ck_assert(memcmp(&loss1, &loss2, sizeof(double)) == 0);
    for (int i = 0; i < 8; i++) {
        free(one[i]);
        free(two[i]);
    }
    free(x);
    free(x2);
    free(dy);
}
END_TEST

/* The parameter gradients that are sums over rows, once on the threads asked for: the
 * linear bias gradient in f32 (added to what it held) and in bf16, the conv2d bias
 * gradient, the layer norm's dx, dW and db and RMSNorm's dx and dW. Each output's floats go
 * to grads[i]; sizes[i] says how many. */
enum { GRAD_OUTPUTS = 8 };

static void run_grads(int threads, const float *x, const float *dy, int64_t rows, int64_t dim,
                      float **grads, int64_t *sizes)
{
    ck_assert_int_eq(fsdp2_nn_set_threads(threads), FSDP2_SUCCESS);
    /* linear [dim] <- [8]: dbias sums dy's columns */
    float *w = f32_array(8 * dim), *b32 = f32_array(dim);
    uint16_t *b16 = calloc((size_t)dim, sizeof(uint16_t));
    for (int64_t j = 0; j < dim; j++)
        b32[j] = 0.5f + 0.001f * (float)j;
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, dim, 8), *tb32 = wrap(b32, FSDP2_F32, 1, dim, 0);
    fsdp2_tensor_t *tb16 = wrap(b16, FSDP2_BF16, 1, dim, 0);
    size_t bytes;
    ck_assert_int_eq(fsdp2_nn_linear_workspace_bytes(8, dim, &bytes), FSDP2_SUCCESS);
    fsdp2_nn_workspace_t ws = {.bytes = bytes};
    ws.data = aligned_alloc(64, (bytes + 63) / 64 * 64);
    ck_assert_int_eq(fsdp2_nn_linear_backward(x, dy, rows, tw, NULL, NULL, tb32, &ws),
                     FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_linear_backward(x, dy, rows, tw, NULL, NULL, tb16, &ws),
                     FSDP2_SUCCESS);
    memcpy(grads[0], b32, sizeof(float) * (size_t)dim);
    for (int64_t j = 0; j < dim; j++)
        grads[1][j] = fsdp2_bf16_to_f32(b16[j]);
    sizes[0] = sizes[1] = dim;
    free(ws.data);
    /* conv2d: 6 samples of 2 x 20 x 20, 5 channels of 3 x 3 kernels; dbias sums per channel */
    const int64_t batch = 6, c = 2, h = 20, o = 5, k = 3;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    int64_t wshape[4] = {o, c, k, k}, bshape[1] = {o};
    float *cw = f32_array(o * c * k * k), *cb = f32_array(o);
    fsdp2_tensor_t *tcw = NULL, *tcb = NULL;
    ck_assert_int_eq(fsdp2_tensor_from_blob(cw, cpu, FSDP2_F32, 4, wshape, NULL, NULL, &tcw),
                     FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_tensor_from_blob(cb, cpu, FSDP2_F32, 1, bshape, NULL, NULL, &tcb),
                     FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_conv2d_workspace_bytes(c, h, h, o, k, &bytes), FSDP2_SUCCESS);
    ws = (fsdp2_nn_workspace_t){.bytes = bytes};
    ws.data = aligned_alloc(64, (bytes + 63) / 64 * 64);
    ck_assert_int_lt(batch * c * h * h, rows * dim); /* x and dy are big enough */
    ck_assert_int_eq(fsdp2_nn_conv2d_backward(x, dy, batch, h, h, tcw, NULL, NULL, tcb, &ws),
                     FSDP2_SUCCESS);
    memcpy(grads[2], cb, sizeof(float) * (size_t)o);
    sizes[2] = o;
    free(ws.data);
    /* the norms over dim: dx by rows, dW and db by columns */
    float *nw = f32_array(dim), *mean = f32_array(rows), *rstd = f32_array(rows);
    float *y = f32_array(rows * dim);
    for (int64_t j = 0; j < dim; j++)
        nw[j] = 1.0f + 0.01f * (float)j;
    fsdp2_tensor_t *tnw = wrap(nw, FSDP2_F32, 1, dim, 0);
    fsdp2_tensor_t *tgw = wrap(grads[4], FSDP2_F32, 1, dim, 0);
    fsdp2_tensor_t *tgb = wrap(grads[5], FSDP2_F32, 1, dim, 0);
    fsdp2_tensor_t *trw = wrap(grads[7], FSDP2_F32, 1, dim, 0);
    ck_assert_int_eq(fsdp2_nn_layernorm_workspace_bytes(dim, &bytes), FSDP2_SUCCESS);
    ws = (fsdp2_nn_workspace_t){.bytes = bytes};
    ws.data = aligned_alloc(64, (bytes + 63) / 64 * 64);
    for (int i = 3; i < GRAD_OUTPUTS; i++)
        memset(grads[i], 0, sizeof(float) * (size_t)(rows * dim));
    ck_assert_int_eq(fsdp2_nn_layernorm_forward(x, rows, 1e-5f, tnw, NULL, y, mean, rstd, &ws),
                     FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_layernorm_backward(x, mean, rstd, dy, rows, tnw, grads[3], tgw,
                                                 tgb, &ws),
                     FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_rmsnorm_forward(x, rows, 1e-5f, tnw, y, rstd, &ws), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_nn_rmsnorm_backward(x, rstd, dy, rows, tnw, grads[6], trw, &ws),
                     FSDP2_SUCCESS);
    sizes[3] = sizes[6] = rows * dim;
    sizes[4] = sizes[5] = sizes[7] = dim;
    free(ws.data);
    fsdp2_tensor_release(tnw), fsdp2_tensor_release(tgw), fsdp2_tensor_release(tgb);
    fsdp2_tensor_release(trw);
    free(nw), free(mean), free(rstd), free(y);
    fsdp2_tensor_release(tw), fsdp2_tensor_release(tb32), fsdp2_tensor_release(tb16);
    fsdp2_tensor_release(tcw), fsdp2_tensor_release(tcb);
    free(w), free(b32), free(b16), free(cw), free(cb);
}

/* SwiGLU's backward runs a vectorised loop per case (both gradients, dgate alone, dup
 * alone) in the pool's chunks: each must give, bit for bit, the plain scalar loop below
 * (the expressions in the order the header documents), on 2 threads over two whole chunks
 * and a partial one, with gates at +-0 and past nn_expf's saturation and gradient buffers
 * that start non-zero. */
START_TEST(swiglu_backward_gives_the_scalar_loops_bits_in_every_case)
{
    const int64_t n = 2 * FSDP2_PAR_CHUNK + 37;
    float *g = random_f32(n), *u = random_f32(n), *dy = random_f32(n);
    float *start = random_f32(n), *want_g = f32_array(n), *want_u = f32_array(n);
    float *got_g = f32_array(n), *got_u = f32_array(n);
    const float special[6] = {0.0f, -0.0f, 90.0f, -90.0f, 87.5f, -88.5f};
    for (int64_t i = 0; i < n; i++)
        g[i] = i < 6 ? special[i] : 8.0f * g[i];
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + nn_expf(-g[i]));
        want_u[i] = start[i] + dy[i] * (g[i] * s);
        want_g[i] = start[i] + dy[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
    }
    ck_assert_int_eq(fsdp2_nn_set_threads(2), FSDP2_SUCCESS);
    for (int c = 0; c < 3; c++) { /* both, dgate alone, dup alone */
        memcpy(got_g, start, sizeof(float) * (size_t)n);
        memcpy(got_u, start, sizeof(float) * (size_t)n);
        ck_assert_int_eq(fsdp2_nn_swiglu_backward(g, u, dy, n, c != 2 ? got_g : NULL,
                                                  c != 1 ? got_u : NULL),
                         FSDP2_SUCCESS);
        for (int64_t i = 0; i < n; i++) {
            ck_assert_msg(c == 2 ? got_g[i] == start[i] : !memcmp(&got_g[i], &want_g[i], 4),
                          "case %d: dgate[%lld] = %.9g, the scalar loop gives %.9g", c,
                          (long long)i, got_g[i], want_g[i]);
            ck_assert_msg(c == 1 ? got_u[i] == start[i] : !memcmp(&got_u[i], &want_u[i], 4),
                          "case %d: dup[%lld] = %.9g, the scalar loop gives %.9g", c,
                          (long long)i, got_u[i], want_u[i]);
        }
    }
    free(g), free(u), free(dy), free(start), free(want_g), free(want_u), free(got_g),
        free(got_u);
}
END_TEST

START_TEST(parameter_gradient_sums_give_the_same_bits_on_one_and_two_threads)
{
    const int64_t rows = 300, dim = 257; /* columns split off 16-float boundaries */
    float *x = random_f32(rows * dim), *dy = random_f32(rows * dim);
    float *one[GRAD_OUTPUTS], *two[GRAD_OUTPUTS];
    int64_t n1[GRAD_OUTPUTS], n2[GRAD_OUTPUTS];
    for (int i = 0; i < GRAD_OUTPUTS; i++) {
        one[i] = f32_array(rows * dim);
        two[i] = f32_array(rows * dim);
    }
    run_grads(1, x, dy, rows, dim, one, n1);
    run_grads(2, x, dy, rows, dim, two, n2);
    for (int i = 0; i < GRAD_OUTPUTS; i++) {
        ck_assert_int_eq(n1[i], n2[i]);
        ck_assert_msg(memcmp(one[i], two[i], sizeof(float) * (size_t)n1[i]) == 0,
                      "gradient %d differs between 1 and 2 threads", i);
    }
    /* the linear bias gradient is its columns summed in row order, onto what it held */
    for (int64_t j = 0; j < dim; j++) {
        float sum = 0.5f + 0.001f * (float)j;
        for (int64_t r = 0; r < rows; r++)
            sum += dy[r * dim + j];
        ck_assert_msg(memcmp(&sum, &one[0][j], sizeof(float)) == 0,
                      "dbias[%lld] = %.9g, row order gives %.9g", (long long)j, one[0][j], sum);
    }
    for (int i = 0; i < GRAD_OUTPUTS; i++) {
        free(one[i]);
        free(two[i]);
    }
    free(x);
    free(dy);
}
END_TEST

/* One linear layer's forward and backward (dx, dW, db) on random data, every array of
 * the dtype asked; bf16 arrays hold f32 zeros' bit patterns (0), which is a valid bf16. */
static void run_linear(int64_t rows, int64_t in, int64_t out, fsdp2_dtype_t wt, fsdp2_dtype_t gt,
                       int bias)
{
    float *x = random_f32(rows * in), *dy = random_f32(rows * out), *y = f32_array(rows * out),
          *dx = f32_array(rows * in), *w = random_f32(out * in), *dw = f32_array(out * in),
          *b = random_f32(out), *db = f32_array(out);
    fsdp2_tensor_t *tw = wrap(w, wt, 2, out, in), *tdw = wrap(dw, gt, 2, out, in),
                   *tb = wrap(b, wt, 1, out, 0), *tdb = wrap(db, gt, 1, out, 0);
    size_t bytes;
    NN_OK(fsdp2_nn_linear_workspace_bytes(in, out, &bytes));
    fsdp2_nn_workspace_t ws = {malloc(bytes), bytes};
    NN_OK(fsdp2_nn_linear_forward(x, rows, tw, bias ? tb : NULL, y, &ws));
    NN_OK(fsdp2_nn_linear_backward(x, dy, rows, tw, dx, tdw, bias ? tdb : NULL, &ws));
    fsdp2_tensor_release(tw);
    fsdp2_tensor_release(tdw);
    fsdp2_tensor_release(tb);
    fsdp2_tensor_release(tdb);
    free(ws.data);
    free(x), free(dy), free(y), free(dx), free(w), free(dw), free(b), free(db);
}

static void set_bf16_mode(const char *mode)
{
    ck_assert_int_eq(setenv("FSDP2_NN_BF16_GEMM", mode, 1), 0);
    NN_OK(fsdp2_env_reload());
}

/* After fsdp2_nn_linear_prepare, a step of those sizes creates no primitive: for f32 and
 * bf16 weights and gradients, with and without a bias, in both FSDP2_NN_BF16_GEMM modes,
 * at a size inside one conversion block and at one of several blocks with partial last
 * blocks (in 3000, out 200: rows of W in blocks of 64, dx in blocks of 1280 columns). Each
 * setting has its own number of rows, so that no shape is left over from another's run.
 * The prepare reads no array: they lie in memory that faults when touched. */
START_TEST(linear_prepare_makes_every_primitive_its_forward_and_backward_use)
{
    const int64_t sizes[2][3] = {{70, 96, 40}, {70, 3000, 200}};
    const char *modes[2] = {"off", "on"};
    const fsdp2_dtype_t dtypes[2] = {FSDP2_F32, FSDP2_BF16};
    int onednn = strcmp(nn_gemm_engine(), "onednn") == 0;
    for (int mode = 0; mode < 2; mode++) {
        set_bf16_mode(modes[mode]);
        for (int z = 0; z < 2; z++)
            for (int w = 0; w < 2; w++)
                for (int g = 0; g < 2; g++)
                    for (int bias = 0; bias < 2; bias++) {
                        /* rows of its own: no shape left over from another run */
                        int64_t rows = sizes[z][0] + ((mode * 2 + w) * 2 + g) * 2 + bias;
                        int64_t in = sizes[z][1], out = sizes[z][2];
                        int64_t before = nn_gemm_primitives();
                        NN_OK(fsdp2_nn_linear_prepare(rows, in, out, dtypes[w], dtypes[g], bias));
                        int64_t made = nn_gemm_primitives();
                        if (onednn && z == 0 && w == 0 && g == 0 && bias == 0 && mode == 0)
                            ck_assert_int_gt(made, before); /* the first: all new */
                        run_linear(rows, in, out, dtypes[w], dtypes[g], bias);
                        ck_assert_msg(nn_gemm_primitives() == made,
                                      "mode %s, rows %lld in %lld out %lld, weight %s, grad "
                                      "%s, bias %d: the step made %lld primitives after "
                                      "prepare",
                                      modes[mode], (long long)rows, (long long)in,
                                      (long long)out, fsdp2_dtype_name(dtypes[w]),
                                      fsdp2_dtype_name(dtypes[g]), bias,
                                      (long long)(nn_gemm_primitives() - made));
                    }
    }
    unsetenv("FSDP2_NN_BF16_GEMM");
    NN_OK(fsdp2_env_reload());
    /* bad arguments, named */
    ck_assert_int_eq(fsdp2_nn_linear_prepare(8, 4, 4, FSDP2_F64, FSDP2_F32, 0),
                     FSDP2_ERR_DTYPE_MISMATCH);
    ck_assert_msg(strstr(fsdp2_last_error(), "linear weight dtype f64") != NULL, "%s",
                  fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_linear_prepare(8, 4, 4, FSDP2_F32, FSDP2_F32, 2),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "bias = 2") != NULL, "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_linear_prepare(-1, 4, 4, FSDP2_F32, FSDP2_F32, 0),
                     FSDP2_ERR_INVALID_ARGUMENT);
    NN_OK(fsdp2_nn_linear_prepare(0, 4, 4, FSDP2_F32, FSDP2_F32, 0)); /* no rows: nothing */
}
END_TEST

/* One LoRA layer's forward and backward (dx, dA, dB) on random data with dropout. */
static void run_lora(int64_t rows, int64_t in, int64_t out, int64_t r, fsdp2_dtype_t wt,
                     fsdp2_dtype_t at, int bias)
{
    float *x = random_f32(rows * in), *dy = random_f32(rows * out), *y = f32_array(rows * out),
          *dx = f32_array(rows * in), *w = random_f32(out * in), *b = random_f32(out),
          *a = random_f32(r * in), *bb = random_f32(out * r), *da = f32_array(r * in),
          *db = f32_array(out * r);
    fsdp2_tensor_t *tw = wrap(w, wt, 2, out, in), *tb = wrap(b, wt, 1, out, 0),
                   *ta = wrap(a, at, 2, r, in), *tbb = wrap(bb, at, 2, out, r),
                   *tda = wrap(da, at, 2, r, in), *tdb = wrap(db, at, 2, out, r);
    fsdp2_nn_lora_t lora = {.a = ta, .b = tbb, .scale = 2.0, .dropout = 0.1, .seed = 7};
    size_t bytes;
    NN_OK(fsdp2_nn_lora_workspace_bytes(in, out, r, &bytes));
    fsdp2_nn_workspace_t ws = {malloc(bytes), bytes};
    NN_OK(fsdp2_nn_lora_forward(x, rows, tw, bias ? tb : NULL, &lora, y, &ws));
    NN_OK(fsdp2_nn_lora_backward(x, dy, rows, tw, &lora, dx, tda, tdb, &ws));
    fsdp2_tensor_t *all[] = {tw, tb, ta, tbb, tda, tdb};
    for (int i = 0; i < 6; i++)
        fsdp2_tensor_release(all[i]);
    free(ws.data);
    free(x), free(dy), free(y), free(dx), free(w), free(b), free(a), free(bb), free(da),
        free(db);
}

/* After fsdp2_nn_lora_prepare (no dropout), a step of those sizes with dropout creates
 * no primitive: f32 and bf16 bases and adapters, bias or not, both modes, one block of
 * rows and several. */
START_TEST(lora_prepare_makes_every_primitive_its_forward_and_backward_use)
{
    const int64_t sizes[2][4] = {{70, 96, 40, 8}, {600, 3000, 200, 16}};
    const char *modes[2] = {"off", "on"};
    const fsdp2_dtype_t dtypes[2] = {FSDP2_F32, FSDP2_BF16};
    for (int mode = 0; mode < 2; mode++) {
        set_bf16_mode(modes[mode]);
        for (int z = 0; z < 2; z++)
            for (int w = 0; w < 2; w++)
                for (int a = 0; a < 2; a++)
                    for (int bias = 0; bias < 2; bias++) {
                        int64_t d[4]; /* rows of its own, as for the linear */
                        memcpy(d, sizes[z], sizeof(d));
                        d[0] += ((mode * 2 + w) * 2 + a) * 2 + bias;
                        NN_OK(fsdp2_nn_lora_prepare(d[0], d[1], d[2], d[3], 2.0, dtypes[w],
                                                    dtypes[a], bias));
                        int64_t made = nn_gemm_primitives();
                        run_lora(d[0], d[1], d[2], d[3], dtypes[w], dtypes[a], bias);
                        ck_assert_msg(nn_gemm_primitives() == made,
                                      "mode %s, rows %lld in %lld out %lld r %lld, base %s, "
                                      "adapter %s, bias %d: the step made %lld primitives "
                                      "after prepare",
                                      modes[mode], (long long)d[0], (long long)d[1],
                                      (long long)d[2], (long long)d[3],
                                      fsdp2_dtype_name(dtypes[w]), fsdp2_dtype_name(dtypes[a]),
                                      bias, (long long)(nn_gemm_primitives() - made));
                    }
    }
    unsetenv("FSDP2_NN_BF16_GEMM");
    NN_OK(fsdp2_env_reload());
    ck_assert_int_eq(fsdp2_nn_lora_prepare(8, 4, 4, 2, 1.0, FSDP2_F32, FSDP2_F16, 0),
                     FSDP2_ERR_DTYPE_MISMATCH);
    ck_assert_msg(strstr(fsdp2_last_error(), "LoRA adapter dtype f16") != NULL, "%s",
                  fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_lora_prepare(8, 4, 4, -1, 1.0, FSDP2_F32, FSDP2_F32, 0),
                     FSDP2_ERR_INVALID_ARGUMENT);
}
END_TEST

/* A forward and backward of the fused attention (kv_heads 0) or the grouped-query one on
 * random data. */
static void attention_step(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t hd)
{
    int fused = kv_heads == 0;
    int64_t dim = heads * hd, kvd = (fused ? heads : kv_heads) * hd, rows = batch * seq;
    int64_t width = fused ? 3 * dim : dim + 2 * kvd;
    float *qkv = random_f32(rows * width), *dy = random_f32(rows * dim), *y = f32_array(rows * dim),
          *probs = f32_array(batch * heads * seq * seq), *d = f32_array(rows * width);
    size_t bytes;
    NN_OK(fsdp2_nn_attention_workspace_bytes(seq, &bytes));
    fsdp2_nn_workspace_t ws = {malloc(bytes), bytes};
    if (fused) {
        NN_OK(fsdp2_nn_attention_forward(qkv, batch, seq, dim, heads, y, probs));
        NN_OK(fsdp2_nn_attention_backward(qkv, probs, dy, batch, seq, dim, heads, d, &ws));
    } else {
        const float *k = qkv + rows * dim, *v = k + rows * kvd;
        NN_OK(fsdp2_nn_gqa_attention_forward(qkv, k, v, batch, seq, heads, kv_heads, hd, y,
                                             probs));
        NN_OK(fsdp2_nn_gqa_attention_backward(qkv, k, v, probs, dy, batch, seq, heads, kv_heads,
                                              hd, d, d + rows * dim, d + rows * (dim + kvd),
                                              &ws));
    }
    free(ws.data);
    free(qkv), free(dy), free(y), free(probs), free(d);
}

/* After fsdp2_nn_attention_prepare (fsdp2_nn_gqa_attention_prepare), a step of those
 * sizes creates no primitive: fused and grouped-query, f32 and bf16 compute, 1 and 2
 * threads, one sample (no parallel region over pairs) and two, seq with a partial last
 * block of rows. Each setting has a seq of its own, so that no shape is left over from
 * another setting's run. The step allocates no bf16 staging either. */
START_TEST(attention_prepare_makes_every_primitive_its_forward_and_backward_use)
{
    set_bf16_mode("on");
    const int64_t shapes[3][5] = {{2, 70, 3, 0, 8}, {1, 130, 4, 2, 12}, {2, 64, 6, 3, 8}};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int threads = 1; threads <= 2; threads++)
            for (int z = 0; z < 3; z++) {
                int64_t d[5];
                memcpy(d, shapes[z], sizeof(d));
                d[1] += 2 * (2 * bf16 + threads - 1);
                NN_OK(fsdp2_nn_set_compute_dtype(bf16 ? FSDP2_BF16 : FSDP2_F32));
                NN_OK(fsdp2_nn_set_threads(threads));
                if (d[3] == 0)
                    NN_OK(fsdp2_nn_attention_prepare(d[0], d[1], d[2] * d[4], d[2]));
                else
                    NN_OK(fsdp2_nn_gqa_attention_prepare(d[0], d[1], d[2], d[3], d[4]));
                int64_t made = nn_gemm_primitives(), staged = nn_attention_staging_allocated();
                attention_step(d[0], d[1], d[2], d[3], d[4]);
                /* nor any bf16 staging: the prepare call took the team's */
                ck_assert_int_eq(nn_attention_staging_allocated(), staged);
                ck_assert_msg(nn_gemm_primitives() == made,
                              "%s compute, %d threads, batch %lld seq %lld heads %lld kv_heads "
                              "%lld hd %lld: the step made %lld primitives after prepare",
                              bf16 ? "bf16" : "f32", threads, (long long)d[0], (long long)d[1],
                              (long long)d[2], (long long)d[3], (long long)d[4],
                              (long long)(nn_gemm_primitives() - made));
            }
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_F32));
    unsetenv("FSDP2_NN_BF16_GEMM");
    NN_OK(fsdp2_env_reload());
    ck_assert_int_eq(fsdp2_nn_attention_prepare(2, 8, 10, 3), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_nn_gqa_attention_prepare(2, 8, 6, 4, 8), FSDP2_ERR_INVALID_ARGUMENT);
    NN_OK(fsdp2_nn_attention_prepare(0, 8, 12, 3));
}
END_TEST

/* A conv2d forward and backward (dx, dW, db) on random data. */
static void conv_step(int64_t batch, int64_t c, int64_t h, int64_t w, int64_t o, int64_t k,
                      fsdp2_dtype_t wt, fsdp2_dtype_t gt)
{
    int64_t oh = h - k + 1, ow = w - k + 1, nw = o * c * k * k;
    float *x = random_f32(batch * c * h * w), *dy = random_f32(batch * o * oh * ow),
          *y = f32_array(batch * o * oh * ow), *dx = f32_array(batch * c * h * w),
          *wd = random_f32(nw), *dw = f32_array(nw), *b = random_f32(o), *db = f32_array(o);
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    int64_t shape[4] = {o, c, k, k};
    fsdp2_tensor_t *tw = NULL, *tdw = NULL, *tb = wrap(b, wt, 1, o, 0), *tdb = wrap(db, gt, 1, o, 0);
    NN_OK(fsdp2_tensor_from_blob(wd, cpu, wt, 4, shape, NULL, NULL, &tw));
    NN_OK(fsdp2_tensor_from_blob(dw, cpu, gt, 4, shape, NULL, NULL, &tdw));
    size_t bytes;
    NN_OK(fsdp2_nn_conv2d_workspace_bytes(c, h, w, o, k, &bytes));
    fsdp2_nn_workspace_t ws = {malloc(bytes), bytes};
    NN_OK(fsdp2_nn_conv2d_forward(x, batch, h, w, tw, tb, y, &ws));
    NN_OK(fsdp2_nn_conv2d_backward(x, dy, batch, h, w, tw, dx, tdw, tdb, &ws));
    fsdp2_tensor_release(tw);
    fsdp2_tensor_release(tdw);
    fsdp2_tensor_release(tb);
    fsdp2_tensor_release(tdb);
    free(ws.data);
    free(x), free(dy), free(y), free(dx), free(wd), free(dw), free(b), free(db);
}

/* After fsdp2_nn_conv2d_prepare, a step of those sizes (with a bias) creates no
 * primitive: f32 and bf16 weights and gradients, both modes, a batch of several chunks
 * with a partial last one; each setting has a batch of its own. */
START_TEST(conv2d_prepare_makes_every_primitive_its_forward_and_backward_use)
{
    const char *modes[2] = {"off", "on"};
    const fsdp2_dtype_t dtypes[2] = {FSDP2_F32, FSDP2_BF16};
    for (int mode = 0; mode < 2; mode++) {
        set_bf16_mode(modes[mode]);
        for (int w = 0; w < 2; w++)
            for (int g = 0; g < 2; g++) {
                int64_t batch = 37 + (mode * 2 + w) * 2 + g;
                NN_OK(fsdp2_nn_conv2d_prepare(batch, 3, 12, 10, 5, 3, dtypes[w], dtypes[g]));
                int64_t made = nn_gemm_primitives();
                conv_step(batch, 3, 12, 10, 5, 3, dtypes[w], dtypes[g]);
                ck_assert_msg(nn_gemm_primitives() == made,
                              "mode %s, batch %lld, weight %s, grad %s: the step made %lld "
                              "primitives after prepare",
                              modes[mode], (long long)batch, fsdp2_dtype_name(dtypes[w]),
                              fsdp2_dtype_name(dtypes[g]),
                              (long long)(nn_gemm_primitives() - made));
            }
    }
    unsetenv("FSDP2_NN_BF16_GEMM");
    NN_OK(fsdp2_env_reload());
    ck_assert_int_eq(fsdp2_nn_conv2d_prepare(4, 3, 2, 2, 5, 3, FSDP2_F32, FSDP2_F32),
                     FSDP2_ERR_INVALID_ARGUMENT); /* kernel larger than the image */
    ck_assert_int_eq(fsdp2_nn_conv2d_prepare(4, 3, 8, 8, 5, 3, FSDP2_F32, FSDP2_F64),
                     FSDP2_ERR_DTYPE_MISMATCH);
}
END_TEST

static Suite *nn_gemm_suite(void)
{
    Suite *s = suite_create("nn_gemm");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, sgemm_matches_a_float64_loop_for_every_transpose_stride_alpha_and_beta);
    tcase_add_test(tc, sgemm_bias_matches_a_float64_loop_with_and_without_a_bias);
    tcase_add_test(tc, sgemm_with_k_or_alpha_zero_scales_c_and_empty_sizes_write_nothing);
    tcase_add_test(tc, a_shape_creates_one_primitive_and_the_counters_add_its_flops);
    tcase_add_test(tc, threads_make_their_memory_objects_of_a_shape_once);
    tcase_add_test(tc, blas_advice_names_a_coretype_only_for_generic_kernels_on_avx2_or_avx512);
    tcase_add_test(tc, attention_gives_the_same_bits_on_one_thread_two_threads_and_one_scratch);
    tcase_add_test(tc, threaded_layers_give_the_same_bits_on_one_and_two_threads);
    tcase_add_test(tc, swiglu_backward_gives_the_scalar_loops_bits_in_every_case);
    tcase_add_test(tc, parameter_gradient_sums_give_the_same_bits_on_one_and_two_threads);
    tcase_add_test(tc, linear_prepare_makes_every_primitive_its_forward_and_backward_use);
    tcase_add_test(tc, lora_prepare_makes_every_primitive_its_forward_and_backward_use);
    tcase_add_test(tc, attention_prepare_makes_every_primitive_its_forward_and_backward_use);
    tcase_add_test(tc, conv2d_prepare_makes_every_primitive_its_forward_and_backward_use);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(nn_gemm_suite)
