/* Constructors that communicate: distribute (a full tensor split over the mesh) and a
 * checked from_local. Both agree across the whole mesh before moving data, so a rank
 * with a wrong shape makes every rank fail with an error instead of a hang. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "dtensor/dtensor_internal.h"

/* What every rank must agree on: ndim, dtype, shape, then placements (type, dim, op). */
#define SIG_LEN (2 + FSDP2_MAX_DIMS + 3 * FSDP2_MESH_MAX_DIMS)

static void signature(int64_t *sig, int ndim, fsdp2_dtype_t dtype, const int64_t *shape,
                      int mesh_ndim, const fsdp2_placement_t *placements)
{
    memset(sig, 0, sizeof(int64_t) * SIG_LEN);
    sig[0] = ndim;
    sig[1] = dtype;
    for (int d = 0; d < ndim; d++)
        sig[2 + d] = shape[d];
    for (int i = 0; placements && i < mesh_ndim; i++) {
        int64_t *p = sig + 2 + FSDP2_MAX_DIMS + 3 * i;
        p[0] = placements[i].type;
        p[1] = placements[i].type == FSDP2_PLACEMENT_SHARD ? placements[i].dim : 0;
        p[2] = placements[i].type == FSDP2_PLACEMENT_PARTIAL ? placements[i].op : 0;
    }
}

/* Broadcast over the whole mesh from global rank src: along mesh dim 0 among the ranks
 * that share src's last coordinate, then along the last dim. Enqueued on stream. */
static fsdp2_status_t mesh_broadcast(fsdp2_mesh_t *mesh, void *buf, size_t count,
                                     fsdp2_dtype_t dtype, int src, fsdp2_stream_t *stream)
{
    int ndim, shape[FSDP2_MESH_MAX_DIMS], coords[FSDP2_MESH_MAX_DIMS];
    FSDP2_CHECK(dtensor_mesh_geometry(mesh, &ndim, shape, coords));
    int src_coords[FSDP2_MESH_MAX_DIMS] = {src, 0};
    if (ndim == 2) {
        src_coords[0] = src / shape[1];
        src_coords[1] = src % shape[1];
    }
    fsdp2_group_t *g;
    if (ndim == 1 || coords[1] == src_coords[1]) {
        FSDP2_CHECK(fsdp2_mesh_group(mesh, 0, &g));
        FSDP2_CHECK(fsdp2_broadcast_async(g, buf, count, dtype, src_coords[0], stream));
    }
    if (ndim == 2) {
        FSDP2_CHECK(fsdp2_mesh_group(mesh, 1, &g));
        FSDP2_CHECK(fsdp2_broadcast_async(g, buf, count, dtype, src_coords[1], stream));
    }
    return FSDP2_SUCCESS;
}

/* How many ranks of the mesh passed ok == 0, in *failed (every rank gets the count). */
static fsdp2_status_t mesh_count_failed(fsdp2_mesh_t *mesh, int ok, fsdp2_stream_t *stream,
                                        int *failed)
{
    int ndim;
    FSDP2_CHECK(fsdp2_mesh_ndim(mesh, &ndim));
    double count = ok ? 0.0 : 1.0;
    for (int i = ndim - 1; i >= 0; i--) {
        fsdp2_group_t *g;
        FSDP2_CHECK(fsdp2_mesh_group(mesh, i, &g));
        FSDP2_CHECK(fsdp2_all_reduce_async(g, &count, 1, FSDP2_F64, NULL, stream));
    }
    FSDP2_CHECK(fsdp2_stream_synchronize(stream));
    *failed = (int)count;
    return FSDP2_SUCCESS;
}

/* Compares this rank's signature with src's, collectively; on any mismatch, or when a
 * rank brings a local error (ok), every rank fails: a rank with its own error returns
 * it, one that differs names both values, the others say how many disagreed. */
static fsdp2_status_t agree(fsdp2_mesh_t *mesh, const int64_t *mine, int src, const char *what,
                            fsdp2_status_t ok, fsdp2_stream_t *stream)
{
    int64_t theirs[SIG_LEN];
    memcpy(theirs, mine, sizeof(theirs));
    FSDP2_CHECK(mesh_broadcast(mesh, theirs, SIG_LEN, FSDP2_I64, src, stream));
    FSDP2_CHECK(fsdp2_stream_synchronize(stream));
    int same = !memcmp(theirs, mine, sizeof(theirs));
    char local_error[512] = "";
    if (ok != FSDP2_SUCCESS)
        snprintf(local_error, sizeof(local_error), "%s", fsdp2_last_error());
    int failed;
    FSDP2_CHECK(mesh_count_failed(mesh, ok == FSDP2_SUCCESS && same, stream, &failed));
    if (!failed)
        return FSDP2_SUCCESS;
    if (ok != FSDP2_SUCCESS)
        return fsdp2_error(ok, "%s", local_error);
    if (!same) {
        char a[160], b[160];
        fsdp2_shape_format((int)mine[0], mine + 2, a, sizeof(a));
        fsdp2_shape_format((int)theirs[0], theirs + 2, b, sizeof(b));
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "%s: this rank has shape %s dtype %s (placements code %lld,%lld), "
                           "rank %d has shape %s dtype %s (%lld,%lld)",
                           what, a, fsdp2_dtype_name((fsdp2_dtype_t)mine[1]),
                           (long long)mine[2 + FSDP2_MAX_DIMS], (long long)mine[3 + FSDP2_MAX_DIMS],
                           src, b, fsdp2_dtype_name((fsdp2_dtype_t)theirs[1]),
                           (long long)theirs[2 + FSDP2_MAX_DIMS],
                           (long long)theirs[3 + FSDP2_MAX_DIMS]);
    }
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                       "%s: %d rank(s) of the mesh disagree (their errors name the values)", what,
                       failed);
}

fsdp2_status_t fsdp2_dtensor_from_local(fsdp2_tensor_t *local, fsdp2_mesh_t *mesh,
                                        const fsdp2_placement_t *placements, int ndim,
                                        const int64_t *shape, int verify, fsdp2_stream_t *stream,
                                        fsdp2_dtensor_t **out)
{
    FSDP2_ARG_CHECK(out, "from_local: out is NULL");
    *out = NULL;
    FSDP2_ARG_CHECK(local && mesh && placements && (shape || ndim == 0),
                    "from_local: local, mesh, placements or shape is NULL");
    FSDP2_ARG_CHECK(ndim >= 0 && ndim <= FSDP2_MAX_DIMS, "from_local: ndim %d is not in 0..%d",
                    ndim, FSDP2_MAX_DIMS);
    fsdp2_tensor_t *mine;
    FSDP2_CHECK(fsdp2_tensor_retain(local, &mine));
    fsdp2_status_t status = dtensor_wrap(mesh, placements, ndim, shape, mine, out);
    if (verify) {
        int mesh_ndim;
        fsdp2_stream_t *s = NULL;
        fsdp2_status_t setup = fsdp2_mesh_ndim(mesh, &mesh_ndim);
        if (setup == FSDP2_SUCCESS)
            setup = dtensor_stream(stream, local->device, &s);
        if (setup != FSDP2_SUCCESS) {
            status = setup;
        } else {
            int64_t sig[SIG_LEN];
            signature(sig, ndim, local->dtype, shape, mesh_ndim, placements);
            fsdp2_status_t agreed = agree(mesh, sig, 0, "from_local", status, s);
            if (status == FSDP2_SUCCESS)
                status = agreed;
        }
    }
    if (status != FSDP2_SUCCESS) {
        if (*out)
            fsdp2_dtensor_release(*out);
        else
            fsdp2_tensor_release(mine);
        *out = NULL;
    }
    return status;
}

/* The device the result of distribute lives on. */
static fsdp2_device_t output_device(const fsdp2_tensor_t *full, fsdp2_stream_t *stream)
{
    fsdp2_device_t d = full->device;
    if (stream)
        fsdp2_stream_device(stream, &d);
    else if (d.type == FSDP2_DEVICE_META)
        d.type = FSDP2_DEVICE_CPU;
    return d;
}

fsdp2_status_t fsdp2_dtensor_distribute(const fsdp2_tensor_t *full, fsdp2_mesh_t *mesh,
                                        const fsdp2_placement_t *placements, int src_rank,
                                        fsdp2_stream_t *stream, fsdp2_dtensor_t **out)
{
    FSDP2_ARG_CHECK(out, "distribute: out is NULL");
    *out = NULL;
    FSDP2_ARG_CHECK(full && mesh && placements, "distribute: full, mesh or placements is NULL");
    int mesh_ndim, mesh_shape[FSDP2_MESH_MAX_DIMS], coords[FSDP2_MESH_MAX_DIMS];
    FSDP2_CHECK(dtensor_mesh_geometry(mesh, &mesh_ndim, mesh_shape, coords));
    int world = mesh_ndim == 2 ? mesh_shape[0] * mesh_shape[1] : mesh_shape[0];
    int rank = mesh_ndim == 2 ? coords[0] * mesh_shape[1] + coords[1] : coords[0];
    FSDP2_ARG_CHECK(src_rank == FSDP2_DISTRIBUTE_ALL || (src_rank >= 0 && src_rank < world),
                    "distribute: source rank %d is not in 0..%d or FSDP2_DISTRIBUTE_ALL",
                    src_rank, world - 1);
    /* Every rank-local problem becomes this rank's share of the agreement below, so the
     * others fail with it instead of waiting for this rank until the timeout. */
    fsdp2_status_t ok = dtensor_check_placements(mesh_ndim, placements, full->ndim);
    fsdp2_device_t device = output_device(full, stream);
    fsdp2_stream_t *s = NULL;
    fsdp2_status_t got_stream = dtensor_stream(stream, device, &s);
    if (got_stream != FSDP2_SUCCESS) {
        fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
        if (ok == FSDP2_SUCCESS)
            ok = got_stream;
        FSDP2_CHECK(fsdp2_stream_current(cpu, &s));
    }
    int holds_values = src_rank == FSDP2_DISTRIBUTE_ALL || src_rank == rank;
    /* A rank whose values are used must have them where the result goes. */
    if (ok == FSDP2_SUCCESS && holds_values &&
        (full->device.type != device.type || full->device.index != device.index)) {
        char a[FSDP2_DEVICE_NAME_MAX], b[FSDP2_DEVICE_NAME_MAX];
        fsdp2_device_format(full->device, a, sizeof(a));
        fsdp2_device_format(device, b, sizeof(b));
        ok = fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                         "distribute: rank %d's full tensor is on %s but the stream is on %s", rank,
                         a, b);
    }
    fsdp2_tensor_t *whole = NULL;
    if (ok == FSDP2_SUCCESS)
        ok = holds_values ? fsdp2_tensor_retain(full, &whole)
                          : fsdp2_tensor_empty(device, full->dtype, full->ndim, full->shape, &whole);
    int64_t sig[SIG_LEN];
    signature(sig, full->ndim, full->dtype, full->shape, mesh_ndim, placements);
    fsdp2_status_t agreed = agree(mesh, sig, src_rank == FSDP2_DISTRIBUTE_ALL ? 0 : src_rank,
                                  "distribute", ok, s);
    if (agreed != FSDP2_SUCCESS) {
        fsdp2_tensor_release(whole);
        return agreed;
    }

    fsdp2_status_t status = FSDP2_SUCCESS;
    if (src_rank != FSDP2_DISTRIBUTE_ALL && device.type != FSDP2_DEVICE_META) {
        status = mesh_broadcast(mesh, whole->data, (size_t)whole->numel, whole->dtype, src_rank, s);
        fsdp2_status_t synced = fsdp2_stream_synchronize(s);
        if (status == FSDP2_SUCCESS)
            status = synced;
    }
    fsdp2_placement_t replicate[FSDP2_MESH_MAX_DIMS];
    for (int i = 0; i < FSDP2_MESH_MAX_DIMS; i++)
        replicate[i] = (fsdp2_placement_t)FSDP2_REPLICATE_INIT;
    fsdp2_dtensor_t *replicated = NULL, *result = NULL;
    if (status == FSDP2_SUCCESS)
        status = dtensor_wrap(mesh, replicate, full->ndim, full->shape, whole, &replicated);
    else
        fsdp2_tensor_release(whole);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_dtensor_redistribute(replicated, placements, s, &result);
    /* The result must never alias the caller's tensor. */
    if (status == FSDP2_SUCCESS && result->local->storage == full->storage &&
        device.type != FSDP2_DEVICE_META) {
        fsdp2_tensor_t *copy;
        status = dtensor_copy_tensor(result->local, s, &copy);
        if (status == FSDP2_SUCCESS) {
            fsdp2_tensor_release(result->local);
            result->local = copy;
        }
    }
    fsdp2_dtensor_release(replicated);
    if (status != FSDP2_SUCCESS) {
        fsdp2_dtensor_release(result);
        return status;
    }
    *out = result;
    return FSDP2_SUCCESS;
}
