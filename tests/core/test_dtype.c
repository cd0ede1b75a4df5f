/* Tests for the dtype table and the scalar and array conversions of fsdp2/dtype.h.
 *
 * Every result is compared with a reference that shares no code or bit tricks with the
 * library: GCC's _Float16 conversions (libgcc __extendhfsf2 / __truncsfhf2 /
 * __truncdfhf2) for f16, the definition "bf16 is the top half of an f32" for widening
 * bf16, and a nearest-neighbour search in long double arithmetic for rounding to bf16.
 *
 * Hot loops fail with `if (!ok) ck_abort_msg(...)` rather than ck_assert_msg, because
 * ck_assert_msg records a mark point (a write to Check's pipe) on every success; the
 * first mismatch ends the test, so a broken conversion reports one input, not a flood. */
#include <check.h>

#include "check_main.h"
#include "test_rng.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/dtype.h>
#include <fsdp2/status.h>

#define TEST_TIMEOUT_S 120

/* ---------------------------------------------------------------------------------- */
/* Bits, random numbers                                                                */

static uint32_t f32_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static float f32_from_bits(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static uint64_t f64_bits(double value)
{
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static double f64_from_bits(uint64_t bits)
{
    double value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* ---------------------------------------------------------------------------------- */
/* References                                                                          */

/* A binary floating-point format: significand bits (with the implicit one), smallest
 * normal exponent, largest exponent. */
struct float_format {
    int precision;
    int emin;
    int emax;
};

static const struct float_format BF16_FORMAT = {8, -126, 127};
static const struct float_format F16_FORMAT = {11, -14, 15};

/* The value of fmt nearest to mag (finite, >= 0), ties to the even significand, or
 * +INFINITY when that nearest value lies past the largest finite one (IEEE 754's
 * overflow rule: |x| >= max + half an ulp overflows, since max has an odd significand).
 *
 * lo and hi are the neighbours k*quantum and (k+1)*quantum bracketing mag. The two
 * distances are exact in long double (64-bit significand): each is a multiple of
 * ulp(mag) no larger than quantum, except when mag < quantum/2 and lo == 0, where
 * below = mag is exact and above > quantum/2 > below after any rounding. */
static long double ref_round_magnitude(long double mag, struct float_format fmt)
{
    if (mag == 0.0L)
        return 0.0L;
    int exp2;
    (void)frexpl(mag, &exp2); /* mag in [2^(exp2-1), 2^exp2) */
    int quantum_exp = exp2 - fmt.precision;
    int min_quantum_exp = fmt.emin - fmt.precision + 1; /* subnormal spacing */
    if (quantum_exp < min_quantum_exp)
        quantum_exp = min_quantum_exp;
    long double quantum = ldexpl(1.0L, quantum_exp);
    long double k = floorl(mag / quantum);
    long double lo = k * quantum;
    long double hi = lo + quantum;
    long double below = mag - lo;
    long double above = hi - mag;
    long double nearest;
    if (below < above)
        nearest = lo;
    else if (above < below)
        nearest = hi;
    else
        nearest = fmodl(k, 2.0L) == 0.0L ? lo : hi;
    long double max_finite = ldexpl(2.0L - ldexpl(1.0L, 1 - fmt.precision), fmt.emax);
    return nearest > max_finite ? (long double)INFINITY : nearest;
}

/* bf16 by definition is the upper half of an f32. */
static float ref_bf16_to_f32(uint16_t bits)
{
    return f32_from_bits((uint32_t)bits << 16);
}

static float ref_f16_to_f32(uint16_t bits)
{
    _Float16 half;
    memcpy(&half, &bits, sizeof half);
    return (float)half;
}

static uint16_t f16_bits_of(_Float16 half)
{
    uint16_t bits;
    memcpy(&bits, &half, sizeof bits);
    return bits;
}

static uint16_t ref_f32_to_f16_cast(float value)
{
    return f16_bits_of((_Float16)value);
}

static uint16_t ref_f64_to_f16_cast(double value)
{
    return f16_bits_of((_Float16)value);
}

/* Non-NaN value to bf16 by the nearest-neighbour search. The rounded magnitude is a
 * bf16 value or infinity, so the float conversion below is exact. */
static uint16_t ref_to_bf16(long double value)
{
    long double mag = ref_round_magnitude(fabsl(value), BF16_FORMAT);
    float rounded = (float)(signbit(value) ? -mag : mag);
    return (uint16_t)(f32_bits(rounded) >> 16);
}

/* Non-NaN value to f16 by the same search; the final _Float16 conversion is exact. */
static uint16_t ref_to_f16(long double value)
{
    long double mag = ref_round_magnitude(fabsl(value), F16_FORMAT);
    float rounded = (float)(signbit(value) ? -mag : mag);
    return f16_bits_of((_Float16)rounded);
}

/* A NaN input must give a quiet NaN of the same sign. */
static int is_quiet_nan_with_sign(uint16_t got, int negative, uint16_t inf_bits,
                                  uint16_t quiet_bit)
{
    return (got & 0x7fffu) > inf_bits && (got & quiet_bit) != 0 &&
           (int)(got >> 15) == (negative != 0);
}

static int bf16_result_ok(uint16_t got, uint16_t want, int input_nan, int negative)
{
    return input_nan ? is_quiet_nan_with_sign(got, negative, 0x7f80u, 0x0040u) : got == want;
}

static int f16_result_ok(uint16_t got, uint16_t want, int input_nan, int negative)
{
    return input_nan ? is_quiet_nan_with_sign(got, negative, 0x7c00u, 0x0200u) : got == want;
}

/* Widening keeps NaN-ness and sign; everything else bit-exact. */
static int f32_result_ok(float got, float want)
{
    if (isnan(want))
        return isnan(got) && !signbit(got) == !signbit(want);
    return f32_bits(got) == f32_bits(want);
}

/* ---------------------------------------------------------------------------------- */
/* 1. Widening bf16 and f16 to f32, exhaustively                                        */

START_TEST(bf16_to_f32_equals_upper_half_of_f32_for_all_65536_patterns)
{
    for (uint32_t b = 0; b <= 0xffffu; b++) {
        float got = fsdp2_bf16_to_f32((uint16_t)b);
        float want = ref_bf16_to_f32((uint16_t)b);
        if (!f32_result_ok(got, want))
            ck_abort_msg("bf16 0x%04x: got f32 0x%08x (%a), want 0x%08x (%a)", (unsigned)b,
                         (unsigned)f32_bits(got), (double)got, (unsigned)f32_bits(want),
                         (double)want);
    }
}
END_TEST

START_TEST(f16_to_f32_equals_float16_cast_for_all_65536_patterns)
{
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float got = fsdp2_f16_to_f32((uint16_t)h);
        float want = ref_f16_to_f32((uint16_t)h);
        if (!f32_result_ok(got, want))
            ck_abort_msg("f16 0x%04x: got f32 0x%08x (%a), want 0x%08x (%a)", (unsigned)h,
                         (unsigned)f32_bits(got), (double)got, (unsigned)f32_bits(want),
                         (double)want);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 2. f32 -> bf16                                                                       */

static void check_f32_to_bf16(uint32_t bits)
{
    float x = f32_from_bits(bits);
    uint16_t got = fsdp2_f32_to_bf16(x);
    if (isnan(x)) {
        if (!bf16_result_ok(got, 0, 1, signbit(x)))
            ck_abort_msg("f32 0x%08x (NaN): got bf16 0x%04x, want a quiet NaN with sign %d",
                         (unsigned)bits, got, (int)(bits >> 31));
        return;
    }
    uint16_t want = ref_to_bf16(x);
    if (got != want)
        ck_abort_msg("f32 0x%08x (%a): got bf16 0x%04x, want 0x%04x", (unsigned)bits, (double)x,
                     got, want);
}

/* Low halves 0x7fff/0x8000/0x8001 sit on and beside the tie of every pair of adjacent
 * bf16 values; 0x0000 is exact, 0x0001 and 0xffff the extremes of the interval. */
START_TEST(f32_to_bf16_rounds_to_nearest_even_at_every_boundary_of_every_bf16)
{
    uint16_t lows[6 + 8] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    uint64_t rng = 0x9e3779b97f4a7c15u;
    for (int i = 6; i < 14; i++)
        lows[i] = (uint16_t)rng_next(&rng);
    for (uint32_t upper = 0; upper <= 0xffffu; upper++)
        for (int i = 0; i < 14; i++)
            check_f32_to_bf16(upper << 16 | lows[i]);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 3. f32 -> f16                                                                        */

static void check_f32_to_f16(float x)
{
    uint16_t got = fsdp2_f32_to_f16(x);
    if (isnan(x)) {
        if (!f16_result_ok(got, 0, 1, signbit(x)))
            ck_abort_msg("f32 0x%08x (NaN): got f16 0x%04x, want a quiet NaN with sign %d",
                         (unsigned)f32_bits(x), got, (int)(f32_bits(x) >> 31));
        return;
    }
    uint16_t want = ref_f32_to_f16_cast(x);
    if (got != want)
        ck_abort_msg("f32 0x%08x (%a): got f16 0x%04x, want 0x%04x", (unsigned)f32_bits(x),
                     (double)x, got, want);
}

/* The midpoint between adjacent f16 values needs 12 significant bits, so it is an f32;
 * so are the f32 values one ulp either side of it. */
START_TEST(f32_to_f16_rounds_midpoints_of_every_adjacent_f16_pair_to_even)
{
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        if ((h & 0x7c00u) == 0x7c00u)
            continue; /* inf, NaN */
        float value = ref_f16_to_f32((uint16_t)h);
        float next;
        if ((h & 0x7fffu) == 0x7bffu) /* 65504: the successor past the end is 2^16 */
            next = (h & 0x8000u) ? -65536.0f : 65536.0f;
        else
            next = ref_f16_to_f32((uint16_t)(h + 1)); /* one step up in magnitude */
        float mid = (value + next) / 2.0f;
        check_f32_to_f16(nextafterf(mid, 0.0f));
        check_f32_to_f16(mid);
        check_f32_to_f16(nextafterf(mid, next * 2.0f));
    }
}
END_TEST

/* Half the patterns are uniform over all 2^32 (mostly overflow, underflow, NaN); half
 * have exponents in [2^-27, 2^17), where f16 results are normal or subnormal. */
START_TEST(f32_to_f16_equals_float16_cast_on_2m_random_patterns)
{
    uint64_t rng = 0x2545f4914f6cdd1du;
    for (int i = 0; i < 1000000; i++)
        check_f32_to_f16(f32_from_bits((uint32_t)rng_next(&rng)));
    for (int i = 0; i < 1000000; i++) {
        uint64_t r = rng_next(&rng);
        uint32_t exponent = (uint32_t)(127 - 27 + (r >> 32) % 44);
        uint32_t bits = (uint32_t)(r & 0x807fffffu) | exponent << 23;
        check_f32_to_f16(f32_from_bits(bits));
    }
}
END_TEST

START_TEST(f32_to_f16_gives_hand_computed_results_for_specials)
{
    static const struct {
        uint32_t input;
        uint16_t want; /* 0xffff: a quiet NaN with the input's sign */
    } cases[] = {
        {0x00000000u, 0x0000}, /* +0 */
        {0x80000000u, 0x8000}, /* -0 */
        {0x7f800000u, 0x7c00}, /* +inf */
        {0xff800000u, 0xfc00}, /* -inf */
        {0x7fc00000u, 0xffff}, /* quiet NaN */
        {0xffc00000u, 0xffff}, /* negative quiet NaN */
        {0x7f800001u, 0xffff}, /* signalling NaN, payload only in the low bits */
        {0xff800001u, 0xffff},
        {0x7fffffffu, 0xffff},
        {0x477fe000u, 0x7bff}, /* 65504, largest f16 */
        {0x477ff000u, 0x7c00}, /* 65520 = max + half ulp: ties away from odd max, to inf */
        {0xc77ff000u, 0xfc00}, /* -65520 */
        {0x477fefffu, 0x7bff}, /* 65519.996: just below the overflow threshold */
        {0x33800000u, 0x0001}, /* 2^-24, smallest subnormal */
        {0x33000000u, 0x0000}, /* 2^-25: tie between 0 and 2^-24, to even 0 */
        {0xb3000000u, 0x8000}, /* -2^-25 keeps its sign */
        {0x33000001u, 0x0001}, /* just above 2^-25 */
        {0x33c00000u, 0x0002}, /* 3*2^-25: tie between 1 and 2 subnormal ulps, to even 2 */
        {0x33400000u, 0x0001}, /* 3*2^-26: nearer 2^-24 than 0 */
        {0x38800000u, 0x0400}, /* 2^-14, smallest normal */
        {0x387fc000u, 0x03ff}, /* largest subnormal */
        {0x387fe000u, 0x0400}, /* tie between largest subnormal (odd) and 2^-14 */
        {0x3f801000u, 0x3c00}, /* 1 + 2^-11: tie, to even 1.0 */
        {0x3f803000u, 0x3c02}, /* 1 + 3*2^-11: tie, to even 1 + 2^-9 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x = f32_from_bits(cases[i].input);
        uint16_t got = fsdp2_f32_to_f16(x);
        if (cases[i].want == 0xffff)
            ck_assert_msg(is_quiet_nan_with_sign(got, signbit(x), 0x7c00u, 0x0200u),
                          "f32 0x%08x (NaN): got f16 0x%04x, want a quiet NaN with sign %d",
                          cases[i].input, got, (int)(cases[i].input >> 31));
        else
            ck_assert_msg(got == cases[i].want, "f32 0x%08x (%a): got f16 0x%04x, want 0x%04x",
                          cases[i].input, (double)x, got, cases[i].want);
        check_f32_to_f16(x); /* and the same answer as the _Float16 cast */
    }
    /* 65519.99 as written in decimal becomes the f32 0x477feffd, below the threshold. */
    ck_assert_uint_eq(fsdp2_f32_to_f16(65519.99f), 0x7bff);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 4. f64 -> bf16 and f64 -> f16, directly                                              */

/* Each double lies beside a tie point of the 16-bit format by less than half an f32
 * ulp, so converting through f32 first lands exactly on the tie and ties-to-even then
 * picks the other neighbour. via_f32 is that wrong answer, checked too so that a typo
 * in a constant cannot make the case toothless. */
struct double_rounding_case {
    double input;
    uint16_t direct;
    uint16_t via_f32;
};

START_TEST(f64_to_bf16_does_not_double_round_through_f32)
{
    static const struct double_rounding_case cases[] = {
        {1.0 + 0x1p-8 + 0x1p-30, 0x3f81, 0x3f80},  /* above the 1.0 | 1+2^-7 tie */
        {-(1.0 + 0x1p-8 + 0x1p-30), 0xbf81, 0xbf80},
        {1.0 + 3 * 0x1p-8 - 0x1p-30, 0x3f81, 0x3f82}, /* below the odd|even tie */
        {0x1p-134 + 0x1p-160, 0x0001, 0x0000},     /* above the 0 | 2^-133 tie */
        {0x1p128 - 0x1p119 - 0x1p90, 0x7f7f, 0x7f80}, /* below the overflow threshold */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double d = cases[i].input;
        uint16_t got = fsdp2_f64_to_bf16(d);
        uint16_t reference = ref_to_bf16(d);
        uint16_t through_f32 = ref_to_bf16((float)d);
        ck_assert_msg(reference == cases[i].direct && through_f32 == cases[i].via_f32,
                      "test constant %zu is wrong: reference 0x%04x, through f32 0x%04x", i,
                      reference, through_f32);
        ck_assert_msg(got == cases[i].direct,
                      "f64 0x%016llx (%a): got bf16 0x%04x, want 0x%04x (0x%04x is the "
                      "double-rounded answer through f32)",
                      (unsigned long long)f64_bits(d), d, got, cases[i].direct,
                      cases[i].via_f32);
    }
}
END_TEST

START_TEST(f64_to_f16_does_not_double_round_through_f32)
{
    static const struct double_rounding_case cases[] = {
        {1.0 + 0x1p-11 + 0x1p-40, 0x3c01, 0x3c00},  /* above the 1.0 | 1+2^-10 tie */
        {-(1.0 + 0x1p-11 + 0x1p-40), 0xbc01, 0xbc00},
        {1.0 + 3 * 0x1p-11 - 0x1p-40, 0x3c01, 0x3c02}, /* below the odd|even tie */
        {0x1p-25 + 0x1p-60, 0x0001, 0x0000},        /* above the 0 | 2^-24 tie */
        {65520.0 - 0x1p-20, 0x7bff, 0x7c00},        /* below the overflow threshold */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double d = cases[i].input;
        uint16_t got = fsdp2_f64_to_f16(d);
        uint16_t search = ref_to_f16(d);
        uint16_t cast = ref_f64_to_f16_cast(d);
        uint16_t through_f32 = ref_f32_to_f16_cast((float)d);
        ck_assert_msg(search == cases[i].direct && cast == cases[i].direct &&
                          through_f32 == cases[i].via_f32,
                      "test constant %zu or a reference is wrong: search 0x%04x, cast 0x%04x, "
                      "through f32 0x%04x",
                      i, search, cast, through_f32);
        ck_assert_msg(got == cases[i].direct,
                      "f64 0x%016llx (%a): got f16 0x%04x, want 0x%04x (0x%04x is the "
                      "double-rounded answer through f32)",
                      (unsigned long long)f64_bits(d), d, got, cases[i].direct,
                      cases[i].via_f32);
    }
}
END_TEST

/* A random double for fmt: half are uniform in magnitude from below the smallest
 * subnormal to past the overflow threshold; half sit within two double ulps of a tie
 * point (k + 1/2) * quantum, which uniform sampling would almost never hit. */
static double random_double_for(struct float_format fmt, uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    uint64_t sign = r & 0x8000000000000000u;
    if (r & 1) {
        int lowest = fmt.emin - fmt.precision - 2;
        int span = fmt.emax + 3 - lowest;
        uint64_t exponent = (uint64_t)(1023 + lowest + (int)((r >> 1) % (uint64_t)span));
        uint64_t mantissa = rng_next(rng) & 0x000fffffffffffffu;
        return f64_from_bits(sign | exponent << 52 | mantissa);
    }
    int min_quantum_exp = fmt.emin - fmt.precision + 1;
    int max_quantum_exp = fmt.emax - fmt.precision + 1;
    int quantum_exp = min_quantum_exp +
                      (int)((r >> 1) % (uint64_t)(max_quantum_exp - min_quantum_exp + 1));
    uint64_t k = (r >> 20) % (1u << fmt.precision);
    double d = ldexp((double)k + 0.5, quantum_exp);
    int steps = (int)((r >> 40) % 5) - 2;
    for (; steps < 0; steps++)
        d = nextafter(d, 0.0);
    for (; steps > 0; steps--)
        d = nextafter(d, INFINITY);
    return sign ? -d : d;
}

START_TEST(f64_to_bf16_equals_nearest_neighbour_search_on_1m_random_doubles)
{
    uint64_t rng = 0xd1b54a32d192ed03u;
    for (int i = 0; i < 1000000; i++) {
        double d = random_double_for(BF16_FORMAT, &rng);
        uint16_t got = fsdp2_f64_to_bf16(d);
        uint16_t want = ref_to_bf16(d);
        if (got != want)
            ck_abort_msg("f64 0x%016llx (%a): got bf16 0x%04x, want 0x%04x",
                         (unsigned long long)f64_bits(d), d, got, want);
    }
    static const double nans[] = {NAN, -NAN};
    for (size_t i = 0; i < 2; i++) {
        uint16_t got = fsdp2_f64_to_bf16(nans[i]);
        ck_assert_msg(bf16_result_ok(got, 0, 1, signbit(nans[i])),
                      "f64 0x%016llx: got bf16 0x%04x, want a quiet NaN of that sign",
                      (unsigned long long)f64_bits(nans[i]), got);
    }
}
END_TEST

START_TEST(f64_to_f16_equals_float16_cast_on_1m_random_doubles)
{
    uint64_t rng = 0x8bb84b93962eacc9u;
    for (int i = 0; i < 1000000; i++) {
        double d = random_double_for(F16_FORMAT, &rng);
        uint16_t got = fsdp2_f64_to_f16(d);
        uint16_t want = ref_f64_to_f16_cast(d);
        if (got != want)
            ck_abort_msg("f64 0x%016llx (%a): got f16 0x%04x, want 0x%04x",
                         (unsigned long long)f64_bits(d), d, got, want);
    }
    static const double nans[] = {NAN, -NAN};
    for (size_t i = 0; i < 2; i++) {
        uint16_t got = fsdp2_f64_to_f16(nans[i]);
        ck_assert_msg(f16_result_ok(got, 0, 1, signbit(nans[i])),
                      "f64 0x%016llx: got f16 0x%04x, want a quiet NaN of that sign",
                      (unsigned long long)f64_bits(nans[i]), got);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 5. fsdp2_convert over arrays                                                         */

#define DTYPE_COUNT 7

static const fsdp2_dtype_t ALL_DTYPES[DTYPE_COUNT] = {
    FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16, FSDP2_I32, FSDP2_I64, FSDP2_U8,
};

/* Written independently of the header's X-macro. */
static size_t ref_dtype_size(fsdp2_dtype_t dtype)
{
    switch (dtype) {
    case FSDP2_F32: return 4;
    case FSDP2_F64: return 8;
    case FSDP2_BF16: return 2;
    case FSDP2_F16: return 2;
    case FSDP2_I32: return 4;
    case FSDP2_I64: return 8;
    case FSDP2_U8: return 1;
    default: return 0;
    }
}

static int ref_dtype_is_float(fsdp2_dtype_t dtype)
{
    return dtype == FSDP2_F32 || dtype == FSDP2_F64 || dtype == FSDP2_BF16 ||
           dtype == FSDP2_F16;
}

/* Every value of every dtype below is exact in long double (64-bit significand), so a
 * source element can be read back exactly and rounded once to the destination. The
 * list has, for some pair of dtypes each: RNE ties, values past each integer range and
 * each float range, subnormals, NaN, and integers whose conversion to a float rounds
 * differently when done through f64 or f32 first. */
static const long double CONVERT_VALUES[] = {
    0.0L, -0.0L, 1.0L, -1.0L, 0.5L, -0.5L, 0.99L, 1.5L, 2.5L, -2.5L, 3.7L, -3.7L,
    100.25L, 127.0L, 128.0L, 255.0L, 255.9L, 256.0L, 257.0L, 300.0L, -129.0L, 1000.5L,
    2049.0L, 65504.0L, 65519.0L, 65520.0L, 65536.0L, 16777217.0L,
    16842753.0L,            /* 2^24 + 2^16 + 1: i32 -> f32 -> bf16 double-rounds */
    2147483647.0L, 2147483648.0L, -2147483648.0L, -2147483649.0L, 1e10L, -1e10L,
    1152921573326323713.0L, /* 2^60 + 2^36 + 1: i64 -> f64 -> f32 double-rounds */
    1157425104234217473.0L, /* 2^60 + 2^52 + 1: i64 -> f64 -> bf16 double-rounds */
    9223372036854775807.0L, -9223372036854775808.0L, 1e19L, -1e19L, 3e38L, 3.4e38L,
    1e39L, 1e300L, -1e300L, 1e-3L, 1e-7L, 3e-8L, 1e-40L, 1e-45L, 1e-300L,
    1.0L + 0x1p-8L + 0x1p-30L,  /* f64 -> f32 -> bf16 double-rounds */
    1.0L + 0x1p-11L + 0x1p-40L, /* f64 -> f32 -> f16 double-rounds */
    (long double)INFINITY, -(long double)INFINITY, (long double)NAN, -(long double)NAN,
};
#define CONVERT_N (sizeof CONVERT_VALUES / sizeof CONVERT_VALUES[0])

/* Truncate toward zero, saturate at [lo, hi], NaN -> 0. */
static long double ref_to_integer(long double value, long double lo, long double hi)
{
    if (isnan(value))
        return 0.0L;
    value = truncl(value);
    return value < lo ? lo : value > hi ? hi : value;
}

/* Writes value, rounded once by the header's rules, as element i of a dst_dtype array.
 * NaN becomes the default quiet NaN of its sign (the library may pick another payload,
 * so compare_element checks NaN results loosely). */
static void ref_store(fsdp2_dtype_t dtype, void *buf, size_t i, long double value)
{
    int nan = isnan(value);
    int negative = signbit(value) != 0;
    switch (dtype) {
    case FSDP2_F32: {
        float v = (float)value;
        memcpy((char *)buf + 4 * i, &v, 4);
        break;
    }
    case FSDP2_F64: {
        double v = (double)value;
        memcpy((char *)buf + 8 * i, &v, 8);
        break;
    }
    case FSDP2_BF16: {
        uint16_t v = nan ? (uint16_t)(negative ? 0xffc0u : 0x7fc0u) : ref_to_bf16(value);
        memcpy((char *)buf + 2 * i, &v, 2);
        break;
    }
    case FSDP2_F16: {
        uint16_t v = nan ? (uint16_t)(negative ? 0xfe00u : 0x7e00u) : ref_to_f16(value);
        memcpy((char *)buf + 2 * i, &v, 2);
        break;
    }
    case FSDP2_I32: {
        int32_t v = (int32_t)ref_to_integer(value, -2147483648.0L, 2147483647.0L);
        memcpy((char *)buf + 4 * i, &v, 4);
        break;
    }
    case FSDP2_I64: {
        int64_t v = (int64_t)ref_to_integer(value, -9223372036854775808.0L,
                                            9223372036854775807.0L);
        memcpy((char *)buf + 8 * i, &v, 8);
        break;
    }
    case FSDP2_U8: {
        uint8_t v = (uint8_t)ref_to_integer(value, 0.0L, 255.0L);
        memcpy((char *)buf + i, &v, 1);
        break;
    }
    default:
        ck_abort_msg("ref_store: dtype %d", (int)dtype);
    }
}

/* Element i of a dtype array, exactly. */
static long double ref_load(fsdp2_dtype_t dtype, const void *buf, size_t i)
{
    const char *p = (const char *)buf + ref_dtype_size(dtype) * i;
    switch (dtype) {
    case FSDP2_F32: {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    case FSDP2_F64: {
        double v;
        memcpy(&v, p, 8);
        return v;
    }
    case FSDP2_BF16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return ref_bf16_to_f32(v);
    }
    case FSDP2_F16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return ref_f16_to_f32(v);
    }
    case FSDP2_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case FSDP2_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    case FSDP2_U8:
        return (unsigned char)*p;
    default:
        ck_abort_msg("ref_load: dtype %d", (int)dtype);
        return 0;
    }
}

/* Element i's raw bits, for messages. */
static uint64_t element_bits(fsdp2_dtype_t dtype, const void *buf, size_t i)
{
    uint64_t bits = 0;
    size_t size = ref_dtype_size(dtype);
    memcpy(&bits, (const char *)buf + size * i, size); /* little-endian x86-64 */
    return bits;
}

/* Whether got[i] is the right result for source value: bit-exact, except that a NaN
 * only needs to be a NaN of the same sign (quiet, for the 16-bit formats). */
static int element_ok(fsdp2_dtype_t dtype, const void *got, const void *want, size_t i,
                      long double source)
{
    uint64_t g = element_bits(dtype, got, i);
    if (!isnan(source) || !ref_dtype_is_float(dtype))
        return g == element_bits(dtype, want, i);
    int negative = signbit(source) != 0;
    switch (dtype) {
    case FSDP2_BF16: return is_quiet_nan_with_sign((uint16_t)g, negative, 0x7f80u, 0x0040u);
    case FSDP2_F16: return is_quiet_nan_with_sign((uint16_t)g, negative, 0x7c00u, 0x0200u);
    default: {
        long double v = ref_load(dtype, got, i);
        return isnan(v) && (signbit(v) != 0) == negative;
    }
    }
}

/* The source array of CONVERT_VALUES, each rounded into src_dtype by the reference. */
static void fill_source(fsdp2_dtype_t src_dtype, void *src)
{
    for (size_t i = 0; i < CONVERT_N; i++)
        ref_store(src_dtype, src, i, CONVERT_VALUES[i]);
}

static void check_converted(fsdp2_dtype_t src_dtype, const void *src, fsdp2_dtype_t dst_dtype,
                            const void *got, const char *how)
{
    uint64_t want[CONVERT_N];
    if (src_dtype == dst_dtype) {
        /* A copy keeps every bit, NaN payloads included. */
        for (size_t i = 0; i < CONVERT_N; i++)
            ck_assert_msg(element_bits(src_dtype, got, i) == element_bits(src_dtype, src, i),
                          "%s %s -> %s element %zu: got 0x%llx, want copy 0x%llx", how,
                          fsdp2_dtype_name(src_dtype), fsdp2_dtype_name(dst_dtype), i,
                          (unsigned long long)element_bits(src_dtype, got, i),
                          (unsigned long long)element_bits(src_dtype, src, i));
        return;
    }
    for (size_t i = 0; i < CONVERT_N; i++) {
        long double source = ref_load(src_dtype, src, i);
        ref_store(dst_dtype, want, i, source);
        ck_assert_msg(element_ok(dst_dtype, got, want, i, source),
                      "%s %s -> %s element %zu: source 0x%llx (%La), got 0x%llx, want 0x%llx",
                      how, fsdp2_dtype_name(src_dtype), fsdp2_dtype_name(dst_dtype), i,
                      (unsigned long long)element_bits(src_dtype, src, i), source,
                      (unsigned long long)element_bits(dst_dtype, got, i),
                      (unsigned long long)element_bits(dst_dtype, want, i));
    }
}

START_TEST(convert_matches_per_element_reference_for_all_49_dtype_pairs)
{
    uint64_t src[CONVERT_N];
    uint64_t dst[CONVERT_N];
    for (int s = 0; s < DTYPE_COUNT; s++) {
        fill_source(ALL_DTYPES[s], src);
        for (int d = 0; d < DTYPE_COUNT; d++) {
            memset(dst, 0xa5, sizeof dst);
            fsdp2_status_t status = fsdp2_convert(dst, ALL_DTYPES[d], src, ALL_DTYPES[s],
                                                  CONVERT_N);
            ck_assert_msg(status == FSDP2_SUCCESS, "%s -> %s: status %s (%s)",
                          fsdp2_dtype_name(ALL_DTYPES[s]), fsdp2_dtype_name(ALL_DTYPES[d]),
                          fsdp2_status_name(status), fsdp2_last_error());
            check_converted(ALL_DTYPES[s], src, ALL_DTYPES[d], dst, "out of place");
            /* Nothing written past the n elements. */
            size_t end = CONVERT_N * ref_dtype_size(ALL_DTYPES[d]);
            for (size_t b = end; b < sizeof dst; b++)
                ck_assert_msg(((unsigned char *)dst)[b] == 0xa5,
                              "%s -> %s wrote byte %zu past the end (%zu bytes)",
                              fsdp2_dtype_name(ALL_DTYPES[s]), fsdp2_dtype_name(ALL_DTYPES[d]),
                              b, end);
        }
    }
}
END_TEST

/* The header allows dst == src when the sizes match. */
START_TEST(convert_in_place_matches_reference_for_same_size_pairs)
{
    static const fsdp2_dtype_t pairs[][2] = {
        {FSDP2_F32, FSDP2_I32}, {FSDP2_I32, FSDP2_F32}, {FSDP2_F64, FSDP2_I64},
        {FSDP2_I64, FSDP2_F64}, {FSDP2_BF16, FSDP2_F16}, {FSDP2_F16, FSDP2_BF16},
        {FSDP2_F32, FSDP2_F32}, {FSDP2_U8, FSDP2_U8},
    };
    uint64_t src[CONVERT_N];
    uint64_t buf[CONVERT_N];
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        fsdp2_dtype_t s = pairs[p][0], d = pairs[p][1];
        fill_source(s, src);
        memcpy(buf, src, sizeof buf);
        fsdp2_status_t status = fsdp2_convert(buf, d, buf, s, CONVERT_N);
        ck_assert_msg(status == FSDP2_SUCCESS, "in place %s -> %s: status %s (%s)",
                      fsdp2_dtype_name(s), fsdp2_dtype_name(d), fsdp2_status_name(status),
                      fsdp2_last_error());
        check_converted(s, src, d, buf, "in place");
    }
}
END_TEST

START_TEST(convert_of_zero_elements_succeeds_and_writes_nothing)
{
    uint64_t src[1] = {0};
    uint64_t dst[1];
    for (int s = 0; s < DTYPE_COUNT; s++)
        for (int d = 0; d < DTYPE_COUNT; d++) {
            memset(dst, 0xa5, sizeof dst);
            fsdp2_status_t status = fsdp2_convert(dst, ALL_DTYPES[d], src, ALL_DTYPES[s], 0);
            ck_assert_msg(status == FSDP2_SUCCESS, "%s -> %s, n = 0: status %s (%s)",
                          fsdp2_dtype_name(ALL_DTYPES[s]), fsdp2_dtype_name(ALL_DTYPES[d]),
                          fsdp2_status_name(status), fsdp2_last_error());
            ck_assert_msg(dst[0] == 0xa5a5a5a5a5a5a5a5u, "%s -> %s, n = 0 wrote 0x%016llx",
                          fsdp2_dtype_name(ALL_DTYPES[s]), fsdp2_dtype_name(ALL_DTYPES[d]),
                          (unsigned long long)dst[0]);
        }
}
END_TEST

START_TEST(convert_rejects_unknown_dtype_and_names_it)
{
    float src[2] = {1.0f, 2.0f};
    float dst[2] = {0};
    const fsdp2_dtype_t bad = (fsdp2_dtype_t)99;

    fsdp2_status_t status = fsdp2_convert(dst, FSDP2_F32, src, bad, 2);
    ck_assert_msg(status == FSDP2_ERR_INVALID_ARGUMENT, "src dtype 99: status %s, want %s",
                  fsdp2_status_name(status), fsdp2_status_name(FSDP2_ERR_INVALID_ARGUMENT));
    const char *message = fsdp2_last_error();
    ck_assert_msg(message != NULL && strstr(message, "99") != NULL,
                  "src dtype 99: last error \"%s\" does not name 99", message ? message : "(null)");

    status = fsdp2_convert(dst, bad, src, FSDP2_F32, 2);
    ck_assert_msg(status == FSDP2_ERR_INVALID_ARGUMENT, "dst dtype 99: status %s, want %s",
                  fsdp2_status_name(status), fsdp2_status_name(FSDP2_ERR_INVALID_ARGUMENT));
    message = fsdp2_last_error();
    ck_assert_msg(message != NULL && strstr(message, "99") != NULL,
                  "dst dtype 99: last error \"%s\" does not name 99", message ? message : "(null)");
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 6. Names, sizes, parsing                                                             */

static const struct {
    fsdp2_dtype_t dtype;
    size_t bytes;
    const char *name;
    int is_float;
} DTYPE_TABLE[DTYPE_COUNT] = {
    {FSDP2_F32, 4, "f32", 1}, {FSDP2_F64, 8, "f64", 1}, {FSDP2_BF16, 2, "bf16", 1},
    {FSDP2_F16, 2, "f16", 1}, {FSDP2_I32, 4, "i32", 0}, {FSDP2_I64, 8, "i64", 0},
    {FSDP2_U8, 1, "u8", 0},
};

START_TEST(dtype_size_name_parse_and_is_float_round_trip_for_every_dtype)
{
    for (int i = 0; i < DTYPE_COUNT; i++) {
        fsdp2_dtype_t dtype = DTYPE_TABLE[i].dtype;
        size_t bytes = 0;
        ck_assert_int_eq(fsdp2_dtype_size(dtype, &bytes), FSDP2_SUCCESS);
        ck_assert_msg(bytes == DTYPE_TABLE[i].bytes, "size of %s: got %zu, want %zu",
                      DTYPE_TABLE[i].name, bytes, DTYPE_TABLE[i].bytes);
        ck_assert_str_eq(fsdp2_dtype_name(dtype), DTYPE_TABLE[i].name);
        fsdp2_dtype_t parsed = (fsdp2_dtype_t)99;
        fsdp2_status_t status = fsdp2_dtype_parse(DTYPE_TABLE[i].name, &parsed);
        ck_assert_msg(status == FSDP2_SUCCESS && parsed == dtype,
                      "parse(\"%s\"): status %s, dtype %d, want %d", DTYPE_TABLE[i].name,
                      fsdp2_status_name(status), (int)parsed, (int)dtype);
        int is_float = -1;
        ck_assert_int_eq(fsdp2_dtype_is_float(dtype, &is_float), FSDP2_SUCCESS);
        ck_assert_msg(!is_float == !DTYPE_TABLE[i].is_float, "is_float(%s): got %d, want %d",
                      DTYPE_TABLE[i].name, is_float, DTYPE_TABLE[i].is_float);
    }
}
END_TEST

START_TEST(dtype_parse_accepts_the_pytorch_spellings)
{
    static const struct {
        const char *name;
        fsdp2_dtype_t dtype;
    } spellings[] = {
        {"float32", FSDP2_F32}, {"float", FSDP2_F32},    {"double", FSDP2_F64},
        {"bfloat16", FSDP2_BF16}, {"float16", FSDP2_F16}, {"half", FSDP2_F16},
        {"int32", FSDP2_I32},   {"int64", FSDP2_I64},    {"uint8", FSDP2_U8},
    };
    for (size_t i = 0; i < sizeof spellings / sizeof spellings[0]; i++) {
        fsdp2_dtype_t parsed = (fsdp2_dtype_t)99;
        fsdp2_status_t status = fsdp2_dtype_parse(spellings[i].name, &parsed);
        ck_assert_msg(status == FSDP2_SUCCESS && parsed == spellings[i].dtype,
                      "parse(\"%s\"): status %s (%s), dtype %d, want %d", spellings[i].name,
                      fsdp2_status_name(status), fsdp2_last_error(), (int)parsed,
                      (int)spellings[i].dtype);
    }
}
END_TEST

START_TEST(dtype_parse_rejects_unknown_name_and_names_it)
{
    fsdp2_dtype_t parsed = FSDP2_F32;
    fsdp2_status_t status = fsdp2_dtype_parse("f33", &parsed);
    ck_assert_msg(status == FSDP2_ERR_INVALID_ARGUMENT, "parse(\"f33\"): status %s, want %s",
                  fsdp2_status_name(status), fsdp2_status_name(FSDP2_ERR_INVALID_ARGUMENT));
    const char *message = fsdp2_last_error();
    ck_assert_msg(message != NULL && strstr(message, "f33") != NULL,
                  "parse(\"f33\"): last error \"%s\" does not name f33",
                  message ? message : "(null)");
}
END_TEST

/* Values outside the list, including FSDP2_DTYPE_COUNT itself, which is not a dtype. */
START_TEST(dtype_queries_reject_unknown_values)
{
    static const fsdp2_dtype_t bad[] = {FSDP2_DTYPE_COUNT, (fsdp2_dtype_t)99,
                                        (fsdp2_dtype_t)-1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t bytes = 12345;
        fsdp2_status_t status = fsdp2_dtype_size(bad[i], &bytes);
        ck_assert_msg(status == FSDP2_ERR_INVALID_ARGUMENT, "size(%d): status %s, want %s",
                      (int)bad[i], fsdp2_status_name(status),
                      fsdp2_status_name(FSDP2_ERR_INVALID_ARGUMENT));
        int is_float = 0;
        status = fsdp2_dtype_is_float(bad[i], &is_float);
        ck_assert_msg(status == FSDP2_ERR_INVALID_ARGUMENT, "is_float(%d): status %s, want %s",
                      (int)bad[i], fsdp2_status_name(status),
                      fsdp2_status_name(FSDP2_ERR_INVALID_ARGUMENT));
        const char *name = fsdp2_dtype_name(bad[i]);
        ck_assert_msg(name != NULL && strcmp(name, "invalid") == 0,
                      "name(%d): got \"%s\", want \"invalid\"", (int)bad[i],
                      name ? name : "(null)");
    }
    size_t bytes = 0;
    ck_assert_int_eq(fsdp2_dtype_size((fsdp2_dtype_t)99, &bytes), FSDP2_ERR_INVALID_ARGUMENT);
    const char *message = fsdp2_last_error();
    ck_assert_msg(strstr(message, "99") != NULL, "size(99): last error \"%s\" does not name 99",
                  message);
}
END_TEST

/* ---------------------------------------------------------------------------------- */

static TCase *tcase_new(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    return tc;
}

static Suite *dtype_suite(void)
{
    Suite *s = suite_create("dtype");

    TCase *widen = tcase_new("widen");
    tcase_add_test(widen, bf16_to_f32_equals_upper_half_of_f32_for_all_65536_patterns);
    tcase_add_test(widen, f16_to_f32_equals_float16_cast_for_all_65536_patterns);
    suite_add_tcase(s, widen);

    TCase *narrow_f32 = tcase_new("narrow_f32");
    tcase_add_test(narrow_f32, f32_to_bf16_rounds_to_nearest_even_at_every_boundary_of_every_bf16);
    tcase_add_test(narrow_f32, f32_to_f16_rounds_midpoints_of_every_adjacent_f16_pair_to_even);
    tcase_add_test(narrow_f32, f32_to_f16_equals_float16_cast_on_2m_random_patterns);
    tcase_add_test(narrow_f32, f32_to_f16_gives_hand_computed_results_for_specials);
    suite_add_tcase(s, narrow_f32);

    TCase *narrow_f64 = tcase_new("narrow_f64");
    tcase_add_test(narrow_f64, f64_to_bf16_does_not_double_round_through_f32);
    tcase_add_test(narrow_f64, f64_to_f16_does_not_double_round_through_f32);
    tcase_add_test(narrow_f64, f64_to_bf16_equals_nearest_neighbour_search_on_1m_random_doubles);
    tcase_add_test(narrow_f64, f64_to_f16_equals_float16_cast_on_1m_random_doubles);
    suite_add_tcase(s, narrow_f64);

    TCase *convert = tcase_new("convert");
    tcase_add_test(convert, convert_matches_per_element_reference_for_all_49_dtype_pairs);
    tcase_add_test(convert, convert_in_place_matches_reference_for_same_size_pairs);
    tcase_add_test(convert, convert_of_zero_elements_succeeds_and_writes_nothing);
    tcase_add_test(convert, convert_rejects_unknown_dtype_and_names_it);
    suite_add_tcase(s, convert);

    TCase *names = tcase_new("names");
    tcase_add_test(names, dtype_size_name_parse_and_is_float_round_trip_for_every_dtype);
    tcase_add_test(names, dtype_parse_accepts_the_pytorch_spellings);
    tcase_add_test(names, dtype_parse_rejects_unknown_name_and_names_it);
    tcase_add_test(names, dtype_queries_reject_unknown_values);
    suite_add_tcase(s, names);

    return s;
}

FSDP2_CHECK_MAIN(dtype_suite)
