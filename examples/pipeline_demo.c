/* The FSDP prefetch pattern on libfsdp2's runtime, before collectives exist.
 *
 * A stack of layers keeps f32 "master" weights; forward computes each layer with a
 * bf16 copy made on a copy-in side stream into a ring of two buffers, so the copy of
 * layer l+1 overlaps the compute of layer l, exactly as FSDP2 overlaps the all-gather
 * copy-in with compute. Events order the ring: a slot is overwritten only after the
 * compute that read it has finished (recorded on the current stream), and compute
 * waits for its slot's copy. The output is compared bit for bit with a serial run, and
 * the ring's memory is planned before the first step and checked against the
 * allocator's measured peak.
 *
 * Usage: pipeline_demo [--layers N] [--dim D] [--batch B] [--steps S] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp2/fsdp2.h>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        fsdp2_status_t s_ = (call);                                                       \
        if (s_ != FSDP2_SUCCESS) {                                                        \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, fsdp2_strerror(s_),    \
                    fsdp2_last_error());                                                  \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define RING 2

typedef struct demo {
    int layers, dim, batch, steps;
    fsdp2_device_t cpu;
    fsdp2_tensor_t **weight; /* [layers] f32 [dim, dim], the master copy */
    fsdp2_tensor_t *ring[RING];
    fsdp2_stream_t *copy_in, *current;
    fsdp2_event_t *copied[RING], *consumed[RING];
    float *row;          /* one weight row in f32, the compute's scratch */
    double wait_seconds; /* compute blocked on copy-in: the exposed part */
} demo_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_int(const char *flag, const char *text, int lo, int hi)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "error: %s %s is not an integer in %d..%d\n", flag, text, lo, hi);
        exit(2);
    }
    return (int)v;
}

/* out[b, :] = relu(w_bf16 @ in[b, :]), accumulating in f32. */
static void layer_forward(const unsigned short *w, const float *in, float *out, float *row,
                          int dim, int batch)
{
    for (int i = 0; i < dim; i++) {
        fsdp2_convert(row, FSDP2_F32, w + (size_t)i * dim, FSDP2_BF16, (size_t)dim);
        for (int b = 0; b < batch; b++) {
            const float *x = in + (size_t)b * dim;
            float acc = 0;
            for (int k = 0; k < dim; k++)
                acc += row[k] * x[k];
            out[(size_t)b * dim + i] = acc > 0 ? acc : 0;
        }
    }
}

static void copy_in(demo_t *d, int layer, int slot)
{
    /* Overwrite the slot only after its previous reader finished. */
    CHECK(fsdp2_stream_wait_event(d->copy_in, d->consumed[slot]));
    CHECK(fsdp2_cast_async(d->ring[slot]->data, FSDP2_BF16, d->weight[layer]->data, FSDP2_F32,
                           (size_t)d->weight[layer]->numel, d->copy_in));
    CHECK(fsdp2_event_record(d->copied[slot], d->copy_in));
}

/* Forward through all layers with prefetch; activations ping-pong between a and b. */
static float *forward_pipelined(demo_t *d, float *a, float *b)
{
    copy_in(d, 0, 0);
    for (int l = 0; l < d->layers; l++) {
        int slot = l % RING;
        if (l + 1 < d->layers)
            copy_in(d, l + 1, (l + 1) % RING); /* prefetch the next layer */
        double t0 = now();
        CHECK(fsdp2_stream_wait_event(d->current, d->copied[slot]));
        d->wait_seconds += now() - t0;
        layer_forward(d->ring[slot]->data, a, b, d->row, d->dim, d->batch);
        CHECK(fsdp2_event_record(d->consumed[slot], d->current));
        float *t = a;
        a = b;
        b = t;
    }
    return a;
}

/* The same computation with no side stream: cast, then compute, layer by layer. */
static float *forward_serial(demo_t *d, float *a, float *b)
{
    for (int l = 0; l < d->layers; l++) {
        CHECK(fsdp2_cast_async(d->ring[0]->data, FSDP2_BF16, d->weight[l]->data, FSDP2_F32,
                               (size_t)d->weight[l]->numel, d->current));
        layer_forward(d->ring[0]->data, a, b, d->row, d->dim, d->batch);
        float *t = a;
        a = b;
        b = t;
    }
    return a;
}

int main(int argc, char **argv)
{
    demo_t d = {.layers = 8, .dim = 512, .batch = 16, .steps = 3};
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--layers") == 0)
            d.layers = parse_int(argv[i], argv[i + 1], 1, 4096), i++;
        else if (i + 1 < argc && strcmp(argv[i], "--dim") == 0)
            d.dim = parse_int(argv[i], argv[i + 1], 1, 16384), i++;
        else if (i + 1 < argc && strcmp(argv[i], "--batch") == 0)
            d.batch = parse_int(argv[i], argv[i + 1], 1, 4096), i++;
        else if (i + 1 < argc && strcmp(argv[i], "--steps") == 0)
            d.steps = parse_int(argv[i], argv[i + 1], 1, 1000), i++;
        else {
            fprintf(stderr, "usage: %s [--layers N] [--dim D] [--batch B] [--steps S]\n", argv[0]);
            return 2;
        }
    }
    CHECK(fsdp2_env_init());
    CHECK(fsdp2_device_parse("cpu", &d.cpu));
    const int64_t wshape[2] = {d.dim, d.dim}, ashape[2] = {d.batch, d.dim};

    /* Plan, then allocate once: weights, the bf16 ring, two activation buffers. */
    size_t weight_bytes = (size_t)d.layers * d.dim * d.dim * 4;
    size_t ring_bytes = (size_t)RING * d.dim * d.dim * 2;
    size_t act_bytes = (size_t)4 * d.batch * d.dim * 4;
    printf("libfsdp2 %s pipeline demo: %d layers of %dx%d, batch %d, %d steps\n",
           FSDP2_VERSION_STRING, d.layers, d.dim, d.dim, d.batch, d.steps);
    printf("memory plan: f32 weights %.2f MiB + bf16 ring %d x %.2f MiB + activations %.2f MiB"
           " = %.2f MiB\n",
           weight_bytes / 1048576.0, RING, ring_bytes / RING / 1048576.0, act_bytes / 1048576.0,
           (weight_bytes + ring_bytes + act_bytes) / 1048576.0);

    fsdp2_memory_stats_t before, after;
    CHECK(fsdp2_memory_stats_get(d.cpu, &before));
    d.weight = calloc((size_t)d.layers, sizeof(*d.weight));
    for (int l = 0; l < d.layers; l++) {
        CHECK(fsdp2_tensor_empty(d.cpu, FSDP2_F32, 2, wshape, &d.weight[l]));
        float *w = d.weight[l]->data;
        unsigned long long seed = 0x2545f4914f6cdd1dull * (unsigned long long)(l + 1);
        for (int64_t i = 0; i < d.weight[l]->numel; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = ((float)(seed >> 40) / (float)(1 << 24) - 0.5f) * 2.0f * 3.4f / sqrtf((float)d.dim);
        }
    }
    fsdp2_tensor_t *act[4];
    for (int r = 0; r < RING; r++)
        CHECK(fsdp2_tensor_empty(d.cpu, FSDP2_BF16, 2, wshape, &d.ring[r]));
    for (int k = 0; k < 4; k++)
        CHECK(fsdp2_tensor_zeros(d.cpu, FSDP2_F32, 2, ashape, &act[k]));
    d.row = malloc(sizeof(float) * (size_t)d.dim);
    CHECK(fsdp2_stream_create(d.cpu, "ag-copy-in", &d.copy_in));
    CHECK(fsdp2_stream_current(d.cpu, &d.current));
    for (int r = 0; r < RING; r++) {
        CHECK(fsdp2_event_create(d.cpu, &d.copied[r]));
        CHECK(fsdp2_event_create(d.cpu, &d.consumed[r]));
    }
    CHECK(fsdp2_memory_stats_reset_peak(d.cpu));

    double serial_s = 0, pipelined_s = 0;
    int mismatches = 0;
    for (int step = 0; step < d.steps; step++) {
        for (int k = 0; k < 4; k += 2) {
            float *x = act[k]->data;
            for (int64_t i = 0; i < act[k]->numel; i++)
                x[i] = (float)((i * 7 + step * 13) % 17) / 17.0f;
        }
        double t0 = now();
        float *ref = forward_serial(&d, act[0]->data, act[1]->data);
        double t1 = now();
        float *out = forward_pipelined(&d, act[2]->data, act[3]->data);
        double t2 = now();
        serial_s += t1 - t0;
        pipelined_s += t2 - t1;
        if (memcmp(ref, out, (size_t)act[0]->nbytes) != 0)
            mismatches++;
        double sum = 0;
        for (int64_t i = 0; i < act[0]->numel; i++)
            sum += out[i];
        printf("step %d: serial %.1f ms, prefetched %.1f ms, output sum %.6f, %s\n", step,
               1e3 * (t1 - t0), 1e3 * (t2 - t1), sum,
               memcmp(ref, out, (size_t)act[0]->nbytes) == 0 ? "bit-identical to serial"
                                                              : "MISMATCH");
    }
    CHECK(fsdp2_stream_synchronize(d.copy_in));
    CHECK(fsdp2_memory_stats_get(d.cpu, &after));
    size_t planned = weight_bytes + ring_bytes + act_bytes;
    size_t measured = (size_t)(after.peak_allocated_bytes - before.allocated_bytes);
    printf("summary: serial %.1f ms/step, prefetched %.1f ms/step (%.2fx), compute waited on "
           "copy-in %.2f ms/step\n",
           1e3 * serial_s / d.steps, 1e3 * pipelined_s / d.steps, serial_s / pipelined_s,
           1e3 * d.wait_seconds / d.steps);
    printf("memory: planned %zu bytes, measured peak %zu bytes (%s), %llu allocations, none "
           "during steps\n",
           planned, measured, planned == measured ? "equal" : "DIFFERENT",
           (unsigned long long)(after.alloc_count - before.alloc_count));

    for (int r = 0; r < RING; r++) {
        CHECK(fsdp2_event_destroy(d.copied[r]));
        CHECK(fsdp2_event_destroy(d.consumed[r]));
        CHECK(fsdp2_tensor_release(d.ring[r]));
    }
    CHECK(fsdp2_stream_destroy(d.copy_in));
    for (int k = 0; k < 4; k++)
        CHECK(fsdp2_tensor_release(act[k]));
    for (int l = 0; l < d.layers; l++)
        CHECK(fsdp2_tensor_release(d.weight[l]));
    free(d.weight);
    free(d.row);
    if (mismatches || planned != measured) {
        fprintf(stderr, "demo FAILED: %d mismatching steps, planned %zu vs measured %zu bytes\n",
                mismatches, planned, measured);
        return 1;
    }
    return 0;
}
