/* Re-exports a Hugging Face model directory through the library: every tensor read
 * with fsdp2_hf_model_read (f32) and written with fsdp2_hf_writer, as a trainer
 * gathering one parameter at a time would. For bench/hf_export_check.sh, which loads the
 * result in transformers.
 *
 *   bench_hf_reexport IN OUT [f32|bf16] [MAX_SHARD_BYTES] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

#define CHECK(call)                                                                     \
    do {                                                                                \
        fsdp2_status_t s_ = (call);                                                     \
        if (s_ != FSDP2_SUCCESS) {                                                      \
            fprintf(stderr, "error: %s: %s\n", fsdp2_strerror(s_), fsdp2_last_error()); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s IN OUT [f32|bf16] [MAX_SHARD_BYTES]\n", argv[0]);
        return 2;
    }
    fsdp2_hf_model_t *m;
    CHECK(fsdp2_hf_model_open(argv[1], &m));
    fsdp2_hf_config_t cfg = FSDP2_HF_CONFIG_INIT;
    CHECK(fsdp2_hf_model_config(m, &cfg));
    fsdp2_hf_export_options_t o = FSDP2_HF_EXPORT_OPTIONS_INIT;
    o.dtype = argc > 3 && strcmp(argv[3], "bf16") == 0 ? FSDP2_BF16 : FSDP2_F32;
    o.max_shard_bytes = argc > 4 ? strtoull(argv[4], NULL, 10) : 0;
    fsdp2_hf_writer_t *w;
    CHECK(fsdp2_hf_writer_create(argv[2], &cfg, &o, &w));
    size_t count;
    CHECK(fsdp2_hf_model_num_tensors(m, &count));
    for (size_t i = 0; i < count; i++) {
        fsdp2_hf_tensor_info_t t;
        CHECK(fsdp2_hf_model_tensor(m, i, &t));
        float *v = malloc(sizeof(float) * (size_t)(t.shape[0] * t.shape[1]));
        if (v == NULL)
            return 1;
        CHECK(fsdp2_hf_model_read(m, t.name, 0, t.shape[0], FSDP2_F32, v));
        CHECK(fsdp2_hf_writer_write(w, t.name, FSDP2_F32, v));
        free(v);
    }
    CHECK(fsdp2_hf_writer_finish(w));
    CHECK(fsdp2_hf_model_close(m));
    printf("%s -> %s: %zu tensors\n", argv[1], argv[2], count);
    return 0;
}
