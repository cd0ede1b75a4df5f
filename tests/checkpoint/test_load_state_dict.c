/* fsdp2_load_state_dict with real processes (ws 1-4): a sharded model takes the values
 * of another sharded model built the same way (shard to shard), and of an unsharded
 * model holding whole tensors (each rank its rows); mismatches are reported or refused
 * as with a checkpoint load. Values are a formula of the global index, checked bitwise
 * through full_tensor. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "../collectives/ranks.h"
#include "../core/check_main.h"

#define OK(c, call) RANK_CHECK(c, (call) == FSDP2_SUCCESS, "%s: %s", #call, fsdp2_last_error())

static const int64_t SHAPES[3][2] = {{7, 13}, {5, 0}, {3, 5}}; /* [5] is 1-D: ndim below */

static float value(int t, int64_t i, int seed)
{
    return (float)(seed * 1000 + t * 100) + (float)i * 0.25f;
}

/* root -> {a (weight [7,13], bias [5]), b (weight [3,5])}; values from seed; sharded
 * over mesh when mesh is not NULL. */
static int build(rank_ctx_t *c, fsdp2_mesh_t *mesh, int seed, int extra, fsdp2_module_t **root,
                 fsdp2_param_t **p)
{
    int fails = 0;
    fsdp2_module_t *a, *b;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fails += OK(c, fsdp2_module_create("", root));
    fails += OK(c, fsdp2_module_create("a", &a));
    fails += OK(c, fsdp2_module_create("b", &b));
    fails += OK(c, fsdp2_module_add_child(*root, a));
    fails += OK(c, fsdp2_module_add_child(*root, b));
    const char *names[3] = {"weight", "bias", "weight"};
    fsdp2_module_t *owners[3] = {a, a, b};
    for (int t = 0; t < 3 + extra; t++) {
        int64_t shape[2] = {SHAPES[t % 3][0], SHAPES[t % 3][1]};
        int ndim = t == 1 ? 1 : 2;
        fsdp2_tensor_t *v;
        fails += OK(c, fsdp2_tensor_empty(cpu, FSDP2_F32, ndim, shape, &v));
        for (int64_t i = 0; i < v->numel; i++)
            ((float *)v->data)[i] = value(t, i, seed);
        fails += OK(c, fsdp2_module_add_param(owners[t % 3], t < 3 ? names[t] : "extra", v, 1, &p[t]));
        fsdp2_tensor_release(v);
    }
    if (mesh) {
        fsdp2_shard_options_t o = FSDP2_SHARD_OPTIONS_INIT;
        o.mesh = mesh;
        fails += OK(c, fsdp2_fully_shard(a, &o));
        fails += OK(c, fsdp2_fully_shard(b, &o));
        fails += OK(c, fsdp2_fully_shard(*root, &o));
    }
    return fails;
}

static int check_values(rank_ctx_t *c, fsdp2_param_t **p, int seed, const char *what)
{
    int fails = 0;
    for (int t = 0; t < 3; t++) {
        fsdp2_dtensor_t *dt;
        fsdp2_tensor_t *full = NULL;
        fails += OK(c, fsdp2_param_sharded(p[t], &dt));
        fails += OK(c, fsdp2_dtensor_full_tensor(dt, NULL, &full));
        for (int64_t i = 0; full && i < full->numel; i++) {
            float got = ((float *)full->data)[i], want = value(t, i, seed);
            if (got != want) {
                fails += RANK_CHECK(c, 0, "%s: tensor %d element %lld is %g, want %g", what, t,
                                    (long long)i, got, want);
                break;
            }
        }
        fsdp2_tensor_release(full);
    }
    return fails;
}

static int body(rank_ctx_t *c)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 20000;
    fsdp2_mesh_t *mesh;
    int ws = c->size;
    int fails = OK(c, fsdp2_mesh_create(c->store, "lsd", c->rank, c->size, 1, &ws, NULL, &go, &mesh));
    if (fails)
        return fails;
    fsdp2_module_t *ra, *rb, *rw, *rx;
    fsdp2_param_t *pa[4], *pb[4], *pw[4], *px[4];
    fails += build(c, mesh, 1, 0, &ra, pa);
    fails += build(c, mesh, 2, 0, &rb, pb);
    fails += build(c, NULL, 3, 0, &rw, pw); /* unsharded: whole tensors */
    fails += build(c, mesh, 4, 1, &rx, px); /* one parameter more */
    fsdp2_state_dict_t *sa, *sb, *sw, *sx;
    fails += OK(c, fsdp2_state_dict_create(ra, NULL, &sa));
    fails += OK(c, fsdp2_state_dict_create(rb, NULL, &sb));
    fails += OK(c, fsdp2_state_dict_create(rw, NULL, &sw));
    fails += OK(c, fsdp2_state_dict_create(rx, NULL, &sx));
    if (fails)
        return fails;

    fsdp2_checkpoint_report_t rep = {.size = sizeof(rep)};
    fails += OK(c, fsdp2_load_state_dict(sb, sa, NULL, &rep));
    fails += RANK_CHECK(c, rep.loaded == 3, "shard to shard loaded %zu", rep.loaded);
    fails += check_values(c, pb, 1, "shard to shard");

    fails += OK(c, fsdp2_load_state_dict(sb, sw, NULL, &rep));
    fails += check_values(c, pb, 3, "whole to shard");

    /* The source has a tensor the destination lacks: strict refuses and changes nothing,
     * non-strict loads the rest and names it. */
    fsdp2_status_t s = fsdp2_load_state_dict(sb, sx, NULL, &rep);
    fails += RANK_CHECK(c, s != FSDP2_SUCCESS && strstr(fsdp2_last_error(), "a.extra"),
                        "strict with an unexpected tensor: %s", fsdp2_last_error());
    fails += check_values(c, pb, 3, "after a refused strict load");
    fsdp2_checkpoint_options_t lax = FSDP2_CHECKPOINT_OPTIONS_INIT;
    lax.strict = 0;
    fails += OK(c, fsdp2_load_state_dict(sb, sx, &lax, &rep));
    fails += RANK_CHECK(c, rep.unexpected == 1 && strstr(rep.unexpected_names, "a.extra") &&
                               rep.loaded == 3,
                        "non-strict: unexpected %zu (%s), loaded %zu", rep.unexpected,
                        rep.unexpected_names, rep.loaded);
    fails += check_values(c, pb, 4, "non-strict");

    fsdp2_state_dict_destroy(sa);
    fsdp2_state_dict_destroy(sb);
    fsdp2_state_dict_destroy(sw);
    fsdp2_state_dict_destroy(sx);
    fsdp2_module_destroy(ra);
    fsdp2_module_destroy(rb);
    fsdp2_module_destroy(rw);
    fsdp2_module_destroy(rx);
    fsdp2_mesh_destroy(mesh);
    return fails;
}

START_TEST(a_sharded_model_takes_the_values_of_shards_and_of_whole_tensors)
{
    ranks_result_t res;
    ck_assert_msg(run_ranks(_i, body, NULL, 20000, 120, &res) == 0, "ws %d: a rank failed", _i);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("load_state_dict");
    TCase *tc = tcase_create("ranks");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, a_sharded_model_takes_the_values_of_shards_and_of_whole_tensors, 1, 5);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
