/* lib/text's API beyond the ids: look-ups and special ids, buffer sizes, the token cache
 * (reused, rebuilt when stale or corrupt, never left partial when a write or an
 * allocation fails), and bad input refused with the offending value named. */
#include "../core/check_main.h"
#include "text_test_util.h"

#include "core/fault.h"

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

/* The named fixture with edit applied, loaded from memory: the status and a part of the
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
static void set_no_byte_level(cJSON *r)
{
    cJSON *seq = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "pre_tokenizer"), "pretokenizers");
    cJSON_DeleteItemFromArray(seq, 1);
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
    expect_refused("llama3", set_no_byte_level, FSDP2_ERR_UNSUPPORTED,
                   "pre_tokenizer without ByteLevel is not supported");
    expect_refused("gpt2", set_truncation, FSDP2_ERR_UNSUPPORTED, "truncation (set) is not supported");
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

static Suite *tokenizer_api_suite(void)
{
    Suite *s = suite_create("tokenizer_api");
    TCase *tc = tcase_create("api");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, small_buffers_are_refused_with_the_size_needed);
    tcase_add_test(tc, lookups_and_special_ids_follow_the_file);
    tcase_add_test(tc, unsupported_or_broken_tokenizers_are_refused_by_name);
    tcase_add_test(tc, damaged_files_fail_cleanly);
    tcase_add_test(tc, bad_files_are_refused_without_blocking);
    tcase_add_test(tc, token_cache_is_reused_and_rebuilt_when_stale_or_corrupt);
    tcase_add_test(tc, a_failed_cache_write_leaves_no_file);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(tokenizer_api_suite)
