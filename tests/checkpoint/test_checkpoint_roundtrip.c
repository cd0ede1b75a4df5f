/* Sharded checkpoints with real processes (include/fsdp2/checkpoint.h, the format in
 * docs/checkpoint-format.md): what is saved comes back, at any world size. The model is
 * ckpt_model.h's: uneven rows, a 3-D f64 parameter, a buffer, an ignored (whole)
 * parameter and AdamW state, every value a formula of (slot, global index).
 *
 * - Resharding: saved at every ws in 1..4 and loaded at every ws in 1..4, every
 *   parameter, optimizer state and whole tensor come back bit for bit, with the step
 *   count, the report (step, version, saved ws, counts, and exactly the bytes of the
 *   saved chunks that overlap the rank's rows) and the user entries. The files on disk
 *   are checked without the loader: metadata.json parsed here, every chunk's bytes read
 *   from its rank file and compared with the formula and its CRC-32C, every rank file a
 *   safetensors file holding exactly its non-empty pieces.
 * - Resume: 3 steps, save, a fresh process group loads and runs 3 more: parameters,
 *   AdamW state and step count equal 6 uninterrupted steps bit for bit, at ws 2 -> 2
 *   (per-rank gradients) and 2 -> 3 (the same gradient on every rank, so the average is
 *   exact whatever the ws).
 *
 * What happens when something goes wrong is test_checkpoint_failures.c; whole-model
 * files are test_checkpoint_export.c. */
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

#define BLOCK (1u << 20) /* the format's checksum block */
#define MAX_WS 4

/* ---------------------------------------------------------------------------------- */
/* Expectations written out independently of the library                              */

/* Bytes a rank of ws_load reads when it loads a checkpoint saved at ws_save: of every
 * saved chunk that overlaps its rows, the overlap rounded out to the chunk's checksum
 * blocks, for each parameter and its two states; and the whole tensors. */
static uint64_t expected_bytes_read(int ws_save, int ws_load, int rank)
{
    param_spec_t specs[MAX_PARAMS];
    int np = variant_specs(VARIANT_BASE, specs);
    uint64_t total = 0;
    for (int i = 0; i < NUM_WHOLE; i++)
        total += (uint64_t)spec_numel(&WHOLE_SPEC[i]) * elem_size(WHOLE_SPEC[i].dtype);
    for (int j = 0; j < np; j++) {
        uint64_t row_bytes = (uint64_t)row_elems(&specs[j]) * elem_size(specs[j].dtype);
        int64_t lo, len;
        chunk_rows(specs[j].shape[0], ws_load, rank, &lo, &len);
        for (int p = 0; p < ws_save && len > 0; p++) {
            int64_t a, b;
            chunk_rows(specs[j].shape[0], ws_save, p, &a, &b);
            int64_t from = lo > a ? lo : a, to = lo + len < a + b ? lo + len : a + b;
            if (from >= to)
                continue;
            uint64_t start = (uint64_t)(from - a) * row_bytes, end = (uint64_t)(to - a) * row_bytes;
            uint64_t first = start / BLOCK * BLOCK, last = (end + BLOCK - 1) / BLOCK * BLOCK;
            if (last > (uint64_t)b * row_bytes)
                last = (uint64_t)b * row_bytes;
            total += 3 * (last - first);
        }
    }
    return total;
}

/* ---------------------------------------------------------------------------------- */
/* Checks inside the ranks                                                             */

static int check_report(const rank_ctx_t *c, const fsdp2_checkpoint_report_t *r, int64_t step,
                        int saved_ws, size_t loaded, uint64_t bytes_read, const char *when)
{
    int ok = r->step == step && r->version == 1 && r->saved_world_size == saved_ws &&
             r->loaded == loaded && r->missing == 0 && r->unexpected == 0 && r->mismatched == 0 &&
             r->missing_names[0] == '\0' && r->unexpected_names[0] == '\0' &&
             r->mismatched_names[0] == '\0' && r->bytes_read == bytes_read;
    return RANK_CHECK(c, ok,
                      "%s: report step %lld version %d saved ws %d loaded %zu missing %zu '%s' "
                      "unexpected %zu '%s' mismatched %zu '%s' bytes_read %llu; want step %lld "
                      "version 1 saved ws %d loaded %zu, nothing missing, unexpected or "
                      "mismatched, bytes_read %llu",
                      when, (long long)r->step, r->version, r->saved_world_size, r->loaded,
                      r->missing, r->missing_names, r->unexpected, r->unexpected_names,
                      r->mismatched, r->mismatched_names, (unsigned long long)r->bytes_read,
                      (long long)step, saved_ws, loaded, (unsigned long long)bytes_read);
}

/* ---------------------------------------------------------------------------------- */
/* 1. Resharding: any ws to any ws, bit for bit                                        */

/* Saves the formula (seed 0) with step count 7 to job->dir, step job->step. */
static int body_save_formula(rank_ctx_t *c)
{
    job_t *job = c->arg;
    int fails = 0;
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    model_t m = {0};
    if (!fails)
        fails += model_open(c, mesh, VARIANT_BASE, 1, &m);
    if (!fails)
        fails += model_fill(&m, 0);
    if (!fails)
        fails += OK(c, fsdp2_optimizer_set_steps(m.opt, SAVED_STEPS));
    if (!fails) /* the fill itself, through the gather, before anything is saved */
        fails += model_check(&m, 0, 0, NULL, 0, "before save");
    if (!fails)
        fails += model_save(&m, job->dir, job->step);
    fails += model_close(&m);
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

/* Loads every checkpoint root/ws<W> into a model holding other values. */
static int body_load_matrix(rank_ctx_t *c)
{
    job_t *job = c->arg;
    int fails = 0;
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    model_t m = {0};
    if (!fails)
        fails += model_open(c, mesh, VARIANT_BASE, 1, &m);
    for (int w = 1; w <= MAX_WS && !fails; w++) {
        char dir[512], when[64];
        snprintf(dir, sizeof(dir), "%s/ws%d", job->root, w);
        snprintf(when, sizeof(when), "saved at ws %d, loaded at ws %d", w, c->size);
        fails += model_fill(&m, 1);
        fails += OK(c, fsdp2_optimizer_set_steps(m.opt, 0));
        fsdp2_checkpoint_report_t report = {.size = sizeof(report)};
        if (w == c->size) /* the defaults: NULL options are strict */
            fails += OK(c, fsdp2_checkpoint_load(m.sd, dir, NULL, &report));
        else
            fails += model_load(&m, dir, 1, &report);
        if (fails)
            break;
        fails += check_report(c, &report, 100 * w, w, NUM_SLOTS_BASE,
                              expected_bytes_read(w, c->size, c->rank), when);
        fails += model_check_steps(&m, SAVED_STEPS, when);
        fails += model_check(&m, 0, 0, NULL, 0, when);
        char who[16] = "";
        fails += OK(c, fsdp2_checkpoint_extra(dir, "who", who, sizeof(who)));
        fails += RANK_CHECK(c, !strcmp(who, "test"), "%s: extra 'who' is '%s', want 'test'",
                            when, who);
        fails += REFUSED(c, fsdp2_checkpoint_extra(dir, "whom", who, sizeof(who)),
                         FSDP2_ERR_NOT_FOUND, "whom", NULL);
    }
    /* A load with no report still loads. */
    if (!fails) {
        char dir[512];
        snprintf(dir, sizeof(dir), "%s/ws%d", job->root, MAX_WS + 1 - c->size);
        fails += model_fill(&m, 1);
        fails += OK(c, fsdp2_checkpoint_load(m.sd, dir, NULL, NULL));
        fails += model_check(&m, 0, 0, NULL, 0, "load without a report");
    }
    fails += model_close(&m);
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

/* One tensor of metadata.json against the layout torch.chunk gives at ws (whole: one
 * chunk in rank 0's file), and each chunk's bytes in its file against the formula. */
static void check_tensor_layout(const char *dir, const cJSON *tensors, const char *name,
                                const param_spec_t *s, int slot, int whole, int ws)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(tensors, name);
    ck_assert_msg(cJSON_IsObject(t), "%s/metadata.json: no tensor '%s'", dir, name);
    ck_assert_msg(!strcmp(json_str(t, "dtype"), fsdp2_dtype_name(s->dtype)),
                  "%s: dtype '%s', want '%s'", name, json_str(t, "dtype"),
                  fsdp2_dtype_name(s->dtype));
    ck_assert_msg(json_dims_are(cJSON_GetObjectItemCaseSensitive(t, "shape"), s->shape, s->ndim),
                  "%s: shape is not [%lld,...] (%d dims)", name, (long long)s->shape[0], s->ndim);
    const char *want_placements = whole ? "whole" : "[Shard(dim=0)]";
    ck_assert_msg(!strcmp(json_str(t, "placements"), want_placements),
                  "%s: placements '%s', want '%s'", name, json_str(t, "placements"),
                  want_placements);
    const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(t, "chunks");
    int pieces = 0;
    for (int r = 0; r < (whole ? 1 : ws); r++) {
        int64_t off = 0, len = s->shape[0];
        if (!whole)
            chunk_rows(s->shape[0], ws, r, &off, &len);
        if (len == 0)
            continue;
        pieces++;
        char file[64];
        snprintf(file, sizeof(file), "rank-%05d.safetensors", r);
        const cJSON *k = NULL, *x;
        cJSON_ArrayForEach(x, chunks) if (!strcmp(json_str(x, "file"), file)) k = x;
        ck_assert_msg(k != NULL, "%s: no chunk in %s (rows %lld..%lld at ws %d)", name, file,
                      (long long)off, (long long)(off + len), ws);
        int64_t goff[3] = {off, 0, 0}, shape[3] = {len, s->shape[1], s->shape[2]};
        ck_assert_msg(json_dims_are(cJSON_GetObjectItemCaseSensitive(k, "global_offset"), goff,
                                    s->ndim) &&
                          json_dims_are(cJSON_GetObjectItemCaseSensitive(k, "shape"), shape,
                                        s->ndim),
                      "%s chunk in %s: global_offset or shape is not [%lld,0..] [%lld,..]", name,
                      file, (long long)off, (long long)len);
        int64_t n = len * row_elems(s);
        size_t bytes = (size_t)n * elem_size(s->dtype);
        ck_assert_msg(json_int(k, "bytes") == (int64_t)bytes, "%s chunk in %s: %lld bytes, want %zu",
                      name, file, (long long)json_int(k, "bytes"), bytes);
        char path[1024], *data;
        size_t size;
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        ck_assert_msg(read_all(path, &data, &size) == 0, "cannot read %s", path);
        int64_t at = json_int(k, "offset");
        ck_assert_msg(at > 8 && (size_t)at + bytes <= size, "%s chunk at %lld + %zu past %s (%zu)",
                      name, (long long)at, bytes, path, size);
        void *want = formula_bytes(s->dtype, 0, slot, off * row_elems(s), n);
        ck_assert_msg(!memcmp(data + at, want, bytes),
                      "%s: the bytes at %lld of %s are not the saved rows %lld..%lld", name,
                      (long long)at, path, (long long)off, (long long)(off + len));
        const cJSON *crc = cJSON_GetObjectItemCaseSensitive(k, "crc32c");
        int blocks = (int)((bytes + BLOCK - 1) / BLOCK);
        ck_assert_msg(cJSON_GetArraySize(crc) == blocks, "%s chunk in %s: %d checksums, want %d",
                      name, file, cJSON_GetArraySize(crc), blocks);
        for (int i = 0; i < blocks; i++) {
            size_t from = (size_t)i * BLOCK, n = bytes - from < BLOCK ? bytes - from : BLOCK;
            uint32_t computed = st_crc32c(0, data + at + from, n);
            double recorded = cJSON_GetArrayItem(crc, i)->valuedouble;
            ck_assert_msg((uint32_t)recorded == computed,
                          "%s chunk in %s: crc32c[%d] %.0f, computed %u", name, file, i, recorded,
                          computed);
        }
        free(want);
        free(data);
    }
    ck_assert_msg(cJSON_GetArraySize(chunks) == pieces, "%s: %d chunks, want %d (non-empty pieces)",
                  name, cJSON_GetArraySize(chunks), pieces);
}

/* Rank file r: a safetensors file (read by st_open) holding exactly r's non-empty pieces,
 * where metadata.json says they are. */
static void check_rank_file(const char *dir, const cJSON *tensors, int r, int ws)
{
    char path[1024], file[64], want_rank[16];
    snprintf(file, sizeof(file), "rank-%05d.safetensors", r);
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    snprintf(want_rank, sizeof(want_rank), "%d", r);
    st_file_t f;
    fsdp2_status_t s = st_open(path, &f);
    ck_assert_msg(s == FSDP2_SUCCESS, "st_open(%s) = %s (%s)", path, fsdp2_status_name(s),
                  fsdp2_last_error());
    const char *format = NULL, *rank = NULL;
    for (size_t i = 0; i < f.num_meta; i++) {
        if (!strcmp(f.meta[i].key, "format"))
            format = f.meta[i].value;
        if (!strcmp(f.meta[i].key, "rank"))
            rank = f.meta[i].value;
    }
    ck_assert_msg(format && rank && !strcmp(format, "libfsdp2-shard") && !strcmp(rank, want_rank),
                  "%s: __metadata__ format '%s' rank '%s', want 'libfsdp2-shard' '%s'", path,
                  format ? format : "(absent)", rank ? rank : "(absent)", want_rank);
    param_spec_t specs[MAX_PARAMS];
    int np = variant_specs(VARIANT_BASE, specs);
    size_t want_entries = 0;
    for (int i = 0; i < NUM_WHOLE && r == 0; i++) {
        ck_assert_msg(st_find(&f, WHOLE_SPEC[i].fqn) != NULL, "%s lacks whole tensor '%s'", path,
                      WHOLE_SPEC[i].fqn);
        want_entries++;
    }
    for (int j = 0; j < np; j++) {
        int64_t off, len;
        chunk_rows(specs[j].shape[0], ws, r, &off, &len);
        for (int st = 0; st < 3; st++) {
            char name[128];
            slot_name(&specs[j], st, name, sizeof(name));
            const st_entry_t *e = st_find(&f, name);
            ck_assert_msg((e != NULL) == (len > 0), "%s: entry '%s' %s, but rank %d holds %lld rows",
                          path, name, e ? "present" : "absent", r, (long long)len);
            if (!e)
                continue;
            want_entries++;
            const cJSON *k = NULL, *x;
            cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(
                                      cJSON_GetObjectItemCaseSensitive(tensors, name), "chunks"))
            if (!strcmp(json_str(x, "file"), file)) k = x;
            ck_assert_msg(k && e->shape[0] == len && e->dtype == specs[j].dtype &&
                              (int64_t)(f.data_start + e->begin) == json_int(k, "offset") &&
                              (int64_t)(e->end - e->begin) == json_int(k, "bytes"),
                          "%s: '%s' is %s [%lld..] at %llu..%llu, metadata says %lld (+%lld), "
                          "want %lld rows",
                          path, name, fsdp2_dtype_name(e->dtype), (long long)e->shape[0],
                          (unsigned long long)(f.data_start + e->begin),
                          (unsigned long long)(f.data_start + e->end),
                          (long long)json_int(k, "offset"), (long long)json_int(k, "bytes"),
                          (long long)len);
        }
    }
    ck_assert_msg(f.num_entries == want_entries, "%s: %zu entries, want %zu", path, f.num_entries,
                  want_entries);
    st_close(&f);
}

/* The directory holds metadata.json and one safetensors file per rank, nothing else. */
static void check_layout(const char *dir, int ws)
{
    char path[1024], listing[1024], want[1024];
    list_dir(dir, listing, sizeof(listing));
    snprintf(want, sizeof(want), "metadata.json");
    for (int r = 0; r < ws; r++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), " rank-%05d.safetensors", r);
    ck_assert_msg(!strcmp(listing, want), "%s holds '%s', want '%s'", dir, listing, want);
    snprintf(path, sizeof(path), "%s.partial", dir);
    ck_assert_msg(access(path, F_OK) != 0, "%s is left behind after a save", path);

    snprintf(path, sizeof(path), "%s/metadata.json", dir);
    cJSON *root = json_read(path);
    ck_assert_msg(cJSON_IsObject(root), "%s does not parse as a JSON object", path);
    int64_t mesh[1] = {ws};
    ck_assert_msg(!strcmp(json_str(root, "format"), "libfsdp2-checkpoint") &&
                      json_int(root, "version") == 1 && json_int(root, "world_size") == ws &&
                      json_int(root, "step") == 100 * ws &&
                      json_int(root, "optim.step") == SAVED_STEPS &&
                      json_int(root, "crc32c_block_bytes") == 1 << 20 &&
                      json_dims_are(cJSON_GetObjectItemCaseSensitive(root, "mesh"), mesh, 1),
                  "%s: format '%s' version %lld world_size %lld step %lld optim.step %lld "
                  "crc32c_block_bytes %lld; want libfsdp2-checkpoint 1 %d %d %d 1048576, mesh [%d]",
                  path, json_str(root, "format"), (long long)json_int(root, "version"),
                  (long long)json_int(root, "world_size"), (long long)json_int(root, "step"),
                  (long long)json_int(root, "optim.step"),
                  (long long)json_int(root, "crc32c_block_bytes"), ws, 100 * ws, SAVED_STEPS, ws);
    const char *who = json_str(cJSON_GetObjectItemCaseSensitive(root, "extra"), "who");
    ck_assert_msg(!strcmp(who, "test"), "%s: extra.who '%s', want 'test'", path, who);
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    ck_assert_msg(cJSON_GetArraySize(tensors) == NUM_SLOTS_BASE, "%s: %d tensors, want %d", path,
                  cJSON_GetArraySize(tensors), NUM_SLOTS_BASE);
    param_spec_t specs[MAX_PARAMS];
    int np = variant_specs(VARIANT_BASE, specs);
    for (int j = 0; j < np; j++) {
        for (int st = 0; st < 3; st++) {
            char name[128];
            slot_name(&specs[j], st, name, sizeof(name));
            check_tensor_layout(dir, tensors, name, &specs[j], 3 * specs[j].t + st, 0, ws);
        }
    }
    for (int i = 0; i < NUM_WHOLE; i++)
        check_tensor_layout(dir, tensors, WHOLE_SPEC[i].fqn, &WHOLE_SPEC[i], WHOLE_SLOT + i, 1, ws);
    for (int r = 0; r < ws; r++)
        check_rank_file(dir, tensors, r, ws);
    cJSON_Delete(root);
}

START_TEST(saved_at_each_ws_1_to_4_loads_bit_exact_at_each_ws_1_to_4)
{
    job_t job;
    make_scratch(&job);
    for (int w = 1; w <= MAX_WS; w++) {
        snprintf(job.dir, sizeof(job.dir), "%s/ws%d", job.root, w);
        job.step = 100 * w;
        run_case(w, body_save_formula, &job, "save");
        check_layout(job.dir, w);
    }
    for (int w = 1; w <= MAX_WS; w++)
        run_case(w, body_load_matrix, &job, "load every checkpoint");
    remove_tree(job.root);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 2. Resume equals uninterrupted training                                             */

/* Multiples of 1/64 below 1: the ranks' sum is exact in f32, so the average is exact
 * too; without the rank term every rank adds the same and the average is that value at
 * any ws. */
static double grad_value(int per_rank, int rank, int step, int t, int64_t k)
{
    return (double)((k * 7 + (per_rank ? rank * 13 : 0) + step * 5 + t * 3) % 17 - 8) / 64.0;
}

static int add_grads(model_t *m, int j, int step, int per_rank)
{
    fsdp2_tensor_t *g = NULL;
    int fails = OK(m->c, fsdp2_param_grad(m->p[j], &g));
    if (fails)
        return fails;
    fails += RANK_CHECK(m->c, g->numel == spec_numel(&m->spec[j]) && g->dtype == m->spec[j].dtype,
                        "%s: grad of %lld %s", m->spec[j].fqn, (long long)g->numel,
                        fsdp2_dtype_name(g->dtype));
    for (int64_t k = 0; k < g->numel && !fails; k++) {
        double v = grad_value(per_rank, m->c->rank, step, m->spec[j].t, k);
        if (g->dtype == FSDP2_F64)
            ((double *)g->data)[k] += v;
        else
            ((float *)g->data)[k] += (float)v;
    }
    return fails;
}

/* One step's hooks with no math: forward in tree order, backward in reverse, each
 * module's backward adding the gradient formula; then AdamW. */
static int train_step(model_t *m, int step, int per_rank)
{
    rank_ctx_t *c = m->c;
    int fails = OK(c, fsdp2_pre_forward(m->root));
    for (int i = 0; i < 3 && !fails; i++) {
        fails += OK(c, fsdp2_pre_forward(m->mods[i]));
        fails += OK(c, fsdp2_post_forward(m->mods[i]));
    }
    fails += fails ? 0 : OK(c, fsdp2_post_forward(m->root));
    fails += fails ? 0 : OK(c, fsdp2_pre_backward(m->root));
    for (int i = 2; i >= 0 && !fails; i--) {
        fails += OK(c, fsdp2_pre_backward(m->mods[i]));
        for (int j = 0; j < m->np && !fails; j++) {
            fsdp2_module_t *owner = NULL;
            fails += OK(c, fsdp2_param_module(m->p[j], &owner));
            if (owner == m->mods[i])
                fails += add_grads(m, j, step, per_rank);
        }
        fails += fails ? 0 : OK(c, fsdp2_post_backward(m->mods[i]));
    }
    fails += fails ? 0 : OK(c, fsdp2_post_backward(m->root));
    fails += fails ? 0 : OK(c, fsdp2_backward_finish(m->root));
    fails += fails ? 0 : OK(c, fsdp2_optimizer_step(m->opt));
    return fails ? fails : OK(c, fsdp2_optimizer_zero_grad(m->opt));
}

static int train(model_t *m, int first, int count, int per_rank)
{
    int fails = 0;
    for (int s = first; s < first + count && !fails; s++)
        fails += train_step(m, s, per_rank);
    return fails;
}

/* A fresh AdamW's state is zero; the model's open filled it with the formula. */
static int zero_states(model_t *m)
{
    int fails = 0;
    for (int j = 0; j < m->np && !fails; j++) {
        for (int s = 1; s < 3 && !fails; s++) {
            fsdp2_dtensor_t *dt = NULL;
            fsdp2_tensor_t *local = NULL;
            fails += model_slot_dtensor(m, j, s, &dt);
            fails += fails ? 0 : OK(m->c, fsdp2_dtensor_to_local(dt, &local));
            if (!fails && local->nbytes)
                memset(local->data, 0, local->nbytes);
            fsdp2_tensor_release(local);
        }
    }
    return fails;
}

/* Every parameter and state, whole, in slot order: rank 0 writes them to path (want
 * NULL), or every rank compares them with want (what path held). */
static int dump_or_compare(model_t *m, const char *path, const char *want, size_t want_len,
                           const char *when)
{
    rank_ctx_t *c = m->c;
    FILE *f = !want && c->rank == 0 ? fopen(path, "wb") : NULL;
    int fails = RANK_CHECK(c, want || c->rank != 0 || f, "cannot create %s", path);
    size_t at = 0;
    for (int j = 0; j < m->np; j++) {
        for (int s = 0; s < 3; s++) {
            char what[128];
            slot_name(&m->spec[j], s, what, sizeof(what));
            fsdp2_dtensor_t *dt = NULL;
            fsdp2_tensor_t *full = NULL;
            int f1 = model_slot_dtensor(m, j, s, &dt);
            f1 += f1 ? 0 : OK(c, fsdp2_dtensor_full_tensor(dt, NULL, &full));
            if (!f1 && f)
                f1 += RANK_CHECK(c, fwrite(full->data, 1, full->nbytes, f) == full->nbytes,
                                 "writing %s", path);
            if (!f1 && want) {
                f1 += RANK_CHECK(c, at + full->nbytes <= want_len, "%s: %s ends short", when,
                                 path);
                if (!f1)
                    f1 += compare_bits(c, what, when, full->dtype, full->data, want + at,
                                       full->numel);
            }
            at += full ? full->nbytes : 0;
            fsdp2_tensor_release(full);
            fails += f1;
        }
    }
    if (f)
        fails += RANK_CHECK(c, fclose(f) == 0, "closing %s", path);
    return fails;
}

/* The lr of the training runs: a cosine schedule on the optimizer, which the checkpoint
 * carries (the resumed run never sets it: a lost schedule would train its last 3 steps
 * at the options' lr and change the bits). */
static const fsdp2_lr_schedule_t SCHEDULE = {FSDP2_LR_COSINE, 0, 0.0, 2, 6, 1e-4};
#define SCHEDULE_BASE_LR 3e-3

static int check_schedule(rank_ctx_t *c, fsdp2_optimizer_t *opt, const char *when)
{
    fsdp2_lr_schedule_t got;
    double base = 0;
    int on = 0;
    int fails = OK(c, fsdp2_optimizer_lr_schedule(opt, &got, &base, &on));
    return fails + RANK_CHECK(c, on && got.kind == SCHEDULE.kind && got.warmup == SCHEDULE.warmup &&
                                     got.total == SCHEDULE.total && got.min_lr == SCHEDULE.min_lr &&
                                     base == SCHEDULE_BASE_LR,
                              "%s: lr schedule on %d, kind %d, warmup %lld, total %lld, min_lr "
                              "%g, base %g",
                              when, on, (int)got.kind, (long long)got.warmup,
                              (long long)got.total, got.min_lr, base);
}

/* 6 steps straight, dumped to job->dump; then, in a fresh tree, 3 steps saved to
 * job->dir. Both start from the formula (seed 0) and a zero AdamW state. */
static int body_train_straight_and_half(rank_ctx_t *c)
{
    job_t *job = c->arg;
    int fails = 0;
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    for (int half = 0; half < 2 && !fails; half++) {
        model_t m = {0};
        fails += model_open(c, mesh, VARIANT_BASE, 0, &m);
        fails += fails ? 0 : zero_states(&m);
        fails += fails ? 0 : OK(c, fsdp2_optimizer_set_lr_schedule(m.opt, &SCHEDULE, SCHEDULE_BASE_LR));
        fails += fails ? 0 : train(&m, 0, half ? 3 : 6, job->per_rank_grads);
        fails += fails ? 0 : model_check_steps(&m, half ? 3 : 6, "training");
        if (!fails && !half)
            fails += dump_or_compare(&m, job->dump, NULL, 0, "straight");
        if (!fails && half)
            fails += model_save(&m, job->dir, 3);
        fails += model_close(&m);
    }
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

/* A fresh tree loads the 3-step checkpoint and trains 3 more. */
static int body_resume(rank_ctx_t *c)
{
    job_t *job = c->arg;
    char when[64], *want = NULL;
    size_t want_len = 0;
    snprintf(when, sizeof(when), "resumed at ws %d after 3 steps at ws 2", c->size);
    int fails = RANK_CHECK(c, read_all(job->dump, &want, &want_len) == 0, "cannot read %s",
                           job->dump);
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    model_t m = {0};
    fails += fails ? 0 : model_open(c, mesh, VARIANT_BASE, 1, &m);
    fsdp2_checkpoint_report_t report = {.size = sizeof(report)};
    fails += fails ? 0 : model_load(&m, job->dir, 1, &report);
    fails += fails ? 0 : model_check_steps(&m, 3, when);
    fails += fails ? 0 : check_schedule(c, m.opt, when);
    fails += fails ? 0 : train(&m, 3, 3, job->per_rank_grads);
    fails += fails ? 0 : model_check_steps(&m, 6, when);
    fails += fails ? 0 : dump_or_compare(&m, job->dump, want, want_len, when);
    if (m.root)
        fails += model_close(&m);
    free(want);
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

static void resume_case(int resume_ws, int per_rank)
{
    job_t job;
    make_scratch(&job);
    job.per_rank_grads = per_rank;
    snprintf(job.dir, sizeof(job.dir), "%s/half", job.root);
    snprintf(job.dump, sizeof(job.dump), "%s/straight.bin", job.root);
    run_case(2, body_train_straight_and_half, &job, "train 6 steps; train 3 and save");
    run_case(resume_ws, body_resume, &job, "load and train 3 more");
    remove_tree(job.root);
}

START_TEST(resume_at_ws_2_equals_6_uninterrupted_steps_bit_for_bit)
{
    resume_case(2, 1);
}
END_TEST

START_TEST(resume_at_ws_3_of_a_ws_2_run_equals_6_uninterrupted_steps_bit_for_bit)
{
    resume_case(3, 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("checkpoint_roundtrip");
    TCase *tc = tcase_create("checkpoint_roundtrip");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, saved_at_each_ws_1_to_4_loads_bit_exact_at_each_ws_1_to_4);
    tcase_add_test(tc, resume_at_ws_2_equals_6_uninterrupted_steps_bit_for_bit);
    tcase_add_test(tc, resume_at_ws_3_of_a_ws_2_run_equals_6_uninterrupted_steps_bit_for_bit);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
