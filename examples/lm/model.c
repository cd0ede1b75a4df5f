/* The module tree of a GPT-2 or Llama model and its forward and backward through
 * libfsdp2's hooks. The two architectures share the step, the buffers and the root; a
 * block differs in its norms (layer norm with bias, or RMSNorm), its attention's
 * projections (GPT-2's fused qkv with biases, or Llama's q, k, v without, rotated, with
 * grouped key/value heads) and its MLP (GELU, or SwiGLU). */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model.h"

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;

lm_config_t lm_gpt2_config(int layers, int heads, int dim, int seq, int vocab)
{
    lm_config_t c = {.arch = LM_GPT2, .layers = layers, .heads = heads, .kv_heads = heads,
                     .dim = dim, .hidden = 4 * dim, .seq = seq, .positions = seq,
                     .vocab = vocab, .tied = 1, .norm_eps = 1e-5,
                     .rope = FSDP2_NN_ROPE_CONFIG_INIT};
    return c;
}

static int llama(const lm_config_t *c)
{
    return c->arch == LM_LLAMA;
}

/* Width of k and v (GPT-2: dim). */
static int64_t kv_dim(const lm_config_t *c)
{
    return (int64_t)c->kv_heads * (c->dim / c->heads);
}

int64_t lm_numel(const lm_config_t *c)
{
    int64_t C = c->dim, I = c->hidden, V = c->vocab, KV = kv_dim(c), block, top;
    if (llama(c)) {
        block = 2 * C + C * C + 2 * KV * C + C * C + 3 * C * I;
        top = V * C + C + (c->tied ? 0 : V * C);
    } else {
        block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (I * C + I) + (I * C + C);
        top = V * C + (int64_t)c->positions * C + 2 * C + (c->tied ? 0 : V * C);
    }
    return top + c->layers * block;
}

/* ---- the tree ---- */

static fsdp2_status_t child(fsdp2_module_t *parent, const char *name, fsdp2_module_t **out)
{
    TRY(fsdp2_module_create(name, out));
    return fsdp2_module_add_child(parent, *out);
}

/* Whether the model trains the base's parameters: not under LoRA adapters. */
static int base_trains(const lm_model_t *m)
{
    return m->cfg.lora.r == 0;
}

/* A parameter on meta with an initialisation of its own seed. */
static fsdp2_status_t param_init(fsdp2_module_t *m, const char *name, int ndim, int64_t d0,
                                 int64_t d1, int trains, const fsdp2_random_init_t *init,
                                 fsdp2_param_t **out)
{
    fsdp2_device_t meta = FSDP2_DEVICE_META_INIT;
    int64_t shape[2] = {d0, d1};
    fsdp2_tensor_t *t;
    TRY(fsdp2_tensor_empty(meta, FSDP2_F32, ndim, shape, &t));
    fsdp2_status_t s = fsdp2_module_add_param(m, name, t, trains, out);
    fsdp2_tensor_release(t);
    TRY(s);
    return fsdp2_param_set_random_init(*out, init);
}

/* A base parameter drawn from normal(mean, std): frozen under LoRA, or when its name
 * matches a freeze pattern. */
static fsdp2_status_t param(lm_model_t *model, fsdp2_module_t *m, const char *name, int ndim,
                            int64_t d0, int64_t d1, uint64_t seed, double mean, double std,
                            fsdp2_param_t **out)
{
    fsdp2_random_init_t init = FSDP2_RANDOM_NORMAL_INIT(seed, mean, std);
    fsdp2_random_init_t constant = FSDP2_RANDOM_CONSTANT_INIT(mean);
    if (std == 0) /* a norm's unit weight, a zero bias */
        init = constant;
    char fqn[FSDP2_FQN_MAX];
    TRY(fsdp2_module_fqn(m, fqn, sizeof(fqn)));
    size_t len = strlen(fqn);
    snprintf(fqn + len, sizeof(fqn) - len, "%s%s", len ? "." : "", name);
    int trains = base_trains(model);
    for (int i = 0; i < model->cfg.num_freeze && trains; i++)
        trains = fnmatch(model->cfg.freeze[i], fqn, 0) != 0;
    return param_init(m, name, ndim, d0, d1, trains, &init, out);
}

/* Whether the module at path is one of the LoRA targets (path equal to a target, or
 * ending in '.' and the target, as PEFT matches a list of names); marks the target hit. */
static int targeted(const lm_lora_t *lora, const char *path, int *hits)
{
    size_t len = strlen(path);
    for (int i = 0; i < lora->num_targets; i++) {
        size_t t = strlen(lora->targets[i]);
        if (!strcmp(path, lora->targets[i]) ||
            (len > t && path[len - t - 1] == '.' && !strcmp(path + len - t, lora->targets[i]))) {
            hits[i]++;
            return 1;
        }
    }
    return 0;
}

/* A linear layer [out, in], with a zero bias when bias; a LoRA adapter when its path is
 * a target (lora_A Kaiming-uniform with a = sqrt(5), as PEFT: U(-1/sqrt(in), 1/sqrt(in));
 * lora_B zero). */
static fsdp2_status_t linear(lm_model_t *model, fsdp2_module_t *parent, const char *name,
                             int64_t in, int64_t out, double std, int bias, uint64_t *seed,
                             int *hits, lm_linear_t *l)
{
    fsdp2_module_t *m, *a, *b;
    *l = (lm_linear_t){.id = model->num_linears++};
    TRY(child(parent, name, &m));
    TRY(param(model, m, "weight", 2, out, in, (*seed)++, 0.0, std, &l->w));
    if (bias)
        TRY(param(model, m, "bias", 1, out, 0, (*seed)++, 0.0, 0.0, &l->b));
    char path[FSDP2_FQN_MAX];
    TRY(fsdp2_module_fqn(m, path, sizeof(path)));
    const lm_lora_t *lora = &model->cfg.lora;
    if (lora->r == 0 || !targeted(lora, path, hits))
        return FSDP2_SUCCESS;
    if (lora->r > (in < out ? in : out)) { /* a rank no [out, in] update can have */
        fprintf(stderr, "error: --lora r=%d is larger than %s [%lld, %lld] allows (%lld)\n",
                lora->r, path, (long long)out, (long long)in, (long long)(in < out ? in : out));
        return FSDP2_ERR_INVALID_CONFIG;
    }
    double bound = 1.0 / sqrt((double)in);
    fsdp2_random_init_t uniform = FSDP2_RANDOM_UNIFORM_INIT((*seed)++, -bound, bound);
    fsdp2_random_init_t zero = FSDP2_RANDOM_CONSTANT_INIT(0.0);
    (*seed)++; /* the seed a draw would take: the other parameters' seeds stay as they are */
    TRY(child(m, "lora_A", &a));
    TRY(param_init(a, "weight", 2, lora->r, in, 1, &uniform, &l->lora_a));
    TRY(child(m, "lora_B", &b));
    return param_init(b, "weight", 2, out, lora->r, 1, &zero, &l->lora_b);
}

/* A norm's unit weight; with b, a zero bias. */
static fsdp2_status_t norm(lm_model_t *model, fsdp2_module_t *parent, const char *name,
                           int64_t dim, uint64_t *seed, fsdp2_param_t **w, fsdp2_param_t **b)
{
    fsdp2_module_t *m;
    TRY(child(parent, name, &m));
    TRY(param(model, m, "weight", 1, dim, 0, (*seed)++, 1.0, 0.0, w));
    return b ? param(model, m, "bias", 1, dim, 0, (*seed)++, 0.0, 0.0, b) : FSDP2_SUCCESS;
}

static fsdp2_status_t gpt2_block(lm_model_t *m, lm_block_t *b, uint64_t *s, int *hits)
{
    int64_t C = m->cfg.dim, I = m->cfg.hidden;
    double std = 0.02, proj_std = 0.02 / sqrt(2.0 * m->cfg.layers);
    fsdp2_module_t *attn, *mlp;
    TRY(norm(m, b->module, "ln_1", C, s, &b->norm1_w, &b->norm1_b));
    TRY(child(b->module, "attn", &attn));
    TRY(linear(m, attn, "c_attn", C, 3 * C, std, 1, s, hits, &b->qkv));
    TRY(linear(m, attn, "c_proj", C, C, proj_std, 1, s, hits, &b->o));
    TRY(norm(m, b->module, "ln_2", C, s, &b->norm2_w, &b->norm2_b));
    TRY(child(b->module, "mlp", &mlp));
    TRY(linear(m, mlp, "c_fc", C, I, std, 1, s, hits, &b->up));
    return linear(m, mlp, "c_proj", I, C, proj_std, 1, s, hits, &b->down);
}

static fsdp2_status_t llama_block(lm_model_t *m, lm_block_t *b, uint64_t *s, int *hits)
{
    int64_t C = m->cfg.dim, I = m->cfg.hidden, KV = kv_dim(&m->cfg);
    double std = 0.02;
    fsdp2_module_t *attn, *mlp;
    /* transformers' order (LlamaDecoderLayer's): the attention, the MLP, then the norms */
    TRY(child(b->module, "self_attn", &attn));
    TRY(linear(m, attn, "q_proj", C, C, std, 0, s, hits, &b->q));
    TRY(linear(m, attn, "k_proj", C, KV, std, 0, s, hits, &b->k));
    TRY(linear(m, attn, "v_proj", C, KV, std, 0, s, hits, &b->v));
    TRY(linear(m, attn, "o_proj", C, C, std, 0, s, hits, &b->o));
    TRY(child(b->module, "mlp", &mlp));
    TRY(linear(m, mlp, "gate_proj", C, I, std, 0, s, hits, &b->gate));
    TRY(linear(m, mlp, "up_proj", C, I, std, 0, s, hits, &b->up));
    TRY(linear(m, mlp, "down_proj", I, C, std, 0, s, hits, &b->down));
    TRY(norm(m, b->module, "input_layernorm", C, s, &b->norm1_w, NULL));
    return norm(m, b->module, "post_attention_layernorm", C, s, &b->norm2_w, NULL);
}

static fsdp2_status_t check_config(const lm_config_t *c)
{
    const char *bad = NULL;
    if (c->arch != LM_GPT2 && c->arch != LM_LLAMA)
        bad = "arch";
    else if (c->layers < 1 || c->layers > LM_MAX_LAYERS)
        bad = "layers";
    else if (c->heads < 1 || c->dim < 1 || c->dim % c->heads)
        bad = "heads";
    else if (c->kv_heads < 1 || c->heads % c->kv_heads || (!llama(c) && c->kv_heads != c->heads))
        bad = "kv_heads";
    else if (llama(c) && (c->dim / c->heads) % 2)
        bad = "dim / heads (rotary embeddings need an even head_dim)";
    else if (c->hidden < 1)
        bad = "hidden";
    else if (c->seq < 1 || c->positions < c->seq)
        bad = "seq";
    else if (c->vocab < 1)
        bad = "vocab";
    else if (!(c->norm_eps >= 0 && isfinite(c->norm_eps)))
        bad = "norm_eps";
    else if (c->seq > 46340)
        bad = "seq (attention's seq x seq scores must fit a BLAS int: at most 46340)";
    else if (c->lora.r < 0 || (c->lora.r > 0 && !c->lora.num_targets))
        bad = "lora r (positive, with targets)";
    else if (c->lora.r > 0 && !(isfinite(c->lora.alpha) && c->lora.dropout >= 0 &&
                                c->lora.dropout < 1))
        bad = "lora alpha or dropout";
    if (!bad)
        return FSDP2_SUCCESS;
    fprintf(stderr,
            "error: model config: bad %s (layers %d heads %d kv_heads %d dim %d hidden %d seq %d "
            "positions %d vocab %d eps %g; layers 1..%d, heads dividing dim, kv_heads dividing "
            "heads)\n",
            bad, c->layers, c->heads, c->kv_heads, c->dim, c->hidden, c->seq, c->positions,
            c->vocab, (double)c->norm_eps, LM_MAX_LAYERS);
    return FSDP2_ERR_INVALID_CONFIG;
}

/* Every LoRA target must name a linear layer the model has. */
static fsdp2_status_t check_targets(const lm_config_t *c, const int *hits)
{
    static const char *const gpt2_names = "c_attn, c_proj, c_fc";
    static const char *const llama_names = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                           "down_proj";
    for (int i = 0; i < c->lora.num_targets && c->lora.r > 0; i++) {
        if (hits[i])
            continue;
        int head = !strcmp(c->lora.targets[i], "lm_head");
        fprintf(stderr, "error: --lora target '%s' %s; the model's linear layers: %s%s\n",
                c->lora.targets[i],
                head && c->tied ? "is the head tied to the token embedding, which an adapter "
                                  "cannot have"
                                : "matches no linear layer",
                llama(c) ? llama_names : gpt2_names, c->tied ? "" : ", lm_head");
        return FSDP2_ERR_INVALID_CONFIG;
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t create_tree(lm_model_t *m, uint64_t seed)
{
    const lm_config_t *cfg = &m->cfg;
    int64_t C = cfg->dim, V = cfg->vocab;
    uint64_t s = seed * 100000;
    int hits[LM_LORA_MAX_TARGETS] = {0};
    m->seed = seed;
    fsdp2_module_t *top, *sub, *layers, *head;
    TRY(fsdp2_module_create("", &m->root));
    top = m->root;
    if (llama(cfg)) /* model.embed_tokens, model.layers, model.norm; lm_head at the root */
        TRY(child(m->root, "model", &top));
    TRY(child(top, llama(cfg) ? "embed_tokens" : "wte", &sub));
    TRY(param(m, sub, "weight", 2, V, C, s++, 0.0, 0.02, &m->embed));
    if (!llama(cfg)) {
        TRY(child(top, "wpe", &sub));
        TRY(param(m, sub, "weight", 2, cfg->positions, C, s++, 0.0, 0.02, &m->pos_embed));
    }
    TRY(child(top, llama(cfg) ? "layers" : "h", &layers));
    for (int l = 0; l < cfg->layers; l++) {
        lm_block_t *b = &m->blocks[l];
        char name[16];
        snprintf(name, sizeof(name), "%d", l);
        TRY(child(layers, name, &b->module));
        TRY(llama(cfg) ? llama_block(m, b, &s, hits) : gpt2_block(m, b, &s, hits));
    }
    TRY(norm(m, top, llama(cfg) ? "norm" : "ln_f", C, &s, &m->normf_w,
             llama(cfg) ? NULL : &m->normf_b));
    if (!cfg->tied) {
        TRY(linear(m, m->root, "lm_head", C, V, 0.02, 0, &s, hits, &m->head));
    } else {
        m->head = (lm_linear_t){.w = m->embed, .id = m->num_linears++};
        TRY(child(m->root, "lm_head", &head));
        TRY(fsdp2_module_tie_param(head, "weight", m->embed));
    }
    return check_targets(cfg, hits);
}

fsdp2_status_t lm_create(const lm_config_t *cfg, uint64_t seed, lm_model_t **out)
{
    *out = NULL;
    TRY(check_config(cfg));
    lm_model_t *m = calloc(1, sizeof(*m));
    if (!m) {
        fprintf(stderr, "error: out of memory building the model\n");
        return FSDP2_ERR_OUT_OF_MEMORY;
    }
    *out = m;
    m->cfg = *cfg;
    fsdp2_status_t s = create_tree(m, seed);
    if (s != FSDP2_SUCCESS && s != FSDP2_ERR_INVALID_CONFIG) /* the library's failure */
        fprintf(stderr, "error: building the model: %s: %s\n", fsdp2_strerror(s),
                fsdp2_last_error());
    return s;
}

fsdp2_status_t lm_shard(lm_model_t *m, fsdp2_mesh_t *mesh, fsdp2_dtype_t param_dtype,
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

/* Widths (floats per row) of a block's qkv and fc buffers. */
static int64_t qkv_width(const lm_config_t *c)
{
    return c->dim + 2 * kv_dim(c);
}

static int64_t fc_width(const lm_config_t *c)
{
    return llama(c) ? 2 * (int64_t)c->hidden : c->hidden;
}

/* Floats of one block's saved activations at rows tokens of batch sequences. */
static int64_t block_floats(const lm_config_t *c, int64_t batch, int64_t rows)
{
    int64_t C = c->dim;
    return rows * (C + qkv_width(c) + C + C + C + fc_width(c) + c->hidden) + 4 * rows +
           batch * c->heads * (int64_t)c->seq * c->seq;
}

static size_t workspace_bytes(const lm_config_t *c, int64_t rows)
{
    int64_t C = c->dim, I = c->hidden;
    const int64_t lin[6][2] = {{C, qkv_width(c)}, {C, C}, {C, I}, {I, C}, {C, c->vocab},
                               {C, kv_dim(c)}};
    size_t most = 0, b = 0;
    for (int i = 0; i < 6; i++) {
        fsdp2_nn_linear_workspace_bytes(lin[i][0], lin[i][1], &b);
        most = b > most ? b : most;
        if (c->lora.r > 0) /* any linear may carry an adapter */
            fsdp2_nn_lora_workspace_bytes(lin[i][0], lin[i][1], c->lora.r, &b);
        most = b > most ? b : most;
    }
    fsdp2_nn_layernorm_workspace_bytes(C, &b);
    most = b > most ? b : most;
    fsdp2_nn_rmsnorm_workspace_bytes(C, &b);
    most = b > most ? b : most;
    fsdp2_nn_attention_workspace_bytes(c->seq, &b);
    most = b > most ? b : most;
    fsdp2_nn_embedding_workspace_bytes(rows, c->vocab > c->positions ? c->vocab : c->positions,
                                       C, &b);
    return b > most ? b : most;
}

/* The allocations lm_allocate makes, in order: bytes of each (n of them). */
static int plan(const lm_config_t *c, int max_batch, int ckpt, uint64_t *bytes)
{
    int64_t rows = (int64_t)max_batch * c->seq, C = c->dim, L = c->layers;
    int64_t head_dim = C / c->heads;
    int n = 0;
    bytes[n++] = 3 * sizeof(int32_t) * (uint64_t)rows;                /* tokens, targets, positions */
    bytes[n++] = sizeof(float) * (uint64_t)((L + 1) * rows * C);      /* res */
    bytes[n++] = sizeof(float) * (uint64_t)((ckpt ? 1 : L) * block_floats(c, max_batch, rows));
    bytes[n++] = sizeof(float) * (uint64_t)(2 * rows * C + 2 * rows); /* proj, normf, meanf, rstdf */
    bytes[n++] = sizeof(float) * (uint64_t)(rows * c->vocab);         /* logits */
    bytes[n++] = sizeof(float) * (uint64_t)(rows * (5 * C + qkv_width(c) + fc_width(c) +
                                                    c->hidden));     /* gradients */
    bytes[n++] = workspace_bytes(c, rows);
    bytes[n++] = llama(c) ? sizeof(float) * (uint64_t)(c->seq * head_dim) : 0; /* rope */
    return n;
}

uint64_t lm_activation_bytes(const lm_config_t *cfg, int max_batch, int checkpointing)
{
    uint64_t bytes[8], sum = 0;
    int n = plan(cfg, max_batch, checkpointing, bytes);
    for (int i = 0; i < n; i++)
        sum += bytes[i];
    return sum;
}

static void carve_acts(lm_acts_t *a, float *p, const lm_config_t *c, int64_t rows)
{
    int64_t C = c->dim;
    float **fields[] = {&a->norm1, &a->qkv, &a->atty, &a->res_mid, &a->norm2, &a->fc, &a->act};
    const int64_t widths[] = {C, qkv_width(c), C, C, C, fc_width(c), c->hidden};
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

fsdp2_status_t lm_allocate(lm_model_t *m, int max_batch, int checkpointing)
{
    const lm_config_t *c = &m->cfg;
    uint64_t bytes[8];
    int n = plan(c, max_batch, checkpointing, bytes);
    m->allocations = calloc((size_t)n, sizeof(void *));
    if (!m->allocations)
        return FSDP2_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        if (bytes[i])
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
    m->normf = p, p += rows * C;
    m->meanf = p, p += rows;
    m->rstdf = p;
    m->logits = m->allocations[4];
    p = m->allocations[5];
    float **grads[] = {&m->d_res[0], &m->d_res[1], &m->d_mid, &m->d_norm, &m->d_atty, &m->d_qkv,
                       &m->d_fc, &m->d_act};
    const int64_t widths[] = {C, C, C, C, C, qkv_width(c), fc_width(c), c->hidden};
    for (int i = 0; i < 8; i++) {
        *grads[i] = p;
        p += rows * widths[i];
    }
    m->ws.data = m->allocations[6];
    m->ws.bytes = bytes[6];
    m->rope = m->allocations[7];
    if (llama(c))
        TRY(fsdp2_nn_rope_table(&c->rope, C / c->heads, c->seq, m->rope));
    return FSDP2_SUCCESS;
}

/* The GEMM primitives of a step of the largest micro-batch, made now rather than inside
 * the first step (fsdp2_nn_*_prepare): the linears (or their adapters) and the attention.
 * The blocks share their shapes, so the first block and the head are enough. */
fsdp2_status_t lm_prepare(const lm_model_t *m, fsdp2_dtype_t param_dtype)
{
    const lm_block_t *b = &m->blocks[0];
    const lm_linear_t *lin[] = {&b->qkv, &b->q,    &b->k,    &b->v,   &b->o,
                                &b->up,  &b->gate, &b->down, &m->head};
    int64_t rows = (int64_t)m->max_batch * m->cfg.seq;
    for (size_t i = 0; i < sizeof(lin) / sizeof(lin[0]); i++) {
        fsdp2_param_info_t info;
        if (!lin[i]->w)
            continue;
        TRY(fsdp2_param_info(lin[i]->w, &info));
        if (lin[i]->lora_a)
            TRY(fsdp2_nn_lora_prepare(rows, info.shape[1], info.shape[0], m->cfg.lora.r,
                                      m->cfg.lora.alpha / m->cfg.lora.r, param_dtype,
                                      param_dtype, lin[i]->b != NULL));
        else
            TRY(fsdp2_nn_linear_prepare(rows, info.shape[1], info.shape[0], param_dtype,
                                        param_dtype, lin[i]->b != NULL));
    }
    const lm_config_t *c = &m->cfg;
    if (llama(c))
        return fsdp2_nn_gqa_attention_prepare(m->max_batch, c->seq, c->heads, c->kv_heads,
                                              c->dim / c->heads);
    return fsdp2_nn_attention_prepare(m->max_batch, c->seq, c->dim, c->heads);
}

void lm_destroy(lm_model_t *m)
{
    if (!m)
        return;
    fsdp2_module_destroy(m->root);
    for (int i = 0; i < m->num_allocations; i++)
        if (m->allocations[i])
            fsdp2_device_free(CPU, m->allocations[i]);
    free(m->allocations);
    free(m->acts);
    free(m);
}

/* ---- forward and backward ---- */

static fsdp2_tensor_t *value(const fsdp2_param_t *p)
{
    fsdp2_tensor_t *t = NULL;
    if (p)
        fsdp2_param_unsharded(p, &t); /* valid inside the unit's hooks */
    return t;
}

static fsdp2_tensor_t *grad(const fsdp2_param_t *p)
{
    fsdp2_tensor_t *t = NULL;
    fsdp2_param_info_t info;
    if (p && fsdp2_param_info(p, &info) == FSDP2_SUCCESS && info.requires_grad)
        fsdp2_param_grad(p, &t);
    return t;
}

/* The adapter of l as the layers take it: dropout only while training, its mask keyed by
 * (the model's seed, l) and placed at the micro-batch's first token in the run's data
 * (m->dropout_row), so that a token's mask is the same at any world size, with any
 * accumulation and after a resume, in the backward and in a checkpointed block's second
 * forward. */
static fsdp2_nn_lora_t adapter(const lm_model_t *m, const lm_linear_t *l)
{
    int64_t in = value(l->lora_a)->shape[1];
    fsdp2_nn_lora_t a = {.a = value(l->lora_a), .b = value(l->lora_b),
                         .scale = m->cfg.lora.alpha / m->cfg.lora.r,
                         .dropout = m->training ? m->cfg.lora.dropout : 0.0,
                         .seed = m->seed * 1000003u + (uint64_t)l->id,
                         .offset = m->dropout_row * (uint64_t)in};
    return a;
}

/* y = x W^T + b, through the adapter when l has one. */
static fsdp2_status_t linear_forward(lm_model_t *m, const lm_linear_t *l, const float *x,
                                     int64_t rows, float *y)
{
    if (!l->lora_a)
        return fsdp2_nn_linear_forward(x, rows, value(l->w), value(l->b), y, &m->ws);
    fsdp2_nn_lora_t a = adapter(m, l);
    return fsdp2_nn_lora_forward(x, rows, value(l->w), value(l->b), &a, y, &m->ws);
}

/* dx += dy W (and the adapter's part); the gradients of what trains: with an adapter, its
 * A and B only; a frozen weight or bias has no gradient buffer, so none is computed. */
static fsdp2_status_t linear_backward(lm_model_t *m, const lm_linear_t *l, const float *x,
                                      int64_t rows, const float *dy, float *dx)
{
    if (!l->lora_a)
        return fsdp2_nn_linear_backward(x, dy, rows, value(l->w), dx, grad(l->w), grad(l->b),
                                        &m->ws);
    fsdp2_nn_lora_t a = adapter(m, l);
    return fsdp2_nn_lora_backward(x, dy, rows, value(l->w), &a, dx, grad(l->lora_a),
                                  grad(l->lora_b), &m->ws);
}

/* The norm of the architecture: layer norm (mean and rstd saved) or RMSNorm (rstd). */
static fsdp2_status_t norm_forward(lm_model_t *m, const float *x, int64_t rows,
                                   const fsdp2_param_t *w, const fsdp2_param_t *b, float *y,
                                   float *mean, float *rstd)
{
    if (llama(&m->cfg))
        return fsdp2_nn_rmsnorm_forward(x, rows, (float)m->cfg.norm_eps, value(w), y, rstd, &m->ws);
    return fsdp2_nn_layernorm_forward(x, rows, (float)m->cfg.norm_eps, value(w), value(b), y, mean,
                                      rstd, &m->ws);
}

/* sum = x + delta, then the norm of sum, in one pass over the rows. */
static fsdp2_status_t add_norm_forward(lm_model_t *m, const float *x, const float *delta,
                                       int64_t rows, const fsdp2_param_t *w,
                                       const fsdp2_param_t *b, float *sum, float *y, float *mean,
                                       float *rstd)
{
    float eps = (float)m->cfg.norm_eps;
    if (llama(&m->cfg))
        return fsdp2_nn_add_rmsnorm_forward(x, delta, rows, eps, value(w), sum, y, rstd, &m->ws);
    return fsdp2_nn_add_layernorm_forward(x, delta, rows, eps, value(w), value(b), sum, y, mean,
                                          rstd, &m->ws);
}

static fsdp2_status_t norm_backward(lm_model_t *m, const float *x, int64_t rows,
                                    const fsdp2_param_t *w, const fsdp2_param_t *b,
                                    const float *mean, const float *rstd, const float *dy,
                                    float *dx)
{
    if (llama(&m->cfg))
        return fsdp2_nn_rmsnorm_backward(x, rstd, dy, rows, value(w), dx, grad(w), &m->ws);
    return fsdp2_nn_layernorm_backward(x, mean, rstd, dy, rows, value(w), dx, grad(w), grad(b),
                                       &m->ws);
}

/* The attention's inputs from the normed x: GPT-2's fused projection, or Llama's three
 * projections with q and k rotated in place. */
static fsdp2_status_t attention_in(lm_model_t *m, const lm_block_t *b, lm_acts_t *a, int batch,
                                   int seq)
{
    const lm_config_t *c = &m->cfg;
    int64_t rows = (int64_t)batch * seq, hd = c->dim / c->heads;
    if (!llama(c))
        return linear_forward(m, &b->qkv, a->norm1, rows, a->qkv);
    float *q = a->qkv, *k = q + rows * c->dim, *v = k + rows * kv_dim(c);
    TRY(linear_forward(m, &b->q, a->norm1, rows, q));
    TRY(linear_forward(m, &b->k, a->norm1, rows, k));
    TRY(linear_forward(m, &b->v, a->norm1, rows, v));
    TRY(fsdp2_nn_rope_forward(q, m->rope, batch, seq, c->heads, hd, c->seq, q));
    return fsdp2_nn_rope_forward(k, m->rope, batch, seq, c->kv_heads, hd, c->seq, k);
}

static fsdp2_status_t attention(lm_model_t *m, lm_acts_t *a, int batch, int seq)
{
    const lm_config_t *c = &m->cfg;
    int64_t rows = (int64_t)batch * seq;
    if (!llama(c))
        return fsdp2_nn_attention_forward(a->qkv, batch, seq, c->dim, c->heads, a->atty,
                                          a->probs);
    const float *q = a->qkv, *k = q + rows * c->dim, *v = k + rows * kv_dim(c);
    return fsdp2_nn_gqa_attention_forward(q, k, v, batch, seq, c->heads, c->kv_heads,
                                          c->dim / c->heads, a->atty, a->probs);
}

/* The MLP's hidden activation from the normed input (fc, then act). */
static fsdp2_status_t mlp_in(lm_model_t *m, const lm_block_t *b, lm_acts_t *a, int64_t rows)
{
    int64_t n = rows * m->cfg.hidden;
    if (!llama(&m->cfg)) {
        TRY(linear_forward(m, &b->up, a->norm2, rows, a->fc));
        return fsdp2_nn_gelu_forward(a->fc, n, a->act);
    }
    TRY(linear_forward(m, &b->gate, a->norm2, rows, a->fc));
    TRY(linear_forward(m, &b->up, a->norm2, rows, a->fc + n));
    return fsdp2_nn_swiglu_forward(a->fc, a->fc + n, n, a->act);
}

static fsdp2_status_t block_forward(lm_model_t *m, int l, lm_acts_t *a, int batch, int seq)
{
    const lm_block_t *b = &m->blocks[l];
    int64_t C = m->cfg.dim, rows = (int64_t)batch * seq, n = rows * C;
    const float *x = m->res + l * n;
    float *y = m->res + (l + 1) * n;
    TRY(norm_forward(m, x, rows, b->norm1_w, b->norm1_b, a->norm1, a->mean1, a->rstd1));
    TRY(attention_in(m, b, a, batch, seq));
    TRY(attention(m, a, batch, seq));
    TRY(linear_forward(m, &b->o, a->atty, rows, m->proj));
    TRY(add_norm_forward(m, x, m->proj, rows, b->norm2_w, b->norm2_b, a->res_mid, a->norm2,
                         a->mean2, a->rstd2));
    TRY(mlp_in(m, b, a, rows));
    TRY(linear_forward(m, &b->down, a->act, rows, m->proj));
    return fsdp2_nn_residual_forward(a->res_mid, m->proj, n, y);
}

/* d_act -> d_norm (zeroed here): through GELU and c_fc, or SwiGLU and gate, up. */
static fsdp2_status_t mlp_in_backward(lm_model_t *m, const lm_block_t *b, const lm_acts_t *a,
                                      int64_t rows)
{
    int64_t n = rows * m->cfg.hidden;
    TRY(fsdp2_nn_zero(m->d_fc, llama(&m->cfg) ? 2 * n : n));
    TRY(fsdp2_nn_zero(m->d_norm, rows * m->cfg.dim));
    if (!llama(&m->cfg)) {
        TRY(fsdp2_nn_gelu_backward(a->fc, m->d_act, n, m->d_fc));
        return linear_backward(m, &b->up, a->norm2, rows, m->d_fc, m->d_norm);
    }
    TRY(fsdp2_nn_swiglu_backward(a->fc, a->fc + n, m->d_act, n, m->d_fc, m->d_fc + n));
    TRY(linear_backward(m, &b->gate, a->norm2, rows, m->d_fc, m->d_norm));
    return linear_backward(m, &b->up, a->norm2, rows, m->d_fc + n, m->d_norm);
}

/* d_atty -> d_norm (zeroed here): through the attention and its input projections. */
static fsdp2_status_t attention_backward(lm_model_t *m, const lm_block_t *b, const lm_acts_t *a,
                                         int batch, int seq)
{
    const lm_config_t *c = &m->cfg;
    int64_t rows = (int64_t)batch * seq, hd = c->dim / c->heads, kv = rows * kv_dim(c);
    TRY(fsdp2_nn_zero(m->d_qkv, rows * qkv_width(c)));
    TRY(fsdp2_nn_zero(m->d_norm, rows * c->dim));
    if (!llama(c)) {
        TRY(fsdp2_nn_attention_backward(a->qkv, a->probs, m->d_atty, batch, seq, c->dim, c->heads,
                                        m->d_qkv, &m->ws));
        return linear_backward(m, &b->qkv, a->norm1, rows, m->d_qkv, m->d_norm);
    }
    const float *q = a->qkv, *k = q + rows * c->dim, *v = k + kv;
    float *dq = m->d_qkv, *dk = dq + rows * c->dim, *dv = dk + kv;
    TRY(fsdp2_nn_gqa_attention_backward(q, k, v, a->probs, m->d_atty, batch, seq, c->heads,
                                        c->kv_heads, hd, dq, dk, dv, &m->ws));
    TRY(fsdp2_nn_rope_backward(dq, m->rope, batch, seq, c->heads, hd, c->seq, dq));
    TRY(fsdp2_nn_rope_backward(dk, m->rope, batch, seq, c->kv_heads, hd, c->seq, dk));
    TRY(linear_backward(m, &b->q, a->norm1, rows, dq, m->d_norm));
    TRY(linear_backward(m, &b->k, a->norm1, rows, dk, m->d_norm));
    return linear_backward(m, &b->v, a->norm1, rows, dv, m->d_norm);
}

/* dy: the gradient of the block's output; dx (zeroed here) gets its input's. */
static fsdp2_status_t block_backward(lm_model_t *m, int l, const lm_acts_t *a, int batch,
                                     int seq, const float *dy, float *dx)
{
    const lm_block_t *b = &m->blocks[l];
    int64_t C = m->cfg.dim, rows = (int64_t)batch * seq, n = rows * C;
    const float *x = m->res + l * n;
    /* y = res_mid + down(act(norm2(res_mid))) */
    memcpy(m->d_mid, dy, sizeof(float) * (size_t)n); /* the residual's backward */
    TRY(fsdp2_nn_zero(m->d_act, rows * m->cfg.hidden));
    TRY(linear_backward(m, &b->down, a->act, rows, dy, m->d_act));
    TRY(mlp_in_backward(m, b, a, rows));
    TRY(norm_backward(m, a->res_mid, rows, b->norm2_w, b->norm2_b, a->mean2, a->rstd2, m->d_norm,
                      m->d_mid));
    /* res_mid = x + o(attention(norm1(x))) */
    TRY(fsdp2_nn_zero(m->d_atty, n));
    TRY(linear_backward(m, &b->o, a->atty, rows, m->d_mid, m->d_atty));
    TRY(attention_backward(m, b, a, batch, seq));
    memcpy(dx, m->d_mid, sizeof(float) * (size_t)n); /* the residual's backward */
    return norm_backward(m, x, rows, b->norm1_w, b->norm1_b, a->mean1, a->rstd1, m->d_norm, dx);
}

static lm_acts_t *acts_of(lm_model_t *m, int l)
{
    return &m->acts[m->checkpointing ? 0 : l];
}

/* Forward to the logits, inside the root's hooks. */
static fsdp2_status_t forward(lm_model_t *m, int batch, int seq)
{
    int64_t C = m->cfg.dim, rows = (int64_t)batch * seq;
    TRY(fsdp2_pre_forward(m->root));
    TRY(fsdp2_nn_embedding_forward(m->tokens, rows, 0, value(m->embed), m->res));
    if (m->pos_embed) {
        for (int64_t i = 0; i < rows; i++)
            m->positions[i] = (int32_t)(i % seq);
        TRY(fsdp2_nn_embedding_forward(m->positions, rows, 1, value(m->pos_embed), m->res));
    }
    for (int l = 0; l < m->cfg.layers; l++) {
        TRY(fsdp2_pre_forward(m->blocks[l].module));
        TRY(block_forward(m, l, acts_of(m, l), batch, seq));
        TRY(fsdp2_post_forward(m->blocks[l].module));
    }
    const float *last = m->res + (int64_t)m->cfg.layers * rows * C;
    TRY(norm_forward(m, last, rows, m->normf_w, m->normf_b, m->normf, m->meanf, m->rstdf));
    TRY(linear_forward(m, &m->head, m->normf, rows, m->logits));
    return fsdp2_post_forward(m->root);
}

static fsdp2_status_t backward(lm_model_t *m, int batch, int seq)
{
    int64_t C = m->cfg.dim, rows = (int64_t)batch * seq, n = rows * C;
    TRY(fsdp2_pre_backward(m->root));
    /* the head, then the final norm */
    TRY(fsdp2_nn_zero(m->d_norm, n));
    TRY(linear_backward(m, &m->head, m->normf, rows, m->logits, m->d_norm));
    float *d = m->d_res[0], *other = m->d_res[1];
    TRY(fsdp2_nn_zero(d, n));
    const float *last = m->res + (int64_t)m->cfg.layers * n;
    TRY(norm_backward(m, last, rows, m->normf_w, m->normf_b, m->meanf, m->rstdf, m->d_norm, d));
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
    fsdp2_tensor_t *g = grad(m->embed); /* none when frozen */
    if (g)
        TRY(fsdp2_nn_embedding_backward(m->tokens, d, rows, g, &m->ws));
    if (m->pos_embed && (g = grad(m->pos_embed)))
        TRY(fsdp2_nn_embedding_backward(m->positions, d, rows, g, &m->ws));
    TRY(fsdp2_post_backward(m->root));
    return fsdp2_backward_finish(m->root);
}

fsdp2_status_t lm_step(lm_model_t *m, int batch, int do_backward, double divisor, double *loss)
{
    int seq = m->cfg.seq;
    int64_t rows = (int64_t)batch * seq;
    m->training = do_backward;
    TRY(forward(m, batch, seq));
    fsdp2_nn_cross_entropy_options_t o = FSDP2_NN_CROSS_ENTROPY_OPTIONS_INIT;
    o.ignore_index = -1;
    o.divisor = divisor;
    fsdp2_nn_cross_entropy_result_t r;
    TRY(fsdp2_nn_cross_entropy(m->logits, m->targets, rows, m->cfg.vocab, &o,
                               do_backward ? m->logits : NULL, &r));
    *loss = r.loss;
    return do_backward ? backward(m, batch, seq) : FSDP2_SUCCESS;
}

fsdp2_status_t lm_forward_logits(lm_model_t *m, int len, const float **logits)
{
    m->training = 0;
    TRY(forward(m, 1, len));
    *logits = m->logits;
    return FSDP2_SUCCESS;
}
