/* libFuzzer harness for the safetensors header parser (st_parse_header).
 *
 * The input is laid out like a file: an 8-byte little-endian length N, then the header.
 * When N fits, the header is the next N bytes and the rest is the data section, as in
 * st_open; when it does not, the whole rest is the header and N is taken as the data
 * size, so that huge data sizes are explored too. A successful parse must describe
 * entries that tile the data exactly; anything else must be FSDP2_ERR_CORRUPT.
 *
 * Build and run (clang only; the corpus is tests/checkpoint/corpus):
 *   CC=clang meson setup /tmp/fuzzbuild -Dfuzz=true -Db_sanitize=address,undefined \
 *       -Db_lundef=false -Dcuda=disabled
 *   ninja -C /tmp/fuzzbuild tests/checkpoint/fuzz_safetensors
 *   mkdir -p /tmp/fuzzcorpus
 *   /tmp/fuzzbuild/tests/checkpoint/fuzz_safetensors -max_total_time=120 -max_len=4096 \
 *       /tmp/fuzzcorpus tests/checkpoint/corpus
 * (new inputs go to the first directory, so the checked-in corpus stays small). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_entries(const st_file_t *f, uint64_t data_size)
{
    uint64_t at = 0;
    for (size_t i = 0; i < f->num_entries; i++) {
        const st_entry_t *e = &f->entries[i];
        size_t elem = 0;
        if (fsdp2_dtype_size(e->dtype, &elem) != FSDP2_SUCCESS || e->ndim < 0 ||
            e->ndim > FSDP2_MAX_DIMS || e->begin != at || e->end < e->begin ||
            e->end > data_size || memchr(e->name, '\0', ST_NAME_MAX) == NULL)
            abort();
        uint64_t bytes = elem;
        int empty = 0, overflow = 0;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0)
                abort();
            empty |= e->shape[d] == 0;
            overflow |= __builtin_mul_overflow(bytes, (uint64_t)e->shape[d], &bytes);
        }
        if (empty)
            bytes = 0;
        else if (overflow)
            abort();
        if (e->end - e->begin != bytes)
            abort();
        at = e->end;
    }
    if (at != data_size)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | data[i];
    const char *json = (const char *)data + 8;
    size_t len = size - 8;
    uint64_t data_size = n;
    if (n <= len) {
        data_size = len - n;
        len = (size_t)n;
    }
    st_file_t f;
    fsdp2_status_t status = st_parse_header(json, len, data_size, "fuzz", &f);
    if (status == FSDP2_SUCCESS)
        check_entries(&f, data_size);
    else if (status != FSDP2_ERR_CORRUPT && status != FSDP2_ERR_OUT_OF_MEMORY)
        abort();
    st_close(&f);
    return 0;
}
