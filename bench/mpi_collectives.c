/* Open MPI's side of bench/collectives: the same sizes, timing and bandwidth formulas as
 * bench/collectives.c, with MPI_Allgather, MPI_Reduce_scatter_block and MPI_Allreduce
 * (in place too: coll_ops.h).
 * Built and run by bench/collectives.sh with mpicc / mpirun (the benchmark peer only;
 * libfsdp2 itself never uses MPI). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COLL_OPS_MPI
#include "coll_ops.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t min_bytes = 4096, max_bytes = (size_t)256 << 20;
    const char *json_path = NULL;
    unsigned ops = (1u << OP_COUNT) - 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--min") == 0)
            min_bytes = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--max") == 0)
            max_bytes = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--json") == 0)
            json_path = argv[i + 1];
        else if (strcmp(argv[i], "--ops") == 0 && !(ops = op_mask_parse(argv[i + 1]))) {
            if (rank == 0) {
                fprintf(stderr, "--ops %s: want a comma list of", argv[i + 1]);
                for (int op = 0; op < OP_COUNT; op++)
                    fprintf(stderr, " %s", op_names[op]);
                fprintf(stderr, "\n");
            }
            MPI_Finalize();
            return 2;
        }
    }
    char *a = malloc(max_bytes), *b = malloc(max_bytes);
    memset(a, 0, max_bytes);
    memset(b, 0, max_bytes);
    FILE *json = NULL;
    if (rank == 0) {
        printf("# Open MPI collectives, %d ranks, f32\n", n);
        printf("%-23s %12s %12s %12s %12s\n", "op", "bytes", "time_us", "algbw_GB/s", "busbw_GB/s");
        if (json_path)
            json = fopen(json_path, "w");
        if (json)
            fprintf(json, "{\"impl\": \"openmpi\", \"ranks\": %d, \"dtype\": \"f32\", \"results\": [", n);
    }
    int first = 1;
    for (int op = 0; op < OP_COUNT; op++) {
        if (!(ops & (1u << op)))
            continue;
        for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
            size_t unit = sizeof(float) * (size_t)n, s = bytes / unit * unit;
            int warm = s < (1 << 20) ? 20 : 3;
            int iters = s <= (1 << 16) ? 200 : s <= (1 << 22) ? 40 : s <= (1 << 26) ? 10 : 5;
            for (int i = 0; i < warm; i++)
                op_mpi(op, a, b, s, n);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++)
                op_mpi(op, a, b, s, n);
            double t = (MPI_Wtime() - t0) / iters, worst;
            MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            double alg = (double)s / worst / 1e9;
            double bus = alg * op_bus_factor(op, n);
            if (rank == 0) {
                printf("%-23s %12zu %12.1f %12.3f %12.3f\n", op_names[op], s, worst * 1e6, alg, bus);
                fflush(stdout);
                if (json)
                    fprintf(json, "%s\n  {\"op\": \"%s\", \"bytes\": %zu, \"time_us\": %.3f, "
                                  "\"algbw\": %.4f, \"busbw\": %.4f}",
                            first ? "" : ",", op_names[op], s, worst * 1e6, alg, bus);
                first = 0;
            }
        }
    }
    if (json) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    free(a);
    free(b);
    MPI_Finalize();
    return 0;
}
