/* Safetensors (https://github.com/huggingface/safetensors: an 8-byte little-endian
 * header length, a JSON header of {name: {dtype, shape, data_offsets}}, then the data)
 * in Hugging Face's GPT-2 names and layouts. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hf.h"

#define HF_MAX_PARAMS (4 + 12 * GPT2_MAX_LAYERS + 2)

typedef struct hf_entry {
    char name[128];
    fsdp2_param_t *param;
    int transposed; /* a Conv1D weight: [in, out] in the file */
    int ndim;
    int64_t rows, cols; /* the model's [rows, cols] (cols 1 for a vector) */
} hf_entry_t;

static int entries(const gpt2_model_t *m, hf_entry_t *e)
{
    int n = 0;
#define ADD(nm, p, t)                                                                   \
    do {                                                                                \
        fsdp2_param_info_t info_;                                                       \
        fsdp2_param_info((p), &info_);                                                  \
        snprintf(e[n].name, sizeof(e[n].name), "transformer.%s", nm);                   \
        e[n].param = (p);                                                               \
        e[n].transposed = (t);                                                          \
        e[n].rows = info_.shape[0];                                                     \
        e[n].cols = info_.ndim > 1 ? info_.shape[1] : 1;                                \
        e[n].ndim = info_.ndim;                                                         \
        n++;                                                                            \
    } while (0)
    ADD("wte.weight", m->wte, 0);
    ADD("wpe.weight", m->wpe, 0);
    for (int l = 0; l < m->cfg.layers; l++) {
        const gpt2_block_t *b = &m->blocks[l];
        char nm[96];
        const struct {
            const char *name;
            fsdp2_param_t *p;
            int t;
        } parts[12] = {{"ln_1.weight", b->ln1_w, 0},       {"ln_1.bias", b->ln1_b, 0},
                       {"attn.c_attn.weight", b->attn_w, 1}, {"attn.c_attn.bias", b->attn_b, 0},
                       {"attn.c_proj.weight", b->proj_w, 1}, {"attn.c_proj.bias", b->proj_b, 0},
                       {"ln_2.weight", b->ln2_w, 0},       {"ln_2.bias", b->ln2_b, 0},
                       {"mlp.c_fc.weight", b->fc_w, 1},    {"mlp.c_fc.bias", b->fc_b, 0},
                       {"mlp.c_proj.weight", b->fcproj_w, 1}, {"mlp.c_proj.bias", b->fcproj_b, 0}};
        for (int k = 0; k < 12; k++) {
            snprintf(nm, sizeof(nm), "h.%d.%s", l, parts[k].name);
            ADD(nm, parts[k].p, parts[k].t);
        }
    }
    ADD("ln_f.weight", m->lnf_w, 0);
    ADD("ln_f.bias", m->lnf_b, 0);
#undef ADD
    return n;
}

static void shape_of(const hf_entry_t *e, int64_t shape[2], int *ndim)
{
    *ndim = e->ndim;
    shape[0] = e->transposed ? e->cols : e->rows;
    shape[1] = e->transposed ? e->rows : e->cols;
}

static fsdp2_status_t write_config(const gpt2_model_t *m, const char *path)
{
    char buf[4096], dir[4096];
    snprintf(buf, sizeof(buf), "%s", path);
    snprintf(dir, sizeof(dir), "%s/config.json", dirname(buf));
    FILE *f = fopen(dir, "w");
    if (!f) {
        fprintf(stderr, "error: cannot write %s: %s\n", dir, strerror(errno));
        return FSDP2_ERR_IO;
    }
    fprintf(f,
            "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
            "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n"
            "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n"
            "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
            "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
            "  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\"\n}\n",
            m->cfg.vocab, m->cfg.seq, m->cfg.seq, m->cfg.dim, m->cfg.layers, m->cfg.heads);
    return fclose(f) ? FSDP2_ERR_IO : FSDP2_SUCCESS;
}

fsdp2_status_t gpt2_hf_export(gpt2_model_t *m, fsdp2_group_t *world, int rank, const char *path)
{
    (void)world;
    static hf_entry_t e[HF_MAX_PARAMS];
    int n = entries(m, e);
    /* the header: offsets from the shapes alone */
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        int64_t shape[2];
        int ndim;
        shape_of(&e[i], shape, &ndim);
        cJSON *t = cJSON_AddObjectToObject(h, e[i].name);
        cJSON_AddStringToObject(t, "dtype", "F32");
        cJSON *s = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < ndim; d++)
            cJSON_AddItemToArray(s, cJSON_CreateNumber((double)shape[d]));
        uint64_t bytes = (uint64_t)e[i].rows * e[i].cols * 4;
        cJSON *o = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(at + bytes)));
        at += bytes;
    }
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!text)
        return FSDP2_ERR_OUT_OF_MEMORY;
    size_t hlen = strlen(text), padded = (hlen + 7) / 8 * 8;
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = NULL;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (!rank) {
        f = fopen(tmp, "wb");
        if (!f) {
            fprintf(stderr, "error: cannot write %s: %s\n", tmp, strerror(errno));
            status = FSDP2_ERR_IO;
        } else {
            uint8_t le[8];
            for (int k = 0; k < 8; k++)
                le[k] = (uint8_t)((uint64_t)padded >> (8 * k));
            fwrite(le, 1, 8, f);
            fwrite(text, 1, hlen, f);
            for (size_t k = hlen; k < padded; k++)
                fputc(' ', f);
        }
    }
    free(text);
    /* every rank takes part in each gather, whatever rank 0's file did */
    for (int i = 0; i < n; i++) {
        fsdp2_dtensor_t *dt;
        fsdp2_tensor_t *full = NULL;
        fsdp2_status_t s = fsdp2_param_sharded(e[i].param, &dt);
        if (s == FSDP2_SUCCESS)
            s = fsdp2_dtensor_full_tensor(dt, NULL, &full);
        if (s != FSDP2_SUCCESS) {
            if (f) { /* no partial file */
                fclose(f);
                unlink(tmp);
            }
            return s;
        }
        if (f && status == FSDP2_SUCCESS) {
            const float *v = full->data;
            if (!e[i].transposed) {
                fwrite(v, 4, (size_t)full->numel, f);
            } else {
                for (int64_t c = 0; c < e[i].cols; c++)
                    for (int64_t r = 0; r < e[i].rows; r++)
                        fwrite(v + r * e[i].cols + c, 4, 1, f);
            }
        }
        fsdp2_tensor_release(full);
    }
    if (!f)
        return status;
    if (ferror(f) | fclose(f) || status != FSDP2_SUCCESS || rename(tmp, path)) {
        fprintf(stderr, "error: writing %s failed: %s\n", path, strerror(errno));
        unlink(tmp);
        return FSDP2_ERR_IO;
    }
    status = write_config(m, path);
    if (status == FSDP2_SUCCESS)
        printf("exported %s (%d tensors, %.1f MiB) and config.json\n", path, n, at / 1048576.0);
    return status;
}

static fsdp2_status_t fail(const char *path, const char *what, const char *name)
{
    fprintf(stderr, "error: %s: %s%s%s\n", path, what, name ? " " : "", name ? name : "");
    return FSDP2_ERR_CORRUPT;
}

fsdp2_status_t gpt2_hf_import(gpt2_model_t *m, const char *path)
{
    static hf_entry_t e[HF_MAX_PARAMS];
    int n = entries(m, e);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        fprintf(stderr, "error: cannot read %s: %s\n", path, strerror(errno));
        return FSDP2_ERR_IO;
    }
    uint8_t le[8];
    uint64_t hlen = 0;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (pread(fd, le, 8, 0) != 8) {
        close(fd);
        return fail(path, "shorter than a safetensors header", NULL);
    }
    for (int k = 0; k < 8; k++)
        hlen |= (uint64_t)le[k] << (8 * k);
    char *text = hlen < (1u << 28) ? malloc(hlen + 1) : NULL;
    if (!text || pread(fd, text, hlen, 8) != (ssize_t)hlen) {
        free(text);
        close(fd);
        return fail(path, "bad header length", NULL);
    }
    text[hlen] = 0;
    cJSON *h = cJSON_Parse(text);
    free(text);
    if (!h) {
        close(fd);
        return fail(path, "header is not JSON", NULL);
    }
    for (int i = 0; i < n && status == FSDP2_SUCCESS; i++) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(h, e[i].name);
        cJSON *dtype = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        int64_t want[2];
        int ndim;
        shape_of(&e[i], want, &ndim);
        if (!t || !cJSON_IsString(dtype) || strcmp(dtype->valuestring, "F32") ||
            cJSON_GetArraySize(shape) != ndim || cJSON_GetArraySize(off) != 2) {
            status = fail(path, "missing, not F32 or malformed:", e[i].name);
            break;
        }
        for (int d = 0; d < ndim; d++)
            if ((int64_t)cJSON_GetArrayItem(shape, d)->valuedouble != want[d])
                status = fail(path, "shape differs from the model's for", e[i].name);
        uint64_t begin = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble + 8 + hlen;
        uint64_t end = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble + 8 + hlen;
        if (status != FSDP2_SUCCESS || end - begin != (uint64_t)e[i].rows * e[i].cols * 4) {
            status = fail(path, "data size differs from the shape for", e[i].name);
            break;
        }
        /* this rank's rows [r0, r0 + count) of the model's [rows, cols] */
        fsdp2_dtensor_t *dt;
        fsdp2_dtensor_info_t info;
        fsdp2_tensor_t *local;
        status = fsdp2_param_sharded(e[i].param, &dt);
        if (status == FSDP2_SUCCESS)
            status = fsdp2_dtensor_info(dt, &info);
        if (status != FSDP2_SUCCESS || (status = fsdp2_dtensor_to_local(dt, &local)))
            break;
        int64_t r0 = info.offset[0], count = info.local_shape[0], cols = e[i].cols;
        float *dst = local->data;
        ssize_t want_bytes, got = 0;
        if (!e[i].transposed) {
            want_bytes = (ssize_t)(count * cols * 4);
            got = count ? pread(fd, dst, (size_t)want_bytes, (off_t)(begin + (uint64_t)(r0 * cols * 4))) : 0;
        } else { /* file [cols=in][rows=out]: our rows are a slice of each file row */
            want_bytes = (ssize_t)(count * cols * 4);
            float *row = malloc(sizeof(float) * (size_t)(count > 0 ? count : 1));
            if (!row) {
                fsdp2_tensor_release(local);
                status = FSDP2_ERR_OUT_OF_MEMORY;
                fprintf(stderr, "error: out of memory reading %s\n", e[i].name);
                break;
            }
            for (int64_t c = 0; c < cols && count; c++) {
                ssize_t k = pread(fd, row, (size_t)count * 4,
                                  (off_t)(begin + (uint64_t)((c * e[i].rows + r0) * 4)));
                got += k > 0 ? k : 0;
                for (int64_t r = 0; r < count; r++)
                    dst[r * cols + c] = row[r];
            }
            free(row);
        }
        fsdp2_tensor_release(local);
        if (got != want_bytes)
            status = fail(path, "truncated data for", e[i].name);
    }
    cJSON_Delete(h);
    close(fd);
    return status;
}
