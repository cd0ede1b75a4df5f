/* PEFT LoRA adapter directories (include/fsdp2/hf_model.h): adapter_config.json parsed
 * and checked against what the LoRA layer computes, adapter_model.safetensors through the
 * library's safetensors reader and writer, the directory written whole or not at all. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/hf_internal.h"
#include "core/error.h"
#include "core/fault.h"

#define PEFT_PREFIX "base_model.model."

struct fsdp2_hf_adapter {
    char *dir;
    fsdp2_hf_lora_config_t cfg;
    st_file_t file;
    int file_open;
    hf_tensor_t *tensors; /* canonical */
    const st_entry_t **entries;
    size_t num_tensors;
};

static fsdp2_status_t check_size(const fsdp2_hf_lora_config_t *cfg, const char *what)
{
    FSDP2_ARG_CHECK(cfg != NULL, "%s: cfg is NULL", what);
    FSDP2_ARG_CHECK(cfg->size == sizeof(fsdp2_hf_lora_config_t),
                    "%s: fsdp2_hf_lora_config_t of size %u (this library's is %zu: set it with "
                    "FSDP2_HF_LORA_CONFIG_INIT)",
                    what, cfg->size, sizeof(fsdp2_hf_lora_config_t));
    return FSDP2_SUCCESS;
}

/* A field that must be absent, null, false or empty: what the LoRA layer cannot do. */
static fsdp2_status_t refuse_set(const cJSON *root, const char *field, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field);
    int set = v != NULL && !cJSON_IsNull(v) && !cJSON_IsFalse(v) &&
              !((cJSON_IsObject(v) || cJSON_IsArray(v)) && cJSON_GetArraySize(v) == 0);
    if (set)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s: %s is set; LoRA adapters here have "
                           "none (supported: r, lora_alpha, lora_dropout, target_modules)",
                           path, field);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_config(const char *text, const char *path, fsdp2_hf_lora_config_t *c)
{
    cJSON *root = cJSON_Parse(text);
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (!cJSON_IsObject(root)) {
        status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: not a JSON object", path);
        goto cleanup;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA") != 0) {
        status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s: peft_type %s%s%s is not supported "
                             "(LORA)", path, cJSON_IsString(type) ? "'" : "",
                             cJSON_IsString(type) ? type->valuestring : "missing",
                             cJSON_IsString(type) ? "'" : "");
        goto cleanup;
    }
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(root, "lora_dropout");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
    const cJSON *targets = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    const cJSON *fan = cJSON_GetObjectItemCaseSensitive(root, "fan_in_fan_out");
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(root, "base_model_name_or_path");
    if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 1e6 ||
        r->valuedouble != floor(r->valuedouble)) {
        status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s: r %g is not a positive integer", path,
                             cJSON_IsNumber(r) ? r->valuedouble : NAN);
        goto cleanup;
    }
    c->r = (int64_t)r->valuedouble;
    c->alpha = cJSON_IsNumber(alpha) ? alpha->valuedouble : NAN;
    c->dropout = drop == NULL || cJSON_IsNull(drop) ? 0.0
                 : cJSON_IsNumber(drop)             ? drop->valuedouble
                                                    : NAN;
    if (!isfinite(c->alpha) || !(c->dropout >= 0 && c->dropout < 1)) {
        status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s: lora_alpha %g, lora_dropout %g: "
                             "alpha must be a finite number, dropout in [0, 1)", path, c->alpha,
                             c->dropout);
        goto cleanup;
    }
    if (bias != NULL && !(cJSON_IsString(bias) && strcmp(bias->valuestring, "none") == 0)) {
        status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s: bias %s is not supported (none)",
                             path, cJSON_IsString(bias) ? bias->valuestring : "(not a string)");
        goto cleanup;
    }
    static const char *const unsupported[] = {
        "use_dora",      "use_rslora",        "modules_to_save", "layers_to_transform",
        "rank_pattern",  "alpha_pattern",     "lora_bias",       "exclude_modules",
        "layer_replication", "target_parameters"};
    for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++)
        FSDP2_CHECK_GOTO(refuse_set(root, unsupported[i], path), status, cleanup);
    int n = cJSON_GetArraySize(targets);
    if (!cJSON_IsArray(targets) || n < 1 || n > FSDP2_HF_LORA_MAX_TARGETS) {
        status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s: target_modules must be a list of 1 "
                             "to %d module names%s", path, FSDP2_HF_LORA_MAX_TARGETS,
                             cJSON_IsString(targets) ? " (a regular expression is not supported)"
                                                     : "");
        goto cleanup;
    }
    c->num_targets = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, targets) {
        if (!cJSON_IsString(t) || strlen(t->valuestring) == 0 ||
            strlen(t->valuestring) >= sizeof(c->targets[0])) {
            status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s: target_modules holds an entry "
                                 "that is not a module name of 1 to %zu characters", path,
                                 sizeof(c->targets[0]) - 1);
            goto cleanup;
        }
        snprintf(c->targets[c->num_targets++], sizeof(c->targets[0]), "%s", t->valuestring);
    }
    c->fan_in_fan_out = cJSON_IsTrue(fan);
    snprintf(c->base_model, sizeof(c->base_model), "%s",
             cJSON_IsString(base) ? base->valuestring : "");
cleanup:
    cJSON_Delete(root);
    return status;
}

/* The canonical name of a stored one, or NULL when it is not an adapter weight. */
static const char *canonical_of(const char *stored, char *out, size_t size)
{
    if (strncmp(stored, PEFT_PREFIX, strlen(PEFT_PREFIX)) != 0)
        return NULL;
    const char *rest = stored + strlen(PEFT_PREFIX);
    if (strncmp(rest, "transformer.", 12) == 0)
        rest += 12;
    size_t len = strlen(rest);
    static const char *const ends[] = {".lora_A.weight", ".lora_B.weight"};
    for (int i = 0; i < 2; i++) {
        size_t e = strlen(ends[i]);
        if (len > e && strcmp(rest + len - e, ends[i]) == 0 && len < size) {
            memcpy(out, rest, len + 1);
            return out;
        }
    }
    return NULL;
}

/* The tensor whose name is name with its last "lora_X" part turned into other. */
static size_t find_pair(const fsdp2_hf_adapter_t *a, const char *name, char other)
{
    char want[HF_NAME_MAX];
    snprintf(want, sizeof(want), "%s", name);
    char *part = strstr(want, ".lora_");
    if (part == NULL)
        return SIZE_MAX;
    part[6] = other;
    for (size_t i = 0; i < a->num_tensors; i++)
        if (strcmp(a->tensors[i].name, want) == 0)
            return i;
    return SIZE_MAX;
}

static fsdp2_status_t open_tensors(fsdp2_hf_adapter_t *a, const char *path)
{
    FSDP2_CHECK(st_open(path, &a->file));
    a->file_open = 1;
    size_t n = a->file.num_entries;
    a->tensors = fsdp2_calloc(n ? n : 1, sizeof(*a->tensors));
    a->entries = fsdp2_calloc(n ? n : 1, sizeof(*a->entries));
    if (a->tensors == NULL || a->entries == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: %zu tensors", path, n);
    for (size_t i = 0; i < n; i++) {
        const st_entry_t *e = &a->file.entries[i];
        hf_tensor_t *t = &a->tensors[a->num_tensors];
        if (canonical_of(e->name, t->name, sizeof(t->name)) == NULL)
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s' is not a LoRA weight "
                               "(base_model.model.<module>.lora_A.weight or .lora_B.weight)",
                               path, e->name);
        int is_a = strstr(t->name, ".lora_A.weight") != NULL;
        if (e->dtype != FSDP2_F32 && e->dtype != FSDP2_BF16 && e->dtype != FSDP2_F16)
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s' has dtype %s (F32, BF16 or "
                               "F16)", path, e->name, st_dtype_name(e->dtype));
        if (e->ndim != 2 || e->shape[is_a ? 0 : 1] != a->cfg.r)
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s' has %d dimensions [%" PRId64
                               ", %" PRId64 "]: a lora_%c weight of r %" PRId64 " is %s",
                               path, e->name, e->ndim, e->shape[0],
                               e->ndim > 1 ? e->shape[1] : 0, is_a ? 'A' : 'B', a->cfg.r,
                               is_a ? "[r, in]" : "[out, r]");
        t->ndim = 2;
        t->shape[0] = e->shape[0];
        t->shape[1] = e->shape[1];
        a->entries[a->num_tensors++] = e;
    }
    for (size_t i = 0; i < a->num_tensors; i++) {
        char other = strstr(a->tensors[i].name, ".lora_A.") ? 'B' : 'A';
        if (find_pair(a, a->tensors[i].name, other) == SIZE_MAX)
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: '%s' has no lora_%c beside it", path,
                               a->tensors[i].name, other);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_adapter_open(const char *dir, fsdp2_hf_adapter_t **adapter)
{
    FSDP2_ARG_CHECK(dir != NULL && adapter != NULL, "fsdp2_hf_adapter_open: dir=%p adapter=%p",
                    (const void *)dir, (void *)adapter);
    *adapter = NULL;
    fsdp2_hf_adapter_t *a = fsdp2_calloc(1, sizeof(*a));
    size_t len = strlen(dir) + 32;
    char *path = fsdp2_malloc(len), *text = NULL;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (a == NULL || path == NULL || (a->dir = strdup(dir)) == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "fsdp2_hf_adapter_open %s", dir);
        goto cleanup;
    }
    a->cfg = (fsdp2_hf_lora_config_t)FSDP2_HF_LORA_CONFIG_INIT;
    snprintf(path, len, "%s/adapter_config.json", dir);
    FSDP2_CHECK_GOTO(hf_read_text(path, &text, NULL), status, cleanup);
    FSDP2_CHECK_GOTO(parse_config(text, path, &a->cfg), status, cleanup);
    snprintf(path, len, "%s/adapter_model.safetensors", dir);
    FSDP2_CHECK_GOTO(open_tensors(a, path), status, cleanup);
    *adapter = a;
    a = NULL;
cleanup:
    free(text);
    free(path);
    fsdp2_hf_adapter_close(a);
    return status;
}

fsdp2_status_t fsdp2_hf_adapter_close(fsdp2_hf_adapter_t *a)
{
    if (a == NULL)
        return FSDP2_SUCCESS;
    if (a->file_open)
        st_close(&a->file);
    free(a->tensors);
    free(a->entries);
    free(a->dir);
    free(a);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_adapter_config(const fsdp2_hf_adapter_t *a, fsdp2_hf_lora_config_t *cfg)
{
    FSDP2_ARG_CHECK(a != NULL, "fsdp2_hf_adapter_config: adapter is NULL");
    FSDP2_CHECK(check_size(cfg, "fsdp2_hf_adapter_config"));
    *cfg = a->cfg;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_adapter_num_tensors(const fsdp2_hf_adapter_t *a, size_t *count)
{
    FSDP2_ARG_CHECK(a != NULL && count != NULL, "fsdp2_hf_adapter_num_tensors: NULL argument");
    *count = a->num_tensors;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_adapter_tensor(const fsdp2_hf_adapter_t *a, size_t i,
                                       fsdp2_hf_tensor_info_t *info)
{
    FSDP2_ARG_CHECK(a != NULL && info != NULL, "fsdp2_hf_adapter_tensor: NULL argument");
    FSDP2_ARG_CHECK(i < a->num_tensors, "fsdp2_hf_adapter_tensor: index %zu of %zu tensors", i,
                    a->num_tensors);
    *info = (fsdp2_hf_tensor_info_t){.name = a->tensors[i].name, .ndim = 2,
                                     .shape = {a->tensors[i].shape[0], a->tensors[i].shape[1]},
                                     .file_dtype = a->entries[i]->dtype};
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_adapter_read(fsdp2_hf_adapter_t *a, const char *name, int64_t row0,
                                     int64_t rows, fsdp2_dtype_t dst_dtype, void *dst)
{
    FSDP2_ARG_CHECK(a != NULL && name != NULL && (dst != NULL || rows == 0),
                    "fsdp2_hf_adapter_read: NULL argument");
    FSDP2_ARG_CHECK(dst_dtype == FSDP2_F32 || dst_dtype == FSDP2_BF16,
                    "fsdp2_hf_adapter_read %s: dst_dtype %s (f32 or bf16)", name,
                    fsdp2_dtype_name(dst_dtype));
    for (size_t i = 0; i < a->num_tensors; i++)
        if (strcmp(a->tensors[i].name, name) == 0)
            return hf_read_rows(&a->file, a->entries[i], &a->tensors[i], row0, rows, dst_dtype,
                                dst);
    return fsdp2_error(FSDP2_ERR_NOT_FOUND, "%s: no adapter tensor '%s'", a->dir, name);
}

/* ---- writing ---- */

static char *config_json(const fsdp2_hf_lora_config_t *c)
{
    cJSON *root = cJSON_CreateObject(), *targets = cJSON_CreateArray();
    if (root == NULL || targets == NULL) {
        cJSON_Delete(root);
        cJSON_Delete(targets);
        return NULL;
    }
    for (int i = 0; i < c->num_targets; i++)
        cJSON_AddItemToArray(targets, cJSON_CreateString(c->targets[i]));
    cJSON_AddStringToObject(root, "peft_type", "LORA");
    cJSON_AddStringToObject(root, "task_type", "CAUSAL_LM");
    if (c->base_model[0])
        cJSON_AddStringToObject(root, "base_model_name_or_path", c->base_model);
    else
        cJSON_AddNullToObject(root, "base_model_name_or_path");
    cJSON_AddNumberToObject(root, "r", (double)c->r);
    cJSON_AddNumberToObject(root, "lora_alpha", c->alpha);
    cJSON_AddNumberToObject(root, "lora_dropout", c->dropout);
    cJSON_AddItemToObject(root, "target_modules", targets);
    cJSON_AddStringToObject(root, "bias", "none");
    cJSON_AddBoolToObject(root, "fan_in_fan_out", c->fan_in_fan_out);
    cJSON_AddBoolToObject(root, "inference_mode", 1);
    cJSON_AddBoolToObject(root, "use_dora", 0);
    cJSON_AddBoolToObject(root, "use_rslora", 0);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

static fsdp2_status_t write_tensors(const char *path, fsdp2_hf_arch_t arch, size_t n,
                                    const char *const *names, const fsdp2_tensor_t *const *t)
{
    st_writer_t *w = NULL;
    char stored[HF_NAME_MAX + 32];
    FSDP2_CHECK(st_writer_create(path, &w));
    fsdp2_status_t status = FSDP2_SUCCESS;
    for (size_t i = 0; i < n; i++) {
        snprintf(stored, sizeof(stored), "%s%s%s", PEFT_PREFIX,
                 arch == FSDP2_HF_GPT2 ? "transformer." : "", names[i]);
        FSDP2_CHECK_GOTO(st_writer_add(w, stored, t[i]->dtype, t[i]->ndim, t[i]->shape), status,
                         fail);
    }
    FSDP2_CHECK_GOTO(st_writer_meta(w, "format", "pt"), status, fail);
    FSDP2_CHECK_GOTO(st_writer_begin(w, NULL), status, fail);
    for (size_t i = 0; i < n; i++)
        FSDP2_CHECK_GOTO(st_writer_write(w, t[i]->data, (size_t)t[i]->nbytes), status, fail);
    return st_writer_finish(w);
fail:
    st_writer_abort(w);
    return status;
}

fsdp2_status_t fsdp2_hf_adapter_write(const char *dir, const fsdp2_hf_lora_config_t *cfg,
                                      fsdp2_hf_arch_t arch, size_t n, const char *const *names,
                                      const fsdp2_tensor_t *const *tensors)
{
    FSDP2_ARG_CHECK(dir != NULL && (n == 0 || (names != NULL && tensors != NULL)),
                    "fsdp2_hf_adapter_write: NULL argument");
    FSDP2_CHECK(check_size(cfg, "fsdp2_hf_adapter_write"));
    FSDP2_ARG_CHECK(arch == FSDP2_HF_GPT2 || arch == FSDP2_HF_LLAMA,
                    "fsdp2_hf_adapter_write %s: arch %d (GPT-2 or Llama)", dir, (int)arch);
    FSDP2_ARG_CHECK(cfg->r > 0 && isfinite(cfg->alpha) && cfg->dropout >= 0 && cfg->dropout < 1 &&
                        cfg->num_targets > 0 && cfg->num_targets <= FSDP2_HF_LORA_MAX_TARGETS,
                    "fsdp2_hf_adapter_write %s: r %" PRId64 ", alpha %g, dropout %g, %d targets",
                    dir, cfg->r, cfg->alpha, cfg->dropout, cfg->num_targets);
    for (size_t i = 0; i < n; i++) {
        const fsdp2_tensor_t *t = tensors[i];
        char c[HF_NAME_MAX];
        char stored[HF_NAME_MAX + 32];
        snprintf(stored, sizeof(stored), PEFT_PREFIX "%s", names[i] ? names[i] : "");
        FSDP2_ARG_CHECK(names[i] != NULL && canonical_of(stored, c, sizeof(c)) != NULL,
                        "fsdp2_hf_adapter_write %s: '%s' is not a lora_A or lora_B weight", dir,
                        names[i] ? names[i] : "(NULL)");
        FSDP2_ARG_CHECK(t != NULL && t->device.type == FSDP2_DEVICE_CPU && t->ndim == 2 &&
                            (t->dtype == FSDP2_F32 || t->dtype == FSDP2_BF16) &&
                            t->shape[strstr(names[i], ".lora_A.") ? 0 : 1] == cfg->r,
                        "fsdp2_hf_adapter_write %s: '%s' must be a 2-D f32 or bf16 cpu tensor "
                        "carrying r %" PRId64, dir, names[i], cfg->r);
    }
    char *tmp = NULL, *text = config_json(cfg), *path = NULL;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (text == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: adapter_config.json", dir);
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(hf_tmp_create(dir, &tmp), status, cleanup);
    FSDP2_CHECK_GOTO(hf_tmp_file(tmp, "adapter_config.json", text, strlen(text)), status, cleanup);
    size_t len = strlen(tmp) + 32;
    if ((path = fsdp2_malloc(len)) == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", dir);
        goto cleanup;
    }
    snprintf(path, len, "%s/adapter_model.safetensors", tmp);
    FSDP2_CHECK_GOTO(write_tensors(path, arch, n, names, tensors), status, cleanup);
    FSDP2_CHECK_GOTO(hf_tmp_commit(tmp, dir), status, cleanup);
    free(tmp);
    tmp = NULL;
cleanup:
    hf_tmp_remove(tmp);
    free(path);
    free(text);
    return status;
}
