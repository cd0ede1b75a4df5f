/* The model's parameters by their Hugging Face names (hf.h). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "hf.h"

/* Whether a parameter is a LoRA adapter's (lora_A, lora_B) rather than the base's. */
int lm_is_adapter(const char *fqn)
{
    return strstr(fqn, ".lora_A.") != NULL || strstr(fqn, ".lora_B.") != NULL;
}

/* The model's parameters in its order, which is the library's canonical one: the base's
 * (adapters == 0) or the adapters' (adapters == 1). */
static fsdp2_status_t params_of(const lm_model_t *m, int adapters, fsdp2_param_t ***out,
                                size_t *count)
{
    size_t all = 0;
    *out = NULL;
    *count = 0;
    fsdp2_status_t s = fsdp2_module_params(m->root, NULL, 0, &all);
    if (s != FSDP2_SUCCESS)
        return s;
    *out = calloc(all ? all : 1, sizeof(**out));
    if (!*out)
        return FSDP2_ERR_OUT_OF_MEMORY;
    s = fsdp2_module_params(m->root, *out, all, &all);
    *count = 0;
    for (size_t i = 0; i < all && s == FSDP2_SUCCESS; i++) {
        fsdp2_param_info_t info;
        s = fsdp2_param_info((*out)[i], &info);
        if (s == FSDP2_SUCCESS && lm_is_adapter(info.fqn) == adapters)
            (*out)[(*count)++] = (*out)[i];
    }
    return s;
}

/* This rank's shard of p: its rows [info->offset[0], + info->local_shape[0]) of the whole,
 * and the local tensor holding them (*local is the caller's to release). */
static fsdp2_status_t local_rows(fsdp2_param_t *p, fsdp2_dtensor_info_t *info,
                                 fsdp2_tensor_t **local)
{
    fsdp2_dtensor_t *dt;
    fsdp2_status_t s = fsdp2_param_sharded(p, &dt);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_dtensor_info(dt, info);
    return s == FSDP2_SUCCESS ? fsdp2_dtensor_to_local(dt, local) : s;
}

int lm_hf_shape(fsdp2_hf_model_t *hf, lm_config_t *cfg, int64_t *bos, int64_t *eos, char *err,
                size_t size)
{
    fsdp2_hf_config_t c = FSDP2_HF_CONFIG_INIT;
    if (fsdp2_hf_model_config(hf, &c) != FSDP2_SUCCESS) {
        snprintf(err, size, "%s", fsdp2_last_error());
        return -1;
    }
    int llama = c.arch == FSDP2_HF_LLAMA;
    const int64_t sizes[] = {c.vocab_size, c.hidden_size, c.intermediate_size, c.max_positions};
    const char *why = c.num_layers > LM_MAX_LAYERS        ? "more layers than LM_MAX_LAYERS"
                      : llama && c.head_dim % 2           ? "an odd head_dim (rotary embeddings)"
                      : !(c.norm_eps >= 0 && c.norm_eps < 1) ? "a norm epsilon outside [0, 1)"
                                                             : NULL;
    for (int i = 0; i < 4 && !why; i++)
        if (sizes[i] > INT_MAX / 4)
            why = "a size past the example's int sizes";
    if (why) {
        snprintf(err, size, "this example cannot build the model: %s", why);
        return -1;
    }
    *cfg = (lm_config_t){.arch = llama ? LM_LLAMA : LM_GPT2, .layers = (int)c.num_layers,
                         .heads = (int)c.num_heads, .kv_heads = (int)c.num_kv_heads,
                         .dim = (int)c.hidden_size, .hidden = (int)c.intermediate_size,
                         .seq = (int)(c.max_positions < LM_DEFAULT_SEQ ? c.max_positions
                                                                        : LM_DEFAULT_SEQ),
                         .positions = (int)c.max_positions,
                         .vocab = (int)c.vocab_size, .tied = c.tie_word_embeddings != 0,
                         .norm_eps = c.norm_eps, .rope = FSDP2_NN_ROPE_CONFIG_INIT};
    cfg->rope.theta = c.rope_theta;
    if (c.rope_scaling == FSDP2_HF_ROPE_LLAMA3) {
        cfg->rope.scaling = FSDP2_NN_ROPE_LLAMA3;
        cfg->rope.factor = c.rope_factor;
        cfg->rope.low_freq_factor = c.rope_low_freq_factor;
        cfg->rope.high_freq_factor = c.rope_high_freq_factor;
        cfg->rope.original_max_positions = c.rope_original_max_positions;
    }
    *bos = c.bos_token_id;
    *eos = c.eos_token_id;
    return 0;
}

fsdp2_status_t lm_hf_import(lm_model_t *m, fsdp2_hf_model_t *hf)
{
    fsdp2_param_t **p;
    size_t n;
    fsdp2_status_t s = params_of(m, 0, &p, &n);
    for (size_t i = 0; i < n && s == FSDP2_SUCCESS; i++) {
        fsdp2_param_info_t pi;
        fsdp2_dtensor_info_t info;
        fsdp2_tensor_t *local;
        s = fsdp2_param_info(p[i], &pi);
        if (s == FSDP2_SUCCESS)
            s = local_rows(p[i], &info, &local);
        if (s != FSDP2_SUCCESS)
            break;
        s = fsdp2_hf_model_read(hf, pi.fqn, info.offset[0], info.local_shape[0], local->dtype,
                                local->data);
        fsdp2_tensor_release(local);
    }
    free(p);
    return s;
}

/* config.json's fields for the model. */
static fsdp2_hf_config_t config_of(const lm_config_t *m, int64_t bos, int64_t eos)
{
    fsdp2_hf_config_t c = FSDP2_HF_CONFIG_INIT;
    int llama = m->arch == LM_LLAMA;
    c.arch = llama ? FSDP2_HF_LLAMA : FSDP2_HF_GPT2;
    c.vocab_size = m->vocab;
    c.hidden_size = m->dim;
    c.num_layers = m->layers;
    c.num_heads = m->heads;
    c.num_kv_heads = m->kv_heads;
    c.head_dim = m->dim / m->heads;
    c.intermediate_size = m->hidden;
    c.max_positions = m->positions;
    c.norm_eps = m->norm_eps;
    c.tie_word_embeddings = m->tied;
    c.bos_token_id = bos;
    c.eos_token_id = eos;
    snprintf(c.hidden_act, sizeof(c.hidden_act), "%s", llama ? "silu" : "gelu_new");
    if (llama) {
        c.rope_theta = m->rope.theta;
        if (m->rope.scaling == FSDP2_NN_ROPE_LLAMA3) {
            c.rope_scaling = FSDP2_HF_ROPE_LLAMA3;
            c.rope_factor = m->rope.factor;
            c.rope_low_freq_factor = m->rope.low_freq_factor;
            c.rope_high_freq_factor = m->rope.high_freq_factor;
            c.rope_original_max_positions = m->rope.original_max_positions;
        }
    }
    return c;
}

/* The file at path beside the weights, as name; why gets the reason of a failure. */
static fsdp2_status_t add_file(fsdp2_hf_writer_t *w, const char *name, const char *path,
                               char *why, size_t size)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, size, "cannot read %s", path);
        return FSDP2_ERR_IO;
    }
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap);
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        fsdp2_status_t s = buf ? FSDP2_ERR_IO : FSDP2_ERR_OUT_OF_MEMORY;
        snprintf(why, size, "%s reading %s", buf ? "an I/O error" : "out of memory", path);
        free(buf);
        return s;
    }
    fsdp2_status_t s = fsdp2_hf_writer_add_file(w, name, buf, n);
    if (s != FSDP2_SUCCESS)
        snprintf(why, size, "%s", fsdp2_last_error());
    free(buf);
    return s;
}

/* Parameter p gathered whole (every rank takes part); *full is the caller's. */
static fsdp2_status_t gather(fsdp2_param_t *p, fsdp2_param_info_t *info, fsdp2_tensor_t **full)
{
    fsdp2_dtensor_t *dt;
    *full = NULL;
    fsdp2_status_t s = fsdp2_param_info(p, info);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_param_sharded(p, &dt);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_dtensor_full_tensor(dt, NULL, full);
    return s;
}

/* The adapter of the base weight `weight_fqn` ("<path>.weight"), gathered whole: merged
 * into full (W += alpha / r B A) when the model has one there. Collective. */
static fsdp2_status_t merge_adapter(lm_model_t *m, const char *weight_fqn, fsdp2_tensor_t *full)
{
    char name[FSDP2_FQN_MAX + 16];
    size_t len = strlen(weight_fqn) - strlen(".weight");
    fsdp2_param_t *pa, *pb;
    snprintf(name, sizeof(name), "%.*s.lora_A.weight", (int)len, weight_fqn);
    if (fsdp2_module_find_param(m->root, name, &pa) != FSDP2_SUCCESS)
        return FSDP2_SUCCESS; /* no adapter here */
    snprintf(name, sizeof(name), "%.*s.lora_B.weight", (int)len, weight_fqn);
    fsdp2_status_t s = fsdp2_module_find_param(m->root, name, &pb);
    fsdp2_param_info_t ia, ib;
    fsdp2_tensor_t *a = NULL, *b = NULL;
    if (s == FSDP2_SUCCESS)
        s = gather(pa, &ia, &a);
    if (s == FSDP2_SUCCESS)
        s = gather(pb, &ib, &b);
    if (s == FSDP2_SUCCESS) { /* full [out, in] += scale b [out, r] a [r, in] */
        int out = (int)b->shape[0], r = (int)a->shape[0], in = (int)a->shape[1];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, out, in, r,
                    (float)(m->cfg.lora.alpha / m->cfg.lora.r), b->data, r, a->data, in, 1.0f,
                    full->data, in);
    }
    fsdp2_tensor_release(a);
    fsdp2_tensor_release(b);
    return s;
}

/* Every rank learns whether rank 0's writing failed, so that all go on or stop alike. */
static fsdp2_status_t agree(fsdp2_group_t *world, fsdp2_status_t mine)
{
    double failed = mine != FSDP2_SUCCESS;
    fsdp2_stream_t *current;
    fsdp2_status_t s = fsdp2_stream_current((fsdp2_device_t)FSDP2_DEVICE_CPU_INIT, &current);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_all_reduce_async(world, &failed, 1, FSDP2_F64, NULL, current);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(current);
    if (s != FSDP2_SUCCESS)
        return s;
    return mine != FSDP2_SUCCESS ? mine : failed > 0 ? FSDP2_ERR_PEER_FAILED : FSDP2_SUCCESS;
}

fsdp2_status_t lm_hf_export(lm_model_t *m, fsdp2_group_t *world, int rank, const char *dir,
                            const lm_hf_file_t *files, int num_files, fsdp2_dtype_t dtype,
                            int merged, int64_t bos, int64_t eos)
{
    fsdp2_param_t **p;
    size_t n;
    fsdp2_status_t status = params_of(m, 0, &p, &n);
    if (status != FSDP2_SUCCESS)
        return status;
    fsdp2_hf_writer_t *w = NULL;
    char why[1024] = ""; /* rank 0's first error: the gathers after it set messages of their own */
    if (rank == 0) {
        fsdp2_hf_config_t c = config_of(&m->cfg, bos, eos);
        fsdp2_hf_export_options_t o = FSDP2_HF_EXPORT_OPTIONS_INIT;
        o.dtype = dtype;
        status = fsdp2_hf_writer_create(dir, &c, &o, &w);
        if (status != FSDP2_SUCCESS)
            snprintf(why, sizeof(why), "%s", fsdp2_last_error());
        for (int i = 0; i < num_files && status == FSDP2_SUCCESS; i++)
            status = add_file(w, files[i].name, files[i].path, why, sizeof(why));
    }
    /* every rank takes part in each gather, whatever rank 0's writer did */
    for (size_t i = 0; i < n; i++) {
        fsdp2_param_info_t pi;
        fsdp2_tensor_t *full = NULL;
        fsdp2_status_t s = gather(p[i], &pi, &full);
        if (s == FSDP2_SUCCESS && merged)
            s = merge_adapter(m, pi.fqn, full);
        if (s != FSDP2_SUCCESS) {
            fprintf(stderr, "error: --export %s: gathering %s: %s\n", dir, pi.fqn,
                    fsdp2_last_error());
            fsdp2_hf_writer_abort(w);
            fsdp2_tensor_release(full);
            free(p);
            return s;
        }
        if (w != NULL && status == FSDP2_SUCCESS) {
            status = fsdp2_hf_writer_write(w, pi.fqn, full->dtype, full->data);
            if (status != FSDP2_SUCCESS)
                snprintf(why, sizeof(why), "%s", fsdp2_last_error());
        }
        fsdp2_tensor_release(full);
    }
    free(p);
    if (status == FSDP2_SUCCESS && w != NULL) {
        status = fsdp2_hf_writer_finish(w);
        if (status != FSDP2_SUCCESS)
            snprintf(why, sizeof(why), "%s", fsdp2_last_error());
        else
            printf("exported %s (%zu tensors, config.json)\n", dir, n);
    } else {
        fsdp2_hf_writer_abort(w);
    }
    if (status != FSDP2_SUCCESS)
        fprintf(stderr, "error: --export %s: %s: %s\n", dir, fsdp2_strerror(status), why);
    fsdp2_status_t all = agree(world, status);
    if (all != FSDP2_SUCCESS && status == FSDP2_SUCCESS)
        fprintf(stderr, "error: --export %s: rank 0 could not write it (its error above)\n",
                dir);
    return all;
}

fsdp2_status_t lm_hf_import_adapter(lm_model_t *m, fsdp2_hf_adapter_t *ad, const char *dir)
{
    fsdp2_param_t **p;
    size_t n, count;
    fsdp2_status_t s = params_of(m, 1, &p, &n);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_hf_adapter_num_tensors(ad, &count);
    if (s == FSDP2_SUCCESS && count != n) { /* each of ours is matched below, by name */
        fprintf(stderr, "error: --adapter %s holds %zu tensors; the model's targets give %zu "
                        "(a different base or target_modules)\n", dir, count, n);
        s = FSDP2_ERR_SHAPE_MISMATCH;
    }
    for (size_t i = 0; i < n && s == FSDP2_SUCCESS; i++) {
        fsdp2_param_info_t pi;
        fsdp2_hf_tensor_info_t t = {0};
        fsdp2_dtensor_info_t info;
        fsdp2_tensor_t *local;
        s = fsdp2_param_info(p[i], &pi);
        for (size_t k = 0; k < count && s == FSDP2_SUCCESS && !t.name; k++) {
            s = fsdp2_hf_adapter_tensor(ad, k, &t);
            t.name = s == FSDP2_SUCCESS && !strcmp(t.name, pi.fqn) ? t.name : NULL;
        }
        if (s == FSDP2_SUCCESS && (!t.name || t.shape[0] != pi.shape[0] ||
                                   t.shape[1] != pi.shape[1])) {
            fprintf(stderr, "error: --adapter %s: %s %s [%lld, %lld] where the model's is "
                            "[%lld, %lld]\n", dir, pi.fqn, t.name ? "is" : "is missing; want",
                    (long long)(t.name ? t.shape[0] : pi.shape[0]),
                    (long long)(t.name ? t.shape[1] : pi.shape[1]), (long long)pi.shape[0],
                    (long long)pi.shape[1]);
            s = FSDP2_ERR_SHAPE_MISMATCH;
        }
        if (s == FSDP2_SUCCESS)
            s = local_rows(p[i], &info, &local);
        if (s != FSDP2_SUCCESS)
            break;
        s = fsdp2_hf_adapter_read(ad, pi.fqn, info.offset[0], info.local_shape[0], local->dtype,
                                  local->data);
        fsdp2_tensor_release(local);
    }
    free(p);
    return s;
}

fsdp2_status_t lm_hf_save_adapter(lm_model_t *m, fsdp2_group_t *world, int rank, const char *dir,
                                  const char *base)
{
    fsdp2_param_t **p;
    size_t n;
    fsdp2_status_t s = params_of(m, 1, &p, &n);
    const char **names = calloc(n ? n : 1, sizeof(*names));
    fsdp2_param_info_t *infos = calloc(n ? n : 1, sizeof(*infos));
    fsdp2_tensor_t **full = calloc(n ? n : 1, sizeof(*full));
    if (s == FSDP2_SUCCESS && (!names || !infos || !full))
        s = FSDP2_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n && s == FSDP2_SUCCESS; i++) { /* collective: every rank */
        s = gather(p[i], &infos[i], &full[i]);
        names[i] = infos[i].fqn;
    }
    fsdp2_status_t mine = s;
    if (s == FSDP2_SUCCESS && rank == 0) {
        const lm_lora_t *l = &m->cfg.lora;
        fsdp2_hf_lora_config_t c = FSDP2_HF_LORA_CONFIG_INIT;
        c.r = l->r;
        c.alpha = l->alpha;
        c.dropout = l->dropout;
        c.num_targets = l->num_targets;
        for (int i = 0; i < l->num_targets; i++)
            snprintf(c.targets[i], sizeof(c.targets[0]), "%s", l->targets[i]);
        c.fan_in_fan_out = m->cfg.arch == LM_GPT2; /* Conv1D */
        snprintf(c.base_model, sizeof(c.base_model), "%s", base ? base : "");
        mine = fsdp2_hf_adapter_write(dir, &c, m->cfg.arch == LM_LLAMA ? FSDP2_HF_LLAMA
                                                                       : FSDP2_HF_GPT2,
                                      n, names, (const fsdp2_tensor_t *const *)full);
        if (mine != FSDP2_SUCCESS)
            fprintf(stderr, "error: --save-adapter %s: %s\n", dir, fsdp2_last_error());
        else
            printf("saved the adapters to %s (%zu tensors, adapter_config.json)\n", dir, n);
    }
    for (size_t i = 0; i < n && full; i++)
        fsdp2_tensor_release(full[i]);
    free(full), free(infos), free(names), free(p);
    return s != FSDP2_SUCCESS ? s : agree(world, mine);
}
