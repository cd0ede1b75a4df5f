/* The offline tools: inspect, verify, consolidate, reshard (one process, no mesh). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/metadata.h"
#include "core/error.h"

/* Bytes of a tensor (meta_load has checked that they fit in 2^53). */
static uint64_t tensor_bytes(const meta_tensor_t *t)
{
    size_t elem;
    fsdp2_dtype_size(t->dtype, &elem);
    uint64_t n = elem;
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

static const char *placements_of(const meta_t *m, const meta_tensor_t *t)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m->root, "tensors"),
                                                      t->name);
    const char *p = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "placements"));
    return p ? p : "?";
}

fsdp2_status_t fsdp2_checkpoint_inspect(const char *dir, FILE *out, int json)
{
    FSDP2_ARG_CHECK(dir && out, "inspect: dir or out is NULL");
    meta_t m;
    fsdp2_status_t status = meta_load(dir, &m);
    if (status != FSDP2_SUCCESS) {
        meta_free(&m);
        return status;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < m.num_tensors; i++)
        total += tensor_bytes(&m.tensors[i]);
    if (json) {
        cJSON *root = cJSON_CreateObject(), *ts = cJSON_CreateArray();
        cJSON_AddStringToObject(root, "path", dir);
        cJSON_AddNumberToObject(root, "version", m.version);
        cJSON_AddNumberToObject(root, "world_size", m.world_size);
        cJSON_AddNumberToObject(root, "step", (double)m.step);
        cJSON_AddNumberToObject(root, "bytes", (double)total);
        cJSON_AddBoolToObject(root, "valid_metadata", 1);
        cJSON_AddItemToObject(root, "extra",
                              cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(m.root, "extra"), 1));
        for (size_t i = 0; i < m.num_tensors; i++) {
            const meta_tensor_t *t = &m.tensors[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", t->name);
            cJSON_AddStringToObject(o, "dtype", fsdp2_dtype_name(t->dtype));
            cJSON_AddItemToObject(o, "shape", ckpt_int_array(t->shape, t->ndim));
            cJSON_AddStringToObject(o, "placements", placements_of(&m, t));
            cJSON_AddNumberToObject(o, "chunks", (double)t->num_chunks);
            cJSON_AddNumberToObject(o, "bytes", (double)tensor_bytes(t));
            cJSON_AddItemToArray(ts, o);
        }
        cJSON_AddItemToObject(root, "tensors", ts);
        char *text = cJSON_Print(root);
        if (text)
            fprintf(out, "%s\n", text);
        cJSON_free(text);
        cJSON_Delete(root);
    } else {
        fprintf(out, "%s: libfsdp2 checkpoint version %d, saved by %d rank%s, step %lld, %zu "
                     "tensors, %.3f MiB\n",
                dir, m.version, m.world_size, m.world_size > 1 ? "s" : "", (long long)m.step,
                m.num_tensors, (double)total / 1048576.0);
        const cJSON *extra = cJSON_GetObjectItemCaseSensitive(m.root, "extra"), *e;
        cJSON_ArrayForEach(e, extra)
        {
            if (cJSON_IsString(e))
                fprintf(out, "  extra %s = %s\n", e->string, e->valuestring);
        }
        for (size_t i = 0; i < m.num_tensors; i++) {
            const meta_tensor_t *t = &m.tensors[i];
            char shape[96];
            fsdp2_shape_format(t->ndim, t->shape, shape, sizeof(shape));
            fprintf(out, "  %-40s %-5s %-16s %-24s %3zu chunk%s %12llu bytes\n", t->name,
                    fsdp2_dtype_name(t->dtype), shape, placements_of(&m, t), t->num_chunks,
                    t->num_chunks == 1 ? " " : "s", (unsigned long long)tensor_bytes(t));
        }
        fprintf(out, "metadata valid (run verify to check the data)\n");
    }
    meta_free(&m);
    return FSDP2_SUCCESS;
}

/* Reads rows [lo, hi) of tensor t from its chunks into dst (verified). */
static fsdp2_status_t read_tensor_rows(open_files_t *of, const meta_t *m, const meta_tensor_t *t,
                                       int64_t lo, int64_t hi, char *dst, uint64_t *bytes)
{
    uint64_t total = tensor_bytes(t);
    int64_t rows = t->ndim ? t->shape[0] : 1;
    uint64_t row_bytes = rows ? total / (uint64_t)rows : 0;
    for (size_t i = 0; i < t->num_chunks; i++) {
        const chunk_t *k = &t->chunks[i];
        int64_t a = lo > k->row0 ? lo : k->row0, z = hi < k->row0 + k->rows ? hi : k->row0 + k->rows;
        if (a < z)
            FSDP2_CHECK(meta_read_rows(of, m, t, k, a, z, dst + (uint64_t)(a - lo) * row_bytes, bytes));
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t open_meta(const char *dir, meta_t *m, open_files_t **of)
{
    FSDP2_CHECK(meta_load(dir, m));
    *of = calloc(1, sizeof(**of));
    if (!*of)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint tool");
    snprintf((*of)->dir, sizeof((*of)->dir), "%s", dir);
    return FSDP2_SUCCESS;
}

static void close_meta(meta_t *m, open_files_t *of)
{
    for (int i = 0; of && i < of->count; i++)
        st_close(&of->files[i]);
    free(of);
    meta_free(m);
}

fsdp2_status_t fsdp2_checkpoint_verify(const char *dir, uint64_t *bytes)
{
    FSDP2_ARG_CHECK(dir, "verify: dir is NULL");
    meta_t m;
    open_files_t *of = NULL;
    uint64_t done = 0;
    fsdp2_status_t status = open_meta(dir, &m, &of);
    for (size_t i = 0; i < m.num_tensors && status == FSDP2_SUCCESS; i++) {
        const meta_tensor_t *t = &m.tensors[i];
        for (size_t c = 0; c < t->num_chunks && status == FSDP2_SUCCESS; c++) {
            const chunk_t *k = &t->chunks[c];
            char *buf = malloc(k->bytes ? (size_t)k->bytes : 1);
            if (!buf)
                status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "verify: %llu bytes",
                                     (unsigned long long)k->bytes);
            else
                status = meta_read_rows(of, &m, t, k, k->row0, k->row0 + k->rows, buf, &done);
            free(buf);
        }
    }
    if (bytes)
        *bytes = done;
    close_meta(&m, of);
    return status;
}

fsdp2_status_t fsdp2_checkpoint_consolidate(const char *dir, const char *path)
{
    FSDP2_ARG_CHECK(dir && path, "consolidate: dir or path is NULL");
    meta_t m;
    open_files_t *of = NULL;
    st_writer_t *w = NULL;
    uint64_t done = 0;
    fsdp2_status_t status = open_meta(dir, &m, &of);
    if (status == FSDP2_SUCCESS)
        status = st_writer_create(path, &w);
    for (size_t i = 0; i < m.num_tensors && status == FSDP2_SUCCESS; i++)
        status = st_writer_add(w, m.tensors[i].name, m.tensors[i].dtype, m.tensors[i].ndim,
                               m.tensors[i].shape);
    if (status == FSDP2_SUCCESS)
        status = st_writer_meta(w, "format", "pt");
    if (status == FSDP2_SUCCESS)
        status = st_writer_begin(w, NULL);
    for (size_t i = 0; i < m.num_tensors && status == FSDP2_SUCCESS; i++) {
        const meta_tensor_t *t = &m.tensors[i];
        uint64_t n = tensor_bytes(t);
        char *buf = malloc(n ? (size_t)n : 1);
        if (!buf) {
            status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "consolidate: '%s'", t->name);
            break;
        }
        status = read_tensor_rows(of, &m, t, 0, t->ndim ? t->shape[0] : 1, buf, &done);
        if (status == FSDP2_SUCCESS && n)
            status = st_writer_write(w, buf, (size_t)n);
        free(buf);
    }
    if (status == FSDP2_SUCCESS)
        status = st_writer_finish(w);
    else
        st_writer_abort(w);
    close_meta(&m, of);
    return status;
}

/* Rank r's file of the resharded checkpoint; its chunks go into the tensors' lists. */
static fsdp2_status_t write_reshard_rank(open_files_t *of, const meta_t *m, const char *partial,
                                         int ws, int r, cJSON *tensors, uint64_t *done)
{
    char name[64], path[4200];
    snprintf(name, sizeof(name), "rank-%05d.safetensors", r);
    snprintf(path, sizeof(path), "%s/%s", partial, name);
    st_writer_t *w;
    FSDP2_CHECK(st_writer_create(path, &w));
    fsdp2_status_t status = FSDP2_SUCCESS;
    int64_t *lo = calloc(m->num_tensors ? m->num_tensors : 1, sizeof(int64_t));
    int64_t *len = calloc(m->num_tensors ? m->num_tensors : 1, sizeof(int64_t));
    if (!lo || !len)
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "reshard");
    for (size_t i = 0; i < m->num_tensors && status == FSDP2_SUCCESS; i++) {
        const meta_tensor_t *t = &m->tensors[i];
        int whole = !strcmp(placements_of(m, t), "whole") || t->ndim == 0;
        if (whole) {
            lo[i] = 0;
            len[i] = r == 0 ? (t->ndim ? t->shape[0] : 1) : 0;
        } else {
            status = fsdp2_chunk_range(t->shape[0], ws, r, &lo[i], &len[i]);
        }
        int64_t shape[FSDP2_MAX_DIMS];
        memcpy(shape, t->shape, sizeof(shape));
        if (t->ndim)
            shape[0] = len[i];
        uint64_t n = tensor_bytes(t);
        int64_t rows = t->ndim ? t->shape[0] : 1;
        if (status == FSDP2_SUCCESS && len[i] > 0 && n / (uint64_t)rows > 0)
            status = st_writer_add(w, t->name, t->dtype, t->ndim, shape);
    }
    uint64_t data_start = 0;
    if (status == FSDP2_SUCCESS)
        status = st_writer_begin(w, &data_start);
    for (size_t i = 0; i < m->num_tensors && status == FSDP2_SUCCESS; i++) {
        const meta_tensor_t *t = &m->tensors[i];
        int64_t rows = t->ndim ? t->shape[0] : 1;
        uint64_t row_bytes = rows ? tensor_bytes(t) / (uint64_t)rows : 0;
        uint64_t n = (uint64_t)len[i] * row_bytes, offset = 0;
        if (!n)
            continue;
        char *buf = malloc((size_t)n);
        if (!buf) {
            status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "reshard: '%s'", t->name);
            break;
        }
        status = read_tensor_rows(of, m, t, lo[i], lo[i] + len[i], buf, done);
        if (status == FSDP2_SUCCESS)
            status = st_writer_offset(w, t->name, &offset);
        cJSON *crcs = cJSON_CreateArray();
        for (uint64_t at = 0; at < n && status == FSDP2_SUCCESS; at += CKPT_BLOCK_BYTES) {
            size_t b = (size_t)(n - at < CKPT_BLOCK_BYTES ? n - at : CKPT_BLOCK_BYTES);
            cJSON_AddItemToArray(crcs, cJSON_CreateNumber(st_crc32c(0, buf + at, b)));
            status = st_writer_write(w, buf + at, b);
        }
        free(buf);
        int64_t goff[FSDP2_MAX_DIMS] = {lo[i]}, shape[FSDP2_MAX_DIMS];
        memcpy(shape, t->shape, sizeof(shape));
        if (t->ndim)
            shape[0] = len[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "file", name);
        cJSON_AddNumberToObject(c, "offset", (double)(data_start + offset));
        cJSON_AddNumberToObject(c, "bytes", (double)n);
        cJSON_AddItemToObject(c, "global_offset", ckpt_int_array(goff, t->ndim));
        cJSON_AddItemToObject(c, "shape", ckpt_int_array(shape, t->ndim));
        cJSON_AddItemToObject(c, "crc32c", crcs);
        cJSON *entry = cJSON_GetObjectItemCaseSensitive(tensors, t->name);
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(entry, "chunks"), c);
    }
    free(lo);
    free(len);
    if (status == FSDP2_SUCCESS)
        return st_writer_finish(w);
    st_writer_abort(w);
    return status;
}

fsdp2_status_t fsdp2_checkpoint_reshard(const char *dir, const char *out_dir, int world_size)
{
    FSDP2_ARG_CHECK(dir && out_dir && out_dir[0], "reshard: dir or out_dir is NULL or empty");
    FSDP2_ARG_CHECK(world_size >= 1 && world_size <= 65536,
                    "reshard: world size %d is not in 1..65536", world_size);
    FSDP2_ARG_CHECK(strlen(out_dir) < 3000, "reshard: out_dir is too long");
    char clean_in[3072], clean_out[3072];
    ckpt_clean_path(dir, clean_in, sizeof(clean_in));
    ckpt_clean_path(out_dir, clean_out, sizeof(clean_out));
    dir = clean_in;
    out_dir = clean_out;
    FSDP2_ARG_CHECK(strcmp(dir, out_dir), "reshard: out_dir must differ from dir '%s'", dir);
    meta_t m;
    open_files_t *of = NULL;
    uint64_t done = 0;
    char partial[4096];
    snprintf(partial, sizeof(partial), "%s.partial", out_dir);
    fsdp2_status_t status = open_meta(dir, &m, &of);
    cJSON *root = NULL;
    if (status == FSDP2_SUCCESS)
        status = ckpt_remove_dir(partial);
    if (status == FSDP2_SUCCESS && mkdir(partial, 0755) != 0)
        status = fsdp2_error(FSDP2_ERR_IO, "reshard: cannot create %s: %s", partial, strerror(errno));
    if (status == FSDP2_SUCCESS) {
        root = cJSON_Duplicate(m.root, 1);
        cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors"), *t;
        cJSON_ArrayForEach(t, tensors)
        {
            cJSON_ReplaceItemInObjectCaseSensitive(t, "chunks", cJSON_CreateArray());
            const char *p = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "placements"));
            if (!p || strcmp(p, "whole"))
                cJSON_ReplaceItemInObjectCaseSensitive(t, "placements",
                                                       cJSON_CreateString("[Shard(dim=0)]"));
        }
        int64_t mesh = world_size;
        cJSON_ReplaceItemInObjectCaseSensitive(root, "world_size", cJSON_CreateNumber(world_size));
        cJSON_DeleteItemFromObjectCaseSensitive(root, "mesh");
        cJSON_AddItemToObject(root, "mesh", ckpt_int_array(&mesh, 1));
        for (int r = 0; r < world_size && status == FSDP2_SUCCESS; r++)
            status = write_reshard_rank(of, &m, partial, world_size, r, tensors, &done);
    }
    if (status == FSDP2_SUCCESS) {
        char *text = cJSON_Print(root);
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", partial, CKPT_METADATA);
        status = text ? ckpt_write_text(path, text) : fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "reshard");
        cJSON_free(text);
    }
    if (status == FSDP2_SUCCESS)
        status = ckpt_publish(partial, out_dir);
    else
        ckpt_remove_dir(partial);
    cJSON_Delete(root);
    close_meta(&m, of);
    return status;
}
