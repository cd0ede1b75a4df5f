/* The rendezvous store server's keys: a hash map from byte-string keys to byte-string
 * values (chained buckets, doubled at load 1). Used by one thread; no locking. */
#ifndef FSDP2_MESH_STORE_MAP_H
#define FSDP2_MESH_STORE_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct store_entry {
    struct store_entry *next;
    uint64_t hash;
    uint8_t *value;
    uint32_t value_len;
    uint32_t key_len;
    uint8_t key[];
} store_entry_t;

typedef struct store_map {
    store_entry_t **buckets;
    size_t nbuckets, count;
} store_map_t;

/* 0, or -1 when out of memory. */
int store_map_init(store_map_t *m);

void store_map_free(store_map_t *m);

store_entry_t *store_map_find(const store_map_t *m, const uint8_t *key, uint32_t key_len);

/* Sets key to a copy of value; *created says whether the key is new. Returns 0, or -1
 * when out of memory (the map is unchanged then). */
int store_map_set(store_map_t *m, const uint8_t *key, uint32_t key_len, const void *value,
                  uint32_t len, int *created);

#endif
