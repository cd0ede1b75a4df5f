/* Sharded checkpoints with real processes (include/fsdp2/checkpoint.h, the format in
 * docs/checkpoint-format.md), on the model of ckpt_model.h: uneven rows, a 3-D f64
 * parameter, a buffer, an ignored (whole) parameter and AdamW state, every value a formula
 * of (slot, global index).
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
 * - Crash safety: a save whose "<dir>.partial" cannot be made fails on every rank and
 *   leaves the previous checkpoint loadable; the residue of a crash (a partial directory
 *   with a half-written rank file, no metadata) is not a checkpoint, does not disturb the
 *   previous one, and the next save replaces both.
 * - Bad inputs, made by editing copies of a good checkpoint: each load fails on every
 *   rank with an error naming the offending file or tensor, and nothing crashes.
 * - Strict loads of a model with an extra, a reshaped, a missing or a retyped parameter
 *   fail naming it and change nothing; non-strict loads load the rest and report the
 *   difference.
 * - Whole-model files: exported at ws 3 (checked here with an independent safetensors
 *   parser, and by Python's safetensors when it is installed), imported at ws 1, 2, 4
 *   (each rank reading only its rows); a strict import into a model with one more
 *   parameter fails naming it and changes nothing, a non-strict one loads the rest.
 * - Paths: "ckpt/" saves and replaces "ckpt"; a save over a regular file either refuses
 *   and leaves the file, or replaces it and loads; an export over a directory fails and
 *   leaves no partial file. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint/safetensors.h"
#include "ckpt_model.h"

#include "../core/check_main.h"

#define SAVED_STEPS 7
#define NUM_SLOTS_BASE 17 /* 5 parameters x (value, exp_avg, exp_avg_sq) + 2 whole tensors */
#define BLOCK (1u << 20) /* the format's checksum block */
#define MAX_WS 4

typedef struct job {
    char root[128]; /* the test's scratch directory */
    char dir[256];  /* the checkpoint directory or whole-model file */
    char dump[256]; /* resume: the uninterrupted run's tensors */
    int per_rank_grads;
    int64_t step;
} job_t;

/* ---------------------------------------------------------------------------------- */
/* Files                                                                               */

/* The whole regular file at path, NUL-terminated, into *buf (NULL on failure). */
static int read_all(const char *path, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        if (f)
            fclose(f);
        return -1;
    }
    *buf = malloc((size_t)st.st_size + 1);
    size_t got = *buf ? fread(*buf, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!*buf || got != (size_t)st.st_size) {
        free(*buf);
        *buf = NULL;
        return -1;
    }
    (*buf)[got] = '\0';
    *len = got;
    return 0;
}

static int write_all(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t put = fwrite(buf, 1, len, f);
    return fclose(f) == 0 && put == len ? 0 : -1;
}

/* The first `limit` bytes of src (all of them when limit is SIZE_MAX) into dst. */
static int copy_file(const char *src, const char *dst, size_t limit)
{
    char *buf;
    size_t len;
    int rc = read_all(src, &buf, &len);
    if (rc == 0)
        rc = write_all(dst, buf, len < limit ? len : limit);
    free(buf);
    return rc;
}

/* A flat directory (a checkpoint holds only files). */
static int copy_dir(const char *src, const char *dst)
{
    DIR *d = opendir(src);
    if (!d)
        return -1;
    if (mkdir(dst, 0755) != 0) {
        closedir(d);
        return -1;
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) && rc == 0) {
        if (e->d_name[0] == '.')
            continue;
        char a[2048], b[2048];
        snprintf(a, sizeof(a), "%s/%s", src, e->d_name);
        snprintf(b, sizeof(b), "%s/%s", dst, e->d_name);
        rc = copy_file(a, b, SIZE_MAX);
    }
    closedir(d);
    return rc;
}

/* The names in dir (not . and ..), sorted, joined by spaces. */
static void list_dir(const char *dir, char *out, size_t len)
{
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, ".."))
            snprintf(out + strlen(out), len - strlen(out), "%s%s", out[0] ? " " : "",
                     names[i]->d_name);
        free(names[i]);
    }
    free(names);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void remove_tree(const char *path)
{
    nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void make_scratch(job_t *job)
{
    memset(job, 0, sizeof(*job));
    const char *tmp = getenv("TMPDIR");
    snprintf(job->root, sizeof(job->root), "%s/fsdp2-ckpt-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(job->root) != NULL, "mkdtemp %s: %s", job->root, strerror(errno));
}

static cJSON *json_read(const char *path)
{
    char *text;
    size_t len;
    cJSON *root = read_all(path, &text, &len) == 0 ? cJSON_Parse(text) : NULL;
    free(text);
    return root;
}

static int json_write(const char *path, const cJSON *root)
{
    char *text = cJSON_Print(root);
    int rc = text ? write_all(path, text, strlen(text)) : -1;
    cJSON_free(text);
    return rc;
}

/* ---------------------------------------------------------------------------------- */
/* Expectations written out independently of the library                              */

static void slot_name(const param_spec_t *s, int st, char *buf, size_t len)
{
    if (st == 0)
        snprintf(buf, len, "%s", s->fqn);
    else
        snprintf(buf, len, "optim.state.%s.%s", s->fqn, STATE_NAME[st - 1]);
}

static size_t elem_size(fsdp2_dtype_t dtype)
{
    return dtype == FSDP2_F64 ? 8 : 4;
}

static int64_t row_elems(const param_spec_t *s)
{
    return spec_numel(s) / s->shape[0];
}

/* value_of(seed, slot, first + i) for i < n, stored as dtype. */
static void *formula_bytes(fsdp2_dtype_t dtype, int seed, int slot, int64_t first, int64_t n)
{
    char *buf = malloc((size_t)(n ? n : 1) * 8);
    for (int64_t i = 0; i < n; i++) {
        double v = value_of(seed, slot, first + i);
        if (dtype == FSDP2_F64) {
            memcpy(buf + i * 8, &v, 8);
        } else {
            float f = (float)v;
            memcpy(buf + i * 4, &f, 4);
        }
    }
    return buf;
}

/* The base model's tensors (no optimizer state) and their formula slots. */
static int model_tensors(param_spec_t *specs, int *slots)
{
    int n = variant_specs(VARIANT_BASE, specs);
    for (int j = 0; j < n; j++)
        slots[j] = 3 * specs[j].t;
    for (int i = 0; i < NUM_WHOLE; i++, n++) {
        specs[n] = WHOLE_SPEC[i];
        slots[n] = WHOLE_SLOT + i;
    }
    return n;
}

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

static int check_steps(model_t *m, int64_t want, const char *when)
{
    int64_t steps = -1;
    int fails = OK(m->c, fsdp2_optimizer_steps(m->opt, &steps));
    return fails + RANK_CHECK(m->c, steps == want, "%s: optimizer step count %lld, want %lld",
                              when, (long long)steps, (long long)want);
}

static int save(model_t *m, const char *dir, int64_t step)
{
    const char *keys[1] = {"who"}, *values[1] = {"test"};
    fsdp2_checkpoint_options_t o = FSDP2_CHECKPOINT_OPTIONS_INIT;
    o.step = step;
    o.extra_keys = keys;
    o.extra_values = values;
    o.num_extra = 1;
    return OK(m->c, fsdp2_checkpoint_save(m->sd, dir, &o));
}

static int load(model_t *m, const char *dir, int strict, fsdp2_checkpoint_report_t *report)
{
    fsdp2_checkpoint_options_t o = FSDP2_CHECKPOINT_OPTIONS_INIT;
    o.strict = strict;
    report->size = sizeof(*report);
    return OK(m->c, fsdp2_checkpoint_load(m->sd, dir, &o, report));
}

static int barrier(rank_ctx_t *c, const char *name)
{
    return OK(c, fsdp2_store_barrier(c->store, name));
}

static void run_case(int ws, rank_fn body, job_t *job, const char *what)
{
    ranks_result_t res;
    int rc = run_ranks(ws, body, job, GROUP_TIMEOUT_MS, DEADLINE_S, &res);
    ck_assert_msg(rc == 0,
                  "%s with %d ranks: %s (rank exit codes %d %d %d %d; see stderr; files left in "
                  "%s)",
                  what, ws, res.timed_out ? "timed out" : "a rank failed", res.status[0],
                  res.status[1], res.status[2], res.status[3], job->root);
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
        fails += save(&m, job->dir, job->step);
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
            fails += load(&m, dir, 1, &report);
        if (fails)
            break;
        fails += check_report(c, &report, 100 * w, w, NUM_SLOTS_BASE,
                              expected_bytes_read(w, c->size, c->rank), when);
        fails += check_steps(&m, SAVED_STEPS, when);
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

static int64_t json_int(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? (int64_t)x->valuedouble : -999;
}

static const char *json_str(const cJSON *o, const char *key)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
    return s ? s : "(absent)";
}

/* The int array a equals v[0..n). */
static int json_dims_are(const cJSON *a, const int64_t *v, int n)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return 0;
    for (int i = 0; i < n; i++)
        if (!cJSON_IsNumber(cJSON_GetArrayItem(a, i)) ||
            (int64_t)cJSON_GetArrayItem(a, i)->valuedouble != v[i])
            return 0;
    return 1;
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
        fails += fails ? 0 : train(&m, 0, half ? 3 : 6, job->per_rank_grads);
        fails += fails ? 0 : check_steps(&m, half ? 3 : 6, "training");
        if (!fails && !half)
            fails += dump_or_compare(&m, job->dump, NULL, 0, "straight");
        if (!fails && half)
            fails += save(&m, job->dir, 3);
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
    fails += fails ? 0 : load(&m, job->dir, 1, &report);
    fails += fails ? 0 : check_steps(&m, 3, when);
    fails += fails ? 0 : train(&m, 3, 3, job->per_rank_grads);
    fails += fails ? 0 : check_steps(&m, 6, when);
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

/* ---------------------------------------------------------------------------------- */
/* 3. A save that fails or crashes leaves the previous checkpoint whole                */

static int body_crash(rank_ctx_t *c)
{
    job_t *job = c->arg;
    char partial[512];
    snprintf(partial, sizeof(partial), "%s.partial", job->dir);
    int fails = 0;
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    model_t m = {0};
    fsdp2_checkpoint_report_t report = {.size = sizeof(report)};
    fails += fails ? 0 : model_open(c, mesh, VARIANT_BASE, 0, &m);
    fails += fails ? 0 : OK(c, fsdp2_optimizer_set_steps(m.opt, SAVED_STEPS));
    fails += fails ? 0 : save(&m, job->dir, 1);
    if (fails)
        goto out;

    /* (a) A regular file where the partial directory goes: the save cannot start. */
    if (c->rank == 0)
        fails += RANK_CHECK(c, write_all(partial, "in the way\n", 11) == 0, "creating %s",
                            partial);
    fails += barrier(c, "blocked");
    fails += model_fill(&m, 2);
    fails += OK(c, fsdp2_optimizer_set_steps(m.opt, 9));
    const char *keys[1] = {"who"}, *values[1] = {"blocked"};
    fsdp2_checkpoint_options_t o = FSDP2_CHECKPOINT_OPTIONS_INIT;
    o.step = 2;
    o.extra_keys = keys;
    o.extra_values = values;
    o.num_extra = 1;
    fails += REFUSED(c, fsdp2_checkpoint_save(m.sd, job->dir, &o), FSDP2_ERR_IO, partial, NULL);
    fails += model_fill(&m, 1);
    fails += load(&m, job->dir, 1, &report);
    fails += RANK_CHECK(c, report.step == 1, "after the failed save: step %lld, want 1",
                        (long long)report.step);
    fails += check_steps(&m, SAVED_STEPS, "after the failed save");
    fails += model_check(&m, 0, 0, NULL, 0, "after the failed save");
    char who[16] = "";
    fails += OK(c, fsdp2_checkpoint_extra(job->dir, "who", who, sizeof(who)));
    fails += RANK_CHECK(c, !strcmp(who, "test"), "after the failed save: extra who '%s'", who);
    fails += barrier(c, "blocked done");
    if (fails)
        goto out;

    /* (b) What a crash mid-save leaves: the partial directory with half a rank file and
     * a stale one from a larger run, and no metadata.json. */
    if (c->rank == 0) {
        char src[1024], dst[1024];
        snprintf(src, sizeof(src), "%s/rank-00000.safetensors", job->dir);
        snprintf(dst, sizeof(dst), "%s/rank-00000.safetensors", partial);
        struct stat st;
        int ok = unlink(partial) == 0 && mkdir(partial, 0755) == 0 && stat(src, &st) == 0 &&
                 copy_file(src, dst, (size_t)st.st_size / 2) == 0;
        snprintf(dst, sizeof(dst), "%s/rank-00007.safetensors", partial);
        ok = ok && write_all(dst, "stale", 5) == 0;
        fails += RANK_CHECK(c, ok, "making the crash residue in %s: %s", partial, strerror(errno));
    }
    fails += barrier(c, "residue");
    fails += model_fill(&m, 1);
    fails += load(&m, job->dir, 1, &report);
    fails += model_check(&m, 0, 0, NULL, 0, "beside a crashed save's residue");
    fails += REFUSED(c, fsdp2_checkpoint_load(m.sd, partial, NULL, &report), FSDP2_ERR_NOT_FOUND,
                     "metadata.json", NULL);
    fails += model_check(&m, 0, 0, NULL, 0, "after refusing the partial directory");
    fails += model_fill(&m, 2);
    fails += OK(c, fsdp2_optimizer_set_steps(m.opt, 9));
    fails += save(&m, job->dir, 2);
    fails += RANK_CHECK(c, access(partial, F_OK) != 0, "%s still exists after the save",
                        partial);
    char listing[512];
    list_dir(job->dir, listing, sizeof(listing));
    fails += RANK_CHECK(c, !strcmp(listing,
                                   "metadata.json rank-00000.safetensors rank-00001.safetensors"),
                        "%s holds '%s' after the save, want metadata.json and 2 rank files",
                        job->dir, listing);
    fails += model_fill(&m, 1);
    fails += load(&m, job->dir, 1, &report);
    fails += RANK_CHECK(c, report.step == 2, "after the new save: step %lld, want 2",
                        (long long)report.step);
    fails += check_steps(&m, 9, "after the new save");
    fails += model_check(&m, 2, 2, NULL, 0, "after the new save");
out:
    if (m.root)
        fails += model_close(&m);
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

START_TEST(a_failed_or_crashed_save_leaves_the_previous_checkpoint_and_the_next_save_replaces_it)
{
    job_t job;
    make_scratch(&job);
    snprintf(job.dir, sizeof(job.dir), "%s/ckpt", job.root);
    run_case(2, body_crash, &job, "crash");
    remove_tree(job.root);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 4. Bad inputs                                                                       */

typedef enum bad {
    BAD_TRUNCATED,
    BAD_FLIPPED_BYTE,
    BAD_VERSION,
    BAD_DTYPE,
    BAD_OVERLAP,
    BAD_GAP,
    BAD_NOT_JSON,
    BAD_ESCAPING_FILE,
    BAD_ABSENT_FILE,
    BAD_OFFSET,
    BAD_EMPTY_METADATA,
    NUM_BAD
} bad_t;

/* Every corruption touches what every rank reads (metadata.json, or the buffer, which
 * every rank reads whole from rank 0's file), so every rank must fail. */
static const struct {
    const char *what;
    fsdp2_status_t want; /* FSDP2_SUCCESS: any error */
    const char *needle1, *needle2;
} BAD[NUM_BAD] = {
    [BAD_TRUNCATED] = {"rank file truncated", FSDP2_ERR_CORRUPT, "rank-00000.safetensors", NULL},
    [BAD_FLIPPED_BYTE] = {"one data byte flipped", FSDP2_ERR_CORRUPT, "checksum", "enc.running"},
    [BAD_VERSION] = {"version 99", FSDP2_ERR_UNSUPPORTED, "99", "metadata.json"},
    [BAD_DTYPE] = {"unknown dtype", FSDP2_ERR_CORRUPT, "enc.weight", "dtype"},
    [BAD_OVERLAP] = {"overlapping chunks", FSDP2_ERR_CORRUPT, "enc.weight", "overlap"},
    [BAD_GAP] = {"a missing chunk", FSDP2_ERR_CORRUPT, "enc.weight", NULL},
    [BAD_NOT_JSON] = {"metadata.json not JSON", FSDP2_ERR_CORRUPT, "metadata.json", NULL},
    [BAD_ESCAPING_FILE] = {"chunk file ../x", FSDP2_ERR_CORRUPT, "enc.weight", NULL},
    [BAD_ABSENT_FILE] = {"chunk file absent", FSDP2_SUCCESS, "rank-00009.safetensors", NULL},
    [BAD_OFFSET] = {"chunk offset off by 8", FSDP2_ERR_CORRUPT, "enc.running", NULL},
    [BAD_EMPTY_METADATA] = {"metadata.json empty", FSDP2_ERR_CORRUPT, "metadata.json", NULL},
};

/* The chunk of tensor `name` whose global_offset[0] is row0 (-1: the first). */
static cJSON *chunk_at(cJSON *meta, const char *name, int64_t row0)
{
    cJSON *chunks = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(meta, "tensors"), name),
        "chunks");
    cJSON *k;
    cJSON_ArrayForEach(k, chunks)
    {
        cJSON *goff = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(k, "global_offset"), 0);
        if (row0 < 0 || (goff && (int64_t)goff->valuedouble == row0))
            return k;
    }
    return NULL;
}

static void set_number(cJSON *o, const char *key, double v)
{
    cJSON_ReplaceItemInObjectCaseSensitive(o, key, cJSON_CreateNumber(v));
}

static void set_string(cJSON *o, const char *key, const char *v)
{
    cJSON_ReplaceItemInObjectCaseSensitive(o, key, cJSON_CreateString(v));
}

/* The metadata edits; 0 when applied. At ws 2 enc.weight's chunks hold rows 0..4 and
 * 4..7. */
static int edit_metadata(bad_t b, cJSON *meta)
{
    cJSON *k;
    switch (b) {
    case BAD_VERSION:
        set_number(meta, "version", 99);
        return 0;
    case BAD_DTYPE:
        set_string(cJSON_GetObjectItemCaseSensitive(
                       cJSON_GetObjectItemCaseSensitive(meta, "tensors"), "enc.weight"),
                   "dtype", "q4");
        return 0;
    case BAD_OVERLAP: /* rows 3..6 over 0..4 */
        if (!(k = chunk_at(meta, "enc.weight", 4)))
            return -1;
        cJSON_ReplaceItemInArray(cJSON_GetObjectItemCaseSensitive(k, "global_offset"), 0,
                                 cJSON_CreateNumber(3));
        return 0;
    case BAD_GAP: /* rows 0..4 gone */
        if (!(k = chunk_at(meta, "enc.weight", 0)))
            return -1;
        cJSON_Delete(cJSON_DetachItemViaPointer(
            cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(meta, "tensors"),
                                                 "enc.weight"),
                "chunks"),
            k));
        return 0;
    case BAD_ESCAPING_FILE:
        if (!(k = chunk_at(meta, "enc.weight", 0)))
            return -1;
        set_string(k, "file", "../x");
        return 0;
    case BAD_ABSENT_FILE:
        if (!(k = chunk_at(meta, "enc.running", -1)))
            return -1;
        set_string(k, "file", "rank-00009.safetensors");
        return 0;
    case BAD_OFFSET:
        if (!(k = chunk_at(meta, "enc.running", -1)))
            return -1;
        set_number(k, "offset", cJSON_GetObjectItemCaseSensitive(k, "offset")->valuedouble + 8);
        return 0;
    default:
        return -1;
    }
}

/* A copy of the good checkpoint at good with corruption b, at dir. */
static int make_bad(const char *good, const char *dir, bad_t b)
{
    char meta_path[1024], rank0[1024];
    snprintf(meta_path, sizeof(meta_path), "%s/metadata.json", dir);
    snprintf(rank0, sizeof(rank0), "%s/rank-00000.safetensors", dir);
    if (copy_dir(good, dir) != 0)
        return -1;
    struct stat st;
    if (b == BAD_TRUNCATED)
        return stat(rank0, &st) == 0 ? truncate(rank0, st.st_size / 2) : -1;
    if (b == BAD_NOT_JSON)
        return write_all(meta_path, "{\"format\": \"libfsdp2-checkpoint\", \"version\": ", 44);
    if (b == BAD_EMPTY_METADATA)
        return write_all(meta_path, "", 0);
    cJSON *meta = json_read(meta_path);
    if (!meta)
        return -1;
    int rc = 0;
    if (b == BAD_FLIPPED_BYTE) { /* a byte inside the buffer's data */
        cJSON *k = chunk_at(meta, "enc.running", -1);
        int fd = open(rank0, O_RDWR);
        unsigned char byte = 0;
        off_t at = k ? (off_t)cJSON_GetObjectItemCaseSensitive(k, "offset")->valuedouble + 5 : 0;
        rc = fd >= 0 && k && pread(fd, &byte, 1, at) == 1 ? 0 : -1;
        byte ^= 0x10;
        if (rc == 0 && pwrite(fd, &byte, 1, at) != 1)
            rc = -1;
        if (fd >= 0)
            close(fd);
    } else {
        rc = edit_metadata(b, meta);
        if (rc == 0)
            rc = json_write(meta_path, meta);
    }
    cJSON_Delete(meta);
    return rc;
}

static int body_bad_inputs(rank_ctx_t *c)
{
    job_t *job = c->arg;
    char good[512];
    snprintf(good, sizeof(good), "%s/good", job->root);
    int fails = 0;
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    model_t m = {0};
    fails += fails ? 0 : model_open(c, mesh, VARIANT_BASE, 0, &m);
    fails += fails ? 0 : save(&m, good, 1);
    if (!fails && c->rank == 0) {
        /* What "../x" would reach: a valid rank file, so only refusing it stops the load. */
        char x[1024], src[1024];
        snprintf(x, sizeof(x), "%s/x", job->root);
        snprintf(src, sizeof(src), "%s/rank-00000.safetensors", good);
        fails += RANK_CHECK(c, copy_file(src, x, SIZE_MAX) == 0, "copying %s", src);
        for (int b = 0; b < NUM_BAD; b++) {
            char dir[512];
            snprintf(dir, sizeof(dir), "%s/bad%02d", job->root, b);
            fails += RANK_CHECK(c, make_bad(good, dir, (bad_t)b) == 0, "making '%s' in %s: %s",
                                BAD[b].what, dir, strerror(errno));
        }
    }
    fails += barrier(c, "bad copies");
    int setup_fails = fails;
    for (int b = 0; b < NUM_BAD && !setup_fails; b++) {
        char dir[512];
        snprintf(dir, sizeof(dir), "%s/bad%02d", job->root, b);
        fsdp2_checkpoint_report_t report = {.size = sizeof(report)};
        fsdp2_status_t s = fsdp2_checkpoint_load(m.sd, dir, NULL, &report);
        if (check_refused(c, s, BAD[b].want, BAD[b].needle1, BAD[b].needle2, BAD[b].what,
                          __FILE__, __LINE__))
            fails++;
    }
    /* The model is still usable: the good checkpoint loads over whatever was read. */
    fails += fails ? 0 : model_fill(&m, 1);
    fsdp2_checkpoint_report_t report = {.size = sizeof(report)};
    fails += fails ? 0 : load(&m, good, 1, &report);
    fails += fails ? 0 : model_check(&m, 0, 0, NULL, 0, "the good checkpoint after the bad ones");
    if (m.root)
        fails += model_close(&m);
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

START_TEST(every_corruption_is_an_error_naming_the_file_or_tensor_on_every_rank)
{
    job_t job;
    make_scratch(&job);
    run_case(2, body_bad_inputs, &job, "bad inputs");
    remove_tree(job.root);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 5. Strict and non-strict loads of a changed model                                   */

typedef struct strict_case {
    variant_t variant;
    const char *name;  /* the parameter that differs */
    size_t missing, unexpected, mismatched, loaded;
} strict_case_t;

#define NUM_STRICT_CASES 4
static const strict_case_t STRICT_CASES[NUM_STRICT_CASES] = {
    {VARIANT_EXTRA_PARAM, "head.bias", 3, 0, 0, NUM_SLOTS_BASE},
    {VARIANT_RESHAPED, "head.weight", 0, 0, 3, NUM_SLOTS_BASE - 3},
    {VARIANT_MISSING_PARAM, "enc.bias", 0, 3, 0, NUM_SLOTS_BASE - 3},
    {VARIANT_RETYPED, "conv.kernel", 0, 0, 3, NUM_SLOTS_BASE - 3},
};

/* The parameter and its two states are all in the list. */
static int names_listed(const rank_ctx_t *c, const char *list, const char *fqn, const char *what)
{
    int fails = 0;
    for (int s = 0; s < 3; s++) {
        char name[128];
        if (s == 0)
            snprintf(name, sizeof(name), "%s", fqn);
        else
            snprintf(name, sizeof(name), "optim.state.%s.%s", fqn, STATE_NAME[s - 1]);
        fails += RANK_CHECK(c, strstr(list, name) != NULL, "%s names '%s', which lacks '%s'", what,
                            list, name);
    }
    return fails;
}

static int strict_and_lenient(rank_ctx_t *c, fsdp2_mesh_t *mesh, const char *dir,
                              const strict_case_t *k)
{
    char when[96];
    model_t m = {0};
    int fails = model_open(c, mesh, k->variant, 1, &m);
    fails += fails ? 0 : OK(c, fsdp2_optimizer_set_steps(m.opt, 42));
    if (fails)
        return fails + model_close(&m);
    snprintf(when, sizeof(when), "after a refused strict load (%s differs)", k->name);
    fsdp2_checkpoint_report_t report = {.size = sizeof(report)};
    fsdp2_checkpoint_options_t o = FSDP2_CHECKPOINT_OPTIONS_INIT;
    fails += REFUSED(c, fsdp2_checkpoint_load(m.sd, dir, &o, &report), FSDP2_SUCCESS, k->name,
                     NULL);
    fails += check_steps(&m, 42, when);
    fails += model_check(&m, 1, 1, NULL, 0, when);

    snprintf(when, sizeof(when), "after a non-strict load (%s differs)", k->name);
    fails += load(&m, dir, 0, &report);
    fails += RANK_CHECK(c, report.loaded == k->loaded && report.missing == k->missing &&
                               report.unexpected == k->unexpected &&
                               report.mismatched == k->mismatched && report.step == 1,
                        "%s: report loaded %zu missing %zu unexpected %zu mismatched %zu step "
                        "%lld; want %zu %zu %zu %zu 1",
                        when, report.loaded, report.missing, report.unexpected, report.mismatched,
                        (long long)report.step, k->loaded, k->missing, k->unexpected,
                        k->mismatched);
    const char *list = k->missing ? report.missing_names
                       : k->unexpected ? report.unexpected_names
                                       : report.mismatched_names;
    fails += names_listed(c, list, k->name, when);
    fails += check_steps(&m, SAVED_STEPS, when);
    fails += model_check(&m, 0, 0, k->name, 1, when);
    return fails + model_close(&m);
}

static int body_strict(rank_ctx_t *c)
{
    job_t *job = c->arg;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/base", job->root);
    int fails = 0;
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    model_t m = {0};
    fails += fails ? 0 : model_open(c, mesh, VARIANT_BASE, 0, &m);
    fails += fails ? 0 : OK(c, fsdp2_optimizer_set_steps(m.opt, SAVED_STEPS));
    fails += fails ? 0 : save(&m, dir, 1);
    if (m.root)
        fails += model_close(&m);
    for (int i = 0; i < NUM_STRICT_CASES && !fails; i++)
        fails += strict_and_lenient(c, mesh, dir, &STRICT_CASES[i]);
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

START_TEST(strict_load_of_a_changed_model_names_the_tensor_and_loads_nothing_lenient_loads_the_rest)
{
    job_t job;
    make_scratch(&job);
    run_case(2, body_strict, &job, "strict and non-strict");
    remove_tree(job.root);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 6. Whole-model safetensors                                                          */

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
    fails += check_steps(&m, 5, when);
    if (c->size == 2 && !fails)
        fails += import_into_extra(c, mesh, job->dir);
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

/* ---------------------------------------------------------------------------------- */
/* 7. Paths                                                                            */

/* What is at path after a refused save over it: still the file we put there. */
static int file_untouched(const rank_ctx_t *c, const char *path, const char *content)
{
    char *got = NULL, partial[600];
    size_t len = 0;
    struct stat st;
    snprintf(partial, sizeof(partial), "%s.partial", path);
    int ok = stat(path, &st) == 0 && S_ISREG(st.st_mode) && read_all(path, &got, &len) == 0 &&
             !strcmp(got, content);
    int fails = RANK_CHECK(c, ok, "after a refused save, %s is %s ('%s'), want the regular file "
                                  "holding '%s'",
                           path, stat(path, &st) != 0 ? "gone" : S_ISDIR(st.st_mode) ? "a directory"
                                                                                   : "a file",
                           got ? got : "", content);
    free(got);
    return fails + RANK_CHECK(c, access(partial, F_OK) != 0, "a refused save left %s", partial);
}

static int body_paths(rank_ctx_t *c)
{
    job_t *job = c->arg;
    char plain[256], slash[256], partial[300], inner[300], file[256], dir[256], dir_partial[300];
    snprintf(plain, sizeof(plain), "%s/ckpt", job->root);
    snprintf(slash, sizeof(slash), "%s/ckpt/", job->root);
    snprintf(partial, sizeof(partial), "%s.partial", plain);
    snprintf(inner, sizeof(inner), "%s/.partial", plain);
    snprintf(file, sizeof(file), "%s/notes.txt", job->root);
    snprintf(dir, sizeof(dir), "%s/somedir", job->root);
    snprintf(dir_partial, sizeof(dir_partial), "%s.partial", dir);
    int fails = 0;
    fsdp2_mesh_t *mesh = mesh_open(c, &fails);
    model_t m = {0};
    fails += fails ? 0 : model_open(c, mesh, VARIANT_BASE, 0, &m);
    if (fails)
        goto out;
    fsdp2_checkpoint_report_t report = {.size = sizeof(report)};

    /* "ckpt/" is the directory "ckpt", for a first save and for one that replaces it. */
    for (int round = 0; round < 2; round++) {
        char when[64];
        snprintf(when, sizeof(when), "%s save to '<root>/ckpt/'", round ? "second" : "first");
        fails += model_fill(&m, round ? 2 : 0);
        int saved = save(&m, slash, round + 1) == 0;
        fails += !saved;
        fails += model_fill(&m, 1);
        if (saved && load(&m, plain, 1, &report) == 0)
            fails += RANK_CHECK(c, report.step == round + 1, "%s: step %lld", when,
                                (long long)report.step);
        else
            fails += saved;
        fails += model_check(&m, saved ? (round ? 2 : 0) : 1, saved ? (round ? 2 : 0) : 1, NULL,
                             0, when);
        fails += RANK_CHECK(c, access(partial, F_OK) != 0 && access(inner, F_OK) != 0,
                            "%s left %s or %s", when, partial, inner);
    }
    fails += barrier(c, "slash done");

    /* A regular file where the checkpoint goes: refused with nothing changed, or replaced
     * by a checkpoint that loads; never an error after the swap. */
    if (c->rank == 0)
        fails += RANK_CHECK(c, write_all(file, "precious\n", 9) == 0 && mkdir(dir, 0755) == 0,
                            "creating %s and %s", file, dir);
    fails += barrier(c, "file made");
    fails += model_fill(&m, 2);
    fsdp2_status_t s = fsdp2_checkpoint_save(m.sd, file, NULL);
    if (s != FSDP2_SUCCESS) {
        fails += file_untouched(c, file, "precious\n");
    } else {
        fails += model_fill(&m, 1);
        fails += load(&m, file, 1, &report);
        fails += model_check(&m, 2, 2, NULL, 0, "the save that replaced a file");
    }
    fails += barrier(c, "file done");

    /* An export whose path is a directory fails everywhere and leaves no partial file. */
    s = fsdp2_checkpoint_export_full(m.sd, dir);
    fails += RANK_CHECK(c, s != FSDP2_SUCCESS, "export_full over the directory %s succeeded",
                        dir);
    fails += RANK_CHECK(c, access(dir_partial, F_OK) != 0, "the failed export left %s",
                        dir_partial);
out:
    if (m.root)
        fails += model_close(&m);
    return fails + OK(c, fsdp2_mesh_destroy(mesh));
}

START_TEST(a_trailing_slash_names_the_same_checkpoint_and_a_failed_save_or_export_changes_nothing)
{
    job_t job;
    make_scratch(&job);
    run_case(2, body_paths, &job, "paths");
    remove_tree(job.root);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, saved_at_each_ws_1_to_4_loads_bit_exact_at_each_ws_1_to_4);
    tcase_add_test(tc, resume_at_ws_2_equals_6_uninterrupted_steps_bit_for_bit);
    tcase_add_test(tc, resume_at_ws_3_of_a_ws_2_run_equals_6_uninterrupted_steps_bit_for_bit);
    tcase_add_test(tc, a_failed_or_crashed_save_leaves_the_previous_checkpoint_and_the_next_save_replaces_it);
    tcase_add_test(tc, every_corruption_is_an_error_naming_the_file_or_tensor_on_every_rank);
    tcase_add_test(tc, strict_load_of_a_changed_model_names_the_tensor_and_loads_nothing_lenient_loads_the_rest);
    tcase_add_test(tc, a_whole_model_file_exported_at_ws_3_imports_bit_exact_at_ws_1_2_4);
    tcase_add_test(tc, a_trailing_slash_names_the_same_checkpoint_and_a_failed_save_or_export_changes_nothing);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
