/* GPT-2 as a libfsdp2 module tree, trained with lib/nn's layers inside FSDP's hooks.
 *
 * Names follow Hugging Face's GPT2LMHeadModel without its "transformer." prefix: wte, wpe,
 * h.{i}.ln_1, h.{i}.attn.c_attn, h.{i}.attn.c_proj, h.{i}.ln_2, h.{i}.mlp.c_fc,
 * h.{i}.mlp.c_proj, ln_f, and lm_head.weight tied to wte.weight. Linear weights are
 * [out, in] (torch.nn.Linear's layout; the export transposes to Conv1D's [in, out]).
 * Each block h.{i} is a fully_shard unit; the root holds the embeddings, ln_f and the
 * tied head.
 *
 * Every activation buffer is allocated once, from the cpu device's allocator (so the
 * measured peak covers it), sized for `max_rows` = micro-batch x seq tokens. */
#ifndef GPT2_MODEL_H
#define GPT2_MODEL_H

#include <stdint.h>

#include <fsdp2/fsdp2.h>
#include <fsdp2/nn.h>

#define GPT2_MAX_LAYERS 96

typedef struct gpt2_config {
    int layers, heads, dim, seq, vocab;
} gpt2_config_t;

typedef struct gpt2_block {
    fsdp2_module_t *module;
    fsdp2_param_t *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
    fsdp2_param_t *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
} gpt2_block_t;

/* One block's saved activations (its input is res[l]). */
typedef struct gpt2_acts {
    float *ln1, *mean1, *rstd1, *qkv, *atty, *probs, *res_mid, *ln2, *mean2, *rstd2, *fc, *gelu;
} gpt2_acts_t;

typedef struct gpt2_model {
    gpt2_config_t cfg;
    int max_batch; /* sequences per micro-batch */
    int checkpointing; /* blocks keep only their input; backward recomputes */
    fsdp2_module_t *root;
    fsdp2_param_t *wte, *wpe, *lnf_w, *lnf_b;
    gpt2_block_t blocks[GPT2_MAX_LAYERS];
    /* activations */
    int32_t *tokens, *targets, *positions;
    float *res;          /* [layers + 1][rows, dim]: each block's input, then the last output */
    gpt2_acts_t *acts;   /* layers sets, or one with checkpointing */
    float *proj, *lnf, *meanf, *rstdf, *logits; /* logits [rows, vocab]; its gradient in place */
    float *d_res[2], *d_mid, *d_ln, *d_atty, *d_qkv, *d_fc, *d_gelu;
    fsdp2_nn_workspace_t ws;
    uint64_t activation_bytes; /* everything above, as allocated */
    void **allocations;
    int num_allocations;
} gpt2_model_t;

/* The tree on meta with GPT-2's initialisation (normal 0.02, the residual projections
 * 0.02 / sqrt(2 layers), zero biases, unit norms), from seed: the same values at every
 * world size. Not sharded yet. */
fsdp2_status_t gpt2_create(const gpt2_config_t *cfg, uint64_t seed, gpt2_model_t **out);

/* fully_shard each block, then the root, over mesh; then materialises the parameters. */
fsdp2_status_t gpt2_shard(gpt2_model_t *m, fsdp2_mesh_t *mesh, fsdp2_dtype_t param_dtype,
                          int reshard_after_forward);

/* Bytes of activations (and the layers' workspace) for micro-batches of max_batch
 * sequences: what gpt2_allocate will take. */
uint64_t gpt2_activation_bytes(const gpt2_config_t *cfg, int max_batch, int checkpointing);
fsdp2_status_t gpt2_allocate(gpt2_model_t *m, int max_batch, int checkpointing);

void gpt2_destroy(gpt2_model_t *m);

/* Forward of batch sequences of m->tokens (targets in m->targets) and, when backward,
 * the backward: the loss is the sum of token losses divided by divisor, its gradient
 * added to the parameters' (FSDP reduces at the end of the backward). Returns the loss
 * in *loss. backward = 0: forward only (validation). */
fsdp2_status_t gpt2_step(gpt2_model_t *m, int batch, int backward, double divisor, double *loss);

/* The logits of the last position of sequence 0 after a forward of one sequence of len
 * tokens (m->tokens): for sampling. */
fsdp2_status_t gpt2_next_logits(gpt2_model_t *m, int len, const float **logits);

int64_t gpt2_numel(const gpt2_config_t *cfg);

#endif
