/* The shared-memory transport of the ucx backend (lib/collectives/shm.c, shm_reduce.c):
 * collectives of a group whose members all run on one host go through one shared
 * segment instead of UCX messages. */
#ifndef FSDP2_COLLECTIVES_SHM_H
#define FSDP2_COLLECTIVES_SHM_H

#include "collectives/group_internal.h"

/* Groups larger than this stay on UCX: a segment holds a 1 MiB ring per rank and n^2 done
 * counters, 257 MiB at 256 ranks. */
#define FSDP2_SHM_MAX_RANKS 256
_Static_assert(FSDP2_SHM_MAX_RANKS % 64 == 0, "rank bitmaps are whole 64-bit words");

typedef struct shm_group shm_group_t;

/* Nonzero once peer's process is known to be gone; may look now (called at most every
 * 100 ms per waiting collective). */
typedef int (*shm_peer_gone_fn)(void *arg, int peer);

/* Collective over the group's members (all on this host): rank 0 creates the segment,
 * the others map it, and it is unlinked as soon as everyone has, so that nothing is
 * left in /dev/shm even if a member crashes later. When any member could not map it
 * (no room in /dev/shm, say), every member gets *out = NULL and FSDP2_SUCCESS, and the
 * group stays on UCX; errors are store failures. */
fsdp2_status_t fsdp2_shm_create(fsdp2_group_t *g, fsdp2_store_t *store, shm_peer_gone_fn gone,
                                void *gone_arg, shm_group_t **out);

void fsdp2_shm_destroy(shm_group_t *sg);

/* Marks the segment broken, with this rank's reason: the peers' collectives fail at
 * once (naming this rank and the reason) instead of at their timeout. Thread-safe. */
void fsdp2_shm_abort(shm_group_t *sg, const char *reason);

/* Runs op on the calling thread (a stream's host function): waits for its turn (the
 * group's collectives run in sequence order), then for the peers. Fails the group on
 * a dead peer, the timeout, an abort, or a peer that failed. */
fsdp2_status_t fsdp2_shm_run(shm_group_t *sg, const coll_op_t *op);

#endif
