/* Reading tokenizer.json into the tables of text_internal.h. Every part the file may
 * hold is either understood or refused by name: a tokenizer that would silently encode
 * differently from `tokenizers` is worse than none. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/fault.h"
#include "text/text_internal.h"

fsdp2_status_t text_read_file(const char *path, size_t max_bytes, const char *what, char **data,
                              size_t *len)
{
    if (fsdp2_fault_hit(FAULT_IO))
        return fsdp2_fault_error(FAULT_IO, "read text file");
    /* Without blocking: a FIFO in the file's place is refused below, not waited on. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return fsdp2_error(errno == ENOENT ? FSDP2_ERR_NOT_FOUND : FSDP2_ERR_IO,
                           "%s %s: open: %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return fsdp2_error(FSDP2_ERR_IO, "%s %s: stat: %s", what, path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fsdp2_error(FSDP2_ERR_IO, "%s %s: not a regular file (%s)", what, path,
                           S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket");
    }
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "%s %s: %lld bytes, over the limit of %zu", what,
                           path, (long long)st.st_size, max_bytes);
    }
    size_t size = (size_t)st.st_size;
    char *buf = fsdp2_malloc(size + 1);
    if (buf == NULL) {
        close(fd);
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s %s: %zu bytes", what, path, size + 1);
    }
    size_t at = 0;
    while (at < size) {
        ssize_t n = read(fd, buf + at, size - at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = n < 0 ? errno : 0;
            close(fd);
            free(buf);
            return fsdp2_error(FSDP2_ERR_IO, "%s %s: read %zu of %zu bytes: %s", what, path, at,
                               size, err ? strerror(err) : "the file shrank");
        }
        at += (size_t)n;
    }
    close(fd);
    buf[size] = '\0';
    *data = buf;
    *len = size;
    return FSDP2_SUCCESS;
}

/* ---- small JSON helpers ---- */

static fsdp2_status_t bad(const fsdp2_tokenizer_t *tok, const char *fmt, const char *a,
                          const char *b) __attribute__((format(printf, 2, 0)));

static fsdp2_status_t bad(const fsdp2_tokenizer_t *tok, const char *fmt, const char *a,
                          const char *b)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a, b);
    return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: %s", tok->name, msg);
}

static fsdp2_status_t refuse(const fsdp2_tokenizer_t *tok, const char *what, const char *value,
                             const char *supported)
{
    return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "%s: %s %s is not supported (%s)", tok->name, what,
                       value, supported);
}

static int is_null(const cJSON *j)
{
    return j == NULL || cJSON_IsNull(j);
}

static fsdp2_status_t get_bool(const fsdp2_tokenizer_t *tok, const cJSON *obj, const char *key,
                               int dflt, const char *what, int *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (is_null(j)) {
        *out = dflt;
        return FSDP2_SUCCESS;
    }
    if (!cJSON_IsBool(j))
        return bad(tok, "%s.%s is not true or false", what, key);
    *out = cJSON_IsTrue(j);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t get_id(const fsdp2_tokenizer_t *tok, const cJSON *j, const char *what,
                             const char *name, uint32_t *id)
{
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble >= 2147483648.0 ||
        floor(j->valuedouble) != j->valuedouble)
        return bad(tok, "%s '%s' has an id that is not an integer in [0, 2^31)", what, name);
    *id = (uint32_t)j->valuedouble;
    return FSDP2_SUCCESS;
}

static const char *type_of(const cJSON *j)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* ---- vocabulary ---- */

static char *arena_put(fsdp2_tokenizer_t *tok, const char *s, size_t len)
{
    if (tok->arena_cap - tok->arena_used < len + 1)
        return NULL;
    char *p = tok->arena + tok->arena_used;
    memcpy(p, s, len);
    p[len] = '\0';
    tok->arena_used += len + 1;
    return p;
}

/* The bytes a token string stands for: its characters through the byte-level alphabet,
 * or, when one is outside it, the string's own UTF-8 (as the ByteLevel decoder does). */
static size_t token_bytes(const char *s, size_t len, char *out, int *mapped)
{
    size_t n = 0, i = 0;
    while (i < len) {
        uint32_t cp;
        i += utf8_next((const unsigned char *)s + i, len - i, &cp);
        int b = byte_level_byte(cp);
        if (b < 0) {
            memcpy(out, s, len);
            *mapped = 0;
            return len;
        }
        out[n++] = (char)b;
    }
    *mapped = 1;
    return n;
}

static fsdp2_status_t set_token(fsdp2_tokenizer_t *tok, uint32_t id, const char *s, int model)
{
    size_t len = strlen(s);
    if (tok->str[id] != NULL) {
        if (strcmp(tok->str[id], s) == 0 && !model)
            return FSDP2_SUCCESS; /* an added token that is in the vocabulary too */
        return bad(tok, "tokens '%s' and '%s' have the same id", tok->str[id], s);
    }
    tok->str[id] = arena_put(tok, s, len);
    tok->raw[id] = tok->arena + tok->arena_used;
    int mapped;
    size_t raw_len = token_bytes(s, len, tok->raw[id], &mapped);
    tok->arena_used += raw_len + 1;
    tok->str_len[id] = (uint32_t)len;
    tok->raw_len[id] = (uint32_t)raw_len;
    tok->in_model[id] = model ? (uint8_t)(mapped ? 2 : 1) : 0;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_added(fsdp2_tokenizer_t *tok, const cJSON *added)
{
    size_t i = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, added) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsString(content))
            return bad(tok, "an added token has no string content%s%s", "", "");
        const char *c = content->valuestring;
        uint32_t id;
        FSDP2_CHECK(get_id(tok, cJSON_GetObjectItemCaseSensitive(a, "id"), "added token", c, &id));
        int special, normalized, flag;
        FSDP2_CHECK(get_bool(tok, a, "special", 0, "added_tokens", &special));
        FSDP2_CHECK(get_bool(tok, a, "normalized", !special, "added_tokens", &normalized));
        static const char *const unsupported[] = {"single_word", "lstrip", "rstrip"};
        for (int k = 0; k < 3; k++) {
            FSDP2_CHECK(get_bool(tok, a, unsupported[k], 0, "added_tokens", &flag));
            if (flag)
                return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                                   "%s: added token '%s' sets %s, which is not supported", tok->name,
                                   c, unsupported[k]);
        }
        FSDP2_CHECK(set_token(tok, id, c, 0));
        tok->is_special[id] = (uint8_t)special;
        tok->added[i++] = (added_token_t){.id = id, .len = (uint32_t)strlen(c), .content = tok->str[id],
                                          .special = special, .normalized = normalized};
    }
    tok->n_added = i;
    return FSDP2_SUCCESS;
}

/* Sizes the per-id arrays and the arena from a first pass over vocab and added_tokens. */
static fsdp2_status_t allocate(fsdp2_tokenizer_t *tok, const cJSON *vocab, const cJSON *added)
{
    size_t entries = 0, bytes = 0;
    uint32_t max_id = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, vocab) {
        uint32_t id;
        FSDP2_CHECK(get_id(tok, v, "vocab token", v->string, &id));
        max_id = id > max_id ? id : max_id;
        bytes += 2 * (strlen(v->string) + 1);
        entries++;
    }
    cJSON_ArrayForEach(v, added) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(v, "content");
        const cJSON *idj = cJSON_GetObjectItemCaseSensitive(v, "id");
        if (!cJSON_IsString(content))
            return bad(tok, "an added token has no string content%s%s", "", "");
        uint32_t id;
        FSDP2_CHECK(get_id(tok, idj, "added token", content->valuestring, &id));
        max_id = id > max_id ? id : max_id;
        bytes += 2 * (strlen(content->valuestring) + 1);
        entries++;
    }
    if (entries == 0)
        return bad(tok, "model.vocab is empty%s%s", "", "");
    /* ids are array indices: a sparse id space is refused rather than allocated */
    if ((size_t)max_id >= 2 * entries + 65536)
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: id %u is far beyond the %zu tokens", tok->name,
                           max_id, entries);
    size_t n = (size_t)max_id + 1;
    tok->n_ids = n;
    tok->str = fsdp2_calloc(n, sizeof *tok->str);
    tok->raw = fsdp2_calloc(n, sizeof *tok->raw);
    tok->str_len = fsdp2_calloc(n, sizeof *tok->str_len);
    tok->raw_len = fsdp2_calloc(n, sizeof *tok->raw_len);
    tok->is_special = fsdp2_calloc(n, 1);
    tok->in_model = fsdp2_calloc(n, 1);
    tok->added = fsdp2_calloc((size_t)cJSON_GetArraySize(added) + 1, sizeof *tok->added);
    tok->arena = fsdp2_malloc(bytes + 1);
    tok->arena_cap = bytes + 1;
    if (!tok->str || !tok->raw || !tok->str_len || !tok->raw_len || !tok->is_special ||
        !tok->in_model || !tok->added || !tok->arena)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: tables for %zu ids", tok->name, n);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t build_tables(fsdp2_tokenizer_t *tok)
{
    FSDP2_CHECK(text_table_init(&tok->by_str, tok->n_ids, (const char *const *)tok->str, tok->str_len));
    FSDP2_CHECK(text_table_init(&tok->by_raw, tok->n_ids, (const char *const *)tok->raw, tok->raw_len));
    for (uint32_t id = 0; id < tok->n_ids; id++) {
        if (tok->str[id] == NULL)
            continue;
        (void)text_table_insert(&tok->by_str, id);
        if (tok->in_model[id] == 2)
            (void)text_table_insert(&tok->by_raw, id);
    }
    for (unsigned b = 0; b < 256; b++) {
        char c = (char)b;
        tok->byte_id[b] = text_table_find(&tok->by_raw, &c, 1);
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t model_id(const fsdp2_tokenizer_t *tok, const char *s, size_t len,
                               size_t index, const char *role, uint32_t *id)
{
    *id = text_table_find(&tok->by_str, s, len);
    if (*id == TEXT_NO_ID || !tok->in_model[*id])
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: merge %zu names %s '%.*s', which is not in the vocab",
                           tok->name, index, role, (int)len, s);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_merges(fsdp2_tokenizer_t *tok, const cJSON *merges)
{
    if (!cJSON_IsArray(merges))
        return bad(tok, "model.merges is not a list%s%s", "", "");
    FSDP2_CHECK(merge_table_init(&tok->merges, (size_t)cJSON_GetArraySize(merges)));
    char *joined = NULL;
    size_t joined_cap = 0, index = 0;
    fsdp2_status_t status = FSDP2_SUCCESS;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t a_len, b_len;
        if (cJSON_IsString(m)) { /* "a b" (the older format) */
            a = m->valuestring;
            const char *space = strchr(a, ' ');
            if (space == NULL || strchr(space + 1, ' ') != NULL) {
                status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: merge %zu '%s' is not two tokens "
                                     "separated by one space", tok->name, index, a);
                goto cleanup;
            }
            a_len = (size_t)(space - a);
            b = space + 1;
            b_len = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) && cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a = cJSON_GetArrayItem(m, 0)->valuestring;
            b = cJSON_GetArrayItem(m, 1)->valuestring;
            a_len = strlen(a);
            b_len = strlen(b);
        } else {
            status = fsdp2_error(FSDP2_ERR_CORRUPT, "%s: merge %zu is neither \"a b\" nor [a, b]",
                                 tok->name, index);
            goto cleanup;
        }
        uint32_t left, right, merged;
        FSDP2_CHECK_GOTO(model_id(tok, a, a_len, index, "token", &left), status, cleanup);
        FSDP2_CHECK_GOTO(model_id(tok, b, b_len, index, "token", &right), status, cleanup);
        if (a_len + b_len > joined_cap) {
            free(joined);
            joined_cap = 2 * (a_len + b_len);
            joined = fsdp2_malloc(joined_cap);
            if (joined == NULL) {
                status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: merge %zu", tok->name, index);
                goto cleanup;
            }
        }
        memcpy(joined, a, a_len);
        memcpy(joined + a_len, b, b_len);
        FSDP2_CHECK_GOTO(model_id(tok, joined, a_len + b_len, index, "the merged token", &merged),
                         status, cleanup);
        (void)merge_table_insert(&tok->merges, left, right, (uint32_t)index, merged);
        index++;
    }
cleanup:
    free(joined);
    return status;
}

static fsdp2_status_t parse_model(fsdp2_tokenizer_t *tok, const cJSON *model, const cJSON *added)
{
    if (!cJSON_IsObject(model))
        return bad(tok, "no model object%s%s", "", "");
    const char *type = type_of(model);
    if (type == NULL && cJSON_GetObjectItemCaseSensitive(model, "merges") != NULL)
        type = "BPE"; /* files older than the "type" field */
    if (type == NULL || strcmp(type, "BPE") != 0)
        return refuse(tok, "model type", type ? type : "(none)", "only BPE");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (!is_null(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return refuse(tok, "model.dropout", cJSON_IsNumber(dropout) ? "other than 0" : "of that type",
                      "BPE without dropout");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(model, affixes[k]);
        if (!is_null(j) && !(cJSON_IsString(j) && j->valuestring[0] == '\0'))
            return refuse(tok, affixes[k], cJSON_IsString(j) ? j->valuestring : "(not a string)",
                          "byte-level BPE has none");
    }
    int flag;
    FSDP2_CHECK(get_bool(tok, model, "byte_fallback", 0, "model", &flag));
    if (flag)
        return refuse(tok, "model.byte_fallback", "true", "byte-level BPE needs none");
    FSDP2_CHECK(get_bool(tok, model, "fuse_unk", 0, "model", &flag));
    if (flag)
        return refuse(tok, "model.fuse_unk", "true", "false only");
    FSDP2_CHECK(get_bool(tok, model, "ignore_merges", 0, "model", &tok->ignore_merges));
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return bad(tok, "model.vocab is not an object%s%s", "", "");
    FSDP2_CHECK(allocate(tok, vocab, added));
    const cJSON *v;
    cJSON_ArrayForEach(v, vocab) {
        uint32_t id;
        FSDP2_CHECK(get_id(tok, v, "vocab token", v->string, &id));
        FSDP2_CHECK(set_token(tok, id, v->string, 1));
    }
    FSDP2_CHECK(parse_added(tok, added));
    FSDP2_CHECK(build_tables(tok));
    FSDP2_CHECK(parse_merges(tok, cJSON_GetObjectItemCaseSensitive(model, "merges")));
    tok->unk_id = TEXT_NO_ID;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) {
        tok->unk_id = text_table_find(&tok->by_str, unk->valuestring, strlen(unk->valuestring));
        if (tok->unk_id == TEXT_NO_ID)
            return bad(tok, "model.unk_token '%s' is not in the vocab%s", unk->valuestring, "");
    } else if (!is_null(unk)) {
        return bad(tok, "model.unk_token is not a string%s%s", "", "");
    }
    return FSDP2_SUCCESS;
}

/* ---- pre-tokenizer ---- */

static fsdp2_status_t add_step(fsdp2_tokenizer_t *tok, pre_step_kind_t kind, pcre2_code *code,
                               int jit)
{
    if (tok->n_steps == PRE_STEPS_MAX) {
        pcre2_code_free(code);
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer steps", tok->name,
                           PRE_STEPS_MAX);
    }
    tok->steps[tok->n_steps++] = (pre_step_t){.kind = kind, .code = code, .jit = jit};
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_split(fsdp2_tokenizer_t *tok, const cJSON *p)
{
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0)
        return refuse(tok, "Split behavior", cJSON_IsString(behavior) ? behavior->valuestring : "(none)",
                      "Isolated only");
    int invert;
    FSDP2_CHECK(get_bool(tok, p, "invert", 0, "Split", &invert));
    if (invert)
        return refuse(tok, "Split invert", "true", "false only");
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    const cJSON *literal = cJSON_GetObjectItemCaseSensitive(pattern, "String");
    const cJSON *s = cJSON_IsString(regex) ? regex : literal;
    if (!cJSON_IsString(s))
        return bad(tok, "Split pattern is neither {\"Regex\": ...} nor {\"String\": ...}%s%s", "", "");
    pcre2_code *code;
    int jit;
    FSDP2_CHECK(pre_compile(s->valuestring, strlen(s->valuestring), s == literal, tok->name, &code,
                            &jit));
    return add_step(tok, STEP_SPLIT, code, jit);
}

static fsdp2_status_t parse_pre(fsdp2_tokenizer_t *tok, const cJSON *p, int *byte_level)
{
    const char *type = type_of(p);
    if (is_null(p) || type == NULL)
        return refuse(tok, "pre_tokenizer", is_null(p) ? "null" : "without a type",
                      "ByteLevel, or a Sequence of Split and ByteLevel");
    if (*byte_level)
        return refuse(tok, "pre_tokenizer", "after ByteLevel", "ByteLevel must come last");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"))
            FSDP2_CHECK(parse_pre(tok, item, byte_level));
        return FSDP2_SUCCESS;
    }
    if (strcmp(type, "Split") == 0)
        return parse_split(tok, p);
    if (strcmp(type, "ByteLevel") != 0)
        return refuse(tok, "pre_tokenizer type", type, "ByteLevel, Split, Sequence");
    int prefix, use_regex;
    FSDP2_CHECK(get_bool(tok, p, "add_prefix_space", 1, "ByteLevel", &prefix));
    FSDP2_CHECK(get_bool(tok, p, "use_regex", 1, "ByteLevel", &use_regex));
    if (prefix)
        FSDP2_CHECK(add_step(tok, STEP_PREFIX_SPACE, NULL, 0));
    if (use_regex) {
        pcre2_code *code;
        int jit;
        FSDP2_CHECK(pre_compile(text_gpt2_pattern, strlen(text_gpt2_pattern), 0, tok->name, &code,
                                &jit));
        FSDP2_CHECK(add_step(tok, STEP_SPLIT, code, jit));
    }
    *byte_level = 1;
    return FSDP2_SUCCESS;
}

/* ---- post-processor and decoder ---- */

static fsdp2_status_t special_ids(fsdp2_tokenizer_t *tok, const cJSON *specials, const char *name,
                                  uint32_t **ids, size_t *n)
{
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(specials, name);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(entry, "ids");
    if (!cJSON_IsArray(list))
        return bad(tok, "TemplateProcessing special token '%s' has no ids%s", name, "");
    const cJSON *j;
    cJSON_ArrayForEach(j, list) {
        uint32_t id;
        FSDP2_CHECK(get_id(tok, j, "template token", name, &id));
        if (id >= tok->n_ids || tok->str[id] == NULL)
            return bad(tok, "TemplateProcessing token '%s' has an id with no token%s", name, "");
        uint32_t *grown = realloc(*ids, (*n + 1) * sizeof **ids);
        if (grown == NULL)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: template", tok->name);
        *ids = grown;
        (*ids)[(*n)++] = id;
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_template(fsdp2_tokenizer_t *tok, const cJSON *p)
{
    if (tok->prefix_ids || tok->suffix_ids)
        return refuse(tok, "post_processor", "with two TemplateProcessing", "one");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    int seen_a = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(p, "single")) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(item, "Sequence");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp ? sp : seq, "id");
        if (!cJSON_IsString(id))
            return bad(tok, "TemplateProcessing.single has an item without an id%s%s", "", "");
        if (seq != NULL) {
            if (strcmp(id->valuestring, "A") != 0 || seen_a)
                return refuse(tok, "TemplateProcessing.single sequence", id->valuestring,
                              "one $A");
            seen_a = 1;
        } else if (seen_a) {
            FSDP2_CHECK(special_ids(tok, specials, id->valuestring, &tok->suffix_ids, &tok->n_suffix));
        } else {
            FSDP2_CHECK(special_ids(tok, specials, id->valuestring, &tok->prefix_ids, &tok->n_prefix));
        }
    }
    if (!seen_a)
        return bad(tok, "TemplateProcessing.single has no $A%s%s", "", "");
    return FSDP2_SUCCESS;
}

static fsdp2_status_t parse_post(fsdp2_tokenizer_t *tok, const cJSON *p)
{
    if (is_null(p))
        return FSDP2_SUCCESS;
    const char *type = type_of(p);
    if (type != NULL && strcmp(type, "ByteLevel") == 0)
        return FSDP2_SUCCESS; /* trims offsets only: ids are unchanged */
    if (type != NULL && strcmp(type, "TemplateProcessing") == 0)
        return parse_template(tok, p);
    if (type != NULL && strcmp(type, "Sequence") == 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(p, "processors"))
            FSDP2_CHECK(parse_post(tok, item));
        return FSDP2_SUCCESS;
    }
    return refuse(tok, "post_processor type", type ? type : "(none)",
                  "ByteLevel, TemplateProcessing, Sequence of them");
}

static uint32_t named(const fsdp2_tokenizer_t *tok, const char *const *names)
{
    for (; *names; names++)
        for (size_t i = 0; i < tok->n_added; i++)
            if (strcmp(tok->added[i].content, *names) == 0)
                return tok->added[i].id;
    return TEXT_NO_ID;
}

static void find_bos_eos(fsdp2_tokenizer_t *tok)
{
    static const char *const bos[] = {"<|begin_of_text|>", "<s>", "<|endoftext|>", NULL};
    static const char *const eos[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", NULL};
    tok->bos_id = tok->n_prefix ? tok->prefix_ids[0] : named(tok, bos);
    tok->eos_id = tok->n_suffix ? tok->suffix_ids[tok->n_suffix - 1] : named(tok, eos);
}

fsdp2_status_t tokenizer_parse(fsdp2_tokenizer_t *tok, const char *json, size_t len)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (root == NULL) {
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        size_t line = 1;
        for (size_t i = 0; i < at; i++)
            line += json[i] == '\n';
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: invalid JSON at byte %zu (line %zu) of %zu%s",
                           tok->name, at, line, len, at >= len ? ": truncated" : "");
    }
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (!cJSON_IsObject(root)) {
        status = bad(tok, "the top level is not an object%s%s", "", "");
        goto cleanup;
    }
    static const char *const unsupported[] = {"truncation", "padding", "normalizer"};
    for (int k = 0; k < 3; k++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, unsupported[k]);
        if (!is_null(j)) {
            const char *type = type_of(j);
            status = refuse(tok, unsupported[k], type ? type : "(set)", "null only");
            goto cleanup;
        }
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!is_null(added) && !cJSON_IsArray(added)) {
        status = bad(tok, "added_tokens is not a list%s%s", "", "");
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(parse_model(tok, cJSON_GetObjectItemCaseSensitive(root, "model"), added),
                     status, cleanup);
    int byte_level = 0;
    FSDP2_CHECK_GOTO(parse_pre(tok, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                               &byte_level), status, cleanup);
    if (!byte_level) {
        status = refuse(tok, "pre_tokenizer", "without ByteLevel", "byte-level BPE needs it last");
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(parse_post(tok, cJSON_GetObjectItemCaseSensitive(root, "post_processor")),
                     status, cleanup);
    const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const char *dtype = type_of(decoder);
    if (dtype == NULL || strcmp(dtype, "ByteLevel") != 0) {
        status = refuse(tok, "decoder", dtype ? dtype : "null", "ByteLevel only");
        goto cleanup;
    }
    find_bos_eos(tok);
    FSDP2_CHECK_GOTO(pre_setup_matching(tok), status, cleanup);
cleanup:
    cJSON_Delete(root);
    return status;
}
