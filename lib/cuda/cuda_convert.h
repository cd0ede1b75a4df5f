/* Element conversions and arithmetic of the CUDA kernels, written once for device and
 * host.
 *
 * The kernels must give the same bits as the cpu backend (fsdp2/dtype.h), so nothing
 * here uses the GPU's conversion instructions or float intrinsics whose rounding or NaN
 * handling differs from the host (cvt.rn.f16.f32 makes NaNs canonical, nvcc contracts
 * a * b + c into an FMA): every rounding to bf16/f16 is integer code on the bit
 * patterns, NaNs are built by hand, and products and sums use the _rn intrinsics that
 * are never contracted. The header is plain C11 as well as CUDA C++, so that
 * tests/gpu/test_cuda_convert.c can run exactly this code on the host and compare it
 * with the cpu backend on every 16-bit pattern and many others, on a machine without
 * a GPU.
 *
 * The rules, and the paths through them, are those of lib/core/dtype_convert.h: f32 ->
 * bf16 by the add-and-shift trick, other roundings to bf16/f16 from the exact value in
 * one step, i64 beyond 2^53 through a round-to-odd f64, f32 <-> f64 NaNs quieted with
 * sign and payload kept (what x86's cvtss2sd/cvtsd2ss do).
 *
 * The dtype arguments are compile-time constants in the kernels (template
 * parameters), so every switch below folds away there. */
#ifndef FSDP2_CUDA_CONVERT_H
#define FSDP2_CUDA_CONVERT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <fsdp2/dtype.h>

#ifdef __CUDACC__
#define FSDP2_CU_FN static __host__ __device__ __forceinline__
#else
#define FSDP2_CU_FN static inline
#endif

/* ---- bit casts ---------------------------------------------------------------- */

FSDP2_CU_FN uint32_t fsdp2_cu_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

FSDP2_CU_FN float fsdp2_cu_f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

FSDP2_CU_FN uint64_t fsdp2_cu_f64_bits(double d)
{
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(d);
#else
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
#endif
}

FSDP2_CU_FN double fsdp2_cu_f64_from_bits(uint64_t u)
{
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
#endif
}

/* ---- products and sums, never fused ------------------------------------------ */

FSDP2_CU_FN float fsdp2_cu_fmul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

FSDP2_CU_FN float fsdp2_cu_fadd(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

FSDP2_CU_FN double fsdp2_cu_dmul(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

FSDP2_CU_FN double fsdp2_cu_dadd(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

/* IEEE division, correctly rounded (nvcc's default -prec-div=true gives the same; the
 * intrinsics make it independent of flags). */
FSDP2_CU_FN float fsdp2_cu_fdiv(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

FSDP2_CU_FN double fsdp2_cu_ddiv(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}

/* ---- rounding to the 16-bit float formats -------------------------------------- */

/* sig / 2^shift rounded to an integer, ties to even; 1 <= shift <= 63. */
FSDP2_CU_FN uint64_t fsdp2_cu_round_shift64(uint64_t sig, unsigned shift)
{
    uint64_t q = sig >> shift;
    uint64_t rem = sig & ((UINT64_C(1) << shift) - 1);
    uint64_t half = UINT64_C(1) << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return q;
}

FSDP2_CU_FN uint32_t fsdp2_cu_round_shift32(uint32_t sig, unsigned shift)
{
    uint32_t q = sig >> shift;
    uint32_t rem = sig & ((UINT32_C(1) << shift) - 1);
    uint32_t half = UINT32_C(1) << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return q;
}

/* A quiet NaN of a 16-bit format (man_bits of fraction) keeping sign and the top
 * fraction bits of the source NaN, as the x86 conversion instructions do. */
FSDP2_CU_FN uint16_t fsdp2_cu_half_nan(uint16_t sign, int man_bits, uint64_t top_fraction)
{
    uint16_t exp_all = (uint16_t)(((1u << (15 - man_bits)) - 1) << man_bits);
    uint16_t quiet = (uint16_t)(1u << (man_bits - 1));
    return (uint16_t)(sign | exp_all | quiet | (uint16_t)top_fraction);
}

/* Rounds the f64 with bits u to a 1-exp_bits-man_bits format of 16 bits (bf16: 8/7,
 * f16: 5/10) in one step. Normal and subnormal results share one path: the target
 * exponent te decides how far the 53-bit significand is shifted, and adding the
 * rounded significand to (te - 1) << man_bits carries a round-up into the exponent
 * (up to infinity) by itself. */
FSDP2_CU_FN uint16_t fsdp2_cu_f64_to_half(uint64_t u, int exp_bits, int man_bits)
{
    uint16_t sign = (uint16_t)((u >> 48) & 0x8000u);
    uint64_t a = u & UINT64_C(0x7fffffffffffffff);
    int max_exp = (1 << exp_bits) - 1;
    int bias = (1 << (exp_bits - 1)) - 1;
    uint16_t inf = (uint16_t)(max_exp << man_bits);
    if (a > UINT64_C(0x7ff0000000000000))
        return fsdp2_cu_half_nan(sign, man_bits,
                                 (a >> (52 - man_bits)) & ((UINT64_C(1) << man_bits) - 1));
    if (a == UINT64_C(0x7ff0000000000000))
        return (uint16_t)(sign | inf);
    int e = (int)(a >> 52);
    uint64_t sig = a & ((UINT64_C(1) << 52) - 1);
    if (e == 0)
        e = 1; /* f64 subnormal: no implicit bit */
    else
        sig |= UINT64_C(1) << 52;
    int te = e - 1023 + bias;
    if (te >= max_exp)
        return (uint16_t)(sign | inf);
    int shift = 52 - man_bits + (te < 1 ? 1 - te : 0);
    if (shift > 63)
        return sign; /* below half the smallest subnormal */
    uint64_t q = fsdp2_cu_round_shift64(sig, (unsigned)shift);
    uint64_t base = te >= 1 ? (uint64_t)(te - 1) << man_bits : 0;
    return (uint16_t)(sign | (uint16_t)(base + q));
}

/* The same from f32 bits, in 32-bit arithmetic (cheaper on the GPU). */
FSDP2_CU_FN uint16_t fsdp2_cu_f32_to_half(uint32_t u, int exp_bits, int man_bits)
{
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    int max_exp = (1 << exp_bits) - 1;
    int bias = (1 << (exp_bits - 1)) - 1;
    uint16_t inf = (uint16_t)(max_exp << man_bits);
    if (a > 0x7f800000u)
        return fsdp2_cu_half_nan(sign, man_bits, (a >> (23 - man_bits)) & ((1u << man_bits) - 1));
    if (a == 0x7f800000u)
        return (uint16_t)(sign | inf);
    int e = (int)(a >> 23);
    uint32_t sig = a & 0x7fffffu;
    if (e == 0)
        e = 1;
    else
        sig |= 0x800000u;
    int te = e - 127 + bias;
    if (te >= max_exp)
        return (uint16_t)(sign | inf);
    int shift = 23 - man_bits + (te < 1 ? 1 - te : 0);
    if (shift > 31)
        return sign;
    uint32_t q = fsdp2_cu_round_shift32(sig, (unsigned)shift);
    uint32_t base = te >= 1 ? (uint32_t)(te - 1) << man_bits : 0;
    return (uint16_t)(sign | (uint16_t)(base + q));
}

/* f32 -> bf16 keeps f32's exponent range, so rounding is one add on the bits (a carry
 * out of the fraction moves into the exponent, up to infinity). */
FSDP2_CU_FN uint16_t fsdp2_cu_f32_to_bf16(float f)
{
    uint32_t u = fsdp2_cu_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

FSDP2_CU_FN uint16_t fsdp2_cu_f32_to_f16(float f)
{
    return fsdp2_cu_f32_to_half(fsdp2_cu_f32_bits(f), 5, 10);
}

FSDP2_CU_FN uint16_t fsdp2_cu_f64_to_bf16(double d)
{
    return fsdp2_cu_f64_to_half(fsdp2_cu_f64_bits(d), 8, 7);
}

FSDP2_CU_FN uint16_t fsdp2_cu_f64_to_f16(double d)
{
    return fsdp2_cu_f64_to_half(fsdp2_cu_f64_bits(d), 5, 10);
}

/* ---- widening (exact) ------------------------------------------------------------ */

FSDP2_CU_FN float fsdp2_cu_bf16_to_f32(uint16_t h)
{
    return fsdp2_cu_f32_from_bits((uint32_t)h << 16);
}

FSDP2_CU_FN float fsdp2_cu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f)
        return fsdp2_cu_f32_from_bits(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0)
            return fsdp2_cu_f32_from_bits(sign);
        e = 113; /* subnormal: normalise; 2^(113 - 127) * 0.m = 2^-14 * 0.m */
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        m &= 0x3ffu;
        return fsdp2_cu_f32_from_bits(sign | (e << 23) | (m << 13));
    }
    return fsdp2_cu_f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

/* f32 <-> f64 round (or widen) in hardware the same way on both sides, except for
 * NaNs, which the GPU may make canonical: those keep sign and payload, quieted. */
FSDP2_CU_FN double fsdp2_cu_f32_to_f64(float f)
{
    uint32_t u = fsdp2_cu_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return fsdp2_cu_f64_from_bits(((uint64_t)(u & 0x80000000u) << 32) |
                                      UINT64_C(0x7ff8000000000000) |
                                      ((uint64_t)(u & 0x7fffffu) << 29));
    return (double)f;
}

FSDP2_CU_FN float fsdp2_cu_f64_to_f32(double d)
{
    uint64_t u = fsdp2_cu_f64_bits(d);
    if ((u & UINT64_C(0x7fffffffffffffff)) > UINT64_C(0x7ff0000000000000))
        return fsdp2_cu_f32_from_bits((uint32_t)((u >> 32) & 0x80000000u) | 0x7fc00000u |
                                      (uint32_t)((u >> 29) & 0x7fffffu));
    return (float)d;
}

/* ---- to integers: truncate toward zero, saturate, NaN -> 0 -------------------- */

FSDP2_CU_FN int64_t fsdp2_cu_f64_to_i64(double d)
{
    if (d != d)
        return 0;
    if (d >= 9223372036854775808.0)
        return INT64_MAX;
    if (d <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)d;
}

FSDP2_CU_FN int32_t fsdp2_cu_f64_to_i32(double d)
{
    if (d != d)
        return 0;
    if (d >= 2147483647.0)
        return INT32_MAX;
    if (d <= -2147483648.0)
        return INT32_MIN;
    return (int32_t)d;
}

FSDP2_CU_FN uint8_t fsdp2_cu_f64_to_u8(double d)
{
    if (d != d || d <= 0.0)
        return 0;
    if (d >= 255.0)
        return 255;
    return (uint8_t)d;
}

FSDP2_CU_FN int32_t fsdp2_cu_i64_to_i32(int64_t v)
{
    return v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
}

FSDP2_CU_FN uint8_t fsdp2_cu_i64_to_u8(int64_t v)
{
    return v > 255 ? 255 : v < 0 ? 0 : (uint8_t)v;
}

/* ---- loads and stores by dtype -------------------------------------------------- */

FSDP2_CU_FN int fsdp2_cu_is_float(fsdp2_dtype_t dt)
{
    return dt == FSDP2_F32 || dt == FSDP2_F64 || dt == FSDP2_BF16 || dt == FSDP2_F16;
}

/* The dtypes whose arithmetic is done in f32 (f64 and the integers use f64). */
FSDP2_CU_FN int fsdp2_cu_is_f32_class(fsdp2_dtype_t dt)
{
    return dt == FSDP2_F32 || dt == FSDP2_BF16 || dt == FSDP2_F16;
}

/* Only for f32, bf16, f16: exact. */
FSDP2_CU_FN float fsdp2_cu_load_f32(fsdp2_dtype_t dt, const void *p, size_t i)
{
    switch (dt) {
    case FSDP2_BF16:
        return fsdp2_cu_bf16_to_f32(((const uint16_t *)p)[i]);
    case FSDP2_F16:
        return fsdp2_cu_f16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

/* Any dtype: exact except i64 beyond 2^53 (rounded to nearest even). */
FSDP2_CU_FN double fsdp2_cu_load_f64(fsdp2_dtype_t dt, const void *p, size_t i)
{
    switch (dt) {
    case FSDP2_F32:
    case FSDP2_BF16:
    case FSDP2_F16:
        return fsdp2_cu_f32_to_f64(fsdp2_cu_load_f32(dt, p, i));
    case FSDP2_F64:
        return ((const double *)p)[i];
    case FSDP2_I32:
        return (double)((const int32_t *)p)[i];
    case FSDP2_I64:
        return (double)((const int64_t *)p)[i];
    default:
        return (double)((const uint8_t *)p)[i];
    }
}

/* Only for i32, i64, u8. */
FSDP2_CU_FN int64_t fsdp2_cu_load_i64(fsdp2_dtype_t dt, const void *p, size_t i)
{
    switch (dt) {
    case FSDP2_I32:
        return ((const int32_t *)p)[i];
    case FSDP2_I64:
        return ((const int64_t *)p)[i];
    default:
        return ((const uint8_t *)p)[i];
    }
}

/* Only for f32, bf16, f16: one rounding. */
FSDP2_CU_FN void fsdp2_cu_store_f32(fsdp2_dtype_t dt, void *p, size_t i, float v)
{
    switch (dt) {
    case FSDP2_BF16:
        ((uint16_t *)p)[i] = fsdp2_cu_f32_to_bf16(v);
        break;
    case FSDP2_F16:
        ((uint16_t *)p)[i] = fsdp2_cu_f32_to_f16(v);
        break;
    default:
        ((float *)p)[i] = v;
        break;
    }
}

/* Any dtype: one rounding (or truncation with saturation for the integers). */
FSDP2_CU_FN void fsdp2_cu_store_f64(fsdp2_dtype_t dt, void *p, size_t i, double v)
{
    switch (dt) {
    case FSDP2_F32:
        ((float *)p)[i] = fsdp2_cu_f64_to_f32(v);
        break;
    case FSDP2_F64:
        ((double *)p)[i] = v;
        break;
    case FSDP2_BF16:
        ((uint16_t *)p)[i] = fsdp2_cu_f64_to_bf16(v);
        break;
    case FSDP2_F16:
        ((uint16_t *)p)[i] = fsdp2_cu_f64_to_f16(v);
        break;
    case FSDP2_I32:
        ((int32_t *)p)[i] = fsdp2_cu_f64_to_i32(v);
        break;
    case FSDP2_I64:
        ((int64_t *)p)[i] = fsdp2_cu_f64_to_i64(v);
        break;
    default:
        ((uint8_t *)p)[i] = fsdp2_cu_f64_to_u8(v);
        break;
    }
}

/* v as the f64 nearest to it rounded to odd: exact below 2^53; beyond, the 53 leading
 * bits with the last one forced to 1 when anything nonzero was dropped. Rounding that
 * to bf16/f16 (8 and 11 bits) then gives the correctly rounded integer, as one rounding
 * would. Built on the bits, so host and device agree without ldexp. */
FSDP2_CU_FN double fsdp2_cu_i64_to_f64_odd(int64_t v)
{
    uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    if (mag < (UINT64_C(1) << 53))
        return v < 0 ? -(double)mag : (double)mag;
    int top = 63;
    while (!(mag >> top))
        top--;
    int drop = top - 52; /* 1 .. 11 */
    uint64_t kept = mag >> drop;
    if (mag & ((UINT64_C(1) << drop) - 1))
        kept |= 1;
    uint64_t bits = ((uint64_t)(1023 + top) << 52) | (kept & ((UINT64_C(1) << 52) - 1));
    if (v < 0)
        bits |= UINT64_C(1) << 63;
    return fsdp2_cu_f64_from_bits(bits);
}

/* An integer into any dtype: integers saturate; floats get one rounding of the exact
 * integer (f32 and f64 by the hardware's integer conversion, which rounds to nearest
 * even on both sides; bf16/f16 through fsdp2_cu_i64_to_f64_odd). */
FSDP2_CU_FN void fsdp2_cu_store_i64(fsdp2_dtype_t dt, void *p, size_t i, int64_t v)
{
    switch (dt) {
    case FSDP2_F32:
        ((float *)p)[i] = (float)v;
        break;
    case FSDP2_F64:
        ((double *)p)[i] = (double)v;
        break;
    case FSDP2_BF16:
        ((uint16_t *)p)[i] = fsdp2_cu_f64_to_bf16(fsdp2_cu_i64_to_f64_odd(v));
        break;
    case FSDP2_F16:
        ((uint16_t *)p)[i] = fsdp2_cu_f64_to_f16(fsdp2_cu_i64_to_f64_odd(v));
        break;
    case FSDP2_I32:
        ((int32_t *)p)[i] = fsdp2_cu_i64_to_i32(v);
        break;
    case FSDP2_I64:
        ((int64_t *)p)[i] = v;
        break;
    default:
        ((uint8_t *)p)[i] = fsdp2_cu_i64_to_u8(v);
        break;
    }
}

/* ---- the element operations of the kernels -------------------------------------- */

FSDP2_CU_FN void fsdp2_cu_copy_same(fsdp2_dtype_t dt, void *dst, size_t i, const void *src,
                                    size_t j)
{
    switch (dt) {
    case FSDP2_F64:
    case FSDP2_I64:
        ((uint64_t *)dst)[i] = ((const uint64_t *)src)[j];
        break;
    case FSDP2_F32:
    case FSDP2_I32:
        ((uint32_t *)dst)[i] = ((const uint32_t *)src)[j];
        break;
    case FSDP2_BF16:
    case FSDP2_F16:
        ((uint16_t *)dst)[i] = ((const uint16_t *)src)[j];
        break;
    default:
        ((uint8_t *)dst)[i] = ((const uint8_t *)src)[j];
        break;
    }
}

/* dst[i] = (dst_dtype) src[j]. Between f32/bf16/f16 the value goes through f32 (exact
 * widening, one rounding); from integers through i64 (exact); otherwise through f64
 * (exact widening, one rounding or truncation). */
FSDP2_CU_FN void fsdp2_cu_convert_elem(fsdp2_dtype_t dst_dtype, void *dst, size_t i,
                                       fsdp2_dtype_t src_dtype, const void *src, size_t j)
{
    if (dst_dtype == src_dtype)
        fsdp2_cu_copy_same(dst_dtype, dst, i, src, j);
    else if (fsdp2_cu_is_f32_class(dst_dtype) && fsdp2_cu_is_f32_class(src_dtype))
        fsdp2_cu_store_f32(dst_dtype, dst, i, fsdp2_cu_load_f32(src_dtype, src, j));
    else if (!fsdp2_cu_is_float(src_dtype))
        fsdp2_cu_store_i64(dst_dtype, dst, i, fsdp2_cu_load_i64(src_dtype, src, j));
    else
        fsdp2_cu_store_f64(dst_dtype, dst, i, fsdp2_cu_load_f64(src_dtype, src, j));
}

/* y[i] = y[i] + alpha * x[i], in f32 when both are f32/bf16/f16 (alpha32 = alpha
 * rounded to f32), in f64 otherwise; the product is rounded, then the sum, then the
 * store (no FMA). */
FSDP2_CU_FN void fsdp2_cu_accumulate_elem(fsdp2_dtype_t y_dtype, void *y, fsdp2_dtype_t x_dtype,
                                          const void *x, size_t i, float alpha32,
                                          double alpha64)
{
    if (fsdp2_cu_is_f32_class(y_dtype) && fsdp2_cu_is_f32_class(x_dtype)) {
        float r = fsdp2_cu_fadd(fsdp2_cu_load_f32(y_dtype, y, i),
                                fsdp2_cu_fmul(alpha32, fsdp2_cu_load_f32(x_dtype, x, i)));
        fsdp2_cu_store_f32(y_dtype, y, i, r);
    } else {
        double r = fsdp2_cu_dadd(fsdp2_cu_load_f64(y_dtype, y, i),
                                 fsdp2_cu_dmul(alpha64, fsdp2_cu_load_f64(x_dtype, x, i)));
        fsdp2_cu_store_f64(y_dtype, y, i, r);
    }
}

/* y[i] = x[i] / pre / post, each division skipped when its factor is 1, in f32 for
 * f32/bf16/f16 (pre32, post32: the factors rounded to f32) and in f64 for f64, rounded
 * once to the dtype: what fsdp2_reduce_rank_order gives for one source. */
FSDP2_CU_FN void fsdp2_cu_divide_elem(fsdp2_dtype_t dt, void *y, const void *x, size_t i,
                                      float pre32, float post32, double pre64, double post64)
{
    if (dt == FSDP2_F64) {
        double v = ((const double *)x)[i];
        if (pre64 != 1.0)
            v = fsdp2_cu_ddiv(v, pre64);
        if (post64 != 1.0)
            v = fsdp2_cu_ddiv(v, post64);
        ((double *)y)[i] = v;
    } else {
        float v = fsdp2_cu_load_f32(dt, x, i);
        if (pre64 != 1.0)
            v = fsdp2_cu_fdiv(v, pre32);
        if (post64 != 1.0)
            v = fsdp2_cu_fdiv(v, post32);
        fsdp2_cu_store_f32(dt, y, i, v);
    }
}

/* Element size of a dtype; 0 for an unknown one. A constant expression in CUDA C++
 * (the kernels size their packs with it). */
#ifdef __cplusplus
#define FSDP2_CU_CONSTEXPR constexpr
#else
#define FSDP2_CU_CONSTEXPR
#endif
FSDP2_CU_FN FSDP2_CU_CONSTEXPR size_t fsdp2_cu_dtype_size(fsdp2_dtype_t dt)
{
    switch (dt) {
#define FSDP2_CU_SIZE_CASE_(name, id, bytes, str) \
    case FSDP2_##name:                            \
        return bytes;
        FSDP2_DTYPE_MAP(FSDP2_CU_SIZE_CASE_)
#undef FSDP2_CU_SIZE_CASE_
    default:
        return 0;
    }
}

#endif
