/* Opening and reading Hugging Face model directories (include/fsdp2/hf_model.h).
 *
 * Open checks everything before any data is read: each safetensors header with the
 * library's strict reader (safetensors.c), the index against the files, and every
 * stored tensor against the list the config implies. A read then only converts: each
 * tensor's place (file, entry) was found at open. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "checkpoint/hf_internal.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fault.h"

/* Elements converted per step of a read: bounds the staging buffers. */
#define HF_READ_CHUNK ((size_t)1 << 16)

typedef struct hf_place {
    const st_file_t *file;
    const st_entry_t *entry;
} hf_place_t;

struct fsdp2_hf_model {
    char *dir;
    fsdp2_hf_config_t cfg;
    hf_tensor_t *tensors;
    hf_place_t *places;
    size_t num_tensors;
    st_file_t *files;
    char **file_names; /* as the index names them (or "model.safetensors") */
    size_t num_files;
};

static char *join(const char *dir, const char *name)
{
    size_t len = strlen(dir) + strlen(name) + 2;
    char *path = fsdp2_malloc(len);
    if (path != NULL)
        snprintf(path, len, "%s/%s", dir, name);
    return path;
}

static void shape_text(int ndim, const int64_t *shape, char *out, size_t size)
{
    if (ndim == 1)
        snprintf(out, size, "[%" PRId64 "]", shape[0]);
    else if (ndim == 2)
        snprintf(out, size, "[%" PRId64 ", %" PRId64 "]", shape[0], shape[1]);
    else
        snprintf(out, size, "(%d dimensions)", ndim);
}

/* ---------------------------------------------------------------------------------- */
/* Files and the index                                                                 */

static fsdp2_status_t add_file(fsdp2_hf_model_t *m, const char *name)
{
    for (size_t i = 0; i < m->num_files; i++)
        if (strcmp(m->file_names[i], name) == 0)
            return FSDP2_SUCCESS;
    /* A shard is a file in dir: no path may lead elsewhere. */
    if (name[0] == '\0' || strchr(name, '/') != NULL || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s/model.safetensors.index.json: file name '%.200s' is not a file "
                           "in the directory",
                           m->dir, name);
    char *path = join(m->dir, name);
    char *copy = strdup(name);
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (path == NULL || copy == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s/%s", m->dir, name);
        goto cleanup;
    }
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT) {
        status = fsdp2_error(FSDP2_ERR_NOT_FOUND, "%s: no file '%s'%s", m->dir, name,
                             strcmp(name, "model.safetensors") == 0
                                 ? " (nor model.safetensors.index.json)"
                                 : ", which model.safetensors.index.json names");
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(st_open(path, &m->files[m->num_files]), status, cleanup);
    m->file_names[m->num_files++] = copy;
    copy = NULL;
cleanup:
    free(copy);
    free(path);
    return status;
}

/* The file the index maps name to, or NULL when map is NULL (one file: itself). */
static fsdp2_status_t check_in_index(const fsdp2_hf_model_t *m, const cJSON *map, size_t file,
                                     const char *name)
{
    if (map == NULL)
        return FSDP2_SUCCESS;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(map, name);
    if (v == NULL)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s: tensor '%s' is not in model.safetensors.index.json's weight_map",
                           m->files[file].path, name);
    if (strcmp(v->valuestring, m->file_names[file]) != 0)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s: holds tensor '%s', which model.safetensors.index.json puts in '%s'",
                           m->files[file].path, name, v->valuestring);
    return FSDP2_SUCCESS;
}

/* Opens every file the index names and checks that each tensor it maps is in its file. */
static fsdp2_status_t open_index(fsdp2_hf_model_t *m, const char *text, cJSON **map_out)
{
    char what[64];
    snprintf(what, sizeof(what), "model.safetensors.index.json");
    cJSON *root = cJSON_Parse(text);
    if (root == NULL)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s/%s: not valid JSON", m->dir, what);
    fsdp2_status_t status = FSDP2_SUCCESS;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map) || map->child == NULL) {
        status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s/%s: no weight_map object, or an empty one",
                             m->dir, what);
        goto cleanup;
    }
    size_t count = (size_t)cJSON_GetArraySize(map);
    m->files = fsdp2_calloc(count, sizeof(*m->files));
    m->file_names = fsdp2_calloc(count, sizeof(*m->file_names));
    if (m->files == NULL || m->file_names == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s/%s: %zu entries", m->dir, what, count);
        goto cleanup;
    }
    for (const cJSON *e = map->child; e != NULL; e = e->next) {
        if (!cJSON_IsString(e)) {
            status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s/%s: weight_map '%s' is not a file name",
                                 m->dir, what, e->string);
            goto cleanup;
        }
        FSDP2_CHECK_GOTO(add_file(m, e->valuestring), status, cleanup);
    }
    for (const cJSON *e = map->child; e != NULL; e = e->next) {
        size_t f = 0;
        while (strcmp(m->file_names[f], e->valuestring) != 0)
            f++;
        if (st_find(&m->files[f], e->string) == NULL) {
            status = fsdp2_error(FSDP2_ERR_CORRUPT,
                                 "%s/%s: puts tensor '%s' in '%s', which does not hold it", m->dir,
                                 what, e->string, e->valuestring);
            goto cleanup;
        }
    }
    *map_out = root;
    return FSDP2_SUCCESS;
cleanup:
    cJSON_Delete(root);
    return status;
}

/* ---------------------------------------------------------------------------------- */
/* Matching the stored tensors to the architecture's                                  */

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Buffers saved beside the parameters by some versions of transformers. */
static int is_buffer(fsdp2_hf_arch_t arch, const char *canonical)
{
    if (arch == FSDP2_HF_GPT2)
        return strncmp(canonical, "h.", 2) == 0 &&
               (ends_with(canonical, ".attn.bias") || ends_with(canonical, ".attn.masked_bias"));
    return ends_with(canonical, ".rotary_emb.inv_freq");
}

static size_t find_tensor(const fsdp2_hf_model_t *m, const char *canonical)
{
    for (size_t i = 0; i < m->num_tensors; i++)
        if (strcmp(m->tensors[i].name, canonical) == 0)
            return i;
    return SIZE_MAX;
}

static fsdp2_status_t check_shape(const fsdp2_hf_model_t *m, const st_file_t *f,
                                  const st_entry_t *e, const hf_tensor_t *t)
{
    int64_t want[2] = {t->transposed ? t->shape[1] : t->shape[0],
                       t->transposed ? t->shape[0] : t->shape[1]};
    int same =
        e->ndim == t->ndim && e->shape[0] == want[0] && (t->ndim == 1 || e->shape[1] == want[1]);
    if (!same) {
        char have_text[64], want_text[64];
        shape_text(e->ndim, e->shape, have_text, sizeof(have_text));
        shape_text(t->ndim, want, want_text, sizeof(want_text));
        return fsdp2_error(FSDP2_ERR_SHAPE_MISMATCH,
                           "%s: tensor '%s' has shape %s; %s/config.json gives %s (%s%s)", f->path,
                           e->name, have_text, m->dir, want_text, t->field,
                           t->transposed ? ", Conv1D [in, out]" : "");
    }
    if (e->dtype != FSDP2_F32 && e->dtype != FSDP2_BF16 && e->dtype != FSDP2_F16)
        return fsdp2_error(FSDP2_ERR_DTYPE_MISMATCH,
                           "%s: tensor '%s' has dtype %s (F32, BF16 or F16 expected)", f->path,
                           e->name, st_dtype_name(e->dtype));
    return FSDP2_SUCCESS;
}

static fsdp2_status_t match_entry(fsdp2_hf_model_t *m, const cJSON *map, size_t file,
                                  const st_entry_t *e)
{
    const st_file_t *f = &m->files[file];
    FSDP2_CHECK(check_in_index(m, map, file, e->name));
    const char *canonical = e->name;
    if (m->cfg.arch == FSDP2_HF_GPT2 && strncmp(canonical, "transformer.", 12) == 0)
        canonical += 12;
    if (is_buffer(m->cfg.arch, canonical))
        return FSDP2_SUCCESS;
    if (m->cfg.tie_word_embeddings && strcmp(canonical, "lm_head.weight") == 0) {
        /* A copy of the tied embedding: its shape must fit, its values are the
         * embedding's (transformers ties them on loading). */
        hf_tensor_t head = m->tensors[0];
        head.field = m->cfg.arch == FSDP2_HF_GPT2 ? "vocab_size x n_embd, tied"
                                                  : "vocab_size x hidden_size, tied";
        return check_shape(m, f, e, &head);
    }
    size_t i = find_tensor(m, canonical);
    if (i == SIZE_MAX)
        return fsdp2_error(
            FSDP2_ERR_CORRUPT, "%s: unexpected tensor '%s': %s (%s) has no such tensor", f->path,
            e->name, m->cfg.arch == FSDP2_HF_GPT2 ? "GPT2LMHeadModel" : "LlamaForCausalLM", m->dir);
    if (m->places[i].entry != NULL)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s' is stored twice (as '%s' in %s too)",
                           f->path, m->tensors[i].name, m->places[i].entry->name,
                           m->places[i].file->path);
    FSDP2_CHECK(check_shape(m, f, e, &m->tensors[i]));
    m->places[i].file = f;
    m->places[i].entry = e;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t open_tensors(fsdp2_hf_model_t *m)
{
    char *index_path = join(m->dir, "model.safetensors.index.json");
    if (index_path == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", m->dir);
    char *text = NULL;
    cJSON *map_root = NULL;
    int missing = 0;
    fsdp2_status_t status = hf_read_text(index_path, &text, &missing);
    free(index_path);
    FSDP2_CHECK(status);
    if (!missing) {
        status = open_index(m, text, &map_root);
        free(text);
        FSDP2_CHECK(status);
    } else {
        m->files = fsdp2_calloc(1, sizeof(*m->files));
        m->file_names = fsdp2_calloc(1, sizeof(*m->file_names));
        if (m->files == NULL || m->file_names == NULL)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", m->dir);
        FSDP2_CHECK(add_file(m, "model.safetensors"));
    }
    const cJSON *map = map_root ? cJSON_GetObjectItemCaseSensitive(map_root, "weight_map") : NULL;
    for (size_t f = 0; f < m->num_files && status == FSDP2_SUCCESS; f++)
        for (size_t e = 0; e < m->files[f].num_entries && status == FSDP2_SUCCESS; e++)
            status = match_entry(m, map, f, &m->files[f].entries[e]);
    cJSON_Delete(map_root);
    FSDP2_CHECK(status);
    for (size_t i = 0; i < m->num_tensors; i++)
        if (m->places[i].entry == NULL) {
            char want[64];
            const hf_tensor_t *t = &m->tensors[i];
            int64_t stored[2] = {t->transposed ? t->shape[1] : t->shape[0],
                                 t->transposed ? t->shape[0] : t->shape[1]};
            char name[HF_NAME_MAX + 16];
            hf_stored_name(m->cfg.arch, t->name, name, sizeof(name));
            shape_text(t->ndim, stored, want, sizeof(want));
            return fsdp2_error(FSDP2_ERR_NOT_FOUND,
                               "%s: missing tensor '%s' (%s, from config.json's %s)%s", m->dir,
                               name, want, t->field,
                               m->num_files > 1 ? " in every file of the index" : "");
        }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_model_open(const char *dir, fsdp2_hf_model_t **model)
{
    FSDP2_ARG_CHECK(dir != NULL && model != NULL, "fsdp2_hf_model_open: dir=%p model=%p",
                    (const void *)dir, (void *)model);
    *model = NULL;
    fsdp2_hf_model_t *m = fsdp2_calloc(1, sizeof(*m));
    if (m == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "fsdp2_hf_model_open %s", dir);
    fsdp2_status_t status = FSDP2_SUCCESS;
    m->dir = strdup(dir);
    if (m->dir == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", dir);
        goto cleanup;
    }
    m->cfg.size = sizeof(m->cfg);
    FSDP2_CHECK_GOTO(fsdp2_hf_config_read(dir, &m->cfg), status, cleanup);
    FSDP2_CHECK_GOTO(hf_tensor_list(&m->cfg, &m->tensors, &m->num_tensors), status, cleanup);
    m->places = fsdp2_calloc(m->num_tensors, sizeof(*m->places));
    if (m->places == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: %zu tensors", dir, m->num_tensors);
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(open_tensors(m), status, cleanup);
    *model = m;
    return FSDP2_SUCCESS;
cleanup:
    fsdp2_hf_model_close(m);
    return status;
}

fsdp2_status_t fsdp2_hf_model_close(fsdp2_hf_model_t *m)
{
    if (m == NULL)
        return FSDP2_SUCCESS;
    for (size_t i = 0; i < m->num_files; i++) {
        st_close(&m->files[i]);
        free(m->file_names[i]);
    }
    free(m->files);
    free(m->file_names);
    free(m->tensors);
    free(m->places);
    free(m->dir);
    free(m);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_model_config(const fsdp2_hf_model_t *m, fsdp2_hf_config_t *cfg)
{
    FSDP2_ARG_CHECK(m != NULL, "fsdp2_hf_model_config: model is NULL");
    FSDP2_CHECK(hf_config_check_size(cfg, "fsdp2_hf_model_config"));
    *cfg = m->cfg;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_model_num_tensors(const fsdp2_hf_model_t *m, size_t *count)
{
    FSDP2_ARG_CHECK(m != NULL && count != NULL, "fsdp2_hf_model_num_tensors: model=%p count=%p",
                    (const void *)m, (void *)count);
    *count = m->num_tensors;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_model_tensor(const fsdp2_hf_model_t *m, size_t i,
                                     fsdp2_hf_tensor_info_t *info)
{
    FSDP2_ARG_CHECK(m != NULL && info != NULL, "fsdp2_hf_model_tensor: model=%p info=%p",
                    (const void *)m, (void *)info);
    FSDP2_ARG_CHECK(i < m->num_tensors, "fsdp2_hf_model_tensor: index %zu of %zu tensors", i,
                    m->num_tensors);
    const hf_tensor_t *t = &m->tensors[i];
    info->name = t->name;
    info->ndim = t->ndim;
    info->shape[0] = t->shape[0];
    info->shape[1] = t->ndim == 2 ? t->shape[1] : 1;
    info->transposed = t->transposed;
    info->file_dtype = m->places[i].entry->dtype;
    return FSDP2_SUCCESS;
}

/* ---------------------------------------------------------------------------------- */
/* Reading                                                                             */

/* Reads n elements at element offset at of the entry, as f32 into out, refusing a NaN or
 * an infinity by its flat index in the file's layout. raw holds n elements of any dtype. */
static fsdp2_status_t read_f32(const st_file_t *file, const st_entry_t *e, uint64_t at, size_t n,
                               void *raw, float *out)
{
    size_t elem = e->dtype == FSDP2_F32 ? 4 : 2;
    FSDP2_CHECK(
        st_read(file, e, at * elem, e->dtype == FSDP2_F32 ? (void *)out : raw, n * elem));
    if (e->dtype != FSDP2_F32)
        FSDP2_CHECK(fsdp2_convert(out, FSDP2_F32, raw, e->dtype, n));
    for (size_t k = 0; k < n; k++)
        if (!isfinite(out[k]))
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s' holds %s at flat index %" PRIu64,
                               file->path, e->name, isnan(out[k]) ? "NaN" : "an infinity",
                               at + k);
    return FSDP2_SUCCESS;
}

static void store(void *dst, fsdp2_dtype_t dtype, size_t index, float v)
{
    if (dtype == FSDP2_F32)
        ((float *)dst)[index] = v;
    else
        ((uint16_t *)dst)[index] = fsdp2_f32_to_bf16(v);
}

fsdp2_status_t fsdp2_hf_model_read(fsdp2_hf_model_t *m, const char *name, int64_t row0,
                                   int64_t rows, fsdp2_dtype_t dst_dtype, void *dst)
{
    FSDP2_ARG_CHECK(m != NULL && name != NULL && (dst != NULL || rows == 0),
                    "fsdp2_hf_model_read: model=%p name=%p dst=%p", (void *)m,
                    (const void *)name, dst);
    FSDP2_ARG_CHECK(dst_dtype == FSDP2_F32 || dst_dtype == FSDP2_BF16,
                    "fsdp2_hf_model_read %s: dst_dtype %s (f32 or bf16)", name,
                    fsdp2_dtype_name(dst_dtype));
    size_t i = find_tensor(m, name);
    if (i == SIZE_MAX)
        return fsdp2_error(FSDP2_ERR_NOT_FOUND, "%s: no tensor '%s' (canonical names: "
                           "fsdp2_hf_model_tensor)", m->dir, name);
    return hf_read_rows(m->places[i].file, m->places[i].entry, &m->tensors[i], row0, rows,
                        dst_dtype, dst);
}

fsdp2_status_t hf_read_rows(const st_file_t *file, const st_entry_t *entry, const hf_tensor_t *t,
                            int64_t row0, int64_t rows, fsdp2_dtype_t dst_dtype, void *dst)
{
    const char *name = t->name;
    int64_t cols = t->ndim == 2 ? t->shape[1] : 1;
    FSDP2_ARG_CHECK(row0 >= 0 && rows >= 0 && row0 <= t->shape[0] && rows <= t->shape[0] - row0,
                    "fsdp2_hf_model_read %s: rows [%" PRId64 ", %" PRId64 " + %" PRId64
                    ") of %" PRId64,
                    name, row0, row0, rows, t->shape[0]);
    if (rows == 0)
        return FSDP2_SUCCESS;
    /* Not transposed: one contiguous range, in chunks. Transposed (file [in, out]): our
     * rows are the columns row0.. of each of the file's `cols` rows. */
    size_t chunk = t->transposed ? (size_t)rows : HF_READ_CHUNK;
    float *f32 = fsdp2_malloc(chunk * sizeof(float));
    void *raw = fsdp2_malloc(chunk * 2);
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (f32 == NULL || raw == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "reading %s: %zu elements", name, chunk);
        goto cleanup;
    }
    if (!t->transposed) {
        uint64_t first = (uint64_t)row0 * (uint64_t)cols, total = (uint64_t)rows * (uint64_t)cols;
        for (uint64_t done = 0; done < total;) {
            size_t n = total - done < chunk ? (size_t)(total - done) : chunk;
            /* An f32 destination is converted into in place: no staging copy. */
            float *out = dst_dtype == FSDP2_F32 ? (float *)dst + done : f32;
            FSDP2_CHECK_GOTO(read_f32(file, entry, first + done, n, raw, out), status, cleanup);
            if (dst_dtype == FSDP2_BF16)
                FSDP2_CHECK_GOTO(
                    fsdp2_convert((uint16_t *)dst + done, FSDP2_BF16, f32, FSDP2_F32, n), status,
                    cleanup);
            done += n;
        }
    } else {
        uint64_t out = (uint64_t)t->shape[0];
        for (int64_t c = 0; c < cols; c++) {
            FSDP2_CHECK_GOTO(
                read_f32(file, entry, (uint64_t)c * out + (uint64_t)row0, chunk, raw, f32),
                status, cleanup);
            for (size_t r = 0; r < chunk; r++)
                store(dst, dst_dtype, r * (size_t)cols + (size_t)c, f32[r]);
        }
    }
cleanup:
    free(f32);
    free(raw);
    return status;
}
