/* Prints, for each file given, its name, the number of ids a tokenizer.json gives it and
 * the FNV-1a 64 of the ids (little-endian uint32): what compare_with_tokenizers.py
 * compares with Hugging Face tokenizers for any tokenizer.json at hand.
 *
 * Usage: tokenize_files [--special] [--as-text] TOKENIZER_JSON FILE... */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp2/fsdp2.h>
#include <fsdp2/tokenizer.h>

static uint64_t fnv64(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int main(int argc, char **argv)
{
    unsigned flags = 0;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++)
        flags |= strcmp(argv[i], "--special") == 0 ? FSDP2_TOKENIZER_ADD_SPECIAL
                                                   : FSDP2_TOKENIZER_SPECIAL_AS_TEXT;
    if (i >= argc) {
        fprintf(stderr, "usage: %s [--special] [--as-text] TOKENIZER_JSON FILE...\n", argv[0]);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fsdp2_tokenizer_t *tok;
    if (fsdp2_tokenizer_load(argv[i], &tok) != FSDP2_SUCCESS) {
        fprintf(stderr, "%s\n", fsdp2_last_error());
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "loaded %s in %.3f s\n", argv[i],
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    for (i++; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (f == NULL) {
            perror(argv[i]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = malloc((size_t)n + 1);
        if (fread(text, 1, (size_t)n, f) != (size_t)n) {
            perror(argv[i]);
            return 1;
        }
        fclose(f);
        size_t count;
        uint32_t *ids = NULL;
        if (fsdp2_tokenizer_encode(tok, text, (size_t)n, flags, NULL, 0, &count) != FSDP2_SUCCESS ||
            (ids = malloc((count + 1) * sizeof *ids)) == NULL ||
            fsdp2_tokenizer_encode(tok, text, (size_t)n, flags, ids, count, &count) != FSDP2_SUCCESS) {
            fprintf(stderr, "%s: %s\n", argv[i], fsdp2_last_error());
            return 1;
        }
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t k = 0; k < count; k++) {
            unsigned char le[4] = {(unsigned char)ids[k], (unsigned char)(ids[k] >> 8),
                                   (unsigned char)(ids[k] >> 16), (unsigned char)(ids[k] >> 24)};
            h = fnv64(h, le, 4);
        }
        const char *base = strrchr(argv[i], '/');
        printf("%s %zu %016" PRIx64 "\n", base ? base + 1 : argv[i], count, h);
        free(ids);
        free(text);
    }
    fsdp2_tokenizer_destroy(tok);
    return 0;
}
