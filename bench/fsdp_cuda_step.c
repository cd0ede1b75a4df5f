/* An FSDP training step on one GPU: the library's side of bench/fsdp_cuda.sh, whose peer
 * is PyTorch's fully_shard on the same shapes (bench/peer_fsdp_cuda.py).
 *
 * The model is the FSDP machinery with no layer math: L layers, each a weight [R, C] and
 * a bias [R] (f32 shards, bf16 gathered parameters and gradients, f32 reduction, one
 * fully_shard unit per layer and the root), and the loss 0.5 * |w - t|^2 per parameter
 * against a fixed f32 target t: its gradient w - t is written between pre_backward and
 * post_backward with two accumulates. A step is the forward hooks of every layer inside
 * the root's, the backward hooks in reverse with the gradients inside the root's,
 * backward_finish, AdamW on the shards and zero_grad, then a synchronize. One rank over an nccl mesh of one.
 *
 * Prints the median, best and mean step time of --steps timed steps after --warmup, and
 * the peak of the library's device allocator during them less the targets; --json FILE
 * writes the same.
 *
 * Usage: bench_fsdp_cuda_step [--layers 8] [--rows 4096] [--cols 4095] [--steps 20]
 *                             [--warmup 3] [--json FILE] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp2/fsdp2.h>

#define CHECK(call)                                                                         \
    do {                                                                                    \
        fsdp2_status_t s_ = (call);                                                         \
        if (s_ != FSDP2_SUCCESS) {                                                          \
            fprintf(stderr, "%s: %s: %s\n", #call, fsdp2_strerror(s_), fsdp2_last_error()); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define MAX_LAYERS 64

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct param_ref {
    fsdp2_param_t *p;
    float *target; /* device */
} param_ref_t;

static void add_grad(const param_ref_t *r, fsdp2_stream_t *s)
{
    fsdp2_tensor_t *w, *g;
    CHECK(fsdp2_param_unsharded(r->p, &w));
    CHECK(fsdp2_param_grad(r->p, &g));
    CHECK(fsdp2_accumulate_async(g->data, g->dtype, w->data, w->dtype, (size_t)g->numel, 1.0, s));
    CHECK(fsdp2_accumulate_async(g->data, g->dtype, r->target, FSDP2_F32, (size_t)g->numel, -1.0,
                                 s));
}

int main(int argc, char **argv)
{
    int layers = 8, steps = 20, warmup = 3;
    long rows = 4096, cols = 4095;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atol(argv[++i]);
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc) cols = atol(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--layers N] [--rows R] [--cols C] [--steps N] "
                            "[--warmup N] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    if (layers < 1 || layers > MAX_LAYERS || rows < 1 || cols < 1 || steps < 1 || warmup < 0) {
        fprintf(stderr, "bad sizes: layers 1..%d, rows, cols and steps >= 1\n", MAX_LAYERS);
        return 2;
    }
    int count = 0;
    if (fsdp2_cuda_device_count(&count) != FSDP2_SUCCESS || count == 0) {
        printf("SKIP: no CUDA device (%s)\n", fsdp2_last_error());
        return 77;
    }
    fsdp2_device_t dev = {FSDP2_DEVICE_CUDA, 0}, meta = FSDP2_DEVICE_META_INIT;
    fsdp2_store_t *store;
    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.is_server = 1;
    CHECK(fsdp2_store_create(&so, &store));
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.backend = FSDP2_BACKEND_NCCL;
    go.cuda_device = 0;
    fsdp2_mesh_t *mesh;
    int shape[1] = {1};
    CHECK(fsdp2_mesh_create(store, "bench", 0, 1, 1, shape, NULL, &go, &mesh));
    fsdp2_stream_t *cur;
    CHECK(fsdp2_stream_current(dev, &cur));

    fsdp2_module_t *root, *layer[MAX_LAYERS];
    param_ref_t refs[2 * MAX_LAYERS];
    CHECK(fsdp2_module_create("", &root));
    uint64_t target_bytes = 0, params = 0;
    for (int l = 0; l < layers; l++) {
        char name[16];
        snprintf(name, sizeof name, "l%d", l);
        CHECK(fsdp2_module_create(name, &layer[l]));
        CHECK(fsdp2_module_add_child(root, layer[l]));
        for (int k = 0; k < 2; k++) {
            int64_t dims[2] = {rows, cols};
            fsdp2_tensor_t *value;
            CHECK(fsdp2_tensor_empty(meta, FSDP2_F32, k == 0 ? 2 : 1, dims, &value));
            CHECK(fsdp2_module_add_param(layer[l], k ? "bias" : "weight", value, 1,
                                         &refs[2 * l + k].p));
            size_t bytes = value->nbytes;
            params += (uint64_t)value->numel;
            fsdp2_tensor_release(value);
            CHECK(fsdp2_device_alloc(dev, bytes, (void **)&refs[2 * l + k].target));
            CHECK(fsdp2_fill_async(refs[2 * l + k].target, FSDP2_F32, bytes / 4, 0.25, cur));
            target_bytes += bytes;
        }
        fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT(1234 + (uint64_t)l, -0.05, 0.05);
        CHECK(fsdp2_param_set_random_init(refs[2 * l].p, &init));
        CHECK(fsdp2_param_set_random_init(refs[2 * l + 1].p, &init));
    }
    fsdp2_shard_options_t opts = FSDP2_SHARD_OPTIONS_INIT;
    opts.mesh = mesh;
    opts.device = dev;
    opts.mp.param_dtype = FSDP2_BF16;
    opts.mp.reduce_dtype = FSDP2_F32;
    for (int l = 0; l < layers; l++)
        CHECK(fsdp2_fully_shard(layer[l], &opts));
    CHECK(fsdp2_fully_shard(root, &opts));
    CHECK(fsdp2_module_materialize(root, NULL, NULL));
    fsdp2_memory_plan_t plan = {.size = sizeof plan};
    CHECK(fsdp2_memory_plan(root, &plan));
    fsdp2_optimizer_options_t oo = FSDP2_ADAMW_OPTIONS_INIT(1e-3);
    fsdp2_optimizer_t *opt;
    CHECK(fsdp2_optimizer_create(root, &oo, &opt));

    double *times = calloc((size_t)steps, sizeof(double));
    for (int step = 0; step < warmup + steps; step++) {
        if (step == warmup)
            CHECK(fsdp2_memory_stats_reset_peak(dev));
        double t0 = now_ms();
        CHECK(fsdp2_pre_forward(root));
        for (int l = 0; l < layers; l++) {
            CHECK(fsdp2_pre_forward(layer[l]));
            CHECK(fsdp2_post_forward(layer[l]));
        }
        CHECK(fsdp2_post_forward(root));
        CHECK(fsdp2_pre_backward(root));
        for (int l = layers - 1; l >= 0; l--) {
            CHECK(fsdp2_pre_backward(layer[l]));
            add_grad(&refs[2 * l], cur);
            add_grad(&refs[2 * l + 1], cur);
            CHECK(fsdp2_post_backward(layer[l]));
        }
        CHECK(fsdp2_post_backward(root));
        CHECK(fsdp2_backward_finish(root));
        CHECK(fsdp2_optimizer_step(opt));
        CHECK(fsdp2_optimizer_zero_grad(opt));
        CHECK(fsdp2_stream_synchronize(cur));
        if (step >= warmup)
            times[step - warmup] = now_ms() - t0;
    }
    fsdp2_memory_stats_t ms;
    CHECK(fsdp2_memory_stats_get(dev, &ms));
    double sum = 0;
    for (int i = 0; i < steps; i++)
        sum += times[i];
    qsort(times, (size_t)steps, sizeof(double), cmp_double);
    double median = times[steps / 2], best = times[0], mean = sum / steps;
    uint64_t peak = ms.peak_allocated_bytes - target_bytes;
    printf("libfsdp2 fsdp step, cuda:0, %d layers of [%ld, %ld] + [%ld] (%.1f M parameters), "
           "bf16 params, f32 reduce, AdamW\n",
           layers, rows, cols, rows, (double)params / 1e6);
    printf("%-26s %12s %12s %12s %14s %14s\n", "", "median ms", "best ms", "mean ms",
           "peak MiB", "plan MiB");
    printf("%-26s %12.3f %12.3f %12.3f %14.1f %14.1f\n", "libfsdp2", median, best, mean,
           (double)peak / 1048576.0, (double)plan.total / 1048576.0);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"impl\": \"libfsdp2\", \"layers\": %d, \"rows\": %ld, \"cols\": %ld, "
                   "\"params\": %llu, \"steps\": %d, \"median_ms\": %.4f, \"best_ms\": %.4f, "
                   "\"mean_ms\": %.4f, \"peak_bytes\": %llu, \"plan_bytes\": %llu}\n",
                layers, rows, cols, (unsigned long long)params, steps, median, best, mean,
                (unsigned long long)peak, (unsigned long long)plan.total);
        fclose(f);
    }
    free(times);
    for (int i = 0; i < 2 * layers; i++)
        fsdp2_device_free(dev, refs[i].target);
    CHECK(fsdp2_optimizer_destroy(opt));
    CHECK(fsdp2_module_destroy(root));
    CHECK(fsdp2_mesh_destroy(mesh));
    CHECK(fsdp2_store_destroy(store));
    return 0;
}
