/* The tokenizer's hash tables (token -> id, merge pair -> rank) and its hashes: FNV-1a 64
 * for identities written to files (simple to recompute in any language: the fixtures'
 * script does), a faster multiply-mix for the in-memory tables. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fault.h"
#include "text/text_internal.h"

uint64_t text_fnv1a64(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    return x ^ (x >> 32);
}

uint64_t text_hash_bytes(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ len;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix(h ^ w);
        p += 8;
        len -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < len; i++)
        w |= (uint64_t)p[i] << (8 * i);
    return mix(h ^ w ^ 0xff);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

fsdp2_status_t text_table_init(text_table_t *t, size_t n, const char *const *keys,
                               const uint32_t *lens)
{
    size_t cap = pow2_at_least(2 * n + 1);
    t->ids = fsdp2_calloc(cap, sizeof *t->ids);
    t->tags = fsdp2_calloc(cap, sizeof *t->tags);
    if (t->ids == NULL || t->tags == NULL) {
        text_table_free(t);
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: a table of %zu slots", cap);
    }
    t->mask = cap - 1;
    t->keys = keys;
    t->lens = lens;
    return FSDP2_SUCCESS;
}

void text_table_free(text_table_t *t)
{
    free(t->ids);
    free(t->tags);
    t->ids = NULL;
    t->tags = NULL;
}

uint32_t text_table_insert(text_table_t *t, uint32_t id)
{
    const char *key = t->keys[id];
    uint32_t len = t->lens[id];
    uint64_t h = text_hash_bytes(key, len);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & t->mask;; i = (i + 1) & t->mask) {
        if (t->ids[i] == 0) {
            t->ids[i] = id + 1;
            t->tags[i] = tag;
            return TEXT_NO_ID;
        }
        uint32_t other = t->ids[i] - 1;
        if (t->tags[i] == tag && t->lens[other] == len && memcmp(t->keys[other], key, len) == 0)
            return other;
    }
}

uint32_t text_table_find(const text_table_t *t, const char *key, size_t len)
{
    uint64_t h = text_hash_bytes(key, len);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & t->mask;; i = (i + 1) & t->mask) {
        if (t->ids[i] == 0)
            return TEXT_NO_ID;
        uint32_t id = t->ids[i] - 1;
        if (t->tags[i] == tag && t->lens[id] == len && memcmp(t->keys[id], key, len) == 0)
            return id;
    }
}

fsdp2_status_t merge_table_init(merge_table_t *t, size_t n)
{
    size_t cap = pow2_at_least(2 * n + 1);
    t->slots = fsdp2_malloc(cap * sizeof *t->slots);
    if (t->slots == NULL)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: a merge table of %zu slots", cap);
    for (size_t i = 0; i < cap; i++)
        t->slots[i].pair = UINT64_MAX;
    t->mask = cap - 1;
    return FSDP2_SUCCESS;
}

void merge_table_free(merge_table_t *t)
{
    free(t->slots);
    t->slots = NULL;
}

int merge_table_insert(merge_table_t *t, uint32_t left, uint32_t right, uint32_t rank,
                       uint32_t id)
{
    uint64_t pair = (uint64_t)left << 32 | right;
    for (size_t i = (size_t)mix(pair) & t->mask;; i = (i + 1) & t->mask) {
        if (t->slots[i].pair == pair) { /* as a map built in file order: the last wins */
            t->slots[i].rank = rank;
            t->slots[i].id = id;
            return 0;
        }
        if (t->slots[i].pair == UINT64_MAX) {
            t->slots[i] = (merge_slot_t){.pair = pair, .rank = rank, .id = id};
            return 1;
        }
    }
}

const merge_slot_t *merge_table_find(const merge_table_t *t, uint32_t left, uint32_t right)
{
    uint64_t pair = (uint64_t)left << 32 | right;
    for (size_t i = (size_t)mix(pair) & t->mask;; i = (i + 1) & t->mask) {
        if (t->slots[i].pair == pair)
            return &t->slots[i];
        if (t->slots[i].pair == UINT64_MAX)
            return NULL;
    }
}
