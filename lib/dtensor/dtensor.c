/* The DTensor object: construction without communication, queries, checks, random
 * init. Communication lives in redistribute.c and distribute.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/kernels.h>

#include "core/error.h"
#include "core/fault.h"
#include "dtensor/dtensor_internal.h"

fsdp2_status_t dtensor_mesh_geometry(const fsdp2_mesh_t *mesh, int *ndim, int *shape, int *coords)
{
    FSDP2_ARG_CHECK(mesh, "mesh is NULL");
    FSDP2_CHECK(fsdp2_mesh_ndim(mesh, ndim));
    for (int i = 0; i < *ndim; i++) {
        FSDP2_CHECK(fsdp2_mesh_size(mesh, i, &shape[i]));
        FSDP2_CHECK(fsdp2_mesh_coordinate(mesh, i, &coords[i]));
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t dtensor_stream(fsdp2_stream_t *stream, fsdp2_device_t device, fsdp2_stream_t **out)
{
    if (device.type == FSDP2_DEVICE_META)
        device.type = FSDP2_DEVICE_CPU;
    if (!stream)
        return fsdp2_stream_current(device, out);
    fsdp2_device_t sd;
    FSDP2_CHECK(fsdp2_stream_device(stream, &sd));
    if (sd.type != device.type || sd.index != device.index) {
        char a[FSDP2_DEVICE_NAME_MAX], b[FSDP2_DEVICE_NAME_MAX];
        fsdp2_device_format(sd, a, sizeof(a));
        fsdp2_device_format(device, b, sizeof(b));
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "dtensor: the stream is on %s but the data is on %s", a, b);
    }
    *out = stream;
    return FSDP2_SUCCESS;
}

/* Layout of a new DTensor from its arguments, into dt (local not set). */
static fsdp2_status_t init_layout(fsdp2_dtensor_t *dt, fsdp2_mesh_t *mesh,
                                  const fsdp2_placement_t *placements, int ndim,
                                  const int64_t *shape, int64_t *local_shape)
{
    FSDP2_CHECK(dtensor_mesh_geometry(mesh, &dt->mesh_ndim, dt->mesh_shape, dt->coords));
    FSDP2_ARG_CHECK(shape || ndim == 0, "dtensor: shape is NULL");
    FSDP2_CHECK(dtensor_check_placements(dt->mesh_ndim, placements, ndim));
    dt->mesh = mesh;
    dt->ndim = ndim;
    memcpy(dt->placements, placements, sizeof(*placements) * (size_t)dt->mesh_ndim);
    if (ndim)
        memcpy(dt->shape, shape, sizeof(*shape) * (size_t)ndim);
    return fsdp2_shard_layout(dt->mesh_ndim, dt->mesh_shape, dt->coords, placements, ndim, shape,
                              local_shape, dt->offset);
}

fsdp2_status_t dtensor_wrap_into(fsdp2_dtensor_t *dt, fsdp2_mesh_t *mesh,
                                 const fsdp2_placement_t *placements, int ndim,
                                 const int64_t *shape, fsdp2_tensor_t *local)
{
    FSDP2_ARG_CHECK(local, "dtensor: local tensor is NULL");
    int64_t local_shape[FSDP2_MAX_DIMS];
    FSDP2_CHECK(init_layout(dt, mesh, placements, ndim, shape, local_shape));
    FSDP2_CHECK(fsdp2_tensor_check(local, "dtensor local", local->dtype, ndim, local_shape));
    dt->dtype = local->dtype;
    dt->local = local;
    return FSDP2_SUCCESS;
}

fsdp2_status_t dtensor_wrap(fsdp2_mesh_t *mesh, const fsdp2_placement_t *placements, int ndim,
                            const int64_t *shape, fsdp2_tensor_t *local, fsdp2_dtensor_t **out)
{
    FSDP2_ARG_CHECK(local, "dtensor: local tensor is NULL");
    fsdp2_dtensor_t *dt = fsdp2_calloc(1, sizeof(*dt));
    if (!dt)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "dtensor");
    fsdp2_status_t status = dtensor_wrap_into(dt, mesh, placements, ndim, shape, local);
    if (status != FSDP2_SUCCESS) {
        free(dt);
        return status;
    }
    *out = dt;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t make(fsdp2_mesh_t *mesh, const fsdp2_placement_t *placements,
                           fsdp2_device_t device, fsdp2_dtype_t dtype, int ndim,
                           const int64_t *shape, int zero, fsdp2_dtensor_t **out)
{
    FSDP2_ARG_CHECK(out, "dtensor: out is NULL");
    *out = NULL;
    fsdp2_dtensor_t probe = {0};
    int64_t local_shape[FSDP2_MAX_DIMS];
    FSDP2_CHECK(init_layout(&probe, mesh, placements, ndim, shape, local_shape));
    fsdp2_tensor_t *local;
    if (zero)
        FSDP2_CHECK(fsdp2_tensor_zeros(device, dtype, ndim, local_shape, &local));
    else
        FSDP2_CHECK(fsdp2_tensor_empty(device, dtype, ndim, local_shape, &local));
    fsdp2_status_t status = dtensor_wrap(mesh, placements, ndim, shape, local, out);
    if (status != FSDP2_SUCCESS)
        fsdp2_tensor_release(local);
    return status;
}

fsdp2_status_t fsdp2_dtensor_empty(fsdp2_mesh_t *mesh, const fsdp2_placement_t *placements,
                                   fsdp2_device_t device, fsdp2_dtype_t dtype, int ndim,
                                   const int64_t *shape, fsdp2_dtensor_t **out)
{
    return make(mesh, placements, device, dtype, ndim, shape, 0, out);
}

fsdp2_status_t fsdp2_dtensor_zeros(fsdp2_mesh_t *mesh, const fsdp2_placement_t *placements,
                                   fsdp2_device_t device, fsdp2_dtype_t dtype, int ndim,
                                   const int64_t *shape, fsdp2_dtensor_t **out)
{
    return make(mesh, placements, device, dtype, ndim, shape, 1, out);
}

fsdp2_status_t fsdp2_dtensor_release(fsdp2_dtensor_t *dt)
{
    if (!dt)
        return FSDP2_SUCCESS;
    fsdp2_tensor_release(dt->local);
    free(dt);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_dtensor_info(const fsdp2_dtensor_t *dt, fsdp2_dtensor_info_t *info)
{
    FSDP2_ARG_CHECK(dt && info, "dtensor or info is NULL");
    memset(info, 0, sizeof(*info));
    info->ndim = dt->ndim;
    int64_t stride = 1;
    for (int d = dt->ndim - 1; d >= 0; d--) {
        info->shape[d] = dt->shape[d];
        info->stride[d] = stride;
        stride *= dt->shape[d];
        info->local_shape[d] = dt->local->shape[d];
        info->offset[d] = dt->offset[d];
    }
    info->empty = dt->local->numel == 0;
    info->dtype = dt->dtype;
    info->device = dt->local->device;
    info->mesh_ndim = dt->mesh_ndim;
    memcpy(info->placements, dt->placements, sizeof(dt->placements));
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_dtensor_mesh(const fsdp2_dtensor_t *dt, fsdp2_mesh_t **mesh)
{
    FSDP2_ARG_CHECK(dt && mesh, "dtensor or mesh is NULL");
    *mesh = dt->mesh;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_dtensor_to_local(const fsdp2_dtensor_t *dt, fsdp2_tensor_t **local)
{
    FSDP2_ARG_CHECK(dt && local, "dtensor or local is NULL");
    return fsdp2_tensor_retain(dt->local, local);
}

fsdp2_status_t fsdp2_dtensor_init_random(fsdp2_dtensor_t *dt, const fsdp2_random_init_t *init)
{
    FSDP2_ARG_CHECK(dt, "dtensor is NULL");
    /* Partial(sum): the value is the sum of the contributions, so one rank carries it. */
    int carrier = 1;
    for (int i = 0; i < dt->mesh_ndim; i++) {
        if (dt->placements[i].type == FSDP2_PLACEMENT_PARTIAL &&
            dt->placements[i].op == FSDP2_REDUCE_SUM && dt->coords[i] != 0)
            carrier = 0;
    }
    if (!carrier) {
        FSDP2_ARG_CHECK(init, "random init is NULL");
        if (dt->local->device.type == FSDP2_DEVICE_META || dt->local->numel == 0)
            return FSDP2_SUCCESS;
        fsdp2_stream_t *stream;
        FSDP2_CHECK(fsdp2_stream_current(dt->local->device, &stream));
        FSDP2_CHECK(fsdp2_fill_async(dt->local->data, dt->dtype, (size_t)dt->local->numel, 0.0,
                                     stream));
        return fsdp2_stream_synchronize(stream);
    }
    return fsdp2_random_fill(dt->local, init, dt->shape, dt->offset);
}

fsdp2_status_t fsdp2_dtensor_check(const fsdp2_dtensor_t *dt, const char *what,
                                   const fsdp2_mesh_t *mesh, const fsdp2_placement_t *placements,
                                   fsdp2_dtype_t dtype, int ndim, const int64_t *shape)
{
    FSDP2_ARG_CHECK(dt, "dtensor '%s' is NULL", what ? what : "?");
    if (!what)
        what = "dtensor";
    FSDP2_ARG_CHECK(!mesh || mesh == dt->mesh, "'%s' lives on mesh %p, not on mesh %p", what,
                    (void *)dt->mesh, (const void *)mesh);
    if (placements) {
        for (int i = 0; i < dt->mesh_ndim; i++) {
            if (dtensor_placement_equal(placements[i], dt->placements[i]))
                continue;
            char have[128], want[128];
            fsdp2_placements_format(dt->mesh_ndim, dt->placements, have, sizeof(have));
            fsdp2_placements_format(dt->mesh_ndim, placements, want, sizeof(want));
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "'%s': placements %s do not match %s", what, have, want);
        }
    }
    FSDP2_ARG_CHECK(dtype == dt->dtype, "'%s': dtype %s does not match %s", what,
                    fsdp2_dtype_name(dt->dtype), fsdp2_dtype_name(dtype));
    int same = ndim == dt->ndim && (ndim == 0 || (shape && !memcmp(shape, dt->shape,
                                                                    sizeof(*shape) * (size_t)ndim)));
    if (!same) {
        char have[160], want[160];
        fsdp2_shape_format(dt->ndim, dt->shape, have, sizeof(have));
        if (shape)
            fsdp2_shape_format(ndim, shape, want, sizeof(want));
        else
            snprintf(want, sizeof(want), "(NULL)");
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "'%s': global shape %s does not match %s",
                           what, have, want);
    }
    return FSDP2_SUCCESS;
}
