/* Kernel bandwidth on one stream against memcpy of the same bytes, in the same run.
 *
 * For each kernel and size: the best of several repetitions, as GB/s of bytes read plus
 * written, and the ratio to a plain memcpy moving the same number of bytes (the
 * machine's limit for one thread). Prints a table and writes JSON.
 *
 * Usage: bench_kernels [--device cpu|cuda:N] [--json FILE] [--max-mib N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp2/fsdp2.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        fsdp2_status_t s_ = (call);                                                    \
        if (s_ != FSDP2_SUCCESS) {                                                     \
            fprintf(stderr, "%s: %s: %s\n", #call, fsdp2_strerror(s_), fsdp2_last_error()); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

typedef enum { K_CAST_F32_BF16, K_CAST_BF16_F32, K_ACC_F32_BF16, K_CHUNK_F32_BF16, K_COUNT } kernel_t;

static const char *const kernel_names[K_COUNT] = {"cast f32->bf16", "cast bf16->f32",
                                                  "accumulate f32+=bf16", "chunk_copy f32->bf16"};
/* bytes moved per element: read + write */
static const double kernel_bytes[K_COUNT] = {6, 6, 10, 6};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void enqueue(kernel_t k, void *f32, void *bf16, size_t n, fsdp2_stream_t *s)
{
    switch (k) {
    case K_CAST_F32_BF16: CHECK(fsdp2_cast_async(bf16, FSDP2_BF16, f32, FSDP2_F32, n, s)); break;
    case K_CAST_BF16_F32: CHECK(fsdp2_cast_async(f32, FSDP2_F32, bf16, FSDP2_BF16, n, s)); break;
    case K_ACC_F32_BF16:
        CHECK(fsdp2_accumulate_async(f32, FSDP2_F32, bf16, FSDP2_BF16, n, 0.5, s));
        break;
    case K_CHUNK_F32_BF16: {
        /* 64 rows placed into a buffer with padded rows, as FSDP's copy-in does */
        size_t rows = 64, cols = n / rows;
        fsdp2_chunk_copy_t c = {bf16, FSDP2_BF16, cols, f32, FSDP2_F32, cols, rows, cols};
        CHECK(fsdp2_chunk_copy_async(&c, s));
        break;
    }
    default: break;
    }
}

/* Best seconds of reps runs of fn. */
static double best_time(int reps, void (*fn)(void *), void *arg, fsdp2_stream_t *s)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        fn(arg);
        CHECK(fsdp2_stream_synchronize(s));
        double t = now() - t0;
        if (t < best)
            best = t;
    }
    return best;
}

typedef struct run {
    kernel_t k;
    void *f32, *bf16, *a, *b;
    size_t n, bytes;
    fsdp2_stream_t *s;
} run_t;

static void run_kernel(void *p)
{
    run_t *r = p;
    enqueue(r->k, r->f32, r->bf16, r->n, r->s);
}

static void run_memcpy(void *p)
{
    run_t *r = p;
    CHECK(fsdp2_memcpy_async(r->a, r->b, r->bytes / 2, r->s));
}

int main(int argc, char **argv)
{
    const char *device_name = "cpu", *json_path = "bench_kernels.json";
    int max_mib = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--device") == 0)
            device_name = argv[i + 1];
        else if (strcmp(argv[i], "--json") == 0)
            json_path = argv[i + 1];
        else if (strcmp(argv[i], "--max-mib") == 0)
            max_mib = atoi(argv[i + 1]);
    }
    fsdp2_device_t dev;
    CHECK(fsdp2_device_parse(device_name, &dev));
    if (fsdp2_device_check(dev) != FSDP2_SUCCESS) {
        printf("skip: %s\n", fsdp2_last_error());
        return 77; /* the automake/meson "skipped" code */
    }
    size_t max_n = (size_t)max_mib * 1048576 / 4;
    void *f32, *bf16, *a, *b;
    CHECK(fsdp2_device_alloc(dev, max_n * 4, &f32));
    CHECK(fsdp2_device_alloc(dev, max_n * 2, &bf16));
    CHECK(fsdp2_device_alloc(dev, max_n * 6, &a));
    CHECK(fsdp2_device_alloc(dev, max_n * 6, &b));
    fsdp2_stream_t *s;
    CHECK(fsdp2_stream_create(dev, "bench", &s));
    CHECK(fsdp2_fill_async(f32, FSDP2_F32, max_n, 1.25, s));
    CHECK(fsdp2_fill_async(bf16, FSDP2_BF16, max_n, 0.5, s));
    CHECK(fsdp2_fill_async(a, FSDP2_U8, max_n * 6, 1, s));
    CHECK(fsdp2_fill_async(b, FSDP2_U8, max_n * 6, 2, s));

    FILE *json = fopen(json_path, "w");
    if (!json) {
        perror(json_path);
        return 1;
    }
    fprintf(json, "{\"device\": \"%s\", \"results\": [", device_name);
    printf("%-22s %10s %12s %12s %8s\n", "kernel", "elements", "GB/s", "memcpy GB/s", "ratio");
    int first = 1;
    for (kernel_t k = 0; k < K_COUNT; k++) {
        for (size_t n = 1 << 16; n <= max_n; n *= 8) {
            size_t bytes = (size_t)(kernel_bytes[k] * (double)n);
            run_t r = {k, f32, bf16, a, b, n, bytes, s};
            int reps = n < (1 << 22) ? 30 : 5;
            double tk = best_time(reps, run_kernel, &r, s);
            double tm = best_time(reps, run_memcpy, &r, s); /* copies bytes/2: reads + writes = bytes */
            double gk = bytes / tk / 1e9, gm = bytes / tm / 1e9;
            printf("%-22s %10zu %12.2f %12.2f %8.2f\n", kernel_names[k], n, gk, gm, gk / gm);
            fprintf(json, "%s\n  {\"kernel\": \"%s\", \"elements\": %zu, \"gbps\": %.3f, "
                          "\"memcpy_gbps\": %.3f, \"ratio\": %.3f}",
                    first ? "" : ",", kernel_names[k], n, gk, gm, gk / gm);
            first = 0;
        }
    }
    fprintf(json, "\n]}\n");
    fclose(json);
    printf("wrote %s\n", json_path);
    CHECK(fsdp2_stream_destroy(s));
    CHECK(fsdp2_device_free(dev, f32));
    CHECK(fsdp2_device_free(dev, bf16));
    CHECK(fsdp2_device_free(dev, a));
    CHECK(fsdp2_device_free(dev, b));
    return 0;
}
