/* fsdp2_clip_grad_norm on cuda shards (an nccl mesh of one on cuda:0) against the same
 * computation on the host: the 2-norm (the sum of squares in double; only its order
 * differs, so the norm is compared to 1e-12 relative and the gradients are checked
 * against the host's scaling by the coefficient of the norm the library returned, to
 * the bit), the inf-norm (order-free: the norm and the gradients to the bit), a NaN
 * gradient making the inf-norm and every gradient NaN, and a max_norm above the norm
 * leaving the gradients alone. Two modules: f32 parameters (one with 70001 elements, so
 * many blocks meet in the atomics) and f64 ones.
 *
 * A standalone program: exit 0 on success, 1 on failure, 77 without a CUDA device. */
#include "gpu_check.h"

static const fsdp2_device_t dut = {FSDP2_DEVICE_CUDA, 0};
static const fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;

#define PARAMS 4
static const int64_t ROWS[PARAMS] = {700, 3, 33, 17};
static const int64_t COLS[PARAMS] = {100, 1, 5, 2};
static const fsdp2_dtype_t TYPES[PARAMS] = {FSDP2_F32, FSDP2_F32, FSDP2_F64, FSDP2_F64};

typedef struct model {
    fsdp2_store_t *store;
    fsdp2_mesh_t *mesh;
    fsdp2_module_t *root;
    fsdp2_param_t *p[PARAMS];
    double *host[PARAMS]; /* the gradients as doubles (exact for f32) */
} model_t;

static void model_create(model_t *m)
{
    memset(m, 0, sizeof *m);
    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.is_server = 1;
    ASSERT_OK(fsdp2_store_create(&so, &m->store));
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.backend = FSDP2_BACKEND_NCCL;
    go.cuda_device = 0;
    int shape[1] = {1};
    ASSERT_OK(fsdp2_mesh_create(m->store, "clip", 0, 1, 1, shape, NULL, &go, &m->mesh));
    fsdp2_module_t *f32, *f64;
    ASSERT_OK(fsdp2_module_create("", &m->root));
    ASSERT_OK(fsdp2_module_create("a", &f32));
    ASSERT_OK(fsdp2_module_create("b", &f64));
    ASSERT_OK(fsdp2_module_add_child(m->root, f32));
    ASSERT_OK(fsdp2_module_add_child(m->root, f64));
    for (int i = 0; i < PARAMS; i++) {
        int64_t dims[2] = {ROWS[i], COLS[i]};
        fsdp2_tensor_t *v;
        ASSERT_OK(fsdp2_tensor_zeros(cpu, TYPES[i], 2, dims, &v));
        char name[8];
        snprintf(name, sizeof name, "p%d", i);
        ASSERT_OK(fsdp2_module_add_param(i < 2 ? f32 : f64, name, v, 1, &m->p[i]));
        fsdp2_tensor_release(v);
    }
    fsdp2_shard_options_t o = FSDP2_SHARD_OPTIONS_INIT;
    o.mesh = m->mesh;
    o.device = dut;
    ASSERT_OK(fsdp2_fully_shard(f32, &o));
    ASSERT_OK(fsdp2_fully_shard(f64, &o));
    ASSERT_OK(fsdp2_fully_shard(m->root, &o));
}

static void model_destroy(model_t *m)
{
    for (int i = 0; i < PARAMS; i++)
        free(m->host[i]);
    fsdp2_module_destroy(m->root);
    fsdp2_mesh_destroy(m->mesh);
    fsdp2_store_destroy(m->store);
}

static fsdp2_tensor_t *grad_of(const model_t *m, int i)
{
    fsdp2_dtensor_t *g;
    fsdp2_tensor_t *local = NULL;
    if (fsdp2_param_sharded_grad(m->p[i], &g) != FSDP2_SUCCESS ||
        fsdp2_dtensor_to_local(g, &local) != FSDP2_SUCCESS) {
        fprintf(stderr, "grad_of: %s\n", fsdp2_last_error());
        exit(1);
    }
    return local;
}

/* Random gradients (one NaN at index nan_at of parameter 0 when >= 0) on the device and
 * as doubles on the host. */
static void set_grads(model_t *m, long nan_at)
{
    fsdp2_stream_t *s;
    ASSERT_OK(fsdp2_stream_current(dut, &s));
    for (int i = 0; i < PARAMS; i++) {
        fsdp2_tensor_t *g = grad_of(m, i);
        size_t n = (size_t)g->numel;
        void *h = xmalloc(g->nbytes);
        random_values(h, TYPES[i], n, 4);
        if (i == 0 && nan_at >= 0)
            ((float *)h)[nan_at] = NAN;
        free(m->host[i]);
        m->host[i] = xmalloc(n * sizeof(double));
        fsdp2_convert(m->host[i], FSDP2_F64, h, TYPES[i], n);
        ASSERT_OK(upload(g->data, h, g->nbytes, s));
        free(h);
        fsdp2_tensor_release(g);
    }
}

/* The host's norm, in its order (lib/optim/clip_grad.c). */
static double host_norm(const model_t *m, int inf)
{
    double share = 0.0;
    for (int i = 0; i < PARAMS; i++)
        for (int64_t k = 0; k < ROWS[i] * COLS[i]; k++) {
            double v = m->host[i][k];
            if (inf)
                share = (isnan(share) || share >= fabs(v)) ? share : fabs(v);
            else
                share += v * v;
        }
    return inf ? share : sqrt(share);
}

/* first_difference, with any two NaNs equal (GPUs return one canonical NaN where x86
 * keeps an operand's payload). */
static long first_difference_nan_equal(const void *a, const void *b, fsdp2_dtype_t t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double x, y;
        fsdp2_convert(&x, FSDP2_F64, (const char *)a + i * dsize(t), t, 1);
        fsdp2_convert(&y, FSDP2_F64, (const char *)b + i * dsize(t), t, 1);
        if (isnan(x) && isnan(y))
            continue;
        if (first_difference((const char *)a + i * dsize(t), (const char *)b + i * dsize(t), t,
                             1) >= 0)
            return (long)i;
    }
    return -1;
}

/* The gradients on the device against the host's scaling by the library's coefficient
 * (none when it is >= 1), to the bit. */
static void check_grads(const model_t *m, double norm, double max_norm)
{
    fsdp2_stream_t *s;
    ASSERT_OK(fsdp2_stream_current(dut, &s));
    double coef = max_norm / (norm + 1e-6);
    for (int i = 0; i < PARAMS; i++) {
        fsdp2_tensor_t *g = grad_of(m, i);
        size_t n = (size_t)g->numel;
        void *got = xmalloc(g->nbytes), *want = xmalloc(g->nbytes);
        fsdp2_convert(want, TYPES[i], m->host[i], FSDP2_F64, n);
        for (size_t k = 0; !(coef >= 1.0) && k < n; k++) {
            if (TYPES[i] == FSDP2_F32)
                ((float *)want)[k] *= (float)coef;
            else
                ((double *)want)[k] *= coef;
        }
        ASSERT_OK(download(got, g->data, g->nbytes, s));
        long d = first_difference_nan_equal(want, got, TYPES[i], n);
        fsdp2_tensor_release(g);
        if (d >= 0)
            FAIL("parameter %d element %ld: got 0x%llx want 0x%llx (coef %.17g)", i, d,
                 (unsigned long long)elem_bits(got, TYPES[i], (size_t)d),
                 (unsigned long long)elem_bits(want, TYPES[i], (size_t)d), coef);
        free(got);
        free(want);
        if (d >= 0)
            return;
    }
}

static void test_two_norm_matches_the_host(model_t *m)
{
    set_grads(m, -1);
    double want = host_norm(m, 0), norm = -1;
    ASSERT_OK(fsdp2_clip_grad_norm(m->root, 1.0, 2.0, &norm));
    ASSERT_TRUE(fabs(norm - want) <= 1e-12 * want, "norm %.17g, host %.17g", norm, want);
    check_grads(m, norm, 1.0);
}

static void test_inf_norm_matches_the_host_to_the_bit(model_t *m)
{
    set_grads(m, -1);
    double want = host_norm(m, 1), norm = -1;
    ASSERT_OK(fsdp2_clip_grad_norm(m->root, 0.5, INFINITY, &norm));
    ASSERT_TRUE(norm == want, "norm %.17g, host %.17g", norm, want);
    check_grads(m, norm, 0.5);
}

static void test_nan_gradient_makes_everything_nan(model_t *m)
{
    set_grads(m, 12345);
    double norm = 0;
    ASSERT_OK(fsdp2_clip_grad_norm(m->root, 1.0, INFINITY, &norm));
    ASSERT_TRUE(isnan(norm), "inf-norm with a NaN gradient is %g", norm);
    check_grads(m, norm, 1.0);
}

static void test_large_max_norm_leaves_gradients_alone(model_t *m)
{
    set_grads(m, -1);
    double norm = 0;
    ASSERT_OK(fsdp2_clip_grad_norm(m->root, 1e30, 2.0, &norm));
    check_grads(m, norm, 1e30);
}

int main(void)
{
    int count = 0;
    if (fsdp2_cuda_device_count(&count) != FSDP2_SUCCESS || count == 0) {
        printf("SKIP: no CUDA device (%s)\n", fsdp2_last_error());
        return 77;
    }
    model_t m;
    model_create(&m);
    if (failures)
        return 1;
    struct {
        const char *name;
        void (*fn)(model_t *);
    } tests[] = {
#define T(name) {#name, test_##name}
        T(two_norm_matches_the_host),
        T(inf_norm_matches_the_host_to_the_bit),
        T(nan_gradient_makes_everything_nan),
        T(large_max_norm_leaves_gradients_alone),
#undef T
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int before = failures;
        tests[i].fn(&m);
        printf("%s - %s\n", failures == before ? "ok" : "FAIL", tests[i].name);
    }
    model_destroy(&m);
    if (failures)
        fprintf(stderr, "test_clip_cuda: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
