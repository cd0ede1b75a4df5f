/* What one core can move on this machine: the rates a shared-memory collective's bytes
 * pay (docs/performance-collectives.md, "What the memcpy limit allows").
 *
 * - memory read: summing a 256 MiB buffer;
 * - memory write: non-temporal stores over 256 MiB (plain memset without SSE2);
 * - memcpy: 256 MiB, bytes copied per second (the limit bench/collectives compares with);
 * - cross-core read: a thread on another CPU (of another core when there is one) copies
 *   a cached 256 KiB source into the next slot of a ring of four, and this one sums each
 *   slot once it is posted (as a rank reads its peer's slots);
 * - cross-core and memory read: the same, and with each slot 256 KiB more of a 256 MiB
 *   buffer (as a reduction reads its own input beside its peer's slot); bytes read of
 *   both kinds per second.
 * - memory read on two CPUs at once: each sums its own 256 MiB buffer, started
 *   together; bytes read by both per second until the later one is done (what a
 *   reduce-scatter's ranks, which read all their input at once, can have between them).
 * Each rate is measured --repeat times (default 7), alternating; the table gives the
 * median, min and max.
 *
 * Run: build/bench/bench_memory_rates [--repeat N] [--json FILE] */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memcpy_limit.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* While a thread waits for the other. */
static inline void relax(void)
{
#if defined(__SSE2__)
    _mm_pause();
#endif
}

/* Keeps the compiler from dropping stores to p that nothing reads. */
static inline void keep(const void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

#define BIG ((size_t)256 << 20)
#define SLOT ((size_t)256 << 10)
#define SLOTS 4
#define RING_STEPS 4096 /* 1 GiB through the ring */

enum { READ, WRITE, COPY, CROSS, CROSS_AND_READ, READ_TWO, RATES };
static const char *const names[RATES] = {
    "memory read (sum)", "memory write (non-temporal)", "memcpy (bytes copied)",
    "cross-core read (ring)", "cross-core and memory read", "memory read, two CPUs (sum)",
};
static const char *const keys[RATES] = {"memory_read", "memory_write_nt", "memcpy",
                                        "cross_core_read", "cross_core_and_memory_read",
                                        "memory_read_two_cpus"};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void stream_fill(char *p, size_t bytes)
{
#if defined(__SSE2__)
    __m128i v = _mm_set1_epi8(3);
    for (size_t i = 0; i < bytes; i += 64) {
        _mm_stream_si128((__m128i *)(p + i), v);
        _mm_stream_si128((__m128i *)(p + i + 16), v);
        _mm_stream_si128((__m128i *)(p + i + 32), v);
        _mm_stream_si128((__m128i *)(p + i + 48), v);
    }
    _mm_sfence();
#else
    memset(p, 3, bytes);
#endif
}

/* The other CPU's helper thread takes commands (go counts them): a ring pass from step
 * `base`, in which it posts steps (head) and the reader says which it is done with, or a
 * sum of `buf` (TASK_READ), after which it posts the command's number in `finished`. */
enum { TASK_RING, TASK_READ };
typedef struct ring {
    _Alignas(64) atomic_size_t head;
    _Alignas(64) atomic_size_t done;
    _Alignas(64) atomic_int go; /* the command posted (1, 2, ...); -1: stop */
    atomic_int finished;        /* the last TASK_READ done */
    int task;
    size_t base;
    const char *buf;
    double end; /* when the TASK_READ sum ended */
    uint64_t sink;
    int helper_cpu;
    char *slots; /* SLOTS * SLOT */
} ring_t;

static void pin(int cpu)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
}

static void *helper(void *arg)
{
    ring_t *r = arg;
    pin(r->helper_cpu);
    static char src[SLOT] __attribute__((aligned(64)));
    memset(src, 5, SLOT);
    for (int cmd = 1;; cmd++) {
        /* parked, not spinning, while the single-core rates are measured */
        while (atomic_load(&r->go) < cmd && atomic_load(&r->go) >= 0)
            sched_yield();
        if (atomic_load(&r->go) < 0)
            break;
        /* read once: the main thread sets the next command's once it sees our last head */
        int task = r->task;
        size_t base = r->base;
        const char *buf = r->buf;
        if (task == TASK_READ) {
            r->sink += bench_read_sum(buf, BIG);
            r->end = now();
            atomic_store(&r->finished, cmd);
            continue;
        }
        for (size_t t = base; t < base + RING_STEPS; t++) {
            while (t >= SLOTS && atomic_load_explicit(&r->done, memory_order_acquire) + SLOTS <= t)
                relax();
            memcpy(r->slots + (t % SLOTS) * SLOT, src, SLOT);
            atomic_store_explicit(&r->head, t + 1, memory_order_release);
        }
    }
    return NULL;
}

/* One pass of RING_STEPS slots (command cmd, the pass-th), reading `also` bytes of big
 * beside each: GB/s read. */
static double ring_pass(ring_t *r, int cmd, int pass, const char *big, size_t also,
                        uint64_t *sink)
{
    size_t base = (size_t)pass * RING_STEPS, at = 0;
    r->task = TASK_RING;
    r->base = base;
    double t0 = now();
    atomic_store(&r->go, cmd);
    for (size_t t = base; t < base + RING_STEPS; t++) {
        while (atomic_load_explicit(&r->head, memory_order_acquire) <= t)
            relax();
        *sink += bench_read_sum(r->slots + (t % SLOTS) * SLOT, SLOT);
        if (also) {
            *sink += bench_read_sum(big + at, also);
            at = (at + also) % BIG;
        }
        atomic_store_explicit(&r->done, t + 1, memory_order_release);
    }
    return (double)RING_STEPS * (double)(SLOT + also) / (now() - t0) / 1e9;
}

/* Both CPUs sum 256 MiB each, started together (command cmd): GB/s read by both. */
static double read_two(ring_t *r, int cmd, const char *mine, const char *theirs, uint64_t *sink)
{
    r->task = TASK_READ;
    r->buf = theirs;
    double t0 = now();
    atomic_store(&r->go, cmd);
    *sink += bench_read_sum(mine, BIG);
    double end = now();
    while (atomic_load(&r->finished) < cmd)
        relax();
    if (r->end > end)
        end = r->end;
    return 2.0 * (double)BIG / (end - t0) / 1e9;
}

/* Whether cpu b is a hardware thread of the same core as cpu a (Linux sysfs; no: when
 * it cannot tell). */
static int siblings(int a, int b)
{
    char path[96], list[256];
    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", a);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int found = 0;
    if (fgets(list, sizeof(list), f)) {
        char *p = list;
        while (*p && !found) { /* "0-1,8-9" or "0,8" */
            char *end;
            long lo = strtol(p, &end, 10), hi = lo;
            if (end == p)
                break;
            if (*end == '-')
                hi = strtol(end + 1, &end, 10);
            found = b >= lo && b <= hi;
            p = *end == ',' ? end + 1 : end;
        }
    }
    fclose(f);
    return found;
}

/* The first allowed CPU, and another on a different core when there is one (else the
 * next allowed CPU). */
static void pick_cpus(const cpu_set_t *allowed, int *cpus, int *ncpu)
{
    int other = -1;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, allowed))
            continue;
        if (*ncpu == 0) {
            cpus[(*ncpu)++] = c;
        } else if (!siblings(cpus[0], c)) {
            cpus[(*ncpu)++] = c;
            return;
        } else if (other < 0) {
            other = c;
        }
    }
    if (other >= 0)
        cpus[(*ncpu)++] = other;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int repeat = 7;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--repeat N] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    if (repeat < 1 || repeat > 1000) {
        fprintf(stderr, "--repeat %d: 1 to 1000\n", repeat);
        return 2;
    }
    cpu_set_t allowed;
    int cpus[2] = {-1, -1}, ncpu = 0;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        perror("sched_getaffinity");
    pick_cpus(&allowed, cpus, &ncpu);
    char *x = aligned_alloc(4096, BIG), *y = aligned_alloc(4096, BIG);
    ring_t ring = {.slots = aligned_alloc(4096, SLOTS * SLOT)};
    double *got = calloc((size_t)RATES * (size_t)repeat, sizeof(double));
    if (!x || !y || !ring.slots || !got) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(x, 1, BIG);
    memset(y, 2, BIG);
    memset(ring.slots, 0, SLOTS * SLOT);
    pthread_t th;
    int rates = ncpu == 2 ? RATES : CROSS; /* the ring needs a second CPU */
    if (ncpu == 2) {
        pin(cpus[0]);
        ring.helper_cpu = cpus[1];
        if (pthread_create(&th, NULL, helper, &ring) != 0) {
            fprintf(stderr, "pthread_create failed: no cross-core rates\n");
            ncpu = 1;
        }
    }
    uint64_t sink = 0;
    int cmd = 0, pass = 0;
    for (int i = 0; i < repeat; i++) {
        double t0 = now();
        sink += bench_read_sum(x, BIG);
        got[READ * repeat + i] = (double)BIG / (now() - t0) / 1e9;
        t0 = now();
        stream_fill(y, BIG);
        keep(y);
        got[WRITE * repeat + i] = (double)BIG / (now() - t0) / 1e9;
        t0 = now();
        memcpy(y, x, BIG);
        keep(y);
        got[COPY * repeat + i] = (double)BIG / (now() - t0) / 1e9;
        if (rates == RATES) {
            got[CROSS * repeat + i] = ring_pass(&ring, ++cmd, pass++, x, 0, &sink);
            got[CROSS_AND_READ * repeat + i] = ring_pass(&ring, ++cmd, pass++, x, SLOT, &sink);
            got[READ_TWO * repeat + i] = read_two(&ring, ++cmd, x, y, &sink);
        }
    }
    if (ncpu == 2) {
        atomic_store(&ring.go, -1);
        pthread_join(th, NULL);
        sink += ring.sink;
    }
    printf("# one core's memory rates, GB/s: 256 MiB buffers, 1 GiB through a ring of %d x "
           "256 KiB slots written on CPU %d, read on CPU %d; %d runs (checksum %llu)\n",
           SLOTS, ncpu == 2 ? cpus[1] : -1, cpus[0], repeat, (unsigned long long)(sink & 0xff));
    if (rates < RATES)
        printf("# one CPU only: no cross-core rates\n");
    printf("%-30s %8s %8s %8s\n", "rate", "median", "min", "max");
    FILE *out = json ? fopen(json, "w") : NULL;
    if (json && !out) {
        perror(json);
        return 1;
    }
    if (out)
        fprintf(out, "{\"repeat\": %d, \"rates_gbps\": {", repeat);
    for (int k = 0; k < rates; k++) {
        double *v = got + (size_t)k * (size_t)repeat;
        qsort(v, (size_t)repeat, sizeof(double), cmp);
        double med = repeat % 2 ? v[repeat / 2] : (v[repeat / 2 - 1] + v[repeat / 2]) / 2;
        printf("%-30s %8.2f %8.2f %8.2f\n", names[k], med, v[0], v[repeat - 1]);
        if (out)
            fprintf(out, "%s\"%s\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f}",
                    k ? ", " : "", keys[k], med, v[0], v[repeat - 1]);
    }
    if (out) {
        fprintf(out, "}}\n");
        fclose(out);
    }
    free(x);
    free(y);
    free(ring.slots);
    free(got);
    return 0;
}
