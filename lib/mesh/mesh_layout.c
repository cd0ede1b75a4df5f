/* See mesh_layout.h. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "mesh/mesh_layout.h"

fsdp2_status_t mesh_layout_init(mesh_layout_t *l, int world_size, int ndim, const int *shape,
                                const char *const *names)
{
    FSDP2_ARG_CHECK(ndim >= 1 && ndim <= FSDP2_MESH_MAX_DIMS, "mesh ndim %d is not 1 or 2", ndim);
    FSDP2_ARG_CHECK(shape, "mesh shape is NULL");
    memset(l, 0, sizeof(*l));
    l->ndim = ndim;
    long product = 1;
    for (int d = 0; d < ndim; d++) {
        FSDP2_ARG_CHECK(shape[d] >= 1, "mesh dim %d has size %d (must be >= 1)", d, shape[d]);
        l->shape[d] = shape[d];
        product *= shape[d];
        if (names && names[d]) {
            FSDP2_ARG_CHECK(names[d][0] && strlen(names[d]) < FSDP2_MESH_NAME_MAX,
                            "mesh dim %d name '%s' must have 1..%d characters", d, names[d],
                            FSDP2_MESH_NAME_MAX - 1);
            snprintf(l->names[d], sizeof(l->names[d]), "%s", names[d]);
        } else {
            snprintf(l->names[d], sizeof(l->names[d]), "dim%d", d);
        }
    }
    if (ndim == 2)
        FSDP2_ARG_CHECK(strcmp(l->names[0], l->names[1]) != 0, "mesh dims share the name '%s'",
                        l->names[0]);
    if (product != world_size) {
        char text[64];
        if (ndim == 1)
            snprintf(text, sizeof(text), "[%d]", shape[0]);
        else
            snprintf(text, sizeof(text), "[%d,%d]", shape[0], shape[1]);
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "mesh shape %s has %ld ranks but the world has %d", text, product,
                           world_size);
    }
    return FSDP2_SUCCESS;
}

void mesh_layout_coords(const mesh_layout_t *l, int rank, int *coords)
{
    for (int d = l->ndim - 1; d >= 0; d--) {
        coords[d] = rank % l->shape[d];
        rank /= l->shape[d];
    }
}

int mesh_layout_rank(const mesh_layout_t *l, const int *coords)
{
    int rank = 0;
    for (int d = 0; d < l->ndim; d++)
        rank = rank * l->shape[d] + coords[d];
    return rank;
}

void mesh_layout_group_ranks(const mesh_layout_t *l, int rank, int dim, int *ranks)
{
    int coords[FSDP2_MESH_MAX_DIMS];
    mesh_layout_coords(l, rank, coords);
    for (int c = 0; c < l->shape[dim]; c++) {
        coords[dim] = c;
        ranks[c] = mesh_layout_rank(l, coords);
    }
}
