/* The step: hooks, prefetch, gradient buffers, reduce-scatters, and the events that order
 * them (see fsdp2/fsdp.h); the all-gathers themselves are unshard.c's. Four streams: the
 * application's current stream ("compute"), the copy-in stream (mixed precision's casts
 * into the send buffers; only with a cast and ws > 1), the all-gather stream and the
 * reduce-scatter stream.
 *
 * Ordering, each by one event:
 * - a copy-in reads the shard the optimizer wrote on compute: it waits compute_mark;
 * - it overwrites a send buffer an earlier all-gather read: it waits that send slot's
 *   free, recorded on the all-gather stream after that all-gather;
 * - the all-gather sends what the copy-in wrote: it waits the send slot's copied;
 * - an all-gather reads shards the optimizer wrote on compute: it waits compute_mark,
 *   recorded when it is issued;
 * - it writes an unsharded buffer whose last reader ran on compute: it waits the
 *   buffer's free event, recorded where the buffer was released;
 * - compute reads the parameters after the all-gather: it waits the group's gathered;
 * - the reduce-scatter stream reads gradients compute wrote: it waits grad_ready;
 * - compute zeroes a gradient buffer the reduce-scatter stream read: it waits that
 *   gradient slot's free;
 * - the optimizer (compute) reads sharded gradients: backward_finish waits rs_done. */
#include <stdio.h>
#include <string.h>

#include <fsdp2/kernels.h>

#include "collectives/mesh_fail.h"
#include "core/error.h"
#include "fsdp/step_internal.h"

/* A failure after a hook's checks: this rank's step is broken, so every group of the
 * root's meshes fails here and tells its peers, rather than leave them waiting in
 * collectives this rank will not join. */
static fsdp2_status_t step_failed(fsdp_root_t *r, fsdp2_status_t status)
{
    if (status == FSDP2_SUCCESS && r->step.deferred != FSDP2_SUCCESS)
        status = fsdp2_error(r->step.deferred, "%s", r->step.deferred_message);
    r->step.deferred = FSDP2_SUCCESS;
    if (status == FSDP2_SUCCESS)
        return status;
    for (size_t i = 0; i < r->num_groups; i++) {
        fsdp2_mesh_t *mesh = r->groups[i]->comm.mesh;
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = r->groups[j]->comm.mesh == mesh;
        if (!seen)
            fsdp2_mesh_fail(mesh, status);
    }
    return status;
}

fsdp2_status_t fsdp_state_error(const fsdp_group_t *g, const char *fmt, const char *what)
{
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(g->module, fqn, sizeof(fqn));
    return fsdp2_error(FSDP2_ERR_INVALID_STATE, fmt, what, fqn[0] ? fqn : "(root)");
}

/* m's group, with the root planned; refuses modules that are not sharded. */
static fsdp2_status_t group_of(fsdp2_module_t *m, const char *what, fsdp_group_t **g,
                               fsdp_root_t **r)
{
    FSDP2_ARG_CHECK(m, "%s: module is NULL", what);
    if (!m->group) {
        char fqn[FSDP2_FQN_MAX];
        fsdp_module_fqn(m, fqn, sizeof(fqn));
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "%s: module '%s' is not sharded", what,
                           fqn[0] ? fqn : "(root)");
    }
    /* The first hook plans the root's buffers: a failure there leaves the peers in the
     * collectives of their first step, so the mesh's groups fail together. */
    FSDP2_CHECK(fsdp2_mesh_fail(m->group->comm.mesh, fsdp_root_get(m, r)));
    *g = m->group;
    if (!(*g)->root)
        return fsdp_state_error(
            *g, "%s: module '%s' was sharded after its root planned its buffers", what);
    return FSDP2_SUCCESS;
}

static long index_of(fsdp_group_t *const *list, size_t n, const fsdp_group_t *g)
{
    for (size_t i = 0; i < n; i++) {
        if (list[i] == g)
            return (long)i;
    }
    return -1;
}

static fsdp2_status_t prefetch(fsdp_root_t *r, fsdp_group_t *const *targets, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (targets[i] && targets[i]->root == r && !fsdp_group_in_use(targets[i]))
            FSDP2_CHECK(fsdp_unshard_issue(r, targets[i], 0));
    }
    return FSDP2_SUCCESS;
}

/* After g's pre_forward: its own list, else the group after it in the last step's
 * order. */
static fsdp2_status_t prefetch_forward(fsdp_root_t *r, const fsdp_group_t *g)
{
    const fsdp_prefetch_list_t *list = &g->controls.forward_prefetch;
    if (list->is_set)
        return prefetch(r, list->groups, list->count);
    const fsdp_root_step_t *step = &r->step;
    long at = index_of(step->last_order, step->last_order_len, g);
    if (at < 0 || (size_t)at + 1 >= step->last_order_len)
        return FSDP2_SUCCESS;
    return prefetch(r, &step->last_order[at + 1], 1);
}

/* After g's pre_backward: its own list, else the group before it in this step's
 * forward order. */
static fsdp2_status_t prefetch_backward(fsdp_root_t *r, const fsdp_group_t *g)
{
    const fsdp_prefetch_list_t *list = &g->controls.backward_prefetch;
    if (list->is_set)
        return prefetch(r, list->groups, list->count);
    long at = index_of(r->step.order, r->step.order_len, g);
    return at > 0 ? prefetch(r, &r->step.order[at - 1], 1) : FSDP2_SUCCESS;
}

/* The one reset between steps: this step's order becomes the one to prefetch by, and
 * every group goes back to idle. An unsharded group keeps its buffer unless it was used
 * in this step (at a new step's start: a step that never finished) or reshards after
 * backward (at backward_finish). */
static void reset_step(fsdp_root_t *r, int at_finish)
{
    if (r->step.order_len) {
        memcpy(r->step.last_order, r->step.order, r->step.order_len * sizeof(*r->step.order));
        r->step.last_order_len = r->step.order_len;
    }
    r->step.order_len = 0;
    for (size_t i = 0; i < r->num_groups; i++) {
        fsdp_group_t *g = r->groups[i];
        int drop = at_finish ? g->controls.reshard_after_backward
                             : g->step.training_state != FSDP2_STATE_IDLE;
        if (drop && g->step.unshard_state != FSDP2_SHARDED)
            fsdp_group_release(g);
        fsdp_post_forward_drop(g);
        g->step.training_state = FSDP2_STATE_IDLE;
        g->step.forward_done = 0;
    }
}

static void begin_step(fsdp_root_t *r)
{
    reset_step(r, 0);
    r->step.in_step = 1;
}

fsdp2_status_t fsdp_check_backward_closed(fsdp2_module_t *m, const char *what)
{
    fsdp2_module_t *top = m ? fsdp_root_module(m) : NULL;
    const fsdp_root_t *r = top && top->group ? top->group->root : NULL;
    if (!r || !r->step.backward_open)
        return FSDP2_SUCCESS;
    return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                       "%s: the backward of this step is not finished: call "
                       "fsdp2_backward_finish on the root first (reduce-scatters may still be "
                       "writing the sharded gradients)",
                       what);
}

/* A module's hooks inside its root's: a child's forward hooks while the root is in its
 * forward, its backward hooks while the root is in its backward. */
static fsdp2_status_t check_inside_root(const fsdp_root_t *r, const fsdp_group_t *g,
                                        fsdp2_training_state_t want, const char *what)
{
    if (g == r->group || r->group->step.training_state == want)
        return FSDP2_SUCCESS;
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(g->module, fqn, sizeof(fqn));
    return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                       "%s on '%s' outside its root's %s: call fsdp2_pre_%s on the root first "
                       "(and fsdp2_post_%s on it after its children)",
                       what, fqn, want == FSDP2_STATE_FORWARD ? "forward" : "backward",
                       want == FSDP2_STATE_FORWARD ? "forward" : "backward",
                       want == FSDP2_STATE_FORWARD ? "forward" : "backward");
}

fsdp2_status_t fsdp2_pre_forward(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "pre_forward", &g, &r));
    if (fsdp_group_in_use(g))
        return fsdp_state_error(g, "%s on '%s' while it is between its hooks (call post first)",
                                "pre_forward");
    FSDP2_CHECK(check_inside_root(r, g, FSDP2_STATE_FORWARD, "pre_forward"));
    if (g == r->group && r->step.backward_open)
        return fsdp_state_error(g,
                                "%s on the root '%s' while the last step's backward is not "
                                "finished (call fsdp2_backward_finish first)",
                                "pre_forward");
    if (g == r->group || !r->step.in_step) {
        fsdp2_trace_step_auto();
        begin_step(r);
    }
    if (index_of(r->step.order, r->step.order_len, g) < 0)
        r->step.order[r->step.order_len++] = g;
    fsdp2_status_t status = fsdp_unshard_issue(r, g, 1);
    if (status != FSDP2_SUCCESS)
        return step_failed(r, status);
    /* In use from here on, so that its own prefetch cannot take its buffer. */
    fsdp2_training_state_t before = g->step.training_state;
    g->step.training_state = FSDP2_STATE_FORWARD;
    status = prefetch_forward(r, g);
    if (status == FSDP2_SUCCESS)
        status = fsdp_unshard_wait(r, g);
    if (status != FSDP2_SUCCESS)
        g->step.training_state = before;
    else
        g->trace.slice = fsdp_trace_begin(g, r->streams.compute, TRACE_FORWARD, 0, g->mp.pdtype);
    return step_failed(r, status);
}

fsdp2_status_t fsdp2_post_forward(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "post_forward", &g, &r));
    if (g->step.training_state != FSDP2_STATE_FORWARD)
        return fsdp_state_error(g, "%s on '%s' without its pre_forward", "post_forward");
    FSDP2_CHECK(check_inside_root(r, g, FSDP2_STATE_FORWARD, "post_forward"));
    fsdp2_trace_stream_end(r->streams.compute, g->trace.slice);
    g->trace.slice = TRACE_NO_TOKEN;
    g->step.training_state = FSDP2_STATE_AFTER_FORWARD;
    g->step.forward_done = 1;
    if (!g->controls.reshard_after_forward)
        return FSDP2_SUCCESS;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (g->pf.shard && g->step.buffer != FSDP_NO_BUFFER && !g->unsharded.alias)
        status = fsdp_post_forward_keep(r, g);
    fsdp_group_release(g);
    return step_failed(r, status);
}

/* The next gradient buffer of the ring that no other backward holds, or
 * FSDP_NO_GRAD_BUFFER. */
static int pick_grad_buffer(const fsdp_root_t *r, const fsdp_group_t *g)
{
    for (int n = 0; n < FSDP_GRAD_RING; n++) {
        int k = (r->grad_ring.next + n) % FSDP_GRAD_RING;
        const fsdp_group_t *owner = r->grad_ring.slots[k].owner;
        if (!owner || owner == g)
            return k;
    }
    return FSDP_NO_GRAD_BUFFER;
}

/* Points g's parameters' gradients at the buffer its backward holds. */
static void bind_grads(fsdp_group_t *g)
{
    int k = g->grads.buffer;
    for (size_t i = 0; i < g->num_params; i++) {
        fsdp2_param_t *p = g->params[i];
        p->grad = p->requires_grad ? p->grad_view[k] : NULL;
    }
    int own = k == FSDP_GRAD_ACCUMULATOR;
    g->trace.grad_hold =
        fsdp_trace_hold(g, own ? "gradient accumulator" : "gradient", own ? -1 : k,
                        (uint64_t)g->layout.grad_full_numel * g->mp.pe, TRACE_MEM_UNSHARDED_GRADS);
}

/* The gradient buffer for g's backward, zeroed on compute unless it holds gradients
 * accumulated without sync. */
static fsdp2_status_t take_grad_buffer(fsdp_root_t *r, fsdp_group_t *g)
{
    if (!g->layout.grad_full_numel)
        return FSDP2_SUCCESS;
    fsdp_group_grads_t *grads = &g->grads;
    int use_accumulator =
        grads->accumulator &&
        (grads->accumulator_dirty || !g->controls.requires_gradient_sync || grads->encloses_groups);
    void *data = grads->accumulator;
    if (use_accumulator) {
        grads->buffer = FSDP_GRAD_ACCUMULATOR;
        if (!grads->accumulator_dirty)
            FSDP2_CHECK(fsdp2_stream_wait_event(r->streams.compute, grads->accumulator_free));
    } else {
        int k = pick_grad_buffer(r, g);
        if (k == FSDP_NO_GRAD_BUFFER)
            return fsdp_state_error(g,
                                    "%s: both gradient buffers are held by backwards still running "
                                    "(no buffer for '%s')",
                                    "pre_backward");
        r->grad_ring.next = (k + 1) % FSDP_GRAD_RING;
        FSDP2_CHECK(fsdp2_stream_wait_event(r->streams.compute, r->grad_ring.slots[k].free));
        r->grad_ring.slots[k].owner = g;
        grads->buffer = k;
        data = r->grad_ring.slots[k].data;
    }
    if (!use_accumulator || !grads->accumulator_dirty)
        FSDP2_CHECK(fsdp2_fill_async(data, g->mp.pdtype, (size_t)g->layout.grad_full_numel, 0.0,
                                     r->streams.compute));
    bind_grads(g);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_pre_backward(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "pre_backward", &g, &r));
    if (fsdp_group_in_use(g))
        return fsdp_state_error(g, "%s on '%s' while it is between its hooks (call post first)",
                                "pre_backward");
    if (!r->step.in_step || !g->step.forward_done)
        return fsdp_state_error(g, "%s on '%s' before its forward in this step", "pre_backward");
    FSDP2_CHECK(check_inside_root(r, g, FSDP2_STATE_BACKWARD, "pre_backward"));
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (!g->controls.requires_gradient_sync)
        status = fsdp_group_accumulator(g); /* planned already unless set mid-way */
    if (status == FSDP2_SUCCESS)
        status = fsdp_unshard_issue(r, g, 1);
    if (status != FSDP2_SUCCESS)
        return step_failed(r, status);
    fsdp2_training_state_t before = g->step.training_state;
    g->step.training_state = FSDP2_STATE_BACKWARD; /* its prefetch must not take its buffer */
    status = prefetch_backward(r, g);
    if (status == FSDP2_SUCCESS)
        status = fsdp_unshard_wait(r, g);
    if (status == FSDP2_SUCCESS)
        status = take_grad_buffer(r, g);
    if (status != FSDP2_SUCCESS) {
        g->step.training_state = before;
    } else {
        g->trace.slice = fsdp_trace_begin(g, r->streams.compute, TRACE_BACKWARD, 0, g->mp.pdtype);
        r->step.backward_open = 1;
    }
    return step_failed(r, status);
}

/* chunk_cat: per rank, the padded chunks of every gradient, rank-major, into the staging
 * input, cast from the compute dtype to the reduce dtype; padding rows zero so they add
 * nothing. */
static fsdp2_status_t chunk_cat(fsdp_root_t *r, fsdp_group_t *g, const char *src)
{
    char *dst = r->staging.data;
    for (int k = 0; k < g->comm.ws; k++) {
        char *block = dst + (size_t)k * (size_t)g->layout.grad_shard_numel * g->mp.re;
        for (size_t i = 0; i < g->num_params; i++) {
            const fsdp2_param_t *p = g->params[i];
            if (!p->requires_grad)
                continue;
            int64_t off, len;
            fsdp2_chunk_range(p->rows, g->comm.ws, k, &off, &len);
            char *at = block + (size_t)p->grad_offset * g->mp.re;
            const char *from =
                src + ((size_t)p->grad_full_offset + (size_t)(off * p->row_numel)) * g->mp.pe;
            FSDP2_CHECK(fsdp2_cast_async(at, g->mp.rdtype, from, g->mp.pdtype,
                                         (size_t)(len * p->row_numel), r->streams.rs));
            if (len < p->chunk_rows)
                FSDP2_CHECK(fsdp2_fill_async(
                    at + (size_t)(len * p->row_numel) * g->mp.re, g->mp.rdtype,
                    (size_t)((p->chunk_rows - len) * p->row_numel), 0.0, r->streams.rs));
        }
    }
    return FSDP2_SUCCESS;
}

/* Tracing: the reduce-scatter staging is g's from the copy-out to the accumulation. */
static trace_token_t trace_staging(fsdp_root_t *r, fsdp_group_t *g, uint64_t bytes)
{
    if (!fsdp2_tracing())
        return TRACE_NO_TOKEN;
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(g->module, fqn, sizeof(fqn));
    trace_op_t op = TRACE_OP_INIT(TRACE_MEMORY);
    op.name = fqn[0] ? fqn : "(root)";
    op.module = fqn;
    op.bytes = bytes;
    op.mem = TRACE_MEM_REDUCE_SCATTER;
    return fsdp2_trace_stream_hold(r->streams.rs, "reduce-scatter staging", &op);
}

/* The sharded gradients += the reduced ones (scaled), on the reduce-scatter stream. */
static fsdp2_status_t accumulate(fsdp_root_t *r, fsdp_group_t *g, const void *src,
                                 fsdp2_dtype_t dtype, double scale)
{
    size_t n = (size_t)g->layout.grad_shard_numel;
    trace_token_t t =
        fsdp_trace_begin(g, r->streams.rs, TRACE_ACCUMULATE, n * g->layout.elem, g->layout.dtype);
    fsdp2_status_t status = fsdp2_accumulate_async(g->layout.grad_shard->data, g->layout.dtype, src,
                                                   dtype, n, scale, r->streams.rs);
    fsdp2_trace_stream_end(r->streams.rs, t);
    return status;
}

static fsdp2_status_t reduce_scatter(fsdp_root_t *r, fsdp_group_t *g)
{
    const char *src = g->grads.buffer == FSDP_GRAD_ACCUMULATOR
                          ? g->grads.accumulator
                          : r->grad_ring.slots[g->grads.buffer].data;
    FSDP2_CHECK(fsdp2_event_record(r->streams.grad_ready, r->streams.compute));
    FSDP2_CHECK(fsdp2_stream_wait_event(r->streams.rs, r->streams.grad_ready));
    fsdp2_reduce_t avg = FSDP2_REDUCE_AVG_INIT;
    size_t n = (size_t)g->layout.grad_shard_numel;
    char fqn[FSDP2_FQN_MAX];
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (g->comm.ws == 1) {
        /* The reduction over one rank is the gradient (divided by the factor if one is
         * set); the layouts match (no padding). HSDP averages it over the replicas first,
         * in the reduce dtype as FSDP2 does: in place (the buffer is ours) when that is
         * the compute dtype, else cast into the staging (planned for this case). */
        const void *reduced = src;
        fsdp2_dtype_t dtype = g->mp.pdtype;
        if (g->comm.replicas > 1) {
            if (g->mp.rdtype != g->mp.pdtype) {
                FSDP2_CHECK(fsdp2_cast_async(r->staging.data, g->mp.rdtype, src, g->mp.pdtype, n,
                                             r->streams.rs));
                reduced = r->staging.data;
                dtype = g->mp.rdtype;
            }
            int labelled = fsdp_trace_label(g, fqn, sizeof(fqn), dtype);
            status = fsdp2_all_reduce_async(g->comm.replicate, (void *)reduced, n, dtype, &avg,
                                            r->streams.rs);
            fsdp_trace_unlabel(labelled);
            FSDP2_CHECK(status);
        }
        double scale =
            g->controls.reduce.op == FSDP2_REDUCE_SUM ? 1.0 / g->controls.reduce.pre_divide : 1.0;
        FSDP2_CHECK(accumulate(r, g, reduced, dtype, scale));
        if (g->grads.buffer == FSDP_GRAD_ACCUMULATOR) {
            g->grads.accumulator_dirty = 0;
            FSDP2_CHECK(fsdp2_event_record(g->grads.accumulator_free, r->streams.rs));
        } else {
            FSDP2_CHECK(
                fsdp2_event_record(r->grad_ring.slots[g->grads.buffer].free, r->streams.rs));
        }
        FSDP2_CHECK(fsdp2_event_record(r->streams.rs_done, r->streams.rs));
        g->stats.reduce_scatters++;
        return FSDP2_SUCCESS;
    }
    /* The staging hold ends on every path, so a failure leaves no bytes counted. */
    trace_token_t staging = trace_staging(r, g, (size_t)g->comm.ws * n * g->mp.re);
    /* in place: this rank's result replaces its chunk of the staging */
    char *out = (char *)r->staging.data + (size_t)g->comm.rank * n * g->mp.re;
    trace_token_t t = fsdp_trace_begin(g, r->streams.rs, TRACE_COPY_OUT,
                                       (size_t)g->comm.ws * n * g->mp.re, g->mp.rdtype);
    status = chunk_cat(r, g, src);
    fsdp2_trace_stream_end(r->streams.rs, t);
    if (status == FSDP2_SUCCESS) {
        if (g->grads.buffer == FSDP_GRAD_ACCUMULATOR)
            g->grads.accumulator_dirty = 0;
        status = fsdp2_event_record(g->grads.buffer == FSDP_GRAD_ACCUMULATOR
                                        ? g->grads.accumulator_free
                                        : r->grad_ring.slots[g->grads.buffer].free,
                                    r->streams.rs);
    }
    if (status == FSDP2_SUCCESS) {
        int labelled = fsdp_trace_label(g, fqn, sizeof(fqn), g->mp.rdtype);
        status = fsdp2_reduce_scatter_async(g->comm.pg, r->staging.data, out, n, g->mp.rdtype,
                                            &g->controls.reduce, r->streams.rs);
        /* HSDP: reduce-scatter over the shard dim, then all-reduce over the replicate dim. */
        if (status == FSDP2_SUCCESS && g->comm.replicas > 1)
            status = fsdp2_all_reduce_async(g->comm.replicate, out, n, g->mp.rdtype, &avg,
                                            r->streams.rs);
        fsdp_trace_unlabel(labelled);
    }
    if (status == FSDP2_SUCCESS)
        status = accumulate(r, g, out, g->mp.rdtype, 1.0);
    fsdp2_trace_stream_end(r->streams.rs, staging);
    FSDP2_CHECK(status);
    FSDP2_CHECK(fsdp2_event_record(r->streams.rs_done, r->streams.rs));
    g->stats.reduce_scatters++;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_post_backward(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "post_backward", &g, &r));
    if (g->step.training_state != FSDP2_STATE_BACKWARD)
        return fsdp_state_error(g, "%s on '%s' without its pre_backward", "post_backward");
    FSDP2_CHECK(check_inside_root(r, g, FSDP2_STATE_BACKWARD, "post_backward"));
    fsdp2_trace_stream_end(r->streams.compute, g->trace.slice);
    g->trace.slice = TRACE_NO_TOKEN;
    g->step.training_state = FSDP2_STATE_AFTER_BACKWARD;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (g->layout.grad_full_numel) {
        /* Gradients in a ring buffer are always reduced now; only the accumulator may
         * keep them (sync off). */
        if (g->controls.requires_gradient_sync || g->grads.buffer != 2)
            status = reduce_scatter(r, g);
        else
            g->grads.accumulator_dirty = 1;
    }
    for (size_t i = 0; i < g->num_params; i++)
        g->params[i]->grad = NULL;
    if (g->grads.buffer != FSDP_NO_GRAD_BUFFER && g->grads.buffer != FSDP_GRAD_ACCUMULATOR)
        r->grad_ring.slots[g->grads.buffer].owner = NULL;
    g->grads.buffer = FSDP_NO_GRAD_BUFFER;
    fsdp_trace_end_hold(&g->trace.grad_hold);
    if (g->controls.reshard_after_backward)
        fsdp_group_release(g);
    return step_failed(r, status);
}

fsdp2_status_t fsdp2_module_run(fsdp2_module_t *m, fsdp2_phase_t phase, fsdp2_module_fn fn,
                                void *ctx)
{
    FSDP2_ARG_CHECK(fn, "module_run: fn is NULL");
    FSDP2_ARG_CHECK(phase == FSDP2_PHASE_FORWARD || phase == FSDP2_PHASE_BACKWARD,
                    "module_run: phase %d is not forward (0) or backward (1)", (int)phase);
    int fwd = phase == FSDP2_PHASE_FORWARD;
    FSDP2_CHECK(fwd ? fsdp2_pre_forward(m) : fsdp2_pre_backward(m));
    fsdp2_status_t status = fn(m, ctx);
    char message[512] = "";
    if (status != FSDP2_SUCCESS)
        snprintf(message, sizeof(message), "%s", fsdp2_last_error());
    fsdp2_status_t post = fwd ? fsdp2_post_forward(m) : fsdp2_post_backward(m);
    if (status != FSDP2_SUCCESS)
        return fsdp2_error(status, "%s", message);
    return post;
}

fsdp2_status_t fsdp2_backward_finish(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "backward_finish", &g, &r));
    if (g != r->group)
        return fsdp_state_error(g, "%s: '%s' is not the root", "backward_finish");
    for (size_t i = 0; i < r->num_groups; i++) {
        if (fsdp_group_in_use(r->groups[i]))
            return fsdp_state_error(r->groups[i], "%s: module '%s' is still between its hooks",
                                    "backward_finish");
    }
    /* A prefetch nobody used may still read shards the optimizer is about to write. */
    fsdp2_status_t status = fsdp2_event_record(r->streams.ag_done, r->streams.ag);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_stream_wait_event(r->streams.compute, r->streams.ag_done);
    if (status == FSDP2_SUCCESS && r->group->controls.is_last_backward) {
        status = fsdp2_event_record(r->streams.rs_done, r->streams.rs);
        if (status == FSDP2_SUCCESS)
            status = fsdp2_stream_wait_event(r->streams.compute, r->streams.rs_done);
    }
    if (status != FSDP2_SUCCESS)
        return step_failed(r, status);
    reset_step(r, 1);
    r->step.in_step = 0;
    r->step.backward_open = 0;
    for (int k = 0; k < FSDP_GRAD_RING; k++)
        r->grad_ring.slots[k].owner = NULL;
    return step_failed(r, FSDP2_SUCCESS);
}

fsdp2_status_t fsdp2_unshard(fsdp2_module_t *m, fsdp2_event_t **done)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    if (done)
        *done = NULL;
    FSDP2_CHECK(group_of(m, "unshard", &g, &r));
    FSDP2_CHECK(step_failed(r, fsdp_unshard_issue(r, g, 1)));
    /* until fsdp2_reshard or its hooks release it */
    g->step.pinned = g->step.buffer != FSDP_NO_BUFFER;
    if (done)
        *done = g->unsharded.gathered;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_unshard_wait(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "unshard_wait", &g, &r));
    if (g->step.unshard_state == FSDP2_SHARDED)
        return fsdp_state_error(g, "%s: module '%s' has no all-gather issued (call fsdp2_unshard)",
                                "unshard_wait");
    return step_failed(r, fsdp_unshard_wait(r, g));
}

fsdp2_status_t fsdp2_reshard(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "reshard", &g, &r));
    if (fsdp_group_in_use(g))
        return fsdp_state_error(g, "%s: module '%s' is between its hooks", "reshard");
    if (g->step.unshard_state != FSDP2_SHARDED)
        fsdp_group_release(g);
    return step_failed(r, FSDP2_SUCCESS);
}
