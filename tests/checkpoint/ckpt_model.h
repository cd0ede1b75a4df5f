/* The model the checkpoint tests save and load, its values as formulas, and bitwise
 * comparisons of its whole tensors.
 *
 * The tree is root "" -> {enc, head, conv}, each fully_shard'ed on a 1D mesh, then the
 * root (which has no parameters of its own):
 *   t=0 enc.weight  f32 [7,13]   rows over 4 ranks: 2,2,2,1
 *   t=1 enc.bias    f32 [5]      2,2,1,0
 *   t=2 head.weight f32 [3,5]    fewer rows than 4 ranks: 1,1,1,0
 *   t=3 conv.kernel f64 [4,2,3]  3-D, its own dtype (a group per dtype)
 *   t=5 head.proj   f32 [1000,600] 2.4 MB: chunks span several 1 MiB checksum blocks,
 *                                and most row ranges cut one
 *   enc.running     f32 [6]      a buffer: whole on every rank
 *   scale           f32 [4]      a root parameter in ignored_params: whole, no optimizer
 *                                state
 * plus an AdamW whose exp_avg / exp_avg_sq are Shard(0) DTensors like the parameters.
 * Variants change the tree the way a model changes between a save and a load: one more
 * parameter (t=4 head.bias f32 [3]), head.weight reshaped to [3,6], no enc.bias, or
 * conv.kernel in f32.
 *
 * Every tensor slot has an index: 3 * t for parameter t, 3 * t + 1 and 3 * t + 2 for its
 * exp_avg and exp_avg_sq, WHOLE_SLOT + i for whole tensor i. A value is value_of(seed, slot,
 * global element index): seed 0 is what gets saved, other seeds are "something else"
 * (what a fresh model holds before a load). The formula is a sin in double, so the
 * values use every mantissa bit and a misplaced row, a byte swap or a rounding through
 * another dtype all show. */
#ifndef FSDP2_TESTS_CKPT_MODEL_H
#define FSDP2_TESTS_CKPT_MODEL_H

#include <stdint.h>

#include <fsdp2/checkpoint.h>
#include <fsdp2/fsdp.h>
#include <fsdp2/optim.h>

#include "../collectives/ranks.h"

#define MAX_PARAMS 6
#define NUM_WHOLE 2   /* tensors whole on every rank: the buffer and the ignored parameter */
#define WHOLE_SLOT 18 /* WHOLE_SPEC[i]'s formula slot is WHOLE_SLOT + i */
#define GROUP_TIMEOUT_MS 20000
#define DEADLINE_S 120
#define SAVED_STEPS 7 /* the optimizer step count the tests save */
#define NUM_SLOTS_BASE 17 /* 5 parameters x (value, exp_avg, exp_avg_sq) + 2 whole tensors */

typedef enum variant {
    VARIANT_BASE = 0,
    VARIANT_EXTRA_PARAM = 1,  /* + head.bias [3] */
    VARIANT_RESHAPED = 2,     /* head.weight [3,6] */
    VARIANT_MISSING_PARAM = 3, /* no enc.bias */
    VARIANT_RETYPED = 4,      /* conv.kernel f32 */
} variant_t;

typedef struct param_spec {
    const char *module, *name, *fqn;
    fsdp2_dtype_t dtype;
    int ndim;
    int64_t shape[3];
    int t; /* formula index */
} param_spec_t;

typedef struct model {
    rank_ctx_t *c;
    fsdp2_mesh_t *mesh; /* borrowed */
    fsdp2_module_t *root;
    fsdp2_module_t *mods[3]; /* enc, head, conv */
    int np;
    param_spec_t spec[MAX_PARAMS];
    fsdp2_param_t *p[MAX_PARAMS];
    fsdp2_param_t *scale;
    /* enc.running (our handle: the module holds another) and scale (borrowed) */
    fsdp2_tensor_t *whole[NUM_WHOLE];
    fsdp2_optimizer_t *opt;
    fsdp2_state_dict_t *sd;
} model_t;

extern const char *const STATE_NAME[2]; /* exp_avg, exp_avg_sq */
extern const param_spec_t WHOLE_SPEC[NUM_WHOLE]; /* enc.running, scale */

/* A library call that must succeed: `fails += OK(c, call)` prints it otherwise. */
int check_ok(const rank_ctx_t *c, fsdp2_status_t s, const char *expr, const char *file, int line);
#define OK(c, call) check_ok((c), (call), #call, __FILE__, __LINE__)

/* call must fail with `want` (FSDP2_SUCCESS: any error) and fsdp2_last_error() must
 * contain every non-NULL needle. */
int check_refused(const rank_ctx_t *c, fsdp2_status_t s, fsdp2_status_t want, const char *needle1,
                  const char *needle2, const char *expr, const char *file, int line);
#define REFUSED(c, call, want, n1, n2) \
    check_refused((c), (call), (want), (n1), (n2), #call, __FILE__, __LINE__)

double value_of(int seed, int slot, int64_t k);
/* torch.chunk's rows of piece r of n rows over ws, written out here. */
void chunk_rows(int64_t n, int ws, int r, int64_t *off, int64_t *len);
int64_t spec_numel(const param_spec_t *s);

/* Every spec the variant declares, in declaration order; returns how many. */
int variant_specs(variant_t v, param_spec_t *out);

fsdp2_mesh_t *mesh_open(rank_ctx_t *c, int *fails);

/* Declares the variant's tree on meta, shards it, materialises it with `seed`, and makes
 * an AdamW (states filled with `seed` too; steps 0) and a state dict of both. A negative
 * seed leaves the parameters on meta, never materialised (zeros, states zero). */
int model_open(rank_ctx_t *c, fsdp2_mesh_t *mesh, variant_t v, int seed, model_t *m);
int model_close(model_t *m);

/* Index of the parameter called fqn in m, or -1. */
int model_find(const model_t *m, const char *fqn);
/* The DTensor of parameter j (s == 0) or of its optimizer state s - 1. */
int model_slot_dtensor(model_t *m, int j, int s, fsdp2_dtensor_t **dt);

/* Writes value_of(seed, ...) into every local shard: parameters, optimizer states and
 * the whole tensors. Not collective. */
int model_fill(model_t *m, int seed);

/* Collective: gathers every parameter and optimizer state whole and compares them bit
 * for bit with value_of(param_seed) (the parameters and the whole tensors) and
 * value_of(state_seed) (the optimizer states); the parameter called `except` (may be
 * NULL) and its states are compared with except_seed instead. */
int model_check(model_t *m, int param_seed, int state_seed, const char *except, int except_seed,
                const char *when);

/* Collective: saves m to dir with the given step and the extra entry who = "test". */
int model_save(model_t *m, const char *dir, int64_t step);
/* Collective: loads dir into m, strict or not, filling *report. */
int model_load(model_t *m, const char *dir, int strict, fsdp2_checkpoint_report_t *report);
/* The optimizer's step count is `want`. */
int model_check_steps(model_t *m, int64_t want, const char *when);

/* Compares n elements of dtype bit for bit; prints the first difference with both
 * values (decimal and bits). */
int compare_bits(const rank_ctx_t *c, const char *what, const char *when, fsdp2_dtype_t dtype,
                 const void *got, const void *want, int64_t n);

#endif
