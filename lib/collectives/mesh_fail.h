/* Failing a mesh's groups together (lib/collectives/mesh.c): for the layers above the
 * collectives (FSDP, the optimizer's clipping, checkpoints, DTensors). */
#ifndef FSDP2_COLLECTIVES_MESH_FAIL_H
#define FSDP2_COLLECTIVES_MESH_FAIL_H

#include <fsdp2/mesh.h>

/* A failure of this rank inside a step that uses mesh's groups (the FSDP hooks, gradient
 * clipping, a checkpoint, a redistribution), after its checks up front: every group of
 * the mesh fails here and tells its peers (fsdp2_group_break), so that none waits for
 * this rank until its timeout. Returns status unchanged, and this thread's message as it
 * was (the reason the peers are given). SUCCESS, or a NULL mesh, does nothing. */
fsdp2_status_t fsdp2_mesh_fail(fsdp2_mesh_t *mesh, fsdp2_status_t status);

#endif
