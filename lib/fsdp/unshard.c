/* The parameter side of the step: a group's all-gather into an unsharded buffer (one of
 * the root's ring, or its own), the copy-in cast before it (mixed precision), the
 * post-forward shard of reshard_after_forward = N, and giving the buffer back. The
 * events that order them are listed at the top of schedule.c. */
#include <stdio.h>

#include <fsdp2/kernels.h>

#include "core/error.h"
#include "fsdp/step_internal.h"

/* Makes side wait for everything enqueued on compute so far. */
static fsdp2_status_t side_waits_compute(fsdp_root_t *r, fsdp2_stream_t *side)
{
    FSDP2_CHECK(fsdp2_event_record(r->streams.compute_mark, r->streams.compute));
    return fsdp2_stream_wait_event(side, r->streams.compute_mark);
}

static void set_views(fsdp_group_t *g, int b)
{
    for (size_t i = 0; i < g->num_params; i++)
        g->params[i]->unsharded = b != FSDP_NO_BUFFER ? g->params[i]->unsharded_view[b] : NULL;
}

void fsdp_group_release(fsdp_group_t *g)
{
    fsdp_trace_end_hold(&g->trace.hold);
    if (g->step.buffer != FSDP_NO_BUFFER) {
        unsharded_buffer_t *buf = fsdp_buffer(g, g->step.buffer);
        /* Without this record the buffer's next all-gather would not wait for its last
         * reader: the step has failed, and the hook that released it says so. */
        fsdp2_status_t status = fsdp2_event_record(buf->free, g->root->streams.compute);
        if (status != FSDP2_SUCCESS && g->root->step.deferred == FSDP2_SUCCESS) {
            g->root->step.deferred = status;
            snprintf(g->root->step.deferred_message, sizeof(g->root->step.deferred_message), "%s",
                     fsdp2_last_error());
        }
        buf->owner = NULL;
    }
    g->step.buffer = FSDP_NO_BUFFER;
    g->step.unshard_state = FSDP2_SHARDED;
    g->step.pinned = 0;
    set_views(g, FSDP_NO_BUFFER);
}

int fsdp_group_in_use(const fsdp_group_t *g)
{
    return g->step.training_state == FSDP2_STATE_FORWARD ||
           g->step.training_state == FSDP2_STATE_BACKWARD;
}

/* A ring buffer for g: a free one, else one holding parameters nobody uses now (a
 * prefetch that was not needed). FSDP_NO_BUFFER when every buffer is in use. */
static int pick_buffer(fsdp_root_t *r)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < r->ring.size; k++) {
            int b = (r->ring.next + k) % r->ring.size;
            fsdp_group_t *owner = r->ring.buffers[b].owner;
            if (owner && (pass == 0 || fsdp_group_in_use(owner) || owner->step.pinned))
                continue;
            if (owner)
                fsdp_group_release(owner);
            r->ring.next = (b + 1) % r->ring.size;
            return b;
        }
    }
    return FSDP_NO_BUFFER;
}

/* reshard_after_forward = N: after forward, g's rows of its block's N-way split go from
 * its unsharded buffer into its post-forward shard (on compute, where the buffer's
 * readers ran, before the buffer is released). */
fsdp2_status_t fsdp_post_forward_keep(fsdp_root_t *r, fsdp_group_t *g)
{
    const char *full = fsdp_buffer(g, g->step.buffer)->data;
    char *shard = g->pf.shard;
    FSDP2_CHECK(fsdp2_stream_wait_event(r->streams.compute, g->pf.free));
    trace_token_t t = fsdp_trace_begin(g, r->streams.compute, TRACE_COPY_OUT,
                                       (uint64_t)g->pf.shard_numel * g->mp.pe, g->mp.pdtype);
    fsdp2_status_t status = FSDP2_SUCCESS;
    for (size_t i = 0; i < g->num_params && status == FSDP2_SUCCESS; i++) {
        const fsdp2_param_t *p = g->params[i];
        int64_t off, len;
        fsdp2_chunk_range(p->rows, g->pf.ranks, g->pf.rank, &off, &len);
        size_t row_bytes = (size_t)p->row_numel * g->mp.pe;
        if (len > 0)
            status = fsdp2_memcpy_async(shard + (size_t)p->pf_shard_offset * g->mp.pe,
                                        full + (size_t)p->full_offset * g->mp.pe +
                                            (size_t)off * row_bytes,
                                        (size_t)len * row_bytes, r->streams.compute);
    }
    fsdp2_trace_stream_end(r->streams.compute, t);
    FSDP2_CHECK(status);
    g->pf.valid = 1;
    g->trace.pf_hold =
        fsdp_trace_hold(g, "post-forward shard", -1, (uint64_t)g->pf.shard_numel * g->mp.pe,
                        TRACE_MEM_POST_FORWARD);
    return FSDP2_SUCCESS;
}

/* The backward's all-gather of a group whose post-forward shard holds its parameters:
 * over the N ranks of its block, into buffer b; the shard is free again once it ran. */
static fsdp2_status_t gather_post_forward(fsdp_root_t *r, fsdp_group_t *g, int b)
{
    char fqn[FSDP2_FQN_MAX];
    int labelled = fsdp_trace_label(g, fqn, sizeof(fqn), g->mp.pdtype);
    fsdp2_status_t status =
        fsdp2_all_gather_pieces_async(g->pf.pg, g->pf.shard, (size_t)g->pf.shard_numel * g->mp.pe,
                                      g->pf.pieces[b], g->pf.piece_offsets, r->streams.ag);
    fsdp_trace_unlabel(labelled);
    FSDP2_CHECK(status);
    FSDP2_CHECK(fsdp2_event_record(g->pf.free, r->streams.ag));
    g->pf.valid = 0;
    fsdp_trace_end_hold(&g->trace.pf_hold);
    return FSDP2_SUCCESS;
}

/* The post-forward shard holds nothing of use once a step ends (the optimizer moves the
 * shards on). */
void fsdp_post_forward_drop(fsdp_group_t *g)
{
    g->pf.valid = 0;
    fsdp_trace_end_hold(&g->trace.pf_hold);
}

/* g's shard cast to the compute dtype into send slot k, on the copy-in stream: after
 * the compute stream's writes to the shard (the optimizer: compute_mark, which
 * gather has just recorded for the all-gather) and after the all-gather that last sent
 * from the slot; its copied event marks it done. */
static fsdp2_status_t copy_in(fsdp_root_t *r, fsdp_group_t *g, int k)
{
    fsdp_send_slot_t *slot = &r->sends.slots[k];
    fsdp2_stream_t *stream = r->streams.ag_copy_in;
    FSDP2_CHECK(fsdp2_stream_wait_event(stream, r->streams.compute_mark));
    FSDP2_CHECK(fsdp2_stream_wait_event(stream, slot->free));
    trace_token_t t = fsdp_trace_begin(g, stream, TRACE_COPY_IN,
                                       (size_t)g->layout.shard_numel * g->mp.pe, g->mp.pdtype);
    fsdp2_status_t status =
        fsdp2_cast_async(slot->data, g->mp.pdtype, g->layout.shard->data, g->layout.dtype,
                         (size_t)g->layout.shard_numel, stream);
    fsdp2_trace_stream_end(stream, t);
    FSDP2_CHECK(status);
    return fsdp2_event_record(slot->copied, stream);
}

/* One rank, mixed precision: the cast shard is the whole parameters, cast straight into
 * the buffer on the all-gather stream. */
static fsdp2_status_t cast_whole(fsdp_root_t *r, fsdp_group_t *g, void *data)
{
    trace_token_t t = fsdp_trace_begin(g, r->streams.ag, TRACE_COPY_IN,
                                       (size_t)g->layout.shard_numel * g->mp.pe, g->mp.pdtype);
    fsdp2_status_t status =
        fsdp2_cast_async(data, g->mp.pdtype, g->layout.shard->data, g->layout.dtype,
                         (size_t)g->layout.shard_numel, r->streams.ag);
    fsdp2_trace_stream_end(r->streams.ag, t);
    return status;
}

/* The all-gather of the shards over the shard dim into buffer b. With a cast, the
 * copy-in runs first on its own stream, into the send slot the all-gather before last
 * has finished sending. */
static fsdp2_status_t gather_shards(fsdp_root_t *r, fsdp_group_t *g, int b)
{
    const void *send = g->layout.shard->data;
    fsdp_send_slot_t *slot = NULL;
    if (g->mp.cast) {
        int k = r->sends.next;
        r->sends.next = (k + 1) % r->sends.count;
        FSDP2_CHECK(copy_in(r, g, k));
        slot = &r->sends.slots[k];
        FSDP2_CHECK(fsdp2_stream_wait_event(r->streams.ag, slot->copied));
        send = slot->data;
    }
    char fqn[FSDP2_FQN_MAX];
    int labelled = fsdp_trace_label(g, fqn, sizeof(fqn), g->mp.pdtype);
    fsdp2_status_t status = fsdp2_all_gather_pieces_async(
        g->comm.pg, send, (size_t)g->layout.shard_numel * g->mp.pe, g->unsharded.pieces[b],
        g->unsharded.piece_offsets, r->streams.ag);
    fsdp_trace_unlabel(labelled);
    FSDP2_CHECK(status);
    return slot ? fsdp2_event_record(slot->free, r->streams.ag) : FSDP2_SUCCESS;
}

/* g's parameters into buffer b on the all-gather stream, once compute is done with the
 * shards and with the buffer's last reader; `gathered` marks them whole. */
static fsdp2_status_t gather(fsdp_root_t *r, fsdp_group_t *g, int b)
{
    unsharded_buffer_t *buf = fsdp_buffer(g, b);
    FSDP2_CHECK(side_waits_compute(r, r->streams.ag));
    FSDP2_CHECK(fsdp2_stream_wait_event(r->streams.ag, buf->free));
    if (g->pf.valid)
        FSDP2_CHECK(gather_post_forward(r, g, b));
    else if (g->mp.cast && g->comm.ws == 1)
        FSDP2_CHECK(cast_whole(r, g, buf->data));
    else
        FSDP2_CHECK(gather_shards(r, g, b));
    return fsdp2_event_record(g->unsharded.gathered, r->streams.ag);
}

fsdp2_status_t fsdp_unshard_issue(fsdp_root_t *r, fsdp_group_t *g, int demand)
{
    if (g->step.unshard_state != FSDP2_SHARDED)
        return FSDP2_SUCCESS;
    if (!g->layout.shard_numel) { /* nothing to gather, no buffer to hold */
        g->step.unshard_state = FSDP2_UNSHARDED;
        return FSDP2_SUCCESS;
    }
    int b = g->unsharded.dedicated ? FSDP_OWN_BUFFER : pick_buffer(r);
    if (b == FSDP_NO_BUFFER) {
        if (!demand)
            return FSDP2_SUCCESS;
        char text[160];
        snprintf(text, sizeof(text),
                 "%%s: all %d unsharded buffers are in use, none left for '%%s' (raise "
                 "unsharded_buffers in the root's options)",
                 r->ring.size);
        return fsdp_state_error(g, text, "unshard");
    }
    if (!g->unsharded.alias) {
        FSDP2_CHECK(gather(r, g, b));
        int own = b == FSDP_OWN_BUFFER;
        g->trace.hold =
            fsdp_trace_hold(g, own ? "own buffer" : "unsharded", own ? -1 : b,
                            (uint64_t)g->layout.full_numel * g->mp.pe, TRACE_MEM_UNSHARDED_PARAMS);
    }
    fsdp_buffer(g, b)->owner = g;
    g->step.buffer = b;
    g->step.unshard_state = FSDP2_UNSHARDING;
    g->stats.all_gathers++;
    set_views(g, b);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp_unshard_wait(fsdp_root_t *r, fsdp_group_t *g)
{
    if (g->step.unshard_state == FSDP2_UNSHARDING) {
        FSDP2_CHECK(fsdp2_stream_wait_event(r->streams.compute, g->unsharded.gathered));
        g->step.unshard_state = FSDP2_UNSHARDED;
    }
    return FSDP2_SUCCESS;
}
