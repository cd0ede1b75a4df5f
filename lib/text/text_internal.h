/* The tokenizer's tables, shared by the files of lib/text.
 *
 * Byte-level BPE never needs the byte-to-unicode alphabet while encoding: every vocabulary
 * token is turned back into the raw bytes it stands for when the file is loaded, so the
 * pre-tokenizer's pieces (raw bytes of the text) are merged and looked up as they are.
 * The file's strings are kept for token_to_id/id_to_token only. */
#ifndef FSDP2_TEXT_INTERNAL_H
#define FSDP2_TEXT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fsdp2/tokenizer.h>

#define TEXT_NO_ID UINT32_MAX

/* Open addressing, bytes -> id. The keys live in the tokenizer's per-id arrays (keys[id],
 * lens[id]); a slot holds id + 1 (0: empty) and the hash's high bits. */
typedef struct text_table {
    uint32_t *ids;
    uint32_t *tags;
    size_t mask;
    const char *const *keys;
    const uint32_t *lens;
} text_table_t;

/* (left id, right id) -> (rank, merged id) */
typedef struct merge_slot {
    uint64_t pair; /* left << 32 | right; UINT64_MAX: empty */
    uint32_t rank;
    uint32_t id;
} merge_slot_t;

typedef struct merge_table {
    merge_slot_t *slots;
    size_t mask;
} merge_table_t;

/* The word cache: a direct-mapped table of short pieces and their ids, allocated once at
 * load (CACHE_SLOTS x 64 bytes), so its memory never grows. Longer pieces, or ones of more
 * ids, are merged every time. */
#define CACHE_KEY_MAX 22
#define CACHE_IDS_MAX 8
#define CACHE_SLOTS (1u << 16)
typedef struct cache_slot {
    uint64_t hash;
    uint8_t key_len; /* 0: empty */
    uint8_t n_ids;
    char key[CACHE_KEY_MAX];
    uint32_t ids[CACHE_IDS_MAX];
} cache_slot_t;

typedef enum pre_step_kind { STEP_SPLIT, STEP_PREFIX_SPACE } pre_step_kind_t;

typedef struct pre_step {
    pre_step_kind_t kind;
    pcre2_code *code;
    int jit; /* compiled by PCRE2's JIT: matched through pcre2_jit_match */
} pre_step_t;

#define PRE_STEPS_MAX 8

typedef struct added_token {
    uint32_t id;
    uint32_t len;
    const char *content; /* in the arena */
    int special;
    int normalized;
} added_token_t;

/* Added tokens of one matching pass, by first byte, longest first. */
typedef struct added_set {
    uint8_t first[256]; /* whether some token starts with the byte */
    const added_token_t **tokens;
    size_t n;
} added_set_t;

/* The growing list of a BPE merge: a symbol per byte, linked; merged ones get len 0. */
typedef struct bpe_symbol {
    uint32_t id;
    uint32_t len;
    int32_t prev, next;
} bpe_symbol_t;

typedef struct bpe_merge {
    uint32_t rank;
    uint32_t pos;
    uint32_t id;
} bpe_merge_t;

struct fsdp2_tokenizer {
    char *name;
    uint64_t hash;
    size_t n_ids;            /* largest id + 1 */
    char **str;              /* the file's string of each id, NUL-terminated; NULL: none */
    uint32_t *str_len;
    char **raw;              /* the bytes each id decodes to */
    uint32_t *raw_len;
    uint8_t *is_special;
    uint8_t *in_model;       /* in model.vocab (merges may name it) */
    char *arena;
    size_t arena_used, arena_cap;
    text_table_t by_str;     /* file string -> id, vocab and added tokens */
    text_table_t by_raw;     /* raw bytes -> id, model vocab tokens of the byte alphabet */
    merge_table_t merges;
    uint32_t byte_id[256];   /* the single-byte tokens */
    uint32_t unk_id;         /* TEXT_NO_ID: bytes missing from the vocab are dropped */
    int ignore_merges;

    pre_step_t steps[PRE_STEPS_MAX];
    size_t n_steps;
    pcre2_match_data *match;
    pcre2_match_context *match_ctx;
    pcre2_jit_stack *jit_stack;

    added_token_t *added;
    size_t n_added;
    added_set_t raw_pass[2];  /* [as_text]: the tokens matched in the raw text */
    added_set_t norm_pass[2]; /* then those with normalized=true, in the gaps */

    uint32_t *prefix_ids, *suffix_ids;
    size_t n_prefix, n_suffix;
    uint32_t bos_id, eos_id;

    cache_slot_t *cache;
    bpe_symbol_t *symbols;
    bpe_merge_t *heap;
    size_t scratch_cap;       /* symbols: scratch_cap; heap: 3 * scratch_cap */
    char *repair;             /* the text with invalid UTF-8 replaced */
    size_t repair_cap;
};

/* Where encode writes: ids up to cap, counting past it. */
typedef struct id_sink {
    uint32_t *ids;
    size_t cap;
    size_t n;
} id_sink_t;

static inline void sink_put(id_sink_t *s, uint32_t id)
{
    if (s->n < s->cap)
        s->ids[s->n] = id;
    s->n++;
}

/* hash.c */
uint64_t text_fnv1a64(uint64_t h, const void *data, size_t len);
#define TEXT_FNV_INIT 0xcbf29ce484222325ull
uint64_t text_hash_bytes(const void *data, size_t len);

/* tables.c */
fsdp2_status_t text_table_init(text_table_t *t, size_t n, const char *const *keys,
                               const uint32_t *lens);
void text_table_free(text_table_t *t);
/* Inserts id (whose key is keys[id]); returns the id already holding the key, or
 * TEXT_NO_ID when it was inserted. */
uint32_t text_table_insert(text_table_t *t, uint32_t id);
uint32_t text_table_find(const text_table_t *t, const char *key, size_t len);
fsdp2_status_t merge_table_init(merge_table_t *t, size_t n);
void merge_table_free(merge_table_t *t);
/* 0 when the pair was there already (then the later merge replaces it, as in tokenizers). */
int merge_table_insert(merge_table_t *t, uint32_t left, uint32_t right, uint32_t rank,
                       uint32_t id);
const merge_slot_t *merge_table_find(const merge_table_t *t, uint32_t left, uint32_t right);

/* utf8.c */
/* Length of the valid UTF-8 prefix of s[0..len). */
size_t utf8_valid_prefix(const char *s, size_t len);
/* Writes s[0..len) with each invalid sequence replaced by U+FFFD (EF BF BD) into out,
 * which holds at least 3 * len bytes; returns the bytes written. */
size_t utf8_repair(const char *s, size_t len, char *out);
/* GPT-2's bytes_to_unicode: the code point standing for byte b. */
uint32_t byte_level_char(unsigned b);
/* The byte a code point of the byte-level alphabet stands for, or -1. */
int byte_level_byte(uint32_t cp);
/* Decodes one code point of valid UTF-8 at s (len > 0); returns its length. */
size_t utf8_next(const unsigned char *s, size_t len, uint32_t *cp);

/* bpe.c */
/* The word cache, zeroed, on huge pages where the system gives them; freed with free(). */
cache_slot_t *bpe_cache_create(void);
fsdp2_status_t bpe_encode_piece(fsdp2_tokenizer_t *tok, const char *piece, size_t len,
                                id_sink_t *out);

/* pretokenize.c */
/* Compiles pattern (literal: a {"String": ...} pattern) for a split step. */
fsdp2_status_t pre_compile(const char *pattern, size_t len, int literal, const char *what,
                           pcre2_code **code, int *jit);
fsdp2_status_t pre_setup_matching(fsdp2_tokenizer_t *tok);
fsdp2_status_t pre_encode_text(fsdp2_tokenizer_t *tok, const char *text, size_t len,
                               unsigned flags, id_sink_t *out);
extern const char text_gpt2_pattern[];

/* tokenizer_json.c */
fsdp2_status_t tokenizer_parse(fsdp2_tokenizer_t *tok, const char *json, size_t len);
/* reads a whole regular file (refusing FIFOs and devices without blocking) */
fsdp2_status_t text_read_file(const char *path, size_t max_bytes, const char *what, char **data,
                              size_t *len);

#endif
