/* examples/lm's command line: the flags, the presets, and the shape a model directory
 * gives (args.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "common.h"
#include "hf.h"

static void usage(const char *prog, const char *bad)
{
    fprintf(stderr,
            "%s%s%s"
            "usage: %s [--preset NAME | --model DIR] [--layers N --heads N --kv-heads N --dim N]\n"
            "          [--seq-len N]\n"
            "          [--steps N] [--batch GLOBAL] [--grad-accum K] [--lr X] [--min-lr X]\n"
            "          [--warmup N] [--weight-decay X] [--clip X] [--seed N] [--data PATH]\n"
            "          [--param-dtype f32|bf16] [--activation-checkpointing] [--no-shard | --hsdp]\n"
            "          [--reshard-after-forward N] [--threads N] [--log-every N]\n"
            "          [--val-every N] [--val-batches N] [--sample N] [--json FILE]\n"
            "          [--save DIR [--save-every N]] [--resume DIR] [--export DIR]\n"
            "          [--export-dtype f32|bf16] [--tokenizer tokenizer.json]\n"
            "          [--token-cache DIR] [--dump-batches FILE] [--freeze PATTERN]...\n"
            "          [--lora r=8,alpha=32,dropout=0.05,targets=q_proj,v_proj]\n"
            "          [--adapter DIR] [--save-adapter DIR] [--export-merged DIR]\n"
            "presets: tiny, small, gpt2-124m (GPT-2); llama-tiny, llama-small (Llama-shaped)\n",
            bad ? "error: bad argument '" : "", bad ? bad : "", bad ? "'\n" : "", prog);
    exit(2);
}

/* The presets. Byte-level ones have a vocabulary of 256; gpt2-124m has GPT-2's 50257
 * tokens, of which bytes use the first 256. The Llama-shaped ones follow Llama 3's
 * proportions: 2 key/value heads, an MLP of about 8/3 dim, rope_theta 500000, an untied
 * head. */
static int preset(const char *name, lm_config_t *c)
{
    if (!strcmp(name, "tiny"))
        *c = lm_gpt2_config(4, 4, 128, 128, 256);
    else if (!strcmp(name, "small"))
        *c = lm_gpt2_config(6, 6, 384, 256, 256);
    else if (!strcmp(name, "gpt2-124m"))
        *c = lm_gpt2_config(12, 12, 768, 1024, 50257);
    else if (!strcmp(name, "llama-tiny") || !strcmp(name, "llama-small")) {
        int small = !strcmp(name, "llama-small");
        *c = (lm_config_t){.arch = LM_LLAMA, .layers = small ? 6 : 4, .heads = small ? 6 : 4,
                           .kv_heads = 2, .dim = small ? 384 : 128, .hidden = small ? 1024 : 352,
                           .seq = small ? 256 : 128, .positions = small ? 256 : 128,
                           .vocab = 256, .tied = 0, .norm_eps = 1e-5,
                           .rope = FSDP2_NN_ROPE_CONFIG_INIT};
        c->rope.theta = 500000.0;
    } else
        return -1;
    return 0;
}

/* --model DIR: config.json gives the shape; every size the command line gives, by
 * --preset or a flag, must agree (--seq-len may train a shorter context than the
 * model's positions). */
static void shape_from_directory(args_t *a, int preset_given, const int flags[5])
{
    fsdp2_status_t s = fsdp2_hf_model_open(a->init_from, &a->hf);
    if (s != FSDP2_SUCCESS) {
        fprintf(stderr, "error: --model %s: %s\n", a->init_from, fsdp2_last_error());
        exit(1);
    }
    lm_config_t dir;
    char err[1200];
    if (lm_hf_shape(a->hf, &dir, &a->bos, &a->eos, err, sizeof(err))) {
        fprintf(stderr, "error: --model %s: %s\n", a->init_from, err);
        exit(1);
    }
    int llama = dir.arch == LM_LLAMA;
    const char *names[5] = {"--layers", "--heads", "--kv-heads", "--dim", "--seq-len"};
    const char *fields[5] = {llama ? "num_hidden_layers" : "n_layer",
                             llama ? "num_attention_heads" : "n_head",
                             llama ? "num_key_value_heads" : "n_head",
                             llama ? "hidden_size" : "n_embd",
                             llama ? "max_position_embeddings" : "n_positions"};
    const int have[5] = {dir.layers, dir.heads, dir.kv_heads, dir.dim, dir.positions};
    const int preset_sizes[5] = {a->cfg.layers, a->cfg.heads, a->cfg.kv_heads, a->cfg.dim,
                                 a->cfg.seq};
    for (int i = 0; i < 5; i++) {
        int fits = i == 4 ? flags[i] <= have[i] : flags[i] == have[i];
        if (flags[i] && !fits) {
            fprintf(stderr, "error: %s %d disagrees with %s %d in %s/config.json\n", names[i],
                    flags[i], fields[i], have[i], a->init_from);
            exit(2);
        }
        if (preset_given && !flags[i] && preset_sizes[i] != have[i]) {
            fprintf(stderr, "error: --preset %s has %s %d; %s/config.json has %s %d (leave "
                    "--preset out: the directory gives the shape)\n", a->preset, names[i] + 2,
                    preset_sizes[i], a->init_from, fields[i], have[i]);
            exit(2);
        }
    }
    if (flags[4])
        dir.seq = flags[4];
    a->cfg = dir;
    snprintf(a->dir_tokenizer, sizeof(a->dir_tokenizer), "%s/tokenizer.json", a->init_from);
    if (!a->tokenizer && access(a->dir_tokenizer, F_OK) == 0)
        a->tokenizer = a->dir_tokenizer;
    a->preset = a->init_from; /* what the logs and --json name */
}

/* Flags on top of a preset: GPT-2 keeps kv_heads = heads and an MLP of 4 dim; a Llama
 * whose dim changes gets an MLP of 8/3 dim rounded up to a multiple of 32, as Llama's. */
static void resize_preset(lm_config_t *c, int layers, int heads, int kv_heads, int dim, int seq)
{
    int llama = c->arch == LM_LLAMA;
    c->layers = layers ? layers : c->layers;
    c->heads = heads ? heads : c->heads;
    c->dim = dim ? dim : c->dim;
    c->seq = c->positions = seq ? seq : c->seq;
    if (!llama && kv_heads && kv_heads != c->heads) {
        fprintf(stderr, "error: --kv-heads %d: GPT-2 has as many key/value heads as heads (%d)\n",
                kv_heads, c->heads);
        exit(2);
    }
    c->kv_heads = llama ? (kv_heads ? kv_heads : c->kv_heads) : c->heads;
    if (dim)
        c->hidden = llama ? (8 * dim / 3 + 31) / 32 * 32 : 4 * dim;
    if (c->dim % c->heads || c->heads % c->kv_heads || (llama && (c->dim / c->heads) % 2)) {
        fprintf(stderr, "error: --dim %d, --heads %d, --kv-heads %d: heads must divide dim%s, "
                        "and key/value heads divide heads\n", c->dim, c->heads, c->kv_heads,
                llama ? " into an even head dim" : "");
        exit(2);
    }
}

/* --lora r=8,alpha=32,dropout=0.05,targets=q_proj,v_proj: PEFT's LoraConfig fields
 * (alpha 8 and dropout 0 unless given, as LoraConfig's defaults); targets take the names
 * after targets= up to the next field (a part with '='). */
static void parse_lora(const char *spec, lm_lora_t *l)
{
    *l = (lm_lora_t){.alpha = 8};
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", spec);
    int in_targets = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq && in_targets && l->num_targets < LM_LORA_MAX_TARGETS &&
            strlen(tok) < sizeof(l->targets[0])) {
            snprintf(l->targets[l->num_targets++], sizeof(l->targets[0]), "%s", tok);
            continue;
        }
        char *end = NULL;
        in_targets = 0;
        if (eq && !strncmp(tok, "r=", 2))
            l->r = (int)strtol(eq + 1, &end, 10);
        else if (eq && !strncmp(tok, "alpha=", 6))
            l->alpha = strtod(eq + 1, &end);
        else if (eq && !strncmp(tok, "dropout=", 8))
            l->dropout = strtod(eq + 1, &end);
        else if (eq && !strncmp(tok, "targets=", 8) && eq[1] &&
                 strlen(eq + 1) < sizeof(l->targets[0])) {
            snprintf(l->targets[l->num_targets++], sizeof(l->targets[0]), "%s", eq + 1);
            in_targets = 1;
            continue;
        }
        if (!end || *end || end == eq + 1) {
            fprintf(stderr, "error: --lora %s: '%s' is not r=N, alpha=X, dropout=X or "
                            "targets=NAME,NAME (up to %d names)\n", spec, tok,
                    LM_LORA_MAX_TARGETS);
            exit(2);
        }
    }
    if (l->r < 1 || !l->num_targets || !isfinite(l->alpha) || !(l->dropout >= 0) ||
        !(l->dropout < 1)) {
        fprintf(stderr, "error: --lora %s: needs r >= 1 and targets, a finite alpha and a "
                        "dropout in [0, 1)\n", spec);
        exit(2);
    }
}

static void lora_flag(const char *value, void *to)
{
    parse_lora(value, to);
}

/* --freeze PATTERN, repeated */
typedef struct freeze_list {
    int n;
    const char *patterns[LM_MAX_FREEZE];
} freeze_list_t;

static void freeze_flag(const char *value, void *to)
{
    freeze_list_t *f = to;
    if (f->n == LM_MAX_FREEZE) {
        fprintf(stderr, "error: more than %d --freeze patterns\n", LM_MAX_FREEZE);
        exit(2);
    }
    f->patterns[f->n++] = value;
}

/* --adapter DIR: its adapter_config.json gives the adapters (with --lora, they must
 * agree). */
static void lora_from_adapter(args_t *a, int given)
{
    fsdp2_hf_lora_config_t c = FSDP2_HF_LORA_CONFIG_INIT;
    if (fsdp2_hf_adapter_open(a->adapter, &a->hf_adapter) != FSDP2_SUCCESS ||
        fsdp2_hf_adapter_config(a->hf_adapter, &c) != FSDP2_SUCCESS) {
        fprintf(stderr, "error: --adapter %s: %s\n", a->adapter, fsdp2_last_error());
        exit(1);
    }
    lm_lora_t l = {.r = (int)c.r, .alpha = c.alpha, .dropout = c.dropout,
                   .num_targets = c.num_targets};
    for (int i = 0; i < c.num_targets; i++)
        snprintf(l.targets[i], sizeof(l.targets[0]), "%s", c.targets[i]);
    const lm_lora_t *g = &a->cfg.lora;
    int same = !given || (g->r == l.r && g->num_targets == l.num_targets);
    for (int i = 0; same && given && i < l.num_targets; i++)
        same = !strcmp(g->targets[i], l.targets[i]);
    if (!same) {
        fprintf(stderr, "error: --lora r=%d with %d targets disagrees with --adapter %s "
                        "(r %d, target_modules %s...)\n", g->r, g->num_targets, a->adapter, l.r,
                l.targets[0]);
        exit(2);
    }
    if (given) /* alpha and dropout as the flags say: training goes on with them */
        l.alpha = g->alpha, l.dropout = g->dropout;
    a->cfg.lora = l;
}

void lm_args_parse(int argc, char **argv, args_t *a)
{
    memset(a, 0, sizeof(*a));
    a->preset = "tiny";
    a->data = "/usr/share/games/fortunes";
    a->param_dtype = "f32";
    a->export_dtype = "f32";
    a->bos = a->eos = -1;
    a->steps = 200;
    a->seed = 1;
    a->val_every = 50;
    a->val_batches = 8;
    a->log_every = 10;
    a->batch = 8;
    a->grad_accum = 1;
    a->reshard_after_forward = 1;
    a->lr = 1e-3;
    a->min_lr = 1e-4;
    a->warmup = 20;
    a->weight_decay = 0.1;
    a->clip = 1.0;
    int layers = 0, heads = 0, kv_heads = 0, dim = 0, seq = 0, preset_given = 0;
    freeze_list_t freeze = {0};
    lm_lora_t lora = {0};
    const example_flag_t flags[] = {
        EXAMPLE_FLAG("--no-shard", EXAMPLE_SWITCH, &a->no_shard),
        EXAMPLE_FLAG("--hsdp", EXAMPLE_SWITCH, &a->hsdp),
        EXAMPLE_FLAG("--activation-checkpointing", EXAMPLE_SWITCH, &a->checkpointing),
        {.name = "--preset", .kind = EXAMPLE_STRING, .to = &a->preset, .given = &preset_given},
        EXAMPLE_FLAG("--data", EXAMPLE_STRING, &a->data),
        EXAMPLE_FLAG("--json", EXAMPLE_STRING, &a->json),
        EXAMPLE_FLAG("--save", EXAMPLE_STRING, &a->save),
        EXAMPLE_FLAG("--resume", EXAMPLE_STRING, &a->resume),
        EXAMPLE_FLAG("--export", EXAMPLE_STRING, &a->export_path),
        EXAMPLE_FLAG("--export-dtype", EXAMPLE_STRING, &a->export_dtype),
        EXAMPLE_CALLED("--lora", lora_flag, &lora),
        EXAMPLE_CALLED("--freeze", freeze_flag, &freeze),
        EXAMPLE_FLAG("--adapter", EXAMPLE_STRING, &a->adapter),
        EXAMPLE_FLAG("--save-adapter", EXAMPLE_STRING, &a->save_adapter),
        EXAMPLE_FLAG("--export-merged", EXAMPLE_STRING, &a->export_merged),
        EXAMPLE_FLAG("--tokenizer", EXAMPLE_STRING, &a->tokenizer),
        EXAMPLE_FLAG("--token-cache", EXAMPLE_STRING, &a->token_cache),
        EXAMPLE_FLAG("--model", EXAMPLE_STRING, &a->init_from),
        EXAMPLE_FLAG("--init-from", EXAMPLE_STRING, &a->init_from),
        EXAMPLE_FLAG("--dump-batches", EXAMPLE_STRING, &a->dump_batches),
        EXAMPLE_FLAG("--param-dtype", EXAMPLE_STRING, &a->param_dtype),
        EXAMPLE_RANGE("--layers", EXAMPLE_INT, &layers, 1, LM_MAX_LAYERS),
        EXAMPLE_RANGE("--heads", EXAMPLE_INT, &heads, 1, 1 << 10),
        EXAMPLE_RANGE("--kv-heads", EXAMPLE_INT, &kv_heads, 1, 1 << 10),
        EXAMPLE_RANGE("--dim", EXAMPLE_INT, &dim, 1, 1 << 16),
        EXAMPLE_RANGE("--seq-len", EXAMPLE_INT, &seq, 1, 1 << 15),
        EXAMPLE_RANGE("--steps", EXAMPLE_LONG, &a->steps, 0, 1L << 40),
        EXAMPLE_RANGE("--max-steps", EXAMPLE_LONG, &a->steps, 0, 1L << 40),
        EXAMPLE_RANGE("--batch", EXAMPLE_INT, &a->batch, 1, 1 << 20),
        EXAMPLE_RANGE("--grad-accum", EXAMPLE_INT, &a->grad_accum, 1, 1 << 20),
        EXAMPLE_RANGE("--threads", EXAMPLE_INT, &a->threads, 1, 1024),
        EXAMPLE_RANGE("--seed", EXAMPLE_LONG, &a->seed, 0, 1L << 40),
        EXAMPLE_RANGE("--val-every", EXAMPLE_LONG, &a->val_every, 0, 1L << 40),
        EXAMPLE_RANGE("--val-batches", EXAMPLE_LONG, &a->val_batches, 1, 1 << 20),
        EXAMPLE_RANGE("--sample", EXAMPLE_LONG, &a->sample, 0, 1 << 20),
        EXAMPLE_RANGE("--log-every", EXAMPLE_LONG, &a->log_every, 1, 1L << 40),
        EXAMPLE_RANGE("--save-every", EXAMPLE_LONG, &a->save_every, 0, 1L << 40),
        EXAMPLE_RANGE("--warmup", EXAMPLE_LONG, &a->warmup, 0, 1L << 40),
        EXAMPLE_RANGE("--reshard-after-forward", EXAMPLE_INT, &a->reshard_after_forward, 0,
                      1 << 20),
        EXAMPLE_FLAG("--lr", EXAMPLE_REAL, &a->lr),
        EXAMPLE_FLAG("--min-lr", EXAMPLE_REAL, &a->min_lr),
        EXAMPLE_FLAG("--weight-decay", EXAMPLE_REAL, &a->weight_decay),
        EXAMPLE_FLAG("--clip", EXAMPLE_REAL, &a->clip),
        EXAMPLE_FLAGS_END,
    };
    const example_cli_t cli = {usage, 0};
    example_parse_flags(argc, argv, flags, &cli);
    if (preset(a->preset, &a->cfg)) {
        fprintf(stderr, "error: --preset %s is not tiny, small, gpt2-124m, llama-tiny or "
                        "llama-small\n", a->preset);
        exit(2);
    }
    if (a->init_from)
        shape_from_directory(a, preset_given, (int[5]){layers, heads, kv_heads, dim, seq});
    else
        resize_preset(&a->cfg, layers, heads, kv_heads, dim, seq);
    a->cfg.num_freeze = freeze.n;
    memcpy(a->cfg.freeze, freeze.patterns, sizeof(freeze.patterns[0]) * (size_t)freeze.n);
    a->cfg.lora = lora;
    if (a->adapter)
        lora_from_adapter(a, lora.r > 0);
    if ((a->save_adapter || a->export_merged) && a->cfg.lora.r == 0) {
        fprintf(stderr, "error: %s needs adapters (--lora or --adapter)\n",
                a->save_adapter ? "--save-adapter" : "--export-merged");
        exit(2);
    }
    if (strcmp(a->export_dtype, "f32") && strcmp(a->export_dtype, "bf16")) {
        fprintf(stderr, "error: --export-dtype %s is not f32 or bf16\n", a->export_dtype);
        exit(2);
    }
    if (strcmp(a->param_dtype, "f32") && strcmp(a->param_dtype, "bf16")) {
        fprintf(stderr, "error: --param-dtype %s is not f32 or bf16\n", a->param_dtype);
        exit(2);
    }
    if ((long long)a->val_batches * a->batch > (1 << 30)) {
        fprintf(stderr, "error: --val-batches %ld x --batch %d windows: more than 2^30\n",
                a->val_batches, a->batch);
        exit(2);
    }
    if (a->min_lr > a->lr) {
        fprintf(stderr, "error: --min-lr %g is above --lr %g\n", a->min_lr, a->lr);
        exit(2);
    }
}
