/* One call from the launcher's environment to a working process: fsdp2_init reads who
 * this process is (fsdp2_process_info_from_env), connects the rendezvous store (rank 0
 * serves it on MASTER_ADDR:MASTER_PORT), creates the world group, and sets the log
 * prefix's rank. A single process with no launcher variables is world size 1 (the store
 * then listens on a free loopback port). */
#ifndef FSDP2_INIT_H
#define FSDP2_INIT_H

#include <fsdp2/bootstrap.h>
#include <fsdp2/export.h>
#include <fsdp2/group.h>
#include <fsdp2/mesh.h>
#include <fsdp2/status.h>
#include <fsdp2/store.h>

FSDP2_EXTERN_C_BEGIN

typedef struct fsdp2_context fsdp2_context_t;

typedef struct fsdp2_init_options {
    unsigned size;           /* sizeof(fsdp2_init_options_t) */
    fsdp2_backend_t backend; /* of the world group: FSDP2_BACKEND_UCX */
    long timeout_ms;         /* store and world group; <= 0: FSDP2_TIMEOUT */
} fsdp2_init_options_t;

#define FSDP2_INIT_OPTIONS_INIT {sizeof(fsdp2_init_options_t), FSDP2_BACKEND_UCX, 0}

/* Collective over the world: every rank calls it. Blocks until all ranks connected (or
 * the timeout, naming the ranks that did not). options may be NULL. A rank whose init
 * fails after the others reached it fails them too: in the world group's creation, or
 * at their first collective on the world, naming it and its error. */
FSDP2_API fsdp2_status_t fsdp2_init(const fsdp2_init_options_t *options, fsdp2_context_t **ctx);

/* Destroys the world group and the store (on rank 0, after the others closed theirs).
 * Synchronize every stream that ran collectives first. NULL ignored. */
FSDP2_API fsdp2_status_t fsdp2_finalize(fsdp2_context_t *ctx);

/* What fsdp2_init found, and what it made (owned by the context). */
FSDP2_API fsdp2_status_t fsdp2_context_info(const fsdp2_context_t *ctx,
                                            fsdp2_process_info_t *info);
FSDP2_API fsdp2_status_t fsdp2_context_store(const fsdp2_context_t *ctx, fsdp2_store_t **store);
FSDP2_API fsdp2_status_t fsdp2_context_world(const fsdp2_context_t *ctx, fsdp2_group_t **world);
/* The 1D mesh "world" over the world group: fully_shard's default mesh while the
 * context lives. */
FSDP2_API fsdp2_status_t fsdp2_context_mesh(const fsdp2_context_t *ctx, fsdp2_mesh_t **mesh);

/* The HSDP mesh of the natural layout, [replicate, shard] = [world / shard, shard]:
 * shard over `shard` consecutive ranks, replicate across those blocks. shard 0 means the
 * ranks of one node (the launcher's local world size), so the all-gathers and
 * reduce-scatters stay inside a node and only the replicate all-reduce crosses nodes;
 * that needs each node's ranks to be consecutive (rank % local world size == local
 * rank, as fsdp2run, torchrun and mpirun's default by-slot mapping give) and every node
 * the same size. A shard that does not divide the world size is
 * FSDP2_ERR_INVALID_ARGUMENT (each rank checks alone; pass the same value everywhere).
 * Collective over the world the first time for a shard size (an all-gather of every
 * rank's proposal, then the mesh's groups): a layout that breaks the rules is
 * FSDP2_ERR_INVALID_CONFIG on every rank, naming the rank that broke them. A mesh that
 * failed to form fails on every rank, and may be asked for again. The context owns the
 * mesh (up to 4 shard sizes) until fsdp2_finalize. */
FSDP2_API fsdp2_status_t fsdp2_context_hsdp_mesh(fsdp2_context_t *ctx, int shard,
                                                 fsdp2_mesh_t **mesh);

FSDP2_EXTERN_C_END

#endif
