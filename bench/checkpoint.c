/* Checkpoint throughput against the disk's limit, in the same run: save and load of a
 * model of about --mib MiB (layers of [dim, dim] f32) at this world size, against one
 * process writing (with fsync) and reading the same number of bytes sequentially.
 *
 *   fsdp2run --nproc-per-node N build/bench/bench_checkpoint [--mib 1024] [--dir DIR]
 *       [--json FILE]
 *
 * Reads come from the page cache when the data is still there (for both: the ratio is
 * fair, the absolute numbers are the cache's); drop caches between runs to see the disk. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <fsdp2/fsdp2.h>

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

/* The peer: sequential write + fsync, then read, of bytes in 8 MiB blocks. */
static void plain_io(const char *path, size_t bytes, double *write_s, double *read_s)
{
    size_t block = 8u << 20;
    char *buf = malloc(block);
    memset(buf, 0x5a, block);
    double t0 = now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t at = 0; fd >= 0 && at < bytes; at += block) {
        size_t n = bytes - at < block ? bytes - at : block;
        if (write(fd, buf, n) != (ssize_t)n) {
            perror("write");
            exit(1);
        }
    }
    if (fd < 0 || fsync(fd) != 0) {
        perror(path);
        exit(1);
    }
    close(fd);
    *write_s = now() - t0;
    t0 = now();
    fd = open(path, O_RDONLY);
    size_t got = 0;
    for (ssize_t n; fd >= 0 && (n = read(fd, buf, block)) > 0;)
        got += (size_t)n;
    close(fd);
    *read_s = now() - t0;
    if (got != bytes) {
        fprintf(stderr, "read %zu of %zu bytes\n", got, bytes);
        exit(1);
    }
    unlink(path);
    free(buf);
}

int main(int argc, char **argv)
{
    long mib = 1024;
    const char *dir = "bench-results/ckpt", *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--mib N] [--dir DIR] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    fsdp2_context_t *ctx;
    CHECK(fsdp2_init(NULL, &ctx));
    fsdp2_process_info_t info;
    fsdp2_group_t *world;
    CHECK(fsdp2_context_info(ctx, &info));
    CHECK(fsdp2_context_world(ctx, &world));
    int dim = 2048, layers = (int)(mib * 1048576 / ((long)dim * dim * 4));
    layers = layers < 1 ? 1 : layers;
    fsdp2_device_t meta = FSDP2_DEVICE_META_INIT, cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_module_t *root;
    CHECK(fsdp2_module_create("", &root));
    for (int l = 0; l < layers; l++) {
        char name[16];
        int64_t shape[2] = {dim, dim};
        fsdp2_module_t *m;
        fsdp2_tensor_t *v;
        fsdp2_param_t *p;
        snprintf(name, sizeof(name), "%d", l);
        CHECK(fsdp2_module_create(name, &m));
        CHECK(fsdp2_module_add_child(root, m));
        CHECK(fsdp2_tensor_empty(meta, FSDP2_F32, 2, shape, &v));
        CHECK(fsdp2_module_add_param(m, "weight", v, 0, &p)); /* frozen: no gradients */
        fsdp2_tensor_release(v);
        fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT((uint64_t)l, -1, 1);
        CHECK(fsdp2_param_set_random_init(p, &init));
        CHECK(fsdp2_fully_shard(m, NULL));
    }
    CHECK(fsdp2_fully_shard(root, NULL));
    CHECK(fsdp2_module_materialize(root, NULL, NULL));
    fsdp2_state_dict_t *sd;
    CHECK(fsdp2_state_dict_create(root, NULL, &sd));
    size_t bytes = (size_t)layers * dim * dim * 4;
    fsdp2_stream_t *s;
    CHECK(fsdp2_stream_current(cpu, &s));
    CHECK(fsdp2_barrier_async(world, s));
    double t0 = now();
    CHECK(fsdp2_checkpoint_save(sd, dir, NULL));
    double save_s = now() - t0;
    CHECK(fsdp2_barrier_async(world, s));
    t0 = now();
    CHECK(fsdp2_checkpoint_load(sd, dir, NULL, NULL));
    CHECK(fsdp2_barrier_async(world, s));
    double load_s = now() - t0;
    if (info.rank == 0) {
        double pw, pr;
        char path[4200];
        snprintf(path, sizeof(path), "%s.plain", dir);
        plain_io(path, bytes, &pw, &pr);
        double gb = (double)bytes / 1e9;
        printf("checkpoint of %.2f GB (%d x [%d, %d] f32), %d rank(s)\n", gb, layers, dim, dim,
               info.world_size);
        printf("| | ours s | ours GB/s | write/read s | write/read GB/s | ratio |\n"
               "|---|---:|---:|---:|---:|---:|\n");
        printf("| save | %.3f | %.2f | %.3f | %.2f | %.2f |\n", save_s, gb / save_s, pw, gb / pw,
               pw / save_s);
        printf("| load | %.3f | %.2f | %.3f | %.2f | %.2f |\n", load_s, gb / load_s, pr, gb / pr,
               pr / load_s);
        if (json) {
            FILE *f = fopen(json, "w");
            if (f) {
                fprintf(f, "{\"bytes\": %zu, \"ws\": %d, \"save_s\": %.4f, \"load_s\": %.4f, "
                           "\"write_s\": %.4f, \"read_s\": %.4f}\n",
                        bytes, info.world_size, save_s, load_s, pw, pr);
                fclose(f);
            }
        }
    }
    CHECK(fsdp2_state_dict_destroy(sd));
    CHECK(fsdp2_module_destroy(root));
    CHECK(fsdp2_finalize(ctx));
    return 0;
}
