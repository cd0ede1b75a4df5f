/* The limit bench/collectives.c and bench/interleaved.c compare bandwidth with: the best
 * of five memcpy calls of 256 MiB on one thread, in GB/s (bytes copied per second); 0
 * when the buffers cannot be had. */
#ifndef FSDP2_BENCH_MEMCPY_LIMIT_H
#define FSDP2_BENCH_MEMCPY_LIMIT_H

#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double bench_memcpy_gbps(void)
{
    size_t bytes = (size_t)256 << 20;
    char *x = malloc(bytes), *y = malloc(bytes);
    double best = 0;
    if (x && y) {
        memset(x, 1, bytes);
        memset(y, 2, bytes);
        for (int i = 0; i < 5; i++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            memcpy(y, x, bytes);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            double g = (double)bytes / s / 1e9;
            best = g > best ? g : best;
        }
    }
    free(x);
    free(y);
    return best;
}

/* A sum of bytes / 8 words at p (bytes a multiple of 32): one pass of reads, with
 * nothing written, which the compiler cannot drop since the sum is returned. */
static inline unsigned long long bench_read_sum(const void *p, size_t bytes)
{
    const unsigned long long *w = p;
    unsigned long long a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= bytes / 8; i += 4) {
        a += w[i];
        b += w[i + 1];
        c += w[i + 2];
        d += w[i + 3];
    }
    return a + b + c + d;
}

#endif
