/* libfsdp2 and Open MPI in the same processes, timed in alternating blocks.
 *
 * This machine's speed moves by 2-5x for seconds at a time (the VM's CPUs are placed
 * and paused by its host), so two programs run one after the other can land in
 * different phases, and a cell's ratio says more about the phase than about the code.
 * Here every rank runs both implementations: for each operation and size, blocks of
 * calls alternate between libfsdp2 and Open MPI (the order flips every pair), each
 * block starting from an MPI_Barrier, and the ratio of a cell is the median over its
 * pairs of (MPI time / our time) per call: both halves of a pair ran within
 * milliseconds of each other, on the same CPUs, with the same buffers.
 *
 * Sizes, formulas and calls are those of bench/collectives.c and mpi_collectives.c:
 * S = the all-gather output, the reduce-scatter input, the all-reduce buffer (in
 * place; the gathers and reduce-scatters both out of place and in place, coll_ops.h);
 * a block's time is the slowest rank's mean per call; algbw = S / t, busbw =
 * algbw * (n - 1) / n (all-reduce: 2 (n - 1) / n). Ours runs on a side stream and
 * synchronizes after every call, as FSDP waits for a collective (--stream current:
 * inline on the caller).
 *
 * Built and run by bench/collectives.sh (mpicc against build/'s libfsdp2):
 *   mpirun -np N -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=P build/bench/interleaved
 *     [--min BYTES] [--max BYTES] [--pairs K] [--stream side|current] [--json FILE]
 *     [--ops all_gather,...] (a comma list of coll_ops.h's names: only those) */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp2/fsdp2.h>

#define COLL_OPS_FSDP2
#define COLL_OPS_MPI
#include "coll_ops.h"
#include "memcpy_limit.h"

#define CHECK(call)                                                                        \
    do {                                                                                   \
        fsdp2_status_t s_ = (call);                                                        \
        if (s_ != FSDP2_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, fsdp2_strerror(s_),     \
                    fsdp2_last_error());                                                   \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
        }                                                                                  \
    } while (0)

enum { IMPL_OURS, IMPL_MPI, IMPLS };
enum { PAIRS_DEFAULT = 15, PAIRS_MAX = 64 };
enum { PROBE_CALLS = 5, BLOCK_MAX_CALLS = 4000 };
#define BLOCK_MIN_S 4e-3 /* seconds a block of small calls lasts at least */

typedef struct bench {
    fsdp2_group_t *group;
    fsdp2_stream_t *stream;
    int rank, n;
    char *a, *b; /* max bytes each, shared by both implementations */
} bench_t;

static void run(bench_t *b, int impl, int op, size_t bytes)
{
    if (impl == IMPL_MPI) {
        op_mpi(op, b->a, b->b, bytes, b->n);
        return;
    }
    CHECK(op_ours(op, b->group, b->a, b->b, bytes, FSDP2_F32, sizeof(float), b->rank, b->n,
                  b->stream));
    CHECK(fsdp2_stream_synchronize(b->stream));
}

/* One block: the slowest rank's mean seconds per call over iters calls. */
static double time_block(bench_t *b, int impl, int op, size_t bytes, int iters)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        run(b, impl, op, bytes);
    double t = (MPI_Wtime() - t0) / iters, worst;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

/* Calls per block: at least a few per size, and enough that the slower implementation's
 * block lasts BLOCK_MIN_S, so that a block of small calls is not one scheduler tick (a
 * 64 KiB block of 50 calls lasted 0.3-1.5 ms, and one preempted call could set its
 * mean). The same count for both, from one short block of each; every rank agrees. */
static int block_iters(bench_t *b, int op, size_t bytes)
{
    int iters = bytes <= (1 << 16) ? 50 : bytes <= (1 << 20) ? 20 : bytes <= (1 << 24) ? 4 : 1;
    double slowest = 0;
    for (int impl = 0; impl < IMPLS; impl++) {
        double t = time_block(b, impl, op, bytes, PROBE_CALLS);
        slowest = t > slowest ? t : slowest;
    }
    double want = BLOCK_MIN_S / slowest; /* the same on every rank: time_block's maximum */
    if (want > BLOCK_MAX_CALLS)
        want = BLOCK_MAX_CALLS;
    return want > iters ? (int)want : iters;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The q-quantile (0..1) of v[0..k), interpolated between the two nearest ranks (so the
 * median of an even count is the mean of the middle two); v keeps its order. */
static double quantile(const double *v, int k, double q)
{
    double sorted[PAIRS_MAX];
    memcpy(sorted, v, (size_t)k * sizeof(*v));
    qsort(sorted, (size_t)k, sizeof(*sorted), cmp_double);
    double at = q * (k - 1);
    int lo = (int)at, hi = lo + 1 < k ? lo + 1 : lo;
    return sorted[lo] + (at - lo) * (sorted[hi] - sorted[lo]);
}

/* Every rank parses the same arguments; rank 0 says what is wrong. */
static int usage(int rank, const char *why, const char *value)
{
    if (rank == 0)
        fprintf(stderr, "interleaved: %s%s%s\nusage: interleaved [--min BYTES] [--max BYTES] "
                        "[--pairs 1..%d, default %d] [--stream side|current] [--ops LIST] "
                        "[--json FILE]\n",
                why, value ? ": " : "", value ? value : "", PAIRS_MAX, PAIRS_DEFAULT);
    MPI_Finalize();
    return 2;
}

/* A whole decimal number in [lo, hi], or -1. */
static long long parse_count(const char *text, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi)
        return -1;
    return v;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    bench_t b;
    memset(&b, 0, sizeof(b));
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.n);
    /* MPI counts are ints: the all-reduce passes every element of the buffer. */
    const long long max_limit = (long long)INT_MAX * (long long)sizeof(float);
    long long min_bytes = 4096, max_bytes = 256ll << 20, pairs = PAIRS_DEFAULT;
    const char *json_path = NULL, *stream_kind = "side";
    unsigned ops = (1u << OP_COUNT) - 1;
    for (int i = 1; i < argc; i += 2) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!value)
            return usage(b.rank, "a flag without its value", flag);
        if (strcmp(flag, "--min") == 0 || strcmp(flag, "--max") == 0) {
            long long *dst = strcmp(flag, "--min") == 0 ? &min_bytes : &max_bytes;
            if ((*dst = parse_count(value, 1, max_limit)) < 0)
                return usage(b.rank, "bytes must be a whole number up to 8 GiB", value);
        } else if (strcmp(flag, "--pairs") == 0) {
            if ((pairs = parse_count(value, 1, PAIRS_MAX)) < 0)
                return usage(b.rank, "--pairs out of range", value);
        } else if (strcmp(flag, "--stream") == 0) {
            if (strcmp(value, "side") != 0 && strcmp(value, "current") != 0)
                return usage(b.rank, "--stream is side or current", value);
            stream_kind = value;
        } else if (strcmp(flag, "--json") == 0) {
            json_path = value;
        } else if (strcmp(flag, "--ops") == 0) {
            if (!(ops = op_mask_parse(value)))
                return usage(b.rank, "--ops is a comma list of coll_ops.h's names", value);
        } else {
            return usage(b.rank, "unknown flag", flag);
        }
    }
    /* every size is rounded down to a multiple of (ranks x f32): smaller would be empty */
    if (min_bytes < (long long)sizeof(float) * b.n || max_bytes < min_bytes)
        return usage(b.rank, "want ranks x 4 <= --min <= --max", NULL);
    double limit = b.rank == 0 ? bench_memcpy_gbps() : 0;
    fsdp2_context_t *ctx;
    CHECK(fsdp2_init(NULL, &ctx));
    CHECK(fsdp2_context_world(ctx, &b.group));
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    if (strcmp(stream_kind, "current") == 0)
        CHECK(fsdp2_stream_current(cpu, &b.stream));
    else
        CHECK(fsdp2_stream_create(cpu, "bench", &b.stream));
    CHECK(fsdp2_device_alloc(cpu, (size_t)max_bytes, (void **)&b.a));
    CHECK(fsdp2_device_alloc(cpu, (size_t)max_bytes, (void **)&b.b));
    memset(b.a, 0, (size_t)max_bytes); /* fault the pages in before timing */
    memset(b.b, 0, (size_t)max_bytes);

    FILE *json = NULL;
    if (b.rank == 0) {
        printf("# libfsdp2 (stream %s) and Open MPI in the same %d processes, f32, %d "
               "alternating pairs of blocks per cell; memcpy %.2f GB/s\n",
               stream_kind, b.n, (int)pairs, limit);
        printf("%-23s %11s %10s %10s %7s %13s\n", "op", "bytes", "ours_busbw", "mpi_busbw",
               "ratio", "ratio_p25-p75");
        if (json_path && !(json = fopen(json_path, "w"))) {
            perror(json_path);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (json)
            fprintf(json, "{\"bench\": \"interleaved\", \"ranks\": %d, \"dtype\": \"f32\", "
                          "\"stream\": \"%s\", \"pairs\": %d, \"memcpy_gbps\": %.3f, "
                          "\"results\": [",
                    b.n, stream_kind, (int)pairs, limit);
    }
    int first = 1;
    for (int op = 0; op < OP_COUNT; op++) {
        if (!(ops & (1u << op)))
            continue;
        for (size_t bytes = (size_t)min_bytes; bytes <= (size_t)max_bytes; bytes *= 4) {
            size_t unit = sizeof(float) * (size_t)b.n, s = bytes / unit * unit;
            for (int impl = 0; impl < IMPLS; impl++) /* warm-up: connections, pages, caches */
                for (int i = 0; i < (s < (1 << 20) ? 20 : 2); i++)
                    run(&b, impl, op, s);
            int iters = block_iters(&b, op, s);
            double t[IMPLS][PAIRS_MAX], ratio[PAIRS_MAX];
            int k_pairs = (int)pairs;
            for (int k = 0; k < k_pairs; k++) {
                int lead = k % 2; /* who goes first flips every pair */
                t[lead][k] = time_block(&b, lead, op, s, iters);
                t[!lead][k] = time_block(&b, !lead, op, s, iters);
                ratio[k] = t[IMPL_MPI][k] / t[IMPL_OURS][k];
            }
            double factor = op_bus_factor(op, b.n);
            double ours = (double)s / quantile(t[IMPL_OURS], k_pairs, 0.5) / 1e9 * factor;
            double mpi = (double)s / quantile(t[IMPL_MPI], k_pairs, 0.5) / 1e9 * factor;
            double lo = quantile(ratio, k_pairs, 0.25), hi = quantile(ratio, k_pairs, 0.75);
            double mid = quantile(ratio, k_pairs, 0.5);
            if (b.rank != 0)
                continue;
            printf("%-23s %11zu %10.3f %10.3f %7.2f %6.2f-%-6.2f\n", op_names[op], s, ours, mpi,
                   mid, lo, hi);
            fflush(stdout);
            if (json) {
                fprintf(json, "%s\n  {\"op\": \"%s\", \"bytes\": %zu, \"iters_per_block\": %d, "
                              "\"libfsdp2_busbw\": %.4f, \"openmpi_busbw\": %.4f, "
                              "\"ratio\": %.4f, \"ratio_p25\": %.4f, \"ratio_p75\": %.4f, "
                              "\"pair_ratios\": [",
                        first ? "" : ",", op_names[op], s, iters, ours, mpi, mid, lo, hi);
                for (int k = 0; k < k_pairs; k++)
                    fprintf(json, "%s%.4f", k ? ", " : "", ratio[k]);
                fprintf(json, "]}");
            }
            first = 0;
        }
    }
    if (json) {
        fprintf(json, "\n]}\n");
        if (ferror(json) | fclose(json)) { /* a short file must not pass for a result */
            perror(json_path);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    if (strcmp(stream_kind, "current") != 0)
        CHECK(fsdp2_stream_destroy(b.stream));
    CHECK(fsdp2_device_free(cpu, b.a));
    CHECK(fsdp2_device_free(cpu, b.b));
    CHECK(fsdp2_finalize(ctx));
    MPI_Finalize();
    return 0;
}
