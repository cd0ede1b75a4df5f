/* safetensors reader (format and rules: safetensors.h; the writer: safetensors_write.c).
 *
 * Reading trusts nothing in the file: the header length is checked against the file
 * size and ST_MAX_HEADER before anything is allocated, the JSON text is checked for
 * UTF-8 and control characters before cJSON sees it (cJSON checks neither), and every
 * size is computed with overflow checks. JSON numbers reach us as doubles, so integers
 * above 2^53 (which a double cannot hold exactly) are rejected rather than rounded; the
 * writer refuses to produce them, so what it writes it can read back. */
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


static const struct {
    fsdp2_dtype_t dtype;
    const char *name;
} ST_DTYPES[] = {
    {FSDP2_F32, "F32"}, {FSDP2_F64, "F64"}, {FSDP2_BF16, "BF16"}, {FSDP2_F16, "F16"},
    {FSDP2_I32, "I32"}, {FSDP2_I64, "I64"}, {FSDP2_U8, "U8"},
};
#define ST_NUM_DTYPES (sizeof(ST_DTYPES) / sizeof(ST_DTYPES[0]))

const char *st_dtype_name(fsdp2_dtype_t dtype)
{
    for (size_t i = 0; i < ST_NUM_DTYPES; i++)
        if (ST_DTYPES[i].dtype == dtype)
            return ST_DTYPES[i].name;
    return "invalid";
}

static int dtype_lookup(const char *name, fsdp2_dtype_t *dtype)
{
    for (size_t i = 0; i < ST_NUM_DTYPES; i++)
        if (strcmp(ST_DTYPES[i].name, name) == 0) {
            *dtype = ST_DTYPES[i].dtype;
            return 1;
        }
    return 0;
}

fsdp2_status_t st_dtype_parse(const char *name, fsdp2_dtype_t *dtype)
{
    FSDP2_ARG_CHECK(name != NULL && dtype != NULL, "st_dtype_parse: name=%p dtype=%p",
                    (const void *)name, (void *)dtype);
    if (!dtype_lookup(name, dtype))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "unknown or unsupported safetensors dtype '%s'",
                           name);
    return FSDP2_SUCCESS;
}

/* ---------------------------------------------------------------------------------- */
/* Checking the header text                                                            */

/* Length of the well-formed UTF-8 sequence at p (1..4), or 0: no overlong forms, no
 * surrogates, nothing above U+10FFFF (the rules of Rust's str, which the Python package
 * applies to the header). */
static size_t utf8_sequence(const unsigned char *p, size_t avail)
{
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0Fu;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07u;
    } else {
        return 0;
    }
    if (avail < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0u) != 0x80u)
            return 0;
        cp = cp << 6 | (p[i] & 0x3Fu);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

int st_utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t avail = strlen(s);
    while (avail > 0) {
        size_t n = utf8_sequence(p, avail);
        if (n == 0)
            return 0;
        p += n;
        avail -= n;
    }
    return 1;
}

/* What cJSON lets through and JSON (or C strings) do not: invalid UTF-8, a byte-order
 * mark, raw control characters, and \u0000, which would cut a name short. */
static fsdp2_status_t check_header_text(const unsigned char *s, size_t len, const char *what)
{
    if (len >= 3 && s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: header starts with a byte-order mark", what);
    int in_string = 0;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c >= 0x80) {
            size_t n = utf8_sequence(s + i, len - i);
            if (n == 0)
                return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: header is not UTF-8 (byte %zu)",
                                   what, i);
            i += n;
            continue;
        }
        if (c < 0x20 && (in_string || (c != '\t' && c != '\n' && c != '\r')))
            return fsdp2_error(FSDP2_ERR_CORRUPT,
                               "%s: header has control character 0x%02x at byte %zu", what, c, i);
        if (in_string && c == '\\' && i + 1 < len && s[i + 1] < 0x80) {
            if (i + 5 < len && memcmp(s + i + 1, "u0000", 5) == 0)
                return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: header has \\u0000 at byte %zu",
                                   what, i);
            i += 2;
            continue;
        }
        if (c == '"')
            in_string = !in_string;
        i++;
    }
    return FSDP2_SUCCESS;
}

/* ---------------------------------------------------------------------------------- */
/* Parsing                                                                             */

/* A non-negative integer that a double holds exactly (0 .. 2^53). */
static int json_uint(const cJSON *item, uint64_t *value)
{
    if (!cJSON_IsNumber(item))
        return 0;
    double d = item->valuedouble;
    if (!(d >= 0.0 && d <= (double)ST_MAX_EXACT) || (double)(uint64_t)d != d)
        return 0;
    *value = (uint64_t)d;
    return 1;
}

static fsdp2_status_t parse_shape(const cJSON *shape, const char *what, st_entry_t *e,
                                  uint64_t *numel)
{
    if (!cJSON_IsArray(shape))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s': shape is not an array", what,
                           e->name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > FSDP2_MAX_DIMS)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s': %d dimensions (at most %d)",
                           what, e->name, ndim, FSDP2_MAX_DIMS);
    e->ndim = 0;
    *numel = 1;
    int overflow = 0, empty = 0;
    for (const cJSON *d = shape->child; d != NULL; d = d->next) {
        uint64_t dim;
        if (!json_uint(d, &dim)) {
            const char *why = cJSON_IsNumber(d) && d->valuedouble < 0 ? "negative" :
                              cJSON_IsNumber(d) ? "not an integer below 2^53" : "not a number";
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s': dimension %d is %s", what,
                               e->name, e->ndim, why);
        }
        e->shape[e->ndim++] = (int64_t)dim;
        empty |= dim == 0;
        overflow |= __builtin_mul_overflow(*numel, dim, numel);
    }
    /* A zero dimension makes the tensor empty however large the others are. */
    if (empty) {
        *numel = 0;
        return FSDP2_SUCCESS;
    }
    if (overflow)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s': shape overflows 64 bits", what,
                           e->name);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_offsets(const cJSON *offsets, const char *what, st_entry_t *e)
{
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !json_uint(offsets->child, &e->begin) || !json_uint(offsets->child->next, &e->end))
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s: tensor '%s': data_offsets is not [begin, end] with integers "
                           "0 .. 2^53",
                           what, e->name);
    return FSDP2_SUCCESS;
}

/* Checks one tensor on its own: fields, dtype, shape, and that its offsets fit the data
 * section and hold exactly shape x dtype bytes. Unknown fields are ignored, as the
 * Python package does; repeated known ones are not. */
static fsdp2_status_t parse_entry(const cJSON *item, uint64_t data_size, const char *what,
                                  st_entry_t *e)
{
    size_t name_len = strlen(item->string);
    if (name_len >= ST_NAME_MAX)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%.64s...': name of %zu bytes (at most %d)",
                           what, item->string, name_len, ST_NAME_MAX - 1);
    memcpy(e->name, item->string, name_len + 1);
    if (!cJSON_IsObject(item))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s': entry is not an object", what,
                           e->name);
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
    for (const cJSON *field = item->child; field != NULL; field = field->next) {
        const cJSON **slot = strcmp(field->string, "dtype") == 0        ? &dtype :
                             strcmp(field->string, "shape") == 0        ? &shape :
                             strcmp(field->string, "data_offsets") == 0 ? &offsets : NULL;
        if (slot != NULL && *slot != NULL)
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s': field '%s' appears twice",
                               what, e->name, field->string);
        if (slot != NULL)
            *slot = field;
    }
    if (dtype == NULL || shape == NULL || offsets == NULL)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s': missing field '%s'", what,
                           e->name, dtype == NULL ? "dtype" : shape == NULL ? "shape" : "data_offsets");
    if (!cJSON_IsString(dtype) || !dtype_lookup(dtype->valuestring, &e->dtype))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s': unknown or unsupported dtype %s%s%s",
                           what, e->name, cJSON_IsString(dtype) ? "'" : "",
                           cJSON_IsString(dtype) ? dtype->valuestring : "(not a string)",
                           cJSON_IsString(dtype) ? "'" : "");
    uint64_t numel = 0, bytes = 0;
    FSDP2_CHECK(parse_shape(shape, what, e, &numel));
    FSDP2_CHECK(parse_offsets(offsets, what, e));
    size_t elem = 0;
    FSDP2_CHECK(fsdp2_dtype_size(e->dtype, &elem));
    if (__builtin_mul_overflow(numel, (uint64_t)elem, &bytes))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s': size overflows 64 bits", what,
                           e->name);
    if (e->end < e->begin || e->end > data_size)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                           "] are reversed or pass the end of the data (%" PRIu64 " bytes)",
                           what, e->name, e->begin, e->end, data_size);
    if (e->end - e->begin != bytes)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                           " bytes, but %s of %" PRIu64 " elements needs %" PRIu64,
                           what, e->name, e->begin, e->end, e->end - e->begin,
                           st_dtype_name(e->dtype), numel, bytes);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_meta(const cJSON *item, const char *what, st_file_t *f)
{
    if (cJSON_IsNull(item)) /* serde reads null as "no metadata" */
        return FSDP2_SUCCESS;
    if (!cJSON_IsObject(item))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: __metadata__ is not an object", what);
    size_t count = (size_t)cJSON_GetArraySize(item);
    if (count == 0)
        return FSDP2_SUCCESS;
    f->meta = fsdp2_calloc(count, sizeof(*f->meta));
    if (f->meta == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: %zu metadata entries", what, count);
    for (const cJSON *kv = item->child; kv != NULL; kv = kv->next) {
        if (!cJSON_IsString(kv))
            return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: __metadata__ '%s': value is not a string",
                               what, kv->string);
        st_meta_t *m = &f->meta[f->num_meta++];
        m->key = strdup(kv->string);
        m->value = strdup(kv->valuestring);
        if (m->key == NULL || m->value == NULL)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: metadata '%s'", what, kv->string);
    }
    return FSDP2_SUCCESS;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name that appears twice, or NULL (names[] is sorted in place). */
static const char *find_duplicate(const char **names, size_t n)
{
    if (n < 2)
        return NULL;
    qsort(names, n, sizeof(*names), compare_names);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

static fsdp2_status_t check_unique(const st_file_t *f, const char *what)
{
    size_t n = f->num_entries > f->num_meta ? f->num_entries : f->num_meta;
    if (n < 2)
        return FSDP2_SUCCESS;
    const char **names = fsdp2_malloc(n * sizeof(*names));
    if (names == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: %zu names", what, n);
    for (size_t i = 0; i < f->num_entries; i++)
        names[i] = f->entries[i].name;
    const char *dup = find_duplicate(names, f->num_entries);
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (dup != NULL) {
        status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: tensor '%s' appears twice", what, dup);
    } else {
        for (size_t i = 0; i < f->num_meta; i++)
            names[i] = f->meta[i].key;
        dup = find_duplicate(names, f->num_meta);
        if (dup != NULL)
            status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: __metadata__ '%s' appears twice", what,
                                 dup);
    }
    free(names);
    return status;
}

/* By (begin, end) as the Python package sorts; the name breaks ties between empty
 * tensors at one offset so the order never depends on qsort. */
static int compare_offsets(const void *a, const void *b)
{
    const st_entry_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Sorted by offset, the tensors must tile [0, data_size) exactly: each one begins where
 * the previous ended. */
static fsdp2_status_t check_coverage(st_file_t *f, uint64_t data_size, const char *what)
{
    if (f->num_entries > 1)
        qsort(f->entries, f->num_entries, sizeof(*f->entries), compare_offsets);
    uint64_t at = 0;
    for (size_t i = 0; i < f->num_entries; i++) {
        const st_entry_t *e = &f->entries[i];
        if (e->begin < at)
            return fsdp2_error(FSDP2_ERR_CORRUPT,
                               "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                               "] overlap tensor '%s' (which ends at %" PRIu64 ")",
                               what, e->name, e->begin, e->end, f->entries[i - 1].name, at);
        if (e->begin > at)
            return fsdp2_error(FSDP2_ERR_CORRUPT,
                               "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                               "] leave a hole: bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor",
                               what, e->name, e->begin, e->end, at, e->begin);
        at = e->end;
    }
    if (at != data_size)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "%s: %" PRIu64 " trailing bytes: the tensors end at %" PRIu64
                           " of a %" PRIu64 "-byte data section",
                           what, data_size - at, at, data_size);
    return FSDP2_SUCCESS;
}

/* text is NUL-terminated at text[len] (cJSON is given the length as well, but we do not
 * bet the file's safety on it). */
static fsdp2_status_t parse_text(const char *text, size_t len, uint64_t data_size,
                                 const char *what, st_file_t *f)
{
    FSDP2_CHECK(check_header_text((const unsigned char *)text, len, what));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (root == NULL) {
        size_t at = end != NULL && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: header is not valid JSON (near byte %zu)",
                           what, at);
    }
    fsdp2_status_t status = FSDP2_SUCCESS;
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: header has bytes after the JSON (byte %zu)",
                                 what, (size_t)(p - text));
            goto cleanup;
        }
    if (!cJSON_IsObject(root)) {
        status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: header is not a JSON object", what);
        goto cleanup;
    }
    size_t count = (size_t)cJSON_GetArraySize(root);
    if (count > 0 && (f->entries = fsdp2_calloc(count, sizeof(*f->entries))) == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: %zu tensors", what, count);
        goto cleanup;
    }
    int have_meta = 0;
    for (const cJSON *item = root->child; item != NULL; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (have_meta) {
                status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: __metadata__ appears twice", what);
                goto cleanup;
            }
            have_meta = 1;
            FSDP2_CHECK_GOTO(parse_meta(item, what, f), status, cleanup);
            continue;
        }
        FSDP2_CHECK_GOTO(parse_entry(item, data_size, what, &f->entries[f->num_entries]), status,
                         cleanup);
        f->num_entries++;
    }
    FSDP2_CHECK_GOTO(check_unique(f, what), status, cleanup);
    FSDP2_CHECK_GOTO(check_coverage(f, data_size, what), status, cleanup);
cleanup:
    cJSON_Delete(root);
    return status;
}

static void file_reset(st_file_t *f)
{
    memset(f, 0, sizeof(*f));
    f->fd = -1;
}

fsdp2_status_t st_parse_header(const char *json, size_t len, uint64_t data_size, const char *what,
                               st_file_t *f)
{
    FSDP2_ARG_CHECK(f != NULL && (json != NULL || len == 0),
                    "st_parse_header: json=%p len=%zu f=%p", (const void *)json, len, (void *)f);
    file_reset(f);
    if (what == NULL)
        what = "safetensors header";
    if (len > ST_MAX_HEADER)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: header of %zu bytes (at most %u)", what, len,
                           ST_MAX_HEADER);
    if (data_size > UINT64_MAX - 8 - len)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: data size %" PRIu64 " overflows", what,
                           data_size);
    char *text = fsdp2_malloc(len + 1);
    if (text == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: header of %zu bytes", what, len);
    if (len > 0)
        memcpy(text, json, len);
    text[len] = '\0';
    fsdp2_status_t status = parse_text(text, len, data_size, what, f);
    free(text);
    if (status != FSDP2_SUCCESS) {
        st_close(f);
        return status;
    }
    f->data_start = 8 + (uint64_t)len;
    f->file_size = f->data_start + data_size;
    return FSDP2_SUCCESS;
}

/* ---------------------------------------------------------------------------------- */
/* Files                                                                               */

/* Reads exactly len bytes at offset; a short file is FSDP2_ERR_IO (it changed under us:
 * every length was checked against its size first). */
static fsdp2_status_t pread_full(int fd, void *buf, size_t len, uint64_t offset, const char *path)
{
    unsigned char *p = buf;
    if (fsdp2_fault_hit(FAULT_IO))
        return fsdp2_fault_error(FAULT_IO, "pread");
    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fsdp2_error(FSDP2_ERR_IO, "%s: read at offset %" PRIu64 ": %s", path, offset,
                               strerror(errno));
        if (n == 0)
            return fsdp2_error(FSDP2_ERR_IO, "%s: unexpected end of file at offset %" PRIu64,
                               path, offset);
        p += n;
        len -= (size_t)n;
        offset += (uint64_t)n;
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t st_open(const char *path, st_file_t *f)
{
    FSDP2_ARG_CHECK(path != NULL && f != NULL, "st_open: path=%p f=%p", (const void *)path,
                    (void *)f);
    file_reset(f);
    /* Without blocking: a FIFO in the file's place is refused below, not waited on. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return fsdp2_error(FSDP2_ERR_IO, "%s: open: %s", path, strerror(errno));
    fsdp2_status_t status = FSDP2_SUCCESS;
    char *text = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        status = fsdp2_error(FSDP2_ERR_IO, "%s: stat: %s", path, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(st.st_mode)) {
        status = fsdp2_error(FSDP2_ERR_IO, "%s: not a regular file", path);
        goto cleanup;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        status = fsdp2_error(FSDP2_ERR_CORRUPT,
                             "%s: %" PRIu64 " bytes, too short for the 8-byte header length",
                             path, size);
        goto cleanup;
    }
    unsigned char prefix[8];
    FSDP2_CHECK_GOTO(pread_full(fd, prefix, 8, 0, path), status, cleanup);
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--)
        len = len << 8 | prefix[i];
    if (len > ST_MAX_HEADER || len > size - 8) {
        status = fsdp2_error(FSDP2_ERR_CORRUPT,
                             "%s: header length %" PRIu64 " exceeds %s (%" PRIu64 " bytes)", path,
                             len, len > ST_MAX_HEADER ? "ST_MAX_HEADER" : "the rest of the file",
                             len > ST_MAX_HEADER ? (uint64_t)ST_MAX_HEADER : size - 8);
        goto cleanup;
    }
    text = fsdp2_malloc((size_t)len + 1);
    if (text == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: header of %" PRIu64 " bytes", path, len);
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(pread_full(fd, text, (size_t)len, 8, path), status, cleanup);
    text[len] = '\0';
    FSDP2_CHECK_GOTO(parse_text(text, (size_t)len, size - 8 - len, path, f), status, cleanup);
    f->path = strdup(path);
    if (f->path == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", path);
        goto cleanup;
    }
    f->fd = fd;
    f->data_start = 8 + len;
    f->file_size = size;
cleanup:
    free(text);
    if (status != FSDP2_SUCCESS) {
        close(fd);
        f->fd = -1;
        st_close(f);
    }
    return status;
}

void st_close(st_file_t *f)
{
    if (f == NULL)
        return;
    if (f->fd >= 0)
        close(f->fd);
    for (size_t i = 0; i < f->num_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    free(f->entries);
    free(f->path);
    file_reset(f);
}

const st_entry_t *st_find(const st_file_t *f, const char *name)
{
    if (f == NULL || name == NULL)
        return NULL;
    for (size_t i = 0; i < f->num_entries; i++)
        if (strcmp(f->entries[i].name, name) == 0)
            return &f->entries[i];
    return NULL;
}

fsdp2_status_t st_read(const st_file_t *f, const st_entry_t *e, uint64_t offset, void *buf,
                       size_t len)
{
    FSDP2_ARG_CHECK(f != NULL && e != NULL && (buf != NULL || len == 0),
                    "st_read: f=%p e=%p buf=%p", (const void *)f, (const void *)e, buf);
    const char *path = f->path != NULL ? f->path : "safetensors";
    FSDP2_ARG_CHECK(f->fd >= 0, "%s: st_read on a header without a file", path);
    /* The entry is checked against the file too, in case it was not one of f's. */
    FSDP2_ARG_CHECK(e->begin <= e->end && e->end <= f->file_size - f->data_start,
                    "%s: tensor '%.*s': offsets [%" PRIu64 ", %" PRIu64 "] outside the data", path,
                    ST_NAME_MAX, e->name, e->begin, e->end);
    uint64_t bytes = e->end - e->begin;
    FSDP2_ARG_CHECK(offset <= bytes && len <= bytes - offset,
                    "%s: tensor '%.*s': reading [%" PRIu64 ", %" PRIu64 " + %zu) of %" PRIu64
                    " bytes",
                    path, ST_NAME_MAX, e->name, offset, offset, len, bytes);
    return pread_full(f->fd, buf, len, f->data_start + e->begin + offset, path);
}
