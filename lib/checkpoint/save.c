/* Saving: every rank writes its shards into <dir>.partial/rank-NNNNN.safetensors, the
 * ranks exchange their chunk lists, rank 0 writes metadata.json, fsyncs, and swaps the
 * directory into place (renameat2 RENAME_EXCHANGE when a previous checkpoint exists, so
 * there is no moment without a whole checkpoint at dir). Any rank's failure is every
 * rank's error, and then nothing becomes visible. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/options.h"
#include "core/log_internal.h"

/* Removes the regular files of dir, then dir (our own partial or replaced checkpoints
 * hold nothing else). A missing dir is fine. */
fsdp2_status_t ckpt_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? FSDP2_SUCCESS
                               : fsdp2_error(FSDP2_ERR_IO, "checkpoint: cannot open %s: %s", dir,
                                             strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) != 0) {
            int err = errno;
            closedir(d);
            return fsdp2_error(FSDP2_ERR_IO, "checkpoint: cannot remove %s/%s: %s", dir,
                               e->d_name, strerror(err));
        }
    }
    closedir(d);
    if (rmdir(dir) != 0 && errno != ENOENT)
        return fsdp2_error(FSDP2_ERR_IO, "checkpoint: cannot remove %s: %s", dir,
                           strerror(errno));
    return FSDP2_SUCCESS;
}

static fsdp2_status_t fsync_path(const char *path)
{
    if (fsdp2_fault_hit(FAULT_IO))
        return fsdp2_fault_error(FAULT_IO, "fsync directory");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fsdp2_error(FSDP2_ERR_IO, "checkpoint: cannot open %s: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0)
        return fsdp2_error(FSDP2_ERR_IO, "checkpoint: fsync %s: %s", path, strerror(err));
    return FSDP2_SUCCESS;
}

/* The directory that holds path (for fsyncing a rename). */
static void parent_of(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "%s", path);
    char *slash = strrchr(buf, '/');
    if (!slash)
        snprintf(buf, len, ".");
    else if (slash == buf)
        buf[1] = '\0';
    else
        *slash = '\0';
}

/* The exchange of statuses: every rank's text; non-empty text = that rank's error. */
static fsdp2_status_t agree(fsdp2_mesh_t *mesh, fsdp2_status_t mine, char ***texts, int *n)
{
    char message[700] = "";
    if (mine != FSDP2_SUCCESS)
        snprintf(message, sizeof(message), "%d %s", (int)mine, fsdp2_last_error());
    return ckpt_all_texts(mesh, message, texts, n);
}

/* The first failing rank's status, with its message; success when every text is empty. */
static fsdp2_status_t first_failure(char **texts, int n, const char *what)
{
    for (int r = 0; r < n; r++) {
        if (!texts[r][0])
            continue;
        int code = atoi(texts[r]);
        const char *space = strchr(texts[r], ' ');
        return fsdp2_error(code > 0 ? (fsdp2_status_t)code : FSDP2_ERR_INTERNAL, "%s: rank %d: %s",
                           what, r, space ? space + 1 : texts[r]);
    }
    return FSDP2_SUCCESS;
}

/* Host bytes of a block (cuda data is copied through a staging buffer by the caller). */
static fsdp2_status_t host_bytes(const sd_block_t *b, const char *name, const void **data,
                                 size_t *bytes)
{
    if (b->data->device.type != FSDP2_DEVICE_CPU && b->data->numel > 0)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "checkpoint: '%s' is on %s: not saved yet",
                           name, b->data->device.type == FSDP2_DEVICE_CUDA ? "cuda" : "meta");
    *data = b->data->data;
    *bytes = b->data->nbytes;
    return FSDP2_SUCCESS;
}

cJSON *ckpt_int_array(const int64_t *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
    return a;
}

/* Writes this rank's file and describes its chunks in *record (JSON text). */
static fsdp2_status_t write_rank_file(const fsdp2_state_dict_t *sd, const char *partial, int rank,
                                      char **record)
{
    char name[64], path[4400];
    snprintf(name, sizeof(name), "rank-%05d.safetensors", rank);
    snprintf(path, sizeof(path), "%s/%s", partial, name);
    st_writer_t *w = NULL;
    cJSON *chunks = cJSON_CreateArray();
    fsdp2_status_t status = chunks ? st_writer_create(path, &w) : FSDP2_ERR_OUT_OF_MEMORY;
    sd_block_t *blocks = fsdp2_calloc(sd->count ? sd->count : 1, sizeof(*blocks));
    if (!blocks && status == FSDP2_SUCCESS)
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint");
    for (size_t i = 0; i < sd->count && status == FSDP2_SUCCESS; i++) {
        status = sd_block_of(sd, &sd->entries[i], &blocks[i]);
        if (status == FSDP2_SUCCESS && blocks[i].writer && blocks[i].data->numel > 0)
            status = st_writer_add(w, sd->entries[i].name, blocks[i].dtype, blocks[i].ndim,
                                   blocks[i].local);
    }
    char rank_text[16];
    snprintf(rank_text, sizeof(rank_text), "%d", rank);
    if (status == FSDP2_SUCCESS)
        status = st_writer_meta(w, "format", "libfsdp2-shard");
    if (status == FSDP2_SUCCESS)
        status = st_writer_meta(w, "rank", rank_text);
    uint64_t data_start = 0;
    if (status == FSDP2_SUCCESS)
        status = st_writer_begin(w, &data_start);
    for (size_t i = 0; i < sd->count && status == FSDP2_SUCCESS; i++) {
        const sd_block_t *b = &blocks[i];
        if (!b->writer || b->data->numel == 0)
            continue;
        const void *data = NULL;
        size_t bytes = 0;
        uint64_t offset = 0;
        status = host_bytes(b, sd->entries[i].name, &data, &bytes);
        if (status == FSDP2_SUCCESS)
            status = st_writer_offset(w, sd->entries[i].name, &offset);
        cJSON *crcs = cJSON_CreateArray();
        for (size_t at = 0; at < bytes && status == FSDP2_SUCCESS; at += CKPT_BLOCK_BYTES) {
            size_t n = bytes - at < CKPT_BLOCK_BYTES ? bytes - at : CKPT_BLOCK_BYTES;
            cJSON_AddItemToArray(crcs, cJSON_CreateNumber(st_crc32c(0, (const char *)data + at, n)));
            status = st_writer_write(w, (const char *)data + at, n);
        }
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "name", sd->entries[i].name);
        cJSON_AddStringToObject(c, "file", name);
        cJSON_AddNumberToObject(c, "offset", (double)(data_start + offset));
        cJSON_AddNumberToObject(c, "bytes", (double)bytes);
        cJSON_AddItemToObject(c, "global_offset", ckpt_int_array(b->offset, b->ndim));
        cJSON_AddItemToObject(c, "shape", ckpt_int_array(b->local, b->ndim));
        cJSON_AddItemToObject(c, "crc32c", crcs);
        cJSON_AddItemToArray(chunks, c);
    }
    if (status == FSDP2_SUCCESS)
        status = st_writer_finish(w);
    else
        st_writer_abort(w);
    free(blocks);
    if (status == FSDP2_SUCCESS) {
        *record = cJSON_PrintUnformatted(chunks);
        if (!*record)
            status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint");
    }
    cJSON_Delete(chunks);
    return status;
}

fsdp2_status_t ckpt_write_text(const char *path, const char *text)
{
    if (fsdp2_fault_hit(FAULT_IO))
        return fsdp2_fault_error(FAULT_IO, "write metadata");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return fsdp2_error(FSDP2_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(errno));
    size_t len = strlen(text), at = 0;
    while (at < len) {
        ssize_t n = write(fd, text + at, len - at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = errno;
            close(fd);
            return fsdp2_error(FSDP2_ERR_IO, "checkpoint: writing %s: %s", path, strerror(err));
        }
        at += (size_t)n;
    }
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    return rc == 0 ? FSDP2_SUCCESS
                   : fsdp2_error(FSDP2_ERR_IO, "checkpoint: fsync %s: %s", path, strerror(err));
}

/* Rank 0: metadata.json from every rank's chunk list. */
static fsdp2_status_t write_metadata(const fsdp2_state_dict_t *sd, const char *partial,
                                     char **records, int n, const fsdp2_checkpoint_options_t *o)
{
    cJSON *root = cJSON_CreateObject(), *tensors = cJSON_CreateObject(), *extra = cJSON_CreateObject();
    fsdp2_status_t status = FSDP2_SUCCESS;
    cJSON_AddStringToObject(root, "format", "libfsdp2-checkpoint");
    cJSON_AddNumberToObject(root, "version", FSDP2_CHECKPOINT_VERSION);
    cJSON_AddNumberToObject(root, "world_size", n);
    cJSON_AddNumberToObject(root, "step", (double)o->step);
    cJSON_AddNumberToObject(root, "crc32c_block_bytes", CKPT_BLOCK_BYTES);
    if (sd->mesh) {
        int ndim, shape[2] = {1, 1};
        fsdp2_mesh_ndim(sd->mesh, &ndim);
        int64_t s64[2];
        for (int i = 0; i < ndim; i++) {
            fsdp2_mesh_size(sd->mesh, i, &shape[i]);
            s64[i] = shape[i];
        }
        cJSON_AddItemToObject(root, "mesh", ckpt_int_array(s64, ndim));
    }
    if (sd->opt) {
        int64_t steps = 0;
        fsdp2_optimizer_steps(sd->opt, &steps);
        cJSON_AddNumberToObject(root, "optim.step", (double)steps);
        fsdp2_lr_schedule_t ls;
        double base_lr;
        int on = 0;
        fsdp2_optimizer_lr_schedule(sd->opt, &ls, &base_lr, &on);
        if (on) {
            cJSON *o = cJSON_AddObjectToObject(root, "optim.lr_schedule");
            cJSON_AddNumberToObject(o, "kind", (double)ls.kind);
            cJSON_AddNumberToObject(o, "base_lr", base_lr);
            cJSON_AddNumberToObject(o, "step_size", (double)ls.step_size);
            cJSON_AddNumberToObject(o, "gamma", ls.gamma);
            cJSON_AddNumberToObject(o, "warmup", (double)ls.warmup);
            cJSON_AddNumberToObject(o, "total", (double)ls.total);
            cJSON_AddNumberToObject(o, "min_lr", ls.min_lr);
        }
    }
    for (size_t i = 0; i < o->num_extra; i++)
        cJSON_AddStringToObject(extra, o->extra_keys[i], o->extra_values[i]);
    cJSON_AddItemToObject(root, "extra", extra);
    for (size_t i = 0; i < sd->count && status == FSDP2_SUCCESS; i++) {
        sd_block_t b;
        status = sd_block_of(sd, &sd->entries[i], &b);
        if (status != FSDP2_SUCCESS)
            break;
        cJSON *t = cJSON_CreateObject();
        char placements[128] = "whole";
        if (sd->entries[i].dtensor) {
            fsdp2_dtensor_info_t info;
            fsdp2_dtensor_info(sd->entries[i].dtensor, &info);
            fsdp2_placements_format(info.mesh_ndim, info.placements, placements, sizeof(placements));
        }
        cJSON_AddStringToObject(t, "dtype", fsdp2_dtype_name(b.dtype));
        cJSON_AddItemToObject(t, "shape", ckpt_int_array(b.shape, b.ndim));
        cJSON_AddStringToObject(t, "placements", placements);
        cJSON_AddItemToObject(t, "chunks", cJSON_CreateArray());
        cJSON_AddItemToObject(tensors, sd->entries[i].name, t);
    }
    for (int r = 0; r < n && status == FSDP2_SUCCESS; r++) {
        cJSON *chunks = cJSON_Parse(records[r]);
        if (!cJSON_IsArray(chunks)) {
            cJSON_Delete(chunks);
            status = fsdp2_error(FSDP2_ERR_INTERNAL, "checkpoint: rank %d's chunk list is garbled", r);
            break;
        }
        cJSON *c;
        while ((c = cJSON_DetachItemFromArray(chunks, 0))) {
            cJSON *name = cJSON_DetachItemFromObject(c, "name");
            cJSON *t = cJSON_GetObjectItemCaseSensitive(tensors, cJSON_GetStringValue(name));
            cJSON_Delete(name);
            if (!t) {
                cJSON_Delete(c);
                status = fsdp2_error(FSDP2_ERR_INVALID_STATE,
                                     "checkpoint: rank %d saved a tensor rank 0 does not have "
                                     "(are the ranks' models the same?)", r);
                break;
            }
            cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(t, "chunks"), c);
        }
        cJSON_Delete(chunks);
    }
    cJSON_AddItemToObject(root, "tensors", tensors);
    char *text = status == FSDP2_SUCCESS ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (status == FSDP2_SUCCESS && !text)
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint metadata");
    if (status == FSDP2_SUCCESS) {
        char path[4400];
        snprintf(path, sizeof(path), "%s/%s", partial, CKPT_METADATA);
        status = ckpt_write_text(path, text);
    }
    cJSON_free(text);
    return status;
}

void ckpt_clean_path(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "%s", path);
    for (size_t n = strlen(buf); n > 1 && buf[n - 1] == '/'; n--)
        buf[n - 1] = '\0';
}

/* Rank 0: makes partial the checkpoint at dir, atomically. */
fsdp2_status_t ckpt_publish(const char *partial, const char *dir)
{
    FSDP2_CHECK(fsync_path(partial));
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "checkpoint: %s exists and is not a directory", dir);
        if (renameat2(AT_FDCWD, partial, AT_FDCWD, dir, RENAME_EXCHANGE) != 0)
            return fsdp2_error(FSDP2_ERR_IO, "checkpoint: cannot swap %s into %s: %s", partial,
                               dir, strerror(errno));
        /* The new checkpoint is in place: failing to remove the previous one (now at
         * partial; the next save clears it) is not the save's failure. */
        if (ckpt_remove_dir(partial) != FSDP2_SUCCESS)
            FSDP2_LOG(WARN, CKPT, "checkpoint %s saved, but the previous one stays at %s: %s",
                      dir, partial, fsdp2_last_error());
    } else if (rename(partial, dir) != 0) {
        return fsdp2_error(FSDP2_ERR_IO, "checkpoint: cannot rename %s to %s: %s", partial, dir,
                           strerror(errno));
    }
    char parent[4096];
    parent_of(dir, parent, sizeof(parent));
    if (fsync_path(parent) != FSDP2_SUCCESS)
        FSDP2_LOG(WARN, CKPT, "checkpoint %s saved, but fsync of its parent failed: %s", dir,
                  fsdp2_last_error());
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_save_args(const fsdp2_state_dict_t *sd, const char *dir,
                                      const fsdp2_checkpoint_options_t *o)
{
    FSDP2_ARG_CHECK(sd && dir && dir[0], "checkpoint save: state dict or dir is NULL or empty");
    FSDP2_ARG_CHECK(strlen(dir) < 3000, "checkpoint save: path '%.40s...' is too long", dir);
    fsdp2_checkpoint_options_t copy = FSDP2_CHECKPOINT_OPTIONS_INIT;
    FSDP2_CHECK(fsdp2_options_copy("checkpoint options", &copy, sizeof(copy), o, NULL, 0));
    FSDP2_ARG_CHECK(o->num_extra == 0 || (o->extra_keys && o->extra_values),
                    "checkpoint save: %zu extra entries but no arrays", o->num_extra);
    for (size_t i = 0; i < o->num_extra; i++)
        FSDP2_ARG_CHECK(o->extra_keys[i] && o->extra_values[i],
                        "checkpoint save: extra entry %zu is NULL", i);
    FSDP2_ARG_CHECK(sd->mesh, "checkpoint save: the state dict has no DTensor, so no mesh to "
                              "save over");
    for (size_t i = 0; i < sd->count; i++)
        if (sd_entry_unmaterialized(&sd->entries[i]))
            return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                               "checkpoint save: '%s' was declared on meta and never "
                               "materialized (fsdp2_module_materialize)",
                               sd->entries[i].name);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t save(const fsdp2_state_dict_t *sd, const char *dir, const char *partial,
                           int rank, const fsdp2_checkpoint_options_t *o);

fsdp2_status_t fsdp2_checkpoint_save(const fsdp2_state_dict_t *sd, const char *dir,
                                     const fsdp2_checkpoint_options_t *options)
{
    fsdp2_checkpoint_options_t defaults = FSDP2_CHECKPOINT_OPTIONS_INIT;
    const fsdp2_checkpoint_options_t *o = options ? options : &defaults;
    FSDP2_CHECK(check_save_args(sd, dir, o));
    int rank, size;
    FSDP2_CHECK(ckpt_mesh_rank(sd->mesh, &rank, &size));
    char clean[4096], partial[4200];
    ckpt_clean_path(dir, clean, sizeof(clean));
    snprintf(partial, sizeof(partial), "%s.partial", clean);
    fsdp2_status_t status = save(sd, clean, partial, rank, o);
    /* Where the ranks could not agree (an exchange failed and the mesh failed with it),
     * nothing half made stays: rank 0, which alone publishes, removes the partial
     * directory, again while a peer's file appears in it (a peer that has not yet learned
     * of the failure may still be writing; once the directory is gone it cannot create
     * one). Only rank 0 touches it: a peer that fails after the exchange it needed could
     * otherwise take a file from a checkpoint rank 0 is publishing. */
    if (status != FSDP2_SUCCESS) {
        char keep[1024];
        snprintf(keep, sizeof(keep), "%s", fsdp2_last_error());
        struct stat st;
        for (int tries = 0;
             rank == 0 && tries < 40 && stat(partial, &st) == 0 && S_ISDIR(st.st_mode);
             tries++) {
            if (ckpt_remove_dir(partial) == FSDP2_SUCCESS)
                break;
            struct timespec nap = {0, 25 * 1000 * 1000};
            nanosleep(&nap, NULL);
        }
        fsdp2_error(status, "%s", keep);
    }
    return status;
}

static fsdp2_status_t save(const fsdp2_state_dict_t *sd, const char *dir, const char *partial,
                           int rank, const fsdp2_checkpoint_options_t *o)
{

    /* 1. Rank 0 clears a stale partial directory and makes a fresh one. */
    fsdp2_status_t mine = FSDP2_SUCCESS;
    struct stat st;
    if (rank == 0 && stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        mine = fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "checkpoint save: %s exists and is not a directory", dir);
    else if (rank == 0) {
        mine = ckpt_remove_dir(partial);
        if (mine == FSDP2_SUCCESS && mkdir(partial, 0755) != 0)
            mine = fsdp2_error(FSDP2_ERR_IO, "checkpoint: cannot create %s: %s", partial,
                               strerror(errno));
    }
    char **texts;
    int n;
    FSDP2_CHECK(agree(sd->mesh, mine, &texts, &n));
    fsdp2_status_t status = first_failure(texts, n, "checkpoint save");
    ckpt_texts_free(texts, n);
    if (status != FSDP2_SUCCESS)
        return status;

    /* 2. Every rank writes its file; the chunk lists (or errors) go to everyone. */
    char *record = NULL;
    mine = write_rank_file(sd, partial, rank, &record);
    char *failure = NULL;
    if (mine != FSDP2_SUCCESS) {
        size_t len = strlen(fsdp2_last_error()) + 16;
        failure = fsdp2_malloc(len);
        if (failure)
            snprintf(failure, len, "!%d %s", (int)mine, fsdp2_last_error());
    }
    status = ckpt_all_texts(sd->mesh, failure ? failure : record ? record : "!19 out of memory",
                            &texts, &n);
    free(failure);
    free(record);
    if (status != FSDP2_SUCCESS)
        return status;
    for (int r = 0; r < n && status == FSDP2_SUCCESS; r++) {
        if (texts[r][0] == '!')
            status = fsdp2_error((fsdp2_status_t)atoi(texts[r] + 1), "checkpoint save: rank %d: %s",
                                 r, strchr(texts[r], ' ') ? strchr(texts[r], ' ') + 1 : "");
    }

    /* 3. Rank 0 writes the metadata and publishes; everyone learns how that went. */
    mine = FSDP2_SUCCESS;
    if (rank == 0) {
        if (status == FSDP2_SUCCESS)
            mine = write_metadata(sd, partial, texts, n, o);
        if (status == FSDP2_SUCCESS && mine == FSDP2_SUCCESS) {
            /* Read back what we wrote with the loader's checks (chunk tiling included)
             * before anything becomes visible. */
            meta_t check;
            mine = meta_load(partial, &check);
            meta_free(&check);
        }
        if (status == FSDP2_SUCCESS && mine == FSDP2_SUCCESS)
            mine = ckpt_publish(partial, dir);
        if (status != FSDP2_SUCCESS || mine != FSDP2_SUCCESS) {
            char keep[700];
            snprintf(keep, sizeof(keep), "%s", fsdp2_last_error());
            ckpt_remove_dir(partial);
            fsdp2_error(mine != FSDP2_SUCCESS ? mine : status, "%s", keep);
        }
    }
    ckpt_texts_free(texts, n);
    if (status != FSDP2_SUCCESS) {
        /* Every rank knows already; still take part in the last exchange. */
        char keep[700];
        snprintf(keep, sizeof(keep), "%s", fsdp2_last_error());
        if (agree(sd->mesh, FSDP2_SUCCESS, &texts, &n) == FSDP2_SUCCESS)
            ckpt_texts_free(texts, n);
        return fsdp2_error(status, "%s", keep);
    }
    FSDP2_CHECK(agree(sd->mesh, mine, &texts, &n));
    status = first_failure(texts, n, "checkpoint save");
    ckpt_texts_free(texts, n);
    return status;
}

fsdp2_status_t fsdp2_checkpoint_export_full(const fsdp2_state_dict_t *sd, const char *path)
{
    FSDP2_ARG_CHECK(sd && path && path[0], "export_full: state dict or path is NULL or empty");
    FSDP2_ARG_CHECK(sd->mesh, "export_full: the state dict has no DTensor");
    for (size_t i = 0; i < sd->count; i++)
        if (sd_entry_unmaterialized(&sd->entries[i]))
            return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                               "export_full: '%s' was declared on meta and never materialized",
                               sd->entries[i].name);
    FSDP2_ARG_CHECK(strlen(path) < 4000, "export_full: path is too long");
    int rank, size;
    FSDP2_CHECK(ckpt_mesh_rank(sd->mesh, &rank, &size));
    char partial[4096];
    snprintf(partial, sizeof(partial), "%s.partial", path);
    fsdp2_status_t mine = FSDP2_SUCCESS;
    st_writer_t *w = NULL;
    if (rank == 0) {
        unlink(partial);
        mine = st_writer_create(partial, &w);
        for (size_t i = 0; i < sd->count && mine == FSDP2_SUCCESS; i++) {
            sd_block_t b;
            if (sd->entries[i].optimizer)
                continue;
            mine = sd_block_of(sd, &sd->entries[i], &b);
            if (mine == FSDP2_SUCCESS)
                mine = st_writer_add(w, sd->entries[i].name, b.dtype, b.ndim, b.shape);
        }
        if (mine == FSDP2_SUCCESS)
            mine = st_writer_meta(w, "format", "pt");
        if (mine == FSDP2_SUCCESS)
            mine = st_writer_begin(w, NULL);
    }
    /* Every rank takes part in every gather, even after rank 0 failed: no hang. */
    fsdp2_status_t comm = FSDP2_SUCCESS;
    for (size_t i = 0; i < sd->count && comm == FSDP2_SUCCESS; i++) {
        const sd_entry_t *e = &sd->entries[i];
        if (e->optimizer)
            continue;
        fsdp2_tensor_t *full = NULL;
        if (e->dtensor) {
            comm = fsdp2_dtensor_full_tensor(e->dtensor, NULL, &full);
            if (comm != FSDP2_SUCCESS)
                break;
        } else if (fsdp2_tensor_retain(e->tensor, &full) != FSDP2_SUCCESS) {
            if (mine == FSDP2_SUCCESS)
                mine = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "export_full: '%s'", e->name);
            continue;
        }
        if (rank == 0 && mine == FSDP2_SUCCESS) {
            if (full->device.type != FSDP2_DEVICE_CPU && full->numel)
                mine = fsdp2_error(FSDP2_ERR_UNSUPPORTED, "export_full: '%s' is not on the cpu",
                                   e->name);
            else if (full->nbytes)
                mine = st_writer_write(w, full->data, full->nbytes);
        }
        fsdp2_tensor_release(full);
    }
    if (rank == 0) {
        if (mine == FSDP2_SUCCESS && comm == FSDP2_SUCCESS)
            mine = st_writer_finish(w);
        else
            st_writer_abort(w);
        if (mine == FSDP2_SUCCESS && comm == FSDP2_SUCCESS && rename(partial, path) != 0) {
            mine = fsdp2_error(FSDP2_ERR_IO, "export_full: cannot rename %s to %s: %s", partial,
                               path, strerror(errno));
            unlink(partial);
        }
    }
    if (comm != FSDP2_SUCCESS)
        return comm;
    char **texts;
    int n;
    FSDP2_CHECK(agree(sd->mesh, mine, &texts, &n));
    fsdp2_status_t status = first_failure(texts, n, "export_full");
    ckpt_texts_free(texts, n);
    return status;
}
