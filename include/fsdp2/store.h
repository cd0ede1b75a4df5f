/* The rendezvous key-value store: rank 0 serves it over TCP, every rank (rank 0 too) is
 * a client. Used to exchange UCX worker addresses and NCCL unique ids and for barriers
 * before any collective exists.
 *
 * Keys are strings of 1..FSDP2_STORE_KEY_MAX bytes, values byte strings of at most
 * FSDP2_STORE_VALUE_MAX bytes; keys starting with "__fsdp2/" are the library's own
 * (barriers). Every call blocks until the server answered, or until the store's timeout
 * (FSDP2_TIMEOUT by default, each call its own) passed: FSDP2_ERR_TIMEOUT, never a hang.
 * A server that went away is FSDP2_ERR_PEER_FAILED as soon as its connection closes,
 * and every later call on that handle fails the same way. The server listens on every
 * interface (IPv6 and IPv4) and rejects malformed or oversized requests by closing that
 * connection; it never crashes on them. A rank connecting twice at once (two processes
 * with one rank) or with another world size is refused: FSDP2_ERR_INVALID_CONFIG. A
 * store handle is used by one thread at a time. */
#ifndef FSDP2_STORE_H
#define FSDP2_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

#define FSDP2_STORE_KEY_MAX 512
#define FSDP2_STORE_VALUE_MAX (16u << 20)

typedef struct fsdp2_store fsdp2_store_t;

typedef struct fsdp2_store_options {
    unsigned size;        /* sizeof(fsdp2_store_options_t), for growth */
    const char *host;     /* server address: MASTER_ADDR (name or numeric) */
    int port;             /* server port; 0 with is_server picks a free one */
    int is_server;        /* this process serves (rank 0) */
    int world_size;       /* ranks expected to connect (for barriers and errors) */
    int rank;             /* this process's rank */
    long timeout_ms;      /* <= 0: FSDP2_TIMEOUT */
} fsdp2_store_options_t;

#define FSDP2_STORE_OPTIONS_INIT {sizeof(fsdp2_store_options_t), "127.0.0.1", 0, 0, 1, 0, 0}

/* Connects (and on the server rank first binds and starts serving). Collective in the
 * sense that the server must exist: clients retry connecting, with backoff, until the
 * timeout. options is copied; host may be freed afterwards. */
FSDP2_API fsdp2_status_t fsdp2_store_create(const fsdp2_store_options_t *options,
                                            fsdp2_store_t **store);

/* Closes this rank's connection; on the server rank, stops serving once every other
 * rank that connected has closed (or the timeout passed; a rank that has not connected
 * when the stop begins gets 1 s to do so) and releases the port. NULL ignored. */
FSDP2_API fsdp2_status_t fsdp2_store_destroy(fsdp2_store_t *store);

/* The port the server listens on (the real one when 0 was asked). */
FSDP2_API fsdp2_status_t fsdp2_store_port(const fsdp2_store_t *store, int *port);

FSDP2_API fsdp2_status_t fsdp2_store_set(fsdp2_store_t *store, const char *key,
                                         const void *value, size_t len);

/* Waits until key exists, then copies up to cap bytes into buf; *len (unless NULL) gets
 * the full length (a value longer than cap is FSDP2_ERR_INVALID_ARGUMENT naming both,
 * after copying cap bytes). buf may be NULL when cap is 0. The server parks the request
 * until the key is set: nobody polls. */
FSDP2_API fsdp2_status_t fsdp2_store_get(fsdp2_store_t *store, const char *key, void *buf,
                                         size_t cap, size_t *len);

/* Waits until all n keys exist. */
FSDP2_API fsdp2_status_t fsdp2_store_wait(fsdp2_store_t *store, const char *const *keys,
                                          size_t n);

/* Atomically adds delta to the integer value of key (missing counts as 0) and returns
 * the new value in *result (unless NULL). The value is kept as decimal text, so get
 * reads "42"; a value that is not a decimal integer is FSDP2_ERR_INVALID_ARGUMENT and
 * int64 overflow FSDP2_ERR_OVERFLOW, both leaving the value unchanged. */
FSDP2_API fsdp2_status_t fsdp2_store_add(fsdp2_store_t *store, const char *key, int64_t delta,
                                         int64_t *result);

/* Atomically sets key to desired if its value equals expected (a missing key equals an
 * empty expected). *swapped says whether it did. */
FSDP2_API fsdp2_status_t fsdp2_store_compare_set(fsdp2_store_t *store, const char *key,
                                                 const void *expected, size_t expected_len,
                                                 const void *desired, size_t desired_len,
                                                 int *swapped);

/* Blocks until all world_size ranks called it with the same name (the n-th call of a
 * name on each rank meets the n-th on the others, so names can be reused). On timeout
 * the error names the ranks that did not arrive: "barrier 'init': ranks 2,3 of 4 did
 * not arrive within 2.0 s". */
FSDP2_API fsdp2_status_t fsdp2_store_barrier(fsdp2_store_t *store, const char *name);

FSDP2_EXTERN_C_END

#endif
