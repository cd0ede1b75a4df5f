/* fully_shard's schedule and controls, with real processes (1 to 4 ranks): prefetch
 * (implicit, and the explicit forward and backward lists), the memory plan, misuse,
 * explicit unshard, fsdp2_module_run, is_last_backward and reshard_after_backward. Each
 * checks what the control does to the module states and counters, and that the numbers
 * still equal the one-process reference of mlp_model.h. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp.h>
#include <fsdp2/optim.h>

#include "../core/check_main.h"
#include "mlp_model.h"

/* The next module's all-gather is in flight once the current module's pre hook returns
 * (from the second step on, the order is the recorded one). */
static int probe_prefetch(run_t *r, probe_point_t at, int layer)
{
    if (at == PROBE_STEP_START || at == PROBE_BACKWARD_START) {
        r->saved[1] = state_of(r, r->fc[1]).all_gathers;
        return 0;
    }
    int forward_hit = at == PROBE_PRE_FORWARD && layer == 0;
    int backward_hit = at == PROBE_PRE_BACKWARD && layer == 2;
    if (r->step < 1 || !(forward_hit || backward_hit))
        return 0;
    fsdp2_module_state_t st = state_of(r, r->fc[1]);
    return RANK_CHECK(r->c, st.unshard_state != FSDP2_SHARDED && st.all_gathers > r->saved[1],
                      "step %d: after pre_%s(%s), fc2 is %s with %llu all-gathers (%llu when the "
                      "%s began); want its all-gather issued",
                      r->step, forward_hit ? "forward" : "backward", forward_hit ? "fc1" : "fc3",
                      unshard_state_name(st.unshard_state), (unsigned long long)st.all_gathers,
                      (unsigned long long)r->saved[1], forward_hit ? "step" : "backward");
}

static int body_prefetch(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_prefetch;
    if (!fails)
        fails += run_train(r, &ref, 0, 3, 0);
    fails += run_close(r);
    free(r);
    return fails;
}

/* Nothing is allocated inside a step: the peak stays at what the plan allocated. */
static int probe_through_optimizer(run_t *r, probe_point_t at, int layer)
{
    (void)layer;
    if (at == PROBE_STEP_END)
        return OK(r->c, fsdp2_memory_stats_reset_peak(CPU)); /* compare_params allocated */
    if (at != PROBE_OPTIMIZED)
        return 0;
    uint64_t peak = 0, now = cpu_allocated(r, &peak);
    return RANK_CHECK(r->c, peak == r->planned_allocated && now == r->planned_allocated,
                      "step %d: cpu peak %llu and live %llu bytes, want both %llu (as planned)",
                      r->step, (unsigned long long)peak, (unsigned long long)now,
                      (unsigned long long)r->planned_allocated);
}

static int body_memory(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    if (fails)
        goto out;

    uint64_t shard_elems = 0;
    for (int l = 0; l < LAYERS; l++)
        shard_elems += (uint64_t)((DIM[l + 1] + c->size - 1) / c->size) * (DIM[l] + 1);
    fsdp2_memory_plan_t plan;
    memset(&plan, 0, sizeof(plan));
    plan.size = sizeof(plan);
    uint64_t before = cpu_allocated(r, NULL);
    fails += OK(c, fsdp2_memory_plan(r->root, &plan));
    uint64_t after = cpu_allocated(r, NULL);
    if (fails)
        goto out;
    uint64_t sum = plan.sharded_params + plan.sharded_grads + plan.unsharded_params +
                   plan.unsharded_grads + plan.reduce_scatter;
    fails += RANK_CHECK(c, plan.total == sum, "plan total %llu, categories add up to %llu",
                        (unsigned long long)plan.total, (unsigned long long)sum);
    fails += RANK_CHECK(c, plan.sharded_params == 4 * shard_elems &&
                               plan.sharded_grads == 4 * shard_elems,
                        "plan: sharded params %llu, grads %llu bytes; want both %llu (padded "
                        "chunks, f32)",
                        (unsigned long long)plan.sharded_params,
                        (unsigned long long)plan.sharded_grads,
                        (unsigned long long)(4 * shard_elems));
    /* On one rank the shard is the whole parameter and the library may use it in place,
     * without a ring; the header promises the default ring of two when there is
     * something to gather. */
    if (c->size > 1)
        fails += RANK_CHECK(c, plan.ring_buffers == 2, "plan: %d ring buffers, want 2 (default)",
                            plan.ring_buffers);
    fails += RANK_CHECK(c, after - before == plan.total - plan.sharded_params - plan.sharded_grads,
                        "planning allocated %llu bytes; the plan's total minus the shards "
                        "(allocated by fully_shard) is %llu",
                        (unsigned long long)(after - before),
                        (unsigned long long)(plan.total - plan.sharded_params - plan.sharded_grads));
    /* fully_shard allocated the shards and dropped the declared values. */
    int64_t shard_delta = (int64_t)r->allocated_after_shard - (int64_t)r->allocated_before_shard;
    int64_t want_delta = (int64_t)(plan.sharded_params + plan.sharded_grads) -
                         (int64_t)r->declared_bytes;
    fails += RANK_CHECK(c, shard_delta == want_delta,
                        "fully_shard changed cpu bytes by %lld; want shards %llu minus declared "
                        "values %llu = %lld",
                        (long long)shard_delta,
                        (unsigned long long)(plan.sharded_params + plan.sharded_grads),
                        (unsigned long long)r->declared_bytes, (long long)want_delta);
    /* A second call, from another module of the tree, reports the same and allocates
     * nothing. */
    fsdp2_memory_plan_t again;
    memset(&again, 0, sizeof(again));
    again.size = sizeof(again);
    fails += OK(c, fsdp2_memory_plan(r->fc[1], &again));
    fails += RANK_CHECK(c, again.total == plan.total && cpu_allocated(r, NULL) == after,
                        "second plan: total %llu (first %llu), live %llu (was %llu)",
                        (unsigned long long)again.total, (unsigned long long)plan.total,
                        (unsigned long long)cpu_allocated(r, NULL), (unsigned long long)after);
    if (fails)
        goto out;
    r->planned_allocated = after;
    fails += OK(c, fsdp2_memory_stats_reset_peak(CPU));
    r->probe = probe_through_optimizer;
    fails += run_train(r, &ref, 0, STEPS, 0);
out:
    fails += run_close(r);
    free(r);
    return fails;
}

/* An optimizer over the misuse test's tree, stepped only where it must be refused. */
static fsdp2_optimizer_t *misuse_opt;

/* Mid-step misuse, after which the step goes on. */
static int probe_misuse(run_t *r, probe_point_t at, int layer)
{
    rank_ctx_t *c = r->c;
    if (r->step != 0)
        return 0;
    if (at == PROBE_BACKWARD_END) {
        /* The reduce-scatters may still write the sharded gradients: everything that
         * reads or writes them, and the next step, wait for backward_finish. */
        int fails = REFUSED(c, fsdp2_optimizer_step(misuse_opt), FSDP2_ERR_INVALID_STATE,
                            "fsdp2_backward_finish");
        fails += REFUSED(c, fsdp2_optimizer_zero_grad(misuse_opt), FSDP2_ERR_INVALID_STATE,
                         "fsdp2_backward_finish");
        fails += REFUSED(c, fsdp2_module_zero_grad(r->root), FSDP2_ERR_INVALID_STATE,
                         "fsdp2_backward_finish");
        fails += REFUSED(c, fsdp2_clip_grad_norm(r->root, 1.0, 2.0, NULL),
                         FSDP2_ERR_INVALID_STATE, "fsdp2_backward_finish");
        return fails + REFUSED(c, fsdp2_pre_forward(r->root), FSDP2_ERR_INVALID_STATE,
                               "fsdp2_backward_finish");
    }

    if (at == PROBE_PRE_FORWARD && layer == 0)
        return REFUSED(c, fsdp2_reshard(r->fc[0]), FSDP2_SUCCESS, "fc1");
    if (at == PROBE_POST_FORWARD && layer == 1)
        return REFUSED(c, fsdp2_post_forward(r->fc[1]), FSDP2_ERR_INVALID_STATE, "fc2");
    if (at == PROBE_POST_BACKWARD && layer == 2)
        return REFUSED(c, fsdp2_post_backward(r->fc[2]), FSDP2_ERR_INVALID_STATE, "fc3");
    if (at == PROBE_STEP_END) {
        /* Between steps: a backward with no forward, a post_forward with no pre, a
         * child's forward outside its root's. */
        int fails = REFUSED(c, fsdp2_pre_backward(r->fc[0]), FSDP2_ERR_INVALID_STATE, "fc1");
        fails += REFUSED(c, fsdp2_post_forward(r->fc[2]), FSDP2_ERR_INVALID_STATE, "fc3");
        return fails + REFUSED(c, fsdp2_pre_forward(r->fc[1]), FSDP2_ERR_INVALID_STATE,
                               "'fc2' outside its root's forward");
    }
    return 0;
}

static int body_misuse(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    if (fails)
        goto out;
    fsdp2_tensor_t *t = NULL;
    fails += REFUSED(c, fsdp2_post_forward(r->fc[0]), FSDP2_ERR_INVALID_STATE, "fc1");
    fails += REFUSED(c, fsdp2_pre_backward(r->fc[0]), FSDP2_ERR_INVALID_STATE, "fc1");
    fails += REFUSED(c, fsdp2_post_backward(r->fc[1]), FSDP2_ERR_INVALID_STATE, "fc2");
    fails += REFUSED(c, fsdp2_fully_shard(r->fc[0], &r->opts), FSDP2_ERR_INVALID_STATE, "fc1");
    fails += REFUSED(c, fsdp2_param_unsharded(r->p[0][0], &t), FSDP2_ERR_INVALID_STATE, "fc1");
    fails += REFUSED(c, fsdp2_param_grad(r->p[0][0], &t), FSDP2_SUCCESS, "fc1");
    fsdp2_tensor_t *extra = NULL;
    int64_t shape[1] = {3};
    fails += OK(c, fsdp2_tensor_zeros(CPU, FSDP2_F32, 1, shape, &extra));
    fails += REFUSED(c, fsdp2_module_add_param(r->fc[0], "extra", extra, 1, NULL), FSDP2_SUCCESS,
                     NULL);
    fsdp2_tensor_release(extra);

    /* A child sharded after its parent, on a second tree over the same mesh. */
    fsdp2_module_t *root2 = NULL, *blk = NULL;
    fails += OK(c, fsdp2_module_create("", &root2));
    fails += OK(c, fsdp2_module_create("blk", &blk));
    fails += OK(c, fsdp2_module_add_child(root2, blk));
    int64_t wshape[2] = {5, 3};
    fsdp2_tensor_t *w = NULL;
    fails += OK(c, fsdp2_tensor_zeros(CPU, FSDP2_F32, 2, wshape, &w));
    if (!fails)
        fails += OK(c, fsdp2_module_add_param(blk, "w", w, 1, NULL));
    fsdp2_tensor_release(w);
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(root2, &r->opts));
    if (!fails)
        fails += REFUSED(c, fsdp2_fully_shard(blk, &r->opts), FSDP2_ERR_INVALID_STATE, "blk");
    fails += OK(c, fsdp2_module_destroy(root2));

    /* The tree still trains, through mid-step refusals too. */
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_misuse;
    fsdp2_optimizer_options_t oo = FSDP2_SGD_OPTIONS_INIT(0.1);
    if (!fails)
        fails += OK(c, fsdp2_optimizer_create(r->root, &oo, &misuse_opt));
    if (!fails)
        fails += run_train(r, &ref, 0, 3, 1);
    fsdp2_optimizer_destroy(misuse_opt);
    misuse_opt = NULL;
out:
    fails += run_close(r);
    free(r);
    return fails;
}

static int probe_explicit(run_t *r, probe_point_t at, int layer)
{
    if (at != PROBE_PRE_FORWARD || layer != 0)
        return 0;
    fsdp2_module_state_t s2 = state_of(r, r->fc[1]), s3 = state_of(r, r->fc[2]);
    return RANK_CHECK(r->c, s2.unshard_state != FSDP2_SHARDED && s3.unshard_state != FSDP2_SHARDED,
                      "step %d: after pre_forward(fc1) with prefetch {fc2, fc3}: fc2 %s, fc3 %s",
                      r->step, unshard_state_name(s2.unshard_state),
                      unshard_state_name(s3.unshard_state));
}

static int body_explicit_prefetch(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.unsharded_buffers = 3;
    if (!fails)
        fails += build_model(r, &bo);
    fsdp2_module_t *next[2];
    if (!fails) {
        next[0] = r->fc[1];
        next[1] = r->fc[2];
        fails += OK(c, fsdp2_set_modules_to_forward_prefetch(r->fc[0], next, 2));
    }
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_explicit;
    if (!fails)
        fails += run_train(r, &ref, 0, 3, 0);
    if (!fails) {
        fsdp2_memory_plan_t plan;
        memset(&plan, 0, sizeof(plan));
        plan.size = sizeof(plan);
        fails += OK(c, fsdp2_memory_plan(r->root, &plan));
        fails += RANK_CHECK(c, plan.ring_buffers == 3, "ring of %d buffers, asked for 3",
                            plan.ring_buffers);
    }
    fails += run_close(r);
    free(r);
    return fails;
}

/* fsdp2_unshard before a step: the event completes, the parameters are whole and hold
 * the current values, and the step that follows uses them. */
static int unshard_ahead(run_t *r, const ref_model_t *ref, int use_event, double tolerance)
{
    rank_ctx_t *c = r->c;
    fsdp2_event_t *done = NULL;
    int fails = OK(c, fsdp2_unshard(r->fc[0], use_event ? &done : NULL));
    if (use_event && !fails) {
        fails += RANK_CHECK(c, done != NULL, "fsdp2_unshard gave no event");
        if (done)
            fails += OK(c, fsdp2_event_wait_timeout(done, GROUP_TIMEOUT_MS));
    }
    fails += OK(c, fsdp2_unshard_wait(r->fc[0]));
    if (fails)
        return fails;
    fsdp2_module_state_t st = state_of(r, r->fc[0]);
    fails += RANK_CHECK(c, st.unshard_state == FSDP2_UNSHARDED,
                        "step %d: fc1 is %s after unshard_wait", r->step,
                        unshard_state_name(st.unshard_state));
    float *W = NULL, *b = NULL;
    fails += unsharded_view(r, 0, 0, &W);
    fails += unsharded_view(r, 0, 1, &b);
    if (!fails) {
        fails += compare_values(r, "fc1.weight (unshard)", W, ref->w[0], DIM[1] * DIM[0],
                                tolerance);
        fails += compare_values(r, "fc1.bias (unshard)", b, ref->b[0], DIM[1], tolerance);
    }
    return fails;
}

static int body_explicit_unshard(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    if (!fails)
        fails += unshard_ahead(r, &ref, 1, 0.0); /* the declared values, bitwise */
    if (!fails)
        fails += run_train(r, &ref, 0, 2, 0);
    r->step = 2;
    if (!fails)
        fails += unshard_ahead(r, &ref, 0, TOLERANCE);
    if (!fails)
        fails += run_train(r, &ref, 2, 2, 0);
    fails += run_close(r);
    free(r);
    return fails;
}

/* set_modules_to_backward_prefetch(fc3, {fc2, fc1}): both are on their way once fc3's
 * pre_backward returns, and each layer is gathered once in the backward (the prefetched
 * parameters are the ones used). */
static int probe_backward_explicit(run_t *r, probe_point_t at, int layer)
{
    if (at == PROBE_BACKWARD_START) {
        for (int l = 0; l < LAYERS; l++)
            r->saved[l] = state_of(r, r->fc[l]).all_gathers;
        return 0;
    }
    int fails = 0;
    if (at == PROBE_PRE_BACKWARD && layer == 2) {
        for (int l = 0; l < 2; l++) {
            fsdp2_module_state_t st = state_of(r, r->fc[l]);
            fails += RANK_CHECK(r->c, st.unshard_state != FSDP2_SHARDED &&
                                          st.all_gathers == r->saved[l] + 1,
                                "step %d: after pre_backward(fc3) with backward prefetch {fc2, "
                                "fc1}: %s is %s with %llu all-gathers (%llu at the backward's "
                                "start), want its all-gather issued",
                                r->step, LAYER_NAME[l], unshard_state_name(st.unshard_state),
                                (unsigned long long)st.all_gathers,
                                (unsigned long long)r->saved[l]);
        }
    }
    if (at == PROBE_FINISHED) {
        for (int l = 0; l < LAYERS; l++) {
            uint64_t n = state_of(r, r->fc[l]).all_gathers;
            fails += RANK_CHECK(r->c, n == r->saved[l] + 1,
                                "step %d: %s was gathered %llu times in the backward, want 1",
                                r->step, LAYER_NAME[l], (unsigned long long)(n - r->saved[l]));
        }
    }
    return fails;
}

static int body_backward_prefetch(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.unsharded_buffers = 3;
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails) {
        fsdp2_module_t *next[2] = {r->fc[1], r->fc[0]};
        fails += OK(c, fsdp2_set_modules_to_backward_prefetch(r->fc[2], next, 2));
    }
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_backward_explicit;
    if (!fails)
        fails += run_train(r, &ref, 0, 3, 1);
    fails += run_close(r);
    free(r);
    return fails;
}

/* Every layer through fsdp2_module_run (layer_fn checks fn gets the module in its
 * FORWARD / BACKWARD state). Some fns fail after their work: module_run returns their
 * status with their message, the post hook ran (AFTER_FORWARD / AFTER_BACKWARD, and the
 * failed backward's gradients were still reduced: the numbers equal the reference). */
static int body_module_run(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    r->use_module_run = 1;
    for (int s = 0; s < 3 && !fails; s++) {
        memset(r->inject, 0, sizeof(r->inject));
        if (s == 0) {
            r->inject[FSDP2_PHASE_FORWARD][0] = 1;
            r->inject[FSDP2_PHASE_BACKWARD][2] = 1;
        } else if (s == 1) {
            r->inject[FSDP2_PHASE_FORWARD][2] = 1;
            r->inject[FSDP2_PHASE_BACKWARD][0] = 1;
        }
        fails += run_train(r, &ref, s, 1, 1);
    }
    fails += run_close(r);
    free(r);
    return fails;
}

/* is_last_backward 0 on the first of two synced micro-batches, 1 on the second: both
 * reduce-scatter, and after the second the sharded gradients are the sum of both. */
static int body_is_last_backward(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    work_t *refwork = malloc(sizeof(*refwork));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    for (int s = 0; s < 3 && !fails; s++) {
        r->step = s;
        for (int micro = 0; micro < 2 && !fails; micro++) {
            fails += OK(c, fsdp2_set_is_last_backward(r->root, micro == 1));
            uint64_t before[LAYERS];
            for (int l = 0; l < LAYERS; l++)
                before[l] = state_of(r, r->fc[l]).reduce_scatters;
            fails += run_micro_batch(r, &ref, refwork, micro, 2);
            for (int l = 0; l < LAYERS && !fails; l++) {
                uint64_t now = state_of(r, r->fc[l]).reduce_scatters;
                fails += RANK_CHECK(c, now == before[l] + 1,
                                    "step %d micro %d (is_last_backward %d): %s reduce_scatters "
                                    "went %llu -> %llu, want +1",
                                    s, micro, micro == 1, LAYER_NAME[l],
                                    (unsigned long long)before[l], (unsigned long long)now);
            }
        }
        if (fails)
            break;
        fails += compare_grads(r, &ref);
        fails += run_sgd(r);
        ref_sgd(&ref);
        fails += compare_params(r, &ref);
    }
    fails += run_close(r);
    free(refwork);
    free(r);
    return fails;
}

/* Every layer in the unsharded state `want` (at `where` of micro-batch r->micro). */
static int check_layers_are(run_t *r, fsdp2_unshard_state_t want, const char *where)
{
    int fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        fsdp2_module_state_t st = state_of(r, r->fc[l]);
        fails += RANK_CHECK(r->c, st.unshard_state == want,
                            "step %d micro %d, %s: %s is %s (reshard_after_backward %d), want %s",
                            r->step, r->micro, where, LAYER_NAME[l],
                            unshard_state_name(st.unshard_state), st.reshard_after_backward,
                            unshard_state_name(want));
    }
    return fails;
}

/* Gradient accumulation with reshard_after_backward 0 on the first micro-batch, as the
 * header describes it: the layers stay whole through its backward and backward_finish,
 * and the second micro-batch's forward gathers nothing. Before the optimizer the whole
 * copies must go: on even steps by setting reshard_after_backward back to 1 before the
 * second backward, on odd steps by fsdp2_reshard after the optimizer. The next step then
 * gathers the updated parameters: its numbers equal the reference. */
static int probe_keep_after_backward(run_t *r, probe_point_t at, int layer)
{
    rank_ctx_t *c = r->c;
    int set_back = r->step % 2 == 0;
    if (r->micro == 0 && at == PROBE_POST_BACKWARD) {
        fsdp2_module_state_t st = state_of(r, r->fc[layer]);
        return RANK_CHECK(c, st.unshard_state == FSDP2_UNSHARDED && st.reshard_after_backward == 0,
                          "step %d: %s is %s after its post_backward with reshard_after_backward "
                          "%d, want UNSHARDED with 0",
                          r->step, LAYER_NAME[layer], unshard_state_name(st.unshard_state),
                          st.reshard_after_backward);
    }
    if (at == PROBE_FINISHED) {
        int whole = r->micro == 0 || !set_back;
        return check_layers_are(r, whole ? FSDP2_UNSHARDED : FSDP2_SHARDED,
                                "after backward_finish");
    }
    if (r->micro != 1)
        return 0;
    if (at == PROBE_STEP_START) {
        for (int l = 0; l < LAYERS; l++)
            r->saved[l] = state_of(r, r->fc[l]).all_gathers;
        return 0;
    }
    if (at == PROBE_PRE_FORWARD) {
        fsdp2_module_state_t st = state_of(r, r->fc[layer]);
        return RANK_CHECK(c, st.unshard_state == FSDP2_UNSHARDED &&
                                 st.all_gathers == r->saved[layer],
                          "step %d micro 1: after pre_forward(%s) it is %s with %llu all-gathers, "
                          "%llu when the forward began; want UNSHARDED with no new all-gather",
                          r->step, LAYER_NAME[layer], unshard_state_name(st.unshard_state),
                          (unsigned long long)st.all_gathers,
                          (unsigned long long)r->saved[layer]);
    }
    if (at == PROBE_BACKWARD_START && set_back)
        return OK(c, fsdp2_set_reshard_after_backward(r->root, 1));
    return 0;
}

static int body_reshard_after_backward(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    work_t *refwork = malloc(sizeof(*refwork));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.unsharded_buffers = 3; /* every layer can stay whole */
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_keep_after_backward;
    for (int s = 0; s < 4 && !fails; s++) {
        r->step = s;
        fails += OK(c, fsdp2_set_reshard_after_backward(r->root, 0));
        fsdp2_module_t *all[LAYERS + 1] = {r->root, r->fc[0], r->fc[1], r->fc[2]};
        for (int m = 0; m <= LAYERS; m++) {
            int flag = state_of(r, all[m]).reshard_after_backward;
            fails += RANK_CHECK(c, flag == 0, "%s: reshard_after_backward %d after setting 0 on "
                                              "the root",
                                m ? LAYER_NAME[m - 1] : "root", flag);
        }
        for (int micro = 0; micro < 2 && !fails; micro++)
            fails += run_micro_batch(r, &ref, refwork, micro, 2);
        if (fails)
            break;
        fails += compare_grads(r, &ref);
        fails += run_sgd(r);
        ref_sgd(&ref);
        if (s % 2 == 1) {
            for (int l = 0; l < LAYERS; l++)
                fails += OK(c, fsdp2_reshard(r->fc[l]));
            fails += OK(c, fsdp2_reshard(r->root));
            fails += check_layers_are(r, FSDP2_SHARDED, "after fsdp2_reshard");
        }
        fails += compare_params(r, &ref);
    }
    fails += run_close(r);
    free(refwork);
    free(r);
    return fails;
}

/* ---------------------------------------------------------------------------------- */

START_TEST(the_next_modules_all_gather_is_issued_by_the_current_modules_pre_hook)
{
    run_case(_i, body_prefetch, "implicit prefetch");
}
END_TEST

START_TEST(explicit_forward_prefetch_unshards_both_listed_modules_early)
{
    run_case(_i, body_explicit_prefetch, "explicit prefetch");
}
END_TEST

START_TEST(explicit_backward_prefetch_unshards_both_listed_modules_at_the_first_pre_backward)
{
    run_case(_i, body_backward_prefetch, "explicit backward prefetch");
}
END_TEST

START_TEST(explicit_unshard_before_the_forward_gives_whole_current_parameters)
{
    run_case(_i, body_explicit_unshard, "explicit unshard");
}
END_TEST

START_TEST(planning_allocates_what_the_plan_reports_and_no_step_allocates_more)
{
    run_case(_i, body_memory, "memory plan");
}
END_TEST

START_TEST(module_run_wraps_fn_in_the_hooks_and_returns_its_error_after_the_post_hook)
{
    run_case(_i, body_module_run, "module_run");
}
END_TEST

START_TEST(is_last_backward_off_on_the_first_micro_batch_still_sums_both_gradients)
{
    run_case(_i, body_is_last_backward, "is_last_backward");
}
END_TEST

START_TEST(reshard_after_backward_off_keeps_layers_whole_until_reshard_and_changes_no_number)
{
    run_case(_i, body_reshard_after_backward, "reshard_after_backward 0");
}
END_TEST

START_TEST(misuse_is_invalid_state_naming_the_module_and_the_tree_still_trains)
{
    run_case(_i, body_misuse, "misuse");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_controls");
    TCase *tc = tcase_create("schedule");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, the_next_modules_all_gather_is_issued_by_the_current_modules_pre_hook, 2, 5);
    tcase_add_loop_test(tc, explicit_forward_prefetch_unshards_both_listed_modules_early, 2, 5);
    tcase_add_loop_test(tc, explicit_backward_prefetch_unshards_both_listed_modules_at_the_first_pre_backward, 2, 5);
    tcase_add_loop_test(tc, explicit_unshard_before_the_forward_gives_whole_current_parameters, 1, 5);
    tcase_add_loop_test(tc, planning_allocates_what_the_plan_reports_and_no_step_allocates_more, 1, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("controls");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, module_run_wraps_fn_in_the_hooks_and_returns_its_error_after_the_post_hook, 1, 5);
    tcase_add_loop_test(tc, is_last_backward_off_on_the_first_micro_batch_still_sums_both_gradients, 1, 5);
    tcase_add_loop_test(tc, reshard_after_backward_off_keeps_layers_whole_until_reshard_and_changes_no_number, 1, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("misuse");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, misuse_is_invalid_state_naming_the_module_and_the_tree_still_trains, 1, 5);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
