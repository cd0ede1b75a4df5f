/* lib/text against Hugging Face `tokenizers`: the ids of two tokenizers (GPT-2's and
 * Llama 3's layouts, trained by make_fixtures.py) equal those `tokenizers` gave on the
 * whole fortunes corpus and on hostile texts; decode inverts encode; the token cache is
 * reused, rebuilt when stale or corrupt and never left partial; bad input is refused
 * with the offending value named. */
#include "../core/check_main.h"

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

#include "core/fault.h"

#define CORPUS_DIR "/usr/share/games/fortunes"

#define OK(call)                                                                          \
    do {                                                                                  \
        fsdp2_status_t ok_s_ = (call);                                                    \
        ck_assert_msg(ok_s_ == FSDP2_SUCCESS, "%s: %s: %s", #call, fsdp2_status_name(ok_s_), \
                      fsdp2_last_error());                                                \
    } while (0)

static const char *const names[] = {"gpt2", "llama3"};

static fsdp2_tokenizer_t *load(const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", TEXT_FIXTURES, name);
    fsdp2_tokenizer_t *tok = NULL;
    OK(fsdp2_tokenizer_load(path, &tok));
    return tok;
}

static char *read_all(const char *path, size_t *len);

/* gpt2 with its ByteLevel pre-tokenizer's add_prefix_space set, as make_fixtures.py
 * makes "gpt2_prefix" */
static fsdp2_tokenizer_t *load_prefixed(void)
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

static int tokenizer_index(const char *name)
{
    return strcmp(name, "gpt2") == 0 ? 0 : strcmp(name, "llama3") == 0 ? 1 : 2;
}

static char *read_all(const char *path, size_t *len)
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

static void write_all(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static uint64_t fnv64(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t ids_fnv(const uint32_t *ids, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        unsigned char le[4] = {(unsigned char)ids[i], (unsigned char)(ids[i] >> 8),
                               (unsigned char)(ids[i] >> 16), (unsigned char)(ids[i] >> 24)};
        h = fnv64(h, le, 4);
    }
    return h;
}

static uint32_t *encode(fsdp2_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                        size_t *count)
{
    size_t n = 0;
    OK(fsdp2_tokenizer_encode(tok, text, len, flags, NULL, 0, &n));
    uint32_t *ids = malloc((n + 1) * sizeof *ids);
    OK(fsdp2_tokenizer_encode(tok, text, len, flags, ids, n, count));
    ck_assert_uint_eq(*count, n);
    return ids;
}

static char *decode(const fsdp2_tokenizer_t *tok, const uint32_t *ids, size_t n, unsigned flags,
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
static size_t repair_reference(const unsigned char *s, size_t len, unsigned char *out)
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

static int hex_value(char c)
{
    return c <= '9' ? c - '0' : c - 'a' + 10;
}

/* ---- the fixtures ---- */

typedef struct fixture_case {
    char tokenizer[16], mode[16];
    unsigned char *input;
    size_t len;
    uint32_t *ids;
    size_t n;
} fixture_case_t;

static fixture_case_t *read_cases(size_t *n_cases)
{
    size_t len;
    char path[4096];
    snprintf(path, sizeof path, "%s/fixtures.txt", TEXT_FIXTURES);
    char *text = read_all(path, &len);
    fixture_case_t *cases = calloc(1024, sizeof *cases);
    size_t n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "case ", 5) != 0)
            continue;
        ck_assert_uint_lt(n, 1024);
        fixture_case_t *c = &cases[n++];
        char hex[65536];
        int used = 0;
        ck_assert_int_eq(sscanf(line, "case %15s %15s %65535s %zu%n", c->tokenizer, c->mode, hex,
                                &c->n, &used), 4);
        size_t hlen = strcmp(hex, "-") == 0 ? 0 : strlen(hex);
        c->len = hlen / 2;
        c->input = malloc(c->len + 1);
        for (size_t i = 0; i < c->len; i++)
            c->input[i] = (unsigned char)(hex_value(hex[2 * i]) << 4 | hex_value(hex[2 * i + 1]));
        c->ids = malloc((c->n + 1) * sizeof *c->ids);
        char *p = line + used;
        for (size_t i = 0; i < c->n; i++)
            c->ids[i] = (uint32_t)strtoul(p, &p, 10);
    }
    free(text);
    *n_cases = n;
    return cases;
}

static void free_cases(fixture_case_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(cases[i].input);
        free(cases[i].ids);
    }
    free(cases);
}

static unsigned mode_flags(const char *mode)
{
    if (strcmp(mode, "special") == 0)
        return FSDP2_TOKENIZER_ADD_SPECIAL;
    if (strcmp(mode, "text") == 0)
        return FSDP2_TOKENIZER_SPECIAL_AS_TEXT;
    return 0;
}

START_TEST(hostile_texts_give_the_ids_of_tokenizers)
{
    size_t n_cases;
    fixture_case_t *cases = read_cases(&n_cases);
    ck_assert_uint_gt(n_cases, 500);
    fsdp2_tokenizer_t *toks[3] = {load(names[0]), load(names[1]), load_prefixed()};
    size_t failures = 0;
    for (size_t k = 0; k < n_cases; k++) {
        fixture_case_t *c = &cases[k];
        fsdp2_tokenizer_t *tok = toks[tokenizer_index(c->tokenizer)];
        size_t n;
        uint32_t *ids = encode(tok, (const char *)c->input, c->len, mode_flags(c->mode), &n);
        size_t i = 0;
        while (i < n && i < c->n && ids[i] == c->ids[i])
            i++;
        if (n != c->n || i < n) {
            failures++;
            fprintf(stderr, "%s %s case %zu (%zu bytes '%.40s'): %zu ids, tokenizers %zu; first "
                    "difference at %zu: %" PRIu32 " vs %" PRIu32 "\n", c->tokenizer, c->mode, k,
                    c->len, (const char *)c->input, n, c->n, i, i < n ? ids[i] : 0,
                    i < c->n ? c->ids[i] : 0);
        }
        free(ids);
    }
    ck_assert_msg(failures == 0, "%zu of %zu cases differ from tokenizers (listed above)", failures,
                  n_cases);
    fsdp2_tokenizer_destroy(toks[0]);
    fsdp2_tokenizer_destroy(toks[1]);
    fsdp2_tokenizer_destroy(toks[2]);
    free_cases(cases, n_cases);
}
END_TEST

/* The whole corpus (or, under a sanitizer, each file's first 64 KiB of lines, which the
 * fixture cannot check by hash: there only decode(encode(x)) is checked). */
START_TEST(whole_corpus_gives_the_ids_of_tokenizers)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/fixtures.txt", TEXT_FIXTURES);
    size_t len;
    char *text = read_all(path, &len);
    fsdp2_tokenizer_t *toks[2] = {load(names[0]), load(names[1])};
    size_t files = 0, failures = 0;
    struct stat st;
    if (stat(CORPUS_DIR, &st) != 0) {
        fprintf(stderr, "SKIP: %s is missing (Debian's fortunes package)\n", CORPUS_DIR);
        goto done;
    }
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char tname[16], file[256];
        uint64_t bytes, text_fnv, count, fnv;
        if (sscanf(line, "corpus %15s %255s %" SCNu64 " %" SCNx64 " %" SCNu64 " %" SCNx64, tname,
                   file, &bytes, &text_fnv, &count, &fnv) != 6)
            continue;
        char fpath[4096];
        snprintf(fpath, sizeof fpath, "%s/%s", CORPUS_DIR, file);
        size_t flen;
        char *data = read_all(fpath, &flen);
        ck_assert_msg(flen == bytes && fnv64(0xcbf29ce484222325ull, data, flen) == text_fnv,
                      "%s differs from the file the fixtures were made from (%zu bytes, fixture "
                      "%" PRIu64 "): make the fixtures again", fpath, flen, bytes);
        fsdp2_tokenizer_t *tok = toks[strcmp(tname, "gpt2") == 0 ? 0 : 1];
        size_t n;
        uint32_t *ids = encode(tok, data, flen, 0, &n);
        if (n != count || ids_fnv(ids, n) != fnv) {
            failures++;
            fprintf(stderr, "%s on %s: %zu ids (hash %016" PRIx64 "), tokenizers %" PRIu64
                    " (%016" PRIx64 ")\n", tname, file, n, ids_fnv(ids, n), count, fnv);
        }
        files++;
        free(ids);
        free(data);
    }
    ck_assert_uint_gt(files, 20);
    ck_assert_msg(failures == 0, "%zu of %zu corpus files differ from tokenizers", failures, files);
done:
    fsdp2_tokenizer_destroy(toks[0]);
    fsdp2_tokenizer_destroy(toks[1]);
    free(text);
}
END_TEST

START_TEST(decode_inverts_encode_and_repairs_invalid_utf8_as_python)
{
    size_t n_cases;
    fixture_case_t *cases = read_cases(&n_cases);
    fsdp2_tokenizer_t *toks[2] = {load(names[0]), load(names[1])};
    for (size_t k = 0; k < n_cases; k++) {
        fixture_case_t *c = &cases[k];
        if (strcmp(c->mode, "special") == 0 || tokenizer_index(c->tokenizer) == 2)
            continue; /* the template's token, the prefix space: added, not read */
        fsdp2_tokenizer_t *tok = toks[tokenizer_index(c->tokenizer)];
        unsigned char *want = malloc(3 * c->len + 1);
        size_t want_len = repair_reference(c->input, c->len, want);
        size_t n, got_len;
        uint32_t *ids = encode(tok, (const char *)c->input, c->len, mode_flags(c->mode), &n);
        char *got = decode(tok, ids, n, 0, &got_len);
        ck_assert_msg(got_len == want_len && memcmp(got, want, want_len) == 0,
                      "%s %s case %zu: decode(encode(x)) has %zu bytes, x (repaired) %zu",
                      c->tokenizer, c->mode, k, got_len, want_len);
        free(got);
        free(ids);
        free(want);
    }
    /* long runs: linear time, and still inverted */
    static const char fills[] = {'a', ' ', '\n', '9', '!'};
    size_t big = 1 << 20;
    char *text = malloc(big);
    for (size_t f = 0; f < sizeof fills; f++) {
        memset(text, fills[f], big);
        for (int t = 0; t < 2; t++) {
            size_t n, got_len;
            uint32_t *ids = encode(toks[t], text, big, 0, &n);
            char *got = decode(toks[t], ids, n, 0, &got_len);
            ck_assert_msg(got_len == big && memcmp(got, text, big) == 0,
                          "%s: a run of 1 MiB of '%c' does not come back", names[t], fills[f]);
            free(got);
            free(ids);
        }
    }
    free(text);
    fsdp2_tokenizer_destroy(toks[0]);
    fsdp2_tokenizer_destroy(toks[1]);
    free_cases(cases, n_cases);
}
END_TEST

static char *fixture_json(const char *name, size_t *len);

static uint64_t next_random(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* Random texts built from the pieces that stress each stage: special tokens and their
 * fragments, contractions, CRLF and other whitespace, digits, multi-byte characters and
 * parts of them. Every one must encode, and decode to itself repaired. */
START_TEST(random_texts_round_trip)
{
    static const char *const pieces[] = {
        "<|endoftext|>", "<|begin_of_text|>", "<|end", "of", "text|>", "<|", "|>", "'s", "'LL",
        "'", " ", "  ", "\t", "\r\n", "\n", "\r", "\xc2\x85", "\xe3\x80\x80", "a", "Z", "the",
        " the", "123", "4567", "\xe6\x95\xb0", "\xd8\xb9", "\xf0\x9f\x98\x80", "\xcc\x81", "\xe2\x80",
        "\x80", "\xff", "\xc3", "!", "...", "\x00", "\xef\xbb\xbf"};
    size_t n_pieces = sizeof pieces / sizeof pieces[0];
    fsdp2_tokenizer_t *toks[3] = {load(names[0]), load(names[1]), load_prefixed()};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    char text[2048];
    unsigned char want[3 * sizeof text];
    for (int round = 0; round < 3000; round++) {
        size_t len = 0, parts = next_random(&x) % 40;
        for (size_t p = 0; p < parts; p++) {
            const char *piece = pieces[next_random(&x) % n_pieces];
            size_t pl = strlen(piece);
            if (strcmp(piece, "\x00") == 0)
                pl = 1;
            memcpy(text + len, piece, pl);
            len += pl;
        }
        size_t want_len = repair_reference((const unsigned char *)text, len, want);
        for (int t = 0; t < 3; t++) {
            for (unsigned flags = 0; flags < 2; flags++) {
                size_t n, got_len;
                uint32_t *ids = encode(toks[t], text, len, flags ? FSDP2_TOKENIZER_SPECIAL_AS_TEXT : 0, &n);
                char *got = decode(toks[t], ids, n, 0, &got_len);
                /* add_prefix_space adds a space to each piece between added tokens */
                if (t < 2)
                    ck_assert_msg(got_len == want_len && memcmp(got, want, want_len) == 0,
                                  "%s, round %d: decode(encode(x)) differs from x", names[t], round);
                free(got);
                free(ids);
            }
        }
    }
    for (int t = 0; t < 3; t++)
        fsdp2_tokenizer_destroy(toks[t]);
}
END_TEST

/* Byte flips and cuts of a valid file: each load either succeeds or fails with a status
 * and a message; nothing crashes, leaks or hangs. */
START_TEST(damaged_files_fail_cleanly)
{
    size_t len;
    char *json = fixture_json("llama3", &len);
    char *copy = malloc(len);
    uint64_t x = 0x2545f4914f6cdd1dull;
    int refused = 0;
    for (int round = 0; round < 300; round++) {
        memcpy(copy, json, len);
        size_t use = len;
        int flips = 1 + (int)(next_random(&x) % 4);
        for (int f = 0; f < flips; f++)
            copy[next_random(&x) % len] = (char)next_random(&x);
        if (round % 5 == 0)
            use = next_random(&x) % len;
        fsdp2_tokenizer_t *tok = NULL;
        fsdp2_status_t s = fsdp2_tokenizer_load_buffer(copy, use, "damaged", &tok);
        if (s != FSDP2_SUCCESS) {
            refused++;
            ck_assert_ptr_null(tok);
            ck_assert_msg(strstr(fsdp2_last_error(), "damaged") != NULL, "message: %s",
                          fsdp2_last_error());
            continue;
        }
        size_t n;
        static const char sample[] = "It's 12345 o'clock\r\n<|eot_id|> \xe6\x95\xb0";
        uint32_t *ids = encode(tok, sample, sizeof sample - 1, 0, &n);
        free(ids);
        fsdp2_tokenizer_destroy(tok);
    }
    ck_assert_int_gt(refused, 60);
    free(copy);
    free(json);
}
END_TEST

START_TEST(word_cache_evictions_do_not_change_ids)
{
    /* 200k distinct short words overflow the 64k-slot cache many times over */
    size_t cap = 200000 * 8, len = 0;
    char *text = malloc(cap);
    uint64_t x = 88172645463325252ull;
    for (int w = 0; w < 200000; w++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int wl = 1 + (int)(x % 6);
        text[len++] = ' ';
        for (int i = 0; i < wl; i++)
            text[len++] = (char)('a' + (x >> (8 + 5 * i)) % 26);
    }
    for (int t = 0; t < 2; t++) {
        fsdp2_tokenizer_t *warm = load(names[t]);
        size_t n1, n2, n3;
        uint32_t *a = encode(warm, text, len, 0, &n1);
        uint32_t *b = encode(warm, text, len, 0, &n2);
        fsdp2_tokenizer_t *fresh = load(names[t]);
        uint32_t *c = encode(fresh, text + len / 2, len - len / 2, 0, &n3);
        ck_assert_uint_eq(n1, n2);
        ck_assert_msg(memcmp(a, b, n1 * sizeof *a) == 0, "%s: a second pass differs", names[t]);
        size_t m, tail_n;
        uint32_t *tail = encode(warm, text + len / 2, len - len / 2, 0, &tail_n);
        (void)m;
        ck_assert_uint_eq(tail_n, n3);
        ck_assert_msg(memcmp(tail, c, n3 * sizeof *c) == 0, "%s: a warm cache differs from a cold one",
                      names[t]);
        free(a);
        free(b);
        free(c);
        free(tail);
        fsdp2_tokenizer_destroy(warm);
        fsdp2_tokenizer_destroy(fresh);
    }
    free(text);
}
END_TEST

START_TEST(small_buffers_are_refused_with_the_size_needed)
{
    fsdp2_tokenizer_t *tok = load("gpt2");
    const char *text = "Hello, World! How's it going?";
    size_t n = 0;
    OK(fsdp2_tokenizer_encode(tok, text, strlen(text), 0, NULL, 0, &n));
    ck_assert_uint_gt(n, 3);
    uint32_t ids[64], few[2];
    size_t got = 0;
    ck_assert_int_eq(fsdp2_tokenizer_encode(tok, text, strlen(text), 0, few, 2, &got),
                     FSDP2_ERR_OVERFLOW);
    ck_assert_uint_eq(got, n);
    char want[64];
    snprintf(want, sizeof want, "%zu ids do not fit in a capacity of 2", n);
    ck_assert_msg(strstr(fsdp2_last_error(), want), "message: %s", fsdp2_last_error());
    OK(fsdp2_tokenizer_encode(tok, text, strlen(text), 0, ids, 64, &got));
    ck_assert_uint_eq(got, n);
    char buf[8];
    size_t len = 0;
    ck_assert_int_eq(fsdp2_tokenizer_decode(tok, ids, n, 0, buf, sizeof buf, &len),
                     FSDP2_ERR_OVERFLOW);
    ck_assert_uint_eq(len, strlen(text));
    ck_assert_int_eq(fsdp2_tokenizer_encode(tok, text, 3, 0x80, ids, 64, &got),
                     FSDP2_ERR_INVALID_ARGUMENT);
    fsdp2_tokenizer_destroy(tok);
}
END_TEST

START_TEST(lookups_and_special_ids_follow_the_file)
{
    fsdp2_tokenizer_t *gpt2 = load("gpt2"), *llama = load("llama3");
    size_t size;
    OK(fsdp2_tokenizer_vocab_size(gpt2, &size));
    ck_assert_uint_eq(size, 3001);
    OK(fsdp2_tokenizer_vocab_size(llama, &size));
    ck_assert_uint_eq(size, 4007);
    for (int t = 0; t < 2; t++) {
        fsdp2_tokenizer_t *tok = t ? llama : gpt2;
        OK(fsdp2_tokenizer_vocab_size(tok, &size));
        for (uint32_t id = 0; id < size; id++) {
            const char *s;
            size_t len;
            uint32_t back;
            OK(fsdp2_tokenizer_id_to_token(tok, id, &s, &len));
            ck_assert_uint_eq(strlen(s), len);
            OK(fsdp2_tokenizer_token_to_id(tok, s, len, &back));
            ck_assert_uint_eq(back, id);
        }
        const char *s;
        ck_assert_int_eq(fsdp2_tokenizer_id_to_token(tok, (uint32_t)size, &s, NULL),
                         FSDP2_ERR_NOT_FOUND);
        uint32_t id;
        ck_assert_int_eq(fsdp2_tokenizer_token_to_id(tok, "no such token", 13, &id),
                         FSDP2_ERR_NOT_FOUND);
        ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "'no such token'"));
    }
    uint32_t id, want;
    OK(fsdp2_tokenizer_token_to_id(gpt2, "<|endoftext|>", 13, &want));
    OK(fsdp2_tokenizer_bos_id(gpt2, &id));
    ck_assert_uint_eq(id, want);
    OK(fsdp2_tokenizer_eos_id(gpt2, &id));
    ck_assert_uint_eq(id, want);
    OK(fsdp2_tokenizer_token_to_id(llama, "<|begin_of_text|>", 17, &want));
    OK(fsdp2_tokenizer_bos_id(llama, &id));
    ck_assert_uint_eq(id, want);
    OK(fsdp2_tokenizer_token_to_id(llama, "<|end_of_text|>", 15, &want));
    OK(fsdp2_tokenizer_eos_id(llama, &id));
    ck_assert_uint_eq(id, want);
    /* " the" is stored as "Ġthe" */
    OK(fsdp2_tokenizer_token_to_id(gpt2, "\xC4\xA0the", 5, &id));
    size_t len;
    char buf[32];
    OK(fsdp2_tokenizer_decode(gpt2, &id, 1, 0, buf, sizeof buf, &len));
    ck_assert_uint_eq(len, 4);
    ck_assert_int_eq(memcmp(buf, " the", 4), 0);
    /* special tokens decode as themselves, or not at all */
    uint32_t ids[2];
    OK(fsdp2_tokenizer_bos_id(llama, &ids[0]));
    ids[1] = id;
    OK(fsdp2_tokenizer_decode(llama, ids, 1, 0, buf, sizeof buf, &len));
    ck_assert_uint_eq(len, 17);
    OK(fsdp2_tokenizer_decode(llama, ids, 1, FSDP2_TOKENIZER_SKIP_SPECIAL, buf, sizeof buf, &len));
    ck_assert_uint_eq(len, 0);
    uint64_t h1, h2;
    OK(fsdp2_tokenizer_hash(gpt2, &h1));
    OK(fsdp2_tokenizer_hash(llama, &h2));
    ck_assert_uint_ne(h1, h2);
    /* decode refuses an id with no token before writing anything */
    uint32_t bad[2] = {id, 999999};
    memset(buf, 'x', sizeof buf);
    ck_assert_int_eq(fsdp2_tokenizer_decode(gpt2, bad, 2, 0, buf, sizeof buf, &len),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "ids[1] = 999999 is out of range"), "message: %s",
                  fsdp2_last_error());
    ck_assert_int_eq(buf[0], 'x');
    fsdp2_tokenizer_destroy(gpt2);
    fsdp2_tokenizer_destroy(llama);
}
END_TEST

/* ---- refused input ---- */

static char *fixture_json(const char *name, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", TEXT_FIXTURES, name);
    return read_all(path, len);
}

/* The gpt2 fixture with edit applied, loaded from memory: the status and a part of the
 * message are checked. */
static void expect_refused(const char *name, void (*edit)(cJSON *), fsdp2_status_t want,
                           const char *message)
{
    size_t len;
    char *json = fixture_json(name, &len);
    cJSON *root = cJSON_Parse(json);
    edit(root);
    char *text = cJSON_PrintUnformatted(root);
    fsdp2_tokenizer_t *tok = (fsdp2_tokenizer_t *)0x1;
    fsdp2_status_t s = fsdp2_tokenizer_load_buffer(text, strlen(text), "edited.json", &tok);
    ck_assert_msg(s == want, "expected %s for '%s', got %s: %s", fsdp2_status_name(want), message,
                  fsdp2_status_name(s), fsdp2_last_error());
    ck_assert_msg(strstr(fsdp2_last_error(), message) != NULL, "message '%s' lacks '%s'",
                  fsdp2_last_error(), message);
    ck_assert_ptr_null(tok);
    cJSON_free(text);
    cJSON_Delete(root);
    free(json);
}

static cJSON *model_of(cJSON *root)
{
    return cJSON_GetObjectItem(root, "model");
}

static void set_model_type(cJSON *r)
{
    cJSON_ReplaceItemInObject(model_of(r), "type", cJSON_CreateString("WordPiece"));
}
static void set_merge_unknown(cJSON *r)
{
    cJSON *merges = cJSON_GetObjectItem(model_of(r), "merges");
    cJSON_ReplaceItemInArray(merges, 5, cJSON_CreateString("zzzunknown t"));
}
static void set_merge_bad_format(cJSON *r)
{
    cJSON *merges = cJSON_GetObjectItem(model_of(r), "merges");
    cJSON_ReplaceItemInArray(merges, 7, cJSON_CreateString("abc"));
}
static void set_normalizer(cJSON *r)
{
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "type", "NFC");
    cJSON_ReplaceItemInObject(r, "normalizer", n);
}
static void set_pre_whitespace(cJSON *r)
{
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "type", "Whitespace");
    cJSON_ReplaceItemInObject(r, "pre_tokenizer", n);
}
static void set_split_removed(cJSON *r)
{
    cJSON *seq = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "pre_tokenizer"), "pretokenizers");
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(seq, 0), "behavior", cJSON_CreateString("Removed"));
}
static void set_split_bad_regex(cJSON *r)
{
    cJSON *seq = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "pre_tokenizer"), "pretokenizers");
    cJSON *pattern = cJSON_CreateObject();
    cJSON_AddStringToObject(pattern, "Regex", "(unclosed");
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(seq, 0), "pattern", pattern);
}
static void set_lstrip(cJSON *r)
{
    cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "added_tokens"), 0);
    cJSON_ReplaceItemInObject(t, "lstrip", cJSON_CreateTrue());
}
static void set_dropout(cJSON *r)
{
    cJSON_ReplaceItemInObject(model_of(r), "dropout", cJSON_CreateNumber(0.1));
}
static void set_byte_fallback(cJSON *r)
{
    cJSON_ReplaceItemInObject(model_of(r), "byte_fallback", cJSON_CreateTrue());
}
static void set_prefix(cJSON *r)
{
    cJSON_ReplaceItemInObject(model_of(r), "continuing_subword_prefix", cJSON_CreateString("##"));
}
static void set_decoder_wordpiece(cJSON *r)
{
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "type", "WordPiece");
    cJSON_ReplaceItemInObject(r, "decoder", n);
}
static void set_negative_id(cJSON *r)
{
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(model_of(r), "vocab"), "the", cJSON_CreateNumber(-4));
}
static void set_truncation(cJSON *r)
{
    cJSON *n = cJSON_CreateObject();
    cJSON_AddNumberToObject(n, "max_length", 512);
    cJSON_ReplaceItemInObject(r, "truncation", n);
}

START_TEST(unsupported_or_broken_tokenizers_are_refused_by_name)
{
    expect_refused("gpt2", set_model_type, FSDP2_ERR_UNSUPPORTED, "model type WordPiece is not supported");
    expect_refused("gpt2", set_merge_unknown, FSDP2_ERR_CORRUPT,
                   "merge 5 names token 'zzzunknown', which is not in the vocab");
    expect_refused("gpt2", set_merge_bad_format, FSDP2_ERR_CORRUPT, "merge 7 'abc' is not two tokens");
    expect_refused("gpt2", set_normalizer, FSDP2_ERR_UNSUPPORTED, "normalizer NFC is not supported");
    expect_refused("gpt2", set_pre_whitespace, FSDP2_ERR_UNSUPPORTED,
                   "pre_tokenizer type Whitespace is not supported");
    expect_refused("llama3", set_split_removed, FSDP2_ERR_UNSUPPORTED,
                   "Split behavior Removed is not supported");
    expect_refused("llama3", set_split_bad_regex, FSDP2_ERR_CORRUPT,
                   "pattern '(unclosed' does not compile");
    expect_refused("gpt2", set_lstrip, FSDP2_ERR_UNSUPPORTED,
                   "added token '<|endoftext|>' sets lstrip");
    expect_refused("gpt2", set_dropout, FSDP2_ERR_UNSUPPORTED, "model.dropout");
    expect_refused("gpt2", set_byte_fallback, FSDP2_ERR_UNSUPPORTED, "model.byte_fallback true");
    expect_refused("gpt2", set_prefix, FSDP2_ERR_UNSUPPORTED, "continuing_subword_prefix ## is not");
    expect_refused("gpt2", set_decoder_wordpiece, FSDP2_ERR_UNSUPPORTED,
                   "decoder WordPiece is not supported");
    expect_refused("gpt2", set_negative_id, FSDP2_ERR_CORRUPT, "'the' has an id that is not");
    expect_refused("gpt2", set_truncation, FSDP2_ERR_UNSUPPORTED, "truncation (set) is not supported");
}
END_TEST

static char tmp_dir[256];

static void make_tmp_dir(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/fsdp2-text-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void remove_tmp_dir(void)
{
    DIR *d = opendir(tmp_dir);
    struct dirent *e;
    char path[600];
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", tmp_dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(tmp_dir);
}

static int count_files(void)
{
    DIR *d = opendir(tmp_dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

START_TEST(bad_files_are_refused_without_blocking)
{
    make_tmp_dir();
    fsdp2_tokenizer_t *tok = NULL;
    char path[600];
    snprintf(path, sizeof path, "%s/missing.json", tmp_dir);
    ck_assert_int_eq(fsdp2_tokenizer_load(path, &tok), FSDP2_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), path));
    ck_assert_int_eq(fsdp2_tokenizer_load(tmp_dir, &tok), FSDP2_ERR_IO);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "not a regular file (a directory)"));
    snprintf(path, sizeof path, "%s/fifo.json", tmp_dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    double t0 = now();
    ck_assert_int_eq(fsdp2_tokenizer_load(path, &tok), FSDP2_ERR_IO);
    ck_assert_msg(now() - t0 < 1.0, "a FIFO took %.2f s to refuse", now() - t0);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "not a regular file (a FIFO)"));
    ck_assert_ptr_null(tok);
    /* truncated JSON */
    size_t len;
    char *json = fixture_json("gpt2", &len);
    snprintf(path, sizeof path, "%s/truncated.json", tmp_dir);
    write_all(path, json, len / 2);
    ck_assert_int_eq(fsdp2_tokenizer_load(path, &tok), FSDP2_ERR_CORRUPT);
    ck_assert_msg(strstr(fsdp2_last_error(), "invalid JSON at byte") &&
                      strstr(fsdp2_last_error(), "truncated"),
                  "message: %s", fsdp2_last_error());
    /* invalid JSON */
    write_all(path, "{\"model\": [1, 2,, 3]}", 21);
    ck_assert_int_eq(fsdp2_tokenizer_load(path, &tok), FSDP2_ERR_CORRUPT);
    ck_assert_msg(strstr(fsdp2_last_error(), "invalid JSON at byte 16 (line 1)"), "message: %s",
                  fsdp2_last_error());
    write_all(path, "[]", 2);
    ck_assert_int_eq(fsdp2_tokenizer_load(path, &tok), FSDP2_ERR_CORRUPT);
    ck_assert_int_eq(fsdp2_tokenizer_load(NULL, &tok), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(tok);
    free(json);
    remove_tmp_dir();
}
END_TEST

/* ---- the token cache ---- */

static const char cache_text[] =
    "The quick brown fox jumps over the lazy dog.\n%\nIt's 3:14 in the morning; "
    "<|endoftext|> naïve café 数据\n";

START_TEST(token_cache_is_reused_and_rebuilt_when_stale_or_corrupt)
{
    make_tmp_dir();
    fsdp2_tokenizer_t *tok = load("gpt2");
    char text_path[600], cache_path[600];
    snprintf(text_path, sizeof text_path, "%s/text.txt", tmp_dir);
    snprintf(cache_path, sizeof cache_path, "%s/text.tokens", tmp_dir);
    write_all(text_path, cache_text, strlen(cache_text));
    size_t want_n;
    uint32_t *want = encode(tok, cache_text, strlen(cache_text), 0, &want_n);
    uint32_t *ids;
    size_t n;
    int hit;
    for (int round = 0; round < 2; round++) {
        OK(fsdp2_tokenizer_encode_file(tok, text_path, cache_path, 0, &ids, &n, &hit));
        ck_assert_int_eq(hit, round);
        ck_assert_uint_eq(n, want_n);
        ck_assert_int_eq(memcmp(ids, want, n * sizeof *ids), 0);
        fsdp2_tokenizer_ids_free(ids);
    }
    /* other flags: rebuilt */
    OK(fsdp2_tokenizer_encode_file(tok, text_path, cache_path, FSDP2_TOKENIZER_SPECIAL_AS_TEXT,
                                   &ids, &n, &hit));
    ck_assert_int_eq(hit, 0);
    ck_assert_uint_gt(n, want_n);
    fsdp2_tokenizer_ids_free(ids);
    /* the text changes (same size): rebuilt, then reused */
    char changed[sizeof cache_text];
    memcpy(changed, cache_text, sizeof cache_text);
    changed[4] = 'Q';
    write_all(text_path, changed, strlen(changed));
    for (int round = 0; round < 2; round++) {
        OK(fsdp2_tokenizer_encode_file(tok, text_path, cache_path, 0, &ids, &n, &hit));
        ck_assert_int_eq(hit, round);
        size_t cn;
        uint32_t *c = encode(tok, changed, strlen(changed), 0, &cn);
        ck_assert_uint_eq(n, cn);
        ck_assert_int_eq(memcmp(ids, c, n * sizeof *ids), 0);
        free(c);
        fsdp2_tokenizer_ids_free(ids);
    }
    /* corrupt: a flipped id byte, then a truncated file, then garbage */
    size_t clen;
    char *cache = read_all(cache_path, &clen);
    ck_assert_uint_eq(clen, 48 + 4 * n + 8);
    for (int kind = 0; kind < 3; kind++) {
        char *bad = malloc(clen);
        memcpy(bad, cache, clen);
        if (kind == 0)
            bad[52] ^= 1;
        if (kind == 2)
            memset(bad, 0xAB, clen);
        write_all(cache_path, bad, kind == 1 ? clen - 5 : clen);
        free(bad);
        OK(fsdp2_tokenizer_encode_file(tok, text_path, cache_path, 0, &ids, &n, &hit));
        ck_assert_msg(hit == 0, "corruption %d was trusted", kind);
        fsdp2_tokenizer_ids_free(ids);
        size_t again;
        char *rewritten = read_all(cache_path, &again);
        ck_assert_uint_eq(again, clen);
        ck_assert_int_eq(memcmp(rewritten, cache, clen), 0);
        free(rewritten);
    }
    free(cache);
    /* a directory: the file is named for the text and the tokenizer */
    OK(fsdp2_tokenizer_encode_file(tok, text_path, tmp_dir, 0, &ids, &n, &hit));
    ck_assert_int_eq(hit, 0);
    fsdp2_tokenizer_ids_free(ids);
    uint64_t h;
    OK(fsdp2_tokenizer_hash(tok, &h));
    char named[700];
    snprintf(named, sizeof named, "%s/text.txt.%016" PRIx64 ".tokens", tmp_dir, h);
    struct stat st;
    ck_assert_msg(stat(named, &st) == 0, "%s was not written", named);
    OK(fsdp2_tokenizer_encode_file(tok, text_path, tmp_dir, 0, &ids, &n, &hit));
    ck_assert_int_eq(hit, 1);
    fsdp2_tokenizer_ids_free(ids);
    /* no cache */
    OK(fsdp2_tokenizer_encode_file(tok, text_path, NULL, 0, &ids, &n, &hit));
    ck_assert_int_eq(hit, 0);
    fsdp2_tokenizer_ids_free(ids);
    /* a text of more ids than bytes / 2 (each invalid byte is a U+FFFD): encoded again at
     * its count */
    char *invalid = malloc(4096);
    memset(invalid, 0xFF, 4096);
    write_all(text_path, invalid, 4096);
    OK(fsdp2_tokenizer_encode_file(tok, text_path, NULL, 0, &ids, &n, &hit));
    size_t in;
    uint32_t *iids = encode(tok, invalid, 4096, 0, &in);
    ck_assert_uint_gt(in, 4096 / 2 + 64);
    ck_assert_uint_eq(n, in);
    ck_assert_int_eq(memcmp(ids, iids, n * sizeof *ids), 0);
    fsdp2_tokenizer_ids_free(ids);
    free(iids);
    free(invalid);
    /* a missing text */
    snprintf(named, sizeof named, "%s/none.txt", tmp_dir);
    ck_assert_int_eq(fsdp2_tokenizer_encode_file(tok, named, cache_path, 0, &ids, &n, &hit),
                     FSDP2_ERR_NOT_FOUND);
    ck_assert_ptr_null(ids);
    ck_assert_int_eq(count_files(), 3);
    free(want);
    fsdp2_tokenizer_destroy(tok);
    remove_tmp_dir();
}
END_TEST

START_TEST(a_failed_cache_write_leaves_no_file)
{
    make_tmp_dir();
    fsdp2_tokenizer_t *tok = load("llama3");
    char text_path[600], cache_path[600];
    snprintf(text_path, sizeof text_path, "%s/text.txt", tmp_dir);
    snprintf(cache_path, sizeof cache_path, "%s/text.tokens", tmp_dir);
    write_all(text_path, cache_text, strlen(cache_text));
    uint32_t *ids;
    size_t n;
    fsdp2_fault_arm(FAULT_NONE, 0);
    OK(fsdp2_tokenizer_encode_file(tok, text_path, cache_path, 0, &ids, &n, NULL));
    uint64_t io_points = fsdp2_fault_count(FAULT_IO), alloc_points = fsdp2_fault_count(FAULT_ALLOC);
    fsdp2_fault_disarm();
    fsdp2_tokenizer_ids_free(ids);
    ck_assert_uint_ge(io_points, 3); /* read the text, write, fsync */
    unlink(cache_path);
    for (int kind = 0; kind < 2; kind++) {
        uint64_t points = kind ? alloc_points : io_points;
        for (uint64_t at = 1; at <= points; at++) {
            fsdp2_fault_arm(kind ? FAULT_ALLOC : FAULT_IO, at);
            fsdp2_status_t s = fsdp2_tokenizer_encode_file(tok, text_path, cache_path, 0, &ids, &n, NULL);
            int fired = fsdp2_fault_fired();
            fsdp2_fault_disarm();
            ck_assert_msg(s != FSDP2_SUCCESS || !fired, "%s point %" PRIu64 " failed, yet success",
                          kind ? "alloc" : "io", at);
            if (s != FSDP2_SUCCESS) {
                ck_assert_ptr_null(ids);
                ck_assert_msg(count_files() == 1, "%s point %" PRIu64 " left %d files", kind ? "alloc" : "io",
                              at, count_files());
            } else {
                fsdp2_tokenizer_ids_free(ids);
                unlink(cache_path);
            }
        }
    }
    /* every allocation of a load may fail, cleanly */
    size_t len;
    char *json = fixture_json("llama3", &len);
    fsdp2_tokenizer_t *t2;
    fsdp2_fault_arm(FAULT_NONE, 0);
    OK(fsdp2_tokenizer_load_buffer(json, len, "llama3", &t2));
    alloc_points = fsdp2_fault_count(FAULT_ALLOC);
    fsdp2_fault_disarm();
    fsdp2_tokenizer_destroy(t2);
    for (uint64_t at = 1; at <= alloc_points; at++) {
        fsdp2_fault_arm(FAULT_ALLOC, at);
        fsdp2_status_t s = fsdp2_tokenizer_load_buffer(json, len, "llama3", &t2);
        fsdp2_fault_disarm();
        ck_assert_int_eq(s, FSDP2_ERR_OUT_OF_MEMORY);
        ck_assert_ptr_null(t2);
    }
    free(json);
    fsdp2_tokenizer_destroy(tok);
    remove_tmp_dir();
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("tokenizer");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, hostile_texts_give_the_ids_of_tokenizers);
    tcase_add_test(tc, whole_corpus_gives_the_ids_of_tokenizers);
    tcase_add_test(tc, decode_inverts_encode_and_repairs_invalid_utf8_as_python);
    tcase_add_test(tc, random_texts_round_trip);
    tcase_add_test(tc, damaged_files_fail_cleanly);
    tcase_add_test(tc, word_cache_evictions_do_not_change_ids);
    tcase_add_test(tc, small_buffers_are_refused_with_the_size_needed);
    tcase_add_test(tc, lookups_and_special_ids_follow_the_file);
    tcase_add_test(tc, unsupported_or_broken_tokenizers_are_refused_by_name);
    tcase_add_test(tc, bad_files_are_refused_without_blocking);
    tcase_add_test(tc, token_cache_is_reused_and_rebuilt_when_stale_or_corrupt);
    tcase_add_test(tc, a_failed_cache_write_leaves_no_file);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(tokenizer_suite)
