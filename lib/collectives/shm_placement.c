/* Where a shared-memory group's ranks may run, from the CPUs every member may use: each
 * publishes its affinity at group creation and all read all, so that every member
 * decides alike from the whole group's placement rather than from its own mask (a rank
 * bound to one core by Slurm, numactl or fsdp2run --bind core has a core of its own, not
 * a share of one). */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/topology.h>

#include "collectives/group_internal.h"
#include "collectives/shm_internal.h"
#include "core/env_internal.h"
#include "core/fault.h"
#include "core/error.h"
#include "core/log_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

int fsdp2_cpus_format(const cpu_set_t *set, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, set))
            continue;
        int last = c;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, set))
            last++;
        int n = last == c ? snprintf(buf + len, cap - len, "%s%d", len ? "," : "", c)
                          : snprintf(buf + len, cap - len, "%s%d-%d", len ? "," : "", c, last);
        if (n < 0 || (size_t)n >= cap - len)
            return -1;
        len += (size_t)n;
        c = last;
    }
    return 0;
}

int fsdp2_cpus_parse(const char *text, cpu_set_t *set)
{
    CPU_ZERO(set);
    const char *p = text;
    while (*p) {
        char *end;
        long lo = strtol(p, &end, 10), hi = lo;
        if (end == p || lo < 0 || lo >= CPU_SETSIZE)
            return -1;
        p = end;
        if (*p == '-') {
            hi = strtol(p + 1, &end, 10);
            if (end == p + 1 || hi < lo || hi >= CPU_SETSIZE)
                return -1;
            p = end;
        }
        for (long c = lo; c <= hi; c++)
            CPU_SET((int)c, set);
        if (*p == ',' && p[1])
            p++;
        else if (*p)
            return -1;
    }
    return 0;
}

void fsdp2_shm_placement(const cpu_set_t *sets, int n, shm_placement_t *out)
{
    cpu_set_t all, twice;
    CPU_ZERO(&all);
    CPU_ZERO(&twice);
    for (int r = 0; r < n; r++) {
        cpu_set_t both;
        CPU_AND(&both, &all, &sets[r]);
        CPU_OR(&twice, &twice, &both);
        CPU_OR(&all, &all, &sets[r]);
    }
    out->all = all;
    out->ranks = n;
    out->cpus = CPU_COUNT(&all);
    out->disjoint = CPU_COUNT(&twice) == 0;
    out->oversubscribed = n > out->cpus;
    /* Ranks crowded into part of the union: more ranks whose sets lie within rank r's
     * than r's set has CPUs ({7}, {7}, {7-9}: 3 CPUs, but 2 ranks on CPU 7). */
    for (int r = 0; r < n && !out->oversubscribed; r++) {
        int within = 0;
        for (int q = 0; q < n; q++) {
            cpu_set_t both;
            CPU_AND(&both, &sets[q], &sets[r]);
            within += CPU_EQUAL(&both, &sets[q]);
        }
        out->oversubscribed = within > CPU_COUNT(&sets[r]);
    }
}

void fsdp2_shm_params(shm_params_t *out)
{
    *out = (shm_params_t){
        .slot = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_SLOT_BYTES),
        .slots = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_SLOTS),
        .one_step_max = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_ONE_STEP_MAX),
        .one_step_pair_min = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_ONE_STEP_PAIR_MIN),
        .fused_min = (size_t)fsdp2_env_int(FSDP2_ENV_SHM_FUSED_MIN),
    };
}

fsdp2_status_t fsdp2_shm_params_check(const shm_params_t *p, int n)
{
    if (p->slot % SHM_PAGE)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                           "FSDP2_SHM_SLOT_BYTES=%zu: want a multiple of %d", p->slot,
                           SHM_PAGE);
    /* a reduction's step holds a piece of at least a cache line for each peer */
    size_t least = ((size_t)(n - 1) * SHM_LINE + SHM_PAGE - 1) / SHM_PAGE * SHM_PAGE;
    if (n > 1 && p->slot / (size_t)(n - 1) < SHM_LINE)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                           "FSDP2_SHM_SLOT_BYTES=%zu is too small for %d ranks: want at "
                           "least %zu", p->slot, n, least);
    if (p->one_step_max > p->slot) /* a one-step all-reduce posts its whole buffer */
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                           "FSDP2_SHM_ONE_STEP_MAX=%zu (16384 unless set) is more than a slot "
                           "(FSDP2_SHM_SLOT_BYTES=%zu): set it to at most the slot",
                           p->one_step_max, p->slot);
    return FSDP2_SUCCESS;
}

/* What a member publishes: its protocol sizes, then its CPUs ("262144 4 16384 196608
 * 16777216 0-3,8"). */
#define MEMBER_SIZES 5
static const char *const size_names[MEMBER_SIZES] = {
    "FSDP2_SHM_SLOT_BYTES", "FSDP2_SHM_SLOTS", "FSDP2_SHM_ONE_STEP_MAX",
    "FSDP2_SHM_ONE_STEP_PAIR_MIN", "FSDP2_SHM_FUSED_MIN"};

static void sizes_of(const shm_params_t *p, unsigned long long v[MEMBER_SIZES])
{
    v[0] = p->slot, v[1] = p->slots, v[2] = p->one_step_max, v[3] = p->one_step_pair_min,
    v[4] = p->fused_min;
}

/* Parses a member's text into its sizes and CPU set; -1 when it is not such a text. */
static int parse_member(const char *text, unsigned long long v[MEMBER_SIZES], cpu_set_t *set)
{
    int used = 0;
    if (sscanf(text, "%llu %llu %llu %llu %llu %n", &v[0], &v[1], &v[2], &v[3], &v[4],
               &used) != MEMBER_SIZES || used == 0)
        return -1;
    return fsdp2_cpus_parse(text + used, set) == 0 && CPU_COUNT(set) > 0 ? 0 : -1;
}

fsdp2_status_t fsdp2_shm_exchange_members(fsdp2_group_t *g, fsdp2_store_t *store,
                                          const shm_params_t *params, shm_placement_t *out)
{
    cpu_set_t *sets = fsdp2_calloc((size_t)g->size, sizeof(*sets));
    char *text = fsdp2_malloc(SHM_MEMBER_TEXT_MAX);
    if (!sets || !text) {
        free(sets);
        free(text);
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s': CPU sets", g->name);
    }
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof(mine), &mine) != 0 || CPU_COUNT(&mine) == 0) {
        CPU_ZERO(&mine); /* unknown: CPU 0, which every such rank then shares */
        CPU_SET(0, &mine);
    }
    unsigned long long own[MEMBER_SIZES], first[MEMBER_SIZES], v[MEMBER_SIZES];
    sizes_of(params, own);
    int at = snprintf(text, SHM_MEMBER_TEXT_MAX, "%llu %llu %llu %llu %llu ", own[0], own[1],
                      own[2], own[3], own[4]);
    if (fsdp2_cpus_format(&mine, text + at, SHM_MEMBER_TEXT_MAX - (size_t)at) != 0)
        snprintf(text + at, SHM_MEMBER_TEXT_MAX - (size_t)at, "0"); /* cannot happen */
    char key[FSDP2_GROUP_KEY_MAX];
    fsdp2_group_member_key(g, "shm/member", g->rank, key);
    fsdp2_status_t status = fsdp2_store_set(store, key, text, strlen(text));
    if (status == FSDP2_SUCCESS)
        status = fsdp2_setup_wait_members(&g->setup, store, "shm/member",
                                          "publish its shared-memory sizes and CPUs");
    for (int r = 0; r < g->size && status == FSDP2_SUCCESS; r++) {
        size_t len = 0;
        fsdp2_group_member_key(g, "shm/member", r, key);
        status = fsdp2_store_get(store, key, text, SHM_MEMBER_TEXT_MAX - 1, &len);
        if (status != FSDP2_SUCCESS)
            break;
        text[len < SHM_MEMBER_TEXT_MAX ? len : SHM_MEMBER_TEXT_MAX - 1] = '\0';
        if (parse_member(text, r == 0 ? first : v, &sets[r]) != 0) {
            status = fsdp2_error(FSDP2_ERR_CORRUPT, "group '%s': member %d published "
                                 "'%.64s', not its sizes and CPUs", g->name, r, text);
            break;
        }
        for (int i = 0; i < MEMBER_SIZES && r > 0 && status == FSDP2_SUCCESS; i++)
            if (v[i] != first[i])
                status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                                     "group '%s': %s is %llu on rank %d but %llu on rank 0: "
                                     "shared-memory collectives need it alike on every rank",
                                     g->name, size_names[i], v[i], r, first[i]);
    }
    if (status == FSDP2_SUCCESS)
        fsdp2_shm_placement(sets, g->size, out);
    free(sets);
    free(text);
    return status;
}

int fsdp2_host_is_virtual(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 31) & 1; /* the hypervisor bit */
#else
    return 0;
#endif
}

/* This machine's topology, loaded at the first group that needs it and kept: groups
 * are made a few times per process, a load reads /sys for milliseconds. */
static fsdp2_topology_t *machine;
static fsdp2_status_t machine_status = FSDP2_ERR_NOT_AVAILABLE;
static pthread_once_t machine_once = PTHREAD_ONCE_INIT;

static void machine_load(void)
{
    machine_status = fsdp2_topology_load(&machine);
}

int fsdp2_shm_shared_cache(const cpu_set_t *cpus, size_t *bytes)
{
    char saved[1024]; /* group creation goes on without a topology: not an error of it */
    snprintf(saved, sizeof(saved), "%s", fsdp2_last_error());
    pthread_once(&machine_once, machine_load);
    fsdp2_status_t status = machine_status;
    if (status == FSDP2_SUCCESS) {
        int list[CPU_SETSIZE], n = 0, numa = 0;
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, cpus))
                list[n++] = c;
        status = fsdp2_topology_shared_cache(machine, list, n, bytes, &numa);
    }
    if (status != FSDP2_SUCCESS)
        FSDP2_LOG(DEBUG, COLL, "no shared cache from the topology (%s): slot stores are "
                  "learned", machine_status != FSDP2_SUCCESS ? "it could not be loaded"
                                                             : fsdp2_last_error());
    fsdp2_error_set_message(saved);
    return status == FSDP2_SUCCESS ? 0 : -1;
}
