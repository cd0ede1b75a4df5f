/* The language model's data: text as tokens (bytes, a vocabulary of 256, or the ids of a
 * tokenizer), split 90/10 by position into training and validation tokens, and windows
 * drawn from (seed, step) so that a step's global batch does not depend on the world
 * size. */
#ifndef LM_DATA_H
#define LM_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <fsdp2/tokenizer.h>

typedef struct lm_text {
    int32_t *tokens;
    size_t n, train_n;      /* [0, train_n) trains, [train_n, n) validates */
    int vocab;              /* ids lie in [0, vocab) */
    fsdp2_tokenizer_t *tok; /* NULL: the tokens are bytes */
    int64_t bos, eos;       /* the tokenizer's (-1: none) */
} lm_text_t;

/* path: a file, or a directory whose regular files (sorted by name) are concatenated
 * with the lines that are exactly "%" (fortune's separators) dropped. tokenizer: a
 * tokenizer.json whose ids the text becomes, or NULL for its bytes. cache: with a
 * tokenizer and a file, a directory (or file) for the token cache, or NULL for none.
 * Returns 0, or -1 with a message in err. */
int lm_text_load(const char *path, const char *tokenizer, const char *cache, lm_text_t *text,
                 char *err, size_t len);
void lm_text_free(lm_text_t *text);

/* The token a sample starts from, and a token printed as the text it stands for. */
int32_t lm_text_start(const lm_text_t *text);
void lm_text_print(const lm_text_t *text, int32_t id, FILE *out);

/* Window `index` of global batch `step`: seq + 1 tokens of the training text from a
 * position drawn by Philox from (seed, step, index); tokens get the first seq, targets
 * the last seq. */
void lm_train_window(const lm_text_t *text, uint64_t seed, int64_t step, int index, int seq,
                     int32_t *tokens, int32_t *targets);

/* Validation window `index` of `count`: evenly spaced over the validation text. */
void lm_val_window(const lm_text_t *text, int index, int count, int seq, int32_t *tokens,
                   int32_t *targets);

#endif
