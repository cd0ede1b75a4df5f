/* The GPT-2 example's data: text as bytes (a byte-level tokenizer, vocabulary 256), split
 * 90/10 by position into training and validation text, and windows drawn from (seed,
 * step) so that a step's global batch does not depend on the world size. */
#ifndef GPT2_DATA_H
#define GPT2_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct gpt2_text {
    uint8_t *bytes;
    size_t n, train_n; /* [0, train_n) trains, [train_n, n) validates */
} gpt2_text_t;

/* path: a file, or a directory whose regular files (sorted by name) are concatenated;
 * lines that are exactly "%" (fortune's separators) are dropped. Returns 0, or -1 with
 * a message in err. */
int gpt2_text_load(const char *path, gpt2_text_t *text, char *err, size_t len);
void gpt2_text_free(gpt2_text_t *text);

/* Window `index` of global batch `step`: seq + 1 bytes of the training text from a
 * position drawn by Philox from (seed, step, index); tokens get the first seq, targets
 * the last seq. */
void gpt2_train_window(const gpt2_text_t *text, uint64_t seed, int64_t step, int index, int seq,
                       int32_t *tokens, int32_t *targets);

/* Validation window `index` of `count`: evenly spaced over the validation text. */
void gpt2_val_window(const gpt2_text_t *text, int index, int count, int seq, int32_t *tokens,
                     int32_t *targets);

#endif
