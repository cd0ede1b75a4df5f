/* A causal language model, GPT-2 or Llama, trained with FSDP: a preset of ours or a
 * Hugging Face model directory (--model DIR), on a text corpus (Debian's fortunes by
 * default) tokenized with the model's tokenizer.json, or as bytes.
 *
 *   fsdp2run --nproc-per-node 4 build/examples/lm --preset tiny --steps 200
 *   fsdp2run --nproc-per-node 2 build/examples/lm --model DIR --data FILE --export OUT
 *
 * Every step draws a global batch of --batch windows from (seed, step), whatever the
 * world size; rank r trains on its batch / ws of them, in --grad-accum micro-batches
 * (the gradient is synchronised on the last only). AdamW with weight decay on the
 * matrices only, a cosine schedule with warmup, clipping at --clip. Rank 0 prints the
 * loss, the validation loss every --val-every steps, the speed and the memory per rank:
 * parameters + gradients + optimizer state, FSDP's planned buffers, the activations, and
 * the allocator's measured peak, which equals their sum. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fsdp2/fsdp2.h>

#include "args.h"
#include "common.h"
#include "data.h"
#include "hf.h"
#include "model.h"

typedef struct run {
    args_t a;
    int rank, ws;
    fsdp2_context_t *ctx;
    fsdp2_group_t *world;
    fsdp2_stream_t *current;
    lm_model_t *model;
    fsdp2_optimizer_t *opt;
    fsdp2_state_dict_t *state;
    lm_text_t text;
    int local_batch, micro;
    long first_step;
    FILE *json, *dump;
    int json_records;
    fsdp2_nn_gemm_stats_t gemm; /* the GEMM counters at the start of the logging window */
} run_t;

/* ---- setup ---- */

/* Linear warmup over --warmup steps, then cosine down to --min-lr at --steps: the
 * optimizer applies it before each step (t counts from 1) and checkpoints carry it. */
/* The parameters that train (all but the frozen: the base under LoRA, --freeze). */
static int64_t trained_numel(const lm_model_t *m)
{
    size_t n;
    int64_t total = 0;
    CHECK(fsdp2_module_params(m->root, NULL, 0, &n));
    fsdp2_param_t **p = calloc(n ? n : 1, sizeof(*p));
    if (!p)
        return -1;
    CHECK(fsdp2_module_params(m->root, p, n, &n));
    for (size_t i = 0; i < n; i++) {
        fsdp2_param_info_t info;
        CHECK(fsdp2_param_info(p[i], &info));
        int64_t e = 1;
        for (int d = 0; d < info.ndim; d++)
            e *= info.shape[d];
        total += info.requires_grad ? e : 0;
    }
    free(p);
    return total;
}

static fsdp2_lr_schedule_t schedule_of(const args_t *a)
{
    fsdp2_lr_schedule_t s = {FSDP2_LR_COSINE, 0, 0, a->warmup,
                             a->steps > a->warmup ? a->steps : a->warmup, a->min_lr};
    return s;
}


static int is_matrix(const fsdp2_param_info_t *info, void *user)
{
    (void)user;
    /* GPT-2 and Llama practice: decay the weights of the linear layers (an untied head
     * too); not biases, norms or the embeddings (wte, wpe, embed_tokens) */
    return info->ndim == 2 && strncmp(info->fqn, "wte.", 4) && strncmp(info->fqn, "wpe.", 4) &&
           !strstr(info->fqn, "embed_tokens.");
}

static void setup(run_t *r)
{
    args_t *a = &r->a;
    CHECK(fsdp2_init(NULL, &r->ctx));
    fsdp2_process_info_t info;
    CHECK(fsdp2_context_info(r->ctx, &info));
    CHECK(fsdp2_context_world(r->ctx, &r->world));
    r->rank = info.rank;
    r->ws = info.world_size;
    if (!a->threads) /* the rank's share of the host's cores for its GEMMs */
        a->threads = example_threads(info.local_world_size);
    CHECK(fsdp2_nn_set_threads(a->threads));
    /* with bf16 parameters the layers compute in bf16: attention, which has no parameter
     * to carry the dtype, takes bf16 GEMM operands as well where FSDP2_NN_BF16_GEMM
     * lets the linear layers take them */
    CHECK(fsdp2_nn_set_compute_dtype(strcmp(a->param_dtype, "bf16") ? FSDP2_F32 : FSDP2_BF16));
    CHECK(fsdp2_stream_current((fsdp2_device_t)FSDP2_DEVICE_CPU_INIT, &r->current));
    if (a->batch % (r->ws * a->grad_accum)) {
        fprintf(stderr, "error: --batch %d is not divisible by %d ranks x --grad-accum %d\n",
                a->batch, r->ws, a->grad_accum);
        exit(2);
    }
    r->local_batch = a->batch / r->ws;
    r->micro = r->local_batch / a->grad_accum;
    char err[1200];
    if (lm_text_load(a->data, a->tokenizer, a->token_cache, &r->text, err, sizeof(err))) {
        fprintf(stderr, "error: %s\n", err);
        exit(1);
    }
    if (a->tokenizer && !a->init_from) /* a preset takes the tokenizer's vocabulary */
        a->cfg.vocab = r->text.vocab;
    if (r->text.bos >= 0 && a->bos < 0)
        a->bos = r->text.bos;
    if (r->text.eos >= 0 && a->eos < 0)
        a->eos = r->text.eos;
    if (r->text.vocab > a->cfg.vocab) {
        fprintf(stderr, "error: %s: the data's tokens need a vocabulary of %d; the model has %d\n",
                a->data, r->text.vocab, a->cfg.vocab);
        exit(1);
    }
    if (a->val_every && r->text.n - r->text.train_n < (size_t)a->cfg.seq + 2) {
        fprintf(stderr, "error: %s: %zu bytes of validation text, fewer than --seq-len %d + 2\n",
                a->data, r->text.n - r->text.train_n, a->cfg.seq);
        exit(1);
    }
    fsdp2_status_t made = lm_create(&a->cfg, (uint64_t)a->seed, &r->model);
    if (made != FSDP2_SUCCESS) /* lm_create said why */
        exit(made == FSDP2_ERR_INVALID_CONFIG ? 2 : 1);
    if (a->hsdp && a->no_shard) {
        fprintf(stderr, "error: --hsdp and --no-shard exclude each other\n");
        exit(2);
    }
    fsdp2_mesh_t *mesh;
    example_mesh(r->ctx, a->no_shard, a->hsdp, &mesh);
    CHECK(lm_shard(r->model, mesh, strcmp(a->param_dtype, "bf16") ? FSDP2_F32 : FSDP2_BF16,
                     a->reshard_after_forward));
    fsdp2_optimizer_options_t oo = FSDP2_ADAMW_OPTIONS_INIT(a->lr);
    oo.beta2 = 0.95;
    oo.weight_decay = 0.0; /* the matrices' group decays */
    CHECK(fsdp2_optimizer_create(r->model->root, &oo, &r->opt));
    fsdp2_param_group_t decay = FSDP2_PARAM_GROUP_INIT;
    decay.weight_decay = a->weight_decay;
    CHECK(fsdp2_optimizer_add_param_group(r->opt, &decay, is_matrix, NULL, NULL));
    fsdp2_lr_schedule_t sched = schedule_of(a);
    CHECK(fsdp2_optimizer_set_lr_schedule(r->opt, &sched, a->lr));
    CHECK(fsdp2_state_dict_create(r->model->root, r->opt, &r->state));
    /* FSDP's buffers (refused by the library when they do not fit the device), then the
     * activations: both before step 1 */
    fsdp2_memory_plan_t plan = {.size = sizeof(plan)};
    CHECK(fsdp2_memory_plan(r->model->root, &plan));
    if (a->grad_accum > 1) { /* the no-sync micro-batches' unsharded gradient accumulators,
                              * which FSDP adds at the first of them: made now, counted */
        CHECK(fsdp2_set_requires_gradient_sync(r->model->root, 0));
        CHECK(fsdp2_set_requires_gradient_sync(r->model->root, 1));
    }
    uint64_t limit = 0, acts = lm_activation_bytes(&a->cfg, r->micro, a->checkpointing);
    fsdp2_memory_stats_t st;
    CHECK(fsdp2_memory_capacity((fsdp2_device_t)FSDP2_DEVICE_CPU_INIT, &limit));
    CHECK(fsdp2_memory_stats_get((fsdp2_device_t)FSDP2_DEVICE_CPU_INIT, &st));
    if (limit && st.allocated_bytes + acts > limit) {
        fprintf(stderr,
                "error: rank %d needs %.2f MiB: %.2f MiB of parameters, gradients, optimizer "
                "state and FSDP buffers, and %.2f MiB of activations; the cpu device holds %.2f "
                "MiB (FSDP2_CPU_MEMORY_LIMIT). Refused before step 1: more ranks shard the first "
                "part; --activation-checkpointing or a smaller --batch shrink the second\n",
                r->rank, (st.allocated_bytes + acts) / 1048576.0, st.allocated_bytes / 1048576.0,
                acts / 1048576.0, limit / 1048576.0);
        exit(1);
    }
    CHECK(lm_allocate(r->model, r->micro, a->checkpointing));
    CHECK(lm_prepare(r->model, strcmp(a->param_dtype, "bf16") ? FSDP2_F32 : FSDP2_BF16));
    if (a->hf) {
        CHECK(lm_hf_import(r->model, a->hf));
        CHECK(fsdp2_hf_model_close(a->hf));
        a->hf = NULL;
    }
    if (a->hf_adapter) {
        if (lm_hf_import_adapter(r->model, a->hf_adapter, a->adapter) != FSDP2_SUCCESS)
            exit(1);
        CHECK(fsdp2_hf_adapter_close(a->hf_adapter));
        a->hf_adapter = NULL;
    }
    if (a->resume) {
        fsdp2_checkpoint_report_t rep = {.size = sizeof(rep)};
        CHECK(fsdp2_checkpoint_load(r->state, a->resume, NULL, &rep));
        char seed[32];
        CHECK(fsdp2_checkpoint_extra(a->resume, "seed", seed, sizeof(seed)));
        if (atol(seed) != a->seed && !r->rank)
            printf("note: the checkpoint was trained with --seed %s; going on with %ld\n", seed,
                   a->seed);
        int64_t steps;
        CHECK(fsdp2_optimizer_steps(r->opt, &steps));
        r->first_step = (long)steps;
        /* the checkpoint's lr schedule goes on: say so when the flags asked for another */
        fsdp2_lr_schedule_t saved, asked = schedule_of(a);
        double base;
        int on;
        CHECK(fsdp2_optimizer_lr_schedule(r->opt, &saved, &base, &on));
        if (!r->rank && on && (saved.warmup != asked.warmup || saved.total != asked.total ||
                               saved.min_lr != asked.min_lr || base != a->lr))
            printf("note: going on with the checkpoint's schedule (lr %g to %g, warmup %lld, "
                   "total %lld steps), not the flags'\n",
                   base, saved.min_lr, (long long)saved.warmup, (long long)saved.total);
        if (!r->rank)
            printf("resumed from %s at step %ld (saved by %d rank%s)\n", a->resume, r->first_step,
                   rep.saved_world_size, rep.saved_world_size > 1 ? "s" : "");
    }
}

/* ---- the step ---- */

/* One optimizer step: the mean training loss over the global batch, the gradient norm
 * before clipping. */
static double train_step(run_t *r, long step, double *norm)
{
    args_t *a = &r->a;
    lm_model_t *m = r->model;
    int T = a->cfg.seq;
    double loss_sum = 0;
    for (int k = 0; k < a->grad_accum; k++) {
        for (int j = 0; j < r->micro; j++) {
            int index = r->rank * r->local_batch + k * r->micro + j;
            lm_train_window(&r->text, (uint64_t)a->seed, step, index, T, m->tokens + j * T,
                              m->targets + j * T);
        }
        if (r->dump) /* the batches, for the PyTorch peer: (step, window, tokens) */
            for (int j = 0; j < r->micro; j++) {
                int index = r->rank * r->local_batch + k * r->micro + j;
                fprintf(r->dump, "%ld %d", step, index);
                for (int t = 0; t < T; t++)
                    fprintf(r->dump, " %d", m->tokens[j * T + t]);
                fprintf(r->dump, " %d\n", m->targets[j * T + T - 1]);
            }
        CHECK(fsdp2_set_requires_gradient_sync(m->root, k == a->grad_accum - 1));
        m->dropout_row = ((uint64_t)step * (uint64_t)a->batch +
                          (uint64_t)(r->rank * r->local_batch + k * r->micro)) * (uint64_t)T;
        double loss;
        CHECK(lm_step(m, r->micro, 1, (double)r->local_batch * T, &loss));
        loss_sum += loss;
    }
    CHECK(fsdp2_clip_grad_norm(m->root, a->clip > 0 ? a->clip : INFINITY, 2.0, norm));
    CHECK(fsdp2_optimizer_step(r->opt));
    CHECK(fsdp2_optimizer_zero_grad(r->opt));
    double v[1] = {loss_sum};
    example_world_sum(r->world, r->current, v, 1);
    return v[0] / r->ws;
}

/* The mean loss over val_batches windows of the validation text, split over the ranks. */
static double validate(run_t *r)
{
    lm_model_t *m = r->model;
    int T = r->a.cfg.seq, count = (int)r->a.val_batches * r->a.batch;
    double v[2] = {0, 0};
    for (int first = 0; first < count; first += r->ws * m->max_batch) {
        int n = 0;
        for (int j = 0; j < m->max_batch; j++) {
            int index = first + j * r->ws + r->rank;
            if (index >= count)
                index = count - 1; /* padding: computed so the collectives pair, not counted */
            else
                n = j + 1;
            lm_val_window(&r->text, index, count, T, m->tokens + j * T, m->targets + j * T);
        }
        double loss;
        CHECK(lm_step(m, n ? n : 1, 0, 1.0, &loss));
        if (n) {
            v[0] += loss;
            v[1] += (double)n * T;
        }
    }
    example_world_sum(r->world, r->current, v, 2);
    return v[0] / v[1];
}

/* ---- memory ---- */

typedef struct memory {
    uint64_t state, planned, activations, expected, peak;
} memory_t;

/* This rank's memory: the library's plan and counters, and the example's activations. */
static memory_t memory(run_t *r)
{
    fsdp2_memory_plan_t plan = {.size = sizeof(plan)};
    CHECK(fsdp2_memory_plan(r->model->root, &plan));
    fsdp2_memory_stats_t st;
    CHECK(fsdp2_memory_stats_get((fsdp2_device_t)FSDP2_DEVICE_CPU_INIT, &st));
    uint64_t opt;
    CHECK(fsdp2_optimizer_state_bytes(r->opt, &opt));
    memory_t mem = {plan.sharded_params + plan.sharded_grads + opt,
                    plan.total - plan.sharded_params - plan.sharded_grads,
                    r->model->activation_bytes, 0, st.peak_allocated_bytes};
    mem.expected = mem.state + mem.planned + mem.activations;
    return mem;
}

static void print_memory(const run_t *r, const memory_t *m, const char *prefix)
{
    if (r->rank)
        return;
    printf("%smemory per rank (MiB): params+grads+optimizer %.2f, FSDP buffers %.2f, "
           "activations %.2f = %.2f planned; measured peak %.2f\n",
           prefix, m->state / 1048576.0, m->planned / 1048576.0, m->activations / 1048576.0,
           m->expected / 1048576.0, m->peak / 1048576.0);
}

/* ---- sampling ---- */

static void sample(run_t *r)
{
    lm_model_t *m = r->model;
    int T = r->a.cfg.seq, len = 1, V = r->text.vocab;
    m->tokens[0] = lm_text_start(&r->text);
    const uint32_t key[2] = {(uint32_t)r->a.seed, 0x73616d70u};
    if (!r->rank)
        printf("sample:\n");
    for (long i = 0; i < r->a.sample; i++) {
        const float *z;
        CHECK(lm_forward_logits(m, len, &z));
        z += (int64_t)(len - 1) * r->a.cfg.vocab;
        /* softmax over the data's tokens, then a draw from Philox (the same on every rank) */
        double max = z[0], sum = 0, u;
        for (int v = 1; v < V; v++)
            max = z[v] > max ? z[v] : max;
        for (int v = 0; v < V; v++)
            sum += exp(z[v] - max);
        const uint32_t counter[4] = {(uint32_t)i, 0, 0, 0};
        uint32_t rnd[4];
        fsdp2_philox4x32(counter, key, rnd);
        u = rnd[0] * 0x1.0p-32 * sum;
        int next = V - 1;
        for (int v = 0; v < V; v++) {
            u -= exp(z[v] - max);
            if (u < 0) {
                next = v;
                break;
            }
        }
        if (!r->rank)
            lm_text_print(&r->text, next, stdout);
        if (len == T) { /* the window slides */
            memmove(m->tokens, m->tokens + 1, sizeof(int32_t) * (size_t)(T - 1));
            len--;
        }
        m->tokens[len++] = next;
    }
    if (!r->rank)
        printf("\n");
}

/* A progress bar on a terminal (rank 0), redrawn each step until a log line replaces it. */
static void progress(const run_t *r, long step, double loss)
{
    if (r->rank || !isatty(STDOUT_FILENO))
        return;
    int width = 30, done = r->a.steps ? (int)(width * (step + 1) / r->a.steps) : width;
    printf("\r[%.*s%*s] step %ld/%ld loss %.4f", done, "##############################",
           width - done, "", step + 1, r->a.steps, loss);
    fflush(stdout);
}

/* ---- the run ---- */

/* prefix, then s as a JSON string: quotes, backslashes and control bytes escaped (a
 * --model path may hold any of them). */
static void json_string(FILE *f, const char *prefix, const char *s)
{
    fputs(prefix, f);
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

/* gemm: the GEMMs' GFLOP and ms per step over the logging window */
static void json_record(run_t *r, long step, double loss, double val, double ms, double tokens_s,
                        const memory_t *mem, double lr, double norm, const double gemm[2])
{
    if (!r->json)
        return;
    char v[32];
    snprintf(v, sizeof(v), isnan(val) ? "null" : "%.7f", val);
    fprintf(r->json,
            "%s\n  {\"step\": %ld, \"train_loss\": %.7f, \"val_loss\": %s, \"lr\": %.6g, "
            "\"grad_norm\": %.6g, \"ms\": %.3f, \"tokens_per_s\": %.1f, \"state_bytes\": %llu, "
            "\"fsdp_bytes\": %llu, \"activation_bytes\": %llu, \"planned_bytes\": %llu, "
            "\"peak_bytes\": %llu, \"gemm_gflop\": %.4f, \"gemm_ms\": %.3f}",
            r->json_records++ ? "," : "", step, loss, v, lr, norm, ms,
            tokens_s, (unsigned long long)mem->state, (unsigned long long)mem->planned,
            (unsigned long long)mem->activations, (unsigned long long)mem->expected,
            (unsigned long long)mem->peak, gemm[0], gemm[1]);
}

static void save(run_t *r, long step)
{
    char seed[32];
    snprintf(seed, sizeof(seed), "%ld", r->a.seed);
    const char *keys[2] = {"seed", "preset"}, *values[2] = {seed, r->a.preset};
    fsdp2_checkpoint_options_t co = FSDP2_CHECKPOINT_OPTIONS_INIT;
    co.step = step;
    co.extra_keys = keys;
    co.extra_values = values;
    co.num_extra = 2;
    CHECK(fsdp2_checkpoint_save(r->state, r->a.save, &co));
    if (!r->rank) { /* flushed: after a kill, the log names the last checkpoint on disk */
        printf("saved %s (step %ld)\n", r->a.save, step);
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    run_t r = {0};
    lm_args_parse(argc, argv, &r.a);
    args_t *a = &r.a;
    setup(&r);
    if (!r.rank) {
        char kv[32] = "", trained[96] = "";
        if (a->cfg.kv_heads != a->cfg.heads)
            snprintf(kv, sizeof(kv), " (%d key/value)", a->cfg.kv_heads);
        int64_t t = trained_numel(r.model);
        if (t != lm_numel(&a->cfg))
            snprintf(trained, sizeof(trained), "; %lld trained%s", (long long)t,
                     a->cfg.lora.r ? " (LoRA adapters)" : "");
        printf("%s: %s (%d layers, %d heads%s, dim %d, seq %d, vocab %d: %lld parameters%s), %s "
               "over %d rank%s, global batch %d (%d per rank in %d micro-batch%s), %s "
               "parameters%s, %d GEMM thread%s per rank\n",
               a->cfg.arch == LM_LLAMA ? "llama" : "gpt2", a->preset, a->cfg.layers,
               a->cfg.heads, kv, a->cfg.dim, a->cfg.seq, a->cfg.vocab,
               (long long)lm_numel(&a->cfg), trained,
               a->no_shard ? "replicated (--no-shard)" : a->hsdp ? "HSDP (--hsdp)" : "FSDP",
               r.ws, r.ws > 1 ? "s" : "", a->batch, r.local_batch, a->grad_accum,
               a->grad_accum > 1 ? "es" : "", a->param_dtype,
               a->checkpointing ? ", activation checkpointing" : "", a->threads,
               a->threads > 1 ? "s" : "");
        if (a->json && !(r.json = fopen(a->json, "w"))) {
            fprintf(stderr, "error: cannot write %s\n", a->json);
            exit(1);
        }
    }
    if (a->dump_batches) {
        char path[4096];
        snprintf(path, sizeof(path), "%s.%d", a->dump_batches, r.rank);
        if (!(r.dump = fopen(path, "w"))) {
            fprintf(stderr, "error: cannot write %s\n", path);
            exit(1);
        }
    }
    memory_t mem = memory(&r);
    print_memory(&r, &mem, "");
    if (a->checkpointing && !r.rank) {
        uint64_t full = lm_activation_bytes(&a->cfg, r.micro, 0);
        printf("activation checkpointing: %.2f MiB of activations instead of %.2f (%.2f MiB "
               "saved per rank)\n",
               mem.activations / 1048576.0, full / 1048576.0,
               (full - mem.activations) / 1048576.0);
    }
    if (r.json) {
        json_string(r.json, "{\"preset\": ", a->preset);
        fprintf(r.json,
                ", \"layers\": %d, \"heads\": %d, \"dim\": %d, \"seq\": %d, "
                "\"vocab\": %d, \"ws\": %d, \"batch\": %d, \"grad_accum\": %d, \"sharded\": %s, "
                "\"param_dtype\": \"%s\", \"activation_checkpointing\": %s, \"threads\": %d, "
                "\"records\": [",
                a->cfg.layers, a->cfg.heads, a->cfg.dim, a->cfg.seq, a->cfg.vocab, r.ws,
                a->batch, a->grad_accum, a->no_shard ? "false" : "true", a->param_dtype,
                a->checkpointing ? "true" : "false", a->threads);
    }
    double t_log = example_now(), loss_log = 0;
    long steps_log = 0;
    CHECK(fsdp2_nn_gemm_stats(&r.gemm));
    for (long step = r.first_step; step < a->steps; step++) {
        double norm = 0, loss = train_step(&r, step, &norm);
        loss_log += loss;
        steps_log++;
        int last = step + 1 == a->steps;
        int val_now = a->val_every && ((step + 1) % a->val_every == 0 || last);
        progress(&r, step, loss);
        if ((step + 1) % a->log_every == 0 || last || val_now || step == r.first_step) {
            if (!r.rank && isatty(STDOUT_FILENO))
                printf("\r%60s\r", "");
            double secs = example_now() - t_log, ms = 1000 * secs / steps_log;
            double tokens_s = (double)steps_log * a->batch * a->cfg.seq / secs;
            fsdp2_nn_gemm_stats_t g;
            CHECK(fsdp2_nn_gemm_stats(&g));
            double gemm[2] = {1e-9 * (g.flops - r.gemm.flops) / steps_log,
                              1e3 * (g.seconds - r.gemm.seconds) / steps_log};
            double val = val_now ? validate(&r) : NAN, lr;
            CHECK(fsdp2_optimizer_lr(r.opt, &lr));
            mem = memory(&r);
            if (!r.rank) {
                printf("step %5ld | loss %.4f", step + 1, loss_log / steps_log);
                if (val_now)
                    printf(" | val %.4f", val);
                printf(" | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | peak %.2f MiB\n", lr, norm,
                       ms, tokens_s, mem.peak / 1048576.0);
                fflush(stdout);
            }
            json_record(&r, step + 1, loss_log / steps_log, val, ms, tokens_s, &mem, lr, norm,
                        gemm);
            CHECK(fsdp2_nn_gemm_stats(&r.gemm));
            t_log = example_now();
            loss_log = 0;
            steps_log = 0;
        }
        if (a->save && ((a->save_every && (step + 1) % a->save_every == 0) || last))
            save(&r, step + 1);
    }
    mem = memory(&r);
    print_memory(&r, &mem, "end: ");
    if (r.json) {
        fprintf(r.json, "\n]}\n");
        fclose(r.json);
    }
    if (r.dump)
        fclose(r.dump);
    const char *exports[2] = {a->export_path, a->export_merged};
    for (int merged = 0; merged < 2; merged++) {
        if (!exports[merged])
            continue;
        lm_hf_file_t files[2];
        int n = 0;
        char generation[4200];
        if (a->tokenizer)
            files[n++] = (lm_hf_file_t){"tokenizer.json", a->tokenizer};
        snprintf(generation, sizeof(generation), "%s/generation_config.json",
                 a->init_from ? a->init_from : "");
        if (a->init_from && access(generation, F_OK) == 0)
            files[n++] = (lm_hf_file_t){"generation_config.json", generation};
        if (lm_hf_export(r.model, r.world, r.rank, exports[merged], files, n,
                         strcmp(a->export_dtype, "bf16") ? FSDP2_F32 : FSDP2_BF16, merged,
                         a->bos, a->eos) != FSDP2_SUCCESS)
            exit(1);
    }
    if (a->save_adapter &&
        lm_hf_save_adapter(r.model, r.world, r.rank, a->save_adapter, a->init_from) !=
            FSDP2_SUCCESS)
        exit(1);
    if (a->sample)
        sample(&r);
    CHECK(fsdp2_state_dict_destroy(r.state));
    CHECK(fsdp2_optimizer_destroy(r.opt));
    lm_destroy(r.model);
    lm_text_free(&r.text);
    CHECK(fsdp2_finalize(r.ctx));
    return 0;
}
