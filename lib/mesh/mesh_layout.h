/* Row-major device-mesh layout, without communication: validation, coordinates, and the
 * ranks of each dim's group. lib/collectives/mesh.c builds fsdp2_mesh on it. */
#ifndef FSDP2_MESH_LAYOUT_H
#define FSDP2_MESH_LAYOUT_H

#include <fsdp2/mesh.h>

typedef struct mesh_layout {
    int ndim;
    int shape[FSDP2_MESH_MAX_DIMS];
    char names[FSDP2_MESH_MAX_DIMS][FSDP2_MESH_NAME_MAX];
} mesh_layout_t;

/* Checks ndim, shape (product == world_size), names (NULL: dim0, dim1; distinct). */
fsdp2_status_t mesh_layout_init(mesh_layout_t *layout, int world_size, int ndim,
                                const int *shape, const char *const *names);

void mesh_layout_coords(const mesh_layout_t *layout, int rank, int *coords);
int mesh_layout_rank(const mesh_layout_t *layout, const int *coords);

/* The global ranks of rank's group along dim, in coordinate order (shape[dim] entries). */
void mesh_layout_group_ranks(const mesh_layout_t *layout, int rank, int dim, int *ranks);

#endif
