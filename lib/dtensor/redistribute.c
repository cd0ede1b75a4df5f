/* Redistribution: one mesh dim at a time, each step a collective over that dim's group
 * (or a local slice), ending with a synchronized stream so its temporaries can go. A dry
 * run on shapes alone checks the plan and lists the tensors it makes; they are allocated
 * together before the first collective (all or nothing), each freed after its step.
 *
 * Order matters when two mesh dims shard the same tensor dim: the inner piece (later
 * mesh dim) is a chunk of the outer one, so gathering the outer dim first would gather
 * pieces of pieces. So every dim that must be unsharded is gathered from the last mesh
 * dim to the first (phase 1, which also reduces Partial dims), then new shards are
 * sliced from the first mesh dim to the last (phase 2). A Shard(d) that stays but sits
 * inside a mesh dim whose Shard(d) changes is gathered and sliced again; a Partial
 * becomes a Shard(d) by reduce-scatter only when that keeps the outer-first order,
 * otherwise by all-reduce and a phase 2 slice. */
#include <stdlib.h>
#include <string.h>

#include <fsdp2/kernels.h>

#include "collectives/mesh_fail.h"
#include "core/error.h"
#include "core/fault.h"
#include "dtensor/dtensor_internal.h"

/* The tensors a plan makes: at most three per step, at most two steps per mesh dim. */
#define PLAN_MAX_TENSORS (6 * FSDP2_MESH_MAX_DIMS)

typedef struct plan {
    fsdp2_mesh_t *mesh;
    int mesh_ndim;
    int mesh_shape[FSDP2_MESH_MAX_DIMS];
    int coords[FSDP2_MESH_MAX_DIMS];
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
    fsdp2_dtype_t dtype;
    size_t elem;
    fsdp2_device_t device;
    fsdp2_stream_t *stream;
    fsdp2_placement_t cur[FSDP2_MESH_MAX_DIMS];
    fsdp2_tensor_t *local; /* owned */
    /* The dry run (dry) records the shape of every tensor the plan makes, in order, and
     * makes meta tensors instead; the real run then takes them, allocated beforehand
     * (made[taken++]), so that nothing is allocated once the first collective started. */
    int dry;
    int planned; /* a dry run listed the tensors: the real run makes no others */
    int count, taken;
    int ndims[PLAN_MAX_TENSORS];
    int64_t shapes[PLAN_MAX_TENSORS][FSDP2_MAX_DIMS];
    fsdp2_tensor_t *made[PLAN_MAX_TENSORS]; /* owned until taken */
} plan_t;

/* The pieces of tensor dim d along mesh dim i, seen from a parent of shape P (the data
 * before mesh dim i splits it): outer x n x inner elements, chunk rows per rank. */
typedef struct pieces {
    int k;
    int64_t n, chunk, outer, inner, block; /* block = outer * chunk * inner elements */
    int even;                               /* n == k * chunk and outer == 1: no padding */
} pieces_t;

static pieces_t pieces_of(const plan_t *p, const int64_t *parent, int i, int d)
{
    pieces_t q = {.k = p->mesh_shape[i], .n = parent[d], .outer = 1, .inner = 1};
    for (int j = 0; j < d; j++)
        q.outer *= parent[j];
    for (int j = d + 1; j < p->ndim; j++)
        q.inner *= parent[j];
    q.chunk = q.n / q.k + (q.n % q.k != 0);
    q.block = q.outer * q.chunk * q.inner;
    q.even = q.n == q.chunk * q.k && q.outer == 1;
    return q;
}

static char *at(const fsdp2_tensor_t *t, int64_t elements, size_t elem)
{
    return (char *)t->data + (size_t)elements * elem;
}

static fsdp2_status_t layout(const plan_t *p, const fsdp2_placement_t *placements, int64_t *shape)
{
    int64_t offset[FSDP2_MAX_DIMS];
    return fsdp2_shard_layout(p->mesh_ndim, p->mesh_shape, p->coords, placements, p->ndim,
                              p->shape, shape, offset);
}

static fsdp2_status_t new_tensor(plan_t *p, int ndim, const int64_t *shape, fsdp2_tensor_t **t)
{
    *t = NULL;
    if (p->dry) {
        if (p->count == PLAN_MAX_TENSORS)
            return fsdp2_error(FSDP2_ERR_INTERNAL, "redistribute: more than %d tensors",
                               PLAN_MAX_TENSORS);
        p->ndims[p->count] = ndim;
        memcpy(p->shapes[p->count], shape, sizeof(int64_t) * (size_t)ndim);
        p->count++;
        fsdp2_device_t meta = FSDP2_DEVICE_META_INIT;
        return fsdp2_tensor_empty(meta, p->dtype, ndim, shape, t);
    }
    if (p->planned && p->taken == p->count)
        return fsdp2_error(FSDP2_ERR_INTERNAL, "redistribute: the plan makes more tensors "
                           "than its dry run's %d", p->count);
    if (p->taken < p->count) {
        fsdp2_tensor_t *made = p->made[p->taken];
        if (made->ndim != ndim || memcmp(made->shape, shape, sizeof(int64_t) * (size_t)ndim))
            return fsdp2_error(FSDP2_ERR_INTERNAL, "redistribute: tensor %d of the plan has "
                               "another shape than its dry run's", p->taken);
        p->made[p->taken++] = NULL;
        *t = made;
        return FSDP2_SUCCESS;
    }
    return fsdp2_tensor_empty(p->device, p->dtype, ndim, shape, t);
}

/* The dry run's part of a step's temporaries: the padded send and receive buffers of an
 * uneven all-gather (send one piece, receive all) or reduce-scatter (the reverse). */
static fsdp2_status_t dry_temporaries(plan_t *p, const pieces_t *q, int gather)
{
    if (!p->dry || q->even)
        return FSDP2_SUCCESS;
    int64_t one = q->block, all = q->block * q->k;
    fsdp2_tensor_t *t;
    FSDP2_CHECK(new_tensor(p, 1, gather ? &one : &all, &t));
    fsdp2_tensor_release(t);
    FSDP2_CHECK(new_tensor(p, 1, gather ? &all : &one, &t));
    fsdp2_tensor_release(t);
    return FSDP2_SUCCESS;
}

/* rows x cols elements between two buffers with row strides (all in elements). */
static fsdp2_status_t copy2d(const plan_t *p, void *dst, int64_t dst_stride, const void *src,
                             int64_t src_stride, int64_t rows, int64_t cols)
{
    fsdp2_chunk_copy_t c = {.dst = dst, .dst_dtype = p->dtype, .dst_stride = (size_t)dst_stride,
                            .src = src, .src_dtype = p->dtype, .src_stride = (size_t)src_stride,
                            .rows = (size_t)rows, .cols = (size_t)cols};
    return fsdp2_chunk_copy_async(&c, p->stream);
}

/* Replaces the plan's local tensor once the stream has run the step that made next.
 * Temporaries (tmp[0..2)) go too; on failure next is dropped instead. */
static fsdp2_status_t finish_step(plan_t *p, fsdp2_status_t status, fsdp2_tensor_t *next,
                                  fsdp2_tensor_t *tmp0, fsdp2_tensor_t *tmp1)
{
    fsdp2_status_t synced = p->dry ? FSDP2_SUCCESS : fsdp2_stream_synchronize(p->stream);
    if (status == FSDP2_SUCCESS)
        status = synced;
    fsdp2_tensor_release(tmp0);
    fsdp2_tensor_release(tmp1);
    if (status != FSDP2_SUCCESS) {
        fsdp2_tensor_release(next);
        return status;
    }
    fsdp2_tensor_release(p->local);
    p->local = next;
    return FSDP2_SUCCESS;
}

static int is_meta(const plan_t *p)
{
    return p->device.type == FSDP2_DEVICE_META;
}

static fsdp2_status_t group_of(const plan_t *p, int i, fsdp2_group_t **g)
{
    return fsdp2_mesh_group(p->mesh, i, g);
}

/* Shard(d) -> Replicate on mesh dim i: all-gather the padded pieces. */
static fsdp2_status_t step_gather(plan_t *p, int i)
{
    int d = p->cur[i].dim;
    fsdp2_placement_t after[FSDP2_MESH_MAX_DIMS];
    memcpy(after, p->cur, sizeof(after));
    after[i] = (fsdp2_placement_t)FSDP2_REPLICATE_INIT;
    int64_t parent[FSDP2_MAX_DIMS];
    FSDP2_CHECK(layout(p, after, parent));
    fsdp2_tensor_t *next = NULL, *send = NULL, *recv = NULL;
    FSDP2_CHECK(new_tensor(p, p->ndim, parent, &next));
    p->cur[i] = after[i];
    pieces_t q = pieces_of(p, parent, i, d);
    if (is_meta(p) || p->dry)
        return finish_step(p, dry_temporaries(p, &q, 1), next, NULL, NULL);
    fsdp2_group_t *g;
    fsdp2_status_t status = FSDP2_SUCCESS;
    FSDP2_CHECK_GOTO(group_of(p, i, &g), status, done);
    if (q.even) {
        FSDP2_CHECK_GOTO(fsdp2_all_gather_async(g, p->local->data, next->data, (size_t)q.block,
                                                p->dtype, p->stream),
                         status, done);
        goto done;
    }
    int64_t one = q.block, all = q.block * q.k;
    FSDP2_CHECK_GOTO(new_tensor(p, 1, &one, &send), status, done);
    FSDP2_CHECK_GOTO(new_tensor(p, 1, &all, &recv), status, done);
    int64_t mine = p->local->shape[d];
    if (mine < q.chunk) /* padding is never read back, but keep it deterministic */
        FSDP2_CHECK_GOTO(fsdp2_fill_async(send->data, p->dtype, (size_t)one, 0.0, p->stream),
                         status, done);
    FSDP2_CHECK_GOTO(copy2d(p, send->data, q.chunk * q.inner, p->local->data, mine * q.inner,
                            q.outer, mine * q.inner),
                     status, done);
    FSDP2_CHECK_GOTO(fsdp2_all_gather_async(g, send->data, recv->data, (size_t)one, p->dtype,
                                            p->stream),
                     status, done);
    for (int r = 0; r < q.k; r++) {
        int64_t off, len;
        fsdp2_chunk_range(q.n, q.k, r, &off, &len);
        FSDP2_CHECK_GOTO(copy2d(p, at(next, off * q.inner, p->elem), q.n * q.inner,
                                at(recv, r * q.block, p->elem), q.chunk * q.inner, q.outer,
                                len * q.inner),
                         status, done);
    }
done:
    return finish_step(p, status, next, send, recv);
}

static fsdp2_status_t check_reducible(const plan_t *p, int i)
{
    int is_float = 0;
    fsdp2_dtype_is_float(p->dtype, &is_float);
    if (is_float)
        return FSDP2_SUCCESS;
    char pl[128];
    fsdp2_placements_format(p->mesh_ndim, p->cur, pl, sizeof(pl));
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                       "redistribute: reducing the Partial mesh dim %d of %s needs a floating "
                       "dtype, not %s",
                       i, pl, fsdp2_dtype_name(p->dtype));
}

/* Partial -> Replicate on mesh dim i: all-reduce a copy. */
static fsdp2_status_t step_all_reduce(plan_t *p, int i)
{
    FSDP2_CHECK(check_reducible(p, i));
    fsdp2_reduce_t reduce = {p->cur[i].op, 1.0, 1.0};
    fsdp2_tensor_t *next = NULL;
    FSDP2_CHECK(new_tensor(p, p->ndim, p->local->shape, &next));
    p->cur[i] = (fsdp2_placement_t)FSDP2_REPLICATE_INIT;
    if (is_meta(p) || p->dry)
        return finish_step(p, FSDP2_SUCCESS, next, NULL, NULL);
    fsdp2_group_t *g;
    fsdp2_status_t status = FSDP2_SUCCESS;
    FSDP2_CHECK_GOTO(group_of(p, i, &g), status, done);
    FSDP2_CHECK_GOTO(fsdp2_memcpy_async(next->data, p->local->data, p->local->nbytes, p->stream),
                     status, done);
    FSDP2_CHECK_GOTO(fsdp2_all_reduce_async(g, next->data, (size_t)next->numel, p->dtype, &reduce,
                                            p->stream),
                     status, done);
done:
    return finish_step(p, status, next, NULL, NULL);
}

/* Partial -> Shard(d) on mesh dim i: reduce-scatter the padded pieces. */
static fsdp2_status_t step_reduce_scatter(plan_t *p, int i, int d)
{
    FSDP2_CHECK(check_reducible(p, i));
    fsdp2_reduce_t reduce = {p->cur[i].op, 1.0, 1.0};
    fsdp2_placement_t after[FSDP2_MESH_MAX_DIMS];
    memcpy(after, p->cur, sizeof(after));
    after[i] = (fsdp2_placement_t)FSDP2_SHARD_INIT(d);
    int64_t mine_shape[FSDP2_MAX_DIMS];
    FSDP2_CHECK(layout(p, after, mine_shape));
    fsdp2_tensor_t *next = NULL, *send = NULL, *recv = NULL;
    FSDP2_CHECK(new_tensor(p, p->ndim, mine_shape, &next));
    p->cur[i] = after[i];
    pieces_t q = pieces_of(p, p->local->shape, i, d);
    if (is_meta(p) || p->dry)
        return finish_step(p, dry_temporaries(p, &q, 0), next, NULL, NULL);
    fsdp2_group_t *g;
    fsdp2_status_t status = FSDP2_SUCCESS;
    FSDP2_CHECK_GOTO(group_of(p, i, &g), status, done);
    if (q.even) {
        FSDP2_CHECK_GOTO(fsdp2_reduce_scatter_async(g, p->local->data, next->data,
                                                    (size_t)q.block, p->dtype, &reduce, p->stream),
                         status, done);
        goto done;
    }
    int64_t one = q.block, all = q.block * q.k;
    FSDP2_CHECK_GOTO(new_tensor(p, 1, &all, &send), status, done);
    FSDP2_CHECK_GOTO(new_tensor(p, 1, &one, &recv), status, done);
    if (q.n < q.chunk * q.k)
        FSDP2_CHECK_GOTO(fsdp2_fill_async(send->data, p->dtype, (size_t)all, 0.0, p->stream),
                         status, done);
    for (int r = 0; r < q.k; r++) {
        int64_t off, len;
        fsdp2_chunk_range(q.n, q.k, r, &off, &len);
        FSDP2_CHECK_GOTO(copy2d(p, at(send, r * q.block, p->elem), q.chunk * q.inner,
                                at(p->local, off * q.inner, p->elem), q.n * q.inner, q.outer,
                                len * q.inner),
                         status, done);
    }
    FSDP2_CHECK_GOTO(fsdp2_reduce_scatter_async(g, send->data, recv->data, (size_t)one, p->dtype,
                                                &reduce, p->stream),
                     status, done);
    int64_t mine = mine_shape[d];
    FSDP2_CHECK_GOTO(copy2d(p, next->data, mine * q.inner, recv->data, q.chunk * q.inner,
                            q.outer, mine * q.inner),
                     status, done);
done:
    return finish_step(p, status, next, send, recv);
}

/* Replicate -> Shard(d) on mesh dim i: keep this rank's chunk. */
static fsdp2_status_t step_slice(plan_t *p, int i, int d)
{
    fsdp2_placement_t after[FSDP2_MESH_MAX_DIMS];
    memcpy(after, p->cur, sizeof(after));
    after[i] = (fsdp2_placement_t)FSDP2_SHARD_INIT(d);
    int64_t mine_shape[FSDP2_MAX_DIMS];
    FSDP2_CHECK(layout(p, after, mine_shape));
    fsdp2_tensor_t *next = NULL;
    FSDP2_CHECK(new_tensor(p, p->ndim, mine_shape, &next));
    p->cur[i] = after[i];
    if (is_meta(p) || p->dry)
        return finish_step(p, FSDP2_SUCCESS, next, NULL, NULL);
    pieces_t q = pieces_of(p, p->local->shape, i, d);
    int64_t off, len;
    fsdp2_chunk_range(q.n, q.k, p->coords[i], &off, &len);
    fsdp2_status_t status = copy2d(p, next->data, len * q.inner, at(p->local, off * q.inner, p->elem),
                                   q.n * q.inner, q.outer, len * q.inner);
    return finish_step(p, status, next, NULL, NULL);
}

/* Replicate -> Partial on mesh dim i: a sum is carried by coordinate 0 alone (exact, so
 * reducing again gives the same bits); every rank's value is already the average. */
static fsdp2_status_t step_partition(plan_t *p, int i, fsdp2_reduce_op_t op)
{
    fsdp2_tensor_t *next = NULL;
    FSDP2_CHECK(new_tensor(p, p->ndim, p->local->shape, &next));
    p->cur[i] = (fsdp2_placement_t){FSDP2_PLACEMENT_PARTIAL, 0, op};
    if (is_meta(p) || p->dry)
        return finish_step(p, FSDP2_SUCCESS, next, NULL, NULL);
    fsdp2_status_t status;
    if (op == FSDP2_REDUCE_SUM && p->coords[i] != 0)
        status = fsdp2_fill_async(next->data, p->dtype, (size_t)next->numel, 0.0, p->stream);
    else
        status = fsdp2_memcpy_async(next->data, p->local->data, p->local->nbytes, p->stream);
    return finish_step(p, status, next, NULL, NULL);
}

static int shards_dim_after(const fsdp2_placement_t *pl, int mesh_ndim, int i, int d)
{
    for (int j = i + 1; j < mesh_ndim; j++) {
        if (pl[j].type == FSDP2_PLACEMENT_SHARD && pl[j].dim == d)
            return 1;
    }
    return 0;
}

/* Whether a mesh dim before i changes how it splits tensor dim d: then a split of d at
 * i must wait for phase 2, since an outer dim must split before an inner one and be
 * gathered after it. */
static int outer_split_changes(const plan_t *p, const fsdp2_placement_t *dst, int i, int d)
{
    for (int j = 0; j < i; j++) {
        if (dtensor_placement_equal(p->cur[j], dst[j]))
            continue;
        if ((p->cur[j].type == FSDP2_PLACEMENT_SHARD && p->cur[j].dim == d) ||
            (dst[j].type == FSDP2_PLACEMENT_SHARD && dst[j].dim == d))
            return 1;
    }
    return 0;
}

/* Which mesh dims phase 1 must gather (see the top of the file). */
static void gather_set(const plan_t *p, const fsdp2_placement_t *dst, int *gather)
{
    const fsdp2_placement_t *cur = p->cur;
    for (int i = 0; i < p->mesh_ndim; i++)
        gather[i] = cur[i].type == FSDP2_PLACEMENT_SHARD && !dtensor_placement_equal(cur[i], dst[i]);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < p->mesh_ndim; i++) {
            /* The tensor dims whose split at mesh dim i changes: the one it stops
             * splitting and the one it starts splitting. */
            int dims[2] = {gather[i] ? cur[i].dim : -1, -1};
            if (dst[i].type == FSDP2_PLACEMENT_SHARD && !dtensor_placement_equal(cur[i], dst[i]))
                dims[1] = dst[i].dim;
            for (int j = i + 1; j < p->mesh_ndim; j++) {
                if (gather[j] || cur[j].type != FSDP2_PLACEMENT_SHARD)
                    continue;
                if (cur[j].dim == dims[0] || cur[j].dim == dims[1]) {
                    gather[j] = 1;
                    changed = 1;
                }
            }
        }
    }
}

static fsdp2_status_t run_plan(plan_t *p, const fsdp2_placement_t *dst)
{
    int gather[FSDP2_MESH_MAX_DIMS];
    gather_set(p, dst, gather);
    for (int i = p->mesh_ndim - 1; i >= 0; i--) {
        if (gather[i]) {
            FSDP2_CHECK(step_gather(p, i));
        } else if (p->cur[i].type == FSDP2_PLACEMENT_PARTIAL &&
                   !dtensor_placement_equal(p->cur[i], dst[i])) {
            if (dst[i].type == FSDP2_PLACEMENT_SHARD &&
                !shards_dim_after(p->cur, p->mesh_ndim, i, dst[i].dim) &&
                !outer_split_changes(p, dst, i, dst[i].dim))
                FSDP2_CHECK(step_reduce_scatter(p, i, dst[i].dim));
            else
                FSDP2_CHECK(step_all_reduce(p, i));
        }
    }
    for (int i = 0; i < p->mesh_ndim; i++) {
        if (dtensor_placement_equal(p->cur[i], dst[i]))
            continue;
        if (dst[i].type == FSDP2_PLACEMENT_SHARD)
            FSDP2_CHECK(step_slice(p, i, dst[i].dim));
        else if (dst[i].type == FSDP2_PLACEMENT_PARTIAL)
            FSDP2_CHECK(step_partition(p, i, dst[i].op));
    }
    return FSDP2_SUCCESS;
}

/* Redistributes dt to dst; *out shares dt's storage when nothing moved. */
static fsdp2_status_t redistribute(const fsdp2_dtensor_t *dt, const fsdp2_placement_t *dst,
                                   fsdp2_stream_t *stream, fsdp2_dtensor_t **out)
{
    FSDP2_ARG_CHECK(dt && out, "redistribute: dtensor or out is NULL");
    *out = NULL;
    FSDP2_CHECK(dtensor_check_placements(dt->mesh_ndim, dst, dt->ndim));
    plan_t p = {.mesh = dt->mesh, .mesh_ndim = dt->mesh_ndim, .ndim = dt->ndim,
                .dtype = dt->dtype, .device = dt->local->device};
    memcpy(p.mesh_shape, dt->mesh_shape, sizeof(p.mesh_shape));
    memcpy(p.coords, dt->coords, sizeof(p.coords));
    memcpy(p.shape, dt->shape, sizeof(p.shape));
    memcpy(p.cur, dt->placements, sizeof(p.cur));
    FSDP2_CHECK(fsdp2_dtype_size(dt->dtype, &p.elem));
    FSDP2_CHECK(dtensor_stream(stream, p.device, &p.stream));
    /* The dry run: every check of the plan, and the shapes of the tensors it makes. Its
     * refusals are the same on every rank and leave the groups alone; running out of
     * memory for its meta tensors is this rank's own and fails the mesh together. */
    if (!is_meta(&p)) {
        plan_t d = p;
        d.dry = 1;
        fsdp2_status_t checked = fsdp2_tensor_retain(dt->local, &d.local);
        if (checked == FSDP2_SUCCESS)
            checked = run_plan(&d, dst);
        fsdp2_tensor_release(d.local);
        if (checked == FSDP2_ERR_OUT_OF_MEMORY || checked == FSDP2_ERR_INTERNAL)
            return fsdp2_mesh_fail(dt->mesh, checked);
        FSDP2_CHECK(checked);
        p.planned = 1;
        p.count = d.count;
        memcpy(p.ndims, d.ndims, sizeof(p.ndims));
        memcpy(p.shapes, d.shapes, sizeof(p.shapes));
    }
    /* Then all of them at once, and the result's struct, before the first collective:
     * all or nothing. */
    fsdp2_status_t status = FSDP2_SUCCESS;
    fsdp2_dtensor_t *result = fsdp2_calloc(1, sizeof(*result));
    if (!result)
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "redistribute: the result");
    for (int k = 0; k < p.count && status == FSDP2_SUCCESS; k++)
        status = fsdp2_tensor_empty(p.device, p.dtype, p.ndims[k], p.shapes[k], &p.made[k]);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_tensor_retain(dt->local, &p.local);
    if (status == FSDP2_SUCCESS)
        status = run_plan(&p, dst);
    if (status == FSDP2_SUCCESS)
        status = dtensor_wrap_into(result, dt->mesh, dst, dt->ndim, dt->shape, p.local);
    if (status == FSDP2_SUCCESS) {
        *out = result;
    } else {
        fsdp2_tensor_release(p.local);
        free(result);
    }
    for (int k = 0; k < p.count; k++)
        fsdp2_tensor_release(p.made[k]); /* those a failed run did not take */
    /* A failure here (an allocation, an enqueue, a collective) leaves the peers in, or
     * on their way to, collectives this rank will not join: the mesh's groups fail
     * together. */
    return fsdp2_mesh_fail(dt->mesh, status);
}

fsdp2_status_t fsdp2_dtensor_redistribute(const fsdp2_dtensor_t *dt,
                                          const fsdp2_placement_t *placements,
                                          fsdp2_stream_t *stream, fsdp2_dtensor_t **out)
{
    return redistribute(dt, placements, stream, out);
}

/* A copy of t in new storage, on stream's device (synchronized). */
fsdp2_status_t dtensor_copy_tensor(const fsdp2_tensor_t *t, fsdp2_stream_t *stream,
                                   fsdp2_tensor_t **out)
{
    FSDP2_CHECK(fsdp2_tensor_empty(t->device, t->dtype, t->ndim, t->shape, out));
    if (t->device.type == FSDP2_DEVICE_META)
        return FSDP2_SUCCESS;
    fsdp2_status_t status = fsdp2_memcpy_async((*out)->data, t->data, t->nbytes, stream);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_stream_synchronize(stream);
    if (status != FSDP2_SUCCESS) {
        fsdp2_tensor_release(*out);
        *out = NULL;
    }
    return status;
}

fsdp2_status_t fsdp2_dtensor_full_tensor(const fsdp2_dtensor_t *dt, fsdp2_stream_t *stream,
                                         fsdp2_tensor_t **full)
{
    FSDP2_ARG_CHECK(dt && full, "full_tensor: dtensor or full is NULL");
    *full = NULL;
    fsdp2_placement_t replicate[FSDP2_MESH_MAX_DIMS];
    for (int i = 0; i < FSDP2_MESH_MAX_DIMS; i++)
        replicate[i] = (fsdp2_placement_t)FSDP2_REPLICATE_INIT;
    fsdp2_dtensor_t *whole;
    FSDP2_CHECK(redistribute(dt, replicate, stream, &whole));
    fsdp2_status_t status;
    if (whole->local->storage == dt->local->storage) {
        fsdp2_stream_t *s;
        status = dtensor_stream(stream, dt->local->device, &s);
        if (status == FSDP2_SUCCESS)
            status = dtensor_copy_tensor(whole->local, s, full);
    } else {
        status = fsdp2_tensor_retain(whole->local, full);
    }
    fsdp2_dtensor_release(whole);
    return fsdp2_mesh_fail(dt->mesh, status);
}
