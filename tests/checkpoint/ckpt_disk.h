/* What the checkpoint test programs (test_checkpoint_roundtrip.c, _failures.c,
 * _export.c) share besides the model of ckpt_model.h: a scratch directory per test and
 * the ranks run over it, whole files and flat directories, metadata.json's fields, and
 * the bytes a tensor should have on disk, written out independently of the library. */
#ifndef FSDP2_TESTS_CKPT_DISK_H
#define FSDP2_TESTS_CKPT_DISK_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "../core/remove_tree.h"
#include "ckpt_model.h"

/* One test's paths and settings, handed to every rank as rank_ctx_t.arg. */
typedef struct job {
    char root[128]; /* the test's scratch directory */
    char dir[256];  /* the checkpoint directory or whole-model file */
    char dump[256]; /* resume: the uninterrupted run's tensors */
    int per_rank_grads;
    int64_t step;
} job_t;

/* Zeroes job and makes job->root, a fresh directory under $TMPDIR (or /tmp). */
void make_scratch(job_t *job);

/* Runs body on ws ranks with job as their argument; fails the test, naming `what` and
 * where the files were left, unless every rank passes. */
void run_case(int ws, rank_fn body, job_t *job, const char *what);

/* ---------------------------------------------------------------------------------- */
/* Files                                                                               */

/* The whole regular file at path, NUL-terminated, into *buf (NULL on failure). */
int read_all(const char *path, char **buf, size_t *len);
int write_all(const char *path, const void *buf, size_t len);
/* The first `limit` bytes of src (all of them when limit is SIZE_MAX) into dst. */
int copy_file(const char *src, const char *dst, size_t limit);
/* A flat directory (a checkpoint holds only files). */
int copy_dir(const char *src, const char *dst);
/* The names in dir (not . and ..), sorted, joined by spaces. */
void list_dir(const char *dir, char *out, size_t len);

cJSON *json_read(const char *path);
int json_write(const char *path, const cJSON *root);
int64_t json_int(const cJSON *o, const char *key); /* -999 when absent or not a number */
const char *json_str(const cJSON *o, const char *key); /* "(absent)" when absent */
/* The int array a equals v[0..n). */
int json_dims_are(const cJSON *a, const int64_t *v, int n);

/* ---------------------------------------------------------------------------------- */
/* Expectations written out independently of the library                              */

/* The checkpoint's name for parameter s (st == 0) or its optimizer state st - 1. */
void slot_name(const param_spec_t *s, int st, char *buf, size_t len);
size_t elem_size(fsdp2_dtype_t dtype);
int64_t row_elems(const param_spec_t *s);
/* value_of(seed, slot, first + i) for i < n, stored as dtype; the caller frees it. */
void *formula_bytes(fsdp2_dtype_t dtype, int seed, int slot, int64_t first, int64_t n);
/* The base model's tensors (no optimizer state) and their formula slots; returns how
 * many (specs and slots hold MAX_PARAMS + NUM_WHOLE). */
int model_tensors(param_spec_t *specs, int *slots);

#endif
