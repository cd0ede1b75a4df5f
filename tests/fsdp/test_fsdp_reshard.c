/* reshard_after_forward = N (FSDP2's int; ZeRO++'s hpZ), with real processes: after
 * forward each rank keeps its chunk of an N-way split of a layer's whole parameters, and
 * the backward all-gathers them over its block of N ranks.
 *
 * At 4 ranks with N = 2 (on a 1D mesh and on a [1, 4] mesh) the steps match the
 * one-process SGD reference of mlp_model.h, and they are bitwise the steps of the same
 * model with N = 1 (the post-forward shard is a copy of the gathered rows; the backward
 * gathers them back exactly). The memory plan holds a post-forward shard per layer of
 * the size computed here from the shapes (ceil(rows / 2) rows, padded), every other
 * category as with N = 1, and the measured allocation equals the plan through the steps.
 * Values that are not 0, 1 or a divisor of the shard size are refused, naming the value;
 * the control changes N between steps and the plan follows. Which group and how many
 * bytes the backward all-gather moves is checked in the trace (test_fsdp_trace.c). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp.h>

#include "../core/check_main.h"
#include "mlp_model.h"

#define N_BLOCK 2

/* Bytes of layer l's post-forward shard for n ranks (weight and bias, f32). */
static uint64_t post_forward_bytes(int l, int n)
{
    int64_t chunk = (DIM[l + 1] + n - 1) / n;
    return (uint64_t)(chunk * DIM[l] + chunk) * 4;
}

static uint64_t post_forward_total(int n)
{
    uint64_t total = 0;
    for (int l = 0; l < LAYERS; l++)
        total += post_forward_bytes(l, n);
    return total;
}

/* What each layer's parameters were in forward (this rank's process only). */
static float seen_in_forward[LAYERS][2][MAX_OUT * MAX_IN];

/* The whole parameters the backward gathered are bitwise the forward's (the bias too,
 * which this model's backward never reads). */
static int same_as_forward(run_t *r, int layer, int save)
{
    int fails = 0;
    for (int kind = 0; kind < 2 && !fails; kind++) {
        float *data = NULL;
        int64_t n = (int64_t)DIM[layer + 1] * (kind ? 1 : DIM[layer]);
        fails += unsharded_view(r, layer, kind, &data);
        if (fails)
            break;
        if (save) {
            memcpy(seen_in_forward[layer][kind], data, (size_t)n * sizeof(float));
            continue;
        }
        for (int64_t k = 0; k < n; k++) {
            if (memcmp(&data[k], &seen_in_forward[layer][kind][k], sizeof(float)) != 0)
                return RANK_CHECK(r->c, 0,
                                  "step %d: %s.%s[%lld] is %.9g in backward, %.9g in forward",
                                  r->step, LAYER_NAME[layer], kind ? "bias" : "weight",
                                  (long long)k, data[k], seen_in_forward[layer][kind][k]);
        }
    }
    return fails;
}

/* Memory: from the step's start to backward_finish nothing is allocated beyond the plan
 * (the comparisons after it allocate whole tensors of their own). Every layer's whole
 * parameters in backward are its forward's. With N > 1, after each layer's post_forward:
 * sharded again, reporting N. */
static int probe_reshard(run_t *r, probe_point_t at, int layer)
{
    if ((at == PROBE_PRE_FORWARD || at == PROBE_PRE_BACKWARD) && layer >= 0)
        return same_as_forward(r, layer, at == PROBE_PRE_FORWARD);
    if (at == PROBE_STEP_START || at == PROBE_FINISHED)
        return probe_memory(r, at);
    if (at != PROBE_POST_FORWARD || layer < 0 || r->opts.reshard_after_forward != N_BLOCK)
        return 0;
    fsdp2_module_state_t st = state_of(r, r->fc[layer]);
    return RANK_CHECK(r->c, st.unshard_state == FSDP2_SHARDED &&
                                st.reshard_after_forward == N_BLOCK,
                      "step %d: %s is %s with reshard_after_forward %d after post_forward, "
                      "want SHARDED and %d",
                      r->step, LAYER_NAME[layer], unshard_state_name(st.unshard_state),
                      st.reshard_after_forward, N_BLOCK);
}

static int plan_of(run_t *r, fsdp2_memory_plan_t *plan)
{
    memset(plan, 0, sizeof(*plan));
    plan->size = sizeof(*plan);
    return OK(r->c, fsdp2_memory_plan(r->root, plan));
}

/* Trains STEPS steps with reshard_after_forward = n against the reference; the plan is
 * returned in *plan and the final parameters (whole, layer by layer) in *params. */
static int train_with(rank_ctx_t *c, int n, int two_d, fsdp2_memory_plan_t *plan, float *params)
{
    run_t *r = malloc(sizeof(*r));
    int fails = two_d ? run_open_2d(c, r, 1) : run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.reshard_after_forward = n;
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += plan_memory(r, plan);
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_reshard;
    if (!fails)
        fails += run_train(r, &ref, 0, STEPS, 1);
    float *at = params;
    for (int l = 0; l < LAYERS && !fails; l++) {
        for (int kind = 0; kind < 2 && !fails; kind++) {
            fsdp2_dtensor_t *dt = NULL;
            fsdp2_tensor_t *full = NULL;
            fails += OK(c, fsdp2_param_sharded(r->p[l][kind], &dt));
            if (!fails)
                fails += OK(c, fsdp2_dtensor_full_tensor(dt, NULL, &full));
            if (!fails) {
                memcpy(at, full->data, full->nbytes);
                at += full->numel;
            }
            fsdp2_tensor_release(full);
        }
    }
    fails += run_close(r);
    free(r);
    return fails;
}

#define PARAM_FLOATS (7 * 13 + 7 + 5 * 7 + 5 + 3 * 5 + 3)

static int reshard_to_block(rank_ctx_t *c, int two_d)
{
    fsdp2_memory_plan_t one, two;
    static float p1[PARAM_FLOATS], p2[PARAM_FLOATS];
    int fails = train_with(c, 1, two_d, &one, p1);
    if (!fails)
        fails += train_with(c, N_BLOCK, two_d, &two, p2);
    if (fails)
        return fails;
    uint64_t want = post_forward_total(N_BLOCK);
    fails += RANK_CHECK(c, one.post_forward_params == 0 && two.post_forward_params == want &&
                               two.total == one.total + want &&
                               two.sharded_params == one.sharded_params &&
                               two.sharded_grads == one.sharded_grads &&
                               two.unsharded_params == one.unsharded_params &&
                               two.unsharded_grads == one.unsharded_grads &&
                               two.reduce_scatter == one.reduce_scatter,
                        "plans: post-forward %llu (N 1) and %llu (N %d, want %llu); totals %llu "
                        "and %llu; the other categories must agree",
                        (unsigned long long)one.post_forward_params,
                        (unsigned long long)two.post_forward_params, N_BLOCK,
                        (unsigned long long)want, (unsigned long long)one.total,
                        (unsigned long long)two.total);
    for (int k = 0; k < PARAM_FLOATS; k++) {
        if (memcmp(&p1[k], &p2[k], sizeof(float)) != 0)
            return fails + RANK_CHECK(c, 0,
                                      "after %d steps parameter element %d is %.9g with N %d but "
                                      "%.9g with N 1",
                                      STEPS, k, p2[k], N_BLOCK, p1[k]);
    }
    return fails;
}

static int body_block_1d(rank_ctx_t *c)
{
    return reshard_to_block(c, 0);
}

static int body_block_2d(rank_ctx_t *c)
{
    return reshard_to_block(c, 1);
}

/* Bad values at fully_shard and through the control; N changed between steps, the plan
 * following it, the numbers still the reference's. */
static int body_values(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.shard = SHARD_BY_CALLER;
    if (!fails)
        fails += build_model(r, &bo);
    if (fails) {
        run_close(r);
        free(r);
        return fails;
    }
    const int bad[] = {-1, 3, 5, c->size + 1};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (bad[i] > 1 && bad[i] <= c->size && c->size % bad[i] == 0)
            continue; /* a divisor at this world size */
        char needle[48];
        snprintf(needle, sizeof(needle), "reshard_after_forward %d", bad[i]);
        fsdp2_shard_options_t o = r->opts;
        o.reshard_after_forward = bad[i];
        fails += REFUSED(c, fsdp2_fully_shard(r->fc[0], &o), FSDP2_ERR_INVALID_ARGUMENT, needle);
    }
    /* Nothing was sharded by the refusals: shard the tree with the default. */
    for (int l = 0; l < LAYERS && !fails; l++)
        fails += OK(c, fsdp2_fully_shard(r->fc[l], &r->opts));
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(r->root, &r->opts));
    fails += run_bind_hooks(r);
    char needle[48];
    snprintf(needle, sizeof(needle), "reshard_after_forward %d", c->size + 1);
    fails += REFUSED(c, fsdp2_set_reshard_after_forward(r->fc[0], c->size + 1),
                     FSDP2_ERR_INVALID_ARGUMENT, needle);
    ref_model_t ref;
    ref_init(&ref);
    fsdp2_memory_plan_t plan;
    int block = c->size == 4 ? 2 : c->size; /* N = ws is the same as 1 */
    /* Step 0 with 1, steps 1-2 with `block` on every layer, step 3 with 1 again. */
    const int values[] = {1, block, block, 1};
    for (int s = 0; s < 4 && !fails; s++) {
        for (int l = 0; l < LAYERS; l++)
            fails += OK(c, fsdp2_set_reshard_after_forward(r->fc[l], values[s]));
        fails += plan_of(r, &plan);
        uint64_t want = values[s] > 1 && values[s] < c->size ? post_forward_total(values[s]) : 0;
        fails += RANK_CHECK(c, plan.post_forward_params == want,
                            "step %d, N %d: plan's post-forward bytes %llu, want %llu", s,
                            values[s], (unsigned long long)plan.post_forward_params,
                            (unsigned long long)want);
        if (!fails)
            fails += run_train(r, &ref, s, 1, 1);
        if (values[s] > 1 && values[s] < c->size && s == 1 && !fails) {
            /* Mid-step (after forward, before backward) the control is refused. */
            int samples[SAMPLES], n;
            local_samples(r, 0, 1, samples, &n);
            fails += run_forward(r, samples, n);
            fails += REFUSED(c, fsdp2_set_reshard_after_forward(r->fc[0], 1),
                             FSDP2_ERR_INVALID_STATE, "between its forward and its backward");
            fails += OK(c, fsdp2_backward_finish(r->root));
        }
    }
    fails += run_close(r);
    free(r);
    return fails;
}

START_TEST(reshard_to_2_of_4_ranks_matches_sgd_and_full_resharding_bit_for_bit)
{
    run_case(4, body_block_1d, "reshard_after_forward 2 (1D mesh)");
}
END_TEST

START_TEST(reshard_to_2_on_a_1x4_mesh_matches_sgd_and_full_resharding_bit_for_bit)
{
    run_case(4, body_block_2d, "reshard_after_forward 2 ([1, 4] mesh)");
}
END_TEST

START_TEST(bad_values_are_refused_and_n_changes_between_steps_with_the_plan)
{
    run_case(_i, body_values, "reshard_after_forward values");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_reshard");
    TCase *tc = tcase_create("reshard_after_forward_n");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, reshard_to_2_of_4_ranks_matches_sgd_and_full_resharding_bit_for_bit);
    tcase_add_test(tc, reshard_to_2_on_a_1x4_mesh_matches_sgd_and_full_resharding_bit_for_bit);
    tcase_add_loop_test(tc, bad_values_are_refused_and_n_changes_between_steps_with_the_plan, 1, 5);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
