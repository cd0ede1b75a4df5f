/* Devices and device memory.
 *
 * A device is `meta` (shapes only, no memory), `cpu`, or `cuda:N`. Memory comes from
 * the device's allocator and is counted per device, so a program can compare what it
 * measured against what it planned (fsdp2_memory_stats). Allocation is meant for set-up
 * time: nothing in a training step should call fsdp2_device_alloc. */
#ifndef FSDP2_DEVICE_H
#define FSDP2_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

typedef enum fsdp2_device_type {
    FSDP2_DEVICE_META = 0,
    FSDP2_DEVICE_CPU = 1,
    FSDP2_DEVICE_CUDA = 2,
} fsdp2_device_type_t;

typedef struct fsdp2_device {
    fsdp2_device_type_t type;
    int index; /* CUDA ordinal; 0 for cpu and meta */
} fsdp2_device_t;

#define FSDP2_DEVICE_CPU_INIT {FSDP2_DEVICE_CPU, 0}
#define FSDP2_DEVICE_META_INIT {FSDP2_DEVICE_META, 0}

/* Longest string fsdp2_device_format writes, with its terminating NUL. */
#define FSDP2_DEVICE_NAME_MAX 24

/* Parses "cpu", "meta", "cuda" (= cuda:0) or "cuda:N". Does not check that the device
 * exists; fsdp2_device_check does. */
FSDP2_API fsdp2_status_t fsdp2_device_parse(const char *text, fsdp2_device_t *device);

/* Writes "cpu", "meta" or "cuda:N" into buf (at least FSDP2_DEVICE_NAME_MAX bytes). */
FSDP2_API fsdp2_status_t fsdp2_device_format(fsdp2_device_t device, char *buf, size_t len);

/* FSDP2_SUCCESS when the device can be used by this process: cpu and meta always,
 * cuda:N when libfsdp2 was built with CUDA and a GPU with that ordinal is present;
 * FSDP2_ERR_NOT_AVAILABLE otherwise (a clean "skip", with the reason in
 * fsdp2_last_error). */
FSDP2_API fsdp2_status_t fsdp2_device_check(fsdp2_device_t device);

/* Number of CUDA devices in *count: 0 when the CUDA module (libfsdp2-cuda.so) cannot be
 * loaded, or with no driver or GPU. */
FSDP2_API fsdp2_status_t fsdp2_cuda_device_count(int *count);

/* Allocates bytes on device (64-byte aligned on cpu; cudaMalloc on cuda). Zero bytes
 * gives *ptr == NULL and succeeds. Not for meta. Blocks; not stream-ordered: free only
 * once no stream still uses the memory. */
FSDP2_API fsdp2_status_t fsdp2_device_alloc(fsdp2_device_t device, size_t bytes, void **ptr);
FSDP2_API fsdp2_status_t fsdp2_device_free(fsdp2_device_t device, void *ptr);

/* Counters of libfsdp2's allocator for one device (output).
 * This struct has no size field: its layout is fixed for the ABI (version 0 of
 * libfsdp2.so); more fields would come as a new struct and function, never by growing it. */
typedef struct fsdp2_memory_stats {
    uint64_t allocated_bytes;      /* live now */
    uint64_t peak_allocated_bytes; /* most live at once since start or the last reset */
    uint64_t alloc_count;          /* allocations made since start */
    uint64_t free_count;
} fsdp2_memory_stats_t;

/* Counters of libfsdp2's own allocator for this device (not the user's malloc). */
FSDP2_API fsdp2_status_t fsdp2_memory_stats_get(fsdp2_device_t device,
                                                fsdp2_memory_stats_t *stats);
/* Sets the peak to the bytes live now. */
FSDP2_API fsdp2_status_t fsdp2_memory_stats_reset_peak(fsdp2_device_t device);

/* The most bytes libfsdp2's allocator may hold live on device, in *limit: for the cpu
 * device FSDP2_CPU_MEMORY_LIMIT (a capacity, as a GPU's memory size: an allocation past
 * it fails with FSDP2_ERR_OUT_OF_MEMORY, and FSDP refuses a plan that does not fit before
 * step 1); 0 means no limit. */
FSDP2_API fsdp2_status_t fsdp2_memory_capacity(fsdp2_device_t device, uint64_t *limit);

FSDP2_EXTERN_C_END

#endif
