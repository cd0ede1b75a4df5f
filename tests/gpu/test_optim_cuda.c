/* The optimizers' multi-tensor kernel (lib/cuda/cuda_optim.cu, through the CUDA module's
 * table) against the host rules (update_rules.c), bit for bit: SGD (plain, momentum with dampening, nesterov, weight
 * decay), AdamW and Adadelta, f32 and f64, over shards of uneven sizes (one element, one
 * under and one over a 64 Ki-element chunk, several chunks, and an empty one), for five
 * steps from random non-zero parameters, gradients and state.
 *
 * A standalone program: exit 0 on success, 1 on failure, 77 without a CUDA device. */
#include "core/cuda_loader.h"
#include "gpu_check.h"
#include "optim/optim_internal.h"

static const fsdp2_device_t dut = {FSDP2_DEVICE_CUDA, 0};

#define SHARDS 5
static const int64_t SIZES[SHARDS] = {1, 65535, 65537, 200003, 0};

typedef struct side {
    optim_shard_t shards[SHARDS];
} side_t;

static void check_rule(fsdp2_dtype_t t, fsdp2_optimizer_options_t o, const char *label)
{
    fsdp2_stream_t *s;
    ASSERT_OK(fsdp2_stream_current(dut, &s));
    size_t es = dsize(t);
    side_t host, dev;
    void *host_grads[SHARDS];
    for (int i = 0; i < SHARDS; i++) {
        size_t n = (size_t)SIZES[i], bytes = n * es;
        host.shards[i].numel = dev.shards[i].numel = SIZES[i];
        void *p = xmalloc(bytes), *g = xmalloc(bytes), *m = xmalloc(bytes), *v = xmalloc(bytes);
        random_values(p, t, n, 3);
        random_values(g, t, n, 3);
        random_values(m, t, n, 3);
        random_values(v, t, n, 3);
        /* second moments and Adadelta's accumulators are squares: non-negative */
        for (size_t k = 0; k < n; k++) {
            double x;
            fsdp2_convert(&x, FSDP2_F64, (char *)v + k * es, t, 1);
            x = fabs(x);
            fsdp2_convert((char *)v + k * es, t, &x, FSDP2_F64, 1);
            if (o.kind == FSDP2_OPTIMIZER_ADADELTA) {
                fsdp2_convert(&x, FSDP2_F64, (char *)m + k * es, t, 1);
                x = fabs(x);
                fsdp2_convert((char *)m + k * es, t, &x, FSDP2_F64, 1);
            }
        }
        host.shards[i].param = p;
        host.shards[i].grad = g;
        host.shards[i].state[0] = m;
        host.shards[i].state[1] = v;
        host_grads[i] = g;
        void *dp, *dg, *dm, *dv;
        ASSERT_OK(fsdp2_device_alloc(dut, bytes, &dp));
        ASSERT_OK(fsdp2_device_alloc(dut, bytes, &dg));
        ASSERT_OK(fsdp2_device_alloc(dut, bytes, &dm));
        ASSERT_OK(fsdp2_device_alloc(dut, bytes, &dv));
        if (bytes) {
            ASSERT_OK(upload(dp, p, bytes, s));
            ASSERT_OK(upload(dg, g, bytes, s));
            ASSERT_OK(upload(dm, m, bytes, s));
            ASSERT_OK(upload(dv, v, bytes, s));
        }
        dev.shards[i].param = dp;
        dev.shards[i].grad = dg;
        dev.shards[i].state[0] = dm;
        dev.shards[i].state[1] = dv;
    }
    const fsdp2_cuda_module_t *cuda = NULL;
    ASSERT_OK(fsdp2_cuda_module_get(&cuda));
    size_t nchunks = cuda->optim_chunks(dev.shards, SHARDS);
    fsdp2_cuda_optim_chunk_t *chunks = xmalloc(nchunks * sizeof(*chunks));
    cuda->optim_fill_chunks(dev.shards, SHARDS, chunks);
    void *dshards, *dchunks;
    ASSERT_OK(fsdp2_device_alloc(dut, sizeof dev.shards, &dshards));
    ASSERT_OK(fsdp2_device_alloc(dut, nchunks * sizeof(*chunks), &dchunks));
    ASSERT_OK(upload(dshards, dev.shards, sizeof dev.shards, s));
    ASSERT_OK(upload(dchunks, chunks, nchunks * sizeof(*chunks), s));
    for (int step = 0; step < 5; step++) {
        optim_coeffs_t c = {.kind = o.kind, .lr = o.lr, .weight_decay = o.weight_decay,
                            .momentum = o.momentum, .dampening = o.dampening,
                            .nesterov = o.nesterov, .first_step = step == 0, .beta1 = o.beta1,
                            .beta2 = o.beta2, .eps = o.eps, .rho = o.rho};
        c.bias_correction1 = 1.0 - pow(o.beta1, step + 1);
        c.bias_correction2 = 1.0 - pow(o.beta2, step + 1);
        for (int i = 0; i < SHARDS; i++)
            (t == FSDP2_F32 ? optim_update_f32 : optim_update_f64)(&c, &host.shards[i]);
        ASSERT_OK(cuda->optim_step(0, &c, t, dshards, dchunks, nchunks));
        ASSERT_OK(fsdp2_stream_synchronize(s));
        for (int i = 0; i < SHARDS; i++) {
            size_t n = (size_t)SIZES[i], bytes = n * es;
            void *got = xmalloc(bytes);
            const char *what[3] = {"param", "state0", "state1"};
            void *hp[3] = {host.shards[i].param, host.shards[i].state[0], host.shards[i].state[1]};
            void *dp[3] = {dev.shards[i].param, dev.shards[i].state[0], dev.shards[i].state[1]};
            for (int b = 0; b < 3 && n; b++) {
                ASSERT_OK(download(got, dp[b], bytes, s));
                long d = first_difference(hp[b], got, t, n);
                if (d >= 0) {
                    FAIL("%s %s step %d shard %d (%zu elements) %s[%ld]: host 0x%llx cuda 0x%llx",
                         label, fsdp2_dtype_name(t), step, i, n, what[b], d,
                         (unsigned long long)elem_bits(hp[b], t, (size_t)d),
                         (unsigned long long)elem_bits(got, t, (size_t)d));
                    free(got);
                    return;
                }
            }
            free(got);
        }
    }
    for (int i = 0; i < SHARDS; i++) {
        free(host.shards[i].param);
        free(host_grads[i]);
        free(host.shards[i].state[0]);
        free(host.shards[i].state[1]);
        fsdp2_device_free(dut, dev.shards[i].param);
        fsdp2_device_free(dut, (void *)dev.shards[i].grad);
        fsdp2_device_free(dut, dev.shards[i].state[0]);
        fsdp2_device_free(dut, dev.shards[i].state[1]);
    }
    fsdp2_device_free(dut, dshards);
    fsdp2_device_free(dut, dchunks);
    free(chunks);
}

int main(void)
{
    int count = 0;
    if (fsdp2_cuda_device_count(&count) != FSDP2_SUCCESS || count == 0) {
        printf("SKIP: no CUDA device (%s)\n", fsdp2_last_error());
        return 77;
    }
    fsdp2_optimizer_options_t sgd = FSDP2_SGD_OPTIONS_INIT(0.05);
    fsdp2_optimizer_options_t momentum = sgd, nesterov = sgd, decay = sgd;
    momentum.momentum = 0.9;
    momentum.dampening = 0.1;
    nesterov.momentum = 0.8;
    nesterov.nesterov = 1;
    decay.weight_decay = 0.01;
    fsdp2_optimizer_options_t adamw = FSDP2_ADAMW_OPTIONS_INIT(1e-3);
    fsdp2_optimizer_options_t adadelta = FSDP2_ADADELTA_OPTIONS_INIT(1.0);
    adadelta.weight_decay = 0.001;
    struct {
        const char *name;
        fsdp2_optimizer_options_t o;
    } rules[] = {{"sgd", sgd}, {"sgd_momentum_dampening", momentum}, {"sgd_nesterov", nesterov},
                 {"sgd_weight_decay", decay}, {"adamw", adamw}, {"adadelta", adadelta}};
    for (size_t r = 0; r < sizeof rules / sizeof rules[0]; r++)
        for (int f = 0; f < 2; f++) {
            int before = failures;
            check_rule(f ? FSDP2_F64 : FSDP2_F32, rules[r].o, rules[r].name);
            printf("%s - %s_%s_matches_host_rule\n", failures == before ? "ok" : "FAIL",
                   rules[r].name, f ? "f64" : "f32");
        }
    if (failures)
        fprintf(stderr, "test_optim_cuda: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
