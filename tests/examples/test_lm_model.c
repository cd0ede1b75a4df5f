/* examples/lm's model against transformers: a tiny random GPT2LMHeadModel and a tiny
 * LlamaForCausalLM (4 query heads over 2 key/value heads, an untied head, Llama 3's rope
 * scaling) with the weights, tokens and targets of lm_gpt2.safetensors and
 * lm_llama.safetensors (make_lm_fixtures.py), where transformers computed in float64 the
 * logits, the mean cross-entropy and every gradient. The model computes in f32 on one
 * rank: logits to 1e-5 of the largest, the loss to 1e-6, every gradient to 1e-4 of its
 * largest element; with bf16 parameters, the logits within the error bf16's rounding of
 * the weights explains. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

#include "checkpoint/safetensors.h"

#include "../core/check_main.h"
#include "model.h"

#define FIXTURE(name) LM_FIXTURES "/" name
#define BATCH 2
#define SEQ 8

#define OK(call)                                                                            \
    do {                                                                                    \
        fsdp2_status_t s_ = (call);                                                         \
        ck_assert_msg(s_ == FSDP2_SUCCESS, "%s: %s (%s)", #call, fsdp2_strerror(s_),        \
                      fsdp2_last_error());                                                  \
    } while (0)

static fsdp2_context_t *ctx;
static fsdp2_mesh_t *mesh;

/* The fixture's tensor name as f64 values (F32, F64 or I32), n of them. */
static double *read_f64(const st_file_t *f, const char *name, int64_t n)
{
    const st_entry_t *e = st_find(f, name);
    ck_assert_msg(e != NULL, "%s: no tensor %s", f->path, name);
    size_t elem, bytes = e->end - e->begin;
    OK(fsdp2_dtype_size(e->dtype, &elem));
    ck_assert_msg(bytes == (size_t)n * elem, "%s has %zu bytes, not %lld elements", name, bytes,
                  (long long)n);
    void *raw = malloc(bytes ? bytes : 1);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    OK(st_read(f, e, 0, raw, bytes));
    for (int64_t i = 0; i < n; i++) {
        if (e->dtype == FSDP2_F64)
            v[i] = ((double *)raw)[i];
        else if (e->dtype == FSDP2_F32)
            v[i] = ((float *)raw)[i];
        else
            v[i] = ((int32_t *)raw)[i];
    }
    free(raw);
    return v;
}

/* max |got - want| <= tol * max(1e-3, max |want|), printing the worst element. */
static void assert_close(const char *what, const float *got, const double *want, int64_t n,
                         double tol)
{
    double scale = 1e-3, worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++)
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst))
            worst = e, at = i;
    }
    ck_assert_msg(worst <= tol * scale,
                  "%s: element %lld is %.9g where transformers has %.9g (error %.3g > %.3g)", what,
                  (long long)at, (double)got[at], want[at], worst, tol * scale);
}

static void setup(void)
{
    OK(fsdp2_init(NULL, &ctx));
    OK(fsdp2_context_mesh(ctx, &mesh));
}

static void teardown(void)
{
    fsdp2_finalize(ctx);
}

/* The model's parameters set from the fixture's "param:" tensors; bf16 when asked. */
static lm_model_t *model_from(const st_file_t *f, const lm_config_t *cfg, fsdp2_dtype_t dtype)
{
    lm_model_t *m;
    OK(lm_create(cfg, 1, &m));
    OK(lm_shard(m, mesh, dtype, 1));
    OK(lm_allocate(m, BATCH, 0));
    size_t count;
    OK(fsdp2_module_params(m->root, NULL, 0, &count));
    fsdp2_param_t **params = calloc(count, sizeof(*params));
    OK(fsdp2_module_params(m->root, params, count, &count));
    for (size_t i = 0; i < count; i++) {
        fsdp2_param_info_t info;
        fsdp2_dtensor_t *dt;
        fsdp2_tensor_t *local;
        char key[FSDP2_FQN_MAX + 8];
        OK(fsdp2_param_info(params[i], &info));
        OK(fsdp2_param_sharded(params[i], &dt));
        OK(fsdp2_dtensor_to_local(dt, &local));
        snprintf(key, sizeof(key), "param:%s", info.fqn);
        double *v = read_f64(f, key, local->numel);
        float *dst = local->data; /* one rank: the whole parameter, kept in f32 */
        for (int64_t k = 0; k < local->numel; k++)
            dst[k] = (float)v[k];
        free(v);
        fsdp2_tensor_release(local);
    }
    free(params);
    double *ids = read_f64(f, "ids", BATCH * SEQ), *targets = read_f64(f, "targets", BATCH * SEQ);
    for (int i = 0; i < BATCH * SEQ; i++)
        m->tokens[i] = (int32_t)ids[i], m->targets[i] = (int32_t)targets[i];
    free(ids), free(targets);
    return m;
}

/* The forward's logits (step without backward), the loss and every gradient. */
static void check_against_transformers(const char *path, const lm_config_t *cfg,
                                       int lora_layers)
{
    st_file_t f;
    OK(st_open(path, &f));
    lm_model_t *m = model_from(&f, cfg, FSDP2_F32);
    const int64_t rows = BATCH * SEQ, nl = rows * cfg->vocab;
    double loss, *want = read_f64(&f, "logits", nl), *want_loss = read_f64(&f, "loss", 1);
    OK(lm_step(m, BATCH, 0, rows, &loss));
    assert_close("logits", m->logits, want, nl, 1e-5);
    ck_assert_msg(fabs(loss - want_loss[0]) <= 1e-6 * want_loss[0], "loss %.9g, transformers %.9g",
                  loss, want_loss[0]);
    OK(lm_step(m, BATCH, 1, rows, &loss));
    ck_assert_msg(fabs(loss - want_loss[0]) <= 1e-6 * want_loss[0], "loss %.9g, transformers %.9g",
                  loss, want_loss[0]);
    OK(fsdp2_module_synchronize(m->root));
    size_t count;
    OK(fsdp2_module_params(m->root, NULL, 0, &count));
    fsdp2_param_t **params = calloc(count, sizeof(*params));
    OK(fsdp2_module_params(m->root, params, count, &count));
    int64_t numel = 0, adapters = 0;
    for (size_t i = 0; i < count; i++) {
        fsdp2_param_info_t info;
        fsdp2_dtensor_t *dt;
        fsdp2_tensor_t *g;
        char key[FSDP2_FQN_MAX + 8];
        OK(fsdp2_param_info(params[i], &info));
        snprintf(key, sizeof(key), "grad:%s", info.fqn);
        int adapter = strstr(info.fqn, ".lora_") != NULL;
        adapters += adapter;
        /* under LoRA the base is frozen: no gradient here, none in peft's */
        ck_assert_msg(info.requires_grad == (cfg->lora.r == 0 || adapter), "%s requires_grad %d",
                      info.fqn, info.requires_grad);
        if (!info.requires_grad) {
            ck_assert_msg(st_find(&f, key) == NULL, "peft trains %s", info.fqn);
            int64_t n = 1;
            for (int d = 0; d < info.ndim; d++)
                n *= info.shape[d];
            numel += n;
            continue;
        }
        OK(fsdp2_param_sharded_grad(params[i], &dt));
        OK(fsdp2_dtensor_to_local(dt, &g));
        double *wg = read_f64(&f, key, g->numel);
        assert_close(info.fqn, g->data, wg, g->numel, 1e-4);
        numel += adapter ? 0 : g->numel;
        free(wg);
        fsdp2_tensor_release(g);
    }
    ck_assert_int_eq((int64_t)count - adapters, cfg->arch == LM_LLAMA ? 3 + 9 * cfg->layers
                                                                        : 4 + 12 * cfg->layers);
    ck_assert_int_eq(adapters, 2 * lora_layers);
    ck_assert_int_eq(numel, lm_numel(cfg));
    free(params), free(want), free(want_loss);
    lm_destroy(m);

    /* bf16 parameters: the logits move by what the weights' rounding moves them */
    m = model_from(&f, cfg, FSDP2_BF16);
    want = read_f64(&f, "logits", nl);
    OK(lm_step(m, BATCH, 0, rows, &loss));
    assert_close("bf16 logits", m->logits, want, nl, 3e-2);
    free(want);
    lm_destroy(m);
    st_close(&f);
}

static lm_config_t tiny_llama(void)
{
    lm_config_t cfg = {.arch = LM_LLAMA, .layers = 2, .heads = 4, .kv_heads = 2, .dim = 32,
                       .hidden = 48, .seq = SEQ, .positions = 16, .vocab = 64, .tied = 0,
                       .norm_eps = 1e-6, .rope = FSDP2_NN_ROPE_CONFIG_INIT};
    cfg.rope.scaling = FSDP2_NN_ROPE_LLAMA3;
    cfg.rope.factor = 8, cfg.rope.low_freq_factor = 1, cfg.rope.high_freq_factor = 4;
    cfg.rope.original_max_positions = 4;
    return cfg;
}

START_TEST(gpt2_logits_loss_and_gradients_match_transformers)
{
    lm_config_t cfg = lm_gpt2_config(2, 4, 32, SEQ, 61);
    check_against_transformers(FIXTURE("lm_gpt2.safetensors"), &cfg, 0);
}
END_TEST

/* peft's LoRA (r 4, alpha 8) on c_attn and c_proj (both the attention's and the MLP's, as
 * peft matches names): the frozen base gets no gradient, the adapters peft's */
START_TEST(gpt2_with_lora_adapters_matches_peft)
{
    lm_config_t cfg = lm_gpt2_config(2, 4, 32, SEQ, 61);
    cfg.lora = (lm_lora_t){.r = 4, .alpha = 8, .num_targets = 2,
                           .targets = {"c_attn", "c_proj"}};
    check_against_transformers(FIXTURE("lm_gpt2_lora.safetensors"), &cfg, 3 * 2);
}
END_TEST

START_TEST(llama_with_grouped_heads_and_llama3_rope_matches_transformers)
{
    lm_config_t cfg = tiny_llama();
    check_against_transformers(FIXTURE("lm_llama.safetensors"), &cfg, 0);
}
END_TEST

START_TEST(llama_with_lora_adapters_matches_peft)
{
    lm_config_t cfg = tiny_llama();
    cfg.lora = (lm_lora_t){.r = 4, .alpha = 8, .num_targets = 3,
                           .targets = {"q_proj", "v_proj", "down_proj"}};
    check_against_transformers(FIXTURE("lm_llama_lora.safetensors"), &cfg, 3 * 2);
}
END_TEST

START_TEST(lora_targets_that_match_nothing_or_a_tied_head_are_refused)
{
    lm_model_t *m = NULL;
    lm_config_t cfg = tiny_llama();
    cfg.lora = (lm_lora_t){.r = 4, .alpha = 8, .num_targets = 2, .targets = {"q_proj", "qproj"}};
    ck_assert_int_eq(lm_create(&cfg, 1, &m), FSDP2_ERR_INVALID_CONFIG);
    lm_destroy(m);
    m = NULL;
    cfg = lm_gpt2_config(2, 4, 32, SEQ, 61);
    cfg.lora = (lm_lora_t){.r = 4, .alpha = 8, .num_targets = 1, .targets = {"lm_head"}};
    ck_assert_int_eq(lm_create(&cfg, 1, &m), FSDP2_ERR_INVALID_CONFIG);
    lm_destroy(m);
    m = NULL;
    cfg.lora.r = 0; /* no adapters: the targets are not looked at */
    OK(lm_create(&cfg, 1, &m));
    lm_destroy(m);
}
END_TEST

static Suite *lm_model_suite(void)
{
    Suite *s = suite_create("lm_model");
    TCase *tc = tcase_create("transformers");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, gpt2_logits_loss_and_gradients_match_transformers);
    tcase_add_test(tc, llama_with_grouped_heads_and_llama3_rope_matches_transformers);
    tcase_add_test(tc, gpt2_with_lora_adapters_matches_peft);
    tcase_add_test(tc, llama_with_lora_adapters_matches_peft);
    tcase_add_test(tc, lora_targets_that_match_nothing_or_a_tied_head_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(lm_model_suite)
