/* Writing Hugging Face model directories (include/fsdp2/hf_model.h).
 *
 * The shards are planned from the config alone (tensors in canonical order, a new file
 * when the next tensor would pass max_shard_bytes), so each file's header is written
 * before its data and the caller hands over one whole tensor at a time: the model is
 * never in memory at once. Everything goes into "<parent>/.<name>.partial-XXXXXX", which
 * finish renames to the target; any failure removes it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint/hf_internal.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/options.h"

struct fsdp2_hf_writer {
    char *dir, *tmp;
    fsdp2_hf_config_t cfg;
    fsdp2_hf_export_options_t opts;
    hf_tensor_t *tensors;
    size_t num_tensors, next;
    size_t *shard_of; /* per tensor */
    size_t num_shards;
    st_writer_t *file; /* the shard being written, or NULL */
    int failed;
};

static size_t elem_size(fsdp2_dtype_t dtype)
{
    return dtype == FSDP2_F32 ? 4 : 2;
}

static uint64_t tensor_bytes(const hf_tensor_t *t, fsdp2_dtype_t dtype)
{
    return (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1) * elem_size(dtype);
}

static void shard_name(const fsdp2_hf_writer_t *w, size_t shard, char *out, size_t size)
{
    if (w->num_shards == 1)
        snprintf(out, size, "model.safetensors");
    else
        snprintf(out, size, "model-%05zu-of-%05zu.safetensors", shard + 1, w->num_shards);
}

static char *join(const char *dir, const char *name)
{
    size_t len = strlen(dir) + strlen(name) + 2;
    char *path = fsdp2_malloc(len);
    if (path != NULL)
        snprintf(path, len, "%s/%s", dir, name);
    return path;
}

/* Removes the temporary directory and what is in it (only files: we make no others). */
void hf_tmp_remove(char *tmp)
{
    if (tmp == NULL)
        return;
    DIR *d = opendir(tmp);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char *path = join(tmp, e->d_name);
            if (path != NULL)
                unlink(path);
            free(path);
        }
        closedir(d);
    }
    rmdir(tmp);
    free(tmp);
}

static void remove_tmp(fsdp2_hf_writer_t *w)
{
    hf_tmp_remove(w->tmp);
    w->tmp = NULL;
}

fsdp2_status_t hf_tmp_file(const char *dir, const char *name, const void *data, size_t len)
{
    const char *text = data;
    char *path = join(dir, name);
    if (path == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s/%s", dir, name);
    fsdp2_status_t status = FSDP2_SUCCESS;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        status = fsdp2_error(FSDP2_ERR_IO, "%s: create: %s", path, strerror(errno));
        goto cleanup;
    }
    size_t done = 0;
    while (done < len) {
        if (fsdp2_fault_hit(FAULT_IO)) {
            status = fsdp2_fault_error(FAULT_IO, "write");
            break;
        }
        ssize_t n = write(fd, text + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            status = fsdp2_error(FSDP2_ERR_IO, "%s: write: %s", path, strerror(errno));
            break;
        }
        done += (size_t)n;
    }
    if (status == FSDP2_SUCCESS && fsync(fd) != 0)
        status = fsdp2_error(FSDP2_ERR_IO, "%s: fsync: %s", path, strerror(errno));
    close(fd);
cleanup:
    free(path);
    return status;
}

static fsdp2_status_t write_small_file(const char *dir, const char *name, const char *text)
{
    return hf_tmp_file(dir, name, text, strlen(text));
}

/* The target must not exist, or be an empty directory; its parent must be a directory. */
static fsdp2_status_t check_target(const char *dir, char **parent_out)
{
    struct stat st;
    if (lstat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "%s: exists and is not a directory (refused: nothing overwritten)",
                               dir);
        DIR *d = opendir(dir);
        if (d == NULL)
            return fsdp2_error(FSDP2_ERR_IO, "%s: %s", dir, strerror(errno));
        struct dirent *e;
        int empty = 1;
        while (empty && (e = readdir(d)) != NULL)
            empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
        closedir(d);
        if (!empty)
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "%s: directory is not empty (refused: nothing overwritten)", dir);
    }
    char *copy = strdup(dir);
    if (copy == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", dir);
    char *parent = strdup(dirname(copy));
    free(copy);
    if (parent == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", dir);
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fsdp2_status_t status = fsdp2_error(FSDP2_ERR_IO, "%s: parent directory '%s' %s", dir,
                                            parent, errno == ENOENT || !S_ISDIR(st.st_mode)
                                                        ? "does not exist"
                                                        : strerror(errno));
        free(parent);
        return status;
    }
    *parent_out = parent;
    return FSDP2_SUCCESS;
}

fsdp2_status_t hf_tmp_commit(const char *tmp, const char *dir)
{
    int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    /* An empty directory in dir's place is replaced; anything else there now fails. */
    if (rename(tmp, dir) != 0)
        return fsdp2_error(FSDP2_ERR_IO, "%s: rename from %s: %s", dir, tmp, strerror(errno));
    return FSDP2_SUCCESS;
}

fsdp2_status_t hf_tmp_create(const char *dir, char **tmp_out)
{
    char *parent = NULL;
    FSDP2_CHECK(check_target(dir, &parent));
    char *copy = strdup(dir);
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (copy == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", dir);
        goto cleanup;
    }
    const char *base = basename(copy);
    size_t len = strlen(parent) + strlen(base) + 32;
    char *tmp = fsdp2_malloc(len);
    if (tmp == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", dir);
        goto cleanup;
    }
    snprintf(tmp, len, "%s/.%s.partial-XXXXXX", parent, base);
    if (mkdtemp(tmp) == NULL) {
        status = fsdp2_error(FSDP2_ERR_IO, "%s: mkdtemp: %s", tmp, strerror(errno));
        free(tmp);
        goto cleanup;
    }
    /* mkdtemp makes it 0700; a model directory is readable as any other (the files in it
     * are created 0644) */
    if (chmod(tmp, 0755) != 0) {
        status = fsdp2_error(FSDP2_ERR_IO, "%s: chmod: %s", tmp, strerror(errno));
        rmdir(tmp);
        free(tmp);
        goto cleanup;
    }
    *tmp_out = tmp;
cleanup:
    free(copy);
    free(parent);
    return status;
}

static void plan_shards(fsdp2_hf_writer_t *w)
{
    uint64_t in_shard = 0;
    size_t shard = 0;
    for (size_t i = 0; i < w->num_tensors; i++) {
        uint64_t bytes = tensor_bytes(&w->tensors[i], w->opts.dtype);
        if (w->opts.max_shard_bytes > 0 && in_shard > 0 &&
            in_shard + bytes > w->opts.max_shard_bytes) {
            shard++;
            in_shard = 0;
        }
        w->shard_of[i] = shard;
        in_shard += bytes;
    }
    w->num_shards = shard + 1;
}

/* Creates the file of the shard that tensor `first` opens, with its header. */
static fsdp2_status_t open_shard(fsdp2_hf_writer_t *w, size_t first)
{
    char name[64];
    shard_name(w, w->shard_of[first], name, sizeof(name));
    char *path = join(w->tmp, name);
    if (path == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", name);
    fsdp2_status_t status = st_writer_create(path, &w->file);
    free(path);
    FSDP2_CHECK(status);
    FSDP2_CHECK(st_writer_meta(w->file, "format", "pt"));
    for (size_t i = first; i < w->num_tensors && w->shard_of[i] == w->shard_of[first]; i++) {
        const hf_tensor_t *t = &w->tensors[i];
        char stored[HF_NAME_MAX + 16];
        hf_stored_name(w->cfg.arch, t->name, stored, sizeof(stored));
        int64_t shape[2] = {t->transposed ? t->shape[1] : t->shape[0],
                            t->transposed ? t->shape[0] : t->shape[1]};
        FSDP2_CHECK(st_writer_add(w->file, stored, w->opts.dtype, t->ndim, shape));
    }
    return st_writer_begin(w->file, NULL);
}

static fsdp2_status_t write_index(fsdp2_hf_writer_t *w)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    uint64_t total = 0;
    for (size_t i = 0; i < w->num_tensors; i++)
        total += tensor_bytes(&w->tensors[i], w->opts.dtype);
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    for (size_t i = 0; i < w->num_tensors; i++) {
        char stored[HF_NAME_MAX + 16], file[64];
        hf_stored_name(w->cfg.arch, w->tensors[i].name, stored, sizeof(stored));
        shard_name(w, w->shard_of[i], file, sizeof(file));
        cJSON_AddStringToObject(map, stored, file);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (text == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "model.safetensors.index.json");
    fsdp2_status_t status = write_small_file(w->tmp, "model.safetensors.index.json", text);
    free(text);
    return status;
}

static void writer_free(fsdp2_hf_writer_t *w)
{
    st_writer_abort(w->file);
    w->file = NULL;
    remove_tmp(w);
    free(w->dir);
    free(w->tensors);
    free(w->shard_of);
    free(w);
}

fsdp2_status_t fsdp2_hf_writer_create(const char *dir, const fsdp2_hf_config_t *cfg,
                                      const fsdp2_hf_export_options_t *opts,
                                      fsdp2_hf_writer_t **writer)
{
    FSDP2_ARG_CHECK(dir != NULL && writer != NULL, "fsdp2_hf_writer_create: dir=%p writer=%p",
                    (const void *)dir, (void *)writer);
    *writer = NULL;
    FSDP2_CHECK(hf_config_check_size(cfg, "fsdp2_hf_writer_create"));
    /* What a config.json may leave out, the caller may leave zero. */
    fsdp2_hf_config_t full = *cfg;
    if (full.num_kv_heads == 0)
        full.num_kv_heads = full.num_heads;
    if (full.head_dim == 0 && full.num_heads > 0)
        full.head_dim = full.hidden_size / full.num_heads;
    if (full.hidden_act[0] == '\0')
        snprintf(full.hidden_act, sizeof(full.hidden_act), "%s",
                 full.arch == FSDP2_HF_GPT2 ? "gelu_new" : "silu");
    cfg = &full;
    FSDP2_CHECK(hf_config_validate(cfg, dir));
    fsdp2_hf_export_options_t o = FSDP2_HF_EXPORT_OPTIONS_INIT;
    if (opts != NULL)
        FSDP2_CHECK(fsdp2_options_copy("hf export options", &o, sizeof(o), opts, NULL, 0));
    FSDP2_ARG_CHECK(o.dtype == FSDP2_F32 || o.dtype == FSDP2_BF16,
                    "fsdp2_hf_writer_create %s: dtype %s (f32 or bf16)", dir,
                    fsdp2_dtype_name(o.dtype));
    fsdp2_hf_writer_t *w = fsdp2_calloc(1, sizeof(*w));
    if (w == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "fsdp2_hf_writer_create %s", dir);
    fsdp2_status_t status = FSDP2_SUCCESS;
    char *config = NULL;
    w->cfg = *cfg;
    w->opts = o;
    w->dir = strdup(dir);
    if (w->dir == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", dir);
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(hf_tensor_list(cfg, &w->tensors, &w->num_tensors), status, cleanup);
    w->shard_of = fsdp2_calloc(w->num_tensors, sizeof(*w->shard_of));
    if (w->shard_of == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: %zu tensors", dir, w->num_tensors);
        goto cleanup;
    }
    plan_shards(w);
    FSDP2_CHECK_GOTO(hf_tmp_create(w->dir, &w->tmp), status, cleanup);
    FSDP2_CHECK_GOTO(hf_config_to_json(cfg, o.dtype, &config), status, cleanup);
    FSDP2_CHECK_GOTO(write_small_file(w->tmp, "config.json", config), status, cleanup);
    FSDP2_CHECK_GOTO(open_shard(w, 0), status, cleanup);
    *writer = w;
cleanup:
    free(config);
    if (status != FSDP2_SUCCESS)
        writer_free(w);
    return status;
}

fsdp2_status_t fsdp2_hf_writer_next(const fsdp2_hf_writer_t *w, fsdp2_hf_tensor_info_t *info)
{
    FSDP2_ARG_CHECK(w != NULL && info != NULL, "fsdp2_hf_writer_next: writer=%p info=%p",
                    (const void *)w, (void *)info);
    memset(info, 0, sizeof(*info));
    if (w->next == w->num_tensors)
        return FSDP2_SUCCESS;
    const hf_tensor_t *t = &w->tensors[w->next];
    info->name = t->name;
    info->ndim = t->ndim;
    info->shape[0] = t->shape[0];
    info->shape[1] = t->ndim == 2 ? t->shape[1] : 1;
    info->transposed = t->transposed;
    info->file_dtype = w->opts.dtype;
    return FSDP2_SUCCESS;
}

/* Converts (and for Conv1D transposes) the tensor into the file's dtype and layout. */
static fsdp2_status_t stage(const hf_tensor_t *t, fsdp2_dtype_t dtype, fsdp2_dtype_t src_dtype,
                            const void *src, void *out)
{
    size_t rows = (size_t)t->shape[0], cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    if (!t->transposed)
        return fsdp2_convert(out, dtype, src, src_dtype, rows * cols);
    size_t in = elem_size(src_dtype), o = elem_size(dtype);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            FSDP2_CHECK(fsdp2_convert((char *)out + (c * rows + r) * o, dtype,
                                      (const char *)src + (r * cols + c) * in, src_dtype, 1));
    return FSDP2_SUCCESS;
}

static fsdp2_status_t write_tensor(fsdp2_hf_writer_t *w, fsdp2_dtype_t src_dtype, const void *data)
{
    const hf_tensor_t *t = &w->tensors[w->next];
    uint64_t bytes = tensor_bytes(t, w->opts.dtype);
    void *buf = fsdp2_malloc(bytes > 0 ? (size_t)bytes : 1);
    if (buf == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: tensor '%s': %" PRIu64 " bytes", w->dir,
                           t->name, bytes);
    fsdp2_status_t status = stage(t, w->opts.dtype, src_dtype, data, buf);
    if (status == FSDP2_SUCCESS)
        status = st_writer_write(w->file, buf, (size_t)bytes);
    free(buf);
    FSDP2_CHECK(status);
    w->next++;
    if (w->next == w->num_tensors || w->shard_of[w->next] != w->shard_of[w->next - 1]) {
        status = st_writer_finish(w->file);
        w->file = NULL;
        FSDP2_CHECK(status);
        if (w->next < w->num_tensors)
            FSDP2_CHECK(open_shard(w, w->next));
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_hf_writer_write(fsdp2_hf_writer_t *w, const char *name,
                                     fsdp2_dtype_t src_dtype, const void *data)
{
    FSDP2_ARG_CHECK(w != NULL && name != NULL && data != NULL,
                    "fsdp2_hf_writer_write: writer=%p name=%p data=%p", (void *)w,
                    (const void *)name, data);
    if (w->failed)
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "%s: an earlier write failed (abort the writer)", w->dir);
    FSDP2_ARG_CHECK(w->next < w->num_tensors, "%s: tensor '%s' after the last one", w->dir,
                    name);
    FSDP2_ARG_CHECK(strcmp(name, w->tensors[w->next].name) == 0,
                    "%s: tensor '%s' given where '%s' comes next (canonical order)", w->dir, name,
                    w->tensors[w->next].name);
    FSDP2_ARG_CHECK(src_dtype == FSDP2_F32 || src_dtype == FSDP2_BF16,
                    "%s: tensor '%s': src_dtype %s (f32 or bf16)", w->dir, name,
                    fsdp2_dtype_name(src_dtype));
    fsdp2_status_t status = write_tensor(w, src_dtype, data);
    if (status != FSDP2_SUCCESS) {
        /* Nothing partial stays: the files go now, the writer waits for abort. */
        w->failed = 1;
        st_writer_abort(w->file);
        w->file = NULL;
        remove_tmp(w);
    }
    return status;
}

fsdp2_status_t fsdp2_hf_writer_add_file(fsdp2_hf_writer_t *w, const char *name, const void *data,
                                        size_t len)
{
    FSDP2_ARG_CHECK(w != NULL && name != NULL && (data != NULL || len == 0),
                    "fsdp2_hf_writer_add_file: writer, name or data is NULL");
    static const char *const own[] = {"config.json", "model.safetensors",
                                      "model.safetensors.index.json"};
    int taken = strncmp(name, "model-", 6) == 0;
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        taken |= strcmp(name, own[i]) == 0;
    FSDP2_ARG_CHECK(!taken && name[0] != '\0' && name[0] != '.' && strchr(name, '/') == NULL,
                    "%s: '%s' is not a file name the writer leaves free (no path, not the "
                    "config or the weights)", w->dir, name);
    FSDP2_ARG_CHECK(!w->failed, "%s: an earlier write failed", w->dir);
    fsdp2_status_t status = hf_tmp_file(w->tmp, name, data, len);
    if (status != FSDP2_SUCCESS)
        w->failed = 1;
    return status;
}

fsdp2_status_t fsdp2_hf_writer_finish(fsdp2_hf_writer_t *w)
{
    FSDP2_ARG_CHECK(w != NULL, "fsdp2_hf_writer_finish: writer is NULL");
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (w->failed) {
        status = fsdp2_error(FSDP2_ERR_INVALID_STATE, "%s: an earlier write failed", w->dir);
        goto cleanup;
    }
    if (w->next < w->num_tensors) {
        status = fsdp2_error(FSDP2_ERR_INVALID_STATE,
                             "%s: finished after %zu of %zu tensors ('%s' is next): nothing "
                             "written",
                             w->dir, w->next, w->num_tensors, w->tensors[w->next].name);
        goto cleanup;
    }
    if (w->num_shards > 1)
        FSDP2_CHECK_GOTO(write_index(w), status, cleanup);
    FSDP2_CHECK_GOTO(hf_tmp_commit(w->tmp, w->dir), status, cleanup);
    free(w->tmp);
    w->tmp = NULL;
cleanup:
    writer_free(w);
    return status;
}

fsdp2_status_t fsdp2_hf_writer_abort(fsdp2_hf_writer_t *w)
{
    if (w != NULL)
        writer_free(w);
    return FSDP2_SUCCESS;
}
