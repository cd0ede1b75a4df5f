/* Helpers shared by the store tests (test_store.c, test_store_server.c). */
#ifndef FSDP2_TESTS_STORE_TEST_UTIL_H
#define FSDP2_TESTS_STORE_TEST_UTIL_H

#include <check.h>
#include <time.h>

#include <fsdp2/fsdp2.h>

#define OK(call) ck_assert_msg((call) == FSDP2_SUCCESS, "%s failed: %s", #call, fsdp2_last_error())

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A store handle in this process (asserting success). */
static inline fsdp2_store_t *open_store(const char *host, int port, int is_server, int world,
                                        int rank, long timeout_ms)
{
    fsdp2_store_options_t o = FSDP2_STORE_OPTIONS_INIT;
    o.host = host;
    o.port = port;
    o.is_server = is_server;
    o.world_size = world;
    o.rank = rank;
    o.timeout_ms = timeout_ms;
    fsdp2_store_t *st = NULL;
    OK(fsdp2_store_create(&o, &st));
    return st;
}

#endif
