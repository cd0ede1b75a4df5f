/* A rank program for launcher-driven tests (two fsdp2run "nodes" on loopback, two
 * namespace hosts): it reads its rank from the environment as any application would
 * (fsdp2_init), runs every collective on the world group for every dtype it takes
 * (all-gather, all-gather into pieces, broadcast from each root; reduce-scatter and
 * all-reduce, sum and avg, with and without divide factors, in and out of place) at
 * counts from 0 to uneven hundreds of thousands, builds a [nodes, ranks per node] mesh
 * (HSDP's layout) and reduces over its groups, and checks every element against closed
 * forms computed here. Exit 0 when everything matched. With --quick (for many ranks
 * on few CPUs) the counts stop at 4099 and broadcasts come from 4 roots. */
#include <math.h>
#include <stdint.h>
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

/* Rank r's element i: small integers, exact in every dtype; their sums over ranks are
 * exact in f32, f64 and the library's f32 accumulators, and rounded once into bf16 and
 * f16. */
static double value(int r, size_t i)
{
    return (double)((r * 7 + i * 3) % 13);
}

/* f16 bits of x >= 0, rounded to nearest even (x = 0 or in f16's normal range). */
static uint16_t f16_bits(double x)
{
    if (x == 0)
        return 0;
    int e = ilogb(x);
    double mant = nearbyint((ldexp(x, -e) - 1.0) * 1024.0); /* the default mode: even */
    if (mant == 1024.0)
        e++, mant = 0;
    return (uint16_t)((e + 15) << 10 | (int)mant);
}

static double f16_value(uint16_t b)
{
    int e = b >> 10 & 31, m = b & 1023;
    double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return b >> 15 ? -v : v;
}

static size_t dtype_bytes(fsdp2_dtype_t dt)
{
    size_t b = 0;
    CHECK(fsdp2_dtype_size(dt, &b));
    return b;
}

static void put(fsdp2_dtype_t dt, void *p, size_t i, double x)
{
    switch (dt) {
    case FSDP2_F32: ((float *)p)[i] = (float)x; break;
    case FSDP2_F64: ((double *)p)[i] = x; break;
    case FSDP2_BF16: { /* to nearest even, from f32 (which holds these values exactly) */
        float f = (float)x;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)((bits + 0x7fffu + (bits >> 16 & 1)) >> 16);
        break;
    }
    case FSDP2_F16: ((uint16_t *)p)[i] = f16_bits(x); break;
    case FSDP2_I32: ((int32_t *)p)[i] = (int32_t)x; break;
    case FSDP2_I64: ((int64_t *)p)[i] = (int64_t)x; break;
    case FSDP2_U8: ((uint8_t *)p)[i] = (uint8_t)x; break;
    default: break;
    }
}

static double get(fsdp2_dtype_t dt, const void *p, size_t i)
{
    switch (dt) {
    case FSDP2_F32: return ((const float *)p)[i];
    case FSDP2_F64: return ((const double *)p)[i];
    case FSDP2_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    case FSDP2_F16: return f16_value(((const uint16_t *)p)[i]);
    case FSDP2_I32: return ((const int32_t *)p)[i];
    case FSDP2_I64: return (double)((const int64_t *)p)[i];
    case FSDP2_U8: return ((const uint8_t *)p)[i];
    default: return NAN;
    }
}

/* x rounded into dt (a sum over many ranks outgrows bf16's and f16's integers). */
static double rounded(fsdp2_dtype_t dt, double x)
{
    uint64_t b = 0;
    put(dt, &b, 0, x);
    return get(dt, &b, 0);
}

/* Checks count elements against want(i) rounded into dt, to within tol relative (0:
 * equal); reports the first 3 mismatches of a case. */
static int expect_close(const char *what, fsdp2_dtype_t dt, size_t count, const void *got,
                        int r, double (*want)(size_t i, void *arg), void *arg, double tol)
{
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        double g = get(dt, got, i), w = rounded(dt, want(i, arg));
        if (!(g == w || fabs(g - w) <= tol * fabs(w)) && bad++ < 3)
            fprintf(stderr, "rank %d: %s %s count %zu: element %zu is %g, want %g\n", r, what,
                    fsdp2_dtype_name(dt), count, i, g, w);
    }
    if (bad)
        fails++;
    return bad == 0;
}

static int expect_values(const char *what, fsdp2_dtype_t dt, size_t count, const void *got,
                         int r, double (*want)(size_t i, void *arg), void *arg)
{
    return expect_close(what, dt, count, got, r, want, arg, 0);
}

/* Half an ulp of dt, relative: a quotient rounded once into dt is this close. */
static double half_ulp(fsdp2_dtype_t dt)
{
    switch (dt) {
    case FSDP2_F32: return ldexp(1, -24);
    case FSDP2_F64: return ldexp(1, -53);
    case FSDP2_BF16: return ldexp(1, -8);
    default: return ldexp(1, -11); /* f16 */
    }
}

typedef struct want_args {
    int n, r, root;
    size_t count;
    size_t offset; /* of the reduced block, in elements */
    double scale;  /* the reduction's divisor */
} want_args_t;

static double want_gathered(size_t i, void *arg)
{
    want_args_t *a = arg;
    return value((int)(i / a->count), i % a->count);
}

static double want_root(size_t i, void *arg)
{
    return value(((want_args_t *)arg)->root, i);
}

/* Element i of the reduced block that starts at element a->offset. */
static double want_reduced(size_t i, void *arg)
{
    want_args_t *a = arg;
    double sum = 0;
    for (int q = 0; q < a->n; q++)
        sum += value(q, a->offset + i);
    return sum / a->scale;
}

static void sweep(fsdp2_group_t *world, fsdp2_stream_t *s, int n, int r, int quick)
{
    static const size_t counts[] = {0, 1, 5, 4099, 200003};
    size_t n_counts = sizeof(counts) / sizeof(counts[0]) - (quick ? 1 : 0);
    static const fsdp2_dtype_t all[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16,
                                        FSDP2_I32, FSDP2_I64, FSDP2_U8};
    size_t most = counts[n_counts - 1];
    char *send = malloc(most * (size_t)n * 8), *recv = malloc(most * (size_t)n * 8);
    if (!send || !recv) {
        fprintf(stderr, "rank %d: out of memory\n", r);
        exit(1);
    }
    for (size_t c = 0; c < n_counts; c++) {
        size_t count = counts[c];
        for (size_t d = 0; d < sizeof(all) / sizeof(all[0]); d++) {
            fsdp2_dtype_t dt = all[d];
            size_t es = dtype_bytes(dt);
            want_args_t a = {.n = n, .r = r, .count = count};
            for (size_t i = 0; i < count; i++)
                put(dt, send, i, value(r, i));
            memset(recv, 0xee, count * (size_t)n * es);
            CHECK(fsdp2_all_gather_async(world, send, recv, count, dt, s));
            CHECK(fsdp2_stream_synchronize(s));
            expect_values("all_gather", dt, count * (size_t)n, recv, r, want_gathered, &a);

            /* into pieces: rank q's bytes land at block n - 1 - q, split unevenly */
            size_t bytes = count * es;
            fsdp2_iov_t *pieces = malloc(sizeof(*pieces) * 3 * (size_t)n);
            size_t *offsets = malloc(sizeof(*offsets) * ((size_t)n + 1));
            if (!pieces || !offsets) {
                fprintf(stderr, "rank %d: out of memory\n", r);
                exit(1);
            }
            for (int q = 0; q < n; q++) {
                char *base = recv + (size_t)(n - 1 - q) * bytes;
                size_t a0 = bytes / 3, a1 = bytes > a0 ? 1 : 0;
                pieces[3 * q] = (fsdp2_iov_t){base, a0};
                pieces[3 * q + 1] = (fsdp2_iov_t){base + a0, a1};
                pieces[3 * q + 2] = (fsdp2_iov_t){base + a0 + a1, bytes - a0 - a1};
                offsets[q] = (size_t)3 * q;
            }
            offsets[n] = (size_t)3 * n;
            memset(recv, 0xee, bytes * (size_t)n);
            CHECK(fsdp2_all_gather_pieces_async(world, send, bytes, pieces, offsets, s));
            CHECK(fsdp2_stream_synchronize(s));
            for (int q = 0; q < n; q++) {
                want_args_t one = {.root = q};
                expect_values("all_gather_pieces", dt, count, recv + (size_t)(n - 1 - q) * bytes,
                              r, want_root, &one);
            }
            free(pieces);
            free(offsets);

            /* every root, or (quick) the first, two in between and the last */
            int roots = quick && n > 4 ? 4 : n;
            for (int k = 0; k < roots; k++) {
                int root = roots == n ? k : k * (n - 1) / 3;
                for (size_t i = 0; i < count; i++)
                    put(dt, recv, i, r == root ? value(root, i) : 99);
                CHECK(fsdp2_broadcast_async(world, recv, count, dt, root, s));
                CHECK(fsdp2_stream_synchronize(s));
                a.root = root;
                expect_values("broadcast", dt, count, recv, r, want_root, &a);
            }

            if (dt != FSDP2_F32 && dt != FSDP2_F64 && dt != FSDP2_BF16 && dt != FSDP2_F16)
                continue;
            for (int kind = 0; kind < 3; kind++) {
                /* sums are exact; a division by a group size that is no power of 2 is
                 * rounded (once into f32 for the 16-bit dtypes, then into the dtype) */
                /* sum; avg; sum with pre 2, post 2 */
                fsdp2_reduce_t red = FSDP2_REDUCE_SUM_INIT;
                a.scale = 1;
                if (kind == 1) {
                    red.op = FSDP2_REDUCE_AVG;
                    a.scale = n;
                } else if (kind == 2) {
                    red.pre_divide = red.post_divide = 2;
                    a.scale = 4;
                }
                double tol = (n & (n - 1)) == 0 || kind != 1 ? 0 : 2 * half_ulp(dt);
                const char *name = kind == 0 ? "reduce_scatter sum"
                                             : kind == 1 ? "reduce_scatter avg"
                                                         : "reduce_scatter pre/post";
                for (int in_place = 0; in_place < 2; in_place++) {
                    for (size_t i = 0; i < count * (size_t)n; i++)
                        put(dt, send, i, value(r, i));
                    char *out = in_place ? send + (size_t)r * count * es : recv;
                    CHECK(fsdp2_reduce_scatter_async(world, send, out, count, dt, &red, s));
                    CHECK(fsdp2_stream_synchronize(s));
                    a.offset = (size_t)r * count; /* this rank's block */
                    expect_close(name, dt, count, out, r, want_reduced, &a, tol);
                }
                for (size_t i = 0; i < count; i++)
                    put(dt, recv, i, value(r, i));
                CHECK(fsdp2_all_reduce_async(world, recv, count, dt, &red, s));
                CHECK(fsdp2_stream_synchronize(s));
                a.offset = 0;
                expect_close(kind == 0 ? "all_reduce sum" : kind == 1 ? "all_reduce avg"
                                                                      : "all_reduce pre/post",
                             dt, count, recv, r, want_reduced, &a, tol);
            }
        }
    }
    free(send);
    free(recv);
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
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
    sweep(world, s, n, r, quick);
    /* more than a slot per rank (256 KiB): several steps */
    size_t big = quick ? 70001 : 100003;
    float *send = malloc(sizeof(float) * big * n), *recv = malloc(sizeof(float) * big * n);
    for (size_t i = 0; i < (size_t)big * n; i++)
        send[i] = (float)(r + 1) * (float)(i % 101);
    CHECK(fsdp2_all_gather_async(world, send, recv, big, FSDP2_F32, s));
    CHECK(fsdp2_stream_synchronize(s));
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < big; i += 997)
            EXPECT(recv[(size_t)q * big + i] == (float)(q + 1) * (float)(i % 101),
                   "rank %d: all_gather from %d element %zu", r, q, i);
    CHECK(fsdp2_reduce_scatter_async(world, send, recv, big, FSDP2_F32, NULL, s));
    CHECK(fsdp2_stream_synchronize(s));
    float ranks_sum = (float)(n * (n + 1) / 2);
    for (size_t i = 0; i < big; i += 997)
        EXPECT(recv[i] == ranks_sum * (float)(((size_t)r * big + i) % 101),
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
