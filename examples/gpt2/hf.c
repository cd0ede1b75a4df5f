/* The example's parameters by their Hugging Face names (hf.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "hf.h"

#define HF_MAX_PARAMS (4 + 12 * GPT2_MAX_LAYERS)

typedef struct hf_param {
    char name[64]; /* canonical: GPT2LMHeadModel's without "transformer." */
    fsdp2_param_t *param;
} hf_param_t;

/* In the library's canonical order, which the writer takes them in. */
static int params(const gpt2_model_t *m, hf_param_t *p)
{
    int n = 0;
#define ADD(param_, ...)                                                  \
    do {                                                                  \
        snprintf(p[n].name, sizeof(p[n].name), __VA_ARGS__);              \
        p[n++].param = (param_);                                          \
    } while (0)
    ADD(m->wte, "wte.weight");
    ADD(m->wpe, "wpe.weight");
    for (int l = 0; l < m->cfg.layers; l++) {
        const gpt2_block_t *b = &m->blocks[l];
        ADD(b->ln1_w, "h.%d.ln_1.weight", l);
        ADD(b->ln1_b, "h.%d.ln_1.bias", l);
        ADD(b->attn_w, "h.%d.attn.c_attn.weight", l);
        ADD(b->attn_b, "h.%d.attn.c_attn.bias", l);
        ADD(b->proj_w, "h.%d.attn.c_proj.weight", l);
        ADD(b->proj_b, "h.%d.attn.c_proj.bias", l);
        ADD(b->ln2_w, "h.%d.ln_2.weight", l);
        ADD(b->ln2_b, "h.%d.ln_2.bias", l);
        ADD(b->fc_w, "h.%d.mlp.c_fc.weight", l);
        ADD(b->fc_b, "h.%d.mlp.c_fc.bias", l);
        ADD(b->fcproj_w, "h.%d.mlp.c_proj.weight", l);
        ADD(b->fcproj_b, "h.%d.mlp.c_proj.bias", l);
    }
    ADD(m->lnf_w, "ln_f.weight");
    ADD(m->lnf_b, "ln_f.bias");
#undef ADD
    return n;
}

int gpt2_hf_shape(fsdp2_hf_model_t *hf, gpt2_config_t *cfg, char *err, size_t size)
{
    fsdp2_hf_config_t c = FSDP2_HF_CONFIG_INIT;
    if (fsdp2_hf_model_config(hf, &c) != FSDP2_SUCCESS) {
        snprintf(err, size, "%s", fsdp2_last_error());
        return -1;
    }
    const char *why = NULL;
    if (c.arch != FSDP2_HF_GPT2)
        why = "model_type is not gpt2";
    else if (!c.tie_word_embeddings)
        why = "the head is not tied (tie_word_embeddings)";
    else if (c.intermediate_size != 4 * c.hidden_size)
        why = "n_inner is not 4 n_embd";
    else if (fabs(c.norm_eps - 1e-5) > 1e-12)
        why = "layer_norm_epsilon is not 1e-5";
    else if (c.num_layers > GPT2_MAX_LAYERS)
        why = "n_layer is above GPT2_MAX_LAYERS";
    else if (c.vocab_size < 256)
        why = "vocab_size is below the 256 bytes of the data";
    if (why != NULL) {
        snprintf(err, size, "this example trains GPT-2 as it builds it: %s", why);
        return -1;
    }
    *cfg = (gpt2_config_t){(int)c.num_layers, (int)c.num_heads, (int)c.hidden_size,
                           (int)c.max_positions, (int)c.vocab_size};
    return 0;
}

fsdp2_status_t gpt2_hf_import(gpt2_model_t *m, fsdp2_hf_model_t *hf)
{
    static hf_param_t p[HF_MAX_PARAMS];
    int n = params(m, p);
    for (int i = 0; i < n; i++) {
        /* this rank's rows [offset, offset + local rows) */
        fsdp2_dtensor_t *dt;
        fsdp2_dtensor_info_t info;
        fsdp2_tensor_t *local;
        fsdp2_status_t s = fsdp2_param_sharded(p[i].param, &dt);
        if (s == FSDP2_SUCCESS)
            s = fsdp2_dtensor_info(dt, &info);
        if (s == FSDP2_SUCCESS)
            s = fsdp2_dtensor_to_local(dt, &local);
        if (s != FSDP2_SUCCESS)
            return s;
        s = fsdp2_hf_model_read(hf, p[i].name, info.offset[0], info.local_shape[0], local->dtype,
                                local->data);
        fsdp2_tensor_release(local);
        if (s != FSDP2_SUCCESS)
            return s;
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t gpt2_hf_export(gpt2_model_t *m, int rank, const char *dir, fsdp2_dtype_t dtype,
                              int64_t bos, int64_t eos)
{
    static hf_param_t p[HF_MAX_PARAMS];
    int n = params(m, p);
    fsdp2_hf_writer_t *w = NULL;
    fsdp2_status_t status = FSDP2_SUCCESS;
    char why[1024] = ""; /* rank 0's first error: the gathers after it set messages of their own */
    if (rank == 0) {
        fsdp2_hf_config_t c = FSDP2_HF_CONFIG_INIT;
        c.arch = FSDP2_HF_GPT2;
        c.vocab_size = m->cfg.vocab;
        c.hidden_size = m->cfg.dim;
        c.num_layers = m->cfg.layers;
        c.num_heads = c.num_kv_heads = m->cfg.heads;
        c.head_dim = m->cfg.dim / m->cfg.heads;
        c.intermediate_size = 4 * (int64_t)m->cfg.dim;
        c.max_positions = m->cfg.seq;
        c.norm_eps = 1e-5;
        c.tie_word_embeddings = 1;
        c.bos_token_id = bos;
        c.eos_token_id = eos;
        snprintf(c.hidden_act, sizeof(c.hidden_act), "gelu_new");
        fsdp2_hf_export_options_t o = FSDP2_HF_EXPORT_OPTIONS_INIT;
        o.dtype = dtype;
        status = fsdp2_hf_writer_create(dir, &c, &o, &w);
        if (status != FSDP2_SUCCESS)
            snprintf(why, sizeof(why), "%s", fsdp2_last_error());
    }
    /* every rank takes part in each gather, whatever rank 0's writer did */
    for (int i = 0; i < n; i++) {
        fsdp2_dtensor_t *dt;
        fsdp2_tensor_t *full = NULL;
        fsdp2_status_t s = fsdp2_param_sharded(p[i].param, &dt);
        if (s == FSDP2_SUCCESS)
            s = fsdp2_dtensor_full_tensor(dt, NULL, &full);
        if (s != FSDP2_SUCCESS) {
            fsdp2_hf_writer_abort(w);
            return s;
        }
        if (w != NULL && status == FSDP2_SUCCESS) {
            status = fsdp2_hf_writer_write(w, p[i].name, full->dtype, full->data);
            if (status != FSDP2_SUCCESS)
                snprintf(why, sizeof(why), "%s", fsdp2_last_error());
        }
        fsdp2_tensor_release(full);
    }
    if (status == FSDP2_SUCCESS && w != NULL) {
        status = fsdp2_hf_writer_finish(w);
        if (status != FSDP2_SUCCESS)
            snprintf(why, sizeof(why), "%s", fsdp2_last_error());
        else
            printf("exported %s (%d tensors, config.json)\n", dir, n);
    } else {
        fsdp2_hf_writer_abort(w);
    }
    if (status != FSDP2_SUCCESS)
        fprintf(stderr, "error: --export %s: %s: %s\n", dir, fsdp2_strerror(status), why);
    return status;
}
