/* Loading with resharding: metadata.json says where every chunk of every tensor lies;
 * each rank intersects its own block of each tensor with the chunks (row ranges of
 * dim 0) and reads just those bytes, rounded out to the checksum blocks it verifies. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "collectives/mesh_fail.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/options.h"

/* Appends name to a comma-separated list, marking truncation with "...". */
static void list_add(char *list, size_t len, const char *name)
{
    size_t used = strlen(list);
    if (used + strlen(name) + 6 >= len) {
        if (used + 4 < len && (used < 3 || strcmp(list + used - 3, "...")))
            snprintf(list + used, len - used, "...");
        return;
    }
    snprintf(list + used, len - used, "%s%s", used ? ", " : "", name);
}

/* Fills this rank's block of e from the chunks of t. */
static fsdp2_status_t load_entry(open_files_t *of, const meta_t *m, const fsdp2_state_dict_t *sd,
                                 const sd_entry_t *e, const meta_tensor_t *t, uint64_t *bytes_read)
{
    sd_block_t b;
    FSDP2_CHECK(sd_block_of(sd, e, &b));
    if (b.data->numel == 0)
        return FSDP2_SUCCESS;
    if (b.data->device.type != FSDP2_DEVICE_CPU)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "checkpoint load: '%s' is not on the cpu",
                           e->name);
    int64_t lo = b.ndim ? b.offset[0] : 0, hi = lo + (b.ndim ? b.local[0] : 1);
    size_t row_bytes = b.data->nbytes / (size_t)(hi - lo);
    for (size_t i = 0; i < t->num_chunks; i++) {
        const chunk_t *k = &t->chunks[i];
        int64_t a = lo > k->row0 ? lo : k->row0, z = hi < k->row0 + k->rows ? hi : k->row0 + k->rows;
        if (a >= z)
            continue;
        FSDP2_CHECK(meta_read_rows(of, m, t, k, a, z, (char *)b.data->data + (size_t)(a - lo) * row_bytes,
                              bytes_read));
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_report(fsdp2_checkpoint_report_t *report,
                                   const fsdp2_checkpoint_options_t **o,
                                   const fsdp2_checkpoint_options_t *defaults)
{
    if (!*o)
        *o = defaults;
    fsdp2_checkpoint_options_t copy = FSDP2_CHECKPOINT_OPTIONS_INIT;
    FSDP2_CHECK(fsdp2_options_copy("checkpoint options", &copy, sizeof(copy), *o, NULL, 0));
    if (report) {
        FSDP2_ARG_CHECK(report->size == sizeof(*report),
                        "checkpoint: report size %u is not sizeof(fsdp2_checkpoint_report_t) = %zu",
                        report->size, sizeof(*report));
        memset(report, 0, sizeof(*report));
        report->size = sizeof(*report);
    }
    return FSDP2_SUCCESS;
}

/* Compares the state dict with what the source holds: fills the report; in strict mode
 * any difference is an error naming the first one. */
typedef const void *(*find_fn)(const void *src, const char *name, fsdp2_dtype_t *dtype, int *ndim,
                               int64_t *shape);

static fsdp2_status_t compare(const fsdp2_state_dict_t *sd, int skip_optimizer, const void *src,
                              find_fn find, const char *const *names, size_t num_names,
                              int strict, fsdp2_checkpoint_report_t *r, const char *what)
{
    for (size_t i = 0; i < sd->count; i++) {
        const sd_entry_t *e = &sd->entries[i];
        if (skip_optimizer && e->optimizer)
            continue;
        sd_block_t b;
        FSDP2_CHECK(sd_block_of(sd, e, &b));
        fsdp2_dtype_t dtype;
        int ndim;
        int64_t shape[FSDP2_MAX_DIMS];
        if (!find(src, e->name, &dtype, &ndim, shape)) {
            r->missing++;
            list_add(r->missing_names, sizeof(r->missing_names), e->name);
            if (strict)
                return fsdp2_error(FSDP2_ERR_NOT_FOUND, "%s: '%s' is not in the checkpoint", what,
                                   e->name);
            continue;
        }
        if (dtype != b.dtype || ndim != b.ndim || memcmp(shape, b.shape, sizeof(int64_t) * (size_t)ndim)) {
            r->mismatched++;
            list_add(r->mismatched_names, sizeof(r->mismatched_names), e->name);
            if (strict) {
                char have[96], want[96];
                fsdp2_shape_format(ndim, shape, have, sizeof(have));
                fsdp2_shape_format(b.ndim, b.shape, want, sizeof(want));
                return fsdp2_error(FSDP2_ERR_SHAPE_MISMATCH,
                                   "%s: '%s' is %s %s in the checkpoint but %s %s in the model",
                                   what, e->name, fsdp2_dtype_name(dtype), have,
                                   fsdp2_dtype_name(b.dtype), want);
            }
        }
    }
    for (size_t i = 0; i < num_names; i++) {
        int known = 0;
        for (size_t k = 0; k < sd->count && !known; k++)
            known = !strcmp(sd->entries[k].name, names[i]);
        if (known)
            continue;
        r->unexpected++;
        list_add(r->unexpected_names, sizeof(r->unexpected_names), names[i]);
        if (strict)
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "%s: the checkpoint has '%s', which the model does not", what,
                               names[i]);
    }
    return FSDP2_SUCCESS;
}

static const void *find_meta(const void *src, const char *name, fsdp2_dtype_t *dtype, int *ndim,
                             int64_t *shape)
{
    const meta_tensor_t *t = meta_find(src, name);
    if (t) {
        *dtype = t->dtype;
        *ndim = t->ndim;
        memcpy(shape, t->shape, sizeof(int64_t) * FSDP2_MAX_DIMS);
    }
    return t;
}

fsdp2_status_t fsdp2_checkpoint_load(fsdp2_state_dict_t *sd, const char *dir,
                                     const fsdp2_checkpoint_options_t *options,
                                     fsdp2_checkpoint_report_t *report)
{
    FSDP2_ARG_CHECK(sd && dir && dir[0], "checkpoint load: state dict or dir is NULL or empty");
    FSDP2_ARG_CHECK(strlen(dir) < 3000, "checkpoint load: path is too long");
    fsdp2_checkpoint_options_t defaults = FSDP2_CHECKPOINT_OPTIONS_INIT;
    fsdp2_checkpoint_report_t local = {.size = sizeof(local)};
    FSDP2_CHECK(check_report(report, &options, &defaults));
    fsdp2_checkpoint_report_t *r = report ? report : &local;
    meta_t m;
    fsdp2_status_t status = meta_load(dir, &m);
    const char **names = NULL;
    if (status == FSDP2_SUCCESS) {
        r->version = m.version;
        r->step = m.step;
        r->saved_world_size = m.world_size;
        names = fsdp2_calloc(m.num_tensors ? m.num_tensors : 1, sizeof(*names));
        if (!names)
            status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint load");
    }
    for (size_t i = 0; status == FSDP2_SUCCESS && i < m.num_tensors; i++)
        names[i] = m.tensors[i].name;
    if (status == FSDP2_SUCCESS)
        status = compare(sd, 0, &m, find_meta, names, m.num_tensors, options->strict, r,
                         "checkpoint load");
    open_files_t *of = status == FSDP2_SUCCESS ? fsdp2_calloc(1, sizeof(*of)) : NULL;
    if (status == FSDP2_SUCCESS && !of)
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint load");
    if (of)
        snprintf(of->dir, sizeof(of->dir), "%s", dir);
    /* What the files hold (a missing checkpoint, a corrupt or mismatched tensor: the
     * same for every rank that reads it) is an error the caller can mend and load again,
     * with the groups usable. A failure that may be this rank's alone (memory, a read,
     * the device) fails its mesh together: its peers would go on without it. */
    for (size_t i = 0; i < sd->count && status == FSDP2_SUCCESS; i++) {
        const sd_entry_t *e = &sd->entries[i];
        const meta_tensor_t *t = meta_find(&m, e->name);
        if (!t)
            continue;
        sd_block_t b;
        status = sd_block_of(sd, e, &b);
        if (status != FSDP2_SUCCESS)
            break;
        if (t->dtype != b.dtype || t->ndim != b.ndim ||
            memcmp(t->shape, b.shape, sizeof(int64_t) * (size_t)b.ndim))
            continue; /* reported as mismatched (non-strict) */
        status = load_entry(of, &m, sd, e, t, &r->bytes_read);
        if (status == FSDP2_SUCCESS) {
            r->loaded++;
            sd_entry_materialized(e);
        }
    }
    if (status == FSDP2_SUCCESS && sd->opt && m.has_optim_step)
        status = fsdp2_optimizer_set_steps(sd->opt, m.optim_step);
    if (status == FSDP2_SUCCESS && sd->opt && m.has_lr_schedule) /* validated by meta_load */
        status = fsdp2_optimizer_set_lr_schedule(sd->opt, &m.lr_schedule, m.base_lr);
    for (int i = 0; of && i < of->count; i++)
        st_close(&of->files[i]);
    free(of);
    free(names);
    meta_free(&m);
    if (status == FSDP2_ERR_OUT_OF_MEMORY || status == FSDP2_ERR_IO ||
        status == FSDP2_ERR_BACKEND || status == FSDP2_ERR_INTERNAL)
        fsdp2_mesh_fail(sd->mesh, status);
    return status;
}

fsdp2_status_t fsdp2_checkpoint_extra(const char *dir, const char *key, char *buf, size_t len)
{
    FSDP2_ARG_CHECK(dir && key && buf && len > 0, "checkpoint_extra: an argument is NULL");
    meta_t m;
    fsdp2_status_t status = meta_load(dir, &m);
    if (status == FSDP2_SUCCESS) {
        const cJSON *extra = cJSON_GetObjectItemCaseSensitive(m.root, "extra");
        const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(extra, key));
        if (v && strlen(v) >= len)
            status = fsdp2_error(FSDP2_ERR_OVERFLOW,
                                 "checkpoint %s: extra entry '%s' has %zu characters, the buffer "
                                 "holds %zu",
                                 dir, key, strlen(v), len - 1);
        else if (v)
            snprintf(buf, len, "%s", v);
        else
            status = fsdp2_error(FSDP2_ERR_NOT_FOUND, "checkpoint %s has no extra entry '%s'",
                                 dir, key);
    }
    meta_free(&m);
    return status;
}

static const void *find_st(const void *src, const char *name, fsdp2_dtype_t *dtype, int *ndim,
                           int64_t *shape)
{
    const st_entry_t *e = st_find(src, name);
    if (e) {
        *dtype = e->dtype;
        *ndim = e->ndim;
        memcpy(shape, e->shape, sizeof(int64_t) * FSDP2_MAX_DIMS);
    }
    return e;
}

fsdp2_status_t fsdp2_checkpoint_import_full(fsdp2_state_dict_t *sd, const char *path,
                                            const fsdp2_checkpoint_options_t *options,
                                            fsdp2_checkpoint_report_t *report)
{
    FSDP2_ARG_CHECK(sd && path, "import_full: state dict or path is NULL");
    fsdp2_checkpoint_options_t defaults = FSDP2_CHECKPOINT_OPTIONS_INIT;
    fsdp2_checkpoint_report_t local = {.size = sizeof(local)};
    FSDP2_CHECK(check_report(report, &options, &defaults));
    fsdp2_checkpoint_report_t *r = report ? report : &local;
    st_file_t f;
    FSDP2_CHECK(st_open(path, &f));
    const char **names = fsdp2_calloc(f.num_entries ? f.num_entries : 1, sizeof(*names));
    fsdp2_status_t status = names ? FSDP2_SUCCESS : fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "import");
    for (size_t i = 0; names && i < f.num_entries; i++)
        names[i] = f.entries[i].name;
    if (status == FSDP2_SUCCESS)
        status = compare(sd, 1, &f, find_st, names, f.num_entries, options->strict, r,
                         "import_full");
    for (size_t i = 0; i < sd->count && status == FSDP2_SUCCESS; i++) {
        const sd_entry_t *e = &sd->entries[i];
        const st_entry_t *se = e->optimizer ? NULL : st_find(&f, e->name);
        if (!se)
            continue;
        sd_block_t b;
        status = sd_block_of(sd, e, &b);
        if (status != FSDP2_SUCCESS || se->dtype != b.dtype || se->ndim != b.ndim ||
            memcmp(se->shape, b.shape, sizeof(int64_t) * (size_t)b.ndim))
            continue;
        if (b.data->numel && b.data->device.type != FSDP2_DEVICE_CPU) {
            status = fsdp2_error(FSDP2_ERR_UNSUPPORTED, "import_full: '%s' is not on the cpu",
                                 e->name);
            break;
        }
        /* Rows [offset, offset + local) are contiguous in the file. */
        uint64_t row_bytes = b.ndim && b.shape[0] ? (se->end - se->begin) / (uint64_t)b.shape[0]
                                                  : se->end - se->begin;
        uint64_t start = b.ndim ? (uint64_t)b.offset[0] * row_bytes : 0;
        if (b.data->nbytes)
            status = st_read(&f, se, start, b.data->data, b.data->nbytes);
        if (status == FSDP2_SUCCESS) {
            r->loaded++;
            r->bytes_read += b.data->nbytes;
            sd_entry_materialized(e);
        }
    }
    free(names);
    st_close(&f);
    return status;
}

static const sd_entry_t *sd_find(const fsdp2_state_dict_t *sd, const char *name)
{
    size_t lo = 0, hi = sd->count; /* entries are sorted by name */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(sd->entries[mid].name, name);
        if (!c)
            return &sd->entries[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

typedef struct sd_source {
    const fsdp2_state_dict_t *sd;
} sd_source_t;

static const void *find_sd(const void *src, const char *name, fsdp2_dtype_t *dtype, int *ndim,
                           int64_t *shape)
{
    const sd_source_t *s = src;
    const sd_entry_t *e = sd_find(s->sd, name);
    sd_block_t b;
    if (!e || sd_block_of(s->sd, e, &b) != FSDP2_SUCCESS)
        return NULL;
    *dtype = b.dtype;
    *ndim = b.ndim;
    memcpy(shape, b.shape, sizeof(int64_t) * FSDP2_MAX_DIMS);
    return e;
}

/* Fills dst's block of d from s (same dtype and global shape). */
static fsdp2_status_t copy_entry(const fsdp2_state_dict_t *dst, const sd_entry_t *d,
                                 const fsdp2_state_dict_t *src, const sd_entry_t *s)
{
    sd_block_t db, sb;
    FSDP2_CHECK(sd_block_of(dst, d, &db));
    FSDP2_CHECK(sd_block_of(src, s, &sb));
    if (db.data->numel == 0)
        return FSDP2_SUCCESS;
    if (db.data->device.type != FSDP2_DEVICE_CPU || sb.data->device.type != FSDP2_DEVICE_CPU)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "load_state_dict: '%s' is not on the cpu",
                           d->name);
    if (s->tensor) { /* whole: take this block's rows */
        size_t row_bytes = db.ndim ? db.data->nbytes / (size_t)db.local[0] : db.data->nbytes;
        size_t at = db.ndim ? (size_t)db.offset[0] * row_bytes : 0;
        memcpy(db.data->data, (const char *)sb.data->data + at, db.data->nbytes);
        return FSDP2_SUCCESS;
    }
    fsdp2_dtensor_info_t di, si;
    fsdp2_mesh_t *dm = NULL, *sm = NULL;
    if (d->dtensor) {
        FSDP2_CHECK(fsdp2_dtensor_info(d->dtensor, &di));
        FSDP2_CHECK(fsdp2_dtensor_mesh(d->dtensor, &dm));
    }
    FSDP2_CHECK(fsdp2_dtensor_info(s->dtensor, &si));
    FSDP2_CHECK(fsdp2_dtensor_mesh(s->dtensor, &sm));
    int same = d->dtensor && dm == sm && di.mesh_ndim == si.mesh_ndim &&
               !memcmp(di.local_shape, si.local_shape, sizeof(di.local_shape)) &&
               !memcmp(di.offset, si.offset, sizeof(di.offset));
    if (!same)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "load_state_dict: '%s' is laid out differently in the source (another "
                           "mesh or placements); reshard it through a checkpoint",
                           d->name);
    memcpy(db.data->data, sb.data->data, db.data->nbytes);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_load_state_dict(fsdp2_state_dict_t *dst, const fsdp2_state_dict_t *src,
                                     const fsdp2_checkpoint_options_t *options,
                                     fsdp2_checkpoint_report_t *report)
{
    FSDP2_ARG_CHECK(dst && src, "load_state_dict: dst or src is NULL");
    fsdp2_checkpoint_options_t defaults = FSDP2_CHECKPOINT_OPTIONS_INIT;
    fsdp2_checkpoint_report_t local = {.size = sizeof(local)};
    FSDP2_CHECK(check_report(report, &options, &defaults));
    fsdp2_checkpoint_report_t *r = report ? report : &local;
    const char **names = fsdp2_calloc(src->count ? src->count : 1, sizeof(*names));
    if (!names)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "load_state_dict");
    for (size_t i = 0; i < src->count; i++)
        names[i] = src->entries[i].name;
    sd_source_t source = {src};
    fsdp2_status_t status = compare(dst, 0, &source, find_sd, names, src->count,
                                    options->strict, r, "load_state_dict");
    free(names);
    for (size_t i = 0; i < dst->count && status == FSDP2_SUCCESS; i++) {
        const sd_entry_t *d = &dst->entries[i], *s = sd_find(src, d->name);
        fsdp2_dtype_t dtype;
        int ndim;
        int64_t shape[FSDP2_MAX_DIMS];
        sd_block_t db;
        if (!s || !find_sd(&source, d->name, &dtype, &ndim, shape))
            continue;
        status = sd_block_of(dst, d, &db);
        if (status != FSDP2_SUCCESS)
            break;
        if (dtype != db.dtype || ndim != db.ndim || memcmp(shape, db.shape, sizeof(int64_t) * (size_t)ndim))
            continue; /* reported as mismatched (non-strict) */
        status = copy_entry(dst, d, src, s);
        if (status == FSDP2_SUCCESS) {
            r->loaded++;
            r->bytes_read += db.data->nbytes;
        }
    }
    return status;
}
