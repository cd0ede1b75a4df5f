/* The library's CPU cost per module per step: a model of --blocks units (48 by default)
 * whose compute is empty, so a step is only FSDP's hooks, their stream hand-offs and
 * the collectives they issue (none at one rank: the pure host cost; at several ranks the
 * collectives of tiny shards, i.e. their latency, are added). Each unit holds one
 * parameter of --numel elements; the root holds one too.
 *
 *   fsdp2run --nproc-per-node N build/bench/bench_hooks [--blocks 48] [--numel 64]
 *       [--steps 200] [--json FILE]
 *
 * Prints (rank 0) the mean step time over the timed steps and that per module. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

#define MAX_BLOCKS 1024

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void declare(fsdp2_module_t *m, int64_t numel)
{
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_tensor_t *t;
    CHECK(fsdp2_tensor_zeros(cpu, FSDP2_F32, 1, &numel, &t));
    CHECK(fsdp2_module_add_param(m, "w", t, 1, NULL));
    CHECK(fsdp2_tensor_release(t));
}

static void step(fsdp2_module_t *root, fsdp2_module_t **blocks, int n)
{
    CHECK(fsdp2_pre_forward(root));
    for (int i = 0; i < n; i++) {
        CHECK(fsdp2_pre_forward(blocks[i]));
        CHECK(fsdp2_post_forward(blocks[i]));
    }
    CHECK(fsdp2_post_forward(root));
    CHECK(fsdp2_pre_backward(root));
    for (int i = n - 1; i >= 0; i--) {
        CHECK(fsdp2_pre_backward(blocks[i]));
        CHECK(fsdp2_post_backward(blocks[i]));
    }
    CHECK(fsdp2_post_backward(root));
    CHECK(fsdp2_backward_finish(root));
    CHECK(fsdp2_module_zero_grad(root));
}

int main(int argc, char **argv)
{
    int blocks = 48, steps = 200;
    long numel = 64;
    const char *json = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--blocks"))
            blocks = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--numel"))
            numel = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--json"))
            json = argv[i + 1];
        else {
            fprintf(stderr, "usage: %s [--blocks N] [--numel N] [--steps N] [--json FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    if (blocks < 1 || blocks > MAX_BLOCKS || numel < 1 || steps < 2) {
        fprintf(stderr, "error: --blocks 1..%d, --numel >= 1, --steps >= 2\n", MAX_BLOCKS);
        return 2;
    }
    fsdp2_context_t *ctx;
    fsdp2_process_info_t info;
    fsdp2_mesh_t *mesh;
    CHECK(fsdp2_init(NULL, &ctx));
    CHECK(fsdp2_context_info(ctx, &info));
    CHECK(fsdp2_context_mesh(ctx, &mesh));
    fsdp2_module_t *root, *b[MAX_BLOCKS];
    CHECK(fsdp2_module_create("", &root));
    declare(root, numel);
    for (int i = 0; i < blocks; i++) {
        char name[16];
        snprintf(name, sizeof(name), "%d", i);
        CHECK(fsdp2_module_create(name, &b[i]));
        CHECK(fsdp2_module_add_child(root, b[i]));
        declare(b[i], numel);
    }
    fsdp2_shard_options_t o = FSDP2_SHARD_OPTIONS_INIT;
    o.mesh = mesh;
    for (int i = 0; i < blocks; i++)
        CHECK(fsdp2_fully_shard(b[i], &o));
    CHECK(fsdp2_fully_shard(root, &o));
    for (int s = 0; s < 5; s++) /* warm-up: planning, first touches */
        step(root, b, blocks);
    double t0 = now();
    for (int s = 0; s < steps; s++)
        step(root, b, blocks);
    double per_step = (now() - t0) / steps;
    if (!info.rank) {
        double per_module = per_step / (blocks + 1) * 1e6;
        printf("hooks: %d units + root, %ld elements each, ws %d: %.1f us per step, %.2f us "
               "per module per step (4 hooks each, forward and backward)\n",
               blocks, numel, info.world_size, per_step * 1e6, per_module);
        FILE *f = json ? fopen(json, "w") : NULL;
        if (f) {
            fprintf(f, "{\"blocks\": %d, \"numel\": %ld, \"ws\": %d, \"steps\": %d, "
                       "\"us_per_step\": %.3f, \"us_per_module\": %.4f}\n",
                    blocks, numel, info.world_size, steps, per_step * 1e6, per_module);
            fclose(f);
        }
    }
    CHECK(fsdp2_module_synchronize(root));
    CHECK(fsdp2_module_destroy(root));
    CHECK(fsdp2_finalize(ctx));
    return 0;
}
