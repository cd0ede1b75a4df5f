/* From text to pre-tokens: added tokens first, then the pre-tokenizer's regex splits.
 *
 * The split patterns run in PCRE2 (with its JIT), as tokenizer.json writes them: they are
 * Oniguruma patterns in `tokenizers` (lookahead, \p{L}, \p{N}, (?i:...)), which PCRE2 reads
 * with the same meaning under PCRE2_UTF | PCRE2_UCP, and a well-kept engine beats a regex
 * engine of our own (docs/tokenizer.md). Each piece is its own subject, as each is its own
 * string in `tokenizers`: a lookahead at a piece's end sees the end, not the next piece. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fault.h"
#include "text/text_internal.h"

/* GPT-2's pattern: what ByteLevel with use_regex=true splits by. */
const char text_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

fsdp2_status_t pre_compile(const char *pattern, size_t len, int literal, const char *what,
                           pcre2_code **code, int *jit)
{
    int err;
    PCRE2_SIZE at;
    uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)pattern, len, options, &err, &at, NULL);
    if (c == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s: pattern '%.*s' does not compile at offset %zu: %s",
                           what, (int)(len > 200 ? 200 : len), pattern, (size_t)at, (char *)msg);
    }
    /* Without a JIT (an architecture PCRE2 has none for) the interpreter runs it. */
    (void)pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
    size_t jit_size = 0;
    *jit = pcre2_pattern_info(c, PCRE2_INFO_JITSIZE, &jit_size) == 0 && jit_size > 0;
    *code = c;
    return FSDP2_SUCCESS;
}

static int by_length_desc(const void *a, const void *b)
{
    const added_token_t *x = *(const added_token_t *const *)a, *y = *(const added_token_t *const *)b;
    return x->len != y->len ? (x->len < y->len ? 1 : -1) : (x->id > y->id) - (x->id < y->id);
}

static fsdp2_status_t build_set(fsdp2_tokenizer_t *tok, added_set_t *set, int normalized,
                                int as_text)
{
    set->tokens = fsdp2_calloc(tok->n_added ? tok->n_added : 1, sizeof *set->tokens);
    if (set->tokens == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: %zu added tokens", tok->n_added);
    for (size_t i = 0; i < tok->n_added; i++) {
        const added_token_t *t = &tok->added[i];
        if (t->normalized != normalized || (as_text && t->special) || t->len == 0)
            continue;
        set->tokens[set->n++] = t;
        set->first[(unsigned char)t->content[0]] = 1;
    }
    qsort(set->tokens, set->n, sizeof *set->tokens, by_length_desc);
    return FSDP2_SUCCESS;
}

fsdp2_status_t pre_setup_matching(fsdp2_tokenizer_t *tok)
{
    for (int as_text = 0; as_text < 2; as_text++) {
        FSDP2_CHECK(build_set(tok, &tok->raw_pass[as_text], 0, as_text));
        FSDP2_CHECK(build_set(tok, &tok->norm_pass[as_text], 1, as_text));
    }
    tok->match = pcre2_match_data_create(1, NULL);
    tok->match_ctx = pcre2_match_context_create(NULL);
    /* Deep backtracking (a long run under a lookahead) needs more than the 32 KiB JIT
     * stack PCRE2 starts with; a match that needs more than 8 MiB fails with an error. */
    tok->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (tok->match == NULL || tok->match_ctx == NULL || tok->jit_stack == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: PCRE2 match data");
    pcre2_jit_stack_assign(tok->match_ctx, NULL, tok->jit_stack);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t run_steps(fsdp2_tokenizer_t *tok, const char *s, size_t len, size_t step,
                                id_sink_t *out);

static fsdp2_status_t prefix_space(fsdp2_tokenizer_t *tok, const char *s, size_t len, size_t step,
                                   id_sink_t *out)
{
    if (len > 0 && s[0] == ' ')
        return run_steps(tok, s, len, step + 1, out);
    /* a copy of its own: the steps below may call this again for their pieces */
    char *copy = fsdp2_malloc(len + 1);
    if (copy == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: a piece of %zu bytes", len + 1);
    copy[0] = ' ';
    memcpy(copy + 1, s, len);
    fsdp2_status_t status = run_steps(tok, copy, len + 1, step + 1, out);
    free(copy);
    return status;
}

/* Isolated: each match is a piece, and so is the text between matches. */
static fsdp2_status_t split_step(fsdp2_tokenizer_t *tok, const char *s, size_t len, size_t step,
                                 id_sink_t *out)
{
    pcre2_code *code = tok->steps[step].code;
    int jit = tok->steps[step].jit;
    size_t piece_start = 0, search = 0;
    while (search <= len) {
        /* the text is valid UTF-8 (encode repaired it): the JIT's entry skips the checks */
        int rc = jit ? pcre2_jit_match(code, (PCRE2_SPTR)s, len, search, 0, tok->match, tok->match_ctx)
                     : pcre2_match(code, (PCRE2_SPTR)s, len, search, PCRE2_NO_UTF_CHECK,
                                   tok->match, tok->match_ctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return fsdp2_error(FSDP2_ERR_BACKEND, "tokenizer: split pattern %zu on a piece of %zu bytes: %s",
                               step, len, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(tok->match);
        size_t m0 = ov[0], m1 = ov[1];
        if (m1 == m0) { /* an empty match splits nothing: look again one character on */
            if (m0 >= len)
                break;
            uint32_t cp;
            search = m0 + utf8_next((const unsigned char *)s + m0, len - m0, &cp);
            continue;
        }
        if (m0 > piece_start)
            FSDP2_CHECK(run_steps(tok, s + piece_start, m0 - piece_start, step + 1, out));
        FSDP2_CHECK(run_steps(tok, s + m0, m1 - m0, step + 1, out));
        piece_start = search = m1;
    }
    if (len > piece_start)
        FSDP2_CHECK(run_steps(tok, s + piece_start, len - piece_start, step + 1, out));
    return FSDP2_SUCCESS;
}

static fsdp2_status_t run_steps(fsdp2_tokenizer_t *tok, const char *s, size_t len, size_t step,
                                id_sink_t *out)
{
    if (len == 0)
        return FSDP2_SUCCESS;
    if (step == tok->n_steps)
        return bpe_encode_piece(tok, s, len, out);
    if (tok->steps[step].kind == STEP_PREFIX_SPACE)
        return prefix_space(tok, s, len, step, out);
    return split_step(tok, s, len, step, out);
}

typedef fsdp2_status_t (*gap_fn)(fsdp2_tokenizer_t *tok, const char *s, size_t len,
                                 unsigned flags, id_sink_t *out);

/* Leftmost-longest matches of set's tokens (as the Aho-Corasick automaton of `tokenizers`
 * with MatchKind::LeftmostLongest): each becomes its id, the text between goes to gap. */
static fsdp2_status_t split_added(fsdp2_tokenizer_t *tok, const added_set_t *set, const char *s,
                                  size_t len, unsigned flags, gap_fn gap, id_sink_t *out)
{
    if (set->n == 0)
        return gap(tok, s, len, flags, out);
    size_t gap_start = 0, i = 0;
    while (i < len) {
        if (!set->first[(unsigned char)s[i]]) {
            i++;
            continue;
        }
        const added_token_t *hit = NULL;
        for (size_t k = 0; k < set->n; k++) {
            const added_token_t *t = set->tokens[k];
            if (t->len <= len - i && t->content[0] == s[i] && memcmp(t->content, s + i, t->len) == 0) {
                hit = t;
                break;
            }
        }
        if (hit == NULL) {
            i++;
            continue;
        }
        if (i > gap_start)
            FSDP2_CHECK(gap(tok, s + gap_start, i - gap_start, flags, out));
        sink_put(out, hit->id);
        i += hit->len;
        gap_start = i;
    }
    if (len > gap_start)
        FSDP2_CHECK(gap(tok, s + gap_start, len - gap_start, flags, out));
    return FSDP2_SUCCESS;
}

static fsdp2_status_t model_gap(fsdp2_tokenizer_t *tok, const char *s, size_t len, unsigned flags,
                                id_sink_t *out)
{
    (void)flags;
    return run_steps(tok, s, len, 0, out);
}

static fsdp2_status_t normalized_gap(fsdp2_tokenizer_t *tok, const char *s, size_t len,
                                     unsigned flags, id_sink_t *out)
{
    int as_text = (flags & FSDP2_TOKENIZER_SPECIAL_AS_TEXT) != 0;
    return split_added(tok, &tok->norm_pass[as_text], s, len, flags, model_gap, out);
}

fsdp2_status_t pre_encode_text(fsdp2_tokenizer_t *tok, const char *text, size_t len,
                               unsigned flags, id_sink_t *out)
{
    int as_text = (flags & FSDP2_TOKENIZER_SPECIAL_AS_TEXT) != 0;
    int templated = (flags & FSDP2_TOKENIZER_ADD_SPECIAL) != 0;
    if (templated)
        for (size_t i = 0; i < tok->n_prefix; i++)
            sink_put(out, tok->prefix_ids[i]);
    FSDP2_CHECK(split_added(tok, &tok->raw_pass[as_text], text, len, flags, normalized_gap, out));
    if (templated)
        for (size_t i = 0; i < tok->n_suffix; i++)
            sink_put(out, tok->suffix_ids[i]);
    return FSDP2_SUCCESS;
}
