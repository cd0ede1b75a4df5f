/* Machine topology and CPU binding over hwloc (see include/fsdp2/topology.h for the
 * block distribution and the index conventions). */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/topology.h>

#include "core/device_ops.h"
#include "core/error.h"
#include "core/log_internal.h"

const char *fsdp2_bind_mode_name(fsdp2_bind_mode_t mode)
{
    switch (mode) {
    case FSDP2_BIND_NONE:
        return "none";
    case FSDP2_BIND_CORE:
        return "core";
    case FSDP2_BIND_NUMA:
        return "numa";
    }
    return "unknown";
}

fsdp2_status_t fsdp2_bind_mode_parse(const char *text, fsdp2_bind_mode_t *mode)
{
    FSDP2_ARG_CHECK(text && mode, "text and mode must not be NULL");
    static const fsdp2_bind_mode_t modes[] = {FSDP2_BIND_NONE, FSDP2_BIND_CORE, FSDP2_BIND_NUMA};
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (strcmp(text, fsdp2_bind_mode_name(modes[i])) == 0) {
            *mode = modes[i];
            return FSDP2_SUCCESS;
        }
    }
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                       "binding '%s' is not valid: expected none|core|numa", text);
}

#ifdef FSDP2_HAVE_HWLOC

#include <dlfcn.h>
#include <hwloc.h>

struct fsdp2_topology {
    hwloc_topology_t hw;
    hwloc_bitmap_t usable; /* CPUs this process may run on: its affinity within the cgroup */
    int is_this_system;    /* 0 for synthetic (or HWLOC_SYNTHETIC / HWLOC_XMLFILE) ones */
};

/* Machines without core information (some VMs, some architectures) bind by PU. */
static hwloc_obj_type_t core_type(hwloc_topology_t hw)
{
    return hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
}

/* Display (0x03xx) controllers from NVIDIA or AMD, and any 3D controller (0x0302):
 * this leaves out the BMC's VGA chip that most servers carry. */
static int is_gpu(hwloc_obj_t pci)
{
    unsigned cls = pci->attr->pcidev.class_id, vendor = pci->attr->pcidev.vendor_id;
    return cls == 0x0302 || ((cls >> 8) == 0x03 && (vendor == 0x10de || vendor == 0x1002));
}

static int count_gpus(hwloc_topology_t hw)
{
    int n = 0;
    for (hwloc_obj_t pci = hwloc_get_next_pcidev(hw, NULL); pci;
         pci = hwloc_get_next_pcidev(hw, pci))
        n += is_gpu(pci);
    return n;
}

static fsdp2_status_t topology_finish(fsdp2_topology_t *t, fsdp2_topology_t **out)
{
    t->is_this_system = hwloc_topology_is_thissystem(t->hw);
    t->usable = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(t->hw));
    hwloc_bitmap_t bound = hwloc_bitmap_alloc();
    if (!t->usable || !bound) {
        hwloc_bitmap_free(bound);
        fsdp2_topology_destroy(t);
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "topology: no memory for a cpuset");
    }
    /* A launcher that was itself started under taskset or numactl distributes its ranks
     * within that set, as mpirun does; a synthetic machine has no affinity to respect. */
    if (t->is_this_system && hwloc_get_cpubind(t->hw, bound, HWLOC_CPUBIND_PROCESS) == 0 &&
        hwloc_bitmap_intersects(bound, t->usable))
        hwloc_bitmap_and(t->usable, t->usable, bound);
    hwloc_bitmap_free(bound);
    if (fsdp2_log_enabled(FSDP2_LOG_INFO, FSDP2_SUBSYS_MESH)) {
        char usable[256];
        hwloc_bitmap_list_snprintf(usable, sizeof(usable), t->usable);
        FSDP2_LOG(INFO, MESH, "topology: %d packages, %d NUMA nodes, %d cores, %d PUs, %d GPUs; "
                  "usable PUs %s%s",
                  hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_PACKAGE),
                  hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_NUMANODE),
                  hwloc_get_nbobjs_by_type(t->hw, core_type(t->hw)),
                  hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_PU), count_gpus(t->hw), usable,
                  t->is_this_system ? "" : " (not this system)");
    }
    *out = t;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t topology_new(fsdp2_topology_t **t)
{
    *t = calloc(1, sizeof(**t));
    if (!*t)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "topology: no memory for the handle");
    if (hwloc_topology_init(&(*t)->hw) != 0) {
        int err = errno;
        free(*t);
        *t = NULL;
        return fsdp2_error(FSDP2_ERR_SYSTEM, "hwloc_topology_init failed: %s", strerror(err));
    }
    return FSDP2_SUCCESS;
}

/* hwloc's PCI plugin loads libpciaccess and unloads it again when the topology is
 * destroyed; memory that library keeps for the life of the process then hangs from an
 * unmapped module, and LeakSanitizer reports it as a leak in "<unknown module>" in
 * every program that loaded a topology. Keeping the library mapped, as it would be in a
 * program linked with it, keeps that memory reachable. */
static void keep_pciaccess_loaded(void)
{
    void *handle = dlopen("libpciaccess.so.0", RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    if (handle)
        dlclose(handle);
}

fsdp2_status_t fsdp2_topology_load(fsdp2_topology_t **topo)
{
    FSDP2_ARG_CHECK(topo, "topo must not be NULL");
    *topo = NULL;
    fsdp2_topology_t *t;
    FSDP2_CHECK(topology_new(&t));
    /* GPUs, NICs and their PCI locality; bridges and uninteresting devices are dropped. */
    hwloc_topology_set_io_types_filter(t->hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t->hw) != 0) {
        int err = errno;
        fsdp2_topology_destroy(t);
        return fsdp2_error(FSDP2_ERR_SYSTEM, "hwloc_topology_load failed: %s", strerror(err));
    }
    keep_pciaccess_loaded();
    return topology_finish(t, topo);
}

fsdp2_status_t fsdp2_topology_load_synthetic(const char *description, fsdp2_topology_t **topo)
{
    FSDP2_ARG_CHECK(description && topo, "description and topo must not be NULL");
    *topo = NULL;
    fsdp2_topology_t *t;
    FSDP2_CHECK(topology_new(&t));
    if (hwloc_topology_set_synthetic(t->hw, description) != 0) {
        fsdp2_topology_destroy(t);
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "hwloc does not accept the synthetic topology '%s'", description);
    }
    if (hwloc_topology_load(t->hw) != 0) {
        int err = errno;
        fsdp2_topology_destroy(t);
        return fsdp2_error(FSDP2_ERR_SYSTEM, "hwloc_topology_load('%s') failed: %s",
                           description, strerror(err));
    }
    return topology_finish(t, topo);
}

fsdp2_status_t fsdp2_topology_load_xml(const char *xml, size_t len, fsdp2_topology_t **topo)
{
    FSDP2_ARG_CHECK(xml && topo && len > 0 && len < INT32_MAX,
                    "xml (%zu bytes) and topo must not be NULL or empty", len);
    *topo = NULL;
    fsdp2_topology_t *t;
    FSDP2_CHECK(topology_new(&t));
    hwloc_topology_set_io_types_filter(t->hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_set_xmlbuffer(t->hw, xml, (int)len) != 0 || hwloc_topology_load(t->hw) != 0) {
        int err = errno;
        fsdp2_topology_destroy(t);
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "hwloc does not accept the XML topology "
                           "(%zu bytes, starting '%.*s'): %s", len, len < 40 ? (int)len : 40,
                           xml, strerror(err));
    }
    return topology_finish(t, topo);
}

fsdp2_status_t fsdp2_topology_destroy(fsdp2_topology_t *topo)
{
    if (!topo)
        return FSDP2_SUCCESS;
    hwloc_bitmap_free(topo->usable);
    hwloc_topology_destroy(topo->hw);
    free(topo);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_topology_count(const fsdp2_topology_t *topo, fsdp2_topology_kind_t kind,
                                    int *count)
{
    FSDP2_ARG_CHECK(topo && count, "topo and count must not be NULL");
    hwloc_topology_t hw = topo->hw;
    int n;
    switch (kind) {
    case FSDP2_TOPOLOGY_PACKAGE:
        n = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PACKAGE);
        break;
    case FSDP2_TOPOLOGY_NUMA_NODE:
        n = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
        break;
    case FSDP2_TOPOLOGY_CORE:
        n = hwloc_get_nbobjs_by_type(hw, core_type(hw));
        break;
    case FSDP2_TOPOLOGY_PU:
        n = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU);
        break;
    case FSDP2_TOPOLOGY_GPU:
        n = count_gpus(hw);
        break;
    default:
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "topology kind %d is not valid", (int)kind);
    }
    *count = n < 0 ? 0 : n;
    return FSDP2_SUCCESS;
}

/* The CPUs of local rank r of n under mode, into out: block distribution over the
 * objects (cores, or NUMA nodes with CPUs) that overlap the usable set. */
static fsdp2_status_t rank_cpuset(const fsdp2_topology_t *topo, int r, int n,
                                  fsdp2_bind_mode_t mode, hwloc_bitmap_t out)
{
    FSDP2_ARG_CHECK(n >= 1 && r >= 0 && r < n,
                    "local rank %d of local world size %d is not valid", r, n);
    hwloc_bitmap_copy(out, topo->usable);
    if (mode == FSDP2_BIND_NONE)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(mode == FSDP2_BIND_CORE || mode == FSDP2_BIND_NUMA,
                    "bind mode %d is not valid", (int)mode);
    hwloc_obj_type_t type = mode == FSDP2_BIND_CORE ? core_type(topo->hw) : HWLOC_OBJ_NUMANODE;

    int64_t candidates = 0;
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(topo->hw, type, NULL); o;
         o = hwloc_get_next_obj_by_type(topo->hw, type, o))
        candidates += o->cpuset && hwloc_bitmap_intersects(o->cpuset, topo->usable);
    if (candidates == 0)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED, "no %s overlaps the CPUs this process may use",
                           mode == FSDP2_BIND_CORE ? "core" : "NUMA node with CPUs");
    int64_t first = (int64_t)r * candidates / n, end = (int64_t)(r + 1) * candidates / n;
    if (end == first)
        end = first + 1;

    hwloc_bitmap_zero(out);
    int64_t index = 0;
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(topo->hw, type, NULL); o && index < end;
         o = hwloc_get_next_obj_by_type(topo->hw, type, o)) {
        if (!o->cpuset || !hwloc_bitmap_intersects(o->cpuset, topo->usable))
            continue;
        if (index >= first)
            hwloc_bitmap_or(out, out, o->cpuset);
        index++;
    }
    hwloc_bitmap_and(out, out, topo->usable);
    return FSDP2_SUCCESS;
}

/* The PUs of set, ascending, into cpus (at most max of them); returns how many it has. */
static int write_cpus(hwloc_const_cpuset_t set, int *cpus, int max)
{
    int n = 0;
    unsigned cpu;
    hwloc_bitmap_foreach_begin(cpu, set) {
        if (n < max)
            cpus[n] = (int)cpu;
        n++;
    }
    hwloc_bitmap_foreach_end();
    return n;
}

fsdp2_status_t fsdp2_topology_auto_bind(const fsdp2_topology_t *topo, int local_world_size,
                                        fsdp2_bind_mode_t *mode)
{
    FSDP2_ARG_CHECK(topo && mode, "topo and mode must not be NULL");
    FSDP2_ARG_CHECK(local_world_size >= 1, "local_world_size %d must be >= 1",
                    local_world_size);
    int usable = hwloc_bitmap_weight(topo->usable);
    *mode = usable > 0 && local_world_size > usable ? FSDP2_BIND_CORE : FSDP2_BIND_NONE;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_topology_shared_cache(const fsdp2_topology_t *topo, const int *cpus,
                                           int ncpus, size_t *cache_bytes, int *numa_nodes)
{
    FSDP2_ARG_CHECK(topo && cpus && cache_bytes && numa_nodes,
                    "topo, cpus, cache_bytes and numa_nodes must not be NULL");
    FSDP2_ARG_CHECK(ncpus >= 1, "ncpus %d: want at least one CPU", ncpus);
    hwloc_topology_t hw = topo->hw;
    hwloc_const_bitmap_t machine = hwloc_topology_get_topology_cpuset(hw);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "topology: no memory for a cpuset");
    for (int i = 0; i < ncpus; i++) {
        if (cpus[i] < 0 || !hwloc_bitmap_isset(machine, (unsigned)cpus[i])) {
            hwloc_bitmap_free(set);
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "topology: CPU %d (entry %d) is not one of this machine's",
                               cpus[i], i);
        }
        hwloc_bitmap_set(set, (unsigned)cpus[i]);
    }
    *cache_bytes = 0; /* the outermost data or unified cache over all of them */
    for (hwloc_obj_t o = hwloc_get_obj_covering_cpuset(hw, set); o; o = o->parent)
        if (hwloc_obj_type_is_dcache(o->type))
            *cache_bytes = (size_t)o->attr->cache.size;
    *numa_nodes = 0;
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(hw, HWLOC_OBJ_NUMANODE, NULL); n;
         n = hwloc_get_next_obj_by_type(hw, HWLOC_OBJ_NUMANODE, n))
        *numa_nodes += n->cpuset && hwloc_bitmap_intersects(n->cpuset, set);
    hwloc_bitmap_free(set);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_topology_cpuset_for_rank(const fsdp2_topology_t *topo, int local_rank,
                                              int local_world_size, fsdp2_bind_mode_t mode,
                                              int *cpus, int max_cpus, int *ncpus)
{
    FSDP2_ARG_CHECK(topo && ncpus, "topo and ncpus must not be NULL");
    FSDP2_ARG_CHECK(max_cpus >= 0 && (cpus || max_cpus == 0),
                    "cpus is NULL with max_cpus %d", max_cpus);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "topology: no memory for a cpuset");
    fsdp2_status_t status = rank_cpuset(topo, local_rank, local_world_size, mode, set);
    if (status == FSDP2_SUCCESS) {
        int n = *ncpus = write_cpus(set, cpus, max_cpus);
        if (n > max_cpus)
            status = fsdp2_error(FSDP2_ERR_OVERFLOW,
                                 "local rank %d gets %d CPUs but max_cpus is %d", local_rank, n,
                                 max_cpus);
    }
    hwloc_bitmap_free(set);
    return status;
}

fsdp2_status_t fsdp2_topology_bind_self(const fsdp2_topology_t *topo, int local_rank,
                                        int local_world_size, fsdp2_bind_mode_t mode)
{
    FSDP2_ARG_CHECK(topo, "topo must not be NULL");
    if (mode == FSDP2_BIND_NONE)
        return FSDP2_SUCCESS;
    if (!topo->is_this_system)
        return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                           "cannot bind to a topology that is not this machine's (synthetic "
                           "or from HWLOC_SYNTHETIC/HWLOC_XMLFILE)");
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "topology: no memory for a cpuset");
    fsdp2_status_t status = rank_cpuset(topo, local_rank, local_world_size, mode, set);
    char list[256];
    hwloc_bitmap_list_snprintf(list, sizeof(list), set);
    if (status == FSDP2_SUCCESS && hwloc_set_cpubind(topo->hw, set, HWLOC_CPUBIND_PROCESS) != 0)
        status = fsdp2_error(FSDP2_ERR_SYSTEM, "binding local rank %d to PUs %s failed: %s",
                             local_rank, list, strerror(errno));
    if (status == FSDP2_SUCCESS)
        FSDP2_LOG(INFO, MESH, "bound local rank %d of %d (%s) to PUs %s", local_rank,
                  local_world_size, fsdp2_bind_mode_name(mode), list);
    hwloc_bitmap_free(set);
    return status;
}

/* The formatter: appends as much as fits, counts what would have been written. */
typedef struct text {
    char *buf;
    size_t len, used;
} text_t;

__attribute__((format(printf, 2, 3))) static void text_add(text_t *t, const char *fmt, ...)
{
    char *at = t->used < t->len ? t->buf + t->used : NULL;
    size_t room = t->used < t->len ? t->len - t->used : 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(at, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->used += (size_t)n;
}

static const char *plural(int n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

/* The indices (logical, or OS with os_index) of the objects of type whose CPUs all lie
 * within `within`, as a list "0-3,8"; "none" when there are none. */
static void list_within(hwloc_topology_t hw, hwloc_obj_type_t type, hwloc_const_cpuset_t within,
                        int os_index, char *out, size_t len)
{
    hwloc_bitmap_t ids = hwloc_bitmap_alloc();
    if (!ids) {
        snprintf(out, len, "?");
        return;
    }
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(hw, type, NULL); o;
         o = hwloc_get_next_obj_by_type(hw, type, o)) {
        if (o->cpuset && !hwloc_bitmap_iszero(o->cpuset) &&
            hwloc_bitmap_isincluded(o->cpuset, within))
            hwloc_bitmap_set(ids, os_index ? o->os_index : o->logical_index);
    }
    if (hwloc_bitmap_iszero(ids))
        snprintf(out, len, "none");
    else
        hwloc_bitmap_list_snprintf(out, len, ids);
    hwloc_bitmap_free(ids);
}

static double mib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

/* A PCI device's place in bus order. */
static uint64_t bus_key(hwloc_obj_t pci)
{
    const struct hwloc_pcidev_attr_s *a = &pci->attr->pcidev;
    return (uint64_t)a->domain << 24 | (uint64_t)a->bus << 16 | (uint64_t)a->dev << 8 | a->func;
}

/* A GPU's index: how many GPUs come before it in bus order (hwloc lists PCI devices in
 * tree order, by locality first). */
static int gpu_index(hwloc_topology_t hw, hwloc_obj_t gpu)
{
    int before = 0;
    for (hwloc_obj_t pci = hwloc_get_next_pcidev(hw, NULL); pci;
         pci = hwloc_get_next_pcidev(hw, pci))
        before += is_gpu(pci) && bus_key(pci) < bus_key(gpu);
    return before;
}

/* GPU index's PCI object, or NULL. */
static hwloc_obj_t gpu_at(hwloc_topology_t hw, int index)
{
    for (hwloc_obj_t pci = hwloc_get_next_pcidev(hw, NULL); pci;
         pci = hwloc_get_next_pcidev(hw, pci))
        if (is_gpu(pci) && gpu_index(hw, pci) == index)
            return pci;
    return NULL;
}

/* The CPUs near a PCI device: those of its closest non-I/O ancestor, or NULL when that
 * is the whole machine because hwloc does not know better. */
static hwloc_const_cpuset_t gpu_cpuset(hwloc_topology_t hw, hwloc_obj_t pci)
{
    hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(hw, pci);
    if (!local || !local->cpuset || hwloc_bitmap_iszero(local->cpuset))
        return NULL;
    return local->cpuset;
}

static fsdp2_status_t find_gpu(const fsdp2_topology_t *topo, int index, hwloc_obj_t *pci)
{
    *pci = NULL;
    FSDP2_ARG_CHECK(topo, "topo must not be NULL");
    *pci = index >= 0 ? gpu_at(topo->hw, index) : NULL;
    if (!*pci)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "GPU %d: the machine has %d GPU(s)", index,
                           count_gpus(topo->hw));
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_topology_gpu(const fsdp2_topology_t *topo, int index,
                                  fsdp2_topology_gpu_t *gpu)
{
    FSDP2_ARG_CHECK(gpu, "gpu must not be NULL");
    memset(gpu, 0, sizeof(*gpu));
    gpu->numa_node = -1;
    hwloc_obj_t pci;
    FSDP2_CHECK(find_gpu(topo, index, &pci));
    hwloc_topology_t hw = topo->hw;
    const struct hwloc_pcidev_attr_s *a = &pci->attr->pcidev;
    snprintf(gpu->pci_bus_id, sizeof(gpu->pci_bus_id), "%04x:%02x:%02x.%x",
             (unsigned)a->domain & 0xffffu, a->bus, a->dev, a->func);
    gpu->vendor_id = a->vendor_id;
    gpu->device_id = a->device_id;
    gpu->numa_node = -1;
    hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(hw, pci);
    if (local && local->nodeset && hwloc_bitmap_weight(local->nodeset) == 1)
        gpu->numa_node = hwloc_bitmap_first(local->nodeset);
    hwloc_const_cpuset_t near = gpu_cpuset(hw, pci);
    gpu->ncpus = near ? hwloc_bitmap_weight(near) : 0;
    for (hwloc_obj_t os = pci->io_first_child; os; os = os->next_sibling)
        if (os->type == HWLOC_OBJ_OS_DEVICE && os->name && !gpu->name[0])
            snprintf(gpu->name, sizeof(gpu->name), "%s", os->name);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_topology_gpu_cpus(const fsdp2_topology_t *topo, int index, int *cpus,
                                       int max_cpus, int *ncpus)
{
    FSDP2_ARG_CHECK(ncpus && (cpus || max_cpus == 0) && max_cpus >= 0,
                    "ncpus must not be NULL, nor cpus with max_cpus %d", max_cpus);
    *ncpus = 0;
    hwloc_obj_t pci;
    FSDP2_CHECK(find_gpu(topo, index, &pci));
    hwloc_const_cpuset_t near = gpu_cpuset(topo->hw, pci);
    int n = *ncpus = near ? write_cpus(near, cpus, max_cpus) : 0;
    if (n > max_cpus)
        return fsdp2_error(FSDP2_ERR_OVERFLOW, "GPU %d has %d CPUs near it but max_cpus is %d",
                           index, n, max_cpus);
    return FSDP2_SUCCESS;
}

/* Parses up to `digits` hex digits (at least one) ending at `stop`; advances *p past it. */
static int hex_field(const char **p, int digits, char stop, unsigned *out)
{
    unsigned v = 0;
    int n = 0;
    const char *s = *p;
    for (; n < digits && isxdigit((unsigned char)s[n]); n++)
        v = v * 16 + (unsigned)(isdigit((unsigned char)s[n]) ? s[n] - '0'
                                                              : tolower((unsigned char)s[n]) - 'a' + 10);
    if (n == 0 || s[n] != stop)
        return 0;
    *out = v;
    *p = s + n + (stop != '\0');
    return 1;
}

fsdp2_status_t fsdp2_topology_find_gpu(const fsdp2_topology_t *topo, const char *pci_bus_id,
                                       int *index)
{
    FSDP2_ARG_CHECK(topo && pci_bus_id && index, "topo, pci_bus_id and index must not be NULL");
    *index = -1;
    /* domain (up to 8 digits: NVML writes 8, CUDA 4), bus, device, function */
    unsigned domain, bus, dev, func;
    const char *p = pci_bus_id;
    if (!hex_field(&p, 8, ':', &domain) || !hex_field(&p, 2, ':', &bus) ||
        !hex_field(&p, 2, '.', &dev) || !hex_field(&p, 1, '\0', &func))
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "'%s' is not a PCI bus id like 0000:3b:00.0", pci_bus_id);
    for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo->hw, NULL); pci;
         pci = hwloc_get_next_pcidev(topo->hw, pci)) {
        const struct hwloc_pcidev_attr_s *a = &pci->attr->pcidev;
        if (is_gpu(pci) && a->domain == domain && a->bus == bus && a->dev == dev &&
            a->func == func) {
            *index = gpu_index(topo->hw, pci);
            return FSDP2_SUCCESS;
        }
    }
    return fsdp2_error(FSDP2_ERR_NOT_FOUND, "no GPU at PCI bus id %s among the machine's %d",
                       pci_bus_id, count_gpus(topo->hw));
}

fsdp2_status_t fsdp2_topology_gpu_of_device(const fsdp2_topology_t *topo, int cuda_device,
                                            int *index)
{
    FSDP2_ARG_CHECK(topo && index, "topo and index must not be NULL");
    const fsdp2_device_ops_t *ops;
    fsdp2_device_t device = {FSDP2_DEVICE_CUDA, cuda_device};
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    if (!ops->pci_bus_id)
        return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE, "cuda:%d has no PCI bus id", cuda_device);
    char id[32];
    FSDP2_CHECK(ops->pci_bus_id(cuda_device, id, sizeof(id)));
    return fsdp2_topology_find_gpu(topo, id, index);
}

static void format_gpus(hwloc_topology_t hw, text_t *t)
{
    if (count_gpus(hw) == 0) {
        text_add(t, "GPUs: none\n");
        return;
    }
    int count = count_gpus(hw);
    for (int index = 0; index < count; index++) {
        hwloc_obj_t pci = gpu_at(hw, index);
        if (!pci)
            continue; /* two GPUs at one bus id: not a real machine */
        const struct hwloc_pcidev_attr_s *a = &pci->attr->pcidev;
        const char *vendor = hwloc_obj_get_info_by_name(pci, "PCIVendor");
        const char *device = hwloc_obj_get_info_by_name(pci, "PCIDevice");
        text_add(t, "GPU %d: %04x:%02x:%02x.%x [%04x:%04x]", index, a->domain, a->bus,
                 a->dev, a->func, a->vendor_id, a->device_id);
        if (vendor || device)
            text_add(t, " %s%s%s", vendor ? vendor : "", vendor && device ? " " : "",
                     device ? device : "");
        /* The names the drivers gave it (cuda0, nvml0, card1, rsmi0), when hwloc's
         * plugins or sysfs know them. */
        for (hwloc_obj_t os = pci->io_first_child; os; os = os->next_sibling)
            if (os->type == HWLOC_OBJ_OS_DEVICE && os->name)
                text_add(t, " %s", os->name);
        hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(hw, pci);
        char nodes[64] = "unknown", cores[128] = "unknown";
        if (local && local->nodeset && !hwloc_bitmap_iszero(local->nodeset)) {
            hwloc_bitmap_list_snprintf(nodes, sizeof(nodes), local->nodeset);
            list_within(hw, core_type(hw), local->cpuset, 0, cores, sizeof(cores));
        }
        text_add(t, ", NUMA node %s, near cores %s\n", nodes, cores);
    }
}

fsdp2_status_t fsdp2_topology_format(const fsdp2_topology_t *topo, char *buf, size_t len,
                                     size_t *needed)
{
    FSDP2_ARG_CHECK(topo && (buf || len == 0), "topo must not be NULL, nor buf with len %zu",
                    len);
    hwloc_topology_t hw = topo->hw;
    hwloc_obj_type_t ctype = core_type(hw);
    text_t t = {buf, len, 0};
    if (len > 0)
        buf[0] = '\0';
    int packages = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PACKAGE);
    int nodes = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
    int cores = hwloc_get_nbobjs_by_type(hw, ctype);
    int pus = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU);
    hwloc_obj_t root = hwloc_get_root_obj(hw);
    char list[256], list2[256];

    text_add(&t, "machine: %d %s, %d NUMA %s, %d %s, %d %s (hardware threads), %.0f MiB\n",
             packages, plural(packages, "package", "packages"), nodes,
             plural(nodes, "node", "nodes"), cores, plural(cores, "core", "cores"), pus,
             plural(pus, "PU", "PUs"), mib(root->total_memory));
    if (!hwloc_bitmap_isequal(topo->usable, hwloc_topology_get_topology_cpuset(hw))) {
        hwloc_bitmap_list_snprintf(list, sizeof(list), topo->usable);
        text_add(&t, "this process may use PUs %s\n", list);
    }
    for (hwloc_obj_t p = hwloc_get_next_obj_by_type(hw, HWLOC_OBJ_PACKAGE, NULL); p;
         p = hwloc_get_next_obj_by_type(hw, HWLOC_OBJ_PACKAGE, p)) {
        list_within(hw, HWLOC_OBJ_NUMANODE, p->cpuset, 1, list, sizeof(list));
        list_within(hw, ctype, p->cpuset, 0, list2, sizeof(list2));
        text_add(&t, "package %u: NUMA nodes %s, cores %s\n", p->logical_index, list, list2);
    }
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(hw, HWLOC_OBJ_NUMANODE, NULL); n;
         n = hwloc_get_next_obj_by_type(hw, HWLOC_OBJ_NUMANODE, n)) {
        text_add(&t, "NUMA node %u: %.0f MiB", n->os_index, mib(n->attr->numanode.local_memory));
        if (n->cpuset && !hwloc_bitmap_iszero(n->cpuset)) {
            list_within(hw, ctype, n->cpuset, 0, list, sizeof(list));
            hwloc_bitmap_list_snprintf(list2, sizeof(list2), n->cpuset);
            text_add(&t, ", cores %s, PUs %s\n", list, list2);
        } else {
            text_add(&t, ", no CPUs (memory only)\n");
        }
    }
    /* One entry per core, "core:PUs"; 16 to a line so that big machines stay readable. */
    text_add(&t, "cores (index:PUs):");
    int column = 0;
    for (hwloc_obj_t c = hwloc_get_next_obj_by_type(hw, ctype, NULL); c;
         c = hwloc_get_next_obj_by_type(hw, ctype, c)) {
        if (column == 16) {
            text_add(&t, "\n ");
            column = 0;
        }
        hwloc_bitmap_list_snprintf(list, sizeof(list), c->cpuset);
        text_add(&t, " %u:%s", c->logical_index, list);
        column++;
    }
    text_add(&t, "\n");
    format_gpus(hw, &t);
    if (needed)
        *needed = t.used;
    return FSDP2_SUCCESS;
}

#else /* !FSDP2_HAVE_HWLOC */

static fsdp2_status_t no_hwloc(const char *function)
{
    return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE,
                       "%s: libfsdp2 was built without hwloc (install libhwloc-dev and "
                       "reconfigure)", function);
}

fsdp2_status_t fsdp2_topology_load(fsdp2_topology_t **topo)
{
    if (topo)
        *topo = NULL;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_load_synthetic(const char *description, fsdp2_topology_t **topo)
{
    (void)description;
    if (topo)
        *topo = NULL;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_load_xml(const char *xml, size_t len, fsdp2_topology_t **topo)
{
    (void)xml, (void)len;
    if (topo)
        *topo = NULL;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_destroy(fsdp2_topology_t *topo)
{
    return topo ? no_hwloc(__func__) : FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_topology_gpu(const fsdp2_topology_t *topo, int index,
                                  fsdp2_topology_gpu_t *gpu)
{
    (void)topo, (void)index, (void)gpu;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_gpu_cpus(const fsdp2_topology_t *topo, int index, int *cpus,
                                       int max_cpus, int *ncpus)
{
    (void)topo, (void)index, (void)cpus, (void)max_cpus, (void)ncpus;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_find_gpu(const fsdp2_topology_t *topo, const char *pci_bus_id,
                                       int *index)
{
    (void)topo, (void)pci_bus_id, (void)index;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_gpu_of_device(const fsdp2_topology_t *topo, int cuda_device,
                                            int *index)
{
    (void)topo, (void)cuda_device, (void)index;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_count(const fsdp2_topology_t *topo, fsdp2_topology_kind_t kind,
                                    int *count)
{
    (void)topo, (void)kind, (void)count;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_auto_bind(const fsdp2_topology_t *topo, int local_world_size,
                                        fsdp2_bind_mode_t *mode)
{
    (void)topo, (void)local_world_size, (void)mode;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_shared_cache(const fsdp2_topology_t *topo, const int *cpus,
                                           int ncpus, size_t *cache_bytes, int *numa_nodes)
{
    (void)topo, (void)cpus, (void)ncpus, (void)cache_bytes, (void)numa_nodes;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_cpuset_for_rank(const fsdp2_topology_t *topo, int local_rank,
                                              int local_world_size, fsdp2_bind_mode_t mode,
                                              int *cpus, int max_cpus, int *ncpus)
{
    (void)topo, (void)local_rank, (void)local_world_size, (void)mode, (void)cpus,
        (void)max_cpus, (void)ncpus;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_bind_self(const fsdp2_topology_t *topo, int local_rank,
                                        int local_world_size, fsdp2_bind_mode_t mode)
{
    (void)topo, (void)local_rank, (void)local_world_size, (void)mode;
    return no_hwloc(__func__);
}

fsdp2_status_t fsdp2_topology_format(const fsdp2_topology_t *topo, char *buf, size_t len,
                                     size_t *needed)
{
    (void)topo;
    if (buf && len > 0)
        buf[0] = '\0';
    if (needed)
        *needed = 0;
    return no_hwloc(__func__);
}

#endif
