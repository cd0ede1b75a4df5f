/* Unit tests of the Fashion-MNIST example's IDX reader (examples/fashion_mnist/data.c:
 * fm_load, fm_read_idx, fm_batch), in one process.
 *
 * References, none sharing code with what they check: files this test writes byte by
 * byte (plain, and gzipped through zlib's gzwrite), then damages one way at a time; the
 * real data set's sizes, class counts and pixel sums as computed by Python's gzip module.
 *
 * Hot loops fail with `if (!ok) ck_abort_msg(...)` so one mismatch reports one element.
 * The sampler is test_fmnist_sampler.c (the layers are lib/nn's, tested in tests/nn); the known-bug
 * switch is in fmnist_units.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>

#include "../core/check_main.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "data.h"
#include "fmnist_units.h"

#define REAL_DATA_DIR "/usr/share/datasets/fashion-mnist"

/* Case-insensitive substring test (strcasestr is not C11). */
static int contains_nocase(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return 1;
    }
    return n == 0;
}

/* ---------------------------------------------------------------------------------- */
/* IDX files written by hand                                                           */

#define IMAGES_NAME "train-images-idx3-ubyte"
#define LABELS_NAME "train-labels-idx1-ubyte"

/* A byte buffer an IDX file is assembled in. */
typedef struct bytes {
    unsigned char *data;
    size_t len;
} bytes_t;

static void put_u32_be(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* magic, dims (big-endian u32 each), then the payload. */
static bytes_t idx_bytes(uint32_t magic, int ndim, const uint32_t *dims, const uint8_t *payload,
                         size_t payload_len)
{
    bytes_t b;
    b.len = 4 + 4 * (size_t)ndim + payload_len;
    b.data = xcalloc(b.len + 16, 1); /* room to append trailing bytes */
    put_u32_be(b.data, magic);
    for (int d = 0; d < ndim; d++)
        put_u32_be(b.data + 4 + 4 * d, dims[d]);
    if (payload_len)
        memcpy(b.data + 4 + 4 * ndim, payload, payload_len);
    return b;
}

static void write_plain(const char *path, const bytes_t *b)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    ck_assert_uint_eq(fwrite(b->data, 1, b->len, f), b->len);
    ck_assert_int_eq(fclose(f), 0);
}

static void write_gz(const char *path, const bytes_t *b)
{
    gzFile f = gzopen(path, "wb");
    ck_assert_msg(f != NULL, "gzopen(%s, wb) failed", path);
    if (b->len)
        ck_assert_int_eq(gzwrite(f, b->data, (unsigned)b->len), (int)b->len);
    ck_assert_int_eq(gzclose(f), Z_OK);
}

static void write_file(const char *dir, const char *name, int gz, const bytes_t *b, char *path,
                       size_t pathlen)
{
    snprintf(path, pathlen, "%s/%s%s", dir, name, gz ? ".gz" : "");
    if (gz)
        write_gz(path, b);
    else
        write_plain(path, b);
}

/* The good set: 5 images of 28x28 whose pixels follow a formula (with 0 and 255 in it)
 * and 5 labels. */
enum { GOOD_N = 5, GOOD_ROWS = 28, GOOD_COLS = 28 };
static const uint8_t GOOD_LABELS[GOOD_N] = {3, 0, 9, 1, 7};

static uint8_t good_pixel(int image, int p)
{
    if (p == 0)
        return 0;
    if (p == 1)
        return 255;
    return (uint8_t)((image * 31 + p * 7 + (p >> 5)) & 0xff);
}

static bytes_t good_images(void)
{
    uint8_t *px = xcalloc((size_t)GOOD_N * GOOD_ROWS * GOOD_COLS, 1);
    for (int i = 0; i < GOOD_N; i++)
        for (int p = 0; p < GOOD_ROWS * GOOD_COLS; p++)
            px[(size_t)i * GOOD_ROWS * GOOD_COLS + p] = good_pixel(i, p);
    const uint32_t dims[3] = {GOOD_N, GOOD_ROWS, GOOD_COLS};
    bytes_t b = idx_bytes(0x803, 3, dims, px, (size_t)GOOD_N * GOOD_ROWS * GOOD_COLS);
    free(px);
    return b;
}

static bytes_t good_labels(void)
{
    const uint32_t dims[1] = {GOOD_N};
    return idx_bytes(0x801, 1, dims, GOOD_LABELS, GOOD_N);
}

/* A fresh directory per test (Check forks each one), removed with the files it may hold. */
static char tmp_dir[64];

static const char *make_tmp_dir(void)
{
    snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/fmnist_test_XXXXXX");
    ck_assert_msg(mkdtemp(tmp_dir) != NULL, "mkdtemp failed");
    return tmp_dir;
}

static void remove_tmp_dir(void)
{
    const char *names[] = {IMAGES_NAME, IMAGES_NAME ".gz", LABELS_NAME, LABELS_NAME ".gz"};
    char path[256];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tmp_dir, names[i]);
        unlink(path);
    }
    rmdir(tmp_dir);
}

static void check_good_set(const fm_set_t *set)
{
    ck_assert_int_eq(set->n, GOOD_N);
    ck_assert_int_eq(set->rows, GOOD_ROWS);
    ck_assert_int_eq(set->cols, GOOD_COLS);
    for (int i = 0; i < GOOD_N; i++) {
        if (set->labels[i] != GOOD_LABELS[i])
            ck_abort_msg("label %d: got %d, want %d", i, set->labels[i], GOOD_LABELS[i]);
        for (int p = 0; p < GOOD_ROWS * GOOD_COLS; p++) {
            uint8_t got = set->images[(size_t)i * GOOD_ROWS * GOOD_COLS + p];
            if (got != good_pixel(i, p))
                ck_abort_msg("image %d pixel %d: got %d, want %d", i, p, got, good_pixel(i, p));
        }
    }
}

static void load_good_set(int gz)
{
    const char *dir = make_tmp_dir();
    char ipath[256], lpath[256], err[512] = "";
    bytes_t im = good_images(), lb = good_labels();
    write_file(dir, IMAGES_NAME, gz, &im, ipath, sizeof(ipath));
    write_file(dir, LABELS_NAME, gz, &lb, lpath, sizeof(lpath));
    if (gz) { /* the files really are gzip streams, not plain bytes under a .gz name */
        FILE *f = fopen(ipath, "rb");
        unsigned char magic[2] = {0, 0};
        ck_assert_uint_eq(fread(magic, 1, 2, f), 2);
        fclose(f);
        ck_assert_msg(magic[0] == 0x1f && magic[1] == 0x8b, "%s starts %02x %02x, not gzip",
                      ipath, magic[0], magic[1]);
    }
    fm_set_t set;
    int rc = fm_load(dir, "train", &set, err, sizeof(err));
    ck_assert_msg(rc == 0, "fm_load(%s) = %d: %s", dir, rc, err);
    check_good_set(&set);
    fm_free(&set);
    ck_assert_ptr_null(set.images);
    ck_assert_ptr_null(set.labels);
    free(im.data);
    free(lb.data);
    remove_tmp_dir();
}

START_TEST(load_reads_plain_idx_files_with_their_shape_pixels_and_labels)
{
    load_good_set(0);
}
END_TEST

START_TEST(load_reads_gzipped_idx_files_with_their_shape_pixels_and_labels)
{
    load_good_set(1);
}
END_TEST

/* rows and cols must not be swapped: 3 images of 4 rows x 7 columns. */
START_TEST(load_keeps_rows_and_cols_of_non_square_images_apart)
{
    const char *dir = make_tmp_dir();
    char path[256], err[512] = "";
    uint8_t px[3 * 4 * 7];
    for (size_t i = 0; i < sizeof(px); i++)
        px[i] = (uint8_t)i;
    const uint32_t idims[3] = {3, 4, 7}, ldims[1] = {3};
    const uint8_t labels[3] = {2, 4, 6};
    bytes_t im = idx_bytes(0x803, 3, idims, px, sizeof(px));
    bytes_t lb = idx_bytes(0x801, 1, ldims, labels, 3);
    write_file(dir, IMAGES_NAME, 0, &im, path, sizeof(path));
    write_file(dir, LABELS_NAME, 1, &lb, path, sizeof(path)); /* mixing plain and .gz */
    fm_set_t set;
    ck_assert_msg(fm_load(dir, "train", &set, err, sizeof(err)) == 0, "fm_load: %s", err);
    ck_assert_int_eq(set.n, 3);
    ck_assert_int_eq(set.rows, 4);
    ck_assert_int_eq(set.cols, 7);
    ck_assert_mem_eq(set.images, px, sizeof(px));
    ck_assert_mem_eq(set.labels, labels, 3);
    fm_free(&set);
    free(im.data);
    free(lb.data);
    remove_tmp_dir();
}
END_TEST

START_TEST(read_idx_returns_the_dims_and_bytes_of_a_one_dimensional_file)
{
    const char *dir = make_tmp_dir();
    char path[256], err[512] = "";
    const uint8_t payload[6] = {9, 8, 7, 0, 1, 2};
    const uint32_t dims[1] = {6};
    bytes_t b = idx_bytes(0x801, 1, dims, payload, 6);
    write_file(dir, LABELS_NAME, 0, &b, path, sizeof(path));
    int got_dims[1] = {-1};
    uint8_t *data = NULL;
    ck_assert_msg(fm_read_idx(path, 1, got_dims, &data, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(got_dims[0], 6);
    ck_assert_mem_eq(data, payload, 6);
    free(data);
    free(b.data);
    remove_tmp_dir();
}
END_TEST

START_TEST(batch_normalises_pixels_with_mean_0_2860_and_std_0_3530)
{
    const char *dir = make_tmp_dir();
    char path[256], err[512] = "";
    bytes_t im = good_images(), lb = good_labels();
    write_file(dir, IMAGES_NAME, 0, &im, path, sizeof(path));
    write_file(dir, LABELS_NAME, 0, &lb, path, sizeof(path));
    fm_set_t set;
    ck_assert_msg(fm_load(dir, "train", &set, err, sizeof(err)) == 0, "fm_load: %s", err);

    const int idx[3] = {4, 0, 2};
    const int pixels = GOOD_ROWS * GOOD_COLS;
    float *x = xcalloc((size_t)3 * pixels, sizeof(float));
    int labels[3] = {-1, -1, -1};
    fm_batch(&set, idx, 3, x, labels);
    for (int b = 0; b < 3; b++) {
        ck_assert_int_eq(labels[b], GOOD_LABELS[idx[b]]);
        for (int p = 0; p < pixels; p++) {
            double want = ((double)good_pixel(idx[b], p) / 255.0 - 0.2860) / 0.3530;
            double got = x[(size_t)b * pixels + p];
            if (fabs(got - want) > 1e-5)
                ck_abort_msg("sample %d (index %d) pixel %d: got %.8f, want %.8f", b, idx[b], p,
                             got, want);
        }
    }
    /* The ends by hand: 0 -> -0.2860/0.3530, 255 -> 0.7140/0.3530. */
    ck_assert_msg(fabs(x[0] - -0.810198300) < 1e-5, "black: got %.8f, want -0.81019830", x[0]);
    ck_assert_msg(fabs(x[1] - 2.022662890) < 1e-5, "white: got %.8f, want 2.02266289", x[1]);
    free(x);
    fm_free(&set);
    free(im.data);
    free(lb.data);
    remove_tmp_dir();
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Damaged files                                                                       */

typedef enum { DAMAGE_IMAGES, DAMAGE_LABELS } damage_target_t;

typedef struct damage_case {
    const char *what;
    damage_target_t target;
    /* Changes the good bytes of the target file; returns 0 to leave the file out. */
    int (*damage)(bytes_t *b);
    /* Words, any one of which the message must contain (case-insensitive). */
    const char *problem[3];
} damage_case_t;

static int remove_file(bytes_t *b)
{
    (void)b;
    return 0;
}

static int images_magic_of_labels(bytes_t *b)
{
    put_u32_be(b->data, 0x801);
    return 1;
}

static int labels_magic_of_images(bytes_t *b)
{
    put_u32_be(b->data, 0x803);
    return 1;
}

static int magic_of_float_type(bytes_t *b)
{
    b->data[2] = 0x0D; /* IDX type code 0x0D is float, not unsigned byte */
    return 1;
}

static int cut_to_10_bytes(bytes_t *b)
{
    b->len = 10;
    return 1;
}

static int cut_to_3_bytes(bytes_t *b)
{
    b->len = 3;
    return 1;
}

static int empty(bytes_t *b)
{
    b->len = 0;
    return 1;
}

static int drop_last_100_bytes(bytes_t *b)
{
    b->len -= 100;
    return 1;
}

static int drop_last_byte(bytes_t *b)
{
    b->len -= 1;
    return 1;
}

static int add_trailing_byte(bytes_t *b)
{
    b->data[b->len++] = 0;
    return 1;
}

static int add_trailing_16_bytes(bytes_t *b)
{
    b->len += 16;
    return 1;
}

/* 4 labels (the header and the data agree) for 5 images. */
static int four_labels(bytes_t *b)
{
    put_u32_be(b->data + 4, 4);
    b->len -= 1;
    return 1;
}

static int six_labels(bytes_t *b)
{
    put_u32_be(b->data + 4, 6);
    b->data[b->len++] = 1;
    return 1;
}

static int label_10(bytes_t *b)
{
    b->data[8 + 2] = 10;
    return 1;
}

static int label_255(bytes_t *b)
{
    b->data[8 + 4] = 255;
    return 1;
}

static int zero_images(bytes_t *b)
{
    put_u32_be(b->data + 4, 0);
    return 1;
}

static const damage_case_t DAMAGE_CASES[] = {
    {"missing images file", DAMAGE_IMAGES, remove_file, {"open", "missing", "no such"}},
    {"missing labels file", DAMAGE_LABELS, remove_file, {"open", "missing", "no such"}},
    {"images file with the labels magic", DAMAGE_IMAGES, images_magic_of_labels, {"magic"}},
    {"labels file with the images magic", DAMAGE_LABELS, labels_magic_of_images, {"magic"}},
    {"images file of float type", DAMAGE_IMAGES, magic_of_float_type, {"magic"}},
    {"images header cut at 10 bytes", DAMAGE_IMAGES, cut_to_10_bytes, {"header"}},
    {"labels header cut at 3 bytes", DAMAGE_LABELS, cut_to_3_bytes, {"header"}},
    {"empty images file", DAMAGE_IMAGES, empty, {"header"}},
    {"images data 100 bytes short", DAMAGE_IMAGES, drop_last_100_bytes, {"truncated data"}},
    {"labels data 1 byte short", DAMAGE_LABELS, drop_last_byte, {"truncated data"}},
    {"4 labels for 5 images", DAMAGE_LABELS, four_labels, {"labels for"}},
    {"6 labels for 5 images", DAMAGE_LABELS, six_labels, {"labels for"}},
    {"a label of 10", DAMAGE_LABELS, label_10, {"label 10"}},
    {"a label of 255", DAMAGE_LABELS, label_255, {"label 255"}},
    {"a trailing byte after the images", DAMAGE_IMAGES, add_trailing_byte, {"trailing"}},
    {"16 trailing bytes after the labels", DAMAGE_LABELS, add_trailing_16_bytes, {"trailing"}},
    {"an images file of 0 images", DAMAGE_IMAGES, zero_images, {"size 0", "empty"}},
};
#define N_DAMAGE_CASES ((int)(sizeof(DAMAGE_CASES) / sizeof(DAMAGE_CASES[0])))

/* Loop index: case * 2 + gz. */
START_TEST(load_rejects_each_damaged_file_naming_the_file_and_the_problem)
{
    const damage_case_t *c = &DAMAGE_CASES[_i / 2];
    int gz = _i % 2;
    const char *dir = make_tmp_dir();
    bytes_t im = good_images(), lb = good_labels();
    bytes_t *target = c->target == DAMAGE_IMAGES ? &im : &lb;
    const char *target_name = c->target == DAMAGE_IMAGES ? IMAGES_NAME : LABELS_NAME;
    char ipath[256], lpath[256], want_path[256];
    int keep = c->damage(target);
    if (c->target != DAMAGE_IMAGES || keep)
        write_file(dir, IMAGES_NAME, gz, &im, ipath, sizeof(ipath));
    if (c->target != DAMAGE_LABELS || keep)
        write_file(dir, LABELS_NAME, gz, &lb, lpath, sizeof(lpath));
    /* A missing file is looked for under its plain name last. */
    snprintf(want_path, sizeof(want_path), "%s/%s%s", dir, target_name, gz && keep ? ".gz" : "");

    char err[512] = "";
    fm_set_t set;
    memset(&set, 0xA5, sizeof(set));
    int rc = fm_load(dir, "train", &set, err, sizeof(err));
    ck_assert_msg(rc == -1, "%s (%s): fm_load returned %d, want -1 (err \"%s\")", c->what,
                  gz ? "gzipped" : "plain", rc, err);
    ck_assert_msg(strstr(err, want_path) != NULL, "%s (%s): message \"%s\" does not name %s",
                  c->what, gz ? "gzipped" : "plain", err, want_path);
    int named = 0;
    for (int k = 0; k < 3 && c->problem[k]; k++)
        named |= contains_nocase(err, c->problem[k]);
    ck_assert_msg(named, "%s (%s): message \"%s\" does not say \"%s\"", c->what,
                  gz ? "gzipped" : "plain", err, c->problem[0]);
    /* Nothing is left for the caller to free. */
    ck_assert_ptr_null(set.images);
    ck_assert_ptr_null(set.labels);
    free(im.data);
    free(lb.data);
    remove_tmp_dir();
}
END_TEST

/* A .gz file whose deflate stream stops in the middle of the data. */
START_TEST(load_rejects_a_gzip_stream_cut_short_naming_the_file)
{
    const char *dir = make_tmp_dir();
    char ipath[256], lpath[256], err[512] = "";
    bytes_t im = good_images(), lb = good_labels();
    write_file(dir, IMAGES_NAME, 1, &im, ipath, sizeof(ipath));
    write_file(dir, LABELS_NAME, 1, &lb, lpath, sizeof(lpath));
    struct stat st;
    ck_assert_int_eq(stat(ipath, &st), 0);
    ck_assert_int_eq(truncate(ipath, st.st_size / 2), 0);

    fm_set_t set;
    int rc = fm_load(dir, "train", &set, err, sizeof(err));
    ck_assert_msg(rc == -1, "fm_load returned %d, want -1 (err \"%s\")", rc, err);
    ck_assert_msg(strstr(err, ipath) != NULL, "message \"%s\" does not name %s", err, ipath);
    ck_assert_msg(contains_nocase(err, "truncated"), "message \"%s\" does not say truncated", err);
    free(im.data);
    free(lb.data);
    remove_tmp_dir();
}
END_TEST

/* Writes the good set gzipped, then passes the images .gz file's bytes through edit. */
static void load_good_set_with_edited_gz_images(void (*edit)(unsigned char *z, size_t *len),
                                                char *err, size_t errlen, int *rc, char *ipath)
{
    const char *dir = make_tmp_dir();
    char lpath[256];
    bytes_t im = good_images(), lb = good_labels();
    write_file(dir, IMAGES_NAME, 1, &im, ipath, 256);
    write_file(dir, LABELS_NAME, 1, &lb, lpath, sizeof(lpath));
    FILE *f = fopen(ipath, "rb");
    ck_assert_ptr_nonnull(f);
    unsigned char *z = xcalloc(im.len + 1024, 1);
    size_t len = fread(z, 1, im.len + 1024, f);
    fclose(f);
    ck_assert_msg(len > 18 && len < im.len + 1024, "gzip file of %zu bytes", len);
    edit(z, &len);
    f = fopen(ipath, "wb");
    ck_assert_uint_eq(fwrite(z, 1, len, f), len);
    fclose(f);
    fm_set_t set;
    *rc = fm_load(dir, "train", &set, err, errlen);
    if (*rc == 0)
        fm_free(&set);
    free(z);
    free(im.data);
    free(lb.data);
    remove_tmp_dir();
}

/* A gzip member ends with the CRC-32 and the length of what it holds (RFC 1952). */
static void flip_crc(unsigned char *z, size_t *len)
{
    z[*len - 8] ^= 0xff;
}

static void drop_trailer(unsigned char *z, size_t *len)
{
    (void)z;
    *len -= 8;
}

START_TEST(load_rejects_a_gzip_file_whose_crc_is_wrong_naming_the_file)
{
    char err[512] = "", ipath[256];
    int rc;
    load_good_set_with_edited_gz_images(flip_crc, err, sizeof(err), &rc, ipath);
    ck_assert_msg(rc == -1, "fm_load returned %d, want -1 (err \"%s\")", rc, err);
    ck_assert_msg(strstr(err, ipath) != NULL, "message \"%s\" does not name %s", err, ipath);
}
END_TEST

/* The data is all there, the CRC-32 and length trailer is missing. */
START_TEST(load_rejects_a_gzip_file_missing_its_crc_trailer_naming_the_file)
{
    char err[512] = "", ipath[256];
    int rc;
    load_good_set_with_edited_gz_images(drop_trailer, err, sizeof(err), &rc, ipath);
    ck_assert_msg(rc == -1, "fm_load returned %d, want -1 (err \"%s\")", rc, err);
    ck_assert_msg(strstr(err, ipath) != NULL, "message \"%s\" does not name %s", err, ipath);
}
END_TEST

/* Each .gz file (images, then labels) cut by 1 to 10 bytes: the data may be all there, only
 * the CRC-32 and length trailer (RFC 1952) is short, so zlib learns of it only at the end of
 * the stream. Loop index: 0..9 cut the images by 1..10 bytes, 10..19 the labels. */
START_TEST(load_rejects_a_gzip_file_cut_by_1_to_10_bytes_naming_the_file)
{
    int labels = _i >= 10;
    long cut = 1 + _i % 10;
    const char *dir = make_tmp_dir();
    char ipath[256], lpath[256], err[512] = "";
    bytes_t im = good_images(), lb = good_labels();
    write_file(dir, IMAGES_NAME, 1, &im, ipath, sizeof(ipath));
    write_file(dir, LABELS_NAME, 1, &lb, lpath, sizeof(lpath));
    const char *victim = labels ? lpath : ipath;

    /* The whole files load. */
    fm_set_t set;
    int rc = fm_load(dir, "train", &set, err, sizeof(err));
    ck_assert_msg(rc == 0, "whole files: fm_load returned %d (err \"%s\")", rc, err);
    fm_free(&set);

    struct stat st;
    ck_assert_int_eq(stat(victim, &st), 0);
    ck_assert_int_eq(truncate(victim, st.st_size - cut), 0);
    rc = fm_load(dir, "train", &set, err, sizeof(err));
    ck_assert_msg(rc == -1, "%s cut by %ld bytes: fm_load returned %d, want -1 (err \"%s\")",
                  victim, cut, rc, err);
    ck_assert_msg(strstr(err, victim) != NULL, "cut by %ld: message \"%s\" does not name %s", cut,
                  err, victim);
    ck_assert_msg(contains_nocase(err, "truncated"), "cut by %ld: message \"%s\" does not say truncated",
                  cut, err);
    ck_assert_ptr_null(set.images);
    ck_assert_ptr_null(set.labels);
    free(im.data);
    free(lb.data);
    remove_tmp_dir();
}
END_TEST

/* One-dimensional IDX files of 1000, 40000 and 1000000 bytes, gzipped, then cut by 1 to 10
 * bytes (loop index: size * 10 + cut - 1). At 40000 bytes and more, zlib's gzread can fill
 * the caller's buffer just as its input runs out and never report the short trailer. */
static const uint32_t CUT_SIZES[] = {1000, 40000, 1000000};

START_TEST(read_idx_rejects_a_gzip_file_cut_by_1_to_10_bytes_and_reads_it_whole)
{
    uint32_t n = CUT_SIZES[_i / 10];
    long cut = 1 + _i % 10;
    uint8_t *want = xcalloc(n, 1);
    for (uint32_t i = 0; i < n; i++)
        want[i] = (uint8_t)((i * 7 + i / 13) % 10);
    bytes_t b = idx_bytes(0x801, 1, &n, want, n);
    const char *dir = make_tmp_dir();
    char path[256], err[512] = "";
    write_file(dir, LABELS_NAME, 1, &b, path, sizeof(path));

    int dims[1];
    uint8_t *data;
    int rc = fm_read_idx(path, 1, dims, &data, err, sizeof(err));
    ck_assert_msg(rc == 0, "whole file of %u bytes: fm_read_idx returned %d (err \"%s\")", n, rc,
                  err);
    ck_assert_int_eq(dims[0], (int)n);
    ck_assert_mem_eq(data, want, n);
    free(data);

    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(truncate(path, st.st_size - cut), 0);
    data = (uint8_t *)&rc; /* must come back NULL */
    rc = fm_read_idx(path, 1, dims, &data, err, sizeof(err));
    ck_assert_msg(rc == -1, "%u bytes, gzip file cut by %ld: fm_read_idx returned %d, want -1", n,
                  cut, rc);
    ck_assert_ptr_null(data);
    ck_assert_msg(strstr(err, path) != NULL, "message \"%s\" does not name %s", err, path);
    ck_assert_msg(contains_nocase(err, "truncated"), "message \"%s\" does not say truncated", err);
    free(want);
    free(b.data);
    remove_tmp_dir();
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* The real data set                                                                   */

/* Sizes, class counts (Fashion-MNIST is balanced), first labels and the sum of all
 * pixel bytes, as Python's gzip module reads the files. */
typedef struct real_set_facts {
    const char *prefix;
    int n;
    int per_class;
    uint8_t first_labels[10];
    uint64_t pixel_sum;
} real_set_facts_t;

static const real_set_facts_t REAL_SETS[] = {
    {"train", 60000, 6000, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, 3431114169ull},
    {"t10k", 10000, 1000, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7}, 573469082ull},
};

START_TEST(load_reads_the_real_fashion_mnist_train_and_t10k_sets)
{
    const real_set_facts_t *facts = &REAL_SETS[_i];
    struct stat st;
    if (stat(REAL_DATA_DIR, &st) != 0) {
        printf("note: %s does not exist; the real-data check of %s is skipped\n", REAL_DATA_DIR,
               facts->prefix);
        return;
    }
    char err[512] = "";
    fm_set_t set;
    int rc = fm_load(REAL_DATA_DIR, facts->prefix, &set, err, sizeof(err));
    ck_assert_msg(rc == 0, "fm_load(%s, %s) = %d: %s", REAL_DATA_DIR, facts->prefix, rc, err);
    ck_assert_int_eq(set.n, facts->n);
    ck_assert_int_eq(set.rows, 28);
    ck_assert_int_eq(set.cols, 28);
    int counts[FMNIST_CLASSES] = {0};
    for (int i = 0; i < set.n; i++) {
        if (set.labels[i] >= FMNIST_CLASSES)
            ck_abort_msg("%s label %d is %d", facts->prefix, i, set.labels[i]);
        counts[set.labels[i]]++;
    }
    for (int c = 0; c < FMNIST_CLASSES; c++)
        ck_assert_msg(counts[c] == facts->per_class, "%s class %d: %d samples, want %d",
                      facts->prefix, c, counts[c], facts->per_class);
    ck_assert_mem_eq(set.labels, facts->first_labels, 10);
    uint64_t sum = 0;
    double sum_sq = 0;
    size_t total = (size_t)set.n * 28 * 28;
    for (size_t i = 0; i < total; i++) {
        sum += set.images[i];
        sum_sq += (double)set.images[i] * set.images[i];
    }
    ck_assert_msg(sum == facts->pixel_sum, "%s pixel sum %llu, want %llu", facts->prefix,
                  (unsigned long long)sum, (unsigned long long)facts->pixel_sum);
    if (facts->n == 60000) {
        /* The normalisation constants are the training set's own statistics. */
        double mean = (double)sum / total / 255.0;
        double std = sqrt(sum_sq / total / (255.0 * 255.0) - mean * mean);
        ck_assert_msg(fabs(mean - FMNIST_MEAN) < 5e-4, "train mean %.5f, FMNIST_MEAN %.5f", mean,
                      (double)FMNIST_MEAN);
        ck_assert_msg(fabs(std - FMNIST_STD) < 5e-4, "train std %.5f, FMNIST_STD %.5f", std,
                      (double)FMNIST_STD);
    }
    fm_free(&set);
}
END_TEST

static Suite *fmnist_data_suite(void)
{
    Suite *s = suite_create("fmnist_data");

    TCase *data = tcase_create("data");
    tcase_set_timeout(data, TEST_TIMEOUT_S);
    tcase_add_test(data, load_reads_plain_idx_files_with_their_shape_pixels_and_labels);
    tcase_add_test(data, load_reads_gzipped_idx_files_with_their_shape_pixels_and_labels);
    tcase_add_test(data, load_keeps_rows_and_cols_of_non_square_images_apart);
    tcase_add_test(data, read_idx_returns_the_dims_and_bytes_of_a_one_dimensional_file);
    tcase_add_test(data, batch_normalises_pixels_with_mean_0_2860_and_std_0_3530);
    tcase_add_loop_test(data, load_rejects_each_damaged_file_naming_the_file_and_the_problem, 0,
                        2 * N_DAMAGE_CASES);
    tcase_add_test(data, load_rejects_a_gzip_stream_cut_short_naming_the_file);
    tcase_add_test(data, load_rejects_a_gzip_file_whose_crc_is_wrong_naming_the_file);
    tcase_add_loop_test(data, load_rejects_a_gzip_file_cut_by_1_to_10_bytes_naming_the_file, 0,
                        20);
    tcase_add_loop_test(data, read_idx_rejects_a_gzip_file_cut_by_1_to_10_bytes_and_reads_it_whole,
                        0, 30);
    tcase_add_loop_test(data, load_reads_the_real_fashion_mnist_train_and_t10k_sets, 0, 2);
    suite_add_tcase(s, data);

    {   /* bugs found by these tests and since fixed */
        TCase *known = tcase_create("regressions");
        tcase_set_timeout(known, TEST_TIMEOUT_S);
        tcase_add_test(known, load_rejects_a_gzip_file_missing_its_crc_trailer_naming_the_file);
        suite_add_tcase(s, known);
    }

    return s;
}

FSDP2_CHECK_MAIN(fmnist_data_suite)
