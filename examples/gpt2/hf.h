/* GPT-2 weights as Hugging Face's GPT2LMHeadModel stores them: one safetensors file with
 * "transformer."-prefixed names, the linear weights in Conv1D's [in, out] layout, the LM
 * head tied (not stored), and a config.json beside it. */
#ifndef GPT2_HF_H
#define GPT2_HF_H

#include <fsdp2/fsdp2.h>

#include "model.h"

/* Collective: every parameter gathered whole in turn and written by rank 0 into a
 * temporary file renamed to path when complete; config.json goes to path's directory. */
fsdp2_status_t gpt2_hf_export(gpt2_model_t *m, fsdp2_group_t *world, int rank, const char *path);

/* Not collective: each rank reads its rows of every parameter from path (names, dtypes
 * and shapes checked against the model; F32 only). */
fsdp2_status_t gpt2_hf_import(gpt2_model_t *m, const char *path);

#endif
