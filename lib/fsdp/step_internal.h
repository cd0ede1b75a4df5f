/* Inside the step: what the hooks (schedule.c), the parameter side of the step
 * (unshard.c) and the group's tracing (group_trace.c) share. */
#ifndef FSDP2_FSDP_STEP_INTERNAL_H
#define FSDP2_FSDP_STEP_INTERNAL_H

#include "core/trace_internal.h"
#include "fsdp/fsdp_internal.h"

/* schedule.c: FSDP2_ERR_INVALID_STATE from fmt, which takes `what` and then g's module
 * FQN ("(root)" for the root). */
fsdp2_status_t fsdp_state_error(const fsdp_group_t *g, const char *fmt, const char *what);

/* unshard.c */
/* Issues g's all-gather into an unsharded buffer unless its parameters are whole or on
 * their way. A prefetch (demand 0) that finds no buffer is skipped; a demand is an
 * error. */
fsdp2_status_t fsdp_unshard_issue(fsdp_root_t *r, fsdp_group_t *g, int demand);
/* Makes compute wait for g's all-gather, if one is on its way. */
fsdp2_status_t fsdp_unshard_wait(fsdp_root_t *r, fsdp_group_t *g);
/* Gives back g's unsharded buffer (its free event recorded on compute; a failure to
 * record is kept in the root's step.deferred): g is sharded again. */
void fsdp_group_release(fsdp_group_t *g);
/* reshard_after_forward = N: after forward, g's rows of its block's N-way split go from
 * its unsharded buffer into its post-forward shard, on compute. */
fsdp2_status_t fsdp_post_forward_keep(fsdp_root_t *r, fsdp_group_t *g);
/* The post-forward shard holds nothing of use once a step ends. */
void fsdp_post_forward_drop(fsdp_group_t *g);

/* group_trace.c: g's work in traces; each a no-op while tracing is off. */
/* A slice of g's work on stream (its FQN as the module). */
trace_token_t fsdp_trace_begin(fsdp_group_t *g, fsdp2_stream_t *stream, trace_cat_t cat,
                               uint64_t bytes, fsdp2_dtype_t dtype);
/* g holds `bytes` of a planned buffer from now on: on the track of buffer `index` of
 * `kind`, or (index -1) of g's own. */
trace_token_t fsdp_trace_hold(fsdp_group_t *g, const char *kind, int index, uint64_t bytes,
                              trace_mem_t mem);
/* Ends a hold (or nothing for TRACE_NO_TOKEN) and clears the token. */
void fsdp_trace_end_hold(trace_token_t *token);
/* Collectives enqueued from here on are g's, until fsdp_trace_unlabel(set) with what
 * this returned (1: a label was set); fqn (len bytes) holds the label meanwhile. */
int fsdp_trace_label(fsdp_group_t *g, char *fqn, size_t len, fsdp2_dtype_t dtype);
void fsdp_trace_unlabel(int set);

#endif
