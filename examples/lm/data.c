/* Loading the text, and cutting windows from its tokens. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <fsdp2/random.h>

#include "data.h"

/* Appends file path to *buf, dropping "%" lines. */
static int append_file(const char *path, uint8_t **buf, size_t *n, size_t *cap, char *err,
                       size_t len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, len, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        size_t k = strlen(line);
        if (!strcmp(line, "%\n") || !strcmp(line, "%"))
            continue;
        if (*n + k > *cap) {
            size_t want = *cap ? *cap * 2 : 1 << 20;
            while (want < *n + k)
                want *= 2;
            uint8_t *bigger = realloc(*buf, want);
            if (!bigger) {
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
    fclose(f);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int lm_text_load(const char *path, lm_text_t *text, char *err, size_t len)
{
    memset(text, 0, sizeof(*text));
    struct stat st;
    if (stat(path, &st)) {
        snprintf(err, len, "cannot read %s: %s (the default corpus is Debian's fortunes "
                           "package: apt-get install fortunes)", path, strerror(errno));
        return -1;
    }
    size_t cap = 0, n = 0;
    uint8_t *bytes = NULL;
    if (!S_ISDIR(st.st_mode)) {
        if (append_file(path, &bytes, &n, &cap, err, len)) {
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
                rc = append_file(names[i], &bytes, &n, &cap, err, len);
            free(names[i]);
        }
        free(names);
        if (rc) {
            free(bytes);
            return -1;
        }
    }
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
    memset(text, 0, sizeof(*text));
}

int32_t lm_text_start(const lm_text_t *text)
{
    (void)text;
    return '\n';
}

void lm_text_print(const lm_text_t *text, int32_t id, FILE *out)
{
    (void)text;
    fputc(id, out);
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
