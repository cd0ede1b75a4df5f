/* Optimizers over the shards of a module tree.
 *
 * Everything a step touches is found and allocated at creation: for each parameter
 * that requires gradients and is sharded, a handle on its local parameter shard, on its
 * local gradient shard and on each state tensor (zeroed Shard(0) DTensors laid out like
 * the parameter), with their raw pointers cached. A step is then one loop over the
 * parameters, each one fused pass over its shard (update_rules.c): no allocation, no
 * lookup, no communication. On a cuda device the shards' pointers and a table of
 * 64 Ki-element chunks are uploaded once at creation, and a step is one multi-tensor
 * launch per dtype on the device's current stream (lib/cuda/cuda_optim.cu: the same
 * arithmetic, bit for bit), asynchronous like the rest of the step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp.h>
#include <fsdp2/optim.h>

#include "core/error.h"
#include "core/options.h"
#include "core/log_internal.h"
#include "core/trace_internal.h"
#include "fsdp/fsdp_internal.h"
#include "optim/optim_internal.h"
#include "core/cuda_loader.h"

typedef struct optim_param {
    const fsdp2_param_t *param;
    fsdp2_dtype_t dtype;
    fsdp2_tensor_t *value, *grad; /* local shards, retained */
    fsdp2_dtensor_t *state[OPTIM_MAX_STATE];
    fsdp2_tensor_t *state_local[OPTIM_MAX_STATE];
    optim_shard_t shard; /* the data pointers of the tensors above */
    double weight_decay, lr_scale; /* its group's; the options' and 1 without one */
} optim_param_t;

/* The device copy of one dtype's shard table and chunk table (cuda). */
typedef struct optim_device_table {
    void *shards; /* optim_shard_t[count] */
    void *chunks; /* fsdp2_cuda_optim_chunk_t[nchunks] */
    size_t count, nchunks;
} optim_device_table_t;

struct fsdp2_optimizer {
    fsdp2_optimizer_options_t options;
    fsdp2_module_t *root;
    int64_t steps;
    uint64_t state_bytes; /* counted in the trace's optimizer_state */
    size_t num_params;
    optim_param_t *params;
    fsdp2_device_t device;          /* where every shard lives */
    int has_schedule;
    fsdp2_lr_schedule_t schedule;
    double base_lr;
    optim_device_table_t tables[2]; /* cuda: f32, f64 */
};

/* torch.optim's names for the per-parameter state. */
static const char *const SGD_STATE[] = {"momentum_buffer"};
static const char *const ADAMW_STATE[] = {"exp_avg", "exp_avg_sq"};
static const char *const ADADELTA_STATE[] = {"square_avg", "acc_delta"};

static const char *kind_name(fsdp2_optimizer_kind_t kind)
{
    switch (kind) {
    case FSDP2_OPTIMIZER_SGD: return "sgd";
    case FSDP2_OPTIMIZER_ADAMW: return "adamw";
    case FSDP2_OPTIMIZER_ADADELTA: return "adadelta";
    }
    return "?";
}

/* The state names of o's rule. SGD without momentum keeps none (torch's buffer stays
 * None), so it allocates nothing. */
static size_t state_names_of(const fsdp2_optimizer_options_t *o, const char *const **names)
{
    switch (o->kind) {
    case FSDP2_OPTIMIZER_SGD:
        *names = SGD_STATE;
        return o->momentum != 0.0 ? 1 : 0;
    case FSDP2_OPTIMIZER_ADAMW:
        *names = ADAMW_STATE;
        return 2;
    case FSDP2_OPTIMIZER_ADADELTA:
        *names = ADADELTA_STATE;
        return 2;
    }
    *names = NULL;
    return 0;
}

/* torch.optim's checks (each constructor's ValueErrors), plus eps > 0: with eps 0 the
 * first AdamW or Adadelta step divides 0 by 0 for every zero gradient. The comparisons
 * are written so that NaN fails them. */
static fsdp2_status_t check_options(const fsdp2_optimizer_options_t *o)
{
    FSDP2_ARG_CHECK(o->kind == FSDP2_OPTIMIZER_SGD || o->kind == FSDP2_OPTIMIZER_ADAMW ||
                        o->kind == FSDP2_OPTIMIZER_ADADELTA,
                    "optimizer options: kind %d is not SGD, ADAMW or ADADELTA", (int)o->kind);
    const char *k = kind_name(o->kind);
    FSDP2_ARG_CHECK(o->lr >= 0.0, "%s: lr %g must be >= 0", k, o->lr);
    FSDP2_ARG_CHECK(o->weight_decay >= 0.0, "%s: weight_decay %g must be >= 0", k,
                    o->weight_decay);
    switch (o->kind) {
    case FSDP2_OPTIMIZER_SGD:
        FSDP2_ARG_CHECK(o->momentum >= 0.0, "sgd: momentum %g must be >= 0", o->momentum);
        FSDP2_ARG_CHECK(isfinite(o->dampening), "sgd: dampening %g must be finite", o->dampening);
        FSDP2_ARG_CHECK(!o->nesterov || (o->momentum > 0.0 && o->dampening == 0.0),
                        "sgd: nesterov needs momentum > 0 and dampening 0 (momentum %g, "
                        "dampening %g)",
                        o->momentum, o->dampening);
        break;
    case FSDP2_OPTIMIZER_ADAMW:
        FSDP2_ARG_CHECK(o->beta1 >= 0.0 && o->beta1 < 1.0, "adamw: beta1 %g is not in [0, 1)",
                        o->beta1);
        FSDP2_ARG_CHECK(o->beta2 >= 0.0 && o->beta2 < 1.0, "adamw: beta2 %g is not in [0, 1)",
                        o->beta2);
        FSDP2_ARG_CHECK(o->eps > 0.0, "adamw: eps %g must be > 0", o->eps);
        break;
    case FSDP2_OPTIMIZER_ADADELTA:
        FSDP2_ARG_CHECK(o->rho >= 0.0 && o->rho <= 1.0, "adadelta: rho %g is not in [0, 1]",
                        o->rho);
        FSDP2_ARG_CHECK(o->eps > 0.0, "adadelta: eps %g must be > 0", o->eps);
        break;
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t optim_state_count(const fsdp2_optimizer_options_t *o, size_t *count)
{
    fsdp2_optimizer_options_t copy = FSDP2_SGD_OPTIONS_INIT(0.0);
    FSDP2_CHECK(fsdp2_options_copy("optimizer options", &copy, sizeof(copy), o, NULL, 0));
    FSDP2_CHECK(check_options(&copy));
    const char *const *names;
    *count = state_names_of(&copy, &names);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t release_param(optim_param_t *op)
{
    fsdp2_tensor_release(op->value);
    fsdp2_tensor_release(op->grad);
    for (int s = 0; s < OPTIM_MAX_STATE; s++) {
        fsdp2_tensor_release(op->state_local[s]);
        fsdp2_dtensor_release(op->state[s]);
    }
    memset(op, 0, sizeof(*op));
    return FSDP2_SUCCESS;
}

static fsdp2_status_t local_of(const fsdp2_dtensor_t *dt, int64_t numel, const char *fqn,
                               const char *what, fsdp2_tensor_t **out)
{
    FSDP2_CHECK(fsdp2_dtensor_to_local(dt, out));
    if ((*out)->numel != numel)
        return fsdp2_error(FSDP2_ERR_INTERNAL,
                           "optimizer: parameter '%s': local %s has %lld elements, the shard %lld",
                           fqn, what, (long long)(*out)->numel, (long long)numel);
    return FSDP2_SUCCESS;
}

/* Fills op for p: its local shards and its zeroed state. op is released by the caller
 * on failure (whatever was filled in). */
static fsdp2_status_t add_param(fsdp2_optimizer_t *opt, const fsdp2_param_t *p,
                                const fsdp2_param_info_t *info, optim_param_t *op)
{
    fsdp2_dtensor_t *value = NULL, *grad = NULL;
    FSDP2_CHECK(fsdp2_param_sharded(p, &value));
    FSDP2_CHECK(fsdp2_param_sharded_grad(p, &grad));
    if (!grad)
        return fsdp2_error(FSDP2_ERR_INTERNAL, "optimizer: parameter '%s' has no sharded gradient",
                           info->fqn);
    fsdp2_dtensor_info_t di;
    FSDP2_CHECK(optim_check_shard("optimizer", info->fqn, value, 1, &di));
    if (opt->num_params == 1)
        opt->device = di.device;
    else if (di.device.type != opt->device.type || di.device.index != opt->device.index)
        return fsdp2_error(FSDP2_ERR_DEVICE_MISMATCH,
                           "optimizer: parameter '%s' is sharded on device type %d index %d, "
                           "the first parameter on type %d index %d: one device per optimizer",
                           info->fqn, (int)di.device.type, di.device.index,
                           (int)opt->device.type, opt->device.index);
    op->param = p;
    op->dtype = di.dtype;
    op->weight_decay = opt->options.weight_decay;
    op->lr_scale = 1.0;
    FSDP2_CHECK(fsdp2_dtensor_to_local(value, &op->value));
    int64_t numel = op->value->numel;
    FSDP2_CHECK(local_of(grad, numel, info->fqn, "gradient", &op->grad));
    fsdp2_mesh_t *mesh = NULL;
    FSDP2_CHECK(fsdp2_dtensor_mesh(value, &mesh));
    const char *const *names;
    size_t count = state_names_of(&opt->options, &names);
    for (size_t s = 0; s < count; s++) {
        FSDP2_CHECK(fsdp2_dtensor_zeros(mesh, di.placements, di.device, di.dtype, di.ndim,
                                        di.shape, &op->state[s]));
        FSDP2_CHECK(local_of(op->state[s], numel, info->fqn, names[s], &op->state_local[s]));
        op->shard.state[s] = op->state_local[s]->data;
    }
    op->shard.numel = numel;
    op->shard.param = op->value->data;
    op->shard.grad = op->grad->data;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t collect_params(fsdp2_optimizer_t *opt)
{
    size_t count = 0;
    FSDP2_CHECK(fsdp2_module_params(opt->root, NULL, 0, &count));
    fsdp2_param_t **all = calloc(count ? count : 1, sizeof(*all));
    opt->params = calloc(count ? count : 1, sizeof(*opt->params));
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (!all || !opt->params) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "optimizer: %zu parameters", count);
        goto cleanup;
    }
    FSDP2_CHECK_GOTO(fsdp2_module_params(opt->root, all, count, &count), status, cleanup);
    for (size_t i = 0; i < count; i++) {
        fsdp2_param_info_t info;
        FSDP2_CHECK_GOTO(fsdp2_param_info(all[i], &info), status, cleanup);
        if (!info.requires_grad || !info.sharded)
            continue;
        /* Counted first so that destroy releases a half-filled entry. */
        optim_param_t *op = &opt->params[opt->num_params++];
        FSDP2_CHECK_GOTO(add_param(opt, all[i], &info, op), status, cleanup);
    }
cleanup:
    free(all);
    return status;
}

static uint64_t state_bytes(const fsdp2_optimizer_t *opt)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < opt->num_params; i++)
        for (int s = 0; s < OPTIM_MAX_STATE; s++)
            bytes += opt->params[i].state_local[s] ? opt->params[i].state_local[s]->nbytes : 0;
    return bytes;
}

/* One dtype's shards and chunks into device memory (blocking, at creation). */
static fsdp2_status_t upload_table(const fsdp2_cuda_module_t *cuda, fsdp2_optimizer_t *opt,
                                   fsdp2_dtype_t dtype, optim_device_table_t *t)
{
    optim_shard_t *shards = calloc(opt->num_params ? opt->num_params : 1, sizeof(*shards));
    if (!shards)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "optimizer: %zu shards", opt->num_params);
    for (size_t i = 0; i < opt->num_params; i++)
        if (opt->params[i].dtype == dtype && opt->params[i].shard.numel > 0)
            shards[t->count++] = opt->params[i].shard;
    t->nchunks = cuda->optim_chunks(shards, t->count);
    fsdp2_cuda_optim_chunk_t *chunks = calloc(t->nchunks ? t->nchunks : 1, sizeof(*chunks));
    fsdp2_status_t status = FSDP2_SUCCESS;
    fsdp2_stream_t *stream = NULL;
    if (!chunks) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "optimizer: %zu chunks", t->nchunks);
        goto cleanup;
    }
    if (t->count == 0)
        goto cleanup;
    cuda->optim_fill_chunks(shards, t->count, chunks);
    FSDP2_CHECK_GOTO(fsdp2_stream_current(opt->device, &stream), status, cleanup);
    FSDP2_CHECK_GOTO(fsdp2_device_alloc(opt->device, t->count * sizeof(*shards), &t->shards),
                     status, cleanup);
    FSDP2_CHECK_GOTO(fsdp2_device_alloc(opt->device, t->nchunks * sizeof(*chunks), &t->chunks),
                     status, cleanup);
    FSDP2_CHECK_GOTO(fsdp2_memcpy_async(t->shards, shards, t->count * sizeof(*shards), stream),
                     status, cleanup);
    FSDP2_CHECK_GOTO(fsdp2_memcpy_async(t->chunks, chunks, t->nchunks * sizeof(*chunks), stream),
                     status, cleanup);
    status = fsdp2_stream_synchronize(stream);
cleanup:
    free(shards);
    free(chunks);
    return status;
}

static fsdp2_status_t upload_tables(fsdp2_optimizer_t *opt)
{
    const fsdp2_cuda_module_t *cuda = NULL;
    FSDP2_CHECK(fsdp2_cuda_module_get(&cuda));
    FSDP2_CHECK(upload_table(cuda, opt, FSDP2_F32, &opt->tables[0]));
    return upload_table(cuda, opt, FSDP2_F64, &opt->tables[1]);
}

fsdp2_status_t fsdp2_optimizer_create(fsdp2_module_t *root, const fsdp2_optimizer_options_t *options,
                                      fsdp2_optimizer_t **out)
{
    FSDP2_ARG_CHECK(out, "optimizer_create: out is NULL");
    *out = NULL;
    FSDP2_ARG_CHECK(root && options, "optimizer_create: root or options is NULL");
    fsdp2_optimizer_options_t copy = FSDP2_SGD_OPTIONS_INIT(0.0);
    FSDP2_CHECK(fsdp2_options_copy("optimizer options", &copy, sizeof(copy), options, NULL, 0));
    options = &copy;
    FSDP2_CHECK(check_options(options));
    fsdp2_optimizer_t *opt = calloc(1, sizeof(*opt));
    if (!opt)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "optimizer_create");
    opt->options = *options;
    opt->root = root;
    fsdp2_status_t status = collect_params(opt);
    if (status == FSDP2_SUCCESS && opt->num_params == 0) {
        char fqn[FSDP2_FQN_MAX];
        fsdp2_module_fqn(root, fqn, sizeof(fqn));
        status = fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                             "optimizer_create: no parameters to train under '%s' (none is "
                             "sharded and requires gradients): was fsdp2_fully_shard called?",
                             fqn[0] ? fqn : "(root)");
    }
    if (status == FSDP2_SUCCESS && opt->device.type == FSDP2_DEVICE_CUDA)
        status = upload_tables(opt);
    if (status != FSDP2_SUCCESS) {
        fsdp2_optimizer_destroy(opt);
        return status;
    }
    opt->state_bytes = state_bytes(opt);
    fsdp2_trace_mem_static(TRACE_MEM_OPTIMIZER_STATE, (int64_t)opt->state_bytes);
    FSDP2_LOG(INFO, OPTIM, "%s: %zu parameters, %llu bytes of state", kind_name(options->kind),
              opt->num_params, (unsigned long long)opt->state_bytes);
    *out = opt;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_optimizer_destroy(fsdp2_optimizer_t *opt)
{
    if (!opt)
        return FSDP2_SUCCESS;
    fsdp2_trace_mem_static(TRACE_MEM_OPTIMIZER_STATE, -(int64_t)opt->state_bytes);
    for (int d = 0; d < 2; d++) { /* only cuda optimizers have them */
        if (opt->tables[d].shards)
            fsdp2_device_free(opt->device, opt->tables[d].shards);
        if (opt->tables[d].chunks)
            fsdp2_device_free(opt->device, opt->tables[d].chunks);
    }
    for (size_t i = 0; opt->params && i < opt->num_params; i++)
        release_param(&opt->params[i]);
    free(opt->params);
    free(opt);
    return FSDP2_SUCCESS;
}

static optim_coeffs_t coeffs_of(const fsdp2_optimizer_t *opt)
{
    const fsdp2_optimizer_options_t *o = &opt->options;
    optim_coeffs_t c;
    memset(&c, 0, sizeof(c));
    c.kind = o->kind;
    c.lr = o->lr;
    c.weight_decay = o->weight_decay;
    c.momentum = o->momentum;
    c.dampening = o->dampening;
    c.nesterov = o->nesterov != 0;
    c.first_step = opt->steps == 0;
    c.beta1 = o->beta1;
    c.beta2 = o->beta2;
    /* torch's AdamW counts steps from 1: the bias corrections of step t = steps + 1. */
    double t = (double)(opt->steps + 1);
    c.bias_correction1 = 1.0 - pow(o->beta1, t);
    c.bias_correction2 = 1.0 - pow(o->beta2, t);
    c.eps = o->eps;
    c.rho = o->rho;
    return c;
}

fsdp2_status_t fsdp2_optimizer_step(fsdp2_optimizer_t *opt)
{
    FSDP2_ARG_CHECK(opt, "optimizer_step: optimizer is NULL");
    FSDP2_CHECK(fsdp_check_backward_closed(opt->root, "optimizer_step"));
    trace_token_t traced = TRACE_NO_TOKEN;
    if (fsdp2_tracing()) {
        trace_op_t op = TRACE_OP_INIT(TRACE_OPTIMIZER);
        op.name = kind_name(opt->options.kind);
        op.module = "";
        op.bytes = opt->state_bytes;
        traced = fsdp2_trace_host_begin(TRACE_TRACK_OPTIMIZER, NULL, &op);
    }
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (opt->has_schedule) {
        double lr = opt->options.lr;
        status = fsdp2_lr_at(&opt->schedule, opt->base_lr, opt->steps + 1, &lr);
        opt->options.lr = lr;
    }
    optim_coeffs_t c = coeffs_of(opt);
    if (status != FSDP2_SUCCESS) {
        /* a schedule refused: nothing updated, the span below still closes */
    } else if (opt->device.type == FSDP2_DEVICE_CUDA) {
        static const fsdp2_dtype_t dtypes[2] = {FSDP2_F32, FSDP2_F64};
        const fsdp2_cuda_module_t *cuda = NULL;
        status = fsdp2_cuda_module_get(&cuda);
        for (int d = 0; d < 2 && status == FSDP2_SUCCESS; d++)
            status = cuda->optim_step(opt->device.index, &c, dtypes[d], opt->tables[d].shards,
                                      opt->tables[d].chunks, opt->tables[d].nchunks);
    } else {
        for (size_t i = 0; i < opt->num_params; i++) {
            const optim_param_t *op = &opt->params[i];
            optim_coeffs_t g = c;
            g.weight_decay = op->weight_decay;
            g.lr = c.lr * op->lr_scale;
            if (op->dtype == FSDP2_F32)
                optim_update_f32(&g, &op->shard);
            else
                optim_update_f64(&g, &op->shard);
        }
    }
    if (status == FSDP2_SUCCESS)
        opt->steps++;
    if (traced >= 0)
        fsdp2_trace_host_end(traced);
    return status;
}

fsdp2_status_t fsdp2_optimizer_add_param_group(fsdp2_optimizer_t *opt,
                                               const fsdp2_param_group_t *group,
                                               fsdp2_param_select_fn select, void *user,
                                               size_t *count)
{
    FSDP2_ARG_CHECK(opt && group && select, "optimizer_add_param_group: NULL argument");
    fsdp2_param_group_t g = FSDP2_PARAM_GROUP_INIT;
    FSDP2_CHECK(fsdp2_options_copy("param_group", &g, sizeof(g), group, NULL, 0));
    FSDP2_ARG_CHECK(g.weight_decay >= 0 && isfinite(g.weight_decay),
                    "param group: weight_decay %g must be finite and >= 0", g.weight_decay);
    FSDP2_ARG_CHECK(g.lr_scale >= 0 && isfinite(g.lr_scale),
                    "param group: lr_scale %g must be finite and >= 0", g.lr_scale);
    if (opt->device.type == FSDP2_DEVICE_CUDA)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "param groups: the shards are on cuda, where the update takes the "
                           "options' hyperparameters only");
    /* Picked first, applied after: a failure changes nothing. */
    unsigned char *pick = calloc(opt->num_params ? opt->num_params : 1, 1);
    if (!pick)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "param group over %zu parameters",
                           opt->num_params);
    size_t picked = 0;
    for (size_t i = 0; i < opt->num_params; i++) {
        fsdp2_param_info_t info;
        fsdp2_status_t s = fsdp2_param_info(opt->params[i].param, &info);
        if (s != FSDP2_SUCCESS) {
            free(pick);
            return s;
        }
        pick[i] = select(&info, user) != 0;
        picked += pick[i];
    }
    for (size_t i = 0; i < opt->num_params; i++) {
        if (pick[i]) {
            opt->params[i].weight_decay = g.weight_decay;
            opt->params[i].lr_scale = g.lr_scale;
        }
    }
    free(pick);
    if (count)
        *count = picked;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_optimizer_set_lr_schedule(fsdp2_optimizer_t *opt,
                                               const fsdp2_lr_schedule_t *schedule,
                                               double base_lr)
{
    FSDP2_ARG_CHECK(opt, "optimizer_set_lr_schedule: optimizer is NULL");
    if (!schedule) {
        opt->has_schedule = 0;
        return FSDP2_SUCCESS;
    }
    double lr;
    FSDP2_CHECK(fsdp2_lr_at(schedule, base_lr, 1, &lr)); /* validates every field */
    opt->schedule = *schedule;
    opt->base_lr = base_lr;
    opt->has_schedule = 1;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_optimizer_lr_schedule(const fsdp2_optimizer_t *opt,
                                           fsdp2_lr_schedule_t *schedule, double *base_lr,
                                           int *on)
{
    FSDP2_ARG_CHECK(opt && schedule && base_lr && on, "optimizer_lr_schedule: NULL argument");
    *on = opt->has_schedule;
    if (opt->has_schedule) {
        *schedule = opt->schedule;
        *base_lr = opt->base_lr;
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_optimizer_state_bytes(const fsdp2_optimizer_t *opt, uint64_t *bytes)
{
    FSDP2_ARG_CHECK(opt && bytes, "optimizer_state_bytes: NULL argument");
    *bytes = opt->state_bytes;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_optimizer_zero_grad(fsdp2_optimizer_t *opt)
{
    FSDP2_ARG_CHECK(opt, "optimizer_zero_grad: optimizer is NULL");
    return fsdp2_module_zero_grad(opt->root);
}

fsdp2_status_t fsdp2_optimizer_set_lr(fsdp2_optimizer_t *opt, double lr)
{
    FSDP2_ARG_CHECK(opt, "optimizer_set_lr: optimizer is NULL");
    FSDP2_ARG_CHECK(lr >= 0.0, "optimizer_set_lr: lr %g must be >= 0", lr);
    opt->options.lr = lr;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_optimizer_lr(const fsdp2_optimizer_t *opt, double *lr)
{
    FSDP2_ARG_CHECK(opt && lr, "optimizer_lr: optimizer or lr is NULL");
    *lr = opt->options.lr;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_optimizer_steps(const fsdp2_optimizer_t *opt, int64_t *steps)
{
    FSDP2_ARG_CHECK(opt && steps, "optimizer_steps: optimizer or steps is NULL");
    *steps = opt->steps;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_optimizer_set_steps(fsdp2_optimizer_t *opt, int64_t steps)
{
    FSDP2_ARG_CHECK(opt, "optimizer_set_steps: optimizer is NULL");
    FSDP2_ARG_CHECK(steps >= 0, "optimizer_set_steps: steps %lld must be >= 0", (long long)steps);
    opt->steps = steps;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_optimizer_state(const fsdp2_optimizer_t *opt, const fsdp2_param_t *param,
                                     const char *name, fsdp2_dtensor_t **state)
{
    FSDP2_ARG_CHECK(state, "optimizer_state: state is NULL");
    *state = NULL;
    FSDP2_ARG_CHECK(opt && param && name, "optimizer_state: optimizer, param or name is NULL");
    const char *const *names;
    size_t count = state_names_of(&opt->options, &names);
    for (size_t i = 0; i < opt->num_params; i++) {
        if (opt->params[i].param != param)
            continue;
        for (size_t s = 0; s < count; s++) {
            if (strcmp(names[s], name) == 0) {
                *state = opt->params[i].state[s];
                return FSDP2_SUCCESS;
            }
        }
        break;
    }
    fsdp2_param_info_t info;
    FSDP2_CHECK(fsdp2_param_info(param, &info));
    return fsdp2_error(FSDP2_ERR_NOT_FOUND, "%s optimizer has no state '%s' for parameter '%s'",
                       kind_name(opt->options.kind), name, info.fqn);
}

fsdp2_status_t fsdp2_optimizer_state_names(const fsdp2_optimizer_t *opt, const char **names,
                                           size_t capacity, size_t *count)
{
    FSDP2_ARG_CHECK(opt && count, "optimizer_state_names: optimizer or count is NULL");
    FSDP2_ARG_CHECK(names || capacity == 0,
                    "optimizer_state_names: names is NULL with capacity %zu", capacity);
    const char *const *all;
    *count = state_names_of(&opt->options, &all);
    for (size_t s = 0; s < *count && s < capacity; s++)
        names[s] = all[s];
    return FSDP2_SUCCESS;
}

fsdp2_status_t optim_check_shard(const char *what, const char *fqn, const fsdp2_dtensor_t *dt,
                                 int allow_cuda, fsdp2_dtensor_info_t *info)
{
    FSDP2_CHECK(fsdp2_dtensor_info(dt, info));
    if (info->device.type != FSDP2_DEVICE_CPU &&
        !(allow_cuda && info->device.type == FSDP2_DEVICE_CUDA)) {
        char dev[FSDP2_DEVICE_NAME_MAX];
        fsdp2_device_format(info->device, dev, sizeof(dev));
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "%s: parameter '%s' is sharded on %s; %s", what,
                           fqn, dev,
                           allow_cuda ? "shards must be on cpu or cuda"
                                      : "this works on cpu shards only");
    }
    if (info->dtype != FSDP2_F32 && info->dtype != FSDP2_F64)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "%s: parameter '%s' is %s; only f32 and f64 shards", what, fqn,
                           fsdp2_dtype_name(info->dtype));
    return FSDP2_SUCCESS;
}
