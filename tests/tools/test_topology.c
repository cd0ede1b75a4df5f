/* The topology API: counts, the block distribution of local ranks over cores and NUMA
 * nodes (on a synthetic 2-package, 4-node, 16-core, 32-PU machine, against sets written
 * out by hand from the documented rule), argument errors, the formatter's truncation,
 * and binding this process on the real machine (checked with sched_getaffinity). */
#include <check.h>

#include "../core/check_main.h"
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

#define OK(call) ck_assert_msg((call) == FSDP2_SUCCESS, "%s failed: %s", #call, fsdp2_last_error())

/* Package p holds NUMA nodes 2p, 2p+1; node n holds cores 4n..4n+3; core c holds PUs
 * 2c, 2c+1. */
static const char synthetic[] = "pack:2 numa:2 core:4 pu:2";

static fsdp2_topology_t *load_synthetic(void)
{
    fsdp2_topology_t *t = NULL;
    OK(fsdp2_topology_load_synthetic(synthetic, &t));
    return t;
}

/* Asserts that rank r of n under mode gets exactly PUs [first, first + count). */
static void expect_range(fsdp2_topology_t *t, int r, int n, fsdp2_bind_mode_t mode, int first,
                         int count)
{
    int cpus[64], ncpus = -1;
    OK(fsdp2_topology_cpuset_for_rank(t, r, n, mode, cpus, 64, &ncpus));
    ck_assert_msg(ncpus == count, "rank %d of %d (%s): %d CPUs, expected %d", r, n,
                  fsdp2_bind_mode_name(mode), ncpus, count);
    for (int i = 0; i < count; i++)
        ck_assert_msg(cpus[i] == first + i, "rank %d of %d (%s): CPU[%d] = %d, expected %d", r, n,
                      fsdp2_bind_mode_name(mode), i, cpus[i], first + i);
}

START_TEST(synthetic_counts_match_the_description)
{
    fsdp2_topology_t *t = load_synthetic();
    static const int want[] = {2, 4, 16, 32, 0};
    for (int kind = FSDP2_TOPOLOGY_PACKAGE; kind <= FSDP2_TOPOLOGY_GPU; kind++) {
        int n = -1;
        OK(fsdp2_topology_count(t, (fsdp2_topology_kind_t)kind, &n));
        ck_assert_msg(n == want[kind], "kind %d: %d, expected %d", kind, n, want[kind]);
    }
    int n;
    ck_assert_int_eq(fsdp2_topology_count(t, (fsdp2_topology_kind_t)99, &n),
                     FSDP2_ERR_INVALID_ARGUMENT);
    OK(fsdp2_topology_destroy(t));
}
END_TEST

START_TEST(core_binding_gives_blocks_of_whole_cores)
{
    fsdp2_topology_t *t = load_synthetic();
    /* 4 ranks: 4 cores = 8 PUs each. */
    for (int r = 0; r < 4; r++)
        expect_range(t, r, 4, FSDP2_BIND_CORE, 8 * r, 8);
    /* 3 ranks over 16 cores: [0,5), [5,10), [10,16). */
    expect_range(t, 0, 3, FSDP2_BIND_CORE, 0, 10);
    expect_range(t, 1, 3, FSDP2_BIND_CORE, 10, 10);
    expect_range(t, 2, 3, FSDP2_BIND_CORE, 20, 12);
    /* One rank per core, and two ranks per core (consecutive ranks share). */
    for (int r = 0; r < 16; r++)
        expect_range(t, r, 16, FSDP2_BIND_CORE, 2 * r, 2);
    for (int r = 0; r < 32; r++)
        expect_range(t, r, 32, FSDP2_BIND_CORE, 2 * (r / 2), 2);
    /* 1 rank: everything. */
    expect_range(t, 0, 1, FSDP2_BIND_CORE, 0, 32);
    OK(fsdp2_topology_destroy(t));
}
END_TEST

START_TEST(numa_binding_gives_blocks_of_nodes)
{
    fsdp2_topology_t *t = load_synthetic();
    for (int r = 0; r < 2; r++)
        expect_range(t, r, 2, FSDP2_BIND_NUMA, 16 * r, 16);
    for (int r = 0; r < 4; r++)
        expect_range(t, r, 4, FSDP2_BIND_NUMA, 8 * r, 8);
    for (int r = 0; r < 8; r++)
        expect_range(t, r, 8, FSDP2_BIND_NUMA, 8 * (r / 2), 8);
    /* 3 ranks over 4 nodes: {0}, {1}, {2,3}. */
    expect_range(t, 0, 3, FSDP2_BIND_NUMA, 0, 8);
    expect_range(t, 1, 3, FSDP2_BIND_NUMA, 8, 8);
    expect_range(t, 2, 3, FSDP2_BIND_NUMA, 16, 16);
    expect_range(t, 5, 6, FSDP2_BIND_NONE, 0, 32);
    OK(fsdp2_topology_destroy(t));
}
END_TEST

START_TEST(bad_arguments_are_errors_naming_the_value)
{
    fsdp2_topology_t *t = load_synthetic();
    int cpus[64], n = 0;
    ck_assert_int_eq(fsdp2_topology_cpuset_for_rank(t, 4, 4, FSDP2_BIND_CORE, cpus, 64, &n),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "local rank 4 of local world size 4"));
    ck_assert_int_eq(fsdp2_topology_cpuset_for_rank(t, 0, 0, FSDP2_BIND_CORE, cpus, 64, &n),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_topology_cpuset_for_rank(t, -1, 2, FSDP2_BIND_CORE, cpus, 64, &n),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(
        fsdp2_topology_cpuset_for_rank(t, 0, 2, (fsdp2_bind_mode_t)7, cpus, 64, &n),
        FSDP2_ERR_INVALID_ARGUMENT);
    /* Too small an array: the error, and the size that would do. */
    ck_assert_int_eq(fsdp2_topology_cpuset_for_rank(t, 0, 2, FSDP2_BIND_CORE, cpus, 3, &n),
                     FSDP2_ERR_OVERFLOW);
    ck_assert_int_eq(n, 16);
    ck_assert_int_eq(fsdp2_topology_cpuset_for_rank(t, 0, 2, FSDP2_BIND_CORE, NULL, 0, &n),
                     FSDP2_ERR_OVERFLOW);
    ck_assert_int_eq(n, 16);
    /* A synthetic machine is not this one. */
    ck_assert_int_eq(fsdp2_topology_bind_self(t, 0, 2, FSDP2_BIND_CORE), FSDP2_ERR_UNSUPPORTED);
    OK(fsdp2_topology_bind_self(t, 0, 2, FSDP2_BIND_NONE));
    OK(fsdp2_topology_destroy(t));
    OK(fsdp2_topology_destroy(NULL));

    fsdp2_topology_t *bad = (fsdp2_topology_t *)&n;
    ck_assert_int_eq(fsdp2_topology_load_synthetic("pack:banana", &bad),
                     FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(bad);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "pack:banana"));

    fsdp2_bind_mode_t mode;
    OK(fsdp2_bind_mode_parse("numa", &mode));
    ck_assert_int_eq(mode, FSDP2_BIND_NUMA);
    ck_assert_int_eq(fsdp2_bind_mode_parse("socket", &mode), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "'socket'"));
    ck_assert_str_eq(fsdp2_bind_mode_name(FSDP2_BIND_CORE), "core");
    ck_assert_str_eq(fsdp2_bind_mode_name((fsdp2_bind_mode_t)9), "unknown");
}
END_TEST

START_TEST(format_summarises_and_truncates_safely)
{
    fsdp2_topology_t *t = load_synthetic();
    size_t needed = 0;
    OK(fsdp2_topology_format(t, NULL, 0, &needed));
    char *full = malloc(needed + 1);
    size_t again = 0;
    OK(fsdp2_topology_format(t, full, needed + 1, &again));
    ck_assert_uint_eq(again, needed);
    ck_assert_uint_eq(strlen(full), needed);
    static const char *const parts[] = {
        "2 packages, 4 NUMA nodes, 16 cores, 32 PUs",
        "package 1: NUMA nodes 2-3, cores 8-15",
        "NUMA node 2: 1024 MiB, cores 8-11, PUs 16-23",
        " 15:30-31",
        "GPUs: none",
    };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        ck_assert_msg(strstr(full, parts[i]), "\"%s\" missing from:\n%s", parts[i], full);
    char small[20];
    memset(small, 'x', sizeof(small));
    OK(fsdp2_topology_format(t, small, sizeof(small), &again));
    ck_assert_uint_eq(again, needed);
    ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
    ck_assert(strncmp(small, full, sizeof(small) - 1) == 0);
    free(full);
    OK(fsdp2_topology_destroy(t));
}
END_TEST

/* The real machine: PU count covers this process's CPUs; binding one of n ranks leaves
 * the process on exactly the CPUs cpuset_for_rank names (Check forks this test, so the
 * binding does not outlive it). */
START_TEST(bind_self_matches_cpuset_for_rank_on_this_machine)
{
    fsdp2_topology_t *t = NULL;
    OK(fsdp2_topology_load(&t));
    cpu_set_t before;
    ck_assert(sched_getaffinity(0, sizeof(before), &before) == 0);
    int pus = 0, cores = 0;
    OK(fsdp2_topology_count(t, FSDP2_TOPOLOGY_PU, &pus));
    OK(fsdp2_topology_count(t, FSDP2_TOPOLOGY_CORE, &cores));
    ck_assert_int_ge(pus, CPU_COUNT(&before));
    ck_assert_int_ge(cores, 1);
    int n = cores >= 2 ? 2 : 1, r = n - 1;
    for (int mode = FSDP2_BIND_CORE; mode <= FSDP2_BIND_NUMA; mode++) {
        int *cpus = calloc((size_t)pus, sizeof(int)), ncpus = 0;
        OK(fsdp2_topology_cpuset_for_rank(t, r, n, (fsdp2_bind_mode_t)mode, cpus, pus, &ncpus));
        OK(fsdp2_topology_bind_self(t, r, n, (fsdp2_bind_mode_t)mode));
        cpu_set_t after, want;
        CPU_ZERO(&want);
        for (int i = 0; i < ncpus; i++)
            CPU_SET(cpus[i], &want);
        ck_assert(sched_getaffinity(0, sizeof(after), &after) == 0);
        ck_assert_msg(CPU_EQUAL(&after, &want), "mode %d: bound to %d CPUs, expected %d", mode,
                      CPU_COUNT(&after), ncpus);
        /* Undo, so the NUMA case starts from the same usable set. */
        ck_assert(sched_setaffinity(0, sizeof(before), &before) == 0);
        free(cpus);
    }
    OK(fsdp2_topology_destroy(t));
}
END_TEST

/* A two-package machine with two GPUs, as `lstopo --of xml` would write it: the GPU at
 * bus 18 sits on package 1 (NUMA node 1, PUs 2-3) and the one at bus 86 on package 0
 * (NUMA node 0, PUs 0-1), so tree order and bus order differ; package 0 also has the
 * BMC's VGA chip (ASPEED, not a GPU) and a NIC. */
static const char gpu_node_xml[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
    "<topology version=\"2.0\">\n"
    "  <object type=\"Machine\" os_index=\"0\" cpuset=\"0x0000000f\" complete_cpuset=\"0x0000000f\" allowed_cpuset=\"0x0000000f\" nodeset=\"0x00000003\" complete_nodeset=\"0x00000003\" allowed_nodeset=\"0x00000003\" gp_index=\"1\">\n"
    "    <object type=\"Package\" os_index=\"0\" cpuset=\"0x00000003\" complete_cpuset=\"0x00000003\" nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"8\">\n"
    "      <object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x00000003\" complete_cpuset=\"0x00000003\" nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"6\" local_memory=\"1073741824\">\n"
    "      </object>\n"
    "      <object type=\"Core\" os_index=\"0\" cpuset=\"0x00000001\" complete_cpuset=\"0x00000001\" nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"3\">\n"
    "        <object type=\"PU\" os_index=\"0\" cpuset=\"0x00000001\" complete_cpuset=\"0x00000001\" nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"2\"/>\n"
    "      </object>\n"
    "      <object type=\"Core\" os_index=\"1\" cpuset=\"0x00000002\" complete_cpuset=\"0x00000002\" nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"5\">\n"
    "        <object type=\"PU\" os_index=\"1\" cpuset=\"0x00000002\" complete_cpuset=\"0x00000002\" nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"4\"/>\n"
    "      </object>\n"
    "<object type=\"Bridge\" gp_index=\"40\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[02-87]\"><object type=\"PCIDev\" gp_index=\"41\" pci_busid=\"0000:02:00.0\" pci_type=\"0300 [1a03:2000] [0000:0000] a1\" pci_link_speed=\"0.000000\"></object><object type=\"PCIDev\" gp_index=\"43\" pci_busid=\"0000:86:00.0\" pci_type=\"0302 [10de:2330] [0000:0000] a1\" pci_link_speed=\"0.000000\"><object type=\"OSDev\" gp_index=\"44\" name=\"cuda1\" subtype=\"CUDA\" osdev_type=\"5\"/></object><object type=\"PCIDev\" gp_index=\"45\" pci_busid=\"0000:87:00.0\" pci_type=\"0200 [15b3:101b] [0000:0000] a1\" pci_link_speed=\"0.000000\"></object></object>\n"
    "    </object>\n"
    "    <object type=\"Package\" os_index=\"1\" cpuset=\"0x0000000c\" complete_cpuset=\"0x0000000c\" nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"15\">\n"
    "      <object type=\"NUMANode\" os_index=\"1\" cpuset=\"0x0000000c\" complete_cpuset=\"0x0000000c\" nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"13\" local_memory=\"1073741824\">\n"
    "      </object>\n"
    "      <object type=\"Core\" os_index=\"2\" cpuset=\"0x00000004\" complete_cpuset=\"0x00000004\" nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"10\">\n"
    "        <object type=\"PU\" os_index=\"2\" cpuset=\"0x00000004\" complete_cpuset=\"0x00000004\" nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"9\"/>\n"
    "      </object>\n"
    "      <object type=\"Core\" os_index=\"3\" cpuset=\"0x00000008\" complete_cpuset=\"0x00000008\" nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"12\">\n"
    "        <object type=\"PU\" os_index=\"3\" cpuset=\"0x00000008\" complete_cpuset=\"0x00000008\" nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"11\"/>\n"
    "      </object>\n"
    "<object type=\"Bridge\" gp_index=\"50\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[18-18]\"><object type=\"PCIDev\" gp_index=\"51\" pci_busid=\"0000:18:00.0\" pci_type=\"0302 [10de:2330] [0000:0000] a1\" pci_link_speed=\"0.000000\"><object type=\"OSDev\" gp_index=\"52\" name=\"cuda0\" subtype=\"CUDA\" osdev_type=\"5\"/></object></object>\n"
    "    </object>\n"
    "  </object>\n"
    "  <support name=\"discovery.pu\"/>\n"
    "  <support name=\"discovery.numa\"/>\n"
    "  <support name=\"discovery.numa_memory\"/>\n"
    "  <support name=\"custom.exported_support\"/>\n"
    "</topology>\n";

static fsdp2_topology_t *load_gpu_node(void)
{
    fsdp2_topology_t *t = NULL;
    OK(fsdp2_topology_load_xml(gpu_node_xml, sizeof(gpu_node_xml) - 1, &t));
    return t;
}

START_TEST(gpus_are_numbered_in_bus_order_with_their_numa_node_and_cpus)
{
    fsdp2_topology_t *t = load_gpu_node();
    int n = -1;
    OK(fsdp2_topology_count(t, FSDP2_TOPOLOGY_GPU, &n));
    ck_assert_int_eq(n, 2);
    const struct {
        const char *bus;
        int node, first_cpu;
        const char *name;
    } want[2] = {{"0000:18:00.0", 1, 2, "cuda0"}, {"0000:86:00.0", 0, 0, "cuda1"}};
    for (int i = 0; i < 2; i++) {
        fsdp2_topology_gpu_t g;
        OK(fsdp2_topology_gpu(t, i, &g));
        ck_assert_str_eq(g.pci_bus_id, want[i].bus);
        ck_assert_uint_eq(g.vendor_id, 0x10de);
        ck_assert_uint_eq(g.device_id, 0x2330);
        ck_assert_int_eq(g.numa_node, want[i].node);
        ck_assert_int_eq(g.ncpus, 2);
        ck_assert_str_eq(g.name, want[i].name);
        int cpus[4] = {-1, -1, -1, -1}, ncpus = -1;
        OK(fsdp2_topology_gpu_cpus(t, i, cpus, 4, &ncpus));
        ck_assert_int_eq(ncpus, 2);
        ck_assert_int_eq(cpus[0], want[i].first_cpu);
        ck_assert_int_eq(cpus[1], want[i].first_cpu + 1);
        ck_assert_int_eq(fsdp2_topology_gpu_cpus(t, i, cpus, 1, &ncpus), FSDP2_ERR_OVERFLOW);
        ck_assert_int_eq(ncpus, 2);
    }
    /* CUDA's and NVML's spellings of a bus id */
    int index = -1;
    OK(fsdp2_topology_find_gpu(t, "0000:86:00.0", &index));
    ck_assert_int_eq(index, 1);
    OK(fsdp2_topology_find_gpu(t, "00000000:18:00.0", &index));
    ck_assert_int_eq(index, 0);
    OK(fsdp2_topology_find_gpu(t, "0000:86:00.0", &index));
    ck_assert_int_eq(fsdp2_topology_find_gpu(t, "0000:8A:00.0", &index), FSDP2_ERR_NOT_FOUND);
    ck_assert_msg(strstr(fsdp2_last_error(), "0000:8A:00.0"), "%s", fsdp2_last_error());
    /* the VGA chip and the NIC are not GPUs */
    ck_assert_int_eq(fsdp2_topology_find_gpu(t, "0000:02:00.0", &index), FSDP2_ERR_NOT_FOUND);
    ck_assert_int_eq(fsdp2_topology_find_gpu(t, "0000:87:00.0", &index), FSDP2_ERR_NOT_FOUND);
    /* the summary lists them in the same order */
    char text[4096];
    OK(fsdp2_topology_format(t, text, sizeof(text), NULL));
    const char *g0 = strstr(text, "GPU 0: 0000:18:00.0"), *g1 = strstr(text, "GPU 1: 0000:86:00.0");
    ck_assert_msg(g0 && g1 && g0 < g1, "%s", text);
    ck_assert_msg(strstr(g0, "NUMA node 1"), "%s", text);
    OK(fsdp2_topology_destroy(t));
}
END_TEST

START_TEST(gpu_queries_reject_bad_indices_ids_and_topologies)
{
    fsdp2_topology_t *t = load_gpu_node();
    fsdp2_topology_gpu_t g;
    int index = 0, ncpus = 0, cpus[4];
    ck_assert_int_eq(fsdp2_topology_gpu(t, 2, &g), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(g.numa_node, -1); /* cleared on failure */
    ck_assert_msg(strstr(fsdp2_last_error(), "GPU 2"), "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_topology_gpu(t, -1, &g), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_topology_gpu(t, 0, NULL), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_topology_gpu_cpus(t, 5, cpus, 4, &ncpus), FSDP2_ERR_INVALID_ARGUMENT);
    const char *bad[] = {"",           "3b:00.0",       "0000:3b:00",    "0000:3b:00.0 ",
                         "zz:3b:00.0", " 0000:3b:00.0", "0x0:3b:00.0",   "-1:3b:00.0",
                         "0000:+3b:00.0", "000000000:3b:00.0", "0000:3b:00.10"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(fsdp2_topology_find_gpu(t, bad[i], &index), FSDP2_ERR_INVALID_ARGUMENT);
        ck_assert_msg(strstr(fsdp2_last_error(), "PCI bus id"), "%s", fsdp2_last_error());
    }
    OK(fsdp2_topology_destroy(t));
    /* a synthetic machine has no GPUs; no CUDA device here maps to one */
    t = load_synthetic();
    ck_assert_int_eq(fsdp2_topology_gpu(t, 0, &g), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "0 GPU"), "%s", fsdp2_last_error());
    fsdp2_status_t s = fsdp2_topology_gpu_of_device(t, 0, &index);
    ck_assert_msg(s == FSDP2_ERR_NOT_AVAILABLE || s == FSDP2_ERR_NOT_FOUND, "%s: %s",
                  fsdp2_status_name(s), fsdp2_last_error());
    OK(fsdp2_topology_destroy(t));
    const char junk[] = "<topology version=\"2.0\"><object";
    ck_assert_int_eq(fsdp2_topology_load_xml(junk, sizeof(junk) - 1, &t), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(t);
}
END_TEST

static Suite *topology_suite(void)
{
    Suite *s = suite_create("topology");
    TCase *tc = tcase_create("topology");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, synthetic_counts_match_the_description);
    tcase_add_test(tc, core_binding_gives_blocks_of_whole_cores);
    tcase_add_test(tc, numa_binding_gives_blocks_of_nodes);
    tcase_add_test(tc, bad_arguments_are_errors_naming_the_value);
    tcase_add_test(tc, format_summarises_and_truncates_safely);
    tcase_add_test(tc, bind_self_matches_cpuset_for_rank_on_this_machine);
    tcase_add_test(tc, gpus_are_numbered_in_bus_order_with_their_numa_node_and_cpus);
    tcase_add_test(tc, gpu_queries_reject_bad_indices_ids_and_topologies);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(topology_suite)
