/* The rendezvous store's server against connections of every kind, in one process:
 * malformed or oversized bytes from a raw socket (closing only that connection), refused
 * HELLOs, clients that start before the server or find none, IPv4, IPv6 and host
 * names, the port and descriptors being released after destroy or a failed create, the
 * warning of a store open beyond loopback without a secret, and how long a stop waits
 * for ranks that connected and for ranks that never did. */
#include <check.h>

#include "check_main.h"
#include "store_test_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <fsdp2/fsdp2.h>

#include "core/env_internal.h"
#include "mesh/store_protocol.h"
#include "mesh/store_server.h"

static int store_port(const fsdp2_store_t *st)
{
    int port = 0;
    OK(fsdp2_store_port(st, &port));
    return port;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Binds port on every interface without SO_REUSEADDR; returns 0 when that works. */
static int bind_plain(int port)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {0};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons((uint16_t)port);
    a.sin6_addr = in6addr_any;
    int rc = fd >= 0 ? bind(fd, (struct sockaddr *)&a, sizeof(a)) : -1;
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Nothing of a stopped server is left: no descriptor, and a new server can take its
 * very port. */
static void expect_port_released(int port, int fds_before)
{
    ck_assert_int_eq(count_fds(), fds_before);
    ck_assert_msg(bind_plain(port) == 0, "port %d still bound: %s", port, strerror(errno));
    fsdp2_store_t *server = open_store("127.0.0.1", port, 1, 1, 0, 10000);
    ck_assert_int_eq(store_port(server), port);
    OK(fsdp2_store_destroy(server));
}

START_TEST(the_port_is_free_again_and_no_descriptor_is_left_after_destroy)
{
    /* A first round, so that whatever the C library keeps open after its first use
     * (resolver files) is counted before. */
    OK(fsdp2_store_destroy(open_store("127.0.0.1", 0, 1, 1, 0, 10000)));
    int fds_before = count_fds();
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 2, 0, 10000);
    int port = store_port(server);
    fsdp2_store_t *client = open_store("127.0.0.1", port, 0, 2, 1, 10000);
    int64_t v = 0;
    OK(fsdp2_store_add(client, "n", 5, &v));
    ck_assert_int_eq(v, 5);
    ck_assert_int_ne(bind_plain(port), 0);
    OK(fsdp2_store_destroy(client));
    OK(fsdp2_store_destroy(server));
    expect_port_released(port, fds_before);
}
END_TEST

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static size_t raw_hello(uint8_t *out, uint32_t rank, uint32_t world, uint32_t magic)
{
    uint8_t hello[STORE_HELLO_BYTES] = {0};
    store_put_u32(hello, magic);
    hello[5] = STORE_VERSION;
    store_put_u32(hello + 8, rank);
    store_put_u32(hello + 12, world);
    store_header_t h = {STORE_OP_HELLO, 0, 1, 0, 1};
    uint8_t *p = store_frame_begin(out, STORE_HEADER_BYTES + 4 + STORE_HELLO_BYTES, &h);
    return (size_t)(store_put_field(p, hello, sizeof(hello)) - out);
}

/* Room for any message bad_message writes: a HELLO, then at most STORE_BODY_MAX. */
#define BAD_MESSAGE_CAP (64 + 4 + (size_t)STORE_BODY_MAX)

/* A request frame with the given op and fields (lens[i] bytes of 'k' each); the frame's
 * length field can be overridden to lie. */
static size_t raw_request(uint8_t *out, uint8_t op, uint32_t nfields, const uint32_t *lens,
                          int64_t length_override)
{
    store_header_t h = {op, 0, 2, 0, nfields};
    uint32_t body = STORE_HEADER_BYTES;
    for (uint32_t i = 0; i < nfields; i++)
        body += 4 + lens[i];
    uint8_t *p = store_frame_begin(out, body, &h);
    for (uint32_t i = 0; i < nfields; i++) {
        store_put_u32(p, lens[i]);
        memset(p + 4, 'k', lens[i]);
        p += 4 + lens[i];
    }
    if (length_override >= 0)
        store_put_u32(out, (uint32_t)length_override);
    return (size_t)(p - out);
}

typedef enum bad_kind {
    BAD_HTTP,
    BAD_HUGE_LENGTH,
    BAD_LENGTH_BEFORE_HELLO,
    BAD_ZERO_LENGTH,
    BAD_MAGIC,
    BAD_FIELDS_SHORT,
    BAD_UNKNOWN_OP,
    BAD_EMPTY_KEY,
    BAD_LONG_KEY,
    BAD_OVERSIZED_AFTER_HELLO,
    BAD_NONZERO_RESERVED,
    BAD_LONG_VALUE, /* a frame within STORE_BODY_MAX, the value over FSDP2_STORE_VALUE_MAX */
    BAD_COUNT
} bad_kind_t;

static size_t bad_message(bad_kind_t kind, uint8_t *buf)
{
    size_t n = 0;
    uint32_t lens[2] = {3, 1};
    if (kind >= BAD_FIELDS_SHORT)
        n = raw_hello(buf, 2, 3, STORE_MAGIC);
    switch (kind) {
    case BAD_HTTP:
        return (size_t)sprintf((char *)buf, "GET / HTTP/1.0\r\n\r\n");
    case BAD_HUGE_LENGTH:
        store_put_u32(buf, 0xffffffffu);
        return 4;
    case BAD_LENGTH_BEFORE_HELLO:
        store_put_u32(buf, 1u << 20);
        return 4;
    case BAD_ZERO_LENGTH:
        store_put_u32(buf, 0);
        return 4;
    case BAD_MAGIC:
        return raw_hello(buf, 2, 3, 0x12345678u);
    case BAD_FIELDS_SHORT: /* the body claims 2 fields but holds bytes for less */
        return n + raw_request(buf + n, STORE_OP_SET, 2, lens, STORE_HEADER_BYTES + 6);
    case BAD_UNKNOWN_OP:
        return n + raw_request(buf + n, 99, 0, NULL, -1);
    case BAD_EMPTY_KEY:
        lens[0] = 0;
        return n + raw_request(buf + n, STORE_OP_SET, 2, lens, -1);
    case BAD_LONG_KEY:
        lens[0] = FSDP2_STORE_KEY_MAX + 1;
        return n + raw_request(buf + n, STORE_OP_GET, 1, lens, -1);
    case BAD_OVERSIZED_AFTER_HELLO:
        return n + raw_request(buf + n, STORE_OP_SET, 2, lens, (int64_t)STORE_BODY_MAX + 1);
    case BAD_NONZERO_RESERVED:
        n += raw_request(buf + n, STORE_OP_CLOSE, 0, NULL, -1);
        buf[n - STORE_HEADER_BYTES + 2] = 7;
        return n;
    case BAD_LONG_VALUE:
        /* so that value_ok refuses it, not the frame length check */
        _Static_assert(STORE_HEADER_BYTES + 4 + 3 + 4 + FSDP2_STORE_VALUE_MAX + 1 <=
                           STORE_BODY_MAX, "an oversized SET value fits a frame");
        lens[1] = FSDP2_STORE_VALUE_MAX + 1;
        return n + raw_request(buf + n, STORE_OP_SET, 2, lens, -1);
    default:
        return 0;
    }
}

START_TEST(malformed_messages_close_only_their_connection)
{
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 3, 0, 10000);
    int port = store_port(server);
    fsdp2_store_t *good = open_store("127.0.0.1", port, 0, 3, 1, 10000);
    uint8_t *buf = malloc(BAD_MESSAGE_CAP);
    ck_assert_ptr_nonnull(buf);
    size_t n = bad_message((bad_kind_t)_i, buf);
    int fd = raw_connect(port);
    ck_assert_int_eq(send(fd, buf, n, MSG_NOSIGNAL), (ssize_t)n);
    free(buf);
    /* The server closes the connection: after a HELLO reply at most, EOF or a reset. */
    struct pollfd p = {fd, POLLIN, 0};
    char reply[256];
    ssize_t got;
    do {
        ck_assert_msg(poll(&p, 1, 20000) == 1, "kind %d: the server kept the connection", _i);
        got = recv(fd, reply, sizeof(reply), 0);
    } while (got > 0);
    ck_assert_msg(got == 0 || errno == ECONNRESET, "kind %d: recv: %s", _i, strerror(errno));
    close(fd);
    /* Nothing of it was stored ("kkk" is the key of the bad SETs). */
    int swapped = 0;
    OK(fsdp2_store_compare_set(good, "kkk", NULL, 0, "x", 1, &swapped));
    ck_assert_msg(swapped, "kind %d: key 'kkk' exists", _i);
    /* The others are still served, and rank 2 may connect properly now. */
    OK(fsdp2_store_set(good, "after", "ok", 2));
    fsdp2_store_t *rank2 = open_store("127.0.0.1", port, 0, 3, 2, 10000);
    char value[4] = {0};
    size_t len = 0;
    OK(fsdp2_store_get(rank2, "after", value, sizeof(value), &len));
    ck_assert_str_eq(value, "ok");
    OK(fsdp2_store_get(server, "after", value, sizeof(value), &len));
    OK(fsdp2_store_destroy(rank2));
    OK(fsdp2_store_destroy(good));
    OK(fsdp2_store_destroy(server));
}
END_TEST

/* fsdp2_store_create for rank of world 2 on port: its status, the message kept. */
static fsdp2_status_t try_store(int port, int rank, char *message, size_t len,
                                fsdp2_store_t **out)
{
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    o.port = port;
    o.world_size = 2;
    o.rank = rank;
    o.timeout_ms = 5000;
    fsdp2_store_t *st = NULL;
    fsdp2_status_t s = fsdp2_store_create(&o, &st);
    snprintf(message, len, "%s", fsdp2_last_error());
    if (out)
        *out = st;
    else
        fsdp2_store_destroy(st);
    return s;
}

/* With a secret, ranks with the same one connect and work; a rank with another secret
 * or none is refused at once (not by a timeout), naming the variables, and holds no
 * rank: the real rank connects afterwards. */
START_TEST(a_secret_admits_its_ranks_and_refuses_others_at_once)
{
    ck_assert_int_eq(setenv("FSDP2_STORE_SECRET", "the job's secret: 7f3a9c", 1), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 2, 0, 10000);
    int port = store_port(server);
    char message[512];
    ck_assert_int_eq(setenv("FSDP2_STORE_SECRET", "another job's secret", 1), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    ck_assert_int_eq(try_store(port, 1, message, sizeof(message), NULL),
                     FSDP2_ERR_INVALID_CONFIG);
    ck_assert_msg(strstr(message, "did not prove it knows this job's secret"), "%s", message);
    ck_assert_int_eq(unsetenv("FSDP2_STORE_SECRET"), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    ck_assert_int_eq(try_store(port, 1, message, sizeof(message), NULL),
                     FSDP2_ERR_INVALID_CONFIG);
    ck_assert_msg(strstr(message, "has no secret (FSDP2_STORE_SECRET"), "%s", message);
    /* The secret from a file of mode 0600 works; 0644 is refused before connecting. */
    char path[] = "/tmp/fsdp2-secret-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "the job's secret: 7f3a9c\n", 25), 25);
    close(fd);
    ck_assert_int_eq(setenv("FSDP2_STORE_SECRET_FILE", path, 1), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    ck_assert_int_eq(chmod(path, 0644), 0);
    ck_assert_int_eq(try_store(port, 1, message, sizeof(message), NULL),
                     FSDP2_ERR_INVALID_CONFIG);
    ck_assert_msg(strstr(message, "chmod 600"), "%s", message);
    ck_assert_int_eq(chmod(path, 0600), 0);
    fsdp2_store_t *rank1 = NULL;
    ck_assert_msg(try_store(port, 1, message, sizeof(message), &rank1) == FSDP2_SUCCESS, "%s",
                  message);
    OK(fsdp2_store_set(rank1, "from-1", "yes", 3));
    char value[4] = {0};
    OK(fsdp2_store_get(server, "from-1", value, sizeof(value) - 1, NULL));
    ck_assert_str_eq(value, "yes");
    OK(fsdp2_store_destroy(rank1));
    OK(fsdp2_store_destroy(server));
    unlink(path);
    ck_assert_int_eq(unsetenv("FSDP2_STORE_SECRET_FILE"), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
}
END_TEST

/* What rank 0's store logs on stderr while it is created (world size 1) on host and
 * destroyed, at log level WARN. */
static void serve_and_capture_log(const char *host, char *log, size_t len)
{
    char path[] = "/tmp/fsdp2-store-log-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_eq(dup2(fd, 2), 2);
    OK(fsdp2_log_set_level(FSDP2_LOG_WARN));
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    o.host = host;
    o.is_server = 1;
    o.timeout_ms = 10000;
    fsdp2_store_t *st = NULL;
    fsdp2_status_t status = fsdp2_store_create(&o, &st);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_store_destroy(st);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ck_assert_msg(status == FSDP2_SUCCESS, "store on %s: %s", host, fsdp2_last_error());
    ssize_t n = pread(fd, log, len - 1, 0);
    close(fd);
    unlink(path);
    log[n > 0 ? n : 0] = '\0';
}

/* An IPv4 address of this host outside 127.0.0.0/8 on an interface that is up, or 0. */
static int non_loopback_ipv4(char *addr, size_t len)
{
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0)
        return 0;
    int found = 0;
    for (struct ifaddrs *i = all; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
            continue;
        const struct in_addr *a = &((const struct sockaddr_in *)i->ifa_addr)->sin_addr;
        found = ntohl(a->s_addr) >> 24 != 127 && inet_ntop(AF_INET, a, addr, (socklen_t)len);
    }
    freeifaddrs(all);
    return found;
}

#define NO_SECRET_WARNING "beyond loopback, and the job has no secret"

/* Rank 0 warns when its store listens beyond loopback and the job has no secret (any
 * client that reaches the port could take a rank): on every interface (a host name, or
 * FSDP2_STORE_BIND=any) or on another address of the host; not on loopback, and not
 * with FSDP2_STORE_SECRET or FSDP2_STORE_SECRET_FILE. */
START_TEST(rank_0_warns_when_it_listens_beyond_loopback_without_a_secret)
{
    char log[4096];
    ck_assert_int_eq(unsetenv("FSDP2_STORE_SECRET"), 0);
    ck_assert_int_eq(unsetenv("FSDP2_STORE_SECRET_FILE"), 0);
    const char *loopback[] = {"127.0.0.1", "127.0.0.2", "localhost", "::1"};
    for (size_t i = 0; i < sizeof(loopback) / sizeof(loopback[0]); i++) {
        serve_and_capture_log(loopback[i], log, sizeof(log));
        ck_assert_msg(!strstr(log, NO_SECRET_WARNING), "on %s: %s", loopback[i], log);
    }

    ck_assert_int_eq(setenv("FSDP2_STORE_BIND", "any", 1), 0);
    OK(fsdp2_env_reload());
    serve_and_capture_log("127.0.0.1", log, sizeof(log));
    ck_assert_msg(strstr(log, NO_SECRET_WARNING) && strstr(log, "every interface") &&
                      strstr(log, "FSDP2_STORE_SECRET") && strstr(log, " WARN mesh: "),
                  "FSDP2_STORE_BIND=any without a secret logged \"%s\"", log);
    const char *first = strstr(log, NO_SECRET_WARNING);
    ck_assert_msg(!strstr(first + 1, NO_SECRET_WARNING), "warned twice: %s", log);

    ck_assert_int_eq(setenv("FSDP2_STORE_SECRET", "a secret", 1), 0);
    OK(fsdp2_env_reload());
    serve_and_capture_log("127.0.0.1", log, sizeof(log));
    ck_assert_msg(!strstr(log, NO_SECRET_WARNING), "with FSDP2_STORE_SECRET: %s", log);
    ck_assert_int_eq(unsetenv("FSDP2_STORE_SECRET"), 0);
    char path[] = "/tmp/fsdp2-secret-XXXXXX";
    int fd = mkstemp(path); /* mode 0600 */
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "a secret\n", 9), 9);
    close(fd);
    ck_assert_int_eq(setenv("FSDP2_STORE_SECRET_FILE", path, 1), 0);
    OK(fsdp2_env_reload());
    serve_and_capture_log("127.0.0.1", log, sizeof(log));
    ck_assert_msg(!strstr(log, NO_SECRET_WARNING), "with FSDP2_STORE_SECRET_FILE: %s", log);
    ck_assert_int_eq(unsetenv("FSDP2_STORE_SECRET_FILE"), 0);
    unlink(path);
    ck_assert_int_eq(unsetenv("FSDP2_STORE_BIND"), 0);
    OK(fsdp2_env_reload());

    char addr[INET_ADDRSTRLEN];
    if (!non_loopback_ipv4(addr, sizeof(addr))) {
        printf("note: no IPv4 address outside 127.0.0.0/8; that case is skipped\n");
        return;
    }
    serve_and_capture_log(addr, log, sizeof(log));
    ck_assert_msg(strstr(log, NO_SECRET_WARNING) && strstr(log, addr), "on %s: \"%s\"", addr, log);
}
END_TEST

/* Reads one reply frame's header from fd: its status, or -1 at EOF. */
static int raw_reply_status(int fd)
{
    uint8_t len[4], body[256];
    if (recv(fd, len, 4, MSG_WAITALL) != 4)
        return -1;
    uint32_t n = store_get_u32(len);
    ck_assert_uint_le(n, sizeof(body));
    ck_assert_int_eq(recv(fd, body, n, MSG_WAITALL), (ssize_t)n);
    return body[1];
}

/* Whether the server closes fd within wait_ms. */
static int closed_within(int fd, int wait_ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    char buf[64];
    for (;;) {
        if (poll(&p, 1, wait_ms) != 1)
            return 0;
        ssize_t got = recv(fd, buf, sizeof(buf), 0);
        if (got <= 0)
            return 1;
    }
}

/* A client that says HELLO as rank 1 without the secret gets a nonce but no rank: the
 * real rank 1 still connects; a forged proof is refused; a connection that never
 * authenticates is closed after the authentication timeout (STORE_AUTH_TIMEOUT_MS,
 * shortened here to AUTH_TIMEOUT_MS). */
#define AUTH_TIMEOUT_MS 1000
START_TEST(a_connection_without_the_secret_holds_no_rank_and_is_closed)
{
    ck_assert_int_eq(setenv("FSDP2_STORE_SECRET", "s3cret-for-this-job", 1), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 2, 0, 10000);
    fsdp2_store_server_set_auth_timeout(fsdp2_store_server_of(server), AUTH_TIMEOUT_MS);
    int port = store_port(server);
    uint8_t buf[256];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int idle = raw_connect(port);
    size_t n = raw_hello(buf, 1, 2, STORE_MAGIC);
    ck_assert_int_eq(send(idle, buf, n, MSG_NOSIGNAL), (ssize_t)n);
    ck_assert_int_eq(raw_reply_status(idle), FSDP2_SUCCESS);
    int forged = raw_connect(port);
    ck_assert_int_eq(send(forged, buf, n, MSG_NOSIGNAL), (ssize_t)n);
    ck_assert_int_eq(raw_reply_status(forged), FSDP2_SUCCESS);
    uint32_t lens[1] = {STORE_PROOF_BYTES};
    n = raw_request(buf, STORE_OP_AUTH, 1, lens, -1);
    ck_assert_int_eq(send(forged, buf, n, MSG_NOSIGNAL), (ssize_t)n);
    ck_assert_int_eq(raw_reply_status(forged), FSDP2_ERR_INVALID_CONFIG);
    ck_assert(closed_within(forged, 5000));
    close(forged);
    char message[512];
    fsdp2_store_t *rank1 = NULL;
    ck_assert_msg(try_store(port, 1, message, sizeof(message), &rank1) == FSDP2_SUCCESS, "%s",
                  message);
    ck_assert_msg(closed_within(idle, AUTH_TIMEOUT_MS + 5000),
                  "an unauthenticated connection was kept");
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double kept = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ck_assert_msg(kept >= AUTH_TIMEOUT_MS / 1000.0, "closed after %.2f s, before the timeout",
                  kept);
    close(idle);
    OK(fsdp2_store_destroy(rank1));
    OK(fsdp2_store_destroy(server));
    ck_assert_int_eq(unsetenv("FSDP2_STORE_SECRET"), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
}
END_TEST

START_TEST(truncated_frame_then_disconnect_leaves_the_server_serving)
{
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 1, 0, 10000);
    int port = store_port(server);
    uint8_t buf[256];
    size_t n = raw_hello(buf, 0, 1, STORE_MAGIC);
    int fd = raw_connect(port);
    ck_assert_int_eq(send(fd, buf, n - 3, MSG_NOSIGNAL), (ssize_t)(n - 3));
    close(fd);
    OK(fsdp2_store_set(server, "k", "v", 1));
    OK(fsdp2_store_barrier(server, "alone"));
    OK(fsdp2_store_destroy(server));
}
END_TEST

START_TEST(hello_with_another_world_size_or_a_taken_rank_is_refused)
{
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 2, 0, 10000);
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    o.port = store_port(server);
    o.world_size = 3;
    o.rank = 1;
    o.timeout_ms = 5000;
    fsdp2_store_t *st = NULL;
    ck_assert_int_eq(fsdp2_store_create(&o, &st), FSDP2_ERR_INVALID_CONFIG);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "world size 3"));
    o.world_size = 2;
    o.rank = 0;
    ck_assert_int_eq(fsdp2_store_create(&o, &st), FSDP2_ERR_INVALID_CONFIG);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "rank 0 is already connected"));
    ck_assert_ptr_null(st);
    o.rank = 1;
    OK(fsdp2_store_create(&o, &st));
    OK(fsdp2_store_destroy(st));
    OK(fsdp2_store_destroy(server));
}
END_TEST

typedef struct late_client {
    int port;
    fsdp2_status_t status;
    char message[512];
    fsdp2_store_t *store;
} late_client_t;

static void *late_client_main(void *arg)
{
    late_client_t *lc = arg;
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    o.port = lc->port;
    o.world_size = 2;
    o.rank = 1;
    o.timeout_ms = 20000;
    lc->status = fsdp2_store_create(&o, &lc->store);
    snprintf(lc->message, sizeof(lc->message), "%s", fsdp2_last_error());
    return NULL;
}

/* A bound but not listening socket: connections to its port are refused. */
static int reserve_port(int *port)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in6 a = {0};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin6_port);
    return fd;
}

START_TEST(a_client_started_before_the_server_connects_once_it_listens)
{
    late_client_t lc = {0};
    int reserved = reserve_port(&lc.port);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, late_client_main, &lc), 0);
    /* The client's first attempts are refused; then the server takes the port. */
    close(reserved);
    fsdp2_store_t *server = open_store("127.0.0.1", lc.port, 1, 2, 0, 20000);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_msg(lc.status == FSDP2_SUCCESS, "late client: %s", lc.message);
    OK(fsdp2_store_set(lc.store, "late", "1", 1));
    char value[2] = {0};
    OK(fsdp2_store_get(server, "late", value, 1, NULL));
    ck_assert_str_eq(value, "1");
    OK(fsdp2_store_destroy(lc.store));
    OK(fsdp2_store_destroy(server));
}
END_TEST

START_TEST(a_client_with_no_server_times_out_naming_host_and_port)
{
    int port = 0;
    int reserved = reserve_port(&port);
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    o.port = port;
    o.world_size = 2;
    o.rank = 1;
    o.timeout_ms = 300;
    fsdp2_store_t *st = NULL;
    double t0 = now_s();
    ck_assert_int_eq(fsdp2_store_create(&o, &st), FSDP2_ERR_TIMEOUT);
    double elapsed = now_s() - t0;
    char where[64];
    snprintf(where, sizeof(where), "127.0.0.1:%d", port);
    ck_assert_msg(strstr(fsdp2_last_error(), where), "message: %s", fsdp2_last_error());
    ck_assert_msg(elapsed > 0.25 && elapsed < 3, "gave up after %.2f s", elapsed);
    close(reserved);
}
END_TEST

static int ipv6_loopback_works(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {0};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* With FSDP2_STORE_BIND=any the server listens on every interface, so clients told any
 * of the host's addresses or names reach it (by default it listens only on the address
 * the ranks were told: test_store.c). */
START_TEST(clients_reach_the_server_by_ipv4_ipv6_and_host_name)
{
    const char *hosts[] = {"localhost", "::1", "127.0.0.1"};
    int have_v6 = ipv6_loopback_works();
    ck_assert_int_eq(setenv("FSDP2_STORE_BIND", "any", 1), 0);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 4, 0, 10000);
    fsdp2_store_t *clients[3];
    for (int i = 0; i < 3; i++) {
        const char *host = !have_v6 && strchr(hosts[i], ':') ? "127.0.0.1" : hosts[i];
        clients[i] = open_store(host, store_port(server), 0, 4, i + 1, 10000);
        char key[8];
        snprintf(key, sizeof(key), "h%d", i);
        OK(fsdp2_store_set(clients[i], key, host, strlen(host)));
    }
    for (int i = 0; i < 3; i++) {
        char key[8], value[64] = {0};
        snprintf(key, sizeof(key), "h%d", (i + 1) % 3);
        OK(fsdp2_store_get(clients[i], key, value, sizeof(value) - 1, NULL));
    }
    for (int i = 0; i < 3; i++)
        OK(fsdp2_store_destroy(clients[i]));
    OK(fsdp2_store_destroy(server));
}
END_TEST

START_TEST(an_unresolvable_host_is_an_error_naming_it)
{
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    o.host = "no-such-host.invalid";
    o.port = 1;
    o.world_size = 2;
    o.rank = 1;
    o.timeout_ms = 500;
    fsdp2_store_t *st = NULL;
    fsdp2_status_t s = fsdp2_store_create(&o, &st);
    /* Without a resolver answer (EAI_AGAIN) the client retries until its timeout. */
    ck_assert_msg(s == FSDP2_ERR_INVALID_CONFIG || s == FSDP2_ERR_TIMEOUT, "%s",
                  fsdp2_status_name(s));
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "no-such-host.invalid"));
}
END_TEST

/* Where a server rank's create fails after its server started: a host that does not
 * resolve, and one nobody answers at (TEST-NET-1), so that connecting times out. */
static const char *const unreachable_hosts[] = {"no-such-host.invalid", "192.0.2.1"};
#define FAILED_CREATE_TIMEOUT_MS 500

static fsdp2_status_t create_server_at(const char *host, int port, fsdp2_store_t **st)
{
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    o.host = host;
    o.port = port;
    o.is_server = 1;
    o.world_size = 2;
    o.timeout_ms = FAILED_CREATE_TIMEOUT_MS;
    *st = NULL;
    return fsdp2_store_create(&o, st);
}

START_TEST(a_failed_create_on_the_server_rank_frees_its_port_and_descriptors)
{
    const char *host = unreachable_hosts[_i];
    fsdp2_store_t *st = NULL;
    /* A first failure, so that what the resolver keeps open is counted before. */
    ck_assert_int_ne(create_server_at(host, 0, &st), FSDP2_SUCCESS);
    int fds_before = count_fds();
    int port = 0;
    close(reserve_port(&port));
    double t0 = now_s();
    fsdp2_status_t s = create_server_at(host, port, &st);
    double elapsed = now_s() - t0;
    ck_assert_msg(s != FSDP2_SUCCESS, "create with host %s succeeded", host);
    ck_assert_ptr_null(st);
    /* The server is stopped at once, not after a second timeout. */
    ck_assert_msg(elapsed < FAILED_CREATE_TIMEOUT_MS / 1000.0 + 1.0,
                  "host %s: create failed after %.2f s: %s", host, elapsed, fsdp2_last_error());
    expect_port_released(port, fds_before);
}
END_TEST

/* Destroys the server rank's handle; returns how long that took. */
static double destroy_timed(fsdp2_store_t *server)
{
    double t0 = now_s();
    OK(fsdp2_store_destroy(server));
    return now_s() - t0;
}

START_TEST(a_stopping_server_does_not_wait_out_its_timeout_for_ranks_that_never_connected)
{
    /* Rank 1 came and closed; rank 2 never came, as when it crashed before starting. */
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 3, 0, 6000);
    fsdp2_store_t *rank1 = open_store("127.0.0.1", store_port(server), 0, 3, 1, 6000);
    OK(fsdp2_store_set(rank1, "k", "v", 1));
    OK(fsdp2_store_destroy(rank1));
    double elapsed = destroy_timed(server);
    /* the 1 s grace, with room for a loaded machine, and far from the 6 s timeout */
    ck_assert_msg(elapsed < 3.5, "destroy took %.2f s with a 6 s timeout", elapsed);
}
END_TEST

START_TEST(a_stopping_server_waits_up_to_its_timeout_for_a_connected_rank_that_has_not_closed)
{
    /* Rank 1 is connected and idle (it could be reading its last reply); rank 2 never
     * came. The absent rank's grace does not cut the wait for rank 1 short. */
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 3, 0, 2000);
    fsdp2_store_t *rank1 = open_store("127.0.0.1", store_port(server), 0, 3, 1, 2000);
    double elapsed = destroy_timed(server);
    ck_assert_msg(elapsed > 1.9 && elapsed < 4, "destroy took %.2f s with a 2 s timeout",
                  elapsed);
    /* The server is gone: rank 1's CLOSE finds the connection closed. */
    ck_assert_int_eq(fsdp2_store_destroy(rank1), FSDP2_ERR_PEER_FAILED);
}
END_TEST

typedef struct timed_destroy {
    fsdp2_store_t *store;
    double done_s;
} timed_destroy_t;

static void *timed_destroy_main(void *arg)
{
    timed_destroy_t *td = arg;
    OK(fsdp2_store_destroy(td->store));
    td->done_s = now_s();
    return NULL;
}

START_TEST(a_rank_connecting_as_rank_0_stops_still_reads_what_rank_0_published)
{
    /* Normal shutdown with rank 0 first: it publishes a value and leaves before rank 1
     * has connected. Rank 1 connects within the grace, and is then served and waited
     * for like any connected rank. */
    fsdp2_store_t *server = open_store("127.0.0.1", 0, 1, 2, 0, 10000);
    int port = store_port(server);
    OK(fsdp2_store_set(server, "published", "42", 2));
    timed_destroy_t td = {server, 0};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, timed_destroy_main, &td), 0);
    fsdp2_store_t *rank1 = open_store("127.0.0.1", port, 0, 2, 1, 10000);
    char value[3] = {0};
    OK(fsdp2_store_get(rank1, "published", value, 2, NULL));
    ck_assert_str_eq(value, "42");
    OK(fsdp2_store_set(rank1, "read", "", 0));
    double closing_s = now_s();
    OK(fsdp2_store_destroy(rank1));
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_msg(td.done_s >= closing_s, "the server stopped %.3f s before rank 1 closed",
                  closing_s - td.done_s);
}
END_TEST

static Suite *store_server_suite(void)
{
    Suite *s = suite_create("store_server");
    TCase *tc = tcase_create("connections");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, the_port_is_free_again_and_no_descriptor_is_left_after_destroy);
    tcase_add_loop_test(tc, malformed_messages_close_only_their_connection, 0, BAD_COUNT);
    tcase_add_test(tc, truncated_frame_then_disconnect_leaves_the_server_serving);
    tcase_add_test(tc, hello_with_another_world_size_or_a_taken_rank_is_refused);
    tcase_add_test(tc, a_client_started_before_the_server_connects_once_it_listens);
    tcase_add_test(tc, a_client_with_no_server_times_out_naming_host_and_port);
    tcase_add_test(tc, clients_reach_the_server_by_ipv4_ipv6_and_host_name);
    tcase_add_test(tc, a_secret_admits_its_ranks_and_refuses_others_at_once);
    tcase_add_test(tc, a_connection_without_the_secret_holds_no_rank_and_is_closed);
    tcase_add_test(tc, rank_0_warns_when_it_listens_beyond_loopback_without_a_secret);
    tcase_add_test(tc, an_unresolvable_host_is_an_error_naming_it);
    tcase_add_loop_test(tc, a_failed_create_on_the_server_rank_frees_its_port_and_descriptors, 0,
                        2);
    suite_add_tcase(s, tc);

    TCase *stop = tcase_create("stopping");
    tcase_set_timeout(stop, 60);
    tcase_add_test(stop,
                   a_stopping_server_does_not_wait_out_its_timeout_for_ranks_that_never_connected);
    tcase_add_test(
        stop, a_stopping_server_waits_up_to_its_timeout_for_a_connected_rank_that_has_not_closed);
    tcase_add_test(stop, a_rank_connecting_as_rank_0_stops_still_reads_what_rank_0_published);
    suite_add_tcase(s, stop);
    return s;
}

FSDP2_CHECK_MAIN(store_server_suite)
