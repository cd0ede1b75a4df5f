/* Fault injection, a test aid (docs/reliability.md#fault-injection): the Nth failure
 * point of a kind fails as the real failure would (an allocation returns NULL, an
 * enqueue or a collective's start fails, a read or write fails). Off unless
 * FSDP2_FAULT_KIND and FSDP2_FAULT_AT are set (for the rank FSDP2_FAULT_RANK, or every
 * rank), or a test arms it; while off a point costs one relaxed load. */
#ifndef FSDP2_CORE_FAULT_H
#define FSDP2_CORE_FAULT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <fsdp2/status.h>

/* In the order of FSDP2_FAULT_KIND's accepted words. */
typedef enum fault_kind {
    FAULT_NONE,
    FAULT_ALLOC,      /* the library's allocations: device memory and host buffers */
    FAULT_ENQUEUE,    /* work, copies, events and waits put on a stream */
    FAULT_COLLECTIVE, /* a collective that took its sequence number, as it is enqueued */
    FAULT_IO,         /* checkpoint reads, writes and fsyncs */
    FAULT_KINDS
} fault_kind_t;

extern atomic_int fsdp2_fault_on;

/* Counts a point of kind; 1 if it is the one that fails. */
int fsdp2_fault_next(fault_kind_t kind);

static inline int fsdp2_fault_hit(fault_kind_t kind)
{
    return atomic_load_explicit(&fsdp2_fault_on, memory_order_relaxed) && fsdp2_fault_next(kind);
}

/* The error of the point that failed: its kind's status, with a message naming the point
 * ("injected fault: enqueue point 17 (memcpy_async)"). */
fsdp2_status_t fsdp2_fault_error(fault_kind_t kind, const char *where);

/* Tests: counts points from now on, every kind from 1; the point `at` of `kind` fails
 * (at 0 or kind FAULT_NONE: none fails, points are only counted). */
void fsdp2_fault_arm(fault_kind_t kind, uint64_t at);
/* Tests: stops counting and failing. */
void fsdp2_fault_disarm(void);
/* Points of kind counted since the last arm. */
uint64_t fsdp2_fault_count(fault_kind_t kind);
/* Whether the armed point has failed. */
int fsdp2_fault_fired(void);
const char *fsdp2_fault_kind_name(fault_kind_t kind);

/* malloc and calloc with an allocation point: for the library's buffers. */
void *fsdp2_malloc(size_t bytes);
void *fsdp2_calloc(size_t n, size_t size);

/* From the environment table (env.c): arms kind at `at` when this process is `rank`
 * (-1: any) by the launcher's variables (RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID,
 * PMI_RANK: the first set). */
void fsdp2_fault_configure(fault_kind_t kind, uint64_t at, int64_t rank);

#endif
