/* Device meshes: the world's ranks arranged in 1 or 2 named dims, row-major as in
 * PyTorch's init_device_mesh (rank = c0 * shape[1] + c1), with one process group per dim
 * for the ranks that differ only in that dim (HSDP: "replicate" x "shard").
 *
 * A mesh is created collectively by every rank of the world and owns its groups. */
#ifndef FSDP2_MESH_H
#define FSDP2_MESH_H

#include <fsdp2/export.h>
#include <fsdp2/group.h>
#include <fsdp2/status.h>
#include <fsdp2/store.h>

FSDP2_EXTERN_C_BEGIN

#define FSDP2_MESH_MAX_DIMS 2
#define FSDP2_MESH_NAME_MAX 32

typedef struct fsdp2_mesh fsdp2_mesh_t;

/* Collective over the world (world_size ranks; this one is `rank`). `name` prefixes the
 * groups' store keys and must differ between meshes (1..60 characters). shape's product must equal
 * world_size; names (distinct, 1..31 characters) may be NULL for "dim0", "dim1".
 * options (may be NULL) apply to every group. The mesh exists on every rank or on none: a
 * rank whose part fails makes every other rank's creation fail at once with
 * FSDP2_ERR_PEER_FAILED, naming it and its error. */
FSDP2_API fsdp2_status_t fsdp2_mesh_create(fsdp2_store_t *store, const char *name, int rank,
                                           int world_size, int ndim, const int *shape,
                                           const char *const *names,
                                           const fsdp2_group_options_t *options,
                                           fsdp2_mesh_t **mesh);

/* Destroys the mesh and its groups (see fsdp2_group_destroy). NULL ignored. */
FSDP2_API fsdp2_status_t fsdp2_mesh_destroy(fsdp2_mesh_t *mesh);

FSDP2_API fsdp2_status_t fsdp2_mesh_ndim(const fsdp2_mesh_t *mesh, int *ndim);
/* Size of dim `dim`. */
FSDP2_API fsdp2_status_t fsdp2_mesh_size(const fsdp2_mesh_t *mesh, int dim, int *size);
/* The dim called `name`; FSDP2_ERR_INVALID_ARGUMENT naming it when there is none. */
FSDP2_API fsdp2_status_t fsdp2_mesh_dim(const fsdp2_mesh_t *mesh, const char *name, int *dim);
/* This rank's coordinate along dim. */
FSDP2_API fsdp2_status_t fsdp2_mesh_coordinate(const fsdp2_mesh_t *mesh, int dim, int *coord);
/* The global rank at coordinates coords[0..ndim). */
FSDP2_API fsdp2_status_t fsdp2_mesh_rank_at(const fsdp2_mesh_t *mesh, const int *coords,
                                            int *rank);
/* The group of dim `dim` (owned by the mesh): this rank's rank in it is its coordinate. */
FSDP2_API fsdp2_status_t fsdp2_mesh_group(const fsdp2_mesh_t *mesh, int dim,
                                          fsdp2_group_t **group);

/* The group of the n consecutive ranks along the mesh's last dim that hold this rank
 * (coordinates c - c % n .. c - c % n + n - 1, the other coordinate kept), in which this
 * rank is c % n: what reshard_after_forward = n gathers over (on one host per block
 * when the launcher puts a node's ranks next to each other). n must divide the dim's
 * size; n equal to it gives the dim's own group. Created on the first call for n,
 * collectively by the n members (through the store the mesh was made with, which must
 * still be open), then owned by the mesh (at most 8 sizes). Not thread-safe. */
FSDP2_API fsdp2_status_t fsdp2_mesh_block_group(fsdp2_mesh_t *mesh, int n, fsdp2_group_t **group);

/* values[0..count) = their mean over every rank of the mesh (a loss, an accuracy): f64
 * sums over each dim's group, divided by the number of ranks. Collective over the mesh's
 * ranks; runs on stream and blocks until it is done, so values may be a variable on the
 * caller's stack (an async collective's buffer may be one only when the caller
 * synchronizes its stream before the variable goes out of scope). */
FSDP2_API fsdp2_status_t fsdp2_mesh_average(const fsdp2_mesh_t *mesh, double *values,
                                            size_t count, fsdp2_stream_t *stream);

FSDP2_EXTERN_C_END

#endif
