/* Tied parameters (fsdp2_module_tie_param) with real processes (1 to 3 ranks): a token
 * table read by an embedding and, under a second name, by an LM head, with a block of
 * its own unit between them. One unsharded tensor serves both uses; the full gradient
 * after the reduce-scatter equals the sum of both uses' gradients computed here by naive
 * loops in double on the whole table. A tie across units is refused, naming both names.
 *
 *   x0 = wte[ids]        (root unit)
 *   x1 = x0 blk.w^T      (unit "blk")
 *   logits = x1 wte^T    (root unit, "head.weight" = "wte.weight")
 *   L = sum(logits * r)
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp.h>
#include <fsdp2/nn.h>

#include "../collectives/ranks.h"
#include "../core/check_main.h"

#define V 7 /* rows: uneven over 2 and 3 ranks */
#define C 5
#define N 5
#define TIMEOUT_MS 20000

static const int32_t IDS[N] = {3, 0, 6, 3, 2};
static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;

static float wte_init(int k)
{
    return (float)(0.3 * sin(0.7 * k + 0.2));
}

static float blk_init(int k)
{
    return (float)(0.4 * cos(1.3 * k));
}

static float r_of(int k)
{
    return (float)(0.5 * sin(2.1 * k + 1.0));
}

static int check_ok(const rank_ctx_t *c, fsdp2_status_t s, const char *expr, int line)
{
    if (s == FSDP2_SUCCESS)
        return 0;
    fprintf(stderr, "rank %d/%d: %s:%d: %s = %s (%s)\n", c->rank, c->size, __FILE__, line, expr,
            fsdp2_status_name(s), fsdp2_last_error());
    return 1;
}
#define OK(c, call) check_ok((c), (call), #call, __LINE__)

static fsdp2_status_t declare(fsdp2_module_t *m, const char *name, int64_t rows, int64_t cols,
                              float (*init)(int), fsdp2_param_t **p)
{
    int64_t shape[2] = {rows, cols};
    fsdp2_tensor_t *t;
    fsdp2_status_t s = fsdp2_tensor_empty(CPU, FSDP2_F32, 2, shape, &t);
    if (s != FSDP2_SUCCESS)
        return s;
    for (int k = 0; k < rows * cols; k++)
        ((float *)t->data)[k] = init(k);
    s = fsdp2_module_add_param(m, name, t, 1, p);
    fsdp2_tensor_release(t);
    return s;
}

/* The gradients of wte and blk.w by naive loops in double. */
static void reference(double *gwte, double *gblk)
{
    double x0[N][C], x1[N][C], dx1[N][C];
    memset(gwte, 0, sizeof(double) * V * C);
    memset(gblk, 0, sizeof(double) * C * C);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++)
            x0[i][j] = wte_init(IDS[i] * C + j);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < C; o++) {
            x1[i][o] = 0;
            for (int j = 0; j < C; j++)
                x1[i][o] += x0[i][j] * blk_init(o * C + j);
        }
    for (int i = 0; i < N; i++) /* the head: d wte[v] += r[i][v] x1[i]; dx1 = r wte */
        for (int j = 0; j < C; j++) {
            dx1[i][j] = 0;
            for (int v = 0; v < V; v++) {
                gwte[v * C + j] += r_of(i * V + v) * x1[i][j];
                dx1[i][j] += r_of(i * V + v) * wte_init(v * C + j);
            }
        }
    for (int i = 0; i < N; i++) /* the block, then the embedding's scatter-add */
        for (int o = 0; o < C; o++)
            for (int j = 0; j < C; j++) {
                gblk[o * C + j] += dx1[i][o] * x0[i][j];
                gwte[IDS[i] * C + j] += dx1[i][o] * blk_init(o * C + j);
            }
}

static int compare_full(rank_ctx_t *c, fsdp2_param_t *p, const double *want, int n,
                        const char *what)
{
    fsdp2_dtensor_t *g = NULL;
    fsdp2_tensor_t *full = NULL;
    int fails = OK(c, fsdp2_param_sharded_grad(p, &g));
    if (!fails)
        fails += OK(c, fsdp2_dtensor_full_tensor(g, NULL, &full));
    for (int k = 0; !fails && k < n; k++) {
        double got = ((float *)full->data)[k];
        fails += RANK_CHECK(c, fabs(got - want[k]) <= 1e-5 * (1 + fabs(want[k])),
                            "%s[%d] = %.9g, reference %.9g", what, k, got, want[k]);
    }
    fsdp2_tensor_release(full);
    return fails;
}

static int forward_backward(rank_ctx_t *c, fsdp2_module_t *root, fsdp2_module_t *blk,
                            fsdp2_param_t *wte, fsdp2_param_t *w)
{
    float x0[N * C] = {0}, x1[N * C] = {0}, logits[N * V], r[N * V];
    float dx1[N * C] = {0}, dx0[N * C] = {0};
    _Alignas(64) char scratch[16384]; /* more than the layers' queries at these sizes */
    fsdp2_nn_workspace_t ws = {scratch, sizeof(scratch)};
    for (int k = 0; k < N * V; k++)
        r[k] = r_of(k);
    fsdp2_param_t *head = NULL;
    fsdp2_tensor_t *tw, *tb, *gw, *gb;
    int fails = OK(c, fsdp2_module_find_param(root, "head.weight", &head));
    fails += RANK_CHECK(c, head == wte, "head.weight is not wte.weight");
    fails += OK(c, fsdp2_pre_forward(root));
    fails += OK(c, fsdp2_param_unsharded(wte, &tw));
    if (fails)
        return fails;
    fails += OK(c, fsdp2_nn_embedding_forward(IDS, N, 0, tw, x0));
    fails += OK(c, fsdp2_pre_forward(blk));
    fails += OK(c, fsdp2_param_unsharded(w, &tb));
    fails += OK(c, fsdp2_nn_linear_forward(x0, N, tb, NULL, x1, &ws));
    fails += OK(c, fsdp2_post_forward(blk));
    fails += OK(c, fsdp2_param_unsharded(head, &tw));
    fails += OK(c, fsdp2_nn_linear_forward(x1, N, tw, NULL, logits, &ws));
    fails += OK(c, fsdp2_post_forward(root));
    fails += OK(c, fsdp2_pre_backward(root));
    fails += OK(c, fsdp2_param_unsharded(head, &tw));
    fails += OK(c, fsdp2_param_grad(head, &gw));
    if (fails)
        return fails;
    fails += OK(c, fsdp2_nn_linear_backward(x1, r, N, tw, dx1, gw, NULL, &ws));
    fails += OK(c, fsdp2_pre_backward(blk));
    fails += OK(c, fsdp2_param_unsharded(w, &tb));
    fails += OK(c, fsdp2_param_grad(w, &gb));
    if (fails)
        return fails;
    fails += OK(c, fsdp2_nn_linear_backward(x0, dx1, N, tb, dx0, gb, NULL, &ws));
    fails += OK(c, fsdp2_post_backward(blk));
    fails += OK(c, fsdp2_param_grad(wte, &gw));
    if (fails)
        return fails;
    fails += OK(c, fsdp2_nn_embedding_backward(IDS, dx0, N, gw, &ws));
    fails += OK(c, fsdp2_post_backward(root));
    return fails + OK(c, fsdp2_backward_finish(root));
}

static int body_tied(rank_ctx_t *c)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = TIMEOUT_MS;
    int ws = c->size;
    fsdp2_mesh_t *mesh = NULL;
    fsdp2_module_t *root = NULL, *emb = NULL, *head = NULL, *blk = NULL;
    fsdp2_param_t *wte = NULL, *w = NULL;
    int fails = OK(c, fsdp2_mesh_create(c->store, "tie", c->rank, c->size, 1, &ws, NULL, &go, &mesh));
    fails += OK(c, fsdp2_module_create("", &root));
    fails += OK(c, fsdp2_module_create("wte", &emb));
    fails += OK(c, fsdp2_module_create("blk", &blk));
    fails += OK(c, fsdp2_module_create("head", &head));
    if (fails)
        goto out;
    fails += OK(c, fsdp2_module_add_child(root, emb));
    fails += OK(c, fsdp2_module_add_child(root, blk));
    fails += OK(c, fsdp2_module_add_child(root, head));
    fails += OK(c, declare(emb, "weight", V, C, wte_init, &wte));
    fails += OK(c, declare(blk, "w", C, C, blk_init, &w));
    fails += OK(c, fsdp2_module_tie_param(head, "weight", wte));
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    so.mesh = mesh;
    fails += OK(c, fsdp2_fully_shard(blk, &so));
    fails += OK(c, fsdp2_fully_shard(root, &so));
    if (fails)
        goto out;
    /* listed once, under its own name */
    size_t count = 0;
    fsdp2_param_t *all[4];
    fails += OK(c, fsdp2_module_params(root, all, 4, &count));
    fails += RANK_CHECK(c, count == 2 && all[0] == wte && all[1] == w,
                        "%zu parameters listed, want wte.weight and blk.w once each", count);
    for (int step = 0; step < 2 && !fails; step++) { /* the second: after a zero_grad */
        fails += forward_backward(c, root, blk, wte, w);
        double gwte[V * C], gblk[C * C];
        reference(gwte, gblk);
        if (!fails)
            fails += compare_full(c, wte, gwte, V * C, "wte grad (embedding + head)");
        if (!fails)
            fails += compare_full(c, w, gblk, C * C, "blk.w grad");
        fails += OK(c, fsdp2_module_zero_grad(root));
    }
    fails += OK(c, fsdp2_module_synchronize(root));
out:
    fsdp2_module_destroy(root);
    fsdp2_mesh_destroy(mesh);
    return fails;
}

/* root{a{w}, b{w tied to a.w}}: sharding a alone and then the root splits the names over
 * two units; so does sharding b alone. Both are refused naming both names. */
static int body_refused(rank_ctx_t *c)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = TIMEOUT_MS;
    int ws = c->size, fails = 0;
    fsdp2_mesh_t *mesh = NULL;
    fails += OK(c, fsdp2_mesh_create(c->store, "tie", c->rank, c->size, 1, &ws, NULL, &go, &mesh));
    for (int shard_b = 0; shard_b < 2 && !fails; shard_b++) {
        fsdp2_module_t *root = NULL, *a = NULL, *b = NULL;
        fsdp2_param_t *p = NULL;
        fails += OK(c, fsdp2_module_create("", &root));
        fails += OK(c, fsdp2_module_create("a", &a));
        fails += OK(c, fsdp2_module_create("b", &b));
        fails += OK(c, fsdp2_module_add_child(root, a));
        fails += OK(c, fsdp2_module_add_child(root, b));
        fails += OK(c, declare(a, "w", 3, 2, wte_init, &p));
        fails += OK(c, fsdp2_module_tie_param(b, "w", p));
        fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
        so.mesh = mesh;
        fsdp2_status_t st;
        if (shard_b) {
            st = fsdp2_fully_shard(b, &so);
        } else {
            fails += OK(c, fsdp2_fully_shard(a, &so));
            st = fsdp2_fully_shard(root, &so);
        }
        const char *msg = fsdp2_last_error();
        fails += RANK_CHECK(c, st == FSDP2_ERR_INVALID_ARGUMENT && strstr(msg, "'b.w'") &&
                                   strstr(msg, "'a.w'"),
                            "a tie across units: %s (%s), want INVALID_ARGUMENT naming b.w and a.w",
                            fsdp2_status_name(st), msg);
        /* a name taken, a target from another tree */
        fsdp2_module_t *other = NULL;
        fails += OK(c, fsdp2_module_create("", &other));
        st = fsdp2_module_tie_param(other, "w", p);
        fails += RANK_CHECK(c, st == FSDP2_ERR_INVALID_ARGUMENT && strstr(fsdp2_last_error(), "another module tree"),
                            "a tie to another tree: %s (%s)", fsdp2_status_name(st), fsdp2_last_error());
        fsdp2_module_destroy(other);
        fsdp2_module_destroy(root);
    }
    fsdp2_mesh_destroy(mesh);
    return fails;
}

static void run_case(int ws, rank_fn body, const char *what)
{
    ranks_result_t res;
    int rc = run_ranks(ws, body, NULL, TIMEOUT_MS, 120, &res);
    ck_assert_msg(rc == 0, "%s with %d ranks: %s (see stderr)", what, ws,
                  res.timed_out ? "timed out" : "a rank failed");
}

START_TEST(a_tied_table_sums_both_uses_gradients_before_its_one_reduce_scatter)
{
    run_case(_i, body_tied, "tied embedding and head");
}
END_TEST

START_TEST(a_tie_split_over_two_units_is_refused_naming_both_names)
{
    run_case(1, body_refused, "ties across units");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_tie");
    TCase *tc = tcase_create("tie");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, a_tied_table_sums_both_uses_gradients_before_its_one_reduce_scatter, 1, 4);
    tcase_add_test(tc, a_tie_split_over_two_units_is_refused_naming_both_names);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
