/* See ckpt_disk.h. */
#include "ckpt_disk.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void make_scratch(job_t *job)
{
    memset(job, 0, sizeof(*job));
    const char *tmp = getenv("TMPDIR");
    snprintf(job->root, sizeof(job->root), "%s/fsdp2-ckpt-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(job->root) != NULL, "mkdtemp %s: %s", job->root, strerror(errno));
}

void run_case(int ws, rank_fn body, job_t *job, const char *what)
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
/* Files                                                                               */

int read_all(const char *path, char **buf, size_t *len)
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

int write_all(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t put = fwrite(buf, 1, len, f);
    return fclose(f) == 0 && put == len ? 0 : -1;
}

int copy_file(const char *src, const char *dst, size_t limit)
{
    char *buf;
    size_t len;
    int rc = read_all(src, &buf, &len);
    if (rc == 0)
        rc = write_all(dst, buf, len < limit ? len : limit);
    free(buf);
    return rc;
}

int copy_dir(const char *src, const char *dst)
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

void list_dir(const char *dir, char *out, size_t len)
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

cJSON *json_read(const char *path)
{
    char *text;
    size_t len;
    cJSON *root = read_all(path, &text, &len) == 0 ? cJSON_Parse(text) : NULL;
    free(text);
    return root;
}

int json_write(const char *path, const cJSON *root)
{
    char *text = cJSON_Print(root);
    int rc = text ? write_all(path, text, strlen(text)) : -1;
    cJSON_free(text);
    return rc;
}

int64_t json_int(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? (int64_t)x->valuedouble : -999;
}

const char *json_str(const cJSON *o, const char *key)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
    return s ? s : "(absent)";
}

int json_dims_are(const cJSON *a, const int64_t *v, int n)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return 0;
    for (int i = 0; i < n; i++)
        if (!cJSON_IsNumber(cJSON_GetArrayItem(a, i)) ||
            (int64_t)cJSON_GetArrayItem(a, i)->valuedouble != v[i])
            return 0;
    return 1;
}

/* ---------------------------------------------------------------------------------- */
/* Expectations written out independently of the library                              */

void slot_name(const param_spec_t *s, int st, char *buf, size_t len)
{
    if (st == 0)
        snprintf(buf, len, "%s", s->fqn);
    else
        snprintf(buf, len, "optim.state.%s.%s", s->fqn, STATE_NAME[st - 1]);
}

size_t elem_size(fsdp2_dtype_t dtype)
{
    return dtype == FSDP2_F64 ? 8 : 4;
}

int64_t row_elems(const param_spec_t *s)
{
    return spec_numel(s) / s->shape[0];
}

void *formula_bytes(fsdp2_dtype_t dtype, int seed, int slot, int64_t first, int64_t n)
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

int model_tensors(param_spec_t *specs, int *slots)
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
