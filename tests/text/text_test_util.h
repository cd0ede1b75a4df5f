/* Helpers of the lib/text tests: loading the fixtures' tokenizers, encode and decode into
 * fresh arrays, an independent UTF-8 repair (Python's rule), the fixtures' FNV hash. */
#ifndef FSDP2_TESTS_TEXT_TEST_UTIL_H
#define FSDP2_TESTS_TEXT_TEST_UTIL_H

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <fsdp2/tokenizer.h>

#define CORPUS_DIR "/usr/share/games/fortunes"

#define OK(call)                                                                          \
    do {                                                                                  \
        fsdp2_status_t ok_s_ = (call);                                                    \
        ck_assert_msg(ok_s_ == FSDP2_SUCCESS, "%s: %s: %s", #call, fsdp2_status_name(ok_s_), \
                      fsdp2_last_error());                                                \
    } while (0)

static const char *const names[] = {"gpt2", "llama3"};

static inline fsdp2_tokenizer_t *load(const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", TEXT_FIXTURES, name);
    fsdp2_tokenizer_t *tok = NULL;
    OK(fsdp2_tokenizer_load(path, &tok));
    return tok;
}

static inline inline char *read_all(const char *path, size_t *len);

/* gpt2 with its ByteLevel pre-tokenizer's add_prefix_space set, as make_fixtures.py
 * makes "gpt2_prefix" */
static inline fsdp2_tokenizer_t *load_prefixed(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/gpt2/tokenizer.json", TEXT_FIXTURES);
    size_t len;
    char *json = read_all(path, &len);
    cJSON *root = cJSON_Parse(json);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "pre_tokenizer"), "add_prefix_space",
                              cJSON_CreateTrue());
    char *text = cJSON_PrintUnformatted(root);
    fsdp2_tokenizer_t *tok = NULL;
    OK(fsdp2_tokenizer_load_buffer(text, strlen(text), "gpt2_prefix", &tok));
    cJSON_free(text);
    cJSON_Delete(root);
    free(json);
    return tok;
}

static inline int tokenizer_index(const char *name)
{
    return strcmp(name, "gpt2") == 0 ? 0 : strcmp(name, "llama3") == 0 ? 1 : 2;
}

static inline char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static inline void write_all(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static inline uint64_t fnv64(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static inline uint64_t ids_fnv(const uint32_t *ids, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        unsigned char le[4] = {(unsigned char)ids[i], (unsigned char)(ids[i] >> 8),
                               (unsigned char)(ids[i] >> 16), (unsigned char)(ids[i] >> 24)};
        h = fnv64(h, le, 4);
    }
    return h;
}

static inline uint32_t *encode(fsdp2_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                        size_t *count)
{
    size_t n = 0;
    OK(fsdp2_tokenizer_encode(tok, text, len, flags, NULL, 0, &n));
    uint32_t *ids = malloc((n + 1) * sizeof *ids);
    OK(fsdp2_tokenizer_encode(tok, text, len, flags, ids, n, count));
    ck_assert_uint_eq(*count, n);
    return ids;
}

static inline char *decode(const fsdp2_tokenizer_t *tok, const uint32_t *ids, size_t n, unsigned flags,
                    size_t *len)
{
    OK(fsdp2_tokenizer_decode(tok, ids, n, flags, NULL, 0, len));
    char *buf = malloc(*len + 1);
    OK(fsdp2_tokenizer_decode(tok, ids, n, flags, buf, *len, len));
    return buf;
}

/* Python's bytes.decode("utf-8", errors="replace").encode() for what the fixtures hold:
 * the library's own repair is what is under test, so this one is written independently,
 * by code point ranges. */
static inline size_t repair_reference(const unsigned char *s, size_t len, unsigned char *out)
{
    size_t i = 0, o = 0;
    while (i < len) {
        unsigned b = s[i];
        size_t need = b < 0x80 ? 0 : b < 0xC2 ? 99 : b < 0xE0 ? 1 : b < 0xF0 ? 2 : b < 0xF5 ? 3 : 99;
        size_t k = 0;
        if (need != 99) {
            while (k < need && i + 1 + k < len) {
                unsigned c = s[i + 1 + k];
                unsigned lo = 0x80, hi = 0xBF;
                if (k == 0 && b == 0xE0) lo = 0xA0;
                if (k == 0 && b == 0xED) hi = 0x9F;
                if (k == 0 && b == 0xF0) lo = 0x90;
                if (k == 0 && b == 0xF4) hi = 0x8F;
                if (c < lo || c > hi)
                    break;
                k++;
            }
        }
        if (need != 99 && k == need) {
            memcpy(out + o, s + i, need + 1);
            o += need + 1;
            i += need + 1;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += need == 99 ? 1 : 1 + k;
        }
    }
    return o;
}

static inline char *fixture_json(const char *name, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", TEXT_FIXTURES, name);
    return read_all(path, len);
}

static inline uint64_t next_random(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

#endif
