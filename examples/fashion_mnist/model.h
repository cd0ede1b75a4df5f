/* The example's models as libfsdp2 module trees: `mlp` (784-512-256-10, ReLU) and `cnn`
 * (PyTorch's FSDP MNIST tutorial network). Each layer with parameters is a module of the
 * root ("fc1", "conv1", ...), with parameters "weight" and "bias" declared on meta and
 * initialised after sharding with PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
 * from a seed, the same values at every world size. */
#ifndef FMNIST_MODEL_H
#define FMNIST_MODEL_H

#include <stdint.h>

#include <fsdp2/fsdp2.h>
#include <fsdp2/nn.h>

#define FM_MAX_LAYERS 4

typedef enum fm_kind { FM_MLP = 0, FM_CNN = 1 } fm_kind_t;

typedef struct fm_layer {
    char name[16];
    int conv; /* else linear */
    int in, out;       /* linear: features; conv: channels */
    int h, w, k;       /* conv: input height, width; kernel */
    fsdp2_module_t *module;
    fsdp2_param_t *weight, *bias;
} fm_layer_t;

typedef struct fm_model {
    fm_kind_t kind;
    int max_batch;
    fsdp2_module_t *root;
    fm_layer_t layers[FM_MAX_LAYERS];
    int nlayers;
    uint64_t seed;         /* parameters: the same on every rank */
    uint64_t dropout_seed; /* per rank: its samples get their own masks */
    uint64_t dropout_calls;
    /* Activations a[] and the gradients of the layers' outputs d[] and inputs g[] (the
     * layers add into gradients: g[] are zeroed per step), sized for max_batch. */
    float *a[8], *d[8], *g[8];
    int32_t *pool_arg;
    fsdp2_nn_workspace_t ws; /* the largest any layer needs */
    uint64_t dropout_key[2]; /* this step's dropout seeds, for the backward */
} fm_model_t;

/* Builds the tree (not sharded yet). */
fsdp2_status_t fm_model_create(fm_kind_t kind, int max_batch, uint64_t seed, fm_model_t **out);
void fm_model_destroy(fm_model_t *m);

/* fully_shard over mesh (1D, or 2D [replicate, shard]: HSDP): each layer its own unit
 * (wrap_min_params 0), or the layers the size-based policy picks; the root last; then
 * the seeded init. param_dtype FSDP2_BF16 gathers and computes in bf16 (mixed
 * precision, gradients summed in f32); reshard_after_forward is the option's 0, 1 or N. */
fsdp2_status_t fm_model_shard(fm_model_t *m, fsdp2_mesh_t *mesh, int64_t wrap_min_params,
                              fsdp2_dtype_t param_dtype, int reshard_after_forward);

/* Makes the GEMM primitives of a training step of batch samples now, before the first
 * (fsdp2_nn_*_prepare): after fsdp2_nn_set_threads, with the unsharded parameters' dtype. */
fsdp2_status_t fm_model_prepare(const fm_model_t *m, int batch, fsdp2_dtype_t param_dtype);

/* One forward and backward over x (batch samples, normalised) with labels: gradients
 * end up (averaged over the mesh) in the sharded gradients. Returns the mean loss in
 * *loss and the number of correct predictions in *correct. train enables dropout. */
fsdp2_status_t fm_model_forward_backward(fm_model_t *m, const float *x, const int *labels,
                                         int batch, double *loss, int *correct);
/* Forward only (no dropout): the summed loss and the correct count of the batch. */
fsdp2_status_t fm_model_evaluate(fm_model_t *m, const float *x, const int *labels, int batch,
                                 double *loss_sum, int *correct);

/* Parameter elements of the whole model. */
int64_t fm_model_numel(const fm_model_t *m);

#endif
