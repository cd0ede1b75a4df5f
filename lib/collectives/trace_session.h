/* Tracing tied to a context's life: fsdp2_init starts FSDP2_TRACE, fsdp2_finalize
 * writes a trace still running on its context (lib/collectives/trace_session.c). */
#ifndef FSDP2_COLLECTIVES_TRACE_SESSION_H
#define FSDP2_COLLECTIVES_TRACE_SESSION_H

#include <fsdp2/init.h>
#include <fsdp2/status.h>

/* Starts tracing into FSDP2_TRACE when it is set (a bad path is FSDP2_ERR_INVALID_CONFIG
 * naming it). */
fsdp2_status_t fsdp2_trace_session_from_env(fsdp2_context_t *ctx);

/* Stops and writes the trace if one runs on ctx. */
fsdp2_status_t fsdp2_trace_session_end(fsdp2_context_t *ctx);

#endif
