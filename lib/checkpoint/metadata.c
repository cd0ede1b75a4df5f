/* metadata.json: parsing with strict validation, and reading rows out of chunks. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/metadata.h"
#include "core/error.h"
#include "core/fault.h"

void meta_free(meta_t *m)
{
    for (size_t i = 0; i < m->num_tensors; i++) {
        for (size_t k = 0; k < m->tensors[i].num_chunks; k++)
            free(m->tensors[i].chunks[k].crc);
        free(m->tensors[i].chunks);
    }
    free(m->tensors);
    cJSON_Delete(m->root);
    memset(m, 0, sizeof(*m));
}

static fsdp2_status_t corrupt(const meta_t *m, const char *fmt, const char *name)
{
    return fsdp2_error(FSDP2_ERR_CORRUPT, "checkpoint %s: %s%s%s", m->path, fmt,
                       name ? ": " : "", name ? name : "");
}

/* A non-negative integer that a double represents exactly. */
static int get_u64(const cJSON *o, const char *key, uint64_t *v)
{
    const cJSON *x = key ? cJSON_GetObjectItemCaseSensitive(o, key) : o;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || x->valuedouble > 9007199254740992.0 ||
        x->valuedouble != floor(x->valuedouble))
        return 0;
    *v = (uint64_t)x->valuedouble;
    return 1;
}

static int get_dims(const cJSON *a, int64_t *dims, int *n)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > FSDP2_MAX_DIMS)
        return 0;
    *n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a)
    {
        uint64_t v;
        if (!get_u64(x, NULL, &v) || v > (1ull << 40))
            return 0;
        dims[(*n)++] = (int64_t)v;
    }
    return 1;
}

static fsdp2_status_t parse_chunk(const meta_t *m, const meta_tensor_t *t, const cJSON *c,
                                  chunk_t *k)
{
    const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "file"));
    int64_t goff[FSDP2_MAX_DIMS], shape[FSDP2_MAX_DIMS];
    int n1, n2;
    if (!file || strlen(file) >= sizeof(k->file) || strchr(file, '/') || !strcmp(file, "..") ||
        !get_u64(c, "offset", &k->offset) || !get_u64(c, "bytes", &k->bytes) ||
        !get_dims(cJSON_GetObjectItemCaseSensitive(c, "global_offset"), goff, &n1) ||
        !get_dims(cJSON_GetObjectItemCaseSensitive(c, "shape"), shape, &n2) || n1 != t->ndim ||
        n2 != t->ndim)
        return corrupt(m, "a chunk entry is malformed", t->name);
    snprintf(k->file, sizeof(k->file), "%s", file);
    size_t elem;
    fsdp2_dtype_size(t->dtype, &elem);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if ((d > 0 && (goff[d] != 0 || shape[d] != t->shape[d])) || goff[d] + shape[d] > t->shape[d])
            return corrupt(m, "a chunk is not a range of dim-0 rows inside the tensor", t->name);
        numel *= (uint64_t)shape[d]; /* at most the tensor's, checked in parse_tensor */
    }
    if (numel * elem != k->bytes)
        return corrupt(m, "a chunk's byte count disagrees with its shape", t->name);
    k->row0 = t->ndim ? goff[0] : 0;
    k->rows = t->ndim ? shape[0] : 1;
    const cJSON *crcs = cJSON_GetObjectItemCaseSensitive(c, "crc32c");
    size_t want = (size_t)((k->bytes + m->block - 1) / m->block);
    if (!cJSON_IsArray(crcs) || (size_t)cJSON_GetArraySize(crcs) != want)
        return corrupt(m, "a chunk's checksum list has the wrong length", t->name);
    k->crc = fsdp2_calloc(want ? want : 1, sizeof(uint32_t));
    if (!k->crc)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint metadata");
    const cJSON *x;
    cJSON_ArrayForEach(x, crcs)
    {
        uint64_t v;
        if (!get_u64(x, NULL, &v) || v > UINT32_MAX)
            return corrupt(m, "a checksum is not a 32-bit number", t->name);
        k->crc[k->num_crc++] = (uint32_t)v;
    }
    return FSDP2_SUCCESS;
}

/* A cJSON value as JSON text, for naming it in an error (cut to fit). */
static void json_text(const cJSON *x, char *buf, size_t len)
{
    char *text = x ? cJSON_PrintUnformatted(x) : NULL;
    snprintf(buf, len, "%s", text ? text : "(missing)");
    cJSON_free(text);
}

/* "mesh": one to FSDP2_MESH_MAX_DIMS whole numbers from 1 whose product is world_size.
 * Absent when the saving state dict had no DTensors. */
static fsdp2_status_t parse_mesh(meta_t *m)
{
    const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(m->root, "mesh"), *x;
    if (!mesh)
        return FSDP2_SUCCESS;
    char text[96];
    int n = cJSON_IsArray(mesh) ? cJSON_GetArraySize(mesh) : 0;
    if (n < 1 || n > FSDP2_MESH_MAX_DIMS) {
        json_text(mesh, text, sizeof(text));
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "checkpoint %s: mesh %s is not an array of 1 to %d mesh dim sizes",
                           m->path, text, FSDP2_MESH_MAX_DIMS);
    }
    uint64_t product = 1;
    cJSON_ArrayForEach(x, mesh)
    {
        uint64_t v;
        if (!get_u64(x, NULL, &v) || v < 1 || v > (uint64_t)m->world_size) {
            json_text(x, text, sizeof(text));
            return fsdp2_error(FSDP2_ERR_CORRUPT,
                               "checkpoint %s: mesh dim %d is %s, not a whole number from 1 to "
                               "the world size %d",
                               m->path, m->mesh_ndim, text, m->world_size);
        }
        m->mesh[m->mesh_ndim++] = (int)v;
        product *= v; /* at most world_size^2 */
    }
    if (product != (uint64_t)m->world_size) {
        json_text(mesh, text, sizeof(text));
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "checkpoint %s: mesh %s makes %llu rank%s, world_size says %d",
                           m->path, text, (unsigned long long)product, product == 1 ? "" : "s",
                           m->world_size);
    }
    return FSDP2_SUCCESS;
}

/* One placement as fsdp2_placements_format writes it, at *p; advances *p past it. Returns
 * 0, or -1 when *p does not start with one of the forms. */
static int parse_placement(const char **p, fsdp2_placement_t *out)
{
    static const struct {
        const char *text;
        fsdp2_placement_t placement;
    } fixed[] = {
        {"Replicate()", FSDP2_REPLICATE_INIT},
        {"Partial(sum)", FSDP2_PARTIAL_SUM_INIT},
        {"Partial(avg)", FSDP2_PARTIAL_AVG_INIT},
    };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        size_t n = strlen(fixed[i].text);
        if (!strncmp(*p, fixed[i].text, n)) {
            *out = fixed[i].placement;
            *p += n;
            return 0;
        }
    }
    const char *q = *p;
    if (strncmp(q, "Shard(dim=", 10))
        return -1;
    q += 10;
    int dim = 0, digits = 0;
    for (; *q >= '0' && *q <= '9' && digits < 3; q++, digits++)
        dim = dim * 10 + (*q - '0');
    if (!digits || *q != ')' || (digits > 1 && q[-digits] == '0'))
        return -1;
    *out = (fsdp2_placement_t)FSDP2_SHARD_INIT(dim);
    *p = q + 1;
    return 0;
}

/* "placements": "whole" (a plain tensor, the same on every rank), or one placement per
 * mesh dim, each Replicate() or Shard(dim=d) with d inside the tensor's dims. */
static fsdp2_status_t parse_placements(const meta_t *m, const cJSON *j, const meta_tensor_t *t)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(j, "placements");
    const char *text = cJSON_GetStringValue(item);
    char shown[96];
    json_text(item, shown, sizeof(shown));
    if (!text)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "checkpoint %s: '%s': placements %s is not a string",
                           m->path, t->name, shown);
    if (!strcmp(text, "whole"))
        return FSDP2_SUCCESS;
    fsdp2_placement_t pl[FSDP2_MESH_MAX_DIMS + 1];
    int n = 0;
    const char *p = text;
    int ok = *p++ == '[';
    while (ok && *p != ']' && n <= FSDP2_MESH_MAX_DIMS) {
        if (n && strncmp(p, ", ", 2))
            break;
        p += n ? 2 : 0;
        ok = parse_placement(&p, &pl[n++]) == 0;
    }
    if (!ok || *p != ']' || p[1] != '\0' || n == 0)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "checkpoint %s: '%s': placements %s are not \"whole\" or a list of "
                           "Replicate() and Shard(dim=d) as \"[Shard(dim=0)]\"",
                           m->path, t->name, shown);
    if (n != m->mesh_ndim)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "checkpoint %s: '%s': placements %s have %d entr%s for a mesh of %d "
                           "dim%s",
                           m->path, t->name, shown, n, n == 1 ? "y" : "ies", m->mesh_ndim,
                           m->mesh_ndim == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        if (pl[i].type == FSDP2_PLACEMENT_PARTIAL)
            return fsdp2_error(FSDP2_ERR_CORRUPT,
                               "checkpoint %s: '%s': placements %s: a Partial tensor is never "
                               "saved (it is reduced first)",
                               m->path, t->name, shown);
        if (pl[i].type == FSDP2_PLACEMENT_SHARD && pl[i].dim >= t->ndim)
            return fsdp2_error(FSDP2_ERR_CORRUPT,
                               "checkpoint %s: '%s': placements %s: Shard(dim=%d) of a tensor "
                               "with %d dim%s",
                               m->path, t->name, shown, pl[i].dim, t->ndim, t->ndim == 1 ? "" : "s");
    }
    return FSDP2_SUCCESS;
}

static int by_row(const void *a, const void *b)
{
    int64_t x = ((const chunk_t *)a)->row0, y = ((const chunk_t *)b)->row0;
    return (x > y) - (x < y);
}

static fsdp2_status_t parse_tensor(meta_t *m, const cJSON *j, meta_tensor_t *t)
{
    t->name = j->string;
    const char *dtype = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "dtype"));
    if (!dtype || fsdp2_dtype_parse(dtype, &t->dtype) != FSDP2_SUCCESS)
        return corrupt(m, "unknown dtype", t->name);
    if (!get_dims(cJSON_GetObjectItemCaseSensitive(j, "shape"), t->shape, &t->ndim))
        return corrupt(m, "malformed shape", t->name);
    FSDP2_CHECK(parse_placements(m, j, t));
    /* The tensor's bytes must fit in 2^53 (what JSON numbers hold exactly): then every
     * product of its dims and of its chunks' dims below is safe. */
    uint64_t bytes;
    size_t elem;
    fsdp2_dtype_size(t->dtype, &elem);
    bytes = elem;
    for (int d = 0; d < t->ndim; d++) {
        if (__builtin_mul_overflow(bytes, (uint64_t)t->shape[d], &bytes) || bytes > (1ull << 53))
            return corrupt(m, "the tensor's size overflows", t->name);
    }
    const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(j, "chunks");
    if (!cJSON_IsArray(chunks))
        return corrupt(m, "no chunk list", t->name);
    size_t n = (size_t)cJSON_GetArraySize(chunks);
    t->chunks = fsdp2_calloc(n ? n : 1, sizeof(*t->chunks));
    if (!t->chunks)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint metadata");
    const cJSON *c;
    cJSON_ArrayForEach(c, chunks)
    {
        /* Counted before parsing, so meta_free frees what a failing parse allocated. */
        FSDP2_CHECK(parse_chunk(m, t, c, &t->chunks[t->num_chunks++]));
    }
    /* The chunks must tile dim 0 exactly once (an empty tensor may have none). */
    qsort(t->chunks, t->num_chunks, sizeof(*t->chunks), by_row);
    int64_t rows = t->ndim ? t->shape[0] : 1, next = 0;
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++)
        numel *= t->shape[d];
    for (size_t k = 0; k < t->num_chunks; k++) {
        if (t->chunks[k].row0 < next)
            return corrupt(m, "overlapping chunks", t->name);
        if (t->chunks[k].row0 > next)
            return corrupt(m, "missing chunks (a gap in dim 0)", t->name);
        next += t->chunks[k].rows;
    }
    if (numel && next != rows)
        return corrupt(m, "missing chunks (dim 0 not covered to its end)", t->name);
    return FSDP2_SUCCESS;
}

/* The file's text, NUL-terminated. Opened without blocking (a FIFO or a device put in
 * the checkpoint's place would block a plain open or read forever) and refused unless it
 * is a regular file. */
static fsdp2_status_t read_file(const char *path, char **text)
{
    if (fsdp2_fault_hit(FAULT_IO))
        return fsdp2_fault_error(FAULT_IO, "read metadata");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return fsdp2_error(errno == ENOENT ? FSDP2_ERR_NOT_FOUND : FSDP2_ERR_IO,
                           "checkpoint: cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        close(fd);
        return fsdp2_error(FSDP2_ERR_CORRUPT, "checkpoint: %s is not a regular file", path);
    }
    if (fstat(fd, &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size > CKPT_MAX_METADATA) {
        close(fd);
        return fsdp2_error(FSDP2_ERR_CORRUPT, "checkpoint: %s is missing or over %u MiB", path,
                           CKPT_MAX_METADATA >> 20);
    }
    char *buf = fsdp2_malloc((size_t)st.st_size + 1);
    size_t at = 0;
    while (buf && at < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + at, (size_t)st.st_size - at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        at += (size_t)n;
    }
    close(fd);
    if (!buf || at != (size_t)st.st_size) {
        free(buf);
        return fsdp2_error(buf ? FSDP2_ERR_IO : FSDP2_ERR_OUT_OF_MEMORY, "checkpoint: reading %s",
                           path);
    }
    buf[at] = '\0';
    size_t text_len = strlen(buf);
    if (text_len != at) {
        free(buf);
        return fsdp2_error(FSDP2_ERR_CORRUPT, "checkpoint: %s holds a NUL byte at %zu", path,
                           text_len);
    }
    *text = buf;
    return FSDP2_SUCCESS;
}

fsdp2_status_t meta_load(const char *dir, meta_t *m)
{
    memset(m, 0, sizeof(*m));
    snprintf(m->path, sizeof(m->path), "%s/%s", dir, CKPT_METADATA);
    char *text = NULL;
    FSDP2_CHECK(read_file(m->path, &text));
    /* A name cJSON would cut at an escaped NUL ("a\u0000b" reads as "a") is refused
     * before parsing; so is anything after the JSON but white space. */
    if (strstr(text, "\\u0000")) {
        free(text);
        return corrupt(m, "a string holds an escaped NUL (\\u0000)", NULL);
    }
    m->root = cJSON_ParseWithOpts(text, NULL, 1);
    free(text);
    if (!cJSON_IsObject(m->root))
        return corrupt(m, "not a JSON object (or bytes after it)", NULL);
    const char *format = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m->root, "format"));
    if (!format || strcmp(format, "libfsdp2-checkpoint"))
        return corrupt(m, "not a libfsdp2 checkpoint (format)", format);
    uint64_t v, ws, block, step = 0, ostep = 0;
    if (!get_u64(m->root, "version", &v))
        return corrupt(m, "no version", NULL);
    if (v > FSDP2_CHECKPOINT_VERSION)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "checkpoint %s: format version %llu is newer than this library's %d",
                           m->path, (unsigned long long)v, FSDP2_CHECKPOINT_VERSION);
    if (!get_u64(m->root, "world_size", &ws) || ws < 1 || ws > (1u << 24) ||
        !get_u64(m->root, "crc32c_block_bytes", &block) || block < 1 || block > (1u << 30))
        return corrupt(m, "world_size or crc32c_block_bytes missing or out of range", NULL);
    /* Absent is 0 (and no optimizer step); present, they must be whole numbers in
     * range: a bad value must not read as absent and reset a run's step count. */
    const cJSON *step_item = cJSON_GetObjectItemCaseSensitive(m->root, "step");
    if (step_item && !get_u64(step_item, NULL, &step))
        return corrupt(m, "step is not a whole number from 0 to 2^53", NULL);
    const cJSON *ostep_item = cJSON_GetObjectItemCaseSensitive(m->root, "optim.step");
    if (ostep_item && !get_u64(ostep_item, NULL, &ostep))
        return corrupt(m, "optim.step is not a whole number from 0 to 2^53", NULL);
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(m->root, "optim.lr_schedule");
    if (sched) {
        const char *keys[6] = {"base_lr", "gamma", "min_lr", "kind", "step_size", "warmup"};
        double d[3];
        uint64_t u[4];
        for (int k = 0; k < 3; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(sched, keys[k]);
            if (!cJSON_IsNumber(x))
                return corrupt(m, "optim.lr_schedule: a number is missing", keys[k]);
            d[k] = x->valuedouble;
        }
        for (int k = 0; k < 4; k++) {
            const char *key = k < 3 ? keys[3 + k] : "total";
            if (!get_u64(sched, key, &u[k]))
                return corrupt(m, "optim.lr_schedule: a whole number is missing", key);
        }
        m->has_lr_schedule = 1;
        m->base_lr = d[0];
        m->lr_schedule = (fsdp2_lr_schedule_t){(fsdp2_lr_schedule_kind_t)u[0], (int64_t)u[1], d[1],
                                               (int64_t)u[2], (int64_t)u[3], d[2]};
        double lr; /* validated here, before a load writes anything */
        if (u[0] > FSDP2_LR_COSINE ||
            fsdp2_lr_at(&m->lr_schedule, m->base_lr, 1, &lr) != FSDP2_SUCCESS)
            return corrupt(m, "optim.lr_schedule is not a valid schedule", NULL);
    }
    m->version = (int)v;
    m->world_size = (int)ws;
    m->block = block;
    m->step = (int64_t)step;
    m->has_optim_step = ostep_item != NULL;
    m->optim_step = m->has_optim_step ? (int64_t)ostep : 0;
    FSDP2_CHECK(parse_mesh(m));
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(m->root, "tensors");
    if (!cJSON_IsObject(tensors))
        return corrupt(m, "no tensors object", NULL);
    size_t n = (size_t)cJSON_GetArraySize(tensors);
    m->tensors = fsdp2_calloc(n ? n : 1, sizeof(*m->tensors));
    if (!m->tensors)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint metadata");
    const cJSON *t;
    cJSON_ArrayForEach(t, tensors)
    {
        if (!cJSON_IsObject(t))
            return corrupt(m, "a tensor entry is not an object", t->string);
        for (size_t i = 0; i < m->num_tensors; i++)
            if (!strcmp(m->tensors[i].name, t->string))
                return corrupt(m, "a tensor appears twice", t->string);
        FSDP2_CHECK(parse_tensor(m, t, &m->tensors[m->num_tensors++]));
    }
    return FSDP2_SUCCESS;
}

const meta_tensor_t *meta_find(const meta_t *m, const char *name)
{
    for (size_t i = 0; i < m->num_tensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return &m->tensors[i];
    return NULL;
}

/* The files of one load, opened on first use. */
fsdp2_status_t meta_file_of(open_files_t *of, const char *name, st_file_t **f)
{
    for (int i = 0; i < of->count; i++) {
        if (!strcmp(of->names[i], name)) {
            *f = &of->files[i];
            return FSDP2_SUCCESS;
        }
    }
    if (of->count == 64) { /* more files than slots: reuse the oldest */
        st_close(&of->files[0]);
        memmove(&of->files[0], &of->files[1], sizeof(of->files[0]) * 63);
        memmove(of->names[0], of->names[1], sizeof(of->names[0]) * 63);
        of->count = 63;
    }
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", of->dir, name);
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) /* the checkpoint's fault, not a read's */
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: missing (metadata.json names it): %s", path,
                           strerror(ENOENT));
    FSDP2_CHECK(st_open(path, &of->files[of->count]));
    snprintf(of->names[of->count], sizeof(of->names[0]), "%s", name);
    *f = &of->files[of->count++];
    return FSDP2_SUCCESS;
}

/* Copies rows [lo, hi) of chunk k of tensor t into dst (the block's rows from lo), reading
 * whole checksum blocks and verifying them. */
static fsdp2_status_t check_block(const open_files_t *of, const meta_tensor_t *t,
                                  const chunk_t *k, const meta_t *m, uint64_t at, const char *data,
                                  size_t n)
{
    uint32_t crc = st_crc32c(0, data, n);
    if (crc == k->crc[at / m->block])
        return FSDP2_SUCCESS;
    return fsdp2_error(FSDP2_ERR_CORRUPT,
                       "checkpoint: %s/%s: checksum mismatch in '%s' at byte %llu of its chunk "
                       "(0x%08x, recorded 0x%08x)",
                       of->dir, k->file, t->name, (unsigned long long)at, crc,
                       k->crc[at / m->block]);
}

fsdp2_status_t meta_read_rows(open_files_t *of, const meta_t *m, const meta_tensor_t *t,
                                const chunk_t *k, int64_t lo, int64_t hi, char *dst,
                                uint64_t *bytes_read)
{
    st_file_t *f;
    FSDP2_CHECK(meta_file_of(of, k->file, &f));
    const st_entry_t *e = st_find(f, t->name);
    if (!e || e->dtype != t->dtype || e->end - e->begin != k->bytes ||
        f->data_start + e->begin != k->offset)
        return fsdp2_error(FSDP2_ERR_CORRUPT,
                           "checkpoint: %s/%s does not hold '%s' where metadata.json says",
                           of->dir, k->file, t->name);
    uint64_t row_bytes = k->rows ? k->bytes / (uint64_t)k->rows : 0;
    uint64_t start = (uint64_t)(lo - k->row0) * row_bytes, end = (uint64_t)(hi - k->row0) * row_bytes;
    uint64_t first = start / m->block * m->block;
    /* Blocks wholly inside [start, end) are read straight into dst, several per read;
     * the (at most two) blocks cut by the range go through a bounce buffer. */
    char *bounce = NULL;
    fsdp2_status_t status = FSDP2_SUCCESS;
    for (uint64_t at = first; at < end && status == FSDP2_SUCCESS;) {
        uint64_t block_end = at + m->block < k->bytes ? at + m->block : k->bytes;
        if (at >= start && block_end <= end) {
            uint64_t run_end = block_end;
            while (run_end < end && run_end - at < (64u << 20)) {
                uint64_t next = run_end + m->block < k->bytes ? run_end + m->block : k->bytes;
                if (next > end)
                    break;
                run_end = next;
            }
            char *to = dst + (at - start);
            status = st_read(f, e, at, to, (size_t)(run_end - at));
            for (uint64_t b = at; b < run_end && status == FSDP2_SUCCESS; b += m->block) {
                size_t n = (size_t)(run_end - b < m->block ? run_end - b : m->block);
                status = check_block(of, t, k, m, b, to + (b - at), n);
            }
            *bytes_read += run_end - at;
            at = run_end;
            continue;
        }
        if (!bounce && !(bounce = fsdp2_malloc((size_t)m->block)))
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint: %llu bytes",
                               (unsigned long long)m->block);
        size_t n = (size_t)(block_end - at);
        status = st_read(f, e, at, bounce, n);
        if (status == FSDP2_SUCCESS)
            status = check_block(of, t, k, m, at, bounce, n);
        if (status == FSDP2_SUCCESS) {
            uint64_t a = at > start ? at : start, z = block_end < end ? block_end : end;
            memcpy(dst + (a - start), bounce + (a - at), (size_t)(z - a));
            *bytes_read += n;
        }
        at = block_end;
    }
    free(bounce);
    return status;
}

