/* Helpers of test_hf_model.c: the fixtures of tests/checkpoint/hf (HF_FIXTURES_DIR), a
 * scratch directory per test, copies of fixtures with one change, and the reference
 * values of NAME.expected. Every failure is a Check assertion. */
#ifndef FSDP2_TESTS_HF_FIXTURES_H
#define FSDP2_TESTS_HF_FIXTURES_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <fsdp2/status.h>

#include "../core/remove_tree.h"

#define ASSERT_OK(call)                                                                      \
    do {                                                                                     \
        fsdp2_status_t assert_ok_s_ = (call);                                                \
        ck_assert_msg(assert_ok_s_ == FSDP2_SUCCESS, "%s = %s (%s)", #call,                  \
                      fsdp2_status_name(assert_ok_s_), fsdp2_last_error());                  \
    } while (0)

#define ASSERT_REFUSED(call, want, needle)                                                   \
    do {                                                                                     \
        fsdp2_status_t refused_s_ = (call);                                                  \
        ck_assert_msg(refused_s_ == (want) && strstr(fsdp2_last_error(), (needle)) != NULL,  \
                      "%s = %s (%s), want %s naming '%s'", #call, fsdp2_status_name(refused_s_), \
                      fsdp2_last_error(), fsdp2_status_name(want), (needle));                \
    } while (0)


extern char scratch[256];

/* HF_FIXTURES_DIR/name, and scratch/name (each in one of 4 rotating buffers). */
const char *fixture(const char *name);
const char *in_scratch(const char *name);
void scratch_setup(void);
void scratch_teardown(void);
/* Entries of a directory besides . and .. (-1: not a directory). */
int count_entries(const char *dir);
/* A copy of a fixture directory in the scratch directory, named as; returns its path. */
const char *copy_fixture(const char *name, const char *as);
char *slurp(const char *path);
void write_text(const char *path, const char *text);
/* Replaces the first `from` in a file by `to`. */
void edit_file(const char *path, const char *from, const char *to);

/* Rewrites a safetensors file in place, with one change. */
typedef struct change {
    const char *drop;    /* leave this tensor out */
    const char *retype;  /* store this F32 tensor as I32 (same bytes) */
    const char *poison;  /* set element poison_index of this F32 tensor to poison_value */
    size_t poison_index;
    float poison_value;
    const char *extra;   /* add an F32 tensor of this name, of ones: */
    int64_t extra_shape[2]; /* [rows, cols] ({0, 0}: [2]; cols 0: a vector) */
    int to_f16;          /* store every F32 tensor as F16 (rounded once) */
} change_t;
void rewrite(const char *path, const change_t *c);

/* One line of NAME.expected (make_hf_fixtures.py). */
typedef struct expected {
    char name[128];
    int64_t rows, cols;
    double sum, wsum, first, last;
} expected_t;
size_t load_expected(const char *name, expected_t *out, size_t cap);
const expected_t *find_expected(const expected_t *e, size_t n, const char *name);

#endif
