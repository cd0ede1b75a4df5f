/* Timeline traces of a step: what ran on which stream, when, for which module.
 *
 * While tracing is on, the library records a slice for every forward and backward of a
 * sharded module, every copy and collective on a side stream, every optimizer step,
 * and every range the application pushes; flow arrows from each event record to the
 * waits it released; and the bytes in use per memory category. fsdp2_trace_stop writes
 * it all as a Chrome trace-event JSON file (Perfetto, chrome://tracing; format in
 * docs/tracing.md) that tools/fsdp2-trace summarises and draws.
 *
 * FSDP2_TRACE=path.json turns it on from fsdp2_init to fsdp2_finalize; the functions
 * below trace chosen steps instead. Off, each traced operation costs one relaxed atomic
 * load. Records go to a buffer of FSDP2_TRACE_EVENTS entries (default 262144 of 248
 * bytes: 62 MiB, touched only as used; allocated by the first start with that start's
 * size and kept until exit); when it is full, later records are counted as dropped,
 * reported at stop and in the file. */
#ifndef FSDP2_TRACE_H
#define FSDP2_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/export.h>
#include <fsdp2/init.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

/* Starts recording on this process; fsdp2_trace_stop writes to path. With a context of
 * several ranks every rank must call it (not a collective: nothing blocks), with the
 * same path. ctx may be NULL: the rank and world size then come from the launcher's
 * variables (fsdp2_process_info_from_env), or rank 0 of 1 without them. FSDP2_ERR_INVALID_STATE if tracing
 * is already on; FSDP2_ERR_IO if path's directory cannot be written (checked now, so a
 * long run does not fail at its end). */
FSDP2_API fsdp2_status_t fsdp2_trace_start(fsdp2_context_t *ctx, const char *path);

/* Stops recording and writes the trace. Synchronize the streams that ran traced work
 * first: operations whose end was not recorded yet are left out (and counted). With
 * several ranks each writes `path.rank<R>.json`; without a context that is all (merge
 * them with fsdp2_trace_merge). With a context of several ranks it is collective: rank 0
 * waits for every rank's word (FSDP2_TIMEOUT), merges the parts into `path` and removes
 * them, and the others wait for rank 0's result, so all return the same status. A rank
 * whose start failed still tells rank 0 at its stop (and returns
 * FSDP2_ERR_INVALID_STATE), so nobody waits out the timeout. When rank 0 cannot read a
 * part (ranks on other hosts without a shared file system) the parts stay and it says
 * so (merge them with `fsdp2-trace merge`). Files appear whole or not at all (written
 * beside and renamed). Not tracing: FSDP2_ERR_INVALID_STATE. */
FSDP2_API fsdp2_status_t fsdp2_trace_stop(fsdp2_context_t *ctx);

/* *on = 1 while recording. */
FSDP2_API fsdp2_status_t fsdp2_trace_active(int *on);

/* Marks the start of step `step` on this rank (the previous step ends here). Without
 * any call, each forward of an FSDP root begins the next step, numbered from 0. */
FSDP2_API fsdp2_status_t fsdp2_trace_step(int64_t step);

/* A range on the calling thread's compute track around application work ("loss",
 * "data"), nested like a stack (at most 32 deep); ranges still open at the stop end
 * there. name is copied. No-ops while not recording. */
FSDP2_API fsdp2_status_t fsdp2_trace_range_push(const char *name);
FSDP2_API fsdp2_status_t fsdp2_trace_range_pop(void);

/* Merges per-rank trace files (written by fsdp2_trace_stop) into one at output. Ranks
 * from one host keep their monotonic timestamps; when the parts come from several
 * hosts (different boot ids) every part moves onto the wall clock. */
FSDP2_API fsdp2_status_t fsdp2_trace_merge(const char *const *inputs, size_t n,
                                           const char *output);

FSDP2_EXTERN_C_END

#endif
