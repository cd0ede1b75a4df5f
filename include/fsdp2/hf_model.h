/* Hugging Face model directories (docs/models.md): GPT-2 (GPT2LMHeadModel) and Llama
 * (LlamaForCausalLM), read and written as transformers publishes them.
 *
 * A directory holds config.json and either model.safetensors or the shards listed by
 * model.safetensors.index.json. Opening one parses config.json, computes from it every
 * tensor the architecture has (name and shape), and checks every safetensors header
 * against that list: a missing tensor, a shape that differs, a dtype other than F32, BF16
 * or F16, a tensor the architecture does not have, an index that names a file not there
 * or a tensor not in the file it says, are each refused, naming the file, the tensor and
 * both shapes. No tensor data is read until the whole directory checks out.
 *
 * Canonical names and layout. Tensors are named as transformers names them, without
 * GPT-2's "transformer." prefix ("wte.weight", "h.0.attn.c_attn.weight";
 * "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"). Every linear weight is
 * presented in torch.nn.Linear's [out, in] layout, whatever the file holds: GPT-2's
 * Conv1D weights, stored [in, out], are transposed on reading and on writing, so a
 * trainer's rows are always output features. Buffers that are not parameters
 * (GPT-2's attn.bias and attn.masked_bias, Llama's rotary_emb.inv_freq) are skipped. A
 * tied head (tie_word_embeddings) is no tensor of its own: a stored copy (GPT-2 files
 * often have one) has its shape checked and is otherwise ignored, as transformers ties
 * it to the embedding when it loads.
 *
 * None of these functions is collective; all block on file I/O on the calling thread.
 * fsdp2_hf_model_read may run on several threads at once (reads share no state); a
 * writer is driven by one thread. */
#ifndef FSDP2_HF_MODEL_H
#define FSDP2_HF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/dtype.h>
#include <fsdp2/export.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

FSDP2_EXTERN_C_BEGIN

typedef enum fsdp2_hf_arch {
    FSDP2_HF_GPT2 = 1,  /* model_type "gpt2": GPT2LMHeadModel */
    FSDP2_HF_LLAMA = 2, /* model_type "llama": LlamaForCausalLM */
} fsdp2_hf_arch_t;

typedef enum fsdp2_hf_rope_scaling {
    FSDP2_HF_ROPE_NONE = 0,
    FSDP2_HF_ROPE_LLAMA3 = 1, /* rope_type "llama3" (Llama 3.1 and later) */
} fsdp2_hf_rope_scaling_t;

/* A model's config.json, architecture-neutral. `size` is sizeof(fsdp2_hf_config_t), set
 * by FSDP2_HF_CONFIG_INIT: later versions only append fields. For GPT-2 the rope and
 * bias fields are unused (0) and num_kv_heads equals num_heads. */
typedef struct fsdp2_hf_config {
    unsigned size;
    fsdp2_hf_arch_t arch;
    int64_t vocab_size;
    int64_t hidden_size;       /* gpt2 n_embd, llama hidden_size */
    int64_t num_layers;        /* n_layer, num_hidden_layers */
    int64_t num_heads;         /* n_head, num_attention_heads */
    int64_t num_kv_heads;      /* llama num_key_value_heads (default num_heads) */
    int64_t head_dim;          /* hidden_size / num_heads (a config's head_dim must equal it) */
    int64_t intermediate_size; /* gpt2 n_inner (null: 4 n_embd), llama intermediate_size */
    int64_t max_positions;     /* n_positions, max_position_embeddings */
    double norm_eps;           /* layer_norm_epsilon, rms_norm_eps */
    double rope_theta;         /* llama (default 10000) */
    fsdp2_hf_rope_scaling_t rope_scaling;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor; /* llama3 scaling */
    int64_t rope_original_max_positions;                             /* llama3 scaling */
    int tie_word_embeddings; /* gpt2 default 1, llama default 0 */
    int64_t bos_token_id;    /* -1: absent; a list keeps its first (the log says so) */
    int64_t eos_token_id;
    char hidden_act[16];     /* gpt2 "gelu_new" (activation_function), llama "silu" */
} fsdp2_hf_config_t;

/* Zero sizes, rope_theta 10000, no rope scaling, untied, no bos/eos ids. */
#define FSDP2_HF_CONFIG_INIT                                                                \
    {sizeof(fsdp2_hf_config_t), (fsdp2_hf_arch_t)0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 10000.0,  \
     FSDP2_HF_ROPE_NONE, 0.0, 0.0, 0.0, 0, 0, -1, -1, ""}

/* Parses and validates dir/config.json into *cfg (cfg->size set by the caller).
 * Refused, naming the field and its value: a model_type other than gpt2 and llama; a
 * missing or non-positive size; heads that do not divide hidden_size, kv heads that do
 * not divide heads; a head_dim that is not hidden_size / heads; another hidden_act
 * (activation_function); a rope_scaling other than null or llama3; Llama's
 * attention_bias or mlp_bias true (no such tensors are supported). */
FSDP2_API fsdp2_status_t fsdp2_hf_config_read(const char *dir, fsdp2_hf_config_t *cfg);

/* One tensor of the architecture, in canonical name and layout. */
typedef struct fsdp2_hf_tensor_info {
    const char *name;         /* canonical (owned by the model or writer) */
    int ndim;                 /* 1 or 2 */
    int64_t shape[2];         /* canonical: [out, in] for linear weights */
    int transposed;           /* 1: stored [in, out] (GPT-2 Conv1D) */
    fsdp2_dtype_t file_dtype; /* F32, BF16 or F16 (open models only) */
} fsdp2_hf_tensor_info_t;

typedef struct fsdp2_hf_model fsdp2_hf_model_t;

/* Opens dir: config.json, then model.safetensors.index.json if present (every file it
 * names opened, every tensor where the map says) or else model.safetensors, each file
 * opened without blocking and refused at once unless a regular file (a FIFO, a
 * directory). Checks every header against the config as above. */
FSDP2_API fsdp2_status_t fsdp2_hf_model_open(const char *dir, fsdp2_hf_model_t **model);
FSDP2_API fsdp2_status_t fsdp2_hf_model_close(fsdp2_hf_model_t *model);
/* Copies the parsed config (up to cfg->size bytes). */
FSDP2_API fsdp2_status_t fsdp2_hf_model_config(const fsdp2_hf_model_t *model,
                                               fsdp2_hf_config_t *cfg);
/* The tensors in canonical order (embeddings, the layers in order, the final norm, an
 * untied head): *count of them; tensor i's info (name owned by the model). */
FSDP2_API fsdp2_status_t fsdp2_hf_model_num_tensors(const fsdp2_hf_model_t *model,
                                                    size_t *count);
FSDP2_API fsdp2_status_t fsdp2_hf_model_tensor(const fsdp2_hf_model_t *model, size_t i,
                                               fsdp2_hf_tensor_info_t *info);

/* Reads rows [row0, row0 + rows) of a tensor's canonical layout (a vector's elements)
 * into dst, rows x shape[1] elements of dst_dtype (FSDP2_F32 or FSDP2_BF16), converting
 * from the file's dtype (each rank reads only its rows). A NaN or an infinity is refused,
 * naming the tensor and the first such element's flat index in the file's layout; after
 * an error dst holds an unspecified part of the rows. */
FSDP2_API fsdp2_status_t fsdp2_hf_model_read(fsdp2_hf_model_t *model, const char *name,
                                             int64_t row0, int64_t rows,
                                             fsdp2_dtype_t dst_dtype, void *dst);

/* Writing a directory: config.json, and model.safetensors or, when max_shard_bytes is
 * set and the tensors pass it, model-0000i-of-0000n.safetensors with
 * model.safetensors.index.json. Names as transformers' save_pretrained writes them (GPT-2
 * with "transformer.", a tied head not stored). `size` as in the config. */
typedef struct fsdp2_hf_export_options {
    unsigned size;
    fsdp2_dtype_t dtype;      /* FSDP2_F32 (default) or FSDP2_BF16 in the files */
    uint64_t max_shard_bytes; /* 0: one file */
} fsdp2_hf_export_options_t;

#define FSDP2_HF_EXPORT_OPTIONS_INIT {sizeof(fsdp2_hf_export_options_t), FSDP2_F32, 0}

typedef struct fsdp2_hf_writer fsdp2_hf_writer_t;

/* Starts writing cfg's model (validated as fsdp2_hf_config_read does; num_kv_heads,
 * head_dim and hidden_act may be left 0 or empty for their defaults; bos/eos ids as
 * given, -1 for none) to dir. dir must not exist or be an empty directory, and its parent
 * must exist; everything goes into a temporary directory beside it that
 * fsdp2_hf_writer_finish renames to dir, so a failure never leaves a partial dir. */
FSDP2_API fsdp2_status_t fsdp2_hf_writer_create(const char *dir, const fsdp2_hf_config_t *cfg,
                                                const fsdp2_hf_export_options_t *opts,
                                                fsdp2_hf_writer_t **writer);
/* The tensor the writer expects next, in canonical order (info->name NULL once every
 * tensor was written). */
FSDP2_API fsdp2_status_t fsdp2_hf_writer_next(const fsdp2_hf_writer_t *writer,
                                              fsdp2_hf_tensor_info_t *info);
/* Writes the next tensor whole, in its canonical layout, from data of src_dtype (F32 or
 * BF16; shape[0] x shape[1] elements); name must be the next one. The data is copied
 * (converted, transposed) before the call returns. */
FSDP2_API fsdp2_status_t fsdp2_hf_writer_write(fsdp2_hf_writer_t *writer, const char *name,
                                               fsdp2_dtype_t src_dtype, const void *data);
/* Adds a file beside the weights (tokenizer.json, generation_config.json): len bytes of
 * data, copied before the call returns. name is a plain file name other than the
 * config's and the weights'; an existing one is refused. */
FSDP2_API fsdp2_status_t fsdp2_hf_writer_add_file(fsdp2_hf_writer_t *writer, const char *name,
                                                  const void *data, size_t len);
/* Once every tensor is written: syncs the files and renames the directory into place.
 * Frees the writer whatever the result; on failure nothing is left behind. */
FSDP2_API fsdp2_status_t fsdp2_hf_writer_finish(fsdp2_hf_writer_t *writer);
/* Removes everything written and frees the writer. NULL ignored. */
FSDP2_API fsdp2_status_t fsdp2_hf_writer_abort(fsdp2_hf_writer_t *writer);

/* ---- PEFT LoRA adapter directories ----
 * adapter_config.json (peft_type "LORA") and adapter_model.safetensors, as peft's
 * save_pretrained writes them. Tensor names there are
 * "base_model.model.<module path>.lora_A.weight" ([r, in]) and ".lora_B.weight"
 * ([out, r]); canonical names here drop "base_model.model." and GPT-2's "transformer."
 * ("h.0.attn.c_attn.lora_A.weight", "model.layers.0.self_attn.q_proj.lora_B.weight"), as
 * for model directories. GPT-2's Conv1D layers get adapters of the same shapes (peft's
 * fan_in_fan_out only transposes the base weight). */

#define FSDP2_HF_LORA_MAX_TARGETS 16

/* adapter_config.json's fields. `size` as in fsdp2_hf_config_t. */
typedef struct fsdp2_hf_lora_config {
    unsigned size;
    int64_t r;           /* r */
    double alpha;        /* lora_alpha: the adapter's output is scaled by alpha / r */
    double dropout;      /* lora_dropout */
    int num_targets;     /* target_modules (a list of names) */
    char targets[FSDP2_HF_LORA_MAX_TARGETS][48];
    int fan_in_fan_out;  /* GPT-2's Conv1D: true */
    char base_model[256]; /* base_model_name_or_path ("" for none) */
} fsdp2_hf_lora_config_t;

#define FSDP2_HF_LORA_CONFIG_INIT {sizeof(fsdp2_hf_lora_config_t), 0, 0.0, 0.0, 0, {""}, 0, ""}

typedef struct fsdp2_hf_adapter fsdp2_hf_adapter_t;

/* Opens dir: adapter_config.json and adapter_model.safetensors (files refused at once
 * unless regular). Refused, naming the field or tensor: a peft_type other than LORA; r
 * not a positive integer; a lora_alpha that is not a finite number; lora_dropout outside
 * [0, 1); target_modules that is not a list of up to 16 names; bias other than "none";
 * use_dora, use_rslora, lora_bias, modules_to_save, layers_to_transform, rank_pattern,
 * alpha_pattern, exclude_modules, layer_replication or target_parameters set (not
 * supported); a tensor that is not a lora_A or lora_B weight, of
 * a dtype other than F32, BF16 or F16, or whose shape does not carry r; an A without its B
 * or a B without its A. */
FSDP2_API fsdp2_status_t fsdp2_hf_adapter_open(const char *dir, fsdp2_hf_adapter_t **adapter);
FSDP2_API fsdp2_status_t fsdp2_hf_adapter_close(fsdp2_hf_adapter_t *adapter);
FSDP2_API fsdp2_status_t fsdp2_hf_adapter_config(const fsdp2_hf_adapter_t *adapter,
                                                 fsdp2_hf_lora_config_t *cfg);
/* The adapter's tensors (canonical names owned by the adapter, file order). */
FSDP2_API fsdp2_status_t fsdp2_hf_adapter_num_tensors(const fsdp2_hf_adapter_t *adapter,
                                                      size_t *count);
FSDP2_API fsdp2_status_t fsdp2_hf_adapter_tensor(const fsdp2_hf_adapter_t *adapter, size_t i,
                                                 fsdp2_hf_tensor_info_t *info);
/* Rows [row0, row0 + rows) of a tensor by canonical name, as fsdp2_hf_model_read. */
FSDP2_API fsdp2_status_t fsdp2_hf_adapter_read(fsdp2_hf_adapter_t *adapter, const char *name,
                                               int64_t row0, int64_t rows,
                                               fsdp2_dtype_t dst_dtype, void *dst);

/* Writes an adapter directory dir (absent or empty; its parent must exist) for a model
 * of arch: adapter_config.json from cfg (peft_type LORA, task_type CAUSAL_LM, bias none,
 * fan_in_fan_out as cfg says) and adapter_model.safetensors of the n tensors (canonical
 * names, whole, f32 or bf16 cpu tensors, written in their dtype), named as peft names
 * them. Not collective: the caller gathers the adapters first (they are small). The
 * directory appears whole or not at all. */
FSDP2_API fsdp2_status_t fsdp2_hf_adapter_write(const char *dir,
                                                const fsdp2_hf_lora_config_t *cfg,
                                                fsdp2_hf_arch_t arch, size_t n,
                                                const char *const *names,
                                                const fsdp2_tensor_t *const *tensors);

FSDP2_EXTERN_C_END

#endif
