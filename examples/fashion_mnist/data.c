/* IDX reading, validation and the distributed sampler. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "data.h"

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* An IDX file as read: plain bytes, or a gzip stream inflated here. zlib's gzread is not
 * used because it can finish without asking inflate for the stream's CRC-32 and length
 * trailer (when its input ran out exactly as the caller's buffer filled), so a file cut
 * inside the trailer would read as whole. Here a gzip file must reach each member's end,
 * trailer checked, before its end of file. */
typedef struct idx_source {
    const char *path;
    FILE *f;
    int gz;    /* the file starts with the gzip magic 1f 8b */
    int ended; /* gz: the current member ended and its trailer matched */
    z_stream z;
    unsigned char in[1 << 16];
} idx_source_t;

static int source_open(idx_source_t *src, const char *path, char *err, size_t errlen)
{
    memset(src, 0, sizeof(*src));
    src->path = path;
    src->f = fopen(path, "rb");
    if (!src->f)
        return fail(err, errlen, "%s: cannot open it", path);
    size_t got = fread(src->in, 1, 2, src->f);
    src->gz = got == 2 && src->in[0] == 0x1f && src->in[1] == 0x8b;
    if (!src->gz) {
        rewind(src->f);
        return 0;
    }
    src->z.next_in = src->in;
    src->z.avail_in = 2;
    if (inflateInit2(&src->z, 16 + MAX_WBITS) != Z_OK) { /* 16: a gzip wrapper, checked */
        fclose(src->f);
        src->f = NULL;
        return fail(err, errlen, "%s: zlib cannot start inflating (%s)", path,
                    src->z.msg ? src->z.msg : "out of memory");
    }
    return 0;
}

/* Up to len bytes into buf: returns how many (fewer only at a proper end of file), or -1
 * with the message in err. */
static long source_read(idx_source_t *src, void *buf, size_t len, char *err, size_t errlen)
{
    if (!src->gz) {
        size_t got = fread(buf, 1, len, src->f);
        if (got < len && ferror(src->f))
            return fail(err, errlen, "%s: read error", src->path);
        return (long)got;
    }
    z_stream *z = &src->z;
    z->next_out = buf;
    z->avail_out = (uInt)len;
    while (z->avail_out > 0) {
        if (z->avail_in == 0) {
            z->avail_in = (uInt)fread(src->in, 1, sizeof(src->in), src->f);
            z->next_in = src->in;
            if (z->avail_in == 0 && ferror(src->f))
                return fail(err, errlen, "%s: read error", src->path);
            if (z->avail_in == 0 && src->ended)
                break;
            if (z->avail_in == 0)
                return fail(err, errlen,
                            "%s: truncated gzip stream (the file ends before the stream's "
                            "CRC-32 and length trailer is complete)",
                            src->path);
        }
        if (src->ended) { /* more bytes after a member: RFC 1952 allows another member */
            inflateReset(z);
            src->ended = 0;
        }
        int zrc = inflate(z, Z_NO_FLUSH);
        if (zrc == Z_STREAM_END)
            src->ended = 1;
        else if (zrc != Z_OK && zrc != Z_BUF_ERROR)
            return fail(err, errlen, "%s: corrupt gzip stream (zlib: %s)", src->path,
                        z->msg ? z->msg : zError(zrc));
    }
    return (long)(len - z->avail_out);
}

static void source_close(idx_source_t *src)
{
    if (src->gz)
        inflateEnd(&src->z);
    if (src->f)
        fclose(src->f);
}

int fm_read_idx(const char *path, int want_ndim, int *dims, uint8_t **data, char *err,
                size_t errlen)
{
    *data = NULL;
    if (want_ndim < 1 || want_ndim > 3)
        return fail(err, errlen, "%s: IDX files here have 1 to 3 dims, not %d", path, want_ndim);
    idx_source_t *src = malloc(sizeof(*src));
    if (!src)
        return fail(err, errlen, "%s: out of memory", path);
    if (source_open(src, path, err, errlen)) {
        free(src);
        return -1;
    }
    unsigned char head[4 + 4 * 3];
    long want = 4 + 4 * want_ndim;
    long got = source_read(src, head, (size_t)want, err, errlen);
    int rc = 0;
    if (got < 0) {
        rc = -1;
        goto done;
    }
    if (got != want) {
        rc = fail(err, errlen, "%s: truncated header (%ld of %ld bytes)", path, got, want);
        goto done;
    }
    long magic = ((long)head[0] << 24) | ((long)head[1] << 16) | ((long)head[2] << 8) | head[3];
    if (magic != (0x800 | want_ndim)) {
        rc = fail(err, errlen, "%s: bad magic 0x%08lx (want 0x%08x)", path, magic,
                  0x800 | want_ndim);
        goto done;
    }
    size_t total = 1;
    for (int d = 0; d < want_ndim; d++) {
        const unsigned char *p = head + 4 + 4 * d;
        long v = ((long)p[0] << 24) | ((long)p[1] << 16) | ((long)p[2] << 8) | p[3];
        if (v <= 0 || v > 10000000) {
            rc = fail(err, errlen, "%s: dim %d has size %ld", path, d, v);
            goto done;
        }
        dims[d] = (int)v;
        total *= (size_t)v;
    }
    if (total >= ((size_t)1 << 31)) {
        rc = fail(err, errlen, "%s: %zu elements is too many (limit %ld)", path, total,
                  (1L << 31) - 1);
        goto done;
    }
    *data = malloc(total);
    if (!*data) {
        rc = fail(err, errlen, "%s: out of memory for %zu bytes", path, total);
        goto done;
    }
    got = source_read(src, *data, total, err, errlen);
    if (got < 0) {
        rc = -1;
        goto done;
    }
    if ((size_t)got != total) {
        rc = fail(err, errlen, "%s: truncated data (%ld of %zu bytes)", path, got, total);
        goto done;
    }
    /* Reading on to the end of the file also checks the gzip trailer. */
    unsigned char extra;
    got = source_read(src, &extra, 1, err, errlen);
    if (got < 0)
        rc = -1;
    else if (got != 0)
        rc = fail(err, errlen, "%s: trailing bytes after %zu bytes of data", path, total);
done:
    source_close(src);
    free(src);
    if (rc) {
        free(*data);
        *data = NULL;
    }
    return rc;
}

/* <dir>/<name>.gz if it exists, else <dir>/<name>. */
static void find(const char *dir, const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s.gz", dir, name);
    if (access(path, R_OK) != 0)
        snprintf(path, len, "%s/%s", dir, name);
}

int fm_load(const char *dir, const char *prefix, fm_set_t *set, char *err, size_t errlen)
{
    memset(set, 0, sizeof(*set));
    char name[64], ipath[1024], lpath[1024];
    snprintf(name, sizeof(name), "%s-images-idx3-ubyte", prefix);
    find(dir, name, ipath, sizeof(ipath));
    snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", prefix);
    find(dir, name, lpath, sizeof(lpath));
    int idims[3], ldims[1];
    if (fm_read_idx(ipath, 3, idims, &set->images, err, errlen))
        return -1;
    if (fm_read_idx(lpath, 1, ldims, &set->labels, err, errlen)) {
        fm_free(set);
        return -1;
    }
    if (ldims[0] != idims[0]) {
        fm_free(set);
        return fail(err, errlen, "%s: %d labels for %d images", lpath, ldims[0], idims[0]);
    }
    for (int i = 0; i < ldims[0]; i++) {
        if (set->labels[i] >= FMNIST_CLASSES) {
            long v = set->labels[i];
            fm_free(set);
            return fail(err, errlen, "%s: label %ld of sample %d is not a class 0..9", lpath, v, i);
        }
    }
    set->n = idims[0];
    set->rows = idims[1];
    set->cols = idims[2];
    return 0;
}

void fm_free(fm_set_t *set)
{
    free(set->images);
    free(set->labels);
    memset(set, 0, sizeof(*set));
}

void fm_batch(const fm_set_t *set, const int *idx, int count, float *x, int *labels)
{
    int pixels = set->rows * set->cols;
    for (int b = 0; b < count; b++) {
        const uint8_t *img = set->images + (size_t)idx[b] * (size_t)pixels;
        for (int p = 0; p < pixels; p++)
            x[(size_t)b * pixels + p] = ((float)img[p] / 255.0f - FMNIST_MEAN) / FMNIST_STD;
        labels[b] = set->labels[idx[b]];
    }
}

/* splitmix64: a small, good generator for the shuffle. */
static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int *fm_sampler(int n, int ws, int rank, uint64_t seed, int epoch, int shuffle, int *count)
{
    if (n < 1 || ws < 1 || rank < 0 || rank >= ws)
        return NULL;
    int *order = malloc(sizeof(int) * (size_t)n);
    int per = (n + ws - 1) / ws;
    int *mine = malloc(sizeof(int) * (size_t)(per ? per : 1));
    if (!order || !mine) {
        free(order);
        free(mine);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        order[i] = i;
    uint64_t state = seed * 1000003ull + (uint64_t)epoch;
    for (int i = n - 1; shuffle && i > 0; i--) {
        int j = (int)(next(&state) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int k = 0; k < per; k++)
        mine[k] = order[(rank + (size_t)k * ws) % (size_t)n];
    free(order);
    *count = per;
    return mine;
}
