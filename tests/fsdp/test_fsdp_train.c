/* fully_shard training with real processes: 1, 2, 3 and 4 ranks on a 1D mesh.
 *
 * The model is a 3-layer MLP with uneven shapes (13 -> 7 -> 5 -> 3, tanh between), so
 * every way torch.chunk can split rows shows up: 7 rows over 4 ranks are 2,2,2,1, 5 are
 * 2,2,1,0 and fc3's 3 rows leave rank 3 with nothing. The loss is
 * 0.5 * mean over samples of sum (out - target)^2.
 *
 * The reference is plain SGD on one process over the whole batch, written here with C
 * arrays (no library call). Each rank trains on its own 24 / ws samples of the same
 * 24-sample batch: the mean of the ranks' gradients is then the gradient of the whole
 * batch, so the sharded run must match the reference for every ws. (Giving every rank
 * the same samples would make a missing reduce-scatter invisible: the average of equal
 * gradients is any one of them.) Values are compared through fsdp2_dtensor_full_tensor
 * with a relative tolerance of 1e-5 (relative to max(|ref|, 1e-3)); initialisation is
 * compared bitwise.
 *
 * Each rank body returns its number of failures and prints what failed; a rank that
 * fails leaves the others to fail by the group timeout (20 s) instead of hanging. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp.h>

#include "../collectives/ranks.h"
#include "../core/check_main.h"

#define LAYERS 3
#define MAX_IN 13
#define MAX_OUT 7
#define SAMPLES 24 /* divisible by 1..4, and by 2 * ws for the micro-batches */
#define STEPS 5
#define LR 0.1f
#define TOLERANCE 1e-5
#define GROUP_TIMEOUT_MS 20000
#define DEADLINE_S 120

static const int DIM[LAYERS + 1] = {13, 7, 5, 3};
static const char *const LAYER_NAME[LAYERS] = {"fc1", "fc2", "fc3"};

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;
static const fsdp2_device_t META = FSDP2_DEVICE_META_INIT;

static int check_ok(const rank_ctx_t *c, fsdp2_status_t s, const char *expr, int line)
{
    if (s == FSDP2_SUCCESS)
        return 0;
    fprintf(stderr, "rank %d/%d: %s:%d: %s = %s (%s)\n", c->rank, c->size, __FILE__, line, expr,
            fsdp2_status_name(s), fsdp2_last_error());
    return 1;
}
#define OK(c, call) check_ok((c), (call), #call, __LINE__)

/* call must fail with `want` (0: any error) and fsdp2_last_error() must name `needle`. */
static int check_refused(const rank_ctx_t *c, fsdp2_status_t s, fsdp2_status_t want,
                         const char *needle, const char *expr, int line)
{
    const char *msg = fsdp2_last_error();
    int bad = s == FSDP2_SUCCESS || (want != FSDP2_SUCCESS && s != want) ||
              (needle && !strstr(msg, needle));
    if (!bad)
        return 0;
    fprintf(stderr, "rank %d/%d: %s:%d: %s = %s, want %s with a message naming '%s'; got '%s'\n",
            c->rank, c->size, __FILE__, line, expr, fsdp2_status_name(s),
            want == FSDP2_SUCCESS ? "an error" : fsdp2_status_name(want), needle ? needle : "",
            s == FSDP2_SUCCESS ? "" : msg);
    return 1;
}
#define REFUSED(c, call, want, needle) check_refused((c), (call), (want), (needle), #call, __LINE__)

/* ---------------------------------------------------------------------------------- */
/* The model and its data, as formulas                                                 */

static float weight_init(int layer, int64_t flat)
{
    return (float)(0.3 * sin(0.7 * (double)flat + layer + 1));
}

static float bias_init(int layer, int64_t row)
{
    return (float)(0.1 * cos(1.3 * (double)row + layer + 1));
}

static double input_value(int sample, int j)
{
    return sin(0.3 * sample + 0.11 * j + 0.5);
}

static double target_value(int sample, int k)
{
    return 0.5 * cos(0.2 * sample + 0.7 * k);
}

/* torch.chunk's rows for piece r of ws, written out independently of the library. */
static void chunk_rows(int64_t n, int ws, int r, int64_t *off, int64_t *len)
{
    int64_t chunk = (n + ws - 1) / ws;
    int64_t s = r * chunk < n ? r * chunk : n;
    int64_t e = (r + 1) * chunk < n ? (r + 1) * chunk : n;
    *off = s;
    *len = e - s;
}

/* ---------------------------------------------------------------------------------- */
/* The math, in plain C: used by the ranks on the library's whole parameters and by the  */
/* one-process reference on its own arrays.                                             */

/* y[s] = W x[s] + b, then tanh for hidden layers. */
static void layer_forward(const float *W, const float *b, int in, int out, int n,
                          const double *x, double *y, int hidden)
{
    for (int s = 0; s < n; s++) {
        for (int o = 0; o < out; o++) {
            double z = b[o];
            for (int i = 0; i < in; i++)
                z += (double)W[o * in + i] * x[s * in + i];
            y[s * out + o] = hidden ? tanh(z) : z;
        }
    }
}

/* delta = dL/dz [n][out]. Adds dW [out][in] and db [out]; dx [n][in] = delta W (if dx). */
static void layer_backward(const float *W, int in, int out, int n, const double *x,
                           const double *delta, double *dW, double *db, double *dx)
{
    for (int s = 0; s < n; s++) {
        for (int o = 0; o < out; o++) {
            double d = delta[s * out + o];
            db[o] += d;
            for (int i = 0; i < in; i++)
                dW[o * in + i] += d * x[s * in + i];
        }
        if (!dx)
            continue;
        for (int i = 0; i < in; i++) {
            double v = 0;
            for (int o = 0; o < out; o++)
                v += delta[s * out + o] * (double)W[o * in + i];
            dx[s * in + i] = v;
        }
    }
}

typedef struct work {
    double act[LAYERS + 1][SAMPLES * MAX_IN]; /* act[l]: input of layer l; act[3]: output */
    double delta[SAMPLES * MAX_IN], dx[SAMPLES * MAX_IN];
    double dW[MAX_OUT * MAX_IN], db[MAX_OUT];
} work_t;

static void load_inputs(work_t *w, const int *samples, int n)
{
    for (int s = 0; s < n; s++)
        for (int j = 0; j < DIM[0]; j++)
            w->act[0][s * DIM[0] + j] = input_value(samples[s], j);
}

/* dL/dout for loss 0.5 * mean_s sum_k (out - target)^2. */
static void output_delta(work_t *w, const int *samples, int n)
{
    for (int s = 0; s < n; s++)
        for (int k = 0; k < DIM[LAYERS]; k++)
            w->delta[s * DIM[LAYERS] + k] =
                (w->act[LAYERS][s * DIM[LAYERS] + k] - target_value(samples[s], k)) / n;
}

/* delta of layer l-1's pre-activation from dx of layer l (act[l] = tanh(z)). */
static void hidden_delta(work_t *w, int l, int n)
{
    for (int k = 0; k < n * DIM[l]; k++)
        w->delta[k] = w->dx[k] * (1.0 - w->act[l][k] * w->act[l][k]);
}

typedef struct ref_model {
    float w[LAYERS][MAX_OUT * MAX_IN], b[LAYERS][MAX_OUT];
    double gw[LAYERS][MAX_OUT * MAX_IN], gb[LAYERS][MAX_OUT];
    int frozen_bias[LAYERS];
} ref_model_t;

static void ref_init(ref_model_t *ref)
{
    memset(ref, 0, sizeof(*ref));
    for (int l = 0; l < LAYERS; l++) {
        for (int k = 0; k < DIM[l + 1] * DIM[l]; k++)
            ref->w[l][k] = weight_init(l, k);
        for (int k = 0; k < DIM[l + 1]; k++)
            ref->b[l][k] = bias_init(l, k);
    }
}

/* Adds the gradient of 0.5 * mean over `samples` into ref's gradients. */
static void ref_accumulate(ref_model_t *ref, work_t *w, const int *samples, int n)
{
    load_inputs(w, samples, n);
    for (int l = 0; l < LAYERS; l++)
        layer_forward(ref->w[l], ref->b[l], DIM[l], DIM[l + 1], n, w->act[l], w->act[l + 1],
                      l < LAYERS - 1);
    output_delta(w, samples, n);
    for (int l = LAYERS - 1; l >= 0; l--) {
        double db[MAX_OUT] = {0};
        layer_backward(ref->w[l], DIM[l], DIM[l + 1], n, w->act[l], w->delta, ref->gw[l], db,
                       l > 0 ? w->dx : NULL);
        if (!ref->frozen_bias[l])
            for (int o = 0; o < DIM[l + 1]; o++)
                ref->gb[l][o] += db[o];
        if (l > 0)
            hidden_delta(w, l, n);
    }
}

/* The gradients as the library stores them (f32), then w -= lr * g. */
static void ref_sgd(ref_model_t *ref)
{
    for (int l = 0; l < LAYERS; l++) {
        for (int k = 0; k < DIM[l + 1] * DIM[l]; k++)
            ref->w[l][k] -= LR * (float)ref->gw[l][k];
        for (int k = 0; k < DIM[l + 1] && !ref->frozen_bias[l]; k++)
            ref->b[l][k] -= LR * (float)ref->gb[l][k];
    }
    memset(ref->gw, 0, sizeof(ref->gw));
    memset(ref->gb, 0, sizeof(ref->gb));
}

/* ---------------------------------------------------------------------------------- */
/* The sharded run                                                                     */

typedef enum probe_point {
    PROBE_STEP_START,      /* before fsdp2_pre_forward(root) */
    PROBE_PRE_FORWARD,     /* after fsdp2_pre_forward(fc[layer]) */
    PROBE_POST_FORWARD,    /* after fsdp2_post_forward(fc[layer]) */
    PROBE_BACKWARD_START,  /* before fsdp2_pre_backward(root) */
    PROBE_PRE_BACKWARD,    /* after fsdp2_pre_backward(fc[layer]) */
    PROBE_POST_BACKWARD,   /* after fsdp2_post_backward(fc[layer]) */
    PROBE_OPTIMIZED,       /* after the optimizer and zero_grad, before the comparison */
    PROBE_STEP_END,        /* after the comparison */
} probe_point_t;

typedef struct build_options {
    int meta;                  /* declare on meta instead of cpu */
    int frozen_fc2_bias;       /* fc2.bias declared with requires_grad = 0 */
    int reshard_after_forward; /* the options' field */
    int unsharded_buffers;     /* the options' field */
    int random_init;           /* fsdp2_param_set_random_init on every parameter */
} build_options_t;

#define BUILD_DEFAULT {0, 0, 1, 2, 0}

typedef struct run run_t;
typedef int (*probe_fn)(run_t *r, probe_point_t at, int layer);

struct run {
    rank_ctx_t *c;
    fsdp2_mesh_t *mesh;
    fsdp2_shard_options_t opts;
    fsdp2_module_t *root;
    fsdp2_module_t *fc[LAYERS];
    fsdp2_param_t *p[LAYERS][2]; /* [l][0] weight, [l][1] bias */
    int frozen_bias[LAYERS];
    uint64_t declared_bytes;     /* cpu bytes of the declared values */
    uint64_t allocated_before_shard, allocated_after_shard;
    int step;
    int grads_start_at_zero; /* 0 while a no-sync accumulator holds earlier micro-batches */
    probe_fn probe;
    uint64_t saved[LAYERS]; /* probe scratch */
    uint64_t planned_allocated;
    work_t work;
};

static uint64_t cpu_allocated(run_t *r, uint64_t *peak)
{
    fsdp2_memory_stats_t st;
    memset(&st, 0, sizeof(st));
    OK(r->c, fsdp2_memory_stats_get(CPU, &st));
    if (peak)
        *peak = st.peak_allocated_bytes;
    return st.allocated_bytes;
}

static fsdp2_module_state_t state_of(run_t *r, const fsdp2_module_t *m)
{
    fsdp2_module_state_t st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    OK(r->c, fsdp2_module_state(m, &st));
    return st;
}

static const char *unshard_state_name(fsdp2_unshard_state_t s)
{
    switch (s) {
    case FSDP2_SHARDED: return "SHARDED";
    case FSDP2_UNSHARDING: return "UNSHARDING";
    case FSDP2_UNSHARDED: return "UNSHARDED";
    }
    return "?";
}

static int probe(run_t *r, probe_point_t at, int layer)
{
    return r->probe ? r->probe(r, at, layer) : 0;
}

static void local_samples(const run_t *r, int micro, int micros, int *samples, int *n)
{
    int per_rank = SAMPLES / r->c->size, per_micro = per_rank / micros;
    *n = per_micro;
    for (int s = 0; s < per_micro; s++)
        samples[s] = r->c->rank * per_rank + micro * per_micro + s;
}

/* The samples of micro-batch `micro` over every rank: what the reference trains on. */
static void global_samples(int ws, int micro, int micros, int *samples, int *n)
{
    int per_rank = SAMPLES / ws, per_micro = per_rank / micros;
    *n = 0;
    for (int rank = 0; rank < ws; rank++)
        for (int s = 0; s < per_micro; s++)
            samples[(*n)++] = rank * per_rank + micro * per_micro + s;
}

static int run_open(rank_ctx_t *c, run_t *r)
{
    memset(r, 0, sizeof(*r));
    r->c = c;
    r->grads_start_at_zero = 1;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = GROUP_TIMEOUT_MS; /* a rank that fails early must not hang the others */
    int ws = c->size;
    return OK(c, fsdp2_mesh_create(c->store, "fsdp", c->rank, c->size, 1, &ws, NULL, &go,
                                   &r->mesh));
}

static int run_close(run_t *r)
{
    int fails = 0;
    if (r->root) {
        fails += OK(r->c, fsdp2_module_synchronize(r->root));
        fails += OK(r->c, fsdp2_module_destroy(r->root));
    }
    fails += OK(r->c, fsdp2_mesh_destroy(r->mesh));
    return fails;
}

static fsdp2_tensor_t *declared_value(run_t *r, const build_options_t *bo, int l, int kind)
{
    int64_t shape[2] = {DIM[l + 1], DIM[l]};
    fsdp2_tensor_t *t = NULL;
    if (OK(r->c, fsdp2_tensor_empty(bo->meta ? META : CPU, FSDP2_F32, kind ? 1 : 2, shape, &t)))
        return NULL;
    if (!bo->meta) {
        float *v = t->data;
        for (int64_t k = 0; k < t->numel; k++)
            v[k] = kind ? bias_init(l, k) : weight_init(l, k);
        r->declared_bytes += t->nbytes;
    }
    return t;
}

static fsdp2_random_init_t random_init_of(int l, int kind)
{
    fsdp2_random_init_t init = FSDP2_RANDOM_NORMAL_INIT(1000 + 10 * l + kind, 0.0, 0.1);
    return init;
}

/* Builds the tree (root "" with fc1..fc3, each "weight" and "bias") and shards fc1, fc2,
 * fc3, then the root. */
static int build_model(run_t *r, const build_options_t *bo)
{
    rank_ctx_t *c = r->c;
    int fails = OK(c, fsdp2_module_create("", &r->root));
    if (fails)
        return fails;
    for (int l = 0; l < LAYERS && !fails; l++) {
        fails += OK(c, fsdp2_module_create(LAYER_NAME[l], &r->fc[l]));
        if (fails)
            break;
        fails += OK(c, fsdp2_module_add_child(r->root, r->fc[l]));
        r->frozen_bias[l] = bo->frozen_fc2_bias && l == 1;
        for (int kind = 0; kind < 2 && !fails; kind++) {
            fsdp2_tensor_t *t = declared_value(r, bo, l, kind);
            if (!t)
                return fails + 1;
            int requires_grad = !(kind == 1 && r->frozen_bias[l]);
            fails += OK(c, fsdp2_module_add_param(r->fc[l], kind ? "bias" : "weight", t,
                                                  requires_grad, &r->p[l][kind]));
            fsdp2_tensor_release(t); /* the module keeps its own reference */
            if (bo->random_init && !fails) {
                fsdp2_random_init_t init = random_init_of(l, kind);
                fails += OK(c, fsdp2_param_set_random_init(r->p[l][kind], &init));
            }
        }
    }
    if (fails)
        return fails;
    fsdp2_shard_options_t opts = FSDP2_SHARD_OPTIONS_INIT;
    opts.mesh = r->mesh;
    opts.reshard_after_forward = bo->reshard_after_forward;
    opts.unsharded_buffers = bo->unsharded_buffers;
    r->opts = opts;
    r->allocated_before_shard = cpu_allocated(r, NULL);
    for (int l = 0; l < LAYERS && !fails; l++)
        fails += OK(c, fsdp2_fully_shard(r->fc[l], &r->opts));
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(r->root, &r->opts));
    r->allocated_after_shard = cpu_allocated(r, NULL);
    return fails;
}

static int unsharded_view(run_t *r, int l, int kind, float **data)
{
    fsdp2_tensor_t *t = NULL;
    int fails = OK(r->c, fsdp2_param_unsharded(r->p[l][kind], &t));
    if (fails)
        return fails;
    int64_t rows = DIM[l + 1], cols = kind ? 0 : DIM[l];
    fails += RANK_CHECK(r->c, t && t->dtype == FSDP2_F32 && t->ndim == (kind ? 1 : 2) &&
                                  t->shape[0] == rows && (kind || t->shape[1] == cols) && t->data,
                        "step %d: %s.%s unsharded is %d-D [%lld,%lld], want [%lld,%lld]", r->step,
                        LAYER_NAME[l], kind ? "bias" : "weight", t ? t->ndim : -1,
                        t ? (long long)t->shape[0] : -1, t ? (long long)t->shape[1] : -1,
                        (long long)rows, (long long)cols);
    *data = fails ? NULL : t->data;
    return fails;
}

/* Forward over this rank's samples; activations in r->work. */
static int forward(run_t *r, const int *samples, int n)
{
    rank_ctx_t *c = r->c;
    work_t *w = &r->work;
    int fails = probe(r, PROBE_STEP_START, -1);
    fails += OK(c, fsdp2_pre_forward(r->root));
    if (fails)
        return fails;
    load_inputs(w, samples, n);
    for (int l = 0; l < LAYERS; l++) {
        fails += OK(c, fsdp2_pre_forward(r->fc[l]));
        if (fails)
            return fails;
        fails += probe(r, PROBE_PRE_FORWARD, l);
        float *W = NULL, *b = NULL;
        fails += unsharded_view(r, l, 0, &W);
        fails += unsharded_view(r, l, 1, &b);
        if (fails)
            return fails;
        layer_forward(W, b, DIM[l], DIM[l + 1], n, w->act[l], w->act[l + 1], l < LAYERS - 1);
        fails += OK(c, fsdp2_post_forward(r->fc[l]));
        fails += probe(r, PROBE_POST_FORWARD, l);
        if (fails)
            return fails;
    }
    return fails + OK(c, fsdp2_post_forward(r->root));
}

/* Adds v into the library's gradient view after checking it was zeroed by pre_backward. */
static int add_grad(run_t *r, int l, int kind, const double *v)
{
    fsdp2_tensor_t *g = NULL;
    int fails = OK(r->c, fsdp2_param_grad(r->p[l][kind], &g));
    if (fails)
        return fails;
    int64_t numel = (int64_t)DIM[l + 1] * (kind ? 1 : DIM[l]);
    fails += RANK_CHECK(r->c, g && g->numel == numel && g->dtype == FSDP2_F32 && g->data,
                        "step %d: %s.%s grad has %lld elements, want %lld", r->step,
                        LAYER_NAME[l], kind ? "bias" : "weight", g ? (long long)g->numel : -1,
                        (long long)numel);
    if (fails)
        return fails;
    float *gd = g->data;
    int64_t nonzero = -1;
    for (int64_t k = 0; k < numel; k++) {
        if (gd[k] != 0.0f && nonzero < 0)
            nonzero = k;
        gd[k] += (float)v[k];
    }
    fails += RANK_CHECK(r->c, nonzero < 0 || !r->grads_start_at_zero,
                        "step %d: %s.%s grad[%lld] was not zero after pre_backward",
                        r->step, LAYER_NAME[l], kind ? "bias" : "weight", (long long)nonzero);
    return fails;
}

static int backward(run_t *r, const int *samples, int n)
{
    rank_ctx_t *c = r->c;
    work_t *w = &r->work;
    int fails = probe(r, PROBE_BACKWARD_START, -1);
    fails += OK(c, fsdp2_pre_backward(r->root));
    if (fails)
        return fails;
    output_delta(w, samples, n);
    for (int l = LAYERS - 1; l >= 0; l--) {
        fails += OK(c, fsdp2_pre_backward(r->fc[l]));
        if (fails)
            return fails;
        fails += probe(r, PROBE_PRE_BACKWARD, l);
        float *W = NULL;
        fails += unsharded_view(r, l, 0, &W);
        if (fails)
            return fails;
        memset(w->dW, 0, sizeof(w->dW));
        memset(w->db, 0, sizeof(w->db));
        layer_backward(W, DIM[l], DIM[l + 1], n, w->act[l], w->delta, w->dW, w->db,
                       l > 0 ? w->dx : NULL);
        fails += add_grad(r, l, 0, w->dW);
        if (!r->frozen_bias[l])
            fails += add_grad(r, l, 1, w->db);
        fails += OK(c, fsdp2_post_backward(r->fc[l]));
        fails += probe(r, PROBE_POST_BACKWARD, l);
        if (fails)
            return fails;
        if (l > 0)
            hidden_delta(w, l, n);
    }
    fails += OK(c, fsdp2_post_backward(r->root));
    return fails + OK(c, fsdp2_backward_finish(r->root));
}

/* Plain SGD on the local shards, then zero_grad. */
static int sgd(run_t *r)
{
    rank_ctx_t *c = r->c;
    int fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        for (int kind = 0; kind < 2; kind++) {
            if (kind == 1 && r->frozen_bias[l])
                continue;
            fsdp2_dtensor_t *param = NULL, *grad = NULL;
            fsdp2_tensor_t *pl = NULL, *gl = NULL;
            fails += OK(c, fsdp2_param_sharded(r->p[l][kind], &param));
            fails += OK(c, fsdp2_param_sharded_grad(r->p[l][kind], &grad));
            if (fails || !param || !grad)
                return fails + RANK_CHECK(c, param && grad, "%s: no sharded param or grad",
                                          LAYER_NAME[l]);
            fails += OK(c, fsdp2_dtensor_to_local(param, &pl));
            fails += OK(c, fsdp2_dtensor_to_local(grad, &gl));
            if (!fails)
                fails += RANK_CHECK(c, pl->numel == gl->numel, "%s.%s local param %lld vs grad %lld",
                                    LAYER_NAME[l], kind ? "bias" : "weight", (long long)pl->numel,
                                    (long long)gl->numel);
            if (!fails) {
                float *wv = pl->data;
                const float *gv = gl->data;
                for (int64_t k = 0; k < pl->numel; k++)
                    wv[k] -= LR * gv[k];
            }
            fsdp2_tensor_release(pl);
            fsdp2_tensor_release(gl);
            if (fails)
                return fails;
        }
    }
    return fails + OK(c, fsdp2_module_zero_grad(r->root));
}

/* Largest relative error (to max(|want|, 1e-3)) of got against want; prints the worst. */
static int compare_values(run_t *r, const char *what, const float *got, const float *want,
                          int64_t n, double tolerance)
{
    double worst = 0;
    int64_t at = -1;
    for (int64_t k = 0; k < n; k++) {
        double den = fabs((double)want[k]) > 1e-3 ? fabs((double)want[k]) : 1e-3;
        double e = fabs((double)got[k] - (double)want[k]) / den;
        if (isnan(e) || e > worst) {
            worst = isnan(e) ? INFINITY : e;
            at = k;
        }
    }
    return RANK_CHECK(r->c, worst <= tolerance,
                      "step %d: %s[%lld] is %.9g, reference %.9g (relative error %.3g > %.0e)",
                      r->step, what, (long long)at, at >= 0 ? got[at] : 0.0,
                      at >= 0 ? want[at] : 0.0, worst, tolerance);
}

/* Gathers a parameter (or its sharded gradient) whole and compares it with want. */
static int compare_full(run_t *r, int l, int kind, int grad, const float *want, double tolerance)
{
    rank_ctx_t *c = r->c;
    char what[64];
    snprintf(what, sizeof(what), "%s.%s%s", LAYER_NAME[l], kind ? "bias" : "weight",
             grad ? " grad" : "");
    fsdp2_dtensor_t *dt = NULL;
    int fails = grad ? OK(c, fsdp2_param_sharded_grad(r->p[l][kind], &dt))
                     : OK(c, fsdp2_param_sharded(r->p[l][kind], &dt));
    if (fails || !dt)
        return fails + RANK_CHECK(c, dt != NULL, "%s: no DTensor", what);
    fsdp2_tensor_t *full = NULL;
    fails += OK(c, fsdp2_dtensor_full_tensor(dt, NULL, &full));
    if (fails)
        return fails;
    int64_t numel = (int64_t)DIM[l + 1] * (kind ? 1 : DIM[l]);
    fails += RANK_CHECK(c, full->numel == numel && full->dtype == FSDP2_F32,
                        "%s: full tensor has %lld elements of %s, want %lld f32", what,
                        (long long)full->numel, fsdp2_dtype_name(full->dtype), (long long)numel);
    if (!fails)
        fails += compare_values(r, what, full->data, want, numel, tolerance);
    fsdp2_tensor_release(full);
    return fails;
}

static int compare_params(run_t *r, const ref_model_t *ref)
{
    int fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        fails += compare_full(r, l, 0, 0, ref->w[l], TOLERANCE);
        fails += compare_full(r, l, 1, 0, ref->b[l], TOLERANCE);
    }
    return fails;
}

static int compare_grads(run_t *r, const ref_model_t *ref)
{
    int fails = 0;
    float want[MAX_OUT * MAX_IN];
    for (int l = 0; l < LAYERS; l++) {
        for (int k = 0; k < DIM[l + 1] * DIM[l]; k++)
            want[k] = (float)ref->gw[l][k];
        fails += compare_full(r, l, 0, 1, want, TOLERANCE);
        if (r->frozen_bias[l])
            continue;
        for (int k = 0; k < DIM[l + 1]; k++)
            want[k] = (float)ref->gb[l][k];
        fails += compare_full(r, l, 1, 1, want, TOLERANCE);
    }
    return fails;
}

/* `steps` full-batch steps on the sharded model and on the reference, compared after
 * each (gradients too when check_grads). */
static int train(run_t *r, ref_model_t *ref, int first_step, int steps, int check_grads)
{
    int samples[SAMPLES], n, all[SAMPLES], n_all;
    local_samples(r, 0, 1, samples, &n);
    global_samples(r->c->size, 0, 1, all, &n_all);
    work_t *refwork = malloc(sizeof(*refwork));
    int fails = 0;
    for (int s = first_step; s < first_step + steps && !fails; s++) {
        r->step = s;
        fails += forward(r, samples, n);
        if (!fails)
            fails += backward(r, samples, n);
        if (fails)
            break;
        ref_accumulate(ref, refwork, all, n_all);
        if (check_grads)
            fails += compare_grads(r, ref);
        fails += sgd(r);
        ref_sgd(ref);
        fails += probe(r, PROBE_OPTIMIZED, -1);
        fails += compare_params(r, ref);
        fails += probe(r, PROBE_STEP_END, -1);
    }
    free(refwork);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Rank bodies                                                                         */

/* Default probe of the plain run: the training states, and that the default
 * reshard_after_forward frees fc1's parameters at its post_forward. */
static int probe_states(run_t *r, probe_point_t at, int layer)
{
    if (layer < 0)
        return 0;
    fsdp2_module_state_t st = state_of(r, r->fc[layer]);
    fsdp2_training_state_t want_ts = FSDP2_STATE_IDLE;
    switch (at) {
    case PROBE_PRE_FORWARD: want_ts = FSDP2_STATE_FORWARD; break;
    case PROBE_POST_FORWARD: want_ts = FSDP2_STATE_AFTER_FORWARD; break;
    case PROBE_PRE_BACKWARD: want_ts = FSDP2_STATE_BACKWARD; break;
    case PROBE_POST_BACKWARD: want_ts = FSDP2_STATE_AFTER_BACKWARD; break;
    default: return 0;
    }
    int fails = RANK_CHECK(r->c, st.training_state == want_ts,
                           "step %d: %s training_state %d at probe %d, want %d", r->step,
                           LAYER_NAME[layer], (int)st.training_state, (int)at, (int)want_ts);
    if (at == PROBE_PRE_FORWARD || at == PROBE_PRE_BACKWARD)
        fails += RANK_CHECK(r->c, st.unshard_state == FSDP2_UNSHARDED,
                            "step %d: %s is %s inside its hooks, want UNSHARDED", r->step,
                            LAYER_NAME[layer], unshard_state_name(st.unshard_state));
    if (at == PROBE_POST_FORWARD && layer == 0)
        fails += RANK_CHECK(r->c, st.unshard_state == FSDP2_SHARDED,
                            "step %d: fc1 is %s after post_forward with reshard_after_forward "
                            "1, want SHARDED",
                            r->step, unshard_state_name(st.unshard_state));
    return fails;
}

/* Each rank's DTensor pieces are torch.chunk's rows, and the groups' sizes add up. */
static int check_layout(run_t *r)
{
    rank_ctx_t *c = r->c;
    int fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        int64_t expect_shard = 0;
        for (int kind = 0; kind < 2; kind++) {
            fsdp2_dtensor_t *dt = NULL;
            fails += OK(c, fsdp2_param_sharded(r->p[l][kind], &dt));
            if (fails)
                return fails;
            fsdp2_dtensor_info_t info;
            fails += OK(c, fsdp2_dtensor_info(dt, &info));
            int64_t off, len;
            chunk_rows(DIM[l + 1], c->size, c->rank, &off, &len);
            expect_shard += ((DIM[l + 1] + c->size - 1) / c->size) * (kind ? 1 : DIM[l]);
            fails += RANK_CHECK(c, info.ndim == (kind ? 1 : 2) && info.shape[0] == DIM[l + 1] &&
                                       info.local_shape[0] == len && info.offset[0] == off &&
                                       info.mesh_ndim == 1 &&
                                       info.placements[0].type == FSDP2_PLACEMENT_SHARD &&
                                       info.placements[0].dim == 0 && info.dtype == FSDP2_F32,
                                "%s.%s: shard of %lld rows at %lld (placement %d dim %d), want %lld "
                                "at %lld, Shard(0)",
                                LAYER_NAME[l], kind ? "bias" : "weight",
                                (long long)info.local_shape[0], (long long)info.offset[0],
                                (int)info.placements[0].type, info.placements[0].dim,
                                (long long)len, (long long)off);
            fsdp2_param_info_t pi;
            fails += OK(c, fsdp2_param_info(r->p[l][kind], &pi));
            fails += RANK_CHECK(c, pi.sharded == 1 && pi.materialized == 1,
                                "%s: info sharded %d materialized %d, want 1 1", pi.fqn,
                                pi.sharded, pi.materialized);
        }
        fsdp2_module_state_t st = state_of(r, r->fc[l]);
        int64_t full = (int64_t)DIM[l + 1] * DIM[l] + DIM[l + 1];
        fails += RANK_CHECK(c, st.sharded && st.num_params == 2 && st.shard_numel == expect_shard &&
                                   st.unsharded_numel == full && st.unshard_state == FSDP2_SHARDED,
                            "%s: state sharded %d, %zu params, shard_numel %lld, unsharded_numel "
                            "%lld, %s; want 1, 2, %lld, %lld, SHARDED",
                            LAYER_NAME[l], st.sharded, st.num_params, (long long)st.shard_numel,
                            (long long)st.unsharded_numel, unshard_state_name(st.unshard_state),
                            (long long)expect_shard, (long long)full);
    }
    fsdp2_module_state_t rs = state_of(r, r->root);
    fails += RANK_CHECK(c, rs.sharded && rs.num_params == 0 && rs.shard_numel == 0,
                        "root: sharded %d, %zu params, shard_numel %lld; want 1, 0, 0", rs.sharded,
                        rs.num_params, (long long)rs.shard_numel);
    return fails;
}

static int body_train(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += check_layout(r);
    ref_model_t ref;
    ref_init(&ref);
    if (!fails)
        fails += compare_params(r, &ref); /* fully_shard copied the declared values */
    r->probe = probe_states;
    if (!fails)
        fails += train(r, &ref, 0, STEPS, 1);
    if (!fails) {
        fsdp2_module_state_t rs = state_of(r, r->root), s1 = state_of(r, r->fc[0]);
        fails += RANK_CHECK(c, rs.is_root == 1 && s1.is_root == 0 &&
                                   s1.training_state == FSDP2_STATE_IDLE,
                            "after the steps: root is_root %d, fc1 is_root %d state %d", rs.is_root,
                            s1.is_root, (int)s1.training_state);
        fails += RANK_CHECK(c, s1.reduce_scatters == STEPS,
                            "fc1 reduce_scatters %llu after %d steps, want %d",
                            (unsigned long long)s1.reduce_scatters, STEPS, STEPS);
    }
    fails += run_close(r);
    free(r);
    return fails;
}

/* Two micro-batches per step: the first without gradient sync (no reduce-scatter), the
 * second with it; the sharded gradients are the sum of the two micro-batch gradients. */
static int body_accumulate(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    work_t *refwork = malloc(sizeof(*refwork));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    for (int s = 0; s < 3 && !fails; s++) {
        r->step = s;
        for (int micro = 0; micro < 2 && !fails; micro++) {
            int samples[SAMPLES], n, all[SAMPLES], n_all;
            local_samples(r, micro, 2, samples, &n);
            global_samples(c->size, micro, 2, all, &n_all);
            fails += OK(c, fsdp2_set_requires_gradient_sync(r->root, micro == 1));
            /* The second micro-batch's view may be the accumulator holding the first's
             * gradients (the application adds either way). */
            r->grads_start_at_zero = micro == 0;
            uint64_t rs_before = state_of(r, r->fc[0]).reduce_scatters;
            fails += forward(r, samples, n);
            if (!fails)
                fails += backward(r, samples, n);
            if (fails)
                break;
            fsdp2_module_state_t st = state_of(r, r->fc[0]);
            fails += RANK_CHECK(c, st.requires_gradient_sync == (micro == 1),
                                "fc1 requires_gradient_sync %d, want %d (set on the root)",
                                st.requires_gradient_sync, micro == 1);
            fails += RANK_CHECK(c, st.reduce_scatters == rs_before + (micro == 1),
                                "step %d micro %d: fc1 reduce_scatters went %llu -> %llu, want +%d",
                                s, micro, (unsigned long long)rs_before,
                                (unsigned long long)st.reduce_scatters, micro == 1);
            ref_accumulate(&ref, refwork, all, n_all);
        }
        if (fails)
            break;
        fails += compare_grads(r, &ref);
        fails += sgd(r);
        ref_sgd(&ref);
        fails += compare_params(r, &ref);
    }
    fails += run_close(r);
    free(refwork);
    free(r);
    return fails;
}

static int probe_kept_whole(run_t *r, probe_point_t at, int layer)
{
    if (at != PROBE_POST_FORWARD || layer != 0)
        return 0;
    fsdp2_module_state_t st = state_of(r, r->fc[0]);
    return RANK_CHECK(r->c, st.unshard_state == FSDP2_UNSHARDED && st.reshard_after_forward == 0,
                      "step %d: fc1 is %s (reshard_after_forward %d) after post_forward, want "
                      "UNSHARDED with reshard_after_forward 0",
                      r->step, unshard_state_name(st.unshard_state), st.reshard_after_forward);
}

static int body_no_reshard(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.reshard_after_forward = 0;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_kept_whole;
    if (!fails)
        fails += train(r, &ref, 0, 3, 0);
    fails += run_close(r);
    free(r);
    return fails;
}

/* The next module's all-gather is in flight once the current module's pre hook returns
 * (from the second step on, the order is the recorded one). */
static int probe_prefetch(run_t *r, probe_point_t at, int layer)
{
    if (at == PROBE_STEP_START || at == PROBE_BACKWARD_START) {
        r->saved[1] = state_of(r, r->fc[1]).all_gathers;
        return 0;
    }
    int forward_hit = at == PROBE_PRE_FORWARD && layer == 0;
    int backward_hit = at == PROBE_PRE_BACKWARD && layer == 2;
    if (r->step < 1 || !(forward_hit || backward_hit))
        return 0;
    fsdp2_module_state_t st = state_of(r, r->fc[1]);
    return RANK_CHECK(r->c, st.unshard_state != FSDP2_SHARDED && st.all_gathers > r->saved[1],
                      "step %d: after pre_%s(%s), fc2 is %s with %llu all-gathers (%llu when the "
                      "%s began); want its all-gather issued",
                      r->step, forward_hit ? "forward" : "backward", forward_hit ? "fc1" : "fc3",
                      unshard_state_name(st.unshard_state), (unsigned long long)st.all_gathers,
                      (unsigned long long)r->saved[1], forward_hit ? "step" : "backward");
}

static int body_prefetch(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_prefetch;
    if (!fails)
        fails += train(r, &ref, 0, 3, 0);
    fails += run_close(r);
    free(r);
    return fails;
}

/* Nothing is allocated inside a step: the peak stays at what the plan allocated. */
static int probe_memory(run_t *r, probe_point_t at, int layer)
{
    (void)layer;
    if (at == PROBE_STEP_END)
        return OK(r->c, fsdp2_memory_stats_reset_peak(CPU)); /* compare_params allocated */
    if (at != PROBE_OPTIMIZED)
        return 0;
    uint64_t peak = 0, now = cpu_allocated(r, &peak);
    return RANK_CHECK(r->c, peak == r->planned_allocated && now == r->planned_allocated,
                      "step %d: cpu peak %llu and live %llu bytes, want both %llu (as planned)",
                      r->step, (unsigned long long)peak, (unsigned long long)now,
                      (unsigned long long)r->planned_allocated);
}

static int body_memory(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    if (fails)
        goto out;

    uint64_t shard_elems = 0;
    for (int l = 0; l < LAYERS; l++)
        shard_elems += (uint64_t)((DIM[l + 1] + c->size - 1) / c->size) * (DIM[l] + 1);
    fsdp2_memory_plan_t plan;
    memset(&plan, 0, sizeof(plan));
    plan.size = sizeof(plan);
    uint64_t before = cpu_allocated(r, NULL);
    fails += OK(c, fsdp2_memory_plan(r->root, &plan));
    uint64_t after = cpu_allocated(r, NULL);
    if (fails)
        goto out;
    uint64_t sum = plan.sharded_params + plan.sharded_grads + plan.unsharded_params +
                   plan.unsharded_grads + plan.reduce_scatter;
    fails += RANK_CHECK(c, plan.total == sum, "plan total %llu, categories add up to %llu",
                        (unsigned long long)plan.total, (unsigned long long)sum);
    fails += RANK_CHECK(c, plan.sharded_params == 4 * shard_elems &&
                               plan.sharded_grads == 4 * shard_elems,
                        "plan: sharded params %llu, grads %llu bytes; want both %llu (padded "
                        "chunks, f32)",
                        (unsigned long long)plan.sharded_params,
                        (unsigned long long)plan.sharded_grads,
                        (unsigned long long)(4 * shard_elems));
    /* On one rank the shard is the whole parameter and the library may use it in place,
     * without a ring; the header promises the default ring of two when there is
     * something to gather. */
    if (c->size > 1)
        fails += RANK_CHECK(c, plan.ring_buffers == 2, "plan: %d ring buffers, want 2 (default)",
                            plan.ring_buffers);
    fails += RANK_CHECK(c, after - before == plan.total - plan.sharded_params - plan.sharded_grads,
                        "planning allocated %llu bytes; the plan's total minus the shards "
                        "(allocated by fully_shard) is %llu",
                        (unsigned long long)(after - before),
                        (unsigned long long)(plan.total - plan.sharded_params - plan.sharded_grads));
    /* fully_shard allocated the shards and dropped the declared values. */
    int64_t shard_delta = (int64_t)r->allocated_after_shard - (int64_t)r->allocated_before_shard;
    int64_t want_delta = (int64_t)(plan.sharded_params + plan.sharded_grads) -
                         (int64_t)r->declared_bytes;
    fails += RANK_CHECK(c, shard_delta == want_delta,
                        "fully_shard changed cpu bytes by %lld; want shards %llu minus declared "
                        "values %llu = %lld",
                        (long long)shard_delta,
                        (unsigned long long)(plan.sharded_params + plan.sharded_grads),
                        (unsigned long long)r->declared_bytes, (long long)want_delta);
    /* A second call, from another module of the tree, reports the same and allocates
     * nothing. */
    fsdp2_memory_plan_t again;
    memset(&again, 0, sizeof(again));
    again.size = sizeof(again);
    fails += OK(c, fsdp2_memory_plan(r->fc[1], &again));
    fails += RANK_CHECK(c, again.total == plan.total && cpu_allocated(r, NULL) == after,
                        "second plan: total %llu (first %llu), live %llu (was %llu)",
                        (unsigned long long)again.total, (unsigned long long)plan.total,
                        (unsigned long long)cpu_allocated(r, NULL), (unsigned long long)after);
    if (fails)
        goto out;
    r->planned_allocated = after;
    fails += OK(c, fsdp2_memory_stats_reset_peak(CPU));
    r->probe = probe_memory;
    fails += train(r, &ref, 0, STEPS, 0);
out:
    fails += run_close(r);
    free(r);
    return fails;
}

/* The frozen parameter has no gradient view even inside its module's backward. */
static int probe_frozen_grad(run_t *r, probe_point_t at, int layer)
{
    if (at != PROBE_PRE_BACKWARD || layer != 1)
        return 0;
    fsdp2_tensor_t *t = NULL;
    return REFUSED(r->c, fsdp2_param_grad(r->p[1][1], &t), FSDP2_SUCCESS, NULL);
}

static int body_frozen(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.frozen_fc2_bias = 1;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    ref.frozen_bias[1] = 1;
    if (fails)
        goto out;
    fsdp2_param_t *frozen = r->p[1][1];
    fsdp2_param_info_t pi;
    fails += OK(c, fsdp2_param_info(frozen, &pi));
    fails += RANK_CHECK(c, pi.requires_grad == 0, "fc2.bias requires_grad %d", pi.requires_grad);
    fsdp2_dtensor_t *g = (fsdp2_dtensor_t *)&g; /* anything but NULL: the call must clear it */
    fails += OK(c, fsdp2_param_sharded_grad(frozen, &g));
    fails += RANK_CHECK(c, g == NULL, "fc2.bias (frozen) has a sharded grad %p", (void *)g);
    fsdp2_tensor_t *t = NULL;
    fails += REFUSED(c, fsdp2_param_grad(frozen, &t), FSDP2_SUCCESS, NULL);
    r->probe = probe_frozen_grad;
    fails += train(r, &ref, 0, STEPS, 1);
    /* Bitwise the declared values: nothing ever touched it. */
    float init[MAX_OUT];
    for (int k = 0; k < DIM[2]; k++)
        init[k] = bias_init(1, k);
    if (!fails)
        fails += compare_full(r, 1, 1, 0, init, 0.0);
out:
    fails += run_close(r);
    free(r);
    return fails;
}

typedef struct init_calls {
    run_t *r;
    int calls[LAYERS][2];
    int fails;
} init_calls_t;

/* Writes the formula into this rank's shard, from its global offset. */
static fsdp2_status_t formula_init(fsdp2_param_t *param, fsdp2_tensor_t *shard,
                                   const int64_t *global_offset, void *ctx)
{
    init_calls_t *ic = ctx;
    run_t *r = ic->r;
    int l = -1, kind = -1;
    for (int i = 0; i < LAYERS; i++)
        for (int k = 0; k < 2; k++)
            if (r->p[i][k] == param) {
                l = i;
                kind = k;
            }
    if (l < 0) {
        ic->fails += RANK_CHECK(r->c, 0, "materialize called init on an unknown parameter");
        return FSDP2_SUCCESS;
    }
    ic->calls[l][kind]++;
    int64_t off, len, cols = kind ? 1 : DIM[l];
    chunk_rows(DIM[l + 1], r->c->size, r->c->rank, &off, &len);
    int bad = RANK_CHECK(r->c, shard && shard->dtype == FSDP2_F32 && shard->shape[0] == len &&
                                   shard->numel == len * cols && global_offset[0] == off &&
                                   (kind || global_offset[1] == 0) && (len == 0 || shard->data),
                         "%s.%s: init got %lld rows at %lld, want %lld at %lld", LAYER_NAME[l],
                         kind ? "bias" : "weight", shard ? (long long)shard->shape[0] : -1,
                         (long long)global_offset[0], (long long)len, (long long)off);
    ic->fails += bad;
    if (bad)
        return FSDP2_SUCCESS;
    float *v = shard->data;
    for (int64_t k = 0; k < shard->numel; k++) {
        int64_t flat = global_offset[0] * cols + k;
        v[k] = kind ? bias_init(l, flat) : weight_init(l, flat);
    }
    return FSDP2_SUCCESS;
}

static int body_meta_formula(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.meta = 1;
    if (!fails)
        fails += build_model(r, &bo);
    if (fails)
        goto out;
    fsdp2_param_info_t pi;
    fails += OK(c, fsdp2_param_info(r->p[0][0], &pi));
    fails += RANK_CHECK(c, pi.materialized == 0 && pi.sharded == 1,
                        "meta fc1.weight after fully_shard: materialized %d sharded %d, want 0 1",
                        pi.materialized, pi.sharded);
    init_calls_t ic;
    memset(&ic, 0, sizeof(ic));
    ic.r = r;
    fails += OK(c, fsdp2_module_materialize(r->root, formula_init, &ic));
    fails += ic.fails;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < 2; k++)
            fails += RANK_CHECK(c, ic.calls[l][k] == 1, "init called %d times for %s.%s, want 1",
                                ic.calls[l][k], LAYER_NAME[l], k ? "bias" : "weight");
    fails += OK(c, fsdp2_param_info(r->p[2][1], &pi));
    fails += RANK_CHECK(c, pi.materialized == 1, "fc3.bias materialized %d after materialize",
                        pi.materialized);
    if (fails)
        goto out;
    ref_model_t ref;
    ref_init(&ref);
    for (int l = 0; l < LAYERS; l++) { /* bitwise */
        fails += compare_full(r, l, 0, 0, ref.w[l], 0.0);
        fails += compare_full(r, l, 1, 0, ref.b[l], 0.0);
    }
    if (!fails) /* and it trains like the model declared on cpu */
        fails += train(r, &ref, 0, 2, 0);
out:
    fails += run_close(r);
    free(r);
    return fails;
}

static int body_meta_random(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.meta = 1;
    bo.random_init = 1;
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += OK(c, fsdp2_module_materialize(r->root, NULL, NULL));
    for (int l = 0; l < LAYERS && !fails; l++) {
        for (int kind = 0; kind < 2 && !fails; kind++) {
            int64_t shape[2] = {DIM[l + 1], DIM[l]};
            fsdp2_tensor_t *whole = NULL;
            fails += OK(c, fsdp2_tensor_empty(CPU, FSDP2_F32, kind ? 1 : 2, shape, &whole));
            if (fails)
                break;
            fsdp2_random_init_t init = random_init_of(l, kind);
            fails += OK(c, fsdp2_random_fill(whole, &init, NULL, NULL));
            if (!fails)
                fails += compare_full(r, l, kind, 0, whole->data, 0.0);
            fsdp2_tensor_release(whole);
        }
    }
    fails += run_close(r);
    free(r);
    return fails;
}

/* Mid-step misuse, after which the step goes on. */
static int probe_misuse(run_t *r, probe_point_t at, int layer)
{
    rank_ctx_t *c = r->c;
    if (r->step != 0)
        return 0;
    if (at == PROBE_PRE_FORWARD && layer == 0)
        return REFUSED(c, fsdp2_reshard(r->fc[0]), FSDP2_SUCCESS, "fc1");
    if (at == PROBE_POST_FORWARD && layer == 1)
        return REFUSED(c, fsdp2_post_forward(r->fc[1]), FSDP2_ERR_INVALID_STATE, "fc2");
    if (at == PROBE_POST_BACKWARD && layer == 2)
        return REFUSED(c, fsdp2_post_backward(r->fc[2]), FSDP2_ERR_INVALID_STATE, "fc3");
    if (at == PROBE_STEP_END) {
        /* Between steps: a backward with no forward, a post_forward with no pre. */
        int fails = REFUSED(c, fsdp2_pre_backward(r->fc[0]), FSDP2_ERR_INVALID_STATE, "fc1");
        return fails + REFUSED(c, fsdp2_post_forward(r->fc[2]), FSDP2_ERR_INVALID_STATE, "fc3");
    }
    return 0;
}

static int body_misuse(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    if (fails)
        goto out;
    fsdp2_tensor_t *t = NULL;
    fails += REFUSED(c, fsdp2_post_forward(r->fc[0]), FSDP2_ERR_INVALID_STATE, "fc1");
    fails += REFUSED(c, fsdp2_pre_backward(r->fc[0]), FSDP2_ERR_INVALID_STATE, "fc1");
    fails += REFUSED(c, fsdp2_post_backward(r->fc[1]), FSDP2_ERR_INVALID_STATE, "fc2");
    fails += REFUSED(c, fsdp2_fully_shard(r->fc[0], &r->opts), FSDP2_ERR_INVALID_STATE, "fc1");
    fails += REFUSED(c, fsdp2_param_unsharded(r->p[0][0], &t), FSDP2_ERR_INVALID_STATE, "fc1");
    fails += REFUSED(c, fsdp2_param_grad(r->p[0][0], &t), FSDP2_SUCCESS, "fc1");
    fsdp2_tensor_t *extra = NULL;
    int64_t shape[1] = {3};
    fails += OK(c, fsdp2_tensor_zeros(CPU, FSDP2_F32, 1, shape, &extra));
    fails += REFUSED(c, fsdp2_module_add_param(r->fc[0], "extra", extra, 1, NULL), FSDP2_SUCCESS,
                     NULL);
    fsdp2_tensor_release(extra);

    /* A child sharded after its parent, on a second tree over the same mesh. */
    fsdp2_module_t *root2 = NULL, *blk = NULL;
    fails += OK(c, fsdp2_module_create("", &root2));
    fails += OK(c, fsdp2_module_create("blk", &blk));
    fails += OK(c, fsdp2_module_add_child(root2, blk));
    int64_t wshape[2] = {5, 3};
    fsdp2_tensor_t *w = NULL;
    fails += OK(c, fsdp2_tensor_zeros(CPU, FSDP2_F32, 2, wshape, &w));
    if (!fails)
        fails += OK(c, fsdp2_module_add_param(blk, "w", w, 1, NULL));
    fsdp2_tensor_release(w);
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(root2, &r->opts));
    if (!fails)
        fails += REFUSED(c, fsdp2_fully_shard(blk, &r->opts), FSDP2_ERR_INVALID_STATE, "blk");
    fails += OK(c, fsdp2_module_destroy(root2));

    /* The tree still trains, through mid-step refusals too. */
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_misuse;
    if (!fails)
        fails += train(r, &ref, 0, 3, 1);
out:
    fails += run_close(r);
    free(r);
    return fails;
}

static int probe_explicit(run_t *r, probe_point_t at, int layer)
{
    if (at != PROBE_PRE_FORWARD || layer != 0)
        return 0;
    fsdp2_module_state_t s2 = state_of(r, r->fc[1]), s3 = state_of(r, r->fc[2]);
    return RANK_CHECK(r->c, s2.unshard_state != FSDP2_SHARDED && s3.unshard_state != FSDP2_SHARDED,
                      "step %d: after pre_forward(fc1) with prefetch {fc2, fc3}: fc2 %s, fc3 %s",
                      r->step, unshard_state_name(s2.unshard_state),
                      unshard_state_name(s3.unshard_state));
}

static int body_explicit_prefetch(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.unsharded_buffers = 3;
    if (!fails)
        fails += build_model(r, &bo);
    fsdp2_module_t *next[2];
    if (!fails) {
        next[0] = r->fc[1];
        next[1] = r->fc[2];
        fails += OK(c, fsdp2_set_modules_to_forward_prefetch(r->fc[0], next, 2));
    }
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_explicit;
    if (!fails)
        fails += train(r, &ref, 0, 3, 0);
    if (!fails) {
        fsdp2_memory_plan_t plan;
        memset(&plan, 0, sizeof(plan));
        plan.size = sizeof(plan);
        fails += OK(c, fsdp2_memory_plan(r->root, &plan));
        fails += RANK_CHECK(c, plan.ring_buffers == 3, "ring of %d buffers, asked for 3",
                            plan.ring_buffers);
    }
    fails += run_close(r);
    free(r);
    return fails;
}

/* fsdp2_unshard before a step: the event completes, the parameters are whole and hold
 * the current values, and the step that follows uses them. */
static int unshard_ahead(run_t *r, const ref_model_t *ref, int use_event, double tolerance)
{
    rank_ctx_t *c = r->c;
    fsdp2_event_t *done = NULL;
    int fails = OK(c, fsdp2_unshard(r->fc[0], use_event ? &done : NULL));
    if (use_event && !fails) {
        fails += RANK_CHECK(c, done != NULL, "fsdp2_unshard gave no event");
        if (done)
            fails += OK(c, fsdp2_event_wait_timeout(done, GROUP_TIMEOUT_MS));
    }
    fails += OK(c, fsdp2_unshard_wait(r->fc[0]));
    if (fails)
        return fails;
    fsdp2_module_state_t st = state_of(r, r->fc[0]);
    fails += RANK_CHECK(c, st.unshard_state == FSDP2_UNSHARDED,
                        "step %d: fc1 is %s after unshard_wait", r->step,
                        unshard_state_name(st.unshard_state));
    float *W = NULL, *b = NULL;
    fails += unsharded_view(r, 0, 0, &W);
    fails += unsharded_view(r, 0, 1, &b);
    if (!fails) {
        fails += compare_values(r, "fc1.weight (unshard)", W, ref->w[0], DIM[1] * DIM[0],
                                tolerance);
        fails += compare_values(r, "fc1.bias (unshard)", b, ref->b[0], DIM[1], tolerance);
    }
    return fails;
}

static int body_explicit_unshard(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    if (!fails)
        fails += unshard_ahead(r, &ref, 1, 0.0); /* the declared values, bitwise */
    if (!fails)
        fails += train(r, &ref, 0, 2, 0);
    r->step = 2;
    if (!fails)
        fails += unshard_ahead(r, &ref, 0, TOLERANCE);
    if (!fails)
        fails += train(r, &ref, 2, 2, 0);
    fails += run_close(r);
    free(r);
    return fails;
}

/* ---------------------------------------------------------------------------------- */

static void run_case(int ws, rank_fn body, const char *what)
{
    ranks_result_t res;
    int rc = run_ranks(ws, body, NULL, GROUP_TIMEOUT_MS, DEADLINE_S, &res);
    ck_assert_msg(rc == 0, "%s with %d ranks: %s (rank exit codes %d %d %d %d; see stderr)", what,
                  ws, res.timed_out ? "timed out" : "a rank failed", res.status[0],
                  res.status[1], res.status[2], res.status[3]);
}

START_TEST(sharded_sgd_matches_one_process_sgd_for_every_world_size)
{
    run_case(_i, body_train, "training");
}
END_TEST

START_TEST(accumulated_no_sync_micro_batches_equal_the_sum_of_their_gradients)
{
    run_case(_i, body_accumulate, "gradient accumulation");
}
END_TEST

START_TEST(reshard_after_forward_off_keeps_parameters_whole_and_changes_no_number)
{
    run_case(_i, body_no_reshard, "reshard_after_forward 0");
}
END_TEST

START_TEST(the_next_modules_all_gather_is_issued_by_the_current_modules_pre_hook)
{
    run_case(_i, body_prefetch, "implicit prefetch");
}
END_TEST

START_TEST(planning_allocates_what_the_plan_reports_and_no_step_allocates_more)
{
    run_case(_i, body_memory, "memory plan");
}
END_TEST

START_TEST(a_frozen_parameter_never_changes_and_has_no_gradient_even_in_its_backward)
{
    run_case(_i, body_frozen, "frozen parameter");
}
END_TEST

START_TEST(meta_parameters_materialised_from_shard_offsets_equal_the_formula)
{
    run_case(_i, body_meta_formula, "meta init");
}
END_TEST

START_TEST(seeded_random_init_is_bitwise_the_same_for_every_world_size)
{
    run_case(_i, body_meta_random, "seeded init");
}
END_TEST

START_TEST(misuse_is_invalid_state_naming_the_module_and_the_tree_still_trains)
{
    run_case(_i, body_misuse, "misuse");
}
END_TEST

START_TEST(explicit_forward_prefetch_unshards_both_listed_modules_early)
{
    run_case(_i, body_explicit_prefetch, "explicit prefetch");
}
END_TEST

START_TEST(explicit_unshard_before_the_forward_gives_whole_current_parameters)
{
    run_case(_i, body_explicit_unshard, "explicit unshard");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_train");
    TCase *tc = tcase_create("numerics");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, sharded_sgd_matches_one_process_sgd_for_every_world_size, 1, 5);
    tcase_add_loop_test(tc, accumulated_no_sync_micro_batches_equal_the_sum_of_their_gradients, 1, 5);
    tcase_add_loop_test(tc, reshard_after_forward_off_keeps_parameters_whole_and_changes_no_number, 1, 5);
    tcase_add_loop_test(tc, a_frozen_parameter_never_changes_and_has_no_gradient_even_in_its_backward, 1, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("schedule");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, the_next_modules_all_gather_is_issued_by_the_current_modules_pre_hook, 2, 5);
    tcase_add_loop_test(tc, explicit_forward_prefetch_unshards_both_listed_modules_early, 2, 5);
    tcase_add_loop_test(tc, explicit_unshard_before_the_forward_gives_whole_current_parameters, 1, 5);
    tcase_add_loop_test(tc, planning_allocates_what_the_plan_reports_and_no_step_allocates_more, 1, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("init");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, meta_parameters_materialised_from_shard_offsets_equal_the_formula, 1, 5);
    tcase_add_loop_test(tc, seeded_random_init_is_bitwise_the_same_for_every_world_size, 1, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("misuse");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, misuse_is_invalid_state_naming_the_module_and_the_tree_still_trains, 1, 5);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
