/* The BPE model: one pre-token (raw bytes) to ids, through the word cache.
 *
 * Merging follows `tokenizers` (models/bpe/word.rs): every adjacent pair with a merge goes
 * into a min-heap ordered by (rank, position); the smallest is applied if its pair is
 * still there and still merges to the same token, and the pairs it forms with its
 * neighbours are pushed. Equal ranks therefore merge left to right, and a run "aaa" of a
 * merge "a a" gives "aa a". O(n log n) in the piece's length, so a piece of a million
 * spaces costs what its length says, not its square. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/error.h"
#include "core/fault.h"
#include "text/text_internal.h"

cache_slot_t *bpe_cache_create(void)
{
    if (fsdp2_fault_hit(FAULT_ALLOC))
        return NULL;
    /* Its look-ups land anywhere in 4 MiB: on 2 MiB pages they miss the TLB far less
     * (a fifth of the encode time on 4 KiB pages). */
    size_t bytes = CACHE_SLOTS * sizeof(cache_slot_t), align = (size_t)2 << 20;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    memset(p, 0, bytes);
    return p;
}

static int merge_less(const bpe_merge_t *a, const bpe_merge_t *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(bpe_merge_t *heap, size_t *n, bpe_merge_t m)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!merge_less(&m, &heap[parent]))
            break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = m;
}

static bpe_merge_t heap_pop(bpe_merge_t *heap, size_t *n)
{
    bpe_merge_t top = heap[0];
    bpe_merge_t last = heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && merge_less(&heap[c + 1], &heap[c]))
            c++;
        if (!merge_less(&heap[c], &last))
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n > 0)
        heap[i] = last;
    return top;
}

static fsdp2_status_t reserve_scratch(fsdp2_tokenizer_t *tok, size_t n)
{
    if (n <= tok->scratch_cap)
        return FSDP2_SUCCESS;
    size_t cap = tok->scratch_cap ? tok->scratch_cap : 256;
    while (cap < n)
        cap *= 2;
    bpe_symbol_t *symbols = fsdp2_malloc(cap * sizeof *symbols);
    bpe_merge_t *heap = fsdp2_malloc(3 * cap * sizeof *heap);
    if (symbols == NULL || heap == NULL) {
        free(symbols);
        free(heap);
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tokenizer: merge scratch for a piece of %zu bytes",
                           n);
    }
    free(tok->symbols);
    free(tok->heap);
    tok->symbols = symbols;
    tok->heap = heap;
    tok->scratch_cap = cap;
    return FSDP2_SUCCESS;
}

static void push_pair(const fsdp2_tokenizer_t *tok, bpe_merge_t *heap, size_t *n, int32_t pos)
{
    const bpe_symbol_t *s = tok->symbols;
    if (pos < 0 || s[pos].next < 0)
        return;
    const merge_slot_t *m = merge_table_find(&tok->merges, s[pos].id, s[s[pos].next].id);
    if (m != NULL)
        heap_push(heap, n, (bpe_merge_t){.rank = m->rank, .pos = (uint32_t)pos, .id = m->id});
}

/* Merges piece into tok->symbols; returns the number of symbols (the first is index 0
 * and the list is linked by next). */
static fsdp2_status_t merge_piece(fsdp2_tokenizer_t *tok, const unsigned char *piece, size_t len,
                                  size_t *n_symbols)
{
    FSDP2_CHECK(reserve_scratch(tok, len));
    bpe_symbol_t *s = tok->symbols;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t id = tok->byte_id[piece[i]];
        if (id == TEXT_NO_ID)
            id = tok->unk_id;
        if (id == TEXT_NO_ID)
            continue; /* as tokenizers without an unk token: the byte is dropped */
        s[n] = (bpe_symbol_t){.id = id, .len = 1, .prev = (int32_t)n - 1, .next = (int32_t)n + 1};
        n++;
    }
    if (n == 0) {
        *n_symbols = 0;
        return FSDP2_SUCCESS;
    }
    s[n - 1].next = -1;
    bpe_merge_t *heap = tok->heap;
    size_t h = 0;
    for (size_t i = 0; i + 1 < n; i++)
        push_pair(tok, heap, &h, (int32_t)i);
    while (h > 0) {
        bpe_merge_t top = heap_pop(heap, &h);
        bpe_symbol_t *left = &s[top.pos];
        if (left->len == 0 || left->next < 0)
            continue;
        bpe_symbol_t *right = &s[left->next];
        const merge_slot_t *m = merge_table_find(&tok->merges, left->id, right->id);
        if (m == NULL || m->id != top.id)
            continue;
        left->id = top.id;
        left->len += right->len;
        left->next = right->next;
        right->len = 0;
        if (left->next >= 0)
            s[left->next].prev = (int32_t)top.pos;
        push_pair(tok, heap, &h, left->prev);
        push_pair(tok, heap, &h, (int32_t)top.pos);
    }
    *n_symbols = n;
    return FSDP2_SUCCESS;
}

fsdp2_status_t bpe_encode_piece(fsdp2_tokenizer_t *tok, const char *piece, size_t len,
                                id_sink_t *out)
{
    if (len == 0)
        return FSDP2_SUCCESS;
    cache_slot_t *slot = NULL;
    uint64_t h = 0;
    if (len <= CACHE_KEY_MAX) {
        h = text_hash_bytes(piece, len);
        slot = &tok->cache[h & (CACHE_SLOTS - 1)];
        if (slot->key_len == len && slot->hash == h && memcmp(slot->key, piece, len) == 0) {
            for (size_t i = 0; i < slot->n_ids; i++)
                sink_put(out, slot->ids[i]);
            return FSDP2_SUCCESS;
        }
    }
    if (tok->ignore_merges) {
        uint32_t id = text_table_find(&tok->by_raw, piece, len);
        if (id != TEXT_NO_ID) {
            sink_put(out, id);
            if (slot != NULL) {
                *slot = (cache_slot_t){.hash = h, .key_len = (uint8_t)len, .n_ids = 1, .ids = {id}};
                memcpy(slot->key, piece, len);
            }
            return FSDP2_SUCCESS;
        }
    }
    size_t n;
    FSDP2_CHECK(merge_piece(tok, (const unsigned char *)piece, len, &n));
    size_t first = out->n, count = 0;
    for (int32_t i = n ? 0 : -1; i >= 0; i = tok->symbols[i].next) {
        sink_put(out, tok->symbols[i].id);
        count++;
    }
    /* cached only from where the ids were written: a measuring call writes none */
    if (slot != NULL && count <= CACHE_IDS_MAX && out->ids != NULL && out->n <= out->cap) {
        slot->hash = h;
        slot->key_len = (uint8_t)len;
        slot->n_ids = (uint8_t)count;
        memcpy(slot->key, piece, len);
        memcpy(slot->ids, out->ids + first, count * sizeof(uint32_t));
    }
    return FSDP2_SUCCESS;
}
