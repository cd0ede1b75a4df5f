/* Helpers of test_hf_model.c (hf_fixtures.h). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fsdp2/dtype.h>

#include "checkpoint/safetensors.h"
#include "hf_fixtures.h"

/* ---------------------------------------------------------------------------------- */
/* Paths and a scratch directory                                                       */

char scratch[256];

const char *fixture(const char *name)
{
    static char path[4][512];
    static int turn;
    const char *dir = getenv("HF_FIXTURES_DIR");
    ck_assert_msg(dir != NULL, "HF_FIXTURES_DIR is not set");
    char *p = path[turn++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

const char *in_scratch(const char *name)
{
    static char path[4][512];
    static int turn;
    char *p = path[turn++ % 4];
    snprintf(p, 512, "%s/%s", scratch, name);
    return p;
}

void scratch_setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof(scratch), "%s/hf_test_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(scratch) != NULL, "mkdtemp %s: %s", scratch, strerror(errno));
}

void scratch_teardown(void)
{
    remove_tree(scratch);
}

int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    ck_assert_msg(in != NULL && out != NULL, "copy %s -> %s: %s", from, to, strerror(errno));
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    ck_assert_int_eq(fclose(out), 0);
}

/* A copy of a fixture directory in the scratch directory; returns its path. */
const char *copy_fixture(const char *name, const char *as)
{
    const char *from = fixture(name);
    static char to[512];
    snprintf(to, sizeof(to), "%s/%s", scratch, as);
    ck_assert_int_eq(mkdir(to, 0755), 0);
    DIR *d = opendir(from);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    char a[1024], b[1024];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(a, sizeof(a), "%s/%s", from, e->d_name);
        snprintf(b, sizeof(b), "%s/%s", to, e->d_name);
        copy_file(a, b);
    }
    closedir(d);
    return to;
}

char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = '\0';
    fclose(f);
    return text;
}

void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Replaces the first `from` in a file by `to`. */
void edit_file(const char *path, const char *from, const char *to)
{
    char *text = slurp(path);
    char *at = strstr(text, from);
    ck_assert_msg(at != NULL, "%s has no '%s'", path, from);
    size_t len = strlen(text) - strlen(from) + strlen(to) + 1;
    char *out = malloc(len);
    snprintf(out, len, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    write_text(path, out);
    free(out);
    free(text);
}

/* ---------------------------------------------------------------------------------- */
/* Rewriting a safetensors file, with one change                                       */



void rewrite(const char *path, const change_t *c)
{
    char from[600];
    snprintf(from, sizeof(from), "%s.orig", path);
    ck_assert_int_eq(rename(path, from), 0);
    st_file_t f;
    ASSERT_OK(st_open(from, &f));
    st_writer_t *w;
    ASSERT_OK(st_writer_create(path, &w));
    for (size_t i = 0; i < f.num_entries; i++) {
        const st_entry_t *e = &f.entries[i];
        if (c->drop && strcmp(e->name, c->drop) == 0)
            continue;
        fsdp2_dtype_t dtype = c->retype && strcmp(e->name, c->retype) == 0 ? FSDP2_I32 : e->dtype;
        if (c->to_f16 && e->dtype == FSDP2_F32)
            dtype = FSDP2_F16;
        ASSERT_OK(st_writer_add(w, e->name, dtype, e->ndim, e->shape));
    }
    int64_t two = 2;
    int64_t shape[2] = {c->extra_shape[0] ? c->extra_shape[0] : two, c->extra_shape[1]};
    int extra_ndim = shape[1] > 0 ? 2 : 1;
    size_t extra_n = (size_t)shape[0] * (size_t)(shape[1] > 0 ? shape[1] : 1);
    if (c->extra)
        ASSERT_OK(st_writer_add(w, c->extra, FSDP2_F32, extra_ndim, shape));
    ASSERT_OK(st_writer_begin(w, NULL));
    /* The writer takes the tensors in the order added: the entries' (offset) order. */
    for (size_t i = 0; i < f.num_entries; i++) {
        const st_entry_t *e = &f.entries[i];
        if (c->drop && strcmp(e->name, c->drop) == 0)
            continue;
        size_t bytes = (size_t)(e->end - e->begin);
        unsigned char *buf = malloc(bytes + 1);
        ASSERT_OK(st_read(&f, e, 0, buf, bytes));
        if (c->poison && strcmp(e->name, c->poison) == 0)
            memcpy(buf + 4 * c->poison_index, &c->poison_value, 4);
        if (c->to_f16 && e->dtype == FSDP2_F32) {
            unsigned char *half = malloc(bytes / 2 + 1);
            ASSERT_OK(fsdp2_convert(half, FSDP2_F16, buf, FSDP2_F32, bytes / 4));
            free(buf);
            buf = half;
            bytes /= 2;
        }
        ASSERT_OK(st_writer_write(w, buf, bytes));
        free(buf);
    }
    if (c->extra) {
        float *ones = malloc(sizeof(float) * extra_n);
        for (size_t k = 0; k < extra_n; k++)
            ones[k] = 1.0f;
        ASSERT_OK(st_writer_write(w, ones, sizeof(float) * extra_n));
        free(ones);
    }
    ASSERT_OK(st_writer_finish(w));
    st_close(&f);
    unlink(from);
}

/* ---------------------------------------------------------------------------------- */
/* Reference values                                                                    */



size_t load_expected(const char *name, expected_t *out, size_t cap)
{
    char path[600];
    snprintf(path, sizeof(path), "%s.expected", fixture(name));
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    char line[512];
    size_t n = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (line[0] == '#')
            continue;
        ck_assert_uint_lt(n, cap);
        expected_t *e = &out[n++];
        ck_assert_int_eq(sscanf(line, "%127s %" SCNd64 " %" SCNd64 " %lf %lf %lf %lf", e->name,
                                &e->rows, &e->cols, &e->sum, &e->wsum, &e->first, &e->last),
                         7);
    }
    fclose(f);
    return n;
}

const expected_t *find_expected(const expected_t *e, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(e[i].name, name) == 0)
            return &e[i];
    return NULL;
}
