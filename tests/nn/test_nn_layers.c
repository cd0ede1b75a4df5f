/* lib/nn against PyTorch: every layer's forward and backward on the inputs of
 * fixtures.txt, whose outputs and gradients PyTorch computed in float64 from the same
 * float32 inputs (make_fixtures.py; the Llama layers through transformers' modules, LoRA through
 * peft's). The layers compute in f32: agreement to 2e-6 of the
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
    NN_OK(fsdp2_nn_linear_forward(x, 5, tw, tb, y, test_ws()));
    assert_close("linear y", y, fixture("linear.y", 30), 30, TOL);
    NN_OK(fsdp2_nn_linear_backward(x, dy, 5, tw, dx, tdw, tdb, test_ws()));
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
    NN_OK(fsdp2_nn_embedding_forward(ids, 9, 0, tw, y));
    assert_close("embedding y", y, fixture("embedding.y", 54), 54, 1e-7);
    NN_OK(fsdp2_nn_embedding_backward(ids, dy, 9, tdw, test_ws()));
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
    NN_OK(fsdp2_nn_layernorm_forward(x, 4, 1e-5f, tw, tb, y, mean, rstd, test_ws()));
    assert_close("layernorm y", y, fixture("layernorm.y", 40), 40, TOL);
    NN_OK(fsdp2_nn_layernorm_backward(x, mean, rstd, dy, 4, tw, dx, tdw, tdb, test_ws()));
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
    NN_OK(fsdp2_nn_gelu_forward(x, 50, y));
    assert_close("gelu y", y, fixture("gelu.y", 50), 50, TOL);
    NN_OK(fsdp2_nn_gelu_backward(x, dy, 50, dx));
    assert_close("gelu dx", dx, fixture("gelu.dx", 50), 50, TOL);
    free(x), free(dy), free(y), free(dx);

    x = fixture_f32("relu.x", 20), dy = fixture_f32("relu.dy", 20);
    y = f32_array(20), dx = f32_array(20);
    NN_OK(fsdp2_nn_relu_forward(x, 20, y));
    assert_close("relu y", y, fixture("relu.y", 20), 20, 1e-7);
    NN_OK(fsdp2_nn_relu_backward(y, dy, 20, dx));
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
    NN_OK(fsdp2_nn_attention_backward(qkv, probs, dy, B, T, C, H, dqkv, &ws));
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
    NN_OK(cross_entropy(logits, targets, 6, 7, -100, 0, &loss, dl, &counted, &correct));
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
    NN_OK(fsdp2_nn_conv2d_backward(x, dy, 3, 6, 5, tw, dx, tdw, tdb, &ws));
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

START_TEST(rmsnorm_and_swiglu_match_transformers)
{
    float *x = fixture_f32("rmsnorm.x", 60), *w = fixture_f32("rmsnorm.w", 12);
    float *dy = fixture_f32("rmsnorm.dy", 60), *y = f32_array(60), *dx = f32_array(60);
    float *dw = f32_array(12), rstd[5];
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 1, 12, 0), *tdw = wrap(dw, FSDP2_F32, 1, 12, 0);
    NN_OK(fsdp2_nn_rmsnorm_forward(x, 5, 1e-6f, tw, y, rstd, test_ws()));
    assert_close("rmsnorm y", y, fixture("rmsnorm.y", 60), 60, TOL);
    NN_OK(fsdp2_nn_rmsnorm_backward(x, rstd, dy, 5, tw, dx, tdw, test_ws()));
    assert_close("rmsnorm dx", dx, fixture("rmsnorm.dx", 60), 60, TOL);
    assert_close("rmsnorm dw", dw, fixture("rmsnorm.dw", 12), 12, TOL);
    fsdp2_tensor_release(tw), fsdp2_tensor_release(tdw);
    free(x), free(w), free(dy), free(y), free(dx), free(dw);

    float *g = fixture_f32("swiglu.gate", 40), *u = fixture_f32("swiglu.up", 40);
    dy = fixture_f32("swiglu.dy", 40), y = f32_array(40);
    float *dg = f32_array(40), *du = f32_array(40);
    NN_OK(fsdp2_nn_swiglu_forward(g, u, 40, y));
    assert_close("swiglu y", y, fixture("swiglu.y", 40), 40, TOL);
    NN_OK(fsdp2_nn_swiglu_backward(g, u, dy, 40, dg, du));
    assert_close("swiglu dgate", dg, fixture("swiglu.dgate", 40), 40, TOL);
    assert_close("swiglu dup", du, fixture("swiglu.dup", 40), 40, TOL);
    free(g), free(u), free(dy), free(y), free(dg), free(du);
}
END_TEST

/* transformers' tables repeat the half's angles: cos and sin [positions, head_dim] */
static void check_rope_table(const char *name, const float *table, int64_t positions,
                             int64_t head_dim)
{
    char key[64];
    int64_t half = head_dim / 2, n = positions * half;
    double *want = malloc(sizeof(double) * (size_t)(2 * n));
    float *got = f32_array(2 * n);
    snprintf(key, sizeof(key), "%s.cos", name);
    const double *cos = fixture(key, positions * head_dim);
    snprintf(key, sizeof(key), "%s.sin", name);
    const double *sin = fixture(key, positions * head_dim);
    for (int64_t t = 0; t < positions; t++) {
        for (int64_t i = 0; i < half; i++) {
            ck_assert(cos[t * head_dim + i] == cos[t * head_dim + half + i]);
            want[t * half + i] = cos[t * head_dim + i];
            want[n + t * half + i] = sin[t * head_dim + i];
            got[t * half + i] = table[t * head_dim + i];
            got[n + t * half + i] = table[t * head_dim + half + i];
        }
    }
    assert_close(name, got, want, 2 * n, 1e-6);
    free(want), free(got);
}

START_TEST(rope_tables_and_rotations_match_transformers_with_llama3_scaling)
{
    const int64_t P = 64, D = 16;
    fsdp2_nn_rope_config_t cfg = FSDP2_NN_ROPE_CONFIG_INIT;
    float *table = f32_array(P * D);
    cfg.theta = 500000.0;
    NN_OK(fsdp2_nn_rope_table(&cfg, D, P, table));
    check_rope_table("rope_default", table, P, D);
    cfg.scaling = FSDP2_NN_ROPE_LLAMA3;
    cfg.factor = 8, cfg.low_freq_factor = 1, cfg.high_freq_factor = 4;
    cfg.original_max_positions = 32;
    NN_OK(fsdp2_nn_rope_table(&cfg, D, P, table));
    check_rope_table("rope_llama3", table, P, D);

    /* q [2, 7, 4 heads, 16], k [2, 7, 2 heads, 16]: forward out of place, backward added */
    const int64_t B = 2, T = 7, nq = B * T * 4 * D, nk = B * T * 2 * D;
    float *q = fixture_f32("rope.q", nq), *k = fixture_f32("rope.k", nk);
    float *dq = fixture_f32("rope.dq", nq), *dk = fixture_f32("rope.dk", nk);
    float *qr = f32_array(nq), *kr = f32_array(nk), *gq = f32_array(nq), *gk = f32_array(nk);
    NN_OK(fsdp2_nn_rope_forward(q, table, B, T, 4, D, P, qr));
    NN_OK(fsdp2_nn_rope_forward(k, table, B, T, 2, D, P, kr));
    assert_close("rope q", qr, fixture("rope.qr", nq), nq, TOL);
    assert_close("rope k", kr, fixture("rope.kr", nk), nk, TOL);
    NN_OK(fsdp2_nn_rope_backward(dq, table, B, T, 4, D, P, gq));
    NN_OK(fsdp2_nn_rope_backward(dk, table, B, T, 2, D, P, gk));
    assert_close("rope dq", gq, fixture("rope.gq", nq), nq, TOL);
    assert_close("rope dk", gk, fixture("rope.gk", nk), nk, TOL);
    free(table), free(q), free(k), free(dq), free(dk), free(qr), free(kr), free(gq), free(gk);
}
END_TEST

START_TEST(grouped_query_attention_matches_transformers_eager_attention)
{
    const int64_t B = 2, T = 7, H = 6, KV = 2, D = 5;
    const int64_t nq = B * T * H * D, nk = B * T * KV * D, np = B * H * T * T;
    float *q = fixture_f32("gqa.q", nq), *k = fixture_f32("gqa.k", nk);
    float *v = fixture_f32("gqa.v", nk), *dy = fixture_f32("gqa.dy", nq);
    float *y = f32_array(nq), *probs = f32_array(np), *dq = f32_array(nq);
    float *dk = f32_array(nk), *dv = f32_array(nk);
    fsdp2_nn_workspace_t ws = workspace_new(WS_BYTES);
    NN_OK(fsdp2_nn_gqa_attention_forward(q, k, v, B, T, H, KV, D, y, probs));
    assert_close("gqa y", y, fixture("gqa.y", nq), nq, TOL);
    assert_close("gqa probs", probs, fixture("gqa.probs", np), np, TOL);
    NN_OK(fsdp2_nn_gqa_attention_backward(q, k, v, probs, dy, B, T, H, KV, D, dq, dk, dv, &ws));
    assert_close("gqa dq", dq, fixture("gqa.dq", nq), nq, 4 * TOL);
    assert_close("gqa dk", dk, fixture("gqa.dk", nk), nk, 4 * TOL);
    assert_close("gqa dv", dv, fixture("gqa.dv", nk), nk, 4 * TOL);
    workspace_free(&ws);
    free(q), free(k), free(v), free(dy), free(y), free(probs), free(dq), free(dk), free(dv);
}
END_TEST

START_TEST(lora_linear_matches_peft_with_a_frozen_base)
{
    float *x = fixture_f32("lora.x", 35), *w = fixture_f32("lora.w", 42);
    float *b = fixture_f32("lora.b", 6), *a = fixture_f32("lora.a", 21);
    float *bb = fixture_f32("lora.bb", 18), *dy = fixture_f32("lora.dy", 30);
    float *y = f32_array(30), *dx = f32_array(35), *da = f32_array(21), *db = f32_array(18);
    fsdp2_tensor_t *tw = wrap(w, FSDP2_F32, 2, 6, 7), *tb = wrap(b, FSDP2_F32, 1, 6, 0);
    fsdp2_tensor_t *ta = wrap(a, FSDP2_F32, 2, 3, 7), *tbb = wrap(bb, FSDP2_F32, 2, 6, 3);
    fsdp2_tensor_t *tda = wrap(da, FSDP2_F32, 2, 3, 7), *tdb = wrap(db, FSDP2_F32, 2, 6, 3);
    fsdp2_nn_lora_t lora = {.a = ta, .b = tbb, .scale = 6.0 / 3};
    fsdp2_nn_workspace_t ws = workspace_new(WS_BYTES);
    NN_OK(fsdp2_nn_lora_forward(x, 5, tw, tb, &lora, y, &ws));
    assert_close("lora y", y, fixture("lora.y", 30), 30, TOL);
    NN_OK(fsdp2_nn_lora_backward(x, dy, 5, tw, &lora, dx, tda, tdb, &ws));
    assert_close("lora dx", dx, fixture("lora.dx", 35), 35, TOL);
    assert_close("lora dA", da, fixture("lora.da", 21), 21, TOL);
    assert_close("lora dB", db, fixture("lora.db", 18), 18, TOL);
    workspace_free(&ws);
    fsdp2_tensor_release(tw), fsdp2_tensor_release(tb), fsdp2_tensor_release(ta);
    fsdp2_tensor_release(tbb), fsdp2_tensor_release(tda), fsdp2_tensor_release(tdb);
    free(x), free(w), free(b), free(a), free(bb), free(dy), free(y), free(dx), free(da), free(db);
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
    tcase_add_test(tc, rmsnorm_and_swiglu_match_transformers);
    tcase_add_test(tc, rope_tables_and_rotations_match_transformers_with_llama3_scaling);
    tcase_add_test(tc, grouped_query_attention_matches_transformers_eager_attention);
    tcase_add_test(tc, lora_linear_matches_peft_with_a_frozen_base);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(nn_layers_suite)
