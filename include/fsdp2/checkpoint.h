/* Sharded checkpoints (the format: docs/checkpoint-format.md).
 *
 * A state dict is the model's (and optionally the optimizer's) state as named tensors:
 * every sharded parameter as its DTensor under its FQN ("fc1.weight"), every optimizer
 * state tensor as "optim.state.<fqn>.<name>" ("optim.state.fc1.weight.exp_avg"), and
 * module buffers and ignored parameters (whole on every rank) under their FQNs. Making
 * one communicates nothing and copies nothing: it borrows the live tensors.
 *
 * Save writes a directory: one safetensors file per rank with that rank's shards
 * ("rank-00003.safetensors"), written in parallel, and metadata.json (rank 0, once every
 * rank has finished) with every tensor's global shape, dtype, placements and chunks
 * (file, byte offset, global offset, shape, CRC-32C per MiB). The directory appears
 * atomically: everything is written into "<dir>.partial", fsynced, then swapped into
 * place, so a crash leaves the previous checkpoint whole and no half-written one that
 * looks valid.
 *
 * Load reads any such checkpoint into a state dict of any world size or mesh (resharding):
 * each rank reads only the byte ranges of the chunks that overlap its shards (rounded out
 * to the 1 MiB checksum blocks, which are verified), and copies them into its shards in
 * place. */
#ifndef FSDP2_CHECKPOINT_H
#define FSDP2_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <fsdp2/dtensor.h>
#include <fsdp2/export.h>
#include <fsdp2/module.h>
#include <fsdp2/optim.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

FSDP2_EXTERN_C_BEGIN

#define FSDP2_CHECKPOINT_VERSION 1

typedef struct fsdp2_state_dict fsdp2_state_dict_t;

/* The state of root's tree, and of opt when not NULL (its step count is saved as
 * "optim.step"). Not collective; borrows the tensors (keep the tree and the optimizer
 * alive while the state dict lives). */
FSDP2_API fsdp2_status_t fsdp2_state_dict_create(fsdp2_module_t *root, fsdp2_optimizer_t *opt,
                                                 fsdp2_state_dict_t **sd);
/* NULL ignored. */
FSDP2_API fsdp2_status_t fsdp2_state_dict_destroy(fsdp2_state_dict_t *sd);
FSDP2_API fsdp2_status_t fsdp2_state_dict_size(const fsdp2_state_dict_t *sd, size_t *count);
/* Entry i (0 .. size-1) in name order: its name (owned by sd) and either a DTensor or,
 * for whole tensors, a plain tensor (the other is NULL). */
FSDP2_API fsdp2_status_t fsdp2_state_dict_entry(const fsdp2_state_dict_t *sd, size_t i,
                                                const char **name, fsdp2_dtensor_t **dtensor,
                                                fsdp2_tensor_t **tensor);

typedef struct fsdp2_checkpoint_options {
    unsigned size;            /* sizeof(fsdp2_checkpoint_options_t) */
    int64_t step;             /* saved in the metadata (load: ignored) */
    const char *const *extra_keys; /* user entries saved in the metadata (load: ignored) */
    const char *const *extra_values;
    size_t num_extra;
    int strict;               /* load: 1 (default): any difference is an error */
} fsdp2_checkpoint_options_t;

#define FSDP2_CHECKPOINT_OPTIONS_INIT {sizeof(fsdp2_checkpoint_options_t), 0, NULL, NULL, 0, 1}

/* What a load found. Names are comma-separated lists, truncated (with "...") to fit. */
typedef struct fsdp2_checkpoint_report {
    unsigned size;   /* sizeof(fsdp2_checkpoint_report_t), set by the caller */
    int64_t step;    /* as saved */
    int version;
    int saved_world_size;
    size_t loaded;   /* tensors loaded */
    size_t missing;  /* in the state dict, not in the checkpoint */
    size_t unexpected; /* in the checkpoint, not in the state dict */
    size_t mismatched; /* in both, with another shape or dtype */
    char missing_names[512];
    char unexpected_names[512];
    char mismatched_names[512];
    uint64_t bytes_read; /* by this rank */
} fsdp2_checkpoint_report_t;

/* Collective over the mesh of the state dict's DTensors; blocking. Writes dir (replaced
 * atomically if it exists). options may be NULL. */
FSDP2_API fsdp2_status_t fsdp2_checkpoint_save(const fsdp2_state_dict_t *sd, const char *dir,
                                               const fsdp2_checkpoint_options_t *options);

/* Reads dir into the state dict's tensors (in place; the optimizer's step count too when
 * the state dict has one). Not collective: every rank reads its own shards. strict (the
 * default) makes a missing, unexpected, mis-shaped or mis-typed tensor an error naming
 * it and loads nothing; non-strict loads what matches and reports the rest. A corrupt
 * or truncated checkpoint, a bad checksum or a version from the future is an error
 * naming the file. report may be NULL; the user entries of the metadata are read with
 * fsdp2_checkpoint_extra. */
FSDP2_API fsdp2_status_t fsdp2_checkpoint_load(fsdp2_state_dict_t *sd, const char *dir,
                                               const fsdp2_checkpoint_options_t *options,
                                               fsdp2_checkpoint_report_t *report);

/* The user entry key of dir's metadata into buf; FSDP2_ERR_NOT_FOUND when absent. */
FSDP2_API fsdp2_status_t fsdp2_checkpoint_extra(const char *dir, const char *key, char *buf,
                                                size_t len);

/* Copies src's tensors into dst's in place, by name (src: another state dict, e.g. of a
 * model built the same way, or one holding whole tensors). A DTensor gets the local
 * shard of a src DTensor with the same mesh and placements, or its rows of a whole src
 * tensor; a whole tensor gets a whole tensor. Not collective (no resharding between
 * different placements: go through fsdp2_checkpoint_save / load for that, an error says
 * so). Strictness and report as for fsdp2_checkpoint_load. */
FSDP2_API fsdp2_status_t fsdp2_load_state_dict(fsdp2_state_dict_t *dst,
                                               const fsdp2_state_dict_t *src,
                                               const fsdp2_checkpoint_options_t *options,
                                               fsdp2_checkpoint_report_t *report);

/* The whole model as one safetensors file at path (the state dict's model tensors only,
 * not the optimizer's): collective, each tensor gathered in turn and written by rank 0,
 * so no rank holds more than one whole tensor at a time. Readable by the Python
 * safetensors package and Hugging Face loaders. */
FSDP2_API fsdp2_status_t fsdp2_checkpoint_export_full(const fsdp2_state_dict_t *sd,
                                                      const char *path);
/* Loads a whole-model safetensors file: every rank reads only its rows of each tensor.
 * Not collective. Strictness and report as for fsdp2_checkpoint_load (optimizer entries
 * are not expected in the file). */
FSDP2_API fsdp2_status_t fsdp2_checkpoint_import_full(fsdp2_state_dict_t *sd, const char *path,
                                                      const fsdp2_checkpoint_options_t *options,
                                                      fsdp2_checkpoint_report_t *report);

/* Offline tools (one process, no mesh): what tools/fsdp2-ckpt runs. */

/* Prints what dir holds (format, world size, step, extra entries, every tensor with its
 * dtype, shape, placements, chunks and bytes) to out, as text or (json) JSON. The
 * metadata is validated; the data is not read (fsdp2_checkpoint_verify reads it). */
FSDP2_API fsdp2_status_t fsdp2_checkpoint_inspect(const char *dir, FILE *out, int json);
/* Reads every chunk of dir and checks every checksum and every rank file's header
 * against the metadata; the first problem is the error. *bytes (may be NULL) gets the
 * bytes checked. */
FSDP2_API fsdp2_status_t fsdp2_checkpoint_verify(const char *dir, uint64_t *bytes);
/* Writes dir's tensors (model and optimizer) whole into one safetensors file at path,
 * one tensor in memory at a time. */
FSDP2_API fsdp2_status_t fsdp2_checkpoint_consolidate(const char *dir, const char *path);
/* Rewrites dir as a checkpoint saved by world_size ranks of a 1D mesh (every tensor
 * that was sharded becomes Shard(0) over world_size, whole tensors stay whole) at
 * out_dir, atomically as a save is. Every chunk read is verified. */
FSDP2_API fsdp2_status_t fsdp2_checkpoint_reshard(const char *dir, const char *out_dir,
                                                  int world_size);

FSDP2_EXTERN_C_END

#endif
