/* The shared-memory transport's segment layout and per-group state, shared by the
 * protocol (lib/collectives/shm.c, shm_reduce.c; one collective's state: shm_run.h) and
 * the segment's set-up (shm_segment.c).
 *
 * Segment: a page of header (shm_header_t), then one cache line per rank (rank_line_t),
 * then per reader a row of `row` done counters (one per writer), then two lines per rank
 * of single-copy announcements (direct_desc_t), padded to a page, then each rank's ring
 * of params.slots slots of params.slot bytes (shm_params_t). */
#ifndef FSDP2_COLLECTIVES_SHM_INTERNAL_H
#define FSDP2_COLLECTIVES_SHM_INTERNAL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "collectives/shm.h"

#define SHM_STORE_CLASSES 8   /* size classes (x4 each from stream_min) for stores */
/* Rows of a group's store choices: one per kind that moves bytes (a barrier moves none),
 * and one each for in-place reduce-scatters and all-gathers, whose outputs are written
 * differently. */
#define SHM_ROW_IN_PLACE_RS COLL_BARRIER
#define SHM_ROW_IN_PLACE_AG (SHM_ROW_IN_PLACE_RS + 1)
#define SHM_STORE_ROWS (SHM_ROW_IN_PLACE_AG + 1)
#define SHM_MAGIC 0x66736470326d6873ull
#define SHM_LINE 64
#define SHM_PAGE 4096

typedef _Atomic uint64_t shm_counter_t;

/* The protocol's sizes. Every member must take the same steps, so each comes from the
 * environment of every rank and the members check at group creation that they agree
 * (fsdp2_shm_create); their defaults, ranges and reasons are in the env table. */
typedef struct shm_params {
    size_t slot;              /* FSDP2_SHM_SLOT_BYTES: bytes per step and rank */
    size_t slots;             /* FSDP2_SHM_SLOTS: steps a writer may lead its slowest reader */
    size_t one_step_max;      /* FSDP2_SHM_ONE_STEP_MAX: all-reduces that take one step */
    size_t one_step_pair_min; /* FSDP2_SHM_ONE_STEP_PAIR_MIN: and at 2 ranks, up to a slot */
    size_t fused_min;         /* FSDP2_SHM_FUSED_MIN: all-reduces from here: all_reduce_fused */
} shm_params_t;

/* A rank's announcement for a single-copy collective (shm_direct.c), one line per rank
 * after the done rows: its arena (fsdp2_cpu_arena_id_t), where its buffers lie in it,
 * and after mapping its peers' arenas, whether it can go on. */
typedef struct direct_desc {
    int32_t pid, fd;
    uint64_t arena_bytes, nonce;
    uint64_t send_off, recv_off;
    uint32_t has;     /* DIRECT_SEND | DIRECT_RECV: the buffers that lie in the arena */
    uint32_t pad0;
    uint64_t verdict; /* 1 + the step of the verdict when this rank mapped what it needs */
} direct_desc_t;
_Static_assert(sizeof(direct_desc_t) <= SHM_LINE, "an announcement fits a cache line");

/* A peer's arena as this rank mapped it (or failed to: not tried again for that arena),
 * and the arena rank r (this one too) announced when the group last agreed that every
 * rank had mapped every peer's (agreed: set by every rank after the same verdict step). */
typedef struct direct_peer {
    int32_t pid, fd;
    uint64_t bytes, nonce;
    char *map;
    int failed;
    int agreed;
    int32_t agreed_pid, agreed_fd;
    uint64_t agreed_bytes, agreed_nonce;
} direct_peer_t;

/* Auto slot stores, one kind and size class: the way in use, whether the next run tries
 * the other way whole (a part try found it no longer far costlier), the runs seen, the
 * run that last tried the other way and the runs to wait before the next try while that
 * way stays costlier (0: the usual wait), the steps this rank posted in the last run,
 * and each way's recent cost (ns per byte of the collective; 0: not measured) and
 * counted runs. */
typedef struct shm_store_class {
    int streaming;
    int try_whole;
    uint64_t runs;
    uint64_t last_try;
    uint32_t wait;
    uint32_t last_run_steps;
    double ns_per_byte[2];
    uint32_t counted[2];
} shm_store_class_t;

/* FSDP2_SHM_STREAM_STORES and _OUTPUT, in the order of their accepted values. */
/* FSDP2_SHM_STREAM_STORES's values, in its order; the group resolves AUTO at creation
 * (fsdp2_shm_stores_resolve), FSDP2_SHM_STREAM_OUTPUT's AUTO stays. */
typedef enum shm_stores {
    SHM_STORES_AUTO,
    SHM_STORES_STREAM,
    SHM_STORES_PLAIN,
    SHM_STORES_TOPOLOGY, /* fsdp2_shm_stores_rule, from the shared cache */
    SHM_STORES_LEARN,    /* timed tries per size class */
} shm_stores_t;

typedef struct shm_header {
    uint64_t magic;
    int64_t size;
    _Alignas(SHM_LINE) atomic_int broken; /* 1 + the rank whose collective failed first */
    atomic_int reason_ready; /* reason is written (by the rank that set broken) */
    char reason[512];        /* why that rank failed, for its peers' messages */
} shm_header_t;

/* A rank's line: what it publishes, and where those waiting for it sleep. */
typedef struct rank_line {
    shm_counter_t head;       /* steps this rank has posted */
    shm_counter_t last_stamp; /* 1 + the sequence number it stamped last (0: none) */
    atomic_uint bell;         /* futex word, bumped when this rank advances a counter */
    atomic_int sleepers;      /* threads asleep on bell */
    atomic_int cpu;           /* 1 + the cpu this rank last waited on (0: not yet) */
    char pad[SHM_LINE - 28];
} rank_line_t;

/* What a rank's collective is, written before its first step (shm.c): a peer compares it
 * with its own when it first waits for that rank in the collective, so two different
 * calls under one sequence number fail on both sides instead of pairing up. A ring per
 * rank, indexed by sequence number: a rank runs only a few collectives ahead of its
 * slowest peer (its slots bound it), far fewer than SHM_STAMPS. */
#define SHM_STAMPS 64
typedef struct shm_stamp {
    shm_counter_t seq1; /* 1 + the sequence number (0: never written) */
    coll_stamp_t call;
} shm_stamp_t;
_Static_assert(sizeof(shm_header_t) <= SHM_PAGE, "the header fits its page");
_Static_assert(sizeof(rank_line_t) == SHM_LINE, "a rank's line is one cache line");

struct shm_group {
    fsdp2_group_t *g;
    shm_header_t *hdr;
    size_t map_bytes;
    rank_line_t *lines; /* [size] */
    /* reader p's row at done[p * row]: steps of each writer it is done with */
    shm_counter_t *done;
    size_t row;      /* counters per done row */
    /* Single-copy announcements: two sets of [size], taken in turn by the collectives
     * that announce (direct_runs of them so far, the same on every rank). A rank runs at
     * most one such collective ahead of the slowest (each begins with a step that waits
     * for all), so it never writes the set a peer may still be reading. */
    direct_desc_t *descs;
    uint64_t direct_runs;
    direct_peer_t *peers; /* [size], the peers' arenas mapped here (shm_direct.c) */
    int direct_policy;    /* every member allows single-copy collectives (and an arena) */
    uint64_t direct_ran, direct_declined; /* collectives that ran single-copy, or announced
                                           * and then went through the slots */
    uint64_t direct_verdicts; /* of those, the ones that took a verdict step */
    shm_stamp_t *stamps; /* rank r's at stamps + r * SHM_STAMPS */
    char *ring;      /* rank r's slots at ring + r * params.slots * params.slot */
    shm_params_t params;
    shm_peer_gone_fn gone;
    void *gone_arg;
    pthread_mutex_t lock;
    pthread_cond_t turn_changed;
    uint64_t turn;  /* collectives finished here: sequence number `turn` runs next */
    uint64_t steps; /* steps run so far, the same count on every member */
    /* Waiting when the group has a CPU per rank (shm_placement.c): busy polling at first
     * (a yield that lets a peer's thread in keeps both on one core, where the scheduler
     * leaves such cache-hot threads and small collectives run several times slower), and
     * a yield that ran another thread sends the wait to sleep, so that the wake-up can
     * place it on an idle core. With more ranks than CPUs, yield at once and never
     * count. */
    int64_t spin_ns;
    int contended_max;
    /* The waits' other settings (per rank, from the env table): yields before a wait
     * sleeps on the futex (FSDP2_SHM_WAIT_YIELDS), a yield that took this long ran
     * another thread on this core (FSDP2_SHM_CONTENDED_NS), one futex sleep (every wake
     * re-checks; FSDP2_SHM_SLEEP_MS), and how often a waiter asks whether its peer's
     * process still exists (FSDP2_SHM_LIVENESS_MS). */
    int wait_yields;
    int64_t contended_ns;
    int sleep_ms;
    int64_t liveness_ms;
    /* How much this rank copies or sums at a time (per rank, from the env table): a
     * single-copy all-reduce's sums before it copies them out (FSDP2_SHM_DIRECT_BLOCK), a
     * single-copy gather's reads before it writes them out (FSDP2_SHM_DIRECT_COPY), and
     * the fused all-reduce's paired copies (FSDP2_SHM_PAIR_CHUNK); and the smallest
     * collective whose slots may be streamed (FSDP2_SHM_STREAM_MIN). */
    size_t direct_block, direct_copy, pair_chunk, stream_min;
    int core_per_rank; /* no more ranks than CPUs they may use (all_reduce_fused) */
    int nudge; /* move_off_peer_core may act */
    /* How this rank writes its slots and outputs (shm_stores.c): FSDP2_SHM_STREAM_STORES
     * (resolved: never AUTO) and _OUTPUT, and for learned slot stores, per kind and class
     * of collective size, the way in use and each way's recent cost. Touched only by the collective that runs
     * (one at a time, wait_turn). */
    shm_stores_t stores_policy;
    shm_stores_t output_policy;
    size_t out_stream_min; /* FSDP2_SHM_STREAM_OUTPUT_MIN */
    size_t shared_cache;   /* smallest cache the ranks' CPUs share (0: none), for TOPOLOGY */
    shm_store_class_t stores[SHM_STORE_ROWS][SHM_STORE_CLASSES];
};

/* Whether an all-reduce of `bytes` over n ranks takes one step (every rank posts its
 * whole buffer and reduces all of them): up to one_step_max, and at 2 ranks from
 * one_step_pair_min up to a slot, where one step beats two; at more ranks each rank
 * would read every peer's whole buffer. */
static inline int shm_all_reduce_one_step(const shm_params_t *p, int n, size_t bytes)
{
    return bytes <= p->one_step_max ||
           (n == 2 && bytes >= p->one_step_pair_min && bytes <= p->slot);
}

/* Unmaps the peers' arenas (shm_direct.c). */
void fsdp2_shm_direct_release(shm_group_t *sg);

/* ---- shm_placement.c: where the ranks may run ---- */

/* The CPUs all of a group's ranks may use, and what follows for waiting: a rank that
 * has a CPU of its own may poll, one that shares a CPU with another rank must yield at
 * once (the peer it waits for may need that CPU). */
typedef struct shm_placement {
    int ranks;
    int cpus;           /* in the union of the ranks' sets */
    int disjoint;       /* no CPU in two ranks' sets: bound apart */
    int oversubscribed; /* more ranks than cpus, or than the CPUs of a set holding the
                         * sets of that many ranks */
    cpu_set_t all;      /* the union */
} shm_placement_t;

/* Room for a list of any set of CPU_SETSIZE CPUs (the longest, 2 on and 1 off:
 * "0-1,3-4,...", 2.7 KB). */
#define SHM_CPUS_TEXT_MAX 4096
/* A member's published sizes and CPUs (fsdp2_shm_exchange_members). */
#define SHM_MEMBER_TEXT_MAX (SHM_CPUS_TEXT_MAX + 128)

/* set as a list of CPUs and ranges, "0-3,8" (the kernel's cpulist format); -1 when it
 * does not fit in cap bytes. */
int fsdp2_cpus_format(const cpu_set_t *set, char *buf, size_t cap);
/* The reverse; -1 for text that is not such a list or names a CPU past CPU_SETSIZE. */
int fsdp2_cpus_parse(const char *text, cpu_set_t *set);
/* The placement of n ranks whose CPU sets are sets[0..n). */
void fsdp2_shm_placement(const cpu_set_t *sets, int n, shm_placement_t *out);
/* This rank's protocol sizes, from its environment. */
void fsdp2_shm_params(shm_params_t *out);
/* FSDP2_ERR_INVALID_CONFIG, naming the variable and its value, for sizes that cannot
 * work for n ranks. */
fsdp2_status_t fsdp2_shm_params_check(const shm_params_t *p, int n);
/* Collective over g: every member publishes its protocol sizes and its affinity, and
 * reads everyone's. FSDP2_ERR_INVALID_CONFIG on every member, naming the variable,
 * when a member's sizes differ from rank 0's; else the group's placement. */
fsdp2_status_t fsdp2_shm_exchange_members(fsdp2_group_t *g, fsdp2_store_t *store,
                                          const shm_params_t *params, shm_placement_t *out);
/* The size of the largest cache that all of cpus share on the host (0: none), from
 * the machine's topology, loaded once per process; -1 without one (no hwloc, a failed
 * load, CPUs it does not list), leaving the thread's last error as it was. */
int fsdp2_shm_shared_cache(const cpu_set_t *cpus, size_t *bytes);
/* Whether this process runs under a hypervisor (x86's CPUID flag; 0 elsewhere), whose
 * virtual CPUs the host may move between physical caches unseen by the topology. */
int fsdp2_host_is_virtual(void);

/* ---- shm_stores.c: how bytes are written ---- */

/* Copies n bytes with non-temporal stores (memcpy where SSE2 is missing or n is short);
 * fsdp2_shm_fence_streams before anyone else may read dst. */
void fsdp2_shm_stream_copy(char *dst, const char *src, size_t n);
void fsdp2_shm_fence_streams(void);
/* dst[i] = the reduction of src[0][i] .. src[n-1][i] (n <= FSDP2_SHM_MAX_RANKS) as
 * fsdp2_reduce_rank_order computes it, to the same bits, written with non-temporal
 * stores; dst may be one of the sources exactly (in place: each element is read before
 * it is written), and overlaps none otherwise. Fence as for fsdp2_shm_stream_copy. */
void fsdp2_shm_reduce_stream(char *dst, fsdp2_dtype_t dtype, size_t es,
                             const void *const *src, int n, size_t count, double pre,
                             double post);
/* The topology rule for slot stores: whether a collective of `bytes` per rank over n
 * ranks writes its slots with non-temporal stores, given the size of the largest cache
 * all the ranks' CPUs share (0: none). Plain stores while the slots the collective fills,
 * n * min(bytes, a rank's ring of `ring` bytes), fit in half that cache (the rest holds the collective's own
 * inputs and outputs): readers then take the lines from the shared cache. Otherwise the
 * lines would be written back to memory anyway, and a plain store also reads each line
 * before writing it. */
int fsdp2_shm_stores_rule(size_t shared_cache, int n, size_t bytes, size_t ring);
/* What FSDP2_SHM_STREAM_STORES=policy means for a group: auto is the topology rule,
 * except under a hypervisor or without a topology, where it learns by timed tries. */
shm_stores_t fsdp2_shm_stores_resolve(shm_stores_t policy, int virtual_host, int cache_known);
/* Whether op's slot writes stream: the policy, and for auto the class's choice. A try
 * of a way found far costlier takes only the first *part_steps steps this rank posts
 * (0: the whole run), after which the run writes the other way. */
int fsdp2_shm_stores_choose(shm_group_t *sg, const coll_op_t *op, uint64_t *part_steps);
/* Whether auto learns from op's run time (fsdp2_shm_stores_learn): else it need not be
 * timed. */
int fsdp2_shm_stores_timed(const shm_group_t *sg, const coll_op_t *op);
/* Auto: folds a run's cost (ns) into its way's figure and keeps the cheaper way. This
 * rank posted `steps` steps (at least one), the first `share` of them (1: all) written
 * the way `first_way` (1: streaming). */
void fsdp2_shm_stores_learn(shm_group_t *sg, const coll_op_t *op, int first_way, double share,
                            uint64_t steps, int64_t ns);
/* Whether this rank writes op's output with non-temporal stores. */
int fsdp2_shm_out_streams(const shm_group_t *sg, const coll_op_t *op);

#endif
