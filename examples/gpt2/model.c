/* The GPT-2 module tree and its forward and backward through libfsdp2's hooks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define TRY(call)                                \
    do {                                         \
        fsdp2_status_t s_ = (call);              \
        if (s_ != FSDP2_SUCCESS)                 \
            return s_;                           \
    } while (0)

#define LN_EPS 1e-5f

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;

int64_t gpt2_numel(const gpt2_config_t *c)
{
    int64_t C = c->dim;
    int64_t block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                    (4 * C * C + C);
    return (int64_t)c->vocab * C + (int64_t)c->seq * C + c->layers * block + 2 * C;
}

/* ---- the tree ---- */

static fsdp2_status_t child(fsdp2_module_t *parent, const char *name, fsdp2_module_t **out)
{
    TRY(fsdp2_module_create(name, out));
    return fsdp2_module_add_child(parent, *out);
}

/* A parameter on meta with a normal(mean, std) initialisation of its own seed. */
static fsdp2_status_t param(fsdp2_module_t *m, const char *name, int ndim, int64_t d0, int64_t d1,
                            uint64_t seed, double mean, double std, fsdp2_param_t **out)
{
    fsdp2_device_t meta = FSDP2_DEVICE_META_INIT;
    int64_t shape[2] = {d0, d1};
    fsdp2_tensor_t *t;
    TRY(fsdp2_tensor_empty(meta, FSDP2_F32, ndim, shape, &t));
    fsdp2_status_t s = fsdp2_module_add_param(m, name, t, 1, out);
    fsdp2_tensor_release(t);
    TRY(s);
    fsdp2_random_init_t init = FSDP2_RANDOM_NORMAL_INIT(seed, mean, std);
    return fsdp2_param_set_random_init(*out, &init);
}

/* A linear layer [out, in] with a zero bias. */
static fsdp2_status_t linear(fsdp2_module_t *parent, const char *name, int64_t in, int64_t out,
                             double std, uint64_t *seed, fsdp2_param_t **w, fsdp2_param_t **b)
{
    fsdp2_module_t *m;
    TRY(child(parent, name, &m));
    TRY(param(m, "weight", 2, out, in, (*seed)++, 0.0, std, w));
    return param(m, "bias", 1, out, 0, (*seed)++, 0.0, 0.0, b);
}

static fsdp2_status_t norm(fsdp2_module_t *parent, const char *name, int64_t dim, uint64_t *seed,
                           fsdp2_param_t **w, fsdp2_param_t **b)
{
    fsdp2_module_t *m;
    TRY(child(parent, name, &m));
    TRY(param(m, "weight", 1, dim, 0, (*seed)++, 1.0, 0.0, w));
    return param(m, "bias", 1, dim, 0, (*seed)++, 0.0, 0.0, b);
}

fsdp2_status_t gpt2_create(const gpt2_config_t *cfg, uint64_t seed, gpt2_model_t **out)
{
    if (cfg->layers < 1 || cfg->layers > GPT2_MAX_LAYERS || cfg->heads < 1 || cfg->dim < 1 ||
        cfg->dim % cfg->heads || cfg->seq < 1 || cfg->vocab < 1) {
        fprintf(stderr, "error: GPT-2 config layers %d heads %d dim %d seq %d vocab %d: need "
                        "1..%d layers and dim divisible by heads\n",
                cfg->layers, cfg->heads, cfg->dim, cfg->seq, cfg->vocab, GPT2_MAX_LAYERS);
        return FSDP2_ERR_INVALID_ARGUMENT;
    }
    gpt2_model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return FSDP2_ERR_OUT_OF_MEMORY;
    *out = m;
    m->cfg = *cfg;
    int64_t C = cfg->dim;
    uint64_t s = seed * 100000;
    double std = 0.02, proj_std = 0.02 / sqrt(2.0 * cfg->layers);
    fsdp2_module_t *wte, *wpe, *h, *head;
    TRY(fsdp2_module_create("", &m->root));
    TRY(child(m->root, "wte", &wte));
    TRY(param(wte, "weight", 2, cfg->vocab, C, s++, 0.0, std, &m->wte));
    TRY(child(m->root, "wpe", &wpe));
    TRY(param(wpe, "weight", 2, cfg->seq, C, s++, 0.0, std, &m->wpe));
    TRY(child(m->root, "h", &h));
    for (int l = 0; l < cfg->layers; l++) {
        gpt2_block_t *b = &m->blocks[l];
        char name[16];
        fsdp2_module_t *attn, *mlp;
        snprintf(name, sizeof(name), "%d", l);
        TRY(child(h, name, &b->module));
        TRY(norm(b->module, "ln_1", C, &s, &b->ln1_w, &b->ln1_b));
        TRY(child(b->module, "attn", &attn));
        TRY(linear(attn, "c_attn", C, 3 * C, std, &s, &b->attn_w, &b->attn_b));
        TRY(linear(attn, "c_proj", C, C, proj_std, &s, &b->proj_w, &b->proj_b));
        TRY(norm(b->module, "ln_2", C, &s, &b->ln2_w, &b->ln2_b));
        TRY(child(b->module, "mlp", &mlp));
        TRY(linear(mlp, "c_fc", C, 4 * C, std, &s, &b->fc_w, &b->fc_b));
        TRY(linear(mlp, "c_proj", 4 * C, C, proj_std, &s, &b->fcproj_w, &b->fcproj_b));
    }
    TRY(norm(m->root, "ln_f", C, &s, &m->lnf_w, &m->lnf_b));
    TRY(child(m->root, "lm_head", &head));
    return fsdp2_module_tie_param(head, "weight", m->wte);
}

fsdp2_status_t gpt2_shard(gpt2_model_t *m, fsdp2_mesh_t *mesh, fsdp2_dtype_t param_dtype,
                          int reshard_after_forward)
{
    fsdp2_shard_options_t o = FSDP2_SHARD_OPTIONS_INIT;
    o.mesh = mesh;
    o.reshard_after_forward = reshard_after_forward;
    o.mp.param_dtype = param_dtype;
    o.mp.reduce_dtype = FSDP2_F32;
    for (int l = 0; l < m->cfg.layers; l++) {
        /* The last block's backward comes right after its forward: regathering it would
         * be an all-gather nothing can hide (PyTorch's recipes keep it unsharded too). */
        fsdp2_shard_options_t last = o;
        if (l == m->cfg.layers - 1 && reshard_after_forward == 1)
            last.reshard_after_forward = 0;
        TRY(fsdp2_fully_shard(m->blocks[l].module, &last));
    }
    TRY(fsdp2_fully_shard(m->root, &o));
    return fsdp2_module_materialize(m->root, NULL, NULL);
}

/* ---- activations ---- */

/* Floats of one block's saved activations at rows tokens of batch sequences. */
static int64_t block_floats(const gpt2_config_t *c, int64_t batch, int64_t rows)
{
    int64_t C = c->dim;
    return rows * (C + 3 * C + C + C + C + 4 * C + 4 * C) + 4 * rows +
           batch * c->heads * (int64_t)c->seq * c->seq;
}

static size_t workspace_bytes(const gpt2_config_t *c, int64_t rows)
{
    int64_t C = c->dim;
    const int64_t lin[5][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, c->vocab}};
    size_t most = 0, b = 0;
    for (int i = 0; i < 5; i++) {
        fsdp2_nn_linear_workspace_bytes(lin[i][0], lin[i][1], &b);
        most = b > most ? b : most;
    }
    fsdp2_nn_layernorm_workspace_bytes(C, &b);
    most = b > most ? b : most;
    fsdp2_nn_attention_workspace_bytes(c->seq, &b);
    most = b > most ? b : most;
    fsdp2_nn_embedding_workspace_bytes(rows, c->vocab > c->seq ? c->vocab : c->seq, C, &b);
    return b > most ? b : most;
}

/* The allocations gpt2_allocate makes, in order: bytes of each (n of them). */
static int plan(const gpt2_config_t *c, int max_batch, int ckpt, uint64_t *bytes)
{
    int64_t rows = (int64_t)max_batch * c->seq, C = c->dim, L = c->layers;
    int n = 0;
    bytes[n++] = 3 * sizeof(int32_t) * (uint64_t)rows;                /* tokens, targets, positions */
    bytes[n++] = sizeof(float) * (uint64_t)((L + 1) * rows * C);      /* res */
    bytes[n++] = sizeof(float) * (uint64_t)((ckpt ? 1 : L) * block_floats(c, max_batch, rows));
    bytes[n++] = sizeof(float) * (uint64_t)(2 * rows * C + 2 * rows); /* proj, lnf, meanf, rstdf */
    bytes[n++] = sizeof(float) * (uint64_t)(rows * c->vocab);         /* logits */
    bytes[n++] = sizeof(float) * (uint64_t)(rows * (5 * C + 3 * C + 8 * C)); /* gradients */
    bytes[n++] = workspace_bytes(c, rows);
    return n;
}

uint64_t gpt2_activation_bytes(const gpt2_config_t *cfg, int max_batch, int checkpointing)
{
    uint64_t bytes[8], sum = 0;
    int n = plan(cfg, max_batch, checkpointing, bytes);
    for (int i = 0; i < n; i++)
        sum += bytes[i];
    return sum;
}

static void carve_acts(gpt2_acts_t *a, float *p, const gpt2_config_t *c, int64_t rows)
{
    int64_t C = c->dim;
    float **fields[] = {&a->ln1, &a->qkv, &a->atty, &a->res_mid, &a->ln2, &a->fc, &a->gelu};
    const int64_t widths[] = {C, 3 * C, C, C, C, 4 * C, 4 * C};
    for (int i = 0; i < 7; i++) {
        *fields[i] = p;
        p += rows * widths[i];
    }
    a->mean1 = p, p += rows;
    a->rstd1 = p, p += rows;
    a->mean2 = p, p += rows;
    a->rstd2 = p, p += rows;
    a->probs = p;
}

fsdp2_status_t gpt2_allocate(gpt2_model_t *m, int max_batch, int checkpointing)
{
    const gpt2_config_t *c = &m->cfg;
    uint64_t bytes[8];
    int n = plan(c, max_batch, checkpointing, bytes);
    m->allocations = calloc((size_t)n, sizeof(void *));
    if (!m->allocations)
        return FSDP2_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        TRY(fsdp2_device_alloc(CPU, bytes[i], &m->allocations[i]));
        m->num_allocations = i + 1;
        m->activation_bytes += bytes[i];
    }
    m->max_batch = max_batch;
    m->checkpointing = checkpointing;
    int64_t rows = (int64_t)max_batch * c->seq, C = c->dim;
    int32_t *ids = m->allocations[0];
    m->tokens = ids, m->targets = ids + rows, m->positions = ids + 2 * rows;
    m->res = m->allocations[1];
    int sets = checkpointing ? 1 : c->layers;
    m->acts = calloc((size_t)sets, sizeof(*m->acts));
    if (!m->acts)
        return FSDP2_ERR_OUT_OF_MEMORY;
    for (int l = 0; l < sets; l++)
        carve_acts(&m->acts[l], (float *)m->allocations[2] + l * block_floats(c, max_batch, rows),
                   c, rows);
    float *p = m->allocations[3];
    m->proj = p, p += rows * C;
    m->lnf = p, p += rows * C;
    m->meanf = p, p += rows;
    m->rstdf = p;
    m->logits = m->allocations[4];
    p = m->allocations[5];
    float **grads[] = {&m->d_res[0], &m->d_res[1], &m->d_mid, &m->d_ln, &m->d_atty, &m->d_qkv,
                       &m->d_fc, &m->d_gelu};
    const int64_t widths[] = {C, C, C, C, C, 3 * C, 4 * C, 4 * C};
    for (int i = 0; i < 8; i++) {
        *grads[i] = p;
        p += rows * widths[i];
    }
    m->ws.data = m->allocations[6];
    m->ws.bytes = bytes[6];
    return FSDP2_SUCCESS;
}

void gpt2_destroy(gpt2_model_t *m)
{
    if (!m)
        return;
    fsdp2_module_destroy(m->root);
    for (int i = 0; i < m->num_allocations; i++)
        fsdp2_device_free(CPU, m->allocations[i]);
    free(m->allocations);
    free(m->acts);
    free(m);
}

/* ---- forward and backward ---- */

static fsdp2_tensor_t *value(const fsdp2_param_t *p)
{
    fsdp2_tensor_t *t = NULL;
    fsdp2_param_unsharded(p, &t); /* valid inside the unit's hooks */
    return t;
}

static fsdp2_tensor_t *grad(const fsdp2_param_t *p)
{
    fsdp2_tensor_t *t = NULL;
    fsdp2_param_grad(p, &t);
    return t;
}

static void zero(float *p, int64_t n)
{
    memset(p, 0, sizeof(float) * (size_t)n);
}

static fsdp2_status_t block_forward(gpt2_model_t *m, int l, gpt2_acts_t *a, int batch, int seq)
{
    const gpt2_block_t *b = &m->blocks[l];
    int64_t C = m->cfg.dim, rows = (int64_t)batch * seq, n = rows * C;
    const float *x = m->res + l * n;
    float *y = m->res + (l + 1) * n;
    fsdp2_nn_workspace_t *ws = &m->ws;
    TRY(fsdp2_nn_layernorm_forward(x, rows, value(b->ln1_w), value(b->ln1_b), LN_EPS, a->ln1,
                                   a->mean1, a->rstd1, ws));
    TRY(fsdp2_nn_linear_forward(a->ln1, rows, value(b->attn_w), value(b->attn_b), a->qkv, ws));
    TRY(fsdp2_nn_attention_forward(a->qkv, batch, seq, C, m->cfg.heads, a->atty, a->probs));
    TRY(fsdp2_nn_linear_forward(a->atty, rows, value(b->proj_w), value(b->proj_b), m->proj, ws));
    TRY(fsdp2_nn_residual_forward(x, m->proj, a->res_mid, n));
    TRY(fsdp2_nn_layernorm_forward(a->res_mid, rows, value(b->ln2_w), value(b->ln2_b), LN_EPS,
                                   a->ln2, a->mean2, a->rstd2, ws));
    TRY(fsdp2_nn_linear_forward(a->ln2, rows, value(b->fc_w), value(b->fc_b), a->fc, ws));
    TRY(fsdp2_nn_gelu_forward(a->fc, a->gelu, rows * 4 * C));
    TRY(fsdp2_nn_linear_forward(a->gelu, rows, value(b->fcproj_w), value(b->fcproj_b), m->proj,
                                ws));
    return fsdp2_nn_residual_forward(a->res_mid, m->proj, y, n);
}

/* dy: the gradient of the block's output; dx (zeroed here) gets its input's. */
static fsdp2_status_t block_backward(gpt2_model_t *m, int l, const gpt2_acts_t *a, int batch,
                                     int seq, const float *dy, float *dx)
{
    const gpt2_block_t *b = &m->blocks[l];
    int64_t C = m->cfg.dim, rows = (int64_t)batch * seq, n = rows * C;
    const float *x = m->res + l * n;
    fsdp2_nn_workspace_t *ws = &m->ws;
    /* y = res_mid + mlp(ln_2(res_mid)) */
    zero(m->d_mid, n);
    TRY(fsdp2_nn_residual_backward(dy, m->d_mid, NULL, n));
    zero(m->d_gelu, 4 * n);
    TRY(fsdp2_nn_linear_backward(a->gelu, rows, value(b->fcproj_w), dy, m->d_gelu,
                                 grad(b->fcproj_w), grad(b->fcproj_b), ws));
    zero(m->d_fc, 4 * n);
    TRY(fsdp2_nn_gelu_backward(a->fc, m->d_gelu, m->d_fc, 4 * n));
    zero(m->d_ln, n);
    TRY(fsdp2_nn_linear_backward(a->ln2, rows, value(b->fc_w), m->d_fc, m->d_ln, grad(b->fc_w),
                                 grad(b->fc_b), ws));
    TRY(fsdp2_nn_layernorm_backward(a->res_mid, rows, value(b->ln2_w), a->mean2, a->rstd2,
                                    m->d_ln, m->d_mid, grad(b->ln2_w), grad(b->ln2_b), ws));
    /* res_mid = x + c_proj(attention(c_attn(ln_1(x)))) */
    zero(m->d_atty, n);
    TRY(fsdp2_nn_linear_backward(a->atty, rows, value(b->proj_w), m->d_mid, m->d_atty,
                                 grad(b->proj_w), grad(b->proj_b), ws));
    zero(m->d_qkv, 3 * n);
    TRY(fsdp2_nn_attention_backward(a->qkv, a->probs, batch, seq, C, m->cfg.heads, m->d_atty,
                                    m->d_qkv, ws));
    zero(m->d_ln, n);
    TRY(fsdp2_nn_linear_backward(a->ln1, rows, value(b->attn_w), m->d_qkv, m->d_ln,
                                 grad(b->attn_w), grad(b->attn_b), ws));
    zero(dx, n);
    TRY(fsdp2_nn_residual_backward(m->d_mid, dx, NULL, n));
    return fsdp2_nn_layernorm_backward(x, rows, value(b->ln1_w), a->mean1, a->rstd1, m->d_ln, dx,
                                       grad(b->ln1_w), grad(b->ln1_b), ws);
}

static gpt2_acts_t *acts_of(gpt2_model_t *m, int l)
{
    return &m->acts[m->checkpointing ? 0 : l];
}

/* Forward to the logits, inside the root's hooks. */
static fsdp2_status_t forward(gpt2_model_t *m, int batch, int seq)
{
    int64_t C = m->cfg.dim, rows = (int64_t)batch * seq;
    for (int64_t i = 0; i < rows; i++)
        m->positions[i] = (int32_t)(i % seq);
    TRY(fsdp2_pre_forward(m->root));
    TRY(fsdp2_nn_embedding_forward(m->tokens, rows, value(m->wte), m->res, 0));
    TRY(fsdp2_nn_embedding_forward(m->positions, rows, value(m->wpe), m->res, 1));
    for (int l = 0; l < m->cfg.layers; l++) {
        TRY(fsdp2_pre_forward(m->blocks[l].module));
        TRY(block_forward(m, l, acts_of(m, l), batch, seq));
        TRY(fsdp2_post_forward(m->blocks[l].module));
    }
    const float *last = m->res + (int64_t)m->cfg.layers * rows * C;
    TRY(fsdp2_nn_layernorm_forward(last, rows, value(m->lnf_w), value(m->lnf_b), LN_EPS, m->lnf,
                                   m->meanf, m->rstdf, &m->ws));
    TRY(fsdp2_nn_linear_forward(m->lnf, rows, value(m->wte), NULL, m->logits, &m->ws));
    return fsdp2_post_forward(m->root);
}

static fsdp2_status_t backward(gpt2_model_t *m, int batch, int seq)
{
    int64_t C = m->cfg.dim, rows = (int64_t)batch * seq, n = rows * C;
    TRY(fsdp2_pre_backward(m->root));
    /* the tied head, then ln_f */
    zero(m->d_ln, n);
    TRY(fsdp2_nn_linear_backward(m->lnf, rows, value(m->wte), m->logits, m->d_ln, grad(m->wte),
                                 NULL, &m->ws));
    float *d = m->d_res[0], *other = m->d_res[1];
    zero(d, n);
    const float *last = m->res + (int64_t)m->cfg.layers * n;
    TRY(fsdp2_nn_layernorm_backward(last, rows, value(m->lnf_w), m->meanf, m->rstdf, m->d_ln, d,
                                    grad(m->lnf_w), grad(m->lnf_b), &m->ws));
    for (int l = m->cfg.layers - 1; l >= 0; l--) {
        fsdp2_module_t *u = m->blocks[l].module;
        TRY(fsdp2_pre_backward(u));
        if (m->checkpointing) /* the block's activations again, from its input */
            TRY(block_forward(m, l, acts_of(m, l), batch, seq));
        TRY(block_backward(m, l, acts_of(m, l), batch, seq, d, other));
        TRY(fsdp2_post_backward(u));
        float *t = d;
        d = other;
        other = t;
    }
    TRY(fsdp2_nn_embedding_backward(m->tokens, rows, d, grad(m->wte), &m->ws));
    TRY(fsdp2_nn_embedding_backward(m->positions, rows, d, grad(m->wpe), &m->ws));
    TRY(fsdp2_post_backward(m->root));
    return fsdp2_backward_finish(m->root);
}

fsdp2_status_t gpt2_step(gpt2_model_t *m, int batch, int do_backward, double divisor,
                         double *loss)
{
    int seq = m->cfg.seq;
    int64_t rows = (int64_t)batch * seq;
    TRY(forward(m, batch, seq));
    TRY(fsdp2_nn_cross_entropy(m->logits, m->targets, rows, m->cfg.vocab, -1, divisor, loss,
                               do_backward ? m->logits : NULL, NULL, NULL));
    return do_backward ? backward(m, batch, seq) : FSDP2_SUCCESS;
}

fsdp2_status_t gpt2_next_logits(gpt2_model_t *m, int len, const float **logits)
{
    TRY(forward(m, 1, len));
    *logits = m->logits + (int64_t)(len - 1) * m->cfg.vocab;
    return FSDP2_SUCCESS;
}
