/* dtype names and sizes, scalar conversions, and bulk conversion. */
#include <string.h>

#include "core/dtype_convert.h"
#include "core/error.h"

typedef struct dtype_info {
    const char *name;
    size_t bytes;
} dtype_info_t;

static const dtype_info_t dtype_table[FSDP2_DTYPE_COUNT] = {
#define FSDP2_DTYPE_ROW_(name, id, bytes, str) [id] = {str, bytes},
    FSDP2_DTYPE_MAP(FSDP2_DTYPE_ROW_)
#undef FSDP2_DTYPE_ROW_
};

static const struct {
    const char *alias;
    fsdp2_dtype_t dtype;
} dtype_aliases[] = {
    {"float32", FSDP2_F32}, {"float", FSDP2_F32},    {"float64", FSDP2_F64},
    {"double", FSDP2_F64},  {"bfloat16", FSDP2_BF16}, {"float16", FSDP2_F16},
    {"half", FSDP2_F16},    {"int32", FSDP2_I32},    {"int", FSDP2_I32},
    {"int64", FSDP2_I64},   {"long", FSDP2_I64},     {"uint8", FSDP2_U8},
};

static int dtype_valid(fsdp2_dtype_t dtype)
{
    return (int)dtype >= 0 && dtype < FSDP2_DTYPE_COUNT;
}

fsdp2_status_t fsdp2_dtype_size(fsdp2_dtype_t dtype, size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_ARG_CHECK(dtype_valid(dtype), "dtype %d is not a valid fsdp2_dtype_t", (int)dtype);
    *bytes = dtype_table[dtype].bytes;
    return FSDP2_SUCCESS;
}

const char *fsdp2_dtype_name(fsdp2_dtype_t dtype)
{
    return dtype_valid(dtype) ? dtype_table[dtype].name : "invalid";
}

fsdp2_status_t fsdp2_dtype_parse(const char *name, fsdp2_dtype_t *dtype)
{
    FSDP2_ARG_CHECK(name && dtype, "name or dtype is NULL");
    for (int i = 0; i < FSDP2_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *dtype = (fsdp2_dtype_t)i;
            return FSDP2_SUCCESS;
        }
    }
    for (size_t i = 0; i < sizeof(dtype_aliases) / sizeof(dtype_aliases[0]); i++) {
        if (strcmp(name, dtype_aliases[i].alias) == 0) {
            *dtype = dtype_aliases[i].dtype;
            return FSDP2_SUCCESS;
        }
    }
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                       "dtype '%s' is not one of f32, f64, bf16, f16, i32, i64, u8", name);
}

fsdp2_status_t fsdp2_dtype_is_float(fsdp2_dtype_t dtype, int *is_float)
{
    FSDP2_ARG_CHECK(is_float, "is_float is NULL");
    FSDP2_ARG_CHECK(dtype_valid(dtype), "dtype %d is not a valid fsdp2_dtype_t", (int)dtype);
    *is_float = !dtype_is_int(dtype);
    return FSDP2_SUCCESS;
}

uint16_t fsdp2_f32_to_bf16(float value) { return cvt_f32_to_bf16(value); }
float fsdp2_bf16_to_f32(uint16_t bits) { return cvt_bf16_to_f32(bits); }
uint16_t fsdp2_f32_to_f16(float value) { return cvt_f32_to_f16(value); }
float fsdp2_f16_to_f32(uint16_t bits) { return cvt_f16_to_f32(bits); }
uint16_t fsdp2_f64_to_bf16(double value) { return cvt_f64_to_bf16(value); }
uint16_t fsdp2_f64_to_f16(double value) { return cvt_f64_to_f16(value); }

/* The pairs FSDP moves in bulk (copy-in casts, gradient casts) get their own loops. */
FSDP2_VECTOR_CLONES
static int convert_fast(void *dst, fsdp2_dtype_t dt, const void *src, fsdp2_dtype_t st,
                        size_t n)
{
    if (dt == FSDP2_BF16 && st == FSDP2_F32) {
        uint16_t *d = dst;
        const float *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = cvt_f32_to_bf16(s[i]);
    } else if (dt == FSDP2_F32 && st == FSDP2_BF16) {
        float *d = dst;
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = cvt_bf16_to_f32(s[i]);
    } else if (dt == FSDP2_F16 && st == FSDP2_F32) {
        uint16_t *d = dst;
        const float *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = cvt_f32_to_f16(s[i]);
    } else if (dt == FSDP2_F32 && st == FSDP2_F16) {
        float *d = dst;
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = cvt_f16_to_f32(s[i]);
    } else if (dt == FSDP2_F64 && st == FSDP2_F32) {
        double *d = dst;
        const float *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = s[i];
    } else if (dt == FSDP2_F32 && st == FSDP2_F64) {
        float *d = dst;
        const double *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = (float)s[i];
    } else {
        return 0;
    }
    return 1;
}

void fsdp2_convert_unchecked(void *dst, fsdp2_dtype_t dst_dtype, const void *src,
                             fsdp2_dtype_t src_dtype, size_t n)
{
    if (n == 0)
        return;
    if (dst_dtype == src_dtype) {
        if (dst != src)
            memmove(dst, src, n * dtype_table[dst_dtype].bytes);
        return;
    }
    if (convert_fast(dst, dst_dtype, src, src_dtype, n))
        return;
    if (dtype_is_int(src_dtype)) {
        for (size_t i = 0; i < n; i++)
            store_from_i64(dst, dst_dtype, i, load_i64(src, src_dtype, i));
    } else {
        for (size_t i = 0; i < n; i++)
            store_from_f64(dst, dst_dtype, i, load_f64(src, src_dtype, i));
    }
}

fsdp2_status_t fsdp2_convert(void *dst, fsdp2_dtype_t dst_dtype, const void *src,
                             fsdp2_dtype_t src_dtype, size_t n)
{
    FSDP2_ARG_CHECK(dtype_valid(dst_dtype), "destination dtype %d is not a valid fsdp2_dtype_t",
                    (int)dst_dtype);
    FSDP2_ARG_CHECK(dtype_valid(src_dtype), "source dtype %d is not a valid fsdp2_dtype_t",
                    (int)src_dtype);
    if (n == 0)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(dst && src, "dst=%p or src=%p is NULL with n=%zu", dst, src, n);
    size_t db = dtype_table[dst_dtype].bytes, sb = dtype_table[src_dtype].bytes;
    const char *d = dst, *s = src;
    int overlap = d < s + n * sb && s < d + n * db;
    FSDP2_ARG_CHECK(!overlap || (d == s && db == sb),
                    "dst and src overlap (dst=%p %s, src=%p %s, n=%zu)", dst,
                    fsdp2_dtype_name(dst_dtype), src, fsdp2_dtype_name(src_dtype), n);
    fsdp2_convert_unchecked(dst, dst_dtype, src, src_dtype, n);
    return FSDP2_SUCCESS;
}
