/* Module descriptors: the application's model as a tree of named modules holding named
 * parameters and buffers, as in torch.nn.Module. There is no autograd in C: the
 * application computes forward and backward itself and tells libfsdp2 where each module
 * starts and ends (fsdp2/fsdp.h).
 *
 * Names follow PyTorch: a module's name is its attribute name in its parent ("layers",
 * "0", "attn"), and a parameter's fully qualified name (FQN) joins the names from the
 * root down, without the root's own name: "layers.0.attn.wq.weight".
 *
 * A parameter is declared with a full tensor: `meta` (shape and dtype only, no memory:
 * materialised after sharding, so a model larger than one process can be built) or
 * `cpu` holding the initial values (copied into the shard by fully_shard). The tree owns
 * its modules: destroying the root destroys everything, including the sharding state.
 * Not thread-safe: one thread builds and drives a tree. */
#ifndef FSDP2_MODULE_H
#define FSDP2_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/dtensor.h>
#include <fsdp2/export.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

FSDP2_EXTERN_C_BEGIN

#define FSDP2_NAME_MAX 64 /* longest module or parameter name, with its NUL */
#define FSDP2_FQN_MAX 512 /* longest fully qualified name, with its NUL */

typedef struct fsdp2_module fsdp2_module_t;
typedef struct fsdp2_param fsdp2_param_t;

/* A new module with no parent. name: 0..63 characters without '.'; the root's may be
 * empty. */
FSDP2_API fsdp2_status_t fsdp2_module_create(const char *name, fsdp2_module_t **module);

/* Makes child a child of parent (which then owns it). Names are unique among a module's
 * children and parameters; a child already in a tree, or sharded, is refused. */
FSDP2_API fsdp2_status_t fsdp2_module_add_child(fsdp2_module_t *parent, fsdp2_module_t *child);

/* Declares a parameter of m with value's shape and dtype (f32, f64, bf16 or f16). The
 * module keeps a reference on value until fully_shard copies its rows into the shard
 * (then drops it); value may be meta. *param (may be NULL) is a handle owned by the
 * tree. Refused once m is sharded. */
FSDP2_API fsdp2_status_t fsdp2_module_add_param(fsdp2_module_t *m, const char *name,
                                                fsdp2_tensor_t *value, int requires_grad,
                                                fsdp2_param_t **param);

/* Gives target, a parameter declared elsewhere in the same tree, another name in m: a
 * tied weight (GPT-2's LM head reads the token embedding). No new parameter or storage:
 * fsdp2_module_find_param finds target under both names; parameter lists, state dicts,
 * optimizers and clipping see it once, under its own name. Both names must land in the
 * same fully_shard unit, since one unsharded tensor serves both uses and their gradient
 * contributions are summed before its one reduce-scatter: fully_shard refuses a unit
 * that would hold one name and not the other, naming both. Refused once m is sharded. */
FSDP2_API fsdp2_status_t fsdp2_module_tie_param(fsdp2_module_t *m, const char *name,
                                                fsdp2_param_t *target);

/* Declares a buffer (running statistics and the like): kept whole on every rank, never
 * sharded; the module keeps a reference. */
FSDP2_API fsdp2_status_t fsdp2_module_add_buffer(fsdp2_module_t *m, const char *name,
                                                 fsdp2_tensor_t *value);

/* Destroys a root module and its whole tree. Streams must be idle (call
 * fsdp2_backward_finish or fsdp2_module_synchronize first). NULL ignored; a module with a
 * parent is refused. */
FSDP2_API fsdp2_status_t fsdp2_module_destroy(fsdp2_module_t *root);

FSDP2_API fsdp2_status_t fsdp2_module_parent(const fsdp2_module_t *m, fsdp2_module_t **parent);
FSDP2_API fsdp2_status_t fsdp2_module_child_count(const fsdp2_module_t *m, size_t *count);
FSDP2_API fsdp2_status_t fsdp2_module_child(const fsdp2_module_t *m, size_t index,
                                            fsdp2_module_t **child);
/* The module's FQN (empty for the root) into buf. */
FSDP2_API fsdp2_status_t fsdp2_module_fqn(const fsdp2_module_t *m, char *buf, size_t len);

/* The parameters of m's whole subtree, in PyTorch's named_parameters order (m's own,
 * then each child's in insertion order): *count gets how many there are, and the first
 * min(count, capacity) go to out (out may be NULL with capacity 0). */
FSDP2_API fsdp2_status_t fsdp2_module_params(const fsdp2_module_t *m, fsdp2_param_t **out,
                                             size_t capacity, size_t *count);
/* The parameter called fqn under m, or FSDP2_ERR_NOT_FOUND naming it. */
FSDP2_API fsdp2_status_t fsdp2_module_find_param(const fsdp2_module_t *m, const char *fqn,
                                                 fsdp2_param_t **param);
/* The buffer called fqn under m (a borrowed tensor), or FSDP2_ERR_NOT_FOUND. */
FSDP2_API fsdp2_status_t fsdp2_module_find_buffer(const fsdp2_module_t *m, const char *fqn,
                                                  fsdp2_tensor_t **buffer);

typedef struct fsdp2_param_info {
    char fqn[FSDP2_FQN_MAX];
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS]; /* global */
    fsdp2_dtype_t dtype;
    int requires_grad;
    int sharded;      /* owned by a fully_shard group */
    int materialized; /* has values (declared on cpu, or materialised) */
} fsdp2_param_info_t;

FSDP2_API fsdp2_status_t fsdp2_param_info(const fsdp2_param_t *p, fsdp2_param_info_t *info);
FSDP2_API fsdp2_status_t fsdp2_param_module(const fsdp2_param_t *p, fsdp2_module_t **module);

FSDP2_EXTERN_C_END

#endif
