/* The cuda device backend through the public API, on cuda:0, against the cpu backend.
 *
 * Proves: memory is allocated, counted and freed; streams run in order and events order
 * them across streams (a stream waiting on an event really waits); queries do not block
 * and report NOT_READY while work is pending; a failing host function's status reaches
 * fsdp2_stream_synchronize; and fill, cast, accumulate and chunk copy give the cpu
 * backend's bytes exactly, for every dtype pair, on random inputs without zeros and
 * outputs poisoned with 0xAB first.
 *
 * A standalone program (no Check, so it builds on the GPU machine with nothing else):
 * exit 0 on success, 1 on failure, 77 (meson's SKIP) without a CUDA device. Nothing
 * sleeps to wait: waits are on events with timeouts. */
#include "gpu_check.h"

/* The device under test: cuda:0, or FSDP2_TEST_DEVICE (=cpu checks this program's own
 * logic on a machine without a GPU; the CUDA-only tests are then left out). */
static fsdp2_device_t dut = {FSDP2_DEVICE_CUDA, 0};
static const fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;

/* Elements of the kernels' large cases (odd, past several of the cpu backend's 16384-
 * element parts) and of the event test's buffers (long enough on a GPU that a stream that
 * did not wait would be caught). Under the sanitizers (FSDP2_TEST_SANITIZED=1, set by
 * meson), which look for memory and thread errors on the paths, both are smaller: the
 * same parts and orderings on fewer bytes. */
static size_t large_n = 100003;
static size_t event_n = (size_t)16 << 20;

/* ---- devices and memory -------------------------------------------------------- */

static void test_device_check_accepts_cuda0_rejects_missing_ordinal(void)
{
    int count = 0;
    ASSERT_OK(fsdp2_cuda_device_count(&count));
    ASSERT_OK(fsdp2_device_check(dut));
    fsdp2_device_t missing = {FSDP2_DEVICE_CUDA, count};
    ASSERT_STATUS(fsdp2_device_check(missing), FSDP2_ERR_NOT_AVAILABLE);
    ASSERT_TRUE(strstr(fsdp2_last_error(), "cuda:") != NULL, "message '%s' names no device",
                fsdp2_last_error());
}

static void test_alloc_free_updates_memory_stats(void)
{
    fsdp2_memory_stats_t before, during, after;
    const size_t bytes = (1u << 20) + 3;
    void *p = NULL, *zero = (void *)1;
    ASSERT_OK(fsdp2_memory_stats_get(dut, &before));
    ASSERT_OK(fsdp2_device_alloc(dut, bytes, &p));
    ASSERT_TRUE(p != NULL, "no pointer");
    ASSERT_OK(fsdp2_memory_stats_get(dut, &during));
    ASSERT_EQ_U64(during.allocated_bytes, before.allocated_bytes + bytes);
    ASSERT_EQ_U64(during.alloc_count, before.alloc_count + 1);
    ASSERT_TRUE(during.peak_allocated_bytes >= during.allocated_bytes, "peak %llu below live",
                (unsigned long long)during.peak_allocated_bytes);
    ASSERT_OK(fsdp2_device_free(dut, p));
    ASSERT_OK(fsdp2_memory_stats_get(dut, &after));
    ASSERT_EQ_U64(after.allocated_bytes, before.allocated_bytes);
    ASSERT_EQ_U64(after.free_count, before.free_count + 1);
    ASSERT_OK(fsdp2_device_alloc(dut, 0, &zero));
    ASSERT_TRUE(zero == NULL, "zero bytes gave %p", zero);
}

static void test_alloc_beyond_gpu_memory_is_out_of_memory(void)
{
    void *p = NULL;
    ASSERT_STATUS(fsdp2_device_alloc(dut, (size_t)1 << 50, &p), FSDP2_ERR_OUT_OF_MEMORY);
    ASSERT_TRUE(p == NULL, "pointer %p after failure", p);
    ASSERT_TRUE(strstr(fsdp2_last_error(), "1125899906842624") != NULL,
                "message '%s' does not name the bytes", fsdp2_last_error());
    /* The failure must not leak into the next call. */
    ASSERT_OK(fsdp2_device_alloc(dut, 4096, &p));
    fsdp2_stream_t *cur;
    ASSERT_OK(fsdp2_stream_current(dut, &cur));
    ASSERT_OK(fsdp2_fill_async(p, FSDP2_F32, 1024, 1.0, cur));
    ASSERT_OK(fsdp2_stream_synchronize(cur));
    ASSERT_OK(fsdp2_device_free(dut, p));
}

/* ---- streams and events --------------------------------------------------------- */

static void test_current_stream_is_shared_and_cannot_be_destroyed(void)
{
    fsdp2_stream_t *a, *b;
    ASSERT_OK(fsdp2_stream_current(dut, &a));
    ASSERT_OK(fsdp2_stream_current(dut, &b));
    ASSERT_TRUE(a == b, "two current streams %p %p", (void *)a, (void *)b);
    fsdp2_device_t dev;
    ASSERT_OK(fsdp2_stream_device(a, &dev));
    ASSERT_TRUE(dev.type == dut.type && dev.index == dut.index, "device %d:%d", (int)dev.type,
                dev.index);
    ASSERT_STATUS(fsdp2_stream_destroy(a), FSDP2_ERR_INVALID_ARGUMENT);

    const size_t n = 1000;
    float *d = NULL, *h = xmalloc(n * sizeof *h);
    ASSERT_OK(fsdp2_device_alloc(dut, n * sizeof(float), (void **)&d));
    ASSERT_OK(fsdp2_fill_async(d, FSDP2_F32, n, 2.5, a));
    ASSERT_OK(download(h, d, n * sizeof *h, a));
    for (size_t i = 0; i < n; i++)
        ASSERT_TRUE(h[i] == 2.5f, "element %zu is %g", i, (double)h[i]);
    ASSERT_OK(fsdp2_stream_query(a));
    ASSERT_OK(fsdp2_device_free(dut, d));
    free(h);
}

/* Stream A: gate, then fill X with 7; record E. Stream B: wait E, cast X -> Y (f64).
 * X holds 1 before, so Y would show 1s if B did not wait. */
static void test_event_orders_work_across_streams(void)
{
    const size_t n = event_n;
    fsdp2_stream_t *sa, *sb;
    fsdp2_event_t *ev, *never;
    float *x = NULL;
    double *y = NULL, *h = xmalloc(n * sizeof *h);
    gate_t gate;
    atomic_init(&gate.open, 0);
    ASSERT_OK(fsdp2_stream_create(dut, "test-a", &sa));
    ASSERT_OK(fsdp2_stream_create(dut, "test-b", &sb));
    ASSERT_OK(fsdp2_event_create(dut, &ev));
    ASSERT_OK(fsdp2_event_create(dut, &never));
    ASSERT_OK(fsdp2_event_query(never)); /* never recorded: complete */
    ASSERT_OK(fsdp2_device_alloc(dut, n * sizeof *x, (void **)&x));
    ASSERT_OK(fsdp2_device_alloc(dut, n * sizeof *y, (void **)&y));
    ASSERT_OK(fsdp2_fill_async(x, FSDP2_F32, n, 1.0, sa));
    ASSERT_OK(fsdp2_fill_async(y, FSDP2_F64, n, -3.0, sa));
    ASSERT_OK(fsdp2_stream_synchronize(sa));

    ASSERT_OK(fsdp2_stream_launch_host(sa, gate_wait, &gate));
    ASSERT_OK(fsdp2_fill_async(x, FSDP2_F32, n, 7.0, sa));
    ASSERT_OK(fsdp2_event_record(ev, sa));
    ASSERT_OK(fsdp2_stream_wait_event(sb, ev));
    ASSERT_OK(fsdp2_cast_async(y, FSDP2_F64, x, FSDP2_F32, n, sb));

    /* Asked before the gate opens, checked after: a failed check must not leave stream A
     * blocked behind the gate. */
    fsdp2_status_t event_before = fsdp2_event_query(ev);
    fsdp2_status_t a_before = fsdp2_stream_query(sa);
    fsdp2_status_t b_before = fsdp2_stream_query(sb);
    fsdp2_status_t wait_before = fsdp2_event_wait_timeout(ev, 20);
    atomic_store(&gate.open, 1);
    ASSERT_STATUS(event_before, FSDP2_ERR_NOT_READY);
    ASSERT_STATUS(a_before, FSDP2_ERR_NOT_READY);
    ASSERT_STATUS(b_before, FSDP2_ERR_NOT_READY);
    ASSERT_STATUS(wait_before, FSDP2_ERR_TIMEOUT);
    ASSERT_OK(fsdp2_event_wait_timeout(ev, 60000));
    ASSERT_OK(fsdp2_event_query(ev));
    ASSERT_OK(fsdp2_stream_synchronize(sb));
    ASSERT_OK(fsdp2_stream_query(sb));
    ASSERT_OK(fsdp2_event_synchronize(ev));
    ASSERT_OK(download(h, y, n * sizeof *h, sb));
    for (size_t i = 0; i < n; i++)
        ASSERT_TRUE(h[i] == 7.0, "y[%zu] = %g: stream B did not wait for A's event", i, h[i]);

    /* Destroying a stream with work pending lets the work finish first. */
    ASSERT_OK(fsdp2_fill_async(x, FSDP2_F32, n, 9.0, sa));
    ASSERT_OK(fsdp2_stream_destroy(sa));
    ASSERT_OK(fsdp2_cast_async(y, FSDP2_F64, x, FSDP2_F32, n, sb));
    ASSERT_OK(download(h, y, n * sizeof *h, sb));
    ASSERT_TRUE(h[0] == 9.0 && h[n - 1] == 9.0, "after destroy: %g %g", h[0], h[n - 1]);

    ASSERT_OK(fsdp2_event_destroy(ev));
    ASSERT_OK(fsdp2_event_destroy(never));
    ASSERT_OK(fsdp2_stream_destroy(sb));
    ASSERT_OK(fsdp2_device_free(dut, x));
    ASSERT_OK(fsdp2_device_free(dut, y));
    free(h);
}

/* Fails through the public API, so the message is the library's own. */
static fsdp2_status_t host_fn_bad_dtype(void *arg)
{
    size_t bytes;
    (void)arg;
    return fsdp2_dtype_size((fsdp2_dtype_t)99, &bytes);
}

static fsdp2_status_t host_fn_io_error(void *arg)
{
    (void)arg;
    return FSDP2_ERR_IO;
}

static void test_host_function_error_surfaces_in_synchronize(void)
{
    fsdp2_stream_t *s, *t;
    uint32_t *d = NULL, h[256];
    ASSERT_OK(fsdp2_stream_create(dut, "host-error", &s));
    ASSERT_OK(fsdp2_device_alloc(dut, sizeof h, (void **)&d));
    ASSERT_OK(fsdp2_stream_launch_host(s, host_fn_bad_dtype, NULL));
    ASSERT_OK(fsdp2_stream_launch_host(s, host_fn_io_error, NULL));
    ASSERT_OK(fsdp2_fill_async(d, FSDP2_I32, 256, 5.0, s));
    ASSERT_STATUS(fsdp2_stream_synchronize(s), FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(fsdp2_last_error(), "99") != NULL,
                "message '%s' is not the host function's", fsdp2_last_error());
    /* Kept: the first error is reported again, by query as well. */
    ASSERT_STATUS(fsdp2_stream_query(s), FSDP2_ERR_INVALID_ARGUMENT);
    /* Work behind the failing function still ran. */
    ASSERT_STATUS(fsdp2_memcpy_async(h, d, sizeof h, s), FSDP2_SUCCESS);
    ASSERT_STATUS(fsdp2_stream_synchronize(s), FSDP2_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 256; i++)
        ASSERT_TRUE(h[i] == 5, "element %d is %u after the failed host function", i, h[i]);
    ASSERT_OK(fsdp2_stream_destroy(s));

    /* A status without a message of its own is reported by name. */
    ASSERT_OK(fsdp2_stream_create(dut, "host-io", &t));
    ASSERT_OK(fsdp2_stream_launch_host(t, host_fn_io_error, NULL));
    ASSERT_STATUS(fsdp2_stream_synchronize(t), FSDP2_ERR_IO);
    ASSERT_TRUE(strstr(fsdp2_last_error(), "ERR_IO") != NULL, "message '%s'",
                fsdp2_last_error());
    ASSERT_OK(fsdp2_stream_destroy(t));
    ASSERT_OK(fsdp2_device_free(dut, d));
}

typedef struct ordered_call {
    int *next; /* only the stream's host thread touches it: host functions run in order */
    int id;
    int *out_of_order;
} ordered_call_t;

static fsdp2_status_t host_fn_in_order(void *arg)
{
    ordered_call_t *c = arg;
    if (*c->next != c->id)
        (*c->out_of_order)++;
    *c->next = c->id + 1;
    return FSDP2_SUCCESS;
}

/* More host functions than a stream keeps slots for (the launcher waits for free
 * slots instead of allocating), all run, in order. */
static void test_many_host_functions_run_in_order_without_allocation(void)
{
    enum { N = 3000 };
    static ordered_call_t calls[N];
    int next = 0, out_of_order = 0;
    fsdp2_stream_t *s;
    ASSERT_OK(fsdp2_stream_create(dut, "many-host", &s));
    for (int i = 0; i < N; i++) {
        calls[i] = (ordered_call_t){&next, i, &out_of_order};
        ASSERT_OK(fsdp2_stream_launch_host(s, host_fn_in_order, &calls[i]));
    }
    ASSERT_OK(fsdp2_stream_synchronize(s));
    ASSERT_TRUE(next == N && out_of_order == 0, "ran %d of %d, %d out of order", next, N,
                out_of_order);
    ASSERT_OK(fsdp2_stream_destroy(s));
}

static void test_misaligned_kernel_pointer_is_refused(void)
{
    fsdp2_stream_t *cur;
    char *d = NULL;
    ASSERT_OK(fsdp2_stream_current(dut, &cur));
    ASSERT_OK(fsdp2_device_alloc(dut, 4096, (void **)&d));
    ASSERT_STATUS(fsdp2_fill_async(d + 2, FSDP2_F32, 16, 1.0, cur), FSDP2_ERR_INVALID_ARGUMENT);
    ASSERT_OK(fsdp2_stream_synchronize(cur));
    ASSERT_OK(fsdp2_device_free(dut, d));
}

/* ---- kernels against the cpu backend ------------------------------------------- */

typedef struct kernel_bench {
    fsdp2_stream_t *gpu;  /* a side stream on cuda:0 */
    fsdp2_stream_t *host; /* the cpu current stream: runs inline */
    void *dsrc, *ddst;    /* device buffers of `cap` bytes */
    size_t cap;
} kernel_bench_t;

/* One chunk copy (a cast when rows == 1) on both devices, dst and src starting
 * dst_off and src_off elements into their buffers (the kernels' vector paths depend on
 * the alignment); compares the whole destination buffer, the poisoned elements before
 * dst_off and the gaps between rows included. */
static void check_chunk_copy_at(kernel_bench_t *kb, fsdp2_dtype_t dt, fsdp2_dtype_t st,
                                size_t rows, size_t cols, size_t dst_stride, size_t src_stride,
                                size_t dst_off, size_t src_off)
{
    size_t src_n = src_off + (rows - 1) * src_stride + cols, dst_n = dst_off + rows * dst_stride;
    size_t src_bytes = src_n * dsize(st), dst_bytes = dst_n * dsize(dt);
    if (src_bytes > kb->cap || dst_bytes > kb->cap) {
        FAIL("test buffers too small for %zu x %zu", rows, cols);
        return;
    }
    void *src = xmalloc(src_bytes), *want = xmalloc(dst_bytes), *got = xmalloc(dst_bytes);
    random_values(src, st, src_n, 30);
    memset(want, 0xab, dst_bytes);
    memset(got, 0xab, dst_bytes);
    fsdp2_chunk_copy_t c = {(char *)want + dst_off * dsize(dt), dt, dst_stride,
                            (char *)src + src_off * dsize(st), st, src_stride, rows, cols};
    ASSERT_OK(fsdp2_chunk_copy_async(&c, kb->host));
    ASSERT_OK(fsdp2_stream_synchronize(kb->host));
    ASSERT_OK(upload(kb->dsrc, src, src_bytes, kb->gpu));
    ASSERT_OK(upload(kb->ddst, got, dst_bytes, kb->gpu));
    c.dst = (char *)kb->ddst + dst_off * dsize(dt);
    c.src = (char *)kb->dsrc + src_off * dsize(st);
    if (rows == 1 && dst_stride == cols && src_stride == cols)
        ASSERT_OK(fsdp2_cast_async(c.dst, dt, c.src, st, cols, kb->gpu));
    else
        ASSERT_OK(fsdp2_chunk_copy_async(&c, kb->gpu));
    ASSERT_OK(download(got, kb->ddst, dst_bytes, kb->gpu));
    long i = first_difference(want, got, dt, dst_n);
    if (i >= 0) {
        size_t at = (size_t)i < dst_off ? 0 : (size_t)i - dst_off;
        size_t r = at / dst_stride, col = at % dst_stride;
        FAIL("chunk copy %s -> %s, %zu x %zu (strides dst %zu src %zu, offsets %zu %zu): "
             "element %ld (row %zu col %zu) src 0x%llx: cpu 0x%llx cuda 0x%llx",
             fsdp2_dtype_name(st), fsdp2_dtype_name(dt), rows, cols, dst_stride, src_stride,
             dst_off, src_off, i, r, col,
             (size_t)i >= dst_off && col < cols
                 ? (unsigned long long)elem_bits(src, st, src_off + r * src_stride + col)
                 : 0ull,
             (unsigned long long)elem_bits(want, dt, (size_t)i),
             (unsigned long long)elem_bits(got, dt, (size_t)i));
    }
    free(src);
    free(want);
    free(got);
}

static void check_chunk_copy(kernel_bench_t *kb, fsdp2_dtype_t dt, fsdp2_dtype_t st, size_t rows,
                             size_t cols, size_t dst_stride, size_t src_stride)
{
    check_chunk_copy_at(kb, dt, st, rows, cols, dst_stride, src_stride, 0, 0);
}

static void test_cast_and_chunk_copy_match_cpu_for_every_dtype_pair(kernel_bench_t *kb)
{
    for (int d = 0; d < FSDP2_DTYPE_COUNT; d++) {
        for (int s = 0; s < FSDP2_DTYPE_COUNT; s++) {
            fsdp2_dtype_t dt = (fsdp2_dtype_t)d, st = (fsdp2_dtype_t)s;
            int before = failures;
            check_chunk_copy(kb, dt, st, 1, large_n, large_n, large_n); /* flat cast */
            check_chunk_copy(kb, dt, st, 1, 5, 5, 5);                /* tiny */
            check_chunk_copy(kb, dt, st, 37, 1001, 1024, 1013);     /* strided rows */
            check_chunk_copy(kb, dt, st, 64, 128, 128, 128);        /* contiguous 2D */
            /* Starts off the vector alignment: the same head on both sides (vector
             * body, scalar head and tail), different heads (scalar), and rows whose
             * strides keep every row's head the same. */
            check_chunk_copy_at(kb, dt, st, 1, large_n, large_n, large_n, 3, 3);
            check_chunk_copy_at(kb, dt, st, 1, 4099, 4099, 4099, 1, 6);
            check_chunk_copy_at(kb, dt, st, 9, 77, 96, 80, 5, 5);
            check_chunk_copy_at(kb, dt, st, 1, 13, 13, 13, 7, 7);
            if (failures != before)
                return; /* one report per pair is enough */
        }
    }
    /* More rows than a grid's y dimension (65535), and rows over 2 GiB apart would need
     * more memory than a test should take: cover the first. */
    check_chunk_copy(kb, FSDP2_BF16, FSDP2_F32, 70001, 3, 4, 5);
    check_chunk_copy(kb, FSDP2_F32, FSDP2_F32, 70001, 3, 4, 5);
}

/* y starts y_off elements into its buffer, x x_off into its own (alignment). */
static void check_accumulate_at(kernel_bench_t *kb, fsdp2_dtype_t yt, fsdp2_dtype_t xt, size_t n,
                                double alpha, size_t y_off, size_t x_off)
{
    size_t yb = n * dsize(yt), xb = n * dsize(xt);
    void *dy = (char *)kb->ddst + y_off * dsize(yt), *dx = (char *)kb->dsrc + x_off * dsize(xt);
    void *x = xmalloc(xb), *want = xmalloc(yb), *got = xmalloc(yb);
    /* Finite in f16 (below 2^15): inf - inf would make NaNs, whose payload is the
     * hardware's own (x86 and GPUs differ). */
    random_values(x, xt, n, 14);
    random_values(want, yt, n, 14);
    ASSERT_OK(upload(dx, x, xb, kb->gpu));
    ASSERT_OK(upload(dy, want, yb, kb->gpu));
    ASSERT_OK(fsdp2_accumulate_async(want, yt, x, xt, n, alpha, kb->host));
    ASSERT_OK(fsdp2_stream_synchronize(kb->host));
    if (yt == xt)
        ASSERT_OK(fsdp2_axpy_async(dy, dx, yt, n, alpha, kb->gpu));
    else
        ASSERT_OK(fsdp2_accumulate_async(dy, yt, dx, xt, n, alpha, kb->gpu));
    ASSERT_OK(download(got, dy, yb, kb->gpu));
    long i = first_difference(want, got, yt, n);
    if (i >= 0)
        FAIL("accumulate %s += %g * %s, n=%zu, offsets %zu %zu: element %ld x 0x%llx: cpu "
             "0x%llx cuda 0x%llx",
             fsdp2_dtype_name(yt), alpha, fsdp2_dtype_name(xt), n, y_off, x_off, i,
             (unsigned long long)elem_bits(x, xt, (size_t)i),
             (unsigned long long)elem_bits(want, yt, (size_t)i),
             (unsigned long long)elem_bits(got, yt, (size_t)i));
    free(x);
    free(want);
    free(got);
}

static void check_accumulate(kernel_bench_t *kb, fsdp2_dtype_t yt, fsdp2_dtype_t xt, size_t n,
                             double alpha)
{
    check_accumulate_at(kb, yt, xt, n, alpha, 0, 0);
}

static void test_accumulate_matches_cpu_for_every_float_pair(kernel_bench_t *kb)
{
    const fsdp2_dtype_t floats[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16};
    const double alphas[] = {1.0, -0.37, 1.0 / 3.0};
    for (size_t a = 0; a < sizeof alphas / sizeof alphas[0]; a++)
        for (int yi = 0; yi < 4; yi++)
            for (int xi = 0; xi < 4; xi++) {
                check_accumulate(kb, floats[yi], floats[xi], large_n, alphas[a]);
                check_accumulate(kb, floats[yi], floats[xi], 3, alphas[a]);
                check_accumulate_at(kb, floats[yi], floats[xi], large_n, alphas[a], 5, 5);
                check_accumulate_at(kb, floats[yi], floats[xi], 4099, alphas[a], 1, 2);
            }
}

static void test_fill_matches_cpu_for_every_dtype(kernel_bench_t *kb)
{
    const double values[] = {0.0, -0.0, 1.0, -2.5, 3.14159, 1e10, -1e10, 300.7, 255.5,
                             65520.0, 1e-8, 1e-40, 9.3e18, NAN, -NAN, INFINITY, -INFINITY};
    const size_t sizes[] = {1, 7, large_n};
    for (int d = 0; d < FSDP2_DTYPE_COUNT; d++) {
        fsdp2_dtype_t t = (fsdp2_dtype_t)d;
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
                size_t n = sizes[k], bytes = (n + 1) * dsize(t);
                void *want = xmalloc(bytes), *got = xmalloc(bytes);
                memset(want, 0xab, bytes);
                memset(got, 0xab, bytes);
                ASSERT_OK(fsdp2_fill_async(want, t, n, values[v], kb->host));
                ASSERT_OK(upload(kb->ddst, got, bytes, kb->gpu));
                ASSERT_OK(fsdp2_fill_async(kb->ddst, t, n, values[v], kb->gpu));
                ASSERT_OK(download(got, kb->ddst, bytes, kb->gpu));
                long i = first_difference(want, got, t, n + 1); /* + the poisoned tail */
                if (i >= 0) {
                    FAIL("fill %s with %g, n=%zu: element %ld: cpu 0x%llx cuda 0x%llx",
                         fsdp2_dtype_name(t), values[v], n, i,
                         (unsigned long long)elem_bits(want, t, (size_t)i),
                         (unsigned long long)elem_bits(got, t, (size_t)i));
                    free(want);
                    free(got);
                    return;
                }
                free(want);
                free(got);
            }
        }
    }
}

static void run_kernel_tests(void)
{
    kernel_bench_t kb = {.cap = (size_t)8 << 20};
    if (fsdp2_stream_create(dut, "kernels", &kb.gpu) != FSDP2_SUCCESS ||
        fsdp2_stream_current(cpu, &kb.host) != FSDP2_SUCCESS ||
        fsdp2_device_alloc(dut, kb.cap, &kb.dsrc) != FSDP2_SUCCESS ||
        fsdp2_device_alloc(dut, kb.cap, &kb.ddst) != FSDP2_SUCCESS) {
        FAIL("kernel test set-up: %s", fsdp2_last_error());
        return;
    }
    struct {
        const char *name;
        void (*fn)(kernel_bench_t *);
    } tests[] = {
        {"cast_and_chunk_copy_match_cpu_for_every_dtype_pair",
         test_cast_and_chunk_copy_match_cpu_for_every_dtype_pair},
        {"accumulate_matches_cpu_for_every_float_pair",
         test_accumulate_matches_cpu_for_every_float_pair},
        {"fill_matches_cpu_for_every_dtype", test_fill_matches_cpu_for_every_dtype},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int before = failures;
        tests[i].fn(&kb);
        printf("%s - %s\n", failures == before ? "ok" : "FAIL", tests[i].name);
    }
    fsdp2_device_free(dut, kb.dsrc);
    fsdp2_device_free(dut, kb.ddst);
    fsdp2_stream_destroy(kb.gpu);
}

int main(void)
{
    const char *env = getenv("FSDP2_TEST_DEVICE");
    if (env && fsdp2_device_parse(env, &dut) != FSDP2_SUCCESS) {
        fprintf(stderr, "FSDP2_TEST_DEVICE: %s\n", fsdp2_last_error());
        return 1;
    }
    const char *sanitized = getenv("FSDP2_TEST_SANITIZED");
    if (sanitized && strcmp(sanitized, "1") == 0) {
        large_n = 40009;
        event_n = (size_t)1 << 20;
    }
    int count = 0, on_cuda = dut.type == FSDP2_DEVICE_CUDA;
    if (on_cuda && (fsdp2_cuda_device_count(&count) != FSDP2_SUCCESS || count <= dut.index)) {
        fsdp2_device_check(dut);
        printf("SKIP: no CUDA device (%s)\n", fsdp2_last_error());
        return 77;
    }
    struct {
        const char *name;
        void (*fn)(void);
        int cuda_only;
    } tests[] = {
#define T(name, cuda_only) {#name, test_##name, cuda_only}
        T(device_check_accepts_cuda0_rejects_missing_ordinal, 1),
        T(alloc_free_updates_memory_stats, 0),
        T(alloc_beyond_gpu_memory_is_out_of_memory, 0),
        T(current_stream_is_shared_and_cannot_be_destroyed, 0),
        T(event_orders_work_across_streams, 0),
        T(host_function_error_surfaces_in_synchronize, 0),
        T(many_host_functions_run_in_order_without_allocation, 0),
        T(misaligned_kernel_pointer_is_refused, 1),
#undef T
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (tests[i].cuda_only && !on_cuda)
            continue;
        int before = failures;
        tests[i].fn();
        printf("%s - %s\n", failures == before ? "ok" : "FAIL", tests[i].name);
    }
    run_kernel_tests();
    char name[FSDP2_DEVICE_NAME_MAX];
    fsdp2_device_format(dut, name, sizeof name);
    if (failures) {
        printf("test_cuda_runtime: %d failure(s) on %s\n", failures, name);
        return 1;
    }
    printf("test_cuda_runtime: all passed on %s\n", name);
    return 0;
}
