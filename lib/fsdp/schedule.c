/* The step: hooks, all-gathers with prefetch, reduce-scatters, and the events that order
 * them (see fsdp2/fsdp.h). Four streams: the application's current stream ("compute"),
 * the copy-in stream (mixed precision's casts into the send buffers; only with a cast
 * and ws > 1), the all-gather stream and the reduce-scatter stream.
 *
 * Ordering, each by one event:
 * - a copy-in reads the shard the optimizer wrote on compute: it waits compute_mark;
 * - it overwrites a send buffer an earlier all-gather read: it waits that buffer's
 *   send_free, recorded on the all-gather stream after that all-gather;
 * - the all-gather sends what the copy-in wrote: it waits the buffer's copied;
 * - an all-gather reads shards the optimizer wrote on compute: it waits compute_mark,
 *   recorded when it is issued;
 * - it writes an unsharded buffer whose last reader ran on compute: it waits the
 *   buffer's free event, recorded where the buffer was released;
 * - compute reads the parameters after the all-gather: it waits the group's gathered;
 * - the reduce-scatter stream reads gradients compute wrote: it waits grad_ready;
 * - compute zeroes a gradient buffer the reduce-scatter stream read: it waits that
 *   buffer's grad_free;
 * - the optimizer (compute) reads sharded gradients: backward_finish waits rs_done. */
#include <stdio.h>
#include <string.h>

#include <fsdp2/kernels.h>

#include "collectives/mesh_fail.h"
#include "core/error.h"
#include "core/trace_internal.h"
#include "fsdp/fsdp_internal.h"

/* A failure after a hook's checks: this rank's step is broken, so every group of the
 * root's meshes fails here and tells its peers, rather than leave them waiting in
 * collectives this rank will not join. */
static fsdp2_status_t step_failed(fsdp_root_t *r, fsdp2_status_t status)
{
    if (status == FSDP2_SUCCESS && r->deferred != FSDP2_SUCCESS)
        status = fsdp2_error(r->deferred, "%s", r->deferred_message);
    r->deferred = FSDP2_SUCCESS;
    if (status == FSDP2_SUCCESS)
        return status;
    for (size_t i = 0; i < r->num_groups; i++) {
        fsdp2_mesh_t *mesh = r->groups[i]->mesh;
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = r->groups[j]->mesh == mesh;
        if (!seen)
            fsdp2_mesh_fail(mesh, status);
    }
    return status;
}

static fsdp2_status_t state_error(const fsdp_group_t *g, const char *fmt, const char *what)
{
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(g->module, fqn, sizeof(fqn));
    return fsdp2_error(FSDP2_ERR_INVALID_STATE, fmt, what, fqn[0] ? fqn : "(root)");
}

/* Tracing: a slice of g's work on stream (its FQN as the module). */
static trace_token_t trace_begin(fsdp_group_t *g, fsdp2_stream_t *stream, trace_cat_t cat, uint64_t bytes,
                       fsdp2_dtype_t dtype)
{
    if (!fsdp2_tracing())
        return TRACE_NO_TOKEN;
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(g->module, fqn, sizeof(fqn));
    trace_op_t op = TRACE_OP_INIT(cat);
    op.module = fqn;
    op.bytes = bytes;
    op.dtype = (int)dtype;
    return fsdp2_trace_stream_begin(stream, &op);
}

/* Tracing: g holds `bytes` of a planned buffer (a track per buffer) from now on. */
static trace_token_t trace_hold(fsdp_group_t *g, const char *kind, int index, uint64_t bytes,
                      trace_mem_t mem)
{
    if (!fsdp2_tracing())
        return TRACE_NO_TOKEN;
    char fqn[FSDP2_FQN_MAX], track[FSDP2_FQN_MAX + 32];
    fsdp_module_fqn(g->module, fqn, sizeof(fqn));
    if (index >= 0)
        snprintf(track, sizeof(track), "%s buffer %d", kind, index);
    else
        snprintf(track, sizeof(track), "%s of %s", kind, fqn[0] ? fqn : "(root)");
    trace_op_t op = TRACE_OP_INIT(TRACE_MEMORY);
    op.name = fqn[0] ? fqn : "(root)";
    op.module = fqn;
    op.bytes = bytes;
    op.mem = mem;
    return fsdp2_trace_host_begin(0, track, &op);
}

static void trace_end_hold(trace_token_t *token)
{
    if (*token >= 0) {
        fsdp2_trace_host_end(*token);
        *token = TRACE_NO_TOKEN;
    }
}

/* Collectives enqueued from here on are g's, until trace_unlabel(set) with what this
 * returned (1: a label was set). */
static int trace_label(fsdp_group_t *g, char *fqn, size_t len, fsdp2_dtype_t dtype)
{
    if (!fsdp2_tracing())
        return 0;
    fsdp_module_fqn(g->module, fqn, len);
    fsdp2_trace_label_set(fqn, (int)dtype);
    return 1;
}

static void trace_unlabel(int set)
{
    if (set)
        fsdp2_trace_label_set(NULL, -1);
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
    FSDP2_CHECK(fsdp2_mesh_fail(m->group->mesh, fsdp_root_get(m, r)));
    *g = m->group;
    if (!(*g)->root)
        return state_error(*g, "%s: module '%s' was sharded after its root planned its buffers",
                           what);
    return FSDP2_SUCCESS;
}

/* Makes side wait for everything enqueued on compute so far. */
static fsdp2_status_t side_waits_compute(fsdp_root_t *r, fsdp2_stream_t *side)
{
    FSDP2_CHECK(fsdp2_event_record(r->compute_mark, r->compute));
    return fsdp2_stream_wait_event(side, r->compute_mark);
}

static void set_views(fsdp_group_t *g, int b)
{
    for (size_t i = 0; i < g->num_params; i++)
        g->params[i]->unsharded = b >= 0 ? g->params[i]->unsharded_view[b] : NULL;
}

static void release(fsdp_group_t *g)
{
    trace_end_hold(&g->trace_hold);
    if (g->buffer >= 0) {
        unsharded_buffer_t *buf = fsdp_buffer(g, g->buffer);
        /* Without this record the buffer's next all-gather would not wait for its last
         * reader: the step has failed, and the hook that released it says so. */
        fsdp2_status_t status = fsdp2_event_record(buf->free, g->root->compute);
        if (status != FSDP2_SUCCESS && g->root->deferred == FSDP2_SUCCESS) {
            g->root->deferred = status;
            snprintf(g->root->deferred_message, sizeof(g->root->deferred_message), "%s",
                     fsdp2_last_error());
        }
        buf->owner = NULL;
    }
    g->buffer = -1;
    g->unshard_state = FSDP2_SHARDED;
    g->pinned = 0;
    set_views(g, -1);
}

static int in_use(const fsdp_group_t *g)
{
    return g->training_state == FSDP2_STATE_FORWARD || g->training_state == FSDP2_STATE_BACKWARD;
}

/* A ring buffer for g: a free one, else one holding parameters nobody uses now (a
 * prefetch that was not needed). -1 when every buffer is in use. */
static int pick_buffer(fsdp_root_t *r)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < r->ring_size; k++) {
            int b = (r->next_buffer + k) % r->ring_size;
            fsdp_group_t *owner = r->buffers[b].owner;
            if (owner && (pass == 0 || in_use(owner) || owner->pinned))
                continue;
            if (owner)
                release(owner);
            r->next_buffer = (b + 1) % r->ring_size;
            return b;
        }
    }
    return -1;
}

/* reshard_after_forward = N: after forward, g's rows of its block's N-way split go from
 * its unsharded buffer into its post-forward shard (on compute, where the buffer's
 * readers ran, before the buffer is released). */
static fsdp2_status_t keep_post_forward(fsdp_root_t *r, fsdp_group_t *g)
{
    const char *full = fsdp_buffer(g, g->buffer)->data;
    char *shard = g->pf_shard;
    FSDP2_CHECK(fsdp2_stream_wait_event(r->compute, g->pf_free));
    trace_token_t t = trace_begin(g, r->compute, TRACE_COPY_OUT, (uint64_t)g->pf_shard_numel * g->pe,
                                  g->pdtype);
    fsdp2_status_t status = FSDP2_SUCCESS;
    for (size_t i = 0; i < g->num_params && status == FSDP2_SUCCESS; i++) {
        const fsdp2_param_t *p = g->params[i];
        int64_t off, len;
        fsdp2_chunk_range(p->rows, g->pf_ranks, g->pf_rank, &off, &len);
        size_t row_bytes = (size_t)p->row_numel * g->pe;
        if (len > 0)
            status = fsdp2_memcpy_async(shard + (size_t)p->pf_shard_offset * g->pe,
                                        full + (size_t)p->full_offset * g->pe + (size_t)off * row_bytes,
                                        (size_t)len * row_bytes, r->compute);
    }
    fsdp2_trace_stream_end(r->compute, t);
    FSDP2_CHECK(status);
    g->pf_valid = 1;
    g->trace_pf_hold = trace_hold(g, "post-forward shard", -1, (uint64_t)g->pf_shard_numel * g->pe,
                                  TRACE_MEM_POST_FORWARD);
    return FSDP2_SUCCESS;
}

/* The backward's all-gather of a group whose post-forward shard holds its parameters:
 * over the N ranks of its block, into buffer b; the shard is free again once it ran. */
static fsdp2_status_t gather_post_forward(fsdp_root_t *r, fsdp_group_t *g, int b)
{
    char fqn[FSDP2_FQN_MAX];
    int labelled = trace_label(g, fqn, sizeof(fqn), g->pdtype);
    fsdp2_status_t status = fsdp2_all_gather_pieces_async(
        g->pf_pg, g->pf_shard, (size_t)g->pf_shard_numel * g->pe, g->pf_pieces[b],
        g->pf_piece_offsets, r->ag);
    trace_unlabel(labelled);
    FSDP2_CHECK(status);
    FSDP2_CHECK(fsdp2_event_record(g->pf_free, r->ag));
    g->pf_valid = 0;
    trace_end_hold(&g->trace_pf_hold);
    return FSDP2_SUCCESS;
}

/* The post-forward shard holds nothing of use once a step ends (the optimizer moves the
 * shards on). */
static void drop_post_forward(fsdp_group_t *g)
{
    g->pf_valid = 0;
    trace_end_hold(&g->trace_pf_hold);
}

/* g's shard cast to the compute dtype into send buffer k, on the copy-in stream: after
 * the compute stream's writes to the shard (the optimizer: compute_mark, which
 * issue_unshard has just recorded for the all-gather) and after the all-gather that
 * last sent from k; copied[k] marks it done. */
static fsdp2_status_t copy_in(fsdp_root_t *r, fsdp_group_t *g, int k)
{
    FSDP2_CHECK(fsdp2_stream_wait_event(r->ag_copy_in, r->compute_mark));
    FSDP2_CHECK(fsdp2_stream_wait_event(r->ag_copy_in, r->send_free[k]));
    trace_token_t t = trace_begin(g, r->ag_copy_in, TRACE_COPY_IN, (size_t)g->shard_numel * g->pe,
                                  g->pdtype);
    fsdp2_status_t status = fsdp2_cast_async(r->send[k], g->pdtype, g->shard->data, g->dtype,
                                             (size_t)g->shard_numel, r->ag_copy_in);
    fsdp2_trace_stream_end(r->ag_copy_in, t);
    FSDP2_CHECK(status);
    return fsdp2_event_record(r->copied[k], r->ag_copy_in);
}

/* Issues g's all-gather unless its parameters are whole or on their way. A prefetch
 * (demand 0) that finds no buffer is skipped; a demand is an error. */
static fsdp2_status_t issue_unshard(fsdp_root_t *r, fsdp_group_t *g, int demand)
{
    if (g->unshard_state != FSDP2_SHARDED)
        return FSDP2_SUCCESS;
    if (!g->shard_numel) { /* nothing to gather, no buffer to hold */
        g->unshard_state = FSDP2_UNSHARDED;
        return FSDP2_SUCCESS;
    }
    int b = g->dedicated ? FSDP_MAX_RING : pick_buffer(r);
    if (b < 0) {
        if (!demand)
            return FSDP2_SUCCESS;
        char text[160];
        snprintf(text, sizeof(text),
                 "%%s: all %d unsharded buffers are in use, none left for '%%s' (raise "
                 "unsharded_buffers in the root's options)",
                 r->ring_size);
        return state_error(g, text, "unshard");
    }
    unsharded_buffer_t *buf = fsdp_buffer(g, b);
    if (!g->alias) {
        FSDP2_CHECK(side_waits_compute(r, r->ag));
        FSDP2_CHECK(fsdp2_stream_wait_event(r->ag, buf->free));
        if (g->pf_valid) {
            FSDP2_CHECK(gather_post_forward(r, g, b));
        } else if (g->cast && g->ws == 1) {
            /* One rank, mixed precision: the cast shard is the whole parameters. */
            trace_token_t t = trace_begin(g, r->ag, TRACE_COPY_IN, (size_t)g->shard_numel * g->pe,
                                          g->pdtype);
            fsdp2_status_t status = fsdp2_cast_async(buf->data, g->pdtype, g->shard->data,
                                                     g->dtype, (size_t)g->shard_numel, r->ag);
            fsdp2_trace_stream_end(r->ag, t);
            FSDP2_CHECK(status);
        } else {
            /* Copy-in: the cast to the compute dtype on its own stream, into the send
             * buffer the all-gather before last has finished sending. */
            const void *send = g->shard->data;
            int k = -1;
            if (g->cast) {
                k = r->next_send;
                r->next_send = (k + 1) % r->sends;
                FSDP2_CHECK(copy_in(r, g, k));
                FSDP2_CHECK(fsdp2_stream_wait_event(r->ag, r->copied[k]));
                send = r->send[k];
            }
            char fqn[FSDP2_FQN_MAX];
            int labelled = trace_label(g, fqn, sizeof(fqn), g->pdtype);
            fsdp2_status_t status = fsdp2_all_gather_pieces_async(
                g->pg, send, (size_t)g->shard_numel * g->pe, g->pieces[b], g->piece_offsets, r->ag);
            trace_unlabel(labelled);
            FSDP2_CHECK(status);
            if (k >= 0)
                FSDP2_CHECK(fsdp2_event_record(r->send_free[k], r->ag));
        }
        FSDP2_CHECK(fsdp2_event_record(g->gathered, r->ag));
    }
    buf->owner = g;
    g->buffer = b;
    if (!g->alias)
        g->trace_hold = trace_hold(g, b == FSDP_MAX_RING ? "own buffer" : "unsharded",
                                   b == FSDP_MAX_RING ? -1 : b,
                                   (uint64_t)g->full_numel * g->pe, TRACE_MEM_UNSHARDED_PARAMS);
    g->unshard_state = FSDP2_UNSHARDING;
    g->all_gathers++;
    set_views(g, b);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t wait_unshard(fsdp_root_t *r, fsdp_group_t *g)
{
    if (g->unshard_state == FSDP2_UNSHARDING) {
        FSDP2_CHECK(fsdp2_stream_wait_event(r->compute, g->gathered));
        g->unshard_state = FSDP2_UNSHARDED;
    }
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
        if (targets[i] && targets[i]->root == r && !in_use(targets[i]))
            FSDP2_CHECK(issue_unshard(r, targets[i], 0));
    }
    return FSDP2_SUCCESS;
}

/* A new step starts at the root's pre_forward: the forward order just recorded becomes
 * the prediction, and modules left whole by a forward-only step are released. */
/* The one reset between steps: this step's order becomes the one to prefetch by, and
 * every group goes back to idle. An unsharded group keeps its buffer unless it was used
 * in this step (at a new step's start: a step that never finished) or reshards after
 * backward (at backward_finish). */
static void reset_step(fsdp_root_t *r, int at_finish)
{
    if (r->order_len) {
        memcpy(r->last_order, r->order, r->order_len * sizeof(*r->order));
        r->last_order_len = r->order_len;
    }
    r->order_len = 0;
    for (size_t i = 0; i < r->num_groups; i++) {
        fsdp_group_t *g = r->groups[i];
        int drop = at_finish ? g->reshard_after_backward
                            : g->training_state != FSDP2_STATE_IDLE;
        if (drop && g->unshard_state != FSDP2_SHARDED)
            release(g);
        drop_post_forward(g);
        g->training_state = FSDP2_STATE_IDLE;
        g->forward_done = 0;
    }
}

static void begin_step(fsdp_root_t *r)
{
    reset_step(r, 0);
    r->in_step = 1;
}

fsdp2_status_t fsdp_check_backward_closed(fsdp2_module_t *m, const char *what)
{
    fsdp2_module_t *top = m ? fsdp_root_module(m) : NULL;
    const fsdp_root_t *r = top && top->group ? top->group->root : NULL;
    if (!r || !r->backward_open)
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
    if (g == r->group || r->group->training_state == want)
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
    if (in_use(g))
        return state_error(g, "%s on '%s' while it is between its hooks (call post first)",
                           "pre_forward");
    FSDP2_CHECK(check_inside_root(r, g, FSDP2_STATE_FORWARD, "pre_forward"));
    if (g == r->group && r->backward_open)
        return state_error(g, "%s on the root '%s' while the last step's backward is not "
                              "finished (call fsdp2_backward_finish first)",
                           "pre_forward");
    if (g == r->group || !r->in_step) {
        fsdp2_trace_step_auto();
        begin_step(r);
    }
    if (index_of(r->order, r->order_len, g) < 0)
        r->order[r->order_len++] = g;
    fsdp2_status_t status = issue_unshard(r, g, 1);
    if (status != FSDP2_SUCCESS)
        return step_failed(r, status);
    /* In use from here on, so that its own prefetch cannot take its buffer. */
    fsdp2_training_state_t before = g->training_state;
    g->training_state = FSDP2_STATE_FORWARD;
    if (g->explicit_forward_prefetch) {
        status = prefetch(r, g->forward_prefetch, g->num_forward_prefetch);
    } else {
        long at = index_of(r->last_order, r->last_order_len, g);
        status = at >= 0 && (size_t)at + 1 < r->last_order_len
                     ? prefetch(r, &r->last_order[at + 1], 1)
                     : FSDP2_SUCCESS;
    }
    if (status == FSDP2_SUCCESS)
        status = wait_unshard(r, g);
    if (status != FSDP2_SUCCESS)
        g->training_state = before;
    else
        g->trace_slice = trace_begin(g, r->compute, TRACE_FORWARD, 0, g->pdtype);
    return step_failed(r, status);
}

fsdp2_status_t fsdp2_post_forward(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "post_forward", &g, &r));
    if (g->training_state != FSDP2_STATE_FORWARD)
        return state_error(g, "%s on '%s' without its pre_forward", "post_forward");
    FSDP2_CHECK(check_inside_root(r, g, FSDP2_STATE_FORWARD, "post_forward"));
    fsdp2_trace_stream_end(r->compute, g->trace_slice);
    g->trace_slice = TRACE_NO_TOKEN;
    g->training_state = FSDP2_STATE_AFTER_FORWARD;
    g->forward_done = 1;
    if (!g->reshard_after_forward)
        return FSDP2_SUCCESS;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (g->pf_shard && g->buffer >= 0 && !g->alias)
        status = keep_post_forward(r, g);
    release(g);
    return step_failed(r, status);
}

/* The gradient buffer for g's backward, zeroed on compute unless it holds gradients
 * accumulated without sync. */
static fsdp2_status_t take_grad_buffer(fsdp_root_t *r, fsdp_group_t *g)
{
    if (!g->grad_full_numel)
        return FSDP2_SUCCESS;
    void *data;
    int use_accumulator = g->accumulator && (g->accumulator_dirty || !g->requires_gradient_sync ||
                                             g->encloses_groups);
    if (use_accumulator) {
        g->grad_buffer = 2;
        data = g->accumulator;
        if (g->accumulator_dirty)
            goto bind;
        FSDP2_CHECK(fsdp2_stream_wait_event(r->compute, g->accumulator_free));
    } else {
        /* The next buffer of the ring, unless a backward still holds it. */
        int k = r->next_grad_buffer;
        if (r->grad_owner[k] && r->grad_owner[k] != g)
            k = 1 - k;
        if (r->grad_owner[k] && r->grad_owner[k] != g)
            return state_error(g, "%s: both gradient buffers are held by backwards still running "
                                  "(no buffer for '%s')",
                               "pre_backward");
        r->next_grad_buffer = (k + 1) % 2;
        FSDP2_CHECK(fsdp2_stream_wait_event(r->compute, r->grad_free[k]));
        r->grad_owner[k] = g;
        g->grad_buffer = k;
        data = r->grad_buffers[k];
    }
    FSDP2_CHECK(fsdp2_fill_async(data, g->pdtype, (size_t)g->grad_full_numel, 0.0, r->compute));
bind:
    for (size_t i = 0; i < g->num_params; i++) {
        fsdp2_param_t *p = g->params[i];
        p->grad = p->requires_grad ? p->grad_view[g->grad_buffer] : NULL;
    }
    g->trace_grad_hold = trace_hold(g, g->grad_buffer == 2 ? "gradient accumulator" : "gradient",
                                    g->grad_buffer == 2 ? -1 : g->grad_buffer,
                                    (uint64_t)g->grad_full_numel * g->pe,
                                    TRACE_MEM_UNSHARDED_GRADS);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_pre_backward(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "pre_backward", &g, &r));
    if (in_use(g))
        return state_error(g, "%s on '%s' while it is between its hooks (call post first)",
                           "pre_backward");
    if (!r->in_step || !g->forward_done)
        return state_error(g, "%s on '%s' before its forward in this step", "pre_backward");
    FSDP2_CHECK(check_inside_root(r, g, FSDP2_STATE_BACKWARD, "pre_backward"));
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (!g->requires_gradient_sync)
        status = fsdp_group_accumulator(g); /* planned already unless set mid-way */
    if (status == FSDP2_SUCCESS)
        status = issue_unshard(r, g, 1);
    if (status != FSDP2_SUCCESS)
        return step_failed(r, status);
    fsdp2_training_state_t before = g->training_state;
    g->training_state = FSDP2_STATE_BACKWARD; /* its prefetch must not take its buffer */
    if (g->explicit_backward_prefetch) {
        status = prefetch(r, g->backward_prefetch, g->num_backward_prefetch);
    } else {
        long at = index_of(r->order, r->order_len, g);
        status = at > 0 ? prefetch(r, &r->order[at - 1], 1) : FSDP2_SUCCESS;
    }
    if (status == FSDP2_SUCCESS)
        status = wait_unshard(r, g);
    if (status == FSDP2_SUCCESS)
        status = take_grad_buffer(r, g);
    if (status != FSDP2_SUCCESS) {
        g->training_state = before;
    } else {
        g->trace_slice = trace_begin(g, r->compute, TRACE_BACKWARD, 0, g->pdtype);
        r->backward_open = 1;
    }
    return step_failed(r, status);
}

/* chunk_cat: per rank, the padded chunks of every gradient, rank-major, into the staging
 * input, cast from the compute dtype to the reduce dtype; padding rows zero so they add
 * nothing. */
static fsdp2_status_t chunk_cat(fsdp_root_t *r, fsdp_group_t *g, const char *src)
{
    char *dst = r->rs_input;
    for (int k = 0; k < g->ws; k++) {
        char *block = dst + (size_t)k * (size_t)g->grad_shard_numel * g->re;
        for (size_t i = 0; i < g->num_params; i++) {
            const fsdp2_param_t *p = g->params[i];
            if (!p->requires_grad)
                continue;
            int64_t off, len;
            fsdp2_chunk_range(p->rows, g->ws, k, &off, &len);
            char *at = block + (size_t)p->grad_offset * g->re;
            const char *from = src + ((size_t)p->grad_full_offset + (size_t)(off * p->row_numel)) * g->pe;
            FSDP2_CHECK(fsdp2_cast_async(at, g->rdtype, from, g->pdtype,
                                         (size_t)(len * p->row_numel), r->rs));
            if (len < p->chunk_rows)
                FSDP2_CHECK(fsdp2_fill_async(at + (size_t)(len * p->row_numel) * g->re, g->rdtype,
                                             (size_t)((p->chunk_rows - len) * p->row_numel), 0.0,
                                             r->rs));
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
    return fsdp2_trace_stream_hold(r->rs, "reduce-scatter staging", &op);
}

/* The sharded gradients += the reduced ones (scaled), on the reduce-scatter stream. */
static fsdp2_status_t accumulate(fsdp_root_t *r, fsdp_group_t *g, const void *src,
                                 fsdp2_dtype_t dtype, double scale)
{
    size_t n = (size_t)g->grad_shard_numel;
    trace_token_t t = trace_begin(g, r->rs, TRACE_ACCUMULATE, n * g->elem, g->dtype);
    fsdp2_status_t status =
        fsdp2_accumulate_async(g->grad_shard->data, g->dtype, src, dtype, n, scale, r->rs);
    fsdp2_trace_stream_end(r->rs, t);
    return status;
}

static fsdp2_status_t reduce_scatter(fsdp_root_t *r, fsdp_group_t *g)
{
    const char *src = g->grad_buffer == 2 ? g->accumulator : r->grad_buffers[g->grad_buffer];
    FSDP2_CHECK(fsdp2_event_record(r->grad_ready, r->compute));
    FSDP2_CHECK(fsdp2_stream_wait_event(r->rs, r->grad_ready));
    fsdp2_reduce_t avg = FSDP2_REDUCE_AVG_INIT;
    size_t n = (size_t)g->grad_shard_numel;
    char fqn[FSDP2_FQN_MAX];
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (g->ws == 1) {
        /* The reduction over one rank is the gradient (divided by the factor if one is
         * set); the layouts match (no padding). HSDP averages it over the replicas first,
         * in the reduce dtype as FSDP2 does: in place (the buffer is ours) when that is
         * the compute dtype, else cast into the staging (planned for this case). */
        const void *reduced = src;
        fsdp2_dtype_t dtype = g->pdtype;
        if (g->replicas > 1) {
            if (g->rdtype != g->pdtype) {
                FSDP2_CHECK(fsdp2_cast_async(r->rs_input, g->rdtype, src, g->pdtype, n, r->rs));
                reduced = r->rs_input;
                dtype = g->rdtype;
            }
            int labelled = trace_label(g, fqn, sizeof(fqn), dtype);
            status = fsdp2_all_reduce_async(g->replicate, (void *)reduced, n, dtype, &avg, r->rs);
            trace_unlabel(labelled);
            FSDP2_CHECK(status);
        }
        double scale = g->reduce.op == FSDP2_REDUCE_SUM ? 1.0 / g->reduce.pre_divide : 1.0;
        FSDP2_CHECK(accumulate(r, g, reduced, dtype, scale));
        if (g->grad_buffer == 2) {
            g->accumulator_dirty = 0;
            FSDP2_CHECK(fsdp2_event_record(g->accumulator_free, r->rs));
        } else {
            FSDP2_CHECK(fsdp2_event_record(r->grad_free[g->grad_buffer], r->rs));
        }
        FSDP2_CHECK(fsdp2_event_record(r->rs_done, r->rs));
        g->reduce_scatters++;
        return FSDP2_SUCCESS;
    }
    /* The staging hold ends on every path, so a failure leaves no bytes counted. */
    trace_token_t staging = trace_staging(r, g, (size_t)g->ws * n * g->re);
    /* in place: this rank's result replaces its chunk of the staging */
    char *out = (char *)r->rs_input + (size_t)g->rank * n * g->re;
    trace_token_t t = trace_begin(g, r->rs, TRACE_COPY_OUT, (size_t)g->ws * n * g->re, g->rdtype);
    status = chunk_cat(r, g, src);
    fsdp2_trace_stream_end(r->rs, t);
    if (status == FSDP2_SUCCESS) {
        if (g->grad_buffer == 2)
            g->accumulator_dirty = 0;
        status = fsdp2_event_record(g->grad_buffer == 2 ? g->accumulator_free
                                                        : r->grad_free[g->grad_buffer],
                                    r->rs);
    }
    if (status == FSDP2_SUCCESS) {
        int labelled = trace_label(g, fqn, sizeof(fqn), g->rdtype);
        status = fsdp2_reduce_scatter_async(g->pg, r->rs_input, out, n, g->rdtype,
                                            &g->reduce, r->rs);
        /* HSDP: reduce-scatter over the shard dim, then all-reduce over the replicate dim. */
        if (status == FSDP2_SUCCESS && g->replicas > 1)
            status = fsdp2_all_reduce_async(g->replicate, out, n, g->rdtype, &avg, r->rs);
        trace_unlabel(labelled);
    }
    if (status == FSDP2_SUCCESS)
        status = accumulate(r, g, out, g->rdtype, 1.0);
    fsdp2_trace_stream_end(r->rs, staging);
    FSDP2_CHECK(status);
    FSDP2_CHECK(fsdp2_event_record(r->rs_done, r->rs));
    g->reduce_scatters++;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_post_backward(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "post_backward", &g, &r));
    if (g->training_state != FSDP2_STATE_BACKWARD)
        return state_error(g, "%s on '%s' without its pre_backward", "post_backward");
    FSDP2_CHECK(check_inside_root(r, g, FSDP2_STATE_BACKWARD, "post_backward"));
    fsdp2_trace_stream_end(r->compute, g->trace_slice);
    g->trace_slice = TRACE_NO_TOKEN;
    g->training_state = FSDP2_STATE_AFTER_BACKWARD;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (g->grad_full_numel) {
        /* Gradients in a ring buffer are always reduced now; only the accumulator may
         * keep them (sync off). */
        if (g->requires_gradient_sync || g->grad_buffer != 2)
            status = reduce_scatter(r, g);
        else
            g->accumulator_dirty = 1;
    }
    for (size_t i = 0; i < g->num_params; i++)
        g->params[i]->grad = NULL;
    if (g->grad_buffer == 0 || g->grad_buffer == 1)
        r->grad_owner[g->grad_buffer] = NULL;
    g->grad_buffer = -1;
    trace_end_hold(&g->trace_grad_hold);
    if (g->reshard_after_backward)
        release(g);
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
        return state_error(g, "%s: '%s' is not the root", "backward_finish");
    for (size_t i = 0; i < r->num_groups; i++) {
        if (in_use(r->groups[i]))
            return state_error(r->groups[i], "%s: module '%s' is still between its hooks",
                               "backward_finish");
    }
    /* A prefetch nobody used may still read shards the optimizer is about to write. */
    fsdp2_status_t status = fsdp2_event_record(r->ag_done, r->ag);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_stream_wait_event(r->compute, r->ag_done);
    if (status == FSDP2_SUCCESS && r->group->is_last_backward) {
        status = fsdp2_event_record(r->rs_done, r->rs);
        if (status == FSDP2_SUCCESS)
            status = fsdp2_stream_wait_event(r->compute, r->rs_done);
    }
    if (status != FSDP2_SUCCESS)
        return step_failed(r, status);
    reset_step(r, 1);
    r->in_step = 0;
    r->backward_open = 0;
    r->grad_owner[0] = r->grad_owner[1] = NULL;
    return step_failed(r, FSDP2_SUCCESS);
}

fsdp2_status_t fsdp2_unshard(fsdp2_module_t *m, fsdp2_event_t **done)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    if (done)
        *done = NULL;
    FSDP2_CHECK(group_of(m, "unshard", &g, &r));
    FSDP2_CHECK(step_failed(r, issue_unshard(r, g, 1)));
    g->pinned = g->buffer >= 0; /* until fsdp2_reshard or its hooks release it */
    if (done)
        *done = g->gathered;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_unshard_wait(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "unshard_wait", &g, &r));
    if (g->unshard_state == FSDP2_SHARDED)
        return state_error(g, "%s: module '%s' has no all-gather issued (call fsdp2_unshard)",
                           "unshard_wait");
    return step_failed(r, wait_unshard(r, g));
}

fsdp2_status_t fsdp2_reshard(fsdp2_module_t *m)
{
    fsdp_group_t *g;
    fsdp_root_t *r;
    FSDP2_CHECK(group_of(m, "reshard", &g, &r));
    if (in_use(g))
        return state_error(g, "%s: module '%s' is between its hooks", "reshard");
    if (g->unshard_state != FSDP2_SHARDED)
        release(g);
    return step_failed(r, FSDP2_SUCCESS);
}
