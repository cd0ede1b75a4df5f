/* The model every fully_shard test trains, its one-process reference, and the driver
 * that runs it sharded over real processes (ranks.h).
 *
 * The model is a 3-layer MLP with uneven shapes (13 -> 7 -> 5 -> 3, tanh between), so
 * every way torch.chunk can split rows shows up: 7 rows over 4 ranks are 2,2,2,1, 5 are
 * 2,2,1,0 and fc3's 3 rows leave rank 3 with nothing. The loss is
 * 0.5 * mean over samples of sum (out - target)^2. The tree is root "" -> {fc1, fc2, fc3},
 * each with "weight" and "bias"; or, nested, root -> {block -> {fc1, fc2}, fc3}.
 *
 * The reference is plain SGD on one process over the whole batch, written with C arrays
 * (no library call). Each rank trains on its own 24 / ws samples of the same 24-sample
 * batch: the mean of the ranks' gradients is then the gradient of the whole batch, so the
 * sharded run must match the reference for every ws. (Giving every rank the same samples
 * would make a missing reduce-scatter invisible: the average of equal gradients is any
 * one of them.) Values are compared through fsdp2_dtensor_full_tensor with a relative
 * tolerance of 1e-5 (relative to max(|ref|, 1e-3)); initialisation is compared bitwise.
 *
 * Each rank body returns its number of failures and prints what failed; a rank that
 * fails leaves the others to fail by the group timeout (20 s) instead of hanging. */
#ifndef FSDP2_TESTS_MLP_MODEL_H
#define FSDP2_TESTS_MLP_MODEL_H

#include <stdint.h>

#include <fsdp2/fsdp.h>

#include "../collectives/ranks.h"

#define LAYERS 3
#define MAX_IN 13
#define MAX_OUT 7
#define SAMPLES 24 /* divisible by 1..4, and by 2 * ws for the micro-batches */
#define STEPS 5
#define LR 0.1f
#define TOLERANCE 1e-5
#define GROUP_TIMEOUT_MS 20000
#define DEADLINE_S 120

extern const int DIM[LAYERS + 1];
extern const char *const LAYER_NAME[LAYERS];
extern const fsdp2_device_t CPU;
extern const fsdp2_device_t META;

/* A library call that must succeed: `fails += OK(c, call)` prints it otherwise. */
int check_ok(const rank_ctx_t *c, fsdp2_status_t s, const char *expr, const char *file, int line);
#define OK(c, call) check_ok((c), (call), #call, __FILE__, __LINE__)

/* call must fail with `want` (0: any error) and fsdp2_last_error() must name `needle`. */
int check_refused(const rank_ctx_t *c, fsdp2_status_t s, fsdp2_status_t want, const char *needle,
                  const char *expr, const char *file, int line);
#define REFUSED(c, call, want, needle) \
    check_refused((c), (call), (want), (needle), #call, __FILE__, __LINE__)

/* ---------------------------------------------------------------------------------- */
/* The model and its data, as formulas, and the math in plain C                        */

float weight_init(int layer, int64_t flat);
float bias_init(int layer, int64_t row);
/* torch.chunk's rows for piece r of ws, written out independently of the library. */
void chunk_rows(int64_t n, int ws, int r, int64_t *off, int64_t *len);
/* The seeded init build_options.random_init gives layer l's weight (kind 0) or bias. */
fsdp2_random_init_t random_init_of(int l, int kind);

typedef struct work {
    double act[LAYERS + 1][SAMPLES * MAX_IN]; /* act[l]: input of layer l; act[3]: output */
    double delta[SAMPLES * MAX_IN], dx[SAMPLES * MAX_IN];
    double dW[MAX_OUT * MAX_IN], db[MAX_OUT];
} work_t;

typedef struct ref_model {
    float w[LAYERS][MAX_OUT * MAX_IN], b[LAYERS][MAX_OUT];
    double gw[LAYERS][MAX_OUT * MAX_IN], gb[LAYERS][MAX_OUT];
    int frozen_bias[LAYERS]; /* never trained: no gradient, no update */
} ref_model_t;

void ref_init(ref_model_t *ref);
/* Adds the gradient of 0.5 * mean over `samples` into ref's gradients. */
void ref_accumulate(ref_model_t *ref, work_t *w, const int *samples, int n);
/* The gradients as the library stores them (f32), then w -= lr * g; zeroes them. */
void ref_sgd(ref_model_t *ref);

/* ---------------------------------------------------------------------------------- */
/* The sharded run                                                                     */

typedef enum probe_point {
    PROBE_STEP_START,      /* before fsdp2_pre_forward(root) */
    PROBE_PRE_FORWARD,     /* after fsdp2_pre_forward(fc[layer]) */
    PROBE_POST_FORWARD,    /* after fsdp2_post_forward(fc[layer]) */
    PROBE_BACKWARD_START,  /* before fsdp2_pre_backward(root) */
    PROBE_PRE_BACKWARD,    /* after fsdp2_pre_backward(fc[layer]) */
    PROBE_POST_BACKWARD,   /* after fsdp2_post_backward(fc[layer]) */
    PROBE_BACKWARD_END,    /* after fsdp2_post_backward(root), before backward_finish */
    PROBE_FINISHED,        /* after fsdp2_backward_finish(root) */
    PROBE_OPTIMIZED,       /* after the optimizer and zero_grad, before the comparison */
    PROBE_STEP_END,        /* after the comparison */
} probe_point_t;

typedef enum shard_plan {
    SHARD_EACH_LAYER = 0, /* fully_shard fc1, fc2, fc3 (block), then the root */
    SHARD_BY_CALLER = 1,  /* nothing: the test shards, then calls run_bind_hooks */
} shard_plan_t;

typedef struct build_options {
    int meta;                  /* declare on meta instead of cpu */
    int frozen_fc2_bias;       /* fc2.bias declared with requires_grad = 0 */
    int ignore_fc2_bias;       /* fc2.bias in the options' ignored_params */
    int nested;                /* root -> {block -> {fc1, fc2}, fc3} */
    int reshard_after_forward; /* the options' field */
    int unsharded_buffers;     /* the options' field */
    int random_init;           /* fsdp2_param_set_random_init on every parameter */
    shard_plan_t shard;
} build_options_t;

#define BUILD_DEFAULT {.reshard_after_forward = 1, .unsharded_buffers = 2}

typedef struct run run_t;
typedef int (*probe_fn)(run_t *r, probe_point_t at, int layer);

struct run {
    rank_ctx_t *c;
    fsdp2_mesh_t *mesh;
    fsdp2_shard_options_t opts;
    fsdp2_module_t *root;
    fsdp2_module_t *block; /* nested tree only */
    fsdp2_module_t *fc[LAYERS];
    fsdp2_param_t *p[LAYERS][2]; /* [l][0] weight, [l][1] bias */
    /* Whose hooks wrap layer l: fc[l] when it is a group, NULL when its parameters
     * belong to an enclosing group (whole between that group's hooks). */
    fsdp2_module_t *hook[LAYERS];
    fsdp2_module_t *block_hook;  /* block when it is a group: its hooks wrap fc1 and fc2 */
    int frozen_bias[LAYERS];     /* the run adds no gradient to it and never updates it */
    int ignored[LAYERS][2];      /* in ignored_params: compared through param_unsharded */
    fsdp2_param_t *ignored_list[1];
    const void *declared_data[LAYERS][2]; /* where the declared values were (cpu) */
    uint64_t declared_bytes;     /* cpu bytes of the declared values */
    uint64_t allocated_before_shard, allocated_after_shard;
    int step, micro;
    int grads_start_at_zero; /* 0 while a no-sync accumulator holds earlier micro-batches */
    probe_fn probe;
    uint64_t saved[LAYERS]; /* probe scratch */
    uint64_t planned_allocated;
    /* fsdp2_module_run instead of the pre/post hooks; inject[phase][layer]: the layer's
     * fn returns a library error (its message in fn_message) after doing its work. */
    int use_module_run;
    int inject[2][LAYERS];
    char fn_message[512];
    work_t work;
};

uint64_t cpu_allocated(run_t *r, uint64_t *peak);
fsdp2_module_state_t state_of(run_t *r, const fsdp2_module_t *m);
/* Plans the root's buffers (fsdp2_memory_plan) into *plan, checks that planning
 * allocated exactly the plan's non-shard bytes, and keeps the allocation in
 * r->planned_allocated for probe_memory. */
int plan_memory(run_t *r, fsdp2_memory_plan_t *plan);
/* For probes: the allocator's peak is reset when a step starts, and at backward_finish
 * the peak and live bytes must both be r->planned_allocated (nothing allocated in the
 * step beyond the plan; the comparisons after it allocate tensors of their own). */
int probe_memory(run_t *r, probe_point_t at);
const char *unshard_state_name(fsdp2_unshard_state_t s);
const char *training_state_name(fsdp2_training_state_t s);

/* This rank's samples of micro-batch `micro` of `micros`, and the same over every rank
 * (what the reference trains on). */
void local_samples(const run_t *r, int micro, int micros, int *samples, int *n);
void global_samples(int ws, int micro, int micros, int *samples, int *n);

int run_open(rank_ctx_t *c, run_t *r);
/* The same on a 2D [replicas, ws / replicas] mesh ("replicate", "shard"). */
int run_open_2d(rank_ctx_t *c, run_t *r, int replicas);
int run_close(run_t *r);
/* Declares the tree and, unless bo->shard says otherwise, shards it (run_bind_hooks). */
int build_model(run_t *r, const build_options_t *bo);
/* Finds which modules are groups after the test sharded the tree itself. */
int run_bind_hooks(run_t *r);

/* The layer's whole parameter (as fsdp2_param_unsharded gives it), shape-checked. */
int unsharded_view(run_t *r, int l, int kind, float **data);
int run_forward(run_t *r, const int *samples, int n);
int run_backward(run_t *r, const int *samples, int n);
/* Plain SGD on the local shards, then zero_grad. */
int run_sgd(run_t *r);
/* One micro-batch (forward and backward) on the sharded model, and the same samples'
 * gradients added into the reference. */
int run_micro_batch(run_t *r, ref_model_t *ref, work_t *refwork, int micro, int micros);

int compare_values(run_t *r, const char *what, const float *got, const float *want, int64_t n,
                   double tolerance);
/* Gathers a parameter (or its sharded gradient) whole and compares it with want. */
int compare_full(run_t *r, int l, int kind, int grad, const float *want, double tolerance);
int compare_params(run_t *r, const ref_model_t *ref);
int compare_grads(run_t *r, const ref_model_t *ref);

/* `steps` full-batch steps on the sharded model and on the reference, compared after
 * each (gradients too when check_grads). */
int run_train(run_t *r, ref_model_t *ref, int first_step, int steps, int check_grads);

/* Runs body on ws ranks and fails the Check test if any rank fails or hangs. */
void run_case(int ws, rank_fn body, const char *what);

#endif
