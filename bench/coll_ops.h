/* The collectives bench/collectives.c, bench/mpi_collectives.c and bench/interleaved.c
 * time, with the calls each makes: the same operations, buffers and sizes on both sides.
 *
 * S is the all-gather output, the reduce-scatter input and the all-reduce buffer, in
 * bytes; a and b are S bytes each. Out of place, the all-gather reads a and writes b and
 * the reduce-scatter reads a and writes b. In place, as nccl-tests times it (and FSDP2
 * gathers: each rank's shard already sits in the flat buffer), the all-gather's input is
 * this rank's block of b, and the reduce-scatter writes its result into a: this rank's
 * block with libfsdp2 (recv == send + rank * count), the front of a with Open MPI
 * (MPI_IN_PLACE for MPI_Reduce_scatter_block). The all-reduce is always in place.
 *
 * An includer defines COLL_OPS_FSDP2 (after including <fsdp2/fsdp2.h>) for op_ours and
 * COLL_OPS_MPI (after <mpi.h>) for op_mpi. */
#ifndef FSDP2_BENCH_COLL_OPS_H
#define FSDP2_BENCH_COLL_OPS_H

#include <string.h>

enum { OP_AG, OP_AG_IN_PLACE, OP_RS, OP_RS_IN_PLACE, OP_AR, OP_COUNT };

static const char *const op_names[OP_COUNT] = {"all_gather", "all_gather_in_place",
                                               "reduce_scatter", "reduce_scatter_in_place",
                                               "all_reduce"};

/* busbw = algbw * this (nccl-tests): (n - 1) / n, and twice that for an all-reduce. */
static inline double op_bus_factor(int op, int n)
{
    return (op == OP_AR ? 2.0 : 1.0) * (n - 1) / n;
}

/* A comma list of operation names into a mask of (1 << op); 0 when a name is not one
 * (a typo must not time nothing). */
static inline unsigned op_mask_parse(const char *list)
{
    unsigned mask = 0;
    const char *at = list;
    while (*at) {
        size_t len = strcspn(at, ",");
        int found = -1;
        for (int op = 0; op < OP_COUNT && found < 0; op++)
            if (strlen(op_names[op]) == len && strncmp(at, op_names[op], len) == 0)
                found = op;
        if (found < 0)
            return 0;
        mask |= 1u << found;
        at += len + (at[len] == ',');
    }
    return mask;
}

#ifdef COLL_OPS_FSDP2
/* libfsdp2's call for op on S bytes of elements of es bytes. */
static inline fsdp2_status_t op_ours(int op, fsdp2_group_t *g, char *a, char *b, size_t bytes,
                                     fsdp2_dtype_t dtype, size_t es, int rank, int n,
                                     fsdp2_stream_t *s)
{
    size_t elems = bytes / es, per_rank = elems / (size_t)n, own = (size_t)rank * per_rank * es;
    switch (op) {
    case OP_AG: return fsdp2_all_gather_async(g, a, b, per_rank, dtype, s);
    case OP_AG_IN_PLACE: return fsdp2_all_gather_async(g, b + own, b, per_rank, dtype, s);
    case OP_RS: return fsdp2_reduce_scatter_async(g, a, b, per_rank, dtype, NULL, s);
    case OP_RS_IN_PLACE: return fsdp2_reduce_scatter_async(g, a, a + own, per_rank, dtype, NULL, s);
    default: return fsdp2_all_reduce_async(g, a, elems, dtype, NULL, s);
    }
}
#endif

#ifdef COLL_OPS_MPI
/* Open MPI's call for op on S bytes of f32. */
static inline void op_mpi(int op, char *a, char *b, size_t bytes, int n)
{
    int elems = (int)(bytes / sizeof(float)), per_rank = elems / n;
    switch (op) {
    case OP_AG:
        MPI_Allgather(a, per_rank, MPI_FLOAT, b, per_rank, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case OP_AG_IN_PLACE:
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b, per_rank, MPI_FLOAT,
                      MPI_COMM_WORLD);
        break;
    case OP_RS:
        MPI_Reduce_scatter_block(a, b, per_rank, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case OP_RS_IN_PLACE:
        MPI_Reduce_scatter_block(MPI_IN_PLACE, a, per_rank, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    default: MPI_Allreduce(MPI_IN_PLACE, a, elems, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
}
#endif

#endif
