/* examples/lm's command line (args.c): what main.c runs with. */
#ifndef LM_ARGS_H
#define LM_ARGS_H

#include <stdint.h>

#include <fsdp2/fsdp2.h>
#include <fsdp2/hf_model.h>

#include "model.h"

typedef struct args {
    const char *preset, *data, *json, *save, *resume, *export_path, *init_from, *param_dtype;
    const char *dump_batches, *export_dtype, *tokenizer, *token_cache;
    const char *adapter, *save_adapter, *export_merged; /* PEFT adapter directories */
    fsdp2_hf_adapter_t *hf_adapter; /* --adapter, open from parse to setup */
    char dir_tokenizer[4096]; /* --model DIR's tokenizer.json, when it has one */
    fsdp2_hf_model_t *hf; /* --init-from, open from parse to setup */
    int64_t bos, eos;     /* the token ids config.json gave (-1: none) */
    lm_config_t cfg;
    long steps, seed, val_every, val_batches, sample, log_every, save_every;
    int batch, grad_accum, threads, no_shard, hsdp, checkpointing, reshard_after_forward;
    double lr, min_lr, weight_decay, clip;
    long warmup;
} args_t;

/* Parses argv into *a, exiting with a message naming the flag on bad input (status 2),
 * or on a model directory that cannot be opened (status 1). */
void lm_args_parse(int argc, char **argv, args_t *a);

#endif
