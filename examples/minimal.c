/* Fits W so that W x = (0, 1, ..., 7) with FSDP over any number of ranks:
 *   cc minimal.c $(pkg-config --cflags --libs fsdp2) -o minimal
 *   ./minimal                              (one rank)
 *   fsdp2run --nproc-per-node 2 ./minimal  (each rank holds 4 of the 8 rows) */
#include <stdio.h>

#include <fsdp2/fsdp2.h>

#define CHECK(call)                                                  \
    do {                                                             \
        if ((call) != FSDP2_SUCCESS) {                               \
            fprintf(stderr, "%s: %s\n", #call, fsdp2_last_error());  \
            return 1;                                                \
        }                                                            \
    } while (0)

enum { OUT = 8, IN = 4 };

int main(void)
{
    fsdp2_context_t *ctx;
    fsdp2_module_t *model;
    fsdp2_tensor_t *init, *w_full, *w_grad;
    fsdp2_param_t *w;
    fsdp2_optimizer_t *opt;
    CHECK(fsdp2_init(NULL, &ctx)); /* from fsdp2run's (or torchrun's, Slurm's) variables */
    CHECK(fsdp2_module_create("", &model));
    CHECK(fsdp2_tensor_zeros((fsdp2_device_t)FSDP2_DEVICE_CPU_INIT, FSDP2_F32, 2,
                             (int64_t[]){OUT, IN}, &init));
    CHECK(fsdp2_module_add_param(model, "weight", init, 1, &w));
    CHECK(fsdp2_tensor_release(init));
    fsdp2_shard_options_t shard = FSDP2_SHARD_OPTIONS_INIT;
    CHECK(fsdp2_fully_shard(model, &shard)); /* this rank keeps its rows of W */
    fsdp2_optimizer_options_t sgd = FSDP2_SGD_OPTIONS_INIT(0.5);
    CHECK(fsdp2_optimizer_create(model, &sgd, &opt));
    const float x[IN] = {0.5f, 0.5f, 0.5f, 0.5f};
    for (int step = 0; step < 30; step++) {
        float err[OUT], loss = 0.0f;
        CHECK(fsdp2_pre_forward(model)); /* all-gathers W */
        CHECK(fsdp2_param_unsharded(w, &w_full));
        const float *W = w_full->data;
        for (int i = 0; i < OUT; i++) {
            err[i] = -(float)i;
            for (int j = 0; j < IN; j++)
                err[i] += W[i * IN + j] * x[j];
            loss += 0.5f * err[i] * err[i];
        }
        CHECK(fsdp2_post_forward(model));
        CHECK(fsdp2_pre_backward(model));
        CHECK(fsdp2_param_grad(w, &w_grad)); /* zeroed: add into it */
        float *dW = w_grad->data;
        for (int i = 0; i < OUT; i++)
            for (int j = 0; j < IN; j++)
                dW[i * IN + j] += err[i] * x[j];
        CHECK(fsdp2_post_backward(model));   /* reduce-scatters dW */
        CHECK(fsdp2_backward_finish(model)); /* this rank's rows of dW are ready */
        CHECK(fsdp2_optimizer_step(opt));
        CHECK(fsdp2_optimizer_zero_grad(opt));
        if (step % 5 == 0 || step == 29)
            printf("step %2d  loss %.9f\n", step, loss);
    }
    CHECK(fsdp2_optimizer_destroy(opt));
    CHECK(fsdp2_module_destroy(model));
    return fsdp2_finalize(ctx) == FSDP2_SUCCESS ? 0 : 1;
}
