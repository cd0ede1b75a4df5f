/* Fashion-MNIST with FSDP: the recipe of PyTorch's FSDP MNIST tutorial (Adadelta lr 1.0,
 * StepLR gamma 0.7 per epoch, global batch 64, test batch 1000) on libfsdp2, linked the
 * way an outside application links it.
 *
 *   fsdp2run --nproc-per-node 4 build/examples/fashion_mnist --model mlp --epochs 2
 *
 * Each rank trains on its share of every epoch's shuffled order (a distributed sampler),
 * global_batch / ws samples per step; gradients are averaged across ranks by FSDP's
 * reduce-scatter (or, with --no-shard, on a [ws, 1] mesh whose ranks all hold the whole
 * model, by the replicas' all-reduce, DDP style). Rank 0 prints per epoch: train loss, test loss and accuracy, seconds and
 * images/s, and the per-rank memory of parameters, gradients, optimizer state and
 * FSDP's buffers, planned and measured. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fsdp2/fsdp2.h>

#include "common.h"
#include "data.h"
#include "model.h"

#define EVAL_CHUNK 100

typedef struct args {
    const char *model, *data, *optimizer, *json, *save, *resume, *param_dtype, *trace;
    int epochs, batch, test_batch, no_shard, limit, threads;
    int hsdp, reshard_after_forward;
    long trace_from, trace_to; /* traced steps [from, to) of the run */
    double lr, gamma;
    long seed;
    long wrap_min_params;
} args_t;

typedef struct run {
    args_t a;
    int rank, ws, local_world, local_batch;
    fsdp2_context_t *ctx;
    fsdp2_group_t *world;
    fsdp2_stream_t *current;
    fm_set_t train, test;
    fm_model_t *model;
    fsdp2_optimizer_t *opt;
    fsdp2_state_dict_t *state;
    int first_epoch;
    long step; /* training steps run so far (this run) */
    float *x;
    int *labels;
} run_t;

static void usage(const char *prog, const char *bad)
{
    fprintf(stderr,
            "%s%s%s"
            "usage: %s [--model mlp|cnn] [--epochs N] [--batch GLOBAL] [--test-batch N]\n"
            "          [--optimizer adadelta|sgd|adamw] [--lr X] [--gamma X] [--seed N]\n"
            "          [--no-shard | --hsdp] [--reshard-after-forward N] [--wrap-min-params N]\n"
            "          [--data DIR] [--limit N] [--threads N]\n"
            "          [--param-dtype f32|bf16] [--save DIR] [--resume DIR] [--json FILE]\n"
            "          [--trace FILE.json [--trace-steps FROM:TO]]\n",
            bad ? "error: bad argument '" : "", bad ? bad : "", bad ? "'\n" : "", prog);
    exit(2);
}

/* --trace-steps FROM:TO */
static void trace_steps(const char *v, void *to)
{
    args_t *a = to;
    char *end;
    a->trace_from = strtol(v, &end, 10);
    a->trace_to = *end == ':' ? strtol(end + 1, &end, 10) : -1;
    if (*end || a->trace_from < 0 || a->trace_to <= a->trace_from) {
        fprintf(stderr, "error: --trace-steps %s is not FROM:TO with 0 <= FROM < TO\n", v);
        exit(2);
    }
}

static void parse(int argc, char **argv, args_t *a)
{
    *a = (args_t){"mlp", "/usr/share/datasets/fashion-mnist", "adadelta", NULL, NULL, NULL, "f32",
                  NULL, 2, 64, 1000, 0, 0, 0, 0, 1, 10, 15, 1.0, 0.7, 1, 0};
    const example_flag_t flags[] = {
        EXAMPLE_FLAG("--no-shard", EXAMPLE_SWITCH, &a->no_shard),
        EXAMPLE_FLAG("--hsdp", EXAMPLE_SWITCH, &a->hsdp),
        EXAMPLE_FLAG("--model", EXAMPLE_STRING, &a->model),
        EXAMPLE_FLAG("--data", EXAMPLE_STRING, &a->data),
        EXAMPLE_FLAG("--optimizer", EXAMPLE_STRING, &a->optimizer),
        EXAMPLE_FLAG("--json", EXAMPLE_STRING, &a->json),
        EXAMPLE_FLAG("--param-dtype", EXAMPLE_STRING, &a->param_dtype),
        EXAMPLE_FLAG("--save", EXAMPLE_STRING, &a->save),
        EXAMPLE_FLAG("--resume", EXAMPLE_STRING, &a->resume),
        EXAMPLE_FLAG("--trace", EXAMPLE_STRING, &a->trace),
        EXAMPLE_CALLED("--trace-steps", trace_steps, a),
        EXAMPLE_RANGE("--epochs", EXAMPLE_INT, &a->epochs, 1, 1000),
        EXAMPLE_RANGE("--batch", EXAMPLE_INT, &a->batch, 1, 1 << 20),
        EXAMPLE_RANGE("--test-batch", EXAMPLE_INT, &a->test_batch, 1, 1 << 20),
        EXAMPLE_RANGE("--threads", EXAMPLE_INT, &a->threads, 1, 1024),
        EXAMPLE_RANGE("--limit", EXAMPLE_INT, &a->limit, 1, 1 << 30),
        EXAMPLE_RANGE("--seed", EXAMPLE_LONG, &a->seed, 0, 1L << 40),
        EXAMPLE_RANGE("--reshard-after-forward", EXAMPLE_INT, &a->reshard_after_forward, 0, 1 << 20),
        EXAMPLE_RANGE("--wrap-min-params", EXAMPLE_LONG, &a->wrap_min_params, 0, 1L << 40),
        EXAMPLE_FLAG("--lr", EXAMPLE_REAL, &a->lr),
        EXAMPLE_FLAG("--gamma", EXAMPLE_REAL, &a->gamma),
        EXAMPLE_FLAGS_END,
    };
    const example_cli_t cli = {usage, 1};
    example_parse_flags(argc, argv, flags, &cli);
    if (strcmp(a->model, "mlp") && strcmp(a->model, "cnn")) {
        fprintf(stderr, "error: --model %s is not mlp or cnn\n", a->model);
        exit(2);
    }
    if (a->hsdp && a->no_shard) {
        fprintf(stderr, "error: --hsdp and --no-shard exclude each other\n");
        exit(2);
    }
    if (strcmp(a->param_dtype, "f32") && strcmp(a->param_dtype, "bf16")) {
        fprintf(stderr, "error: --param-dtype %s is not f32 or bf16\n", a->param_dtype);
        exit(2);
    }
    if (strcmp(a->optimizer, "adadelta") && strcmp(a->optimizer, "sgd") &&
        strcmp(a->optimizer, "adamw")) {
        fprintf(stderr, "error: --optimizer %s is not adadelta, sgd or adamw\n", a->optimizer);
        exit(2);
    }
}

static void load_data(run_t *r)
{
    char err[1200];
    if (fm_load(r->a.data, "train", &r->train, err, sizeof(err)) ||
        fm_load(r->a.data, "t10k", &r->test, err, sizeof(err))) {
        fprintf(stderr, "error: %s\n", err);
        exit(1);
    }
    if (r->train.rows != 28 || r->train.cols != 28 || r->test.rows != 28 || r->test.cols != 28) {
        fprintf(stderr, "error: images are %dx%d, the models take 28x28\n", r->train.rows,
                r->train.cols);
        exit(1);
    }
    if (r->a.limit && r->a.limit < r->train.n)
        r->train.n = r->a.limit;
    if (r->a.limit && r->a.limit < r->test.n)
        r->test.n = r->a.limit;
}

static fsdp2_optimizer_options_t optimizer_options(const args_t *a)
{
    fsdp2_optimizer_options_t sgd = FSDP2_SGD_OPTIONS_INIT(a->lr);
    fsdp2_optimizer_options_t adamw = FSDP2_ADAMW_OPTIONS_INIT(a->lr);
    fsdp2_optimizer_options_t adadelta = FSDP2_ADADELTA_OPTIONS_INIT(a->lr);
    if (!strcmp(a->optimizer, "sgd"))
        return sgd;
    return !strcmp(a->optimizer, "adamw") ? adamw : adadelta;
}

static void setup(run_t *r)
{
    CHECK(fsdp2_init(NULL, &r->ctx));
    fsdp2_process_info_t info;
    CHECK(fsdp2_context_info(r->ctx, &info));
    CHECK(fsdp2_context_world(r->ctx, &r->world));
    r->rank = info.rank;
    r->ws = info.world_size;
    r->local_world = info.local_world_size > 0 ? info.local_world_size : 1;
    if (!r->a.threads) /* the rank's share of the host's cores for its GEMMs */
        r->a.threads = example_threads(r->local_world);
    CHECK(fsdp2_nn_set_threads(r->a.threads));
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    CHECK(fsdp2_stream_current(cpu, &r->current));
    if (r->a.batch % r->ws) {
        fprintf(stderr, "error: --batch %d (global) is not divisible by the %d ranks\n",
                r->a.batch, r->ws);
        exit(2);
    }
    r->local_batch = r->a.batch / r->ws;
    load_data(r);
    int max_batch = r->local_batch > EVAL_CHUNK ? r->local_batch : EVAL_CHUNK;
    CHECK(fm_model_create(!strcmp(r->a.model, "mlp") ? FM_MLP : FM_CNN, max_batch,
                          (uint64_t)r->a.seed, &r->model));
    r->model->dropout_seed = (uint64_t)r->a.seed * 1000003u + (uint64_t)r->rank;
    fsdp2_mesh_t *mesh;
    example_mesh(r->ctx, r->a.no_shard, r->a.hsdp, &mesh);
    CHECK(fm_model_shard(r->model, mesh, r->a.wrap_min_params,
                         strcmp(r->a.param_dtype, "bf16") ? FSDP2_F32 : FSDP2_BF16,
                         r->a.reshard_after_forward));
    for (int i = 0; i < 2; i++) /* the training batch, and the evaluation's */
        CHECK(fm_model_prepare(r->model, i ? EVAL_CHUNK : r->local_batch,
                               strcmp(r->a.param_dtype, "bf16") ? FSDP2_F32 : FSDP2_BF16));
    fsdp2_optimizer_options_t oo = optimizer_options(&r->a);
    CHECK(fsdp2_optimizer_create(r->model->root, &oo, &r->opt));
    CHECK(fsdp2_state_dict_create(r->model->root, r->opt, &r->state));
    if (r->a.resume) {
        /* The model and optimizer as saved (at any world size), and the epoch to go on
         * from. */
        fsdp2_checkpoint_report_t rep = {.size = sizeof(rep)};
        char epoch[32];
        CHECK(fsdp2_checkpoint_load(r->state, r->a.resume, NULL, &rep));
        CHECK(fsdp2_checkpoint_extra(r->a.resume, "epoch", epoch, sizeof(epoch)));
        r->first_epoch = atoi(epoch);
        if (!r->rank)
            printf("resumed from %s: epoch %d done, saved by %d rank%s\n", r->a.resume,
                   r->first_epoch, rep.saved_world_size, rep.saved_world_size > 1 ? "s" : "");
    }
    r->x = malloc(sizeof(float) * (size_t)max_batch * 784);
    r->labels = malloc(sizeof(int) * (size_t)max_batch);
    if (!r->x || !r->labels) {
        fprintf(stderr, "error: out of memory\n");
        exit(1);
    }
}

static void progress(const run_t *r, int epoch, int step, int steps, double loss)
{
    if (r->rank || !isatty(STDOUT_FILENO))
        return;
    int width = 30, done = steps ? (int)((long)width * step / steps) : width;
    printf("\repoch %d [%.*s%*s] %d/%d loss %.4f", epoch, done, "##############################",
           width - done, "", step, steps, loss);
    fflush(stdout);
}

typedef struct epoch_stats {
    double train_loss, test_loss, accuracy, seconds, images_per_s;
} epoch_stats_t;

/* Writes the trace of the steps run so far (all ranks: the stop is collective). */
static void stop_trace(run_t *r)
{
    int on = 0;
    CHECK(fsdp2_trace_active(&on));
    if (!on)
        return;
    CHECK(fsdp2_trace_stop(r->ctx));
    if (!r->rank)
        printf("%swrote trace %s (steps %ld..%ld)\n", isatty(STDOUT_FILENO) ? "\n" : "",
               r->a.trace, r->a.trace_from, r->step);
}

static double train_epoch(run_t *r, int epoch, double *seconds)
{
    int count;
    int *order = fm_sampler(r->train.n, r->ws, r->rank, (uint64_t)r->a.seed, epoch, 1, &count);
    if (!order) {
        fprintf(stderr, "error: out of memory\n");
        exit(1);
    }
    int steps = count / r->local_batch; /* the last partial batch is dropped on every rank */
    double loss_sum = 0, t0 = example_now();
    for (int s = 0; s < steps; s++, r->step++) {
        double loss;
        int correct;
        if (r->a.trace && r->step == r->a.trace_from)
            CHECK(fsdp2_trace_start(r->ctx, r->a.trace));
        CHECK(fsdp2_trace_step(r->step));
        CHECK(fsdp2_trace_range_push("data"));
        fm_batch(&r->train, order + (size_t)s * r->local_batch, r->local_batch, r->x, r->labels);
        CHECK(fsdp2_trace_range_pop());
        CHECK(fm_model_forward_backward(r->model, r->x, r->labels, r->local_batch, &loss, &correct));
        CHECK(fsdp2_optimizer_step(r->opt));
        CHECK(fsdp2_optimizer_zero_grad(r->opt));
        if (r->a.trace && r->step + 1 == r->a.trace_to)
            stop_trace(r);
        loss_sum += loss;
        if (s % 20 == 0 || s + 1 == steps)
            progress(r, epoch + 1, s + 1, steps, loss_sum / (s + 1));
    }
    *seconds = example_now() - t0;
    if (!r->rank && isatty(STDOUT_FILENO))
        printf("\n");
    free(order);
    double v[2] = {loss_sum, steps};
    example_world_sum(r->world, r->current, v, 2);
    return v[1] ? v[0] / v[1] : 0;
}

static void test_epoch(run_t *r, double *loss, double *accuracy)
{
    int count;
    int *order = fm_sampler(r->test.n, r->ws, r->rank, 0, 0, 0, &count);
    double v[3] = {0, 0, 0}; /* loss sum, correct, samples */
    for (int s = 0; s < count; s += EVAL_CHUNK) {
        int n = count - s < EVAL_CHUNK ? count - s : EVAL_CHUNK;
        /* Padding entries (past the end, wrapped) are computed on every rank, so the
         * collectives pair up, but not counted. */
        int real_n = 0;
        for (int k = 0; k < n; k++)
            real_n += r->rank + (size_t)(s + k) * r->ws < (size_t)r->test.n;
        double ls;
        int correct;
        fm_batch(&r->test, order + s, n, r->x, r->labels);
        CHECK(fm_model_evaluate(r->model, r->x, r->labels, real_n ? real_n : n, &ls, &correct));
        if (!real_n)
            continue;
        v[0] += ls;
        v[1] += correct;
        v[2] += real_n;
    }
    free(order);
    example_world_sum(r->world, r->current, v, 3);
    *loss = v[0] / v[2];
    *accuracy = 100.0 * v[1] / v[2];
}

/* planned: the FSDP plan plus the optimizer state; measured: the allocator's peak;
 * state: parameters + gradients + optimizer state of this rank. */
static void report_memory(run_t *r, uint64_t *planned, uint64_t *measured, uint64_t *state)
{
    fsdp2_memory_plan_t plan = {.size = sizeof(plan)};
    CHECK(fsdp2_memory_plan(r->model->root, &plan));
    fsdp2_memory_stats_t st;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    CHECK(fsdp2_memory_stats_get(cpu, &st));
    uint64_t opt;
    CHECK(fsdp2_optimizer_state_bytes(r->opt, &opt));
    *planned = plan.total + opt;
    *measured = st.peak_allocated_bytes;
    *state = plan.sharded_params + plan.sharded_grads + opt;
}

int main(int argc, char **argv)
{
    run_t r = {0};
    parse(argc, argv, &r.a);
    setup(&r);
    int64_t numel = fm_model_numel(r.model);
    char layout[64] = "FSDP";
    if (r.a.no_shard)
        snprintf(layout, sizeof(layout), "replicated (--no-shard)");
    else if (r.a.hsdp)
        snprintf(layout, sizeof(layout), "HSDP [%d replicas, %d shards]", r.ws / r.local_world,
                 r.local_world);
    if (r.a.reshard_after_forward != 1 && !r.a.no_shard)
        snprintf(layout + strlen(layout), sizeof(layout) - strlen(layout),
                 ", reshard_after_forward %d", r.a.reshard_after_forward);
    if (!r.rank)
        printf("fashion_mnist: %s (%lld parameters), %s over %d rank%s, global batch %d (%d per "
               "rank), %s lr %g, StepLR gamma %g, %d epochs, %d GEMM thread%s per rank, %s "
               "compute\n",
               r.a.model, (long long)numel, layout,
               r.ws, r.ws > 1 ? "s" : "", r.a.batch, r.local_batch, r.a.optimizer, r.a.lr,
               r.a.gamma, r.a.epochs, r.a.threads, r.a.threads > 1 ? "s" : "", r.a.param_dtype);
    epoch_stats_t last = {0};
    FILE *json = NULL;
    if (!r.rank && r.a.json && !(json = fopen(r.a.json, "w"))) {
        fprintf(stderr, "error: cannot write %s\n", r.a.json);
        exit(1);
    }
    if (json)
        fprintf(json, "{\"model\": \"%s\", \"ws\": %d, \"sharded\": %s, \"epochs\": [", r.a.model,
                r.ws, r.a.no_shard ? "false" : "true");
    for (int e = r.first_epoch; e < r.a.epochs; e++) {
        fsdp2_lr_schedule_t sched = {FSDP2_LR_STEP, 1, r.a.gamma, 0, 0, 0};
        double lr;
        CHECK(fsdp2_lr_at(&sched, r.a.lr, e, &lr));
        CHECK(fsdp2_optimizer_set_lr(r.opt, lr));
        epoch_stats_t st;
        st.train_loss = train_epoch(&r, e, &st.seconds);
        test_epoch(&r, &st.test_loss, &st.accuracy);
        double secs[1] = {st.seconds};
        CHECK(fsdp2_all_reduce_async(r.world, secs, 1, FSDP2_F64, NULL, r.current));
        CHECK(fsdp2_stream_synchronize(r.current));
        st.seconds = secs[0] / r.ws; /* the ranks' mean */
        int steps = (r.train.n + r.ws - 1) / r.ws / r.local_batch;
        st.images_per_s = (double)steps * r.a.batch / st.seconds;
        uint64_t planned, measured, state;
        report_memory(&r, &planned, &measured, &state);
        /* Per rank: the largest over the ranks (uneven shards differ a little). */
        double mem[3] = {(double)state, (double)planned, (double)measured};
        double *all = calloc((size_t)r.ws * 3, sizeof(double));
        if (!all) {
            fprintf(stderr, "error: out of memory\n");
            exit(1);
        }
        CHECK(fsdp2_all_gather_async(r.world, mem, all, 3, FSDP2_F64, r.current));
        CHECK(fsdp2_stream_synchronize(r.current));
        for (int k = 0; k < r.ws * 3; k++)
            mem[k % 3] = all[k] > mem[k % 3] ? all[k] : mem[k % 3];
        free(all);
        state = (uint64_t)mem[0];
        planned = (uint64_t)mem[1];
        measured = (uint64_t)mem[2];
        if (!r.rank) {
            printf("epoch %d: train loss %.4f | test loss %.4f, accuracy %.2f%% | %.1f s, %.0f "
                   "images/s | per rank (max): params+grads+optimizer %.2f MiB, planned %.2f "
                   "MiB, measured peak %.2f MiB\n",
                   e + 1, st.train_loss, st.test_loss, st.accuracy, st.seconds, st.images_per_s,
                   state / 1048576.0, planned / 1048576.0, measured / 1048576.0);
            fflush(stdout);
        }
        if (json)
            fprintf(json,
                    "%s{\"epoch\": %d, \"lr\": %.6g, \"train_loss\": %.6f, \"test_loss\": %.6f, "
                    "\"accuracy\": %.4f, \"seconds\": %.3f, \"images_per_s\": %.1f, "
                    "\"planned_bytes\": %llu, \"peak_bytes\": %llu, "
                    "\"param_grad_opt_bytes\": %llu}",
                    e > r.first_epoch ? ", " : "", e + 1, lr, st.train_loss, st.test_loss, st.accuracy,
                    st.seconds, st.images_per_s, (unsigned long long)planned,
                    (unsigned long long)measured, (unsigned long long)state);
        last = st;
        if (r.a.save) {
            char epoch[32], model_name[16];
            snprintf(epoch, sizeof(epoch), "%d", e + 1);
            snprintf(model_name, sizeof(model_name), "%s", r.a.model);
            const char *keys[2] = {"epoch", "model"}, *values[2] = {epoch, model_name};
            fsdp2_checkpoint_options_t co = FSDP2_CHECKPOINT_OPTIONS_INIT;
            co.step = e + 1;
            co.extra_keys = keys;
            co.extra_values = values;
            co.num_extra = 2;
            CHECK(fsdp2_checkpoint_save(r.state, r.a.save, &co));
            if (!r.rank)
                printf("saved %s (epoch %d)\n", r.a.save, e + 1);
        }
    }
    if (json) {
        fprintf(json, "], \"final_accuracy\": %.4f}\n", last.accuracy);
        fclose(json);
    }
    if (r.a.trace)
        stop_trace(&r); /* fewer steps ran than --trace-steps asked for */
    CHECK(fsdp2_state_dict_destroy(r.state));
    CHECK(fsdp2_optimizer_destroy(r.opt));
    fm_model_destroy(r.model);
    fm_free(&r.train);
    fm_free(&r.test);
    free(r.x);
    free(r.labels);
    CHECK(fsdp2_finalize(r.ctx));
    return 0;
}
