/* Optimizers on shards: every rank updates its local shard of every parameter, with its
 * state (momentum, exp_avg, ...) held as Shard(0) DTensors of the same layout, so nothing
 * is communicated except by gradient clipping. The update rules are torch.optim's
 * (SGD, AdamW, Adadelta), step for step.
 *
 * An optimizer is made over the parameters of a sharded module tree that require
 * gradients; its state is allocated once, zeroed, at creation. A step is one pass over
 * each shard after fsdp2_backward_finish, and allocates nothing: on the calling thread
 * for cpu shards; for cuda shards one multi-tensor launch per dtype on the device's
 * current stream (asynchronous, the same bits as on the cpu), whose shard and chunk
 * tables are uploaded at creation (a few bytes per 64 Ki elements). f32 and f64 shards,
 * all on one device. */
#ifndef FSDP2_OPTIM_H
#define FSDP2_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/dtensor.h>
#include <fsdp2/export.h>
#include <fsdp2/module.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

typedef enum fsdp2_optimizer_kind {
    FSDP2_OPTIMIZER_SGD = 0,
    FSDP2_OPTIMIZER_ADAMW = 1,
    FSDP2_OPTIMIZER_ADADELTA = 2,
} fsdp2_optimizer_kind_t;

typedef struct fsdp2_optimizer_options {
    unsigned size; /* sizeof(fsdp2_optimizer_options_t) */
    fsdp2_optimizer_kind_t kind;
    double lr;
    double weight_decay; /* SGD, Adadelta: added to the gradient (L2); AdamW: decoupled */
    /* SGD */
    double momentum;
    double dampening;
    int nesterov;
    /* AdamW */
    double beta1, beta2;
    /* AdamW and Adadelta */
    double eps;
    /* Adadelta */
    double rho;
} fsdp2_optimizer_options_t;

/* torch.optim's defaults. fsdp2_optimizer_create checks the fields the kind uses as
 * torch.optim's constructors do (lr >= 0, weight_decay >= 0; SGD: momentum >= 0, nesterov
 * only with momentum > 0 and dampening 0; AdamW: betas in [0, 1); Adadelta: rho in
 * [0, 1]), and eps > 0 where torch allows 0 (which divides 0 by 0 on a zero gradient);
 * FSDP2_ERR_INVALID_ARGUMENT names the value. */
#define FSDP2_SGD_OPTIONS_INIT(lr) \
    {sizeof(fsdp2_optimizer_options_t), FSDP2_OPTIMIZER_SGD, (lr), 0.0, 0.0, 0.0, 0, 0.9, 0.999, 1e-8, 0.9}
#define FSDP2_ADAMW_OPTIONS_INIT(lr) \
    {sizeof(fsdp2_optimizer_options_t), FSDP2_OPTIMIZER_ADAMW, (lr), 0.01, 0.0, 0.0, 0, 0.9, 0.999, 1e-8, 0.9}
#define FSDP2_ADADELTA_OPTIONS_INIT(lr) \
    {sizeof(fsdp2_optimizer_options_t), FSDP2_OPTIMIZER_ADADELTA, (lr), 0.0, 0.0, 0.0, 0, 0.9, 0.999, 1e-6, 0.9}

typedef struct fsdp2_optimizer fsdp2_optimizer_t;

/* An optimizer over every sharded parameter under root that requires gradients (in
 * fsdp2_module_params order; frozen and ignored parameters are skipped). Allocates and
 * zeroes its state. Not collective. It keeps handles on the shards and uses root for
 * zero_grad: destroy it before the tree. */
FSDP2_API fsdp2_status_t fsdp2_optimizer_create(fsdp2_module_t *root,
                                                const fsdp2_optimizer_options_t *options,
                                                fsdp2_optimizer_t **out);
/* NULL ignored. */
FSDP2_API fsdp2_status_t fsdp2_optimizer_destroy(fsdp2_optimizer_t *opt);

/* One update of every local shard from its sharded gradient. Blocking, not collective;
 * call it after fsdp2_backward_finish. SGD's momentum buffer starts as the gradient on
 * the step taken with steps == 0 (torch's "buffer is None"). */
FSDP2_API fsdp2_status_t fsdp2_optimizer_step(fsdp2_optimizer_t *opt);
/* Zeroes the sharded gradients (fsdp2_module_zero_grad of the root). */
FSDP2_API fsdp2_status_t fsdp2_optimizer_zero_grad(fsdp2_optimizer_t *opt);

FSDP2_API fsdp2_status_t fsdp2_optimizer_set_lr(fsdp2_optimizer_t *opt, double lr);
FSDP2_API fsdp2_status_t fsdp2_optimizer_lr(const fsdp2_optimizer_t *opt, double *lr);
/* Steps taken so far (AdamW's bias correction uses it). */
FSDP2_API fsdp2_status_t fsdp2_optimizer_steps(const fsdp2_optimizer_t *opt, int64_t *steps);
FSDP2_API fsdp2_status_t fsdp2_optimizer_set_steps(fsdp2_optimizer_t *opt, int64_t steps);

/* The state DTensor called name ("momentum_buffer" for SGD with momentum != 0 (without
 * it SGD keeps no state), "exp_avg" / "exp_avg_sq" for AdamW, "square_avg" / "acc_delta"
 * for Adadelta, as torch.optim names them) of param: borrowed, Shard(0) like the
 * parameter, on its mesh; FSDP2_ERR_NOT_FOUND naming both when there is none. For
 * checkpoints. */
FSDP2_API fsdp2_status_t fsdp2_optimizer_state(const fsdp2_optimizer_t *opt,
                                               const fsdp2_param_t *param, const char *name,
                                               fsdp2_dtensor_t **state);
/* Bytes of optimizer state this rank holds (its shards of every state tensor, allocated
 * at creation) in *bytes. */
FSDP2_API fsdp2_status_t fsdp2_optimizer_state_bytes(const fsdp2_optimizer_t *opt,
                                                     uint64_t *bytes);
/* The names of the state this optimizer keeps per parameter: *count of them, the first
 * min(count, capacity) in names (static strings). */
FSDP2_API fsdp2_status_t fsdp2_optimizer_state_names(const fsdp2_optimizer_t *opt,
                                                     const char **names, size_t capacity,
                                                     size_t *count);

/* Hyperparameters of a parameter group (PyTorch's param_groups): the parameters a
 * group picks train with its weight decay and with the optimizer's lr times lr_scale
 * (so fsdp2_optimizer_set_lr and a schedule drive every group). Parameters no group
 * picks keep the options' weight decay and lr. */
typedef struct fsdp2_param_group {
    unsigned size; /* sizeof(fsdp2_param_group_t) */
    double weight_decay; /* >= 0, as the options' field for the optimizer's kind */
    double lr_scale;     /* >= 0 */
} fsdp2_param_group_t;

#define FSDP2_PARAM_GROUP_INIT {sizeof(fsdp2_param_group_t), 0.0, 1.0}

/* Whether a parameter belongs to a group: by its name, shape or dtype (for GPT-2, decay
 * on matrices only: info->ndim == 2). */
typedef int (*fsdp2_param_select_fn)(const fsdp2_param_info_t *info, void *user);

/* Gives every trained parameter that select picks the group's hyperparameters; a later
 * call overrides an earlier one for the parameters both pick. *count (may be NULL) gets
 * how many it picked. Local (not collective), does not block; call it between steps,
 * with the same groups on every rank. Shards on cuda take only the options'
 * hyperparameters: a group there is refused (FSDP2_ERR_UNSUPPORTED). The groups are not
 * part of a checkpoint: an application sets them again after a resume, as with torch. */
FSDP2_API fsdp2_status_t fsdp2_optimizer_add_param_group(fsdp2_optimizer_t *opt,
                                                         const fsdp2_param_group_t *group,
                                                         fsdp2_param_select_fn select,
                                                         void *user, size_t *count);

/* Learning-rate schedules: the rate at a step (or epoch) from the base rate. Pure. */
typedef enum fsdp2_lr_schedule_kind {
    FSDP2_LR_CONSTANT = 0,
    FSDP2_LR_STEP = 1,   /* torch StepLR: base * gamma^(floor(t / step_size)) */
    FSDP2_LR_COSINE = 2, /* linear warmup from 0 over warmup steps, then cosine down to
                            min_lr at total steps (and min_lr after):
                            t < warmup:          base * t / warmup
                            warmup <= t < total: min_lr + (base - min_lr) * 0.5 *
                                 (1 + cos(pi * (t - warmup) / (total - warmup)))
                            t >= total:          min_lr */
} fsdp2_lr_schedule_kind_t;

/* A learning-rate schedule (input, and output of fsdp2_optimizer_lr_schedule; saved in
 * checkpoints by field, not as bytes).
 * This struct has no size field: its layout is fixed for the ABI (version 0 of
 * libfsdp2.so); more fields would come as a new struct and function, never by growing it. */
typedef struct fsdp2_lr_schedule {
    fsdp2_lr_schedule_kind_t kind;
    int64_t step_size; /* STEP: >= 1 */
    double gamma;      /* STEP: >= 0 */
    int64_t warmup;    /* COSINE: >= 0 */
    int64_t total;     /* COSINE: >= warmup */
    double min_lr;     /* COSINE: >= 0 */
} fsdp2_lr_schedule_t;

/* base_lr >= 0 and t >= 0; a field out of range is FSDP2_ERR_INVALID_ARGUMENT naming
 * it. */

FSDP2_API fsdp2_status_t fsdp2_lr_at(const fsdp2_lr_schedule_t *schedule, double base_lr,
                                     int64_t t, double *lr);

/* Drives the optimizer's lr from a schedule: before each step the lr becomes
 * fsdp2_lr_at(schedule, base_lr, t) with t = the steps taken so far + 1 (steps count from
 * 1, so a warmup never spends a step at lr 0), overriding fsdp2_optimizer_set_lr. The
 * schedule and base_lr go into checkpoints with the step count, and fsdp2_checkpoint_load
 * puts them back: a resumed run continues the schedule where it stopped, at any world
 * size. NULL turns it off (the lr then stays where the schedule left it). Local, not
 * collective: call it on every rank alike. */
FSDP2_API fsdp2_status_t fsdp2_optimizer_set_lr_schedule(fsdp2_optimizer_t *opt,
                                                         const fsdp2_lr_schedule_t *schedule,
                                                         double base_lr);
/* The schedule in use: *on = 0 when none (schedule and base_lr are then untouched). */
FSDP2_API fsdp2_status_t fsdp2_optimizer_lr_schedule(const fsdp2_optimizer_t *opt,
                                                     fsdp2_lr_schedule_t *schedule,
                                                     double *base_lr, int *on);

/* Clips the gradients of every sharded parameter under root that requires gradients:
 * the global norm over all of them on all ranks (norm_type 2.0, or INFINITY for the
 * max; others are FSDP2_ERR_INVALID_ARGUMENT), then, when max_norm / (norm + 1e-6) < 1,
 * every local gradient shard is scaled by that in place (torch.nn.utils.clip_grad_norm_).
 * Collective over the mesh (one all-reduce for the 2-norm, one all-gather of ws values
 * for INFINITY, on the calling thread's current stream); blocking. The parameters must
 * all live on one mesh (an error names two that do not); with none, the norm is 0 and
 * nothing is communicated. On the cpu it allocates no device memory (only a few host
 * handles); on cuda the shares are reduced by kernels into a 64 KiB scratch of the
 * device, taken at the first call and kept for the process, and the gradients are
 * scaled with the cpu's arithmetic (only the order of the sum of squares differs).
 * *total_norm (may be NULL) gets the norm before clipping. */
FSDP2_API fsdp2_status_t fsdp2_clip_grad_norm(fsdp2_module_t *root, double max_norm,
                                              double norm_type, double *total_norm);

FSDP2_EXTERN_C_END

#endif
