/* DTensors: tensors spread over a device mesh, with PyTorch DTensor's meaning.
 *
 * A DTensor has a global shape and dtype, a mesh, and one placement per mesh dim:
 * - Shard(d): the tensor is split along its dim d over the ranks of that mesh dim, the
 *   way torch.chunk splits it: chunk = ceil(n / k) rows, rank r holds rows
 *   [min(r * chunk, n), min((r + 1) * chunk, n)). Trailing ranks may hold fewer rows or
 *   none: 5 rows over 4 ranks are 2,2,1,0; 2 rows over 4 are 1,1,0,0; 6 over 4 are
 *   2,2,2,0.
 * - Replicate: every rank of that mesh dim holds the same values.
 * - Partial(sum|avg): every rank holds a contribution; the value is their sum (mean).
 * Over a 2D mesh the placements apply in mesh-dim order: [Shard(0), Shard(0)] chunks
 * dim 0 over mesh dim 0, then chunks each piece again over mesh dim 1 (PyTorch's
 * order); [Replicate, Shard(0)] is HSDP's layout.
 *
 * Each rank stores only its local tensor, contiguous and row-major, of the local shape
 * at its global offset. Communication (full_tensor, redistribute, distribute, a checked
 * from_local) is collective over the mesh and blocking: it runs on the given stream
 * (NULL: the calling thread's current stream of the local tensor's device), then
 * synchronizes it. It is for set-up, checkpoints and checks; fully_shard's training
 * step moves parameters through its own planned buffers instead. Temporary buffers come
 * from the device allocator and are freed before the call returns.
 *
 * A DTensor keeps a pointer to its mesh (which must outlive it) and one reference on
 * its local tensor's storage. */
#ifndef FSDP2_DTENSOR_H
#define FSDP2_DTENSOR_H

#include <stdint.h>

#include <fsdp2/dtype.h>
#include <fsdp2/export.h>
#include <fsdp2/group.h>
#include <fsdp2/mesh.h>
#include <fsdp2/random.h>
#include <fsdp2/status.h>
#include <fsdp2/stream.h>
#include <fsdp2/tensor.h>

FSDP2_EXTERN_C_BEGIN

typedef enum fsdp2_placement_type {
    FSDP2_PLACEMENT_REPLICATE = 0,
    FSDP2_PLACEMENT_SHARD = 1,
    FSDP2_PLACEMENT_PARTIAL = 2,
} fsdp2_placement_type_t;

typedef struct fsdp2_placement {
    fsdp2_placement_type_t type;
    int dim;              /* Shard: the tensor dim split (0 .. ndim-1) */
    fsdp2_reduce_op_t op; /* Partial: FSDP2_REDUCE_SUM or FSDP2_REDUCE_AVG */
} fsdp2_placement_t;

/* Initialisers: fsdp2_placement_t p[2] = {FSDP2_REPLICATE_INIT, FSDP2_SHARD_INIT(0)}; */
#define FSDP2_REPLICATE_INIT {FSDP2_PLACEMENT_REPLICATE, 0, FSDP2_REDUCE_SUM}
#define FSDP2_SHARD_INIT(d) {FSDP2_PLACEMENT_SHARD, (d), FSDP2_REDUCE_SUM}
#define FSDP2_PARTIAL_SUM_INIT {FSDP2_PLACEMENT_PARTIAL, 0, FSDP2_REDUCE_SUM}
#define FSDP2_PARTIAL_AVG_INIT {FSDP2_PLACEMENT_PARTIAL, 0, FSDP2_REDUCE_AVG}

/* Every source rank (FSDP2_DISTRIBUTE_ALL) for fsdp2_dtensor_distribute. */
#define FSDP2_DISTRIBUTE_ALL (-1)

typedef struct fsdp2_dtensor fsdp2_dtensor_t;

/* What a DTensor is, as seen from this rank. */
typedef struct fsdp2_dtensor_info {
    int ndim;                                        /* 0 .. FSDP2_MAX_DIMS */
    int64_t shape[FSDP2_MAX_DIMS];                   /* global */
    int64_t stride[FSDP2_MAX_DIMS];                  /* global, row-major, in elements */
    int64_t local_shape[FSDP2_MAX_DIMS];             /* this rank's */
    int64_t offset[FSDP2_MAX_DIMS];                  /* where it starts, per global dim */
    int empty;                                       /* local numel == 0 */
    fsdp2_dtype_t dtype;
    fsdp2_device_t device;
    int mesh_ndim;
    fsdp2_placement_t placements[FSDP2_MESH_MAX_DIMS];
} fsdp2_dtensor_info_t;

/* The rows [*offset, *offset + *length) that piece `index` of `chunks` gets when a dim
 * of `size` rows is split as torch.chunk splits it (see above). Pure. */
FSDP2_API fsdp2_status_t fsdp2_chunk_range(int64_t size, int chunks, int index,
                                           int64_t *offset, int64_t *length);

/* The local shape and global offset of the rank at mesh coordinates coords[0..mesh_ndim)
 * of a mesh of mesh_shape, for a tensor of global shape[0..ndim) under placements.
 * Pure: it is how a checkpoint finds every rank's piece. An empty piece's offset is
 * where its rows would start (the end of the piece before it). */
FSDP2_API fsdp2_status_t fsdp2_shard_layout(int mesh_ndim, const int *mesh_shape, const int *coords,
                                            const fsdp2_placement_t *placements, int ndim,
                                            const int64_t *shape, int64_t *local_shape,
                                            int64_t *offset);

/* Writes placements as PyTorch prints them, "[Replicate(), Shard(dim=0)]", into buf;
 * truncates safely. */
FSDP2_API fsdp2_status_t fsdp2_placements_format(int mesh_ndim, const fsdp2_placement_t *placements,
                                                 char *buf, size_t len);

/* A DTensor whose local shard is allocated on device (cpu, cuda, or meta: no memory) and
 * left uninitialised (empty) or zeroed (zeros, synchronously). Not collective. */
FSDP2_API fsdp2_status_t fsdp2_dtensor_empty(fsdp2_mesh_t *mesh, const fsdp2_placement_t *placements,
                                             fsdp2_device_t device, fsdp2_dtype_t dtype, int ndim,
                                             const int64_t *shape, fsdp2_dtensor_t **out);
FSDP2_API fsdp2_status_t fsdp2_dtensor_zeros(fsdp2_mesh_t *mesh, const fsdp2_placement_t *placements,
                                             fsdp2_device_t device, fsdp2_dtype_t dtype, int ndim,
                                             const int64_t *shape, fsdp2_dtensor_t **out);

/* Collective, blocking. Splits a full tensor over the mesh. Every rank passes `full`
 * with the same shape and dtype; with src_rank >= 0 only that (global) rank's values are
 * used and broadcast, and other ranks may pass a meta tensor; with FSDP2_DISTRIBUTE_ALL
 * every rank's values are used and must be equal. A mismatch of shape or dtype is an
 * error on every rank, naming both. The result is new storage on the stream's device
 * (full's device when stream is NULL, or cpu when that is meta). */
FSDP2_API fsdp2_status_t fsdp2_dtensor_distribute(const fsdp2_tensor_t *full, fsdp2_mesh_t *mesh,
                                                  const fsdp2_placement_t *placements,
                                                  int src_rank, fsdp2_stream_t *stream,
                                                  fsdp2_dtensor_t **out);

/* Wraps this rank's local tensor (one more reference, no copy) as a DTensor of global
 * shape[0..ndim). local's shape must be this rank's piece (an error names both). With
 * verify set it is collective and blocking: every rank checks that all ranks declared
 * the same global shape, dtype and placements and hold the right pieces, and all of
 * them fail when any does. Without it nothing is communicated. */
FSDP2_API fsdp2_status_t fsdp2_dtensor_from_local(fsdp2_tensor_t *local, fsdp2_mesh_t *mesh,
                                                  const fsdp2_placement_t *placements, int ndim,
                                                  const int64_t *shape, int verify,
                                                  fsdp2_stream_t *stream, fsdp2_dtensor_t **out);

/* Releases a DTensor and its reference on the local storage. NULL is accepted. */
FSDP2_API fsdp2_status_t fsdp2_dtensor_release(fsdp2_dtensor_t *dt);

FSDP2_API fsdp2_status_t fsdp2_dtensor_info(const fsdp2_dtensor_t *dt, fsdp2_dtensor_info_t *info);
FSDP2_API fsdp2_status_t fsdp2_dtensor_mesh(const fsdp2_dtensor_t *dt, fsdp2_mesh_t **mesh);

/* A new handle on the local tensor (shares its storage); release it. */
FSDP2_API fsdp2_status_t fsdp2_dtensor_to_local(const fsdp2_dtensor_t *dt, fsdp2_tensor_t **local);

/* Collective, blocking. The whole tensor on every rank (new storage, on the local
 * tensor's device): shards are gathered and partial values reduced. Meta stays meta. */
FSDP2_API fsdp2_status_t fsdp2_dtensor_full_tensor(const fsdp2_dtensor_t *dt,
                                                   fsdp2_stream_t *stream, fsdp2_tensor_t **full);

/* Collective, blocking. The same global tensor under other placements, on the same mesh.
 * Per mesh dim: Shard->Replicate all-gathers, Partial->Replicate all-reduces,
 * Partial->Shard reduce-scatters, Replicate->Shard slices locally, Replicate->Partial
 * keeps the values on coordinate 0 and zeros elsewhere for sum (keeps them everywhere
 * for avg). The other pairs go through Replicate: Shard(i)->Shard(j) gathers then slices
 * (no all-to-all, so it needs the gathered size in memory), Shard->Partial gathers,
 * Partial(sum)<->Partial(avg) all-reduces. Nested shards of one tensor dim over both
 * mesh dims are gathered inner first and sliced outer first. Reductions need a floating
 * dtype (f32, f64, bf16, f16; an error names the dtype). When nothing moves, the result
 * shares dt's storage. */
FSDP2_API fsdp2_status_t fsdp2_dtensor_redistribute(const fsdp2_dtensor_t *dt,
                                                    const fsdp2_placement_t *placements,
                                                    fsdp2_stream_t *stream, fsdp2_dtensor_t **out);

/* Fills the local shard from a counter-based generator keyed on the global element
 * index (see fsdp2/random.h), so the global values do not depend on the world size,
 * the mesh or the placements. Partial(sum) dims get the values on coordinate 0 and
 * zeros elsewhere. Blocking, not collective; meta is a no-op. */
FSDP2_API fsdp2_status_t fsdp2_dtensor_init_random(fsdp2_dtensor_t *dt,
                                                   const fsdp2_random_init_t *init);

/* Checks that dt lives on `mesh` with `placements`, dtype and global shape; on mismatch
 * the error names what and both values ("'fc1.weight': placements [Shard(dim=0)] do
 * not match [Replicate()]"). what may be NULL; mesh or placements NULL are not
 * checked. */
FSDP2_API fsdp2_status_t fsdp2_dtensor_check(const fsdp2_dtensor_t *dt, const char *what,
                                             const fsdp2_mesh_t *mesh,
                                             const fsdp2_placement_t *placements,
                                             fsdp2_dtype_t dtype, int ndim, const int64_t *shape);

FSDP2_EXTERN_C_END

#endif
