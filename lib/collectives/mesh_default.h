/* The world mesh fsdp2_init makes: a 1D mesh over the world group (borrowed, not owned),
 * used by fully_shard when its options name no mesh. */
#ifndef FSDP2_COLLECTIVES_MESH_DEFAULT_H
#define FSDP2_COLLECTIVES_MESH_DEFAULT_H

#include <fsdp2/mesh.h>

/* A 1D mesh whose only group is g; destroying the mesh leaves g alone. Block groups
 * (fsdp2_mesh_block_group) are created through store with options. */
fsdp2_status_t fsdp2_mesh_wrap_group(fsdp2_group_t *g, fsdp2_store_t *store,
                                     const fsdp2_group_options_t *options, fsdp2_mesh_t **out);

/* The mesh of the live fsdp2_init context, or NULL. */
fsdp2_mesh_t *fsdp2_default_mesh(void);
void fsdp2_default_mesh_set(fsdp2_mesh_t *mesh);

#endif
