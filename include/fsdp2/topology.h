/* The machine's topology (through hwloc): packages, NUMA nodes, cores, hardware threads
 * (PUs) and GPUs, and where each local rank should be bound.
 *
 * Indices: cores and packages are hwloc logical indices (0..n-1 in topology order);
 * NUMA nodes and PUs are OS indices, the numbers numactl, taskset and
 * sched_setaffinity use.
 *
 * Binding distributes over the CPUs the calling process may use (its current affinity,
 * within what the cgroup allows), in blocks: with C cores and N local ranks, local rank
 * r gets cores [floor(r*C/N), floor((r+1)*C/N)), at least one, with all their PUs. So
 * when N <= C every rank owns a run of neighbouring cores (shared caches, one package
 * where possible) and every core is used, as `mpirun --map-by slot:PE=C/N --bind-to core`
 * would; when N > C consecutive ranks share a core (ranks 0,1 on core 0 for 4 ranks on
 * 2 cores). NUMA mode does the same over the NUMA nodes that have CPUs, binding to all
 * CPUs of the chosen node(s); memory then follows Linux's first-touch local policy.
 *
 * Built without hwloc, loading, querying and binding return FSDP2_ERR_NOT_AVAILABLE with
 * a message (bind_self too, even with FSDP2_BIND_NONE); destroy(NULL) and the bind-mode
 * name/parse helpers still work. */
#ifndef FSDP2_TOPOLOGY_H
#define FSDP2_TOPOLOGY_H

#include <stddef.h>

#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

typedef struct fsdp2_topology fsdp2_topology_t;

typedef enum fsdp2_topology_kind {
    FSDP2_TOPOLOGY_PACKAGE = 0,
    FSDP2_TOPOLOGY_NUMA_NODE = 1,
    FSDP2_TOPOLOGY_CORE = 2,
    FSDP2_TOPOLOGY_PU = 3, /* hardware threads */
    FSDP2_TOPOLOGY_GPU = 4, /* NVIDIA/AMD display or 3D controllers on PCI */
} fsdp2_topology_kind_t;

typedef enum fsdp2_bind_mode {
    FSDP2_BIND_NONE = 0, /* no restriction: every CPU the process may use */
    FSDP2_BIND_CORE = 1, /* a block of cores per local rank */
    FSDP2_BIND_NUMA = 2, /* a block of NUMA nodes (with CPUs) per local rank */
} fsdp2_bind_mode_t;

/* Discovers this machine, with PCI devices (for GPU locality). Blocks for a few
 * milliseconds (reads /sys). The caller owns *topo; fsdp2_topology_destroy frees it. */
FSDP2_API fsdp2_status_t fsdp2_topology_load(fsdp2_topology_t **topo);

/* A made-up machine from an hwloc synthetic description, e.g.
 * "pack:2 numa:2 core:8 pu:2", for planning and tests. It cannot bind (bind_self
 * returns FSDP2_ERR_UNSUPPORTED); all its CPUs count as usable. */
FSDP2_API fsdp2_status_t fsdp2_topology_load_synthetic(const char *description,
                                                       fsdp2_topology_t **topo);

/* A machine from hwloc XML (what `lstopo --of xml` writes; len bytes, a NUL not needed),
 * e.g. a GPU node's, for planning and tests. Like a synthetic one it cannot bind. */
FSDP2_API fsdp2_status_t fsdp2_topology_load_xml(const char *xml, size_t len,
                                                 fsdp2_topology_t **topo);

/* NULL ignored. */
FSDP2_API fsdp2_status_t fsdp2_topology_destroy(fsdp2_topology_t *topo);

/* How many objects of a kind the machine has (the whole machine as visible to this
 * process, not only its current affinity). */
FSDP2_API fsdp2_status_t fsdp2_topology_count(const fsdp2_topology_t *topo,
                                              fsdp2_topology_kind_t kind, int *count);

/* The CPUs (PU OS indices, ascending) that local rank local_rank of local_world_size
 * should be bound to under mode, by the block distribution above; FSDP2_BIND_NONE gives
 * every usable CPU. Writes up to max_cpus entries into cpus and the full number into
 * *ncpus; FSDP2_ERR_OVERFLOW when max_cpus is too small (count(PU) is always enough).
 * Does not bind anything. */
FSDP2_API fsdp2_status_t fsdp2_topology_cpuset_for_rank(const fsdp2_topology_t *topo,
                                                        int local_rank, int local_world_size,
                                                        fsdp2_bind_mode_t mode, int *cpus,
                                                        int max_cpus, int *ncpus);

/* What fsdp2run --bind auto binds local_world_size ranks to: FSDP2_BIND_CORE when they
 * outnumber the usable PUs (this process's affinity within the machine; every PU of a
 * synthetic one), so that the ranks sharing a PU are the same ones throughout instead of
 * whichever the scheduler puts together; FSDP2_BIND_NONE otherwise. Reads topo only:
 * not collective, does not block. */
FSDP2_API fsdp2_status_t fsdp2_topology_auto_bind(const fsdp2_topology_t *topo,
                                                  int local_world_size, fsdp2_bind_mode_t *mode);

/* Of the CPUs cpus[0..ncpus) (PU OS indices), the largest data or unified cache that
 * all of them share (the last level among them): its size in *cache_bytes, 0 when no
 * cache does (CPUs on different sockets or chiplets); and in *numa_nodes the NUMA nodes
 * that have any of those CPUs.
 * FSDP2_ERR_INVALID_ARGUMENT for an empty list or a CPU the machine does not have. */
FSDP2_API fsdp2_status_t fsdp2_topology_shared_cache(const fsdp2_topology_t *topo,
                                                     const int *cpus, int ncpus,
                                                     size_t *cache_bytes, int *numa_nodes);

/* Binds the whole calling process (all its threads; children inherit it) to the CPUs
 * cpuset_for_rank gives. FSDP2_BIND_NONE is a no-op. Call it before starting threads
 * whose placement should follow. */
FSDP2_API fsdp2_status_t fsdp2_topology_bind_self(const fsdp2_topology_t *topo,
                                                  int local_rank, int local_world_size,
                                                  fsdp2_bind_mode_t mode);

/* A GPU's place in the machine. GPUs are numbered 0..count(GPU)-1 in PCI bus order,
 * which is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID (its default order may differ:
 * match by bus id, fsdp2_topology_find_gpu or fsdp2_topology_gpu_of_device). */
typedef struct fsdp2_topology_gpu {
    char pci_bus_id[16];   /* "0000:3b:00.0": domain, bus, device, function (hex) */
    unsigned vendor_id;    /* 0x10de NVIDIA, 0x1002 AMD */
    unsigned device_id;
    int numa_node;         /* OS index of the NUMA node it is attached to; -1: unknown or
                            * several (then cpus below spans them) */
    int ncpus;             /* CPUs (PUs) near it: fsdp2_topology_gpu_cpus; 0: unknown */
    char name[32];         /* the driver's name for it (cuda0, nvml0, card1), or "" */
} fsdp2_topology_gpu_t;

/* GPU `index`: FSDP2_ERR_INVALID_ARGUMENT naming it when there is no such GPU. */
FSDP2_API fsdp2_status_t fsdp2_topology_gpu(const fsdp2_topology_t *topo, int index,
                                            fsdp2_topology_gpu_t *gpu);

/* The CPUs near GPU `index` (PU OS indices, ascending; all of them, whether or not this
 * process may use them), written as cpuset_for_rank writes its CPUs: up to max_cpus
 * into cpus, the full number into *ncpus, FSDP2_ERR_OVERFLOW when max_cpus is too
 * small. None when its locality is unknown. */
FSDP2_API fsdp2_status_t fsdp2_topology_gpu_cpus(const fsdp2_topology_t *topo, int index,
                                                 int *cpus, int max_cpus, int *ncpus);

/* The GPU with this PCI bus id, in the forms CUDA and NVML print ("0000:3B:00.0",
 * "00000000:3b:00.0", case-insensitive); FSDP2_ERR_NOT_FOUND naming it when none has. */
FSDP2_API fsdp2_status_t fsdp2_topology_find_gpu(const fsdp2_topology_t *topo,
                                                 const char *pci_bus_id, int *index);

/* The GPU a CUDA device is (asks the CUDA runtime for its PCI bus id):
 * FSDP2_ERR_NOT_AVAILABLE without CUDA or without that device. */
FSDP2_API fsdp2_status_t fsdp2_topology_gpu_of_device(const fsdp2_topology_t *topo,
                                                      int cuda_device, int *index);

/* A short human-readable summary into buf (always NUL-terminated when len > 0,
 * truncated safely); *needed gets the full length without the NUL (may be NULL).
 * Lines: the machine and its counts, each package, each NUMA node with its memory and
 * cores, the cores with their PUs, and the GPUs with PCI bus id and NUMA node (or
 * "GPUs: none"). */
FSDP2_API fsdp2_status_t fsdp2_topology_format(const fsdp2_topology_t *topo, char *buf,
                                               size_t len, size_t *needed);

/* "none", "core", "numa"; "unknown" otherwise. Never NULL. */
FSDP2_API const char *fsdp2_bind_mode_name(fsdp2_bind_mode_t mode);

/* Parses "none", "core" or "numa" (FSDP2_ERR_INVALID_ARGUMENT naming the text). */
FSDP2_API fsdp2_status_t fsdp2_bind_mode_parse(const char *text, fsdp2_bind_mode_t *mode);

FSDP2_EXTERN_C_END

#endif
