/* fully_shard inside the library: the module tree (module.c), parameter groups and their
 * sharded storage (fully_shard.c), the root's planned buffers (plan.c) and the step
 * (schedule.c, unshard.c, group_trace.c; what they share is fsdp/step_internal.h). */
#ifndef FSDP2_FSDP_INTERNAL_H
#define FSDP2_FSDP_INTERNAL_H

#include <fsdp2/fsdp.h>

#define FSDP_MAX_RING 8

/* A parameter's unsharded buffers, by index (fsdp2_param.unsharded_view, a group's
 * step.buffer, its pieces): the ring's buffers 0 .. ring size - 1, then the group's own. */
enum {
    FSDP_NO_BUFFER = -1, /* sharded: no buffer held */
    FSDP_OWN_BUFFER = FSDP_MAX_RING,
    FSDP_BUFFER_SLOTS = FSDP_MAX_RING + 1,
};

/* A parameter's unsharded gradient buffers, by index (fsdp2_param.grad_view, a group's
 * grads.buffer): the root's ring of two, then the group's own accumulator. */
enum {
    FSDP_NO_GRAD_BUFFER = -1, /* outside its backward */
    FSDP_GRAD_RING = 2,
    FSDP_GRAD_ACCUMULATOR = FSDP_GRAD_RING,
    FSDP_GRAD_SLOTS = FSDP_GRAD_RING + 1,
};

/* Most cast send buffers of the copy-in (mixed precision): one being cast while the
 * previous all-gather sends from the other. */
#define FSDP_MAX_SENDS 2

typedef struct fsdp_group fsdp_group_t;
typedef struct fsdp_root fsdp_root_t;

struct fsdp2_param {
    char name[FSDP2_NAME_MAX];
    fsdp2_module_t *owner;
    fsdp2_tensor_t *value; /* as declared, until fully_shard copies it; NULL after */
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
    fsdp2_dtype_t dtype;
    int requires_grad;
    int materialized;
    int has_random_init;
    fsdp2_random_init_t random_init;

    /* Set by fully_shard. */
    fsdp_group_t *group;
    int64_t row_numel;      /* elements per row of dim 0 (1 for 0-dim: one row) */
    int64_t rows;           /* global rows (1 for 0-dim) */
    int64_t chunk_rows;     /* ceil(rows / ws) */
    int64_t local_rows;     /* this rank's */
    int64_t offset_rows;    /* this rank's first global row */
    int64_t shard_offset;   /* elements into the group's flat shard (padded chunks) */
    int64_t grad_offset;    /* elements into the flat grad shard; -1 when frozen */
    int64_t full_offset;    /* elements into an unsharded parameter buffer */
    int64_t grad_full_offset; /* elements into an unsharded gradient buffer; -1 frozen */
    int64_t pf_chunk_rows;  /* reshard_after_forward = N: ceil(rows / N) */
    int64_t pf_shard_offset; /* elements into the group's post-forward shard */
    fsdp2_dtensor_t *sharded;
    fsdp2_dtensor_t *sharded_grad;
    fsdp2_tensor_t *unsharded_view[FSDP_BUFFER_SLOTS]; /* per unsharded buffer */
    fsdp2_tensor_t *grad_view[FSDP_GRAD_SLOTS];        /* per gradient buffer */
    fsdp2_tensor_t *unsharded; /* the current view, NULL while sharded */
    fsdp2_tensor_t *grad;      /* the current view, NULL outside backward */
};

typedef struct named_tensor {
    char name[FSDP2_NAME_MAX];
    fsdp2_tensor_t *tensor;
} named_tensor_t;

/* Another name of a parameter declared elsewhere in the tree (a tied weight). */
typedef struct tied_param {
    char name[FSDP2_NAME_MAX];
    fsdp2_param_t *target;
} tied_param_t;

struct fsdp2_module {
    char name[FSDP2_NAME_MAX];
    fsdp2_module_t *parent;
    fsdp2_module_t **children;
    size_t num_children;
    fsdp2_param_t **params;
    size_t num_params;
    named_tensor_t *buffers;
    size_t num_buffers;
    tied_param_t *ties;
    size_t num_ties;
    fsdp_group_t *group; /* set by fully_shard */
};

/* One unsharded buffer: of the ring, or a group's own. */
typedef struct unsharded_buffer {
    void *data;
    size_t bytes;
    fsdp2_event_t *free; /* recorded where its last reader ran */
    fsdp_group_t *owner; /* NULL when free */
} unsharded_buffer_t;

/* A group's fields, by concern. Each sub-struct says what it holds and who writes it;
 * everything else only reads it. */

/* Where the group is sharded. fully_shard writes it (or the dry plan, for a mesh that
 * need not exist); fixed afterwards. */
typedef struct fsdp_group_comm {
    fsdp2_mesh_t *mesh;
    fsdp2_group_t *pg;        /* the mesh's shard dim (its last) */
    fsdp2_group_t *replicate; /* HSDP: the mesh's dim 0 on a 2D mesh, else NULL */
    int replicas;             /* size of that dim (1 without HSDP) */
    int rank, ws;
    fsdp2_device_t device;
} fsdp_group_comm_t;

/* The flat shards and their sizes. fully_shard lays them out (fsdp_group_geometry) and
 * allocates the shards (build); fixed afterwards. The optimizer and checkpoints write
 * the shards' values, the reduce-scatters the gradient shard's. */
typedef struct fsdp_group_layout {
    fsdp2_dtype_t dtype; /* of every parameter in the group (one dtype per group) */
    size_t elem;
    int64_t shard_numel;      /* padded, per rank */
    int64_t grad_shard_numel; /* padded, per rank, requires_grad params only */
    int64_t full_numel;       /* unsharded elements */
    int64_t grad_full_numel;
    fsdp2_tensor_t *shard;      /* flat [shard_numel] */
    fsdp2_tensor_t *grad_shard; /* flat [grad_shard_numel], NULL if none */
} fsdp_group_layout_t;

/* Mixed precision: the dtypes of the policy (precision.c, at fully_shard); fixed
 * afterwards. */
typedef struct fsdp_group_precision {
    fsdp2_dtype_t pdtype, rdtype; /* compute (all-gather), reduce */
    size_t pe, re;
    int cast;                     /* pdtype != dtype: a copy-in cast before gathering */
    fsdp2_dtype_t input_dtype;    /* forward inputs' dtype (cast_forward_inputs), or COUNT */
    fsdp2_dtype_t output_dtype;   /* forward outputs' dtype (output_dtype), or COUNT */
} fsdp_group_precision_t;

/* Modules to prefetch after a hook, as fsdp2_set_modules_to_*_prefetch set them. */
typedef struct fsdp_prefetch_list {
    fsdp_group_t **groups;
    size_t count;
    int is_set; /* 0: prefetch by the order of the last step */
} fsdp_prefetch_list_t;

/* The user's controls: fully_shard's options, then the fsdp2_set_* functions
 * (controls.c); the root's init keeps the root's parameters through forward. */
typedef struct fsdp_group_controls {
    int reshard_after_forward; /* 0 or 1; N is pf.ranks */
    int reshard_after_backward;
    int requires_gradient_sync;
    int is_last_backward;
    int requested_unsharded_buffers; /* the ring size, read from the root's group */
    fsdp2_reduce_t reduce;           /* of the reduce-scatter: average, or a divide factor */
    fsdp_prefetch_list_t forward_prefetch, backward_prefetch;
} fsdp_group_controls_t;

/* reshard_after_forward = N (1 < N < ws): after forward, this rank keeps chunk
 * (rank % N) of the N-way split of the whole parameters (the "post-forward shard"), and
 * the backward all-gathers them over the N ranks of its block (pg). fully_shard.c writes
 * its layout (ranks, rank, shard_numel), plan.c its memory, events and pieces, and
 * schedule.c `valid`. */
typedef struct fsdp_group_post_forward {
    int ranks;                /* N, or 0 */
    int rank;                 /* rank % N */
    fsdp2_group_t *pg;        /* the mesh's block group of N */
    int64_t shard_numel;      /* padded, per rank, in the compute dtype */
    void *shard;              /* planned: shard_numel elements */
    int valid;                /* holds the parameters of this step's forward */
    fsdp2_event_t *free;      /* recorded after the all-gather that read it */
    fsdp2_iov_t *pieces[FSDP_BUFFER_SLOTS]; /* that all-gather's destinations per buffer */
    size_t *piece_offsets;                  /* N + 1 */
} fsdp_group_post_forward_t;

/* Where the group's parameters are gathered: plan.c binds it to the root's ring or
 * gives it a buffer of its own (the root's init, or fsdp2_set_reshard_after_forward);
 * fully_shard creates `gathered`, the schedule records it. */
typedef struct fsdp_group_unsharded {
    int dedicated; /* keeps its own unsharded buffer */
    int alias;     /* ws == 1: the shard is the whole parameter, own buffer = shard */
    unsharded_buffer_t own;
    fsdp2_iov_t *pieces[FSDP_BUFFER_SLOTS]; /* all-gather destinations per buffer */
    size_t *piece_offsets;                  /* ws + 1, the same for every buffer */
    fsdp2_event_t *gathered;                /* recorded on the all-gather stream */
} fsdp_group_unsharded_t;

/* Where the group is in the current step: the step's alone (schedule.c, unshard.c);
 * controls.c reads it to refuse changes between hooks. */
typedef struct fsdp_group_step {
    fsdp2_training_state_t training_state;
    int forward_done; /* its forward ran in this step */
    int pinned;       /* unsharded by fsdp2_unshard: no prefetch may take its buffer */
    fsdp2_unshard_state_t unshard_state;
    int buffer; /* the unsharded buffer it holds (FSDP_OWN_BUFFER, FSDP_NO_BUFFER) */
} fsdp_group_step_t;

/* Its unsharded gradients. plan.c creates the accumulator (at the root's init, or on
 * demand when gradient sync goes off) and sets encloses_groups; schedule.c takes and
 * gives back the buffers within a backward. */
typedef struct fsdp_group_grads {
    int buffer; /* what its backward holds (FSDP_GRAD_ACCUMULATOR, FSDP_NO_GRAD_BUFFER) */
    void *accumulator;     /* its own unsharded gradients: no-sync, or encloses groups */
    int accumulator_dirty; /* holds gradients not yet reduced */
    int encloses_groups;   /* other groups' modules lie under its module */
    fsdp2_event_t *accumulator_free; /* recorded after the last copy out of it */
} fsdp_group_grads_t;

/* Collectives issued, for fsdp2_module_state; the step's (unshard.c, schedule.c). */
typedef struct fsdp_group_stats {
    uint64_t all_gathers, reduce_scatters;
} fsdp_group_stats_t;

/* Trace tokens of what the group has open now (TRACE_NO_TOKEN: none): its forward or
 * backward on compute, its hold of an unsharded parameter buffer, of a gradient buffer,
 * of its post-forward shard. The step's (unshard.c, schedule.c). */
typedef struct fsdp_group_trace {
    int64_t slice, hold, grad_hold, pf_hold;
} fsdp_group_trace_t;

/* One module's parameters, sharded as one flat buffer per rank. The module, root and
 * parameter list are set by fully_shard (root: by the root's lazy init). */
struct fsdp_group {
    fsdp2_module_t *module;
    fsdp_root_t *root;
    fsdp2_param_t **params; /* the group's, in registration order */
    size_t num_params;
    fsdp_group_comm_t comm;
    fsdp_group_layout_t layout;
    fsdp_group_precision_t mp;
    fsdp_group_controls_t controls;
    fsdp_group_post_forward_t pf;
    fsdp_group_unsharded_t unsharded;
    fsdp_group_step_t step;
    fsdp_group_grads_t grads;
    fsdp_group_stats_t stats;
    fsdp_group_trace_t trace;
};

/* The root's fields, by concern; plan.c writes everything at the root's init but what
 * each sub-struct says otherwise. */

/* The streams of a step and the events that order them (schedule.c's header lists each
 * event's ordering). ag_copy_in exists only with a cast and ws > 1. */
typedef struct fsdp_root_streams {
    fsdp2_stream_t *compute;    /* the current stream of the hooks' thread */
    fsdp2_stream_t *ag_copy_in; /* the casts into the send buffers (mixed precision) */
    fsdp2_stream_t *ag;         /* all-gathers */
    fsdp2_stream_t *rs;         /* reduce-scatters */
    fsdp2_event_t *compute_mark; /* re-recorded whenever a side stream must wait */
    fsdp2_event_t *rs_done;
    fsdp2_event_t *ag_done;
    fsdp2_event_t *grad_ready;
} fsdp_root_streams_t;

/* The ring of unsharded parameter buffers; the schedule moves `next` and the owners. */
typedef struct fsdp_root_ring {
    int size;
    unsharded_buffer_t buffers[FSDP_MAX_RING];
    int next;
} fsdp_root_ring_t;

/* One unsharded gradient buffer of the ring. */
typedef struct fsdp_grad_slot {
    void *data;
    fsdp2_event_t *free;  /* recorded on rs after the copy out of it */
    fsdp_group_t *owner;  /* the group whose backward holds it, NULL when free */
} fsdp_grad_slot_t;

/* The ring of two gradient buffers; the schedule moves `next` and the owners. */
typedef struct fsdp_root_grad_ring {
    fsdp_grad_slot_t slots[FSDP_GRAD_RING];
    int next;
} fsdp_root_grad_ring_t;

/* One send buffer of the copy-in (mixed precision): the largest cast shard. */
typedef struct fsdp_send_slot {
    void *data;
    fsdp2_event_t *free;   /* recorded on ag after the all-gather that sent it */
    fsdp2_event_t *copied; /* recorded on ag_copy_in after the cast into it */
} fsdp_send_slot_t;

/* Copy-in (mixed precision): `count` send buffers (two with a ring of two or more, else
 * one), so the cast of the next all-gather (on ag_copy_in) runs while the previous
 * all-gather sends. The schedule moves `next`. */
typedef struct fsdp_root_sends {
    fsdp_send_slot_t slots[FSDP_MAX_SENDS];
    int count;
    int next;
} fsdp_root_sends_t;

/* The reduce-scatter staging: ws x the largest padded gradient shard; the result in
 * place. */
typedef struct fsdp_root_staging {
    void *data;
    size_t bytes;
} fsdp_root_staging_t;

/* The step as a whole; schedule.c's alone. */
typedef struct fsdp_root_step {
    /* The forward order of the current and the previous step. */
    fsdp_group_t **order, **last_order;
    size_t order_len, last_order_len;
    int in_step;
    /* A pre_backward ran since the last backward_finish: the sharded gradients may still
     * be written by reduce-scatters (the optimizer, clipping, zero_grad, saving and the
     * next step's root pre_forward are refused until backward_finish). */
    int backward_open;
    /* A failure where no status could be returned (recording a released buffer's free
     * event): the hook that caused it returns it. */
    fsdp2_status_t deferred;
    char deferred_message[512];
} fsdp_root_step_t;

/* Gradient clipping's scratch, allocated with the plan so that clipping (lib/optim)
 * allocates nothing inside a step: the tree's parameters and their local gradient
 * shards (capacity of each), and one double per rank of the largest mesh dim. */
typedef struct fsdp_root_clip {
    fsdp2_param_t **params;
    fsdp2_tensor_t **grads;
    size_t capacity;
    double *all;
    int all_len;
} fsdp_root_clip_t;

struct fsdp_root {
    fsdp_group_t *group; /* the root's own */
    fsdp_group_t **groups; /* every group of the tree, in tree (pre-)order */
    size_t num_groups;
    fsdp2_device_t device;
    fsdp_root_streams_t streams;
    fsdp_root_ring_t ring;
    fsdp_root_grad_ring_t grad_ring;
    fsdp_root_sends_t sends;
    fsdp_root_staging_t staging;
    fsdp2_memory_plan_t plan;
    fsdp_root_step_t step;
    fsdp_root_clip_t clip;
};

/* module.c */
void fsdp_module_fqn(const fsdp2_module_t *m, char *buf, size_t len);
void fsdp_param_fqn(const fsdp2_param_t *p, char *buf, size_t len);
/* The top of m's tree. */
fsdp2_module_t *fsdp_module_top(fsdp2_module_t *m);
/* Calls fn on every module of the subtree, parents first; stops at the first error. */
fsdp2_status_t fsdp_module_walk(fsdp2_module_t *m, fsdp2_status_t (*fn)(fsdp2_module_t *, void *),
                                void *ctx);

/* Marks p as given values (a checkpoint load or import wrote its shard). */
void fsdp_param_set_materialized(fsdp2_param_t *p);

/* fully_shard.c */
void fsdp_group_free(fsdp_group_t *g);
/* FSDP2_ERR_INVALID_ARGUMENT (or UNSUPPORTED) naming the module fqn and the bad field. */
fsdp2_status_t fsdp_check_shard_options(const fsdp2_shard_options_t *o, const char *fqn);
/* *out = in as fully_shard takes it: the defaults for NULL, the fields an earlier header
 * had for its size (the rest defaulted), then checked. */
fsdp2_status_t fsdp_shard_options_take(const fsdp2_shard_options_t *in,
                                       fsdp2_shard_options_t *out, const char *fqn);
/* Elements of m's subtree's parameters that no group owns (fully_shard_tree's measure). */
int64_t fsdp_unowned_numel(const fsdp2_module_t *m);
/* A new group's fields for module m and options o (no mesh, ws, rank or replicas yet). */
void fsdp_group_init(fsdp_group_t *g, fsdp2_module_t *m, const fsdp2_shard_options_t *o);
/* The layout of a group whose ws, rank and replicas are set: the parameters of its module
 * that no nested group owns (in named_parameters order), their ties checked, their places
 * in the flat shards and unsharded buffers, the dtypes of the mixed precision policy, and
 * the post-forward layout of reshard_after_forward. Allocates nothing but the group's
 * parameter list; fully_shard and the dry plan
 * (fsdp2_plan_model) both lay groups out with it. */
fsdp2_status_t fsdp_group_geometry(fsdp_group_t *g, const fsdp2_shard_options_t *o,
                                   const char *fqn);
/* Sets g's reshard_after_forward from a user's value (0, 1, or N dividing the shard
 * size): the post-forward layout for N (a post-forward shard planned for another N is
 * given back first); `what` names the caller in errors. */
fsdp2_status_t fsdp_group_set_reshard_after_forward(fsdp_group_t *g, int value, const char *what);
/* A view of `rows` rows of p's shape at element `at` of a flat tensor (shares storage). */
fsdp2_status_t fsdp_param_view(const fsdp2_param_t *p, fsdp2_tensor_t *flat, int64_t at,
                               int64_t rows, fsdp2_tensor_t **out);
/* The outermost sharded module above or at m, or NULL. */
fsdp2_module_t *fsdp_root_module(fsdp2_module_t *m);

/* precision.c: the group's dtypes from its mixed precision policy. */
fsdp2_status_t fsdp_group_set_precision(fsdp_group_t *g, const fsdp2_mp_policy_t *mp,
                                        const char *fqn);

/* unshard.c: whether g is between its pre and post hooks. */
int fsdp_group_in_use(const fsdp_group_t *g);

/* schedule.c: FSDP2_ERR_INVALID_STATE naming `what` when m's tree is in a backward that
 * fsdp2_backward_finish has not closed; success for trees that are not sharded or not
 * planned yet. For the layers that read or write sharded gradients (optim, checkpoint). */
fsdp2_status_t fsdp_check_backward_closed(fsdp2_module_t *m, const char *what);

/* plan.c */
/* The root's plan from its groups' layouts alone, allocating nothing. */
typedef struct fsdp_plan_sizes {
    size_t ring_bytes;  /* each unsharded buffer of the ring */
    size_t grad_bytes;  /* each of the two unsharded gradient buffers (0: none) */
    size_t rs_bytes;    /* one chunk of the reduce-scatter staging (ws of them) */
    size_t send_bytes;  /* each cast send buffer (mixed precision) */
    int ring_size, sends;
    uint64_t group_bytes; /* the groups' own buffers, accumulators and post-forward shards */
    fsdp2_memory_plan_t plan; /* every category, as fsdp2_memory_plan reports it */
} fsdp_plan_sizes_t;
/* r->groups (tree pre-order), r->group and each group's dedicated flag set as the root's
 * init sets them. Sets dedicated for groups of one rank and encloses_groups: the same
 * decisions the allocation then follows. */
void fsdp_plan_sizes(fsdp_root_t *r, fsdp_plan_sizes_t *s);
/* r->groups: the groups of rootm's tree in pre-order, each checked to keep its shards on
 * r->device (set by the caller) and to share one mesh; r->group: rootm's, which keeps its
 * parameters from forward to backward; each group's dedicated flag as the plan then
 * follows it. For the root's init and the dry plan alike. */
fsdp2_status_t fsdp_root_collect_groups(fsdp_root_t *r, fsdp2_module_t *rootm);

/* Plans and allocates the root's buffers on first use; *out is the root. */
fsdp2_status_t fsdp_root_get(fsdp2_module_t *m, fsdp_root_t **out);
void fsdp_root_free(fsdp_root_t *r);
/* Creates (once) g's own unsharded buffer, for groups that keep parameters whole. */
fsdp2_status_t fsdp_group_own_buffer(fsdp_group_t *g);
/* Creates (once) g's post-forward shard, its block group and all-gather pieces, for a
 * group that reshards to N ranks after forward. */
fsdp2_status_t fsdp_group_post_forward(fsdp_group_t *g);
/* Gives back g's post-forward shard and pieces (its N changed); the block group stays
 * the mesh's. */
void fsdp_group_post_forward_free(fsdp_group_t *g);
/* Creates (once) g's no-sync gradient accumulator. */
fsdp2_status_t fsdp_group_accumulator(fsdp_group_t *g);
/* The unsharded buffer with index i of g (ring index, or FSDP_OWN_BUFFER). */
unsharded_buffer_t *fsdp_buffer(fsdp_group_t *g, int i);

/* plan_dry.c */
/* The dry plan behind fsdp2_plan_model (include/fsdp2/plan.h, lib/optim), but the
 * optimizer: units chosen and laid out as fsdp2_fully_shard_tree would on one rank of a
 * [replicas, shard] mesh, sized by fsdp_plan_sizes, then detached again. */
typedef struct fsdp_dry_options {
    int replicas, shard, rank;
    fsdp2_shard_options_t shard_options; /* taken and checked (fsdp_shard_options_take) */
    fsdp2_shard_policy_fn policy;
    void *policy_ctx;
    int64_t min_params;
    void (*unit_options)(const fsdp2_module_t *unit, fsdp2_shard_options_t *options,
                         void *ctx);
    void *unit_options_ctx;
} fsdp_dry_options_t;

/* One collective kind of a step (fsdp2_plan_collective_t's fields). */
typedef struct fsdp_dry_collective {
    uint64_t calls, bytes, sent;
    int ranks;
} fsdp_dry_collective_t;

/* local_trained_bytes: the bytes of one state tensor per trained parameter (its local
 * rows, in the shard dtype). */
typedef struct fsdp_dry_report {
    fsdp2_memory_plan_t memory;
    int units;
    int64_t param_numel, trained_numel;
    uint64_t local_trained_bytes;
    fsdp_dry_collective_t all_gather, block_all_gather, reduce_scatter, all_reduce;
} fsdp_dry_report_t;
fsdp2_status_t fsdp_plan_dry(fsdp2_module_t *root, const fsdp_dry_options_t *o,
                             fsdp_dry_report_t *out);

#endif
