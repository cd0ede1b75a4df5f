/* lib/nn against PyTorch: every layer's forward and backward on the inputs of
 * fixtures.txt, whose outputs and gradients PyTorch computed in float64 from the same
 * float32 inputs (make_fixtures.py). The layers compute in f32: agreement to 2e-6 of the
 * tensor's largest magnitude (1e-7, the fixtures' printing, where no arithmetic happens). Backward results land on buffers holding zeros (the
 * layers add). */
#include "../core/check_main.h"
#include "nn_test_util.h"

#define TOL 2e-6
#define WS_BYTES (8u << 20)

static void setup(void)
{
    fixtures_load(NN_FIXTURES);
}

START_TEST(linear_forward_and_backward_match_pytorch)
{
    float *x = fixture_f32("linear.x", 35), *w = fixture_f32("linear.w", 42);
    float *b = fixture_f32("linear.b", 6), *dy = fixture_f32("linear.dy", 30);
    float *y = f32_array(30), *dx = f32_array(35), *dw = f32_array(42), *db = f32_array(6);
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, 6, 7), *tb = wrap(b, FSDP2_F32, 1, 6, 0);
    fsdp2_tensor_t *tdw = wrap(dw, FSDP2_F32, 2, 6, 7), *tdb = wrap(db, FSDP2_F32, 1, 6, 0);
    NN_OK(fsdp2_nn_linear_forward(x, 5, tw, tb, y, NULL));
    assert_close("linear y", y, fixture("linear.y", 30), 30, TOL);
    NN_OK(fsdp2_nn_linear_backward(x, 5, tw, dy, dx, tdw, tdb, NULL));
    assert_close("linear dx", dx, fixture("linear.dx", 35), 35, TOL);
    assert_close("linear dw", dw, fixture("linear.dw", 42), 42, TOL);
    assert_close("linear db", db, fixture("linear.db", 6), 6, TOL);
    fsdp2_tensor_release(tw);
    fsdp2_tensor_release(tb);
    fsdp2_tensor_release(tdw);
    fsdp2_tensor_release(tdb);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
}
END_TEST

START_TEST(embedding_lookup_and_scatter_add_match_pytorch)
{
    int32_t *ids = fixture_i32("embedding.ids", 9);
    float *w = fixture_f32("embedding.w", 66), *dy = fixture_f32("embedding.dy", 54);
    float *y = f32_array(54), *dw = f32_array(66);
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, 11, 6), *tdw = wrap(dw, FSDP2_F32, 2, 11, 6);
    NN_OK(fsdp2_nn_embedding_forward(ids, 9, tw, y, 0));
    assert_close("embedding y", y, fixture("embedding.y", 54), 54, 1e-7);
    NN_OK(fsdp2_nn_embedding_backward(ids, 9, dy, tdw, NULL));
    assert_close("embedding dw", dw, fixture("embedding.dw", 66), 66, TOL);
    fsdp2_tensor_release(tw);
    fsdp2_tensor_release(tdw);
    free(ids), free(w), free(dy), free(y), free(dw);
}
END_TEST

START_TEST(layernorm_matches_pytorch_on_rows_with_a_large_mean)
{
    float *x = fixture_f32("layernorm.x", 40), *w = fixture_f32("layernorm.w", 10);
    float *b = fixture_f32("layernorm.b", 10), *dy = fixture_f32("layernorm.dy", 40);
    float *y = f32_array(40), *dx = f32_array(40), *dw = f32_array(10), *db = f32_array(10);
    float mean[4], rstd[4];
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 1, 10, 0), *tb = wrap(b, FSDP2_F32, 1, 10, 0);
    fsdp2_tensor_t *tdw = wrap(dw, FSDP2_F32, 1, 10, 0), *tdb = wrap(db, FSDP2_F32, 1, 10, 0);
    NN_OK(fsdp2_nn_layernorm_forward(x, 4, tw, tb, 1e-5f, y, mean, rstd, NULL));
    assert_close("layernorm y", y, fixture("layernorm.y", 40), 40, TOL);
    NN_OK(fsdp2_nn_layernorm_backward(x, 4, tw, mean, rstd, dy, dx, tdw, tdb, NULL));
    assert_close("layernorm dx", dx, fixture("layernorm.dx", 40), 40, 4 * TOL);
    assert_close("layernorm dw", dw, fixture("layernorm.dw", 10), 10, TOL);
    assert_close("layernorm db", db, fixture("layernorm.db", 10), 10, TOL);
    fsdp2_tensor_release(tw);
    fsdp2_tensor_release(tb);
    fsdp2_tensor_release(tdw);
    fsdp2_tensor_release(tdb);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
}
END_TEST

START_TEST(gelu_tanh_and_relu_match_pytorch)
{
    float *x = fixture_f32("gelu.x", 50), *dy = fixture_f32("gelu.dy", 50);
    float *y = f32_array(50), *dx = f32_array(50);
    NN_OK(fsdp2_nn_gelu_forward(x, y, 50));
    assert_close("gelu y", y, fixture("gelu.y", 50), 50, TOL);
    NN_OK(fsdp2_nn_gelu_backward(x, dy, dx, 50));
    assert_close("gelu dx", dx, fixture("gelu.dx", 50), 50, TOL);
    free(x), free(dy), free(y), free(dx);

    x = fixture_f32("relu.x", 20), dy = fixture_f32("relu.dy", 20);
    y = f32_array(20), dx = f32_array(20);
    NN_OK(fsdp2_nn_relu_forward(x, y, 20));
    assert_close("relu y", y, fixture("relu.y", 20), 20, 1e-7);
    NN_OK(fsdp2_nn_relu_backward(y, dy, dx, 20));
    assert_close("relu dx", dx, fixture("relu.dx", 20), 20, 1e-7);
    free(x), free(dy), free(y), free(dx);
}
END_TEST

START_TEST(causal_attention_with_head_dim_5_matches_pytorch)
{
    const int64_t B = 2, T = 6, C = 15, H = 3, nq = B * T * 3 * C, ny = B * T * C;
    float *qkv = fixture_f32("attention.qkv", nq), *dy = fixture_f32("attention.dy", ny);
    float *y = f32_array(ny), *probs = f32_array(B * H * T * T), *dqkv = f32_array(nq);
    fsdp2_nn_workspace_t ws = workspace_new(WS_BYTES);
    NN_OK(fsdp2_nn_attention_forward(qkv, B, T, C, H, y, probs));
    assert_close("attention y", y, fixture("attention.y", ny), ny, TOL);
    assert_close("attention probs", probs, fixture("attention.probs", B * H * T * T),
                 B * H * T * T, TOL);
    NN_OK(fsdp2_nn_attention_backward(qkv, probs, B, T, C, H, dy, dqkv, &ws));
    assert_close("attention dqkv", dqkv, fixture("attention.dqkv", nq), nq, 4 * TOL);
    workspace_free(&ws);
    free(qkv), free(dy), free(y), free(probs), free(dqkv);
}
END_TEST

START_TEST(cross_entropy_with_an_ignored_row_and_mse_match_pytorch)
{
    float *logits = fixture_f32("xent.logits", 42), *dl = f32_array(42);
    int32_t *targets = fixture_i32("xent.targets", 6);
    double loss;
    int64_t counted, correct;
    NN_OK(fsdp2_nn_cross_entropy(logits, targets, 6, 7, -100, 0, &loss, dl, &counted, &correct));
    ck_assert_int_eq(counted, 5);
    ck_assert_msg(fabs(loss - fixture("xent.loss", 1)[0]) < 1e-6, "loss %.9g, PyTorch %.9g", loss,
                  fixture("xent.loss", 1)[0]);
    assert_close("cross-entropy dlogits", dl, fixture("xent.dlogits", 42), 42, TOL);
    /* the argmax hits, counted here by a loop of the test's own */
    int64_t hits = 0;
    for (int r = 0; r < 6; r++) {
        int arg = 0;
        for (int j = 1; j < 7; j++)
            arg = logits[r * 7 + j] > logits[r * 7 + arg] ? j : arg;
        hits += targets[r] != -100 && arg == targets[r];
    }
    ck_assert_int_eq(correct, hits);
    free(logits), free(dl), free(targets);

    float *p = fixture_f32("mse.pred", 8), *t = fixture_f32("mse.target", 8), *dp = f32_array(8);
    NN_OK(fsdp2_nn_mse(p, t, 8, &loss, dp));
    ck_assert_msg(fabs(loss - fixture("mse.loss", 1)[0]) < 1e-6, "mse %.9g, PyTorch %.9g", loss,
                  fixture("mse.loss", 1)[0]);
    assert_close("mse dpred", dp, fixture("mse.dpred", 8), 8, TOL);
    free(p), free(t), free(dp);
}
END_TEST

START_TEST(conv2d_and_max_pooling_match_pytorch)
{
    const int64_t nx = 3 * 2 * 6 * 5, nw = 4 * 2 * 3 * 3, ny = 3 * 4 * 4 * 3;
    float *x = fixture_f32("conv.x", nx), *w = fixture_f32("conv.w", nw);
    float *b = fixture_f32("conv.b", 4), *dy = fixture_f32("conv.dy", ny);
    float *y = f32_array(ny), *dx = f32_array(nx), *dw = f32_array(nw), *db = f32_array(4);
    int64_t shape[4] = {4, 2, 3, 3};
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_tensor_t *tw, *tdw, *tb = wrap(b, FSDP2_F32, 1, 4, 0), *tdb = wrap(db, FSDP2_F32, 1, 4, 0);
    NN_OK(fsdp2_tensor_from_blob(w, cpu, FSDP2_F32, 4, shape, NULL, NULL, &tw));
    NN_OK(fsdp2_tensor_from_blob(dw, cpu, FSDP2_F32, 4, shape, NULL, NULL, &tdw));
    fsdp2_nn_workspace_t ws = workspace_new(WS_BYTES);
    NN_OK(fsdp2_nn_conv2d_forward(x, 3, 6, 5, tw, tb, y, &ws));
    assert_close("conv2d y", y, fixture("conv.y", ny), ny, TOL);
    NN_OK(fsdp2_nn_conv2d_backward(x, 3, 6, 5, tw, dy, dx, tdw, tdb, &ws));
    assert_close("conv2d dx", dx, fixture("conv.dx", nx), nx, TOL);
    assert_close("conv2d dw", dw, fixture("conv.dw", nw), nw, TOL);
    assert_close("conv2d db", db, fixture("conv.db", 4), 4, TOL);
    workspace_free(&ws);
    fsdp2_tensor_release(tw), fsdp2_tensor_release(tdw), fsdp2_tensor_release(tb);
    fsdp2_tensor_release(tdb);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);

    const int64_t px = 2 * 3 * 6 * 7, py = 2 * 3 * 3 * 3;
    x = fixture_f32("pool.x", px), dy = fixture_f32("pool.dy", py);
    y = f32_array(py), dx = f32_array(px);
    int32_t *arg = calloc((size_t)py, sizeof(int32_t));
    NN_OK(fsdp2_nn_maxpool2d_forward(x, 6, 6, 7, y, arg));
    assert_close("maxpool y", y, fixture("pool.y", py), py, 1e-7);
    NN_OK(fsdp2_nn_maxpool2d_backward(dy, arg, 6, 6, 7, dx));
    assert_close("maxpool dx", dx, fixture("pool.dx", px), px, 1e-7);
    free(x), free(dy), free(y), free(dx), free(arg);
}
END_TEST

static Suite *nn_layers_suite(void)
{
    Suite *s = suite_create("nn_layers");
    TCase *tc = tcase_create("pytorch_fixtures");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, linear_forward_and_backward_match_pytorch);
    tcase_add_test(tc, embedding_lookup_and_scatter_add_match_pytorch);
    tcase_add_test(tc, layernorm_matches_pytorch_on_rows_with_a_large_mean);
    tcase_add_test(tc, gelu_tanh_and_relu_match_pytorch);
    tcase_add_test(tc, causal_attention_with_head_dim_5_matches_pytorch);
    tcase_add_test(tc, cross_entropy_with_an_ignored_row_and_mse_match_pytorch);
    tcase_add_test(tc, conv2d_and_max_pooling_match_pytorch);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(nn_layers_suite)
