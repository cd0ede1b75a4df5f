/* See mlp_model.h. */
#include "mlp_model.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const int DIM[LAYERS + 1] = {13, 7, 5, 3};
const char *const LAYER_NAME[LAYERS] = {"fc1", "fc2", "fc3"};
const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;
const fsdp2_device_t META = FSDP2_DEVICE_META_INIT;

int check_ok(const rank_ctx_t *c, fsdp2_status_t s, const char *expr, const char *file, int line)
{
    if (s == FSDP2_SUCCESS)
        return 0;
    fprintf(stderr, "rank %d/%d: %s:%d: %s = %s (%s)\n", c->rank, c->size, file, line, expr,
            fsdp2_status_name(s), fsdp2_last_error());
    return 1;
}

int check_refused(const rank_ctx_t *c, fsdp2_status_t s, fsdp2_status_t want, const char *needle,
                  const char *expr, const char *file, int line)
{
    const char *msg = fsdp2_last_error();
    int bad = s == FSDP2_SUCCESS || (want != FSDP2_SUCCESS && s != want) ||
              (needle && !strstr(msg, needle));
    if (!bad)
        return 0;
    fprintf(stderr, "rank %d/%d: %s:%d: %s = %s, want %s with a message naming '%s'; got '%s'\n",
            c->rank, c->size, file, line, expr, fsdp2_status_name(s),
            want == FSDP2_SUCCESS ? "an error" : fsdp2_status_name(want), needle ? needle : "",
            s == FSDP2_SUCCESS ? "" : msg);
    return 1;
}

/* ---------------------------------------------------------------------------------- */
/* The model and its data, as formulas                                                 */

float weight_init(int layer, int64_t flat)
{
    return (float)(0.3 * sin(0.7 * (double)flat + layer + 1));
}

float bias_init(int layer, int64_t row)
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

void chunk_rows(int64_t n, int ws, int r, int64_t *off, int64_t *len)
{
    int64_t chunk = (n + ws - 1) / ws;
    int64_t s = r * chunk < n ? r * chunk : n;
    int64_t e = (r + 1) * chunk < n ? (r + 1) * chunk : n;
    *off = s;
    *len = e - s;
}

fsdp2_random_init_t random_init_of(int l, int kind)
{
    fsdp2_random_init_t init = FSDP2_RANDOM_NORMAL_INIT(1000 + 10 * l + kind, 0.0, 0.1);
    return init;
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

void ref_init(ref_model_t *ref)
{
    memset(ref, 0, sizeof(*ref));
    for (int l = 0; l < LAYERS; l++) {
        for (int k = 0; k < DIM[l + 1] * DIM[l]; k++)
            ref->w[l][k] = weight_init(l, k);
        for (int k = 0; k < DIM[l + 1]; k++)
            ref->b[l][k] = bias_init(l, k);
    }
}

void ref_accumulate(ref_model_t *ref, work_t *w, const int *samples, int n)
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

void ref_sgd(ref_model_t *ref)
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
/* The sharded run: set-up                                                             */

uint64_t cpu_allocated(run_t *r, uint64_t *peak)
{
    fsdp2_memory_stats_t st;
    memset(&st, 0, sizeof(st));
    OK(r->c, fsdp2_memory_stats_get(CPU, &st));
    if (peak)
        *peak = st.peak_allocated_bytes;
    return st.allocated_bytes;
}

int plan_memory(run_t *r, fsdp2_memory_plan_t *plan)
{
    memset(plan, 0, sizeof(*plan));
    plan->size = sizeof(*plan);
    int fails = OK(r->c, fsdp2_memory_plan(r->root, plan));
    if (fails)
        return fails;
    r->planned_allocated = cpu_allocated(r, NULL);
    uint64_t non_shard = plan->total - plan->sharded_params - plan->sharded_grads;
    return RANK_CHECK(r->c, r->planned_allocated - r->allocated_after_shard == non_shard,
                      "planning allocated %llu bytes, the plan's non-shard bytes are %llu",
                      (unsigned long long)(r->planned_allocated - r->allocated_after_shard),
                      (unsigned long long)non_shard);
}

int probe_memory(run_t *r, probe_point_t at)
{
    if (at == PROBE_STEP_START)
        return OK(r->c, fsdp2_memory_stats_reset_peak(CPU));
    if (at != PROBE_FINISHED)
        return 0;
    uint64_t peak = 0, now = cpu_allocated(r, &peak);
    return RANK_CHECK(r->c, peak == r->planned_allocated && now == r->planned_allocated,
                      "step %d: cpu peak %llu and live %llu bytes in the step, want both %llu "
                      "(as planned)",
                      r->step, (unsigned long long)peak, (unsigned long long)now,
                      (unsigned long long)r->planned_allocated);
}

fsdp2_module_state_t state_of(run_t *r, const fsdp2_module_t *m)
{
    fsdp2_module_state_t st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    OK(r->c, fsdp2_module_state(m, &st));
    return st;
}

const char *unshard_state_name(fsdp2_unshard_state_t s)
{
    switch (s) {
    case FSDP2_SHARDED: return "SHARDED";
    case FSDP2_UNSHARDING: return "UNSHARDING";
    case FSDP2_UNSHARDED: return "UNSHARDED";
    }
    return "?";
}

const char *training_state_name(fsdp2_training_state_t s)
{
    switch (s) {
    case FSDP2_STATE_IDLE: return "IDLE";
    case FSDP2_STATE_FORWARD: return "FORWARD";
    case FSDP2_STATE_AFTER_FORWARD: return "AFTER_FORWARD";
    case FSDP2_STATE_BACKWARD: return "BACKWARD";
    case FSDP2_STATE_AFTER_BACKWARD: return "AFTER_BACKWARD";
    }
    return "?";
}

static int probe(run_t *r, probe_point_t at, int layer)
{
    return r->probe ? r->probe(r, at, layer) : 0;
}

void local_samples(const run_t *r, int micro, int micros, int *samples, int *n)
{
    int per_rank = SAMPLES / r->c->size, per_micro = per_rank / micros;
    *n = per_micro;
    for (int s = 0; s < per_micro; s++)
        samples[s] = r->c->rank * per_rank + micro * per_micro + s;
}

void global_samples(int ws, int micro, int micros, int *samples, int *n)
{
    int per_rank = SAMPLES / ws, per_micro = per_rank / micros;
    *n = 0;
    for (int rank = 0; rank < ws; rank++)
        for (int s = 0; s < per_micro; s++)
            samples[(*n)++] = rank * per_rank + micro * per_micro + s;
}

/* Mesh names must differ between meshes (their store keys outlive them): a body that
 * opens several runs gets "fsdp0", "fsdp1", ... (or "fsdp2d0", ...) the same on every
 * rank. */
static int open_mesh(rank_ctx_t *c, run_t *r, const char *prefix, int *opened, int ndim,
                     int *shape, const char *const *names)
{
    char name[16];
    snprintf(name, sizeof(name), "%s%d", prefix, (*opened)++);
    memset(r, 0, sizeof(*r));
    r->c = c;
    r->grads_start_at_zero = 1;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = GROUP_TIMEOUT_MS; /* a rank that fails early must not hang the others */
    return OK(c, fsdp2_mesh_create(c->store, name, c->rank, c->size, ndim, shape, names, &go,
                                   &r->mesh));
}

int run_open(rank_ctx_t *c, run_t *r)
{
    static int opened;
    int ws = c->size;
    return open_mesh(c, r, "fsdp", &opened, 1, &ws, NULL);
}

int run_open_2d(rank_ctx_t *c, run_t *r, int replicas)
{
    static int opened;
    int shape[2] = {replicas, c->size / replicas};
    const char *const names[2] = {"replicate", "shard"};
    return open_mesh(c, r, "fsdp2d", &opened, 2, shape, names);
}

int run_close(run_t *r)
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

static int declare_layer(run_t *r, const build_options_t *bo, int l)
{
    rank_ctx_t *c = r->c;
    int fails = OK(c, fsdp2_module_create(LAYER_NAME[l], &r->fc[l]));
    if (fails)
        return fails;
    fsdp2_module_t *parent = bo->nested && l < 2 ? r->block : r->root;
    fails += OK(c, fsdp2_module_add_child(parent, r->fc[l]));
    r->frozen_bias[l] = (bo->frozen_fc2_bias || bo->ignore_fc2_bias) && l == 1;
    for (int kind = 0; kind < 2 && !fails; kind++) {
        fsdp2_tensor_t *t = declared_value(r, bo, l, kind);
        if (!t)
            return fails + 1;
        int requires_grad = !(kind == 1 && bo->frozen_fc2_bias && l == 1);
        fails += OK(c, fsdp2_module_add_param(r->fc[l], kind ? "bias" : "weight", t,
                                              requires_grad, &r->p[l][kind]));
        r->declared_data[l][kind] = t->data;
        fsdp2_tensor_release(t); /* the module keeps its own reference */
        if (bo->random_init && !fails) {
            fsdp2_random_init_t init = random_init_of(l, kind);
            fails += OK(c, fsdp2_param_set_random_init(r->p[l][kind], &init));
        }
    }
    return fails;
}

int run_bind_hooks(run_t *r)
{
    for (int l = 0; l < LAYERS; l++)
        r->hook[l] = state_of(r, r->fc[l]).sharded ? r->fc[l] : NULL;
    r->block_hook = r->block && state_of(r, r->block).sharded ? r->block : NULL;
    return 0;
}

int build_model(run_t *r, const build_options_t *bo)
{
    rank_ctx_t *c = r->c;
    int fails = OK(c, fsdp2_module_create("", &r->root));
    if (!fails && bo->nested) {
        fails += OK(c, fsdp2_module_create("block", &r->block));
        if (!fails)
            fails += OK(c, fsdp2_module_add_child(r->root, r->block));
    }
    for (int l = 0; l < LAYERS && !fails; l++)
        fails += declare_layer(r, bo, l);
    if (fails)
        return fails;
    fsdp2_shard_options_t opts = FSDP2_SHARD_OPTIONS_INIT;
    opts.mesh = r->mesh;
    opts.reshard_after_forward = bo->reshard_after_forward;
    opts.unsharded_buffers = bo->unsharded_buffers;
    if (bo->ignore_fc2_bias) {
        r->ignored[1][1] = 1;
        r->ignored_list[0] = r->p[1][1];
        opts.ignored_params = r->ignored_list;
        opts.num_ignored_params = 1;
    }
    r->opts = opts;
    if (bo->shard == SHARD_BY_CALLER)
        return fails;
    r->allocated_before_shard = cpu_allocated(r, NULL);
    for (int l = 0; l < LAYERS && !fails; l++)
        fails += OK(c, fsdp2_fully_shard(r->fc[l], &r->opts));
    if (!fails && r->block)
        fails += OK(c, fsdp2_fully_shard(r->block, &r->opts));
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(r->root, &r->opts));
    r->allocated_after_shard = cpu_allocated(r, NULL);
    return fails + run_bind_hooks(r);
}

/* ---------------------------------------------------------------------------------- */
/* The sharded run: the step                                                           */

int unsharded_view(run_t *r, int l, int kind, float **data)
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

/* Layer l's forward on the whole parameters; act[l] -> act[l + 1]. */
static int compute_forward(run_t *r, int l, int n)
{
    work_t *w = &r->work;
    float *W = NULL, *b = NULL;
    int fails = unsharded_view(r, l, 0, &W);
    fails += unsharded_view(r, l, 1, &b);
    if (!fails)
        layer_forward(W, b, DIM[l], DIM[l + 1], n, w->act[l], w->act[l + 1], l < LAYERS - 1);
    return fails;
}

/* Layer l's backward: its gradients into the library's views, dx for the layer below. */
static int compute_backward(run_t *r, int l, int n)
{
    work_t *w = &r->work;
    float *W = NULL;
    int fails = unsharded_view(r, l, 0, &W);
    if (fails)
        return fails;
    memset(w->dW, 0, sizeof(w->dW));
    memset(w->db, 0, sizeof(w->db));
    layer_backward(W, DIM[l], DIM[l + 1], n, w->act[l], w->delta, w->dW, w->db,
                   l > 0 ? w->dx : NULL);
    fails += add_grad(r, l, 0, w->dW);
    if (!r->frozen_bias[l])
        fails += add_grad(r, l, 1, w->db);
    return fails;
}

typedef struct layer_call {
    run_t *r;
    fsdp2_phase_t phase;
    int layer, n;
    int fails;
} layer_call_t;

/* fsdp2_module_run's fn: the layer's work between the hooks, then the injected error. */
static fsdp2_status_t layer_fn(fsdp2_module_t *m, void *ctx)
{
    layer_call_t *lc = ctx;
    run_t *r = lc->r;
    int l = lc->layer, fwd = lc->phase == FSDP2_PHASE_FORWARD;
    fsdp2_training_state_t want = fwd ? FSDP2_STATE_FORWARD : FSDP2_STATE_BACKWARD;
    fsdp2_training_state_t ts = state_of(r, r->fc[l]).training_state;
    lc->fails += RANK_CHECK(r->c, m == r->fc[l] && ts == want,
                            "step %d: module_run(%s) gave fn module %p (want %p) in state %s "
                            "(want %s)",
                            r->step, LAYER_NAME[l], (void *)m, (void *)r->fc[l],
                            training_state_name(ts), training_state_name(want));
    lc->fails += probe(r, fwd ? PROBE_PRE_FORWARD : PROBE_PRE_BACKWARD, l);
    lc->fails += fwd ? compute_forward(r, l, lc->n) : compute_backward(r, l, lc->n);
    if (!r->inject[lc->phase][l])
        return FSDP2_SUCCESS;
    char name[64];
    snprintf(name, sizeof(name), "injected_%s_%s", fwd ? "forward" : "backward", LAYER_NAME[l]);
    fsdp2_param_t *none = NULL;
    fsdp2_status_t s = fsdp2_module_find_param(m, name, &none);
    snprintf(r->fn_message, sizeof(r->fn_message), "%s", fsdp2_last_error());
    lc->fails += RANK_CHECK(r->c, s == FSDP2_ERR_NOT_FOUND && strstr(r->fn_message, name),
                            "find_param('%s') = %s '%s', want ERR_NOT_FOUND naming it", name,
                            fsdp2_status_name(s), r->fn_message);
    return s;
}

/* Layer l through fsdp2_module_run: fn's error comes back after the post hook ran. */
static int run_layer_via_module_run(run_t *r, fsdp2_phase_t phase, int l, int n)
{
    rank_ctx_t *c = r->c;
    layer_call_t lc = {r, phase, l, n, 0};
    fsdp2_status_t s = fsdp2_module_run(r->fc[l], phase, layer_fn, &lc);
    int fails = lc.fails, fwd = phase == FSDP2_PHASE_FORWARD;
    if (!r->inject[phase][l]) {
        fails += OK(c, s);
    } else {
        const char *msg = fsdp2_last_error();
        fails += RANK_CHECK(c, s == FSDP2_ERR_NOT_FOUND && strcmp(msg, r->fn_message) == 0,
                            "step %d: module_run(%s, %s) = %s with last error '%s'; want fn's "
                            "ERR_NOT_FOUND '%s'",
                            r->step, LAYER_NAME[l], fwd ? "forward" : "backward",
                            fsdp2_status_name(s), msg, r->fn_message);
    }
    fsdp2_training_state_t want = fwd ? FSDP2_STATE_AFTER_FORWARD : FSDP2_STATE_AFTER_BACKWARD;
    fsdp2_training_state_t ts = state_of(r, r->fc[l]).training_state;
    fails += RANK_CHECK(c, ts == want, "step %d: %s is %s after module_run%s, want %s (post hook "
                                       "ran)",
                        r->step, LAYER_NAME[l], training_state_name(ts),
                        r->inject[phase][l] ? " whose fn failed" : "", training_state_name(want));
    return fails;
}

/* Layer l of the given phase, inside its hooks when it is a group of its own. */
static int run_layer(run_t *r, fsdp2_phase_t phase, int l, int n)
{
    rank_ctx_t *c = r->c;
    int fwd = phase == FSDP2_PHASE_FORWARD;
    if (!r->hook[l])
        return fwd ? compute_forward(r, l, n) : compute_backward(r, l, n);
    int fails = 0;
    if (r->use_module_run) {
        fails += run_layer_via_module_run(r, phase, l, n);
    } else {
        fails += OK(c, fwd ? fsdp2_pre_forward(r->fc[l]) : fsdp2_pre_backward(r->fc[l]));
        if (fails)
            return fails;
        fails += probe(r, fwd ? PROBE_PRE_FORWARD : PROBE_PRE_BACKWARD, l);
        fails += fwd ? compute_forward(r, l, n) : compute_backward(r, l, n);
        if (fails)
            return fails;
        fails += OK(c, fwd ? fsdp2_post_forward(r->fc[l]) : fsdp2_post_backward(r->fc[l]));
    }
    return fails + probe(r, fwd ? PROBE_POST_FORWARD : PROBE_POST_BACKWARD, l);
}

/* Forward over this rank's samples; activations in r->work. */
int run_forward(run_t *r, const int *samples, int n)
{
    rank_ctx_t *c = r->c;
    int fails = probe(r, PROBE_STEP_START, -1);
    fails += OK(c, fsdp2_pre_forward(r->root));
    if (fails)
        return fails;
    load_inputs(&r->work, samples, n);
    for (int l = 0; l < LAYERS && !fails; l++) {
        if (r->block_hook && l == 0)
            fails += OK(c, fsdp2_pre_forward(r->block));
        if (!fails)
            fails += run_layer(r, FSDP2_PHASE_FORWARD, l, n);
        if (r->block_hook && l == 1 && !fails)
            fails += OK(c, fsdp2_post_forward(r->block));
    }
    return fails ? fails : OK(c, fsdp2_post_forward(r->root));
}

int run_backward(run_t *r, const int *samples, int n)
{
    rank_ctx_t *c = r->c;
    int fails = probe(r, PROBE_BACKWARD_START, -1);
    fails += OK(c, fsdp2_pre_backward(r->root));
    if (fails)
        return fails;
    output_delta(&r->work, samples, n);
    for (int l = LAYERS - 1; l >= 0 && !fails; l--) {
        if (r->block_hook && l == 1)
            fails += OK(c, fsdp2_pre_backward(r->block));
        if (!fails)
            fails += run_layer(r, FSDP2_PHASE_BACKWARD, l, n);
        if (r->block_hook && l == 0 && !fails)
            fails += OK(c, fsdp2_post_backward(r->block));
        if (l > 0)
            hidden_delta(&r->work, l, n);
    }
    if (fails)
        return fails;
    fails += OK(c, fsdp2_post_backward(r->root));
    fails += probe(r, PROBE_BACKWARD_END, -1);
    fails += OK(c, fsdp2_backward_finish(r->root));
    return fails + probe(r, PROBE_FINISHED, -1);
}

int run_sgd(run_t *r)
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

int run_micro_batch(run_t *r, ref_model_t *ref, work_t *refwork, int micro, int micros)
{
    int samples[SAMPLES], n, all[SAMPLES], n_all;
    local_samples(r, micro, micros, samples, &n);
    global_samples(r->c->size, micro, micros, all, &n_all);
    r->micro = micro;
    int fails = run_forward(r, samples, n);
    if (!fails)
        fails += run_backward(r, samples, n);
    if (!fails)
        ref_accumulate(ref, refwork, all, n_all);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Comparisons and the training loop                                                   */

int compare_values(run_t *r, const char *what, const float *got, const float *want, int64_t n,
                   double tolerance)
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

int compare_full(run_t *r, int l, int kind, int grad, const float *want, double tolerance)
{
    rank_ctx_t *c = r->c;
    char what[64];
    snprintf(what, sizeof(what), "%s.%s%s", LAYER_NAME[l], kind ? "bias" : "weight",
             grad ? " grad" : "");
    int64_t numel = (int64_t)DIM[l + 1] * (kind ? 1 : DIM[l]);
    if (r->ignored[l][kind] && !grad) { /* no DTensor: the declared tensor, whole */
        float *v = NULL;
        int fails = unsharded_view(r, l, kind, &v);
        return fails ? fails : compare_values(r, what, v, want, numel, tolerance);
    }
    fsdp2_dtensor_t *dt = NULL;
    int fails = grad ? OK(c, fsdp2_param_sharded_grad(r->p[l][kind], &dt))
                     : OK(c, fsdp2_param_sharded(r->p[l][kind], &dt));
    if (fails || !dt)
        return fails + RANK_CHECK(c, dt != NULL, "%s: no DTensor", what);
    fsdp2_tensor_t *full = NULL;
    fails += OK(c, fsdp2_dtensor_full_tensor(dt, NULL, &full));
    if (fails)
        return fails;
    fails += RANK_CHECK(c, full->numel == numel && full->dtype == FSDP2_F32,
                        "%s: full tensor has %lld elements of %s, want %lld f32", what,
                        (long long)full->numel, fsdp2_dtype_name(full->dtype), (long long)numel);
    if (!fails)
        fails += compare_values(r, what, full->data, want, numel, tolerance);
    fsdp2_tensor_release(full);
    return fails;
}

int compare_params(run_t *r, const ref_model_t *ref)
{
    int fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        fails += compare_full(r, l, 0, 0, ref->w[l], TOLERANCE);
        fails += compare_full(r, l, 1, 0, ref->b[l], TOLERANCE);
    }
    return fails;
}

int compare_grads(run_t *r, const ref_model_t *ref)
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

int run_train(run_t *r, ref_model_t *ref, int first_step, int steps, int check_grads)
{
    work_t *refwork = malloc(sizeof(*refwork));
    int fails = 0;
    for (int s = first_step; s < first_step + steps && !fails; s++) {
        r->step = s;
        fails += run_micro_batch(r, ref, refwork, 0, 1);
        if (fails)
            break;
        if (check_grads)
            fails += compare_grads(r, ref);
        fails += run_sgd(r);
        ref_sgd(ref);
        fails += probe(r, PROBE_OPTIMIZED, -1);
        fails += compare_params(r, ref);
        fails += probe(r, PROBE_STEP_END, -1);
    }
    free(refwork);
    return fails;
}

void run_case(int ws, rank_fn body, const char *what)
{
    ranks_result_t res;
    int rc = run_ranks(ws, body, NULL, GROUP_TIMEOUT_MS, DEADLINE_S, &res);
    ck_assert_msg(rc == 0, "%s with %d ranks: %s (rank exit codes %d %d %d %d; see stderr)", what,
                  ws, res.timed_out ? "timed out" : "a rank failed", res.status[0],
                  res.status[1], res.status[2], res.status[3]);
}
