/* Hugging Face model directories (include/fsdp2/hf_model.h) against the fixtures of
 * tests/checkpoint/hf/, written by transformers and safetensors (make_hf_fixtures.py),
 * and each fixture's NAME.expected reference values computed there by PyTorch:
 * configs, tensor lists and shapes, row reads in pieces into f32 and bf16, exports read
 * back, and every refusal with its message. HF_FIXTURES_DIR names the fixtures. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <fsdp2/dtype.h>
#include <fsdp2/hf_model.h>
#include <fsdp2/status.h>

#include "checkpoint/safetensors.h"
#include "core/fault.h"

#include "../core/check_main.h"
#include "hf_fixtures.h"

static const char *const FIXTURES[] = {"gpt2-f32", "gpt2-hub-bf16-sharded", "llama-f32",
                                       "llama-bf16"};
#define NUM_FIXTURES (sizeof(FIXTURES) / sizeof(FIXTURES[0]))

static void summarize(const float *v, size_t n, double *sum, double *wsum)
{
    *sum = 0;
    *wsum = 0;
    for (size_t k = 0; k < n; k++) {
        *sum += v[k];
        *wsum += (double)v[k] * (double)(k % 7 + 1);
    }
}

static void expect_close(const char *what, const char *name, double got, double want)
{
    ck_assert_msg(fabs(got - want) <= 1e-9 * (1 + fabs(want)), "%s of %s: %.17g, reference %.17g",
                  what, name, got, want);
}

/* Reads a whole tensor as f32 in pieces of `piece` rows. */
static float *read_pieces(fsdp2_hf_model_t *m, const fsdp2_hf_tensor_info_t *t, int64_t piece)
{
    size_t cols = (size_t)t->shape[1];
    float *v = malloc(sizeof(float) * (size_t)t->shape[0] * cols);
    for (int64_t r = 0; r < t->shape[0]; r += piece) {
        int64_t rows = t->shape[0] - r < piece ? t->shape[0] - r : piece;
        ASSERT_OK(fsdp2_hf_model_read(m, t->name, r, rows, FSDP2_F32, v + (size_t)r * cols));
    }
    return v;
}

/* ---------------------------------------------------------------------------------- */
/* Reading the fixtures                                                                */

START_TEST(every_fixture_has_its_tensors_and_the_reference_values_read_in_pieces)
{
    const char *name = FIXTURES[_i];
    fsdp2_hf_model_t *m;
    ASSERT_OK(fsdp2_hf_model_open(fixture(name), &m));
    static expected_t want[256];
    size_t num_want = load_expected(name, want, 256), count;
    ASSERT_OK(fsdp2_hf_model_num_tensors(m, &count));
    ck_assert_msg(count == num_want, "%s: %zu tensors, reference %zu", name, count, num_want);
    for (size_t i = 0; i < count; i++) {
        fsdp2_hf_tensor_info_t t;
        ASSERT_OK(fsdp2_hf_model_tensor(m, i, &t));
        const expected_t *e = find_expected(want, num_want, t.name);
        ck_assert_msg(e != NULL, "%s: tensor %s is not in the reference", name, t.name);
        ck_assert_msg(t.shape[0] == e->rows && t.shape[1] == e->cols,
                      "%s %s: [%" PRId64 ", %" PRId64 "], reference [%" PRId64 ", %" PRId64 "]",
                      name, t.name, t.shape[0], t.shape[1], e->rows, e->cols);
        ck_assert_int_eq(t.transposed, strstr(name, "gpt2") != NULL && t.ndim == 2 &&
                                           strstr(t.name, "h.") == t.name);
        size_t n = (size_t)(t.shape[0] * t.shape[1]);
        /* Three ways to cut the rows: whole, 3 at a time, one by one. */
        const int64_t pieces[] = {t.shape[0], 3, 1};
        float *whole = NULL;
        for (int p = 0; p < 3; p++) {
            float *v = read_pieces(m, &t, pieces[p]);
            double sum, wsum;
            summarize(v, n, &sum, &wsum);
            expect_close("sum", t.name, sum, e->sum);
            expect_close("weighted sum", t.name, wsum, e->wsum);
            ck_assert_msg(v[0] == e->first && v[n - 1] == e->last,
                          "%s: first %g last %g, want %g %g", t.name, v[0], v[n - 1], e->first,
                          e->last);
            if (p == 0)
                whole = v;
            else
                free(v);
        }
        /* bf16 destinations, at uneven row ranges: the f32 values rounded once. */
        uint16_t *b = malloc(2 * n);
        int64_t r0 = t.shape[0] / 3, r1 = t.shape[0] - r0;
        size_t cols = (size_t)t.shape[1];
        ASSERT_OK(fsdp2_hf_model_read(m, t.name, 0, r0, FSDP2_BF16, b));
        ASSERT_OK(fsdp2_hf_model_read(m, t.name, r0, r1 - r0, FSDP2_BF16, b + (size_t)r0 * cols));
        ASSERT_OK(fsdp2_hf_model_read(m, t.name, r1, t.shape[0] - r1, FSDP2_BF16,
                                      b + (size_t)r1 * cols));
        for (size_t k = 0; k < n; k++)
            ck_assert_msg(b[k] == fsdp2_f32_to_bf16(whole[k]), "%s[%zu]: bf16 %04x, want %04x",
                          t.name, k, b[k], fsdp2_f32_to_bf16(whole[k]));
        free(b);
        free(whole);
    }
    ASSERT_REFUSED(fsdp2_hf_model_read(m, "no.such.weight", 0, 1, FSDP2_F32, &(float){0}),
                   FSDP2_ERR_NOT_FOUND, "'no.such.weight'");
    fsdp2_hf_tensor_info_t t0;
    ASSERT_OK(fsdp2_hf_model_tensor(m, 0, &t0));
    ASSERT_REFUSED(fsdp2_hf_model_read(m, t0.name, t0.shape[0], 1, FSDP2_F32, &(float){0}),
                   FSDP2_ERR_INVALID_ARGUMENT, t0.name);
    ASSERT_OK(fsdp2_hf_model_close(m));
}
END_TEST

/* F16 files (no fixture has them: transformers writes F32 and BF16 alike): llama-f32
 * with every tensor rounded to F16 reads back as the F16 rounding of the original. */
START_TEST(f16_files_read_as_their_values)
{
    const char *dir = copy_fixture("llama-f32", "f16");
    char st[600];
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    rewrite(st, &(change_t){.to_f16 = 1});
    fsdp2_hf_model_t *m, *f32;
    ASSERT_OK(fsdp2_hf_model_open(dir, &m));
    ASSERT_OK(fsdp2_hf_model_open(fixture("llama-f32"), &f32));
    size_t count;
    ASSERT_OK(fsdp2_hf_model_num_tensors(m, &count));
    for (size_t i = 0; i < count; i++) {
        fsdp2_hf_tensor_info_t t;
        ASSERT_OK(fsdp2_hf_model_tensor(m, i, &t));
        ck_assert_int_eq(t.file_dtype, FSDP2_F16);
        size_t n = (size_t)(t.shape[0] * t.shape[1]);
        float *got = read_pieces(m, &t, 5), *orig = read_pieces(f32, &t, t.shape[0]);
        for (size_t k = 0; k < n; k++) {
            float want = fsdp2_f16_to_f32(fsdp2_f32_to_f16(orig[k]));
            ck_assert_msg(got[k] == want, "%s[%zu]: %g, want %g", t.name, k, got[k], want);
        }
        free(got);
        free(orig);
    }
    ASSERT_OK(fsdp2_hf_model_close(m));
    ASSERT_OK(fsdp2_hf_model_close(f32));
}
END_TEST

START_TEST(the_configs_hold_the_fields_transformers_wrote)
{
    fsdp2_hf_config_t g = FSDP2_HF_CONFIG_INIT, h = FSDP2_HF_CONFIG_INIT;
    ASSERT_OK(fsdp2_hf_config_read(fixture("gpt2-f32"), &g));
    ASSERT_OK(fsdp2_hf_config_read(fixture("gpt2-hub-bf16-sharded"), &h));
    ck_assert_int_eq(g.arch, FSDP2_HF_GPT2);
    ck_assert_int_eq(g.vocab_size, 261);
    ck_assert_int_eq(g.hidden_size, 32);
    ck_assert_int_eq(g.num_layers, 2);
    ck_assert_int_eq(g.num_heads, 4);
    ck_assert_int_eq(g.num_kv_heads, 4);
    ck_assert_int_eq(g.head_dim, 8);
    ck_assert_int_eq(g.intermediate_size, 128); /* n_inner null: 4 n_embd */
    ck_assert_int_eq(g.max_positions, 16);
    ck_assert(g.norm_eps == 1e-5);
    ck_assert_int_eq(g.tie_word_embeddings, 1);
    ck_assert_int_eq(g.bos_token_id, 0);
    ck_assert_int_eq(g.eos_token_id, 0);
    ck_assert_str_eq(g.hidden_act, "gelu_new");
    ck_assert_int_eq(memcmp(&g, &h, sizeof(g)), 0);

    fsdp2_hf_config_t l = FSDP2_HF_CONFIG_INIT, b = FSDP2_HF_CONFIG_INIT;
    ASSERT_OK(fsdp2_hf_config_read(fixture("llama-f32"), &l));
    ASSERT_OK(fsdp2_hf_config_read(fixture("llama-bf16"), &b));
    ck_assert_int_eq(l.arch, FSDP2_HF_LLAMA);
    ck_assert_int_eq(l.vocab_size, 64);
    ck_assert_int_eq(l.hidden_size, 32);
    ck_assert_int_eq(l.num_layers, 2);
    ck_assert_int_eq(l.num_heads, 4);
    ck_assert_int_eq(l.num_kv_heads, 2);
    ck_assert_int_eq(l.head_dim, 8);
    ck_assert_int_eq(l.intermediate_size, 48);
    ck_assert_int_eq(l.max_positions, 64);
    ck_assert(l.norm_eps == 1e-6);
    ck_assert(l.rope_theta == 10000.0);
    ck_assert_int_eq(l.rope_scaling, FSDP2_HF_ROPE_LLAMA3);
    ck_assert(l.rope_factor == 8.0 && l.rope_low_freq_factor == 1.0 &&
              l.rope_high_freq_factor == 4.0);
    ck_assert_int_eq(l.rope_original_max_positions, 32);
    ck_assert_int_eq(l.tie_word_embeddings, 0);
    ck_assert_int_eq(l.bos_token_id, 1);
    ck_assert_int_eq(l.eos_token_id, 2); /* [2, 3]: the first */
    ck_assert_str_eq(l.hidden_act, "silu");
    ck_assert_int_eq(memcmp(&l, &b, sizeof(l)), 0);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Export                                                                              */

/* Writes the open model m to dir, tensor by tensor as a trainer would, from f32. */
static void export_model(fsdp2_hf_model_t *m, const char *dir, fsdp2_dtype_t dtype,
                         uint64_t max_shard_bytes)
{
    fsdp2_hf_config_t cfg = FSDP2_HF_CONFIG_INIT;
    ASSERT_OK(fsdp2_hf_model_config(m, &cfg));
    fsdp2_hf_export_options_t o = FSDP2_HF_EXPORT_OPTIONS_INIT;
    o.dtype = dtype;
    o.max_shard_bytes = max_shard_bytes;
    fsdp2_hf_writer_t *w;
    ASSERT_OK(fsdp2_hf_writer_create(dir, &cfg, &o, &w));
    size_t count;
    ASSERT_OK(fsdp2_hf_model_num_tensors(m, &count));
    for (size_t i = 0; i < count; i++) {
        fsdp2_hf_tensor_info_t t, next;
        ASSERT_OK(fsdp2_hf_model_tensor(m, i, &t));
        ASSERT_OK(fsdp2_hf_writer_next(w, &next));
        ck_assert_str_eq(next.name, t.name);
        float *v = read_pieces(m, &t, t.shape[0]);
        ASSERT_OK(fsdp2_hf_writer_write(w, t.name, FSDP2_F32, v));
        free(v);
    }
    fsdp2_hf_tensor_info_t done;
    ASSERT_OK(fsdp2_hf_writer_next(w, &done));
    ck_assert_ptr_null(done.name);
    ASSERT_OK(fsdp2_hf_writer_finish(w));
}

START_TEST(an_export_reads_back_equal_in_f32_and_bf16_one_file_and_sharded)
{
    const char *name = FIXTURES[_i];
    fsdp2_hf_model_t *m;
    ASSERT_OK(fsdp2_hf_model_open(fixture(name), &m));
    const struct {
        fsdp2_dtype_t dtype;
        uint64_t shard;
        const char *dir;
    } ways[] = {{FSDP2_F32, 0, "out-f32"}, {FSDP2_BF16, 8192, "out-bf16-sharded"}};
    for (int k = 0; k < 2; k++) {
        const char *dir = in_scratch(ways[k].dir);
        export_model(m, dir, ways[k].dtype, ways[k].shard);
        char probe[600];
        snprintf(probe, sizeof(probe), "%s/model.safetensors.index.json", dir);
        ck_assert_int_eq(access(probe, F_OK) == 0, ways[k].shard > 0);
        ck_assert_int_eq(count_entries(scratch), k + 1); /* no temporary left */
        fsdp2_hf_model_t *back;
        ASSERT_OK(fsdp2_hf_model_open(dir, &back));
        fsdp2_hf_config_t a = FSDP2_HF_CONFIG_INIT, b = FSDP2_HF_CONFIG_INIT;
        ASSERT_OK(fsdp2_hf_model_config(m, &a));
        ASSERT_OK(fsdp2_hf_model_config(back, &b));
        ck_assert_int_eq(memcmp(&a, &b, sizeof(a)), 0);
        size_t count, count_back;
        ASSERT_OK(fsdp2_hf_model_num_tensors(m, &count));
        ASSERT_OK(fsdp2_hf_model_num_tensors(back, &count_back));
        ck_assert_uint_eq(count, count_back);
        for (size_t i = 0; i < count; i++) {
            fsdp2_hf_tensor_info_t t, u;
            ASSERT_OK(fsdp2_hf_model_tensor(m, i, &t));
            ASSERT_OK(fsdp2_hf_model_tensor(back, i, &u));
            ck_assert_str_eq(t.name, u.name);
            ck_assert_int_eq(u.file_dtype, ways[k].dtype);
            size_t n = (size_t)(t.shape[0] * t.shape[1]);
            float *x = read_pieces(m, &t, t.shape[0]), *y = read_pieces(back, &u, 2);
            for (size_t e = 0; e < n; e++) {
                float want =
                    ways[k].dtype == FSDP2_F32 ? x[e] : fsdp2_bf16_to_f32(fsdp2_f32_to_bf16(x[e]));
                ck_assert_msg(y[e] == want, "%s %s[%zu]: %g, wrote %g", ways[k].dir, t.name, e,
                              y[e], want);
            }
            free(x);
            free(y);
        }
        ASSERT_OK(fsdp2_hf_model_close(back));
    }
    /* GPT-2 as save_pretrained names it: prefixed, the tied head not stored. */
    if (strstr(name, "gpt2") != NULL) {
        st_file_t f;
        char path[600];
        snprintf(path, sizeof(path), "%s/model.safetensors", in_scratch("out-f32"));
        ASSERT_OK(st_open(path, &f));
        ck_assert_ptr_nonnull(st_find(&f, "transformer.wte.weight"));
        ck_assert_ptr_nonnull(st_find(&f, "transformer.h.1.mlp.c_fc.weight"));
        ck_assert_ptr_null(st_find(&f, "lm_head.weight"));
        const st_entry_t *e = st_find(&f, "transformer.h.0.attn.c_attn.weight");
        ck_assert(e->shape[0] == 32 && e->shape[1] == 96); /* Conv1D [in, out] */
        st_close(&f);
    }
    ASSERT_OK(fsdp2_hf_model_close(m));
}
END_TEST

START_TEST(a_file_added_beside_the_weights_lands_with_them_and_reserved_names_are_refused)
{
    fsdp2_hf_model_t *m;
    ASSERT_OK(fsdp2_hf_model_open(fixture("llama-f32"), &m));
    fsdp2_hf_config_t cfg = FSDP2_HF_CONFIG_INIT;
    ASSERT_OK(fsdp2_hf_model_config(m, &cfg));
    const char *dir = in_scratch("with-tokenizer"), text[] = "{\"model\": {\"type\": \"BPE\"}}";
    fsdp2_hf_writer_t *w;
    ASSERT_OK(fsdp2_hf_writer_create(dir, &cfg, NULL, &w));
    const char *reserved[] = {"config.json", "model.safetensors", "model-00001-of-00002.safetensors",
                              "model.safetensors.index.json", "../escape", "a/b", ".hidden", ""};
    for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
        ASSERT_REFUSED(fsdp2_hf_writer_add_file(w, reserved[i], text, 3),
                       FSDP2_ERR_INVALID_ARGUMENT, "not a file name the writer leaves free");
    ASSERT_OK(fsdp2_hf_writer_add_file(w, "tokenizer.json", text, sizeof(text) - 1));
    size_t count;
    ASSERT_OK(fsdp2_hf_model_num_tensors(m, &count));
    for (size_t i = 0; i < count; i++) {
        fsdp2_hf_tensor_info_t t;
        ASSERT_OK(fsdp2_hf_model_tensor(m, i, &t));
        float *v = read_pieces(m, &t, t.shape[0]);
        ASSERT_OK(fsdp2_hf_writer_write(w, t.name, FSDP2_F32, v));
        free(v);
    }
    ASSERT_OK(fsdp2_hf_writer_finish(w));
    char path[600], back[64] = {0};
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fread(back, 1, sizeof(back) - 1, f), sizeof(text) - 1);
    fclose(f);
    ck_assert_str_eq(back, text);
    ASSERT_OK(fsdp2_hf_model_close(m));
}
END_TEST

START_TEST(an_export_into_a_missing_parent_or_a_non_empty_directory_is_refused)
{
    fsdp2_hf_config_t cfg = FSDP2_HF_CONFIG_INIT;
    ASSERT_OK(fsdp2_hf_config_read(fixture("llama-f32"), &cfg));
    fsdp2_hf_writer_t *w = (fsdp2_hf_writer_t *)1;
    ASSERT_REFUSED(fsdp2_hf_writer_create(in_scratch("no/such/dir"), &cfg, NULL, &w), FSDP2_ERR_IO,
                   "parent directory");
    ck_assert_ptr_null(w);
    const char *full = in_scratch("full");
    ck_assert_int_eq(mkdir(full, 0755), 0);
    char keep[600];
    snprintf(keep, sizeof(keep), "%s/keep.txt", full);
    write_text(keep, "mine");
    ASSERT_REFUSED(fsdp2_hf_writer_create(full, &cfg, NULL, &w), FSDP2_ERR_INVALID_ARGUMENT,
                   "not empty");
    ck_assert_int_eq(count_entries(scratch), 1);
    ck_assert_int_eq(count_entries(full), 1);
    /* An empty directory is replaced; the order of the tensors is enforced. */
    const char *empty = in_scratch("empty");
    ck_assert_int_eq(mkdir(empty, 0755), 0);
    ASSERT_OK(fsdp2_hf_writer_create(empty, &cfg, NULL, &w));
    float v[64] = {0};
    ASSERT_REFUSED(fsdp2_hf_writer_write(w, "model.norm.weight", FSDP2_F32, v),
                   FSDP2_ERR_INVALID_ARGUMENT, "'model.embed_tokens.weight' comes next");
    ASSERT_REFUSED(fsdp2_hf_writer_finish(w), FSDP2_ERR_INVALID_STATE, "0 of");
    ck_assert_int_eq(count_entries(scratch), 2);
    ck_assert_int_eq(count_entries(empty), 0);
    cfg.num_kv_heads = 3;
    ASSERT_REFUSED(fsdp2_hf_writer_create(in_scratch("bad"), &cfg, NULL, &w), FSDP2_ERR_CORRUPT,
                   "num_key_value_heads 3");
    /* What config.json may leave out, a caller may leave zero. */
    fsdp2_hf_config_t lean = cfg;
    lean.num_kv_heads = lean.head_dim = 0;
    lean.hidden_act[0] = '\0';
    ASSERT_OK(fsdp2_hf_writer_create(in_scratch("lean"), &lean, NULL, &w));
    fsdp2_hf_writer_abort(w);
    ck_assert_int_eq(count_entries(scratch), 2);
}
END_TEST

/* Every I/O point of an export fails in turn: each failure leaves nothing behind. The
 * tensors are read first, so that only the export's points are counted. */
static fsdp2_status_t export_from_memory(const fsdp2_hf_config_t *cfg, float **data,
                                         const fsdp2_hf_tensor_info_t *t, size_t count)
{
    fsdp2_hf_export_options_t o = FSDP2_HF_EXPORT_OPTIONS_INIT;
    o.dtype = FSDP2_BF16;
    o.max_shard_bytes = 16384;
    fsdp2_hf_writer_t *w = NULL;
    fsdp2_status_t s = fsdp2_hf_writer_create(in_scratch("out"), cfg, &o, &w);
    for (size_t i = 0; s == FSDP2_SUCCESS && i < count; i++)
        s = fsdp2_hf_writer_write(w, t[i].name, FSDP2_F32, data[i]);
    if (s == FSDP2_SUCCESS)
        return fsdp2_hf_writer_finish(w);
    fsdp2_hf_writer_abort(w);
    return s;
}

START_TEST(an_injected_failure_anywhere_in_an_export_leaves_nothing)
{
    fsdp2_hf_model_t *m;
    ASSERT_OK(fsdp2_hf_model_open(fixture("gpt2-hub-bf16-sharded"), &m));
    fsdp2_hf_config_t cfg = FSDP2_HF_CONFIG_INIT;
    ASSERT_OK(fsdp2_hf_model_config(m, &cfg));
    size_t count;
    ASSERT_OK(fsdp2_hf_model_num_tensors(m, &count));
    static fsdp2_hf_tensor_info_t t[64];
    static float *data[64];
    ck_assert_uint_le(count, 64);
    for (size_t i = 0; i < count; i++) {
        ASSERT_OK(fsdp2_hf_model_tensor(m, i, &t[i]));
        data[i] = read_pieces(m, &t[i], t[i].shape[0]);
    }
    fsdp2_fault_arm(FAULT_NONE, 0);
    ASSERT_OK(export_from_memory(&cfg, data, t, count));
    uint64_t points = fsdp2_fault_count(FAULT_IO);
    fsdp2_fault_disarm();
    remove_tree(in_scratch("out"));
    ck_assert_uint_gt(points, 4);
    for (uint64_t at = 1; at <= points; at++) {
        fsdp2_fault_arm(FAULT_IO, at);
        fsdp2_status_t s = export_from_memory(&cfg, data, t, count);
        int fired = fsdp2_fault_fired();
        fsdp2_fault_disarm();
        ck_assert_msg(fired && s == FSDP2_ERR_IO, "point %" PRIu64 " of %" PRIu64 ": %s (%s)", at,
                      points, fsdp2_status_name(s), fsdp2_last_error());
        ck_assert_msg(strstr(fsdp2_last_error(), "injected") != NULL, "%s", fsdp2_last_error());
        ck_assert_msg(count_entries(scratch) == 0, "point %" PRIu64 ": %d entries left", at,
                      count_entries(scratch));
    }
    for (size_t i = 0; i < count; i++)
        free(data[i]);
    ASSERT_OK(fsdp2_hf_model_close(m));
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* What is refused                                                                     */

static void expect_open_refused(const char *dir, fsdp2_status_t want, const char *needle)
{
    fsdp2_hf_model_t *m = (fsdp2_hf_model_t *)1;
    ASSERT_REFUSED(fsdp2_hf_model_open(dir, &m), want, needle);
    ck_assert_ptr_null(m);
}

START_TEST(configs_outside_what_is_supported_are_refused_naming_the_field)
{
    static const struct {
        const char *fixture, *from, *to, *needle;
        fsdp2_status_t want;
    } cases[] = {
        {"gpt2-f32", "\"model_type\": \"gpt2\"", "\"model_type\": \"mistral\"",
         "model_type 'mistral' is not supported (gpt2, llama)", FSDP2_ERR_UNSUPPORTED},
        {"gpt2-f32", "\"n_head\": 4", "\"n_head\": 5", "n_embd 32 is not divisible by n_head 5",
         FSDP2_ERR_CORRUPT},
        {"gpt2-f32", "\"n_layer\": 2", "\"n_layer\": 0", "n_layer 0 is not in 1 .. 2^31",
         FSDP2_ERR_CORRUPT},
        {"gpt2-f32", "\"gelu_new\"", "\"relu\"", "activation_function 'relu' is not supported",
         FSDP2_ERR_UNSUPPORTED},
        {"gpt2-f32", "\"vocab_size\": 261", "\"vocab_size\": 2.5",
         "field 'vocab_size' is not an integer", FSDP2_ERR_CORRUPT},
        {"llama-f32", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3",
         "num_key_value_heads 3 does not divide num_attention_heads 4", FSDP2_ERR_CORRUPT},
        {"llama-f32", "\"head_dim\": 8", "\"head_dim\": 16", "head_dim 16 is not hidden_size",
         FSDP2_ERR_UNSUPPORTED},
        {"llama-f32", "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"",
         "type 'yarn' is not supported", FSDP2_ERR_UNSUPPORTED},
        {"llama-f32", "\"mlp_bias\": false", "\"mlp_bias\": true", "mlp_bias true is not supported",
         FSDP2_ERR_UNSUPPORTED},
        {"llama-f32", "\"hidden_size\": 32", "\"hidden_sizes\": 32",
         "field 'hidden_size' is missing", FSDP2_ERR_CORRUPT},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char as[32];
        snprintf(as, sizeof(as), "case%zu", i);
        const char *dir = copy_fixture(cases[i].fixture, as);
        char config[600];
        snprintf(config, sizeof(config), "%s/config.json", dir);
        edit_file(config, cases[i].from, cases[i].to);
        expect_open_refused(dir, cases[i].want, cases[i].needle);
        ck_assert_msg(strstr(fsdp2_last_error(), "config.json") != NULL, "%s", fsdp2_last_error());
    }
}
END_TEST

START_TEST(a_missing_an_unexpected_or_a_misshapen_tensor_is_refused_naming_it)
{
    const char *dir = copy_fixture("gpt2-f32", "missing");
    char st[600];
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    rewrite(st, &(change_t){.drop = "transformer.h.1.mlp.c_fc.bias"});
    expect_open_refused(dir, FSDP2_ERR_NOT_FOUND,
                        "missing tensor 'transformer.h.1.mlp.c_fc.bias' ([128], from config.json's "
                        "n_inner)");

    dir = copy_fixture("llama-f32", "extra");
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    rewrite(st, &(change_t){.extra = "model.layers.0.self_attn.q_proj.bias"});
    expect_open_refused(dir, FSDP2_ERR_CORRUPT,
                        "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'");

    dir = copy_fixture("gpt2-f32", "shape");
    char config[600];
    snprintf(config, sizeof(config), "%s/config.json", dir);
    edit_file(config, "\"vocab_size\": 261", "\"vocab_size\": 262");
    expect_open_refused(dir, FSDP2_ERR_SHAPE_MISMATCH,
                        "tensor 'transformer.wte.weight' has shape [261, 32]");
    ck_assert_msg(strstr(fsdp2_last_error(), "gives [262, 32] (vocab_size x n_embd)") != NULL, "%s",
                  fsdp2_last_error());

    dir = copy_fixture("llama-f32", "untied");
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    rewrite(st, &(change_t){.drop = "lm_head.weight"});
    expect_open_refused(dir, FSDP2_ERR_NOT_FOUND, "missing tensor 'lm_head.weight'");
    snprintf(config, sizeof(config), "%s/config.json", dir);
    edit_file(config, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
    fsdp2_hf_model_t *m;
    ASSERT_OK(fsdp2_hf_model_open(dir, &m)); /* tied: no head of its own */
    ASSERT_OK(fsdp2_hf_model_close(m));

    dir = copy_fixture("gpt2-f32", "i32");
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    rewrite(st, &(change_t){.retype = "transformer.h.0.attn.c_proj.weight"});
    expect_open_refused(dir, FSDP2_ERR_DTYPE_MISMATCH,
                        "tensor 'transformer.h.0.attn.c_proj.weight' has dtype I32 (F32, BF16 or "
                        "F16 expected)");
}
END_TEST

/* A tied head stored anyway is checked for shape and ignored; a tensor stored under
 * both GPT-2 spellings is refused; overlapping, negative, non-integer and out-of-range
 * data_offsets are refused by the safetensors reader, naming the file. */
START_TEST(a_stored_tied_head_is_ignored_and_duplicates_and_bad_offsets_are_refused)
{
    const char *dir = copy_fixture("gpt2-f32", "head");
    char st[600];
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    rewrite(st, &(change_t){.extra = "lm_head.weight", .extra_shape = {261, 32}});
    fsdp2_hf_model_t *m;
    ASSERT_OK(fsdp2_hf_model_open(dir, &m));
    size_t count;
    ASSERT_OK(fsdp2_hf_model_num_tensors(m, &count));
    ck_assert_uint_eq(count, 2 + 12 * 2 + 2); /* no head of its own */
    ASSERT_OK(fsdp2_hf_model_close(m));

    dir = copy_fixture("gpt2-f32", "bad-head");
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    rewrite(st, &(change_t){.extra = "lm_head.weight", .extra_shape = {260, 32}});
    expect_open_refused(dir, FSDP2_ERR_SHAPE_MISMATCH,
                        "'lm_head.weight' has shape [260, 32]");
    ck_assert_msg(strstr(fsdp2_last_error(), "tied") != NULL, "%s", fsdp2_last_error());

    dir = copy_fixture("gpt2-f32", "twice");
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    rewrite(st, &(change_t){.extra = "ln_f.bias", .extra_shape = {32, 0}});
    expect_open_refused(dir, FSDP2_ERR_CORRUPT, "stored twice");

    /* Headers the safetensors reader refuses, in a model directory. */
    static const struct {
        const char *json, *needle;
    } headers[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         "'b': data_offsets [4, 12] overlap tensor 'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[-4,8]}}",
         "'a': data_offsets is not [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12.5]}}",
         "'a': data_offsets is not [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
         "'a': data_offsets [0, 16] are reversed or pass the end"},
    };
    for (size_t k = 0; k < sizeof(headers) / sizeof(headers[0]); k++) {
        char as[16];
        snprintf(as, sizeof(as), "header%zu", k);
        dir = copy_fixture("llama-bf16", as);
        snprintf(st, sizeof(st), "%s/model.safetensors", dir);
        size_t len = strlen(headers[k].json);
        unsigned char prefix[8];
        for (int b = 0; b < 8; b++)
            prefix[b] = (unsigned char)((uint64_t)len >> (8 * b));
        FILE *f = fopen(st, "wb");
        ck_assert_ptr_nonnull(f);
        fwrite(prefix, 1, 8, f);
        fputs(headers[k].json, f);
        fwrite("\0\0\0\0\0\0\0\0\0\0\0\0", 1, 12, f); /* 12 bytes of data */
        ck_assert_int_eq(fclose(f), 0);
        expect_open_refused(dir, FSDP2_ERR_CORRUPT, headers[k].needle);
        ck_assert_msg(strstr(fsdp2_last_error(), st) != NULL, "%s", fsdp2_last_error());
    }
}
END_TEST

START_TEST(nan_and_inf_are_refused_naming_the_tensor_and_the_first_index)
{
    const float bad[2] = {NAN, INFINITY};
    const char *needle[2] = {"NaN at flat index 37", "an infinity at flat index 37"};
    for (int k = 0; k < 2; k++) {
        const char *dir = copy_fixture("gpt2-f32", k ? "inf" : "nan");
        char st[600];
        snprintf(st, sizeof(st), "%s/model.safetensors", dir);
        rewrite(st, &(change_t){.poison = "transformer.h.0.mlp.c_fc.weight", .poison_index = 37,
                                .poison_value = bad[k]});
        fsdp2_hf_model_t *m;
        ASSERT_OK(fsdp2_hf_model_open(dir, &m)); /* headers are fine */
        static float v[128 * 32];
        /* File [32, 128]: index 37 is file row 0, column 37: canonical row 37. */
        ASSERT_OK(fsdp2_hf_model_read(m, "h.0.mlp.c_fc.weight", 0, 37, FSDP2_F32, v));
        ASSERT_REFUSED(fsdp2_hf_model_read(m, "h.0.mlp.c_fc.weight", 0, 128, FSDP2_BF16, v),
                       FSDP2_ERR_CORRUPT, needle[k]);
        ck_assert_msg(strstr(fsdp2_last_error(), "'transformer.h.0.mlp.c_fc.weight'") != NULL,
                      "%s", fsdp2_last_error());
        ASSERT_OK(fsdp2_hf_model_close(m));
    }
}
END_TEST

START_TEST(a_fifo_a_directory_or_a_damaged_file_is_refused_at_once)
{
    /* The alarm turns a regression (a blocking open) into a failure, not a hang. */
    alarm(10);
    const char *names[] = {"model.safetensors", "config.json", "model.safetensors.index.json"};
    for (int k = 0; k < 3; k++) {
        char as[16];
        snprintf(as, sizeof(as), "fifo%d", k);
        const char *dir = copy_fixture("gpt2-f32", as);
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", dir, names[k]);
        unlink(path);
        ck_assert_int_eq(mkfifo(path, 0600), 0);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        expect_open_refused(dir, FSDP2_ERR_IO, "not a regular file");
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        ck_assert_msg(s < 1.0, "%s: refused after %.3f s", names[k], s);
        ck_assert_msg(strstr(fsdp2_last_error(), names[k]) != NULL, "%s", fsdp2_last_error());
    }
    alarm(0);

    const char *dir = copy_fixture("gpt2-f32", "directory");
    char st[600];
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    unlink(st);
    ck_assert_int_eq(mkdir(st, 0755), 0);
    expect_open_refused(dir, FSDP2_ERR_IO, "model.safetensors: not a regular file");

    dir = copy_fixture("gpt2-f32", "truncated");
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    struct stat sb;
    ck_assert_int_eq(stat(st, &sb), 0);
    ck_assert_int_eq(truncate(st, sb.st_size - 100), 0);
    expect_open_refused(dir, FSDP2_ERR_CORRUPT, "pass the end of the data");

    dir = copy_fixture("gpt2-f32", "header");
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    int fd = open(st, O_WRONLY);
    unsigned char len[8] = {0};
    uint64_t n = (uint64_t)sb.st_size; /* the file's size: past its end */
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(n >> (8 * i));
    ck_assert_int_eq(pwrite(fd, len, 8, 0), 8);
    close(fd);
    expect_open_refused(dir, FSDP2_ERR_CORRUPT, "exceeds the rest of the file");

    dir = copy_fixture("gpt2-f32", "empty");
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    unlink(st);
    expect_open_refused(dir, FSDP2_ERR_NOT_FOUND, "no file 'model.safetensors'");
}
END_TEST

/* config.json and the index cut at every byte: refused (never a crash, never a model
 * from half a file), except where the cut leaves the JSON whole. */
START_TEST(config_and_index_cut_at_every_byte_are_refused)
{
    const char *names[2] = {"config.json", "model.safetensors.index.json"};
    for (int k = 0; k < 2; k++) {
        const char *dir = copy_fixture("gpt2-hub-bf16-sharded", k ? "cut-index" : "cut-config");
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", dir, names[k]);
        char *whole = slurp(path);
        size_t len = strlen(whole);
        while (len > 0 && (whole[len - 1] == '\n' || whole[len - 1] == ' '))
            len--; /* cuts in the trailing whitespace leave the JSON whole */
        for (size_t cut = 0; cut < len; cut++) {
            FILE *f = fopen(path, "wb");
            fwrite(whole, 1, cut, f);
            fclose(f);
            fsdp2_hf_model_t *m = NULL;
            fsdp2_status_t s = fsdp2_hf_model_open(dir, &m);
            ck_assert_msg(s != FSDP2_SUCCESS && m == NULL, "%s cut at %zu of %zu opened", names[k],
                          cut, len);
            ck_assert_msg(strstr(fsdp2_last_error(), names[k]) != NULL, "cut at %zu: %s", cut,
                          fsdp2_last_error());
        }
        write_text(path, whole);
        free(whole);
    }
}
END_TEST

START_TEST(an_index_that_disagrees_with_its_files_is_refused)
{
    const char *dir = copy_fixture("gpt2-hub-bf16-sharded", "shard-missing");
    char path[600];
    snprintf(path, sizeof(path), "%s/model-00002-of-00003.safetensors", dir);
    unlink(path);
    expect_open_refused(dir, FSDP2_ERR_NOT_FOUND,
                        "no file 'model-00002-of-00003.safetensors', which "
                        "model.safetensors.index.json names");

    dir = copy_fixture("gpt2-hub-bf16-sharded", "misplaced");
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    char *text = slurp(path);
    /* Move one tensor's entry to another file: the map no longer says where it is. */
    char *at = strstr(text, "\"wte.weight\": \"model-0000");
    ck_assert_ptr_nonnull(at);
    char *digit = at + strlen("\"wte.weight\": \"model-0000");
    *digit = *digit == '1' ? '2' : '1';
    write_text(path, text);
    free(text);
    expect_open_refused(dir, FSDP2_ERR_CORRUPT, "'wte.weight'");

    dir = copy_fixture("gpt2-hub-bf16-sharded", "escape");
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    edit_file(path, "\"model-00001-of-00003.safetensors\"",
              "\"../model-00001-of-00003.safetensors\"");
    expect_open_refused(dir, FSDP2_ERR_CORRUPT, "is not a file in the directory");
}
END_TEST

static Suite *hf_model_suite(void)
{
    Suite *s = suite_create("hf_model");
    TCase *read = tcase_create("read");
    tcase_add_loop_test(read, every_fixture_has_its_tensors_and_the_reference_values_read_in_pieces,
                        0, NUM_FIXTURES);
    tcase_add_test(read, the_configs_hold_the_fields_transformers_wrote);
    suite_add_tcase(s, read);
    TCase *write = tcase_create("write");
    tcase_add_checked_fixture(write, scratch_setup, scratch_teardown);
    tcase_add_loop_test(write, an_export_reads_back_equal_in_f32_and_bf16_one_file_and_sharded, 0,
                        NUM_FIXTURES);
    tcase_add_test(write, an_export_into_a_missing_parent_or_a_non_empty_directory_is_refused);
    tcase_add_test(write,
                   a_file_added_beside_the_weights_lands_with_them_and_reserved_names_are_refused);
    tcase_add_test(write, an_injected_failure_anywhere_in_an_export_leaves_nothing);
    tcase_set_timeout(write, 120);
    suite_add_tcase(s, write);
    TCase *bad = tcase_create("refused");
    tcase_add_checked_fixture(bad, scratch_setup, scratch_teardown);
    tcase_add_test(bad, f16_files_read_as_their_values);
    tcase_add_test(bad, configs_outside_what_is_supported_are_refused_naming_the_field);
    tcase_add_test(bad, a_missing_an_unexpected_or_a_misshapen_tensor_is_refused_naming_it);
    tcase_add_test(bad, a_stored_tied_head_is_ignored_and_duplicates_and_bad_offsets_are_refused);
    tcase_add_test(bad, nan_and_inf_are_refused_naming_the_tensor_and_the_first_index);
    tcase_add_test(bad, a_fifo_a_directory_or_a_damaged_file_is_refused_at_once);
    tcase_add_test(bad, an_index_that_disagrees_with_its_files_is_refused);
    tcase_add_test(bad, config_and_index_cut_at_every_byte_are_refused);
    tcase_set_timeout(bad, 120);
    suite_add_tcase(s, bad);
    return s;
}

FSDP2_CHECK_MAIN(hf_model_suite)
