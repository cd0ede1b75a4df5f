/* What the layer tests share: tensors wrapping test arrays, f32/f64 copies, closeness
 * checks that print the worst element, and the fixture reader. */
#ifndef FSDP2_TESTS_NN_UTIL_H
#define FSDP2_TESTS_NN_UTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/dtype.h>
#include <fsdp2/nn.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

#define NN_OK(call)                                                                        \
    do {                                                                                   \
        fsdp2_status_t s_ = (call);                                                        \
        ck_assert_msg(s_ == FSDP2_SUCCESS, "%s failed: %s (%s)", #call, fsdp2_strerror(s_), \
                      fsdp2_last_error());                                                 \
    } while (0)

/* A workspace larger than any the tests' layers need (a layer with a workspace query
 * checks it whatever the dtypes), for the calls whose workspace is not what they test. */
static inline fsdp2_nn_workspace_t *test_ws(void)
{
    static _Alignas(64) char scratch[16 << 20];
    static fsdp2_nn_workspace_t ws = {scratch, sizeof(scratch)};
    return &ws;
}

/* fsdp2_nn_cross_entropy with its settings and results as separate values (NULL for a
 * result not wanted); loss, counted and correct are left as they were on an error. */
static inline fsdp2_status_t cross_entropy(const float *logits, const int32_t *targets,
                                           int64_t rows, int64_t classes, int32_t ignore_index,
                                           double divisor, double *loss, float *dlogits,
                                           int64_t *counted, int64_t *correct)
{
    fsdp2_nn_cross_entropy_options_t o = FSDP2_NN_CROSS_ENTROPY_OPTIONS_INIT;
    o.ignore_index = ignore_index;
    o.divisor = divisor;
    fsdp2_nn_cross_entropy_result_t r;
    fsdp2_status_t s = fsdp2_nn_cross_entropy(logits, targets, rows, classes, &o, dlogits, &r);
    if (s != FSDP2_SUCCESS)
        return s;
    *loss = r.loss;
    if (counted)
        *counted = r.counted;
    if (correct)
        *correct = r.correct;
    return s;
}

/* A cpu tensor over caller memory (dtype f32 or bf16). */
static inline fsdp2_tensor_t *wrap(void *data, fsdp2_dtype_t dtype, int ndim, int64_t d0,
                                   int64_t d1)
{
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    int64_t shape[2] = {d0, d1};
    fsdp2_tensor_t *t = NULL;
    NN_OK(fsdp2_tensor_from_blob(data, cpu, dtype, ndim, shape, NULL, NULL, &t));
    return t;
}

static inline float *f32_array(int64_t n)
{
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    ck_assert_ptr_nonnull(p);
    return p;
}

/* n bf16 values widened to f32 (exact), in a new array. */
static inline float *from_bf16(const uint16_t *v, int64_t n)
{
    float *p = f32_array(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = fsdp2_bf16_to_f32(v[i]);
    return p;
}

/* max |got - want| <= tol * max(1, max |want|); prints the worst element otherwise. */
static inline void assert_close(const char *what, const float *got, const double *want, int64_t n,
                                double tol)
{
    double scale = 1, worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++)
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    if (!(worst <= tol * scale))
        ck_abort_msg("%s: element %lld is %.9g where %.9g is expected (error %.3g > %.3g)", what,
                     (long long)at, (double)got[at], want[at], worst, tol * scale);
}

/* ---- fixtures: see make_fixtures.py for the format ---- */

typedef struct fixture_entry {
    char name[64];
    int64_t n;
    double *v;
} fixture_entry_t;

static fixture_entry_t fixture_entries[256];
static int fixture_count;

static inline void fixtures_load(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open the fixtures %s", path);
    char word[16];
    fixture_count = 0;
    while (fscanf(f, "%15s", word) == 1) {
        if (word[0] == '#') {
            int c;
            while ((c = fgetc(f)) != EOF && c != '\n')
                ;
            continue;
        }
        ck_assert_int_lt(fixture_count, 256);
        fixture_entry_t *e = &fixture_entries[fixture_count++];
        ck_assert_int_eq(fscanf(f, "%63s", e->name), 1);
        if (strcmp(word, "scalar") == 0) {
            e->n = 1;
        } else {
            ck_assert_str_eq(word, "tensor");
            int ndim;
            ck_assert_int_eq(fscanf(f, "%d", &ndim), 1);
            e->n = 1;
            for (int i = 0; i < ndim; i++) {
                long long d;
                ck_assert_int_eq(fscanf(f, "%lld", &d), 1);
                e->n *= d;
            }
        }
        e->v = malloc(sizeof(double) * (size_t)(e->n > 0 ? e->n : 1));
        for (int64_t i = 0; i < e->n; i++)
            ck_assert_int_eq(fscanf(f, "%lf", &e->v[i]), 1);
    }
    fclose(f);
}

/* The fixture's values; its element count must be n. */
static inline const double *fixture(const char *name, int64_t n)
{
    for (int i = 0; i < fixture_count; i++) {
        if (strcmp(fixture_entries[i].name, name) == 0) {
            ck_assert_msg(fixture_entries[i].n == n, "fixture %s has %lld values, not %lld", name,
                          (long long)fixture_entries[i].n, (long long)n);
            return fixture_entries[i].v;
        }
    }
    ck_abort_msg("fixture %s is missing", name);
    return NULL;
}

/* A fixture as a new f32 array (the inputs are f32 values written exactly). */
static inline float *fixture_f32(const char *name, int64_t n)
{
    const double *v = fixture(name, n);
    float *p = f32_array(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)v[i];
    return p;
}

static inline int32_t *fixture_i32(const char *name, int64_t n)
{
    const double *v = fixture(name, n);
    int32_t *p = calloc((size_t)n, sizeof(int32_t));
    for (int64_t i = 0; i < n; i++)
        p[i] = (int32_t)v[i];
    return p;
}

/* A workspace of bytes, released by workspace_free. */
static inline fsdp2_nn_workspace_t workspace_new(size_t bytes)
{
    fsdp2_nn_workspace_t ws = {aligned_alloc(64, ((bytes + 63) / 64) * 64 + 64), bytes};
    ck_assert_ptr_nonnull(ws.data);
    return ws;
}

static inline void workspace_free(fsdp2_nn_workspace_t *ws)
{
    free(ws->data);
    ws->data = NULL;
}

#endif
