/* The optimizers' update rules on one process, against references written here from
 * torch.optim's documented algorithms, in double.
 *
 * The parameters live in a real sharded tree over a 1-rank mesh (run_ranks(1)), so the
 * shards are the whole parameters and the sharded gradients can be written directly:
 * lin.weight [3,4] and lin.bias [3] in f32, head.weight [2,3] in f64, and a frozen
 * "scale" [2] that no rule may touch. Every step writes a gradient formula, steps, and
 * compares every parameter and every state tensor with the reference (relative error
 * 1e-6, to max(|ref|, 1e-3) for parameters and to the tensor's largest value for
 * states, whose elements pass through zero). A few closed forms pin the rules'
 * corner cases independently of any reference loop: SGD's first momentum buffer is the
 * gradient, AdamW's first step moves every element by lr, its step-10 bias correction,
 * decoupled against coupled weight decay. (Options and schedules: test_optim_options.c.) */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <fsdp2/fsdp.h>
#include <fsdp2/optim.h>

#include "../collectives/ranks.h"
#include "../core/check_main.h"
#include "core/parallel.h"

#define NP 3   /* parameters that require gradients */
#define MAXN 12
#define TOLERANCE 1e-6
#define GROUP_TIMEOUT_MS 20000
#define DEADLINE_S 60

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;

static const struct {
    const char *module, *name, *fqn;
    int ndim;
    int64_t shape[2];
    fsdp2_dtype_t dtype;
} PARAM[NP] = {
    {"lin", "weight", "lin.weight", 2, {3, 4}, FSDP2_F32},
    {"lin", "bias", "lin.bias", 1, {3, 0}, FSDP2_F32},
    {"head", "weight", "head.weight", 2, {2, 3}, FSDP2_F64},
};

static int numel_of(int j)
{
    return (int)(PARAM[j].shape[0] * (PARAM[j].ndim == 2 ? PARAM[j].shape[1] : 1));
}

/* Rounds to the parameter's dtype: what the library stores. */
static double as_stored(int j, double x)
{
    return PARAM[j].dtype == FSDP2_F32 ? (double)(float)x : x;
}

static double init_value(int j, int k)
{
    return as_stored(j, 0.5 + 0.25 * sin(1.1 * k + j));
}

static double grad_value(int step, int j, int k)
{
    return as_stored(j, 0.5 * sin(0.9 * k + 1.7 * step + 2.3 * j) + 0.1);
}

/* ---------------------------------------------------------------------------------- */
/* Checks                                                                              */

static int check_ok(const rank_ctx_t *c, fsdp2_status_t s, const char *expr, int line)
{
    if (s == FSDP2_SUCCESS)
        return 0;
    fprintf(stderr, "rank %d/%d: %s:%d: %s = %s (%s)\n", c->rank, c->size, __FILE__, line, expr,
            fsdp2_status_name(s), fsdp2_last_error());
    return 1;
}
#define OK(c, call) check_ok((c), (call), #call, __LINE__)

static int rank_refused(const rank_ctx_t *c, fsdp2_status_t s, fsdp2_status_t want,
                        const char *needle, const char *expr, int line)
{
    const char *msg = fsdp2_last_error();
    if (s == want && strstr(msg, needle))
        return 0;
    fprintf(stderr, "rank %d: %s:%d: %s = %s (%s), want %s naming '%s'\n", c->rank, __FILE__,
            line, expr, fsdp2_status_name(s), s == FSDP2_SUCCESS ? "" : msg,
            fsdp2_status_name(want), needle);
    return 1;
}
#define REFUSED(c, call, want, needle) rank_refused((c), (call), (want), (needle), #call, __LINE__)

/* Largest error of got against want relative to max(|want|, floor); prints the worst. */
static int compare(const rank_ctx_t *c, const char *what, int step, const double *got,
                   const double *want, int n, double floor, double tolerance)
{
    double worst = 0;
    int at = -1;
    for (int k = 0; k < n; k++) {
        double den = fmax(fabs(want[k]), floor);
        double e = fabs(got[k] - want[k]) / den;
        if (isnan(e) || e > worst) {
            worst = isnan(e) ? INFINITY : e;
            at = k;
        }
    }
    return RANK_CHECK(c, worst <= tolerance,
                      "step %d: %s[%d] is %.12g, reference %.12g (relative error %.3g > %.0e)",
                      step, what, at, at >= 0 ? got[at] : 0.0, at >= 0 ? want[at] : 0.0, worst,
                      tolerance);
}

/* Floor for state tensors: their largest element. A state element is a sum of terms as
 * large as the gradients that may cancel to nearly zero, leaving the terms' f32 rounding
 * (not the rule) as its relative error; the tensor's scale is the honest yardstick. */
static double state_floor(const double *want, int n)
{
    double m = 0;
    for (int k = 0; k < n; k++)
        m = fmax(m, fabs(want[k]));
    return fmax(m, 1e-30);
}

/* ---------------------------------------------------------------------------------- */
/* The tree over a 1-rank mesh                                                         */

typedef struct fixture {
    rank_ctx_t *c;
    fsdp2_mesh_t *mesh;
    fsdp2_module_t *root;
    fsdp2_param_t *p[NP];
    fsdp2_param_t *frozen;
} fixture_t;

static fsdp2_status_t declare(fsdp2_module_t *m, const char *name, fsdp2_dtype_t dtype, int ndim,
                              const int64_t *shape, int j, int requires_grad,
                              fsdp2_param_t **param)
{
    fsdp2_tensor_t *t = NULL;
    fsdp2_status_t s = fsdp2_tensor_empty(CPU, dtype, ndim, shape, &t);
    if (s != FSDP2_SUCCESS)
        return s;
    for (int64_t k = 0; k < t->numel; k++) {
        double v = j >= 0 ? init_value(j, (int)k) : 1.0 + (double)k;
        if (dtype == FSDP2_F32)
            ((float *)t->data)[k] = (float)v;
        else if (dtype == FSDP2_F64)
            ((double *)t->data)[k] = v;
        else if (dtype == FSDP2_BF16)
            ((uint16_t *)t->data)[k] = fsdp2_f32_to_bf16((float)v);
    }
    s = fsdp2_module_add_param(m, name, t, requires_grad, param);
    fsdp2_tensor_release(t);
    return s;
}

static int fixture_open(rank_ctx_t *c, fixture_t *fx)
{
    memset(fx, 0, sizeof(*fx));
    fx->c = c;
    int ws = c->size;
    int fails = OK(c, fsdp2_mesh_create(c->store, "optim", c->rank, c->size, 1, &ws, NULL, NULL,
                                        &fx->mesh));
    fails += OK(c, fsdp2_module_create("", &fx->root));
    if (fails)
        return fails;
    fsdp2_module_t *lin = NULL, *head = NULL;
    fails += OK(c, fsdp2_module_create("lin", &lin));
    fails += OK(c, fsdp2_module_add_child(fx->root, lin));
    fails += OK(c, fsdp2_module_create("head", &head));
    fails += OK(c, fsdp2_module_add_child(fx->root, head));
    if (fails)
        return fails;
    int64_t scale_shape[1] = {2};
    fails += OK(c, declare(fx->root, "scale", FSDP2_F32, 1, scale_shape, -1, 0, &fx->frozen));
    for (int j = 0; j < NP; j++)
        fails += OK(c, declare(j < 2 ? lin : head, PARAM[j].name, PARAM[j].dtype, PARAM[j].ndim,
                               PARAM[j].shape, j, 1, &fx->p[j]));
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    so.mesh = fx->mesh;
    if (!fails) {
        fails += OK(c, fsdp2_fully_shard(lin, &so));
        fails += OK(c, fsdp2_fully_shard(head, &so));
        fails += OK(c, fsdp2_fully_shard(fx->root, &so));
    }
    return fails;
}

static int fixture_close(fixture_t *fx)
{
    int fails = 0;
    if (fx->root) {
        fails += OK(fx->c, fsdp2_module_synchronize(fx->root));
        fails += OK(fx->c, fsdp2_module_destroy(fx->root));
    }
    return fails + OK(fx->c, fsdp2_mesh_destroy(fx->mesh));
}

/* The local values of a DTensor (the whole tensor on one rank) as doubles. */
static int read_dtensor(const rank_ctx_t *c, const fsdp2_dtensor_t *dt, double *out, int n)
{
    fsdp2_tensor_t *t = NULL;
    int fails = OK(c, fsdp2_dtensor_to_local(dt, &t));
    if (fails)
        return fails;
    fails += RANK_CHECK(c, t->numel == n, "local tensor has %lld elements, want %d",
                        (long long)t->numel, n);
    for (int k = 0; k < n && !fails; k++)
        out[k] = t->dtype == FSDP2_F32 ? (double)((float *)t->data)[k] : ((double *)t->data)[k];
    fsdp2_tensor_release(t);
    return fails;
}

static int read_param(fixture_t *fx, int j, double *out)
{
    fsdp2_dtensor_t *dt = NULL;
    int fails = OK(fx->c, fsdp2_param_sharded(fx->p[j], &dt));
    return fails ? fails : read_dtensor(fx->c, dt, out, numel_of(j));
}

/* Writes grad_value(step) (or zeros with step < 0) into every sharded gradient. */
static int write_grads(fixture_t *fx, int step)
{
    int fails = 0;
    for (int j = 0; j < NP; j++) {
        fsdp2_dtensor_t *dt = NULL;
        fsdp2_tensor_t *t = NULL;
        fails += OK(fx->c, fsdp2_param_sharded_grad(fx->p[j], &dt));
        if (!fails)
            fails += OK(fx->c, fsdp2_dtensor_to_local(dt, &t));
        if (fails)
            return fails;
        for (int k = 0; k < numel_of(j); k++) {
            double g = step < 0 ? 0.0 : grad_value(step, j, k);
            if (t->dtype == FSDP2_F32)
                ((float *)t->data)[k] = (float)g;
            else
                ((double *)t->data)[k] = g;
        }
        fsdp2_tensor_release(t);
    }
    return fails;
}

static int read_state(fixture_t *fx, const fsdp2_optimizer_t *opt, int j, const char *name,
                      double *out)
{
    fsdp2_dtensor_t *dt = NULL;
    int fails = OK(fx->c, fsdp2_optimizer_state(opt, fx->p[j], name, &dt));
    return fails ? fails : read_dtensor(fx->c, dt, out, numel_of(j));
}

/* ---------------------------------------------------------------------------------- */
/* The reference: torch.optim's algorithms as documented, in double                    */

typedef struct ref {
    double p[NP][MAXN];
    double a[NP][MAXN], b[NP][MAXN]; /* state: momentum | exp_avg, exp_avg_sq | square_avg,
                                        acc_delta */
} ref_t;

static void ref_init(ref_t *r)
{
    memset(r, 0, sizeof(*r));
    for (int j = 0; j < NP; j++)
        for (int k = 0; k < numel_of(j); k++)
            r->p[j][k] = init_value(j, k);
}

/* Step t (1-based) of o with gradient g on one element; lr from the caller. */
static void ref_element(const fsdp2_optimizer_options_t *o, double lr, int t, double g, double *p,
                        double *a, double *b)
{
    switch (o->kind) {
    case FSDP2_OPTIMIZER_SGD:
        g += o->weight_decay * *p;
        if (o->momentum != 0) {
            *a = t == 1 ? g : o->momentum * *a + (1 - o->dampening) * g;
            g = o->nesterov ? g + o->momentum * *a : *a;
        }
        *p -= lr * g;
        break;
    case FSDP2_OPTIMIZER_ADAMW: {
        *p *= 1 - lr * o->weight_decay;
        *a = o->beta1 * *a + (1 - o->beta1) * g;
        *b = o->beta2 * *b + (1 - o->beta2) * g * g;
        double m_hat = *a / (1 - pow(o->beta1, t));
        double v_hat = *b / (1 - pow(o->beta2, t));
        *p -= lr * m_hat / (sqrt(v_hat) + o->eps);
        break;
    }
    case FSDP2_OPTIMIZER_ADADELTA: {
        g += o->weight_decay * *p;
        *a = o->rho * *a + (1 - o->rho) * g * g;
        double delta = sqrt(*b + o->eps) / sqrt(*a + o->eps) * g;
        *b = o->rho * *b + (1 - o->rho) * delta * delta;
        *p -= lr * delta;
        break;
    }
    }
}

static void ref_step(ref_t *r, const fsdp2_optimizer_options_t *o, double lr, int t, int step)
{
    for (int j = 0; j < NP; j++)
        for (int k = 0; k < numel_of(j); k++)
            ref_element(o, lr, t, grad_value(step, j, k), &r->p[j][k], &r->a[j][k], &r->b[j][k]);
}

static const char *const STATE_NAMES[3][2] = {
    {"momentum_buffer", NULL}, {"exp_avg", "exp_avg_sq"}, {"square_avg", "acc_delta"}};

static int compare_all(fixture_t *fx, const fsdp2_optimizer_t *opt,
                       const fsdp2_optimizer_options_t *o, const ref_t *r, int step)
{
    int fails = 0;
    double got[MAXN];
    char what[64];
    for (int j = 0; j < NP; j++) {
        fails += read_param(fx, j, got);
        if (!fails)
            fails += compare(fx->c, PARAM[j].fqn, step, got, r->p[j], numel_of(j), 1e-3,
                             TOLERANCE);
        for (int s = 0; s < 2 && !fails; s++) {
            const char *name = STATE_NAMES[o->kind][s];
            if (!name || (o->kind == FSDP2_OPTIMIZER_SGD && o->momentum == 0))
                continue;
            const double *want = s == 0 ? r->a[j] : r->b[j];
            fails += read_state(fx, opt, j, name, got);
            snprintf(what, sizeof(what), "%s %s", PARAM[j].fqn, name);
            if (!fails)
                fails += compare(fx->c, what, step, got, want, numel_of(j),
                                 state_floor(want, numel_of(j)), TOLERANCE);
        }
    }
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Step-by-step against the reference                                                  */

typedef struct rule_case {
    const char *what;
    fsdp2_optimizer_options_t options;
    int steps;
    int halve_lr; /* set_lr(lr / 2) before every step after the first */
} rule_case_t;

static rule_case_t make_case(int i)
{
    fsdp2_optimizer_options_t sgd = FSDP2_SGD_OPTIONS_INIT(0.1);
    fsdp2_optimizer_options_t adamw = FSDP2_ADAMW_OPTIONS_INIT(1e-2);
    fsdp2_optimizer_options_t adadelta = FSDP2_ADADELTA_OPTIONS_INIT(1.0);
    rule_case_t rc = {"", sgd, 6, 0};
    switch (i) {
    case 0:
        rc.what = "sgd";
        break;
    case 1:
        rc.what = "sgd momentum 0.9 dampening 0.3";
        rc.options.momentum = 0.9;
        rc.options.dampening = 0.3;
        break;
    case 2:
        rc.what = "sgd nesterov momentum 0.9 weight_decay 0.01";
        rc.options.momentum = 0.9;
        rc.options.nesterov = 1;
        rc.options.weight_decay = 0.01;
        break;
    case 3:
        rc.what = "sgd weight_decay 0.1";
        rc.options.weight_decay = 0.1;
        break;
    case 4:
        rc.what = "sgd momentum 0.5, lr halved every step";
        rc.options.momentum = 0.5;
        rc.halve_lr = 1;
        break;
    case 5:
        rc.what = "adamw defaults (weight_decay 0.01)";
        rc.options = adamw;
        rc.steps = 10;
        break;
    case 6:
        rc.what = "adamw betas (0.8, 0.95) eps 1e-6 weight_decay 0";
        rc.options = adamw;
        rc.options.beta1 = 0.8;
        rc.options.beta2 = 0.95;
        rc.options.eps = 1e-6;
        rc.options.weight_decay = 0;
        rc.steps = 10;
        break;
    case 7:
        rc.what = "adadelta defaults";
        rc.options = adadelta;
        break;
    case 8:
        rc.what = "adadelta rho 0.8 weight_decay 0.05";
        rc.options = adadelta;
        rc.options.rho = 0.8;
        rc.options.weight_decay = 0.05;
        break;
    case 9: /* 1 - beta1 >= 0.5: torch.lerp's other side */
        rc.what = "adamw beta1 0.3";
        rc.options = adamw;
        rc.options.beta1 = 0.3;
        rc.steps = 10;
        break;
    }
    return rc;
}
#define RULE_CASES 10

static int body_reference(rank_ctx_t *c)
{
    const rule_case_t *rc = c->arg;
    fixture_t fx;
    fsdp2_optimizer_t *opt = NULL;
    int fails = fixture_open(c, &fx);
    if (!fails)
        fails += OK(c, fsdp2_optimizer_create(fx.root, &rc->options, &opt));
    ref_t r;
    ref_init(&r);
    double lr = rc->options.lr;
    for (int s = 0; s < rc->steps && !fails; s++) {
        if (rc->halve_lr && s > 0) {
            lr /= 2;
            fails += OK(c, fsdp2_optimizer_set_lr(opt, lr));
        }
        fails += write_grads(&fx, s);
        fails += OK(c, fsdp2_optimizer_step(opt));
        ref_step(&r, &rc->options, lr, s + 1, s);
        if (!fails)
            fails += compare_all(&fx, opt, &rc->options, &r, s + 1);
    }
    int64_t steps = -1;
    double got_lr = -1;
    if (!fails) {
        fails += OK(c, fsdp2_optimizer_steps(opt, &steps));
        fails += OK(c, fsdp2_optimizer_lr(opt, &got_lr));
        fails += RANK_CHECK(c, steps == rc->steps && got_lr == lr,
                            "%s: steps %lld lr %g after the run, want %d and %g", rc->what,
                            (long long)steps, got_lr, rc->steps, lr);
    }
    if (fails)
        fprintf(stderr, "case: %s\n", rc->what);
    fsdp2_optimizer_destroy(opt);
    return fails + fixture_close(&fx);
}

static void run_one_rank(rank_fn body, void *arg, const char *what)
{
    ranks_result_t res;
    int rc = run_ranks(1, body, arg, GROUP_TIMEOUT_MS, DEADLINE_S, &res);
    ck_assert_msg(rc == 0, "%s: %s (exit code %d; see stderr)", what,
                  res.timed_out ? "timed out" : "failed", res.status[0]);
}

START_TEST(every_rule_matches_its_double_reference_step_by_step)
{
    rule_case_t rc = make_case(_i);
    run_one_rank(body_reference, &rc, rc.what);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Long shards: the vectorised loops give a scalar loop's bits                         */

/* The rules run in vector lanes (SSE2, AVX2 or AVX-512, whichever this CPU has), in
 * chunks of FSDP2_PAR_CHUNK elements on the pool's threads. A shard of LONG_N elements
 * covers two whole chunks, a partial third and a remainder that fills no vector; every
 * element must have the bits of the scalar loop below, which follows torch's single-tensor
 * op order in the tensor's dtype (coefficients in double, rounded once), one element at a
 * time. (The library's other clones run only on CPUs that pick them.) */
#define LONG_N (2 * FSDP2_PAR_CHUNK + 565)
#define LONG_STEPS 3

#define SCALAR_RULE(T, SQRT, name)                                                          \
    static void name(const fsdp2_optimizer_options_t *o, int t, int64_t n, T *p,            \
                     const T *grad, T *a, T *b)                                             \
    {                                                                                       \
        const T lr = (T)o->lr, neg_lr = (T)-o->lr, wd = (T)o->weight_decay;                 \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T g = grad[i];                                                                  \
            if (o->kind == FSDP2_OPTIMIZER_SGD) {                                           \
                if (o->weight_decay != 0)                                                   \
                    g = g + wd * p[i];                                                      \
                if (o->momentum != 0) {                                                     \
                    a[i] = t == 1 ? g                                                       \
                                  : a[i] * (T)o->momentum + (T)(1.0 - o->dampening) * g;    \
                    g = o->nesterov ? g + (T)o->momentum * a[i] : a[i];                     \
                }                                                                           \
                p[i] = p[i] + neg_lr * g;                                                   \
            } else if (o->kind == FSDP2_OPTIMIZER_ADAMW) {                                  \
                T w1 = (T)(1.0 - o->beta1), w2 = (T)(1.0 - o->beta2);                       \
                T pi = p[i] * (T)(1.0 - o->lr * o->weight_decay);                           \
                T m = a[i];                                                                 \
                a[i] = fabs((double)w1) < 0.5 ? m + w1 * (g - m)                            \
                                              : g - (g - m) * ((T)1 - w1);                  \
                b[i] = b[i] * (T)o->beta2 + w2 * g * g;                                     \
                T denom = SQRT(b[i]) / (T)sqrt(1.0 - pow(o->beta2, t)) + (T)o->eps;         \
                p[i] = pi + (T)(-o->lr / (1.0 - pow(o->beta1, t))) * (a[i] / denom);        \
            } else {                                                                        \
                T w = (T)(1.0 - o->rho), eps = (T)o->eps;                                   \
                if (o->weight_decay != 0)                                                   \
                    g = g + wd * p[i];                                                      \
                a[i] = a[i] * (T)o->rho + w * g * g;                                        \
                T delta = SQRT(b[i] + eps) / SQRT(a[i] + eps) * g;                          \
                b[i] = b[i] * (T)o->rho + w * delta * delta;                                \
                p[i] = p[i] + neg_lr * delta;                                               \
            }                                                                               \
        }                                                                                   \
        (void)lr;                                                                           \
    }
SCALAR_RULE(float, sqrtf, scalar_rule_f32)
SCALAR_RULE(double, sqrt, scalar_rule_f64)

static double long_value(int which, int step, int64_t k)
{
    return which == 0 ? 0.5 + 0.25 * sin(0.37 * (double)k)
                      : 0.1 * cos(0.011 * (double)k * (step + 1) + step) - 0.02;
}

/* Writes the tensor's values (which 0: the initial parameter, 1: step's gradient) and
 * keeps a copy in mine. */
static void fill_long(fsdp2_tensor_t *t, int which, int step, void *mine)
{
    for (int64_t k = 0; k < t->numel; k++) {
        double v = long_value(which, step, k);
        if (t->dtype == FSDP2_F32)
            ((float *)t->data)[k] = ((float *)mine)[k] = (float)v;
        else
            ((double *)t->data)[k] = ((double *)mine)[k] = v;
    }
}

/* The first index where n elements of size es differ, or -1. */
static int64_t first_difference(const void *x, const void *y, int64_t n, size_t es)
{
    for (int64_t k = 0; k < n; k++)
        if (memcmp((const char *)x + k * es, (const char *)y + k * es, es) != 0)
            return k;
    return -1;
}

static int body_long(rank_ctx_t *c)
{
    const rule_case_t *rc = c->arg;
    const fsdp2_dtype_t dtypes[2] = {FSDP2_F32, FSDP2_F64};
    const char *names[2] = {"long32", "long64"};
    fsdp2_mesh_t *mesh = NULL;
    fsdp2_module_t *root = NULL;
    fsdp2_optimizer_t *opt = NULL;
    fsdp2_param_t *prm[2] = {NULL, NULL};
    void *mine[2][4] = {{NULL}}; /* parameter, gradient, state a, state b */
    int ws = 1;
    int fails = OK(c, fsdp2_mesh_create(c->store, "long", 0, 1, 1, &ws, NULL, NULL, &mesh));
    fails += OK(c, fsdp2_module_create("", &root));
    for (int d = 0; d < 2 && !fails; d++) {
        int64_t shape[1] = {LONG_N};
        fsdp2_tensor_t *t = NULL;
        size_t es = d == 0 ? sizeof(float) : sizeof(double);
        for (int j = 0; j < 4; j++)
            mine[d][j] = calloc(LONG_N, es);
        fails += RANK_CHECK(c, mine[d][0] && mine[d][1] && mine[d][2] && mine[d][3],
                            "no room for the reference");
        if (!fails)
            fails += OK(c, fsdp2_tensor_empty(CPU, dtypes[d], 1, shape, &t));
        if (fails)
            break;
        fill_long(t, 0, 0, mine[d][0]);
        fsdp2_module_t *child = NULL; /* a group of its own: one dtype per all-gather */
        fails += OK(c, fsdp2_module_create(names[d], &child));
        if (!fails) {
            fails += OK(c, fsdp2_module_add_child(root, child));
            if (fails) /* not the root's: ours to destroy */
                fsdp2_module_destroy(child);
        }
        if (!fails)
            fails += OK(c, fsdp2_module_add_param(child, names[d], t, 1, &prm[d]));
        fsdp2_tensor_release(t);
        fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
        so.mesh = mesh;
        if (!fails)
            fails += OK(c, fsdp2_fully_shard(child, &so));
    }
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    so.mesh = mesh;
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(root, &so));
    fsdp2_optimizer_options_t o = rc->options;
    if (!fails)
        fails += OK(c, fsdp2_optimizer_create(root, &o, &opt));
    for (int s = 0; s < LONG_STEPS && !fails; s++) {
        if (rc->halve_lr && s > 0) {
            o.lr /= 2;
            fails += OK(c, fsdp2_optimizer_set_lr(opt, o.lr));
        }
        for (int d = 0; d < 2 && !fails; d++) {
            fsdp2_dtensor_t *dt = NULL;
            fsdp2_tensor_t *t = NULL;
            fails += OK(c, fsdp2_param_sharded_grad(prm[d], &dt));
            if (!fails)
                fails += OK(c, fsdp2_dtensor_to_local(dt, &t));
            if (!fails)
                fails += RANK_CHECK(c, t->numel == LONG_N, "%s: the local gradient has %lld "
                                    "elements, want %d", names[d], (long long)t->numel, LONG_N);
            if (!fails)
                fill_long(t, 1, s, mine[d][1]);
            fsdp2_tensor_release(t);
        }
        fails += OK(c, fsdp2_optimizer_step(opt));
        if (fails)
            break;
        scalar_rule_f32(&o, s + 1, LONG_N, mine[0][0], mine[0][1], mine[0][2],
                        mine[0][3]);
        scalar_rule_f64(&o, s + 1, LONG_N, mine[1][0], mine[1][1], mine[1][2],
                        mine[1][3]);
        for (int d = 0; d < 2 && !fails; d++) {
            size_t es = d == 0 ? sizeof(float) : sizeof(double);
            for (int j = 0; j < 3 && !fails; j++) {
                const char *state = j == 0 ? NULL : STATE_NAMES[rc->options.kind][j - 1];
                if (j > 0 && (!state || (rc->options.kind == FSDP2_OPTIMIZER_SGD &&
                                         rc->options.momentum == 0)))
                    continue;
                fsdp2_dtensor_t *dt = NULL;
                fsdp2_tensor_t *t = NULL;
                fails += j == 0 ? OK(c, fsdp2_param_sharded(prm[d], &dt))
                                : OK(c, fsdp2_optimizer_state(opt, prm[d], state, &dt));
                if (!fails)
                    fails += OK(c, fsdp2_dtensor_to_local(dt, &t));
                if (!fails)
                    fails += RANK_CHECK(c, t->numel == LONG_N, "%s: %lld local elements, want %d",
                                        names[d], (long long)t->numel, LONG_N);
                if (fails) {
                    fsdp2_tensor_release(t);
                    break;
                }
                const void *want = mine[d][j == 0 ? 0 : j + 1];
                int64_t k = first_difference(t->data, want, LONG_N, es);
                double got_k = k < 0 ? 0
                               : dtypes[d] == FSDP2_F32 ? ((float *)t->data)[k]
                                                        : ((double *)t->data)[k];
                double want_k = k < 0 ? 0
                                : dtypes[d] == FSDP2_F32 ? ((const float *)want)[k]
                                                         : ((const double *)want)[k];
                fails += RANK_CHECK(c, k < 0, "%s: %s %s, step %d: element %lld is %.17g, "
                                    "the scalar loop gives %.17g", rc->what, names[d],
                                    j == 0 ? "value" : state, s + 1, (long long)k, got_k,
                                    want_k);
                fsdp2_tensor_release(t);
            }
        }
    }
    fsdp2_optimizer_destroy(opt);
    if (root) {
        fails += OK(c, fsdp2_module_synchronize(root));
        fails += OK(c, fsdp2_module_destroy(root));
    }
    fails += OK(c, fsdp2_mesh_destroy(mesh));
    for (int d = 0; d < 2; d++)
        for (int j = 0; j < 4; j++)
            free(mine[d][j]);
    return fails;
}

START_TEST(every_rule_on_a_long_shard_gives_the_scalar_loops_bits)
{
    rule_case_t rc = make_case(_i);
    rc.steps = LONG_STEPS;
    run_one_rank(body_long, &rc, rc.what);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Closed forms                                                                        */

static int body_sgd_first_buffer(rank_ctx_t *c)
{
    fixture_t fx;
    fsdp2_optimizer_t *opt = NULL;
    fsdp2_optimizer_options_t o = FSDP2_SGD_OPTIONS_INIT(0.1);
    o.momentum = 0.9;
    o.dampening = 0.3;
    int fails = fixture_open(c, &fx);
    if (!fails)
        fails += OK(c, fsdp2_optimizer_create(fx.root, &o, &opt));
    for (int s = 0; s < 2 && !fails; s++) {
        fails += write_grads(&fx, s);
        fails += OK(c, fsdp2_optimizer_step(opt));
        for (int j = 0; j < NP && !fails; j++) {
            double buf[MAXN], want[MAXN];
            fails += read_state(&fx, opt, j, "momentum_buffer", buf);
            for (int k = 0; k < numel_of(j); k++)
                want[k] = s == 0 ? grad_value(0, j, k)
                                 : 0.9 * grad_value(0, j, k) + 0.7 * grad_value(1, j, k);
            /* Step 1: the buffer is the gradient itself, undamped: bitwise. */
            fails += compare(c, s == 0 ? "first momentum_buffer" : "second momentum_buffer",
                             s + 1, buf, want, numel_of(j), 1e-3, s == 0 ? 0.0 : TOLERANCE);
        }
    }
    fsdp2_optimizer_destroy(opt);
    return fails + fixture_close(&fx);
}

START_TEST(sgd_first_momentum_buffer_is_the_undamped_gradient)
{
    run_one_rank(body_sgd_first_buffer, NULL, "sgd first buffer");
}
END_TEST

/* AdamW with steps_before steps already counted (set_steps) and fresh state: one step
 * moves p by lr * ((1-b1) g / bc1) / (sqrt((1-b2) g^2 / bc2) + eps) with t =
 * steps_before + 1; at t = 1 that is lr * g / (|g| + eps). */
static int body_adamw_bias(rank_ctx_t *c)
{
    int steps_before = *(const int *)c->arg;
    fixture_t fx;
    fsdp2_optimizer_t *opt = NULL;
    fsdp2_optimizer_options_t o = FSDP2_ADAMW_OPTIONS_INIT(1e-2);
    o.weight_decay = 0;
    int fails = fixture_open(c, &fx);
    if (!fails)
        fails += OK(c, fsdp2_optimizer_create(fx.root, &o, &opt));
    if (!fails) { /* the setters refuse negatives and keep the values */
        fails += REFUSED(c, fsdp2_optimizer_set_lr(opt, -2.0), FSDP2_ERR_INVALID_ARGUMENT, "lr -2");
        fails += REFUSED(c, fsdp2_optimizer_set_steps(opt, -3), FSDP2_ERR_INVALID_ARGUMENT,
                         "steps -3");
    }
    if (!fails && steps_before)
        fails += OK(c, fsdp2_optimizer_set_steps(opt, steps_before));
    fails += write_grads(&fx, 0);
    if (!fails)
        fails += OK(c, fsdp2_optimizer_step(opt));
    double t = steps_before + 1;
    for (int j = 0; j < NP && !fails; j++) {
        double got[MAXN], want[MAXN];
        fails += read_param(&fx, j, got);
        for (int k = 0; k < numel_of(j); k++) {
            double g = grad_value(0, j, k);
            double m_hat = (1 - o.beta1) * g / (1 - pow(o.beta1, t));
            double v_hat = (1 - o.beta2) * g * g / (1 - pow(o.beta2, t));
            double move = t == 1 ? g / (fabs(g) + o.eps) : m_hat / (sqrt(v_hat) + o.eps);
            want[k] = init_value(j, k) - o.lr * move;
        }
        fails += compare(c, PARAM[j].fqn, (int)t, got, want, numel_of(j), 1e-3, TOLERANCE);
    }
    int64_t steps = 0;
    fails += OK(c, fsdp2_optimizer_steps(opt, &steps));
    fails += RANK_CHECK(c, steps == steps_before + 1, "steps %lld, want %d", (long long)steps,
                        steps_before + 1);
    fsdp2_optimizer_destroy(opt);
    return fails + fixture_close(&fx);
}

START_TEST(adamw_bias_correction_at_step_1_moves_every_element_by_lr)
{
    int before = 0;
    run_one_rank(body_adamw_bias, &before, "adamw step 1");
}
END_TEST

START_TEST(adamw_bias_correction_at_step_10_after_set_steps)
{
    int before = 9;
    run_one_rank(body_adamw_bias, &before, "adamw step 10");
}
END_TEST

/* Zero gradients, weight decay on. AdamW's decay is decoupled: p shrinks by (1 - lr wd)
 * per step and the moments stay zero. SGD's (and Adadelta's) is L2 added to the
 * gradient: SGD's momentum buffer becomes wd * p. */
static int body_weight_decay(rank_ctx_t *c)
{
    fixture_t fx;
    fsdp2_optimizer_t *adamw = NULL, *sgd = NULL;
    fsdp2_optimizer_options_t oa = FSDP2_ADAMW_OPTIONS_INIT(0.1);
    oa.weight_decay = 0.5;
    fsdp2_optimizer_options_t os = FSDP2_SGD_OPTIONS_INIT(0.1);
    os.momentum = 0.9;
    os.weight_decay = 0.5;
    int fails = fixture_open(c, &fx);
    if (!fails) {
        fails += OK(c, fsdp2_optimizer_create(fx.root, &oa, &adamw));
        fails += OK(c, fsdp2_optimizer_create(fx.root, &os, &sgd));
    }
    fails += write_grads(&fx, -1);
    for (int s = 0; s < 3 && !fails; s++)
        fails += OK(c, fsdp2_optimizer_step(adamw));
    for (int j = 0; j < NP && !fails; j++) {
        double got[MAXN], want[MAXN], zero[MAXN] = {0};
        fails += read_param(&fx, j, got);
        for (int k = 0; k < numel_of(j); k++)
            want[k] = init_value(j, k) * pow(1 - 0.1 * 0.5, 3);
        fails += compare(c, "adamw decayed", 3, got, want, numel_of(j), 1e-3, TOLERANCE);
        fails += read_state(&fx, adamw, j, "exp_avg", got);
        fails += compare(c, "adamw exp_avg under decay alone", 3, got, zero, numel_of(j), 1.0, 0.0);
    }
    /* One SGD step from there: buf = wd * p, p -= lr * buf. */
    double before[NP][MAXN];
    for (int j = 0; j < NP && !fails; j++)
        fails += read_param(&fx, j, before[j]);
    if (!fails)
        fails += OK(c, fsdp2_optimizer_step(sgd));
    for (int j = 0; j < NP && !fails; j++) {
        double got[MAXN], want[MAXN];
        for (int k = 0; k < numel_of(j); k++)
            want[k] = 0.5 * before[j][k];
        fails += read_state(&fx, sgd, j, "momentum_buffer", got);
        fails += compare(c, "sgd momentum_buffer under decay alone", 1, got, want, numel_of(j),
                         1e-3, TOLERANCE);
        for (int k = 0; k < numel_of(j); k++)
            want[k] = before[j][k] * (1 - 0.1 * 0.5);
        fails += read_param(&fx, j, got);
        fails += compare(c, "sgd decayed", 1, got, want, numel_of(j), 1e-3, TOLERANCE);
    }
    fsdp2_optimizer_destroy(adamw);
    fsdp2_optimizer_destroy(sgd);
    return fails + fixture_close(&fx);
}

START_TEST(adamw_decay_is_decoupled_and_sgd_decay_goes_through_the_gradient)
{
    run_one_rank(body_weight_decay, NULL, "weight decay");
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* State, frozen parameters, zero_grad, unsupported dtypes                             */

static int body_state(rank_ctx_t *c)
{
    fixture_t fx;
    fsdp2_optimizer_t *opt = NULL, *plain = NULL;
    fsdp2_optimizer_options_t o = FSDP2_ADAMW_OPTIONS_INIT(1e-3);
    fsdp2_optimizer_options_t os = FSDP2_SGD_OPTIONS_INIT(1e-3);
    int fails = fixture_open(c, &fx);
    if (!fails) {
        fails += OK(c, fsdp2_optimizer_create(fx.root, &o, &opt));
        fails += OK(c, fsdp2_optimizer_create(fx.root, &os, &plain));
    }
    if (fails)
        goto out;
    const char *names[2] = {NULL, NULL};
    size_t count = 0;
    fails += OK(c, fsdp2_optimizer_state_names(opt, names, 1, &count));
    fails += RANK_CHECK(c, count == 2 && names[0] && !strcmp(names[0], "exp_avg") && !names[1],
                        "adamw state names: %zu, first '%s'", count, names[0] ? names[0] : "");
    fails += OK(c, fsdp2_optimizer_state_names(opt, names, 2, &count));
    fails += RANK_CHECK(c, count == 2 && names[1] && !strcmp(names[1], "exp_avg_sq"),
                        "adamw second state name '%s'", names[1] ? names[1] : "");
    fails += OK(c, fsdp2_optimizer_state_names(plain, NULL, 0, &count));
    fails += RANK_CHECK(c, count == 0, "sgd without momentum keeps %zu states, want 0", count);
    fsdp2_dtensor_t *dt = NULL;
    fails += REFUSED(c, fsdp2_optimizer_state(plain, fx.p[0], "momentum_buffer", &dt),
                     FSDP2_ERR_NOT_FOUND, "momentum_buffer");
    for (int j = 0; j < NP; j++) {
        for (int s = 0; s < 2; s++) {
            fails += OK(c, fsdp2_optimizer_state(opt, fx.p[j], STATE_NAMES[1][s], &dt));
            if (fails)
                goto out;
            fsdp2_dtensor_info_t info;
            fsdp2_mesh_t *mesh = NULL;
            fails += OK(c, fsdp2_dtensor_info(dt, &info));
            fails += OK(c, fsdp2_dtensor_mesh(dt, &mesh));
            int same = info.ndim == PARAM[j].ndim && info.dtype == PARAM[j].dtype &&
                       mesh == fx.mesh && info.mesh_ndim == 1 &&
                       info.placements[0].type == FSDP2_PLACEMENT_SHARD &&
                       info.placements[0].dim == 0;
            for (int d = 0; d < PARAM[j].ndim; d++)
                same = same && info.shape[d] == PARAM[j].shape[d];
            fails += RANK_CHECK(c, same, "%s %s: %d-D %s [%lld,...], not laid out like the "
                                "parameter", PARAM[j].fqn, STATE_NAMES[1][s], info.ndim,
                                fsdp2_dtype_name(info.dtype), (long long)info.shape[0]);
        }
    }
    fails += REFUSED(c, fsdp2_optimizer_state(opt, fx.p[0], "momentum_buffer", &dt),
                     FSDP2_ERR_NOT_FOUND, "lin.weight");
    fails += REFUSED(c, fsdp2_optimizer_state(opt, fx.p[0], "momentum_buffer", &dt),
                     FSDP2_ERR_NOT_FOUND, "momentum_buffer");
    fails += RANK_CHECK(c, dt == NULL, "a refused state lookup left a DTensor");
    /* The frozen parameter: no state, never changed. */
    fails += REFUSED(c, fsdp2_optimizer_state(opt, fx.frozen, "exp_avg", &dt), FSDP2_ERR_NOT_FOUND,
                     "scale");
    fails += write_grads(&fx, 0);
    for (int s = 0; s < 3 && !fails; s++)
        fails += OK(c, fsdp2_optimizer_step(opt));
    fsdp2_dtensor_t *frozen = NULL;
    fails += OK(c, fsdp2_param_sharded(fx.frozen, &frozen));
    double got[2] = {0, 0}, want[2] = {1.0, 2.0};
    if (!fails)
        fails += read_dtensor(c, frozen, got, 2);
    fails += compare(c, "frozen scale", 3, got, want, 2, 1.0, 0.0);
    /* zero_grad zeroes every sharded gradient. */
    fails += OK(c, fsdp2_optimizer_zero_grad(opt));
    for (int j = 0; j < NP && !fails; j++) {
        fsdp2_dtensor_t *g = NULL;
        double v[MAXN], zero[MAXN] = {0};
        fails += OK(c, fsdp2_param_sharded_grad(fx.p[j], &g));
        if (!fails)
            fails += read_dtensor(c, g, v, numel_of(j));
        fails += compare(c, "gradient after zero_grad", 3, v, zero, numel_of(j), 1.0, 0.0);
    }
out:
    fsdp2_optimizer_destroy(opt);
    fsdp2_optimizer_destroy(plain);
    return fails + fixture_close(&fx);
}

START_TEST(state_is_named_as_torch_laid_out_like_the_parameter_and_frozen_params_have_none)
{
    run_one_rank(body_state, NULL, "state");
}
END_TEST

static int body_bf16(rank_ctx_t *c)
{
    fixture_t fx;
    memset(&fx, 0, sizeof(fx));
    fx.c = c;
    int ws = 1;
    int fails = OK(c, fsdp2_mesh_create(c->store, "bf16", 0, 1, 1, &ws, NULL, NULL, &fx.mesh));
    fails += OK(c, fsdp2_module_create("", &fx.root));
    int64_t shape[1] = {4};
    fsdp2_param_t *p = NULL;
    if (!fails)
        fails += OK(c, declare(fx.root, "half", FSDP2_BF16, 1, shape, -1, 1, &p));
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    so.mesh = fx.mesh;
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(fx.root, &so));
    fsdp2_optimizer_options_t o = FSDP2_SGD_OPTIONS_INIT(0.1);
    fsdp2_optimizer_t *opt = NULL;
    if (!fails) {
        fails += REFUSED(c, fsdp2_optimizer_create(fx.root, &o, &opt), FSDP2_ERR_UNSUPPORTED,
                         "half");
        fails += REFUSED(c, fsdp2_optimizer_create(fx.root, &o, &opt), FSDP2_ERR_UNSUPPORTED,
                         "bf16");
        fails += RANK_CHECK(c, opt == NULL, "a refused create left an optimizer");
        fails += REFUSED(c, fsdp2_clip_grad_norm(fx.root, 1.0, 2.0, NULL), FSDP2_ERR_UNSUPPORTED,
                         "half");
    }
    return fails + fixture_close(&fx);
}

START_TEST(bf16_shards_are_unsupported_naming_the_parameter)
{
    run_one_rank(body_bf16, NULL, "bf16");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("optim_rules");
    TCase *tc = tcase_create("rules");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, every_rule_matches_its_double_reference_step_by_step, 0, RULE_CASES);
    tcase_add_loop_test(tc, every_rule_on_a_long_shard_gives_the_scalar_loops_bits, 0, RULE_CASES);
    tcase_add_test(tc, sgd_first_momentum_buffer_is_the_undamped_gradient);
    tcase_add_test(tc, adamw_bias_correction_at_step_1_moves_every_element_by_lr);
    tcase_add_test(tc, adamw_bias_correction_at_step_10_after_set_steps);
    tcase_add_test(tc, adamw_decay_is_decoupled_and_sgd_decay_goes_through_the_gradient);
    tcase_add_test(tc, state_is_named_as_torch_laid_out_like_the_parameter_and_frozen_params_have_none);
    tcase_add_test(tc, bf16_shards_are_unsupported_naming_the_parameter);
    suite_add_tcase(s, tc);

    return s;
}

FSDP2_CHECK_MAIN(suite)
