/* The cache of a tokenized text file (docs/tokenizer.md#the-token-cache).
 *
 * Layout, little-endian: "FSDP2TOK", u32 version, u32 encode flags, u64 tokenizer hash,
 * u64 text size, u64 text hash (FNV-1a 64), u64 count, count x u32 ids, then u64 FNV-1a 64
 * of everything before it. A cache is trusted only when every field matches and the
 * checksum holds; otherwise the text is encoded again and the cache replaced. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fault.h"
#include "core/log_internal.h"
#include "text/text_internal.h"

#define TOKEN_FILE_MAGIC "FSDP2TOK"
#define TOKEN_FILE_VERSION 1u
#define TOKEN_FILE_HEADER 48
#define TEXT_FILE_MAX ((size_t)1 << 40)

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

typedef struct key {
    uint32_t flags;
    uint64_t tok_hash, text_size, text_hash;
} key_t_;

static void header(unsigned char *h, const key_t_ *k, uint64_t count)
{
    memcpy(h, TOKEN_FILE_MAGIC, 8);
    put_u32(h + 8, TOKEN_FILE_VERSION);
    put_u32(h + 12, k->flags);
    put_u64(h + 16, k->tok_hash);
    put_u64(h + 24, k->text_size);
    put_u64(h + 32, k->text_hash);
    put_u64(h + 40, count);
}

/* Reads a cache of key into ids; a reason in *why (and FSDP2_SUCCESS with *ids NULL) when
 * it is missing, stale or corrupt. */
static fsdp2_status_t read_cache(const char *path, const key_t_ *k, uint32_t **ids, size_t *count,
                                 const char **why)
{
    *ids = NULL;
    char *data;
    size_t len;
    fsdp2_status_t s = text_read_file(path, TEXT_FILE_MAX * 4, "token cache", &data, &len);
    if (s == FSDP2_ERR_NOT_FOUND) {
        *why = "missing";
        return FSDP2_SUCCESS;
    }
    FSDP2_CHECK(s);
    const unsigned char *p = (const unsigned char *)data;
    unsigned char want[TOKEN_FILE_HEADER];
    uint64_t n = len >= TOKEN_FILE_HEADER ? get_u64(p + 40) : 0;
    header(want, k, n);
    if (len < TOKEN_FILE_HEADER + 8 || memcmp(p, want, 12) != 0) {
        *why = "corrupt (no header)";
    } else if (memcmp(p, want, TOKEN_FILE_HEADER) != 0) {
        *why = "stale (another tokenizer, flags or text)";
    } else if (n > (len - TOKEN_FILE_HEADER - 8) / 4 || TOKEN_FILE_HEADER + 4 * n + 8 != len) {
        *why = "corrupt (its size does not match its count)";
    } else if (text_fnv1a64(TEXT_FNV_INIT, p, len - 8) != get_u64(p + len - 8)) {
        *why = "corrupt (checksum)";
    } else {
        uint32_t *out = fsdp2_malloc(n ? 4 * n : 4);
        if (out == NULL) {
            free(data);
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "token cache %s: %llu ids", path,
                               (unsigned long long)n);
        }
        for (size_t i = 0; i < n; i++)
            out[i] = get_u32(p + TOKEN_FILE_HEADER + 4 * i);
        *ids = out;
        *count = (size_t)n;
    }
    free(data);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t write_all(int fd, const void *data, size_t len, const char *path)
{
    if (fsdp2_fault_hit(FAULT_IO))
        return fsdp2_fault_error(FAULT_IO, "write token cache");
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fsdp2_error(FSDP2_ERR_IO, "token cache %s: write: %s", path, strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    return FSDP2_SUCCESS;
}

/* Writes the cache beside path under a temporary name, then renames it into place. */
static fsdp2_status_t write_cache(const char *path, const key_t_ *k, const uint32_t *ids,
                                  size_t count)
{
    size_t plen = strlen(path);
    char *tmp = fsdp2_malloc(plen + 16);
    unsigned char *buf = fsdp2_malloc(TOKEN_FILE_HEADER + 4 * (count ? count : 1) + 8);
    fsdp2_status_t status = FSDP2_SUCCESS;
    int fd = -1, created = 0;
    if (tmp == NULL || buf == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "token cache %s: %zu ids", path, count);
        goto cleanup;
    }
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        status = fsdp2_error(FSDP2_ERR_IO, "token cache %s: cannot create a temporary file: %s",
                             path, strerror(errno));
        goto cleanup;
    }
    created = 1;
    header(buf, k, count);
    for (size_t i = 0; i < count; i++)
        put_u32(buf + TOKEN_FILE_HEADER + 4 * i, ids[i]);
    size_t body = TOKEN_FILE_HEADER + 4 * count;
    put_u64(buf + body, text_fnv1a64(TEXT_FNV_INIT, buf, body));
    FSDP2_CHECK_GOTO(write_all(fd, buf, body + 8, tmp), status, cleanup);
    if (fsdp2_fault_hit(FAULT_IO)) {
        status = fsdp2_fault_error(FAULT_IO, "fsync token cache");
        goto cleanup;
    }
    if (fsync(fd) != 0) {
        status = fsdp2_error(FSDP2_ERR_IO, "token cache %s: fsync: %s", tmp, strerror(errno));
        goto cleanup;
    }
    if (close(fd) != 0) {
        fd = -1;
        status = fsdp2_error(FSDP2_ERR_IO, "token cache %s: close: %s", tmp, strerror(errno));
        goto cleanup;
    }
    fd = -1;
    if (rename(tmp, path) != 0)
        status = fsdp2_error(FSDP2_ERR_IO, "token cache: cannot rename %s to %s: %s", tmp, path,
                             strerror(errno));
cleanup:
    if (fd >= 0)
        close(fd);
    if (status != FSDP2_SUCCESS && created)
        unlink(tmp); /* nothing partial is left behind */
    free(tmp);
    free(buf);
    return status;
}

/* cache_path itself, or "<dir>/<text name>.<tokenizer hash>.tokens" when it is a directory. */
static fsdp2_status_t cache_file(const char *cache_path, const char *text_path, uint64_t tok_hash,
                                 char **out)
{
    struct stat st;
    if (stat(cache_path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        *out = strdup(cache_path);
    } else {
        char *copy = strdup(text_path);
        const char *base = copy ? basename(copy) : NULL;
        size_t n = base ? strlen(cache_path) + strlen(base) + 40 : 0;
        *out = base ? fsdp2_malloc(n) : NULL;
        if (*out != NULL)
            snprintf(*out, n, "%s/%s.%016llx.tokens", cache_path, base, (unsigned long long)tok_hash);
        free(copy);
    }
    return *out ? FSDP2_SUCCESS
                : fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "token cache path for %s", cache_path);
}

/* One pass in the common case: a buffer of one id per 2 bytes (English text averages
 * about 3 bytes per id here); a text that needs more is encoded again at its count. */
static fsdp2_status_t encode_all(fsdp2_tokenizer_t *tok, const char *text, size_t len,
                                 unsigned flags, uint32_t **ids, size_t *count)
{
    size_t cap = len / 2 + 64, n = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        uint32_t *out = fsdp2_malloc(cap * sizeof *out);
        if (out == NULL)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: %zu ids", cap);
        fsdp2_status_t status = fsdp2_tokenizer_encode(tok, text, len, flags, out, cap, &n);
        if (status == FSDP2_SUCCESS) {
            *ids = out;
            *count = n;
            return FSDP2_SUCCESS;
        }
        free(out);
        if (status != FSDP2_ERR_OVERFLOW)
            return status;
        cap = n;
    }
    return fsdp2_error(FSDP2_ERR_INTERNAL, "tokenizer: %zu ids, then more", n);
}

fsdp2_status_t fsdp2_tokenizer_encode_file(fsdp2_tokenizer_t *tok, const char *text_path,
                                           const char *cache_path, unsigned flags, uint32_t **ids,
                                           size_t *count, int *from_cache)
{
    FSDP2_ARG_CHECK(tok != NULL && text_path != NULL && ids != NULL && count != NULL,
                    "fsdp2_tokenizer_encode_file: tok=%p text_path=%p ids=%p count=%p",
                    (void *)tok, (const void *)text_path, (void *)ids, (void *)count);
    *ids = NULL;
    *count = 0;
    if (from_cache != NULL)
        *from_cache = 0;
    char *text, *path = NULL;
    size_t len;
    FSDP2_CHECK(text_read_file(text_path, TEXT_FILE_MAX, "text", &text, &len));
    fsdp2_status_t status = FSDP2_SUCCESS;
    key_t_ k = {.flags = flags, .tok_hash = tok->hash, .text_size = len,
                .text_hash = text_fnv1a64(TEXT_FNV_INIT, text, len)};
    if (cache_path != NULL) {
        FSDP2_CHECK_GOTO(cache_file(cache_path, text_path, tok->hash, &path), status, cleanup);
        const char *why = NULL;
        FSDP2_CHECK_GOTO(read_cache(path, &k, ids, count, &why), status, cleanup);
        if (*ids != NULL) {
            if (from_cache != NULL)
                *from_cache = 1;
            goto cleanup;
        }
        FSDP2_LOG(INFO, TEXT, "token cache %s is %s: encoding %s", path, why, text_path);
    }
    FSDP2_CHECK_GOTO(encode_all(tok, text, len, flags, ids, count), status, cleanup);
    if (path != NULL)
        FSDP2_CHECK_GOTO(write_cache(path, &k, *ids, *count), status, cleanup);
cleanup:
    if (status != FSDP2_SUCCESS) {
        free(*ids);
        *ids = NULL;
        *count = 0;
    }
    free(text);
    free(path);
    return status;
}

fsdp2_status_t fsdp2_tokenizer_ids_free(uint32_t *ids)
{
    free(ids);
    return FSDP2_SUCCESS;
}
