/* nn_sgemm on oneDNN's matmul primitive (primitives kept per shape), or on the BLAS. */
#include "gemm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp2/dtype.h>
#include <fsdp2/nn.h>

#include "core/env_internal.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log_internal.h"
#include "nn_common.h"

#ifdef _OPENMP
#include <omp.h>
#endif

const char *nn_blas_coretype_advice(const char *corename, int has_avx2, int has_avx512f)
{
    /* OpenBLAS's cores without AVX kernels, the ones it falls back to when a virtual
     * machine hides the CPU's model; matched case-blind as its builds spell them both ways */
    static const char *const generic[] = {"prescott", "core2", "penryn", "dunnington",
                                          "nehalem", "atom", "katmai", "coppermine",
                                          "northwood", "banias", "generic", "barcelona",
                                          "opteron", "opteron_sse3", "athlon"};
    if (!corename || !(has_avx2 || has_avx512f))
        return NULL;
    char lower[32];
    size_t n = strlen(corename);
    if (n >= sizeof(lower))
        return NULL;
    for (size_t i = 0; i <= n; i++)
        lower[i] = (char)(corename[i] >= 'A' && corename[i] <= 'Z' ? corename[i] - 'A' + 'a'
                                                                    : corename[i]);
    for (size_t i = 0; i < sizeof(generic) / sizeof(generic[0]); i++)
        if (strcmp(lower, generic[i]) == 0)
            return has_avx512f ? "SkylakeX" : "Haswell";
    return NULL;
}

/* C = beta C + bias (bias NULL: none): the degenerate products, which neither engine
 * takes, and a bias for an engine that does not add it itself (then beta 1 follows). */
static void scale_c(int64_t m, int64_t n, float beta, const float *bias, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        float *row = c + i * ldc;
        for (int64_t j = 0; j < n; j++)
            row[j] = (beta == 0.0f ? 0.0f : beta * row[j]) + (bias ? bias[j] : 0.0f);
    }
}

/* A product with m, n, k > 0 and alpha != 0, on the build's engine; bias NULL or with
 * alpha 1. */
static fsdp2_status_t engine_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                   float alpha, const float *a, int64_t lda, const float *b,
                                   int64_t ldb, float beta, const float *bias, float *c,
                                   int64_t ldc);

/* The counters of fsdp2_nn_gemm_stats: nanoseconds scaled by the region's threads. */
static struct {
    int64_t calls, flops, nanoseconds;
} counters;

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* One GEMM of m n k that started at t0 into the counters. */
static void count_gemm(int64_t m, int64_t n, int64_t k, int64_t t0)
{
    int64_t ns = now_ns() - t0, share = nn_region_threads();
    __atomic_fetch_add(&counters.calls, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&counters.flops, 2 * m * n * k, __ATOMIC_RELAXED);
    __atomic_fetch_add(&counters.nanoseconds, ns / (share > 0 ? share : 1), __ATOMIC_RELAXED);
}

/* A thread that prepares (nn_gemm_prepare_begin) only creates primitives. Not nested:
 * nn_gemm_prepare_end ends it. */
static _Thread_local struct {
    int on;
} prep;

void nn_gemm_prepare_begin(void)
{
    prep.on = 1;
}

void nn_gemm_prepare_end(void)
{
    prep.on = 0;
}

int nn_gemm_preparing(void)
{
    return prep.on;
}

static fsdp2_status_t gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                           const float *bias, float *c, int64_t ldc)
{
    if (m == 0 || n == 0 || (prep.on && (k == 0 || alpha == 0.0f)))
        return FSDP2_SUCCESS;
    if (k == 0 || alpha == 0.0f) { /* neither engine takes these */
        scale_c(m, n, beta, bias, c, ldc);
        return FSDP2_SUCCESS;
    }
    if (prep.on)
        return engine_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, bias, c,
                            ldc);
    int64_t t0 = now_ns();
    fsdp2_status_t s = engine_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, bias,
                                    c, ldc);
    count_gemm(m, n, k, t0);
    return s;
}

fsdp2_status_t nn_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc)
{
    return gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, NULL, c, ldc);
}

fsdp2_status_t nn_sgemm_bias(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                             const float *a, int64_t lda, const float *b, int64_t ldb,
                             const float *bias, float *c, int64_t ldc)
{
    return gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, bias, c, ldc);
}

fsdp2_status_t fsdp2_nn_gemm_stats(fsdp2_nn_gemm_stats_t *stats)
{
    FSDP2_ARG_CHECK(stats, "stats is NULL");
    stats->calls = __atomic_load_n(&counters.calls, __ATOMIC_RELAXED);
    stats->flops = (double)__atomic_load_n(&counters.flops, __ATOMIC_RELAXED);
    stats->seconds = 1e-9 * (double)__atomic_load_n(&counters.nanoseconds, __ATOMIC_RELAXED);
    stats->engine = nn_gemm_engine();
    return FSDP2_SUCCESS;
}

/* ---- bf16 operands ---- */

/* The bf16 product on the engine's own bf16 kernels, where nn_gemm_bf16_native: *done 0
 * when the engine does not implement this shape. Sizes > 0, alpha != 0. */
static fsdp2_status_t native_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                  float alpha, const uint16_t *a, int64_t lda,
                                  const uint16_t *b, int64_t ldb, float beta, const float *bias,
                                  float *c, int64_t ldc, int *done);

/* The emulation's f32 copies of A's and B's blocks, each of at most EMULATE_FLOATS
 * (512 KiB), made once per thread and kept for its life; a block spans at most
 * EMULATE_K of the reduction, so that a block of A or B keeps at least 256 rows. */
#define EMULATE_FLOATS (1 << 17)
#define EMULATE_K 512

static pthread_once_t emulate_once = PTHREAD_ONCE_INIT;
static pthread_key_t emulate_key;
static int emulate_key_ok;

static void emulate_init(void)
{
    emulate_key_ok = pthread_key_create(&emulate_key, free) == 0;
}

static fsdp2_status_t emulate_scratch(float **out)
{
    pthread_once(&emulate_once, emulate_init);
    if (!emulate_key_ok)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "no thread key for the bf16 GEMM's scratch");
    float *p = pthread_getspecific(emulate_key);
    if (!p) {
        p = fsdp2_malloc(2 * sizeof(float) * EMULATE_FLOATS);
        if (!p || pthread_setspecific(emulate_key, p) != 0) {
            free(p);
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "no room for the bf16 GEMM's %zu bytes "
                               "of scratch", 2 * sizeof(float) * EMULATE_FLOATS);
        }
    }
    *out = p;
    return FSDP2_SUCCESS;
}

/* rows x cols of a row-major bf16 matrix (leading dimension ld) from (r0, c0) into dst, a
 * dense f32 [rows, cols]: exact, bf16 being f32's upper half. */
static void load_bf16(float *dst, const uint16_t *src, int64_t ld, int64_t r0, int64_t c0,
                      int64_t rows, int64_t cols)
{
    nn_convert_block(dst, FSDP2_F32, src, FSDP2_BF16, ld, r0, c0, rows, cols);
}

/* The bf16 product where the engine has no bf16 kernel: blocks of A and B converted to
 * f32 (exactly) and multiplied by the f32 GEMM, so every product is the one a bf16 kernel
 * forms and only the order of the f32 sums differs. C's block [mb, nb] takes the
 * reduction in pieces of EMULATE_K, the first with beta, the others adding. */
static fsdp2_status_t emulate_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                   float alpha, const uint16_t *a, int64_t lda,
                                   const uint16_t *b, int64_t ldb, float beta, const float *bias,
                                   float *c, int64_t ldc)
{
    float *fa = NULL, *fb = NULL;
    if (!prep.on) /* preparing: the f32 GEMMs' primitives only */
        FSDP2_CHECK(emulate_scratch(&fa));
    fb = fa ? fa + EMULATE_FLOATS : NULL;
    if (bias) { /* C = beta C + bias, then beta 1 */
        if (!prep.on)
            scale_c(m, n, beta, bias, c, ldc);
        beta = 1.0f;
    }
    int64_t kb = k < EMULATE_K ? k : EMULATE_K;
    int64_t mb = m < EMULATE_FLOATS / kb ? m : EMULATE_FLOATS / kb;
    int64_t nb = n < EMULATE_FLOATS / kb ? n : EMULATE_FLOATS / kb;
    for (int64_t i0 = 0; i0 < m; i0 += mb) {
        int64_t mi = m - i0 < mb ? m - i0 : mb;
        for (int64_t j0 = 0; j0 < n; j0 += nb) {
            int64_t nj = n - j0 < nb ? n - j0 : nb;
            for (int64_t p0 = 0; p0 < k; p0 += kb) {
                int64_t pk = k - p0 < kb ? k - p0 : kb;
                /* each block keeps its operand's orientation: [pk, mi] when A is stored
                 * transposed, [mi, pk] otherwise; B the same */
                if (!prep.on) { /* preparing: the f32 GEMMs' primitives only */
                    if (trans_a)
                        load_bf16(fa, a, lda, p0, i0, pk, mi);
                    else
                        load_bf16(fa, a, lda, i0, p0, mi, pk);
                    if (trans_b)
                        load_bf16(fb, b, ldb, j0, p0, nj, pk);
                    else
                        load_bf16(fb, b, ldb, p0, j0, pk, nj);
                }
                FSDP2_CHECK(engine_sgemm(trans_a, trans_b, mi, nj, pk, alpha, fa,
                                         trans_a ? mi : pk, fb, trans_b ? pk : nj,
                                         p0 == 0 ? beta : 1.0f, NULL,
                                         c ? c + i0 * ldc + j0 : NULL, ldc));
            }
        }
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t gemm_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                                int64_t ldb, float beta, const float *bias, float *c,
                                int64_t ldc)
{
    if (m == 0 || n == 0 || (prep.on && (k == 0 || alpha == 0.0f)))
        return FSDP2_SUCCESS;
    if (k == 0 || alpha == 0.0f) {
        scale_c(m, n, beta, bias, c, ldc);
        return FSDP2_SUCCESS;
    }
    int64_t t0 = now_ns();
    int done = 0;
    fsdp2_status_t s = FSDP2_SUCCESS;
    if (nn_gemm_bf16_native())
        s = native_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, bias, c, ldc,
                        &done);
    if (s == FSDP2_SUCCESS && !done)
        s = emulate_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, bias, c, ldc);
    if (!prep.on)
        count_gemm(m, n, k, t0);
    return s;
}

fsdp2_status_t nn_gemm_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                            int64_t ldb, float beta, float *c, int64_t ldc)
{
    return gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, NULL, c, ldc);
}

fsdp2_status_t nn_gemm_bf16_bias(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                 const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                                 const float *bias, float *c, int64_t ldc)
{
    return gemm_bf16(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, bias, c, ldc);
}

#ifdef FSDP2_HAVE_ONEDNN
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <dnnl.h>
#include <dnnl_debug.h>

/* A primitive's shape: everything oneDNN fixes when it creates one. */
typedef struct gemm_key {
    int64_t m, n, k, lda, ldb, ldc;
    int32_t trans_a, trans_b, threads, bias; /* four: no padding bytes in the key */
    int32_t dtype, dst_dtype;                /* of A and B, of C: dnnl_data_type_t */
    float alpha, beta;
} gemm_key_t;
/* hashed and compared as bytes: every byte is a field's */
_Static_assert(sizeof(gemm_key_t) == 6 * 8 + 6 * 4 + 2 * 4, "gemm_key_t has padding");

/* Entries live on the heap and never move: a GEMM reads its entry without the lock. */
typedef struct gemm_entry {
    gemm_key_t key;
    dnnl_primitive_t prim; /* NULL: matmul does not implement this shape (use sgemm) */
    dnnl_memory_desc_t a, b, c, bias; /* bias: zero without one */
} gemm_entry_t;

/* A thread's memory objects of one entry (A, B, C and the bias, NULL without one), made
 * on the thread's first call of that shape; each call only sets their data handles. */
typedef struct thread_memories {
    const gemm_entry_t *entry;
    dnnl_memory_t mem[4];
} thread_memories_t;

/* What a thread keeps: its stream (oneDNN streams are not shared between threads) and its
 * memory objects, found by entry (open addressing, at most half full). Freed when the
 * thread exits. */
typedef struct thread_state {
    dnnl_stream_t stream;
    thread_memories_t *slots;
    size_t cap, count;
} thread_state_t;

static struct {
    pthread_once_t once;
    dnnl_status_t init_status;
    dnnl_engine_t engine;
    pthread_key_t thread_key;
    pthread_mutex_t lock;
    gemm_entry_t **table; /* open addressing, at most half full */
    size_t cap, count;
    int64_t memories; /* memory objects created, for the tests */
} g = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void destroy_thread_state(void *p)
{
    thread_state_t *ts = p;
    for (size_t i = 0; i < ts->cap; i++)
        for (int j = 0; ts->slots[i].entry && j < 4; j++)
            if (ts->slots[i].mem[j])
                dnnl_memory_destroy(ts->slots[i].mem[j]);
    free(ts->slots);
    if (ts->stream)
        dnnl_stream_destroy(ts->stream);
    free(ts);
}

static void gemm_init(void)
{
    g.init_status = dnnl_engine_create(&g.engine, dnnl_cpu, 0);
    if (g.init_status == dnnl_success &&
        pthread_key_create(&g.thread_key, destroy_thread_state) != 0)
        g.init_status = dnnl_out_of_memory;
}

static fsdp2_status_t dnnl_fail(dnnl_status_t s, const char *what)
{
    return fsdp2_error(s == dnnl_out_of_memory ? FSDP2_ERR_OUT_OF_MEMORY : FSDP2_ERR_BACKEND,
                       "oneDNN %s failed: %s", what, dnnl_status2str(s));
}

/* This thread's state, its stream created on its first GEMM. */
static fsdp2_status_t thread_state(thread_state_t **out)
{
    thread_state_t *ts = pthread_getspecific(g.thread_key);
    if (!ts) {
        ts = calloc(1, sizeof(*ts));
        if (!ts)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "no room for a GEMM thread's state");
        dnnl_status_t st = dnnl_stream_create(&ts->stream, g.engine, dnnl_stream_default_flags);
        if (st != dnnl_success) {
            free(ts);
            return dnnl_fail(st, "stream creation");
        }
        if (pthread_setspecific(g.thread_key, ts) != 0) {
            destroy_thread_state(ts);
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "no room for a GEMM thread's state");
        }
    }
    *out = ts;
    return FSDP2_SUCCESS;
}

static thread_memories_t *memories_slot(thread_memories_t *slots, size_t cap,
                                        const gemm_entry_t *e)
{
    size_t i = (size_t)(((uintptr_t)e >> 4) * 0x9e3779b97f4a7c15ull) & (cap - 1);
    while (slots[i].entry && slots[i].entry != e)
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

/* The thread's memory objects of entry e, made on its first use here. */
static fsdp2_status_t thread_memories(thread_state_t *ts, const gemm_entry_t *e,
                                      thread_memories_t **out)
{
    thread_memories_t *m = ts->cap ? memories_slot(ts->slots, ts->cap, e) : NULL;
    if (m && m->entry) {
        *out = m;
        return FSDP2_SUCCESS;
    }
    if (2 * (ts->count + 1) > ts->cap) {
        size_t cap = ts->cap ? 2 * ts->cap : 64;
        thread_memories_t *t = calloc(cap, sizeof(*t));
        if (!t)
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "no room for %zu GEMM memory sets", cap);
        for (size_t i = 0; i < ts->cap; i++)
            if (ts->slots[i].entry)
                *memories_slot(t, cap, ts->slots[i].entry) = ts->slots[i];
        free(ts->slots);
        ts->slots = t;
        ts->cap = cap;
    }
    thread_memories_t fresh = {.entry = e};
    const dnnl_memory_desc_t *mds[4] = {&e->a, &e->b, &e->c, e->key.bias ? &e->bias : NULL};
    dnnl_status_t s = dnnl_success;
    for (int j = 0; j < 4 && s == dnnl_success; j++)
        if (mds[j])
            s = dnnl_memory_create(&fresh.mem[j], mds[j], g.engine, DNNL_MEMORY_NONE);
    if (s != dnnl_success) {
        for (int j = 0; j < 4; j++)
            if (fresh.mem[j])
                dnnl_memory_destroy(fresh.mem[j]);
        return dnnl_fail(s, "memory creation");
    }
    __atomic_fetch_add(&g.memories, 3 + (mds[3] != NULL), __ATOMIC_RELAXED);
    m = memories_slot(ts->slots, ts->cap, e);
    *m = fresh;
    ts->count++;
    *out = m;
    return FSDP2_SUCCESS;
}

static uint64_t key_hash(const gemm_key_t *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof(*k); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static gemm_entry_t **slot_for(gemm_entry_t **table, size_t cap, const gemm_key_t *k)
{
    size_t i = (size_t)key_hash(k) & (cap - 1);
    while (table[i] && memcmp(&table[i]->key, k, sizeof(*k)) != 0)
        i = (i + 1) & (cap - 1);
    return &table[i];
}

/* Keeps the table at most half full; called with the lock held. */
static fsdp2_status_t grow(void)
{
    if (2 * (g.count + 1) <= g.cap)
        return FSDP2_SUCCESS;
    size_t cap = g.cap ? 2 * g.cap : 64;
    gemm_entry_t **t = calloc(cap, sizeof(*t));
    if (!t)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "no room for %zu GEMM primitives", cap);
    for (size_t i = 0; i < g.cap; i++)
        if (g.table[i])
            *slot_for(t, cap, &g.table[i]->key) = g.table[i];
    free(g.table);
    g.table = t;
    g.cap = cap;
    return FSDP2_SUCCESS;
}

/* Whether oneDNN picked its reference implementation ("ref:..."), plain loops that it
 * keeps for correctness where it has no kernel: many times slower than any fallback. */
static int is_reference(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, (void *)&impl) ==
               dnnl_success &&
           impl && strncmp(impl, "ref", 3) == 0;
}

/* The matmul for key: A [m, k], B [k, n], C [m, n] with the caller's strides, the bias
 * [1, n] when there is one; alpha as the output scale (1 with a bias), beta as a sum
 * post-op. Unimplemented leaves e->prim NULL. */
static fsdp2_status_t create_entry(const gemm_key_t *k, gemm_entry_t *e)
{
    dnnl_dims_t ad = {k->m, k->k}, bd = {k->k, k->n}, cd = {k->m, k->n};
    dnnl_dims_t as = {k->trans_a ? 1 : k->lda, k->trans_a ? k->lda : 1};
    dnnl_dims_t bs = {k->trans_b ? 1 : k->ldb, k->trans_b ? k->ldb : 1};
    dnnl_dims_t cs = {k->ldc, 1}, biasd = {1, k->n};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    dnnl_status_t s;
    e->key = *k;
    e->prim = NULL;
    memset(&e->bias, 0, sizeof(e->bias));
    if ((s = dnnl_memory_desc_init_by_strides(&e->a, 2, ad, (dnnl_data_type_t)k->dtype, as)) ||
        (s = dnnl_memory_desc_init_by_strides(&e->b, 2, bd, (dnnl_data_type_t)k->dtype, bs)) ||
        (s = dnnl_memory_desc_init_by_strides(&e->c, 2, cd, (dnnl_data_type_t)k->dst_dtype,
                                                  cs)) ||
        (k->bias && (s = dnnl_memory_desc_init_by_tag(&e->bias, 2, biasd, dnnl_f32, dnnl_ab))) ||
        (s = dnnl_matmul_desc_init(&md, &e->a, &e->b, k->bias ? &e->bias : NULL, &e->c)) ||
        (s = dnnl_primitive_attr_create(&attr)))
        goto done;
    if (k->alpha != 1.0f && (s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha)))
        goto done;
    if (k->beta != 0.0f) {
        if ((s = dnnl_post_ops_create(&ops)) || (s = dnnl_post_ops_append_sum(ops, k->beta)) ||
            (s = dnnl_primitive_attr_set_post_ops(attr, ops)))
            goto done;
    }
    s = dnnl_primitive_desc_create(&pd, &md, attr, g.engine, NULL);
    if (s == dnnl_success && is_reference(pd))
        s = dnnl_unimplemented; /* the fallback is faster than oneDNN's reference loops */
    if (s == dnnl_success)
        s = dnnl_primitive_create(&e->prim, pd);
done:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (ops)
        dnnl_post_ops_destroy(ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (s == dnnl_unimplemented) {
        FSDP2_LOG(DEBUG, NN, "oneDNN matmul m %lld n %lld k %lld: unimplemented, using sgemm",
                  (long long)k->m, (long long)k->n, (long long)k->k);
        e->prim = NULL;
        return FSDP2_SUCCESS;
    }
    return s == dnnl_success ? FSDP2_SUCCESS : dnnl_fail(s, "matmul creation");
}

/* The entry for key, created on its first use. */
static fsdp2_status_t lookup(const gemm_key_t *k, const gemm_entry_t **out)
{
    fsdp2_status_t st = FSDP2_SUCCESS;
    gemm_entry_t *fresh = NULL;
    pthread_mutex_lock(&g.lock);
    gemm_entry_t **slot = g.cap ? slot_for(g.table, g.cap, k) : NULL;
    if (!slot || !*slot) {
        FSDP2_CHECK_GOTO(grow(), st, done);
        fresh = malloc(sizeof(*fresh));
        if (!fresh) {
            st = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "no room for a GEMM primitive");
            goto done;
        }
        FSDP2_CHECK_GOTO(create_entry(k, fresh), st, done);
        slot = slot_for(g.table, g.cap, k);
        *slot = fresh;
        fresh = NULL;
        g.count++;
        FSDP2_LOG(DEBUG, NN, "GEMM primitive %zu made: m %lld n %lld k %lld, %s, %d threads%s",
                  g.count, (long long)k->m, (long long)k->n, (long long)k->k,
                  k->dtype == dnnl_bf16 ? "bf16" : "f32", (int)k->threads,
                  prep.on ? " (prepared)" : "");
    }
    *out = *slot;
done:
    pthread_mutex_unlock(&g.lock);
    free(fresh);
    return st;
}

static fsdp2_status_t run_matmul(const gemm_entry_t *e, const void *a, const void *b,
                                 const float *bias, float *c)
{
    thread_state_t *ts = NULL;
    thread_memories_t *m = NULL;
    FSDP2_CHECK(thread_state(&ts));
    FSDP2_CHECK(thread_memories(ts, e, &m));
    void *data[4] = {(void *)a, (void *)b, c, (void *)bias};
    dnnl_status_t s = dnnl_success;
    for (int j = 0; j < 4 && s == dnnl_success; j++)
        if (m->mem[j])
            s = dnnl_memory_set_data_handle(m->mem[j], data[j]);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m->mem[0]},
                                   {DNNL_ARG_WEIGHTS, m->mem[1]},
                                   {DNNL_ARG_DST, m->mem[2]},
                                   {DNNL_ARG_BIAS, m->mem[3]}};
        s = dnnl_primitive_execute(e->prim, ts->stream, bias ? 4 : 3, args);
        if (s == dnnl_success)
            s = dnnl_stream_wait(ts->stream);
    }
    return s == dnnl_success ? FSDP2_SUCCESS : dnnl_fail(s, "matmul");
}

static fsdp2_status_t engine_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                   float alpha, const float *a, int64_t lda, const float *b,
                                   int64_t ldb, float beta, const float *bias, float *c,
                                   int64_t ldc)
{
    pthread_once(&g.once, gemm_init);
    if (g.init_status != dnnl_success)
        return dnnl_fail(g.init_status, "engine creation");
    /* inside a parallel region oneDNN runs on the calling thread alone */
    gemm_key_t key = {.m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                      .trans_a = !!trans_a, .trans_b = !!trans_b,
                      .threads = nn_threads(), .bias = bias != NULL,
                      .dtype = dnnl_f32, .dst_dtype = dnnl_f32, .alpha = alpha, .beta = beta};
    const gemm_entry_t *e = NULL;
    FSDP2_CHECK(lookup(&key, &e));
    if (prep.on)
        return FSDP2_SUCCESS;
    if (e->prim)
        return run_matmul(e, a, b, bias, c);
    if (bias) { /* oneDNN's sgemm has no bias: C = beta C + bias, then beta 1 */
        scale_c(m, n, beta, bias, c, ldc);
        beta = 1.0f;
    }
    dnnl_status_t s = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                 lda, b, ldb, beta, c, ldc);
    return s == dnnl_success ? FSDP2_SUCCESS : dnnl_fail(s, "sgemm");
}

const char *nn_gemm_engine(void)
{
    return "onednn";
}

/* Whether the CPU has bf16 matrix instructions, from its CPUID feature flags:
 * AVX512-BF16 (leaf 7, sub-leaf 1, EAX bit 5) or AMX-BF16 (leaf 7, EDX bit 22). Without
 * them oneDNN would emulate bf16 in its kernels, no faster than f32. */
static int cpu_has_bf16_units(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    int avx512_bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5) & 1;
    int amx_bf16 = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22) & 1;
    return avx512_bf16 || amx_bf16;
#else
    return 1; /* elsewhere oneDNN's own checks decide (and its reference loops are refused) */
#endif
}

/* Whether bf16 GEMMs run on oneDNN's bf16 matmul here: the CPU has bf16 units and oneDNN
 * creates a kernel (not its reference loops) for a [16, 16] by [16, 16] one with f32 C. */
static int bf16_native;
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;

static void bf16_probe(void)
{
    pthread_once(&g.once, gemm_init);
    dnnl_dims_t d = {16, 16};
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    if (g.init_status == dnnl_success && cpu_has_bf16_units() &&
        dnnl_memory_desc_init_by_tag(&a, 2, d, dnnl_bf16, dnnl_ab) == dnnl_success &&
        dnnl_memory_desc_init_by_tag(&b, 2, d, dnnl_bf16, dnnl_ab) == dnnl_success &&
        dnnl_memory_desc_init_by_tag(&c, 2, d, dnnl_f32, dnnl_ab) == dnnl_success &&
        dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &md, NULL, g.engine, NULL) == dnnl_success &&
        !is_reference(pd) && dnnl_primitive_create(&prim, pd) == dnnl_success)
        bf16_native = 1;
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    FSDP2_LOG(INFO, NN, "bf16 GEMMs: %s",
              bf16_native ? "oneDNN's bf16 matmul"
                          : "emulated in f32 (no AVX512-BF16 or AMX-BF16 in the CPU's flags, "
                            "or oneDNN has no bf16 matmul kernel for it)");
}

int nn_gemm_bf16_native(void)
{
    pthread_once(&bf16_once, bf16_probe);
    return bf16_native;
}

static fsdp2_status_t native_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                  float alpha, const uint16_t *a, int64_t lda,
                                  const uint16_t *b, int64_t ldb, float beta, const float *bias,
                                  float *c, int64_t ldc, int *done)
{
    gemm_key_t key = {.m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                      .trans_a = !!trans_a, .trans_b = !!trans_b,
                      .threads = nn_threads(), .bias = bias != NULL,
                      .dtype = dnnl_bf16, .dst_dtype = dnnl_f32, .alpha = alpha, .beta = beta};
    const gemm_entry_t *e = NULL;
    FSDP2_CHECK(lookup(&key, &e)); /* the probe created the engine */
    *done = e->prim != NULL;
    return e->prim && !prep.on ? run_matmul(e, a, b, bias, c) : FSDP2_SUCCESS;
}

int64_t nn_gemm_primitives(void)
{
    pthread_mutex_lock(&g.lock);
    int64_t n = (int64_t)g.count;
    pthread_mutex_unlock(&g.lock);
    return n;
}

int64_t nn_gemm_memory_objects(void)
{
    return __atomic_load_n(&g.memories, __ATOMIC_RELAXED);
}

#else /* the BLAS */
#include <cblas.h>

char *openblas_get_corename(void);
void openblas_set_num_threads(int threads);

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_check(void)
{
    __builtin_cpu_init();
    const char *core = openblas_get_corename();
    const char *advice = nn_blas_coretype_advice(core, __builtin_cpu_supports("avx2"),
                                                 __builtin_cpu_supports("avx512f"));
    if (advice)
        FSDP2_LOG(WARN, NN,
                  "OpenBLAS picked its generic %s kernels on a CPU with %s: GEMMs run several "
                  "times slower; set OPENBLAS_CORETYPE=%s (or build with oneDNN, libdnnl-dev)",
                  core, __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2", advice);
}

static fsdp2_status_t engine_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                   float alpha, const float *a, int64_t lda, const float *b,
                                   int64_t ldb, float beta, const float *bias, float *c,
                                   int64_t ldc)
{
    pthread_once(&blas_once, blas_check);
    if (prep.on) /* the BLAS keeps nothing per shape */
        return FSDP2_SUCCESS;
    if (bias) { /* C = beta C + bias, then beta 1 */
        scale_c(m, n, beta, bias, c, ldc);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a, (int)lda, b,
                (int)ldb, beta, c, (int)ldc);
    return FSDP2_SUCCESS;
}

const char *nn_gemm_engine(void)
{
    return "blas";
}

int64_t nn_gemm_primitives(void)
{
    return 0;
}

int64_t nn_gemm_memory_objects(void)
{
    return 0;
}

int nn_gemm_bf16_native(void)
{
    return 0;
}

static fsdp2_status_t native_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                  float alpha, const uint16_t *a, int64_t lda,
                                  const uint16_t *b, int64_t ldb, float beta, const float *bias,
                                  float *c, int64_t ldc, int *done)
{
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
    (void)b, (void)ldb, (void)beta, (void)bias, (void)c, (void)ldc;
    *done = 0;
    return FSDP2_SUCCESS;
}

#endif
