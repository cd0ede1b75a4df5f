/* safetensors reader/writer and CRC-32C (lib/checkpoint/safetensors.h).
 *
 * - CRC-32C against published vectors (iSCSI, RFC 3720 B.4) and a bit-at-a-time loop,
 *   both the dispatching and the portable path, one-shot against every split.
 * - Written files are checked against an independent construction: the header is parsed
 *   here with cJSON and every field compared with offsets summed here in declaration
 *   order; the padding, the length prefix and the data bytes are compared byte for byte.
 * - When python3 has safetensors and numpy, the Python package reads our file and we
 *   read its file (otherwise that check is skipped with a note).
 * - Every class of corruption is FSDP2_ERR_CORRUPT naming the file and the entry.
 * - A deterministic mutation test (fixed seed) feeds thousands of damaged files to
 *   st_open and st_parse_header: each must succeed with entries that tile the data or
 *   fail with CORRUPT/IO, and never crash (run it under ASan: build-asan).
 *
 * The libFuzzer harness for the same parser is fuzz_safetensors.c, built with -Dfuzz=true
 * under clang and run for a couple of minutes on the corpus:
 *   CC=clang meson setup /tmp/fuzzbuild -Dfuzz=true -Db_sanitize=address,undefined \
 *       -Db_lundef=false -Dcuda=disabled
 *   ninja -C /tmp/fuzzbuild tests/checkpoint/fuzz_safetensors
 *   /tmp/fuzzbuild/tests/checkpoint/fuzz_safetensors -max_total_time=120 -max_len=4096 \
 *       /tmp/fuzzcorpus tests/checkpoint/corpus */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include <fsdp2/dtype.h>
#include <fsdp2/status.h>

#include "checkpoint/safetensors.h"

#include "../core/check_main.h"

#define TEST_TIMEOUT_S 120

/* The portable CRC path, whatever the CPU (crc32c.c; not in the header). */
uint32_t st_crc32c_portable(uint32_t crc, const void *data, size_t len);

#define ASSERT_OK(call)                                                                      \
    do {                                                                                     \
        fsdp2_status_t assert_ok_s_ = (call);                                                \
        ck_assert_msg(assert_ok_s_ == FSDP2_SUCCESS, "%s = %s (%s)", #call,                  \
                      fsdp2_status_name(assert_ok_s_), fsdp2_last_error());                  \
    } while (0)

/* The call failed with `want` and the message names `needle`. */
#define ASSERT_REFUSED(call, want, needle)                                                   \
    do {                                                                                     \
        fsdp2_status_t refused_s_ = (call);                                                  \
        ck_assert_msg(refused_s_ == (want) && strstr(fsdp2_last_error(), (needle)) != NULL,  \
                      "%s = %s (%s), want %s naming '%s'", #call, fsdp2_status_name(refused_s_), \
                      fsdp2_last_error(), fsdp2_status_name(want), (needle));                \
    } while (0)

/* ---------------------------------------------------------------------------------- */
/* Helpers: random numbers, a scratch directory, files                                 */

/* Marsaglia's xorshift64: fixed seeds make every run test the same inputs. */
static uint64_t rng_next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

static char scratch[256];

static void scratch_setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof(scratch), "%s/st_test_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(scratch) != NULL, "mkdtemp %s: %s", scratch, strerror(errno));
}

/* Every test makes plain files directly in the scratch directory. */
static void scratch_teardown(void)
{
    DIR *d = opendir(scratch);
    if (d == NULL)
        return;
    struct dirent *ent;
    char path[512];
    while ((ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", scratch, ent->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(scratch);
}

static const char *scratch_path(const char *name)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", scratch, name);
    return path;
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_msg(fp != NULL, "fopen %s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(data, 1, len, fp), len);
    ck_assert_int_eq(fclose(fp), 0);
}

static unsigned char *read_bytes(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "fopen %s: %s", path, strerror(errno));
    ck_assert_int_eq(fseek(fp, 0, SEEK_END), 0);
    long size = ftell(fp);
    ck_assert_int_ge(size, 0);
    rewind(fp);
    unsigned char *buf = malloc((size_t)size + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)size, fp), (size_t)size);
    fclose(fp);
    *len = (size_t)size;
    return buf;
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A file: the 8-byte length of json (or `length` when not ~0), json, then data_len
 * bytes of a pattern. The caller frees. */
static unsigned char *make_file(const char *json, uint64_t length, size_t data_len, size_t *len)
{
    size_t json_len = strlen(json);
    *len = 8 + json_len + data_len;
    unsigned char *buf = malloc(*len);
    ck_assert_ptr_nonnull(buf);
    put_le64(buf, length == ~(uint64_t)0 ? json_len : length);
    memcpy(buf + 8, json, json_len);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + json_len + i] = (unsigned char)(i * 131 + 7);
    return buf;
}

/* ---------------------------------------------------------------------------------- */
/* CRC-32C                                                                              */

/* The definition, one bit at a time. */
static uint32_t crc32c_bitwise(uint32_t crc, const unsigned char *p, size_t len)
{
    crc = ~crc;
    for (size_t i = 0; i < len; i++) {
        crc ^= p[i];
        for (int b = 0; b < 8; b++)
            crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

START_TEST(crc32c_matches_the_published_vectors)
{
    ck_assert_uint_eq(st_crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(st_crc32c_portable(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(crc32c_bitwise(0, (const unsigned char *)"123456789", 9), 0xE3069283u);
    /* RFC 3720 B.4: 32 bytes of zeros, of ones, ascending, descending. */
    unsigned char buf[32];
    const struct {
        int kind;
        uint32_t want;
    } vectors[] = {{0, 0x8A9136AAu}, {1, 0x62A8AB43u}, {2, 0x46DD794Eu}, {3, 0x113FDB5Cu}};
    for (size_t v = 0; v < sizeof(vectors) / sizeof(vectors[0]); v++) {
        for (int i = 0; i < 32; i++)
            buf[i] = vectors[v].kind == 0 ? 0 : vectors[v].kind == 1 ? 0xFF :
                     vectors[v].kind == 2 ? (unsigned char)i : (unsigned char)(31 - i);
        ck_assert_uint_eq(st_crc32c(0, buf, 32), vectors[v].want);
        ck_assert_uint_eq(st_crc32c_portable(0, buf, 32), vectors[v].want);
    }
    ck_assert_uint_eq(st_crc32c(0x12345678u, buf, 0), 0x12345678u);
    ck_assert_uint_eq(st_crc32c(0, NULL, 0), 0);
}
END_TEST

START_TEST(crc32c_both_paths_equal_the_bitwise_loop_at_every_length_and_alignment)
{
    unsigned char buf[600];
    uint64_t rng = 0x9E3779B97F4A7C15u;
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)rng_next(&rng);
    for (size_t align = 0; align < 8; align++)
        for (size_t len = 0; len + align <= 520; len++) {
            uint32_t want = crc32c_bitwise(0, buf + align, len);
            uint32_t fast = st_crc32c(0, buf + align, len);
            uint32_t portable = st_crc32c_portable(0, buf + align, len);
            if (fast != want || portable != want)
                ck_abort_msg("len %zu align %zu: st_crc32c %08x portable %08x bitwise %08x", len,
                             align, fast, portable, want);
        }
}
END_TEST

START_TEST(crc32c_incremental_equals_one_shot_at_every_split)
{
    unsigned char buf[1031];
    uint64_t rng = 42;
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)rng_next(&rng);
    uint32_t whole = st_crc32c(0, buf, sizeof(buf));
    ck_assert_uint_eq(whole, crc32c_bitwise(0, buf, sizeof(buf)));
    for (size_t k = 0; k <= sizeof(buf); k++) {
        uint32_t a = st_crc32c(st_crc32c(0, buf, k), buf + k, sizeof(buf) - k);
        uint32_t b = st_crc32c_portable(st_crc32c_portable(0, buf, k), buf + k, sizeof(buf) - k);
        if (a != whole || b != whole)
            ck_abort_msg("split at %zu: %08x / %08x, one shot %08x", k, a, b, whole);
    }
    /* Many small pieces of odd sizes. */
    uint32_t crc = 0;
    for (size_t at = 0, step = 1; at < sizeof(buf); at += step, step = step % 13 + 1)
        crc = st_crc32c(crc, buf + at, at + step <= sizeof(buf) ? step : sizeof(buf) - at);
    ck_assert_uint_eq(crc, whole);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Dtypes                                                                              */

static const struct {
    fsdp2_dtype_t dtype;
    const char *name;
    size_t size;
} DTYPES[] = {
    {FSDP2_F32, "F32", 4}, {FSDP2_F64, "F64", 8}, {FSDP2_BF16, "BF16", 2}, {FSDP2_F16, "F16", 2},
    {FSDP2_I32, "I32", 4}, {FSDP2_I64, "I64", 8}, {FSDP2_U8, "U8", 1},
};
#define NUM_DTYPES (sizeof(DTYPES) / sizeof(DTYPES[0]))

static const char *dtype_text(fsdp2_dtype_t dtype)
{
    for (size_t i = 0; i < NUM_DTYPES; i++)
        if (DTYPES[i].dtype == dtype)
            return DTYPES[i].name;
    return "?";
}

static size_t dtype_bytes(fsdp2_dtype_t dtype)
{
    for (size_t i = 0; i < NUM_DTYPES; i++)
        if (DTYPES[i].dtype == dtype)
            return DTYPES[i].size;
    return 0;
}

START_TEST(dtype_names_round_trip_and_unknown_names_are_corrupt)
{
    for (size_t i = 0; i < NUM_DTYPES; i++) {
        ck_assert_str_eq(st_dtype_name(DTYPES[i].dtype), DTYPES[i].name);
        fsdp2_dtype_t back = FSDP2_DTYPE_COUNT;
        ASSERT_OK(st_dtype_parse(DTYPES[i].name, &back));
        ck_assert_int_eq(back, DTYPES[i].dtype);
    }
    const char *unknown[] = {"F8", "f32", "", "BOOL", "F8_E4M3", "F32 "};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        fsdp2_dtype_t d;
        ASSERT_REFUSED(st_dtype_parse(unknown[i], &d), FSDP2_ERR_CORRUPT, unknown[i]);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Round trip                                                                           */

typedef struct tensor_spec {
    const char *name;
    fsdp2_dtype_t dtype;
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
} tensor_spec_t;

static const tensor_spec_t ROUND_TRIP[] = {
    {"layer.0.weight", FSDP2_F32, 2, {3, 5}},
    {"scalar.f64", FSDP2_F64, 0, {0}},
    {"bf16", FSDP2_BF16, 1, {7}},
    {"empty.f16", FSDP2_F16, 1, {0}},
    {"f16", FSDP2_F16, 3, {2, 3, 1}},
    {"empty.i32", FSDP2_I32, 3, {4, 0, 3}},
    {"i64", FSDP2_I64, 2, {2, 2}},
    {"u8.odd", FSDP2_U8, 1, {5}},
    {"scalar.u8", FSDP2_U8, 0, {0}},
    {"i32.unaligned", FSDP2_I32, 1, {3}},
    {"scalar.bf16", FSDP2_BF16, 0, {0}},
    {"naïve “unicode” \\ \"quoted\"\n", FSDP2_F32, 8, {1, 2, 1, 1, 2, 1, 1, 1}},
    {"scalar.i64", FSDP2_I64, 0, {0}},
    {"empty.last", FSDP2_F64, 2, {0, 9}},
};
#define NUM_ROUND_TRIP (sizeof(ROUND_TRIP) / sizeof(ROUND_TRIP[0]))

static const char *const META[][2] = {
    {"format", "pt"}, {"note", "ünïcode ✓"}, {"empty", ""}, {"quote", "a \"b\" \\c"}};
#define NUM_META (sizeof(META) / sizeof(META[0]))

static uint64_t spec_bytes(const tensor_spec_t *t)
{
    uint64_t n = dtype_bytes(t->dtype);
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

/* Offsets as the format lays them out: contiguous, in declaration order. */
static void spec_offsets(const tensor_spec_t *specs, size_t n, uint64_t *begin, uint64_t *total)
{
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        begin[i] = at;
        at += spec_bytes(&specs[i]);
    }
    *total = at;
}

/* Writes specs with data (the concatenated bytes) in pieces of pseudo-random sizes. */
static void write_file(const char *path, const tensor_spec_t *specs, size_t n,
                       const char *const (*meta)[2], size_t num_meta, const unsigned char *data,
                       uint64_t total, uint64_t *data_start)
{
    st_writer_t *w = NULL;
    ASSERT_OK(st_writer_create(path, &w));
    for (size_t i = 0; i < n; i++)
        ASSERT_OK(st_writer_add(w, specs[i].name, specs[i].dtype, specs[i].ndim, specs[i].shape));
    for (size_t i = 0; i < num_meta; i++)
        ASSERT_OK(st_writer_meta(w, meta[i][0], meta[i][1]));
    ASSERT_OK(st_writer_begin(w, data_start));
    uint64_t rng = 7;
    for (uint64_t at = 0; at < total;) {
        uint64_t piece = 1 + rng_next(&rng) % 37;
        if (piece > total - at)
            piece = total - at;
        ASSERT_OK(st_writer_write(w, data + at, (size_t)piece));
        at += piece;
    }
    ASSERT_OK(st_writer_finish(w));
}

static unsigned char *random_bytes(size_t n, uint64_t seed)
{
    unsigned char *p = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)rng_next(&seed);
    return p;
}

/* The header as bytes: parsed here with cJSON and compared field by field. */
static void check_header_bytes(const unsigned char *file, size_t file_len,
                               const tensor_spec_t *specs, size_t n, const uint64_t *begin,
                               const char *const (*meta)[2], size_t num_meta)
{
    ck_assert_uint_ge(file_len, 8);
    uint64_t header_len = le64(file);
    ck_assert_uint_le(8 + header_len, file_len);
    ck_assert_uint_eq((8 + header_len) % 8, 0);
    const char *json = (const char *)file + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)header_len, &end, 0);
    ck_assert_msg(root != NULL, "header does not parse: %.*s", (int)header_len, json);
    size_t json_len = (size_t)(end - json);
    ck_assert_msg(header_len - json_len < 8, "%" PRIu64 " bytes of padding", header_len - json_len);
    for (size_t i = json_len; i < header_len; i++)
        ck_assert_msg(json[i] == ' ', "padding byte %zu is 0x%02x", i, (unsigned char)json[i]);
    ck_assert_int_eq(cJSON_GetArraySize(root), (int)(n + (num_meta > 0)));
    for (size_t i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, specs[i].name);
        ck_assert_msg(cJSON_IsObject(t), "no entry '%s'", specs[i].name);
        const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        ck_assert_msg(cJSON_IsString(dtype), "'%s': dtype", specs[i].name);
        ck_assert_str_eq(dtype->valuestring, dtype_text(specs[i].dtype));
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        ck_assert_msg(cJSON_IsArray(shape), "'%s': shape", specs[i].name);
        ck_assert_int_eq(cJSON_GetArraySize(shape), specs[i].ndim);
        for (int d = 0; d < specs[i].ndim; d++)
            ck_assert_int_eq((int64_t)cJSON_GetArrayItem(shape, d)->valuedouble, specs[i].shape[d]);
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        ck_assert_msg(cJSON_IsArray(off) && cJSON_GetArraySize(off) == 2, "'%s': offsets",
                      specs[i].name);
        ck_assert_uint_eq((uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble, begin[i]);
        ck_assert_uint_eq((uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble,
                          begin[i] + spec_bytes(&specs[i]));
    }
    if (num_meta > 0) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
        ck_assert_msg(cJSON_IsObject(m), "no __metadata__");
        ck_assert_int_eq(cJSON_GetArraySize(m), (int)num_meta);
        for (size_t i = 0; i < num_meta; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, meta[i][0]);
            ck_assert_msg(cJSON_IsString(v), "__metadata__ '%s'", meta[i][0]);
            ck_assert_str_eq(v->valuestring, meta[i][1]);
        }
    }
    cJSON_Delete(root);
}

START_TEST(round_trip_of_every_dtype_with_scalars_empty_tensors_and_metadata)
{
    const char *path = scratch_path("round_trip.safetensors");
    uint64_t begin[NUM_ROUND_TRIP], total, data_start = 0;
    spec_offsets(ROUND_TRIP, NUM_ROUND_TRIP, begin, &total);
    unsigned char *data = random_bytes((size_t)total, 1234);
    write_file(path, ROUND_TRIP, NUM_ROUND_TRIP, META, NUM_META, data, total, &data_start);

    /* The bytes: length prefix, header, padding, then the data in declaration order. */
    size_t file_len;
    unsigned char *file = read_bytes(path, &file_len);
    ck_assert_uint_eq(data_start, 8 + le64(file));
    ck_assert_uint_eq(data_start % 8, 0);
    ck_assert_uint_eq(file_len, data_start + total);
    check_header_bytes(file, file_len, ROUND_TRIP, NUM_ROUND_TRIP, begin, META, NUM_META);
    ck_assert_msg(memcmp(file + data_start, data, (size_t)total) == 0, "data section differs");

    /* And the reader. */
    st_file_t f;
    ASSERT_OK(st_open(path, &f));
    ck_assert_str_eq(f.path, path);
    ck_assert_int_ge(f.fd, 0);
    ck_assert_uint_eq(f.data_start, data_start);
    ck_assert_uint_eq(f.file_size, file_len);
    ck_assert_uint_eq(f.num_entries, NUM_ROUND_TRIP);
    for (size_t i = 1; i < f.num_entries; i++)
        ck_assert_uint_le(f.entries[i - 1].begin, f.entries[i].begin);
    for (size_t i = 0; i < NUM_ROUND_TRIP; i++) {
        const tensor_spec_t *s = &ROUND_TRIP[i];
        const st_entry_t *e = st_find(&f, s->name);
        ck_assert_msg(e != NULL, "st_find('%s')", s->name);
        ck_assert_str_eq(e->name, s->name);
        ck_assert_int_eq(e->dtype, s->dtype);
        ck_assert_int_eq(e->ndim, s->ndim);
        for (int d = 0; d < s->ndim; d++)
            ck_assert_int_eq(e->shape[d], s->shape[d]);
        ck_assert_uint_eq(e->begin, begin[i]);
        ck_assert_uint_eq(e->end, begin[i] + spec_bytes(s));
        size_t bytes = (size_t)spec_bytes(s);
        unsigned char *got = malloc(bytes + 1);
        ASSERT_OK(st_read(&f, e, 0, got, bytes));
        ck_assert_msg(memcmp(got, data + begin[i], bytes) == 0, "'%s' data differs", s->name);
        if (bytes >= 3) { /* a piece from the middle */
            ASSERT_OK(st_read(&f, e, 1, got, bytes - 2));
            ck_assert_msg(memcmp(got, data + begin[i] + 1, bytes - 2) == 0, "'%s' piece", s->name);
        }
        ASSERT_OK(st_read(&f, e, bytes, got, 0));
        free(got);
    }
    ck_assert_ptr_null(st_find(&f, "missing"));
    ck_assert_uint_eq(f.num_meta, NUM_META);
    for (size_t i = 0; i < NUM_META; i++) {
        int found = 0;
        for (size_t j = 0; j < f.num_meta; j++)
            if (strcmp(f.meta[j].key, META[i][0]) == 0) {
                ck_assert_str_eq(f.meta[j].value, META[i][1]);
                found = 1;
            }
        ck_assert_msg(found, "metadata '%s' missing", META[i][0]);
    }
    st_close(&f);
    ck_assert_int_eq(f.fd, -1);
    st_close(&f); /* twice is harmless */

    /* The same header parsed from memory. */
    ASSERT_OK(st_parse_header((const char *)file + 8, (size_t)(data_start - 8), total, "mem", &f));
    ck_assert_ptr_null(f.path);
    ck_assert_int_eq(f.fd, -1);
    ck_assert_uint_eq(f.data_start, data_start);
    ck_assert_uint_eq(f.file_size, file_len);
    ck_assert_uint_eq(f.num_entries, NUM_ROUND_TRIP);
    unsigned char byte;
    ASSERT_REFUSED(st_read(&f, &f.entries[0], 0, &byte, 0), FSDP2_ERR_INVALID_ARGUMENT,
                   "without a file");
    st_close(&f);
    free(file);
    free(data);
}
END_TEST

START_TEST(writer_offsets_and_data_start_agree_with_the_file)
{
    const char *path = scratch_path("offsets.safetensors");
    st_writer_t *w = NULL;
    ASSERT_OK(st_writer_create(path, &w));
    uint64_t begin[NUM_ROUND_TRIP], total;
    spec_offsets(ROUND_TRIP, NUM_ROUND_TRIP, begin, &total);
    for (size_t i = 0; i < NUM_ROUND_TRIP; i++)
        ASSERT_OK(st_writer_add(w, ROUND_TRIP[i].name, ROUND_TRIP[i].dtype, ROUND_TRIP[i].ndim,
                                ROUND_TRIP[i].shape));
    uint64_t data_start = 0, offset = 0;
    ASSERT_OK(st_writer_begin(w, &data_start));
    for (size_t i = 0; i < NUM_ROUND_TRIP; i++) {
        ASSERT_OK(st_writer_offset(w, ROUND_TRIP[i].name, &offset));
        ck_assert_uint_eq(offset, begin[i]);
    }
    ASSERT_REFUSED(st_writer_offset(w, "missing", &offset), FSDP2_ERR_NOT_FOUND, "missing");
    unsigned char *data = random_bytes((size_t)total, 99);
    ASSERT_OK(st_writer_write(w, data, (size_t)total)); /* all tensors in one call */
    ASSERT_OK(st_writer_finish(w));
    size_t len;
    unsigned char *file = read_bytes(path, &len);
    ck_assert_uint_eq(le64(file) + 8, data_start);
    ck_assert_msg(memcmp(file + data_start, data, (size_t)total) == 0, "data differs");
    free(file);
    free(data);
}
END_TEST

START_TEST(a_file_without_tensors_is_an_eight_byte_header)
{
    const char *path = scratch_path("empty.safetensors");
    st_writer_t *w = NULL;
    uint64_t data_start = 0;
    ASSERT_OK(st_writer_create(path, &w));
    ASSERT_OK(st_writer_begin(w, &data_start));
    ASSERT_OK(st_writer_finish(w));
    size_t len;
    unsigned char *file = read_bytes(path, &len);
    static const unsigned char want[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    ck_assert_uint_eq(len, sizeof(want));
    ck_assert_msg(memcmp(file, want, sizeof(want)) == 0, "bytes: %.*s", (int)len - 8, file + 8);
    ck_assert_uint_eq(data_start, 16);
    st_file_t f;
    ASSERT_OK(st_open(path, &f));
    ck_assert_uint_eq(f.num_entries, 0);
    ck_assert_uint_eq(f.num_meta, 0);
    st_close(&f);
    free(file);
}
END_TEST

/* Pieces larger than the writer's buffer go straight through, around buffered ones. */
START_TEST(large_and_small_writes_interleave_correctly)
{
    const char *path = scratch_path("large.safetensors");
    const tensor_spec_t specs[] = {
        {"small.a", FSDP2_U8, 1, {3}},
        {"big", FSDP2_F32, 1, {(3 << 18) + 5}}, /* 3 MiB + 20 bytes */
        {"medium", FSDP2_F64, 2, {1000, 17}},
        {"huge", FSDP2_U8, 1, {5 << 20}},
        {"small.b", FSDP2_BF16, 0, {0}},
    };
    size_t n = sizeof(specs) / sizeof(specs[0]);
    uint64_t begin[5], total;
    spec_offsets(specs, n, begin, &total);
    unsigned char *data = random_bytes((size_t)total, 5);
    st_writer_t *w = NULL;
    ASSERT_OK(st_writer_create(path, &w));
    for (size_t i = 0; i < n; i++)
        ASSERT_OK(st_writer_add(w, specs[i].name, specs[i].dtype, specs[i].ndim, specs[i].shape));
    ASSERT_OK(st_writer_begin(w, NULL));
    ASSERT_OK(st_writer_write(w, data, 3));
    ASSERT_OK(st_writer_write(w, data + begin[1], (size_t)spec_bytes(&specs[1])));
    for (uint64_t at = begin[2]; at < begin[3]; at += 1000)
        ASSERT_OK(st_writer_write(w, data + at, (size_t)(begin[3] - at < 1000 ? begin[3] - at : 1000)));
    ASSERT_OK(st_writer_write(w, data + begin[3], (size_t)(total - begin[3] - 2)));
    ASSERT_OK(st_writer_write(w, data + total - 2, 2));
    ASSERT_OK(st_writer_finish(w));
    st_file_t f;
    ASSERT_OK(st_open(path, &f));
    unsigned char *got = malloc((size_t)total);
    for (size_t i = 0; i < n; i++) {
        const st_entry_t *e = st_find(&f, specs[i].name);
        ck_assert_ptr_nonnull(e);
        ASSERT_OK(st_read(&f, e, 0, got + begin[i], (size_t)spec_bytes(&specs[i])));
    }
    ck_assert_msg(memcmp(got, data, (size_t)total) == 0, "data differs");
    ck_assert_uint_eq(st_crc32c(0, got, (size_t)total), st_crc32c_portable(0, data, (size_t)total));
    st_close(&f);
    free(got);
    free(data);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Writer misuse                                                                       */

START_TEST(writer_refuses_an_existing_path_and_leaves_it_alone)
{
    const char *path = scratch_path("exists.safetensors");
    write_bytes(path, "keep", 4);
    st_writer_t *w = (st_writer_t *)&w;
    ASSERT_REFUSED(st_writer_create(path, &w), FSDP2_ERR_IO, path);
    ck_assert_ptr_null(w);
    ck_assert_msg(strstr(fsdp2_last_error(), strerror(EEXIST)) != NULL, "%s", fsdp2_last_error());
    size_t len;
    unsigned char *kept = read_bytes(path, &len);
    ck_assert_uint_eq(len, 4);
    ck_assert_int_eq(memcmp(kept, "keep", 4), 0);
    free(kept);
    ASSERT_REFUSED(st_writer_create(scratch_path("no/such/dir.safetensors"), &w), FSDP2_ERR_IO,
                   "no/such/dir");
}
END_TEST

START_TEST(writer_refuses_bad_declarations_naming_them)
{
    const char *path = scratch_path("bad.safetensors");
    st_writer_t *w = NULL;
    ASSERT_OK(st_writer_create(path, &w));
    int64_t shape[FSDP2_MAX_DIMS + 1] = {2, 2, 2, 2, 2, 2, 2, 2, 2};
    ASSERT_OK(st_writer_add(w, "a", FSDP2_F32, 1, shape));
    ASSERT_REFUSED(st_writer_add(w, "a", FSDP2_F32, 1, shape), FSDP2_ERR_INVALID_ARGUMENT,
                   "'a' added twice");
    ASSERT_REFUSED(st_writer_add(w, "__metadata__", FSDP2_F32, 1, shape),
                   FSDP2_ERR_INVALID_ARGUMENT, "__metadata__");
    ASSERT_REFUSED(st_writer_add(w, "b", FSDP2_F32, FSDP2_MAX_DIMS + 1, shape),
                   FSDP2_ERR_INVALID_ARGUMENT, "ndim 9");
    ASSERT_REFUSED(st_writer_add(w, "b", FSDP2_F32, -1, shape), FSDP2_ERR_INVALID_ARGUMENT,
                   "ndim -1");
    ASSERT_REFUSED(st_writer_add(w, "b", FSDP2_F32, 1, NULL), FSDP2_ERR_INVALID_ARGUMENT, "'b'");
    ASSERT_REFUSED(st_writer_add(w, "b", (fsdp2_dtype_t)99, 1, shape), FSDP2_ERR_INVALID_ARGUMENT,
                   "dtype 99");
    int64_t negative[2] = {3, -4};
    ASSERT_REFUSED(st_writer_add(w, "b", FSDP2_F32, 2, negative), FSDP2_ERR_INVALID_ARGUMENT,
                   "dimension 1 is -4");
    int64_t overflow[3] = {(int64_t)1 << 30, (int64_t)1 << 30, (int64_t)1 << 30};
    ASSERT_REFUSED(st_writer_add(w, "b", FSDP2_F32, 3, overflow), FSDP2_ERR_OVERFLOW, "'b'");
    int64_t big[2] = {(int64_t)1 << 26, (int64_t)1 << 26}; /* 2^52 x 4 bytes > 2^53 */
    ASSERT_REFUSED(st_writer_add(w, "b", FSDP2_F32, 2, big), FSDP2_ERR_OVERFLOW, "2^53");
    ASSERT_REFUSED(st_writer_add(w, "bad\xff", FSDP2_F32, 1, shape), FSDP2_ERR_INVALID_ARGUMENT,
                   "UTF-8");
    char long_name[ST_NAME_MAX + 1];
    memset(long_name, 'x', ST_NAME_MAX);
    long_name[ST_NAME_MAX] = '\0';
    ASSERT_REFUSED(st_writer_add(w, long_name, FSDP2_F32, 1, shape), FSDP2_ERR_INVALID_ARGUMENT,
                   "512 bytes");
    long_name[ST_NAME_MAX - 1] = '\0'; /* 511 bytes fit */
    ASSERT_OK(st_writer_add(w, long_name, FSDP2_U8, 0, NULL));
    /* An empty tensor may have dimensions a non-empty one could not. */
    int64_t empty_huge[3] = {(int64_t)1 << 40, 0, (int64_t)1 << 40};
    ASSERT_OK(st_writer_add(w, "empty.huge", FSDP2_F64, 3, empty_huge));
    ASSERT_OK(st_writer_meta(w, "k", "v"));
    ASSERT_REFUSED(st_writer_meta(w, "k", "w"), FSDP2_ERR_INVALID_ARGUMENT, "'k' added twice");
    ASSERT_REFUSED(st_writer_meta(w, "k2", "\xc0\x80"), FSDP2_ERR_INVALID_ARGUMENT, "UTF-8");
    ASSERT_REFUSED(st_writer_finish(w), FSDP2_ERR_INVALID_STATE, "before st_writer_begin");
    ck_assert_msg(!file_exists(path), "a failed finish left %s", path);
}
END_TEST

START_TEST(writer_enforces_the_order_of_calls_and_the_declared_sizes)
{
    const char *path = scratch_path("order.safetensors");
    st_writer_t *w = NULL;
    ASSERT_OK(st_writer_create(path, &w));
    int64_t shape[1] = {4};
    ASSERT_OK(st_writer_add(w, "first", FSDP2_F32, 1, shape));
    ASSERT_OK(st_writer_add(w, "second", FSDP2_I64, 1, shape));
    unsigned char data[64] = {0};
    ASSERT_REFUSED(st_writer_write(w, data, 4), FSDP2_ERR_INVALID_STATE, "before st_writer_begin");
    ASSERT_OK(st_writer_begin(w, NULL));
    ASSERT_REFUSED(st_writer_begin(w, NULL), FSDP2_ERR_INVALID_STATE, "twice");
    ASSERT_REFUSED(st_writer_add(w, "late", FSDP2_F32, 1, shape), FSDP2_ERR_INVALID_STATE, "late");
    ASSERT_REFUSED(st_writer_meta(w, "late", "x"), FSDP2_ERR_INVALID_STATE, "late");
    ASSERT_REFUSED(st_writer_write(w, data, 49), FSDP2_ERR_INVALID_ARGUMENT, "48");
    ASSERT_OK(st_writer_write(w, data, 20)); /* the refusal wrote nothing */
    ASSERT_REFUSED(st_writer_finish(w), FSDP2_ERR_INVALID_STATE, "'second' has 4 of its 32 bytes");
    ck_assert_msg(!file_exists(path), "a failed finish left %s", path);

    /* Abort removes a half-written file. */
    ASSERT_OK(st_writer_create(path, &w));
    ASSERT_OK(st_writer_add(w, "first", FSDP2_F32, 1, shape));
    ASSERT_OK(st_writer_begin(w, NULL));
    ASSERT_OK(st_writer_write(w, data, 8));
    ck_assert(file_exists(path));
    st_writer_abort(w);
    ck_assert_msg(!file_exists(path), "abort left %s", path);
    st_writer_abort(NULL);
}
END_TEST

START_TEST(st_read_stays_inside_the_entry_and_reports_a_shrunk_file)
{
    const char *path = scratch_path("read.safetensors");
    const tensor_spec_t specs[] = {{"a", FSDP2_F32, 1, {4}}, {"b", FSDP2_U8, 1, {8}}};
    uint64_t begin[2], total, data_start;
    spec_offsets(specs, 2, begin, &total);
    unsigned char *data = random_bytes((size_t)total, 3);
    write_file(path, specs, 2, NULL, 0, data, total, &data_start);
    st_file_t f;
    ASSERT_OK(st_open(path, &f));
    const st_entry_t *a = st_find(&f, "a");
    unsigned char buf[32];
    ASSERT_REFUSED(st_read(&f, a, 0, buf, 17), FSDP2_ERR_INVALID_ARGUMENT, "'a'");
    ASSERT_REFUSED(st_read(&f, a, 17, buf, 0), FSDP2_ERR_INVALID_ARGUMENT, "'a'");
    ASSERT_REFUSED(st_read(&f, a, 8, buf, SIZE_MAX), FSDP2_ERR_INVALID_ARGUMENT, "'a'");
    ASSERT_REFUSED(st_read(&f, a, UINT64_MAX, buf, 2), FSDP2_ERR_INVALID_ARGUMENT, "'a'");
    st_entry_t forged = *a;
    forged.end = total + 1;
    ASSERT_REFUSED(st_read(&f, &forged, 0, buf, 1), FSDP2_ERR_INVALID_ARGUMENT, "outside");
    ck_assert_int_eq(truncate(path, (off_t)(data_start + 18)), 0);
    const st_entry_t *b = st_find(&f, "b");
    ASSERT_REFUSED(st_read(&f, b, 0, buf, 8), FSDP2_ERR_IO, path);
    st_close(&f);
    free(data);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Corruption                                                                           */

/* st_open on these bytes is CORRUPT naming the file and needle; where the bytes split
 * into length + header, st_parse_header says the same naming `what`. */
static void expect_corrupt(const unsigned char *bytes, size_t len, const char *needle)
{
    const char *path = scratch_path("corrupt.safetensors");
    unlink(path);
    write_bytes(path, bytes, len);
    st_file_t f;
    fsdp2_status_t s = st_open(path, &f);
    ck_assert_msg(s == FSDP2_ERR_CORRUPT && strstr(fsdp2_last_error(), path) != NULL &&
                      strstr(fsdp2_last_error(), needle) != NULL,
                  "st_open = %s (%s), want ERR_CORRUPT naming the file and '%s'",
                  fsdp2_status_name(s), fsdp2_last_error(), needle);
    ck_assert_int_eq(f.fd, -1);
    ck_assert_ptr_null(f.entries);
    st_close(&f);
    if (len >= 8 && le64(bytes) <= len - 8) {
        uint64_t n = le64(bytes);
        s = st_parse_header((const char *)bytes + 8, (size_t)n, len - 8 - n, "in-memory", &f);
        ck_assert_msg(s == FSDP2_ERR_CORRUPT && strstr(fsdp2_last_error(), "in-memory") != NULL &&
                          strstr(fsdp2_last_error(), needle) != NULL,
                      "st_parse_header = %s (%s), want ERR_CORRUPT naming '%s'",
                      fsdp2_status_name(s), fsdp2_last_error(), needle);
        st_close(&f);
    }
}

static void expect_json_corrupt(const char *json, size_t data_len, const char *needle)
{
    size_t len;
    unsigned char *bytes = make_file(json, ~(uint64_t)0, data_len, &len);
    expect_corrupt(bytes, len, needle);
    free(bytes);
}

static void expect_json_valid(const char *json, size_t data_len, size_t num_entries)
{
    size_t len;
    unsigned char *bytes = make_file(json, ~(uint64_t)0, data_len, &len);
    const char *path = scratch_path("valid.safetensors");
    unlink(path);
    write_bytes(path, bytes, len);
    st_file_t f;
    ASSERT_OK(st_open(path, &f));
    ck_assert_uint_eq(f.num_entries, num_entries);
    st_close(&f);
    free(bytes);
}

#define ENTRY(name, dtype, shape, b, e) \
    "\"" name "\": {\"dtype\": \"" dtype "\", \"shape\": " shape ", \"data_offsets\": [" #b ", " #e "]}"

START_TEST(truncated_files_and_bad_header_lengths_are_corrupt)
{
    size_t len;
    unsigned char *good = make_file("{" ENTRY("a", "F32", "[2]", 0, 8) "}", ~(uint64_t)0, 8, &len);
    for (size_t cut = 0; cut < 8; cut++)
        expect_corrupt(good, cut, "too short");
    /* Cut inside the header and inside the data. */
    expect_corrupt(good, 12, "the rest of the file");
    expect_corrupt(good, len - 1, "'a'");
    uint64_t header = le64(good);
    put_le64(good, header + 9); /* one byte past the file */
    expect_corrupt(good, len, "exceeds the rest of the file");
    put_le64(good, UINT64_MAX);
    expect_corrupt(good, len, "exceeds");
    put_le64(good, (uint64_t)ST_MAX_HEADER + 1);
    expect_corrupt(good, len, "ST_MAX_HEADER");
    put_le64(good, header - 1); /* the header's last byte becomes data */
    expect_corrupt(good, len, "not valid JSON");
    free(good);

    /* A header length above ST_MAX_HEADER in a file long enough to hold it (sparse). */
    const char *path = scratch_path("sparse.safetensors");
    unsigned char prefix[8];
    put_le64(prefix, (uint64_t)ST_MAX_HEADER + 8);
    write_bytes(path, prefix, 8);
    ck_assert_int_eq(truncate(path, (off_t)ST_MAX_HEADER + 64), 0);
    st_file_t f;
    ASSERT_REFUSED(st_open(path, &f), FSDP2_ERR_CORRUPT, "ST_MAX_HEADER");
    ck_assert_msg(strstr(fsdp2_last_error(), path) != NULL, "%s", fsdp2_last_error());
    ASSERT_REFUSED(st_parse_header("{}", (size_t)ST_MAX_HEADER + 1, 0, "mem", &f),
                   FSDP2_ERR_CORRUPT, "mem");
    ASSERT_REFUSED(st_open(scratch_path("missing.safetensors"), &f), FSDP2_ERR_IO,
                   "missing.safetensors");
    ASSERT_REFUSED(st_open(scratch, &f), FSDP2_ERR_IO, "not a regular file");
}
END_TEST

/* A FIFO in a file's place is refused at once, not waited on (no writer ever opens it):
 * the alarm turns a regression into a failure instead of a hang. */
START_TEST(a_fifo_is_refused_within_a_second)
{
    const char *path = scratch_path("fifo.safetensors");
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    alarm(5);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st_file_t f;
    ASSERT_REFUSED(st_open(path, &f), FSDP2_ERR_IO, "not a regular file");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    alarm(0);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ck_assert_msg(s < 1.0, "st_open of a FIFO took %.3f s", s);
    ck_assert_msg(strstr(fsdp2_last_error(), path) != NULL, "%s", fsdp2_last_error());
}
END_TEST

START_TEST(malformed_json_and_entries_are_corrupt_naming_the_entry)
{
    expect_json_corrupt("{" ENTRY("a", "F32", "[1]", 0, 4), 4, "not valid JSON");
    expect_json_corrupt("", 0, "not valid JSON");
    expect_json_corrupt("{} x", 0, "after the JSON");
    expect_json_corrupt("{}{}", 0, "after the JSON");
    expect_json_corrupt("[1, 2]", 0, "not a JSON object");
    expect_json_corrupt("\"text\"", 0, "not a JSON object");
    expect_json_corrupt("{\"a\": 5}", 0, "'a': entry is not an object");
    expect_json_corrupt("{\"a\": [0, 4]}", 4, "'a': entry is not an object");
    expect_json_corrupt("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4,
                        "'a': missing field 'data_offsets'");
    expect_json_corrupt("{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4,
                        "'a': missing field 'shape'");
    expect_json_corrupt("{\"a\": {\"dtype\": \"F32\", \"dtype\": \"F32\", \"shape\": [1], "
                        "\"data_offsets\": [0, 4]}}",
                        4, "'a': field 'dtype' appears twice");
    expect_json_corrupt("{" ENTRY("a", "F8", "[1]", 0, 1) "}", 1, "'a': unknown or unsupported dtype 'F8'");
    expect_json_corrupt("{\"a\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                        "'a': unknown or unsupported dtype (not a string)");
    expect_json_corrupt("{" ENTRY("a", "F32", "[-1]", 0, 4) "}", 4, "'a': dimension 0 is negative");
    expect_json_corrupt("{" ENTRY("a", "F32", "[2, 1.5]", 0, 12) "}", 12, "'a': dimension 1 is not an integer");
    expect_json_corrupt("{" ENTRY("a", "F32", "[\"2\"]", 0, 8) "}", 8, "'a': dimension 0 is not a number");
    expect_json_corrupt("{" ENTRY("a", "F32", "2", 0, 8) "}", 8, "'a': shape is not an array");
    expect_json_corrupt("{" ENTRY("a", "U8", "[4294967296, 4294967296, 16]", 0, 8) "}", 8,
                        "'a': shape overflows");
    expect_json_corrupt("{" ENTRY("a", "F64", "[4294967296, 4294967296]", 0, 8) "}", 8,
                        "'a': shape overflows"); /* the product (2^64) wraps to 0 */
    expect_json_corrupt("{" ENTRY("a", "I64", "[2305843009213693952]", 0, 8) "}", 8,
                        "'a': dimension 0 is not an integer below 2^53");
    expect_json_corrupt("{" ENTRY("a", "F32", "[1, 1, 1, 1, 1, 1, 1, 1, 1]", 0, 4) "}", 4,
                        "'a': 9 dimensions");
    expect_json_corrupt("{" ENTRY("a", "F32", "[2]", 0, 4) "}", 4, "'a': data_offsets [0, 4] hold 4 bytes");
    expect_json_corrupt("{" ENTRY("a", "F32", "[1]", 4, 0) "}", 4, "'a': data_offsets [4, 0] are reversed");
    expect_json_corrupt("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8,
                        "'a': data_offsets is not [begin, end]");
    expect_json_corrupt("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, -4]}}", 4,
                        "'a': data_offsets is not [begin, end]");
    expect_json_corrupt("{" ENTRY("a", "F32", "[2]", 0, 8) "}", 4, "'a': data_offsets [0, 8] are reversed or pass the end");
    expect_json_corrupt("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4,
                        "'a': data_offsets is not [begin, end]");
    expect_json_corrupt("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4.5]}}", 4,
                        "'a': data_offsets is not [begin, end]");
    expect_json_corrupt("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0.5, 4]}}", 4,
                        "'a': data_offsets is not [begin, end]");
    expect_json_corrupt("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", 4]}}", 4,
                        "'a': data_offsets is not [begin, end]");
    char long_entry[1024];
    char name[ST_NAME_MAX + 1];
    memset(name, 'n', ST_NAME_MAX);
    name[ST_NAME_MAX] = '\0';
    snprintf(long_entry, sizeof(long_entry),
             "{\"%s\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", name);
    expect_json_corrupt(long_entry, 1, "name of 512 bytes");
}
END_TEST

START_TEST(offsets_that_overlap_leave_holes_or_leave_trailing_bytes_are_corrupt)
{
    expect_json_corrupt("{" ENTRY("a", "F32", "[2]", 0, 8) ", " ENTRY("b", "F32", "[2]", 4, 12) "}",
                        12, "'b': data_offsets [4, 12] overlap tensor 'a'");
    expect_json_corrupt("{" ENTRY("a", "F32", "[1]", 0, 4) ", " ENTRY("b", "F32", "[1]", 8, 12) "}",
                        12, "'b': data_offsets [8, 12] leave a hole: bytes [4, 8)");
    expect_json_corrupt("{" ENTRY("b", "F32", "[1]", 4, 8) "}", 8, "'b': data_offsets [4, 8] leave a hole");
    expect_json_corrupt("{" ENTRY("a", "F32", "[1]", 0, 4) "}", 8, "4 trailing bytes");
    expect_json_corrupt("{}", 1, "1 trailing bytes");
    expect_json_corrupt("{" ENTRY("a", "F32", "[1]", 0, 4) ", " ENTRY("b", "F32", "[1]", 0, 4) "}", 4,
                        "'b': data_offsets [0, 4] overlap tensor 'a'");
    expect_json_corrupt("{" ENTRY("a", "F32", "[1]", 0, 4) ", " ENTRY("a", "U8", "[4]", 4, 8) "}", 8,
                        "tensor 'a' appears twice");
    expect_json_corrupt("{" ENTRY("e", "F32", "[0]", 0, 0) ", " ENTRY("e", "U8", "[0]", 0, 0) "}", 0,
                        "tensor 'e' appears twice");
}
END_TEST

START_TEST(bad_metadata_and_bad_text_are_corrupt)
{
    expect_json_corrupt("{\"__metadata__\": {\"k\": 1}}", 0, "__metadata__ 'k': value is not a string");
    expect_json_corrupt("{\"__metadata__\": {\"k\": \"v\", \"n\": null}}", 0, "'n': value is not a string");
    expect_json_corrupt("{\"__metadata__\": {\"k\": {\"x\": \"y\"}}}", 0, "'k': value is not a string");
    expect_json_corrupt("{\"__metadata__\": [\"k\", \"v\"]}", 0, "__metadata__ is not an object");
    expect_json_corrupt("{\"__metadata__\": \"k\"}", 0, "__metadata__ is not an object");
    expect_json_corrupt("{\"__metadata__\": {}, \"__metadata__\": {}}", 0, "__metadata__ appears twice");
    expect_json_corrupt("{\"__metadata__\": {\"k\": \"v\", \"k\": \"w\"}}", 0, "__metadata__ 'k' appears twice");
    expect_json_corrupt("{\"a\xff\": 1}", 0, "not UTF-8 (byte 3)");
    expect_json_corrupt("{\"a\xc0\x80\": 1}", 0, "not UTF-8"); /* overlong NUL */
    expect_json_corrupt("{\"a\xed\xa0\x80\": 1}", 0, "not UTF-8"); /* a surrogate */
    expect_json_corrupt("{\"a\\u0000b\": 1}", 0, "\\u0000");
    expect_json_corrupt("{\"a\tb\": 1}", 0, "control character 0x09");
    expect_json_corrupt("\xef\xbb\xbf{}", 0, "byte-order mark");
    size_t len;
    unsigned char *nul = make_file("{}   ", ~(uint64_t)0, 0, &len);
    nul[8 + 3] = '\0';
    expect_corrupt(nul, len, "control character 0x00");
    free(nul);
}
END_TEST

START_TEST(valid_variants_other_writers_produce_are_accepted)
{
    /* Padding of any whitespace, entries in any order, an unknown field, null
     * metadata, empty tensors at the ends, an unpadded header. */
    expect_json_valid("{" ENTRY("b", "F32", "[1]", 4, 8) ", " ENTRY("a", "F32", "[1]", 0, 4) "} \n\t\r ", 8, 2);
    expect_json_valid("{\"a\": {\"data_offsets\": [0, 2], \"extra\": [1.5, {}], \"shape\": [], "
                      "\"dtype\": \"BF16\"}, \"__metadata__\": null}",
                      2, 1);
    expect_json_valid("{" ENTRY("z", "U8", "[0]", 0, 0) ", " ENTRY("m", "U8", "[3]", 0, 3) ", "
                      ENTRY("y", "I64", "[0, 5]", 3, 3) "}", 3, 3);
    expect_json_valid("{" ENTRY("\\u00e9\\ud83d\\ude00", "U8", "[1]", 0, 1) "}", 1, 1);
    expect_json_valid("{" ENTRY("e", "F64", "[9007199254740992, 0]", 0, 0) "}", 0, 1);
    expect_json_valid("{}", 0, 0);
}
END_TEST

/* The fuzzing corpus: files named corrupt_* are refused, the others open. */
START_TEST(corpus_files_open_unless_named_corrupt)
{
    const char *corpus = getenv("ST_CORPUS_DIR");
    if (corpus == NULL) {
        printf("note: ST_CORPUS_DIR not set (run through meson test): corpus check skipped\n");
        return;
    }
    DIR *dir = opendir(corpus);
    ck_assert_msg(dir != NULL, "%s: %s", corpus, strerror(errno));
    struct dirent *ent;
    int files = 0;
    while ((ent = readdir(dir)) != NULL) {
        if (ent->d_name[0] == '.')
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", corpus, ent->d_name);
        st_file_t f;
        fsdp2_status_t s = st_open(path, &f);
        fsdp2_status_t want = strncmp(ent->d_name, "corrupt_", 8) == 0 ? FSDP2_ERR_CORRUPT : FSDP2_SUCCESS;
        ck_assert_msg(s == want, "%s: %s (%s), want %s", path, fsdp2_status_name(s),
                      fsdp2_last_error(), fsdp2_status_name(want));
        st_close(&f);
        files++;
    }
    closedir(dir);
    ck_assert_int_ge(files, 5);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Interoperability with the Python package                                             */

/* Values both sides compute: element i of tensor k. */
static double interop_value(int k, size_t i)
{
    return (double)((int)(i * 7 + (size_t)k * 3) % 23) * 0.25 - 2.0; /* exact in f16 */
}

static const tensor_spec_t INTEROP[] = {
    {"f32", FSDP2_F32, 2, {3, 4}}, {"f64", FSDP2_F64, 0, {0}}, {"f16", FSDP2_F16, 1, {5}},
    {"i32", FSDP2_I32, 2, {2, 3}}, {"i64", FSDP2_I64, 1, {4}}, {"u8", FSDP2_U8, 1, {7}},
    {"empty", FSDP2_F32, 2, {0, 3}},
};
#define NUM_INTEROP (sizeof(INTEROP) / sizeof(INTEROP[0]))

static void interop_fill(int k, fsdp2_dtype_t dtype, size_t n, unsigned char *out)
{
    for (size_t i = 0; i < n; i++) {
        double v = interop_value(k, i);
        switch (dtype) {
        case FSDP2_F32: { float x = (float)v; memcpy(out + 4 * i, &x, 4); break; }
        case FSDP2_F64: memcpy(out + 8 * i, &v, 8); break;
        case FSDP2_F16: { uint16_t x = fsdp2_f32_to_f16((float)v); memcpy(out + 2 * i, &x, 2); break; }
        case FSDP2_I32: { int32_t x = (int32_t)(v * 4); memcpy(out + 4 * i, &x, 4); break; }
        case FSDP2_I64: { int64_t x = (int64_t)(v * 4) * 1000000007; memcpy(out + 8 * i, &x, 8); break; }
        default: out[i] = (unsigned char)((int)(v * 4) + 8); break;
        }
    }
}

static const char INTEROP_SCRIPT[] =
    "import sys\n"
    "import numpy as np\n"
    "from safetensors import safe_open\n"
    "from safetensors.numpy import load_file, save_file\n"
    "ours, theirs = sys.argv[1], sys.argv[2]\n"
    "specs = [('f32', np.float32, (3, 4)), ('f64', np.float64, ()), ('f16', np.float16, (5,)),\n"
    "         ('i32', np.int32, (2, 3)), ('i64', np.int64, (4,)), ('u8', np.uint8, (7,)),\n"
    "         ('empty', np.float32, (0, 3))]\n"
    "def values(k, dtype, shape):\n"
    "    n = int(np.prod(shape))\n"
    "    v = np.array([((i * 7 + k * 3) % 23) * 0.25 - 2.0 for i in range(n)])\n"
    "    if dtype == np.int32: v = v * 4\n"
    "    if dtype == np.int64: return (v * 4).astype(np.int64).reshape(shape) * 1000000007\n"
    "    if dtype == np.uint8: v = v * 4 + 8\n"
    "    return v.astype(dtype).reshape(shape)\n"
    "got = load_file(ours)\n"
    "assert sorted(got) == sorted(s[0] for s in specs), sorted(got)\n"
    "for k, (name, dtype, shape) in enumerate(specs):\n"
    "    want = values(k, dtype, shape)\n"
    "    assert got[name].dtype == want.dtype and got[name].shape == want.shape, (name, got[name])\n"
    "    assert np.array_equal(got[name], want), (name, got[name], want)\n"
    "with safe_open(ours, framework='np') as f:\n"
    "    assert f.metadata() == {'format': 'np', 'writer': 'libfsdp2 ✓'}, f.metadata()\n"
    "save_file({name: values(k, dtype, shape) for k, (name, dtype, shape) in enumerate(specs)},\n"
    "          theirs, metadata={'from': 'python'})\n";

static int python_has_safetensors(void)
{
    return system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") == 0;
}

START_TEST(python_safetensors_reads_our_file_and_we_read_its_file)
{
    if (!python_has_safetensors()) {
        printf("note: python3 with safetensors and numpy not found: interop check skipped\n");
        return;
    }
    const char *ours_path = scratch_path("ours.safetensors");
    char ours[512], theirs[512], script[512], command[2048];
    snprintf(ours, sizeof(ours), "%s", ours_path);
    snprintf(theirs, sizeof(theirs), "%s", scratch_path("theirs.safetensors"));
    snprintf(script, sizeof(script), "%s", scratch_path("interop.py"));
    write_bytes(script, INTEROP_SCRIPT, strlen(INTEROP_SCRIPT));

    uint64_t begin[NUM_INTEROP], total, data_start;
    spec_offsets(INTEROP, NUM_INTEROP, begin, &total);
    unsigned char *data = calloc(1, (size_t)total + 1);
    for (size_t k = 0; k < NUM_INTEROP; k++)
        interop_fill((int)k, INTEROP[k].dtype, (size_t)(spec_bytes(&INTEROP[k]) / dtype_bytes(INTEROP[k].dtype)),
                     data + begin[k]);
    static const char *const meta[][2] = {{"format", "np"}, {"writer", "libfsdp2 ✓"}};
    write_file(ours, INTEROP, NUM_INTEROP, meta, 2, data, total, &data_start);
    snprintf(command, sizeof(command), "python3 '%s' '%s' '%s'", script, ours, theirs);
    ck_assert_msg(system(command) == 0, "the Python package refused our file: %s", command);

    st_file_t f;
    ASSERT_OK(st_open(theirs, &f));
    ck_assert_uint_eq(f.num_entries, NUM_INTEROP);
    ck_assert_uint_eq(f.num_meta, 1);
    ck_assert_str_eq(f.meta[0].key, "from");
    ck_assert_str_eq(f.meta[0].value, "python");
    for (size_t k = 0; k < NUM_INTEROP; k++) {
        const st_entry_t *e = st_find(&f, INTEROP[k].name);
        ck_assert_msg(e != NULL, "'%s' missing from Python's file", INTEROP[k].name);
        ck_assert_int_eq(e->dtype, INTEROP[k].dtype);
        ck_assert_int_eq(e->ndim, INTEROP[k].ndim);
        for (int d = 0; d < e->ndim; d++)
            ck_assert_int_eq(e->shape[d], INTEROP[k].shape[d]);
        size_t bytes = (size_t)(e->end - e->begin);
        ck_assert_uint_eq(bytes, spec_bytes(&INTEROP[k]));
        unsigned char got[128];
        ASSERT_OK(st_read(&f, e, 0, got, bytes));
        ck_assert_msg(memcmp(got, data + begin[k], bytes) == 0, "'%s' differs", INTEROP[k].name);
    }
    st_close(&f);
    free(data);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Mutations                                                                            */

/* What a successful parse promises: sorted entries that tile the data exactly, sizes
 * that match shape x dtype, bounded names and dims, unique names. */
static void check_parsed(const st_file_t *f, uint64_t data_size, const char *what)
{
    uint64_t at = 0;
    for (size_t i = 0; i < f->num_entries; i++) {
        const st_entry_t *e = &f->entries[i];
        uint64_t bytes = dtype_bytes(e->dtype);
        int ok = bytes > 0 && e->ndim >= 0 && e->ndim <= FSDP2_MAX_DIMS && e->begin == at &&
                 e->end >= e->begin && e->end <= data_size && strlen(e->name) < ST_NAME_MAX;
        int overflow = 0, empty = 0;
        for (int d = 0; ok && d < e->ndim; d++) {
            ok = e->shape[d] >= 0;
            empty |= e->shape[d] == 0;
            overflow |= __builtin_mul_overflow(bytes, (uint64_t)e->shape[d], &bytes);
        }
        if (empty)
            bytes = 0;
        if (!ok || (overflow && !empty) || e->end - e->begin != bytes)
            ck_abort_msg("%s: accepted a bad entry '%s' [%" PRIu64 ", %" PRIu64 "] ndim %d", what,
                         e->name, e->begin, e->end, e->ndim);
        for (size_t j = 0; j < i; j++)
            if (strcmp(f->entries[j].name, e->name) == 0)
                ck_abort_msg("%s: accepted '%s' twice", what, e->name);
        at = e->end;
    }
    if (at != data_size)
        ck_abort_msg("%s: accepted entries ending at %" PRIu64 " of %" PRIu64, what, at, data_size);
    for (size_t i = 0; i < f->num_meta; i++)
        if (f->meta[i].key == NULL || f->meta[i].value == NULL)
            ck_abort_msg("%s: metadata %zu is NULL", what, i);
}

typedef struct mutation_stats {
    size_t accepted, corrupt, opened;
} mutation_stats_t;

/* One mutant through st_parse_header (when its length prefix fits) and st_open. */
static void try_mutant(const unsigned char *buf, size_t len, mutation_stats_t *stats)
{
    st_file_t f;
    if (len >= 8 && le64(buf) <= len - 8) {
        uint64_t n = le64(buf);
        fsdp2_status_t s = st_parse_header((const char *)buf + 8, (size_t)n, len - 8 - n, "mutant", &f);
        if (s == FSDP2_SUCCESS) {
            check_parsed(&f, len - 8 - n, "st_parse_header");
            stats->accepted++;
        } else if (s == FSDP2_ERR_CORRUPT) {
            stats->corrupt++;
        } else {
            ck_abort_msg("st_parse_header = %s (%s)", fsdp2_status_name(s), fsdp2_last_error());
        }
        st_close(&f);
    }
    const char *path = scratch_path("mutant.safetensors");
    unlink(path);
    write_bytes(path, buf, len);
    fsdp2_status_t s = st_open(path, &f);
    if (s == FSDP2_SUCCESS) {
        check_parsed(&f, f.file_size - f.data_start, "st_open");
        for (size_t i = 0; i < f.num_entries; i++) { /* every entry reads back its bytes */
            const st_entry_t *e = &f.entries[i];
            unsigned char *got = malloc((size_t)(e->end - e->begin) + 1);
            ASSERT_OK(st_read(&f, e, 0, got, (size_t)(e->end - e->begin)));
            ck_assert_int_eq(memcmp(got, buf + f.data_start + e->begin, (size_t)(e->end - e->begin)), 0);
            free(got);
        }
        stats->opened++;
    } else if (s != FSDP2_ERR_CORRUPT && s != FSDP2_ERR_IO) {
        ck_abort_msg("st_open = %s (%s)", fsdp2_status_name(s), fsdp2_last_error());
    } else if (strstr(fsdp2_last_error(), path) == NULL) {
        ck_abort_msg("st_open's message does not name the file: %s", fsdp2_last_error());
    }
    st_close(&f);
}

/* Characters that steer a JSON mutation somewhere interesting. */
static const char JSON_CHARS[] = "{}[]\":,0123456789-.eE \\u\"_aFIUB";

static void mutate_seed(const unsigned char *seed, size_t len, uint64_t *rng, int count,
                        mutation_stats_t *stats)
{
    ck_assert_uint_ge(len, 8);
    uint64_t header_end = 8 + le64(seed);
    ck_assert_uint_le(header_end, len);
    unsigned char *buf = malloc(len + 64);
    ck_assert_ptr_nonnull(buf);
    /* Truncation at every length up to the end of the header (and a little past it). */
    for (size_t cut = 0; cut <= len && cut <= header_end + 16; cut++)
        try_mutant(seed, cut, stats);
    for (int m = 0; m < count; m++) {
        memcpy(buf, seed, len);
        size_t n = len;
        int edits = 1 + (int)(rng_next(rng) % 4);
        for (int k = 0; k < edits; k++) {
            uint64_t r = rng_next(rng);
            size_t h = header_end > 8 ? (size_t)(header_end - 8) : 1;
            switch (r % 7) {
            case 0: /* a bit flip anywhere */
                buf[(r >> 8) % n] ^= (unsigned char)(1u << ((r >> 4) % 8));
                break;
            case 1: /* a random byte in the header */
                buf[8 + (r >> 8) % h] = (unsigned char)(r >> 40);
                break;
            case 2: /* a JSON character in the header */
                buf[8 + (r >> 8) % h] = (unsigned char)JSON_CHARS[(r >> 40) % (sizeof(JSON_CHARS) - 1)];
                break;
            case 3: { /* a random header length: near the truth, small, huge */
                uint64_t choice = (r >> 8) % 4, v = rng_next(rng);
                uint64_t lengths[4] = {le64(seed) + (v % 33) - 16, v % (n + 8),
                                       (uint64_t)ST_MAX_HEADER - 4 + v % 8, v};
                put_le64(buf, lengths[choice]);
                break;
            }
            case 4: /* a digit changed in the header (offsets and shapes) */
                for (size_t at = 8 + (r >> 8) % h, tries = 0; tries < h; tries++, at = 8 + (at - 8 + 1) % h)
                    if (buf[at] >= '0' && buf[at] <= '9') {
                        buf[at] = (unsigned char)('0' + (r >> 40) % 10);
                        break;
                    }
                break;
            case 5: /* the data section grows or shrinks */
                if (r & 256) {
                    size_t grow = 1 + (r >> 9) % 16;
                    if (n + grow <= len + 64) {
                        memset(buf + n, 0xAB, grow);
                        n += grow;
                    }
                } else if (n > header_end) {
                    n -= 1 + (size_t)((r >> 9) % (n - header_end));
                }
                break;
            default: { /* a byte deleted from the header, the length kept */
                size_t at = 8 + (r >> 8) % h;
                if (at < n) {
                    memmove(buf + at, buf + at + 1, n - at - 1);
                    n--;
                }
                break;
            }
            }
        }
        try_mutant(buf, n, stats);
    }
    free(buf);
}

START_TEST(thousands_of_mutated_files_never_crash_and_never_pass_bad_entries)
{
    uint64_t rng = 0xC0FFEE;
    mutation_stats_t stats = {0};
    /* Seeds: our writer's output, a small hand-made file, the fuzzing corpus. */
    const tensor_spec_t specs[] = {
        {"w", FSDP2_F32, 2, {2, 3}}, {"s", FSDP2_F64, 0, {0}}, {"e", FSDP2_I32, 1, {0}},
        {"b", FSDP2_BF16, 1, {3}},   {"u", FSDP2_U8, 1, {5}},
    };
    uint64_t begin[5], total, data_start;
    spec_offsets(specs, 5, begin, &total);
    unsigned char *data = random_bytes((size_t)total, 11);
    const char *const meta[][2] = {{"format", "pt"}};
    const char *written = scratch_path("seed.safetensors");
    write_file(written, specs, 5, meta, 1, data, total, &data_start);
    char written_path[512];
    snprintf(written_path, sizeof(written_path), "%s", written);
    size_t len;
    unsigned char *seed = read_bytes(written_path, &len);
    mutate_seed(seed, len, &rng, 4000, &stats);
    free(seed);
    free(data);

    seed = make_file("{" ENTRY("b", "U8", "[2]", 2, 4) ", " ENTRY("a", "I32", "[]", 4, 8) ", "
                     ENTRY("z", "U8", "[2]", 0, 2) "}",
                     ~(uint64_t)0, 8, &len);
    mutate_seed(seed, len, &rng, 2000, &stats);
    free(seed);

    size_t corpus_files = 0;
    const char *corpus = getenv("ST_CORPUS_DIR");
    DIR *dir = corpus ? opendir(corpus) : NULL;
    struct dirent *ent;
    while (dir != NULL && (ent = readdir(dir)) != NULL) {
        if (ent->d_name[0] == '.')
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", corpus, ent->d_name);
        seed = read_bytes(path, &len);
        if (len >= 8 && le64(seed) <= len - 8) {
            mutate_seed(seed, len, &rng, 500, &stats);
            corpus_files++;
        }
        free(seed);
    }
    if (dir != NULL)
        closedir(dir);
    printf("mutation test: %zu corpus seeds; in memory %zu accepted, %zu corrupt; %zu files opened\n",
           corpus_files, stats.accepted, stats.corrupt, stats.opened);
    /* Both outcomes must occur, or the mutations miss the interesting region. */
    ck_assert_uint_ge(corpus_files, 5);
    ck_assert_uint_gt(stats.accepted, 50);
    ck_assert_uint_gt(stats.corrupt, 1000);
}
END_TEST

/* ---------------------------------------------------------------------------------- */

static TCase *tcase_new(const char *name, int scratch_dir)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    if (scratch_dir)
        tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
    return tc;
}

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");

    TCase *crc = tcase_new("crc32c", 0);
    tcase_add_test(crc, crc32c_matches_the_published_vectors);
    tcase_add_test(crc, crc32c_both_paths_equal_the_bitwise_loop_at_every_length_and_alignment);
    tcase_add_test(crc, crc32c_incremental_equals_one_shot_at_every_split);
    suite_add_tcase(s, crc);

    TCase *rt = tcase_new("round_trip", 1);
    tcase_add_test(rt, dtype_names_round_trip_and_unknown_names_are_corrupt);
    tcase_add_test(rt, round_trip_of_every_dtype_with_scalars_empty_tensors_and_metadata);
    tcase_add_test(rt, writer_offsets_and_data_start_agree_with_the_file);
    tcase_add_test(rt, a_file_without_tensors_is_an_eight_byte_header);
    tcase_add_test(rt, large_and_small_writes_interleave_correctly);
    tcase_add_test(rt, python_safetensors_reads_our_file_and_we_read_its_file);
    suite_add_tcase(s, rt);

    TCase *misuse = tcase_new("misuse", 1);
    tcase_add_test(misuse, writer_refuses_an_existing_path_and_leaves_it_alone);
    tcase_add_test(misuse, writer_refuses_bad_declarations_naming_them);
    tcase_add_test(misuse, writer_enforces_the_order_of_calls_and_the_declared_sizes);
    tcase_add_test(misuse, st_read_stays_inside_the_entry_and_reports_a_shrunk_file);
    suite_add_tcase(s, misuse);

    TCase *corrupt = tcase_new("corrupt", 1);
    tcase_add_test(corrupt, truncated_files_and_bad_header_lengths_are_corrupt);
    tcase_add_test(corrupt, a_fifo_is_refused_within_a_second);
    tcase_add_test(corrupt, malformed_json_and_entries_are_corrupt_naming_the_entry);
    tcase_add_test(corrupt, offsets_that_overlap_leave_holes_or_leave_trailing_bytes_are_corrupt);
    tcase_add_test(corrupt, bad_metadata_and_bad_text_are_corrupt);
    tcase_add_test(corrupt, valid_variants_other_writers_produce_are_accepted);
    tcase_add_test(corrupt, corpus_files_open_unless_named_corrupt);
    tcase_add_test(corrupt, thousands_of_mutated_files_never_crash_and_never_pass_bad_entries);
    suite_add_tcase(s, corrupt);

    return s;
}

FSDP2_CHECK_MAIN(safetensors_suite)
