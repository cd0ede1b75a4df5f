/* What both example programs (examples/fashion_mnist, examples/lm) share: exiting on
 * (or returning) a failed library call, the clock, the command line's flag tables and
 * number parsing, the GEMM threads of a rank, the mesh a layout flag asks for, and sums
 * over the world. A program's helpers, not the library's: they print and exit on bad
 * input. */
#ifndef EXAMPLES_COMMON_H
#define EXAMPLES_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include <fsdp2/fsdp2.h>

/* A failed library call ends the program with the library's message (status 1). */
#define CHECK(call)                                                                        \
    do {                                                                                   \
        fsdp2_status_t s_ = (call);                                                        \
        if (s_ != FSDP2_SUCCESS) {                                                         \
            fprintf(stderr, "error: %s: %s\n", fsdp2_strerror(s_), fsdp2_last_error());    \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* A failed library call returns its status from a function that returns one. */
#define TRY(call)                                                                          \
    do {                                                                                   \
        fsdp2_status_t s_ = (call);                                                        \
        if (s_ != FSDP2_SUCCESS)                                                           \
            return s_;                                                                     \
    } while (0)

/* Seconds on the monotonic clock. */
double example_now(void);

/* ---- the command line ---- */

typedef enum example_flag_kind {
    EXAMPLE_SWITCH, /* no value: *(int *)to = 1 */
    EXAMPLE_STRING, /* *(const char **)to = the value (argv's own string) */
    EXAMPLE_INT,    /* *(int *)to = an integer in lo..hi */
    EXAMPLE_LONG,   /* *(long *)to = an integer in lo..hi */
    EXAMPLE_REAL,   /* *(double *)to = a finite number >= 0 */
    EXAMPLE_CALL,   /* call(value, to): the flag's own parsing */
} example_flag_kind_t;

/* One flag of a table that ends with a NULL name. Two entries may share a target (an
 * alias); `given`, when set, becomes 1 when the flag is on the command line. */
typedef struct example_flag {
    const char *name;
    example_flag_kind_t kind;
    void *to;
    long lo, hi;
    void (*call)(const char *value, void *to);
    int *given;
} example_flag_t;

/* A table's entries: a switch or a string, an integer in lo..hi, the flag's own parsing,
 * and the end. */
#define EXAMPLE_FLAG(name_, kind_, to_) {.name = (name_), .kind = (kind_), .to = (to_)}
#define EXAMPLE_RANGE(name_, kind_, to_, lo_, hi_)                                         \
    {.name = (name_), .kind = (kind_), .to = (to_), .lo = (lo_), .hi = (hi_)}
#define EXAMPLE_CALLED(name_, call_, to_)                                                  \
    {.name = (name_), .kind = EXAMPLE_CALL, .to = (to_), .call = (call_)}
#define EXAMPLE_FLAGS_END {.name = NULL}

/* usage(prog, bad) prints the usage (after "error: bad argument 'bad'" when bad is set)
 * and exits with status 2; with usage_after_bad_value a bad number's message is
 * followed by the usage, else the program exits 2 after the message alone. */
typedef struct example_cli {
    void (*usage)(const char *prog, const char *bad);
    int usage_after_bad_value;
} example_cli_t;

/* Parses argv against the table: --help and -h print the usage; an unknown flag or a
 * missing value is a bad argument; values are checked as the kinds say. */
void example_parse_flags(int argc, char **argv, const example_flag_t *flags,
                         const example_cli_t *cli);

/* An integer in lo..hi, or the message "error: FLAG TEXT is not an integer in lo..hi"
 * and status 2 (exit). */
long example_number(const char *flag, const char *text, long lo, long hi);
/* A finite number >= 0, or "error: FLAG TEXT is not a non-negative number" and exit 2. */
double example_real(const char *flag, const char *text);

/* ---- the rank's share of the host ---- */

/* The GEMM threads of a rank: the CPUs it is bound to when a launcher bound it to fewer
 * than the online ones (bound_cpus < online_cpus), else the online CPUs shared among
 * the host's local_ranks; at least 1. bound_cpus <= 0: unknown (not bound). */
int example_threads_for(int bound_cpus, long online_cpus, int local_ranks);
/* The same for this process: sched_getaffinity's count and the online CPUs. */
int example_threads(int local_ranks);

/* ---- the layout ---- */

/* The mesh of a layout flag: fsdp2_init's world mesh (FSDP), --hsdp's [nodes, local
 * ranks], or --no-shard's [ws, 1]: every rank holds the whole parameters (a shard dim of
 * one rank gathers nothing) and FSDP averages the gradients with the replicas'
 * all-reduce, in the shard options' reduce dtype (DDP). The context owns the mesh. */
void example_mesh(fsdp2_context_t *ctx, int no_shard, int hsdp, fsdp2_mesh_t **mesh);

/* v[0..n) summed over the world, in place (collective). */
void example_world_sum(fsdp2_group_t *world, fsdp2_stream_t *current, double *v, int n);

#endif
