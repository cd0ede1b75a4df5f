/* The two models: module trees, and forward/backward through libfsdp2's hooks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "model.h"

#define TRY(call)                                \
    do {                                         \
        fsdp2_status_t s_ = (call);              \
        if (s_ != FSDP2_SUCCESS)                 \
            return s_;                           \
    } while (0)

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
    int64_t most_w = 0, most_b = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const fm_layer_t *l = &m->layers[i];
        int64_t w = (int64_t)l->out * l->in * (l->conv ? l->k * l->k : 1);
        most_w = w > most_w ? w : most_w;
        most_b = l->out > most_b ? l->out : most_b;
    }
    m->w32 = buffer(most_w);
    m->dw32 = buffer(most_w);
    m->b32 = buffer(most_b);
    m->db32 = buffer(most_b);
    if (!m->w32 || !m->dw32 || !m->b32 || !m->db32)
        return FSDP2_ERR_OUT_OF_MEMORY;
    const int64_t *sizes = kind == FM_MLP ? mlp_sizes : cnn_sizes;
    int n = kind == FM_MLP ? 3 : 5;
    for (int i = 0; i < n; i++) {
        m->a[i] = buffer(sizes[i] * max_batch);
        m->d[i] = buffer(sizes[i] * max_batch);
        if (!m->a[i] || !m->d[i])
            return FSDP2_ERR_OUT_OF_MEMORY;
    }
    if (kind == FM_CNN) {
        m->conv_chunk = max_batch < 4 ? max_batch : 4; /* measured: larger chunks leave the caches */
        int64_t need1 = conv_scratch(1, 28, 28, 32, 3, m->conv_chunk);
        int64_t need2 = conv_scratch(32, 26, 26, 64, 3, m->conv_chunk);
        m->col = buffer(need1 > need2 ? need1 : need2);
        m->pool_arg = calloc((size_t)cnn_sizes[2] * max_batch, sizeof(int32_t));
        m->mask1 = buffer(cnn_sizes[2] * max_batch);
        m->mask2 = buffer(cnn_sizes[3] * max_batch);
        if (!m->col || !m->pool_arg || !m->mask1 || !m->mask2)
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
    }
    free(m->col);
    free(m->w32);
    free(m->dw32);
    free(m->b32);
    free(m->db32);
    free(m->pool_arg);
    free(m->mask1);
    free(m->mask2);
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

typedef struct views {
    float *w, *b, *dw, *db;
    fsdp2_tensor_t *dw_t, *db_t; /* bf16 compute: the gradients to add dw, db into */
} views_t;

/* A parameter (or its gradient) as float: itself, or (bf16 compute) converted into
 * scratch. */
static float *as_f32(const fsdp2_tensor_t *t, float *scratch)
{
    if (t->dtype == FSDP2_F32)
        return t->data;
    fsdp2_convert(scratch, FSDP2_F32, t->data, t->dtype, (size_t)t->numel);
    return scratch;
}

static fsdp2_status_t get_views(fm_model_t *m, const fm_layer_t *l, int grads, views_t *v)
{
    fsdp2_tensor_t *t;
    memset(v, 0, sizeof(*v));
    TRY(fsdp2_param_unsharded(l->weight, &t));
    v->w = as_f32(t, m->w32);
    TRY(fsdp2_param_unsharded(l->bias, &t));
    v->b = as_f32(t, m->b32);
    if (!grads)
        return FSDP2_SUCCESS;
    TRY(fsdp2_param_grad(l->weight, &v->dw_t));
    TRY(fsdp2_param_grad(l->bias, &v->db_t));
    if (v->dw_t->dtype == FSDP2_F32) {
        v->dw = v->dw_t->data;
        v->db = v->db_t->data;
        v->dw_t = v->db_t = NULL;
    } else { /* computed in f32 scratch, added into the bf16 gradients after */
        memset(m->dw32, 0, sizeof(float) * (size_t)v->dw_t->numel);
        memset(m->db32, 0, sizeof(float) * (size_t)v->db_t->numel);
        v->dw = m->dw32;
        v->db = m->db32;
    }
    return FSDP2_SUCCESS;
}

/* bf16 compute: the gradients computed in f32 added into the library's bf16 buffers. */
static void flush_grads(const views_t *v)
{
    fsdp2_tensor_t *t[2] = {v->dw_t, v->db_t};
    const float *from[2] = {v->dw, v->db};
    for (int k = 0; k < 2 && t[k]; k++) {
        uint16_t *g = t[k]->data;
        for (int64_t i = 0; i < t[k]->numel; i++)
            g[i] = fsdp2_f32_to_bf16(fsdp2_bf16_to_f32(g[i]) + from[k][i]);
    }
}

static fsdp2_status_t linear_fwd(fm_model_t *m, const fm_layer_t *l, const float *x, float *y,
                                 int batch)
{
    views_t v;
    TRY(get_views(m, l, 0, &v));
    linear_forward(x, v.w, v.b, y, batch, l->in, l->out);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t conv_fwd(fm_model_t *m, const fm_layer_t *l, const float *x, float *y,
                               int batch)
{
    views_t v;
    TRY(get_views(m, l, 0, &v));
    conv_forward(x, v.w, v.b, y, m->col, m->conv_chunk, batch, l->in, l->h, l->w, l->out, l->k);
    return FSDP2_SUCCESS;
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

/* Forward of every layer into m->a[]; the logits are the last. */
static fsdp2_status_t forward(fm_model_t *m, const float *x, int batch, int train)
{
    fm_layer_t *L = m->layers;
    if (m->kind == FM_MLP) {
        const float *in = x;
        for (int i = 0; i < 3; i++) {
            TRY(enter(&L[i], 0));
            TRY(linear_fwd(m, &L[i], in, m->a[i], batch));
            if (i < 2)
                relu_forward(m->a[i], (int64_t)batch * mlp_sizes[i]);
            TRY(leave(&L[i], 0));
            in = m->a[i];
        }
        return FSDP2_SUCCESS;
    }
    uint64_t call = m->dropout_calls++;
    TRY(enter(&L[0], 0));
    TRY(conv_fwd(m, &L[0], x, m->a[0], batch));
    TRY(leave(&L[0], 0));
    relu_forward(m->a[0], (int64_t)batch * cnn_sizes[0]);
    TRY(enter(&L[1], 0));
    TRY(conv_fwd(m, &L[1], m->a[0], m->a[1], batch));
    TRY(leave(&L[1], 0));
    relu_forward(m->a[1], (int64_t)batch * cnn_sizes[1]);
    maxpool_forward(m->a[1], m->a[2], m->pool_arg, batch, 64, 24, 24);
    if (train)
        dropout_forward(m->a[2], m->mask1, (int64_t)batch * cnn_sizes[2], 0.25,
                        m->dropout_seed * 7919 + call * 2, 0);
    TRY(enter(&L[2], 0));
    TRY(linear_fwd(m, &L[2], m->a[2], m->a[3], batch));
    TRY(leave(&L[2], 0));
    relu_forward(m->a[3], (int64_t)batch * cnn_sizes[3]);
    if (train)
        dropout_forward(m->a[3], m->mask2, (int64_t)batch * cnn_sizes[3], 0.5,
                        m->dropout_seed * 7919 + call * 2 + 1, 0);
    TRY(enter(&L[3], 0));
    TRY(linear_fwd(m, &L[3], m->a[3], m->a[4], batch));
    return leave(&L[3], 0);
}

static fsdp2_status_t linear_bwd(fm_model_t *m, const fm_layer_t *l, const float *x,
                                 const float *dy, float *dx, int batch)
{
    views_t v;
    TRY(enter(l, 1));
    TRY(get_views(m, l, 1, &v));
    linear_backward(x, v.w, dy, v.dw, v.db, dx, batch, l->in, l->out);
    flush_grads(&v);
    return leave(l, 1);
}

static fsdp2_status_t conv_bwd(fm_model_t *m, const fm_layer_t *l, const float *x, const float *dy,
                               float *dx, int batch)
{
    views_t v;
    TRY(enter(l, 1));
    TRY(get_views(m, l, 1, &v));
    conv_backward(x, v.w, dy, v.dw, v.db, dx, m->col, m->conv_chunk, batch, l->in, l->h, l->w,
                  l->out, l->k);
    flush_grads(&v);
    return leave(l, 1);
}

/* Backward from d loss / d logits (in the last d[]) down to the first layer. */
static fsdp2_status_t backward(fm_model_t *m, const float *x, int batch)
{
    fm_layer_t *L = m->layers;
    if (m->kind == FM_MLP) {
        for (int i = 2; i >= 0; i--) {
            TRY(linear_bwd(m, &L[i], i ? m->a[i - 1] : x, m->d[i], i ? m->d[i - 1] : NULL, batch));
            if (i)
                relu_backward(m->a[i - 1], m->d[i - 1], (int64_t)batch * mlp_sizes[i - 1]);
        }
        return FSDP2_SUCCESS;
    }
    TRY(linear_bwd(m, &L[3], m->a[3], m->d[4], m->d[3], batch));
    dropout_backward(m->d[3], m->mask2, (int64_t)batch * cnn_sizes[3]);
    relu_backward(m->a[3], m->d[3], (int64_t)batch * cnn_sizes[3]);
    TRY(linear_bwd(m, &L[2], m->a[2], m->d[3], m->d[2], batch));
    dropout_backward(m->d[2], m->mask1, (int64_t)batch * cnn_sizes[2]);
    maxpool_backward(m->d[2], m->pool_arg, m->d[1], batch, 64, 24, 24);
    relu_backward(m->a[1], m->d[1], (int64_t)batch * cnn_sizes[1]);
    TRY(conv_bwd(m, &L[1], m->a[0], m->d[1], m->d[0], batch));
    relu_backward(m->a[0], m->d[0], (int64_t)batch * cnn_sizes[0]);
    return conv_bwd(m, &L[0], x, m->d[0], NULL, batch);
}

fsdp2_status_t fm_model_forward_backward(fm_model_t *m, const float *x, const int *labels,
                                         int batch, double *loss, int *correct)
{
    int last = m->kind == FM_MLP ? 2 : 4;
    TRY(fsdp2_pre_forward(m->root));
    TRY(forward(m, x, batch, 1));
    TRY(fsdp2_post_forward(m->root));
    *loss = log_softmax_nll(m->a[last], labels, m->d[last], batch, 10, correct);
    TRY(fsdp2_pre_backward(m->root));
    TRY(backward(m, x, batch));
    TRY(fsdp2_post_backward(m->root));
    return fsdp2_backward_finish(m->root);
}

fsdp2_status_t fm_model_evaluate(fm_model_t *m, const float *x, const int *labels, int batch,
                                 double *loss_sum, int *correct)
{
    int last = m->kind == FM_MLP ? 2 : 4;
    TRY(fsdp2_pre_forward(m->root));
    TRY(forward(m, x, batch, 0));
    TRY(fsdp2_post_forward(m->root));
    *loss_sum = batch * log_softmax_nll(m->a[last], labels, NULL, batch, 10, correct);
    return FSDP2_SUCCESS;
}
