/* The rendezvous store's wire format, shared by the client (store.c) and the server
 * (store_server.c).
 *
 * Every message is a frame: a 4-byte length L, then L bytes of body. A body is a 16-byte
 * header followed by nfields fields, each a 4-byte length and that many bytes. Integers
 * are big-endian. The fields must fill the body exactly; anything else is malformed and
 * the server closes the connection.
 *
 *   header: u8 op | u8 status | u16 reserved (0) | u32 id | u32 timeout_ms | u32 nfields
 *
 * A request carries a fresh id; its reply (same op) repeats it, so that a client which
 * gave up on a request can recognise and drop the late reply. status is an
 * fsdp2_status_t; an error reply carries one field, a message. timeout_ms is read for
 * GET, WAIT and UNLESS only: the server parks those until their keys exist and answers
 * FSDP2_ERR_TIMEOUT once timeout_ms has passed, so a waiting client never polls.
 *
 *   op     request fields                      success reply fields
 *   HELLO  [magic u32|version u16|flags u16|   [magic u32|version u16|flags u16|
 *           rank u32|world_size u32|            server nonce 16|server proof 32]
 *           client nonce 16]
 *   AUTH   [client proof 32]                   []
 *   SET    [key, value]                        []
 *   GET    [key]                               [value]            (parks until key exists)
 *   WAIT   [key...]                            []                 (parks until all exist)
 *   UNLESS [unless, key...]                    [] or [unless's value]   (a WAIT that also
 *                                               ends, with that value, once `unless` exists
 *                                               while a key is missing)
 *   ADD    [key, delta i64]                    [new value i64]    (value kept as decimal text)
 *   CAS    [key, expected, desired]            [swapped u8]
 *   CHECK  [key...]                            [one byte per key: 1 exists, 0 not]
 *   CLOSE  []                                  []                 (this rank is done)
 *
 * The first frame on a connection must be HELLO with the magic and version, and a
 * frame before HELLO may be at most STORE_HELLO_BODY_MAX bytes, so that a stray
 * connection (a port scanner, a wrong MASTER_PORT) is closed without the server
 * allocating anything large.
 *
 * Authentication, when the job has a secret (FSDP2_STORE_SECRET or _FILE, the same on
 * every rank): the HELLO reply's flags say STORE_FLAG_SECRET and carry the server's
 * proof, HMAC-SHA-256(secret, "fsdp2-store server" | client nonce | server nonce |
 * rank); the client checks it (a listener that does not know the secret is refused)
 * and answers AUTH with HMAC-SHA-256(secret, "fsdp2-store client" | server nonce |
 * client nonce | rank). Only then does the connection hold its rank and may it send
 * anything else; a wrong proof is an error reply and the connection is closed, and a
 * connection that has not authenticated within STORE_AUTH_TIMEOUT_MS of connecting is
 * closed. Without a secret the reply's flags are 0, no AUTH follows, and a client that
 * has a secret refuses such a server. */
#ifndef FSDP2_MESH_STORE_PROTOCOL_H
#define FSDP2_MESH_STORE_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <fsdp2/store.h>

#define STORE_MAGIC 0x46534432u /* "FSD2" */
#define STORE_VERSION 3u
#define STORE_HEADER_BYTES 16u
#define STORE_NONCE_BYTES 16u
#define STORE_PROOF_BYTES 32u
#define STORE_HELLO_BYTES (16u + STORE_NONCE_BYTES)
#define STORE_HELLO_REPLY_BYTES (8u + STORE_NONCE_BYTES + STORE_PROOF_BYTES)
#define STORE_FLAG_SECRET 1u      /* HELLO reply: the server authenticates */
#define STORE_AUTH_TIMEOUT_MS 10000 /* to send HELLO and AUTH after connecting */
#define STORE_SECRET_MAX 4096
#define STORE_HELLO_BODY_MAX 64u
/* The largest request: CAS with a key and two values of the maximum size. */
#define STORE_BODY_MAX \
    (STORE_HEADER_BYTES + 3u * 4u + FSDP2_STORE_KEY_MAX + 2u * FSDP2_STORE_VALUE_MAX)

/* The client's longest pause between two connection attempts, and how long a stopping
 * server still waits for ranks that have not connected at all: two such pauses, so that
 * a rank already retrying gets in, and a rank 0 failing because a peer never came is not
 * held much longer (store_server.c, server_main). */
#define STORE_CONNECT_BACKOFF_MAX_MS 500
#define STORE_STOP_ABSENT_GRACE_MS (2 * STORE_CONNECT_BACKOFF_MAX_MS)

typedef enum store_op {
    STORE_OP_HELLO = 1,
    STORE_OP_SET = 2,
    STORE_OP_GET = 3,
    STORE_OP_WAIT = 4,
    STORE_OP_ADD = 5,
    STORE_OP_CAS = 6,
    STORE_OP_CHECK = 7,
    STORE_OP_CLOSE = 8,
    STORE_OP_AUTH = 9,
    STORE_OP_UNLESS = 10,
} store_op_t;

typedef struct store_header {
    uint8_t op;
    uint8_t status;
    uint32_t id;
    uint32_t timeout_ms;
    uint32_t nfields;
} store_header_t;

typedef struct store_field {
    const uint8_t *data;
    uint32_t len;
} store_field_t;

static inline void store_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline uint32_t store_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void store_put_u64(uint8_t *p, uint64_t v)
{
    store_put_u32(p, (uint32_t)(v >> 32));
    store_put_u32(p + 4, (uint32_t)v);
}

static inline uint64_t store_get_u64(const uint8_t *p)
{
    return (uint64_t)store_get_u32(p) << 32 | store_get_u32(p + 4);
}

/* Writes the frame length and header; returns where the first field goes. */
static inline uint8_t *store_frame_begin(uint8_t *frame, uint32_t body_len,
                                         const store_header_t *h)
{
    store_put_u32(frame, body_len);
    uint8_t *p = frame + 4;
    p[0] = h->op;
    p[1] = h->status;
    p[2] = p[3] = 0;
    store_put_u32(p + 4, h->id);
    store_put_u32(p + 8, h->timeout_ms);
    store_put_u32(p + 12, h->nfields);
    return p + STORE_HEADER_BYTES;
}

static inline uint8_t *store_put_field(uint8_t *p, const void *data, uint32_t len)
{
    store_put_u32(p, len);
    if (len)
        memcpy(p + 4, data, len);
    return p + 4 + len;
}

/* Decodes a body's header and checks that exactly nfields fields fill the rest.
 * Returns 0 when well formed. */
static inline int store_body_parse(const uint8_t *body, size_t len, store_header_t *h)
{
    if (len < STORE_HEADER_BYTES || body[2] != 0 || body[3] != 0)
        return -1;
    h->op = body[0];
    h->status = body[1];
    h->id = store_get_u32(body + 4);
    h->timeout_ms = store_get_u32(body + 8);
    h->nfields = store_get_u32(body + 12);
    const uint8_t *p = body + STORE_HEADER_BYTES, *end = body + len;
    for (uint32_t i = 0; i < h->nfields; i++) {
        if ((size_t)(end - p) < 4 || store_get_u32(p) > (size_t)(end - p) - 4)
            return -1;
        p += 4 + store_get_u32(p);
    }
    return p == end ? 0 : -1;
}

/* The field at *cursor (within a body store_body_parse accepted); advances *cursor. */
static inline store_field_t store_field_next(const uint8_t **cursor)
{
    store_field_t f = {*cursor + 4, store_get_u32(*cursor)};
    *cursor += 4 + f.len;
    return f;
}

/* Writes the ranks r < world_size with missing[r] set as "2,3" (at most 32, then
 * ",... (N in all)") into buf; returns how many there are. For messages on both sides. */
static inline int store_format_ranks(const uint8_t *missing, int world_size, char *buf,
                                     size_t cap)
{
    int count = 0;
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < world_size; r++) {
        if (!missing[r])
            continue;
        if (++count <= 32 && used < cap) {
            int n = snprintf(buf + used, cap - used, "%s%d", count > 1 ? "," : "", r);
            used += n > 0 ? (size_t)n : 0;
        }
    }
    if (count > 32 && used < cap)
        snprintf(buf + used, cap - used, ",... (%d in all)", count);
    return count;
}

/* The job's secret: FSDP2_STORE_SECRET (its bytes), or the contents of the file
 * FSDP2_STORE_SECRET_FILE names (a regular file readable by its owner only, a trailing
 * newline dropped); *len 0 when neither is set. store.c. */
fsdp2_status_t fsdp2_store_secret(uint8_t *secret, size_t *len);

/* The server's (is_server) or the client's proof for one connection. store.c. */
void fsdp2_store_proof(const uint8_t *secret, size_t secret_len, int is_server,
                       const uint8_t *client_nonce, const uint8_t *server_nonce, uint32_t rank,
                       uint8_t proof[STORE_PROOF_BYTES]);

/* n random bytes (getrandom). store.c. */
fsdp2_status_t fsdp2_store_random(uint8_t *buf, size_t n);

#endif
