/* Embedding lookup and its scatter-add backward. */
#include <stdlib.h>
#include <string.h>

#include "core/cpu_kernels.h"
#include "nn_common.h"

static fsdp2_status_t check_ids(const int32_t *ids, int64_t n, int64_t num)
{
    FSDP2_ARG_CHECK(ids || n == 0, "ids is NULL");
    FSDP2_ARG_CHECK(n >= 0, "n = %lld is negative", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= num)
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "embedding id %d at index %lld is outside [0, %lld)", ids[i],
                               (long long)i, (long long)num);
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_table(const fsdp2_tensor_t *t, const char *what)
{
    FSDP2_ARG_CHECK(t && t->ndim == 2, "%s must be a 2-D tensor [num, dim]", what);
    return nn_check_param(t, what, 2, t->shape);
}

fsdp2_status_t fsdp2_nn_embedding_workspace_bytes(int64_t n, int64_t num, int64_t dim,
                                                  size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_ARG_CHECK(n >= 0 && num >= 0 && dim >= 0, "n = %lld, num = %lld, dim = %lld: negative",
                    (long long)n, (long long)num, (long long)dim);
    /* n (id, position) pairs for the sort, then one f32 row */
    *bytes = nn_region_bytes(2 * n) + nn_region_bytes(dim);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_embedding_forward(const int32_t *ids, int64_t n, int accumulate,
                                          const fsdp2_tensor_t *weight, float *y)
{
    FSDP2_CHECK(check_table(weight, "embedding table"));
    int64_t num = weight->shape[0], dim = weight->shape[1];
    FSDP2_CHECK(check_ids(ids, n, num));
    FSDP2_ARG_CHECK(y || n == 0 || dim == 0, "y is NULL");
    for (int64_t i = 0; i < n; i++) {
        float *row = y + i * dim;
        int64_t at = (int64_t)ids[i] * dim;
        size_t elem = weight->dtype == FSDP2_F32 ? sizeof(float) : sizeof(uint16_t);
        if (!accumulate)
            nn_load(row, weight, at, dim);
        else
            fsdp2_cpu_accumulate(row, FSDP2_F32, (const char *)weight->data + (size_t)at * elem,
                                 weight->dtype, (size_t)dim, 1.0);
    }
    return FSDP2_SUCCESS;
}

typedef struct id_at {
    int32_t id, at;
} id_at_t;

static int by_id_then_position(const void *a, const void *b)
{
    const id_at_t *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return (x->at > y->at) - (x->at < y->at);
}

fsdp2_status_t fsdp2_nn_embedding_backward(const int32_t *ids, const float *dy, int64_t n,
                                           fsdp2_tensor_t *dweight, fsdp2_nn_workspace_t *ws)
{
    FSDP2_CHECK(check_table(dweight, "embedding gradient"));
    int64_t num = dweight->shape[0], dim = dweight->shape[1];
    FSDP2_CHECK(check_ids(ids, n, num));
    FSDP2_ARG_CHECK(dy || n == 0 || dim == 0, "dy is NULL");
    FSDP2_ARG_CHECK(n <= INT32_MAX, "n = %lld ids: more than %d", (long long)n, INT32_MAX);
    size_t need; /* checked whatever the dtype: a program works the same with bf16 */
    FSDP2_CHECK(fsdp2_nn_embedding_workspace_bytes(n, num, dim, &need));
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, need, "embedding backward", &c));
    if (dweight->dtype == FSDP2_F32) {
        for (int64_t i = 0; i < n; i++)
            nn_add_into(dweight, (int64_t)ids[i] * dim, dy + i * dim, dim);
        return FSDP2_SUCCESS;
    }
    id_at_t *order = (id_at_t *)nn_carve_floats(&c, 2 * n);
    float *acc = nn_carve_floats(&c, dim);
    for (int64_t i = 0; i < n; i++)
        order[i] = (id_at_t){ids[i], (int32_t)i};
    qsort(order, (size_t)n, sizeof(*order), by_id_then_position);
    for (int64_t i = 0; i < n;) {
        int32_t id = order[i].id;
        memset(acc, 0, sizeof(float) * (size_t)dim);
        for (; i < n && order[i].id == id; i++) {
            const float *d = dy + (int64_t)order[i].at * dim;
            for (int64_t j = 0; j < dim; j++)
                acc[j] += d[j];
        }
        nn_add_into(dweight, (int64_t)id * dim, acc, dim);
    }
    return FSDP2_SUCCESS;
}
