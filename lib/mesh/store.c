/* The rendezvous store's client: one blocking TCP connection to the server (protocol:
 * store_protocol.h), with every wait bounded by the store's timeout.
 *
 * A request is sent, then frames are read until the reply with the request's id comes.
 * A reply that arrives after its request timed out on this side is recognised by its
 * id and dropped, so a timeout between frames leaves the connection usable. A timeout
 * in the middle of a frame, a malformed reply or a closed connection cannot be recovered
 * from: the handle is then marked broken and every later call fails at once with the
 * first error. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <fsdp2/env.h>
#include <fsdp2/store.h>

#include "core/env_internal.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/options.h"
#include "core/log_internal.h"
#include "mesh/hmac_sha256.h"
#include "mesh/store_internal.h"
#include "mesh/store_protocol.h"
#include "mesh/store_server.h"

/* How much longer than a GET or WAIT's own timeout a client waits for the server's
 * timeout answer before it gives up on a server that stopped answering at all. */
#define STORE_REPLY_GRACE_MS 1000
/* How long a barrier that timed out spends asking which ranks are missing. */
#define STORE_BARRIER_CHECK_MS 1000
#define STORE_TIMEOUT_MAX_MS (1L << 30)

typedef struct barrier_count {
    struct barrier_count *next;
    uint64_t calls;
    char name[];
} barrier_count_t;

struct fsdp2_store {
    int fd;
    int rank, world_size, port;
    long timeout_ms;
    char host[NI_MAXHOST];
    uint32_t next_id;
    uint8_t *send_buf, *recv_buf;
    size_t send_cap, recv_cap;
    store_header_t reply; /* of the last call; its fields are in recv_buf */
    fsdp2_status_t broken;
    char broken_message[512];
    barrier_count_t *barriers;
    fsdp2_store_server_t *server;
    uint8_t secret[STORE_SECRET_MAX];
    size_t secret_len; /* 0: the job has none */
};

static int remaining_ms(int64_t deadline)
{
    int64_t left = deadline - fsdp2_now_ms();
    return left <= 0 ? 0 : left > 60000 ? 60000 : (int)left;
}

static double seconds(long ms)
{
    return (double)ms / 1000.0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Marks the handle unusable; later calls fail with this status and message. */
static fsdp2_status_t store_break(fsdp2_store_t *st, fsdp2_status_t status, const char *fmt,
                                  ...) __attribute__((format(printf, 3, 4)));

static fsdp2_status_t store_break(fsdp2_store_t *st, fsdp2_status_t status, const char *fmt,
                                  ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->broken_message, sizeof(st->broken_message), fmt, ap);
    va_end(ap);
    st->broken = status;
    FSDP2_LOG(WARN, MESH, "store: rank %d: %s", st->rank, st->broken_message);
    return fsdp2_error(status, "%s", st->broken_message);
}

/* Waits for events on the socket until deadline; 0 when it came, -1 on timeout. */
static int wait_socket(const fsdp2_store_t *st, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd p = {st->fd, events, 0};
        int rc = poll(&p, 1, remaining_ms(deadline));
        if (rc > 0 || (rc < 0 && errno != EINTR))
            return 0; /* ready, hung up or failed: the next send or recv says which */
        if (rc == 0 && fsdp2_now_ms() >= deadline)
            return -1;
    }
}

static fsdp2_status_t send_all(fsdp2_store_t *st, const uint8_t *p, size_t len,
                               int64_t deadline)
{
    while (len) {
        ssize_t n = send(st->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_socket(st, POLLOUT, deadline) != 0)
                return store_break(st, FSDP2_ERR_TIMEOUT,
                                   "the store server at %s:%d took no data for %.1f s", st->host,
                                   st->port, seconds(st->timeout_ms));
        } else if (n < 0 && errno != EINTR) {
            return store_break(st, FSDP2_ERR_PEER_FAILED,
                               "sending to the store server at %s:%d failed: %s (did rank 0 "
                               "exit?)", st->host, st->port, strerror(errno));
        }
    }
    return FSDP2_SUCCESS;
}

/* Reads until *got == len. A timeout returns FSDP2_ERR_TIMEOUT without a message (the
 * caller knows what it was waiting for). */
static fsdp2_status_t recv_all(fsdp2_store_t *st, uint8_t *p, size_t len, size_t *got,
                               int64_t deadline)
{
    while (*got < len) {
        ssize_t n = recv(st->fd, p + *got, len - *got, MSG_DONTWAIT);
        if (n > 0) {
            *got += (size_t)n;
        } else if (n == 0) {
            return store_break(st, FSDP2_ERR_PEER_FAILED,
                               "the store server at %s:%d closed the connection (did rank 0 "
                               "exit, or reject a request?)", st->host, st->port);
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_socket(st, POLLIN, deadline) != 0)
                return FSDP2_ERR_TIMEOUT;
        } else if (errno != EINTR) {
            return store_break(st, FSDP2_ERR_PEER_FAILED,
                               "receiving from the store server at %s:%d failed: %s", st->host,
                               st->port, strerror(errno));
        }
    }
    return FSDP2_SUCCESS;
}

static int grow(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    uint8_t *p = realloc(*buf, need);
    if (!p)
        return -1;
    *buf = p;
    *cap = need;
    return 0;
}

/* Reads the reply to request id into recv_buf / st->reply, dropping stale replies. */
static fsdp2_status_t recv_reply(fsdp2_store_t *st, const char *what, uint32_t id,
                                 uint8_t op, int64_t deadline)
{
    for (;;) {
        uint8_t len_bytes[4];
        size_t got = 0;
        fsdp2_status_t s = recv_all(st, len_bytes, 4, &got, deadline);
        if (s == FSDP2_ERR_TIMEOUT && got == 0)
            return fsdp2_error(s, "%s: no answer from the store server at %s:%d", what,
                               st->host, st->port);
        if (s == FSDP2_ERR_TIMEOUT)
            return store_break(st, s, "%s: a reply from %s:%d stopped half way", what,
                               st->host, st->port);
        FSDP2_CHECK(s);
        uint32_t len = store_get_u32(len_bytes);
        if (len < STORE_HEADER_BYTES || len > STORE_BODY_MAX)
            return store_break(st, FSDP2_ERR_CORRUPT,
                               "%s: a reply of %u bytes from %s:%d (is that a libfsdp2 store?)",
                               what, len, st->host, st->port);
        if (grow(&st->recv_buf, &st->recv_cap, len) != 0)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: a reply of %u bytes", what, len);
        got = 0;
        s = recv_all(st, st->recv_buf, len, &got, deadline);
        if (s == FSDP2_ERR_TIMEOUT)
            return store_break(st, s, "%s: a reply from %s:%d stopped half way", what,
                               st->host, st->port);
        FSDP2_CHECK(s);
        if (store_body_parse(st->recv_buf, len, &st->reply) != 0)
            return store_break(st, FSDP2_ERR_CORRUPT, "%s: a malformed reply from %s:%d",
                               what, st->host, st->port);
        if (st->reply.id == id && st->reply.op == op)
            return FSDP2_SUCCESS;
        FSDP2_LOG(DEBUG, MESH, "store: dropping the late reply to request %u", st->reply.id);
    }
}

/* The only field of the last reply (an empty one when it has none). */
static store_field_t reply_field(const fsdp2_store_t *st)
{
    const uint8_t *cur = st->recv_buf + STORE_HEADER_BYTES;
    return st->reply.nfields ? store_field_next(&cur) : (store_field_t){cur, 0};
}

/* Sends one request and waits for its reply. server_timeout is the GET/WAIT timeout the
 * server applies; what names the call in messages. */
static fsdp2_status_t store_call(fsdp2_store_t *st, const char *what, store_op_t op,
                                 uint32_t server_timeout, const void *const *data,
                                 const uint32_t *lens, uint32_t n, int64_t deadline)
{
    if (st->broken)
        return fsdp2_error(st->broken, "%s: the store connection failed earlier: %s", what,
                           st->broken_message);
    size_t body = STORE_HEADER_BYTES;
    for (uint32_t i = 0; i < n; i++)
        body += 4 + (size_t)lens[i];
    if (body > STORE_BODY_MAX)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "%s: a request of %zu bytes (at most %u)", what, body,
                           STORE_BODY_MAX);
    if (grow(&st->send_buf, &st->send_cap, 4 + body) != 0)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: a request of %zu bytes", what, body);
    store_header_t h = {(uint8_t)op, 0, ++st->next_id, server_timeout, n};
    uint8_t *p = store_frame_begin(st->send_buf, (uint32_t)body, &h);
    for (uint32_t i = 0; i < n; i++)
        p = store_put_field(p, data[i], lens[i]);
    FSDP2_CHECK(send_all(st, st->send_buf, 4 + body, deadline));
    FSDP2_CHECK(recv_reply(st, what, h.id, h.op, deadline));
    if (st->reply.status == FSDP2_SUCCESS)
        return FSDP2_SUCCESS;
    store_field_t msg = reply_field(st);
    return fsdp2_error((fsdp2_status_t)st->reply.status, "%s: %.*s", what,
                       (int)(msg.len > 400 ? 400 : msg.len), (const char *)msg.data);
}

static fsdp2_status_t check_key(const char *what, const char *key)
{
    FSDP2_ARG_CHECK(key != NULL, "%s: key is NULL", what);
    size_t len = strlen(key);
    FSDP2_ARG_CHECK(len >= 1 && len <= FSDP2_STORE_KEY_MAX,
                    "%s: key '%.64s' is %zu bytes long (1..%d)", what, key, len,
                    FSDP2_STORE_KEY_MAX);
    return FSDP2_SUCCESS;
}

/* ---------------------------------------------------------------------------------- */
/* Connecting.                                                                          */

static int try_connect(const struct addrinfo *ai, int64_t deadline, int *err)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        int rc = -1, so_error = errno;
        if (errno == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            do
                rc = poll(&p, 1, remaining_ms(deadline));
            while (rc < 0 && errno == EINTR);
            socklen_t len = sizeof(so_error);
            if (rc == 0)
                so_error = ETIMEDOUT;
            else if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0)
                so_error = errno;
        }
        if (so_error) {
            *err = so_error;
            close(fd);
            return -1;
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
#ifdef SO_NOSIGPIPE
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
    return fd;
}

/* Connects to host:port, retrying with backoff until deadline: the server may start
 * after this rank. */
static fsdp2_status_t store_connect(fsdp2_store_t *st, int64_t deadline)
{
    char port_text[16];
    snprintf(port_text, sizeof(port_text), "%d", st->port);
    char last[128] = "no attempt finished";
    int backoff = 10, attempts = 0;
    for (;;) {
        struct addrinfo hints = {0}, *res = NULL;
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        int rc = getaddrinfo(st->host, port_text, &hints, &res);
        if (rc != 0 && rc != EAI_AGAIN)
            return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "store: cannot resolve host '%s': %s",
                               st->host, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        if (rc != 0)
            snprintf(last, sizeof(last), "%s", gai_strerror(rc));
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int err = 0;
            st->fd = try_connect(ai, deadline, &err);
            if (st->fd >= 0) {
                freeaddrinfo(res);
                FSDP2_LOG(DEBUG, MESH, "store: rank %d connected to %s:%d after %d retries",
                          st->rank, st->host, st->port, attempts);
                return FSDP2_SUCCESS;
            }
            snprintf(last, sizeof(last), "%s", strerror(err));
        }
        if (res)
            freeaddrinfo(res);
        int left = remaining_ms(deadline);
        if (left == 0)
            return fsdp2_error(FSDP2_ERR_TIMEOUT,
                               "store: rank %d cannot connect to %s:%d within %.1f s (%s); is "
                               "rank 0 serving there (MASTER_ADDR, MASTER_PORT)?",
                               st->rank, st->host, st->port, seconds(st->timeout_ms), last);
        sleep_ms(backoff < left ? backoff : left);
        backoff = backoff * 2 > STORE_CONNECT_BACKOFF_MAX_MS ? STORE_CONNECT_BACKOFF_MAX_MS
                                                             : backoff * 2;
        attempts++;
    }
}

fsdp2_status_t fsdp2_store_random(uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return fsdp2_error(FSDP2_ERR_SYSTEM, "store: getrandom: %s", strerror(errno));
        got += (size_t)r;
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_store_secret(uint8_t *secret, size_t *len)
{
    *len = 0;
    const char *text = fsdp2_env_text(FSDP2_ENV_STORE_SECRET);
    const char *path = fsdp2_env_text(FSDP2_ENV_STORE_SECRET_FILE);
    if (text) {
        size_t n = strlen(text);
        if (n > STORE_SECRET_MAX)
            return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                               "FSDP2_STORE_SECRET has %zu bytes (at most %u)", n,
                               STORE_SECRET_MAX);
        memcpy(secret, text, n);
        *len = n;
        return FSDP2_SUCCESS;
    }
    if (!path)
        return FSDP2_SUCCESS;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "FSDP2_STORE_SECRET_FILE=%s: %s", path,
                           strerror(errno));
    struct stat st;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                             "FSDP2_STORE_SECRET_FILE=%s is not a regular file", path);
    else if (st.st_mode & 077)
        status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                             "FSDP2_STORE_SECRET_FILE=%s has mode %04o: others may read the "
                             "job's secret (chmod 600 it)",
                             path, (unsigned)(st.st_mode & 07777));
    ssize_t n = status == FSDP2_SUCCESS ? read(fd, secret, STORE_SECRET_MAX) : 0;
    close(fd);
    FSDP2_CHECK(status);
    if (n < 0)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "FSDP2_STORE_SECRET_FILE=%s: %s", path,
                           strerror(errno));
    while (n > 0 && (secret[n - 1] == '\n' || secret[n - 1] == '\r'))
        n--;
    if (n == 0)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "FSDP2_STORE_SECRET_FILE=%s is empty", path);
    *len = (size_t)n;
    return FSDP2_SUCCESS;
}

void fsdp2_store_proof(const uint8_t *secret, size_t secret_len, int is_server,
                       const uint8_t *client_nonce, const uint8_t *server_nonce, uint32_t rank,
                       uint8_t proof[STORE_PROOF_BYTES])
{
    static const char server_label[] = "fsdp2-store server", client_label[] = "fsdp2-store client";
    uint8_t rank_bytes[4];
    store_put_u32(rank_bytes, rank);
    const void *parts[4] = {is_server ? server_label : client_label,
                            is_server ? client_nonce : server_nonce,
                            is_server ? server_nonce : client_nonce, rank_bytes};
    size_t lens[4] = {sizeof(server_label) - 1, STORE_NONCE_BYTES, STORE_NONCE_BYTES, 4};
    fsdp2_hmac_sha256(secret, secret_len, parts, lens, 4, proof);
}

/* HELLO, and AUTH when the job has a secret: both sides prove they know it. */
static fsdp2_status_t store_hello(fsdp2_store_t *st, int64_t deadline)
{
    uint8_t hello[STORE_HELLO_BYTES] = {0};
    store_put_u32(hello, STORE_MAGIC);
    hello[5] = STORE_VERSION;
    hello[7] = st->secret_len ? STORE_FLAG_SECRET : 0;
    store_put_u32(hello + 8, (uint32_t)st->rank);
    store_put_u32(hello + 12, (uint32_t)st->world_size);
    uint8_t *client_nonce = hello + 16;
    FSDP2_CHECK(fsdp2_store_random(client_nonce, STORE_NONCE_BYTES));
    const void *data[1] = {hello};
    uint32_t lens[1] = {sizeof(hello)};
    FSDP2_CHECK(store_call(st, "store hello", STORE_OP_HELLO, 0, data, lens, 1, deadline));
    store_field_t f = reply_field(st);
    if (f.len != STORE_HELLO_REPLY_BYTES || store_get_u32(f.data) != STORE_MAGIC)
        return store_break(st, FSDP2_ERR_CORRUPT,
                           "%s:%d answered HELLO without the libfsdp2 store magic", st->host,
                           st->port);
    int server_has_secret = (f.data[7] & STORE_FLAG_SECRET) != 0;
    if (!st->secret_len && server_has_secret)
        return store_break(st, FSDP2_ERR_INVALID_CONFIG,
                           "the store at %s:%d authenticates its ranks and this rank has no "
                           "secret (FSDP2_STORE_SECRET or FSDP2_STORE_SECRET_FILE, as on rank 0)",
                           st->host, st->port);
    if (!st->secret_len)
        return FSDP2_SUCCESS;
    uint8_t server_nonce[STORE_NONCE_BYTES], want[STORE_PROOF_BYTES];
    memcpy(server_nonce, f.data + 8, STORE_NONCE_BYTES);
    fsdp2_store_proof(st->secret, st->secret_len, 1, client_nonce, server_nonce,
                      (uint32_t)st->rank, want);
    if (!server_has_secret ||
        !fsdp2_digest_equal(want, f.data + 8 + STORE_NONCE_BYTES, STORE_PROOF_BYTES))
        return store_break(st, FSDP2_ERR_INVALID_CONFIG,
                           "the store at %s:%d did not prove it knows this job's secret "
                           "(FSDP2_STORE_SECRET or _FILE differ from rank 0's, or another "
                           "program listens there)",
                           st->host, st->port);
    uint8_t proof[STORE_PROOF_BYTES];
    fsdp2_store_proof(st->secret, st->secret_len, 0, client_nonce, server_nonce,
                      (uint32_t)st->rank, proof);
    const void *auth[1] = {proof};
    uint32_t auth_len[1] = {sizeof(proof)};
    return store_call(st, "store authentication", STORE_OP_AUTH, 0, auth, auth_len, 1, deadline);
}

/* Where rank 0's server listens: only on the address the ranks were told when it is an
 * address (127.0.0.1 for a job on one host keeps other hosts out) or "localhost"; on
 * every interface for a host name (rank 0 may resolve its own name to another address
 * than the other hosts do: Debian maps the hostname to 127.0.1.1) or with
 * FSDP2_STORE_BIND=any. */
static const char *store_bind_host(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (fsdp2_env_int(FSDP2_ENV_STORE_BIND) != 0)
        return NULL;
    if (inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1 ||
        strcmp(host, "localhost") == 0)
        return host;
    return NULL;
}

static fsdp2_status_t check_options(const fsdp2_store_options_t *o)
{
    FSDP2_ARG_CHECK(o != NULL, "store options are NULL");
    FSDP2_ARG_CHECK(o->world_size >= 1, "store world_size=%d (at least 1)", o->world_size);
    FSDP2_ARG_CHECK(o->rank >= 0 && o->rank < o->world_size,
                    "store rank=%d outside 0..%d (world_size=%d)", o->rank, o->world_size - 1,
                    o->world_size);
    FSDP2_ARG_CHECK(o->host && o->host[0] && strlen(o->host) < NI_MAXHOST,
                    "store host '%.64s' is empty or too long", o->host ? o->host : "(null)");
    FSDP2_ARG_CHECK(o->port >= (o->is_server ? 0 : 1) && o->port <= 65535,
                    "store port=%d outside %d..65535", o->port, o->is_server ? 0 : 1);
    return FSDP2_SUCCESS;
}

static void store_free(fsdp2_store_t *st)
{
    if (st->fd >= 0)
        close(st->fd);
    if (st->server)
        fsdp2_store_server_stop(st->server, st->timeout_ms);
    for (barrier_count_t *b = st->barriers, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(st->send_buf);
    free(st->recv_buf);
    explicit_bzero(st->secret, sizeof(st->secret));
    free(st);
}

fsdp2_status_t fsdp2_store_create(const fsdp2_store_options_t *options, fsdp2_store_t **store)
{
    FSDP2_ARG_CHECK(store != NULL, "store is NULL");
    FSDP2_ARG_CHECK(options != NULL, "store options are NULL");
    fsdp2_store_options_t opts = FSDP2_STORE_OPTIONS_INIT;
    FSDP2_CHECK(fsdp2_options_copy("store options", &opts, sizeof(opts), options, NULL, 0));
    options = &opts;
    FSDP2_CHECK(check_options(options));
    FSDP2_CHECK(fsdp2_env_init());
    fsdp2_store_t *st = calloc(1, sizeof(*st));
    if (!st)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "store handle");
    st->fd = -1;
    st->rank = options->rank;
    st->world_size = options->world_size;
    st->port = options->port;
    long timeout = options->timeout_ms > 0 ? options->timeout_ms
                                           : (long)fsdp2_env_int(FSDP2_ENV_TIMEOUT);
    st->timeout_ms = timeout > STORE_TIMEOUT_MAX_MS ? STORE_TIMEOUT_MAX_MS : timeout;
    snprintf(st->host, sizeof(st->host), "%s", options->host);
    fsdp2_status_t status = fsdp2_store_secret(st->secret, &st->secret_len);
    if (status != FSDP2_SUCCESS)
        goto cleanup;
    if (options->is_server) {
        const char *bind_host = store_bind_host(options->host);
        FSDP2_CHECK_GOTO(fsdp2_store_server_start(bind_host, options->port, options->world_size,
                                                  st->secret, st->secret_len, &st->server),
                         status, cleanup);
        st->port = fsdp2_store_server_port(st->server);
        /* Our launcher gives every job a secret (or warns); ranks started by hand or by
         * another launcher may have none, and then any client that reaches the port can
         * take a rank. */
        if (!st->secret_len && !fsdp2_store_server_loopback(st->server))
            FSDP2_LOG(WARN, MESH,
                      "store: listening on %s, port %d, beyond loopback, and the job has no "
                      "secret: any client that reaches the port can join as a rank (set "
                      "FSDP2_STORE_SECRET or FSDP2_STORE_SECRET_FILE, the same on every rank)",
                      bind_host ? bind_host : "every interface", st->port);
    }
    int64_t deadline = fsdp2_now_ms() + st->timeout_ms;
    FSDP2_CHECK_GOTO(store_connect(st, deadline), status, cleanup);
    FSDP2_CHECK_GOTO(store_hello(st, deadline), status, cleanup);
    FSDP2_LOG(INFO, MESH, "store: rank %d of %d connected to %s:%d%s (timeout %.1f s)",
              st->rank, st->world_size, st->host, st->port, st->server ? ", serving" : "",
              seconds(st->timeout_ms));
    *store = st;
    return FSDP2_SUCCESS;
cleanup:
    if (st->server) {
        fsdp2_store_server_stop(st->server, 0);
        st->server = NULL;
    }
    store_free(st);
    return status;
}

fsdp2_status_t fsdp2_store_destroy(fsdp2_store_t *store)
{
    if (!store)
        return FSDP2_SUCCESS;
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (store->fd >= 0 && !store->broken)
        status = store_call(store, "store close", STORE_OP_CLOSE, 0, NULL, NULL, 0,
                            fsdp2_now_ms() + store->timeout_ms);
    store_free(store);
    return status;
}

fsdp2_status_t fsdp2_store_port(const fsdp2_store_t *store, int *port)
{
    FSDP2_ARG_CHECK(store != NULL && port != NULL, "store or port is NULL");
    *port = store->port;
    return FSDP2_SUCCESS;
}

fsdp2_store_server_t *fsdp2_store_server_of(fsdp2_store_t *store)
{
    return store ? store->server : NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Operations.                                                                          */

fsdp2_status_t fsdp2_store_set(fsdp2_store_t *store, const char *key, const void *value,
                               size_t len)
{
    FSDP2_ARG_CHECK(store != NULL, "store is NULL");
    FSDP2_CHECK(check_key("set", key));
    FSDP2_ARG_CHECK(value != NULL || len == 0, "set '%s': value is NULL with len=%zu", key,
                    len);
    FSDP2_ARG_CHECK(len <= FSDP2_STORE_VALUE_MAX, "set '%s': value of %zu bytes (at most %u)",
                    key, len, FSDP2_STORE_VALUE_MAX);
    char what[FSDP2_STORE_KEY_MAX + 16];
    snprintf(what, sizeof(what), "set '%s'", key);
    const void *data[2] = {key, value};
    uint32_t lens[2] = {(uint32_t)strlen(key), (uint32_t)len};
    return store_call(store, what, STORE_OP_SET, 0, data, lens, 2,
                      fsdp2_now_ms() + store->timeout_ms);
}

fsdp2_status_t fsdp2_store_get(fsdp2_store_t *store, const char *key, void *buf, size_t cap,
                               size_t *len)
{
    FSDP2_ARG_CHECK(store != NULL, "store is NULL");
    FSDP2_CHECK(check_key("get", key));
    FSDP2_ARG_CHECK(buf != NULL || cap == 0, "get '%s': buf is NULL with cap=%zu", key, cap);
    char what[FSDP2_STORE_KEY_MAX + 16];
    snprintf(what, sizeof(what), "get '%s'", key);
    const void *data[1] = {key};
    uint32_t lens[1] = {(uint32_t)strlen(key)};
    fsdp2_status_t s = store_call(store, what, STORE_OP_GET, (uint32_t)store->timeout_ms,
                                  data, lens, 1,
                                  fsdp2_now_ms() + store->timeout_ms + STORE_REPLY_GRACE_MS);
    if (s == FSDP2_ERR_TIMEOUT && store->reply.id == store->next_id)
        return fsdp2_error(s, "get '%s': the key was not set within %.1f s", key,
                           seconds(store->timeout_ms));
    FSDP2_CHECK(s);
    store_field_t value = reply_field(store);
    if (len)
        *len = value.len;
    if (value.len && cap)
        memcpy(buf, value.data, value.len < cap ? value.len : cap);
    FSDP2_ARG_CHECK(value.len <= cap, "get '%s': the value of %u bytes does not fit in %zu",
                    key, value.len, cap);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t key_lengths(const char *what, const char *const *keys, size_t n,
                                  uint32_t **lens)
{
    *lens = malloc(n * sizeof(**lens));
    if (!*lens)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s: %zu keys", what, n);
    for (size_t i = 0; i < n; i++) {
        fsdp2_status_t s = check_key(what, keys[i]);
        if (s != FSDP2_SUCCESS) {
            free(*lens);
            *lens = NULL;
            return s;
        }
        (*lens)[i] = (uint32_t)strlen(keys[i]);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_store_missing(fsdp2_store_t *store, const char *const *keys, size_t n,
                                   uint8_t *missing)
{
    FSDP2_ARG_CHECK(store && ((keys && missing) || n == 0),
                    "check: store, keys or missing is NULL");
    FSDP2_ARG_CHECK(n <= UINT32_MAX / 8, "check: n=%zu keys", n);
    if (n == 0)
        return FSDP2_SUCCESS;
    uint32_t *lens;
    FSDP2_CHECK(key_lengths("check", keys, n, &lens));
    fsdp2_status_t s = store_call(store, "check", STORE_OP_CHECK, 0, (const void *const *)keys,
                                  lens, (uint32_t)n, fsdp2_now_ms() + STORE_BARRIER_CHECK_MS);
    free(lens);
    FSDP2_CHECK(s);
    store_field_t f = reply_field(store);
    if (f.len != (uint32_t)n)
        return store_break(store, FSDP2_ERR_CORRUPT, "check of %zu keys: a reply of %u bytes", n,
                           f.len);
    for (size_t i = 0; i < n; i++)
        missing[i] = f.data[i] == 0;
    return FSDP2_SUCCESS;
}

int fsdp2_store_format_ranks(const uint8_t *missing, int n, char *buf, size_t cap)
{
    return store_format_ranks(missing, n, buf, cap);
}

/* The error of a wait that timed out, naming the keys still missing (as many as fit). */
static fsdp2_status_t wait_timed_out(fsdp2_store_t *st, const char *const *keys, size_t n,
                                     long timeout_ms)
{
    char timeout_message[512];
    snprintf(timeout_message, sizeof(timeout_message), "%s", fsdp2_last_error());
    uint8_t *missing = malloc(n);
    if (!missing || fsdp2_store_missing(st, keys, n, missing) != FSDP2_SUCCESS) {
        free(missing);
        return fsdp2_error(FSDP2_ERR_TIMEOUT, "%s", timeout_message);
    }
    char list[400] = "";
    size_t used = 0, count = 0;
    for (size_t i = 0; i < n; i++) {
        if (!missing[i])
            continue;
        count++;
        if (used < sizeof(list)) {
            int k = snprintf(list + used, sizeof(list) - used, "%s'%s'", used ? ", " : "",
                             keys[i]);
            used += k > 0 ? (size_t)k : 0;
        }
    }
    free(missing);
    if (count == 0) /* all arrived just after the deadline */
        return fsdp2_error(FSDP2_ERR_TIMEOUT, "%s", timeout_message);
    if (used >= sizeof(list))
        memcpy(list + sizeof(list) - 5, "...", 4);
    return fsdp2_error(FSDP2_ERR_TIMEOUT, "wait: %zu of %zu keys not set within %.1f s: %s", count,
                       n, seconds(timeout_ms), list);
}

fsdp2_status_t fsdp2_store_wait(fsdp2_store_t *store, const char *const *keys, size_t n)
{
    FSDP2_ARG_CHECK(store != NULL, "store is NULL");
    return fsdp2_store_wait_for(store, keys, n, store->timeout_ms);
}

/* WAIT (fields: the keys) or UNLESS (fields: `unless`, then the keys). A timeout names
 * the waited-for keys still missing. */
static fsdp2_status_t wait_call(fsdp2_store_t *st, store_op_t op, const char *const *fields,
                                size_t nfields, long timeout_ms)
{
    if (timeout_ms > STORE_TIMEOUT_MAX_MS)
        timeout_ms = STORE_TIMEOUT_MAX_MS;
    size_t first = op == STORE_OP_UNLESS; /* the first waited-for key */
    uint32_t *lens;
    FSDP2_CHECK(key_lengths("wait", fields, nfields, &lens));
    char what[64];
    snprintf(what, sizeof(what), "wait for %zu keys", nfields - first);
    fsdp2_status_t s = store_call(st, what, op, (uint32_t)timeout_ms, (const void *const *)fields,
                                  lens, (uint32_t)nfields,
                                  fsdp2_now_ms() + timeout_ms + STORE_REPLY_GRACE_MS);
    free(lens);
    if (s == FSDP2_ERR_TIMEOUT && !st->broken)
        s = wait_timed_out(st, fields + first, nfields - first, timeout_ms);
    return s;
}

fsdp2_status_t fsdp2_store_wait_for(fsdp2_store_t *store, const char *const *keys, size_t n,
                                    long timeout_ms)
{
    FSDP2_ARG_CHECK(store != NULL, "store is NULL");
    FSDP2_ARG_CHECK(timeout_ms > 0, "wait: timeout %ld ms", timeout_ms);
    FSDP2_ARG_CHECK(keys != NULL || n == 0, "wait: keys is NULL with n=%zu", n);
    FSDP2_ARG_CHECK(n <= UINT32_MAX / 8, "wait: n=%zu keys", n);
    if (n == 0)
        return FSDP2_SUCCESS;
    return wait_call(store, STORE_OP_WAIT, keys, n, timeout_ms);
}

fsdp2_status_t fsdp2_store_wait_unless(fsdp2_store_t *store, const char *const *keys, size_t n,
                                       const char *unless, long timeout_ms, void *value,
                                       size_t cap, size_t *len)
{
    FSDP2_ARG_CHECK(store && len && (value || cap == 0), "wait: store, value or len is NULL");
    *len = 0;
    FSDP2_ARG_CHECK(timeout_ms > 0, "wait: timeout %ld ms", timeout_ms);
    FSDP2_ARG_CHECK(keys != NULL && unless != NULL, "wait: keys or unless is NULL");
    FSDP2_ARG_CHECK(n >= 1 && n < UINT32_MAX / 8, "wait: n=%zu keys", n);
    const char **all = malloc((n + 1) * sizeof(*all));
    if (!all)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "wait: %zu keys", n);
    all[0] = unless;
    memcpy(all + 1, keys, n * sizeof(*all));
    fsdp2_status_t s = wait_call(store, STORE_OP_UNLESS, all, n + 1, timeout_ms);
    free(all);
    FSDP2_CHECK(s);
    if (store->reply.nfields == 0)
        return FSDP2_SUCCESS;
    store_field_t f = reply_field(store);
    memcpy(value, f.data, f.len < cap ? f.len : cap);
    *len = f.len;
    return fsdp2_error(FSDP2_ERR_ABORTED, "wait: '%s' was set (%u bytes)", unless, f.len);
}

fsdp2_status_t fsdp2_store_add(fsdp2_store_t *store, const char *key, int64_t delta,
                               int64_t *result)
{
    FSDP2_ARG_CHECK(store != NULL, "store is NULL");
    FSDP2_CHECK(check_key("add", key));
    char what[FSDP2_STORE_KEY_MAX + 16];
    snprintf(what, sizeof(what), "add to '%s'", key);
    uint8_t delta_bytes[8];
    store_put_u64(delta_bytes, (uint64_t)delta);
    const void *data[2] = {key, delta_bytes};
    uint32_t lens[2] = {(uint32_t)strlen(key), 8};
    FSDP2_CHECK(store_call(store, what, STORE_OP_ADD, 0, data, lens, 2,
                           fsdp2_now_ms() + store->timeout_ms));
    store_field_t f = reply_field(store);
    if (f.len != 8)
        return store_break(store, FSDP2_ERR_CORRUPT, "%s: a reply of %u bytes, not 8", what,
                           f.len);
    if (result)
        *result = (int64_t)store_get_u64(f.data);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_store_compare_set(fsdp2_store_t *store, const char *key,
                                       const void *expected, size_t expected_len,
                                       const void *desired, size_t desired_len, int *swapped)
{
    FSDP2_ARG_CHECK(store != NULL, "store is NULL");
    FSDP2_CHECK(check_key("compare_set", key));
    FSDP2_ARG_CHECK((expected || !expected_len) && (desired || !desired_len),
                    "compare_set '%s': NULL expected or desired with a length", key);
    FSDP2_ARG_CHECK(expected_len <= FSDP2_STORE_VALUE_MAX && desired_len <= FSDP2_STORE_VALUE_MAX,
                    "compare_set '%s': values of %zu and %zu bytes (at most %u)", key,
                    expected_len, desired_len, FSDP2_STORE_VALUE_MAX);
    char what[FSDP2_STORE_KEY_MAX + 24];
    snprintf(what, sizeof(what), "compare_set '%s'", key);
    const void *data[3] = {key, expected, desired};
    uint32_t lens[3] = {(uint32_t)strlen(key), (uint32_t)expected_len, (uint32_t)desired_len};
    FSDP2_CHECK(store_call(store, what, STORE_OP_CAS, 0, data, lens, 3,
                           fsdp2_now_ms() + store->timeout_ms));
    store_field_t f = reply_field(store);
    if (f.len != 1)
        return store_break(store, FSDP2_ERR_CORRUPT, "%s: a reply of %u bytes, not 1", what,
                           f.len);
    if (swapped)
        *swapped = f.data[0] != 0;
    return FSDP2_SUCCESS;
}

/* ---------------------------------------------------------------------------------- */
/* Barrier: every rank sets its own key of this call, then waits for all of them. The
 * keys are "__fsdp2/barrier/<call>/<rank>/<name>", call counting this rank's earlier
 * barriers of the same name, so that a name can be reused. On a timeout the ranks
 * whose keys are missing are the ones that did not arrive. */

static fsdp2_status_t barrier_next_call(fsdp2_store_t *st, const char *name, uint64_t *call)
{
    barrier_count_t *b = st->barriers;
    while (b && strcmp(b->name, name) != 0)
        b = b->next;
    if (!b) {
        size_t len = strlen(name);
        if (!(b = malloc(sizeof(*b) + len + 1)))
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "barrier '%s'", name);
        memcpy(b->name, name, len + 1);
        b->calls = 0;
        b->next = st->barriers;
        st->barriers = b;
    }
    *call = b->calls++;
    return FSDP2_SUCCESS;
}

/* Names the ranks that have not set their key, for the timeout message. */
static fsdp2_status_t barrier_missing(fsdp2_store_t *st, const char *name,
                                      const char *const *keys, const uint32_t *lens)
{
    char what[FSDP2_STORE_KEY_MAX + 16];
    snprintf(what, sizeof(what), "barrier '%s'", name);
    long timeout = st->timeout_ms;
    fsdp2_status_t s = store_call(st, what, STORE_OP_CHECK, 0, (const void *const *)keys,
                                  lens, (uint32_t)st->world_size,
                                  fsdp2_now_ms() + STORE_BARRIER_CHECK_MS);
    store_field_t f = reply_field(st);
    if (s != FSDP2_SUCCESS || f.len != (uint32_t)st->world_size)
        return fsdp2_error(FSDP2_ERR_TIMEOUT,
                           "barrier '%s': not every one of %d ranks arrived within %.1f s "
                           "(and the server could not say which: %s)", name, st->world_size,
                           seconds(timeout), fsdp2_last_error());
    uint8_t *missing = malloc((size_t)st->world_size);
    char list[256] = "?";
    int count = 0;
    if (missing) {
        for (int r = 0; r < st->world_size; r++)
            missing[r] = f.data[r] == 0;
        count = store_format_ranks(missing, st->world_size, list, sizeof(list));
        free(missing);
    }
    return fsdp2_error(FSDP2_ERR_TIMEOUT, "barrier '%s': rank%s %s of %d did not arrive within "
                       "%.1f s", name, count == 1 ? "" : "s", list, st->world_size,
                       seconds(timeout));
}

fsdp2_status_t fsdp2_store_barrier(fsdp2_store_t *store, const char *name)
{
    FSDP2_ARG_CHECK(store != NULL, "store is NULL");
    FSDP2_ARG_CHECK(name != NULL && name[0], "barrier name is NULL or empty");
    size_t name_len = strlen(name), key_max = name_len + 64;
    FSDP2_ARG_CHECK(key_max <= FSDP2_STORE_KEY_MAX, "barrier name '%.64s...' is %zu bytes long",
                    name, name_len);
    int64_t deadline = fsdp2_now_ms() + store->timeout_ms;
    uint64_t call = 0;
    FSDP2_CHECK(barrier_next_call(store, name, &call));
    size_t world = (size_t)store->world_size;
    char **keys = malloc(world * sizeof(*keys));
    uint32_t *lens = malloc(world * sizeof(*lens));
    char *text = malloc(world * key_max);
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (!keys || !lens || !text) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "barrier '%s' for %zu ranks", name, world);
        goto cleanup;
    }
    for (size_t r = 0; r < world; r++) {
        keys[r] = text + r * key_max;
        int n = snprintf(keys[r], key_max, "__fsdp2/barrier/%" PRIu64 "/%zu/%s", call, r, name);
        lens[r] = (uint32_t)n;
    }
    FSDP2_CHECK_GOTO(fsdp2_store_set(store, keys[store->rank], "", 0), status, cleanup);
    char what[FSDP2_STORE_KEY_MAX + 16];
    snprintf(what, sizeof(what), "barrier '%s'", name);
    int64_t left = deadline - fsdp2_now_ms();
    status = store_call(store, what, STORE_OP_WAIT, (uint32_t)(left > 0 ? left : 1),
                        (const void *const *)keys, lens, (uint32_t)world,
                        deadline + STORE_REPLY_GRACE_MS);
    if (status == FSDP2_ERR_TIMEOUT && !store->broken)
        status = barrier_missing(store, name, (const char *const *)keys, lens);
cleanup:
    free(keys);
    free(lens);
    free(text);
    return status;
}
