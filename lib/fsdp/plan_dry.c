/* The dry plan behind fsdp2_plan_model: the memory plan of one rank of a [replicas, shard]
 * mesh that need not exist, computed without a process group or a step. Units are chosen
 * and laid out as fsdp2_fully_shard_tree would on that rank, attached to the tree for as
 * long as the plan takes, sized by plan.c's fsdp_plan_sizes (no device memory, stream,
 * group or event is made), and detached again. Beside the memory it reports the
 * parameter counts and what one step's collectives move (calls, payload, bytes this
 * rank sends). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fsdp/fsdp_internal.h"

typedef struct dry {
    const fsdp_dry_options_t *o;
    fsdp_group_t **made; /* every dry group, to undo */
    size_t count;
} dry_t;

/* A group for m laid out as fully_shard would on that rank, attached to the tree as a
 * real one is (so that nested groups' parameters are skipped), until dry_undo. */
static fsdp2_status_t dry_unit(dry_t *d, fsdp2_module_t *m)
{
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(m, fqn, sizeof(fqn));
    fsdp_group_t **bigger = realloc(d->made, (d->count + 1) * sizeof(*bigger));
    if (!bigger)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "plan_model: unit '%s'", fqn);
    d->made = bigger;
    fsdp_group_t *g = calloc(1, sizeof(*g));
    if (!g)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "plan_model: unit '%s'", fqn);
    fsdp2_shard_options_t unit = d->o->shard_options;
    if (d->o->unit_options) {
        d->o->unit_options(m, &unit, d->o->unit_options_ctx);
        unit.size = sizeof(unit);
        fsdp2_status_t checked = fsdp_check_shard_options(&unit, fqn);
        if (checked != FSDP2_SUCCESS) {
            free(g);
            return checked;
        }
    }
    const fsdp2_shard_options_t *so = &unit;
    fsdp_group_init(g, m, so);
    g->comm.ws = d->o->shard;
    g->comm.rank = d->o->rank;
    g->comm.replicas = d->o->replicas;
    fsdp2_status_t status = fsdp_group_geometry(g, so, fqn);
    if (status != FSDP2_SUCCESS) {
        fsdp_group_free(g);
        return status;
    }
    for (size_t i = 0; i < g->num_params; i++)
        g->params[i]->group = g;
    m->group = g;
    d->made[d->count++] = g;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t dry_below(dry_t *d, fsdp2_module_t *m)
{
    for (size_t i = 0; i < m->num_children; i++) {
        fsdp2_module_t *c = m->children[i];
        FSDP2_CHECK(dry_below(d, c));
        if (c->group)
            continue;
        int64_t n = fsdp_unowned_numel(c);
        int take = d->o->policy ? d->o->policy(c, d->o->policy_ctx)
                                : n > 0 && n >= d->o->min_params;
        if (take)
            FSDP2_CHECK(dry_unit(d, c));
    }
    return FSDP2_SUCCESS;
}

static void dry_undo(dry_t *d)
{
    for (size_t i = 0; i < d->count; i++) {
        fsdp_group_t *g = d->made[i];
        for (size_t j = 0; j < g->num_params; j++)
            g->params[j]->group = NULL;
        g->module->group = NULL;
        fsdp_group_free(g);
    }
    free(d->made);
}

/* Whether m, a module under it, or one above it is sharded. */
static int sharded_above(const fsdp2_module_t *m)
{
    for (const fsdp2_module_t *x = m->parent; x; x = x->parent) {
        if (x->group)
            return 1;
    }
    return 0;
}

static int any_group(const fsdp2_module_t *m)
{
    if (m->group)
        return 1;
    for (size_t i = 0; i < m->num_children; i++) {
        if (any_group(m->children[i]))
            return 1;
    }
    return 0;
}

/* One collective of payload `bytes` over n ranks; this rank sends (n - 1) / n of it, or
 * 2 (n - 1) / n for an all-reduce (rounded down; written so that nothing overflows where
 * the payload fits). */
static void count(fsdp_dry_collective_t *c, uint64_t bytes, int n, int all_reduce)
{
    uint64_t m = (uint64_t)n, share = bytes / m * (m - 1) + bytes % m * (m - 1) / m;
    c->calls++;
    c->bytes += bytes;
    c->sent += all_reduce ? 2 * share : share;
    c->ranks = n > c->ranks ? n : c->ranks;
}

/* What one step communicates (the schedule's collectives: schedule.c). */
static void dry_collectives(const fsdp_root_t *r, fsdp_dry_report_t *out)
{
    for (size_t i = 0; i < r->num_groups; i++) {
        const fsdp_group_t *g = r->groups[i];
        int ws = g->comm.ws;
        if (ws > 1 && g->layout.shard_numel) {
            uint64_t gathered = (uint64_t)ws * (uint64_t)g->layout.shard_numel * g->mp.pe;
            count(&out->all_gather, gathered, ws, 0); /* forward */
            if (g != r->group && g->controls.reshard_after_forward) { /* the backward's re-gather */
                if (g->pf.ranks)
                    count(&out->block_all_gather,
                          (uint64_t)g->pf.ranks * (uint64_t)g->pf.shard_numel * g->mp.pe,
                          g->pf.ranks, 0);
                else
                    count(&out->all_gather, gathered, ws, 0);
            }
        }
        if (!g->layout.grad_shard_numel)
            continue;
        if (ws > 1)
            count(&out->reduce_scatter,
                  (uint64_t)ws * (uint64_t)g->layout.grad_shard_numel * g->mp.re, ws, 0);
        if (g->comm.replicas > 1)
            count(&out->all_reduce, (uint64_t)g->layout.grad_shard_numel * g->mp.re,
                  g->comm.replicas, 1);
    }
}

fsdp2_status_t fsdp_plan_dry(fsdp2_module_t *root, const fsdp_dry_options_t *o,
                             fsdp_dry_report_t *out)
{
    memset(out, 0, sizeof(*out));
    if (any_group(root) || sharded_above(root))
        return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                           "plan_model: the tree is sharded already (plan it before "
                           "fully_shard, or read fsdp2_memory_plan)");
    dry_t d = {o, NULL, 0};
    fsdp2_status_t status = dry_below(&d, root);
    if (status == FSDP2_SUCCESS && !root->group)
        status = dry_unit(&d, root);
    fsdp_root_t r;
    memset(&r, 0, sizeof(r));
    r.device = o->shard_options.device;
    if (status == FSDP2_SUCCESS)
        status = fsdp_root_collect_groups(&r, root);
    if (status == FSDP2_SUCCESS) {
        fsdp_plan_sizes_t sizes;
        fsdp_plan_sizes(&r, &sizes);
        out->memory = sizes.plan;
        out->units = (int)r.num_groups;
        dry_collectives(&r, out);
        for (size_t i = 0; i < r.num_groups; i++) {
            const fsdp_group_t *g = r.groups[i];
            for (size_t j = 0; j < g->num_params; j++) {
                const fsdp2_param_t *p = g->params[j];
                int64_t numel = p->rows * p->row_numel;
                out->param_numel += numel;
                if (!p->requires_grad)
                    continue;
                out->trained_numel += numel;
                out->local_trained_bytes +=
                    (uint64_t)p->local_rows * (uint64_t)p->row_numel * g->layout.elem;
            }
        }
    }
    free(r.groups);
    dry_undo(&d);
    return status;
}
