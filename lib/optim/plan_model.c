/* fsdp2_plan_model (include/fsdp2/plan.h): the dry FSDP plan of lib/fsdp, plus the
 * optimizer's state. */
#include <string.h>

#include <fsdp2/plan.h>

#include "core/error.h"
#include "core/options.h"
#include "fsdp/fsdp_internal.h"
#include "optim/optim_internal.h"

static fsdp2_plan_collective_t collective(const fsdp_dry_collective_t *c)
{
    return (fsdp2_plan_collective_t){c->calls, c->bytes, c->sent, c->ranks};
}

fsdp2_status_t fsdp2_plan_model(fsdp2_module_t *root, const fsdp2_plan_options_t *options,
                                fsdp2_plan_report_t *report)
{
    FSDP2_ARG_CHECK(root && options && report, "plan_model: root, options or report is NULL");
    fsdp2_plan_options_t copy = FSDP2_PLAN_OPTIONS_INIT;
    FSDP2_CHECK(fsdp2_options_copy("plan_model: options", &copy, sizeof(copy), options, NULL, 0));
    const fsdp2_plan_options_t *o = &copy;
    FSDP2_ARG_CHECK(report->size == sizeof(*report),
                    "plan_model: report size %u is not sizeof(fsdp2_plan_report_t) = %zu",
                    report->size, sizeof(*report));
    FSDP2_ARG_CHECK(o->shard >= 1 && o->shard <= 1048576,
                    "plan_model: shard %d is not in 1..1048576", o->shard);
    FSDP2_ARG_CHECK(o->replicas >= 1 && o->replicas <= 1048576,
                    "plan_model: replicas %d is not in 1..1048576", o->replicas);
    FSDP2_ARG_CHECK(o->rank >= 0 && o->rank < o->shard,
                    "plan_model: rank %d is not in 0..%d (the shard dim's coordinate)", o->rank,
                    o->shard - 1);
    FSDP2_ARG_CHECK(o->min_params >= 0, "plan_model: min_params %lld is negative",
                    (long long)o->min_params);
    fsdp_dry_options_t dopt = {o->replicas, o->shard, o->rank, FSDP2_SHARD_OPTIONS_INIT,
                               o->policy, o->policy_ctx, o->min_params, o->unit_options,
                               o->unit_options_ctx};
    FSDP2_CHECK(fsdp_shard_options_take(o->shard_options, &dopt.shard_options, "(plan_model)"));
    size_t states = 0;
    if (o->optimizer)
        FSDP2_CHECK(optim_state_count(o->optimizer, &states));
    fsdp_dry_report_t dry;
    FSDP2_CHECK(fsdp_plan_dry(root, &dopt, &dry));
    memset(report, 0, sizeof(*report));
    report->size = sizeof(*report);
    report->memory = dry.memory;
    if (__builtin_mul_overflow((uint64_t)states, dry.local_trained_bytes,
                               &report->optimizer_state) ||
        __builtin_add_overflow(dry.memory.total, report->optimizer_state, &report->total))
        return fsdp2_error(FSDP2_ERR_OVERFLOW,
                           "plan_model: the optimizer's %zu states of %llu bytes overflow 64 bits",
                           states, (unsigned long long)dry.local_trained_bytes);
    report->units = dry.units;
    report->param_numel = dry.param_numel;
    report->trained_numel = dry.trained_numel;
    report->all_gather = collective(&dry.all_gather);
    report->block_all_gather = collective(&dry.block_all_gather);
    report->reduce_scatter = collective(&dry.reduce_scatter);
    report->all_reduce = collective(&dry.all_reduce);
    return FSDP2_SUCCESS;
}
