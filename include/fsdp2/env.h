/* Configuration from environment variables.
 *
 * Every variable libfsdp2 reads is declared in one table (lib/core/env.c, listed in
 * docs/environment.md), read once, validated, and logged at INFO. A bad value is an
 * error naming the variable, the value and what is accepted; library functions that
 * start something (streams, process groups) return it. */
#ifndef FSDP2_ENV_H
#define FSDP2_ENV_H

#include <stddef.h>

#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

/* Reads and validates all FSDP2_* variables (once per process; later calls return the
 * first result). Thread-safe. */
FSDP2_API fsdp2_status_t fsdp2_env_init(void);

/* Writes one line per variable ("FSDP2_LOG_LEVEL=warn (default) error|warn|...: help")
 * into buf, truncating safely; *needed gets the full length (may be NULL). */
FSDP2_API fsdp2_status_t fsdp2_env_describe(char *buf, size_t len, size_t *needed);

FSDP2_EXTERN_C_END

#endif
