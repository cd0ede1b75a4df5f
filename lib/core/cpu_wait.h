/* What the cpu streams' waiting policy (cpu_wait.c) takes from the layers above. */
#ifndef FSDP2_CORE_CPU_WAIT_H
#define FSDP2_CORE_CPU_WAIT_H

/* A shared-memory group found more ranks than CPUs on this host: with
 * FSDP2_CPU_STREAM_DEFER_WAKE=auto, wake-ups may be deferred from now on. */
void fsdp2_cpu_streams_note_oversubscribed(void);

#endif
