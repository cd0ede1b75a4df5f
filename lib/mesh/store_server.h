/* The rendezvous store's server (store_server.c): one thread serving the protocol of
 * store_protocol.h to every rank. Used by store.c on the serving rank, and by tests. */
#ifndef FSDP2_MESH_STORE_SERVER_H
#define FSDP2_MESH_STORE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/status.h>
#include <fsdp2/store.h>

typedef struct fsdp2_store_server fsdp2_store_server_t;

/* Binds port (0: a free one) on bind_host's first address that takes it (the one the
 * ranks connect to), or on every interface (IPv6 and IPv4 where the host has both) when
 * bind_host is NULL, and starts the serving thread. world_size ranks are expected to
 * connect. With a secret (secret_len > 0) every connection must prove it knows it
 * (store_protocol.h) before it holds a rank. */
fsdp2_status_t fsdp2_store_server_start(const char *bind_host, int port, int world_size,
                                        const uint8_t *secret, size_t secret_len,
                                        fsdp2_store_server_t **server);

/* The port bound (the real one when 0 was asked). */
int fsdp2_store_server_port(const fsdp2_store_server_t *server);
/* 1 when it listens on a loopback address only (127.0.0.0/8, ::1): no other host can
 * reach it. */
int fsdp2_store_server_loopback(const fsdp2_store_server_t *server);

/* Waits until every rank that connected has closed (CLOSE or disconnect), or timeout_ms
 * passed, then closes every socket, joins the thread and frees the server. A rank that
 * has not connected when the stop begins is waited for at most STORE_STOP_ABSENT_GRACE_MS
 * (1 s) to connect; timeout_ms 0 stops at once. */
void fsdp2_store_server_stop(fsdp2_store_server_t *server, long timeout_ms);

/* What the server holds right now, for tests (read from any thread). */
typedef struct fsdp2_store_server_stats {
    int connections; /* open connections, before or after HELLO */
    int parked;      /* GET/WAIT requests waiting for keys */
    long keys;
} fsdp2_store_server_stats_t;

void fsdp2_store_server_stats(const fsdp2_store_server_t *server,
                              fsdp2_store_server_stats_t *stats);

/* Sets how long a connection may take to authenticate (STORE_AUTH_TIMEOUT_MS), for tests
 * that wait for that to pass. */
void fsdp2_store_server_set_auth_timeout(fsdp2_store_server_t *server, long timeout_ms);

/* The server a store handle runs (NULL on the ranks that do not serve), for tests. */
fsdp2_store_server_t *fsdp2_store_server_of(fsdp2_store_t *store);

#endif
