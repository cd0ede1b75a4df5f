/* Attention with bf16 GEMM operands (fsdp2_nn_set_compute_dtype(FSDP2_BF16) under
 * FSDP2_NN_BF16_GEMM=on): GPT-2's fused layout and grouped-query attention with
 * kv_heads < heads, batch 2, 70 and 130 positions (a partial second and third block of
 * 64 query rows), forward and backward against a float64 reference that rounds every
 * GEMM operand to bf16 (nearest even) as the layer does; f32 compute and mode off give
 * the bits of f32 attention; 1, 2 and 3 threads the same bits; the staging allocated
 * once per thread and counted; a bad dtype, and a bad mode under bf16, refused.
 *
 * Tolerances. A product of two bf16 values is exact in f32 (8 + 8 significant bits), so
 * what a GEMM adds is the rounding of its f32 sums in any order: at most (k + 2) 2^-24
 * times the sum of the products' magnitudes (and C's, where it adds into C), Higham's
 * gamma_k with 2 for alpha and the add. Each check takes the layer's own f32 value of what
 * the GEMM received where the layer exposes it (the probabilities, for y and dv), so that
 * bound is exact there. The probabilities add the softmax's f32 error (relative: twice
 * the scores' bound, (i + 16) 2^-22 for e^x's 2 ulp and the row sum of i + 1 terms, and
 * 2^-22 |s - max| for the subtraction). The gradient of the scores dS is internal: the
 * reference computes it in float64 with a bound on the layer's f32 error, and where that
 * interval straddles a bf16 rounding boundary the rounded value may be either
 * neighbour, so the check adds half their gap times |k| (|q| for dk) for those elements
 * (a handful per head: the interval is about 2^-16 of an ulp of bf16). Rounding an
 * operand other than to nearest even, or not at all, moves a result by about 2^-9 of its
 * products' magnitudes: far past these bounds, which the f32 compute is checked to miss. */
#include "../core/check_main.h"
#include "../core/test_rng.h"
#include "nn_test_util.h"

#include <math.h>

#include "core/env_internal.h"
#include "nn/gemm.h"
#include "nn/nn_common.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float uniform(void)
{
    return (float)((rng_next(&rng_state) >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

static float *random_f32(int64_t n, float amplitude)
{
    float *p = f32_array(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = amplitude * uniform();
    return p;
}

static double rounded(double x)
{
    return (double)fsdp2_bf16_to_f32(fsdp2_f32_to_bf16((float)x));
}

static void set_mode(const char *mode)
{
    ck_assert_int_eq(setenv("FSDP2_NN_BF16_GEMM", mode, 1), 0);
    NN_OK(fsdp2_env_reload());
}

/* One attention problem: the fused layout (kv_heads = heads, q, k and v column ranges of
 * one row of qkv) or separate q, k, v. */
typedef struct problem {
    int fused;
    int64_t batch, seq, heads, kv_heads, hd;
    int64_t ldq, ldk, ldy;
    float *in;       /* fused: qkv; else q, then k, then v */
    float *q, *k, *v; /* into in */
    float *dy;
    float *g0;       /* the input gradients' starting values (accumulation is checked) */
    int64_t nin, ny, nprobs;
} problem_t;

typedef struct outputs {
    float *y, *probs, *grad; /* grad as in: dqkv, or dq then dk then dv */
} outputs_t;

static problem_t make_problem(int fused, int64_t seq, int64_t heads, int64_t kv_heads,
                              int64_t hd)
{
    problem_t p = {.fused = fused, .batch = 2, .seq = seq, .heads = heads,
                   .kv_heads = kv_heads, .hd = hd};
    int64_t rows = p.batch * seq, qd = heads * hd, kd = kv_heads * hd;
    p.ldq = fused ? 3 * qd : qd;
    p.ldk = fused ? 3 * qd : kd;
    p.ldy = qd;
    p.nin = rows * (qd + 2 * kd);
    p.ny = rows * qd;
    p.nprobs = p.batch * heads * seq * seq;
    p.in = random_f32(p.nin, 2.0f); /* scores of a few units: probabilities far from uniform */
    p.q = p.in;
    p.k = fused ? p.in + qd : p.in + rows * qd;
    p.v = fused ? p.in + 2 * qd : p.k + rows * kd;
    p.dy = random_f32(p.ny, 1.0f);
    p.g0 = random_f32(p.nin, 1.0f / 64); /* small: the sums' roundings dominate the bound */
    return p;
}

static void free_problem(problem_t *p)
{
    free(p->in);
    free(p->dy);
    free(p->g0);
}

static void free_outputs(outputs_t *o)
{
    free(o->y);
    free(o->probs);
    free(o->grad);
}

static outputs_t run(const problem_t *p)
{
    outputs_t o = {f32_array(p->ny), f32_array(p->nprobs), f32_array(p->nin)};
    memcpy(o.grad, p->g0, sizeof(float) * (size_t)p->nin);
    int64_t dim = p->heads * p->hd;
    if (p->fused) {
        NN_OK(fsdp2_nn_attention_forward(p->in, p->batch, p->seq, dim, p->heads, o.y, o.probs));
        NN_OK(fsdp2_nn_attention_backward(p->in, o.probs, p->dy, p->batch, p->seq, dim, p->heads,
                                          o.grad, test_ws()));
    } else {
        float *dq = o.grad + (p->q - p->in), *dk = o.grad + (p->k - p->in);
        float *dv = o.grad + (p->v - p->in);
        NN_OK(fsdp2_nn_gqa_attention_forward(p->q, p->k, p->v, p->batch, p->seq, p->heads,
                                             p->kv_heads, p->hd, o.y, o.probs));
        NN_OK(fsdp2_nn_gqa_attention_backward(p->q, p->k, p->v, o.probs, p->dy, p->batch,
                                              p->seq, p->heads, p->kv_heads, p->hd, dq, dk, dv,
                                              test_ws()));
    }
    return o;
}

/* ---- the float64 reference ---- */

typedef struct expected {
    double *y, *y_bound, *probs, *probs_bound, *grad, *grad_bound; /* grad laid out as in */
} expected_t;

static double *doubles(int64_t n)
{
    double *d = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    ck_assert_ptr_nonnull(d);
    return d;
}

/* Forward of one (sample, query head): probabilities against float64 scores of the
 * rounded q and k, y against the layer's own probabilities rounded. */
static void expect_forward(const problem_t *p, const outputs_t *o, int64_t b, int64_t h,
                           expected_t *e)
{
    int64_t S = p->seq, hd = p->hd, kvh = h / (p->heads / p->kv_heads);
    double scale = (double)(float)(1.0 / sqrt((double)hd));
    double *s = doubles(S), *delta = doubles(S);
    const float *P = o->probs + (b * p->heads + h) * S * S;
    for (int64_t i = 0; i < S; i++) {
        const float *qi = p->q + (b * S + i) * p->ldq + h * hd;
        double max = -INFINITY, worst = 0, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
            const float *kj = p->k + (b * S + j) * p->ldk + kvh * hd;
            double dot = 0, mag = 0;
            for (int64_t d = 0; d < hd; d++) {
                double t = rounded(qi[d]) * rounded(kj[d]);
                dot += t;
                mag += fabs(t);
            }
            s[j] = scale * dot;
            delta[j] = (double)(hd + 2) * 0x1p-24 * scale * mag;
            max = s[j] > max ? s[j] : max;
            worst = delta[j] > worst ? delta[j] : worst;
        }
        for (int64_t j = 0; j <= i; j++)
            sum += exp(s[j] - max);
        for (int64_t j = 0; j < S; j++) {
            int64_t at = ((b * p->heads + h) * S + i) * S + j;
            double pj = j <= i ? exp(s[j] - max) / sum : 0;
            e->probs[at] = pj;
            e->probs_bound[at] =
                j <= i ? pj * (2 * worst + (double)(i + 16) * 0x1p-22 +
                               0x1p-22 * fabs(s[j] - max))
                       : 0;
        }
        for (int64_t d = 0; d < hd; d++) {
            double acc = 0, mag = 0;
            for (int64_t j = 0; j < S; j++) {
                double t = rounded(P[i * S + j]) *
                           rounded(p->v[(b * S + j) * p->ldk + kvh * hd + d]);
                acc += t;
                mag += fabs(t);
            }
            int64_t at = (b * S + i) * p->ldy + h * hd + d;
            e->y[at] = acc;
            e->y_bound[at] = (double)(S + 2) * 0x1p-24 * mag;
        }
    }
    free(s);
    free(delta);
}

/* The bf16 value the layer gives dS when its f32 value lies within err of x: the middle
 * of the roundings of the interval's ends, and half their gap (0 almost always). */
static double rounded_within(double x, double err, double *gap)
{
    double lo = rounded(x - err), hi = rounded(x + err);
    *gap = (hi - lo) / 2;
    return (lo + hi) / 2;
}

/* Backward of one (sample, query head): adds its terms to the gradients' sums and
 * magnitudes (mag), and the straddling allowance to slack. */
static void expect_backward(const problem_t *p, const outputs_t *o, int64_t b, int64_t h,
                            double *sum, double *mag, double *slack)
{
    int64_t S = p->seq, hd = p->hd, kvh = h / (p->heads / p->kv_heads);
    double scale = (double)(float)(1.0 / sqrt((double)hd));
    const float *P = o->probs + (b * p->heads + h) * S * S;
    double *dP = doubles(S), *err = doubles(S);
    int64_t qoff = p->q - p->in, koff = p->k - p->in, voff = p->v - p->in;
    for (int64_t i = 0; i < S; i++) {
        int64_t qi = (b * S + i) * p->ldq + h * hd;
        const float *g = p->dy + (b * S + i) * p->ldy + h * hd;
        double dot = 0, dot_err = 0;
        for (int64_t j = 0; j <= i; j++) {
            int64_t kj = (b * S + j) * p->ldk + kvh * hd;
            double acc = 0, m = 0;
            for (int64_t d = 0; d < hd; d++) {
                double t = rounded(g[d]) * rounded(p->v[kj + d]);
                acc += t;
                m += fabs(t);
                /* dv[j] += P[i, j] dy[i] */
                double u = rounded(P[i * S + j]) * rounded(g[d]);
                sum[voff + kj + d] += u;
                mag[voff + kj + d] += fabs(u);
            }
            dP[j] = acc;
            err[j] = (double)(hd + 2) * 0x1p-24 * m;
            dot += (double)P[i * S + j] * dP[j];
            dot_err += (double)P[i * S + j] * err[j];
        }
        dot_err += 0x1p-24 * fabs(dot);
        for (int64_t j = 0; j <= i; j++) {
            int64_t kj = (b * S + j) * p->ldk + kvh * hd;
            double pj = P[i * S + j], ds = pj * (dP[j] - dot);
            double ds_err = 2 * (pj * (err[j] + dot_err + 0x1p-23 * (fabs(dP[j]) + fabs(dot))) +
                                 0x1p-23 * fabs(ds));
            double gap, dsb = rounded_within(ds, ds_err, &gap);
            for (int64_t d = 0; d < hd; d++) {
                double kd = rounded(p->k[kj + d]), qd = rounded(p->q[qi + d]);
                sum[qoff + qi + d] += scale * dsb * kd;
                mag[qoff + qi + d] += scale * fabs(dsb * kd);
                slack[qoff + qi + d] += scale * gap * fabs(kd);
                sum[koff + kj + d] += scale * dsb * qd;
                mag[koff + kj + d] += scale * fabs(dsb * qd);
                slack[koff + kj + d] += scale * gap * fabs(qd);
            }
        }
    }
    free(dP);
    free(err);
}

static expected_t expect(const problem_t *p, const outputs_t *o)
{
    expected_t e = {doubles(p->ny), doubles(p->ny), doubles(p->nprobs), doubles(p->nprobs),
                    doubles(p->nin), doubles(p->nin)};
    double *mag = doubles(p->nin), *slack = doubles(p->nin);
    for (int64_t i = 0; i < p->nin; i++)
        e.grad[i] = p->g0[i];
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads; h++) {
            expect_forward(p, o, b, h, &e);
            expect_backward(p, o, b, h, e.grad, mag, slack);
        }
    /* dq's element: one GEMM over at most seq terms; dk's and dv's: a GEMM of at most 64
     * terms per block of query rows of each of a group's heads, each adding into what the
     * element holds (the starting value and at most all the magnitudes) */
    int64_t group = p->heads / p->kv_heads, blocks = (p->seq + 63) / 64;
    int64_t rows = p->seq < 64 ? p->seq : 64;
    double k = (double)(group * blocks * (rows + 2));
    k = k > (double)(p->seq + 2) ? k : (double)(p->seq + 2);
    for (int64_t i = 0; i < p->nin; i++)
        e.grad_bound[i] = k * 0x1p-24 * (mag[i] + fabs(p->g0[i])) + slack[i];
    free(mag);
    free(slack);
    return e;
}

static void free_expected(expected_t *e)
{
    free(e->y);
    free(e->y_bound);
    free(e->probs);
    free(e->probs_bound);
    free(e->grad);
    free(e->grad_bound);
}

/* The elements of got farther from want than bound: 0, or with fail the test fails
 * naming the first. */
static int64_t count_past(const char *what, const float *got, const double *want,
                          const double *bound, int64_t n, int fail)
{
    int64_t past = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= bound[i])) {
            if (fail)
                ck_abort_msg("%s: element %lld is %.9g where %.9g is expected (bound %.3g)",
                             what, (long long)i, (double)got[i], want[i], bound[i]);
            past++;
        }
    return past;
}

/* fused 3 heads of 8 at 70 and 130 positions; 6 query heads of 12 over 2 and over 3
 * key/value heads */
static const int64_t shapes[][5] = {
    {1, 70, 3, 3, 8}, {1, 130, 3, 3, 8}, {0, 70, 6, 2, 12}, {0, 130, 6, 3, 12}};
#define SHAPES (sizeof(shapes) / sizeof(shapes[0]))

static problem_t shape_problem(size_t i)
{
    return make_problem((int)shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3],
                        shapes[i][4]);
}

static void describe(char *what, size_t n, const problem_t *p, const char *part)
{
    snprintf(what, n, "%s seq %lld heads %lld kv_heads %lld hd %lld: %s",
             p->fused ? "fused" : "gqa", (long long)p->seq, (long long)p->heads,
             (long long)p->kv_heads, (long long)p->hd, part);
}

START_TEST(bf16_operands_match_a_float64_reference_on_rounded_operands)
{
    set_mode("on");
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_BF16));
    for (size_t si = 0; si < SHAPES; si++) {
        problem_t p = shape_problem(si);
        outputs_t o = run(&p);
        expected_t e = expect(&p, &o);
        char what[128];
        describe(what, sizeof(what), &p, "probs");
        count_past(what, o.probs, e.probs, e.probs_bound, p.nprobs, 1);
        describe(what, sizeof(what), &p, "y");
        count_past(what, o.y, e.y, e.y_bound, p.ny, 1);
        describe(what, sizeof(what), &p, "gradient");
        count_past(what, o.grad, e.grad, e.grad_bound, p.nin, 1);
        free_expected(&e);
        free_outputs(&o);
        free_problem(&p);
    }
}
END_TEST

/* The reference tells bf16 operands from f32 ones: f32 compute misses its bounds. */
START_TEST(f32_compute_misses_the_bf16_bounds)
{
    set_mode("on");
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_F32));
    problem_t p = shape_problem(3);
    outputs_t o = run(&p);
    expected_t e = expect(&p, &o);
    int64_t y = count_past("y", o.y, e.y, e.y_bound, p.ny, 0);
    int64_t probs = count_past("probs", o.probs, e.probs, e.probs_bound, p.nprobs, 0);
    int64_t grad = count_past("grad", o.grad, e.grad, e.grad_bound, p.nin, 0);
    printf("f32 compute past the bf16 bounds: y %lld of %lld, probs %lld of %lld, gradient "
           "%lld of %lld\n", (long long)y, (long long)p.ny, (long long)probs,
           (long long)p.nprobs, (long long)grad, (long long)p.nin);
    ck_assert_int_gt(y, p.ny / 2);
    ck_assert_int_gt(probs, p.nprobs / 4);
    ck_assert_int_gt(grad, p.nin / 2);
    free_expected(&e);
    free_outputs(&o);
    free_problem(&p);
}
END_TEST

static int same(const problem_t *p, const outputs_t *a, const outputs_t *b)
{
    return memcmp(a->y, b->y, sizeof(float) * (size_t)p->ny) == 0 &&
           memcmp(a->probs, b->probs, sizeof(float) * (size_t)p->nprobs) == 0 &&
           memcmp(a->grad, b->grad, sizeof(float) * (size_t)p->nin) == 0;
}

/* f32 compute under every mode, and bf16 compute under off, are one computation: f32
 * attention's; bf16 compute under on is another. */
START_TEST(f32_compute_or_mode_off_gives_the_bits_of_f32_attention)
{
    for (size_t si = 0; si < SHAPES; si++) {
        problem_t p = shape_problem(si);
        set_mode("off");
        NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_F32));
        outputs_t f32 = run(&p);
        NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_BF16));
        outputs_t bf16_off = run(&p);
        set_mode("on");
        NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_F32));
        outputs_t f32_on = run(&p);
        NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_BF16));
        outputs_t bf16_on = run(&p);
        ck_assert_msg(same(&p, &f32, &bf16_off), "shape %zu: bf16 compute under off", si);
        ck_assert_msg(same(&p, &f32, &f32_on), "shape %zu: f32 compute under on", si);
        ck_assert_msg(!same(&p, &f32, &bf16_on), "shape %zu: bf16 compute under on", si);
        set_mode("auto");
        outputs_t bf16_auto = run(&p);
        ck_assert(same(&p, nn_gemm_bf16_native() ? &bf16_on : &f32, &bf16_auto));
        outputs_t *all[] = {&f32, &bf16_off, &f32_on, &bf16_on, &bf16_auto};
        for (int i = 0; i < 5; i++)
            free_outputs(all[i]);
        free_problem(&p);
    }
}
END_TEST

START_TEST(bf16_operands_give_the_same_bits_on_1_2_and_3_threads)
{
    set_mode("on");
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_BF16));
    for (size_t si = 0; si < SHAPES; si++) {
        problem_t p = shape_problem(si);
        NN_OK(fsdp2_nn_set_threads(1));
        outputs_t one = run(&p);
        for (int t = 2; t <= 3; t++) {
            NN_OK(fsdp2_nn_set_threads(t));
            outputs_t more = run(&p);
            ck_assert_msg(same(&p, &one, &more), "shape %zu: %d threads differ from 1", si, t);
            free_outputs(&more);
        }
        free_outputs(&one);
        free_problem(&p);
    }
}
END_TEST

/* Each thread that runs bf16 attention allocates its staging once, of the documented
 * size; a second step of the same shapes allocates nothing, and f32 compute never. */
START_TEST(the_staging_is_allocated_once_per_thread_and_counted)
{
    set_mode("on");
    NN_OK(fsdp2_nn_set_threads(3));
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_F32));
    problem_t p = make_problem(0, 150, 4, 2, 16); /* larger than the other tests' */
    int64_t bytes = 4 * (150 * 16 + 64 * (16 + 150));
    ck_assert_int_eq(nn_attention_staging_bytes(150, 16), bytes);
    int64_t before = nn_attention_staging_allocated();
    outputs_t f32 = run(&p);
    ck_assert_int_eq(nn_attention_staging_allocated(), before);
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_BF16));
    outputs_t first = run(&p);
    int64_t grown = nn_attention_staging_allocated() - before;
    ck_assert_msg(grown >= bytes && grown <= 3 * bytes && grown % bytes == 0,
                  "%lld bytes of staging for at most 3 threads of %lld",
                  (long long)grown, (long long)bytes);
    outputs_t second = run(&p);
    ck_assert_int_eq(nn_attention_staging_allocated() - before, grown);
    ck_assert(same(&p, &first, &second));
    free_outputs(&f32);
    free_outputs(&first);
    free_outputs(&second);
    free_problem(&p);
}
END_TEST

START_TEST(the_compute_dtype_is_f32_or_bf16_and_a_bad_one_is_refused_naming_it)
{
    fsdp2_dtype_t d = FSDP2_BF16;
    NN_OK(fsdp2_nn_get_compute_dtype(&d));
    ck_assert_int_eq(d, FSDP2_F32);
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_BF16));
    NN_OK(fsdp2_nn_get_compute_dtype(&d));
    ck_assert_int_eq(d, FSDP2_BF16);
    ck_assert_int_eq(fsdp2_nn_set_compute_dtype(FSDP2_F16), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "f16") != NULL, "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_nn_set_compute_dtype((fsdp2_dtype_t)99), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "99") != NULL, "%s", fsdp2_last_error());
    NN_OK(fsdp2_nn_get_compute_dtype(&d));
    ck_assert_int_eq(d, FSDP2_BF16); /* a refusal changes nothing */
    ck_assert_int_eq(fsdp2_nn_get_compute_dtype(NULL), FSDP2_ERR_INVALID_ARGUMENT);
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_F32));
    NN_OK(fsdp2_nn_get_compute_dtype(&d));
    ck_assert_int_eq(d, FSDP2_F32);
}
END_TEST

/* Under bf16 compute attention reads FSDP2_NN_BF16_GEMM: a bad value is refused naming
 * it, before anything is written; under f32 compute it is not read. */
START_TEST(a_bad_mode_under_bf16_compute_is_refused_and_nothing_is_written)
{
    problem_t p = shape_problem(2);
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_F32));
    ck_assert_int_eq(setenv("FSDP2_NN_BF16_GEMM", "fast", 1), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_ERR_INVALID_CONFIG);
    outputs_t f32 = run(&p); /* f32 compute: the mode is not consulted */
    NN_OK(fsdp2_nn_set_compute_dtype(FSDP2_BF16));
    float *y = f32_array(p.ny), *probs = f32_array(p.nprobs), *grad = f32_array(p.nin);
    for (int64_t i = 0; i < p.ny; i++)
        y[i] = NAN;
    ck_assert_int_eq(fsdp2_nn_gqa_attention_forward(p.q, p.k, p.v, p.batch, p.seq, p.heads,
                                                    p.kv_heads, p.hd, y, probs),
                     FSDP2_ERR_INVALID_CONFIG);
    ck_assert_msg(strstr(fsdp2_last_error(), "FSDP2_NN_BF16_GEMM='fast'") != NULL, "%s",
                  fsdp2_last_error());
    float *dq = grad + (p.q - p.in), *dk = grad + (p.k - p.in), *dv = grad + (p.v - p.in);
    ck_assert_int_eq(fsdp2_nn_gqa_attention_backward(p.q, p.k, p.v, f32.probs, p.dy, p.batch,
                                                     p.seq, p.heads, p.kv_heads, p.hd, dq, dk,
                                                     dv, test_ws()),
                     FSDP2_ERR_INVALID_CONFIG);
    for (int64_t i = 0; i < p.ny; i++)
        ck_assert(isnan(y[i]));
    for (int64_t i = 0; i < p.nprobs; i++)
        ck_assert(probs[i] == 0.0f);
    for (int64_t i = 0; i < p.nin; i++)
        ck_assert(grad[i] == 0.0f);
    free(y);
    free(probs);
    free(grad);
    free_outputs(&f32);
    free_problem(&p);
}
END_TEST

static Suite *nn_attention_bf16_suite(void)
{
    Suite *s = suite_create("nn_attention_bf16");
    TCase *tc = tcase_create("attention_bf16");
    tcase_set_timeout(tc, 240);
    /* first: it reads the default (the others set what they need) */
    tcase_add_test(tc, the_compute_dtype_is_f32_or_bf16_and_a_bad_one_is_refused_naming_it);
    tcase_add_test(tc, bf16_operands_match_a_float64_reference_on_rounded_operands);
    tcase_add_test(tc, f32_compute_misses_the_bf16_bounds);
    tcase_add_test(tc, f32_compute_or_mode_off_gives_the_bits_of_f32_attention);
    tcase_add_test(tc, bf16_operands_give_the_same_bits_on_1_2_and_3_threads);
    tcase_add_test(tc, the_staging_is_allocated_once_per_thread_and_counted);
    tcase_add_test(tc, a_bad_mode_under_bf16_compute_is_refused_and_nothing_is_written);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(nn_attention_bf16_suite)
