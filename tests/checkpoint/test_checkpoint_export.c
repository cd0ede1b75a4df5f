/* Whole-model safetensors files with real processes (fsdp2_checkpoint_export_full and
 * _import_full in include/fsdp2/checkpoint.h), on the model of ckpt_model.h: exported at
 * ws 3 (checked here with an independent safetensors parser, and by Python's safetensors
 * when it is installed), imported at ws 1, 2, 4 (each rank reading only its rows); a
 * strict import into a model with one more parameter fails naming it and changes
 * nothing, a non-strict one loads the rest.
 *
 * Sharded checkpoints are test_checkpoint_roundtrip.c and test_checkpoint_failures.c. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint/safetensors.h"
#include "ckpt_disk.h"
#include "ckpt_model.h"

#include "../core/check_main.h"

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* The exported file read without the library: the 8-byte length, the header (JSON,
 * data 8-byte aligned), every model tensor whole with the formula's bytes at its
 * offsets, the tensors tiling the data, and nothing else. */
static int check_full_file_by_hand(const rank_ctx_t *c, const char *path)
{
    char *file;
    size_t size;
    int fails = RANK_CHECK(c, read_all(path, &file, &size) == 0 && size >= 8, "cannot read %s",
                           path);
    if (fails)
        return fails;
    uint64_t n = le64((const unsigned char *)file);
    fails += RANK_CHECK(c, n + 8 <= size && (n + 8) % 8 == 0,
                        "%s: header length %llu in a file of %zu (data must start 8-aligned)",
                        path, (unsigned long long)n, size);
    cJSON *h = fails ? NULL : cJSON_ParseWithLength(file + 8, (size_t)n);
    fails += RANK_CHECK(c, fails || cJSON_IsObject(h), "%s: header is not a JSON object", path);
    if (fails) {
        free(file);
        return fails;
    }
    const char *data = file + 8 + n;
    uint64_t data_size = size - 8 - n, covered = 0;
    const char *format = json_str(cJSON_GetObjectItemCaseSensitive(h, "__metadata__"), "format");
    fails += RANK_CHECK(c, !strcmp(format, "pt"), "%s: __metadata__.format '%s', want 'pt'", path,
                        format);
    param_spec_t specs[MAX_PARAMS + NUM_WHOLE];
    int slots[MAX_PARAMS + NUM_WHOLE];
    int n_model = model_tensors(specs, slots);
    fails += RANK_CHECK(c, cJSON_GetArraySize(h) == n_model + 1,
                        "%s: %d header entries, want %d tensors and __metadata__", path,
                        cJSON_GetArraySize(h), n_model);
    for (int j = 0; j < n_model && !fails; j++) {
        const param_spec_t *s = &specs[j];
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(h, s->fqn);
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        const char *want_dtype = s->dtype == FSDP2_F64 ? "F64" : "F32";
        uint64_t bytes = (uint64_t)spec_numel(s) * elem_size(s->dtype);
        uint64_t b = cJSON_GetArraySize(offs) == 2 ? (uint64_t)cJSON_GetArrayItem(offs, 0)->valuedouble : 0;
        uint64_t z = cJSON_GetArraySize(offs) == 2 ? (uint64_t)cJSON_GetArrayItem(offs, 1)->valuedouble : 0;
        fails += RANK_CHECK(c, e && !strcmp(json_str(e, "dtype"), want_dtype) &&
                                   json_dims_are(cJSON_GetObjectItemCaseSensitive(e, "shape"),
                                                 s->shape, s->ndim) &&
                                   z - b == bytes && z <= data_size,
                            "%s: '%s' is %s with offsets %llu..%llu; want %s, full shape "
                            "[%lld,..], %llu bytes within %llu",
                            path, s->fqn, e ? json_str(e, "dtype") : "(absent)",
                            (unsigned long long)b, (unsigned long long)z, want_dtype,
                            (long long)s->shape[0], (unsigned long long)bytes,
                            (unsigned long long)data_size);
        if (fails)
            break;
        void *want = formula_bytes(s->dtype, 0, slots[j], 0, spec_numel(s));
        fails += compare_bits(c, s->fqn, "in the exported file", s->dtype, data + b, want,
                              spec_numel(s));
        free(want);
        covered += bytes;
    }
    fails += RANK_CHECK(c, fails || covered == data_size,
                        "%s: tensors cover %llu of %llu data bytes", path,
                        (unsigned long long)covered, (unsigned long long)data_size);
    cJSON_Delete(h);
    free(file);
    return fails;
}

/* The same file through st_open: model tensors only, full shapes. */
static int check_full_file_st(const rank_ctx_t *c, const char *path)
{
    st_file_t f;
    int fails = OK(c, st_open(path, &f));
    if (fails)
        return fails;
    param_spec_t specs[MAX_PARAMS + NUM_WHOLE];
    int slots[MAX_PARAMS + NUM_WHOLE];
    int np = model_tensors(specs, slots);
    fails += RANK_CHECK(c, f.num_entries == (size_t)np, "%s: %zu entries, want %d", path,
                        f.num_entries, np);
    for (size_t i = 0; i < f.num_entries; i++)
        fails += RANK_CHECK(c, strncmp(f.entries[i].name, "optim.", 6) != 0,
                            "%s holds optimizer state '%s'", path, f.entries[i].name);
    for (int j = 0; j < np; j++) {
        const st_entry_t *e = st_find(&f, specs[j].fqn);
        fails += RANK_CHECK(c, e && e->dtype == specs[j].dtype && e->ndim == specs[j].ndim &&
                                   e->shape[0] == specs[j].shape[0],
                            "%s: '%s' %s, want %s with %lld rows", path, specs[j].fqn,
                            e ? "has another dtype or shape" : "is absent",
                            fsdp2_dtype_name(specs[j].dtype), (long long)specs[j].shape[0]);
    }
    st_close(&f);
    return fails;
}

static int body_export(rank_ctx_t *c)
{
    job_t *job = c->arg;
    int fails = 0;
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    model_t m = {0};
    fails += fails ? 0 : model_open(c, mesh, VARIANT_BASE, 0, &m);
    fails += fails ? 0 : OK(c, fsdp2_checkpoint_export_full(m.sd, job->dir));
    if (!fails && c->rank == 0) {
        char partial[1024];
        snprintf(partial, sizeof(partial), "%s.partial", job->dir);
        fails += RANK_CHECK(c, access(partial, F_OK) != 0, "%s left behind", partial);
        fails += check_full_file_st(c, job->dir);
        fails += check_full_file_by_hand(c, job->dir);
    }
    fails += fails ? 0 : model_check(&m, 0, 0, NULL, 0, "after export (unchanged)");
    if (m.root)
        fails += model_close(&m);
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

/* head.bias is not in the file: strict names it and imports nothing; non-strict imports
 * the rest. */
static int import_into_extra(rank_ctx_t *c, fsdp2_mesh_t *mesh, const char *path)
{
    model_t m = {0};
    int fails = model_open(c, mesh, VARIANT_EXTRA_PARAM, 1, &m);
    fsdp2_checkpoint_report_t report = {.size = sizeof(report)};
    fsdp2_checkpoint_options_t o = FSDP2_CHECKPOINT_OPTIONS_INIT;
    if (!fails) {
        fails += REFUSED(c, fsdp2_checkpoint_import_full(m.sd, path, &o, &report), FSDP2_SUCCESS,
                         "head.bias", NULL);
        fails += model_check(&m, 1, 1, NULL, 0, "after a refused strict import");
        o.strict = 0;
        fails += OK(c, fsdp2_checkpoint_import_full(m.sd, path, &o, &report));
        fails += RANK_CHECK(c, report.loaded == (size_t)(m.np - 1 + NUM_WHOLE) &&
                                   report.missing == 1 && !strcmp(report.missing_names, "head.bias") &&
                                   report.unexpected == 0 && report.mismatched == 0,
                            "non-strict import: loaded %zu missing %zu '%s' unexpected %zu "
                            "mismatched %zu; want %d, 1 'head.bias', 0, 0",
                            report.loaded, report.missing, report.missing_names, report.unexpected,
                            report.mismatched, m.np - 1 + NUM_WHOLE);
        fails += model_check(&m, 0, 1, "head.bias", 1, "after a non-strict import");
    }
    return fails + model_close(&m);
}

/* Collective: every parameter of a and b, gathered whole, holds the same bytes. */
static int params_equal(rank_ctx_t *c, model_t *a, model_t *b, const char *when)
{
    int fails = 0;
    for (int j = 0; j < a->np; j++) {
        fsdp2_dtensor_t *da = NULL, *db = NULL;
        fsdp2_tensor_t *fa = NULL, *fb = NULL;
        int f = model_slot_dtensor(a, j, 0, &da) + model_slot_dtensor(b, j, 0, &db);
        if (!f)
            f += OK(c, fsdp2_dtensor_full_tensor(da, NULL, &fa));
        if (!f)
            f += OK(c, fsdp2_dtensor_full_tensor(db, NULL, &fb));
        if (!f)
            f += RANK_CHECK(c, fa->nbytes == fb->nbytes && !memcmp(fa->data, fb->data, fa->nbytes),
                            "%s: parameter '%s' differs", when, a->spec[j].fqn);
        fsdp2_tensor_release(fa);
        fsdp2_tensor_release(fb);
        fails += f;
    }
    return fails;
}

/* A model declared on meta and never materialised gets its values from import_full:
 * saving it is refused before (nothing to save) and works after; loading that save into
 * a model of other values gives it the imported parameters. */
static int import_into_meta(rank_ctx_t *c, fsdp2_mesh_t *mesh, const char *path,
                            const char *save_dir)
{
    model_t meta = {0}, ref = {0}, other = {0};
    int fails = model_open(c, mesh, VARIANT_BASE, -1, &meta);
    fails += fails ? 0 : model_open(c, mesh, VARIANT_BASE, 0, &ref);
    fails += fails ? 0 : model_open(c, mesh, VARIANT_BASE, 1, &other);
    if (!fails) {
        fails += REFUSED(c, fsdp2_checkpoint_save(meta.sd, save_dir, NULL),
                         FSDP2_ERR_INVALID_STATE, "never materialized", NULL);
        fails += OK(c, fsdp2_checkpoint_import_full(meta.sd, path, NULL, NULL));
        fails += params_equal(c, &meta, &ref, "meta model after import_full");
    }
    fails += fails ? 0 : model_save(&meta, save_dir, 3);
    fsdp2_checkpoint_report_t report = {.size = sizeof(report)};
    fails += fails ? 0 : model_load(&other, save_dir, 1, &report);
    fails += fails ? 0 : params_equal(c, &other, &ref, "loaded from the imported meta model");
    if (meta.root)
        fails += model_close(&meta);
    if (ref.root)
        fails += model_close(&ref);
    if (other.root)
        fails += model_close(&other);
    return fails;
}

static int body_import(rank_ctx_t *c)
{
    job_t *job = c->arg;
    int fails = 0;
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    model_t m = {0};
    fails += fails ? 0 : model_open(c, mesh, VARIANT_BASE, 1, &m);
    fails += fails ? 0 : OK(c, fsdp2_optimizer_set_steps(m.opt, 5));
    fsdp2_checkpoint_report_t report = {.size = sizeof(report)};
    fails += fails ? 0 : OK(c, fsdp2_checkpoint_import_full(m.sd, job->dir, NULL, &report));
    if (fails)
        goto out;
    /* This rank's rows of each parameter, and the whole tensors. */
    uint64_t bytes = 0;
    for (int i = 0; i < NUM_WHOLE; i++)
        bytes += (uint64_t)spec_numel(&WHOLE_SPEC[i]) * elem_size(WHOLE_SPEC[i].dtype);
    for (int j = 0; j < m.np; j++) {
        int64_t off, len;
        chunk_rows(m.spec[j].shape[0], c->size, c->rank, &off, &len);
        bytes += (uint64_t)(len * row_elems(&m.spec[j])) * elem_size(m.spec[j].dtype);
    }
    char when[64];
    snprintf(when, sizeof(when), "imported at ws %d", c->size);
    fails += RANK_CHECK(c, report.loaded == (size_t)(m.np + NUM_WHOLE) && report.missing == 0 &&
                               report.unexpected == 0 && report.mismatched == 0 &&
                               report.bytes_read == bytes,
                        "%s: report loaded %zu missing %zu '%s' unexpected %zu '%s' mismatched "
                        "%zu '%s' bytes_read %llu; want %d loaded, nothing else, %llu bytes "
                        "(this rank's rows)",
                        when, report.loaded, report.missing, report.missing_names,
                        report.unexpected, report.unexpected_names, report.mismatched,
                        report.mismatched_names, (unsigned long long)report.bytes_read,
                        m.np + NUM_WHOLE,
                        (unsigned long long)bytes);
    /* The optimizer's state and step count are not in the file: untouched. */
    fails += model_check(&m, 0, 1, NULL, 0, when);
    fails += model_check_steps(&m, 5, when);
    if (c->size == 2 && !fails)
        fails += import_into_extra(c, mesh, job->dir);
    if (c->size == 2 && !fails) {
        char save_dir[1100];
        snprintf(save_dir, sizeof(save_dir), "%s.meta-save", job->dir);
        fails += import_into_meta(c, mesh, job->dir, save_dir);
    }
out:
    if (m.root)
        fails += model_close(&m);
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

/* Python's safetensors reads the file (when installed): it writes each tensor's bytes,
 * which must be the formula's. */
static void check_with_python(const char *path, const char *root)
{
    if (system("python3 -c 'import numpy, safetensors.numpy' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "note: python3 safetensors/numpy not installed: the exported file was "
                        "not read by Python\n");
        return;
    }
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "python3 -c 'import sys, safetensors.numpy as s\n"
             "for k, v in s.load_file(sys.argv[1]).items():\n"
             "    open(sys.argv[2] + \"/py-\" + k, \"wb\").write(v.tobytes())' '%s' '%s'",
             path, root);
    ck_assert_msg(system(cmd) == 0, "Python safetensors failed to read %s", path);
    param_spec_t specs[MAX_PARAMS + NUM_WHOLE];
    int slots[MAX_PARAMS + NUM_WHOLE];
    int n_model = model_tensors(specs, slots);
    for (int j = 0; j < n_model; j++) {
        char file[1024], *got;
        size_t len;
        snprintf(file, sizeof(file), "%s/py-%s", root, specs[j].fqn);
        ck_assert_msg(read_all(file, &got, &len) == 0, "Python did not return '%s'", specs[j].fqn);
        size_t bytes = (size_t)spec_numel(&specs[j]) * elem_size(specs[j].dtype);
        void *want = formula_bytes(specs[j].dtype, 0, slots[j], 0, spec_numel(&specs[j]));
        ck_assert_msg(len == bytes && !memcmp(got, want, bytes),
                      "Python read '%s' as %zu bytes that differ from the %zu saved",
                      specs[j].fqn, len, bytes);
        free(want);
        free(got);
    }
}

START_TEST(a_whole_model_file_exported_at_ws_3_imports_bit_exact_at_ws_1_2_4)
{
    job_t job;
    make_scratch(&job);
    snprintf(job.dir, sizeof(job.dir), "%s/model.safetensors", job.root);
    run_case(3, body_export, &job, "export_full");
    check_with_python(job.dir, job.root);
    const int ws[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++)
        run_case(ws[i], body_import, &job, "import_full");
    remove_tree(job.root);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("checkpoint_export");
    TCase *tc = tcase_create("checkpoint_export");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, a_whole_model_file_exported_at_ws_3_imports_bit_exact_at_ws_1_2_4);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
