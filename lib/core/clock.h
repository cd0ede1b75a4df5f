/* The library's one clock: CLOCK_MONOTONIC, for deadlines and timeouts. */
#ifndef FSDP2_CORE_CLOCK_H
#define FSDP2_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t fsdp2_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t fsdp2_now_ms(void)
{
    return fsdp2_now_ns() / 1000000;
}

#endif
