/* The root's memory plan: every buffer a step needs, sized from the groups and allocated
 * once, before the first step, and freed with the root. The sizing (fsdp_plan_sizes) is
 * shared with the dry plan (plan_dry.c), which sizes a mesh that need not exist and makes
 * nothing; so is the collection of the root's groups (fsdp_root_collect_groups).
 *
 * - A ring of unsharded parameter buffers (2 by default), each as big as the largest
 *   all-gather output (ws x padded shard) of the groups that reshard after forward. The
 *   parameters sit at the front of a buffer, contiguous and whole; the padding rows of
 *   the all-gather land in the tail (each rank's rows are scattered straight into place
 *   by the all-gather, so there is no copy-out).
 * - Its own buffer for the root and for every group that keeps its parameters between
 *   forward and backward.
 * - A ring of two unsharded gradient buffers (the largest group's gradients), so one
 *   module's backward can start while the previous one's gradients are still copied into
 *   the reduce-scatter staging; a buffer of its own for a group that encloses other
 *   groups (the root with parameters: its backward spans theirs), and, on demand, a
 *   no-sync accumulator per group (the same buffer).
 * - Reduce-scatter staging: ws padded chunks. The reduce-scatter runs in place, so its
 *   result lands in this rank's chunk and needs no buffer of its own.
 * On one rank the flat shard is the whole parameters (no padding), so a group there
 * gathers nothing and needs no buffer, and its gradients are added straight into the
 * sharded gradients; on one rank of an HSDP shard dim whose reduce dtype is not the
 * compute dtype, the staging holds their cast for the replicas' all-reduce. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device_ops.h"
#include "core/error.h"
#include "core/log_internal.h"
#include "fsdp/fsdp_internal.h"

unsharded_buffer_t *fsdp_buffer(fsdp_group_t *g, int i)
{
    return i == FSDP_OWN_BUFFER ? &g->unsharded.own : &g->root->ring.buffers[i];
}

/* A parameter-shaped tensor on memory the plan owns (no reference counting). */
static fsdp2_status_t view_at(const fsdp2_param_t *p, const fsdp_group_t *g, void *base,
                              int64_t offset, fsdp2_tensor_t **out)
{
    return fsdp2_tensor_from_blob((char *)base + (size_t)offset * g->mp.pe, g->comm.device,
                                  g->mp.pdtype, p->ndim, p->shape, NULL, NULL, out);
}

static fsdp2_status_t alloc(fsdp_root_t *r, size_t bytes, void **ptr, uint64_t *category)
{
    FSDP2_CHECK(fsdp2_device_alloc(r->device, bytes, ptr));
    *category += bytes;
    r->plan.total += bytes;
    return FSDP2_SUCCESS;
}

/* Where each rank's part of an all-gather of g over n ranks lands in a buffer at base
 * (n = ws from the shards, or N from the post-forward shards): per parameter, the rank's
 * rows in place, then its padding rows into the tail (n | ws, so the N-way padding fits
 * where the ws-way padding does). */
static fsdp2_status_t make_pieces_for(fsdp_group_t *g, int n, int post_forward, void *base,
                                      fsdp2_iov_t **out, size_t **offsets)
{
    size_t count = (size_t)n * g->num_params * 2;
    fsdp2_iov_t *pieces = calloc(count ? count : 1, sizeof(*pieces));
    if (!pieces)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "all-gather pieces");
    if (!*offsets) {
        *offsets = calloc((size_t)n + 1, sizeof(size_t));
        if (!*offsets) {
            free(pieces);
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "all-gather pieces");
        }
    }
    char *at = base;
    size_t k = 0, pad_cursor = (size_t)g->layout.full_numel * g->mp.pe;
    for (int r = 0; r < n; r++) {
        (*offsets)[r] = k;
        for (size_t i = 0; i < g->num_params; i++) {
            const fsdp2_param_t *p = g->params[i];
            int64_t off, len, chunk = post_forward ? p->pf_chunk_rows : p->chunk_rows;
            fsdp2_chunk_range(p->rows, n, r, &off, &len);
            size_t row_bytes = (size_t)p->row_numel * g->mp.pe;
            size_t valid = (size_t)len * row_bytes, pad = (size_t)(chunk - len) * row_bytes;
            if (valid)
                pieces[k++] = (fsdp2_iov_t){
                    at + ((size_t)p->full_offset * g->mp.pe + (size_t)off * row_bytes), valid};
            if (pad) {
                pieces[k++] = (fsdp2_iov_t){at + pad_cursor, pad};
                pad_cursor += pad;
            }
        }
    }
    (*offsets)[n] = k;
    free(*out);
    *out = pieces;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t make_pieces(fsdp_group_t *g, int b, void *base)
{
    FSDP2_CHECK(make_pieces_for(g, g->comm.ws, 0, base, &g->unsharded.pieces[b],
                                &g->unsharded.piece_offsets));
    if (g->pf.shard)
        FSDP2_CHECK(
            make_pieces_for(g, g->pf.ranks, 1, base, &g->pf.pieces[b], &g->pf.piece_offsets));
    return FSDP2_SUCCESS;
}

static size_t gathered_bytes(const fsdp_group_t *g)
{
    return (size_t)g->comm.ws * (size_t)g->layout.shard_numel * g->mp.pe;
}

/* What bind_groups gives a group beyond the shared buffers, decided once here so that
 * the plan's size and its allocations cannot disagree: a gradient accumulator when its
 * backward encloses other groups' (or gradient sync is off), a post-forward shard, and
 * a buffer of its own when it keeps its parameters (none at one rank without a cast:
 * its shard is its parameters). */
static int wants_accumulator(const fsdp_group_t *g)
{
    return g->grads.encloses_groups || !g->controls.requires_gradient_sync;
}

static int wants_post_forward(const fsdp_group_t *g)
{
    return g->controls.reshard_after_forward != 0;
}

static uint64_t own_buffer_bytes(const fsdp_group_t *g)
{
    return g->comm.ws == 1 && !g->mp.cast ? 0 : gathered_bytes(g);
}

/* Points buffer b's pieces and parameter views of g at that buffer's memory. */
static fsdp2_status_t bind_buffer(fsdp_group_t *g, int b)
{
    unsharded_buffer_t *buf = fsdp_buffer(g, b);
    FSDP2_CHECK(make_pieces(g, b, buf->data));
    for (size_t i = 0; i < g->num_params; i++) {
        fsdp2_param_t *p = g->params[i];
        fsdp2_tensor_release(p->unsharded_view[b]);
        p->unsharded_view[b] = NULL;
        FSDP2_CHECK(view_at(p, g, buf->data, p->full_offset, &p->unsharded_view[b]));
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp_group_own_buffer(fsdp_group_t *g)
{
    if (g->unsharded.own.data || !g->root)
        return FSDP2_SUCCESS;
    fsdp_root_t *r = g->root;
    if (g->comm.ws == 1 && !g->mp.cast) {
        /* One rank: no padding, the flat shard is every parameter whole. */
        g->unsharded.alias = 1;
        g->unsharded.own.data = g->layout.shard->data;
        g->unsharded.own.bytes = 0;
        FSDP2_CHECK(fsdp2_event_create(r->device, &g->unsharded.own.free));
        g->unsharded.dedicated = 1;
        return bind_buffer(g, FSDP_OWN_BUFFER);
    }
    g->unsharded.own.bytes = own_buffer_bytes(g);
    FSDP2_CHECK(
        alloc(r, g->unsharded.own.bytes, &g->unsharded.own.data, &r->plan.unsharded_params));
    FSDP2_CHECK(fsdp2_event_create(r->device, &g->unsharded.own.free));
    g->unsharded.dedicated = 1;
    return bind_buffer(g, FSDP_OWN_BUFFER);
}

fsdp2_status_t fsdp_group_post_forward(fsdp_group_t *g)
{
    fsdp_root_t *r = g->root;
    if (!r || !g->pf.ranks || g->pf.shard || g == r->group || !g->layout.shard_numel)
        return FSDP2_SUCCESS;
    /* The pieces are made only once the group is bound to its buffers (bind_groups);
     * afterwards (a control changed later) for every buffer it may gather into. */
    FSDP2_CHECK(fsdp2_mesh_block_group(g->comm.mesh, g->pf.ranks, &g->pf.pg));
    size_t bytes = (size_t)g->pf.shard_numel * g->mp.pe;
    FSDP2_CHECK(alloc(r, bytes, &g->pf.shard, &r->plan.post_forward_params));
    FSDP2_CHECK(fsdp2_event_create(r->device, &g->pf.free));
    for (int b = 0; b < r->ring.size && g->unsharded.pieces[b]; b++)
        FSDP2_CHECK(make_pieces_for(g, g->pf.ranks, 1, r->ring.buffers[b].data, &g->pf.pieces[b],
                                    &g->pf.piece_offsets));
    if (g->unsharded.own.data && g->unsharded.pieces[FSDP_OWN_BUFFER])
        FSDP2_CHECK(make_pieces_for(g, g->pf.ranks, 1, g->unsharded.own.data,
                                    &g->pf.pieces[FSDP_OWN_BUFFER], &g->pf.piece_offsets));
    return FSDP2_SUCCESS;
}

void fsdp_group_post_forward_free(fsdp_group_t *g)
{
    fsdp_root_t *r = g->root;
    if (r && g->pf.shard) {
        uint64_t bytes = (uint64_t)g->pf.shard_numel * g->mp.pe;
        r->plan.post_forward_params -= bytes;
        r->plan.total -= bytes;
        fsdp2_device_free(r->device, g->pf.shard);
    }
    fsdp2_event_destroy(g->pf.free);
    for (int b = 0; b < FSDP_BUFFER_SLOTS; b++) {
        free(g->pf.pieces[b]);
        g->pf.pieces[b] = NULL;
    }
    free(g->pf.piece_offsets);
    g->pf.piece_offsets = NULL;
    g->pf.shard = NULL;
    g->pf.free = NULL;
    g->pf.pg = NULL;
    g->pf.valid = 0;
}

fsdp2_status_t fsdp_group_accumulator(fsdp_group_t *g)
{
    if (g->grads.accumulator || !g->root || !g->layout.grad_full_numel)
        return FSDP2_SUCCESS;
    fsdp_root_t *r = g->root;
    size_t bytes = (size_t)g->layout.grad_full_numel * g->mp.pe;
    FSDP2_CHECK(alloc(r, bytes, &g->grads.accumulator, &r->plan.unsharded_grads));
    FSDP2_CHECK(fsdp2_event_create(r->device, &g->grads.accumulator_free));
    g->grads.accumulator_dirty = 0; /* zeroed in stream order by the next pre_backward */
    for (size_t i = 0; i < g->num_params; i++) {
        fsdp2_param_t *p = g->params[i];
        if (p->requires_grad)
            FSDP2_CHECK(view_at(p, g, g->grads.accumulator, p->grad_full_offset,
                                &p->grad_view[FSDP_GRAD_ACCUMULATOR]));
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t collect_group(fsdp2_module_t *m, void *arg)
{
    fsdp_root_t *r = arg;
    if (!m->group)
        return FSDP2_SUCCESS;
    fsdp_group_t **bigger = realloc(r->groups, (r->num_groups + 1) * sizeof(*bigger));
    if (!bigger)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "fsdp root");
    r->groups = bigger;
    r->groups[r->num_groups++] = m->group;
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(m, fqn, sizeof(fqn));
    if (m->group->comm.device.type != r->device.type ||
        m->group->comm.device.index != r->device.index)
        return fsdp2_error(FSDP2_ERR_DEVICE_MISMATCH,
                           "module '%s' keeps its shards on another device than the root", fqn);
    /* The root's buffers are sized for its mesh: one mesh per tree. */
    if (m->group->comm.mesh != r->groups[0]->comm.mesh)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "module '%s' is sharded over another mesh than the root's; one tree "
                           "shards over one mesh",
                           fqn);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp_root_collect_groups(fsdp_root_t *r, fsdp2_module_t *rootm)
{
    r->group = rootm->group;
    FSDP2_CHECK(fsdp_module_walk(rootm, collect_group, r));
    /* FSDP2: the root keeps its parameters from forward to backward. */
    r->group->controls.reshard_after_forward = 0;
    for (size_t i = 0; i < r->num_groups; i++)
        r->groups[i]->unsharded.dedicated = !r->groups[i]->controls.reshard_after_forward;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t make_streams(fsdp_root_t *r)
{
    FSDP2_CHECK(fsdp2_stream_current(r->device, &r->streams.compute));
    FSDP2_CHECK(fsdp2_stream_create(r->device, "fsdp-all-gather", &r->streams.ag));
    FSDP2_CHECK(fsdp2_stream_create(r->device, "fsdp-reduce-scatter", &r->streams.rs));
    fsdp_root_streams_t *s = &r->streams;
    fsdp2_event_t **events[] = {&s->compute_mark, &s->rs_done, &s->ag_done, &s->grad_ready};
    for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++)
        FSDP2_CHECK(fsdp2_event_create(r->device, events[i]));
    for (int k = 0; k < FSDP_GRAD_RING; k++)
        FSDP2_CHECK(fsdp2_event_create(r->device, &r->grad_ring.slots[k].free));
    for (int k = 0; k < FSDP_MAX_SENDS; k++) {
        FSDP2_CHECK(fsdp2_event_create(r->device, &r->sends.slots[k].free));
        FSDP2_CHECK(fsdp2_event_create(r->device, &r->sends.slots[k].copied));
    }
    return FSDP2_SUCCESS;
}

static int is_under(const fsdp2_module_t *m, const fsdp2_module_t *ancestor)
{
    for (const fsdp2_module_t *x = m->parent; x; x = x->parent) {
        if (x == ancestor)
            return 1;
    }
    return 0;
}

/* Whether g's backward encloses other groups' (their modules lie under its module). */
static void mark_enclosing(fsdp_root_t *r)
{
    for (size_t i = 0; i < r->num_groups; i++) {
        fsdp_group_t *g = r->groups[i];
        for (size_t j = 0; j < r->num_groups && !g->grads.encloses_groups; j++)
            g->grads.encloses_groups = is_under(r->groups[j]->module, g->module);
    }
}

void fsdp_plan_sizes(fsdp_root_t *r, fsdp_plan_sizes_t *s)
{
    memset(s, 0, sizeof(*s));
    s->plan.size = sizeof(s->plan);
    for (size_t i = 0; i < r->num_groups; i++) {
        fsdp_group_t *g = r->groups[i];
        if (g->comm.ws == 1)
            g->unsharded.dedicated = 1; /* its shard (or its cast) is its unsharded buffer */
        if (!g->unsharded.dedicated && gathered_bytes(g) > s->ring_bytes)
            s->ring_bytes = gathered_bytes(g);
        size_t gb = (size_t)g->layout.grad_full_numel * g->mp.pe;
        /* one rank of the shard dim needs staging only to cast for HSDP's all-reduce */
        int staged = g->comm.ws > 1 || (g->comm.replicas > 1 && g->mp.rdtype != g->mp.pdtype);
        size_t sb = staged ? (size_t)g->layout.grad_shard_numel * g->mp.re : 0;
        size_t cb = g->comm.ws > 1 && g->mp.cast ? (size_t)g->layout.shard_numel * g->mp.pe : 0;
        s->grad_bytes = gb > s->grad_bytes ? gb : s->grad_bytes;
        s->rs_bytes = sb > s->rs_bytes ? sb : s->rs_bytes;
        s->send_bytes = cb > s->send_bytes ? cb : s->send_bytes;
        s->plan.sharded_params += (uint64_t)g->layout.shard_numel * g->layout.elem;
        s->plan.sharded_grads += (uint64_t)g->layout.grad_shard_numel * g->layout.elem;
    }
    mark_enclosing(r);
    s->ring_size = s->ring_bytes ? r->group->controls.requested_unsharded_buffers : 0;
    s->sends = s->send_bytes ? (s->ring_size >= FSDP_MAX_SENDS ? FSDP_MAX_SENDS : 1) : 0;
    s->plan.unsharded_params = (uint64_t)s->ring_size * s->ring_bytes +
                               (uint64_t)s->sends * s->send_bytes;
    s->plan.unsharded_grads = s->grad_bytes ? FSDP_GRAD_RING * (uint64_t)s->grad_bytes : 0;
    s->plan.reduce_scatter = s->rs_bytes ? (uint64_t)r->group->comm.ws * s->rs_bytes : 0;
    /* What each group gets beyond the shared buffers (bind_groups; each allocator's own
     * conditions besides: nothing to hold, the root). */
    for (size_t i = 0; i < r->num_groups; i++) {
        fsdp_group_t *g = r->groups[i];
        uint64_t acc = wants_accumulator(g) && g->layout.grad_full_numel
                           ? (uint64_t)g->layout.grad_full_numel * g->mp.pe
                           : 0;
        uint64_t pf = wants_post_forward(g) && g->pf.ranks && g != r->group && g->layout.shard_numel
                          ? (uint64_t)g->pf.shard_numel * g->mp.pe
                          : 0;
        uint64_t own = g->unsharded.dedicated ? own_buffer_bytes(g) : 0;
        s->plan.unsharded_grads += acc;
        s->plan.post_forward_params += pf;
        s->plan.unsharded_params += own;
        s->group_bytes += acc + pf + own;
    }
    s->plan.total = s->plan.sharded_params + s->plan.sharded_grads + s->plan.unsharded_params +
                    s->plan.unsharded_grads + s->plan.reduce_scatter + s->plan.post_forward_params;
    s->plan.ring_buffers = s->ring_size;
    s->plan.groups = (int)r->num_groups;
}

static fsdp2_status_t allocate(fsdp_root_t *r, const fsdp_plan_sizes_t *s)
{
    size_t ring_bytes = s->ring_bytes, grad_bytes = s->grad_bytes, rs_bytes = s->rs_bytes,
           send_bytes = s->send_bytes;
    r->plan.sharded_params = s->plan.sharded_params;
    r->plan.sharded_grads = s->plan.sharded_grads;
    r->plan.total = r->plan.sharded_params + r->plan.sharded_grads;
    r->ring.size = s->ring_size;
    /* Everything below, refused at once when it cannot fit the device's limit. */
    uint64_t need = s->plan.total - r->plan.total;
    char what[224];
    snprintf(what, sizeof(what),
             "the FSDP plan (%d unsharded buffers of %zu bytes, 2 gradient buffers of %zu, "
             "%d cast buffers of %zu, reduce-scatter staging of %zu, %llu in the groups' own "
             "buffers and accumulators)",
             r->ring.size, ring_bytes, grad_bytes, s->sends, send_bytes,
             (size_t)r->group->comm.ws * rs_bytes, (unsigned long long)s->group_bytes);
    FSDP2_CHECK(fsdp_memory_check_fits(r->device, need, what));
    for (int b = 0; b < r->ring.size; b++) {
        r->ring.buffers[b].bytes = ring_bytes;
        FSDP2_CHECK(alloc(r, ring_bytes, &r->ring.buffers[b].data, &r->plan.unsharded_params));
        FSDP2_CHECK(fsdp2_event_create(r->device, &r->ring.buffers[b].free));
    }
    for (int k = 0; k < FSDP_GRAD_RING && grad_bytes; k++)
        FSDP2_CHECK(alloc(r, grad_bytes, &r->grad_ring.slots[k].data, &r->plan.unsharded_grads));
    /* Mixed precision: the cast shards sent, two when a prefetch can overlap a cast with
     * the all-gather before it; the copy-in stream only then. */
    r->sends.count = s->sends;
    for (int k = 0; k < r->sends.count; k++)
        FSDP2_CHECK(alloc(r, send_bytes, &r->sends.slots[k].data, &r->plan.unsharded_params));
    if (send_bytes)
        FSDP2_CHECK(
            fsdp2_stream_create(r->device, "fsdp-all-gather-copy-in", &r->streams.ag_copy_in));
    int ws = r->group->comm.ws;
    if (rs_bytes) {
        r->staging.bytes = (size_t)ws * rs_bytes;
        FSDP2_CHECK(alloc(r, r->staging.bytes, &r->staging.data, &r->plan.reduce_scatter));
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t bind_groups(fsdp_root_t *r)
{
    for (size_t i = 0; i < r->num_groups; i++) {
        fsdp_group_t *g = r->groups[i];
        /* A group whose backward encloses other groups' backwards holds its gradients
         * across theirs (encloses_groups, set by fsdp_plan_sizes): it gets a buffer of its
         * own, not one of the ring. */
        if (wants_accumulator(g))
            FSDP2_CHECK(fsdp_group_accumulator(g));
        if (wants_post_forward(g))
            FSDP2_CHECK(fsdp_group_post_forward(g));
        if (g->unsharded.dedicated) {
            g->unsharded.dedicated = 0; /* fsdp_group_own_buffer sets it once the buffer exists */
            FSDP2_CHECK(fsdp_group_own_buffer(g));
        }
        for (int b = 0; b < r->ring.size && !g->unsharded.dedicated; b++)
            FSDP2_CHECK(bind_buffer(g, b));
        for (int k = 0; k < FSDP_GRAD_RING; k++) {
            for (size_t j = 0; j < g->num_params && r->grad_ring.slots[k].data; j++) {
                fsdp2_param_t *p = g->params[j];
                if (p->requires_grad)
                    FSDP2_CHECK(view_at(p, g, r->grad_ring.slots[k].data, p->grad_full_offset,
                                        &p->grad_view[k]));
            }
        }
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t root_init(fsdp2_module_t *rootm, fsdp_root_t *r)
{
    r->device = rootm->group->comm.device;
    r->plan.size = sizeof(r->plan);
    FSDP2_CHECK(fsdp_root_collect_groups(r, rootm));
    for (size_t i = 0; i < r->num_groups; i++)
        r->groups[i]->root = r;
    r->step.order = calloc(r->num_groups ? r->num_groups : 1, sizeof(*r->step.order));
    r->step.last_order = calloc(r->num_groups ? r->num_groups : 1, sizeof(*r->step.last_order));
    if (!r->step.order || !r->step.last_order)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "fsdp root");
    FSDP2_CHECK(fsdp2_module_params(rootm, NULL, 0, &r->clip.capacity));
    int most = 1;
    for (size_t i = 0; i < r->num_groups; i++) {
        most = r->groups[i]->comm.ws > most ? r->groups[i]->comm.ws : most;
        most = r->groups[i]->comm.replicas > most ? r->groups[i]->comm.replicas : most;
    }
    r->clip.params = calloc(r->clip.capacity ? r->clip.capacity : 1, sizeof(*r->clip.params));
    r->clip.grads = calloc(r->clip.capacity ? r->clip.capacity : 1, sizeof(*r->clip.grads));
    r->clip.all = calloc((size_t)most, sizeof(*r->clip.all));
    r->clip.all_len = most;
    if (!r->clip.params || !r->clip.grads || !r->clip.all)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY,
                           "fsdp root: clipping scratch for %zu parameters", r->clip.capacity);
    /* Before any forward, the predicted order is the tree's. */
    memcpy(r->step.last_order, r->groups, r->num_groups * sizeof(*r->groups));
    r->step.last_order_len = r->num_groups;
    FSDP2_CHECK(make_streams(r));
    fsdp_plan_sizes_t sizes;
    fsdp_plan_sizes(r, &sizes);
    FSDP2_CHECK(allocate(r, &sizes));
    FSDP2_CHECK(bind_groups(r));
    r->plan.ring_buffers = r->ring.size;
    r->plan.groups = (int)r->num_groups;
    /* The sizes are the plan that fsdp2_plan_model reports without a mesh: what was
     * allocated must be them, to the byte. */
    const fsdp2_memory_plan_t *a = &r->plan, *b = &sizes.plan;
    const struct {
        const char *what;
        uint64_t allocated, sized;
    } fields[] = {
        {"sharded_params", a->sharded_params, b->sharded_params},
        {"sharded_grads", a->sharded_grads, b->sharded_grads},
        {"unsharded_params", a->unsharded_params, b->unsharded_params},
        {"unsharded_grads", a->unsharded_grads, b->unsharded_grads},
        {"reduce_scatter", a->reduce_scatter, b->reduce_scatter},
        {"post_forward_params", a->post_forward_params, b->post_forward_params},
        {"total", a->total, b->total},
        {"ring_buffers", (uint64_t)a->ring_buffers, (uint64_t)b->ring_buffers},
        {"groups", (uint64_t)a->groups, (uint64_t)b->groups},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i].allocated != fields[i].sized)
            return fsdp2_error(FSDP2_ERR_INTERNAL,
                               "memory plan: %s is %llu as allocated but %llu as sized",
                               fields[i].what, (unsigned long long)fields[i].allocated,
                               (unsigned long long)fields[i].sized);
    }
    FSDP2_LOG(INFO, FSDP,
              "memory plan: %d groups, %d unsharded buffers; bytes: sharded params %llu, grads "
              "%llu, unsharded params %llu, unsharded grads %llu, reduce-scatter %llu, "
              "post-forward shards %llu, total %llu",
              r->plan.groups, r->plan.ring_buffers, (unsigned long long)r->plan.sharded_params,
              (unsigned long long)r->plan.sharded_grads,
              (unsigned long long)r->plan.unsharded_params,
              (unsigned long long)r->plan.unsharded_grads,
              (unsigned long long)r->plan.reduce_scatter,
              (unsigned long long)r->plan.post_forward_params, (unsigned long long)r->plan.total);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp_root_get(fsdp2_module_t *m, fsdp_root_t **out)
{
    FSDP2_ARG_CHECK(m, "module is NULL");
    fsdp2_module_t *rootm = fsdp_root_module(m);
    if (!rootm) {
        char fqn[FSDP2_FQN_MAX];
        fsdp_module_fqn(m, fqn, sizeof(fqn));
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "module '%s' is not under a sharded module (call fsdp2_fully_shard)",
                           fqn);
    }
    if (rootm->group->root) {
        *out = rootm->group->root;
        return FSDP2_SUCCESS;
    }
    fsdp_root_t *r = calloc(1, sizeof(*r));
    if (!r)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "fsdp root");
    fsdp2_status_t status = root_init(rootm, r);
    if (status != FSDP2_SUCCESS) {
        fsdp_root_free(r);
        return status;
    }
    *out = r;
    return FSDP2_SUCCESS;
}

void fsdp_root_free(fsdp_root_t *r)
{
    if (!r)
        return;
    fsdp2_stream_destroy(r->streams.ag_copy_in);
    fsdp2_stream_destroy(r->streams.ag);
    fsdp2_stream_destroy(r->streams.rs);
    for (size_t i = 0; i < r->num_groups; i++) {
        fsdp_group_t *g = r->groups[i];
        for (size_t j = 0; j < g->num_params; j++) {
            fsdp2_param_t *p = g->params[j];
            for (int b = 0; b < FSDP_BUFFER_SLOTS; b++) {
                fsdp2_tensor_release(p->unsharded_view[b]);
                p->unsharded_view[b] = NULL;
            }
            for (int k = 0; k < FSDP_GRAD_SLOTS; k++) {
                fsdp2_tensor_release(p->grad_view[k]);
                p->grad_view[k] = NULL;
            }
            p->unsharded = p->grad = NULL;
        }
        if (!g->unsharded.alias)
            fsdp2_device_free(r->device, g->unsharded.own.data);
        g->unsharded.alias = 0;
        fsdp2_event_destroy(g->unsharded.own.free);
        fsdp2_device_free(r->device, g->grads.accumulator);
        fsdp2_event_destroy(g->grads.accumulator_free);
        fsdp_group_post_forward_free(g);
        g->grads.accumulator_free = NULL;
        memset(&g->unsharded.own, 0, sizeof(g->unsharded.own));
        g->grads.accumulator = NULL;
        g->root = NULL;
    }
    for (int b = 0; b < r->ring.size; b++) {
        fsdp2_device_free(r->device, r->ring.buffers[b].data);
        fsdp2_event_destroy(r->ring.buffers[b].free);
    }
    for (int k = 0; k < FSDP_GRAD_RING; k++) {
        fsdp2_device_free(r->device, r->grad_ring.slots[k].data);
        fsdp2_event_destroy(r->grad_ring.slots[k].free);
    }
    for (int k = 0; k < FSDP_MAX_SENDS; k++) {
        fsdp2_device_free(r->device, r->sends.slots[k].data);
        fsdp2_event_destroy(r->sends.slots[k].free);
        fsdp2_event_destroy(r->sends.slots[k].copied);
    }
    fsdp2_device_free(r->device, r->staging.data);
    fsdp2_event_destroy(r->streams.compute_mark);
    fsdp2_event_destroy(r->streams.rs_done);
    fsdp2_event_destroy(r->streams.ag_done);
    fsdp2_event_destroy(r->streams.grad_ready);
    free(r->groups);
    free(r->step.order);
    free(r->step.last_order);
    free(r->clip.params);
    free(r->clip.grads);
    free(r->clip.all);
    free(r);
}

fsdp2_status_t fsdp2_memory_plan(fsdp2_module_t *m, fsdp2_memory_plan_t *plan)
{
    FSDP2_ARG_CHECK(plan, "memory plan is NULL");
    FSDP2_ARG_CHECK(plan->size == sizeof(*plan),
                    "memory plan: size %u is not sizeof(fsdp2_memory_plan_t) = %zu", plan->size,
                    sizeof(*plan));
    fsdp_root_t *r;
    FSDP2_CHECK(fsdp_root_get(m, &r));
    *plan = r->plan;
    plan->size = sizeof(*plan);
    return FSDP2_SUCCESS;
}
