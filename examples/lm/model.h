/* A causal language model as a libfsdp2 module tree, GPT-2 or Llama, trained with lib/nn's
 * layers inside FSDP's hooks.
 *
 * Parameter names are Hugging Face's, so a model directory maps onto the tree by name:
 * - GPT-2 (GPT2LMHeadModel without its "transformer." prefix): wte, wpe, h.{i}.ln_1,
 *   h.{i}.attn.c_attn, h.{i}.attn.c_proj, h.{i}.ln_2, h.{i}.mlp.c_fc, h.{i}.mlp.c_proj,
 *   ln_f, and lm_head.weight tied to wte.weight.
 * - Llama (LlamaForCausalLM): model.embed_tokens, model.layers.{i}.input_layernorm,
 *   model.layers.{i}.self_attn.{q,k,v,o}_proj, model.layers.{i}.post_attention_layernorm,
 *   model.layers.{i}.mlp.{gate,up,down}_proj, model.norm, and lm_head (or tied to
 *   model.embed_tokens.weight).
 * Linear weights are [out, in] (torch.nn.Linear's layout; GPT-2's Conv1D files store
 * [in, out], which the import and export transpose). Each block is a fully_shard unit; the
 * root holds the embeddings, the final norm and the head.
 *
 * Every activation buffer is allocated once, from the cpu device's allocator (so the
 * measured peak covers it), sized for `max_rows` = micro-batch x seq tokens. */
#ifndef LM_MODEL_H
#define LM_MODEL_H

#include <stdint.h>

#include <fsdp2/fsdp2.h>
#include <fsdp2/nn.h>

#define LM_MAX_LAYERS 256

typedef enum lm_arch { LM_GPT2, LM_LLAMA } lm_arch_t;

#define LM_LORA_MAX_TARGETS 16
#define LM_MAX_FREEZE 16

/* LoRA adapters as PEFT's LoraConfig: rank r (0: none), lora_alpha, lora_dropout, and
 * target_modules: a linear layer is adapted when its module path equals a target or ends
 * in "." and the target (q_proj, v_proj; GPT-2's c_attn, c_proj, c_fc). With adapters,
 * every other parameter is frozen, as get_peft_model does. */
typedef struct lm_lora {
    int r;
    double alpha, dropout;
    int num_targets;
    char targets[LM_LORA_MAX_TARGETS][48];
} lm_lora_t;

typedef struct lm_config {
    lm_arch_t arch;
    int layers, heads, kv_heads, dim, hidden; /* hidden: the MLP's inner width */
    int seq;       /* the context trained (<= positions); Llama's rope table has seq rows */
    int positions; /* the model's: GPT-2's wpe rows, Llama's max_position_embeddings */
    int vocab;
    int tied;                                 /* the head is the token embedding */
    double norm_eps;
    fsdp2_nn_rope_config_t rope; /* Llama only */
    lm_lora_t lora;
    int num_freeze; /* parameters whose name matches one of these shell patterns do not
                     * train ('*' crosses dots) */
    const char *freeze[LM_MAX_FREEZE];
} lm_config_t;

/* GPT-2's shape for the given sizes: kv_heads = heads, hidden = 4 dim, positions = seq,
 * eps 1e-5, tied head. */
lm_config_t lm_gpt2_config(int layers, int heads, int dim, int seq, int vocab);

/* A linear layer: weight [out, in], bias (or NULL), and its LoRA adapter (lora_A [r, in],
 * lora_B [out, r], or NULL). id numbers it in the model (the adapter's dropout stream). */
typedef struct lm_linear {
    fsdp2_param_t *w, *b, *lora_a, *lora_b;
    int id;
} lm_linear_t;

typedef struct lm_block {
    fsdp2_module_t *module;
    fsdp2_param_t *norm1_w, *norm1_b, *norm2_w, *norm2_b; /* biases: GPT-2 only */
    lm_linear_t qkv;                                      /* GPT-2's fused c_attn */
    lm_linear_t q, k, v;                                  /* Llama */
    lm_linear_t o;                                        /* c_proj / o_proj */
    lm_linear_t up;                                       /* c_fc / up_proj */
    lm_linear_t gate;                                     /* Llama */
    lm_linear_t down;                                     /* mlp.c_proj / down_proj */
} lm_block_t;

/* One block's saved activations (its input is res[l]). qkv holds q, k, v one after the
 * other (GPT-2: the fused projection's [rows, 3 dim]); fc holds GPT-2's c_fc output or
 * Llama's gate then up. */
typedef struct lm_acts {
    float *norm1, *mean1, *rstd1, *qkv, *atty, *probs, *res_mid, *norm2, *mean2, *rstd2, *fc,
        *act;
} lm_acts_t;

typedef struct lm_model {
    lm_config_t cfg;
    int max_batch;     /* sequences per micro-batch */
    int checkpointing; /* blocks keep only their input; backward recomputes */
    fsdp2_module_t *root;
    fsdp2_param_t *embed, *pos_embed, *normf_w, *normf_b;
    lm_linear_t head; /* head.w = embed when tied */
    int num_linears;
    uint64_t seed;         /* the adapters' dropout masks: one stream per linear layer */
    uint64_t dropout_row;  /* set by the caller before lm_step: the micro-batch's first
                            * token counted in the run's data (step x global batch + window)
                            * x seq, where the masks' streams are read */
    int training;          /* dropout on */
    lm_block_t blocks[LM_MAX_LAYERS];
    /* activations */
    int32_t *tokens, *targets, *positions;
    float *res;        /* [layers + 1][rows, dim]: each block's input, then the last output */
    lm_acts_t *acts;   /* layers sets, or one with checkpointing */
    float *proj, *normf, *meanf, *rstdf, *logits; /* logits [rows, vocab]; its gradient in place */
    float *rope;       /* Llama's table [seq, head_dim] */
    float *d_res[2], *d_mid, *d_norm, *d_atty, *d_qkv, *d_fc, *d_act;
    fsdp2_nn_workspace_t ws;
    uint64_t activation_bytes; /* everything above, as allocated */
    void **allocations;
    int num_allocations;
} lm_model_t;

/* The tree on meta with the architecture's initialisation from seed (normal 0.02; GPT-2's
 * residual projections 0.02 / sqrt(2 layers); zero biases, unit norms; LoRA's A
 * Kaiming-uniform as PEFT's, B zero): the same values at every world size. Not sharded
 * yet. A bad config is refused naming the field; LoRA targets that match no linear layer
 * are refused naming them and the candidates, and so is an adapter on a tied head. */
fsdp2_status_t lm_create(const lm_config_t *cfg, uint64_t seed, lm_model_t **out);

/* fully_shard each block, then the root, over mesh; then materialises the parameters. */
fsdp2_status_t lm_shard(lm_model_t *m, fsdp2_mesh_t *mesh, fsdp2_dtype_t param_dtype,
                        int reshard_after_forward);

/* Bytes of activations (and the layers' workspace) for micro-batches of max_batch
 * sequences: what lm_allocate will take. */
uint64_t lm_activation_bytes(const lm_config_t *cfg, int max_batch, int checkpointing);
fsdp2_status_t lm_allocate(lm_model_t *m, int max_batch, int checkpointing);
/* Makes the GEMM primitives of a step now, after lm_allocate and fsdp2_nn_set_threads. */
fsdp2_status_t lm_prepare(const lm_model_t *m, fsdp2_dtype_t param_dtype);

void lm_destroy(lm_model_t *m);

/* Forward of batch sequences of m->tokens (targets in m->targets; -1 ignored) and, when
 * backward, the backward: the loss is the sum of token losses divided by divisor, its
 * gradient added to the parameters' (FSDP reduces at the end of the backward). Returns
 * the loss in *loss. backward = 0: forward only (validation). */
fsdp2_status_t lm_step(lm_model_t *m, int batch, int backward, double divisor, double *loss);

/* The logits [len, vocab] after a forward of one sequence of len tokens (m->tokens):
 * for sampling (the last row) and for checks against a reference. */
fsdp2_status_t lm_forward_logits(lm_model_t *m, int len, const float **logits);

/* The base model's parameters (without adapters). */
int64_t lm_numel(const lm_config_t *cfg);

#endif
