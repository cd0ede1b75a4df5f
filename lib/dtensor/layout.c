/* Chunk math: how torch.chunk splits a dim, and where a rank's piece of a DTensor lies.
 * No communication. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "dtensor/dtensor_internal.h"

fsdp2_status_t fsdp2_chunk_range(int64_t size, int chunks, int index, int64_t *offset,
                                 int64_t *length)
{
    FSDP2_ARG_CHECK(offset && length, "chunk range: offset or length is NULL");
    FSDP2_ARG_CHECK(size >= 0, "chunk range: size %lld is negative", (long long)size);
    FSDP2_ARG_CHECK(chunks >= 1 && index >= 0 && index < chunks,
                    "chunk range: piece %d of %d does not exist", index, chunks);
    /* torch.chunk: every piece has ceil(size / chunks) rows until the rows run out. */
    int64_t chunk = size / chunks + (size % chunks != 0);
    int64_t start = chunk * index;
    if (start > size)
        start = size;
    int64_t end = start + chunk < size ? start + chunk : size;
    *offset = start;
    *length = end - start;
    return FSDP2_SUCCESS;
}

int dtensor_placement_equal(fsdp2_placement_t a, fsdp2_placement_t b)
{
    if (a.type != b.type)
        return 0;
    if (a.type == FSDP2_PLACEMENT_SHARD)
        return a.dim == b.dim;
    if (a.type == FSDP2_PLACEMENT_PARTIAL)
        return a.op == b.op;
    return 1;
}

fsdp2_status_t dtensor_check_placements(int mesh_ndim, const fsdp2_placement_t *placements,
                                        int ndim)
{
    FSDP2_ARG_CHECK(placements, "placements is NULL");
    FSDP2_ARG_CHECK(ndim >= 0 && ndim <= FSDP2_MAX_DIMS, "ndim %d is not in 0..%d", ndim,
                    FSDP2_MAX_DIMS);
    for (int i = 0; i < mesh_ndim; i++) {
        fsdp2_placement_t p = placements[i];
        switch (p.type) {
        case FSDP2_PLACEMENT_REPLICATE:
            break;
        case FSDP2_PLACEMENT_SHARD:
            FSDP2_ARG_CHECK(p.dim >= 0 && p.dim < ndim,
                            "placement %d: Shard(dim=%d) of a tensor with %d dims", i, p.dim,
                            ndim);
            break;
        case FSDP2_PLACEMENT_PARTIAL:
            FSDP2_ARG_CHECK(p.op == FSDP2_REDUCE_SUM || p.op == FSDP2_REDUCE_AVG,
                            "placement %d: Partial op %d is not sum (0) or avg (1)", i, (int)p.op);
            break;
        default:
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "placement %d: type %d is not Replicate (0), Shard (1) or "
                               "Partial (2)",
                               i, (int)p.type);
        }
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_shard_layout(int mesh_ndim, const int *mesh_shape, const int *coords,
                                  const fsdp2_placement_t *placements, int ndim,
                                  const int64_t *shape, int64_t *local_shape, int64_t *offset)
{
    FSDP2_ARG_CHECK(mesh_shape && coords && local_shape && offset && (shape || ndim == 0),
                    "shard layout: an argument is NULL");
    FSDP2_ARG_CHECK(mesh_ndim >= 1 && mesh_ndim <= FSDP2_MESH_MAX_DIMS,
                    "shard layout: mesh of %d dims (1..%d)", mesh_ndim, FSDP2_MESH_MAX_DIMS);
    FSDP2_CHECK(dtensor_check_placements(mesh_ndim, placements, ndim));
    for (int i = 0; i < mesh_ndim; i++)
        FSDP2_ARG_CHECK(mesh_shape[i] >= 1 && coords[i] >= 0 && coords[i] < mesh_shape[i],
                        "shard layout: coordinate %d is not in mesh dim %d of size %d", coords[i],
                        i, mesh_shape[i]);
    for (int d = 0; d < ndim; d++) {
        FSDP2_ARG_CHECK(shape[d] >= 0, "shard layout: size %lld of dim %d is negative",
                        (long long)shape[d], d);
        local_shape[d] = shape[d];
        offset[d] = 0;
    }
    /* In mesh-dim order, each Shard splits what the earlier mesh dims left. */
    for (int i = 0; i < mesh_ndim; i++) {
        if (placements[i].type != FSDP2_PLACEMENT_SHARD)
            continue;
        int d = placements[i].dim;
        int64_t start, length;
        FSDP2_CHECK(fsdp2_chunk_range(local_shape[d], mesh_shape[i], coords[i], &start, &length));
        offset[d] += start;
        local_shape[d] = length;
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_placements_format(int mesh_ndim, const fsdp2_placement_t *placements,
                                       char *buf, size_t len)
{
    FSDP2_ARG_CHECK(placements && buf && len > 0, "placements format: an argument is NULL");
    size_t used = 0;
    snprintf(buf, len, "[");
    used = strlen(buf);
    for (int i = 0; i < mesh_ndim && used < len; i++) {
        fsdp2_placement_t p = placements[i];
        char one[48];
        if (p.type == FSDP2_PLACEMENT_REPLICATE)
            snprintf(one, sizeof(one), "Replicate()");
        else if (p.type == FSDP2_PLACEMENT_SHARD)
            snprintf(one, sizeof(one), "Shard(dim=%d)", p.dim);
        else if (p.type == FSDP2_PLACEMENT_PARTIAL)
            snprintf(one, sizeof(one), "Partial(%s)", p.op == FSDP2_REDUCE_AVG ? "avg" : "sum");
        else
            snprintf(one, sizeof(one), "Invalid(%d)", (int)p.type);
        int n = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", one);
        used += n > 0 ? (size_t)n : 0;
    }
    if (used < len)
        snprintf(buf + used, len - used, "]");
    return FSDP2_SUCCESS;
}
