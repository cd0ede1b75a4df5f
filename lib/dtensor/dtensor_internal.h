/* DTensors inside the library: the object (lib/dtensor/dtensor.c), the layout math
 * (layout.c) and the communication steps of redistribution (redistribute.c). */
#ifndef FSDP2_DTENSOR_INTERNAL_H
#define FSDP2_DTENSOR_INTERNAL_H

#include <fsdp2/dtensor.h>

struct fsdp2_dtensor {
    fsdp2_mesh_t *mesh; /* borrowed */
    int mesh_ndim;
    int mesh_shape[FSDP2_MESH_MAX_DIMS];
    int coords[FSDP2_MESH_MAX_DIMS];
    fsdp2_placement_t placements[FSDP2_MESH_MAX_DIMS];
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
    fsdp2_dtype_t dtype;
    int64_t offset[FSDP2_MAX_DIMS];
    fsdp2_tensor_t *local; /* owned handle; its shape is the local shape */
};

/* Checks placements against a tensor of ndim dims on a mesh of mesh_ndim dims. */
fsdp2_status_t dtensor_check_placements(int mesh_ndim, const fsdp2_placement_t *placements,
                                        int ndim);

/* Whether two placements are the same (Shard dims and Partial ops compared). */
int dtensor_placement_equal(fsdp2_placement_t a, fsdp2_placement_t b);

/* Mesh shape and this rank's coordinates. */
fsdp2_status_t dtensor_mesh_geometry(const fsdp2_mesh_t *mesh, int *ndim, int *shape, int *coords);

/* dtensor_wrap into a zeroed struct the caller allocated (a redistribution allocates it
 * with everything else before its first collective); on failure dt holds no reference. */
fsdp2_status_t dtensor_wrap_into(fsdp2_dtensor_t *dt, fsdp2_mesh_t *mesh,
                                 const fsdp2_placement_t *placements, int ndim,
                                 const int64_t *shape, fsdp2_tensor_t *local);
/* A new DTensor owning `local` (the caller's handle moves in), layout computed. */
fsdp2_status_t dtensor_wrap(fsdp2_mesh_t *mesh, const fsdp2_placement_t *placements, int ndim,
                            const int64_t *shape, fsdp2_tensor_t *local, fsdp2_dtensor_t **out);

/* The stream to use: the given one, or the current one of device (cpu for meta). */
fsdp2_status_t dtensor_stream(fsdp2_stream_t *stream, fsdp2_device_t device, fsdp2_stream_t **out);

/* A copy of t in new storage on its device, through stream (synchronized). */
fsdp2_status_t dtensor_copy_tensor(const fsdp2_tensor_t *t, fsdp2_stream_t *stream,
                                   fsdp2_tensor_t **out);

#endif
