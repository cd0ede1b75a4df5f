/* The metadata parser against thousands of mutated metadata.json files (a fixed seed):
 * byte changes, truncations, swapped digits and duplicated fragments of a valid file.
 * fsdp2_checkpoint_inspect and fsdp2_checkpoint_verify must return success or an error,
 * never crash or read outside what the file allows (run under ASan in CI). A libFuzzer
 * harness would be the same loop driven by coverage; this one runs in every test run. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../collectives/ranks.h"
#include "../core/check_main.h"

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
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("metadata_mutations");
    TCase *tc = tcase_create("mutations");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, mutated_metadata_is_an_error_or_valid_never_a_crash);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
