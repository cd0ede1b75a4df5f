/* The example's parameters to and from Hugging Face model directories, through the
 * library's fsdp2/hf_model.h: config.json with GPT2LMHeadModel's fields, and its tensors
 * in one file or sharded, F32, BF16 or F16, with or without the "transformer." prefix.
 * The example's names and [out, in] layout are the library's canonical ones. */
#ifndef GPT2_HF_H
#define GPT2_HF_H

#include <fsdp2/fsdp2.h>

#include "model.h"

/* The shape an open directory gives the model, or an error message in err: a model the
 * example cannot build (not gpt2, an untied head, n_inner other than 4 n_embd, a
 * layer_norm_epsilon other than the example's 1e-5, more than GPT2_MAX_LAYERS). */
int gpt2_hf_shape(fsdp2_hf_model_t *hf, gpt2_config_t *cfg, char *err, size_t size);

/* Not collective: each rank reads its rows of every parameter. */
fsdp2_status_t gpt2_hf_import(gpt2_model_t *m, fsdp2_hf_model_t *hf);

/* Collective: every parameter gathered whole in turn; rank 0 writes the directory dir
 * (which must not exist, or be empty) in dtype (f32 or bf16), appearing whole or not at
 * all. bos/eos: the token ids for config.json (-1: none). Rank 0 prints its error. */
fsdp2_status_t gpt2_hf_export(gpt2_model_t *m, int rank, const char *dir, fsdp2_dtype_t dtype,
                              int64_t bos, int64_t eos);

#endif
