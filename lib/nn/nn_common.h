/* What the layers share: argument checks for parameter tensors, the workspace carved into
 * f32 regions, and bf16-aware row loads and gradient adds. */
#ifndef FSDP2_NN_COMMON_H
#define FSDP2_NN_COMMON_H

#include <limits.h>
#include <stdint.h>

#include <fsdp2/nn.h>

#include "../core/error.h"

/* A parameter or gradient tensor: on a cpu device, f32 or bf16, of this shape. what names
 * it in the error ("linear weight"). */
fsdp2_status_t nn_check_param(const fsdp2_tensor_t *t, const char *what, int ndim,
                              const int64_t *shape);

/* A size that must be >= 0 and fit a BLAS int. */
fsdp2_status_t nn_check_dim(int64_t v, const char *what);

/* Sequential regions of a workspace. */
typedef struct nn_carve {
    char *at;
    size_t left;
} nn_carve_t;

/* The carve of ws, refusing one smaller than need bytes (what names the layer). */
fsdp2_status_t nn_carve_begin(fsdp2_nn_workspace_t *ws, size_t need, const char *what,
                              nn_carve_t *c);
/* n floats, 64-byte aligned; nn_carve_begin checked the room. */
float *nn_carve_floats(nn_carve_t *c, int64_t n);

/* Bytes of a region of n floats in a workspace (its alignment slack included). */
size_t nn_region_bytes(int64_t n);

/* count elements of t from element first, as f32, into dst. */
void nn_load(float *dst, const fsdp2_tensor_t *t, int64_t first, int64_t count);
/* t[first + i] += src[i] for count elements (a bf16 gradient is rounded once). */
void nn_add_into(fsdp2_tensor_t *t, int64_t first, const float *src, int64_t count);
/* t's elements as f32: t's own data when f32, else converted into scratch. */
const float *nn_as_f32(const fsdp2_tensor_t *t, float *scratch);

#endif
