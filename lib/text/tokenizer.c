/* The public tokenizer API: load, destroy, encode, decode and the look-ups. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fault.h"
#include "text/text_internal.h"

/* A tokenizer.json larger than this is refused before it is read (Llama 3's is 9 MB). */
#define TOKENIZER_JSON_MAX ((size_t)1 << 30)

fsdp2_status_t fsdp2_tokenizer_destroy(fsdp2_tokenizer_t *tok)
{
    if (tok == NULL)
        return FSDP2_SUCCESS;
    for (size_t i = 0; i < tok->n_steps; i++)
        pcre2_code_free(tok->steps[i].code);
    pcre2_match_data_free(tok->match);
    pcre2_match_context_free(tok->match_ctx);
    pcre2_jit_stack_free(tok->jit_stack);
    for (int k = 0; k < 2; k++) {
        free(tok->raw_pass[k].tokens);
        free(tok->norm_pass[k].tokens);
    }
    text_table_free(&tok->by_str);
    text_table_free(&tok->by_raw);
    merge_table_free(&tok->merges);
    free(tok->str);
    free(tok->raw);
    free(tok->str_len);
    free(tok->raw_len);
    free(tok->is_special);
    free(tok->in_model);
    free(tok->arena);
    free(tok->added);
    free(tok->prefix_ids);
    free(tok->suffix_ids);
    free(tok->cache);
    free(tok->symbols);
    free(tok->heap);
    free(tok->repair);
    free(tok->name);
    free(tok);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tokenizer_load_buffer(const char *json, size_t len, const char *name,
                                           fsdp2_tokenizer_t **out)
{
    FSDP2_ARG_CHECK(json != NULL && out != NULL, "fsdp2_tokenizer_load_buffer: json=%p tok=%p",
                    (const void *)json, (void *)out);
    *out = NULL;
    fsdp2_tokenizer_t *tok = fsdp2_calloc(1, sizeof *tok);
    if (tok == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: %zu bytes", sizeof *tok);
    fsdp2_status_t status = FSDP2_SUCCESS;
    tok->name = strdup(name ? name : "tokenizer.json");
    tok->cache = bpe_cache_create();
    if (tok->name == NULL || tok->cache == NULL) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: a word cache of %zu bytes",
                             CACHE_SLOTS * sizeof *tok->cache);
        goto cleanup;
    }
    tok->hash = text_fnv1a64(TEXT_FNV_INIT, json, len);
    FSDP2_CHECK_GOTO(tokenizer_parse(tok, json, len), status, cleanup);
    *out = tok;
    return FSDP2_SUCCESS;
cleanup:
    fsdp2_tokenizer_destroy(tok);
    return status;
}

fsdp2_status_t fsdp2_tokenizer_load(const char *path, fsdp2_tokenizer_t **tok)
{
    FSDP2_ARG_CHECK(path != NULL && tok != NULL, "fsdp2_tokenizer_load: path=%p tok=%p",
                    (const void *)path, (void *)tok);
    *tok = NULL;
    char *json;
    size_t len;
    FSDP2_CHECK(text_read_file(path, TOKENIZER_JSON_MAX, "tokenizer", &json, &len));
    fsdp2_status_t status = fsdp2_tokenizer_load_buffer(json, len, path, tok);
    free(json);
    return status;
}

static fsdp2_status_t valid_text(fsdp2_tokenizer_t *tok, const char *text, size_t len,
                                 const char **out, size_t *out_len)
{
    size_t valid = utf8_valid_prefix(text, len);
    if (valid == len) {
        *out = text;
        *out_len = len;
        return FSDP2_SUCCESS;
    }
    if (len > SIZE_MAX / 3)
        return fsdp2_error(FSDP2_ERR_OVERFLOW, "tokenizer: text of %zu bytes", len);
    if (tok->repair_cap < 3 * len) {
        char *buf = fsdp2_malloc(3 * len);
        if (buf == NULL)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: repairing %zu bytes of text", len);
        free(tok->repair);
        tok->repair = buf;
        tok->repair_cap = 3 * len;
    }
    memcpy(tok->repair, text, valid);
    *out_len = valid + utf8_repair(text + valid, len - valid, tok->repair + valid);
    *out = tok->repair;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tokenizer_encode(fsdp2_tokenizer_t *tok, const char *text, size_t len,
                                      unsigned flags, uint32_t *ids, size_t capacity, size_t *count)
{
    FSDP2_ARG_CHECK(tok != NULL && (text != NULL || len == 0) && count != NULL &&
                        (ids != NULL || capacity == 0),
                    "fsdp2_tokenizer_encode: tok=%p text=%p len=%zu ids=%p capacity=%zu count=%p",
                    (void *)tok, (const void *)text, len, (void *)ids, capacity, (void *)count);
    FSDP2_ARG_CHECK((flags & ~(unsigned)(FSDP2_TOKENIZER_ADD_SPECIAL | FSDP2_TOKENIZER_SPECIAL_AS_TEXT)) == 0,
                    "fsdp2_tokenizer_encode: unknown flags 0x%x", flags);
    const char *s = NULL;
    size_t n = 0;
    FSDP2_CHECK(valid_text(tok, text ? text : "", len, &s, &n));
    id_sink_t sink = {.ids = ids, .cap = capacity, .n = 0};
    fsdp2_status_t status = pre_encode_text(tok, s, n, flags, &sink);
    /* buffers sized for one huge text or piece (a megabyte of one letter) are not kept */
    if (tok->repair_cap > ((size_t)1 << 24)) {
        free(tok->repair);
        tok->repair = NULL;
        tok->repair_cap = 0;
    }
    if (tok->scratch_cap > ((size_t)1 << 16)) {
        free(tok->symbols);
        free(tok->heap);
        tok->symbols = NULL;
        tok->heap = NULL;
        tok->scratch_cap = 0;
    }
    FSDP2_CHECK(status);
    *count = sink.n;
    if (sink.n > capacity && ids != NULL)
        return fsdp2_error(FSDP2_ERR_OVERFLOW, "fsdp2_tokenizer_encode: %zu ids do not fit in a "
                           "capacity of %zu", sink.n, capacity);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tokenizer_decode(const fsdp2_tokenizer_t *tok, const uint32_t *ids, size_t n,
                                      unsigned flags, char *buf, size_t capacity, size_t *len)
{
    FSDP2_ARG_CHECK(tok != NULL && (ids != NULL || n == 0) && len != NULL &&
                        (buf != NULL || capacity == 0),
                    "fsdp2_tokenizer_decode: tok=%p ids=%p n=%zu buf=%p capacity=%zu len=%p",
                    (const void *)tok, (const void *)ids, n, (void *)buf, capacity, (void *)len);
    FSDP2_ARG_CHECK((flags & ~(unsigned)FSDP2_TOKENIZER_SKIP_SPECIAL) == 0,
                    "fsdp2_tokenizer_decode: unknown flags 0x%x", flags);
    int skip = (flags & FSDP2_TOKENIZER_SKIP_SPECIAL) != 0;
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (id >= tok->n_ids || tok->str[id] == NULL)
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "fsdp2_tokenizer_decode: ids[%zu] = %u %s", i, id,
                               id >= tok->n_ids ? "is out of range" : "has no token");
        if (!(skip && tok->is_special[id]))
            need += tok->raw_len[id];
    }
    *len = need;
    if (buf == NULL)
        return FSDP2_SUCCESS;
    if (need > capacity)
        return fsdp2_error(FSDP2_ERR_OVERFLOW,
                           "fsdp2_tokenizer_decode: %zu bytes do not fit in a capacity of %zu", need,
                           capacity);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (skip && tok->is_special[id])
            continue;
        memcpy(buf + at, tok->raw[id], tok->raw_len[id]);
        at += tok->raw_len[id];
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tokenizer_vocab_size(const fsdp2_tokenizer_t *tok, size_t *size)
{
    FSDP2_ARG_CHECK(tok != NULL && size != NULL, "fsdp2_tokenizer_vocab_size: tok=%p size=%p",
                    (const void *)tok, (void *)size);
    *size = tok->n_ids;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tokenizer_token_to_id(const fsdp2_tokenizer_t *tok, const char *token,
                                           size_t len, uint32_t *id)
{
    FSDP2_ARG_CHECK(tok != NULL && (token != NULL || len == 0) && id != NULL,
                    "fsdp2_tokenizer_token_to_id: tok=%p token=%p id=%p", (const void *)tok,
                    (const void *)token, (void *)id);
    uint32_t found = text_table_find(&tok->by_str, token ? token : "", len);
    if (found == TEXT_NO_ID)
        return fsdp2_error(FSDP2_ERR_NOT_FOUND, "tokenizer %s: no token '%.*s'", tok->name,
                           (int)(len > 200 ? 200 : len), token ? token : "");
    *id = found;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tokenizer_id_to_token(const fsdp2_tokenizer_t *tok, uint32_t id,
                                           const char **token, size_t *len)
{
    FSDP2_ARG_CHECK(tok != NULL && token != NULL, "fsdp2_tokenizer_id_to_token: tok=%p token=%p",
                    (const void *)tok, (void *)token);
    if (id >= tok->n_ids || tok->str[id] == NULL)
        return fsdp2_error(FSDP2_ERR_NOT_FOUND, "tokenizer %s: id %u %s", tok->name, id,
                           id >= tok->n_ids ? "is out of range" : "has no token");
    *token = tok->str[id];
    if (len != NULL)
        *len = tok->str_len[id];
    return FSDP2_SUCCESS;
}

static fsdp2_status_t special_id(const fsdp2_tokenizer_t *tok, uint32_t value, const char *what,
                                 uint32_t *id)
{
    FSDP2_ARG_CHECK(tok != NULL && id != NULL, "fsdp2_tokenizer_%s_id: tok=%p id=%p", what,
                    (const void *)tok, (void *)id);
    if (value == TEXT_NO_ID)
        return fsdp2_error(FSDP2_ERR_NOT_FOUND, "tokenizer %s implies no %s token", tok->name, what);
    *id = value;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tokenizer_bos_id(const fsdp2_tokenizer_t *tok, uint32_t *id)
{
    return special_id(tok, tok ? tok->bos_id : 0, "bos", id);
}

fsdp2_status_t fsdp2_tokenizer_eos_id(const fsdp2_tokenizer_t *tok, uint32_t *id)
{
    return special_id(tok, tok ? tok->eos_id : 0, "eos", id);
}

fsdp2_status_t fsdp2_tokenizer_hash(const fsdp2_tokenizer_t *tok, uint64_t *hash)
{
    FSDP2_ARG_CHECK(tok != NULL && hash != NULL, "fsdp2_tokenizer_hash: tok=%p hash=%p",
                    (const void *)tok, (void *)hash);
    *hash = tok->hash;
    return FSDP2_SUCCESS;
}
