/* Tensors: contiguous views on refcounted storage. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device_ops.h"
#include "core/error.h"
#include <fsdp2/tensor.h>

struct fsdp2_storage {
    atomic_int refs;
    fsdp2_device_t device;
    void *data;
    size_t bytes;
    int owned; /* from fsdp2_device_alloc */
    fsdp2_deleter_fn deleter;
    void *user;
};

fsdp2_status_t fsdp2_shape_format(int ndim, const int64_t *shape, char *buf, size_t len)
{
    FSDP2_ARG_CHECK(buf && len > 0, "buf is NULL or len is 0");
    FSDP2_ARG_CHECK(ndim >= 0 && ndim <= FSDP2_MAX_DIMS, "ndim %d is not in 0..%d", ndim,
                    FSDP2_MAX_DIMS);
    FSDP2_ARG_CHECK(ndim == 0 || shape, "shape is NULL with ndim %d", ndim);
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i <= ndim && used < len; i++) {
        int n;
        if (i == ndim)
            n = snprintf(buf + used, len - used, "]");
        else
            n = snprintf(buf + used, len - used, "%s%lld", i ? "," : "[", (long long)shape[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    if (ndim == 0)
        snprintf(buf, len, "[]");
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_shape_numel(int ndim, const int64_t *shape, int64_t *numel)
{
    FSDP2_ARG_CHECK(numel, "numel is NULL");
    FSDP2_ARG_CHECK(ndim >= 0 && ndim <= FSDP2_MAX_DIMS, "ndim %d is not in 0..%d", ndim,
                    FSDP2_MAX_DIMS);
    FSDP2_ARG_CHECK(ndim == 0 || shape, "shape is NULL with ndim %d", ndim);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            char text[256];
            fsdp2_shape_format(ndim, shape, text, sizeof(text));
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "shape %s has negative dim %d", text, i);
        }
        if (__builtin_mul_overflow(n, shape[i], &n)) {
            char text[256];
            fsdp2_shape_format(ndim, shape, text, sizeof(text));
            return fsdp2_error(FSDP2_ERR_OVERFLOW, "shape %s has more than 2^63 elements", text);
        }
    }
    *numel = n;
    return FSDP2_SUCCESS;
}

/* Fills the metadata of t for (device, dtype, shape), checking overflow of the bytes. */
static fsdp2_status_t tensor_meta(fsdp2_tensor_t *t, fsdp2_device_t device, fsdp2_dtype_t dtype,
                                  int ndim, const int64_t *shape)
{
    size_t elem;
    FSDP2_CHECK(fsdp2_dtype_size(dtype, &elem));
    int64_t numel;
    FSDP2_CHECK(fsdp2_shape_numel(ndim, shape, &numel));
    size_t nbytes;
    if (__builtin_mul_overflow((size_t)numel, elem, &nbytes)) {
        char text[256];
        fsdp2_shape_format(ndim, shape, text, sizeof(text));
        return fsdp2_error(FSDP2_ERR_OVERFLOW, "shape %s of %s overflows size_t bytes", text,
                           fsdp2_dtype_name(dtype));
    }
    memset(t, 0, sizeof(*t));
    t->dtype = dtype;
    t->device = device;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->numel = numel;
    t->nbytes = nbytes;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t storage_new(fsdp2_device_t device, void *data, size_t bytes, int owned,
                                  fsdp2_deleter_fn deleter, void *user, fsdp2_storage_t **out)
{
    fsdp2_storage_t *s = calloc(1, sizeof(*s));
    if (!s)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tensor storage header");
    atomic_init(&s->refs, 1);
    s->device = device;
    s->data = data;
    s->bytes = bytes;
    s->owned = owned;
    s->deleter = deleter;
    s->user = user;
    *out = s;
    return FSDP2_SUCCESS;
}

static void storage_release(fsdp2_storage_t *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    if (s->owned)
        fsdp2_device_free(s->device, s->data);
    else if (s->deleter)
        s->deleter(s->data, s->user);
    free(s);
}

fsdp2_status_t fsdp2_tensor_empty(fsdp2_device_t device, fsdp2_dtype_t dtype, int ndim,
                                  const int64_t *shape, fsdp2_tensor_t **out)
{
    FSDP2_ARG_CHECK(out, "out is NULL");
    *out = NULL;
    fsdp2_tensor_t meta;
    FSDP2_CHECK(tensor_meta(&meta, device, dtype, ndim, shape));
    fsdp2_tensor_t *t = malloc(sizeof(*t));
    if (!t)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tensor header");
    *t = meta;
    if (device.type != FSDP2_DEVICE_META) {
        void *data = NULL;
        fsdp2_status_t status = fsdp2_device_alloc(device, t->nbytes, &data);
        if (status == FSDP2_SUCCESS)
            status = storage_new(device, data, t->nbytes, 1, NULL, NULL, &t->storage);
        if (status != FSDP2_SUCCESS) {
            if (data)
                fsdp2_device_free(device, data);
            free(t);
            return status;
        }
        t->data = data;
    }
    *out = t;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tensor_zeros(fsdp2_device_t device, fsdp2_dtype_t dtype, int ndim,
                                  const int64_t *shape, fsdp2_tensor_t **out)
{
    FSDP2_CHECK(fsdp2_tensor_empty(device, dtype, ndim, shape, out));
    fsdp2_tensor_t *t = *out;
    if (device.type == FSDP2_DEVICE_META || t->numel == 0)
        return FSDP2_SUCCESS;
    fsdp2_stream_t *stream;
    fsdp2_status_t status = fsdp2_stream_current(device, &stream);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_fill_async(t->data, dtype, (size_t)t->numel, 0.0, stream);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_stream_synchronize(stream);
    if (status != FSDP2_SUCCESS) {
        fsdp2_tensor_release(t);
        *out = NULL;
    }
    return status;
}

fsdp2_status_t fsdp2_tensor_from_blob(void *data, fsdp2_device_t device, fsdp2_dtype_t dtype,
                                      int ndim, const int64_t *shape, fsdp2_deleter_fn deleter,
                                      void *user, fsdp2_tensor_t **out)
{
    FSDP2_ARG_CHECK(out, "out is NULL");
    *out = NULL;
    FSDP2_ARG_CHECK(device.type != FSDP2_DEVICE_META, "from_blob on the meta device");
    fsdp2_tensor_t meta;
    FSDP2_CHECK(tensor_meta(&meta, device, dtype, ndim, shape));
    FSDP2_ARG_CHECK(data || meta.nbytes == 0, "data is NULL for %zu bytes", meta.nbytes);
    fsdp2_tensor_t *t = malloc(sizeof(*t));
    if (!t)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tensor header");
    *t = meta;
    fsdp2_status_t status = storage_new(device, data, meta.nbytes, 0, deleter, user, &t->storage);
    if (status != FSDP2_SUCCESS) {
        free(t);
        return status;
    }
    t->data = meta.nbytes ? data : NULL;
    *out = t;
    return FSDP2_SUCCESS;
}

/* A new handle sharing t's storage, with the given metadata and byte offset. */
static fsdp2_status_t tensor_view(const fsdp2_tensor_t *t, const fsdp2_tensor_t *meta,
                                  size_t offset, fsdp2_tensor_t **out)
{
    fsdp2_tensor_t *v = malloc(sizeof(*v));
    if (!v)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "tensor header");
    *v = *meta;
    v->storage = t->storage;
    v->storage_offset = offset;
    if (t->storage) {
        atomic_fetch_add(&t->storage->refs, 1);
        v->data = v->nbytes ? (char *)t->storage->data + offset : NULL;
    }
    *out = v;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tensor_narrow(const fsdp2_tensor_t *t, int64_t start, int64_t length,
                                   fsdp2_tensor_t **out)
{
    FSDP2_ARG_CHECK(t && out, "t or out is NULL");
    *out = NULL;
    FSDP2_ARG_CHECK(t->ndim >= 1, "narrow of a 0-dim tensor");
    FSDP2_ARG_CHECK(start >= 0 && length >= 0 && start <= t->shape[0] &&
                        length <= t->shape[0] - start,
                    "narrow rows [%lld, %lld + %lld) outside dim 0 of size %lld",
                    (long long)start, (long long)start, (long long)length,
                    (long long)t->shape[0]);
    int64_t shape[FSDP2_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(shape));
    shape[0] = length;
    fsdp2_tensor_t meta;
    FSDP2_CHECK(tensor_meta(&meta, t->device, t->dtype, t->ndim, shape));
    int64_t row = t->shape[0] ? t->numel / t->shape[0] : 0;
    size_t elem;
    fsdp2_dtype_size(t->dtype, &elem);
    size_t offset = t->storage_offset + (size_t)(start * row) * elem;
    return tensor_view(t, &meta, offset, out);
}

fsdp2_status_t fsdp2_tensor_reshape(const fsdp2_tensor_t *t, int ndim, const int64_t *shape,
                                    fsdp2_tensor_t **out)
{
    FSDP2_ARG_CHECK(t && out, "t or out is NULL");
    *out = NULL;
    FSDP2_ARG_CHECK(ndim >= 0 && ndim <= FSDP2_MAX_DIMS, "ndim %d is not in 0..%d", ndim,
                    FSDP2_MAX_DIMS);
    FSDP2_ARG_CHECK(ndim == 0 || shape, "shape is NULL with ndim %d", ndim);
    int64_t resolved[FSDP2_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        resolved[i] = shape[i];
        if (shape[i] == -1) {
            FSDP2_ARG_CHECK(infer < 0, "reshape: more than one -1 in the shape");
            infer = i;
        } else {
            FSDP2_ARG_CHECK(shape[i] >= 0, "reshape: dim %d is %lld", i, (long long)shape[i]);
            if (__builtin_mul_overflow(known, shape[i], &known))
                return fsdp2_error(FSDP2_ERR_OVERFLOW, "reshape: shape overflows");
        }
    }
    if (infer >= 0) {
        FSDP2_ARG_CHECK(known > 0 && t->numel % known == 0,
                        "reshape: cannot infer dim %d: %lld elements are not a multiple of %lld",
                        infer, (long long)t->numel, (long long)known);
        resolved[infer] = t->numel / known;
    }
    fsdp2_tensor_t meta;
    FSDP2_CHECK(tensor_meta(&meta, t->device, t->dtype, ndim, resolved));
    if (meta.numel != t->numel) {
        char from[256], to[256];
        fsdp2_shape_format(t->ndim, t->shape, from, sizeof(from));
        fsdp2_shape_format(ndim, resolved, to, sizeof(to));
        return fsdp2_error(FSDP2_ERR_SHAPE_MISMATCH, "reshape %s (%lld elements) to %s (%lld)",
                           from, (long long)t->numel, to, (long long)meta.numel);
    }
    return tensor_view(t, &meta, t->storage_offset, out);
}

fsdp2_status_t fsdp2_tensor_retain(const fsdp2_tensor_t *t, fsdp2_tensor_t **out)
{
    FSDP2_ARG_CHECK(t && out, "t or out is NULL");
    return tensor_view(t, t, t->storage_offset, out);
}

fsdp2_status_t fsdp2_tensor_release(fsdp2_tensor_t *t)
{
    if (!t)
        return FSDP2_SUCCESS;
    storage_release(t->storage);
    free(t);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_tensor_check(const fsdp2_tensor_t *t, const char *what, fsdp2_dtype_t dtype,
                                  int ndim, const int64_t *shape)
{
    FSDP2_ARG_CHECK(t, "tensor '%s' is NULL", what ? what : "");
    const char *name = what ? what : "";
    FSDP2_ARG_CHECK(ndim >= 0 && ndim <= FSDP2_MAX_DIMS, "tensor '%s': expected ndim %d is not in 0..%d",
                    name, ndim, FSDP2_MAX_DIMS);
    FSDP2_ARG_CHECK(ndim == 0 || shape, "tensor '%s': expected shape is NULL with ndim %d", name,
                    ndim);
    if (t->dtype != dtype)
        return fsdp2_error(FSDP2_ERR_DTYPE_MISMATCH, "tensor '%s': dtype %s does not match %s",
                           name, fsdp2_dtype_name(t->dtype), fsdp2_dtype_name(dtype));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char have[256], want[256];
        fsdp2_shape_format(t->ndim, t->shape, have, sizeof(have));
        fsdp2_shape_format(ndim, shape, want, sizeof(want));
        return fsdp2_error(FSDP2_ERR_SHAPE_MISMATCH, "tensor '%s': shape %s does not match %s",
                           name, have, want);
    }
    return FSDP2_SUCCESS;
}
