/* The workspace of a whole model: the largest of its layers' queries. */
#include <stdio.h>

#include "nn_common.h"

static fsdp2_status_t layer_bytes(const fsdp2_nn_layer_shape_t *l, size_t *bytes)
{
    const int64_t *d = l->dims;
    switch (l->kind) {
    case FSDP2_NN_LINEAR:
        return fsdp2_nn_linear_workspace_bytes(d[0], d[1], bytes);
    case FSDP2_NN_LORA:
        return fsdp2_nn_lora_workspace_bytes(d[0], d[1], d[2], bytes);
    case FSDP2_NN_EMBEDDING:
        return fsdp2_nn_embedding_workspace_bytes(d[0], d[1], d[2], bytes);
    case FSDP2_NN_LAYERNORM:
        return fsdp2_nn_layernorm_workspace_bytes(d[0], bytes);
    case FSDP2_NN_RMSNORM:
        return fsdp2_nn_rmsnorm_workspace_bytes(d[0], bytes);
    case FSDP2_NN_CONV2D:
        return fsdp2_nn_conv2d_workspace_bytes(d[0], d[1], d[2], d[3], d[4], bytes);
    case FSDP2_NN_ATTENTION:
        return fsdp2_nn_attention_workspace_bytes(d[0], bytes);
    }
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "layer kind %d is not a fsdp2_nn_layer_kind_t",
                       (int)l->kind);
}

fsdp2_status_t fsdp2_nn_workspace_bytes(const fsdp2_nn_layer_shape_t *layers, size_t count,
                                        size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_ARG_CHECK(layers || count == 0, "layers is NULL");
    size_t most = 0;
    for (size_t i = 0; i < count; i++) {
        size_t b = 0;
        fsdp2_status_t s = layer_bytes(&layers[i], &b);
        if (s != FSDP2_SUCCESS) {
            char why[256]; /* the message buffer is rewritten by fsdp2_error */
            snprintf(why, sizeof(why), "%s", fsdp2_last_error());
            return fsdp2_error(s, "layer %zu of %zu: %s", i, count, why);
        }
        most = b > most ? b : most;
    }
    *bytes = most;
    return FSDP2_SUCCESS;
}
