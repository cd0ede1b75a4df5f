/* fully_shard on cuda:0 over an nccl mesh of one rank: 20 training steps of a 4-layer
 * model, in f32 and with bf16 parameters (f32 reduction), and as HSDP over a [1, 1]
 * mesh (the reduce-scatter, then the all-reduce over the replicate dim), against the
 * same steps written out on the host, and the memory the GPU gives up against the plan.
 *
 * The model: layers l0..l3, each a weight [1024, K] and a bias [1024] with K = 1023,
 * 2047, 1023, 1023 (so a layer's group is 1024 * (K + 1) elements: whole 2 MiB pages,
 * the granule of cudaMalloc, in f32 and in bf16). The loss is 0.5 * |w - t|^2 per parameter with a
 * fixed random target t, so the gradient the application adds between pre_backward and
 * post_backward is w - t, written with the library's own kernels (accumulate w, then
 * -1 * t) in the gradient's dtype; the update is the library's SGD on the cuda shards. The
 * host reference does the same roundings (bf16 rounding of the gathered w and of the
 * gradient; the f32 product and sum of accumulate), so the parameters must match to
 * the bit after every step.
 *
 * Memory: the plan is allocated once; the library's allocator must hold exactly the
 * plan, and with cudaMemGetInfo, the device memory taken from before fully_shard to
 * after the plan must be the plan's total (every planned buffer is one cudaMalloc of
 * whole pages here), give or take one page of the driver's for the root's streams; during the 20 steps the allocator's peak stays the plan and the
 * device memory in use never grows. What the CUDA runtime and
 * NCCL take for themselves comes before the baseline: the test runs with
 * CUDA_MODULE_LOADING=EAGER (kernels load with the context, not at their first launch)
 * and warms the communicator up with the step's collectives and kernels first, and
 * prints what that took.
 *
 * A standalone program: exit 0 on success, 1 on failure, 77 without a CUDA device. */
#include <cuda_runtime_api.h>

#include "gpu_check.h"

#define LAYERS 4
#define ROWS 1024
#define STEPS 20
#define LR 0.1f
#define GRANULE ((size_t)2 << 20) /* cudaMalloc's page */

static const int64_t COLS[LAYERS] = {1023, 2047, 1023, 1023};
static const fsdp2_device_t dut = {FSDP2_DEVICE_CUDA, 0};
static const fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;

typedef struct param_state {
    fsdp2_param_t *p;
    int64_t numel;
    float *w;      /* the host reference's parameter */
    float *t;      /* the target, on the host */
    float *t_dev;  /* and on the device */
} param_state_t;

#define TRY(call)                          \
    do {                                   \
        fsdp2_status_t try_ = (call);      \
        if (try_ != FSDP2_SUCCESS)         \
            return try_;                   \
    } while (0)

static float f32_round_bf16(float x)
{
    return fsdp2_bf16_to_f32(fsdp2_f32_to_bf16(x));
}

/* One reference step of one parameter: what the library's kernels compute. */
static void reference_step(param_state_t *ps, int bf16)
{
    for (int64_t i = 0; i < ps->numel; i++) {
        float w = bf16 ? f32_round_bf16(ps->w[i]) : ps->w[i];
        volatile float g = w + -1.0f * ps->t[i]; /* accumulate: f32 product, f32 sum */
        float gg = bf16 ? f32_round_bf16(g) : g;
        volatile float step = -LR * gg;
        ps->w[i] = ps->w[i] + step;
    }
}

static size_t device_free_bytes(void)
{
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
        fprintf(stderr, "cudaMemGetInfo failed\n");
        exit(1);
    }
    return free_b;
}

/* The gradient w - t into the unsharded gradient, in its dtype. */
static fsdp2_status_t write_grad(param_state_t *ps, fsdp2_stream_t *s)
{
    fsdp2_tensor_t *w, *g;
    TRY(fsdp2_param_unsharded(ps->p, &w));
    TRY(fsdp2_param_grad(ps->p, &g));
    TRY(fsdp2_accumulate_async(g->data, g->dtype, w->data, w->dtype, (size_t)g->numel,
                                          1.0, s));
    return fsdp2_accumulate_async(g->data, g->dtype, ps->t_dev, FSDP2_F32, (size_t)g->numel,
                                  -1.0, s);
}

/* One of each collective and kernel a step uses, so that NCCL's and the runtime's
 * lazy allocations happen before the baseline. Its two buffers stay allocated (*a, *b)
 * until the run ends: memory a cudaFree gives back may be handed out again without
 * cudaMemGetInfo seeing it taken. */
static fsdp2_status_t warm_up(fsdp2_mesh_t *mesh, fsdp2_stream_t *s, void **a_out, void **b_out)
{
    fsdp2_group_t *g;
    TRY(fsdp2_mesh_group(mesh, 0, &g));
    size_t n = 1 << 20;
    void *a, *b;
    TRY(fsdp2_device_alloc(dut, n * 4, &a));
    TRY(fsdp2_device_alloc(dut, n * 4, &b));
    *a_out = a;
    *b_out = b;
    const fsdp2_dtype_t types[2] = {FSDP2_F32, FSDP2_BF16};
    fsdp2_reduce_t avg = FSDP2_REDUCE_AVG_INIT, sum = FSDP2_REDUCE_SUM_INIT;
    TRY(fsdp2_fill_async(a, FSDP2_F32, n, 1.0, s));
    for (int i = 0; i < 2; i++) {
        TRY(fsdp2_reduce_scatter_async(g, a, b, n / 2, types[i], &avg, s));
        TRY(fsdp2_reduce_scatter_async(g, a, b, n / 2, types[i], &sum, s));
        TRY(fsdp2_all_reduce_async(g, a, n / 2, types[i], &sum, s));
        TRY(fsdp2_all_gather_async(g, a, b, n / 2, types[i], s));
        for (int j = 0; j < 2; j++) {
            TRY(fsdp2_accumulate_async(a, types[i], b, types[j], n / 2, 1.0, s));
            TRY(fsdp2_cast_async(a, types[i], b, types[j], n / 2, s));
        }
    }
    return fsdp2_stream_synchronize(s);
}

static void run(int bf16, int hsdp)
{
    const char *label = hsdp ? "hsdp" : bf16 ? "bf16" : "f32";
    fsdp2_store_t *store;
    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.is_server = 1;
    ASSERT_OK(fsdp2_store_create(&so, &store));
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.backend = FSDP2_BACKEND_NCCL;
    go.cuda_device = 0;
    fsdp2_mesh_t *mesh;
    int shape[2] = {1, 1};
    size_t free_start = device_free_bytes();
    ASSERT_OK(fsdp2_mesh_create(store, hsdp ? "mesh-hsdp" : bf16 ? "mesh-bf16" : "mesh-f32", 0, 1,
                                hsdp ? 2 : 1, shape, NULL, &go, &mesh));
    printf("    %s: the NCCL communicator took %lld bytes of device memory\n",
           label, (long long)free_start - (long long)device_free_bytes());
    fsdp2_stream_t *cur;
    ASSERT_OK(fsdp2_stream_current(dut, &cur));
    size_t free_mesh = device_free_bytes();
    void *warm_a = NULL, *warm_b = NULL;
    ASSERT_OK(warm_up(mesh, cur, &warm_a, &warm_b));
    printf("    %s: the first collectives took %lld bytes of device memory outside the "
           "library's allocator\n", label,
           (long long)free_mesh - (long long)device_free_bytes());

    fsdp2_module_t *root, *layer[LAYERS];
    param_state_t ps[2 * LAYERS];
    ASSERT_OK(fsdp2_module_create("", &root));
    for (int l = 0; l < LAYERS; l++) {
        char name[8];
        snprintf(name, sizeof name, "l%d", l);
        ASSERT_OK(fsdp2_module_create(name, &layer[l]));
        ASSERT_OK(fsdp2_module_add_child(root, layer[l]));
        for (int k = 0; k < 2; k++) {
            param_state_t *p = &ps[2 * l + k];
            int64_t dims[2] = {ROWS, COLS[l]};
            p->numel = k == 0 ? ROWS * COLS[l] : ROWS;
            p->w = xmalloc((size_t)p->numel * sizeof(float));
            p->t = xmalloc((size_t)p->numel * sizeof(float));
            random_values(p->w, FSDP2_F32, (size_t)p->numel, 2);
            random_values(p->t, FSDP2_F32, (size_t)p->numel, 2);
            fsdp2_tensor_t *value;
            ASSERT_OK(fsdp2_tensor_empty(cpu, FSDP2_F32, k == 0 ? 2 : 1, dims, &value));
            memcpy(value->data, p->w, (size_t)p->numel * sizeof(float));
            ASSERT_OK(fsdp2_module_add_param(layer[l], k == 0 ? "weight" : "bias", value, 1,
                                             &p->p));
            fsdp2_tensor_release(value);
        }
    }
    /* The targets take device memory before the baseline. */
    for (int i = 0; i < 2 * LAYERS; i++) {
        ASSERT_OK(fsdp2_device_alloc(dut, (size_t)ps[i].numel * sizeof(float),
                                     (void **)&ps[i].t_dev));
        ASSERT_OK(upload(ps[i].t_dev, ps[i].t, (size_t)ps[i].numel * sizeof(float), cur));
    }
    ASSERT_OK(fsdp2_stream_synchronize(cur));
    fsdp2_memory_stats_t before;
    ASSERT_OK(fsdp2_memory_stats_get(dut, &before));
    size_t free0 = device_free_bytes();

    fsdp2_shard_options_t opts = FSDP2_SHARD_OPTIONS_INIT;
    opts.mesh = mesh;
    opts.device = dut;
    if (bf16) {
        opts.mp.param_dtype = FSDP2_BF16;
        opts.mp.reduce_dtype = FSDP2_F32;
    }
    for (int l = 0; l < LAYERS; l++)
        ASSERT_OK(fsdp2_fully_shard(layer[l], &opts));
    ASSERT_OK(fsdp2_fully_shard(root, &opts));
    fsdp2_memory_plan_t plan = {.size = sizeof plan};
    ASSERT_OK(fsdp2_memory_plan(root, &plan));
    size_t free1 = device_free_bytes();
    fsdp2_memory_stats_t planned;
    ASSERT_OK(fsdp2_memory_stats_get(dut, &planned));
    printf("    %s: plan %llu bytes (sharded params %llu, grads %llu, unsharded params %llu, "
           "grads %llu, reduce-scatter %llu); cudaMemGetInfo took %zu, the allocator holds "
           "%llu\n",
           label, (unsigned long long)plan.total,
           (unsigned long long)plan.sharded_params, (unsigned long long)plan.sharded_grads,
           (unsigned long long)plan.unsharded_params, (unsigned long long)plan.unsharded_grads,
           (unsigned long long)plan.reduce_scatter, free0 - free1,
           (unsigned long long)(planned.allocated_bytes - before.allocated_bytes));
    ASSERT_EQ_U64(planned.allocated_bytes - before.allocated_bytes, plan.total);
    /* Every planned buffer is whole 2 MiB pages here; the side streams and events the
     * root creates with its buffers may take one more page of the driver's. */
    ASSERT_TRUE(free0 - free1 >= plan.total && free0 - free1 <= plan.total + GRANULE,
                "cudaMemGetInfo took %zu bytes for a plan of %llu", free0 - free1,
                (unsigned long long)plan.total);
    /* The optimizer's device tables (and state, none for plain SGD) come after the plan. */
    fsdp2_optimizer_options_t oo = FSDP2_SGD_OPTIONS_INIT(LR);
    fsdp2_optimizer_t *opt;
    ASSERT_OK(fsdp2_optimizer_create(root, &oo, &opt));
    free1 = device_free_bytes();
    ASSERT_OK(fsdp2_memory_stats_get(dut, &planned));

    double step_ms = 0;
    for (int step = 0; step < STEPS; step++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ASSERT_OK(fsdp2_pre_forward(root));
        for (int l = 0; l < LAYERS; l++) {
            ASSERT_OK(fsdp2_pre_forward(layer[l]));
            ASSERT_OK(fsdp2_post_forward(layer[l]));
        }
        ASSERT_OK(fsdp2_post_forward(root));
        ASSERT_OK(fsdp2_pre_backward(root));
        for (int l = LAYERS - 1; l >= 0; l--) {
            ASSERT_OK(fsdp2_pre_backward(layer[l]));
            ASSERT_OK(write_grad(&ps[2 * l], cur));
            ASSERT_OK(write_grad(&ps[2 * l + 1], cur));
            ASSERT_OK(fsdp2_post_backward(layer[l]));
        }
        ASSERT_OK(fsdp2_post_backward(root));
        ASSERT_OK(fsdp2_backward_finish(root));
        ASSERT_OK(fsdp2_optimizer_step(opt)); /* SGD on the shards, on the device */
        for (int i = 0; i < 2 * LAYERS; i++)
            reference_step(&ps[i], bf16);
        ASSERT_OK(fsdp2_optimizer_zero_grad(opt));
        ASSERT_OK(fsdp2_stream_synchronize(cur));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (step > 0)
            step_ms += (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
        /* Nothing taken during a step. */
        size_t free_now = device_free_bytes();
        ASSERT_TRUE(free_now >= free1, "step %d: %zu more bytes of device memory taken", step,
                    free1 - free_now);
        if (free_now > free1)
            printf("    step %d: %zu bytes of device memory given back by the runtime\n", step,
                   free_now - free1);
        fsdp2_memory_stats_t now;
        ASSERT_OK(fsdp2_memory_stats_get(dut, &now));
        ASSERT_EQ_U64(now.peak_allocated_bytes, planned.allocated_bytes);
        /* Every parameter against the reference, to the bit. */
        for (int i = 0; i < 2 * LAYERS; i++) {
            fsdp2_dtensor_t *w;
            fsdp2_tensor_t *wl;
            ASSERT_OK(fsdp2_param_sharded(ps[i].p, &w));
            ASSERT_OK(fsdp2_dtensor_to_local(w, &wl));
            float *got = xmalloc(wl->nbytes);
            ASSERT_OK(download(got, wl->data, wl->nbytes, cur));
            fsdp2_tensor_release(wl);
            long d = first_difference(got, ps[i].w, FSDP2_F32, (size_t)ps[i].numel);
            if (d >= 0)
                FAIL("%s step %d param %d element %ld: %.9g, reference %.9g",
                     label, step, i, d, got[d], ps[i].w[d]);
            free(got);
            if (d >= 0)
                return;
        }
    }
    printf("    %s: %d steps, %.3f ms per step after the first\n", label, STEPS,
           step_ms / (STEPS - 1));
    for (int i = 0; i < 2 * LAYERS; i++) {
        fsdp2_device_free(dut, ps[i].t_dev);
        free(ps[i].w);
        free(ps[i].t);
    }
    fsdp2_device_free(dut, warm_a);
    fsdp2_device_free(dut, warm_b);
    ASSERT_OK(fsdp2_optimizer_destroy(opt));
    ASSERT_OK(fsdp2_module_destroy(root));
    ASSERT_OK(fsdp2_mesh_destroy(mesh));
    ASSERT_OK(fsdp2_store_destroy(store));
}

int main(int argc, char **argv)
{
    int count = 0;
    if (fsdp2_cuda_device_count(&count) != FSDP2_SUCCESS || count == 0) {
        printf("SKIP: no CUDA device (%s)\n", fsdp2_last_error());
        return 77;
    }
    /* One configuration per process (argv[1]: 0, 1 or 2; none: all three here), so
     * that one run's communicator is not torn down during another's steps. */
    static const char *const names[3] = {"fsdp_f32", "fsdp_bf16", "hsdp_1x1_bf16"};
    int only = argc > 1 ? atoi(argv[1]) : -1;
    for (int config = 0; config < 3; config++) {
        if (only >= 0 && config != only)
            continue;
        int before = failures;
        run(config > 0, config == 2);
        printf("%s - %s_20_steps_match_reference_and_plan\n", failures == before ? "ok" : "FAIL",
               names[config]);
    }
    if (failures)
        fprintf(stderr, "test_fsdp_cuda: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
