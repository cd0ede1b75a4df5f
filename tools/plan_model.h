/* fsdp2-plan's models: presets, JSON and safetensors headers read into parameters by
 * dotted name, built into a module tree on meta, and the choice of units. */
#ifndef FSDP2_TOOLS_PLAN_MODEL_H
#define FSDP2_TOOLS_PLAN_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <fsdp2/fsdp2.h>

/* Prints "fsdp2-plan: " and the message, exits 2. */
__attribute__((noreturn, format(printf, 1, 2))) void die(const char *fmt, ...);
#define DIE(...) die(__VA_ARGS__)

#define CHECK(call)                                                                  \
    do {                                                                             \
        fsdp2_status_t s_ = (call);                                                  \
        if (s_ != FSDP2_SUCCESS)                                                     \
            DIE("%s: %s", fsdp2_status_name(s_), fsdp2_last_error());                \
    } while (0)

char *xstrdup(const char *s);

/* A dtype by libfsdp2's or safetensors' name; dies naming `where` otherwise. */
fsdp2_dtype_t dtype_of(const char *text, const char *where);

typedef struct model_param {
    char *name;
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
    fsdp2_dtype_t dtype;
    int requires_grad;
} model_param_t;

typedef struct model {
    model_param_t *params;
    size_t count, cap;
    char **tie_name, **tie_target;
    size_t ties;
    size_t skipped; /* safetensors entries that are not floating parameters */
    /* transformer facts for the activation formula (presets) */
    int layers, hidden, heads;
    char source[256];
} model_t;

typedef struct preset {
    const char *name;
    const char *about;
} preset_t;

extern const preset_t PRESETS[];
extern const size_t PRESET_COUNT;

void load_preset(model_t *m, const char *name);
void load_json(model_t *m, const char *path);
void load_safetensors(model_t *m, const char *path);
void load_model_dir(model_t *m, const char *dir);
/* LoRA adapters as peft adds them (--lora r=8,targets=q_proj,v_proj): lora_A [r, in] and
 * lora_B [out, r] beside each 2-D weight whose module path is a target or ends in one;
 * every other parameter frozen. Dies naming a target that matches nothing, or one tied. */
void add_lora(model_t *m, const char *spec);

typedef struct tree {
    fsdp2_module_t *root;
    char **paths;
    fsdp2_module_t **mods;
    size_t count;
} tree_t;

/* The tree of m's parameters on meta, in shard_dtype (the model's own with keep_dtype);
 * parameters matching one of the frozen patterns do not train. */
void build_tree(tree_t *t, const model_t *m, fsdp2_dtype_t shard_dtype, int keep_dtype,
                char *const *frozen, int nfrozen);

typedef struct units {
    const char *pattern; /* NULL: blocks */
    int every;
    char *extra[64]; /* --unit NAME: these modules too */
    int nextra;
} units_t;

/* fsdp2_shard_policy_fn over units_t: blocks (names ending in a number), every module
 * with parameters, a pattern, plus the extra names. */
int unit_policy(const fsdp2_module_t *m, void *ctx);

/* --keep-last: the last unit the policy takes in the tree's order keeps its parameters
 * from forward to backward. */
typedef struct keep_last {
    units_t *units;
    const fsdp2_module_t *last;
} keep_last_t;
void find_last_unit(const fsdp2_module_t *m, keep_last_t *k);
void keep_last_unit(const fsdp2_module_t *unit, fsdp2_shard_options_t *o, void *ctx);

#endif
