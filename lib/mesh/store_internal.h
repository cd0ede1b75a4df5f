/* What the library's other layers ask of the rendezvous store beyond the public API. */
#ifndef FSDP2_MESH_STORE_INTERNAL_H
#define FSDP2_MESH_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/store.h>

/* fsdp2_store_wait with its own timeout instead of the store's (a group's set-up waits
 * for its members as long as the group's timeout says). */
fsdp2_status_t fsdp2_store_wait_for(fsdp2_store_t *store, const char *const *keys, size_t n,
                                    long timeout_ms);

/* fsdp2_store_wait_for that also ends once the key `unless` exists (a failure's mark):
 * FSDP2_SUCCESS when keys[0..n) all exist, FSDP2_ERR_ABORTED when `unless` exists while
 * one of them is missing, its length in *len and as much of its value as fits in
 * value[0..cap) (the caller makes its message of the value); FSDP2_ERR_TIMEOUT names the
 * keys still missing. n >= 1. */
fsdp2_status_t fsdp2_store_wait_unless(fsdp2_store_t *store, const char *const *keys, size_t n,
                                       const char *unless, long timeout_ms, void *value,
                                       size_t cap, size_t *len);

/* Which of keys[0..n) are not set right now, without waiting: missing[i] = 1 for those.
 * For messages after a wait timed out (the answer may be stale a moment later). */
fsdp2_status_t fsdp2_store_missing(fsdp2_store_t *store, const char *const *keys, size_t n,
                                   uint8_t *missing);

/* Writes the ranks r < n with missing[r] set as "2,3" (at most 32, then ",... (N in
 * all)") into buf, as the store's own messages list them; returns how many there are. */
int fsdp2_store_format_ranks(const uint8_t *missing, int n, char *buf, size_t cap);

#endif
