/* config.json of GPT-2 and Llama models, and the tensors each architecture has.
 *
 * Fields that transformers' classes give defaults to (GPT2Config, LlamaConfig) take
 * those defaults when absent, because save_pretrained leaves out values equal to the
 * defaults; the sizes it always writes are required. rope_scaling is read from
 * "rope_scaling" or, as newer transformers write it, "rope_parameters" (which also
 * carries rope_theta). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint/hf_internal.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log_internal.h"

fsdp2_status_t hf_config_check_size(const fsdp2_hf_config_t *cfg, const char *what)
{
    FSDP2_ARG_CHECK(cfg != NULL, "%s: cfg is NULL", what);
    FSDP2_ARG_CHECK(cfg->size == sizeof(fsdp2_hf_config_t),
                    "%s: fsdp2_hf_config_t of size %u (this library's is %zu: set it with "
                    "FSDP2_HF_CONFIG_INIT)",
                    what, cfg->size, sizeof(fsdp2_hf_config_t));
    return FSDP2_SUCCESS;
}

fsdp2_status_t hf_read_text(const char *path, char **text, int *missing)
{
    *text = NULL;
    if (missing != NULL)
        *missing = 0;
    /* Without blocking: a FIFO in the file's place is refused below, not waited on. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT && missing != NULL) {
            *missing = 1;
            return FSDP2_SUCCESS;
        }
        return fsdp2_error(FSDP2_ERR_IO, "%s: open: %s", path, strerror(errno));
    }
    fsdp2_status_t status = FSDP2_SUCCESS;
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) != 0) {
        status = fsdp2_error(FSDP2_ERR_IO, "%s: stat: %s", path, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(st.st_mode)) {
        status = fsdp2_error(FSDP2_ERR_IO, "%s: not a regular file", path);
        goto cleanup;
    }
    if ((uint64_t)st.st_size > HF_MAX_JSON_BYTES) {
        status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: %" PRIu64 " bytes (at most %zu)", path,
                             (uint64_t)st.st_size, HF_MAX_JSON_BYTES);
        goto cleanup;
    }
    size_t size = (size_t)st.st_size, got = 0;
    buf = fsdp2_malloc(size + 1);
    if (buf == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: %zu bytes", path, size);
        goto cleanup;
    }
    while (got < size) {
        ssize_t n = pread(fd, buf + got, size - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            status = fsdp2_error(FSDP2_ERR_IO, "%s: read at %zu: %s", path, got,
                                 n < 0 ? strerror(errno) : "unexpected end of file");
            goto cleanup;
        }
        got += (size_t)n;
    }
    buf[size] = '\0';
    *text = buf;
    buf = NULL;
cleanup:
    free(buf);
    close(fd);
    return status;
}

/* ---------------------------------------------------------------------------------- */
/* Fields                                                                              */

typedef struct reader {
    const cJSON *root;
    const char *what;
} reader_t;

/* An integer field: absent or null takes def (def < 0 with required: refused). */
static fsdp2_status_t get_int(const reader_t *r, const char *key, int required, int64_t def,
                              int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
    if (v == NULL || cJSON_IsNull(v)) {
        if (required)
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: field '%s' is missing", r->what, key);
        *out = def;
        return FSDP2_SUCCESS;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > 9007199254740992.0)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: field '%s' is not an integer", r->what, key);
    *out = (int64_t)v->valuedouble;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t get_real(const reader_t *r, const char *key, double def, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
    if (v == NULL || cJSON_IsNull(v)) {
        *out = def;
        return FSDP2_SUCCESS;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: field '%s' is not a finite number", r->what,
                           key);
    *out = v->valuedouble;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t get_bool(const reader_t *r, const char *key, int def, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
    if (v == NULL || cJSON_IsNull(v)) {
        *out = def;
        return FSDP2_SUCCESS;
    }
    if (!cJSON_IsBool(v))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: field '%s' is not true or false", r->what,
                           key);
    *out = cJSON_IsTrue(v);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t get_string(const reader_t *r, const char *key, const char *def, char *out,
                                 size_t size)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
    const char *s = def;
    if (v != NULL && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v))
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: field '%s' is not a string", r->what, key);
        s = v->valuestring;
    }
    if (strlen(s) >= size)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "%s: %s '%.64s' is not supported", r->what, key,
                           s);
    snprintf(out, size, "%s", s);
    return FSDP2_SUCCESS;
}

/* bos_token_id / eos_token_id: an integer, null (-1), or a list whose first is kept. */
static fsdp2_status_t get_token(const reader_t *r, const char *key, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if (n == 0) {
            *out = -1;
            return FSDP2_SUCCESS;
        }
        const cJSON *first = v->child;
        if (!cJSON_IsNumber(first) || first->valuedouble != floor(first->valuedouble) ||
            first->valuedouble < 0 || first->valuedouble > 2147483647.0)
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: field '%s' is not a list of token ids",
                               r->what, key);
        *out = (int64_t)first->valuedouble;
        if (n > 1)
            FSDP2_LOG(INFO, CKPT, "%s: %s lists %d ids: keeping the first, %" PRId64, r->what, key,
                      n, *out);
        return FSDP2_SUCCESS;
    }
    FSDP2_CHECK(get_int(r, key, 0, -1, out));
    if (*out < -1)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: %s %" PRId64 " is negative", r->what, key, *out);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_rope_scaling(const reader_t *r, fsdp2_hf_config_t *c)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(r->root, "rope_scaling");
    const char *key = "rope_scaling";
    if (rs == NULL || cJSON_IsNull(rs)) {
        rs = cJSON_GetObjectItemCaseSensitive(r->root, "rope_parameters");
        key = "rope_parameters";
    }
    c->rope_scaling = FSDP2_HF_ROPE_NONE;
    if (rs == NULL || cJSON_IsNull(rs))
        return FSDP2_SUCCESS;
    if (!cJSON_IsObject(rs))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: field '%s' is not an object or null", r->what,
                           key);
    reader_t sub = {rs, r->what};
    if (strcmp(key, "rope_parameters") == 0)
        FSDP2_CHECK(get_real(&sub, "rope_theta", c->rope_theta, &c->rope_theta));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (type == NULL)
        type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(type))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: %s has no rope_type (or type) string", r->what,
                           key);
    if (strcmp(type->valuestring, "default") == 0)
        return FSDP2_SUCCESS;
    if (strcmp(type->valuestring, "llama3") != 0)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "%s: %s type '%s' is not supported (null, default, llama3)", r->what,
                           key, type->valuestring);
    c->rope_scaling = FSDP2_HF_ROPE_LLAMA3;
    FSDP2_CHECK(get_real(&sub, "factor", 8.0, &c->rope_factor));
    FSDP2_CHECK(get_real(&sub, "low_freq_factor", 1.0, &c->rope_low_freq_factor));
    FSDP2_CHECK(get_real(&sub, "high_freq_factor", 4.0, &c->rope_high_freq_factor));
    FSDP2_CHECK(get_int(&sub, "original_max_position_embeddings", 1, 0,
                        &c->rope_original_max_positions));
    if (!(c->rope_factor > 0) || !(c->rope_low_freq_factor > 0) ||
        !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
        c->rope_original_max_positions < 1)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s: %s llama3: factor %g, low_freq_factor %g, high_freq_factor %g, "
                           "original_max_position_embeddings %" PRId64
                           ": need positive values, high above low",
                           r->what, key, c->rope_factor, c->rope_low_freq_factor,
                           c->rope_high_freq_factor, c->rope_original_max_positions);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_gpt2(const reader_t *r, fsdp2_hf_config_t *c)
{
    FSDP2_CHECK(get_int(r, "vocab_size", 1, 0, &c->vocab_size));
    FSDP2_CHECK(get_int(r, "n_embd", 1, 0, &c->hidden_size));
    FSDP2_CHECK(get_int(r, "n_layer", 1, 0, &c->num_layers));
    FSDP2_CHECK(get_int(r, "n_head", 1, 0, &c->num_heads));
    FSDP2_CHECK(get_int(r, "n_positions", 1, 0, &c->max_positions));
    FSDP2_CHECK(get_int(r, "n_inner", 0, 4 * c->hidden_size, &c->intermediate_size));
    FSDP2_CHECK(get_real(r, "layer_norm_epsilon", 1e-5, &c->norm_eps));
    FSDP2_CHECK(get_string(r, "activation_function", "gelu_new", c->hidden_act,
                           sizeof(c->hidden_act)));
    FSDP2_CHECK(get_bool(r, "tie_word_embeddings", 1, &c->tie_word_embeddings));
    c->num_kv_heads = c->num_heads;
    c->head_dim = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
    c->rope_theta = 0;
    c->rope_scaling = FSDP2_HF_ROPE_NONE;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_llama(const reader_t *r, fsdp2_hf_config_t *c)
{
    FSDP2_CHECK(get_int(r, "vocab_size", 1, 0, &c->vocab_size));
    FSDP2_CHECK(get_int(r, "hidden_size", 1, 0, &c->hidden_size));
    FSDP2_CHECK(get_int(r, "num_hidden_layers", 1, 0, &c->num_layers));
    FSDP2_CHECK(get_int(r, "num_attention_heads", 1, 0, &c->num_heads));
    FSDP2_CHECK(get_int(r, "num_key_value_heads", 0, c->num_heads, &c->num_kv_heads));
    FSDP2_CHECK(get_int(r, "intermediate_size", 1, 0, &c->intermediate_size));
    FSDP2_CHECK(get_int(r, "max_position_embeddings", 0, 2048, &c->max_positions));
    FSDP2_CHECK(get_real(r, "rms_norm_eps", 1e-6, &c->norm_eps));
    FSDP2_CHECK(get_real(r, "rope_theta", 10000.0, &c->rope_theta));
    FSDP2_CHECK(get_string(r, "hidden_act", "silu", c->hidden_act, sizeof(c->hidden_act)));
    FSDP2_CHECK(get_bool(r, "tie_word_embeddings", 0, &c->tie_word_embeddings));
    int64_t quotient = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
    FSDP2_CHECK(get_int(r, "head_dim", 0, quotient, &c->head_dim));
    int attention_bias = 0, mlp_bias = 0;
    FSDP2_CHECK(get_bool(r, "attention_bias", 0, &attention_bias));
    FSDP2_CHECK(get_bool(r, "mlp_bias", 0, &mlp_bias));
    if (attention_bias || mlp_bias)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "%s: %s true is not supported (Llama without biases only)", r->what,
                           attention_bias ? "attention_bias" : "mlp_bias");
    return parse_rope_scaling(r, c);
}

fsdp2_status_t hf_config_parse(const char *text, const char *what, fsdp2_hf_config_t *cfg)
{
    cJSON *root = cJSON_Parse(text);
    if (root == NULL)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: not valid JSON", what);
    fsdp2_status_t status = FSDP2_SUCCESS;
    reader_t r = {root, what};
    unsigned size = cfg->size;
    memset(cfg, 0, sizeof(*cfg));
    cfg->size = size;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsObject(root) || !cJSON_IsString(type)) {
        status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: no model_type string", what);
        goto cleanup;
    }
    if (strcmp(type->valuestring, "gpt2") == 0) {
        cfg->arch = FSDP2_HF_GPT2;
        FSDP2_CHECK_GOTO(parse_gpt2(&r, cfg), status, cleanup);
    } else if (strcmp(type->valuestring, "llama") == 0) {
        cfg->arch = FSDP2_HF_LLAMA;
        FSDP2_CHECK_GOTO(parse_llama(&r, cfg), status, cleanup);
    } else {
        status = fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                             "%s: model_type '%.64s' is not supported (gpt2, llama)", what,
                             type->valuestring);
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(get_token(&r, "bos_token_id", &cfg->bos_token_id), status, cleanup);
    FSDP2_CHECK_GOTO(get_token(&r, "eos_token_id", &cfg->eos_token_id), status, cleanup);
    status = hf_config_validate(cfg, what);
cleanup:
    cJSON_Delete(root);
    return status;
}

fsdp2_status_t hf_config_validate(const fsdp2_hf_config_t *c, const char *what)
{
    int gpt2 = c->arch == FSDP2_HF_GPT2;
    if (!gpt2 && c->arch != FSDP2_HF_LLAMA)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "%s: arch %d is not FSDP2_HF_GPT2 or "
                           "FSDP2_HF_LLAMA", what, (int)c->arch);
    const struct {
        const char *name;
        int64_t value;
    } sizes[] = {
        {"vocab_size", c->vocab_size},
        {gpt2 ? "n_embd" : "hidden_size", c->hidden_size},
        {gpt2 ? "n_layer" : "num_hidden_layers", c->num_layers},
        {gpt2 ? "n_head" : "num_attention_heads", c->num_heads},
        {"num_key_value_heads", c->num_kv_heads},
        {gpt2 ? "n_inner" : "intermediate_size", c->intermediate_size},
        {gpt2 ? "n_positions" : "max_position_embeddings", c->max_positions},
    };
    /* Every product of two sizes below stays far inside int64_t. */
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (sizes[i].value < 1 || sizes[i].value > ((int64_t)1 << 31))
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: %s %" PRId64 " is not in 1 .. 2^31", what,
                               sizes[i].name, sizes[i].value);
    if (c->hidden_size % c->num_heads != 0)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: %s %" PRId64 " is not divisible by %s %" PRId64,
                           what, sizes[1].name, c->hidden_size, sizes[3].name, c->num_heads);
    if (c->head_dim != c->hidden_size / c->num_heads)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "%s: head_dim %" PRId64 " is not %s / %s = %" PRId64
                           " (not supported)",
                           what, c->head_dim, sizes[1].name, sizes[3].name,
                           c->hidden_size / c->num_heads);
    if (c->num_heads % c->num_kv_heads != 0 || (gpt2 && c->num_kv_heads != c->num_heads))
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s: num_key_value_heads %" PRId64 " does not divide %s %" PRId64, what,
                           c->num_kv_heads, sizes[3].name, c->num_heads);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: %s %g is not positive", what,
                           gpt2 ? "layer_norm_epsilon" : "rms_norm_eps", c->norm_eps);
    const char *act = gpt2 ? "gelu_new" : "silu";
    if (strncmp(c->hidden_act, act, sizeof(c->hidden_act)) != 0)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "%s: %s '%.16s' is not supported (%s)", what,
                           gpt2 ? "activation_function" : "hidden_act", c->hidden_act, act);
    if (!gpt2 && (!(c->rope_theta > 0) || !isfinite(c->rope_theta)))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: rope_theta %g is not positive", what,
                           c->rope_theta);
    if (c->rope_scaling != FSDP2_HF_ROPE_NONE &&
        (gpt2 || c->rope_scaling != FSDP2_HF_ROPE_LLAMA3))
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "%s: rope_scaling %d is not supported here",
                           what, (int)c->rope_scaling);
    if (c->vocab_size > 0 && (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size))
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s: bos_token_id %" PRId64 " / eos_token_id %" PRId64
                           " outside vocab_size %" PRId64,
                           what, c->bos_token_id, c->eos_token_id, c->vocab_size);
    return FSDP2_SUCCESS;
}

/* ---------------------------------------------------------------------------------- */
/* The tensors                                                                         */

typedef struct list_builder {
    hf_tensor_t *t;
    size_t n;
} list_builder_t;

static void add(list_builder_t *b, const char *name, int64_t rows, int64_t cols, int transposed,
                const char *field)
{
    hf_tensor_t *t = &b->t[b->n++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 1;
    t->transposed = transposed;
    t->field = field;
}

static void gpt2_list(const fsdp2_hf_config_t *c, list_builder_t *b)
{
    int64_t n = c->hidden_size, inner = c->intermediate_size;
    char name[HF_NAME_MAX];
    add(b, "wte.weight", c->vocab_size, n, 0, "vocab_size x n_embd");
    add(b, "wpe.weight", c->max_positions, n, 0, "n_positions x n_embd");
    static const char *const norms[] = {"ln_1", "ln_2"};
    for (int64_t l = 0; l < c->num_layers; l++) {
        const struct {
            const char *part;
            int64_t out, in;
            const char *field;
        } linear[] = {
            {"attn.c_attn", 3 * n, n, "3 n_embd x n_embd"},
            {"attn.c_proj", n, n, "n_embd x n_embd"},
            {"mlp.c_fc", inner, n, "n_inner x n_embd"},
            {"mlp.c_proj", n, inner, "n_embd x n_inner"},
        };
        /* transformers' order: ln_1, attn, ln_2, mlp */
        for (int k = 0; k < 4; k++) {
            if (k == 0 || k == 2) {
                const char *norm = norms[k / 2];
                snprintf(name, sizeof(name), "h.%" PRId64 ".%s.weight", l, norm);
                add(b, name, n, 0, 0, "n_embd");
                snprintf(name, sizeof(name), "h.%" PRId64 ".%s.bias", l, norm);
                add(b, name, n, 0, 0, "n_embd");
            }
            snprintf(name, sizeof(name), "h.%" PRId64 ".%s.weight", l, linear[k].part);
            add(b, name, linear[k].out, linear[k].in, 1, linear[k].field);
            snprintf(name, sizeof(name), "h.%" PRId64 ".%s.bias", l, linear[k].part);
            add(b, name, linear[k].out, 0, 0, k == 0 ? "3 n_embd" : k == 2 ? "n_inner" : "n_embd");
        }
    }
    add(b, "ln_f.weight", n, 0, 0, "n_embd");
    add(b, "ln_f.bias", n, 0, 0, "n_embd");
    if (!c->tie_word_embeddings)
        add(b, "lm_head.weight", c->vocab_size, n, 0, "vocab_size x n_embd");
}

static void llama_list(const fsdp2_hf_config_t *c, list_builder_t *b)
{
    int64_t h = c->hidden_size, q = c->num_heads * c->head_dim, kv = c->num_kv_heads * c->head_dim;
    int64_t inter = c->intermediate_size;
    char name[HF_NAME_MAX];
    add(b, "model.embed_tokens.weight", c->vocab_size, h, 0, "vocab_size x hidden_size");
    for (int64_t l = 0; l < c->num_layers; l++) {
        const struct {
            const char *part;
            int64_t out, in;
            const char *field;
        } parts[] = {
            {"self_attn.q_proj", q, h, "num_attention_heads head_dim x hidden_size"},
            {"self_attn.k_proj", kv, h, "num_key_value_heads head_dim x hidden_size"},
            {"self_attn.v_proj", kv, h, "num_key_value_heads head_dim x hidden_size"},
            {"self_attn.o_proj", h, q, "hidden_size x num_attention_heads head_dim"},
            {"mlp.gate_proj", inter, h, "intermediate_size x hidden_size"},
            {"mlp.up_proj", inter, h, "intermediate_size x hidden_size"},
            {"mlp.down_proj", h, inter, "hidden_size x intermediate_size"},
            {"input_layernorm", h, 0, "hidden_size"},
            {"post_attention_layernorm", h, 0, "hidden_size"},
        };
        for (size_t k = 0; k < sizeof(parts) / sizeof(parts[0]); k++) {
            snprintf(name, sizeof(name), "model.layers.%" PRId64 ".%s.weight", l, parts[k].part);
            add(b, name, parts[k].out, parts[k].in, 0, parts[k].field);
        }
    }
    add(b, "model.norm.weight", h, 0, 0, "hidden_size");
    if (!c->tie_word_embeddings)
        add(b, "lm_head.weight", c->vocab_size, h, 0, "vocab_size x hidden_size");
}

fsdp2_status_t hf_tensor_list(const fsdp2_hf_config_t *c, hf_tensor_t **list, size_t *count)
{
    size_t per_layer = c->arch == FSDP2_HF_GPT2 ? 12 : 9;
    size_t cap = 4 + per_layer * (size_t)c->num_layers;
    list_builder_t b = {fsdp2_calloc(cap, sizeof(hf_tensor_t)), 0};
    if (b.t == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%zu tensors of %" PRId64 " layers", cap,
                           c->num_layers);
    if (c->arch == FSDP2_HF_GPT2)
        gpt2_list(c, &b);
    else
        llama_list(c, &b);
    *list = b.t;
    *count = b.n;
    return FSDP2_SUCCESS;
}

void hf_stored_name(fsdp2_hf_arch_t arch, const char *canonical, char *out, size_t size)
{
    int prefix = arch == FSDP2_HF_GPT2 && strcmp(canonical, "lm_head.weight") != 0;
    snprintf(out, size, "%s%s", prefix ? "transformer." : "", canonical);
}

/* ---------------------------------------------------------------------------------- */
/* Writing config.json                                                                 */

static void add_int(cJSON *o, const char *key, int64_t v)
{
    cJSON_AddNumberToObject(o, key, (double)v);
}

static void add_token(cJSON *o, const char *key, int64_t v)
{
    if (v < 0)
        cJSON_AddNullToObject(o, key);
    else
        add_int(o, key, v);
}

fsdp2_status_t hf_config_to_json(const fsdp2_hf_config_t *c, fsdp2_dtype_t dtype, char **text)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    int gpt2 = c->arch == FSDP2_HF_GPT2;
    cJSON_AddItemToArray(arch, cJSON_CreateString(gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM"));
    cJSON_AddStringToObject(o, "model_type", gpt2 ? "gpt2" : "llama");
    add_int(o, "vocab_size", c->vocab_size);
    if (gpt2) {
        add_int(o, "n_positions", c->max_positions);
        add_int(o, "n_ctx", c->max_positions);
        add_int(o, "n_embd", c->hidden_size);
        add_int(o, "n_layer", c->num_layers);
        add_int(o, "n_head", c->num_heads);
        add_int(o, "n_inner", c->intermediate_size);
        cJSON_AddStringToObject(o, "activation_function", "gelu_new");
        cJSON_AddNumberToObject(o, "layer_norm_epsilon", c->norm_eps);
    } else {
        add_int(o, "hidden_size", c->hidden_size);
        add_int(o, "intermediate_size", c->intermediate_size);
        add_int(o, "num_hidden_layers", c->num_layers);
        add_int(o, "num_attention_heads", c->num_heads);
        add_int(o, "num_key_value_heads", c->num_kv_heads);
        add_int(o, "head_dim", c->head_dim);
        add_int(o, "max_position_embeddings", c->max_positions);
        cJSON_AddNumberToObject(o, "rms_norm_eps", c->norm_eps);
        cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
        if (c->rope_scaling == FSDP2_HF_ROPE_LLAMA3) {
            cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
            cJSON_AddStringToObject(rs, "rope_type", "llama3");
            cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
            cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_low_freq_factor);
            cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_high_freq_factor);
            add_int(rs, "original_max_position_embeddings", c->rope_original_max_positions);
        } else {
            cJSON_AddNullToObject(o, "rope_scaling");
        }
        cJSON_AddStringToObject(o, "hidden_act", "silu");
        cJSON_AddBoolToObject(o, "attention_bias", 0);
        cJSON_AddBoolToObject(o, "mlp_bias", 0);
    }
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings != 0);
    add_token(o, "bos_token_id", c->bos_token_id);
    add_token(o, "eos_token_id", c->eos_token_id);
    /* "dtype" for transformers 5, "torch_dtype" for 4 */
    cJSON_AddStringToObject(o, "dtype", dtype == FSDP2_BF16 ? "bfloat16" : "float32");
    cJSON_AddStringToObject(o, "torch_dtype", dtype == FSDP2_BF16 ? "bfloat16" : "float32");
    *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (*text == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "config.json text");
    return FSDP2_SUCCESS;
}

/* ---------------------------------------------------------------------------------- */

fsdp2_status_t fsdp2_hf_config_read(const char *dir, fsdp2_hf_config_t *cfg)
{
    FSDP2_ARG_CHECK(dir != NULL, "fsdp2_hf_config_read: dir is NULL");
    FSDP2_CHECK(hf_config_check_size(cfg, "fsdp2_hf_config_read"));
    size_t len = strlen(dir) + sizeof("/config.json");
    char *path = fsdp2_malloc(len);
    if (path == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s/config.json", dir);
    snprintf(path, len, "%s/config.json", dir);
    char *text = NULL;
    fsdp2_status_t status = hf_read_text(path, &text, NULL);
    if (status == FSDP2_SUCCESS)
        status = hf_config_parse(text, path, cfg);
    free(text);
    free(path);
    return status;
}
