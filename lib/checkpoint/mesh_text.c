/* Exchanging texts (chunk lists, statuses) over a mesh: an all-gather of lengths, then of
 * the padded texts, along the last mesh dim and then the first, so every rank ends with
 * every rank's text in row-major rank order. */
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint_internal.h"
#include "collectives/mesh_fail.h"
#include "core/error.h"
#include "core/fault.h"

/* blob of this rank (len bytes) -> the group's blobs concatenated in group-rank order. */
static fsdp2_status_t gather_group(fsdp2_group_t *g, fsdp2_stream_t *s, const char *blob,
                                   size_t len, char **out, size_t *out_len)
{
    int n;
    FSDP2_CHECK(fsdp2_group_size(g, &n));
    int64_t mine = (int64_t)len, *lens = fsdp2_calloc((size_t)n, sizeof(int64_t));
    if (!lens)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint exchange");
    fsdp2_status_t status = fsdp2_all_gather_async(g, &mine, lens, 1, FSDP2_I64, s);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_stream_synchronize(s);
    size_t most = 0, total = 0;
    for (int r = 0; r < n && status == FSDP2_SUCCESS; r++) {
        most = (size_t)lens[r] > most ? (size_t)lens[r] : most;
        total += (size_t)lens[r];
    }
    char *padded = NULL, *all = NULL, *joined = NULL;
    if (status == FSDP2_SUCCESS) {
        padded = fsdp2_calloc(most ? most : 1, 1);
        all = fsdp2_calloc(most ? most * (size_t)n : 1, 1);
        joined = fsdp2_malloc(total ? total : 1);
        if (!padded || !all || !joined)
            status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint exchange");
    }
    if (status == FSDP2_SUCCESS) {
        if (len)
            memcpy(padded, blob, len);
        status = fsdp2_all_gather_async(g, padded, all, most, FSDP2_U8, s);
        if (status == FSDP2_SUCCESS)
            status = fsdp2_stream_synchronize(s);
    }
    if (status == FSDP2_SUCCESS) {
        size_t at = 0;
        for (int r = 0; r < n; r++) {
            memcpy(joined + at, all + (size_t)r * most, (size_t)lens[r]);
            at += (size_t)lens[r];
        }
        *out = joined;
        *out_len = total;
        joined = NULL;
    }
    free(lens);
    free(padded);
    free(all);
    free(joined);
    return status;
}

static fsdp2_status_t all_texts(fsdp2_mesh_t *mesh, const char *mine, char ***all, int *n);

/* A failure inside the exchange leaves the peers in (or before) its collectives: the
 * mesh's groups fail together. */
fsdp2_status_t ckpt_all_texts(fsdp2_mesh_t *mesh, const char *mine, char ***all, int *n)
{
    return fsdp2_mesh_fail(mesh, all_texts(mesh, mine, all, n));
}

static fsdp2_status_t all_texts(fsdp2_mesh_t *mesh, const char *mine, char ***all, int *n)
{
    *all = NULL;
    *n = 0;
    int ndim, rank, size;
    FSDP2_CHECK(fsdp2_mesh_ndim(mesh, &ndim));
    FSDP2_CHECK(ckpt_mesh_rank(mesh, &rank, &size));
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *s;
    FSDP2_CHECK(fsdp2_stream_current(cpu, &s));
    /* Texts travel with their NULs, so the joined blob splits back into them. */
    size_t len = strlen(mine) + 1;
    char *blob = fsdp2_malloc(len);
    if (!blob)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint exchange");
    memcpy(blob, mine, len);
    fsdp2_status_t status = FSDP2_SUCCESS;
    for (int i = ndim - 1; i >= 0 && status == FSDP2_SUCCESS; i--) {
        fsdp2_group_t *g;
        char *joined = NULL;
        size_t joined_len = 0;
        status = fsdp2_mesh_group(mesh, i, &g);
        if (status == FSDP2_SUCCESS)
            status = gather_group(g, s, blob, len, &joined, &joined_len);
        if (status == FSDP2_SUCCESS) {
            free(blob);
            blob = joined;
            len = joined_len;
        }
    }
    char **texts = status == FSDP2_SUCCESS ? fsdp2_calloc((size_t)size, sizeof(char *)) : NULL;
    if (status == FSDP2_SUCCESS && !texts)
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint exchange");
    size_t at = 0;
    for (int r = 0; r < size && status == FSDP2_SUCCESS; r++) {
        size_t l = strnlen(blob + at, len - at);
        if (at + l >= len) {
            status = fsdp2_error(FSDP2_ERR_INTERNAL, "checkpoint exchange: rank %d's text is cut", r);
            break;
        }
        texts[r] = strdup(blob + at);
        if (!texts[r])
            status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "checkpoint exchange");
        at += l + 1;
    }
    free(blob);
    if (status != FSDP2_SUCCESS) {
        ckpt_texts_free(texts, size);
        return status;
    }
    *all = texts;
    *n = size;
    return FSDP2_SUCCESS;
}

void ckpt_texts_free(char **all, int n)
{
    for (int i = 0; all && i < n; i++)
        free(all[i]);
    free(all);
}
