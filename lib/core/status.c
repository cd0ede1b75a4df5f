/* Status strings, the thread-local detailed error message, and the library's version. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <fsdp2/version.h>

#include "core/error.h"
#include "core/log_internal.h"

static _Thread_local char last_error[FSDP2_ERROR_MESSAGE_MAX];

unsigned fsdp2_version(void)
{
    return FSDP2_VERSION_CODE;
}

const char *fsdp2_strerror(fsdp2_status_t status)
{
    switch (status) {
#define FSDP2_STATUS_TEXT_(name, value, text) \
    case FSDP2_##name:                        \
        return text;
        FSDP2_STATUS_MAP(FSDP2_STATUS_TEXT_)
#undef FSDP2_STATUS_TEXT_
    }
    return "unknown status";
}

const char *fsdp2_status_name(fsdp2_status_t status)
{
    switch (status) {
#define FSDP2_STATUS_NAME_(name, value, text) \
    case FSDP2_##name:                        \
        return #name;
        FSDP2_STATUS_MAP(FSDP2_STATUS_NAME_)
#undef FSDP2_STATUS_NAME_
    }
    return "UNKNOWN";
}

const char *fsdp2_last_error(void)
{
    return last_error;
}

fsdp2_status_t fsdp2_error(fsdp2_status_t status, const char *fmt, ...)
{
    /* Formatted aside first: an argument may be fsdp2_last_error() itself, which a
     * caller wrapping the message it was given passes. */
    char message[sizeof(last_error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    memcpy(last_error, message, sizeof(last_error));
    FSDP2_LOG(DEBUG, CORE, "%s: %s", fsdp2_status_name(status), last_error);
    return status;
}

void fsdp2_error_set_message(const char *msg)
{
    /* runs before every host task (cpu_stream.c): a copy, not a format */
    size_t n = msg ? strnlen(msg, sizeof(last_error) - 1) : 0;
    if (n)
        memmove(last_error, msg, n); /* msg may be last_error itself */
    last_error[n] = '\0';
}
