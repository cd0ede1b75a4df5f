/* torch.nn.utils.clip_grad_norm_ over the sharded gradients of a tree: each rank
 * reduces its own local shards (only the rows it holds, never the padding), one
 * collective per sharded mesh dim combines the ranks' shares, and each rank scales its
 * own shards.
 *
 * Why the shares are combined only over the mesh dims where the gradients are Shard:
 * along a Replicate dim (HSDP's replicas) every rank holds the same values, so
 * combining there would count them again. On the 1D meshes of fully_shard that is one
 * collective over dim 0.
 *
 * On cuda the shares are summed (or maxed) by kernels into the device's scratch double
 * (lib/cuda), combined there by the group's collectives on the current stream, read back
 * (the call is blocking, as on the cpu) and the gradients scaled by a kernel with the
 * cpu's arithmetic; only the order of the sum differs from the cpu's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp.h>
#include <fsdp2/optim.h>

#include "collectives/mesh_fail.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/trace_internal.h"
#include "fsdp/fsdp_internal.h"
#include "optim/optim_internal.h"
#include "core/cuda_loader.h"

/* The local gradient shards under a root, all on one mesh. The arrays are the FSDP
 * root's scratch (planned with it: no allocation inside a step); only a tree without a
 * planned root (nothing sharded, or a tree the plan refuses) allocates its own. */
typedef struct clip_set {
    size_t count;
    fsdp2_param_t **params;
    double *all;   /* one double per rank of a mesh dim (the inf-norm's all-gather) */
    int all_len;
    int owned;     /* params and grads were allocated here */
    fsdp2_device_t device; /* the first gradient's: all must be on it */
    fsdp2_tensor_t **grads; /* retained; count of them */
    fsdp2_mesh_t *mesh;     /* the first gradient's, NULL when there is none */
    char first_fqn[FSDP2_FQN_MAX];
    int mesh_ndim;
    fsdp2_placement_t placements[FSDP2_MESH_MAX_DIMS];
} clip_set_t;

static void clip_set_free(clip_set_t *set)
{
    for (size_t i = 0; set->grads && i < set->count; i++)
        fsdp2_tensor_release(set->grads[i]);
    if (set->owned) {
        free(set->grads);
        free(set->params);
        free(set->all);
    }
}

/* A double per rank of a mesh dim of ws ranks: the planned root's has room for its
 * largest dim; a tree without one allocates its own (before the dim's collective). */
static fsdp2_status_t scratch_for(clip_set_t *set, int ws)
{
    if (ws <= set->all_len)
        return FSDP2_SUCCESS;
    if (!set->owned)
        return fsdp2_error(FSDP2_ERR_INTERNAL, "clip_grad_norm: a mesh dim of %d ranks, "
                           "scratch for %d", ws, set->all_len);
    double *all = realloc(set->all, (size_t)ws * sizeof(*all));
    if (!all)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "clip_grad_norm: %d ranks", ws);
    set->all = all;
    set->all_len = ws;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t add_grad(clip_set_t *set, const fsdp2_param_t *p,
                               const fsdp2_param_info_t *info)
{
    fsdp2_dtensor_t *grad = NULL;
    FSDP2_CHECK(fsdp2_param_sharded_grad(p, &grad));
    if (!grad)
        return fsdp2_error(FSDP2_ERR_INTERNAL,
                           "clip_grad_norm: parameter '%s' has no sharded gradient", info->fqn);
    fsdp2_dtensor_info_t di;
    FSDP2_CHECK(optim_check_shard("clip_grad_norm", info->fqn, grad, 1, &di));
    fsdp2_mesh_t *mesh = NULL;
    FSDP2_CHECK(fsdp2_dtensor_mesh(grad, &mesh));
    if (set->mesh && (di.device.type != set->device.type || di.device.index != set->device.index))
        return fsdp2_error(FSDP2_ERR_DEVICE_MISMATCH,
                           "clip_grad_norm: parameter '%s' is on device type %d index %d, '%s' "
                           "on type %d index %d",
                           info->fqn, (int)di.device.type, di.device.index, set->first_fqn,
                           (int)set->device.type, set->device.index);
    if (!set->mesh) {
        set->mesh = mesh;
        set->device = di.device;
        set->mesh_ndim = di.mesh_ndim;
        memcpy(set->placements, di.placements, sizeof(set->placements));
        memcpy(set->first_fqn, info->fqn, sizeof(set->first_fqn));
    } else if (mesh != set->mesh) {
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "clip_grad_norm: parameter '%s' lives on another mesh than '%s'; "
                           "the norm is combined over one mesh",
                           info->fqn, set->first_fqn);
    }
    FSDP2_CHECK(fsdp2_dtensor_to_local(grad, &set->grads[set->count]));
    set->count++;
    return FSDP2_SUCCESS;
}

/* The scratch: the FSDP root's when root is part of a sharded tree. */
static fsdp2_status_t take_scratch(fsdp2_module_t *root, size_t count, clip_set_t *set)
{
    fsdp2_module_t *top = fsdp_root_module(root);
    fsdp_root_t *r = NULL;
    if (top && fsdp_root_get(top, &r) == FSDP2_SUCCESS && count <= r->clip.capacity) {
        set->params = r->clip.params;
        set->grads = r->clip.grads;
        set->all = r->clip.all;
        set->all_len = r->clip.all_len;
        return FSDP2_SUCCESS;
    }
    /* No planned root (a tree that cannot be planned, which add_grad then names): the
     * arrays are allocated here, before any collective. */
    set->owned = 1;
    set->params = calloc(count ? count : 1, sizeof(*set->params));
    set->grads = calloc(count ? count : 1, sizeof(*set->grads));
    if (!set->params || !set->grads)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "clip_grad_norm: %zu parameters", count);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t collect_grads(fsdp2_module_t *root, clip_set_t *set)
{
    size_t count = 0;
    FSDP2_CHECK(fsdp2_module_params(root, NULL, 0, &count));
    FSDP2_CHECK(take_scratch(root, count, set));
    FSDP2_CHECK(fsdp2_module_params(root, set->params, count, &count));
    for (size_t i = 0; i < count; i++) {
        fsdp2_param_info_t info;
        FSDP2_CHECK(fsdp2_param_info(set->params[i], &info));
        if (info.requires_grad && info.sharded)
            FSDP2_CHECK(add_grad(set, set->params[i], &info));
    }
    return FSDP2_SUCCESS;
}

/* max that keeps a NaN once seen, as torch's inf-norm does. */
static double nan_max(double a, double b)
{
    return (isnan(a) || a >= b) ? a : b;
}

/* This rank's share: the sum of squares (2-norm) or the largest |g| (inf-norm), over
 * chunks of FSDP2_PAR_CHUNK elements. The threads sum up to SHARE_BATCH chunks at a time,
 * each into its own partial, and the partials are added in order: the result does not
 * depend on the number of threads. */
#define SHARE_BATCH 256

/* A chunk's share in SHARE_LANES independent sums (element k in lane k % SHARE_LANES),
 * added in lane order at the end: the lanes run as one vector. */
#define SHARE_LANES 8

static double lanes_total(const double *lane, int inf)
{
    double share = 0.0;
    for (int j = 0; j < SHARE_LANES; j++)
        share = inf ? nan_max(share, lane[j]) : share + lane[j];
    return share;
}

static double chunk_f32(const float *g, int64_t n, int inf)
{
    double lane[SHARE_LANES] = {0};
    int64_t k = 0, full = n - n % SHARE_LANES;
    if (inf)
        for (; k < full; k += SHARE_LANES)
            for (int j = 0; j < SHARE_LANES; j++)
                lane[j] = nan_max(lane[j], fabs((double)g[k + j]));
    else
        for (; k < full; k += SHARE_LANES)
            for (int j = 0; j < SHARE_LANES; j++)
                lane[j] += (double)g[k + j] * g[k + j];
    for (int j = 0; k < n; k++, j++)
        lane[j] = inf ? nan_max(lane[j], fabs((double)g[k])) : lane[j] + (double)g[k] * g[k];
    return lanes_total(lane, inf);
}

static double chunk_f64(const double *g, int64_t n, int inf)
{
    double lane[SHARE_LANES] = {0};
    int64_t k = 0, full = n - n % SHARE_LANES;
    if (inf)
        for (; k < full; k += SHARE_LANES)
            for (int j = 0; j < SHARE_LANES; j++)
                lane[j] = nan_max(lane[j], fabs(g[k + j]));
    else
        for (; k < full; k += SHARE_LANES)
            for (int j = 0; j < SHARE_LANES; j++)
                lane[j] += g[k + j] * g[k + j];
    for (int j = 0; k < n; k++, j++)
        lane[j] = inf ? nan_max(lane[j], fabs(g[k])) : lane[j] + g[k] * g[k];
    return lanes_total(lane, inf);
}

static double tensor_share(const fsdp2_tensor_t *t, int inf, double share)
{
    const int64_t chunks = (t->numel + FSDP2_PAR_CHUNK - 1) / FSDP2_PAR_CHUNK;
    double part[SHARE_BATCH];
    for (int64_t c0 = 0; c0 < chunks; c0 += SHARE_BATCH) {
        int nc = (int)(chunks - c0 < SHARE_BATCH ? chunks - c0 : SHARE_BATCH);
        FSDP2_OMP("omp parallel for schedule(static) if(nc > 1)")
        for (int c = 0; c < nc; c++) {
            int64_t k0 = (c0 + c) * FSDP2_PAR_CHUNK;
            int64_t n = t->numel - k0 < FSDP2_PAR_CHUNK ? t->numel - k0 : FSDP2_PAR_CHUNK;
            part[c] = t->dtype == FSDP2_F32 ? chunk_f32((const float *)t->data + k0, n, inf)
                                            : chunk_f64((const double *)t->data + k0, n, inf);
        }
        for (int c = 0; c < nc; c++)
            share = inf ? nan_max(share, part[c]) : share + part[c];
    }
    return share;
}

static double local_share(const clip_set_t *set, int inf)
{
    double share = 0.0;
    for (size_t i = 0; i < set->count; i++)
        share = tensor_share(set->grads[i], inf, share);
    return share;
}

/* Combines *share over the ranks of one mesh dim's group, in place. */
static fsdp2_status_t combine(clip_set_t *set, fsdp2_group_t *group, int inf, double *share)
{
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *stream;
    FSDP2_CHECK(fsdp2_stream_current(cpu, &stream));
    if (!inf) {
        fsdp2_reduce_t sum = FSDP2_REDUCE_SUM_INIT;
        FSDP2_CHECK(fsdp2_all_reduce_async(group, share, 1, FSDP2_F64, &sum, stream));
        return fsdp2_stream_synchronize(stream);
    }
    int ws = 0;
    FSDP2_CHECK(fsdp2_group_size(group, &ws));
    FSDP2_CHECK(scratch_for(set, ws));
    double *all = set->all;
    fsdp2_status_t status = fsdp2_all_gather_async(group, share, all, 1, FSDP2_F64, stream);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_stream_synchronize(stream);
    if (status == FSDP2_SUCCESS) {
        double m = 0.0;
        for (int r = 0; r < ws; r++)
            m = nan_max(m, all[r]);
        *share = m;
    }
    return status;
}

/* global_norm on cuda: the share in scratch[0], a group's ws values after it for the
 * inf-norm's all-gather. */
static fsdp2_status_t cuda_global_norm(clip_set_t *set, int inf, double *norm)
{
    double *scratch, share = 0.0;
    fsdp2_stream_t *stream;
    const fsdp2_cuda_module_t *cuda = NULL;
    FSDP2_CHECK(fsdp2_cuda_module_get(&cuda));
    FSDP2_CHECK(cuda->scratch(set->device.index, &scratch));
    FSDP2_CHECK(fsdp2_stream_current(set->device, &stream));
    FSDP2_CHECK(cuda->norm_shares(set->device.index, set->grads, set->count, inf, scratch));
    for (int d = 0; d < set->mesh_ndim; d++) {
        if (set->placements[d].type != FSDP2_PLACEMENT_SHARD)
            continue;
        fsdp2_group_t *group = NULL;
        int ws = 0;
        FSDP2_CHECK(fsdp2_mesh_group(set->mesh, d, &group));
        FSDP2_CHECK(fsdp2_group_size(group, &ws));
        if (!inf) {
            fsdp2_reduce_t sum = FSDP2_REDUCE_SUM_INIT;
            FSDP2_CHECK(fsdp2_all_reduce_async(group, scratch, 1, FSDP2_F64, &sum, stream));
            continue;
        }
        if ((size_t)ws + 1 > FSDP2_CUDA_SCRATCH / sizeof(double))
            return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                               "clip_grad_norm: the inf-norm over %d ranks on cuda needs more "
                               "than the %zu-byte scratch",
                               ws, FSDP2_CUDA_SCRATCH);
        FSDP2_CHECK(scratch_for(set, ws));
        double *all = set->all;
        fsdp2_status_t status =
            fsdp2_all_gather_async(group, scratch, scratch + 1, 1, FSDP2_F64, stream);
        if (status == FSDP2_SUCCESS)
            status = fsdp2_memcpy_async(all, scratch + 1, (size_t)ws * sizeof(*all), stream);
        if (status == FSDP2_SUCCESS)
            status = fsdp2_stream_synchronize(stream);
        double m = 0.0;
        for (int r = 0; status == FSDP2_SUCCESS && r < ws; r++)
            m = nan_max(m, all[r]);
        FSDP2_CHECK(status);
        FSDP2_CHECK(fsdp2_memcpy_async(scratch, &m, sizeof(m), stream));
    }
    FSDP2_CHECK(fsdp2_memcpy_async(&share, scratch, sizeof(share), stream));
    FSDP2_CHECK(fsdp2_stream_synchronize(stream));
    *norm = inf ? share : sqrt(share);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t global_norm(clip_set_t *set, int inf, double *norm)
{
    if (set->device.type == FSDP2_DEVICE_CUDA)
        return cuda_global_norm(set, inf, norm);
    double share = local_share(set, inf);
    for (int d = 0; d < set->mesh_ndim; d++) {
        if (set->placements[d].type != FSDP2_PLACEMENT_SHARD)
            continue;
        fsdp2_group_t *group = NULL;
        FSDP2_CHECK(fsdp2_mesh_group(set->mesh, d, &group));
        FSDP2_CHECK(combine(set, group, inf, &share));
    }
    *norm = inf ? share : sqrt(share);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t scale(const clip_set_t *set, double coef)
{
    if (set->device.type == FSDP2_DEVICE_CUDA) {
        const fsdp2_cuda_module_t *cuda = NULL;
        FSDP2_CHECK(fsdp2_cuda_module_get(&cuda));
        return cuda->scale_all(set->device.index, set->grads, set->count, coef);
    }
    for (size_t i = 0; i < set->count; i++) {
        fsdp2_tensor_t *t = set->grads[i];
        const int64_t n = t->numel;
        if (t->dtype == FSDP2_F32) {
            float c = (float)coef, *g = t->data;
            FSDP2_OMP("omp parallel for schedule(static) if(n > FSDP2_PAR_CHUNK)")
            for (int64_t k = 0; k < n; k++)
                g[k] *= c;
        } else {
            double *g = t->data;
            FSDP2_OMP("omp parallel for schedule(static) if(n > FSDP2_PAR_CHUNK)")
            for (int64_t k = 0; k < n; k++)
                g[k] *= coef;
        }
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_clip_grad_norm(fsdp2_module_t *root, double max_norm, double norm_type,
                                    double *total_norm)
{
    FSDP2_ARG_CHECK(root, "clip_grad_norm: root is NULL");
    FSDP2_ARG_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm %g must be >= 0", max_norm);
    int inf = isinf(norm_type) && norm_type > 0;
    FSDP2_ARG_CHECK(inf || norm_type == 2.0,
                    "clip_grad_norm: norm_type %g is not 2.0 or INFINITY", norm_type);
    FSDP2_CHECK(fsdp_check_backward_closed(root, "clip_grad_norm"));
    clip_set_t set;
    memset(&set, 0, sizeof(set));
    double norm = 0.0;
    fsdp2_status_t status = FSDP2_SUCCESS;
    trace_token_t traced = TRACE_NO_TOKEN;
    if (fsdp2_tracing()) {
        trace_op_t op = TRACE_OP_INIT(TRACE_OPTIMIZER);
        op.name = "clip_grad_norm";
        op.module = "";
        traced = fsdp2_trace_host_begin(TRACE_TRACK_OPTIMIZER, NULL, &op);
    }
    FSDP2_CHECK_GOTO(collect_grads(root, &set), status, cleanup);
    /* Every rank has the same tree, so all agree on skipping when nothing is sharded. A
     * failure from here on leaves the peers in (or before) the norm's collectives: the
     * mesh's groups fail together. */
    if (set.mesh)
        FSDP2_CHECK_GOTO(fsdp2_mesh_fail(set.mesh, global_norm(&set, inf, &norm)), status,
                         cleanup);
    /* torch multiplies by clamp(coef, max=1): scaling only below 1 is the same numbers
     * (and a NaN norm makes NaN gradients there as here). */
    double coef = max_norm / (norm + 1e-6);
    if (!(coef >= 1.0))
        FSDP2_CHECK_GOTO(fsdp2_mesh_fail(set.mesh, scale(&set, coef)), status, cleanup);
    if (total_norm)
        *total_norm = norm;
cleanup:
    fsdp2_trace_host_end(traced);
    clip_set_free(&set);
    return status;
}
