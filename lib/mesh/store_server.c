/* The rendezvous store's server: one thread, poll() over non-blocking sockets, a hash
 * map of keys. Protocol: store_protocol.h.
 *
 * Each connection serves one request at a time: its next frame is read only once the
 * previous one has been answered and the answer written out. A GET or WAIT whose keys
 * do not exist yet is parked on its connection (the frame stays in memory) and looked
 * at again whenever a key is created, or answered FSDP2_ERR_TIMEOUT when its deadline
 * passes. So a connection holds at most one frame and one reply, whatever its peer
 * sends, and nobody polls.
 *
 * Anything malformed (a bad length, a frame whose fields do not fill it, an unknown op,
 * a key or value out of bounds, a first message that is not HELLO) closes that one
 * connection with a warning; the server and the other connections carry on. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log_internal.h"
#include "mesh/hmac_sha256.h"
#include "mesh/store_map.h"
#include "mesh/store_protocol.h"
#include "mesh/store_server.h"

#define SERVER_MAX_CONNECTIONS 4096

typedef enum rank_state { RANK_ABSENT = 0, RANK_CONNECTED, RANK_CLOSED } rank_state_t;

typedef struct conn {
    int fd;
    int rank;        /* -1 until HELLO (and AUTH, when the server has a secret) */
    int claim;       /* the rank HELLO asked for, waiting for AUTH; -1 otherwise */
    int64_t opened_ms; /* HELLO and AUTH must be done by opened_ms + STORE_AUTH_TIMEOUT_MS */
    uint8_t client_nonce[STORE_NONCE_BYTES], server_nonce[STORE_NONCE_BYTES];
    int dead;        /* closed and freed at the end of this loop turn */
    int said_close;  /* sent CLOSE: its disconnect is expected */
    int close_after_reply;
    char peer[NI_MAXHOST + NI_MAXSERV + 2];
    uint8_t len_bytes[4];
    uint32_t len_got;
    uint8_t *body; /* the frame being read, served or parked */
    uint32_t body_len, body_got;
    store_header_t req;
    int parked;
    int64_t park_deadline;
    uint32_t park_next; /* WAIT: keys before this index exist ... */
    size_t park_at;     /* ... and this is where key park_next starts in body */
    uint8_t *out;
    size_t out_len, out_sent;
} conn_t;

struct fsdp2_store_server {
    int listen_fd, wake_rd, wake_wr, port, world_size;
    int loopback; /* it listens on a loopback address only */
    uint8_t secret[STORE_SECRET_MAX];
    size_t secret_len; /* 0: connections are not authenticated */
    int accept_paused; /* out of file descriptors: retried when a connection closes */
    pthread_t thread;
    atomic_int stop_requested;
    atomic_long stop_timeout_ms;
    atomic_long auth_timeout_ms; /* STORE_AUTH_TIMEOUT_MS; tests shorten it */
    atomic_int stat_connections, stat_parked;
    atomic_long stat_keys;
    store_map_t map;
    conn_t **conns;       /* SERVER_MAX_CONNECTIONS of them */
    size_t nconns;
    struct pollfd *pfds;  /* the wake pipe, the listener, then one per connection */
    uint8_t *ranks; /* rank_state_t per rank */
};

/* ---------------------------------------------------------------------------------- */
/* Connections: reading one frame, writing one reply, failing.                          */

/* Closes c at the end of this turn, with a warning saying why. */
static __attribute__((format(printf, 2, 3))) void conn_fail(conn_t *c, const char *fmt, ...)
{
    if (c->dead)
        return;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    FSDP2_LOG(WARN, MESH, "store server: closing the connection from %s (rank %d): %s",
              c->peer, c->rank, why);
    c->dead = 1;
}

static void conn_flush(conn_t *c)
{
    while (!c->dead && c->out_sent < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0) {
            FSDP2_LOG(DEBUG, MESH, "store server: send to %s (rank %d): %s", c->peer,
                      c->rank, strerror(errno));
            c->dead = 1;
            return;
        }
        c->out_sent += (size_t)n;
    }
    if (c->dead)
        return;
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_sent = 0;
    if (c->close_after_reply)
        c->dead = 1;
}

/* Answers the request c is serving, with at most one field. */
static void conn_reply(conn_t *c, uint8_t status, const void *data, uint32_t len,
                       int has_field)
{
    uint32_t body = STORE_HEADER_BYTES + (has_field ? 4 + len : 0);
    c->out = malloc(4 + (size_t)body);
    if (!c->out) {
        conn_fail(c, "out of memory for a reply of %u bytes", body);
        return;
    }
    store_header_t h = {c->req.op, status, c->req.id, 0, has_field ? 1 : 0};
    uint8_t *p = store_frame_begin(c->out, body, &h);
    if (has_field)
        store_put_field(p, data, len);
    c->out_len = 4 + (size_t)body;
    c->out_sent = 0;
    conn_flush(c);
}

static __attribute__((format(printf, 3, 4))) void conn_reply_error(conn_t *c,
                                                                   fsdp2_status_t status,
                                                                   const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    conn_reply(c, (uint8_t)status, msg, (uint32_t)strlen(msg), 1);
}

static int conn_frame_ready(const conn_t *c)
{
    return c->body && c->body_got == c->body_len;
}

static void conn_frame_done(conn_t *c)
{
    free(c->body);
    c->body = NULL;
    c->len_got = c->body_len = c->body_got = 0;
}

/* Reads what the current frame still lacks, without blocking. */
static void conn_read(conn_t *c)
{
    while (!c->dead && !conn_frame_ready(c)) {
        uint8_t *dst = c->body ? c->body + c->body_got : c->len_bytes + c->len_got;
        size_t want = c->body ? c->body_len - c->body_got : 4 - c->len_got;
        ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            int mid_frame = c->len_got > 0;
            if (n < 0)
                conn_fail(c, "receive failed: %s", strerror(errno));
            else if (mid_frame)
                conn_fail(c, "disconnected in the middle of a frame");
            else if (c->rank >= 0 && !c->said_close)
                conn_fail(c, "rank %d disconnected without closing the store (did it die?)",
                          c->rank);
            c->dead = 1;
            return;
        }
        if (c->body) {
            c->body_got += (uint32_t)n;
            continue;
        }
        c->len_got += (uint32_t)n;
        if (c->len_got < 4)
            continue;
        uint32_t len = store_get_u32(c->len_bytes);
        uint32_t max = c->rank < 0 ? STORE_HELLO_BODY_MAX : STORE_BODY_MAX;
        if (len < STORE_HEADER_BYTES || len > max) {
            conn_fail(c, "frame length %u outside %u..%u%s", len, STORE_HEADER_BYTES, max,
                      c->rank < 0 ? " (before HELLO)" : "");
            return;
        }
        if (!(c->body = malloc(len))) {
            conn_fail(c, "out of memory for a frame of %u bytes", len);
            return;
        }
        c->body_len = len;
        c->body_got = 0;
    }
}

/* ---------------------------------------------------------------------------------- */
/* Requests.                                                                            */

static void server_key_created(fsdp2_store_server_t *s);

static int key_ok(conn_t *c, store_field_t key)
{
    if (key.len >= 1 && key.len <= FSDP2_STORE_KEY_MAX)
        return 1;
    conn_fail(c, "key of %u bytes (1..%u)", key.len, FSDP2_STORE_KEY_MAX);
    return 0;
}

static int value_ok(conn_t *c, store_field_t value)
{
    if (value.len <= FSDP2_STORE_VALUE_MAX)
        return 1;
    conn_fail(c, "value of %u bytes (at most %u)", value.len, FSDP2_STORE_VALUE_MAX);
    return 0;
}

static int fields_ok(conn_t *c, const char *op, uint32_t expected)
{
    if (c->req.nfields == expected)
        return 1;
    conn_fail(c, "%s with %u fields instead of %u", op, c->req.nfields, expected);
    return 0;
}

static store_entry_t *map_find_field(const store_map_t *m, store_field_t key)
{
    return store_map_find(m, key.data, key.len);
}

/* Sets key to value; answers with the reply field given (or an out-of-memory error)
 * and wakes the parked requests a new key may complete. */
static void server_store(fsdp2_store_server_t *s, conn_t *c, store_field_t key,
                         const void *value, uint32_t len, const void *reply, uint32_t reply_len,
                         int has_reply)
{
    int created = 0;
    if (store_map_set(&s->map, key.data, key.len, value, len, &created) != 0) {
        conn_reply_error(c, FSDP2_ERR_OUT_OF_MEMORY, "store server out of memory for '%.*s'",
                         (int)(key.len > 64 ? 64 : key.len), (const char *)key.data);
        return;
    }
    conn_reply(c, FSDP2_SUCCESS, reply, reply_len, has_reply);
    if (created) {
        atomic_store(&s->stat_keys, (long)s->map.count);
        server_key_created(s);
    }
}

/* Gives c its rank (after HELLO, or after AUTH when the server has a secret). */
static void conn_take_rank(fsdp2_store_server_t *s, conn_t *c, uint32_t rank)
{
    c->rank = (int)rank;
    c->claim = -1;
    s->ranks[rank] = RANK_CONNECTED;
    FSDP2_LOG(DEBUG, MESH, "store server: rank %u connected from %s", rank, c->peer);
}

static void handle_hello(fsdp2_store_server_t *s, conn_t *c)
{
    const uint8_t *cur = c->body + STORE_HEADER_BYTES;
    store_field_t f = c->req.nfields == 1 ? store_field_next(&cur) : (store_field_t){0};
    if (c->claim >= 0) { /* HELLO done: the only next message is AUTH */
        if (c->req.op != STORE_OP_AUTH || f.len != STORE_PROOF_BYTES) {
            conn_fail(c, "op %u with %u fields where AUTH was due", c->req.op, c->req.nfields);
            return;
        }
        uint8_t want[STORE_PROOF_BYTES];
        fsdp2_store_proof(s->secret, s->secret_len, 0, c->client_nonce, c->server_nonce,
                          (uint32_t)c->claim, want);
        if (!fsdp2_digest_equal(want, f.data, STORE_PROOF_BYTES)) {
            FSDP2_LOG(WARN, MESH, "store server: %s failed to authenticate as rank %d",
                      c->peer, c->claim);
            c->close_after_reply = 1;
            conn_reply_error(c, FSDP2_ERR_INVALID_CONFIG,
                             "authentication failed: this rank's secret is not the job's "
                             "(FSDP2_STORE_SECRET or FSDP2_STORE_SECRET_FILE)");
            return;
        }
        if (s->ranks[c->claim] == RANK_CONNECTED) {
            c->close_after_reply = 1;
            conn_reply_error(c, FSDP2_ERR_INVALID_CONFIG,
                             "rank %d is already connected (two processes with the same rank?)",
                             c->claim);
            return;
        }
        conn_take_rank(s, c, (uint32_t)c->claim);
        conn_reply(c, FSDP2_SUCCESS, NULL, 0, 0);
        return;
    }
    if (c->req.op != STORE_OP_HELLO || f.len != STORE_HELLO_BYTES) {
        conn_fail(c, "the first message is op %u with %u fields, not a HELLO", c->req.op,
                  c->req.nfields);
        return;
    }
    if (store_get_u32(f.data) != STORE_MAGIC) {
        conn_fail(c, "HELLO with magic 0x%08x instead of 0x%08x (not a libfsdp2 client)",
                  store_get_u32(f.data), STORE_MAGIC);
        return;
    }
    uint32_t version = (uint32_t)f.data[4] << 8 | f.data[5];
    uint32_t rank = store_get_u32(f.data + 8), world = store_get_u32(f.data + 12);
    c->close_after_reply = 1;
    if (version != STORE_VERSION) {
        conn_reply_error(c, FSDP2_ERR_INVALID_CONFIG,
                         "client speaks store protocol version %u, the server %u", version,
                         STORE_VERSION);
    } else if (world != (uint32_t)s->world_size || rank >= world) {
        /* (said only to a client that gave the right world size, or before a secret
         * exists: the error names no more than the client sent) */
        conn_reply_error(c, FSDP2_ERR_INVALID_CONFIG,
                         "rank %u of world size %u does not fit this store", rank, world);
    } else if (s->ranks[rank] == RANK_CONNECTED) {
        conn_reply_error(c, FSDP2_ERR_INVALID_CONFIG,
                         "rank %u is already connected (two processes with the same rank?)",
                         rank);
    } else {
        uint8_t reply[STORE_HELLO_REPLY_BYTES] = {0};
        store_put_u32(reply, STORE_MAGIC);
        reply[5] = STORE_VERSION;
        if (s->secret_len) {
            memcpy(c->client_nonce, f.data + 16, STORE_NONCE_BYTES);
            if (fsdp2_store_random(c->server_nonce, STORE_NONCE_BYTES) != FSDP2_SUCCESS) {
                conn_reply_error(c, FSDP2_ERR_SYSTEM, "the server has no random bytes");
                return;
            }
            reply[7] = STORE_FLAG_SECRET;
            memcpy(reply + 8, c->server_nonce, STORE_NONCE_BYTES);
            fsdp2_store_proof(s->secret, s->secret_len, 1, c->client_nonce, c->server_nonce,
                              rank, reply + 8 + STORE_NONCE_BYTES);
            c->claim = (int)rank; /* taken only once AUTH proves the secret */
        } else {
            conn_take_rank(s, c, rank);
        }
        c->close_after_reply = 0;
        conn_reply(c, FSDP2_SUCCESS, reply, sizeof(reply), 1);
    }
}

/* Takes c off the parked list. Done before its answer is sent, so that the parked count
 * never includes a request whose client already holds the answer. */
static void conn_unpark(fsdp2_store_server_t *s, conn_t *c)
{
    if (!c->parked)
        return;
    c->parked = 0;
    atomic_fetch_sub(&s->stat_parked, 1);
}

/* A GET or WAIT: answers it if its keys exist; returns whether it did. */
static int try_answer(fsdp2_store_server_t *s, conn_t *c)
{
    const uint8_t *cur = c->body + STORE_HEADER_BYTES;
    if (c->req.op == STORE_OP_GET) {
        store_entry_t *e = map_find_field(&s->map, store_field_next(&cur));
        if (e) {
            conn_unpark(s, c);
            conn_reply(c, FSDP2_SUCCESS, e->value, e->value_len, 1);
        }
        return e != NULL;
    }
    const uint8_t *unless = cur; /* UNLESS: its first field, the key that ends it early */
    cur = c->body + c->park_at;
    for (; c->park_next < c->req.nfields; c->park_next++) {
        const uint8_t *at = cur;
        if (!map_find_field(&s->map, store_field_next(&cur))) {
            c->park_at = (size_t)(at - c->body);
            /* keys that all exist answer an UNLESS whatever its first key says */
            store_entry_t *e = c->req.op == STORE_OP_UNLESS
                                   ? map_find_field(&s->map, store_field_next(&unless))
                                   : NULL;
            if (e) {
                conn_unpark(s, c);
                conn_reply(c, FSDP2_SUCCESS, e->value, e->value_len, 1);
                return 1;
            }
            return 0;
        }
    }
    conn_unpark(s, c);
    conn_reply(c, FSDP2_SUCCESS, NULL, 0, 0);
    return 1;
}

static void handle_wait(fsdp2_store_server_t *s, conn_t *c, int64_t now)
{
    const uint8_t *cur = c->body + STORE_HEADER_BYTES;
    if (c->req.op == STORE_OP_GET && !fields_ok(c, "GET", 1))
        return;
    if (c->req.op == STORE_OP_UNLESS && c->req.nfields < 2) {
        conn_fail(c, "UNLESS with %u fields instead of 2 or more", c->req.nfields);
        return;
    }
    for (uint32_t i = 0; i < c->req.nfields; i++)
        if (!key_ok(c, store_field_next(&cur)))
            return;
    /* the keys to wait for: UNLESS's start after its first */
    cur = c->body + STORE_HEADER_BYTES;
    c->park_next = 0;
    if (c->req.op == STORE_OP_UNLESS) {
        store_field_next(&cur);
        c->park_next = 1;
    }
    c->park_at = (size_t)(cur - c->body);
    if (try_answer(s, c))
        return;
    c->parked = 1;
    c->park_deadline = now + c->req.timeout_ms;
    atomic_fetch_add(&s->stat_parked, 1);
}

static int parse_int64(const store_entry_t *e, int64_t *value)
{
    char text[24];
    if (e->value_len == 0 || e->value_len >= sizeof(text))
        return -1;
    memcpy(text, e->value, e->value_len);
    text[e->value_len] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    const char *digits = text[0] == '-' ? text + 1 : text;
    if (errno || end != text + e->value_len || *digits < '0' || *digits > '9')
        return -1;
    *value = v;
    return 0;
}

static void handle_add(fsdp2_store_server_t *s, conn_t *c)
{
    const uint8_t *cur = c->body + STORE_HEADER_BYTES;
    if (!fields_ok(c, "ADD", 2))
        return;
    store_field_t key = store_field_next(&cur), delta_f = store_field_next(&cur);
    if (!key_ok(c, key))
        return;
    if (delta_f.len != 8) {
        conn_fail(c, "ADD delta of %u bytes instead of 8", delta_f.len);
        return;
    }
    int64_t delta = (int64_t)store_get_u64(delta_f.data), value = 0, sum;
    store_entry_t *e = map_find_field(&s->map, key);
    int klen = (int)(key.len > 64 ? 64 : key.len);
    if (e && parse_int64(e, &value) != 0) {
        conn_reply_error(c, FSDP2_ERR_INVALID_ARGUMENT,
                         "key '%.*s' holds a %u-byte value that is not a decimal integer", klen,
                         (const char *)key.data, e->value_len);
        return;
    }
    if (__builtin_add_overflow(value, delta, &sum)) {
        conn_reply_error(c, FSDP2_ERR_OVERFLOW, "key '%.*s': %" PRId64 " + %" PRId64
                         " overflows int64", klen, (const char *)key.data, value, delta);
        return;
    }
    char text[24];
    int n = snprintf(text, sizeof(text), "%" PRId64, sum);
    uint8_t reply[8];
    store_put_u64(reply, (uint64_t)sum);
    server_store(s, c, key, text, (uint32_t)n, reply, 8, 1);
}

static void handle_cas(fsdp2_store_server_t *s, conn_t *c)
{
    const uint8_t *cur = c->body + STORE_HEADER_BYTES;
    if (!fields_ok(c, "CAS", 3))
        return;
    store_field_t key = store_field_next(&cur), expected = store_field_next(&cur);
    store_field_t desired = store_field_next(&cur);
    if (!key_ok(c, key) || !value_ok(c, expected) || !value_ok(c, desired))
        return;
    store_entry_t *e = map_find_field(&s->map, key);
    int equal = e ? e->value_len == expected.len &&
                        (expected.len == 0 || memcmp(e->value, expected.data, expected.len) == 0)
                  : expected.len == 0;
    uint8_t swapped = (uint8_t)equal;
    if (equal)
        server_store(s, c, key, desired.data, desired.len, &swapped, 1, 1);
    else
        conn_reply(c, FSDP2_SUCCESS, &swapped, 1, 1);
}

static void handle_check(fsdp2_store_server_t *s, conn_t *c)
{
    const uint8_t *cur = c->body + STORE_HEADER_BYTES;
    uint8_t *exists = malloc(c->req.nfields ? c->req.nfields : 1);
    if (!exists) {
        conn_reply_error(c, FSDP2_ERR_OUT_OF_MEMORY, "store server out of memory");
        return;
    }
    for (uint32_t i = 0; i < c->req.nfields; i++) {
        store_field_t key = store_field_next(&cur);
        if (!key_ok(c, key)) {
            free(exists);
            return;
        }
        exists[i] = map_find_field(&s->map, key) != NULL;
    }
    conn_reply(c, FSDP2_SUCCESS, exists, c->req.nfields, 1);
    free(exists);
}

static void handle_request(fsdp2_store_server_t *s, conn_t *c, int64_t now)
{
    if (store_body_parse(c->body, c->body_len, &c->req) != 0) {
        conn_fail(c, "a frame of %u bytes whose fields do not fill it exactly", c->body_len);
        return;
    }
    if (c->rank < 0) { /* HELLO, then AUTH when the server has a secret */
        handle_hello(s, c);
        return;
    }
    if (c->said_close) {
        conn_fail(c, "op %u after CLOSE", c->req.op);
        return;
    }
    const uint8_t *cur = c->body + STORE_HEADER_BYTES;
    switch (c->req.op) {
    case STORE_OP_SET:
        if (fields_ok(c, "SET", 2)) {
            store_field_t key = store_field_next(&cur), value = store_field_next(&cur);
            if (key_ok(c, key) && value_ok(c, value))
                server_store(s, c, key, value.data, value.len, NULL, 0, 0);
        }
        return;
    case STORE_OP_GET:
    case STORE_OP_WAIT:
    case STORE_OP_UNLESS:
        handle_wait(s, c, now);
        return;
    case STORE_OP_ADD:
        handle_add(s, c);
        return;
    case STORE_OP_CAS:
        handle_cas(s, c);
        return;
    case STORE_OP_CHECK:
        handle_check(s, c);
        return;
    case STORE_OP_CLOSE:
        if (fields_ok(c, "CLOSE", 0)) {
            c->said_close = 1;
            s->ranks[c->rank] = RANK_CLOSED;
            conn_reply(c, FSDP2_SUCCESS, NULL, 0, 0);
        }
        return;
    default:
        conn_fail(c, "unknown op %u", c->req.op);
    }
}

/* Serves c's frames until it must wait: for bytes, for its reply to drain, or for keys. */
static void conn_serve(fsdp2_store_server_t *s, conn_t *c, int64_t now)
{
    for (;;) {
        if (!conn_frame_ready(c))
            conn_read(c);
        if (c->dead || c->parked || c->out || !conn_frame_ready(c))
            return;
        handle_request(s, c, now);
        if (!c->parked)
            conn_frame_done(c);
    }
}

static void server_key_created(fsdp2_store_server_t *s)
{
    for (size_t i = 0; i < s->nconns; i++) {
        conn_t *c = s->conns[i];
        if (c->parked && !c->dead && try_answer(s, c))
            conn_frame_done(c);
    }
}

static void server_expire(fsdp2_store_server_t *s, int64_t now)
{
    for (size_t i = 0; i < s->nconns; i++) {
        conn_t *c = s->conns[i];
        long auth_ms = atomic_load(&s->auth_timeout_ms);
        if (c->rank < 0 && !c->dead && !c->out && now >= c->opened_ms + auth_ms) {
            conn_fail(c, "no %s within %.1f s of connecting", c->claim >= 0 ? "AUTH" : "HELLO",
                      auth_ms / 1000.0);
            continue;
        }
        if (!c->parked || c->dead || c->park_deadline > now)
            continue;
        const uint8_t *cur = c->body + c->park_at;
        store_field_t key = store_field_next(&cur);
        conn_unpark(s, c);
        if (c->req.op == STORE_OP_GET) {
            conn_reply_error(c, FSDP2_ERR_TIMEOUT, "key '%.*s' was not set within %u ms",
                             (int)key.len, (const char *)key.data, c->req.timeout_ms);
        } else {
            /* keys are checked in order: this is the first missing one (later ones were
             * not looked at, so no count of missing keys is claimed) */
            uint32_t first = c->req.op == STORE_OP_UNLESS; /* UNLESS's first is not waited for */
            conn_reply_error(c, FSDP2_ERR_TIMEOUT,
                             "key '%.*s' (key %u of the %u waited for) was not set within %u ms",
                             (int)key.len, (const char *)key.data, c->park_next + 1 - first,
                             c->req.nfields - first, c->req.timeout_ms);
        }
        conn_frame_done(c);
    }
}

/* ---------------------------------------------------------------------------------- */
/* The loop.                                                                            */

static void server_accept(fsdp2_store_server_t *s)
{
    for (;;) {
        struct sockaddr_storage addr;
        socklen_t addr_len = sizeof(addr);
        int fd = accept4(s->listen_fd, (struct sockaddr *)&addr, &addr_len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                FSDP2_LOG(WARN, MESH, "store server: cannot accept: %s", strerror(errno));
                s->accept_paused = 1;
            }
            return;
        }
        conn_t *c = s->nconns < SERVER_MAX_CONNECTIONS ? calloc(1, sizeof(*c)) : NULL;
        if (!c) {
            FSDP2_LOG(WARN, MESH, "store server: refusing a connection (%zu open)", s->nconns);
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
        getnameinfo((struct sockaddr *)&addr, addr_len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV);
        snprintf(c->peer, sizeof(c->peer), "%s:%s", host, serv);
        c->fd = fd;
        c->rank = -1;
        c->claim = -1;
        c->opened_ms = fsdp2_now_ms();
        s->conns[s->nconns++] = c;
        atomic_store(&s->stat_connections, (int)s->nconns);
    }
}

static void conn_free(fsdp2_store_server_t *s, conn_t *c)
{
    /* After CLOSE the rank may already have connected again: leave its state alone. */
    if (c->rank >= 0 && !c->said_close)
        s->ranks[c->rank] = RANK_CLOSED;
    if (c->parked)
        atomic_fetch_sub(&s->stat_parked, 1);
    close(c->fd);
    free(c->body);
    free(c->out);
    free(c);
}

static void server_reap(fsdp2_store_server_t *s)
{
    size_t kept = 0;
    for (size_t i = 0; i < s->nconns; i++) {
        if (s->conns[i]->dead) {
            conn_free(s, s->conns[i]);
            s->accept_paused = 0;
        } else {
            s->conns[kept++] = s->conns[i];
        }
    }
    s->nconns = kept;
    atomic_store(&s->stat_connections, (int)kept);
}

/* Whether a stopping server may go: the rule of fsdp2_store_server_stop. A rank that
 * connected is waited for until it has closed, since it may still be reading its last
 * replies. A rank that never connected has nothing to read: it is waited for only until
 * absent_done, the end of a short grace (STORE_STOP_ABSENT_GRACE_MS) that lets a rank
 * already retrying its connection get in. Waiting the whole timeout for it would make a
 * rank 0 that fails because a peer never came report that a second timeout later. */
static int server_may_stop(const fsdp2_store_server_t *s, int absent_done)
{
    for (int r = 0; r < s->world_size; r++)
        if (s->ranks[r] == RANK_CONNECTED || (s->ranks[r] == RANK_ABSENT && !absent_done))
            return 0;
    return 1;
}

/* Warns about the ranks a stop left in state, if any. */
static void server_warn_left(const fsdp2_store_server_t *s, rank_state_t state,
                             const char *what, double after_s)
{
    int count = 0;
    for (int r = 0; r < s->world_size; r++)
        count += s->ranks[r] == state;
    if (count == 0)
        return;
    uint8_t *left = malloc((size_t)s->world_size);
    char list[256] = "?";
    if (left) {
        for (int r = 0; r < s->world_size; r++)
            left[r] = s->ranks[r] == state;
        store_format_ranks(left, s->world_size, list, sizeof(list));
        free(left);
    }
    FSDP2_LOG(WARN, MESH, "store server: stopping after %.1f s although rank%s %s of %d %s",
              after_s, count == 1 ? "" : "s", list, s->world_size, what);
}

/* poll()'s timeout: until the first parked deadline or wake_at (-1: none). */
static int server_poll_timeout(const fsdp2_store_server_t *s, int64_t now, int64_t wake_at)
{
    int64_t next = wake_at;
    for (size_t i = 0; i < s->nconns; i++) {
        const conn_t *c = s->conns[i];
        if (c->parked && (next < 0 || c->park_deadline < next))
            next = c->park_deadline;
        int64_t auth_by = c->opened_ms + atomic_load(&s->auth_timeout_ms);
        if (c->rank < 0 && (next < 0 || auth_by < next))
            next = auth_by;
    }
    if (next < 0)
        return -1;
    return next <= now ? 0 : (int)(next - now > 60000 ? 60000 : next - now);
}

static short conn_events(const conn_t *c)
{
    if (c->out)
        return POLLOUT;
    if (c->parked)
        return POLLRDHUP;
    return POLLIN;
}

static void server_turn(fsdp2_store_server_t *s, int timeout)
{
    size_t n = s->nconns;
    s->pfds[0] = (struct pollfd){s->wake_rd, POLLIN, 0};
    s->pfds[1] = (struct pollfd){s->accept_paused ? -1 : s->listen_fd, POLLIN, 0};
    for (size_t i = 0; i < n; i++)
        s->pfds[i + 2] = (struct pollfd){s->conns[i]->fd, conn_events(s->conns[i]), 0};
    if (poll(s->pfds, n + 2, timeout) < 0)
        return; /* EINTR: signals are blocked here, but be safe */
    if (s->pfds[0].revents) {
        char drain[64];
        while (read(s->wake_rd, drain, sizeof(drain)) > 0) {
        }
    }
    int64_t now = fsdp2_now_ms();
    for (size_t i = 0; i < n; i++) {
        conn_t *c = s->conns[i];
        short ev = s->pfds[i + 2].revents;
        if (!ev || c->dead)
            continue;
        if (c->out)
            conn_flush(c);
        if (c->parked && (ev & (POLLRDHUP | POLLHUP | POLLERR))) {
            if (c->rank >= 0)
                conn_fail(c, "rank %d disconnected while waiting for keys (did it die?)",
                          c->rank);
            c->dead = 1;
        }
        if (!c->dead && !c->out && !c->parked)
            conn_serve(s, c, now);
    }
    server_expire(s, now);
    if (s->pfds[1].revents)
        server_accept(s);
    server_reap(s);
}

/* Serves until a stop is asked for, then until server_may_stop or the stop's timeout.
 * The grace for absent ranks starts with the stop and is at most the timeout; a rank
 * that connects within it is then waited for like the others. */
static void *server_main(void *arg)
{
    fsdp2_store_server_t *s = arg;
    int64_t stop_at = -1, absent_until = -1, stop_started = 0;
    for (;;) {
        int64_t now = fsdp2_now_ms();
        if (stop_at < 0 && atomic_load(&s->stop_requested)) {
            long timeout = atomic_load(&s->stop_timeout_ms);
            stop_started = now;
            stop_at = now + timeout;
            absent_until = now + (timeout < STORE_STOP_ABSENT_GRACE_MS
                                      ? timeout : STORE_STOP_ABSENT_GRACE_MS);
        }
        if (stop_at >= 0 && (server_may_stop(s, now >= absent_until) || now >= stop_at))
            break;
        server_turn(s, server_poll_timeout(s, now, now < absent_until ? absent_until : stop_at));
    }
    /* A stop with no time to wait (a create that failed) has its caller's error. */
    if (atomic_load(&s->stop_timeout_ms) > 0) {
        double after_s = (double)(fsdp2_now_ms() - stop_started) / 1000;
        server_warn_left(s, RANK_CONNECTED, "did not close the store", after_s);
        server_warn_left(s, RANK_ABSENT, "never connected", after_s);
    }
    for (size_t i = 0; i < s->nconns; i++)
        conn_free(s, s->conns[i]);
    s->nconns = 0;
    close(s->listen_fd);
    s->listen_fd = -1;
    return NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Start and stop.                                                                      */

/* A non-blocking listening socket on ai's address, or -1 (*err). v6only: an IPv6 socket
 * takes that address only, not IPv4 besides. */
static int listen_at(const struct addrinfo *ai, int v6only, int *err)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
        *err = errno;
        close(fd);
        return -1;
    }
    return fd;
}

/* The first of host's addresses (NULL: the wildcard of family) that takes a listening
 * socket on port, or -1 (*err). */
static int listen_on(const char *host, int family, int port, int v6only, int *err)
{
    char port_text[16];
    snprintf(port_text, sizeof(port_text), "%d", port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port_text, &hints, &res) != 0) {
        *err = host ? EADDRNOTAVAIL : EAFNOSUPPORT;
        return -1;
    }
    int fd = -1;
    *err = EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
        fd = listen_at(ai, v6only, err);
    freeaddrinfo(res);
    return fd;
}

/* Listens where the ranks were told to connect (bind_host), or on every interface: one
 * IPv6 socket that also takes IPv4 where the host has IPv6, plain IPv4 otherwise. */
static fsdp2_status_t server_listen(fsdp2_store_server_t *s, const char *bind_host, int port)
{
    int err = 0;
    if (bind_host) {
        s->listen_fd = listen_on(bind_host, AF_UNSPEC, port, 1, &err);
        if (s->listen_fd < 0)
            return fsdp2_error(FSDP2_ERR_SYSTEM,
                               "store server: cannot listen on %s port %d (the address the "
                               "ranks were told, MASTER_ADDR): %s%s",
                               bind_host, port, strerror(err),
                               err == EADDRINUSE ? " (choose another MASTER_PORT)"
                                                 : " (FSDP2_STORE_BIND=any listens on every "
                                                   "interface)");
    } else {
        s->listen_fd = listen_on(NULL, AF_INET6, port, 0, &err);
        if (s->listen_fd < 0 && err != EADDRINUSE && err != EACCES)
            s->listen_fd = listen_on(NULL, AF_INET, port, 0, &err);
    }
    if (s->listen_fd < 0)
        return fsdp2_error(FSDP2_ERR_SYSTEM, "store server: cannot listen on port %d: %s%s",
                           port, strerror(err),
                           err == EADDRINUSE ? " (choose another MASTER_PORT)" : "");
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    getsockname(s->listen_fd, (struct sockaddr *)&addr, &len);
    s->port = ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
                                               : ((struct sockaddr_in *)&addr)->sin_port);
    const struct in6_addr *a6 = &((struct sockaddr_in6 *)&addr)->sin6_addr;
    if (addr.ss_family == AF_INET)
        s->loopback = ntohl(((struct sockaddr_in *)&addr)->sin_addr.s_addr) >> 24 == 127;
    else /* ::1, or ::ffff:127.x.y.z */
        s->loopback = IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
    return FSDP2_SUCCESS;
}

static void server_free(fsdp2_store_server_t *s)
{
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->wake_rd >= 0)
        close(s->wake_rd);
    if (s->wake_wr >= 0)
        close(s->wake_wr);
    store_map_free(&s->map);
    free(s->conns);
    free(s->pfds);
    free(s->ranks);
    free(s);
}

static void *server_thread(void *arg)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, NULL);
    return server_main(arg);
}

fsdp2_status_t fsdp2_store_server_start(const char *bind_host, int port, int world_size,
                                        const uint8_t *secret, size_t secret_len,
                                        fsdp2_store_server_t **server)
{
    FSDP2_ARG_CHECK(server != NULL, "server is NULL");
    FSDP2_ARG_CHECK(port >= 0 && port <= 65535, "port=%d outside 0..65535", port);
    FSDP2_ARG_CHECK(world_size >= 1, "world_size=%d", world_size);
    fsdp2_store_server_t *s = calloc(1, sizeof(*s));
    if (!s)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "store server");
    s->listen_fd = s->wake_rd = s->wake_wr = -1;
    s->world_size = world_size;
    atomic_init(&s->auth_timeout_ms, STORE_AUTH_TIMEOUT_MS);
    FSDP2_ARG_CHECK(secret_len <= sizeof(s->secret), "store secret of %zu bytes", secret_len);
    if (secret_len)
        memcpy(s->secret, secret, secret_len);
    s->secret_len = secret_len;
    s->ranks = calloc((size_t)world_size, 1);
    s->conns = calloc(SERVER_MAX_CONNECTIONS, sizeof(*s->conns));
    s->pfds = calloc(SERVER_MAX_CONNECTIONS + 2, sizeof(*s->pfds));
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (store_map_init(&s->map) != 0 || !s->ranks || !s->conns || !s->pfds) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "store server for %d ranks", world_size);
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(server_listen(s, bind_host, port), status, cleanup);
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
        status = fsdp2_error(FSDP2_ERR_SYSTEM, "store server: pipe: %s", strerror(errno));
        goto cleanup;
    }
    s->wake_rd = pipe_fds[0];
    s->wake_wr = pipe_fds[1];
    int rc = pthread_create(&s->thread, NULL, server_thread, s);
    if (rc != 0) {
        status = fsdp2_error(FSDP2_ERR_SYSTEM, "store server: pthread_create: %s", strerror(rc));
        goto cleanup;
    }
    FSDP2_LOG(INFO, MESH, "store server: listening on port %d for %d ranks", s->port,
              world_size);
    *server = s;
    return FSDP2_SUCCESS;
cleanup:
    server_free(s);
    return status;
}

int fsdp2_store_server_port(const fsdp2_store_server_t *server)
{
    return server->port;
}

int fsdp2_store_server_loopback(const fsdp2_store_server_t *server)
{
    return server->loopback;
}

void fsdp2_store_server_stop(fsdp2_store_server_t *server, long timeout_ms)
{
    if (!server)
        return;
    atomic_store(&server->stop_timeout_ms, timeout_ms > 0 ? timeout_ms : 0);
    atomic_store(&server->stop_requested, 1);
    ssize_t rc;
    do
        rc = write(server->wake_wr, "x", 1);
    while (rc < 0 && errno == EINTR);
    pthread_join(server->thread, NULL);
    server_free(server);
}

void fsdp2_store_server_set_auth_timeout(fsdp2_store_server_t *server, long timeout_ms)
{
    atomic_store(&server->auth_timeout_ms, timeout_ms);
}

void fsdp2_store_server_stats(const fsdp2_store_server_t *server,
                              fsdp2_store_server_stats_t *stats)
{
    fsdp2_store_server_t *s = (fsdp2_store_server_t *)server;
    stats->connections = atomic_load(&s->stat_connections);
    stats->parked = atomic_load(&s->stat_parked);
    stats->keys = atomic_load(&s->stat_keys);
}
