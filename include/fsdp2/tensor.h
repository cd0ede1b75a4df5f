/* Tensors: a dtype, a device, up to FSDP2_MAX_DIMS dims, and a view of refcounted
 * storage. Always contiguous, row-major.
 *
 * The struct is public so application code can compute with t->data and t->shape
 * directly (as with ggml_tensor or DLPack's DLTensor); treat every field as read-only
 * and change tensors only through these functions. A `meta` tensor has shape and dtype
 * but no storage (data == NULL), for building models before sharding. A tensor handle
 * is owned by whoever created it and released with fsdp2_tensor_release; views share
 * the storage, which is freed when its last tensor is released. */
#ifndef FSDP2_TENSOR_H
#define FSDP2_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/device.h>
#include <fsdp2/dtype.h>
#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

#define FSDP2_MAX_DIMS 8

typedef struct fsdp2_storage fsdp2_storage_t;

typedef struct fsdp2_tensor {
    void *data; /* first element; NULL for meta tensors and for numel == 0 */
    fsdp2_dtype_t dtype;
    fsdp2_device_t device;
    int ndim;                       /* 0 (a scalar) .. FSDP2_MAX_DIMS */
    int64_t shape[FSDP2_MAX_DIMS];  /* entries >= ndim are 0 */
    int64_t numel;                  /* product of shape, 1 for ndim == 0 */
    size_t nbytes;                  /* numel * element size */
    fsdp2_storage_t *storage;       /* private; NULL for meta */
    size_t storage_offset;          /* private; bytes into storage */
} fsdp2_tensor_t;

/* Called with the user pointer when the last tensor on a wrapped buffer is released. */
typedef void (*fsdp2_deleter_fn)(void *data, void *user);

/* A new tensor with uninitialised storage from the device allocator (none for meta).
 * Shape entries must be >= 0; numel and bytes are checked for overflow. */
FSDP2_API fsdp2_status_t fsdp2_tensor_empty(fsdp2_device_t device, fsdp2_dtype_t dtype, int ndim,
                                            const int64_t *shape, fsdp2_tensor_t **out);

/* Like fsdp2_tensor_empty, then filled with zeros (synchronously). */
FSDP2_API fsdp2_status_t fsdp2_tensor_zeros(fsdp2_device_t device, fsdp2_dtype_t dtype, int ndim,
                                            const int64_t *shape, fsdp2_tensor_t **out);

/* Wraps memory the caller owns (no copy). deleter(data, user) runs when the last tensor
 * on it is released; NULL means the caller keeps ownership and must outlive the tensor. */
FSDP2_API fsdp2_status_t fsdp2_tensor_from_blob(void *data, fsdp2_device_t device,
                                                fsdp2_dtype_t dtype, int ndim,
                                                const int64_t *shape, fsdp2_deleter_fn deleter,
                                                void *user, fsdp2_tensor_t **out);

/* A view of rows [start, start + length) of dim 0, sharing storage. length may be 0. */
FSDP2_API fsdp2_status_t fsdp2_tensor_narrow(const fsdp2_tensor_t *t, int64_t start,
                                             int64_t length, fsdp2_tensor_t **out);

/* A view with another shape of the same numel. One entry may be -1 (inferred). */
FSDP2_API fsdp2_status_t fsdp2_tensor_reshape(const fsdp2_tensor_t *t, int ndim,
                                              const int64_t *shape, fsdp2_tensor_t **out);

/* Another handle on the same view (for a second owner). */
FSDP2_API fsdp2_status_t fsdp2_tensor_retain(const fsdp2_tensor_t *t, fsdp2_tensor_t **out);

/* Releases a handle. NULL is accepted. */
FSDP2_API fsdp2_status_t fsdp2_tensor_release(fsdp2_tensor_t *t);

/* Checks that t has the given dtype and shape; on mismatch the error names what (e.g.
 * "tensor 'fc1.weight': shape [128,784] does not match [128,785]"). what may be NULL. */
FSDP2_API fsdp2_status_t fsdp2_tensor_check(const fsdp2_tensor_t *t, const char *what,
                                            fsdp2_dtype_t dtype, int ndim, const int64_t *shape);

/* Formats a shape as "[128,784]" into buf; truncates safely. */
FSDP2_API fsdp2_status_t fsdp2_shape_format(int ndim, const int64_t *shape, char *buf, size_t len);

/* numel and bytes of a shape, with overflow checks. */
FSDP2_API fsdp2_status_t fsdp2_shape_numel(int ndim, const int64_t *shape, int64_t *numel);

FSDP2_EXTERN_C_END

#endif
