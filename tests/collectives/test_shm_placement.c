/* Where a shared-memory group's ranks may run, and what follows, decided from every
 * rank's CPU set (shm_placement.c), and fsdp2run --bind auto's choice
 * (fsdp2_topology_auto_bind), on three synthetic machines: a 2-socket host of 64 cores
 * with 2 hardware threads each, an 8-core laptop, and a 2-vCPU virtual machine (with
 * ranks unbound, bound by fsdp2_topology_cpuset_for_rank as fsdp2run --bind core binds
 * them, and bound one per core by hand as Slurm's --cpu-bind=cores does). The rule: a
 * group is oversubscribed when its ranks outnumber the CPUs in the union of their sets,
 * (or than the CPUs of a set that holds the sets of that many ranks), whatever each
 * rank's own set holds. Also the cpulist text the ranks publish. */
#include <check.h>

#include "../core/check_main.h"
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

#include "collectives/shm_internal.h"

#define OK(call) ck_assert_msg((call) == FSDP2_SUCCESS, "%s failed: %s", #call, fsdp2_last_error())

/* 2 packages (a NUMA node and a 48 MiB L3 each) x 32 cores x 2 PUs: core c holds PUs
 * 2c, 2c + 1. The laptop's 8 cores have 1 MiB of L2 each and share an 8 MiB L3; the
 * VM's 2 vCPUs share a 32 MiB L3 (what a hypervisor may report, whatever the host does). */
static const char host_64[] = "pack:2 numa:1 l3:1(size=50331648) core:32 pu:2";
static const char laptop_8[] = "pack:1 l3:1(size=8388608) l2:8(size=1048576) core:1 pu:1";
static const char vm_2[] = "pack:1 l3:1(size=33554432) core:2 pu:1";

static fsdp2_topology_t *load(const char *description)
{
    fsdp2_topology_t *t = NULL;
    OK(fsdp2_topology_load_synthetic(description, &t));
    return t;
}

/* The sets fsdp2_topology_cpuset_for_rank gives n ranks under mode. */
static cpu_set_t *sets_for(fsdp2_topology_t *t, int n, fsdp2_bind_mode_t mode)
{
    cpu_set_t *sets = calloc((size_t)n, sizeof(*sets));
    ck_assert_ptr_nonnull(sets);
    int cpus[256], ncpus = 0;
    for (int r = 0; r < n; r++) {
        OK(fsdp2_topology_cpuset_for_rank(t, r, n, mode, cpus, 256, &ncpus));
        CPU_ZERO(&sets[r]);
        for (int i = 0; i < ncpus; i++)
            CPU_SET(cpus[i], &sets[r]);
    }
    return sets;
}

static void expect(const cpu_set_t *sets, int n, int cpus, int disjoint, int oversubscribed,
                   const char *what)
{
    shm_placement_t p;
    fsdp2_shm_placement(sets, n, &p);
    ck_assert_msg(p.ranks == n && p.cpus == cpus && p.disjoint == disjoint &&
                      p.oversubscribed == oversubscribed,
                  "%s: %d ranks on %d CPUs, disjoint %d, oversubscribed %d; expected %d CPUs, "
                  "disjoint %d, oversubscribed %d",
                  what, p.ranks, p.cpus, p.disjoint, p.oversubscribed, cpus, disjoint,
                  oversubscribed);
}

/* The slot stores the topology rule picks for n ranks on sets[0..n) of machine t, at
 * each size from 16 KiB to 64 MiB (x4): want[i] is 'p' (plain) or 's' (streaming). */
static void expect_stores(fsdp2_topology_t *t, const cpu_set_t *sets, int n,
                          size_t want_cache, int want_numa, const char *want, const char *what)
{
    shm_placement_t p;
    fsdp2_shm_placement(sets, n, &p);
    int cpus[CPU_SETSIZE], ncpus = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &p.all))
            cpus[ncpus++] = c;
    size_t cache = 1;
    int numa = -1;
    OK(fsdp2_topology_shared_cache(t, cpus, ncpus, &cache, &numa));
    ck_assert_msg(cache == want_cache && numa == want_numa,
                  "%s: shared cache %zu bytes over %d NUMA nodes; expected %zu over %d", what,
                  cache, numa, want_cache, want_numa);
    char got[8] = "";
    size_t ring = (size_t)4 * 262144; /* the default: 4 slots of 256 KiB */
    for (int i = 0; i < 6; i++)
        got[i] = fsdp2_shm_stores_rule(cache, n, (size_t)16384 << (2 * i), ring) ? 's' : 'p';
    ck_assert_msg(strcmp(got, want) == 0, "%s: slot stores 16K..64M %s, expected %s", what, got,
                  want);
}

static void expect_auto(fsdp2_topology_t *t, int n, fsdp2_bind_mode_t want, const char *what)
{
    fsdp2_bind_mode_t mode = (fsdp2_bind_mode_t)-1;
    OK(fsdp2_topology_auto_bind(t, n, &mode));
    ck_assert_msg(mode == want, "%s: --bind auto for %d ranks gave %s, expected %s", what, n,
                  fsdp2_bind_mode_name(mode), fsdp2_bind_mode_name(want));
}

START_TEST(two_socket_host)
{
    fsdp2_topology_t *t = load(host_64);
    /* 64 ranks, one per core (2 PUs each): a CPU each, though each rank's own set has
     * only 2 */
    cpu_set_t *sets = sets_for(t, 64, FSDP2_BIND_CORE);
    ck_assert_int_eq(CPU_COUNT(&sets[5]), 2);
    expect(sets, 64, 128, 1, 0, "64 ranks bound a core each");
    /* across both sockets no cache is shared: the slots go past the caches */
    expect_stores(t, sets, 64, 0, 2, "ssssss", "64 ranks bound a core each");
    /* within socket 0: 8 ranks fill at most 8 MiB of slots, under half its 48 MiB L3;
     * 32 ranks fill 32 MiB from 1 MiB each, over half */
    expect_stores(t, sets, 8, 50331648, 1, "pppppp", "8 ranks on cores 0-7");
    expect_stores(t, sets, 32, 50331648, 1, "pppsss", "32 ranks on socket 0");
    free(sets);
    sets = sets_for(t, 64, FSDP2_BIND_NONE);
    expect(sets, 64, 128, 0, 0, "64 ranks unbound");
    expect_stores(t, sets, 64, 0, 2, "ssssss", "64 ranks unbound");
    free(sets);
    sets = sets_for(t, 2, FSDP2_BIND_NUMA); /* a package (its NUMA node) each */
    ck_assert_int_eq(CPU_COUNT(&sets[1]), 64);
    expect(sets, 2, 128, 1, 0, "2 ranks bound by NUMA node");
    free(sets);
    /* 192 ranks bound by cores: 3 to a core, on the 128 PUs */
    sets = sets_for(t, 192, FSDP2_BIND_CORE);
    expect(sets, 192, 128, 0, 1, "192 ranks bound by cores");
    free(sets);
    expect_auto(t, 8, FSDP2_BIND_NONE, "2-socket host");
    expect_auto(t, 128, FSDP2_BIND_NONE, "2-socket host");
    expect_auto(t, 129, FSDP2_BIND_CORE, "2-socket host");
    OK(fsdp2_topology_destroy(t));
}
END_TEST

START_TEST(laptop)
{
    fsdp2_topology_t *t = load(laptop_8);
    cpu_set_t *sets = sets_for(t, 8, FSDP2_BIND_NONE);
    expect(sets, 8, 8, 0, 0, "8 ranks unbound on 8 cores");
    /* 8 ranks x 512 KiB fill half the 8 MiB L3 */
    expect_stores(t, sets, 8, 8388608, 1, "pppsss", "8 ranks on the laptop");
    free(sets);
    sets = sets_for(t, 4, FSDP2_BIND_CORE);
    expect(sets, 4, 8, 1, 0, "4 ranks bound to 2 cores each");
    ck_assert_int_eq(CPU_COUNT(&sets[0]), 2);
    free(sets);
    sets = sets_for(t, 16, FSDP2_BIND_NONE);
    expect(sets, 16, 8, 0, 1, "16 ranks unbound on 8 cores");
    free(sets);
    expect_auto(t, 8, FSDP2_BIND_NONE, "laptop");
    expect_auto(t, 16, FSDP2_BIND_CORE, "laptop");
    OK(fsdp2_topology_destroy(t));
}
END_TEST

START_TEST(two_vcpu_vm)
{
    fsdp2_topology_t *t = load(vm_2);
    cpu_set_t *sets = sets_for(t, 2, FSDP2_BIND_NONE);
    expect(sets, 2, 2, 0, 0, "2 ranks unbound on 2 vCPUs");
    /* the rule would keep plain stores in the reported L3, but under a hypervisor auto
     * learns: the host moves the vCPUs between caches this topology does not show */
    expect_stores(t, sets, 2, 33554432, 1, "pppppp", "2 ranks on the VM");
    ck_assert_int_eq(fsdp2_shm_stores_resolve(SHM_STORES_AUTO, 1, 1), SHM_STORES_LEARN);
    free(sets);
    sets = sets_for(t, 2, FSDP2_BIND_CORE);
    expect(sets, 2, 2, 1, 0, "2 ranks bound a vCPU each");
    free(sets);
    sets = sets_for(t, 4, FSDP2_BIND_CORE); /* what --bind auto does with 4 */
    expect(sets, 4, 2, 0, 1, "4 ranks bound 2 to a vCPU");
    free(sets);
    sets = sets_for(t, 4, FSDP2_BIND_NONE);
    expect(sets, 4, 2, 0, 1, "4 ranks unbound on 2 vCPUs");
    free(sets);
    expect_auto(t, 2, FSDP2_BIND_NONE, "2-vCPU VM");
    expect_auto(t, 3, FSDP2_BIND_CORE, "2-vCPU VM");
    expect_auto(t, 4, FSDP2_BIND_CORE, "2-vCPU VM");
    OK(fsdp2_topology_destroy(t));
}
END_TEST

/* Ranks bound by hand, as a launcher may bind them: one rank per PU on a set that is
 * not a block, and two ranks whose sets overlap in one CPU. */
START_TEST(sets_by_hand)
{
    cpu_set_t sets[3];
    for (int r = 0; r < 3; r++) {
        CPU_ZERO(&sets[r]);
        CPU_SET(10 * r + 7, &sets[r]);
    }
    expect(sets, 3, 3, 1, 0, "3 ranks on CPUs 7, 17, 27");
    CPU_ZERO(&sets[1]);
    CPU_SET(7, &sets[1]);
    expect(sets, 3, 2, 0, 1, "3 ranks, 2 of them on CPU 7");
    CPU_SET(8, &sets[1]);
    expect(sets, 3, 3, 0, 0, "3 ranks on 7 | 7-8 | 27");
    /* 3 CPUs in the union, but two ranks on CPU 7 */
    CPU_ZERO(&sets[1]);
    CPU_SET(7, &sets[1]);
    CPU_ZERO(&sets[2]);
    CPU_SET(7, &sets[2]);
    CPU_SET(8, &sets[2]);
    CPU_SET(9, &sets[2]);
    expect(sets, 3, 3, 0, 1, "3 ranks on 7 | 7 | 7-9");
}
END_TEST

/* What FSDP2_SHM_STREAM_STORES resolves to, and the topology query's errors. */
START_TEST(store_policy)
{
    ck_assert_int_eq(fsdp2_shm_stores_resolve(SHM_STORES_AUTO, 0, 1), SHM_STORES_TOPOLOGY);
    ck_assert_int_eq(fsdp2_shm_stores_resolve(SHM_STORES_AUTO, 1, 1), SHM_STORES_LEARN);
    ck_assert_int_eq(fsdp2_shm_stores_resolve(SHM_STORES_AUTO, 0, 0), SHM_STORES_LEARN);
    ck_assert_int_eq(fsdp2_shm_stores_resolve(SHM_STORES_TOPOLOGY, 1, 1), SHM_STORES_TOPOLOGY);
    ck_assert_int_eq(fsdp2_shm_stores_resolve(SHM_STORES_TOPOLOGY, 0, 0), SHM_STORES_LEARN);
    ck_assert_int_eq(fsdp2_shm_stores_resolve(SHM_STORES_LEARN, 0, 1), SHM_STORES_LEARN);
    ck_assert_int_eq(fsdp2_shm_stores_resolve(SHM_STORES_PLAIN, 0, 1), SHM_STORES_PLAIN);
    ck_assert_int_eq(fsdp2_shm_stores_resolve(SHM_STORES_STREAM, 1, 0), SHM_STORES_STREAM);
    fsdp2_topology_t *t = load(laptop_8);
    size_t cache;
    int numa, cpus[2] = {3, 8};
    ck_assert_int_eq(fsdp2_topology_shared_cache(t, cpus, 2, &cache, &numa),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "CPU 8") != NULL, "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_topology_shared_cache(t, cpus, 0, &cache, &numa),
                     FSDP2_ERR_INVALID_ARGUMENT);
    OK(fsdp2_topology_shared_cache(t, cpus, 1, &cache, &numa)); /* one core: the L3, not L2 */
    ck_assert_uint_eq(cache, 8388608);
    OK(fsdp2_topology_destroy(t));
}
END_TEST

START_TEST(cpu_lists)
{
    cpu_set_t set, back;
    CPU_ZERO(&set);
    int on[] = {0, 1, 2, 3, 8, 10, 11, 1023};
    for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++)
        CPU_SET(on[i], &set);
    char text[SHM_CPUS_TEXT_MAX];
    ck_assert_int_eq(fsdp2_cpus_format(&set, text, sizeof(text)), 0);
    ck_assert_str_eq(text, "0-3,8,10-11,1023");
    ck_assert_int_eq(fsdp2_cpus_parse(text, &back), 0);
    ck_assert(CPU_EQUAL(&set, &back));
    ck_assert_int_eq(fsdp2_cpus_format(&set, text, 8), -1); /* does not fit */
    /* the longest lists, within SHM_CPUS_TEXT_MAX: every other CPU, 2 on and 1 off */
    for (int period = 2; period <= 3; period++) {
        CPU_ZERO(&set);
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (period == 2 ? c % 2 == 0 : c % 3 != 2)
                CPU_SET(c, &set);
        ck_assert_int_eq(fsdp2_cpus_format(&set, text, sizeof(text)), 0);
        ck_assert_int_eq(fsdp2_cpus_parse(text, &back), 0);
        ck_assert(CPU_EQUAL(&set, &back));
    }
    static const char *const bad[] = {"a", "3-1", "1,", "1,,2", "-1", "0-", "1024", "2 3",
                                      "0-99999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(fsdp2_cpus_parse(bad[i], &back) == -1, "'%s' was taken", bad[i]);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("shm_placement");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, two_socket_host);
    tcase_add_test(tc, laptop);
    tcase_add_test(tc, two_vcpu_vm);
    tcase_add_test(tc, sets_by_hand);
    tcase_add_test(tc, store_policy);
    tcase_add_test(tc, cpu_lists);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(make_suite)
