/* lib/text against Hugging Face `tokenizers`: the ids of two tokenizers (GPT-2's and
 * Llama 3's layouts, trained by make_fixtures.py, and GPT-2's with add_prefix_space)
 * equal those `tokenizers` gave on the whole fortunes corpus and on hostile texts;
 * decode inverts encode, also on random texts; the word cache never changes an id. */
#include "../core/check_main.h"
#include "text_test_util.h"

/* ---- the fixtures ---- */

typedef struct fixture_case {
    char tokenizer[16], mode[16];
    unsigned char *input;
    size_t len;
    uint32_t *ids;
    size_t n;
} fixture_case_t;

static int hex_value(char c)
{
    return c <= '9' ? c - '0' : c - 'a' + 10;
}

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
    /* long runs: linear time, and still inverted (the sanitizer builds, which set
     * FSDP2_TEST_SANITIZED=1 and only need the paths, take runs of 64 KiB) */
    static const char fills[] = {'a', ' ', '\n', '9', '!'};
    const char *sanitized = getenv("FSDP2_TEST_SANITIZED");
    size_t big = sanitized && strcmp(sanitized, "1") == 0 ? 1 << 16 : 1 << 20;
    char *text = malloc(big);
    for (size_t f = 0; f < sizeof fills; f++) {
        memset(text, fills[f], big);
        for (int t = 0; t < 2; t++) {
            size_t n, got_len;
            uint32_t *ids = encode(toks[t], text, big, 0, &n);
            char *got = decode(toks[t], ids, n, 0, &got_len);
            ck_assert_msg(got_len == big && memcmp(got, text, big) == 0,
                          "%s: a run of %zu bytes of '%c' does not come back", names[t], big,
                          fills[f]);
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

static Suite *tokenizer_ids_suite(void)
{
    Suite *s = suite_create("tokenizer_ids");
    TCase *tc = tcase_create("ids");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, hostile_texts_give_the_ids_of_tokenizers);
    tcase_add_test(tc, whole_corpus_gives_the_ids_of_tokenizers);
    tcase_add_test(tc, decode_inverts_encode_and_repairs_invalid_utf8_as_python);
    tcase_add_test(tc, random_texts_round_trip);
    tcase_add_test(tc, word_cache_evictions_do_not_change_ids);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(tokenizer_ids_suite)
