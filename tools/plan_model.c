/* fsdp2-plan's models (plan_model.h). */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "plan_model.h"

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fsdp2-plan: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

char *xstrdup(const char *s)
{
    char *c = strdup(s);
    if (!c)
        DIE("out of memory");
    return c;
}

/* ---- the model: parameters by dotted name, built into a module tree ---- */

static void add_param(model_t *m, const char *name, int ndim, const int64_t *shape,
                      fsdp2_dtype_t dtype)
{
    if (m->count == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 256;
        m->params = realloc(m->params, m->cap * sizeof(*m->params));
        if (!m->params)
            DIE("out of memory");
    }
    model_param_t *p = &m->params[m->count++];
    memset(p, 0, sizeof(*p));
    p->name = xstrdup(name);
    p->ndim = ndim;
    memcpy(p->shape, shape, (size_t)ndim * sizeof(*shape));
    p->dtype = dtype;
    p->requires_grad = 1;
}

static void add_tie(model_t *m, const char *name, const char *target)
{
    m->tie_name = realloc(m->tie_name, (m->ties + 1) * sizeof(char *));
    m->tie_target = realloc(m->tie_target, (m->ties + 1) * sizeof(char *));
    if (!m->tie_name || !m->tie_target)
        DIE("out of memory");
    m->tie_name[m->ties] = xstrdup(name);
    m->tie_target[m->ties++] = xstrdup(target);
}

static void p2(model_t *m, const char *fmt, int layer, int64_t d0, int64_t d1)
{
    char name[128];
    snprintf(name, sizeof(name), fmt, layer);
    int64_t shape[2] = {d0, d1};
    add_param(m, name, d1 ? 2 : 1, shape, FSDP2_F32);
}

/* GPT-2 as examples/lm builds it ([out, in] linears, the head tied to wte); sizes from
 * OpenAI's GPT-2 (Radford et al. 2019, table 2) and its config.json: vocabulary 50257,
 * 1024 positions. */
static void preset_gpt2(model_t *m, int layers, int dim, int heads, int vocab, int positions)
{
    p2(m, "wte.weight", 0, vocab, dim);
    p2(m, "wpe.weight", 0, positions, dim);
    for (int l = 0; l < layers; l++) {
        p2(m, "h.%d.ln_1.weight", l, dim, 0);
        p2(m, "h.%d.ln_1.bias", l, dim, 0);
        p2(m, "h.%d.attn.c_attn.weight", l, 3 * dim, dim);
        p2(m, "h.%d.attn.c_attn.bias", l, 3 * dim, 0);
        p2(m, "h.%d.attn.c_proj.weight", l, dim, dim);
        p2(m, "h.%d.attn.c_proj.bias", l, dim, 0);
        p2(m, "h.%d.ln_2.weight", l, dim, 0);
        p2(m, "h.%d.ln_2.bias", l, dim, 0);
        p2(m, "h.%d.mlp.c_fc.weight", l, 4 * dim, dim);
        p2(m, "h.%d.mlp.c_fc.bias", l, 4 * dim, 0);
        p2(m, "h.%d.mlp.c_proj.weight", l, dim, 4 * dim);
        p2(m, "h.%d.mlp.c_proj.bias", l, dim, 0);
    }
    p2(m, "ln_f.weight", 0, dim, 0);
    p2(m, "ln_f.bias", 0, dim, 0);
    add_tie(m, "lm_head.weight", "wte.weight");
    m->layers = layers;
    m->hidden = dim;
    m->heads = heads;
}

/* Llama 3 as Hugging Face's LlamaForCausalLM names it (untied head, RMSNorm weights,
 * grouped-query attention with 8 key-value heads of 128); sizes from Meta's "The Llama 3
 * Herd of Models" (2024), table 3, and the models' config.json: vocabulary 128256. */
static void preset_llama3(model_t *m, int layers, int dim, int ffn, int heads)
{
    const int64_t vocab = 128256, kv = 8 * 128;
    p2(m, "model.embed_tokens.weight", 0, vocab, dim);
    for (int l = 0; l < layers; l++) {
        p2(m, "model.layers.%d.input_layernorm.weight", l, dim, 0);
        p2(m, "model.layers.%d.self_attn.q_proj.weight", l, dim, dim);
        p2(m, "model.layers.%d.self_attn.k_proj.weight", l, kv, dim);
        p2(m, "model.layers.%d.self_attn.v_proj.weight", l, kv, dim);
        p2(m, "model.layers.%d.self_attn.o_proj.weight", l, dim, dim);
        p2(m, "model.layers.%d.post_attention_layernorm.weight", l, dim, 0);
        p2(m, "model.layers.%d.mlp.gate_proj.weight", l, ffn, dim);
        p2(m, "model.layers.%d.mlp.up_proj.weight", l, ffn, dim);
        p2(m, "model.layers.%d.mlp.down_proj.weight", l, dim, ffn);
    }
    p2(m, "model.norm.weight", 0, dim, 0);
    p2(m, "lm_head.weight", 0, vocab, dim);
    m->layers = layers;
    m->hidden = dim;
    m->heads = heads;
}

const preset_t PRESETS[] = {
    {"gpt2-tiny", "examples/lm's tiny: 4 layers, 128 wide, 4 heads, 128 positions, 256 bytes"},
    {"gpt2-124m", "GPT-2 small: 12 layers, 768 wide, 12 heads"},
    {"gpt2-355m", "GPT-2 medium: 24 layers, 1024 wide, 16 heads"},
    {"gpt2-774m", "GPT-2 large: 36 layers, 1280 wide, 20 heads"},
    {"gpt2-1.5b", "GPT-2 XL: 48 layers, 1600 wide, 25 heads"},
    {"llama3-8b", "Llama 3 8B: 32 layers, 4096 wide, FFN 14336, 32 heads (8 KV)"},
    {"llama3-70b", "Llama 3 70B: 80 layers, 8192 wide, FFN 28672, 64 heads (8 KV)"},
    {"llama3-405b", "Llama 3 405B: 126 layers, 16384 wide, FFN 53248, 128 heads (8 KV)"},
};
const size_t PRESET_COUNT = sizeof(PRESETS) / sizeof(PRESETS[0]);

void load_preset(model_t *m, const char *name)
{
    if (strcmp(name, "gpt2-tiny") == 0)
        preset_gpt2(m, 4, 128, 4, 256, 128);
    else if (strcmp(name, "gpt2-124m") == 0)
        preset_gpt2(m, 12, 768, 12, 50257, 1024);
    else if (strcmp(name, "gpt2-355m") == 0)
        preset_gpt2(m, 24, 1024, 16, 50257, 1024);
    else if (strcmp(name, "gpt2-774m") == 0)
        preset_gpt2(m, 36, 1280, 20, 50257, 1024);
    else if (strcmp(name, "gpt2-1.5b") == 0)
        preset_gpt2(m, 48, 1600, 25, 50257, 1024);
    else if (strcmp(name, "llama3-8b") == 0)
        preset_llama3(m, 32, 4096, 14336, 32);
    else if (strcmp(name, "llama3-70b") == 0)
        preset_llama3(m, 80, 8192, 28672, 64);
    else if (strcmp(name, "llama3-405b") == 0)
        preset_llama3(m, 126, 16384, 53248, 128);
    else
        DIE("--model '%s' is not a preset (--list-models lists them)", name);
    snprintf(m->source, sizeof(m->source), "preset %s", name);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        DIE("cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    fclose(f);
    if (!buf)
        DIE("out of memory reading '%s'", path);
    buf[n] = '\0';
    *len = n;
    return buf;
}

fsdp2_dtype_t dtype_of(const char *text, const char *where)
{
    fsdp2_dtype_t d;
    if (fsdp2_dtype_parse(text, &d) == FSDP2_SUCCESS)
        return d;
    /* safetensors' names */
    static const struct {
        const char *st;
        fsdp2_dtype_t d;
    } names[] = {{"F32", FSDP2_F32}, {"F64", FSDP2_F64}, {"BF16", FSDP2_BF16},
                 {"F16", FSDP2_F16}, {"I32", FSDP2_I32}, {"I64", FSDP2_I64},
                 {"U8", FSDP2_U8}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(text, names[i].st) == 0)
            return names[i].d;
    DIE("%s: dtype '%s' is not one of f32, f64, bf16, f16, i32, i64, u8 (or safetensors' "
        "F32, ...)", where, text);
}

static int shape_of(const cJSON *arr, int64_t *shape, const char *where)
{
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || n > FSDP2_MAX_DIMS)
        DIE("%s: shape is not an array of at most %d numbers", where, FSDP2_MAX_DIMS);
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(arr, i);
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9.0e15 ||
            v->valuedouble != floor(v->valuedouble))
            DIE("%s: shape[%d] is not a whole number >= 0", where, i);
        shape[i] = (int64_t)v->valuedouble;
    }
    return n;
}

void load_json(model_t *m, const char *path)
{
    size_t len;
    char *text = read_file(path, &len);
    cJSON *root = cJSON_Parse(text);
    if (!root)
        DIE("%s is not JSON (near byte %zu)", path,
            (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : 0));
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "params");
    if (!cJSON_IsArray(params) || cJSON_GetArraySize(params) == 0)
        DIE("%s: no \"params\" array", path);
    const cJSON *p;
    int i = 0;
    cJSON_ArrayForEach(p, params) {
        char where[64];
        snprintf(where, sizeof(where), "%s: params[%d]", path, i++);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(p, "name");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(p, "shape");
        const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(p, "dtype");
        const cJSON *grad = cJSON_GetObjectItemCaseSensitive(p, "requires_grad");
        if (!cJSON_IsString(name) || !name->valuestring[0])
            DIE("%s: no \"name\"", where);
        int64_t s[FSDP2_MAX_DIMS];
        int nd = shape_of(shape, s, where);
        if (dtype && !cJSON_IsString(dtype))
            DIE("%s: \"dtype\" is not a string", where);
        if (grad && !cJSON_IsBool(grad))
            DIE("%s: \"requires_grad\" is not true or false", where);
        if (nd == 0)
            DIE("%s: shape [] has no dim 0 to shard (declare it as [1])", where);
        add_param(m, name->valuestring, nd, s,
                  dtype ? dtype_of(dtype->valuestring, where) : FSDP2_F32);
        if (grad)
            m->params[m->count - 1].requires_grad = cJSON_IsTrue(grad);
    }
    const cJSON *ties = cJSON_GetObjectItemCaseSensitive(root, "ties");
    if (ties && !cJSON_IsArray(ties))
        DIE("%s: \"ties\" is not an array", path);
    cJSON_ArrayForEach(p, ties) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(p, "name");
        const cJSON *target = cJSON_GetObjectItemCaseSensitive(p, "target");
        if (!cJSON_IsString(name) || !cJSON_IsString(target))
            DIE("%s: a tie needs \"name\" and \"target\" strings", path);
        add_tie(m, name->valuestring, target->valuestring);
    }
    cJSON_Delete(root);
    free(text);
    snprintf(m->source, sizeof(m->source), "%s", path);
}

/* Only the header: 8 bytes of its length (little endian), then that many bytes of JSON. */
void load_safetensors(model_t *m, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        DIE("cannot open '%s': %s", path, strerror(errno));
    unsigned char le[8];
    if (fread(le, 1, 8, f) != 8)
        DIE("%s: shorter than a safetensors header's 8-byte length", path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | le[i];
    if (n == 0 || n > ((uint64_t)100 << 20))
        DIE("%s: header length %llu is not in 1..100 MiB: not a safetensors file", path,
            (unsigned long long)n);
    char *text = malloc(n + 1);
    if (!text || fread(text, 1, n, f) != n)
        DIE("%s: the header of %llu bytes is cut short", path, (unsigned long long)n);
    fclose(f);
    text[n] = '\0';
    cJSON *root = cJSON_Parse(text);
    if (!cJSON_IsObject(root))
        DIE("%s: the header is not a JSON object", path);
    const cJSON *t;
    cJSON_ArrayForEach(t, root) {
        if (strcmp(t->string, "__metadata__") == 0)
            continue;
        char where[320];
        snprintf(where, sizeof(where), "%s: '%s'", path, t->string);
        const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        if (!cJSON_IsString(dtype))
            DIE("%s: no dtype", where);
        int64_t s[FSDP2_MAX_DIMS];
        int nd = shape_of(cJSON_GetObjectItemCaseSensitive(t, "shape"), s, where);
        fsdp2_dtype_t d = dtype_of(dtype->valuestring, where);
        int is_float = 0;
        fsdp2_dtype_is_float(d, &is_float);
        if (!is_float) { /* an integer buffer (position ids, counters): not trained */
            m->skipped++;
            continue;
        }
        if (nd == 0) { /* a scalar: one row */
            s[0] = 1;
            nd = 1;
        }
        add_param(m, t->string, nd, s, d);
    }
    cJSON_Delete(root);
    free(text);
    size_t used = strlen(m->source);
    snprintf(m->source + used, sizeof(m->source) - used, "%s%s", used ? " + " : "", path);
}

/* A Hugging Face model directory through the library's reader: config.json and the
 * safetensors headers (or the index and its shards' headers), never the tensor data; the
 * parameters in the library's canonical names, order and [out, in] layout, the tied head
 * as a tie, each in the file's dtype. */
void load_model_dir(model_t *m, const char *dir)
{
    fsdp2_hf_model_t *hf;
    fsdp2_hf_config_t c = FSDP2_HF_CONFIG_INIT;
    size_t count;
    if (fsdp2_hf_model_open(dir, &hf) != FSDP2_SUCCESS)
        DIE("--model-dir %s: %s", dir, fsdp2_last_error());
    CHECK(fsdp2_hf_model_config(hf, &c));
    CHECK(fsdp2_hf_model_num_tensors(hf, &count));
    for (size_t i = 0; i < count; i++) {
        fsdp2_hf_tensor_info_t t;
        CHECK(fsdp2_hf_model_tensor(hf, i, &t));
        add_param(m, t.name, t.ndim, t.shape, t.file_dtype);
    }
    if (c.tie_word_embeddings)
        add_tie(m, "lm_head.weight",
                c.arch == FSDP2_HF_LLAMA ? "model.embed_tokens.weight" : "wte.weight");
    m->layers = (int)c.num_layers;
    m->hidden = (int)c.hidden_size;
    m->heads = (int)c.num_heads;
    CHECK(fsdp2_hf_model_close(hf));
    size_t used = strlen(m->source);
    snprintf(m->source + used, sizeof(m->source) - used, "%s%s", used ? " + " : "", dir);
}

/* Whether dotted path equals target or ends in '.' and target (peft's matching of a list
 * of target_modules). */
static int lora_matches(const char *path, const char *target)
{
    size_t len = strlen(path), t = strlen(target);
    return !strcmp(path, target) ||
           (len > t && path[len - t - 1] == '.' && !strcmp(path + len - t, target));
}

void add_lora(model_t *m, const char *spec)
{
    char buf[1024], *targets[64];
    int ntargets = 0, in_targets = 0;
    long r = 0;
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq && in_targets && ntargets < 64) {
            targets[ntargets++] = tok;
        } else if (!strncmp(tok, "r=", 2)) {
            char *end;
            r = strtol(tok + 2, &end, 10);
            if (*end || r < 1 || r > 1 << 20)
                DIE("--lora %s: r '%s' is not a positive integer", spec, tok + 2);
            in_targets = 0;
        } else if (!strncmp(tok, "targets=", 8) && tok[8]) {
            targets[ntargets++] = tok + 8;
            in_targets = 1;
        } else if (!strncmp(tok, "alpha=", 6) || !strncmp(tok, "dropout=", 8)) {
            in_targets = 0; /* no bytes of their own */
        } else {
            DIE("--lora %s: '%s' is not r=N, alpha=X, dropout=X or targets=NAME,NAME", spec, tok);
        }
    }
    if (r == 0 || ntargets == 0)
        DIE("--lora %s: needs r=N and targets=NAME[,NAME...]", spec);
    size_t base = m->count;
    for (size_t i = 0; i < base; i++)
        m->params[i].requires_grad = 0; /* peft's get_peft_model freezes the base */
    for (int k = 0; k < ntargets; k++) {
        int hits = 0;
        for (size_t t = 0; t < m->ties; t++)
            if (lora_matches(m->tie_name[t], targets[k]) ||
                (strlen(m->tie_name[t]) > 7 && !strncmp(m->tie_name[t], targets[k], 7)))
                DIE("--lora %s: target '%s' is %s, tied to %s: an adapter cannot be put there",
                    spec, targets[k], m->tie_name[t], m->tie_target[t]);
        for (size_t i = 0; i < base; i++) {
            char path[FSDP2_FQN_MAX], name[FSDP2_FQN_MAX + 16];
            size_t len = strlen(m->params[i].name);
            if (m->params[i].ndim != 2 || len < 8 ||
                strcmp(m->params[i].name + len - 7, ".weight"))
                continue;
            snprintf(path, sizeof(path), "%.*s", (int)(len - 7), m->params[i].name);
            if (!lora_matches(path, targets[k]))
                continue;
            int64_t out = m->params[i].shape[0], in = m->params[i].shape[1];
            int64_t a[2] = {r, in}, b[2] = {out, r};
            snprintf(name, sizeof(name), "%s.lora_A.weight", path);
            add_param(m, name, 2, a, FSDP2_F32);
            snprintf(name, sizeof(name), "%s.lora_B.weight", path);
            add_param(m, name, 2, b, FSDP2_F32);
            hits++;
        }
        if (!hits)
            DIE("--lora %s: target '%s' matches no 2-D weight of the model (its linear "
                "layers' names end in q_proj, v_proj, c_attn, ...: see --json-out's params)",
                spec, targets[k]);
    }
}

/* ---- the module tree ---- */

/* The module at dotted `path` (created with its parents on demand). */
static fsdp2_module_t *module_at(tree_t *t, const char *path)
{
    if (!path[0])
        return t->root;
    for (size_t i = t->count; i-- > 0;)
        if (strcmp(t->paths[i], path) == 0)
            return t->mods[i];
    char parent[FSDP2_FQN_MAX];
    const char *dot = strrchr(path, '.');
    size_t plen = dot ? (size_t)(dot - path) : 0;
    if (plen >= sizeof(parent))
        DIE("module name '%s' is too long", path);
    memcpy(parent, path, plen);
    parent[plen] = '\0';
    fsdp2_module_t *up = module_at(t, parent), *m;
    CHECK(fsdp2_module_create(dot ? dot + 1 : path, &m));
    CHECK(fsdp2_module_add_child(up, m));
    t->paths = realloc(t->paths, (t->count + 1) * sizeof(char *));
    t->mods = realloc(t->mods, (t->count + 1) * sizeof(*t->mods));
    if (!t->paths || !t->mods)
        DIE("out of memory");
    t->paths[t->count] = xstrdup(path);
    t->mods[t->count++] = m;
    return m;
}

static void split_name(const char *name, char *module, size_t len, const char **leaf)
{
    const char *dot = strrchr(name, '.');
    size_t n = dot ? (size_t)(dot - name) : 0;
    if (n >= len)
        DIE("parameter name '%s' is too long", name);
    memcpy(module, name, n);
    module[n] = '\0';
    *leaf = dot ? dot + 1 : name;
}

static fsdp2_param_t *find(tree_t *t, const char *name)
{
    fsdp2_param_t *p = NULL;
    if (fsdp2_module_find_param(t->root, name, &p) != FSDP2_SUCCESS)
        return NULL;
    return p;
}

void build_tree(tree_t *t, const model_t *m, fsdp2_dtype_t shard_dtype, int keep_dtype,
                       char *const *frozen, int nfrozen)
{
    CHECK(fsdp2_module_create("", &t->root));
    fsdp2_device_t meta = FSDP2_DEVICE_META_INIT;
    for (size_t i = 0; i < m->count; i++) {
        const model_param_t *p = &m->params[i];
        char path[FSDP2_FQN_MAX];
        const char *leaf;
        split_name(p->name, path, sizeof(path), &leaf);
        fsdp2_tensor_t *v;
        CHECK(fsdp2_tensor_empty(meta, keep_dtype ? p->dtype : shard_dtype, p->ndim, p->shape,
                                 &v));
        int grad = p->requires_grad;
        for (int k = 0; k < nfrozen; k++)
            if (fnmatch(frozen[k], p->name, 0) == 0)
                grad = 0;
        CHECK(fsdp2_module_add_param(module_at(t, path), leaf, v, grad, NULL));
        fsdp2_tensor_release(v);
    }
    for (size_t i = 0; i < m->ties; i++) {
        fsdp2_param_t *target = find(t, m->tie_target[i]);
        if (!target)
            DIE("tie '%s': its target '%s' is not a parameter", m->tie_name[i],
                m->tie_target[i]);
        char path[FSDP2_FQN_MAX];
        const char *leaf;
        split_name(m->tie_name[i], path, sizeof(path), &leaf);
        CHECK(fsdp2_module_tie_param(module_at(t, path), leaf, target));
    }
}

/* ---- units ---- */

static int ends_in_number(const char *fqn)
{
    const char *last = strrchr(fqn, '.');
    last = last ? last + 1 : fqn;
    if (!*last)
        return 0;
    for (const char *c = last; *c; c++)
        if (*c < '0' || *c > '9')
            return 0;
    return 1;
}

static int has_params(const fsdp2_module_t *m)
{
    size_t n = 0;
    fsdp2_module_params(m, NULL, 0, &n);
    return n > 0;
}

int unit_policy(const fsdp2_module_t *m, void *ctx)
{
    const units_t *u = ctx;
    char fqn[FSDP2_FQN_MAX];
    if (fsdp2_module_fqn(m, fqn, sizeof(fqn)) != FSDP2_SUCCESS)
        return 0;
    for (int i = 0; i < u->nextra; i++)
        if (strcmp(u->extra[i], fqn) == 0)
            return 1;
    if (u->every)
        return has_params(m);
    if (u->pattern)
        return fnmatch(u->pattern, fqn, 0) == 0;
    return ends_in_number(fqn);
}

/* Children before parents, as fsdp2_fully_shard_tree takes units: the last module the
 * policy takes below the root is the last unit sharded before it. */
void find_last_unit(const fsdp2_module_t *m, keep_last_t *k)
{
    size_t count = 0;
    fsdp2_module_child_count(m, &count);
    for (size_t i = 0; i < count; i++) {
        fsdp2_module_t *c = NULL;
        if (fsdp2_module_child(m, i, &c) != FSDP2_SUCCESS)
            continue;
        find_last_unit(c, k);
        if (unit_policy(c, k->units))
            k->last = c;
    }
}

void keep_last_unit(const fsdp2_module_t *unit, fsdp2_shard_options_t *o, void *ctx)
{
    const keep_last_t *k = ctx;
    if (unit == k->last)
        o->reshard_after_forward = 0;
}

