/* Device names, backend lookup, and the counted allocator.
 *
 * The allocator keeps the size of every live allocation in a small open-addressing
 * table, so fsdp2_device_free needs only the pointer and the statistics are exact.
 * Allocation happens at set-up time, so one mutex is plenty. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda_loader.h"
#include "core/device_ops.h"
#include "core/env_internal.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log_internal.h"

#define FSDP2_MAX_CUDA_DEVICES 64

fsdp2_status_t fsdp2_device_ops_get(fsdp2_device_t device, const fsdp2_device_ops_t **ops)
{
    switch (device.type) {
    case FSDP2_DEVICE_CPU:
        *ops = &fsdp2_cpu_ops;
        return FSDP2_SUCCESS;
    case FSDP2_DEVICE_CUDA:
        if (device.index < 0 || device.index >= FSDP2_MAX_CUDA_DEVICES)
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "cuda device index %d is out of range",
                               device.index);
    {
        const fsdp2_cuda_module_t *module = NULL;
        if (fsdp2_cuda_module_get(&module) != FSDP2_SUCCESS)
            return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE, "cuda:%d requested: %s", device.index,
                               fsdp2_last_error());
        *ops = module->device_ops;
        return FSDP2_SUCCESS;
    }
    case FSDP2_DEVICE_META:
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "the meta device has no memory or streams");
    }
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "device type %d is not valid", (int)device.type);
}

fsdp2_status_t fsdp2_device_parse(const char *text, fsdp2_device_t *device)
{
    FSDP2_ARG_CHECK(text && device, "text or device is NULL");
    if (strcmp(text, "cpu") == 0) {
        *device = (fsdp2_device_t){FSDP2_DEVICE_CPU, 0};
        return FSDP2_SUCCESS;
    }
    if (strcmp(text, "meta") == 0) {
        *device = (fsdp2_device_t){FSDP2_DEVICE_META, 0};
        return FSDP2_SUCCESS;
    }
    if (strcmp(text, "cuda") == 0) {
        *device = (fsdp2_device_t){FSDP2_DEVICE_CUDA, 0};
        return FSDP2_SUCCESS;
    }
    if (strncmp(text, "cuda:", 5) == 0 && text[5] >= '0' && text[5] <= '9') {
        char *end = NULL;
        long index = strtol(text + 5, &end, 10);
        if (*end == '\0' && index < FSDP2_MAX_CUDA_DEVICES) {
            *device = (fsdp2_device_t){FSDP2_DEVICE_CUDA, (int)index};
            return FSDP2_SUCCESS;
        }
    }
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                       "device '%s' is not one of cpu, meta, cuda, cuda:N (N < %d)", text,
                       FSDP2_MAX_CUDA_DEVICES);
}

fsdp2_status_t fsdp2_device_format(fsdp2_device_t device, char *buf, size_t len)
{
    FSDP2_ARG_CHECK(buf && len > 0, "buf is NULL or len is 0");
    switch (device.type) {
    case FSDP2_DEVICE_CPU: snprintf(buf, len, "cpu"); return FSDP2_SUCCESS;
    case FSDP2_DEVICE_META: snprintf(buf, len, "meta"); return FSDP2_SUCCESS;
    case FSDP2_DEVICE_CUDA: snprintf(buf, len, "cuda:%d", device.index); return FSDP2_SUCCESS;
    }
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "device type %d is not valid", (int)device.type);
}

fsdp2_status_t fsdp2_device_check(fsdp2_device_t device)
{
    if (device.type == FSDP2_DEVICE_META)
        return FSDP2_SUCCESS;
    const fsdp2_device_ops_t *ops = NULL;
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    return ops->check(device.index);
}

fsdp2_status_t fsdp2_cuda_device_count(int *count)
{
    FSDP2_ARG_CHECK(count, "count is NULL");
    *count = 0;
    const fsdp2_cuda_module_t *module = NULL;
    char kept[512];
    snprintf(kept, sizeof(kept), "%s", fsdp2_last_error());
    if (fsdp2_cuda_module_get(&module) != FSDP2_SUCCESS) {
        fsdp2_error_set_message(kept); /* no module: no cuda device, and no failure */
        return FSDP2_SUCCESS;
    }
    for (int i = 0; i < FSDP2_MAX_CUDA_DEVICES; i++) {
        if (module->device_ops->check(i) != FSDP2_SUCCESS)
            break;
        *count = i + 1;
    }
    fsdp2_error_set_message(kept);
    return FSDP2_SUCCESS;
}

/* ---- counted allocations ---- */

typedef struct alloc_entry {
    void *ptr; /* NULL: empty slot; TOMBSTONE: deleted */
    size_t bytes;
    int slot; /* stats slot */
} alloc_entry_t;

#define TOMBSTONE ((void *)1)
#define STATS_SLOTS (1 + FSDP2_MAX_CUDA_DEVICES)

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static alloc_entry_t *alloc_table;
static size_t alloc_capacity; /* power of two */
static size_t alloc_used;     /* live + tombstones */
static fsdp2_memory_stats_t alloc_stats[STATS_SLOTS];

static int stats_slot(fsdp2_device_t device)
{
    return device.type == FSDP2_DEVICE_CPU ? 0 : 1 + device.index;
}

static size_t ptr_hash(const void *p, size_t capacity)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (capacity - 1);
}

/* Caller holds alloc_lock. */
static fsdp2_status_t table_grow(void)
{
    size_t capacity = alloc_capacity ? alloc_capacity * 2 : 256;
    alloc_entry_t *table = calloc(capacity, sizeof(*table));
    if (!table)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "allocation table of %zu entries", capacity);
    size_t used = 0;
    for (size_t i = 0; i < alloc_capacity; i++) {
        alloc_entry_t e = alloc_table[i];
        if (!e.ptr || e.ptr == TOMBSTONE)
            continue;
        size_t j = ptr_hash(e.ptr, capacity);
        while (table[j].ptr)
            j = (j + 1) & (capacity - 1);
        table[j] = e;
        used++;
    }
    free(alloc_table);
    alloc_table = table;
    alloc_capacity = capacity;
    alloc_used = used;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t table_insert(void *ptr, size_t bytes, int slot)
{
    if ((alloc_used + 1) * 2 > alloc_capacity)
        FSDP2_CHECK(table_grow());
    size_t j = ptr_hash(ptr, alloc_capacity);
    while (alloc_table[j].ptr && alloc_table[j].ptr != TOMBSTONE)
        j = (j + 1) & (alloc_capacity - 1);
    if (!alloc_table[j].ptr)
        alloc_used++;
    alloc_table[j] = (alloc_entry_t){ptr, bytes, slot};
    return FSDP2_SUCCESS;
}

static alloc_entry_t *table_find(const void *ptr)
{
    if (!alloc_capacity || ptr == TOMBSTONE)
        return NULL;
    size_t j = ptr_hash(ptr, alloc_capacity);
    while (alloc_table[j].ptr) {
        if (alloc_table[j].ptr == ptr)
            return &alloc_table[j];
        j = (j + 1) & (alloc_capacity - 1);
    }
    return NULL;
}

/* FSDP2_CPU_MEMORY_LIMIT for the cpu device (0: none); other devices have no limit here
 * (their own allocator refuses what does not fit). */
static uint64_t device_limit(fsdp2_device_t device)
{
    return device.type == FSDP2_DEVICE_CPU ? (uint64_t)fsdp2_env_int(FSDP2_ENV_CPU_MEMORY_LIMIT) : 0;
}

fsdp2_status_t fsdp2_memory_capacity(fsdp2_device_t device, uint64_t *limit)
{
    FSDP2_ARG_CHECK(limit, "limit is NULL");
    const fsdp2_device_ops_t *ops = NULL;
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    *limit = device_limit(device);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp_memory_check_fits(fsdp2_device_t device, uint64_t need, const char *what)
{
    uint64_t limit = device_limit(device);
    if (!limit)
        return FSDP2_SUCCESS;
    pthread_mutex_lock(&alloc_lock);
    uint64_t live = alloc_stats[stats_slot(device)].allocated_bytes;
    pthread_mutex_unlock(&alloc_lock);
    if (need <= limit && live <= limit - need)
        return FSDP2_SUCCESS;
    return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY,
                       "%s needs %llu bytes with %llu live: %llu in all, more than "
                       "FSDP2_CPU_MEMORY_LIMIT=%llu (%.1f MiB short)",
                       what, (unsigned long long)need, (unsigned long long)live,
                       (unsigned long long)(live + need), (unsigned long long)limit,
                       (double)(live + need - limit) / 1048576.0);
}

fsdp2_status_t fsdp2_device_alloc(fsdp2_device_t device, size_t bytes, void **ptr)
{
    FSDP2_ARG_CHECK(ptr, "ptr is NULL");
    *ptr = NULL;
    const fsdp2_device_ops_t *ops = NULL;
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    if (bytes == 0)
        return FSDP2_SUCCESS;
    if (fsdp2_fault_hit(FAULT_ALLOC))
        return fsdp2_fault_error(FAULT_ALLOC, "device_alloc");
    /* The bytes are counted (reserved) before the allocation, so that concurrent
     * allocations cannot pass the cpu limit together. */
    int slot = stats_slot(device);
    uint64_t limit = device_limit(device);
    fsdp2_memory_stats_t *s = &alloc_stats[slot];
    pthread_mutex_lock(&alloc_lock);
    uint64_t live = s->allocated_bytes;
    int fits = !limit || (bytes <= limit && live <= limit - bytes);
    if (fits)
        s->allocated_bytes += bytes;
    pthread_mutex_unlock(&alloc_lock);
    if (!fits)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY,
                           "cpu device: %zu bytes more with %llu live would pass "
                           "FSDP2_CPU_MEMORY_LIMIT=%llu",
                           bytes, (unsigned long long)live, (unsigned long long)limit);
    void *p = NULL;
    fsdp2_status_t status = ops->alloc(device.index, bytes, &p);
    pthread_mutex_lock(&alloc_lock);
    if (status == FSDP2_SUCCESS)
        status = table_insert(p, bytes, slot);
    if (status == FSDP2_SUCCESS) {
        s->alloc_count++;
        if (s->allocated_bytes > s->peak_allocated_bytes)
            s->peak_allocated_bytes = s->allocated_bytes;
    } else {
        s->allocated_bytes -= bytes;
    }
    pthread_mutex_unlock(&alloc_lock);
    if (status != FSDP2_SUCCESS) {
        if (p)
            ops->free(device.index, p);
        return status;
    }
    FSDP2_LOG(TRACE, CORE, "alloc %zu bytes at %p", bytes, p);
    *ptr = p;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_device_free(fsdp2_device_t device, void *ptr)
{
    const fsdp2_device_ops_t *ops = NULL;
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    if (!ptr)
        return FSDP2_SUCCESS;
    int slot = stats_slot(device);
    pthread_mutex_lock(&alloc_lock);
    alloc_entry_t *e = table_find(ptr);
    int ok = e && e->slot == slot;
    if (ok) {
        alloc_stats[slot].allocated_bytes -= e->bytes;
        alloc_stats[slot].free_count++;
        e->ptr = TOMBSTONE;
    }
    pthread_mutex_unlock(&alloc_lock);
    if (!ok) {
        char name[FSDP2_DEVICE_NAME_MAX];
        fsdp2_device_format(device, name, sizeof(name));
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "%p was not allocated on %s by fsdp2_device_alloc (or was freed)", ptr,
                           name);
    }
    return ops->free(device.index, ptr);
}

fsdp2_status_t fsdp2_memory_stats_get(fsdp2_device_t device, fsdp2_memory_stats_t *stats)
{
    FSDP2_ARG_CHECK(stats, "stats is NULL");
    const fsdp2_device_ops_t *ops = NULL;
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    pthread_mutex_lock(&alloc_lock);
    *stats = alloc_stats[stats_slot(device)];
    pthread_mutex_unlock(&alloc_lock);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_memory_stats_reset_peak(fsdp2_device_t device)
{
    const fsdp2_device_ops_t *ops = NULL;
    FSDP2_CHECK(fsdp2_device_ops_get(device, &ops));
    pthread_mutex_lock(&alloc_lock);
    fsdp2_memory_stats_t *s = &alloc_stats[stats_slot(device)];
    s->peak_allocated_bytes = s->allocated_bytes;
    pthread_mutex_unlock(&alloc_lock);
    return FSDP2_SUCCESS;
}
