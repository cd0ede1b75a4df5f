/* libFuzzer harness for encode and decode: any bytes, with the fixtures' tokenizers.
 *
 * The first byte picks the tokenizer (gpt2, llama3) and the encode flags; the rest is the
 * text. decode(encode(x)) must be x with its invalid UTF-8 replaced (the library's own
 * repair: the Check test holds that one to Python's), and every id must be in range.
 *
 * Build and run (clang only; -fsanitize=fuzzer-no-link gives the library's code the
 * coverage feedback, without which the fuzzer only sees this file):
 *   CC=clang meson setup /tmp/fuzzbuild -Dfuzz=true -Db_sanitize=address,undefined \
 *       -Db_lundef=false -Dcuda=disabled -Dexamples=false -Dbench=false \
 *       -Dc_args=-fsanitize=fuzzer-no-link
 *   ninja -C /tmp/fuzzbuild tests/text/fuzz_tokenizer
 *   /tmp/fuzzbuild/tests/text/fuzz_tokenizer -max_total_time=120 -max_len=4096 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/text_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fsdp2_tokenizer_t *tokenizers[2];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (tokenizers[0] == NULL &&
        (fsdp2_tokenizer_load(TEXT_FIXTURES "/gpt2/tokenizer.json", &tokenizers[0]) != FSDP2_SUCCESS ||
         fsdp2_tokenizer_load(TEXT_FIXTURES "/llama3/tokenizer.json", &tokenizers[1]) != FSDP2_SUCCESS))
        abort();
    fsdp2_tokenizer_t *tok = tokenizers[data[0] & 1];
    unsigned flags = (data[0] >> 1) & 3u;
    const char *text = (const char *)data + 1;
    size_t len = size - 1, n = 0, vocab = 0;
    if (fsdp2_tokenizer_encode(tok, text, len, flags, NULL, 0, &n) != FSDP2_SUCCESS)
        abort();
    uint32_t *ids = malloc((n + 1) * sizeof *ids);
    size_t again = 0;
    if (fsdp2_tokenizer_encode(tok, text, len, flags, ids, n, &again) != FSDP2_SUCCESS || again != n)
        abort();
    fsdp2_tokenizer_vocab_size(tok, &vocab);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= vocab)
            abort();
    size_t out_len = 0, need = 0;
    if (fsdp2_tokenizer_decode(tok, ids, n, 0, NULL, 0, &need) != FSDP2_SUCCESS)
        abort();
    char *out = malloc(need + 1);
    char *want = malloc(3 * len + 1);
    if (fsdp2_tokenizer_decode(tok, ids, n, 0, out, need, &out_len) != FSDP2_SUCCESS || out_len != need)
        abort();
    size_t want_len = utf8_repair(text, len, want);
    if (!(flags & FSDP2_TOKENIZER_ADD_SPECIAL) && (out_len != want_len || memcmp(out, want, want_len) != 0))
        abort();
    free(out);
    free(want);
    free(ids);
    return 0;
}
