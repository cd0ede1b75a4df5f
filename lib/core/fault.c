/* Fault injection: counters per kind and the one point that fails (core/fault.h). */
#include <stdlib.h>

#include "core/env_internal.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log_internal.h"

atomic_int fsdp2_fault_on;
static _Atomic uint64_t counts[FAULT_KINDS];
static atomic_int armed_kind;
static _Atomic uint64_t armed_at;
static atomic_int fired;

static const char *const kind_names[FAULT_KINDS] = {"none", "alloc", "enqueue", "collective",
                                                    "io"};

const char *fsdp2_fault_kind_name(fault_kind_t kind)
{
    return kind >= 0 && kind < FAULT_KINDS ? kind_names[kind] : "unknown";
}

int fsdp2_fault_next(fault_kind_t kind)
{
    uint64_t n = atomic_fetch_add(&counts[kind], 1) + 1;
    if ((int)kind != atomic_load(&armed_kind) || n != atomic_load(&armed_at))
        return 0;
    atomic_store(&fired, 1);
    return 1;
}

fsdp2_status_t fsdp2_fault_error(fault_kind_t kind, const char *where)
{
    static const fsdp2_status_t status_of[FAULT_KINDS] = {
        [FAULT_ALLOC] = FSDP2_ERR_OUT_OF_MEMORY, [FAULT_ENQUEUE] = FSDP2_ERR_BACKEND,
        [FAULT_COLLECTIVE] = FSDP2_ERR_BACKEND,  [FAULT_IO] = FSDP2_ERR_IO,
    };
    FSDP2_LOG(WARN, CORE, "injected fault: %s point %llu (%s)", kind_names[kind],
              (unsigned long long)atomic_load(&armed_at), where);
    return fsdp2_error(status_of[kind], "injected fault: %s point %llu (%s)", kind_names[kind],
                       (unsigned long long)atomic_load(&armed_at), where);
}

void fsdp2_fault_arm(fault_kind_t kind, uint64_t at)
{
    for (int k = 0; k < FAULT_KINDS; k++)
        atomic_store(&counts[k], 0);
    atomic_store(&fired, 0);
    atomic_store(&armed_kind, at ? (int)kind : FAULT_NONE);
    atomic_store(&armed_at, at);
    atomic_store(&fsdp2_fault_on, 1);
}

void fsdp2_fault_disarm(void)
{
    atomic_store(&fsdp2_fault_on, 0);
    atomic_store(&armed_kind, FAULT_NONE);
}

uint64_t fsdp2_fault_count(fault_kind_t kind)
{
    return atomic_load(&counts[kind]);
}

int fsdp2_fault_fired(void)
{
    return atomic_load(&fired);
}

void fsdp2_fault_configure(fault_kind_t kind, uint64_t at, int64_t rank)
{
    if (kind == FAULT_NONE || at == 0)
        return;
    if (rank >= 0) {
        static const char *const vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                                           "PMI_RANK"};
        const char *mine = NULL;
        for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]) && !mine; i++)
            mine = getenv(vars[i]);
        int64_t value;
        if (!mine || !fsdp2_env_decimal(mine, 0, INT32_MAX, &value) || value != rank)
            return;
    }
    fsdp2_fault_arm(kind, at);
}

void *fsdp2_malloc(size_t bytes)
{
    return fsdp2_fault_hit(FAULT_ALLOC) ? NULL : malloc(bytes);
}

void *fsdp2_calloc(size_t n, size_t size)
{
    return fsdp2_fault_hit(FAULT_ALLOC) ? NULL : calloc(n, size);
}
