/* The GPT-2 example's Hugging Face export, read with a reader written here from the
 * safetensors specification (8-byte little-endian header length, a JSON header of
 * {name: {dtype, shape, data_offsets}} plus "__metadata__", then the data, offsets
 * relative to its start, tensors contiguous and non-overlapping):
 *
 *   test_gpt2_safetensors check FILE LAYERS DIM SEQ VOCAB
 *       exactly GPT2LMHeadModel's names (no lm_head: tied), F32, their shapes in
 *       Conv1D [in, out] layout, offsets that tile the data, the file's size, and
 *       config.json beside it with the same sizes
 *   test_gpt2_safetensors pattern FILE OUT
 *       a copy of FILE whose every element is a function of (tensor, index), to check
 *       that --init-from and --export round-trip names and layouts byte for byte */
#include <cjson/cJSON.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define EXPECT(cond, ...)                                      \
    do {                                                       \
        if (!(cond)) {                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                      \
            fprintf(stderr, "\n");                             \
            failures++;                                        \
        }                                                      \
    } while (0)

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    if (!b || fread(b, 1, *n, f) != *n)
        exit(1);
    fclose(f);
    b[*n] = 0;
    return b;
}

static cJSON *header(const unsigned char *b, size_t n, uint64_t *hlen)
{
    *hlen = 0;
    for (int k = 0; k < 8 && n >= 8; k++)
        *hlen |= (uint64_t)b[k] << (8 * k);
    if (n < 8 || *hlen > n - 8) {
        fprintf(stderr, "header length %llu does not fit a %zu-byte file\n",
                (unsigned long long)*hlen, n);
        exit(1);
    }
    char *text = strndup((const char *)b + 8, *hlen);
    cJSON *h = cJSON_Parse(text);
    free(text);
    if (!h) {
        fprintf(stderr, "header is not JSON\n");
        exit(1);
    }
    return h;
}

/* The expected shape of name for the config, or 0 dims when the name is unknown. */
static int expected_shape(const char *name, int layers, long C, long T, long V, long *shape)
{
    if (!strcmp(name, "transformer.wte.weight"))
        return shape[0] = V, shape[1] = C, 2;
    if (!strcmp(name, "transformer.wpe.weight"))
        return shape[0] = T, shape[1] = C, 2;
    if (!strcmp(name, "transformer.ln_f.weight") || !strcmp(name, "transformer.ln_f.bias"))
        return shape[0] = C, 1;
    int l, used = 0;
    char rest[64];
    if (sscanf(name, "transformer.h.%d.%63s%n", &l, rest, &used) != 2 || l < 0 || l >= layers ||
        name[used])
        return 0;
    const struct {
        const char *part;
        int ndim;
        long d0, d1;
    } parts[] = {{"ln_1.weight", 1, C, 0},          {"ln_1.bias", 1, C, 0},
                 {"attn.c_attn.weight", 2, C, 3 * C}, {"attn.c_attn.bias", 1, 3 * C, 0},
                 {"attn.c_proj.weight", 2, C, C},   {"attn.c_proj.bias", 1, C, 0},
                 {"ln_2.weight", 1, C, 0},          {"ln_2.bias", 1, C, 0},
                 {"mlp.c_fc.weight", 2, C, 4 * C},  {"mlp.c_fc.bias", 1, 4 * C, 0},
                 {"mlp.c_proj.weight", 2, 4 * C, C}, {"mlp.c_proj.bias", 1, C, 0}};
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        if (!strcmp(rest, parts[i].part))
            return shape[0] = parts[i].d0, shape[1] = parts[i].d1, parts[i].ndim;
    return 0;
}

static int by_begin(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

static void check(const char *path, int layers, long C, long T, long V)
{
    size_t n;
    uint64_t hlen;
    unsigned char *b = slurp(path, &n);
    cJSON *h = header(b, n, &hlen);
    EXPECT(hlen % 8 == 0, "header length %llu is not a multiple of 8", (unsigned long long)hlen);
    int count = 0;
    uint64_t(*ranges)[2] = calloc(1024, sizeof(*ranges));
    cJSON *t;
    cJSON_ArrayForEach(t, h)
    {
        if (!strcmp(t->string, "__metadata__"))
            continue;
        long want[2];
        int ndim = expected_shape(t->string, layers, C, T, V, want);
        EXPECT(ndim > 0, "unexpected tensor %s", t->string);
        cJSON *dtype = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        EXPECT(cJSON_IsString(dtype) && !strcmp(dtype->valuestring, "F32"), "%s: dtype", t->string);
        EXPECT(cJSON_GetArraySize(shape) == ndim, "%s: %d dims, want %d", t->string,
               cJSON_GetArraySize(shape), ndim);
        long numel = 1;
        for (int d = 0; d < ndim && d < cJSON_GetArraySize(shape); d++) {
            long got = (long)cJSON_GetArrayItem(shape, d)->valuedouble;
            EXPECT(got == want[d], "%s: dim %d is %ld, want %ld", t->string, d, got, want[d]);
            numel *= got;
        }
        EXPECT(cJSON_GetArraySize(off) == 2, "%s: data_offsets", t->string);
        if (count < 1024 && cJSON_GetArraySize(off) == 2) {
            ranges[count][0] = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
            ranges[count][1] = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
            EXPECT(ranges[count][1] - ranges[count][0] == (uint64_t)numel * 4,
                   "%s: %llu bytes for %ld elements", t->string,
                   (unsigned long long)(ranges[count][1] - ranges[count][0]), numel);
        }
        count++;
    }
    EXPECT(count == 4 + 12 * layers, "%d tensors, want %d", count, 4 + 12 * layers);
    qsort(ranges, (size_t)count, sizeof(*ranges), by_begin);
    uint64_t at = 0;
    for (int i = 0; i < count; i++) {
        EXPECT(ranges[i][0] == at, "tensor data at %llu, want %llu (a gap or an overlap)",
               (unsigned long long)ranges[i][0], (unsigned long long)at);
        at = ranges[i][1];
    }
    EXPECT(8 + hlen + at == n, "file is %zu bytes, the header accounts for %llu", n,
           (unsigned long long)(8 + hlen + at));
    /* config.json beside it */
    char dir[4096], cfgpath[4200];
    snprintf(dir, sizeof(dir), "%s", path);
    snprintf(cfgpath, sizeof(cfgpath), "%s/config.json", dirname(dir));
    size_t cn;
    unsigned char *cb = slurp(cfgpath, &cn);
    cJSON *cfg = cJSON_Parse((const char *)cb);
    EXPECT(cfg != NULL, "config.json is not JSON");
    const struct {
        const char *key;
        long want;
    } keys[] = {{"n_layer", layers}, {"n_embd", C}, {"n_positions", T}, {"vocab_size", V}};
    for (size_t i = 0; cfg && i < 4; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[i].key);
        EXPECT(cJSON_IsNumber(v) && (long)v->valuedouble == keys[i].want, "config.json %s",
               keys[i].key);
    }
    cJSON *tie = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings") : NULL;
    EXPECT(cJSON_IsTrue(tie), "config.json: tie_word_embeddings is not true");
    cJSON_Delete(cfg);
    free(cb);
    cJSON_Delete(h);
    free(ranges);
    free(b);
}

static void pattern(const char *path, const char *out)
{
    size_t n;
    uint64_t hlen;
    unsigned char *b = slurp(path, &n);
    cJSON *h = header(b, n, &hlen);
    int k = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, h)
    {
        cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        if (!off)
            continue;
        uint64_t begin = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        uint64_t end = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        float *v = (float *)(b + 8 + hlen + begin);
        for (uint64_t i = 0; i < (end - begin) / 4; i++)
            v[i] = (float)(k + 1) + (float)i / 65536.0f; /* tensor k, element i */
        k++;
    }
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f))
        exit(1);
    cJSON_Delete(h);
    free(b);
}

int main(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "check"))
        check(argv[2], atoi(argv[3]), atol(argv[4]), atol(argv[5]), atol(argv[6]));
    else if (argc == 4 && !strcmp(argv[1], "pattern"))
        pattern(argv[2], argv[3]);
    else {
        fprintf(stderr, "usage: %s check FILE LAYERS DIM SEQ VOCAB | pattern FILE OUT\n", argv[0]);
        return 2;
    }
    if (failures)
        fprintf(stderr, "%d failure%s\n", failures, failures > 1 ? "s" : "");
    return failures ? 1 : 0;
}
