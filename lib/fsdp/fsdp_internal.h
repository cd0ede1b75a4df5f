/* fully_shard inside the library: the module tree (module.c), parameter groups and their
 * sharded storage (fully_shard.c), the root's planned buffers (plan.c) and the step
 * (schedule.c). */
#ifndef FSDP2_FSDP_INTERNAL_H
#define FSDP2_FSDP_INTERNAL_H

#include <fsdp2/fsdp.h>

#define FSDP_MAX_RING 8

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
    fsdp2_tensor_t *unsharded_view[FSDP_MAX_RING + 1]; /* per buffer; [ring] = dedicated */
    fsdp2_tensor_t *grad_view[3];                       /* per grad buffer; [2] = no-sync */
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

struct fsdp_group {
    fsdp2_module_t *module;
    fsdp_root_t *root; /* set by the root's lazy init */
    fsdp2_mesh_t *mesh;
    fsdp2_group_t *pg; /* the mesh's shard dim (its last) */
    fsdp2_group_t *replicate; /* HSDP: the mesh's dim 0 on a 2D mesh, else NULL */
    int replicas;             /* size of that dim (1 without HSDP) */
    int rank, ws;
    fsdp2_device_t device;
    fsdp2_dtype_t dtype; /* of every parameter in the group (one dtype per group) */
    size_t elem;
    fsdp2_dtype_t pdtype, rdtype; /* mixed precision: compute (all-gather), reduce */
    size_t pe, re;
    int cast;                     /* pdtype != dtype: a copy-in cast before gathering */
    fsdp2_dtype_t input_dtype;    /* forward inputs' dtype (cast_forward_inputs), or COUNT */
    fsdp2_dtype_t output_dtype;   /* forward outputs' dtype (output_dtype), or COUNT */
    fsdp2_reduce_t reduce;        /* of the reduce-scatter: average, or a divide factor */
    fsdp2_param_t **params; /* the group's, in registration order */
    size_t num_params;
    int64_t shard_numel;      /* padded, per rank */
    int64_t grad_shard_numel; /* padded, per rank, requires_grad params only */
    int64_t full_numel;       /* unsharded elements */
    int64_t grad_full_numel;
    fsdp2_tensor_t *shard;      /* flat [shard_numel] */
    fsdp2_tensor_t *grad_shard; /* flat [grad_shard_numel], NULL if none */
    int requested_unsharded_buffers;

    /* Controls. */
    int reshard_after_forward;
    int reshard_after_backward;
    /* reshard_after_forward = N (1 < N < ws): after forward, this rank keeps chunk
     * (rank % N) of the N-way split of the whole parameters (the "post-forward shard"),
     * and the backward all-gathers them over the N ranks of its block (pf_pg). */
    int pf_ranks;             /* N, or 0 */
    int pf_rank;              /* rank % N */
    fsdp2_group_t *pf_pg;     /* the mesh's block group of N, set by the plan */
    int64_t pf_shard_numel;   /* padded, per rank, in the compute dtype */
    void *pf_shard;           /* planned: pf_shard_numel elements */
    int pf_valid;             /* holds the parameters of this step's forward */
    fsdp2_event_t *pf_free;   /* recorded after the all-gather that read it */
    fsdp2_iov_t *pf_pieces[FSDP_MAX_RING + 1]; /* that all-gather's destinations per buffer */
    size_t *pf_piece_offsets;                  /* N + 1 */
    int requires_gradient_sync;
    int is_last_backward;
    fsdp_group_t **forward_prefetch;
    size_t num_forward_prefetch;
    int explicit_forward_prefetch;
    fsdp_group_t **backward_prefetch;
    size_t num_backward_prefetch;
    int explicit_backward_prefetch;

    /* State. */
    fsdp2_training_state_t training_state;
    int forward_done; /* its forward ran in this step */
    int pinned;       /* unsharded by fsdp2_unshard: no prefetch may take its buffer */
    fsdp2_unshard_state_t unshard_state;
    int buffer;    /* index into root->buffers, FSDP_MAX_RING for own, -1 when sharded */
    int dedicated; /* keeps its own unsharded buffer */
    int alias;     /* ws == 1: the shard is the whole parameter, own buffer = shard */
    unsharded_buffer_t own;
    int grad_buffer; /* index into root->grad_buffers, 2 = no-sync accumulator, -1 none */
    void *accumulator;           /* its own unsharded gradients: no-sync, or encloses groups */
    int accumulator_dirty;       /* holds gradients not yet reduced */
    int encloses_groups;         /* other groups' modules lie under its module */
    fsdp2_event_t *accumulator_free; /* recorded after the last copy out of it */
    fsdp2_event_t *gathered;     /* recorded on the all-gather stream */
    uint64_t all_gathers, reduce_scatters;
    fsdp2_iov_t *pieces[FSDP_MAX_RING + 1]; /* all-gather destinations per buffer */
    /* Trace tokens (-1: none): its forward or backward on compute, its hold of an
     * unsharded parameter buffer and of a gradient buffer. */
    int64_t trace_slice, trace_hold, trace_grad_hold, trace_pf_hold;
    size_t *piece_offsets;                  /* ws + 1, the same for every buffer */
};

struct fsdp_root {
    fsdp_group_t *group; /* the root's own */
    fsdp_group_t **groups; /* every group of the tree, in tree (pre-)order */
    size_t num_groups;
    fsdp2_device_t device;
    fsdp2_stream_t *compute;  /* the current stream of the hooks' thread */
    fsdp2_stream_t *ag_copy_in; /* the casts into the send buffers (mixed precision) */
    fsdp2_stream_t *ag;       /* all-gathers */
    fsdp2_stream_t *rs;       /* reduce-scatters */
    fsdp2_event_t *compute_mark; /* re-recorded whenever a side stream must wait */
    fsdp2_event_t *rs_done;
    fsdp2_event_t *ag_done;
    fsdp2_event_t *grad_ready;
    int ring_size;
    unsharded_buffer_t buffers[FSDP_MAX_RING];
    int next_buffer;
    void *grad_buffers[2];
    fsdp2_event_t *grad_free[2];
    fsdp_group_t *grad_owner[2]; /* the group whose backward holds each gradient buffer */
    int next_grad_buffer;
    /* Copy-in (mixed precision): `sends` (two with a ring of two or more, else one) send
     * buffers of the largest cast shard, so the cast of the next all-gather (on
     * ag_copy_in) runs while the previous all-gather sends. */
    void *send[2];
    int sends;
    fsdp2_event_t *send_free[2]; /* recorded on ag after the all-gather that sent it */
    fsdp2_event_t *copied[2];    /* recorded on ci after the cast into it */
    int next_send;
    void *rs_input; /* ws x the largest padded gradient shard; the result in place */
    size_t rs_input_bytes;
    fsdp2_memory_plan_t plan;
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
    /* Gradient clipping's scratch, allocated with the plan so that clipping allocates
     * nothing inside a step: the tree's parameters and their local gradient shards
     * (clip_capacity of each), and one double per rank of the largest mesh dim. */
    fsdp2_param_t **clip_params;
    fsdp2_tensor_t **clip_grads;
    size_t clip_capacity;
    double *clip_all;
    int clip_all_len;
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
/* The unsharded buffer with index i of g (ring index, or FSDP_MAX_RING for its own). */
unsharded_buffer_t *fsdp_buffer(fsdp_group_t *g, int i);

#endif
