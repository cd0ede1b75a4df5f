/* Sharded checkpoints with real processes (include/fsdp2/checkpoint.h, the format in
 * docs/checkpoint-format.md): what a save or a load does when something is wrong. The
 * model is ckpt_model.h's.
 *
 * - Crash safety: a save whose "<dir>.partial" cannot be made fails on every rank and
 *   leaves the previous checkpoint loadable; the residue of a crash (a partial directory
 *   with a half-written rank file, no metadata) is not a checkpoint, does not disturb the
 *   previous one, and the next save replaces both.
 * - Bad inputs, made by editing copies of a good checkpoint: each load fails on every
 *   rank with an error naming the offending file or tensor, and nothing crashes.
 * - Strict loads of a model with an extra, a reshaped, a missing or a retyped parameter
 *   fail naming it and change nothing; non-strict loads load the rest and report the
 *   difference.
 * - Paths: "ckpt/" saves and replaces "ckpt"; a save over a regular file either refuses
 *   and leaves the file, or replaces it and loads; an export over a directory fails and
 *   leaves no partial file.
 *
 * That what is saved comes back is test_checkpoint_roundtrip.c. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ckpt_disk.h"
#include "ckpt_model.h"

#include "../core/check_main.h"

static int barrier(rank_ctx_t *c, const char *name)
{
    return OK(c, fsdp2_store_barrier(c->store, name));
}

/* ---------------------------------------------------------------------------------- */
/* 1. A save that fails or crashes leaves the previous checkpoint whole                */

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
    fails += fails ? 0 : model_save(&m, job->dir, 1);
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
    fails += model_load(&m, job->dir, 1, &report);
    fails += RANK_CHECK(c, report.step == 1, "after the failed save: step %lld, want 1",
                        (long long)report.step);
    fails += model_check_steps(&m, SAVED_STEPS, "after the failed save");
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
    fails += model_load(&m, job->dir, 1, &report);
    fails += model_check(&m, 0, 0, NULL, 0, "beside a crashed save's residue");
    fails += REFUSED(c, fsdp2_checkpoint_load(m.sd, partial, NULL, &report), FSDP2_ERR_NOT_FOUND,
                     "metadata.json", NULL);
    fails += model_check(&m, 0, 0, NULL, 0, "after refusing the partial directory");
    fails += model_fill(&m, 2);
    fails += OK(c, fsdp2_optimizer_set_steps(m.opt, 9));
    fails += model_save(&m, job->dir, 2);
    fails += RANK_CHECK(c, access(partial, F_OK) != 0, "%s still exists after the save",
                        partial);
    char listing[512];
    list_dir(job->dir, listing, sizeof(listing));
    fails += RANK_CHECK(c, !strcmp(listing,
                                   "metadata.json rank-00000.safetensors rank-00001.safetensors"),
                        "%s holds '%s' after the save, want metadata.json and 2 rank files",
                        job->dir, listing);
    fails += model_fill(&m, 1);
    fails += model_load(&m, job->dir, 1, &report);
    fails += RANK_CHECK(c, report.step == 2, "after the new save: step %lld, want 2",
                        (long long)report.step);
    fails += model_check_steps(&m, 9, "after the new save");
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
/* 2. Bad inputs                                                                       */

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
    BAD_MESH,
    BAD_PLACEMENTS,
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
    [BAD_MESH] = {"mesh [-3]", FSDP2_ERR_CORRUPT, "mesh dim 0 is -3", "metadata.json"},
    [BAD_PLACEMENTS] = {"placements [Shard(dim=7)]", FSDP2_ERR_CORRUPT, "enc.weight",
                        "Shard(dim=7)"},
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
    case BAD_MESH:
        cJSON_ReplaceItemInObjectCaseSensitive(meta, "mesh", cJSON_Parse("[-3]"));
        return 0;
    case BAD_PLACEMENTS:
        set_string(cJSON_GetObjectItemCaseSensitive(
                       cJSON_GetObjectItemCaseSensitive(meta, "tensors"), "enc.weight"),
                   "placements", "[Shard(dim=7)]");
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
    fails += fails ? 0 : model_save(&m, good, 1);
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
    fails += fails ? 0 : model_load(&m, good, 1, &report);
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
/* 3. Strict and non-strict loads of a changed model                                   */

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
    fails += model_check_steps(&m, 42, when);
    fails += model_check(&m, 1, 1, NULL, 0, when);

    snprintf(when, sizeof(when), "after a non-strict load (%s differs)", k->name);
    fails += model_load(&m, dir, 0, &report);
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
    fails += model_check_steps(&m, SAVED_STEPS, when);
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
    fails += fails ? 0 : model_save(&m, dir, 1);
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
/* 4. Paths                                                                            */

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
        int saved = model_save(&m, slash, round + 1) == 0;
        fails += !saved;
        fails += model_fill(&m, 1);
        if (saved && model_load(&m, plain, 1, &report) == 0)
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
        fails += model_load(&m, file, 1, &report);
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
    Suite *s = suite_create("checkpoint_failures");
    TCase *tc = tcase_create("checkpoint_failures");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, a_failed_or_crashed_save_leaves_the_previous_checkpoint_and_the_next_save_replaces_it);
    tcase_add_test(tc, every_corruption_is_an_error_naming_the_file_or_tensor_on_every_rank);
    tcase_add_test(tc, strict_load_of_a_changed_model_names_the_tensor_and_loads_nothing_lenient_loads_the_rest);
    tcase_add_test(tc, a_trailing_slash_names_the_same_checkpoint_and_a_failed_save_or_export_changes_nothing);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
