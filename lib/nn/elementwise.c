/* Element-wise layers: GELU, ReLU, SwiGLU's gate, dropout, the residual add and zeroing, in
 * chunks of FSDP2_PAR_CHUNK elements split among the pool's threads. */
#include <math.h>
#include <string.h>

#include <fsdp2/random.h>

#include "core/dtype_convert.h"
#include "nn_common.h"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* for each chunk [lo, lo + len) of n elements, on the pool's threads (one chunk: here) */
#define FOR_CHUNKS(n, lo, len)                                                          \
    FSDP2_OMP("omp parallel for schedule(static) if((n) > FSDP2_PAR_CHUNK)")           \
    for (int64_t lo = 0; lo < (n); lo += FSDP2_PAR_CHUNK)                               \
        for (int64_t len = (n) - lo < FSDP2_PAR_CHUNK ? (n) - lo : FSDP2_PAR_CHUNK; len; \
             len = 0)

static fsdp2_status_t check_n(int64_t n, int pointers_ok)
{
    FSDP2_ARG_CHECK(n >= 0, "n = %lld is negative", (long long)n);
    FSDP2_ARG_CHECK(pointers_ok || n == 0, "an array is NULL (n = %lld)", (long long)n);
    return FSDP2_SUCCESS;
}

FSDP2_VECTOR_CLONES
static void gelu(const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + nn_tanhf(GELU_K * (v + GELU_C * v * v * v)));
    }
}

FSDP2_VECTOR_CLONES
static void gelu_grad(const float *restrict x, const float *restrict dy, float *restrict dx,
                      int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], t = nn_tanhf(GELU_K * (v + GELU_C * v * v * v));
        float d = 0.5f * (1.0f + t) +
                  0.5f * v * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * v * v);
        dx[i] += dy[i] * d;
    }
}

fsdp2_status_t fsdp2_nn_gelu_forward(const float *x, int64_t n, float *y)
{
    FSDP2_CHECK(check_n(n, x && y));
    FOR_CHUNKS(n, lo, len)
        gelu(x + lo, y + lo, len);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_gelu_backward(const float *x, const float *dy, int64_t n, float *dx)
{
    FSDP2_CHECK(check_n(n, x && dy && dx));
    FSDP2_ARG_CHECK(dx != dy && dx != x, "dx aliases x or dy: the backward adds into dx");
    FOR_CHUNKS(n, lo, len)
        gelu_grad(x + lo, dy + lo, dx + lo, len);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_relu_forward(const float *x, int64_t n, float *y)
{
    FSDP2_CHECK(check_n(n, x && y));
    FOR_CHUNKS(n, lo, len)
        for (int64_t i = lo; i < lo + len; i++)
            y[i] = x[i] > 0 ? x[i] : 0.0f;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_relu_backward(const float *y, const float *dy, int64_t n, float *dx)
{
    FSDP2_CHECK(check_n(n, y && dy && dx));
    FSDP2_ARG_CHECK(dx != dy || n == 0, "dx aliases dy: the backward adds into dx");
    FOR_CHUNKS(n, lo, len)
        for (int64_t i = lo; i < lo + len; i++)
            dx[i] += y[i] > 0 ? dy[i] : 0.0f;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_p(double p)
{
    FSDP2_ARG_CHECK(p >= 0 && p < 1, "dropout probability %g is outside [0, 1)", p);
    return FSDP2_SUCCESS;
}

/* The mask of elements [offset, offset + n): m[i] = 0 with probability p, else keep.
 * Element e uses word e % 4 of Philox block e / 4 of the stream keyed by seed. The
 * mask is applied as out[i] = (accumulate ? out[i] : 0) + in[i] * m[i]. */
static void apply_mask(const float *in, float *out, int64_t n, double p, uint64_t seed,
                       uint64_t offset, int accumulate)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    float keep = (float)(1.0 / (1.0 - p));
    uint32_t r[4];
    uint64_t have = UINT64_MAX;
    for (int64_t i = 0; i < n; i++) {
        uint64_t index = offset + (uint64_t)i, block = index / 4;
        if (block != have) {
            const uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0x64726f70u, 0};
            fsdp2_philox4x32(counter, key, r);
            have = block;
        }
        float m = (double)r[index % 4] * 0x1.0p-32 < p ? 0.0f : keep;
        out[i] = (accumulate ? out[i] : 0.0f) + in[i] * m;
    }
}

fsdp2_status_t fsdp2_nn_dropout_forward(const float *x, int64_t n, double p, uint64_t seed,
                                        uint64_t offset, float *y)
{
    FSDP2_CHECK(check_n(n, x && y));
    FSDP2_CHECK(check_p(p));
    if (p == 0) {
        if (y != x)
            memmove(y, x, sizeof(float) * (size_t)n);
        return FSDP2_SUCCESS;
    }
    FOR_CHUNKS(n, lo, len)
        apply_mask(x + lo, y + lo, len, p, seed, offset + (uint64_t)lo, 0);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_dropout_backward(const float *dy, int64_t n, double p, uint64_t seed,
                                         uint64_t offset, float *dx)
{
    FSDP2_CHECK(check_n(n, dy && dx));
    FSDP2_CHECK(check_p(p));
    FSDP2_ARG_CHECK(dx != dy || n == 0, "dx aliases dy: the backward adds into dx");
    if (p == 0) {
        FOR_CHUNKS(n, lo, len)
            for (int64_t i = lo; i < lo + len; i++)
                dx[i] += dy[i];
        return FSDP2_SUCCESS;
    }
    FOR_CHUNKS(n, lo, len)
        apply_mask(dy + lo, dx + lo, len, p, seed, offset + (uint64_t)lo, 1);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_residual_forward(const float *a, const float *b, int64_t n, float *y)
{
    FSDP2_CHECK(check_n(n, a && b && y));
    FOR_CHUNKS(n, lo, len)
        for (int64_t i = lo; i < lo + len; i++)
            y[i] = a[i] + b[i];
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_residual_backward(const float *dy, int64_t n, float *da, float *db)
{
    FSDP2_CHECK(check_n(n, dy != NULL));
    FSDP2_ARG_CHECK((da != dy && db != dy) || n == 0, "da or db aliases dy");
    FOR_CHUNKS(n, lo, len) {
        for (int64_t i = lo; da && i < lo + len; i++)
            da[i] += dy[i];
        for (int64_t i = lo; db && i < lo + len; i++)
            db[i] += dy[i];
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_zero(float *x, int64_t n)
{
    FSDP2_CHECK(check_n(n, x != NULL));
    FOR_CHUNKS(n, lo, len)
        memset(x + lo, 0, sizeof(float) * (size_t)len);
    return FSDP2_SUCCESS;
}

/* silu(g) = g sigmoid(g); sigmoid through nn_expf, which saturates without NaN. */
static inline float sigmoid(float g)
{
    return 1.0f / (1.0f + nn_expf(-g));
}

FSDP2_VECTOR_CLONES
static void swiglu(const float *gate, const float *up, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        y[i] = g * sigmoid(g) * up[i];
    }
}

fsdp2_status_t fsdp2_nn_swiglu_forward(const float *gate, const float *up, int64_t n, float *y)
{
    FSDP2_CHECK(check_n(n, gate && up && y));
    FOR_CHUNKS(n, lo, len)
        swiglu(gate + lo, up + lo, y + lo, len);
    return FSDP2_SUCCESS;
}

/* dup += dy silu(g), dgate += dy up silu'(g), either NULL: a loop per case, each without
 * a branch, so that each vectorises. */
FSDP2_VECTOR_CLONES
static void swiglu_grad(const float *gate, const float *up, const float *dy, float *dgate,
                        float *dup, int64_t n)
{
    if (dgate && dup) {
        for (int64_t i = 0; i < n; i++) {
            float g = gate[i], s = sigmoid(g);
            dup[i] += dy[i] * (g * s);
            dgate[i] += dy[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
        }
    } else if (dup) {
        for (int64_t i = 0; i < n; i++) {
            float g = gate[i];
            dup[i] += dy[i] * (g * sigmoid(g));
        }
    } else if (dgate) {
        for (int64_t i = 0; i < n; i++) {
            float g = gate[i], s = sigmoid(g);
            dgate[i] += dy[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
        }
    }
}

fsdp2_status_t fsdp2_nn_swiglu_backward(const float *gate, const float *up, const float *dy,
                                        int64_t n, float *dgate, float *dup)
{
    FSDP2_CHECK(check_n(n, gate && up && dy));
    const float *in[3] = {gate, up, dy};
    for (int i = 0; i < 3; i++)
        FSDP2_ARG_CHECK((!dgate || dgate != in[i]) && (!dup || dup != in[i]),
                        "dgate or dup aliases gate, up or dy: the backward adds into them");
    FOR_CHUNKS(n, lo, len)
        swiglu_grad(gate + lo, up + lo, dy + lo, dgate ? dgate + lo : NULL, dup ? dup + lo : NULL,
                    len);
    return FSDP2_SUCCESS;
}
