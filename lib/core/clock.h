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

/* The time ns (>= 0) from now on `clock`, the clock the condition variable waited on
 * counts (pthread_cond_timedwait's deadline). */
static inline struct timespec fsdp2_time_after(clockid_t clock, int64_t ns)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    ts.tv_sec += (time_t)(ns / 1000000000);
    ts.tv_nsec += (long)(ns % 1000000000);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

#endif
