/* fully_shard: a module's unowned parameters become one group with one flat, padded
 * shard per rank; each parameter's DTensor Shard(0) is a view into it.
 *
 * Flat layout (elements), the all-gather's send buffer as it is:
 *   [param 0: chunk_rows x row_numel][param 1: chunk_rows x row_numel]...
 * Rows past a parameter's local rows are padding, zero from the start and never read
 * as values. The sharded gradients have the same layout over the parameters that
 * require gradients. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/kernels.h>

#include "collectives/mesh_default.h"
#include "core/error.h"
#include "core/options.h"
#include "core/log_internal.h"
#include "core/trace_internal.h"
#include "fsdp/fsdp_internal.h"

fsdp2_module_t *fsdp_root_module(fsdp2_module_t *m)
{
    fsdp2_module_t *root = NULL;
    for (fsdp2_module_t *x = m; x; x = x->parent) {
        if (x->group)
            root = x;
    }
    return root;
}

void fsdp_group_free(fsdp_group_t *g)
{
    if (g->layout.shard)
        fsdp2_trace_mem_static(TRACE_MEM_SHARDED_PARAMS, -(int64_t)g->layout.shard->nbytes);
    if (g->layout.grad_shard)
        fsdp2_trace_mem_static(TRACE_MEM_SHARDED_GRADS, -(int64_t)g->layout.grad_shard->nbytes);
    fsdp2_tensor_release(g->layout.shard);
    fsdp2_tensor_release(g->layout.grad_shard);
    fsdp2_event_destroy(g->unsharded.gathered);
    for (int i = 0; i < FSDP_BUFFER_SLOTS; i++)
        free(g->unsharded.pieces[i]);
    fsdp_group_post_forward_free(g); /* the pieces (the root gave the shard back) */
    free(g->unsharded.piece_offsets);
    free(g->params);
    free(g->controls.forward_prefetch.groups);
    free(g->controls.backward_prefetch.groups);
    free(g);
}

static int is_ignored(const fsdp2_param_t *p, const fsdp2_shard_options_t *o)
{
    for (size_t i = 0; i < o->num_ignored_params; i++) {
        if (o->ignored_params[i] == p)
            return 1;
    }
    return 0;
}

/* The parameters of m's subtree that no nested group owns, in named_parameters order. */
static fsdp2_status_t gather_params(fsdp_group_t *g, fsdp2_module_t *m,
                                    const fsdp2_shard_options_t *o)
{
    for (size_t i = 0; i < m->num_params; i++) {
        fsdp2_param_t *p = m->params[i];
        if (p->group || is_ignored(p, o))
            continue;
        fsdp2_param_t **bigger = realloc(g->params, (g->num_params + 1) * sizeof(*bigger));
        if (!bigger)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "fully_shard");
        g->params = bigger;
        g->params[g->num_params++] = p;
    }
    for (size_t i = 0; i < m->num_children; i++) {
        if (!m->children[i]->group)
            FSDP2_CHECK(gather_params(g, m->children[i], o));
    }
    return FSDP2_SUCCESS;
}

static int group_has(const fsdp_group_t *g, const fsdp2_param_t *p)
{
    for (size_t i = 0; i < g->num_params; i++) {
        if (g->params[i] == p)
            return 1;
    }
    return 0;
}

/* Every tie in the part of m's subtree that g takes must name one of g's parameters, and
 * every parameter of g's must not be tied from a unit sharded before (nested groups'
 * subtrees are skipped here: their ties were checked when they were sharded). */
static fsdp2_status_t check_ties(const fsdp_group_t *g, const fsdp2_module_t *m)
{
    for (size_t i = 0; i < m->num_ties; i++) {
        const fsdp2_param_t *t = m->ties[i].target;
        if (group_has(g, t))
            continue;
        char here[FSDP2_FQN_MAX], there[FSDP2_FQN_MAX], unit[FSDP2_FQN_MAX];
        fsdp_module_fqn(m, here, sizeof(here));
        fsdp_module_fqn(t->owner, there, sizeof(there));
        fsdp_module_fqn(g->module, unit, sizeof(unit));
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "fully_shard '%s': '%s%s%s' is tied to '%s%s%s', which is not in this "
                           "unit (%s): a tied parameter's names must all be in one unit; shard "
                           "their common ancestor instead",
                           unit, here, *here ? "." : "", m->ties[i].name, there, *there ? "." : "",
                           t->name, t->group ? "it is in a unit sharded before" : "it is outside it");
    }
    for (size_t i = 0; i < m->num_children; i++) {
        if (!m->children[i]->group)
            FSDP2_CHECK(check_ties(g, m->children[i]));
    }
    return FSDP2_SUCCESS;
}

/* Offload: host memory is where cpu shards live already (said once per process, as a
 * warning since the policy asked for something that does not happen); the cuda path
 * (pinned host shards, copies on the side streams, the optimizer on the host) is not
 * built yet. */
static fsdp2_status_t check_offload(const fsdp2_shard_options_t *o, const char *fqn)
{
    static atomic_int said;
    const fsdp2_offload_policy_t *p = &o->offload;
    FSDP2_ARG_CHECK(p->offload_params == 0 || p->offload_params == 1,
                    "fully_shard '%s': offload_params %d is not 0 or 1", fqn, p->offload_params);
    FSDP2_ARG_CHECK(p->pin_memory == 0 || p->pin_memory == 1,
                    "fully_shard '%s': offload pin_memory %d is not 0 or 1", fqn, p->pin_memory);
    if (!p->offload_params)
        return FSDP2_SUCCESS;
    if (o->device.type == FSDP2_DEVICE_CUDA)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "fully_shard '%s': CPU offload of cuda shards is not supported yet "
                           "(offload_params 1 with device cuda:%d)",
                           fqn, o->device.index);
    if (!atomic_exchange(&said, 1)) {
        FSDP2_LOG(WARN, FSDP,
                  "fully_shard '%s': offload_params on a cpu device: the shards, gradients and "
                  "optimizer state are in host memory already; the policy changes nothing",
                  fqn);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp_check_shard_options(const fsdp2_shard_options_t *o, const char *fqn)
{
    FSDP2_ARG_CHECK(o->size == sizeof(*o),
                    "fully_shard '%s': options size %u is not sizeof(fsdp2_shard_options_t) = %zu "
                    "(use FSDP2_SHARD_OPTIONS_INIT)",
                    fqn, o->size, sizeof(*o));
    FSDP2_ARG_CHECK(o->unsharded_buffers >= 1 && o->unsharded_buffers <= FSDP_MAX_RING,
                    "fully_shard '%s': unsharded_buffers %d is not in 1..%d", fqn,
                    o->unsharded_buffers, FSDP_MAX_RING);
    FSDP2_ARG_CHECK(o->num_ignored_params == 0 || o->ignored_params,
                    "fully_shard '%s': %zu ignored parameters but the array is NULL", fqn,
                    o->num_ignored_params);
    FSDP2_ARG_CHECK(o->device.type == FSDP2_DEVICE_CPU || o->device.type == FSDP2_DEVICE_CUDA,
                    "fully_shard '%s': shards live on cpu or cuda, not device type %d", fqn,
                    (int)o->device.type);
    return check_offload(o, fqn);
}

/* Places every parameter in the flat buffers (offsets, chunk rows). */
static fsdp2_status_t lay_out(fsdp_group_t *g, const char *fqn)
{
    for (size_t i = 0; i < g->num_params; i++) {
        fsdp2_param_t *p = g->params[i];
        char pfqn[FSDP2_FQN_MAX];
        fsdp_param_fqn(p, pfqn, sizeof(pfqn));
        FSDP2_ARG_CHECK(p->ndim >= 1,
                        "fully_shard '%s': parameter '%s' has 0 dims; Shard(0) needs one (declare "
                        "it as [1])",
                        fqn, pfqn);
        if (i == 0)
            g->layout.dtype = p->dtype;
        if (p->dtype != g->layout.dtype)
            return fsdp2_error(FSDP2_ERR_DTYPE_MISMATCH,
                               "fully_shard '%s': parameter '%s' is %s but '%s' is %s; one group "
                               "all-gathers one dtype",
                               fqn, pfqn, fsdp2_dtype_name(p->dtype), g->params[0]->name,
                               fsdp2_dtype_name(g->layout.dtype));
        p->rows = p->shape[0];
        p->row_numel = 1;
        for (int d = 1; d < p->ndim; d++)
            p->row_numel *= p->shape[d];
        p->chunk_rows = p->rows / g->comm.ws + (p->rows % g->comm.ws != 0);
        FSDP2_CHECK(
            fsdp2_chunk_range(p->rows, g->comm.ws, g->comm.rank, &p->offset_rows, &p->local_rows));
        /* rows x row_numel is a tensor's numel (checked when it was made); the sums of
         * a group's parameters are not */
        int64_t chunk = p->chunk_rows * p->row_numel, whole = p->rows * p->row_numel;
        p->shard_offset = g->layout.shard_numel;
        p->full_offset = g->layout.full_numel;
        int over = __builtin_add_overflow(g->layout.shard_numel, chunk, &g->layout.shard_numel) ||
                   __builtin_add_overflow(g->layout.full_numel, whole, &g->layout.full_numel);
        if (p->requires_grad) {
            p->grad_offset = g->layout.grad_shard_numel;
            p->grad_full_offset = g->layout.grad_full_numel;
            over = over ||
                   __builtin_add_overflow(g->layout.grad_shard_numel, chunk,
                                          &g->layout.grad_shard_numel) ||
                   __builtin_add_overflow(g->layout.grad_full_numel, whole,
                                          &g->layout.grad_full_numel);
        }
        if (over)
            return fsdp2_error(FSDP2_ERR_OVERFLOW,
                               "fully_shard '%s': the unit's elements overflow 64 bits at "
                               "parameter '%s'",
                               fqn, pfqn);
    }
    /* Every byte count made of these (ws chunks of up to 8-byte elements, buffers of them)
     * must fit too. */
    int64_t gathered;
    if (__builtin_mul_overflow(g->layout.shard_numel, (int64_t)g->comm.ws * 8, &gathered) ||
        __builtin_mul_overflow(g->layout.full_numel, (int64_t)8, &gathered))
        return fsdp2_error(FSDP2_ERR_OVERFLOW,
                           "fully_shard '%s': %d ranks x a shard of %lld elements (%lld whole) "
                           "overflow 64-bit byte counts",
                           fqn, g->comm.ws, (long long)g->layout.shard_numel,
                           (long long)g->layout.full_numel);
    if (g->num_params)
        FSDP2_CHECK(fsdp2_dtype_size(g->layout.dtype, &g->layout.elem));
    return FSDP2_SUCCESS;
}

/* A view of `rows` rows of p's shape at element offset `at` of a flat buffer. */
fsdp2_status_t fsdp_param_view(const fsdp2_param_t *p, fsdp2_tensor_t *flat, int64_t at,
                               int64_t rows, fsdp2_tensor_t **out)
{
    fsdp2_tensor_t *slice;
    FSDP2_CHECK(fsdp2_tensor_narrow(flat, at, rows * p->row_numel, &slice));
    int64_t shape[FSDP2_MAX_DIMS];
    memcpy(shape, p->shape, sizeof(shape));
    shape[0] = rows;
    fsdp2_status_t status = fsdp2_tensor_reshape(slice, p->ndim, shape, out);
    fsdp2_tensor_release(slice);
    return status;
}

static fsdp2_status_t make_dtensor(fsdp_group_t *g, fsdp2_param_t *p, fsdp2_tensor_t *flat,
                                   int64_t at, fsdp2_dtensor_t **out)
{
    /* FSDP: [Shard(0)]; HSDP: [Replicate, Shard(0)] (replicate x shard, as PyTorch). */
    fsdp2_placement_t fsdp[1] = {FSDP2_SHARD_INIT(0)};
    fsdp2_placement_t hsdp[2] = {FSDP2_REPLICATE_INIT, FSDP2_SHARD_INIT(0)};
    fsdp2_tensor_t *local;
    FSDP2_CHECK(fsdp_param_view(p, flat, at, p->local_rows, &local));
    fsdp2_status_t status = fsdp2_dtensor_from_local(
        local, g->comm.mesh, g->comm.replicate ? hsdp : fsdp, p->ndim, p->shape, 0, NULL, out);
    fsdp2_tensor_release(local);
    return status;
}

/* Copies the declared value's rows of this rank into the shard, then drops the value. */
static fsdp2_status_t take_value(fsdp_group_t *g, fsdp2_param_t *p, fsdp2_stream_t *stream)
{
    fsdp2_tensor_t *value = p->value;
    p->value = NULL;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (value->device.type != FSDP2_DEVICE_META && p->local_rows > 0) {
        size_t row_bytes = (size_t)p->row_numel * g->layout.elem;
        status = fsdp2_memcpy_async((char *)g->layout.shard->data +
                                        (size_t)p->shard_offset * g->layout.elem,
                                    (const char *)value->data + (size_t)p->offset_rows * row_bytes,
                                    (size_t)p->local_rows * row_bytes, stream);
    }
    fsdp2_tensor_release(value);
    return status;
}

/* The group's tensors: its flat shards, each parameter's DTensors on them, and the
 * declared values' rows copied in. */
static fsdp2_status_t build(fsdp_group_t *g)
{
    FSDP2_CHECK(fsdp2_tensor_zeros(g->comm.device, g->layout.dtype, 1, &g->layout.shard_numel,
                                   &g->layout.shard));
    fsdp2_trace_mem_static(TRACE_MEM_SHARDED_PARAMS, (int64_t)g->layout.shard->nbytes);
    if (g->layout.grad_shard_numel) {
        FSDP2_CHECK(fsdp2_tensor_zeros(g->comm.device, g->layout.dtype, 1,
                                       &g->layout.grad_shard_numel, &g->layout.grad_shard));
        fsdp2_trace_mem_static(TRACE_MEM_SHARDED_GRADS, (int64_t)g->layout.grad_shard->nbytes);
    }
    fsdp2_stream_t *stream;
    FSDP2_CHECK(fsdp2_stream_current(g->comm.device, &stream));
    for (size_t i = 0; i < g->num_params; i++) {
        fsdp2_param_t *p = g->params[i];
        FSDP2_CHECK(make_dtensor(g, p, g->layout.shard, p->shard_offset, &p->sharded));
        if (p->requires_grad)
            FSDP2_CHECK(make_dtensor(g, p, g->layout.grad_shard, p->grad_offset, &p->sharded_grad));
    }
    FSDP2_CHECK(fsdp2_event_create(g->comm.device, &g->unsharded.gathered));
    /* Only now that nothing can fail but the copies are the declared values taken. */
    for (size_t i = 0; i < g->num_params; i++)
        FSDP2_CHECK(take_value(g, g->params[i], stream));
    FSDP2_CHECK(fsdp2_stream_synchronize(stream));
    for (size_t i = 0; i < g->num_params; i++)
        g->params[i]->group = g;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_reshard_value(const fsdp_group_t *g, int value, const char *what)
{
    if (value < 0 || value > g->comm.ws || (value > 1 && g->comm.ws % value != 0)) {
        char fqn[FSDP2_FQN_MAX];
        fsdp_module_fqn(g->module, fqn, sizeof(fqn));
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "%s '%s': reshard_after_forward %d is not 0 (keep whole), 1 (reshard "
                           "over all %d ranks of the shard dim) or a divisor of %d",
                           what, fqn[0] ? fqn : "(root)", value, g->comm.ws, g->comm.ws);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp_group_set_reshard_after_forward(fsdp_group_t *g, int value, const char *what)
{
    FSDP2_CHECK(check_reshard_value(g, value, what));
    int n = value > 1 && value < g->comm.ws ? value : 0;
    if (n != g->pf.ranks) {
        fsdp_group_post_forward_free(g); /* planned for the old N */
        /* The post-forward layout: each parameter in ceil(rows / N) row chunks, rank
         * (rank % N) keeping its chunk, padded like the shards. */
        g->pf.shard_numel = 0;
        for (size_t i = 0; i < g->num_params && n; i++) {
            fsdp2_param_t *p = g->params[i];
            p->pf_chunk_rows = p->rows / n + (p->rows % n != 0);
            p->pf_shard_offset = g->pf.shard_numel;
            g->pf.shard_numel += p->pf_chunk_rows * p->row_numel;
        }
        g->pf.ranks = n;
        g->pf.rank = n ? g->comm.rank % n : 0;
    }
    g->controls.reshard_after_forward = value != 0;
    return FSDP2_SUCCESS;
}

void fsdp_group_init(fsdp_group_t *g, fsdp2_module_t *m, const fsdp2_shard_options_t *o)
{
    g->module = m;
    g->trace.slice = g->trace.hold = g->trace.grad_hold = g->trace.pf_hold = TRACE_NO_TOKEN;
    g->comm.device = o->device;
    g->controls.reshard_after_backward = 1;
    g->controls.requires_gradient_sync = 1;
    g->controls.is_last_backward = 1;
    g->controls.requested_unsharded_buffers = o->unsharded_buffers;
    g->step.buffer = FSDP_NO_BUFFER;
    g->grads.buffer = FSDP_NO_GRAD_BUFFER;
    g->controls.reduce = (fsdp2_reduce_t)FSDP2_REDUCE_AVG_INIT;
    g->comm.replicas = 1;
}

fsdp2_status_t fsdp_group_geometry(fsdp_group_t *g, const fsdp2_shard_options_t *o,
                                   const char *fqn)
{
    FSDP2_CHECK(check_reshard_value(g, o->reshard_after_forward, "fully_shard"));
    FSDP2_CHECK(gather_params(g, g->module, o));
    FSDP2_CHECK(check_ties(g, g->module));
    FSDP2_CHECK(lay_out(g, fqn));
    if (!g->num_params) {
        g->layout.dtype = FSDP2_F32;
        g->layout.elem = sizeof(float);
    }
    FSDP2_CHECK(fsdp_group_set_precision(g, &o->mp, fqn));
    return fsdp_group_set_reshard_after_forward(g, o->reshard_after_forward, "fully_shard");
}

/* Whether a group under m already belongs to a planned root. */
static int planned_below(const fsdp2_module_t *m)
{
    if (m->group && m->group->root)
        return 1;
    for (size_t i = 0; i < m->num_children; i++) {
        if (planned_below(m->children[i]))
            return 1;
    }
    return 0;
}

fsdp2_status_t fsdp_shard_options_take(const fsdp2_shard_options_t *in,
                                       fsdp2_shard_options_t *out, const char *fqn)
{
    fsdp2_shard_options_t defaults = FSDP2_SHARD_OPTIONS_INIT;
    *out = defaults;
    if (in) {
        char what[FSDP2_FQN_MAX + 32];
        snprintf(what, sizeof(what), "fully_shard '%s': options", fqn);
        FSDP2_CHECK(fsdp2_options_copy(what, out, sizeof(*out), in, NULL, 0));
    }
    return fsdp_check_shard_options(out, fqn);
}

fsdp2_status_t fsdp2_fully_shard(fsdp2_module_t *m, const fsdp2_shard_options_t *options)
{
    FSDP2_ARG_CHECK(m, "fully_shard: module is NULL");
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(m, fqn, sizeof(fqn));
    fsdp2_shard_options_t taken;
    FSDP2_CHECK(fsdp_shard_options_take(options, &taken, fqn));
    const fsdp2_shard_options_t *o = &taken;
    if (m->group)
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "fully_shard: module '%s' is already sharded",
                           fqn);
    for (fsdp2_module_t *x = m->parent; x; x = x->parent) {
        if (x->group) {
            char pfqn[FSDP2_FQN_MAX];
            fsdp_module_fqn(x, pfqn, sizeof(pfqn));
            return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                               "fully_shard: module '%s' is under '%s', which is already sharded "
                               "(shard children before their parents)",
                               fqn, pfqn);
        }
    }
    if (planned_below(m)) {
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "fully_shard: module '%s' holds sharded modules whose root already "
                           "planned its buffers (shard the whole tree before the first hook)",
                           fqn);
    }
    fsdp2_mesh_t *mesh = o->mesh ? o->mesh : fsdp2_default_mesh();
    if (!mesh)
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "fully_shard '%s': no mesh given and no world mesh (call fsdp2_init "
                           "or set options.mesh)",
                           fqn);
    int ndim;
    FSDP2_CHECK(fsdp2_mesh_ndim(mesh, &ndim));
    FSDP2_ARG_CHECK(ndim == 1 || ndim == 2,
                    "fully_shard '%s': the mesh has %d dims; fully_shard takes a 1D mesh (FSDP) "
                    "or a 2D [replicate, shard] mesh (HSDP)",
                    fqn, ndim);
    fsdp_group_t *g = calloc(1, sizeof(*g));
    if (!g)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "fully_shard '%s'", fqn);
    fsdp_group_init(g, m, o);
    g->comm.mesh = mesh;
    fsdp2_status_t status = fsdp2_mesh_group(mesh, ndim - 1, &g->comm.pg);
    if (status == FSDP2_SUCCESS && ndim == 2) {
        status = fsdp2_mesh_group(mesh, 0, &g->comm.replicate);
        if (status == FSDP2_SUCCESS)
            status = fsdp2_group_size(g->comm.replicate, &g->comm.replicas);
    }
    if (status == FSDP2_SUCCESS)
        status = fsdp2_group_rank(g->comm.pg, &g->comm.rank);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_group_size(g->comm.pg, &g->comm.ws);
    if (status == FSDP2_SUCCESS) /* before build takes the declared values */
        status = fsdp_group_geometry(g, o, fqn);
    if (status == FSDP2_SUCCESS)
        status = build(g);
    if (status != FSDP2_SUCCESS) {
        for (size_t i = 0; i < g->num_params; i++) {
            fsdp2_param_t *p = g->params[i];
            p->group = NULL;
            fsdp2_dtensor_release(p->sharded);
            fsdp2_dtensor_release(p->sharded_grad);
            p->sharded = p->sharded_grad = NULL;
        }
        fsdp_group_free(g);
        return status;
    }
    m->group = g;
    return FSDP2_SUCCESS;
}

typedef struct tree_walk {
    const fsdp2_shard_options_t *options;
    fsdp2_shard_policy_fn policy;
    void *ctx;
    int64_t min_params;
} tree_walk_t;

int64_t fsdp_unowned_numel(const fsdp2_module_t *m)
{
    int64_t n = 0;
    for (size_t i = 0; i < m->num_params; i++) {
        int64_t numel = 0;
        if (!m->params[i]->group &&
            fsdp2_shape_numel(m->params[i]->ndim, m->params[i]->shape, &numel) == FSDP2_SUCCESS)
            n += numel;
    }
    for (size_t i = 0; i < m->num_children; i++) {
        if (!m->children[i]->group)
            n += fsdp_unowned_numel(m->children[i]);
    }
    return n;
}

static fsdp2_status_t shard_below(fsdp2_module_t *m, const tree_walk_t *w)
{
    for (size_t i = 0; i < m->num_children; i++) {
        fsdp2_module_t *c = m->children[i];
        FSDP2_CHECK(shard_below(c, w));
        if (c->group)
            continue;
        int64_t n = fsdp_unowned_numel(c);
        int take = w->policy ? w->policy(c, w->ctx) : n > 0 && n >= w->min_params;
        if (take)
            FSDP2_CHECK(fsdp2_fully_shard(c, w->options));
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_fully_shard_tree(fsdp2_module_t *root, const fsdp2_shard_options_t *options,
                                      fsdp2_shard_policy_fn policy, void *ctx, int64_t min_params)
{
    FSDP2_ARG_CHECK(root, "fully_shard_tree: root is NULL");
    FSDP2_ARG_CHECK(min_params >= 0, "fully_shard_tree: min_params %lld is negative",
                    (long long)min_params);
    tree_walk_t w = {options, policy, ctx, min_params};
    FSDP2_CHECK(shard_below(root, &w));
    return root->group ? FSDP2_SUCCESS : fsdp2_fully_shard(root, options);
}

fsdp2_status_t fsdp2_param_set_random_init(fsdp2_param_t *p, const fsdp2_random_init_t *init)
{
    FSDP2_ARG_CHECK(p && init, "set_random_init: param or init is NULL");
    double probe;
    FSDP2_CHECK(fsdp2_random_value(init, 0, &probe)); /* validates init */
    p->random_init = *init;
    p->has_random_init = 1;
    return FSDP2_SUCCESS;
}

typedef struct materialize {
    fsdp2_param_init_fn init;
    void *ctx;
} materialize_t;

static fsdp2_status_t materialize_module(fsdp2_module_t *m, void *arg)
{
    const materialize_t *mt = arg;
    for (size_t i = 0; i < m->num_params; i++) {
        fsdp2_param_t *p = m->params[i];
        if (p->materialized)
            continue;
        char fqn[FSDP2_FQN_MAX];
        fsdp_param_fqn(p, fqn, sizeof(fqn));
        if (!p->group)
            return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                               "materialize: parameter '%s' is on meta but not sharded", fqn);
        fsdp2_tensor_t *local;
        FSDP2_CHECK(fsdp2_dtensor_to_local(p->sharded, &local));
        int64_t offset[FSDP2_MAX_DIMS] = {p->offset_rows};
        fsdp2_status_t status = FSDP2_SUCCESS;
        if (mt->init)
            status = mt->init(p, local, offset, mt->ctx);
        else if (p->has_random_init)
            status = fsdp2_dtensor_init_random(p->sharded, &p->random_init);
        fsdp2_tensor_release(local);
        if (status != FSDP2_SUCCESS) {
            char message[384];
            snprintf(message, sizeof(message), "%s", fsdp2_last_error());
            return fsdp2_error(status, "materialize: the initialiser of '%s' failed: %s", fqn,
                               message);
        }
        p->materialized = 1;
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_materialize(fsdp2_module_t *m, fsdp2_param_init_fn init, void *ctx)
{
    FSDP2_ARG_CHECK(m, "materialize: module is NULL");
    materialize_t mt = {init, ctx};
    return fsdp_module_walk(m, materialize_module, &mt);
}

fsdp2_status_t fsdp2_param_sharded(const fsdp2_param_t *p, fsdp2_dtensor_t **dt)
{
    FSDP2_ARG_CHECK(p && dt, "param or dtensor is NULL");
    *dt = p->sharded;
    if (!p->sharded) {
        char fqn[FSDP2_FQN_MAX];
        fsdp_param_fqn(p, fqn, sizeof(fqn));
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "parameter '%s' is not sharded", fqn);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_param_sharded_grad(const fsdp2_param_t *p, fsdp2_dtensor_t **dt)
{
    FSDP2_ARG_CHECK(p && dt, "param or dtensor is NULL");
    *dt = p->sharded_grad;
    if (!p->group) {
        char fqn[FSDP2_FQN_MAX];
        fsdp_param_fqn(p, fqn, sizeof(fqn));
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "parameter '%s' is not sharded", fqn);
    }
    return FSDP2_SUCCESS;
}
