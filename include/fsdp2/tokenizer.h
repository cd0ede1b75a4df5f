/* Byte-level BPE tokenizers read from Hugging Face `tokenizer.json` files (the layouts
 * of GPT-2 and Llama 3), encode and decode, and a cache of a tokenized text file.
 * Built when the library is configured with -Dtext=true (the default); needs PCRE2.
 * docs/tokenizer.md lists what is supported and what is refused.
 *
 * Conventions, the same for every function here:
 * - Nothing here communicates or is collective; every call blocks on the calling thread.
 * - A tokenizer is immutable after loading except for its encode scratch and word cache:
 *   encode calls on one handle must not run concurrently (use one handle per thread);
 *   decode and the look-ups may run on any number of threads at once.
 * - Token ids are uint32_t. Output buffers are the caller's; a buffer too small is
 *   refused with FSDP2_ERR_OVERFLOW and the size needed in *count (or *len), and what
 *   was written to it then is unspecified. A call with capacity 0 and a NULL buffer
 *   only measures: it succeeds with the size in *count.
 * - Bad input (a NULL pointer, an id out of range, a file that is not a valid or
 *   supported tokenizer.json) returns an error whose fsdp2_last_error() names the value. */
#ifndef FSDP2_TOKENIZER_H
#define FSDP2_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

typedef struct fsdp2_tokenizer fsdp2_tokenizer_t;

/* Encode flags. */
enum {
    /* Apply the post-processor's template (TemplateProcessing): Llama 3's adds
     * <|begin_of_text|> in front. As `add_special_tokens=True` in `tokenizers`. */
    FSDP2_TOKENIZER_ADD_SPECIAL = 1u << 0,
    /* Special tokens written in the text are plain text (split and merged like any other
     * text) instead of their ids. By default they are ids, as in `tokenizers`; set this
     * for untrusted text that must not be able to inject control tokens. Added tokens
     * that are not special are always matched. */
    FSDP2_TOKENIZER_SPECIAL_AS_TEXT = 1u << 1,
};

/* Decode flags. */
enum {
    /* Leave out the ids of special tokens (as `skip_special_tokens=True`). */
    FSDP2_TOKENIZER_SKIP_SPECIAL = 1u << 0,
};

/* Reads and checks a tokenizer.json. The file must be a regular file (a FIFO or a device
 * is refused without blocking). *tok is the caller's, freed with
 * fsdp2_tokenizer_destroy; nothing is allocated on failure. */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_load(const char *path, fsdp2_tokenizer_t **tok);

/* As fsdp2_tokenizer_load, from len bytes of JSON in memory (copied; name is used in
 * error messages only, may be NULL). */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_load_buffer(const char *json, size_t len,
                                                     const char *name,
                                                     fsdp2_tokenizer_t **tok);

/* Frees tok and everything it owns (token strings returned by id_to_token included).
 * NULL is accepted. */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_destroy(fsdp2_tokenizer_t *tok);

/* Encodes len bytes of text into ids[0..*count). Text need not be NUL-terminated nor
 * valid UTF-8: each invalid sequence is read as U+FFFD, as Python's
 * bytes.decode("utf-8", errors="replace") does (docs/tokenizer.md). flags: the encode
 * flags above. Uses the handle's scratch and word cache (see the threading rule). */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_encode(fsdp2_tokenizer_t *tok, const char *text,
                                                size_t len, unsigned flags, uint32_t *ids,
                                                size_t capacity, size_t *count);

/* Writes the bytes that ids[0..n) stand for into buf[0..*len) (not NUL-terminated;
 * decode(encode(x)) == x for valid UTF-8 x). The bytes of a partial sequence of ids
 * may be invalid UTF-8: they are returned as they are. An id with no token is refused
 * before anything is written. flags: the decode flags above. */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_decode(const fsdp2_tokenizer_t *tok,
                                                const uint32_t *ids, size_t n, unsigned flags,
                                                char *buf, size_t capacity, size_t *len);

/* One more than the largest id of the vocabulary and the added tokens (as
 * get_vocab_size(with_added_tokens=True)). */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_vocab_size(const fsdp2_tokenizer_t *tok, size_t *size);

/* The id of a token as tokenizer.json writes it (byte-level form: "Ġthe" for " the");
 * FSDP2_ERR_NOT_FOUND when there is none. */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_token_to_id(const fsdp2_tokenizer_t *tok,
                                                     const char *token, size_t len,
                                                     uint32_t *id);

/* The token of id as tokenizer.json writes it: *token is NUL-terminated, owned by tok,
 * valid until fsdp2_tokenizer_destroy. FSDP2_ERR_NOT_FOUND for an id with no token. */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_id_to_token(const fsdp2_tokenizer_t *tok, uint32_t id,
                                                     const char **token, size_t *len);

/* The beginning- and end-of-text ids: the template's leading (trailing) special token
 * when the post-processor has one, else the first added token named <|begin_of_text|>,
 * <s> or <|endoftext|> (<|end_of_text|>, </s> or <|endoftext|>). FSDP2_ERR_NOT_FOUND
 * when the file implies none. */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_bos_id(const fsdp2_tokenizer_t *tok, uint32_t *id);
FSDP2_API fsdp2_status_t fsdp2_tokenizer_eos_id(const fsdp2_tokenizer_t *tok, uint32_t *id);

/* A 64-bit hash (FNV-1a) of the tokenizer.json bytes: the tokenizer's identity in caches. */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_hash(const fsdp2_tokenizer_t *tok, uint64_t *hash);

/* Encodes the whole file text_path (read into memory; a regular file) with flags, through
 * a cache: cache_path names the token file, or an existing directory in which the file is
 * named "<text file name>.<tokenizer hash>.tokens". The cache is used when its header
 * matches the tokenizer's hash, the flags and the text's size and hash, and its checksum
 * holds; otherwise (missing, stale or corrupt) the text is encoded and the cache written
 * to a temporary file beside it, then renamed into place, so a crash leaves no partial
 * cache. cache_path NULL: no cache. *ids (*count of them) is the caller's, freed with
 * fsdp2_tokenizer_ids_free. *from_cache (may be NULL) says whether the cache was used.
 * Format in docs/tokenizer.md. */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_encode_file(fsdp2_tokenizer_t *tok, const char *text_path,
                                                     const char *cache_path, unsigned flags,
                                                     uint32_t **ids, size_t *count,
                                                     int *from_cache);

/* Frees ids from fsdp2_tokenizer_encode_file. NULL is accepted. */
FSDP2_API fsdp2_status_t fsdp2_tokenizer_ids_free(uint32_t *ids);

FSDP2_EXTERN_C_END

#endif
