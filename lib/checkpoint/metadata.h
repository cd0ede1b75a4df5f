/* metadata.json in memory (parsed and validated), and reading a tensor's rows out of its
 * chunks with the checksums verified: shared by load.c and the offline tools (tools.c). */
#ifndef FSDP2_CHECKPOINT_METADATA_H
#define FSDP2_CHECKPOINT_METADATA_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include <fsdp2/optim.h>

#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/safetensors.h"

typedef struct chunk {
    char file[64];
    uint64_t offset, bytes;
    int64_t row0, rows; /* dim-0 range; the other dims are whole */
    uint32_t *crc;
    size_t num_crc;
} chunk_t;

typedef struct meta_tensor {
    const char *name; /* in the cJSON tree */
    fsdp2_dtype_t dtype;
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
    chunk_t *chunks;
    size_t num_chunks;
} meta_tensor_t;

typedef struct meta {
    cJSON *root;
    int version, world_size;
    int mesh_ndim; /* 0: no "mesh" (the state dict had no DTensors) */
    int mesh[FSDP2_MESH_MAX_DIMS];
    int64_t step, optim_step;
    int has_optim_step;
    int has_lr_schedule; /* "optim.lr_schedule": the optimizer's, with its base lr */
    fsdp2_lr_schedule_t lr_schedule;
    double base_lr;
    uint64_t block;
    meta_tensor_t *tensors;
    size_t num_tensors;
    char path[4096];
} meta_t;

typedef struct open_files {
    char dir[4096];
    char names[64][64];
    st_file_t files[64];
    int count;
} open_files_t;

void meta_free(meta_t *m);
/* Reads and validates dir/metadata.json (sizes, types, ranges, chunk tiling). */
fsdp2_status_t meta_load(const char *dir, meta_t *m);
const meta_tensor_t *meta_find(const meta_t *m, const char *name);
/* The rank file called name in of->dir, opened on first use. */
fsdp2_status_t meta_file_of(open_files_t *of, const char *name, st_file_t **f);
/* Copies rows [lo, hi) of chunk k of tensor t into dst, reading whole checksum blocks and
 * verifying them; *bytes_read grows by what was read. */
fsdp2_status_t meta_read_rows(open_files_t *of, const meta_t *m, const meta_tensor_t *t,
                              const chunk_t *k, int64_t lo, int64_t hi, char *dst,
                              uint64_t *bytes_read);

/* Shared with save.c: removes dir's files and dir; writes and fsyncs a text file; makes
 * partial the checkpoint at dir atomically; a JSON array of integers. */
fsdp2_status_t ckpt_remove_dir(const char *dir);
fsdp2_status_t ckpt_write_text(const char *path, const char *text);
fsdp2_status_t ckpt_publish(const char *partial, const char *dir);
cJSON *ckpt_int_array(const int64_t *v, int n);
/* path without trailing slashes ("ckpt/" -> "ckpt"; "/" stays). */
void ckpt_clean_path(const char *path, char *buf, size_t len);

#endif
