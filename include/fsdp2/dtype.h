/* Element types and scalar conversions.
 *
 * bf16 and f16 are stored as uint16_t bit patterns. Conversions to them round to
 * nearest, ties to even, keep the sign of zero, map NaN to a quiet NaN with the sign
 * kept, and overflow to infinity; f64 converts directly (no double rounding through
 * f32). Float to integer truncates toward zero and saturates at the integer's range;
 * NaN converts to 0. */
#ifndef FSDP2_DTYPE_H
#define FSDP2_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

/* XX(name, id, bytes, string) */
#define FSDP2_DTYPE_MAP(XX)   \
    XX(F32, 0, 4, "f32")      \
    XX(F64, 1, 8, "f64")      \
    XX(BF16, 2, 2, "bf16")    \
    XX(F16, 3, 2, "f16")      \
    XX(I32, 4, 4, "i32")      \
    XX(I64, 5, 8, "i64")      \
    XX(U8, 6, 1, "u8")

typedef enum fsdp2_dtype {
#define FSDP2_DTYPE_ENUM_(name, id, bytes, str) FSDP2_##name = id,
    FSDP2_DTYPE_MAP(FSDP2_DTYPE_ENUM_)
#undef FSDP2_DTYPE_ENUM_
    FSDP2_DTYPE_COUNT
} fsdp2_dtype_t;

/* Bytes per element in *bytes; FSDP2_ERR_INVALID_ARGUMENT for an unknown dtype. */
FSDP2_API fsdp2_status_t fsdp2_dtype_size(fsdp2_dtype_t dtype, size_t *bytes);

/* "f32", "bf16", ...; "invalid" for an unknown value. Never NULL, static storage. */
FSDP2_API const char *fsdp2_dtype_name(fsdp2_dtype_t dtype);

/* Parses "f32", "bf16", ... (also the PyTorch spellings "float32", "bfloat16",
 * "float16", "half", "float", "double", "int32", "int64", "uint8"). */
FSDP2_API fsdp2_status_t fsdp2_dtype_parse(const char *name, fsdp2_dtype_t *dtype);

/* Whether the dtype is floating point (f32, f64, bf16, f16) in *is_float. */
FSDP2_API fsdp2_status_t fsdp2_dtype_is_float(fsdp2_dtype_t dtype, int *is_float);

/* Scalar conversions between f32/f64 and the 16-bit float formats. Pure functions:
 * they cannot fail, so they return the value. */
FSDP2_API uint16_t fsdp2_f32_to_bf16(float value);
FSDP2_API float fsdp2_bf16_to_f32(uint16_t bits);
FSDP2_API uint16_t fsdp2_f32_to_f16(float value);
FSDP2_API float fsdp2_f16_to_f32(uint16_t bits);
FSDP2_API uint16_t fsdp2_f64_to_bf16(double value);
FSDP2_API uint16_t fsdp2_f64_to_f16(double value);

/* Converts n elements from src (src_dtype) to dst (dst_dtype) on the calling thread,
 * following the rules above. dst and src must not overlap unless they are equal and
 * the dtypes have the same size. */
FSDP2_API fsdp2_status_t fsdp2_convert(void *dst, fsdp2_dtype_t dst_dtype, const void *src,
                                       fsdp2_dtype_t src_dtype, size_t n);

FSDP2_EXTERN_C_END

#endif
