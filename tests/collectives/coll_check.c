/* A rank program for launcher-driven tests (two fsdp2run "nodes" on loopback): it reads
 * its rank from the environment as any application would (fsdp2_init), builds a
 * [nodes, ranks per node] mesh (HSDP's layout), runs each collective and checks the
 * values against closed forms. Exit 0 when everything matched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

static int fails;

#define CHECK(call)                                                                        \
    do {                                                                                   \
        fsdp2_status_t s_ = (call);                                                        \
        if (s_ != FSDP2_SUCCESS) {                                                         \
            fprintf(stderr, "%s: %s: %s\n", #call, fsdp2_strerror(s_), fsdp2_last_error()); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)
#define EXPECT(cond, ...)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
            fails++;                                                                       \
        }                                                                                  \
    } while (0)

int main(void)
{
    fsdp2_context_t *ctx;
    CHECK(fsdp2_init(NULL, &ctx));
    fsdp2_process_info_t info;
    fsdp2_group_t *world;
    CHECK(fsdp2_context_info(ctx, &info));
    CHECK(fsdp2_context_world(ctx, &world));
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *s;
    CHECK(fsdp2_stream_create(cpu, "check", &s));
    int n = info.world_size, r = info.rank;
    enum { COUNT = 100003 };
    float *send = malloc(sizeof(float) * COUNT * n), *recv = malloc(sizeof(float) * COUNT * n);
    for (size_t i = 0; i < (size_t)COUNT * n; i++)
        send[i] = (float)(r + 1) * (float)(i % 101);
    CHECK(fsdp2_all_gather_async(world, send, recv, COUNT, FSDP2_F32, s));
    CHECK(fsdp2_stream_synchronize(s));
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < COUNT; i += 997)
            EXPECT(recv[(size_t)q * COUNT + i] == (float)(q + 1) * (float)(i % 101),
                   "rank %d: all_gather from %d element %zu", r, q, i);
    CHECK(fsdp2_reduce_scatter_async(world, send, recv, COUNT, FSDP2_F32, NULL, s));
    CHECK(fsdp2_stream_synchronize(s));
    float ranks_sum = (float)(n * (n + 1) / 2);
    for (size_t i = 0; i < COUNT; i += 997)
        EXPECT(recv[i] == ranks_sum * (float)(((size_t)r * COUNT + i) % 101),
               "rank %d: reduce_scatter element %zu: %g", r, i, recv[i]);
    /* HSDP layout: replicate across nodes, shard within a node (the context's helper,
     * checked against the launcher's node layout: ranks node * per node + local rank) */
    int shape[2] = {n / info.local_world_size, info.local_world_size};
    fsdp2_mesh_t *mesh, *again;
    CHECK(fsdp2_context_hsdp_mesh(ctx, 0, &mesh));
    CHECK(fsdp2_context_hsdp_mesh(ctx, info.local_world_size, &again));
    EXPECT(mesh == again, "rank %d: the same shard size gave another mesh", r);
    for (int d = 0; d < 2; d++) {
        int size, coord, dim;
        CHECK(fsdp2_mesh_size(mesh, d, &size));
        CHECK(fsdp2_mesh_coordinate(mesh, d, &coord));
        CHECK(fsdp2_mesh_dim(mesh, d ? "shard" : "replicate", &dim));
        int want = d ? info.local_rank : (info.node_rank >= 0 ? info.node_rank : r / shape[1]);
        EXPECT(size == shape[d] && coord == want && dim == d,
               "rank %d: hsdp mesh dim %d has size %d, coordinate %d (name -> dim %d), want "
               "%d, %d", r, d, size, coord, dim, shape[d], want);
    }
    for (int d = 0; d < 2; d++) {
        fsdp2_group_t *g;
        CHECK(fsdp2_mesh_group(mesh, d, &g));
        double v = r;
        CHECK(fsdp2_all_reduce_async(g, &v, 1, FSDP2_F64, NULL, s));
        CHECK(fsdp2_stream_synchronize(s));
        int c0 = r / shape[1], c1 = r % shape[1];
        double want = d == 1 ? (double)(c0 * shape[1] * shape[1]) + shape[1] * (shape[1] - 1) / 2.0
                             : (double)(shape[0] * (shape[0] - 1) / 2 * shape[1] + shape[0] * c1);
        EXPECT(v == want, "rank %d: mesh dim %d sum %g, want %g", r, d, v, want);
    }
    CHECK(fsdp2_barrier_async(world, s));
    CHECK(fsdp2_stream_synchronize(s));
    CHECK(fsdp2_stream_destroy(s));
    CHECK(fsdp2_finalize(ctx));
    free(send);
    free(recv);
    if (fails == 0)
        printf("rank %d of %d (node %d): collectives and mesh OK\n", r, n, info.node_rank);
    return fails ? 1 : 0;
}
