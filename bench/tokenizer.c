/* Tokenizer speed on one core: MB/s of text encoded, for each tokenizer.json given, over
 * a corpus of fortunes files (lines of '%' separate the entries; .dat files and links are
 * skipped), two ways: each file encoded whole, and each entry encoded by itself (the
 * per-document calls a data loader makes). "cold" is the first pass of a freshly loaded
 * tokenizer (an empty word cache), "warm" the best of --reps passes after it. Prints a
 * table and writes JSON.
 *
 * Usage: bench_tokenizer --tokenizer NAME=PATH [--tokenizer ...] [--corpus DIR]
 *                        [--reps N] [--json FILE] */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <fsdp2/fsdp2.h>
#include <fsdp2/tokenizer.h>

#define CHECK(call)                                                                         \
    do {                                                                                    \
        fsdp2_status_t s_ = (call);                                                         \
        if (s_ != FSDP2_SUCCESS) {                                                          \
            fprintf(stderr, "%s: %s: %s\n", #call, fsdp2_strerror(s_), fsdp2_last_error()); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

typedef struct span {
    const char *text;
    size_t len;
} span_t;

typedef struct corpus {
    char **files;
    size_t *sizes;
    size_t n_files, bytes;
    span_t *entries;
    size_t n_entries;
} corpus_t;

/* CPU time of this thread: the rate of one core, whatever else shares the machine. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void load_corpus(const char *dir, corpus_t *c)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        perror(dir);
        exit(1);
    }
    char *names[1024];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 1024) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] == '.' || (l > 4 && strcmp(e->d_name + l - 4, ".dat") == 0))
            continue;
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    c->files = calloc(n, sizeof *c->files);
    c->sizes = calloc(n, sizeof *c->sizes);
    size_t entry_cap = 1 << 16;
    c->entries = malloc(entry_cap * sizeof *c->entries);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(names[i]);
            continue;
        }
        FILE *f = fopen(path, "rb");
        char *buf = malloc((size_t)st.st_size + 1);
        if (f == NULL || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
            perror(path);
            exit(1);
        }
        fclose(f);
        buf[st.st_size] = '\0';
        size_t k = c->n_files++;
        c->files[k] = buf;
        c->sizes[k] = (size_t)st.st_size;
        c->bytes += (size_t)st.st_size;
        /* entries: the text between lines of "%" */
        const char *p = buf, *end = buf + st.st_size;
        while (p < end) {
            const char *sep = strstr(p, "\n%\n");
            const char *stop = sep ? sep + 1 : end;
            if (c->n_entries == entry_cap) {
                entry_cap *= 2;
                c->entries = realloc(c->entries, entry_cap * sizeof *c->entries);
            }
            c->entries[c->n_entries++] = (span_t){p, (size_t)(stop - p)};
            p = sep ? sep + 3 : end;
        }
        free(names[i]);
    }
}

/* Seconds to encode every span; the ids counted into *ids. */
static double pass(fsdp2_tokenizer_t *tok, const span_t *spans, size_t n, uint32_t *buf,
                   size_t cap, size_t *ids)
{
    double t0 = now();
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t count;
        CHECK(fsdp2_tokenizer_encode(tok, spans[i].text, spans[i].len, 0, buf, cap, &count));
        total += count;
    }
    *ids = total;
    return now() - t0;
}

int main(int argc, char **argv)
{
    const char *corpus_dir = "/usr/share/games/fortunes", *json_path = "bench_tokenizer.json";
    const char *names[8], *paths[8];
    int n_tok = 0, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--tokenizer") == 0 && n_tok < 8) {
            char *eq = strchr(argv[i + 1], '=');
            if (eq == NULL) {
                fprintf(stderr, "--tokenizer NAME=PATH\n");
                return 2;
            }
            *eq = '\0';
            names[n_tok] = argv[i + 1];
            paths[n_tok++] = eq + 1;
        } else if (strcmp(argv[i], "--corpus") == 0) {
            corpus_dir = argv[i + 1];
        } else if (strcmp(argv[i], "--reps") == 0) {
            reps = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--json") == 0) {
            json_path = argv[i + 1];
        } else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (n_tok == 0) {
        fprintf(stderr, "usage: %s --tokenizer NAME=PATH [...] [--corpus DIR] [--reps N] "
                "[--json FILE]\n", argv[0]);
        return 2;
    }
    corpus_t c = {0};
    load_corpus(corpus_dir, &c);
    span_t *whole = malloc(c.n_files * sizeof *whole);
    for (size_t i = 0; i < c.n_files; i++)
        whole[i] = (span_t){c.files[i], c.sizes[i]};
    size_t cap = c.bytes + 16;
    uint32_t *buf = malloc(cap * sizeof *buf);
    FILE *json = fopen(json_path, "w");
    if (json == NULL) {
        perror(json_path);
        return 1;
    }
    printf("corpus %s: %zu files, %zu entries, %.2f MB\n", corpus_dir, c.n_files, c.n_entries,
           (double)c.bytes / 1e6);
    printf("%-10s %-8s %10s %12s %12s\n", "tokenizer", "calls", "ids", "cold MB/s", "warm MB/s");
    fprintf(json, "{\"corpus\": \"%s\", \"bytes\": %zu, \"results\": [", corpus_dir, c.bytes);
    int first = 1;
    for (int t = 0; t < n_tok; t++) {
        for (int mode = 0; mode < 2; mode++) {
            const span_t *spans = mode ? c.entries : whole;
            size_t n = mode ? c.n_entries : c.n_files, ids;
            fsdp2_tokenizer_t *tok;
            CHECK(fsdp2_tokenizer_load(paths[t], &tok));
            double cold = pass(tok, spans, n, buf, cap, &ids), best = 1e30;
            for (int r = 0; r < reps; r++) {
                double s = pass(tok, spans, n, buf, cap, &ids);
                best = s < best ? s : best;
            }
            CHECK(fsdp2_tokenizer_destroy(tok));
            double mb = (double)c.bytes / 1e6;
            printf("%-10s %-8s %10zu %12.1f %12.1f\n", names[t], mode ? "entries" : "files", ids,
                   mb / cold, mb / best);
            fprintf(json, "%s\n  {\"tokenizer\": \"%s\", \"calls\": \"%s\", \"ids\": %zu, "
                    "\"cold_mbps\": %.2f, \"warm_mbps\": %.2f}", first ? "" : ",", names[t],
                    mode ? "entries" : "files", ids, mb / cold, mb / best);
            first = 0;
        }
    }
    fprintf(json, "\n]}\n");
    fclose(json);
    free(buf);
    free(whole);
    for (size_t i = 0; i < c.n_files; i++)
        free(c.files[i]);
    free(c.files);
    free(c.sizes);
    free(c.entries);
    return 0;
}
