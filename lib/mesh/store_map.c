/* The rendezvous store server's key map (store_map.h). */
#include <stdlib.h>
#include <string.h>

#include "mesh/store_map.h"

#define STORE_MAP_MIN_BUCKETS 64

static uint64_t key_hash(const uint8_t *key, uint32_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint32_t i = 0; i < len; i++)
        h = (h ^ key[i]) * 1099511628211ull;
    return h;
}

int store_map_init(store_map_t *m)
{
    m->nbuckets = STORE_MAP_MIN_BUCKETS;
    m->count = 0;
    m->buckets = calloc(m->nbuckets, sizeof(*m->buckets));
    return m->buckets ? 0 : -1;
}

void store_map_free(store_map_t *m)
{
    for (size_t i = 0; m->buckets && i < m->nbuckets; i++) {
        for (store_entry_t *e = m->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->value);
            free(e);
        }
    }
    free(m->buckets);
    m->buckets = NULL;
}

store_entry_t *store_map_find(const store_map_t *m, const uint8_t *key, uint32_t key_len)
{
    uint64_t h = key_hash(key, key_len);
    for (store_entry_t *e = m->buckets[h & (m->nbuckets - 1)]; e; e = e->next)
        if (e->hash == h && e->key_len == key_len && memcmp(e->key, key, key_len) == 0)
            return e;
    return NULL;
}

static void map_grow(store_map_t *m)
{
    size_t n = m->nbuckets * 2;
    store_entry_t **b = calloc(n, sizeof(*b));
    if (!b)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < m->nbuckets; i++) {
        for (store_entry_t *e = m->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = n;
}

int store_map_set(store_map_t *m, const uint8_t *key, uint32_t key_len, const void *value,
                  uint32_t len, int *created)
{
    uint8_t *copy = NULL;
    if (len && !(copy = malloc(len)))
        return -1;
    if (len)
        memcpy(copy, value, len);
    store_entry_t *e = store_map_find(m, key, key_len);
    *created = e == NULL;
    if (!e) {
        if (!(e = malloc(sizeof(*e) + key_len))) {
            free(copy);
            return -1;
        }
        e->hash = key_hash(key, key_len);
        e->key_len = key_len;
        memcpy(e->key, key, key_len);
        e->value = NULL;
        e->next = m->buckets[e->hash & (m->nbuckets - 1)];
        m->buckets[e->hash & (m->nbuckets - 1)] = e;
        if (++m->count > m->nbuckets)
            map_grow(m);
    }
    free(e->value);
    e->value = copy;
    e->value_len = len;
    return 0;
}
