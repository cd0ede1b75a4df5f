/* Checkpoints inside the library: the state dict (state_dict.c), the metadata file
 * (metadata.c), save and export (save.c), load and import (load.c), and the collectives
 * they share over a mesh (mesh_text.c). */
#ifndef FSDP2_CHECKPOINT_INTERNAL_H
#define FSDP2_CHECKPOINT_INTERNAL_H

#include <fsdp2/checkpoint.h>
#include <fsdp2/mesh.h>

#define CKPT_BLOCK_BYTES (1u << 20) /* one CRC-32C per MiB of a chunk */
#define CKPT_METADATA "metadata.json"
#define CKPT_MAX_METADATA (256u << 20)

typedef struct sd_entry {
    char *name;
    fsdp2_dtensor_t *dtensor; /* borrowed */
    fsdp2_tensor_t *tensor;   /* borrowed: whole on every rank */
    int optimizer;            /* an optimizer state tensor */
    fsdp2_param_t *param;     /* a sharded parameter's handle, NULL otherwise: whether it
                                 has values is read from it when saving (a load or import
                                 gives it values), never cached */
} sd_entry_t;

/* Whether e is a parameter declared on meta that nothing has given values yet. */
int sd_entry_unmaterialized(const sd_entry_t *e);
/* e's parameter has values now (a load or import wrote this rank's rows). */
void sd_entry_materialized(const sd_entry_t *e);

struct fsdp2_state_dict {
    sd_entry_t *entries; /* sorted by name */
    size_t count;
    fsdp2_optimizer_t *opt;
    fsdp2_mesh_t *mesh; /* of the DTensors; NULL when there are none */
};

/* This rank's block of an entry: dtype, global shape, offset and local shape, the data
 * (host or device) and whether this rank is the one that saves it. */
typedef struct sd_block {
    fsdp2_dtype_t dtype;
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
    int64_t offset[FSDP2_MAX_DIMS];
    int64_t local[FSDP2_MAX_DIMS];
    fsdp2_tensor_t *data; /* borrowed */
    int writer;
} sd_block_t;

fsdp2_status_t sd_block_of(const fsdp2_state_dict_t *sd, const sd_entry_t *e, sd_block_t *b);

/* The mesh's rank of this process (row-major) and the world size. */
fsdp2_status_t ckpt_mesh_rank(fsdp2_mesh_t *mesh, int *rank, int *size);
/* Every rank's text (NUL-terminated), in rank order, on every rank: all[i] malloc'ed,
 * all malloc'ed; free with ckpt_texts_free. Collective over the mesh. */
fsdp2_status_t ckpt_all_texts(fsdp2_mesh_t *mesh, const char *mine, char ***all, int *n);
void ckpt_texts_free(char **all, int n);

#endif
