/* Internal error helpers: set the thread-local message and propagate statuses. */
#ifndef FSDP2_CORE_ERROR_H
#define FSDP2_CORE_ERROR_H

#include <fsdp2/status.h>

/* The longest message a thread keeps, with its terminating NUL. */
#define FSDP2_ERROR_MESSAGE_MAX 1024

/* Records a detailed message for status on this thread and returns status, so that
 * `return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "n=%zu", n);` reads naturally. */
fsdp2_status_t fsdp2_error(fsdp2_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Copies msg as this thread's message (used to move a worker thread's error to the
 * thread that synchronizes). */
void fsdp2_error_set_message(const char *msg);

#define FSDP2_CHECK(call)                         \
    do {                                          \
        fsdp2_status_t fsdp2_check_s_ = (call);   \
        if (fsdp2_check_s_ != FSDP2_SUCCESS)      \
            return fsdp2_check_s_;                \
    } while (0)

/* Keeps the first error: jumps to label with status set, unless status already holds
 * an error (then the new one is dropped and status is kept). */
#define FSDP2_CHECK_GOTO(call, status, label)            \
    do {                                                 \
        fsdp2_status_t fsdp2_check_s_ = (call);          \
        if (fsdp2_check_s_ != FSDP2_SUCCESS) {           \
            if ((status) == FSDP2_SUCCESS)               \
                (status) = fsdp2_check_s_;               \
            goto label;                                  \
        }                                                \
    } while (0)

#define FSDP2_ARG_CHECK(cond, ...)                                   \
    do {                                                             \
        if (!(cond))                                                 \
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)

#endif
