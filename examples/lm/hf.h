/* The model's parameters to and from Hugging Face model directories, through the
 * library's fsdp2/hf_model.h: config.json of GPT2LMHeadModel or LlamaForCausalLM, and its
 * tensors in one file or sharded, F32, BF16 or F16. The model's parameter names and
 * [out, in] layout are the library's canonical ones, in its order. */
#ifndef LM_HF_H
#define LM_HF_H

#include <fsdp2/fsdp2.h>
#include <fsdp2/hf_model.h>

#include "model.h"

/* The context trained by default: the model's positions up to this many (--seq-len
 * chooses another up to the positions). */
#define LM_DEFAULT_SEQ 1024

/* The shape an open directory gives the model, and the bos/eos ids of its config.json
 * (-1: none), or -1 with a message in err: a model the example cannot build (more than
 * LM_MAX_LAYERS layers, a size past an int, an odd Llama head dim). */
int lm_hf_shape(fsdp2_hf_model_t *hf, lm_config_t *cfg, int64_t *bos, int64_t *eos, char *err,
                size_t size);

/* Whether a parameter name is a LoRA adapter's (lora_A, lora_B) rather than the base's. */
int lm_is_adapter(const char *fqn);

/* Not collective: each rank reads its rows of every parameter of the base (not the
 * adapters). */
fsdp2_status_t lm_hf_import(lm_model_t *m, fsdp2_hf_model_t *hf);

/* A file copied into an export: its name there and where it is read from. */
typedef struct lm_hf_file {
    const char *name, *path;
} lm_hf_file_t;

/* Collective: every parameter of the base gathered whole in turn; rank 0 writes the
 * directory dir
 * (which must not exist, or be empty) in dtype (f32 or bf16), with copies of files (the
 * tokenizer's, generation_config.json), appearing whole or not at all. merged: each
 * adapted weight is written as W + alpha / r B A (else the base as it is). Every rank of world
 * returns the same status (rank 0's failure too). bos/eos: the token ids for config.json
 * (-1: none). */
fsdp2_status_t lm_hf_export(lm_model_t *m, fsdp2_group_t *world, int rank, const char *dir,
                            const lm_hf_file_t *files, int num_files, fsdp2_dtype_t dtype,
                            int merged, int64_t bos, int64_t eos);

/* Not collective: each rank reads its rows of every adapter parameter from a PEFT adapter
 * directory; a missing adapter, one the model has no target for, or a shape that differs
 * is refused naming the module and both shapes. */
fsdp2_status_t lm_hf_import_adapter(lm_model_t *m, fsdp2_hf_adapter_t *adapter,
                                    const char *dir);

/* Collective: the adapters gathered whole; rank 0 writes PEFT's adapter directory dir
 * (adapter_config.json naming base as base_model_name_or_path, adapter_model.safetensors);
 * every rank returns the same status. */
fsdp2_status_t lm_hf_save_adapter(lm_model_t *m, fsdp2_group_t *world, int rank,
                                  const char *dir, const char *base);

#endif
