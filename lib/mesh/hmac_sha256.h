/* SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the store's authentication: small
 * and dependency-free; not a general cryptography library. */
#ifndef FSDP2_MESH_HMAC_SHA256_H
#define FSDP2_MESH_HMAC_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define FSDP2_SHA256_BYTES 32

void fsdp2_sha256(const void *data, size_t len, uint8_t out[FSDP2_SHA256_BYTES]);

/* HMAC-SHA-256 of the concatenation of the n parts under key. */
void fsdp2_hmac_sha256(const void *key, size_t key_len, const void *const *parts,
                       const size_t *lens, int n, uint8_t out[FSDP2_SHA256_BYTES]);

/* Equal in time independent of where they differ. */
int fsdp2_digest_equal(const uint8_t *a, const uint8_t *b, size_t len);

#endif
