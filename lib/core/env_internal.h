/* Internal access to the validated environment table (lib/core/env.c). */
#ifndef FSDP2_CORE_ENV_INTERNAL_H
#define FSDP2_CORE_ENV_INTERNAL_H

#include <stdint.h>

#include <fsdp2/env.h>

/* XX(id, variable, kind, default, accepted, help). kind: INT (accepted = "min..max"),
 * SECONDS (a positive decimal, accepted = "min..max"), BYTES (a whole number with an
 * optional K, M, G or T suffix for KiB .. TiB, accepted = "min..max" in bytes), ENUM
 * (accepted = "a|b|c"), LIST (comma separated words from accepted = "a|b|c", or "all"). */
#define FSDP2_ENV_MAP(XX)                                                                  \
    XX(LOG_LEVEL, "FSDP2_LOG_LEVEL", ENUM, "warn", "error|warn|info|debug|trace",          \
       "how much libfsdp2 prints to stderr")                                               \
    XX(LOG_SUBSYS, "FSDP2_LOG_SUBSYS", LIST, "all",                                        \
       "init|core|stream|mesh|coll|fsdp|ckpt|optim|text", "which subsystems log (comma list)") \
    XX(TIMEOUT, "FSDP2_TIMEOUT", SECONDS, "300", "0.001..604800",                          \
       "seconds before a blocked collective or rendezvous fails with a timeout")           \
    XX(CPU_STREAM_DEPTH, "FSDP2_CPU_STREAM_DEPTH", INT, "1024", "4..1048576",              \
       "entries in each cpu stream's queue; enqueueing into a full queue blocks")          \
    XX(CPU_STREAM_SPIN, "FSDP2_CPU_STREAM_SPIN", INT, "64", "0..1000000",                   \
       "times an idle cpu stream worker, or a thread waiting for a cpu stream, yields the " \
       "core before it sleeps until signalled (0: sleep at once)")                         \
    XX(CPU_STREAM_CLAIM_US, "FSDP2_CPU_STREAM_CLAIM_US", INT, "20", "0..1000000",           \
       "microseconds a still-yielding cpu stream worker leaves a fresh task to a thread "   \
       "that waits for it, which then runs it itself (0: the worker takes it at once)")     \
    XX(CPU_STREAM_DEFER_WAKE, "FSDP2_CPU_STREAM_DEFER_WAKE", ENUM, "auto", "auto|on|off",    \
       "whether an enqueue may leave a napping cpu stream worker's wake-up to the "         \
       "enqueuing thread's next stream call: auto = once a shared-memory group of this "    \
       "process finds more ranks than CPUs on the host")                                  \
    XX(CPU_STREAM_NAP_US, "FSDP2_CPU_STREAM_NAP_US", INT, "1000", "10..1000000",              \
       "with deferred wake-ups, how long a cpu stream worker naps at a time: the latest a " \
       "task whose thread makes no further stream call starts")                            \
    XX(CPU_STREAM_BLOCKING, "FSDP2_CPU_STREAM_BLOCKING", ENUM, "off", "off|on",               \
       "on: a task an application thread puts on a cpu side stream has run when its "      \
       "enqueue returns, which returns its failure, as with CUDA_LAUNCH_BLOCKING=1")        \
    XX(UCX_ERROR_MODE, "FSDP2_UCX_ERROR_MODE", ENUM, "auto", "auto|peer|none",              \
       "UCX peer-failure handling: auto = none within a host (shared memory; liveness "     \
       "by pid), peer across hosts (UCX reports failures; forces TCP/RDMA)")                \
    XX(UCX_SEGMENT_BYTES, "FSDP2_UCX_SEGMENT_BYTES", BYTES, "1048576", "4096..1073741824",     \
       "bytes per peer of one round of a reduction over UCX messages (each group keeps 4 "  \
       "sets of (ranks - 1) such buffers); every member of a group must have the same")    \
    XX(UCX_SPIN, "FSDP2_UCX_SPIN", INT, "200", "0..1000000",                                  \
       "idle UCX progress calls, each followed by a yield, before a wait blocks on the "    \
       "worker's event fd")                                                                 \
    XX(SHM, "FSDP2_SHM", ENUM, "on", "on|off",                                              \
       "collectives of a group whose members all run on this host go through a shared-"     \
       "memory segment of the group (off: UCX messages, as across hosts)")                 \
    XX(CPU_SHARED_ALLOC, "FSDP2_CPU_SHARED_ALLOC", ENUM, "on", "on|off",                   \
       "cpu allocations of 64 KiB or more come from a memfd that the ranks on this host map, " \
       "so that shared-memory collectives read and write them in place (off: "             \
       "posix_memalign; collectives copy through the segment's slots)")                    \
    XX(SHM_STREAM_STORES, "FSDP2_SHM_STREAM_STORES", ENUM, "auto",                           \
       "auto|on|off|topology|learn",                                                        \
       "how a rank writes the bytes its peers read from the shared-memory slots: on = "     \
       "non-temporal stores (past the caches), off = memcpy, topology = memcpy while the "  \
       "slots a collective fills fit in half the cache all the ranks' CPUs share, learn = " \
       "each size class tries both now and then and keeps the faster; auto = topology, or " \
       "learn under a hypervisor or without hwloc")                                         \
    XX(SHM_STREAM_OUTPUT, "FSDP2_SHM_STREAM_OUTPUT", ENUM, "auto", "auto|on|off",           \
       "how a rank writes a shared-memory collective's output: auto = non-temporal stores " \
       "for outputs too large to stay cached (gathers and out-of-place reduce-scatters "    \
       "from 16 MiB; never all-reduce results), on = always, off = memcpy")                 \
    XX(SHM_STREAM_OUTPUT_MIN, "FSDP2_SHM_STREAM_OUTPUT_MIN", BYTES, "16777216",              \
       "0..1099511627776",                                                                  \
       "with FSDP2_SHM_STREAM_OUTPUT=auto, the output bytes from which gathers, broadcasts " \
       "and out-of-place reduce-scatters write it with non-temporal stores (this rank's)")  \
    XX(SHM_SLOT_BYTES, "FSDP2_SHM_SLOT_BYTES", BYTES, "262144", "4096..1073741824",           \
       "bytes a rank writes per step of a shared-memory collective (a multiple of 4096; at " \
       "least 64 per peer); every member of a group must have the same")                   \
    XX(SHM_SLOTS, "FSDP2_SHM_SLOTS", INT, "4", "2..64",                                       \
       "steps a shared-memory writer may run ahead of its slowest reader (its ring's "     \
       "slots); every member of a group must have the same")                               \
    XX(SHM_ONE_STEP_MAX, "FSDP2_SHM_ONE_STEP_MAX", BYTES, "16384", "0..1073741824",           \
       "shared-memory all-reduces up to this many bytes take one step (every rank posts its"\
       " whole buffer); at most a slot; every member of a group must have the same")       \
    XX(SHM_ONE_STEP_PAIR_MIN, "FSDP2_SHM_ONE_STEP_PAIR_MIN", BYTES, "196608",                 \
       "0..1073741824",                                                                     \
       "and at 2 ranks, all-reduces from this many bytes up to a slot; every member of a "  \
       "group must have the same")                                                         \
    XX(SHM_FUSED_MIN, "FSDP2_SHM_FUSED_MIN", BYTES, "16777216", "0..1099511627776",           \
       "shared-memory all-reduces from this many bytes reduce and gather in one pass over " \
       "the slots; every member of a group must have the same")                            \
    XX(SHM_SPIN_US, "FSDP2_SHM_SPIN_US", INT, "20", "0..1000000",                            \
       "microseconds a shared-memory wait polls before it yields, when the group has a CPU " \
       "per rank (0: yield at once; an oversubscribed group never polls)")                  \
    XX(SHM_WAIT_YIELDS, "FSDP2_SHM_WAIT_YIELDS", INT, "256", "0..1000000",                  \
       "times a shared-memory wait yields the core (after FSDP2_SHM_SPIN_US of polling) "   \
       "before it sleeps on a futex until the peer posts")                                 \
    XX(SHM_CONTENDED_NS, "FSDP2_SHM_CONTENDED_NS", INT, "2000", "0..1000000000",              \
       "a shared-memory wait's yield that took longer ran another thread on this core: "    \
       "with a CPU per rank, two such yields send the wait to sleep")                       \
    XX(SHM_SLEEP_MS, "FSDP2_SHM_SLEEP_MS", INT, "5", "1..1000",                               \
       "one futex sleep of a shared-memory wait (a post wakes it sooner; each wake "        \
       "re-checks for a peer's failure, an abort and the timeout)")                        \
    XX(SHM_LIVENESS_MS, "FSDP2_SHM_LIVENESS_MS", INT, "100", "1..60000",                      \
       "how often a waiting shared-memory collective checks that the peer it waits for "    \
       "still has a process: the longest a peer's death goes unseen")                      \
    XX(SHM_DIRECT_BLOCK, "FSDP2_SHM_DIRECT_BLOCK", BYTES, "65536", "64..1073741824",          \
       "bytes a single-copy all-reduce sums before it copies them to the peers (while "     \
       "they are in cache)")                                                                \
    XX(SHM_DIRECT_COPY, "FSDP2_SHM_DIRECT_COPY", BYTES, "262144", "64..1073741824",           \
       "bytes a single-copy gather or broadcast reads from a peer before writing them out")  \
    XX(SHM_PAIR_CHUNK, "FSDP2_SHM_PAIR_CHUNK", BYTES, "16384", "64..1073741824",              \
       "bytes of each copy in turn when the fused all-reduce pairs its copy-out with the "  \
       "next piece's copy-in")                                                              \
    XX(SHM_STREAM_MIN, "FSDP2_SHM_STREAM_MIN", BYTES, "16384", "64..1073741824",              \
       "the smallest shared-memory collective whose slots may be written with non-"        \
       "temporal stores (FSDP2_SHM_STREAM_STORES); smaller ones use memcpy")               \
    XX(SHM_SINGLE_COPY, "FSDP2_SHM_SINGLE_COPY", ENUM, "on", "on|off",                     \
       "shared-memory all-reduces, reduce-scatters, all-gathers and broadcasts of 64 KiB or" \
       " more read and write the ranks' buffers in place when all of them lie in the "       \
       "ranks' shareable cpu arenas (FSDP2_CPU_SHARED_ALLOC); off here: through the slots " \
       "(the group goes single-copy only where every rank allows it)")                     \
    XX(TRACE_EVENTS, "FSDP2_TRACE_EVENTS", INT, "262144", "1024..67108864",                 \
       "records in the trace buffer (248 bytes each; allocated when tracing first starts, kept)") \
    XX(CPU_MEMORY_LIMIT, "FSDP2_CPU_MEMORY_LIMIT", BYTES, "0", "0..1125899906842624",       \
       "the cpu device's capacity for libfsdp2's allocator, as a GPU's memory size: an "    \
       "allocation past it fails, and an FSDP plan that does not fit is refused before "    \
       "step 1 (0: no limit)")                                                             \
    XX(STORE_BIND, "FSDP2_STORE_BIND", ENUM, "told", "told|any",                            \
       "where rank 0's rendezvous store listens: told = only on the address the ranks were "\
       "told (MASTER_ADDR; loopback for a job on one host), any = every interface")     \
    XX(FAULT_KIND, "FSDP2_FAULT_KIND", ENUM, "none", "none|alloc|enqueue|collective|io",     \
       "a test aid: the kind of failure point FSDP2_FAULT_AT counts (allocations, stream "   \
       "enqueues, collectives as they are enqueued, checkpoint reads and writes)")         \
    XX(FAULT_AT, "FSDP2_FAULT_AT", INT, "0", "0..1000000000000",                            \
       "a test aid: the Nth point of FSDP2_FAULT_KIND in this process fails as the real "   \
       "failure would (0: none)")                                                          \
    XX(FAULT_RANK, "FSDP2_FAULT_RANK", INT, "-1", "-1..1048575",                            \
       "a test aid: only the process of this rank (RANK, OMPI_COMM_WORLD_RANK, "          \
       "SLURM_PROCID or PMI_RANK) injects the fault (-1: every process)")

typedef enum fsdp2_env_id {
#define FSDP2_ENV_ENUM_(id, var, kind, def, accepted, help) FSDP2_ENV_##id,
    FSDP2_ENV_MAP(FSDP2_ENV_ENUM_)
#undef FSDP2_ENV_ENUM_
    FSDP2_ENV_COUNT
} fsdp2_env_id_t;

/* The variable's validated value; the default when unset or when the table failed to
 * validate (fsdp2_env_init reports that). For ENUM: the index into accepted; for LIST:
 * a bit mask over accepted's words; for SECONDS: milliseconds; for BYTES: bytes. */
int64_t fsdp2_env_int(fsdp2_env_id_t id);

/* Reads the environment again (tests only: not thread-safe against concurrent users). */
fsdp2_status_t fsdp2_env_reload(void);

#endif
