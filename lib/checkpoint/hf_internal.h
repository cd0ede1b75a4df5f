/* Hugging Face model directories (include/fsdp2/hf_model.h): what the reader
 * (hf_model.c) and the writer (hf_writer.c) share with the config code (hf_config.c). */
#ifndef FSDP2_CHECKPOINT_HF_INTERNAL_H
#define FSDP2_CHECKPOINT_HF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/hf_model.h>

#include "safetensors.h"

#define HF_NAME_MAX 96
/* config.json and the index: far above any published one, and bounded before a read. */
#define HF_MAX_JSON_BYTES ((size_t)64 << 20)

/* One tensor the config implies, canonical (hf_model.h). */
typedef struct hf_tensor {
    char name[HF_NAME_MAX];
    int ndim;
    int64_t shape[2];  /* canonical: [out, in] for linear weights */
    int transposed;    /* stored [in, out] (GPT-2 Conv1D) */
    const char *field; /* the config fields that set the shape, for messages */
} hf_tensor_t;

/* Parses config.json's text (what names it in messages) into *cfg and validates it. */
fsdp2_status_t hf_config_parse(const char *text, const char *what, fsdp2_hf_config_t *cfg);
/* The checks hf_config_parse ends with, for a config a caller filled in. */
fsdp2_status_t hf_config_validate(const fsdp2_hf_config_t *cfg, const char *what);
/* config.json's text for cfg (as save_pretrained writes the fields we know); torch_dtype
 * names dtype. Caller frees. */
fsdp2_status_t hf_config_to_json(const fsdp2_hf_config_t *cfg, fsdp2_dtype_t dtype, char **text);
/* The architecture's tensors in canonical order (caller frees *list). */
fsdp2_status_t hf_tensor_list(const fsdp2_hf_config_t *cfg, hf_tensor_t **list, size_t *count);
/* The name save_pretrained gives a canonical one (GPT-2: "transformer." prefixed, except
 * lm_head). */
void hf_stored_name(fsdp2_hf_arch_t arch, const char *canonical, char *out, size_t size);
/* Reads a whole small file (at most HF_MAX_JSON_BYTES) opened without blocking and
 * refused unless regular; NUL-terminated, caller frees. *missing (may be NULL) is set,
 * with no error recorded, when the file does not exist. */
fsdp2_status_t hf_read_text(const char *path, char **text, int *missing);
/* A directory written whole or not at all: hf_tmp_create checks dir (absent or empty, its
 * parent a directory) and makes a temporary directory beside it (*tmp, caller's);
 * hf_tmp_file writes a file into it (fsynced); hf_tmp_commit renames it to dir;
 * hf_tmp_remove deletes it with its files and frees tmp (NULL ignored). */
fsdp2_status_t hf_tmp_create(const char *dir, char **tmp);
fsdp2_status_t hf_tmp_file(const char *tmp, const char *name, const void *data, size_t len);
fsdp2_status_t hf_tmp_commit(const char *tmp, const char *dir);
void hf_tmp_remove(char *tmp);

/* Reads rows [row0, row0 + rows) of tensor t (canonical layout; transposed when the file
 * holds [in, out]) from entry of file into dst as f32 or bf16, converting from F32, BF16
 * or F16 and refusing a NaN or an infinity by its flat index in the file. */
fsdp2_status_t hf_read_rows(const st_file_t *file, const st_entry_t *entry, const hf_tensor_t *t,
                            int64_t row0, int64_t rows, fsdp2_dtype_t dst_dtype, void *dst);

/* Refuses a config struct of a size this library does not know (there is one version). */
fsdp2_status_t hf_config_check_size(const fsdp2_hf_config_t *cfg, const char *what);

#endif
