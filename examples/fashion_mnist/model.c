/* The two models: module trees, and forward/backward through libfsdp2's hooks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model.h"

_Static_assert(sizeof(int) == sizeof(int32_t), "labels are passed to lib/nn as int32_t");

/* Activation sizes per sample, by index into a[] / d[]. */
static const int64_t mlp_sizes[3] = {512, 256, 10};
static const int64_t cnn_sizes[5] = {32 * 26 * 26, 64 * 24 * 24, 64 * 12 * 12, 128, 10};

static fsdp2_status_t add_layer(fm_model_t *m, const char *name, int conv, int in, int out,
                                int h, int w, int k)
{
    fm_layer_t *l = &m->layers[m->nlayers];
    snprintf(l->name, sizeof(l->name), "%s", name);
    l->conv = conv;
    l->in = in;
    l->out = out;
    l->h = h;
    l->w = w;
    l->k = k;
    TRY(fsdp2_module_create(name, &l->module));
    TRY(fsdp2_module_add_child(m->root, l->module));
    fsdp2_device_t meta = FSDP2_DEVICE_META_INIT;
    int64_t wshape[4] = {out, in, k, k}, bshape[1] = {out};
    int64_t fan_in = (int64_t)in * (conv ? k * k : 1);
    double bound = 1.0 / sqrt((double)fan_in);
    fsdp2_tensor_t *t;
    TRY(fsdp2_tensor_empty(meta, FSDP2_F32, conv ? 4 : 2, wshape, &t));
    fsdp2_status_t s = fsdp2_module_add_param(l->module, "weight", t, 1, &l->weight);
    fsdp2_tensor_release(t);
    TRY(s);
    TRY(fsdp2_tensor_empty(meta, FSDP2_F32, 1, bshape, &t));
    s = fsdp2_module_add_param(l->module, "bias", t, 1, &l->bias);
    fsdp2_tensor_release(t);
    TRY(s);
    uint64_t seed = m->seed * 1000 + 2 * (uint64_t)m->nlayers;
    fsdp2_random_init_t wi = FSDP2_RANDOM_UNIFORM_INIT(seed, -bound, bound);
    fsdp2_random_init_t bi = FSDP2_RANDOM_UNIFORM_INIT(seed + 1, -bound, bound);
    TRY(fsdp2_param_set_random_init(l->weight, &wi));
    TRY(fsdp2_param_set_random_init(l->bias, &bi));
    m->nlayers++;
    return FSDP2_SUCCESS;
}

static float *buffer(int64_t n)
{
    return calloc((size_t)n, sizeof(float));
}

/* The workspace the layers need: the largest of any layer's. */
static fsdp2_status_t plan_workspace(fm_model_t *m)
{
    size_t most = 0, need = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const fm_layer_t *l = &m->layers[i];
        if (l->conv)
            TRY(fsdp2_nn_conv2d_workspace_bytes(l->in, l->h, l->w, l->out, l->k, &need));
        else
            TRY(fsdp2_nn_linear_workspace_bytes(l->in, l->out, &need));
        most = need > most ? need : most;
    }
    m->ws.bytes = most;
    m->ws.data = aligned_alloc(64, (most + 63) / 64 * 64);
    return m->ws.data ? FSDP2_SUCCESS : FSDP2_ERR_OUT_OF_MEMORY;
}

fsdp2_status_t fm_model_prepare(const fm_model_t *m, int batch, fsdp2_dtype_t param_dtype)
{
    for (int i = 0; i < m->nlayers; i++) {
        const fm_layer_t *l = &m->layers[i];
        if (l->conv)
            TRY(fsdp2_nn_conv2d_prepare(batch, l->in, l->h, l->w, l->out, l->k, param_dtype,
                                        param_dtype));
        else
            TRY(fsdp2_nn_linear_prepare(batch, l->in, l->out, param_dtype, param_dtype, 1));
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fm_model_create(fm_kind_t kind, int max_batch, uint64_t seed, fm_model_t **out)
{
    fm_model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return FSDP2_ERR_OUT_OF_MEMORY;
    m->kind = kind;
    m->max_batch = max_batch;
    m->seed = seed;
    m->dropout_seed = seed;
    *out = m;
    TRY(fsdp2_module_create("", &m->root));
    if (kind == FM_MLP) {
        TRY(add_layer(m, "fc1", 0, 784, 512, 0, 0, 0));
        TRY(add_layer(m, "fc2", 0, 512, 256, 0, 0, 0));
        TRY(add_layer(m, "fc3", 0, 256, 10, 0, 0, 0));
    } else {
        TRY(add_layer(m, "conv1", 1, 1, 32, 28, 28, 3));
        TRY(add_layer(m, "conv2", 1, 32, 64, 26, 26, 3));
        TRY(add_layer(m, "fc1", 0, 9216, 128, 0, 0, 0));
        TRY(add_layer(m, "fc2", 0, 128, 10, 0, 0, 0));
    }
    TRY(plan_workspace(m));
    const int64_t *sizes = kind == FM_MLP ? mlp_sizes : cnn_sizes;
    int n = kind == FM_MLP ? 3 : 5;
    for (int i = 0; i < n; i++) {
        m->a[i] = buffer(sizes[i] * max_batch);
        m->d[i] = buffer(sizes[i] * max_batch);
        m->g[i] = buffer(sizes[i] * max_batch);
        if (!m->a[i] || !m->d[i] || !m->g[i])
            return FSDP2_ERR_OUT_OF_MEMORY;
    }
    if (kind == FM_CNN) {
        m->pool_arg = calloc((size_t)cnn_sizes[2] * max_batch, sizeof(int32_t));
        if (!m->pool_arg)
            return FSDP2_ERR_OUT_OF_MEMORY;
    }
    return FSDP2_SUCCESS;
}

void fm_model_destroy(fm_model_t *m)
{
    if (!m)
        return;
    fsdp2_module_destroy(m->root);
    for (int i = 0; i < 8; i++) {
        free(m->a[i]);
        free(m->d[i]);
        free(m->g[i]);
    }
    free(m->ws.data);
    free(m->pool_arg);
    free(m);
}

fsdp2_status_t fm_model_shard(fm_model_t *m, fsdp2_mesh_t *mesh, int64_t wrap_min_params,
                              fsdp2_dtype_t param_dtype, int reshard_after_forward)
{
    fsdp2_shard_options_t o = FSDP2_SHARD_OPTIONS_INIT;
    o.mesh = mesh;
    o.reshard_after_forward = reshard_after_forward;
    o.mp.param_dtype = param_dtype; /* f32: no cast */
    o.mp.reduce_dtype = FSDP2_F32;  /* sum the bf16 gradients in f32 */
    if (wrap_min_params > 0) {
        TRY(fsdp2_fully_shard_tree(m->root, &o, NULL, NULL, wrap_min_params));
    } else {
        for (int i = 0; i < m->nlayers; i++)
            TRY(fsdp2_fully_shard(m->layers[i].module, &o));
        TRY(fsdp2_fully_shard(m->root, &o));
    }
    return fsdp2_module_materialize(m->root, NULL, NULL);
}

int64_t fm_model_numel(const fm_model_t *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const fm_layer_t *l = &m->layers[i];
        n += (int64_t)l->out * l->in * (l->conv ? l->k * l->k : 1) + l->out;
    }
    return n;
}

/* A layer's hooks run only when it is a unit of its own; otherwise its parameters
 * belong to the root's group, whole between the root's hooks. */
static int is_unit(const fm_layer_t *l)
{
    fsdp2_module_state_t st = {.size = sizeof(st)};
    return fsdp2_module_state(l->module, &st) == FSDP2_SUCCESS && st.sharded;
}

static fsdp2_status_t enter(const fm_layer_t *l, int backward)
{
    if (!is_unit(l))
        return FSDP2_SUCCESS;
    return backward ? fsdp2_pre_backward(l->module) : fsdp2_pre_forward(l->module);
}

static fsdp2_status_t leave(const fm_layer_t *l, int backward)
{
    if (!is_unit(l))
        return FSDP2_SUCCESS;
    return backward ? fsdp2_post_backward(l->module) : fsdp2_post_forward(l->module);
}

/* One layer forward inside its hooks, on the unsharded parameters (f32 or bf16: the
 * layers convert). */
static fsdp2_status_t layer_fwd(fm_model_t *m, const fm_layer_t *l, const float *x, float *y,
                                int batch)
{
    fsdp2_tensor_t *w, *b;
    TRY(enter(l, 0));
    TRY(fsdp2_param_unsharded(l->weight, &w));
    TRY(fsdp2_param_unsharded(l->bias, &b));
    if (l->conv)
        TRY(fsdp2_nn_conv2d_forward(x, batch, l->h, l->w, w, b, y, &m->ws));
    else
        TRY(fsdp2_nn_linear_forward(x, batch, w, b, y, &m->ws));
    return leave(l, 0);
}

/* One layer backward inside its hooks: gradients added into the library's (bf16 under
 * mixed precision) unsharded gradients; dx (zeroed here) gets the input's. */
static fsdp2_status_t layer_bwd(fm_model_t *m, const fm_layer_t *l, const float *x,
                                const float *dy, float *dx, int64_t dx_numel, int batch)
{
    fsdp2_tensor_t *w, *dw, *db;
    TRY(enter(l, 1));
    TRY(fsdp2_param_unsharded(l->weight, &w));
    TRY(fsdp2_param_grad(l->weight, &dw));
    TRY(fsdp2_param_grad(l->bias, &db));
    if (dx)
        TRY(fsdp2_nn_zero(dx, dx_numel));
    if (l->conv)
        TRY(fsdp2_nn_conv2d_backward(x, dy, batch, l->h, l->w, w, dx, dw, db, &m->ws));
    else
        TRY(fsdp2_nn_linear_backward(x, dy, batch, w, dx, dw, db, &m->ws));
    return leave(l, 1);
}

/* dx = relu'(y) dy, dx zeroed first. */
static fsdp2_status_t relu_bwd(const float *y, const float *dy, float *dx, int64_t n)
{
    TRY(fsdp2_nn_zero(dx, n));
    return fsdp2_nn_relu_backward(y, dy, n, dx);
}

static fsdp2_status_t dropout_bwd(const float *dy, float *dx, int64_t n, double p, uint64_t seed)
{
    TRY(fsdp2_nn_zero(dx, n));
    return fsdp2_nn_dropout_backward(dy, n, p, seed, 0, dx);
}

/* Forward of every layer into m->a[]; the logits are the last. ReLU and dropout run in
 * place on their input (their backwards read the result). */
static fsdp2_status_t forward(fm_model_t *m, const float *x, int batch, int train)
{
    fm_layer_t *L = m->layers;
    const int64_t B = batch;
    if (m->kind == FM_MLP) {
        const float *in = x;
        for (int i = 0; i < 3; i++) {
            TRY(layer_fwd(m, &L[i], in, m->a[i], batch));
            if (i < 2)
                TRY(fsdp2_nn_relu_forward(m->a[i], B * mlp_sizes[i], m->a[i]));
            in = m->a[i];
        }
        return FSDP2_SUCCESS;
    }
    uint64_t call = m->dropout_calls++;
    m->dropout_key[0] = m->dropout_seed * 7919 + call * 2;
    m->dropout_key[1] = m->dropout_key[0] + 1;
    TRY(layer_fwd(m, &L[0], x, m->a[0], batch));
    TRY(fsdp2_nn_relu_forward(m->a[0], B * cnn_sizes[0], m->a[0]));
    TRY(layer_fwd(m, &L[1], m->a[0], m->a[1], batch));
    TRY(fsdp2_nn_relu_forward(m->a[1], B * cnn_sizes[1], m->a[1]));
    TRY(fsdp2_nn_maxpool2d_forward(m->a[1], B * 64, 24, 24, m->a[2], m->pool_arg));
    if (train)
        TRY(fsdp2_nn_dropout_forward(m->a[2], B * cnn_sizes[2], 0.25, m->dropout_key[0], 0,
                                     m->a[2]));
    TRY(layer_fwd(m, &L[2], m->a[2], m->a[3], batch));
    TRY(fsdp2_nn_relu_forward(m->a[3], B * cnn_sizes[3], m->a[3]));
    if (train)
        TRY(fsdp2_nn_dropout_forward(m->a[3], B * cnn_sizes[3], 0.5, m->dropout_key[1], 0,
                                     m->a[3]));
    return layer_fwd(m, &L[3], m->a[3], m->a[4], batch);
}

/* Backward from d loss / d logits (in the last d[]) down to the first layer: d[i] is the
 * gradient of a[i] as the next layer read it, g[i] the one before the in-place ops. */
static fsdp2_status_t backward(fm_model_t *m, const float *x, int batch)
{
    fm_layer_t *L = m->layers;
    const int64_t B = batch;
    if (m->kind == FM_MLP) {
        for (int i = 2; i >= 0; i--) {
            const float *dy = i == 2 ? m->d[2] : m->g[i];
            float *dx = i ? m->d[i - 1] : NULL;
            TRY(layer_bwd(m, &L[i], i ? m->a[i - 1] : x, dy, dx, i ? B * mlp_sizes[i - 1] : 0,
                          batch));
            if (i)
                TRY(relu_bwd(m->a[i - 1], m->d[i - 1], m->g[i - 1], B * mlp_sizes[i - 1]));
        }
        return FSDP2_SUCCESS;
    }
    TRY(layer_bwd(m, &L[3], m->a[3], m->d[4], m->d[3], B * cnn_sizes[3], batch));
    TRY(dropout_bwd(m->d[3], m->g[3], B * cnn_sizes[3], 0.5, m->dropout_key[1]));
    TRY(relu_bwd(m->a[3], m->g[3], m->d[3], B * cnn_sizes[3]));
    TRY(layer_bwd(m, &L[2], m->a[2], m->d[3], m->d[2], B * cnn_sizes[2], batch));
    TRY(dropout_bwd(m->d[2], m->g[2], B * cnn_sizes[2], 0.25, m->dropout_key[0]));
    TRY(fsdp2_nn_zero(m->d[1], B * cnn_sizes[1]));
    TRY(fsdp2_nn_maxpool2d_backward(m->g[2], m->pool_arg, B * 64, 24, 24, m->d[1]));
    TRY(relu_bwd(m->a[1], m->d[1], m->g[1], B * cnn_sizes[1]));
    TRY(layer_bwd(m, &L[1], m->a[0], m->g[1], m->d[0], B * cnn_sizes[0], batch));
    TRY(relu_bwd(m->a[0], m->d[0], m->g[0], B * cnn_sizes[0]));
    return layer_bwd(m, &L[0], x, m->g[0], NULL, 0, batch);
}

/* Mean cross-entropy of the logits (the last a[]); its gradient into the last d[]. */
static fsdp2_status_t loss_of(fm_model_t *m, const int *labels, int batch, int grad, double *loss,
                              int *correct)
{
    int last = m->kind == FM_MLP ? 2 : 4;
    fsdp2_nn_cross_entropy_result_t r;
    TRY(fsdp2_nn_cross_entropy(m->a[last], (const int32_t *)labels, batch, 10, NULL,
                               grad ? m->d[last] : NULL, &r));
    *loss = r.loss;
    *correct = (int)r.correct;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fm_model_forward_backward(fm_model_t *m, const float *x, const int *labels,
                                         int batch, double *loss, int *correct)
{
    TRY(fsdp2_pre_forward(m->root));
    TRY(forward(m, x, batch, 1));
    TRY(fsdp2_post_forward(m->root));
    TRY(loss_of(m, labels, batch, 1, loss, correct));
    TRY(fsdp2_pre_backward(m->root));
    TRY(backward(m, x, batch));
    TRY(fsdp2_post_backward(m->root));
    return fsdp2_backward_finish(m->root);
}

fsdp2_status_t fm_model_evaluate(fm_model_t *m, const float *x, const int *labels, int batch,
                                 double *loss_sum, int *correct)
{
    double mean;
    TRY(fsdp2_pre_forward(m->root));
    TRY(forward(m, x, batch, 0));
    TRY(fsdp2_post_forward(m->root));
    TRY(loss_of(m, labels, batch, 0, &mean, correct));
    *loss_sum = batch * mean;
    return FSDP2_SUCCESS;
}
