/* The reduction of collectives: contributions summed in rank order, in f32 for 16- and
 * 32-bit floats (f64 for f64), rounded once. Blocks of elements keep the accumulator on
 * the stack and let the inner loops vectorise. */
#include "collectives/group_internal.h"
#include "core/dtype_convert.h"

#define BLOCK 512

static inline __attribute__((always_inline)) void load_block_f32(float *out, const void *src, fsdp2_dtype_t t, size_t base, size_t n)
{
    if (t == FSDP2_F32) {
        const float *s = (const float *)src + base;
        for (size_t i = 0; i < n; i++)
            out[i] = s[i];
    } else if (t == FSDP2_BF16) {
        const uint16_t *s = (const uint16_t *)src + base;
        for (size_t i = 0; i < n; i++)
            out[i] = cvt_bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src + base;
        for (size_t i = 0; i < n; i++)
            out[i] = cvt_f16_to_f32(s[i]);
    }
}

static inline __attribute__((always_inline)) void store_block_f32(void *dst, fsdp2_dtype_t t, size_t base, const float *in, size_t n)
{
    if (t == FSDP2_F32) {
        float *d = (float *)dst + base;
        for (size_t i = 0; i < n; i++)
            d[i] = in[i];
    } else if (t == FSDP2_BF16) {
        uint16_t *d = (uint16_t *)dst + base;
        for (size_t i = 0; i < n; i++)
            d[i] = cvt_f32_to_bf16(in[i]);
    } else {
        uint16_t *d = (uint16_t *)dst + base;
        for (size_t i = 0; i < n; i++)
            d[i] = cvt_f32_to_f16(in[i]);
    }
}

/* One block of m elements. Inlined twice: with m == BLOCK, a constant trip count lets
 * -O2's cheap vectoriser take every loop (it leaves loops of unknown count scalar), and
 * once for the tail. */
static inline __attribute__((always_inline)) void
reduce_block_f32_class(void *dst, fsdp2_dtype_t t, const void *const *src, int n, size_t base,
                       size_t m, float pre, float post, int divide_pre, int divide_post)
{
    float acc[BLOCK], x[BLOCK];
    if (t == FSDP2_F32 && !divide_pre) { /* no conversion: sum straight from the sources */
        const float *s0 = (const float *)src[0] + base;
        for (size_t i = 0; i < m; i++)
            acc[i] = s0[i];
        for (int r = 1; r < n; r++) {
            const float *s = (const float *)src[r] + base;
            for (size_t i = 0; i < m; i++)
                acc[i] = acc[i] + s[i];
        }
        float *d = (float *)dst + base;
        if (divide_post)
            for (size_t i = 0; i < m; i++)
                d[i] = acc[i] / post;
        else
            for (size_t i = 0; i < m; i++)
                d[i] = acc[i];
        return;
    }
    for (int r = 0; r < n; r++) {
        float *v = r == 0 ? acc : x;
        load_block_f32(v, src[r], t, base, m);
        if (divide_pre)
            for (size_t i = 0; i < m; i++)
                v[i] = v[i] / pre;
        if (r > 0)
            for (size_t i = 0; i < m; i++)
                acc[i] = acc[i] + x[i];
    }
    if (divide_post)
        for (size_t i = 0; i < m; i++)
            acc[i] = acc[i] / post;
    store_block_f32(dst, t, base, acc, m);
}

FSDP2_VECTOR_CLONES
static void reduce_f32_class(void *dst, fsdp2_dtype_t t, const void *const *src, int n,
                             size_t count, float pre, float post, int divide_pre, int divide_post)
{
    size_t base = 0;
    for (; base + BLOCK <= count; base += BLOCK)
        reduce_block_f32_class(dst, t, src, n, base, BLOCK, pre, post, divide_pre, divide_post);
    if (base < count)
        reduce_block_f32_class(dst, t, src, n, base, count - base, pre, post, divide_pre,
                               divide_post);
}

FSDP2_VECTOR_CLONES
static void reduce_f64(double *dst, const void *const *src, int n, size_t count, double pre,
                       double post, int divide_pre, int divide_post)
{
    double acc[BLOCK];
    for (size_t base = 0; base < count; base += BLOCK) {
        size_t m = count - base < BLOCK ? count - base : BLOCK;
        for (int r = 0; r < n; r++) {
            const double *s = (const double *)src[r] + base;
            for (size_t i = 0; i < m; i++) {
                double v = divide_pre ? s[i] / pre : s[i];
                acc[i] = r == 0 ? v : acc[i] + v;
            }
        }
        for (size_t i = 0; i < m; i++)
            dst[base + i] = divide_post ? acc[i] / post : acc[i];
    }
}

void fsdp2_reduce_rank_order(void *dst, fsdp2_dtype_t dtype, const void *const *src, int n,
                             size_t count, double pre, double post)
{
    if (dtype == FSDP2_F64)
        reduce_f64(dst, src, n, count, pre, post, pre != 1.0, post != 1.0);
    else
        reduce_f32_class(dst, dtype, src, n, count, (float)pre, (float)post, pre != 1.0,
                         post != 1.0);
}
