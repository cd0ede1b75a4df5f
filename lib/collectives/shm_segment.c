/* The shared-memory transport's segment: created by rank 0, mapped by every member,
 * unlinked as soon as all have answered, or given up on by all when one cannot map it.
 * The protocol that runs over it is lib/collectives/shm.c (and shm_reduce.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collectives/shm_internal.h"
#include "core/clock.h"
#include "core/env_internal.h"
#include "core/fault.h"
#include "core/cpu_wait.h"
#include "core/error.h"
#include "core/log_internal.h"

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

static size_t segment_bytes(int n, const shm_params_t *p, size_t *row, size_t *ctl)
{
    *row = round_up((size_t)n * 8, SHM_LINE) / 8;
    *ctl = round_up((size_t)n * SHM_LINE + (size_t)n * *row * 8 + 2 * (size_t)n * SHM_LINE +
                        (size_t)n * SHM_STAMPS * sizeof(shm_stamp_t),
                    SHM_PAGE);
    return SHM_PAGE + *ctl + (size_t)n * p->slots * p->slot;
}

/* posix_fallocate, again when a signal interrupted it (tmpfs returns EINTR then). */
static int reserve(int fd, size_t at, size_t bytes)
{
    int e;
    do
        e = posix_fallocate(fd, (off_t)at, (off_t)bytes);
    while (e == EINTR);
    return e;
}

/* Maps the group's segment: rank 0 creates it, reserves the memory of everything before
 * the rings (tmpfs would otherwise grant the size and raise SIGBUS on a page it has no
 * room for) and publishes its name, "" if it could not; the others open it. Then every
 * rank reserves its own ring, so that tmpfs takes its pages from the memory policy of
 * the rank that writes them: by default the NUMA node the rank runs on, where the
 * readers on other nodes read them once while the writer writes them every step. A
 * failure here is not an error of the group: it is written to why, and the members then
 * agree to go without. ctl: the bytes before the rings. */
static fsdp2_status_t map_segment(fsdp2_group_t *g, fsdp2_store_t *store, size_t bytes,
                                  size_t ctl, size_t ring, char *name, size_t cap, void **map,
                                  char *why, size_t why_cap)
{
    char key[FSDP2_GROUP_NAME_MAX + 32];
    snprintf(key, sizeof(key), "%s/shm/name", g->name);
    int fd = -1, e = 0;
    const char *step = "";
    if (g->rank == 0) {
        static atomic_uint serial;
        snprintf(name, cap, "/fsdp2-%d-%u-%llx", (int)getpid(), atomic_fetch_add(&serial, 1),
                 (unsigned long long)fsdp2_now_ns());
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0) {
            e = errno, step = "shm_open";
            name[0] = '\0';
        } else if (ftruncate(fd, (off_t)bytes) != 0) {
            e = errno, step = "ftruncate";
        } else if ((e = reserve(fd, 0, SHM_PAGE + ctl)) != 0) {
            step = "posix_fallocate";
        }
    } else {
        size_t len = 0;
        const char *keys[1] = {key};
        FSDP2_CHECK(fsdp2_setup_wait_keys(&g->setup, store, keys, 1, "hear the segment's name"));
        FSDP2_CHECK(fsdp2_store_get(store, key, name, cap - 1, &len));
        name[len < cap ? len : cap - 1] = '\0';
        struct stat st;
        if (!name[0])
            snprintf(why, why_cap, "rank 0 could not create the segment");
        else if ((fd = shm_open(name, O_RDWR, 0)) < 0)
            e = errno, step = "shm_open";
        else if (fstat(fd, &st) != 0 || (size_t)st.st_size != bytes)
            e = EINVAL, step = "fstat (size)";
    }
    if (fd >= 0 && !e && (e = reserve(fd, SHM_PAGE + ctl + (size_t)g->rank * ring, ring)) != 0)
        step = "posix_fallocate (this rank's ring)";
    if (fd >= 0 && !e) {
        *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (*map == MAP_FAILED) {
            *map = NULL;
            e = errno, step = "mmap";
        }
    }
    if (e)
        snprintf(why, why_cap, "%s %s (%zu bytes): %s", step, name, bytes, strerror(e));
    if (fd >= 0)
        close(fd);
    if (g->rank == 0) {
        if (e && name[0]) {
            shm_unlink(name);
            name[0] = '\0';
        }
        if (*map) {
            shm_header_t *h = *map;
            h->magic = SHM_MAGIC;
            h->size = g->size;
        }
        FSDP2_CHECK(fsdp2_store_set(store, key, name, strlen(name) + 1));
    }
    return FSDP2_SUCCESS;
}

/* Whether every member mapped the segment, and whether every member allows single-copy
 * collectives (*direct): each publishes 0 (not mapped), 1 (mapped) or 2 (mapped, and
 * single-copy allowed here), all read all. */
static fsdp2_status_t all_mapped(fsdp2_group_t *g, fsdp2_store_t *store, int mine, int *all,
                                 int *first_missing, int *direct)
{
    char key[FSDP2_GROUP_KEY_MAX];
    fsdp2_group_member_key(g, "shm/mapped", g->rank, key);
    FSDP2_CHECK(fsdp2_store_set(store, key, !mine ? "0" : *direct ? "2" : "1", 1));
    /* all at once first, so that a timeout names every member that never answered */
    FSDP2_CHECK(fsdp2_setup_wait_members(&g->setup, store, "shm/mapped",
                                         "say whether it mapped the shared-memory segment"));
    *all = 1;
    *first_missing = -1;
    for (int r = 0; r < g->size; r++) {
        char value[2] = "";
        size_t len = 0;
        fsdp2_group_member_key(g, "shm/mapped", r, key);
        FSDP2_CHECK(fsdp2_store_get(store, key, value, 1, &len));
        int mapped = value[0] == '1' || value[0] == '2';
        if (!mapped && *first_missing < 0)
            *first_missing = r;
        *all &= mapped;
        *direct &= value[0] == '2';
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_shm_create(fsdp2_group_t *g, fsdp2_store_t *store, shm_peer_gone_fn gone,
                                void *gone_arg, shm_group_t **out)
{
    *out = NULL;
    if (g->size > FSDP2_SHM_MAX_RANKS)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "group '%s': %d ranks (shm: at most %d)",
                           g->name, g->size, FSDP2_SHM_MAX_RANKS);
    shm_group_t *sg = fsdp2_calloc(1, sizeof(*sg));
    if (!sg)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s': shm", g->name);
    sg->g = g;
    sg->gone = gone;
    sg->gone_arg = gone_arg;
    sg->stores_policy = (shm_stores_t)fsdp2_env_int(FSDP2_ENV_SHM_STREAM_STORES);
    sg->output_policy = (shm_stores_t)fsdp2_env_int(FSDP2_ENV_SHM_STREAM_OUTPUT);
    sg->out_stream_min = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_STREAM_OUTPUT_MIN);
    sg->wait_yields = (int)fsdp2_env_int(FSDP2_ENV_SHM_WAIT_YIELDS);
    sg->contended_ns = fsdp2_env_int(FSDP2_ENV_SHM_CONTENDED_NS);
    sg->sleep_ms = (int)fsdp2_env_int(FSDP2_ENV_SHM_SLEEP_MS);
    sg->liveness_ms = fsdp2_env_int(FSDP2_ENV_SHM_LIVENESS_MS);
    sg->direct_block = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_DIRECT_BLOCK);
    sg->direct_copy = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_DIRECT_COPY);
    sg->pair_chunk = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_PAIR_CHUNK);
    sg->stream_min = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_STREAM_MIN);
    sg->direct_policy = fsdp2_env_int(FSDP2_ENV_SHM_SINGLE_COPY) == 0 &&
                        fsdp2_env_int(FSDP2_ENV_CPU_SHARED_ALLOC) == 0; /* "on" */
    sg->peers = fsdp2_calloc((size_t)g->size, sizeof(*sg->peers));
    if (!sg->peers) {
        free(sg);
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s': shm peers", g->name);
    }
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&sg->lock, NULL);
    pthread_cond_init(&sg->turn_changed, &attr);
    pthread_condattr_destroy(&attr);
    /* The sizes every member must share, and where the members may run: one round. The
     * sizes are checked once all agree, so that every member fails alike. */
    shm_placement_t place;
    fsdp2_shm_params(&sg->params);
    fsdp2_status_t status = fsdp2_shm_exchange_members(g, store, &sg->params, &place);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_shm_params_check(&sg->params, g->size);
    if (status != FSDP2_SUCCESS) {
        fsdp2_shm_destroy(sg);
        return status;
    }
    size_t ctl = 0, bytes = segment_bytes(g->size, &sg->params, &sg->row, &ctl);
    char name[96] = "", why[256] = "";
    void *map = NULL;
    int all = 0, missing = -1;
    status = map_segment(g, store, bytes, ctl, sg->params.slots * sg->params.slot, name,
                         sizeof(name), &map, why, sizeof(why));
    if (map) {
        sg->hdr = map;
        sg->map_bytes = bytes;
    }
    /* Once everyone has answered, everyone who will map it has: the name can go, and
     * nothing is left in /dev/shm whatever happens next. */
    if (status == FSDP2_SUCCESS)
        status = all_mapped(g, store, map != NULL, &all, &missing, &sg->direct_policy);
    if (name[0] && (g->rank == 0 || status == FSDP2_SUCCESS))
        shm_unlink(name); /* every member tries, in case rank 0 died: ENOENT is fine */
    if (status == FSDP2_SUCCESS && all &&
        (sg->hdr->magic != SHM_MAGIC || sg->hdr->size != g->size))
        status = fsdp2_error(FSDP2_ERR_CORRUPT, "group '%s': segment %s was not made for %d "
                             "ranks of this group", g->name, name, g->size);
    if (status != FSDP2_SUCCESS || !all) {
        if (status == FSDP2_SUCCESS)
            FSDP2_LOG(WARN, COLL, "group '%s': no shared memory (%s%s%d): collectives go "
                      "over UCX", g->name, why[0] ? why : "", why[0] ? "; first rank without: "
                      : "first rank without it: ", missing);
        fsdp2_shm_destroy(sg);
        return status;
    }
    if (place.oversubscribed)
        fsdp2_cpu_streams_note_oversubscribed();
    /* Slot stores: the topology's rule, unless the CPUs are virtual (the host moves them
     * between caches the topology does not show) or there is no topology. */
    int virtual_host = fsdp2_host_is_virtual(), known = 0;
    if (sg->stores_policy == SHM_STORES_TOPOLOGY ||
        (sg->stores_policy == SHM_STORES_AUTO && !virtual_host))
        known = fsdp2_shm_shared_cache(&place.all, &sg->shared_cache) == 0;
    sg->stores_policy = fsdp2_shm_stores_resolve(sg->stores_policy, virtual_host, known);
    sg->core_per_rank = !place.oversubscribed;
    sg->spin_ns = place.oversubscribed ? 0 : fsdp2_env_int(FSDP2_ENV_SHM_SPIN_US) * 1000;
    sg->contended_max = place.oversubscribed ? INT_MAX : 2;
    sg->nudge = !place.oversubscribed && place.cpus > 1;
    FSDP2_LOG(DEBUG, COLL, "group '%s': %d ranks on %d CPUs (%s): %s; slot stores %s",
              g->name, g->size, place.cpus, place.disjoint ? "bound apart" : "sharing their sets",
              place.oversubscribed ? "more ranks than CPUs, waits yield"
                                   : "a CPU each, waits poll",
              sg->stores_policy == SHM_STORES_TOPOLOGY ? "by the shared cache"
              : sg->stores_policy == SHM_STORES_LEARN  ? "learned"
                                                       : "fixed");
    char *base = (char *)sg->hdr;
    sg->lines = (rank_line_t *)(base + SHM_PAGE);
    sg->done = (shm_counter_t *)(base + SHM_PAGE + (size_t)g->size * SHM_LINE);
    sg->descs = (direct_desc_t *)((char *)sg->done + (size_t)g->size * sg->row * 8);
    sg->stamps = (shm_stamp_t *)((char *)sg->descs + 2 * (size_t)g->size * SHM_LINE);
    sg->ring = base + SHM_PAGE + ctl;
    FSDP2_LOG(DEBUG, COLL, "group '%s': shared-memory segment %s, %zu bytes", g->name, name,
              bytes);
    *out = sg;
    return FSDP2_SUCCESS;
}

void fsdp2_shm_destroy(shm_group_t *sg)
{
    if (!sg)
        return;
    if (sg->hdr)
        munmap(sg->hdr, sg->map_bytes);
    fsdp2_shm_direct_release(sg);
    pthread_mutex_destroy(&sg->lock);
    pthread_cond_destroy(&sg->turn_changed);
    free(sg);
}
