/* One FSDP training step against a replicated (DDP-style) step of the same model, in
 * the same run: a deep MLP (layers x [dim, dim] weights, relu), plain SGD.
 *
 * - ddp: every rank holds the whole model and its gradients; each layer's gradient is
 *   all-reduced (average) on a side stream as soon as its backward is done, as DDP's
 *   buckets do, and the step waits for the last one.
 * - fsdp: every layer is fully_shard'ed, then the root; the step is the hooks of
 *   fsdp2/fsdp.h with implicit prefetch, SGD on the local shards.
 *
 * Reported per mode (rank 0 prints, the slowest rank's numbers): step time (mean over
 * the timed steps), compute time (the matrix products and elementwise work), exposed
 * communication (step - compute: what prefetch and overlap did not hide), the device
 * allocator's peak (parameters, gradients and the library's buffers; activations are
 * malloc'ed and the same in both modes), and parameters+gradients per rank against the
 * ideal total / ws. The loss after the last step is printed for both modes: the same
 * math must give the same value.
 *
 *   fsdp2run --nproc-per-node N build/bench/bench_fsdp_step [--layers 24] [--dim 1024]
 *       [--batch 16] [--steps 6] [--warmup 2] [--rounds 3] [--json FILE] [--trace FILE]
 *       [--reshard-after-forward N] [--hsdp]
 *
 * --trace adds a mode, fsdp with its timed steps traced (fsdp2/trace.h), written to
 * FILE: the row next to plain fsdp is what tracing costs while on. (Off it is one
 * relaxed load per traced operation: the plain fsdp row is that.)
 * --reshard-after-forward N adds fsdp with post-forward shards over blocks of N ranks
 * (the backward's all-gathers inside a block); --hsdp adds HSDP on the [nodes, ranks
 * per node] mesh (run one fsdp2run --nnodes per node). Each prints its step time and
 * planned buffers against plain fsdp.
 *
 * The modes run in rounds of rotating order and each reports its median round: this
 * machine's speed drifts by tens of percent between runs, which would otherwise decide
 * the ratio. */
#include <cblas.h>
#include <math.h>
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

#define MAX_ROUNDS 9

typedef struct config {
    int layers, dim, batch, steps, warmup, rounds;
    int reshard_after_forward; /* > 1: a mode "fsdp raf=N" beside plain fsdp */
    int hsdp;                  /* a mode "hsdp" on fsdp2_context_hsdp_mesh(ctx, 0) */
    const char *json, *trace;
    fsdp2_context_t *ctx;
} config_t;

/* One way to run the step; the table in main lists those this run compares. */
typedef struct mode {
    const char *name;
    int ddp, traced, reshard_after_forward;
    fsdp2_mesh_t *mesh;
} step_mode_t;

typedef struct result {
    double step_ms, compute_ms, exposed_ms;
    uint64_t peak_bytes, param_grad_bytes, plan_buffers;
    double loss;
} result_t;

typedef struct model {
    const config_t *cfg;
    int rank, ws;
    float **h;     /* layers + 1 activations [batch, dim] */
    float *dh, *dh2;
    double compute_s;
} model_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* h_out = relu(h_in W^T) */
static void layer_forward(model_t *m, const float *w, int l)
{
    int b = m->cfg->batch, d = m->cfg->dim;
    double t0 = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, d, d, 1.0f, m->h[l], d, w, d, 0.0f,
                m->h[l + 1], d);
    for (int i = 0; i < b * d; i++)
        m->h[l + 1][i] = m->h[l + 1][i] > 0 ? m->h[l + 1][i] : 0;
    m->compute_s += now() - t0;
}

/* Given dh = dL/dh_{l+1}: dW += (dh * relu') ^T h_l; dh <- (dh * relu') W. */
static void layer_backward(model_t *m, const float *w, float *dw, int l)
{
    int b = m->cfg->batch, d = m->cfg->dim;
    double t0 = now();
    for (int i = 0; i < b * d; i++)
        m->dh[i] = m->h[l + 1][i] > 0 ? m->dh[i] : 0;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, b, 1.0f, m->dh, d, m->h[l], d, 1.0f,
                dw, d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, d, d, 1.0f, m->dh, d, w, d, 0.0f,
                m->dh2, d);
    float *t = m->dh;
    m->dh = m->dh2;
    m->dh2 = t;
    m->compute_s += now() - t0;
}

/* loss = 0.5 * mean(h_L^2); dh = h_L / (batch * dim). */
static double loss_grad(model_t *m)
{
    int b = m->cfg->batch, d = m->cfg->dim, L = m->cfg->layers;
    double loss = 0;
    for (int i = 0; i < b * d; i++) {
        loss += 0.5 * (double)m->h[L][i] * m->h[L][i];
        m->dh[i] = m->h[L][i] / (float)(b * d);
    }
    return loss / ((double)b * d);
}

static void sgd(model_t *m, float *w, const float *g, int64_t n)
{
    double t0 = now();
    for (int64_t i = 0; i < n; i++)
        w[i] -= 0.01f * g[i];
    m->compute_s += now() - t0;
}

static fsdp2_random_init_t weight_init(const config_t *cfg, int l)
{
    fsdp2_random_init_t init = FSDP2_RANDOM_NORMAL_INIT((uint64_t)(1000 + l), 0.0,
                                                        1.4 / sqrt((double)cfg->dim));
    return init;
}

static void fill_input(model_t *m)
{
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    int64_t shape[2] = {m->cfg->batch, m->cfg->dim};
    fsdp2_tensor_t *x;
    CHECK(fsdp2_tensor_from_blob(m->h[0], cpu, FSDP2_F32, 2, shape, NULL, NULL, &x));
    fsdp2_random_init_t init = FSDP2_RANDOM_UNIFORM_INIT((uint64_t)(7 + m->rank), -1.0, 1.0);
    CHECK(fsdp2_random_fill(x, &init, NULL, NULL));
    fsdp2_tensor_release(x);
}

static void run_ddp(model_t *m, fsdp2_group_t *world, result_t *res)
{
    const config_t *c = m->cfg;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    int64_t shape[2] = {c->dim, c->dim};
    fsdp2_tensor_t **w = calloc((size_t)c->layers, sizeof(*w));
    fsdp2_tensor_t **g = calloc((size_t)c->layers, sizeof(*g));
    fsdp2_stream_t *side, *current;
    CHECK(fsdp2_stream_create(cpu, "ddp-all-reduce", &side));
    CHECK(fsdp2_stream_current(cpu, &current));
    fsdp2_memory_stats_t before;
    CHECK(fsdp2_memory_stats_get(cpu, &before));
    CHECK(fsdp2_memory_stats_reset_peak(cpu));
    for (int l = 0; l < c->layers; l++) {
        CHECK(fsdp2_tensor_empty(cpu, FSDP2_F32, 2, shape, &w[l]));
        CHECK(fsdp2_tensor_zeros(cpu, FSDP2_F32, 2, shape, &g[l]));
        fsdp2_random_init_t init = weight_init(c, l);
        CHECK(fsdp2_random_fill(w[l], &init, NULL, NULL));
    }
    fsdp2_reduce_t avg = FSDP2_REDUCE_AVG_INIT;
    double t_total = 0, c_total = 0;
    for (int step = 0; step < c->warmup + c->steps; step++) {
        fill_input(m);
        m->compute_s = 0;
        double t0 = now();
        for (int l = 0; l < c->layers; l++)
            layer_forward(m, w[l]->data, l);
        res->loss = loss_grad(m);
        for (int l = c->layers - 1; l >= 0; l--) {
            layer_backward(m, w[l]->data, g[l]->data, l);
            CHECK(fsdp2_all_reduce_async(world, g[l]->data, (size_t)g[l]->numel, FSDP2_F32, &avg,
                                         side));
        }
        CHECK(fsdp2_stream_synchronize(side));
        for (int l = 0; l < c->layers; l++) {
            sgd(m, w[l]->data, g[l]->data, w[l]->numel);
            CHECK(fsdp2_fill_async(g[l]->data, FSDP2_F32, (size_t)g[l]->numel, 0.0, current));
        }
        if (step >= c->warmup) {
            t_total += now() - t0;
            c_total += m->compute_s;
        }
    }
    fsdp2_memory_stats_t after;
    CHECK(fsdp2_memory_stats_get(cpu, &after));
    res->step_ms = 1e3 * t_total / c->steps;
    res->compute_ms = 1e3 * c_total / c->steps;
    res->exposed_ms = res->step_ms - res->compute_ms;
    res->peak_bytes = after.peak_allocated_bytes - before.allocated_bytes;
    res->param_grad_bytes = 2ull * (uint64_t)c->layers * (uint64_t)c->dim * (uint64_t)c->dim * 4;
    res->plan_buffers = 0;
    for (int l = 0; l < c->layers; l++) {
        fsdp2_tensor_release(w[l]);
        fsdp2_tensor_release(g[l]);
    }
    CHECK(fsdp2_stream_destroy(side));
    free(w);
    free(g);
}

/* The mode's mesh and reshard_after_forward; traced: the timed steps are traced into
 * cfg->trace (written after them). */
static void run_fsdp(model_t *m, const step_mode_t *mode, result_t *res)
{
    int traced = mode->traced;
    const config_t *c = m->cfg;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT, meta = FSDP2_DEVICE_META_INIT;
    int64_t shape[2] = {c->dim, c->dim};
    fsdp2_memory_stats_t before;
    CHECK(fsdp2_memory_stats_get(cpu, &before));
    CHECK(fsdp2_memory_stats_reset_peak(cpu));
    fsdp2_module_t *root, **layer = calloc((size_t)c->layers, sizeof(*layer));
    fsdp2_param_t **w = calloc((size_t)c->layers, sizeof(*w));
    CHECK(fsdp2_module_create("", &root));
    for (int l = 0; l < c->layers; l++) {
        char name[16];
        snprintf(name, sizeof(name), "%d", l);
        CHECK(fsdp2_module_create(name, &layer[l]));
        CHECK(fsdp2_module_add_child(root, layer[l]));
        fsdp2_tensor_t *value;
        CHECK(fsdp2_tensor_empty(meta, FSDP2_F32, 2, shape, &value));
        CHECK(fsdp2_module_add_param(layer[l], "weight", value, 1, &w[l]));
        fsdp2_tensor_release(value);
        fsdp2_random_init_t init = weight_init(c, l);
        CHECK(fsdp2_param_set_random_init(w[l], &init));
    }
    fsdp2_shard_options_t o = FSDP2_SHARD_OPTIONS_INIT;
    o.mesh = mode->mesh;
    o.reshard_after_forward = mode->reshard_after_forward;
    for (int l = 0; l < c->layers; l++)
        CHECK(fsdp2_fully_shard(layer[l], &o));
    CHECK(fsdp2_fully_shard(root, &o));
    CHECK(fsdp2_module_materialize(root, NULL, NULL));
    fsdp2_memory_plan_t plan = {.size = sizeof(plan)};
    CHECK(fsdp2_memory_plan(root, &plan));
    double t_total = 0, c_total = 0;
    for (int step = 0; step < c->warmup + c->steps; step++) {
        if (traced && step == c->warmup)
            CHECK(fsdp2_trace_start(c->ctx, c->trace));
        fill_input(m);
        m->compute_s = 0;
        double t0 = now();
        CHECK(fsdp2_trace_step(step));
        CHECK(fsdp2_pre_forward(root));
        for (int l = 0; l < c->layers; l++) {
            fsdp2_tensor_t *W;
            CHECK(fsdp2_pre_forward(layer[l]));
            CHECK(fsdp2_param_unsharded(w[l], &W));
            layer_forward(m, W->data, l);
            CHECK(fsdp2_post_forward(layer[l]));
        }
        CHECK(fsdp2_post_forward(root));
        res->loss = loss_grad(m);
        CHECK(fsdp2_pre_backward(root));
        for (int l = c->layers - 1; l >= 0; l--) {
            fsdp2_tensor_t *W, *G;
            CHECK(fsdp2_pre_backward(layer[l]));
            CHECK(fsdp2_param_unsharded(w[l], &W));
            CHECK(fsdp2_param_grad(w[l], &G));
            layer_backward(m, W->data, G->data, l);
            CHECK(fsdp2_post_backward(layer[l]));
        }
        CHECK(fsdp2_post_backward(root));
        CHECK(fsdp2_backward_finish(root));
        for (int l = 0; l < c->layers; l++) {
            fsdp2_dtensor_t *p, *g;
            fsdp2_tensor_t *pl, *gl;
            CHECK(fsdp2_param_sharded(w[l], &p));
            CHECK(fsdp2_param_sharded_grad(w[l], &g));
            CHECK(fsdp2_dtensor_to_local(p, &pl));
            CHECK(fsdp2_dtensor_to_local(g, &gl));
            sgd(m, pl->data, gl->data, pl->numel);
            fsdp2_tensor_release(pl);
            fsdp2_tensor_release(gl);
        }
        CHECK(fsdp2_module_zero_grad(root));
        if (step >= c->warmup) {
            t_total += now() - t0;
            c_total += m->compute_s;
        }
    }
    if (traced)
        CHECK(fsdp2_trace_stop(c->ctx));
    fsdp2_memory_stats_t after;
    CHECK(fsdp2_memory_stats_get(cpu, &after));
    res->step_ms = 1e3 * t_total / c->steps;
    res->compute_ms = 1e3 * c_total / c->steps;
    res->exposed_ms = res->step_ms - res->compute_ms;
    res->peak_bytes = after.peak_allocated_bytes - before.allocated_bytes;
    res->param_grad_bytes = plan.sharded_params + plan.sharded_grads;
    res->plan_buffers = plan.total - res->param_grad_bytes;
    CHECK(fsdp2_module_destroy(root));
    free(layer);
    free(w);
}

/* The slowest rank's times and the largest peak, on every rank. */
static void reduce_max(fsdp2_group_t *world, fsdp2_stream_t *s, result_t *r)
{
    double v[4] = {r->step_ms, r->compute_ms, r->exposed_ms, (double)r->peak_bytes};
    int ws;
    CHECK(fsdp2_group_size(world, &ws));
    double *all = calloc((size_t)ws * 4, sizeof(double));
    CHECK(fsdp2_all_gather_async(world, v, all, 4, FSDP2_F64, s));
    CHECK(fsdp2_stream_synchronize(s));
    for (int k = 0; k < ws; k++) {
        for (int j = 0; j < 4; j++)
            v[j] = all[k * 4 + j] > v[j] ? all[k * 4 + j] : v[j];
    }
    r->step_ms = v[0];
    r->compute_ms = v[1];
    r->exposed_ms = v[2];
    r->peak_bytes = (uint64_t)v[3];
    free(all);
}

static int by_step(const void *a, const void *b)
{
    double x = ((const result_t *)a)->step_ms, y = ((const result_t *)b)->step_ms;
    return (x > y) - (x < y);
}

/* The round with the median step time. */
static result_t median(result_t *runs, int n)
{
    qsort(runs, (size_t)n, sizeof(*runs), by_step);
    return runs[n / 2];
}

static void parse(int argc, char **argv, config_t *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *field = !strcmp(a, "--layers") ? &c->layers
                     : !strcmp(a, "--dim")   ? &c->dim
                     : !strcmp(a, "--batch") ? &c->batch
                     : !strcmp(a, "--steps") ? &c->steps
                     : !strcmp(a, "--warmup") ? &c->warmup
                     : !strcmp(a, "--rounds") ? &c->rounds
                                              : NULL;
        if (field && v && atoi(v) > 0) {
            *field = atoi(v);
            i++;
        } else if (!strcmp(a, "--reshard-after-forward") && v && atoi(v) > 0) {
            c->reshard_after_forward = atoi(argv[++i]);
        } else if (!strcmp(a, "--hsdp")) {
            c->hsdp = 1;
        } else if (!strcmp(a, "--json") && v) {
            c->json = argv[++i];
        } else if (!strcmp(a, "--trace") && v) {
            c->trace = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--layers N] [--dim N] [--batch N] [--steps N] "
                            "[--warmup N] [--rounds N] [--reshard-after-forward N] [--hsdp] [--json FILE] "
                            "[--trace FILE] (bad "
                            "argument '%s')\n",
                    argv[0], a);
            exit(2);
        }
    }
}

static void print_row(const char *mode, int ws, const result_t *r)
{
    printf("| %s | %d | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %.6g |\n", mode, ws, r->step_ms,
           r->compute_ms, r->exposed_ms, r->peak_bytes / 1048576.0,
           r->param_grad_bytes / 1048576.0, r->plan_buffers / 1048576.0, r->loss);
}

int main(int argc, char **argv)
{
    config_t cfg = {24, 1024, 16, 6, 2, 3, 1, 0, NULL, NULL, NULL};
    parse(argc, argv, &cfg);
    if (cfg.rounds > MAX_ROUNDS)
        cfg.rounds = MAX_ROUNDS;
    openblas_set_num_threads(1);
    fsdp2_context_t *ctx;
    CHECK(fsdp2_init(NULL, &ctx));
    cfg.ctx = ctx;
    fsdp2_group_t *world;
    fsdp2_mesh_t *mesh;
    fsdp2_process_info_t info;
    CHECK(fsdp2_context_world(ctx, &world));
    CHECK(fsdp2_context_mesh(ctx, &mesh));
    CHECK(fsdp2_context_info(ctx, &info));
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *s;
    CHECK(fsdp2_stream_create(cpu, "bench", &s));
    model_t m = {.cfg = &cfg, .rank = info.rank, .ws = info.world_size};
    size_t act = (size_t)cfg.batch * (size_t)cfg.dim;
    m.h = calloc((size_t)cfg.layers + 1, sizeof(*m.h));
    for (int l = 0; l <= cfg.layers; l++)
        m.h[l] = malloc(act * sizeof(float));
    m.dh = malloc(act * sizeof(float));
    m.dh2 = malloc(act * sizeof(float));

    /* The modes: ddp and fsdp always; fsdp traced, fsdp with reshard_after_forward N and
     * HSDP when asked. */
    step_mode_t modes[5] = {{"ddp", 1, 0, 1, NULL}, {"fsdp", 0, 0, 1, mesh}};
    int nmodes = 2;
    char raf_name[32];
    if (cfg.trace)
        modes[nmodes++] = (step_mode_t){"fsdp traced", 0, 1, 1, mesh};
    if (cfg.reshard_after_forward > 1) {
        snprintf(raf_name, sizeof(raf_name), "fsdp raf=%d", cfg.reshard_after_forward);
        modes[nmodes++] = (step_mode_t){raf_name, 0, 0, cfg.reshard_after_forward, mesh};
    }
    if (cfg.hsdp) {
        fsdp2_mesh_t *hsdp;
        CHECK(fsdp2_context_hsdp_mesh(ctx, 0, &hsdp));
        modes[nmodes++] = (step_mode_t){"hsdp", 0, 0, 1, hsdp};
    }
    /* Rounds in rotating order (ddp fsdp ..., fsdp ... ddp, ...); each mode reports its
     * median round, so slow drifts of the machine hit every mode alike. */
    result_t runs[5][MAX_ROUNDS], res[5];
    for (int round = 0; round < cfg.rounds; round++) {
        for (int k = 0; k < nmodes; k++) {
            int i = (k + round) % nmodes;
            if (modes[i].ddp)
                run_ddp(&m, world, &runs[i][round]);
            else
                run_fsdp(&m, &modes[i], &runs[i][round]);
            reduce_max(world, s, &runs[i][round]);
        }
    }
    for (int i = 0; i < nmodes; i++)
        res[i] = median(runs[i], cfg.rounds);
    const result_t *ddp = &res[0], *fsdp = &res[1];
    uint64_t ideal = 2ull * (uint64_t)cfg.layers * (uint64_t)cfg.dim * (uint64_t)cfg.dim * 4 /
                     (uint64_t)info.world_size;
    if (info.rank == 0) {
        printf("fsdp_step: %d layers x [%d, %d] f32, batch %d per rank, %d ranks, %d timed steps, "
               "median of %d rounds\n",
               cfg.layers, cfg.dim, cfg.dim, cfg.batch, info.world_size, cfg.steps, cfg.rounds);
        printf("| mode | ws | step ms | compute ms | exposed comm ms | peak MiB | params+grads MiB "
               "| planned buffers MiB | loss |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (int i = 0; i < nmodes; i++)
            print_row(modes[i].name, info.world_size, &res[i]);
        printf("fsdp/ddp step time %.3f; fsdp params+grads / (total/ws) = %.4f\n",
               fsdp->step_ms / ddp->step_ms, (double)fsdp->param_grad_bytes / (double)ideal);
        for (int i = 2; i < nmodes; i++)
            printf("%s/fsdp step time %.3f, planned buffers %+.1f MiB%s%s\n", modes[i].name,
                   res[i].step_ms / fsdp->step_ms,
                   ((double)res[i].plan_buffers - (double)fsdp->plan_buffers) / 1048576.0,
                   modes[i].traced ? "; trace of the last round's timed steps in " : "",
                   modes[i].traced ? cfg.trace : "");
        FILE *f = cfg.json ? fopen(cfg.json, "w") : NULL;
        if (f) {
            fprintf(f, "{\"layers\": %d, \"dim\": %d, \"batch\": %d, \"ws\": %d, \"modes\": [",
                    cfg.layers, cfg.dim, cfg.batch, info.world_size);
            for (int i = 0; i < nmodes; i++)
                fprintf(f,
                        "%s{\"mode\": \"%s\", \"step_ms\": %.4f, \"compute_ms\": %.4f, "
                        "\"exposed_ms\": %.4f, \"peak_bytes\": %llu, \"param_grad_bytes\": "
                        "%llu, \"planned_buffer_bytes\": %llu, \"loss\": %.9g, "
                        "\"step_over_fsdp\": %.4f}",
                        i ? ", " : "", modes[i].name, res[i].step_ms, res[i].compute_ms,
                        res[i].exposed_ms, (unsigned long long)res[i].peak_bytes,
                        (unsigned long long)res[i].param_grad_bytes,
                        (unsigned long long)res[i].plan_buffers, res[i].loss,
                        res[i].step_ms / fsdp->step_ms);
            fprintf(f, "], \"step_ratio\": %.4f, \"param_grad_over_ideal\": %.5f}\n",
                    fsdp->step_ms / ddp->step_ms, (double)fsdp->param_grad_bytes / (double)ideal);
            fclose(f);
        }
    }
    for (int l = 0; l <= cfg.layers; l++)
        free(m.h[l]);
    free(m.h);
    free(m.dh);
    free(m.dh2);
    CHECK(fsdp2_stream_destroy(s));
    CHECK(fsdp2_finalize(ctx));
    return 0;
}
