/* Loading the text, and cutting windows from its tokens. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <fsdp2/random.h>

#include "data.h"

/* Appends file path to *buf, dropping "%" lines when fortunes (a directory's files). */
static int append_file(const char *path, int fortunes, uint8_t **buf, size_t *n, size_t *cap,
                       char *err, size_t len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, len, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    /* lines as bytes, NULs included (getline's length, not strlen: a byte corpus may hold
     * any byte) */
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    while ((got = getline(&line, &line_cap, f)) > 0) {
        size_t k = (size_t)got;
        if (fortunes && ((k == 2 && !memcmp(line, "%\n", 2)) || (k == 1 && line[0] == '%')))
            continue;
        if (*n + k > *cap) {
            size_t want = *cap ? *cap * 2 : 1 << 20;
            while (want < *n + k)
                want *= 2;
            uint8_t *bigger = realloc(*buf, want);
            if (!bigger) {
                free(line);
                fclose(f);
                snprintf(err, len, "out of memory reading %s", path);
                return -1;
            }
            *buf = bigger;
            *cap = want;
        }
        memcpy(*buf + *n, line, k);
        *n += k;
    }
    free(line);
    if (ferror(f)) {
        fclose(f);
        snprintf(err, len, "an I/O error reading %s", path);
        return -1;
    }
    fclose(f);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The corpus's bytes, as described in data.h. */
static int load_bytes(const char *path, uint8_t **out, size_t *count, char *err, size_t len)
{
    struct stat st;
    if (stat(path, &st)) {
        snprintf(err, len, "cannot read %s: %s (the default corpus is Debian's fortunes "
                           "package: apt-get install fortunes)", path, strerror(errno));
        return -1;
    }
    size_t cap = 0, n = 0;
    uint8_t *bytes = NULL;
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        snprintf(err, len, "%s is neither a regular file nor a directory (a FIFO, a device?)",
                 path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (append_file(path, 0, &bytes, &n, &cap, err, len)) {
            free(bytes);
            return -1;
        }
    } else {
        DIR *d = opendir(path);
        if (!d) {
            snprintf(err, len, "cannot list %s: %s", path, strerror(errno));
            return -1;
        }
        char **names = NULL;
        size_t count = 0;
        int short_of_memory = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            char full[4096];
            snprintf(full, sizeof(full), "%s/%s", path, e->d_name);
            const char *dot = strrchr(e->d_name, '.');
            if (e->d_name[0] == '.' || (dot && (!strcmp(dot, ".dat") || !strcmp(dot, ".u8"))) ||
                stat(full, &st) || !S_ISREG(st.st_mode))
                continue;
            char **bigger = realloc(names, (count + 1) * sizeof(*names));
            if (!bigger || !(bigger[count] = strdup(full))) {
                names = bigger ? bigger : names;
                short_of_memory = 1; /* a partial corpus would differ between ranks */
                break;
            }
            names = bigger;
            count++;
        }
        closedir(d);
        qsort(names, count, sizeof(*names), by_name);
        int rc = 0;
        if (short_of_memory) {
            snprintf(err, len, "out of memory listing %s", path);
            rc = -1;
        }
        for (size_t i = 0; i < count; i++) {
            if (!rc)
                rc = append_file(names[i], 1, &bytes, &n, &cap, err, len);
            free(names[i]);
        }
        free(names);
        if (rc) {
            free(bytes);
            return -1;
        }
    }
    *out = bytes;
    *count = n;
    return 0;
}

/* The tokenizer's ids of the corpus: a file through the library's token cache, a
 * directory's concatenation in memory. */
static int encode(lm_text_t *text, const char *path, const char *cache, char *err, size_t len)
{
    struct stat st;
    uint32_t *ids = NULL;
    size_t n = 0;
    fsdp2_status_t s;
    int file = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    if (file) {
        s = fsdp2_tokenizer_encode_file(text->tok, path, cache, 0, &ids, &n, NULL);
    } else {
        uint8_t *bytes;
        size_t count;
        if (load_bytes(path, &bytes, &count, err, len))
            return -1;
        s = fsdp2_tokenizer_encode(text->tok, (const char *)bytes, count, 0, NULL, 0, &n);
        ids = s == FSDP2_SUCCESS ? malloc(sizeof(*ids) * (n ? n : 1)) : NULL;
        if (s == FSDP2_SUCCESS && !ids)
            s = FSDP2_ERR_OUT_OF_MEMORY;
        if (s == FSDP2_SUCCESS)
            s = fsdp2_tokenizer_encode(text->tok, (const char *)bytes, count, 0, ids, n, &n);
        free(bytes);
    }
    if (s != FSDP2_SUCCESS) {
        snprintf(err, len, "tokenizing %s: %s", path, fsdp2_last_error());
        if (file)
            fsdp2_tokenizer_ids_free(ids);
        else
            free(ids);
        return -1;
    }
    text->tokens = malloc(sizeof(int32_t) * (n ? n : 1));
    if (text->tokens)
        for (size_t i = 0; i < n; i++)
            text->tokens[i] = (int32_t)ids[i];
    if (file)
        fsdp2_tokenizer_ids_free(ids);
    else
        free(ids);
    if (!text->tokens) {
        snprintf(err, len, "out of memory holding the %zu tokens of %s", n, path);
        return -1;
    }
    text->n = n;
    return 0;
}

int lm_text_load(const char *path, const char *tokenizer, const char *cache, lm_text_t *text,
                 char *err, size_t len)
{
    memset(text, 0, sizeof(*text));
    text->bos = text->eos = -1;
    if (tokenizer) {
        size_t vocab;
        uint32_t id;
        if (fsdp2_tokenizer_load(tokenizer, &text->tok) != FSDP2_SUCCESS ||
            fsdp2_tokenizer_vocab_size(text->tok, &vocab) != FSDP2_SUCCESS) {
            snprintf(err, len, "--tokenizer %s: %s", tokenizer, fsdp2_last_error());
            lm_text_free(text);
            return -1;
        }
        text->vocab = (int)vocab;
        if (fsdp2_tokenizer_bos_id(text->tok, &id) == FSDP2_SUCCESS)
            text->bos = id;
        if (fsdp2_tokenizer_eos_id(text->tok, &id) == FSDP2_SUCCESS)
            text->eos = id;
        if (encode(text, path, cache, err, len)) {
            lm_text_free(text);
            return -1;
        }
    } else {
        uint8_t *bytes;
        size_t n;
        if (load_bytes(path, &bytes, &n, err, len))
            return -1;
        text->tokens = malloc(sizeof(int32_t) * (n ? n : 1));
        if (!text->tokens) {
            free(bytes);
            snprintf(err, len, "out of memory holding the %zu bytes of %s as tokens", n, path);
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            text->tokens[i] = bytes[i];
        free(bytes);
        text->n = n;
        text->vocab = 256;
    }
    text->train_n = text->n / 10 * 9;
    if (text->train_n < 2 || text->n - text->train_n < 2) {
        snprintf(err, len, "%s holds %zu tokens: too little text", path, text->n);
        lm_text_free(text);
        return -1;
    }
    return 0;
}

void lm_text_free(lm_text_t *text)
{
    free(text->tokens);
    fsdp2_tokenizer_destroy(text->tok);
    memset(text, 0, sizeof(*text));
}

int32_t lm_text_start(const lm_text_t *text)
{
    if (!text->tok)
        return '\n';
    if (text->bos >= 0)
        return (int32_t)text->bos;
    uint32_t id = 0;
    size_t n;
    if (fsdp2_tokenizer_encode(text->tok, "\n", 1, 0, &id, 1, &n) != FSDP2_SUCCESS || n != 1)
        id = 0; /* "\n" is one byte-level token in every vocabulary of 256 bytes and more */
    return (int32_t)id;
}

void lm_text_print(const lm_text_t *text, int32_t id, FILE *out)
{
    char buf[256];
    size_t n = 0;
    uint32_t u = (uint32_t)id;
    if (!text->tok)
        fputc(id, out);
    else if (fsdp2_tokenizer_decode(text->tok, &u, 1, 0, buf, sizeof(buf), &n) == FSDP2_SUCCESS)
        fwrite(buf, 1, n, out);
    fflush(out);
}

static void cut(const int32_t *from, int seq, int32_t *tokens, int32_t *targets)
{
    for (int t = 0; t < seq; t++) {
        tokens[t] = from[t];
        targets[t] = from[t + 1];
    }
}

void lm_train_window(const lm_text_t *text, uint64_t seed, int64_t step, int index, int seq,
                       int32_t *tokens, int32_t *targets)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t counter[4] = {(uint32_t)step, (uint32_t)((uint64_t)step >> 32), (uint32_t)index,
                                 0x77696e64u};
    uint32_t r[4];
    fsdp2_philox4x32(counter, key, r);
    uint64_t span = text->train_n - (size_t)seq - 1; /* windows start in [0, span] */
    uint64_t at = (((uint64_t)r[0] << 32) | r[1]) % (span + 1);
    cut(text->tokens + at, seq, tokens, targets);
}

void lm_val_window(const lm_text_t *text, int index, int count, int seq, int32_t *tokens,
                     int32_t *targets)
{
    size_t span = text->n - text->train_n - (size_t)seq - 1;
    size_t at = text->train_n + (count > 1 ? span * (size_t)index / (size_t)(count - 1) : 0);
    cut(text->tokens + at, seq, tokens, targets);
}
