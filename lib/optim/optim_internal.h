/* What optimizer.c hands the update rules (update_rules.c) for each shard: the step's
 * coefficients, computed once per step in double, and the shard's raw pointers. */
#ifndef FSDP2_OPTIM_INTERNAL_H
#define FSDP2_OPTIM_INTERNAL_H

#include <stdint.h>

#include <fsdp2/optim.h>

/* Most state tensors any rule keeps per parameter (AdamW's and Adadelta's two). */
#define OPTIM_MAX_STATE 2

typedef struct optim_coeffs {
    fsdp2_optimizer_kind_t kind;
    double lr;
    double weight_decay;
    double momentum, dampening; /* SGD */
    int nesterov;               /* SGD */
    int first_step;             /* SGD: the momentum buffer starts as the gradient */
    double beta1, beta2;        /* AdamW */
    double bias_correction1;    /* AdamW: 1 - beta1^t */
    double bias_correction2;    /* AdamW: 1 - beta2^t */
    double eps;                 /* AdamW, Adadelta */
    double rho;                 /* Adadelta */
} optim_coeffs_t;

/* One parameter's local shard: numel elements of the shard's dtype in each buffer.
 * The buffers are distinct allocations (parameter shard, gradient shard, state), so the
 * rules may treat them as restrict. */
typedef struct optim_shard {
    int64_t numel;
    void *param;
    const void *grad;
    void *state[OPTIM_MAX_STATE];
} optim_shard_t;

/* Checks that dt (a parameter's shard or its gradient's) is one lib/optim works on: on
 * the cpu (or on a cuda device, where allow_cuda says so), f32 or f64; errors name
 * `what` ("optimizer", "clip_grad_norm") and the FQN. */
fsdp2_status_t optim_check_shard(const char *what, const char *fqn, const fsdp2_dtensor_t *dt,
                                 int allow_cuda, fsdp2_dtensor_info_t *info);

/* The state tensors the rule of options o keeps per parameter (SGD without momentum:
 * none), after taking o (any size an earlier header had) and checking it as
 * fsdp2_optimizer_create does. */
fsdp2_status_t optim_state_count(const fsdp2_optimizer_options_t *o, size_t *count);

/* Updates one shard in place by the rule c->kind names: one pass, on the calling
 * thread. */
void optim_update_f32(const optim_coeffs_t *c, const optim_shard_t *s);
void optim_update_f64(const optim_coeffs_t *c, const optim_shard_t *s);

#endif
