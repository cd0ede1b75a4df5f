/* fully_shard: FSDP2 over the application's module tree.
 *
 * fsdp2_fully_shard(m, &opts) makes m's parameters that no nested fully_shard owns into
 * one communication group: each becomes a DTensor Shard(0) over the mesh's shard dim
 * ([Replicate, Shard(0)] on a 2D [replicate, shard] mesh: HSDP, whose gradients are
 * reduce-scattered over the shard dim, then all-reduced over the replicate dim), and
 * this rank keeps only its chunk (torch.chunk rows, padded to the chunk size inside
 * one flat buffer per group). Call it on children before their parents; the outermost
 * sharded module is the root.
 *
 * The step. Around each sharded module's forward the application calls
 * fsdp2_pre_forward / fsdp2_post_forward, and around its backward fsdp2_pre_backward /
 * fsdp2_post_backward (or fsdp2_module_run). Between pre and post the module's parameters
 * are whole (fsdp2_param_unsharded); in backward the application adds its gradients into
 * fsdp2_param_grad, zeroed by pre_backward (unless it holds gradients accumulated with
 * sync off and not yet reduced: then they add up). post_backward reduce-scatters them (average
 * over the shard ranks) and adds the result into the sharded gradients
 * (fsdp2_param_sharded_grad), which therefore accumulate across micro-batches until
 * fsdp2_module_zero_grad. fsdp2_backward_finish on the root waits for the outstanding
 * reduce-scatters: then the sharded gradients are ready for the optimizer.
 *
 * Streams. Communication runs on side streams the root owns: all-gathers on one (after
 * their mixed precision casts on a copy-in stream, at ws > 1), reduce-scatters on
 * another. The application computes on its current stream (on cpu:
 * the calling thread itself). Every hand-off is an event: pre_forward makes the current
 * stream wait for the module's all-gather; a released unsharded buffer is reused only
 * after an event recorded where its last reader ran; nothing synchronizes the CPU on the
 * hot path except the waits the current stream itself must do (on cpu, waiting is the
 * calling thread's).
 *
 * Prefetch. When module i's forward starts, the next module's all-gather is issued (the
 * order recorded in the previous forward; before any, the tree's order). In backward the
 * recorded forward order is reversed. fsdp2_set_modules_to_forward_prefetch /
 * _backward_prefetch replace the implicit choice for a module.
 *
 * Memory. The first hook (or fsdp2_memory_plan) on the root plans and allocates, once:
 * the sharded parameters and gradients (allocated by fully_shard), a ring of unsharded
 * parameter buffers (two by default; the root and modules with reshard_after_forward
 * off get their own; on one rank there is none: the shard is the whole parameter), a
 * ring of two unsharded gradient buffers, and reduce-scatter staging (with mixed
 * precision also the send buffers the shards are cast into). Nothing is allocated inside a step. fsdp2_set_requires_gradient_sync(m, 0)
 * adds (once) a persistent unsharded gradient buffer for m's groups, where gradients
 * accumulate without communication.
 *
 * Misuse (post without pre, backward before forward, fully_shard twice, a child sharded
 * after its parent, parameters used while sharded, a child's hooks outside its root's
 * forward or backward) is FSDP2_ERR_INVALID_STATE with a message naming the module. A
 * backward is open from the first pre_backward until fsdp2_backward_finish: until then
 * the root's next pre_forward, zero_grad, the optimizer's step and zero_grad and
 * gradient clipping are refused the same way (reduce-scatters may still be writing the
 * sharded gradients), naming fsdp2_backward_finish. */
#ifndef FSDP2_FSDP_H
#define FSDP2_FSDP_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/device.h>
#include <fsdp2/dtensor.h>
#include <fsdp2/export.h>
#include <fsdp2/mesh.h>
#include <fsdp2/module.h>
#include <fsdp2/random.h>
#include <fsdp2/status.h>
#include <fsdp2/stream.h>

FSDP2_EXTERN_C_BEGIN

/* Mixed precision (FSDP2's MixedPrecisionPolicy). The shards (and the optimizer) keep
 * the parameters' declared dtype; param_dtype is what the all-gather moves and the
 * application computes with (the cast happens on the way in, on the copy-in stream;
 * on one rank, where it is the whole parameters, on the all-gather stream),
 * and the gradients it writes are in it too; reduce_dtype is what the reduce-scatter sums
 * in, after which the result is added into the sharded gradients in their own dtype.
 * FSDP2_DTYPE_COUNT keeps the default: param_dtype = the parameters' dtype, reduce_dtype
 * = param_dtype. Floating dtypes only.
 *
 * At the module's boundary (the activations are the application's, so the library
 * names the dtypes and casts into tensors the application gives it, see
 * fsdp2_cast_forward_input): cast_forward_inputs (1, the default) makes the forward's
 * floating inputs param_dtype when param_dtype is set; output_dtype (COUNT: none) is
 * what its floating outputs are cast to, for a module whose neighbours compute in
 * another dtype. */
typedef struct fsdp2_mp_policy {
    fsdp2_dtype_t param_dtype;
    fsdp2_dtype_t reduce_dtype;
    fsdp2_dtype_t output_dtype;
    int cast_forward_inputs; /* 0 or 1 */
} fsdp2_mp_policy_t;

#define FSDP2_MP_POLICY_INIT {FSDP2_DTYPE_COUNT, FSDP2_DTYPE_COUNT, FSDP2_DTYPE_COUNT, 1}

/* CPU offload (FSDP2's CPUOffloadPolicy, ZeRO-Offload): offload_params 1 keeps the
 * sharded parameters and gradients in host memory (page-locked when pin_memory) and the
 * optimizer steps there. With a cpu device the shards are in host memory already: the
 * policy is accepted and changes nothing (fully_shard says so once per process, as a
 * warning in the log). With a
 * cuda device it is refused (FSDP2_ERR_UNSUPPORTED) in this version. */
typedef struct fsdp2_offload_policy {
    int offload_params; /* 0 or 1 */
    int pin_memory;     /* 0 or 1 */
} fsdp2_offload_policy_t;

#define FSDP2_OFFLOAD_POLICY_INIT {0, 1}

typedef struct fsdp2_shard_options {
    unsigned size;                      /* sizeof(fsdp2_shard_options_t) (and, once
                                           there are any, the sizes of earlier releases:
                                           the fields they lack then default) */
    fsdp2_mesh_t *mesh;                 /* 1D (FSDP) or 2D [replicate, shard] (HSDP);
                                           NULL: the world mesh of fsdp2_init */
    int reshard_after_forward;          /* 1: free unsharded parameters after forward;
                                           0: keep them whole until backward; N (a
                                           divisor of the shard dim's size): keep a
                                           1/N post-forward shard, see below */
    fsdp2_param_t *const *ignored_params; /* left unsharded and untouched */
    size_t num_ignored_params;
    fsdp2_device_t device;              /* where shards live: cpu */
    int unsharded_buffers;              /* the root's ring of unsharded buffers: >= 1 (2) */
    fsdp2_mp_policy_t mp;               /* mixed precision: none */
    fsdp2_offload_policy_t offload;     /* CPU offload: none */
} fsdp2_shard_options_t;

#define FSDP2_SHARD_OPTIONS_INIT                                                             \
    {sizeof(fsdp2_shard_options_t), NULL, 1, NULL, 0, FSDP2_DEVICE_CPU_INIT, 2,              \
     FSDP2_MP_POLICY_INIT, FSDP2_OFFLOAD_POLICY_INIT}

/* reshard_after_forward = N (FSDP2's int, ZeRO++'s hpZ): after forward, instead of
 * dropping the whole parameters, each rank keeps its chunk of an N-way split of them
 * (chunk c % N of the ranks c of the shard dim's block of N consecutive ranks,
 * fsdp2_mesh_block_group), so the backward's all-gather runs over those N ranks (one
 * node's, when a node's ranks are consecutive) rather than the whole shard dim. It costs
 * one post-forward shard per such group, held from its forward to its backward and
 * planned (fsdp2_memory_plan_t.post_forward_params); the block's group is created when
 * the root plans (collectively over the block). N equal to the shard size is 1. */

/* Shards m's parameters not owned by a nested fully_shard into one group (a group may
 * have no parameters of its own). Every rank calls it on the same tree (it communicates
 * nothing itself, but the groups' collectives pair up by order). Allocates this rank's
 * shards (zeroed) and copies the declared values' rows into them; blocking. The
 * parameters of one group share a dtype. */
FSDP2_API fsdp2_status_t fsdp2_fully_shard(fsdp2_module_t *m, const fsdp2_shard_options_t *options);

/* Selects modules for fsdp2_fully_shard_tree; return nonzero to shard m. */
typedef int (*fsdp2_shard_policy_fn)(const fsdp2_module_t *m, void *ctx);

/* Applies fully_shard over the tree under root, children before parents: to every
 * module that policy selects, or (policy NULL) whose parameters not yet owned by a
 * sharded descendant number at least min_params elements (FSDP1's size-based auto wrap);
 * min_params 0 with no policy selects every module with parameters. The root is always
 * sharded last. */
FSDP2_API fsdp2_status_t fsdp2_fully_shard_tree(fsdp2_module_t *root,
                                                const fsdp2_shard_options_t *options,
                                                fsdp2_shard_policy_fn policy, void *ctx,
                                                int64_t min_params);

/* Gives values to the meta parameters under m (after sharding): init(param, shard,
 * offset, ctx) gets each parameter's local shard and its global offset (rows of dim 0,
 * then 0 for the other dims); with init NULL, parameters with a seeded init
 * (fsdp2_param_set_random_init) get it and the others zeros. Not collective. */
typedef fsdp2_status_t (*fsdp2_param_init_fn)(fsdp2_param_t *param, fsdp2_tensor_t *shard,
                                              const int64_t *global_offset, void *ctx);
FSDP2_API fsdp2_status_t fsdp2_module_materialize(fsdp2_module_t *m, fsdp2_param_init_fn init,
                                                  void *ctx);
/* Seeded, sharding-invariant init for a parameter (see fsdp2/random.h), used by
 * fsdp2_module_materialize. */
FSDP2_API fsdp2_status_t fsdp2_param_set_random_init(fsdp2_param_t *p,
                                                     const fsdp2_random_init_t *init);

/* Mixed precision at m's forward boundary (FSDP2 casts the forward's arguments and
 * results; here the application asks). fsdp2_forward_input_dtype gives the dtype m's
 * forward takes an input of `dtype` in: m's param_dtype when m is sharded with
 * cast_forward_inputs and a param_dtype, the input is floating and of another dtype;
 * else `dtype` itself. fsdp2_forward_output_dtype likewise gives the dtype of a forward
 * output: m's output_dtype for a floating output, else `dtype`. A module fully_shard
 * was not called on casts nothing. */
FSDP2_API fsdp2_status_t fsdp2_forward_input_dtype(const fsdp2_module_t *m, fsdp2_dtype_t dtype,
                                                   fsdp2_dtype_t *input);
FSDP2_API fsdp2_status_t fsdp2_forward_output_dtype(const fsdp2_module_t *m, fsdp2_dtype_t dtype,
                                                    fsdp2_dtype_t *output);
/* Casts src into dst, whose dtype must be the one the query above gives for src's dtype
 * and whose shape and device must be src's (a mismatch is an error naming both): an
 * element-wise conversion (fsdp2/dtype.h: round to nearest even), or a copy when the
 * dtypes agree, enqueued on the current stream of their device. */
FSDP2_API fsdp2_status_t fsdp2_cast_forward_input(const fsdp2_module_t *m,
                                                  const fsdp2_tensor_t *src, fsdp2_tensor_t *dst);
FSDP2_API fsdp2_status_t fsdp2_cast_forward_output(const fsdp2_module_t *m,
                                                   const fsdp2_tensor_t *src, fsdp2_tensor_t *dst);

/* The hooks. Not collective by themselves, but each rank must drive the same modules in
 * the same order (the collectives inside are). */
FSDP2_API fsdp2_status_t fsdp2_pre_forward(fsdp2_module_t *m);
FSDP2_API fsdp2_status_t fsdp2_post_forward(fsdp2_module_t *m);
FSDP2_API fsdp2_status_t fsdp2_pre_backward(fsdp2_module_t *m);
FSDP2_API fsdp2_status_t fsdp2_post_backward(fsdp2_module_t *m);

typedef enum fsdp2_phase {
    FSDP2_PHASE_FORWARD = 0,
    FSDP2_PHASE_BACKWARD = 1,
} fsdp2_phase_t;
typedef fsdp2_status_t (*fsdp2_module_fn)(fsdp2_module_t *m, void *ctx);
/* pre hook, fn(m, ctx), post hook. fn's error is returned (after the post hook ran). */
FSDP2_API fsdp2_status_t fsdp2_module_run(fsdp2_module_t *m, fsdp2_phase_t phase,
                                          fsdp2_module_fn fn, void *ctx);

/* On the root, after the last post_backward of a step: the current stream waits for
 * every outstanding reduce-scatter and all-gather (not when fsdp2_set_is_last_backward
 * set 0 on the root: then the reductions may still run), every module still unsharded
 * is resharded unless its reshard_after_backward is off, and the next forward starts a
 * new step. */
FSDP2_API fsdp2_status_t fsdp2_backward_finish(fsdp2_module_t *root);

/* Zeroes the sharded gradients under m (on the current stream). Refused while the tree's
 * backward is open (before fsdp2_backward_finish). */
FSDP2_API fsdp2_status_t fsdp2_module_zero_grad(fsdp2_module_t *m);

/* Blocks until the root's side streams are idle; returns their first error. */
FSDP2_API fsdp2_status_t fsdp2_module_synchronize(fsdp2_module_t *root);

/* Parameter views (borrowed: owned by the library, valid as stated).
 * unsharded: between the module's pre and post hooks (or after fsdp2_unshard_wait),
 * the whole parameter; grad: between pre_backward and post_backward, the whole gradient
 * to add into; sharded / sharded_grad: always (after fully_shard), the DTensor Shard(0)
 * of the parameter and of its accumulated gradient (NULL grad for frozen parameters).
 * A parameter no group owns (ignored_params) is the tensor it was declared with, whole:
 * unsharded gives it at any time; it has no sharded views and no gradient buffer (the
 * application keeps its gradient and its update itself). */
FSDP2_API fsdp2_status_t fsdp2_param_unsharded(const fsdp2_param_t *p, fsdp2_tensor_t **t);
FSDP2_API fsdp2_status_t fsdp2_param_grad(const fsdp2_param_t *p, fsdp2_tensor_t **t);
FSDP2_API fsdp2_status_t fsdp2_param_sharded(const fsdp2_param_t *p, fsdp2_dtensor_t **dt);
FSDP2_API fsdp2_status_t fsdp2_param_sharded_grad(const fsdp2_param_t *p, fsdp2_dtensor_t **dt);

/* Controls, as in FSDP2. Each applies to m's group and the groups below it. Every rank
 * must set the same; they are refused while an affected module is between its hooks.
 * reshard_after_backward 0 keeps parameters whole after backward (and backward_finish),
 * so the next forward gathers nothing: for micro-batches of gradient accumulation. Only
 * as many stay whole as the unsharded buffers hold (a module whose buffer is taken
 * gathers again). The whole copies do not see an optimizer step: set it back to 1
 * before the last micro-batch's backward, or call fsdp2_reshard on the modules after
 * the step. */
FSDP2_API fsdp2_status_t fsdp2_set_requires_gradient_sync(fsdp2_module_t *m, int sync);
FSDP2_API fsdp2_status_t fsdp2_set_reshard_after_backward(fsdp2_module_t *m, int reshard);
/* Only m's own group (a no-op on the root, which always keeps its parameters through
 * forward); reshard takes what the option does (0, 1 or N). Between steps only; a new N
 * after planning re-plans m's post-forward shard (and creates the block's group,
 * collectively over the block). */
FSDP2_API fsdp2_status_t fsdp2_set_reshard_after_forward(fsdp2_module_t *m, int reshard);
/* Read on the root only (set it there). */
FSDP2_API fsdp2_status_t fsdp2_set_is_last_backward(fsdp2_module_t *m, int is_last);
/* m's own group only. The gradients are summed after dividing each rank's by factor
 * (instead of averaged:
 * FSDP2's set_reduce_scatter_divide_factor), so that f16 sums stay in range; factor 0
 * goes back to the average. On HSDP the replicate dim still averages. */
FSDP2_API fsdp2_status_t fsdp2_set_reduce_scatter_divide_factor(fsdp2_module_t *m, double factor);
FSDP2_API fsdp2_status_t fsdp2_set_modules_to_forward_prefetch(fsdp2_module_t *m,
                                                               fsdp2_module_t *const *modules,
                                                               size_t count);
FSDP2_API fsdp2_status_t fsdp2_set_modules_to_backward_prefetch(fsdp2_module_t *m,
                                                                fsdp2_module_t *const *modules,
                                                                size_t count);

/* Issues m's all-gather now (asynchronous; every rank must call it, the all-gather is
 * collective); *done (may be NULL; owned by the library, re-recorded by later
 * all-gathers of m) completes when the parameters are whole. The buffer stays m's (no
 * prefetch takes it) until fsdp2_reshard or m's hooks release it. fsdp2_unshard_wait
 * makes the current stream wait for it. fsdp2_reshard frees m's unsharded parameters
 * (m must not be between its pre and post hooks). */
FSDP2_API fsdp2_status_t fsdp2_unshard(fsdp2_module_t *m, fsdp2_event_t **done);
FSDP2_API fsdp2_status_t fsdp2_unshard_wait(fsdp2_module_t *m);
FSDP2_API fsdp2_status_t fsdp2_reshard(fsdp2_module_t *m);

typedef enum fsdp2_training_state {
    FSDP2_STATE_IDLE = 0,          /* between steps */
    FSDP2_STATE_FORWARD = 1,       /* between pre_forward and post_forward */
    FSDP2_STATE_AFTER_FORWARD = 2, /* forward done, backward not started */
    FSDP2_STATE_BACKWARD = 3,      /* between pre_backward and post_backward */
    FSDP2_STATE_AFTER_BACKWARD = 4,
} fsdp2_training_state_t;

typedef enum fsdp2_unshard_state {
    FSDP2_SHARDED = 0,    /* only shards exist */
    FSDP2_UNSHARDING = 1, /* all-gather issued (prefetch or unshard), not yet waited for */
    FSDP2_UNSHARDED = 2,  /* whole parameters usable on the current stream */
} fsdp2_unshard_state_t;

/* What a sharded module is doing, for debugging and tests. */
typedef struct fsdp2_module_state {
    unsigned size; /* sizeof(fsdp2_module_state_t), set by the caller */
    int sharded;   /* m is a fully_shard group */
    int is_root;
    fsdp2_training_state_t training_state;
    fsdp2_unshard_state_t unshard_state;
    int buffer;             /* ring slot holding its unsharded parameters, -1 dedicated/none */
    int requires_gradient_sync;
    int reshard_after_forward;
    int reshard_after_backward;
    size_t num_params;
    int64_t shard_numel;     /* padded elements per rank in the group's flat shard */
    int64_t unsharded_numel; /* elements of its whole parameters */
    uint64_t all_gathers;    /* issued since fully_shard */
    uint64_t reduce_scatters;
} fsdp2_module_state_t;

FSDP2_API fsdp2_status_t fsdp2_module_state(const fsdp2_module_t *m, fsdp2_module_state_t *state);

/* Bytes of device memory the root's plan holds, per category. */
typedef struct fsdp2_memory_plan {
    unsigned size;              /* sizeof(fsdp2_memory_plan_t), set by the caller */
    uint64_t sharded_params;    /* flat padded shards of every group */
    uint64_t sharded_grads;     /* the same for parameters that require gradients */
    uint64_t unsharded_params;  /* the ring plus dedicated buffers */
    uint64_t unsharded_grads;   /* the gradient ring plus no-sync accumulators */
    uint64_t reduce_scatter;    /* staging: ws chunks; the reduce-scatter runs in place */
    uint64_t total;             /* every category, post_forward_params included */
    int ring_buffers;
    int groups;
    uint64_t post_forward_params; /* reshard_after_forward = N: a post-forward shard per
                                     such group (its whole parameters / N, padded) */
} fsdp2_memory_plan_t;

/* Plans and allocates the root's buffers if not done yet (as the first hook does), and
 * reports the plan. m may be any module of the tree. */
FSDP2_API fsdp2_status_t fsdp2_memory_plan(fsdp2_module_t *m, fsdp2_memory_plan_t *plan);

FSDP2_EXTERN_C_END

#endif
