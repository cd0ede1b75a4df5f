/* Element conversions shared by fsdp2_convert and the cpu kernels. Inline so the
 * kernels' loops vectorise. The rules are those of include/fsdp2/dtype.h.
 *
 * Every conversion into bf16/f16 is one correct rounding: f32 inputs take the usual
 * bit trick; everything else goes through round_f64_to_half(), which rounds the exact
 * binary64 value, and i64 inputs beyond 2^53 reach it rounded-to-odd so the second
 * rounding is still exact. */
#ifndef FSDP2_CORE_DTYPE_CONVERT_H
#define FSDP2_CORE_DTYPE_CONVERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <fsdp2/dtype.h>

#include "core/vector_clones.h"

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline float cvt_bf16_to_f32(uint16_t b)
{
    return f32_from_bits((uint32_t)b << 16);
}

/* Branch-free so that loops over it vectorise. */
static inline uint16_t cvt_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t nan = (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    uint32_t quiet = (u >> 16) | 0x0040u;             /* quiet NaN, sign and top payload kept */
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; /* nearest, ties to even */
    return (uint16_t)(nan ? quiet : rounded);
}

static inline float cvt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f)
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp != 0)
        return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in f32 */
    float v = (float)man * 5.9604644775390625e-08f;
    return sign ? -v : v;
}

static inline uint16_t cvt_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520: the tie above 65504 rounds to even, i.e. inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal in f16: rebias the exponent, round 13 bits off */
        uint32_t r = ax - 0x38000000u;
        uint32_t q = r >> 13, rem = r & 0x1fffu;
        q += (rem > 0x1000u) || (rem == 0x1000u && (q & 1u));
        return (uint16_t)(sign | q);
    }
    uint32_t e = ax >> 23;
    if (e < 102) /* below 2^-25: rounds to zero */
        return sign;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14 .. 24: units of 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    q += (rem > half) || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

/* Rounds binary64 d to a binary16-like format with exp_bits and man_bits (bf16: 8,7;
 * f16: 5,10), to nearest, ties to even. */
static inline uint16_t round_f64_to_half(double d, int exp_bits, int man_bits)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    uint16_t sign = (uint16_t)((u >> 48) & 0x8000u);
    uint64_t au = u & 0x7fffffffffffffffull;
    uint16_t exp_all = (uint16_t)(((1u << exp_bits) - 1u) << man_bits);
    if (au > 0x7ff0000000000000ull) /* NaN: quiet, sign and top payload kept */
        return (uint16_t)(sign | exp_all | (1u << (man_bits - 1)) |
                          (uint16_t)((au >> (52 - man_bits)) & ((1u << man_bits) - 1u)));
    if (au == 0x7ff0000000000000ull)
        return (uint16_t)(sign | exp_all);
    int e64 = (int)(au >> 52);
    if (e64 == 0) /* zero or f64 subnormal: far below either format */
        return sign;
    int bias = (1 << (exp_bits - 1)) - 1;
    int e = e64 - 1023;
    int emin = 1 - bias;
    uint64_t m = (au & 0xfffffffffffffull) | (1ull << 52);
    int shift = 52 - man_bits + (e < emin ? emin - e : 0);
    if (shift > 53)
        return sign;
    uint64_t q = m >> shift, rem = m & ((1ull << shift) - 1ull), half = 1ull << (shift - 1);
    q += (rem > half) || (rem == half && (q & 1u));
    if (e < emin) /* subnormal: q counts units of 2^(emin - man_bits); a carry into the
                     exponent field encodes the smallest normal correctly */
        return (uint16_t)(sign | q);
    if (q >> (man_bits + 1)) { /* rounding carried out of the significand */
        q >>= 1;
        e++;
    }
    if (e > bias)
        return (uint16_t)(sign | exp_all);
    return (uint16_t)(sign | ((uint32_t)(e + bias) << man_bits) | (q & ((1u << man_bits) - 1u)));
}

static inline uint16_t cvt_f64_to_bf16(double d)
{
    return round_f64_to_half(d, 8, 7);
}

static inline uint16_t cvt_f64_to_f16(double d)
{
    return round_f64_to_half(d, 5, 10);
}

/* v as a double rounded to odd: exact below 2^53, otherwise the truncation with its
 * last bit forced to 1 when anything was dropped, so a later rounding to fewer bits is
 * as if done once from the integer. */
static inline double i64_to_f64_odd(int64_t v)
{
    uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    double d;
    if (mag < (1ull << 53)) {
        d = (double)mag;
    } else {
        int drop = 64 - __builtin_clzll(mag) - 53;
        uint64_t kept = mag >> drop;
        if (mag & ((1ull << drop) - 1ull))
            kept |= 1u;
        d = ldexp((double)kept, drop);
    }
    return v < 0 ? -d : d;
}

static inline int64_t f64_to_i64_sat(double d, int64_t lo, int64_t hi)
{
    if (d != d)
        return 0;
    d = trunc(d);
    if (d <= (double)lo)
        return lo;
    if (d >= (double)hi) /* (double)INT64_MAX is 2^63: anything at or above saturates */
        return hi;
    return (int64_t)d;
}

static inline int dtype_is_int(fsdp2_dtype_t t)
{
    return t == FSDP2_I32 || t == FSDP2_I64 || t == FSDP2_U8;
}

/* Exact for every float dtype. */
static inline double load_f64(const void *p, fsdp2_dtype_t t, size_t i)
{
    switch (t) {
    case FSDP2_F32: return ((const float *)p)[i];
    case FSDP2_F64: return ((const double *)p)[i];
    case FSDP2_BF16: return cvt_bf16_to_f32(((const uint16_t *)p)[i]);
    case FSDP2_F16: return cvt_f16_to_f32(((const uint16_t *)p)[i]);
    case FSDP2_I32: return ((const int32_t *)p)[i];
    case FSDP2_I64: return (double)((const int64_t *)p)[i];
    case FSDP2_U8: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}

static inline int64_t load_i64(const void *p, fsdp2_dtype_t t, size_t i)
{
    switch (t) {
    case FSDP2_I32: return ((const int32_t *)p)[i];
    case FSDP2_I64: return ((const int64_t *)p)[i];
    case FSDP2_U8: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}

static inline void store_from_f64(void *p, fsdp2_dtype_t t, size_t i, double v)
{
    switch (t) {
    case FSDP2_F32: ((float *)p)[i] = (float)v; break;
    case FSDP2_F64: ((double *)p)[i] = v; break;
    case FSDP2_BF16: ((uint16_t *)p)[i] = cvt_f64_to_bf16(v); break;
    case FSDP2_F16: ((uint16_t *)p)[i] = cvt_f64_to_f16(v); break;
    case FSDP2_I32: ((int32_t *)p)[i] = (int32_t)f64_to_i64_sat(v, INT32_MIN, INT32_MAX); break;
    case FSDP2_I64: ((int64_t *)p)[i] = f64_to_i64_sat(v, INT64_MIN, INT64_MAX); break;
    case FSDP2_U8: ((uint8_t *)p)[i] = (uint8_t)f64_to_i64_sat(v, 0, 255); break;
    default: break;
    }
}

static inline int64_t clamp_i64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static inline void store_from_i64(void *p, fsdp2_dtype_t t, size_t i, int64_t v)
{
    switch (t) {
    case FSDP2_F32: ((float *)p)[i] = (float)v; break;
    case FSDP2_F64: ((double *)p)[i] = (double)v; break;
    case FSDP2_BF16: ((uint16_t *)p)[i] = cvt_f64_to_bf16(i64_to_f64_odd(v)); break;
    case FSDP2_F16: ((uint16_t *)p)[i] = cvt_f64_to_f16(i64_to_f64_odd(v)); break;
    case FSDP2_I32: ((int32_t *)p)[i] = (int32_t)clamp_i64(v, INT32_MIN, INT32_MAX); break;
    case FSDP2_I64: ((int64_t *)p)[i] = v; break;
    case FSDP2_U8: ((uint8_t *)p)[i] = (uint8_t)clamp_i64(v, 0, 255); break;
    default: break;
    }
}

/* Converts n elements; dtypes already validated. Plain loops over the common pairs so
 * the compiler vectorises them; the general path handles the rest element by element. */
void fsdp2_convert_unchecked(void *dst, fsdp2_dtype_t dst_dtype, const void *src,
                             fsdp2_dtype_t src_dtype, size_t n);

#endif
