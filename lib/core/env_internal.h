/* Internal access to the validated environment table (lib/core/env.c). */
#ifndef FSDP2_CORE_ENV_INTERNAL_H
#define FSDP2_CORE_ENV_INTERNAL_H

#include <stdint.h>

#include <fsdp2/env.h>
#include <fsdp2/status.h>

#include "core/env_tuning.h"

/* Every FSDP2_ variable the library reads, as rows XX(id, variable, kind, default,
 * accepted, help). kind: INT (a decimal integer, accepted = "min..max"), SECONDS (a
 * positive decimal, accepted = "min..max"), BYTES (a whole number with an optional K, M,
 * G or T suffix for KiB .. TiB, accepted = "min..max" in bytes), ENUM (accepted =
 * "a|b|c"), LIST (comma separated words from accepted = "a|b|c", or "all"), PATH (any
 * text; its user checks it), SECRET (any text, never logged or described).
 *
 * Three parts, each a section of docs/environment.md (a test keeps the two alike):
 * what a user sets (FSDP2_ENV_SETTINGS), what fsdp2run and tests set
 * (FSDP2_ENV_TOOLS), and the transports' tuning constants (FSDP2_ENV_TUNING, in
 * core/env_tuning.h with their reasons). Variables that belong to other programs (RANK,
 * MASTER_ADDR, SLURM_*, CUDA_VISIBLE_DEVICES, UCX_*) are read where they are used, as
 * those programs define them. */
#define FSDP2_ENV_SETTINGS(XX) \
    XX(LOG_LEVEL, "FSDP2_LOG_LEVEL", ENUM, "warn", "error|warn|info|debug|trace",                 \
       "how much libfsdp2 prints to stderr")                                                      \
    XX(LOG_SUBSYS, "FSDP2_LOG_SUBSYS", LIST, "all",                                               \
       "init|core|stream|mesh|coll|fsdp|ckpt|optim|text|nn",                                      \
       "which subsystems log (comma list)")                                                       \
    XX(TIMEOUT, "FSDP2_TIMEOUT", SECONDS, "300", "0.001..604800",                                 \
       "seconds before a blocked collective or rendezvous fails with a timeout")                  \
    XX(CPU_MEMORY_LIMIT, "FSDP2_CPU_MEMORY_LIMIT", BYTES, "0", "0..1125899906842624",             \
       "the cpu device's capacity for libfsdp2's allocator, as a GPU's memory size: an "          \
       "allocation past it fails, and an FSDP plan that does not fit is refused before "          \
       "step 1 (0: no limit)")                                                                    \
    XX(CPU_STREAM_BLOCKING, "FSDP2_CPU_STREAM_BLOCKING", ENUM, "off", "off|on",                   \
       "on: a task an application thread puts on a cpu side stream has run when its "             \
       "enqueue returns, which returns its failure, as with CUDA_LAUNCH_BLOCKING=1")              \
    XX(TRACE_EVENTS, "FSDP2_TRACE_EVENTS", INT, "262144", "1024..67108864",                       \
       "records in the trace buffer (248 bytes each; allocated when tracing first starts, kept)") \
    XX(STORE_BIND, "FSDP2_STORE_BIND", ENUM, "told", "told|any",                                  \
       "where rank 0's rendezvous store listens: told = only on the address the ranks were "      \
       "told (MASTER_ADDR; loopback for a job on one host), any = every interface")               \
    XX(TRACE, "FSDP2_TRACE", PATH, "", "a path",                                                  \
       "fsdp2_init traces and fsdp2_finalize writes the merged trace to this file")               \
    XX(STORE_SECRET, "FSDP2_STORE_SECRET", SECRET, "", "bytes",                                   \
       "the job's secret, with which the ranks and the rendezvous store prove themselves")        \
    XX(STORE_SECRET_FILE, "FSDP2_STORE_SECRET_FILE", PATH, "", "a path",                          \
       "a file of mode 0600 holding the job's secret (when FSDP2_STORE_SECRET is unset)")         \
    XX(CUDA_MODULE, "FSDP2_CUDA_MODULE", PATH, "", "a path",                                      \
       "the CUDA module to load instead of libfsdp2-cuda.so beside libfsdp2.so")                  \
    XX(NN_BF16_GEMM, "FSDP2_NN_BF16_GEMM", ENUM, "auto", "auto|on|off",                           \
       "whether the nn layers' GEMMs with bf16 weights, and attention's under bf16 compute, "     \
       "take bf16 operands (summing in f32): auto = where oneDNN has bf16 matmul kernels for "    \
       "the CPU, on = everywhere (emulated in f32 elsewhere), off = f32 operands")

#define FSDP2_ENV_TOOLS(XX) \
    XX(FAULT_KIND, "FSDP2_FAULT_KIND", ENUM, "none", "none|alloc|enqueue|collective|io",   \
       "a test aid: the kind of failure point FSDP2_FAULT_AT counts (allocations, stream " \
       "enqueues, collectives as they are enqueued, checkpoint reads and writes)")         \
    XX(FAULT_AT, "FSDP2_FAULT_AT", INT, "0", "0..1000000000000",                           \
       "a test aid: the Nth point of FSDP2_FAULT_KIND in this process fails as the real "  \
       "failure would (0: none)")                                                          \
    XX(FAULT_RANK, "FSDP2_FAULT_RANK", INT, "-1", "-1..1048575",                           \
       "a test aid: only the process of this rank (RANK, OMPI_COMM_WORLD_RANK, "           \
       "SLURM_PROCID or PMI_RANK) injects the fault (-1: every process)")                  \
    XX(RUN_REPORT_FD, "FSDP2_RUN_REPORT_FD", INT, "-1", "-1..1048576",                            \
       "set by fsdp2run: the pipe on which a rank says whether its first group failure was "      \
       "its own or a peer's (-1: none)")                                                         

#define FSDP2_ENV_MAP(XX) FSDP2_ENV_SETTINGS(XX) FSDP2_ENV_TOOLS(XX) FSDP2_ENV_TUNING(XX)

typedef enum fsdp2_env_id {
#define FSDP2_ENV_ENUM_(id, var, kind, def, accepted, help) FSDP2_ENV_##id,
    FSDP2_ENV_MAP(FSDP2_ENV_ENUM_)
#undef FSDP2_ENV_ENUM_
    FSDP2_ENV_COUNT
} fsdp2_env_id_t;

/* The variable's validated value; the default when unset or when the table failed to
 * validate (fsdp2_env_init reports that). For ENUM: the index into accepted; for LIST:
 * a bit mask over accepted's words; for SECONDS: milliseconds; for BYTES: bytes; for
 * PATH and SECRET: whether it is set to a non-empty text. */
int64_t fsdp2_env_int(fsdp2_env_id_t id);

/* A PATH or SECRET variable's text as read (kept until the next fsdp2_env_reload), or
 * NULL when unset or empty. */
const char *fsdp2_env_text(fsdp2_env_id_t id);

/* The one integer syntax for every variable the library reads, its own and other
 * programs' (RANK, SLURM_NNODES, ...): decimal digits, a '-' only before a negative
 * number, nothing else (no space, no '+', no suffix), within lo..hi. A failure is
 * FSDP2_ERR_INVALID_CONFIG naming var, the text and the range. */
fsdp2_status_t fsdp2_env_parse_int(const char *var, const char *text, int64_t lo, int64_t hi,
                                   int64_t *out);

/* The same syntax without an error message (for code that runs while the table is
 * read, where fsdp2_error would wait for it): 1 and *out set when text is valid. */
int fsdp2_env_decimal(const char *text, int64_t lo, int64_t hi, int64_t *out);

/* Reads the environment again (tests only: not thread-safe against concurrent users). */
fsdp2_status_t fsdp2_env_reload(void);

#endif
