/* A group's work in traces (core/trace_internal.h): slices on the step's streams, holds
 * of the planned buffers, and its FQN as the label of its collectives. */
#include <stdio.h>

#include "fsdp/step_internal.h"

/* Tracing: a slice of g's work on stream (its FQN as the module). */
trace_token_t fsdp_trace_begin(fsdp_group_t *g, fsdp2_stream_t *stream, trace_cat_t cat,
                               uint64_t bytes, fsdp2_dtype_t dtype)
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
trace_token_t fsdp_trace_hold(fsdp_group_t *g, const char *kind, int index, uint64_t bytes,
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

void fsdp_trace_end_hold(trace_token_t *token)
{
    if (*token >= 0) {
        fsdp2_trace_host_end(*token);
        *token = TRACE_NO_TOKEN;
    }
}

/* Collectives enqueued from here on are g's, until fsdp_trace_unlabel(set) with what this
 * returned (1: a label was set). */
int fsdp_trace_label(fsdp_group_t *g, char *fqn, size_t len, fsdp2_dtype_t dtype)
{
    if (!fsdp2_tracing())
        return 0;
    fsdp_module_fqn(g->module, fqn, len);
    fsdp2_trace_label_set(fqn, (int)dtype);
    return 1;
}

void fsdp_trace_unlabel(int set)
{
    if (set)
        fsdp2_trace_label_set(NULL, -1);
}
