/* fsdp2-plan: a model's per-rank memory and per-step communication under FSDP or HSDP at
 * any scale, from libfsdp2's own planner (fsdp2_plan_model), with no mesh, GPU or
 * allocation. See `fsdp2-plan --help` and docs/planning.md. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include <fsdp2/fsdp2.h>

#include "plan_model.h"

static const char USAGE[] =
    "usage: fsdp2-plan MODEL [OPTIONS]\n"
    "       fsdp2-plan --list-models\n"
    "\n"
    "The memory of one rank and the communication of one training step of a model under\n"
    "FSDP (a 1D mesh) or HSDP (a [replicas, shard] mesh), as libfsdp2 would shard it,\n"
    "computed by the library's own planner without a mesh, a GPU or any allocation.\n"
    "\n"
    "MODEL, one of:\n"
    "  --model NAME         a preset: gpt2-tiny, gpt2-124m, gpt2-355m, gpt2-774m, gpt2-1.5b,\n"
    "                       llama3-8b, llama3-70b, llama3-405b (--list-models shows them)\n"
    "  --json FILE          {\"params\": [{\"name\": \"h.0.mlp.fc.weight\", \"shape\": [3072, 768],\n"
    "                       \"dtype\": \"f32\", \"requires_grad\": true}, ...], \"ties\":\n"
    "                       [{\"name\": \"lm_head.weight\", \"target\": \"wte.weight\"}]}\n"
    "  --safetensors FILE   a safetensors file's header (names, dtypes, shapes; the tensor\n"
    "                       data is never read); repeat it for a checkpoint in several files\n"
    "  --model-dir DIR      a Hugging Face model directory (GPT-2, Llama): config.json and\n"
    "                       the safetensors headers, checked as examples/lm loads them, in\n"
    "                       the names and layout the library trains them in\n"
    "\n"
    "Mesh and rank:\n"
    "  --ranks N            FSDP over N ranks (default 8)\n"
    "  --mesh R,S           HSDP: R replicas of S-way shards (R x S ranks)\n"
    "  --rank K             the rank to plan on the shard dim (default 0; the ranks differ\n"
    "                       only where rows do not divide evenly)\n"
    "  --ranks-per-host N   for the time estimate: ranks of a host (default 8)\n"
    "\n"
    "FSDP options:\n"
    "  --dtype D            the sharded parameters' dtype (default f32; 'keep': the model's)\n"
    "  --param-dtype D      mixed precision: the compute dtype (bf16, f16, f32)\n"
    "  --reduce-dtype D     mixed precision: the reduce-scatter's dtype\n"
    "  --reshard-after-forward N   1 (default), 0, or a divisor of the shard size\n"
    "  --unsharded-buffers N       the ring of unsharded buffers (default 2)\n"
    "  --keep-last          the last block keeps its parameters from forward to backward\n"
    "                       (reshard_after_forward 0 for it, as examples/lm and PyTorch's\n"
    "                       recipes do)\n"
    "  --units blocks|every|PATTERN|min-params:N\n"
    "                       the fully_shard units besides the root: 'blocks' (default):\n"
    "                       every module whose name ends in a number (h.3, layers.17);\n"
    "                       'every': every module with parameters; a shell pattern on\n"
    "                       the module names ('*' crosses dots); or FSDP1's size-based\n"
    "                       auto wrap\n"
    "  --unit NAME          this module is a unit too (repeatable): an embedding, a head\n"
    "  --frozen PATTERN     parameters matching PATTERN do not train (repeatable)\n"
    "  --lora r=8,targets=q_proj,v_proj\n"
    "                       LoRA adapters as peft adds them: [r, in] and [out, r] beside\n"
    "                       each targeted linear weight, the rest of the model frozen\n"
    "  --optimizer O        adamw (default), sgd, sgd-momentum, adadelta or none\n"
    "\n"
    "Device and network:\n"
    "  --device-memory SIZE  says whether the rank fits (80GiB, 24GB, 81920MiB)\n"
    "  --bw intra=450GB/s,inter=50GB/s   per-rank bandwidths within and across hosts\n"
    "  --lat intra=3us,inter=10us        per-step latencies of a ring\n"
    "\n"
    "Activations (transformers, optional):\n"
    "  --batch B --seq T [--heads A] [--layers L] [--hidden H] [--activation-checkpointing]\n"
    "                       per-rank activations by Korthikanti et al.'s formula\n"
    "\n"
    "Output:\n"
    "  --json-out           one JSON object instead of the tables\n"
    "  --help               this text\n";

/* ---- numbers ---- */

static uint64_t parse_size(const char *text, const char *what)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || !isfinite(v) || v < 0)
        DIE("%s '%s' is not a size (80GiB, 24GB, 81920MiB)", what, text);
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},           {"B", 1},        {"KiB", 1024.0},      {"MiB", 1048576.0},
                 {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
                 {"GB", 1e9},       {"TB", 1e12}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].unit) != 0)
            continue;
        if (v * units[i].mult >= 9.2e18)
            DIE("%s '%s' is more than 8 EiB", what, text);
        return (uint64_t)(v * units[i].mult);
    }
    DIE("%s '%s': unit '%s' is not B, KiB, MiB, GiB, TiB, KB, MB, GB or TB", what, text, end);
}

/* "intra=450GB/s,inter=50GB/s" (bytes per second) or "intra=3us,inter=10us" (seconds) */
static void parse_pair(const char *text, const char *what, int rate, double *intra,
                       double *inter)
{
    char *copy = xstrdup(text), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            DIE("%s '%s': expected intra=...,inter=...", what, text);
        *eq = '\0';
        double *slot = strcmp(tok, "intra") == 0 ? intra : strcmp(tok, "inter") == 0 ? inter : NULL;
        if (!slot)
            DIE("%s: '%s' is not intra or inter", what, tok);
        char *end;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || !isfinite(v) || v <= 0 || v > 1e15)
            DIE("%s: '%s' is not a positive number with a unit", what, eq + 1);
        if (rate) {
            static const struct {
                const char *u;
                double m;
            } r[] = {{"GB/s", 1e9}, {"MB/s", 1e6}, {"GiB/s", 1073741824.0}, {"Gbit/s", 1.25e8},
                     {"Gb/s", 1.25e8}};
            size_t i;
            for (i = 0; i < sizeof(r) / sizeof(r[0]) && strcmp(end, r[i].u) != 0; i++)
                ;
            if (i == sizeof(r) / sizeof(r[0]))
                DIE("%s: unit '%s' is not GB/s, MB/s, GiB/s or Gbit/s", what, end);
            *slot = v * r[i].m;
        } else {
            double m = strcmp(end, "us") == 0 ? 1e-6 : strcmp(end, "ms") == 0 ? 1e-3
                       : strcmp(end, "ns") == 0 ? 1e-9 : strcmp(end, "s") == 0 ? 1.0 : -1;
            if (m < 0)
                DIE("%s: unit '%s' is not ns, us, ms or s", what, end);
            *slot = v * m;
        }
    }
    free(copy);
}

static int64_t parse_count(const char *text, const char *what)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || *end || end == text || v < 0)
        DIE("%s '%s' is not a whole number >= 0", what, text);
    return (int64_t)v;
}

static int parse_int(const char *text, const char *what, int lo, int hi)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < lo || v > hi)
        DIE("%s '%s' is not a whole number in %d..%d", what, text, lo, hi);
    return (int)v;
}

static const char *human(uint64_t b, char *buf, size_t len)
{
    if (b >= ((uint64_t)1 << 30))
        snprintf(buf, len, "%.2f GiB", (double)b / 1073741824.0);
    else if (b >= ((uint64_t)1 << 20))
        snprintf(buf, len, "%.2f MiB", (double)b / 1048576.0);
    else if (b >= 1024)
        snprintf(buf, len, "%.2f KiB", (double)b / 1024.0);
    else
        snprintf(buf, len, "%llu B", (unsigned long long)b);
    return buf;
}

/* Ring time of calls collectives over n ranks: steps (n - 1, or 2 (n - 1) for an
 * all-reduce) latencies each, plus this rank's sent bytes at the bandwidth. */
static double ring_seconds(const fsdp2_plan_collective_t *c, int all_reduce, double bw,
                           double lat)
{
    if (!c->calls)
        return 0.0;
    double steps = (double)(c->ranks - 1) * (all_reduce ? 2 : 1);
    return (double)c->calls * steps * lat + (double)c->sent / bw;
}

static void need_value(const char *opt, const char *v)
{
    if (!v)
        DIE("%s needs a value", opt);
}

int main(int argc, char **argv)
{
    model_t model = {0};
    int have_model = 0, replicas = 1, shard = 8, rank = 0, per_host = 8, json_out = 0;
    int keep_dtype = 0, reshard = 1, buffers = 2, batch = 0, seq = 0, ckpt = 0, keep = 0;
    fsdp2_dtype_t shard_dtype = FSDP2_F32, param_dtype = FSDP2_DTYPE_COUNT,
                  reduce_dtype = FSDP2_DTYPE_COUNT;
    const char *optimizer = "adamw";
    units_t units = {NULL, 0, {NULL}, 0};
    int64_t min_params = -1;
    uint64_t device_memory = 0;
    double bw_intra = 450e9, bw_inter = 50e9, lat_intra = 3e-6, lat_inter = 10e-6;
    char *frozen[64];
    int nfrozen = 0;
    const char *lora = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE(opt) (strcmp(a, opt) == 0 && (need_value(opt, v), i++, 1))
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (strcmp(a, "--list-models") == 0) {
            for (size_t k = 0; k < PRESET_COUNT; k++)
                printf("%-12s %s\n", PRESETS[k].name, PRESETS[k].about);
            return 0;
        } else if (strcmp(a, "--json-out") == 0) {
            json_out = 1;
        } else if (strcmp(a, "--activation-checkpointing") == 0) {
            ckpt = 1;
        } else if (strcmp(a, "--keep-last") == 0) {
            keep = 1;
        } else if (TAKE("--model")) {
            load_preset(&model, v);
            have_model = 1;
        } else if (TAKE("--json")) {
            load_json(&model, v);
            have_model = 1;
        } else if (TAKE("--safetensors")) {
            load_safetensors(&model, v);
            have_model = 1;
        } else if (TAKE("--model-dir")) {
            load_model_dir(&model, v);
            have_model = 1;
        } else if (TAKE("--ranks")) {
            replicas = 1;
            shard = parse_int(v, "--ranks", 1, 1048576);
        } else if (TAKE("--mesh")) {
            char *comma = strchr(v, ',');
            if (!comma)
                DIE("--mesh '%s' is not R,S", v);
            *comma = '\0';
            replicas = parse_int(v, "--mesh replicas", 1, 1048576);
            shard = parse_int(comma + 1, "--mesh shard", 1, 1048576);
        } else if (TAKE("--rank")) {
            rank = parse_int(v, "--rank", 0, 1048575);
        } else if (TAKE("--ranks-per-host")) {
            per_host = parse_int(v, "--ranks-per-host", 1, 1048576);
        } else if (TAKE("--dtype")) {
            keep_dtype = strcmp(v, "keep") == 0;
            if (!keep_dtype)
                shard_dtype = dtype_of(v, "--dtype");
        } else if (TAKE("--param-dtype")) {
            param_dtype = dtype_of(v, "--param-dtype");
        } else if (TAKE("--reduce-dtype")) {
            reduce_dtype = dtype_of(v, "--reduce-dtype");
        } else if (TAKE("--reshard-after-forward")) {
            reshard = parse_int(v, "--reshard-after-forward", 0, 1048576);
        } else if (TAKE("--unsharded-buffers")) {
            buffers = parse_int(v, "--unsharded-buffers", 1, 64);
        } else if (TAKE("--units")) {
            units.pattern = NULL;
            units.every = 0;
            min_params = -1;
            if (strcmp(v, "every") == 0)
                units.every = 1;
            else if (strncmp(v, "min-params:", 11) == 0)
                min_params = parse_count(v + 11, "--units min-params");
            else if (strcmp(v, "blocks") != 0)
                units.pattern = v;
        } else if (TAKE("--unit")) {
            if (units.nextra == 64)
                DIE("more than 64 --unit names");
            units.extra[units.nextra++] = (char *)v;
        } else if (TAKE("--lora")) {
            lora = v;
        } else if (TAKE("--frozen")) {
            if (nfrozen == 64)
                DIE("more than 64 --frozen patterns");
            frozen[nfrozen++] = (char *)v;
        } else if (TAKE("--optimizer")) {
            optimizer = v;
        } else if (TAKE("--device-memory")) {
            device_memory = parse_size(v, "--device-memory");
        } else if (TAKE("--bw")) {
            parse_pair(v, "--bw", 1, &bw_intra, &bw_inter);
        } else if (TAKE("--lat")) {
            parse_pair(v, "--lat", 0, &lat_intra, &lat_inter);
        } else if (TAKE("--batch")) {
            batch = parse_int(v, "--batch", 1, 1 << 24);
        } else if (TAKE("--seq")) {
            seq = parse_int(v, "--seq", 1, 1 << 24);
        } else if (TAKE("--heads")) {
            model.heads = parse_int(v, "--heads", 1, 1 << 20);
        } else if (TAKE("--layers")) {
            model.layers = parse_int(v, "--layers", 1, 1 << 20);
        } else if (TAKE("--hidden")) {
            model.hidden = parse_int(v, "--hidden", 1, 1 << 24);
        } else {
            DIE("unknown option '%s' (--help lists them)", a);
        }
#undef TAKE
    }
    if (!have_model)
        DIE("no model: give --model NAME, --json FILE or --safetensors FILE (--help)");
    if (!model.count)
        DIE("%s has no floating-point parameters to plan (%zu other tensors)", model.source,
            model.skipped);
    if (model.skipped)
        fprintf(stderr, "fsdp2-plan: %zu integer tensors of %s left out (buffers, not "
                "parameters)\n", model.skipped, model.source);
    if (min_params >= 0 && units.nextra)
        DIE("--unit NAME cannot add to --units min-params:N (FSDP1's size rule takes no "
            "names); use a pattern or 'every'");
    if (keep && reshard != 1)
        DIE("--keep-last keeps the last block whole where the others reshard "
            "(--reshard-after-forward 1); it means nothing with %d", reshard);
    if (rank >= shard)
        DIE("--rank %d is not in 0..%d (the shard dim has %d ranks)", rank, shard - 1, shard);

    fsdp2_optimizer_options_t oo;
    const fsdp2_optimizer_options_t *opt = &oo;
    if (strcmp(optimizer, "adamw") == 0)
        oo = (fsdp2_optimizer_options_t)FSDP2_ADAMW_OPTIONS_INIT(1e-3);
    else if (strcmp(optimizer, "adadelta") == 0)
        oo = (fsdp2_optimizer_options_t)FSDP2_ADADELTA_OPTIONS_INIT(1.0);
    else if (strcmp(optimizer, "sgd") == 0 || strcmp(optimizer, "sgd-momentum") == 0) {
        oo = (fsdp2_optimizer_options_t)FSDP2_SGD_OPTIONS_INIT(0.1);
        oo.momentum = optimizer[3] ? 0.9 : 0.0;
    } else if (strcmp(optimizer, "none") == 0)
        opt = NULL;
    else
        DIE("--optimizer '%s' is not adamw, sgd, sgd-momentum, adadelta or none", optimizer);

    if (lora)
        add_lora(&model, lora);
    tree_t tree = {0};
    build_tree(&tree, &model, shard_dtype, keep_dtype, frozen, nfrozen);
    fsdp2_plan_options_t po = FSDP2_PLAN_OPTIONS_INIT;
    po.replicas = replicas;
    po.shard = shard;
    po.rank = rank;
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    so.reshard_after_forward = reshard;
    so.unsharded_buffers = buffers;
    so.mp.param_dtype = param_dtype;
    so.mp.reduce_dtype = reduce_dtype;
    po.shard_options = &so;
    if (min_params >= 0) {
        po.min_params = min_params;
    } else {
        po.policy = unit_policy;
        po.policy_ctx = &units;
    }
    po.optimizer = opt;
    keep_last_t kl = {&units, NULL};
    if (keep) {
        if (min_params >= 0)
            DIE("--keep-last needs units chosen by name (blocks, every or a pattern)");
        find_last_unit(tree.root, &kl);
        if (!kl.last)
            DIE("--keep-last: no unit besides the root to keep");
        po.unit_options = keep_last_unit;
        po.unit_options_ctx = &kl;
    }
    fsdp2_plan_report_t rep = {.size = sizeof(rep)};
    CHECK(fsdp2_plan_model(tree.root, &po, &rep));

    /* Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
     * Transformer Models"), 16-bit activations, per layer s b h (34 + 5 a s / h) bytes, or
     * 2 s b h with full activation checkpointing (plus one layer recomputed). Each rank
     * holds its own batch of B sequences. */
    double act = 0.0;
    int have_act = batch && seq;
    if (have_act) {
        if (!model.layers || !model.hidden || !model.heads)
            DIE("activations need --layers, --hidden and --heads for a model that is not a "
                "preset");
        double sbh = (double)seq * batch * model.hidden;
        double full = sbh * (34.0 + 5.0 * model.heads * (double)seq / model.hidden);
        act = ckpt ? 2.0 * sbh * model.layers + full : full * model.layers;
        if (!(act < 9.2e18))
            DIE("the activations (%.3g bytes) are more than 8 EiB", act);
    }
    uint64_t need = rep.total + (uint64_t)act;

    /* Which links: the shard dim stays in a host when its ranks fit one; the replicate
     * dim crosses hosts whenever there is more than one host. */
    int shard_in_host = shard <= per_host;
    double ag_s = ring_seconds(&rep.all_gather, 0, shard_in_host ? bw_intra : bw_inter,
                               shard_in_host ? lat_intra : lat_inter);
    int block_in_host = rep.block_all_gather.ranks <= per_host;
    double bag_s = ring_seconds(&rep.block_all_gather, 0, block_in_host ? bw_intra : bw_inter,
                                block_in_host ? lat_intra : lat_inter);
    double rs_s = ring_seconds(&rep.reduce_scatter, 0, shard_in_host ? bw_intra : bw_inter,
                               shard_in_host ? lat_intra : lat_inter);
    double ar_s = ring_seconds(&rep.all_reduce, 1, bw_inter, lat_inter);

    if (json_out) {
        cJSON *src = cJSON_CreateString(model.source);
        char *quoted = src ? cJSON_PrintUnformatted(src) : NULL;
        if (!quoted)
            DIE("out of memory");
        printf("{\"model\": %s, \"mesh\": [%d, %d], \"rank\": %d, \"units\": %d, "
               "\"params\": %lld, \"trained_params\": %lld,\n",
               quoted, replicas, shard, rank, rep.units, (long long)rep.param_numel,
               (long long)rep.trained_numel);
        cJSON_free(quoted);
        cJSON_Delete(src);
        printf(" \"memory\": {\"sharded_params\": %llu, \"sharded_grads\": %llu, "
               "\"optimizer_state\": %llu, \"unsharded_params\": %llu, \"unsharded_grads\": "
               "%llu, \"reduce_scatter\": %llu, \"post_forward_params\": %llu, \"plan\": %llu, "
               "\"total\": %llu, \"activations\": %.0f, \"with_activations\": %llu, "
               "\"device_memory\": %llu, \"fits\": %s},\n",
               (unsigned long long)rep.memory.sharded_params,
               (unsigned long long)rep.memory.sharded_grads,
               (unsigned long long)rep.optimizer_state,
               (unsigned long long)rep.memory.unsharded_params,
               (unsigned long long)rep.memory.unsharded_grads,
               (unsigned long long)rep.memory.reduce_scatter,
               (unsigned long long)rep.memory.post_forward_params,
               (unsigned long long)rep.memory.total, (unsigned long long)rep.total, act,
               (unsigned long long)need, (unsigned long long)device_memory,
               device_memory ? (need <= device_memory ? "true" : "false") : "null");
        const fsdp2_plan_collective_t *cs[4] = {&rep.all_gather, &rep.block_all_gather,
                                                &rep.reduce_scatter, &rep.all_reduce};
        const char *names[4] = {"all_gather", "block_all_gather", "reduce_scatter",
                                "all_reduce"};
        double secs[4] = {ag_s, bag_s, rs_s, ar_s};
        printf(" \"step\": {");
        for (int k = 0; k < 4; k++)
            printf("%s\"%s\": {\"calls\": %llu, \"bytes\": %llu, \"sent\": %llu, \"ranks\": %d, "
                   "\"seconds\": %.6g}",
                   k ? ", " : "", names[k], (unsigned long long)cs[k]->calls,
                   (unsigned long long)cs[k]->bytes, (unsigned long long)cs[k]->sent,
                   cs[k]->ranks, secs[k]);
        printf(", \"seconds\": %.6g}}\n", ag_s + bag_s + rs_s + ar_s);
        return 0;
    }

    char b1[32], b2[32];
    printf("model       %s: %lld parameters (%lld trained), %d fully_shard units\n",
           model.source, (long long)rep.param_numel, (long long)rep.trained_numel, rep.units);
    printf("mesh        %s [%d, %d] = %lld ranks; rank %d of the shard dim; shards in %s%s%s%s%s\n",
           replicas > 1 ? "HSDP" : "FSDP", replicas, shard, (long long)replicas * shard, rank,
           keep_dtype ? "the model's dtypes" : fsdp2_dtype_name(shard_dtype),
           param_dtype != FSDP2_DTYPE_COUNT ? ", compute in " : "",
           param_dtype != FSDP2_DTYPE_COUNT ? fsdp2_dtype_name(param_dtype) : "",
           reduce_dtype != FSDP2_DTYPE_COUNT ? ", reduce in " : "",
           reduce_dtype != FSDP2_DTYPE_COUNT ? fsdp2_dtype_name(reduce_dtype) : "");
    printf("\nmemory of the rank                         bytes\n");
    const struct {
        const char *what;
        uint64_t bytes;
    } rows[] = {
        {"sharded parameters", rep.memory.sharded_params},
        {"sharded gradients", rep.memory.sharded_grads},
        {"optimizer state", rep.optimizer_state},
        {"unsharded parameter buffers", rep.memory.unsharded_params},
        {"unsharded gradient buffers", rep.memory.unsharded_grads},
        {"reduce-scatter staging", rep.memory.reduce_scatter},
        {"post-forward shards", rep.memory.post_forward_params},
    };
    for (size_t k = 0; k < sizeof(rows) / sizeof(rows[0]); k++)
        printf("  %-30s %16llu  %12s\n", rows[k].what, (unsigned long long)rows[k].bytes,
               human(rows[k].bytes, b1, sizeof(b1)));
    printf("  %-30s %16llu  %12s  (the library's allocations at their peak)\n", "total",
           (unsigned long long)rep.total, human(rep.total, b1, sizeof(b1)));
    if (have_act) {
        printf("  %-30s %16.0f  %12s  (%s)\n", "activations", act,
               human((uint64_t)act, b2, sizeof(b2)),
               ckpt ? "L x 2 s b h + s b h (34 + 5 a s / h), checkpointed"
                    : "L x s b h (34 + 5 a s / h), 16-bit");
        printf("  %-30s %16llu  %12s\n", "with activations", (unsigned long long)need,
               human(need, b1, sizeof(b1)));
    }
    if (device_memory)
        printf("  fits %s: %s (%s free)\n", human(device_memory, b1, sizeof(b1)),
               need <= device_memory ? "yes" : "NO",
               need <= device_memory ? human(device_memory - need, b2, sizeof(b2)) : "none");
    printf("\none step of the rank         calls   payload bytes      sent bytes   ranks   "
           "est. seconds\n");
    const struct {
        const char *what;
        const fsdp2_plan_collective_t *c;
        double s;
    } coll[] = {{"all-gather (shard dim)", &rep.all_gather, ag_s},
                {"all-gather (blocks of N)", &rep.block_all_gather, bag_s},
                {"reduce-scatter (shard dim)", &rep.reduce_scatter, rs_s},
                {"all-reduce (replicate dim)", &rep.all_reduce, ar_s}};
    for (size_t k = 0; k < 4; k++)
        printf("  %-26s %5llu %15llu %15llu %7d %14.6f\n", coll[k].what,
               (unsigned long long)coll[k].c->calls, (unsigned long long)coll[k].c->bytes,
               (unsigned long long)coll[k].c->sent, coll[k].c->ranks, coll[k].s);
    printf("  %-26s %5s %15s %15s %7s %14.6f\n", "total", "", "", "", "",
           ag_s + bag_s + rs_s + ar_s);
    printf("\n  ring: all-gather and reduce-scatter send (n - 1) / n of the payload in n - 1\n"
           "  steps, all-reduce 2 (n - 1) / n in 2 (n - 1) steps: time = steps x latency +\n"
           "  sent / bandwidth; shard dim %s the host (%.0f GB/s, %.1f us), blocks of N\n"
           "  within it when N fits a host, replicate dim across (%.0f GB/s, %.1f us); none of\n"
           "  it overlapped with compute.\n",
           shard_in_host ? "within" : "across", (shard_in_host ? bw_intra : bw_inter) / 1e9,
           (shard_in_host ? lat_intra : lat_inter) * 1e6, bw_inter / 1e9, lat_inter * 1e6);
    return 0;
}
