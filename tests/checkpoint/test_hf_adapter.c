/* PEFT LoRA adapter directories (fsdp2_hf_adapter_*, include/fsdp2/hf_model.h) against the
 * adapters peft's save_pretrained wrote in tests/checkpoint/hf (llama-lora: q_proj and
 * v_proj; gpt2-lora: c_attn and c_proj on Conv1D layers), with NAME.expected reference
 * values computed by PyTorch (make_hf_fixtures.py): the config, the canonical names and
 * shapes, the values read in pieces; an adapter written and read back, named as peft
 * names it; and every refusal with its message. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fsdp2/dtype.h>
#include <fsdp2/hf_model.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

#include "checkpoint/safetensors.h"

#include "../core/check_main.h"
#include "hf_fixtures.h"

/* The whole tensor as f32, read 3 rows at a time. */
static float *read_all(fsdp2_hf_adapter_t *a, const fsdp2_hf_tensor_info_t *t)
{
    size_t cols = (size_t)t->shape[1];
    float *v = malloc(sizeof(float) * (size_t)t->shape[0] * cols);
    for (int64_t r = 0; r < t->shape[0]; r += 3) {
        int64_t rows = t->shape[0] - r < 3 ? t->shape[0] - r : 3;
        ASSERT_OK(fsdp2_hf_adapter_read(a, t->name, r, rows, FSDP2_F32, v + (size_t)r * cols));
    }
    return v;
}

static void check_values(fsdp2_hf_adapter_t *a, const char *expected_name, size_t want_tensors)
{
    expected_t e[64];
    size_t ne = load_expected(expected_name, e, 64), count;
    ASSERT_OK(fsdp2_hf_adapter_num_tensors(a, &count));
    ck_assert_uint_eq(count, want_tensors);
    ck_assert_uint_eq(ne, count);
    for (size_t i = 0; i < count; i++) {
        fsdp2_hf_tensor_info_t t;
        ASSERT_OK(fsdp2_hf_adapter_tensor(a, i, &t));
        const expected_t *x = find_expected(e, ne, t.name);
        ck_assert_msg(x != NULL, "%s is not in %s.expected", t.name, expected_name);
        ck_assert(t.shape[0] == x->rows && t.shape[1] == x->cols);
        float *v = read_all(a, &t);
        double sum = 0, wsum = 0;
        for (size_t k = 0; k < (size_t)(x->rows * x->cols); k++)
            sum += v[k], wsum += (double)v[k] * (double)(k % 7 + 1);
        ck_assert_msg(fabs(sum - x->sum) <= 1e-9 * (1 + fabs(x->sum)) &&
                          fabs(wsum - x->wsum) <= 1e-9 * (1 + fabs(x->wsum)) &&
                          v[0] == (float)x->first && v[x->rows * x->cols - 1] == (float)x->last,
                      "%s: sum %.17g wsum %.17g, reference %.17g %.17g", t.name, sum, wsum,
                      x->sum, x->wsum);
        free(v);
    }
}

START_TEST(peft_adapters_open_with_their_config_names_and_values)
{
    fsdp2_hf_adapter_t *a;
    fsdp2_hf_lora_config_t c = FSDP2_HF_LORA_CONFIG_INIT;
    ASSERT_OK(fsdp2_hf_adapter_open(fixture("llama-lora"), &a));
    ASSERT_OK(fsdp2_hf_adapter_config(a, &c));
    ck_assert(c.r == 4 && c.alpha == 8 && c.dropout == 0.05 && !c.fan_in_fan_out);
    ck_assert_int_eq(c.num_targets, 2);
    ck_assert(!strcmp(c.targets[0], "q_proj") && !strcmp(c.targets[1], "v_proj"));
    ck_assert_str_eq(c.base_model, "tests/checkpoint/hf/llama-f32");
    fsdp2_hf_tensor_info_t t;
    ASSERT_OK(fsdp2_hf_adapter_tensor(a, 0, &t));
    ck_assert_msg(!strncmp(t.name, "model.layers.", 13), "%s", t.name);
    check_values(a, "llama-lora", 2 * 2 * 2);
    ASSERT_OK(fsdp2_hf_adapter_close(a));

    ASSERT_OK(fsdp2_hf_adapter_open(fixture("gpt2-lora"), &a));
    ASSERT_OK(fsdp2_hf_adapter_config(a, &c));
    ck_assert(c.fan_in_fan_out && c.r == 4);
    /* canonical: no "base_model.model." nor "transformer.", and peft's shapes for Conv1D
     * layers: A [r, in], B [out, r] (c_attn: in 32, out 96) */
    float probe[4 * 32];
    ASSERT_OK(fsdp2_hf_adapter_read(a, "h.0.attn.c_attn.lora_A.weight", 0, 4, FSDP2_F32, probe));
    ASSERT_REFUSED(fsdp2_hf_adapter_read(a, "transformer.h.0.attn.c_attn.lora_A.weight", 0, 1,
                                         FSDP2_F32, probe),
                   FSDP2_ERR_NOT_FOUND, "no adapter tensor");
    check_values(a, "gpt2-lora", 2 * 2 * 3); /* c_proj: the attention's and the MLP's */
    fsdp2_hf_config_t cfg = FSDP2_HF_CONFIG_INIT; /* an adapter is no model directory */
    ASSERT_REFUSED(fsdp2_hf_config_read(fixture("gpt2-lora"), &cfg), FSDP2_ERR_IO,
                   "config.json");
    ASSERT_OK(fsdp2_hf_adapter_close(a));
}
END_TEST

START_TEST(an_adapter_written_reads_back_equal_and_named_as_peft_names_it)
{
    fsdp2_hf_adapter_t *a;
    fsdp2_hf_lora_config_t c = FSDP2_HF_LORA_CONFIG_INIT;
    ASSERT_OK(fsdp2_hf_adapter_open(fixture("gpt2-lora"), &a));
    ASSERT_OK(fsdp2_hf_adapter_config(a, &c));
    size_t n;
    ASSERT_OK(fsdp2_hf_adapter_num_tensors(a, &n));
    const char *names[16];
    fsdp2_tensor_t *tensors[16];
    float *values[16];
    for (size_t i = 0; i < n; i++) {
        fsdp2_hf_tensor_info_t t;
        ASSERT_OK(fsdp2_hf_adapter_tensor(a, i, &t));
        names[i] = t.name;
        values[i] = read_all(a, &t);
        ASSERT_OK(fsdp2_tensor_from_blob(values[i], (fsdp2_device_t)FSDP2_DEVICE_CPU_INIT,
                                         FSDP2_F32, 2, t.shape, NULL, NULL, &tensors[i]));
    }
    const char *dir = in_scratch("written");
    ASSERT_OK(fsdp2_hf_adapter_write(dir, &c, FSDP2_HF_GPT2, n, names,
                                     (const fsdp2_tensor_t *const *)tensors));
    ck_assert_int_eq(count_entries(scratch), 1); /* nothing temporary left */
    fsdp2_hf_adapter_t *b;
    ASSERT_OK(fsdp2_hf_adapter_open(dir, &b));
    fsdp2_hf_lora_config_t d = FSDP2_HF_LORA_CONFIG_INIT;
    ASSERT_OK(fsdp2_hf_adapter_config(b, &d));
    ck_assert_int_eq(memcmp(&c, &d, sizeof(c)), 0);
    check_values(b, "gpt2-lora", n);
    ASSERT_OK(fsdp2_hf_adapter_close(b));
    char path[600];
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    st_file_t f;
    ASSERT_OK(st_open(path, &f));
    ck_assert_ptr_nonnull(st_find(&f, "base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight"));
    st_close(&f);
    snprintf(path, sizeof(path), "%s/adapter_config.json", dir);
    char *text = slurp(path);
    ck_assert(strstr(text, "\"peft_type\":\t\"LORA\"") && strstr(text, "\"CAUSAL_LM\"") &&
              strstr(text, "\"fan_in_fan_out\":\ttrue"));
    free(text);
    /* never over a directory that holds something */
    ASSERT_REFUSED(fsdp2_hf_adapter_write(dir, &c, FSDP2_HF_GPT2, n, names,
                                          (const fsdp2_tensor_t *const *)tensors),
                   FSDP2_ERR_INVALID_ARGUMENT, "not empty");
    /* a name that is not an adapter weight, a tensor without r */
    const char *bad_name[1] = {"h.0.attn.c_attn.weight"};
    ASSERT_REFUSED(fsdp2_hf_adapter_write(in_scratch("bad"), &c, FSDP2_HF_GPT2, 1, bad_name,
                                          (const fsdp2_tensor_t *const *)tensors),
                   FSDP2_ERR_INVALID_ARGUMENT, "is not a lora_A or lora_B weight");
    c.r = 5;
    ASSERT_REFUSED(fsdp2_hf_adapter_write(in_scratch("bad"), &c, FSDP2_HF_GPT2, n, names,
                                          (const fsdp2_tensor_t *const *)tensors),
                   FSDP2_ERR_INVALID_ARGUMENT, "carrying r 5");
    ck_assert_int_eq(count_entries(scratch), 1);
    for (size_t i = 0; i < n; i++) {
        fsdp2_tensor_release(tensors[i]);
        free(values[i]);
    }
    ASSERT_OK(fsdp2_hf_adapter_close(a));
}
END_TEST

/* A copy of llama-lora whose adapter_config.json has one change. */
static const char *edited(const char *from, const char *to)
{
    static int k;
    char as[32];
    snprintf(as, sizeof(as), "edit%d", k++);
    const char *dir = copy_fixture("llama-lora", as);
    char path[600];
    snprintf(path, sizeof(path), "%s/adapter_config.json", dir);
    edit_file(path, from, to);
    return dir;
}

START_TEST(configs_and_tensors_outside_lora_are_refused_naming_them)
{
    static const struct {
        const char *from, *to, *needle;
    } cases[] = {
        {"\"LORA\"", "\"IA3\"", "peft_type 'IA3' is not supported"},
        {"\"r\": 4", "\"r\": 0", "r 0 is not a positive integer"},
        {"\"r\": 4", "\"r\": 2.5", "r 2.5 is not a positive integer"},
        {"\"lora_dropout\": 0.05", "\"lora_dropout\": 1.5", "lora_dropout 1.5"},
        {"\"bias\": \"none\"", "\"bias\": \"all\"", "bias all is not supported"},
        {"\"use_dora\": false", "\"use_dora\": true", "use_dora is set"},
        {"\"use_rslora\": false", "\"use_rslora\": true", "use_rslora is set"},
        {"\"modules_to_save\": null", "\"modules_to_save\": [\"lm_head\"]",
         "modules_to_save is set"},
        {"\"rank_pattern\": {}", "\"rank_pattern\": {\"q_proj\": 8}", "rank_pattern is set"},
        {"\"target_modules\": [\n    \"q_proj\",\n    \"v_proj\"\n  ]",
         "\"target_modules\": \".*proj\"", "a regular expression is not supported"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fsdp2_hf_adapter_t *a = (fsdp2_hf_adapter_t *)1;
        ASSERT_REFUSED(fsdp2_hf_adapter_open(edited(cases[i].from, cases[i].to), &a),
                       FSDP2_ERR_INVALID_CONFIG, cases[i].needle);
        ck_assert_ptr_null(a);
    }
    /* r 8 in the config against tensors of r 4: the shape names it */
    fsdp2_hf_adapter_t *a;
    ASSERT_REFUSED(fsdp2_hf_adapter_open(edited("\"r\": 4", "\"r\": 8"), &a), FSDP2_ERR_CORRUPT,
                   "a lora_A weight of r 8 is [r, in]");
    /* a tensor that is not a LoRA weight; an A without its B */
    const char *dir = copy_fixture("llama-lora", "extra");
    char path[600];
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    change_t extra = {.extra = "base_model.model.model.layers.0.mlp.lora_magnitude_vector",
                      .extra_shape = {4, 0}};
    rewrite(path, &extra);
    ASSERT_REFUSED(fsdp2_hf_adapter_open(dir, &a), FSDP2_ERR_CORRUPT, "is not a LoRA weight");
    dir = copy_fixture("llama-lora", "lonely");
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    change_t drop = {.drop = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"};
    rewrite(path, &drop);
    ASSERT_REFUSED(fsdp2_hf_adapter_open(dir, &a), FSDP2_ERR_CORRUPT,
                   "model.layers.1.self_attn.v_proj.lora_A.weight' has no lora_B");
    /* a FIFO in the weights' place is refused at once */
    dir = copy_fixture("llama-lora", "fifo");
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    alarm(10);
    ck_assert_int_ne(fsdp2_hf_adapter_open(dir, &a), FSDP2_SUCCESS);
    alarm(0);
    ck_assert_msg(strstr(fsdp2_last_error(), "regular file") != NULL, "%s", fsdp2_last_error());
}
END_TEST

static Suite *hf_adapter_suite(void)
{
    Suite *s = suite_create("hf_adapter");
    TCase *tc = tcase_create("peft");
    tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, peft_adapters_open_with_their_config_names_and_values);
    tcase_add_test(tc, an_adapter_written_reads_back_equal_and_named_as_peft_names_it);
    tcase_add_test(tc, configs_and_tensors_outside_lora_are_refused_naming_them);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(hf_adapter_suite)
