/* Collective bandwidth, as nccl-tests defines it, for libfsdp2's ucx backend.
 *
 * For each operation and size S (bytes: the all-gather output, the reduce-scatter input,
 * the all-reduce buffer): time per call t (the slowest rank's mean over the timed
 * iterations, after warm-up, each iteration synchronized), algbw = S / t, and
 * busbw = algbw * (n - 1) / n for all-gather and reduce-scatter, * 2 (n - 1) / n for
 * all-reduce; the gathers and reduce-scatters out of place and in place (coll_ops.h).
 * Rank 0 prints a table and writes JSON; bench/collectives.sh runs this and Open MPI's
 * twin (bench/mpi_collectives.c) and prints the ratios.
 *
 * Two limits go with it: one thread's memcpy (rank 0, before the others start), and
 * what all ranks read at once: each sums its own --max bytes (from 64 MiB), started
 * together, best of three, bytes of all per second until the slowest is done. A
 * reduce-scatter must read every rank's input once, n * S bytes, so its busbw is at
 * most (n - 1) / n^2 of that (docs/performance-collectives.md, "What both CPUs can
 * read").
 *
 * Run under a launcher: fsdp2run --nproc-per-node N build/bench/bench_collectives
 *   [--min BYTES] [--max BYTES] [--dtype f32|bf16] [--stream side|current] [--json FILE]
 *   [--ops all_gather,reduce_scatter,...] (a comma list of coll_ops.h's names: only
 *   those) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp2/fsdp2.h>

#define COLL_OPS_FSDP2
#include "coll_ops.h"
#include "memcpy_limit.h"

#define CHECK(call)                                                                        \
    do {                                                                                   \
        fsdp2_status_t s_ = (call);                                                        \
        if (s_ != FSDP2_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, fsdp2_strerror(s_),     \
                    fsdp2_last_error());                                                   \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bench {
    fsdp2_group_t *group;
    fsdp2_stream_t *stream;
    int rank, n;
    fsdp2_dtype_t dtype;
    size_t esize;
    char *a, *b; /* max bytes each */
} bench_t;

static void run_op(bench_t *b, int op, size_t bytes)
{
    CHECK(op_ours(op, b->group, b->a, b->b, bytes, b->dtype, b->esize, b->rank, b->n, b->stream));
    CHECK(fsdp2_stream_synchronize(b->stream));
}

/* The largest of every rank's t. */
static double slowest(bench_t *b, double t)
{
    /* an all-reduce of the times, each in its own slot, then max by hand */
    double *all = calloc((size_t)b->n, sizeof(double));
    if (!all) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    all[b->rank] = t;
    CHECK(fsdp2_all_reduce_async(b->group, all, (size_t)b->n, FSDP2_F64, NULL, b->stream));
    CHECK(fsdp2_stream_synchronize(b->stream));
    double worst = 0;
    for (int r = 0; r < b->n; r++)
        worst = all[r] > worst ? all[r] : worst;
    free(all);
    return worst;
}

/* GB/s read by all ranks at once, each summing `bytes` of its own buffer a (best of
 * three); 0 below 64 MiB, which the caches would flatter. */
static double read_all_gbps(bench_t *b, size_t bytes)
{
    if (bytes < ((size_t)64 << 20))
        return 0;
    double best = 0;
    static volatile unsigned long long sink; /* keeps the sums */
    for (int i = 0; i < 3; i++) {
        CHECK(fsdp2_barrier_async(b->group, b->stream));
        CHECK(fsdp2_stream_synchronize(b->stream));
        double t0 = now();
        sink += bench_read_sum(b->a, bytes / 32 * 32);
        double t = slowest(b, now() - t0);
        double g = (double)b->n * (double)bytes / t / 1e9;
        best = g > best ? g : best;
    }
    return best;
}

/* Mean seconds per call on the slowest rank. */
static double time_op(bench_t *b, int op, size_t bytes)
{
    int warm = bytes < (1 << 20) ? 20 : 3;
    int iters = bytes <= (1 << 16) ? 200 : bytes <= (1 << 22) ? 40 : bytes <= (1 << 26) ? 10 : 5;
    for (int i = 0; i < warm; i++)
        run_op(b, op, bytes);
    CHECK(fsdp2_barrier_async(b->group, b->stream));
    CHECK(fsdp2_stream_synchronize(b->stream));
    double t0 = now();
    for (int i = 0; i < iters; i++)
        run_op(b, op, bytes);
    return slowest(b, (now() - t0) / iters);
}

int main(int argc, char **argv)
{
    size_t min_bytes = 4096, max_bytes = (size_t)256 << 20;
    const char *json_path = NULL, *dtype_name = "f32", *stream_kind = "side";
    unsigned ops = (1u << OP_COUNT) - 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--min") == 0)
            min_bytes = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--max") == 0)
            max_bytes = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--json") == 0)
            json_path = argv[i + 1];
        else if (strcmp(argv[i], "--dtype") == 0)
            dtype_name = argv[i + 1];
        else if (strcmp(argv[i], "--stream") == 0)
            stream_kind = argv[i + 1];
        else if (strcmp(argv[i], "--ops") == 0) {
            if (!(ops = op_mask_parse(argv[i + 1]))) {
                fprintf(stderr, "--ops %s: want a comma list of", argv[i + 1]);
                for (int op = 0; op < OP_COUNT; op++)
                    fprintf(stderr, " %s", op_names[op]);
                fprintf(stderr, "\n");
                return 2;
            }
        }
        else {
            fprintf(stderr, "unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    fsdp2_process_info_t info;
    CHECK(fsdp2_process_info_from_env(&info));
    /* The limit to compare with: one thread's memcpy (bytes copied / s). */
    double memcpy_gbps = info.rank == 0 ? bench_memcpy_gbps() : 0;
    fsdp2_context_t *ctx;
    CHECK(fsdp2_init(NULL, &ctx));
    bench_t b = {.rank = info.rank, .n = info.world_size};
    CHECK(fsdp2_dtype_parse(dtype_name, &b.dtype));
    CHECK(fsdp2_dtype_size(b.dtype, &b.esize));
    CHECK(fsdp2_context_world(ctx, &b.group));
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    /* "side": a stream of its own, as FSDP runs collectives; "current": inline on the
     * calling thread, to see what the hand-off to a stream worker costs. */
    if (strcmp(stream_kind, "current") == 0)
        CHECK(fsdp2_stream_current(cpu, &b.stream));
    else
        CHECK(fsdp2_stream_create(cpu, "bench", &b.stream));
    CHECK(fsdp2_device_alloc(cpu, max_bytes, (void **)&b.a));
    CHECK(fsdp2_device_alloc(cpu, max_bytes, (void **)&b.b));
    memset(b.a, 0, max_bytes); /* fault the pages in before timing */
    memset(b.b, 0, max_bytes);
    double read_gbps = read_all_gbps(&b, max_bytes);

    FILE *json = NULL;
    if (b.rank == 0) {
        printf("# libfsdp2 ucx collectives, %d ranks, %s; memcpy %.2f GB/s; all ranks read "
               "%.2f GB/s at once\n", b.n, dtype_name, memcpy_gbps, read_gbps);
        printf("%-23s %12s %12s %12s %12s\n", "op", "bytes", "time_us", "algbw_GB/s", "busbw_GB/s");
        if (json_path && !(json = fopen(json_path, "w"))) {
            perror(json_path);
            return 1;
        }
        if (json)
            fprintf(json, "{\"impl\": \"libfsdp2\", \"ranks\": %d, \"dtype\": \"%s\", "
                          "\"memcpy_gbps\": %.3f, \"read_all_gbps\": %.3f, \"results\": [",
                    b.n, dtype_name, memcpy_gbps, read_gbps);
    }
    int first = 1;
    for (int op = 0; op < OP_COUNT; op++) {
        if (!(ops & (1u << op)))
            continue;
        for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
            size_t unit = b.esize * (size_t)b.n;
            size_t s = bytes / unit * unit;
            double t = time_op(&b, op, s);
            double alg = (double)s / t / 1e9;
            double bus = alg * op_bus_factor(op, b.n);
            if (b.rank == 0) {
                printf("%-23s %12zu %12.1f %12.3f %12.3f\n", op_names[op], s, t * 1e6, alg, bus);
                fflush(stdout);
                if (json)
                    fprintf(json, "%s\n  {\"op\": \"%s\", \"bytes\": %zu, \"time_us\": %.3f, "
                                  "\"algbw\": %.4f, \"busbw\": %.4f}",
                            first ? "" : ",", op_names[op], s, t * 1e6, alg, bus);
                first = 0;
            }
        }
    }
    if (json) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    if (strcmp(stream_kind, "current") != 0)
        CHECK(fsdp2_stream_destroy(b.stream));

    CHECK(fsdp2_device_free(cpu, b.a));
    CHECK(fsdp2_device_free(cpu, b.b));
    CHECK(fsdp2_finalize(ctx));
    return 0;
}
