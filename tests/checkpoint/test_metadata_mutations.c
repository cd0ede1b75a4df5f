/* The metadata parser against thousands of mutated metadata.json files (a fixed seed):
 * byte changes, truncations, swapped digits and duplicated fragments of a valid file.
 * fsdp2_checkpoint_inspect and fsdp2_checkpoint_verify must return success or an error,
 * never crash or read outside what the file allows (run under ASan in CI). A libFuzzer
 * harness would be the same loop driven by coverage; this one runs in every test run.
 * Then hostile files aimed at single rules: a FIFO in place of metadata.json or of a
 * rank's file (refused, not waited on), out-of-range step and optim.step (refused, not
 * read as absent), bytes after the JSON, NULs in names; malformed meshes and placements,
 * each refused naming the bad value. */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../collectives/ranks.h"
#include "../core/check_main.h"
#include "../core/remove_tree.h"

static char dir[256];

static int save_one(rank_ctx_t *c)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 20000;
    fsdp2_mesh_t *mesh;
    int ws = c->size;
    fsdp2_module_t *root, *m;
    fsdp2_param_t *p;
    fsdp2_tensor_t *v;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    int64_t shape[2] = {3, 4};
    if (fsdp2_mesh_create(c->store, "mut", c->rank, c->size, 1, &ws, NULL, &go, &mesh) ||
        fsdp2_module_create("", &root) || fsdp2_module_create("fc", &m) ||
        fsdp2_module_add_child(root, m) || fsdp2_tensor_zeros(cpu, FSDP2_F32, 2, shape, &v) ||
        fsdp2_module_add_param(m, "weight", v, 1, &p))
        return 1;
    fsdp2_tensor_release(v);
    fsdp2_shard_options_t o = FSDP2_SHARD_OPTIONS_INIT;
    o.mesh = mesh;
    fsdp2_state_dict_t *sd;
    const char *k[1] = {"note"}, *val[1] = {"x"};
    fsdp2_checkpoint_options_t co = FSDP2_CHECKPOINT_OPTIONS_INIT;
    co.extra_keys = k;
    co.extra_values = val;
    co.num_extra = 1;
    int rc = fsdp2_fully_shard(m, &o) || fsdp2_fully_shard(root, &o) ||
             fsdp2_state_dict_create(root, NULL, &sd) || fsdp2_checkpoint_save(sd, dir, &co);
    if (rc)
        fprintf(stderr, "save: %s\n", fsdp2_last_error());
    fsdp2_module_destroy(root);
    fsdp2_mesh_destroy(mesh);
    return rc;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    ck_assert_uint_eq(fread(buf, 1, *len, f), *len);
    fclose(f);
    buf[*len] = '\0'; /* the hostile-file test reads it as text */
    return buf;
}

static void put(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

START_TEST(mutated_metadata_is_an_error_or_valid_never_a_crash)
{
    snprintf(dir, sizeof(dir), "/tmp/fsdp2-mutations-%d", (int)getpid());
    ranks_result_t res;
    ck_assert_int_eq(run_ranks(2, save_one, NULL, 20000, 60, &res), 0);
    char path[300];
    snprintf(path, sizeof(path), "%s/metadata.json", dir);
    size_t len;
    char *good = slurp(path, &len);
    char *buf = malloc(len * 2 + 16);
    FILE *sink = fopen("/dev/null", "w");
    uint64_t state = 12345;
    int accepted = 0, refused = 0;
    for (int i = 0; i < 3000; i++) {
        memcpy(buf, good, len);
        size_t n = len;
        int kinds = 1 + (int)((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 62);
        for (int k = 0; k < kinds; k++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(state >> 20) % (n ? n : 1);
            switch ((state >> 8) % 5) {
            case 0: buf[at] = (char)(state >> 40); break;                    /* any byte */
            case 1: buf[at] = "0123456789-.e[]{}\",:"[(state >> 40) % 20]; break; /* JSON-ish */
            case 2: n = at; break;                                          /* truncate */
            case 3:                                                         /* duplicate */
                if (n + 8 < len * 2) {
                    memmove(buf + at + 8, buf + at, n - at);
                    n += 8;
                }
                break;
            default: buf[at] = buf[at] == '9' ? '0' : (char)(buf[at] + 1); break; /* digit */
            }
        }
        put(path, buf, n);
        fsdp2_status_t a = fsdp2_checkpoint_inspect(dir, sink, i % 2);
        fsdp2_status_t b = fsdp2_checkpoint_verify(dir, NULL);
        ck_assert_msg(a == FSDP2_SUCCESS || strlen(fsdp2_last_error()) > 0, "error without a message");
        accepted += a == FSDP2_SUCCESS && b == FSDP2_SUCCESS;
        refused += a != FSDP2_SUCCESS;
    }
    printf("mutations: %d accepted whole, %d refused by the parser\n", accepted, refused);
    ck_assert_int_gt(refused, 1000);
    put(path, good, len);
    ck_assert_int_eq(fsdp2_checkpoint_verify(dir, NULL), FSDP2_SUCCESS);
    fclose(sink);
    free(buf);
    free(good);
    remove_tree(dir);
}
END_TEST

/* metadata.json replaced by `text` (len bytes): verify must give want naming needle. */
static void expect_metadata(const char *path, const char *text, size_t len, fsdp2_status_t want,
                            const char *needle, const char *what)
{
    put(path, text, len);
    fsdp2_status_t got = fsdp2_checkpoint_verify(dir, NULL);
    ck_assert_msg(got == want && (!needle || strstr(fsdp2_last_error(), needle)),
                  "%s: verify = %s (%s), want %s naming '%s'", what, fsdp2_status_name(got),
                  fsdp2_last_error(), fsdp2_status_name(want), needle ? needle : "");
}

/* The valid metadata with field `key` set to number v (or removed when remove). */
static char *with_number(const char *good, const char *key, double v, int remove)
{
    cJSON *root = cJSON_Parse(good);
    ck_assert_ptr_nonnull(root);
    cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    if (!remove)
        cJSON_AddNumberToObject(root, key, v);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* good with the first `from` replaced by `to` (len bytes); *out_len its length. */
static char *replaced(const char *good, const char *from, const char *to, size_t to_len,
                      size_t *out_len)
{
    const char *at = strstr(good, from);
    ck_assert_ptr_nonnull(at);
    size_t head = (size_t)(at - good), tail = strlen(at + strlen(from));
    char *out = malloc(head + to_len + tail + 1);
    memcpy(out, good, head);
    memcpy(out + head, to, to_len);
    memcpy(out + head + to_len, at + strlen(from), tail + 1);
    *out_len = head + to_len + tail;
    return out;
}

START_TEST(hostile_files_are_refused_naming_the_rule)
{
    snprintf(dir, sizeof(dir), "/tmp/fsdp2-hostile-%d", (int)getpid());
    ranks_result_t res;
    ck_assert_int_eq(run_ranks(2, save_one, NULL, 20000, 60, &res), 0);
    char path[300], rank_file[300], moved[320];
    snprintf(path, sizeof(path), "%s/metadata.json", dir);
    snprintf(rank_file, sizeof(rank_file), "%s/rank-00001.safetensors", dir);
    size_t len;
    char *good = slurp(path, &len);
    ck_assert_int_eq(fsdp2_checkpoint_verify(dir, NULL), FSDP2_SUCCESS);

    /* A FIFO nobody writes: a blocking open would wait forever. */
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(fsdp2_checkpoint_verify(dir, NULL), FSDP2_ERR_CORRUPT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "not a regular file"));
    ck_assert_int_eq(unlink(path), 0);
    put(path, good, len);
    snprintf(moved, sizeof(moved), "%s.moved", rank_file);
    ck_assert_int_eq(rename(rank_file, moved), 0);
    ck_assert_int_eq(mkfifo(rank_file, 0600), 0);
    ck_assert_int_ne(fsdp2_checkpoint_verify(dir, NULL), FSDP2_SUCCESS);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "not a regular file"));
    ck_assert_int_eq(unlink(rank_file), 0);
    ck_assert_int_eq(rename(moved, rank_file), 0);
    ck_assert_int_eq(fsdp2_checkpoint_verify(dir, NULL), FSDP2_SUCCESS);

    /* step and optim.step: absent is fine, out of range is corrupt (not absent). */
    const struct {
        const char *key;
        double v;
        int remove;
        fsdp2_status_t want;
    } steps[] = {
        {"step", -1, 0, FSDP2_ERR_CORRUPT},        {"step", 1e300, 0, FSDP2_ERR_CORRUPT},
        {"step", 2.5, 0, FSDP2_ERR_CORRUPT},       {"optim.step", -5, 0, FSDP2_ERR_CORRUPT},
        {"optim.step", 1e17, 0, FSDP2_ERR_CORRUPT}, {"step", 0, 1, FSDP2_SUCCESS},
        {"optim.step", 7, 0, FSDP2_SUCCESS},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        char *text = with_number(good, steps[i].key, steps[i].v, steps[i].remove);
        char what[64];
        snprintf(what, sizeof what, "%s = %g%s", steps[i].key, steps[i].v,
                 steps[i].remove ? " (removed)" : "");
        expect_metadata(path, text, strlen(text), steps[i].want,
                        steps[i].want ? steps[i].key : NULL, what);
        free(text);
    }

    /* After the JSON: white space is fine, anything else is not. */
    char *buf = malloc(len + 8);
    memcpy(buf, good, len);
    memcpy(buf + len, " \n\t", 3);
    expect_metadata(path, buf, len + 3, FSDP2_SUCCESS, NULL, "trailing white space");
    memcpy(buf + len, "{}", 2);
    expect_metadata(path, buf, len + 2, FSDP2_ERR_CORRUPT, "bytes after", "trailing {}");
    free(buf);

    /* NULs: escaped in a tensor's name (cJSON would cut the name there), or raw. */
    size_t n;
    char *text = replaced(good, "\"fc.weight\"", "\"fc.weight\\u0000x\"", 18, &n);
    expect_metadata(path, text, n, FSDP2_ERR_CORRUPT, "\\u0000", "escaped NUL in a name");
    free(text);
    text = replaced(good, "\"fc.weight\"", "\"fc.we\0ight\"", 12, &n);
    expect_metadata(path, text, n, FSDP2_ERR_CORRUPT, "NUL byte", "raw NUL in a name");
    free(text);

    put(path, good, len);
    ck_assert_int_eq(fsdp2_checkpoint_verify(dir, NULL), FSDP2_SUCCESS);
    free(good);
    remove_tree(dir);
}
END_TEST

/* good with "mesh" set to the JSON mesh (NULL: removed) and fc.weight's "placements" to the
 * JSON placements (NULL: removed). */
static char *with_layout(const char *good, const char *mesh, const char *placements)
{
    cJSON *root = cJSON_Parse(good);
    ck_assert_ptr_nonnull(root);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "mesh");
    if (mesh) {
        cJSON *m = cJSON_Parse(mesh);
        ck_assert_msg(m != NULL, "test mesh %s does not parse", mesh);
        cJSON_AddItemToObject(root, "mesh", m);
    }
    cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "tensors"),
                                                "fc.weight");
    ck_assert_ptr_nonnull(t);
    cJSON_DeleteItemFromObjectCaseSensitive(t, "placements");
    if (placements) {
        cJSON *p = cJSON_Parse(placements);
        ck_assert_msg(p != NULL, "test placements %s do not parse", placements);
        cJSON_AddItemToObject(t, "placements", p);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* The checkpoint of save_one: world size 2, mesh [2], fc.weight [3, 4] "[Shard(dim=0)]". */
static const struct {
    const char *mesh, *placements; /* JSON; NULL: the field removed */
    const char *needle;            /* NULL: accepted */
} LAYOUTS[] = {
    {"[[1],\"x\",-3,1e300]", "\"[Shard(dim=0)]\"", "mesh [[1],\"x\",-3,1e+300] is not"},
    {"[[1]]", "\"[Shard(dim=0)]\"", "mesh dim 0 is [1]"},
    {"[\"x\"]", "\"[Shard(dim=0)]\"", "mesh dim 0 is \"x\""},
    {"[-3]", "\"[Shard(dim=0)]\"", "mesh dim 0 is -3"},
    {"[1e300]", "\"[Shard(dim=0)]\"", "mesh dim 0 is 1e+300"},
    {"[0]", "\"[Shard(dim=0)]\"", "mesh dim 0 is 0"},
    {"[2.5]", "\"[Shard(dim=0)]\"", "mesh dim 0 is 2.5"},
    {"[2, 3]", "\"[Replicate(), Shard(dim=0)]\"", "mesh dim 1 is 3"},
    {"[4]", "\"[Shard(dim=0)]\"", "mesh dim 0 is 4, not a whole number from 1 to the world size 2"},
    {"[1, 1]", "\"[Replicate(), Shard(dim=0)]\"", "mesh [1,1] makes 1 rank, world_size says 2"},
    {"[]", "\"[Shard(dim=0)]\"", "mesh [] is not an array"},
    {"[1, 1, 2]", "\"[Shard(dim=0)]\"", "mesh [1,1,2] is not an array"},
    {"2", "\"[Shard(dim=0)]\"", "mesh 2 is not an array"},
    {"[2]", "\"[Shard(dim=7)]\"", "Shard(dim=7) of a tensor with 2 dims"},
    {"[2]", "\"[Shard(dim=2)]\"", "Shard(dim=2) of a tensor with 2 dims"},
    {"[2]", "\"[Shard(dim=-1)]\"", "[Shard(dim=-1)]\" are not"},
    {"[2]", "\"[Shard(dim=00)]\"", "[Shard(dim=00)]\" are not"},
    {"[2]", "\"[Shard(0)]\"", "[Shard(0)]\" are not"},
    {"[2]", "\"[Banana()]\"", "[Banana()]\" are not"},
    {"[2]", "\"Shard(dim=0)\"", "\"Shard(dim=0)\" are not"},
    {"[2]", "\"[Shard(dim=0)] \"", "\"[Shard(dim=0)] \" are not"},
    {"[2]", "\"[]\"", "\"[]\" are not"},
    {"[2]", "\"\"", "\"\" are not"},
    {"[2]", "\"[Shard(dim=0),Replicate()]\"", "are not"},
    {"[2]", "\"[Shard(dim=0), Replicate()]\"", "have 2 entries for a mesh of 1 dim"},
    {"[2]", "\"[Replicate(), Replicate(), Replicate()]\"", "have 3 entries"},
    {NULL, "\"[Shard(dim=0)]\"", "have 1 entry for a mesh of 0 dims"},
    {"[2]", "\"[Partial(sum)]\"", "a Partial tensor is never saved"},
    {"[2]", "7", "placements 7 is not a string"},
    {"[2]", NULL, "placements (missing) is not a string"},
    /* Accepted: another layout of the same rows, a 2D mesh, a whole tensor, no mesh. */
    {"[2]", "\"[Replicate()]\"", NULL},
    {"[2]", "\"[Shard(dim=1)]\"", NULL},
    {"[1, 2]", "\"[Replicate(), Shard(dim=0)]\"", NULL},
    {"[2, 1]", "\"[Shard(dim=0), Shard(dim=0)]\"", NULL},
    {"[2]", "\"whole\"", NULL},
    {NULL, "\"whole\"", NULL},
};

START_TEST(mesh_and_placements_are_validated_naming_the_bad_value)
{
    snprintf(dir, sizeof(dir), "/tmp/fsdp2-layouts-%d", (int)getpid());
    ranks_result_t res;
    ck_assert_int_eq(run_ranks(2, save_one, NULL, 20000, 60, &res), 0);
    char path[300];
    snprintf(path, sizeof(path), "%s/metadata.json", dir);
    size_t len;
    char *good = slurp(path, &len);
    ck_assert_int_eq(fsdp2_checkpoint_verify(dir, NULL), FSDP2_SUCCESS);
    for (size_t i = 0; i < sizeof LAYOUTS / sizeof LAYOUTS[0]; i++) {
        char *text = with_layout(good, LAYOUTS[i].mesh, LAYOUTS[i].placements);
        char what[160];
        snprintf(what, sizeof what, "mesh %s, placements %s", LAYOUTS[i].mesh ? LAYOUTS[i].mesh : "absent",
                 LAYOUTS[i].placements ? LAYOUTS[i].placements : "absent");
        expect_metadata(path, text, strlen(text),
                        LAYOUTS[i].needle ? FSDP2_ERR_CORRUPT : FSDP2_SUCCESS, LAYOUTS[i].needle,
                        what);
        if (LAYOUTS[i].needle && LAYOUTS[i].placements && strstr(LAYOUTS[i].needle, "Shard(dim=7)"))
            ck_assert_msg(strstr(fsdp2_last_error(), "fc.weight"), "%s: \"%s\" does not name fc.weight",
                          what, fsdp2_last_error());
        free(text);
    }
    put(path, good, len);
    ck_assert_int_eq(fsdp2_checkpoint_verify(dir, NULL), FSDP2_SUCCESS);
    free(good);
    remove_tree(dir);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("metadata_mutations");
    TCase *tc = tcase_create("mutations");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, mutated_metadata_is_an_error_or_valid_never_a_crash);
    tcase_add_test(tc, hostile_files_are_refused_naming_the_rule);
    tcase_add_test(tc, mesh_and_placements_are_validated_naming_the_bad_value);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
