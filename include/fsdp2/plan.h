/* Planning without a mesh: the memory and the communication of one FSDP step on one rank
 * of a mesh that need not exist, from the library's own planner.
 *
 * fsdp2_plan_model lays the tree out as fsdp2_fully_shard_tree would on that rank and
 * sizes the root's plan with the code that sizes the real one, so its memory is what
 * fsdp2_memory_plan reports there, to the byte (the real planner checks its allocations
 * against the same sizes). Nothing is allocated on any device and nothing communicates;
 * the tree, with its parameters on meta (or anywhere), may be sharded for real
 * afterwards. Planning lays the tree's parameters out as fully_shard would (scratch
 * fields the real fully_shard sets again) and attaches units to it until it returns, on
 * every path: plan one tree from one thread at a time, and not while another thread
 * shards or uses it. */
#ifndef FSDP2_PLAN_H
#define FSDP2_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/export.h>
#include <fsdp2/fsdp.h>
#include <fsdp2/module.h>
#include <fsdp2/optim.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

typedef struct fsdp2_plan_options {
    unsigned size;             /* sizeof(fsdp2_plan_options_t) */
    int replicas;              /* the mesh's replicate dim (HSDP); 1: FSDP on a 1D mesh */
    int shard;                 /* ranks each parameter is split over (the shard dim) */
    int rank;                  /* this rank's coordinate on the shard dim, 0..shard-1 */
    /* fully_shard's options for every unit (mesh ignored; device cpu or cuda); NULL:
     * FSDP2_SHARD_OPTIONS_INIT. Their size is checked as by fsdp2_fully_shard. */
    const fsdp2_shard_options_t *shard_options;
    /* The units, as fsdp2_fully_shard_tree chooses them: policy, or (policy NULL) every
     * module whose unowned parameters number min_params elements or more; the root is
     * always one. */
    fsdp2_shard_policy_fn policy;
    void *policy_ctx;
    int64_t min_params;
    /* The optimizer whose state is planned (its kind and SGD's momentum decide how many
     * state tensors each parameter gets); NULL: none. */
    const fsdp2_optimizer_options_t *optimizer;
    /* Options of one unit where they differ from shard_options (NULL: none do): called
     * with each unit and a copy of shard_options to change, as an application passes
     * other options to some fully_shard calls (say reshard_after_forward 0 for the last
     * block). The root's reshard_after_forward is 0 whatever it says (FSDP2's rule). */
    void (*unit_options)(const fsdp2_module_t *unit, fsdp2_shard_options_t *options,
                         void *ctx);
    void *unit_options_ctx;
} fsdp2_plan_options_t;

#define FSDP2_PLAN_OPTIONS_INIT \
    {sizeof(fsdp2_plan_options_t), 1, 1, 0, NULL, NULL, NULL, 0, NULL, NULL, NULL}

/* One collective kind over one step (a forward and a backward with gradient sync). */
typedef struct fsdp2_plan_collective {
    uint64_t calls;
    uint64_t bytes;      /* their payload: all-gather output, reduce-scatter input,
                            all-reduce buffer */
    uint64_t sent;       /* bytes this rank sends by the ring algorithms: (n - 1) / n of
                            the payload for all-gather and reduce-scatter, 2 (n - 1) / n
                            for all-reduce, over the n ranks of its group */
    int ranks;           /* n (the largest when calls span group sizes) */
} fsdp2_plan_collective_t;

typedef struct fsdp2_plan_report {
    unsigned size;                /* sizeof(fsdp2_plan_report_t), set by the caller */
    fsdp2_memory_plan_t memory;   /* what fsdp2_memory_plan reports on that rank */
    uint64_t optimizer_state;     /* bytes of the optimizer's state on that rank */
    uint64_t total;               /* memory.total + optimizer_state: the peak of the
                                     library's allocations in a step */
    int units;
    int64_t param_numel;          /* elements of every parameter the units shard */
    int64_t trained_numel;        /* of those that require gradients */
    /* Per step, this rank: over the shard dim (the forward's all-gathers and, with
     * reshard_after_forward 1, the backward's; the reduce-scatters), over the blocks of N
     * ranks of reshard_after_forward N (the backward's all-gathers from the post-forward
     * shards), and over the replicate dim (HSDP's all-reduces). */
    fsdp2_plan_collective_t all_gather;
    fsdp2_plan_collective_t block_all_gather;
    fsdp2_plan_collective_t reduce_scatter;
    fsdp2_plan_collective_t all_reduce;
} fsdp2_plan_report_t;

/* Plans root's tree (not sharded yet) for the rank `rank` of a [replicas, shard] mesh.
 * FSDP2_ERR_INVALID_ARGUMENT for a bad option, naming it; FSDP2_ERR_INVALID_STATE when
 * the tree, or a module above root, is sharded already; FSDP2_ERR_OVERFLOW for a model
 * and mesh whose sizes do not fit 64 bits. Not collective. */
FSDP2_API fsdp2_status_t fsdp2_plan_model(fsdp2_module_t *root, const fsdp2_plan_options_t *options,
                                          fsdp2_plan_report_t *report);

FSDP2_EXTERN_C_END

#endif
