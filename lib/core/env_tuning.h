/* The transports' and cpu streams' constants (internal; listed in docs/environment.md,
 * "Tuning constants"). Each is part of the one env table (lib/core/env.c), so a benchmark
 * or a test can move it, but an application has no reason to: the defaults are the
 * design, and the reason for each is given here. Rows as in FSDP2_ENV_MAP
 * (core/env_internal.h). */
#ifndef FSDP2_CORE_ENV_TUNING_H
#define FSDP2_CORE_ENV_TUNING_H

/* The cpu stream's queue and its worker's idling. A queue of 1024 holds every task an
 * FSDP step enqueues ahead of a collective, so an application thread never blocks on a
 * full queue. A worker yields (64 times) before it sleeps because the next task of a
 * step usually comes within microseconds, and a futex wake-up costs more than that; a
 * waiter may run a fresh task itself (20 us) because two thread hand-offs cost more
 * than the task. Deferred wake-ups (auto) only pay where ranks outnumber CPUs, where a
 * woken worker would take the CPU from the rank that has work; the 1 ms nap bounds how
 * late such a task starts. Measured in docs/performance-collectives.md. */
#define FSDP2_ENV_TUNING_CPU_STREAM(XX) \
    XX(CPU_STREAM_DEPTH, "FSDP2_CPU_STREAM_DEPTH", INT, "1024", "4..1048576",               \
       "entries in each cpu stream's queue; enqueueing into a full queue blocks")           \
    XX(CPU_STREAM_SPIN, "FSDP2_CPU_STREAM_SPIN", INT, "64", "0..1000000",                   \
       "times an idle cpu stream worker, or a thread waiting for a cpu stream, yields the " \
       "core before it sleeps until signalled (0: sleep at once)")                          \
    XX(CPU_STREAM_CLAIM_US, "FSDP2_CPU_STREAM_CLAIM_US", INT, "20", "0..1000000",           \
       "microseconds a still-yielding cpu stream worker leaves a fresh task to a thread "   \
       "that waits for it, which then runs it itself (0: the worker takes it at once)")     \
    XX(CPU_STREAM_DEFER_WAKE, "FSDP2_CPU_STREAM_DEFER_WAKE", ENUM, "auto", "auto|on|off",   \
       "whether an enqueue may leave a napping cpu stream worker's wake-up to the "         \
       "enqueuing thread's next stream call: auto = once a shared-memory group of this "    \
       "process finds more ranks than CPUs on the host")                                    \
    XX(CPU_STREAM_NAP_US, "FSDP2_CPU_STREAM_NAP_US", INT, "1000", "10..1000000",            \
       "with deferred wake-ups, how long a cpu stream worker naps at a time: the latest a " \
       "task whose thread makes no further stream call starts")                            

/* The collectives' protocol sizes: every member of a group must have the same, because
 * they decide how many steps a collective takes; a group whose members differ fails to
 * be created on every member, naming the variable and both values. A slot of 256 KiB in
 * a ring of 4 keeps a step's bytes in cache while letting a writer run ahead of a slow
 * reader; one-step all-reduces (to 16 KiB, and at 2 ranks from 192 KiB to a slot) and the
 * fused all-reduce (from 16 MiB) are where each was measured faster
 * (docs/collectives.md). A UCX round of 1 MiB per peer keeps 4 sets of scratch small
 * while messages stay long enough for UCX's rendezvous protocol. Tests shrink these to
 * drive many steps and ring wraps with small tensors. */
#define FSDP2_ENV_TUNING_PROTOCOL(XX) \
    XX(UCX_SEGMENT_BYTES, "FSDP2_UCX_SEGMENT_BYTES", BYTES, "1048576", "4096..1073741824",   \
       "bytes per peer of one round of a reduction over UCX messages (each group keeps 4 "   \
       "sets of (ranks - 1) such buffers); every member of a group must have the same")      \
    XX(SHM_SLOT_BYTES, "FSDP2_SHM_SLOT_BYTES", BYTES, "262144", "4096..1073741824",          \
       "bytes a rank writes per step of a shared-memory collective (a multiple of 4096; at " \
       "least 64 per peer); every member of a group must have the same")                     \
    XX(SHM_SLOTS, "FSDP2_SHM_SLOTS", INT, "4", "2..64",                                      \
       "steps a shared-memory writer may run ahead of its slowest reader (its ring's "       \
       "slots); every member of a group must have the same")                                 \
    XX(SHM_ONE_STEP_MAX, "FSDP2_SHM_ONE_STEP_MAX", BYTES, "16384", "0..1073741824",          \
       "shared-memory all-reduces up to this many bytes take one step (every rank posts its" \
       " whole buffer); at most a slot; every member of a group must have the same")         \
    XX(SHM_ONE_STEP_PAIR_MIN, "FSDP2_SHM_ONE_STEP_PAIR_MIN", BYTES, "196608",                \
       "0..1073741824",                                                                      \
       "and at 2 ranks, all-reduces from this many bytes up to a slot; every member of a "   \
       "group must have the same")                                                           \
    XX(SHM_FUSED_MIN, "FSDP2_SHM_FUSED_MIN", BYTES, "16777216", "0..1099511627776",          \
       "shared-memory all-reduces from this many bytes reduce and gather in one pass over "  \
       "the slots; every member of a group must have the same")                             

/* Which transport a group uses, per rank. Shared memory (on), shareable arenas (on) and
 * single-copy collectives (on) are the fast paths on one host; off keeps the slower path
 * that works everywhere, for comparing and for finding a transport's bug. UCX peer error
 * handling is off within a host because it forces TCP or RDMA instead of shared memory,
 * and liveness there is checked by pid. 200 idle progress calls before blocking on the
 * worker's fd: a message in flight usually lands within them. */
#define FSDP2_ENV_TUNING_TRANSPORT(XX) \
    XX(UCX_ERROR_MODE, "FSDP2_UCX_ERROR_MODE", ENUM, "auto", "auto|peer|none",                 \
       "UCX peer-failure handling: auto = none within a host (shared memory; liveness "        \
       "by pid), peer across hosts (UCX reports failures; forces TCP/RDMA)")                   \
    XX(UCX_SPIN, "FSDP2_UCX_SPIN", INT, "200", "0..1000000",                                   \
       "idle UCX progress calls, each followed by a yield, before a wait blocks on the "       \
       "worker's event fd")                                                                    \
    XX(SHM, "FSDP2_SHM", ENUM, "on", "on|off",                                                 \
       "collectives of a group whose members all run on this host go through a shared-"        \
       "memory segment of the group (off: UCX messages, as across hosts)")                     \
    XX(CPU_SHARED_ALLOC, "FSDP2_CPU_SHARED_ALLOC", ENUM, "on", "on|off",                       \
       "cpu allocations of 64 KiB or more come from a memfd that the ranks on this host map, " \
       "so that shared-memory collectives read and write them in place (off: "                 \
       "posix_memalign; collectives copy through the segment's slots)")                        \
    XX(SHM_SINGLE_COPY, "FSDP2_SHM_SINGLE_COPY", ENUM, "on", "on|off",                         \
       "shared-memory all-reduces, reduce-scatters, all-gathers and broadcasts of 64 KiB or"   \
       " more read and write the ranks' buffers in place when all of them lie in the "         \
       "ranks' shareable cpu arenas (FSDP2_CPU_SHARED_ALLOC); off here: through the slots "    \
       "(the group goes single-copy only where every rank allows it)")                        

/* How a shared-memory wait idles, per rank: poll briefly (20 us) when every rank has a
 * CPU, since a peer's post usually comes that soon; yield (256 times) next, and then sleep
 * on a futex so that an oversubscribed host runs the ranks that have work. A yield that
 * took 2 us ran another thread, so the core is contended and sleeping is cheaper. A
 * sleep of 5 ms bounds how late a wait sees an abort or a timeout; a liveness check every
 * 100 ms bounds how late it sees a dead peer, at the cost of one kill(pid, 0). */
#define FSDP2_ENV_TUNING_SHM_WAIT(XX) \
    XX(SHM_SPIN_US, "FSDP2_SHM_SPIN_US", INT, "20", "0..1000000",                            \
       "microseconds a shared-memory wait polls before it yields, when the group has a CPU " \
       "per rank (0: yield at once; an oversubscribed group never polls)")                   \
    XX(SHM_WAIT_YIELDS, "FSDP2_SHM_WAIT_YIELDS", INT, "256", "0..1000000",                   \
       "times a shared-memory wait yields the core (after FSDP2_SHM_SPIN_US of polling) "    \
       "before it sleeps on a futex until the peer posts")                                   \
    XX(SHM_CONTENDED_NS, "FSDP2_SHM_CONTENDED_NS", INT, "2000", "0..1000000000",             \
       "a shared-memory wait's yield that took longer ran another thread on this core: "     \
       "with a CPU per rank, two such yields send the wait to sleep")                        \
    XX(SHM_SLEEP_MS, "FSDP2_SHM_SLEEP_MS", INT, "5", "1..1000",                              \
       "one futex sleep of a shared-memory wait (a post wakes it sooner; each wake "         \
       "re-checks for a peer's failure, an abort and the timeout)")                          \
    XX(SHM_LIVENESS_MS, "FSDP2_SHM_LIVENESS_MS", INT, "100", "1..60000",                     \
       "how often a waiting shared-memory collective checks that the peer it waits for "     \
       "still has a process: the longest a peer's death goes unseen")                       

/* How shared-memory collectives write, per rank (the values are the same either way).
 * Non-temporal stores pay off only where the written bytes would not stay cached: the
 * topology decides (auto), and outputs from 16 MiB or slots' bytes from 16 KiB are where
 * streaming starts to win. The single-copy blocks (64 KiB sums, 256 KiB copies, 16 KiB
 * paired chunks) are sized to stay in the L2 cache between the read and the write. */
#define FSDP2_ENV_TUNING_SHM_COPY(XX) \
    XX(SHM_STREAM_STORES, "FSDP2_SHM_STREAM_STORES", ENUM, "auto",                           \
       "auto|on|off|topology|learn",                                                         \
       "how a rank writes the bytes its peers read from the shared-memory slots: on = "      \
       "non-temporal stores (past the caches), off = memcpy, topology = memcpy while the "   \
       "slots a collective fills fit in half the cache all the ranks' CPUs share, learn = "  \
       "each size class tries both now and then and keeps the faster; auto = topology, or "  \
       "learn under a hypervisor or without hwloc")                                          \
    XX(SHM_STREAM_OUTPUT, "FSDP2_SHM_STREAM_OUTPUT", ENUM, "auto", "auto|on|off",            \
       "how a rank writes a shared-memory collective's output: auto = non-temporal stores "  \
       "for outputs too large to stay cached (gathers and out-of-place reduce-scatters "     \
       "from 16 MiB; never all-reduce results), on = always, off = memcpy")                  \
    XX(SHM_STREAM_OUTPUT_MIN, "FSDP2_SHM_STREAM_OUTPUT_MIN", BYTES, "16777216",              \
       "0..1099511627776",                                                                   \
       "with FSDP2_SHM_STREAM_OUTPUT=auto, the output bytes from which gathers, broadcasts " \
       "and out-of-place reduce-scatters write it with non-temporal stores (this rank's)")   \
    XX(SHM_STREAM_MIN, "FSDP2_SHM_STREAM_MIN", BYTES, "16384", "64..1073741824",             \
       "the smallest shared-memory collective whose slots may be written with non-"          \
       "temporal stores (FSDP2_SHM_STREAM_STORES); smaller ones use memcpy")                 \
    XX(SHM_DIRECT_BLOCK, "FSDP2_SHM_DIRECT_BLOCK", BYTES, "65536", "64..1073741824",         \
       "bytes a single-copy all-reduce sums before it copies them to the peers (while "      \
       "they are in cache)")                                                                 \
    XX(SHM_DIRECT_COPY, "FSDP2_SHM_DIRECT_COPY", BYTES, "262144", "64..1073741824",          \
       "bytes a single-copy gather or broadcast reads from a peer before writing them out")  \
    XX(SHM_PAIR_CHUNK, "FSDP2_SHM_PAIR_CHUNK", BYTES, "16384", "64..1073741824",             \
       "bytes of each copy in turn when the fused all-reduce pairs its copy-out with the "   \
       "next piece's copy-in")                                                              

#define FSDP2_ENV_TUNING(XX) \
    FSDP2_ENV_TUNING_CPU_STREAM(XX) FSDP2_ENV_TUNING_PROTOCOL(XX) \
    FSDP2_ENV_TUNING_TRANSPORT(XX) FSDP2_ENV_TUNING_SHM_WAIT(XX) FSDP2_ENV_TUNING_SHM_COPY(XX)

#endif
