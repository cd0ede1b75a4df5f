/* Optimizers and gradient clipping on real shards: 1, 2, 3 and 4 processes on a 1D mesh.
 *
 * The tree has the uneven shapes of an MLP, so every way torch.chunk splits rows shows
 * up: fc1.weight [7,13] (2,2,2,1 rows over 4 ranks), fc1.bias [7], fc2.weight [5,7]
 * (2,2,1,0), fc2.bias [5] frozen, fc3.weight [3,5] and fc3.bias [3] (fewer rows than
 * ranks: rank 3 holds nothing), and a root parameter "scale" [4] left unsharded
 * (ignored_params). No forward math runs: each step drives the hooks and, inside each
 * module's backward, adds a per-rank gradient formula into fsdp2_param_grad, so the
 * sharded gradient is the average over ranks of the formula.
 *
 * The reference is one process holding whole tensors in plain C arrays, stepped the way
 * torch.optim's single-tensor path does it: one whole-tensor loop per torch op, in f32
 * with the coefficients computed in double (the library fuses those ops into one pass;
 * the numbers must not depend on that, nor on how the rows are split). After each of 20
 * steps every parameter, gathered with fsdp2_dtensor_full_tensor, must match it to 1e-6
 * relative (to max(|ref|, 1e-3)); after the last, every state tensor too (to the
 * tensor's largest element). The frozen and the ignored parameter must not change, and
 * a step must not allocate device memory.
 *
 * Gradient clipping: the norm (2 and INFINITY) against the norm of the reference's
 * whole gradients, and the clipped gradients against the reference scaled by
 * max_norm / (norm + 1e-6); a max_norm above the norm changes nothing. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp.h>
#include <fsdp2/optim.h>
#ifdef _OPENMP
#include <omp.h>
#else
static void omp_set_num_threads(int threads) /* the TSan build has no OpenMP */
{
    (void)threads;
}
#endif

#include "../collectives/ranks.h"
#include "../core/check_main.h"

#define LAYERS 3
#define NP 6 /* parameters in the fc modules, [layer * 2 + kind] */
#define MAXN (7 * 13)
#define STEPS 20
#define TOLERANCE 1e-6
#define GROUP_TIMEOUT_MS 20000
#define DEADLINE_S 120

static const int DIM[LAYERS + 1] = {13, 7, 5, 3};
static const char *const LAYER_NAME[LAYERS] = {"fc1", "fc2", "fc3"};
#define FROZEN 3 /* fc2.bias */

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;

static int rows_of(int j)
{
    return DIM[j / 2 + 1];
}

static int row_numel_of(int j)
{
    return j % 2 ? 1 : DIM[j / 2];
}

static int numel_of(int j)
{
    return rows_of(j) * row_numel_of(j);
}

static void fqn_of(int j, char *buf, size_t len)
{
    snprintf(buf, len, "%s.%s", LAYER_NAME[j / 2], j % 2 ? "bias" : "weight");
}

static float init_value(int j, int k)
{
    return (float)(0.3 * sin(0.7 * k + j + 1));
}

static float scale_value(int k)
{
    return 1.0f + 0.5f * (float)k;
}

/* Rank r's gradient: multiples of 1/64, so the ranks' sum is exact in f32 and the
 * average is one rounding however it is taken. */
static double rank_grad(int rank, int step, int j, int k)
{
    return (double)((k * 7 + rank * 13 + step * 5 + j * 3) % 17 - 8) / 64.0;
}

/* The sharded gradient every rank should hold: the average over ws ranks, in f32. */
static float mean_grad(int ws, int step, int j, int k)
{
    double sum = 0;
    for (int r = 0; r < ws; r++)
        sum += rank_grad(r, step, j, k);
    return (float)(sum / ws);
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

/* Largest error of got against want relative to max(|want|, floor); prints the worst. */
static int compare(const rank_ctx_t *c, const char *what, int step, const float *got,
                   const float *want, int n, double floor, double tolerance)
{
    double worst = 0;
    int at = -1;
    for (int k = 0; k < n; k++) {
        double den = fmax(fabs((double)want[k]), floor);
        double e = fabs((double)got[k] - (double)want[k]) / den;
        if (isnan(e) || e > worst) {
            worst = isnan(e) ? INFINITY : e;
            at = k;
        }
    }
    return RANK_CHECK(c, worst <= tolerance,
                      "step %d: %s[%d] is %.9g, reference %.9g (relative error %.3g > %.0e)",
                      step, what, at, at >= 0 ? got[at] : 0.0, at >= 0 ? want[at] : 0.0, worst,
                      tolerance);
}

static double max_abs(const float *v, int n)
{
    double m = 0;
    for (int k = 0; k < n; k++)
        m = fmax(m, fabs((double)v[k]));
    return m;
}

/* Gathers dt whole (collective) and compares it with want. floor < 0: the tensor's
 * largest reference element. */
static int compare_full(const rank_ctx_t *c, const char *what, int step,
                        const fsdp2_dtensor_t *dt, const float *want, int n, double floor,
                        double tolerance)
{
    fsdp2_tensor_t *full = NULL;
    int fails = OK(c, fsdp2_dtensor_full_tensor(dt, NULL, &full));
    if (fails)
        return fails;
    fails += RANK_CHECK(c, full->numel == n && full->dtype == FSDP2_F32,
                        "%s: full tensor of %lld %s, want %d f32", what, (long long)full->numel,
                        fsdp2_dtype_name(full->dtype), n);
    if (floor < 0)
        floor = fmax(max_abs(want, n), 1e-30);
    if (!fails)
        fails += compare(c, what, step, full->data, want, n, floor, tolerance);
    fsdp2_tensor_release(full);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* The sharded tree and its step                                                       */

typedef struct run {
    rank_ctx_t *c;
    fsdp2_mesh_t *mesh;
    fsdp2_module_t *root;
    fsdp2_module_t *fc[LAYERS];
    fsdp2_param_t *p[NP];
    fsdp2_param_t *scale;
} run_t;

static fsdp2_status_t declare(fsdp2_module_t *m, const char *name, int ndim, const int64_t *shape,
                              int j, int requires_grad, fsdp2_param_t **param)
{
    fsdp2_tensor_t *t = NULL;
    fsdp2_status_t s = fsdp2_tensor_empty(CPU, FSDP2_F32, ndim, shape, &t);
    if (s != FSDP2_SUCCESS)
        return s;
    float *v = t->data;
    for (int64_t k = 0; k < t->numel; k++)
        v[k] = j >= 0 ? init_value(j, (int)k) : scale_value((int)k);
    s = fsdp2_module_add_param(m, name, t, requires_grad, param);
    fsdp2_tensor_release(t); /* the module keeps its own reference */
    return s;
}

static int run_open(rank_ctx_t *c, run_t *r)
{
    memset(r, 0, sizeof(*r));
    r->c = c;
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = GROUP_TIMEOUT_MS; /* a rank that fails early must not hang the others */
    int ws = c->size;
    int fails = OK(c, fsdp2_mesh_create(c->store, "optim", c->rank, c->size, 1, &ws, NULL, &go,
                                        &r->mesh));
    fails += OK(c, fsdp2_module_create("", &r->root));
    if (fails)
        return fails;
    int64_t scale_shape[1] = {4};
    fails += OK(c, declare(r->root, "scale", 1, scale_shape, -1, 1, &r->scale));
    for (int l = 0; l < LAYERS && !fails; l++) {
        fails += OK(c, fsdp2_module_create(LAYER_NAME[l], &r->fc[l]));
        if (fails)
            break;
        fails += OK(c, fsdp2_module_add_child(r->root, r->fc[l]));
        for (int kind = 0; kind < 2 && !fails; kind++) {
            int j = 2 * l + kind;
            int64_t shape[2] = {DIM[l + 1], DIM[l]};
            fails += OK(c, declare(r->fc[l], kind ? "bias" : "weight", kind ? 1 : 2, shape, j,
                                   j != FROZEN, &r->p[j]));
        }
    }
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    so.mesh = r->mesh;
    so.ignored_params = &r->scale;
    so.num_ignored_params = 1;
    for (int l = 0; l < LAYERS && !fails; l++)
        fails += OK(c, fsdp2_fully_shard(r->fc[l], &so));
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(r->root, &so));
    return fails;
}

static int run_close(run_t *r)
{
    int fails = 0;
    if (r->root) {
        fails += OK(r->c, fsdp2_module_synchronize(r->root));
        fails += OK(r->c, fsdp2_module_destroy(r->root));
    }
    return fails + OK(r->c, fsdp2_mesh_destroy(r->mesh));
}

static int add_rank_grad(run_t *r, int j, int step)
{
    fsdp2_tensor_t *g = NULL;
    int fails = OK(r->c, fsdp2_param_grad(r->p[j], &g));
    if (fails)
        return fails;
    fails += RANK_CHECK(r->c, g->numel == numel_of(j) && g->dtype == FSDP2_F32,
                        "param %d: grad of %lld elements, want %d", j, (long long)g->numel,
                        numel_of(j));
    float *v = g->data;
    for (int k = 0; k < numel_of(j) && !fails; k++)
        v[k] += (float)rank_grad(r->c->rank, step, j, k);
    return fails;
}

/* The hooks of one step with no math: forward in tree order, backward in reverse, each
 * module's backward adding this rank's gradient formula. */
static int forward_backward(run_t *r, int step)
{
    rank_ctx_t *c = r->c;
    int fails = OK(c, fsdp2_pre_forward(r->root));
    for (int l = 0; l < LAYERS && !fails; l++) {
        fails += OK(c, fsdp2_pre_forward(r->fc[l]));
        fails += OK(c, fsdp2_post_forward(r->fc[l]));
    }
    if (!fails)
        fails += OK(c, fsdp2_post_forward(r->root));
    if (!fails)
        fails += OK(c, fsdp2_pre_backward(r->root));
    for (int l = LAYERS - 1; l >= 0 && !fails; l--) {
        fails += OK(c, fsdp2_pre_backward(r->fc[l]));
        for (int kind = 0; kind < 2 && !fails; kind++)
            if (2 * l + kind != FROZEN)
                fails += add_rank_grad(r, 2 * l + kind, step);
        fails += OK(c, fsdp2_post_backward(r->fc[l]));
    }
    if (!fails)
        fails += OK(c, fsdp2_post_backward(r->root));
    return fails ? fails : OK(c, fsdp2_backward_finish(r->root));
}

/* ---------------------------------------------------------------------------------- */
/* The reference: whole tensors, torch's op sequence, one loop per op                  */

typedef struct ref {
    float p[NP][MAXN];
    float a[NP][MAXN], b[NP][MAXN]; /* momentum_buffer | exp_avg, exp_avg_sq | square_avg,
                                       acc_delta */
    float g[NP][MAXN], tmp[MAXN];
} ref_t;

static void ref_init(ref_t *ref)
{
    memset(ref, 0, sizeof(*ref));
    for (int j = 0; j < NP; j++)
        for (int k = 0; k < numel_of(j); k++)
            ref->p[j][k] = init_value(j, k);
}

static void ref_grads(ref_t *ref, int ws, int step)
{
    for (int j = 0; j < NP; j++)
        for (int k = 0; k < numel_of(j); k++)
            ref->g[j][k] = j == FROZEN ? 0.0f : mean_grad(ws, step, j, k);
}

/* torch.optim.sgd._single_tensor_sgd on one parameter. */
static void ref_sgd(const fsdp2_optimizer_options_t *o, int first, int n, float *p, const float *grad,
                    float *buf, float *g)
{
    memcpy(g, grad, (size_t)n * sizeof(*g));
    if (o->weight_decay != 0) /* grad = grad.add(param, alpha=weight_decay) */
        for (int k = 0; k < n; k++)
            g[k] = g[k] + (float)o->weight_decay * p[k];
    if (o->momentum != 0) {
        if (first) { /* buf = torch.clone(grad) */
            memcpy(buf, g, (size_t)n * sizeof(*g));
        } else { /* buf.mul_(momentum).add_(grad, alpha=1 - dampening) */
            for (int k = 0; k < n; k++)
                buf[k] = buf[k] * (float)o->momentum;
            for (int k = 0; k < n; k++)
                buf[k] = buf[k] + (float)(1 - o->dampening) * g[k];
        }
        if (o->nesterov) /* grad = grad.add(buf, alpha=momentum) */
            for (int k = 0; k < n; k++)
                g[k] = g[k] + (float)o->momentum * buf[k];
        else
            memcpy(g, buf, (size_t)n * sizeof(*g));
    }
    for (int k = 0; k < n; k++) /* param.add_(grad, alpha=-lr) */
        p[k] = p[k] + (float)-o->lr * g[k];
}

/* torch.optim.adamw (the single-tensor Adam with decoupled weight decay), step t. */
static void ref_adamw(const fsdp2_optimizer_options_t *o, int t, int n, float *p, const float *g,
                      float *m, float *v, float *denom)
{
    for (int k = 0; k < n; k++) /* param.mul_(1 - lr * weight_decay) */
        p[k] = p[k] * (float)(1 - o->lr * o->weight_decay);
    float w = (float)(1 - o->beta1);
    for (int k = 0; k < n; k++) /* exp_avg.lerp_(grad, 1 - beta1); weight < 0.5 */
        m[k] = m[k] + w * (g[k] - m[k]);
    for (int k = 0; k < n; k++) /* exp_avg_sq.mul_(beta2) */
        v[k] = v[k] * (float)o->beta2;
    for (int k = 0; k < n; k++) /* .addcmul_(grad, grad, value=1 - beta2) */
        v[k] = v[k] + (float)(1 - o->beta2) * g[k] * g[k];
    double bc1 = 1 - pow(o->beta1, t), bc2 = 1 - pow(o->beta2, t);
    for (int k = 0; k < n; k++) /* (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) */
        denom[k] = sqrtf(v[k]);
    for (int k = 0; k < n; k++)
        denom[k] = denom[k] / (float)sqrt(bc2);
    for (int k = 0; k < n; k++)
        denom[k] = denom[k] + (float)o->eps;
    for (int k = 0; k < n; k++) /* param.addcdiv_(exp_avg, denom, value=-lr / bc1) */
        p[k] = p[k] + (float)(-o->lr / bc1) * (m[k] / denom[k]);
}

/* torch.optim.adadelta._single_tensor_adadelta. */
static void ref_adadelta(const fsdp2_optimizer_options_t *o, int n, float *p, const float *grad,
                         float *sq, float *acc, float *g)
{
    float delta[MAXN], std[MAXN];
    memcpy(g, grad, (size_t)n * sizeof(*g));
    if (o->weight_decay != 0)
        for (int k = 0; k < n; k++)
            g[k] = g[k] + (float)o->weight_decay * p[k];
    for (int k = 0; k < n; k++) /* square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho) */
        sq[k] = sq[k] * (float)o->rho;
    for (int k = 0; k < n; k++)
        sq[k] = sq[k] + (float)(1 - o->rho) * g[k] * g[k];
    for (int k = 0; k < n; k++) /* std = square_avg.add(eps).sqrt_() */
        std[k] = sqrtf(sq[k] + (float)o->eps);
    for (int k = 0; k < n; k++) /* delta = acc_delta.add(eps).sqrt_() */
        delta[k] = sqrtf(acc[k] + (float)o->eps);
    for (int k = 0; k < n; k++) /* delta.div_(std).mul_(grad) */
        delta[k] = delta[k] / std[k];
    for (int k = 0; k < n; k++)
        delta[k] = delta[k] * g[k];
    for (int k = 0; k < n; k++) /* acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho) */
        acc[k] = acc[k] * (float)o->rho;
    for (int k = 0; k < n; k++)
        acc[k] = acc[k] + (float)(1 - o->rho) * delta[k] * delta[k];
    for (int k = 0; k < n; k++) /* param.add_(delta, alpha=-lr) */
        p[k] = p[k] + (float)-o->lr * delta[k];
}

/* The grouped runs: matrices (even j) decay by GROUP_DECAY at the optimizer's lr,
 * vectors do not decay and train at GROUP_LR_SCALE of it. */
#define GROUP_DECAY 0.1
#define GROUP_LR_SCALE 0.5

static void ref_step(ref_t *ref, const fsdp2_optimizer_options_t *options, int t, int grouped)
{
    for (int j = 0; j < NP; j++) {
        if (j == FROZEN)
            continue;
        int n = numel_of(j);
        fsdp2_optimizer_options_t group = *options, *o = &group;
        if (grouped) {
            group.weight_decay = j % 2 ? 0.0 : GROUP_DECAY;
            group.lr = j % 2 ? options->lr * GROUP_LR_SCALE : options->lr;
        }
        switch (o->kind) {
        case FSDP2_OPTIMIZER_SGD:
            ref_sgd(o, t == 1, n, ref->p[j], ref->g[j], ref->a[j], ref->tmp);
            break;
        case FSDP2_OPTIMIZER_ADAMW:
            ref_adamw(o, t, n, ref->p[j], ref->g[j], ref->a[j], ref->b[j], ref->tmp);
            break;
        case FSDP2_OPTIMIZER_ADADELTA:
            ref_adadelta(o, n, ref->p[j], ref->g[j], ref->a[j], ref->b[j], ref->tmp);
            break;
        }
    }
}

/* ---------------------------------------------------------------------------------- */
/* Training                                                                            */

static uint64_t cpu_stats(const rank_ctx_t *c, uint64_t *allocs)
{
    fsdp2_memory_stats_t st;
    memset(&st, 0, sizeof(st));
    OK(c, fsdp2_memory_stats_get(CPU, &st));
    *allocs = st.alloc_count;
    return st.allocated_bytes;
}

/* torch.chunk's rows of parameter j on this rank, written out independently. */
static int local_rows(const rank_ctx_t *c, int j)
{
    int n = rows_of(j), chunk = (n + c->size - 1) / c->size;
    int start = c->rank * chunk < n ? c->rank * chunk : n;
    int end = (c->rank + 1) * chunk < n ? (c->rank + 1) * chunk : n;
    return end - start;
}

static const char *const STATE_NAMES[3][2] = {
    {"momentum_buffer", NULL}, {"exp_avg", "exp_avg_sq"}, {"square_avg", "acc_delta"}};

static int state_count(const fsdp2_optimizer_options_t *o)
{
    return o->kind == FSDP2_OPTIMIZER_SGD ? (o->momentum != 0) : 2;
}

/* Each state is a Shard(0) DTensor of the parameter's global shape on its mesh, with
 * this rank's rows; the frozen parameter has none. */
static int check_state_layout(run_t *r, const fsdp2_optimizer_t *opt,
                              const fsdp2_optimizer_options_t *o)
{
    rank_ctx_t *c = r->c;
    int fails = 0;
    const char *names[2] = {NULL, NULL};
    size_t count = 0;
    fails += OK(c, fsdp2_optimizer_state_names(opt, names, 2, &count));
    fails += RANK_CHECK(c, (int)count == state_count(o), "%zu state names, want %d", count,
                        state_count(o));
    for (int s = 0; s < (int)count && s < 2 && !fails; s++)
        fails += RANK_CHECK(c, names[s] && !strcmp(names[s], STATE_NAMES[o->kind][s]),
                            "state name %d is '%s', want '%s'", s, names[s] ? names[s] : "",
                            STATE_NAMES[o->kind][s]);
    for (int j = 0; j < NP && !fails; j++) {
        char fqn[64];
        fqn_of(j, fqn, sizeof(fqn));
        for (int s = 0; s < state_count(o) && !fails; s++) {
            fsdp2_dtensor_t *dt = NULL;
            fsdp2_status_t st = fsdp2_optimizer_state(opt, r->p[j], names[s], &dt);
            if (j == FROZEN) {
                fails += RANK_CHECK(c, st == FSDP2_ERR_NOT_FOUND && strstr(fsdp2_last_error(), fqn),
                                    "frozen %s has state '%s' (%s)", fqn, names[s],
                                    fsdp2_status_name(st));
                continue;
            }
            fails += OK(c, st);
            if (fails)
                break;
            fsdp2_dtensor_info_t info;
            fsdp2_mesh_t *mesh = NULL;
            fails += OK(c, fsdp2_dtensor_info(dt, &info));
            fails += OK(c, fsdp2_dtensor_mesh(dt, &mesh));
            int ndim = j % 2 ? 1 : 2;
            int ok = mesh == r->mesh && info.ndim == ndim && info.dtype == FSDP2_F32 &&
                     info.shape[0] == rows_of(j) && (ndim == 1 || info.shape[1] == DIM[j / 2]) &&
                     info.local_shape[0] == local_rows(c, j) && info.mesh_ndim == 1 &&
                     info.placements[0].type == FSDP2_PLACEMENT_SHARD &&
                     info.placements[0].dim == 0;
            fails += RANK_CHECK(c, ok,
                                "%s %s: %d-D [%lld,%lld] local rows %lld, want %d-D [%d,%d] local "
                                "rows %d Shard(0) on the parameter's mesh",
                                fqn, names[s], info.ndim, (long long)info.shape[0],
                                (long long)info.shape[1], (long long)info.local_shape[0], ndim,
                                rows_of(j), ndim == 1 ? 0 : DIM[j / 2], local_rows(c, j));
        }
    }
    return fails;
}

/* The frozen parameter and the ignored one hold their declared values, bitwise. */
static int check_untouched(run_t *r, int step)
{
    float want[MAXN];
    for (int k = 0; k < numel_of(FROZEN); k++)
        want[k] = init_value(FROZEN, k);
    fsdp2_dtensor_t *dt = NULL;
    int fails = OK(r->c, fsdp2_param_sharded(r->p[FROZEN], &dt));
    if (!fails)
        fails += compare_full(r->c, "frozen fc2.bias", step, dt, want, numel_of(FROZEN), 1.0, 0.0);
    fsdp2_tensor_t *scale = NULL;
    fails += OK(r->c, fsdp2_param_unsharded(r->scale, &scale));
    if (fails)
        return fails;
    float scale_want[4];
    for (int k = 0; k < 4; k++)
        scale_want[k] = scale_value(k);
    return fails + compare(r->c, "ignored scale", step, scale->data, scale_want, 4, 1.0, 0.0);
}

static int compare_params(run_t *r, const ref_t *ref, int step)
{
    int fails = 0;
    for (int j = 0; j < NP; j++) {
        char fqn[64];
        fqn_of(j, fqn, sizeof(fqn));
        fsdp2_dtensor_t *dt = NULL;
        fails += OK(r->c, fsdp2_param_sharded(r->p[j], &dt));
        if (!fails)
            fails += compare_full(r->c, fqn, step, dt, ref->p[j], numel_of(j), 1e-3, TOLERANCE);
    }
    return fails;
}

static int compare_states(run_t *r, const fsdp2_optimizer_t *opt,
                          const fsdp2_optimizer_options_t *o, const ref_t *ref, int step)
{
    int fails = 0;
    for (int j = 0; j < NP; j++) {
        if (j == FROZEN)
            continue;
        for (int s = 0; s < state_count(o); s++) {
            char what[96];
            fqn_of(j, what, sizeof(what));
            strncat(what, " ", sizeof(what) - strlen(what) - 1);
            strncat(what, STATE_NAMES[o->kind][s], sizeof(what) - strlen(what) - 1);
            fsdp2_dtensor_t *dt = NULL;
            fails += OK(r->c, fsdp2_optimizer_state(opt, r->p[j], STATE_NAMES[o->kind][s], &dt));
            if (!fails)
                fails += compare_full(r->c, what, step, dt, s ? ref->b[j] : ref->a[j],
                                      numel_of(j), -1.0, TOLERANCE);
        }
    }
    return fails;
}

static int pick_matrices(const fsdp2_param_info_t *info, void *user)
{
    return info->ndim == 2 && user == NULL;
}

static int pick_vectors(const fsdp2_param_info_t *info, void *user)
{
    return info->ndim == 1 && user == NULL;
}

/* Matrices decay, vectors train at a fraction of the lr: 3 and 2 trained (fc2.bias is
 * frozen). */
static int set_groups(rank_ctx_t *c, fsdp2_optimizer_t *opt)
{
    fsdp2_param_group_t decay = FSDP2_PARAM_GROUP_INIT, slow = FSDP2_PARAM_GROUP_INIT;
    decay.weight_decay = GROUP_DECAY;
    slow.lr_scale = GROUP_LR_SCALE;
    size_t matrices = 0, vectors = 0;
    int fails = OK(c, fsdp2_optimizer_add_param_group(opt, &decay, pick_matrices, NULL, &matrices));
    fails += OK(c, fsdp2_optimizer_add_param_group(opt, &slow, pick_vectors, NULL, &vectors));
    fails += RANK_CHECK(c, matrices == 3 && vectors == 2,
                        "groups picked %zu matrices and %zu vectors, want 3 and 2", matrices,
                        vectors);
    /* bad groups change nothing: the run below checks every value */
    fsdp2_param_group_t bad = decay;
    bad.weight_decay = -0.5;
    fsdp2_status_t st = fsdp2_optimizer_add_param_group(opt, &bad, pick_vectors, NULL, NULL);
    fails += RANK_CHECK(c, st == FSDP2_ERR_INVALID_ARGUMENT &&
                               strstr(fsdp2_last_error(), "weight_decay -0.5"),
                        "weight_decay -0.5: %s (%s)", fsdp2_status_name(st), fsdp2_last_error());
    bad = slow;
    bad.size = 3;
    st = fsdp2_optimizer_add_param_group(opt, &bad, pick_vectors, NULL, NULL);
    fails += RANK_CHECK(c, st == FSDP2_ERR_INVALID_ARGUMENT, "size 3: %s (%s)",
                        fsdp2_status_name(st), fsdp2_last_error());
    return fails;
}

static int train(run_t *r, const fsdp2_optimizer_options_t *o, int grouped)
{
    rank_ctx_t *c = r->c;
    fsdp2_optimizer_t *opt = NULL;
    uint64_t allocs0, allocs1;
    uint64_t before = cpu_stats(c, &allocs0);
    int fails = OK(c, fsdp2_optimizer_create(r->root, o, &opt));
    if (fails)
        return fails;
    /* The state, allocated once: this rank's rows of every trained parameter. */
    uint64_t want_bytes = 0;
    for (int j = 0; j < NP; j++)
        if (j != FROZEN)
            want_bytes += (uint64_t)local_rows(c, j) * row_numel_of(j) * sizeof(float) *
                          (uint64_t)state_count(o);
    uint64_t after = cpu_stats(c, &allocs1);
    fails += RANK_CHECK(c, after - before == want_bytes,
                        "optimizer_create allocated %llu bytes, want %llu of state",
                        (unsigned long long)(after - before), (unsigned long long)want_bytes);
    uint64_t reported = 0;
    fails += OK(c, fsdp2_optimizer_state_bytes(opt, &reported));
    fails += RANK_CHECK(c, reported == want_bytes, "optimizer_state_bytes %llu, want %llu",
                        (unsigned long long)reported, (unsigned long long)want_bytes);
    fails += check_state_layout(r, opt, o);
    if (grouped && !fails)
        fails += set_groups(c, opt);
    ref_t *ref = malloc(sizeof(*ref));
    ref_init(ref);
    for (int s = 0; s < STEPS && !fails; s++) {
        fails += forward_backward(r, s);
        if (fails)
            break;
        ref_grads(ref, c->size, s);
        before = cpu_stats(c, &allocs0);
        fails += OK(c, fsdp2_optimizer_step(opt));
        fails += OK(c, fsdp2_optimizer_zero_grad(opt));
        after = cpu_stats(c, &allocs1);
        fails += RANK_CHECK(c, after == before && allocs1 == allocs0,
                            "step %d allocated: %llu -> %llu bytes, %llu -> %llu allocations",
                            s + 1, (unsigned long long)before, (unsigned long long)after,
                            (unsigned long long)allocs0, (unsigned long long)allocs1);
        ref_step(ref, o, s + 1, grouped);
        fails += compare_params(r, ref, s + 1);
    }
    if (!fails) {
        fails += compare_states(r, opt, o, ref, STEPS);
        fails += check_untouched(r, STEPS);
    }
    int64_t steps = 0;
    fails += OK(c, fsdp2_optimizer_steps(opt, &steps));
    fails += RANK_CHECK(c, fails || steps == STEPS, "%lld steps counted, want %d",
                        (long long)steps, STEPS);
    free(ref);
    fsdp2_optimizer_destroy(opt);
    return fails;
}

typedef struct train_case {
    fsdp2_optimizer_options_t options;
    int grouped;
} train_case_t;

static int body_train(rank_ctx_t *c)
{
    const train_case_t *tc = c->arg;
    run_t r;
    int fails = run_open(c, &r);
    if (!fails)
        fails += train(&r, &tc->options, tc->grouped);
    return fails + run_close(&r);
}

/* ---------------------------------------------------------------------------------- */
/* Gradient clipping                                                                   */

static double ref_norm(const ref_t *ref, int inf)
{
    double acc = 0;
    for (int j = 0; j < NP; j++)
        for (int k = 0; k < numel_of(j); k++)
            acc = inf ? fmax(acc, fabs((double)ref->g[j][k]))
                      : acc + (double)ref->g[j][k] * ref->g[j][k];
    return inf ? acc : sqrt(acc);
}

static int compare_grads(run_t *r, const ref_t *ref, const char *what, double tolerance)
{
    int fails = 0;
    for (int j = 0; j < NP; j++) {
        if (j == FROZEN)
            continue;
        char name[96];
        fqn_of(j, name, sizeof(name));
        strncat(name, what, sizeof(name) - strlen(name) - 1);
        fsdp2_dtensor_t *dt = NULL;
        fails += OK(r->c, fsdp2_param_sharded_grad(r->p[j], &dt));
        if (!fails)
            fails += compare_full(r->c, name, 0, dt, ref->g[j], numel_of(j), 1e-3, tolerance);
    }
    return fails;
}

/* Clips with max_norm = fraction * the reference norm; checks the norm reported and
 * the gradients after. */
static int clip_once(run_t *r, ref_t *ref, double norm_type, double fraction)
{
    rank_ctx_t *c = r->c;
    int inf = isinf(norm_type);
    double want = ref_norm(ref, inf), max_norm = fraction * want, got = -1;
    int fails = OK(c, fsdp2_clip_grad_norm(r->root, max_norm, norm_type, &got));
    /* The inf-norm is an element, exactly; the 2-norm a double sum in another order. */
    fails += RANK_CHECK(c, inf ? got == want : fabs(got - want) <= 1e-12 * want,
                        "%s-norm %.17g, reference %.17g", inf ? "inf" : "2", got, want);
    double coef = max_norm / (want + 1e-6);
    if (coef < 1.0)
        for (int j = 0; j < NP; j++)
            for (int k = 0; k < numel_of(j); k++)
                ref->g[j][k] = ref->g[j][k] * (float)coef;
    char what[64];
    snprintf(what, sizeof(what), " grad clipped (%s-norm, max_norm %.3g x norm)",
             inf ? "inf" : "2", fraction);
    /* Unclipped: bitwise the same. */
    return fails + compare_grads(r, ref, what, coef < 1.0 ? TOLERANCE : 0.0);
}

/* A tree whose parameters live on two meshes ("a" on another one, "b" on the run's):
 * refused, naming both parameters, before anything is communicated. */
static int clip_other_mesh(rank_ctx_t *c, fsdp2_mesh_t *mesh)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = GROUP_TIMEOUT_MS;
    int ws = c->size;
    fsdp2_mesh_t *other = NULL;
    fsdp2_module_t *holder = NULL, *child[2] = {NULL, NULL};
    int fails = OK(c, fsdp2_mesh_create(c->store, "other", c->rank, c->size, 1, &ws, NULL, &go,
                                        &other));
    fails += OK(c, fsdp2_module_create("", &holder));
    if (fails)
        goto out;
    int64_t shape[1] = {2};
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    for (int i = 0; i < 2 && !fails; i++) {
        fails += OK(c, fsdp2_module_create(i ? "b" : "a", &child[i]));
        if (fails)
            break;
        fails += OK(c, fsdp2_module_add_child(holder, child[i]));
        if (!fails)
            fails += OK(c, declare(child[i], "w", 1, shape, 0, 1, NULL));
        so.mesh = i ? mesh : other;
        if (!fails)
            fails += OK(c, fsdp2_fully_shard(child[i], &so));
    }
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(holder, &so));
    if (!fails) {
        fsdp2_status_t st = fsdp2_clip_grad_norm(holder, 1.0, 2.0, NULL);
        const char *msg = fsdp2_last_error();
        fails += RANK_CHECK(c, st == FSDP2_ERR_INVALID_ARGUMENT && strstr(msg, "'b.w'") &&
                                   strstr(msg, "'a.w'"),
                            "clip over two meshes: %s (%s), want INVALID_ARGUMENT naming a.w "
                            "and b.w",
                            fsdp2_status_name(st), msg);
    }
out:
    fsdp2_module_destroy(holder);
    fsdp2_mesh_destroy(other);
    return fails;
}

static int body_clip(rank_ctx_t *c)
{
    run_t r;
    int fails = run_open(c, &r);
    ref_t *ref = malloc(sizeof(*ref));
    ref_init(ref);
    for (int s = 0; s < 2 && !fails; s++) {
        fails += forward_backward(&r, s);
        ref_grads(ref, c->size, s);
        if (!fails)
            fails += compare_grads(&r, ref, " grad", TOLERANCE);
        double norm_type = s == 0 ? 2.0 : INFINITY;
        if (!fails)
            fails += clip_once(&r, ref, norm_type, 4.0); /* above the norm: nothing changes */
        if (!fails)
            fails += clip_once(&r, ref, norm_type, 0.25);
        if (!fails)
            fails += clip_once(&r, ref, norm_type, 0.5); /* again, from the clipped values */
        fails += OK(c, fsdp2_module_zero_grad(r.root));
    }
    if (!fails)
        fails += clip_other_mesh(c, r.mesh);
    free(ref);
    return fails + run_close(&r);
}

/* Large gradients: a norm over hundreds of chunks of 16384 elements, the last one
 * partial, must not depend on the number of threads, and must match a long double sum. */
#define BIG_ROWS 4099
#define BIG_COLS 1025
#define BIG_N ((int)(BIG_ROWS * BIG_COLS))

/* Every rank adds the same gradient: the mean is exact. */
static float big_grad(int k)
{
    return (float)((k * 7) % 17 - 8) / 64.0f;
}

static int big_backward(rank_ctx_t *c, fsdp2_module_t *root, fsdp2_param_t *p, int nan_at)
{
    int fails = OK(c, fsdp2_pre_forward(root));
    fails += fails ? 0 : OK(c, fsdp2_post_forward(root));
    fails += fails ? 0 : OK(c, fsdp2_pre_backward(root));
    fsdp2_tensor_t *g = NULL;
    fails += fails ? 0 : OK(c, fsdp2_param_grad(p, &g));
    for (int k = 0; !fails && k < BIG_N; k++)
        ((float *)g->data)[k] += k == nan_at ? NAN : big_grad(k);
    fails += fails ? 0 : OK(c, fsdp2_post_backward(root));
    return fails ? fails : OK(c, fsdp2_backward_finish(root));
}

static int body_clip_big(rank_ctx_t *c)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = GROUP_TIMEOUT_MS;
    int ws = c->size;
    fsdp2_mesh_t *mesh = NULL;
    fsdp2_module_t *root = NULL;
    fsdp2_param_t *p = NULL;
    fsdp2_dtensor_t *dt = NULL;
    float *want = malloc(sizeof(float) * BIG_N);
    int fails = RANK_CHECK(c, want != NULL, "out of memory");
    fails += fails ? 0 : OK(c, fsdp2_mesh_create(c->store, "big", c->rank, c->size, 1, &ws,
                                                  NULL, &go, &mesh));
    fails += fails ? 0 : OK(c, fsdp2_module_create("", &root));
    int64_t shape[2] = {BIG_ROWS, BIG_COLS};
    fails += fails ? 0 : OK(c, declare(root, "w", 2, shape, 0, 1, &p));
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    so.mesh = mesh;
    fails += fails ? 0 : OK(c, fsdp2_fully_shard(root, &so));
    /* the references */
    long double sq = 0;
    float biggest = 0;
    for (int k = 0; !fails && k < BIG_N; k++) {
        want[k] = big_grad(k);
        sq += (long double)want[k] * want[k];
        biggest = fmaxf(biggest, fabsf(want[k]));
    }
    double norm2 = sqrtl(sq);
    for (int nan = 0; nan < 2 && !fails; nan++) {
        fails += big_backward(c, root, p, nan ? BIG_N - 3 : -1);
        for (int inf = 0; inf < 2 && !fails; inf++) {
            double got[3];
            for (int t = 0; t < 3 && !fails; t++) {
                omp_set_num_threads(t + 1);
                fails += OK(c, fsdp2_clip_grad_norm(root, 1e30, inf ? INFINITY : 2.0, &got[t]));
            }
            omp_set_num_threads(1);
            double ref = nan ? NAN : inf ? biggest : norm2;
            for (int t = 0; t < 3 && !fails; t++) {
                fails += RANK_CHECK(c, memcmp(&got[t], &got[0], sizeof(double)) == 0,
                                    "%s-norm on %d threads %.17g, on 1 %.17g",
                                    inf ? "inf" : "2", t + 1, got[t], got[0]);
                fails += RANK_CHECK(c, nan ? isnan(got[t]) : fabs(got[t] - ref) <= 1e-12 * ref,
                                    "%s-norm %.17g on %d threads, reference %.17g",
                                    inf ? "inf" : "2", got[t], t + 1, ref);
            }
        }
        if (!nan && !fails) { /* scaled on 3 threads: each element times (float)coef */
            double norm = 0;
            omp_set_num_threads(3);
            fails += OK(c, fsdp2_clip_grad_norm(root, 0.5 * norm2, 2.0, &norm));
            omp_set_num_threads(1);
            float coef = (float)(0.5 * norm2 / (norm + 1e-6));
            for (int k = 0; k < BIG_N; k++)
                want[k] *= coef;
            fails += fails ? 0 : OK(c, fsdp2_param_sharded_grad(p, &dt));
            fails += fails ? 0 : compare_full(c, "w grad clipped on 3 threads", 0, dt, want, BIG_N,
                                              1e-30, 0.0);
        }
        fails += OK(c, fsdp2_module_zero_grad(root));
    }
    if (root)
        fails += OK(c, fsdp2_module_destroy(root));
    if (mesh)
        fails += OK(c, fsdp2_mesh_destroy(mesh));
    free(want);
    return fails;
}

/* ---------------------------------------------------------------------------------- */

static void run_case(int ws, rank_fn body, void *arg, const char *what)
{
    ranks_result_t res;
    int rc = run_ranks(ws, body, arg, GROUP_TIMEOUT_MS, DEADLINE_S, &res);
    ck_assert_msg(rc == 0, "%s with %d ranks: %s (rank exit codes %d %d %d %d; see stderr)", what,
                  ws, res.timed_out ? "timed out" : "a rank failed", res.status[0],
                  res.status[1], res.status[2], res.status[3]);
}

START_TEST(sgd_nesterov_momentum_weight_decay_on_shards_matches_the_unsharded_reference)
{
    train_case_t tc = {FSDP2_SGD_OPTIONS_INIT(0.05), 0};
    tc.options.momentum = 0.9;
    tc.options.nesterov = 1;
    tc.options.weight_decay = 0.01;
    run_case(_i, body_train, &tc, "sgd");
}
END_TEST

START_TEST(adamw_on_shards_matches_the_unsharded_reference)
{
    train_case_t tc = {FSDP2_ADAMW_OPTIONS_INIT(1e-2), 0};
    run_case(_i, body_train, &tc, "adamw");
}
END_TEST

START_TEST(adamw_with_param_groups_on_shards_matches_the_grouped_reference)
{
    train_case_t tc = {FSDP2_ADAMW_OPTIONS_INIT(1e-2), 1};
    run_case(_i, body_train, &tc, "adamw with param groups");
}
END_TEST

START_TEST(adadelta_with_weight_decay_on_shards_matches_the_unsharded_reference)
{
    train_case_t tc = {FSDP2_ADADELTA_OPTIONS_INIT(1.0), 0};
    tc.options.weight_decay = 0.01;
    run_case(_i, body_train, &tc, "adadelta");
}
END_TEST

START_TEST(clip_grad_norm_2_and_inf_match_the_whole_gradient_norm_and_scale)
{
    run_case(_i, body_clip, NULL, "clip_grad_norm");
}
END_TEST

START_TEST(clip_grad_norm_of_large_gradients_is_the_same_on_any_thread_count)
{
    run_case(_i, body_clip_big, NULL, "clip_grad_norm of large gradients");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("optim_sharded");
    TCase *tc = tcase_create("optimizers");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, sgd_nesterov_momentum_weight_decay_on_shards_matches_the_unsharded_reference, 1, 5);
    tcase_add_loop_test(tc, adamw_on_shards_matches_the_unsharded_reference, 1, 5);
    tcase_add_loop_test(tc, adamw_with_param_groups_on_shards_matches_the_grouped_reference, 1, 5);
    tcase_add_loop_test(tc, adadelta_with_weight_decay_on_shards_matches_the_unsharded_reference, 1, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("clipping");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, clip_grad_norm_2_and_inf_match_the_whole_gradient_norm_and_scale, 1, 5);
    tcase_add_loop_test(tc, clip_grad_norm_of_large_gradients_is_the_same_on_any_thread_count, 1, 3);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
