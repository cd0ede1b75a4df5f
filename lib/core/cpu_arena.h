/* The shareable cpu arena (lib/core/cpu_arena.c): large cpu allocations come from one
 * memfd per process, so that other processes of the same user on this host can map them
 * (open /proc/<pid>/fd/<fd>) and the shared-memory transport can read and write the
 * ranks' buffers in place (single-copy collectives, lib/collectives/shm_direct.c). */
#ifndef FSDP2_CORE_CPU_ARENA_H
#define FSDP2_CORE_CPU_ARENA_H

#include <stddef.h>
#include <stdint.h>


/* Allocations of at least this many bytes come from the arena (FSDP2_CPU_SHARED_ALLOC=on). */
#define FSDP2_CPU_ARENA_MIN (64u << 10)

/* What a peer needs to map this process's arena, and to check that what it mapped is
 * that arena: its first page starts with FSDP2_CPU_ARENA_MAGIC and the nonce (a pid
 * seen through another pid namespace may name another process). */
typedef struct fsdp2_cpu_arena_id {
    int32_t pid;
    int32_t fd;
    uint64_t bytes; /* the whole arena, mapped at once */
    uint64_t nonce;
} fsdp2_cpu_arena_id_t;

#define FSDP2_CPU_ARENA_MAGIC 0x616e657261757063ull

/* bytes from the arena, page aligned; NULL when the arena does not take them (too small,
 * switched off, no memfd, no room), and the caller allocates elsewhere. */
void *fsdp2_cpu_arena_alloc(size_t bytes);

/* Frees ptr when it is the arena's, handing its pages back to the kernel at once (a
 * peer's mapping of them would otherwise keep them); 0 when ptr is not the arena's. */
int fsdp2_cpu_arena_free(void *ptr);

/* Whether [p, p + len) lies in one live allocation of the arena, and where (offset from
 * the arena's start); len 0 asks about p alone. */
int fsdp2_cpu_arena_locate(const void *p, size_t len, uint64_t *offset);

/* This process's arena, when it has one (0 before the first allocation it took). */
int fsdp2_cpu_arena_identity(fsdp2_cpu_arena_id_t *id);

#endif
