/* docs/nn.md's C blocks, extracted by doc_snippets.sh at build time and included here as
 * they stand: a change to the API that the doc does not follow fails the build of this
 * test. It also proves that <fsdp2/fsdp2.h> alone declares the layers. */
#include "nn_doc_snippets.h"

#ifndef FSDP2_NN_H
#error "<fsdp2/fsdp2.h> does not include <fsdp2/nn.h> in a build with -Dnn=true"
#endif

#include <stdio.h>

int main(void)
{
    /* the doc's functions exist with the types the doc gives them */
    fsdp2_status_t (*forward)(fc_t *, const float *, int64_t, float *, fsdp2_nn_workspace_t *) =
        fc_forward;
    fsdp2_status_t (*backward)(fc_t *, const float *, const float *, int64_t, float *,
                               fsdp2_nn_workspace_t *) = fc_backward;
    nn_doc_workspace();
    /* the doc's workspace block sizes the three layers: their largest query */
    size_t lin, lin2, ln, all;
    fsdp2_nn_linear_workspace_bytes(784, 256, &lin);
    fsdp2_nn_linear_workspace_bytes(256, 10, &lin2);
    fsdp2_nn_layernorm_workspace_bytes(256, &ln);
    fsdp2_nn_layer_shape_t layers[] = {
        {FSDP2_NN_LINEAR, {784, 256}}, {FSDP2_NN_LINEAR, {256, 10}}, {FSDP2_NN_LAYERNORM, {256}}};
    if (fsdp2_nn_workspace_bytes(layers, 3, &all) != FSDP2_SUCCESS) {
        printf("fsdp2_nn_workspace_bytes failed: %s\n", fsdp2_last_error());
        return 1;
    }
    size_t most = lin > lin2 ? lin : lin2;
    most = ln > most ? ln : most;
    printf("workspace %zu bytes, the largest query %zu\n", all, most);
    return (forward && backward && all == most) ? 0 : 1;
}
