/* Logging. Silent by default except warnings; FSDP2_LOG_LEVEL=error|warn|info|debug|trace
 * and FSDP2_LOG_SUBSYS=all or a comma list (init,core,stream,mesh,coll,fsdp,ckpt,optim,text,nn)
 * choose what is printed to stderr, each line prefixed "host:pid:rank". */
#ifndef FSDP2_LOG_H
#define FSDP2_LOG_H

#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

typedef enum fsdp2_log_level {
    FSDP2_LOG_ERROR = 0,
    FSDP2_LOG_WARN = 1,
    FSDP2_LOG_INFO = 2,
    FSDP2_LOG_DEBUG = 3,
    FSDP2_LOG_TRACE = 4,
} fsdp2_log_level_t;

/* Overrides FSDP2_LOG_LEVEL for this process. */
FSDP2_API fsdp2_status_t fsdp2_log_set_level(fsdp2_log_level_t level);

/* Sets the rank shown in the prefix (-1 shows "-"); the bootstrap calls it. */
FSDP2_API fsdp2_status_t fsdp2_log_set_rank(int rank);

FSDP2_EXTERN_C_END

#endif
