/* safetensors writer (format: safetensors.h): the header first, from the declared
 * tensors, then the data in declaration order through a buffer; any failure removes the
 * file. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fault.h"

/* The writer's buffer; writes of at least this size go straight to the file. */
#define ST_WRITE_BUFFER (1u << 20)

/* ---------------------------------------------------------------------------------- */
/* Writing                                                                             */

typedef struct st_writer_tensor {
    char *name;
    fsdp2_dtype_t dtype;
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
    uint64_t begin, end;
} st_writer_tensor_t;

/* Open addressing over names, so add and offset stay O(1) for thousands of tensors. */
typedef struct name_set {
    size_t *slots; /* index + 1; 0 is empty */
    size_t cap;    /* a power of two, or 0 */
} name_set_t;

enum st_writer_state { ST_DECLARING, ST_WRITING, ST_FAILED };

struct st_writer {
    char *path;
    int fd;
    enum st_writer_state state;
    st_writer_tensor_t *tensors;
    size_t num_tensors, cap_tensors;
    name_set_t names;
    st_meta_t *meta;
    size_t num_meta, cap_meta;
    uint64_t data_start, data_size, written;
    unsigned char *buf;
    size_t buf_len;
};

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

/* The slot holding name, or the empty slot where it would go. */
static size_t *name_slot(const st_writer_t *w, const char *name)
{
    size_t mask = w->names.cap - 1;
    for (size_t i = (size_t)name_hash(name) & mask;; i = (i + 1) & mask) {
        size_t *slot = &w->names.slots[i];
        if (*slot == 0 || strcmp(w->tensors[*slot - 1].name, name) == 0)
            return slot;
    }
}

static const st_writer_tensor_t *writer_find(const st_writer_t *w, const char *name)
{
    if (w->names.cap == 0)
        return NULL;
    size_t *slot = name_slot(w, name);
    return *slot == 0 ? NULL : &w->tensors[*slot - 1];
}

/* Makes room for one more tensor (kept at most half full). */
static fsdp2_status_t writer_reserve(st_writer_t *w)
{
    if (w->num_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        st_writer_tensor_t *t = realloc(w->tensors, cap * sizeof(*t));
        if (t == NULL)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: %zu tensors", w->path, cap);
        w->tensors = t;
        w->cap_tensors = cap;
    }
    if (2 * (w->num_tensors + 1) > w->names.cap) {
        name_set_t old = w->names;
        w->names.cap = old.cap ? 2 * old.cap : 32;
        w->names.slots = fsdp2_calloc(w->names.cap, sizeof(size_t));
        if (w->names.slots == NULL) {
            w->names = old;
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: name table", w->path);
        }
        for (size_t i = 0; i < w->num_tensors; i++)
            *name_slot(w, w->tensors[i].name) = i + 1;
        free(old.slots);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t st_writer_create(const char *path, st_writer_t **out)
{
    FSDP2_ARG_CHECK(path != NULL && out != NULL, "st_writer_create: path=%p w=%p",
                    (const void *)path, (void *)out);
    *out = NULL;
    st_writer_t *w = fsdp2_calloc(1, sizeof(*w));
    if (w == NULL || (w->path = strdup(path)) == NULL ||
        (w->buf = fsdp2_malloc(ST_WRITE_BUFFER)) == NULL) {
        if (w != NULL) {
            free(w->path);
            free(w);
        }
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: writer", path);
    }
    w->fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        fsdp2_status_t status = fsdp2_error(FSDP2_ERR_IO, "%s: create: %s", path, strerror(errno));
        free(w->buf);
        free(w->path);
        free(w);
        return status;
    }
    *out = w;
    return FSDP2_SUCCESS;
}

fsdp2_status_t st_writer_add(st_writer_t *w, const char *name, fsdp2_dtype_t dtype, int ndim,
                             const int64_t *shape)
{
    FSDP2_ARG_CHECK(w != NULL && name != NULL, "st_writer_add: w=%p name=%p", (void *)w,
                    (const void *)name);
    if (w->state != ST_DECLARING)
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "%s: tensor '%s' added after st_writer_begin",
                           w->path, name);
    size_t name_len = strlen(name);
    FSDP2_ARG_CHECK(name_len < ST_NAME_MAX && st_utf8_valid(name) &&
                        strcmp(name, "__metadata__") != 0,
                    "%s: tensor name '%.64s' (%zu bytes) is reserved, not UTF-8 or longer than %d",
                    w->path, name, name_len, ST_NAME_MAX - 1);
    FSDP2_ARG_CHECK(writer_find(w, name) == NULL, "%s: tensor '%s' added twice", w->path, name);
    size_t elem;
    FSDP2_ARG_CHECK(fsdp2_dtype_size(dtype, &elem) == FSDP2_SUCCESS,
                    "%s: tensor '%s': dtype %d", w->path, name, (int)dtype);
    FSDP2_ARG_CHECK(ndim >= 0 && ndim <= FSDP2_MAX_DIMS && (shape != NULL || ndim == 0),
                    "%s: tensor '%s': ndim %d (0 .. %d) shape=%p", w->path, name, ndim,
                    FSDP2_MAX_DIMS, (const void *)shape);
    uint64_t bytes = elem;
    int overflow = 0, empty = 0;
    for (int d = 0; d < ndim; d++) {
        FSDP2_ARG_CHECK(shape[d] >= 0 && (uint64_t)shape[d] <= ST_MAX_EXACT,
                        "%s: tensor '%s': dimension %d is %" PRId64 " (0 .. 2^53)", w->path, name,
                        d, shape[d]);
        empty |= shape[d] == 0;
        overflow |= __builtin_mul_overflow(bytes, (uint64_t)shape[d], &bytes);
    }
    if (empty)
        bytes = 0;
    else if (overflow)
        return fsdp2_error(FSDP2_ERR_OVERFLOW, "%s: tensor '%s': size overflows 64 bits", w->path,
                           name);
    uint64_t begin = w->data_size;
    if (bytes > ST_MAX_EXACT - begin)
        return fsdp2_error(FSDP2_ERR_OVERFLOW,
                           "%s: tensor '%s': the data section would pass 2^53 bytes", w->path,
                           name);
    FSDP2_CHECK(writer_reserve(w));
    st_writer_tensor_t *t = &w->tensors[w->num_tensors];
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    if (t->name == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: tensor '%s'", w->path, name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    t->begin = begin;
    t->end = begin + bytes;
    w->data_size = t->end;
    *name_slot(w, name) = ++w->num_tensors;
    return FSDP2_SUCCESS;
}

fsdp2_status_t st_writer_meta(st_writer_t *w, const char *key, const char *value)
{
    FSDP2_ARG_CHECK(w != NULL && key != NULL && value != NULL, "st_writer_meta: w=%p key=%p value=%p",
                    (void *)w, (const void *)key, (const void *)value);
    if (w->state != ST_DECLARING)
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "%s: metadata '%s' added after st_writer_begin",
                           w->path, key);
    FSDP2_ARG_CHECK(st_utf8_valid(key) && st_utf8_valid(value), "%s: metadata '%s' is not UTF-8",
                    w->path, key);
    for (size_t i = 0; i < w->num_meta; i++) /* a handful of keys: no index */
        FSDP2_ARG_CHECK(strcmp(w->meta[i].key, key) != 0, "%s: metadata '%s' added twice", w->path,
                        key);
    if (w->num_meta == w->cap_meta) {
        size_t cap = w->cap_meta ? 2 * w->cap_meta : 8;
        st_meta_t *m = realloc(w->meta, cap * sizeof(*m));
        if (m == NULL)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: metadata", w->path);
        w->meta = m;
        w->cap_meta = cap;
    }
    st_meta_t *m = &w->meta[w->num_meta];
    m->key = strdup(key);
    m->value = strdup(value);
    if (m->key == NULL || m->value == NULL) {
        free(m->key);
        free(m->value);
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: metadata '%s'", w->path, key);
    }
    w->num_meta++;
    return FSDP2_SUCCESS;
}

/* Integers go in as raw JSON text: cJSON would print a double, and "1e+15" is not what
 * the Python package accepts for an offset. */
static cJSON *json_uint_text(uint64_t v)
{
    char text[24];
    snprintf(text, sizeof(text), "%" PRIu64, v);
    return cJSON_CreateRaw(text);
}

static int add_item(cJSON *parent, const char *key, cJSON *item)
{
    if (item == NULL)
        return 0;
    if (key == NULL ? !cJSON_AddItemToArray(parent, item) : !cJSON_AddItemToObject(parent, key, item)) {
        cJSON_Delete(item);
        return 0;
    }
    return 1;
}

/* The header: __metadata__ first, then the tensors in declaration order. */
static cJSON *build_header(const st_writer_t *w)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && w->num_meta > 0) {
        cJSON *meta = cJSON_CreateObject();
        ok = add_item(root, "__metadata__", meta);
        for (size_t i = 0; ok && i < w->num_meta; i++)
            ok = add_item(meta, w->meta[i].key, cJSON_CreateString(w->meta[i].value));
    }
    for (size_t i = 0; ok && i < w->num_tensors; i++) {
        const st_writer_tensor_t *t = &w->tensors[i];
        cJSON *entry = cJSON_CreateObject(), *shape = cJSON_CreateArray(),
              *offsets = cJSON_CreateArray();
        ok = add_item(root, t->name, entry);
        ok = add_item(entry, "dtype", cJSON_CreateString(st_dtype_name(t->dtype))) && ok;
        ok = add_item(entry, "shape", shape) && ok;
        ok = add_item(entry, "data_offsets", offsets) && ok;
        for (int d = 0; ok && d < t->ndim; d++)
            ok = add_item(shape, NULL, json_uint_text((uint64_t)t->shape[d]));
        ok = ok && add_item(offsets, NULL, json_uint_text(t->begin)) &&
             add_item(offsets, NULL, json_uint_text(t->end));
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static fsdp2_status_t write_all(st_writer_t *w, const void *data, size_t len)
{
    const unsigned char *p = data;
    if (fsdp2_fault_hit(FAULT_IO)) {
        w->state = ST_FAILED;
        return fsdp2_fault_error(FAULT_IO, "write");
    }
    while (len > 0) {
        ssize_t n = write(w->fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            w->state = ST_FAILED;
            return fsdp2_error(FSDP2_ERR_IO, "%s: write: %s", w->path,
                               n < 0 ? strerror(errno) : "no progress");
        }
        p += n;
        len -= (size_t)n;
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t writer_flush(st_writer_t *w)
{
    size_t n = w->buf_len;
    w->buf_len = 0;
    return write_all(w, w->buf, n);
}

/* Small pieces are gathered in the buffer; a piece at least as big as the buffer goes
 * straight to the file after what is buffered. */
static fsdp2_status_t writer_append(st_writer_t *w, const void *data, size_t len)
{
    if (len <= ST_WRITE_BUFFER - w->buf_len) {
        memcpy(w->buf + w->buf_len, data, len);
        w->buf_len += len;
        return FSDP2_SUCCESS;
    }
    FSDP2_CHECK(writer_flush(w));
    if (len >= ST_WRITE_BUFFER)
        return write_all(w, data, len);
    memcpy(w->buf, data, len);
    w->buf_len = len;
    return FSDP2_SUCCESS;
}

fsdp2_status_t st_writer_begin(st_writer_t *w, uint64_t *data_start)
{
    FSDP2_ARG_CHECK(w != NULL, "st_writer_begin: w=NULL");
    if (w->state != ST_DECLARING)
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "%s: st_writer_begin called twice or after an error",
                           w->path);
    cJSON *root = build_header(w);
    char *json = root != NULL ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (json == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: header JSON", w->path);
    /* Spaces after the JSON make 8 + N a multiple of 8, so the data starts aligned. */
    size_t json_len = strlen(json);
    size_t padded = json_len + (8 - json_len % 8) % 8;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (padded > ST_MAX_HEADER) {
        status = fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                             "%s: header of %zu bytes is above ST_MAX_HEADER (%u): readers refuse it",
                             w->path, padded, ST_MAX_HEADER);
        goto cleanup;
    }
    unsigned char prefix[8];
    for (int i = 0; i < 8; i++)
        prefix[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[] = "       "; /* at most 7 */
    FSDP2_CHECK_GOTO(writer_append(w, prefix, 8), status, cleanup);
    FSDP2_CHECK_GOTO(writer_append(w, json, json_len), status, cleanup);
    FSDP2_CHECK_GOTO(writer_append(w, spaces, padded - json_len), status, cleanup);
    w->data_start = 8 + (uint64_t)padded;
    w->state = ST_WRITING;
    if (data_start != NULL)
        *data_start = w->data_start;
cleanup:
    cJSON_free(json);
    return status;
}

fsdp2_status_t st_writer_offset(const st_writer_t *w, const char *name, uint64_t *offset)
{
    FSDP2_ARG_CHECK(w != NULL && name != NULL && offset != NULL,
                    "st_writer_offset: w=%p name=%p offset=%p", (const void *)w,
                    (const void *)name, (void *)offset);
    const st_writer_tensor_t *t = writer_find(w, name);
    if (t == NULL)
        return fsdp2_error(FSDP2_ERR_NOT_FOUND, "%s: no tensor '%s' was added", w->path, name);
    *offset = t->begin;
    return FSDP2_SUCCESS;
}

/* The first tensor not yet complete once `written` bytes are in (for messages). */
static const st_writer_tensor_t *writer_current(const st_writer_t *w)
{
    for (size_t i = 0; i < w->num_tensors; i++)
        if (w->tensors[i].end > w->written)
            return &w->tensors[i];
    return NULL;
}

fsdp2_status_t st_writer_write(st_writer_t *w, const void *data, size_t len)
{
    FSDP2_ARG_CHECK(w != NULL && (data != NULL || len == 0), "st_writer_write: w=%p data=%p",
                    (void *)w, data);
    if (w->state != ST_WRITING)
        return fsdp2_error(FSDP2_ERR_INVALID_STATE, "%s: st_writer_write %s", w->path,
                           w->state == ST_DECLARING ? "before st_writer_begin" : "after an error");
    FSDP2_ARG_CHECK(len <= w->data_size - w->written,
                    "%s: writing %zu bytes, but only %" PRIu64 " of the declared %" PRIu64
                    " remain",
                    w->path, len, w->data_size - w->written, w->data_size);
    FSDP2_CHECK(writer_append(w, data, len));
    w->written += len;
    return FSDP2_SUCCESS;
}

static void writer_free(st_writer_t *w)
{
    for (size_t i = 0; i < w->num_tensors; i++)
        free(w->tensors[i].name);
    for (size_t i = 0; i < w->num_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->tensors);
    free(w->names.slots);
    free(w->meta);
    free(w->buf);
    free(w->path);
    free(w);
}

fsdp2_status_t st_writer_finish(st_writer_t *w)
{
    FSDP2_ARG_CHECK(w != NULL, "st_writer_finish: w=NULL");
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (w->state != ST_WRITING) {
        status = fsdp2_error(FSDP2_ERR_INVALID_STATE, "%s: st_writer_finish %s", w->path,
                             w->state == ST_DECLARING ? "before st_writer_begin" : "after an error");
        goto cleanup;
    }
    if (w->written != w->data_size) {
        const st_writer_tensor_t *t = writer_current(w);
        status = fsdp2_error(FSDP2_ERR_INVALID_STATE,
                             "%s: tensor '%s' has %" PRIu64 " of its %" PRIu64 " bytes written",
                             w->path, t->name, w->written - t->begin, t->end - t->begin);
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(writer_flush(w), status, cleanup);
    if (fsdp2_fault_hit(FAULT_IO)) {
        status = fsdp2_fault_error(FAULT_IO, "fsync");
        goto cleanup;
    }
    if (fsync(w->fd) != 0) {
        status = fsdp2_error(FSDP2_ERR_IO, "%s: fsync: %s", w->path, strerror(errno));
        goto cleanup;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        status = fsdp2_error(FSDP2_ERR_IO, "%s: close: %s", w->path, strerror(errno));
        goto cleanup;
    }
    writer_free(w);
    return FSDP2_SUCCESS;
cleanup:
    st_writer_abort(w);
    return status;
}

void st_writer_abort(st_writer_t *w)
{
    if (w == NULL)
        return;
    if (w->fd >= 0)
        close(w->fd);
    unlink(w->path); /* ours: created with O_EXCL */
    writer_free(w);
}
