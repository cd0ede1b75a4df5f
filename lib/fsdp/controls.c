/* FSDP2's controls and queries: gradient sync, resharding policy, prefetch lists,
 * parameter views, zero_grad, the state of a module. */
#include <stdlib.h>
#include <string.h>

#include <fsdp2/kernels.h>

#include "collectives/mesh_fail.h"
#include "core/error.h"
#include "fsdp/fsdp_internal.h"

static fsdp2_status_t need_group(const fsdp2_module_t *m, const char *what)
{
    FSDP2_ARG_CHECK(m, "%s: module is NULL", what);
    if (m->group)
        return FSDP2_SUCCESS;
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(m, fqn, sizeof(fqn));
    return fsdp2_error(FSDP2_ERR_INVALID_STATE, "%s: module '%s' is not sharded", what,
                       fqn[0] ? fqn : "(root)");
}

typedef enum setting_kind {
    SETTING_GRADIENT_SYNC,
    SETTING_RESHARD_AFTER_BACKWARD,
} setting_kind_t;

typedef struct setting {
    int value;
    setting_kind_t which;
} setting_t;

static fsdp2_status_t apply(fsdp2_module_t *m, void *arg)
{
    const setting_t *s = arg;
    fsdp_group_t *g = m->group;
    if (!g)
        return FSDP2_SUCCESS;
    if (fsdp_group_in_use(g)) {
        char fqn[FSDP2_FQN_MAX];
        fsdp_module_fqn(m, fqn, sizeof(fqn));
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "module '%s' is between its hooks: change its settings before its "
                           "pre hook or after its post hook",
                           fqn[0] ? fqn : "(root)");
    }
    if (s->which == SETTING_RESHARD_AFTER_BACKWARD) {
        g->controls.reshard_after_backward = s->value;
        return FSDP2_SUCCESS;
    }
    g->controls.requires_gradient_sync = s->value;
    /* No sync: gradients stay whole between backwards, in a buffer of their own. */
    return s->value ? FSDP2_SUCCESS : fsdp_group_accumulator(g);
}

fsdp2_status_t fsdp2_set_requires_gradient_sync(fsdp2_module_t *m, int sync)
{
    FSDP2_ARG_CHECK(m, "set_requires_gradient_sync: module is NULL");
    setting_t s = {sync != 0, SETTING_GRADIENT_SYNC};
    return fsdp_module_walk(m, apply, &s);
}

fsdp2_status_t fsdp2_set_reshard_after_backward(fsdp2_module_t *m, int reshard)
{
    FSDP2_ARG_CHECK(m, "set_reshard_after_backward: module is NULL");
    setting_t s = {reshard != 0, SETTING_RESHARD_AFTER_BACKWARD};
    return fsdp_module_walk(m, apply, &s);
}

fsdp2_status_t fsdp2_set_reshard_after_forward(fsdp2_module_t *m, int reshard)
{
    FSDP2_CHECK(need_group(m, "set_reshard_after_forward"));
    fsdp_group_t *g = m->group;
    if (g->root && g == g->root->group)
        return FSDP2_SUCCESS; /* the root always keeps its parameters through forward */
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(m, fqn, sizeof(fqn));
    if (g->pf.valid || fsdp_group_in_use(g))
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "set_reshard_after_forward: module '%s' is between its forward and "
                           "its backward; change it between steps",
                           fqn);
    if (!reshard && g->root && !g->unsharded.dedicated && g->step.unshard_state != FSDP2_SHARDED)
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "set_reshard_after_forward: module '%s' is unsharded now; reshard it "
                           "first",
                           fqn);
    FSDP2_CHECK(fsdp_group_set_reshard_after_forward(g, reshard, "set_reshard_after_forward"));
    if (!reshard && g->root && !g->unsharded.dedicated)
        FSDP2_CHECK(fsdp_group_own_buffer(g));
    if (g->controls.reshard_after_forward)
        FSDP2_CHECK(fsdp_group_post_forward(g)); /* a no-op until the root plans */
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_set_reduce_scatter_divide_factor(fsdp2_module_t *m, double factor)
{
    FSDP2_CHECK(need_group(m, "set_reduce_scatter_divide_factor"));
    FSDP2_ARG_CHECK(factor == 0 || (factor > 0 && factor < 1e300),
                    "set_reduce_scatter_divide_factor: factor %g is not 0 or a positive number",
                    factor);
    fsdp2_reduce_t avg = FSDP2_REDUCE_AVG_INIT, divided = {FSDP2_REDUCE_SUM, factor, 1.0};
    m->group->controls.reduce = factor == 0 ? avg : divided;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_set_is_last_backward(fsdp2_module_t *m, int is_last)
{
    FSDP2_CHECK(need_group(m, "set_is_last_backward"));
    m->group->controls.is_last_backward = is_last != 0;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t set_prefetch(fsdp2_module_t *m, fsdp2_module_t *const *modules, size_t n,
                                   const char *what, fsdp_prefetch_list_t *list)
{
    FSDP2_CHECK(need_group(m, what));
    FSDP2_ARG_CHECK(n == 0 || modules, "%s: %zu modules but the array is NULL", what, n);
    fsdp_group_t **groups = calloc(n ? n : 1, sizeof(*groups));
    if (!groups)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s", what);
    for (size_t i = 0; i < n; i++) {
        fsdp2_status_t status = need_group(modules[i], what);
        if (status != FSDP2_SUCCESS) {
            free(groups);
            return status;
        }
        groups[i] = modules[i]->group;
    }
    free(list->groups);
    list->groups = groups;
    list->count = n;
    list->is_set = 1;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_set_modules_to_forward_prefetch(fsdp2_module_t *m,
                                                     fsdp2_module_t *const *modules, size_t count)
{
    fsdp_group_t *g = m ? m->group : NULL;
    if (!g)
        return need_group(m, "set_modules_to_forward_prefetch");
    return set_prefetch(m, modules, count, "set_modules_to_forward_prefetch",
                        &g->controls.forward_prefetch);
}

fsdp2_status_t fsdp2_set_modules_to_backward_prefetch(fsdp2_module_t *m,
                                                      fsdp2_module_t *const *modules, size_t count)
{
    fsdp_group_t *g = m ? m->group : NULL;
    if (!g)
        return need_group(m, "set_modules_to_backward_prefetch");
    return set_prefetch(m, modules, count, "set_modules_to_backward_prefetch",
                        &g->controls.backward_prefetch);
}

static fsdp2_status_t param_error(const fsdp2_param_t *p, const char *fmt)
{
    char fqn[FSDP2_FQN_MAX], mfqn[FSDP2_FQN_MAX] = "";
    fsdp_param_fqn(p, fqn, sizeof(fqn));
    if (p->group)
        fsdp_module_fqn(p->group->module, mfqn, sizeof(mfqn));
    return fsdp2_error(FSDP2_ERR_INVALID_STATE, fmt, fqn, mfqn[0] ? mfqn : "(root)");
}

fsdp2_status_t fsdp2_param_unsharded(const fsdp2_param_t *p, fsdp2_tensor_t **t)
{
    FSDP2_ARG_CHECK(p && t, "param or tensor is NULL");
    *t = NULL;
    if (!p->group) {
        /* Ignored (or never sharded): the declared tensor, whole on every rank. */
        if (!p->value || p->value->device.type == FSDP2_DEVICE_META)
            return param_error(p, "parameter '%s' is not sharded and has no values (module '%s')");
        *t = p->value;
        return FSDP2_SUCCESS;
    }
    if (p->group->step.unshard_state != FSDP2_UNSHARDED || !p->unsharded)
        return param_error(p, "parameter '%s' is sharded now: it is whole between the "
                              "pre and post hooks of '%s' (or after fsdp2_unshard_wait)");
    *t = p->unsharded;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_param_grad(const fsdp2_param_t *p, fsdp2_tensor_t **t)
{
    FSDP2_ARG_CHECK(p && t, "param or tensor is NULL");
    *t = NULL;
    if (!p->requires_grad)
        return param_error(p, "parameter '%s' does not require gradients (module '%s')");
    if (!p->group || !p->grad)
        return param_error(p, "parameter '%s' has no gradient buffer now: it exists between "
                              "the pre_backward and post_backward of '%s'");
    *t = p->grad;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t zero_module(fsdp2_module_t *m, void *arg)
{
    fsdp_group_t *g = m->group;
    (void)arg;
    if (!g || !g->layout.grad_shard)
        return FSDP2_SUCCESS;
    fsdp2_stream_t *compute;
    fsdp2_status_t status = fsdp2_stream_current(g->comm.device, &compute);
    if (status == FSDP2_SUCCESS && g->root) {
        /* reductions still adding into the gradients (is_last_backward 0) */
        status = fsdp2_event_record(g->root->streams.rs_done, g->root->streams.rs);
        if (status == FSDP2_SUCCESS)
            status = fsdp2_stream_wait_event(compute, g->root->streams.rs_done);
    }
    if (status == FSDP2_SUCCESS)
        status = fsdp2_fill_async(g->layout.grad_shard->data, g->layout.dtype,
                                  (size_t)g->layout.grad_shard_numel, 0.0, compute);
    /* This rank's gradients are part zeroed: its next step would differ from its peers'. */
    return fsdp2_mesh_fail(g->comm.mesh, status);
}

fsdp2_status_t fsdp2_module_zero_grad(fsdp2_module_t *m)
{
    FSDP2_ARG_CHECK(m, "zero_grad: module is NULL");
    FSDP2_CHECK(fsdp_check_backward_closed(m, "zero_grad"));
    return fsdp_module_walk(m, zero_module, NULL);
}

fsdp2_status_t fsdp2_module_synchronize(fsdp2_module_t *m)
{
    FSDP2_ARG_CHECK(m, "synchronize: module is NULL");
    fsdp2_module_t *rootm = fsdp_root_module(m);
    if (!rootm || !rootm->group->root)
        return FSDP2_SUCCESS;
    fsdp_root_t *r = rootm->group->root;
    fsdp2_status_t c =
        r->streams.ag_copy_in ? fsdp2_stream_synchronize(r->streams.ag_copy_in) : FSDP2_SUCCESS;
    fsdp2_status_t a = fsdp2_stream_synchronize(r->streams.ag);
    fsdp2_status_t b = fsdp2_stream_synchronize(r->streams.rs);
    return c != FSDP2_SUCCESS ? c : a != FSDP2_SUCCESS ? a : b;
}

fsdp2_status_t fsdp2_module_state(const fsdp2_module_t *m, fsdp2_module_state_t *st)
{
    FSDP2_ARG_CHECK(m && st, "module or state is NULL");
    FSDP2_ARG_CHECK(st->size == sizeof(*st),
                    "module_state: size %u is not sizeof(fsdp2_module_state_t) = %zu", st->size,
                    sizeof(*st));
    memset(st, 0, sizeof(*st));
    st->size = sizeof(*st);
    st->buffer = -1;
    const fsdp_group_t *g = m->group;
    if (!g)
        return FSDP2_SUCCESS;
    st->sharded = 1;
    st->is_root = fsdp_root_module((fsdp2_module_t *)m) == m;
    st->training_state = g->step.training_state;
    st->unshard_state = g->step.unshard_state;
    st->buffer = g->step.buffer == FSDP_OWN_BUFFER ? -1 : g->step.buffer;
    st->requires_gradient_sync = g->controls.requires_gradient_sync;
    st->reshard_after_forward = g->pf.ranks ? g->pf.ranks : g->controls.reshard_after_forward;
    st->reshard_after_backward = g->controls.reshard_after_backward;
    st->num_params = g->num_params;
    st->shard_numel = g->layout.shard_numel;
    st->unsharded_numel = g->layout.full_numel;
    st->all_gathers = g->stats.all_gathers;
    st->reduce_scatters = g->stats.reduce_scatters;
    return FSDP2_SUCCESS;
}
